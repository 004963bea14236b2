"""Cross-checks of the attacks against ByzFL 0.0.11 on the same inputs.

ByzFL's attacks map honest vectors to one Byzantine vector; rfrs-ref's write
uploads. The comparisons are made where the conventions meet (SGD with η = 1
and θ̄ = 0, so that θᵢ = −gᵢ exactly and the recovered gradient is the attack
vector; equal nᵢ); every difference of convention is tested as such.
docs/attacks.md has the table. Skipped when ByzFL (or torch) is absent
(install: torch==2.13.0, then byzfl==0.0.11 --no-deps).
"""

import importlib

import numpy as np
import pytest

from rfrs_ref.aggregate import Krum, Mean, Median, TrimmedMean
from rfrs_ref.attack import ALIE, IPM, Mimic, NonFinite, OptimalALIE, OptimalIPM, line_search
from rfrs_ref.optim import SGD

pytestmark = pytest.mark.crosscheck


@pytest.fixture(scope="module")
def byzfl():
    """(attacks module, aggregators module) of ByzFL 0.0.11, or skip."""
    pytest.importorskip("torch")
    from rfrs_ref.testing.adapters import load_byzfl_aggregators

    try:
        aggs = load_byzfl_aggregators()
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))
    return importlib.import_module("byzfl.attacks.attacks"), aggs


def sgd_round(seed, n, D, k):
    """SGD with η = 1 on θ̄ = 0: the upload is θᵢ = −gᵢ, exactly."""
    rng = np.random.default_rng(seed)
    G = rng.normal(size=(n, D)) + rng.normal(size=D)
    opt = SGD(lr=1.0)
    state = opt.init(np.zeros(D))
    byz = np.zeros(n, bool)
    byz[rng.choice(n, size=k, replace=False)] = True
    return opt, state, G, byz


def recovered(opt, state, up, t=1):
    X = np.empty(up["theta"].shape)
    opt.recover_batch(state, up, t, X, backend="numpy")
    return X


SEEDS = range(6)


def test_inf_is_byzfls_vector_in_every_array(byzfl, at):
    attacks, _ = byzfl
    opt, state, G, byz = sgd_round(0, 7, 9, 2)
    up, _, _ = at.run(NonFinite(), opt, state, G, byz, 1)
    want = attacks.Inf()(G[~byz])
    for r in np.flatnonzero(byz):
        np.testing.assert_array_equal(up["theta"][r], want)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("eps", [0, 1, 3])
def test_mimic_uploads_byzfls_chosen_honest_vector(byzfl, at, seed, eps):
    attacks, _ = byzfl
    opt, state, G, byz = sgd_round(seed, 8, 11, 3)
    up, _, diag = at.run(Mimic(index=eps), opt, state, G, byz, 1)
    want = attacks.Mimic(eps)(G[~byz])  # ByzFL's ε indexes the honest vectors in order
    np.testing.assert_array_equal(recovered(opt, state, up)[byz], np.repeat(want[None], 3, 0))
    assert diag["index_used"] == eps


def test_mimic_clamps_where_byzfl_refuses(byzfl, at):
    attacks, _ = byzfl
    opt, state, G, byz = sgd_round(1, 6, 5, 2)
    with pytest.raises(ValueError, match="epsilon must be smaller"):
        attacks.Mimic(4)(G[~byz])
    up, _, diag = at.run(Mimic(index=4), opt, state, G, byz, 1)
    assert diag["index_used"] == 3  # the last of the 4 honest rows
    np.testing.assert_array_equal(recovered(opt, state, up)[byz][0], G[~byz][3])


