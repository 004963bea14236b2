"""Fused Numba kernels of the optimiser family (docs/optimizers.md).

One kernel per optimiser and direction (client rule, recovery, verification),
each a single pass over D per client row: the gradient (or upload) row and the
server state are read once, every output array is written once, and nothing
the size of θ is allocated per client. Arithmetic is float64 in registers
whatever the arrays' dtype (float32 or float64); results are rounded once, when
stored. Scalars (ηₜ, 1 − β) are computed in float64 by the caller.

Layout of the work:

- Work items are (column chunk, row) pairs, chunk-major, spread over the
  threads by ``prange``: a thread walks every row of a chunk before the next
  chunk, so the state's chunk comes from memory once and from cache for the
  other rows.
- Inner loops index 1-D views of the chunk (``row[lo:hi]``): with 2-D indexing
  inside the loop Numba keeps per-access index arithmetic that stops LLVM from
  vectorising, which costs a factor of about four.
- Verification loops are branch-free so that they vectorise: structural
  failures (non-finite values, negative moments) are counted as integers, and
  the largest residual/tolerance ratio of a chunk is taken over the ratios'
  IEEE bit patterns read as int64 (order-preserving for non-negative floats; a
  NaN ratio, which only an overflow produces, sorts above +inf and fails). A
  float max reduction would not vectorise without fast-math, and fast-math
  (which assumes no NaN or inf) would break the very checks that look for them.

No ``fastmath`` anywhere: the kernels are bound by memory traffic (rule,
recovery) or by division (verification), and fast-math division, square root
or contraction would change the roundings that the verification tolerances
(:mod:`rfrs_ref.optim.tolerance`) count.

``rows`` maps gradient row i to output row ``rows[i]`` (rule), or lists the
rows to process (recovery).
"""

from __future__ import annotations

import contextlib

import numba
import numpy as np
from numba import njit, prange

from rfrs_ref.kernels.blocks import add_weighted_block, add_weighted_block_of, live_rows
from rfrs_ref.optim import tolerance as _tol
from rfrs_ref.optim.screen32 import (  # noqa: F401  (indices: compile-time constants)
    A32_B1, A32_B1IC1, A32_B2, A32_BG, A32_BM, A32_C2, A32_EPS, A32_FMAX, A32_IC1, A32_LR, A32_ONE,
    A32_SKC2, A32_SU3, A32_SU3C2, A32_SU10, A32_SU14, A32_U2, A32_U4, A32_U8, R32_B2ILR, R32_BG,
    R32_COEF, R32_DECAY, R32_EPS, R32_FMAX, R32_ILR, R32_SKC, R32_SU3, R32_SU3C, R32_SU10, R32_U4,
    R32_U8, adam_constants as screen32_adam, root_constants as screen32_root)

#: columns per work item: the state's chunk (up to 3 arrays × 8192 × 8 B) stays
#: in L2 while every row is processed over it
CHUNK = 8192

_sgd_recovery_bound = njit(inline="always")(_tol.sgd_recovery_bound)
_momentum_theta_bound = njit(inline="always")(_tol.momentum_theta_bound)
_adam_recovery_bound = njit(inline="always")(_tol.adam_recovery_bound)
_adam_theta_bound = njit(inline="always")(_tol.adam_theta_bound)
_root_recovery_bound = njit(inline="always")(_tol.root_recovery_bound)
_second_moment_bound = njit(inline="always")(_tol.second_moment_bound)


#: below this many elements a call runs on one thread: waking the second thread
#: costs more than the work, and on a busy machine it can stall for milliseconds
SERIAL_BELOW = 1 << 16


@contextlib.contextmanager
def threads_for(n_elements: int):
    """Run the enclosed kernel calls on one thread when the work is small."""
    if n_elements >= SERIAL_BELOW:
        yield
        return
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(previous)


@njit(inline="always")
def _n_chunks(D):
    return (D + CHUNK - 1) // CHUNK


# -- client rules ----------------------------------------------------------------------

@njit(cache=True, parallel=True)
def sgd_rule(theta_bar, grads, rows, lr, out_theta):
    """out_theta[rows[i]] = θ̄ − η·grads[i]."""
    n, D = grads.shape
    nch = _n_chunks(D)
    for idx in prange(n * nch):
        c = idx // n
        i = idx - c * n
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        tb, g, ot = theta_bar[lo:hi], grads[i, lo:hi], out_theta[rows[i], lo:hi]
        for k in range(hi - lo):
            ot[k] = np.float64(tb[k]) - lr * np.float64(g[k])


@njit(cache=True, parallel=True)
def momentum_rule(m_bar, theta_bar, grads, rows, beta3, lr, out_m, out_theta):
    """m = β₃m̄ + g; θ = θ̄ − η·m (θ from the float64 m)."""
    n, D = grads.shape
    nch = _n_chunks(D)
    for idx in prange(n * nch):
        c = idx // n
        i = idx - c * n
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        r = rows[i]
        mb, tb, g = m_bar[lo:hi], theta_bar[lo:hi], grads[i, lo:hi]
        om, ot = out_m[r, lo:hi], out_theta[r, lo:hi]
        for k in range(hi - lo):
            m = beta3 * np.float64(mb[k]) + np.float64(g[k])
            om[k] = m
            ot[k] = np.float64(tb[k]) - lr * m


@njit(cache=True, parallel=True)
def adam_rule(m_bar, v_bar, theta_bar, grads, rows, beta1, c1, beta2, c2, lr_t, eps,
              out_m, out_v, out_theta):
    """m = β₁m̄ + c₁g; v = β₂v̄ + c₂g²; θ = θ̄ − ηₜ·m/(√v + ε) (θ from float64 m, v)."""
    n, D = grads.shape
    nch = _n_chunks(D)
    for idx in prange(n * nch):
        c = idx // n
        i = idx - c * n
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        r = rows[i]
        mb, vb, tb, gr = m_bar[lo:hi], v_bar[lo:hi], theta_bar[lo:hi], grads[i, lo:hi]
        om, ov, ot = out_m[r, lo:hi], out_v[r, lo:hi], out_theta[r, lo:hi]
        for k in range(hi - lo):
            g = np.float64(gr[k])
            m = beta1 * np.float64(mb[k]) + c1 * g
            v = beta2 * np.float64(vb[k]) + c2 * (g * g)
            om[k] = m
            ov[k] = v
            ot[k] = np.float64(tb[k]) - lr_t * m / (np.sqrt(v) + eps)


