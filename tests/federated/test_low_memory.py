"""Robust rounds in low memory (``Trainer(low_memory=True)``): the uploads held a batch of
clients at a time, the features and verdicts built batch by batch, the rule's weights
taken from the features, and the weighted clients' uploads computed a second time for the
sums. The same server states and records as the rounds that hold every upload, bit for
bit, on full rows and on the columns where clients differ when the rows they share are
computed once (docs/performance.md, "Robust rounds in low memory")."""

from __future__ import annotations

import numpy as np
import pytest

from rfrs_ref.aggregate.combine import add_rows_inplace, combine_rows
from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.round import GRADIENT_BATCH, RoundBuffers, run_round
from rfrs_ref.federated.trainer import Trainer

SMALL = dict(n_users=200, n_items=120, n_clusters=4, mean_items=10.0)
#: items enough that the rows of a round's clients are a small part of FISM's Q
WIDE = dict(n_users=200, n_items=1500, n_clusters=4, mean_items=10.0)


def _rounds(trainer, buf, rounds=3):
    state, private = trainer.initial_state()
    records = []
    for t in range(1, rounds + 1):
        state, rec = run_round(trainer.federation, state, t, buf, private)
        rec.pop("timing")
        records.append(rec)
    return state, records


def _rows(trainer, rows):
    full = trainer.buffers(full=True, shared_rows=False)
    return RoundBuffers(full.n_max, full.n_params, full.dtype, full.names,
                        features=full.features is not None, grad_rows=rows, upload_rows=rows)


def _same(a, b, label):
    for k in a[0]:
        assert np.array_equal(a[0][k].view(np.uint8), b[0][k].view(np.uint8)), (label, k)
    assert a[1] == b[1], label


def _trainer(**kw):
    base = dict(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                model_params={"dim": 8}, seed=4)
    return Trainer(TrainConfig(**{**base, **kw}), low_memory=True)


@pytest.mark.parametrize("defense", ["krum", "rfa", "mda", "monna", "caf", "smea"])
@pytest.mark.parametrize("detect", ["gradient", "parameter"])
def test_every_rule_that_combines_by_weights(defense, detect):
    # SMEA searches C(n, f) subsets: f = 2 of 40 keeps it to 780
    trainer = _trainer(defense=defense, detect=detect, attack="ascent", byzantine_fraction=0.2,
                       assumed_byzantine=0.05 if defense == "smea" else None,
                       defense_params={"fallback": "reduce-f"})
    assert trainer.federation.recomputes_uploads
    full = _rounds(trainer, trainer.buffers(full=True, shared_rows=False))
    for rows in (4, 16):
        _same(full, _rounds(trainer, _rows(trainer, rows)), (defense, detect, rows))


@pytest.mark.parametrize("optimizer", ["momentum", "adam", "adagrad", "rmsprop"])
@pytest.mark.parametrize("attack,negatives", [("none", 1), ("ascent", 0), ("camouflage", 1)])
def test_every_optimiser_and_attack_in_the_client_rule(optimizer, attack, negatives):
    if attack == "camouflage" and optimizer != "adam":
        pytest.skip("camouflage is defined for Adam")
    trainer = _trainer(defense="krum", optimizer=optimizer, attack=attack,
                       byzantine_fraction=0.0 if attack == "none" else 0.3,
                       model_params={"dim": 8, "negatives": negatives})
    assert trainer.federation.recomputes_uploads
    _same(_rounds(trainer, trainer.buffers(full=True, shared_rows=False)),
          _rounds(trainer, _rows(trainer, GRADIENT_BATCH)), (optimizer, attack))
    # classic Krum: one client weighed, recomputed alone
    one = _trainer(defense="krum", defense_params={"k": 1}, optimizer=optimizer, attack=attack,
                   byzantine_fraction=0.0 if attack == "none" else 0.3)
    _same(_rounds(one, one.buffers(full=True, shared_rows=False)), _rounds(one, _rows(one, 8)), "k=1")


def test_an_upload_that_fails_verification_is_excluded_as_when_held(corrupt_by_gradient):
    trainer = _trainer(defense="krum", attack="ascent", byzantine_fraction=0.2)
    full = _rounds(trainer, trainer.buffers(full=True, shared_rows=False))
    low = _rounds(trainer, _rows(trainer, 16))
    _same(full, low, "corrupt")
    excluded = [e for rec in low[1] for e in rec["excluded"]]
    assert excluded and all(e["check"] == "nonfinite" for e in excluded)


@pytest.mark.parametrize("defense,detect", [("krum", "gradient"), ("krum", "parameter"),
                                            ("rfa", "gradient"), ("rfa", "parameter"),
                                            ("mda", "gradient"), ("mda", "parameter"),
                                            ("monna", "gradient"), ("monna", "parameter")])
@pytest.mark.parametrize("optimizer,negatives", [("sgd", 0), ("adam", 0), ("adagrad", 1),
                                                 ("rmsprop", 0)])
