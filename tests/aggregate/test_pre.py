"""Pre-aggregators: known answers, their laws, how the uploads follow, hostile input,
agreement of the backends, and ByzFL 0.0.11 where it has them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.aggregate import PRE, RULES, PreAggregated, PreconditionError
from rfrs_ref.aggregate.base import FiniteUploads
from rfrs_ref.aggregate.pre import ARC, NNM, Bucketing, Clip, build, row_norms, row_norms_numpy
from rfrs_ref.kernels.distances import pairwise_sq_dists_numpy
from rfrs_ref.kernels.mixing import mix_rows, mix_rows_numpy

HOSTILE = [np.nan, np.inf, -np.inf, 1e38, -1e38, 3.4e38]
CPU = ["numpy", "numba"]


def _run(pre, rule, X, arrays=None, ns=None, f=0, backend="numpy", reference=None, seed=0):
    n = X.shape[0]
    arrays = {"x": X} if arrays is None else arrays
    return PreAggregated(tuple(pre), RULES.get(rule)()).aggregate(
        X, arrays, np.ones(n) if ns is None else ns, f, backend=backend, reference=reference,
        rng=np.random.default_rng(seed))


def test_registry_and_build():
    assert PRE.names() == ["nnm", "bucketing", "clip", "arc"]
    krum = RULES.get("krum")()
    assert build([], {}, krum) is krum
    p = build(["clip", "nnm"], {"clip_norm": 2.5}, krum)
    assert [s.name for s in p.pre] == ["clip", "nnm"] and p.pre[0].clip_norm == 2.5
    assert p.name == "krum" and p.fallback == "error" and not p.coordinatewise


# -- known answers -------------------------------------------------------------------------

@pytest.mark.parametrize("backend", CPU)
def test_nnm_known_answer(backend):
    X = np.array([[0.0], [1.0], [3.0], [10.0]])
    ns = np.array([1.0, 1.0, 2.0, 1.0])
    # f = 1: each row mixes its 3 nearest (itself first), nᵢ-weighted
    res = _run([NNM()], "mean", X, ns=ns, f=1, backend=backend)
    # rows 0, 1 and 2 mix {0, 1, 3}; row 3 mixes {10, 3, 1}
    mixed = np.array([(0 + 1 + 2 * 3) / 4, (0 + 1 + 2 * 3) / 4, (0 + 1 + 2 * 3) / 4,
                      (1 + 2 * 3 + 10) / 4])
    np.testing.assert_allclose(res.arrays["x"], [(ns @ mixed) / ns.sum()], rtol=1e-15)
    # the identity of the weights: Σ wᵢ xᵢ over the original rows is the aggregate
    np.testing.assert_allclose(res.weights @ X, res.arrays["x"], rtol=1e-14)


def test_bucketing_then_mean_is_the_mean_and_buckets_follow_the_generator():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(7, 4))
    ns = rng.integers(1, 9, size=7).astype(float)
    for s in (1, 2, 3, 7, 9):
        res = _run([Bucketing(bucket_size=s)], "mean", X, ns=ns, seed=3)
        np.testing.assert_allclose(res.arrays["x"], ns @ X / ns.sum(), rtol=1e-14)
        buckets = res.diagnostics["pre"][0]["buckets"]
        perm = np.random.default_rng(3).permutation(7)
        assert buckets == [sorted(perm[b * s:(b + 1) * s].tolist()) for b in range(-(-7 // s))]
    with pytest.raises(ValueError, match="needs the round's random generator"):
        PreAggregated((Bucketing(),), RULES.get("mean")()).aggregate(X, {"x": X}, ns, 0)


@pytest.mark.parametrize("backend", CPU)
def test_clip_and_arc_known_answers(backend):
    X = np.array([[3.0, 4.0], [0.3, 0.4], [6.0, 8.0], [0.0, 1.0], [0.0, 2.0]])
    res = _run([Clip(clip_norm=1.0)], "mean", X, backend=backend, reference={})
    expect = X * np.minimum(1, 1 / np.linalg.norm(X, axis=1))[:, None]
    np.testing.assert_allclose(res.arrays["x"], expect.mean(axis=0), rtol=1e-15)
    # ARC, n = 5, f = 1: k = ⌊2·1·4/5⌋ = 1; the largest (norm 10) to the second (norm 5)
    res = _run([ARC()], "mean", X, f=1, backend=backend)
    assert res.diagnostics["pre"][0]["clipped"] == [2] and res.diagnostics["pre"][0]["threshold"] == 5.0
    Y = X.copy()
    Y[2] = [3.0, 4.0]
    np.testing.assert_allclose(res.arrays["x"], Y.mean(axis=0), rtol=1e-15)
    # f = 2: k = ⌊2·2·3/5⌋ = 2, threshold the third largest norm (2)
    res = _run([ARC()], "mean", X, f=2, backend=backend)
    assert res.diagnostics["pre"][0]["clipped"] == [0, 2] and res.diagnostics["pre"][0]["threshold"] == 2.0


def test_preconditions_and_hyperparameters():
    with pytest.raises(ValueError, match="bucket_size must be an integer ≥ 1"):
        Bucketing(bucket_size=0)
    with pytest.raises(ValueError, match="clip_norm must be a finite number > 0"):
        Clip(clip_norm=float("inf"))
    with pytest.raises(PreconditionError, match="nnm needs f < n"):
        PreAggregated((NNM(),), RULES.get("mean")()).check(3, 3)
    # the rule's precondition on what bucketing outputs: n′ = 5 rows, f′ = 2
    with pytest.raises(PreconditionError, match=r"krum needs n > 2f \+ 2, but n=5 and f=2"):
        PreAggregated((Bucketing(bucket_size=2),), RULES.get("krum")()).check(10, 2)
    PreAggregated((Bucketing(bucket_size=2),), RULES.get("krum")()).check(10, 1)


# -- laws ----------------------------------------------------------------------------------

def _byzantine(seed, n_honest, f, D, data):
    rng = np.random.default_rng(seed)
    n = n_honest + f
    X = rng.normal(size=(n, D)) * rng.choice([1e-3, 1.0, 1e3])
    byz = rng.permutation(n)[:f]
    for i in byz:
        kind = data.draw(st.sampled_from(["constant", "near", "coordinate", "huge"]))
        if kind == "constant":
            X[i] = data.draw(st.sampled_from(HOSTILE))
        elif kind == "near":
            X[i] = X[np.setdiff1d(np.arange(n), byz)].max(axis=0) + 0.1
        elif kind == "huge":
            X[i] *= 1e30
        else:
            X[i, rng.integers(D)] = data.draw(st.sampled_from(HOSTILE))
    return X, np.setdiff1d(np.arange(n), byz), rng


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.integers(1, 9), st.integers(1, 6), st.data())
def test_nnm_law_mixed_honest_rows_stay_within_the_honest_diameter(seed, n_honest, D, data):
    f = data.draw(st.integers(0, n_honest - 1))
    X, honest, rng = _byzantine(seed, n_honest, f, D, data)
    backend = data.draw(st.sampled_from(CPU))
    n = X.shape[0]
    mx = NNM().mixing(X, rng.integers(1, 9, size=n).astype(float), f,
                      np.isfinite(X).all(axis=1), None, backend)
    Xm = mix_rows(mx.matrix, X, backend=backend)
    delta = np.sqrt(pairwise_sq_dists_numpy(X[honest]).max())
    for i in honest:
        assert np.isfinite(Xm[i]).all()
        assert np.linalg.norm(Xm[i] - X[i]) <= delta * (1 + 1e-9) + 1e-12 * np.abs(X[honest]).max()
    np.testing.assert_allclose(mx.matrix.sum(axis=1), 1.0, rtol=1e-15)


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.integers(2, 12), st.integers(1, 6), st.data())
def test_clip_and_arc_laws(seed, n, D, data):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)) * rng.choice([1e-3, 1.0, 1e3], size=(n, 1))
    if data.draw(st.booleans()):
        X[rng.integers(n)] = data.draw(st.sampled_from(HOSTILE))
    backend = data.draw(st.sampled_from(CPU))
    ok = np.isfinite(X).all(axis=1)
    C = data.draw(st.sampled_from([1e-3, 1.0, 100.0]))
    mx = Clip(clip_norm=C).mixing(X, np.ones(n), 0, ok, None, backend)
    Y = mix_rows(mx.matrix, X, np.zeros(D), backend=backend)
    norms = np.linalg.norm(X, axis=1)
    for i in np.flatnonzero(ok):
        assert np.linalg.norm(Y[i]) <= C * (1 + 1e-12)
        if norms[i] <= C:
            np.testing.assert_array_equal(Y[i], X[i])
    f = data.draw(st.integers(0, n - 1))
    mx = ARC().mixing(X, np.ones(n), f, ok, None, backend)
    s = np.diagonal(mx.matrix)
    k = (2 * f * (n - f)) // n
    assert (s <= 1).all() and (s < 1).sum() <= k
    finite_norms = np.sort(np.where(ok, norms, np.inf))
    cap = finite_norms[n - k - 1]
    for i in np.flatnonzero(ok):
        assert s[i] * norms[i] <= cap * (1 + 1e-12)


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.integers(3, 12), st.data())
def test_uploads_follow_the_features(seed, n, data):
    """θ′ − θ̄ is exactly the pre-aggregated feature (parameter space), for every
    pre-aggregator and chain; a mixed v stays ≥ 0."""
    rng = np.random.default_rng(seed)
    D = 5
    theta_bar = rng.normal(size=D)
    X = rng.normal(size=(n, D)) * rng.choice([1e-2, 1.0, 10.0])
    theta = theta_bar + X
    v = np.abs(rng.normal(size=(n, D)))
    v_bar = np.abs(rng.normal(size=D))
    names = data.draw(st.lists(st.sampled_from(PRE.names()), min_size=1, max_size=3))
    f = data.draw(st.integers(0, (n - 1) // 2))
    backend = data.draw(st.sampled_from(CPU))
    p = build(names, {"clip_norm": 1.0, "bucket_size": 2}, RULES.get("mean")())
    res = p.aggregate(X, {"x": X, "theta": theta, "v": v}, np.ones(n), f, backend=backend,
                      reference={"theta": theta_bar, "v": v_bar}, rng=np.random.default_rng(seed))
    np.testing.assert_allclose(res.arrays["theta"] - theta_bar, res.arrays["x"],
                               atol=1e-12 * (1 + np.abs(theta).max()))
    assert (res.arrays["v"] >= 0).all()
    assert res.weights.min() >= 0 and abs(res.weights.sum() - 1) < 1e-12


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 5, 12, 47, 49, 60]),
       st.integers(1, 2000), st.data())
def test_backends_agree(seed, n, D, data):
    """Both block widths of the fast path (up to 48 rows and beyond), any count of
    non-zero weights (the terms four at a time and the rest), hostile values, −0."""
    rng = np.random.default_rng(seed)
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    A = (rng.normal(size=(n, D)) * 10).astype(dtype)
    if data.draw(st.booleans()):
        A[rng.integers(n), rng.integers(D)] = data.draw(st.sampled_from(HOSTILE))
    if data.draw(st.booleans()):
        A[:, rng.integers(D)] = -0.0
    M = rng.random((data.draw(st.integers(1, 12)), n)) * (rng.random((1, n)) < 0.7)
    M[:, 0] += 0.1  # no empty row
    M /= M.sum(axis=1, keepdims=True)
    S = rng.normal(size=D) if data.draw(st.booleans()) else None
    if data.draw(st.booleans()):
        M[rng.integers(M.shape[0])] = 0.0  # an empty row: S, or 0
        S = rng.normal(size=D)
    if data.draw(st.booleans()):
        # rows repeated in any order (NNM's honest rows sharing one neighbour set): each
        # distinct row is summed once and copied; a copy's first occurrence may come later
        M = M[rng.integers(M.shape[0], size=data.draw(st.integers(2, 14)))]
    a = mix_rows_numpy(M, A, S)
    b = mix_rows(M, A, S, backend="numba")
    assert a.dtype == b.dtype == A.dtype
    # the fast path adds the oracle's terms in the oracle's order: the same bits
    np.testing.assert_array_equal(b, a)
    both = ~np.isnan(a)
    np.testing.assert_array_equal(np.signbit(b[both]), np.signbit(a[both]))
    np.testing.assert_allclose(row_norms(A), row_norms_numpy(A), rtol=1e-12)
    d = np.diag(rng.random(n))
    np.testing.assert_array_equal(mix_rows(d, A, np.zeros(D)), mix_rows_numpy(d, A, np.zeros(D)))


def test_equal_rows_of_the_matrix_are_summed_once_and_copied():
    from rfrs_ref.kernels import mixing

    rng = np.random.default_rng(5)
    A = rng.normal(size=(7, 5000)).astype(np.float32)
    A[6, 17] = np.nan  # a row no other row mixes in
    M = rng.random((3, 7))
    M[:, 6] = 0.0
    M /= M.sum(axis=1, keepdims=True)
    M = np.vstack([M, np.eye(7)[6]])[[2, 0, 2, 1, 0, 3, 2]]
    M[4, 3] = -0.0 if M[4, 3] == 0 else M[4, 3]
    first, group = mixing.distinct_rows(M)
    assert first.tolist() == [0, 1, 3, 5] and group.tolist() == [0, 1, 0, 2, 1, 3, 0]
    S = rng.normal(size=5000)
    out = mix_rows(M, A, S, out=np.full((7, 5000), np.inf, dtype=np.float32))
    np.testing.assert_array_equal(out.view(np.uint32), mix_rows_numpy(M, A, S).view(np.uint32))
    assert np.isnan(out[5, 17]) and np.isfinite(np.delete(out, 5, axis=0)).all()
    # a row differing from another only by the sign of a zero weight is summed on its own
    M2 = np.vstack([M[0], M[0]])
    M2[1, 6] = -0.0
    assert mixing.distinct_rows(M2)[0].tolist() == [0, 1]
    np.testing.assert_array_equal(mix_rows(M2, A, S), mix_rows_numpy(M2, A, S))


def test_mix_rows_writes_into_out_only_when_it_fits():
    rng = np.random.default_rng(3)
    A = rng.normal(size=(6, 300)).astype(np.float32)
    for M in (np.diag(rng.random(6)), np.full((3, 6), 1 / 6), np.eye(6)[[0, 2]] / 1.0):
        want = mix_rows(M, A, np.zeros(300))
        out = np.full((M.shape[0], 300), np.nan, dtype=np.float32)
        got = mix_rows(M, A, np.zeros(300), out=out)
        assert got is out and np.array_equal(got, want)
        for bad in (np.empty((M.shape[0], 300)), np.empty((M.shape[0] + 1, 300), np.float32),
                    A[: M.shape[0]]):  # float64, wrong shape, or A itself: a new array
            res = mix_rows(M, A, np.zeros(300), out=bad)
            assert res is not bad and np.array_equal(res, want)


@pytest.mark.parametrize("names", [["clip"], ["nnm"], ["clip", "nnm"], ["bucketing"]])
def test_kept_buffers_give_the_same_answers_call_after_call(names):
    """A PreAggregated keeps its mixed arrays between calls: results equal a fresh
    instance's whatever the previous call's shapes, and no caller's array is written."""
    rng = np.random.default_rng(7)
    kept = build(names, {"clip_norm": 3.0}, RULES.get("mda")())
    for n, D, dtype in ((12, 50, np.float32), (12, 50, np.float32), (15, 80, np.float64),
                        (12, 50, np.float32)):
        X = rng.normal(size=(n, D)).astype(dtype)
        arrays = {"theta": rng.normal(size=(n, D)).astype(dtype), "x": X}
        copies = {k: v.copy() for k, v in arrays.items()}
        ref = {"theta": rng.normal(size=D), "x": np.zeros(D)}
        fresh = build(names, {"clip_norm": 3.0}, RULES.get("mda")())
        a = kept.aggregate(X, arrays, np.ones(n), 2, reference=ref, rng=np.random.default_rng(1))
        b = fresh.aggregate(X, arrays, np.ones(n), 2, reference=ref, rng=np.random.default_rng(1))
        for k in a.arrays:
            assert np.array_equal(a.arrays[k], b.arrays[k]) and a.arrays[k].dtype == dtype
        np.testing.assert_array_equal(a.weights, b.weights)
        for k in arrays:
            assert np.array_equal(arrays[k], copies[k])
    assert kept == fresh  # the buffers are not part of the rule's identity


