"""Optimal IPM and ALIE: the attack factor chosen by a line search against the server's rule.

ByzFL's ``Optimal_InnerProductManipulation`` and ``Optimal_ALittleIsEnough``
(used by Allouah et al. 2023): the Byzantine clients simulate the server's
aggregation of the round for a candidate factor τ and keep the τ whose
aggregate lands farthest from the honest clients' average. The search is
ByzFL's, step for step (:func:`line_search`).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Callable, ClassVar

import numpy as np

from rfrs_ref.attack.base import Attack, AttackContext
from rfrs_ref.params import hyper


def line_search(objective: Callable[[float], float], evals: int = 20, start: float = 0.0,
                delta: float = 10.0, ratio: float = 0.8) -> tuple[float, float, int]:
    """ByzFL's expansion–contraction search for the τ that maximises ``objective``.

    Expansion: x = start; while evaluations remain, try x + δ: if it is better
    (strictly greater), move there and double δ; otherwise multiply δ by
    ``ratio`` and stop. Contraction: while evaluations remain, try x + δ, move
    there if strictly better, and multiply δ by ``ratio`` in either case. At most
    ``evals`` evaluations, the first at ``start``.

    Hostile values: a NaN objective is never better (every comparison with NaN
    is false), so a τ whose aggregate is NaN is never chosen over a finite one;
    +inf is better than any finite value (the attack has reached its goal).

    Guarantee: the same sequence of trial points and the same answer as
    ByzFL 0.0.11's ``_expansion_phase`` and ``_contraction_phase`` for the
    same objective values. Note the search only moves in δ's direction
    (positive δ: τ ≥ start).

    Returns:
        (best τ, its objective, the number of evaluations made).

    Preconditions: evals ≥ 1, δ ≠ 0 and finite, start finite, 0.5 < ratio < 1.
    """
    check_search(evals, start, delta, ratio)
    best_x = float(start)
    best_y = objective(best_x)
    used = 1
    d = float(delta)
    while used < evals:
        prop_x = best_x + d
        prop_y = objective(prop_x)
        used += 1
        if prop_y > best_y:
            best_x, best_y = prop_x, prop_y
            d *= 2
        else:
            d *= ratio
            break
    while used < evals:
        prop_x = best_x + d
        prop_y = objective(prop_x)
        used += 1
        if prop_y > best_y:
            best_x, best_y = prop_x, prop_y
        d *= ratio
    return best_x, best_y, used


def check_search(evals, start, delta, ratio) -> None:
    """ValueError naming the value unless the search's hyperparameters are valid."""
    if isinstance(evals, bool) or not isinstance(evals, int) or evals < 1:
        raise ValueError(f"the line search needs evals ≥ 1 (an integer), got evals={evals!r}")
    for name, v in (("start", start), ("delta", delta), ("ratio", ratio)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"the line search's {name} must be a finite number, got {name}={v!r}")
    if delta == 0:
        raise ValueError("the line search's step delta must be non-zero, got delta=0")
    if not 0.5 < ratio < 1:
        raise ValueError(f"the line search's contraction ratio must lie in (0.5, 1), got ratio={ratio!r}")