@njit(cache=True, parallel=True)
def root_rule(r_bar, theta_bar, grads, rows, decay, coef, lr, eps, out_r, out_theta):
    """r = decay·r̄ + coef·g²; θ = θ̄ − η·g/(√r + ε) (AdaGrad: (1, 1); RMSProp: (β₄, 1 − β₄))."""
    n, D = grads.shape
    nch = _n_chunks(D)
    for idx in prange(n * nch):
        c = idx // n
        i = idx - c * n
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        row = rows[i]
        rb, tb, gr = r_bar[lo:hi], theta_bar[lo:hi], grads[i, lo:hi]
        orr, ot = out_r[row, lo:hi], out_theta[row, lo:hi]
        for k in range(hi - lo):
            g = np.float64(gr[k])
            r = decay * np.float64(rb[k]) + coef * (g * g)
            orr[k] = r
            ot[k] = np.float64(tb[k]) - lr * g / (np.sqrt(r) + eps)


# -- recovery --------------------------------------------------------------------------

@njit(cache=True, parallel=True)
def sgd_recover(theta_bar, theta, rows, lr, out):
    """ĝ = (θ̄ − θ)/η."""
    n = rows.shape[0]
    D = theta.shape[1]
    nch = _n_chunks(D)
    for idx in prange(n * nch):
        c = idx // n
        r = rows[idx - c * n]
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        tb, th, o = theta_bar[lo:hi], theta[r, lo:hi], out[r, lo:hi]
        for k in range(hi - lo):
            o[k] = (np.float64(tb[k]) - np.float64(th[k])) / lr


@njit(cache=True, parallel=True)
def momentum_recover(m_bar, m, rows, beta3, out):
    """ĝ = m − β₃m̄."""
    n = rows.shape[0]
    D = m.shape[1]
    nch = _n_chunks(D)
    for idx in prange(n * nch):
        c = idx // n
        r = rows[idx - c * n]
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        mb, mr, o = m_bar[lo:hi], m[r, lo:hi], out[r, lo:hi]
        for k in range(hi - lo):
            o[k] = np.float64(mr[k]) - beta3 * np.float64(mb[k])


@njit(cache=True, parallel=True)
def adam_recover(m_bar, m, rows, beta1, c1, out):
    """ĝ = (m − β₁m̄)/(1 − β₁)."""
    n = rows.shape[0]
    D = m.shape[1]
    nch = _n_chunks(D)
    for idx in prange(n * nch):
        c = idx // n
        r = rows[idx - c * n]
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        mb, mr, o = m_bar[lo:hi], m[r, lo:hi], out[r, lo:hi]
        for k in range(hi - lo):
            o[k] = (np.float64(mr[k]) - beta1 * np.float64(mb[k])) / c1


@njit(cache=True, parallel=True)
def root_recover(theta_bar, r_up, theta, rows, lr, eps, out):
    """ĝ = (θ̄ − θ)(√r + ε)/η."""
    n = rows.shape[0]
    D = theta.shape[1]
    nch = _n_chunks(D)
    for idx in prange(n * nch):
        c = idx // n
        r = rows[idx - c * n]
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        tb, rr, th, o = theta_bar[lo:hi], r_up[r, lo:hi], theta[r, lo:hi], out[r, lo:hi]
        for k in range(hi - lo):
            d = np.float64(tb[k]) - np.float64(th[k])
            o[k] = d * (np.sqrt(np.float64(rr[k])) + eps) / lr


# -- verification ----------------------------------------------------------------------
# Each exact kernel returns float64 (len(rows), n_checks): per listed row and check, inf
# for a structural failure (the count of failing coordinates is > 0), else the largest
# residual/(safety·bound). Check order = the optimiser's ``checks``.
#
# Each screen kernel decides, per row, whether the row certainly passes, without a
# division per check: coordinate k passes check j when |ρ| ≤ S·τ with 0 < S·τ ≤ the
# largest finite float64, ρ and S·τ the very values the exact kernel computes (the same
# inlined expressions, no fast-math, so the same roundings). Then |ρ|/(S·τ) ≤ 1 in real
# arithmetic, and since rounding is monotone and 1 is representable, the exact kernel's
# ratio fl(|ρ|/(S·τ)) ≤ 1 as well: a row the screen passes passes the exact check. Every
# other row (a failed or merely close coordinate, a NaN, an overflow) is decided by the
# exact kernel, so the decision is the exact kernel's in every case.

_MAX_F64 = np.finfo(np.float64).max


@njit(inline="always")
def _ratio(residual, sb):
    # the outer abs clears the sign of a NaN, so that its bit pattern sorts above +inf
    return abs(abs(residual) / sb)


@njit(inline="always")
def _unsure(residual, sb):
    """0 when |residual| ≤ sb certainly gives a ratio ≤ 1, else 1 (division-free)."""
    return 1 - np.int64((abs(residual) <= sb) & (sb > 0.0) & (sb <= _MAX_F64))


@njit(inline="always")
def _bits_max(q):
    """Largest bit pattern of the non-negative float64 values (or NaN) in q."""
    qi = q.view(np.int64)
    best = np.int64(0)
    for k in range(qi.shape[0]):
        if qi[k] > best:
            best = qi[k]
    return best


@njit(cache=True)
def _finish(counts, bits, n_struct):
    """(n, n_struct + n_rule) ratios from per-chunk structural counts and ratio bits."""
    n, nch, n_rule = bits.shape
    out = np.zeros((n, n_struct + n_rule))
    for r in range(n):
        for j in range(n_struct):
            if counts[r, :, j].sum() > 0:
                out[r, j] = np.inf
        for j in range(n_rule):
            best = np.int64(0)
            for c in range(nch):
                if bits[r, c, j] > best:
                    best = bits[r, c, j]
            q = np.array([best]).view(np.float64)[0]
            out[r, n_struct + j] = np.inf if q != q else q
    return out


@njit(cache=True)
def _sure_rows(counts):
    """bool (n,): the rows whose every per-chunk count is 0."""
    n = counts.shape[0]
    out = np.empty(n, dtype=np.bool_)
    for r in range(n):
        out[r] = counts[r].sum() == 0
    return out


@njit(cache=True, parallel=True)
def sgd_verify(theta, rows):
    """checks: (nonfinite,)."""
    n = rows.shape[0]
    D = theta.shape[1]
    nch = _n_chunks(D)
    counts = np.zeros((n, nch, 1), dtype=np.int64)
    for idx in prange(n * nch):
        c = idx // n
        i = idx - c * n
        r = rows[i]
        lo = c * CHUNK
        th = theta[r, lo:min(D, lo + CHUNK)]
        bad = 0
        for k in range(th.shape[0]):
            bad += 1 - np.int64(np.isfinite(th[k]))
        counts[i, c, 0] = bad
    return _finish(counts, np.zeros((n, nch, 0), dtype=np.int64), 1)


