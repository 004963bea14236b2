"""The laws of mda, meamed and monna: they hold for rfrs-ref's rules (numpy and
numba) and fail for wrong rules, with a shrunk counterexample."""

from __future__ import annotations

import numpy as np
import pytest

from rfrs_ref.testing import adapters, laws, strategies
from rfrs_ref.testing.conformance import RULE_LAWS, format_results, run_rule_conformance
from rfrs_ref.testing.adapters import Outcome


def _status(results):
    return {r.law: r.status for r in results}


@pytest.mark.parametrize("rule", ["mda", "meamed", "monna", "cc", "caf", "smea"])
def test_numba_paths_obey_the_laws(rule):
    results = run_rule_conformance(rule, adapters.rfrs(rule, backend="numba"), max_examples=15)
    assert all(r.status == "holds" for r in results), format_results(results, rule)


def test_the_cli_lists_every_rule_with_laws():
    from rfrs_ref.cli.conformance import RULES

    assert RULES == list(RULE_LAWS)


def _mean_of_all(X, ns, f):
    n = X.shape[0]
    w = np.full(n, 1.0 / n)
    with np.errstate(all="ignore"):
        return Outcome(w @ X.astype(np.float64), w)


def test_a_plain_mean_breaks_the_mda_laws():
    st = _status(run_rule_conformance("mda", adapters.result(_mean_of_all), max_examples=100,
                                      laws=["mda_kept_diameter", "mda_output_bound"]))
    assert st == {"mda_kept_diameter": "fails", "mda_output_bound": "fails"}


def test_meamed_keeping_the_farthest_values_breaks_its_range():
    def farthest(X, ns, f):
        X = X.astype(np.float64)
        med = np.median(X, axis=0)
        with np.errstate(all="ignore"):
            d = np.abs(X - med)
        d = np.where(np.isnan(d), np.inf, d)
        idx = np.argsort(-d, axis=0, kind="stable")[: X.shape[0] - f]
        with np.errstate(all="ignore"):
            return np.take_along_axis(X, idx, axis=0).mean(axis=0)

    results = run_rule_conformance("meamed", adapters.vector(farthest), max_examples=200,
                                   laws=["meamed_range"])
    (r,) = results
    assert r.status == "fails" and r.counterexample["f"] >= 1


def test_monna_around_the_wrong_pivot_breaks_its_law():
    # the n − f nearest neighbours of the last row: a Byzantine pivot
    def last_pivot(X, ns, f):
        n = X.shape[0]
        Xd = X.astype(np.float64)
        with np.errstate(all="ignore"):
            d = np.sum((Xd - Xd[-1]) ** 2, axis=1)
        d = np.where(np.isnan(d), np.inf, d)
        keep = np.argsort(d, kind="stable")[: n - f]
        w = np.zeros(n)
        w[keep] = 1.0 / keep.size
        return w

    st = _status(run_rule_conformance("monna", adapters.weights(last_pivot), max_examples=200,
                                      laws=["monna_pivot_bound"]))
    assert st == {"monna_pivot_bound": "fails"}


def test_monna_law_refuses_an_untrusted_pivot():
    X = np.array([[0.0], [1.0], [50.0]])
    case = strategies.RoundCase(X, np.array([False, True, True]), 1, np.ones(3, np.int64),
                                np.arange(3), np.zeros(1))
    with pytest.raises(laws.LawViolation, match="must be honest"):
        laws.monna_pivot_bound(adapters.rfrs("monna"), case)


def test_the_trusted_strategy_keeps_the_pivot_honest():
    from hypothesis import given, settings

    @settings(max_examples=60, database=None)
    @given(strategies.byzantine_rounds(trusted=0))
    def prop(case):
        assert case.honest[0]

    prop()


def test_centered_clipping_without_clipping_breaks_its_law():
    st = _status(run_rule_conformance("cc", adapters.result(_mean_of_all), max_examples=200,
                                      laws=["cc_byzantine_pull"]))
    assert st == {"cc_byzantine_pull": "fails"}


