"""The paper's optimiser laws (SPEC §9): Lemma 2, the chains of Theorems 1–4, equivalences.

Every law is checked on the float64 oracle for arbitrary states and gradients.
Equalities and inequalities hold exactly in real arithmetic; the computed
sides carry float64 rounding, so each comparison allows ``_slack``: 32 unit
roundoffs of the norms of the magnitudes that enter the computation (the
operands that cancel, and both sides).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rfrs_ref.optim import SGD, AdaGrad, Adam, Momentum, RMSProp
from rfrs_ref.testing.laws import nrm
from rfrs_ref.testing.strategies import gradient_sequences

U = 2.0**-53
TINY = float(np.finfo(np.float64).smallest_subnormal)


def _slack(*mags, amp=1.0) -> float:
    """32u times the magnitudes' norms, plus underflow: each operation may lose tiny/2,
    amplified by ``amp`` when a later division (by √v + ε ≥ ε) scales it up."""
    return 32 * U * sum(nrm(np.atleast_1d(m)) for m in mags) + 64 * TINY * (1.0 + amp)


def _close(a, b, *mags, amp=1.0):
    assert abs(a - b) <= _slack(a, b, *mags, amp=amp), (a, b)


def _leq(a, b, *mags, amp=1.0):
    assert a <= b + _slack(a, b, *mags, amp=amp), (a, b)


def vectors(D, bound=1e6):
    return hnp.arrays(np.float64, D, elements=st.floats(-bound, bound, allow_nan=False))


@st.composite
def pair_case(draw, kind):
    """State, honest g and an arbitrary ĝ on the same state, and the lower bound of
    the second moment's state (v_min or r_min; 0 allowed)."""
    D = draw(st.integers(1, 8))
    floor = draw(st.sampled_from([0.0]) | st.floats(1e-8, 1e3))
    state = {"theta": draw(vectors(D)), "m": draw(vectors(D)),
             "v": floor + np.abs(draw(vectors(D, 1e3)))}
    state["r"] = state["v"]
    g, g_hat = draw(vectors(D, 1e3)), draw(vectors(D, 1e3))
    t = draw(st.integers(1, 10**5))
    # β = 0 or a realistic decay: a β₂ of 1e-300 makes β₂·v_min vanish and every bound vacuous
    beta = st.just(0.0) | st.floats(1e-3, 0.9999)
    if kind == "adam":
        opt = Adam(lr=draw(st.floats(1e-5, 1.0)), beta1=min(draw(beta), 0.999),
                   beta2=draw(beta), eps=draw(st.floats(1e-12, 1e-2)))
    elif kind == "momentum":
        opt = Momentum(lr=draw(st.floats(1e-5, 1.0)), beta3=min(draw(beta), 0.999))
    elif kind == "adagrad":
        opt = AdaGrad(lr=draw(st.floats(1e-5, 1.0)), eps=draw(st.floats(1e-12, 1e-2)))
    else:
        opt = RMSProp(lr=draw(st.floats(1e-5, 1.0)), beta4=draw(beta),
                      eps=draw(st.floats(1e-12, 1e-2)))
    return opt, state, g, g_hat, t, floor


# -- Lemma 2 --------------------------------------------------------------------------------



def _run(opt, g_max, rounds, D):
    state = opt.init(np.zeros(D))
    for t, (G, w) in enumerate(rounds, start=1):
        ups = [opt.client_rule(state, g, t) for g in G]
        yield t, ups
        state = {k: sum(wi * up[k] for wi, up in zip(w, ups)) for k in opt.arrays}


@given(seq=gradient_sequences(), beta1=st.floats(0.0, 0.999))
def test_lemma2_adam_first_moment_stays_below_g_max(seq, beta1):
    """‖m‖ ≤ g_max every round (the paper's Lemma 2), indeed ≤ (1 − β₁ᵗ)·g_max."""
    g_max, rounds = seq.g_max, seq.rounds
    opt = Adam(beta1=beta1)
    for t, ups in _run(opt, g_max, rounds, rounds[0][0].shape[1]):
        for up in ups:
            assert nrm(up["m"]) <= (1 - beta1**t) * g_max * (1 + 1e-12) <= g_max * (1 + 1e-12)


@given(seq=gradient_sequences(), beta3=st.floats(0.0, 0.999))
def test_lemma2_analogue_for_momentum(seq, beta3):
    """m = β₃m̄ + g: ‖m‖ ≤ g_max(1 − β₃ᵗ)/(1 − β₃) ≤ g_max/(1 − β₃) every round."""
    g_max, rounds = seq.g_max, seq.rounds
    opt = Momentum(beta3=beta3)
    for t, ups in _run(opt, g_max, rounds, rounds[0][0].shape[1]):
        for up in ups:
            bound = g_max * (1 - beta3**t) / (1 - beta3) * (1 + 1e-12)
            assert nrm(up["m"]) <= bound <= g_max / (1 - beta3) * (1 + 1e-12)