@njit(inline="always")
def _momentum_check(tbk, mk, th, lr, u, tiny, safety):
    """(ρ, S·τ) of momentum's theta-rule at one coordinate."""
    return th - (tbk - lr * mk), safety * _momentum_theta_bound(tbk, mk, lr, u, tiny)


@njit(cache=True, parallel=True)
def momentum_verify(theta_bar, m, theta, rows, lr, u, tiny, safety):
    """checks: (nonfinite, theta-rule): θ = θ̄ − η·m."""
    n = rows.shape[0]
    D = theta.shape[1]
    nch = _n_chunks(D)
    counts = np.zeros((n, nch, 1), dtype=np.int64)
    bits = np.zeros((n, nch, 1), dtype=np.int64)
    for idx in prange(n * nch):
        c = idx // n
        i = idx - c * n
        r = rows[i]
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        tb, mr, tr = theta_bar[lo:hi], m[r, lo:hi], theta[r, lo:hi]
        q = np.empty(hi - lo)
        bad = 0
        for k in range(hi - lo):
            mk = np.float64(mr[k])
            th = np.float64(tr[k])
            bad += 1 - np.int64(np.isfinite(mk) & np.isfinite(th))
            res, sb = _momentum_check(np.float64(tb[k]), mk, th, lr, u, tiny, safety)
            q[k] = _ratio(res, sb)
        counts[i, c, 0] = bad
        bits[i, c, 0] = _bits_max(q)
    return _finish(counts, bits, 1)


@njit(cache=True, parallel=True)
def momentum_screen(theta_bar, m, theta, lr, u, tiny, safety):
    """bool (n,): the rows that certainly pass momentum_verify (see above)."""
    n, D = theta.shape
    nch = _n_chunks(D)
    counts = np.zeros((n, nch), dtype=np.int64)
    for idx in prange(n * nch):
        c = idx // n
        r = idx - c * n
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        counts[r, c] = _momentum_unsure(theta_bar[lo:hi], m[r, lo:hi], theta[r, lo:hi], lr, u,
                                        tiny, safety)
    return _sure_rows(counts)


@njit(inline="always")
def _momentum_unsure(tb, mr, tr, lr, u, tiny, safety):
    """How many coordinates of one row's block the momentum screen cannot pass."""
    bad = 0
    for k in range(tr.shape[0]):
        mk = np.float64(mr[k])
        th = np.float64(tr[k])
        res, sb = _momentum_check(np.float64(tb[k]), mk, th, lr, u, tiny, safety)
        bad += (1 - np.int64(np.isfinite(mk) & np.isfinite(th))) + _unsure(res, sb)
    return bad


@njit(inline="always")
def _adam_checks(mk, vk, th, mbk, vbk, tbk, g, beta1, beta2, c2, lr_t, eps, u, tiny, safety):
    """(ρ_v, S·τ_v, ρ_θ, S·τ_θ) of Adam's v-rule and theta-rule at one coordinate."""
    b = _adam_recovery_bound(mbk, g, beta1, u, tiny)
    rv = vk - beta2 * vbk - c2 * (g * g)
    sv = safety * _second_moment_bound(vk, vbk, g, b, beta2, c2, u, tiny)
    # the same 1/(√v + ε) as in the bound, which the compiler computes once
    inv_s = 1.0 / (np.sqrt(vk) + eps)
    rt = th - (tbk - lr_t * mk * inv_s)
    st = safety * _adam_theta_bound(tbk, mk, vk, lr_t, eps, u, tiny)
    return rv, sv, rt, st


@njit(inline="always")
def _adam_gradients(gs, mr, mb, recovered, r, lo, hi, has_recovered, beta1, inv_c1):
    """ĝ of one chunk of one row, into gs: the recovered rows' values, or recovered here."""
    if has_recovered:
        rec = recovered[r, lo:hi]
        for k in range(hi - lo):
            gs[k] = rec[k]
    else:
        for k in range(hi - lo):
            gs[k] = (np.float64(mr[k]) - beta1 * np.float64(mb[k])) * inv_c1


@njit(cache=True, parallel=True)
def adam_verify(m_bar, v_bar, theta_bar, m, v, theta, recovered, has_recovered, rows,
                beta1, c1, beta2, c2, lr_t, eps, u, tiny, safety):
    """checks: (nonfinite, negative-v, v-rule, theta-rule)."""
    n = rows.shape[0]
    D = theta.shape[1]
    nch = _n_chunks(D)
    counts = np.zeros((n, nch, 2), dtype=np.int64)
    bits = np.zeros((n, nch, 2), dtype=np.int64)
    # a division by a loop-invariant value stays a division without fast-math:
    # multiply by the reciprocal instead (one more rounding, counted)
    inv_c1 = 1.0 / c1
    for idx in prange(n * nch):
        c = idx // n
        i = idx - c * n
        r = rows[i]
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        L = hi - lo
        mb, vb, tb = m_bar[lo:hi], v_bar[lo:hi], theta_bar[lo:hi]
        mr, vr, tr = m[r, lo:hi], v[r, lo:hi], theta[r, lo:hi]
        gs = np.empty(L)
        _adam_gradients(gs, mr, mb, recovered, r, lo, hi, has_recovered, beta1, inv_c1)
        qv = np.empty(L)
        qt = np.empty(L)
        bad = 0
        neg = 0
        for k in range(L):
            mk = np.float64(mr[k])
            vk = np.float64(vr[k])
            th = np.float64(tr[k])
            bad += 1 - np.int64(np.isfinite(mk) & np.isfinite(vk) & np.isfinite(th))
            neg += np.int64(vk < 0.0)
            rv, sv, rt, st = _adam_checks(mk, vk, th, np.float64(mb[k]), np.float64(vb[k]),
                                          np.float64(tb[k]), gs[k], beta1, beta2, c2, lr_t, eps,
                                          u, tiny, safety)
            qv[k] = _ratio(rv, sv)
            qt[k] = _ratio(rt, st)
        counts[i, c, 0] = bad
        counts[i, c, 1] = neg
        bits[i, c, 0] = _bits_max(qv)
        bits[i, c, 1] = _bits_max(qt)
    return _finish(counts, bits, 2)


