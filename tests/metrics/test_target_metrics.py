"""Exposure ratio ER@K and target hit ratio of target items (item-promotion attacks)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.data.base import Interactions
from rfrs_ref.metrics import METRIC_NAMES, check_targets, rank_metrics, target_metrics_from_top


def csr(lists, n_items, name="t"):
    return Interactions.from_lists(name, n_items, lists)


def test_known_answer():
    # 3 users, 6 items, targets {4, 5}.
    train = csr([[0, 4], [1], [2, 3]], 6)
    test = csr([[1], [2], [0]], 6)
    scores = np.array([
        [0.0, 5.0, 1.0, 2.0, 9.0, 3.0],   # without 0, 4: 1, 5, 3, 2
        [4.0, 0.0, 1.0, 2.0, 9.0, 8.0],   # without 1: 4, 5, 0, 3, 2
        [1.0, 0.0, 9.0, 9.0, 0.5, 2.0],   # without 2, 3: 5, 0, 4, 1
    ])
    m = rank_metrics(lambda u: scores[u], train, test, np.array([0, 1, 2]), ks=(1, 2, 3),
                     targets=[5, 4])
    # item 4: users 1, 2 eligible (user 0 trained on it); ranks 1 (user 1), 3 (user 2)
    # item 5: all eligible; ranks 2 (user 0), 2 (user 1), 1 (user 2)
    assert m.er == pytest.approx(((1 / 2 + 1 / 3) / 2, (1 / 2 + 3 / 3) / 2, (2 / 2 + 3 / 3) / 2))
    # a target in the top K: K=1 users 1, 2; K=2 all three
    assert m.target_hr == pytest.approx((2 / 3, 1.0, 1.0))
    d = m.as_dict()
    assert d["er@2"] == m.er[1] and d["target_hr@3"] == 1.0


def test_without_targets_the_record_is_unchanged():
    train = csr([[0], [1]], 4)
    test = csr([[2], [3]], 4)
    scores = np.arange(8, dtype=float).reshape(2, 4)
    m = rank_metrics(lambda u: scores[u], train, test, np.array([0, 1]), ks=(1, 2))
    assert m.er == () and m.target_hr == ()
    assert list(m.as_dict()) == ["n_users"] + [f"{n}@{k}" for n in METRIC_NAMES for k in (1, 2)]
    # and the ranking metrics do not depend on whether targets are given
    mt = rank_metrics(lambda u: scores[u], train, test, np.array([0, 1]), ks=(1, 2), targets=[3])
    assert (mt.precision, mt.recall, mt.ndcg, mt.hr, mt.mrr) == (m.precision, m.recall, m.ndcg,
                                                                 m.hr, m.mrr)


def test_a_target_everyone_trained_on_is_left_out():
    train = csr([[2], [2]], 4)
    test = csr([[0], [1]], 4)
    scores = np.array([[0.0, 1.0, 9.0, 3.0], [0.0, 1.0, 9.0, 3.0]])
    m = rank_metrics(lambda u: scores[u], train, test, np.array([0, 1]), ks=(1,), targets=[2, 3])
    assert m.er == (1.0,) and m.target_hr == (1.0,)
    m = rank_metrics(lambda u: scores[u], train, test, np.array([0, 1]), ks=(1,), targets=[2])
    assert m.er == (0.0,) and m.target_hr == (0.0,)



def test_no_evaluated_client_is_no_exposure_of_zero():
    """With no evaluated client (no benign client holds a test item) ER@K and the target hit
    ratio are 0/0: they read 0, the targets never shown, as the best protection there is."""
    train = csr([[0], [1]], 4)
    test = csr([[], []], 4)
    none = np.zeros(0, dtype=np.int64)
    with pytest.raises(ValueError, match="no evaluated client"):
        target_metrics_from_top(np.zeros((0, 2), np.int64), train, none, [3], (1, 2))
    with pytest.raises(ValueError, match="no evaluated client"):
        rank_metrics(lambda u: np.zeros((u.size, 4)), train, test, none, ks=(1, 2), targets=[3])
    # without targets nothing changes: the ranking metrics of no client are as before
    assert rank_metrics(lambda u: np.zeros((u.size, 4)), train, test, none, ks=(1,)).n_users == 0

@pytest.mark.parametrize("targets, match", [
    ([], "non-empty"), ([1.5], "integer"), ([7], r"0\.\.5"), ([-1], r"\[-1\]"), ([2, 2], "distinct"),
])
def test_bad_targets_are_named(targets, match):
    with pytest.raises(ValueError, match=match):
        check_targets(np.asarray(targets), 6)


@settings(max_examples=60)
@given(st.data())
def test_agrees_with_a_set_based_oracle(data):
    n_users = data.draw(st.integers(1, 6))
    n_items = data.draw(st.integers(2, 10))
    lists = [sorted(data.draw(st.sets(st.integers(0, n_items - 1), max_size=n_items - 1)))
             for _ in range(n_users)]
    train = csr(lists, n_items)
    kmax = data.draw(st.integers(1, n_items))
    ks = tuple(range(1, kmax + 1))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    top = np.full((n_users, kmax), -1, dtype=np.int64)
    for u in range(n_users):
        cand = rng.permutation(np.setdiff1d(np.arange(n_items), lists[u]))[:kmax]
        top[u, :cand.size] = cand
    T = sorted(data.draw(st.sets(st.integers(0, n_items - 1), min_size=1, max_size=n_items)))
    users = np.arange(n_users)
    er, thr = target_metrics_from_top(top, train, users, T, ks)
    for i, k in enumerate(ks):
        ratios = []
        for t in T:
            elig = [u for u in range(n_users) if t not in lists[u]]
            if elig:
                ratios.append(sum(t in set(top[u, :k]) for u in elig) / len(elig))
        assert er[i] == pytest.approx(np.mean(ratios) if ratios else 0.0, abs=1e-15)
        assert thr[i] == pytest.approx(
            sum(bool(set(top[u, :k]) & set(T)) for u in range(n_users)) / n_users, abs=1e-15)
        assert 0.0 <= er[i] <= 1.0 and 0.0 <= thr[i] <= 1.0
        if i:
            assert er[i] >= er[i - 1] and thr[i] >= thr[i - 1]
