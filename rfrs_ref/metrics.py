"""Ranking metrics (SPEC §8): Precision@K and Recall@K, and the popularity baseline.

For each evaluated client, every item is scored, the client's training items
are removed from the ranking, and the top K are compared with its test items:

    Precision@K = hits@K / K,    Recall@K = hits@K / |test|,

averaged over the evaluated clients, which are the benign clients that have at
least one test item. Ties are broken towards the smaller item id (a ranking is
a pure function of the scores) and NaN scores rank last.

The popularity ranking scores every item by the number of training sets it
appears in; a trained model that does not beat it is a failed run.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from rfrs_ref.data.base import Interactions
from rfrs_ref.kernels.topk import topk_numba, topk_numpy


@dataclasses.dataclass(frozen=True)
class RankingMetrics:
    """Mean Precision@K and Recall@K for K = ks[0..]; ``n_users`` evaluated."""

    ks: tuple[int, ...]
    precision: tuple[float, ...]
    recall: tuple[float, ...]
    n_users: int

    def as_dict(self) -> dict:
        return {
            "n_users": self.n_users,
            **{f"precision@{k}": p for k, p in zip(self.ks, self.precision)},
            **{f"recall@{k}": r for k, r in zip(self.ks, self.recall)},
        }


def eval_users(test: Interactions, exclude: np.ndarray | None = None) -> np.ndarray:
    """Clients that are evaluated: at least one test item, and not in ``exclude`` (mask)."""
    ok = test.counts() > 0
    if exclude is not None:
        ok &= ~np.asarray(exclude, dtype=bool)
    return np.flatnonzero(ok)


def _sub_csr(data: Interactions, users: np.ndarray):
    starts, stops = data.indptr[users], data.indptr[users + 1]
    indptr = np.zeros(users.size + 1, dtype=np.int64)
    np.cumsum(stops - starts, out=indptr[1:])
    idx = np.concatenate([data.indices[a:b] for a, b in zip(starts, stops)]) if users.size else np.zeros(0, np.int32)
    return indptr, idx.astype(np.int64)


def hits_at_k(top: np.ndarray, test: Interactions, users: np.ndarray) -> np.ndarray:
    """(n_users, K) cumulative hits: hits[r, k-1] = |top[r, :k] ∩ test(users[r])|."""
    hits = np.zeros(top.shape, dtype=np.int64)
    for r, u in enumerate(users):
        t = test.indices[test.indptr[u] : test.indptr[u + 1]]
        hits[r] = np.cumsum(np.isin(top[r], t))
    return hits


def rank_metrics(
    score_fn: Callable[[np.ndarray], np.ndarray],
    train: Interactions,
    test: Interactions,
    users: np.ndarray,
    ks=(1, 2, 3, 4, 5),
    *,
    chunk: int = 1024,
    backend: str = "numba",
) -> RankingMetrics:
    """Precision@K and Recall@K of the ranking given by ``score_fn(users_chunk) -> scores``.

    ``score_fn`` returns an (len(chunk), n_items) array; rankings exclude each
    client's training items.
    """
    ks = tuple(int(k) for k in ks)
    kmax = max(ks)
    users = np.asarray(users, dtype=np.int64)
    # per-user hits first, sums last: the result does not depend on the chunking
    hits = np.zeros((users.size, kmax), dtype=np.int64)
    for lo in range(0, users.size, chunk):
        u = users[lo : lo + chunk]
        scores = score_fn(u)
        indptr, idx = _sub_csr(train, u)
        top = (topk_numba if backend != "numpy" else topk_numpy)(scores, indptr, idx, kmax)
        hits[lo : lo + u.size] = hits_at_k(top, test, u)
    n = max(users.size, 1)
    recall = hits / np.maximum(test.counts()[users], 1)[:, None]
    prec = tuple(float(hits[:, k - 1].sum() / (k * n)) for k in ks)
    rec = tuple(float(recall[:, k - 1].sum() / n) for k in ks)
    return RankingMetrics(ks, prec, rec, int(users.size))


def popularity_scores(train: Interactions) -> np.ndarray:
    """Item scores of the popularity baseline: training-set counts, float64 (n_items,)."""
    return train.item_counts().astype(np.float64)


def popularity_metrics(train, test, users, ks=(1, 2, 3, 4, 5), *, backend="numba") -> RankingMetrics:
    pop = popularity_scores(train)
    return rank_metrics(lambda u: np.broadcast_to(pop, (u.size, pop.size)), train, test, users, ks,
                        backend=backend)
