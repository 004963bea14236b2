"""Colluding attacks: "a little is enough" (ALIE) and inner-product manipulation (IPM).

The Byzantine clients of a round pool their honest gradients (or, in the
omniscient variants, every sampled client's honest gradient), compute one
malicious gradient together, and each pushes it through the optimiser's rule,
so every Byzantine upload of the round is the same and obeys the rule.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import ClassVar

import numpy as np

from rfrs_ref.attack.base import Attack, AttackContext
from rfrs_ref.params import hyper


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s z_max for n workers of which f are Byzantine.

    s = ⌊n/2 + 1⌋ − f is the number of honest workers the attackers need on
    their side for a majority; z = Φ⁻¹((n − s)/n), Φ the standard normal CDF.
    Conventions where the formula leaves its domain: s is at least 1 (with f
    ≥ ⌊n/2 + 1⌋ the attackers already hold a majority), and the probability is
    at least 1/2 (z ≥ 0; n = 1 and n = 2 give z = 0).

    Preconditions: n ≥ 1, 0 ≤ f ≤ n.
    """
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise ValueError(f"ALIE needs n ≥ 1 clients, got n={n!r}")
    if not (isinstance(f, (int, np.integer)) and 0 <= f <= n):
        raise ValueError(f"ALIE needs 0 ≤ f ≤ n Byzantine clients, got f={f!r} with n={n}")
    s = max(1, math.floor(n / 2 + 1) - int(f))
    p = max(0.5, (n - s) / n)
    return float(statistics.NormalDist().inv_cdf(p))


def alie_gradient(grads: np.ndarray, rows, z: float, ddof: int = 1) -> np.ndarray:
    """μ − z·σ of ``grads[rows]``, coordinate-wise (NumPy float64 oracle).

    μ is the mean and σ the standard deviation with ``ddof`` (σ² = Σ(x − μ)²
    / (k − ddof) over the k rows); σ = 0 when k ≤ ddof (one client).
    """
    X = np.asarray(grads)[np.asarray(rows, dtype=np.int64)].astype(np.float64)
    k = X.shape[0]
    if k == 0:
        raise ValueError("ALIE needs at least one gradient row")
    mu = X.mean(axis=0)
    if k <= ddof:
        return mu
    return mu - z * X.std(axis=0, ddof=ddof)


def ipm_gradient(grads: np.ndarray, rows, epsilon: float) -> np.ndarray:
    """−ϵ · mean of ``grads[rows]`` (NumPy float64 oracle)."""
    X = np.asarray(grads)[np.asarray(rows, dtype=np.int64)].astype(np.float64)
    if X.shape[0] == 0:
        raise ValueError("IPM needs at least one gradient row")
    return -epsilon * X.mean(axis=0)


def _statistic_rows(ctx: AttackContext, byz_rows: np.ndarray, omniscient: bool) -> np.ndarray:
    return np.arange(ctx.grads.shape[0], dtype=np.int64) if omniscient else byz_rows


def _upload_one_gradient(ctx: AttackContext, rows: np.ndarray, g_row: np.ndarray) -> None:
    """Every Byzantine row uploads rule(state, g_row, t)."""
    opt = ctx.optimizer
    opt.client_rule_batch(ctx.state, g_row[None, :], ctx.t, ctx.uploads, ctx.backend,
                          rows=rows[:1])
    if rows.size > 1:
        for name in opt.arrays:
            U = ctx.uploads[name]
            U[rows[1:]] = U[rows[0]]


