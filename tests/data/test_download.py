"""Downloads for real, from a mirror served on 127.0.0.1, into an isolated cache."""

from __future__ import annotations

import hashlib
import warnings

import pytest

from rfrs_ref.data import (
    DatasetNotFoundError,
    DownloadError,
    default_cache_dir,
    fetch,
    load_dataset,
    locate,
    manifest,
)


@pytest.fixture(autouse=True)
def _no_real_data_dir(monkeypatch):
    """Hide RFRS_DATA_DIR from lookup (the fixture ``data_dir``, scoped to the whole run and
    used to build the mirror, has read it before any per-test fixture runs)."""
    monkeypatch.delenv("RFRS_DATA_DIR", raising=False)


@pytest.mark.parametrize("name", ["ml100k", "lastfm", "citeulike-a", "citeulike-t"])
def test_good_download(name, real, local_mirror, isolated_cache, list_files):
    real(name)
    m = manifest(name)
    assert locate(name) is None
    progress = []
    d = load_dataset(name, base_url=local_mirror.base_url,
                     progress=lambda label, done, total: progress.append((label, done, total)))
    assert (d.n_users, d.n_items, d.n_interactions) == (m.n_users, m.n_items, m.n_interactions)
    folder = default_cache_dir() / m.folder
    assert folder.parent == isolated_cache / "datasets"
    assert locate(name) == folder
    assert local_mirror.served == [m.source.mirror_path]
    # exactly the manifest's files, verified, and no temporary left over
    assert list_files(folder) == sorted(f.name for f in m.files)
    for f in m.files:
        assert hashlib.sha256((folder / f.name).read_bytes()).hexdigest() in f.sha256
    label, done, total = progress[-1]
    assert done == total == (local_mirror.root / m.source.mirror_path).stat().st_size
    # a second load uses the cache and downloads nothing
    load_dataset(name, base_url=local_mirror.base_url)
    assert local_mirror.served == [m.source.mirror_path]


def test_mirror_from_environment(real, local_mirror, monkeypatch):
    real("citeulike-t")
    monkeypatch.setenv("RFRS_DATA_MIRROR", local_mirror.base_url)
    d = load_dataset("citeulike-t")
    assert d.n_interactions == 134860 and local_mirror.served == ["citeulike-t/users.dat"]


def test_fetch_into_data_dir_and_skip_when_verified(real, local_mirror, tmp_path):
    real("citeulike-a")
    dest = tmp_path / "dest"
    r = fetch("citeulike-a", dest, base_url=local_mirror.base_url)
    assert r.folder == dest / "citeulike-a" and r.installed == ("users.dat",)
    again = fetch("citeulike-a", dest, base_url=local_mirror.base_url)
    assert again.url is None and local_mirror.served == ["citeulike-a/users.dat"]
    forced = fetch("citeulike-a", dest, base_url=local_mirror.base_url, force=True)
    assert forced.url is not None and len(local_mirror.served) == 2


def test_fetch_replaces_a_damaged_copy(real, local_mirror, tmp_path):
    real("citeulike-a")
    folder = tmp_path / "citeulike-a"
    folder.mkdir()
    (folder / "users.dat").write_bytes(b"1 0\n")
    r = fetch("citeulike-a", tmp_path, base_url=local_mirror.base_url)
    assert r.url is not None
    assert hashlib.sha256((folder / "users.dat").read_bytes()).hexdigest() == \
        manifest("citeulike-a").files[0].sha256[0]


def test_corrupted_zip_member(real, serve_mirror, isolated_cache, list_files):
    folder = real("ml100k")
    good = (folder / "u.data").read_bytes()
    bad = good.replace(b"196\t242\t3", b"196\t242\t4", 1)
    actual = hashlib.sha256(bad).hexdigest()
    with serve_mirror({("ml100k", "u.data"): bad}) as mirror:
        with pytest.raises(DownloadError) as info:
            load_dataset("ml100k", base_url=mirror.base_url)
    err = info.value
    expected = manifest("ml100k").file("interactions").sha256[0]
    assert err.expected == expected and err.actual == actual
    assert err.url == f"{mirror.base_url}/ml-100k.zip" and err.file == "ml-100k/u.data"
    for part in (err.url, "ml-100k/u.data", expected, actual):
        assert part in str(err)
    assert list_files(isolated_cache) == []
    assert not (isolated_cache / "datasets" / "ml-100k").exists()


