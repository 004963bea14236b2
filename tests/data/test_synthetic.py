"""The synthetic generator: determinism, its planted structure, and that it is learnable."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
import scipy.sparse as sp

from rfrs_ref.data import DATASETS, Interactions, load_dataset, split_interactions, synthetic
from rfrs_ref.data.synthetic import expected_mean_items
from rfrs_ref.params import hyperparameters


def _well_formed(d: Interactions) -> None:
    assert d.indptr[-1] == d.indices.size and d.indices.dtype == np.int32
    user = np.repeat(np.arange(d.n_users), d.counts())
    same = user[1:] == user[:-1]
    assert np.all(d.indices[1:][same] > d.indices[:-1][same])
    assert d.indices.min() >= 0 and d.indices.max() < d.n_items


def test_defaults_and_determinism():
    a, b = synthetic(), synthetic()
    assert (a.name, a.n_users, a.n_items) == ("synthetic", 600, 1000)
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    _well_formed(a)
    c = synthetic(seed=1)
    assert c.n_interactions != a.n_interactions or not np.array_equal(c.indices, a.indices)
    assert "seed=0" in a.source and "n_users=600" in a.source


def test_registry_entry_matches_function_defaults():
    entry = DATASETS.get("synthetic")
    d = load_dataset("synthetic")
    np.testing.assert_array_equal(d.indices, synthetic().indices)
    fields = {h.name: h.default for h in hyperparameters(entry)}
    sig = inspect.signature(synthetic).parameters
    for name, default in fields.items():
        assert sig[name].default == default, name
    small = load_dataset("synthetic", n_users=40, n_items=60, seed=5)
    np.testing.assert_array_equal(small.indices, synthetic(40, 60, seed=5).indices)
    assert dataclasses.is_dataclass(entry)


def test_every_user_has_min_items():
    d = synthetic(n_users=300, mean_items=2.0, activity_spread=1.5)
    assert d.counts().min() >= 2
    assert synthetic(n_users=50, min_items=5).counts().min() >= 5


def test_activity_follows_its_model():
    d = synthetic(n_users=4000, n_items=2000)
    want = expected_mean_items(20.0, 0.75, 2)
    assert abs(d.counts().mean() - want) < 0.05 * want
    assert d.counts().max() > 3 * np.median(d.counts())  # variable activity
    flat = synthetic(n_users=50, mean_items=7.4, activity_spread=0.0)
    assert np.all(flat.counts() == 7)


def test_capped_by_the_items_that_exist():
    d = synthetic(n_users=20, n_items=6, n_clusters=2, mean_items=50)
    assert np.all(d.counts() == 6)
    pure = synthetic(n_users=30, n_items=40, n_clusters=4, mean_items=30, noise=0.0,
                     concentration=0.01)
    _well_formed(pure)


def test_blocks_do_not_change_the_model():
    """Many users × items (several generation blocks) still give well-formed data."""
    d = synthetic(n_users=2500, n_items=6000, mean_items=10)
    _well_formed(d)
    assert d.counts().min() >= 2


def test_popularity_is_skewed_by_the_exponent():
    def top_decile_share(d):
        c = np.sort(d.item_counts())[::-1]
        return c[: d.n_items // 10].sum() / c.sum()

    zipf = top_decile_share(synthetic(n_users=2000))
    flat = top_decile_share(synthetic(n_users=2000, popularity_exponent=0.0))
    assert zipf > 0.35 and flat < 0.25 and zipf > flat + 0.15


def _precision_at_5(split, scores) -> float:
    tr, te = split.train, split.test
    scores = scores.astype(float).copy()
    user = np.repeat(np.arange(tr.n_users), tr.counts())
    scores[user, tr.indices] = -np.inf
    top = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    hits = [np.isin(top[u], te.items_of(u)).sum() / 5 for u in range(tr.n_users)
            if te.counts()[u] > 0]
    return float(np.mean(hits))


def _cooccurrence_vs_popularity(d: Interactions, seed: int) -> tuple[float, float]:
    s = split_interactions(d, seed)
    tr = s.train
    x = sp.csr_matrix((np.ones(tr.n_interactions), tr.indices, tr.indptr),
                      shape=(tr.n_users, tr.n_items))
    c = (x.T @ x).toarray()
    np.fill_diagonal(c, 0)
    cooc = np.asarray(x @ c)
    pop = np.broadcast_to(tr.item_counts().astype(float), cooc.shape)
    return _precision_at_5(s, cooc), _precision_at_5(s, pop)


@pytest.mark.parametrize("seed", [0, 1])
def test_cooccurrence_beats_popularity(seed):
    """Item-item co-occurrence (what FISM learns) clearly beats the popularity ranking."""
    cooc, pop = _cooccurrence_vs_popularity(synthetic(seed=seed), seed)
    assert cooc > 1.8 * pop, (cooc, pop)


def test_without_clusters_cooccurrence_gains_little():
    """The advantage comes from the planted clusters: with a single cluster it shrinks."""
    cooc, pop = _cooccurrence_vs_popularity(synthetic(n_clusters=1), 0)
    cooc10, pop10 = _cooccurrence_vs_popularity(synthetic(), 0)
    assert cooc / pop < 0.6 * (cooc10 / pop10), (cooc, pop, cooc10, pop10)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_users=0), "n_users must be >= 1, got 0"),
        (dict(n_items=1), "n_items must be >= min_items = 2, got 1"),
        (dict(n_clusters=0), "n_clusters must be in 1..n_items"),
        (dict(n_clusters=2000), "n_clusters must be in 1..n_items = 1..1000, got 2000"),
        (dict(mean_items=0), "mean_items must be a finite number > 0"),
        (dict(noise=1.5), "noise must be in [0, 1], got 1.5"),
        (dict(concentration=0), "concentration must be a finite number > 0"),
        (dict(seed=-1), "seed must be a non-negative integer"),
        # a non-finite parameter is refused by name, not passed on to the generator
        (dict(popularity_exponent=float("inf")), "popularity_exponent must be a finite number"),
        (dict(popularity_exponent=float("nan")), "popularity_exponent must be a finite number"),
        (dict(mean_items=float("inf")), "mean_items must be a finite number > 0"),
        (dict(concentration=float("inf")), "concentration must be a finite number > 0"),
        (dict(activity_spread=float("nan")), "activity_spread must be a finite number"),
    ],
)
def test_bad_parameters(kwargs, message):
    with pytest.raises(ValueError) as info:
        synthetic(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("mean_items", [1e30, 1e308])
def test_a_mean_beyond_every_integer_is_capped_by_the_items_that_exist(mean_items):
    # the activity was cast to int64 before it was capped: -2^63 items, a TypeError from
    # numpy's partition
    d = synthetic(n_users=20, n_items=50, n_clusters=5, mean_items=mean_items)
    assert np.all(d.counts() == 50)
    _well_formed(d)
