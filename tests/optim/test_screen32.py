"""The verification screen in float32 (rfrs_ref/optim/screen32.py, docs/optimizers.md
"The screen in float32"): it passes a coordinate only where the float64 screen passes it,
at the extremes of float32 and at the threshold itself; honest uploads pass it; the
screen's decisions (the sure rows) are those of the float64 screen, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numba import njit

from rfrs_ref.kernels import optim as K
from rfrs_ref.kernels.distances import n_chunks
from rfrs_ref.optim import OPTIMIZERS, VERIFY_SAFETY
from rfrs_ref.optim import screen32 as S32
from rfrs_ref.optim import tolerance as tol

ROOT = ("adagrad", "rmsprop")
NAMES = ("adam",) + ROOT
U, TINY = S32.U32, S32.TINY32


# -- the float64 screen's decision, coordinate by coordinate (its own inlined functions) --

@njit
def _adam64(mb, vb, tb, m, v, th, g, beta1, beta2, c2, lr_t, eps, u, tiny, safety):
    n, D = th.shape
    out = np.empty((n, D), dtype=np.bool_)
    for r in range(n):
        for k in range(D):
            mk, vk, t = np.float64(m[r, k]), np.float64(v[r, k]), np.float64(th[r, k])
            rv, sv, rt, st_ = K._adam_checks(mk, vk, t, np.float64(mb[k]), np.float64(vb[k]),
                                             np.float64(tb[k]), g[r, k], beta1, beta2, c2, lr_t,
                                             eps, u, tiny, safety)
            bad = ((1 - np.int64(np.isfinite(mk) & np.isfinite(vk) & np.isfinite(t)))
                   + np.int64(vk < 0.0) + K._unsure(rv, sv) + K._unsure(rt, st_))
            out[r, k] = bad == 0
    return out


@njit
def _root64(rb, tb, rr, th, g, decay, coef, lr, eps, u, tiny, safety):
    n, D = th.shape
    out = np.empty((n, D), dtype=np.bool_)
    for r in range(n):
        for k in range(D):
            rk, t = np.float64(rr[r, k]), np.float64(th[r, k])
            res, sb = K._root_check(rk, np.float64(rb[k]), np.float64(tb[k]), g[r, k], decay, coef,
                                    lr, eps, u, tiny, safety)
            bad = ((1 - np.int64(np.isfinite(rk) & np.isfinite(t))) + np.int64(rk < 0.0)
                   + K._unsure(res, sb))
            out[r, k] = bad == 0
    return out


def decisions(opt, state, up, t, recovered, safety, mutate=None):
    """(sure32, sure64, use32) per coordinate: the float32 reference's decision and the
    float64 screen's, ĝ as the kernels take it (recovered in registers, or the rows given)."""
    with np.errstate(all="ignore"):
        if opt.name == "adam":
            arrays, sc = opt._verify_args(state, up, t, recovered)
            b1, c1, b2, c2, lr_t, eps = sc
            k32, use = S32.adam_constants(arrays[:6], *sc, U, TINY, safety)
            if mutate:
                mutate(k32)
            if recovered is None:
                g32 = S32.adam_gradient(up["m"], state["m"], k32)
                g64 = (up["m"].astype(np.float64) - b1 * state["m"].astype(np.float64)) * (1.0 / c1)
            else:
                g32, g64 = recovered.astype(np.float32), recovered.astype(np.float64)
            s32 = S32.adam_sure(state["m"], state["v"], state["theta"], up["m"], up["v"],
                                up["theta"], g32, k32)
            s64 = _adam64(state["m"], state["v"], state["theta"], up["m"], up["v"], up["theta"],
                          g64, b1, b2, c2, lr_t, eps, U, TINY, safety)
        else:
            arrays, sc = opt._verify_args(state, up, recovered)
            decay, coef, lr, eps = sc
            k32, use = S32.root_constants(arrays[:4], *sc, U, TINY, safety)
            if mutate:
                mutate(k32)
            if recovered is None:
                g32 = S32.root_gradient(state["theta"], up["r"], up["theta"], k32)
                d = state["theta"].astype(np.float64) - up["theta"].astype(np.float64)
                g64 = d * (np.sqrt(up["r"].astype(np.float64)) + eps) * (1.0 / lr)
            else:
                g32, g64 = recovered.astype(np.float32), recovered.astype(np.float64)
            s32 = S32.root_sure(state["r"], state["theta"], up["r"], up["theta"], g32, k32)
            s64 = _root64(state["r"], state["theta"], up["r"], up["theta"], g64, decay, coef, lr,
                          eps, U, TINY, safety)
    return s32, s64, use


