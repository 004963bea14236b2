"""A round with a rule that compares every row builds the detection features while it
verifies, in one read of the uploads (``Optimizer.features_verify_batch``): the same
rounds, bit for bit, as recovery, then verification, then the parameter features
(docs/performance.md)."""

from __future__ import annotations

import numpy as np
import pytest

from rfrs_ref.federated import round as round_module
from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.round import run_round
from rfrs_ref.federated.trainer import Trainer

SMALL = dict(n_users=200, n_items=120, n_clusters=4, mean_items=10.0)


def _rounds(trainer, rounds=4):
    state, private = trainer.initial_state()
    # every row in full: a Krum round would otherwise compute the shared rows once
    # (test_shared_rows_compared.py), which neither of the compared paths is
    buf = trainer.buffers(shared_rows=False)
    records = []
    for t in range(1, rounds + 1):
        state, rec = run_round(trainer.federation, state, t, buf, private)
        records.append(rec)
    return state, records


@pytest.mark.parametrize("optimizer,rule,detect,attack", [
    ("adam", "krum", "gradient", "ascent"), ("adam", "median", "parameter", "noise"),
    ("momentum", "trmean", "gradient", "noise"), ("rmsprop", "krum", "parameter", "ascent"),
    ("adagrad", "rfa", "gradient", "noise"), ("sgd", "bulyan", "parameter", "noise"),
    ("sgd", "krum", "gradient", "none")])
def test_one_read_gives_the_rounds_of_the_separate_passes(optimizer, rule, detect, attack,
                                                          monkeypatch):
    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.1,
                         model_params={"dim": 8}, optimizer=optimizer, defense=rule,
                         defense_params={"fallback": "reduce-f"}, detect=detect, attack=attack,
                         byzantine_fraction=0.0 if attack == "none" else 0.3, verify=True, seed=5)
    trainer = Trainer(config)
    assert round_module._features_in_one_read(trainer.federation)
    state, records = _rounds(trainer)
    assert all("features_verification" in r["timing"] for r in records)
    monkeypatch.setattr(round_module, "_features_in_one_read", lambda fed: False)
    state2, records2 = _rounds(trainer)
    assert all("recovery_verification" in r["timing"] for r in records2)
    for k in state:
        assert np.array_equal(state[k].view(np.uint8), state2[k].view(np.uint8)), k
    for a, b in zip(records, records2):
        a.pop("timing"), b.pop("timing")
        assert a == b
    if attack == "noise" and optimizer != "sgd":
        # the noise attack's uploads break the update rule: the exact kernel excluded them
        assert any(r["excluded"] for r in records)


def test_the_oracle_backend_and_unverified_runs_keep_their_passes():
    base = dict(dataset="synthetic", dataset_params=SMALL, client_fraction=0.1,
                model_params={"dim": 8}, defense="krum", detect="parameter")
    assert not round_module._features_in_one_read(Trainer(TrainConfig(**base, backend="numpy")).federation)
    assert not round_module._features_in_one_read(Trainer(TrainConfig(**base, verify=False)).federation)
    assert not round_module._features_in_one_read(Trainer(TrainConfig(**{**base, "defense": "none"})).federation)


@pytest.mark.parametrize("verify", [True, False])
def test_the_rule_is_told_that_verified_uploads_are_finite(verify, monkeypatch):
    """With verification on, every upload the rule sees passed its finiteness check: the
    round hands them over as FiniteUploads, and the rule reads only the features for
    NaN and ±inf. Without verification the rule checks everything."""
    from rfrs_ref.aggregate import krum
    from rfrs_ref.aggregate.base import FiniteUploads

    seen = []
    original = krum.client_distances

    def spy(X, arrays, backend):
        seen.append(isinstance(arrays, FiniteUploads))
        return original(X, arrays, backend)

    monkeypatch.setattr(krum, "client_distances", spy)
    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.1,
                         model_params={"dim": 8}, defense="krum", attack="noise",
                         byzantine_fraction=0.3, verify=verify, seed=5)
    _rounds(Trainer(config), rounds=2)
    assert seen == [verify] * 2
