"""The camouflage attack: the analysis of Eq. 6 and the per-coordinate decision (SPEC §7, §9).

- where the attack camouflages a coordinate, the uploaded θ is the honest θ to
  rounding while the server recovers a different gradient (SPEC §9);
- it camouflages every coordinate where a second gradient with the same
  update clearly exists, and none where only the negated update does;
- the decision is the same in the Numba kernel and the NumPy oracle, bit for bit.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.attack import Camouflage, camouflage_gradient, eq6_denominator
from rfrs_ref.attack.camouflage import THETA_TOLERANCE
from rfrs_ref.kernels.attacks import camouflage_rows
from rfrs_ref.optim import VERIFY_SAFETY, Adam


def signed(lo, hi):
    """0, or ±10^x with x uniform in [lo, hi]."""
    mag = st.floats(lo, hi).map(lambda x: 10.0**x)
    return st.just(0.0) | mag | mag.map(lambda x: -x)


@st.composite
def coordinates(draw, D_max=24):
    """An Adam optimiser, a state and one honest gradient, coordinates of wildly
    different magnitudes (zeros included), and the round."""
    opt = Adam(lr=draw(st.sampled_from([1e-3, 0.1])),
               beta1=draw(st.sampled_from([0.0, 0.5, 0.9, 0.99])),
               beta2=draw(st.sampled_from([0.5, 0.9, 0.999])),
               eps=draw(st.sampled_from([1e-8, 1e-12, 1e-3])))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    D = draw(st.integers(1, D_max))

    def arr(strategy):
        return np.array([draw(strategy) for _ in range(D)], dtype=dtype)

    state = {"m": arr(signed(-8, 2)), "v": arr(st.just(0.0) | st.floats(-12, 4).map(lambda x: 10.0**x)),
             "theta": arr(st.floats(-10, 10))}
    g = arr(signed(-8, 3))
    t = draw(st.integers(1, 5) | st.integers(6, 5000))
    return opt, state, g, t, dtype


def attack_one(opt, state, g, t, dtype, include_eps, backend, at):
    G = np.stack([g, g[::-1]]).astype(dtype)
    ctx, honest = at.context(opt, state, G, [True, False], t, backend=backend)
    diag = Camouflage(include_eps=include_eps).apply_inplace(ctx)
    return ctx.uploads, honest, diag


@settings(max_examples=30)
@given(data=st.data())
def test_camouflaged_theta_is_honest_to_rounding_and_the_gradient_differs(data, at):
    opt, state, g, t, dtype = data.draw(coordinates())
    include_eps = data.draw(st.booleans())
    backend = data.draw(st.sampled_from(["numba", "numpy"]))
    up, honest, diag = attack_one(opt, state, g, t, dtype, include_eps, backend, at)
    u = np.finfo(dtype).eps / 2
    g_tilde, mask = camouflage_gradient(state["m"], state["v"], state["theta"], g, beta1=opt.beta1,
                                        beta2=opt.beta2, lr_t=opt.step_size(t), eps=opt.eps,
                                        include_eps=include_eps)
    assert diag["camouflaged_fraction"] == pytest.approx(mask.mean())
    tb = state["theta"].astype(np.float64)
    th, th_hat = honest["theta"][0].astype(np.float64), up["theta"][0].astype(np.float64)
    # θ: within (THETA_TOLERANCE + 2) roundings of the honest one, everywhere
    bound = (THETA_TOLERANCE + 2) * u * (np.abs(tb) + np.abs(th - tb))
    assert np.all(np.abs(th_hat - th) <= bound)
    # elsewhere than the camouflaged coordinates the upload is the honest one
    for k in opt.arrays:
        np.testing.assert_array_equal(up[k][0][~mask], honest[k][0][~mask])
        np.testing.assert_array_equal(up[k][1], honest[k][1])
    # the server recovers g̃, which differs from g on every camouflaged coordinate
    rec = np.empty((2, g.size), dtype)
    opt.recover_batch(state, up, t, rec, backend="numpy")
    bound = VERIFY_SAFETY * opt.recovery_bound(state, {k: up[k][0] for k in opt.arrays}, t,
                                               recovered=rec[0])
    assert np.all(np.abs(rec[0].astype(np.float64) - g_tilde) <= bound)
    assert np.all(g_tilde[mask] != g[mask].astype(np.float64))
    # and the upload obeys the rule
    ok, check, _ = opt.verify_batch(state, up, t)
    assert ok.all(), check


def u0(m_bar, v_bar, g, b1, b2):
    return (b1 * m_bar + (1 - b1) * g) / np.sqrt(b2 * v_bar + (1 - b2) * g * g)


@settings(max_examples=30)
@given(data=st.data())
def test_camouflages_exactly_where_a_second_preimage_exists(data, at):
    # ε negligible (1e-30), float64, m̄ ≠ 0, v̄ > 0: the paper's analysis applies.
    # A second g with the same u exists iff u(g)² > c₁²/c₂; the attack must use it
    # wherever that holds with a margin (and g is not at u's extremum, where the
    # two preimages merge), and must keep g wherever it fails with a margin.
    b1 = data.draw(st.sampled_from([0.5, 0.9, 0.99]))
    b2 = data.draw(st.sampled_from([0.9, 0.999]))
    opt = Adam(lr=1e-3, beta1=b1, beta2=b2, eps=1e-30)
    D = 64
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    m_bar = rng.choice([-1, 1], D) * 10.0 ** rng.uniform(-4, 0, D)
    v_bar = 10.0 ** rng.uniform(-8, 0, D)
    g = rng.choice([-1, 1], D) * 10.0 ** rng.uniform(-4, 1, D)
    state = {"m": m_bar, "v": v_bar, "theta": rng.standard_normal(D)}
    t = data.draw(st.integers(2, 1000))
    up, _, _ = attack_one(opt, state, g, t, np.float64, True, "numba", at)
    c1, c2 = 1 - b1, 1 - b2
    q = u0(m_bar, v_bar, g, b1, b2) ** 2 * c2 / c1**2 - 1
    x_star = c1 * b2 * v_bar / (c2 * b1 * m_bar)
    g_hat = (up["m"][0] - b1 * m_bar) / c1
    moved = np.abs(g_hat - g) > 1e-6 * np.abs(g)
    clearly = (q > 1e-2) & (np.abs(g - x_star) > 1e-2 * (np.abs(g) + np.abs(x_star)))
    assert np.all(moved[clearly])
    assert not np.any(moved[q < -1e-2])
    # where it moved, the update is the same one, not the negated one
    np.testing.assert_allclose(u0(m_bar, v_bar, g_hat, b1, b2)[moved],
                               u0(m_bar, v_bar, g, b1, b2)[moved], rtol=1e-9)


@settings(max_examples=40)
@given(m=st.floats(-10, 10), v=st.floats(0, 10), g=st.floats(-100, 100),
       b1=st.sampled_from([0.0, 0.5, 0.9]), b2=st.sampled_from([0.5, 0.999]))
def test_eq6_denominator_sign_is_the_asymptote_test(m, v, g, b1, b2):
    # ε = 0: den > 0 ⟺ u(g)² > c₁²/c₂ (u beyond the asymptote), den < 0 ⟺ inside
    c1, c2 = 1 - b1, 1 - b2
    num = (b1 * m + c1 * g) ** 2 * c2 - c1**2 * (b2 * v + c2 * g * g)
    den = float(eq6_denominator(m, v, g, b1, b2, 0.0))
    # num = u² c₂(b + c₂g²) − c₁²(b + c₂g²) carries the same sign as u²c₂ − c₁²;
    # den equals it algebraically: compare away from rounding
    scale = c2 * (b1 * m) ** 2 + 2 * c1 * c2 * abs(b1 * m * g) + c1**2 * (b2 * v + c2 * g * g)
    if abs(num) > 1e-9 * scale:
        assert math.copysign(1, den) == math.copysign(1, num)


@given(data=st.data())
@settings(max_examples=30)
def test_eq6_elsewhere_gives_the_negated_update(data):
    # where den < 0, the second root of the squared equality is u(g̃) = −u(g)
    b1, b2 = 0.9, 0.999
    m = data.draw(st.floats(-1, 1).filter(lambda x: abs(x) > 1e-3))
    v = data.draw(st.floats(1e-4, 1))
    g = data.draw(st.floats(-10, 10).filter(lambda x: abs(x) > 1e-3))
    c1, c2 = 1 - b1, 1 - b2
    a, b = b1 * m, b2 * v
    den = c2 * a * a + 2 * c1 * c2 * a * g - c1 * c1 * b
    if den >= -1e-6 * (c1 * c1 * b):
        return
    g_eq6 = (2 * c1 * a * b + c1 * c1 * b * g - c2 * a * a * g) / den
    assert u0(m, v, g_eq6, b1, b2) == pytest.approx(-u0(m, v, g, b1, b2), rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("include_eps", [True, False])
def test_kernel_and_oracle_agree_bit_for_bit(dtype, include_eps, at):
    # D spans several column chunks; rows are a subset in a scrambled order
    rng = np.random.default_rng(7)
    opt = Adam()
    D = 20_011
    state = at.realistic_state(opt, rng, D, dtype)
    state["m"][::97] = 0.0
    state["v"][::89] = 0.0
    G = (1e-3 * rng.standard_normal((5, D))).astype(dtype)
    G[:, ::101] = 0.0
    rows = np.array([3, 0, 4], dtype=np.int64)
    lr_t = opt.step_size(17)
    u = np.finfo(dtype).eps / 2
    out = np.full((3, D), np.nan, dtype)
    count, shift2 = camouflage_rows(
        state["m"], state["v"], state["theta"], G, rows, opt.beta1, 1 - opt.beta1, opt.beta2,
        1 - opt.beta2, lr_t, opt.eps, opt.eps if include_eps else 0.0, THETA_TOLERANCE * u,
        float(np.finfo(dtype).max), out)
    for i, r in enumerate(rows):
        gt, mask = camouflage_gradient(state["m"], state["v"], state["theta"], G[r],
                                       beta1=opt.beta1, beta2=opt.beta2, lr_t=lr_t, eps=opt.eps,
                                       include_eps=include_eps)
        np.testing.assert_array_equal(out[i], gt.astype(dtype))
        assert count[i] == mask.sum()
        assert shift2[i] == pytest.approx(float(((gt - G[r]) ** 2).sum()), rel=1e-12)
    if include_eps or dtype == np.float32:
        assert count.sum() > 0.05 * 3 * D
    else:
        # Eq. 6 without ε misses float64's rounding of θ wherever it applies
        assert count.sum() == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attack_backends_agree_bit_for_bit(dtype, at):
    rng = np.random.default_rng(8)
    opt = Adam()
    D = 9000
    state = at.realistic_state(opt, rng, D, dtype)
    G = (1e-3 * rng.standard_normal((4, D))).astype(dtype)
    byz = [False, True, True, False]
    out = {}
    for backend in ("numba", "numpy"):
        ctx, _ = at.context(opt, state, G, byz, 9, backend=backend)
        out[backend] = (Camouflage().apply_inplace(ctx), ctx.uploads)
    d_nb, up_nb = out["numba"]
    d_np, up_np = out["numpy"]
    assert d_nb["camouflaged_fraction_per_client"] == d_np["camouflaged_fraction_per_client"]
    np.testing.assert_allclose(d_nb["gradient_shift"], d_np["gradient_shift"], rtol=1e-12)
    for k in opt.arrays:
        np.testing.assert_array_equal(up_nb[k], up_np[k])


def test_fraction_grows_with_the_momentum_to_root_second_moment_ratio(at):
    # the paper's remark: early rounds (large |m̄|/√v̄) camouflage the most
    rng = np.random.default_rng(3)
    opt = Adam()
    D = 4000
    G = 1e-3 * rng.standard_normal((1, D))
    fractions = []
    for m_scale in (1e-5, 1e-3, 1e-1):
        state = at.realistic_state(opt, np.random.default_rng(4), D, np.float64, m_scale=m_scale)
        ctx, _ = at.context(opt, state, G, [True], 10)
        fractions.append(Camouflage().apply_inplace(ctx)["camouflaged_fraction"])
    assert fractions[0] < fractions[1] < fractions[2]
    assert fractions[2] > 0.5


def test_workspace_buffers_are_reused(at):
    rng = np.random.default_rng(2)
    opt = Adam()
    state = at.realistic_state(opt, rng, 300, np.float32)
    G = (1e-3 * rng.standard_normal((3, 300))).astype(np.float32)
    ws = {}
    results, buffers = [], []
    for _ in range(2):
        ctx, _ = at.context(opt, state, G, [True, False, True], 5, workspace=ws)
        Camouflage().apply_inplace(ctx)
        results.append({k: v.copy() for k, v in ctx.uploads.items()})
        buffers.append(ws["grads"])
    assert buffers[0] is buffers[1] and buffers[0].shape == (3, 300)
    for k in opt.arrays:
        np.testing.assert_array_equal(results[0][k], results[1][k])
