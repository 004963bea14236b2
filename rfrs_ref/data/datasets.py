"""The dataset registry, lookup, fetching and loading (docs/datasets.md).

Lookup. ``load_dataset(name, data_dir)`` looks for ``<root>/<folder>/`` holding
the dataset's required files in, in order:

1. ``data_dir``, when given;
2. the environment variable ``RFRS_DATA_DIR``, when set;
3. the cache, ``cache_dir`` when given, else :func:`default_cache_dir`
   (``$RFRS_CACHE_DIR/datasets``, else ``$XDG_CACHE_HOME/rfrs-ref/datasets``,
   else ``~/.cache/rfrs-ref/datasets``);

and, when none has it and ``download`` is true, downloads it into the cache
(:mod:`rfrs_ref.data.download`). The first directory that has the files is
used, and it is used as it is: if its copy is damaged, loading fails with a
:class:`DatasetFormatError` instead of silently moving on to another copy.

Verification of local files. Loading reads the interactions file once, and
with ``verify=True`` (the default) checks its sha256 against the manifest as
well as its format and counts; hashing a few megabytes costs milliseconds, and
it is the only way to catch a damaged file whose damage happens to parse
(a digit lost in the last line). ``verify=False`` loads a modified copy, still
checking its format.

Folder names are those of the published archives (``ml-100k``,
``hetrec2011-lastfm-2k``, ``citeulike-a``, ``citeulike-t``), so a directory
where the archives were unpacked is a valid data directory.
"""

from __future__ import annotations

import abc
import dataclasses
import errno
import os
import shlex
import stat
from pathlib import Path
from typing import ClassVar

from rfrs_ref.data.base import Interactions
from rfrs_ref.data.download import Fetched, ProgressCallback, install, mirror_from_env
from rfrs_ref.data.errors import DatasetNotFoundError, DownloadError
from rfrs_ref.data.loaders import Loaded, load_folder, load_names, sha256_file
from rfrs_ref.data.manifest import DatasetManifest, manifest, manifests
from rfrs_ref.data.synthetic import synthetic
from rfrs_ref.params import hyper
from rfrs_ref.registry import Registry

DATA_DIR_ENV = "RFRS_DATA_DIR"
CACHE_DIR_ENV = "RFRS_CACHE_DIR"


def user_cache_dir() -> Path:
    """The project's cache root: ``RFRS_CACHE_DIR``, else ``$XDG_CACHE_HOME/rfrs-ref``,
    else ``~/.cache/rfrs-ref``."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "rfrs-ref"


def default_cache_dir() -> Path:
    """Where downloaded datasets go: ``user_cache_dir() / "datasets"``."""
    return user_cache_dir() / "datasets"


def search_path(data_dir: str | os.PathLike | None = None,
                cache_dir: str | os.PathLike | None = None) -> list[tuple[str, Path]]:
    """The directories searched, in order, each with where it comes from."""
    out: list[tuple[str, Path]] = []
    if data_dir is not None:
        out.append(("data_dir", Path(data_dir).expanduser()))
    if os.environ.get(DATA_DIR_ENV):
        out.append((DATA_DIR_ENV, Path(os.environ[DATA_DIR_ENV]).expanduser()))
    out.append(("cache", Path(cache_dir).expanduser() if cache_dir is not None
                else default_cache_dir()))
    return out


def fetch_command(name: str, root: str | os.PathLike, data_dir: str | os.PathLike | None = None,
                  cache_dir: str | os.PathLike | None = None) -> str:
    """The ``rfrs-ref data fetch`` command that installs a verified copy of ``name`` in
    ``root`` (a directory of the search path, holding ``<folder>/``), replacing a damaged
    one there (``fetch`` replaces a copy whose sha256 is not a published one, without
    ``--force``): the cache's own option for the cache (none for the default cache),
    ``--data-dir`` for any other directory."""
    import shlex

    root = Path(root)
    cmd = f"rfrs-ref data fetch {shlex.quote(name)}"
    source = next((src for src, path in search_path(data_dir, cache_dir) if path == root), None)
    if source == "cache":
        if root == default_cache_dir():
            return cmd
        return f"{cmd} --cache-dir {shlex.quote(str(root))}"
    return f"{cmd} --data-dir {shlex.quote(str(root))}"


NOT_FOUND = "not found"


def probe_file(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read as a dataset file, or None when it can.

    The reasons, in words for a message: ``not found`` (nothing there, or a
    folder on the way is missing), ``a broken symbolic link (to TARGET)``,
    ``a symbolic link loop``, ``a directory, not a file``, ``not a regular
    file``, ``permission denied``, or the system's own words for anything else.
    Only ``not found`` means the file is simply absent.
    """
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            try:
                return f"a broken symbolic link (to {os.readlink(path)})"
            except OSError:
                return "a broken symbolic link"
        return NOT_FOUND
    except NotADirectoryError:
        return NOT_FOUND
    except PermissionError:
        return "permission denied (on the path to it)"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link loop"
        return e.strerror or str(e)
    if stat.S_ISDIR(st.st_mode):
        return "a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if not os.access(path, os.R_OK):
        return "permission denied"
    return None