@pytest.mark.parametrize("rule", RULES.names())
def test_a_result_survives_the_next_call_of_the_same_instance(rule):
    """The kept mixed arrays are written again by the next call: no rule may hand back
    a view of them (the round loop keeps the aggregate as the next server state)."""
    rng = np.random.default_rng(11)
    n, D, f = 12, 40, 2
    p = build(["clip"], {"clip_norm": 3.0}, RULES.get(rule)())
    results = []
    for _ in range(3):
        X = rng.normal(size=(n, D)).astype(np.float32)
        arrays = {"theta": rng.normal(size=(n, D)).astype(np.float32), "x": X}
        ref = {"theta": rng.normal(size=D), "x": np.zeros(D)}
        try:
            res = p.aggregate(X, arrays, np.ones(n), f, backend="numba", reference=ref,
                              rng=np.random.default_rng(1))
        except PreconditionError:
            pytest.skip(f"{rule} needs more clients than {n} for f = {f}")
        results.append((res, {k: v.copy() for k, v in res.arrays.items()}))
    for res, copies in results:
        for k, v in copies.items():
            assert np.array_equal(res.arrays[k], v, equal_nan=True)


def _within_one_rounding(a, b, arrays, ref, dtype):
    """Result ``a``'s arrays are ``b``'s within one rounding u·max|A′| of the mixed rows
    (3u·(max|A| + max|S|)), in the uploads' dtype."""
    u = np.finfo(dtype).eps / 2
    for k in arrays:
        scale = np.abs(arrays[k]).max() + np.abs(ref[k]).max()
        assert a.arrays[k].dtype == dtype
        np.testing.assert_allclose(a.arrays[k], b.arrays[k], rtol=0, atol=3 * u * scale)


