"""Fixtures of the data tests: an isolated cache, real-data utilities, a local HTTP mirror."""

from __future__ import annotations

import functools
import http.server
import io
import pathlib
import threading
import zipfile

import pytest

from rfrs_ref.data import manifest


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch) -> pathlib.Path:
    """Every test gets its own empty cache and no mirror from the environment."""
    cache = tmp_path / "user-cache"
    monkeypatch.setenv("RFRS_CACHE_DIR", str(cache))
    monkeypatch.delenv("RFRS_DATA_MIRROR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return cache


def require(data_dir: pathlib.Path, name: str) -> pathlib.Path:
    """The folder of real dataset ``name`` under ``data_dir``; skip when it is absent."""
    m = manifest(name)
    folder = data_dir / m.folder
    missing = [f.name for f in m.required_files if not (folder / f.name).is_file()]
    if missing:
        pytest.skip(f"{name}: {', '.join(missing)} not in {folder}")
    return folder


def write_dataset(root: pathlib.Path, name: str, content: bytes | str,
                  file: str | None = None) -> pathlib.Path:
    """Write ``content`` as dataset ``name``'s interactions file (or ``file``) under ``root``;
    return the file's path."""
    m = manifest(name)
    path = root / m.folder / (file or m.file("interactions").name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def files_under(path: pathlib.Path) -> list[str]:
    """Every file (including hidden temporary ones) below ``path``."""
    if not path.exists():
        return []
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def build_mirror(data_dir: pathlib.Path, dest: pathlib.Path,
                 replace: dict[tuple[str, str], bytes] | None = None) -> pathlib.Path:
    """A mirror laid out as the manifest's ``mirror_path``s, built from real copies.

    ``replace[(dataset, file)]`` substitutes the bytes of one file (to corrupt it).
    Archives hold the members at the manifest's member paths.
    """
    replace = replace or {}
    for name in ("ml100k", "lastfm", "citeulike-a", "citeulike-t"):
        m = manifest(name)
        folder = data_dir / m.folder
        if not all((folder / f.name).is_file() for f in m.required_files):
            continue
        target = dest / m.source.mirror_path
        target.parent.mkdir(parents=True, exist_ok=True)
        if m.source.kind == "zip":
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
                for f in m.files:
                    if (folder / f.name).is_file():
                        data = replace.get((name, f.name), (folder / f.name).read_bytes())
                        zf.writestr(f.member, data)
                zf.writestr(m.source.mirror_path.removesuffix(".zip") + "/README", b"mirror\n")
            target.write_bytes(buf.getvalue())
        else:
            (f,) = m.files
            target.write_bytes(replace.get((name, f.name), (folder / f.name).read_bytes()))
    return dest


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the mirror; paths in ``server.interrupt`` get a full Content-Length but only
    half of the body before the connection is closed."""

    def do_GET(self):  # noqa: N802 - http.server's naming
        rel = self.path.lstrip("/")
        if rel in self.server.interrupt:
            body = (pathlib.Path(self.directory) / rel).read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.server.served.append(rel)
        super().do_GET()

    def log_message(self, format, *args):  # keep test output clean
        pass


class LocalMirror:
    """An HTTP server on 127.0.0.1 (free port) serving ``root`` in a thread."""

    def __init__(self, root: pathlib.Path) -> None:
        handler = functools.partial(_Handler, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.interrupt = set()
        self.server.served = []
        self.root = root
        # a short poll interval keeps shutdown (once per test) fast
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def interrupt(self, rel: str) -> None:
        self.server.interrupt.add(rel)

    @property
    def served(self) -> list[str]:
        return self.server.served

    def __enter__(self) -> LocalMirror:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def no_proxy(monkeypatch):
    """Make urllib connect to 127.0.0.1 directly whatever the proxy settings."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
                "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def real(data_dir):
    """``real(name)``: the folder of a real dataset under RFRS_DATA_DIR, or skip."""
    return functools.partial(require, data_dir)


@pytest.fixture
def make_dataset():
    """``make_dataset(root, name, content, file=None)``: see write_dataset."""
    return write_dataset


@pytest.fixture
def list_files():
    """``list_files(path)``: every file below path, hidden temporaries included."""
    return files_under


@pytest.fixture(scope="session")
def mirror_root(data_dir, tmp_path_factory) -> pathlib.Path:
    """A good mirror of every real dataset present under RFRS_DATA_DIR."""
    return build_mirror(data_dir, tmp_path_factory.mktemp("mirror"))


@pytest.fixture
def local_mirror(mirror_root, no_proxy):
    """A LocalMirror serving ``mirror_root``."""
    with LocalMirror(mirror_root) as server:
        yield server


@pytest.fixture
def serve_mirror(data_dir, tmp_path, no_proxy):
    """``serve_mirror(replace)``: a LocalMirror (context manager) of a mirror whose files
    ``replace[(dataset, file)]`` are substituted."""
    def make(replace=None) -> LocalMirror:
        return LocalMirror(build_mirror(data_dir, tmp_path / "custom-mirror", replace))
    return make
