"""FMF (the paper's baseline) end to end: every optimiser, aggregation rule and attack."""

from __future__ import annotations

import numpy as np
import pytest

from rfrs_ref.aggregate import DETECT, RULES
from rfrs_ref.attack import ATTACKS
from rfrs_ref.experiments.figures import Scale, figure, reproduce
from rfrs_ref.federated.trainer import Trainer
from rfrs_ref.optim import OPTIMIZERS


def _check_run(config):
    trainer = Trainer(config)
    result = trainer.run()
    final = result.final
    for k in config.ks:
        for name in ("precision", "recall"):
            v = final["model"][f"{name}@{k}"]
            assert 0.0 <= v <= 1.0, (name, k, v)
    assert final["selection"]["excluded_honest"] == 0
    assert np.isfinite(result.state["theta"]).all()
    return trainer, result


@pytest.mark.parametrize("optimizer", OPTIMIZERS.names())
def test_fmf_trains_with_every_optimizer(ex, optimizer):
    trainer, result = _check_run(ex.tiny_config(model="fmf", optimizer=optimizer))
    assert result.history[0]["round"] == 0 and result.history[-1]["round"] == 4


def test_fmf_private_vectors_follow_participation(ex):
    """The round loop owns the private state; check it through a hand-driven loop."""
    from rfrs_ref.federated.round import run_round

    trainer = Trainer(ex.tiny_config(model="fmf"))
    state, private = trainer.initial_state()
    u0 = private["theta"].copy()
    buf = trainer.buffers()
    taken = np.zeros(trainer.data.n_users, dtype=np.int64)
    for t in range(1, 5):
        state, rec = run_round(trainer.federation, state, t, buf, private)
        taken[rec["clients"]] += 1
    moved = (private["theta"] != u0).any(axis=1)
    np.testing.assert_array_equal(moved, taken > 0)
    np.testing.assert_array_equal(private["steps"], taken)


@pytest.mark.parametrize("rule", RULES.names())
@pytest.mark.parametrize("detect", DETECT)
def test_fmf_under_ascent_with_every_rule(ex, rule, detect):
    defense = "none" if rule == "mean" else rule
    _check_run(ex.tiny_config(model="fmf", defense=defense, detect=detect, attack="ascent",
                           byzantine_fraction=0.2))


@pytest.mark.parametrize("attack", ATTACKS.names())
def test_fmf_under_every_attack(ex, attack):
    trainer, result = _check_run(ex.tiny_config(model="fmf", attack=attack, byzantine_fraction=0.2,
                                                preset="a-rfrs"))
    assert result.final["selection"]["byzantine_share_sampled"] > 0


def test_noise_attack_on_fmf_is_caught_by_verification(ex):
    """noise breaks the update rule (SPEC §7): with verification every such upload is excluded."""
    _, result = _check_run(ex.tiny_config(model="fmf", attack="noise", byzantine_fraction=0.2))
    assert result.final["selection"]["excluded_byzantine"] > 0


def test_fig3_runs_fmf_beside_fism(ex, tmp_path):
    """The A-FRS vs FMF figure, test-sized, in this process."""
    scale = Scale(quick=True, datasets=("synthetic",), rounds=3, trials=1,
                  overrides={"dataset_params": ex.TINY_DATA, "client_fraction": 0.1})
    report, paths = reproduce(figure("3"), scale, tmp_path / "frs", workers=0)
    assert report.failed == 0 and report.finished == 2
    runs = report.table.drop_duplicates("key")
    assert sorted(runs["model"]) == ["fism", "fmf"]
    assert sorted(runs["label_series"]) == ["A-FRS", "FMF"]
    assert {p.name for p in paths} >= {"fig3.png", "fig3.pdf", "fig3_curves.png"}
