"""Ranking metrics (docs/training.md, "Evaluation"): Precision@K, Recall@K,
NDCG@K, HR@K and MRR@K, and the popularity baseline.

For each evaluated client, every item is scored, the client's training items
are removed from the ranking, and the top K are compared with its test items
(binary relevance: rel_i = 1 when the item at rank i is a test item):

    Precision@K = hits@K / K,    Recall@K = hits@K / |test|,
    NDCG@K      = DCG@K / IDCG@K,  DCG@K = sum_{i<=K} rel_i / log2(i + 1),
                  IDCG@K = sum_{i<=min(K, |test|)} 1 / log2(i + 1),
    HR@K        = 1 if hits@K > 0 else 0,
    MRR@K       = 1 / (rank of the first test item) if it is within the top K, else 0,

averaged over the evaluated clients, which are the benign clients that have at
least one test item. MRR is truncated at K (the reciprocal rank of a first hit
below rank K counts 0) so that all five metrics come from the same top-K list.
Ties are broken towards the smaller item id (a ranking is a pure function of
the scores).

Preconditions, checked before any kernel runs: every K is an integer in
1..n_items, and the scores are finite (a non-finite score means the model
diverged, and a ranking of it would be meaningless).

The popularity ranking scores every item by the number of training sets it
appears in; a trained model that does not beat it is a failed run.

Target items (item-promotion attacks): for a set T of target items, from the
same top-K lists,

    ER@K        = (1/|T|) Σ_{t∈T} |{u : t ∉ train(u), t ∈ top_K(u)}| / |{u : t ∉ train(u)}|,
    TargetHR@K  = |{u : top_K(u) ∩ T ≠ ∅}| / |U|,

over the evaluated clients U: the exposure ratio of each target among the
clients that have not trained on it (a client's training items are never
ranked, so those who have are left out of its denominator), averaged over the
targets, and the share of clients with at least one target in their top K. A
target that every evaluated client trained on has no exposure ratio and is
left out of the average (ER = 0 when no target has one). With no evaluated
client at all both are 0/0, and refused (ValueError) rather than read as 0,
the targets never shown. They are computed
only when targets are given (:func:`rank_metrics` ``targets=``), so runs
without targets produce the same records as before.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from rfrs_ref.data.base import Interactions
from rfrs_ref.kernels.topk import topk_numba, topk_numpy


#: the metrics of a ranking, in the order of metrics.csv and the tables
METRIC_NAMES = ("precision", "recall", "ndcg", "hr", "mrr")
#: the metrics of target items (item-promotion attacks), recorded only when a run has targets
TARGET_METRIC_NAMES = ("er", "target_hr")


@dataclasses.dataclass(frozen=True)
class RankingMetrics:
    """Mean Precision@K, Recall@K, NDCG@K, HR@K and MRR@K for K = ks[0..];
    ``n_users`` evaluated."""

    ks: tuple[int, ...]
    precision: tuple[float, ...]
    recall: tuple[float, ...]
    n_users: int
    ndcg: tuple[float, ...] = ()
    hr: tuple[float, ...] = ()
    mrr: tuple[float, ...] = ()
    #: exposure ratio and target hit ratio @K; empty when the run has no target items
    er: tuple[float, ...] = ()
    target_hr: tuple[float, ...] = ()

    def as_dict(self) -> dict:
        out = {"n_users": self.n_users}
        names = METRIC_NAMES + (TARGET_METRIC_NAMES if self.er else ())
        for name in names:
            out.update({f"{name}@{k}": v for k, v in zip(self.ks, getattr(self, name))})
        return out


class NonFiniteScores(ValueError):
    """A model's scores hold NaN or ±inf (the model diverged): there is no ranking.

    A ``ValueError``, so callers that catch the precondition errors catch it too;
    the trainer turns it into :class:`rfrs_ref.federated.trainer.Diverged`.

    Attributes:
        user: the first evaluated user whose scores are not all finite.
    """

    def __init__(self, user: int) -> None:
        self.user = int(user)
        super().__init__(f"the scores of user {self.user} hold NaN or infinity (the model "
                         "diverged): ranking metrics are only defined for finite scores")


def check_ks(ks, n_items: int) -> tuple[int, ...]:
    """``ks`` as a tuple of ints, each in 1..n_items; ValueError otherwise.

    K = 0 would divide by zero in Precision@K, and a negative K or one above
    the number of items has no top-K list: the ranking kernels are never
    reached with such a K.
    """
    try:
        out = tuple(ks)
    except TypeError:
        out = (ks,)
    if not out:
        raise ValueError("ks is empty: give at least one K in 1..n_items")
    for k in out:
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
            raise ValueError(f"K must be an integer in 1..{n_items} (the number of items), got {k!r}")
        if not 1 <= int(k) <= n_items:
            raise ValueError(f"K must be an integer in 1..{n_items} (the number of items), got {int(k)}; "
                             "choose the K (--ks) within that range")
    return tuple(int(k) for k in out)


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


def hit_indicators(top: np.ndarray, test: Interactions, users: np.ndarray) -> np.ndarray:
    """(n_users, K) 0/1: hits[r, i] = 1 when top[r, i] is a test item of users[r]."""
    hits = np.zeros(top.shape, dtype=np.int64)
    for r, u in enumerate(users):
        t = test.indices[test.indptr[u] : test.indptr[u + 1]]
        hits[r] = np.isin(top[r], t)
    return hits


def hits_at_k(top: np.ndarray, test: Interactions, users: np.ndarray) -> np.ndarray:
    """(n_users, K) cumulative hits: hits[r, k-1] = |top[r, :k] ∩ test(users[r])|."""
    return np.cumsum(hit_indicators(top, test, users), axis=1)


def metrics_from_hits(hits: np.ndarray, n_test: np.ndarray, ks) -> RankingMetrics:
    """Every metric from the per-user hit indicators of one top-K list.

    ``hits``: (n_users, kmax) with hits[r, i] = 1 when the item at rank i + 1
    of user r is a test item; ``n_test``: (n_users,) test-set sizes (≥ 1).
    NumPy float64 throughout; sums over users in user order.
    """
    hits = np.asarray(hits, dtype=np.int64)
    n_users, kmax = hits.shape
    n = max(n_users, 1)
    n_test = np.maximum(np.asarray(n_test, dtype=np.int64), 1)
    cum = np.cumsum(hits, axis=1)
    discount = 1.0 / np.log2(np.arange(2, kmax + 2, dtype=np.float64))
    dcg = np.cumsum(hits * discount, axis=1)
    idcg_k = np.cumsum(discount)
    # first hit's rank (1-based), kmax + 1 when there is none in the list
    first = np.where(cum[:, -1] > 0, np.argmax(hits > 0, axis=1) + 1, kmax + 1)
    prec, rec, ndcg, hr, mrr = [], [], [], [], []
    for k in ks:
        h = cum[:, k - 1]
        prec.append(float(h.sum() / (k * n)))
        rec.append(float((h / n_test).sum() / n))
        ideal = idcg_k[np.minimum(n_test, k) - 1]
        ndcg.append(float((dcg[:, k - 1] / ideal).sum() / n))
        hr.append(float((h > 0).sum() / n))
        mrr.append(float(np.where(first <= k, 1.0 / first, 0.0).sum() / n))
    return RankingMetrics(tuple(ks), tuple(prec), tuple(rec), int(n_users),
                          tuple(ndcg), tuple(hr), tuple(mrr))


def check_targets(targets, n_items: int) -> np.ndarray:
    """The target items as a sorted int64 array of distinct ids in 0..n_items − 1.

    Raises:
        ValueError: empty, repeated, non-integer or out-of-range ids (named).
    """
    t = np.asarray(targets)
    if t.ndim != 1 or t.size == 0 or not np.issubdtype(t.dtype, np.integer):
        raise ValueError(f"target items must be a non-empty list of integer item ids, got {targets!r}")
    bad = t[(t < 0) | (t >= n_items)]
    if bad.size:
        raise ValueError(f"target items must lie in 0..{n_items - 1} (the dataset has {n_items} "
                         f"items, indexed from 0: index i is item_ids[i] of a run's ids.npz, not "
                         f"an id of the dataset's files), got {bad.tolist()[:10]}")
    u = np.unique(t)
    if u.size != t.size:
        raise ValueError(f"target items must be distinct, got {t.tolist()[:20]}")
    return u.astype(np.int64)


def target_metrics_from_top(top: np.ndarray, train: Interactions, users: np.ndarray,
                            targets, ks) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(ER@K, TargetHR@K) for every K of ``ks`` from the users' top-max(K) lists
    (formulas in the module docstring; NumPy float64, sums in user order).

    ``top``: (n_users, kmax) item ids, best first (−1 pads a list shorter than
    kmax); ``users``: the evaluated clients, rows of ``top``.

    Raises:
        ValueError: bad targets (:func:`check_targets`), or no evaluated client: both
            metrics would be 0/0, and 0 reads as targets never shown (the best a defence
            can do) where nothing was measured.
    """
    top = np.asarray(top, dtype=np.int64)
    users = np.asarray(users, dtype=np.int64)
    T = check_targets(targets, train.n_items)
    n_users, kmax = top.shape
    if n_users == 0:
        raise ValueError("no evaluated client (no benign client holds a test item): the "
                         "targets' exposure ratio and hit ratio would be 0/0; give each "
                         "client test items (test_fraction > 0) and keep some benign")
    # rank[r, j]: 1-based rank of target j in user r's list, kmax + 1 when absent
    rank = np.full((n_users, T.size), kmax + 1, dtype=np.int64)
    for j, t in enumerate(T):
        r_idx, pos = np.nonzero(top == t)
        rank[r_idx, j] = pos + 1
    trained = np.zeros((n_users, T.size), dtype=bool)
    for r, u in enumerate(users):
        trained[r] = np.isin(T, train.indices[train.indptr[u]:train.indptr[u + 1]])
    eligible = (~trained).sum(axis=0)
    er, thr = [], []
    for k in ks:
        shown = rank <= k
        per_target = [shown[:, j].sum() / eligible[j] for j in range(T.size) if eligible[j] > 0]
        er.append(float(sum(per_target) / len(per_target)) if per_target else 0.0)
        thr.append(float(shown.any(axis=1).sum() / n_users))
    return tuple(er), tuple(thr)


