"""Meamed (mean around the median): known answers, its law, hostile input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.aggregate import Meamed, PreconditionError

HOSTILE = [np.nan, np.inf, -np.inf, 1e38, -1e38, 3.4e38]
CPU = ["numpy", "numba"]


@pytest.mark.parametrize("backend", CPU)
def test_known_answers(backend):
    # median 3 of [0, 2, 3, 7, 100]: remove 100 (97 away), then 7 (4 away, against
    # 3 away for 0): keep 0, 2, 3
    X = np.array([[0.0], [2.0], [3.0], [7.0], [100.0]])
    res = Meamed().aggregate(X, {"x": X}, np.array([1, 1, 2, 1, 1]), 2, backend=backend)
    np.testing.assert_allclose(res.arrays["x"], [(0 + 2 + 2 * 3) / 4])
    np.testing.assert_array_equal(res.kept, [1, 1, 1, 0, 0])
    # a tie of distance (1 and 5 around the median 3): the upper end goes
    X = np.array([[1.0], [2.0], [3.0], [4.0], [5.0]])
    res = Meamed().aggregate(X, {"x": X}, np.ones(5), 1, backend=backend)
    np.testing.assert_array_equal(res.kept, [1, 1, 1, 1, 0])
    # even n: the median is the mean of the two middle values (2.5): 4 − 2.5 > 2.5 − 1
    X = np.array([[1.0], [2.0], [3.0], [4.5]])
    res = Meamed().aggregate(X, {"x": X}, np.ones(4), 1, backend=backend)
    np.testing.assert_array_equal(res.kept, [1, 1, 1, 0])
    # f = 0 is the mean
    X = np.random.default_rng(0).normal(size=(6, 3))
    np.testing.assert_allclose(Meamed().aggregate(X, {"x": X}, np.ones(6), 0, backend=backend).arrays["x"],
                               X.mean(axis=0), rtol=1e-14)


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.integers(1, 9), st.integers(1, 8), st.data())
def test_law_within_the_honest_spread_around_the_median(seed, n_honest, D, data):
    """With f < n/2 arbitrary values per coordinate, the aggregate lies within
    w′ = max(med − lo, hi − med) of the median med of all n values, and med lies
    in the honest range [lo, hi]."""
    rng = np.random.default_rng(seed)
    f = data.draw(st.integers(0, n_honest - 1))
    n = n_honest + f
    X = rng.normal(size=(n, D)) * rng.choice([1e-3, 1.0, 1e3])
    byz = rng.permutation(n)[:f]
    for i in byz:
        kind = data.draw(st.sampled_from(["constant", "just-outside", "coordinate"]))
        if kind == "constant":
            X[i] = data.draw(st.sampled_from(HOSTILE))
        elif kind == "just-outside":
            h = np.setdiff1d(np.arange(n), byz)
            X[i] = X[h].max(axis=0) + rng.uniform(0, 1) * (X[h].max(axis=0) - X[h].min(axis=0))
        else:
            X[i, rng.integers(D)] = data.draw(st.sampled_from(HOSTILE))
    honest = np.setdiff1d(np.arange(n), byz)
    backend = data.draw(st.sampled_from(CPU))
    res = Meamed().aggregate(X, {"x": X}, rng.integers(1, 9, size=n), f, backend=backend)
    lo, hi = X[honest].min(axis=0), X[honest].max(axis=0)
    med = np.median(np.where(np.isnan(X), np.inf, X), axis=0)
    assert ((med >= lo) & (med <= hi)).all()
    wp = np.maximum(med - lo, hi - med)
    x = res.arrays["x"]
    slack = 1e-12 * (np.abs(lo) + np.abs(hi)) + 1e-300
    assert (np.abs(x - med) <= wp + slack).all()
    assert res.diagnostics["nonfinite_kept_coordinates"] == 0


@pytest.mark.parametrize("backend", CPU)
def test_numba_agrees_with_the_oracle_on_hostile_rounds(backend):
    rng = np.random.default_rng(1)
    X = rng.integers(-2, 3, size=(9, 300)).astype(np.float32)  # ties everywhere
    X[2] = np.nan
    X[5, ::3] = -np.inf
    X[7, 1::3] = 1e38
    v = np.abs(rng.normal(size=(9, 300))).astype(np.float32)
    v[3, 10] = np.inf
    ns = rng.integers(1, 9, size=9)
    a = Meamed().aggregate(X, {"x": X, "v": v}, ns, 3, backend="numpy")
    b = Meamed().aggregate(X, {"x": X, "v": v}, ns, 3, backend=backend)
    for k in ("x", "v"):
        np.testing.assert_allclose(b.arrays[k], a.arrays[k], rtol=1e-6)
        assert np.isfinite(b.arrays[k]).all()
    np.testing.assert_array_equal(a.kept, b.kept)


def test_precondition_and_beyond_the_assumption():
    with pytest.raises(PreconditionError, match="meamed needs n > 2f, but n=4 and f=2"):
        Meamed().aggregate(np.zeros((4, 1)), {}, np.ones(4), 2)
    # more than f extreme values at a coordinate: kept and counted
    X = np.array([[0.0], [1.0], [2.0], [np.inf], [np.inf]])
    res = Meamed().aggregate(X, {"x": X}, np.ones(5), 1)
    assert res.diagnostics["nonfinite_kept_coordinates"] == 1
