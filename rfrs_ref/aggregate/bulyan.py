"""``bulyan``: Krum-based selection, then a coordinate-wise trimmed mean around
the median (docs/aggregation.md)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from rfrs_ref.aggregate.base import AggregationResult, Rule, fallback_field, jsonable
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
    upper one on a tie); ranks tie by client index; every non-finite
    feature or upload value ranks as +inf. The combination is weighted by nᵢ (plain mean in the paper,
    identical for equal nᵢ). Selection ties go to the smaller index.
    ``kept[i]`` is the fraction of coordinates at which client i is among the β.

    Guarantee (tested): with at most f arbitrary features, every aggregated
    feature coordinate lies within the honest values' range there.

    Reference: E. M. El Mhamdi, R. Guerraoui, S. Rouault, "The Hidden
    Vulnerability of Distributed Learning in Byzantium", ICML 2018.

    Precondition: n ≥ 4f + 3.
    """

    fallback: str = fallback_field()

    name: ClassVar[str] = "bulyan"
    coordinatewise: ClassVar[bool] = True

    def _condition(self, n: int, f: int) -> str | None:
        return None if n >= 4 * f + 3 else "n ≥ 4f + 3"

    def _aggregate(self, X, arrays, n_samples, f, backend):
        n = X.shape[0]
        theta = n - 2 * f
        beta = theta - 2 * f
        D2, ok = client_distances(X, arrays, backend)
        remaining = list(range(n))
        selected = []
        for _ in range(theta):
            scores, _ = krum_scores(D2, f, np.array(remaining))
            best = int(lowest(scores, 1)[0])
            selected.append(best)
            remaining.remove(best)
        rows = np.sort(np.array(selected, dtype=np.int64))
        out, kept, bad = coordinatewise_combine(X, arrays, n_samples, mode="closest", t=f,
                                                rows=rows, backend=backend)
        diag = {"theta": theta, "beta": beta, "selected": selected,
                "nonfinite_clients": jsonable(np.flatnonzero(~ok)),
                "nonfinite_kept_coordinates": bad}
        return AggregationResult(out, None, kept / X.shape[1], diag)