def has_dataset(root: str | os.PathLike, m: DatasetManifest) -> bool:
    """Whether ``<root>/<folder>/`` holds every required file of ``m``, readable."""
    folder = Path(root) / m.folder
    return all(probe_file(folder / f.name) is None for f in m.required_files)


def _unusable(root: Path, m: DatasetManifest) -> list[str]:
    """``"<path> is <reason>"`` for each required file of ``m`` under ``root`` that is
    present but cannot be read (a directory, a link loop, permission denied...)."""
    out = []
    for f in m.required_files:
        path = root / m.folder / f.name
        why = probe_file(path)
        if why is not None and why != NOT_FOUND:
            out.append(f"{path} is {why}")
    return out


def _searched(name: str, data_dir, cache_dir) -> str:
    """Where ``name`` was looked for, for a message: each folder, where it comes from, and
    what is wrong there."""
    m = manifest(name)
    parts = []
    for why, root in search_path(data_dir, cache_dir):
        label = {"data_dir": "data_dir / --data-dir", "cache": "the cache"}.get(why, why)
        missing = [f.name for f in m.required_files
                   if probe_file(root / m.folder / f.name) is not None]
        state = "no " + ", ".join(missing) if missing else "present"
        if not (root / m.folder).exists():
            state = "not found"
            if all((root / f.name).is_file() for f in m.required_files):
                # --data-dir ml-100k instead of the directory holding ml-100k/
                state += (f"; {root} is the dataset's folder itself: give the directory "
                          f"holding it, {root.parent}")
        parts.append(f"{root / m.folder} ({label}: {state})")
    return "; ".join(parts)


