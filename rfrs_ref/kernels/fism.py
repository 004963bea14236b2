"""Numba kernels of FISM's BPR gradient (docs/model.md) and the BPR pair terms.

The oracle is ``rfrs_ref.model.fism.FISM.loss_grad``; ``docs/model.md`` derives
the gradient. One client with training items S (n = |S|, sorted), client sums
s = Σ_{l∈S} q_l, c₁ = n^−γ, c₂ = (n−1)^−γ (0 when n ≤ 1, the empty set):

    ŷ_k = c₁ p_k·s (k ∉ S),     ŷ_j = c₂ p_j·(s − q_j) (j ∈ S)
    a_j = −Σ_k σ(ŷ_k − ŷ_j),    b_k = Σ_j σ(ŷ_k − ŷ_j)
    ∂p_k = b_k c₁ s,  ∂p_j = a_j c₂ (s − q_j),  ∂q_l = c₁ B + c₂ (A − a_l p_l) (l ∈ S)
    B = Σ_{k∉S} b_k p_k,  A = Σ_{j∈S} a_j p_j,  and every coordinate gets + 2λθ.

How the exact-mode kernel is organised (one client, one thread):

1. s, the positives' scores ŷ_j, and e_j = exp(ŷ_j − c), 1/e_j for the shift
   c = midrange of the ŷ_j.
2. One pass over the items in id order, skipping S, in blocks of ``BLOCK``
   negatives: their scores ŷ_k = c₁ p_k·s and exp factors; the pairs of every
   positive with the block (b_k for the block, a partial sum into each a_j,
   the loss); then each negative's p-gradient row b_k c₁ s + 2λ p_k is written
   while p_k is still in cache, and B += b_k p_k. P is read once.
3. The p rows of S (they need the finished a_j), then the q rows: 2λ q_l
   outside S, the formula above inside. Every output row is written once.

The pair terms avoid one exp per pair: with x = ŷ_j − ŷ_k,
exp(−x) = exp(ŷ_k − c)·exp(c − ŷ_j) and exp(x) = exp(ŷ_j − c)·exp(c − ŷ_k), so
each pair costs two products, one division and a polynomial log1p, all of
which vectorise. The factors stay in [e^−300, e^300] (``SHIFT_LIMIT``, checked
per block; a block outside it takes the direct form, one exp per pair), so the
products neither overflow nor leave the normal range, and their relative
error is a few ulps plus |ŷ − c|·2⁻⁵³ from the shifted argument.

Compilation flags: ``error_model="numpy"`` removes Python's zero-division
check, whose branch stops LLVM from vectorising any loop with a division (no
divisor here is zero for finite input). ``fastmath`` is limited to
``reassoc`` and ``contract`` (vectorised sums, FMA): they change results by
rounding only and keep inf/NaN semantics.

Precision: every intermediate is float64 whatever the input dtype; float32
inputs are widened on load and the gradient is rounded once, on the store.
Results are deterministic: each client is computed by one thread in a fixed
order, so an output row does not depend on the other clients of the batch,
their order or the number of threads.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

#: fastmath flags of every kernel of the family (no nnan/ninf: non-finite input
#: must propagate, not become undefined behaviour)
FASTMATH = {"reassoc", "contract"}

#: largest |ŷ − c| for which the shifted exp factors are used (e^300 ≈ 2e130)
SHIFT_LIMIT = 300.0


# -- BPR pair terms (shared with rfrs_ref.kernels.fmf) ------------------------------

LN2 = math.log(2.0)
#: w above which log1p_unit reduces log(1 + w) to log 2 + log((1 + w)/2)
SQRT2_M1 = math.sqrt(2.0) - 1.0


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def atanh2_series(z):
    """2 atanh(z) = 2 Σ z^(2i+1)/(2i+1), i ≤ 10, for |z| ≤ 3 − 2√2 ≈ 0.1716.

    The first omitted term is below 2⁻⁶⁰ relative on that range.
    """
    z2 = z * z
    p = 1.0 / 21.0
    p = p * z2 + 1.0 / 19.0
    p = p * z2 + 1.0 / 17.0
    p = p * z2 + 1.0 / 15.0
    p = p * z2 + 1.0 / 13.0
    p = p * z2 + 1.0 / 11.0
    p = p * z2 + 1.0 / 9.0
    p = p * z2 + 1.0 / 7.0
    p = p * z2 + 1.0 / 5.0
    p = p * z2 + 1.0 / 3.0
    p = p * z2 + 1.0
    return 2.0 * z * p


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def log1p_unit(w):
    """log(1 + w) for w in [0, 1] (a little beyond is fine), branch-free, a few ulps.

    log(1 + w) = 2 atanh(z) with z = w/(w + 2) for w ≤ √2 − 1, and
    log 2 + 2 atanh(z) with z = (w − 1)/(w + 3) above (the same identity for
    (1 + w)/2), so |z| ≤ 3 − 2√2. Full relative accuracy as w → 0. Unlike
    ``math.log1p`` it vectorises; :func:`pairs_block_shifted` inlines it to
    share one division with σ.
    """
    big = w > SQRT2_M1
    num = w - 1.0 if big else w
    den = w + 3.0 if big else w + 2.0
    return (LN2 if big else 0.0) + atanh2_series(num / den)


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def shift_positives(y_pos, e_pos, ei_pos):
    """Shift c of the positives' scores; fills e_pos = exp(ŷ_j − c), ei_pos = 1/e_pos.

    Returns ``(c, ok)``; ``ok`` is False (and e_pos untouched) when the scores
    are not all finite or spread over more than 2·SHIFT_LIMIT, in which case
    the caller must use the direct form (:func:`pair_direct`).
    """
    n = y_pos.shape[0]
    lo = np.inf
    hi = -np.inf
    ok = n > 0
    for j in range(n):
        y = y_pos[j]
        if not (y > -np.inf and y < np.inf):
            ok = False
        if y < lo:
            lo = y
        if y > hi:
            hi = y
    if not ok:
        return 0.0, False
    c = 0.5 * lo + 0.5 * hi
    if not (0.5 * hi - 0.5 * lo <= SHIFT_LIMIT):
        return c, False
    for j in range(n):
        e = math.exp(y_pos[j] - c)
        e_pos[j] = e
        ei_pos[j] = 1.0 / e
    return c, True


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def pairs_block_shifted(yj, ej, eij, yb, eb, eib, bb, cnt):
    """Pairs of positive j with the cnt negatives of a block, shifted-exp form.

    eb = exp(ŷ_k − c), eib = 1/eb for the block, ej = exp(ŷ_j − c), eij = 1/ej.
    Adds σ(−x) into bb[i]; returns (Σ_i σ(−x), Σ_i softplus(−x)), x = ŷ_j − ŷ_k.
    Preconditions: |ŷ − c| <= SHIFT_LIMIT for j and every k of the block.
    """
    ssum = 0.0
    lsum = 0.0
    for i in range(cnt):
        t = eb[i] * eij  # exp(−x), in [e^−600, e^600]: no overflow
        w = min(t, ej * eib[i])  # exp(−|x|)
        # σ(−x) = t/(1 + t) and log1p_unit(w)'s z = num/den share one division
        big = w > SQRT2_M1
        num = w - 1.0 if big else w
        den = w + 3.0 if big else w + 2.0
        u = 1.0 + t
        r = 1.0 / (u * den)
        sig = t * den * r
        bb[i] += sig
        ssum += sig
        # softplus(−x) = max(−x, 0) + log1p(exp(−|x|))
        lsum += max(yb[i] - yj, 0.0) + ((LN2 if big else 0.0) + atanh2_series(num * u * r))
    return ssum, lsum


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def pair_direct(yj, yk):
    """(σ(−x), softplus(−x)) of one pair, x = yj − yk, one exp; valid for any scores."""
    x = yj - yk
    w = math.exp(-abs(x))
    r = 1.0 / (1.0 + w)
    sig = w * r if x >= 0.0 else r
    return sig, (0.0 if x >= 0.0 else -x) + math.log1p(w)


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def sum_squares(x):
    """Σ x_i² accumulated in float64 (the regulariser ‖θ‖², computed once per batch)."""
    acc = 0.0
    for i in range(x.shape[0]):
        v = np.float64(x[i])
        acc += v * v
    return acc


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def dot_row(P, k, v):
    """p_k · v in float64."""
    acc = 0.0
    for t in range(v.shape[0]):
        acc += P[k, t] * v[t]
    return acc


#: negatives per block of the exact pass: the block's scores, exp factors and b
#: stay in L1 and the pair loop over the block vectorises without a remainder
BLOCK = 64


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def negatives_pass_exact(P, S, v, y_pos, lam, a, gP, B):
    """The exact-mode pass over the negatives of one client (FISM and FMF alike).

    Every item k ∉ S scores ŷ_k = p_k·v; its pairs with all positives (scores
    y_pos) give b_k and add into a; its p-gradient row is written once,
    gP[k] = b_k v + 2λ p_k, and B += b_k p_k. Items are taken in id order in
    blocks of ``BLOCK``; P is read once. Returns the pair loss.
    """
    n_items, d = P.shape
    n = S.shape[0]
    two_lam = 2.0 * lam
    e_pos = np.empty(n)
    ei_pos = np.empty(n)
    c, ok = shift_positives(y_pos, e_pos, ei_pos)
    kb = np.empty(BLOCK, dtype=np.int64)
    yb = np.zeros(BLOCK)
    eb = np.zeros(BLOCK)
    eib = np.zeros(BLOCK)
    bb = np.zeros(BLOCK)
    loss = 0.0
    k = 0
    nxt = 0
    while k < n_items:
        cnt = 0
        while k < n_items and cnt < BLOCK:
            if nxt < n and S[nxt] == k:
                nxt += 1
            else:
                kb[cnt] = k
                cnt += 1
            k += 1
        for i in range(cnt):
            bb[i] = 0.0
        if n > 0:
            fast = ok
            for i in range(cnt):
                y = dot_row(P, kb[i], v)
                yb[i] = y
                if not (abs(y - c) <= SHIFT_LIMIT):
                    fast = False
            if fast:
                for i in range(cnt):
                    e = math.exp(yb[i] - c)
                    eb[i] = e
                    eib[i] = 1.0 / e
                for j in range(n):
                    ssum, lsum = pairs_block_shifted(y_pos[j], e_pos[j], ei_pos[j], yb, eb,
                                                     eib, bb, cnt)
                    a[j] -= ssum
                    loss += lsum
            else:
                for j in range(n):
                    yj = y_pos[j]
                    for i in range(cnt):
                        sig, lp = pair_direct(yj, yb[i])
                        bb[i] += sig
                        a[j] -= sig
                        loss += lp
        for i in range(cnt):
            kk = kb[i]
            bk = bb[i]
            for t in range(d):
                p = np.float64(P[kk, t])
                gP[kk, t] = bk * v[t] + two_lam * p
                B[t] += bk * p
    return loss


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def negatives_pass_sampled(P, S, neg, v, y_pos, lam, a, gP, B):
    """The sampled-mode pass: positive j is paired with its N negatives neg[j].

    Negative scores p_k·v are computed when drawn (n·N·d work); b is scattered
    into an n_items scratch vector, then every p row outside S is written
    (b_k v + 2λ p_k, b_k = 0 for items never drawn) and B += b_k p_k.
    Returns the pair loss.
    """
    n_items, d = P.shape
    n = S.shape[0]
    N = neg.shape[1]
    two_lam = 2.0 * lam
    b = np.zeros(n_items)
    loss = 0.0
    for jj in range(n):
        yj = y_pos[jj]
        aj = 0.0
        for tt in range(N):
            k = neg[jj, tt]
            sig, lp = pair_direct(yj, dot_row(P, k, v))
            aj -= sig
            b[k] += sig
            loss += lp
        a[jj] += aj
    nxt = 0
    for k in range(n_items):
        if nxt < n and S[nxt] == k:
            nxt += 1
            continue
        bk = b[k]
        for t in range(d):
            p = np.float64(P[k, t])
            gP[k, t] = bk * v[t] + two_lam * p
            B[t] += bk * p
    return loss


# -- FISM ---------------------------------------------------------------------------

@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def fism_norms(n, gamma):
    """(c₁, c₂) = (n^−γ, (n−1)^−γ), each 0 where its set is empty (docs/model.md)."""
    c1 = float(n) ** (-gamma) if n > 0 else 0.0
    c2 = float(n - 1) ** (-gamma) if n > 1 else 0.0
    return c1, c2


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _fism_prepare(P, Q, S, gamma):
    """s, c₁ s, c₁, c₂ and the positives' scores of one client."""
    d = P.shape[1]
    n = S.shape[0]
    c1, c2 = fism_norms(n, gamma)
    s = np.zeros(d)
    for jj in range(n):
        j = S[jj]
        for t in range(d):
            s[t] += Q[j, t]
    sc = np.empty(d)
    for t in range(d):
        sc[t] = c1 * s[t]
    y_pos = np.empty(n)
    for jj in range(n):
        j = S[jj]
        acc = 0.0
        for t in range(d):
            acc += P[j, t] * (s[t] - Q[j, t])
        y_pos[jj] = c2 * acc
    return s, sc, c1, c2, y_pos


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _fism_finish(P, Q, S, s, c1, c2, a, B, lam, gP, gQ, q_rows):
    """p rows of S, then the q rows (2λq outside S; c₁B + c₂(A − a_l p_l) + 2λq_l in S).

    ``q_rows`` None: every q row, gQ (n_items, d). Otherwise the sorted item ids whose q
    rows are written, gQ (len(q_rows), d), row li for item q_rows[li]; it must contain S
    (the rows outside it are 2λq for every client: :func:`shared_q_gradient`). Each
    written value is the same expression either way, so the same bits.
    """
    n_items, d = P.shape
    n = S.shape[0]
    two_lam = 2.0 * lam
    A = np.zeros(d)
    for jj in range(n):
        j = S[jj]
        aj = a[jj]
        for t in range(d):
            p = np.float64(P[j, t])
            gP[j, t] = aj * (c2 * (s[t] - Q[j, t])) + two_lam * p
            A[t] += aj * p
    nxt = 0
    for li in range(n_items if q_rows is None else q_rows.shape[0]):
        l = li if q_rows is None else q_rows[li]
        if nxt < n and S[nxt] == l:
            al = a[nxt]
            for t in range(d):
                gQ[li, t] = c1 * B[t] + c2 * (A[t] - al * P[l, t]) + two_lam * Q[l, t]
            nxt += 1
        else:
            for t in range(d):
                gQ[li, t] = two_lam * Q[l, t]


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def fism_client_exact(P, Q, S, gamma, lam, gP, gQ, q_rows):
    """Exact-mode gradient of one client into (gP, gQ); returns the pair loss (no λ‖θ‖²).

    P, Q: (n_items, d) views of θ; S: sorted unique training items;
    gP: (n_items, d); gQ: (n_items, d), or (len(q_rows), d) for the q rows q_rows only
    (see :func:`_fism_finish`).
    """
    d = P.shape[1]
    s, sc, c1, c2, y_pos = _fism_prepare(P, Q, S, gamma)
    a = np.zeros(S.shape[0])
    B = np.zeros(d)
    loss = negatives_pass_exact(P, S, sc, y_pos, lam, a, gP, B)
    _fism_finish(P, Q, S, s, c1, c2, a, B, lam, gP, gQ, q_rows)
    return loss


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def fism_client_sampled(P, Q, S, neg, gamma, lam, gP, gQ, q_rows):
    """Sampled-mode gradient of one client; ``neg`` (n, N) are the negatives of each positive."""
    d = P.shape[1]
    s, sc, c1, c2, y_pos = _fism_prepare(P, Q, S, gamma)
    a = np.zeros(S.shape[0])
    B = np.zeros(d)
    loss = negatives_pass_sampled(P, S, neg, sc, y_pos, lam, a, gP, B)
    _fism_finish(P, Q, S, s, c1, c2, a, B, lam, gP, gQ, q_rows)
    return loss


