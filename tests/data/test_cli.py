"""``rfrs-ref data``: list, fetch, info, through click's CliRunner."""

from __future__ import annotations

import errno
import hashlib
import json
import os

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main
from rfrs_ref.data import manifest


@pytest.fixture
def run(monkeypatch):
    def invoke(*args, env=None):
        runner = CliRunner()
        return runner.invoke(main, ["data", *args], env=env, catch_exceptions=False)
    return invoke


def test_list(run, data_dir, monkeypatch):
    monkeypatch.setenv("RFRS_DATA_DIR", str(data_dir))
    r = run("list")
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line for line in r.output.splitlines()[1:]}
    assert list(rows) == ["lastfm", "ml100k", "citeulike-a", "citeulike-t", "synthetic"]
    assert "1,892" in rows["lastfm"] and "17,632" in rows["lastfm"] and "92,834" in rows["lastfm"]
    assert "7,947" in rows["citeulike-t"] and "134,860" in rows["citeulike-t"]
    assert "generated" in rows["synthetic"] and "600" in rows["synthetic"]
    if (data_dir / "ml-100k" / "u.data").is_file():
        assert str(data_dir / "ml-100k") in rows["ml100k"]


def test_list_not_present(run, monkeypatch, tmp_path):
    monkeypatch.delenv("RFRS_DATA_DIR", raising=False)
    r = run("list", "--data-dir", str(tmp_path))
    assert r.exit_code == 0
    assert r.output.count("not present") == 4


def test_info_real(run, real, data_dir):
    real("ml100k")
    r = run("info", "ml100k", "--data-dir", str(data_dir))
    assert r.exit_code == 0, r.output
    for part in ("943", "1,682", "100,000", "6.3047%", "median 65", "min 20", "max 737"):
        assert part in r.output, part