def assert_conservative(opt, state, up, t, safety):
    X = np.empty(up["theta"].shape, np.float32)
    opt.recover_batch(state, up, t, X)
    for rec in (None, X, X.astype(np.float64)):
        s32, s64, use = decisions(opt, state, up, t, rec, safety)
        bad = np.argwhere(s32 & ~s64)
        assert bad.size == 0, (opt, safety, bad[:3], {k: v[tuple(bad[0])] for k, v in up.items()})


# -- strategies: float32 at its extremes --------------------------------------------------

F32_MAX = float(np.finfo(np.float32).max)


def anyf32(lo=-F32_MAX, hi=F32_MAX):
    """Every finite float32, subnormals and values near the largest included."""
    return st.floats(lo, hi, width=32, allow_nan=False, allow_infinity=False)


def scaled(draw, shape, nonneg=False):
    """float32 values of one drawn decade (1e-45 to 1e38), with zeros and sign changes."""
    e = draw(st.integers(-45, 37))
    base = draw(hnp.arrays(np.float64, shape, elements=st.floats(0.1, 10.0)))
    x = base * 10.0**e
    if not nonneg:
        x = x * draw(hnp.arrays(np.float64, shape, elements=st.sampled_from([-1.0, 1.0])))
    x = x * draw(hnp.arrays(np.float64, shape, elements=st.sampled_from([0.0, 1.0, 1.0, 1.0])))
    with np.errstate(over="ignore"):
        return np.clip(x, -F32_MAX, F32_MAX).astype(np.float32)


@st.composite
def extreme_cases(draw, name):
    """(optimizer, state, upload, t): arbitrary float32 state and gradients of any scale
    (subnormal to near the largest float32, v̄ = 0 included), honest uploads with some
    coordinates nudged by a relative 1e-7 to 1e-3 or replaced by arbitrary float32 values."""
    opt = OPTIMIZERS.get(name)(**draw(_hyper(name)))
    D = draw(st.integers(1, 10))
    n = draw(st.integers(1, 3))
    state = {"theta": scaled(draw, D) if draw(st.booleans()) else draw(
        hnp.arrays(np.float32, D, elements=anyf32(-1e6, 1e6)))}
    for k in opt.arrays:
        if k == "m":
            state[k] = scaled(draw, D)
        elif k in ("v", "r"):
            state[k] = scaled(draw, D, nonneg=True)
    grads = scaled(draw, (n, D))
    t = draw(st.integers(1, 10) | st.integers(1, 10**6))
    up = {k: np.empty((n, D), np.float32) for k in opt.arrays}
    with np.errstate(all="ignore"):
        opt.client_rule_batch(state, grads, t, up, backend="numba")
        for k in opt.arrays:
            mask = draw(hnp.arrays(np.bool_, (n, D)))
            how = draw(st.sampled_from(["nudge", "any"]))
            if how == "nudge":
                f = draw(st.sampled_from([1e-7, 1e-6, 1e-5, 1e-3, -1e-6]))
                up[k][mask] = (up[k][mask] * np.float32(1 + f))
            else:
                up[k][mask] = draw(hnp.arrays(np.float32, int(mask.sum()), elements=anyf32()))
    return opt, state, up, t


@st.composite
def _hyper(draw, name):
    kw = {}
    if draw(st.booleans()):
        return kw
    kw["lr"] = draw(st.floats(1e-6, 10.0))
    kw["eps"] = draw(st.floats(1e-12, 1e-1))
    if name == "adam":
        kw["beta1"] = draw(st.sampled_from([0.0, 0.5, 0.9, 0.999]) | st.floats(0.0, 0.9999))
        kw["beta2"] = draw(st.sampled_from([0.0, 0.9, 0.999]) | st.floats(0.0, 0.9999))
    if name == "rmsprop":
        kw["beta4"] = draw(st.sampled_from([0.0, 0.9, 0.99]) | st.floats(0.0, 0.9999))
    return kw


