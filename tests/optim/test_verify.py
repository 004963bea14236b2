"""Update-rule verification (SPEC §5): honest uploads always pass, tampered ones fail."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.optim import OPTIMIZERS, VERIFY_SAFETY
from rfrs_ref.seeding import generator

NAMES = tuple(OPTIMIZERS.names())
DTYPES = (np.float32, np.float64)

STATEFUL = tuple(n for n in NAMES if n != "sgd")
RULE_CHECK = {"momentum": "theta-rule", "adam": "theta-rule", "adagrad": "r-rule", "rmsprop": "r-rule"}


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_honest_uploads_pass_even_without_the_safety_factor(name, dtype, data, ot):
    """Every honest upload passes with safety 1: the derived counts are true bounds.

    Arbitrary states and gradients (subnormal to 1e15, moments up to 1e30),
    arbitrary hyperparameters and rounds; uploads from the fused kernel and
    from the oracle; verification by the kernel (recovering ĝ itself or
    reading the recovered rows) and by the oracle.
    """
    opt, state, grads, t = data.draw(ot.cases(name, dtype))
    for up in (ot.upload_numba(opt, state, grads, t, dtype), ot.upload_oracle(opt, state, grads, t, dtype)):
        X = np.empty(grads.shape, dtype=dtype)
        opt.recover_batch(state, up, t, X)
        for kw in ({}, {"recovered": X}):
            ok, check, violation = opt.verify_batch(state, up, t, safety=1.0, **kw)
            assert ok.all(), (check, violation)
            ok, check, violation = opt.verify_batch(state, up, t, safety=1.0, screen=True, **kw)
            assert ok.all(), (check, violation)
            ok, check, violation = opt.verify_batch(state, up, t, backend="numpy", safety=1.0, **kw)
            assert ok.all(), (check, violation)


def _weighted_mean(uploads, rng, dtype):
    n = next(iter(uploads.values())).shape[0]
    keep = rng.random(n) < 0.8
    keep[rng.integers(n)] = True
    w = rng.integers(1, 200, size=n) * keep
    w = w / w.sum()
    return {k: (w @ v.astype(np.float64)).astype(dtype) for k, v in uploads.items()}


def _gradients(rng, n, D, dtype):
    """Gradients of realistic and extreme scales: per client 10^U(−22, 12) (subnormal
    squares in float32 at the low end), per coordinate a further 10^U(−3, 3)
    spread, and exact zeros (coordinates a client's data does not touch)."""
    scale = 10.0 ** rng.uniform(-22, 12, size=(n, 1))
    spread = 10.0 ** rng.uniform(-3, 3, size=(n, D))
    g = rng.standard_normal((n, D)) * scale * spread
    g[rng.random((n, D)) < 0.2] = 0.0
    return g.astype(dtype)


@pytest.mark.parametrize("name", NAMES)
def test_long_float32_run_at_the_paper_hyperparameters_never_rejects_an_honest_upload(name):
    """300 rounds, float32, paper defaults, weighted-mean aggregation of honest uploads."""
    dtype, n, D, T = np.float32, 8, 256, 300
    opt = OPTIMIZERS.get(name)()
    rng = generator(7, "synthetic", len(name))
    state = opt.init(rng.standard_normal(D).astype(dtype))
    out = {k: np.empty((n, D), dtype) for k in opt.arrays}
    X = np.empty((n, D), dtype)
    worst = 0.0
    for t in range(1, T + 1):
        G = _gradients(rng, n, D, dtype)
        opt.client_rule_batch(state, G, t, out)
        opt.recover_batch(state, out, t, X)
        ok, check, violation = opt.verify_batch(state, out, t, recovered=X)
        assert ok.all(), (t, check, violation)
        worst = max(worst, float(violation.max()))
        if t % 60 == 0:
            ok, check, _ = opt.verify_batch(state, out, t, backend="numpy")
            assert ok.all(), (t, check)
        state = _weighted_mean(out, rng, dtype)
        assert all(np.isfinite(a).all() for a in state.values())
    assert worst <= 1.0


def _honest(ot, name, dtype, rng, n=4, D=400, t=5):
    opt = OPTIMIZERS.get(name)()
    state = ot.realistic_state(opt, rng, D, dtype)
    G = rng.standard_normal((n, D)).astype(dtype)
    up = ot.upload_numba(opt, state, G, t, dtype)
    return opt, state, G, up, t


def _verify_both(opt, state, up, t):
    res = [opt.verify_batch(state, up, t, backend=b) for b in ("numba", "numpy")]
    assert np.array_equal(res[0][0], res[1][0]) and res[0][1] == res[1][1]
    return res[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_values_always_fail(name, dtype, bad, rng, ot):
    opt, state, G, up, t = _honest(ot, name, dtype, rng)
    for r, k in enumerate(opt.arrays):
        up[k][r, rng.integers(up[k].shape[1])] = bad
    ok, check, violation = _verify_both(opt, state, up, t)
    for r in range(len(opt.arrays)):
        assert not ok[r] and check[r] == "nonfinite" and violation[r] == np.inf
    assert ok[len(opt.arrays):].all()


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", ["adam", "adagrad", "rmsprop"])
def test_negative_second_moment_fails(name, dtype, rng, ot):
    opt, state, G, up, t = _honest(ot, name, dtype, rng)
    k = opt.nonnegative
    up[k][1, 17] = -np.finfo(dtype).smallest_subnormal
    ok, check, violation = _verify_both(opt, state, up, t)
    assert list(ok) == [True, False, True, True]
    assert check[1] == f"negative-{k}" and violation[1] == np.inf


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", STATEFUL)
def test_noise_on_theta_fails(name, dtype, rng, ot):
    """The `noise` attack: θ + N(0, σ²), σ = 1e-4, far above θ's rounding (u·|θ̄| ≤ 3e-7)."""
    opt, state, G, up, t = _honest(ot, name, dtype, rng)
    up["theta"][2] += (1e-4 * rng.standard_normal(up["theta"].shape[1])).astype(dtype)
    ok, check, violation = _verify_both(opt, state, up, t)
    assert list(ok) == [True, True, False, True]
    assert check[2] == RULE_CHECK[name] and violation[2] > 10


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", STATEFUL)
def test_moments_inconsistent_with_the_rest_fail(name, dtype, rng, ot):
    """Adam: v built from 2g with m from g. Momentum: m from 2g, θ from g.
    AdaGrad/RMSProp: r from 2g, θ from g."""
    opt, state, G, up, t = _honest(ot, name, dtype, rng)
    other = ot.upload_numba(opt, state, 2 * G, t, dtype)
    k = {"adam": "v", "momentum": "m"}.get(name, "r")
    up[k][0] = other[k][0]
    ok, check, violation = _verify_both(opt, state, up, t)
    assert list(ok) == [False, True, True, True]
    assert check[0] == {"adam": "v-rule", "momentum": "theta-rule"}.get(name, "r-rule")


@pytest.mark.parametrize("name", STATEFUL)
@settings(max_examples=20)
@given(data=st.data())
def test_gradient_space_tampering_passes(name, data, ot):
    """An upload built by the rule from any gradient (ascent, ALIE, IPM...) obeys the rule."""
    dtype = data.draw(st.sampled_from(DTYPES))
    opt, state, grads, t = data.draw(ot.cases(name, dtype))
    up = ot.upload_numba(opt, state, -grads, t, dtype)
    assert opt.verify_batch(state, up, t)[0].all()


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", STATEFUL)
def test_threshold_sits_at_the_derived_tolerance(name, dtype, rng, ot):
    """Moving a coordinate by twice its tolerance fails; by a quarter of it, passes.

    One coordinate (D = 1), so the verdict's ratio is that coordinate's. Its
    tolerance S·τ is read from the ratio of a probe offset large enough
    (ratio ≥ 100) for the honest residual to be negligible beside it.
    """
    opt, state, G, up, t = _honest(ot, name, dtype, rng, n=1, D=1)
    k = {"adam": "v", "momentum": "theta"}.get(name, "r")
    check = {"adam": "v-rule"}.get(name, RULE_CHECK[name])
    base = float(up[k][0, 0])
    offset, ratio = max(abs(base), 1.0) * np.finfo(dtype).eps, 0.0
    while ratio < 100:
        offset *= 4
        probe = {a: v[0].copy() for a, v in up.items()}
        probe[k][0] = base + offset
        ratio = opt.verify(state, probe, t).ratios[check]
    tol = (float(probe[k][0]) - base) / ratio
    for factor, expect in ((2.0, False), (0.25, True)):
        tampered = {a: v.copy() for a, v in up.items()}
        tampered[k][0, 0] = base + factor * tol
        assert opt.verify_batch(state, tampered, t)[0][0] == expect, factor
        assert opt.verify_batch(state, tampered, t, backend="numpy")[0][0] == expect, factor


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=15)
@given(data=st.data())
def test_kernel_and_oracle_verification_agree(name, dtype, data, ot):
    """Same verdicts and violation ratios on honest and randomly corrupted uploads.

    The two evaluate the residuals in float64 in different orders (the kernel
    multiplies by reciprocals): each differs from the exact residual by a few
    float64 roundings of magnitudes that the tolerance counts with the dtype's
    unit roundoff u at least 3 times over, so the ratios agree to
    2·u₆₄/(S·u) ≤ u₆₄/u absolutely (about 1e-9 in float32, but O(1) in float64,
    where the server rounds as coarsely as the client).
    """
    opt, state, grads, t = data.draw(ot.cases(name, dtype))
    up = ot.upload_numba(opt, state, grads, t, dtype)
    r = data.draw(st.integers(0, grads.shape[0] - 1))
    k = data.draw(st.sampled_from(opt.arrays))
    c = data.draw(st.integers(0, grads.shape[1] - 1))
    up[k][r, c] = data.draw(st.sampled_from([np.nan, -1.0, 0.0]) | ot.finite(-1e30, 1e30, np.float32))
    a = opt.verify_batch(state, up, t)
    b = opt.verify_batch(state, up, t, backend="numpy")
    assert np.array_equal(a[0], b[0]) and a[1] == b[1]
    np.testing.assert_allclose(a[2], b[2], rtol=0, atol=2.0**-53 / (np.finfo(dtype).eps / 2))


def test_safety_factor_is_the_documented_one():
    assert VERIFY_SAFETY == 4.0


def _same_decisions(opt, state, up, t, recovered, safety):
    """The screened verification decides every row as the exact one does, and reports
    the exact check and violation of every failed row."""
    exact = opt.verify_batch(state, up, t, recovered=recovered, safety=safety)
    fast = opt.verify_batch(state, up, t, recovered=recovered, safety=safety, screen=True)
    assert np.array_equal(exact[0], fast[0]), (safety, exact, fast)
    assert exact[1] == fast[1]
    failed = ~exact[0]
    assert np.array_equal(exact[2][failed], fast[2][failed])
    # a row the screen decided reports no ratio; one it left to the exact kernel reports it
    assert np.all(np.isnan(fast[2][~failed]) | (fast[2][~failed] == exact[2][~failed]))
    return exact


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=25)
@given(data=st.data())
def test_screened_verification_decides_exactly_as_the_exact_kernel(name, dtype, data, ot):
    """At the extremes (gradients from subnormal to 1e15, second moments from 0 to
    1e30, arbitrary hyperparameters), honest and corrupted rows, and with the safety
    factor set so that a row's largest ratio lands on 1 to the last bit (ratios just
    below, at and just above the threshold): the same verdicts, checks and
    violations of failed rows."""
    opt, state, grads, t = data.draw(ot.cases(name, dtype))
    up = ot.upload_numba(opt, state, grads, t, dtype)
    if data.draw(st.booleans()):
        r = data.draw(st.integers(0, grads.shape[0] - 1))
        k = data.draw(st.sampled_from(opt.arrays))
        c = data.draw(st.integers(0, grads.shape[1] - 1))
        scale = data.draw(st.sampled_from([1e-7, 1e-6, 1e-4, 1.0]))
        up[k][r, c] = up[k][r, c] * (1 + scale) + data.draw(st.sampled_from([0.0, 1e-30, 1e-3]))
    X = np.empty(grads.shape, dtype)
    opt.recover_batch(state, up, t, X)
    for rec in (None, X):
        exact = _same_decisions(opt, state, up, t, rec, 1.0)
        finite = np.isfinite(exact[2]) & (exact[2] > 0)
        for v in exact[2][finite]:
            # safety = the violation at safety 1, and its neighbours: ratios near 1
            for s in (np.nextafter(v, 0), v, np.nextafter(v, np.inf), v * (1 - 2**-40), v * (1 + 2**-40)):
                if s > 0 and np.isfinite(s):
                    _same_decisions(opt, state, up, t, rec, float(s))


@pytest.mark.parametrize("name", STATEFUL)
def test_screen_hands_failed_and_close_rows_to_the_exact_kernel(name, rng, ot):
    """Rows with a non-finite value, a negative moment, a tampered coordinate: failed
    with the exact kernel's check and violation; honest rows pass with no ratio."""
    opt, state, G, up, t = _honest(ot, name, np.float32, rng, n=5, D=3000)
    up["theta"][1, 7] = np.nan
    up["theta"][3] += (1e-4 * rng.standard_normal(up["theta"].shape[1])).astype(np.float32)
    if opt.nonnegative:
        up[opt.nonnegative][4, 11] = -1.0
    exact = _same_decisions(opt, state, up, t, None, VERIFY_SAFETY)
    fast = opt.verify_batch(state, up, t, screen=True)
    assert not exact[0][1] and not exact[0][3]
    assert np.isnan(fast[2][0]) and np.isnan(fast[2][2])
