"""Aggregation rules on hostile uploads: NaN, ±inf, 1e38 and huge finite rows,
beyond the rules' assumption as well as within it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq

from rfrs_ref.aggregate import RFA, RULES, Bulyan, Krum, Median, TrimmedMean
from rfrs_ref.kernels.coordinatewise import coordinatewise_combine
from rfrs_ref.kernels.weiszfeld import distances_to_numpy, geometric_median, weiszfeld_pass

CPU = ["numpy", "numba"]


def _cuda_available() -> bool:
    from numba import cuda

    return cuda.is_available()


ALL = CPU + [pytest.param("cuda", marks=[
    pytest.mark.cuda,
    pytest.mark.skipif(not _cuda_available(), reason="no CUDA device and no simulator"),
])]


# -- Bulyan ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ALL)
def test_bulyan_with_more_than_f_nan_clients_selects_the_finite_ones(backend):
    # n = 11, f = 2: θ = 7 but only 6 clients are finite (this raised
    # "list.remove(x): x not in list")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(11, 5))
    X[:5] = np.nan
    res = Bulyan().aggregate(X, {"x": X}, np.ones(11), 2, backend=backend)
    assert np.isfinite(res.arrays["x"]).all()
    d = res.diagnostics
    assert sorted(d["selected"]) == list(range(5, 11))
    assert d["theta"] == 7 and d["theta_used"] == 6 and d["beta_used"] == 2
    assert d["nonfinite_kept_coordinates"] == 0
    assert (res.kept[:5] == 0).all()
    # the window of the six finite rows trims 2 per side around the median
    honest = X[5:]
    assert (res.arrays["x"] >= honest.min(axis=0)).all()
    assert (res.arrays["x"] <= honest.max(axis=0)).all()


@pytest.mark.parametrize("backend", CPU)
def test_bulyan_never_selects_a_nonfinite_client_while_theta_finite_ones_exist(backend):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(11, 4))
    X[[0, 4, 9], 1] = [np.inf, -np.inf, np.nan]  # 3 > f non-finite, but ≤ 2f
    res = Bulyan().aggregate(X, {"x": X}, np.ones(11), 2, backend=backend)
    assert not {0, 4, 9} & set(res.diagnostics["selected"])
    assert res.diagnostics["theta_used"] == 7 and res.diagnostics["beta_used"] == 3
    assert np.isfinite(res.arrays["x"]).all()


@pytest.mark.parametrize("backend", CPU)
def test_bulyan_with_every_distance_overflowing_does_not_select_a_client_twice(backend):
    # float64 rows near 1e200: every squared distance is +inf, so is every score;
    # the lowest score must still be taken among the remaining candidates
    rng = np.random.default_rng(2)
    X = rng.normal(size=(7, 3)) * 1e200
    res = Bulyan().aggregate(X, {"x": X}, np.ones(7), 1, backend=backend)
    assert len(set(res.diagnostics["selected"])) == 5
    assert np.isfinite(res.arrays["x"]).all()


@pytest.mark.parametrize("name", ["bulyan", "krum", "rfa", "mda", "monna", "caf", "smea"])
def test_no_finite_client_is_a_clear_error(name):
    """NothingFinite (a ValueError) names the rule: the round loop keeps the state for such
    a round (tests/hostile/test_nonfinite.py)."""
    from rfrs_ref.aggregate import RULES, NothingFinite

    rule = RULES.get(name)()
    X = np.full((7, 3), np.nan)
    X[2] = np.inf
    with pytest.raises(NothingFinite, match=rf"^{name}: every client .*nothing finite to aggregate"):
        rule.aggregate(X, {"x": X}, np.ones(7), 1)
    assert issubclass(NothingFinite, ValueError)


# -- Krum --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", CPU)
def test_krum_keeps_the_finite_client_when_every_score_is_inf(backend):
    # n − 1 clients at +inf, one finite: every score is +inf (the finite client's
    # neighbours are all infinitely far), yet the finite one ranks first
    X = np.full((7, 3), np.inf)
    X[5] = [1.0, 2.0, 3.0]
    res = Krum().aggregate(X, {"x": X}, np.ones(7), 1, backend=backend)
    np.testing.assert_array_equal(res.arrays["x"], [1.0, 2.0, 3.0])
    assert res.weights[5] == 1.0
    assert res.diagnostics["dropped_nonfinite"] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("backend", CPU)
def test_krum_prefers_finite_clients_with_overflowed_scores(backend):
    # finite rows whose distances all overflow (+inf scores) rank before NaN rows
    X = np.random.default_rng(3).normal(size=(8, 2)) * 1e200
    X[:3] = np.nan
    res = Krum(k=2).aggregate(X, {"x": X}, np.ones(8), 1, backend=backend)
    assert res.diagnostics["selected"] == [3, 4]
    assert res.diagnostics["dropped_nonfinite"] == []


# -- RFA -----------------------------------------------------------------------------------


def _square_median_x() -> float:
    # median of the unit square's corners pulled by one more row far along +x:
    # by symmetry z = (a, ½), and the x-components of the unit vectors balance
    def g(a):
        return -2 * a / np.hypot(a, 0.5) + 2 * (1 - a) / np.hypot(1 - a, 0.5) + 1

    return brentq(g, 0.5, 1.0, xtol=1e-15)


@pytest.mark.parametrize("backend", ALL)
def test_rfa_keeps_a_client_whose_squared_distance_overflows(backend):
    X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1e200, 0.0]])
    res = RFA(tol=1e-12, max_iter=1000).aggregate(X, {"x": X}, np.ones(5), 2, backend=backend)
    assert res.weights[4] > 0
    # the far row pulls with force 1 whatever its distance: the median is
    # near (0.812, 0.5), not the square's centre (0.5, 0.5)
    np.testing.assert_allclose(res.arrays["x"], [_square_median_x(), 0.5], atol=1e-6)
    assert _square_median_x() == pytest.approx(0.8122, abs=1e-4)


@pytest.mark.parametrize("backend", CPU)
def test_weiszfeld_pass_distances_never_overflow_for_finite_rows(backend):
    X = np.array([[0.0, 0.0], [1e200, -1e200], [1e300, 1e300], [np.nan, 0.0], [-np.inf, 1.0]])
    alpha = np.array([1.0, 0.0, 0.0, 0.0, 0.0])
    z, d = weiszfeld_pass(X, alpha, backend=backend)
    np.testing.assert_array_equal(z, [0.0, 0.0])
    np.testing.assert_allclose(d[:3], [0.0, np.sqrt(2) * 1e200, np.sqrt(2) * 1e300], rtol=1e-15)
    assert np.isinf(d[3:]).all()
    # a distance beyond the float64 range is +inf, not NaN
    z, d = weiszfeld_pass(np.array([[-1.7e308], [1.7e308]]), np.array([1.0, 0.0]), backend=backend)
    assert np.isinf(d[1]) and d[0] == 0.0


def test_scaled_distances_leave_ordinary_ones_bit_for_bit():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(6, 50)) * 1e3
    z = rng.normal(size=50)
    np.testing.assert_array_equal(distances_to_numpy(X, z), np.sqrt(((X - z) ** 2).sum(axis=1)))


def _unit_vector_sum(X, z, w):
    """Σ wᵢ (z − xᵢ)/‖z − xᵢ‖, each unit vector computed in scaled form: the
    gradient of Σ wᵢ ‖z − xᵢ‖, zero at the geometric median (z off the data)."""
    g = np.zeros_like(z)
    for x, wi in zip(X, w):
        diff = z - x
        m = np.abs(diff).max()
        u = diff / m
        g += wi * u / np.linalg.norm(u)
    return g


@settings(max_examples=25)
@given(st.integers(0, 2**32 - 1), st.integers(5, 11), st.integers(2, 4),
       st.lists(st.integers(155, 300), min_size=1, max_size=2), st.sampled_from(CPU))
def test_huge_finite_rows_never_vanish_from_the_geometric_median(seed, n, D, exps, backend):
    """Rows at 1e155 – 1e300 (squared distances beyond float64) keep a positive
    weight, and the result is the geometric median: the unit vectors towards the
    rows, every one computed in scaled form, balance (first-order condition)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    for j, e in enumerate(exps):
        X[j] = rng.normal(size=D) * 10.0 ** e
    w = np.ones(n)
    res = geometric_median(X, w, nu=1e-12, tol=1e-13, max_iter=5000, backend=backend)
    assert (res["alpha"] > 0).all()
    z = res["z"]
    assert np.isfinite(z).all() and np.abs(z).max() < 1e3
    dist = distances_to_numpy(X, z)
    at = np.flatnonzero(dist <= 1e-7)
    others = np.setdiff1d(np.arange(n), at)
    # first-order condition: the unit vectors balance, or, at a data point i,
    # the others' pull is at most wᵢ (subgradient)
    pull = np.linalg.norm(_unit_vector_sum(X[others], z, w[others]))
    assert pull <= w[at].sum() + 1e-5 * n
    # the same median when the huge rows are brought into range by a power of two
    # (the honest rows then vanish next to them, so compare the pull only)
    g_far = -_unit_vector_sum(X[:len(exps)], np.zeros(D), np.ones(len(exps)))
    if at.size == 0:
        g_near = _unit_vector_sum(X[len(exps):], z, w[len(exps):])
        np.testing.assert_allclose(g_near, g_far, atol=1e-5 * n)


