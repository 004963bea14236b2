"""Weighted combination of uploaded rows, and the finiteness of clients.

``combine_rows(A, w) = Σᵢ wᵢ · A[i]`` with float64 sums, over the rows with
wᵢ ≠ 0 only: a row that a rule gave weight 0 takes no part, even if it holds
NaN (0 · NaN would be NaN). The result has A's dtype.

A sum of finite float64 values that overflows (rows near ±1.8e308: a weighted mean
whose rounding carries it past DBL_MAX, or weights summing to more than 1) is
computed again at that coordinate as T · m, T = Σ wᵢ and m the weighted mean of
:func:`rfrs_ref.kernels.blocks.overflow_free_mean`, in every backend; finite sums
are untouched, bit for bit.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
from numba import njit, prange

from rfrs_ref.kernels.blocks import add_weighted_block, live_rows, overflow_free_mean
from rfrs_ref.kernels.distances import as_float_matrix, n_chunks
from rfrs_ref.kernels.weiszfeld import rows_finite

BLOCK = 1024


def combine_rows_numpy(A: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Oracle of :func:`combine_rows`."""
    A = np.asarray(A)
    w = np.asarray(w, dtype=np.float64)
    use = w != 0
    with np.errstate(over="ignore", invalid="ignore"):
        out = (w[use, None] * np.asarray(A[use], dtype=np.float64)).sum(axis=0)
    refit_overflowed(A, w, out)
    return out.astype(A.dtype)


def refit_overflowed(A: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """In place: every entry of ``out`` = Σᵢ wᵢ·A[i] (rows with wᵢ ≠ 0) that is not
    finite although every value it sums is (the float64 sum overflowed) becomes
    T · m, T = Σ wᵢ and m = :func:`~rfrs_ref.kernels.blocks.overflow_free_mean` of
    the column: finite whenever the exact sum is representable (it is for weights
    that sum to at most 1). Weights must be ≥ 0 (otherwise nothing is changed).
    Finite entries are never read: the normal path pays one test per entry."""
    bad = np.flatnonzero(~np.isfinite(out))
    if bad.size == 0:
        return out
    use = np.flatnonzero(w != 0)
    if use.size == 0 or not (w[use] > 0).all():
        return out
    V = np.asarray(np.asarray(A)[np.ix_(use, bad)], dtype=np.float64)
    fin = np.isfinite(V).all(axis=0)
    if fin.any():
        W = w[use]
        with np.errstate(over="ignore"):
            out[bad[fin]] = W.sum() * overflow_free_mean(V[:, fin], W[:, None])
    return out


@njit(cache=True, parallel=True)
def _combine_rows_numba(A, w, out, block, nchunks):
    """``out`` = Σᵢ wᵢ·A[i]; returns how many entries of ``out`` are not finite."""
    n, D = A.shape
    nblocks = (D + block - 1) // block
    live, nl = live_rows(w)
    bad = np.zeros(nchunks, dtype=np.int64)
    for c in prange(nchunks):
        acc = np.empty(block)
        for b in range(c * nblocks // nchunks, (c + 1) * nblocks // nchunks):
            k0 = b * block
            bw = min(D, k0 + block) - k0
            acc[:bw] = 0.0
            add_weighted_block(A, w, live, nl, k0, bw, acc)
            o = out[k0:k0 + bw]
            nb = 0
            for k in range(bw):
                o[k] = acc[k]
                nb += not (o[k] - o[k] == 0)
            bad[c] += nb
    return bad.sum()


@njit(cache=True, parallel=True)
def _add_rows_numba(A, w, acc, block, nchunks):
    n, D = A.shape
    nblocks = (D + block - 1) // block
    live, nl = live_rows(w)
    for c in prange(nchunks):
        for b in range(c * nblocks // nchunks, (c + 1) * nblocks // nchunks):
            k0 = b * block
            bw = min(D, k0 + block) - k0
            add_weighted_block(A, w, live, nl, k0, bw, acc[k0:k0 + bw])


def add_rows_inplace(A: np.ndarray, w: np.ndarray, acc: np.ndarray) -> None:
    """``acc += Σᵢ wᵢ · A[i]`` over the rows with wᵢ ≠ 0, in place (acc float64 (D,)).

    The same operations, in the same order, as :func:`combine_rows` on the numba
    backend: called on consecutive batches of rows, each a multiple of four rows
    with wᵢ ≠ 0 but the last, starting from ``acc`` = 0, it leaves in ``acc`` the
    float64 sums ``combine_rows`` rounds to A's dtype on all the rows at once, bit
    for bit (the rows are summed four at a time, in order, into a running sum per
    coordinate; no fast-math in either kernel). The round that recomputes its
    uploads (docs/performance.md, "Robust rounds in low memory") sums so.
    """
    M = as_float_matrix(A, "A")
    w = np.ascontiguousarray(w, dtype=np.float64)
    if acc.dtype != np.float64 or acc.shape != (M.shape[1],) or not acc.flags.c_contiguous:
        raise ValueError(f"acc must be a contiguous float64 array of shape ({M.shape[1]},), "
                         f"got {acc.dtype} {acc.shape}")
    if w.shape != (M.shape[0],):
        raise ValueError(f"w must have one weight per row, shape ({M.shape[0]},), got {w.shape}")
    _add_rows_numba(M, w, acc, BLOCK, n_chunks(M.shape[1], BLOCK))


def combine_rows(A: np.ndarray, w: np.ndarray, *, backend: str = "numba") -> np.ndarray:
    """Σᵢ wᵢ · A[i] over the rows with wᵢ ≠ 0, float64 sums, in A's dtype.

    Args:
        A: (n, D) array. w: (n,) weights. backend: numpy, numba or cuda.
    """
    w = np.ascontiguousarray(w, dtype=np.float64)
    if backend == "numpy":
        return combine_rows_numpy(A, w)
    M = np.asarray(A)
    dtype = M.dtype
    M = as_float_matrix(M, "A")
    if backend == "cuda":
        from rfrs_ref.kernels import cuda as _cuda

        out = _cuda.combine_rows_cuda(M, w)
        refit_overflowed(M, w, out)
        return out.astype(dtype, copy=False)
    out = np.empty(M.shape[1], dtype=M.dtype)
    if _combine_rows_numba(M, w, out, BLOCK, n_chunks(M.shape[1], BLOCK)):
        refit_overflowed(M, w, out)
    return out.astype(dtype, copy=False)


def finite_clients(X: np.ndarray, arrays: Mapping[str, np.ndarray], backend: str = "numba") -> np.ndarray:
    """(n,) bool: the clients whose feature row and every uploaded row are finite.

    An array that is the features themselves (the same object) is not read twice, and
    the arrays of a :class:`rfrs_ref.aggregate.base.FiniteUploads` (values the caller
    has checked finite: the round's verified uploads) are not read at all.
    """
    from rfrs_ref.aggregate.base import FiniteUploads

    def check(M):
        if backend == "numpy":
            with np.errstate(invalid="ignore"):
                return np.isfinite(np.asarray(M)).all(axis=1)
        return rows_finite(as_float_matrix(M, "array"))

    ok = check(X)
    if isinstance(arrays, FiniteUploads):
        return ok
    for A in arrays.values():
        if A is X:
            continue
        ok &= check(A)
    return ok
