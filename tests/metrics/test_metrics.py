import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from rfrs_ref.data.base import Interactions
from rfrs_ref.kernels.topk import topk_numba, topk_numpy
from rfrs_ref.metrics import eval_users, popularity_metrics, rank_metrics


def csr(lists, n_items, name="t"):
    return Interactions.from_lists(name, n_items, lists)


@st.composite
def ranking_case(draw):
    n_rows = draw(st.integers(1, 6))
    n_items = draw(st.integers(1, 12))
    # few distinct values so that ties are common; NaN and infinities too
    values = st.sampled_from([0.0, 1.0, -1.0, 2.5, np.nan, np.inf, -np.inf])
    scores = draw(hnp.arrays(np.float64, (n_rows, n_items), elements=values))
    excl = [sorted(draw(st.sets(st.integers(0, n_items - 1), max_size=n_items))) for _ in range(n_rows)]
    k = draw(st.integers(1, 6))
    return scores, excl, k


@given(ranking_case())
def test_topk_numba_equals_oracle(case):
    scores, excl, k = case
    indptr = np.concatenate([[0], np.cumsum([len(e) for e in excl])]).astype(np.int64)
    idx = np.array([i for e in excl for i in e], dtype=np.int64)
    expected = topk_numpy(scores, indptr, idx, k)
    np.testing.assert_array_equal(topk_numba(scores, indptr, idx, k), expected)
    np.testing.assert_array_equal(topk_numba(scores.astype(np.float32), indptr, idx, k), expected)
    for r, e in enumerate(excl):
        chosen = expected[r][expected[r] >= 0]
        assert not set(chosen) & set(e)
        assert chosen.size == min(k, scores.shape[1] - len(e))


def test_topk_ties_prefer_smaller_id_and_nan_last():
    scores = np.array([[1.0, 3.0, 3.0, np.nan, 2.0]])
    top = topk_numba(scores, np.array([0, 0]), np.zeros(0, np.int64), 5)
    assert top.tolist() == [[1, 2, 4, 0, 3]]


def test_rank_metrics_known_answer():
    # 2 users, 6 items. User 0 trained on {0}, tests {2, 5}; user 1 trained on {1, 2}, tests {3}.
    train = csr([[0], [1, 2]], 6)
    test = csr([[2, 5], [3]], 6)
    scores = np.array([
        [9.0, 1.0, 5.0, 4.0, 3.0, 2.0],   # ranking without item 0: 2, 3, 4, 5, 1
        [0.0, 9.0, 8.0, 1.0, 2.0, 3.0],   # ranking without 1, 2: 5, 4, 3, 0
    ])
    m = rank_metrics(lambda u: scores[u], train, test, np.array([0, 1]), ks=(1, 2, 3, 4))
    # user 0 hits: [1, 1, 1, 2]; user 1 hits: [0, 0, 1, 1]
    assert m.precision == pytest.approx(((1 + 0) / 2, (1 / 2 + 0) / 2, (1 / 3 + 1 / 3) / 2, (2 / 4 + 1 / 4) / 2))
    assert m.recall == pytest.approx(((1 / 2 + 0) / 2, (1 / 2 + 0) / 2, (1 / 2 + 1) / 2, (1 + 1) / 2))
    assert m.n_users == 2


