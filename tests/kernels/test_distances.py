"""Pairwise squared distances: oracle, Numba kernel, accuracy, hostile rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rfrs_ref.kernels.distances import BLOCK, pairwise_sq_dists, pairwise_sq_dists_numpy

HOSTILE = [np.nan, np.inf, -np.inf, 1e38, -1e38, 3.4e38, -3.4e38, 1e30, 1e-30, 0.0]


def test_known_answer():
    X = np.array([[0.0, 0.0], [3.0, 4.0], [1.0, 1.0]])
    expected = np.array([[0.0, 25.0, 2.0], [25.0, 0.0, 13.0], [2.0, 13.0, 0.0]])
    for backend in ("numpy", "numba"):
        np.testing.assert_array_equal(pairwise_sq_dists(X, backend=backend), expected)
        np.testing.assert_array_equal(pairwise_sq_dists(X, X[:2], backend=backend), expected[:, :2])


@st.composite
def matrices(draw, max_rows=9, max_cols=2 * BLOCK + 37):
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n = draw(st.integers(1, max_rows))
    D = draw(st.integers(1, max_cols))
    X = draw(hnp.arrays(dtype, (n, D), elements=st.floats(-100, 100, width=32)))
    # a few hostile coordinates in a few rows
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, n - 1))
        k = draw(st.integers(0, D - 1))
        X[i, k] = draw(st.sampled_from(HOSTILE))
    return X


def _agree(a, b):
    assert a.dtype == np.float64 and b.dtype == np.float64
    assert not np.isnan(a).any()
    np.testing.assert_array_equal(np.isinf(a), np.isinf(b))
    fin = np.isfinite(b)
    np.testing.assert_allclose(a[fin], b[fin], rtol=2e-6, atol=1e-30)


@given(matrices(), st.data())
def test_numba_agrees_with_oracle(X, data):
    before = X.copy()
    _agree(pairwise_sq_dists(X), pairwise_sq_dists_numpy(X))
    m = data.draw(st.integers(1, X.shape[0]))
    Y = X[:m][::-1].copy()
    _agree(pairwise_sq_dists(X, Y), pairwise_sq_dists_numpy(X, Y))
    np.testing.assert_array_equal(X, before)  # inputs are not modified


@given(matrices())
def test_symmetric_zero_diagonal_and_nonfinite_rows_infinitely_far(X):
    d = pairwise_sq_dists(X)
    np.testing.assert_array_equal(d, d.T)
    finite = np.isfinite(X).all(axis=1)
    assert (np.diag(d)[finite] == 0).all()
    assert np.isinf(d[~finite]).all() and np.isinf(d[:, ~finite]).all()
    assert (d >= 0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_accurate_for_rows_close_relative_to_their_norm(dtype):
    """θᵢ ≈ θ̄ + ηₜ·noise with ‖θ̄‖ ≈ √D: the Gram identity loses every digit."""
    rng = np.random.default_rng(0)
    D = 50_000
    base = rng.normal(size=D)
    X = (base + 1e-3 * rng.normal(size=(6, D))).astype(dtype)
    exact = pairwise_sq_dists_numpy(X)  # float64 differences of the stored values
    ours = pairwise_sq_dists(X)
    off = ~np.eye(6, dtype=bool)
    assert np.max(np.abs(ours[off] - exact[off]) / exact[off]) < 1e-6
    if dtype == np.float32:
        # the setup is hard: a float32 Gram matrix gets these distances badly wrong
        sq = (X * X).sum(axis=1, dtype=np.float32)
        gram = sq[:, None] + sq[None, :] - 2 * (X @ X.T)
        assert np.max(np.abs(gram[off] - exact[off]) / exact[off]) > 0.01


def test_float32_blocks_with_huge_values_are_summed_in_float64():
    # (2·1e20)² overflows float32, not float64
    X = np.zeros((4, 700), dtype=np.float32)
    X[0, 5] = 1e20
    X[1, 5] = -1e20
    X[2, 600] = 3e18
    X[3, 600] = -3e18
    X[3, 10] = 1.0
    d = pairwise_sq_dists(X)
    ref = pairwise_sq_dists_numpy(X)
    assert np.isfinite(d).all() and d[0, 1] > 1e40
    np.testing.assert_allclose(d, ref, rtol=1e-6)
    assert d[0, 1] == ref[0, 1]  # that block is exact in float64


def test_float32_squares_below_the_float32_range_are_lost_at_most():
    # |a − b| = 2e-25: its square underflows float32; the documented bound is an
    # absolute error below 3e-36 per block
    X = np.zeros((2, 300), dtype=np.float32)
    X[0, 3] = 3e-25
    X[1, 3] = 1e-25
    d = pairwise_sq_dists(X)
    ref = pairwise_sq_dists_numpy(X)
    assert ref[0, 1] > 0
    assert abs(d[0, 1] - ref[0, 1]) < 3e-36


def test_float64_overflow_is_infinite_not_nan():
    X = np.array([[1e200, 0.0], [-1e200, 0.0], [0.0, 1.0]])
    d = pairwise_sq_dists(X)
    assert d[0, 1] == np.inf and not np.isnan(d).any()
    assert d[0, 2] == np.inf  # (1e200)² already overflows: infinitely far is the right answer
    np.testing.assert_array_equal(d, pairwise_sq_dists_numpy(X))


def test_errors_name_the_shapes():
    with pytest.raises(ValueError, match="columns"):
        pairwise_sq_dists(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="2-D"):
        pairwise_sq_dists(np.zeros(3))
    with pytest.raises(ValueError, match="unknown backend"):
        pairwise_sq_dists(np.zeros((2, 3)), backend="gpu")


@settings(max_examples=10)
@given(matrices(max_rows=6, max_cols=40))
def test_integer_and_mixed_dtypes(X):
    Y = X[:2].astype(np.float64)
    _agree(pairwise_sq_dists(X.astype(np.float32), Y), pairwise_sq_dists_numpy(X.astype(np.float32), Y))


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.integers(3, 40), st.integers(1, 3000),
       st.sampled_from([np.float32, np.float64]), st.integers(1, 3))
def test_copies_of_a_row_have_the_same_distances(seed, n, D, dtype, copies):
    """Identical uploads (ALIE, IPM, mimic) are at the same distance from every other row,
    bit for bit, wherever the kernel's tiles put them, so that Krum's, Bulyan's and MDA's
    ties among them go to the smaller index (the kernel alone rounded a pair differently by
    its place in a tile: 172 of 200 drawn rounds with one copy differed)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)).astype(dtype)
    src = int(rng.integers(n))
    at = rng.choice(n, size=min(copies, n - 1) + 1, replace=False)
    X[at] = X[src]
    X[rng.integers(n), rng.integers(D)] = np.nan  # a non-finite row stays infinitely far
    before = X.copy()
    out = pairwise_sq_dists(X)
    np.testing.assert_array_equal(X, before)
    np.testing.assert_array_equal(out, out.T)
    same = [i for i in range(n) if np.array_equal(X[i], X[src]) and np.isfinite(X[i]).all()]
    others = [i for i in range(n) if i not in same]
    for i in same[1:]:
        np.testing.assert_array_equal(out[i, others], out[same[0], others])
    assert (out[np.ix_(same, same)] == 0).all()
    np.testing.assert_allclose(out, pairwise_sq_dists_numpy(X), rtol=1e-5)

