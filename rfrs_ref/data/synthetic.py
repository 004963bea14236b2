"""A small synthetic implicit-feedback dataset with planted, learnable structure.

Generative model (all draws from the stream ``synthetic`` of
:func:`rfrs_ref.seeding.generator`, so the data depend only on the
parameters and ``seed``):

1. **Item clusters and popularity.** A random permutation π of the items
   gives item j the cluster ``c(j) = π(j) mod K`` (K = ``n_clusters``; sizes
   differ by at most one) and the rank ``r(j) = ⌊π(j) / K⌋ + 1`` within it.
   Its popularity weight is Zipf-like, ``w_j = r(j)^(−a)``
   (a = ``popularity_exponent``), normalised within the cluster.
2. **User preferences.** User u has cluster preferences
   ``φ_u ~ Dirichlet(α·1_K)`` (α = ``concentration``; small α: a user cares
   about few clusters).
3. **Item distribution of a user.**
   ``p_u(j) = (1 − ν)·φ_u[c(j)]·w_j / Σ_{c(k)=c(j)} w_k + ν·w_j / Σ_k w_k``
   (ν = ``noise``: the share of a user's items drawn from global popularity
   regardless of taste).
4. **Activity.** ``n_u = clip(round(m·exp(σ z_u − σ²/2)), min_items, n_max(u))``
   with ``z_u ~ N(0, 1)`` (log-normal, mean ≈ m = ``mean_items``, σ =
   ``activity_spread``); ``n_max(u)`` is the number of items with ``p_u > 0``.
   ``min_items`` defaults to 2 so that every user keeps at least one training
   item after the 80/20 split (docs/datasets.md).
5. **Items.** ``n_u`` distinct items drawn without replacement with
   probabilities ∝ ``p_u`` (successive sampling, done with the Gumbel top-k
   trick: the ``n_u`` largest ``log p_u(j) + G_j``, G standard Gumbel).

Co-occurrence carries the cluster structure (two items of the same cluster
tend to share users), popularity alone does not, so an item-item model such
as FISM beats the popularity ranking clearly; the tests check this with a
plain co-occurrence recommender.
"""

from __future__ import annotations

import math

import numpy as np

from rfrs_ref.data.base import Interactions
from rfrs_ref.seeding import generator

# keys of at most this many floats are materialised at once
_BLOCK_ELEMENTS = 1 << 22