def locate(name: str, data_dir: str | os.PathLike | None = None, *,
           cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The folder holding real dataset ``name``, searched as documented above; None when
    absent (and always None for generated datasets such as ``synthetic``).

    Raises:
        DatasetNotFoundError: a searched folder holds a required file that cannot be
            read (a directory, a symbolic link loop, permission denied): the message
            names the path and the reason instead of moving on to another copy.
    """
    DATASETS.get(name)  # unknown names fail with the list of choices
    if name not in manifests():
        return None
    m = manifest(name)
    for _, root in search_path(data_dir, cache_dir):
        if has_dataset(root, m):
            return root / m.folder
        bad = _unusable(root, m)
        if bad:
            # a copy that is there but unreadable is reported, not passed over for another
            raise DatasetNotFoundError(
                f"dataset {name!r} cannot be read: {'; '.join(bad)}. Fix or remove it "
                f"(`rfrs-ref data fetch {shlex.quote(name)} --data-dir {shlex.quote(str(root))}` "
                "installs a fresh copy)")
            # always --data-dir: a fetch into the cache looks the copy up first, and would
            # stop on this very error
    return None


def verify_folder(folder: str | os.PathLike, m: DatasetManifest) -> list[str]:
    """Problems with the required files in ``folder`` (missing, or an unpinned sha256);
    empty when all is well.

    Raises:
        OSError: a file that cannot be read (EIO, permission denied), with its path as
            the error's ``filename``.
    """
    problems = []
    for f in m.required_files:
        path = Path(folder) / f.name
        why = probe_file(path)
        if why is not None:
            problems.append(f"{path}: {'missing' if why == NOT_FOUND else why}")
            continue
        try:
            digest = sha256_file(path)
        except OSError as exc:  # a read that fails half-way (EIO) names no file of its own
            if exc.filename is None:
                exc.filename = str(path)
            raise
        if digest not in f.sha256:
            problems.append(f"{path}: sha256 {digest}, expected {' or '.join(f.sha256)}")
    return problems


def fetch(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    base_url: str | None = None,
    force: bool = False,
    progress: ProgressCallback | None = None,
    timeout: float = 60.0,
) -> Fetched:
    """Make real dataset ``name`` present and verified in a directory, downloading if needed.

    The destination root is ``data_dir`` when given, else the cache (``cache_dir``
    or :func:`default_cache_dir`). When the destination already holds the
    required files and their sha256 are pinned ones, nothing is downloaded
    (unless ``force``); a damaged copy is replaced by a verified download.

    Args:
        base_url: a mirror (see :mod:`rfrs_ref.data.download`); default
            ``RFRS_DATA_MIRROR``, else the public sources.
        progress: called as ``progress(label, bytes_done, bytes_total_or_None)``.
        timeout: seconds of network silence before giving up.

    Raises:
        DownloadError: see :func:`rfrs_ref.data.download.install`.
        ValueError: ``name`` is a generated dataset (nothing to fetch).
    """
    DATASETS.get(name)
    if name not in manifests():
        raise ValueError(f"dataset {name!r} is generated, there is nothing to fetch")
    m = manifest(name)
    root = Path(data_dir).expanduser() if data_dir is not None else (
        Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir())
    folder = root / m.folder
    if not force and has_dataset(root, m) and not verify_folder(folder, m):
        return Fetched(name, folder, None)
    base = base_url if base_url is not None else mirror_from_env()
    return install(m, root, base_url=base, progress=progress, timeout=timeout)


# --- registry entries ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Dataset(abc.ABC):
    """A registry entry of the ``data`` family; fields are its hyperparameters."""

    name: ClassVar[str] = ""

    @abc.abstractmethod
    def load(self, data_dir=None, *, download: bool = True, cache_dir=None,
             base_url: str | None = None, verify: bool = True,
             progress: ProgressCallback | None = None) -> Interactions:
        """The dataset's interactions."""


@dataclasses.dataclass(frozen=True)
class RealDataset(Dataset):
    """One of the four datasets of the table of docs/datasets.md, read from disk or downloaded."""

    @property
    def manifest(self) -> DatasetManifest:
        return manifest(self.name)

    def folder(self, data_dir=None, *, download: bool = True, cache_dir=None,
               base_url: str | None = None,
               progress: ProgressCallback | None = None) -> Path:
        """The folder holding the dataset, downloading into the cache if allowed."""
        found = locate(self.name, data_dir, cache_dir=cache_dir)
        if found is not None:
            return found
        need = ", ".join(f.name for f in self.manifest.required_files)
        if not download:
            raise DatasetNotFoundError(
                f"dataset {self.name!r} ({need}) was not found in: "
                f"{_searched(self.name, data_dir, cache_dir)}. Set {DATA_DIR_ENV} to a "
                f"directory holding {self.manifest.folder}/, or run `rfrs-ref data fetch "
                f"{self.name}` to download it."
            )
        try:
            return fetch(self.name, cache_dir=cache_dir, base_url=base_url,
                         progress=progress).folder
        except DownloadError as e:
            raise DownloadError(
                f"dataset {self.name!r} ({need}) was not found in: "
                f"{_searched(self.name, data_dir, cache_dir)}; and downloading it failed: "
                f"{e}. Run `rfrs-ref data fetch {self.name}` (on a machine with network "
                f"access, then copy its {self.manifest.folder}/ folder into one of these "
                f"places), or set {DATA_DIR_ENV} to a directory holding "
                f"{self.manifest.folder}/.",
                url=e.url, file=e.file, expected=e.expected, actual=e.actual,
            ) from e

    def load_full(self, data_dir=None, *, download: bool = True, cache_dir=None,
                  base_url: str | None = None, verify: bool = True,
                  progress: ProgressCallback | None = None) -> Loaded:
        folder = self.folder(data_dir, download=download, cache_dir=cache_dir,
                             base_url=base_url, progress=progress)
        return load_folder(folder, self.manifest, verify=verify)

    def load(self, data_dir=None, *, download: bool = True, cache_dir=None,
             base_url: str | None = None, verify: bool = True,
             progress: ProgressCallback | None = None) -> Interactions:
        return self.load_full(data_dir, download=download, cache_dir=cache_dir,
                              base_url=base_url, verify=verify, progress=progress).data


DATASETS: Registry[type[Dataset]] = Registry("dataset")


@DATASETS.register("lastfm")
@dataclasses.dataclass(frozen=True)
class LastFM(RealDataset):
    """Last.fm HetRec 2011: users × artists they listened to."""

    name: ClassVar[str] = "lastfm"


@DATASETS.register("ml100k")
@dataclasses.dataclass(frozen=True)
class ML100K(RealDataset):
    """MovieLens 100K: users × movies they rated."""

    name: ClassVar[str] = "ml100k"


@DATASETS.register("citeulike-a")
@dataclasses.dataclass(frozen=True)
class CiteULikeA(RealDataset):
    """CiteULike-a: users × articles in their libraries."""

    name: ClassVar[str] = "citeulike-a"


@DATASETS.register("citeulike-t")
@dataclasses.dataclass(frozen=True)
class CiteULikeT(RealDataset):
    """CiteULike-t: users × articles in their libraries."""

    name: ClassVar[str] = "citeulike-t"


@DATASETS.register("synthetic")
@dataclasses.dataclass(frozen=True)
class Synthetic(Dataset):
    """Generated clusters-and-popularity data (:mod:`rfrs_ref.data.synthetic`)."""

    name: ClassVar[str] = "synthetic"

    n_users: int = hyper(600, "synthetic data: number of users (clients)", cli="synthetic-users")
    n_items: int = hyper(1000, "synthetic data: number of items", cli="synthetic-items")
    n_clusters: int = hyper(10, "synthetic data: number of latent item clusters",
                            cli="synthetic-clusters")
    mean_items: float = hyper(20.0, "synthetic data: mean items per user",
                              cli="synthetic-mean-items")
    seed: int = hyper(0, "synthetic data: generator seed (the data, not the trial)",
                      cli="synthetic-seed")
    popularity_exponent: float = hyper(1.0, "synthetic data: Zipf exponent of popularity "
                                       "within a cluster", cli="synthetic-popularity")
    concentration: float = hyper(0.1, "synthetic data: Dirichlet concentration of users' "
                                 "cluster preferences", cli="synthetic-concentration")
    noise: float = hyper(0.1, "synthetic data: share of items drawn from global popularity",
                         cli="synthetic-noise")

    def load(self, data_dir=None, *, download: bool = True, cache_dir=None,
             base_url: str | None = None, verify: bool = True,
             progress: ProgressCallback | None = None) -> Interactions:
        return synthetic(self.n_users, self.n_items, self.n_clusters, self.mean_items,
                         self.seed, popularity_exponent=self.popularity_exponent,
                         concentration=self.concentration, noise=self.noise)


def _entry(name: str, params: dict) -> Dataset:
    cls = DATASETS.get(name)
    try:
        return cls(**params)
    except TypeError:
        accepted = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(params) - set(accepted))
        raise TypeError(
            f"dataset {name!r} does not take parameter(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(accepted) if accepted else 'none'}"
        ) from None


