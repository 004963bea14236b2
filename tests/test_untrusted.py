"""Reading files someone else wrote: JSON, .npy arrays and the paths they name."""

from __future__ import annotations

import io
import json
import os
import pathlib
import re
import threading

import numpy as np
import pytest

from rfrs_ref.untrusted import UntrustedFileError, confined, depth_exceeds, parse_json, read_json, read_npy


@pytest.mark.parametrize("text, fragment", [
    (b"\xff\xfe", "not UTF-8"),
    (b"{", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b"9" * 5000, "unreadable JSON number"),
])
def test_parse_json_failures_are_one_line(text, fragment):
    with pytest.raises(UntrustedFileError, match=fragment) as exc:
        parse_json(text, "f.json")
    assert str(exc.value).startswith("f.json: ") and "\n" not in str(exc.value)


def test_parse_json_reads_nonfinite_literals():
    v = parse_json("[NaN, Infinity, -Infinity, 1e999]", "x")
    assert np.isnan(v[0]) and v[1:] == [np.inf, -np.inf, np.inf]


def test_read_json_missing_or_a_directory(tmp_path):
    with pytest.raises(UntrustedFileError, match="no such index"):
        read_json(tmp_path / "nope.json", "index")
    with pytest.raises(UntrustedFileError, match="is a directory"):
        read_json(tmp_path, "index")
    (tmp_path / "ok.json").write_text(json.dumps({"a": [1]}))
    assert read_json(tmp_path / "ok.json") == {"a": [1]}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_read_json_tests_the_file_it_opened_not_the_name(tmp_path, monkeypatch):
    """A FIFO put at the name after a test of the name (here: a test that the name does
    not exist, as it did not a moment before) is refused, not read: the file opened is
    the one tested. A writer feeds the FIFO, so a read of it returns a JSON value instead
    of waiting for ever."""
    fifo = tmp_path / "index.json"
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "wb") as w:  # waits for a reader
            w.write(b'{"forged": 1}')

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    monkeypatch.setattr(pathlib.Path, "exists", lambda self: False)
    monkeypatch.setattr(pathlib.Path, "is_file", lambda self: True)
    try:
        with pytest.raises(UntrustedFileError, match="not a regular file"):
            read_json(fifo, "index")
    finally:
        monkeypatch.undo()
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets a waiting writer finish
        writer.join(5)
        os.close(fd)


def test_depth_exceeds():
    nest: list = []
    for _ in range(40):
        nest = [nest]
    assert depth_exceeds({"a": nest}, 32) and not depth_exceeds({"a": [[1]]}, 3)
    assert not depth_exceeds(5, 0)


def test_confined(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.npy").write_bytes(b"")
    assert confined(tmp_path, "sub/a.npy", "src") == (tmp_path / "sub" / "a.npy").resolve()
    outside = tmp_path.parent / (tmp_path.name + "-outside")
    outside.mkdir(exist_ok=True)
    (tmp_path / "link").symlink_to(outside, target_is_directory=True)
    for bad, fragment in [("../x", "climbs out"), ("sub/../../x", "climbs out"), ("/etc/passwd", "absolute"),
                          ("C:\\x", "absolute"), ("\\\\host\\x", "absolute"), ("link/x", "symbolic link"),
                          ("", "not a relative file path"), (["a"], "not a relative file path"),
                          ("a\x00b", "NUL")]:
        with pytest.raises(UntrustedFileError, match=fragment):
            confined(tmp_path, bad, "src.json")



def test_confined_refuses_a_link_loop_in_one_line(tmp_path):
    """A link to itself made pathlib raise RuntimeError ("Symlink loop"): a traceback."""
    (tmp_path / "loop").symlink_to("loop")
    for rel in ("loop", "loop/case.json"):
        with pytest.raises(UntrustedFileError, match="src.json: path .* cannot be resolved: a symbolic link loop"):
            confined(tmp_path, rel, "src.json")

@pytest.mark.parametrize("a", [np.arange(6.0).reshape(2, 3), np.asfortranarray(np.arange(6.0).reshape(2, 3)),
                               np.arange(4, dtype=">i8"), np.array([True, False]), np.zeros((0, 3), np.float32),
                               np.float64(2.5)])
def test_read_npy_round_trips_plain_arrays(tmp_path, a):
    p = tmp_path / "a.npy"
    np.save(p, a)
    b = read_npy(p)
    assert b.shape == np.shape(a) and b.dtype.name == np.asarray(a).dtype.name
    assert np.array_equal(b, a)


def test_read_npy_refuses_objects_and_lying_headers(tmp_path):
    p = tmp_path / "a.npy"
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.array([None, 1], dtype=object), allow_pickle=True)
    p.write_bytes(buf.getvalue())
    with pytest.raises(UntrustedFileError, match="dtype object"):
        read_npy(p, "case.json")
    np.save(p, np.zeros(10))
    p.write_bytes(p.read_bytes() + b"extra")
    with pytest.raises(UntrustedFileError, match="needs 80 bytes of data, the file holds 85"):
        read_npy(p)


@pytest.mark.parametrize("shape", [(-1, -4), (-2, -2), (-4,), (2, -2, -1)])
def test_read_npy_refuses_a_negative_dimension_naming_the_file(tmp_path, shape):
    """(-2, -2) needs 4 values, which the file held: NumPy's reshape then raised 'can only
    specify one unknown dimension', naming no file."""
    p = tmp_path / "neg.npy"
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": shape})
    count = abs(int(np.prod(shape)))
    p.write_bytes(buf.getvalue() + np.zeros(count).tobytes())
    with pytest.raises(UntrustedFileError, match=r"neg\.npy \(named in case\.json\): the header's shape .* "
                                                 "has a negative dimension"):
        read_npy(p, "case.json")


@pytest.mark.parametrize("layout, fragment", [
    ("fortran", "Fortran (column-major) order"), ("big-endian", "big-endian ('>f8')"),
    ("version 2.0", "format version 2.0"), ("version 3.0", "format version 3.0")])
def test_read_npy_strict_refuses_every_layout_but_the_plain_one(tmp_path, layout, fragment):
    """``strict`` (the golden vectors' layout): version 1.0, C order, little-endian; the
    default reads what NumPy writes, in any of them."""
    a = np.arange(6.0).reshape(2, 3)
    p = tmp_path / "a.npy"
    buf = io.BytesIO()
    if layout == "fortran":
        np.lib.format.write_array(buf, np.asfortranarray(a), version=(1, 0))
    elif layout == "big-endian":
        np.lib.format.write_array(buf, a.astype(">f8"), version=(1, 0))
    else:
        np.lib.format.write_array(buf, a, version=(int(layout[-3]), 0))
    p.write_bytes(buf.getvalue())
    assert np.array_equal(read_npy(p), a)
    with pytest.raises(UntrustedFileError, match=r"a\.npy \(named in case\.json\): not in the plain \.npy "
                                                 r"layout .*" + re.escape(fragment)):
        read_npy(p, "case.json", strict=True)
    np.save(p, a)
    assert np.array_equal(read_npy(p, strict=True), a)
    np.save(p, np.array([True, False]))
    assert read_npy(p, strict=True).dtype == np.bool_  # '|b1': no byte order to state
