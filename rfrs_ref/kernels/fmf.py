"""Numba kernels of FMF's BPR gradient (federated matrix factorisation, docs/model.md).

The oracle is ``rfrs_ref.model.fmf.FMF.loss_grad``. One client with private
vector u and training items S: ŷ_k = u·p_k for every item, and with
a_j = −Σ_k σ(ŷ_k − ŷ_j), b_k = Σ_j σ(ŷ_k − ŷ_j):

    ∂p_j = a_j u (j ∈ S),   ∂p_k = b_k u (k ∉ S),   ∂u = Σ_j a_j p_j + Σ_k b_k p_k + 2λu

and 2λθ on every federated coordinate. The organisation, the shifted-exp pair
terms and the precision rules are those of ``rfrs_ref.kernels.fism``: one pass
over P in item order writing each negative's row as soon as b_k is known, the
positives' rows afterwards, float64 internally, deterministic per client.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from rfrs_ref.kernels.fism import (FASTMATH, dot_row, negatives_pass_exact,
                                   negatives_pass_sampled)


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _fmf_prepare(P, u_in, S):
    d = P.shape[1]
    n = S.shape[0]
    u = np.empty(d)
    uu = 0.0
    for t in range(d):
        u[t] = u_in[t]
        uu += u[t] * u[t]
    y_pos = np.empty(n)
    for jj in range(n):
        y_pos[jj] = dot_row(P, S[jj], u)
    return u, uu, y_pos


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _fmf_finish(P, S, u, a, Gu, lam, gP, gu_out):
    d = P.shape[1]
    two_lam = 2.0 * lam
    for jj in range(S.shape[0]):
        j = S[jj]
        aj = a[jj]
        for t in range(d):
            p = np.float64(P[j, t])
            gP[j, t] = aj * u[t] + two_lam * p
            Gu[t] += aj * p
    for t in range(d):
        gu_out[t] = Gu[t] + two_lam * u[t]


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def fmf_client_exact(P, u_in, S, lam, gP, gu_out):
    """Exact-mode gradient of one client into gP (n_items, d) and gu_out (d,).

    Returns the pair loss plus λ‖u‖² (the λ‖θ‖² term is added by the caller).
    """
    d = P.shape[1]
    u, uu, y_pos = _fmf_prepare(P, u_in, S)
    a = np.zeros(S.shape[0])
    Gu = np.zeros(d)
    loss = negatives_pass_exact(P, S, u, y_pos, lam, a, gP, Gu)
    _fmf_finish(P, S, u, a, Gu, lam, gP, gu_out)
    return loss + lam * uu


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def fmf_client_sampled(P, u_in, S, neg, lam, gP, gu_out):
    """Sampled-mode gradient of one client; ``neg`` (n, N) are the negatives of each positive."""
    d = P.shape[1]
    u, uu, y_pos = _fmf_prepare(P, u_in, S)
    a = np.zeros(S.shape[0])
    Gu = np.zeros(d)
    loss = negatives_pass_sampled(P, S, neg, u, y_pos, lam, a, gP, Gu)
    _fmf_finish(P, S, u, a, Gu, lam, gP, gu_out)
    return loss + lam * uu


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def fmf_rows_exact(theta, n_items, d, indptr, indices, clients, U, lam, out, private_out,
                   losses, rows):
    """Exact-mode gradients of the batch rows ``rows``, in that order, on this thread.

    Row r: client c = clients[r], private vector U[c]; gradient into out[r],
    private gradient into private_out[r], pair loss + λ‖u‖² (without λ‖θ‖²)
    into losses[r].
    """
    P = theta.reshape((n_items, d))
    for i in range(rows.shape[0]):
        r = rows[i]
        c = clients[r]
        S = indices[indptr[c] : indptr[c + 1]]
        gP = out[r].reshape((n_items, d))
        losses[r] = fmf_client_exact(P, U[c], S, lam, gP, private_out[r])


@njit(cache=True, parallel=True, fastmath=FASTMATH, error_model="numpy")
def fmf_grads_exact(theta, n_items, d, indptr, indices, clients, U, lam, out, private_out,
                    losses, wptr, wrows):
    """:func:`fmf_rows_exact` in parallel over workers (see ``fism.schedule``)."""
    for w in prange(wptr.shape[0] - 1):
        fmf_rows_exact(theta, n_items, d, indptr, indices, clients, U, lam, out, private_out,
                       losses, wrows[wptr[w] : wptr[w + 1]])


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def fmf_rows_sampled(theta, n_items, d, indptr, indices, clients, neg_flat, neg_ptr, neg_width,
                     U, lam, out, private_out, losses, rows):
    """Sampled-mode gradients of the batch rows ``rows`` (negatives packed as in
    ``fism_rows_sampled``)."""
    P = theta.reshape((n_items, d))
    for i in range(rows.shape[0]):
        r = rows[i]
        c = clients[r]
        S = indices[indptr[c] : indptr[c + 1]]
        neg = neg_flat[neg_ptr[r] : neg_ptr[r + 1]].reshape((S.shape[0], neg_width[r]))
        gP = out[r].reshape((n_items, d))
        losses[r] = fmf_client_sampled(P, U[c], S, neg, lam, gP, private_out[r])


@njit(cache=True, parallel=True, fastmath=FASTMATH, error_model="numpy")
def fmf_grads_sampled(theta, n_items, d, indptr, indices, clients, neg_flat, neg_ptr, neg_width,
                      U, lam, out, private_out, losses, wptr, wrows):
    """:func:`fmf_rows_sampled` in parallel over workers."""
    for w in prange(wptr.shape[0] - 1):
        fmf_rows_sampled(theta, n_items, d, indptr, indices, clients, neg_flat, neg_ptr,
                         neg_width, U, lam, out, private_out, losses,
                         wrows[wptr[w] : wptr[w + 1]])