def test_corrupted_single_file(real, serve_mirror, isolated_cache, list_files):
    folder = real("citeulike-a")
    bad = (folder / "users.dat").read_bytes()[:-1] + b"9"
    with serve_mirror({("citeulike-a", "users.dat"): bad}) as mirror:
        with pytest.raises(DownloadError) as info:
            fetch("citeulike-a", base_url=mirror.base_url)
    assert info.value.actual == hashlib.sha256(bad).hexdigest()
    assert "citeulike-a/users.dat" in str(info.value)
    assert list_files(isolated_cache) == []


def test_corrupted_optional_file_is_skipped(real, serve_mirror, isolated_cache):
    real("ml100k")
    with serve_mirror({("ml100k", "u.item"): b"1|Not the published file|\n"}) as mirror:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = fetch("ml100k", base_url=mirror.base_url)
    assert r.installed == ("u.data",) and [n for n, _ in r.skipped] == ["u.item"]
    assert any("u.item" in str(w.message) for w in caught)
    assert sorted(p.name for p in r.folder.iterdir()) == ["u.data"]
    assert load_dataset("ml100k").n_interactions == 100_000


@pytest.mark.parametrize("name", ["ml100k", "citeulike-t"])
def test_interrupted_transfer(name, real, local_mirror, isolated_cache, list_files):
    real(name)
    m = manifest(name)
    local_mirror.interrupt(m.source.mirror_path)
    with pytest.raises(DownloadError) as info:
        load_dataset(name, base_url=local_mirror.base_url, cache_dir=isolated_cache / "c")
    size = (local_mirror.root / m.source.mirror_path).stat().st_size
    assert "interrupted" in str(info.value) and f"of {size:,} bytes" in str(info.value)
    assert info.value.url == f"{local_mirror.base_url}/{m.source.mirror_path}"
    assert list_files(isolated_cache) == []
    assert not (isolated_cache / "c").exists()


def test_missing_on_mirror(real, local_mirror, tmp_path):
    real("citeulike-a")
    with pytest.raises(DownloadError) as info:
        fetch("citeulike-a", tmp_path, base_url=local_mirror.base_url + "/nowhere")
    assert "404" in str(info.value) and "/nowhere/citeulike-a/users.dat" in str(info.value)
    assert not (tmp_path / "citeulike-a").exists()


def test_not_a_zip(real, serve_mirror, tmp_path):
    real("lastfm")
    with serve_mirror() as mirror:
        (mirror.root / "hetrec2011-lastfm-2k.zip").write_bytes(b"<html>moved</html>")
        with pytest.raises(DownloadError, match="not a valid zip archive"):
            fetch("lastfm", tmp_path / "d", base_url=mirror.base_url)
    assert not (tmp_path / "d").exists()


def test_no_download_when_not_allowed(tmp_path):
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("citeulike-a", tmp_path, download=False)
    msg = str(info.value)
    assert str(tmp_path / "citeulike-a") in msg and "rfrs-ref data fetch citeulike-a" in msg


def test_fetch_synthetic_is_an_error():
    with pytest.raises(ValueError, match="generated"):
        fetch("synthetic")


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_installed_files_follow_the_umask(real, local_mirror, tmp_path, umask, mode):
    """Installed files are 0666 less the umask, as any file the user creates (not mkstemp's
    private 0600), so that a shared data directory can be read by everyone."""
    import os

    real("citeulike-a")
    old = os.umask(umask)
    try:
        r = fetch("citeulike-a", tmp_path / "shared", base_url=local_mirror.base_url)
    finally:
        os.umask(old)
    assert os.stat(r.folder / "users.dat").st_mode & 0o777 == mode


def test_checksum_error_suggests_the_fetch_that_replaces_the_copy_read(
        real, local_mirror, tmp_path, monkeypatch):
    """A modified file under RFRS_DATA_DIR: the suggested command must replace that copy
    (a fetch into the cache would leave the copy searched first, and the error, as it is)."""
    import re
    import shlex

    from click.testing import CliRunner

    from rfrs_ref.cli.main import main
    from rfrs_ref.data import DatasetFormatError

    raw = (real("ml100k") / "u.data").read_bytes()
    shared = tmp_path / "shared data"  # a space: the suggested command quotes the path
    (shared / "ml-100k").mkdir(parents=True)
    (shared / "ml-100k" / "u.data").write_bytes(raw[:-2] + b"\n")  # parses, counts agree
    monkeypatch.setenv("RFRS_DATA_DIR", str(shared))
    with pytest.raises(DatasetFormatError) as err:
        load_dataset("ml100k", download=False)
    command = re.search(r"`(rfrs-ref data fetch [^`]*)`", str(err.value)).group(1)
    assert f"--data-dir {shlex.quote(str(shared))}" in command
    args = shlex.split(command)[1:] + ["--mirror", local_mirror.base_url]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert load_dataset("ml100k", download=False).n_interactions == 100_000
