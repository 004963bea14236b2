"""What pins a result: the data files a run read and the code that ran.

Two runs whose ``config.json`` record the same configuration, the same
``data_files`` digests and the same ``code`` (version and git commit) were
made from the same data and the same code; docs/training.md ("Provenance").

- :func:`data_files`: the sha256 and size of every file of a dataset that a
  run reads (the interactions file; the item-name file only where a command
  shows names). A generated dataset has no file: its parameters pin it.
- :func:`code_version`: the package version and, when the package is imported
  from a git checkout (an editable install, or the source tree), the commit
  and whether the tree had uncommitted changes; ``"unknown"`` otherwise (an
  installed wheel does not know its commit). Never raises.
- :func:`dataset_ids`: the dataset's own user and item ids of the dense ids the
  trainer uses, saved with every run (``ids.npz``) so that a trained model can
  be asked for recommendations in the dataset's terms.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import numpy as np


def code_version() -> dict:
    """``{"package": "0.1.0", "git_commit": "<40 hex>" | "unknown", "git_dirty": bool | None}``."""
    from rfrs_ref import __version__

    out = {"package": __version__, "git_commit": "unknown", "git_dirty": None}
    here = pathlib.Path(__file__).resolve().parent
    try:
        top = subprocess.run(["git", "-C", str(here), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, timeout=10)
        # the package must be part of that checkout, not merely inside some other repository
        if top.returncode != 0 or not (pathlib.Path(top.stdout.strip()) / "rfrs_ref").is_dir():
            return out
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return out
        out["git_commit"] = head.stdout.strip()
        status = subprocess.run(["git", "-C", str(here), "status", "--porcelain",
                                 "--untracked-files=no", "--", "."],
                                capture_output=True, text=True, timeout=30)
        if status.returncode == 0:
            out["git_dirty"] = bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):  # no git, a sandbox, a timeout
        pass
    return out


def sha256_of(path: str | os.PathLike) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _real(name: str):
    from rfrs_ref.data import DATASETS
    from rfrs_ref.data.datasets import RealDataset

    entry = DATASETS.get(name)
    return entry() if issubclass(entry, RealDataset) else None


def data_files(name: str, data_dir=None, *, roles=("interactions",)) -> list[dict]:
    """``[{"role", "file", "path", "bytes", "sha256"}]`` of the dataset's files of ``roles``
    that exist where the dataset is found; ``[]`` for a generated dataset."""
    ds = _real(name)
    if ds is None:
        return []
    folder = ds.folder(data_dir, download=False)
    out = []
    for role in roles:
        spec = ds.manifest.file(role)
        if spec is None:
            continue
        path = pathlib.Path(folder) / spec.name
        if path.is_file():
            out.append({"role": role, "file": spec.name, "path": str(path.resolve()),
                        "bytes": path.stat().st_size, "sha256": sha256_of(path)})
    return out


def dataset_ids(name: str, data, data_dir=None) -> tuple[np.ndarray, np.ndarray]:
    """(user_ids, item_ids): the dataset's own id of each dense user and item, int64.

    MovieLens and Last.fm ids are those of their files (``u.data``,
    ``user_artists.dat``); a CiteULike user is its line number in ``users.dat``
    (from 0) and an item its id there; a generated dataset's ids are the dense ids.
    """
    ds = _real(name)
    if ds is None:
        return (np.arange(data.n_users, dtype=np.int64), np.arange(data.n_items, dtype=np.int64))
    loaded = ds.load_full(data_dir, download=False)
    return loaded.user_ids.astype(np.int64), loaded.item_ids.astype(np.int64)
