"""Files written so that a reader, or a run killed half-way, never sees half of one, and
directories owned by one process at a time."""

from __future__ import annotations

import errno
import os
import pathlib
import re
import stat as _stat
from typing import Callable, IO


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> None:
    """Call ``write(fh)`` on a temporary file beside ``path``, flush it to disk,
    then rename it over ``path`` (atomic on POSIX): ``path`` holds the old
    content or the new, never part of it.

    The temporary file is hidden and one per call, :func:`temporary_name`
    (``.NAME.<pid>-<thread>-<random>.tmp``): concurrent writers of one path, threads of
    one process included, never share one, and the last rename wins whole. It is
    created anew (``O_EXCL | O_NOFOLLOW``): an entry already at that name (a planted
    link, another writer's file) is never written through, truncated or removed, and
    another name is drawn. On failure the temporary file is removed."""
    path = pathlib.Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for attempt in range(_NAME_TRIES):
        tmp = temporary_name(path)
        try:
            fd = os.open(tmp, flags, 0o644)
            break
        except FileExistsError:
            if attempt == _NAME_TRIES - 1:
                raise
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # ours: created by this call, never another's
        raise


#: how many temporary names :func:`atomic_write` draws before it gives up (each taken name
#: is an entry nobody should have put there)
_NAME_TRIES = 16


def temporary_name(path: str | os.PathLike) -> pathlib.Path:
    """A fresh temporary name for :func:`atomic_write` of ``path``: beside it, hidden,
    ``.NAME.<pid>-<thread id>-<8 random hex digits>.tmp`` (the thread's id as the system
    numbers it, a few digits), so that it matches ``.gitignore``'s ``.*.tmp`` and says which
    process wrote it."""
    import secrets
    import threading

    path = pathlib.Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}-{threading.get_native_id()}-"
                          f"{secrets.token_hex(4)}.tmp")


#: the lock file a directory's owner holds (see :class:`DirectoryLock`)
LOCK_NAME = ".lock"


class DirectoryLocked(RuntimeError):
    """Another live process holds the directory's lock.

    Attributes:
        directory: the directory.
        holder: who holds it, as that process wrote it ("process 123 on host"),
            or "another process" when it has not written it yet.
    """

    def __init__(self, directory: pathlib.Path, holder: str, message: str | None = None) -> None:
        self.directory, self.holder = directory, holder
        super().__init__(message or f"{directory} is in use by {holder}; wait for it to finish "
                         f"or use another directory (the lock goes with the process that holds it)")


class ForeignLockFile(DirectoryLocked):
    """``DIR/.lock`` exists and is not a lock file of this package (a file of the user's, or
    of another tool): it is left as it is, and the directory is not taken.

    Attributes: as :class:`DirectoryLocked`; ``holder`` is ``"a file that is not a lock"``.
    """

    def __init__(self, directory: pathlib.Path, text: str) -> None:
        super().__init__(directory, "a file that is not a lock",
                         f"{directory / LOCK_NAME} is not a lock file of rfrs-ref (it holds "
                         f"{text!r}); it is left as it is: move it away or use another directory")


#: what a holder writes into its lock file (see DirectoryLock.acquire); anything else in an
#: existing .lock is someone else's file
_HOLDER_LINE = re.compile(r"process \d+ on [^\n]*\n?")


