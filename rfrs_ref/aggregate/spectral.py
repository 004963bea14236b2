"""``caf`` and ``smea``: rules that bound the spread of what they average by the
largest eigenvalue of its empirical covariance (docs/aggregation.md).

Both need only the n × n squared distances D2 of the features: for weights c
(s = Σ cᵢ) and μ = Σ cᵢxᵢ/s, the centred inner products are

    Kᵢⱼ = (xᵢ − μ)·(xⱼ − μ) = −½ (D2ᵢⱼ − rᵢ − rⱼ + q),   rᵢ = Σₖ cₖD2ᵢₖ/s,  q = Σₖ cₖrₖ/s,

and the non-zero eigenvalues of the covariance Σₖ cₖ(xₖ − μ)(xₖ − μ)ᵀ/s are
those of the n × n matrix diag(√c) K diag(√c)/s. So the features are read once
(the distances, by direct differences: :mod:`rfrs_ref.kernels.distances`), and
every eigenvalue is exact to rounding (LAPACK's symmetric solver), where
ByzFL runs one power iteration from a random vector.

Float64 rows near ±1e308 have squared distances beyond float64's range (+inf),
and huge finite ones can overflow the centred products: such a computation is
done again on the distances of the rows scaled by 2⁻ᵏ (k from the largest
|value|, so that every product stays far within range; the eigenvalue is then
λ′·4ᵏ, compared exactly), and CAF's filter then works on the rows still weighted
only, so once the huge rows' weights are 0 the others are compared unscaled.
Inputs whose computation stays finite take the plain path, bit for bit.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from fractions import Fraction
from typing import ClassVar

import numpy as np

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
from rfrs_ref.kernels.distances import pairwise_sq_dists
from rfrs_ref.params import hyper


class Overflowed(ArithmeticError):
    """A centred product, covariance entry or projection left float64's range (rows
    near ±1e308): the caller computes it again on scaled distances."""


def centred_products(D2: np.ndarray, c: np.ndarray) -> np.ndarray:
    """K (n × n): (xᵢ − μ)·(xⱼ − μ), μ the c-weighted mean, from squared distances.
    Raises :class:`Overflowed` where K is not finite (an infinite distance, or
    products beyond float64's range)."""
    s = c.sum()
    with np.errstate(over="ignore", invalid="ignore"):
        r = D2 @ c / s
        q = c @ r / s
        K = -0.5 * (D2 - r[:, None] - r[None, :] + q)
    if not np.isfinite(K).all():
        raise Overflowed("centred products beyond float64's range")
    return K


def top_eigen(K: np.ndarray, c: np.ndarray) -> tuple[float, np.ndarray]:
    """(λ_max, b) of the c-weighted covariance: λ_max its largest eigenvalue, and
    b = a∘√c for the unit eigenvector a of diag(√c) K diag(√c)/s, so that the
    covariance's eigenvector in feature space is ∝ Σⱼ bⱼ(xⱼ − μ)."""
    s = c.sum()
    rc = np.sqrt(c)
    with np.errstate(over="ignore", invalid="ignore"):
        B = rc[:, None] * K * rc[None, :] / s
        B = (B + B.T) / 2
    if not np.isfinite(B).all():
        raise Overflowed("covariance entries beyond float64's range")
    vals, vecs = np.linalg.eigh(B)
    return max(float(vals[-1]), 0.0), vecs[:, -1] * rc


def scaled_distances(X: np.ndarray, rows: np.ndarray, backend: str) -> tuple[np.ndarray, int]:
    """(D2′, k): the squared distances of the rows ``rows`` of X scaled by 2⁻ᵏ, k ≥ 0 the
    least that keeps every entry below 2^998/n (so that the centred products, the
    covariance and its projections stay within range): D2 = D2′ · 4ᵏ."""
    X64 = np.asarray(X, dtype=np.float64)[rows]
    m = rows.size
    M = float(np.abs(X64).max(initial=0.0))
    top = (998 - math.ceil(math.log2(max(X64.shape[1], 1))) - math.ceil(math.log2(max(m, 1)))
           - 2) // 2
    k = max(0, int(np.frexp(M)[1]) - top) if M > 0 else 0
    return pairwise_sq_dists(np.ldexp(X64, -k), backend=backend), k


def _exact(lam: float, k: int):
    """λ′·4ᵏ exactly (a Fraction; +inf stays a float), for comparing eigenvalues
    computed at different scales."""
    return lam if not math.isfinite(lam) else Fraction(lam) * 4 ** k


def _robust_top(D2: np.ndarray, c: np.ndarray, scaled) -> tuple[float, int, np.ndarray, np.ndarray]:
    """(λ′, k, b, K) of the c-weighted rows: on D2 itself where it stays in range
    (k = 0), else on ``scaled()`` = (D2′, k)."""
    try:
        K = centred_products(D2, c)
        lam, b = top_eigen(K, c)
        return lam, 0, b, K
    except Overflowed:
        D2s, k = scaled()
        K = centred_products(D2s, c)
        lam, b = top_eigen(K, c)
        return lam, k, b, K


@dataclasses.dataclass(frozen=True)
class CAF(Rule):
    r"""Covariance-bound agnostic filter (Allouah et al. 2024), on the detection
    features.

    Formula: weights cᵢ = 1; while Σ cᵢ > n − 2f: μ = Σ cᵢxᵢ/Σ cᵢ, (λ, u) the
    top eigenpair of the covariance Σ cᵢ(xᵢ − μ)(xᵢ − μ)ᵀ/Σ cᵢ, remember μ if
    λ is the smallest so far, τᵢ = (u·(xᵢ − μ))², cᵢ ← cᵢ(1 − τᵢ/max τ). The
    result is the remembered μ: every uploaded array is combined with that
    step's weights,

        Ā = Σ cᵢnᵢ · A[i] / Σ cᵢnᵢ

    Conventions: the filter's weights c are unweighted (nᵢ cannot buy a client
    its weight), the combination is weighted by nᵢ (ByzFL's ``CAF`` returns
    μ: the same for equal nᵢ). Eigenpairs are exact (module docstring; ByzFL
    runs one power iteration from ``np.random.randn``, so its eigenvalue is a
    random underestimate and its result random: the two agree where one
    iteration is exact, e.g. D = 1, tested). A step whose covariance is 0
    (every weighted row equal) ends the filter: its μ is optimal (ByzFL
    divides by zero there). Ties of the smallest eigenvalue keep the earlier
    step. τ's maximum is taken over the rows still weighted (ByzFL takes it
    over every row: once an outlier's weight is 0 its τ stays the largest and
    the filter then barely moves the others, for as many steps as it takes;
    the filter's analysis weighs only the rows in play). Each step zeroes the
    weight of the largest τ, so there are at most n steps of O(n³).

    Hostile input: a client with a NaN or ±inf in its features or any upload
    starts with cᵢ = 0 (it takes no part); with every client non-finite the
    rule raises ``ValueError``. Huge finite rows (1e38) give huge, exact
    distances (float64) and are filtered like any outlier.

    Guarantee (tested): the result is a convex combination of finite rows
    with filter weight Σ cᵢ > n − 2f (the loop's condition at the step it
    remembers; when no step runs, as with f = 0, every finite row with
    weight 1: the nᵢ-weighted mean), and its covariance's largest eigenvalue is the smallest the
    filter met, at most that of all finite rows. Allouah et al. bound
    ‖μ − x̄_H‖ by O(√(λ_H·f/n)), λ_H the honest covariance's largest eigenvalue,
    under their assumptions (not a per-example law: not tested as one).

    Reference: Y. Allouah, R. Guerraoui, J. Stephan, "Towards Trustworthy
    Federated Learning with Untrusted Participants", 2024 (arXiv:2505.01874;
    CAF), as implemented by ByzFL 0.0.11.

    Precondition: n > 2f.
    """

    fallback: str = fallback_field()

    name: ClassVar[str] = "caf"
    coordinatewise: ClassVar[bool] = False
    combines_by_weights: ClassVar[bool] = True

    def _condition(self, n: int, f: int) -> str | None:
        return None if n > 2 * f else "n > 2f"

    def _aggregate(self, X, arrays, n_samples, f, backend):
        n = X.shape[0]
        D2all, ok = client_distances(X, arrays, backend)
        fin = np.flatnonzero(ok)
        if fin.size == 0:
            raise NothingFinite(f"caf: every client (n={n}) holds NaN or ±inf in its features or "
                             "uploads; there is nothing finite to aggregate")
        D2 = D2all[np.ix_(fin, fin)]
        try:
            best, best_c, steps, eigen = _caf_filter(D2, n, f)
        except Overflowed:
            # rows near ±1e308: the filter on the rows still weighted, scaled where needed
            cache = []

            def scaled():
                if not cache:
                    cache.append(scaled_distances(X, fin, backend))
                return cache[0]

            best, best_c, steps, eigen = _caf_filter_scaled(D2, n, f, scaled)
        w = np.zeros(n)
        w[fin] = best_c * n_samples[fin]
        w /= w.sum()
        out = combine(arrays, w, backend)
        diag = {"steps": steps, "eigenvalues": jsonable(eigen), "smallest_eigenvalue": jsonable(best),
                "filter_weights": jsonable(_expand(best_c, fin, n)),
                "nonfinite_clients": jsonable(np.flatnonzero(~ok))}
        return AggregationResult(out, w, (w > 0).astype(np.float64), diag)


def _caf_filter(D2: np.ndarray, n: int, f: int):
    """CAF's filter on the finite rows' distances: (smallest eigenvalue, its weights c,
    steps, eigenvalues). Raises :class:`Overflowed` where a step leaves float64's range."""
    c = np.ones(D2.shape[0])
    best, best_c, steps, eigen = math.inf, c.copy(), 0, []
    while c.sum() > n - 2 * f:
        steps += 1
        K = centred_products(D2, c)
        lam, b = top_eigen(K, c)
        eigen.append(lam)
        if lam < best:
            best, best_c = lam, c.copy()
        proj = K @ b  # ∝ u·(xᵢ − μ)
        with np.errstate(over="ignore", invalid="ignore"):
            tau = np.where(c > 0, proj * proj, 0.0)
        tmax = tau.max()
        if not np.isfinite(tau).all():
            raise Overflowed("projections beyond float64's range")
        if not tmax > 0:
            break  # no spread left among the weighted rows: this μ is optimal
        c = c * (1.0 - tau / tmax)
        c[c < 0] = 0.0
        c[int(np.argmax(tau))] = 0.0  # exactly, whatever the rounding of 1 − τ/τ
    return best, best_c, steps, eigen


def _caf_filter_scaled(D2: np.ndarray, n: int, f: int, scaled):
    """:func:`_caf_filter` where the plain one overflowed: each step on the rows still
    weighted (c > 0), on their distances where those stay in range and on the scaled
    ones (``scaled()`` = (D2′, k)) otherwise; eigenvalues compared exactly (λ′·4ᵏ),
    τ normalised by the largest projection before squaring."""
    m = D2.shape[0]
    c = np.ones(m)
    best, best_c, steps, eigen = None, c.copy(), 0, []
    while c.sum() > n - 2 * f:
        steps += 1
        live = np.flatnonzero(c > 0)
        sub = D2[np.ix_(live, live)]

        def sub_scaled():
            D2s, k = scaled()
            return D2s[np.ix_(live, live)], k

        try:
            lam, k, b, K = _robust_top(sub, c[live], sub_scaled)
        except Overflowed:  # pragma: no cover - the scaled distances are within range
            break
        with np.errstate(over="ignore"):
            eigen.append(float(np.ldexp(lam, 2 * k)))
        exact = _exact(lam, k)
        if best is None or exact < best:
            best, best_c = exact, c.copy()
        proj = K @ b
        pmax = np.abs(proj).max()
        if not pmax > 0:
            break  # no spread left among the weighted rows: this μ is optimal
        tau = np.zeros(m)
        tau[live] = (proj / pmax) ** 2
        c = c * (1.0 - tau / tau.max())
        c[c < 0] = 0.0
        c[int(np.argmax(tau))] = 0.0
    return _float(best), best_c, steps, eigen


def _float(x) -> float:
    """An exact eigenvalue (Fraction) as a float, +inf beyond float64's range."""
    if x is None:
        return math.inf
    try:
        return float(x)
    except OverflowError:
        return math.inf


def _expand(values, rows, n):
    out = np.zeros(n)
    out[rows] = values
    return out


def smallest_eigen_subset_numpy(D2: np.ndarray, k: int, scaled=None) -> tuple[np.ndarray, float]:
    """Oracle: every subset of k rows in ``itertools.combinations`` order; the first
    whose covariance has the smallest largest eigenvalue (plain mean).

    ``scaled`` (a callable returning (D2′, k′), :func:`scaled_distances`) takes over
    where a subset's computation leaves float64's range (:class:`Overflowed` is
    raised without it): see :func:`_smallest_eigen_subset_scaled`."""
    try:
        return _smallest_eigen_subset_plain(D2, k)
    except Overflowed:
        if scaled is None:
            raise
        return _smallest_eigen_subset_scaled(D2, k, scaled)


def _smallest_eigen_subset_plain(D2: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    n = D2.shape[0]
    best, best_l = None, math.inf
    for S in itertools.combinations(range(n), k):
        idx = np.array(S)
        lam, _ = top_eigen(centred_products(D2[np.ix_(idx, idx)], np.ones(k)), np.ones(k))
        if best is None or lam < best_l:
            best, best_l = idx, lam
    return best.astype(np.int64), float(best_l)


def _batched_subsets(n: int, k: int, chunk: int):
    it = itertools.combinations(range(n), k)
    while True:
        block = list(itertools.islice(it, chunk))
        if not block:
            return
        yield np.array(block, dtype=np.int64)


def _smallest_eigen_subset_scaled(D2: np.ndarray, k: int, scaled) -> tuple[np.ndarray, float]:
    """The oracle's loop where some subset's computation overflowed: each subset on its
    own distances where they stay in range, else on the scaled ones (``scaled()`` =
    (D2′, k′)); eigenvalues compared exactly (λ′·4ᵏ′), ties to the first subset."""
    best, best_l = None, None
    ones = np.ones(k)
    for S in itertools.combinations(range(D2.shape[0]), k):
        idx = np.array(S)

        def sub_scaled():
            D2s, ks = scaled()
            return D2s[np.ix_(idx, idx)], ks

        try:
            lam, ks, _, _ = _robust_top(D2[np.ix_(idx, idx)], ones, sub_scaled)
            exact = _exact(lam, ks)
        except Overflowed:  # pragma: no cover - the scaled distances are within range
            exact = math.inf
        if best is None or exact < best_l:
            best, best_l = idx, exact
    return best.astype(np.int64), _float(best_l)


def smallest_eigen_subset(D2: np.ndarray, k: int, backend: str = "numba",
                          chunk: int = 4096, scaled=None) -> tuple[np.ndarray, float]:
    """The first subset of k rows (lexicographic order) of smallest top covariance
    eigenvalue. ``"numpy"``: the oracle's loop; otherwise the subsets' centred
    products are built and solved in batches (``np.linalg.eigvalsh`` on a stack),
    in the same order; the values agree to rounding, so among subsets tied in exact
    arithmetic the two may keep different ones. Where a subset's computation leaves
    float64's range, both take :func:`_smallest_eigen_subset_scaled` (``scaled`` as
    in :func:`smallest_eigen_subset_numpy`)."""
    if backend == "numpy" or k < 2:
        return smallest_eigen_subset_numpy(D2, k, scaled)
    try:
        return _smallest_eigen_subset_batched(D2, k, chunk)
    except Overflowed:
        if scaled is None:
            raise
        return _smallest_eigen_subset_scaled(D2, k, scaled)


def _smallest_eigen_subset_batched(D2: np.ndarray, k: int, chunk: int) -> tuple[np.ndarray, float]:
    best, best_l = None, math.inf
    for S in _batched_subsets(D2.shape[0], k, chunk):
        sub = D2[S[:, :, None], S[:, None, :]]  # (m, k, k)
        with np.errstate(over="ignore", invalid="ignore"):
            r = sub.mean(axis=2)
            q = r.mean(axis=1)
            K = -0.5 * (sub - r[:, :, None] - r[:, None, :] + q[:, None, None])
            B = K / k
            B = (B + np.swapaxes(B, 1, 2)) / 2
        if not np.isfinite(B).all():
            raise Overflowed("covariance entries beyond float64's range")
        lam = np.linalg.eigvalsh(B)[:, -1]
        lam = np.maximum(lam, 0.0)
        j = int(np.argmin(lam))  # the first of equal values
        if best is None or lam[j] < best_l:
            best, best_l = S[j], float(lam[j])
    return best, best_l


@dataclasses.dataclass(frozen=True)
class SMEA(Rule):
    r"""Smallest maximum eigenvalue averaging (Allouah et al. 2024), on the
    detection features.

    Formula: among the subsets S of n − f clients, the one whose empirical
    covariance has the smallest largest eigenvalue,

        S* = argmin_{|S| = n − f} λ_max( (1/|S|) Σ_{i∈S} (xᵢ − μ_S)(xᵢ − μ_S)ᵀ ),

    μ_S the plain mean of S, and every uploaded array is the nᵢ-weighted mean
    over S*: Ā = Σ_{S*} nᵢ A[i] / Σ_{S*} nᵢ.

    Conventions: the choice is unweighted, the combination weighted by nᵢ
    (ByzFL's ``SMEA``: plain mean, the same for equal nᵢ); eigenvalues exact
    (module docstring; ByzFL: one power iteration from a random vector, so it
    may pick another subset; the two agree where one iteration is exact, e.g.
    D = 1, tested); equal computed eigenvalues go to the first subset in
    ``itertools.combinations`` order (ByzFL's too). The oracle loops over the
    subsets; the fast path solves them in batches, in the same order but with
    other rounding, so among subsets tied in exact arithmetic (copied rows)
    the two may keep different ones, of the same objective to rounding.

    Hostile input: a client with a NaN or ±inf in its features or any upload
    is never in S* while at most f clients are such (the search runs over the
    finite ones); beyond that S* is every finite client (``short``), and with
    none the rule raises ``ValueError``.

    Guarantee (tested): with at most f arbitrary rows, some n − f honest rows
    form a candidate, so λ_max(S*) is at most the largest covariance eigenvalue
    of every subset of n − f honest rows; S* holds at least n − 2f ≥ 1 honest
    rows and no non-finite one.

    Reference: Y. Allouah, R. Guerraoui, N. Gupta, R. Pinot, G. Rizk,
    "Robust Distributed Learning: Tight Error Bounds and Breakdown Point
    under Data Heterogeneity", NeurIPS 2023 (SMEA), as implemented by ByzFL
    0.0.11.

    Precondition: n > 2f and C(n, f) ≤ ``max_subsets`` (the search is
    combinatorial: C(100, 40) subsets are out of reach).
    """

    max_subsets: int = hyper(100_000, "SMEA searches the C(n, f) subsets of n − f clients; "
                             "larger searches are refused (precondition)", cli="smea-max-subsets")
    fallback: str = fallback_field()

    name: ClassVar[str] = "smea"
    coordinatewise: ClassVar[bool] = False
    combines_by_weights: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_max_subsets("smea", self.max_subsets)

    def _condition(self, n: int, f: int) -> str | None:
        return subset_search_condition(n, f, self.max_subsets)

    def _aggregate(self, X, arrays, n_samples, f, backend):
        n = X.shape[0]
        D2, ok = client_distances(X, arrays, backend)
        finite = np.flatnonzero(ok)
        if finite.size == 0:
            raise NothingFinite(f"smea: every client (n={n}) holds NaN or ±inf in its features or "
                             "uploads; there is nothing finite to aggregate")
        k = n - f
        sub = D2[np.ix_(finite, finite)]
        cache = []

        def scaled():  # rows near ±1e308: the distances of the rows scaled by 2⁻ᵏ
            if not cache:
                cache.append(scaled_distances(X, finite, backend))
            return cache[0]

        if finite.size > k:
            S, lam = smallest_eigen_subset(sub, k, backend, scaled=scaled)
            chosen = finite[S]
        else:
            chosen = finite
            ones = np.ones(finite.size)
            lam, ks, _, _ = _robust_top(sub, ones, scaled)
            lam = _float(_exact(lam, ks))
        w = np.zeros(n)
        w[chosen] = n_samples[chosen]
        w /= w.sum()
        out = combine(arrays, w, backend)
        diag = {"selected": jsonable(np.sort(chosen)), "max_eigenvalue": jsonable(lam),
                "short": int(k - chosen.size), "nonfinite_clients": jsonable(np.flatnonzero(~ok))}
        return AggregationResult(out, w, (w > 0).astype(np.float64), diag)