@njit(cache=True, parallel=True)
def adam_screen(m_bar, v_bar, theta_bar, m, v, theta, recovered, has_recovered,
                beta1, c1, beta2, c2, lr_t, eps, u, tiny, safety, k32, use32):
    """bool (n,): the rows that certainly pass adam_verify (see above); with ``use32``
    each block is first screened in float32 (see "the float32 screen" below)."""
    n, D = theta.shape
    nch = _n_chunks(D)
    counts = np.zeros((n, nch), dtype=np.int64)
    inv_c1 = 1.0 / c1
    for idx in prange(n * nch):
        c = idx // n
        r = idx - c * n
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        L = hi - lo
        mb, vb, tb = m_bar[lo:hi], v_bar[lo:hi], theta_bar[lo:hi]
        mr, vr, tr = m[r, lo:hi], v[r, lo:hi], theta[r, lo:hi]
        bad = 1
        if use32:
            bad = _adam_unsure32(mb, vb, tb, mr, vr, tr, recovered, r, lo, has_recovered, k32)
        if bad > 0:
            gs = np.empty(L)
            _adam_gradients(gs, mr, mb, recovered, r, lo, hi, has_recovered, beta1, inv_c1)
            bad = _adam_unsure(mb, vb, tb, mr, vr, tr, gs, beta1, beta2, c2, lr_t, eps, u, tiny,
                               safety)
        counts[r, c] = bad
    return _sure_rows(counts)


@njit(inline="always")
def _adam_unsure(mb, vb, tb, mr, vr, tr, gs, beta1, beta2, c2, lr_t, eps, u, tiny, safety):
    """How many coordinates of one row's block the Adam screen cannot pass (gs: its ĝ)."""
    bad = 0
    for k in range(tr.shape[0]):
        mk = np.float64(mr[k])
        vk = np.float64(vr[k])
        th = np.float64(tr[k])
        rv, sv, rt, st = _adam_checks(mk, vk, th, np.float64(mb[k]), np.float64(vb[k]),
                                      np.float64(tb[k]), gs[k], beta1, beta2, c2, lr_t, eps,
                                      u, tiny, safety)
        bad += ((1 - np.int64(np.isfinite(mk) & np.isfinite(vk) & np.isfinite(th)))
                + np.int64(vk < 0.0) + _unsure(rv, sv) + _unsure(rt, st))
    return bad


@njit(inline="always")
def _root_gradients(gs, tb, tr, rr, recovered, r, lo, hi, has_recovered, eps, inv_lr):
    if has_recovered:
        rec = recovered[r, lo:hi]
        for k in range(hi - lo):
            gs[k] = rec[k]
    else:
        for k in range(hi - lo):
            d = np.float64(tb[k]) - np.float64(tr[k])
            gs[k] = d * (np.sqrt(np.float64(rr[k])) + eps) * inv_lr


@njit(inline="always")
def _root_check(rk, rbk, tbk, g, decay, coef, lr, eps, u, tiny, safety):
    """(ρ, S·τ) of the r-rule at one coordinate."""
    b = _root_recovery_bound(tbk, rk, g, lr, eps, u, tiny)
    return (rk - decay * rbk - coef * (g * g),
            safety * _second_moment_bound(rk, rbk, g, b, decay, coef, u, tiny))


@njit(cache=True, parallel=True)
def root_verify(r_bar, theta_bar, r_up, theta, recovered, has_recovered, rows,
                decay, coef, lr, eps, u, tiny, safety):
    """checks: (nonfinite, negative-r, r-rule)."""
    n = rows.shape[0]
    D = theta.shape[1]
    nch = _n_chunks(D)
    counts = np.zeros((n, nch, 2), dtype=np.int64)
    bits = np.zeros((n, nch, 1), dtype=np.int64)
    inv_lr = 1.0 / lr
    for idx in prange(n * nch):
        c = idx // n
        i = idx - c * n
        r = rows[i]
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        L = hi - lo
        rb, tb = r_bar[lo:hi], theta_bar[lo:hi]
        rr, tr = r_up[r, lo:hi], theta[r, lo:hi]
        gs = np.empty(L)
        _root_gradients(gs, tb, tr, rr, recovered, r, lo, hi, has_recovered, eps, inv_lr)
        q = np.empty(L)
        bad = 0
        neg = 0
        for k in range(L):
            rk = np.float64(rr[k])
            th = np.float64(tr[k])
            bad += 1 - np.int64(np.isfinite(rk) & np.isfinite(th))
            neg += np.int64(rk < 0.0)
            res, sb = _root_check(rk, np.float64(rb[k]), np.float64(tb[k]), gs[k], decay, coef,
                                  lr, eps, u, tiny, safety)
            q[k] = _ratio(res, sb)
        counts[i, c, 0] = bad
        counts[i, c, 1] = neg
        bits[i, c, 0] = _bits_max(q)
    return _finish(counts, bits, 2)


@njit(cache=True, parallel=True)
def root_screen(r_bar, theta_bar, r_up, theta, recovered, has_recovered,
                decay, coef, lr, eps, u, tiny, safety, k32, use32):
    """bool (n,): the rows that certainly pass root_verify (see above); with ``use32``
    each block is first screened in float32 (see "the float32 screen" below)."""
    n, D = theta.shape
    nch = _n_chunks(D)
    counts = np.zeros((n, nch), dtype=np.int64)
    inv_lr = 1.0 / lr
    for idx in prange(n * nch):
        c = idx // n
        r = idx - c * n
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        L = hi - lo
        rb, tb = r_bar[lo:hi], theta_bar[lo:hi]
        rr, tr = r_up[r, lo:hi], theta[r, lo:hi]
        bad = 1
        if use32:
            bad = _root_unsure32(rb, tb, rr, tr, recovered, r, lo, has_recovered, k32)
        if bad > 0:
            gs = np.empty(L)
            _root_gradients(gs, tb, tr, rr, recovered, r, lo, hi, has_recovered, eps, inv_lr)
            bad = _root_unsure(rb, tb, rr, tr, gs, decay, coef, lr, eps, u, tiny, safety)
        counts[r, c] = bad
    return _sure_rows(counts)


@njit(inline="always")
def _root_unsure(rb, tb, rr, tr, gs, decay, coef, lr, eps, u, tiny, safety):
    """How many coordinates of one row's block the AdaGrad/RMSProp screen cannot pass."""
    bad = 0
    for k in range(tr.shape[0]):
        rk = np.float64(rr[k])
        th = np.float64(tr[k])
        res, sb = _root_check(rk, np.float64(rb[k]), np.float64(tb[k]), gs[k], decay, coef,
                              lr, eps, u, tiny, safety)
        bad += ((1 - np.int64(np.isfinite(rk) & np.isfinite(th))) + np.int64(rk < 0.0)
                + _unsure(res, sb))
    return bad