# -- coordinate-wise order of ±inf and NaN ---------------------------------------------------


@pytest.mark.parametrize("backend", ALL)
def test_median_ranks_minus_inf_lowest_as_np_median_does(backend):
    X = np.array([[1.0], [2.0], [3.0], [4.0], [-np.inf]])
    res = Median().aggregate(X, {"x": X}, np.ones(5), 2, backend=backend)
    assert res.arrays["x"][0] == np.median(X) == 2.0
    res = TrimmedMean().aggregate(X, {"x": X}, np.ones(5), 1, backend=backend)
    assert res.arrays["x"][0] == 2.0  # −inf trimmed from the bottom, 4 from the top
    assert res.kept[4] == 0 and res.kept[3] == 0


@pytest.mark.parametrize("backend", ALL)
def test_minus_inf_feature_stays_lowest_whatever_its_uploads(backend):
    # a NaN upload makes a finite feature +inf; a −inf feature keeps its end
    F = np.array([[-np.inf], [1.0], [2.0], [3.0], [0.5]])
    m = np.array([[np.nan], [1.0], [1.0], [1.0], [np.nan]])
    out, kept, bad = coordinatewise_combine(F, {"x": F, "m": m}, np.ones(5), mode="trim", t=1,
                                            backend=backend)
    # ranks: −inf (row 0), 1, 2, 3, +inf (row 4): rows 1, 2, 3 kept
    np.testing.assert_array_equal(kept, [0, 1, 1, 1, 0])
    assert out["x"][0] == 2.0 and out["m"][0] == 1.0 and bad == 0


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.integers(0, 6), st.integers(1, 7),
       st.sampled_from([np.float32, np.float64]), st.sampled_from(CPU))
