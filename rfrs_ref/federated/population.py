"""Who takes part in a round, and who is Byzantine (docs/training.md)."""

from __future__ import annotations

import math

import numpy as np

from rfrs_ref.seeding import generator


def clients_per_round(n_clients: int, fraction: float) -> int:
    """max(1, floor(e · n_clients)): the number of clients sampled each round."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"client fraction e must be in (0, 1], got {fraction}")
    return max(1, math.floor(fraction * n_clients))


def sample_clients(seed: int, t: int, n_clients: int, fraction: float) -> np.ndarray:
    """The clients of round t: uniformly without replacement (stream ``sampling``, key t), sorted."""
    if t < 1:
        raise ValueError(f"rounds are numbered from 1, got t={t}")
    k = clients_per_round(n_clients, fraction)
    rng = generator(seed, "sampling", t)
    return np.sort(rng.choice(n_clients, size=k, replace=False)).astype(np.int64)


def byzantine_mask(seed: int, n_clients: int, alpha: float) -> np.ndarray:
    """The fixed Byzantine set, chosen before training: floor(α · n_clients) clients
    uniformly without replacement (stream ``byzantine``). Boolean mask (n_clients,)."""
    if not 0.0 <= alpha < 1.0:
        raise ValueError(f"Byzantine fraction α must be in [0, 1), got {alpha}")
    mask = np.zeros(n_clients, dtype=bool)
    k = math.floor(alpha * n_clients)
    if k:
        mask[generator(seed, "byzantine").choice(n_clients, size=k, replace=False)] = True
    return mask


#: ``assumed_byzantine`` value telling the server the round's true number of Byzantine clients
EXACT = "exact"


def assumed_byzantine(alpha_assumed: float | str, n_sampled: int,
                      byzantine: np.ndarray | None = None) -> int:
    """f, the number of Byzantine clients the server assumes among the |sampled| clients.

    f = floor(α_assumed · |sampled|) for a fraction α_assumed in [0, 1) (the
    paper's server, which knows only α). With α_assumed = ``"exact"`` the
    server is told the truth: f = the number of Byzantine clients among the
    sampled ones, ``byzantine`` being the round's (|sampled|,) boolean mask (an
    ablation, not the paper's protocol; f may then break a rule's condition,
    e.g. Krum's n > 2f + 2, and the rule's fallback applies).
    """
    if isinstance(alpha_assumed, str):
        if alpha_assumed != EXACT:
            raise ValueError(f"assumed Byzantine fraction must be a number in [0, 1) or "
                             f"{EXACT!r}, got {alpha_assumed!r}")
        if byzantine is None or len(byzantine) != n_sampled:
            raise ValueError(f"assumed_byzantine={EXACT!r} needs the round's Byzantine mask "
                             f"of the {n_sampled} sampled clients")
        return int(np.count_nonzero(byzantine))
    if not 0.0 <= alpha_assumed < 1.0:
        raise ValueError(f"assumed Byzantine fraction must be in [0, 1), got {alpha_assumed}")
    return math.floor(alpha_assumed * n_sampled)