# -- the float32 screen: the screen's decision in float32 arithmetic, where it is sure --
# (derivation: docs/optimizers.md, "The screen in float32"; the readable reference:
# rfrs_ref/optim/screen32.py.) For float32 uploads and state the screen kernels (above and
# below) first decide each block in float32 arithmetic (no conversion to
# float64, twice the vector lanes, a float32 square root and reciprocal): a coordinate is
# sure when
#
#     |ρ₃₂| + E₃₂ ≤ L₃₂   and   L₃₂ ≤ the largest finite float32,
#
# ρ₃₂ the check's residual evaluated in float32, E₃₂ a bound on how far the float64
# screen's residual can lie from it (every float32 rounding of the evaluation, the
# float64 roundings, and, where ĝ is recovered in registers, the difference between the
# float32 and the float64 ĝ), and L₃₂ a lower bound on the float64 screen's S·τ (the
# terms of τ in u, with ĝ lowered by that difference, the tiny terms left out, times
# S·(1 − 2⁻¹⁶) to absorb the roundings of the float32 bound itself). The tiny terms
# that τ keeps cover every underflow of the float32 evaluation (S ≥ 1). So a coordinate
# the float32 screen passes is one the float64 screen passes, and a block with any
# coordinate it cannot pass is screened again in float64: the rows found sure are the
# float64 screen's, bit for bit. The caller enables it (``use32``) only when the state
# and the uploads are float32, 1 ≤ S ≤ 2²⁰ and every hyperparameter is 0 or within
# [2⁻¹⁰⁰, 2¹⁰⁰] (``screen32_adam`` / ``screen32_root``); ``k32`` holds the float32
# constants, indexed as in rfrs_ref/optim/screen32.py.

@njit(inline="always")
def _adam_coord32(mk, vk, th, mbk, vbk, tbk, g, k):
    """True when the float32 test cannot pass Adam's coordinate (both rule checks)."""
    zero = np.float32(0.0)
    ag = abs(g)
    amb = abs(mbk)
    # Δ ≥ |ĝ₃₂ − ĝ₆₄|; glo ≤ |ĝ₆₄|
    dg = k[A32_U4] * (ag + k[A32_B1IC1] * amb)
    glo = ag - (dg + dg)
    glo = glo if glo > zero else zero
    # v-rule
    pv = k[A32_B2] * vbk
    q = k[A32_C2] * (g * g)
    rv = (vk - pv) - q
    arv = abs(rv)
    lv = arv + k[A32_U4] * (((vk + pv) + q) + arv) + k[A32_C2] * dg * ((ag + ag) + dg)
    bl = k[A32_BM] * amb + k[A32_BG] * glo
    sv = (k[A32_SU10] * vk + k[A32_SU3] * pv + k[A32_SU3C2] * (glo * glo)
          + k[A32_SKC2] * bl * ((glo + glo) + bl))
    # theta-rule
    d = th - tbk
    inv_s = k[A32_ONE] / (np.sqrt(vk) + k[A32_EPS])
    stp = (k[A32_LR] * mk) * inv_s
    rt = d + stp
    art = abs(rt)
    astp = abs(stp)
    lt = art + k[A32_U2] * (abs(d) + art) + k[A32_U8] * astp
    st_ = k[A32_SU3] * abs(tbk) + k[A32_SU14] * astp
    ok = ((lv <= sv) & (sv <= k[A32_FMAX]) & (lt <= st_) & (st_ <= k[A32_FMAX])
          & np.isfinite(mk) & np.isfinite(vk) & np.isfinite(th) & (vk >= zero))
    return not ok


@njit(inline="always")
def _adam_unsure32(mb, vb, tb, mr, vr, tr, recovered, r, lo, has_recovered, k, count=False):
    """1 if the float32 Adam screen cannot pass some coordinate of one row's block, else 0
    (with ``count``: how many it cannot pass).

    The screen kernels only ask whether a block is sure, so they reduce by OR: a bool
    reduction keeps the loop at float32's eight lanes a 256-bit vector, where an int64
    count (four 64-bit lanes a vector) held LLVM's vectoriser to four, half the width
    (``bench_optim.py`` times both). The count is for tests and benchmarks
    (:func:`adam_unsure32`)."""
    L = tr.shape[0]
    if count:
        n_bad = 0
        if has_recovered:
            rec = recovered[r, lo:lo + L]
            for j in range(L):
                n_bad += np.int64(_adam_coord32(mr[j], vr[j], tr[j], mb[j], vb[j], tb[j],
                                                np.float32(rec[j]), k))
        else:
            b1 = k[A32_B1]
            ic1 = k[A32_IC1]
            for j in range(L):
                g = (mr[j] - b1 * mb[j]) * ic1
                n_bad += np.int64(_adam_coord32(mr[j], vr[j], tr[j], mb[j], vb[j], tb[j], g, k))
        return n_bad
    bad = False
    if has_recovered:
        rec = recovered[r, lo:lo + L]
        for j in range(L):
            bad |= _adam_coord32(mr[j], vr[j], tr[j], mb[j], vb[j], tb[j], np.float32(rec[j]), k)
    else:
        b1 = k[A32_B1]
        ic1 = k[A32_IC1]
        for j in range(L):
            g = (mr[j] - b1 * mb[j]) * ic1
            bad |= _adam_coord32(mr[j], vr[j], tr[j], mb[j], vb[j], tb[j], g, k)
    return np.int64(bad)


@njit(inline="always")
def _root_coord32(rk, th, rbk, tbk, g, s, k):
    """True when the float32 test cannot pass the r-rule at one coordinate (s = √r + ε)."""
    zero = np.float32(0.0)
    ag = abs(g)
    dg = k[R32_U8] * ag
    glo = ag - dg
    glo = glo if glo > zero else zero
    pr = k[R32_DECAY] * rbk
    q = k[R32_COEF] * (g * g)
    rho = (rk - pr) - q
    arho = abs(rho)
    lhs = arho + k[R32_U4] * (((rk + pr) + q) + arho) + k[R32_COEF] * dg * ((ag + ag) + dg)
    bl = k[R32_B2ILR] * abs(tbk) * s + k[R32_BG] * glo
    rhs = (k[R32_SU10] * rk + k[R32_SU3] * pr + k[R32_SU3C] * (glo * glo)
           + k[R32_SKC] * bl * ((glo + glo) + bl))
    ok = (lhs <= rhs) & (rhs <= k[R32_FMAX]) & np.isfinite(rk) & np.isfinite(th) & (rk >= zero)
    return not ok