def test_rank_metrics_chunking_does_not_matter():
    rng = np.random.default_rng(0)
    lists = [rng.choice(30, size=rng.integers(2, 8), replace=False) for _ in range(50)]
    train = csr([x[: len(x) // 2] for x in lists], 30)
    test = csr([x[len(x) // 2:] for x in lists], 30)
    scores = rng.normal(size=(50, 30))
    users = np.arange(50)
    a = rank_metrics(lambda u: scores[u], train, test, users, chunk=7)
    b = rank_metrics(lambda u: scores[u], train, test, users, chunk=1000)
    c = rank_metrics(lambda u: scores[u], train, test, users, backend="numpy")
    assert a == b == c


def test_eval_users_skips_empty_tests_and_byzantine():
    test = csr([[1], [], [2], [3]], 5)
    assert eval_users(test).tolist() == [0, 2, 3]
    assert eval_users(test, exclude=np.array([False, False, True, False])).tolist() == [0, 3]


def test_popularity_ranks_by_training_counts():
    train = csr([[0, 1], [1], [1, 2], [4]], 5)
    test = csr([[2], [2], [3], [1]], 5)
    m = popularity_metrics(train, test, np.arange(4), ks=(1,))
    # popularity order 1, then 0/2/4 (ties by id: 0, 2, 4), then 3
    # top-1 without training items: u0 -> 2 (hit), u1 -> 0, u2 -> 0, u3 -> 1 (hit)
    assert m.precision == pytest.approx((0.5,))


# -- NDCG, HR, MRR ---------------------------------------------------------------------------
def direct_reference(scores, train_lists, test_lists, ks):
    """Every metric of one user at a time, written from the definitions: a full
    stable sort by (-score, item id), training items dropped, plain Python sums."""
    import math

    out = {name: [] for name in ("precision", "recall", "ndcg", "hr", "mrr")}
    per_user = []
    for s, tr, te in zip(scores, train_lists, test_lists):
        ranking = [j for j in sorted(range(len(s)), key=lambda j: (-s[j], j)) if j not in set(tr)]
        te = set(te)
        row = {}
        for k in ks:
            top = ranking[:k]
            hits = [1 if j in te else 0 for j in top]
            dcg = sum(h / math.log2(i + 2) for i, h in enumerate(hits))
            idcg = sum(1 / math.log2(i + 2) for i in range(min(k, len(te))))
            first = next((i + 1 for i, h in enumerate(hits) if h), None)
            row[k] = {"precision": sum(hits) / k, "recall": sum(hits) / len(te),
                      "ndcg": dcg / idcg, "hr": float(any(hits)),
                      "mrr": 0.0 if first is None else 1 / first}
        per_user.append(row)
    for name in out:
        out[name] = tuple(sum(u[k][name] for u in per_user) / len(per_user) for k in ks)
    return out


@st.composite
def metric_case(draw):
    n_items = draw(st.integers(2, 25))
    n_users = draw(st.integers(1, 8))
    train_lists, test_lists = [], []
    for _ in range(n_users):
        items = draw(st.permutations(range(n_items)))
        n_te = draw(st.integers(1, n_items - 1))
        n_tr = draw(st.integers(0, n_items - n_te))
        test_lists.append(sorted(items[:n_te]))
        train_lists.append(sorted(items[n_te:n_te + n_tr]))
    # integer-valued scores: ties are common and both rankings must break them by id
    scores = draw(hnp.arrays(np.float64, (n_users, n_items), elements=st.integers(-3, 3).map(float)))
    ks = tuple(sorted(draw(st.sets(st.integers(1, n_items), min_size=1, max_size=4))))
    return n_items, train_lists, test_lists, scores, ks


@given(metric_case())
def test_every_metric_equals_a_direct_per_user_reference(case):
    n_items, train_lists, test_lists, scores, ks = case
    train, test = csr(train_lists, n_items), csr(test_lists, n_items)
    users = np.arange(len(train_lists))
    ref = direct_reference(scores, train_lists, test_lists, ks)
    for backend in ("numpy", "numba"):
        m = rank_metrics(lambda u: scores[u], train, test, users, ks, backend=backend, chunk=3)
        for name, expected in ref.items():
            assert getattr(m, name) == pytest.approx(expected, rel=1e-12, abs=1e-15), (backend, name)


def test_ndcg_hr_mrr_known_answer():
    # the case of test_rank_metrics_known_answer: user 0 ranks 2, 3, 4, 5, 1 (tests {2, 5});
    # user 1 ranks 5, 4, 3, 0 (tests {3})
    train = csr([[0], [1, 2]], 6)
    test = csr([[2, 5], [3]], 6)
    scores = np.array([[9.0, 1.0, 5.0, 4.0, 3.0, 2.0], [0.0, 9.0, 8.0, 1.0, 2.0, 3.0]])
    m = rank_metrics(lambda u: scores[u], train, test, np.array([0, 1]), ks=(1, 3, 4))
    l2 = np.log2
    assert m.hr == pytest.approx((0.5, 1.0, 1.0))
    assert m.mrr == pytest.approx((0.5, (1 + 1 / 3) / 2, (1 + 1 / 3) / 2))
    ndcg_u0 = {1: 1.0, 3: 1 / (1 + 1 / l2(3)), 4: (1 + 1 / l2(5)) / (1 + 1 / l2(3))}
    ndcg_u1 = {1: 0.0, 3: 1 / l2(4) / 1.0, 4: 1 / l2(4)}
    assert m.ndcg == pytest.approx(tuple((ndcg_u0[k] + ndcg_u1[k]) / 2 for k in (1, 3, 4)))
    d = m.as_dict()
    assert d["ndcg@3"] == m.ndcg[1] and d["hr@4"] == 1.0 and d["mrr@1"] == 0.5


def test_more_k_leave_precision_and_recall_at_1_to_5_unchanged():
    # the paper's protocol reports K = 1..5: asking for K = 10 and 20 as well must not move them
    rng = np.random.default_rng(3)
    lists = [rng.choice(60, size=rng.integers(3, 20), replace=False) for _ in range(40)]
    train = csr([x[: len(x) // 2] for x in lists], 60)
    test = csr([x[len(x) // 2:] for x in lists], 60)
    scores = rng.normal(size=(40, 60)).astype(np.float32)
    users = np.arange(40)
    a = rank_metrics(lambda u: scores[u], train, test, users, ks=(1, 2, 3, 4, 5))
    b = rank_metrics(lambda u: scores[u], train, test, users, ks=(1, 2, 3, 4, 5, 10, 20))
    assert b.precision[:5] == a.precision and b.recall[:5] == a.recall
    assert b.ndcg[:5] == a.ndcg and b.hr[:5] == a.hr and b.mrr[:5] == a.mrr
