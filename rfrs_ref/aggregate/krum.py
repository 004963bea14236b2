"""``krum``: (multi-)Krum selection on the detection features (docs/aggregation.md)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from rfrs_ref.aggregate.base import AggregationResult, NothingFinite, Rule, combine, fallback_field, jsonable
from rfrs_ref.aggregate.combine import finite_clients
from rfrs_ref.kernels.distances import pairwise_sq_dists
from rfrs_ref.params import hyper


def client_distances(X: np.ndarray, arrays, backend: str) -> tuple[np.ndarray, np.ndarray]:
    """Squared feature distances (float64 (n, n)) with every client that holds a
    non-finite feature or upload made infinitely far from all; and that mask."""
    D2 = pairwise_sq_dists(X, backend=backend)
    ok = finite_clients(X, arrays, "numpy" if backend == "numpy" else "numba")
    D2[~ok, :] = np.inf
    D2[:, ~ok] = np.inf
    return D2, ok


def krum_scores(D2: np.ndarray, f: int, candidates: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """Krum scores of the candidate clients.

    score(i) = Σ of the m smallest squared distances from xᵢ to the other
    candidates, m = |R| − f − 2 clipped to [1, |R| − 1] (R the candidates; the
    clip only matters inside Bulyan, whose candidate set shrinks).

    Args:
        D2: float64 (n, n) squared distances (+inf for infinitely far pairs).
        f: assumed number of Byzantine clients.
        candidates: indices of the candidate clients (default all).

    Returns:
        (scores float64 (n,), +inf for non-candidates; m). Sums of +inf are +inf,
        never NaN, so the order of scores is total.
    """
    n = D2.shape[0]
    R = np.arange(n) if candidates is None else np.asarray(candidates)
    r = R.size
    m = min(r - 1, max(1, r - f - 2))
    scores = np.full(n, np.inf)
    if r == 1:
        scores[R] = 0.0
        return scores, 0
    sub = D2[np.ix_(R, R)].copy()
    np.fill_diagonal(sub, np.inf)
    with np.errstate(over="ignore", invalid="ignore"):
        scores[R] = np.sort(sub, axis=1)[:, :m].sum(axis=1)
    return scores, m


def lowest(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k lowest scores, ties broken by the smaller index."""
    return np.argsort(scores, kind="stable")[:k]


@dataclasses.dataclass(frozen=True)
class Krum(Rule):
    r"""Krum and multi-Krum (Blanchard et al. 2017), on the detection features.

    Formula: with xᵢ the features and m = n − f − 2,

        score(i) = Σ_{j ∈ N_m(i)} ‖xᵢ − xⱼ‖²

    N_m(i) being the m nearest other features of xᵢ (squared Euclidean
    distances, the paper's definition). The k clients with the lowest scores are
    kept; every uploaded array is their weighted mean with weights ∝ nᵢ:

        Ā = Σ_{i kept} nᵢ · A[i] / Σ_{i kept} nᵢ

    Conventions: k = n − f by default (``k = 0``), which is how the paper's
    "Krum ... aggregates the remaining" reads (multi-Krum); ``k = 1`` is
    classic Krum (the aggregate is the chosen client's upload). Ties between
    scores go to the smaller client index. Distances are exact differences
    accumulated in float64 (:mod:`rfrs_ref.kernels.distances`).

    Hostile input: a client with a NaN or ±inf in its features or any upload is
    infinitely far from everyone: its score is +inf, it ranks after every
    finite client (even one whose score is +inf too) and is never kept while
    at most f clients are Byzantine. Beyond that, a chosen non-finite client is
    dropped (``dropped_nonfinite``); with no finite client at all the rule
    raises ``ValueError``. Huge finite values (1e38) give huge but exact
    float64 distances.

    Guarantee (tested): with at most f arbitrary features among n > 2f + 2, every
    kept feature is within (n − f − 2)/(n − 2f − 2) · diam² (squared distance) of
    some honest feature, diam being the honest features' diameter.

    Reference: P. Blanchard, E. M. El Mhamdi, R. Guerraoui, J. Stainer, "Machine
    Learning with Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017.
    A-RFRS (the paper's method) is this rule on recovered gradients.

    Precondition: n > 2f + 2 and 1 ≤ k ≤ n − f.
    """

    k: int = hyper(0, "clients kept by Krum: the k lowest scores; 0 means n − f "
                   "(multi-Krum, the paper's reading), 1 is classic Krum", cli="krum-k")
    fallback: str = fallback_field()

    name: ClassVar[str] = "krum"
    coordinatewise: ClassVar[bool] = False
    combines_by_weights: ClassVar[bool] = True
    weighs_by_distances: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.k, (int, np.integer)) or self.k < 0:
            raise ValueError(f"krum k must be an integer ≥ 0 (0 means n − f), got {self.k!r}")

    def _condition(self, n: int, f: int) -> str | None:
        if not n > 2 * f + 2:
            return "n > 2f + 2"
        if self.k > n - f:
            return f"k ≤ n − f (k={self.k})"
        return None

    def _aggregate(self, X, arrays, n_samples, f, backend):
        D2, ok = client_distances(X, arrays, backend)
        res = self._from_distances(D2, ok, n_samples, f)
        res.arrays = combine(arrays, res.weights, backend)
        return res

    def _from_distances(self, D2, ok, n_samples, f, error=None):
        n = D2.shape[0]
        scores, m = krum_scores(D2, f)
        k = self.k if self.k > 0 else n - f
        # finite clients before non-finite ones, even when every score is +inf
        # (distances beyond the float64 range): a finite client is never passed
        # over for one that must be dropped
        chosen = np.lexsort((scores, ~ok))[:k]
        # beyond the assumption (more than f non-finite clients) a chosen client
        # may still be non-finite: it is dropped rather than allowed to poison
        dropped = [int(i) for i in chosen if not ok[i]]
        kept_ids = np.array([i for i in chosen if ok[i]], dtype=np.int64)
        if kept_ids.size == 0:
            raise NothingFinite(
                f"krum: every client it would keep (k={k} of n={n}) holds NaN or ±inf in its "
                "features or uploads; there is nothing finite to aggregate"
            )
        w = np.zeros(n)
        w[kept_ids] = n_samples[kept_ids]
        w /= w.sum()
        diag = {"scores": jsonable(scores), "neighbours": m, "k": k,
                "selected": jsonable(kept_ids), "dropped_nonfinite": dropped,
                "nonfinite_clients": jsonable(np.flatnonzero(~ok))}
        return AggregationResult({}, w, (w > 0).astype(np.float64), diag)
