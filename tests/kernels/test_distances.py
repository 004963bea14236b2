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



# -- rows made of parts, one part shared by class (robust rounds on shared rows) -----------

@st.composite
def rows_by_parts(draw):
    """Rows split into 1–3 column parts (0 columns allowed) and a shared part that each
    row takes from its class (1–3 classes), as a robust round's features are on FISM's
    shared rows; rows near each other relative to their norm (parameter space) or not,
    with a few hostile values."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n = draw(st.integers(1, 9))
    k = draw(st.integers(1, 3))
    cls = np.array(draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n)))
    widths = draw(st.lists(st.integers(0, BLOCK + 40), min_size=1, max_size=3))
    S = draw(st.integers(1, 2 * BLOCK + 9))
    offset = draw(st.sampled_from([0.0, 1e3]))
    el = st.floats(-1, 1, width=32)
    parts = [(offset + draw(hnp.arrays(np.float64, (n, w), elements=el))).astype(dtype)
             for w in widths]
    shared = (offset + draw(hnp.arrays(np.float64, (k, S), elements=el))).astype(dtype)
    for _ in range(draw(st.integers(0, 2))):
        p = draw(st.integers(0, len(parts)))
        arr = shared if p == len(parts) else parts[p]
        if arr.shape[1]:
            arr[draw(st.integers(0, arr.shape[0] - 1)),
                draw(st.integers(0, arr.shape[1] - 1))] = draw(st.sampled_from([np.nan, np.inf, 1e30]))
    return parts, shared, cls


@settings(max_examples=150, deadline=None)
@given(rows_by_parts())
def test_distances_by_parts_are_within_the_bound_of_the_whole_rows(case):
    """The law the round on shared rows rests on: the distances assembled from the parts
    are within sq_dists_error of the exact distances of the whole rows (the float64
    oracle), as the kernel on the whole rows is, and so within twice that of the
    kernel's; a row non-finite anywhere is +inf from everything, as there."""
    from rfrs_ref.kernels.distances import pairwise_sq_dists_by_parts, sq_dists_error

    parts, shared, cls = case
    whole = np.concatenate([*parts, shared[cls]], axis=1)
    got = pairwise_sq_dists_by_parts(parts, shared, cls)
    full = pairwise_sq_dists(whole)
    exact = pairwise_sq_dists_numpy(whole)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(np.isinf(got), np.isinf(full))
    fin = np.isfinite(exact)
    rel, ab = max(sq_dists_error(p.shape[1] or 1, whole.dtype) for p in (*parts, shared))
    absolute = sum(sq_dists_error(p.shape[1] or 1, whole.dtype)[1] for p in (*parts, shared))
    bound = rel * exact[fin] + absolute + 1e-12 * exact[fin]  # the oracle's own rounding
    assert (np.abs(got[fin] - exact[fin]) <= bound).all()
    assert (np.abs(got[fin] - full[fin]) <= 2 * bound).all()


def test_distances_by_parts_known_answer_and_preconditions():
    from rfrs_ref.kernels.distances import pairwise_sq_dists_by_parts, sq_dists_error

    parts = [np.array([[0.0], [3.0], [0.0]]), np.zeros((3, 0))]
    shared = np.array([[0.0, 0.0], [0.0, 4.0]])
    got = pairwise_sq_dists_by_parts(parts, shared, np.array([0, 0, 1]))
    np.testing.assert_array_equal(got, [[0, 9, 16], [9, 0, 25], [16, 25, 0]])
    with pytest.raises(ValueError, match="class indices"):
        pairwise_sq_dists_by_parts(parts, shared, np.array([0, 2, 1]))
    with pytest.raises(ValueError, match="3 rows"):
        pairwise_sq_dists_by_parts([np.zeros((2, 1))], shared, np.array([0, 0, 1]))
    rel32, _ = sq_dists_error(2_173_440, np.float32)
    rel64, _ = sq_dists_error(2_173_440, np.float64)
    assert 1e-5 < rel32 < 2e-5 and rel64 < 1e-13


