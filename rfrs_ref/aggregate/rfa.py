"""``rfa``: robust federated aggregation by the geometric median (docs/aggregation.md)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from rfrs_ref.aggregate.base import AggregationResult, NothingFinite, Rule, combine, fallback_field, jsonable
from rfrs_ref.aggregate.combine import finite_clients
from rfrs_ref.kernels.weiszfeld import geometric_median_weights
from rfrs_ref.params import hyper


@dataclasses.dataclass(frozen=True)
class RFA(Rule):
    r"""RFA (Pillutla et al. 2019): the nᵢ-weighted geometric median of the
    features by smoothed Weiszfeld, whose final weights combine the uploads.

    Formula: z approximately minimises Σᵢ nᵢ ‖z − xᵢ‖. Starting from the
    nᵢ-weighted mean, each step is

        z ← Σᵢ αᵢ xᵢ / Σᵢ αᵢ,        αᵢ = nᵢ / max(ν, ‖z − xᵢ‖),

    until a step moves z by at most ``tol`` times the nᵢ-weighted median of the
    distances ‖z − xᵢ‖ (or ``max_iter`` steps). The per-client weights are the
    final Weiszfeld weights normalised, wᵢ = αᵢ / Σ αⱼ, and every uploaded
    array is Σᵢ wᵢ · A[i]; on the features themselves that is one more
    Weiszfeld step from z.

    Conventions: the stopping test differs from Pillutla et al.'s relative
    change of the objective, which stops far from the median when one row is
    huge (see :func:`rfrs_ref.kernels.weiszfeld.geometric_median`). The
    diagnostics report the iterations, whether the test was met (``converged``),
    the objective history and the start.

    Restart (``restart``, CLI ``--rfa-restart true``; off by default: Pillutla et
    al.'s RFA starts at the mean and never restarts). From the mean, a far group
    pulls z out and Weiszfeld comes back by a constant factor a step: 3 of 8
    clients (35% of the weight) at 1e38 against honest rows of 1e-3 leave the
    aggregate at 2.9e10 after 100 steps (z at 5.4e10), ``converged`` false, which
    is what the default returns.
    With ``restart=True``, an iteration from the mean that does not meet the test
    within ``max_iter`` steps runs again from the coordinate-wise median of the
    finite rows, and the iterate of the lower objective is taken (ties: the one
    from the mean); in that example it reaches the honest rows' median in 13 steps,
    ``converged`` true. A round that converges from the mean is unchanged. The
    diagnostics then also report ``restarted``, the start ``"median (the mean did
    not converge)"`` where the restart is taken, ``iterations`` of the run taken
    and, where ``restarted`` is true, ``iterations_from_mean`` and
    ``iterations_from_median``.

    Hostile input: a client with a NaN or ±inf in its features or any upload
    has α = 0 (infinitely far); a huge finite row gets a tiny weight αᵢ.

    Reference: K. Pillutla, S. M. Kakade, Z. Harchaoui, "Robust Aggregation for
    Federated Learning", arXiv:1912.13445 (2019).

    Precondition: n > 2f (the geometric median's breakdown point is 1/2).
    """

    nu: float = hyper(1e-6, "RFA smoothing ν: Weiszfeld weights are nᵢ / max(ν, distance)",
                      cli="rfa-nu")
    tol: float = hyper(1e-6, "RFA stops when a step moves z by at most tol × the weighted "
                       "median distance", cli="rfa-tol")
    max_iter: int = hyper(100, "RFA: at most this many Weiszfeld steps", cli="rfa-max-iter")
    restart: bool = hyper(False, "RFA: where the iteration from the weighted mean ends "
                          "unconverged, run it again from the coordinate-wise median and keep "
                          "the iterate of the lower objective", cli="rfa-restart",
                          absent_is_default=True)
    fallback: str = fallback_field()

    name: ClassVar[str] = "rfa"
    coordinatewise: ClassVar[bool] = False
    combines_by_weights: ClassVar[bool] = True
    weighs_by_distances: ClassVar[bool] = True
    #: its steps run on float64 differences (``pairwise_sq_dists64``), and need their
    #: error bound (``Rule.from_distances(error=)``)
    distances64: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.nu > 0 and np.isfinite(self.nu)):
            raise ValueError(f"rfa nu must be a finite number > 0, got {self.nu!r}")
        if not (self.tol >= 0):
            raise ValueError(f"rfa tol must be ≥ 0, got {self.tol!r}")
        if not isinstance(self.max_iter, (int, np.integer)) or self.max_iter < 0:
            raise ValueError(f"rfa max_iter must be an integer ≥ 0, got {self.max_iter!r}")

    def _condition(self, n: int, f: int) -> str | None:
        return None if n > 2 * f else "n > 2f"

    def _from_distances(self, D2, ok, n_samples, f, error=None):
        from rfrs_ref.aggregate.base import NeedsRows
        from rfrs_ref.kernels.weiszfeld import geometric_median_weights_on_matrix

        if error is None:
            raise ValueError("rfa takes float64 distances with their relative error bound "
                             "(error=, e.g. pairwise_sq_dists64_by_parts's)")
        if not ok.any():
            raise NothingFinite("rfa: every client holds NaN or ±inf in its features or uploads; "
                                "there is nothing finite to aggregate")
        gm = geometric_median_weights_on_matrix(D2, error, np.where(ok, n_samples, 0.0), ok,
                                                nu=self.nu, tol=self.tol, max_iter=self.max_iter,
                                                restart=bool(self.restart))
        if gm is None:
            raise NeedsRows("rfa: Weiszfeld's steps need the rows themselves here (a distance "
                            "the matrix cannot certify, a step within rounding of the "
                            "stopping threshold, or, with restart, no convergence from the "
                            "mean, whose restart from the coordinate-wise median needs the "
                            "rows)")
        return self._result({}, gm, ok)

    def _result(self, out, gm, ok):
        w = gm["alpha"] / gm["alpha"].sum()
        diag = {"iterations": gm["iterations"], "converged": gm["converged"],
                "objective": jsonable(gm["objective"]), "last_step": jsonable(gm["last_step"]),
                "start": gm["start"], "distances": jsonable(gm["dist"]),
                "nonfinite_clients": jsonable(np.flatnonzero(~ok))}
        if "restarted" in gm:  # restart on
            diag["restarted"] = bool(gm["restarted"])
            if diag["restarted"]:
                diag["iterations_from_mean"] = gm["iterations_from_mean"]
                diag["iterations_from_median"] = gm["iterations_from_median"]
        return AggregationResult(out, w, (w > 0).astype(np.float64), diag)

    def _aggregate(self, X, arrays, n_samples, f, backend):
        ok = finite_clients(X, arrays, "numpy" if backend == "numpy" else "numba")
        if not ok.any():
            raise NothingFinite("rfa: every client holds NaN or ±inf in its features or uploads; "
                             "there is nothing finite to aggregate")
        gm = geometric_median_weights(X, np.where(ok, n_samples, 0.0), nu=self.nu, tol=self.tol,
                                      max_iter=self.max_iter, backend=backend, finite=ok,
                                      restart=bool(self.restart))
        w = gm["alpha"] / gm["alpha"].sum()
        return self._result(combine(arrays, w, backend), gm, ok)