def test_odd_median_is_np_median_with_nan_as_plus_inf(seed, half, D, dtype, backend):
    """For odd n the median is ``np.median`` over the values with NaN read as +inf
    (np.sort's order), whatever the ±inf, at every coordinate."""
    n = 2 * half + 1
    rng = np.random.default_rng(seed)
    X = rng.integers(-3, 4, size=(n, D)).astype(dtype)
    mask = rng.random((n, D)) < 0.3
    X[mask] = rng.choice([np.nan, np.inf, -np.inf, 1e38, -1e38], size=mask.sum())
    res = Median().aggregate(X, {"x": X}, rng.integers(1, 9, size=n), 0, backend=backend)
    ref = np.median(np.where(np.isnan(X), np.inf, X).astype(np.float64), axis=0).astype(dtype)
    out = res.arrays["x"]
    np.testing.assert_array_equal(np.where(np.isnan(out), np.inf, out), ref)


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.integers(1, 11), st.integers(1, 6), st.sampled_from(CPU),
       st.sampled_from(["median", "trmean"]))
def test_range_law_with_infinities_at_both_ends(seed, n_honest, D, backend, name):
    """With at most f values of ±inf or NaN at a coordinate, on either side, the
    aggregate lies within the honest values' range (nothing non-finite kept)."""
    rng = np.random.default_rng(seed)
    f = int(rng.integers(0, n_honest))
    n = n_honest + f
    X = rng.normal(size=(n, D))
    byz = rng.permutation(n)[:f]
    X[byz] = rng.choice([np.nan, np.inf, -np.inf], size=(f, D))
    honest = np.setdiff1d(np.arange(n), byz)
    res = RULES.get(name)().aggregate(X, {"x": X}, rng.integers(1, 9, size=n), f, backend=backend)
    x = res.arrays["x"]
    assert (x >= X[honest].min(axis=0)).all() and (x <= X[honest].max(axis=0)).all()
    assert res.diagnostics["nonfinite_kept_coordinates"] == 0


