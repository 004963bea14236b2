"""Byzantine uploads may be NaN, ±inf or 1e38: that is input, not a crash, and non-finite
is never success. Checked end to end through the trainer's round loop, for every rule of
the catalogue, alone and behind NNM, in both detection spaces, under hostile uploads:

- the ``inf`` attack (+inf, NaN), ``noise`` of σ = 1e38, ``ipm`` and ``alie`` of factor
  1e30, ``ascent``; uploads of exactly 1e38, of −3.4e38 (float32's sums of squares
  overflow), NaN at one coordinate only (a test attack, below); with SGD, whose uploads
  are not verified and reach the rules as they are, and with Adam and momentum, whose
  rule-abiding uploads of huge gradients pass verification;
- populations with more Byzantine clients sampled than assumed, every client Byzantine but
  one, and f assumed larger than the real count.

Each run ends in one of the documented ways: a rule whose precondition fails with fallback
``error`` refuses the configuration when the trainer is built; otherwise the run trains
every round with a finite state after each, or raises ``Diverged`` at the first round
whose state is not finite (or, at an evaluation, whose scores are not, or whose honest
uploads are not), never for a Byzantine upload alone: an honest client here overflows only
from a state that Byzantine values reached in an earlier round, finite but huge. The NumPy
oracle and Numba agree on the outcome and on every round's verification verdicts.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import pytest

from rfrs_ref.aggregate import RULES, PreconditionError
from rfrs_ref.attack.nonfinite import NonFinite
from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.trainer import (DIVERGED_REASONS, DIVERGED_STATE, DIVERGED_UPLOADS,
                                        Diverged, Trainer, first_non_finite)


# the NumPy oracle's recovery of a hostile upload, and the scores of a run that diverges,
# overflow as they should: what is checked is what the run does with them
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")


@dataclasses.dataclass(frozen=True)
class Hostile(NonFinite):
    """A test attack: every Byzantine row of every uploaded array gets ``kind`` (``1e38``,
    ``-3.4e38``: every value; ``nan1``: NaN at one coordinate, the honest upload elsewhere),
    written into the upload (``via_rule`` False, which breaks the update rule) or pushed as
    the gradient through the client rule (``via_rule`` True: the upload obeys the rule)."""

    kind: str = "1e38"
    via_rule: bool = False

    obeys_rule: ClassVar[bool] = False

    def _rewrite(self, row: np.ndarray) -> None:
        if self.kind == "nan1":
            row[row.size // 2] = np.nan
        else:
            row[:] = float(self.kind)

    def apply_inplace(self, ctx) -> dict:
        rows = ctx.byzantine_rows()
        if rows.size == 0:
            return {}
        if self.via_rule:
            G = np.array(ctx.grads[rows], dtype=np.float64)
            for g in G:
                self._rewrite(g)
            with np.errstate(over="ignore", invalid="ignore"):
                ctx.optimizer.client_rule_batch(ctx.state, G, ctx.t, ctx.uploads, ctx.backend,
                                                rows=rows)
        else:
            for U in ctx.uploads.values():
                for r in rows:
                    self._rewrite(U[r])
        return {"value": self.kind}


DATA = {"n_users": 40, "n_items": 30, "mean_items": 6.0}
#: 12 clients a round, 12 of the 40 Byzantine (3 to 5 a round), f = 3
BASE = dict(dataset_params=DATA, client_fraction=0.3, byzantine_fraction=0.3)
POPULATIONS = {
    "base": BASE,
    # 11 of the 12 clients Byzantine, every one sampled every round; f = 4
    "all-but-one": dict(dataset_params={"n_users": 12, "n_items": 30, "mean_items": 8.0},
                        client_fraction=1.0, byzantine_fraction=0.92, assumed_byzantine=0.4),
    # 4 of the 40 Byzantine, f = 5 of 12 assumed
    "f-too-large": dict(BASE, byzantine_fraction=0.1, assumed_byzantine=0.45),
}

#: (attack, attack_params) of the configuration, or a Hostile attack put in its place
SGD_ATTACKS = [("inf", {}), ("inf", {"value": "nan"}), ("noise", {"sigma": 1e38}),
               ("ipm", {"epsilon": 1e30}), ("alie", {"z": 1e30}), ("ascent", {}),
               Hostile(kind="1e38"), Hostile(kind="-3.4e38"), Hostile(kind="nan1")]
VERIFIED_ATTACKS = [("inf", {}), ("ipm", {"epsilon": 1e18}), Hostile(kind="1e38", via_rule=True),
                    Hostile(kind="nan1", via_rule=True)]


def config(rule, pre, detect, optimizer, attack, backend, population="base"):
    name, params = ("inf", {}) if isinstance(attack, Hostile) else attack
    takes = {f.name for f in dataclasses.fields(RULES.get(rule))}
    return TrainConfig(
        dataset="synthetic", model_params={"dim": 4}, rounds=3, eval_every=3,
        optimizer=optimizer, optimizer_params={"lr": 0.1} if optimizer == "sgd" else {},
        defense=rule, defense_params={"fallback": "reduce-f"} if "fallback" in takes else {},
        detect=detect, pre=pre, attack=name, attack_params=params, backend=backend,
        **POPULATIONS[population])


def outcome(cfg, attack):
    """What the run did: ``("config", message)``, ``("ok", verdicts)`` or ``("diverged",
    round, reason, verdicts)``, verdicts being each round's excluded clients (and the
    clients kept), checked against the rules of the module docstring."""
    try:
        trainer = Trainer(cfg)
    except PreconditionError as exc:  # documented: the rule refuses n and f before round 1
        return ("config", str(exc))
    if isinstance(attack, Hostile):
        trainer.attack = trainer.federation.attack = attack
    first_bad = []
    run_round = trainer.run_round

    def checked_round(state, t, buf, private=None):
        new, record = run_round(state, t, buf, private)
        if not first_bad and first_non_finite(new) is not None:
            first_bad.append(t)
        return new, record

    trainer.run_round = checked_round
    records = []
    try:
        result = trainer.run(progress=lambda t, rec, latest: records.append(rec))
    except Diverged as exc:
        assert exc.reason in DIVERGED_REASONS, exc.reason
        if exc.reason == DIVERGED_UPLOADS:
            # a Byzantine upload never ends a run: an honest one overflows only from a state
            # that Byzantine values reached in an earlier round (finite, but huge)
            assert exc.round > 1 and records[-1]["state_norms"]["theta"] > 1e18, str(exc)
        if first_bad:
            # a non-finite state ends the run at its round, never later
            assert (exc.round, exc.reason) == (first_bad[0], DIVERGED_STATE), str(exc)
        else:
            assert exc.reason != DIVERGED_STATE, str(exc)
        assert len(records) == exc.round - 1
        return ("diverged", exc.round, exc.reason, _verdicts(records))
    assert not first_bad, f"round {first_bad[0]}: a non-finite state, and the run went on"
    assert first_non_finite(result.state) is None
    assert len(records) == cfg.rounds
    assert all(np.isfinite(v) for rec in records for v in rec["state_norms"].values())
    return ("ok", _verdicts(records))


def _verdicts(records):
    return [([e["client"] for e in rec["excluded"]],
             [c for c, k in zip(rec["clients"], rec["kept"]) if k > 0]) for rec in records]


def _without_kept(out):
    """The outcome with the verification verdicts only: which clients a rule keeps among
    subsets tied in exact arithmetic (SMEA, with copied Byzantine rows) depends on
    rounding that the backends do not share (docs/aggregation.md)."""
    if out[0] == "config":
        return out
    return (*out[:-1], [excluded for excluded, _ in out[-1]])


RULE_NAMES = RULES.names()


@pytest.mark.parametrize("rule", RULE_NAMES)
def test_every_rule_survives_hostile_uploads_through_the_round_loop(rule):
    for pre in ((), ("nnm",)):
        for detect in ("gradient", "parameter"):
            for attack in SGD_ATTACKS:
                outcome(config(rule, pre, detect, "sgd", attack, "numba"), attack)
            for attack in VERIFIED_ATTACKS:
                out = outcome(config(rule, pre, detect, "adam", attack, "numba"), attack)
                if attack == ("inf", {}) and out[0] != "config":
                    # verification excludes every non-finite upload: nothing hostile is kept
                    assert out[0] == "ok", out
            outcome(config(rule, pre, detect, "momentum", Hostile(kind="-3.4e38", via_rule=True),
                           "numba"), Hostile(kind="-3.4e38", via_rule=True))


@pytest.mark.parametrize("population", ["all-but-one", "f-too-large"])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_every_rule_survives_hostile_populations(rule, population):
    for detect in ("gradient", "parameter"):
        for attack in (("inf", {"value": "nan"}), Hostile(kind="-3.4e38"), Hostile(kind="nan1")):
            outcome(config(rule, (), detect, "sgd", attack, "numba", population), attack)


@pytest.mark.parametrize("rule", RULE_NAMES)
def test_numpy_and_numba_agree_on_hostile_rounds(rule):
    for detect in ("gradient", "parameter"):
        for optimizer, attack in (("sgd", ("inf", {})), ("sgd", Hostile(kind="1e38")),
                                  ("sgd", Hostile(kind="nan1")),
                                  ("adam", ("noise", {"sigma": 1e38})),
                                  ("adam", Hostile(kind="1e38", via_rule=True))):
            a, b = (outcome(config(rule, (), detect, optimizer, attack, backend), attack)
                    for backend in ("numba", "numpy"))
            what = (rule, detect, optimizer, attack)
            if rule == "smea":
                assert _without_kept(a) == _without_kept(b), what
            else:
                assert a == b, what
