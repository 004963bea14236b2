"""MoNNA: known answers, its law with a trusted pivot, hostile input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.aggregate import MoNNA, PreconditionError
from rfrs_ref.kernels.distances import pairwise_sq_dists_numpy

HOSTILE = [np.nan, np.inf, -np.inf, 1e38, -1e38, 3.4e38]
CPU = ["numpy", "numba"]


@pytest.mark.parametrize("backend", CPU)
def test_known_answers_and_ties(backend):
    X = np.array([[0.0], [1.0], [5.0], [-2.0], [9.0]])
    res = MoNNA().aggregate(X, {"x": X}, np.array([1, 3, 1, 1, 1]), 2, backend=backend)
    assert res.diagnostics["selected"] == [0, 1, 3]
    np.testing.assert_allclose(res.arrays["x"], [(0 + 3 * 1 - 2) / 5])
    res = MoNNA(pivot=2).aggregate(X, {"x": X}, np.ones(5), 2, backend=backend)
    assert res.diagnostics["selected"] == [1, 2, 4]  # 5, then 1 (4 away) and 9 (4 away)
    # equal distances go to the smaller index: 1 and −1 around 0
    X = np.array([[0.0], [1.0], [-1.0], [3.0], [-3.0]])
    res = MoNNA().aggregate(X, {"x": X}, np.ones(5), 2, backend=backend)
    assert res.diagnostics["selected"] == [0, 1, 2]
    res = MoNNA().aggregate(np.array([[0.0], [3.0], [-3.0], [1.0], [-1.0]]), {}, np.ones(5), 1,
                            backend=backend)
    assert res.diagnostics["selected"] == [0, 1, 3, 4]  # 3 and −3 tie: the smaller index stays


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.integers(1, 9), st.integers(1, 8), st.data())
def test_law_with_a_trusted_pivot(seed, n_honest, D, data):
    """Every kept feature, and the aggregate, lie within r = maxₕ ‖xₕ − xₚ‖ of
    an honest pivot p, whatever the f ≤ n_honest − 1 other rows are."""
    rng = np.random.default_rng(seed)
    f = data.draw(st.integers(0, n_honest - 1))
    n = n_honest + f
    X = rng.normal(size=(n, D)) * rng.choice([1e-3, 1.0, 1e3])
    byz = rng.permutation(n)[:f]
    honest = np.setdiff1d(np.arange(n), byz)
    for i in byz:
        kind = data.draw(st.sampled_from(["constant", "near", "coordinate"]))
        if kind == "constant":
            X[i] = data.draw(st.sampled_from(HOSTILE))
        elif kind == "near":
            X[i] = X[honest].mean(axis=0) + rng.normal(size=D) * 1e-3
        else:
            X[i, rng.integers(D)] = data.draw(st.sampled_from(HOSTILE))
    p = int(data.draw(st.sampled_from(honest.tolist())))
    backend = data.draw(st.sampled_from(CPU))
    res = MoNNA(pivot=p).aggregate(X, {"x": X}, rng.integers(1, 9, size=n), f, backend=backend)
    D2 = pairwise_sq_dists_numpy(X)
    r2 = D2[p, honest].max()
    S = np.array(res.diagnostics["selected"])
    assert S.size == n - f and p in S
    assert (D2[p, S] <= r2).all()
    assert np.isfinite(res.arrays["x"]).all()
    assert np.linalg.norm(res.arrays["x"] - X[p]) <= np.sqrt(r2) * (1 + 1e-9) + 1e-300


@pytest.mark.parametrize("backend", CPU)
def test_hostile_rows_and_a_hostile_pivot(backend):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(7, 3)).astype(np.float32)
    X[2] = np.nan
    X[5, 1] = np.inf
    v = np.abs(rng.normal(size=(7, 3))).astype(np.float32)
    v[6, 0] = np.nan
    res = MoNNA().aggregate(X, {"x": X, "v": v}, np.ones(7), 3, backend=backend)
    assert not {2, 5, 6} & set(res.diagnostics["selected"])
    assert np.isfinite(res.arrays["v"]).all()
    # beyond the assumption: the non-finite ones it would need are dropped
    res = MoNNA().aggregate(X, {"x": X, "v": v}, np.ones(7), 1, backend=backend)
    assert res.diagnostics["selected"] == [0, 1, 3, 4] and res.diagnostics["dropped_nonfinite"] == [2, 5]
    assert np.isfinite(res.arrays["x"]).all()
    # a non-finite pivot (2) is not the trusted one: the next finite client (3) is, and the
    # rule gives what it gives with that pivot; it once raised, ending the training run
    moved = MoNNA(pivot=2).aggregate(X, {"x": X}, np.ones(7), 1, backend=backend)
    at3 = MoNNA(pivot=3).aggregate(X, {"x": X}, np.ones(7), 1, backend=backend)
    assert moved.diagnostics["pivot"] == 3 and moved.diagnostics["pivot_moved_from"] == 2
    assert "pivot_moved_from" not in at3.diagnostics
    np.testing.assert_array_equal(moved.arrays["x"], at3.arrays["x"])
    assert moved.diagnostics["selected"] == at3.diagnostics["selected"]
    # cyclically: from the last position to the first finite one
    X6 = X.copy()
    X6[6] = np.inf
    X6[0] = np.nan
    res = MoNNA(pivot=6).aggregate(X6, {"x": X6}, np.ones(7), 3, backend=backend)
    assert (res.diagnostics["pivot"], res.diagnostics["pivot_moved_from"]) == (1, 6)
    assert np.isfinite(res.arrays["x"]).all()


def test_preconditions():
    with pytest.raises(PreconditionError, match=r"pivot < n \(pivot=5\), but n=5 and f=1"):
        MoNNA(pivot=5).aggregate(np.zeros((5, 1)), {}, np.ones(5), 1)
    with pytest.raises(PreconditionError, match="n > 2f"):
        MoNNA().check(4, 2)
    with pytest.raises(ValueError, match="pivot must be an integer ≥ 0"):
        MoNNA(pivot=-1)


@pytest.mark.crosscheck
@pytest.mark.parametrize("seed", range(6))
def test_byzfl_monna_agrees_with_equal_weights(byzfl_aggregators, seed):
    """The n − f nearest neighbours of the vector at ``idx``, plain mean: the same
    as ours for equal nᵢ and distinct distances."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(9, 11))
    X[:2] += 5.0
    for f in (0, 2, 4):
        for p in (0, 3):
            for backend in CPU:
                ours = MoNNA(pivot=p).aggregate(X, {"x": X}, np.full(9, 4), f, backend=backend)
                np.testing.assert_allclose(ours.arrays["x"], byzfl_aggregators.MoNNA(f, p)(X),
                                           rtol=1e-12)


@pytest.mark.crosscheck
def test_byzfl_monna_differs_with_unequal_weights(byzfl_aggregators):
    X = np.array([[0.0], [1.0], [5.0], [-2.0], [9.0]])
    theirs = byzfl_aggregators.MoNNA(2, 0)(X)
    np.testing.assert_allclose(theirs, [(0 + 1 - 2) / 3])
    ours = MoNNA().aggregate(X, {"x": X}, np.array([1, 3, 1, 1, 1]), 2).arrays["x"]
    np.testing.assert_allclose(ours, [(0 + 3 - 2) / 5])