@pytest.mark.parametrize("backend", ALL)
def test_bulyan_window_trims_minus_inf_from_the_bottom(backend):
    # n = 7, f = 1: θ = 5 selected, β = 3 closest to the median at each coordinate
    X = np.array([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0], [-np.inf]])
    res = Bulyan().aggregate(X, {"x": X}, np.ones(7), 1, backend=backend)
    assert 6 not in res.diagnostics["selected"]
    assert np.isfinite(res.arrays["x"]).all()
    # the window itself: median 2 of [−inf, 1, 2, 3, 4]; −inf is the farther end,
    # then 4 (2 away) against 1 (1 away): {1, 2, 3}
    F = np.array([[-np.inf], [1.0], [2.0], [3.0], [4.0]])
    out, kept, bad = coordinatewise_combine(F, {"x": F}, np.ones(5), mode="closest", t=1,
                                            backend=backend)
    assert out["x"][0] == 2.0 and bad == 0
    np.testing.assert_array_equal(kept, [0, 1, 1, 1, 0])


# -- weights -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mean", "krum", "median", "trmean", "rfa", "bulyan"])
@pytest.mark.parametrize("backend", CPU)
def test_n_samples_whose_sum_overflows_weigh_as_their_ratios(name, backend):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(8, 3))
    ref = RULES.get(name)().aggregate(X, {"x": X}, np.ones(8), 1, backend=backend)
    with np.errstate(over="ignore"):
        res = RULES.get(name)().aggregate(X, {"x": X}, np.full(8, 1e308), 1, backend=backend)
    # the same ratios; the products round differently from those with weight 1
    np.testing.assert_allclose(res.arrays["x"], ref.arrays["x"], rtol=1e-14, atol=1e-15)
    if ref.weights is not None:
        np.testing.assert_allclose(res.weights, ref.weights, rtol=1e-14)


# -- pre-aggregators -----------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["nnm", "clip", "arc", "bucketing"]),
       st.sampled_from(["krum", "median", "mda", "meamed", "trmean"]), st.sampled_from(CPU),
       st.sampled_from([np.nan, np.inf, -np.inf, 1e38, -3.4e38]))
