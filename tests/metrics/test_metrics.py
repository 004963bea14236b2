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