#: least estimated work (units of ``client_costs``, ≈ 0.5 ns each) that justifies
#: one more worker: ≈ 1 ms. Waking a pool thread costs microseconds on an idle
#: core but a scheduler time slice (4–16 ms measured) when the core is busy.
MIN_WORKER_COST = 2e6


def schedule(costs: np.ndarray, n_workers: int, min_cost: float = 0.0
             ) -> tuple[np.ndarray, np.ndarray]:
    """Static longest-processing-time assignment of batch rows to workers.

    Clients differ in cost by an order of magnitude (n·|S⁻| pairs), and
    Numba's prange splits an index range evenly, so the drivers loop over
    workers instead: worker w computes rows ``rows[ptr[w]:ptr[w + 1]]``. The
    greedy rule (costliest row first, to the least-loaded worker, ties to the
    lower worker) is deterministic; an output row never depends on it.
    At most total cost / ``min_cost`` workers are used (at least one).

    Returns ``(ptr, rows)``: int64 (n_workers + 1,) and (n,).
    """
    costs = np.asarray(costs, dtype=np.float64)
    n_workers = max(1, min(int(n_workers), costs.size))
    if min_cost > 0:
        n_workers = max(1, min(n_workers, int(costs.sum() // min_cost)))
    load = np.zeros(n_workers)
    owner = np.empty(costs.size, dtype=np.int64)
    for r in np.argsort(-costs, kind="stable"):
        w = int(np.argmin(load))
        owner[r] = w
        load[w] += costs[r]
    rows = np.argsort(owner, kind="stable").astype(np.int64)
    ptr = np.zeros(n_workers + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=n_workers), out=ptr[1:])
    return ptr, rows


def client_costs(counts: np.ndarray, n_items: int, d: int, pairs_per_client=None) -> np.ndarray:
    """Relative cost of a client's gradient: n_items·d (rows) + its number of pairs.

    A pair and a row element cost about the same (≈ 0.5 ns each on one core).
    ``pairs_per_client`` overrides the exact-mode count n·(n_items − n).
    """
    counts = np.asarray(counts, dtype=np.float64)
    pairs = counts * (n_items - counts) if pairs_per_client is None else pairs_per_client
    return float(n_items) * d + np.asarray(pairs, dtype=np.float64)


@njit(inline="always")
def _out_rows(out, out_q, q_rows, r, n_items, d):
    """Client row r's (gP, gQ) views: the halves of out[r] (q_rows None), or out[r]
    (n_items·d) and out_q[r] (len(q_rows)·d) for the q rows q_rows only."""
    nd = n_items * d
    if q_rows is None:
        row = out[r]
        return row[:nd].reshape((n_items, d)), row[nd:].reshape((n_items, d))
    return out[r].reshape((n_items, d)), out_q[r].reshape((q_rows.shape[0], d))


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def fism_rows_exact(theta, n_items, d, indptr, indices, clients, gamma, lam, out, losses, rows,
                    out_q=None, q_rows=None):
    """Exact-mode gradients of the batch rows ``rows``, in that order, on this thread.

    Row r: client clients[r] into out[r], its pair loss (without λ‖θ‖²) into
    losses[r]. theta: (2·n_items·d,) = concat(P.ravel(), Q.ravel()); out:
    (n, D) of theta's dtype, C-contiguous. With ``q_rows`` (sorted item ids
    containing every client's items): out (n, n_items·d) receives the p half and
    out_q (n, len(q_rows)·d) the q rows q_rows, the same values.
    """
    nd = n_items * d
    P = theta[:nd].reshape((n_items, d))
    Q = theta[nd:].reshape((n_items, d))
    for i in range(rows.shape[0]):
        r = rows[i]
        c = clients[r]
        S = indices[indptr[c] : indptr[c + 1]]
        gP, gQ = _out_rows(out, out_q, q_rows, r, n_items, d)
        losses[r] = fism_client_exact(P, Q, S, gamma, lam, gP, gQ, q_rows)


@njit(cache=True, parallel=True, fastmath=FASTMATH, error_model="numpy")
def fism_grads_exact(theta, n_items, d, indptr, indices, clients, gamma, lam, out, losses,
                     wptr, wrows, out_q=None, q_rows=None):
    """:func:`fism_rows_exact` in parallel: worker w computes rows
    wrows[wptr[w]:wptr[w + 1]] (see :func:`schedule`)."""
    for w in prange(wptr.shape[0] - 1):
        fism_rows_exact(theta, n_items, d, indptr, indices, clients, gamma, lam, out, losses,
                        wrows[wptr[w] : wptr[w + 1]], out_q, q_rows)


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def fism_rows_sampled(theta, n_items, d, indptr, indices, clients, neg_flat, neg_ptr,
                      neg_width, gamma, lam, out, losses, rows, out_q=None, q_rows=None):
    """Sampled-mode gradients of the batch rows ``rows``; row r's negatives are
    ``neg_flat[neg_ptr[r]:neg_ptr[r + 1]].reshape(n_r, neg_width[r])``; ``out_q`` and
    ``q_rows`` as in :func:`fism_rows_exact`."""
    nd = n_items * d
    P = theta[:nd].reshape((n_items, d))
    Q = theta[nd:].reshape((n_items, d))
    for i in range(rows.shape[0]):
        r = rows[i]
        c = clients[r]
        S = indices[indptr[c] : indptr[c + 1]]
        neg = neg_flat[neg_ptr[r] : neg_ptr[r + 1]].reshape((S.shape[0], neg_width[r]))
        gP, gQ = _out_rows(out, out_q, q_rows, r, n_items, d)
        losses[r] = fism_client_sampled(P, Q, S, neg, gamma, lam, gP, gQ, q_rows)


@njit(cache=True, parallel=True, fastmath=FASTMATH, error_model="numpy")
def fism_grads_sampled(theta, n_items, d, indptr, indices, clients, neg_flat, neg_ptr,
                       neg_width, gamma, lam, out, losses, wptr, wrows, out_q=None, q_rows=None):
    """:func:`fism_rows_sampled` in parallel over workers."""
    for w in prange(wptr.shape[0] - 1):
        fism_rows_sampled(theta, n_items, d, indptr, indices, clients, neg_flat, neg_ptr,
                          neg_width, gamma, lam, out, losses, wrows[wptr[w] : wptr[w + 1]],
                          out_q, q_rows)


def shared_q_gradient(theta: np.ndarray, n_items: int, d: int, lam: float) -> np.ndarray:
    """The q half of the gradient of a client outside whose items every q row lies:
    2λq in float64, rounded once to θ's dtype, which is what the kernels write on the
    q rows outside a client's items (:func:`_fism_finish`), bit for bit."""
    q = np.asarray(theta[n_items * d:], dtype=np.float64)
    return ((2.0 * float(lam)) * q).astype(theta.dtype)


@njit(cache=True, parallel=True, fastmath=FASTMATH, error_model="numpy")
def fism_user_vectors(theta, n_items, d, indptr, indices, users, gamma, V):
    """V[r] = n^−γ Σ_{k∈S_u} q_k for u = users[r] (evaluation: all training items), float64."""
    nd = n_items * d
    Q = theta[nd:].reshape((n_items, d))
    for r in prange(users.shape[0]):
        u = users[r]
        lo = indptr[u]
        hi = indptr[u + 1]
        c1, _ = fism_norms(hi - lo, gamma)
        for t in range(d):
            V[r, t] = 0.0
        for p in range(lo, hi):
            k = indices[p]
            for t in range(d):
                V[r, t] += Q[k, t]
        for t in range(d):
            V[r, t] *= c1
