"""The BPR pair terms (docs/model.md), NumPy float64 oracle.

For one client with positive scores ``y_pos`` (its training items S⁺) and
negative scores (items of S⁻), the BPR loss without regulariser is

    L = Σ_j Σ_k −log σ(x_jk),      x_jk = ŷ_j − ŷ_k,

and its derivatives with respect to the scores are

    a_j = ∂L/∂ŷ_j = −Σ_k σ(−x_jk),     b_k = ∂L/∂ŷ_k = Σ_j σ(−x_jk),

since d/dx [−log σ(x)] = −σ(−x). Every model of the family reduces its
gradient to these three quantities (see ``docs/model.md``).

Stability: −log σ(x) = softplus(−x) = max(−x, 0) + log1p(exp(−|x|)) and
σ(z) = [1 if z ≥ 0 else e] / (1 + e) with e = exp(−|z|). The exponent is never
positive, so nothing overflows for any finite x (|x| up to 1e308); a NaN score
gives NaN terms, an infinite one gives the limits (0, 1 or +inf).
"""

from __future__ import annotations

import numpy as np

#: the exact-mode oracle evaluates the pair matrix in row blocks of at most this
#: many entries, so its memory stays O(n_items) whatever the number of positives
PAIR_BLOCK = 1 << 16


def softplus(z: np.ndarray) -> np.ndarray:
    """log(1 + exp(z)) in the stable form max(z, 0) + log1p(exp(−|z|)); float64."""
    z = np.asarray(z, dtype=np.float64)
    return np.maximum(z, 0.0) + np.log1p(np.exp(-np.abs(z)))


def log_sigmoid(x: np.ndarray) -> np.ndarray:
    """log σ(x) = −softplus(−x), stable for every finite x; float64."""
    return -softplus(-np.asarray(x, dtype=np.float64))


def sigmoid(z: np.ndarray) -> np.ndarray:
    """σ(z) = 1 / (1 + exp(−z)) as [1 or e] / (1 + e), e = exp(−|z|); float64.

    Exact limits at ±inf, never an overflow; relative accuracy is kept in the
    tail (σ(−800) ≈ 3.7e-348 underflows to 0, never to NaN).
    """
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0, e) / (1.0 + e)


def bpr_exact(y_pos: np.ndarray, y_neg: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Pair terms of one client over every (positive, negative) pair.

    Args:
        y_pos: scores ŷ_j of the positives, shape (n,).
        y_neg: scores ŷ_k of the negatives, shape (m,).

    Returns:
        ``(L, a, b)``: L = Σ_jk softplus(ŷ_k − ŷ_j) (float), a (n,) and b (m,)
        as in the module docstring, float64.

    The (n, m) pair matrix is evaluated in blocks of rows (at most
    ``PAIR_BLOCK`` entries, at least one row), so the memory is O(n + m + block).
    """
    y_pos = np.asarray(y_pos, dtype=np.float64)
    y_neg = np.asarray(y_neg, dtype=np.float64)
    n, m = y_pos.size, y_neg.size
    a = np.zeros(n)
    b = np.zeros(m)
    loss = 0.0
    if n == 0 or m == 0:
        return loss, a, b
    rows = max(1, PAIR_BLOCK // m)
    for lo in range(0, n, rows):
        x = y_pos[lo : lo + rows, None] - y_neg[None, :]
        loss += float(softplus(-x).sum())
        sig = sigmoid(-x)
        a[lo : lo + rows] = -sig.sum(axis=1)
        b += sig.sum(axis=0)
    return loss, a, b


def bpr_sampled(y_pos: np.ndarray, y_neg: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Pair terms of one client with sampled negatives.

    Args:
        y_pos: scores of the positives, shape (n,).
        y_neg: scores of each positive's sampled negatives, shape (n, N); row j
            holds the scores of the N negatives drawn for positive j.

    Returns:
        ``(L, a, sig)``: the loss over the n·N pairs (repetitions count as often
        as they were drawn), a (n,), and σ(−x_jt) of shape (n, N), from which the
        caller scatters b_k = Σ over the pairs whose negative is k.
    """
    y_pos = np.asarray(y_pos, dtype=np.float64)
    y_neg = np.asarray(y_neg, dtype=np.float64)
    x = y_pos[:, None] - y_neg
    loss = float(softplus(-x).sum())
    sig = sigmoid(-x)
    return loss, -sig.sum(axis=1), sig
