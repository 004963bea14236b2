"""The camouflage attack (paper §4.1, Eq. 6 and appendix F; docs/attacks.md).

Under Adam the update of one coordinate depends on the gradient g only through

    u(g) = (β₁m̄ + (1 − β₁)g) / (√(β₂v̄ + (1 − β₂)g²) + ε),     θ = θ̄ − ηₜ·u(g),

which is not one-to-one: a Byzantine client can often find g̃ ≠ g with
u(g̃) = u(g), upload the m and v of g̃ and the θ of g, and obey the rule. Its
θ is then its honest θ while its recovered gradient, first and second moments
are not, so a defence that looks at θ alone cannot see it.

Analysis (a = β₁m̄, b = β₂v̄ ≥ 0, c₁ = 1 − β₁, c₂ = 1 − β₂; ε = 0 first). u
tends to ±c₁/√c₂ as g → ±∞ and has one extremum, at g* = c₁b/(c₂a), on the
side of a's sign; a value of u has a second preimage only where it lies beyond
the asymptote on that side (|u| > c₁/√c₂, which happens on a's side only).
Squaring u(g̃) = u(g) gives a
quadratic in g̃ with roots g and the paper's Eq. 6,

    g̃ = (2c₁ab + c₁²bg − c₂a²g) / den,    den = c₂a² + 2c₁c₂ag − c₁²b,

and den > 0 ⟺ u(g)² > c₁²/c₂: Eq. 6 gives the same update exactly where
den > 0, and the negated update, u(g̃) = −u(g), elsewhere (den < 0). den = 0 is
the asymptote itself (g̃ = ∞). At t = 1 (m̄ = v̄ = 0) and wherever m̄ = 0, u is
monotone and nothing can be camouflaged.

ε. The paper's derivation drops ε, so Eq. 6 makes u₀ = m/√v equal, not the
u with ε that clients run; the two differ by the factor √v/(√v + ε), which
moves θ by far more than rounding wherever √v is within a few orders of ε.
The equation with ε is solved exactly by the same formula with a replaced by

    a' = a − ε·u(g):

indeed a + c₁g = u(g)(√v + ε) means a' + c₁g = u(g)·√v, so g is a preimage
of u(g) under the ε-free map built on a', whose other preimage (Eq. 6 with a')
then satisfies a + c₁g̃ = u(g)(√ṽ + ε). ``include_eps=False`` uses the paper's
Eq. 6 as written (a' = a).

Decision per coordinate, in float64: g̃ is used when den > 0, g̃ rounded to
the gradient dtype is finite and differs from g, its second moment b + c₂g̃²
fits the upload dtype, and its step ηₜ·u(g̃) is within
``THETA_TOLERANCE``·u_d·(|θ̄| + |ηₜu(g)|) of the honest step (u_d the unit
roundoff of the upload dtype), so that the stored θ is within
(``THETA_TOLERANCE`` + 2)·u_d·(|θ̄| + |ηₜu(g)|) of the honest θ, a few units in
its last place. Otherwise the coordinate keeps g. The test on the step, not
on den alone, is what makes the choice robust to the cancellation in den near
the asymptote, to float32 storage, to v̄ = 0 (den = c₂a'(a' + 2c₁g)) and to
the ε-free formula: they can only make a coordinate fall back to g.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from rfrs_ref.attack.base import Attack, AttackContext
from rfrs_ref.params import hyper

#: The camouflaged step must match the honest step to this many unit roundoffs
#: of the upload dtype, relative to |θ̄| + |step|. In float64 the rounding of
#: g̃ itself moves the step by an ulp or two where u is steep; 4 keeps those
#: coordinates while θ stays within a few ulps of the honest θ.
THETA_TOLERANCE = 4.0


def adam_direction(m_bar, v_bar, g, beta1: float, beta2: float, eps: float) -> np.ndarray:
    """u(g) = (β₁m̄ + (1 − β₁)g)/(√(β₂v̄ + (1 − β₂)g²) + ε), float64 (θ = θ̄ − ηₜ·u)."""
    mb, vb, g = (np.asarray(x, dtype=np.float64) for x in (m_bar, v_bar, g))
    m = beta1 * mb + (1.0 - beta1) * g
    v = beta2 * vb + (1.0 - beta2) * (g * g)
    return m / (np.sqrt(v) + eps)


def eq6_denominator(m_bar, v_bar, g, beta1: float, beta2: float, eps: float = 0.0) -> np.ndarray:
    """den = c₂a'² + 2c₁c₂a'g − c₁²b of Eq. 6 (a' = β₁m̄ − ε·u(g), b = β₂v̄), float64.

    den > 0 exactly where a second gradient with the same update exists (in
    exact arithmetic; ``eps=0`` is the paper's ε-free analysis).
    """
    mb, vb, g = (np.asarray(x, dtype=np.float64) for x in (m_bar, v_bar, g))
    c1, c2 = 1.0 - beta1, 1.0 - beta2
    a, b = beta1 * mb, beta2 * vb
    a2 = a - eps * adam_direction(mb, vb, g, beta1, beta2, eps) if eps else a
    return c2 * (a2 * a2) + 2.0 * c1 * c2 * a2 * g - c1 * c1 * b


def camouflage_gradient(m_bar, v_bar, theta_bar, g, *, beta1: float, beta2: float, lr_t: float,
                        eps: float, include_eps: bool = True, dtype=None, upload_dtype=None):
    """The camouflaged gradient of one client, coordinate by coordinate (NumPy oracle).

    Args:
        m_bar, v_bar, theta_bar: the server state after round t − 1 (1-D, length D).
        g: the client's honest gradient (1-D, length D).
        beta1, beta2, eps: Adam's hyperparameters; lr_t: ηₜ of the round.
        include_eps: solve the same-update equation with ε (exact for the
            rule clients run); False: the paper's Eq. 6, which drops ε.
        dtype: the dtype g̃ is stored in before it goes through the rule;
            default: g's dtype if it is a float, else float64.
        upload_dtype: the dtype of the uploads (the unit roundoff of the θ
            check, the largest storable v); default: ``dtype``.

    Returns:
        ``(g_tilde, camouflaged)``: float64 g̃ (every value representable in
        ``dtype``; equal to g where not camouflaged) and the bool mask of the
        camouflaged coordinates. See the module docstring for the decision.

    Preconditions: the state is finite and v̄ ≥ 0 (the server's own); β₁, β₂ ∈
    [0, 1), ε ≥ 0, ηₜ > 0.
    """
    g_in = np.asarray(g)
    if dtype is None:
        dtype = g_in.dtype if np.issubdtype(g_in.dtype, np.floating) else np.float64
    dtype = np.dtype(dtype)
    fi = np.finfo(dtype if upload_dtype is None else np.dtype(upload_dtype))
    u, vmax = float(fi.eps) / 2.0, float(fi.max)
    mb, vb, tb, g = (np.asarray(x, dtype=np.float64) for x in (m_bar, v_bar, theta_bar, g_in))
    c1, c2 = 1.0 - beta1, 1.0 - beta2
    a, b = beta1 * mb, beta2 * vb
    with np.errstate(all="ignore"):
        h = (a + c1 * g) / (np.sqrt(b + c2 * (g * g)) + eps)  # the honest u(g)
        a2 = a - (eps if include_eps else 0.0) * h
        den = c2 * (a2 * a2) + 2.0 * c1 * c2 * a2 * g - c1 * c1 * b
        gt = (2.0 * c1 * a2 * b + c1 * c1 * b * g - c2 * (a2 * a2) * g) / den
        gr = gt.astype(dtype).astype(np.float64)
        vt = b + c2 * (gr * gr)
        step = lr_t * h
        st = lr_t * ((a + c1 * gr) / (np.sqrt(vt) + eps))
        ok = ((den > 0.0) & np.isfinite(gr) & (gr != g) & (vt <= vmax)
              & (np.abs(st - step) <= THETA_TOLERANCE * u * (np.abs(tb) + np.abs(step))))
    return np.where(ok, gr, g), ok


@dataclasses.dataclass(frozen=True)
class Camouflage(Attack):
    """Camouflage (paper §4.1, Eq. 6, appendix F): θ honest, m and v from g̃.

    Each Byzantine client computes, coordinate by coordinate, the gradient g̃
    of Eq. 6 (with ε included, see below) that gives the same Adam update as
    its honest gradient g, where one exists; elsewhere it keeps g. It pushes g̃
    through Adam's rule:

        m = β₁m̄ + (1 − β₁)g̃,  v = β₂v̄ + (1 − β₂)g̃²,  θ = θ̄ − ηₜ·m/(√v + ε),

    so the upload obeys the rule (it passes verification), its θ equals its
    honest θ to rounding, and the server recovers g̃ instead of g. Per
    coordinate only two gradients give the same update, so g̃ is also the one
    farthest from g (the paper's "largest Euclidean distance").

    Conventions: the per-coordinate decision and the ε correction are in the
    module docstring; ``include_eps=False`` is the paper's Eq. 6 verbatim
    (coordinates where the ε it ignores shows in θ keep g). Nothing is
    camouflaged in round 1 (m̄ = v̄ = 0, where the update is monotone in g).

    Diagnostics: ``camouflaged_fraction`` (over every Byzantine coordinate of
    the round), ``camouflaged_fraction_per_client`` and ``gradient_shift``
    (‖g̃ − g‖ per Byzantine client, in row order).

    Preconditions: the optimiser is Adam (:meth:`check_optimizer` says so
    before a run starts).

    Reference: Chen et al., "Robust Federated Recommendation System" (2020),
    §4.1 and appendix F.
    """

    include_eps: bool = hyper(True, "solve the same-update equation with Adam's ε (exact for "
                              "the rule clients run); false: the paper's Eq. 6, which drops ε")

    name: ClassVar[str] = "camouflage"
    per_client: ClassVar[bool] = True
    optimizers: ClassVar[tuple[str, ...] | None] = ("adam",)
    in_client_rule: ClassVar[bool] = True

    def _optimizer_reason(self) -> str:
        return (" (camouflage exploits Adam's normalised update m/(√v + ε), which several "
                "gradients share; the other optimisers' updates determine g)")

    def apply_inplace(self, ctx: AttackContext) -> dict:
        rows = ctx.byzantine_rows()
        G = ctx.grads
        S = ctx.scratch("grads", G.shape, G.dtype)[: rows.size]
        part = self._camouflage(ctx, G, rows, S)
        ctx.optimizer.client_rule_batch(ctx.state, S, ctx.t, ctx.uploads, ctx.backend, rows=rows)
        return self.merge_diagnostics([part], G.shape[1])

    def own_gradients_inplace(self, ctx: AttackContext, G: np.ndarray, rows: np.ndarray) -> dict:
        """Rows ``rows`` of ``G`` (honest gradients of Byzantine clients) become their
        camouflaged gradients g̃; returns the rows' camouflaged coordinate counts and
        squared shifts ‖g̃ − g‖² (``count``, ``shift2``), each row's computed on its own."""
        S = ctx.scratch("camouflaged", (rows.size, G.shape[1]), G.dtype)
        part = self._camouflage(ctx, G, rows, S)
        G[rows] = S
        return part

    def _camouflage(self, ctx: AttackContext, G: np.ndarray, rows: np.ndarray, S: np.ndarray) -> dict:
        """S[i] = the camouflaged gradient of G[rows[i]] (G is not modified); the rows'
        ``count`` and ``shift2`` as lists."""
        self.check_optimizer(ctx.optimizer)
        opt = ctx.optimizer
        k, D = rows.size, G.shape[1]
        if k == 0:
            return {"count": [], "shift2": []}
        lr_t = opt.step_size(ctx.t)
        # the narrowest upload dtype sets the rounding that θ must match to
        up_dtype = max((np.dtype(ctx.uploads[name].dtype) for name in opt.arrays),
                       key=lambda dt: np.finfo(dt).eps)
        u, vmax = float(np.finfo(up_dtype).eps) / 2.0, float(np.finfo(up_dtype).max)
        st = ctx.state
        if ctx.kernel_backend() == "numpy":
            count = np.zeros(k, dtype=np.int64)
            shift2 = np.zeros(k)
            for i, r in enumerate(rows):
                gt, ok = camouflage_gradient(
                    st["m"], st["v"], st["theta"], G[r], beta1=opt.beta1, beta2=opt.beta2,
                    lr_t=lr_t, eps=opt.eps, include_eps=self.include_eps, dtype=G.dtype,
                    upload_dtype=up_dtype)
                S[i] = gt
                count[i] = int(ok.sum())
                d = gt - np.asarray(G[r], dtype=np.float64)
                shift2[i] = float(d @ d)
        else:
            from rfrs_ref.kernels.attacks import camouflage_rows

            count, shift2 = camouflage_rows(
                np.asarray(st["m"]), np.asarray(st["v"]), np.asarray(st["theta"]), G,
                np.asarray(rows, dtype=np.int64),
                float(opt.beta1), 1.0 - opt.beta1, float(opt.beta2), 1.0 - opt.beta2, lr_t,
                float(opt.eps), float(opt.eps) if self.include_eps else 0.0,
                THETA_TOLERANCE * u, vmax, S)
        return {"count": np.asarray(count, dtype=np.int64).tolist(),
                "shift2": np.asarray(shift2, dtype=np.float64).tolist()}

    def merge_diagnostics(self, parts: list[dict], D: int) -> dict:
        count = np.array([c for p in parts for c in p["count"]], dtype=np.int64)
        shift2 = np.array([s for p in parts for s in p["shift2"]], dtype=np.float64)
        k = count.size
        if k == 0:
            return {"camouflaged_fraction": 0.0, "camouflaged_fraction_per_client": [],
                    "gradient_shift": []}
        return {
            "camouflaged_fraction": float(np.sum(count)) / (k * D),
            "camouflaged_fraction_per_client": (count.astype(np.float64) / D).tolist(),
            "gradient_shift": np.sqrt(shift2).tolist(),
        }