def rank_metrics(
    score_fn: Callable[[np.ndarray], np.ndarray],
    train: Interactions,
    test: Interactions,
    users: np.ndarray,
    ks=(1, 2, 3, 4, 5),
    *,
    chunk: int = 1024,
    backend: str = "numba",
    targets=None,
) -> RankingMetrics:
    """Precision, Recall, NDCG, HR and MRR @K of the ranking given by
    ``score_fn(users_chunk) -> scores`` (formulas in the module docstring).

    ``score_fn`` returns an (len(chunk), n_items) array; rankings exclude each
    client's training items. One top-max(K) list per user feeds every metric.
    With ``targets`` (item ids), ER@K and TargetHR@K of those items are
    computed from the same lists (:func:`target_metrics_from_top`).

    Raises:
        ValueError: a K outside 1..n_items.
        NonFiniteScores: (a ValueError) a non-finite score (NaN, ±inf), naming
            the first offending user; no metric is computed from such scores.
    """
    ks = check_ks(ks, train.n_items)
    kmax = max(ks)
    users = np.asarray(users, dtype=np.int64)
    # per-user hits first, sums last: the result does not depend on the chunking
    hits = np.zeros((users.size, kmax), dtype=np.int64)
    if targets is not None:
        targets = check_targets(targets, train.n_items)
        tops = np.zeros((users.size, kmax), dtype=np.int64)
    for lo in range(0, users.size, chunk):
        u = users[lo : lo + chunk]
        scores = score_fn(u)
        finite = np.isfinite(scores).all(axis=1)
        if not finite.all():
            bad = int(u[np.argmin(finite)])
            raise NonFiniteScores(bad)
        indptr, idx = _sub_csr(train, u)
        top = (topk_numba if backend != "numpy" else topk_numpy)(scores, indptr, idx, kmax)
        hits[lo : lo + u.size] = hit_indicators(top, test, u)
        if targets is not None:
            tops[lo : lo + u.size] = top
    m = metrics_from_hits(hits, test.counts()[users], ks)
    if targets is None:
        return m
    er, thr = target_metrics_from_top(tops, train, users, targets, ks)
    return dataclasses.replace(m, er=er, target_hr=thr)