@pytest.mark.parametrize("names", [["clip"], ["arc"], ["nnm"], ["bucketing"], ["clip", "nnm"]])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_mean_behind_pre_aggregators_sums_the_rows_directly_within_one_rounding(names, dtype):
    """The fast path of a fixed-weight rule (the mean) sums Σ cᵢAᵢ, c = Mᵀw′, without
    writing the mixed rows: within one rounding u·max|A′| of the oracle, which rounds
    every mixed row first; same weights, kept and diagnostics."""
    rng = np.random.default_rng(11)
    n, D = 13, 700
    X = (rng.normal(size=(n, D)) * rng.uniform(0.5, 4, size=(n, 1))).astype(dtype)
    arrays = {"theta": (rng.normal(size=(n, D)) * 3).astype(dtype), "x": X}
    ref = {"theta": rng.normal(size=D), "x": np.zeros(D)}
    ns = rng.integers(1, 30, size=n).astype(float)
    rule = build(names, {"clip_norm": 25.0}, RULES.get("mean")())
    a = rule.aggregate(X, arrays, ns, 3, backend="numba", reference=ref,
                       rng=np.random.default_rng(2))
    b = rule.aggregate(X, arrays, ns, 3, backend="numpy", reference=ref,
                       rng=np.random.default_rng(2))
    _within_one_rounding(a, b, arrays, ref, dtype)
    np.testing.assert_allclose(a.weights, b.weights, rtol=1e-12)
    np.testing.assert_array_equal(a.kept, b.kept)
    assert set(a.diagnostics) == set(b.diagnostics)
    assert "features0" not in rule._buffers or len(names) > 1  # the last features: never mixed


