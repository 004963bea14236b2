"""Files written so that a reader, or a run killed half-way, never sees half of one, and
directories owned by one process at a time."""

from __future__ import annotations

import os
import pathlib
from typing import Callable, IO


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> None:
    """Call ``write(fh)`` on a temporary file beside ``path``, flush it to disk,
    then rename it over ``path`` (atomic on POSIX): ``path`` holds the old
    content or the new, never part of it. The temporary name carries the
    process id, so concurrent writers do not share one; a link planted at that name is
    removed, never written through."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        # a link planted at the (guessable) temporary name must not make us write through
        # it: remove whatever is there (a link, not its target) and create the file anew
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


#: the lock file a directory's owner holds (see :class:`DirectoryLock`)
LOCK_NAME = ".lock"


class DirectoryLocked(RuntimeError):
    """Another live process holds the directory's lock.

    Attributes:
        directory: the directory.
        holder: who holds it, as that process wrote it ("process 123 on host"),
            or "another process" when it has not written it yet.
    """

    def __init__(self, directory: pathlib.Path, holder: str) -> None:
        self.directory, self.holder = directory, holder
        super().__init__(f"{directory} is in use by {holder}; wait for it to finish or use "
                         f"another directory (the lock goes with the process that holds it)")


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
    written (read-only, a file in the way, a link planted at ``DIR/.lock``).
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = pathlib.Path(directory)
        self.path = self.directory / LOCK_NAME
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
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
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
            # unlinked while still locked, so no newcomer can lock this file and believe
            # it owns the directory (see acquire)
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None

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
