"""Coordinate-wise selection kernels: sorting networks, oracle, Numba agreement."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.kernels.coordinatewise import BLOCK, coordinatewise_combine, sorting_network

HOSTILE = [np.nan, np.inf, -np.inf, 1e38, -1e38, 3.4e38]


def _apply(net, x):
    y = np.array(x, dtype=np.float64)
    for a, b in net:
        if y[a] > y[b]:
            y[a], y[b] = y[b], y[a]
    return y


@pytest.mark.parametrize("s", range(1, 13))
def test_network_sorts_every_zero_one_input(s):
    # the 0-1 principle: a comparator network that sorts all 0/1 inputs sorts everything
    net = sorting_network(s)
    assert (net[:, 0] < net[:, 1]).all() and (net < s).all()
    for bits in itertools.product((0, 1), repeat=s):
        assert (np.diff(_apply(net, bits)) >= 0).all(), bits


@pytest.mark.parametrize("s", [13, 31, 52, 55, 100, 129])
def test_network_and_selection_network(s):
    rng = np.random.default_rng(s)
    full = sorting_network(s)
    t = s // 3
    sel = sorting_network(s, (t, s - 1 - t))
    assert len(sel) <= len(full)
    for _ in range(50):
        x = rng.integers(-5, 5, size=s)
        np.testing.assert_array_equal(_apply(full, x), np.sort(x))
        y = _apply(sel, x)
        assert y[t] == np.sort(x)[t] and y[s - 1 - t] == np.sort(x)[s - 1 - t]


def test_known_answers():
    F = np.array([[1.0, 5.0], [2.0, np.nan], [3.0, 1.0], [4.0, 2.0], [100.0, 3.0]])
    A = {"x": F, "y": np.arange(10.0).reshape(5, 2)}
    w = np.array([1.0, 1.0, 2.0, 1.0, 1.0])
    for backend in ("numpy", "numba"):
        # trimmed mean, t = 1: coordinate 0 keeps rows 1, 2, 3; coordinate 1 ranks
        # 1.0 (row 2) < 2.0 (row 3) < 3.0 (row 4) < 5.0 (row 0) < NaN (row 1) and keeps 3, 4, 0
        out, kept, bad = coordinatewise_combine(F, A, w, mode="trim", t=1, backend=backend)
        np.testing.assert_allclose(out["x"], [(2 + 2 * 3 + 4) / 4, (2 + 3 + 5) / 3])
        np.testing.assert_allclose(out["y"], [(2 + 2 * 4 + 6) / 4, (7 + 9 + 1) / 3])
        np.testing.assert_array_equal(kept, [1, 1, 1, 2, 1])
        assert bad == 0
        # median of 4 rows (even): the two middle ones, weighted by w
        out, kept, _ = coordinatewise_combine(F[:4], {"x": F[:4]}, w[:4], mode="trim", t=1, backend=backend)
        np.testing.assert_allclose(out["x"][0], (2 + 2 * 3) / 3)
        # Bulyan window: s = 5, t = 1 -> the 3 values closest to the median (3.0) at coordinate 0
        out, kept, _ = coordinatewise_combine(F, {"x": F}, np.ones(5), mode="closest", t=1, backend=backend)
        np.testing.assert_allclose(out["x"][0], 3.0)  # 2, 3, 4
        np.testing.assert_allclose(out["x"][1], 2.0)  # median 3.0: 2, 3 and 1 (tie 1 vs 5: upper end dropped)


def test_ties_are_broken_by_row_index():
    F = np.zeros((4, 3))
    A = {"x": F, "id": np.repeat(np.arange(4.0)[:, None], 3, axis=1)}
    for backend in ("numpy", "numba"):
        out, kept, _ = coordinatewise_combine(F, A, np.ones(4), mode="trim", t=1, backend=backend)
        np.testing.assert_array_equal(out["id"], [1.5, 1.5, 1.5])  # rows 1 and 2 (stable ranks 1, 2)
        np.testing.assert_array_equal(kept, [0, 3, 3, 0])


def test_nonfinite_upload_ranks_as_extreme_even_with_a_harmless_feature():
    F = np.array([[0.0], [1.0], [2.0]])
    A = {"x": F, "m": np.array([[1.0], [np.nan], [3.0]])}
    for backend in ("numpy", "numba"):
        out, kept, bad = coordinatewise_combine(F, A, np.ones(3), mode="trim", t=1, backend=backend)
        assert np.isfinite(out["m"]).all() and kept[1] == 0 and bad == 0


@st.composite
def problems(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n = draw(st.integers(1, 12))
    D = draw(st.integers(1, BLOCK + 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # few distinct values: plenty of ties
    F = rng.integers(-3, 4, size=(n, D)).astype(dtype)
    for _ in range(draw(st.integers(0, 6))):
        F[rng.integers(n), rng.integers(D)] = draw(st.sampled_from(HOSTILE))
    A = {"theta": F + dtype(1), "m": rng.normal(size=(n, D)).astype(dtype)}
    if draw(st.booleans()):
        A["m"][rng.integers(n), rng.integers(D)] = np.nan
    w = rng.integers(1, 6, size=n).astype(np.float64)
    mode = draw(st.sampled_from(["trim", "closest", "nearest"]))
    rows = None
    if draw(st.booleans()):
        rows = np.sort(rng.choice(n, size=draw(st.integers(1, n)), replace=False))
    s = n if rows is None else len(rows)
    t = draw(st.integers(0, (s - 1) // 2))
    return F, A, w, mode, t, rows


@given(problems())
def test_numba_agrees_with_oracle(p):
    F, A, w, mode, t, rows = p
    before = {k: v.copy() for k, v in A.items()}
    o1, k1, b1 = coordinatewise_combine(F, A, w, mode=mode, t=t, rows=rows, backend="numpy")
    o2, k2, b2 = coordinatewise_combine(F, A, w, mode=mode, t=t, rows=rows, backend="numba")
    for name in A:
        assert o2[name].dtype == A[name].dtype
        np.testing.assert_allclose(o2[name], o1[name], rtol=1e-6, equal_nan=True)
        np.testing.assert_array_equal(A[name], before[name])
    np.testing.assert_array_equal(k1, k2)
    assert b1 == b2


def test_window_errors_name_s_and_t():
    with pytest.raises(ValueError, match="s=3, t=2"):
        coordinatewise_combine(np.zeros((3, 2)), {}, np.ones(3), mode="trim", t=2)
    with pytest.raises(ValueError, match="unknown window"):
        coordinatewise_combine(np.zeros((3, 2)), {}, np.ones(3), mode="middle", t=0)


@settings(max_examples=5)
@given(st.integers(50, 130))
def test_large_row_counts_agree(n):
    rng = np.random.default_rng(n)
    F = rng.normal(size=(n, 70)).astype(np.float32)
    t = n // 4
    o1, k1, _ = coordinatewise_combine(F, {"x": F}, np.ones(n), mode="trim", t=t, backend="numpy")
    o2, k2, _ = coordinatewise_combine(F, {"x": F}, np.ones(n), mode="trim", t=t, backend="numba")
    np.testing.assert_allclose(o1["x"], o2["x"], rtol=1e-6)
    np.testing.assert_array_equal(k1, k2)


# -- float64 values near ±DBL_MAX ----------------------------------------------------------

DBL_MAX = float(np.finfo(np.float64).max)


def test_middle_is_the_plain_half_sum_wherever_that_is_finite():
    """``middle`` changes nothing where 0.5 · (a + b) does not overflow, subnormals
    included (where a/2 + b/2 would differ: 3·2⁻¹⁰⁷⁴ twice), and gives the exact
    a/2 + b/2 where a + b overflows."""
    from rfrs_ref.kernels.coordinatewise import middle

    rng = np.random.default_rng(0)
    a = np.ldexp(rng.uniform(-2, 2, 200_000), rng.integers(-1074, 1023, 200_000))
    b = np.ldexp(rng.uniform(-2, 2, 200_000), rng.integers(-1074, 1023, 200_000))
    tiny = 3 * 2.0 ** -1074
    a = np.append(a, [tiny, DBL_MAX, -DBL_MAX, DBL_MAX, np.inf, np.nan])
    b = np.append(b, [tiny, DBL_MAX, -DBL_MAX, 1.0, -np.inf, 1.0])
    with np.errstate(over="ignore", invalid="ignore"):
        plain = 0.5 * (a + b)
    m = middle(a, b)
    fin = np.isfinite(plain) | ~(np.isfinite(a) & np.isfinite(b))
    np.testing.assert_array_equal(m[fin], plain[fin])  # bit for bit (NaN where NaN)
    assert m[-6] == tiny and 0.5 * tiny + 0.5 * tiny != tiny
    assert m[-5] == DBL_MAX and m[-4] == -DBL_MAX and m[-3] == 0.5 * DBL_MAX + 0.5
    # where a + b overflows, both are huge: halving is exact, a/2 + b/2 is (a + b)/2 rounded
    over = ~fin
    np.testing.assert_array_equal(m[over], 0.5 * a[over] + 0.5 * b[over])


@pytest.mark.parametrize("backend", ["numpy", "numba",
                                     pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("mode,t", [
    ("trim", 1),  # the two middle values, whose weighted sum overflows
    ("closest", 1),  # 2 closest to a median whose plain half sum overflows
    ("nearest", 2),
])
def test_windows_of_huge_finite_values_have_a_finite_mean(backend, mode, t):
    if backend == "cuda":
        from numba import cuda

        if not cuda.is_available():
            pytest.skip("no CUDA device and no simulator")
    # sorted: −DBL_MAX, DBL_MAX/2, DBL_MAX, DBL_MAX: the median is (DBL_MAX/2 + DBL_MAX)/2,
    # whose plain half sum overflows; weights 1, 3, 2, 5 make every weighted sum overflow
    F = np.array([[DBL_MAX], [-DBL_MAX], [DBL_MAX / 2], [DBL_MAX]])
    A = np.array([[DBL_MAX], [-DBL_MAX], [DBL_MAX / 2], [DBL_MAX]])
    w = np.array([2.0, 1.0, 3.0, 5.0])
    out, kept, bad = coordinatewise_combine(F, {"x": F, "a": A}, w, mode=mode, t=t,
                                            backend=backend)
    assert bad == 0
    for name in ("x", "a"):
        assert np.isfinite(out[name]).all(), (name, out[name])
    kept_rows = np.flatnonzero(kept)
    ref = (w[kept_rows] / w[kept_rows].sum()) @ (F[kept_rows, 0] / 4) * 4
    np.testing.assert_allclose(out["x"], [ref], rtol=1e-15)
    if mode == "trim":
        np.testing.assert_array_equal(kept, [1, 0, 1, 0])  # ranks 1, 2: rows 2 and 0
        # the nᵢ-weighted mean of DBL_MAX/2 (weight 3) and DBL_MAX (weight 2)
        np.testing.assert_allclose(out["x"], [0.7 * DBL_MAX], rtol=1e-15)
    else:
        # −DBL_MAX is farthest from the median 0.75·DBL_MAX, then a tie (0.25·DBL_MAX
        # each side) drops the upper end: rows 2 and 0 (the old inf median kept 0 and 3)
        np.testing.assert_array_equal(kept, [1, 0, 1, 0])


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["trim", "closest", "nearest"]),
       st.integers(2, 9), st.integers(1, 140))
def test_numba_agrees_with_the_oracle_on_values_near_dbl_max(seed, mode, n, D):
    """Rows mixing ordinary values and values within a factor 4 of ±DBL_MAX: every
    window of finite values gives a finite aggregate, on both backends, which agree."""
    rng = np.random.default_rng(seed)
    F = rng.normal(size=(n, D))
    huge = rng.random((n, D)) < 0.6
    F[huge] = rng.choice([-1, 1], huge.sum()) * rng.uniform(0.25, 1, huge.sum()) * DBL_MAX
    A = F[::-1].copy()
    w = rng.integers(1, 9, size=n).astype(float)
    t = int(rng.integers(0, (n - 1) // (1 if mode == "nearest" else 2) + 1))
    ref = coordinatewise_combine(F, {"x": F, "a": A}, w, mode=mode, t=t, backend="numpy")
    got = coordinatewise_combine(F, {"x": F, "a": A}, w, mode=mode, t=t, backend="numba")
    np.testing.assert_array_equal(got[1], ref[1])
    for name in ("x", "a"):
        assert np.isfinite(ref[0][name]).all() and np.isfinite(got[0][name]).all()
        np.testing.assert_allclose(got[0][name], ref[0][name], rtol=1e-12)


# -- columns shared by class (robust rounds on shared rows) --------------------------------

@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 30), st.integers(1, 2), st.integers(1, 3 * BLOCK),
       st.sampled_from([np.float32, np.float64]), st.floats(0.0, 0.6),
       st.sampled_from(["trim", "closest", "nearest"]))
def test_shared_columns_give_the_kernel_on_the_expanded_rows(seed, n, classes, S, dtype, equal,
                                                            mode):
    """window_shared_combine (each row holding its class's values) gives the fused kernel's
    outputs and kept counts on the rows expanded by class, bit for bit, for every window
    and every t, columns where the classes' values are equal included."""
    from rfrs_ref.kernels.coordinatewise import window_shared_combine

    rng = np.random.default_rng(seed)
    t = int(rng.integers(0, (n - 1 if mode == "nearest" else (n - 1) // 2) + 1))
    cls = rng.integers(0, classes, size=n)
    F = rng.normal(size=(classes, S)).astype(dtype)
    if classes == 2:
        same = rng.random(S) < equal
        F[1, same] = F[0, same]
    ups = {"m": rng.normal(size=(classes, S)).astype(dtype),
           "theta": (1e3 * rng.normal(size=(classes, S))).astype(np.float32)}
    w = rng.integers(1, 60, size=n).astype(float)
    if rng.random() < 0.3:  # values of every magnitude: the median's arithmetic decides
        F *= np.exp(rng.normal(0, 20, size=S)).astype(dtype)
    got = window_shared_combine(F, ups, cls, w, mode=mode, t=t)
    want = coordinatewise_combine(F[cls], {k: v[cls] for k, v in ups.items()}, w, mode=mode, t=t)
    for k in ups:
        assert got[0][k].dtype == want[0][k].dtype
        np.testing.assert_array_equal(got[0][k].view(np.uint8), want[0][k].view(np.uint8))
    np.testing.assert_array_equal(got[1], want[1])
    assert got[2] == want[2] == 0


@pytest.mark.parametrize("mode", ["trim", "closest", "nearest"])
def test_shared_columns_whose_sum_overflows_or_whose_upload_is_not_finite_go_to_the_kernel(mode):
    """A float64 window of values near ±1.8e308 whose weighted sum overflows, or an upload
    that is not finite, is no result of the shared columns (it used to come out as inf,
    counted as no non-finite value kept): None, so the caller runs the kernel on the
    expanded rows, which combines the window without overflow and counts what it keeps."""
    from rfrs_ref.kernels.coordinatewise import window_shared_combine

    cls = np.array([0, 1, 0, 1, 1, 0, 1])
    w = np.arange(1.0, 8.0)
    F = np.array([[0.9 * DBL_MAX, 1.0], [0.8 * DBL_MAX, 2.0]])
    assert window_shared_combine(F, {"x": F}, cls, w, mode=mode, t=1) is None
    want = coordinatewise_combine(F[cls], {"x": F[cls]}, w, mode=mode, t=1)
    assert np.isfinite(want[0]["x"]).all() and want[2] == 0
    small = F / DBL_MAX
    up = small.astype(np.float32)
    up[1, 1] = np.inf
    assert window_shared_combine(small, {"x": up}, cls, w, mode=mode, t=1) is None
    assert coordinatewise_combine(small[cls], {"x": up[cls]}, w, mode=mode, t=1)[2] > 0
    assert window_shared_combine(small, {"x": small}, cls, w, mode=mode, t=1) is not None


def test_shared_columns_known_answer_and_refusals():
    from rfrs_ref.kernels.coordinatewise import shared_ranks, window_shared_combine

    # rows of classes 0, 1, 0, 1, 1; trim 1: ranks 1..3 kept
    ranks, counts = shared_ranks(np.array([0, 1, 0, 1, 1]))
    np.testing.assert_array_equal(counts, [2, 3])
    pats = (ranks >= 1) & (ranks <= 3)
    # class 0 below: order 0, 2, 1, 3, 4 -> ranks 0, 2, 1, 3, 4
    np.testing.assert_array_equal(pats[0], [False, True, True, True, False])
    # class 0 above: order 1, 3, 4, 0, 2 -> ranks 3, 0, 4, 1, 2
    np.testing.assert_array_equal(pats[1], [True, False, False, True, True])
    np.testing.assert_array_equal(pats[2], [False, True, True, True, False])
    F = np.array([[1.0, 5.0], [3.0, 5.0]])
    out, kept, bad = window_shared_combine(F, {"x": F}, np.array([0, 1, 0, 1, 1]), np.ones(5), mode="trim", t=1)
    np.testing.assert_array_equal(out["x"], [(3 + 1 + 3) / 3, 5.0])
    np.testing.assert_array_equal(kept, [0, 2, 2, 2, 0])
    F[1, 0] = np.nan
    assert window_shared_combine(F, {"x": F}, np.array([0, 1, 0, 1, 1]), np.ones(5), mode="trim", t=1) is None
    with pytest.raises(ValueError, match="classes"):
        window_shared_combine(F, {"x": F}, np.array([0, 2]), np.ones(2), mode="trim", t=0)
    with pytest.raises(ValueError, match="window"):
        window_shared_combine(F, {"x": F}, np.array([0, 1]), np.ones(2), mode="trim", t=1)
    with pytest.raises(ValueError, match="unknown window"):
        window_shared_combine(F, {"x": F}, np.array([0, 1]), np.ones(2), mode="mean", t=0)
    # Meamed's window ("nearest", t = 1) of 0, 0, 1, 1, 1 at values 1 < 3: the median is
    # 3, so the window of 4 drops the 1 of the lowest rank (row 0)
    F = np.array([[1.0], [3.0]])
    out, kept, _ = window_shared_combine(F, {"x": F}, np.array([0, 0, 1, 1, 1]), np.ones(5),
                                         mode="nearest", t=1)
    np.testing.assert_array_equal(out["x"], [(1 + 3 * 3) / 4])
    np.testing.assert_array_equal(kept, [0, 1, 1, 1, 1])


@st.composite
def derived_problems(draw):
    """θ (n, D), θ̄ (D,), an upload m: few distinct values (ties of θ − θ̄), hostile
    values in θ and θ̄, and θ − θ̄ that overflows float32 or rounds two θ to one feature."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n = draw(st.integers(1, 12))
    D = draw(st.integers(1, BLOCK + 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    theta = (rng.integers(-3, 4, size=(n, D)) * draw(st.sampled_from([1.0, 1e-9, 0.25]))).astype(dtype)
    base = rng.integers(-2, 3, size=D).astype(dtype)
    if draw(st.booleans()):
        base[rng.integers(D)] = dtype(3e38)  # θ − θ̄ overflows where θ is negative
    if draw(st.booleans()):
        base[rng.integers(D)] = dtype(1e8)  # θ − θ̄ rounds distinct θ to one feature
    for _ in range(draw(st.integers(0, 6))):
        theta[rng.integers(n), rng.integers(D)] = draw(st.sampled_from(HOSTILE))
    if draw(st.booleans()):
        base[rng.integers(D)] = draw(st.sampled_from(HOSTILE))
    A = {"theta": theta, "m": rng.normal(size=(n, D)).astype(dtype)}
    if draw(st.booleans()):
        A["m"][rng.integers(n), rng.integers(D)] = np.nan
    w = rng.integers(1, 6, size=n).astype(np.float64)
    mode = draw(st.sampled_from(["trim", "closest", "nearest"]))
    t = draw(st.integers(0, (n - 1) // 2))
    # θ − θ̄ (None), Adam's, momentum's and SGD's recovered gradients (a, c, flip)
    coef = draw(st.sampled_from([None, (0.9, 1.0 - 0.9, False), (0.99, 1.0, False),
                                 (1.0, 0.01, True)]))
    return theta, base, A, w, mode, t, coef


@settings(deadline=None)
@given(derived_problems())
def test_features_derived_in_the_kernel_are_the_held_features(p):
    """``base=`` (and ``coef=``): the kernel ranks on θᵢ − θ̄, or (x − a·b)/c, computed
    where it reads the array; the aggregate, kept counts and non-finite count are those
    of the features held as a matrix (``derived_features``, the round's own θ − θ̄ or
    ĝ), bit for bit, and the oracle builds the same matrix."""
    from rfrs_ref.kernels.coordinatewise import derived_features

    theta, base, A, w, mode, t, coef = p
    before = {k: v.copy() for k, v in A.items()}
    X = derived_features(theta, base, coef)
    if coef is None:
        with np.errstate(invalid="ignore", over="ignore"):
            assert np.array_equal(X, np.subtract(theta, base), equal_nan=True)  # one rounding
    held = coordinatewise_combine(X, A, w, mode=mode, t=t, backend="numba")
    derived = coordinatewise_combine(theta, A, w, mode=mode, t=t, backend="numba", base=base,
                                     coef=coef)
    for name in A:
        assert derived[0][name].dtype == A[name].dtype
        assert np.array_equal(held[0][name].view(np.uint8), derived[0][name].view(np.uint8)), name
        np.testing.assert_array_equal(A[name], before[name])
    np.testing.assert_array_equal(held[1], derived[1])
    assert held[2] == derived[2]
    oracle = coordinatewise_combine(theta, A, w, mode=mode, t=t, backend="numpy", base=base,
                                    coef=coef)
    expected = coordinatewise_combine(X, A, w, mode=mode, t=t, backend="numpy")
    for name in A:
        assert np.array_equal(oracle[0][name], expected[0][name], equal_nan=True)


def test_derived_features_refuse_a_base_of_the_wrong_length():
    with pytest.raises(ValueError, match=r"base must have shape \(3,\)"):
        coordinatewise_combine(np.zeros((3, 3)), {}, np.ones(3), mode="trim", t=1,
                               base=np.zeros(2))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 24), st.integers(1, 24), st.integers(1, 2 * BLOCK + 3),
       st.sampled_from([np.float32, np.float64]), st.sampled_from(["trim", "closest", "nearest"]),
       st.booleans(), st.booleans(), st.booleans())
def test_copies_give_the_kernel_on_the_rows_written_out(seed, n, u, D, dtype, mode, hostile, subset,
                                                        derive):
    """Rows given once with the map of their copies (``copies``) give the outputs, kept
    counts and non-finite count of the rows written out, bit for bit: the ranks counted
    where few distinct rows repeat (at most COUNTED_ROWS), sorted by the network
    otherwise; ties of value, ±0, NaN, ±inf and values near the float32 range
    included, candidate subsets and features derived in the kernel too."""
    rng = np.random.default_rng(seed)
    u = min(u, n)
    copies = np.concatenate([rng.permutation(u), rng.integers(0, u, size=n - u)])
    rng.shuffle(copies)
    F = rng.integers(-2, 3, size=(u, D)).astype(dtype) if rng.random() < 0.5 else \
        rng.normal(size=(u, D)).astype(dtype)
    F[F == 0] = rng.choice(np.array([0.0, -0.0], dtype=dtype), size=int((F == 0).sum()))
    ups = {"m": rng.normal(size=(u, D)).astype(dtype), "theta": (F + dtype(1)).astype(np.float32)}
    if hostile:
        for _ in range(int(rng.integers(1, 8))):
            F[rng.integers(u), rng.integers(D)] = rng.choice(HOSTILE)
            ups["m"][rng.integers(u), rng.integers(D)] = rng.choice(HOSTILE)
    w = rng.integers(1, 60, size=n).astype(float)
    rows = np.sort(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False)) if subset else None
    s = n if rows is None else rows.size
    t = int(rng.integers(0, (s - 1 if mode == "nearest" else (s - 1) // 2) + 1))
    kw = dict(base=rng.normal(size=D).astype(dtype), coef=(0.9, 0.1, False)) if derive else {}
    got = coordinatewise_combine(F, ups, w, mode=mode, t=t, rows=rows, copies=copies, **kw)
    want = coordinatewise_combine(F[copies], {k: v[copies] for k, v in ups.items()}, w, mode=mode,
                                  t=t, rows=rows, **kw)
    for k in ups:
        assert got[0][k].dtype == want[0][k].dtype
        np.testing.assert_array_equal(got[0][k].view(np.uint8), want[0][k].view(np.uint8))
    np.testing.assert_array_equal(got[1], want[1])
    assert got[2] == want[2]
    # the oracle takes copies by writing the rows out
    oracle = coordinatewise_combine(F, ups, w, mode=mode, t=t, rows=rows, copies=copies,
                                    backend="numpy", **kw)
    np.testing.assert_array_equal(oracle[1], want[1])


def test_copies_take_the_counting_path_and_refuse_a_bad_map(monkeypatch):
    """Few distinct rows repeated take the counted ranks (the network is not run); a map
    pointing outside the rows given is refused with the number of rows."""
    from rfrs_ref.kernels import coordinatewise as cw

    plans = []
    real = cw._key_rows
    monkeypatch.setattr(cw, "_key_rows", lambda rows: plans.append(real(rows)) or plans[-1])
    F = np.array([[1.0, 5.0], [3.0, -1.0]])
    out, kept, _ = coordinatewise_combine(F, {"x": F}, np.ones(5), mode="trim", t=2,
                                          copies=np.array([0, 1, 1, 0, 1]))
    assert plans[-1][4] and plans[-1][0].tolist() == [0, 1] and plans[-1][3].tolist() == [2, 3]
    # the median of 1, 3, 3, 1, 3 and of 5, −1, −1, 5, −1
    assert out["x"].tolist() == [3.0, -1.0]
    # the middle rank (ties by index): row 1 in the first column, row 4 in the second
    assert kept.tolist() == [0, 1, 0, 0, 1]
    with pytest.raises(ValueError, match="copies must map each row to one of the 2 rows given"):
        coordinatewise_combine(F, {"x": F}, np.ones(3), mode="trim", t=0, copies=np.array([0, 2, 1]))
