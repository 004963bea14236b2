"""Loaders of the four real datasets from a dataset folder (docs/datasets.md).

Each loader reads the folder's interactions file once, checks its format
strictly (:mod:`rfrs_ref.data.formats`), checks the content against the
manifest, re-indexes ids densely and returns an
:class:`~rfrs_ref.data.base.Interactions` together with the original ids.

Conventions:

- Every (user, item) pair present is one implicit positive interaction;
  ratings (ml100k), play counts (lastfm) and timestamps are read, range-checked
  where the format defines a range, and dropped.
- lastfm and ml100k: the sorted distinct user ids become users ``0..n_users-1``
  and the sorted distinct item ids become items ``0..n_items-1`` (ml100k's ids
  are already ``1..n``, so this is id − 1 there).
- citeulike: line u (0-based) is user u and the 0-based item ids are kept as
  they are; ``n_items`` comes from the manifest, since in citeulike-t only
  25,584 of the 25,975 ids occur.
- A pair given twice (two lines with the same user and item; an id repeated on
  a citeulike line) is a format error: none of the published files has one, so
  a repeat means a different or damaged file. With this rule the table's
  counts are counts of distinct pairs and of lines.

With ``verify=True`` (the default) the file's sha256 must be one the manifest
pins and the counts must be the table's; ``verify=False`` accepts a modified
copy whose format is still checked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

import numpy as np

from rfrs_ref.data.base import Interactions
from rfrs_ref.data.errors import DatasetFormatError, DatasetNotFoundError
from rfrs_ref.data.formats import check_line_count, read_count_lists, read_names, read_table
from rfrs_ref.data.manifest import DatasetManifest

LASTFM_HEADER = "userID\tartistID\tweight"
LASTFM_FIELDS = ("userID", "artistID", "weight")
UDATA_FIELDS = ("user", "item", "rating", "timestamp")


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A loaded dataset with the ids of its source file.

    Attributes:
        data: the interactions, dense ids.
        user_ids: int64 (n_users,), the source's id of each dense user.
        item_ids: int64 (n_items,), the source's id of each dense item.
        sha256: digest of the interactions file.
    """

    data: Interactions
    user_ids: np.ndarray
    item_ids: np.ndarray
    sha256: str


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _fmt(n: int) -> str:
    return f"{n:,}"


def check_sha256(path: str, digest: str, accepted: tuple[str, ...], dataset: str,
                 folder: str | None = None) -> None:
    """Raise DatasetFormatError when ``digest`` is not among the pinned ones.

    The message suggests the command that replaces the file where it lies
    (:func:`rfrs_ref.data.datasets.fetch_command`: ``rfrs-ref data fetch DATASET
    --data-dir ROOT``, ROOT being the directory that holds the dataset's folder
    (``folder``, e.g. ``ml-100k``) when the file is in one; no option for the default
    cache). Without ``--data-dir`` the fetch would install into the cache, while
    ``--data-dir`` and ``RFRS_DATA_DIR`` are searched first: the damaged copy would still
    be the one read. ``fetch`` replaces a damaged copy without ``--force``.
    """
    if digest not in accepted:
        here = os.path.dirname(os.path.abspath(path))
        if folder is not None and os.path.basename(here) == folder:
            from rfrs_ref.data.datasets import fetch_command

            fix = f"replace it, e.g. `{fetch_command(dataset, os.path.dirname(here))}`"
        else:  # not in the dataset's own folder: a fetch cannot install it there
            fix = (f"replace it with the published file (`rfrs-ref data fetch {dataset} "
                   f"--data-dir DIR` installs one into DIR/{folder or dataset})")
        raise DatasetFormatError(
            path, None,
            f"sha256 {' or '.join(accepted)} (the published {dataset} file)",
            f"{digest}: the file parses but differs from the published one (damaged or "
            f"modified); {fix}, or load it with verify=False",
        )


def _check_range(path: str, table, col: int, name: str, lo: int, hi: int) -> None:
    v = table.values[:, col]
    bad = (v < lo) | (v > hi)
    if bad.any():
        r = int(np.argmax(bad))
        raise DatasetFormatError(path, table.line_of(r), f"{name} in {lo}..{hi}", str(int(v[r])))


def _pairs_to_csr(
    path: str, table, user_col: int, item_col: int, name: str
) -> tuple[Interactions, np.ndarray, np.ndarray]:
    users = table.values[:, user_col]
    items = table.values[:, item_col]
    user_ids, u = np.unique(users, return_inverse=True)
    item_ids, i = np.unique(items, return_inverse=True)
    n_users, n_items = int(user_ids.size), int(item_ids.size)
    key = u.astype(np.int64) * n_items + i
    order = np.argsort(key, kind="stable")
    sk = key[order]
    rep = np.flatnonzero(sk[1:] == sk[:-1])
    if rep.size:
        # report the earliest line that repeats a pair seen before it
        later = order[rep + 1]
        k = int(np.argmin(later))
        r2, r1 = int(later[k]), int(order[rep[k]])
        raise DatasetFormatError(
            path, table.line_of(r2), "each (user, item) pair once",
            f"user {int(users[r2])}, item {int(items[r2])} again (first on line "
            f"{table.line_of(r1)})",
        )
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(u, minlength=n_users), out=indptr[1:])
    indices = (sk % n_items).astype(np.int32)
    data = Interactions(name, n_users, n_items, indptr, indices, source=path)
    return data, user_ids.astype(np.int64), item_ids.astype(np.int64)


