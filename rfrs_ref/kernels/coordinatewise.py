"""Coordinate-wise selection (median, trimmed mean, Bulyan's second step), fused
with applying the selection to every uploaded array.

At every coordinate k the s candidate rows ``rows`` are ranked by their
feature value ``F[i, k]``; a window of ranks is kept; every uploaded array is
combined over the kept rows with weights proportional to ``weights[i]``:

    out_q[k] = Σ_{i kept at k} wᵢ · A_q[i, k] / Σ_{i kept at k} wᵢ

Three windows:

- ``"trim"`` (trimmed mean, median): ranks ``t .. s − 1 − t``, i.e. the t
  largest and t smallest values are removed (Yin et al. 2018). The median is
  ``t = (s − 1) // 2``: one value for odd s, the two middle values for even s.
- ``"closest"`` (Bulyan, El Mhamdi et al. 2018): the ``s − 2t`` values closest
  to the median of the s values (for even s, the mean of the two middle
  values). They form a window of consecutive ranks, found by removing, 2t
  times, whichever end of the current window is farther from the median (the
  upper end on a tie).
- ``"nearest"`` (Meamed, Xie et al. 2018): the ``s − t`` values closest to the
  median, the same window with t removals instead of 2t.

Ranking (the same in every backend):

- **Total order.** Values are ordered by value, ties by row index (a stable
  sort), the order of ``np.sort``: −inf below every finite value, +inf above;
  NaN, which has no order, ranks as +inf (``np.sort`` puts it last too). So
  the median of [1, 2, 3, 4, −inf] is 2, as ``np.median`` says. A ±inf is an
  extreme at its own end, trimmed first from that end, and can only be kept
  when more than t values at that end are extreme (beyond the rule's
  assumption). Any placement of the non-finite values beyond the finite ones
  keeps the range law (with at most t arbitrary values, every kept value lies
  between two honest ones in the order); this one is ``np.sort``'s.
- **Uploads are checked too.** A row with a finite feature but a NaN or ±inf
  in any uploaded array at coordinate k is ranked at k as +inf, so a
  non-finite upload cannot be selected where the feature looked harmless. A
  ±inf feature keeps its own end whatever the uploads hold.
- ``kept[i]`` counts the coordinates at which row i is in the window.
- **Values near ±DBL_MAX.** The median of the "closest" and "nearest" windows is
  :func:`middle` (a/2 + b/2 where a + b overflows), and a window of finite values
  whose weighted sum overflows is combined as
  :func:`rfrs_ref.kernels.blocks.overflow_free_mean` (the Numba kernel flags those
  coordinates and the oracle computes them; CUDA does it in the kernel), so finite
  values always give a finite result; results that do not overflow are unchanged.

Backends: ``"numpy"`` (float64 oracle with a stable argsort), ``"numba"``
(parallel over column blocks; a pruned Batcher sorting network vectorised across
a block of coordinates, then one pass over every array: the data are read once),
``"cuda"`` (:mod:`rfrs_ref.kernels.cuda`).
"""

from __future__ import annotations

import functools
from typing import Mapping

import numpy as np
from numba import njit, prange

from rfrs_ref.kernels.blocks import overflow_free_mean
from rfrs_ref.kernels.distances import (_checked_base, _derived_tile, as_float_matrix,
                                        derivation, derived_features, n_chunks)

MODES = {"trim": 0, "closest": 1, "nearest": 2}

#: Columns processed together by one sorting network pass (the SIMD lanes).
BLOCK = 128