def test_lemma2_bound_is_attained_and_the_papers_equality_is_not_one():
    """The same gradient of norm g_max every round gives ‖m‖ = (1 − β₁ᵗ)g_max; and
    ‖Σλᵢmᵢ‖ = Σλᵢ‖mᵢ‖ (the paper's second step) fails for opposite moments."""
    opt = Adam()
    g = np.array([3.0, 4.0])  # g_max = 5
    rounds = [(np.stack([g, g]), np.array([0.5, 0.5]))] * 30
    for t, ups in _run(opt, 5.0, rounds, 2):
        assert nrm(ups[0]["m"]) == pytest.approx((1 - 0.9**t) * 5.0, rel=1e-13)
    m1, m2 = np.array([1.0, 0.0]), np.array([-1.0, 0.0])
    assert nrm(0.5 * m1 + 0.5 * m2) == 0.0 < 0.5 * nrm(m1) + 0.5 * nrm(m2)


# -- Theorem 1 (Adam), link by link ------------------------------------------------------------

@given(case=pair_case("adam"))
def test_theorem1_first_moment_link(case):
    """‖m̂ − m‖ = (1 − β₁)‖ĝ − g‖."""
    opt, state, g, gh, t, _ = case
    A, H = opt.client_rule(state, g, t), opt.client_rule(state, gh, t)
    c1 = 1 - opt.beta1
    _close(nrm(H["m"] - A["m"]), c1 * nrm(gh - g), opt.beta1 * state["m"], c1 * g, c1 * gh)


@given(case=pair_case("adam"))
def test_theorem1_second_moment_link(case):
    """‖v̂ − v‖ ≤ (1 − β₂)(‖ĝ − g‖² + 2‖ĝ − g‖·‖g‖)."""
    opt, state, g, gh, t, _ = case
    A, H = opt.client_rule(state, g, t), opt.client_rule(state, gh, t)
    d = nrm(gh - g)
    _leq(nrm(H["v"] - A["v"]), (1 - opt.beta2) * (d * d + 2 * d * nrm(g)), A["v"], H["v"])


@given(case=pair_case("adam"))
def test_theorem1_root_link(case):
    """Every v̄ ≥ v_min > 0: ‖√v̂ − √v‖ ≤ ‖v̂ − v‖/(2√(β₂v_min))."""
    opt, state, g, gh, t, vmin = case
    if vmin == 0.0 or opt.beta2 == 0.0:
        return
    A, H = opt.client_rule(state, g, t), opt.client_rule(state, gh, t)
    rhs = nrm(H["v"] - A["v"]) / (2 * math.sqrt(opt.beta2 * vmin))
    _leq(nrm(np.sqrt(H["v"]) - np.sqrt(A["v"])), rhs, np.sqrt(A["v"]), np.sqrt(H["v"]),
         (A["v"] + H["v"]) / (2 * math.sqrt(opt.beta2 * vmin)))


def _inv(v, eps):
    return 1.0 / (np.sqrt(v) + eps)


@given(case=pair_case("adam"))
def test_theorem1_inverse_root_link_with_eps(case):
    """‖1/(√v̂ + ε) − 1/(√v + ε)‖ ≤ ‖√v̂ − √v‖/(√(β₂v_min) + ε)².

    With ε kept the link holds for v_min = 0 too (constant 1/ε²); the paper's
    ε-free constant 1/(β₂v_min) needs v_min > 0.
    """
    opt, state, g, gh, t, vmin = case
    A, H = opt.client_rule(state, g, t), opt.client_rule(state, gh, t)
    lo = (math.sqrt(opt.beta2 * vmin) + opt.eps) ** 2
    rhs = nrm(np.sqrt(H["v"]) - np.sqrt(A["v"])) / lo
    _leq(nrm(_inv(H["v"], opt.eps) - _inv(A["v"], opt.eps)), rhs, _inv(H["v"], opt.eps),
         _inv(A["v"], opt.eps), (np.sqrt(A["v"]) + np.sqrt(H["v"])) / lo)


def _adam_update_bound(opt, A, H, vmin):
    """‖m‖·‖Δinv‖ + ‖Δm‖/(√(β₂v_min) + ε) + ‖Δm‖·‖Δinv‖ (the paper's Eq. u5 with ε)."""
    dm = nrm(H["m"] - A["m"])
    dinv = nrm(_inv(H["v"], opt.eps) - _inv(A["v"], opt.eps))
    return nrm(A["m"]) * dinv + dm / (math.sqrt(opt.beta2 * vmin) + opt.eps) + dm * dinv


