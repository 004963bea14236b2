"""Cross-checks against Flower (flwr 1.41.0) and ByzFL (0.0.11) on the same inputs.

Where the definitions coincide the outputs agree; where they differ, the tests
show the difference (docs/aggregation.md has the table). Skipped when the
libraries are absent (install: torch==2.13.0, then byzfl==0.0.11 --no-deps, then
flwr==1.41.0).
"""

from __future__ import annotations

import numpy as np
import pytest

from rfrs_ref.aggregate import MDA, RFA, Meamed, Bulyan, Krum, Mean, Median, TrimmedMean

pytestmark = pytest.mark.crosscheck


def _round(seed, n, D, equal=True):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    X[: max(1, n // 5)] += rng.normal(size=D) * 5  # a displaced group
    ns = np.full(n, 7) if equal else rng.integers(1, 40, size=n)
    return X, ns


def _flwr_results(X, ns):
    return [([X[i].copy()], int(ns[i])) for i in range(X.shape[0])]


SEEDS = range(8)


# ----------------------------------------------------------------------------- Flower

@pytest.mark.parametrize("seed", SEEDS)
def test_flower_mean_agrees_weighted_by_n_samples(flower_aggregate, seed):
    X, ns = _round(seed, 9, 31, equal=False)
    ref = flower_aggregate.aggregate(_flwr_results(X, ns))[0]
    np.testing.assert_allclose(Mean().aggregate(X, {"x": X}, ns, 0).arrays["x"], ref, rtol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_flower_krum_and_multikrum_agree(flower_aggregate, seed):
    X, ns = _round(seed, 11, 17, equal=False)
    f = 3
    classic = flower_aggregate.aggregate_krum(_flwr_results(X, ns), num_malicious=f, to_keep=0)[0]
    np.testing.assert_array_equal(Krum(k=1).aggregate(X, {"x": X}, ns, f).arrays["x"], classic)
    # multi-Krum: the n − f best, weighted by num_examples, as ours
    multi = flower_aggregate.aggregate_krum(_flwr_results(X, ns), num_malicious=f, to_keep=11 - f)[0]
    np.testing.assert_allclose(Krum().aggregate(X, {"x": X}, ns, f).arrays["x"], multi, rtol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_flower_median_agrees_with_equal_weights_and_differs_with_unequal_even_n(flower_aggregate, seed):
    X, ns = _round(seed, 8, 25)
    ref = flower_aggregate.aggregate_median(_flwr_results(X, ns))[0]
    np.testing.assert_allclose(Median().aggregate(X, {"x": X}, ns, 2).arrays["x"], ref, rtol=1e-12)
    # even n, unequal nᵢ: Flower averages the two middle values, we weight them by nᵢ
    ns2 = np.arange(1, 9)
    ours = Median().aggregate(X, {"x": X}, ns2, 2).arrays["x"]
    ref2 = flower_aggregate.aggregate_median(_flwr_results(X, ns2))[0]
    np.testing.assert_allclose(ref2, ref)  # Flower ignores nᵢ
    order = np.argsort(X, axis=0, kind="stable")
    a, b = order[3], order[4]
    cols = np.arange(X.shape[1])
    expected = (ns2[a] * X[a, cols] + ns2[b] * X[b, cols]) / (ns2[a] + ns2[b])
    np.testing.assert_allclose(ours, expected, rtol=1e-12)
    assert np.abs(ours - ref2).max() > 1e-3


@pytest.mark.parametrize("seed", SEEDS)
def test_flower_trimmed_mean_agrees_with_equal_weights_only(flower_aggregate, seed):
    n, f = 10, 3
    X, ns = _round(seed, n, 21)
    # Flower cuts int(proportiontocut · n) per side; (f + ½)/n gives exactly f
    ref = flower_aggregate.aggregate_trimmed_avg(_flwr_results(X, ns), proportiontocut=(f + 0.5) / n)[0]
    np.testing.assert_allclose(TrimmedMean().aggregate(X, {"x": X}, ns, f).arrays["x"], ref, rtol=1e-12)
    ns2 = np.arange(1, n + 1)
    ours = TrimmedMean().aggregate(X, {"x": X}, ns2, f).arrays["x"]
    ref2 = flower_aggregate.aggregate_trimmed_avg(_flwr_results(X, ns2), proportiontocut=(f + 0.5) / n)[0]
    np.testing.assert_allclose(ref2, ref)  # plain mean of the kept values
    assert np.abs(ours - ref2).max() > 1e-3


@pytest.mark.parametrize("seed", SEEDS)
def test_flower_bulyan_agrees(flower_aggregate, seed):
    n, f = 11, 2
    X, ns = _round(seed, n, 13)
    ref = flower_aggregate.aggregate_bulyan(_flwr_results(X, ns), num_malicious=f,
                                            aggregation_rule=flower_aggregate.aggregate_krum, to_keep=0)[0]
    np.testing.assert_allclose(Bulyan().aggregate(X, {"x": X}, ns, f).arrays["x"], ref, rtol=1e-12)


def test_flower_krum_lets_a_nan_row_win_where_ours_does_not(flower_aggregate):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(7, 5))
    X[3] = np.nan
    ns = np.ones(7, dtype=int)
    with np.errstate(invalid="ignore"):
        ref = flower_aggregate.aggregate_krum(_flwr_results(X, ns), num_malicious=1, to_keep=0)[0]
    ours = Krum(k=1).aggregate(X, {"x": X}, ns, 1).arrays["x"]
    assert np.isfinite(ours).all()
    # NaN distances sort last in Flower's argsort and NaN scores make argmin return the NaN row
    assert np.isnan(ref).all()


# ----------------------------------------------------------------------------- ByzFL

@pytest.mark.parametrize("seed", SEEDS)
def test_byzfl_average_median_trmean_agree_with_equal_weights(byzfl_aggregators, seed):
    agg = byzfl_aggregators
    X, ns = _round(seed, 9, 19)
    np.testing.assert_allclose(Mean().aggregate(X, {"x": X}, ns, 0).arrays["x"], agg.Average()(X), rtol=1e-12)
    np.testing.assert_allclose(Median().aggregate(X, {"x": X}, ns, 2).arrays["x"], agg.Median()(X),
                               rtol=1e-12)
    for f in (0, 2, 4):
        np.testing.assert_allclose(TrimmedMean().aggregate(X, {"x": X}, ns, f).arrays["x"], agg.TrMean(f)(X),
                                   rtol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_byzfl_krum_counts_one_more_neighbour(byzfl_aggregators, seed):
    """ByzFL's Krum(f) sums the n − f − 1 nearest squared distances (ours n − f −
    2, Blanchard et al.'s), i.e. it is our Krum run with f − 1."""
    agg = byzfl_aggregators
    n, f = 11, 3
    X, ns = _round(seed, n, 15)
    np.testing.assert_array_equal(Krum(k=1).aggregate(X, {"x": X}, ns, f - 1).arrays["x"], agg.Krum(f)(X))
    # MultiKrum(f) keeps the n − f best of those scores, plain mean
    np.testing.assert_allclose(Krum(k=n - f).aggregate(X, {"x": X}, ns, f - 1).arrays["x"],
                               agg.MultiKrum(f)(X), rtol=1e-12)


def test_byzfl_and_our_krum_choose_differently_on_a_constructed_round(byzfl_aggregators):
    # n = 7, f = 2: ours sums the 3 nearest, ByzFL the 4 nearest
    X = np.array([[0.0], [0.1], [0.2], [3.0], [3.05], [3.1], [3.15]])
    ours = Krum(k=1).aggregate(X, {"x": X}, np.ones(7), 2).arrays["x"]
    theirs = byzfl_aggregators.Krum(2)(X)
    assert ours[0] == 3.05 and theirs[0] != ours[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_byzfl_geometric_median(byzfl_aggregators, seed):
    """Same smoothed Weiszfeld map (weights 1/max(ν, ‖z − xᵢ‖)), different start
    and stop: ByzFL starts from 0 and runs T steps (default 3), we start from the
    weighted mean and run to a tolerance. Run to convergence, both agree."""
    agg = byzfl_aggregators
    X, ns = _round(seed, 9, 6)
    X += 10.0  # far from 0, where ByzFL starts
    ours = RFA(nu=1e-9, tol=1e-12, max_iter=10_000)
    z = ours.aggregate(X, {"x": X}, ns, 0).arrays["x"]
    z_byzfl = agg.GeometricMedian(nu=1e-9, T=5000)(X)
    np.testing.assert_allclose(z, z_byzfl, rtol=1e-6, atol=1e-6)
    three_steps = agg.GeometricMedian()(X)  # the defaults: ν = 0.1, T = 3
    assert np.linalg.norm(three_steps - z) > 1e-3 * np.linalg.norm(z)


@pytest.mark.parametrize("seed", SEEDS)
def test_byzfl_mda_agrees_with_equal_weights(byzfl_aggregators, seed):
    """Same subset (smallest diameter, first in itertools.combinations order on a
    tie); ByzFL takes the plain mean, we weight by nᵢ: equal for equal nᵢ."""
    agg = byzfl_aggregators
    X, ns = _round(seed, 9, 13)
    for f in (0, 1, 3, 4):
        for backend in ("numpy", "numba"):
            ours = MDA().aggregate(X, {"x": X}, ns, f, backend=backend).arrays["x"]
            np.testing.assert_allclose(ours, agg.MDA(f)(X), rtol=1e-12)


def test_byzfl_mda_ties_and_weights(byzfl_aggregators):
    # {0, 1, 2} and {1, 2, 3} both have diameter 2: both libraries take the first
    X = np.array([[0.0], [1.0], [2.0], [3.0], [9.0]])
    ours = MDA().aggregate(X, {"x": X}, np.ones(5), 2)
    assert ours.diagnostics["selected"] == [0, 1, 2]
    np.testing.assert_array_equal(ours.arrays["x"], byzfl_aggregators.MDA(2)(X))
    # unequal nᵢ: the same subset, combined with weights ∝ nᵢ, not the plain mean
    ns = np.array([1, 1, 6, 1, 1])
    weighted = MDA().aggregate(X, {"x": X}, ns, 2).arrays["x"]
    np.testing.assert_allclose(weighted, [(0 + 1 + 12) / 8])
    assert weighted[0] != byzfl_aggregators.MDA(2)(X)[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_byzfl_meamed_agrees_with_equal_weights(byzfl_aggregators, seed):
    """The n − f values closest to the median (np.median: for even n the mean of
    the two middle ones), plain mean: the same as ours for equal nᵢ."""
    agg = byzfl_aggregators
    for n in (9, 10):
        X, ns = _round(seed, n, 23)
        for f in (0, 1, 3, 4):
            for backend in ("numpy", "numba"):
                ours = Meamed().aggregate(X, {"x": X}, ns, f, backend=backend).arrays["x"]
                np.testing.assert_allclose(ours, agg.Meamed(f)(X), rtol=1e-12)


def test_byzfl_meamed_differs_with_unequal_weights(byzfl_aggregators):
    X = np.array([[0.0], [2.0], [3.0], [7.0], [100.0]])
    theirs = byzfl_aggregators.Meamed(2)(X)
    np.testing.assert_allclose(theirs, [(0 + 2 + 3) / 3])  # the same kept values
    ours = Meamed().aggregate(X, {"x": X}, np.array([1, 1, 2, 1, 1]), 2).arrays["x"]
    np.testing.assert_allclose(ours, [(0 + 2 + 2 * 3) / 4])  # weighted by nᵢ
