"""The conformance suite on Flower's and ByzFL's aggregation functions, through the adapters.

These are the results published in docs/conformance.md (there with 200
examples per law; here 50). A law that fails on a library is a difference of
convention or a bug of the library, and the assertions pin which: a change
in the pinned versions (flwr 1.41.0, byzfl 0.0.11) shows up here.
"""

from __future__ import annotations

import numpy as np
import pytest

from rfrs_ref.testing import adapters
from rfrs_ref.testing.conformance import run_rule_conformance

pytestmark = pytest.mark.crosscheck

EXAMPLES = 50


def _status(rule, fn) -> dict[str, str]:
    return {r.law: r.status for r in run_rule_conformance(rule, fn, max_examples=EXAMPLES)}


def _holds_all(st: dict[str, str], skipped=("weights_sum_to_one", "krum_kept_bound")) -> bool:
    # reference_rule holds a library to rfrs-ref's nᵢ-weighted conventions, which they do
    # not share (docs/conformance.md, "The reference law")
    return all(v == "holds" or (k in skipped and v == "skipped")
               for k, v in st.items() if k != "reference_rule")


# -- the adapters translate faithfully --------------------------------------------------------------

def test_flower_adapter_reproduces_direct_calls(flower_aggregate):
    rng = np.random.default_rng(0)
    X, ns = rng.normal(size=(11, 5)), rng.integers(1, 30, size=11)
    results = [([X[i]], int(ns[i])) for i in range(11)]
    np.testing.assert_array_equal(adapters.flower(flower_aggregate.aggregate_krum)(X, ns, 2).vector,
                                  flower_aggregate.aggregate_krum(results, num_malicious=2, to_keep=0)[0])
    np.testing.assert_array_equal(
        adapters.flower(flower_aggregate.aggregate_krum, to_keep="n-f")(X, ns, 2).vector,
        flower_aggregate.aggregate_krum(results, num_malicious=2, to_keep=9)[0])
    # the trimmed mean cuts exactly f per side: equal to ours with equal nᵢ
    eq = np.full(11, 3)
    np.testing.assert_allclose(adapters.flower(flower_aggregate.aggregate_trimmed_avg)(X, eq, 3).vector,
                               adapters.rfrs("trmean")(X, eq, 3).vector, rtol=1e-12)
    np.testing.assert_allclose(adapters.flower(flower_aggregate.aggregate)(X, ns, 0).vector,
                               adapters.rfrs("mean")(X, ns, 0).vector, rtol=1e-12)


def test_byzfl_adapter_reproduces_direct_calls(byzfl_aggregators):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(9, 4))
    np.testing.assert_array_equal(adapters.byzfl(byzfl_aggregators.TrMean)(X, np.ones(9), 2).vector,
                                  byzfl_aggregators.TrMean(f=2)(X))
    gm = adapters.byzfl(byzfl_aggregators.GeometricMedian, nu=0.5, T=7)
    np.testing.assert_array_equal(gm(X, np.ones(9), 0).vector, byzfl_aggregators.GeometricMedian(nu=0.5, T=7)(X))
    inst = byzfl_aggregators.Median()
    np.testing.assert_array_equal(adapters.byzfl(inst)(X, np.ones(9), 1).vector, inst(X))


def test_resolve_byzfl_without_torchvision(byzfl_aggregators):
    obj = adapters.resolve_callable("byzfl.aggregators.aggregators:Krum")
    assert obj is byzfl_aggregators.Krum
    assert adapters.guess_adapter("byzfl.aggregators.aggregators:Krum", obj) == "byzfl"


# -- Flower ------------------------------------------------------------------------------------------

def test_flower_mean_multikrum_and_trimmed_mean_obey_every_law(flower_aggregate):
    assert _holds_all(_status("mean", adapters.flower(flower_aggregate.aggregate)))
    assert _holds_all(_status("krum", adapters.flower(flower_aggregate.aggregate_krum, to_keep="n-f")))
    assert _holds_all(_status("trmean", adapters.flower(flower_aggregate.aggregate_trimmed_avg)))


def test_flower_classic_krum_and_median_let_a_nan_row_through(flower_aggregate):
    st = _status("krum", adapters.flower(flower_aggregate.aggregate_krum))
    assert st["finite_output"] == "fails" and st["krum_output_bound"] == "fails"
    assert st["translation_equivariance"] == "holds"
    st = _status("median", adapters.flower(flower_aggregate.aggregate_median))
    assert st["finite_output"] == "fails" and st["coordinate_range"] == "fails"
    assert st["permutation_invariance"] == "holds"


def test_flower_bulyan_raises_on_a_nan_row(flower_aggregate):
    # Bulyan's precondition n ≥ 4f + 3 leaves few rounds with a Byzantine row: more examples
    (r,) = run_rule_conformance("bulyan", adapters.flower(flower_aggregate.aggregate_bulyan),
                                max_examples=200, laws=["finite_output"])
    assert r.status == "fails" and r.message.startswith("ValueError")
    assert any(x == "nan" for row in r.counterexample["features"] for x in row)


# -- ByzFL -------------------------------------------------------------------------------------------

def test_byzfl_average_ignores_n_samples(byzfl_aggregators):
    st = _status("mean", adapters.byzfl(byzfl_aggregators.Average))
    assert st["weighted_mean"] == "fails"
    assert st["permutation_invariance"] == st["translation_equivariance"] == st["unanimity"] == "holds"


def test_byzfl_multikrum_and_trmean_obey_every_law(byzfl_aggregators):
    assert _holds_all(_status("krum", adapters.byzfl(byzfl_aggregators.MultiKrum)))
    assert _holds_all(_status("trmean", adapters.byzfl(byzfl_aggregators.TrMean)))


def test_byzfl_krum_median_and_geometric_median_let_a_nan_row_through(byzfl_aggregators):
    assert _status("krum", adapters.byzfl(byzfl_aggregators.Krum))["finite_output"] == "fails"
    st = _status("median", adapters.byzfl(byzfl_aggregators.Median))
    assert st["finite_output"] == "fails" and st["coordinate_range"] == "fails"
    st = _status("rfa", adapters.byzfl(byzfl_aggregators.GeometricMedian))
    assert st["finite_output"] == "fails"
    assert st["unanimity"] == "fails"  # three Weiszfeld steps from 0 do not reach the median
