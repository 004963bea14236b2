"""Row mixing of the pre-aggregators (docs/aggregation.md, pre-aggregation).

    mix_rows(M, A, S)[j] = S + Σᵢ M[j, i] · (A[i] − S)        (float64 sums)

M is a non-negative (n′, n) matrix, A an (n, D) upload, S the server's (D,)
value of that array (the reference); where M's rows sum to 1 the reference
cancels, A′ = M A, and S may be None. The result has A's dtype.

Conventions shared by every backend:

- **Zero weights take no part.** A row i with M[j, i] = 0 cannot reach output
  row j, even if it holds NaN or ±inf (0 · NaN would be NaN): every backend
  sums over the non-zero weights only.
- **Float64 sums**, rounded once to A's dtype; convex combinations of float32
  values stay in float32's range.

Backends: ``"numpy"`` (the oracle: one output row at a time, the sum over the
rows with M[j, i] ≠ 0 in float64), and ``"numba"``/``"cuda"``: a diagonal M
(clipping) scales each row in one pass; any other M (NNM, bucketing) is summed
row by row over its non-zero entries in the oracle's order, in one parallel
Numba pass over column blocks (each input row's float64 difference from S
computed once per block, and the terms added four at a time: the same
additions in the same order), each distinct row of M once (rows of M equal bit
for bit give equal rows: the others are copied). Both give the oracle's result bit for bit
(tested, hostile values included), reading A once and doing n′·nnz(row)·D
multiply-adds, vectorised along the columns.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from rfrs_ref.kernels.distances import as_float_matrix, n_chunks

# columns per block of the diagonal scaling (one pass, each row once)
BLOCK = 1024


def mix_rows_numpy(M: np.ndarray, A: np.ndarray, S: np.ndarray | None = None) -> np.ndarray:
    """Oracle of :func:`mix_rows`."""
    M = np.asarray(M, dtype=np.float64)
    A = np.asarray(A)
    out = np.empty((M.shape[0], A.shape[1]), dtype=A.dtype)
    s = None if S is None else np.asarray(S, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(M.shape[0]):
            # the terms added one row at a time, in index order: ``sum(axis=0)`` would
            # sum pairwise where the rows form one contiguous run (D = 1)
            acc = np.zeros(A.shape[1])
            for i in np.flatnonzero(M[j] != 0):
                row = np.asarray(A[i], dtype=np.float64)
                acc += M[j, i] * (row if s is None else row - s)
            out[j] = acc if s is None else s + acc
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
def _mix_numba(A, ptr, cols, vals, S, has_ref, out, dest, block, nchunks):
    """out[dest[j]] = S + Σ_{p in row j} vals[p] · (A[cols[p]] − S) in float64, the terms added
    in the oracle's order (the rows of j's non-zero weights by index), so every entry is
    the oracle's, bit for bit.

    A block of columns at a time: first every row's differences dᵢ = A[i] − S of the
    block in float64 (each computed once, not once per output row that uses it: the
    same operation on the same operands, so the same value), then every output row
    summed from them, its terms added four at a time,
    acc ← (((acc + w₀d₀) + w₁d₁) + w₂d₂) + w₃d₃: the additions of one at a time, in the
    same order (no fastmath: nothing is reassociated), with one load and store of the
    accumulator per four terms instead of one per term."""
    m = ptr.size - 1
    n, D = A.shape
    nblocks = (D + block - 1) // block
    for c in prange(nchunks):
        acc = np.empty(block)
        d = np.empty((n, block))
        for b in range(c * nblocks // nchunks, (c + 1) * nblocks // nchunks):
            k0 = b * block
            bw = min(D, k0 + block) - k0
            s = S[k0:k0 + bw]
            for i in range(n):
                a = A[i, k0:k0 + bw]
                di = d[i]
                if has_ref:
                    for k in range(bw):
                        di[k] = np.float64(a[k]) - s[k]
                else:
                    for k in range(bw):
                        di[k] = np.float64(a[k])
            for j in range(m):
                for k in range(bw):
                    acc[k] = 0.0
                p = ptr[j]
                p1 = ptr[j + 1]
                while p + 4 <= p1:
                    d0 = d[cols[p]]
                    d1 = d[cols[p + 1]]
                    d2 = d[cols[p + 2]]
                    d3 = d[cols[p + 3]]
                    w0 = vals[p]
                    w1 = vals[p + 1]
                    w2 = vals[p + 2]
                    w3 = vals[p + 3]
                    for k in range(bw):
                        acc[k] = (((acc[k] + w0 * d0[k]) + w1 * d1[k]) + w2 * d2[k]) + w3 * d3[k]
                    p += 4
                while p < p1:
                    dp = d[cols[p]]
                    w = vals[p]
                    for k in range(bw):
                        acc[k] += w * dp[k]
                    p += 1
                o = out[dest[j], k0:k0 + bw]
                if has_ref:
                    for k in range(bw):
                        o[k] = s[k] + acc[k]
                else:
                    for k in range(bw):
                        o[k] = acc[k]


@njit(cache=True, parallel=True)
def _copy_rows_numba(out, src, dst, block, nchunks):
    """out[dst[r]] = out[src[r]] for every r, one parallel pass over column blocks."""
    D = out.shape[1]
    nblocks = (D + block - 1) // block
    for c in prange(nchunks):
        for b in range(c * nblocks // nchunks, (c + 1) * nblocks // nchunks):
            k0 = b * block
            k1 = min(D, k0 + block)
            for r in range(src.size):
                a = out[src[r]]
                o = out[dst[r]]
                for k in range(k0, k1):
                    o[k] = a[k]


def distinct_rows(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, group): ``first`` the index of each distinct row of M (bit for bit: the
    rows' bytes, so −0.0 and 0.0 differ and equal rows are the same computation), in
    increasing order; ``group[j]`` the position in ``first`` of row j's first copy."""
    keys = np.ascontiguousarray(M).view(np.uint64)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    rep = first[np.asarray(inverse).reshape(-1)]  # each row's first copy
    first = np.sort(first).astype(np.int64)
    return first, np.searchsorted(first, rep).astype(np.int64)


def _mix_block(n: int) -> int:
    """Columns per block of :func:`_mix_numba`: the n rows of float64 differences
    (n · block · 8 bytes) stay within about 200 KiB, in L2 beside the float32 rows."""
    return 512 if n <= 48 else 256


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
        _scale_rows_numba(Af, np.diagonal(M).copy(), ref, has_ref, out, BLOCK,
                          n_chunks(D, BLOCK))
        return out.astype(A.dtype, copy=False)
    # rows of M that are equal bit for bit give equal rows (the same operations on the
    # same values): each distinct row is summed once, into its first row, and copied to
    # the others. NNM's honest rows often share one neighbour set (the n − f honest
    # clients when the Byzantine ones lie apart): 18 rows, 3 to 5 distinct, on Last.fm
    first, group = distinct_rows(M)
    U = M[first]
    # every row's non-zero weights, in index order (the oracle's order of summation)
    ptr = np.concatenate([[0], np.cumsum(np.count_nonzero(U, axis=1))]).astype(np.int64)
    rows, cols = np.nonzero(U)
    block = _mix_block(n)
    _mix_numba(Af, ptr, cols.astype(np.int64), U[rows, cols].copy(), ref, S is not None, out,
               first, block, n_chunks(D, block))
    copies = np.flatnonzero(first[group] != np.arange(M.shape[0]))
    if copies.size:
        _copy_rows_numba(out, first[group[copies]], copies.astype(np.int64), BLOCK,
                         n_chunks(D, BLOCK))
    return out.astype(A.dtype, copy=False)
