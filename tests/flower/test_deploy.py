"""A real Flower federation on 127.0.0.1: flower-superlink, three flower-supernode processes,
``flwr run``; one SuperNode killed while a round is in flight.

Slow (Flower 1.41 starts a ClientApp process per message): about two minutes on a
loaded 2-core machine. Skipped without Flower.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from rfrs_ref.aggregate import PRESETS
from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.trainer import Trainer

pytest.importorskip("flwr")

#: 60 users on three nodes, 3 sampled per round; A-RFRS under gradient ascent
CFG = dict(dataset="synthetic", dataset_params={"n_users": 60, "n_items": 200}, rounds=2,
           eval_every=2, seed=2, client_fraction=0.05, model_params={"dim": 4},
           defense=PRESETS["a-rfrs"][0], detect=PRESETS["a-rfrs"][1], attack="ascent",
           byzantine_fraction=0.3)


def _groups_alive(groups) -> list[int]:
    """The process groups that still hold a process (SuperLink, SuperNodes, and what they
    started: SuperExec, ServerApp and ClientApp processes)."""
    import os
    import time

    alive = list(groups)
    for _ in range(50):
        left = []
        for g in alive:
            try:
                os.killpg(g, 0)
                left.append(g)
            except ProcessLookupError:
                pass
        alive = left
        if not alive:
            break
        time.sleep(0.1)  # a killed child is reaped by init shortly after its parent died
    return alive


@pytest.mark.slow
def test_loopback_deployment_survives_a_killed_supernode(tmp_path):
    from rfrs_ref.flower.deploy import deploy

    cfg = TrainConfig(**CFG)
    out = deploy(cfg, tmp_path / "run", nodes=3, timeout=420, round_timeout=60,
                 connect_timeout=60, kill_node=(0, 1))
    assert out["killed"] == {"node": 0, "after_round": 1, "users": list(range(0, 60, 3))}
    recs = [json.loads(x) for x in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in recs] == [1, 2]
    dead = set(out["killed"]["users"])
    assert recs[0]["dropped"] == []
    for r in recs[1:]:
        assert {d["client"] for d in r["dropped"]} == set(r["sampled"]) & dead
        assert set(r["clients"]) == set(r["sampled"]) - dead
    assert recs[1]["dropped"]  # round 2 samples a user of the killed node (seed 2)
    for f in ("config.json", "metrics.csv", "final_metrics.json", "state.npz", "flower.json"):
        assert (tmp_path / "run" / f).exists()
    # round 1 had every client: the state after it is the in-process one
    ref = Trainer(TrainConfig(**{**CFG, "rounds": 1, "eval_every": 1})).run(None)
    first = recs[0]["state_norms"]
    assert first == {k: float(np.linalg.norm(v.astype(np.float64))) for k, v in ref.state.items()}
    assert len(out["process_groups"]) == 4 and not _groups_alive(out["process_groups"])