def _reading_mixed_uploads(rule):
    """The same rule, made to read the mixed uploads (the path every rule took before the
    rules that combine by weights were summed directly)."""
    cls = type(rule)
    sub = type(f"Mixed{cls.__name__}", (cls,), {"combines_by_weights": False})
    return sub(**{f.name: getattr(rule, f.name) for f in dataclasses.fields(rule)})


BY_WEIGHTS = [r for r in RULES.names() if getattr(RULES.get(r), "combines_by_weights", False)
              and not getattr(RULES.get(r), "has_fixed_weights", False)]


@pytest.mark.parametrize("rule_name", BY_WEIGHTS)
@pytest.mark.parametrize("names", [["nnm"], ["clip"], ["bucketing"], ["clip", "nnm"]])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_rule_combining_by_weights_behind_pre_aggregators_sums_the_rows_directly(
        rule_name, names, dtype):
    """Krum, RFA, MDA, MoNNA, CAF, SMEA behind pre-aggregators read the mixed features only
    and sum Σ cᵢAᵢ, c = Mᵀw′, from the clients' rows: the same weights, kept rows and
    diagnostics as the rule reading the mixed uploads, bit for bit, and arrays within one
    rounding u·max|A′| of its (which rounds every mixed row first). No mixed upload is
    written."""
    assert {"krum", "rfa", "mda", "monna"} <= set(BY_WEIGHTS)
    rng = np.random.default_rng(5)
    n, D, f = 13, 500, 3
    X = (rng.normal(size=(n, D)) * rng.uniform(0.5, 4, size=(n, 1))).astype(dtype)
    arrays = {"theta": (rng.normal(size=(n, D)) * 3).astype(dtype),
              "m": rng.normal(size=(n, D)).astype(dtype), "x": X}
    ref = {"theta": rng.normal(size=D), "m": rng.normal(size=D), "x": np.zeros(D)}
    ns = rng.integers(1, 30, size=n).astype(float)
    inner = RULES.get(rule_name)()
    fast = build(names, {"clip_norm": 25.0}, inner)
    slow = build(names, {"clip_norm": 25.0}, _reading_mixed_uploads(inner))
    for uploads in (arrays, FiniteUploads(arrays)):
        try:
            a = fast.aggregate(X, uploads, ns, f, backend="numba", reference=ref,
                               rng=np.random.default_rng(2))
        except PreconditionError:
            pytest.skip(f"{rule_name} needs more clients than {n} for f = {f}")
        b = slow.aggregate(X, uploads, ns, f, backend="numba", reference=ref,
                           rng=np.random.default_rng(2))
        _within_one_rounding(a, b, arrays, ref, dtype)
        np.testing.assert_array_equal(a.weights, b.weights)
        np.testing.assert_array_equal(a.kept, b.kept)
        assert a.diagnostics == b.diagnostics
        assert not any(key.startswith("upload:") for key in fast._buffers)
        assert any(key.startswith("upload:") for key in slow._buffers)


