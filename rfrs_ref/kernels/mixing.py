"""Row mixing of the pre-aggregators (docs/aggregation.md, pre-aggregation).

    mix_rows(M, A, S)[j] = S + Σᵢ M[j, i] · (A[i] − S)        (float64 sums)

M is a non-negative (n′, n) matrix, A an (n, D) upload, S the server's (D,)
value of that array (the reference); where M's rows sum to 1 the reference
cancels, A′ = M A, and S may be None. The result has A's dtype.

Conventions shared by every backend:

- **Zero weights take no part.** A row i with M[j, i] = 0 cannot reach output
  row j, even if it holds NaN or ±inf (0 · NaN would be NaN): the oracle skips
  it, the fast path computes those entries apart.
- **Float64 sums**, rounded once to A's dtype; convex combinations of float32
  values stay in float32's range.

Backends: ``"numpy"`` (the oracle: one output row at a time, the sum over the
rows with M[j, i] ≠ 0 in float64), and ``"numba"``/``"cuda"``: a diagonal M
(clipping) scales each row in one pass; a sparse M (at most a quarter of its
entries non-zero, e.g. bucketing) is summed row by row over its non-zero
entries in the oracle's order, in one parallel Numba pass over column blocks;
any other M is applied to blocks of
columns converted to float64 by the BLAS matrix product (``M @ block``), with
non-finite entries zeroed first and every output entry that a non-zero weight
ties to such an entry recomputed as the oracle does. The fast path reads A once
and does the n′·n·D multiply-adds of a matrix product; its sums run in another
order than the oracle's (agreement within float64 rounding, tested).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from rfrs_ref.kernels.distances import as_float_matrix, n_chunks

# columns per block of the matrix product: 100 rows × 4096 float64 values
# (3.2 MiB) keep the block and its product in cache while BLAS runs
BLOCK = 4096

# a mixing matrix with at most 1/SPARSE_RATIO of its entries non-zero is summed row by
# row in Numba (bucketing: s of n per row); denser ones (nnm: n − f of n) go to BLAS
SPARSE_RATIO = 4


def mix_rows_numpy(M: np.ndarray, A: np.ndarray, S: np.ndarray | None = None) -> np.ndarray:
    """Oracle of :func:`mix_rows`."""
    M = np.asarray(M, dtype=np.float64)
    A = np.asarray(A)
    out = np.empty((M.shape[0], A.shape[1]), dtype=A.dtype)
    s = None if S is None else np.asarray(S, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(M.shape[0]):
            use = np.flatnonzero(M[j] != 0)
            rows = np.asarray(A[use], dtype=np.float64)
            if s is None:
                acc = (M[j, use, None] * rows).sum(axis=0)
            else:
                acc = s + (M[j, use, None] * (rows - s)).sum(axis=0)
            out[j] = acc
    return out


@njit(cache=True, parallel=True)
def _scale_rows_numba(A, scale, S, has_ref, out, block, nchunks):
    n, D = A.shape
    nblocks = (D + block - 1) // block
    for c in prange(nchunks):
        for b in range(c * nblocks // nchunks, (c + 1) * nblocks // nchunks):
            k0 = b * block
            k1 = min(D, k0 + block)
            for i in range(n):
                s = scale[i]
                if has_ref:
                    for k in range(k0, k1):
                        r = S[k]
                        out[i, k] = r + s * (np.float64(A[i, k]) - r)
                else:
                    for k in range(k0, k1):
                        out[i, k] = s * np.float64(A[i, k])


@njit(cache=True, parallel=True)
def _mix_sparse_numba(A, ptr, cols, vals, S, has_ref, out, block, nchunks):
    """out[j] = S + Σ_{p in row j} vals[p] · (A[cols[p]] − S): the oracle's order of summation."""
    m = ptr.size - 1
    D = A.shape[1]
    nblocks = (D + block - 1) // block
    for c in prange(nchunks):
        acc = np.empty(block)
        for b in range(c * nblocks // nchunks, (c + 1) * nblocks // nchunks):
            k0 = b * block
            bw = min(D, k0 + block) - k0
            for j in range(m):
                acc[:bw] = 0.0
                for p in range(ptr[j], ptr[j + 1]):
                    i = cols[p]
                    w = vals[p]
                    if has_ref:
                        for k in range(bw):
                            acc[k] += w * (np.float64(A[i, k0 + k]) - S[k0 + k])
                    else:
                        for k in range(bw):
                            acc[k] += w * np.float64(A[i, k0 + k])
                for k in range(bw):
                    out[j, k0 + k] = acc[k] + S[k0 + k] if has_ref else acc[k]


def _is_diagonal(M: np.ndarray) -> bool:
    return M.shape[0] == M.shape[1] and not np.any(M - np.diag(np.diagonal(M)))


def mix_rows(M: np.ndarray, A: np.ndarray, S: np.ndarray | None = None, *,
             backend: str = "numba", zero_reference: bool = False,
             out: np.ndarray | None = None) -> np.ndarray:
    """S + M (A − S) row by row, float64 sums, in A's dtype (see the module docstring).

    Args:
        M: (n′, n) non-negative mixing matrix. A: (n, D) upload.
        S: (D,) reference (the server's value of the array), or None when every
            row of M sums to 1 (then it cancels and is not needed).
        backend: numpy (oracle), numba or cuda.
        zero_reference: S is known to be 0 (features): the fast path then scales
            without reading S.
        out: a C-contiguous (n′, D) array of A's float dtype, not overlapping A, to
            write the result into (the fast paths; the oracle allocates its own):
            writing into memory already touched saves the page faults of a fresh
            n′ × D array, which cost more than the mixing itself. Ignored when its
            shape or dtype does not fit.
    """
    M = np.ascontiguousarray(M, dtype=np.float64)
    if S is None and not np.allclose(M.sum(axis=1), 1.0, rtol=0, atol=1e-12):
        raise ValueError("mixing rows that do not sum to 1 needs the reference S (the server's "
                         "value of the array)")
    if backend == "numpy":
        return mix_rows_numpy(M, A, S)
    Af = as_float_matrix(A, "A")
    n, D = Af.shape
    if M.shape[1] != n:
        raise ValueError(f"the mixing matrix has {M.shape[1]} columns but A has {n} rows")
    ref = np.zeros(D) if S is None else np.ascontiguousarray(S, dtype=np.float64)
    if (out is None or out.shape != (M.shape[0], D) or out.dtype != Af.dtype
            or not out.flags.c_contiguous or np.shares_memory(out, Af)):
        out = np.empty((M.shape[0], D), dtype=Af.dtype)
    if _is_diagonal(M):
        has_ref = S is not None and not zero_reference
        _scale_rows_numba(Af, np.diagonal(M).copy(), ref, has_ref, out, 1024,
                          n_chunks(D, 1024))
        return out.astype(A.dtype, copy=False)
    nnz = int(np.count_nonzero(M))
    if nnz * SPARSE_RATIO <= M.size:
        # few rows per output row (bucketing): sum them directly, reading only those rows
        ptr = np.concatenate([[0], np.cumsum(np.count_nonzero(M, axis=1))]).astype(np.int64)
        rows, cols = np.nonzero(M)
        _mix_sparse_numba(Af, ptr, cols.astype(np.int64), M[rows, cols].copy(), ref, S is not None,
                          out, 1024, n_chunks(D, 1024))
        return out.astype(A.dtype, copy=False)
    support = (M != 0).astype(np.float64)
    for k0 in range(0, D, BLOCK):
        k1 = min(D, k0 + BLOCK)
        B = Af[:, k0:k1].astype(np.float64)
        if S is not None:
            B -= ref[k0:k1]
        bad = ~np.isfinite(B)
        if bad.any():
            B0 = np.where(bad, 0.0, B)
            P = M @ B0
            touched = (support @ bad.astype(np.float64)) > 0
            for j, k in zip(*np.nonzero(touched)):
                use = M[j] != 0
                with np.errstate(over="ignore", invalid="ignore"):
                    P[j, k] = np.sum(M[j, use] * B[use, k])
        else:
            P = M @ B
        if S is not None:
            P += ref[k0:k1]
        out[:, k0:k1] = P
    return out.astype(A.dtype, copy=False)
