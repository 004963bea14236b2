"""``monna``: the mean of the n − f nearest neighbours of a pivot client."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from rfrs_ref.aggregate.base import AggregationResult, NothingFinite, Rule, combine, fallback_field, jsonable
from rfrs_ref.aggregate.combine import finite_clients
from rfrs_ref.kernels.distances import pairwise_sq_dists
from rfrs_ref.params import hyper


@dataclasses.dataclass(frozen=True)
class MoNNA(Rule):
    r"""MoNNA (Farhadkhani et al. 2023): the nᵢ-weighted mean of the n − f
    nearest neighbours of a pivot client, on the detection features.

    Formula: with p the pivot and N(p) the n − f clients whose features are
    nearest to xₚ (xₚ itself included, at distance 0),

        Ā = Σ_{i ∈ N(p)} nᵢ · A[i] / Σ_{i ∈ N(p)} nᵢ

    Conventions: the pivot is the client at position ``pivot`` of the round's
    uploads (ByzFL's ``idx``, default 0). MoNNA was designed for peer-to-peer
    learning, where each honest node is its own pivot; the guarantee below
    needs a trusted pivot, which a server that samples its clients does not
    have unless it places one (e.g. its own honest client) at that position.
    Squared float64 distances by direct differences (one row of
    :func:`~rfrs_ref.kernels.distances.pairwise_sq_dists`, one pass over X);
    ties of distance go to the smaller client index (ByzFL's ``argpartition``
    leaves their order unspecified); the choice is unweighted, the combination
    weighted by nᵢ (ByzFL: plain mean, the same for equal nᵢ). The choice is
    a function of the pivot's squared distances and of which clients are
    finite alone (``weighs_by_distances``): :meth:`from_distances` takes the
    pivot's row of a matrix the round summed by parts (docs/performance.md,
    "Robust rounds on shared rows").

    Hostile input: a client with a NaN or ±inf in its features or any upload is
    infinitely far from the pivot and ranks after every finite client, so it
    is never kept while at most f clients are such; beyond that it is dropped
    from N(p) (``dropped_nonfinite``). A pivot that is itself non-finite is
    provably not honest (an honest upload is finite) and no point to measure
    from: the pivot moves to the first finite client after it in upload order,
    cyclically (p + 1, …, n − 1, 0, …, p − 1), and ``pivot_moved_from`` records
    the position given. With no finite client at all the rule raises
    :class:`~rfrs_ref.aggregate.base.NothingFinite` (the round loop keeps the
    state for that round).

    Guarantee (tested): with an honest pivot and at most f arbitrary features,
    at least n − f honest clients exist, so every kept feature is within
    r = maxₕ ‖xₕ − xₚ‖ ≤ Δ of the pivot (h honest, Δ the honest diameter), and
    so is the aggregate of the features.

    Reference: S. Farhadkhani, R. Guerraoui, N. Gupta, L. N. Hoang, R. Pinot,
    J. Stephan, "Robust Collaborative Learning with Linear Gradient Overhead",
    ICML 2023.

    Precondition: n > 2f and pivot < n.
    """

    pivot: int = hyper(0, "MoNNA's pivot: the position, in the round's uploads, of the client "
                       "whose n − f nearest neighbours are averaged (trusted)", cli="monna-pivot")
    fallback: str = fallback_field()

    name: ClassVar[str] = "monna"
    coordinatewise: ClassVar[bool] = False
    combines_by_weights: ClassVar[bool] = True
    weighs_by_distances: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if (isinstance(self.pivot, (bool, np.bool_)) or not isinstance(self.pivot, (int, np.integer))
                or self.pivot < 0):
            raise ValueError(f"monna pivot must be an integer ≥ 0 (a client position), got {self.pivot!r}")

    def _condition(self, n: int, f: int) -> str | None:
        if not n > 2 * f:
            return "n > 2f"
        if not self.pivot < n:
            return f"pivot < n (pivot={self.pivot})"
        return None

    def _aggregate(self, X, arrays, n_samples, f, backend):
        ok = finite_clients(X, arrays, "numpy" if backend == "numpy" else "numba")
        p, moved_from = self._pivot(ok)
        d2 = pairwise_sq_dists(X[p:p + 1], X, backend=backend)[0]
        res = self._selected(d2, ok, p, moved_from, n_samples, f)
        res.arrays = combine(arrays, res.weights, backend)
        return res

    def _from_distances(self, D2, ok, n_samples, f, error=None):
        # the pivot's row of a matrix the round summed by parts (docs/performance.md,
        # "Robust rounds on shared rows"); the rule itself computes that row alone
        p, moved_from = self._pivot(ok)
        return self._selected(np.array(D2[p], dtype=np.float64), ok, p, moved_from,
                              n_samples, f)

    def _pivot(self, ok: np.ndarray) -> tuple[int, int | None]:
        """(the pivot, the position given where it moved, else None)."""
        n = ok.size
        if not ok.any():
            raise NothingFinite(f"monna: every client (n={n}) holds NaN or ±inf in its features "
                                "or uploads; there is nothing finite to aggregate")
        p = self.pivot
        if ok[p]:
            return p, None
        # an honest upload is finite, so this pivot is not the trusted one: measure from
        # the next finite client rather than from a point that has no distances
        return int(np.flatnonzero(np.roll(ok, -p))[0] + p) % n, p

    def _selected(self, d2, ok, p, moved_from, n_samples, f) -> AggregationResult:
        """The weights of the n − f clients nearest the pivot, ``d2`` its squared
        distances (modified: +inf for a non-finite client)."""
        n = ok.size
        d2[~ok] = np.inf
        k = n - f
        # finite clients first (also when distances overflow to +inf), then by
        # distance, ties by index
        chosen = np.lexsort((d2, ~ok))[:k]
        dropped = [int(i) for i in chosen if not ok[i]]
        kept_ids = np.sort(chosen[ok[chosen]])
        w = np.zeros(n)
        w[kept_ids] = n_samples[kept_ids]
        w /= w.sum()
        diag = {"pivot": p, "selected": jsonable(kept_ids), "distances": jsonable(np.sqrt(d2)),
                "dropped_nonfinite": dropped, "nonfinite_clients": jsonable(np.flatnonzero(~ok))}
        if moved_from is not None:
            diag["pivot_moved_from"] = moved_from
        return AggregationResult({}, w, (w > 0).astype(np.float64), diag)
