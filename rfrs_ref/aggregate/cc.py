"""``cc``: centered clipping around the previous round's aggregate (a rule with state)."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Mapping

import numpy as np
from numba import njit, prange

from rfrs_ref.aggregate.base import (
    AggregationResult, FiniteUploads, Rule, jsonable, validate_inputs,
)
from rfrs_ref.aggregate.combine import finite_clients
from rfrs_ref.kernels.distances import as_float_matrix
from rfrs_ref.kernels.weiszfeld import DBL_MAX, _scaled_distance, distances_to_numpy
from rfrs_ref.params import hyper, values


# ``reassoc`` vectorises the sum of squares (rounding differs from the oracle's order);
# it does not touch inf or NaN (no ``nnan``/``ninf``)
@njit(cache=True, fastmath={"reassoc", "contract"})
def _sq_dist(x, z):
    s = 0.0
    for k in range(x.shape[0]):
        d = z[k] - np.float64(x[k])
        s += d * d
    return s


@njit(cache=True, parallel=True)
def _distances_to_numba(X, z, out):
    n, D = X.shape
    for i in prange(n):
        s = _sq_dist(X[i], z)
        out[i] = math.sqrt(s) if s <= DBL_MAX else _scaled_distance(X[i], z)


def distances_to(X: np.ndarray, z: np.ndarray, backend: str = "numba") -> np.ndarray:
    """‖xᵢ − z‖ in float64, +inf for a non-finite row, never NaN (one pass;
    the oracle is :func:`rfrs_ref.kernels.weiszfeld.distances_to_numpy`)."""
    if backend == "numpy":
        return distances_to_numpy(X, z)
    M = as_float_matrix(X, "X")
    out = np.empty(M.shape[0])
    _distances_to_numba(M, np.ascontiguousarray(z, dtype=np.float64), out)
    return out


@dataclasses.dataclass(frozen=True)
class CenteredClipping(Rule):
    r"""Centered clipping (Karimireddy, He, Jaggi 2021), on the detection
    features, around the previous round's aggregate.

    Formula: from the centre v₀ (the previous round's aggregate of the
    features; 0 in the first round), L iterations of

        v ← v + Σᵢ pᵢ · clip_τ(xᵢ − v),   clip_τ(z) = z · min(1, τ/‖z‖),

    pᵢ = nᵢ/Σⱼ nⱼ. The result is v_L = a·v₀ + Σᵢ wᵢ xᵢ with a, wᵢ ≥ 0,
    a + Σ wᵢ = 1 (each iteration is v ← (1 − s)v + Σ pᵢcᵢxᵢ, cᵢ the clip
    factor, s = Σ pᵢcᵢ), and every uploaded array is combined with the same
    coefficients around the server's value S of that array:

        Ā = a · S + Σᵢ wᵢ · A[i]

    The new centre v_L is the rule's state for the next round.

    Conventions: the state is explicit (``init_state``; ``aggregate(...,
    rule_state=...)`` returns it in ``result.state``); the trainer keeps it
    with the server state and in every checkpoint (``cc_center``), so a
    resumed run is bit for bit the uninterrupted one. The centre's share a of
    an upload goes to the server's value S (the previous aggregate of that
    array): in parameter space the step taken is θ̄ᵗ − θ̄ᵗ⁻¹ = v_L − a·v₀, the
    clients' part of the new centre. pᵢ ∝ nᵢ (ByzFL: the plain mean, the same
    for equal nᵢ; ByzFL's object keeps its centre between calls, as ours does
    through the state). The reported ``weights`` are wᵢ/Σ wⱼ, the clients'
    shares of the clients' part; ``center_weight`` is a. Distances in
    float64, scaled where their squares overflow. f is not used (τ bounds
    every client's pull instead).

    Hostile input: a client with a NaN or ±inf in its features or any upload
    has no direction to clip: cᵢ = 0, it does not move the centre (nor reach
    any upload), whatever the number of such clients. A huge finite row
    (1e38) is clipped to τ like any other.

    Guarantee (tested): each iteration moves the centre by at most τ, and the
    Byzantine clients together by at most τ·Σ_{i Byzantine} pᵢ: with L = 1,
    ‖CC(X) − CC(X′)‖ ≤ τ·Σ_B pᵢ, X′ being X with the Byzantine rows replaced
    by the centre (no vote).

    Reference: S. P. Karimireddy, L. He, M. Jaggi, "Learning from History for
    Byzantine Robust Optimization", ICML 2021.

    Precondition: none on n and f; τ > 0 and L ≥ 1.
    """

    tau: float = hyper(100.0, "centered clipping's radius τ: each client's difference from the "
                       "centre is clipped to this norm (ByzFL's default)", cli="cc-tau")
    iterations: int = hyper(1, "centered clipping's iterations L per round", cli="cc-iterations")

    name: ClassVar[str] = "cc"
    coordinatewise: ClassVar[bool] = False
    #: the state it keeps between rounds (with the server state, in checkpoints)
    state_arrays: ClassVar[tuple[str, ...]] = ("cc_center",)
    #: the round loop passes ``reference`` (the server state) and ``rng``
    takes_round_inputs: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        t = self.tau
        if (isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, float, np.integer, np.floating))
                or not math.isfinite(t) or t <= 0):
            raise ValueError(f"cc tau must be a finite number > 0, got {t!r}")
        L = self.iterations
        if isinstance(L, (bool, np.bool_)) or not isinstance(L, (int, np.integer)) or L < 1:
            raise ValueError(f"cc iterations must be an integer ≥ 1, got {L!r}")

    def init_state(self, D: int) -> dict[str, np.ndarray]:
        """The state before the first round: the centre 0 (float64)."""
        return {"cc_center": np.zeros(D)}

    def aggregate(self, features, arrays: Mapping[str, np.ndarray], n_samples, f: int, *,
                  backend: str = "numba", reference: Mapping[str, np.ndarray] | None = None,
                  rng=None, rule_state: Mapping[str, np.ndarray] | None = None) -> AggregationResult:
        """As :meth:`Rule.aggregate`, with the previous state ``rule_state`` (None: the
        first round's) and the server's values ``reference`` of the uploaded arrays
        (None: 0, e.g. for arrays that are features); ``result.state`` is the next one."""
        X, mats, w = validate_inputs(features, arrays, n_samples, f, backend)
        n, D = X.shape
        v0 = (self.init_state(D) if rule_state is None else rule_state)["cc_center"]
        v0 = np.asarray(v0, dtype=np.float64)
        if v0.shape != (D,) or not np.isfinite(v0).all():
            raise ValueError(f"cc: the centre must be a finite ({D},) array, got shape {v0.shape}")
        cpu = "numpy" if backend == "numpy" else "numba"
        # the features' own finiteness comes with the first distances (+inf for a row
        # with NaN or ±inf): only the other uploads need a pass of their own
        ok = np.ones(n, dtype=bool)
        for A in mats.values():
            if A is not X and not isinstance(mats, FiniteUploads):
                ok &= finite_clients(A, {}, cpu)
        p = w / w.sum()
        a, wts = 1.0, np.zeros(n)
        v = v0
        moves, clipped = [], []
        for _ in range(self.iterations):
            d = distances_to(X, v, cpu)
            far = np.flatnonzero(~np.isfinite(d))
            if not moves and far.size:
                # v₀ is finite: an infinite distance is a non-finite row, or a finite one
                # farther than float64's range (rows near ±1.8e308), which is clipped
                with np.errstate(invalid="ignore"):
                    ok[far] &= np.isfinite(np.asarray(X[far], dtype=np.float64)).all(axis=1)
            c = np.zeros(n)
            fin = ok & np.isfinite(d)
            df = d[fin]
            c[fin] = np.where(df > self.tau, self.tau / np.where(df > self.tau, df, 1.0), 1.0)
            for i in far[ok[far]]:
                c[i] = _clip_factor_beyond_range(X[i], v, self.tau)
            pc = p * c
            s = float(pc.sum())
            a, wts = (1.0 - s) * a, (1.0 - s) * wts + pc
            v_new = a * v0 + _combine64(X, wts, backend)
            moves.append(float(np.linalg.norm(v_new - v)))
            clipped.append(int((fin & (c < 1)).sum()))
            v = v_new
        out = {}
        for name, A in mats.items():
            if A is X:
                out[name] = v.astype(A.dtype)
                continue
            S = None if reference is None else reference.get(name)
            S = np.zeros(D) if S is None else np.asarray(S, dtype=np.float64)
            out[name] = (a * S + _combine64(A, wts, backend)).astype(A.dtype)
        total = wts.sum()
        weights = wts / total if total > 0 else wts
        diag = {"rule": self.name, "n": n, "f": int(f), "f_used": None,
                "hyperparameters": values(self), "backend": backend, "center_weight": a,
                "moves": moves, "clipped": clipped, "center_norm_before": float(np.linalg.norm(v0)),
                "nonfinite_clients": jsonable(np.flatnonzero(~ok)), "fallback": None}
        return AggregationResult(out, weights, (wts > 0).astype(np.float64), jsonable(diag),
                                 state={"cc_center": v})

    def _aggregate(self, X, arrays, n_samples, f, backend):  # pragma: no cover - aggregate overrides
        raise NotImplementedError


def _clip_factor_beyond_range(x: np.ndarray, v: np.ndarray, tau: float) -> float:
    """τ/‖x − v‖ for a finite row whose distance exceeds float64's range: with
    m = maxₖ|xₖ − vₖ| (x − v taken as x/2 − v/2, which cannot overflow) the distance is
    2m·√Σ((xₖ/2 − vₖ/2)/m)², so the factor is (τ/2m)/√Σ(...)² (tiny, not 0)."""
    h = 0.5 * np.asarray(x, dtype=np.float64) - 0.5 * v
    m = float(np.abs(h).max())
    return float((tau / (2.0 * m)) / np.sqrt(((h / m) ** 2).sum()))


def _combine64(A: np.ndarray, w: np.ndarray, backend: str) -> np.ndarray:
    """Σ wᵢ A[i] over wᵢ ≠ 0 in float64, returned in float64 (not rounded to A's dtype);
    a sum of finite values that overflowed is computed again without overflow
    (:func:`rfrs_ref.aggregate.combine.refit_overflowed`)."""
    from rfrs_ref.aggregate.combine import refit_overflowed

    if backend == "numpy":
        use = w != 0
        with np.errstate(over="ignore", invalid="ignore"):
            out = (w[use, None] * np.asarray(A[use], dtype=np.float64)).sum(axis=0)
        return refit_overflowed(A, w, out)
    from rfrs_ref.aggregate.combine import _combine_rows_numba, BLOCK
    from rfrs_ref.kernels.distances import n_chunks

    M = as_float_matrix(A, "A")
    out = np.empty(M.shape[1])
    w = np.ascontiguousarray(w, dtype=np.float64)
    if _combine_rows_numba(M, w, out, BLOCK, n_chunks(M.shape[1], BLOCK)):
        refit_overflowed(M, w, out)
    return out
