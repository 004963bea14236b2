"""Hostile input to the file readers and writers the checking tools share (rfrs_ref.untrusted,
rfrs_ref.files): JSON that two readers would read differently, and a link planted where
a result is about to be written."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

from rfrs_ref.files import atomic_write
from rfrs_ref.untrusted import UntrustedFileError, parse_json, read_json, read_npy


@pytest.mark.parametrize("text, key", [
    ('{"a": 1, "a": 2}', "a"),
    ('{"x": {"tol": 1e-9, "tol": 1e300}}', "tol"),
    ('[{"k": 1}, {"k": 2, "k": 3}]', "k"),
    ('{"\\u0061": 1, "a": 2}', "a"),  # the same key, escaped
])
def test_a_duplicate_key_is_refused_naming_it(text, key):
    """Python keeps the last value, other readers the first: the file means two things."""
    with pytest.raises(UntrustedFileError, match=f"f.json: duplicate key '{key}'"):
        parse_json(text, "f.json")


def test_equal_keys_in_different_objects_are_fine():
    assert parse_json('[{"k": 1}, {"k": 2}, {"a": {"k": 3}, "k": 4}]', "f") == [
        {"k": 1}, {"k": 2}, {"a": {"k": 3}, "k": 4}]


@pytest.mark.parametrize("text", ['{"\\ud800": 1}', '["ok", "x\\udc00y"]', '{"k": "\\ude00\\ud83d"}'])
def test_a_lone_surrogate_is_refused_naming_file_and_line(text):
    """A JSON escape of half a UTF-16 pair ("\\ud800") parses into a string that is no
    text: printing a note or a divergence naming it ended `trace compare` and `golden
    check` with a UnicodeEncodeError traceback."""
    with pytest.raises(UntrustedFileError, match=r"^f.json: .*lone UTF-16 surrogate.* line 2, column") as exc:
        parse_json("\n" + text, "f.json")
    assert "\n" not in str(exc.value)


def test_a_surrogate_pair_is_one_character():
    assert parse_json('["\\ud83d\\ude00", "\\\\ud800"]', "f") == ["\U0001F600", "\\ud800"]


def test_a_byte_order_mark_is_refused_in_words(tmp_path):
    p = tmp_path / "bom.json"
    p.write_bytes(b"\xef\xbb\xbf{}")
    with pytest.raises(UntrustedFileError, match="bom.json: starts with a UTF-8 byte order mark"):
        read_json(p)
    p.write_bytes(b"{\r\n}\r\n")  # CRLF line ends are JSON whitespace
    assert read_json(p) == {}



# -- .npy files that two readers would read differently ---------------------------------------

@pytest.mark.parametrize("order, byte, at, index, strict", [
    ("C", 2, 4, "(1, 1)", False), ("C", 2, 4, "(1, 1)", True), ("F", 2, 4, "(0, 2)", False),
    ("C", 255, 0, "(0, 0)", True), ("C", 0x80, 5, "(1, 2)", False)])
def test_a_bool_array_holding_a_byte_other_than_0_or_1_is_refused(tmp_path, order, byte, at, index,
                                                                   strict):
    """NumPy read byte 2 of a bool array as True; a reader comparing bytes, or a C bool, may
    not: the file meant two things. The index is the element's, in the file's order (strict
    reads C order only)."""
    a = np.array([[True, False, True], [False, True, False]], order=order)
    p = tmp_path / "flags.npy"
    np.save(p, a)
    raw = bytearray(p.read_bytes())
    offset = len(raw) - a.size
    raw[offset + at] = byte
    p.write_bytes(bytes(raw))
    assert np.load(p).sum() == a.sum() + (not a.ravel(order="K")[at])  # NumPy reads it True
    with pytest.raises(UntrustedFileError) as exc:
        read_npy(p, "case.json", strict=strict)
    msg = str(exc.value)
    assert msg.startswith(f"{p} (named in case.json): bool array holds byte {byte} at index {index}, "
                          "a bool is 0 or 1"), msg
    raw[offset + at] = 1
    p.write_bytes(bytes(raw))
    read_npy(p, strict=strict)


def test_a_bool_scalar_holding_another_byte_is_refused(tmp_path):
    p = tmp_path / "flag.npy"
    np.save(p, np.True_)
    p.write_bytes(p.read_bytes()[:-1] + b"\x02")
    with pytest.raises(UntrustedFileError, match=r"flag\.npy: bool array holds byte 2 at index \(\)"):
        read_npy(p)


def _npy_with_header(header: str, data: bytes, version=(1, 0)) -> bytes:
    size = 2 if version == (1, 0) else 4
    pad = -(6 + 2 + size + len(header) + 1) % 64
    text = (header + " " * pad + "\n").encode("latin1")
    return (b"\x93NUMPY" + bytes(version) + len(text).to_bytes(size, "little") + text + data)


@pytest.mark.parametrize("header, key", [
    ("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), 'shape': (4,), }", "shape"),
    ("{'shape': (4,), 'descr': '<f8', 'fortran_order': False, \"shape\": (4,)}", "shape"),
    ("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 2), 'fortran_order': False}",
     "fortran_order"),
    ("{'descr': '<i8', 'fortran_order': False, 'shape': (4,), u'descr': '<f8'}", "descr"),
])
@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_an_npy_header_that_repeats_a_key_is_refused_naming_it(tmp_path, header, key, version):
    """NumPy evaluates the header as a Python dict, whose last value of a key wins; a reader
    of the text may take the first (another shape, order or dtype)."""
    p = tmp_path / "a.npy"
    p.write_bytes(_npy_with_header(header, np.zeros(4).tobytes(), version))
    assert np.load(p).size == 4  # NumPy reads it, last value winning
    with pytest.raises(UntrustedFileError) as exc:
        read_npy(p, "case.json")
    assert str(exc.value).startswith(f"{p} (named in case.json): the .npy header repeats key "
                                     f"{key!r}"), str(exc.value)


def test_an_npy_header_written_by_numpy_reads_in_every_version(tmp_path):
    p = tmp_path / "a.npy"
    for version in ((1, 0), (2, 0), (3, 0)):
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.arange(3.0), version=version)
        p.write_bytes(buf.getvalue())
        assert np.array_equal(read_npy(p), np.arange(3.0))
    p.write_bytes(_npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (3L,), }",
                                   np.arange(3.0).tobytes()))
    with pytest.warns(UserWarning, match="Python 2"):  # a Python 2 long, which NumPy still reads
        assert np.array_equal(read_npy(p), np.arange(3.0))


def test_atomic_write_does_not_write_through_a_planted_link(tmp_path, monkeypatch):
    """A temporary name that carried only the pid could be guessed: a link planted there used
    to be followed, and the target (here: a file outside) overwritten. The name is now drawn
    at random; one planted at the name drawn anyway is left as it is, not written through."""
    import rfrs_ref.files as files

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    path = out / "verdict.md"
    planted = out / f".verdict.md.{os.getpid()}.tmp"
    planted.symlink_to(victim)
    atomic_write(path, lambda fh: fh.write(b"table"))
    assert victim.read_text() == "precious"
    assert path.read_bytes() == b"table" and not path.is_symlink()
    names = iter([planted, out / ".verdict.md.drawn.tmp"])
    monkeypatch.setattr(files, "temporary_name", lambda p: next(names))
    atomic_write(path, lambda fh: fh.write(b"table 2"))
    assert victim.read_text() == "precious"
    assert path.read_bytes() == b"table 2" and not path.is_symlink()
    assert sorted(p.name for p in out.iterdir()) == [planted.name, "verdict.md"]
