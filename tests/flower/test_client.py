"""The client half (rfrs_ref.flower.client) against the in-process round, without Flower.

A node computes its upload alone, on a one-row batch; the in-process round
computes every sampled client's upload in one batch and lets the attack rewrite
the Byzantine rows together. These tests require the same bits for every row.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.round import _byzantine_uploads, _client_uploads, run_round, sample_round
from rfrs_ref.federated.trainer import Trainer
from rfrs_ref.flower.client import (
    check_attack_runs_on_a_node, client_data, client_upload, node_attack, node_users)

BASE = dict(dataset="synthetic", rounds=4, client_fraction=0.02,
            eval_every=4)


def _round_uploads(trainer, state, t):
    """The in-process round's uploads of round t (rows: the sampled clients)."""
    fed = trainer.federation
    buf = trainer.buffers()
    rd = sample_round(fed, t)
    G, U, losses = _client_uploads(fed, state, rd, buf, None)
    _byzantine_uploads(fed, state, rd, G, U, buf)
    return rd, {k: v.copy() for k, v in U.items()}, losses.copy()


def _state_after(trainer, rounds):
    state, _ = trainer.initial_state()
    buf = trainer.buffers()
    for t in range(1, rounds + 1):
        state, _ = run_round(trainer.federation, state, t, buf)
    return state


@pytest.mark.parametrize("optimizer,attack,negatives,dtype", [
    ("adam", "none", 0, "float32"),
    ("adam", "ascent", 0, "float32"),
    ("adam", "noise", 0, "float32"),
    ("adam", "camouflage", 0, "float64"),
    ("sgd", "ascent", 3, "float64"),
    ("momentum", "noise", 2, "float32"),
    ("adam", "inf", 0, "float32"),
])
def test_each_node_uploads_the_rows_of_the_in_process_round(optimizer, attack, negatives, dtype):
    cfg = TrainConfig(**BASE, optimizer=optimizer, attack=attack, byzantine_fraction=0.4,
                      dtype=dtype, model_params={"dim": 4, "negatives": negatives})
    trainer = Trainer(cfg)
    state = _state_after(trainer, 2)  # m̄ ≠ 0: camouflage has coordinates to move
    # a round with several Byzantine rows: the attack stream is shared by them
    t = next(t for t in range(3, 100) if sample_round(trainer.federation, t).byz.sum() >= 2)
    rd, U, losses = _round_uploads(trainer, state, t)
    cd = client_data(cfg, rd.clients.tolist())
    for r, c in enumerate(rd.clients.tolist()):
        up, loss, _ = client_upload(cd, c, state, t, node_attack(cd, c, {}))
        assert loss == losses[r]
        for k in trainer.optimizer.arrays:
            np.testing.assert_array_equal(up[k], U[k][r], err_msg=f"client {c} array {k}")


def test_node_config_roles_and_users():
    cfg = TrainConfig(**BASE, attack="ascent", byzantine_fraction=0.4, model_params={"dim": 4})
    cd = client_data(cfg, [0, 1, 2, 3, 4, 5])
    byz = [u for u in range(6) if cd.byzantine[u]]
    honest = [u for u in range(6) if not cd.byzantine[u]]
    assert byz and honest
    assert node_attack(cd, byz[0], {}).name == "ascent"
    assert node_attack(cd, honest[0], {}) is None
    assert node_attack(cd, byz[0], {"byzantine": "false"}) is None
    assert node_attack(cd, honest[0], {"attack": "noise", "attack-params": '{"sigma": 2.0}'}).sigma == 2.0
    with pytest.raises(ValueError, match="colluding"):
        node_attack(cd, honest[0], {"attack": "alie"})
    with pytest.raises(ValueError, match="JSON"):
        node_attack(cd, honest[0], {"attack": "noise", "attack-params": "{sigma"})
    assert node_users({"users": "3, 5,7"}) == [3, 5, 7]
    assert node_users({"users": 4}) == [4]
    assert node_users({"partition-id": 9, "num-partitions": 10}) == [9]
    with pytest.raises(ValueError, match="users"):
        node_users({})
    with pytest.raises(ValueError, match="user ids"):
        node_users({"users": "a,b"})
    with pytest.raises(ValueError, match="does not hold user 7"):
        cd.items_of(7)


@pytest.mark.parametrize("name", ["alie", "ipm", "opt-alie", "mimic"])
def test_colluding_attacks_are_refused_with_the_reason(name):
    with pytest.raises(ValueError, match=f"attack '{name}' needs more than one client's own data"):
        check_attack_runs_on_a_node(name)


def test_a_state_of_the_wrong_shape_or_dtype_is_refused():
    cfg = TrainConfig(**BASE, model_params={"dim": 4})
    trainer = Trainer(cfg)
    state, _ = trainer.initial_state()
    cd = client_data(cfg, [0])
    bad = dict(state, theta=state["theta"][:-1])
    with pytest.raises(ValueError, match="server state 'theta' is float32"):
        client_upload(cd, 0, bad, 1)
    bad = {k: v.astype(np.float64) for k, v in state.items()}
    with pytest.raises(ValueError, match="expected float32"):
        client_upload(cd, 0, bad, 1)
    assert dataclasses.is_dataclass(cd)
