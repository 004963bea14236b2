"""Rounding bounds of the federated update rules: recovery and verification tolerances.

Every bound here is a per-coordinate upper bound on a difference that would be
exactly zero in real arithmetic, derived from the standard model of floating
point: each operation, conversion or store returns ``x(1 + δ) + η`` with
``|δ| ≤ u`` (the unit roundoff, ``finfo(dtype).eps / 2``) and ``|η| ≤ tiny / 2``
(``tiny`` = the smallest subnormal; ``η`` only appears when the result is
subnormal, and never for additions). A bound is a sum of terms ``n·u·M`` where
``M`` is the magnitude of a quantity the rule adds, multiplies or divides and
``n`` counts the roundings that quantity goes through, plus absolute terms in
``tiny`` for underflow.

Counts cover the worse of the two ways an honest client may evaluate its rule:

- (R) in float64 registers from the exact inputs, then one store per uploaded
  array into the upload's dtype (the kernels of :mod:`rfrs_ref.kernels.optim`
  and the NumPy oracle followed by a cast), and
- (A) every operation in the upload's dtype, with the gradient and every
  hyperparameter (β, 1 − β, η, ηₜ, ε) first rounded to that dtype (plain NumPy
  expressions on float32 arrays).

and the server's own float64 evaluation of the check (every server operation
counted with the same ``u``, which is at least the float64 unit roundoff).
The scalars ηₜ and 1 − β are computed once in float64 (a client that computes
β₂ᵗ in float32 at round t accumulates about t roundings and is outside the
model). Magnitudes are taken from the upload and the state as the server sees
them; they differ from the exact ones by O(u) relative, a second-order effect
that the safety factor ``VERIFY_SAFETY`` covers, together with operation
orders that add a rounding or two.

Notation (per coordinate): ``θ̄, m̄, v̄, r̄`` the server state, ``m, v, r, θ``
the upload, ``ĝ`` the recovered gradient, ``c₁ = 1 − β₁``, ``c₂ = 1 − β₂``,
``s = √v + ε`` (or ``√r + ε``), ``w`` the magnitude of the step taken from θ̄.
The derivation of each count is in docs/optimizers.md ("Verification").

The functions are elementwise and written for NumPy arrays and for scalars
alike (with divisions by loop-invariant scalars grouped so that a compiler
hoists them, since division dominates the kernels' cost): the oracle calls them on arrays, the Numba kernels compile them and call
them per coordinate (Numba's cache does not track this module: after changing
a count, delete the kernels' ``__pycache__`` so they are recompiled).
"""

from __future__ import annotations

import numpy as np

#: Safety factor applied to every derived bound by verification (and by the
#: tests of recovery): it covers magnitudes read from the rounded upload
#: instead of the exact ones (second order in u) and evaluation orders with a
#: rounding or two more than counted. The counts alone are true first-order
#: bounds: the test suite checks honest uploads against them with safety 1.
VERIFY_SAFETY = 4.0


def roundoff(*dtypes) -> tuple[float, float]:
    """(u, tiny) of the widest rounding among ``dtypes``: the largest unit
    roundoff ``eps/2`` and the largest smallest-subnormal. Non-float dtypes
    count as float64."""
    u, tiny = 0.0, 0.0
    for dt in dtypes:
        dt = np.dtype(dt)
        fi = np.finfo(dt if np.issubdtype(dt, np.floating) else np.float64)
        u = max(u, float(fi.eps) / 2.0)
        tiny = max(tiny, float(fi.smallest_subnormal))
    return u, tiny


# -- recovery: bound on |ĝ − g| ------------------------------------------------------

def sgd_recovery_bound(theta_bar, g_hat, lr, u, tiny):
    """|ĝ − g| for ĝ = (θ̄ − θ)/η.

    The client's θ carries ≤ u(2|θ̄| + 4w) (w = η|g|: η·g, the subtraction and
    the store, or g, η, product, subtraction in the dtype); dividing by η turns
    it into u(2|θ̄|/η + 4|g|); the server's subtraction, division and the store
    of ĝ add 3u|ĝ|.
    """
    return u * ((2.0 / lr) * np.abs(theta_bar) + 7.0 * np.abs(g_hat)) + tiny * (2.0 / lr + 2.0)


def momentum_recovery_bound(m_bar, g_hat, beta3, u, tiny):
    """|ĝ − g| for ĝ = m − β₃m̄.

    m = β₃m̄ + g carries ≤ 4u(β₃|m̄| + |g|) (β₃, g, product, sum, store); the
    server's product, subtraction and store add u(β₃|m̄| + 2|ĝ|).
    """
    return u * (5.0 * beta3 * np.abs(m_bar) + 6.0 * np.abs(g_hat)) + 3.0 * tiny


