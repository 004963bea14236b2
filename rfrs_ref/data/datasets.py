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
import os
from pathlib import Path
from typing import ClassVar

from rfrs_ref.data.base import Interactions
from rfrs_ref.data.download import Fetched, ProgressCallback, install, mirror_from_env
from rfrs_ref.data.errors import DatasetNotFoundError
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


def has_dataset(root: str | os.PathLike, m: DatasetManifest) -> bool:
    """Whether ``<root>/<folder>/`` holds every required file of ``m``."""
    folder = Path(root) / m.folder
    return all((folder / f.name).is_file() for f in m.required_files)


def locate(name: str, data_dir: str | os.PathLike | None = None, *,
           cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The folder holding real dataset ``name``, searched as documented above; None when
    absent (and always None for generated datasets such as ``synthetic``)."""
    DATASETS.get(name)  # unknown names fail with the list of choices
    if name not in manifests():
        return None
    m = manifest(name)
    for _, root in search_path(data_dir, cache_dir):
        if has_dataset(root, m):
            return root / m.folder
    return None


def verify_folder(folder: str | os.PathLike, m: DatasetManifest) -> list[str]:
    """Problems with the required files in ``folder`` (missing, or an unpinned sha256);
    empty when all is well."""
    problems = []
    for f in m.required_files:
        path = Path(folder) / f.name
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        digest = sha256_file(path)
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
    """One of the four datasets of docs/datasets.md, read from disk or downloaded."""

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
        if not download:
            searched = "; ".join(f"{p / self.manifest.folder} ({why})"
                                 for why, p in search_path(data_dir, cache_dir))
            need = ", ".join(f.name for f in self.manifest.required_files)
            raise DatasetNotFoundError(
                f"dataset {self.name!r} ({need}) was not found in: {searched}. Set "
                f"{DATA_DIR_ENV}, or run `rfrs-ref data fetch {self.name}` to download it."
            )
        return fetch(self.name, cache_dir=cache_dir, base_url=base_url,
                     progress=progress).folder

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

