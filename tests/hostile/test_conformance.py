"""Hostile input to `rfrs-ref conformance`: implementations that return NaN or inf,
that exit, and garbage on the command line.

A law holds only when the implementation agrees with the reference; a NaN,
+inf or 1e38 where the reference is finite fails it. Bad options are one-line
errors, never tracebacks, and a selection that would run nothing is refused
rather than reported as a success.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from click.testing import CliRunner

MODULE = textwrap.dedent('''
    import atexit
    import dataclasses
    import os
    import sys

    import numpy as np

    from rfrs_ref.optim import Adam


    @dataclasses.dataclass(frozen=True)
    class AdamRecoveringInf(Adam):
        def recover(self, state, upload, t):
            return np.full(np.shape(upload["m"]), np.inf)


    @dataclasses.dataclass(frozen=True)
    class AdamRecoveringNaN(Adam):
        def recover(self, state, upload, t):
            return np.full(np.shape(upload["m"]), np.nan)


    @dataclasses.dataclass(frozen=True)
    class AdamRuleNaN(Adam):
        def client_rule(self, state, g, t):
            up = super().client_rule(state, g, t)
            return {k: np.full_like(np.asarray(v, dtype=np.float64), np.nan) for k, v in up.items()}


    @dataclasses.dataclass(frozen=True)
    class AdamRuleThetaHuge(Adam):
        """Recovery reads m only, so a wrong θ goes unseen by recovery_exact."""

        def client_rule(self, state, g, t):
            up = dict(super().client_rule(state, g, t))
            up["theta"] = np.full_like(np.asarray(up["theta"], dtype=np.float64), 1e38)
            return up


    @dataclasses.dataclass(frozen=True)
    class AdamThatExits(Adam):
        def recover(self, state, upload, t):
            sys.exit(0)


    def median_that_exits(X, ns, f):
        sys.exit(0)


    def median_that_ends_the_process(X, ns, f):
        os._exit(0)


    @dataclasses.dataclass(frozen=True)
    class AdamThatEndsTheProcess(Adam):
        def recover(self, state, upload, t):
            os._exit(0)


    def median_that_exits_later(X, ns, f):
        atexit.register(os._exit, 0 if X.size < 0 else 3)
        return np.nanmedian(np.asarray(X, dtype=np.float64), axis=0)


    def median_rejecting_even_rounds(X, ns, f):
        """rfrs-ref's median where n is odd; every round of even n, where it would be
        wrong, is handed back to Hypothesis as one it should not have drawn."""
        import hypothesis

        from rfrs_ref.testing.adapters import rfrs

        hypothesis.assume(np.shape(X)[0] % 2 == 1)
        return rfrs("median")(X, ns, f).vector


    @dataclasses.dataclass(frozen=True)
    class AdamRejectingLateRounds(Adam):
        def recover(self, state, upload, t):
            import hypothesis

            if t > 1:
                hypothesis.reject()
            return super().recover(state, upload, t)


    def median_of_infinities(X, ns, f):
        return np.full(X.shape[1], np.inf)


    class BadHyper:
        lr = "fast"
        beta1 = 0.9
        beta2 = 0.999
        eps = 1e-8

        def client_rule(self, state, g, t):
            return {}

        def recover(self, state, upload, t):
            return g
    ''')


@pytest.fixture
def hostile_module(tmp_path, monkeypatch):
    (tmp_path / "hostile_impls.py").write_text(MODULE)
    (tmp_path / "broken_on_import.py").write_text("def f(:\n")
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('no')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "hostile_impls"
    for name in ("hostile_impls", "broken_on_import", "raises_on_import"):
        sys.modules.pop(name, None)


def _cli(*args):
    from rfrs_ref.cli.main import main

    return CliRunner().invoke(main, ["conformance", *map(str, args)])


def _no_traceback(res):
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output


def _refused(res, *fragments) -> str:
    assert res.exit_code != 0, res.output
    _no_traceback(res)
    errors = [x for x in res.output.splitlines() if x.startswith("Error")]
    assert len(errors) == 1, res.output
    for frag in fragments:
        assert frag in errors[0], errors[0]
    return errors[0]


def _law_fails(res, law: str) -> None:
    assert res.exit_code == 1, res.output
    _no_traceback(res)
    line = next(x for x in res.output.splitlines() if x.strip().startswith(law))
    assert "FAILS" in line, res.output


# -- 2. non-finite implementations fail the laws ---------------------------------------------------------

@pytest.mark.parametrize("impl", ["AdamRecoveringInf", "AdamRecoveringNaN", "AdamRuleNaN"])
def test_recovery_exact_fails_on_nonfinite_recovery_or_rule(hostile_module, impl):
    res = _cli("--optimizer", "adam", "--law", "recovery_exact", "--callable", f"{hostile_module}:{impl}",
               "--max-examples", "10")
    _law_fails(res, "recovery_exact")


def test_a_huge_theta_fails_the_update_rule_law(hostile_module):
    res = _cli("--optimizer", "adam", "--callable", f"{hostile_module}:AdamRuleThetaHuge",
               "--max-examples", "10", "--json")
    assert res.exit_code == 1, res.output
    status = {r["law"]: r["status"] for r in json.loads(res.output)["results"]}
    assert status["recovery_exact"] == "holds"  # recovery reads m, which is right
    assert status["update_rule"] == "fails"


def test_the_reference_passes(hostile_module):
    res = _cli("--optimizer", "adam", "--callable", "rfrs_ref.optim:Adam", "--max-examples", "5")
    assert res.exit_code == 0, res.output


def test_a_rule_returning_infinities_fails(hostile_module):
    res = _cli("--rule", "median", "--callable", f"{hostile_module}:median_of_infinities",
               "--max-examples", "10")
    _law_fails(res, "finite_output")
    _law_fails(res, "unanimity")


def test_the_unanimity_counterexample_is_the_input_that_failed():
    """unanimity gives the rule the round with every honest row replaced by the first: the
    counterexample reported is that round (it was the drawn one, whose honest rows differ,
    and on which the rule need not fail), so that feeding it to the rule reproduces it."""
    import pathlib

    import numpy as np

    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "wrong_krum.py"
    res = _cli("--rule", "krum", "--callable", f"{example}:krum", "--law", "unanimity",
               "--max-examples", "1", "--json")  # a fixed example, whose honest rows differ
    assert res.exit_code == 1, res.output
    (result,) = json.loads(res.output)["results"]
    ce = result["counterexample"]
    X = np.array([[float(v) for v in row] for row in ce["features"]])
    honest = np.array(ce["honest"], dtype=bool)
    assert (X[honest] == X[honest][0]).all(), ce
    import importlib.util

    spec = importlib.util.spec_from_file_location("wrong_krum", example)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.krum(X.astype(ce["dtype"]), np.array(ce["n_samples"]), ce["f"])
    assert not np.allclose(out, X[honest][0], equal_nan=False)


@pytest.mark.parametrize("args", [
    ["--optimizer", "adam", "--callable", "hostile_impls:AdamThatExits"],
    ["--rule", "median", "--callable", "hostile_impls:median_that_exits", "--law", "coordinate_range"],
])
def test_an_implementation_that_exits_fails_instead_of_passing(hostile_module, args):
    res = _cli(*args, "--max-examples", "5")
    assert res.exit_code == 1, res.output
    _no_traceback(res)
    assert "FAILS" in res.output and "called exit(0)" in res.output


@pytest.mark.parametrize("args", [
    ["--rule", "median", "--callable", "hostile_impls:median_rejecting_even_rounds", "--law",
     "reference_rule"],
    ["--optimizer", "adam", "--callable", "hostile_impls:AdamRejectingLateRounds", "--law",
     "recovery_exact"],
])
def test_an_implementation_that_discards_examples_fails(hostile_module, args):
    """Hypothesis's assume() and reject() discard the example they are called on: a median that
    rejected every round of even n was checked on odd n only and held every law, exit 0."""
    res = _cli(*args, "--max-examples", "20")
    assert res.exit_code == 1, res.output
    _no_traceback(res)
    assert "FAILS" in res.output and "assume() or reject()" in res.output


def test_a_pass_against_another_variant_says_which():
    """--rule-option max_iter=1 holds RFA to one Weiszfeld step, and --option k=1 calls the
    candidate as classic Krum: a report that holds under them read exactly as one against
    rfrs-ref's defaults. The title and the JSON now name the options of both sides."""
    res = _cli("--rule", "krum", "--callable", "rfrs_ref.aggregate:Krum", "--option", "k=1",
               "--law", "reference_rule", "--max-examples", "1")
    assert res.exit_code == 0, res.output
    title = res.output.splitlines()[0]
    assert "(adapter rfrs, k=1)" in title and "rfrs-ref's krum with k=1 (not its defaults)" in title
    res = _cli("--rule", "rfa", "--callable", "rfrs_ref.aggregate:RFA", "--option", "max_iter=1",
               "--rule-option", "max_iter=1", "--law", "reference_rule", "--max-examples", "1",
               "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["options"] == {"max_iter": 1} and report["reference_options"] == {"max_iter": 1}
    res = _cli("--rule", "krum", "--callable", "rfrs_ref.aggregate:Krum", "--law", "reference_rule",
               "--max-examples", "1", "--json")
    assert json.loads(res.output)["reference_options"] == {}


@pytest.mark.parametrize("args", [
    ["--optimizer", "adam", "--callable", "hostile_impls:AdamThatEndsTheProcess"],
    ["--rule", "median", "--callable", "hostile_impls:median_that_ends_the_process"],
])
def test_an_implementation_that_ends_the_process_fails(hostile_module, args):
    """os._exit(0) cannot be intercepted in the process it runs in: the suite runs the code
    under test in a child process, and a child that ended before its report is a failure
    (it used to end `rfrs-ref conformance` itself, with status 0)."""
    res = _cli(*args, "--max-examples", "5")
    assert res.exit_code == 1, res.output
    _no_traceback(res)
    assert "before the suite reported" in res.output and "not a pass" in res.output


def test_an_implementation_that_exits_after_the_report_fails(hostile_module):
    res = _cli("--rule", "median", "--callable", "hostile_impls:median_that_exits_later",
               "--law", "coordinate_range", "--max-examples", "3")
    assert res.exit_code == 1, res.output
    assert "holds" in res.output and "then exited with status 3" in res.output


# -- 4. garbage on the command line -------------------------------------------------------------------------

@pytest.mark.parametrize("law", ["no_such_law", "unanimity"])
def test_an_unknown_law_is_refused_not_passed(law):
    """--law unanimity does not exist for an optimiser: nothing would run, and it used to 'pass'."""
    res = _cli("--optimizer", "sgd", "--callable", "rfrs_ref.optim:SGD", "--law", law)
    _refused(res, f"no law {law!r}", "recovery_exact")
    res = _cli("--rule", "mean", "--callable", "rfrs_ref.aggregate:Mean", "--law", "recovery_exact")
    _refused(res, "no law 'recovery_exact'")


@pytest.mark.parametrize("value", ["9" * 5000, "[" * 100_000 + "]" * 100_000])
def test_an_option_value_that_json_cannot_read(value):
    res = _cli("--rule", "krum", "--callable", "flwr.server.strategy.aggregate:aggregate_krum",
               "--option", f"to_keep={value}")
    _refused(res, "--option", "to_keep")


@pytest.mark.parametrize("target, fragment", [
    (":f", "cannot import"),
    (".relative:f", "cannot import"),
    ("broken_on_import:f", "SyntaxError"),
    ("raises_on_import:f", "RuntimeError: no"),
    ("rfrs_ref.aggregate:", "no attribute"),
    ("no-colon-here", "package.module:attribute"),
])
def test_a_callable_that_cannot_be_loaded(hostile_module, target, fragment):
    _refused(_cli("--rule", "krum", "--callable", target), fragment)
    _refused(_cli("--optimizer", "adam", "--callable", target), fragment)


def test_an_optimizer_with_unusable_hyperparameters(hostile_module):
    _refused(_cli("--optimizer", "adam", "--callable", f"{hostile_module}:BadHyper"),
             "cannot take adam hyperparameters")


def test_the_python_api_refuses_unknown_laws():
    from rfrs_ref.optim import SGD
    from rfrs_ref.testing import adapters, run_optimizer_conformance, run_rule_conformance

    with pytest.raises(ValueError, match="no law 'nope'"):
        run_optimizer_conformance("sgd", SGD, laws=["nope"])
    with pytest.raises(ValueError, match="no law 'nope'"):
        run_rule_conformance("mean", adapters.rfrs("mean"), laws=["nope"])


# -- implementations that tamper with what they are given, and runs that check nothing ---------------------

CHEATS = textwrap.dedent('''
    import dataclasses

    import numpy as np

    from rfrs_ref.optim import Adam


    def mean_posing_as_median(X, ns, f):
        """The plain mean (not robust); then every row is overwritten with it."""
        m = np.where(np.isfinite(X), X, 0.0).astype(np.float64).mean(axis=0)
        X[...] = m
        ns[...] = 1
        return m


    def weights_posing_as_krum(X, ns, f):
        """Equal weights (the mean), after making every row equal to the first."""
        X[...] = X[0]
        return np.full(X.shape[0], 1.0 / X.shape[0])


    def vector_only_mean(X, ns, f):
        return np.asarray(X, dtype=np.float64).mean(axis=0)


    @dataclasses.dataclass(frozen=True)
    class AdamZeroRecovery(Adam):
        """Recovers 0 whatever was uploaded; its rule zeroes the caller's gradient in place."""

        def client_rule(self, state, g, t):
            up = super().client_rule(state, g, t)
            g[...] = 0.0
            return up

        def recover(self, state, upload, t):
            return np.zeros(np.shape(upload["m"]))


    @dataclasses.dataclass(frozen=True)
    class AdamShrinkingState(Adam):
        """Zeroes the state it is given, so that any bound computed from it afterwards is 0."""

        def client_rule(self, state, g, t):
            up = super().client_rule(state, g, t)
            for v in state.values():
                v[...] = 0.0
            return up
''')


EDGE_BUGS = textwrap.dedent('''
    import dataclasses

    import numpy as np

    from rfrs_ref.optim import Adam


    @dataclasses.dataclass(frozen=True)
    class AdamClipped(Adam):
        """Clips every gradient coordinate to [-10, 10] before the rule."""

        def client_rule(self, state, g, t):
            return super().client_rule(state, np.clip(g, -10.0, 10.0), t)


    @dataclasses.dataclass(frozen=True)
    class AdamFlushingTiny(Adam):
        """Recovers |g| < 1e-20 as 0."""

        def recover(self, state, upload, t):
            g = super().recover(state, upload, t)
            return np.where(np.abs(g) < 1e-20, 0.0, g)
''')


@pytest.mark.parametrize("impl, law", [("AdamClipped", "update_rule"), ("AdamFlushingTiny", "recovery_exact")])
def test_an_optimizer_wrong_only_at_the_corners_fails_with_one_example(tmp_path, monkeypatch, impl, law):
    """A derandomized run's only draw is all zeros: both passed every law with
    --max-examples 1 before the corner cases came first. (The clipping Adam recovers
    rfrs-ref's upload exactly: its rule is what is wrong.)"""
    for module in _module(tmp_path, monkeypatch, "edge_bugs", EDGE_BUGS):
        res = _cli("--optimizer", "adam", "--callable", f"{module}:{impl}", "--max-examples", "1")
    _law_fails(res, law)
    assert "(a fixed example)" in res.output


def _module(tmp_path, monkeypatch, name: str, text: str):
    """``text`` importable as module ``name`` for the test; forgotten afterwards."""
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@pytest.fixture
def cheats(tmp_path, monkeypatch):
    yield from _module(tmp_path, monkeypatch, "cheating_impls", CHEATS)


@pytest.mark.parametrize("law", ["coordinate_range", "permutation_invariance"])
def test_a_rule_that_overwrites_its_input_is_judged_on_the_input_it_was_given(cheats, law):
    """The plain mean, which then sets every row to its output: the honest range left
    behind was a single point, and the mean 'held' coordinate_range."""
    res = _cli("--rule", "median", "--callable", f"{cheats}:mean_posing_as_median", "--law", law,
               "--law", "coordinate_range", "--max-examples", "30")
    _law_fails(res, "coordinate_range")


def test_a_weights_rule_that_overwrites_its_input_fails(cheats):
    res = _cli("--rule", "krum", "--callable", f"{cheats}:weights_posing_as_krum", "--adapter", "weights",
               "--law", "krum_output_bound", "--law", "finite_output", "--max-examples", "30")
    _law_fails(res, "finite_output")


@pytest.mark.parametrize("seed", [0, 1, 2, 5, 6])
def test_a_weights_rule_that_overwrites_its_input_fails_whatever_the_seed(cheats, seed):
    """Its weights were applied to the rows it had overwritten with row 0, so finite_output
    failed only where a draw put a non-finite row first (not under these seeds). The
    weights adapter combines the rows as given: every hostile round catches it."""
    res = _cli("--rule", "krum", "--callable", f"{cheats}:weights_posing_as_krum", "--adapter", "weights",
               "--law", "finite_output", "--max-examples", "30", "--seed", seed)
    _law_fails(res, "finite_output")


def test_an_optimizer_that_overwrites_the_gradient_it_is_given_fails(cheats):
    """Its rule zeroed the caller's g, then recovery of 0 'matched' the g left behind."""
    res = _cli("--optimizer", "adam", "--callable", f"{cheats}:AdamZeroRecovery", "--law", "recovery_exact",
               "--max-examples", "20")
    _law_fails(res, "recovery_exact")


def test_an_optimizer_that_zeroes_the_state_it_is_given_is_judged_on_the_real_state(cheats):
    """Its uploads and recovery are right, judged on the real state: the laws of the update
    and the recovery hold, and inputs_unchanged (inputs are never modified in place) fails,
    whatever the draw. (camouflage_same_theta may fail it too: where the draw finds an
    example on which its attack changes a coordinate, the state it zeroed shows.)"""
    for seed in (None, 0, 1, 2):  # a fixed example catches it, whatever the draw
        res = _cli("--optimizer", "adam", "--callable", f"{cheats}:AdamShrinkingState", "--max-examples", "10",
                   *(() if seed is None else ("--seed", seed)))
        _law_fails(res, "inputs_unchanged")
        lines = [x.strip() for x in res.output.splitlines() if x.strip().split(" ")[0] in
                 ("recovery_exact", "update_rule", "lemma2", "theorem1")]
        assert len(lines) == 4 and all("holds" in x for x in lines), res.output


def test_a_run_whose_every_law_is_skipped_does_not_pass(cheats):
    """A callable without weights and only laws on weights: nothing checked, exit status 1."""
    res = _cli("--rule", "mean", "--callable", f"{cheats}:vector_only_mean", "--law", "weights_sum_to_one")
    assert "skipped" in res.output
    _refused(res, "no law was checked", "weights_sum_to_one")
    res = _cli("--rule", "mean", "--callable", f"{cheats}:vector_only_mean", "--law", "weights_sum_to_one",
               "--json")
    assert res.exit_code == 1 and "Traceback" not in res.output


def test_an_option_given_twice_is_refused():
    res = _cli("--rule", "krum", "--callable", "flwr.server.strategy.aggregate:aggregate_krum",
               "--option", "to_keep=1", "--option", "to_keep=n-f")
    assert res.exit_code == 2 and "to_keep is given twice" in res.output and "Traceback" not in res.output


# -- outputs of the wrong type or shape ---------------------------------------------------------------------

ALTERED = textwrap.dedent('''
    """rfrs-ref's own median, Krum and Adam, with their outputs in forms the convention rules out."""

    import dataclasses

    import numpy as np

    from rfrs_ref.aggregate import Krum, Median
    from rfrs_ref.optim import Adam


    def median(X, ns, f):
        return np.asarray(Median().aggregate(X, {"x": X}, ns, f, backend="numpy").arrays["x"],
                          dtype=np.float64)


    def median_complex(X, ns, f):
        return median(X, ns, f) + 1e300j


    def median_shaped(X, ns, f):
        return median(X, ns, f)[None, :, None]


    def median_strings(X, ns, f):
        return [repr(float(v)) for v in median(X, ns, f)]


    def median_objects(X, ns, f):
        return np.array([float(v) for v in median(X, ns, f)], dtype=object)


    def _krum(X, ns, f):
        return Krum(k=1).aggregate(X, {"x": X}, ns, f, backend="numpy")


    def krum_weights(X, ns, f):
        return np.asarray(_krum(X, ns, f).weights, dtype=np.float64)


    def krum_weights_complex(X, ns, f):
        return krum_weights(X, ns, f) + 1e300j


    def krum_weights_shaped(X, ns, f):
        return krum_weights(X, ns, f)[:, None]


    def krum_weights_mask(X, ns, f):
        return krum_weights(X, ns, f) > 0


    def krum_result(X, ns, f):
        res = _krum(X, ns, f)
        return {"weights": res.weights, "vector": res.arrays["x"]}


    def krum_result_shaped_vector(X, ns, f):
        res = krum_result(X, ns, f)
        return {**res, "vector": np.asarray(res["vector"])[None, :]}


    def krum_result_string_weights(X, ns, f):
        res = krum_result(X, ns, f)
        return {**res, "weights": [repr(float(w)) for w in res["weights"]]}


    @dataclasses.dataclass(frozen=True)
    class AdamFloat32(Adam):
        """Stores its uploads in float32, as rfrs-ref may."""

        def client_rule(self, state, g, t):
            return {k: np.asarray(v, dtype=np.float32) for k, v in super().client_rule(state, g, t).items()}


    @dataclasses.dataclass(frozen=True)
    class AdamFloat16(Adam):
        def client_rule(self, state, g, t):
            return {k: np.asarray(v, dtype=np.float16) for k, v in super().client_rule(state, g, t).items()}


    @dataclasses.dataclass(frozen=True)
    class AdamStringUpload(Adam):
        def client_rule(self, state, g, t):
            return {k: [repr(float(x)) for x in v] for k, v in super().client_rule(state, g, t).items()}


    @dataclasses.dataclass(frozen=True)
    class AdamShapedUpload(Adam):
        def client_rule(self, state, g, t):
            return {k: np.asarray(v)[None, :, None] for k, v in super().client_rule(state, g, t).items()}


    @dataclasses.dataclass(frozen=True)
    class AdamComplexRecovery(Adam):
        def recover(self, state, upload, t):
            return super().recover(state, upload, t) + 1e300j


    @dataclasses.dataclass(frozen=True)
    class AdamShapedRecovery(Adam):
        def recover(self, state, upload, t):
            return super().recover(state, upload, t)[None, :, None]
''')


@pytest.fixture
def altered(tmp_path, monkeypatch):
    yield from _module(tmp_path, monkeypatch, "altered_impls", ALTERED)


def _every_law_fails(res, *fragments) -> None:
    """Exit status 1, no traceback, and every law that ran FAILS naming what was expected
    and what was received."""
    assert res.exit_code == 1, res.output
    _no_traceback(res)
    lines = [x for x in res.output.splitlines() if x.startswith("  ") and not x.startswith("  {")
             and ("holds" in x or "FAILS" in x)]
    assert lines and all("FAILS" in x for x in lines), res.output
    for frag in ("expected a", *fragments):
        assert frag in res.output, res.output


@pytest.mark.parametrize("rule, impl, adapter, fragments", [
    ("median", "median_complex", "vector", ["complex128", "shape (", "real (float or integer)"]),
    ("median", "median_shaped", "vector", ["shape (1, ", "real (float or integer)"]),
    ("median", "median_strings", "vector", ["(strings)", "real (float or integer)"]),
    ("median", "median_objects", "vector", ["object"]),
    ("krum", "krum_weights_complex", "weights", ["complex128", "one weight per client"]),
    ("krum", "krum_weights_shaped", "weights", ["one weight per client"]),
    ("krum", "krum_weights_mask", "weights", ["bool (booleans)"]),
    ("krum", "krum_result_shaped_vector", "result", ["its 'vector'", "shape (1, "]),
    ("krum", "krum_result_string_weights", "result", ["its 'weights'", "(strings)"]),
])
def test_an_aggregate_of_the_wrong_type_or_shape_fails(altered, rule, impl, adapter, fragments):
    """rfrs-ref's own output with an imaginary part added, reshaped to (1, D, 1), written as
    strings, or given as a boolean mask: each used to be converted to a float64 (D,) or
    (n,) array and pass every law."""
    res = _cli("--rule", rule, "--callable", f"{altered}:{impl}", "--adapter", adapter, "--max-examples", "2")
    _every_law_fails(res, *fragments)
    assert "ComplexWarning" not in res.output


def test_weights_of_the_wrong_type_fail_the_laws_on_weights_instead_of_skipping_them(altered):
    res = _cli("--rule", "krum", "--callable", f"{altered}:krum_weights_complex", "--adapter", "weights",
               "--law", "weights_sum_to_one", "--max-examples", "2")
    _law_fails(res, "weights_sum_to_one")


@pytest.mark.parametrize("impl, adapter", [("median", "vector"), ("krum_weights", "weights"),
                                           ("krum_result", "result")])
def test_the_unaltered_rules_pass(altered, impl, adapter):
    rule = "median" if impl == "median" else "krum"
    # the altered Krum is classic Krum (k = 1): the reference law compares with that claim
    claim = [] if impl == "median" else ["--rule-option", "k=1"]
    res = _cli("--rule", rule, "--callable", f"{altered}:{impl}", "--adapter", adapter, "--max-examples", "3",
               *claim)
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("impl, law, fragment", [
    ("AdamFloat16", "update_rule", "float16"),
    ("AdamFloat16", "recovery_exact", "float16"),
    ("AdamStringUpload", "update_rule", "(strings)"),
    ("AdamShapedUpload", "lemma2", "shape (1, "),
    ("AdamComplexRecovery", "recovery_exact", "complex128"),
    ("AdamShapedRecovery", "recovery_exact", "shape (1, "),
])
def test_an_optimizer_output_of_the_wrong_type_or_shape_fails(altered, impl, law, fragment):
    """Uploads are float32 or float64 arrays of shape (D,), the recovered gradient a real (D,)
    array: a float16 upload used to be judged with float16's own, wider, tolerance."""
    res = _cli("--optimizer", "adam", "--callable", f"{altered}:{impl}", "--law", law, "--max-examples", "2")
    _law_fails(res, law)
    assert fragment in res.output and "expected a" in res.output, res.output


def test_uploads_stored_in_float32_are_rfrs_refs_own_convention(altered):
    """Every law, the theorem chains included: their rounding slack is that of the storage
    (it was float64's, and float32 uploads failed theorem1 on rounding alone)."""
    res = _cli("--optimizer", "adam", "--callable", f"{altered}:AdamFloat32", "--max-examples", "30")
    assert res.exit_code == 0, res.output


def test_a_hand_built_outcome_is_checked_too():
    """A rule written against the convention directly builds its Outcome itself: the laws
    check its arrays, not only the adapters."""
    import numpy as np

    from rfrs_ref.testing import Outcome, run_rule_conformance

    def rule(X, ns, f):
        return Outcome(np.median(X, axis=0)[None, :].astype(np.complex128))

    results = run_rule_conformance("median", rule, max_examples=2, laws=["coordinate_range"])
    assert [r.status for r in results] == ["fails"]
    assert "complex128" in results[0].message and results[0].counterexample["violation"]["expected_shape"]


MIXED = textwrap.dedent('''
    """rfrs-ref's Adam and momentum with θ stored in float32 and m (and v) in float64."""

    import dataclasses

    import numpy as np

    from rfrs_ref.optim import Adam, Momentum


    def _mixed(up, skew):
        out = {k: np.asarray(v, dtype=np.float64) for k, v in up.items()}
        out["theta"] = out["theta"].astype(np.float32)
        out["m"] = out["m"] * (1.0 + skew)
        return out


    @dataclasses.dataclass(frozen=True)
    class AdamMixed(Adam):
        def client_rule(self, state, g, t):
            return _mixed(super().client_rule(state, g, t), 0.0)


    @dataclasses.dataclass(frozen=True)
    class AdamMixedSkewed(Adam):
        """m off by 1e-9 relative: far beyond float64's rounding, well within float32's."""

        def client_rule(self, state, g, t):
            return _mixed(super().client_rule(state, g, t), 1e-9)


    @dataclasses.dataclass(frozen=True)
    class MomentumMixed(Momentum):
        def client_rule(self, state, g, t):
            return _mixed(super().client_rule(state, g, t), 0.0)


    @dataclasses.dataclass(frozen=True)
    class MomentumMixedSkewed(Momentum):
        def client_rule(self, state, g, t):
            return _mixed(super().client_rule(state, g, t), 1e-9)
''')


@pytest.fixture
def mixed(tmp_path, monkeypatch):
    yield from _module(tmp_path, monkeypatch, "mixed_impls", MIXED)


@pytest.mark.parametrize("optimizer, impl, law", [("adam", "AdamMixedSkewed", "theorem1"),
                                                  ("momentum", "MomentumMixedSkewed", "theorem2")])
def test_a_float32_theta_does_not_give_a_float64_m_float32_slack(mixed, optimizer, impl, law):
    """Each statement of a theorem takes the rounding of the arrays it reads: an m stored in
    float64 but wrong by 1e-9 relative (far beyond float64's rounding, within float32's)
    fails, although θ is stored in float32 (every array was given float32's slack as soon
    as one was float32, and this passed)."""
    res = _cli("--optimizer", optimizer, "--callable", f"{mixed}:{impl}", "--law", law, "--max-examples", "5")
    _law_fails(res, law)
    assert "‖m̂ − m‖" in res.output, res.output


@pytest.mark.parametrize("optimizer, impl", [("adam", "AdamMixed"), ("momentum", "MomentumMixed")])
def test_mixed_float32_and_float64_storage_passes_on_rounding_alone(mixed, optimizer, impl):
    res = _cli("--optimizer", optimizer, "--callable", f"{mixed}:{impl}", "--max-examples", "30")
    assert res.exit_code == 0, res.output


def test_a_missing_cross_check_library_names_the_extra(monkeypatch):
    from rfrs_ref.testing.adapters import AdapterError, resolve_callable

    for name in [m for m in sys.modules if m == "flwr" or m.startswith("flwr.")]:
        monkeypatch.delitem(sys.modules, name)  # imported already where Flower is installed
    monkeypatch.setitem(sys.modules, "flwr", None)  # as if Flower were not installed
    with pytest.raises(AdapterError, match=r"crosscheck extra: pip install 'rfrs-ref\[crosscheck\]'"):
        resolve_callable("flwr.server.strategy.aggregate:aggregate_krum")
    with pytest.raises(AdapterError) as info:  # a module of the user's own: no such hint
        resolve_callable("no_such_module_of_mine:f")
    assert "crosscheck" not in str(info.value)


# -- BaseExceptions and exits outside the laws ---------------------------------------------------------------

BASE = textwrap.dedent('''
    import dataclasses
    import sys

    import numpy as np

    from rfrs_ref.aggregate import Median
    from rfrs_ref.optim import Adam


    class Boom(BaseException):
        """Not an Exception: an `except Exception` lets it through."""


    def median_raising_boom(X, ns, f):
        raise Boom("out of the blue")


    def median_raising_keyboard_interrupt(X, ns, f):
        raise KeyboardInterrupt("not the user's")


    def median_raising_generator_exit(X, ns, f):
        raise GeneratorExit


    @dataclasses.dataclass(frozen=True)
    class AdamRaisingBoom(Adam):
        def recover(self, state, upload, t):
            raise Boom("in recover")


    def attack_raising_boom(V):
        raise Boom("in the attack")


    def pre_raising_boom(X, ns, f):
        raise Boom("in the pre-aggregator")


    @dataclasses.dataclass(frozen=True)
    class MedianExitingWhenBuilt(Median):
        def __post_init__(self):
            sys.exit(0)


    class AdamExitingWhenBuilt:
        def __init__(self):
            sys.exit(0)
    ''')


@pytest.fixture
def base_module(tmp_path, monkeypatch):
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    (tmp_path / "boom_on_import.py").write_text("class Boom(BaseException):\n    pass\n\nraise Boom('no')\n")
    yield from _module(tmp_path, monkeypatch, "base_impls", BASE)
    for name in ("exits_on_import", "boom_on_import"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("args, name", [
    (["--rule", "median", "--callable", "base_impls:median_raising_boom"], "Boom: out of the blue"),
    (["--rule", "median", "--callable", "base_impls:median_raising_keyboard_interrupt"],
     "KeyboardInterrupt: not the user's"),
    (["--rule", "median", "--callable", "base_impls:median_raising_generator_exit"], "GeneratorExit"),
    (["--optimizer", "adam", "--callable", "base_impls:AdamRaisingBoom", "--law", "recovery_exact"],
     "Boom: in recover"),
    (["--attack", "inf", "--callable", "base_impls:attack_raising_boom"], "Boom: in the attack"),
    (["--pre", "clip", "--callable", "base_impls:pre_raising_boom"], "Boom: in the pre-aggregator"),
])
def test_a_base_exception_from_the_code_under_test_fails_the_law(base_module, args, name):
    """A BaseException that is not an Exception (a class of the user's own, KeyboardInterrupt,
    GeneratorExit) went through the suite's `except Exception`: the child process printed a
    traceback and ended before its report. It now fails the law, with one message naming it."""
    res = _cli(*args, "--max-examples", "3")
    assert res.exit_code == 1, res.output
    _no_traceback(res)
    failing = [x for x in res.output.splitlines() if "FAILS" in x]
    assert failing and all(name in x for x in failing), res.output


@pytest.mark.parametrize("args, fragment", [
    (["--rule", "median", "--callable", "exits_on_import:median"], "exit(0)"),
    (["--rule", "median", "--callable", "boom_on_import:median"], "Boom: no"),
    (["--rule", "median", "--callable", "base_impls:MedianExitingWhenBuilt", "--adapter", "rfrs"],
     "exit(0)"),
    (["--optimizer", "adam", "--callable", "base_impls:AdamExitingWhenBuilt"], "exit(0)"),
])
def test_an_exit_while_the_code_under_test_loads_is_not_a_pass(base_module, args, fragment):
    """sys.exit(0) in a module as it is imported, or in a constructor the adapter calls, ended
    the child with status 0 before any law ran, and the command passed, printing nothing."""
    res = _cli(*args, "--max-examples", "3")
    error = _refused(res, fragment, "no law was checked")
    assert res.exit_code == 1, res.output
    assert "code under test" in error


def test_a_keyboard_interrupt_of_the_user_still_stops_the_python_api():
    """In the caller's process a KeyboardInterrupt the code under test raises fails its law,
    and a Ctrl-C (SIGINT) of the user still stops the run."""
    import os
    import signal

    import numpy as np

    from rfrs_ref.testing import adapters, run_rule_conformance

    def raises(X, ns, f):
        raise KeyboardInterrupt("not the user's")

    r, = run_rule_conformance("median", adapters.vector(raises), max_examples=2, laws=["unanimity"])
    assert r.status == "fails" and "KeyboardInterrupt: not the user's" in r.message

    def interrupted(X, ns, f):
        os.kill(os.getpid(), signal.SIGINT)
        return np.zeros(np.shape(X)[1])

    # a test runner started in the background (`pytest &` in a script) inherits SIGINT
    # ignored; the user's Ctrl-C at a terminal meets Python's default handler
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_rule_conformance("median", adapters.vector(interrupted), max_examples=2,
                                 laws=["unanimity"])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("rule, cls, option", [("cc", "CenteredClipping", "tau=NaN"),
                                               ("cc", "CenteredClipping", "tau=1e999"),
                                               ("cc", "CenteredClipping", "iterations=0"),
                                               ("rfa", "RFA", "nu=-1")])
def test_an_rfrs_rule_option_it_rejects_is_one_line(rule, cls, option):
    """--adapter rfrs builds rfrs-ref's rule from --option: a value the rule rejects (a NaN or
    infinite τ) ended the run with the rule's traceback instead of a one-line refusal."""
    res = _cli("--rule", rule, "--callable", f"rfrs_ref.aggregate:{cls}", "--adapter", "rfrs",
               "--option", option, "--max-examples", "1")
    _refused(res, option.split("=")[0])


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("rule,law", [("median", "permutation_invariance"),
                                      ("median", "translation_equivariance"),
                                      ("mean", "permutation_invariance"),
                                      ("mean", "translation_equivariance")])
def test_a_rule_returning_nan_everywhere_does_not_hold_the_laws_that_compare_it_with_itself(rule, law,
                                                                                             value):
    """permutation_invariance and translation_equivariance compare the candidate with itself
    (two orders of the rows; rule(X) + c with rule(X + c)), and NaN agrees with NaN: a rule
    returning NaN, or +inf, on every round held both. A law that compared nothing on every
    example is skipped, never holding."""
    import numpy as np

    from rfrs_ref.testing import adapters
    from rfrs_ref.testing.conformance import run_rule_conformance

    def constant(X, ns, f):
        return np.full(X.shape[1], value)

    (res,) = run_rule_conformance(rule, adapters.vector(constant), max_examples=5, laws=[law])
    assert res.status == "skipped" and "nothing was compared" in res.message, res


def test_a_rule_non_finite_on_hostile_rounds_only_still_holds_them():
    """Non-finite on the rounds with a hostile row only (as Flower's median): the laws compare
    it on the other rounds, and judge its order and shift there (finite_output judges the rest)."""
    import numpy as np

    from rfrs_ref.testing import adapters
    from rfrs_ref.testing.conformance import run_rule_conformance

    def nan_median(X, ns, f):
        return np.median(np.asarray(X, dtype=np.float64), axis=0)

    res = run_rule_conformance("median", adapters.vector(nan_median), max_examples=10,
                               laws=["permutation_invariance", "translation_equivariance",
                                     "finite_output"])
    assert [r.status for r in res] == ["fails", "holds", "holds"], res


@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
def test_a_pre_aggregator_or_attack_returning_nan_everywhere_does_not_hold_its_permutation_law(value):
    import numpy as np

    from rfrs_ref.testing.conformance import run_attack_conformance, run_pre_conformance

    for pre in ("nnm", "clip", "arc"):
        (res,) = run_pre_conformance(pre, lambda X, ns, f: np.full(X.shape, value), max_examples=5,
                                     laws=["permutation_equivariance"])
        assert res.status == "skipped", (pre, res)
    for attack, opts in (("ipm", None), ("alie", {"z": 1.5})):
        (res,) = run_attack_conformance(attack, lambda V: np.full(V.shape[1], value), max_examples=5,
                                        laws=["permutation_invariance"], reference_options=opts)
        assert res.status == "skipped", (attack, res)


def test_a_rule_returning_nan_everywhere_does_not_pass_on_the_command_line(tmp_path):
    mod = tmp_path / "nan_rule.py"
    mod.write_text("import numpy as np\n\ndef rule(X, ns, f):\n    return np.full(X.shape[1], np.nan)\n")
    for law in ("permutation_invariance", "translation_equivariance"):
        res = _cli("--rule", "median", "--callable", f"{mod}:rule", "--law", law, "--max-examples", "5")
        _refused(res, "no law was checked", "nothing was compared")


# -- 6. code under test that hides what it raised, or writes the suite's report ------------------------------

UNPRINTABLE = textwrap.dedent('''
    import glob
    import json
    import os
    import subprocess
    import sys
    import tempfile

    import numpy as np


    class Unprintable(Exception):
        def __str__(self):
            raise ValueError("no message for you")

        def __repr__(self):
            raise ValueError("no repr either")


    class UnprintableExit(BaseException):
        def __str__(self):
            raise ValueError("nor here")


    def median_raising_unprintable(X, ns, f):
        raise Unprintable()


    def median_raising_unprintable_base(X, ns, f):
        raise UnprintableExit()


    def median_raising_a_megabyte(X, ns, f):
        raise RuntimeError("x" * 1_000_000)


    class Faceless:
        """A callable whose repr and attribute lookups raise."""

        def __repr__(self):
            raise RuntimeError("no repr")

        def __getattr__(self, name):
            raise RuntimeError(f"no {name}")

        def __call__(self, X, ns, f):
            return np.nanmedian(np.asarray(X, dtype=np.float64), axis=0)


    faceless = Faceless()


    def _forge(code):
        """Write a passing report wherever one could be expected, then end the process."""
        paths = [os.environ.get("RFRS_REF_CONFORMANCE_REPORT")]
        paths += [os.path.join(d, "report.json")
                  for d in glob.glob(os.path.join(tempfile.gettempdir(), "rfrs-conformance-*"))]
        for path in filter(None, paths):
            with open(path, "w") as fh:
                json.dump({"exit": code, "token": "0" * 32}, fh)
        os._exit(0)


    def median_forging_its_report(X, ns, f):
        _forge(0)


    def median_running_a_passing_check_then_ending(X, ns, f):
        """A nested `rfrs-ref conformance` of a correct median (it passes), then os._exit(0): the
        nested run must not report for this one."""
        # -P: the working directory may hold a source checkout whose rfrs_ref (without its cli)
        # would shadow the installed one
        subprocess.run([sys.executable, "-P", "-m", "rfrs_ref.cli.main", "conformance", "--rule", "median",
                        "--callable", "rfrs_ref.aggregate:Median", "--law", "coordinate_range",
                        "--max-examples", "1"], check=True, capture_output=True)
        os._exit(0)
    ''')


@pytest.fixture
def unprintable(tmp_path, monkeypatch):
    yield from _module(tmp_path, monkeypatch, "unprintable_impls", UNPRINTABLE)


@pytest.mark.parametrize("name, shown", [
    ("median_raising_unprintable", "Unprintable: <str() raised ValueError>"),
    ("median_raising_unprintable_base",
     "the code under test raised UnprintableExit: <str() raised ValueError>"),
    ("median_raising_a_megabyte", "RuntimeError: xxx"),
])
def test_an_exception_whose_message_cannot_be_printed_fails_its_law(unprintable, name, shown):
    """An exception whose __str__ raised escaped the suite's formatting: the run ended with
    `Error: Invalid value for --law: no message for you` (status 2, a wrong reason) or a
    traceback. It fails the law, saying that its message could not be printed; a message of a
    megabyte is cut to one short line."""
    res = _cli("--rule", "median", "--callable", f"unprintable_impls:{name}", "--law",
               "coordinate_range", "--max-examples", "3")
    assert res.exit_code == 1, res.output
    _no_traceback(res)
    failing = [x for x in res.output.splitlines() if "FAILS" in x]
    assert len(failing) == 1 and shown in failing[0], res.output
    assert "Invalid value" not in res.output
    assert max(map(len, res.output.splitlines())) < 1000


def test_a_callable_whose_repr_and_attributes_raise_is_still_checked(unprintable):
    res = _cli("--rule", "median", "--callable", "unprintable_impls:faceless", "--law",
               "coordinate_range", "--max-examples", "3")
    assert res.exit_code == 0, res.output
    _no_traceback(res)
    assert "holds" in res.output


@pytest.mark.parametrize("name", ["median_forging_its_report",
                                  "median_running_a_passing_check_then_ending"])
def test_a_report_the_suite_did_not_write_is_not_a_pass(unprintable, name):
    """The child found the file for its report in its environment, and so did every process it
    started: a passing `rfrs-ref conformance` run from the code under test, or the code itself,
    could write `{"exit": 0}` there and end the child before the suite reported. The name now
    reaches the child through its stdin, and a report must carry a token drawn by the parent."""
    res = _cli("--rule", "median", "--callable", f"unprintable_impls:{name}", "--law",
               "coordinate_range", "--max-examples", "3")
    assert res.exit_code == 1, res.output
    _no_traceback(res)
    assert "before the suite reported" in res.output and "not a pass" in res.output


def test_describing_what_code_under_test_raised_never_raises():
    from rfrs_ref.untrusted import describe_exception, describe_object, exception_message

    class Loud(BaseException):
        def __str__(self):
            raise SystemExit(0)

    class Meta(type):
        @property
        def __name__(cls):
            raise RuntimeError("no name")

    class Nameless(Exception, metaclass=Meta):
        pass

    class NotAString(Exception):
        def __str__(self):
            return 42

    assert describe_exception(Loud()) == "Loud: <str() raised SystemExit>"
    assert describe_exception(ValueError("first\nsecond")) == "ValueError: first"
    assert describe_exception(KeyError()) == "KeyError"
    assert describe_exception(Nameless("m")).endswith(": m")
    assert exception_message(NotAString()) == "<str() raised TypeError>"
    assert describe_exception(RuntimeError("y" * 5000), limit=10) == "RuntimeError: " + "y" * 10 + "…"

    class Faceless:
        def __repr__(self):
            raise KeyboardInterrupt

    assert describe_object(Faceless()) == "<repr() raised KeyboardInterrupt>"


# -- 7. optimisers that alias: an upload overwritten later, an input changed one call later --------------

ALIASING = textwrap.dedent('''
    import numpy as np


    class SharedBufferSGD:
        """Returns one buffer, overwritten by every call: every upload a server keeps from a
        round is the last client's."""
        name = "sgd"
        arrays = ("theta",)

        def __init__(self, lr=0.01):
            self.lr, self._buf = lr, None

        def client_rule(self, state, g, t):
            th = np.asarray(state["theta"])
            if self._buf is None or self._buf.shape != th.shape or self._buf.dtype != th.dtype:
                self._buf = np.empty_like(th)
            np.subtract(th, self.lr * np.asarray(g, dtype=th.dtype), out=self._buf)
            return {"theta": self._buf}

        def recover(self, state, upload, t):
            th = np.asarray(state["theta"], dtype=np.float64)
            return (th - np.asarray(upload["theta"], dtype=np.float64)) / self.lr


    class DeferredWriteSGD(SharedBufferSGD):
        """Keeps the gradient it was given and zeroes it when recover runs."""

        def client_rule(self, state, g, t):
            self._g = g
            th = np.asarray(state["theta"])
            return {"theta": (th - self.lr * np.asarray(g, dtype=th.dtype)).astype(th.dtype)}

        def recover(self, state, upload, t):
            out = super().recover(state, upload, t)
            self._g[...] = 0.0
            return out
''')


@pytest.fixture
def aliasing(tmp_path, monkeypatch):
    yield from _module(tmp_path, monkeypatch, "aliasing_impls", ALIASING)


@pytest.mark.parametrize("name, shown", [
    ("SharedBufferSGD", "changed from"),
    ("DeferredWriteSGD", "(after recover)"),
])
def test_an_optimiser_that_aliases_its_uploads_or_inputs_fails(aliasing, name, shown):
    """Both held every law: each law converted an upload as soon as it had it, and
    inputs_unchanged looked at g only right after client_rule."""
    res = _cli("--optimizer", "sgd", "--callable", f"aliasing_impls:{name}", "--max-examples", "5")
    assert res.exit_code == 1, res.output
    _no_traceback(res)
    failing = [x for x in res.output.splitlines() if "FAILS" in x]
    assert len(failing) == 1 and "inputs_unchanged" in failing[0] and shown in failing[0], res.output