def _adam_update_slack_mags(opt, state, g, gh, A, H, vmin):
    """Magnitudes whose rounding enters the update link: both updates, ‖m‖ times the
    inverse roots (the rounding of Δinv), and the operands of Δm over √(β₂v_min) + ε."""
    ia, ih = _inv(A["v"], opt.eps), _inv(H["v"], opt.eps)
    a = math.sqrt(opt.beta2 * vmin) + opt.eps
    dm_ops = 2 * opt.beta1 * np.abs(state["m"]) + (1 - opt.beta1) * (np.abs(g) + np.abs(gh))
    return [H["m"] * ih, A["m"] * ia, nrm(A["m"]) * (ia + ih), dm_ops * (1 / a + nrm(ia + ih))]


@given(case=pair_case("adam"))
def test_theorem1_update_link(case):
    """‖m̂/(√v̂ + ε) − m/(√v + ε)‖ ≤ ‖m‖‖Δinv‖ + ‖Δm‖/(√(β₂v_min) + ε) + ‖Δm‖‖Δinv‖."""
    opt, state, g, gh, t, vmin = case
    A, H = opt.client_rule(state, g, t), opt.client_rule(state, gh, t)
    uh, ua = H["m"] * _inv(H["v"], opt.eps), A["m"] * _inv(A["v"], opt.eps)
    _leq(nrm(uh - ua), _adam_update_bound(opt, A, H, vmin),
         *_adam_update_slack_mags(opt, state, g, gh, A, H, vmin), amp=1 / opt.eps)


@given(case=pair_case("adam"))
def test_theorem1_theta_link_with_lr_t(case):
    """‖θ̂ − θ‖ ≤ ηₜ·(the update bound), and the closed form in ‖ĝ − g‖, ‖g‖, ‖m‖:

        ηₜ[(‖m‖ + c₁‖Δg‖)·c₂(‖Δg‖² + 2‖Δg‖‖g‖)/(2√(β₂v_min)(√(β₂v_min) + ε)²)
           + c₁‖Δg‖/(√(β₂v_min) + ε)]         (v_min > 0)
    """
    opt, state, g, gh, t, vmin = case
    A, H = opt.client_rule(state, g, t), opt.client_rule(state, gh, t)
    lr_t = opt.step_size(t)
    mags = [lr_t * m for m in _adam_update_slack_mags(opt, state, g, gh, A, H, vmin)]
    lhs = nrm(H["theta"] - A["theta"])
    _leq(lhs, lr_t * _adam_update_bound(opt, A, H, vmin), state["theta"], state["theta"], *mags, amp=1 / opt.eps)
    if vmin > 0 and opt.beta2 > 0:
        d, c1, c2 = nrm(gh - g), 1 - opt.beta1, 1 - opt.beta2
        a = math.sqrt(opt.beta2 * vmin)
        closed = lr_t * ((nrm(A["m"]) + c1 * d) * c2 * (d * d + 2 * d * nrm(g)) / (2 * a * (a + opt.eps) ** 2)
                         + c1 * d / (a + opt.eps))
        _leq(lhs, closed, state["theta"], state["theta"], *mags, amp=1 / opt.eps)


# -- Theorem 2 (momentum) ------------------------------------------------------------------------

@given(case=pair_case("momentum"))
def test_theorem2_momentum_chain(case):
    """‖m̂ − m‖ = ‖ĝ − g‖ and ‖θ̂ − θ‖ = η‖ĝ − g‖ (the paper omits η)."""
    opt, state, g, gh, t, _ = case
    A, H = opt.client_rule(state, g, t), opt.client_rule(state, gh, t)
    d = nrm(gh - g)
    _close(nrm(H["m"] - A["m"]), d, opt.beta3 * state["m"], g, gh)
    _close(nrm(H["theta"] - A["theta"]), opt.lr * d, state["theta"], state["theta"],
           opt.lr * A["m"], opt.lr * H["m"])


# -- Theorems 3 and 4 (AdaGrad, RMSProp) -------------------------------------------------------

