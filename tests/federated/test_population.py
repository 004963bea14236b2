import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from rfrs_ref.federated.population import (
    assumed_byzantine, byzantine_mask, clients_per_round, sample_clients)


@given(st.integers(1, 3000), st.floats(0.0001, 1.0), st.integers(0, 2**32), st.integers(1, 1000))
def test_sampling_size_distinct_seeded(n, e, seed, t):
    s = sample_clients(seed, t, n, e)
    assert s.size == max(1, math.floor(e * n)) == clients_per_round(n, e)
    assert np.unique(s).size == s.size and s.min() >= 0 and s.max() < n
    np.testing.assert_array_equal(s, sample_clients(seed, t, n, e))


def test_rounds_draw_different_clients():
    draws = {tuple(sample_clients(0, t, 5551, 0.01)) for t in range(1, 20)}
    assert len(draws) == 19


def test_sampling_is_uniform():
    counts = np.zeros(100)
    for t in range(1, 2001):
        counts[sample_clients(7, t, 100, 0.1)] += 1
    # each client expected 200 times; a 5-sigma band
    assert np.all(np.abs(counts - 200) < 5 * np.sqrt(200 * 0.9))


def test_round_numbers_start_at_one():
    with pytest.raises(ValueError, match="from 1"):
        sample_clients(0, 0, 10, 0.5)


@given(st.integers(1, 5000), st.floats(0, 0.99), st.integers(0, 1000))
def test_byzantine_set_size_and_seed(n, alpha, seed):
    m = byzantine_mask(seed, n, alpha)
    assert m.sum() == math.floor(alpha * n)
    np.testing.assert_array_equal(m, byzantine_mask(seed, n, alpha))


def test_assumed_f():
    assert assumed_byzantine(0.4, 55) == 22
    assert assumed_byzantine(0.0, 55) == 0
    with pytest.raises(ValueError):
        assumed_byzantine(1.0, 10)


def test_assumed_f_exact_is_the_number_of_byzantine_clients_sampled():
    byz = np.array([True, False, True, True, False])
    assert assumed_byzantine("exact", 5, byz) == 3
    assert assumed_byzantine("exact", 5, np.zeros(5, dtype=bool)) == 0
    assert assumed_byzantine(0.4, 5, byz) == 2  # a fraction ignores the mask
    with pytest.raises(ValueError, match="Byzantine mask"):
        assumed_byzantine("exact", 5)
    with pytest.raises(ValueError, match="'exact'"):
        assumed_byzantine("all", 5, byz)