@pytest.mark.parametrize("seed", SEEDS)
def test_alie_is_byzfls_with_tau_minus_z(byzfl, at, seed):
    # ByzFL: μ + τσ over the vectors it is given; rfrs-ref: μ − zσ over the
    # Byzantine clients' own gradients (omniscient: every sampled client's)
    attacks, _ = byzfl
    opt, state, G, byz = sgd_round(seed, 9, 13, 4)
    for z in (0.5, 1.5):
        up, _, _ = at.run(ALIE(z=z), opt, state, G, byz, 1)
        want = attacks.ALittleIsEnough(tau=-z)(G[byz])
        np.testing.assert_allclose(recovered(opt, state, up)[byz], np.repeat(want[None], 4, 0),
                                   rtol=1e-12, atol=1e-14)
        up, _, _ = at.run(ALIE(z=z, omniscient=True), opt, state, G, byz, 1)
        want = attacks.ALittleIsEnough(tau=-z)(G)
        np.testing.assert_allclose(recovered(opt, state, up)[byz][0], want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("seed", SEEDS)
def test_ipm_is_byzfls_with_tau_epsilon(byzfl, at, seed):
    attacks, _ = byzfl
    opt, state, G, byz = sgd_round(seed, 9, 13, 4)
    for eps in (0.1, 2.0):
        up, _, _ = at.run(IPM(epsilon=eps), opt, state, G, byz, 1)
        want = attacks.InnerProductManipulation(tau=eps)(G[byz])
        np.testing.assert_allclose(recovered(opt, state, up)[byz], np.repeat(want[None], 4, 0),
                                   rtol=1e-12, atol=1e-14)


def test_line_search_visits_byzfls_points(byzfl):
    # ByzFL's search phases with its objective replaced by a scalar function
    attacks, _ = byzfl

    def J(x):
        return -abs(x - 37.0) + 0.01 * np.sin(x)

    for cls in (attacks.Optimal_InnerProductManipulation, attacks.Optimal_ALittleIsEnough):
        for evals, start, delta, ratio in [(20, 0.0, 10.0, 0.8), (7, 1.0, 3.0, 0.6),
                                           (30, -5.0, -2.0, 0.9), (1, 0.0, 10.0, 0.8)]:
            ref = cls(f=1, evals=evals, start=start, delta=delta, ratio=ratio)
            seen_ref = []
            ref._evaluate = lambda h, a, x: seen_ref.append(x) or J(x)
            bx, by, d, rem = ref._expansion_phase(None, None)
            want = ref._contraction_phase(None, None, bx, by, d, rem)
            seen = []
            tau, _, used = line_search(lambda x: seen.append(x) or J(x), evals, start, delta, ratio)
            assert tau == want and seen == seen_ref and used == len(seen_ref)


def byzfl_rule(aggs, rule, f):
    return {"mean": lambda: aggs.Average(), "median": lambda: aggs.Median(),
            "trmean": lambda: aggs.TrMean(f=f), "krum": lambda: aggs.Krum(f=f)}[rule.name]()


@pytest.mark.parametrize("seed", SEEDS)
# Krum with k = 1 selects one client, as ByzFL's Krum (the default k = 0 keeps n − f);
# ByzFL's Krum(f) counts n − f − 1 neighbours, ours n − f − 2: its f is our f + 1
# (docs/aggregation.md)
@pytest.mark.parametrize("rule", [Mean(), Median(), TrimmedMean(), Krum(k=1)])
@pytest.mark.parametrize("ours, theirs", [(OptimalIPM, "Optimal_InnerProductManipulation"),
                                          (OptimalALIE, "Optimal_ALittleIsEnough")])
def test_optimal_attacks_choose_byzfls_tau(byzfl, at, seed, rule, ours, theirs):
    # same vectors, same rule, no pre-aggregation, f = the number of Byzantine rows,
    # equal nᵢ: the objective is ByzFL's (here on θᵢ = −gᵢ, the same norm)
    attacks, aggs = byzfl
    n, k = 11, 3
    opt, state, G, byz = sgd_round(seed, n, 17, k)
    f_ours = k - 1 if rule.name == "krum" else k
    up, _, diag = at.run(ours(), opt, state, G, byz, 1, rule=rule, f=f_ours)
    ref = getattr(attacks, theirs)(agg=byzfl_rule(aggs, rule, k), pre_agg_list=[], f=k)
    want = ref(G[~byz])
    got = recovered(opt, state, up)[byz]
    # the sums run in another order (sequential here, pairwise in NumPy): the
    # searched τ is the same unless two trial points tie to rounding
    np.testing.assert_allclose(got, np.repeat(want[None], k, 0), rtol=1e-9, atol=1e-12)
