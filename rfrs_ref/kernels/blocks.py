"""Column-block building blocks shared by the Numba kernels that sum weighted rows.

Inlined into their callers at Numba IR level (``inline="always"``), so each
caller compiles them with its own ``fastmath`` flags and loop context.
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