SAFETIES = st.sampled_from([1.0, VERIFY_SAFETY]) | st.floats(1.0, 2.0**20)


# -- the law: the float32 test passes only what the float64 screen passes ----------------

@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60)
@given(data=st.data())
def test_float32_test_passes_only_what_the_float64_screen_passes(name, data):
    """Per coordinate, at every scale float32 has (subnormal to near its largest value,
    v̄ = 0, zero gradients), arbitrary hyperparameters and S in [1, 2²⁰], ĝ recovered
    in registers or read from float32 or float64 rows: where the float32 test passes,
    the float64 screen passes."""
    opt, state, up, t = data.draw(extreme_cases(name))
    assert_conservative(opt, state, up, t, data.draw(SAFETIES))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40)
@given(data=st.data())
def test_float32_test_is_conservative_on_the_arbitrary_cases_of_the_honesty_test(name, data, ot):
    opt, state, grads, t = data.draw(ot.cases(name, np.float32))
    up = ot.upload_numba(opt, state, grads, t, np.float32)
    assert_conservative(opt, state, up, t, data.draw(SAFETIES))


def _neighbours(x, k=3):
    """x and its k float32 neighbours on either side, as k·2 + 1 arrays."""
    out, a, b = [x], x, x
    for _ in range(k):
        a, b = np.nextafter(a, np.float32(np.inf)), np.nextafter(b, np.float32(-np.inf))
        out += [a, b]
    return out


def at_threshold(opt, state, up, t, safety):
    """Uploads crafted to sit on the float64 screen's threshold: from each honest row, a
    rule array moved so that its residual is ±(1 − 10⁻³, 1, 1 + 10⁻³)·S·τ, then each of
    those values and its three float32 neighbours on either side (so some land just inside
    the threshold and some just beyond it)."""
    tb = state["theta"].astype(np.float64)
    rows = {k: [] for k in opt.arrays}
    n = up["theta"].shape[0]
    with np.errstate(all="ignore"):
        for r in range(n):
            row = {k: up[k][r].astype(np.float64) for k in opt.arrays}
            targets = []
            if opt.name == "adam":
                mb, vb = state["m"].astype(np.float64), state["v"].astype(np.float64)
                b1, c2, lr_t = opt.beta1, 1.0 - opt.beta2, opt.step_size(t)
                m, v = row["m"], row["v"]
                g = (m - b1 * mb) * (1.0 / (1.0 - b1))
                b = tol.adam_recovery_bound(mb, g, b1, U, TINY)
                sv = safety * tol.second_moment_bound(v, vb, g, b, opt.beta2, c2, U, TINY)
                st_ = safety * tol.adam_theta_bound(tb, m, v, lr_t, opt.eps, U, TINY)
                step = lr_t * m * (1.0 / (np.sqrt(v) + opt.eps))
                for f in (1 - 1e-3, 1.0, 1 + 1e-3):
                    for sgn in (-1.0, 1.0):
                        targets.append(("theta", tb - step + sgn * f * st_))
                        targets.append(("v", np.maximum(opt.beta2 * vb + c2 * g * g + sgn * f * sv, 0)))
            else:
                decay, coef = opt._decay_coef()
                rb, rr = state["r"].astype(np.float64), row["r"]
                g = (tb - row["theta"]) * (np.sqrt(rr) + opt.eps) * (1.0 / opt.lr)
                b = tol.root_recovery_bound(tb, rr, g, opt.lr, opt.eps, U, TINY)
                sr = safety * tol.second_moment_bound(rr, rb, g, b, decay, coef, U, TINY)
                for f in (1 - 1e-3, 1.0, 1 + 1e-3):
                    for sgn in (-1.0, 1.0):
                        targets.append(("r", np.maximum(decay * rb + coef * g * g + sgn * f * sr, 0)))
            for key, value in targets:
                for nb in _neighbours(value.astype(np.float32)):
                    for k in opt.arrays:
                        rows[k].append(nb if k == key else up[k][r])
    return {k: np.array(v, dtype=np.float32) for k, v in rows.items()}


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=30)
@given(data=st.data())
def test_uploads_crafted_at_the_threshold_are_never_passed_beyond_it(name, data):
    """Adversarial uploads sitting just inside and just beyond S·τ: the float32 test
    passes none that the float64 screen rejects."""
    opt = OPTIMIZERS.get(name)(**data.draw(_hyper(name)))
    D = data.draw(st.integers(1, 6))
    scale = 10.0 ** data.draw(st.integers(-20, 8))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    state = {"theta": rng.standard_normal(D).astype(np.float32)}
    for k in opt.arrays:
        if k == "m":
            state[k] = (scale * rng.standard_normal(D)).astype(np.float32)
        elif k in ("v", "r"):
            state[k] = (scale**2 * rng.random(D)).astype(np.float32)
    grads = (scale * 10.0 ** rng.uniform(-3, 1, (2, D)) * rng.standard_normal((2, D))).astype(np.float32)
    t = data.draw(st.integers(1, 100))
    up = {k: np.empty((2, D), np.float32) for k in opt.arrays}
    opt.client_rule_batch(state, grads, t, up, backend="numba")
    safety = data.draw(st.sampled_from([1.0, VERIFY_SAFETY]))
    crafted = at_threshold(opt, state, up, t, safety)
    s32, s64, use = decisions(opt, state, crafted, t, None, safety)
    assume(use)  # a hyperparameter outside the float32 test's range: the float64 screen decides
    assert not (s32 & ~s64).any()


