"""Numba kernels of the attack family (docs/attacks.md).

Each kernel is the fast path of a NumPy float64 oracle in :mod:`rfrs_ref.attack`
and computes the same float64 expressions in the same order, so the two agree
to the last bit on every platform that rounds IEEE operations correctly (no
``fastmath``: contraction or reassociation would change which coordinates pass
the camouflage check, a decision taken at rounding level).

Work is split over column chunks (and, for the per-client kernel, rows), as in
:mod:`rfrs_ref.kernels.optim`: a thread walks all rows of a chunk before the
next, so the server state's chunk is read from memory once.

- :func:`camouflage_rows`: the camouflaged gradient g̃ of each Byzantine row
  (:func:`rfrs_ref.attack.camouflage.camouflage_gradient` is the oracle);
- :func:`alie_row`: μ − z·σ over chosen rows (:func:`rfrs_ref.attack.colluding.alie_gradient`);
- :func:`scaled_mean_row`: s · mean over chosen rows (:func:`rfrs_ref.attack.colluding.ipm_gradient`);
- :func:`mean_std_rows`: μ and σ over chosen rows (:func:`rfrs_ref.attack.optimal.mean_std`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

#: columns per work item (the state's chunk of three arrays stays in L2)
CHUNK = 8192


@njit(inline="always")
def _n_chunks(D):
    return (D + CHUNK - 1) // CHUNK


@njit(cache=True, parallel=True)
def camouflage_rows(m_bar, v_bar, theta_bar, grads, rows, beta1, c1, beta2, c2, lr_t, eps,
                    eps_formula, tol, vmax, out):
    """Write the camouflaged gradient of ``grads[rows[i]]`` into ``out[i]``.

    Per coordinate, with a = β₁m̄, b = β₂v̄, h = (a + c₁g)/(√(b + c₂g²) + ε) the
    honest update direction and a' = a − ``eps_formula``·h:

        den = c₂a'² + 2c₁c₂a'g − c₁²b,   g̃ = (2c₁a'b + c₁²bg − c₂a'²g)/den

    g̃ is kept (after rounding to ``out``'s dtype) when den > 0, g̃ is finite and
    differs from g, its second moment b + c₂g̃² is at most ``vmax`` and its step
    ηₜ·((a + c₁g̃)/(√(b + c₂g̃²) + ε)) is within tol·(|θ̄| + |ηₜh|) of the
    honest step ηₜh; otherwise ``out`` gets g.

    Returns ``(count, shift2)``: int64 (k,) camouflaged coordinates per row and
    float64 (k,) squared Euclidean distance ‖g̃ − g‖² per row.
    """
    k = rows.shape[0]
    D = grads.shape[1]
    nch = _n_chunks(D)
    part_n = np.zeros((k, nch), dtype=np.int64)
    part_d = np.zeros((k, nch))
    for idx in prange(k * nch):
        ch = idx // k
        i = idx - ch * k
        r = rows[i]
        lo = ch * CHUNK
        hi = min(D, lo + CHUNK)
        # branch-free, so that the loop vectorises: every candidate is computed
        # and the decision is a select (where den ≤ 0 the candidate is garbage,
        # NaN or ±inf, and is discarded by the same tests)
        for j in range(lo, hi):
            g = np.float64(grads[r, j])
            a = beta1 * np.float64(m_bar[j])
            b = beta2 * np.float64(v_bar[j])
            h = (a + c1 * g) / (np.sqrt(b + c2 * (g * g)) + eps)
            a2 = a - eps_formula * h
            den = c2 * (a2 * a2) + 2.0 * c1 * c2 * a2 * g - c1 * c1 * b
            gt = (2.0 * c1 * a2 * b + c1 * c1 * b * g - c2 * (a2 * a2) * g) / den
            out[i, j] = gt
            gr = np.float64(out[i, j])  # g̃ as the rule will read it
            vt = b + c2 * (gr * gr)
            step = lr_t * h
            st = lr_t * ((a + c1 * gr) / (np.sqrt(vt) + eps))
            tb = np.float64(theta_bar[j])
            ok = ((den > 0.0) & np.isfinite(gr) & (gr != g) & (vt <= vmax)
                  & (np.abs(st - step) <= tol * (np.abs(tb) + np.abs(step))))
            out[i, j] = gr if ok else g
        # a coordinate is camouflaged exactly where out differs from g (a
        # non-finite honest g is kept as it is: d is NaN there)
        cnt = 0
        acc = 0.0
        for j in range(lo, hi):
            d = np.float64(out[i, j]) - np.float64(grads[r, j])
            if d != 0.0 and np.isfinite(d):
                cnt += 1
                acc += d * d
        part_n[i, ch] = cnt
        part_d[i, ch] = acc
    count = np.zeros(k, dtype=np.int64)
    shift2 = np.zeros(k)
    for i in range(k):
        for ch in range(nch):
            count[i] += part_n[i, ch]
            shift2[i] += part_d[i, ch]
    return count, shift2


@njit(cache=True, parallel=True)
def alie_row(grads, rows, z, ddof, out):
    """out[j] = μⱼ − z·σⱼ over ``grads[rows, j]`` (two-pass, float64).

    σ² = Σ(x − μ)²/(k − ddof), and σ = 0 when k ≤ ddof.
    """
    k = rows.shape[0]
    D = grads.shape[1]
    nch = _n_chunks(D)
    for ch in prange(nch):
        lo = ch * CHUNK
        hi = min(D, lo + CHUNK)
        mu = np.zeros(hi - lo)
        for i in range(k):
            r = rows[i]
            for j in range(lo, hi):
                mu[j - lo] += np.float64(grads[r, j])
        for j in range(lo, hi):
            mu[j - lo] /= k
        if k > ddof:
            ss = np.zeros(hi - lo)
            for i in range(k):
                r = rows[i]
                for j in range(lo, hi):
                    d = np.float64(grads[r, j]) - mu[j - lo]
                    ss[j - lo] += d * d
            for j in range(lo, hi):
                out[j] = mu[j - lo] - z * np.sqrt(ss[j - lo] / (k - ddof))
        else:
            for j in range(lo, hi):
                out[j] = mu[j - lo]


@njit(cache=True, parallel=True)
def scaled_mean_row(grads, rows, scale, out):
    """out[j] = scale · (Σᵢ grads[rows[i], j]) / k (float64 sums)."""
    k = rows.shape[0]
    D = grads.shape[1]
    nch = _n_chunks(D)
    for ch in prange(nch):
        lo = ch * CHUNK
        hi = min(D, lo + CHUNK)
        acc = np.zeros(hi - lo)
        for i in range(k):
            r = rows[i]
            for j in range(lo, hi):
                acc[j - lo] += np.float64(grads[r, j])
        for j in range(lo, hi):
            out[j] = scale * (acc[j - lo] / k)


@njit(cache=True, parallel=True)
def mean_std_rows(grads, rows, ddof, mu_out, sd_out):
    """mu_out[j] = μⱼ and sd_out[j] = σⱼ over ``grads[rows, j]`` (two-pass, float64).

    μ sums the rows in their order and divides by k; σ² = Σ(x − μ)²/(k − ddof),
    and σ = 0 when k ≤ ddof (:func:`rfrs_ref.attack.optimal.mean_std` is the oracle).
    """
    k = rows.shape[0]
    D = grads.shape[1]
    nch = _n_chunks(D)
    for ch in prange(nch):
        lo = ch * CHUNK
        hi = min(D, lo + CHUNK)
        for j in range(lo, hi):
            mu_out[j] = 0.0
            sd_out[j] = 0.0
        for i in range(k):
            r = rows[i]
            for j in range(lo, hi):
                mu_out[j] += np.float64(grads[r, j])
        for j in range(lo, hi):
            mu_out[j] /= k
        if k > ddof:
            for i in range(k):
                r = rows[i]
                for j in range(lo, hi):
                    d = np.float64(grads[r, j]) - mu_out[j]
                    sd_out[j] += d * d
            for j in range(lo, hi):
                sd_out[j] = np.sqrt(sd_out[j] / (k - ddof))