def test_keeping_every_row_breaks_the_smea_law():
    st = _status(run_rule_conformance("smea", adapters.result(_mean_of_all), max_examples=200,
                                      laws=["smea_eigen_bound"]))
    assert st == {"smea_eigen_bound": "fails"}


def test_a_far_aggregate_cannot_widen_the_centered_clipping_slack():
    """cc_byzantine_pull's rounding slack was 64u·(‖a‖ + ‖b‖), the candidate's own aggregates:
    a CC that clips nothing, its output shifted by 1e17 (ulp 16), hid a Byzantine pull of ~140
    (the bound 20) in a slack of ~1400. The slack now comes from τ and the honest rows."""
    X = np.array([[0.1, -0.2], [0.3, 0.1], [-0.2, 0.0], [0.0, 0.2], [700.0, 700.0]])
    case = strategies.RoundCase(X, np.array([True] * 4 + [False]), 1, np.full(5, 7, np.int64),
                                np.arange(5), np.zeros(2))

    def shifted_mean(X, ns, f):
        return Outcome(X.astype(np.float64).mean(axis=0) + 1e17, None)

    with pytest.raises(laws.LawViolation, match="move the aggregate by"):
        laws.cc_byzantine_pull(shifted_mean, case)
    laws.cc_byzantine_pull(adapters.rfrs("cc"), case)  # the rule itself holds


def test_mda_keeping_fewer_than_n_minus_f_rows_breaks_its_kept_set_law():
    """MDA keeps the n − f rows of smallest diameter. Keeping fewer (one row, or none: all
    weights zero) makes the kept set's diameter smaller, never larger, and the law held
    on every round without comparing a pair; it now counts the rows kept, as SMEA's does."""
    X = np.array([[0.0, 0.0], [0.1, 0.0], [0.0, 0.1], [0.1, 0.1], [5.0, 5.0]])
    case = strategies.RoundCase(X, np.array([True] * 4 + [False]), 1, np.ones(5, np.int64),
                                np.arange(5), np.zeros(2))
    laws.mda_kept_diameter(adapters.rfrs("mda"), case)
    for w in ([1.0, 0, 0, 0, 0], [0.0] * 5):
        with pytest.raises(laws.LawViolation, match="rows kept"):
            laws.mda_kept_diameter(adapters.weights(lambda X, ns, f, w=w: np.array(w)), case)

    def one_row(X, ns, f):
        w = np.zeros(X.shape[0])
        w[0] = 1.0
        return w

    st = _status(run_rule_conformance("mda", adapters.weights(one_row), max_examples=20,
                                      laws=["mda_kept_diameter"]))
    assert st == {"mda_kept_diameter": "fails"}


def test_the_centered_clipping_pull_law_takes_the_candidates_tau_and_iterations():
    """The pull law held every candidate to τ = 100 and one iteration whatever the options
    named: a CC of τ = 100 checked as the τ = 10 it claimed to be passed the law (a pull ten
    times the bound), and a correct CC of two iterations failed it. It now takes τ and the
    iterations from ``reference_options``; with two iterations the law compares nothing."""
    wide = adapters.rfrs("cc")  # τ = 100
    st = _status(run_rule_conformance("cc", wide, max_examples=200, laws=["cc_byzantine_pull"],
                                      reference_options={"tau": 10.0}))
    assert st == {"cc_byzantine_pull": "fails"}
    st = _status(run_rule_conformance("cc", adapters.rfrs("cc", tau=10.0), max_examples=100,
                                      laws=["cc_byzantine_pull"],
                                      reference_options={"tau": 10.0}))
    assert st == {"cc_byzantine_pull": "holds"}
    st = _status(run_rule_conformance("cc", adapters.rfrs("cc", iterations=2), max_examples=20,
                                      laws=["cc_byzantine_pull"],
                                      reference_options={"iterations": 2}))
    assert st == {"cc_byzantine_pull": "skipped"}
    with pytest.raises(ValueError, match="cc's tau must be a finite number > 0"):
        run_rule_conformance("cc", wide, laws=["cc_byzantine_pull"],
                             reference_options={"tau": "ten"})
