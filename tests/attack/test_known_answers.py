"""Every attack on a tiny example whose answer is worked out by hand in the test.

The expected uploads are written from the formulas of SPEC §5 and §7 (and
Baruch et al.'s z through SciPy's normal quantile), never by calling the code
under test. Both backends must give them.
"""

import math

import numpy as np
import pytest
from scipy.stats import norm

from rfrs_ref.attack import ALIE, IPM, Ascent, Camouflage, NoAttack, Noise, alie_z
from rfrs_ref.optim import SGD, Adam

BACKENDS = ("numba", "numpy")


def sgd_round(theta_bar, grads, byz, lr, at, backend):
    opt = SGD(lr=lr)
    state = opt.init(np.asarray(theta_bar, dtype=np.float64))
    return at.context(opt, state, np.asarray(grads, dtype=np.float64), byz, 3, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ascent_sgd_steps_up_the_gradient(backend, at):
    ctx, honest = sgd_round([1.0, 2.0], [[0.5, -1.0], [4.0, 4.0]], [True, False], 0.1, at, backend)
    assert Ascent().apply_inplace(ctx) == {}
    # θ = θ̄ − η·(−g) = θ̄ + ηg
    np.testing.assert_allclose(ctx.uploads["theta"][0], [1.05, 1.9], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(ctx.uploads["theta"][1], honest["theta"][1])
    np.testing.assert_allclose(honest["theta"][1], [0.6, 1.6], atol=1e-15)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ascent_adam_first_round(backend, at):
    opt = Adam(lr=0.01)
    state = opt.init(np.array([0.5, -0.5]))
    g = np.array([[0.2, -0.02]])
    ctx, _ = at.context(opt, state, g, [True], 1, backend=backend)
    Ascent().apply_inplace(ctx)
    # t = 1, m̄ = v̄ = 0: m = −0.1·g, v = 0.001·g², ηₜ = 0.01·√0.001/0.1
    m = -0.1 * g[0]
    v = 0.001 * g[0] ** 2
    eta_t = 0.01 * math.sqrt(0.001) / 0.1
    theta = np.array([0.5, -0.5]) - eta_t * m / (np.sqrt(v) + 1e-8)
    np.testing.assert_allclose(ctx.uploads["m"][0], m, rtol=1e-15)
    np.testing.assert_allclose(ctx.uploads["v"][0], v, rtol=1e-15)
    np.testing.assert_allclose(ctx.uploads["theta"][0], theta, rtol=1e-15)
    # the first Adam step has size ηₜ·(1 − β₁)/√(1 − β₂) per coordinate, here uphill
    np.testing.assert_allclose(ctx.uploads["theta"][0] - [0.5, -0.5], [0.01, -0.01], rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_noise_adds_sigma_times_standard_normals_in_row_order(backend, at):
    opt = Adam()
    rng = np.random.default_rng(5)
    state = at.realistic_state(opt, rng, 7, np.float64)
    G = rng.standard_normal((4, 7))
    ctx, honest = at.context(opt, state, G, [False, True, False, True], 2, backend=backend, seed=11)
    diag = Noise(sigma=2.0).apply_inplace(ctx)
    draws = np.random.default_rng(11)
    z1, z3 = draws.standard_normal(7), draws.standard_normal(7)
    np.testing.assert_array_equal(ctx.uploads["theta"][1], honest["theta"][1] + 2.0 * z1)
    np.testing.assert_array_equal(ctx.uploads["theta"][3], honest["theta"][3] + 2.0 * z3)
    for k in ("m", "v"):
        np.testing.assert_array_equal(ctx.uploads[k], honest[k])
    for r in (0, 2):
        np.testing.assert_array_equal(ctx.uploads["theta"][r], honest["theta"][r])
    assert diag["sigma"] == 2.0
    np.testing.assert_allclose(diag["noise_norm"], [2 * np.linalg.norm(z1), 2 * np.linalg.norm(z3)])


def test_noise_in_float32_is_rounded_once(at):
    opt = SGD()
    state = opt.init(np.array([1.0, -3.0, 0.25], dtype=np.float32))
    G = np.array([[0.1, 0.2, 0.3]], dtype=np.float32)
    ctx, honest = at.context(opt, state, G, [True], 1, seed=3)
    Noise(sigma=0.5).apply_inplace(ctx)
    z = np.random.default_rng(3).standard_normal(3)
    expected = (honest["theta"][0].astype(np.float64) + 0.5 * z).astype(np.float32)
    np.testing.assert_array_equal(ctx.uploads["theta"][0], expected)


# -- camouflage ------------------------------------------------------------------------
#
# β₁ = β₂ = 1/2, so c₁ = c₂ = 1/2, a = m̄/2, b = v̄/2, and (ε = 0)
#   u(g) = (a + g/2)/√(b + g²/2),  asymptote c₁/√c₂ = 1/√2.
# Coordinate 0: m̄ = 2, v̄ = 2 (a = b = 1), g = 0: u(0) = 1 > 1/√2, so a second
#   preimage exists: den = c₂a² − c₁²b = 1/4, num = 2c₁ab = 1, g̃ = 4, and indeed
#   u(4) = (1 + 2)/√(1 + 8) = 1.
# Coordinate 1: m̄ = 0.2, v̄ = 2 (a = 0.1, b = 1), g = −1: u(−1) = −0.4/√1.5, inside
#   the asymptotes; Eq. 6 gives g̃ = (0.1 − 0.25 + 0.005)/(0.005 − 0.05 − 0.25)
#   = 0.145/0.295, whose update is the negated one: the attack keeps g.
# Coordinate 2: m̄ = 0 (a = 0): u is monotone, nothing to camouflage.
CAM_STATE = {"m": [2.0, 0.2, 0.0], "v": [2.0, 2.0, 3.0], "theta": [0.3, -0.7, 1.1]}
CAM_G = [0.0, -1.0, 0.5]


def u0(a, b, g):
    return (a + 0.5 * g) / math.sqrt(b + 0.5 * g * g)


def test_the_hand_example_is_what_the_comment_says():
    assert u0(1, 1, 4) == pytest.approx(u0(1, 1, 0), rel=1e-15)
    g_eq6 = 0.145 / 0.295
    assert u0(0.1, 1, g_eq6) == pytest.approx(-u0(0.1, 1, -1.0), rel=1e-12)


def cam_context(dtype, backend, at, eps=1e-8):
    opt = Adam(lr=0.01, beta1=0.5, beta2=0.5, eps=eps)
    state = {k: np.array(v, dtype=dtype) for k, v in CAM_STATE.items()}
    G = np.array([CAM_G, [1.0, 1.0, 1.0]], dtype=dtype)
    return opt, *at.context(opt, state, G, [True, False], 3, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_camouflage_hand_example(dtype, backend, at):
    opt, ctx, honest = cam_context(dtype, backend, at)
    diag = Camouflage().apply_inplace(ctx)
    g_hat = (ctx.uploads["m"][0].astype(np.float64) - 0.5 * np.array(CAM_STATE["m"])) / 0.5
    # coordinate 0 camouflaged to g̃ ≈ 4 (ε shifts it by O(ε)), the others keep g
    assert g_hat[0] == pytest.approx(4.0, rel=1e-6)
    np.testing.assert_allclose(g_hat[1:], CAM_G[1:], rtol=1e-6)
    np.testing.assert_allclose(ctx.uploads["v"][0, 0], 0.5 * 2.0 + 0.5 * 16.0, rtol=1e-6)
    # θ is the honest θ to rounding, although m and v moved
    u = np.finfo(dtype).eps / 2
    assert abs(float(ctx.uploads["theta"][0, 0]) - float(honest["theta"][0, 0])) <= 6 * u * 1.0
    np.testing.assert_array_equal(ctx.uploads["theta"][0, 1:], honest["theta"][0, 1:])
    assert diag["camouflaged_fraction"] == pytest.approx(1 / 3)
    assert diag["camouflaged_fraction_per_client"] == [pytest.approx(1 / 3)]
    assert diag["gradient_shift"] == [pytest.approx(4.0, rel=1e-6)]
    for k in opt.arrays:
        np.testing.assert_array_equal(ctx.uploads[k][1], honest[k][1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_camouflage_paper_formula_float32_gives_exactly_four(backend, at):
    _, ctx, _ = cam_context(np.float32, backend, at)
    Camouflage(include_eps=False).apply_inplace(ctx)
    # m̃ = a + c₁·4 = 3, ṽ = b + c₂·16 = 9: exact in float32
    assert ctx.uploads["m"][0, 0] == np.float32(3.0)
    assert ctx.uploads["v"][0, 0] == np.float32(9.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_camouflage_paper_formula_float64_falls_back_where_eps_shows(backend, at):
    # ε = 1e-8 moves ηₜ·u(4) = ηₜ·3/(3 + ε) away from ηₜ·1/(1 + ε) by ηₜ·(2/3)·1e-8,
    # far above float64 rounding of θ: Eq. 6 without ε cannot camouflage here
    opt, ctx, honest = cam_context(np.float64, backend, at)
    diag = Camouflage(include_eps=False).apply_inplace(ctx)
    assert diag["camouflaged_fraction"] == 0.0
    for k in opt.arrays:
        np.testing.assert_array_equal(ctx.uploads[k], honest[k])


@pytest.mark.parametrize("backend", BACKENDS)
def test_camouflage_with_zero_second_moment(backend, at):
    # v̄ = 0, m̄ = 2, β₁ = β₂ = 1/2: a = 1, b = 0, g = 1: den = c₂a(a + 2c₁g) = 1,
    # g̃ = −ag/(a + 2c₁g) = −1/2; u(1) = 1.5/√0.5 = u(−1/2) = 0.75/√0.125
    opt = Adam(lr=0.01, beta1=0.5, beta2=0.5)
    state = {"m": np.array([2.0]), "v": np.array([0.0]), "theta": np.array([0.0])}
    ctx, honest = at.context(opt, state, np.array([[1.0]]), [True], 2, backend=backend)
    Camouflage().apply_inplace(ctx)
    g_hat = (ctx.uploads["m"][0, 0] - 1.0) / 0.5
    assert g_hat == pytest.approx(-0.5, rel=1e-6)
    u = np.finfo(np.float64).eps / 2
    assert abs(ctx.uploads["theta"][0, 0] - honest["theta"][0, 0]) <= 6 * u * abs(honest["theta"][0, 0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("include_eps", [True, False])
def test_camouflage_zero_denominator_keeps_g(include_eps, backend, at):
    # a = 1, b = 2, g = 0: den = c₂a² + 2c₁c₂ag − c₁²b = 1/2 − 1/2 = 0: u(0) = 1/√2 is
    # the asymptote itself, g̃ = ∞
    opt = Adam(lr=0.01, beta1=0.5, beta2=0.5)
    state = {"m": np.array([2.0]), "v": np.array([4.0]), "theta": np.array([0.5])}
    ctx, honest = at.context(opt, state, np.zeros((1, 1)), [True], 2, backend=backend)
    diag = Camouflage(include_eps=include_eps).apply_inplace(ctx)
    assert diag["camouflaged_fraction"] == 0.0
    for k in opt.arrays:
        np.testing.assert_array_equal(ctx.uploads[k], honest[k])


@pytest.mark.parametrize("backend", BACKENDS)
def test_camouflage_second_moment_overflowing_float32_keeps_g(backend, at):
    # m̄ = 2⁴⁰, v̄ = 2⁸⁰(1 − 2⁻²⁴), g = 0: a = 2³⁹, b = 2⁷⁹ − 2⁵⁵, den = 2⁷⁷ − (2⁷⁷ − 2⁵³)
    # = 2⁵³ exactly, g̃ = ab/den = 2⁶⁵ − 2⁴¹ (a float32), but ṽ = b + g̃²/2 ≈ 2¹²⁹
    # exceeds float32's largest value 2¹²⁸(1 − 2⁻²⁴)
    opt = Adam(lr=0.01, beta1=0.5, beta2=0.5)
    v_bar = 2.0**80 * (1 - 2.0**-24)

    def ctx_for(dtype):
        state = {"m": np.array([2.0**40], dtype), "v": np.array([v_bar], dtype),
                 "theta": np.array([0.5], dtype)}
        return at.context(opt, state, np.zeros((1, 1), dtype), [True], 2, backend=backend)

    ctx, honest = ctx_for(np.float32)
    assert Camouflage(include_eps=False).apply_inplace(ctx)["camouflaged_fraction"] == 0.0
    for k in opt.arrays:
        np.testing.assert_array_equal(ctx.uploads[k], honest[k])
    # in float64 the same g̃ fits
    ctx, honest = ctx_for(np.float64)
    assert Camouflage(include_eps=False).apply_inplace(ctx)["camouflaged_fraction"] == 1.0
    assert (ctx.uploads["m"][0, 0] - 2.0**39) / 0.5 == 2.0**65 - 2.0**41


@pytest.mark.parametrize("backend", BACKENDS)
def test_camouflage_first_round_changes_nothing(backend, at):
    opt = Adam()
    rng = np.random.default_rng(1)
    state = opt.init(rng.standard_normal(50))
    G = rng.standard_normal((3, 50))
    ctx, honest = at.context(opt, state, G, [True, True, False], 1, backend=backend)
    diag = Camouflage().apply_inplace(ctx)
    assert diag["camouflaged_fraction"] == 0.0
    for k in opt.arrays:
        np.testing.assert_array_equal(ctx.uploads[k], honest[k])


# -- ALIE and IPM -----------------------------------------------------------------------

def test_alie_z_follows_baruch_et_al():
    # s = ⌊n/2 + 1⌋ − f supporters needed, z = Φ⁻¹((n − s)/n)
    assert alie_z(50, 24) == pytest.approx(norm.ppf(48 / 50), rel=1e-12)  # s = 2
    assert alie_z(7, 2) == pytest.approx(norm.ppf(5 / 7), rel=1e-12)  # s = 2
    assert alie_z(20, 5) == pytest.approx(norm.ppf(14 / 20), rel=1e-12)  # s = 6
    # a Byzantine majority needs no supporter: s clamps to 1
    assert alie_z(10, 6) == pytest.approx(norm.ppf(9 / 10), rel=1e-12)
    # one or two clients: the probability clamps to 1/2, z = 0
    assert alie_z(1, 1) == 0.0
    assert alie_z(2, 1) == 0.0
    with pytest.raises(ValueError, match="f=3"):
        alie_z(2, 3)


ALIE_G = [[1.0, 2.0], [9.0, 9.0], [3.0, 6.0], [5.0, -1.0], [0.0, 0.0], [2.0, 2.0], [7.0, 1.0]]
ALIE_BYZ = [True, False, True, False, False, False, False]


@pytest.mark.parametrize("backend", BACKENDS)
def test_alie_hand_example_sgd(backend, at):
    ctx, honest = sgd_round([0.0, 1.0], ALIE_G, ALIE_BYZ, 0.5, at, backend)
    diag = ALIE().apply_inplace(ctx)
    # Byzantine rows [1, 2] and [3, 6]: μ = [2, 4], sample σ = [√2, √8]; n = 7, f = 2
    z = norm.ppf(5 / 7)
    g = np.array([2.0, 4.0]) - z * np.array([math.sqrt(2), math.sqrt(8)])
    expected = np.array([0.0, 1.0]) - 0.5 * g
    for r in (0, 2):
        np.testing.assert_allclose(ctx.uploads["theta"][r], expected, rtol=1e-14)
    for r in (1, 3, 4, 5, 6):
        np.testing.assert_array_equal(ctx.uploads["theta"][r], honest["theta"][r])
    assert diag == {"z": pytest.approx(z, rel=1e-12), "n": 7, "f": 2, "statistic_rows": 2}


@pytest.mark.parametrize("backend", BACKENDS)
def test_alie_options(backend, at):
    ctx, _ = sgd_round([0.0, 0.0], ALIE_G, ALIE_BYZ, 1.0, at, backend)
    ALIE(z=1.5, ddof=0, omniscient=True).apply_inplace(ctx)
    X = np.array(ALIE_G)
    mu = X.mean(axis=0)
    sd = np.sqrt(((X - mu) ** 2).sum(axis=0) / 7)
    np.testing.assert_allclose(ctx.uploads["theta"][0], -(mu - 1.5 * sd), rtol=1e-13)


@pytest.mark.parametrize("backend", BACKENDS)
def test_alie_single_byzantine_client_uploads_its_honest_gradient(backend, at):
    ctx, honest = sgd_round([0.0, 1.0], ALIE_G, [False, True, False, False, False, False, False],
                            0.5, at, backend)
    diag = ALIE().apply_inplace(ctx)
    np.testing.assert_allclose(ctx.uploads["theta"][1], honest["theta"][1], rtol=1e-15)
    assert diag["f"] == 1 and diag["statistic_rows"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_ipm_hand_example_sgd(backend, at):
    ctx, honest = sgd_round([0.0, 1.0], ALIE_G, ALIE_BYZ, 0.5, at, backend)
    diag = IPM().apply_inplace(ctx)
    # −0.1 · mean([1, 2], [3, 6]) = [−0.2, −0.4]; θ = θ̄ − η·g = [0.1, 1.2]
    for r in (0, 2):
        np.testing.assert_allclose(ctx.uploads["theta"][r], [0.1, 1.2], rtol=1e-14)
    for r in (1, 3, 4, 5, 6):
        np.testing.assert_array_equal(ctx.uploads["theta"][r], honest["theta"][r])
    assert diag == {"epsilon": 0.1, "statistic_rows": 2}


@pytest.mark.parametrize("backend", BACKENDS)
def test_ipm_omniscient(backend, at):
    ctx, _ = sgd_round([0.0, 0.0], ALIE_G, ALIE_BYZ, 1.0, at, backend)
    IPM(epsilon=2.0, omniscient=True).apply_inplace(ctx)
    # mean of all seven rows: [27/7, 19/7]; g = −2·mean; θ = −g
    np.testing.assert_allclose(ctx.uploads["theta"][0], [54 / 7, 38 / 7], rtol=1e-14)


def test_none_changes_nothing(at):
    opt = Adam()
    rng = np.random.default_rng(0)
    state = at.realistic_state(opt, rng, 9, np.float32)
    G = rng.standard_normal((3, 9)).astype(np.float32)
    ctx, honest = at.context(opt, state, G, [True, True, True], 4)
    assert NoAttack().apply_inplace(ctx) == {}
    for k in opt.arrays:
        np.testing.assert_array_equal(ctx.uploads[k], honest[k])
