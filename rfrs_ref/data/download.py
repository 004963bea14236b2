"""Verified, atomic downloads of the real datasets (docs/datasets.md).

A dataset is installed into ``<root>/<folder>/`` (the same layout as
``RFRS_DATA_DIR``) from its public source, or from a mirror:

1. the source (a zip archive or a single file) is streamed with ``urllib`` into
   a temporary file inside the destination folder, hashing as it goes; a
   response shorter than its ``Content-Length`` is an interrupted transfer;
2. for an archive, each file the project reads is extracted, again into a
   temporary file in the destination folder;
3. each file's sha256 is compared with the digests the manifest pins; the
   temporary files are flushed and fsync'ed; only when every required file is
   verified are they renamed into place with ``os.replace`` (atomic on POSIX),
   and the folder is fsync'ed.

Sizes are capped before anything is verified, so a hostile or broken server
cannot fill the disk: a download may hold at most its cap (the manifest's
size plus a margin of 5%, at least 64 KiB; for the lastfm archive, whose size
is not pinned, the manifest's ``max_size``). A ``Content-Length`` above the
cap is refused before the body is read, and the body is read up to cap + 1
bytes at most, so an endless body stops there. An archive member is capped by
its file's expected size twice: its declared size is checked before
extraction, and the bytes are counted while extracting (a zip can lie).

On any failure (network error, short transfer, size over its cap, bad
archive, checksum mismatch, full disk, interruption by the user) every
temporary file is removed, and so are the folders this call created, so the
destination never holds a partial or unverified file. A process killed
outright (SIGKILL, power loss) cannot clean up: its temporary files are
named ``.<file>.rfrs-<pid>@<host>.<random>.part``, and the next download
into the same folder removes those of this host whose process is gone
(and untagged ``.part`` files older than an hour), while leaving alone the
files of a download of the same dataset still running in another process.
Failures raise :class:`~rfrs_ref.data.errors.DownloadError` naming the URL,
the file, and for a mismatch the expected and actual sha256.

What is verified is the sha256 of the files the loader reads (the archive's
members), not of the archives: the archives' own digests are not pinned by
their publishers, while the members' are known (and are what matters).

An optional file (item names) that fails verification is not installed; the
dataset stays usable and a warning says so.

Nothing is written through a symbolic link: when the dataset's folder
(``<root>/<folder>``) or one of its files is a link, the install is refused
before anything is downloaded, since a link would make the install replace
files elsewhere (the folder it points to may be anyone's). The root itself may
be a link (a data directory on another disk). Installed files get mode
``0666`` less the process's umask (``0644`` under the usual ``022``), as any
file the user creates, so a data directory can be shared; the temporary files
are private (``0600``) until they are verified.

Mirrors: with ``base_url`` (or the environment variable ``RFRS_DATA_MIRROR``)
the URL of each source becomes ``<base_url>/<mirror_path>``, where
``mirror_path`` is in the manifest: ``ml-100k.zip``,
``hetrec2011-lastfm-2k.zip``, ``citeulike-a/users.dat``,
``citeulike-t/users.dat`` (the two ``users.dat`` need their folder to differ).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.client
import logging
import os
import re
import socket
import tempfile
import time
import urllib.error
import urllib.request
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from rfrs_ref import __version__
from rfrs_ref.data.errors import DownloadError
from rfrs_ref.data.manifest import DatasetManifest, FileSpec

log = logging.getLogger(__name__)

#: progress(label, bytes_done, bytes_total_or_None), called as data arrives
ProgressCallback = Callable[[str, int, "int | None"], None]

MIRROR_ENV = "RFRS_DATA_MIRROR"
_CHUNK = 1 << 16


@dataclasses.dataclass(frozen=True)
class Fetched:
    """The outcome of installing one dataset.

    Attributes:
        name: the dataset.
        folder: where its files are.
        url: what was downloaded (None when nothing needed downloading).
        installed: file names written by this call.
        skipped: optional file names not installed, with the reason.
    """

    name: str
    folder: Path
    url: str | None
    installed: tuple[str, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()


def mirror_from_env() -> str | None:
    return os.environ.get(MIRROR_ENV) or None


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsync'ed
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _owner_tag() -> str:
    """``rfrs-<pid>@<host>``: who writes a temporary file, so that a later process can tell
    a file left by a killed download from one still being written."""
    return f"rfrs-{os.getpid()}@{socket.gethostname()}"


def _umask() -> int:
    """The process's umask: from /proc/self/status where Linux gives it (reading it
    changes nothing), else by setting it and restoring it at once (a file another thread
    creates in between would get 022)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temp_in(folder: Path, name: str) -> tuple[Path, object]:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.{_owner_tag()}.", suffix=".part")
    return Path(tmp), os.fdopen(fd, "wb")


