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
}


@pytest.mark.parametrize("rule", list(RULE_LAWS))
def test_every_rule_has_the_reference_law_and_ours_holds_it(rule):
    assert "reference_rule" in [s.name for s in RULE_LAWS[rule][2]]
    r, = run_rule_conformance(rule, adapters.rfrs(rule), max_examples=EXAMPLES, laws=["reference_rule"])
    assert r.status == "holds", (r.message, r.counterexample)


@pytest.mark.parametrize("rule", ["krum", "median", "rfa", "mda", "monna"])
def test_our_rules_with_other_options_and_kernels_hold_it(rule):
    opts = {"k": 1} if rule == "krum" else {}
    fn = adapters.rfrs(rule, backend="numba", **opts)
    r, = run_rule_conformance(rule, fn, max_examples=10, laws=["reference_rule"], reference_options=opts)
    assert r.status == "holds", (r.message, r.counterexample)


@pytest.mark.parametrize("name", list(MUTANTS))
def test_the_reference_law_fails_rules_every_other_law_passes(name):
    rule, adapter, ref_opts, fn = MUTANTS[name]
    r, = run_rule_conformance(rule, getattr(adapters, adapter)(fn), max_examples=EXAMPLES,
                              laws=["reference_rule"], reference_options=ref_opts)
    assert r.status == "fails", name
    assert "rfrs-ref's rule gives" in r.message


def test_classic_krum_holds_against_classic_and_fails_against_the_default_multi_krum():
    fn = adapters.weights(lambda X, ns, f: _krum(X, ns, f))
    r, = run_rule_conformance("krum", fn, max_examples=EXAMPLES, laws=["reference_rule"],
                              reference_options={"k": 1})
    assert r.status == "holds", r.message
    r, = run_rule_conformance("krum", fn, max_examples=5, laws=["reference_rule"])
    assert r.status == "fails" and "kept by rfrs-ref" in r.message


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
    assert res.exit_code == 2 and "--rule-option applies to --rule only" in res.output


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