@pytest.mark.parametrize("names", [["nnm"], ["clip"], ["clip", "nnm"], ["bucketing"]])
def test_mixed_uploads_of_checked_rows_go_to_the_rule_as_checked(names, monkeypatch):
    """Rows the caller checked finite (FiniteUploads), mixed with weights summing to at
    most 1 toward a finite reference, are finite: the coordinate-wise rule gets them as
    checked (it then reads only the features for NaN and ±inf). Unchecked rows, or a
    non-finite reference, are handed over unchecked; the aggregate is the same."""
    from rfrs_ref.aggregate.coordinate import Median

    seen = []
    real = Median.aggregate

    def spy(self, features, arrays, *a, **kw):
        seen.append(isinstance(arrays, FiniteUploads))
        return real(self, features, arrays, *a, **kw)

    monkeypatch.setattr(Median, "aggregate", spy)
    rng = np.random.default_rng(8)
    n, D = 11, 64
    X = rng.normal(size=(n, D)).astype(np.float32)
    U = {"theta": rng.normal(size=(n, D)).astype(np.float32)}
    ref = {"theta": rng.normal(size=D)}
    # every mixed row written out (equal rows are otherwise read once, by aggregate_copies)
    p = dataclasses.replace(build(names, {"clip_norm": 2.0}, RULES.get("median")()),
                            write_copies=True)
    out = [p.aggregate(X, uploads, np.ones(n), 2, reference=r, rng=np.random.default_rng(3))
           for uploads, r in ((FiniteUploads(U), ref), (dict(U), ref))]
    bad_ref = {"theta": np.where(np.arange(D) == 5, np.inf, ref["theta"])}
    p.aggregate(X, FiniteUploads(U), np.ones(n), 2, reference=bad_ref,
                rng=np.random.default_rng(3))
    stochastic = "clip" not in names
    assert seen == [True, False, stochastic]
    np.testing.assert_array_equal(out[0].arrays["theta"], out[1].arrays["theta"])


