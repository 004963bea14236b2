"""server_round: the server's half of a round, on uploads computed elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.round import (
    _byzantine_uploads, _client_uploads, run_round, sample_round, server_round)
from rfrs_ref.federated.trainer import Trainer

CFG = dict(dataset="synthetic", rounds=3, client_fraction=0.02, model_params={"dim": 4},
           defense="krum", detect="gradient", attack="noise", byzantine_fraction=0.3)


def _uploads(trainer, state, t):
    fed, buf = trainer.federation, trainer.buffers()
    rd = sample_round(fed, t)
    G, U, losses = _client_uploads(fed, state, rd, buf, None)
    diag = _byzantine_uploads(fed, state, rd, G, U, buf)
    return rd, {k: v.copy() for k, v in U.items()}, losses.copy(), diag


@pytest.mark.parametrize("as_number", [False, True])
def test_server_round_on_the_round_uploads_is_run_round(as_number):
    trainer = Trainer(TrainConfig(**CFG))
    state, _ = trainer.initial_state()
    ref_state, ref_rec = run_round(trainer.federation, state, 1, trainer.buffers())
    rd, U, losses, diag = _uploads(trainer, state, 1)
    new, rec = server_round(trainer.federation, state, 1 if as_number else rd, U,
                            trainer.buffers(), losses=losses, attack_diag=diag)
    for k in ref_state:
        np.testing.assert_array_equal(new[k], ref_state[k])
    drop = ("timing",)
    assert {k: v for k, v in rec.items() if k not in drop} == \
        {k: v for k, v in ref_rec.items() if k not in drop}
    assert rec["excluded"]  # noise breaks Adam's rule: verification ran on these uploads


def test_without_losses_the_record_says_none_and_without_rows_nothing_moves():
    trainer = Trainer(TrainConfig(**CFG))
    state, _ = trainer.initial_state()
    rd = sample_round(trainer.federation, 1)
    empty = type(rd)(t=1, clients=rd.clients[:0], byz=rd.byz[:0], n_samples=rd.n_samples[:0],
                     f=rd.f, timing={})
    D = trainer.model.n_params()
    U = {k: np.zeros((0, D), np.float32) for k in trainer.optimizer.arrays}
    new, rec = server_round(trainer.federation, state, empty, U, trainer.buffers())
    assert rec["loss"] is None and rec["clients"] == [] and rec["byzantine_share_sampled"] == 0.0
    for k in state:
        np.testing.assert_array_equal(new[k], state[k])


def test_the_resilience_monitor_needs_honest_gradients():
    trainer = Trainer(TrainConfig(**CFG, resilience=True))
    state, _ = trainer.initial_state()
    rd, U, losses, _ = _uploads(trainer, state, 1)
    with pytest.raises(ValueError, match="honest gradients"):
        server_round(trainer.federation, state, rd, U, trainer.buffers(), losses=losses)
