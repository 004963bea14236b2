"""The per-client split (docs/datasets.md): laws, exact sizes, determinism, agreement with a loop."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rfrs_ref.data import Interactions, split_interactions, synthetic
from rfrs_ref.data.split import n_test_items
from rfrs_ref.seeding import generator


@st.composite
def interactions(draw, max_users=15, max_items=40):
    n_items = draw(st.integers(1, max_items))
    n_users = draw(st.integers(1, max_users))
    lists = [draw(st.sets(st.integers(0, n_items - 1), max_size=n_items)) for _ in range(n_users)]
    return Interactions.from_lists("h", n_items, [sorted(x) for x in lists])


fractions = st.sampled_from([0.0, 0.1, 0.2, 0.25, 0.29, 0.3, 1 / 3, 0.5, 0.8, 0.99])


@given(data=interactions(), seed=st.integers(0, 2**32), tf=fractions)
def test_split_laws(data, seed, tf):
    before = (data.indptr.copy(), data.indices.copy())
    s = split_interactions(data, seed, tf)
    assert s.seed == seed and s.test_fraction == tf
    for part in (s.train, s.test):
        assert (part.name, part.n_users, part.n_items) == (data.name, data.n_users, data.n_items)
        assert part.indices.dtype == np.int32 and part.indptr.dtype == np.int64
    frac = Fraction(repr(tf))
    for u in range(data.n_users):
        items, tr, te = data.items_of(u), s.train.items_of(u), s.test.items_of(u)
        assert np.all(np.diff(tr) > 0) and np.all(np.diff(te) > 0)
        assert not set(tr.tolist()) & set(te.tolist())
        assert sorted(tr.tolist() + te.tolist()) == items.tolist()
        n = items.size
        assert te.size == math.floor(frac * n)
        if n >= 1:
            assert tr.size >= 1
    # same seed, same split; the input is untouched
    again = split_interactions(data, seed, tf)
    np.testing.assert_array_equal(again.test.indices, s.test.indices)
    np.testing.assert_array_equal(again.train.indptr, s.train.indptr)
    np.testing.assert_array_equal(data.indptr, before[0])
    np.testing.assert_array_equal(data.indices, before[1])


@given(data=interactions(), seed=st.integers(0, 2**20))
def test_different_seeds_differ_on_nontrivial_data(data, seed):
    """When some user has more than one possible test set, 20 seeds do not all agree."""
    n = data.counts()
    k = n_test_items(n, 0.2)
    if not np.any((k > 0) & (k < n)):
        return  # every split is forced
    first = split_interactions(data, seed).test.indices
    assert any(
        not np.array_equal(split_interactions(data, seed + j).test.indices, first)
        for j in range(1, 20)
    )


@given(data=interactions(max_users=8, max_items=25), seed=st.integers(0, 1000))
def test_agrees_with_per_user_loop(data, seed):
    """The vectorised split equals the plain loop: per user in order, draw one uniform key
    per item; the n_test items with the smallest keys are the test items."""
    rng = generator(seed, "split")
    s = split_interactions(data, seed)
    for u in range(data.n_users):
        items = data.items_of(u)
        keys = rng.random(items.size)
        k = items.size // 5
        want = np.sort(items[np.argsort(keys, kind="stable")[:k]])
        np.testing.assert_array_equal(s.test.items_of(u), want)


def test_floor_is_exact():
    assert n_test_items(np.array([100, 10, 5, 4, 1, 0]), 0.29).tolist() == [29, 2, 1, 1, 0, 0]
    assert 0.29 * 100 < 29  # the float product would floor to 28
    assert n_test_items(np.array([5, 9, 10, 14, 15]), 0.2).tolist() == [1, 1, 2, 2, 3]


def test_uniform_choice_of_test_items():
    """One user with 5 items and one test item: each item is chosen about 1/5 of the time."""
    data = Interactions.from_lists("u", 5, [[0, 1, 2, 3, 4]])
    trials = 4000
    freq = np.bincount(
        [int(split_interactions(data, s).test.indices[0]) for s in range(trials)], minlength=5
    )
    expected = trials / 5
    sd = math.sqrt(trials * 0.2 * 0.8)
    assert np.all(np.abs(freq - expected) < 5 * sd), freq


def test_every_client_keeps_a_training_item_on_synthetic():
    d = synthetic()
    s = split_interactions(d, 3)
    assert s.train.counts().min() >= 1
    assert s.train.n_interactions + s.test.n_interactions == d.n_interactions
    other = split_interactions(d, 4)
    assert not np.array_equal(other.test.indices, s.test.indices)


@pytest.mark.parametrize("tf", [-0.1, 1.0, 1.5, float("nan")])
def test_bad_fraction(tf):
    with pytest.raises(ValueError, match="test_fraction must be in"):
        split_interactions(Interactions.from_lists("x", 3, [[0, 1]]), 0, tf)


# -- the validation split ------------------------------------------------------------------
def _reference_split_without_validation(data, seed, test_fraction):
    """The split as it was before validation existed: the n_test smallest keys are the test
    items. A validation split must leave this, and the random stream, untouched."""
    from rfrs_ref.data.split import n_test_items
    from rfrs_ref.seeding import generator

    keys = generator(int(seed), "split").random(data.n_interactions)
    n_test = n_test_items(data.counts(), test_fraction)
    train, test = [], []
    for u in range(data.n_users):
        lo, hi = data.indptr[u], data.indptr[u + 1]
        items, k = data.indices[lo:hi], keys[lo:hi]
        chosen = set(items[np.argsort(k, kind="stable")[: n_test[u]]].tolist())
        test.append(sorted(chosen))
        train.append(sorted(set(items.tolist()) - chosen))
    return train, test


def _lists(x):
    return [x.indices[x.indptr[u]:x.indptr[u + 1]].tolist() for u in range(x.n_users)]


@pytest.mark.parametrize("seed, test_fraction", [(0, 0.2), (5, 0.29), (1, 0.0)])
def test_valid_fraction_zero_is_the_split_of_the_paper_protocol(seed, test_fraction):
    from rfrs_ref.data import synthetic

    data = synthetic(n_users=80, n_items=60, mean_items=9.0, seed=2)
    s = split_interactions(data, seed, test_fraction, valid_fraction=0.0)
    train, test = _reference_split_without_validation(data, seed, test_fraction)
    assert _lists(s.train) == train and _lists(s.test) == test
    assert s.valid is None and s.valid_fraction == 0.0
    default = split_interactions(data, seed, test_fraction)
    np.testing.assert_array_equal(default.train.indices, s.train.indices)
    assert default.train.source == s.train.source


@pytest.mark.parametrize("valid_fraction", [0.1, 0.25, 0.5])
def test_validation_comes_out_of_training_and_leaves_the_test_set_alone(valid_fraction):
    from rfrs_ref.data import synthetic
    from rfrs_ref.data.split import n_test_items

    data = synthetic(n_users=80, n_items=60, mean_items=9.0, seed=2)
    plain = split_interactions(data, 3, 0.2)
    s = split_interactions(data, 3, 0.2, valid_fraction=valid_fraction)
    np.testing.assert_array_equal(s.test.indptr, plain.test.indptr)
    np.testing.assert_array_equal(s.test.indices, plain.test.indices)
    np.testing.assert_array_equal(s.valid.counts(), n_test_items(data.counts(), valid_fraction))
    for u in range(data.n_users):
        tr, va = set(_lists(s.train)[u]), set(_lists(s.valid)[u])
        assert not tr & va and tr | va == set(_lists(plain.train)[u])
        assert data.counts()[u] == 0 or len(tr) >= 1


@pytest.mark.parametrize("valid_fraction", [-0.1, 0.8, 0.9, float("nan")])
def test_valid_fraction_that_leaves_no_training_item_is_rejected(valid_fraction):
    from rfrs_ref.data import synthetic

    data = synthetic(n_users=10, n_items=20, mean_items=5.0)
    with pytest.raises(ValueError, match="valid_fraction must be in"):
        split_interactions(data, 0, 0.2, valid_fraction=valid_fraction)


def test_valid_fraction_zero_keeps_the_configuration_json_and_sweep_keys():
    from rfrs_ref.experiments.spec import RunSpec, key_payload
    from rfrs_ref.federated.config import TrainConfig

    c = TrainConfig(dataset="ml100k")
    assert "valid_fraction" not in c.to_json()
    assert TrainConfig.from_json(c.to_json()) == c
    # what a sweep key hashes has no trace of the field: keys of existing results stay valid
    assert "valid_fraction" not in key_payload(RunSpec(c))["config"]
    with_v = TrainConfig(dataset="ml100k", valid_fraction=0.1)
    assert with_v.to_json()["valid_fraction"] == 0.1
    assert RunSpec(c).key != RunSpec(with_v).key
