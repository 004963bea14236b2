"""The strict readers: good files parse, every malformation names its file and line."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rfrs_ref.data import DatasetFormatError
from rfrs_ref.data.formats import read_count_lists, read_names, read_table

UDATA = ("user", "item", "rating", "timestamp")
LASTFM = ("userID", "artistID", "weight")
HEADER = "userID\tartistID\tweight"


def _write(tmp_path, text: str | bytes, name: str = "f.dat"):
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


def _error(fn, *args, **kwargs) -> DatasetFormatError:
    with pytest.raises(DatasetFormatError) as info:
        fn(*args, **kwargs)
    return info.value


# --- tables ---------------------------------------------------------------------------


def test_table_parses_values(tmp_path):
    p = _write(tmp_path, "196\t242\t3\t881250949\n1\t2\t5\t0\n")
    t = read_table(p, UDATA)
    np.testing.assert_array_equal(t.values, [[196, 242, 3, 881250949], [1, 2, 5, 0]])
    assert t.values.dtype == np.int64 and t.first_line == 1


def test_table_accepts_crlf_and_missing_final_newline(tmp_path):
    p = _write(tmp_path, HEADER + "\r\n2\t51\t13883\r\n2\t52\t11690")
    t = read_table(p, LASTFM, header=HEADER)
    np.testing.assert_array_equal(t.values, [[2, 51, 13883], [2, 52, 11690]])
    assert t.line_of(0) == 2


@pytest.mark.parametrize(
    "body, line, expected, found",
    [
        ("1\t2\t3\t4\n5\t6\t7\n", 2, "4 tab-separated integer fields", "3 fields"),
        ("1\t2\t3\t4\t\n", 1, "4 tab-separated integer fields", "5 fields"),
        ("1\t2\t3\t4\n1\t2.5\t3\t4\n", 2, "a non-negative integer for item", "'2.5'"),
        ("1\t2\t3\t4\n-1\t2\t3\t4\n", 2, "a non-negative integer for user", "'-1'"),
        ("1\tx\t3\t4\n", 1, "a non-negative integer for item", "'x'"),
        ("1\t2\t3\t4\n1\t\t3\t4\n", 2, "a non-negative integer for item", "''"),
        ("1\t2\t3\t4\n\n1\t2\t3\t4\n", 2, "4 tab-separated integer fields", "an empty line"),
        ("1 2 3 4\n", 1, "4 tab-separated integer fields", "1 field"),
        ("1\t2\t3\t4\n1\t2\t3\t1234567890123456789\n", 2, "fit in 64 bits", "1234567890123456789"),
        ("1\t2\t3\t4\n1\t2\r\t3\t4\n", 2, "lines ending in", "carriage return"),
    ],
)
def test_table_malformed_line(tmp_path, body, line, expected, found):
    p = _write(tmp_path, body)
    err = _error(read_table, p, UDATA)
    assert err.path == str(p) and err.line == line
    assert expected in err.expected and found in err.found
    assert str(err).startswith(f"{p}:{line}: expected ")


def test_table_missing_header(tmp_path):
    p = _write(tmp_path, "2\t51\t13883\n")
    err = _error(read_table, p, LASTFM, header=HEADER)
    assert err.line == 1 and "header" in err.expected and "2\\t51\\t13883" in err.found


def test_table_empty_file_with_header(tmp_path):
    err = _error(read_table, _write(tmp_path, b""), LASTFM, header=HEADER)
    assert err.line == 1 and err.found == "an empty file"


def test_table_truncated_file(tmp_path):
    p = _write(tmp_path, "1\t2\t3\t4\n" * 3)
    err = _error(read_table, p, UDATA, n_rows=5)
    assert err.line == 4 and "5 data lines" in err.expected and "truncated" in err.found


def test_table_extra_lines(tmp_path):
    p = _write(tmp_path, HEADER + "\n" + "1\t2\t3\n" * 4)
    err = _error(read_table, p, LASTFM, header=HEADER, n_rows=2)
    assert err.line == 4 and "end of the file after 2" in err.expected and "2 more" in err.found


_CORRUPTIONS = {
    "drop_field": lambda f: "\t".join(f[:-1]),
    "extra_field": lambda f: "\t".join(f + ["7"]),
    "letter": lambda f: "\t".join([f[0] + "a"] + f[1:]),
    "decimal": lambda f: "\t".join(f[:1] + [f[1] + ".0"] + f[2:]),
    "empty": lambda f: "",
    "space": lambda f: " ".join(f),
}


@given(
    rows=st.lists(st.tuples(*[st.integers(0, 10**12)] * 4), min_size=1, max_size=30),
    crlf=st.booleans(),
    final_newline=st.booleans(),
    data=st.data(),
)
def test_table_round_trip_and_corruption_line(tmp_path_factory, rows, crlf, final_newline, data):
    """Any integer table round-trips; one corrupted line is reported with its number."""
    tmp = tmp_path_factory.mktemp("rt")
    nl = "\r\n" if crlf else "\n"
    lines = ["\t".join(map(str, r)) for r in rows]
    text = nl.join(lines) + (nl if final_newline else "")
    t = read_table(_write(tmp, text), UDATA, n_rows=len(rows))
    np.testing.assert_array_equal(t.values, np.array(rows, dtype=np.int64).reshape(-1, 4))

    k = data.draw(st.integers(0, len(rows) - 1), label="line")
    how = data.draw(st.sampled_from(sorted(_CORRUPTIONS)), label="corruption")
    if how == "empty" and k == len(rows) - 1 and not final_newline:
        how = "letter"  # an empty last line without newline is no line at all
    bad = list(lines)
    bad[k] = _CORRUPTIONS[how]([str(v) for v in rows[k]])
    err = _error(read_table, _write(tmp, nl.join(bad) + nl), UDATA)
    assert err.line == k + 1


# --- count lists ----------------------------------------------------------------------


def test_count_lists_parse(tmp_path):
    p = _write(tmp_path, "3 5 1 9\n1 0\n2 4 7")
    c = read_count_lists(p, n_lines=3)
    np.testing.assert_array_equal(c.indptr, [0, 3, 4, 6])
    np.testing.assert_array_equal(c.ids, [5, 1, 9, 0, 4, 7])


@pytest.mark.parametrize(
    "body, line, expected, found",
    [
        ("2 1 2\n3 1 2\n", 2, "3 item ids after the count 3", "2: the line is truncated"),
        ("2 1 2\n1 1 2\n", 2, "1 item id after the count 1", "2"),
        ("2 1 2\n2 1 x\n", 2, "non-negative integer for item ids", "'x' (token 3)"),
        ("2 1 2\nq 1 2\n", 2, "non-negative integer for the count", "'q'"),
        ("2 1 2\n\n1 3\n", 2, "a count followed by", "an empty line"),
        ("2 1 2\n2 1\t2\n", 2, "a non-negative integer", "'1\\t2'"),
        ("2 1 2\n2 1 2.5\n", 2, "a non-negative integer", "'2.5'"),
    ],
)
def test_count_lists_malformed_line(tmp_path, body, line, expected, found):
    p = _write(tmp_path, body)
    err = _error(read_count_lists, p)
    assert err.path == str(p) and err.line == line
    assert expected in err.expected and found in err.found


def test_count_lists_truncated_file(tmp_path):
    err = _error(read_count_lists, _write(tmp_path, "1 1\n1 2\n"), n_lines=4)
    assert err.line == 3 and "4 lines" in err.expected and "truncated" in err.found


def test_count_lists_cut_mid_line(tmp_path):
    """A file cut inside its last line: that line's count no longer matches."""
    text = "3 10 20 30\n4 11 12 13 14\n"
    err = _error(read_count_lists, _write(tmp_path, text[:-5]), n_lines=2)
    assert err.line == 2 and "4 item ids" in err.expected


# --- names ----------------------------------------------------------------------------


def test_names(tmp_path):
    p = _write(tmp_path, "1|Toy Story (1995)|01-01-1995\n3|Four Rooms (1995)|x\n".encode("latin-1"))
    assert read_names(p, separator="|", encoding="latin-1") == {1: "Toy Story (1995)",
                                                                3: "Four Rooms (1995)"}
    bad = _write(tmp_path, "1|A\nzz|B\n", "bad.item")
    err = _error(read_names, bad, separator="|", encoding="latin-1")
    assert err.line == 2
    hdr = _write(tmp_path, "1\tA\n", "a.dat")
    err = _error(read_names, hdr, separator="\t", encoding="utf-8", header="id\tname")
    assert err.line == 1 and "header" in err.expected
