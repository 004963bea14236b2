"""A round whose rule weighs the clients by their features' distances (Krum, A-RFRS)
computes the rows the clients share once (``_shared_rows_compared_round``): the same
uploads, features, verdicts and weighted sums as the round that computes every row in
full, and distances within the kernel's rounding bound of that round's
(docs/performance.md, "Robust rounds on shared rows")."""

from __future__ import annotations

import numpy as np
import pytest

from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.round import run_round
from rfrs_ref.federated.trainer import Trainer
from rfrs_ref.kernels.distances import sq_dists_error

SMALL = dict(n_users=200, n_items=120, n_clusters=4, mean_items=10.0)
#: items enough that the rows of a round's clients are a small part of Q
WIDE = dict(n_users=200, n_items=1500, n_clusters=4, mean_items=10.0)


def _rounds(trainer, shared, rounds=4, full=False):
    buf = trainer.buffers(full=full, shared_rows=shared)
    state, private = trainer.initial_state()
    records = []
    for t in range(1, rounds + 1):
        state, rec = run_round(trainer.federation, state, t, buf, private)
        rec.pop("timing")
        records.append(rec)
    return state, records


def _derives(optimizer: str, detect: str) -> bool:
    """Whether a round on shared rows derives its features in the rules' kernels: θᵢ − θ̄
    for every optimiser, the recovered gradient for those whose recovery reads one
    uploaded array."""
    return detect == "parameter" or optimizer in ("sgd", "momentum", "adam")


def _full_and_shared(trainer, calls):
    """The 4 rounds on full rows, then the same rounds on shared rows (each of which must
    take the shared-rows path and return from it)."""
    assert trainer.federation.compares_shared_rows
    full = _rounds(trainer, shared=False)
    assert calls == {"called": 0, "returned": 0}
    shared = _rounds(trainer, shared=True)
    assert calls == {"called": 4, "returned": 4}
    return full, shared


def _same_but_scores(full, shared, label, D, dtype):
    """The states bit for bit; the records equal but for Krum's scores, which are within
    twice the distance kernel's bound of each other (each a sum of m distances)."""
    for k in full[0]:
        assert np.array_equal(full[0][k].view(np.uint8), shared[0][k].view(np.uint8)), (label, k)
    rel, ab = sq_dists_error(D, dtype)
    for a, b in zip(full[1], shared[1]):
        sa, sb = a["rule"].pop("scores"), b["rule"].pop("scores")
        m = a["rule"]["neighbours"]
        for x, y in zip(sa, sb):
            assert (x is None) == (y is None), label
            if x is not None:
                assert abs(x - y) <= 2 * (rel * max(x, y) + m * ab) * 1.01, (label, x, y)
        assert a == b, label


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "adagrad", "rmsprop"])
@pytest.mark.parametrize("detect", ["gradient", "parameter"])
@pytest.mark.parametrize("attack,negatives", [("none", 0), ("ascent", 0), ("ascent", 1),
                                              ("a-ra", 0)])
def test_the_round_on_shared_rows_gives_the_rounds_of_full_rows(optimizer, detect, attack,
                                                               negatives, calls):
    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                         model_params={"dim": 8, "negatives": negatives}, optimizer=optimizer,
                         defense="krum", detect=detect, attack=attack, byzantine_fraction=0.3,
                         verify=True, seed=7)
    trainer = Trainer(config)
    # the distances build θᵢ − θ̄, or SGD's, momentum's and Adam's recovered gradients, a
    # column block at a time: no feature rows
    assert (trainer.buffers().features is None) == _derives(optimizer, detect)
    full, shared = _full_and_shared(trainer, calls)
    if attack != "none":
        assert all(r["n_byzantine_sampled"] >= 3 for r in full[1])
    _same_but_scores(full, shared, (optimizer, detect, attack), trainer.model.n_params(),
                     np.dtype(config.dtype))


@pytest.mark.parametrize("params", [{"k": 1}, {"fallback": "mean"}, {"fallback": "reduce-f"}])
def test_classic_krum_and_the_fallbacks(params, calls):
    """Classic Krum (k = 1), and a precondition the round violates (f too large for 20
    clients: α = 0.45 gives f = 9, n > 2f + 2 fails) with either fallback."""
    alpha = 0.3 if "k" in params else 0.45
    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.1,
                         model_params={"dim": 8}, defense="krum", defense_params=params,
                         detect="gradient", attack="ascent", byzantine_fraction=alpha,
                         verify=True, seed=3)
    trainer = Trainer(config)
    full, shared = _rounds(trainer, shared=False), _rounds(trainer, shared=True)
    assert calls["returned"] == 4
    if "fallback" in params:
        assert all(r["rule"]["fallback"] is not None for r in full[1])
        for r in (*full[1], *shared[1]):
            r["rule"].setdefault("scores", [])
            r["rule"].setdefault("neighbours", 0)
    _same_but_scores(full, shared, params, trainer.model.n_params(), np.float32)


