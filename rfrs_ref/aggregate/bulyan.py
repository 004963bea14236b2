"""``bulyan``: Krum-based selection, then a coordinate-wise trimmed mean around
the median (docs/aggregation.md)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from rfrs_ref.aggregate.base import AggregationResult, NothingFinite, Rule, fallback_field, jsonable
from rfrs_ref.aggregate.krum import client_distances, krum_scores, lowest
from rfrs_ref.kernels.coordinatewise import coordinatewise_combine


@dataclasses.dataclass(frozen=True)
class Bulyan(Rule):
    r"""Bulyan (El Mhamdi et al. 2018) over Krum, on the detection features.

    Formula: with θ = n − 2f and β = θ − 2f,

    1. selection: θ times, compute the Krum scores among the clients not yet
       selected (R), with m = |R| − f − 2 neighbours clipped to [1, |R| − 1],
       and move the client with the lowest score into the selection S;
    2. at every coordinate k, keep the β clients of S whose features are
       closest to the median of S's features at k (for even θ, the mean of the
       two middle values), and combine every uploaded array at k over them with
       weights ∝ nᵢ:

        Āₖ = Σ_{i kept at k} nᵢ · A[i, k] / Σ_{i kept at k} nᵢ

    Conventions: the β closest values are a window of consecutive ranks found
    by removing, 2f times, the end of the window farther from the median (the
    upper one on a tie); ranks tie by client index and order values as
    :class:`~rfrs_ref.aggregate.Median` does. The combination is weighted by
    nᵢ (plain mean in the paper, identical for equal nᵢ). Selection ties go to the smaller index.
    ``kept[i]`` is the fraction of coordinates at which client i is among the β.

    Hostile input: a client with a NaN or ±inf in its features or any upload
    is infinitely far from everyone and never selected while a finite client
    remains. Beyond the assumption, when fewer than θ clients are finite (more
    than 2f are not), every finite client is selected (θ' of them, reported as
    ``theta_used``) and the window trims t' = min(f, ⌊(θ' − 1)/2⌋) values per
    side (β' = θ' − 2t', ``beta_used``): no non-finite value is aggregated.
    With no finite client at all the rule raises ``ValueError``.

    Guarantee (tested): with at most f arbitrary features, the median of the
    selection at every coordinate lies within the honest values' range, and
    every aggregated feature coordinate within [lo − w, hi + w], w = hi − lo
    the width of that range (docs/aggregation.md, "Bulyan's range law").

    Reference: E. M. El Mhamdi, R. Guerraoui, S. Rouault, "The Hidden
    Vulnerability of Distributed Learning in Byzantium", ICML 2018.

    Precondition: n ≥ 4f + 3.
    """

    fallback: str = fallback_field()

    name: ClassVar[str] = "bulyan"
    coordinatewise: ClassVar[bool] = True
    selects_by_distances: ClassVar[bool] = True
    window: ClassVar[str] = "closest"

    def _condition(self, n: int, f: int) -> str | None:
        return None if n >= 4 * f + 3 else "n ≥ 4f + 3"

    def _aggregate(self, X, arrays, n_samples, f, backend):
        D2, ok = client_distances(X, arrays, backend)
        rows, t, diag = self._select(D2, ok, f)
        out, kept, bad = coordinatewise_combine(X, arrays, n_samples, mode=self.window, t=t,
                                                rows=rows, backend=backend)
        return AggregationResult(out, None, kept / X.shape[1],
                                 {**diag, **self._window_diagnostics(t, bad)})

    def _column_plan(self, n, f, distances):
        if distances is None:
            raise ValueError("bulyan selects its clients by their distances: give distances=(D2, finite)")
        D2, ok = distances
        return self._select(np.asarray(D2, dtype=np.float64), np.asarray(ok, dtype=bool), f)

    def _window_diagnostics(self, t: int, bad: int) -> dict:
        return {"nonfinite_kept_coordinates": bad}

    @staticmethod
    def _select(D2, ok, f):
        """Step 1 on the squared distances D2 (+inf for a non-finite client, ``ok`` False):
        the selected rows (ascending), the window's t, and the selection's diagnostics."""
        n = D2.shape[0]
        theta = n - 2 * f
        beta = theta - 2 * f
        finite = np.flatnonzero(ok)
        if finite.size == 0:
            raise NothingFinite(
                f"bulyan: every client (n={n}) holds NaN or ±inf in its features or uploads; "
                "there is nothing finite to aggregate"
            )
        # Non-finite clients are never candidates: they are infinitely far from
        # everyone, and choosing among the candidates only (not the lowest score
        # overall, where every score may be +inf) keeps a selected client from
        # being chosen twice.
        remaining = finite.tolist()
        theta_used = min(theta, finite.size)
        selected = []
        for _ in range(theta_used):
            R = np.array(remaining)
            scores, _ = krum_scores(D2, f, R)
            best = int(R[lowest(scores[R], 1)[0]])
            selected.append(best)
            remaining.remove(best)
        # Beyond the assumption (more than 2f non-finite clients) fewer than θ
        # finite clients remain: all of them are selected, and the window trims
        # as much of the 2f as leaves at least one value.
        t = f if theta_used == theta else min(f, (theta_used - 1) // 2)
        rows = np.sort(np.array(selected, dtype=np.int64))
        diag = {"theta": theta, "beta": beta, "selected": selected,
                "theta_used": theta_used, "beta_used": theta_used - 2 * t,
                "nonfinite_clients": jsonable(np.flatnonzero(~ok))}
        return rows, t, diag