def test_pre_aggregators_keep_hostile_rows_within_f_out_of_the_aggregate(seed, pre, rule, backend,
                                                                        value):
    """With f hostile rows (NaN, ±inf, 1e38, in the features or only in an upload),
    every pre-aggregator in front of a robust rule gives a finite aggregate of
    every array; bucketing with s = 1 (a shuffle) keeps the rule's guarantee."""
    from rfrs_ref.aggregate.pre import build

    rng = np.random.default_rng(seed)
    n, D, f = 11, 4, 2
    X = rng.normal(size=(n, D)).astype(np.float32)
    m = rng.normal(size=(n, D)).astype(np.float32)
    bad = rng.permutation(n)[:f]
    X[bad[0]] = value
    m[bad[1], rng.integers(D)] = value  # hostile behind a harmless feature
    p = build([pre], {"bucket_size": 1, "clip_norm": 1.0}, RULES.get(rule)())
    res = p.aggregate(X, {"x": X, "m": m}, rng.integers(1, 9, size=n), f, backend=backend,
                      reference={"m": np.zeros(D, np.float32)}, rng=rng)
    assert np.isfinite(res.arrays["x"]).all() and np.isfinite(res.arrays["m"]).all()
    if rule in ("krum", "mda") and not np.isfinite(value):
        assert res.kept[bad].max() == 0  # non-finite clients take no part at all
    if rule in ("krum", "mda") and (pre in ("nnm", "bucketing") or not np.isfinite(value)):
        # the hostile feature row is never kept (clip and arc scale a huge finite row into
        # the honest norms, where the rule may keep it: it is harmless there)
        assert res.kept[bad[0]] == 0


# -- centered clipping -------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(CPU), st.integers(0, 8),
       st.sampled_from([np.nan, np.inf, -np.inf, 1e38, -3.4e38]))
def test_centered_clipping_any_number_of_hostile_rows(seed, backend, k, value):
    """Non-finite rows do not vote and huge finite ones are clipped, however many:
    the centre moves by at most τ per iteration and every aggregate is finite."""
    from rfrs_ref.aggregate import CenteredClipping

    rng = np.random.default_rng(seed)
    n, D = 9, 5
    X = rng.normal(size=(n, D)).astype(np.float32)
    v = np.abs(rng.normal(size=(n, D))).astype(np.float32)
    bad = rng.permutation(n)[:k]
    X[bad] = value
    v0 = rng.normal(size=D)
    res = CenteredClipping(tau=0.5, iterations=2).aggregate(
        X, {"x": X, "v": v}, np.ones(n), 0, backend=backend, rule_state={"cc_center": v0},
        reference={"v": np.ones(D, np.float32)})
    assert np.isfinite(res.arrays["x"]).all() and (res.arrays["v"] >= 0).all()
    assert np.isfinite(res.arrays["v"]).all()
    assert np.linalg.norm(res.state["cc_center"] - v0) <= 2 * 0.5 * (1 + 1e-9)
    if not np.isfinite(value):
        assert res.weights[bad].max(initial=0.0) == 0


# -- CAF and SMEA ----------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["caf", "smea"]), st.sampled_from(CPU),
       st.sampled_from([np.nan, np.inf, -np.inf, 1e38, -3.4e38]), st.integers(0, 3))