@pytest.mark.parametrize("rule_name", ["krum", "rfa"])
def test_a_mixed_row_holding_a_non_finite_client_is_read_as_it_is(rule_name):
    """Where a mixed row holds a client with a non-finite upload, the rule reads the
    mixed uploads (and treats that row), as it did before the direct sums."""
    rng = np.random.default_rng(6)
    n, D = 12, 30
    X = rng.normal(size=(n, D)).astype(np.float32)
    m = rng.normal(size=(n, D)).astype(np.float32)
    m[3, 4] = np.inf
    p = build(["nnm"], {}, RULES.get(rule_name)())
    res = p.aggregate(X, {"m": m}, np.ones(n), 2, backend="numba")
    assert np.isfinite(res.arrays["m"]).all() and res.weights[3] == 0
    assert any(key.startswith("upload:") for key in p._buffers)


# -- hostile input -------------------------------------------------------------------------

@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("names", [["nnm"], ["arc"], ["clip"], ["clip", "nnm"], ["arc", "nnm"]])
def test_hostile_rows_within_f_never_reach_the_aggregate(backend, names):
    rng = np.random.default_rng(11)
    n, D = 12, 6
    X = rng.normal(size=(n, D)).astype(np.float32)
    X[1] = np.nan
    X[4, 2] = -np.inf
    X[8] = 1e38
    m = rng.normal(size=(n, D)).astype(np.float32)
    m[10, 0] = np.nan  # a hostile upload behind a harmless feature
    p = build(names, {"clip_norm": 1.0}, RULES.get("krum")())
    res = p.aggregate(X, {"x": X, "m": m}, np.ones(n), 4, backend=backend,
                      reference={"m": np.zeros(D, np.float32)}, rng=rng)
    assert np.isfinite(res.arrays["x"]).all() and np.isfinite(res.arrays["m"]).all()
    assert res.weights[[1, 4, 10]].max() == 0


