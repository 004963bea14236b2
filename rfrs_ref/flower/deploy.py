"""A real Flower federation on the loopback interface, started and stopped by one call.

:func:`deploy` starts, all on 127.0.0.1 and with a private ``FLWR_HOME``:

1. ``flower-superlink --insecure`` (runtime dependency installation off: nothing
   is downloaded);
2. ``nodes`` ``flower-supernode --insecure`` processes, node i holding the
   users u with u mod nodes = i (node config ``users``);
3. ``flwr run`` of a small Flower App whose components are
   :mod:`rfrs_ref.flower.app` (the ServerApp and ClientApp), with the training
   configuration and the run directory in its run config;

then waits for the run to finish (``flwr ls``), at most ``timeout`` seconds,
and stops every process it started (its own process groups: SIGTERM, then
SIGKILL), whatever happened. ``kill_node=(i, r)`` kills node i (its SuperNode
and the ClientApp processes it started) once round r is recorded, i.e. while
round r + 1 is in flight: the fault of docs/flower.md.

Flower 1.41's SuperNode starts one ``flwr-clientapp`` process per message
(``--isolation subprocess``), so every client of every round pays a Python
start, the imports and the data split: a round on loopback costs seconds per
client, which the measurements of docs/flower.md show.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from rfrs_ref.flower import require_flwr

LOOPBACK = "127.0.0.1"

APP_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "rfrsflower"
version = "1.0.0"
description = "rfrs-ref on a Flower federation"
license = "MIT"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "rfrs-ref"

[tool.flwr.app.components]
serverapp = "rfrs_flower_app:server"
clientapp = "rfrs_flower_app:client"

[tool.flwr.app.config]
config-file = ""
run-dir = ""
round-timeout = 600.0
connect-timeout = 120.0
"""

APP_MODULE = """\
from rfrs_ref.flower import app as _app

server = _app.server
client = _app.client
"""


class DeploymentError(RuntimeError):
    """The loopback federation did not finish the run (the message says where it stopped
    and where the logs are)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen, deadline: float, what: str, log) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DeploymentError(f"{what} exited with code {proc.returncode}; see {log}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex((LOOPBACK, port)) == 0:
                return
        time.sleep(0.2)
    raise DeploymentError(f"{what} did not listen on {LOOPBACK}:{port} in time; see {log}")


def _stop(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    """SIGTERM every process group we started, then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
    end = time.monotonic() + grace
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, end - time.monotonic()))
    for p in procs:
        # the group, not only its leader: a SuperNode's SuperExec and ClientApps live in it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=grace)


def _bin(name: str) -> str:
    here = pathlib.Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def _rounds_recorded(run_dir: pathlib.Path) -> int:
    try:
        with open(run_dir / "rounds.jsonl") as fh:
            return sum(1 for line in fh if line.endswith("\n"))
    except OSError:
        return 0