def popularity_scores(train: Interactions) -> np.ndarray:
    """Item scores of the popularity baseline: training-set counts, float64 (n_items,)."""
    return train.item_counts().astype(np.float64)


def popularity_metrics(train, test, users, ks=(1, 2, 3, 4, 5), *, backend="numba") -> RankingMetrics:
    """Every metric of :func:`rank_metrics` for the popularity ranking."""
    pop = popularity_scores(train)
    return rank_metrics(lambda u: np.broadcast_to(pop, (u.size, pop.size)), train, test, users, ks,
                        backend=backend)


def beats_popularity_problem(final, ks, *, need_precisions: bool = False) -> str | None:
    """Why a final evaluation's ``beats_popularity`` is not what the trainer writes, the
    boolean precision@K > the popularity ranking's at the largest K, or None where it is.

    ``final`` is a record read back (untrusted JSON): a flag that is no boolean (NaN,
    "yes") or that its precisions contradict is a problem; where a precision is absent
    only the type is checked, unless ``need_precisions``."""
    kmax = max(ks)
    beats = final.get("beats_popularity")
    model = (final.get("model") or {}).get(f"precision@{kmax}")
    pop = (final.get("popularity") or {}).get(f"precision@{kmax}")
    says = model > pop if model is not None and pop is not None else None
    if isinstance(beats, bool) and (beats == says or (says is None and not need_precisions)):
        return None
    return (f"beats_popularity is {beats!r}, which its precision@{kmax} ({model!r} against "
            f"the popularity ranking's {pop!r}) does not say")