def synthetic(
    n_users: int = 600,
    n_items: int = 1000,
    n_clusters: int = 10,
    mean_items: float = 20.0,
    seed: int = 0,
    *,
    popularity_exponent: float = 1.0,
    concentration: float = 0.1,
    noise: float = 0.1,
    activity_spread: float = 0.75,
    min_items: int = 2,
) -> Interactions:
    """Generate the synthetic dataset (see the module docstring for the model).

    Args:
        n_users: number of users (clients), ≥ 1.
        n_items: number of items, ≥ ``min_items``.
        n_clusters: number of latent item clusters K, 1 ≤ K ≤ n_items.
        mean_items: mean number of items per user before clipping, > 0.
        seed: non-negative integer; the data are a function of it and the parameters.
        popularity_exponent: Zipf exponent a ≥ 0 of popularity within a cluster
            (0: uniform).
        concentration: Dirichlet parameter α > 0 of the users' cluster preferences.
        noise: share ν ∈ [0, 1] of global-popularity draws.
        activity_spread: σ ≥ 0 of the log-normal activity.
        min_items: minimum items per user, ≥ 1.

    Returns:
        Interactions named ``synthetic``; its ``source`` records the parameters.

    Raises:
        ValueError: a parameter outside the ranges above.
    """
    checks = [
        (n_users >= 1, f"n_users must be >= 1, got {n_users}"),
        (min_items >= 1, f"min_items must be >= 1, got {min_items}"),
        (n_items >= min_items, f"n_items must be >= min_items = {min_items}, got {n_items}"),
        (1 <= n_clusters <= n_items,
         f"n_clusters must be in 1..n_items = 1..{n_items}, got {n_clusters}"),
        (0 < mean_items < math.inf, f"mean_items must be a finite number > 0, got {mean_items}"),
        (0 <= popularity_exponent < math.inf,
         f"popularity_exponent must be a finite number >= 0, got {popularity_exponent}"),
        (0 < concentration < math.inf,
         f"concentration must be a finite number > 0, got {concentration}"),
        (0 <= noise <= 1, f"noise must be in [0, 1], got {noise}"),
        (0 <= activity_spread < math.inf,
         f"activity_spread must be a finite number >= 0, got {activity_spread}"),
        (seed >= 0, f"seed must be a non-negative integer, got {seed}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(f"synthetic: {message}")
    n_users, n_items, n_clusters, min_items = map(int, (n_users, n_items, n_clusters, min_items))

    rng = generator(int(seed), "synthetic")
    perm = rng.permutation(n_items)
    cluster = perm % n_clusters
    rank = perm // n_clusters + 1
    w = rank.astype(np.float64) ** (-float(popularity_exponent))
    w_in_cluster = w / np.bincount(cluster, weights=w, minlength=n_clusters)[cluster]
    w_global = w / w.sum()

    prefs = rng.dirichlet(np.full(n_clusters, float(concentration)), size=n_users)
    z = rng.standard_normal(n_users)
    sigma = float(activity_spread)
    with np.errstate(over="ignore"):  # a mean beyond any count overflows to +inf: capped below
        activity = np.rint(float(mean_items) * np.exp(sigma * z - 0.5 * sigma * sigma))

    rows = max(1, _BLOCK_ELEMENTS // n_items)
    counts = np.empty(n_users, dtype=np.int64)
    chosen = []
    for lo in range(0, n_users, rows):
        hi = min(n_users, lo + rows)
        p = (1.0 - noise) * prefs[lo:hi, cluster] * w_in_cluster + noise * w_global
        with np.errstate(divide="ignore"):
            keys = np.log(p) + rng.gumbel(size=p.shape)
        n_max = np.count_nonzero(p > 0, axis=1)
        # capped at n_items before the cast (n_max <= n_items caps it anyway): an activity
        # beyond int64 (mean_items = 1e30, or +inf) would cast to -2^63
        n = np.clip(activity[lo:hi], min_items, n_items).astype(np.int64)
        n = np.minimum(n, n_max)
        counts[lo:hi] = n
        top = int(n.max())
        # the n_u largest keys of each row, in any order (sorted below)
        part = np.argpartition(-keys, top - 1, axis=1)[:, :top] if top < n_items else \
            np.broadcast_to(np.arange(n_items), keys.shape)
        part_keys = np.take_along_axis(keys, part, axis=1)
        order = np.argsort(-part_keys, axis=1, kind="stable")
        ranked = np.take_along_axis(part, order, axis=1)
        keep = np.arange(top)[None, :] < n[:, None]
        user = np.broadcast_to(np.arange(lo, hi)[:, None], ranked.shape)[keep]
        chosen.append(user.astype(np.int64) * n_items + ranked[keep])
    key = np.sort(np.concatenate(chosen))
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = (key % n_items).astype(np.int32)
    source = (
        f"synthetic(n_users={n_users}, n_items={n_items}, n_clusters={n_clusters}, "
        f"mean_items={mean_items:g}, seed={seed}, popularity_exponent={popularity_exponent:g}, "
        f"concentration={concentration:g}, noise={noise:g}, activity_spread={sigma:g}, "
        f"min_items={min_items})"
    )
    return Interactions("synthetic", n_users, n_items, indptr, indices, source)


def generation_bytes(n_users: int = 600, n_items: int = 1000, n_clusters: int = 10,
                     mean_items: float = 20.0, activity_spread: float = 0.75,
                     min_items: int = 2, **_) -> float:
    """A rough upper bound of :func:`synthetic`'s peak memory in bytes for these parameters
    (the others do not change it): the users' cluster preferences (n_users · K float64),
    four per-user vectors, a block of keys (about 6 arrays of ``_BLOCK_ELEMENTS`` float64)
    and, for the N = n_users · min(n_items, E[items]) interactions drawn, their keys, the
    sorted copy and the indices (about 32 bytes each). Used to refuse a generation that
    could not fit before it starts (``rfrs-ref data info``)."""
    try:
        per_user = min(float(n_items), max(float(min_items),
                                           expected_mean_items(mean_items, activity_spread,
                                                               min_items)))
    except (ValueError, OverflowError, ZeroDivisionError):
        per_user = float(n_items)
    n_users = float(n_users)
    return (n_users * (8.0 * n_clusters + 32.0) + 6.0 * 8.0 * _BLOCK_ELEMENTS
            + 32.0 * n_users * per_user)


def expected_mean_items(mean_items: float, activity_spread: float, min_items: int) -> float:
    """E[max(min_items, m·exp(σz − σ²/2))] for z ~ N(0, 1), before rounding and the cap.

    Used by tests to check the generator's activity against its model.
    """
    m, s, k = float(mean_items), float(activity_spread), float(min_items)
    if s == 0:
        return max(k, m)
    # E[X; X > k] + k·P(X ≤ k) for a log-normal X with mean m
    d = (math.log(k / m) + 0.5 * s * s) / s
    upper = m * 0.5 * math.erfc((d - s) / math.sqrt(2))
    below = k * 0.5 * math.erfc(-d / math.sqrt(2))
    return upper + below