def deploy(config, run_dir, *, nodes: int = 3, timeout: float = 1800.0,
           round_timeout: float = 120.0, connect_timeout: float = 120.0,
           kill_node: tuple[int, int] | None = None, workdir=None, keep_logs: bool = True,
           echo=None) -> dict:
    """Train ``config`` into ``run_dir`` on a loopback Flower federation of ``nodes``
    SuperNodes; returns ``{"run_dir", "seconds", "logs", "killed", "process_groups"}``
    (the process groups it started, all stopped by then).

    Args:
        config: the TrainConfig.
        run_dir: the run directory (the ServerApp writes it, as ``rfrs-ref train``).
        nodes: the number of SuperNodes; node i holds users u ≡ i (mod nodes).
        timeout: seconds for the whole deployment, start to stop.
        round_timeout: seconds a round waits for replies before dropping the missing.
        connect_timeout: seconds the server waits for the nodes of every user.
        kill_node: (i, r): kill node i once round r is recorded (a fault test).
        workdir: where the Flower home, the app and the logs go (default: a temporary
            directory, kept under ``run_dir/flower-logs`` when ``keep_logs``).
        echo: a callable given progress lines (None: silent).

    Raises:
        DeploymentError: a process failed, the run failed, or ``timeout`` passed;
            every process is stopped first.
    """
    require_flwr()
    from rfrs_ref.data import load_dataset
    from rfrs_ref.flower.server import check_federation_config

    say = echo or (lambda line: None)
    config = config.resolved()
    check_federation_config(config)
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    n_users = load_dataset(config.dataset, config.data_dir, **config.dataset_params).n_users
    nodes = min(nodes, n_users)
    run_dir = pathlib.Path(run_dir).resolve()
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(workdir or tempfile.mkdtemp(prefix="rfrs-flower-")).resolve()
    home, app, logs = work / "flwr-home", work / "app", work / "logs"
    for d in (home, app, logs):
        d.mkdir(parents=True, exist_ok=True)
    link_port = free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
        f'address = "{LOOPBACK}:{link_port}"\ninsecure = true\n')
    (app / "pyproject.toml").write_text(APP_PYPROJECT)
    (app / "rfrs_flower_app.py").write_text(APP_MODULE)
    cfg_file = work / "config.json"
    cfg_file.write_text(config.dumps())
    env = dict(os.environ, FLWR_HOME=str(home))
    procs: list[subprocess.Popen] = []
    started = time.monotonic()
    deadline = started + float(timeout)
    killed = None

    def spawn(cmd: list[str], log_name: str) -> subprocess.Popen:
        fh = open(logs / log_name, "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(work),
                             start_new_session=True)
        fh.close()
        procs.append(p)
        return p

    try:
        link = spawn([_bin("flower-superlink"), "--insecure", "--host", LOOPBACK, "--port",
                      str(link_port), "--disable-runtime-dependency-installation"],
                     "superlink.log")
        _wait_listening(link_port, link, deadline, "flower-superlink", logs / "superlink.log")
        say(f"superlink on {LOOPBACK}:{link_port}")
        node_procs = []
        for i in range(nodes):
            users = ",".join(str(u) for u in range(i, n_users, nodes))
            port = free_port()
            p = spawn([_bin("flower-supernode"), "--insecure", "--superlink",
                       f"{LOOPBACK}:{link_port}", "--host", LOOPBACK, "--port", str(port),
                       "--node-config", f'users="{users}"'], f"supernode-{i}.log")
            node_procs.append((p, port))
        for i, (p, port) in enumerate(node_procs):
            _wait_listening(port, p, deadline, f"flower-supernode {i}", logs / f"supernode-{i}.log")
        say(f"{nodes} supernodes on {LOOPBACK}, holding {n_users} users")
        run_config = (f"config-file='{cfg_file}' run-dir='{run_dir}' "
                      f"round-timeout={float(round_timeout)} "
                      f"connect-timeout={float(connect_timeout)}")
        submitted = subprocess.run(
            [_bin("flwr"), "run", str(app), "loopback", "--run-config", run_config,
             "--format", "json"], env=env, cwd=str(work), capture_output=True, text=True,
            timeout=max(1.0, deadline - time.monotonic()))
        (logs / "flwr-run.log").write_text(submitted.stdout + submitted.stderr)
        try:
            run_id = int(json.loads(submitted.stdout)["run-id"])
        except (ValueError, KeyError, TypeError):
            raise DeploymentError(f"flwr run did not start the run (exit {submitted.returncode}); "
                                  f"see {logs / 'flwr-run.log'}") from None
        say(f"run {run_id} submitted")
        status = ""
        while time.monotonic() < deadline:
            time.sleep(1.0)
            if kill_node is not None and killed is None:
                i, r = kill_node
                if _rounds_recorded(run_dir) >= r:
                    p = node_procs[i][0]
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(p.pid, signal.SIGKILL)
                    killed = {"node": i, "after_round": r,
                              "users": list(range(i, n_users, nodes))}
                    say(f"killed supernode {i} after round {r}")
            status = _run_status(env, work, run_id)
            if status.startswith("finished"):
                break
        else:
            raise DeploymentError(f"the run did not finish within {timeout:g} s (status "
                                  f"{status or 'unknown'}); logs in {logs}")
        if status != "finished:completed":
            raise DeploymentError(f"the run ended {status}; logs in {logs}")
        say(f"run {run_id} {status}")
    finally:
        _stop(procs)
    seconds = time.monotonic() - started
    out_logs = logs
    if keep_logs and workdir is None and run_dir.exists():
        from rfrs_ref.files import DirectoryLock, DirectoryLocked

        # the logs go into the run directory only while this process owns it (the server
        # has ended and released it); another process working there keeps it, and the
        # logs stay where they are
        try:
            with DirectoryLock(run_dir):
                shutil.rmtree(run_dir / "flower-logs", ignore_errors=True)
                shutil.copytree(logs, run_dir / "flower-logs")
                out_logs = run_dir / "flower-logs"
        except DirectoryLocked as exc:
            say(f"the logs stay in {logs}: {exc}")
    if workdir is None and out_logs != logs:
        shutil.rmtree(work, ignore_errors=True)
    return {"run_dir": run_dir, "seconds": seconds, "logs": out_logs, "killed": killed,
            "process_groups": [p.pid for p in procs]}


def _run_status(env, cwd, run_id: int) -> str:
    try:
        res = subprocess.run([_bin("flwr"), "ls", "loopback", "--run-id", str(run_id),
                              "--format", "json"], env=env, cwd=str(cwd), capture_output=True,
                             text=True, timeout=60)
        runs = json.loads(res.stdout).get("runs") or []
        return str(runs[0].get("status", "")) if runs else ""
    except (subprocess.TimeoutExpired, ValueError, AttributeError, IndexError, KeyError):
        return ""