@functools.lru_cache(maxsize=None)
def sorting_network(s: int, needed: tuple[int, ...] | None = None) -> np.ndarray:
    """Comparators ``(a, b)``, a < b, of a network that sorts s values ascending.

    Batcher's odd-even merge sort for the next power of two N ≥ s, with the
    comparators that touch a position ≥ s removed (padding the input with +inf
    makes them no-ops, so what remains sorts any s values). With ``needed``,
    only the comparators on which those output positions depend are kept (a
    selection network).

    Returns:
        int64 array of shape (C, 2).
    """
    if s <= 0:
        raise ValueError(f"a sorting network needs at least one value, got s={s}")
    N = 1
    while N < s:
        N *= 2
    pairs = []
    p = 1
    while p < N:
        k = p
        while k >= 1:
            for j in range(k % p, N - k, 2 * k):
                for i in range(min(k, N - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        a, b = i + j, i + j + k
                        if b < s:
                            pairs.append((a, b))
            k //= 2
        p *= 2
    if needed is not None:
        live = set(needed)
        kept = []
        for a, b in reversed(pairs):
            if a in live or b in live:
                kept.append((a, b))
                live.update((a, b))
        pairs = kept[::-1]
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


def removals(mode: str, t: int) -> int:
    """How many values the window removes: 2t (trim, closest) or t (nearest)."""
    return t if mode == "nearest" else 2 * t


def _window_sizes(mode: str, s: int, t: int) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown window {mode!r}; choose one of: {', '.join(MODES)}")
    if t < 0 or s - removals(mode, t) < 1:
        need = "s − t" if mode == "nearest" else "s − 2t"
        raise ValueError(
            f"a coordinate-wise window needs {need} ≥ 1 kept values, got s={s}, t={t}"
        )


def middle(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(a + b)/2 elementwise, as ``0.5 * (a + b)``; where a + b overflows although a
    and b are finite, ``0.5 * a + 0.5 * b`` (the same value: halving is exact, so
    both are the rounding of (a + b)/2 whenever the halves are normal, which they
    are for values whose sum overflows). Sums that do not overflow are untouched."""
    with np.errstate(invalid="ignore", over="ignore"):
        m = 0.5 * (a + b)
        over = ~np.isfinite(m) & np.isfinite(a) & np.isfinite(b)
        if over.any():
            m = np.where(over, 0.5 * a + 0.5 * b, m)
    return m


def order_keys(F: np.ndarray, uploads) -> np.ndarray:
    """The ranking keys (float64): the feature, NaN -> +inf, and a finite feature
    whose row holds a non-finite upload value at that coordinate -> +inf; ±inf
    features stay at their own end (module docstring)."""
    keys = np.array(F, dtype=np.float64)
    keys[np.isnan(keys)] = np.inf
    for A in uploads:
        keys[np.isfinite(keys) & ~np.isfinite(A)] = np.inf
    return keys


def coordinatewise_numpy(
    features: np.ndarray,
    arrays: Mapping[str, np.ndarray],
    weights: np.ndarray,
    *,
    mode: str,
    t: int,
    rows: np.ndarray | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """Oracle: float64, a stable argsort per coordinate (see the module docstring).

    Returns:
        (aggregated arrays in their own dtypes, kept counts (n,) int64, number of
        coordinates at which a non-finite key was kept).
    """
    F = np.asarray(features, dtype=np.float64)
    n, D = F.shape
    rows = np.arange(n) if rows is None else np.asarray(rows, dtype=np.int64)
    s = rows.size
    _window_sizes(mode, s, t)
    keys = order_keys(F[rows], [np.asarray(A)[rows] for A in arrays.values()])
    order = np.argsort(keys, axis=0, kind="stable")  # (s, D): sorted position -> row
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(s)[:, None].repeat(D, axis=1), axis=0)
    sorted_keys = np.take_along_axis(keys, order, axis=0)
    if mode == "trim":
        lo = np.full(D, t)
        hi = np.full(D, s - 1 - t)
    else:
        if s % 2:
            med = sorted_keys[(s - 1) // 2]
        else:
            med = middle(sorted_keys[s // 2 - 1], sorted_keys[s // 2])
        lo = np.zeros(D, dtype=np.int64)
        hi = np.full(D, s - 1)
        cols = np.arange(D)
        with np.errstate(invalid="ignore"):
            for _ in range(removals(mode, t)):
                drop_low = (med - sorted_keys[lo, cols]) > (sorted_keys[hi, cols] - med)
                lo = lo + drop_low
                hi = hi - ~drop_low
    keep = (rank >= lo) & (rank <= hi)  # (s, D)
    w = np.asarray(weights, dtype=np.float64)[rows][:, None]
    wk = np.where(keep, w, 0.0)
    den = wk.sum(axis=0)
    out = {}
    for name, A in arrays.items():
        A = np.asarray(A)
        vals = np.asarray(A[rows], dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            num = np.where(keep, wk * vals, 0.0).sum(axis=0)
            res = num / den
            # a sum of finite kept values that overflowed: the mean without overflow
            over = ~np.isfinite(res) & np.where(keep, np.isfinite(vals), True).all(axis=0)
            if over.any():
                res[over] = overflow_free_mean(vals[:, over], wk[:, over])
            out[name] = res.astype(A.dtype)
    kept = np.zeros(n, dtype=np.int64)
    kept[rows] = keep.sum(axis=1)
    bad_kept = int((~np.isfinite(np.where(keep, keys, 0.0))).any(axis=0).sum())
    return out, kept, bad_kept


@njit(inline="always", fastmath={"contract"})
def _add_kept_row(arrays, r, k0, bw, w, keep, num):
    """num[q, k] += w · arrays[q][r, k0 + k] where keep[k], for every array q: a row's
    part of the window's weighted sums (one expression, so that the fused kernel and the
    shared columns' kernel take the same operations)."""
    for q in range(len(arrays)):
        a = arrays[q][r, k0:k0 + bw]
        nm = num[q]
        for k in range(bw):
            # a select, not a product with 0: 0 · NaN would be NaN
            nm[k] += w * np.float64(a[k]) if keep[k] else 0.0


@njit(inline="always")
def _ranked_by_counting(keys, mult, le, srt, bw, mode, t, s, inf, nz):
    """srt[p, k] = the value at rank p of column k's s candidate keys, given as nk key
    rows of ``mult`` candidates each: the least key whose count of candidates with a key
    at or below it exceeds p. That is the p-th value of the sorted column (equal keys
    are one value, whatever their order), so the window is the sorted column's. Only
    the ranks the window reads are filled: t and s − 1 − t for "trim", all for the
    others (their median and the window's search read every rank)."""
    nk = keys.shape[0]
    for g in range(nk):
        kg = keys[g]
        lg = le[g]
        for k in range(bw):
            lg[k] = 0
        for h in range(nk):
            kh = keys[h]
            mh = mult[h]
            for k in range(bw):
                lg[k] += mh * np.int32(kh[k] <= kg[k])
    if mode == 0:
        _value_at_rank(keys, le, srt[t], t, bw, inf, nz)
        _value_at_rank(keys, le, srt[s - 1 - t], s - 1 - t, bw, inf, nz)
    else:
        for p in range(s):
            _value_at_rank(keys, le, srt[p], p, bw, inf, nz)


@njit(inline="always")
def _value_at_rank(keys, le, sp, p, bw, inf, nz):
    """sp[k] = the least key at column k whose count ``le`` exceeds p."""
    for k in range(bw):
        sp[k] = inf
    for g in range(keys.shape[0]):
        kg = keys[g]
        lg = le[g]
        for k in range(bw):
            v = kg[k]
            # + nz: a plain select, not a masked store (see the network's comment)
            sp[k] = (v if (lg[k] > p) & (v < sp[k]) else sp[k]) + nz


@njit(cache=True, parallel=True, fastmath={"contract"})
def _coordinatewise_numba(F, base, coef, derived, arrays, check, outs, over, weights, rows, comps, mode,
                          t, block, nchunks, nz, drows, kmap, arows, mult, counting):
    """The fused kernel. ``arrays``/``outs``: tuples of (n, D) inputs and (D,) outputs.
    ``derived``: the features are derived from ``F`` (``base`` (D,), ``coef`` the
    derivation), each the float64 value rounded once to F's dtype where it is read
    (:func:`derived_features`'s values); else ``F`` itself (``base`` unused).
    ``over`` (D,) bool: set where a window of finite values gave a non-finite result in
    some array (a float64 sum that overflowed), for the caller to compute again.

    ``check[q]`` says whether array q must be checked for non-finite values (not
    when it is the features themselves).

    Rows given once for several candidates (:func:`coordinatewise_combine`'s
    ``copies``): ``drows`` (nk,) the data rows whose keys are computed, ``kmap`` (s,)
    the key row of each candidate, ``arows`` (s,) its data row, ``mult`` (nk,) how
    many candidates share each key row. With ``counting``, the nk < s key rows are not
    sorted: the value at rank p is the least key whose count of candidates at or
    below it exceeds p (the sorted column's value there, whatever the ties), found
    only at the ranks the window reads. Without copies, ``drows = arows = rows``,
    ``kmap`` is 0..s − 1 and every ``mult`` is 1.

    Per column block: keys (non-finite features and uploads -> +inf), a copy sorted by
    the comparator network across the block's lanes, the per-lane window of
    ranks, then one pass over the candidate rows that decides, by stable rank,
    which are kept and accumulates every array. Returns the per-chunk kept
    counts and the per-chunk count of coordinates where a non-finite key is kept.
    """
    # n the candidates' rows (the weights'); F may hold fewer (copies)
    n, D = weights.shape[0], F.shape[1]
    s = rows.shape[0]
    nq = len(arrays)
    nblocks = (D + block - 1) // block
    kept = np.zeros((nchunks, n), dtype=np.int64)
    bad = np.zeros(nchunks, dtype=np.int64)
    inf = F.dtype.type(np.inf)
    nk = drows.shape[0]
    for c in prange(nchunks):
        keys = np.empty((nk, block), dtype=F.dtype)
        srt = np.empty((s, block), dtype=F.dtype)
        # counting: at each key row, the candidates whose key is ≤ its own
        le = np.empty((nk, block), dtype=np.int32)
        # int32 counters: as wide as float32 lanes, so the passes vectorise
        lo_pos = np.empty(block, dtype=np.int32)
        hi_pos = np.empty(block, dtype=np.int32)
        lo_v = np.empty(block, dtype=F.dtype)
        hi_v = np.empty(block, dtype=F.dtype)
        cl_lo = np.empty(block, dtype=np.int32)
        cl_hi = np.empty(block, dtype=np.int32)
        le_hi = np.empty(block, dtype=np.int32)
        seen_lo = np.empty(block, dtype=np.int32)
        seen_hi = np.empty(block, dtype=np.int32)
        keep = np.empty(block, dtype=np.bool_)
        fin_win = np.empty(block, dtype=np.bool_)
        med_v = np.empty(block)
        den = np.empty(block)
        num = np.empty((nq, block))
        for b in range(c * nblocks // nchunks, (c + 1) * nblocks // nchunks):
            k0 = b * block
            bw = min(D, k0 + block) - k0
            if derived:
                _derived_tile(F, base, coef, drows, k0, k0 + bw, keys)
            for r in range(nk):
                i = drows[r]
                kr = keys[r]
                # the derived features are already in the keys, in F's dtype (the tile)
                x = kr if derived else F[i, k0:k0 + bw]
                for k in range(bw):
                    v = x[k]
                    # NaN -> +inf; ±inf stay at their own end (np.sort's order); + nz
                    # as in the network below (x may be kr itself)
                    kr[k] = (v if v == v else inf) + nz
                for q in range(nq):
                    if not check[q]:
                        continue
                    a = arrays[q][i, k0:k0 + bw]
                    for k in range(bw):
                        v = kr[k]
                        # a finite feature with a non-finite upload value ranks as +inf
                        kr[k] = (inf if (v - v == 0) & (a[k] - a[k] != 0) else v) + nz
                if not counting:
                    sr = srt[r]
                    for k in range(bw):
                        sr[k] = kr[k]
            if counting:
                _ranked_by_counting(keys, mult, le, srt, bw, mode, t, s, inf, nz)
            for e in range(comps.shape[0]):
                ra = srt[comps[e, 0]]
                rb = srt[comps[e, 1]]
                # + nz (−0.0, an argument, so an exact identity the compiler cannot
                # see): without it LLVM drops the store of a value back into the
                # place it was read from (ra[k] where x < y) and vectorises what is
                # left as a masked store, microcoded on AMD's AVX2 cores (Zen 1-3: the
                # network ran about four times slower there)
                for k in range(bw):
                    x = ra[k]
                    y = rb[k]
                    ra[k] = (x if x < y else y) + nz
                    rb[k] = (y if x < y else x) + nz
            if mode == 0:
                for k in range(bw):
                    lo_pos[k] = np.int32(t)
                    hi_pos[k] = np.int32(s - 1 - t)
            else:
                # the window start is the number of j < r whose left end s[j] is
                # farther from the median than the right end s[j + β] of the
                # window starting at j (a monotone predicate); equal to removing
                # the farther end r times (r = 2t, or t for "nearest"), upper end
                # on a tie, and vectorisable
                rem = 2 * t if mode == 1 else t
                beta = s - rem
                for k in range(bw):
                    if s % 2 == 1:
                        med_v[k] = np.float64(srt[(s - 1) // 2, k])
                    else:
                        # (a + b)/2, and a/2 + b/2 where a + b overflows (``middle``)
                        ma = np.float64(srt[s // 2 - 1, k])
                        mb = np.float64(srt[s // 2, k])
                        mm = 0.5 * (ma + mb)
                        keep_mm = (mm - mm == 0) | (ma - ma != 0) | (mb - mb != 0)
                        med_v[k] = mm if keep_mm else 0.5 * ma + 0.5 * mb
                    lo_pos[k] = 0
                for j in range(rem):
                    left = srt[j]
                    right = srt[j + beta]
                    for k in range(bw):
                        lo_pos[k] += np.int32((med_v[k] - left[k]) > (right[k] - med_v[k]))
                for k in range(bw):
                    hi_pos[k] = lo_pos[k] + np.int32(beta - 1)
            for k in range(bw):
                lo_v[k] = srt[lo_pos[k], k]
                hi_v[k] = srt[hi_pos[k], k]
                cl_lo[k] = 0
                cl_hi[k] = 0
                le_hi[k] = 0
                seen_lo[k] = 0
                seen_hi[k] = 0
                den[k] = 0.0
                fin_win[k] = lo_v[k] - lo_v[k] == 0 and hi_v[k] - hi_v[k] == 0
                if not fin_win[k]:
                    bad[c] += 1
            num[:, :bw] = 0.0
            for r in range(nk):
                kr = keys[r]
                mr = mult[r]
                for k in range(bw):
                    cl_lo[k] += mr * np.int32(kr[k] < lo_v[k])
                    cl_hi[k] += mr * np.int32(kr[k] < hi_v[k])
                    le_hi[k] += mr * np.int32(kr[k] <= hi_v[k])
            # Without ties at the window's ends (exactly lo_pos values below lo,
            # and exactly hi_pos + 1 values up to hi), the kept rows are those with
            # lo ≤ value ≤ hi; otherwise the stable ranks of the tied values decide.
            ties = False
            for k in range(bw):
                ties |= (cl_lo[k] != lo_pos[k]) | (le_hi[k] != hi_pos[k] + 1)
            for r in range(s):
                i = rows[r]
                kr = keys[kmap[r]]
                w = weights[i]
                cnt = np.int32(0)
                if not ties:
                    for k in range(bw):
                        v = kr[k]
                        kk = (v >= lo_v[k]) & (v <= hi_v[k])
                        keep[k] = kk
                        cnt += np.int32(kk)
                        den[k] += w if kk else 0.0
                else:
                    for k in range(bw):
                        v = kr[k]
                        eq_lo = v == lo_v[k]
                        eq_hi = v == hi_v[k]
                        rl = cl_lo[k] + seen_lo[k]
                        rh = cl_hi[k] + seen_hi[k]
                        kk = ((v > lo_v[k]) & (v < hi_v[k])) | (
                            eq_lo & (rl >= lo_pos[k]) & (rl <= hi_pos[k])) | (
                            eq_hi & (rh >= lo_pos[k]) & (rh <= hi_pos[k]))
                        seen_lo[k] += np.int32(eq_lo)
                        seen_hi[k] += np.int32(eq_hi)
                        keep[k] = kk
                        cnt += np.int32(kk)
                        den[k] += w if kk else 0.0
                kept[c, i] += cnt
                if cnt == 0:
                    continue
                _add_kept_row(arrays, arows[r], k0, bw, w, keep, num)
            for q in range(nq):
                o = outs[q]
                nm = num[q]
                for k in range(bw):
                    v = nm[k] / den[k]
                    o[k0 + k] = v
                    if not (v - v == 0) and fin_win[k]:
                        over[k0 + k] = True
    return kept.sum(axis=0), bad.sum()


#: the most distinct rows whose ranks are counted (``_ranked_by_counting``, nk² compares
#: a column) rather than sorted by the network over every candidate
COUNTED_ROWS = 6


def _key_rows(data_rows: np.ndarray) -> tuple:
    """The kernel's ``(drows, kmap, arows, mult, counting)`` for candidates whose data
    rows are ``data_rows``: each distinct data row keyed once and its ranks counted
    where they repeat and are few (at most :data:`COUNTED_ROWS`), else one key row per
    candidate, sorted by the network."""
    s = data_rows.size
    distinct, kmap, mult = np.unique(data_rows, return_inverse=True, return_counts=True)
    if distinct.size < s and distinct.size <= COUNTED_ROWS:
        return (distinct.astype(np.int64), kmap.reshape(-1).astype(np.int64), data_rows,
                mult.astype(np.int32), True)
    return data_rows, np.arange(s, dtype=np.int64), data_rows, np.ones(s, dtype=np.int32), False


def _by_dtype(arrays: Mapping[str, np.ndarray], shape) -> tuple[dict, dict]:
    """The arrays as float matrices of ``shape`` (checked), and their names by dtype."""
    groups: dict[np.dtype, list[str]] = {}
    mats = {}
    for name, A in arrays.items():
        M = as_float_matrix(A, name)
        if M.shape != shape:
            raise ValueError(f"array {name!r} has shape {M.shape}, features have {shape}")
        mats[name] = M
        groups.setdefault(M.dtype, []).append(name)
    return mats, groups


def coordinatewise_combine(
    features: np.ndarray,
    arrays: Mapping[str, np.ndarray],
    weights: np.ndarray,
    *,
    mode: str,
    t: int,
    rows: np.ndarray | None = None,
    backend: str = "numba",
    base: np.ndarray | None = None,
    coef=None,
    copies: np.ndarray | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """Rank the candidate rows per coordinate on ``features``, keep a window of
    ranks, and combine every array over the kept rows (module docstring).

    Args:
        features: (n, D) detection features.
        arrays: name -> (n, D) uploaded arrays (the same rows as ``features``).
        weights: (n,) non-negative combination weights (the clients' nᵢ).
        mode: ``"trim"`` (ranks t .. s−1−t), ``"closest"`` (the s − 2t values
            closest to the median) or ``"nearest"`` (the s − t closest).
        t: trim parameter; needs s − 2t ≥ 1 (s − t ≥ 1 for ``"nearest"``).
        rows: candidate row indices (default: all n rows), e.g. Bulyan's selection.
        backend: ``"numpy"``, ``"numba"`` or ``"cuda"``.
        base: (D,) or None. Given, the features are :func:`derived_features`
            ``(features, base, coef)``: θᵢ − θ̄ of parameter-space detection when
            ``features`` is the uploaded θ and ``base`` the server's θ̄, or an affine
            recovery of the gradients (Adam's (m − β₁m̄)/(1 − β₁) with ``features``
            the uploaded m, ``base`` m̄ and ``coef`` (β₁, 1 − β₁, False)): the numba
            kernel computes each where it reads it (the same values, bit for bit),
            so no (n, D) feature matrix exists; the other backends, and uploads of
            more than one dtype, build it.
        coef: with ``base``, the derivation ``(a, c, flip)``
            (:func:`rfrs_ref.kernels.distances.derivation`; None: θᵢ − θ̄).
        copies: (n,) or None. Given, ``features`` and every array hold u distinct
            rows and row i is their row ``copies[i]`` (rows a pre-aggregator made
            equal, bit for bit): the result is the one on the n rows written out,
            bit for bit, with each distinct row read and ranked once where the
            candidates repeat few rows (the value at each rank counted, not sorted,
            ``_ranked_by_counting``) and the weighted sums still added row by row in
            index order. The numba backend; the others write the rows out.

    Returns:
        ``(out, kept, nonfinite_kept)``: aggregated arrays (D,) in each array's
        dtype; int64 (n,) number of coordinates at which each row was kept; the
        number of coordinates at which a non-finite value was kept (0 unless more
        than t values at a coordinate are non-finite).
    """
    if copies is not None:
        copies = np.asarray(copies, dtype=np.int64)
        u = np.shape(features)[0]
        if copies.ndim != 1 or copies.size == 0 or copies.min() < 0 or copies.max() >= u:
            raise ValueError(f"copies must map each row to one of the {u} rows given, got "
                             f"{copies.tolist()[:20]}")
        if backend != "numba":
            features = np.asarray(features)[copies]
            arrays = {nm: np.asarray(A)[copies] for nm, A in arrays.items()}
            copies = None
    if base is not None and (backend != "numba"
                             or len({np.asarray(A).dtype for A in arrays.values()}) > 1):
        features, base = derived_features(features, base, coef), None
    if backend == "numpy":
        return coordinatewise_numpy(features, arrays, weights, mode=mode, t=t, rows=rows)
    F = as_float_matrix(features, "features")
    n, D = F.shape
    src = np.arange(n, dtype=np.int64)
    if copies is not None:
        n, src = copies.size, copies
    derived = base is not None
    base = _checked_base(base, D) if derived else np.zeros(0, dtype=F.dtype)
    coef = derivation(coef if derived else None)
    rows_ = np.arange(n, dtype=np.int64) if rows is None else np.ascontiguousarray(rows, dtype=np.int64)
    s = rows_.size
    _window_sizes(mode, s, t)
    w = np.ascontiguousarray(weights, dtype=np.float64)
    if backend == "cuda":
        from rfrs_ref.kernels import cuda as _cuda

        return _cuda.coordinatewise_cuda(F, arrays, w, MODES[mode], t, rows_)
    if backend != "numba":
        raise ValueError(f"unknown backend {backend!r}; choose one of: numpy, numba, cuda")
    plan = _key_rows(src[rows_])
    if plan[4]:
        comps = np.zeros((0, 2), dtype=np.int64)
    else:
        comps = sorting_network(s, (t, s - 1 - t) if mode == "trim" else None)
    # one kernel call per dtype of uploads: the tuple of arrays must be homogeneous
    mats, groups = _by_dtype(arrays, F.shape)
    out: dict[str, np.ndarray] = {}
    kept = np.zeros(n, dtype=np.int64)
    bad = 0
    over = np.zeros(D, dtype=np.bool_)
    if not groups:
        groups[F.dtype] = []
    for g, (dt, names) in enumerate(groups.items()):
        # the ranking sees every array, whatever its group: pass the others as a
        # finiteness mask folded into the features
        Fg = F
        others = [mats[o] for o in mats if o not in names]
        if others:
            Fg = F.copy()
            for M in others:
                Fg[np.isfinite(F) & ~np.isfinite(M)] = np.nan
        ins = tuple(mats[nm] for nm in names) or (F,)
        check = np.array([M is not F for M in ins], dtype=np.bool_)
        outs = tuple(np.empty(D, dtype=dt) for _ in ins)
        k, bcount = _coordinatewise_numba(Fg, base, coef, derived, ins, check, outs, over, w, rows_,
                                          comps, MODES[mode], t, BLOCK, n_chunks(D, BLOCK),
                                          F.dtype.type(-0.0), *plan)
        for nm, o in zip(names, outs):
            out[nm] = o
        if g == 0:
            kept, bad = k, int(bcount)
    if over.any():
        # sums of finite values that overflowed (rows near ±1.8e308): those coordinates
        # are computed again by the oracle, whose ranking is the kernel's
        cols = np.flatnonzero(over)
        Fc = derived_features(F[src][:, cols], base[cols], coef) if derived else F[src][:, cols]
        redo, _, _ = coordinatewise_numpy(Fc, {nm: mats[nm][src][:, cols] for nm in mats},
                                          w, mode=mode, t=t, rows=rows_)
        for nm in mats:
            o = out[nm]
            bad_cols = cols[~np.isfinite(o[cols])]
            o[bad_cols] = redo[nm][np.searchsorted(cols, bad_cols)]
    return out, kept, bad


# -- columns where every row of a class holds the same values (rounds on shared rows) --------

def shared_ranks(cls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ranks, counts)``: ranks (3, n) of the rows at a column where row i holds its
    class's value (``cls[i]`` ∈ {0, 1}), when class 0's value is below class 1's
    (pattern 0), above it (1), or equal to it (2); counts (2,) the rows of each class.

    Ranks are by value, ties by row index (the kernel's stable order): below, a row of the
    lower class ranks by its index among its class, a row of the upper class after every
    row of the lower one; equal, every row ranks by its own index.
    """
    cls = np.asarray(cls, dtype=np.int64)
    n = cls.size
    within = np.zeros(n, dtype=np.int64)
    counts = np.zeros(2, dtype=np.int64)
    for i, c in enumerate(cls.tolist()):
        within[i] = counts[c]
        counts[c] += 1
    ranks = np.empty((3, n), dtype=np.int64)
    ranks[0] = np.where(cls == 0, within, counts[0] + within)
    ranks[1] = np.where(cls == 1, within, counts[1] + within)
    ranks[2] = np.arange(n)
    return ranks, counts


@njit(cache=True, parallel=True, fastmath={"contract"})
def _window_shared_numba(Fs, arrays, cls, outs, weights, ranks, counts, mode, t, block, nchunks):
    """The window of ``mode`` on columns where row i holds row ``cls[i]`` of ``Fs`` and of
    each array (:func:`window_shared_combine`). A column's values sorted are its lower
    value c times (c the rows of the lower class) and then its upper value, so its
    window of ranks is the fused kernel's, found by the same comparisons on those
    values (for "closest" and "nearest": its median, then the window's start); the kept
    rows are those whose stable rank (``ranks[pattern]``) lies in it, and the sums are
    the fused kernel's, row by row in order (a row with nothing kept in a block is
    skipped, as there), so the outputs are its outputs bit for bit. Returns the kept
    count of each row and whether every column's values are finite."""
    nc, D = Fs.shape
    n = cls.shape[0]
    nq = len(arrays)
    nblocks = (D + block - 1) // block
    kept = np.zeros((nchunks, n), dtype=np.int64)
    nonfinite = np.zeros(nchunks, dtype=np.int64)
    rem = t if mode == 2 else 2 * t  # the values the window removes
    beta = n - rem  # and keeps
    for c in prange(nchunks):
        pat = np.empty(block, dtype=np.int64)
        lo = np.empty(block, dtype=np.int64)
        keep = np.empty(block, dtype=np.bool_)
        den = np.empty(block)
        num = np.empty((nq, block))
        for b in range(c * nblocks // nchunks, (c + 1) * nblocks // nchunks):
            k0 = b * block
            bw = min(D, k0 + block) - k0
            for k in range(bw):
                v0 = Fs[0, k0 + k]
                v1 = Fs[nc - 1, k0 + k]
                nonfinite[c] += not ((v0 - v0 == 0) and (v1 - v1 == 0))
                p = 2
                if v0 < v1:
                    p = 0
                elif v1 < v0:
                    p = 1
                pat[k] = p
                lo[k] = t
                if mode != 0:
                    # the sorted column: low (c_low times), then high
                    low = v0 if p != 1 else v1
                    high = v1 if p != 1 else v0
                    c_low = counts[0] if p == 0 else (counts[1] if p == 1 else n)
                    if n % 2 == 1:
                        med = np.float64(low if (n - 1) // 2 < c_low else high)
                    else:
                        ma = np.float64(low if n // 2 - 1 < c_low else high)
                        mb = np.float64(low if n // 2 < c_low else high)
                        mm = 0.5 * (ma + mb)
                        keep_mm = (mm - mm == 0) | (ma - ma != 0) | (mb - mb != 0)
                        med = mm if keep_mm else 0.5 * ma + 0.5 * mb
                    start = 0
                    for j in range(rem):
                        left = np.float64(low if j < c_low else high)
                        right = np.float64(low if j + beta < c_low else high)
                        start += (med - left) > (right - med)
                    lo[k] = start
                den[k] = 0.0
            num[:, :bw] = 0.0
            for i in range(n):
                w = weights[i]
                cnt = np.int32(0)
                for k in range(bw):
                    r = ranks[pat[k], i]
                    kk = (r >= lo[k]) & (r <= lo[k] + beta - 1)
                    keep[k] = kk
                    cnt += np.int32(kk)
                    den[k] += w if kk else 0.0
                kept[c, i] += cnt
                if cnt == 0:
                    continue
                _add_kept_row(arrays, cls[i], k0, bw, w, keep, num)
            for q in range(nq):
                o = outs[q]
                nm = num[q]
                for k in range(bw):
                    o[k0 + k] = nm[k] / den[k]
    return kept.sum(axis=0), nonfinite.sum() == 0


def window_shared_combine(features: np.ndarray, arrays: Mapping[str, np.ndarray], cls: np.ndarray,
                          weights: np.ndarray, *, mode: str, t: int):
    """:func:`coordinatewise_combine` (every row a candidate, numba) on columns where
    every row of a class holds the same values: row i's feature is ``features[cls[i]]``
    and its upload ``arrays[name][cls[i]]`` (FISM's Q rows that no sampled client owns,
    one row per class of client: docs/performance.md, "Robust rounds on shared rows").

    Formula: as :func:`coordinatewise_combine`, on the rows expanded by class; a
    column's sorted values are one value repeated, then the other, so its window of
    ranks follows from the two values and the classes' counts by the kernel's own
    comparisons, and its kept rows from their stable ranks (:func:`shared_ranks`):
    nothing is sorted, and the weighted sums are the fused kernel's operations in its
    order: the same outputs and kept counts bit for bit (tested against the kernel on
    the expanded rows, every window).

    Args:
        features: (classes, S) float32/float64, classes 1 or 2, finite.
        arrays: name -> (classes, S) uploads, finite.
        cls: (n,) int class of each row. weights: (n,) ≥ 0.
        mode: "trim", "closest" or "nearest". t: the window's parameter.

    Returns:
        ``(out, kept, nonfinite_kept)`` as :func:`coordinatewise_combine`, or None when
        a feature is not finite, or an output is not (an upload that is not finite, a
        float64 sum of values near ±1.8e308 that overflowed): the caller then runs the
        kernel on the expanded rows, which counts the non-finite values it keeps and
        combines an overflowing window without overflow, as it does for every round.
    """
    Fs = as_float_matrix(features, "features")
    cls = np.ascontiguousarray(cls, dtype=np.int64)
    if mode not in MODES:
        raise ValueError(f"unknown window {mode!r}; choose one of: {', '.join(MODES)}")
    if Fs.shape[0] not in (1, 2) or (cls.size and (cls.min() < 0 or cls.max() >= Fs.shape[0])):
        raise ValueError(f"features must hold one or two classes' rows and cls index them; "
                         f"got {Fs.shape[0]} rows and classes {sorted(set(cls.tolist()))}")
    _window_sizes(mode, cls.size, t)
    ranks, counts = shared_ranks(cls if Fs.shape[0] == 2 else np.zeros_like(cls))
    w = np.ascontiguousarray(weights, dtype=np.float64)
    mats, groups = _by_dtype(arrays, Fs.shape)
    out: dict[str, np.ndarray] = {}
    S = Fs.shape[1]
    kept = np.zeros(cls.size, dtype=np.int64)
    for dt, names in groups.items():
        ins = tuple(mats[nm] for nm in names)
        outs = tuple(np.empty(S, dtype=dt) for _ in ins)
        kept, finite = _window_shared_numba(Fs, ins, cls, outs, w, ranks, counts, MODES[mode], t,
                                            BLOCK, n_chunks(S, BLOCK))
        if not finite or not all(np.isfinite(o).all() for o in outs):
            return None
        out.update(zip(names, outs))
    return out, kept, 0
