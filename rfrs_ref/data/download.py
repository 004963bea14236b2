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

On any failure (network error, short transfer, bad archive, checksum
mismatch, interruption by the user) every temporary file is removed, and so
are the folders this call created, so the destination never holds a partial
or unverified file. Failures raise :class:`~rfrs_ref.data.errors.DownloadError`
naming the URL, the file, and for a mismatch the expected and actual sha256.

What is verified is the sha256 of the files the loader reads (the archive's
members), not of the archives: the archives' own digests are not pinned by
their publishers, while the members' are known (and are what matters).

An optional file (item names) that fails verification is not installed; the
dataset stays usable and a warning says so.

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
import tempfile
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


def _temp_in(folder: Path, name: str) -> tuple[Path, object]:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".part")
    return Path(tmp), os.fdopen(fd, "wb")


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
            timeout: float) -> tuple[Path, str]:
    """Download ``url`` into a temporary file in ``folder``; return (path, sha256)."""
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
                    if progress is not None:
                        progress(label, 0, total)
                    while block := resp.read(_CHUNK):
                        fh.write(block)
                        h.update(block)
                        done += len(block)
                        if progress is not None:
                            progress(label, done, total)
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
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, h.hexdigest()


def _extract(zf: zipfile.ZipFile, member: str, folder: Path, name: str,
             url: str) -> tuple[Path, str]:
    tmp, fh = _temp_in(folder, name)
    h = hashlib.sha256()
    try:
        with fh, zf.open(member) as src:
            while block := src.read(_CHUNK):
                fh.write(block)
                h.update(block)
            fh.flush()
            os.fsync(fh.fileno())
    except (zipfile.BadZipFile, OSError, EOFError) as e:
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
        DownloadError: the transfer failed or was short, the archive is bad or lacks
            a required member, or a required file's sha256 is not a pinned one.
    """
    folder = Path(root) / m.folder
    url = m.source.url_for(base_url)
    log.info("downloading %s into %s", url, folder)
    temps: dict[str, Path] = {}
    skipped: list[tuple[str, str]] = []
    with _created_dirs(folder):
        try:
            if m.source.kind == "file":
                (spec,) = m.files  # a plain-file source carries exactly one file
                tmp, digest = _stream(url, folder, spec.name, progress, timeout)
                temps[spec.name] = tmp
                if digest not in spec.sha256:
                    raise _mismatch(url, spec, digest)
            elif m.source.kind == "zip":
                archive, _ = _stream(url, folder, Path(m.source.mirror_path).name, progress,
                                     timeout)
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
                            tmp, digest = _extract(zf, spec.member, folder, spec.name, url)
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
            for name, tmp in temps.items():
                os.replace(tmp, folder / name)
            _fsync_dir(folder)
        except BaseException:
            for tmp in temps.values():
                tmp.unlink(missing_ok=True)
            raise
    for name, reason in skipped:
        warnings.warn(f"{m.name}: optional file {name} was not installed: {reason}",
                      stacklevel=2)
    return Fetched(m.name, folder, url, tuple(temps), tuple(skipped))

