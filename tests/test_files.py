"""Atomic writes: the old content or the new, never part, and no leftovers."""

from __future__ import annotations

import pytest

from rfrs_ref.files import atomic_write


def test_atomic_write_replaces_the_file(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")
    atomic_write(path, lambda fh: fh.write(b"new"))
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_a_failed_write_keeps_the_old_content_and_no_temporary(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")

    def half(fh):
        fh.write(b"ne")
        raise RuntimeError("killed half-way")

    with pytest.raises(RuntimeError, match="half-way"):
        atomic_write(path, half)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]
