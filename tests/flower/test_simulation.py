"""Flower's simulation engine (Ray): the Flower run ends in the in-process run's state, bit for bit.

One virtual SuperNode per user of a small synthetic dataset (60 users), A-FRS and
A-RFRS under gradient ascent (the paper's preset a-rfrs: Krum on recovered
gradients). Skipped without Flower or Ray (the ``flower`` extra).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from rfrs_ref.aggregate import PRESETS
from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.trainer import Trainer

pytest.importorskip("flwr")
pytest.importorskip("ray")

#: 60 users, 6 per round: Ray's per-message cost keeps the test to seconds per round
BASE = dict(dataset="synthetic", dataset_params={"n_users": 60, "n_items": 200}, rounds=3,
            eval_every=3, seed=5, client_fraction=0.1, model_params={"dim": 4})
CONFIGS = {
    "a-frs": dict(defense=PRESETS["no-defense"][0], detect=PRESETS["no-defense"][1]),
    "a-rfrs-ascent": dict(defense=PRESETS["a-rfrs"][0], detect=PRESETS["a-rfrs"][1],
                          attack="ascent", byzantine_fraction=0.3),
}


def test_simulation_engine_runs_equal_the_trainer_bit_for_bit(tmp_path):
    """Both configurations in one simulation (one Ray start-up): the ServerApp trains one
    after the other on the same virtual nodes, whose ClientApp holds both configurations."""
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from rfrs_ref.flower.client import client_app
    from rfrs_ref.flower.server import FlowerTrainer

    cfgs = {name: TrainConfig(**BASE, **kw) for name, kw in CONFIGS.items()}
    results, errors = {}, []
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            for name, cfg in cfgs.items():
                trainer = FlowerTrainer(cfg, grid, connect_timeout=600)
                results[name] = (trainer.run(tmp_path / name), dict(trainer.node_of))
        except Exception as exc:  # noqa: BLE001 - reported below, not swallowed by the engine
            errors.append(exc)
            raise

    from rfrs_ref.flower.run import pythonpath_kept

    before = os.environ.get("PYTHONPATH")
    with pythonpath_kept():
        run_simulation(server_app=app, client_app=client_app(list(cfgs.values())),
                       num_supernodes=60,
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                       "init_args": {"num_cpus": 2, "num_gpus": 0,
                                                     "include_dashboard": False}})
    # Flower's Ray backend sets PYTHONPATH to the driver's sys.path: restored, so that
    # the processes later tests start import the installed package, not the checkout
    assert os.environ.get("PYTHONPATH") == before
    assert not errors, errors
    for name, cfg in cfgs.items():
        ref = Trainer(cfg).run(tmp_path / f"ref-{name}")
        res, nodes = results[name]
        for k in ref.state:
            np.testing.assert_array_equal(res.state[k], ref.state[k], err_msg=f"{name} {k}")
        with np.load(tmp_path / name / "state.npz") as z:
            for k in ref.state:
                np.testing.assert_array_equal(z[k], ref.state[k])
        assert len(nodes) == 60 and len(set(nodes.values())) == 60  # a virtual node per user
        recs = [json.loads(x) for x in (tmp_path / name / "rounds.jsonl").read_text().splitlines()]
        assert [r["round"] for r in recs] == [1, 2, 3]
        assert all(r["dropped"] == [] and r["wire"]["bytes_up"] > 0 for r in recs)
        if "ascent" in name:
            assert any(any(r["byzantine"]) for r in recs)


def test_simulate_trains_into_a_run_directory(tmp_path):
    """rfrs_ref.flower.run.simulate, the function behind `rfrs-ref flower simulate`."""
    from rfrs_ref.flower.run import simulate

    cfg = TrainConfig(**{**BASE, "rounds": 1, "eval_every": 1}, **CONFIGS["a-rfrs-ascent"])
    before = os.environ.get("PYTHONPATH")
    out = simulate(cfg, tmp_path / "run", num_cpus=2)
    assert os.environ.get("PYTHONPATH") == before
    ref = Trainer(cfg).run(None)
    for k in ref.state:
        np.testing.assert_array_equal(out["result"].state[k], ref.state[k])
    meta = json.loads((tmp_path / "run" / "flower.json").read_text())
    assert len(meta["nodes"]) == 60 and meta["wire"]["bytes_up"] > 0