@njit(inline="always")
def _root_unsure32(rb, tb, rr, tr, recovered, r, lo, has_recovered, k, count=False):
    """1 if the float32 AdaGrad/RMSProp screen cannot pass some coordinate of one row's
    block, else 0 (with ``count``: how many; an OR for the kernels, as in
    :func:`_adam_unsure32`)."""
    L = tr.shape[0]
    eps = k[R32_EPS]
    if count:
        n_bad = 0
        if has_recovered:
            rec = recovered[r, lo:lo + L]
            for j in range(L):
                s = np.sqrt(rr[j]) + eps
                n_bad += np.int64(_root_coord32(rr[j], tr[j], rb[j], tb[j], np.float32(rec[j]),
                                                s, k))
        else:
            ilr = k[R32_ILR]
            for j in range(L):
                s = np.sqrt(rr[j]) + eps
                g = ((tb[j] - tr[j]) * s) * ilr
                n_bad += np.int64(_root_coord32(rr[j], tr[j], rb[j], tb[j], g, s, k))
        return n_bad
    bad = False
    if has_recovered:
        rec = recovered[r, lo:lo + L]
        for j in range(L):
            s = np.sqrt(rr[j]) + eps
            bad |= _root_coord32(rr[j], tr[j], rb[j], tb[j], np.float32(rec[j]), s, k)
    else:
        ilr = k[R32_ILR]
        for j in range(L):
            s = np.sqrt(rr[j]) + eps
            g = ((tb[j] - tr[j]) * s) * ilr
            bad |= _root_coord32(rr[j], tr[j], rb[j], tb[j], g, s, k)
    return np.int64(bad)


@njit(cache=True, parallel=True)
def adam_unsure32(m_bar, v_bar, theta_bar, m, v, theta, recovered, has_recovered, k32,
                  count=True):
    """int64 (n,): per row, the coordinates the float32 Adam test cannot pass (the float32
    half of adam_screen alone, for tests and benchmarks); ``count=False``: the blocks of
    CHUNK coordinates with one it cannot pass (the kernels' OR)."""
    n, D = theta.shape
    nch = _n_chunks(D)
    counts = np.zeros((n, nch), dtype=np.int64)
    for idx in prange(n * nch):
        c = idx // n
        r = idx - c * n
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        counts[r, c] = _adam_unsure32(m_bar[lo:hi], v_bar[lo:hi], theta_bar[lo:hi], m[r, lo:hi],
                                      v[r, lo:hi], theta[r, lo:hi], recovered, r, lo,
                                      has_recovered, k32, count)
    return counts.sum(axis=1)


@njit(cache=True, parallel=True)
def root_unsure32(r_bar, theta_bar, r_up, theta, recovered, has_recovered, k32, count=True):
    """int64 (n,): per row, the coordinates the float32 AdaGrad/RMSProp test cannot pass
    (``count=False``: the blocks with one, as :func:`adam_unsure32`)."""
    n, D = theta.shape
    nch = _n_chunks(D)
    counts = np.zeros((n, nch), dtype=np.int64)
    for idx in prange(n * nch):
        c = idx // n
        r = idx - c * n
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        counts[r, c] = _root_unsure32(r_bar[lo:hi], theta_bar[lo:hi], r_up[r, lo:hi],
                                      theta[r, lo:hi], recovered, r, lo, has_recovered, k32,
                                      count)
    return counts.sum(axis=1)


# -- the server's one pass for a rule with fixed weights: screen and weighted sums -------
# For a rule whose weights do not depend on the uploads (the weighted mean, no defence:
# wᵢ = nᵢ/Σnⱼ), the server used to read every upload twice: the screen of verification,
# then the weighted sums. These kernels do both in one pass over column blocks small
# enough (a block of every row of a call: rows · arrays · SCREEN_SUM_BLOCK · 4 B, 96 kB
# for the SCREEN_SUM_ROWS = 16 Adam rows a call is given, in float32) to stay in cache
# between the screen and the sums.
#
# Bit for bit: the screen's per-coordinate tests are the screen kernels' (the same inlined
# functions, ĝ recovered in registers as there), and the sums are ``add_weighted_block``'s
# (rows grouped by four in the same order, float64, no fast-math), which is what
# ``rfrs_ref.aggregate.combine.combine_rows`` computes; the column blocking only splits the
# coordinates, it does not change any coordinate's sum. The sums are added into float64
# accumulators ``acc_*`` (D,), so that rows may come in batches: batches of a multiple of
# four rows, in order, continue the grouping of one call over every row, and rounding the
# accumulators to the uploads' dtype at the end gives combine_rows's result. The sums
# stand for the aggregate only when every row passes the screen: the caller checks that
# and otherwise runs the exact verification and the rule on the rows that pass.
# ``screen`` False skips the screen (no verification) and returns every row as sure.

SCREEN_SUM_BLOCK = 512
#: rows per kernel call (the caller slices): with n = 55 Adam rows a block of every row
#: (330 kB) left the core's L2 between the screen and the sums, and the pass ran slower
#: than two passes; 16 rows (96 kB) stay
SCREEN_SUM_ROWS = 16


@njit(inline="always")
def _block_range(c, nchunks, D):
    nblocks = (D + SCREEN_SUM_BLOCK - 1) // SCREEN_SUM_BLOCK
    return c * nblocks // nchunks, (c + 1) * nblocks // nchunks


@njit(cache=True, parallel=True)
def sgd_screen_sum(theta, w, acc_theta, nchunks, screen):
    """bool (n,): rows whose θ is finite (SGD's only check); acc_theta += Σᵢ wᵢθᵢ."""
    n, D = theta.shape
    live, nl = live_rows(w)
    counts = np.zeros((n, nchunks), dtype=np.int64)
    for c in prange(nchunks):
        b0, b1 = _block_range(c, nchunks, D)
        for b in range(b0, b1):
            k0 = b * SCREEN_SUM_BLOCK
            hi = min(D, k0 + SCREEN_SUM_BLOCK)
            if screen:
                for r in range(n):
                    tr = theta[r, k0:hi]
                    bad = 0
                    for k in range(hi - k0):
                        bad += 1 - np.int64(np.isfinite(tr[k]))
                    counts[r, c] += bad
            add_weighted_block(theta, w, live, nl, k0, hi - k0, acc_theta[k0:hi])
    return _sure_rows(counts)


