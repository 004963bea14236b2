"""Lookup order: explicit directory, then RFRS_DATA_DIR, then the cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rfrs_ref.data import (
    DatasetFormatError,
    default_cache_dir,
    load_dataset,
    locate,
    search_path,
    user_cache_dir,
)


def _place(real_folder: Path, root: Path) -> Path:
    dest = root / real_folder.name
    dest.mkdir(parents=True)
    shutil.copyfile(real_folder / "users.dat", dest / "users.dat")
    return dest


def test_cache_dir_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("RFRS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "rfrs-ref"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_dir() == tmp_path / "home" / ".cache" / "rfrs-ref"
    monkeypatch.setenv("RFRS_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c" / "datasets"


def test_order_explicit_env_cache(real, tmp_path, monkeypatch, isolated_cache):
    folder = real("citeulike-t")
    explicit, env = tmp_path / "explicit", tmp_path / "env"
    in_cache = _place(folder, default_cache_dir())
    monkeypatch.delenv("RFRS_DATA_DIR", raising=False)
    assert locate("citeulike-t") == in_cache
    in_env = _place(folder, env)
    monkeypatch.setenv("RFRS_DATA_DIR", str(env))
    assert locate("citeulike-t") == in_env
    in_explicit = _place(folder, explicit)
    assert locate("citeulike-t", explicit) == in_explicit
    assert [why for why, _ in search_path(explicit)] == ["data_dir", "RFRS_DATA_DIR", "cache"]
    assert load_dataset("citeulike-t", explicit, download=False).source == \
        str(in_explicit / "users.dat")
    # a directory without the dataset is skipped
    assert locate("citeulike-t", tmp_path / "empty") == in_env
    assert load_dataset("citeulike-t", download=False).source == str(in_env / "users.dat")
    monkeypatch.delenv("RFRS_DATA_DIR")
    assert load_dataset("citeulike-t", download=False).source == str(in_cache / "users.dat")


def test_explicit_cache_dir(real, tmp_path, monkeypatch):
    monkeypatch.delenv("RFRS_DATA_DIR", raising=False)
    placed = _place(real("citeulike-a"), tmp_path / "mycache")
    assert locate("citeulike-a") is None
    assert locate("citeulike-a", cache_dir=tmp_path / "mycache") == placed


def test_first_copy_found_is_used_even_if_damaged(real, tmp_path, monkeypatch):
    """A damaged copy earlier in the search path is an error, not a reason to move on."""
    folder = real("citeulike-a")
    _place(folder, tmp_path / "env")
    monkeypatch.setenv("RFRS_DATA_DIR", str(tmp_path / "env"))
    bad = tmp_path / "explicit" / "citeulike-a"
    bad.mkdir(parents=True)
    (bad / "users.dat").write_text("1 0\n")
    with pytest.raises(DatasetFormatError) as info:
        load_dataset("citeulike-a", tmp_path / "explicit", download=False)
    assert info.value.path == str(bad / "users.dat")


def test_locate_synthetic_and_unknown():
    assert locate("synthetic") is None
    with pytest.raises(KeyError, match="choose one of: lastfm, ml100k"):
        locate("movielens")
    with pytest.raises(KeyError, match="unknown dataset 'movielens'"):
        load_dataset("movielens")


def test_unknown_parameter():
    with pytest.raises(TypeError, match="'ml100k' does not take parameter.*n_users"):
        load_dataset("ml100k", n_users=3)
    with pytest.raises(TypeError, match="does not take parameter.*colour.*it takes: n_users"):
        load_dataset("synthetic", colour="red")


def test_the_datasets_own_folder_given_as_data_dir_is_named(tmp_path, monkeypatch, make_dataset):
    """--data-dir data/ml-100k instead of data/: the message says to give its parent."""
    from rfrs_ref.data import DatasetNotFoundError

    monkeypatch.delenv("RFRS_DATA_DIR", raising=False)
    path = make_dataset(tmp_path / "data", "ml100k", "1\t1\t5\t0\n")
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("ml100k", path.parent, download=False, cache_dir=tmp_path / "cache")
    msg = str(info.value)
    assert f"{path.parent} is the dataset's folder itself: give the directory holding it, " \
           f"{tmp_path / 'data'}" in msg, msg
