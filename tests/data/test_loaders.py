"""Loaders: the SPEC §1 counts on the real datasets, and clear errors on damaged copies."""

from __future__ import annotations

import numpy as np
import pytest

from rfrs_ref.data import (
    DATASETS,
    DatasetFormatError,
    Interactions,
    load_dataset,
    load_item_names,
    manifest,
)

# SPEC §1 table, written out here so that the manifest is checked too
TABLE = {
    "lastfm": (1892, 17632, 92834),
    "ml100k": (943, 1682, 100000),
    "citeulike-a": (5551, 16980, 204986),
    "citeulike-t": (7947, 25975, 134860),
}


def _check_csr(d: Interactions) -> None:
    assert d.indptr.dtype == np.int64 and d.indices.dtype == np.int32
    assert d.indptr[0] == 0 and d.indptr[-1] == d.indices.size
    assert np.all(np.diff(d.indptr) >= 0)
    assert d.indices.min() >= 0 and d.indices.max() < d.n_items
    user = np.repeat(np.arange(d.n_users), d.counts())
    # strictly increasing within each user
    same = user[1:] == user[:-1]
    assert np.all(d.indices[1:][same] > d.indices[:-1][same])


def test_registry_names():
    assert DATASETS.names() == ["lastfm", "ml100k", "citeulike-a", "citeulike-t", "synthetic"]


@pytest.mark.parametrize("name", list(TABLE))
def test_manifest_counts_are_the_table(name):
    m = manifest(name)
    assert (m.n_users, m.n_items, m.n_interactions) == TABLE[name]


@pytest.mark.parametrize("name", list(TABLE))
def test_real_dataset_counts(name, real, data_dir):
    real(name)
    d = load_dataset(name, data_dir, download=False)
    assert (d.n_users, d.n_items, d.n_interactions) == TABLE[name]
    assert d.name == name
    _check_csr(d)
    assert d.counts().min() >= 1


def test_ml100k_is_the_file_shifted_by_one(real, data_dir):
    """Dense ids of ml100k are the file's ids minus one (its ids are already 1..n)."""
    folder = real("ml100k")
    rows = np.loadtxt(folder / "u.data", dtype=np.int64, delimiter="\t")
    d = load_dataset("ml100k", data_dir, download=False)
    got = {(u, int(i)) for u in range(d.n_users) for i in d.items_of(u)}
    assert got == {(int(u) - 1, int(i) - 1) for u, i in rows[:, :2]}