@njit(cache=True, parallel=True)
def momentum_screen_sum(theta_bar, m, theta, w, lr, u, tiny, safety, acc_m, acc_theta, nchunks,
                        screen):
    """momentum_screen's rows; acc += Σᵢ wᵢ·(m, θ)ᵢ, in one pass (see above)."""
    n, D = theta.shape
    live, nl = live_rows(w)
    counts = np.zeros((n, nchunks), dtype=np.int64)
    for c in prange(nchunks):
        b0, b1 = _block_range(c, nchunks, D)
        for b in range(b0, b1):
            k0 = b * SCREEN_SUM_BLOCK
            hi = min(D, k0 + SCREEN_SUM_BLOCK)
            if screen:
                tb = theta_bar[k0:hi]
                for r in range(n):
                    counts[r, c] += _momentum_unsure(tb, m[r, k0:hi], theta[r, k0:hi], lr, u,
                                                     tiny, safety)
            add_weighted_block(m, w, live, nl, k0, hi - k0, acc_m[k0:hi])
            add_weighted_block(theta, w, live, nl, k0, hi - k0, acc_theta[k0:hi])
    return _sure_rows(counts)


@njit(cache=True, parallel=True)
def adam_screen_sum(m_bar, v_bar, theta_bar, m, v, theta, w, beta1, c1, beta2, c2, lr_t, eps,
                    u, tiny, safety, acc_m, acc_v, acc_theta, nchunks, screen, k32, use32):
    """adam_screen's rows (ĝ recovered in registers); acc += Σᵢ wᵢ·(m, v, θ)ᵢ, in one pass."""
    n, D = theta.shape
    live, nl = live_rows(w)
    counts = np.zeros((n, nchunks), dtype=np.int64)
    inv_c1 = 1.0 / c1
    for c in prange(nchunks):
        gs = np.empty(SCREEN_SUM_BLOCK)
        b0, b1 = _block_range(c, nchunks, D)
        for b in range(b0, b1):
            k0 = b * SCREEN_SUM_BLOCK
            hi = min(D, k0 + SCREEN_SUM_BLOCK)
            L = hi - k0
            if screen:
                mb, vb, tb = m_bar[k0:hi], v_bar[k0:hi], theta_bar[k0:hi]
                g = gs[:L]
                for r in range(n):
                    mr, vr, tr = m[r, k0:hi], v[r, k0:hi], theta[r, k0:hi]
                    bad = 1
                    if use32:
                        bad = _adam_unsure32(mb, vb, tb, mr, vr, tr, m, r, k0, False, k32)
                    if bad > 0:
                        for k in range(L):
                            g[k] = (np.float64(mr[k]) - beta1 * np.float64(mb[k])) * inv_c1
                        bad = _adam_unsure(mb, vb, tb, mr, vr, tr, g, beta1, beta2, c2, lr_t, eps,
                                           u, tiny, safety)
                    counts[r, c] += bad
            add_weighted_block(m, w, live, nl, k0, L, acc_m[k0:hi])
            add_weighted_block(v, w, live, nl, k0, L, acc_v[k0:hi])
            add_weighted_block(theta, w, live, nl, k0, L, acc_theta[k0:hi])
    return _sure_rows(counts)


@njit(cache=True, parallel=True)
def root_screen_sum(r_bar, theta_bar, r_up, theta, w, decay, coef, lr, eps, u, tiny, safety,
                    acc_r, acc_theta, nchunks, screen, k32, use32):
    """root_screen's rows (ĝ recovered in registers); acc += Σᵢ wᵢ·(r, θ)ᵢ, in one pass."""
    n, D = theta.shape
    live, nl = live_rows(w)
    counts = np.zeros((n, nchunks), dtype=np.int64)
    inv_lr = 1.0 / lr
    for c in prange(nchunks):
        gs = np.empty(SCREEN_SUM_BLOCK)
        b0, b1 = _block_range(c, nchunks, D)
        for b in range(b0, b1):
            k0 = b * SCREEN_SUM_BLOCK
            hi = min(D, k0 + SCREEN_SUM_BLOCK)
            L = hi - k0
            if screen:
                rb, tb = r_bar[k0:hi], theta_bar[k0:hi]
                g = gs[:L]
                for r in range(n):
                    rr, tr = r_up[r, k0:hi], theta[r, k0:hi]
                    bad = 1
                    if use32:
                        bad = _root_unsure32(rb, tb, rr, tr, r_up, r, k0, False, k32)
                    if bad > 0:
                        for k in range(L):
                            d = np.float64(tb[k]) - np.float64(tr[k])
                            g[k] = d * (np.sqrt(np.float64(rr[k])) + eps) * inv_lr
                        bad = _root_unsure(rb, tb, rr, tr, g, decay, coef, lr, eps, u, tiny,
                                           safety)
                    counts[r, c] += bad
            add_weighted_block(r_up, w, live, nl, k0, L, acc_r[k0:hi])
            add_weighted_block(theta, w, live, nl, k0, L, acc_theta[k0:hi])
    return _sure_rows(counts)


@njit(cache=True, parallel=True)
def add_shared_rows(u, cls, w, bounds, rows, width, acc):
    """acc[l·width + k] += Σᵢ wᵢ·u[cls[i], l·width + k] for each row l of ``rows`` and
    k < width: the weighted sums of uploads that all equal one of the shared rows ``u``
    there (u: (classes, L); row i of the weights takes class ``cls[i]``, e.g. 0 for an
    honest client and 1 for a Byzantine one under an elementwise attack), with the
    operations of ``add_weighted_block`` as the screen-sum kernels call it once per
    slice w[bounds[j]:bounds[j + 1]] (float64; the live rows of a slice grouped by four
    in order; slices in order), so the same bits as summing the rows themselves slice
    by slice (docs/performance.md, "Shared rows")."""
    ns = bounds.shape[0] - 1
    lives = np.zeros((ns, w.shape[0]), dtype=np.int64)
    counts = np.zeros(ns, dtype=np.int64)
    for j in range(ns):
        live, nl = live_rows(w[bounds[j]:bounds[j + 1]])
        lives[j, :nl] = live[:nl] + bounds[j]
        counts[j] = nl
    for li in prange(rows.shape[0]):
        k0 = rows[li] * width
        for j in range(ns):
            add_weighted_block_of(u, cls, w, lives[j], counts[j], k0, width, acc[k0:k0 + width])