def test_info_synthetic_json(run):
    r = run("info", "synthetic", "--synthetic-users", "50", "--synthetic-items", "80", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["n_users"] == 50 and d["n_items"] == 80 and d["per_user_quantiles"]["0"] >= 2


def test_info_errors(run, monkeypatch, tmp_path):
    monkeypatch.delenv("RFRS_DATA_DIR", raising=False)
    r = run("info", "citeulike-a", "--data-dir", str(tmp_path))
    assert r.exit_code == 1 and "was not found" in r.output and "data fetch citeulike-a" in r.output
    r = run("info", "ml100k", "--synthetic-users", "3")
    assert r.exit_code == 2 and "synthetic" in r.output
    r = run("info", "nope")
    assert r.exit_code == 2 and "choose one of" in r.output


def test_info_damaged_file(run, tmp_path, make_dataset):
    path = make_dataset(tmp_path, "citeulike-a", "1 0\n3 5 7\n")
    r = run("info", "citeulike-a", "--data-dir", str(tmp_path))
    assert r.exit_code == 1 and f"{path}:2: expected 3 item ids" in r.output


def test_fetch(run, real, local_mirror, tmp_path, monkeypatch):
    real("citeulike-t")
    monkeypatch.delenv("RFRS_DATA_DIR", raising=False)
    cache = tmp_path / "cache"
    r = run("fetch", "citeulike-t", "--cache-dir", str(cache), "--mirror", local_mirror.base_url)
    assert r.exit_code == 0, r.output
    assert f"verified users.dat (sha256) into {cache / 'citeulike-t'}" in r.output
    assert (cache / "citeulike-t" / "users.dat").is_file()
    r = run("fetch", "citeulike-t", "--cache-dir", str(cache), "--mirror", local_mirror.base_url)
    assert r.exit_code == 0 and "already present and verified" in r.output
    assert local_mirror.served == ["citeulike-t/users.dat"]


def test_fetch_bad_checksum(run, real, serve_mirror, tmp_path, monkeypatch):
    folder = real("citeulike-a")
    monkeypatch.delenv("RFRS_DATA_DIR", raising=False)
    bad = b"0 " + (folder / "users.dat").read_bytes()
    with serve_mirror({("citeulike-a", "users.dat"): bad}) as mirror:
        r = run("fetch", "citeulike-a", "--data-dir", str(tmp_path / "d"), "--mirror",
                mirror.base_url)
    assert r.exit_code == 1
    assert hashlib.sha256(bad).hexdigest() in r.output and "expected" in r.output
    assert not (tmp_path / "d").exists()


def _closed_port_url() -> str:
    """A port nothing listens on: the connection is refused, as without network."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def test_fetch_without_network_says_what_to_do(run, tmp_path, monkeypatch):
    monkeypatch.delenv("RFRS_DATA_DIR", raising=False)
    r = run("fetch", "ml100k", "--cache-dir", str(tmp_path / "cache"), "--mirror",
            _closed_port_url())
    assert r.exit_code == 1
    line = " ".join(r.output.split())
    assert "failed after 0 bytes" in line
    assert "copy its ml-100k/ folder" in line and "RFRS_DATA_DIR" in line, line
    assert not (tmp_path / "cache" / "ml-100k").exists()


def test_fetch_generated_and_unknown(run):
    r = run("fetch", "synthetic")
    assert r.exit_code == 0 and "nothing to fetch" in r.output
    r = run("fetch", "nope")
    assert r.exit_code == 2 and "choose one of" in r.output


def _row(output: str, name: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(name + " "))


def _hint(row: str) -> list[str]:
    import shlex

    return shlex.split(row.split("(`", 1)[1].split("`", 1)[0])


@pytest.mark.parametrize("where", ["data-dir", "env", "cache", "default-cache"])
def test_list_suggests_the_fetch_that_replaces_a_damaged_copy(run, real, local_mirror, tmp_path,
                                                              monkeypatch, isolated_cache, where):
    """The hint said `fetch --force` (fetch replaces a damaged copy without it) and, for a copy
    in the cache, `--data-dir <cache>`; it is now the command that replaces the copy found,
    and that command, run as given (with the test's mirror), does."""
    real("citeulike-a")
    monkeypatch.delenv("RFRS_DATA_DIR", raising=False)
    monkeypatch.setenv("RFRS_DATA_MIRROR", local_mirror.base_url)
    root = {"data-dir": tmp_path / "given dir", "env": tmp_path / "env",
            "cache": tmp_path / "cache", "default-cache": isolated_cache / "datasets"}[where]
    folder = root / "citeulike-a"
    folder.mkdir(parents=True)
    (folder / "users.dat").write_bytes(b"1 0\n")
    args = {"data-dir": ["--data-dir", str(root)], "cache": ["--cache-dir", str(root)]}.get(
        where, [])
    if where == "env":
        monkeypatch.setenv("RFRS_DATA_DIR", str(root))
    row = _row(run("list", *args).output, "citeulike-a")
    assert row.split()[4] == "damaged:" and "--force" not in row, row
    hint = _hint(row)
    expected = {"data-dir": ["--data-dir", str(root)], "env": ["--data-dir", str(root)],
                "cache": ["--cache-dir", str(root)], "default-cache": []}[where]
    assert hint == ["rfrs-ref", "data", "fetch", "citeulike-a", *expected], row
    fetched = run(*hint[2:])
    assert fetched.exit_code == 0, fetched.output
    assert hashlib.sha256((folder / "users.dat").read_bytes()).hexdigest() == \
        manifest("citeulike-a").files[0].sha256[0]
    assert _row(run("list", *args).output, "citeulike-a").endswith(str(folder))


@pytest.mark.parametrize("error", [errno.EIO, errno.EACCES])
def test_list_shows_a_copy_whose_file_cannot_be_read_and_goes_on(run, tmp_path, monkeypatch,
                                                                 make_dataset, error):
    """An OSError while hashing a file (EIO, permission denied) escaped as a traceback."""
    import rfrs_ref.data.datasets as datasets

    monkeypatch.delenv("RFRS_DATA_DIR", raising=False)
    path = make_dataset(tmp_path, "ml100k", "1\t1\t5\t1\n")

    def failing(p, *a, **k):
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(datasets, "sha256_file", failing)
    r = run("list", "--data-dir", str(tmp_path))
    assert r.exit_code == 0, r.output
    row = _row(r.output, "ml100k")
    assert row.endswith(f"unreadable: {path}: {os.strerror(error)}"), row
    assert "Traceback" not in r.output
    assert "generated" in _row(r.output, "synthetic")  # the rows after it are listed


@pytest.mark.parametrize("option, value, message", [
    # a numpy MemoryError traceback: 10^14 users × 10 clusters of preferences
    ("--synthetic-users", "100000000000000", "generating it would need about"),
    # a TypeError traceback from the generator
    ("--synthetic-mean-items", "1e308", None),
])
def test_info_synthetic_beyond_any_machine_is_one_line(option, value, message):
    r = CliRunner().invoke(main, ["data", "info", "synthetic", option, value,
                                  "--synthetic-items", "50"])
    assert "Traceback" not in r.output and r.exception is None or \
        isinstance(r.exception, SystemExit), r.output
    if message is None:
        assert r.exit_code == 0, r.output
    else:
        assert r.exit_code == 1 and message in r.output and "synthetic" in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1, r.output


def test_info_synthetic_beyond_this_machines_memory_is_refused_before_it_starts(monkeypatch):
    # --synthetic-users 100000000 (about 75 GB to generate) had the process killed by the
    # system for memory, without a word; the machine is made 1 MB here, so that a dataset of
    # 10,000 users is such a one, and 1 TB, so that it is generated
    from rfrs_ref.cli import train as train_cli

    monkeypatch.setattr(train_cli, "machine_memory", lambda: 1 << 20)
    r = CliRunner().invoke(main, ["data", "info", "synthetic", "--synthetic-users", "10000"])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    line = " ".join(r.output.split())
    assert "synthetic (n_users = 10000): generating it would need about" in line, line
    assert "more than this machine's memory (1.05e+06 bytes" in line, line
    monkeypatch.setattr(train_cli, "machine_memory", lambda: 1 << 40)
    r = CliRunner().invoke(main, ["data", "info", "synthetic", "--synthetic-users", "10000"])
    assert r.exit_code == 0, r.output


def test_generation_bytes_bounds_the_generators_peak():
    # the bound the refusal rests on: above the generator's peak (NumPy's allocations, as
    # tracemalloc counts them), and not far above
    import tracemalloc

    from rfrs_ref.data.synthetic import generation_bytes, synthetic

    for params in ({"n_users": 100000}, {"n_users": 20000, "n_items": 5000, "mean_items": 200}):
        tracemalloc.start()
        try:
            synthetic(**params)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        bound = generation_bytes(**params)
        assert peak <= bound <= 4 * peak + (64 << 20), (params, peak, bound)


def test_fetch_into_a_folder_the_system_refuses_is_one_line(monkeypatch):
    # a --data-dir longer than a path may be (ENAMETOOLONG) ended in an OSError traceback
    monkeypatch.setenv("RFRS_DATA_MIRROR", "http://127.0.0.1:9")
    too_long = "/" + "a" * 5000
    r = CliRunner().invoke(main, ["data", "fetch", "ml100k", "--data-dir", too_long])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "File name too long" in r.output and len(r.output.strip().splitlines()) == 1
