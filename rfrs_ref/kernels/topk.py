"""Top-K ranking with training items excluded (evaluation, docs/training.md).

Ties are broken towards the smaller item id, and NaN scores rank below every
number, so a ranking is a pure function of the scores.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


def topk_numpy(scores: np.ndarray, exclude_indptr, exclude_indices, k: int) -> np.ndarray:
    """Oracle: the k best items of every row, best first, excluded items removed.

    Row r excludes ``exclude_indices[exclude_indptr[r]:exclude_indptr[r + 1]]``.
    Returns int64 (n_rows, k); -1 where a row has fewer than k candidates.
    """
    n_rows, n_items = scores.shape
    out = np.full((n_rows, k), -1, dtype=np.int64)
    for r in range(n_rows):
        s = np.asarray(scores[r], dtype=np.float64).copy()
        s[np.isnan(s)] = -np.inf
        keep = np.ones(n_items, dtype=bool)
        keep[exclude_indices[exclude_indptr[r] : exclude_indptr[r + 1]]] = False
        cand = np.flatnonzero(keep)
        # lexsort: primary key -score, secondary key item id
        order = cand[np.lexsort((cand, -s[cand]))]
        # -inf scores (NaN) still rank, after every finite score, by id
        out[r, : min(k, order.size)] = order[:k]
    return out


@njit(cache=True, parallel=True)
def topk_numba(scores, exclude_indptr, exclude_indices, k):
    """Numba version of :func:`topk_numpy` (same result, bit for bit)."""
    n_rows, n_items = scores.shape
    out = np.full((n_rows, k), -1, dtype=np.int64)
    for r in prange(n_rows):
        excluded = np.zeros(n_items, dtype=np.bool_)
        for p in range(exclude_indptr[r], exclude_indptr[r + 1]):
            excluded[exclude_indices[p]] = True
        best_s = np.full(k, -np.inf)
        best_i = np.full(k, -1, dtype=np.int64)
        filled = 0
        for j in range(n_items):
            if excluded[j]:
                continue
            s = np.float64(scores[r, j])
            if s != s:
                s = -np.inf
            # ascending j: an equal score never displaces an earlier (smaller) id
            if filled < k:
                pos = filled
                filled += 1
            elif s > best_s[k - 1]:
                pos = k - 1
            else:
                continue
            while pos > 0 and s > best_s[pos - 1]:
                best_s[pos] = best_s[pos - 1]
                best_i[pos] = best_i[pos - 1]
                pos -= 1
            best_s[pos] = s
            best_i[pos] = j
        for q in range(k):
            out[r, q] = best_i[q]
    return out