# -- the server's one read for a rule that compares every row: features and screen -------
# For a robust rule (Krum, median, trimmed mean, RFA, Bulyan...) the server used to read
# every upload twice before the rule: recovery (read the uploads, write ĝ into the feature
# rows), then the verification screen (read the uploads and the feature rows again). These
# kernels do both in one pass per (column chunk, row) work item, the layout of the screen
# kernels: the chunk's feature values are written and read back while in cache.
#
# ``gradient`` True: the feature is ĝ, computed by the very expression of ``*_recover``
# and stored in the feature buffer's dtype; the screen then reads ĝ back from that buffer,
# as the screen kernels do when given ``recovered``. ``gradient`` False (parameter-space
# detection): the feature is θᵢ − θ̄, the float64 difference rounded once to the buffer's
# dtype, which is the float32 subtraction's own result for float32 arrays (a float64
# difference of float32 values rounds to float32 exactly as the float32 operation does:
# 53 ≥ 2 · 24 + 2 bits), and the screen recovers ĝ in registers, as the screen kernels do
# without ``recovered``. So the features are ``recover_batch``'s or
# ``parameter_features``'s, and the sure rows ``verify_batch(screen=True)``'s, bit for bit.
# ``screen`` False writes the features only (every row is returned as sure).


@njit(cache=True, parallel=True)
def sgd_recover_screen(theta_bar, theta, out, gradient, lr, screen):
    """bool (n,): rows whose θ is finite (SGD's only check); out = ĝ or θ − θ̄."""
    n, D = theta.shape
    nch = _n_chunks(D)
    counts = np.zeros((n, nch), dtype=np.int64)
    for idx in prange(n * nch):
        c = idx // n
        r = idx - c * n
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        tb, tr, o = theta_bar[lo:hi], theta[r, lo:hi], out[r, lo:hi]
        if gradient:
            for k in range(hi - lo):
                o[k] = (np.float64(tb[k]) - np.float64(tr[k])) / lr
        else:
            for k in range(hi - lo):
                o[k] = np.float64(tr[k]) - np.float64(tb[k])
        if screen:
            bad = 0
            for k in range(hi - lo):
                bad += 1 - np.int64(np.isfinite(tr[k]))
            counts[r, c] = bad
    return _sure_rows(counts)


@njit(cache=True, parallel=True)
def momentum_recover_screen(m_bar, theta_bar, m, theta, out, gradient, beta3, lr, u, tiny,
                            safety, screen):
    """momentum_screen's rows; out = ĝ (momentum_recover) or θ − θ̄, in one pass."""
    n, D = theta.shape
    nch = _n_chunks(D)
    counts = np.zeros((n, nch), dtype=np.int64)
    for idx in prange(n * nch):
        c = idx // n
        r = idx - c * n
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        mb, tb = m_bar[lo:hi], theta_bar[lo:hi]
        mr, tr, o = m[r, lo:hi], theta[r, lo:hi], out[r, lo:hi]
        if gradient:
            for k in range(hi - lo):
                o[k] = np.float64(mr[k]) - beta3 * np.float64(mb[k])
        else:
            for k in range(hi - lo):
                o[k] = np.float64(tr[k]) - np.float64(tb[k])
        if screen:
            counts[r, c] = _momentum_unsure(tb, mr, tr, lr, u, tiny, safety)
    return _sure_rows(counts)


@njit(cache=True, parallel=True)
def adam_recover_screen(m_bar, v_bar, theta_bar, m, v, theta, out, gradient, beta1, c1, beta2,
                        c2, lr_t, eps, u, tiny, safety, screen, k32, use32):
    """adam_screen's rows; out = ĝ (adam_recover) or θ − θ̄, in one pass."""
    n, D = theta.shape
    nch = _n_chunks(D)
    counts = np.zeros((n, nch), dtype=np.int64)
    inv_c1 = 1.0 / c1
    for idx in prange(n * nch):
        c = idx // n
        r = idx - c * n
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        L = hi - lo
        mb, vb, tb = m_bar[lo:hi], v_bar[lo:hi], theta_bar[lo:hi]
        mr, vr, tr, o = m[r, lo:hi], v[r, lo:hi], theta[r, lo:hi], out[r, lo:hi]
        if gradient:
            for k in range(L):
                o[k] = (np.float64(mr[k]) - beta1 * np.float64(mb[k])) / c1
        else:
            for k in range(L):
                o[k] = np.float64(tr[k]) - np.float64(tb[k])
        if screen:
            # ĝ as the screen reads it: the stored feature, or recovered in registers
            bad = 1
            if use32:
                bad = _adam_unsure32(mb, vb, tb, mr, vr, tr, out, r, lo, gradient, k32)
            if bad > 0:
                gs = np.empty(L)
                _adam_gradients(gs, mr, mb, out, r, lo, hi, gradient, beta1, inv_c1)
                bad = _adam_unsure(mb, vb, tb, mr, vr, tr, gs, beta1, beta2, c2, lr_t, eps, u,
                                   tiny, safety)
            counts[r, c] = bad
    return _sure_rows(counts)


@njit(cache=True, parallel=True)
def root_recover_screen(r_bar, theta_bar, r_up, theta, out, gradient, decay, coef, lr, eps, u,
                        tiny, safety, screen, k32, use32):
    """root_screen's rows; out = ĝ (root_recover) or θ − θ̄, in one pass."""
    n, D = theta.shape
    nch = _n_chunks(D)
    counts = np.zeros((n, nch), dtype=np.int64)
    inv_lr = 1.0 / lr
    for idx in prange(n * nch):
        c = idx // n
        r = idx - c * n
        lo = c * CHUNK
        hi = min(D, lo + CHUNK)
        L = hi - lo
        rb, tb = r_bar[lo:hi], theta_bar[lo:hi]
        rr, tr, o = r_up[r, lo:hi], theta[r, lo:hi], out[r, lo:hi]
        if gradient:
            for k in range(L):
                d = np.float64(tb[k]) - np.float64(tr[k])
                o[k] = d * (np.sqrt(np.float64(rr[k])) + eps) / lr
        else:
            for k in range(L):
                o[k] = np.float64(tr[k]) - np.float64(tb[k])
        if screen:
            bad = 1
            if use32:
                bad = _root_unsure32(rb, tb, rr, tr, out, r, lo, gradient, k32)
            if bad > 0:
                gs = np.empty(L)
                _root_gradients(gs, tb, tr, rr, out, r, lo, hi, gradient, eps, inv_lr)
                bad = _root_unsure(rb, tb, rr, tr, gs, decay, coef, lr, eps, u, tiny, safety)
            counts[r, c] = bad
    return _sure_rows(counts)
