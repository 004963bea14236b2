"""The conformance suite on ByzFL 0.0.11's pre-aggregators and attacks, through the adapters.

These are the results published in docs/conformance.md (there with 200 examples
per law; here 50). ByzFL's pre-aggregators and attacks that rfrs-ref also has
hold every law with the hyperparameters aligned (``c`` = C, ``s`` = s, ``tau`` = ϵ
or −z), except where a convention differs, which the assertions pin: no nᵢ
(``weighted_mixing``), σ of a single vector (NaN, rfrs-ref 0), an index beyond the
honest vectors (an error, rfrs-ref clamps), and two bugs on hostile rows: ARC ranks a
NaN row with Python's ``sort``, which does not sort NaN keys, and NNM leaves a +inf row
out of its own neighbours (its distance to itself is inf − inf = NaN).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from rfrs_ref.testing import adapters, laws, strategies
from rfrs_ref.testing.conformance import run_attack_conformance, run_pre_conformance

pytestmark = pytest.mark.crosscheck

EXAMPLES = 50


@pytest.fixture(scope="module")
def byzfl(torch):
    """(preaggregators, attacks) modules of ByzFL 0.0.11, or skip."""
    try:
        adapters.load_byzfl_aggregators()
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))
    return (importlib.import_module("byzfl.aggregators.preaggregators"),
            importlib.import_module("byzfl.attacks"))


def _pre(name, fn, **kw):
    return {r.law: r.status for r in run_pre_conformance(name, fn, max_examples=EXAMPLES, **kw)}


def _attack(name, fn, **kw):
    return {r.law: r.status for r in run_attack_conformance(name, fn, max_examples=EXAMPLES, **kw)}


def test_resolve_and_guess_byzfl_pre_aggregators_and_attacks(byzfl):
    pre, attacks = byzfl
    assert adapters.resolve_callable("byzfl.aggregators.preaggregators:NNM") is pre.NNM
    assert adapters.resolve_callable("byzfl.attacks:Inf") is attacks.Inf
    assert adapters.guess_adapter("byzfl.attacks:Inf", attacks.Inf) == "byzfl"
    X = np.random.default_rng(0).normal(size=(6, 4))
    np.testing.assert_array_equal(adapters.byzfl_pre(pre.NNM)(X, np.ones(6), 2), pre.NNM(2)(X.copy()))
    # ByzFL's Clipping scales the rows it is given in place: the adapter hands it a copy
    before = X.copy()
    adapters.byzfl_pre(pre.Clipping, c=0.5)(X, np.ones(6), 0)
    np.testing.assert_array_equal(X, before)


# -- pre-aggregators ---------------------------------------------------------------------------

def test_byzfl_nnm_and_bucketing_mix_without_n_samples(byzfl):
    pre, _ = byzfl
    assert _pre("nnm", adapters.byzfl_pre(pre.NNM)) == {
        "reference_pre": "fails", "weighted_mixing": "fails", "nnm_honest_bound": "holds",
        "permutation_equivariance": "holds", "inputs_unchanged": "holds"}
    # reference_pre fails on a +inf row alone (below); on rounds of finite rows ByzFL's NNM
    # is rfrs-ref's with equal nᵢ
    from hypothesis import given, settings

    finite = strategies.byzantine_rounds(min_n=1, max_n=13, equal_weights=True, hostile=False)

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True)
    @given(finite)
    def holds_on_finite_rows(case):
        laws.reference_pre(adapters.byzfl_pre(pre.NNM), case, adapters.rfrs_pre("nnm").pre)

    holds_on_finite_rows()
    assert _pre("bucketing", adapters.byzfl_pre(pre.Bucketing, s=2)) == {
        "reference_pre": "holds", "weighted_mixing": "fails", "bucketing_shuffles": "holds",
        "inputs_unchanged": "holds"}
    # buckets of one row: the rows themselves, shuffled (ByzFL's default s = 1): one
    # partition, so bucketing_shuffles has nothing to compare
    assert _pre("bucketing", adapters.byzfl_pre(pre.Bucketing),
                reference_options={"bucket_size": 1}) == {"reference_pre": "holds",
                                                          "weighted_mixing": "holds",
                                                          "bucketing_shuffles": "skipped",
                                                          "inputs_unchanged": "holds"}


def test_byzfl_nnm_turns_an_infinite_row_into_the_mean_of_the_others(byzfl):
    """A row's distance to itself is +inf − +inf = NaN in ByzFL's NNM, which argpartition
    puts last: a +inf row is left out of its own neighbours and becomes the mean of the
    finite rows (a NaN row stays NaN). rfrs-ref's NNM leaves a non-finite row as it is,
    for the rule to treat; a finite value there is a disagreement (docs/conformance.md)."""
    pre, _ = byzfl
    X = np.array([[0.0], [1.0], [2.0], [np.inf], [3.0]])
    np.testing.assert_array_equal(pre.NNM(1)(X.copy())[:, 0], [1.5] * 5)
    assert np.isnan(pre.NNM(1)(np.where(np.isinf(X), np.nan, X))[3, 0])
    case = strategies.RoundCase(X, np.array([True, True, True, False, True]), 1,
                                np.ones(5, np.int64), np.arange(5), np.zeros(1))
    with pytest.raises(laws.LawViolation, match="row 3, coordinate 0: 1.5, finite"):
        laws.reference_pre(adapters.byzfl_pre(pre.NNM), case, adapters.rfrs_pre("nnm").pre)
    laws.reference_pre(adapters.rfrs_pre("nnm"), case, adapters.rfrs_pre("nnm").pre)


def test_byzfl_clipping_is_rfrs_refs_with_the_same_threshold(byzfl):
    pre, _ = byzfl
    for fn, ref in [(adapters.byzfl_pre(pre.Clipping, c=1.0), None),
                    (adapters.byzfl_pre(pre.Clipping), {"clip_norm": 2.0})]:
        assert set(_pre("clip", fn, reference_options=ref).values()) == {"holds"}
    # ByzFL's default c = 2.0 against rfrs-ref's default C = 1.0: a variant, named as such
    res = run_pre_conformance("clip", adapters.byzfl_pre(pre.Clipping), max_examples=5,
                              laws=["reference_pre"])
    assert res[0].status == "fails" and "clip_norm=1.0" in res[0].message


def test_byzfl_arc_misranks_a_nan_row(byzfl):
    pre, _ = byzfl
    st = _pre("arc", adapters.byzfl_pre(pre.ARC))
    assert st["permutation_equivariance"] == "fails"
    assert set(st.values()) <= {"holds", "fails"}
    # the shrunk counterexample of arc_clipping (200 examples): the largest honest row stays,
    # smaller ones are clipped, because sorted() with a NaN key leaves the rows unsorted
    X = np.array([[-0.002441467484459281], [np.nan], [0.0017997074173763394],
                  [-0.0005227484507486224], [-0.00041306353523395956]])
    out = pre.ARC(2)(X.copy())
    assert out[0, 0] == X[0, 0] and abs(out[2, 0]) < abs(X[2, 0])
    case = strategies.RoundCase(X, np.array([True, False, True, True, True]), 2, np.ones(5, np.int64),
                                np.arange(5), np.zeros(1))
    with pytest.raises(laws.LawViolation, match="above τ"):
        laws.arc_clipping(adapters.byzfl_pre(pre.ARC), case)
    laws.arc_clipping(adapters.rfrs_pre("arc"), case)


# -- attacks -------------------------------------------------------------------------------------

def test_byzfl_ipm_inf_and_mimic_obey_every_law(byzfl):
    _, attacks = byzfl
    assert set(_attack("ipm", adapters.byzfl_attack(attacks.InnerProductManipulation, tau=0.1)).values()) == {"holds"}
    assert set(_attack("ipm", adapters.byzfl_attack(attacks.InnerProductManipulation),
                       reference_options={"epsilon": 2.0}).values()) == {"holds"}
    assert set(_attack("inf", adapters.byzfl_attack(attacks.Inf)).values()) == {"holds"}
    assert set(_attack("mimic", adapters.byzfl_attack(attacks.Mimic)).values()) == {"holds"}
    # SignFlipping is −mean of the vectors it is given: IPM with ϵ = 1 (rfrs-ref's ascent is
    # another attack, rule(−g) per client: docs/attacks.md)
    assert set(_attack("ipm", adapters.byzfl_attack(attacks.SignFlipping),
                       reference_options={"epsilon": 1.0}).values()) == {"holds"}


def test_byzfl_mimic_refuses_an_index_rfrs_ref_clamps(byzfl):
    _, attacks = byzfl
    res = run_attack_conformance("mimic", adapters.byzfl_attack(attacks.Mimic, epsilon=3),
                                 max_examples=EXAMPLES, reference_options={"index": 3})
    assert all(r.status == "fails" and "epsilon must be smaller" in r.message for r in res)


def test_byzfl_alie_is_nan_on_a_single_vector_and_rfrs_refs_otherwise(byzfl):
    _, attacks = byzfl
    fn = adapters.byzfl_attack(attacks.ALittleIsEnough)  # τ = 1.5, i.e. z = −1.5
    st = _attack("alie", fn, reference_options={"z": -1.5})
    assert st == {"reference_attack": "fails", "alie_form": "fails", "permutation_invariance": "holds",
                  "inputs_unchanged": "holds"}
    res = run_attack_conformance("alie", fn, max_examples=5, reference_options={"z": -1.5})
    assert res[0].counterexample["k"] == 1  # σ of one vector: NaN in ByzFL, 0 in rfrs-ref
    # from two vectors on, the same vector
    ref = adapters.rfrs_attack("alie", z=-1.5)
    rng = np.random.default_rng(0)
    for k in range(2, 9):
        for dtype in (np.float32, np.float64):
            V = (rng.normal(size=(k, 5)) * 10.0 ** rng.integers(-3, 4)).astype(dtype)
            case = strategies.RoundCase(V, np.ones(k, bool), 0, np.ones(k, np.int64),
                                        rng.permutation(k), np.zeros(5))
            laws.reference_attack(fn, case, ref, gain=4.5)
            laws.alie_form(fn, case)