def adam_recovery_bound(m_bar, g_hat, beta1, u, tiny):
    """|ĝ − g| for ĝ = (m − β₁m̄)/(1 − β₁).

    m = β₁m̄ + c₁g carries ≤ 5u(β₁|m̄| + c₁|g|) (g, β₁, c₁ twice, products,
    sum, store); the server's product and subtraction add u(β₁|m̄| + c₁|ĝ|),
    and dividing by c₁ (itself rounded), then storing ĝ, adds 3u|ĝ| (the
    verification kernel multiplies by 1/c₁ instead and does not store ĝ: the
    same count). The
    cancellation in m − β₁m̄ is why the bound grows with β₁|m̄|/c₁.
    """
    c1 = 1.0 - beta1
    return u * ((6.0 * beta1 / c1) * np.abs(m_bar) + 9.0 * np.abs(g_hat)) + tiny * (3.0 / c1 + 2.0)


def root_recovery_bound(theta_bar, r, g_hat, lr, eps, u, tiny):
    """|ĝ − g| for ĝ = (θ̄ − θ)(√r + ε)/η (AdaGrad, RMSProp).

    The client's θ = θ̄ − ηg/s carries ≤ u(2|θ̄| + 8w), w = η|g|/s (√, +ε,
    ÷, ·η, the register r against the stored r, the subtraction and the store;
    or g, ε, η rounded first); multiplying by s/η turns it into
    u(2|θ̄|s/η + 8|g|); the server's subtraction, √, +ε, product, division and
    store add 6u|ĝ|. Underflow: the product η·g (or d·s on the server) loses up
    to tiny/2 before a division, which recovery scales by 1/η; θ's store, the
    division and the product after it lose tiny/2 each, scaled by s/η; an
    underflowing store of r moves √r by at most √(tiny/2), so the step by a
    relative √tiny/s ≤ √tiny/ε (the constant keeps a division out of the loop).
    """
    s = np.sqrt(r) + eps
    return (u * ((2.0 / lr) * np.abs(theta_bar) * s + 14.0 * np.abs(g_hat))
            + tiny * (2.0 + s + (2.0 / lr) * (1.0 + s)) + (np.sqrt(tiny) / eps) * np.abs(g_hat))


# -- verification residual bounds ----------------------------------------------------

def second_moment_bound(x, x_bar, g_hat, b_g, decay, coef, u, tiny):
    """|x − decay·x̄ − coef·ĝ²| for an honest x = decay·x̄ + coef·g² (Adam's v with
    (β₂, 1 − β₂), RMSProp's r with (β₄, 1 − β₄), AdaGrad's r with (1, 1)).

    The client's x carries ≤ 7u·x (g rounded: 2 on g², the square, the
    coefficient twice, the product, β·x̄, the sum and the store; all terms are
    non-negative, so the bound is relative to x itself). The server's float64
    residual adds ≤ 3u(x + decay·x̄ + coef·ĝ²). Using ĝ for the unknown g adds
    coef·|ĝ² − g²| ≤ coef·B(2|ĝ| + B) with B the recovery bound.
    """
    return (u * (10.0 * x + 3.0 * decay * x_bar + 3.0 * coef * g_hat * g_hat)
            + coef * b_g * (2.0 * np.abs(g_hat) + b_g) + 6.0 * tiny)


def momentum_theta_bound(theta_bar, m, lr, u, tiny):
    """|θ − (θ̄ − ηm)| for an honest momentum upload, m as uploaded.

    With w = η|m|: the client's register m against the stored one, η·m, the
    subtraction and the store (or η rounded, product, subtraction) give
    ≤ u(2|θ̄| + 4w); the server's product and subtraction add u(|θ̄| + 2w).
    """
    w = lr * np.abs(m)
    return u * (3.0 * np.abs(theta_bar) + 6.0 * w) + (3.0 + lr) * tiny


def adam_theta_bound(theta_bar, m, v, lr_t, eps, u, tiny):
    """|θ − (θ̄ − ηₜ m/(√v + ε))| for an honest Adam upload, m and v as uploaded.

    With s = √v + ε and w = ηₜ|m|/s: the client's register m and v against the
    stored ones (1 + ½), √, +ε, ÷, ·ηₜ, the subtraction and the store
    (≤ u(2|θ̄| + 7.5w)); the server's √, +ε, ÷ (or 1/s and a product, as the
    kernel does), ·ηₜ and subtraction (≤ u(|θ̄| + 6w)). Underflow: the stores of m and v move the step by at most
    ηₜ·tiny/(2s) and w·√(tiny/2)/s; an underflowing quotient m/s loses ηₜ·tiny/2
    (client and server), a product ηₜ·m taken before the division tiny/(2s),
    the last product and θ's store tiny/2 each.
    """
    inv_s = 1.0 / (np.sqrt(v) + eps)
    w = lr_t * np.abs(m) * inv_s
    return (u * (3.0 * np.abs(theta_bar) + 14.0 * w) + tiny * ((1.0 + lr_t) * inv_s + lr_t + 5.0)
            + w * np.sqrt(tiny) * inv_s)