def _no_margin(name):
    """The float32 test with E₃₂ = 0 and κ = 1: what the margin is there to prevent."""
    def mutate(k):
        if name == "adam":
            k[[S32.A32_U2, S32.A32_U4, S32.A32_U8]] = 0
            k[[S32.A32_SU10, S32.A32_SU3, S32.A32_SU3C2, S32.A32_SU14, S32.A32_SKC2]] /= np.float32(S32.KAPPA)
        else:
            k[[S32.R32_U4, S32.R32_U8]] = 0
            k[[S32.R32_SU10, S32.R32_SU3, S32.R32_SU3C, S32.R32_SKC]] /= np.float32(S32.KAPPA)
    return mutate


@pytest.mark.parametrize("name", NAMES)
def test_the_threshold_test_fails_without_the_margin(name):
    """Without its margin the float32 test does pass crafted uploads the float64 screen
    rejects: the test above can fail, and the margin is needed (η = 1: a step as large
    as the gradient, where the float32 residual's error is largest next to τ)."""
    rng = np.random.default_rng(20200711)
    opt = OPTIMIZERS.get(name)(lr=1.0)
    found = 0
    for trial in range(20):
        D, scale = 16, 10.0 ** rng.uniform(-12, 4)
        state = opt.init(rng.standard_normal(D).astype(np.float32))
        for k in opt.arrays:
            if k == "m":
                state[k] = (scale * rng.standard_normal(D)).astype(np.float32)
            elif k in ("v", "r"):
                state[k] = (scale**2 * rng.random(D)).astype(np.float32)
        grads = (scale * rng.standard_normal((2, D))).astype(np.float32)
        up = {k: np.empty((2, D), np.float32) for k in opt.arrays}
        opt.client_rule_batch(state, grads, 5, up, backend="numba")
        crafted = at_threshold(opt, state, up, 5, VERIFY_SAFETY)
        s32, s64, _ = decisions(opt, state, crafted, 5, None, VERIFY_SAFETY)
        assert not (s32 & ~s64).any()
        s32, s64, _ = decisions(opt, state, crafted, 5, None, VERIFY_SAFETY, _no_margin(name))
        found += int((s32 & ~s64).sum())
    assert found > 0


# -- honest uploads pass; the kernels are the reference; the decisions are unchanged ------

@pytest.mark.parametrize("name", NAMES)
def test_honest_uploads_of_a_float32_run_pass_the_float32_test(name, rng, ot):
    """30 rounds at the paper's hyperparameters, gradients of 10⁻⁶ to 10² (per client
    and coordinate), the weighted mean: every coordinate of every honest upload passes the
    float32 test, so the float64 screen is not needed."""
    opt = OPTIMIZERS.get(name)()
    D, n = 400, 8
    state = ot.realistic_state(opt, rng, D, np.float32)
    for t in range(1, 31):
        grads = (rng.standard_normal((n, D)) * 10.0 ** rng.uniform(-6, 2, (n, 1))
                 * 10.0 ** rng.uniform(-1, 1, (n, D))).astype(np.float32)
        up = {k: np.empty((n, D), np.float32) for k in opt.arrays}
        opt.client_rule_batch(state, grads, t, up, backend="numba")
        X = np.empty((n, D), np.float32)
        opt.recover_batch(state, up, t, X)
        for rec in (None, X):
            s32, s64, use = decisions(opt, state, up, t, rec, VERIFY_SAFETY)
            assert use and s32.all(), (t, np.argwhere(~s32)[:3])
        w = rng.integers(1, 50, n).astype(np.float64)
        w /= w.sum()
        state = {k: (w @ up[k].astype(np.float64)).astype(np.float32) for k in opt.arrays}


