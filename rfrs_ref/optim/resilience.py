"""Per-round terms of the paper's Byzantine-resilience definitions (Definitions 1–4).

For round t, with F_t the clients the aggregation rule kept and B_t the benign
clients of the round, the paper bounds sums over the run of

    C_x(t) = Σ_{i ∈ F_t} Σ_{j ∈ B_t} ‖x̂ᵢ − xⱼ‖

for x = g (the hypothesis of Theorems 1–4, with x̂ᵢ = ĝᵢ the gradient the server
recovered from client i's upload and xⱼ = gⱼ the benign client's true
gradient) and for every array the optimiser uploads (the conclusions):

    adam      C_g, C_m, C_v, C_theta      (Definition 1)
    momentum  C_g, C_m, C_theta           (Definition 2)
    adagrad   C_g, C_r, C_theta           (Definition 3)
    rmsprop   C_g, C_r, C_theta           (Definition 4)
    sgd       C_g, C_theta

A run's totals (the paper's C_g, C_m, ...) are the sums of the per-round values;
the trainer accumulates them.

Distances come from :func:`rfrs_ref.kernels.distances.pairwise_sq_dists`:
direct differences accumulated in float64, never the Gram identity, so two θ
that differ by ηₜ per coordinate while ‖θ‖ ≈ √D keep an accurate distance.
A pair with a non-finite value is infinitely far (the term is inf).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from rfrs_ref.optim.base import Optimizer

#: resilience term of each uploaded array
TERM_NAMES = {"m": "C_m", "v": "C_v", "r": "C_r", "theta": "C_theta"}


def term_names(optimizer: Optimizer) -> tuple[str, ...]:
    """The names of the terms ``resilience_round`` returns for ``optimizer``, in order."""
    return ("C_g",) + tuple(TERM_NAMES[k] for k in optimizer.arrays)


def cross_distance_sum(X: np.ndarray, Y: np.ndarray, *, backend: str = "numba") -> float:
    """Σᵢ Σⱼ ‖X[i] − Y[j]‖ over every row pair (float64; inf if a pair is non-finite)."""
    from rfrs_ref.kernels.distances import pairwise_sq_dists
    from rfrs_ref.kernels.optim import threads_for

    if X.shape[0] == 0 or Y.shape[0] == 0:
        return 0.0
    with threads_for(X.shape[0] * Y.shape[0] * X.shape[1]):
        d2 = pairwise_sq_dists(X, Y, backend=backend)
    return float(np.sqrt(d2).sum())


def resilience_round(
    optimizer: Optimizer, *, recovered: np.ndarray, honest: np.ndarray,
    uploads: Mapping[str, np.ndarray], kept: np.ndarray, benign: np.ndarray,
    backend: str = "numba",
) -> dict[str, float]:
    """The round's terms Σ_{i kept} Σ_{j benign} ‖x̂ᵢ − xⱼ‖ of Definitions 1–4.

    Args:
        optimizer: the run's optimiser (gives the uploaded arrays' names).
        recovered: (n, D) gradients the server recovered from the uploads (ĝ).
        honest: (n, D) true gradients of the round's clients (g; only the
            benign rows are read).
        uploads: name -> (n, D) uploaded arrays (kept rows as uploaded, benign
            rows are the benign clients' honest uploads).
        kept: (n,) bool, the rows the aggregation rule kept (F_t).
        benign: (n,) bool, the rows of benign clients.
        backend: distance backend (``"numba"``, ``"numpy"``, ``"cuda"``).

    Returns:
        ``{"C_g": ..., "C_m": ..., ...}`` (names from :func:`term_names`), float.
        Cost: |F_t|·|B_t|·D per array, one pass of the distance kernel.
    Inputs are not modified.
    """
    kept = np.asarray(kept, dtype=bool)
    benign = np.asarray(benign, dtype=bool)
    n = recovered.shape[0]
    if kept.shape != (n,) or benign.shape != (n,):
        raise ValueError(f"kept and benign must be boolean masks of length {n} (one per row), "
                         f"got shapes {kept.shape} and {benign.shape}")
    if honest.shape != recovered.shape:
        raise ValueError(f"honest has shape {honest.shape}, recovered {recovered.shape}")
    for k in optimizer.arrays:
        if k not in uploads:
            raise KeyError(f"uploads have no array {k!r}; {optimizer.name} uploads {optimizer.arrays}")
        if uploads[k].shape != recovered.shape:
            raise ValueError(f"uploads[{k!r}] has shape {uploads[k].shape}, recovered {recovered.shape}")

    def rows(a: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return a if mask.all() else a[mask]

    out = {"C_g": cross_distance_sum(rows(recovered, kept), rows(honest, benign), backend=backend)}
    for k in optimizer.arrays:
        a = uploads[k]
        out[TERM_NAMES[k]] = cross_distance_sum(rows(a, kept), rows(a, benign), backend=backend)
    return out
