"""Running the Flower apps: the simulation engine, and a loopback deployment.

:func:`simulate` runs the ServerApp and ClientApp in Flower's simulation engine
(``flwr.simulation.run_simulation`` on Ray), one virtual SuperNode per user
(its ``partition-id`` is the user id). :func:`deploy` starts a real federation
on 127.0.0.1 (see :mod:`rfrs_ref.flower.deploy`).
"""

from __future__ import annotations

import contextlib
import os

from rfrs_ref.flower import require_flwr


def simulate(config, run_dir=None, *, num_cpus: int | None = None,
             round_timeout: float | None = None, connect_timeout: float = 3600.0,
             progress=None, verbose: bool = False) -> dict:
    """Train ``config`` on Flower's simulation engine into ``run_dir``; returns
    ``{"result": TrainResult, "wire": {...}, "nodes": {user: node}}``.

    ``num_cpus``: CPUs Ray may use (default: all), one ClientApp per CPU at a time.
    ``connect_timeout``: seconds the server waits for the virtual nodes' answers to its
    query of which user each holds (every node exists from the start; on a loaded
    machine a few hundred queries through Ray take minutes).
    """
    require_flwr(simulation=True)
    from flwr.simulation import run_simulation

    from rfrs_ref.data import load_dataset
    from rfrs_ref.flower.client import client_app
    from rfrs_ref.flower.server import check_federation_config, server_app

    config = config.resolved()
    check_federation_config(config)
    n_users = load_dataset(config.dataset, config.data_dir, **config.dataset_params).n_users
    results: dict = {}
    cpus = int(num_cpus or os.cpu_count() or 1)
    backend_config = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": cpus, "num_gpus": 0, "include_dashboard": False,
                      "log_to_driver": bool(verbose)},
    }
    # the nodes use no accelerator (num_gpus 0): Ray's default of overriding the visible
    # devices for them is about to change, and Ray warns of it unless told which it is
    ray_env = "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"
    before = os.environ.get(ray_env)
    os.environ.setdefault(ray_env, "0")
    try:
        with pythonpath_kept():
            run_simulation(server_app=server_app(config, run_dir, round_timeout=round_timeout,
                                                 connect_timeout=connect_timeout,
                                                 progress=progress, results=results),
                           client_app=client_app(config), num_supernodes=n_users,
                           backend_config=backend_config, verbose_logging=verbose)
    finally:
        if before is None:
            os.environ.pop(ray_env, None)
    if "result" not in results:
        raise RuntimeError("the Flower simulation ended without finishing the run; see the log "
                           "above")
    return results


@contextlib.contextmanager
def pythonpath_kept():
    """Restore ``PYTHONPATH`` after Flower's Ray backend, which sets it in this process's
    environment to the driver's whole ``sys.path`` (flwr 1.41, ``raybackend.py``) and leaves
    it there: every process the caller starts afterwards would then import from those
    directories (a source checkout among them) instead of the installed packages."""
    before = os.environ.get("PYTHONPATH")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
