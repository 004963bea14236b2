"""Minimum-diameter averaging: exact search, known answers, its law, hostile input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.aggregate import MDA, PreconditionError
from rfrs_ref.aggregate.mda import min_diameter_subset
from rfrs_ref.kernels.distances import pairwise_sq_dists_numpy

HOSTILE = [np.nan, np.inf, -np.inf, 1e38, -1e38, 3.4e38]


def test_known_answer_and_ties_to_the_first_subset():
    X = np.array([[0.0], [10.0], [1.0], [2.0], [11.0]])
    for backend in ("numpy", "numba"):
        res = MDA().aggregate(X, {"x": X}, np.array([1, 1, 1, 2, 1]), 2, backend=backend)
        assert res.diagnostics["selected"] == [0, 2, 3] and res.diagnostics["diameter"] == 2.0
        np.testing.assert_array_equal(res.arrays["x"], [(0 + 1 + 2 * 2) / 4])
        np.testing.assert_array_equal(res.weights, [0.25, 0, 0.25, 0.5, 0])
    # equal diameters: {0, 1} and {2, 3} both have diameter 1: the first wins
    X = np.array([[0.0], [1.0], [5.0], [6.0], [20.0]])
    for backend in ("numpy", "numba"):
        res = MDA(fallback="reduce-f").aggregate(X, {"x": X}, np.ones(5), 3, backend=backend)
        assert res.diagnostics["f_used"] == 2 and res.diagnostics["selected"] == [0, 1, 2]


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.integers(1, 10), st.data())
def test_branch_and_bound_finds_the_oracles_subset(seed, n, data):
    rng = np.random.default_rng(seed)
    k = data.draw(st.integers(1, n))
    # few distinct coordinates: many equal diameters, so the tie rule is exercised
    X = rng.integers(0, 4, size=(n, 2)).astype(float)
    D2 = pairwise_sq_dists_numpy(X)
    if data.draw(st.booleans()):
        D2[rng.integers(n), :] = np.inf
    S1, d1 = min_diameter_subset(D2, k, "numpy")
    S2, d2 = min_diameter_subset(D2, k, "numba")
    np.testing.assert_array_equal(S1, S2)
    assert d1 == d2
    brute = min(itertools.combinations(range(n), k),
                key=lambda S: max((D2[i, j] for i, j in itertools.combinations(S, 2)), default=0.0))
    np.testing.assert_array_equal(S1, brute)  # min() keeps the first of equal keys


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.integers(1, 9), st.integers(1, 8), st.data())
def test_law_diameter_at_most_the_honest_one(seed, n_honest, D, data):
    """diam(S*) ≤ Δ, the honest diameter, and the aggregate is within Δ of every
    honest client in S*, whatever the f ≤ n_honest − 1 other rows are."""
    rng = np.random.default_rng(seed)
    f = data.draw(st.integers(0, n_honest - 1))
    n = n_honest + f
    X = rng.normal(size=(n, D)) * rng.choice([1e-3, 1.0, 1e3])
    byz = rng.permutation(n)[:f]
    for i in byz:
        kind = data.draw(st.sampled_from(["constant", "near", "copy", "coordinate"]))
        if kind == "constant":
            X[i] = data.draw(st.sampled_from(HOSTILE))
        elif kind == "near":
            X[i] = X[np.setdiff1d(np.arange(n), byz)].mean(axis=0) + rng.normal(size=D) * 1e-3
        elif kind == "copy":
            X[i] = X[rng.choice(np.setdiff1d(np.arange(n), byz))]
        else:
            X[i, rng.integers(D)] = data.draw(st.sampled_from(HOSTILE))
    honest = np.setdiff1d(np.arange(n), byz)
    backend = data.draw(st.sampled_from(["numpy", "numba"]))
    res = MDA().aggregate(X, {"x": X}, rng.integers(1, 9, size=n), f, backend=backend)
    delta = np.sqrt(pairwise_sq_dists_numpy(X[honest]).max())
    S = np.array(res.diagnostics["selected"])
    assert S.size == n - f
    assert res.diagnostics["diameter"] <= delta * (1 + 1e-12)
    x = res.arrays["x"]
    assert np.isfinite(x).all()
    for h in np.intersect1d(S, honest):
        assert np.linalg.norm(x - X[h]) <= delta * (1 + 1e-9) + 1e-300


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_hostile_rows_within_f_are_never_selected(backend):
    rng = np.random.default_rng(7)
    X = rng.normal(size=(9, 4)).astype(np.float32)
    X[1] = np.nan
    X[4, 2] = -np.inf
    X[6] = 1e38
    m = rng.normal(size=(9, 4)).astype(np.float32)
    m[7, 0] = np.nan  # a hostile upload behind a harmless feature
    res = MDA().aggregate(X, {"x": X, "m": m}, np.ones(9), 4, backend=backend)
    assert not {1, 4, 6, 7} & set(res.diagnostics["selected"])
    assert np.isfinite(res.arrays["x"]).all() and np.isfinite(res.arrays["m"]).all()
    assert res.diagnostics["nonfinite_clients"] == [1, 4, 7]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_beyond_the_assumption_every_finite_client(backend):
    X = np.arange(14.0).reshape(7, 2)
    X[[0, 2, 5]] = np.nan
    res = MDA().aggregate(X, {"x": X}, np.ones(7), 2, backend=backend)
    assert res.diagnostics["selected"] == [1, 3, 4, 6] and res.diagnostics["short"] == 1
    np.testing.assert_allclose(res.arrays["x"], X[[1, 3, 4, 6]].mean(axis=0))
    with pytest.raises(ValueError, match="^mda: every client"):
        MDA().aggregate(np.full((5, 2), np.inf), {}, np.ones(5), 1, backend=backend)


def test_preconditions_name_the_subset_count():
    with pytest.raises(PreconditionError, match=r"n > 2f, but n=6 and f=3"):
        MDA().aggregate(np.zeros((6, 1)), {}, np.ones(6), 3)
    with pytest.raises(PreconditionError, match=r"C\(40, 15\) = 4.02e\+10"):
        MDA().check(40, 15)
    MDA(max_subsets=10**11).check(40, 15)
    res = MDA(max_subsets=100, fallback="reduce-f").aggregate(
        np.random.default_rng(0).normal(size=(12, 3)), {}, np.ones(12), 5)
    assert res.diagnostics["f_used"] == 2  # C(12, 2) = 66 ≤ 100 < C(12, 3) = 220
    with pytest.raises(ValueError, match="max_subsets must be an integer ≥ 1"):
        MDA(max_subsets=0)
