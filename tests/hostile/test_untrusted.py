"""Hostile input to the file readers and writers the checking tools share (rfrs_ref.untrusted,
rfrs_ref.files): JSON that two readers would read differently, and a link planted where
a result is about to be written."""

from __future__ import annotations

import os

import pytest

from rfrs_ref.files import atomic_write
from rfrs_ref.untrusted import UntrustedFileError, parse_json, read_json


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