def test_low_memory_on_shared_rows_is_the_round_that_holds_them(defense, detect, optimizer,
                                                                negatives, calls):
    """A run whose rounds compute the rows the clients share once (FISM), in low memory:
    the features of n clients and the uploads of 16 on the columns where clients differ
    (``Trainer.buffers``), the weighed clients' uploads there computed again; the states
    and records of the same rounds holding n uploads, bit for bit."""
    kw = dict(defense=defense, detect=detect, optimizer=optimizer, dataset_params=WIDE,
              model_params={"dim": 8, "negatives": negatives}, attack="ascent",
              byzantine_fraction=0.3, verify=True,
              # MDA's C(40, 12) subsets are beyond its cap: it searches C(40, 6)
              defense_params={"fallback": "reduce-f"} if defense == "mda" else {})
    low = _trainer(**kw)
    held = Trainer(low.config)
    assert low.federation.recomputes_uploads and low.federation.compares_shared_rows
    buf, held_buf = low.buffers(), held.buffers()
    assert buf.compact and buf.uploads["theta"].shape == (GRADIENT_BATCH, buf.features.shape[1])
    assert buf.features.shape[0] == 40
    # held on parameters, or on gradients recovered from one array (SGD, momentum, Adam),
    # the rounds hold the uploads and no features (``Federation.derives_features``): low
    # memory holds less where more than one array is uploaded, SGD's n + 16 rows against n
    derives = detect == "parameter" or optimizer in ("sgd", "momentum", "adam")
    assert (held_buf.features is None) == derives
    assert (buf.nbytes < held_buf.nbytes) == (not derives or optimizer != "sgd")
    want = _rounds(held, held_buf)
    assert calls == {"called": 3, "returned": 3}
    _same(want, _rounds(low, buf), (defense, detect, optimizer))
    assert calls == {"called": 6, "returned": 6}


def test_low_memory_on_shared_rows_falls_back_to_low_memory_on_full_rows(corrupt_by_gradient,
                                                                        calls):
    """A part not certainly verified sends the round to the low-memory round on full rows
    (uploads of a batch at a time still), which excludes the upload as any round does."""
    low = _trainer(defense="krum", dataset_params=WIDE, attack="ascent", byzantine_fraction=0.2)
    buf = low.buffers()
    assert buf.compact
    got = _rounds(low, buf)
    assert calls == {"called": 3, "returned": 0}
    _same(_rounds(low, _rows(low, GRADIENT_BATCH)), got, "fallback")
    assert all(rec["excluded"] for rec in got[1])


def test_the_trainer_recomputes_only_where_the_result_cannot_change():
    assert _trainer(defense="krum").buffers().uploads["theta"].shape[0] == GRADIENT_BATCH
    for kw in (dict(defense="trmean"), dict(defense="median"), dict(defense="bulyan"),
               dict(defense="krum", attack="noise", byzantine_fraction=0.2),
               dict(defense="krum", resilience=True), dict(defense="krum", verify=False),
               dict(defense="krum", model="fmf"), dict(defense="cc"),
               dict(defense="krum", pre=("clip",))):
        t = _trainer(**kw)
        assert not t.federation.recomputes_uploads, kw
        assert t.buffers().uploads["theta"].shape[0] == 40, kw
    # without low_memory nothing changes
    t = Trainer(TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                            defense="krum"))
    assert not t.federation.recomputes_uploads
    assert t.buffers().uploads["theta"].shape[0] == 40


@pytest.mark.parametrize("kw", [
    dict(defense="krum"), dict(defense="rfa", detect="parameter"), dict(defense="smea"),
    dict(defense="krum", attack="ascent", byzantine_fraction=0.2),
    dict(defense="krum", attack="camouflage", byzantine_fraction=0.2),
    dict(defense="trmean"), dict(defense="median"), dict(defense="bulyan"), dict(defense="cc"),
    dict(defense="krum", attack="noise", byzantine_fraction=0.2),
    dict(defense="krum", resilience=True), dict(defense="krum", verify=False),
    dict(defense="krum", model="fmf"), dict(defense="krum", pre=("clip",)), dict(),
    dict(defense="krum", backend="numpy")])
def test_the_sweeps_estimate_asks_the_trainers_own_question(kw):
    """A sweep's memory estimate decides without the data whether a run recomputes its
    uploads: the same answer as the trainer's federation, built from the same objects."""
    from rfrs_ref.federated.round import rounds_recompute_uploads

    c = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2, **kw)
    assert rounds_recompute_uploads(c) == Trainer(c, low_memory=True).federation.recomputes_uploads


@pytest.mark.parametrize("batch", [4, 8, 16])
def test_sums_in_batches_of_four_rows_are_combine_rows(batch):
    """add_rows_inplace over consecutive batches (a multiple of four rows each but the
    last) gives combine_rows's float64 sums, bit for bit; a batch of three rows changes
    the grouping, and the test can tell."""
    rng = np.random.default_rng(0)
    A = (rng.standard_normal((23, 5000)) * rng.lognormal(0, 3, (23, 1))).astype(np.float32)
    w = rng.random(23)
    acc = np.zeros(5000)
    for lo in range(0, 23, batch):
        add_rows_inplace(A[lo:lo + batch], w[lo:lo + batch], acc)
    ref = combine_rows(A, w)
    assert np.array_equal(acc.astype(np.float32).view(np.uint32), ref.view(np.uint32))
    three = np.zeros(5000)
    for lo in range(0, 23, 3):
        add_rows_inplace(A[lo:lo + 3], w[lo:lo + 3], three)
    assert not np.array_equal(three, acc)
    with pytest.raises(ValueError, match="float64"):
        add_rows_inplace(A, w, np.zeros(5000, dtype=np.float32))
