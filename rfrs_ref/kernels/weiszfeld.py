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

from rfrs_ref.kernels.blocks import add_weighted_block, live_rows, overflow_free_mean
from rfrs_ref.kernels.distances import as_float_matrix, n_chunks, pairwise_sq_dists64, sq_dists64_error

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
    with np.errstate(over="ignore", invalid="ignore"):
        z = (alpha[use, None] * X64[use]).sum(axis=0) / alpha[use].sum()
    over = ~np.isfinite(z)
    if over.any():
        # the sum of finite rows overflowed (rows near ±1.8e308): the mean without overflow
        z[over] = overflow_free_mean(X64[np.ix_(use, over)], alpha[use, None])
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

    Where Σ αᵢxᵢ overflows although the rows are finite (rows near ±1.8e308), z
    is :func:`~rfrs_ref.kernels.blocks.overflow_free_mean` there, in every backend.

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
    z, dist = _weiszfeld_pass_numba(Xc, alpha, BLOCK, n_chunks(Xc.shape[1], BLOCK))
    over = ~np.isfinite(z)
    if over.any():
        # the sum of finite rows overflowed (rows near ±1.8e308): those coordinates are
        # the oracle's mean without overflow (not in the kernel, whose ``reassoc`` would
        # be free to undo the scaling), and the distances are measured again
        use = alpha > 0
        z[over] = overflow_free_mean(Xc[np.ix_(use, over)], alpha[use, None])
        dist = distances_to_numpy(Xc, z)
    return z, dist