class DirectoryLock:
    """Exclusive ownership of a directory by one process: ``flock`` on ``DIR/.lock``.

    >>> with DirectoryLock(run_dir):                        # doctest: +SKIP
    ...     ...  # nobody else writes here meanwhile

    ``acquire()`` creates the directory if needed and never waits: a lock held
    by a live process raises :class:`DirectoryLocked` naming the holder, and
    nothing is written. The kernel releases the lock when its holder's file
    descriptor closes, which happens when the process exits however it ends
    (SIGKILL included; no lock survives a reboot); a later ``acquire()`` then
    takes the directory over. No pid is trusted for the decision, so pid reuse
    cannot keep a dead holder's lock alive; the holder's pid and host are written
    into the file only for the error message. ``release()`` removes the file.

    The lock belongs to the open file, not to the thread: a second ``acquire()``
    on the same directory in the same process also fails. Child processes that
    inherit the descriptor (``fork`` without ``exec``) keep the lock held until
    they exit too. Raises ``OSError`` when the directory cannot be created or
    written (read-only, a file in the way, a link, a FIFO or a device planted at
    ``DIR/.lock``, which is never followed, read or changed).

    An existing ``DIR/.lock`` that holds anything but a holder's line (a file of
    the user's or of another tool) is never truncated or removed:
    :class:`ForeignLockFile` (a ``DirectoryLocked``) is raised and nothing is
    written.

    ``shared=True`` takes a shared lock instead (``LOCK_SH``), for commands
    that only add their own files to a directory (``mechanism``, ``plot``):
    any number of them may hold it together, but not while an exclusive
    holder (a run, a sweep) owns the directory, and an exclusive holder is
    refused while they write (its message then names "another process": shared
    holders write nothing into the file). The last shared holder to release
    removes the file.
    """

    def __init__(self, directory: str | os.PathLike, *, shared: bool = False) -> None:
        self.directory = pathlib.Path(directory)
        self.path = self.directory / LOCK_NAME
        self.shared = shared
        self._fd: int | None = None

    def acquire(self) -> "DirectoryLock":
        import fcntl
        import socket

        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this lock object")
        self.directory.mkdir(parents=True, exist_ok=True)
        while True:
            # O_NOFOLLOW: a link planted at DIR/.lock must not make us truncate its target
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                if not _stat.S_ISREG(os.fstat(fd).st_mode):
                    # a FIFO planted there opens (read-write never waits) but is no lock
                    # file: said as such, not as the "Illegal seek" of reading it
                    raise OSError(errno.EINVAL, "not a regular file (a FIFO or a device), so "
                                  "not a lock file; it is left as it is: move it away or use "
                                  "another directory", str(self.path))
                fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise DirectoryLocked(self.directory, self._holder()) from None
            except BaseException:
                os.close(fd)
                raise
            # The previous holder removes the file when it releases; if that happened
            # between our open and our flock, we hold a lock on a file nobody else will
            # open, so start again on the one now at the path.
            try:
                st = os.stat(self.path)
                fst = os.fstat(fd)
                current = (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)
            except FileNotFoundError:
                current = False
            if current:
                break
            os.close(fd)
        try:
            text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            if text and not _HOLDER_LINE.fullmatch(text):
                raise ForeignLockFile(self.directory, " ".join(text.split())[:80])
            if self.shared:
                if text:  # a dead exclusive holder's line would name it in others' messages
                    os.ftruncate(fd, 0)
            else:
                os.ftruncate(fd, 0)
                os.write(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode())
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if self.shared:
                import fcntl

                try:  # the last shared holder only: others still write in the directory
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return
                try:
                    st, fst = os.stat(self.path), os.fstat(self._fd)
                except FileNotFoundError:
                    return
                if (st.st_dev, st.st_ino) != (fst.st_dev, fst.st_ino):
                    return
            # unlinked while still locked, so no newcomer can lock this file and believe
            # it owns the directory (see acquire)
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None

    def holds(self, dir_fd: int) -> bool:
        """Whether the directory open at ``dir_fd`` is the one this lock owns: its
        ``.lock`` (not followed if a link) is the very file this object holds locked. A
        directory put at the name after :meth:`acquire` (the owned one moved away, a link
        or another directory in its place) is not, and must not be cleared or written as
        the owned one. False when the lock is not held."""
        if self._fd is None:
            return False
        try:
            st = os.stat(LOCK_NAME, dir_fd=dir_fd, follow_symlinks=False)
            fst = os.fstat(self._fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)

    def _holder(self) -> str:
        try:
            with open(self.path, "rb") as fh:
                raw = fh.read(200)
        except OSError:
            raw = b""
        # written by whoever holds the lock (or planted): one short printable line only
        text = " ".join(raw.decode("utf-8", "replace").split())
        return "".join(ch for ch in text if ch.isprintable()) or "another process"

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def open_input(path: str | os.PathLike, what: str = "file", *, links: bool = True) -> IO[bytes]:
    """The file at ``path`` opened for reading in binary (the caller closes it): a file a
    tool reads that someone else wrote (a table, a run's record or state, a JSON file
    handed to a checking tool). A FIFO or a device at its name must never hang a tool (a
    plain ``open`` of a FIFO waits for a writer for ever, a read of ``/dev/zero`` never
    ends), so the file is opened without waiting (``O_NONBLOCK``) and handed over only
    when the descriptor opened is a regular file (``fstat``: a test of the name before
    the open would let a FIFO put there in between be read).
    ``links=False`` refuses a symbolic link at ``path`` too (``O_NOFOLLOW``): the files of a
    run's directory are read only as that directory's own.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        OSError: it cannot be opened or read.
        ValueError: one line naming the file: not a regular file (a FIFO, a device, a
            directory), or (``links=False``) a symbolic link; ``what`` says what was expected.
    """
    path = pathlib.Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if not links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if not links and path.is_symlink():
            try:
                target = f" (to {os.readlink(path)})"
            except OSError:
                target = ""
            raise ValueError(f"{path}: a link{target}, not the {what} itself; rfrs-ref reads "
                             "the files of a run's directory only as they are inside it, "
                             "never through a link; replace the link by the file") from None
        raise
    try:
        regular = _stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        raise ValueError(f"{path}: not a regular file (a FIFO, a device or a directory), "
                         f"expected a {what}; nothing is read from it")
    return os.fdopen(fd, "rb")


def open_regular(path: str | os.PathLike) -> IO[bytes] | None:
    """``path`` opened for reading in binary, or None when it cannot be opened or is not a
    regular file. A FIFO or a device planted at a name a command checks before replacing it
    is opened without waiting (``O_NONBLOCK``) and is None: a plain ``open`` of a FIFO waits
    for a writer, and the command hung for ever."""
    try:
        return open_input(path)
    except (OSError, ValueError):
        return None


def first_line(path: str | os.PathLike, limit: int = 1 << 16) -> str | None:
    """The first line of the file at ``path`` (at most ``limit`` characters, undecodable bytes
    replaced, without its line end), or None when it cannot be read or is not a regular file
    (:func:`open_regular`): enough to tell a file a command wrote from a user's before it is
    replaced."""
    import io

    fh = open_regular(path)
    if fh is None:
        return None
    try:
        with io.TextIOWrapper(fh, encoding="utf-8", errors="replace") as text:
            return text.readline(limit).rstrip("\r\n")
    except OSError:
        return None