def test_a_huge_finite_row_is_clipped_not_propagated():
    X = np.vstack([np.full((5, 3), 0.1), np.full((1, 3), 3.4e38)]).astype(np.float32)
    res = _run([Clip(clip_norm=1.0)], "mean", X, reference={}, backend="numba")
    assert np.isfinite(res.arrays["x"]).all() and np.abs(res.arrays["x"]).max() < 1


def test_clipping_needs_the_server_state_for_uploads():
    X = np.ones((4, 2))
    with pytest.raises(ValueError, match="toward the server's value of it: pass reference"):
        _run([Clip()], "mean", X, arrays={"x": X, "theta": X.copy()})


# -- ByzFL 0.0.11 -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def byzfl_pre():
    pytest.importorskip("torch")
    import importlib.util
    import pathlib

    spec = importlib.util.find_spec("byzfl")
    if spec is None:
        pytest.skip("byzfl is not installed")
    from rfrs_ref.testing.adapters import load_byzfl_aggregators

    load_byzfl_aggregators()  # makes byzfl.utils importable without byzfl/__init__
    path = pathlib.Path(spec.submodule_search_locations[0]) / "aggregators" / "preaggregators.py"
    s = importlib.util.spec_from_file_location("_byzfl_preaggregators", path)
    module = importlib.util.module_from_spec(s)
    s.loader.exec_module(module)
    return module


@pytest.mark.crosscheck
@pytest.mark.parametrize("seed", range(5))
def test_byzfl_nnm_clipping_arc_agree_with_equal_weights(byzfl_pre, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(10, 7)) * rng.choice([0.1, 1.0, 5.0], size=(10, 1))
    for f in (0, 2, 4):
        ours = NNM().mixing(X, np.ones(10), f, np.ones(10, bool), None, "numpy")
        np.testing.assert_allclose(mix_rows(ours.matrix, X), byzfl_pre.NNM(f)(X.copy()), rtol=1e-12)
        ours = ARC().mixing(X, np.ones(10), f, np.ones(10, bool), None, "numpy")
        np.testing.assert_allclose(mix_rows(ours.matrix, X, np.zeros(7)), byzfl_pre.ARC(f)(X.copy()),
                                   rtol=1e-12)
    ours = Clip(clip_norm=2.0).mixing(X, np.ones(10), 0, np.ones(10, bool), None, "numpy")
    np.testing.assert_allclose(mix_rows(ours.matrix, X, np.zeros(7)), byzfl_pre.Clipping(2.0)(X.copy()),
                               rtol=1e-12)


