"""CUDA kernels of the aggregation rules (``backend="cuda"``).

Imported only when the CUDA backend is asked for: importing this module
imports ``numba.cuda``. The kernels follow the NumPy oracles of
:mod:`~rfrs_ref.kernels.distances`, :mod:`~rfrs_ref.kernels.coordinatewise`
and :mod:`~rfrs_ref.kernels.weiszfeld` (same conventions, float64 sums):

- ``pairwise``: 16 × 16 output tiles; each block stages 16 rows of X and of Y,
  32 columns at a time, in shared memory and accumulates direct float64
  differences. Column ranges are split over the grid's third dimension (split
  K) and the partial sums are added atomically, so few rows still fill the GPU.
- ``coordinatewise``: one thread per coordinate; the s candidate values are
  sorted in a per-thread local array (insertion sort, stable by row), the
  window chosen, and every array accumulated over the kept rows.
- ``weiszfeld_pass``: one thread per coordinate computes zₖ, then each block
  reduces (zₖ − xᵢₖ)² over its coordinates in shared memory and adds the block
  sum into row i's distance atomically.
- ``combine_rows``: one thread per coordinate.

Compiling for a GPU needs NVVM: a CUDA toolkit that Numba finds (``CUDA_HOME``,
conda, or a system install such as /usr/local/cuda), or the project's ``gpu``
extra (``numba-cuda[cu12]``, NVIDIA's CUDA target for Numba, which replaces
``numba.cuda`` and brings NVVM as pip wheels). Tests run the kernels under
Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) and compile them to PTX
(:func:`compile_ptx`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float64, int32


#: Most candidate rows a coordinate-wise kernel sorts per thread (local array size).
MAX_ROWS = 256
TILE = 16
TILE_K = 32


def require_cuda() -> None:
    """Raise a clear error unless Numba sees a CUDA GPU (or the simulator)."""
    if not cuda.is_available():
        raise RuntimeError(
            "backend='cuda' needs an NVIDIA GPU visible to Numba (numba.cuda.is_available() is "
            "False: no device, no driver, or no NVVM; on a machine with an NVIDIA GPU, install "
            "the gpu extra, pip install 'rfrs-ref[gpu]', which brings NVVM). Use "
            "backend='numba' on a CPU, or set NUMBA_ENABLE_CUDASIM=1 to run the CUDA kernels "
            "in Numba's simulator (slow)."
        )


# --------------------------------------------------------------------------------------
# kernels (Python functions; compiled by cuda.jit below, by compile_ptx in the tests)


def _pairwise_kernel(X, Y, out, k_per_split):
    sx = cuda.shared.array((TILE, TILE_K), float64)
    sy = cuda.shared.array((TILE, TILE_K), float64)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    i = cuda.blockIdx.y * TILE + ty
    j = cuda.blockIdx.x * TILE + tx
    n = X.shape[0]
    m = Y.shape[0]
    D = X.shape[1]
    kbeg = cuda.blockIdx.z * k_per_split
    # a conditional, not min(): min on integers needs a device context to compile
    kend = kbeg + k_per_split if kbeg + k_per_split < D else D
    acc = 0.0
    k0 = kbeg
    while k0 < kend:
        # 256 threads stage 16 rows × 32 columns of X and of Y
        for r in range(2):
            col = tx + TILE * r
            gi = cuda.blockIdx.y * TILE + ty
            gj = cuda.blockIdx.x * TILE + ty
            kk = k0 + col
            sx[ty, col] = X[gi, kk] if (gi < n and kk < kend) else 0.0
            sy[ty, col] = Y[gj, kk] if (gj < m and kk < kend) else 0.0
        cuda.syncthreads()
        for c in range(TILE_K):
            d = sx[ty, c] - sy[tx, c]
            acc += d * d
        cuda.syncthreads()
        k0 += TILE_K
    if i < n and j < m:
        cuda.atomic.add(out, (i, j), acc)


def _rows_nonfinite_kernel(X, bad):
    n, D = X.shape
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for e in range(start, n * D, stride):
        if not math.isfinite(X[e // D, e % D]):
            bad[e // D] = 1


def _coordinatewise_kernel(F, A, out, weights, rows, mode, t, kept, bad):
    k = cuda.grid(1)
    D = F.shape[1]
    if k >= D:
        return
    s = rows.shape[0]
    nq = A.shape[0]
    keys = cuda.local.array(MAX_ROWS, float64)
    idx = cuda.local.array(MAX_ROWS, int32)
    inf = math.inf
    for r in range(s):
        i = rows[r]
        v = float64(F[i, k])
        # np.sort's order: NaN -> +inf, ±inf at their own end; a finite feature
        # with a non-finite upload value ranks as +inf
        if math.isnan(v):
            v = inf
        if math.isfinite(v):
            for q in range(nq):
                if not math.isfinite(A[q, i, k]):
                    v = inf
        # insertion sort by (value, row order): stable
        p = r
        while p > 0 and keys[p - 1] > v:
            keys[p] = keys[p - 1]
            idx[p] = idx[p - 1]
            p -= 1
        keys[p] = v
        idx[p] = r
    if mode == 0:
        L = t
        R = s - 1 - t
    else:
        if s % 2 == 1:
            med = keys[(s - 1) // 2]
        else:
            ma = keys[s // 2 - 1]
            mb = keys[s // 2]
            med = 0.5 * (ma + mb)
            if not math.isfinite(med) and math.isfinite(ma) and math.isfinite(mb):
                med = 0.5 * ma + 0.5 * mb  # a + b overflowed; halving is exact
        L = 0
        R = s - 1
        rem = 2 * t if mode == 1 else t
        for _ in range(rem):
            if (med - keys[L]) > (keys[R] - med):
                L += 1
            else:
                R -= 1
    finite_window = math.isfinite(keys[L]) and math.isfinite(keys[R])
    if not finite_window:
        cuda.atomic.add(bad, 0, 1)
    den = 0.0
    for p in range(L, R + 1):
        den += weights[rows[idx[p]]]
    for q in range(nq):
        num = 0.0
        for p in range(L, R + 1):
            i = rows[idx[p]]
            num += weights[i] * float64(A[q, i, k])
        res = num / den
        if finite_window and not math.isfinite(res):
            # a sum of finite values that overflowed: the oracle's overflow-free mean
            # (rfrs_ref.kernels.blocks.overflow_free_mean), in the same order
            acc = 0.0
            lo = math.inf
            hi = -math.inf
            for p in range(L, R + 1):
                i = rows[idx[p]]
                v = float64(A[q, i, k])
                acc += (weights[i] / den) * (v * 0.25)
                if v < lo:
                    lo = v
                if v > hi:
                    hi = v
            res = 4.0 * acc
            if res < lo:
                res = lo
            if res > hi:
                res = hi
        out[q, k] = res
    for p in range(L, R + 1):
        cuda.atomic.add(kept, rows[idx[p]], 1)


def _weiszfeld_kernel(X, alpha, asum, z, dist):
    tmp = cuda.shared.array(256, float64)
    k = cuda.grid(1)
    tid = cuda.threadIdx.x
    n, D = X.shape
    zk = 0.0
    if k < D:
        for i in range(n):
            a = alpha[i]
            if a > 0:
                zk += a * float64(X[i, k])
        zk /= asum
        if not math.isfinite(zk):
            # the sum of finite rows overflowed: the overflow-free mean
            # (rfrs_ref.kernels.blocks.overflow_free_mean), in row order. Written out here
            # as in the coordinate-wise kernel, not shared as a device function: compiling a
            # kernel that calls one needs a CUDA driver in numba.cuda, and compile_ptx must
            # work on machines without a GPU
            acc = 0.0
            lo = math.inf
            hi = -math.inf
            for i in range(n):
                a = alpha[i]
                if a > 0:
                    v = float64(X[i, k])
                    acc += (a / asum) * (v * 0.25)
                    if v < lo:
                        lo = v
                    if v > hi:
                        hi = v
            zk = 4.0 * acc
            if zk < lo:
                zk = lo
            if zk > hi:
                zk = hi
        z[k] = zk
    for i in range(n):
        if k < D:
            d = zk - float64(X[i, k])
            tmp[tid] = d * d
        else:
            tmp[tid] = 0.0
        cuda.syncthreads()
        step = cuda.blockDim.x // 2
        while step > 0:
            if tid < step:
                tmp[tid] += tmp[tid + step]
            cuda.syncthreads()
            step //= 2
        if tid == 0:
            cuda.atomic.add(dist, i, tmp[0])
        cuda.syncthreads()


def _combine_kernel(A, w, out):
    k = cuda.grid(1)
    n, D = A.shape
    if k >= D:
        return
    acc = 0.0
    for i in range(n):
        if w[i] != 0:
            acc += w[i] * float64(A[i, k])
    out[k] = acc


_SOURCES = {
    "pairwise": _pairwise_kernel,
    "rows_nonfinite": _rows_nonfinite_kernel,
    "coordinatewise": _coordinatewise_kernel,
    "weiszfeld": _weiszfeld_kernel,
    "combine": _combine_kernel,
}

#: Signatures compiled ahead of time by :func:`compile_ptx` (one per input dtype).
def ptx_signatures(dt: str) -> dict[str, str]:
    return {
        "pairwise": f"void({dt}[:, ::1], {dt}[:, ::1], float64[:, ::1], int64)",
        "rows_nonfinite": f"void({dt}[:, ::1], int32[::1])",
        "coordinatewise": (f"void({dt}[:, ::1], {dt}[:, :, ::1], float64[:, ::1], float64[::1], "
                           "int64[::1], int64, int64, int64[::1], int64[::1])"),
        "weiszfeld": f"void({dt}[:, ::1], float64[::1], float64, float64[::1], float64[::1])",
        "combine": f"void({dt}[:, ::1], float64[::1], float64[::1])",
    }


def compile_ptx(cc: tuple[int, int] = (8, 0)) -> dict[str, str]:
    """Compile every kernel to PTX for float32 and float64 inputs (needs NVVM, not a GPU).

    Returns name -> PTX text. Raises if NVVM is missing or a kernel does not compile.
    """
    out = {}
    for dt in ("float32", "float64"):
        for name, sig in ptx_signatures(dt).items():
            ptx, _ = cuda.compile_ptx(_SOURCES[name], sig, cc=cc)
            out[f"{name}[{dt}]"] = ptx
    return out


_JIT: dict = {}


def _kernel(name: str):
    if name not in _JIT:
        _JIT[name] = cuda.jit(_SOURCES[name])
    return _JIT[name]


def _blocks(total: int, threads: int) -> int:
    return max(1, (total + threads - 1) // threads)


def _threads(D: int, most: int) -> int:
    """A power of two ≥ 32 and ≤ ``most`` threads per block, no more than D needs."""
    t = 32
    while t < most and t < D:
        t *= 2
    return t


# --------------------------------------------------------------------------------------
# host wrappers (NumPy in, NumPy out)


def _rows_bad(dX) -> np.ndarray:
    bad = cuda.to_device(np.zeros(dX.shape[0], dtype=np.int32))
    total = dX.shape[0] * dX.shape[1]
    _kernel("rows_nonfinite")[min(_blocks(total, 256), 1024), 256](dX, bad)
    return bad.copy_to_host().astype(bool)


def pairwise_sq_dists_cuda(X: np.ndarray, Y: np.ndarray | None) -> np.ndarray:
    """CUDA version of :func:`rfrs_ref.kernels.distances.pairwise_sq_dists`."""
    require_cuda()
    dX = cuda.to_device(X)
    dY = dX if Y is None else cuda.to_device(Y)
    n, D = X.shape
    m = n if Y is None else Y.shape[0]
    out = cuda.to_device(np.zeros((n, m)))
    tiles = _blocks(n, TILE) * _blocks(m, TILE)
    # enough blocks for a large GPU, each with at least a few column tiles
    splits = max(1, min(_blocks(D, 4 * TILE_K), _blocks(1024, tiles)))
    k_per = _blocks(D, splits)
    k_per = _blocks(k_per, TILE_K) * TILE_K
    splits = _blocks(D, k_per)
    grid = (_blocks(m, TILE), _blocks(n, TILE), splits)
    _kernel("pairwise")[grid, (TILE, TILE)](dX, dY, out, k_per)
    res = out.copy_to_host()
    bad_x = _rows_bad(dX)
    bad_y = bad_x if Y is None else _rows_bad(dY)
    res[np.isnan(res)] = np.inf
    res[bad_x, :] = np.inf
    res[:, bad_y] = np.inf
    if Y is None:
        np.fill_diagonal(res, np.where(bad_x, np.inf, 0.0))
    return res


def coordinatewise_cuda(F, arrays, weights, mode, t, rows):
    """CUDA version of :func:`rfrs_ref.kernels.coordinatewise.coordinatewise_combine`."""
    require_cuda()
    if rows.size > MAX_ROWS:
        raise ValueError(f"the CUDA coordinate-wise kernel sorts at most {MAX_ROWS} rows per "
                         f"coordinate, got {rows.size}; use backend='numba'")
    n, D = F.shape
    names = list(arrays)
    mats = [np.asarray(arrays[nm]) for nm in names]
    dt = np.result_type(F.dtype, *[M.dtype for M in mats]) if mats else F.dtype
    dA = cuda.device_array((max(1, len(mats)), n, D), dtype=dt)
    for q, M in enumerate(mats):
        dA[q].copy_to_device(np.ascontiguousarray(M, dtype=dt))
    if not mats:
        dA[0].copy_to_device(np.ascontiguousarray(F, dtype=dt))
    dF = cuda.to_device(np.ascontiguousarray(F, dtype=dt))
    out = cuda.device_array((dA.shape[0], D), dtype=np.float64)
    kept = cuda.to_device(np.zeros(n, dtype=np.int64))
    bad = cuda.to_device(np.zeros(1, dtype=np.int64))
    th = _threads(D, 128)
    _kernel("coordinatewise")[_blocks(D, th), th](dF, dA, out, cuda.to_device(weights),
                                                  cuda.to_device(rows), mode, t, kept, bad)
    o = out.copy_to_host()
    res = {nm: o[q].astype(M.dtype) for q, (nm, M) in enumerate(zip(names, mats))}
    return res, kept.copy_to_host(), int(bad.copy_to_host()[0])


def weiszfeld_pass_cuda(X: np.ndarray, alpha: np.ndarray):
    """CUDA version of :func:`rfrs_ref.kernels.weiszfeld.weiszfeld_pass`."""
    require_cuda()
    n, D = X.shape
    dX = cuda.to_device(X)
    z = cuda.device_array(D, dtype=np.float64)
    d2 = cuda.to_device(np.zeros(n))
    asum = float(alpha[alpha > 0].sum())
    th = _threads(D, 256)  # a power of two: the block reduction halves it
    _kernel("weiszfeld")[_blocks(D, th), th](dX, cuda.to_device(alpha), asum, z, d2)
    s = d2.copy_to_host()
    zh = z.copy_to_host()
    with np.errstate(invalid="ignore"):
        dist = np.sqrt(s)
    # an overflowed sum of squares (or a non-finite row) is measured again on
    # the host in the oracle's scaled form: rare, and exact where it matters
    redo = ~np.isfinite(dist)
    if redo.any():
        from rfrs_ref.kernels.weiszfeld import distances_to_numpy

        dist[redo] = distances_to_numpy(X[redo], zh)
    return zh, dist


def combine_rows_cuda(A: np.ndarray, w: np.ndarray) -> np.ndarray:
    """CUDA version of :func:`rfrs_ref.aggregate.combine.combine_rows` (float64 result)."""
    require_cuda()
    D = A.shape[1]
    out = cuda.device_array(D, dtype=np.float64)
    th = _threads(D, 256)
    _kernel("combine")[_blocks(D, th), th](cuda.to_device(A), cuda.to_device(w), out)
    return out.copy_to_host()
