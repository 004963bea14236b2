"""Weighted geometric median by smoothed Weiszfeld iterations (Pillutla et al. 2019).

Minimises ``F(z) = Σᵢ nᵢ ‖z − xᵢ‖`` over z ∈ R^D. One step maps z to

    z⁺ = Σᵢ αᵢ xᵢ / Σᵢ αᵢ,        αᵢ = nᵢ / max(ν, ‖z − xᵢ‖)

(the smoothing ν > 0 keeps the weights finite when z meets a point). Rows with a
non-finite value have αᵢ = 0: they are infinitely far and take no part.

Distances are never lost to overflow. A row whose sum of squares Σ (zₖ − xᵢₖ)²
overflows float64 (a distance beyond about 1.3e154) is measured again in the
scaled form of ``hypot`` and LAPACK's ``nrm2``, m · √Σ ((zₖ − xᵢₖ)/m)² with
m = maxₖ |zₖ − xᵢₖ|, so a huge but finite row keeps its tiny, positive weight
nᵢ/‖z − xᵢ‖ and its pull of nᵢ on the median (dropping it would move the
median: the rows [0, 0], [1, 0], [0, 1], [1, 1], [1e200, 0] have their median
near [0.812, 0.5], not at [0.5, 0.5]). Only a distance that itself exceeds the
float64 range is +inf. Rows whose plain sum does not overflow are measured as
before, so their distances are unchanged bit for bit.

A pass over X computes the next iterate and, in the same pass, the distances
of every row to it: the kernel reads a column block once for both, so each
Weiszfeld step costs one read of X. Sums are float64 whatever the input dtype.

Backends: ``"numpy"`` (float64 oracle, two passes per step), ``"numba"``
(fused, parallel over column blocks), ``"cuda"`` (:mod:`rfrs_ref.kernels.cuda`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from rfrs_ref.kernels.blocks import add_weighted_block, live_rows
from rfrs_ref.kernels.distances import as_float_matrix, n_chunks

BLOCK = 512


#: Largest float64: a sum of squares above it has overflowed.
DBL_MAX = float(np.finfo(np.float64).max)
#: Distances beyond it are those whose plain sum of squares overflows.
SQRT_DBL_MAX = float(np.sqrt(DBL_MAX))


def distances_to_numpy(X: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Float64 distances ‖z − xᵢ‖ of every row of X to z (oracle).

    The plain √Σ (zₖ − xᵢₖ)² where the sum of squares stays finite; where it
    overflows, the scaled m · √Σ ((zₖ − xᵢₖ)/m)², m = maxₖ |zₖ − xᵢₖ| (module
    docstring). +inf for a row with a NaN or ±inf, and for a distance beyond
    the float64 range; never NaN.
    """
    X64 = np.asarray(X, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        diff = X64 - z
        d = np.sqrt((diff ** 2).sum(axis=1))
        for i in np.flatnonzero(~np.isfinite(d)):
            m = np.abs(diff[i]).max()
            d[i] = m * np.sqrt(((diff[i] / m) ** 2).sum()) if np.isfinite(m) else np.inf
    d[~np.isfinite(d)] = np.inf
    return d


def weiszfeld_pass_numpy(X: np.ndarray, alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Oracle of one pass: ``z = Σ αᵢ xᵢ / Σ αᵢ`` over the rows with αᵢ > 0, and the
    float64 distances ‖z − xᵢ‖ of every row to it (:func:`distances_to_numpy`)."""
    X64 = np.asarray(X, dtype=np.float64)
    alpha = np.asarray(alpha, dtype=np.float64)
    use = alpha > 0
    z = (alpha[use, None] * X64[use]).sum(axis=0) / alpha[use].sum()
    return z, distances_to_numpy(X64, z)


@njit(cache=True)
def _scaled_distance(x, z):
    """m · √Σ ((zₖ − xₖ)/m)², m = maxₖ |zₖ − xₖ|: the distance of a row whose plain
    sum of squares overflowed; +inf if the row holds NaN or ±inf."""
    m = 0.0
    for k in range(x.shape[0]):
        a = abs(z[k] - np.float64(x[k]))
        if not a <= DBL_MAX:  # NaN or inf: infinitely far
            return np.inf
        m = max(m, a)
    if m == 0.0:
        return 0.0
    s = 0.0
    for k in range(x.shape[0]):
        q = (z[k] - np.float64(x[k])) / m
        s += q * q
    d = m * np.sqrt(s)
    return d if d <= DBL_MAX else np.inf


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract"})
def _weiszfeld_pass_numba(X, alpha, block, nchunks):
    """Fused pass. ``reassoc`` vectorises the per-row sums over a block; it does
    not touch inf or NaN (no ``nnan``/``ninf``)."""
    n, D = X.shape
    nblocks = (D + block - 1) // block
    asum = 0.0
    for i in range(n):
        if alpha[i] > 0:
            asum += alpha[i]
    # αᵢ ≥ 0 here (a non-finite row has αᵢ = 0), so the live rows are those with αᵢ > 0
    live, nl = live_rows(alpha)
    z = np.empty(D)
    acc = np.zeros((nchunks, n))
    for c in prange(nchunks):
        zb = np.empty(block)
        for b in range(c * nblocks // nchunks, (c + 1) * nblocks // nchunks):
            k0 = b * block
            bw = min(D, k0 + block) - k0
            zb[:bw] = 0.0
            add_weighted_block(X, alpha, live, nl, k0, bw, zb)
            for k in range(bw):
                zb[k] /= asum
                z[k0 + k] = zb[k]
            i = 0
            while i + 4 <= n:
                x0 = X[i, k0:k0 + bw]
                x1 = X[i + 1, k0:k0 + bw]
                x2 = X[i + 2, k0:k0 + bw]
                x3 = X[i + 3, k0:k0 + bw]
                s0 = 0.0
                s1 = 0.0
                s2 = 0.0
                s3 = 0.0
                for k in range(bw):
                    zk = zb[k]
                    d0 = zk - x0[k]
                    s0 += d0 * d0
                    d1 = zk - x1[k]
                    s1 += d1 * d1
                    d2 = zk - x2[k]
                    s2 += d2 * d2
                    d3 = zk - x3[k]
                    s3 += d3 * d3
                acc[c, i] += s0
                acc[c, i + 1] += s1
                acc[c, i + 2] += s2
                acc[c, i + 3] += s3
                i += 4
            while i < n:
                x = X[i, k0:k0 + bw]
                s = 0.0
                for k in range(bw):
                    d = zb[k] - x[k]
                    s += d * d
                acc[c, i] += s
                i += 1
    dist = np.empty(n)
    for i in range(n):
        s = 0.0
        for c in range(nchunks):
            s += acc[c, i]
        # NaN only from non-finite rows (infinitely far); an overflowed sum is
        # measured again, scaled (module docstring)
        dist[i] = np.sqrt(s) if s <= DBL_MAX else _scaled_distance(X[i], z)
    return z, dist


def weiszfeld_pass(
    X: np.ndarray, alpha: np.ndarray, *, backend: str = "numba"
) -> tuple[np.ndarray, np.ndarray]:
    """One fused pass: the weighted mean z of the rows with αᵢ > 0, and every
    row's Euclidean distance to z.

    Preconditions: X (n, D) float; alpha (n,) ≥ 0 with at least one αᵢ > 0 on a
    finite row (rows with αᵢ > 0 must be finite, or z is not).

    Returns:
        (z float64 (D,), distances float64 (n,), +inf for non-finite rows).
    """
    alpha = np.ascontiguousarray(alpha, dtype=np.float64)
    if not (alpha > 0).any():
        raise ValueError("a Weiszfeld pass needs at least one row with a positive weight")
    if backend == "numpy":
        return weiszfeld_pass_numpy(X, alpha)
    Xc = as_float_matrix(X, "X")
    if backend == "cuda":
        from rfrs_ref.kernels import cuda as _cuda

        return _cuda.weiszfeld_pass_cuda(Xc, alpha)
    if backend != "numba":
        raise ValueError(f"unknown backend {backend!r}; choose one of: numpy, numba, cuda")
    return _weiszfeld_pass_numba(Xc, alpha, BLOCK, n_chunks(Xc.shape[1], BLOCK))


def geometric_median(
    X: np.ndarray,
    weights: np.ndarray,
    *,
    nu: float = 1e-6,
    tol: float = 1e-6,
    max_iter: int = 100,
    backend: str = "numba",
    finite: np.ndarray | None = None,
) -> dict:
    """Smoothed Weiszfeld from the weighted mean of the finite rows.

    Iterates z_{t+1} = Σ αᵢ xᵢ / Σ αᵢ with αᵢ = wᵢ / max(ν, ‖z_t − xᵢ‖) until a
    step moves z by at most ``tol · max(ν, r)``, r being the w-weighted median of
    the distances ‖z − xᵢ‖ (the data's own scale around z), or ``max_iter``
    steps are done.

    Why not Pillutla et al.'s test on the objective F(z) = Σ wᵢ ‖z − xᵢ‖ (stop
    when it changes by less than ``tol · F``)? One row at 1e38 makes F about
    1e38 whatever z does near the honest rows, so that test stops while z is
    still far out (at 1e27 in a test case) and the aggregate is ruined. The
    weighted median distance is at the scale of the majority, whatever the rest.

    Start: the w-weighted mean of the finite rows (Pillutla et al.). When every
    distance to it exceeds about 1.3e154 (√ of the float64 range; features
    beyond about 1e150) the start is the coordinate-wise median of the finite
    rows instead (``start`` says which): from that far, Weiszfeld would need
    hundreds of steps to come back to the majority.

    Huge but finite rows keep a positive weight: distances whose sum of squares
    overflows are measured in scaled form (module docstring).

    Returns a dict: ``z`` (float64 (D,)), ``dist`` (float64 (n,) distances to z),
    ``alpha`` (the final Weiszfeld weights wᵢ / max(ν, ‖z − xᵢ‖), 0 for
    infinitely far rows, not normalised), ``iterations``, ``converged``,
    ``objective`` (history, one value per iterate), ``last_step`` (‖z_t − z_{t−1}‖),
    ``start``.

    ``finite`` (optional, (n,) bool) marks the rows allowed to take part, when
    the caller already knows it; rows with weight 0 never take part either.
    """
    X = np.asarray(X)
    w = np.asarray(weights, dtype=np.float64)
    if finite is None:
        with np.errstate(invalid="ignore"):
            finite = (np.isfinite(X).all(axis=1) if backend == "numpy"
                      else rows_finite(as_float_matrix(X, "X")))
    finite = finite & (w > 0)
    if not finite.any():
        raise ValueError("the geometric median needs at least one finite row; every row holds NaN or ±inf")
    alpha = np.where(finite, w, 0.0)
    z, dist = weiszfeld_pass(X, alpha, backend=backend)
    start = "mean"
    if not (dist[finite] <= SQRT_DBL_MAX).any():
        # Weiszfeld from that far out approaches the majority by a constant factor
        # per step: hundreds of steps from 1e200
        start = "median"
        z = np.median(np.asarray(X, dtype=np.float64)[finite], axis=0)
        dist = distances_to_numpy(X, z)
    dist = np.where(finite, dist, np.inf)
    use = np.isfinite(dist) & finite
    objective = [float(np.dot(w[use], dist[use]))]
    converged = False
    it = 0
    step = np.inf
    while it < max_iter and use.any():
        alpha = np.where(use, w / np.maximum(nu, dist), 0.0)
        z_prev = z
        z, dist = weiszfeld_pass(X, alpha, backend=backend)
        it += 1
        use = np.isfinite(dist) & finite
        objective.append(float(np.dot(w[use], dist[use])))
        step = float(np.linalg.norm(z - z_prev))
        if step <= tol * max(nu, weighted_median(dist[use], w[use])):
            converged = True
            break
    alpha = np.where(use, w / np.maximum(nu, dist), 0.0)
    if not alpha.any():
        # every distance overflowed: the data's own spread exceeds float64
        alpha = np.where(finite, w, 0.0)
    return {"z": z, "dist": dist, "alpha": alpha, "iterations": it, "converged": converged,
            "objective": objective, "last_step": step, "start": start}


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The smallest value v with Σ_{values ≤ v} weights ≥ half the total weight."""
    order = np.argsort(values, kind="stable")
    cw = np.cumsum(np.asarray(weights, dtype=np.float64)[order])
    return float(np.asarray(values)[order][np.searchsorted(cw, 0.5 * cw[-1])])


@njit(cache=True, parallel=True, fastmath={"reassoc"})
def _rows_finite_numba(X):
    n = X.shape[0]
    out = np.empty(n, dtype=np.bool_)
    for i in prange(n):
        x = X[i]
        p = x[0] * 0
        for k in range(x.shape[0]):
            p += x[k] - x[k]
        out[i] = p == 0
    return out


def rows_finite(X: np.ndarray) -> np.ndarray:
    """Which rows of X hold only finite values (one parallel pass over X)."""
    if X.shape[1] == 0:
        return np.ones(X.shape[0], dtype=bool)
    return _rows_finite_numba(X)
