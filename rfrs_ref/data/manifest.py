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
from collections.abc import Mapping


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
    """

    name: str
    role: str
    required: bool
    sha256: tuple[str, ...]
    member: str


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a dataset is downloaded from.

    Attributes:
        kind: ``zip`` (an archive whose members are extracted) or ``file``.
        url: the public URL.
        mirror_path: the path of the same object below a mirror's base URL.
    """

    kind: str
    url: str
    mirror_path: str

    def url_for(self, base_url: str | None) -> str:
        """The URL to download from: the public one, or ``<base_url>/<mirror_path>``."""
        if not base_url:
            return self.url
        return f"{base_url.rstrip('/')}/{self.mirror_path}"


@dataclasses.dataclass(frozen=True)
class DatasetManifest:
    """Everything the project knows about one real dataset (docs/datasets.md)."""

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
        )
        for fname, f in d["files"].items()
    )
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
        source=Source(kind=src["kind"], url=src["url"], mirror_path=src["mirror_path"]),
        licence=d.get("licence", ""),
        citation=d.get("citation", ""),
    )


@functools.cache
def manifests() -> dict[str, DatasetManifest]:
    """All real datasets of the manifest, by name, in the manifest's order."""
    text = (importlib.resources.files("rfrs_ref.manifests") / "datasets.json").read_text("utf-8")
    raw = json.loads(text)
    return {name: _parse(name, d) for name, d in raw["datasets"].items()}


def manifest(name: str) -> DatasetManifest:
    """The manifest of real dataset ``name``; KeyError naming the choices otherwise."""
    m = manifests()
    if name not in m:
        raise KeyError(f"no real dataset named {name!r}; the manifest has: {', '.join(m)}")
    return m[name]