def _check_finite(name: str, value) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ALIE(Attack):
    """"A little is enough" (Baruch et al. 2019): μ − z·σ through the rule.

    The Byzantine clients of the round compute, coordinate by coordinate, the
    mean μ and standard deviation σ of their honest gradients (``omniscient``:
    of every sampled client's), and each uploads rule(state, μ − z·σ, t). The
    shift stays within the honest spread at every coordinate, so distance-based
    rules (Krum) and coordinate-wise rules (trimmed mean, median) keep it,
    while every coordinate is pushed the same way.

    z (unless given): Baruch et al.'s z_max (:func:`alie_z`) with n the number
    of sampled clients of the round (the clients the server aggregates over)
    and f the number of Byzantine clients among them: they collude, so they
    know how many they are (the server's assumed f is its guess, not theirs).

    σ: the sample standard deviation (ddof = 1, as ``torch.std`` in the
    reference implementations); ``ddof=0`` gives the population one. With one
    Byzantine client (non-omniscient), or one sampled client, σ = 0 and the
    upload is its honest one.

    Diagnostics: ``z``, ``n``, ``f`` (the values used), ``statistic_rows`` (how
    many gradients μ and σ were computed over).

    Reference: M. Baruch, G. Baruch, Y. Goldberg, "A Little Is Enough:
    Circumventing Defenses For Distributed Learning", NeurIPS 2019.
    """

    z: float = hyper(0.0, "ALIE shift z in μ − z·σ; 0 derives z_max from the round's n and "
                     "Byzantine count (Baruch et al.)")
    ddof: int = hyper(1, "ALIE: delta degrees of freedom of σ (1: sample, 0: population)")
    omniscient: bool = hyper(False, "ALIE: estimate μ and σ from every sampled client's "
                             "honest gradient, not only the Byzantine clients' own")

    name: ClassVar[str] = "alie"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_finite("ALIE z", self.z)
        if not (isinstance(self.ddof, int) and self.ddof in (0, 1)):
            raise ValueError(f"ALIE ddof must be 0 or 1, got ddof={self.ddof!r}")

    def apply_inplace(self, ctx: AttackContext) -> dict:
        byz = ctx.byzantine_rows()
        if byz.size == 0:
            return {}
        G = ctx.grads
        n, D = G.shape
        stat = _statistic_rows(ctx, byz, self.omniscient)
        z = float(self.z) if self.z != 0 else alie_z(n, int(byz.size))
        g = ctx.scratch("row", (D,), G.dtype)
        if ctx.kernel_backend() == "numpy":
            g[:] = alie_gradient(G, stat, z, self.ddof)
        else:
            from rfrs_ref.kernels.attacks import alie_row

            alie_row(G, stat, z, int(self.ddof), g)
        _upload_one_gradient(ctx, byz, g)
        return {"z": z, "n": int(n), "f": int(byz.size), "statistic_rows": int(stat.size)}


@dataclasses.dataclass(frozen=True)
class IPM(Attack):
    """Inner-product manipulation (Xie et al. 2019): −ϵ · mean gradient, through the rule.

    The Byzantine clients of the round average their honest gradients
    (``omniscient``: every sampled client's) and each uploads
    rule(state, −ϵ·ḡ, t). For small ϵ the malicious gradient is close to the
    origin, hence close to every honest gradient when their spread is large
    compared with their mean, so Krum (which keeps the points with the
    closest neighbours) readily selects it and the aggregate's inner product
    with the true gradient shrinks or turns negative.

    Default ϵ = 0.1: a small ϵ, the regime in which Xie et al. show that Krum
    prefers the attack. Against the mean, ϵ must be large: with k Byzantine
    clients among n (equal weights, gradients with a common mean ḡ), the
    aggregate is ((n − k) − kϵ)·ḡ/n, reversed only once ϵ > (n − k)/k.

    Diagnostics: ``epsilon``, ``statistic_rows``.

    Reference: C. Xie, O. Koyejo, I. Gupta, "Fall of Empires: Breaking
    Byzantine-tolerant SGD by Inner Product Manipulation", UAI 2019.
    """

    epsilon: float = hyper(0.1, "IPM: scale ϵ of the uploaded gradient −ϵ·mean")
    omniscient: bool = hyper(False, "IPM: average every sampled client's honest gradient, "
                             "not only the Byzantine clients' own")

    name: ClassVar[str] = "ipm"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_finite("IPM epsilon", self.epsilon)

    def apply_inplace(self, ctx: AttackContext) -> dict:
        byz = ctx.byzantine_rows()
        if byz.size == 0:
            return {}
        G = ctx.grads
        D = G.shape[1]
        stat = _statistic_rows(ctx, byz, self.omniscient)
        g = ctx.scratch("row", (D,), G.dtype)
        if ctx.kernel_backend() == "numpy":
            g[:] = ipm_gradient(G, stat, float(self.epsilon))
        else:
            from rfrs_ref.kernels.attacks import scaled_mean_row

            scaled_mean_row(G, stat, -float(self.epsilon), g)
        _upload_one_gradient(ctx, byz, g)
        return {"epsilon": float(self.epsilon), "statistic_rows": int(stat.size)}