@pytest.mark.parametrize("kind", ["adagrad", "rmsprop"])
@given(data=st.data())
def test_theorems3_4_root_chain(kind, data):
    """With (decay, coef) = (1, 1) for AdaGrad and (β₄, 1 − β₄) for RMSProp, r̄ ≥ r_min:
    ‖r̂ − r‖ ≤ coef(‖Δg‖² + 2‖Δg‖‖g‖); ‖√r̂ − √r‖ ≤ ‖r̂ − r‖/(2√(decay·r_min));
    ‖Δinv‖ ≤ ‖√r̂ − √r‖/(√(decay·r_min) + ε)²;
    ‖ĝ/(√r̂ + ε) − g/(√r + ε)‖ ≤ ‖g‖‖Δinv‖ + ‖Δg‖/(√(decay·r_min) + ε) + ‖Δg‖‖Δinv‖;
    ‖θ̂ − θ‖ = η·(that left side)."""
    opt, state, g, gh, t, rmin = data.draw(pair_case(kind))
    decay, coef = opt._decay_coef()
    A, H = opt.client_rule(state, g, t), opt.client_rule(state, gh, t)
    d = nrm(gh - g)
    dr = nrm(H["r"] - A["r"])
    _leq(dr, coef * (d * d + 2 * d * nrm(g)), A["r"], H["r"], amp=1 / opt.eps)
    droot = nrm(np.sqrt(H["r"]) - np.sqrt(A["r"]))
    a = math.sqrt(decay * rmin)
    if a > 0:
        _leq(droot, dr / (2 * a), np.sqrt(A["r"]), np.sqrt(H["r"]), (A["r"] + H["r"]) / (2 * a), amp=1 / opt.eps)
    ia, ih = _inv(A["r"], opt.eps), _inv(H["r"], opt.eps)
    dinv = nrm(ih - ia)
    _leq(dinv, droot / (a + opt.eps) ** 2, ia, ih, (np.sqrt(A["r"]) + np.sqrt(H["r"])) / (a + opt.eps) ** 2, amp=1 / opt.eps)
    lhs_u = nrm(gh * ih - g * ia)
    mags = [gh * ih, g * ia, nrm(g) * (ia + ih), (np.abs(g) + np.abs(gh)) * (1 / (a + opt.eps) + nrm(ia + ih))]
    _leq(lhs_u, nrm(g) * dinv + d / (a + opt.eps) + d * dinv, *mags, amp=1 / opt.eps)
    steps = opt.lr * (np.abs(g) * ia + np.abs(gh) * ih)
    _close(nrm(H["theta"] - A["theta"]), opt.lr * lhs_u, state["theta"], state["theta"], steps,
           amp=1 / opt.eps)


# -- equivalences --------------------------------------------------------------------------------

@given(case=pair_case("momentum"), backend=st.sampled_from(["numpy", "numba"]))
def test_momentum_without_momentum_is_sgd(case, backend):
    _, state, g, _, t, _ = case
    lr = case[0].lr
    G = g[None, :]
    mo = {k: np.empty_like(G) for k in ("m", "theta")}
    sg = {"theta": np.empty_like(G)}
    Momentum(lr=lr, beta3=0.0).client_rule_batch(state, G, t, mo, backend=backend)
    SGD(lr=lr).client_rule_batch(state, G, t, sg, backend=backend)
    np.testing.assert_array_equal(mo["theta"], sg["theta"])
    np.testing.assert_array_equal(mo["m"], G)


@given(case=pair_case("adam"), backend=st.sampled_from(["numpy", "numba"]))
def test_adam_without_first_moment_is_rmsprop_at_the_bias_corrected_rate(case, backend):
    """Adam(β₁ = 0, β₂, η, ε) at round t = RMSProp(β₄ = β₂, η' = ηₜ = η√(1 − β₂ᵗ), ε):
    same v and r, same θ, bit for bit. ε is not rescaled (it sits outside the root in
    both and the bias correction is folded into ηₜ only); without the rescaling of η
    the two differ in every round where √(1 − β₂ᵗ) ≠ 1."""
    opt, state, g, _, t, _ = case
    adam = Adam(lr=opt.lr, beta1=0.0, beta2=opt.beta2, eps=opt.eps)
    lr_t = adam.step_size(t)
    assert math.isclose(lr_t, opt.lr * math.sqrt(1 - opt.beta2**t), rel_tol=1e-12)
    rms = RMSProp(lr=lr_t, beta4=opt.beta2, eps=opt.eps)
    G = g[None, :]
    ua = {k: np.empty_like(G) for k in adam.arrays}
    ur = {k: np.empty_like(G) for k in rms.arrays}
    adam.client_rule_batch(state, G, t, ua, backend=backend)
    rms.client_rule_batch({"r": state["v"], "theta": state["theta"]}, G, t, ur, backend=backend)
    np.testing.assert_array_equal(ua["v"], ur["r"])
    np.testing.assert_array_equal(ua["theta"], ur["theta"])
    np.testing.assert_array_equal(ua["m"], G)


def test_without_the_rate_rescaling_adam_and_rmsprop_differ():
    state = {"m": np.zeros(3), "v": np.zeros(3), "theta": np.zeros(3)}
    g = np.array([1.0, -2.0, 0.5])
    a = Adam(beta1=0.0).client_rule(state, g, 1)["theta"]
    r = RMSProp(beta4=0.999).client_rule({"r": state["v"], "theta": state["theta"]}, g, 1)["theta"]
    assert not np.allclose(a, r)
    np.testing.assert_allclose(a, r * math.sqrt(1 - 0.999), rtol=1e-12)
