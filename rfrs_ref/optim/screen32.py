"""The verification screen in float32 arithmetic: the readable reference.

The server's screen (:meth:`rfrs_ref.optim.base.Optimizer.verify_batch` with
``screen=True``) decides, per coordinate, whether |ρ| ≤ S·τ holds for the residual ρ
and the tolerance S·τ that the exact kernel computes in float64. For float32 state and
uploads the kernels first try a cheaper test in float32 arithmetic (no conversions,
twice the vector lanes, a float32 square root and reciprocal), which passes a coordinate
only where the float64 screen certainly passes it:

    |ρ₃₂| + E₃₂ ≤ L₃₂   and   L₃₂ ≤ the largest finite float32          (float32 test)

- ρ₃₂: the check's residual evaluated in float32 (with ĝ₃₂, the gradient recovered in
  float32, or the recovered row rounded to float32);
- E₃₂: a bound on |ρ₆₄| − |ρ₃₂|, ρ₆₄ the float64 screen's residual: the float32
  roundings of ρ₃₂'s evaluation (4u of the magnitudes it adds and of |ρ₃₂|), and, for the
  second-moment checks, c·Δ(2|ĝ₃₂| + Δ) with Δ ≥ |ĝ₃₂ − ĝ₆₄| (c the coefficient of ĝ²);
- L₃₂: a lower bound on the float64 screen's S·τ: τ's terms in u, with ĝ lowered to
  max(|ĝ₃₂| − 2Δ, 0) (Adam) or max(|ĝ₃₂| − Δ, 0) (AdaGrad, RMSProp), τ's tiny terms left
  out, times S·κ with κ = 1 − 2⁻¹⁶ (the roundings of L₃₂'s own evaluation and of the
  float64 S·τ, fewer than 40 units of 2⁻²⁴ or 2⁻⁵³ in all).

u = 2⁻²⁴ throughout. The tiny terms that τ keeps and L₃₂ drops cover every underflow of
the float32 evaluation (S ≥ 1). Derivation, counts and the conditions under which the
test is used: docs/optimizers.md ("The screen in float32"). Where it is not used, or
where a block has a coordinate it cannot pass, the float64 screen decides, so the rows
found sure are the float64 screen's, bit for bit.

The functions below evaluate the very float32 operations of the kernels
(:mod:`rfrs_ref.kernels.optim`, ``_adam_coord32`` and ``_root_coord32``) in NumPy
float32 arithmetic, in the same order, so they return the kernels' decisions, coordinate
by coordinate. They are the reference the kernels are tested against.
"""

from __future__ import annotations

import numpy as np

#: κ: the relative slack of the float32 lower bound on S·τ
KAPPA = 1.0 - 2.0**-16
U32 = 2.0**-24
TINY32 = 2.0**-149
F32_MAX = float(np.finfo(np.float32).max)
#: the range of the hyperparameters (or exactly 0) and of S within which the test is used
SCALAR_MIN, SCALAR_MAX = 2.0**-100, 2.0**100
SAFETY_MAX = 2.0**20

# indices of Adam's float32 constants
(A32_B1, A32_IC1, A32_B2, A32_C2, A32_LR, A32_EPS, A32_U2, A32_U4, A32_U8, A32_B1IC1,
 A32_SU10, A32_SU3, A32_SU3C2, A32_SKC2, A32_BM, A32_BG, A32_SU14, A32_FMAX, A32_ONE) = range(19)
# of AdaGrad's and RMSProp's
(R32_DECAY, R32_COEF, R32_ILR, R32_EPS, R32_U4, R32_U8, R32_SU10, R32_SU3, R32_SU3C, R32_SKC,
 R32_B2ILR, R32_BG, R32_FMAX) = range(13)


def applies(arrays, u: float, tiny: float, safety: float, scalars) -> bool:
    """Whether the float32 test may be used: the state's and the uploads' arrays are
    float32 (so u = 2⁻²⁴ and tiny = 2⁻¹⁴⁹), 1 ≤ S ≤ 2²⁰, and every hyperparameter is 0 or
    has a magnitude within [2⁻¹⁰⁰, 2¹⁰⁰] (so that it rounds to a normal float32 with a
    relative error ≤ u, and no float64 operation of the screen underflows or overflows)."""
    if u != U32 or tiny != TINY32 or not (1.0 <= safety <= SAFETY_MAX):
        return False
    if any(np.asarray(a).dtype != np.float32 for a in arrays):
        return False
    return all(x == 0.0 or SCALAR_MIN <= abs(x) <= SCALAR_MAX for x in scalars)


def adam_constants(arrays, beta1, c1, beta2, c2, lr_t, eps, u, tiny, safety):
    """(k32, use32): Adam's float32 constants (rounded to nearest from float64) and
    whether the test applies to ``arrays`` (the state's and the uploads')."""
    inv_c1 = 1.0 / c1
    use = applies(arrays, u, tiny, safety, (beta1, c1, inv_c1, beta2, c2, lr_t, eps))
    sk = safety * KAPPA
    k = np.zeros(19, dtype=np.float32)
    k[[A32_B1, A32_IC1, A32_B2, A32_C2, A32_LR, A32_EPS]] = beta1, inv_c1, beta2, c2, lr_t, eps
    k[[A32_U2, A32_U4, A32_U8]] = 2 * U32, 4 * U32, 8 * U32
    k[A32_B1IC1] = beta1 * inv_c1
    k[[A32_SU10, A32_SU3, A32_SU3C2, A32_SKC2]] = sk * 10 * u, sk * 3 * u, sk * 3 * u * c2, sk * c2
    k[[A32_BM, A32_BG, A32_SU14]] = 6.0 * u * beta1 / c1, 9.0 * u, sk * 14 * u
    k[A32_FMAX], k[A32_ONE] = F32_MAX, 1.0
    return k, bool(use)


