"""``mda``: minimum-diameter averaging, the mean of the n − f clients whose
features have the smallest diameter."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import ClassVar

import numpy as np
from numba import njit

from rfrs_ref.aggregate.base import (
    AggregationResult,
    NothingFinite,
    Rule,
    check_max_subsets,
    combine,
    fallback_field,
    jsonable,
    subset_search_condition,
)
from rfrs_ref.aggregate.krum import client_distances
from rfrs_ref.params import hyper


def min_diameter_subset_numpy(D2: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """Oracle: every subset of k rows, in the lexicographic order of
    ``itertools.combinations``; the first one of smallest diameter
    maxᵢ,ⱼ D2[i, j] (squared distances, so the order of Euclidean diameters).

    Returns (sorted row indices int64 (k,), its squared diameter).
    """
    n = D2.shape[0]
    best, best_d = None, math.inf
    for S in itertools.combinations(range(n), k):
        d = max((D2[i, j] for i, j in itertools.combinations(S, 2)), default=0.0)
        if best is None or d < best_d:
            best, best_d = S, d
    return np.array(best, dtype=np.int64), float(best_d)


@njit(cache=True)
def _min_diameter_subset_numba(D2, k):
    """Branch and bound over the same lexicographic order as the oracle: a
    partial subset whose diameter is already ≥ the best complete one is not
    extended (it cannot become strictly smaller, and the first of equal ones
    wins), so the result is the oracle's."""
    n = D2.shape[0]
    best = np.arange(k)
    best_d = np.inf
    found = False
    idx = np.empty(k, dtype=np.int64)
    diam = np.zeros(k + 1)  # diam[j]: diameter of the first j chosen rows
    depth = 0
    idx[0] = -1
    while depth >= 0:
        idx[depth] += 1
        i = idx[depth]
        if i > n - (k - depth):
            depth -= 1
            continue
        d = diam[depth]
        for j in range(depth):
            e = D2[idx[j], i]
            if e > d:
                d = e
        if found and not d < best_d:
            continue
        diam[depth + 1] = d
        if depth + 1 == k:
            best[:] = idx
            best_d = d
            found = True
            continue
        depth += 1
        idx[depth] = i
    return best, best_d


def min_diameter_subset(D2: np.ndarray, k: int, backend: str = "numba") -> tuple[np.ndarray, float]:
    """The first subset of k rows (lexicographic order) of smallest diameter;
    ``"numpy"`` enumerates every subset, the others search by branch and bound."""
    if backend == "numpy":
        return min_diameter_subset_numpy(D2, k)
    S, d = _min_diameter_subset_numba(np.ascontiguousarray(D2, dtype=np.float64), k)
    return S, float(d)


@dataclasses.dataclass(frozen=True)
class MDA(Rule):
    r"""Minimum-diameter averaging (El Mhamdi et al. 2020), on the detection features.

    Formula: among the subsets S of n − f clients, the one of smallest diameter

        S* = argmin_{|S| = n − f} max_{i, j ∈ S} ‖xᵢ − xⱼ‖,

    and every uploaded array is the nᵢ-weighted mean over S*:

        Ā = Σ_{i ∈ S*} nᵢ · A[i] / Σ_{i ∈ S*} nᵢ

    Conventions: the choice is unweighted (nᵢ cannot buy a client into S*), the
    combination weighted by nᵢ (ByzFL's ``MDA`` takes the plain mean: the same
    for equal nᵢ). Diameters compare squared distances (float64 direct
    differences, :mod:`rfrs_ref.kernels.distances`): the same order. Ties go
    to the first subset in the lexicographic order of client indices (that of
    ``itertools.combinations``, ByzFL's too). The search is exact: the NumPy
    oracle enumerates every subset, the Numba path is a branch and bound over
    the same order with the same result; on ``backend="cuda"`` the distances
    are computed on the GPU and the search on the CPU. The subset is a function
    of the squared distances and of which clients are finite alone
    (``weighs_by_distances``): :meth:`from_distances` takes them from a matrix
    the round summed by parts (docs/performance.md, "Robust rounds on shared
    rows").

    Hostile input: a client with a NaN or ±inf in its features or any upload is
    infinitely far from everyone and never in S* while at most f clients are
    such (the search runs over the finite clients only). Beyond that, S* is
    every finite client, fewer than n − f (``short`` says by how many); with
    no finite client the rule raises ``ValueError``. Huge finite
    values give huge, exact distances.

    Guarantee (tested): with at most f arbitrary features, the honest clients
    contain a subset of n − f, so diam(S*) ≤ the honest diameter Δ; S* holds
    at least n − 2f ≥ 1 honest clients, and the aggregate of the features lies
    within Δ of each of them.

    Reference: E. M. El Mhamdi, R. Guerraoui, A. Guirguis, L. N. Hoang, S.
    Rouault, "Genuinely Distributed Byzantine Machine Learning", PODC 2020.

    Precondition: n > 2f, and C(n, f) ≤ ``max_subsets`` (the number of
    subsets of n − f clients, exponential in f: the cap keeps an exact search
    within seconds; raise it to allow more, or use the fallback).
    """

    max_subsets: int = hyper(10_000_000, "MDA searches the C(n, f) subsets of n − f clients; "
                             "larger searches are refused (precondition)", cli="mda-max-subsets")
    fallback: str = fallback_field()

    name: ClassVar[str] = "mda"
    coordinatewise: ClassVar[bool] = False
    combines_by_weights: ClassVar[bool] = True
    weighs_by_distances: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_max_subsets("mda", self.max_subsets)

    def _condition(self, n: int, f: int) -> str | None:
        return subset_search_condition(n, f, self.max_subsets)

    def _aggregate(self, X, arrays, n_samples, f, backend):
        D2, ok = client_distances(X, arrays, backend)
        res = self._from_distances(D2, ok, n_samples, f, search=backend)
        res.arrays = combine(arrays, res.weights, backend)
        return res

    def _from_distances(self, D2, ok, n_samples, f, error=None, search="numba"):
        # the search compares squared distances only: the same subset from a matrix the
        # round summed by parts (docs/performance.md, "Robust rounds on shared rows")
        n = D2.shape[0]
        finite = np.flatnonzero(ok)
        if finite.size == 0:
            raise NothingFinite(
                f"mda: every client (n={n}) holds NaN or ±inf in its features or uploads; "
                "there is nothing finite to aggregate"
            )
        k = n - f
        if finite.size > k:
            sub, d2 = min_diameter_subset(D2[np.ix_(finite, finite)], k, search)
            chosen = finite[sub]
        else:
            # beyond the assumption (more than f non-finite clients): every finite one
            chosen = finite
            d2 = float(D2[np.ix_(finite, finite)].max())
        w = np.zeros(n)
        w[chosen] = n_samples[chosen]
        w /= w.sum()
        diag = {"selected": jsonable(chosen), "diameter": jsonable(math.sqrt(d2)),
                "short": int(k - chosen.size), "nonfinite_clients": jsonable(np.flatnonzero(~ok))}
        return AggregationResult({}, w, (w > 0).astype(np.float64), diag)
