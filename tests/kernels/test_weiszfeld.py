"""Smoothed Weiszfeld: fused pass, convergence to the geometric median, hostile rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from rfrs_ref.kernels.weiszfeld import (
    geometric_median,
    rows_finite,
    weighted_median,
    weiszfeld_pass,
    weiszfeld_pass_numpy,
)


@given(st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64]),
       st.integers(1, 9), st.integers(1, 1200))
def test_fused_pass_agrees_with_oracle(seed, dtype, n, D):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)).astype(dtype)
    alpha = rng.uniform(0, 2, size=n)
    alpha[rng.integers(n)] = 1.0
    if n > 1:
        X[0, rng.integers(D)] = np.nan
        alpha[0] = 0.0  # a zero-weight NaN row must not reach z
    before = X.copy()
    z1, d1 = weiszfeld_pass_numpy(X, alpha)
    z2, d2 = weiszfeld_pass(X, alpha)
    assert np.isfinite(z2).all()
    np.testing.assert_allclose(z2, z1, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.isinf(d1), np.isinf(d2))
    np.testing.assert_allclose(d2[np.isfinite(d1)], d1[np.isfinite(d1)], rtol=1e-9)
    np.testing.assert_array_equal(X, before)


def test_rows_finite():
    X = np.ones((4, 1000), dtype=np.float32)
    X[1, 999] = np.nan
    X[2, 0] = -np.inf
    np.testing.assert_array_equal(rows_finite(X), [True, False, False, True])


def test_weighted_median():
    assert weighted_median(np.array([3.0, 1.0, 2.0]), np.ones(3)) == 2.0
    assert weighted_median(np.array([3.0, 1.0, 2.0]), np.array([1.0, 1.0, 5.0])) == 2.0
    assert weighted_median(np.array([3.0, 1.0, 2.0]), np.array([10.0, 1.0, 1.0])) == 3.0


def _objective(z, X, w):
    return float(np.dot(w, np.linalg.norm(X - z, axis=1)))


@settings(max_examples=8)
@given(st.integers(0, 2**32 - 1), st.integers(3, 9), st.integers(1, 4))
def test_converges_to_the_minimiser(seed, n, D):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)) * rng.uniform(0.1, 10)
    w = rng.integers(1, 10, size=n).astype(float)
    res = geometric_median(X, w, nu=1e-10, tol=1e-12, max_iter=5000)
    ref = minimize(_objective, np.average(X, axis=0, weights=w), args=(X, w), method="Nelder-Mead",
                   options={"xatol": 1e-12, "fatol": 1e-14, "maxiter": 40_000, "maxfev": 40_000})
    f_ours = _objective(res["z"], X, w)
    assert f_ours <= ref.fun * (1 + 1e-7) + 1e-9
    # no point does better than the scipy minimum by more than scipy's own slack
    assert ref.fun <= f_ours * (1 + 1e-5) + 1e-9


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_huge_row_does_not_stop_the_iteration_early(backend):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(9, 30)).astype(np.float32)
    X[4] = 1e38
    X[5, 3] = np.nan
    res = geometric_median(X, np.ones(9), backend=backend)
    honest = np.delete(np.arange(9), [4, 5])
    assert res["converged"]
    # within the honest cloud, not 1e27 away as an objective-based stopping test leaves it
    assert np.linalg.norm(res["z"] - X[honest].mean(axis=0)) < 3 * np.sqrt(30)
    assert res["alpha"][5] == 0 and res["alpha"][4] < 1e-30


def test_start_from_the_median_when_the_mean_overflows():
    X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1e307, 1e307], [1e307, 1e307]])
    res = geometric_median(X, np.ones(5))
    assert res["start"] == "median"
    assert np.isfinite(res["z"]).all() and np.abs(res["z"]).max() <= 1.0


def test_every_row_nonfinite_is_an_error():
    with pytest.raises(ValueError, match="at least one finite row"):
        geometric_median(np.full((3, 2), np.nan), np.ones(3))


# --- the steps on the distance matrix ------------------------------------------------

from rfrs_ref.kernels import weiszfeld as W  # noqa: E402
from rfrs_ref.kernels.distances import pairwise_sq_dists64, sq_dists64_error  # noqa: E402


def _rows(draw_seed, dtype, n, D, spread, far):
    """Rows around a common offset (parameter-space-like: close relative to their norm),
    with an optional far row and an exact duplicate."""
    rng = np.random.default_rng(draw_seed)
    X = rng.normal(size=D) * 3.0 + rng.normal(size=(n, D)) * spread
    if far and n > 2:
        X[-1] = rng.normal(size=D) * far
    if n > 3:
        X[1] = X[0]
    return X.astype(dtype)


@given(st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64]),
       st.integers(1, 11), st.integers(1, 3000), st.sampled_from([1e-6, 1e-3, 1.0]))
def test_float64_distance_matrix_is_within_its_bound(seed, dtype, n, D, spread):
    X = _rows(seed, dtype, n, D, spread, 0)
    before = X.copy()
    got = pairwise_sq_dists64(X)
    XL = X.astype(np.longdouble)
    ref = ((XL[:, None, :] - XL[None, :, :]) ** 2).sum(axis=2)
    bound = sq_dists64_error(D) * ref + np.finfo(np.float64).tiny
    assert (np.abs(got.astype(np.longdouble) - ref) <= bound).all()
    np.testing.assert_array_equal(got, got.T)
    np.testing.assert_array_equal(np.diag(got), 0.0)
    np.testing.assert_array_equal(X, before)
    rows = np.arange(n)[::-2]
    # a subset is tiled differently (pairs in other sweeps): equal within the bound
    np.testing.assert_allclose(pairwise_sq_dists64(X, rows), got[np.ix_(rows, rows)],
                               rtol=2 * sq_dists64_error(D), atol=0)


@settings(max_examples=60)
@given(st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64]),
       st.integers(2, 12), st.integers(1, 400), st.sampled_from([1e-6, 1e-3, 1.0]),
       st.sampled_from([0, 10.0, 1e4, 1e8]), st.sampled_from([0, 1, 2]),
       st.sampled_from([1e-3, 1e-6, 1e-9, 1e-12]))
@example(5, np.float64, 8, 300, 1e-3, 1e8, 2, 1e-9)  # the identity errs by 3e-6 here
@example(5, np.float64, 8, 300, 1e-3, 1e8, 2, 1e-12)
@example(5, np.float32, 8, 300, 1e-3, 1e8, 2, 1e-9)
def test_accepted_distances_from_the_matrix_are_within_rho(seed, dtype, n, D, spread, far, at,
                                                           pull):
    """The law of the identity's check: whenever ``_gram_distances`` accepts, every
    squared distance to z = Σ aⱼxⱼ is within ρ · max(d², ν²) of its exact value (here
    in 80-bit arithmetic), wherever z is: at the mean, near a far row's pull, or on a
    data point (``at``)."""
    X = _rows(seed, dtype, n, D, spread, far)
    rng = np.random.default_rng(seed + 1)
    a = rng.uniform(0.01, 1.0, size=n)
    if at == 1:
        a[:] = 1e-12
        a[0] = 1.0  # z almost on row 0 (and its duplicate row 1)
    elif at == 2 and far:
        a[-1] *= pull  # a far row with a tiny weight: its pull cancels digits
    a /= a.sum()
    nu = 1e-6
    Dm = pairwise_sq_dists64(X)
    eps = sq_dists64_error(D) + (2 * n + 6) * 2.0 ** -53
    d2, ok = W._gram_distances(Dm, a, eps, nu)
    XL = X.astype(np.longdouble)
    aL = a.astype(np.longdouble)
    z = (aL[:, None] * XL).sum(axis=0) / aL.sum()
    ref = ((XL - z) ** 2).sum(axis=1)
    err = np.abs(d2.astype(np.longdouble) - ref)
    # the 80-bit reference's own error: z's coordinates err by about u₈₀ Σⱼ aⱼ|xⱼₖ|, and
    # each squared difference by twice that times |zₖ − xᵢₖ|, plus the sum's rounding
    u80 = float(np.finfo(np.longdouble).eps)
    scale = (aL[:, None] * np.abs(XL)).sum(axis=0) + np.abs(XL)
    ref_err = 8 * u80 * (np.abs(XL - z) * scale).sum(axis=1) + D * u80 * ref
    if ok:
        assert (err <= W.GRAM_RHO * np.maximum(ref, nu * nu) * 1.01 + ref_err).all()


def test_a_far_row_with_a_tiny_weight_is_refused_by_the_check():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 500))
    X[5] *= 1e9
    a = np.full(6, 1.0)
    a[5] = 1e-12  # a pull of 1e-3 a coordinate, against distances² of 1e3
    a /= a.sum()
    Dm = pairwise_sq_dists64(X)
    _, ok = W._gram_distances(Dm, a, sq_dists64_error(500) + 18 * 2.0 ** -53, 1e-6)
    assert not ok


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64]),
       st.integers(2, 12), st.integers(2, 2000), st.sampled_from([1e-3, 1.0]), st.booleans())
def test_steps_on_the_matrix_agree_with_the_passes(seed, dtype, n, D, spread, restart):
    rng = np.random.default_rng(seed)
    X = _rows(seed, dtype, n, D, spread, 0)
    X[: n // 3] *= -1  # an attacked minority on the other side
    w = rng.integers(1, 40, size=n).astype(float)
    before = X.copy()
    a = geometric_median(X, w, method="passes", restart=restart)
    b = geometric_median(X, w, method="distances", restart=restart)
    np.testing.assert_array_equal(X, before)
    assert ("restarted" in a) == ("restarted" in b) == restart
    if restart and a["restarted"] and b["restarted"] and a["start"] == b["start"] != "mean":
        # neither converged from the mean (z creeping onto the duplicated row): both
        # took the same restart, in passes from the coordinate-wise median
        np.testing.assert_array_equal(b["z"], a["z"])
        return
    assert b["method"].startswith("distances") and a["method"] == "passes"
    wa, wb = a["alpha"] / a["alpha"].sum(), b["alpha"] / b["alpha"].sum()
    if a["iterations"] == b["iterations"]:
        np.testing.assert_allclose(wb, wa, rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(b["dist"], a["dist"], rtol=1e-7, atol=1e-9 * a["dist"].max())
        np.testing.assert_allclose(b["objective"], a["objective"], rtol=1e-9)
        assert a["converged"] == b["converged"]
    else:  # a stopping test within rounding of its threshold
        assert abs(a["iterations"] - b["iterations"]) == 1
        np.testing.assert_allclose(wb, wa, rtol=1e-3, atol=1e-9)
    np.testing.assert_allclose(b["z"], a["z"], rtol=1e-6, atol=1e-6 * np.abs(a["z"]).max() + 1e-12)


def test_the_matrix_hands_over_to_passes_where_it_cannot_be_sure():
    """z converging onto a data point (its distance falls below the identity's rounding)
    and a huge row (its pull cancels the others' digits) continue in passes: the same
    results as the passes throughout."""
    X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    kw = dict(nu=1e-10, tol=1e-12, max_iter=1000)
    a = geometric_median(X, np.ones(5), method="passes", **kw)
    b = geometric_median(X, np.ones(5), method="distances", **kw)
    assert "then passes" in b["method"] and b["converged"]
    np.testing.assert_allclose(b["z"], a["z"], atol=1e-10)
    rng = np.random.default_rng(3)
    X = rng.normal(size=(9, 30)).astype(np.float32)
    X[4] = 1e38
    b = geometric_median(X, np.ones(9), method="distances")
    a = geometric_median(X, np.ones(9), method="passes")
    assert "then passes" in b["method"] and b["converged"]
    assert b["alpha"][4] < 1e-30
    np.testing.assert_allclose(b["alpha"], a["alpha"], rtol=1e-6)


def test_method_choice():
    X = np.random.default_rng(0).normal(size=(5, 40))
    assert geometric_median(X, np.ones(5))["method"] == "distances"
    assert geometric_median(X, np.ones(5), backend="numpy")["method"] == "passes"
    big = np.random.default_rng(0).normal(size=(W.GRAM_MAX_ROWS + 1, 4))
    assert geometric_median(big, np.ones(len(big)))["method"] == "passes"
    # float64 rows whose squared distances overflow: passes throughout
    X2 = np.array([[0.0, 0.0], [1.0, 0.0], [1e160, 0.0]])
    assert geometric_median(X2, np.ones(3), method="distances")["method"] == "passes"
    with pytest.raises(ValueError, match="numba backend"):
        geometric_median(X, np.ones(5), backend="numpy", method="distances")
    with pytest.raises(ValueError, match="unknown method"):
        geometric_median(X, np.ones(5), method="gram")
    r = W.geometric_median_weights(X, np.ones(5))
    assert r["z"] is None and r["alpha"].shape == (5,)


# -- float64 rows near ±DBL_MAX ------------------------------------------------------------

DBL_MAX = float(np.finfo(np.float64).max)


@pytest.mark.parametrize("backend", ["numpy", "numba",
                                     pytest.param("cuda", marks=pytest.mark.cuda)])
def test_weighted_mean_of_rows_near_dbl_max_is_finite(backend):
    if backend == "cuda":
        from numba import cuda

        if not cuda.is_available():
            pytest.skip("no CUDA device and no simulator")
    # Σ αᵢxᵢ overflows: the mean of finite rows is computed without overflow
    X = np.array([[DBL_MAX, -DBL_MAX, 1.0], [DBL_MAX, DBL_MAX / 2, 2.0], [DBL_MAX, -DBL_MAX, 3.0]])
    z, d = weiszfeld_pass(X, np.array([1e6, 3.0, 1.0]), backend=backend)
    assert np.isfinite(z).all()
    assert z[0] == DBL_MAX  # the mean of equal values, clamped to their range
    # DBL_MAX · (−1e6 + 3/2 − 1)/(1e6 + 4), the weights' share taken first
    np.testing.assert_allclose(z[1], DBL_MAX * ((-1e6 + 0.5) / (1e6 + 4)), rtol=1e-14)
    assert z[2] == pytest.approx((1e6 + 6 + 3) / (1e6 + 4), rel=1e-14)
    assert (d >= 0).all()


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("rows", ["all max", "random huge"])
def test_geometric_median_of_rows_beyond_float64_distances(backend, rows):
    """Every row near ±DBL_MAX (distances beyond float64's range): no IndexError (the
    weighted median of no finite distance), and the iteration runs on the rows scaled
    by a power of two, whose weights are the unscaled ones' (geometric median is
    equivariant)."""
    rng = np.random.default_rng(0)
    if rows == "all max":
        X = np.full((11, 5), DBL_MAX)
    else:
        X = rng.choice([-1, 1], (11, 5)) * rng.uniform(0.25, 1, (11, 5)) * DBL_MAX
    w = rng.integers(1, 9, size=11).astype(float)
    res = geometric_median(X, w, backend=backend)
    assert np.isfinite(res["z"]).all()
    assert (res["alpha"] > 0).all()
    k = res.get("scale_exponent", 0)
    ref = geometric_median(np.ldexp(X, -8), w, nu=np.ldexp(1e-6, -8), backend=backend)
    a, b = res["alpha"] / res["alpha"].sum(), ref["alpha"] / ref["alpha"].sum()
    np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(np.ldexp(res["z"], -8), ref["z"], rtol=1e-6,
                               atol=1e-12 * np.abs(ref["z"]).max())
    assert rows == "all max" or k > 0


# -- the steps from a matrix computed elsewhere (robust rounds on shared rows) -------------

@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64]),
       st.integers(2, 12), st.integers(2, 700), st.sampled_from([1e-3, 1.0]), st.booleans())
def test_the_steps_from_a_given_matrix_are_the_steps_on_the_rows(seed, dtype, n, D, spread,
                                                                 restart):
    """Given the matrix pairwise_sq_dists64 computes and its bound, the steps give the
    weights, distances and diagnostics of geometric_median_weights on the rows, bit
    for bit, wherever they stay on the matrix; where the rows' iteration would leave it
    (z, or the passes) they return None."""
    from rfrs_ref.kernels.distances import pairwise_sq_dists64, sq_dists64_error
    from rfrs_ref.kernels.weiszfeld import (geometric_median_weights,
                                            geometric_median_weights_on_matrix)

    rng = np.random.default_rng(seed)
    X = _rows(seed, dtype, n, D, spread, 0)
    X[: n // 3] *= -1
    w = rng.integers(1, 40, size=n).astype(float)
    ok = np.ones(n, dtype=bool)
    if n > 3:
        ok[rng.integers(n)] = False
    # the finite rows' matrix, as the steps on the rows compute it (the kernel's tiling,
    # hence its last bits, depends on the rows it is given)
    Dm = np.full((n, n), np.inf)
    live = np.flatnonzero(ok)
    Dm[np.ix_(live, live)] = pairwise_sq_dists64(X, live)
    got = geometric_median_weights_on_matrix(Dm, sq_dists64_error(D), w, ok, restart=restart)
    want = geometric_median_weights(X, np.where(ok, w, 0.0), finite=ok, restart=restart)
    if got is None:
        # ... or, with the restart, the rows' iteration did not converge from the mean
        # and restarted
        assert want["method"] != "distances" or ok.sum() < 2 or (restart and want["restarted"])
        return
    assert want["method"] == "distances"
    assert set(got) == set(want)
    for k in ("alpha", "dist"):
        np.testing.assert_array_equal(got[k], want[k])
    for k in ("iterations", "converged", "objective", "last_step", "start") + (
            ("restarted",) if restart else ()):
        assert got[k] == want[k], k


def test_the_steps_from_a_given_matrix_refuse_what_needs_the_rows():
    from rfrs_ref.kernels.distances import pairwise_sq_dists64, sq_dists64_error
    from rfrs_ref.kernels.weiszfeld import geometric_median_weights_on_matrix

    X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    kw = dict(nu=1e-10, tol=1e-12, max_iter=1000)
    err = sq_dists64_error(2)
    assert geometric_median_weights_on_matrix(pairwise_sq_dists64(X), err, np.ones(5),
                                              np.ones(5, bool), **kw) is None
    rng = np.random.default_rng(3)
    X = rng.normal(size=(9, 30)).astype(np.float32)
    X[4] = 1e38
    assert geometric_median_weights_on_matrix(pairwise_sq_dists64(X), sq_dists64_error(30),
                                              np.ones(9), np.ones(9, bool)) is None
    one = np.zeros(9, bool)
    one[0] = True
    assert geometric_median_weights_on_matrix(np.zeros((9, 9)), err, np.ones(9), one) is None
    many = np.ones(101, bool)
    assert geometric_median_weights_on_matrix(np.ones((101, 101)), err, np.ones(101), many) is None


def _far_third():
    """3 of 8 rows (35% of the weight, below the breakdown point) at 1e38 against
    honest rows of size 1e-3: from the mean, z is still at 2.9e10 after 100 steps."""
    rng = np.random.default_rng(0)
    X = rng.normal(0, 1e-3, (8, 10)).astype(np.float32)
    X[:3] = 1e38
    return X, np.array([29 / 3] * 3 + [54 / 5] * 5)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("want_z", [True, False])
def test_a_far_group_the_mean_does_not_come_back_from_restarts_at_the_median(backend, want_z):
    from rfrs_ref.kernels.weiszfeld import geometric_median_weights

    X, w = _far_third()
    res = (geometric_median(X, w, backend=backend, restart=True) if want_z
           else geometric_median_weights(X, w, backend=backend, restart=True))
    honest = geometric_median(X[3:], w[3:], backend="numpy", tol=1e-12, max_iter=1000)["z"]
    assert res["converged"] and res["restarted"]
    assert res["start"] == "median (the mean did not converge)"
    assert res["iterations_from_mean"] == 100
    assert res["iterations"] == res["iterations_from_median"] < 100
    assert np.abs(res["z"] - honest).max() < 1e-2
    assert res["alpha"][:3].max() < 1e-30
    # with max_iter = 0 nothing iterates, so nothing restarts
    assert not geometric_median(X, w, backend=backend, max_iter=0, restart=True)["restarted"]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("want_z", [True, False])
def test_by_default_a_far_group_leaves_the_iteration_from_the_mean_unconverged(backend, want_z):
    """The restart is an option: by default (Pillutla et al.'s RFA) the iteration from the
    mean is all there is, and the far third leaves z at 5.4e10 after 100 steps (the
    aggregate, one more step, at 2.9e10), unconverged, with no restart keys in the
    result."""
    from rfrs_ref.kernels.weiszfeld import geometric_median_weights

    X, w = _far_third()
    res = (geometric_median(X, w, backend=backend) if want_z
           else geometric_median_weights(X, w, backend=backend))
    assert not res["converged"] and res["iterations"] == 100 and res["start"] == "mean"
    assert "restarted" not in res and "iterations_from_median" not in res
    z = res["z"] if want_z else geometric_median(X, w, backend=backend)["z"]
    assert 5.3e10 < np.abs(z).max() < 5.5e10
    aggregate = res["alpha"] @ X.astype(np.float64) / res["alpha"].sum()
    assert 2.8e10 < np.abs(aggregate).max() < 3.0e10


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64]),
       st.integers(2, 12), st.integers(1, 300), st.sampled_from([1e-3, 1.0]),
       st.sampled_from([0.0, 1e3, 1e38]), st.integers(1, 40),
       st.sampled_from(["numpy", "numba"]))
def test_the_restart_changes_nothing_where_the_mean_converges(seed, dtype, n, D, spread, far,
                                                              max_iter, backend):
    """Where the iteration from the mean converges, the result is that iteration's, bit for
    bit (the restart does not run); where it does not, the restart runs and its result is
    taken only if its objective is lower."""
    from rfrs_ref.kernels import weiszfeld as wz

    X = _rows(seed, dtype, n, D, spread, far)
    w = np.random.default_rng(seed).integers(1, 40, size=n).astype(float)
    finite = np.ones(n, dtype=bool)
    got = geometric_median(X, w, backend=backend, max_iter=max_iter, restart=True)
    kw = dict(nu=1e-6, tol=1e-6, max_iter=max_iter)
    first = None
    if backend == "numba" and 2 <= n <= wz.GRAM_MAX_ROWS:
        first = wz._geometric_median_distances(X, w, finite, want_z=True, **kw)
    if first is None:
        first = wz._geometric_median_passes(X, w, finite, backend=backend, **kw)
    first.pop("z_weights", None)
    if first["converged"] or first["start"] != "mean":
        assert got["restarted"] is False
        assert set(got) == set(first) | {"restarted"}
        for k in ("z", "dist", "alpha"):
            np.testing.assert_array_equal(got[k], first[k])
        for k in ("iterations", "converged", "objective", "last_step", "start", "method"):
            assert got[k] == first[k], k
        return
    assert got["restarted"] is True
    assert got["iterations_from_mean"] == first["iterations"] == max_iter
    if got["start"] == "mean":
        np.testing.assert_array_equal(got["z"], first["z"])
    else:
        assert got["start"] == "median (the mean did not converge)"
        assert wz._objective_difference(X, w, finite, first["z"], got["z"]) > 0


def test_the_steps_from_a_given_matrix_hand_an_unconverged_iteration_to_the_rows():
    """An iteration on the matrix that ends unconverged returns None (its restart from the
    coordinate-wise median needs the rows), and RFA's from_distances raises NeedsRows."""
    from rfrs_ref.aggregate.base import NeedsRows
    from rfrs_ref.aggregate.rfa import RFA
    from rfrs_ref.kernels.distances import pairwise_sq_dists64, sq_dists64_error
    from rfrs_ref.kernels.weiszfeld import geometric_median_weights_on_matrix

    rng = np.random.default_rng(5)
    X = rng.normal(size=(7, 20))
    Dm, err = pairwise_sq_dists64(X), sq_dists64_error(20)
    ok = np.ones(7, bool)
    full = geometric_median_weights_on_matrix(Dm, err, np.ones(7), ok, restart=True)
    assert full is not None and full["converged"] and full["restarted"] is False
    assert geometric_median_weights_on_matrix(Dm, err, np.ones(7), ok, max_iter=2,
                                              restart=True) is None
    with pytest.raises(NeedsRows):
        RFA(max_iter=2, restart=True).from_distances(Dm, ok, np.ones(7), 1, error=err)
    # max_iter = 0 takes no step: the mean's weights, as before
    assert geometric_median_weights_on_matrix(Dm, err, np.ones(7), ok, max_iter=0,
                                              restart=True) is not None
    # without the restart (the default), the unconverged weights are returned, as the
    # rows' iteration ends
    two = geometric_median_weights_on_matrix(Dm, err, np.ones(7), ok, max_iter=2)
    assert two is not None and not two["converged"] and "restarted" not in two
    res = RFA(max_iter=2).from_distances(Dm, ok, np.ones(7), 1, error=err)
    assert not res.diagnostics["converged"] and "restarted" not in res.diagnostics
