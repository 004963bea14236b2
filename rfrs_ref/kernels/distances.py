"""Pairwise squared Euclidean distances between rows, accurate and overflow-safe.

The heart of Krum, Bulyan and MDA (docs/aggregation.md), also used to monitor resilience.

    pairwise_sq_dists(X, Y)[i, j] = Σ_k (X[i, k] − Y[j, k])²        (float64)

Conventions shared by every backend:

- **Direct differences, never the Gram identity.** ‖a‖² + ‖b‖² − 2a·b cancels
  catastrophically when rows are close relative to their norm: parameter-space
  features θᵢ differ from each other by about ηₜ per coordinate while ‖θ‖ is
  about √D, and in float32 the identity then returns noise (or negative
  numbers) for every pair. Differences of nearby floats are exact (Sterbenz),
  so summing squared differences keeps the relative accuracy of the result
  independent of the rows' norms.
- **Float64 results.** Squares of float32 values cannot overflow in float64
  ((2 · 3.4e38)² ≈ 4.6e77), nor can their sum over any realistic D.
- **Non-finite rows are infinitely far.** A pair that involves a NaN or ±inf
  coordinate has distance +inf (including the pair of two such rows, and a row
  with itself in the ``Y is None`` case, whose diagonal is otherwise 0). A
  distance between finite rows that exceeds the float64 range (float64 inputs
  beyond about 1e154) is +inf too. No distance is ever NaN, so sorting and
  comparisons of distances are total.

Backends: ``"numpy"`` (the float64 oracle), ``"numba"`` (default, parallel CPU
kernel), ``"cuda"`` (:mod:`rfrs_ref.kernels.cuda`, imported only when asked for).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


# Width of a column block. 256 float32 values of 100 rows (100 KiB) stay in L2
# while every pair of rows is compared over them, so X is read from memory once.
BLOCK = 256

# A block's sum of squared differences Σ(a − b)² is at most 2Σa² + 2Σb²: when
# both rows' Σx² over the block are at most SAFE_SS, the sum cannot overflow the
# inputs' dtype and the fast path computes it there. Otherwise (huge values, or
# NaN/inf, which make Σx² NaN or inf) the pair is handled on its own: +inf if a
# row is non-finite in the block, else summed in float64.
SAFE_SS = {np.dtype(np.float32): 8.0e37, np.dtype(np.float64): 4.0e307}


def as_float_matrix(A, name: str) -> np.ndarray:
    """A C-contiguous 2-D float32/float64 view of A (copied only when needed)."""
    arr = np.asarray(A)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (rows × coordinates), got shape {arr.shape}")
    if arr.dtype not in (np.float32, np.float64):
        if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
            raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
        arr = arr.astype(np.float64)
    return np.ascontiguousarray(arr)


def n_chunks(D: int, block: int) -> int:
    """How many parallel chunks to cut ``D`` columns into.

    A fixed number (not the thread count), so that results are the same bit for
    bit on every machine: each chunk sums its blocks in order.
    """
    nblocks = max(1, (D + block - 1) // block)
    return int(min(nblocks, 16))


#: the derivation of parameter-space features, θᵢ − θ̄ (:func:`derivation`)
IDENTITY = (1.0, 1.0, False)


def derivation(coef=None) -> np.ndarray:
    """The float64 vector ``[a, c, flip]`` of a derivation of features from uploaded rows
    (:func:`derived_features`), checked: ``a`` and ``c`` finite, ``c`` non-zero. None is
    :data:`IDENTITY` (z = x − b)."""
    a, c, flip = IDENTITY if coef is None else coef
    a, c = float(a), float(c)
    if not (np.isfinite(a) and np.isfinite(c) and c != 0.0):
        raise ValueError(f"a derivation (x − a·b)/c needs a finite a and a finite, non-zero c; "
                         f"got a={a!r}, c={c!r}")
    return np.array([a, c, 1.0 if flip else 0.0])


def derived_features(features: np.ndarray, base: np.ndarray, coef=None) -> np.ndarray:
    """The features a kernel given ``base=`` (and ``coef=``) derives from the rows
    ``features`` where it reads them, as a matrix (the oracle of those kernels).

    Formula, coordinate by coordinate in float64, rounded once to ``features``' dtype,
    with ``coef = (a, c, flip)`` (:func:`derivation`; default ``(1, 1, False)``)::

        z = x − b                 (a = c = 1, flip False: the difference alone)
        z = (x − a·b) / c         (flip False)
        z = (a·b − x) / c         (flip True)

    ``x`` the row's value, ``b`` = ``base``'s. The first is θᵢ − θ̄, the parameter-space
    features (for float32 values the float32 subtraction's own result: a float64
    difference of two float32 values rounds as the float32 operation does, so for
    arrays of one dtype this is ``rfrs_ref.aggregate.base.parameter_features``); the
    others are the recovered gradients of the optimisers whose recovery is affine in one
    uploaded array, by the very expressions of their recovery kernels
    (``Optimizer.feature_derivation``: momentum's m − β₃m̄, Adam's (m − β₁m̄)/(1 − β₁),
    SGD's (θ̄ − θ)/η), so the values of ``recover_batch``, bit for bit. Hostile values
    give what the formula gives (no warning). The kernels that take ``base=``:
    :func:`pairwise_sq_dists`, :func:`pairwise_sq_dists64`,
    :func:`rfrs_ref.kernels.coordinatewise.coordinatewise_combine`."""
    F = np.asarray(features)
    a, c, flip = derivation(coef)
    x = F.astype(np.float64)
    b = np.asarray(base, dtype=np.float64)
    # (x − 1·b)/1 is x − b exactly: one formula serves θ − θ̄ too
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        z = (a * b - x) / c if flip else (x - a * b) / c
        return z.astype(F.dtype)


# Not inlined, and compiled with fast-math explicitly off: its operations keep their own
# roundings inside the kernels that call it, whose ``contract`` flag would otherwise fuse
# a·b and the subtraction into one FMA (another rounding than the recovery kernels').
# Explicitly: Numba compiles a callee with its caller's fast-math flags unless it sets its
# own
@njit(cache=True, fastmath=False)
def _derived_tile(X, base, coef, rows, k0, k1, Z):
    """Z[a, :k1 − k0] = the derived rows ``rows`` of X on columns k0..k1 − 1, each the
    float64 value rounded once to Z's dtype (:func:`derived_features`' values)."""
    a, c, flip = coef[0], coef[1], coef[2] != 0.0
    # θ − θ̄ (a = c = 1) without the product and the division: the same values, and
    # the parameter-space rounds pay nothing for the general form
    plain = a == 1.0 and c == 1.0 and not flip
    for r in range(rows.shape[0]):
        x = X[rows[r], k0:k1]
        z = Z[r]
        if plain:
            for k in range(k1 - k0):
                z[k] = np.float64(x[k]) - np.float64(base[k0 + k])
        elif flip:
            for k in range(k1 - k0):
                z[k] = (a * np.float64(base[k0 + k]) - np.float64(x[k])) / c
        else:
            for k in range(k1 - k0):
                z[k] = (np.float64(x[k]) - a * np.float64(base[k0 + k])) / c


@njit(cache=True, inline="always")
def _block_source(X, base, coef, rows, k0, k1, Z, derived):
    """Where a kernel reads column block [k0, k1): ``(Z, 0, k1 − k0)`` with the tile of
    derived rows filled (``derived``: row a of Z is derived row ``rows[a]`` of X), else
    ``(X, k0, k1)``."""
    if derived:
        _derived_tile(X, base, coef, rows, k0, k1, Z)
        return Z, 0, k1 - k0
    return X, k0, k1


@njit(cache=True, parallel=True, fastmath={"reassoc"})
def _derived_rows_finite_numba(X, base, coef, block, zero):
    """``zero`` (0 in X's dtype) types the sums; ``reassoc`` lets them vectorise and
    cannot create or remove NaN."""
    n, D = X.shape
    out = np.empty(n, dtype=np.bool_)
    for i in prange(n):
        row = np.array([i])
        z = np.empty((1, block), dtype=X.dtype)
        p = zero
        for k0 in range(0, D, block):
            k1 = min(D, k0 + block)
            _derived_tile(X, base, coef, row, k0, k1, z)
            for k in range(k1 - k0):
                p += z[0, k] - z[0, k]  # NaN iff some feature is NaN or ±inf
        out[i] = p == 0
    return out


@njit(cache=True, parallel=True, fastmath={"reassoc"})
def _rows_abs_sum_numba(X):
    """(n,) float64: each row's Σ|value| (an upper bound of its largest), NaN or inf
    where the row holds a NaN or ±inf (``reassoc`` lets the sum vectorise and cannot
    remove a NaN or an inf)."""
    n, D = X.shape
    out = np.empty(n)
    for i in prange(n):
        x = X[i]
        s = 0.0
        for k in range(D):
            s += abs(np.float64(x[k]))
        out[i] = s
    return out


def derived_rows_finite(X: np.ndarray, base: np.ndarray, coef=None) -> np.ndarray:
    """Which rows of :func:`derived_features` ``(X, base, coef)`` hold only finite
    values, without building it.

    Every derived value has |z| ≤ (|x| + |a|·|b|)(1 + u)³/|c| (u the unit roundoff of
    float64), so a row with (Σₖ|xᵢₖ| + |a|·Σₖ|b_k|)/|c| below half the dtype's largest
    value (sums in float64, within a relative 1e-9 of exact at any D here; a margin of
    1% taken) has every value finite, rounded or not: one vectorised pass over X decides
    those; the others (a non-finite value, or values near the dtype's range) are decided
    by forming their values.
    """
    Xc = as_float_matrix(X, "X")
    base = _checked_base(base, Xc.shape[1])
    coef = derivation(coef)
    n, D = Xc.shape
    if D == 0:
        return np.ones(n, dtype=bool)
    zero = Xc.dtype.type(0)
    big = float(np.finfo(Xc.dtype).max) / 2
    with np.errstate(invalid="ignore", over="ignore"):
        b = _rows_abs_sum_numba(base.reshape(1, D))[0] * abs(coef[0])
        ok = (_rows_abs_sum_numba(Xc) + b) * 1.01 < big * abs(coef[1])  # False for NaN, inf
    unsure = np.flatnonzero(~ok)
    if unsure.size:
        ok[unsure] = _derived_rows_finite_numba(Xc[unsure], base, coef, BLOCK, zero)
    return ok


def _checked_base(base, D: int) -> np.ndarray:
    base = np.ascontiguousarray(base)
    if base.shape != (D,):
        raise ValueError(f"base must have shape ({D},) (one value per column), got {base.shape}")
    if base.dtype not in (np.float32, np.float64):
        base = base.astype(np.float64)
    return base


def pairwise_sq_dists_numpy(X: np.ndarray, Y: np.ndarray | None = None) -> np.ndarray:
    """Oracle: float64 (n, m) squared distances by direct differences.

    Args:
        X: (n, D) array. Y: (m, D) array, or None for X against itself.

    Returns:
        float64 (n, m); +inf for any pair involving a non-finite row (see the
        module docstring), 0 on the diagonal of finite rows when ``Y is None``.
    """
    X64 = np.asarray(X, dtype=np.float64)
    Y64 = X64 if Y is None else np.asarray(Y, dtype=np.float64)
    if X64.ndim != 2 or Y64.ndim != 2 or X64.shape[1] != Y64.shape[1]:
        raise ValueError(
            f"pairwise_sq_dists needs two 2-D arrays with the same number of columns, got "
            f"shapes {np.shape(X)} and {np.shape(Y) if Y is not None else np.shape(X)}"
        )
    out = np.empty((X64.shape[0], Y64.shape[0]), dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(X64.shape[0]):
            diff = Y64 - X64[i]
            out[i] = np.einsum("jk,jk->j", diff, diff)
    out[np.isnan(out)] = np.inf
    bad_x = ~np.isfinite(X64).all(axis=1)
    bad_y = ~np.isfinite(Y64).all(axis=1)
    out[bad_x, :] = np.inf
    out[:, bad_y] = np.inf
    return out


@njit(cache=True, fastmath={"reassoc", "contract"})
def _block_row_flags(Z, k0, k1, safe_ss, finite, safe):
    """Per row of Z over columns [k0, k1): inside the fast path's range? (one
    fused multiply-add per value); and, only for rows that are not, finite?"""
    for i in range(Z.shape[0]):
        z = Z[i, k0:k1]
        ss = z[0] * 0
        for k in range(z.shape[0]):
            ss += z[k] * z[k]
        safe[i] = ss <= safe_ss  # False for NaN and inf
        if safe[i]:
            finite[i] = True
        else:
            poison = z[0] * 0
            for k in range(z.shape[0]):
                poison += z[k] - z[k]  # NaN iff some value is NaN or ±inf
            finite[i] = poison == 0


@njit(cache=True, fastmath={"reassoc", "contract"})
def _one_pair(x, y, fin, safe, zero):
    """One pair over one block: +inf if either row is non-finite there, the
    float32 (or input-dtype) sum when both are in the safe range, else float64."""
    if not fin:
        return np.inf
    if safe:
        s = zero
        for k in range(x.shape[0]):
            d = x[k] - y[k]
            s += d * d
        return np.float64(s)
    s64 = 0.0
    for k in range(x.shape[0]):
        d64 = np.float64(x[k]) - np.float64(y[k])
        s64 += d64 * d64
    return s64


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract"})
def _pairwise_numba(X, Y, symmetric, zero, safe_ss, block, nchunks, base, coef, derived):
    """Blocked kernel; ``zero`` (0 in the inputs' dtype) types the inner sums.
    ``derived`` (symmetric only): the rows are derived from X (:func:`derived_features`),
    built a column block at a time in a tile of n × block values, then summed as
    the rows of a held matrix are (the same loops on the same values).

    Column blocks are distributed over ``nchunks`` parallel chunks, each with
    its own float64 accumulator; the chunks are summed in order, so the result
    does not depend on the number of threads. Within a block, two rows of X are
    compared with four rows of Y at once (six loads feed eight differences),
    which with ``reassoc`` lets LLVM vectorise the eight sums; ``reassoc`` and
    ``contract`` cannot create or remove inf and NaN (no ``nnan``/``ninf``).
    Pairs with a row outside the fast path's range in a block go one by one.
    """
    n, D = X.shape
    m = Y.shape[0]
    nblocks = (D + block - 1) // block
    acc = np.zeros((nchunks, n, m))
    all_rows = np.arange(n)
    for c in prange(nchunks):
        fin_x = np.empty(n, dtype=np.bool_)
        safe_x = np.empty(n, dtype=np.bool_)
        fin_y = np.empty(m, dtype=np.bool_)
        safe_y = np.empty(m, dtype=np.bool_)
        Z = np.empty((n if derived else 0, block), dtype=X.dtype)
        a_c = acc[c]
        for b in range(c * nblocks // nchunks, (c + 1) * nblocks // nchunks):
            k0 = b * block
            k1 = min(D, k0 + block)
            Xs, a0, a1 = _block_source(X, base, coef, all_rows, k0, k1, Z, derived)
            Ys = Xs if symmetric else Y
            _block_row_flags(Xs, a0, a1, safe_ss, fin_x, safe_x)
            if symmetric:
                fin_y[:] = fin_x
                safe_y[:] = safe_x
            else:
                _block_row_flags(Ys, a0, a1, safe_ss, fin_y, safe_y)
            for i in range(0, n, 2):
                two = i + 1 < n
                x0 = Xs[i, a0:a1]
                x1 = Xs[i + 1, a0:a1] if two else x0
                j = 0
                if symmetric:
                    if two:
                        a_c[i, i + 1] += _one_pair(x0, x1, fin_x[i] and fin_x[i + 1],
                                                   safe_x[i] and safe_x[i + 1], zero)
                    j = i + 2
                while j < m:
                    if (two and j + 4 <= m and safe_x[i] and safe_x[i + 1] and safe_y[j]
                            and safe_y[j + 1] and safe_y[j + 2] and safe_y[j + 3]):
                        y0 = Ys[j, a0:a1]
                        y1 = Ys[j + 1, a0:a1]
                        y2 = Ys[j + 2, a0:a1]
                        y3 = Ys[j + 3, a0:a1]
                        s00 = zero
                        s01 = zero
                        s02 = zero
                        s03 = zero
                        s10 = zero
                        s11 = zero
                        s12 = zero
                        s13 = zero
                        for k in range(a1 - a0):
                            a = x0[k]
                            e = x1[k]
                            c0 = y0[k]
                            c1 = y1[k]
                            c2 = y2[k]
                            c3 = y3[k]
                            d = a - c0
                            s00 += d * d
                            d = a - c1
                            s01 += d * d
                            d = a - c2
                            s02 += d * d
                            d = a - c3
                            s03 += d * d
                            d = e - c0
                            s10 += d * d
                            d = e - c1
                            s11 += d * d
                            d = e - c2
                            s12 += d * d
                            d = e - c3
                            s13 += d * d
                        a_c[i, j] += s00
                        a_c[i, j + 1] += s01
                        a_c[i, j + 2] += s02
                        a_c[i, j + 3] += s03
                        a_c[i + 1, j] += s10
                        a_c[i + 1, j + 1] += s11
                        a_c[i + 1, j + 2] += s12
                        a_c[i + 1, j + 3] += s13
                        j += 4
                        continue
                    yj = Ys[j, a0:a1]
                    a_c[i, j] += _one_pair(x0, yj, fin_x[i] and fin_y[j], safe_x[i] and safe_y[j], zero)
                    if two:
                        a_c[i + 1, j] += _one_pair(x1, yj, fin_x[i + 1] and fin_y[j],
                                                   safe_x[i + 1] and safe_y[j], zero)
                    j += 1
    out = np.zeros((n, m))
    for c in range(nchunks):
        out += acc[c]
    if symmetric:
        for i in range(n):
            for j in range(i + 1, n):
                out[j, i] = out[i, j]
    return out


def pairwise_sq_dists(X: np.ndarray, Y: np.ndarray | None = None, *, backend: str = "numba",
                      base: np.ndarray | None = None, coef=None) -> np.ndarray:
    """Squared Euclidean distances between the rows of X and those of Y (or X).

    Formula: ``out[i, j] = Σ_k (X[i, k] − Y[j, k])²``, computed by direct
    differences (never the Gram identity), returned in float64.

    Accuracy (``backend="numba"``, float32 input): inside a column block of
    256 values, differences and squares are float32 and summed in float32; block
    sums are accumulated in float64. Differences of nearby values are exact, so
    the relative error of every distance is below about 1e-6 whatever the
    rows' norms. A block in which a row's Σx² exceeds 8e37 (values beyond about
    5e17) is summed in float64 for the pairs with that row, so nothing
    overflows; squared differences below the float32 range (|a − b| < 1e-19)
    may be lost, an absolute error below 3e-36 per block. Float64 inputs are
    computed in float64 throughout.

    Preconditions: 2-D arrays of a real floating (or integer) dtype with the same
    number of columns. Inputs are not modified.

    Args:
        X: (n, D). Y: (m, D) or None (then the result is symmetric with a zero
            diagonal for finite rows).
        backend: ``"numpy"`` (float64 oracle), ``"numba"`` or ``"cuda"``.
        base: (D,) or None; with Y None only. Given, the rows are
            :func:`derived_features` ``(X, base, coef)`` (θᵢ − θ̄ of parameter-space
            detection, or an affine recovery of the gradients): the numba kernel
            builds them a column block at a time, so no (n, D) feature matrix exists,
            and returns the held rows' matrix bit for bit; the other backends build
            the matrix.
        coef: with ``base``, the derivation ``(a, c, flip)`` (:func:`derivation`).

    Returns:
        float64 (n, m). Pairs involving a non-finite row are +inf; NaN never occurs.
    """
    if base is not None:
        if Y is not None:
            raise ValueError("base= gives the distances among the rows of X − base; Y must be None")
        base = _checked_base(base, as_float_matrix(X, "X").shape[1])
        coef = derivation(coef)
        if backend != "numba":
            X, base = derived_features(X, base, coef), None
    if backend == "numpy":
        return pairwise_sq_dists_numpy(X, Y)
    Xc = as_float_matrix(X, "X")
    Yc = None if Y is None else as_float_matrix(Y, "Y")
    if Yc is not None:
        if Yc.shape[1] != Xc.shape[1]:
            raise ValueError(
                f"X has {Xc.shape[1]} columns but Y has {Yc.shape[1]}: rows must have the same length"
            )
        if Yc.dtype != Xc.dtype:
            dt = np.result_type(Xc.dtype, Yc.dtype)
            Xc, Yc = Xc.astype(dt), Yc.astype(dt)
    if backend == "cuda":
        from rfrs_ref.kernels import cuda as _cuda

        out = _cuda.pairwise_sq_dists_cuda(Xc, Yc)
        if Yc is None:
            _copies_share_distances_inplace(Xc, out)
        return out
    if backend != "numba":
        raise ValueError(f"unknown backend {backend!r}; choose one of: numpy, numba, cuda")
    symmetric = Yc is None
    Y_ = Xc if symmetric else Yc
    n, D = Xc.shape
    if n == 0 or Y_.shape[0] == 0:
        return np.zeros((n, Y_.shape[0]))
    dt = Xc.dtype.type
    derived = base is not None
    out = _pairwise_numba(Xc, Y_, symmetric, dt(0), dt(SAFE_SS[Xc.dtype]), BLOCK,
                          n_chunks(D, BLOCK), base if derived else np.zeros(0, Xc.dtype),
                          coef if derived else derivation(), derived)
    if symmetric:
        def row(i):
            return derived_features(Xc[i], base, coef) if derived else Xc[i]

        # the diagonal is never computed: a non-finite row is infinitely far from
        # itself as well, as in the oracle
        off = out + np.diag(np.full(n, np.inf))
        for i in np.flatnonzero(np.isinf(off).all(axis=1)):
            if not np.isfinite(row(i)).all():
                out[i, i] = np.inf
        _copies_share_distances_inplace(row, out)
    return out


def sq_dists_error(D: int, dtype) -> tuple[float, float]:
    """``(rel, abs)``: every entry of :func:`pairwise_sq_dists` (numba backend) on finite
    rows of D columns of ``dtype`` is within ``rel · exact + abs`` of the exact sum
    Σ_k (x_k − y_k)².

    Each term (x − y)² is a difference and a square, each rounded once in the inputs'
    dtype (unit roundoff u; a difference of nearby values is exact): at most 3u relative.
    The terms, all ≥ 0, are summed in the inputs' dtype within a column block of
    b = 256 (in any order the vectoriser chooses), then in float64 block by block into
    a chunk's accumulator and chunk by chunk. Any summation tree of m non-negative
    terms errs by at most (m − 1)u relative to their sum (Higham, *Accuracy and
    Stability of Numerical Algorithms*, §4.2), and the stages compose:

        rel = ((b + 2) · u + (⌈blocks / chunks⌉ + chunks) · 2⁻⁵³) · 1.01

    (1.01 covers the second-order terms): about 1.5e-5 for float32, 2.9e-14 for
    float64. ``abs`` covers the squares that underflow, below the dtype's smallest
    normal number each (a block whose rows are out of the fast path's range is summed
    in float64, more accurately). A sum that overflows (float64 rows beyond about 1e154)
    is +inf and outside this bound.
    """
    dt = np.dtype(dtype)
    if dt not in SAFE_SS:
        raise ValueError(f"dtype must be float32 or float64, got {dt}")
    u = float(np.finfo(dt).eps) / 2
    nblocks = max(1, -(-int(D) // BLOCK))
    nchunks = n_chunks(int(D), BLOCK)
    per_chunk = -(-nblocks // nchunks)
    rel = ((BLOCK + 2) * u + (per_chunk + nchunks) * 2.0 ** -53) * 1.01
    return rel, float(np.finfo(dt).tiny) * 3 * int(D)


def _shared_classes(shared, cls) -> tuple[np.ndarray, np.ndarray]:
    """The shared rows as a float matrix and the rows' classes as int64, checked."""
    cls = np.asarray(cls, dtype=np.int64)
    shared = as_float_matrix(shared, "shared")
    if cls.ndim != 1 or (cls.size and (cls.min() < 0 or cls.max() >= shared.shape[0])):
        raise ValueError(f"cls must be a 1-D array of class indices in [0, {shared.shape[0]}), "
                         f"got {cls!r}")
    return shared, cls


def pairwise_sq_dists_by_parts(parts, shared: np.ndarray, cls: np.ndarray, *,
                               backend: str = "numba") -> np.ndarray:
    """Squared distances between rows made of column parts, one of which takes one of a
    few rows per class of row.

    Row i is the concatenation of ``parts[0][i]``, ``parts[1][i]``, ... and
    ``shared[cls[i]]`` (the columns where every row of a class holds the same values:
    FISM's Q rows that no sampled client owns, docs/performance.md, "Robust rounds on
    shared rows"). Formula:

        out[i, j] = Σ_p d_p(i, j) + d_S(cls[i], cls[j]),

    d_p = :func:`pairwise_sq_dists` of part p, d_S that of the shared rows (0 within a
    class of finite rows). Each term is within :func:`sq_dists_error` of its exact sum,
    so each entry is within ``rel · exact + Σ abs`` of the exact distance of the whole
    rows (``rel`` the largest of the parts'), as :func:`pairwise_sq_dists` of the whole
    rows is: the two agree to twice that bound, not bit for bit (the columns are summed
    in other blocks). Conventions as :func:`pairwise_sq_dists`: a row non-finite in any
    part, or whose shared row is, is +inf from every row and from itself; NaN never
    occurs. Inputs are not modified.

    Args:
        parts: 2-D arrays of n rows each (any numbers of columns, 0 included), or
            (θ (n, Dₚ), θ̄ (Dₚ,)) pairs whose rows are θᵢ − θ̄, or (X, base, coef)
            triples whose rows are :func:`derived_features` ``(X, base, coef)``
            (:func:`pairwise_sq_dists`'s ``base=`` and ``coef=``).
        shared: (classes, S) the shared rows.
        cls: (n,) int, each row's class (an index into ``shared``).
    """
    shared, cls = _shared_classes(shared, cls)
    n = cls.shape[0]
    out = np.zeros((n, n))
    for p in parts:
        p, base, coef = _part(p, n)
        if np.shape(p)[1]:
            out += pairwise_sq_dists(p, backend=backend, base=base, coef=coef)
    return out + pairwise_sq_dists(shared, backend=backend)[np.ix_(cls, cls)]


def _part(p, n: int):
    """(rows, base or None, coef or None) of a part given as a matrix, as (θ, θ̄) or as
    (X, base, coef) (:func:`derived_features`), checked to have n rows."""
    p, base, coef = (p + (None,) * (3 - len(p))) if isinstance(p, tuple) else (p, None, None)
    if np.shape(p)[0] != n:
        raise ValueError(f"every part must have {n} rows (one per class index), got "
                         f"shape {np.shape(p)}")
    return p, base, coef


def pairwise_sq_dists64_by_parts(parts, shared: np.ndarray, cls: np.ndarray,
                                 rows: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """:func:`pairwise_sq_dists64` of the rows ``rows`` of the whole rows that
    :func:`pairwise_sq_dists_by_parts` describes (row i: the parts' rows i, then
    ``shared[cls[i]]``; a part may be a (θ, θ̄) pair or an (X, base, coef) triple as
    there), and the relative error
    bound of every entry.

    Formula: ``out[a, b] = Σ_p d_p(rows[a], rows[b]) + d_S(cls[rows[a]], cls[rows[b]])``,
    each term by :func:`pairwise_sq_dists64` (float64 differences). Each term is within
    ``sq_dists64_error`` of its part's width of its exact sum, and the k ≥ 1 terms, all
    ≥ 0, are added in float64, so every entry is within

        ε = (max_p ε_p + k · u) · 1.01,     u = 2⁻⁵³,

    of the exact distance of the whole rows (about 1e-13 at D = 2,173,440): the bound
    that Weiszfeld's steps on the matrix need (:func:`rfrs_ref.kernels.weiszfeld.
    geometric_median_weights_on_matrix`). Not bit for bit the whole rows' matrix (the
    columns are summed in other blocks). Preconditions as :func:`pairwise_sq_dists64`:
    the selected rows are finite in every part and in their shared row.

    Returns:
        (float64 (m, m) matrix, ε), m = len(rows) (every row if None).
    """
    shared, cls = _shared_classes(shared, cls)
    n = cls.shape[0]
    rows = (np.arange(n, dtype=np.int64) if rows is None
            else np.ascontiguousarray(rows, dtype=np.int64))
    out = np.zeros((rows.size, rows.size))
    worst, k = sq_dists64_error(shared.shape[1]), 1
    for p in parts:
        p, base, coef = _part(p, n)
        if np.shape(p)[1]:
            out += pairwise_sq_dists64(p, rows, base=base, coef=coef)
            worst, k = max(worst, sq_dists64_error(np.shape(p)[1])), k + 1
    c = cls[rows]
    out += pairwise_sq_dists64(shared)[np.ix_(c, c)]
    return out, (worst + k * 2.0 ** -53) * 1.01


def _copies_share_distances_inplace(X, out: np.ndarray) -> None:
    """Give every copy of a row (equal values, finite) the distances of its first
    occurrence, in place on the symmetric ``out``. ``X``: the rows, or a function of a
    row index that returns the row (rows that are not held).

    The kernel sums a pair in a 2 × 4 tile or on its own, and the two round
    differently (the vectorised sums group their terms by the loop's shape), so two
    identical uploads (ALIE, IPM, mimic) had different distances to a third row in most
    rounds, and which copy Krum, Bulyan or MDA preferred depended on rounding, not on
    the smaller index that the rules' tie convention promises. Copies are found among
    the pairs whose computed distance is exactly 0 (a copy's always is; a pair of
    different rows whose differences underflow is compared and left alone), so a round
    without copies costs one scan of the n × n matrix.
    """
    zi, zj = np.nonzero(np.triu(out == 0.0, 1))
    if zi.size == 0:
        return
    row = X if callable(X) else X.__getitem__
    first = np.arange(out.shape[0])
    for i, j in zip(zi.tolist(), zj.tolist()):
        r = first[i]
        if first[j] == j and j != r and np.array_equal(row(r), row(j)):
            first[j] = r
    for j in np.flatnonzero(first != np.arange(out.shape[0])):
        r = first[j]
        out[j, :] = out[r, :]
        out[:, j] = out[:, r]


# ---------------------------------------------------------------------------
# Float64 differences: the distance matrix that Weiszfeld's steps can run on
# ---------------------------------------------------------------------------

#: Width of a column block of :func:`pairwise_sq_dists64` (as for ``BLOCK``).
BLOCK64 = 256


def sq_dists64_error(D: int) -> float:
    """Relative error bound ε_D of every entry of :func:`pairwise_sq_dists64` on
    columns of length D (float32 or float64 finite inputs whose sums stay finite).

    Each term (x − y)² is the difference rounded once to float64 and squared,
    rounded once more (with ``contract`` the square and the add are one rounding):
    relative error at most 3u, u = 2⁻⁵³. The terms, all ≥ 0, are summed in three
    stages: within a column block of b = 256 (in any order the vectoriser chooses),
    then the blocks of a chunk in order into one float64 accumulator, then the
    chunks in order. Any summation tree of m non-negative terms errs by at most
    (m − 1)u relative to their sum (Higham, *Accuracy and Stability of Numerical
    Algorithms*, §4.2), and the stages compose, so

        ε_D = (b + ⌈blocks / chunks⌉ + chunks + 3) · u · 1.01

    (1.01 covers the second-order terms). For D = 2,173,440 that is about
    1e-13, whatever the rows' norms: differences never cancel (no Gram identity).
    """
    nblocks = max(1, -(-D // BLOCK64))
    nchunks = n_chunks(D, BLOCK64)
    per_chunk = -(-nblocks // nchunks)
    return (BLOCK64 + per_chunk + nchunks + 3) * 2.0 ** -53 * 1.01


@njit(inline="always")
def _pair64(x, y):
    s = 0.0
    for k in range(x.shape[0]):
        d = np.float64(x[k]) - np.float64(y[k])
        s += d * d
    return s


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract"})
def _pairwise64_numba(X, rows, block, nchunks, base, coef, derived):
    """Blocked kernel over the rows ``rows`` of X: differences in float64, two rows
    against four per sweep of a block (as ``_pairwise_numba``); ``reassoc`` and
    ``contract`` cannot create or remove inf and NaN. ``derived``: the rows are
    derived from X (:func:`derived_features`), built a block at a time in a tile."""
    m = rows.shape[0]
    D = X.shape[1]
    nblocks = (D + block - 1) // block
    acc = np.zeros((nchunks, m, m))
    tile_rows = np.arange(m)
    for c in prange(nchunks):
        a_c = acc[c]
        Z = np.empty((m if derived else 0, block), dtype=X.dtype)
        for b in range(c * nblocks // nchunks, (c + 1) * nblocks // nchunks):
            k0 = b * block
            k1 = min(D, k0 + block)
            Xs, a0, a1 = _block_source(X, base, coef, rows, k0, k1, Z, derived)
            rs = tile_rows if derived else rows
            for i in range(0, m, 2):
                two = i + 1 < m
                x0 = Xs[rs[i], a0:a1]
                x1 = Xs[rs[i + 1], a0:a1] if two else x0
                j = i + 1
                if two:
                    a_c[i, i + 1] += _pair64(x0, x1)
                    j = i + 2
                while two and j + 4 <= m:
                    y0 = Xs[rs[j], a0:a1]
                    y1 = Xs[rs[j + 1], a0:a1]
                    y2 = Xs[rs[j + 2], a0:a1]
                    y3 = Xs[rs[j + 3], a0:a1]
                    s00 = 0.0
                    s01 = 0.0
                    s02 = 0.0
                    s03 = 0.0
                    s10 = 0.0
                    s11 = 0.0
                    s12 = 0.0
                    s13 = 0.0
                    for k in range(a1 - a0):
                        a = np.float64(x0[k])
                        e = np.float64(x1[k])
                        c0 = np.float64(y0[k])
                        c1 = np.float64(y1[k])
                        c2 = np.float64(y2[k])
                        c3 = np.float64(y3[k])
                        d = a - c0
                        s00 += d * d
                        d = a - c1
                        s01 += d * d
                        d = a - c2
                        s02 += d * d
                        d = a - c3
                        s03 += d * d
                        d = e - c0
                        s10 += d * d
                        d = e - c1
                        s11 += d * d
                        d = e - c2
                        s12 += d * d
                        d = e - c3
                        s13 += d * d
                    a_c[i, j] += s00
                    a_c[i, j + 1] += s01
                    a_c[i, j + 2] += s02
                    a_c[i, j + 3] += s03
                    a_c[i + 1, j] += s10
                    a_c[i + 1, j + 1] += s11
                    a_c[i + 1, j + 2] += s12
                    a_c[i + 1, j + 3] += s13
                    j += 4
                while j < m:
                    yj = Xs[rs[j], a0:a1]
                    a_c[i, j] += _pair64(x0, yj)
                    if two:
                        a_c[i + 1, j] += _pair64(x1, yj)
                    j += 1
    out = np.zeros((m, m))
    for c in range(nchunks):
        out += acc[c]
    for i in range(m):
        out[i, i] = 0.0
        for j in range(i + 1, m):
            out[j, i] = out[i, j]
    return out


def pairwise_sq_dists64(X: np.ndarray, rows: np.ndarray | None = None, *,
                        base: np.ndarray | None = None, coef=None) -> np.ndarray:
    """Squared distances between the rows ``rows`` of X (every row if None), with
    every difference taken in float64.

    Formula: ``out[a, b] = Σ_k (X[rows[a], k] − X[rows[b], k])²``, float64, symmetric,
    zero diagonal. Unlike :func:`pairwise_sq_dists` (float32 sums within a block for
    float32 input, relative error about 1e-6), every entry here is within
    :func:`sq_dists64_error` (about 1e-13) of the exact sum: it is the matrix that
    Weiszfeld's steps run on (:func:`rfrs_ref.kernels.weiszfeld.geometric_median`),
    where such errors are amplified by cancellation. About 1.4 times the time of the
    float32 kernel (half the vector lanes).

    ``base`` (D,): the rows are :func:`derived_features` ``(X, base, coef)`` (θᵢ − θ̄, or
    an affine recovery of the gradients), built a column block at a time in the kernel: the held rows' matrix, bit for bit, without an
    (n, D) feature matrix.

    Preconditions: the selected rows are finite (the caller knows which are); an entry
    whose sum exceeds the float64 range (float64 inputs beyond about 1e154) is +inf.
    Inputs are not modified.
    """
    Xc = as_float_matrix(X, "X")
    rows = (np.arange(Xc.shape[0], dtype=np.int64) if rows is None
            else np.ascontiguousarray(rows, dtype=np.int64))
    if rows.size and (rows.min() < 0 or rows.max() >= Xc.shape[0]):
        raise ValueError(f"rows must index the {Xc.shape[0]} rows of X")
    if rows.size == 0 or Xc.shape[1] == 0:
        return np.zeros((rows.size, rows.size))
    derived = base is not None
    base = _checked_base(base, Xc.shape[1]) if derived else np.zeros(0, Xc.dtype)
    return _pairwise64_numba(Xc, rows, BLOCK64, n_chunks(Xc.shape[1], BLOCK64), base,
                             derivation(coef), derived)