_TAGGED_PART = re.compile(r"\..+\.rfrs-(\d+)@(.+)\.[^./]+\.part")
#: an untagged ``.part`` (an older version's) older than this is taken as abandoned
UNTAGGED_PART_AGE_S = 3600.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: a process of another user holds the pid
        return True
    return True


def remove_stale_parts(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporary ``.part`` files in ``folder`` left by downloads that died
    without cleaning up; return them.

    A file tagged by this host (``.<file>.rfrs-<pid>@<host>.<random>.part``) is stale
    when its process no longer exists; a file tagged by another host is left alone
    (its process cannot be checked from here); an untagged one is stale when older
    than :data:`UNTAGGED_PART_AGE_S`. A download running concurrently into the same
    folder is therefore never disturbed.
    """
    folder = Path(folder)
    removed: list[Path] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    host, me = socket.gethostname(), os.getpid()
    for p in entries:
        if not (p.name.startswith(".") and p.name.endswith(".part")):
            continue
        m = _TAGGED_PART.fullmatch(p.name)
        try:
            if m is not None:
                pid = int(m.group(1))
                stale = m.group(2) == host and pid != me and not _pid_alive(pid)
            else:
                stale = time.time() - p.lstat().st_mtime > UNTAGGED_PART_AGE_S
            if stale and not p.is_dir():
                p.unlink()
                removed.append(p)
        except OSError:
            continue  # vanished meanwhile, or not ours to remove
    for p in removed:
        log.info("removed %s, left by an interrupted download", p)
    return removed


def _too_large(url: str, label: str, what: str) -> DownloadError:
    return DownloadError(
        f"downloading {url} was stopped: {what} (its known size plus a margin): this is not "
        "the published file, and nothing was installed",
        url=url, file=label,
    )


def _disk_error(url: str, path: Path, e: OSError) -> DownloadError:
    return DownloadError(
        f"writing {path} failed while downloading {url}: {e.strerror or e}; nothing was "
        "installed (free some space or choose another --data-dir / --cache-dir)",
        url=url, file=path.name,
    )


@contextlib.contextmanager
def _created_dirs(folder: Path) -> Iterator[None]:
    """Create ``folder`` (and parents); on failure remove the ones created here if empty."""
    created: list[Path] = []
    p = folder
    while not p.exists():
        created.append(p)
        p = p.parent
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        for d in created:  # deepest first
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def _stream(url: str, folder: Path, label: str, progress: ProgressCallback | None,
            timeout: float, cap: int) -> tuple[Path, str]:
    """Download ``url`` into a temporary file in ``folder``; return (path, sha256).

    At most ``cap + 1`` bytes are read: a body longer than ``cap`` (or a
    Content-Length above it) is a DownloadError, whatever the server sends.
    """
    tmp, fh = _temp_in(folder, label.replace("/", "_"))
    h = hashlib.sha256()
    done = 0
    total: int | None = None
    try:
        with fh:
            req = urllib.request.Request(url, headers={"User-Agent": f"rfrs-ref/{__version__}"})
            try:
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    length = resp.headers.get("Content-Length")
                    total = int(length) if length and length.isdigit() else None
                    if total is not None and total > cap:
                        raise _too_large(url, label, f"the server announces {total:,} bytes "
                                         f"for {label}, more than the {cap:,} bytes the "
                                         "manifest allows")
                    if progress is not None:
                        progress(label, 0, total)
                    while block := resp.read(min(_CHUNK, cap + 1 - done)):
                        try:
                            fh.write(block)
                        except OSError as e:
                            raise _disk_error(url, tmp, e) from e
                        h.update(block)
                        done += len(block)
                        if progress is not None:
                            progress(label, done, total)
                        if done > cap:
                            raise _too_large(url, label, f"the server sent more than the "
                                             f"{cap:,} bytes the manifest allows for {label}")
            except DownloadError:
                raise
            except urllib.error.HTTPError as e:
                raise DownloadError(f"downloading {url} failed: HTTP {e.code} {e.reason}",
                                    url=url, file=label) from e
            except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
                reason = getattr(e, "reason", e)
                raise DownloadError(
                    f"downloading {url} failed after {done:,} bytes"
                    f"{f' of {total:,}' if total is not None else ''}: {reason}",
                    url=url, file=label,
                ) from e
            if total is not None and done != total:
                raise DownloadError(
                    f"downloading {url} was interrupted: received {done:,} of {total:,} bytes "
                    "(Content-Length); nothing was installed, try again",
                    url=url, file=label,
                )
            try:
                fh.flush()
                os.fsync(fh.fileno())
            except OSError as e:
                raise _disk_error(url, tmp, e) from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, h.hexdigest()


def _extract(zf: zipfile.ZipFile, spec: FileSpec, folder: Path, url: str) -> tuple[Path, str]:
    """Extract ``spec.member`` into a temporary file in ``folder``; return (path, sha256).

    The member is refused when its declared size is above ``spec.cap``, and the
    extraction stops as soon as more than ``spec.cap`` bytes come out, whatever the
    archive declares.
    """
    member = spec.member
    declared = zf.getinfo(member).file_size
    if declared > spec.cap:
        raise _too_large(url, member, f"{member} declares {declared:,} bytes in the archive, "
                         f"more than the {spec.cap:,} bytes the manifest allows")
    tmp, fh = _temp_in(folder, spec.name)
    h = hashlib.sha256()
    done = 0
    try:
        with fh, zf.open(member) as src:
            while block := src.read(min(_CHUNK, spec.cap + 1 - done)):
                done += len(block)
                if done > spec.cap:
                    raise _too_large(url, member, f"{member} extracts to more than the "
                                     f"{spec.cap:,} bytes the manifest allows")
                try:
                    fh.write(block)
                except OSError as e:
                    raise _disk_error(url, tmp, e) from e
                h.update(block)
            try:
                fh.flush()
                os.fsync(fh.fileno())
            except OSError as e:
                raise _disk_error(url, tmp, e) from e
    except DownloadError:
        tmp.unlink(missing_ok=True)
        raise
    except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, ValueError,
            NotImplementedError) as e:
        # RuntimeError: encrypted member; NotImplementedError: unknown compression
        tmp.unlink(missing_ok=True)
        raise DownloadError(f"{url}: extracting {member} failed: {e}", url=url, file=member) from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, h.hexdigest()


def _mismatch(url: str, spec: FileSpec, digest: str) -> DownloadError:
    expected = " or ".join(spec.sha256)
    return DownloadError(
        f"{url}: {spec.member} has sha256 {digest}, expected {expected}; the download is "
        "damaged or the source has changed, and nothing was installed",
        url=url, file=spec.member, expected=expected, actual=digest,
    )


def install(
    m: DatasetManifest,
    root: str | os.PathLike,
    *,
    base_url: str | None = None,
    progress: ProgressCallback | None = None,
    timeout: float = 60.0,
) -> Fetched:
    """Download dataset ``m`` into ``<root>/<m.folder>/`` and verify it (see module doc).

    Files already in the folder are replaced atomically by the verified new ones.

    Raises:
        DownloadError: the transfer failed or was short, a size is over its cap, the
            archive is bad or lacks a required member, a required file's sha256 is not
            a pinned one, or the destination cannot be written (full disk...).
    """
    folder = Path(root) / m.folder
    url = m.source.url_for(base_url)
    if folder.is_symlink():
        raise DownloadError(f"cannot install into {folder}: it is a symbolic link (to "
                            f"{os.readlink(folder)}); files are never written through a link, "
                            "so replace it with a directory and try again", url=url)
    for spec in m.files:
        dest = folder / spec.name
        if dest.is_symlink():
            raise DownloadError(f"cannot install {dest}: it is a symbolic link (to "
                                f"{os.readlink(dest)}); files are never written through a "
                                "link, so remove it and try again", url=url, file=spec.name)
        if dest.is_dir() and not dest.is_symlink():
            raise DownloadError(f"cannot install {dest}: it is a directory; move it away and "
                                "try again", url=url, file=spec.name)
    log.info("downloading %s into %s", url, folder)
    temps: dict[str, Path] = {}
    skipped: list[tuple[str, str]] = []
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(_created_dirs(folder))
        except OSError as e:
            raise DownloadError(f"cannot create {folder}: {e.strerror or e}", url=url) from e
        remove_stale_parts(folder)
        try:
            if m.source.kind == "file":
                (spec,) = m.files  # a plain-file source carries exactly one file
                tmp, digest = _stream(url, folder, spec.name, progress, timeout, spec.cap)
                temps[spec.name] = tmp
                if digest not in spec.sha256:
                    raise _mismatch(url, spec, digest)
            elif m.source.kind == "zip":
                archive, _ = _stream(url, folder, Path(m.source.mirror_path).name, progress,
                                     timeout, m.source.cap(m.files))
                try:
                    try:
                        zf = zipfile.ZipFile(archive)
                    except zipfile.BadZipFile as e:
                        raise DownloadError(f"{url} is not a valid zip archive: {e}",
                                            url=url, file=None) from e
                    with zf:
                        members = set(zf.namelist())
                        for spec in m.files:
                            if spec.member not in members:
                                if spec.required:
                                    raise DownloadError(
                                        f"{url}: the archive has no member {spec.member!r}",
                                        url=url, file=spec.member)
                                skipped.append((spec.name, f"not in the archive {url}"))
                                continue
                            try:
                                tmp, digest = _extract(zf, spec, folder, url)
                            except DownloadError as err:
                                if spec.required:
                                    raise
                                skipped.append((spec.name, str(err)))
                                continue
                            temps[spec.name] = tmp
                            if digest not in spec.sha256:
                                err = _mismatch(url, spec, digest)
                                if spec.required:
                                    raise err
                                temps.pop(spec.name).unlink(missing_ok=True)
                                skipped.append((spec.name, str(err)))
                finally:
                    archive.unlink(missing_ok=True)
            else:  # pragma: no cover - guarded by the manifest
                raise ValueError(f"{m.name}: unknown source kind {m.source.kind!r}")
            mode = 0o666 & ~_umask()
            for name, tmp in temps.items():
                try:
                    os.chmod(tmp, mode)  # mkstemp's 0600 would keep the data from other users
                    os.replace(tmp, folder / name)
                except OSError as e:
                    raise DownloadError(f"cannot install {folder / name}: {e.strerror or e}",
                                        url=url, file=name) from e
            _fsync_dir(folder)
        except BaseException:
            for tmp in temps.values():
                tmp.unlink(missing_ok=True)
            raise
    for name, reason in skipped:
        warnings.warn(f"{m.name}: optional file {name} was not installed: {reason}",
                      stacklevel=2)
    return Fetched(m.name, folder, url, tuple(temps), tuple(skipped))

