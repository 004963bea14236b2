"""CAF and SMEA: exact eigenvalues from distances, the batched search against the
oracle, their laws, hostile input, preconditions, and ByzFL 0.0.11 where one power
iteration is exact (D = 1)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.aggregate import CAF, SMEA, PreconditionError
from rfrs_ref.aggregate.spectral import centred_products, smallest_eigen_subset, top_eigen
from rfrs_ref.kernels.distances import pairwise_sq_dists_numpy

HOSTILE = [np.nan, np.inf, -np.inf, 1e38, -1e38, 3.4e38]
CPU = ["numpy", "numba"]


def cov_top(X):
    X = np.asarray(X, dtype=np.float64)
    Y = X - X.mean(axis=0)
    return float(np.linalg.eigvalsh(Y.T @ Y / X.shape[0])[-1]) if X.shape[0] > 1 else 0.0


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.integers(1, 8), st.integers(1, 6))
def test_eigenvalues_from_distances_are_the_covariances(seed, n, D):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)) * 3 + rng.normal() * 100
    c = rng.random(n) + 0.1
    mu = c @ X / c.sum()
    Y = X - mu
    lam, b = top_eigen(centred_products(pairwise_sq_dists_numpy(X), c), c)
    C = (c[:, None] * Y).T @ Y / c.sum()
    top = np.linalg.eigvalsh(C)[-1]
    assert abs(lam - top) <= 1e-8 * (1 + top)
    if top > 1e-9:
        u = b @ Y
        u /= np.linalg.norm(u)
        assert abs(u @ C @ u - top) <= 1e-7 * (1 + top)


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.integers(2, 9), st.data())
def test_batched_search_is_the_oracle(seed, n, data):
    rng = np.random.default_rng(seed)
    k = data.draw(st.integers(2, n))
    X = rng.integers(0, 3, size=(n, 2)).astype(float)  # many ties
    D2 = pairwise_sq_dists_numpy(X)
    S1, l1 = smallest_eigen_subset(D2, k, "numpy")
    S2, l2 = smallest_eigen_subset(D2, k, "numba", chunk=data.draw(st.sampled_from([1, 3, 4096])))
    assert abs(l1 - l2) <= 1e-12 * (1 + l1)
    if not np.array_equal(S1, S2):  # only where rounding separates equal eigenvalues
        assert abs(cov_top(X[S1]) - cov_top(X[S2])) <= 1e-9


def _round(seed, n_honest, f, D, data):
    rng = np.random.default_rng(seed)
    n = n_honest + f
    X = rng.normal(size=(n, D)) * rng.choice([1e-2, 1.0, 1e2])
    byz = rng.permutation(n)[:f]
    for i in byz:
        kind = data.draw(st.sampled_from(["constant", "near", "coordinate", "cluster"]))
        if kind == "constant":
            X[i] = data.draw(st.sampled_from(HOSTILE))
        elif kind == "near":
            X[i] = X[np.setdiff1d(np.arange(n), byz)].max(axis=0) + 0.1
        elif kind == "cluster":
            X[i] = 7.0
        else:
            X[i, rng.integers(D)] = data.draw(st.sampled_from(HOSTILE))
    return X, np.setdiff1d(np.arange(n), byz), rng


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.integers(2, 7), st.integers(1, 5), st.data())
def test_smea_law_no_wider_than_any_honest_candidate(seed, n_honest, D, data):
    f = data.draw(st.integers(0, n_honest - 1))
    X, honest, rng = _round(seed, n_honest, f, D, data)
    n = X.shape[0]
    backend = data.draw(st.sampled_from(CPU))
    res = SMEA().aggregate(X, {"x": X}, rng.integers(1, 9, size=n), f, backend=backend)
    S = np.array(res.diagnostics["selected"])
    assert S.size == n - f and np.isfinite(X[S]).all()
    assert len(np.intersect1d(S, honest)) >= n - 2 * f
    best_honest = min(cov_top(X[list(T)]) for T in itertools.combinations(honest, n - f))
    assert cov_top(X[S]) <= best_honest * (1 + 1e-9) + 1e-9 * np.abs(X[honest]).max() ** 2
    assert np.isfinite(res.arrays["x"]).all()


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.integers(2, 8), st.integers(1, 5), st.data())
def test_caf_law_a_convex_combination_of_finite_rows_keeping_more_than_n_minus_2f(seed, n_honest, D,
                                                                                data):
    f = data.draw(st.integers(0, n_honest - 1))
    X, honest, rng = _round(seed, n_honest, f, D, data)
    n = X.shape[0]
    backend = data.draw(st.sampled_from(CPU))
    ns = rng.integers(1, 9, size=n)
    res = CAF().aggregate(X, {"x": X}, ns, f, backend=backend)
    w = res.weights
    assert (w >= 0).all() and abs(w.sum() - 1) < 1e-12
    fin = np.isfinite(X).all(axis=1)
    assert w[~fin].max(initial=0.0) == 0
    c = np.array(res.diagnostics["filter_weights"])
    eig = res.diagnostics["eigenvalues"]
    assert (c <= 1).all()
    if eig:
        assert c.sum() > n - 2 * f - 1e-9
        assert res.diagnostics["smallest_eigenvalue"] == min(eig) <= eig[0]
    else:  # no step ran (f = 0, or few finite rows): every finite row, weight 1
        np.testing.assert_array_equal(c, fin.astype(float))
    np.testing.assert_allclose(res.arrays["x"], w @ np.where(fin[:, None], X, 0.0),
                               rtol=1e-9, atol=1e-9 * np.abs(X[fin]).max())


@pytest.mark.parametrize("backend", CPU)
def test_known_answers(backend):
    # one far row: CAF drops it at the first step, then the rest has the least spread
    X = np.array([[0.0], [1.0], [2.0], [100.0]])
    res = CAF().aggregate(X, {"x": X}, np.ones(4), 1, backend=backend)
    assert res.weights[3] == 0
    res = SMEA().aggregate(X, {"x": X}, np.array([1, 1, 2, 1]), 1, backend=backend)
    assert res.diagnostics["selected"] == [0, 1, 2]
    np.testing.assert_allclose(res.arrays["x"], [(0 + 1 + 2 * 2) / 4])
    # every row equal: no spread, the mean
    X = np.ones((5, 3))
    np.testing.assert_array_equal(CAF().aggregate(X, {"x": X}, np.ones(5), 2, backend=backend).arrays["x"],
                                  np.ones(3))


@pytest.mark.parametrize("backend", CPU)
def test_hostile_input(backend):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(9, 4)).astype(np.float32)
    X[1] = np.nan
    X[4, 2] = np.inf
    X[6] = 1e38
    m = rng.normal(size=(9, 4)).astype(np.float32)
    m[7, 0] = np.nan
    for rule in (CAF(), SMEA()):
        res = rule.aggregate(X, {"x": X, "m": m}, np.ones(9), 4, backend=backend)
        assert np.isfinite(res.arrays["x"]).all() and np.isfinite(res.arrays["m"]).all()
        assert res.weights[[1, 4, 6, 7]].max() == 0
        with pytest.raises(ValueError, match=f"^{rule.name}: every client"):
            rule.aggregate(np.full((5, 2), np.nan), {}, np.ones(5), 1, backend=backend)


def test_preconditions():
    with pytest.raises(PreconditionError, match="n > 2f, but n=4 and f=2"):
        CAF().check(4, 2)
    with pytest.raises(PreconditionError, match=r"C\(100, 40\) = 1.37e\+28"):
        SMEA().check(100, 40)
    SMEA().check(20, 4)
    with pytest.raises(ValueError, match="max_subsets must be an integer ≥ 1"):
        SMEA(max_subsets=0)


def _byzfl_caf_variant(X, f):
    """ByzFL's CAF with exact eigenpairs: τ's maximum over every row, zeroed or not."""
    n = X.shape[0]
    D2 = pairwise_sq_dists_numpy(X)
    c = np.ones(n)
    best, best_mu = np.inf, None
    while c.sum() > n - 2 * f:
        K = centred_products(D2, c)
        lam, b = top_eigen(K, c)
        if lam < best:
            best, best_mu = lam, c @ X / c.sum()
        tau = (K @ b) ** 2
        c = c * (1 - tau / tau.max())
    return best_mu


@pytest.mark.crosscheck
@pytest.mark.parametrize("seed", range(6))
def test_byzfl_caf_and_smea_agree_where_one_power_iteration_is_exact(byzfl_aggregators, seed):
    """In one dimension ByzFL's single power iteration is exact (the eigenvector is ±1),
    so its SMEA is ours with equal nᵢ, and its CAF is ours but for where τ's maximum is
    taken: over every row in ByzFL (a zeroed outlier keeps dominating), over the rows
    still weighted in ours. The two agree when the filter ends after one step."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(9, 1))
    X[:2] += 6.0
    for f in (1, 2, 3):
        ours = SMEA().aggregate(X, {"x": X}, np.ones(9), f).arrays["x"]
        np.testing.assert_allclose(ours, byzfl_aggregators.SMEA(f)(X.copy()), rtol=1e-12)
    for f in (1, 2, 3):
        theirs = byzfl_aggregators.CAF(f)(X.copy())
        np.testing.assert_allclose(_byzfl_caf_variant(X, f), theirs, rtol=1e-9, atol=1e-12)
        res = CAF().aggregate(X, {"x": X}, np.ones(9), f)
        if res.diagnostics["steps"] == 1:
            np.testing.assert_allclose(res.arrays["x"], theirs, rtol=1e-9, atol=1e-12)