def _kernel_args(opt, state, up, t, rec):
    if opt.name == "adam":
        arrays, sc = opt._verify_args(state, up, t, rec)
        k32, use = S32.adam_constants(arrays[:6], *sc, U, TINY, VERIFY_SAFETY)
    else:
        arrays, sc = opt._verify_args(state, up, rec)
        k32, use = S32.root_constants(arrays[:4], *sc, U, TINY, VERIFY_SAFETY)
    return arrays, sc, k32, use


@pytest.mark.parametrize("name", NAMES)
def test_kernel_float32_test_is_the_reference(name, rng, ot):
    """The kernels' float32 test counts, row by row, the coordinates the NumPy reference
    does not pass (several chunks, a ragged last one; honest, nudged and hostile rows),
    and its OR finds the blocks that hold one."""
    opt = OPTIMIZERS.get(name)()
    D, n = 2 * K.CHUNK + 123, 5
    state = ot.realistic_state(opt, rng, D, np.float32)
    grads = (rng.standard_normal((n, D)) * 1e-2).astype(np.float32)
    up = {k: np.empty((n, D), np.float32) for k in opt.arrays}
    opt.client_rule_batch(state, grads, 4, up, backend="numba")
    up["theta"][1] *= np.float32(1 + 1e-6)
    up["theta"][2, 9000] = np.nan
    up[opt.arrays[0]][3, :: 7] = np.float32(1e38)
    X = np.empty((n, D), np.float32)
    opt.recover_batch(state, up, 4, X)
    for rec in (None, X, X.astype(np.float64)):
        s32, _, _ = decisions(opt, state, up, 4, rec, VERIFY_SAFETY)
        arrays, sc, k32, use = _kernel_args(opt, state, up, 4, rec)
        if opt.name == "adam":
            counts = K.adam_unsure32(*arrays, k32)
        else:
            counts = K.root_unsure32(*arrays, k32)
        np.testing.assert_array_equal(counts, (~s32).sum(axis=1))
        assert counts[0] == 0 and counts[2] > 0 and counts[3] > 0
        # the screen kernels' OR: the blocks of CHUNK coordinates holding one not passed
        blocks = (K.adam_unsure32 if opt.name == "adam" else K.root_unsure32)(
            *arrays, k32, False)
        edges = np.arange(0, D, K.CHUNK)
        np.testing.assert_array_equal(
            blocks, (np.add.reduceat((~s32).astype(int), edges, axis=1) > 0).sum(axis=1))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=30)
@given(data=st.data())
def test_screen_kernels_decide_as_the_float64_screen(name, data):
    """The sure rows of every screen kernel (the screen, the server's one pass, the
    features' one read in both spaces) are those of the float64 screen alone."""
    opt, state, up, t = data.draw(extreme_cases(name))
    n, D = up["theta"].shape
    X = np.empty((n, D), np.float32)
    opt.recover_batch(state, up, t, X)
    S = VERIFY_SAFETY
    for rec in (None, X):
        arrays, sc, k32, use = _kernel_args(opt, state, up, t, rec)
        screen = K.adam_screen if opt.name == "adam" else K.root_screen
        np.testing.assert_array_equal(screen(*arrays, *sc, U, TINY, S, k32, True),
                                      screen(*arrays, *sc, U, TINY, S, k32, False))
    arrays, sc, k32, use = _kernel_args(opt, state, up, t, None)
    w = np.full(n, 1.0 / n)
    m = len(opt.arrays)
    for use32 in (True, False):
        acc = [np.zeros(D) for _ in range(m)]
        if opt.name == "adam":
            got = K.adam_screen_sum(*arrays[:6], w, *sc, U, TINY, S, *acc,
                                    n_chunks(D, K.SCREEN_SUM_BLOCK), True, k32, use32)
        else:
            got = K.root_screen_sum(*arrays[:4], w, *sc, U, TINY, S, *acc,
                                    n_chunks(D, K.SCREEN_SUM_BLOCK), True, k32, use32)
        if use32:
            sure_sum = got
        else:
            np.testing.assert_array_equal(sure_sum, got)
    for gradient in (True, False):
        sures = []
        for use32 in (True, False):
            out = np.empty((n, D), np.float32)
            if opt.name == "adam":
                sures.append(K.adam_recover_screen(*arrays[:6], out, gradient, *sc, U, TINY, S,
                                                   True, k32, use32))
            else:
                sures.append(K.root_recover_screen(*arrays[:4], out, gradient, *sc, U, TINY, S,
                                                   True, k32, use32))
        np.testing.assert_array_equal(*sures)


