"""reference_rule: a candidate rule is held to rfrs-ref's own output on the same round
(ties by index, small n, unequal nᵢ, float32)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from rfrs_ref.aggregate import RULES
from rfrs_ref.testing import adapters, laws, strategies
from rfrs_ref.testing.conformance import RULE_LAWS, run_rule_conformance

EXAMPLES = 30


def _ref(name, X, ns, f, **kw):
    return RULES.get(name)(**kw).aggregate(X, {"x": X}, ns, f, backend="numpy")


def _median(X):
    return _ref("median", X, np.ones(X.shape[0], np.int64), 0).arrays["x"]


def _sorted(X):
    X = np.asarray(X, np.float64)
    return np.sort(np.where(np.isnan(X), np.inf, X), axis=0)


def _krum(X, ns, f, extra=0, larger_index_on_tie=False):
    """Classic Krum weights with n − f − 2 + extra neighbours, non-finite rows infinitely far."""
    X = np.asarray(X, np.float64)
    n = X.shape[0]
    ok = np.isfinite(X).all(axis=1)
    with np.errstate(all="ignore"):
        D2 = ((X[:, None] - X[None]) ** 2).sum(-1)
    D2[~ok, :] = np.inf
    D2[:, ~ok] = np.inf
    m = n - f - 2 + extra
    scores = np.array([np.sort(np.delete(D2[i], i))[:m].sum() for i in range(n)])
    i = int(n - 1 - np.argmin(scores[::-1])) if larger_index_on_tie else int(np.argmin(scores))
    w = np.zeros(n)
    w[i] = 1.0
    return w


def _trim(X, b):
    S = _sorted(X)
    n = S.shape[0]
    b = b if n - 2 * b > 0 else (n - 1) // 2
    with np.errstate(all="ignore"):
        return S[b:n - b].mean(axis=0)


def _rfa_one_step(X, ns, f, nu=1e-6):
    X = np.asarray(X, np.float64)
    Y = X[np.isfinite(X).all(axis=1)]
    z = _median(X)
    w = 1.0 / np.maximum(nu, np.sqrt(((Y - z) ** 2).sum(1)))
    return (w @ Y) / w.sum()


def _median_f32_upper(X, ns, f):
    if np.asarray(X).dtype == np.float32 and X.shape[0] % 2 == 0:
        return _sorted(X)[X.shape[0] // 2]
    return _median(np.asarray(X, np.float64))


def _median_mean_for_small_n(X, ns, f):
    X = np.asarray(X, np.float64)
    if X.shape[0] <= 4:
        return X[np.isfinite(X).all(axis=1)].mean(0)
    return _median(X)


def _rfa_with_the_mean_weights(X, ns, f):
    """The geometric median as the aggregate, with the weights of the nᵢ-weighted mean (its
    first iterate): the round combines the uploads with the weights, i.e. takes their mean."""
    ok = np.isfinite(np.asarray(X, np.float64)).all(axis=1)
    w = np.where(ok, np.asarray(ns, np.float64), 0.0)
    return {"vector": _ref("rfa", X, ns, f).arrays["x"], "weights": w / w.sum()}


#: (rule, adapter, rfrs-ref rule options of the claim, wrong rule): each passed every other law
MUTANTS = {
    "krum_n_minus_f_minus_1_neighbours": ("krum", "weights", {"k": 1},
                                          lambda X, ns, f: _krum(X, ns, f, extra=1)),
    "krum_ties_to_the_larger_index": ("krum", "weights", {"k": 1},
                                      lambda X, ns, f: _krum(X, ns, f, larger_index_on_tie=True)),
    "multi_krum_claimed_as_classic": ("krum", "weights", {"k": 1},
                                      lambda X, ns, f: _ref("krum", X, ns, f, k=0).weights),
    "median_claimed_as_krum": ("krum", "vector", None,
                               lambda X, ns, f: _ref("median", X, ns, f).arrays["x"]),
    "trmean_trimming_f_plus_1": ("trmean", "vector", None, lambda X, ns, f: _trim(X, f + 1)),
    "median_claimed_as_trmean": ("trmean", "vector", None,
                                 lambda X, ns, f: _ref("median", X, ns, f).arrays["x"]),
    "median_lower_for_even_n": ("median", "vector", None,
                                lambda X, ns, f: _sorted(X)[(X.shape[0] - 1) // 2]),
    "median_wrong_for_float32_even_n": ("median", "vector", None, _median_f32_upper),
    "median_mean_for_n_at_most_4": ("median", "vector", None, _median_mean_for_small_n),
    "coordinate_median_claimed_as_rfa": ("rfa", "vector", None,
                                         lambda X, ns, f: _median(np.asarray(X, np.float64))),
    "rfa_one_weiszfeld_step": ("rfa", "vector", None, _rfa_one_step),
    "rfa_ignoring_n_samples": ("rfa", "vector", None,
                               lambda X, ns, f: _ref("rfa", X, np.ones(X.shape[0], np.int64),
                                                     f).arrays["x"]),
    "rfa_with_the_mean_weights": ("rfa", "result", None, _rfa_with_the_mean_weights),
}


@pytest.mark.parametrize("rule", list(RULE_LAWS))
def test_every_rule_has_the_reference_law_and_ours_holds_it(rule):
    assert "reference_rule" in [s.name for s in RULE_LAWS[rule][2]]
    r, = run_rule_conformance(rule, adapters.rfrs(rule), max_examples=EXAMPLES, laws=["reference_rule"])
    assert r.status == "holds", (r.message, r.counterexample)


@pytest.mark.parametrize("rule", list(RULE_LAWS))
def test_our_rules_with_other_options_and_kernels_hold_it(rule):
    opts = {"k": 1} if rule == "krum" else {}
    fn = adapters.rfrs(rule, backend="numba", **opts)
    r, = run_rule_conformance(rule, fn, max_examples=10, laws=["reference_rule"], reference_options=opts)
    assert r.status == "holds", (r.message, r.counterexample)


def _case(X, ns, f, honest=None):
    X = np.asarray(X)
    n = X.shape[0]
    return strategies.RoundCase(X, np.ones(n, bool) if honest is None else np.asarray(honest),
                                f, np.asarray(ns, np.int64), np.arange(n), np.zeros(X.shape[1]))


def _ref_options(rule):
    spec, = [s for s in RULE_LAWS[rule][2] if s.name == "reference_rule"]
    return spec.options


#: copies of rows 1 and 6, and of rows 2 and 4: subsets of equal objective whose computed
#: eigenvalues differ by rounding, so which one a path keeps depends on the CPU (on one
#: machine the oracle kept [0 1 2 3 5 6 7] and the batched path [0 1 3 4 5 6 7]; on an
#: AVX2-only AMD EPYC both keep the latter)
SMEA_TIED_SUBSETS = ([0, 1, 2, 3, 5, 6, 7], [0, 1, 3, 4, 5, 6, 7])
SMEA_TIE = _case([[.25, -.25], [.25, 0], [-.5, .25], [0, -.5], [-.5, .25], [.25, -.5], [.25, 0], [.5, 0]],
                 [23, 5, 20, 12, 14, 16, 23, 5], 1)

#: rows 1 and 2 copied (the outliers): 1 − τ/max τ of the copy is 0 or a rounding-sized
#: weight that keeps the filter going one more step
_CAF_ROWS = [[0.004871465265750885, 0.006366463378071785, 0.004334805067628622, 0.005351509898900986],
             [-0.00012853466614615172, 0.001366463489830494, -0.0006651946459896863, 0.0003515100688673556],
             [-0.00232503074221313, -0.00021879166888538748, -0.0012459110002964735, -0.0007322673336602747],
             [-0.0005442589754238725, -0.0003163001674693078, 0.00041163054993376136, 0.0010425134096294641],
             [-0.0007037352188490331, -0.0012654215097427368, -0.0006232744781300426, 4.1325980419060215e-05],
             [-0.0005356693873181939, 0.0003615950408857316, 0.0013040000339969993, 0.0009470809600315988]]
CAF_TIE = _case(np.array([[np.nan] * 4, _CAF_ROWS[0]] + _CAF_ROWS, np.float32),
                [20, 17, 8, 10, 21, 18, 15, 10], 3, [False] * 3 + [True] * 5)


def test_smea_subsets_tied_to_rounding_hold_and_other_subsets_fail():
    """Whichever of the two tied subsets a path keeps (the CPU's rounding decides), the
    nᵢ-weighted mean of the other holds against it with the allowance and fails
    without it."""
    fast, oracle = adapters.rfrs("smea", backend="numba"), adapters.rfrs("smea")
    opts = _ref_options("smea")
    assert opts == {"tied_subsets": True}
    laws.reference_rule(fast, SMEA_TIE, oracle, **opts)
    laws.reference_rule(oracle, SMEA_TIE, fast, **opts)
    kept = list(np.flatnonzero(oracle(SMEA_TIE.features, SMEA_TIE.n_samples, 1).weights > 0))
    assert kept in [list(s) for s in SMEA_TIED_SUBSETS]
    other_rows = next(s for s in SMEA_TIED_SUBSETS if list(s) != kept)

    def on_rows(X, ns, f):
        w = np.zeros(len(ns))
        w[other_rows] = np.asarray(ns, float)[other_rows] / np.asarray(ns, float)[other_rows].sum()
        return w

    other = adapters.weights(on_rows)
    laws.reference_rule(other, SMEA_TIE, oracle, **opts)
    with pytest.raises(laws.LawViolation):  # without the allowance the other subset fails
        laws.reference_rule(other, SMEA_TIE, oracle)
    # a subset that does not attain the smallest eigenvalue still fails
    first = adapters.weights(lambda X, ns, f: np.r_[np.asarray(ns[:-f], float) / ns[:-f].sum(), np.zeros(f)])
    with pytest.raises(laws.LawViolation, match="rfrs-ref's rule gives"):
        laws.reference_rule(first, SMEA_TIE, oracle, **opts)
    # and the nᵢ weighting of the tied subset is still checked
    plain = adapters.vector(lambda X, ns, f: np.asarray(X, np.float64)[[0, 1, 3, 4, 5, 6, 7]].mean(0))
    with pytest.raises(laws.LawViolation):
        laws.reference_rule(plain, SMEA_TIE, oracle, **opts)


def test_a_huge_row_does_not_make_every_smea_subset_tied():
    """The rounding allowance of SMEA's tied subsets was 64·n·u·max D2 over every finite
    row: a Byzantine row at 1e38 made it about 1e63, every subset of the other rows
    counted as tied to the smallest eigenvalue, and a SMEA that kept the first n − f rows
    (an honest outlier among them, where rfrs-ref keeps a tighter subset) held the law.
    Each subset's eigenvalue is now allowed the rounding of its own squared distances."""
    X = np.array([[0.0, 0.0], [0.1, 0.0], [0.0, 0.1], [0.1, 0.1], [0.9, 0.8], [0.05, 0.05],
                  [1e38, 1e38]])
    case = _case(X, [1] * 7, 2, [True] * 5 + [False] * 2)
    oracle = adapters.rfrs("smea")
    assert list(np.flatnonzero(oracle(X, case.n_samples, 2).weights > 0)) == [0, 1, 2, 3, 5]
    first = adapters.weights(lambda X, ns, f: np.r_[np.asarray(ns[:-f], float) / ns[:-f].sum(),
                                                    np.zeros(f)])
    with pytest.raises(laws.LawViolation, match="rfrs-ref's rule gives"):
        laws.reference_rule(first, case, oracle, **_ref_options("smea"))
    laws.reference_rule(oracle, case, oracle, **_ref_options("smea"))


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_smea_fast_path_holds_the_reference_law(seed):
    r, = run_rule_conformance("smea", adapters.rfrs("smea", backend="numba"), max_examples=100,
                              seed=seed, laws=["reference_rule"])
    assert r.status == "holds", (r.message, r.counterexample)


def test_caf_rounds_with_copied_rows_say_nothing():
    fast, oracle = adapters.rfrs("caf", backend="numba"), adapters.rfrs("caf")
    opts = _ref_options("caf")
    assert opts["skip_copies"]
    # whether the fast path's rounding of the copies' equal τ stops the filter a step
    # apart from the oracle's depends on the CPU (the vectorised sums' grouping): on
    # znver4 it does, on rocketlake not; with the allowance it holds either way
    laws.reference_rule(fast, CAF_TIE, oracle, **opts)
    # a candidate 0.1% off the reference on this round fails without the allowance and
    # is not compared with it, whatever the CPU
    off = adapters.vector(lambda X, ns, f: oracle(X, ns, f).vector * 1.001)
    with pytest.raises(laws.LawViolation):
        laws.reference_rule(off, CAF_TIE, oracle)
    laws.reference_rule(off, CAF_TIE, oracle, **opts)
    # without copies CAF is still compared: the mean is not CAF
    case = _case(np.array(_CAF_ROWS, np.float32), [20, 17, 8, 10, 21, 18], 2)
    mean = adapters.vector(lambda X, ns, f: (np.asarray(ns, float) @ np.asarray(X, float)) / ns.sum())
    with pytest.raises(laws.LawViolation):
        laws.reference_rule(mean, case, oracle, **opts)


@pytest.mark.parametrize("seed", [None, 3, 4])
def test_caf_fast_path_holds_the_reference_law(seed):
    r, = run_rule_conformance("caf", adapters.rfrs("caf", backend="numba"), max_examples=300,
                              seed=seed, laws=["reference_rule"])
    assert r.status == "holds", (r.message, r.counterexample)


@pytest.mark.parametrize("name", list(MUTANTS))
def test_the_reference_law_fails_rules_every_other_law_passes(name):
    rule, adapter, ref_opts, fn = MUTANTS[name]
    r, = run_rule_conformance(rule, getattr(adapters, adapter)(fn), max_examples=EXAMPLES,
                              laws=["reference_rule"], reference_options=ref_opts)
    assert r.status == "fails", name
    assert "rfrs-ref's rule gives" in r.message


def test_rfa_weights_are_held_through_the_aggregate_they_give():
    """RFA's weights are not compared one by one (they move with where Weiszfeld stops), but
    they combine every upload: a geometric median reported with the mean's weights passed every
    law; an RFA that computes elsewhere (the Numba path's Weiszfeld steps on the distance
    matrix), with the weights of its own stopping point, holds."""
    fn = adapters.result(_rfa_with_the_mean_weights)
    others = [s.name for s in RULE_LAWS["rfa"][2] if s.name != "reference_rule"]
    assert all(r.status == "holds" for r in run_rule_conformance("rfa", fn, max_examples=EXAMPLES,
                                                                 laws=others))
    r, = run_rule_conformance("rfa", fn, max_examples=EXAMPLES, laws=["reference_rule"])
    assert r.status == "fails" and "the candidate's weights give" in r.message

    def numba(X, ns, f):
        res = RULES.get("rfa")().aggregate(X, {"x": X}, ns, f, backend="numba")
        return {"vector": res.arrays["x"], "weights": res.weights}

    r, = run_rule_conformance("rfa", adapters.result(numba), max_examples=EXAMPLES,
                              laws=["reference_rule"])
    assert r.status == "holds", (r.message, r.counterexample)


def test_classic_krum_holds_against_classic_and_fails_against_the_default_multi_krum():
    fn = adapters.weights(lambda X, ns, f: _krum(X, ns, f))
    r, = run_rule_conformance("krum", fn, max_examples=EXAMPLES, laws=["reference_rule"],
                              reference_options={"k": 1})
    assert r.status == "holds", r.message
    r, = run_rule_conformance("krum", fn, max_examples=5, laws=["reference_rule"])
    assert r.status == "fails" and "kept by rfrs-ref" in r.message
    # the failure says which variant it was held to and how to name another
    assert "compared with rfrs-ref's krum (k=0: clients kept by Krum" in r.message, r.message
    assert "--rule-option KEY=VALUE" in r.message and "k=1 for classic Krum" in r.message


def test_ties_are_tried_first_and_pin_the_index_tie_break():
    # every row equal: every score ties and classic Krum must keep client 0
    fn = adapters.weights(lambda X, ns, f: _krum(X, ns, f, larger_index_on_tie=True))
    r, = run_rule_conformance("krum", fn, max_examples=1, laws=["reference_rule"],
                              reference_options={"k": 1})
    assert r.status == "fails" and r.counterexample["fixed_example"]
    cases = strategies.tie_examples(min_n=3, max_f=lambda n: (n - 3) // 2)
    assert {c.n for c in cases} == {3, 5} and {str(c.features.dtype) for c in cases} == {"float32", "float64"}
    assert all(len(set(c.n_samples.tolist())) == c.n for c in cases)  # unequal nᵢ


def test_drawn_tie_rounds_are_exact_and_cover_small_n():
    from hypothesis import given, settings

    seen = {"tie": 0, "min_n": 0}

    @settings(max_examples=60, deadline=None, database=None, derandomize=True)
    @given(strategies.byzantine_rounds(min_n=1, max_n=6, ties=True, byzantine=False))
    def prop(case):
        X = case.features
        if len({r.tobytes() for r in X}) < case.n:
            seen["tie"] += 1
        seen["min_n"] += case.n == 1

    prop()
    assert seen["tie"] >= 10 and seen["min_n"] >= 1


def test_reference_law_reports_values_and_tolerance():
    case = strategies.tie_examples(min_n=1)[0]
    wrong = adapters.vector(lambda X, ns, f: np.asarray(X, np.float64).mean(0) + 1.0)
    with pytest.raises(laws.LawViolation) as exc:
        laws.reference_rule(wrong, case, adapters.rfrs("median"))
    assert exc.value.details["tolerance"] > 0 and "rfrs-ref's rule gives" in exc.value.message


def test_cli_rule_option_chooses_the_reference():
    from rfrs_ref.cli.main import main

    runner = CliRunner()
    base = ["conformance", "--rule", "krum", "--callable", "rfrs_ref.aggregate:Krum", "--max-examples", "5"]
    res = runner.invoke(main, base + ["--option", "k=1", "--law", "reference_rule"])
    assert res.exit_code == 0, res.output  # --adapter rfrs: the reference takes the same options
    res = runner.invoke(main, base + ["--law", "reference_rule", "--rule-option", "k=1"])
    assert res.exit_code == 1 and "reference_rule" in res.output  # multi-Krum is not classic Krum
    res = runner.invoke(main, base + ["--rule-option", "nope=1"])
    assert res.exit_code == 2 and "--rule-option" in res.output
    res = runner.invoke(main, ["conformance", "--optimizer", "sgd", "--callable", "rfrs_ref.optim:SGD",
                               "--rule-option", "k=1"])
    assert res.exit_code == 2 and "--rule-option applies to --rule, --pre and --attack only" in res.output


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_monna_reference_rounds_keep_the_pivot_honest(seed):
    # a NaN Byzantine row at the pivot made rfrs-ref's MoNNA raise: its own rule failed the law
    spec, = [s for s in RULE_LAWS["monna"][2] if s.name == "reference_rule"]
    assert spec.strategy == {"ties": True, "trusted": 0}
    r, = run_rule_conformance("monna", adapters.rfrs("monna"), max_examples=100, seed=seed,
                              laws=["reference_rule"])
    assert r.status == "holds", (r.message, r.counterexample)


def test_monna_reference_rule_holds_from_the_cli():
    from rfrs_ref.cli.main import main

    res = CliRunner().invoke(main, ["conformance", "--rule", "monna", "--callable",
                                    "rfrs_ref.aggregate:MoNNA", "--law", "reference_rule"])
    assert res.exit_code == 0 and "FAILS" not in res.output, res.output


def test_monna_with_another_pivot_holds_when_the_pivot_is_named():
    """rfrs-ref's own MoNNA with pivot 2 failed every law (the rounds went down to n = 1,
    below its precondition pivot < n, and kept row 0 honest, not row 2): naming the pivot
    (--rule-option pivot=2) draws rounds with n > 2 and row 2 honest, and measures the pivot
    law from row 2."""
    pivot2 = adapters.rfrs("monna", backend="numba", pivot=2)
    results = run_rule_conformance("monna", pivot2, max_examples=EXAMPLES,
                                   reference_options={"pivot": 2})
    assert all(r.status == "holds" for r in results), [(r.law, r.message) for r in results
                                                        if r.status != "holds"]
    # a MoNNA that measures from row 0 while the round's trusted pivot is row 2 still fails
    r, = run_rule_conformance("monna", adapters.rfrs("monna", backend="numba"),
                              max_examples=EXAMPLES, laws=["reference_rule"],
                              reference_options={"pivot": 2})
    assert r.status == "fails"
    with pytest.raises(ValueError, match="pivot must be a row position"):
        run_rule_conformance("monna", pivot2, max_examples=1, reference_options={"pivot": -1})


def test_an_rfa_run_further_than_rfrs_refs_holds():
    """A correct RFA with a tighter stopping tolerance failed reference_rule: near a data
    point Weiszfeld converges so slowly that rfrs-ref's iterate (tol 1e-6) stops beyond
    the 10⁻⁴ spread allowance from the one run to tol 1e-9 (n = 3, f = 0, float32:
    −0.4999995 against −0.4987840, tolerance 9.2e-5); an aggregate at least as near the
    geometric median in objective now holds, and the wrong RFAs still fail."""
    from rfrs_ref.aggregate import RFA

    further = adapters.rfrs(RFA(tol=1e-9, max_iter=1000), backend="numba")
    r, = run_rule_conformance("rfa", further, max_examples=100, laws=["reference_rule"])
    assert r.status == "holds", r.message
    # a few steps from the mean lie farther from the median than rfrs-ref's stop
    early = adapters.rfrs(RFA(tol=0.0, max_iter=2), backend="numba")
    r, = run_rule_conformance("rfa", early, max_examples=100, laws=["reference_rule"])
    assert r.status == "fails"


def _mean_dropping_nonfinite_rows(X, ns, f):
    """The nᵢ-weighted mean of the finite rows only: a NaN or infinite row vanishes from the
    aggregate, where rfrs-ref's mean (like any weighted sum) carries it."""
    X = np.asarray(X, np.float64)
    ok = np.isfinite(X).all(axis=1)
    w = np.where(ok, np.asarray(ns, np.float64), 0.0)
    return w / w.sum()


def test_a_finite_aggregate_where_a_row_the_reference_combines_is_not_finite_fails():
    """rfrs-ref's mean of a round with a NaN row is NaN; the law said nothing there, so a
    mean that silently dropped hostile rows held every law of the mean (its weights hold
    weights_sum_to_one, and weighted_mean draws no Byzantine row)."""
    as_vector = adapters.vector(lambda X, ns, f: _mean_dropping_nonfinite_rows(X, ns, f)
                                @ np.where(np.isfinite(np.asarray(X, np.float64)), X, 0.0))
    for fn in (as_vector, adapters.weights(_mean_dropping_nonfinite_rows)):
        results = run_rule_conformance("mean", fn, max_examples=EXAMPLES)
        st = {r.law: r for r in results}
        assert st["reference_rule"].status == "fails", st["reference_rule"]
        assert "non-finite there" in st["reference_rule"].message
        assert st["reference_rule"].counterexample["fixed_example"]
        assert all(r.status in ("holds", "skipped") for r in results if r.law != "reference_rule")
    # a NaN row: the aggregate is NaN in that coordinate, whatever the candidate's arithmetic
    X = np.array([[1.0, 2.0], [np.nan, 3.0], [4.0, 5.0]])
    case = _case(X, [1, 2, 3], 2, [True, False, True])
    with pytest.raises(laws.LawViolation, match="coordinate 0 is 3.25") as exc:
        laws.reference_rule(as_vector, case, adapters.rfrs("mean"))
    assert exc.value.details["rows"] == [1]


def test_where_a_combined_row_is_infinite_any_non_finite_value_holds():
    """A running mean (m += w/W·(x − m)) turns +inf followed by a finite row into NaN where
    the direct sum gives +inf: which non-finite value depends on the arithmetic, that it is
    non-finite does not."""
    def running_mean(X, ns, f):
        X = np.asarray(X, np.float64)
        m, W = np.zeros(X.shape[1]), 0.0
        with np.errstate(all="ignore"):
            for x, w in zip(X, np.asarray(ns, np.float64)):
                W += w
                m = m + (w / W) * (x - m)
        return m

    X = np.array([[np.inf, 2.0], [1.0, 3.0], [4.0, 5.0]])
    case = _case(X, [1, 2, 3], 2, [False, True, True])
    fn = adapters.vector(running_mean)
    assert np.isnan(fn(X, case.n_samples, 2).vector[0])
    laws.reference_rule(fn, case, adapters.rfrs("mean"))
    r, = run_rule_conformance("mean", fn, max_examples=EXAMPLES, laws=["reference_rule"])
    assert r.status == "holds", (r.message, r.counterexample)


def test_where_the_reference_overflows_from_finite_rows_a_finite_value_is_not_judged():
    """A reference that overflows on finite rows (a float32 sum of rows near 3.4e38) has no
    value to compare with: a more careful candidate, finite there, holds; the coordinates
    where the reference is finite are still compared."""
    def float32_sum_mean(X, ns, f):
        X = np.asarray(X, np.float32)
        w = np.asarray(ns, np.float32)
        with np.errstate(all="ignore"):
            return ((w[:, None] * X).sum(axis=0) / w.sum()).astype(np.float64)

    X = np.array([[3.0e38, 1.0], [3.0e38, 2.0], [3.0e38, 4.0]], np.float32)
    case = _case(X, [5, 6, 7], 0)
    ref = adapters.vector(float32_sum_mean)
    assert np.isinf(ref(X, case.n_samples, 0).vector[0])
    careful = adapters.vector(lambda X, ns, f: (np.asarray(ns, float) @ np.asarray(X, float)) / ns.sum())
    laws.reference_rule(careful, case, ref)
    # (64u of the largest finite magnitude, 3e38, is 1.1e33 in float32)
    off = adapters.vector(lambda X, ns, f: careful(X, ns, f).vector + [0.0, 1e36])
    with pytest.raises(laws.LawViolation, match="coordinate 1"):
        laws.reference_rule(off, case, ref)


@pytest.mark.parametrize("rule", ["cc", "rfa"])
def test_a_huge_row_with_a_tiny_weight_does_not_widen_the_tolerance(rule):
    """Centered clipping and RFA give a row at 1e38 a weight of about 1e-36 (clipped to τ,
    or 1/distance), but weight > 0 made it one of "the rows rfrs-ref keeps", whose largest
    magnitude set the tolerance: 64u·1e38, so that an aggregate off by 1e15 on every round
    with such a row held. The rows now count by their weighted magnitude, Σ wᵢ|xᵢ|."""
    ref = adapters.rfrs(rule)

    def off_when_a_row_is_huge(X, ns, f):
        out = ref(X, ns, f)
        X64 = np.asarray(X, np.float64)
        huge = (np.abs(X64[np.isfinite(X64).all(axis=1)]) > 1e30).any()
        return {"vector": out.vector + (1e15 if huge else 0.0), "weights": out.weights}

    fn = adapters.result(off_when_a_row_is_huge)
    X = np.array([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5], [1e38, 1e38], [0.2, 0.1]])
    case = _case(X, [1, 2, 3, 4, 5], 1, [True, True, True, False, True])
    laws.reference_rule(adapters.result(lambda X, ns, f: {"vector": ref(X, ns, f).vector,
                                                          "weights": ref(X, ns, f).weights}),
                        case, ref, **_ref_options(rule))
    with pytest.raises(laws.LawViolation, match="rfrs-ref's rule gives"):
        laws.reference_rule(fn, case, ref, **_ref_options(rule))
    r, = run_rule_conformance(rule, fn, max_examples=EXAMPLES, laws=["reference_rule"])
    assert r.status == "fails", r


def test_a_huge_value_in_one_coordinate_does_not_widen_the_tolerance_of_the_others():
    """rfrs-ref's mean of a round with a Byzantine 1e38 in one coordinate is about 1e37
    there, and that magnitude set the tolerance of every coordinate (64u·1e37 ≈ 1e23): a
    mean off by 1 at every other coordinate on such rounds held every law of the mean.
    Rounding at a coordinate comes from the magnitudes at that coordinate, so the
    tolerance is measured per coordinate."""
    ref = adapters.rfrs("mean")

    def off_beside_a_huge_value(X, ns, f):
        out = ref(X, ns, f)
        A = np.abs(np.asarray(X, np.float64))
        huge = np.where(np.isfinite(A), A, 0.0).max(axis=0) > 1e30
        return out.vector + np.where(huge.any() & ~huge, 1.0, 0.0)

    fn = adapters.vector(off_beside_a_huge_value)
    X = np.array([[0.1, 0.2, -0.3], [0.2, 0.1, 0.0], [0.0, 1e38, 0.1]])
    case = _case(X, [1, 2, 3], 1, [True, True, False])
    laws.reference_rule(ref, case, ref)
    with pytest.raises(laws.LawViolation, match="coordinate 0 is"):
        laws.reference_rule(fn, case, ref)
    r, = run_rule_conformance("mean", fn, max_examples=EXAMPLES, laws=["reference_rule"])
    assert r.status == "fails", r