# -- float64 rows near ±DBL_MAX ------------------------------------------------------------

DBL_MAX = float(np.finfo(np.float64).max)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("rule", ["caf", "smea"])
@pytest.mark.parametrize("value", [DBL_MAX, -DBL_MAX, 1e308, 1e200])
def test_rows_whose_distances_overflow_are_filtered_like_any_outlier(backend, rule, value):
    """Squared distances beyond float64 (+inf) used to reach LAPACK as NaN
    ('Eigenvalues did not converge'): the rows are filtered on scaled distances, and
    the honest rows are then compared unscaled (the same choice as with 1e38)."""
    rng = np.random.default_rng(1)
    n, f = 9, 2
    X = rng.normal(size=(n, 3))
    X[[2, 6]] = value
    X[6, 1] = -value
    r = RULES_[rule]()
    res = r.aggregate(X, {"x": X}, np.ones(n), f, backend=backend)
    ref = r.aggregate(np.where(np.abs(X) > 1e30, np.sign(X) * 1e38, X), {"x": X}, np.ones(n), f,
                      backend=backend)
    assert np.isfinite(res.arrays["x"]).all()
    assert res.weights[[2, 6]].max() == 0
    # the filter's later steps run on the rows still weighted (rounding differs)
    np.testing.assert_allclose(res.weights, ref.weights, rtol=1e-12)
    np.testing.assert_allclose(res.arrays["x"], ref.arrays["x"], rtol=1e-12)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("rule", ["caf", "smea"])
def test_every_row_near_dbl_max_gives_a_finite_aggregate(backend, rule):
    rng = np.random.default_rng(2)
    n, f = 9, 2
    X = rng.choice([-1, 1], (n, 4)) * rng.uniform(0.25, 1, (n, 4)) * DBL_MAX
    res_ns = rng.integers(1, 9, size=n)
    res = RULES_[rule]().aggregate(X, {"x": X}, res_ns, f, backend=backend)
    assert np.isfinite(res.arrays["x"]).all()
    # the decision taken on the rows scaled into range by a power of two (exact), where
    # the plain path runs: the same weights to rounding
    Xs = np.ldexp(X, -600)
    ref = RULES_[rule]().aggregate(Xs, {"x": Xs}, res_ns, f,
                                   backend=backend)
    np.testing.assert_allclose(res.weights, ref.weights, rtol=1e-9, atol=1e-12)


RULES_ = {"caf": CAF, "smea": SMEA}