def geometric_median(
    X: np.ndarray,
    weights: np.ndarray,
    *,
    nu: float = 1e-6,
    tol: float = 1e-6,
    max_iter: int = 100,
    backend: str = "numba",
    finite: np.ndarray | None = None,
    method: str = "auto",
    restart: bool = False,
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

    Restart (``restart=True``; off by default, Pillutla et al.'s iteration starts
    at the mean and never restarts): where the iteration from the mean ends
    without meeting the test after ``max_iter`` > 0 steps (3 of 8 rows at 1e38
    pull the mean out, and Weiszfeld comes back by a constant factor a step: z at
    5.4e10 after 100 steps for honest rows of 1e-3, ``converged`` False, which is
    what ``restart=False`` returns), it runs again, in passes, from the
    coordinate-wise median of the finite rows, and the result of the lower
    objective F is returned (ties: the first). F(z1) − F(z2) is summed term by term as
    (z1 − z2) · ((z1 − xᵢ) + (z2 − xᵢ)) / (‖z1 − xᵢ‖ + ‖z2 − xᵢ‖), since F itself
    at the scale of a far row rounds the honest rows' part away. A restart
    taken has ``start`` = ``"median (the mean did not converge)"`` and its own
    ``iterations``, ``objective`` and ``converged``. An iteration that converges
    from the mean is returned as without the restart, bit for bit.

    Huge but finite rows keep a positive weight: distances whose sum of squares
    overflows are measured in scaled form (module docstring).

    Two ways to take the steps (``method``), the same iteration:

    - ``"passes"``: each step is one pass over X (:func:`weiszfeld_pass`), which
      computes z and every distance to it.
    - ``"distances"``: every iterate is z = Σⱼ aⱼxⱼ with aⱼ = αⱼ/Σα, so with the
      matrix Dⱼₖ = ‖xⱼ − xₖ‖² of the finite rows (one pass,
      :func:`~rfrs_ref.kernels.distances.pairwise_sq_dists64`)

          ‖z − xᵢ‖² = Σⱼ aⱼDⱼᵢ − ½ Σⱼₖ aⱼaₖDⱼₖ,   ‖z − z′‖² = −½ Σⱼₖ cⱼcₖDⱼₖ (c = a − a′),

      and a step costs O(n²) instead of a pass over n × D values. The identity
      subtracts, so each value is checked against its rounding bound: with
      ε = ε_D + (2n + 6)u (ε_D the matrix's bound, u = 2⁻⁵³), the computed
      ‖z − xᵢ‖² errs by at most Bᵢ = ε · (Σⱼ aⱼDⱼᵢ + ½ aᵀDa). A step whose every
      Bᵢ ≤ ρ · max(‖z − xᵢ‖², ν²), ρ = 2⁻³⁰ (each distance, and so each weight
      αᵢ, within about 5e-10 of its exact value at that iterate), is taken on the
      matrix; otherwise (z at a data point, or a row so far out that its pull
      cancels the others' digits) the iteration goes on in passes from that
      step, computing z itself once. The stopping test is decided on the matrix
      only when ‖z − z′‖² ± its bound ε · ½ |c|ᵀD|c| falls on one side of the
      threshold; otherwise z and z′ are computed and the test is taken on them.
      The z returned is computed once at the end (``want_z``). Rows with inf
      distances in the matrix (float64 rows beyond about 1e154) take the passes
      throughout.

    ``"auto"`` (the default) takes the distances on the numba backend when
    2 ≤ n_finite ≤ 100 (the matrix costs about (n − 1)/11 passes, and RFA's rounds
    take about 9–20 steps), the passes otherwise (the NumPy oracle and CUDA always
    pass). With ``tol = 0`` the iteration stops only where the weights did not move
    at all (the passes stop where z did not, which rounding can reach a step sooner).
    The two differ in the last bits of the distances (both within about 1e-13 of
    exact arithmetic, the matrix's by the bound above), so their weights agree to
    about ρ, and where a stopping test falls within rounding of its threshold
    they may stop one step apart, as two backends may.

    Returns a dict: ``z`` (float64 (D,)), ``dist`` (float64 (n,) distances to z),
    ``alpha`` (the final Weiszfeld weights wᵢ / max(ν, ‖z − xᵢ‖), 0 for
    infinitely far rows, not normalised), ``iterations``, ``converged``,
    ``objective`` (history, one value per iterate), ``last_step`` (‖z_t − z_{t−1}‖),
    ``start``, ``method`` (``"passes"``, ``"distances"``, or
    ``"distances, then passes from step k"``); with ``restart=True`` also
    ``restarted`` (whether the restart ran, taken or not) and, where it did,
    ``iterations_from_mean`` and ``iterations_from_median`` (the steps of each run).

    ``finite`` (optional, (n,) bool) marks the rows allowed to take part, when
    the caller already knows it; rows with weight 0 never take part either.
    ``want_z=False`` (a keyword of :func:`geometric_median_weights`) skips the
    final z on the distances path.
    """
    return _geometric_median(X, weights, nu=nu, tol=tol, max_iter=max_iter, backend=backend,
                             finite=finite, method=method, want_z=True, restart=restart)


def geometric_median_weights(X, weights, **kw) -> dict:
    """:func:`geometric_median` for a caller that needs the weights only: on the
    distances path the final z is not computed (``z`` is None)."""
    return _geometric_median(X, weights, want_z=False, **kw)


#: Largest number of finite rows for which ``method="auto"`` steps on the matrix.
GRAM_MAX_ROWS = 100
#: Relative accuracy a squared distance from the identity must be certain of.
GRAM_RHO = 2.0 ** -30


def _geometric_median(X, weights, *, nu=1e-6, tol=1e-6, max_iter=100, backend="numba",
                      finite=None, method="auto", want_z=True, restart=False) -> dict:
    if method not in ("auto", "passes", "distances"):
        raise ValueError(f"unknown method {method!r}; choose one of: auto, passes, distances")
    X = np.asarray(X)
    w = np.asarray(weights, dtype=np.float64)
    if finite is None:
        with np.errstate(invalid="ignore"):
            finite = (np.isfinite(X).all(axis=1) if backend == "numpy"
                      else rows_finite(as_float_matrix(X, "X")))
    finite = finite & (w > 0)
    if not finite.any():
        raise ValueError("the geometric median needs at least one finite row; every row holds NaN or ±inf")
    nf = int(finite.sum())
    if method == "distances" and backend != "numba":
        raise ValueError(f"method='distances' runs on the numba backend, not {backend!r}")
    res = None
    if method == "distances" or (method == "auto" and backend == "numba" and 2 <= nf <= GRAM_MAX_ROWS):
        res = _geometric_median_distances(X, w, finite, nu=nu, tol=tol, max_iter=max_iter,
                                          want_z=want_z)
    if res is None:
        res = _geometric_median_passes(X, w, finite, nu=nu, tol=tol, max_iter=max_iter,
                                       backend=backend)
    if (finite & ~np.isfinite(res["dist"])).any():
        # a finite row farther than float64's range (float64 rows near ±1e308): the
        # same iteration on the rows scaled by a power of two
        scaled = _geometric_median_scaled(X, w, finite, nu=nu, tol=tol, max_iter=max_iter,
                                          backend=backend, method=method, want_z=want_z,
                                          restart=restart)
        if scaled is not None:
            return scaled
    if not restart:
        res.pop("z_weights", None)
        return res
    res["restarted"] = False
    if max_iter > 0 and not res["converged"] and res["start"] == "mean":
        # from the mean, a far group pulls z out and Weiszfeld comes back by a constant
        # factor a step: the iteration again from the coordinate-wise median, and the
        # result of the lower objective (ties: the first)
        again = _geometric_median_passes(X, w, finite, nu=nu, tol=tol, max_iter=max_iter,
                                         backend=backend, start="median")
        again["start"] = "median (the mean did not converge)"
        first_iterations = res["iterations"]
        z_first = res["z"]
        if z_first is None:
            z_first = weiszfeld_pass(as_float_matrix(X, "X"), res["z_weights"],
                                     backend="numba")[0]
        if _objective_difference(X, w, finite, z_first, again["z"]) > 0:
            res = again
        res["restarted"] = True
        res["iterations_from_mean"] = first_iterations
        res["iterations_from_median"] = again["iterations"]
    res.pop("z_weights", None)
    return res


def _objective_difference(X, w, finite, z1, z2) -> float:
    """F(z1) − F(z2) = Σ wᵢ (‖z1 − xᵢ‖ − ‖z2 − xᵢ‖) over the finite rows, each term
    as (z1 − z2) · ((z1 − xᵢ) + (z2 − xᵢ)) / (‖z1 − xᵢ‖ + ‖z2 − xᵢ‖): F itself, at the
    scale of a far row (1e38), rounds away the honest rows' part, and two iterates
    10 orders of magnitude apart would tie. A term that is not finite that way is the
    plain difference of the distances."""
    delta = np.asarray(z1, dtype=np.float64) - z2
    total = 0.0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for i in np.flatnonzero(finite):  # row by row: no float64 copy of X
            x = np.asarray(X[i], dtype=np.float64)[None, :]
            d1 = float(distances_to_numpy(x, z1)[0])
            d2 = float(distances_to_numpy(x, z2)[0])
            s = d1 + d2
            if s == 0.0:
                continue
            t = float(np.dot((z1 - x[0]) / s + (z2 - x[0]) / s, delta))
            if not np.isfinite(t):
                t = d1 - d2
            total += float(w[i]) * t
    return total


def _geometric_median_scaled(X, w, finite, *, nu, tol, max_iter, backend, method, want_z,
                             restart=False):
    """The iteration on X · 2⁻ᵏ (ν · 2⁻ᵏ), k the least that brings every distance
    between finite rows within float64's range; z, the distances, the objective and
    the last step scaled back by 2ᵏ (a distance beyond the range is then +inf, as is
    an objective), ``alpha`` left as computed on the scaled rows (2ᵏ times the
    unscaled formula's: only ratios matter) and ``scale_exponent`` = k. None when no
    scaling is needed or possible."""
    X64 = np.asarray(X, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        M = float(np.abs(X64[finite]).max())
    if not (0 < M < np.inf):
        return None
    # every coordinate within 2^(1021 − h) of 0, h = ⌈log₂ √D⌉: distances < 2^1022
    h = int(np.ceil(0.5 * np.log2(max(X64.shape[1], 1))))
    k = int(np.frexp(M)[1]) + h + 2 - 1023
    if k <= 0:
        return None
    nu_s = float(np.ldexp(nu, -k)) or nu
    res = _geometric_median(np.ldexp(X64, -k), w, nu=nu_s, tol=tol, max_iter=max_iter,
                            backend=backend, finite=finite, method=method, want_z=want_z,
                            restart=restart)
    with np.errstate(over="ignore"):
        if res["z"] is not None:
            res["z"] = np.ldexp(res["z"], k)
        res["dist"] = np.ldexp(res["dist"], k)
        res["objective"] = [float(np.ldexp(v, k)) for v in res["objective"]]
        res["last_step"] = float(np.ldexp(res["last_step"], k))
    res["scale_exponent"] = k
    return res


def _median_start(X, finite):
    """The coordinate-wise median of the finite rows, and every row's distance to it."""
    z = np.median(np.asarray(X, dtype=np.float64)[finite], axis=0)
    return z, distances_to_numpy(X, z)


def _geometric_median_passes(X, w, finite, *, nu, tol, max_iter, backend, resume=None,
                             start="auto") -> dict:
    """The iteration in passes over X; ``resume`` = (z, dist, iterations, objective,
    step) continues one that the distances path started. ``start``: ``"auto"`` (the
    weighted mean, or the coordinate-wise median where every distance to the mean
    exceeds √ of the float64 range) or ``"median"``."""
    if start not in ("auto", "median"):
        raise ValueError(f"unknown start {start!r}; choose one of: auto, median")
    if resume is None:
        if start == "median":
            z, dist = _median_start(X, finite)
        else:
            alpha = np.where(finite, w, 0.0)
            z, dist = weiszfeld_pass(X, alpha, backend=backend)
            start = "mean"
            if not (dist[finite] <= SQRT_DBL_MAX).any():
                # Weiszfeld from that far out approaches the majority by a constant
                # factor per step: hundreds of steps from 1e200
                start = "median"
                z, dist = _median_start(X, finite)
        dist = np.where(finite, dist, np.inf)
        use = np.isfinite(dist) & finite
        objective = [float(np.dot(w[use], dist[use]))]
        it = 0
        step = np.inf
        method = "passes"
    else:
        z, dist, it, objective, step = resume
        use = np.isfinite(dist) & finite
        start = "mean"
        method = f"distances, then passes from step {it + 1}"
    converged = False
    while it < max_iter and use.any():
        alpha = np.where(use, w / np.maximum(nu, dist), 0.0)
        z_prev = z
        z, dist = weiszfeld_pass(X, alpha, backend=backend)
        it += 1
        use = np.isfinite(dist) & finite
        objective.append(float(np.dot(w[use], dist[use])))
        step = float(np.linalg.norm(z - z_prev))
        if not use.any():
            break  # every distance beyond float64's range (the caller scales the rows)
        if step <= tol * max(nu, weighted_median(dist[use], w[use])):
            converged = True
            break
    alpha = np.where(use, w / np.maximum(nu, dist), 0.0)
    if not alpha.any():
        # every distance overflowed: the data's own spread exceeds float64
        alpha = np.where(finite, w, 0.0)
    return {"z": z, "dist": dist, "alpha": alpha, "iterations": it, "converged": converged,
            "objective": objective, "last_step": step, "start": start, "method": method}


def _gram_distances(Dm, a, eps, nu):
    """Squared distances of every row to z = Σ aⱼxⱼ (Σ a = 1) from the matrix, and
    whether every one is certain to relative ``GRAM_RHO`` (docstring of
    :func:`geometric_median`)."""
    s = Dm @ a
    c = 0.5 * float(a @ s)
    d2 = s - c
    bound = eps * (s + c)
    ok = bool((bound <= GRAM_RHO * np.maximum(d2, nu * nu)).all())
    return np.maximum(d2, 0.0), ok


def _geometric_median_distances(X, w, finite, *, nu, tol, max_iter, want_z):
    """The iteration on the matrix of the finite rows' distances; None when the matrix
    itself is out of float64's range (the passes then handle the huge rows)."""
    rows = np.flatnonzero(finite)
    Xc = as_float_matrix(X, "X")
    Dm = pairwise_sq_dists64(Xc, rows)
    if not np.isfinite(Dm).all():
        return None
    n, m = Xc.shape[0], rows.size
    eps = sq_dists64_error(Xc.shape[1]) + (2 * m + 6) * 2.0 ** -53

    def z_of(a_f):
        alpha = np.zeros(n)
        alpha[rows] = a_f
        return weiszfeld_pass(Xc, alpha, backend="numba")

    def passes(resume):
        return _geometric_median_passes(Xc, w, finite, nu=nu, tol=tol, max_iter=max_iter,
                                        backend="numba", resume=resume)

    return _weiszfeld_on_matrix(Dm, eps, w, finite, rows, n, nu=nu, tol=tol, max_iter=max_iter,
                                z_of=z_of, passes=passes, want_z=want_z)


def geometric_median_weights_on_matrix(Dm: np.ndarray, error: float, weights: np.ndarray,
                                       finite: np.ndarray, *, nu: float = 1e-6,
                                       tol: float = 1e-6, max_iter: int = 100,
                                       restart: bool = False) -> dict | None:
    """:func:`geometric_median_weights` from the squared distances of the rows alone,
    for a caller that computed them otherwise (the robust round on shared rows,
    docs/performance.md, "Robust rounds on shared rows").

    Args:
        Dm: float64 (n, n), Dm[i, j] the squared distance of rows i and j, each entry
            between finite rows within ``error`` (relative) of the exact sum, as
            :func:`~rfrs_ref.kernels.distances.pairwise_sq_dists64`'s are within
            ``sq_dists64_error``; entries with a non-finite row are not read.
        error: that relative bound (the step's certainty test adds the identity's own
            rounding, (2m + 6)u, as on the rows).
        weights: (n,) nᵢ ≥ 0. finite: (n,) bool, the rows that take part.

    Returns:
        The dict :func:`geometric_median_weights` returns when the iteration on the
        rows would run on their matrix throughout (2 to ``GRAM_MAX_ROWS`` finite rows
        of positive weight, a finite matrix, every step's distances certain, no step
        within rounding of the stopping threshold); otherwise None: that iteration
        needs the rows themselves (z, or the passes), and the caller must give them.
        With ``Dm`` the matrix :func:`pairwise_sq_dists64` computes and ``error`` its
        ``sq_dists64_error``, the weights are those of the rows, bit for bit. With
        ``restart=True``, None too where the iteration ends unconverged after
        ``max_iter`` > 0 steps: the rows' iteration then restarts from the
        coordinate-wise median, which needs the rows (with ``restart=False``, the
        default, the unconverged weights are returned, as the rows' iteration ends).
    """
    w = np.asarray(weights, dtype=np.float64)
    finite = np.asarray(finite, dtype=bool) & (w > 0)
    rows = np.flatnonzero(finite)
    if not 2 <= rows.size <= GRAM_MAX_ROWS:
        return None
    sub = np.ascontiguousarray(np.asarray(Dm, dtype=np.float64)[np.ix_(rows, rows)])
    if not np.isfinite(sub).all():
        return None
    eps = float(error) + (2 * rows.size + 6) * 2.0 ** -53
    res = _weiszfeld_on_matrix(sub, eps, w, finite, rows, w.shape[0], nu=nu, tol=tol,
                               max_iter=max_iter, z_of=None, passes=None, want_z=False)
    if res is None or (finite & ~np.isfinite(res["dist"])).any():
        return None
    res.pop("z_weights")
    if not restart:
        return res
    if max_iter > 0 and not res["converged"]:
        # the rows' iteration restarts from the coordinate-wise median, which needs them
        return None
    res["restarted"] = False
    return res


def _weiszfeld_on_matrix(Dm, eps, w, finite, rows, n, *, nu, tol, max_iter, z_of, passes,
                         want_z):
    """Weiszfeld's steps on the finite rows' matrix ``Dm`` (relative error ``eps`` with
    the identity's); ``z_of(a)`` computes z = Σ aⱼxⱼ and ``passes(resume)`` continues
    in passes over the rows, for the steps the matrix cannot decide: where either is
    None such a step returns None."""
    wf = w[rows]
    a = wf / wf.sum()
    d2, ok = _gram_distances(Dm, a, eps, nu)
    if not ok:
        return None
    dist_f = np.sqrt(d2)
    objective = [float(np.dot(wf, dist_f))]
    it = 0
    step = np.inf
    converged = False
    while it < max_iter:
        alpha_f = wf / np.maximum(nu, dist_f)
        a_new = alpha_f / alpha_f.sum()
        d2_new, ok = _gram_distances(Dm, a_new, eps, nu)
        if not ok:
            if z_of is None or passes is None:
                return None
            # continue in passes from this step: z_t (the current iterate) once
            z, dist = z_of(a)
            dist = np.where(finite, dist, np.inf)
            return passes((z, dist, it, objective, step))
        it += 1
        c = a_new - a
        q = Dm @ c
        step2 = -0.5 * float(c @ q)
        step_bound = eps * 0.5 * float(np.abs(c) @ (Dm @ np.abs(c)))
        a, d2 = a_new, d2_new
        dist_f = np.sqrt(d2)
        objective.append(float(np.dot(wf, dist_f)))
        threshold = tol * max(nu, weighted_median(dist_f, wf))
        if threshold == 0.0:
            # tol = 0 stops only on a step of exactly zero: the weights did not move
            step = float(np.sqrt(max(step2, 0.0)))
            if not c.any():
                converged = True
                break
            continue
        if step2 + step_bound <= threshold * threshold:
            step = float(np.sqrt(max(step2, 0.0)))
            converged = True
            break
        if step2 - step_bound > threshold * threshold:
            step = float(np.sqrt(step2))
            continue
        # within rounding of the threshold: decide on z and z′ themselves
        if z_of is None:
            return None
        z_prev, _ = z_of(a - c)
        z_now, _ = z_of(a)
        step = float(np.linalg.norm(z_now - z_prev))
        if step <= threshold:
            converged = True
            break
    alpha_f = wf / np.maximum(nu, dist_f)
    alpha = np.zeros(n)
    alpha[rows] = alpha_f
    dist = np.full(n, np.inf)
    dist[rows] = dist_f
    z = z_of(a)[0] if want_z and z_of is not None else None
    z_weights = np.zeros(n)
    z_weights[rows] = a
    return {"z": z, "dist": dist, "alpha": alpha, "iterations": it,
            "converged": converged, "objective": objective, "last_step": step, "start": "mean",
            "method": "distances", "z_weights": z_weights}


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