def root_constants(arrays, decay, coef, lr, eps, u, tiny, safety):
    """(k32, use32) for AdaGrad (decay, coef) = (1, 1) and RMSProp (β₄, 1 − β₄)."""
    inv_lr = 1.0 / lr
    use = applies(arrays, u, tiny, safety, (decay, coef, lr, inv_lr, eps))
    sk = safety * KAPPA
    k = np.zeros(13, dtype=np.float32)
    k[[R32_DECAY, R32_COEF, R32_ILR, R32_EPS]] = decay, coef, inv_lr, eps
    k[[R32_U4, R32_U8]] = 4 * U32, 8 * U32
    k[[R32_SU10, R32_SU3, R32_SU3C, R32_SKC]] = sk * 10 * u, sk * 3 * u, sk * 3 * u * coef, sk * coef
    k[[R32_B2ILR, R32_BG, R32_FMAX]] = 2.0 * u * inv_lr, 14.0 * u, F32_MAX
    return k, bool(use)


def _f32(x):
    return np.asarray(x, dtype=np.float32)


def adam_gradient(m, m_bar, k):
    """ĝ₃₂ = (m − β₁m̄)·(1/c₁), in float32 (the kernels' recovery in registers)."""
    m, m_bar = _f32(m), _f32(m_bar)
    return (m - k[A32_B1] * m_bar) * k[A32_IC1]


def adam_sure(m_bar, v_bar, theta_bar, m, v, theta, g, k):
    """bool, elementwise: the float32 test passes both of Adam's rule checks (and the
    structural ones: finite m, v, θ; v ≥ 0). ``g``: ĝ₃₂ (float32)."""
    mb, vb, tb, m, v, th, g = (_f32(a) for a in (m_bar, v_bar, theta_bar, m, v, theta, g))
    zero = np.float32(0.0)
    with np.errstate(all="ignore"):
        ag, amb = np.abs(g), np.abs(mb)
        # Δ ≥ |ĝ₃₂ − ĝ₆₄|; glo ≤ |ĝ₆₄|
        dg = k[A32_U4] * (ag + k[A32_B1IC1] * amb)
        glo = ag - (dg + dg)
        glo = np.where(glo > zero, glo, zero)
        # v-rule: ρ = v − β₂v̄ − c₂ĝ²
        pv = k[A32_B2] * vb
        q = k[A32_C2] * (g * g)
        rv = (v - pv) - q
        arv = np.abs(rv)
        lv = arv + k[A32_U4] * (((v + pv) + q) + arv) + k[A32_C2] * dg * ((ag + ag) + dg)
        bl = k[A32_BM] * amb + k[A32_BG] * glo
        sv = (k[A32_SU10] * v + k[A32_SU3] * pv + k[A32_SU3C2] * (glo * glo)
              + k[A32_SKC2] * bl * ((glo + glo) + bl))
        # theta-rule: ρ = (θ − θ̄) + ηₜ·m/(√v + ε)
        d = th - tb
        inv_s = k[A32_ONE] / (np.sqrt(v) + k[A32_EPS])
        stp = (k[A32_LR] * m) * inv_s
        rt = d + stp
        art, astp = np.abs(rt), np.abs(stp)
        lt = art + k[A32_U2] * (np.abs(d) + art) + k[A32_U8] * astp
        st = k[A32_SU3] * np.abs(tb) + k[A32_SU14] * astp
        return ((lv <= sv) & (sv <= k[A32_FMAX]) & (lt <= st) & (st <= k[A32_FMAX])
                & np.isfinite(m) & np.isfinite(v) & np.isfinite(th) & (v >= zero))


def root_gradient(theta_bar, r, theta, k):
    """ĝ₃₂ = ((θ̄ − θ)·(√r + ε))·(1/η), in float32 (the kernels' recovery in registers)."""
    tb, r, th = _f32(theta_bar), _f32(r), _f32(theta)
    with np.errstate(invalid="ignore"):
        return ((tb - th) * (np.sqrt(r) + k[R32_EPS])) * k[R32_ILR]


def root_sure(r_bar, theta_bar, r, theta, g, k):
    """bool, elementwise: the float32 test passes the r-rule (and finite r, θ; r ≥ 0)."""
    rb, tb, r, th, g = (_f32(a) for a in (r_bar, theta_bar, r, theta, g))
    zero = np.float32(0.0)
    with np.errstate(all="ignore"):
        s = np.sqrt(r) + k[R32_EPS]
        ag = np.abs(g)
        dg = k[R32_U8] * ag
        glo = ag - dg
        glo = np.where(glo > zero, glo, zero)
        pr = k[R32_DECAY] * rb
        q = k[R32_COEF] * (g * g)
        rho = (r - pr) - q
        arho = np.abs(rho)
        lhs = arho + k[R32_U4] * (((r + pr) + q) + arho) + k[R32_COEF] * dg * ((ag + ag) + dg)
        bl = k[R32_B2ILR] * np.abs(tb) * s + k[R32_BG] * glo
        rhs = (k[R32_SU10] * r + k[R32_SU3] * pr + k[R32_SU3C] * (glo * glo)
               + k[R32_SKC] * bl * ((glo + glo) + bl))
        return (lhs <= rhs) & (rhs <= k[R32_FMAX]) & np.isfinite(r) & np.isfinite(th) & (r >= zero)