def load_dataset(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    download: bool = True,
    cache_dir: str | os.PathLike | None = None,
    base_url: str | None = None,
    verify: bool = True,
    progress: ProgressCallback | None = None,
    **params,
) -> Interactions:
    """Load dataset ``name`` (a name of :data:`DATASETS`).

    Real datasets are looked up in ``data_dir``, ``RFRS_DATA_DIR``, then the
    cache, and downloaded into the cache when absent and ``download`` is true
    (module docstring); ``params`` are the generator's parameters for
    ``synthetic`` (``load_dataset("synthetic", n_users=100)``).

    Raises:
        KeyError: unknown name (the message lists the choices).
        TypeError: a parameter the dataset does not take.
        DatasetNotFoundError: absent everywhere and ``download`` is false.
        DatasetFormatError: the file found is malformed, or (``verify``) its
            counts or sha256 differ from the published dataset.
        DownloadError: the download failed or did not verify.
    """
    return _entry(name, params).load(
        data_dir, download=download, cache_dir=cache_dir, base_url=base_url, verify=verify,
        progress=progress,
    )


def load_item_names(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    download: bool = False,
    cache_dir: str | os.PathLike | None = None,
    verify: bool = True,
) -> list[str] | None:
    """Names of the items of ``name``, indexed by dense item id, for showing recommendations.

    None when the dataset has no name file (citeulike, synthetic) or the optional
    file (``artists.dat``, ``u.item``) is not in the dataset's folder.
    """
    entry = DATASETS.get(name)
    if not issubclass(entry, RealDataset):
        return None
    ds = entry()
    loaded = ds.load_full(data_dir, download=download, cache_dir=cache_dir, verify=verify)
    folder = ds.folder(data_dir, download=False, cache_dir=cache_dir)
    return load_names(folder, ds.manifest, loaded.item_ids, verify=verify)