def mean_std(grads: np.ndarray, rows, ddof: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(μ, σ) of ``grads[rows]``, coordinate-wise, in float64 (NumPy oracle).

    μ sums the rows in their order, then divides by k; σ² = Σ(x − μ)²/(k − ddof)
    (two passes), σ = 0 when k ≤ ddof. The Numba kernel
    :func:`rfrs_ref.kernels.attacks.mean_std_rows` computes the same expressions in
    the same order (equal bit for bit).
    """
    G = np.asarray(grads)
    rows = np.asarray(rows, dtype=np.int64)
    k = rows.size
    if k == 0:
        raise ValueError("mean_std needs at least one gradient row")
    mu = np.zeros(G.shape[1])
    for r in rows:
        mu += G[r].astype(np.float64)
    mu /= k
    sd = np.zeros(G.shape[1])
    if k > ddof:
        for r in rows:
            d = G[r].astype(np.float64) - mu
            sd += d * d
        sd = np.sqrt(sd / (k - ddof))
    return mu, sd


@dataclasses.dataclass(frozen=True)
class _Optimal(Attack):
    """The search and the simulated server shared by ``opt-ipm`` and ``opt-alie``."""

    evals: int = hyper(20, "line search: the most evaluations of the simulated aggregation per round")
    start: float = hyper(0.0, "line search: the first attack factor τ tried")
    delta: float = hyper(10.0, "line search: the first step of τ (non-zero)")
    ratio: float = hyper(0.8, "line search: the contraction of the step, in (0.5, 1)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_search(self.evals, self.start, self.delta, self.ratio)

    @abc.abstractmethod
    def _direction(self, mu: np.ndarray, sd: np.ndarray, tau: float, out: np.ndarray) -> None:
        """The malicious gradient for factor τ, in float64, into ``out``."""

    _needs_sd: ClassVar[bool] = True

    def apply_inplace(self, ctx: AttackContext) -> dict:
        byz = ctx.byzantine_rows()
        if byz.size == 0:
            return {}
        rule = ctx.rule
        if rule is None:
            raise ValueError(f"attack {self.name!r} tunes itself against the server's rule, but "
                             "the attack context has rule=None: pass the run's rule")
        honest = np.flatnonzero(~np.asarray(ctx.byzantine)).astype(np.int64)
        if honest.size == 0:
            return {"tau": None, "objective": None, "evals": 0,
                    "reason": "no honest client in the round: nothing to aim at"}
        G, U, state, opt, t = ctx.grads, ctx.uploads, ctx.state, ctx.optimizer, ctx.t
        n, D = G.shape
        mu = ctx.scratch("opt_mu", (D,), np.float64)
        sd = ctx.scratch("opt_sd", (D,), np.float64)
        ddof = 1 if self._needs_sd else 0
        if ctx.kernel_backend() == "numpy":
            mu[:], sd[:] = mean_std(G, honest, ddof)
        else:
            from rfrs_ref.kernels.attacks import mean_std_rows

            mean_std_rows(G, honest, ddof, mu, sd)

        theta = U["theta"]
        theta_bar = np.asarray(state["theta"])
        w = np.asarray(ctx.n_samples, dtype=np.float64)[honest]
        # the aggregate FedAvg would give without the Byzantine clients: the point to move away from
        ref = (w / w.sum()) @ theta[honest].astype(np.float64)

        uses_features = getattr(rule, "uses_features", True)
        gradient_space = ctx.detect == "gradient" and uses_features
        if gradient_space:
            X = ctx.scratch("opt_features", (n, D), theta.dtype)
            opt.recover_batch(state, U, t, X, ctx.backend, rows=honest)
        elif uses_features:
            X = ctx.scratch("opt_features", (n, D), theta.dtype)
            X[honest] = theta[honest] - theta_bar
        else:
            X = theta  # the round hands such a rule the θ uploads as its features
        # the server's other inputs to the rule, as the round passes them: its state to
        # pre-aggregators (clipping around θ̄) and to a rule with state; the server's
        # random choices (bucketing) are not known, so the simulation draws its own, the
        # same for every τ (one seed per round from the attack's generator)
        sim_seed = None
        if getattr(rule, "takes_round_inputs", False):
            sim_seed = int(ctx.rng.integers(2**63))
        rule_state = {k: state[k] for k in getattr(rule, "state_arrays", ())}

        def rule_inputs() -> dict:
            kw = {}
            if sim_seed is not None:
                kw = dict(reference=state, rng=np.random.default_rng(sim_seed))
            if rule_state:
                kw["rule_state"] = rule_state
            return kw

        g64 = ctx.scratch("opt_g64", (D,), np.float64)
        g = ctx.scratch("opt_g", (1, D), G.dtype)
        lead = byz[:1]

        def upload(tau: float) -> None:
            self._direction(mu, sd, tau, g64)
            with np.errstate(over="ignore", invalid="ignore"):
                g[0] = g64
            opt.client_rule_batch(state, g, t, U, ctx.backend, rows=lead)
            for A in U.values():
                A[byz[1:]] = A[byz[0]]

        def objective(tau: float) -> float:
            upload(tau)
            if gradient_space:
                opt.recover_batch(state, U, t, X, ctx.backend, rows=lead)
                X[byz[1:]] = X[byz[0]]
            elif uses_features:
                X[byz] = theta[byz] - theta_bar
            res = rule.aggregate(X, U, ctx.n_samples, ctx.f, backend=ctx.backend, **rule_inputs())
            with np.errstate(over="ignore", invalid="ignore"):
                return float(np.linalg.norm(res.arrays["theta"].astype(np.float64) - ref))

        with np.errstate(over="ignore", invalid="ignore"):
            tau, y, used = line_search(objective, self.evals, float(self.start),
                                       float(self.delta), float(self.ratio))
            upload(tau)
        return {"tau": tau, "objective": y if math.isfinite(y) else str(y), "evals": used,
                "statistic_rows": int(honest.size)}


@dataclasses.dataclass(frozen=True)
class OptimalIPM(_Optimal):
    """Optimal inner-product manipulation: −τ·μ with τ chosen against the server's rule.

    μ is the mean of the round's honest clients' gradients (ByzFL's convention:
    the attack reads the honest vectors); every Byzantine client uploads
    rule(state, −τ·μ, t) for the τ that :func:`line_search` finds to maximise

        J(τ) = ‖θ̄_rule(τ) − Σ_{i honest} nᵢθᵢ / Σ_{i honest} nᵢ‖₂,

    θ̄_rule(τ) being the θ the server's rule (with its detection space, its
    weights nᵢ and the server's f) aggregates from the round's honest uploads
    and the Byzantine uploads for τ: the attackers simulate the server's round
    exactly (verification included: their uploads obey the rule), with the
    rule's pre-aggregators and its state, but not the server's random choices:
    bucketing is simulated with a permutation of the attackers' own, one per
    round, the same for every τ.

    Conventions against ByzFL 0.0.11: ByzFL measures ‖agg − mean‖ on the
    gradients, with an unweighted mean and a ``Clipping`` pre-aggregation by
    default; here the measure is on the θ the round produces (for SGD,
    θᵢ = θ̄ − ηgᵢ, the same distance times η), the reference is weighted by
    nᵢ as every rule weighs, and the rule is the run's (no extra
    pre-aggregation). With equal nᵢ, SGD, and the same rule, the τ chosen and
    the uploaded gradient are ByzFL's (tests/attack/test_byzfl.py).

    Cost: ``evals`` aggregations of the round per round (the rule's time times
    up to 20 by default), plus one pass for μ.

    Hostile input: non-finite honest gradients give a non-finite μ; the search
    never prefers a NaN objective; a round without honest clients uploads
    honestly (``reason`` in the diagnostics). Diagnostics: ``tau``,
    ``objective``, ``evals``, ``statistic_rows``.

    References: C. Xie, O. Koyejo, I. Gupta, "Fall of Empires", UAI 2019;
    Y. Allouah et al., "Fixing by Mixing", AISTATS 2023; ByzFL 0.0.11
    ``Optimal_InnerProductManipulation``.

    Preconditions: evals ≥ 1, delta ≠ 0, 0.5 < ratio < 1, all finite; the
    round's rule is in the attack context.
    """

    name: ClassVar[str] = "opt-ipm"
    _needs_sd: ClassVar[bool] = False

    def _direction(self, mu, sd, tau, out):
        np.multiply(mu, -tau, out=out)


@dataclasses.dataclass(frozen=True)
class OptimalALIE(_Optimal):
    """Optimal "a little is enough": μ + τ·σ with τ chosen against the server's rule.

    μ and σ are the coordinate-wise mean and sample standard deviation
    (ddof = 1) of the round's honest clients' gradients (ByzFL's convention);
    every Byzantine client uploads rule(state, μ + τ·σ, t) for the τ that
    :func:`line_search` finds to maximise the same J(τ) as ``opt-ipm`` (the
    distance of the rule's θ from the honest clients' nᵢ-weighted mean θ).

    Sign: ByzFL writes ALIE as μ + τσ and searches from τ = 0 upwards; the
    ``alie`` attack writes μ − zσ, so τ = −z. With a single honest client σ = 0
    and every τ gives the same upload (the search keeps τ = start).

    Conventions against ByzFL 0.0.11, cost, hostile input and diagnostics: as
    ``opt-ipm``.

    References: M. Baruch, G. Baruch, Y. Goldberg, "A Little Is Enough",
    NeurIPS 2019; Y. Allouah et al., "Fixing by Mixing", AISTATS 2023; ByzFL
    0.0.11 ``Optimal_ALittleIsEnough``.

    Preconditions: as ``opt-ipm``.
    """

    name: ClassVar[str] = "opt-alie"

    def _direction(self, mu, sd, tau, out):
        np.multiply(sd, tau, out=out)
        np.add(mu, out, out=out)
