"""Attacks of one client on its own upload: none, gradient ascent, additive noise."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

from rfrs_ref.attack.base import Attack, AttackContext
from rfrs_ref.params import hyper


@dataclasses.dataclass(frozen=True)
class NoAttack(Attack):
    """Byzantine clients upload honestly (the control of every experiment)."""

    name: ClassVar[str] = "none"
    per_client: ClassVar[bool] = True

    def apply_inplace(self, ctx: AttackContext) -> dict:
        return {}


@dataclasses.dataclass(frozen=True)
class Ascent(Attack):
    """Gradient ascent: the client applies its optimiser's rule to −g.

    With g its honest gradient, the upload is ``rule(state, −g, t)``; for
    Adam m = β₁m̄ − (1 − β₁)g, v = β₂v̄ + (1 − β₂)g² (unchanged) and
    θ = θ̄ − ηₜ·m/(√v + ε); for SGD θ = θ̄ + ηg. The upload obeys the rule, so
    it passes verification, and the server recovers −g.

    This is the attack of the paper's experiments (§5: "use −g to calculate
    m̃, ṽ and θ̃"), the gradient ascent attack of Blanchard et al. (2017).

    Diagnostics: none beyond the round record.

    Elementwise (g̃ = −g coordinate by coordinate): a round with the weighted mean
    computes the Byzantine uploads with the honest ones, a batch of clients at a
    time (docs/performance.md, "Attacked rounds that stream").
    """

    name: ClassVar[str] = "ascent"
    per_client: ClassVar[bool] = True
    in_client_rule: ClassVar[bool] = True
    elementwise: ClassVar[bool] = True
    shares_rows: ClassVar[bool] = True

    def own_gradient_inplace(self, g: np.ndarray) -> None:
        np.negative(g, out=g)

    def apply_inplace(self, ctx: AttackContext) -> dict:
        rows = ctx.byzantine_rows()
        if rows.size == 0:
            return {}
        G = ctx.grads
        S = ctx.scratch("grads", G.shape, G.dtype)[: rows.size]
        for i, r in enumerate(rows):
            S[i] = G[r]
        self.own_gradient_inplace(S)
        ctx.optimizer.client_rule_batch(ctx.state, S, ctx.t, ctx.uploads, ctx.backend, rows=rows)
        return {}


@dataclasses.dataclass(frozen=True)
class Noise(Attack):
    """Additive Gaussian noise on θ: the honest upload with θ + N(0, σ²) per coordinate.

    θ̃ = θ + σ·z, z ~ N(0, I_D); every other uploaded array (m, v, r) is the
    honest one. The noise is drawn from the round's attack generator, D
    float64 standard normals per Byzantine client in increasing row order
    (so float32 and float64 runs draw the same noise), added in float64 and
    rounded once to the upload's dtype.

    The upload breaks the update rule: for any stateful optimiser
    verification rejects it once σ is well above the rounding of θ (SGD's
    upload is θ alone and cannot be checked: there the server recovers
    g − σz/η). The paper tried this attack (Li et al. 2020) and found it weak.

    Diagnostics: ``sigma`` and ``noise_norm`` (‖σz‖ per Byzantine client).

    Preconditions: σ ≥ 0 and finite.
    """

    sigma: float = hyper(0.1, "standard deviation σ of the Gaussian noise added to θ")

    name: ClassVar[str] = "noise"
    per_client: ClassVar[bool] = True
    obeys_rule: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (isinstance(self.sigma, (int, float)) and math.isfinite(self.sigma)
                and self.sigma >= 0):
            raise ValueError(f"noise sigma must be a finite number ≥ 0, got sigma={self.sigma!r}")

    def apply_inplace(self, ctx: AttackContext) -> dict:
        rows = ctx.byzantine_rows()
        theta = ctx.uploads["theta"]
        D = theta.shape[1]
        z = ctx.scratch("noise", (D,), np.float64)
        norms = []
        # a huge σ overflows the upload to ±inf in its dtype: that is the attack (a hostile
        # upload the server must survive), not an error to warn about
        with np.errstate(over="ignore", invalid="ignore"):
            for r in rows:
                ctx.rng.standard_normal(out=z)
                np.multiply(z, float(self.sigma), out=z)
                norms.append(float(np.linalg.norm(z)))
                np.add(theta[r], z, out=theta[r], casting="same_kind")
        return {"sigma": float(self.sigma), "noise_norm": norms}