def _check_counts(path: str, data: Interactions, m: DatasetManifest) -> None:
    for what, found, expected in (
        ("users", data.n_users, m.n_users),
        ("items", data.n_items, m.n_items),
        ("interactions", data.n_interactions, m.n_interactions),
    ):
        if found != expected:
            raise DatasetFormatError(
                path, None, f"{_fmt(expected)} {what} ({m.name}, the published counts)",
                f"{_fmt(found)}",
            )


def _read(path: str) -> tuple[bytes, str]:
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as e:  # e.g. its permissions changed since the lookup
        raise DatasetNotFoundError(f"{path} cannot be read: {e.strerror or e}") from None
    return raw, hashlib.sha256(raw).hexdigest()


def load_pairs(folder: str | os.PathLike, m: DatasetManifest, *, verify: bool = True) -> Loaded:
    """Load a dataset stored as a tab-separated table (lastfm, ml100k)."""
    spec = m.file("interactions")
    path = os.path.join(os.fspath(folder), spec.name)
    raw, digest = _read(path)
    # line counts are checked last so that errors come in line order
    if m.format == "user_artists":
        table = read_table(path, LASTFM_FIELDS, header=LASTFM_HEADER, raw=raw)
    elif m.format == "udata":
        table = read_table(path, UDATA_FIELDS, raw=raw)
        _check_range(path, table, 2, "rating", 1, 5)
    else:  # pragma: no cover - guarded by the manifest
        raise ValueError(f"{m.name}: format {m.format!r} is not a table format")
    names = LASTFM_FIELDS if m.format == "user_artists" else UDATA_FIELDS
    lo_u, hi_u = m.id_ranges.get("user", (1, np.iinfo(np.int64).max))
    lo_i, hi_i = m.id_ranges.get("item", (1, np.iinfo(np.int64).max))
    _check_range(path, table, 0, names[0], lo_u, hi_u)
    _check_range(path, table, 1, names[1], lo_i, hi_i)
    data, user_ids, item_ids = _pairs_to_csr(path, table, 0, 1, m.name)
    if verify:
        check_line_count(path, table.first_line, table.values.shape[0], m.n_interactions,
                         "data lines")
        _check_counts(path, data, m)
        check_sha256(path, digest, spec.sha256, m.name, m.folder)
    return Loaded(data, user_ids, item_ids, digest)


def load_count_lists(
    folder: str | os.PathLike, m: DatasetManifest, *, verify: bool = True
) -> Loaded:
    """Load a citeulike ``users.dat``: line u is user u, item ids kept as they are,
    n_items from the manifest."""
    spec = m.file("interactions")
    path = os.path.join(os.fspath(folder), spec.name)
    raw, digest = _read(path)
    lists = read_count_lists(path, raw=raw)
    n_users = lists.indptr.size - 1
    line = np.repeat(np.arange(n_users, dtype=np.int64), np.diff(lists.indptr))
    ids = lists.ids
    bad = ids >= m.n_items
    if bad.any():
        k = int(np.argmax(bad))
        raise DatasetFormatError(
            path, int(line[k]) + 1, f"item ids in 0..{m.n_items - 1} ({m.name} has "
            f"{_fmt(m.n_items)} items)", str(int(ids[k])),
        )
    key = line * m.n_items + ids
    order = np.argsort(key, kind="stable")
    sk = key[order]
    rep = np.flatnonzero(sk[1:] == sk[:-1])
    if rep.size:
        k = int(order[rep].min())
        raise DatasetFormatError(
            path, int(line[k]) + 1, "distinct item ids on a line",
            f"item {int(ids[k])} more than once",
        )
    indices = ids[order].astype(np.int32)
    data = Interactions(m.name, n_users, m.n_items, lists.indptr.copy(), indices, source=path)
    if verify:
        check_line_count(path, 1, n_users, m.n_users, "lines")
        _check_counts(path, data, m)
        check_sha256(path, digest, spec.sha256, m.name, m.folder)
    ids_u = np.arange(n_users, dtype=np.int64)
    return Loaded(data, ids_u, np.arange(m.n_items, dtype=np.int64), digest)


def load_folder(folder: str | os.PathLike, m: DatasetManifest, *, verify: bool = True) -> Loaded:
    """Load dataset ``m`` from its folder (the one holding its files)."""
    if m.format in ("user_artists", "udata"):
        return load_pairs(folder, m, verify=verify)
    if m.format == "count_lists":
        return load_count_lists(folder, m, verify=verify)
    raise ValueError(f"{m.name}: unknown format {m.format!r} in the manifest")  # pragma: no cover


def load_names(folder: str | os.PathLike, m: DatasetManifest, item_ids: np.ndarray,
               *, verify: bool = True) -> list[str] | None:
    """Item names aligned with dense item ids, or None when the dataset has no name file
    or the file is absent.

    An item missing from the name file (``u.item`` copies in circulation lack id
    267, whose official title is ``unknown``) is named ``"item <source id>"``.
    """
    spec = m.file("item_names")
    if spec is None:
        return None
    path = os.path.join(os.fspath(folder), spec.name)
    if not os.path.isfile(path):
        return None
    if verify:
        check_sha256(path, sha256_file(path), spec.sha256, m.name, m.folder)
    if m.format == "user_artists":
        names = read_names(path, separator="\t", encoding="utf-8",
                           header="id\tname\turl\tpictureURL")
    else:
        # ISO-8859-1 decodes both the official file and its ASCII re-encoding
        names = read_names(path, separator="|", encoding="latin-1")
    return [names.get(int(i), f"item {int(i)}") for i in item_ids]
