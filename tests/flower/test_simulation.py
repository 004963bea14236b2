"""Flower's simulation engine (Ray): the Flower run ends in the in-process run's state, bit for bit.

One virtual SuperNode per user of a small synthetic dataset (60 users), A-FRS and
A-RFRS under gradient ascent (the paper's preset a-rfrs: Krum on recovered
gradients). Skipped without Flower or Ray (the ``flower`` extra).
"""

from __future__ import annotations

import json

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


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_simulation_engine_run_equals_the_trainer_bit_for_bit(name, tmp_path):
    from rfrs_ref.flower.run import simulate

    cfg = TrainConfig(**BASE, **CONFIGS[name])
    ref = Trainer(cfg).run(tmp_path / "ref")
    out = simulate(cfg, tmp_path / "flower", num_cpus=2)
    for k in ref.state:
        np.testing.assert_array_equal(out["result"].state[k], ref.state[k], err_msg=k)
    with np.load(tmp_path / "flower" / "state.npz") as z:
        for k in ref.state:
            np.testing.assert_array_equal(z[k], ref.state[k])
    assert len(out["nodes"]) == 60  # one virtual SuperNode per user
    recs = [json.loads(x) for x in (tmp_path / "flower" / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in recs] == [1, 2, 3]
    assert all(r["dropped"] == [] and r["wire"]["bytes_up"] > 0 for r in recs)
    if "ascent" in name:
        assert any(any(r["byzantine"]) for r in recs)
