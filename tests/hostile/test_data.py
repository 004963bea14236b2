"""Hostile dataset folders and downloads: true reasons for unreadable files, size caps on
what a server sends, temporary files never left behind, and one-line messages saying what
to do. Servers run on 127.0.0.1 only."""

from __future__ import annotations

import errno
import http.server
import io
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
import zipfile

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main
from rfrs_ref.data import (
    DatasetNotFoundError,
    DownloadError,
    fetch,
    load_dataset,
    locate,
    manifest,
    verify_folder,
)

def citeulike_cap() -> int:
    return manifest("citeulike-a").files[0].cap


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """An empty cache of its own, no mirror, no RFRS_DATA_DIR, and no proxy for 127.0.0.1."""
    monkeypatch.setenv("RFRS_CACHE_DIR", str(tmp_path / "user-cache"))
    for var in ("RFRS_DATA_MIRROR", "XDG_CACHE_HOME", "RFRS_DATA_DIR", "http_proxy",
                "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def files_under(path: pathlib.Path) -> list[str]:
    """Every file below ``path``, hidden temporary ones included."""
    if not path.exists():
        return []
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def one_line(output: str) -> str:
    assert "Traceback" not in output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    return lines[0]


# -- a hostile server ------------------------------------------------------------------------
class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's naming
        self.server.requests.append(self.path)
        route = self.server.routes.get(self.path.lstrip("/"))
        if route is None:
            self.send_error(404)
            return
        try:
            route(self)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading: what a capped download does

    def log_message(self, format, *args):
        pass


class Server:
    """Serves ``routes[path](handler)`` on 127.0.0.1 (free port) in a thread."""

    def __init__(self) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.routes = {}
        self.httpd.requests = []
        self.sent = 0
        self.release = threading.Event()
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def route(self, path: str, fn) -> None:
        self.httpd.routes[path] = fn

    def file(self, path: str, body: bytes) -> None:
        def send(h):
            h.send_response(200)
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        self.route(path, send)

    def endless(self, path: str, limit: int = 200 << 20) -> None:
        """A body of zeros with no Content-Length, ``limit`` bytes unless the client stops."""
        def send(h):
            h.send_response(200)
            h.send_header("Connection", "close")
            h.end_headers()
            chunk = b"0" * (1 << 16)
            while self.sent < limit:
                h.wfile.write(chunk)
                self.sent += len(chunk)
            h.close_connection = True
        self.route(path, send)

    def stall(self, path: str, body: bytes) -> None:
        """Half of ``body`` (with its full Content-Length), then nothing until released."""
        def send(h):
            h.send_response(200)
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body[: len(body) // 2])
            h.wfile.flush()
            self.release.wait(60)
        self.route(path, send)

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def server():
    with Server() as s:
        yield s


def zip_bytes(members: dict[str, bytes | int]) -> bytes:
    """A zip whose members are given bytes, or (an int) that many zero bytes, deflated."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            if isinstance(data, int):
                with zf.open(name, "w", force_zip64=True) as fh:
                    block = bytes(1 << 20)
                    for _ in range(data >> 20):
                        fh.write(block)
                    fh.write(bytes(data & ((1 << 20) - 1)))
            else:
                zf.writestr(name, data)
    return buf.getvalue()


def closed_port_url() -> str:
    """The URL of a port nothing listens on (connection refused, as without network)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


# -- unreadable dataset files: the true reason, naming the path -------------------------------
def _directory(path: pathlib.Path) -> None:
    path.mkdir()


def _loop(path: pathlib.Path) -> None:
    os.symlink(path.name, path)  # a link to itself


def _broken(path: pathlib.Path) -> None:
    os.symlink(path.parent / "gone.dat", path)


def _fifo(path: pathlib.Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize("make, reason", [
    (_directory, "is a directory, not a file"),
    (_loop, "is a symbolic link loop"),
    (_broken, "is a broken symbolic link (to"),
    (_fifo, "is not a regular file"),
])
def test_unreadable_dataset_file_gives_the_true_reason(tmp_path, make, reason):
    folder = tmp_path / "data" / "citeulike-a"
    folder.mkdir(parents=True)
    make(folder / "users.dat")
    with pytest.raises(DatasetNotFoundError) as info:
        locate("citeulike-a", tmp_path / "data")
    msg = str(info.value)
    assert f"{folder / 'users.dat'} {reason}" in msg and "not found" not in msg
    with pytest.raises(DatasetNotFoundError, match=reason.split(" (")[0]):
        load_dataset("citeulike-a", tmp_path / "data", download=False)
    assert any(reason.split(" (")[0].removeprefix("is ") in p
               for p in verify_folder(folder, manifest("citeulike-a")))
    res = CliRunner().invoke(main, ["data", "info", "citeulike-a", "--data-dir",
                                    str(tmp_path / "data")], catch_exceptions=False)
    assert res.exit_code != 0
    line = one_line(res.output)
    assert str(folder / "users.dat") in line and reason.split(" (")[0] in line


def test_unreadable_file_is_permission_denied(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads every file: permissions cannot be denied here")
    folder = tmp_path / "citeulike-a"
    folder.mkdir()
    (folder / "users.dat").write_text("1 0\n")
    (folder / "users.dat").chmod(0)
    with pytest.raises(DatasetNotFoundError, match="users.dat is permission denied"):
        locate("citeulike-a", tmp_path)


def test_absent_dataset_names_every_place_searched(tmp_path, monkeypatch):
    monkeypatch.setenv("RFRS_DATA_DIR", str(tmp_path / "env"))
    (tmp_path / "given" / "citeulike-a").mkdir(parents=True)
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("citeulike-a", tmp_path / "given", download=False)
    msg = str(info.value)
    assert "\n" not in msg
    for part in (f"{tmp_path / 'given' / 'citeulike-a'} (data_dir / --data-dir: no users.dat)",
                 f"{tmp_path / 'env' / 'citeulike-a'} (RFRS_DATA_DIR: not found)",
                 "(the cache: not found)", "rfrs-ref data fetch citeulike-a"):
        assert part in msg, (part, msg)


def test_data_list_shows_an_unreadable_copy(tmp_path):
    (tmp_path / "ml-100k").mkdir()
    os.symlink("u.data", tmp_path / "ml-100k" / "u.data")
    res = CliRunner().invoke(main, ["data", "list", "--data-dir", str(tmp_path)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if line.startswith("ml100k"))
    assert "unreadable" in row and "symbolic link loop" in row


def test_an_unreadable_cache_copy_suggests_a_fetch_that_gets_past_it(tmp_path):
    # a fetch into the cache looks the copy up first and would stop on the same error: the
    # hint names the cache's directory with --data-dir, which installs in place
    from rfrs_ref.data.datasets import default_cache_dir

    cache = default_cache_dir()
    (cache / "ml-100k").mkdir(parents=True)
    os.symlink("u.data", cache / "ml-100k" / "u.data")
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("ml100k", download=False)
    assert f"`rfrs-ref data fetch ml100k --data-dir {cache}` installs a fresh copy" in str(info.value)


def test_data_list_never_shows_a_damaged_copy_as_found(tmp_path, data_dir):
    import shutil

    shutil.copytree(data_dir / "ml-100k", tmp_path / "ml-100k")
    listing = CliRunner().invoke(main, ["data", "list", "--data-dir", str(tmp_path)],
                                 catch_exceptions=False)
    row = next(line for line in listing.output.splitlines() if line.startswith("ml100k"))
    assert row.endswith(str(tmp_path / "ml-100k")), row  # a sound copy: its folder
    with open(tmp_path / "ml-100k" / "u.data", "r+b") as fh:  # one byte changed
        first = fh.read(1)
        fh.seek(0)
        fh.write(b"9" if first != b"9" else b"8")
    res = CliRunner().invoke(main, ["data", "list", "--data-dir", str(tmp_path)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if line.startswith("ml100k"))
    assert "damaged" in row and "u.data: sha256" in row, row
    # the fetch that replaces it (no --force needed: fetch replaces a damaged copy)
    assert f"(`rfrs-ref data fetch ml100k --data-dir {tmp_path}` installs a fresh copy)" in row


# -- missing dataset without network -----------------------------------------------------------
def test_missing_dataset_without_network_says_where_and_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("RFRS_DATA_DIR", str(tmp_path / "env"))
    with pytest.raises(DownloadError) as info:
        load_dataset("ml100k", tmp_path / "given", base_url=closed_port_url())
    msg = str(info.value)
    assert "\n" not in msg
    for part in ("dataset 'ml100k'", str(tmp_path / "given" / "ml-100k"), "--data-dir",
                 str(tmp_path / "env" / "ml-100k"), "RFRS_DATA_DIR", "the cache",
                 str(tmp_path / "user-cache" / "datasets" / "ml-100k"),
                 "downloading it failed", "rfrs-ref data fetch ml100k", "network"):
        assert part in msg, (part, msg)
    assert files_under(tmp_path) == []


def test_missing_dataset_without_network_at_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("RFRS_DATA_MIRROR", closed_port_url())
    res = CliRunner().invoke(main, ["data", "info", "citeulike-t", "--download"],
                             catch_exceptions=False)
    assert res.exit_code != 0
    line = one_line(res.output)
    assert "citeulike-t" in line and "rfrs-ref data fetch citeulike-t" in line


# -- size caps ----------------------------------------------------------------------------------
def test_endless_body_stops_at_the_cap(server, tmp_path):
    server.endless("citeulike-a/users.dat")
    seen = []
    with pytest.raises(DownloadError) as info:
        fetch("citeulike-a", tmp_path / "d", base_url=server.url,
              progress=lambda label, done, total: seen.append(done))
    cap = citeulike_cap()
    assert f"more than the {cap:,} bytes the manifest allows" in str(info.value)
    # read up to cap + 1 bytes and no further
    assert max(seen) == cap + 1
    assert server.sent < 200 << 20
    assert files_under(tmp_path) == [] and not (tmp_path / "d").exists()


def test_announced_size_over_the_cap_is_refused_before_reading(server, tmp_path):
    def send(h):
        h.send_response(200)
        h.send_header("Content-Length", str(300 << 20))
        h.end_headers()
        h.wfile.write(b"0" * (1 << 16))
    server.route("citeulike-t/users.dat", send)
    seen = []
    with pytest.raises(DownloadError, match="announces 314,572,800 bytes"):
        fetch("citeulike-t", tmp_path, base_url=server.url,
              progress=lambda label, done, total: seen.append(done))
    assert seen == [] and files_under(tmp_path) == []


def test_archive_over_its_cap(server, tmp_path):
    cap = manifest("ml100k").source.cap(manifest("ml100k").files)
    assert cap == 4924029 + 246201  # the published size plus 5%
    server.endless("ml-100k.zip")
    with pytest.raises(DownloadError, match=f"more than the {cap:,} bytes"):
        fetch("ml100k", tmp_path, base_url=server.url)
    assert files_under(tmp_path) == []


def test_huge_archive_member_is_refused_before_extraction(server, tmp_path):
    server.file("ml-100k.zip", zip_bytes({"ml-100k/u.data": 300 << 20, "ml-100k/u.item": b"x"}))
    with pytest.raises(DownloadError) as info:
        fetch("ml100k", tmp_path, base_url=server.url)
    msg = str(info.value)
    assert "ml-100k/u.data declares 314,572,800 bytes" in msg
    assert f"{manifest('ml100k').file('interactions').cap:,} bytes the manifest allows" in msg
    assert files_under(tmp_path) == []


def _lie_about_size(data: bytes, member: str, size: int) -> bytes:
    """``data`` (a zip) with ``member``'s uncompressed size rewritten as ``size`` in both its
    local header and the central directory."""
    raw = bytearray(data)
    name = member.encode()
    local = raw.find(b"PK\x03\x04" + b"")
    while local >= 0:
        n = int.from_bytes(raw[local + 26:local + 28], "little")
        if raw[local + 30:local + 30 + n] == name:
            raw[local + 22:local + 26] = size.to_bytes(4, "little")
        local = raw.find(b"PK\x03\x04", local + 4)
    central = raw.find(b"PK\x01\x02")
    while central >= 0:
        n = int.from_bytes(raw[central + 28:central + 30], "little")
        if raw[central + 46:central + 46 + n] == name:
            raw[central + 24:central + 28] = size.to_bytes(4, "little")
        central = raw.find(b"PK\x01\x02", central + 4)
    return bytes(raw)


def test_member_lying_about_its_size(server, tmp_path):
    member = "ml-100k/u.data"
    data = _lie_about_size(zip_bytes({member: 8 << 20}), member, 1000)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.getinfo(member).file_size == 1000
    server.file("ml-100k.zip", data)
    with pytest.raises(DownloadError, match="ml-100k/u.data") as info:
        fetch("ml100k", tmp_path, base_url=server.url)
    assert info.value.file == member
    assert files_under(tmp_path) == []


def test_oversized_optional_member_is_skipped(server, data_dir, tmp_path):
    real = data_dir / "ml-100k" / "u.data"
    if not real.is_file():
        pytest.skip(f"{real} is absent")
    cap = manifest("ml100k").file("item_names").cap
    server.file("ml-100k.zip", zip_bytes({"ml-100k/u.data": real.read_bytes(),
                                          "ml-100k/u.item": cap + 1}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = fetch("ml100k", tmp_path, base_url=server.url)
    assert r.installed == ("u.data",) and [n for n, _ in r.skipped] == ["u.item"]
    assert "declares" in r.skipped[0][1] and any("u.item" in str(w.message) for w in caught)
    assert files_under(tmp_path) == ["ml-100k/u.data"]


def test_fetch_over_the_cap_at_the_command_line(server, tmp_path):
    server.endless("citeulike-a/users.dat")
    (tmp_path / "citeulike-a").mkdir()
    (tmp_path / "citeulike-a" / "notes.txt").write_text("mine\n")
    res = CliRunner().invoke(main, ["data", "fetch", "citeulike-a", "--data-dir", str(tmp_path),
                                    "--mirror", server.url], catch_exceptions=False)
    assert res.exit_code != 0
    lines = res.output.strip().splitlines()
    assert lines[0] == "downloading users.dat (size unknown)..."  # the progress line
    line = one_line(lines[-1])
    assert len(lines) == 2 and "more than the" in line and "nothing was installed" in line
    assert files_under(tmp_path) == ["citeulike-a/notes.txt"]


# -- temporary files -----------------------------------------------------------------------------
def test_interrupted_by_the_user_leaves_nothing(server, tmp_path):
    server.endless("citeulike-a/users.dat")

    def stop(label, done, total):
        if done > 100_000:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        fetch("citeulike-a", tmp_path / "d", base_url=server.url, progress=stop)
    assert files_under(tmp_path) == []


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_part_files_are_removed_and_live_ones_kept(server, tmp_path):
    folder = tmp_path / "citeulike-a"
    folder.mkdir()
    host = socket.gethostname()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = folder / f".users.dat.rfrs-{_dead_pid()}@{host}.k3j_x9ab.part"
        live = folder / f".users.dat.rfrs-{sleeper.pid}@{host}.ab12cd34.part"
        other_host = folder / f".users.dat.rfrs-{_dead_pid()}@elsewhere.example.q1w2e3r4.part"
        old_untagged = folder / ".users.dat.zz99yy88.part"
        new_untagged = folder / ".users.dat.aa11bb22.part"
        for p in (dead, live, other_host, old_untagged, new_untagged):
            p.write_bytes(b"half a download")
        two_hours_ago = time.time() - 7200
        os.utime(old_untagged, (two_hours_ago, two_hours_ago))
        with pytest.raises(DownloadError, match="404"):
            fetch("citeulike-a", tmp_path, base_url=server.url)  # nothing served: 404
        left = set(files_under(folder))
        assert left == {live.name, other_host.name, new_untagged.name}
    finally:
        sleeper.kill()
        sleeper.wait()


def test_download_killed_outright_is_cleaned_up_next_time(server, data_dir, tmp_path):
    real = data_dir / "citeulike-a" / "users.dat"
    if not real.is_file():
        pytest.skip(f"{real} is absent")
    body = real.read_bytes()
    server.stall("citeulike-a/users.dat", body)
    env = {**os.environ, "no_proxy": "127.0.0.1", "NO_PROXY": "127.0.0.1"}
    code = ("import sys; from rfrs_ref.data import fetch; "
            "fetch('citeulike-a', sys.argv[1], base_url=sys.argv[2])")
    proc = subprocess.Popen([sys.executable, "-P", "-c", code, str(tmp_path), server.url], env=env)
    folder = tmp_path / "citeulike-a"
    try:
        for _ in range(600):  # wait (up to a minute) for the half-written temporary file
            parts = [p for p in folder.glob(".users.dat.*.part") if p.stat().st_size > 0] \
                if folder.exists() else []
            if parts:
                break
            time.sleep(0.1)
        assert parts, "the download never started"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert [p.name for p in folder.iterdir()] == [parts[0].name]  # the killed one's leftover
    server.release.set()
    server.file("citeulike-a/users.dat", body)
    r = fetch("citeulike-a", tmp_path, base_url=server.url)
    assert r.installed == ("users.dat",)
    assert files_under(tmp_path) == ["citeulike-a/users.dat"]


def test_full_disk_is_named_and_leaves_nothing(server, tmp_path):
    """A file-size limit stands in for a full disk: writes fail with EFBIG past 200 kB."""
    server.endless("citeulike-a/users.dat")
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))\n"
        "from rfrs_ref.data import DownloadError, fetch\n"
        "try:\n"
        "    fetch('citeulike-a', sys.argv[1], base_url=sys.argv[2])\n"
        "except DownloadError as e:\n"
        "    print(e)\n"
        "    sys.exit(3)\n")
    env = {**os.environ, "no_proxy": "127.0.0.1", "NO_PROXY": "127.0.0.1"}
    res = subprocess.run([sys.executable, "-P", "-c", code, str(tmp_path / "d"), server.url],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 3, res.stdout + res.stderr
    msg = res.stdout.strip()
    assert "writing" in msg and os.strerror(errno.EFBIG) in msg and "nothing was installed" in msg
    assert files_under(tmp_path) == []


def test_install_over_a_directory_is_refused(server, tmp_path):
    (tmp_path / "citeulike-a" / "users.dat").mkdir(parents=True)
    server.file("citeulike-a/users.dat", b"1 0\n")
    with pytest.raises(DownloadError, match="users.dat: it is a directory"):
        fetch("citeulike-a", tmp_path, base_url=server.url, force=True)
    assert server.httpd.requests == []


def test_caps_come_from_the_manifest():
    for m in (manifest(n) for n in ("lastfm", "ml100k", "citeulike-a", "citeulike-t")):
        for f in m.files:
            assert f.size > 0 and f.size < f.cap <= f.size + max(f.size // 20, 1 << 16)
        assert m.source.cap(m.files) >= max(f.cap for f in m.files)


def test_file_unreadable_after_the_lookup(tmp_path):
    from rfrs_ref.data.loaders import load_folder

    folder = tmp_path / "citeulike-a"
    folder.mkdir()
    (folder / "users.dat").mkdir()  # as if replaced between lookup and reading
    with pytest.raises(DatasetNotFoundError, match="users.dat cannot be read: Is a directory"):
        load_folder(folder, manifest("citeulike-a"))


def _file_mirror(data_dir: pathlib.Path, tmp_path: pathlib.Path) -> str:
    """A ``file://`` mirror holding the real citeulike-a ``users.dat`` (no network)."""
    src = data_dir / "citeulike-a" / "users.dat"
    if not src.is_file():
        pytest.skip("citeulike-a not under RFRS_DATA_DIR")
    (tmp_path / "mirror" / "citeulike-a").mkdir(parents=True)
    (tmp_path / "mirror" / "citeulike-a" / "users.dat").write_bytes(src.read_bytes())
    return (tmp_path / "mirror").as_uri()


@pytest.mark.parametrize("link", ["folder", "file"])
def test_fetch_never_writes_through_a_symbolic_link(data_dir, tmp_path, link):
    mirror = _file_mirror(data_dir, tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "users.dat").write_bytes(b"someone else's file\n")
    root = tmp_path / "F"
    if link == "folder":
        root.mkdir()
        (root / "citeulike-a").symlink_to(victim, target_is_directory=True)
    else:
        (root / "citeulike-a").mkdir(parents=True)
        (root / "citeulike-a" / "users.dat").symlink_to(victim / "users.dat")
    res = CliRunner().invoke(main, ["data", "fetch", "citeulike-a", "--data-dir", str(root),
                                    "--force", "--mirror", mirror])
    assert res.exit_code == 1
    msg = one_line(res.output)
    assert "is a symbolic link (to " in msg and "never written through a link" in msg
    assert files_under(victim) == ["users.dat"]
    assert (victim / "users.dat").read_bytes() == b"someone else's file\n"
    linked = root / "citeulike-a" / ("" if link == "folder" else "users.dat")
    assert linked.is_symlink()