def test_an_upload_that_fails_verification_runs_the_round_in_full(corrupt_one_upload, calls):
    """A part not certainly verified (here a client rule that writes NaN into one client's
    upload) sends the round to the path that holds every row, which excludes the upload
    as any round does."""
    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                         model_params={"dim": 8}, defense="krum", detect="gradient", seed=2)
    trainer = Trainer(config)
    full = _rounds(trainer, shared=False, rounds=2)
    shared = _rounds(trainer, shared=True, rounds=2)
    assert calls == {"called": 2, "returned": 0}
    for k in full[0]:
        assert np.array_equal(full[0][k].view(np.uint8), shared[0][k].view(np.uint8)), k
    assert full[1] == shared[1]
    assert all(len(r["excluded"]) >= 1 for r in shared[1])


def test_a_non_finite_feature_is_far_from_every_client(monkeypatch, calls):
    """A feature that is not finite although its upload is (a recovered gradient that
    overflows) makes its client infinitely far from all, as in the round on full rows:
    here one client's feature on P is set to +inf after the server's read (AdaGrad, whose
    round holds its recovered gradients: its recovery reads two arrays)."""
    from rfrs_ref.optim.adaptive import AdaGrad

    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                         model_params={"dim": 8}, optimizer="adagrad", defense="krum",
                         detect="gradient", attack="ascent", byzantine_fraction=0.2, seed=4)
    trainer = Trainer(config)
    assert not trainer.federation.derives_features
    n = trainer.buffers().n_max
    start = trainer.model.shared_block[0]
    honest = AdaGrad.features_verify_batch

    def overflowing(self, state, uploads, t, out, space="gradient", backend="numba", **kw):
        res = honest(self, state, uploads, t, out, space, backend, **kw)
        if out.shape[0] == n and out.shape[1] in (start, state["theta"].shape[0]):
            out[2, 5] = np.inf  # column 5 lies in P on both paths
        return res

    monkeypatch.setattr(AdaGrad, "features_verify_batch", overflowing)
    full, shared = _rounds(trainer, shared=False), _rounds(trainer, shared=True)
    assert calls["returned"] == 4
    for r in shared[1]:
        assert r["rule"]["nonfinite_clients"] == [2] and r["kept"][2] == 0
    _same_but_scores(full, shared, "inf feature", trainer.model.n_params(), np.float32)


def test_a_non_finite_derived_feature_is_far_from_every_client(monkeypatch, calls):
    """Where the features are derived in the kernels (Adam's ĝ from m), which clients'
    features are finite comes from ``derived_rows_finite`` on every part: a client it
    finds non-finite is infinitely far from all and kept nowhere."""
    from rfrs_ref.kernels import distances

    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                         model_params={"dim": 8}, defense="krum", detect="gradient",
                         attack="ascent", byzantine_fraction=0.2, seed=4)
    trainer = Trainer(config)
    assert trainer.federation.derives_features
    honest = distances.derived_rows_finite

    def overflowing(X, base, coef=None):
        ok = honest(X, base, coef)
        assert coef is not None and coef[0] == 0.9  # Adam's (m − β₁m̄)/(1 − β₁)
        ok[2] = False
        return ok

    monkeypatch.setattr(distances, "derived_rows_finite", overflowing)
    shared = _rounds(trainer, shared=True)
    assert calls["returned"] == 4
    for r in shared[1]:
        assert r["rule"]["nonfinite_clients"] == [2] and r["kept"][2] == 0


@pytest.mark.parametrize("kw", [
    dict(defense="caf"), dict(defense="cc"), dict(defense="krum", attack="noise"),
    dict(defense="krum", attack="camouflage"), dict(defense="krum", resilience=True),
    dict(defense="krum", trace=True), dict(defense="krum", pre=("nnm",)),
    dict(defense="krum", backend="numpy"), dict(defense="krum", model="fmf"),
    dict(defense="krum", verify=False), dict(defense="rfa", attack="a-ra")])