def test_float32_test_applies_only_where_derived():
    """float32 state and uploads, 1 ≤ S ≤ 2²⁰, hyperparameters 0 or within [2⁻¹⁰⁰, 2¹⁰⁰]."""
    a32, a64 = np.zeros(3, np.float32), np.zeros(3)
    args = (0.9, 0.1, 0.999, 1e-3, 1e-3, 1e-8)
    assert S32.adam_constants([a32] * 6, *args, U, TINY, 4.0)[1]
    assert not S32.adam_constants([a32] * 5 + [a64], *args, U, TINY, 4.0)[1]
    assert not S32.adam_constants([a32] * 6, *args, 2.0**-53, 2.0**-1074, 4.0)[1]
    assert not S32.adam_constants([a32] * 6, *args, U, TINY, 0.5)[1]
    assert not S32.adam_constants([a32] * 6, *args, U, TINY, 2.0**21)[1]
    assert not S32.adam_constants([a32] * 6, 0.9, 0.1, 0.999, 1e-3, 1e-35, 1e-8, U, TINY, 4.0)[1]
    assert S32.adam_constants([a32] * 6, 0.0, 1.0, 0.0, 1.0, 1e-3, 1e-8, U, TINY, 4.0)[1]
    assert S32.root_constants([a32] * 4, 1.0, 1.0, 1e-2, 1e-8, U, TINY, 4.0)[1]
    assert not S32.root_constants([a32] * 4, 1.0, 1.0, 1e-2, 1e-40, U, TINY, 4.0)[1]


def _same(a, b):
    ok_a, check_a, viol_a = a
    ok_b, check_b, viol_b = b
    np.testing.assert_array_equal(ok_a, ok_b)
    assert check_a == check_b
    np.testing.assert_array_equal(viol_a.view(np.int64), viol_b.view(np.int64))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=20)
@given(data=st.data())
def test_the_optimisers_methods_give_the_same_results_with_and_without_it(name, data):
    """verify_batch, features_verify_batch (both spaces) and screen_sum_batch: the same
    verdicts, checks, violations (bits, NaN for a sure row), features and sums with the
    float32 test as with the float64 screen alone."""
    opt, state, up, t = data.draw(extreme_cases(name))
    n, D = up["theta"].shape
    X = np.empty((n, D), np.float32)
    opt.recover_batch(state, up, t, X)
    safety = data.draw(SAFETIES)
    for rec in (None, X):
        _same(opt.verify_batch(state, up, t, recovered=rec, screen=True, safety=safety),
              opt.verify_batch(state, up, t, recovered=rec, screen=True, safety=safety,
                               screen32=False))
    for space in ("gradient", "parameter"):
        out = [np.empty((n, D), np.float32) for _ in range(2)]
        _same(opt.features_verify_batch(state, up, t, out[0], space, safety=safety),
              opt.features_verify_batch(state, up, t, out[1], space, safety=safety,
                                        screen32=False))
        np.testing.assert_array_equal(out[0].view(np.uint32), out[1].view(np.uint32))
    w = np.full(n, 1.0 / n)
    with np.errstate(all="ignore"):
        sure_a, sums_a = opt.screen_sum_batch(state, up, t, w, safety=safety)
        sure_b, sums_b = opt.screen_sum_batch(state, up, t, w, safety=safety, screen32=False)
    np.testing.assert_array_equal(sure_a, sure_b)
    for k in opt.arrays:
        np.testing.assert_array_equal(sums_a[k].view(np.uint32), sums_b[k].view(np.uint32))
