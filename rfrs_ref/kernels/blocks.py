"""Column-block building blocks shared by the Numba kernels that sum weighted rows.

Inlined into their callers at Numba IR level (``inline="always"``), so each
caller compiles them with its own ``fastmath`` flags and loop context.

:func:`overflow_free_mean` (NumPy) is the weighted mean every kernel falls back on
where a float64 sum of finite values overflowed (values near ±1.8e308 times weights
that sum to more than 1, or rounding past DBL_MAX): its formula is the one the
Numba and CUDA kernels repeat for such a coordinate, so the backends agree there.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(inline="always")
def live_rows(w):
    """``(live, nl)``: the indices of the rows with a weight wᵢ ≠ 0, and how many.

    NaN counts as live (NaN ≠ 0); callers that want wᵢ > 0 pass such weights only.
    """
    n = w.shape[0]
    live = np.empty(n, dtype=np.int64)
    nl = 0
    for i in range(n):
        if w[i] != 0:
            live[nl] = i
            nl += 1
    return live, nl


@njit(inline="always")
def add_weighted_block(A, w, live, nl, k0, bw, acc):
    """``acc[k] += Σ_r w[live[r]] · A[live[r], k0 + k]`` for k < bw, float64.

    Four rows per sweep over the block: one load and store of the running sum
    feeds four rows, which is what bounds a weighted sum of many rows.
    """
    r = 0
    while r + 4 <= nl:
        i0, i1, i2, i3 = live[r], live[r + 1], live[r + 2], live[r + 3]
        w0, w1, w2, w3 = w[i0], w[i1], w[i2], w[i3]
        a0 = A[i0, k0:k0 + bw]
        a1 = A[i1, k0:k0 + bw]
        a2 = A[i2, k0:k0 + bw]
        a3 = A[i3, k0:k0 + bw]
        for k in range(bw):
            acc[k] += w0 * a0[k] + w1 * a1[k] + w2 * a2[k] + w3 * a3[k]
        r += 4
    while r < nl:
        i = live[r]
        wi = w[i]
        a = A[i, k0:k0 + bw]
        for k in range(bw):
            acc[k] += wi * a[k]
        r += 1


@njit(inline="always")
def add_weighted_block_of(A, row_of, w, live, nl, k0, bw, acc):
    """``add_weighted_block`` where weight i takes its values from row ``row_of[i]`` of A
    (rows that many weights share, e.g. one upload per class of client): the same
    operations in the same order, so the same bits as ``add_weighted_block`` on the
    matrix whose row i is A[row_of[i]]."""
    r = 0
    while r + 4 <= nl:
        i0, i1, i2, i3 = live[r], live[r + 1], live[r + 2], live[r + 3]
        w0, w1, w2, w3 = w[i0], w[i1], w[i2], w[i3]
        a0 = A[row_of[i0], k0:k0 + bw]
        a1 = A[row_of[i1], k0:k0 + bw]
        a2 = A[row_of[i2], k0:k0 + bw]
        a3 = A[row_of[i3], k0:k0 + bw]
        for k in range(bw):
            acc[k] += w0 * a0[k] + w1 * a1[k] + w2 * a2[k] + w3 * a3[k]
        r += 4
    while r < nl:
        i = live[r]
        wi = w[i]
        a = A[row_of[i], k0:k0 + bw]
        for k in range(bw):
            acc[k] += wi * a[k]
        r += 1


def overflow_free_mean(V: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Σᵢ Wᵢₖ Vᵢₖ / Σᵢ Wᵢₖ for every column k, computed so that no partial sum
    overflows: the values of a float64 weighted mean whose plain sum overflowed.

    ``4 · Σᵢ (Wᵢₖ/Tₖ)(Vᵢₖ/4)``, Tₖ = Σᵢ Wᵢₖ, in row order, clamped to the range of
    the column's values with Wᵢₖ > 0. The weights Wᵢₖ/Tₖ sum to 1 (to rounding)
    and every |Vᵢₖ/4| ≤ DBL_MAX/4, so no partial sum can overflow; the clamp keeps
    the result finite where rounding would carry it past a value at ±DBL_MAX (a
    weighted mean lies within its values' range). Quartering is exact for every
    |v| ≥ 2⁻¹⁰²⁰; only the subnormal digits of tiny values, far below the rounding
    of a sum that reached 1e308, are lost.

    Args:
        V: (m, c) values, finite wherever Wᵢₖ > 0 (anything elsewhere).
        W: (m, c) weights ≥ 0, broadcastable to V, with Tₖ > 0 and finite.
    """
    V = np.asarray(V, dtype=np.float64)
    W = np.broadcast_to(np.asarray(W, dtype=np.float64), V.shape)
    take = W > 0
    with np.errstate(invalid="ignore", over="ignore"):
        T = W.sum(axis=0)
        m = 4.0 * np.where(take, (W / T) * (V * 0.25), 0.0).sum(axis=0)
        lo = np.where(take, V, np.inf).min(axis=0)
        hi = np.where(take, V, -np.inf).max(axis=0)
    return np.minimum(np.maximum(m, lo), hi)