def test_which_rounds_compute_the_shared_rows_once(kw):
    base = dict(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                byzantine_fraction=0.2, detect="gradient")
    assert Trainer(TrainConfig(**base, defense="krum")).federation.compares_shared_rows
    assert Trainer(TrainConfig(**base, defense="krum", attack="ascent")).federation.compares_shared_rows
    assert Trainer(TrainConfig(**base, defense="krum", attack="a-ra")).federation.compares_shared_rows
    for rule in ("rfa", "trmean", "median", "meamed", "bulyan"):
        assert Trainer(TrainConfig(**base, defense=rule, attack="ascent")).federation.compares_shared_rows
    for rule in ("mda", "monna"):
        assert Trainer(TrainConfig(**{**base, "client_fraction": 0.05}, defense=rule,
                                   attack="ascent")).federation.compares_shared_rows
    assert not Trainer(TrainConfig(**{**base, **kw})).federation.compares_shared_rows


def test_the_trainer_holds_only_the_columns_where_clients_differ(calls):
    """``Trainer.buffers()`` of such a run holds n × |C| values per buffer, not n × D; a
    buffer too small for a round grows (here one started at P's columns only), and the
    rounds are those of full rows."""
    from rfrs_ref.federated.round import RoundBuffers

    config = TrainConfig(dataset="synthetic", dataset_params=WIDE, client_fraction=0.2,
                         model_params={"dim": 8}, defense="krum", detect="gradient",
                         attack="ascent", byzantine_fraction=0.3, verify=True, seed=9)
    trainer = Trainer(config)
    D = trainer.model.n_params()
    start = trainer.model.shared_block[0]
    buf = trainer.buffers()
    assert buf.compact and start < buf.uploads["theta"].shape[1] < D
    assert buf.features is None  # Adam's ĝ is derived from m in the rules' kernels
    assert not trainer.buffers(full=True).compact
    assert not trainer.buffers(full=True).shared_columns  # read row by row after a round
    assert not trainer.buffers(shared_rows=False).compact
    tiny = RoundBuffers(buf.n_max, D, buf.dtype, buf.names, columns=start)
    assert tiny.compact and tiny.uploads["theta"].shape[1] == start
    full = _rounds(trainer, shared=False)
    state, private = trainer.initial_state()
    records = []
    for t in range(1, 5):
        state, rec = run_round(trainer.federation, state, t, tiny, private)
        rec.pop("timing")
        records.append(rec)
    assert calls["returned"] == 4
    assert start < tiny.uploads["theta"].shape[1] <= D
    _same_but_scores(full, (state, records), "compact", D, np.float32)


@pytest.mark.parametrize("defense", ["krum", "trmean"])
def test_a_compact_round_that_fails_verification_holds_every_row(defense, corrupt_one_upload,
                                                                 calls):
    # (the trimmed mean's compact buffers hold no features; the round in full takes them)
    config = TrainConfig(dataset="synthetic", dataset_params=WIDE, client_fraction=0.2,
                         model_params={"dim": 8}, defense=defense, detect="parameter", seed=2)
    trainer = Trainer(config)
    # the round that falls back holds every row (RoundBuffers.full) and computes the
    # gradients a batch at a time, as the run's buffers of every column do: the
    # corruption then hits the same clients
    full = _rounds(trainer, shared=False, rounds=2)
    buf = trainer.buffers()
    assert buf.compact
    state, private = trainer.initial_state()
    records = []
    for t in (1, 2):
        state, rec = run_round(trainer.federation, state, t, buf, private)
        rec.pop("timing")
        records.append(rec)
    assert calls == {"called": 2, "returned": 0}
    for k in full[0]:
        assert np.array_equal(full[0][k], state[k]), k
    assert full[1] == records