@st.composite
def derived_rows(draw):
    """θ (n, D), θ̄ (D,): few distinct values (copies and ties of θ − θ̄), hostile values
    in both, differences that overflow float32 and rows that round to one feature."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n = draw(st.integers(1, 11))
    D = draw(st.integers(1, 2 * BLOCK + 7))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    theta = (rng.integers(-3, 4, size=(n, D)) * draw(st.sampled_from([1.0, 1e-3, 0.25]))
             ).astype(dtype)
    if n > 2 and draw(st.booleans()):
        theta[1] = theta[0]  # a copy
    base = rng.normal(size=D).astype(dtype)
    if draw(st.booleans()):
        base[rng.integers(D)] = dtype(3e38)  # θ − θ̄ overflows float32 where θ < 0
    if draw(st.booleans()):
        base[rng.integers(D)] = dtype(1e8)  # distinct θ round to one feature
    if draw(st.booleans()):
        for _ in range(draw(st.integers(1, 3))):
            theta[rng.integers(n), rng.integers(D)] = draw(st.sampled_from(HOSTILE))
    if draw(st.booleans()):
        base[rng.integers(D)] = draw(st.sampled_from(HOSTILE))
    return theta, base, draw(st.sampled_from(DERIVATIONS))


#: derivations (a, c, flip) of features from one array: θ − θ̄ (None), Adam's, momentum's
#: and SGD's recovered gradients, and one that scales up (1/c > 1) towards overflow
DERIVATIONS = [None, (0.9, 1.0 - 0.9, False), (0.99, 1.0, False), (1.0, 0.01, True),
               (0.5, 1e-3, True)]


@settings(deadline=None)
@given(derived_rows())
def test_distances_of_features_derived_in_the_kernel_are_those_of_the_held_features(p):
    """``base=`` (and ``coef=``): the rows θᵢ − θ̄, or (x − a·b)/c, built a column block at
    a time in the kernel give the matrix of the held features (``derived_features``) bit
    for bit, float32 sums and float64 differences alike, hostile rows, copies and rows
    made equal by rounding included (the kernels' ``contract`` flag must not fuse a·b
    into the subtraction); ``derived_rows_finite`` says which rows are finite without
    building them; by parts, a (θ, θ̄) or (x, b, coef) part is the held part; the
    oracle builds the matrix."""
    from rfrs_ref.kernels.distances import (derived_features, derived_rows_finite,
                                            pairwise_sq_dists64, pairwise_sq_dists64_by_parts,
                                            pairwise_sq_dists_by_parts)

    theta, base, coef = p
    before = theta.copy()
    X = derived_features(theta, base, coef)
    held = pairwise_sq_dists(X)
    assert np.array_equal(pairwise_sq_dists(theta, base=base, coef=coef), held)
    assert np.array_equal(pairwise_sq_dists(theta, base=base, coef=coef, backend="numpy"),
                          pairwise_sq_dists_numpy(X))
    finite = np.isfinite(X).all(axis=1)
    np.testing.assert_array_equal(derived_rows_finite(theta, base, coef), finite)
    live = np.flatnonzero(finite)
    assert np.array_equal(pairwise_sq_dists64(theta, live, base=base, coef=coef),
                          pairwise_sq_dists64(X, live))
    cls = np.zeros(theta.shape[0], dtype=np.int64)
    shared = np.ones((1, 3), dtype=theta.dtype)
    half = theta.shape[1] // 2
    parts_held = [X[:, :half], X[:, half:]]
    parts = ([(theta[:, :half], base[:half]), (theta[:, half:], base[half:])] if coef is None
             else [(theta[:, :half], base[:half], coef), (theta[:, half:], base[half:], coef)])
    assert np.array_equal(pairwise_sq_dists_by_parts(parts, shared, cls),
                          pairwise_sq_dists_by_parts(parts_held, shared, cls))
    a, ea = pairwise_sq_dists64_by_parts(parts, shared, cls, live)
    b, eb = pairwise_sq_dists64_by_parts(parts_held, shared, cls, live)
    assert np.array_equal(a, b) and ea == eb
    np.testing.assert_array_equal(theta, before)


def test_a_derivation_is_checked_and_computed_in_float64_rounded_once():
    from rfrs_ref.kernels.distances import derivation, derived_features

    with pytest.raises(ValueError, match="non-zero c"):
        derivation((0.9, 0.0, False))
    with pytest.raises(ValueError, match="finite a"):
        derivation((np.nan, 1.0, False))
    x = np.array([[np.float32(0.1)]], dtype=np.float32)
    b = np.array([np.float32(0.3)], dtype=np.float32)
    exact = (np.float64(x[0, 0]) - 0.9 * np.float64(b[0])) / (1.0 - 0.9)
    assert derived_features(x, b, (0.9, 1.0 - 0.9, False))[0, 0] == np.float32(exact)
    assert derived_features(x, b, (1.0, 2.0, True))[0, 0] == np.float32(
        (np.float64(b[0]) - np.float64(x[0, 0])) / 2.0)


def test_derived_distances_refuse_a_base_of_the_wrong_length_or_a_second_matrix():
    with pytest.raises(ValueError, match=r"base must have shape \(3,\)"):
        pairwise_sq_dists(np.zeros((2, 3)), base=np.zeros(4))
    with pytest.raises(ValueError, match="Y must be None"):
        pairwise_sq_dists(np.zeros((2, 3)), np.zeros((2, 3)), base=np.zeros(3))