def test_citeulike_keeps_ids_and_counts_unseen_items(real, data_dir):
    folder = real("citeulike-t")
    lines = (folder / "users.dat").read_text().split("\n")
    d = load_dataset("citeulike-t", data_dir, download=False)
    for u in (0, 1, len(lines) // 2, len(lines) - 1):
        ids = sorted(int(x) for x in lines[u].split()[1:])
        assert d.items_of(u).tolist() == ids
    # 25,584 ids occur; the other items exist with no interaction
    assert int(np.count_nonzero(d.item_counts())) == 25584


def test_lastfm_reindexes_sorted_ids(real, data_dir):
    folder = real("lastfm")
    rows = np.loadtxt(folder / "user_artists.dat", dtype=np.int64, delimiter="\t", skiprows=1)
    users, items = np.unique(rows[:, 0]), np.unique(rows[:, 1])
    d = load_dataset("lastfm", data_dir, download=False)
    first_user = rows[rows[:, 0] == users[0], 1]
    assert d.items_of(0).tolist() == sorted(np.searchsorted(items, first_user).tolist())


def test_item_names(real, data_dir):
    real("ml100k")
    names = load_item_names("ml100k", data_dir)
    assert len(names) == 1682 and names[0] == "Toy Story (1995)"
    real("lastfm")
    names = load_item_names("lastfm", data_dir)
    d = load_dataset("lastfm", data_dir, download=False)
    assert len(names) == d.n_items and all(isinstance(n, str) and n for n in names)
    assert load_item_names("citeulike-a", data_dir) is None
    assert load_item_names("synthetic") is None


# --- damaged copies, through the full loading path ------------------------------------


def _load_error(root, name, **kw) -> DatasetFormatError:
    with pytest.raises(DatasetFormatError) as info:
        load_dataset(name, root, download=False, **kw)
    return info.value


@pytest.mark.parametrize(
    "name, content, line, expected, found",
    [
        ("ml100k", "1\t1\t5\t0\n1\t1683\t5\t0\n", 2, "item in 1..1682", "1683"),
        ("ml100k", "1\t1\t5\t0\n944\t3\t5\t0\n", 2, "user in 1..943", "944"),
        ("ml100k", "1\t1\t5\t0\n2\t3\t6\t0\n", 2, "rating in 1..5", "6"),
        ("ml100k", "1\t1\t5\t0\n2\t3\t4\t0\n1\t1\t2\t7\n", 3, "each (user, item) pair once",
         "first on line 1"),
        ("ml100k", "1\t1\t5\t0\n2\t3\t4\n", 2, "4 tab-separated", "3 fields"),
        ("lastfm", "2\t51\t13883\n", 1, "the header", "2\\t51"),
        ("lastfm", "userID\tartistID\tweight\n2\t51\t3\n0\t52\t3\n", 3, "userID in 1..2100",
         "0"),
        ("lastfm", "userID\tartistID\tweight\r\n2\t51\t3\r\n2\tx51\t3\r\n", 3,
         "a non-negative integer for artistID", "'x51'"),
        ("citeulike-a", "2 0 16980\n", 1, "item ids in 0..16979", "16980"),
        ("citeulike-a", "1 0\n3 5 7 5\n", 2, "distinct item ids on a line", "item 5"),
        ("citeulike-a", "1 0\n3 5 7\n", 2, "3 item ids after the count 3", "2"),
        ("citeulike-t", "1 0\n2 1 2\n", 3, "7,947 lines", "truncated"),
    ],
)
def test_damaged_file_names_file_and_line(tmp_path, make_dataset, name, content, line,
                                          expected, found):
    path = make_dataset(tmp_path, name, content)
    err = _load_error(tmp_path, name)
    assert err.path == str(path)
    assert err.line == line, str(err)
    assert expected in err.expected, str(err)
    assert found in err.found, str(err)


def test_truncated_real_file(tmp_path, real, make_dataset):
    raw = (real("ml100k") / "u.data").read_bytes()
    lines = raw.split(b"\n")
    path = make_dataset(tmp_path, "ml100k", b"\n".join(lines[:99_990]) + b"\n")
    err = _load_error(tmp_path, "ml100k")
    assert err.path == str(path) and err.line == 99_991
    assert "100,000 data lines" in err.expected and "truncated" in err.found


def test_real_file_cut_mid_line(tmp_path, real, make_dataset):
    raw = (real("citeulike-a") / "users.dat").read_bytes()
    make_dataset(tmp_path, "citeulike-a", raw[: len(raw) - 7])
    err = _load_error(tmp_path, "citeulike-a")
    assert err.line == 5551 and "item ids after the count" in err.expected


def test_damage_that_parses_is_caught_by_sha256(tmp_path, real, make_dataset):
    """A lost digit in the last line keeps the format and the counts; only the sha256 tells."""
    raw = (real("ml100k") / "u.data").read_bytes()
    assert raw.endswith(b"\n")
    damaged = raw[:-2] + b"\n"  # the last timestamp loses its last digit
    path = make_dataset(tmp_path, "ml100k", damaged)
    err = _load_error(tmp_path, "ml100k")
    assert err.path == str(path) and err.line is None
    assert "06416e597f82b7342361e41163890c81036900f418ad91315590814211dca490" in err.expected
    assert "differs from the published" in err.found
    # the fetch that replaces it where it lies (fetch replaces a damaged copy: no --force)
    assert f"`rfrs-ref data fetch ml100k --data-dir {path.parent.parent}`" in err.found
    assert "--force" not in err.found
    d = load_dataset("ml100k", tmp_path, download=False, verify=False)
    assert d.n_interactions == 100_000


def test_verify_false_accepts_a_modified_copy(tmp_path, make_dataset):
    make_dataset(tmp_path, "citeulike-a", "2 3 1\n1 0\n")
    d = load_dataset("citeulike-a", tmp_path, download=False, verify=False)
    assert (d.n_users, d.n_items) == (2, 16980)
    assert d.items_of(0).tolist() == [1, 3]


def test_count_mismatch_is_reported(tmp_path, real, make_dataset):
    """Dropping one user's lines keeps every line valid but changes the user count."""
    raw = (real("ml100k") / "u.data").read_bytes()
    rows = [r for r in raw.split(b"\n") if r and not r.startswith(b"943\t")]
    # pad back to 100,000 lines with pairs of another user that are new
    taken = {tuple(r.split(b"\t")[:2]) for r in rows}
    extra = [b"1\t%d\t3\t0" % i for i in range(1, 1683) if (b"1", b"%d" % i) not in taken]
    rows += extra[: 100_000 - len(rows)]
    path = make_dataset(tmp_path, "ml100k", b"\n".join(rows) + b"\n")
    err = _load_error(tmp_path, "ml100k")
    assert err.path == str(path) and "943 users" in err.expected and err.found == "942"


def test_docs_table_is_the_manifest():
    """docs/datasets.md's table states the manifest's counts."""
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "datasets.md"
    rows = {}
    for line in doc.read_text("utf-8").splitlines():
        cells = [c.strip(" `") for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] in TABLE:
            rows[cells[0]] = tuple(int(c.replace(",", "")) for c in cells[2:5])
    assert rows == TABLE


def test_official_latin1_item_names(tmp_path, make_dataset, real):
    """The official u.item is ISO-8859-1; names decode from it as from the ASCII copy."""
    folder = real("ml100k")
    make_dataset(tmp_path, "ml100k", (folder / "u.data").read_bytes())
    lines = [f"{i}|Movie {i}|01-01-1995||x|0" for i in range(1, 1683)]
    lines[0] = "1|Misérables, Les (1995)|01-01-1995||x|0"
    make_dataset(tmp_path, "ml100k", ("\n".join(lines) + "\n").encode("latin-1"), file="u.item")
    with pytest.raises(DatasetFormatError, match="u.item"):
        load_item_names("ml100k", tmp_path)  # not a pinned u.item
    names = load_item_names("ml100k", tmp_path, verify=False)
    assert names[0] == "Misérables, Les (1995)" and names[1681] == "Movie 1682"