@pytest.mark.crosscheck
def test_byzfl_bucketing_agrees_on_the_same_permutation(byzfl_pre):
    """ByzFL shuffles with NumPy's global generator: seeded the same, it draws the
    permutation ours draws from a generator of the same seed only if they share the
    algorithm, so compare bucket means on the permutation ByzFL used."""
    X = np.arange(21.0).reshape(7, 3)
    np.random.seed(4)
    theirs = byzfl_pre.Bucketing(3)(X.copy())
    np.random.seed(4)
    perm = np.random.permutation(7)
    expect = np.array([X[perm[0:3]].mean(axis=0), X[perm[3:6]].mean(axis=0), X[perm[6:]].mean(axis=0)])
    np.testing.assert_allclose(theirs, expect)
    M = np.zeros((3, 7))
    for b in range(3):
        M[b, perm[b * 3:(b + 1) * 3]] = 1 / len(perm[b * 3:(b + 1) * 3])
    np.testing.assert_allclose(mix_rows(M, X), theirs, rtol=1e-14)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["median", "trmean", "meamed"]),
       st.sampled_from([("nnm",), ("clip", "nnm"), ("nnm", "nnm"), ("bucketing", "nnm"),
                        ("bucketing",)]),
       st.sampled_from([np.float32, np.float64]), st.sampled_from(["error", "reduce-f", "mean"]),
       st.booleans())
def test_rows_given_once_with_their_copies_give_the_rows_written_out(seed, rule, names, dtype,
                                                                     fallback, hostile):
    """A rule that ranks each column behind pre-aggregators reads each distinct mixed row
    once (Rule.aggregate_copies): the arrays, weights, kept fractions and diagnostics
    are those of the rows written out (write_copies=True), bit for bit, Byzantine rows
    lying apart (NNM's honest rows then share one neighbour set) or among the honest
    ones, NaN and ±inf in them, a fallback to the mean included."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 20))
    f = int(rng.integers(0, n // 2))
    D = int(rng.integers(1, 300))
    X = (rng.normal(size=(1, D)) + 0.01 * rng.normal(size=(n, D))).astype(dtype)
    if rng.random() < 0.7:  # the Byzantine rows far away
        X[:f] += dtype(50)
    if hostile and f:
        X[0, rng.integers(D)] = rng.choice([np.nan, np.inf, -np.inf])
    arrays = {"theta": (X + dtype(1)).astype(dtype), "v": np.abs(rng.normal(size=(n, D))).astype(np.float32),
              "x": X}
    ref = {"theta": rng.normal(size=D).astype(dtype), "v": np.ones(D, dtype=np.float32)}
    ns = rng.integers(1, 9, n).astype(float)
    results = []
    for write in (False, True):
        stages = tuple(PRE.get(p)(**({"clip_norm": 1.0} if p == "clip" else {})) for p in names)
        pa = PreAggregated(stages, RULES.get(rule)(fallback=fallback), write_copies=write)
        try:
            results.append(pa.aggregate(X, arrays, ns, f, reference=ref,
                                        rng=np.random.default_rng(seed)))
        except PreconditionError as e:
            results.append(str(e))
    a, b = results
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    for k in arrays:
        assert a.arrays[k].dtype == b.arrays[k].dtype
        np.testing.assert_array_equal(a.arrays[k].view(np.uint8), b.arrays[k].view(np.uint8))
    assert (a.weights is None) == (b.weights is None)  # weights: the mean's fallback
    if a.weights is not None:
        np.testing.assert_array_equal(a.weights, b.weights)
    np.testing.assert_array_equal(a.kept, b.kept)
    assert a.diagnostics == b.diagnostics


def test_rows_given_once_when_the_byzantine_rows_lie_apart(monkeypatch):
    """NNM's honest rows are equal when the f Byzantine rows lie apart (each mixes the
    n − f honest rows): the median reads the two distinct mixed rows once each (the
    honest rows' and the Byzantine rows', which share their neighbours too), not the
    twelve rows."""
    from rfrs_ref.aggregate import base

    seen = []
    real = base.Rule.aggregate_copies
    monkeypatch.setattr(base.Rule, "aggregate_copies",
                        lambda self, X, arrays, copies, *a, **k:
                        seen.append((np.shape(X)[0], np.asarray(copies).tolist()))
                        or real(self, X, arrays, copies, *a, **k))
    rng = np.random.default_rng(2)
    X = rng.normal(size=(12, 30))
    X[:2] += 100.0
    res = PreAggregated((PRE.get("nnm")(),), RULES.get("median")()).aggregate(
        X, {"x": X}, np.ones(12), 2)
    assert seen == [(2, [0, 0] + [1] * 10)]
    want = PreAggregated((PRE.get("nnm")(),), RULES.get("median")(), write_copies=True).aggregate(
        X, {"x": X}, np.ones(12), 2)
    np.testing.assert_array_equal(res.arrays["x"], want.arrays["x"])
