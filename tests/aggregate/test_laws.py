"""The aggregation laws (docs/aggregation.md), with adversarial Byzantine rows from Hypothesis."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from rfrs_ref.aggregate import RFA, Bulyan, Krum, Mean, Median, TrimmedMean
from rfrs_ref.kernels.distances import pairwise_sq_dists_numpy

HOSTILE = [np.nan, np.inf, -np.inf, 1e38, -1e38, 3.4e38, -3.4e38]


@st.composite
def byzantine_round(draw, min_n, f_of_n, max_D=12):
    """n clients, the first n − f honest (normal around a random centre), then f
    arbitrary rows: hostile constants, huge or tiny scalings, copies of an honest
    row, clusters, and single poisoned coordinates."""
    n = draw(st.integers(min_n, 13))
    f = draw(st.integers(0, f_of_n(n)))
    D = draw(st.integers(1, max_D))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    centre = rng.normal(size=D) * draw(st.sampled_from([0.0, 1.0, 1e3]))
    X = (centre + rng.normal(size=(n, D)) * draw(st.sampled_from([1e-3, 1.0, 10.0]))).astype(dtype)
    for i in range(n - f, n):
        kind = draw(st.sampled_from(["constant", "scaled", "copy", "cluster", "coordinate", "near"]))
        if kind == "constant":
            X[i] = draw(st.sampled_from(HOSTILE))
        elif kind == "scaled":
            X[i] = X[i] * draw(st.sampled_from([1e30, -1e20, 1e-30]))
        elif kind == "copy":
            X[i] = X[rng.integers(n - f)]
        elif kind == "cluster":
            X[i] = X[n - f - 1] + 5.0
        elif kind == "coordinate":
            X[i, rng.integers(D)] = draw(st.sampled_from(HOSTILE))
        else:  # just outside the honest cloud
            X[i] = X[: n - f].max(axis=0) + 0.1
    perm = rng.permutation(n)  # Byzantine rows anywhere, not only at the end
    honest = np.zeros(n, dtype=bool)
    honest[: n - f] = True
    return X[perm], honest[perm], f, rng.integers(1, 30, size=n)


@settings(max_examples=40)
@given(byzantine_round(3, lambda n: (n - 3) // 2), st.data())
def test_krum_kept_features_are_close_to_an_honest_one(r, data):
    """Every kept feature is within (n − f − 2)/(n − 2f − 2) · diam² (squared
    distance) of some honest feature, for any k ≤ n − f."""
    X, honest, f, ns = r
    n = X.shape[0]
    k = data.draw(st.integers(0, n - f))
    res = Krum(k=k).aggregate(X, {"x": X}, ns, f)
    D2 = pairwise_sq_dists_numpy(X)
    diam2 = D2[np.ix_(honest, honest)].max()
    bound = (n - f - 2) / (n - 2 * f - 2) * diam2
    for i in np.flatnonzero(res.weights > 0):
        assert D2[i, honest].min() <= bound * (1 + 1e-9) + 1e-300, (i, D2[i, honest].min(), bound)
    assert np.isfinite(res.arrays["x"]).all()


def test_krum_bound_can_fail_beyond_the_assumption():
    # f + 1 Byzantine rows in a tight cluster win against a spread honest set
    X = np.array([[0.0], [10.0], [20.0], [100.0], [100.0], [100.0]])
    res = Krum(k=1).aggregate(X, {"x": X}, np.ones(6), 1)
    assert res.arrays["x"][0] == 100.0  # f = 1 assumed, 3 attackers: no guarantee


def _ranges(V, honest):
    return V[honest].min(axis=0), V[honest].max(axis=0)


@pytest.mark.parametrize("rule", [Median(), TrimmedMean()], ids=["median", "trmean"])
@settings(max_examples=40)
@given(r=byzantine_round(1, lambda n: (n - 1) // 2))
def test_coordinate_range_law_median_trmean(rule, r):
    """Every aggregated coordinate lies within the honest values' range, for the
    features and for every upload ordered like them at each coordinate: θ =
    θ̄ + (θ − θ̄) in parameter space, m = β₁m̄ + (1 − β₁)g in gradient space."""
    X, honest, f, ns = r
    rng = np.random.default_rng(0)
    theta_bar = rng.normal(size=X.shape[1]).astype(X.dtype)
    m_bar = rng.normal(size=X.shape[1]).astype(X.dtype)
    with np.errstate(all="ignore"):
        A = {"x": X, "theta": theta_bar + X, "m": 0.9 * m_bar + (1 - 0.9) * X}
    res = rule.aggregate(X, A, ns, f)
    for name, V in A.items():
        lo, hi = _ranges(V, honest)
        out = res.arrays[name]
        slack = 4 * np.finfo(V.dtype).eps * np.maximum(np.abs(lo), np.abs(hi))
        assert ((out >= lo - slack) & (out <= hi + slack)).all(), name


@settings(max_examples=40)
@given(r=byzantine_round(3, lambda n: (n - 3) // 4))
def test_coordinate_range_law_bulyan(r):
    """Bulyan keeps the β values closest to the median of its selection. The
    median lies in the honest range, and every kept value is no farther from it
    than the farthest honest value of the selection, so each coordinate lies in
    [lo − w, hi + w], w = hi − lo the honest range's width. The plain range law
    does not hold (next test)."""
    X, honest, f, ns = r
    res = Bulyan().aggregate(X, {"x": X}, ns, f)
    lo, hi = _ranges(X.astype(np.float64), honest)
    w = hi - lo
    slack = 4 * np.finfo(X.dtype).eps * np.maximum(np.abs(lo), np.abs(hi))
    out = res.arrays["x"]
    assert ((out >= lo - w - slack) & (out <= hi + w + slack)).all()


def test_bulyan_can_leave_the_honest_range_by_less_than_its_width():
    # n = 7, f = 1 (selection of 5, β = 3 closest to their median); client 6 is
    # Byzantine, found by a random search
    X = np.array([[3.0, -4.0], [-7.0, -1.0], [9.0, 9.0], [-6.0, -7.0], [2.0, 9.0], [-3.0, 7.0],
                  [-2.0, 9.5]])
    res = Bulyan().aggregate(X, {"x": X}, np.ones(7), 1)
    honest_hi = X[:6, 1].max()
    assert 6 in res.diagnostics["selected"]
    assert honest_hi < res.arrays["x"][1] <= honest_hi + (honest_hi - X[:6, 1].min())


def test_range_law_does_not_extend_to_uploads_unrelated_to_the_features():
    """Gradient-space detection with a moment that does not follow the gradient:
    the coordinate-wise choice is made on the features, so an upload that is not
    ordered like them can leave its honest range (what update-rule verification
    is for)."""
    g = np.array([[0.0], [1.2], [2.0], [0.9], [0.5]])
    m = np.array([[0.0], [1.0], [2.0], [1e6], [0.5]])  # client 3 is Byzantine in m only
    honest = np.array([True, True, True, False, True])
    res = Median().aggregate(g, {"g": g, "m": m}, np.ones(5), 1)
    assert res.arrays["g"][0] == 0.9  # feature in range
    assert res.arrays["m"][0] > m[honest].max()  # the upload is not: client 3 is the median
    assert res.kept[3] == 1.0


@settings(max_examples=15)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(3, 9), D=st.integers(2, 5))
def test_rfa_translation_and_rotation_equivariance(seed, n, D):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    ns = rng.integers(1, 10, size=n)
    rule = RFA(tol=1e-12, max_iter=5000, nu=1e-12)
    z = rule.aggregate(X, {"x": X}, ns, 0).arrays["x"]
    c = rng.normal(size=D) * 100
    zt = rule.aggregate(X + c, {"x": X + c}, ns, 0).arrays["x"]
    np.testing.assert_allclose(zt, z + c, atol=1e-6)
    Q, _ = np.linalg.qr(rng.normal(size=(D, D)))
    zr = rule.aggregate(X @ Q, {"x": X @ Q}, ns, 0).arrays["x"]
    np.testing.assert_allclose(zr, z @ Q, atol=1e-6)


def _objective(z, X, w):
    return float(np.dot(w, np.linalg.norm(X - z, axis=1)))


@settings(max_examples=8)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(3, 9), D=st.integers(1, 4))
def test_rfa_reaches_the_minimiser_of_the_weighted_distance_sum(seed, n, D):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    ns = rng.integers(1, 10, size=n).astype(float)
    res = RFA(tol=1e-12, max_iter=5000, nu=1e-12).aggregate(X, {"x": X}, ns, 0)
    ref = minimize(_objective, np.average(X, axis=0, weights=ns), args=(X, ns), method="Nelder-Mead",
                   options={"xatol": 1e-12, "fatol": 1e-14, "maxiter": 40_000, "maxfev": 40_000})
    assert _objective(res.arrays["x"], X, ns) <= ref.fun * (1 + 1e-7) + 1e-12


@settings(max_examples=30)
@given(r=byzantine_round(3, lambda n: (n - 3) // 2))
def test_krum_with_k_one_is_classic_krum(r):
    X, honest, f, ns = r
    n = X.shape[0]
    A = {"x": X, "id": np.repeat(np.arange(n, dtype=float)[:, None], X.shape[1], axis=1)}
    res = Krum(k=1).aggregate(X, A, ns, f)
    # classic Krum, written out: the n − f − 2 nearest others, the smallest sum
    D2 = pairwise_sq_dists_numpy(X)
    scores = [np.sort(np.delete(D2[i], i))[: n - f - 2].sum() for i in range(n)]
    best = int(np.argmin(scores))  # first of the minima
    np.testing.assert_array_equal(res.arrays["id"], best)
    np.testing.assert_array_equal(res.arrays["x"], X[best])


@settings(max_examples=20)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 10), D=st.integers(1, 20),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_trmean_with_f_zero_is_the_mean(seed, n, D, dtype):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)).astype(dtype)
    A = {"x": X, "v": np.abs(rng.normal(size=(n, D))).astype(dtype)}
    ns = rng.integers(1, 9, size=n)
    a = TrimmedMean().aggregate(X, A, ns, 0)
    b = Mean().aggregate(X, A, ns, 0)
    for k in A:
        np.testing.assert_allclose(a.arrays[k], b.arrays[k], rtol=1e-6 if dtype == np.float32 else 1e-12)
    np.testing.assert_array_equal(a.kept, 1.0)