def test_caf_and_smea_with_f_hostile_rows(seed, rule, backend, value, k):
    rng = np.random.default_rng(seed)
    n, D, f = 9, 4, 3
    X = rng.normal(size=(n, D)).astype(np.float32)
    m = rng.normal(size=(n, D)).astype(np.float32)
    bad = rng.permutation(n)[:k]
    X[bad[: (k + 1) // 2]] = value
    m[bad[(k + 1) // 2:], 0] = value  # behind a harmless feature
    res = RULES.get(rule)().aggregate(X, {"x": X, "m": m}, rng.integers(1, 9, size=n), f,
                                      backend=backend)
    assert np.isfinite(res.arrays["x"]).all() and np.isfinite(res.arrays["m"]).all()
    if not np.isfinite(value):
        assert res.weights[bad].max(initial=0.0) == 0
    else:
        assert res.weights[bad[: (k + 1) // 2]].max(initial=0.0) == 0  # the huge feature rows


# -- finite values near the dtype's maximum ------------------------------------------------


def _near_max_rows(data, dtype, n, D):
    """(n, D) rows mixing ordinary values and values within a factor 4 of ±max, or
    (one draw in three) every value near ±max."""
    big = float(np.finfo(dtype).max)
    width = 32 if dtype == np.float32 else 64
    huge = st.floats(big / 4, big, width=width) | st.floats(-big, -big / 4, width=width)
    normal = st.floats(-10, 10, width=width)
    elem = data.draw(st.sampled_from([huge | normal, huge]))
    vals = data.draw(st.lists(elem, min_size=n * D, max_size=n * D))
    return np.array(vals, dtype=dtype).reshape(n, D)


def _setups():
    from rfrs_ref.aggregate import PRE

    out = [pytest.param(name, None, id=name) for name in RULES]
    for p in PRE:
        for inner in ("mean", "median", "krum", "rfa", "cc"):
            out.append(pytest.param(inner, p, id=f"{p}+{inner}"))
    return out


@settings(max_examples=25, deadline=None)
@pytest.mark.parametrize("name,pre", _setups())
@given(data=st.data())
def test_finite_rows_near_the_dtype_maximum_give_a_finite_aggregate(name, pre, data):
    """Rows near ±1.8e308 (float64) or ±3.4e38 (float32), mixed with ordinary ones or
    not: no rule or pre-aggregator raises anything but the documented PreconditionError
    (and n, f are drawn within the precondition), and every aggregate of finite rows is
    finite: medians are a/2 + b/2 where a + b overflows, weighted sums that overflow are
    taken again as scaled means, distances beyond float64 are measured on scaled rows."""
    from rfrs_ref.aggregate import PreconditionError
    from rfrs_ref.aggregate.pre import build

    dtype = data.draw(st.sampled_from([np.float64, np.float32]))
    backend = data.draw(st.sampled_from(CPU))
    n = data.draw(st.integers(3, 9))
    D = data.draw(st.integers(1, 4))
    rule = build([pre] if pre else [], {"bucket_size": 2}, RULES.get(name)())
    f = data.draw(st.integers(0, n // 2))
    while f > 0:
        try:
            rule.check(n, f)
            break
        except PreconditionError:
            f -= 1
    try:
        rule.check(n, f)
    except PreconditionError:
        return  # no f fits this n (bucketing before krum with 3 rows)
    X = _near_max_rows(data, dtype, n, D)
    m = _near_max_rows(data, dtype, n, D)
    ns = np.array(data.draw(st.lists(st.integers(1, 50), min_size=n, max_size=n)), dtype=float)
    kw = {}
    if getattr(rule, "takes_round_inputs", False):
        kw = dict(reference={"x": np.zeros(D, dtype), "m": np.zeros(D, dtype)},
                  rng=np.random.default_rng(0))
    with np.errstate(over="ignore", invalid="ignore"):
        res = rule.aggregate(X, {"x": X, "m": m}, ns, f, backend=backend, **kw)
    for key in ("x", "m"):
        assert np.isfinite(res.arrays[key]).all(), (key, res.arrays[key])
    if res.weights is not None:
        assert np.isfinite(res.weights).all()


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("name", ["mean", "krum", "mda", "monna"])
def test_a_weighted_mean_of_rows_at_dbl_max_is_not_rounded_past_it(name, backend):
    """Σ wᵢxᵢ with Σ wᵢ = 1 and every xᵢ = DBL_MAX rounds past DBL_MAX for these nᵢ
    (inf, in about 1 draw in 10 of random nᵢ): the sum is taken again as a scaled
    mean, clamped to the values' range."""
    big = float(np.finfo(np.float64).max)
    ns = np.array([18.0, 8, 9, 10, 19, 4, 10, 1, 9])
    X = np.full((9, 3), big)
    res = RULES.get(name)().aggregate(X, {"x": X}, ns, 1, backend=backend)
    np.testing.assert_array_equal(res.arrays["x"], [big] * 3)