@pytest.mark.parametrize("rule", ["mda", "monna"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adagrad"])
@pytest.mark.parametrize("detect", ["gradient", "parameter"])
@pytest.mark.parametrize("attack", ["none", "ascent", "a-ra"])
def test_mda_and_monna_on_shared_rows_give_the_rounds_of_full_rows(rule, optimizer, detect,
                                                                     attack, calls):
    """MDA's subset, MoNNA's nearest neighbours of the pivot, from the distances by parts:
    the states of the rounds on full rows bit for bit, the records equal but for the
    distances they report (MDA's diameter, MoNNA's from the pivot), within the distance
    kernel's bound."""
    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.05,
                         model_params={"dim": 8}, optimizer=optimizer, defense=rule,
                         detect=detect, attack=attack, byzantine_fraction=0.3, verify=True,
                         seed=7)
    trainer = Trainer(config)
    full, shared = _full_and_shared(trainer, calls)
    for k in full[0]:
        assert np.array_equal(full[0][k].view(np.uint8), shared[0][k].view(np.uint8)), k
    rel, ab = sq_dists_error(trainer.model.n_params(), np.dtype(config.dtype))
    reported = "diameter" if rule == "mda" else "distances"
    for a, b in zip(full[1], shared[1]):
        for x, y in zip(np.ravel(a["rule"].pop(reported)), np.ravel(b["rule"].pop(reported))):
            x, y = float(x) ** 2, float(y) ** 2  # finite: no client here is far from all
            assert abs(x - y) <= 2 * (rel * max(x, y) + ab) * 1.01, (x, y)
        assert a == b
    if attack != "none":
        assert any(r["n_byzantine_sampled"] for r in full[1])


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adagrad"])
@pytest.mark.parametrize("detect", ["gradient", "parameter"])
@pytest.mark.parametrize("attack", ["none", "ascent"])
def test_rfa_on_shared_rows_takes_the_weights_of_full_rows(optimizer, detect, attack, calls):
    """RFA's Weiszfeld steps on the distances by parts (float64 differences, their bound
    handed to the steps' certainty test): from the same state, each round's weights are
    those of the round on full rows to 1e-9 relative (the matrices differ in their last
    bits), and everything else in the record is the same; a round whose steps need the
    rows themselves runs on full rows."""
    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                         model_params={"dim": 8}, optimizer=optimizer, defense="rfa",
                         detect=detect, attack=attack, byzantine_fraction=0.3, verify=True,
                         seed=7)
    trainer = Trainer(config)
    assert trainer.federation.compares_shared_rows
    full, shared = trainer.buffers(shared_rows=False), trainer.buffers()
    assert (shared.features is None) == _derives(optimizer, detect)
    state, _ = trainer.initial_state()
    for t in range(1, 6):
        a, ra = run_round(trainer.federation, state, t, full)
        b, rb = run_round(trainer.federation, state, t, shared)
        for r in (ra, rb):
            r.pop("timing")
        wa, wb = np.array(ra.pop("weights")), np.array(rb.pop("weights"))
        np.testing.assert_allclose(wb, wa, rtol=1e-9, atol=1e-15)
        da, db = ra.pop("rule"), rb.pop("rule")
        np.testing.assert_allclose(db["objective"], da["objective"], rtol=1e-9)
        assert (da["iterations"], da["converged"]) == (db["iterations"], db["converged"])
        ra.pop("state_norms"), rb.pop("state_norms")
        assert ra == rb
        for k in a:
            np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-7)
        state = a
    assert calls["called"] == 5 and calls["returned"] >= 3


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adagrad", "rmsprop"])
@pytest.mark.parametrize("detect", ["gradient", "parameter"])
@pytest.mark.parametrize("rule,attack,negatives", [
    ("trmean", "none", 0), ("trmean", "ascent", 0), ("trmean", "ascent", 1),
    ("median", "ascent", 0), ("meamed", "none", 0), ("meamed", "ascent", 0),
    ("meamed", "ascent", 1), ("bulyan", "none", 0), ("bulyan", "ascent", 0),
    ("bulyan", "ascent", 1), ("trmean", "a-ra", 0), ("median", "a-ra", 0), ("meamed", "a-ra", 0),
    ("bulyan", "a-ra", 0)])
def test_coordinatewise_rounds_on_shared_rows_are_the_rounds_of_full_rows(
        optimizer, detect, rule, attack, negatives, calls):
    """The trimmed mean, the median and Meamed combine each column from its own ranks, and
    on the shared rows from the one or two class values with the kernel's own operations;
    Bulyan does so among the clients it selects by the distances (by parts: here no Krum
    score of its selection came within their rounding of another): the states and
    records of the round on full rows, bit for bit."""
    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                         model_params={"dim": 8, "negatives": negatives}, optimizer=optimizer,
                         defense=rule, detect=detect, attack=attack,
                         byzantine_fraction=0.2 if rule == "bulyan" else 0.3,
                         verify=True, seed=5)
    trainer = Trainer(config)
    assert trainer.federation.compares_shared_rows
    # the features θᵢ − θ̄ (or an affine recovery ĝᵢ) are computed in the rules'
    # kernels: the round holds no feature rows
    derives = _derives(optimizer, detect)
    assert trainer.federation.derives_features == derives
    assert (trainer.buffers().features is None) == derives
    assert trainer.buffers(shared_rows=False).features is not None
    full = _rounds(trainer, shared=False)
    shared = _rounds(trainer, shared=True)
    assert calls == {"called": 4, "returned": 4}
    for k in full[0]:
        assert np.array_equal(full[0][k].view(np.uint8), shared[0][k].view(np.uint8)), k
    assert full[1] == shared[1]
