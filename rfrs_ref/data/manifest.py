"""The dataset manifest: folders, files, pinned sha256, sources and expected counts.

The manifest is ``datasets.json`` of the package ``rfrs_ref.manifests`` (the
repository's top-level ``data/`` folder). It is the single place where the
facts about each real dataset live; loaders, lookup, download, the command
line and the docs' table all read it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import json
import pathlib
from collections.abc import Mapping

#: a download may exceed a known size by this share (5%), and at least by SIZE_MARGIN_MIN
#: bytes: room for a byte-different copy in circulation (u.item), never for a different file
SIZE_MARGIN = 0.05
SIZE_MARGIN_MIN = 1 << 16


def size_cap(size: int) -> int:
    """The most bytes accepted for a file of known ``size``: ``size`` plus the margin."""
    return size + max(int(size * SIZE_MARGIN), SIZE_MARGIN_MIN)


@dataclasses.dataclass(frozen=True)
class FileSpec:
    """One file of a dataset folder.

    Attributes:
        name: file name inside the dataset's folder.
        role: ``interactions`` (the file the loader reads) or ``item_names``.
        required: whether the dataset is usable without it.
        sha256: accepted digests (lower-case hex); more than one where several
            byte-different copies of the same content are in circulation.
        member: its path inside the source archive (the file name for plain files).
        size: its size in bytes (of the copies known to the project).
    """

    name: str
    role: str
    required: bool
    sha256: tuple[str, ...]
    member: str
    size: int

    @property
    def cap(self) -> int:
        """The most bytes a download of this file may hold (:func:`size_cap`)."""
        return size_cap(self.size)


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a dataset is downloaded from.

    Attributes:
        kind: ``zip`` (an archive whose members are extracted) or ``file``.
        url: the public URL.
        mirror_path: the path of the same object below a mirror's base URL.
        size: the published size in bytes of an archive, when known.
        max_size: for an archive whose size is not pinned, an upper bound in bytes.
    """

    kind: str
    url: str
    mirror_path: str
    size: int | None = None
    max_size: int | None = None

    def cap(self, files: tuple["FileSpec", ...]) -> int:
        """The most bytes the download may hold: the archive's size plus the margin (else
        its ``max_size``); a plain file's own cap."""
        if self.kind == "file":
            return max(f.cap for f in files)
        if self.size is not None:
            return size_cap(self.size)
        return int(self.max_size)

    def url_for(self, base_url: str | None) -> str:
        """The URL to download from: the public one, or ``<base_url>/<mirror_path>``."""
        if not base_url:
            return self.url
        return f"{base_url.rstrip('/')}/{self.mirror_path}"


@dataclasses.dataclass(frozen=True)
class DatasetManifest:
    """Everything the project knows about one real dataset (the table of docs/datasets.md)."""

    name: str
    title: str
    folder: str
    format: str
    n_users: int
    n_items: int
    n_interactions: int
    id_ranges: Mapping[str, tuple[int, int]]
    files: tuple[FileSpec, ...]
    source: Source
    licence: str
    citation: str

    @property
    def required_files(self) -> tuple[FileSpec, ...]:
        return tuple(f for f in self.files if f.required)

    @property
    def optional_files(self) -> tuple[FileSpec, ...]:
        return tuple(f for f in self.files if not f.required)

    def file(self, role: str) -> FileSpec | None:
        """The file with ``role`` (``interactions``, ``item_names``), or None."""
        for f in self.files:
            if f.role == role:
                return f
        return None


def _parse(name: str, d: dict) -> DatasetManifest:
    src = d["source"]
    members = src.get("members", {})
    files = tuple(
        FileSpec(
            name=fname,
            role=f["role"],
            required=bool(f["required"]),
            sha256=tuple(s.lower() for s in f["sha256"]),
            member=members.get(fname, fname),
            size=int(f["size"]),
        )
        for fname, f in d["files"].items()
    )
    if src["kind"] == "zip" and src.get("size") is None and src.get("max_size") is None:
        raise ValueError(f"datasets.json: {name}: a zip source needs size or max_size (the cap "
                         "on what is downloaded)")
    counts = d["counts"]
    return DatasetManifest(
        name=name,
        title=d["title"],
        folder=d["folder"],
        format=d["format"],
        n_users=int(counts["users"]),
        n_items=int(counts["items"]),
        n_interactions=int(counts["interactions"]),
        id_ranges={k: (int(v[0]), int(v[1])) for k, v in d.get("id_ranges", {}).items()},
        files=files,
        source=Source(kind=src["kind"], url=src["url"], mirror_path=src["mirror_path"],
                      size=src.get("size"), max_size=src.get("max_size")),
        licence=d.get("licence", ""),
        citation=d.get("citation", ""),
    )


@functools.cache
def manifests() -> dict[str, DatasetManifest]:
    """All real datasets of the manifest, by name, in the manifest's order."""
    try:
        files = importlib.resources.files("rfrs_ref.manifests")
    except ModuleNotFoundError:
        import rfrs_ref

        # setup.cfg maps data/ to rfrs_ref.manifests (and cli/ to rfrs_ref.cli) when the
        # package is installed; a checkout's rfrs_ref/ on sys.path has neither
        raise ModuleNotFoundError(
            f"rfrs_ref.manifests is missing: Python imported rfrs_ref from the source "
            f"checkout {pathlib.Path(rfrs_ref.__file__).parent.parent} (the current "
            "directory comes first on its path), not from the installed package "
            "(pip install . from the checkout); run Python from another directory") from None
    text = (files / "datasets.json").read_text("utf-8")
    raw = json.loads(text)
    return {name: _parse(name, d) for name, d in raw["datasets"].items()}


def manifest(name: str) -> DatasetManifest:
    """The manifest of real dataset ``name``; KeyError naming the choices otherwise."""
    m = manifests()
    if name not in m:
        raise KeyError(f"no real dataset named {name!r}; the manifest has: {', '.join(m)}")
    return m[name]
