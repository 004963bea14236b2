"""The conformance runner: which laws apply to which rule, run on any callable.

``run_rule_conformance("krum", rule_fn)`` draws rounds from
:func:`~rfrs_ref.testing.strategies.byzantine_rounds` within the rule's
precondition, runs every law of :data:`RULE_LAWS` that applies to it and to
what the callable exposes (a vector-only callable skips the laws on weights),
and returns one :class:`LawResult` per law: ``holds`` after ``max_examples``
examples, or ``fails`` with the minimal counterexample Hypothesis shrank to.
``run_optimizer_conformance("adam", obj)`` does the same for the optimiser laws.

The runs are derandomised (the same examples every time) unless a ``seed``
is given, and never touch Hypothesis's example database.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rfrs_ref.testing import laws as L
from rfrs_ref.testing import strategies as S
from rfrs_ref.testing.adapters import AdapterError, Outcome, OutputError
from rfrs_ref.untrusted import describe_exception, describe_object


@dataclasses.dataclass(frozen=True)
class LawSpec:
    """A law as the runner uses it.

    Attributes:
        name: the checker's name in :mod:`rfrs_ref.testing.laws`.
        statement: one line for reports.
        category: ``theory`` (docs/conformance.md) or ``convention`` (a definition of docs/conformance.md).
        needs_weights: the law reads per-client weights.
        options: keyword arguments of the checker (tolerances); a callable value
            is called with the example to give the value for that example.
        strategy: keyword arguments of :func:`byzantine_rounds` overriding the rule's.
        checker: the checker's name when it differs from ``name`` (a law of the same name
            in another family, e.g. the attacks' ``permutation_invariance``).
        example_cap: the most drawn examples the law takes (after its fixed ones), whatever
            ``max_examples``; None for none.
    """

    name: str
    statement: str
    category: str = "theory"
    needs_weights: bool = False
    options: dict = dataclasses.field(default_factory=dict)
    strategy: dict = dataclasses.field(default_factory=dict)
    checker: str = ""
    #: the most drawn examples the law takes, whatever ``max_examples`` (None: no cap)
    example_cap: int | None = None


_WEIGHTS = LawSpec("weights_sum_to_one", "weights are ≥ 0 and sum to 1", "convention", True)
_FINITE = LawSpec("finite_output", "finite aggregate with ≤ f arbitrary (NaN, ±inf, 1e38) rows")
_PERM = LawSpec("permutation_invariance", "reordering clients permutes weights, keeps the aggregate",
                strategy={"distinct": True})
_TRANS = LawSpec("translation_equivariance", "rule(X + c) = rule(X) + c")
_UNAN = LawSpec("unanimity", "honest rows all equal x (≤ f others) ⇒ aggregate x")
#: the candidate against rfrs-ref's own rule on the same round, rounds with exact ties included
_REF = LawSpec("reference_rule", "output = rfrs-ref's rule on the same round (ties by index, unequal nᵢ)",
               "convention", strategy={"ties": True})

#: rule -> (largest f for n: the rule's precondition, smallest n, laws)
RULE_LAWS: dict[str, tuple[Callable[[int], int], int, list[LawSpec]]] = {
    "mean": (lambda n: n - 1, 1, [
        _WEIGHTS,
        LawSpec("weighted_mean", "aggregate = Σ nᵢxᵢ / Σ nᵢ", "convention", strategy={"byzantine": False}),
        dataclasses.replace(_PERM, strategy={"hostile": False}),
        dataclasses.replace(_TRANS, strategy={"hostile": False}),
        dataclasses.replace(_UNAN, strategy={"byzantine": False}),
    ]),
    "krum": (lambda n: (n - 3) // 2, 3, [
        _WEIGHTS, _FINITE,
        LawSpec("krum_kept_bound", "kept rows within (n−f−2)/(n−2f−2)·diam² of an honest row",
                needs_weights=True),
        LawSpec("krum_output_bound", "aggregate within (n−f−2)/(n−2f−2)·diam² of the honest hull"),
        # with one neighbour (n − f − 2 = 1) mutual nearest neighbours tie and the
        # index breaks the tie: the law holds from two neighbours on
        dataclasses.replace(_PERM, statement=_PERM.statement + " (n − f − 2 ≥ 2)",
                            strategy={"distinct": True, "min_n": 4,
                                      "max_f": lambda n: min((n - 3) // 2, n - 4)}),
        _TRANS, _UNAN,
    ]),
    "median": (lambda n: (n - 1) // 2, 1, [
        _FINITE, LawSpec("coordinate_range", "every coordinate within the honest range"),
        _PERM, _TRANS, _UNAN,
    ]),
    "trmean": (lambda n: (n - 1) // 2, 1, [
        _FINITE, LawSpec("coordinate_range", "every coordinate within the honest range"),
        _PERM, _TRANS, _UNAN,
    ]),
    "rfa": (lambda n: (n - 1) // 2, 1, [
        _WEIGHTS, _FINITE,
        # Weiszfeld stops at a relative tolerance: equal inputs in another order or
        # place stop at a point as close to the median as the tolerance, not the same point
        dataclasses.replace(_PERM, options={"rtol": 1e-5}),
        dataclasses.replace(_TRANS, options={"rtol": 1e-5}),
        # the nᵢ-weighted geometric median breaks down at half the weight, not half
        # the clients: with equal nᵢ the honest majority is a weight majority. And
        # smoothing: weights nᵢ/max(ν, ‖z − xᵢ‖) stop pulling once z is within ν of
        # the honest x, so the fixed point sits up to ν·Σn_Byzantine/Σn_honest away
        dataclasses.replace(_UNAN, statement=_UNAN.statement + " (equal nᵢ; within the smoothing ν)",
                            options={"rtol": 1e-5, "atol": lambda c: _rfa_allowance(c)},
                            strategy={"equal_weights": True}),
    ]),
    # Bulyan's iterated Krum selection reaches one neighbour (|R| − f − 2 ≤ 1) for
    # f ≤ 2, where mutual nearest neighbours tie and the index decides: it is not
    # permutation invariant (docs/conformance.md)
    "bulyan": (lambda n: (n - 3) // 4, 3, [
        _FINITE, LawSpec("bulyan_range", "every coordinate within [lo − w, hi + w], w the honest width"),
        _TRANS, _UNAN,
    ]),
    # the smallest-diameter subset is the first of equal diameters in index order, and
    # two subsets share their diameter whenever they share the farthest pair: ties are
    # common, so the aggregate is not permutation invariant (docs/conformance.md)
    "mda": (lambda n: (n - 1) // 2, 1, [
        _WEIGHTS, _FINITE,
        LawSpec("mda_kept_diameter", "kept rows' diameter ≤ the honest diameter Δ", needs_weights=True),
        LawSpec("mda_output_bound", "aggregate within Δ of some honest row"),
        _TRANS, _UNAN,
    ]),
    "meamed": (lambda n: (n - 1) // 2, 1, [
        _FINITE,
        LawSpec("meamed_range", "every coordinate within max(med − lo, hi − med) of the median"),
        _PERM, _TRANS, _UNAN,
    ]),
    # MoNNA's guarantee needs a trusted pivot (position 0, rfrs-ref's default): every
    # example keeps that row honest. Permuting the rows moves the pivot, so the rule is
    # not permutation invariant
    "monna": (lambda n: (n - 1) // 2, 1, [
        dataclasses.replace(_WEIGHTS, strategy={"trusted": 0}),
        dataclasses.replace(_FINITE, strategy={"trusted": 0}),
        LawSpec("monna_pivot_bound", "with an honest pivot, kept rows and aggregate within the "
                "farthest honest row's distance of it", strategy={"trusted": 0}),
        dataclasses.replace(_TRANS, strategy={"trusted": 0}),
        dataclasses.replace(_UNAN, strategy={"trusted": 0}),
    ]),
    # centered clipping from the centre 0 (a first round) with τ = 100 and one iteration
    # (rfrs-ref's and ByzFL's defaults; ``--rule-option`` may name others, _cc_specs); f
    # is not used. The centre does not move with the
    # rows, so neither translation equivariance nor unanimity holds (docs/conformance.md)
    "cc": (lambda n: n - 1, 1, [
        _WEIGHTS, _FINITE,
        LawSpec("cc_byzantine_pull", "Byzantine rows move the aggregate by at most τ·Σ_B pᵢ",
                options={"tau": 100.0}, strategy={"equal_weights": True}),
        _PERM,
    ]),
    # CAF's filter has no per-example bound (its guarantee is asymptotic): the laws of any
    # robust weighting rule
    "caf": (lambda n: (n - 1) // 2, 1, [_WEIGHTS, _FINITE, _TRANS, _UNAN]),
    # the first subset of smallest eigenvalue in index order: ties (copies, clusters) decide
    # by index, so permutation invariance is not a law of SMEA
    "smea": (lambda n: (n - 1) // 2, 1, [
        _WEIGHTS, _FINITE,
        LawSpec("smea_eigen_bound", "kept rows spread no more than the best n − f honest rows",
                needs_weights=True),
        # the shift is exact, but the covariance of shifted rows is computed with other
        # roundings: subsets of equal eigenvalue (copies, symmetric clusters) may swap
        dataclasses.replace(_TRANS, strategy={"distinct": True}), _UNAN,
    ]),
}

# every rule is also held to rfrs-ref's own output. RFA stops Weiszfeld at a relative
# tolerance (1e-6 of the step): another correct implementation stops elsewhere within that
# tolerance of the spread, and its weights nᵢ/max(ν, ‖z − xᵢ‖) move with z, so RFA is
# compared on the aggregate, within 1e-4 of the honest spread around it
#: CAF's filter multiplies its weights by 1 − τᵢ/max τ at every step, a cancellation that
#: amplifies the rounding of the distances: reference_rule compares CAF within 64·CAF_GAIN·u
CAF_GAIN = 1024.0

# MoNNA is compared, like its other laws, on rounds whose pivot (client 0) is honest: its
# guarantee assumes a trusted pivot, and with a NaN row at the pivot rfrs-ref's MoNNA moves
# the pivot to the next finite client, a convention of its own that a candidate need not share
for _rule, (_fb, _mn, _specs) in RULE_LAWS.items():
    if _rule == "rfa":
        _specs.append(dataclasses.replace(_REF, options={"spread_rtol": 1e-4, "compare_weights": False,
                                                         "nearer_median": True}))
    elif _rule == "monna":
        _specs.append(dataclasses.replace(_REF, strategy={**_REF.strategy, "trusted": 0}))
    elif _rule == "smea":
        # subsets of equal objective (copied rows) tie only to rounding: another of them holds
        _specs.append(dataclasses.replace(_REF, options={"tied_subsets": True}))
    elif _rule == "caf":
        # with copied rows the filter's steps hinge on rounding: those rounds say nothing
        _specs.append(dataclasses.replace(_REF, options={"skip_copies": True, "gain": CAF_GAIN}))
    else:
        _specs.append(_REF)

#: the drawn examples of a rule's, pre-aggregator's or attack's inputs_unchanged law, after
#: its fixed ones, whatever max_examples: a callable that writes into its inputs does so on
#: any round or on the hostile ones, and every example costs two calls
INPUTS_DRAWN = 10

#: every rule leaves its inputs alone and returns a new aggregate (docs/aggregation.md)
_INPUTS_RULE = LawSpec("inputs_unchanged", "features and nᵢ unchanged byte for byte; the output is a "
                       "new array", "convention", checker="rule_inputs_unchanged",
                       example_cap=INPUTS_DRAWN)
for _rule, (_fb, _mn, _specs) in RULE_LAWS.items():
    _specs.append(_INPUTS_RULE)

#: the laws that also try the fixed large rounds (:func:`strategies.large_examples`), after
#: the hostile ones: each family's comparison with rfrs-ref and its main guarantees (the
#: laws that compare the candidate with itself, and inputs_unchanged, keep to the small
#: rounds: a large round there costs seconds and catches nothing the reference law misses)
LARGE_LAWS = frozenset({
    "reference_rule", "finite_output", "weighted_mean", "krum_kept_bound", "krum_output_bound",
    "coordinate_range", "bulyan_range", "mda_kept_diameter", "mda_output_bound", "meamed_range",
    "smea_eigen_bound", "cc_byzantine_pull", "monna_pivot_bound",
    "reference_pre", "weighted_mixing", "nnm_honest_bound", "clip_norm_bound", "arc_clipping",
    "reference_attack", "ipm_direction", "alie_form", "mimic_copy", "inf_nonfinite",
})

#: the fixed large rounds of a family member, where not :data:`strategies.LARGE_ROUNDS` with
#: f at its limit: MDA and SMEA search the C(n, f) subsets of the clients, CAF's filter
#: costs a pass per dropped client and the bucketing law searches the partitions into
#: buckets, so theirs is one round of 17 clients (D = 257, float64), and MDA's and SMEA's f
#: is the largest with C(n, f) ≤ 1000 (MDA: f = 3) and ≤ 200 (SMEA: f = 2)
_SMALLER_LARGE = ((17, 257, "float64", "hostile"),)
LARGE_RULE_ROUNDS: dict[str, dict] = {
    "mda": {"sizes": _SMALLER_LARGE, "max_subsets": 1000},
    "smea": {"sizes": _SMALLER_LARGE, "max_subsets": 200},
    "caf": {"sizes": _SMALLER_LARGE},
}
LARGE_PRE_ROUNDS: dict[str, dict] = {"bucketing": {"sizes": _SMALLER_LARGE}}


def _large(spec: LawSpec, family: dict, name: str, **kw) -> list:
    """The fixed large rounds law ``spec`` of family member ``name`` tries (none for a law
    outside :data:`LARGE_LAWS`)."""
    if spec.name not in LARGE_LAWS:
        return []
    return S.large_examples(**kw, **family.get(name, {}))

#: RFA's smoothing ν (rfrs-ref's default), for the unanimity allowance
RFA_NU = 1e-6


def _rfa_allowance(case) -> float:
    ns = case.n_samples.astype(np.float64)
    return 2.0 * RFA_NU * (ns.sum() / ns[case.honest].sum())


_RECOVERY = LawSpec("recovery_exact", "recover(rule(g)) = g to rounding")
_UPDATE = LawSpec("update_rule", "client_rule(state, g, t) = the optimiser's update rule to rounding",
                  "convention")
_INPUTS = LawSpec("inputs_unchanged", "client_rule and recover leave the arrays they are given unchanged; "
                  "their results are new arrays that later calls leave alone", "convention")

#: optimiser -> laws (name, statement)
OPTIMIZER_LAWS: dict[str, list[LawSpec]] = {
    "sgd": [_RECOVERY, _UPDATE, _INPUTS],
    "momentum": [_RECOVERY, _UPDATE, _INPUTS,
                 LawSpec("lemma2", "‖m‖ ≤ g_max/(1 − β₃) under convex aggregation"),
                 LawSpec("theorem2", "‖m̂ − m‖ = ‖Δg‖, ‖θ̂ − θ‖ = η‖Δg‖")],
    "adam": [_RECOVERY, _UPDATE, _INPUTS,
             LawSpec("lemma2", "‖m‖ ≤ g_max under convex aggregation (Lemma 2)"),
             LawSpec("theorem1", "Theorem 1 chain: Δm, Δv, Δ√v, Δ1/(√v+ε), Δθ with ηₜ and ε"),
             LawSpec("camouflage_same_theta", "camouflaged θ = honest θ, recovered g differs")],
    "adagrad": [_RECOVERY, _UPDATE, _INPUTS,
                LawSpec("theorem3", "Theorem 3 chain: Δr, Δ√r, Δ1/(√r+ε), Δθ")],
    "rmsprop": [_RECOVERY, _UPDATE, _INPUTS,
                LawSpec("theorem4", "Theorem 4 chain: Δr, Δ√r, Δ1/(√r+ε), Δθ")],
}


def _check_law_names(laws, specs, what: str) -> None:
    """Unknown law names are an error: a selection that runs nothing must not pass."""
    if laws is None:
        return
    known = [s.name for s in specs]
    unknown = [name for name in laws if name not in known]
    if unknown:
        raise ValueError(f"no law {unknown[0]!r} for {what}; choose from: {', '.join(known)}")


@dataclasses.dataclass
class LawResult:
    """The outcome of one law on one callable.

    Attributes:
        law: the law's name; statement: its one-line statement; category.
        status: ``holds``, ``fails``, or ``skipped`` (with ``message`` saying why).
        examples: how many examples ran.
        message: the violation (or why it was skipped).
        counterexample: the minimal failing example, strict-JSON friendly (a
            non-finite number appears as the string "nan", "inf" or "-inf"),
            None otherwise.
        seconds: wall time.
    """

    law: str
    statement: str
    category: str
    status: str
    examples: int = 0
    message: str = ""
    counterexample: dict | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _settings(max_examples: int, seed: int | None):
    from hypothesis import HealthCheck, Phase, Verbosity, settings

    return settings(max_examples=max_examples, derandomize=seed is None, database=None,
                    deadline=None, report_multiple_bugs=False, verbosity=Verbosity.quiet,
                    suppress_health_check=list(HealthCheck), print_blob=False,
                    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink))


class _UserInterrupt(KeyboardInterrupt):
    """A Ctrl-C (SIGINT) that arrived while a law ran: the user's, which stops the run; a
    KeyboardInterrupt the code under test raises itself fails the law instead."""


@contextlib.contextmanager
def _interrupts_told_apart():
    """While the block runs, SIGINT raises :class:`_UserInterrupt`, so that a plain
    KeyboardInterrupt can only come from the code under test. Yields whether that holds:
    outside the main thread no handler can be installed, and every KeyboardInterrupt then
    counts as the user's. A SIGINT that is ignored stays ignored."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None):
        yield True
        return

    def handler(signum, frame):
        raise _UserInterrupt()

    signal.signal(signal.SIGINT, handler)
    try:
        yield True
    finally:
        signal.signal(signal.SIGINT, previous)


def _no_exit(check: Callable[[Any], None], own_interrupts: bool = False) -> Callable[[Any], None]:
    """``check`` with an exit from the code under test turned into a failure: ``sys.exit(0)``
    in a callable must not end a conformance run as a success.

    So is a call to Hypothesis's ``assume`` or ``reject`` (the laws make none): Hypothesis
    takes it for an example the strategy should not have drawn and discards it, so a rule
    that rejected every round where it is wrong (every even n) was never checked on one and
    held every law. And so is any other BaseException that is not an Exception (a class of
    the code's own, GeneratorExit, and KeyboardInterrupt when ``own_interrupts``: the
    user's Ctrl-C is then a :class:`_UserInterrupt`, which still stops the run): it went
    through every ``except Exception`` and ended the run with a traceback."""
    from hypothesis.errors import UnsatisfiedAssumption

    def guarded(example):
        try:
            check(example)
        except _UserInterrupt:
            raise
        except SystemExit as exc:
            raise RuntimeError(f"the code under test called exit({exc.code!r})") from None
        except UnsatisfiedAssumption:
            raise RuntimeError("the code under test called Hypothesis's assume() or reject(), "
                               "which would discard the example instead of checking it") from None
        except Exception:
            raise
        except KeyboardInterrupt as exc:
            if not own_interrupts:
                raise
            raise RuntimeError(f"the code under test raised {describe_exception(exc)}") from None
        except BaseException as exc:
            raise RuntimeError(f"the code under test raised {describe_exception(exc)} (a BaseException, "
                               "not an Exception)") from None

    return guarded


#: why a law compared nothing on an example (:data:`L.NOT_COMPARED`), by law
_NOTHING_COMPARED = {
    "": ("the output was non-finite at every coordinate where rfrs-ref's is finite (a "
         "non-finite output agrees with itself; finite_output and the reference law judge it)"),
    "translation_equivariance": (
        "the output was non-finite at every coordinate where rfrs-ref's is finite (a non-finite "
        "output agrees with itself; finite_output and the reference law judge it), or the shift "
        "could not be added exactly and rounding reordered some column's values"),
    "camouflage_same_theta": (
        "neither rfrs-ref's attack nor the one under test changed any coordinate (Eq. 6 has no "
        "solution that keeps θ: e.g. β₁ = 0)"),
    **dict.fromkeys(("recovery_exact", "update_rule", "theorem1", "theorem2", "theorem3",
                     "theorem4"), (
        "rfrs-ref's own update overflowed on every example with these hyperparameters (e.g. "
        "a learning rate near the float64 maximum), so there was no finite upload to compare "
        "with; check hyperparameters under which the update is finite")),
    **dict.fromkeys(("krum_kept_bound", "krum_output_bound"), (
        "no example met the bound's precondition n > 2f + 2")),
    "reference_rule": (
        "every example held two equal finite rows, which the rule may tell apart either way"),
    **dict.fromkeys(("ipm_direction", "alie_form"), (
        "no example had a coordinate where the vectors' mean (and standard deviation) is "
        "finite")),
    "bucketing_shuffles": (
        "the round had a single partition into buckets (s = 1, or s ≥ n), or a mixed row "
        "that is the mean of more than one bucket (rows too close for the dtype)"),
}


def _run_law(spec: LawSpec, strategy, check: Callable[[Any], None], describe: Callable[[Any], dict],
             max_examples: int, seed: int | None, examples=()) -> LawResult:
    """Run ``check`` on ``examples`` (tried first, always), then on ``max_examples`` examples
    of ``strategy``; keep the last (= shrunk) failure. What the code under test raises
    fails the law (:func:`_no_exit`), a BaseException included; a Ctrl-C of the user stops
    the run."""
    uncompared = [0]  # examples the law had nothing to compare on (L.NOT_COMPARED)
    if spec.example_cap is not None:
        max_examples = min(max_examples, spec.example_cap)

    def counted(example):
        if check(example) is L.NOT_COMPARED:
            uncompared[0] += 1

    with _interrupts_told_apart() as own_interrupts:
        res = _run_law_guarded(spec, strategy, _no_exit(counted, own_interrupts), describe,
                               max_examples, seed, examples)
    why = _NOTHING_COMPARED.get(spec.name, _NOTHING_COMPARED[""])
    if res.status == "holds" and res.examples and uncompared[0] >= res.examples:
        # e.g. a rule returning NaN everywhere: NaN agrees with itself in any order and
        # after any shift, so the law compared nothing and must not read as holding
        res = dataclasses.replace(res, status="skipped", message=(
            f"nothing was compared on any of the {res.examples} examples: " + why))
    elif res.status == "holds" and uncompared[0]:
        # a law that held on a few examples only (the others compared nothing) says so
        res = dataclasses.replace(res, message=(
            f"compared on {res.examples - uncompared[0]} of them; on the other "
            f"{uncompared[0]} nothing was compared: {why}"))
    return res


def _run_law_guarded(spec: LawSpec, strategy, check: Callable[[Any], None],
                     describe: Callable[[Any], dict], max_examples: int, seed: int | None,
                     examples=()) -> LawResult:
    from hypothesis import example as explicit
    from hypothesis import given
    from hypothesis import seed as hseed

    examples = list(examples)
    failures: list[tuple[Any, BaseException]] = []
    count = [0]

    @_settings(max_examples, seed)
    @given(strategy)
    def prop(example):
        count[0] += 1
        try:
            check(example)
        except Exception as exc:  # the callable may crash on hostile input: that fails the law
            failures.append((example, exc))
            raise

    for case in reversed(examples):  # Hypothesis runs the last applied first
        prop = explicit(case)(prop)
    if seed is not None:
        prop = hseed(seed)(prop)
    started = time.perf_counter()
    try:
        prop()
    except Exception as exc:
        example, err = failures[-1] if failures else (None, exc)
        msg = err.message if isinstance(err, L.LawViolation) else describe_exception(err)
        fixed = example is not None and any(example is e for e in examples)
        if isinstance(err, L.LawViolation) and err.example is not None:
            example = err.example  # what the code under test was given, so that it reproduces
        ce = _jsonable(describe(example)) if example is not None else None
        if ce is not None and isinstance(err, L.LawViolation) and err.details:
            ce["violation"] = _jsonable(err.details)
        if ce is not None and fixed:
            ce["fixed_example"] = True  # one of the fixed examples, not a shrunk draw
        return LawResult(spec.name, spec.statement, spec.category, "fails", count[0], msg, ce,
                         time.perf_counter() - started)
    return LawResult(spec.name, spec.statement, spec.category, "holds", count[0], "", None,
                     time.perf_counter() - started)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (np.floating, float)):
        return float(x) if np.isfinite(x) else str(float(x))
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def _monna_specs(specs, min_n, pivot):
    """MoNNA's laws for the pivot named by ``--rule-option pivot=P``: every round has
    n > P and keeps row P honest (the guarantee needs a trusted pivot), and the pivot
    law measures from row P. With the default pivot 0 the laws are unchanged."""
    if isinstance(pivot, bool) or not isinstance(pivot, (int, np.integer)) or pivot < 0:
        raise ValueError(f"monna's pivot must be a row position ≥ 0, got {pivot!r}")
    pivot = int(pivot)
    if pivot == 0:
        return specs, min_n
    out = []
    for spec in specs:
        strategy = {**spec.strategy, "trusted": pivot} if "trusted" in spec.strategy else spec.strategy
        options = {**spec.options, "pivot": pivot} if spec.name == "monna_pivot_bound" else spec.options
        out.append(dataclasses.replace(spec, strategy=strategy, options=options))
    return out, max(min_n, pivot + 1)


def _cc_specs(specs, options):
    """Centered clipping's pull law for the τ and iterations named by ``--rule-option
    tau=T iterations=L`` (the bound is τ·Σ_B pᵢ, for one iteration; with more the law
    compares nothing), instead of the defaults τ = 100 and one iteration."""
    tau, iterations = options.get("tau", 100.0), options.get("iterations", 1)
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 < tau < np.inf:
        raise ValueError(f"cc's tau must be a finite number > 0, got {tau!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) \
            or iterations < 1:
        raise ValueError(f"cc's iterations must be an integer ≥ 1, got {iterations!r}")
    return [dataclasses.replace(spec, options={**spec.options, "tau": float(tau),
                                               "iterations": int(iterations)})
            if spec.name == "cc_byzantine_pull" else spec for spec in specs]


def _no_weights_law(spec: LawSpec, rule_fn, kw: dict, max_examples: int, seed) -> LawResult:
    """A law on weights, for a callable that returned none on the probe round
    (:func:`_exposes_weights`): skipped if it returns none on the law's fixed hostile rounds
    and its drawn ones either, and failed where it returns weights on one of them (a rule
    exposes its weights on every round or on none: weights given only away from the honest
    probe round, where they may be wrong, must not have their laws skipped)."""
    def check(case):
        out = L._outcome(rule_fn, case.features, case.n_samples, case.f, spec.name)
        if out.weights is None:
            return L.NOT_COMPARED
        raise L.LawViolation(spec.name, "the callable returned no weights on an honest probe "
                             "round but weights on this one: a rule exposes its weights on "
                             "every round or on none")

    res = _run_law(spec, S.byzantine_rounds(**kw), check, lambda c: c.describe(),
                   min(max_examples, INPUTS_DRAWN), seed, examples=S.hostile_examples(**kw))
    if res.status == "skipped":
        res = dataclasses.replace(res, message="the callable exposes no per-client weights")
    return res


def _exposes_weights(rule_fn, f_bound, min_n) -> bool:
    """Whether the callable returns weights, probed on a small honest round.

    An output the convention rules out (:class:`OutputError`: complex or string
    weights, the wrong shape) counts as exposing weights, so that the laws on
    weights run and report it: skipping them as "no weights" would leave a
    ``--law weights_sum_to_one`` run with nothing to say about weights that are
    wrong rather than absent."""
    n = max(min_n, 5)
    X = np.random.default_rng(0).normal(size=(n, 3))
    with _interrupts_told_apart() as own_interrupts:
        try:
            out = rule_fn(X, np.ones(n, dtype=np.int64), max(0, min(1, f_bound(n))))
        except OutputError:
            return True
        except _UserInterrupt:
            raise
        except KeyboardInterrupt:
            if not own_interrupts:
                raise
            return False
        except BaseException:  # the laws will report it; an exit must not end the run
            return False
    return isinstance(out, Outcome) and out.weights is not None


def _reference(rule: str, options: dict | None):
    """rfrs-ref's ``rule`` with ``options`` (its hyperparameters) as a rule under test."""
    from rfrs_ref.testing.adapters import rfrs

    try:
        return rfrs(rule, **dict(options or {}))
    except (TypeError, ValueError) as exc:
        raise AdapterError(f"rfrs-ref's {rule} {_refusal(exc)} {sorted(options or {})}: "
                           f"{exc}") from None


def _refusal(exc: Exception) -> str:
    """How a constructor refused options: an unknown keyword (TypeError) is one the entry
    does not take; a ValueError is a value it refuses (a boolean for a number, k < 0)."""
    return "does not take" if isinstance(exc, TypeError) else "refuses the value of"


def _variant(rule: str, options: dict | None) -> str:
    """Which of rfrs-ref's variants of ``rule`` the reference law compared with, and how to
    choose another (one clause of the failure message)."""
    from rfrs_ref.aggregate import RULES

    cls = RULES.get(rule) if rule in RULES else None
    given = dict(options or {})
    hypers, helps = {}, {}
    if cls is not None:
        import dataclasses

        hypers = {f.name: given.get(f.name, f.default) for f in dataclasses.fields(cls)
                  if f.name != "fallback" and f.default is not dataclasses.MISSING}
        helps = {f.name: f.metadata.get("help") for f in dataclasses.fields(cls)}
    said = "; ".join(f"{k}={v!r}" + (f": {helps[k]}" if helps.get(k) else "")
                     for k, v in hypers.items()) or "its defaults"
    return (f"compared with rfrs-ref's {rule} ({said}); a rule of another variant names its "
            "options with --rule-option KEY=VALUE (reference_options in Python), e.g. k=1 for "
            "classic Krum (docs/conformance.md)")


def run_rule_conformance(rule: str, rule_fn: Callable[[np.ndarray, np.ndarray, int], Outcome], *,
                         max_examples: int = 50, seed: int | None = None,
                         laws: list[str] | None = None, max_n: int = 13, max_D: int = 12,
                         dtypes=(np.float32, np.float64),
                         reference_options: dict | None = None) -> list[LawResult]:
    """Run the laws of ``rule`` (a key of :data:`RULE_LAWS`) on ``rule_fn``.

    Args:
        rule: which rule the callable implements (chooses the laws and the
            precondition on n and f the examples respect).
        rule_fn: ``rule_fn(features, n_samples, f) -> Outcome`` (an adapter's output).
        max_examples: examples per law (before shrinking).
        seed: None for derandomised runs (the same examples every time), else
            Hypothesis's seed.
        laws: run only these laws (names), default all that apply.
        max_n, max_D, dtypes: the size of the drawn rounds.
        reference_options: the hyperparameters of rfrs-ref's rule that ``reference_rule``
            compares with (e.g. ``{"k": 1}`` for classic Krum), default its defaults.

    Returns:
        One :class:`LawResult` per law, in :data:`RULE_LAWS` order.
    """
    if rule not in RULE_LAWS:
        raise ValueError(f"no laws are defined for rule {rule!r}; choose one of: {', '.join(RULE_LAWS)}")
    f_bound, min_n, specs = RULE_LAWS[rule]
    _check_law_names(laws, specs, f"rule {rule!r}")
    if rule == "monna":
        specs, min_n = _monna_specs(specs, min_n, (reference_options or {}).get("pivot", 0))
    if rule == "cc":
        specs = _cc_specs(specs, reference_options or {})
    has_weights = _exposes_weights(rule_fn, f_bound, min_n)
    out = []
    for spec in specs:
        if laws is not None and spec.name not in laws:
            continue
        kw = dict(min_n=min_n, max_n=max(max_n, min_n), max_f=f_bound, max_D=max_D, dtypes=dtypes)
        kw.update(spec.strategy)
        if spec.needs_weights and not has_weights:
            out.append(_no_weights_law(spec, rule_fn, kw, max_examples, seed))
            continue
        checker = getattr(L, spec.checker or spec.name)
        opts = spec.options
        examples = S.hostile_examples(**kw) + _large(spec, LARGE_RULE_ROUNDS, rule, **kw)
        if spec.name in ("reference_rule", "permutation_invariance", "translation_equivariance"):
            # the permutation law measures its rounding on rfrs-ref's aggregate, never the
            # candidate's; it and the translation law compare the candidate with itself, and
            # need rfrs-ref's aggregate to tell a round where it compared nothing (NaN = NaN)
            ref = _reference(rule, reference_options)
            opts = {**opts, "reference": lambda case, ref=ref: ref}  # an option's callable is per example
        if spec.name == "reference_rule":
            examples = S.tie_examples(**kw) + examples

        def check(case, checker=checker, opts=opts, name=spec.name):
            try:
                return checker(rule_fn, case, **{k: (v(case) if callable(v) else v) for k, v in opts.items()})
            except L.LawViolation as exc:
                if name != "reference_rule":
                    raise
                # a correct rule of another variant (classic Krum against rfrs-ref's
                # multi-Krum) fails here: say which variant it was held to, and how to name its own
                raise L.LawViolation(exc.law, f"{exc.message}; {_variant(rule, reference_options)}",
                                     example=exc.example, **exc.details) from None

        out.append(_run_law(spec, S.byzantine_rounds(**kw), check, lambda c: c.describe(),
                            max_examples, seed, examples=examples))
    return out


# -- optimisers ---------------------------------------------------------------------------------

def _copied(x):
    if isinstance(x, dict):
        return {k: _copied(v) for k, v in x.items()}
    if isinstance(x, np.ndarray):
        return x.copy()
    return x


class _Isolated:
    """The optimiser under test, called on copies of its arguments.

    The laws compare what it returns with the example's state and gradient; an
    object that overwrote them (zeroed the gradient it was given, then recovered
    zeros) would otherwise agree with whatever it left there. Every other
    attribute (hyperparameters, ``name``) is the object's own.
    """

    def __init__(self, obj) -> None:
        self._obj = obj

    def __getattr__(self, name):
        return getattr(self._obj, name)

    def client_rule(self, state, g, t):
        return self._obj.client_rule(_copied(state), _copied(g), t)

    def recover(self, state, upload, t):
        return self._obj.recover(_copied(state), _copied(upload), t)


def _factory_takes(factory, names) -> bool:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return any(p.kind == p.VAR_KEYWORD for p in params.values()) or all(n in params for n in names)


def run_optimizer_conformance(kind: str, obj, *, max_examples: int = 50, seed: int | None = None,
                              laws: list[str] | None = None,
                              camouflage: Callable | None = None) -> list[LawResult]:
    """Run the optimiser laws of ``kind`` on ``obj``.

    ``obj`` is an optimiser object (``client_rule(state, g, t)``, ``recover(state,
    upload, t)``, hyperparameter attributes named as in docs/optimizers.md) or a factory
    (a class) that builds one from those hyperparameters as keyword arguments;
    with a factory, hyperparameters are drawn, else the object's are used.
    ``camouflage(state, g, t, optimizer) -> g̃`` is the attack under test for
    ``camouflage_same_theta`` (default: rfrs-ref's).
    """
    from rfrs_ref.optim import OPTIMIZERS
    from rfrs_ref.params import hyperparameters, values

    if kind not in OPTIMIZER_LAWS:
        raise ValueError(f"no laws are defined for optimiser {kind!r}; choose one of: "
                         f"{', '.join(OPTIMIZER_LAWS)}")
    _check_law_names(laws, OPTIMIZER_LAWS[kind], f"optimiser {kind!r}")
    ref_cls = OPTIMIZERS.get(kind)
    names = [h.name for h in hyperparameters(ref_cls)]
    is_factory = isinstance(obj, type) or (callable(obj) and not hasattr(obj, "client_rule"))
    drawn = is_factory and _factory_takes(obj, names)
    if drawn:
        fixed = None

        def under_test(case):
            return _Isolated(obj(**values(case.optimizer)))
    else:
        try:
            inst = obj() if is_factory else obj
            fixed = ref_cls(**{n: getattr(inst, n) for n in names if hasattr(inst, n)})
        except Exception as exc:  # the object is input: its hyperparameters may be anything
            raise AdapterError(f"cannot take {kind} hyperparameters ({', '.join(names)}) from "
                               f"{describe_object(obj)}: {describe_exception(exc)}") from None

        def under_test(case):
            return _Isolated(inst)
    own_camouflage = camouflage is None
    if own_camouflage:
        from rfrs_ref.attack.camouflage import camouflage_gradient

        def camouflage(state, g, t, opt):
            # as the attack runs in a round: g̃ in g's dtype, θ to the rounding of the uploads
            return camouflage_gradient(state["m"], state["v"], state["theta"], g, beta1=opt.beta1,
                                       beta2=opt.beta2, lr_t=L.adam_lr_t(opt, t), eps=opt.eps,
                                       upload_dtype=L.camouflage_upload_dtype(opt, state, g, t))[0]

    results = []
    for spec in OPTIMIZER_LAWS[kind]:
        if laws is not None and spec.name not in laws:
            continue
        if spec.name == "lemma2":
            strat = S.gradient_sequences()
            edges = S.sequence_edge_cases() + S.sequence_large_cases()
            base = fixed if fixed is not None else ref_cls()

            def check(seq, base=base):
                return L.lemma2(_Isolated(obj(**values(base))) if drawn else under_test(None),
                                seq, kind)

            def describe(seq):
                return seq.describe()
        else:
            strat = S.pair_cases(kind, optimizer=fixed)
            edges = (S.optimizer_edge_cases(kind, optimizer=fixed)
                     + S.optimizer_large_cases(kind, optimizer=fixed))
            name = spec.name

            # each law's return is passed on: L.NOT_COMPARED on every example (rfrs-ref's own
            # update overflowing with these hyperparameters) must not read as holding
            def check(case, name=name):
                target = under_test(case)
                if name == "recovery_exact":
                    return L.recovery_exact(target, case, reference=kind)
                if name == "inputs_unchanged":
                    # the object itself, not the copies _Isolated hands it
                    return L.inputs_unchanged(target._obj, case)
                if name == "camouflage_same_theta":
                    # the law runs the attack against the example's Adam (rfrs-ref's, with
                    # the hyperparameters the candidate claims): rfrs-ref's attack reads them
                    # there (an Adam under test need not name them beta1, ...), an attack
                    # under test is handed the candidate
                    attacked = case.optimizer if own_camouflage else target
                    return L.camouflage_same_theta(
                        lambda s, g, t, o: camouflage(s, g, t, attacked), case)
                return getattr(L, name)(target, case)

            def describe(case):
                return case.describe()
        results.append(_run_law(spec, strat, check, describe, max_examples, seed, examples=edges))
    return results


# -- pre-aggregators ----------------------------------------------------------------------------

_REF_PRE = LawSpec("reference_pre", "rows = rfrs-ref's pre-aggregator's on the same round", "convention")
#: NNM and bucketing mix with nᵢ-weighted means: reference_pre pins the mixing itself on
#: rounds of equal nᵢ, weighted_mixing the weighting on rounds of unequal nᵢ (a library
#: without nᵢ, as ByzFL, holds the first and fails the second: a convention, documented)
_WEIGHTED = LawSpec("weighted_mixing", "mixed rows are nᵢ-weighted means (unequal nᵢ)", "convention",
                    checker="reference_pre")
_PERM_PRE = LawSpec("permutation_equivariance", "reordering the clients reorders the mixed rows",
                    checker="pre_permutation_equivariance", strategy={"distinct": True})
_INPUTS_PRE = LawSpec("inputs_unchanged", "features and nᵢ unchanged byte for byte; the mixed rows "
                      "are a new array", "convention", checker="pre_inputs_unchanged",
                      example_cap=INPUTS_DRAWN)

#: pre-aggregator -> (largest f for n, smallest n, laws). f < n/2 throughout: the guarantees
#: (NNM's honest neighbours, ARC's finite threshold) assume an honest majority
PRE_LAWS: dict[str, tuple[Callable[[int], int], int, list[LawSpec]]] = {
    "nnm": (lambda n: (n - 1) // 2, 1, [
        dataclasses.replace(_REF_PRE, statement=_REF_PRE.statement + " (equal nᵢ)",
                            strategy={"equal_weights": True}),
        _WEIGHTED,
        LawSpec("nnm_honest_bound", "every honest row stays finite and within the honest diameter Δ"),
        _PERM_PRE,
    ]),
    "bucketing": (lambda n: (n - 1) // 2, 1, [
        dataclasses.replace(_REF_PRE, statement="rows = means of a partition into buckets of s, the "
                            "last holding the rest (equal nᵢ)", strategy={"equal_weights": True}),
        _WEIGHTED,
        # every example calls the candidate until two partitions show (up to ~40 times): its
        # drawn examples are capped as inputs_unchanged's, after a fixed round
        LawSpec("bucketing_shuffles", "called again on the same round, it cuts other buckets "
                "(a random permutation per call)", strategy={"byzantine": False, "distinct": True},
                example_cap=INPUTS_DRAWN),
    ]),
    "clip": (lambda n: (n - 1) // 2, 1, [
        _REF_PRE,
        LawSpec("clip_norm_bound", "finite rows scaled by λ ∈ [0, 1] to norm ≤ C; rows within C unchanged"),
        _PERM_PRE,
    ]),
    "arc": (lambda n: (n - 1) // 2, 1, [
        _REF_PRE,
        LawSpec("arc_clipping", "at most k = ⌊2f(n − f)/n⌋ rows change, none grows, norms ≤ τ"),
        _PERM_PRE,
    ]),
}
for _pre, (_fb, _mn, _specs) in PRE_LAWS.items():
    _specs.append(_INPUTS_PRE)


def _rfrs_instance(registry, name: str, options: dict | None, what: str):
    """rfrs-ref's ``name`` of ``registry`` with ``options`` (its hyperparameters)."""
    cls = registry.get(name)
    try:
        return cls(**dict(options or {}))
    except (TypeError, ValueError) as exc:
        raise AdapterError(f"rfrs-ref's {what} {name} {_refusal(exc)} {dict(options or {})}: "
                           f"{exc}") from None


def _variant_of(obj, name: str, flag: str = "--rule-option") -> str:
    """Which of rfrs-ref's variants the reference law compared with (a clause of the
    failure message), from the hyperparameters of ``obj`` (a frozen dataclass)."""
    from rfrs_ref.params import hyperparameters

    hs = hyperparameters(type(obj))
    said = "; ".join(f"{h.name}={getattr(obj, h.name)!r}" + (f": {h.help}" if getattr(h, "help", "") else "")
                     for h in hs) or "no hyperparameters"
    return (f"compared with rfrs-ref's {name} ({said}); another variant names its options with "
            f"{flag} KEY=VALUE (reference_options in Python; docs/conformance.md)")


def run_pre_conformance(pre: str, pre_fn: Callable, *, max_examples: int = 50,
                        seed: int | None = None, laws: list[str] | None = None,
                        max_n: int = 13, max_D: int = 12, dtypes=(np.float32, np.float64),
                        reference_options: dict | None = None) -> list[LawResult]:
    """Run the laws of pre-aggregator ``pre`` (a key of :data:`PRE_LAWS`) on ``pre_fn``.

    Args:
        pre: which pre-aggregator the callable implements.
        pre_fn: ``pre_fn(features, n_samples, f) -> (n′, D)`` (an adapter's output,
            :data:`rfrs_ref.testing.adapters.PRE_ADAPTERS`).
        reference_options: the hyperparameters of rfrs-ref's pre-aggregator the laws
            compare with (``clip_norm`` for clip, ``bucket_size`` for bucketing), default
            its defaults.
        max_examples, seed, laws, max_n, max_D, dtypes: as :func:`run_rule_conformance`.

    Returns:
        One :class:`LawResult` per law, in :data:`PRE_LAWS` order.

    Raises:
        ValueError: an unknown pre-aggregator or law. AdapterError: options rfrs-ref's
            pre-aggregator does not take.
    """
    from rfrs_ref.aggregate.pre import PRE

    if pre not in PRE_LAWS:
        raise ValueError(f"no laws are defined for pre-aggregator {pre!r}; choose one of: "
                         f"{', '.join(PRE_LAWS)}")
    f_bound, min_n, specs = PRE_LAWS[pre]
    _check_law_names(laws, specs, f"pre-aggregator {pre!r}")
    ref = _rfrs_instance(PRE, pre, reference_options, "pre-aggregator")
    out = []
    for spec in specs:
        if laws is not None and spec.name not in laws:
            continue
        kw = dict(min_n=min_n, max_n=max(max_n, min_n), max_f=f_bound, max_D=max_D, dtypes=dtypes)
        kw.update(spec.strategy)
        checker = getattr(L, spec.checker or spec.name)

        def check(case, checker=checker, name=spec.name):
            try:
                return checker(pre_fn, case, reference=ref)
            except L.LawViolation as exc:
                if name not in ("reference_pre", "weighted_mixing"):
                    raise
                raise L.LawViolation(name, f"{exc.message}; {_variant_of(ref, pre)}",
                                     example=exc.example, **exc.details) from None

        fixed = (_shuffle_examples(int(ref.bucket_size), dtypes) if spec.name == "bucketing_shuffles"
                 else S.hostile_examples(**kw) + _large(spec, LARGE_PRE_ROUNDS, pre, **kw))
        out.append(_run_law(spec, S.byzantine_rounds(**kw), check, lambda c: c.describe(),
                            max_examples, seed, examples=fixed))
    return out


def _shuffle_examples(s: int, dtypes) -> list:
    """The fixed round bucketing_shuffles tries first: honest rows in general position, nᵢ =
    1, …, n, with more than one partition into buckets of s (n = 9, or s + 1 for s > 4), D
    = 3, in float64 (or the first dtype drawn); none for s = 1 (a single partition)."""
    if s == 1:
        return []
    n = 9 if s <= 4 else s + 1
    rng = np.random.default_rng(20204)
    dtype = np.float64 if any(np.dtype(d) == np.float64 for d in dtypes) else np.dtype(dtypes[0])
    X = (rng.normal(size=(n, 3)) + np.arange(n)[:, None]).astype(dtype)
    return [S.RoundCase(X, np.ones(n, dtype=bool), 1, np.arange(1, n + 1, dtype=np.int64),
                        rng.permutation(n), rng.normal(size=3), ())]


# -- attacks ------------------------------------------------------------------------------------

_REF_ATTACK = LawSpec("reference_attack", "vector = rfrs-ref's attack on the same vectors", "convention")
_PERM_ATTACK = LawSpec("permutation_invariance", "the order of the vectors does not matter",
                       checker="attack_permutation_invariance")
_INPUTS_ATTACK = LawSpec("inputs_unchanged", "the vectors unchanged byte for byte; the Byzantine "
                         "vector is a new array", "convention", checker="attack_inputs_unchanged",
                         example_cap=INPUTS_DRAWN)

#: attack -> laws. The vectors are k ≥ 1 gradients (the Byzantine clients' own for IPM and
#: ALIE, the honest ones for mimic), drawn as honest rounds, after fixed rounds with one NaN,
#: ±inf or 1e38 vector (hostile input is input) and single vectors
ATTACK_LAWS: dict[str, list[LawSpec]] = {
    "ipm": [_REF_ATTACK, LawSpec("ipm_direction", "vector = −ϵ·mean for one ϵ"), _PERM_ATTACK],
    "alie": [_REF_ATTACK, LawSpec("alie_form", "vector = μ − z·σ (ddof 1) for one z; one vector: μ"),
             _PERM_ATTACK],
    "mimic": [_REF_ATTACK, LawSpec("mimic_copy", "vector = one of the vectors, bit for bit")],
    "inf": [_REF_ATTACK, LawSpec("inf_nonfinite", "every coordinate non-finite")],
}
for _specs in ATTACK_LAWS.values():
    _specs.append(_INPUTS_ATTACK)


def _attack_gain(attack) -> float:
    """The factor of reference_attack's tolerance: |ϵ| (IPM), 3|z| (ALIE: σ ≤ 3·max|x|)."""
    if attack.name == "ipm":
        return abs(float(attack.epsilon))
    if attack.name == "alie":
        return 3.0 * abs(float(attack.z))
    return 0.0


def attack_examples(max_D: int = 8, dtypes=(np.float32, np.float64)) -> list:
    """The rounds every attack law tries first: one vector that is NaN, ±inf or 1e38 among
    five (:func:`strategies.hostile_examples`; the vectors are every row), that vector
    last and again first, a single vector in each dtype (one vector has no spread: ALIE's
    σ = 0). The laws of :data:`LARGE_LAWS` then try the large rounds of
    :data:`strategies.LARGE_ROUNDS` as plain vectors (:func:`attack_large_examples`).

    The hostile vector sits at both ends because mimic copies the vector at an index
    (rfrs-ref's default 0, the last one when the index reaches past it): with it last
    only, the copied vector of the default was always finite, and a mimic that copied the
    first finite vector, or zeroed the non-finite values of the one it copied, held every
    law."""
    out = S.hostile_examples(min_n=5, max_n=9, max_D=max_D, dtypes=dtypes)
    rng = np.random.default_rng(20203)
    for dtype in dtypes:
        X = rng.normal(size=(1, 3)).astype(dtype)
        out.append(S.RoundCase(X, np.ones(1, dtype=bool), 0, np.ones(1, dtype=np.int64),
                               np.zeros(1, dtype=np.int64), np.zeros(3), ()))
    return out


def attack_large_examples(dtypes=(np.float32, np.float64)) -> list:
    """The large rounds of :data:`strategies.LARGE_ROUNDS` as plain vectors, every one
    honest (k = 40 and 33; D = 257 and 1031), far beyond the drawn k ≤ 9 and D ≤ 8."""
    return S.large_examples(min_n=1, dtypes=dtypes, byzantine=False)


def _describe_vectors(case) -> dict:
    vectors = case.describe()["features"]  # a large fixed round is named, not listed
    return {"k": case.n, "D": case.D, "dtype": str(case.features.dtype), "vectors": vectors}


def run_attack_conformance(attack: str, attack_fn: Callable, *, max_examples: int = 50,
                           seed: int | None = None, laws: list[str] | None = None,
                           max_k: int = 9, max_D: int = 8, dtypes=(np.float32, np.float64),
                           reference_options: dict | None = None) -> list[LawResult]:
    """Run the laws of attack ``attack`` (a key of :data:`ATTACK_LAWS`) on ``attack_fn``.

    Args:
        attack: which attack the callable implements.
        attack_fn: ``attack_fn(vectors) -> (D,)`` (an adapter's output,
            :data:`rfrs_ref.testing.adapters.ATTACK_ADAPTERS`).
        reference_options: the hyperparameters of rfrs-ref's attack that
            ``reference_attack`` compares with (``epsilon`` for IPM, ``z`` for ALIE, which
            must be given: its default 0 derives z from a round's n, ``index`` for mimic,
            ``value`` for inf), default its defaults.
        max_k: the most vectors drawn. max_examples, seed, laws, max_D, dtypes: as
            :func:`run_rule_conformance`.

    Returns:
        One :class:`LawResult` per law, in :data:`ATTACK_LAWS` order.

    Raises:
        ValueError: an unknown attack or law. AdapterError: options rfrs-ref's attack does
            not take, or ALIE without z.
    """
    from rfrs_ref.attack import ATTACKS
    from rfrs_ref.testing.adapters import rfrs_attack

    if attack not in ATTACK_LAWS:
        raise ValueError(f"no laws are defined for attack {attack!r}; choose one of: "
                         f"{', '.join(ATTACK_LAWS)}")
    specs = ATTACK_LAWS[attack]
    _check_law_names(laws, specs, f"attack {attack!r}")
    inst = _rfrs_instance(ATTACKS, attack, reference_options, "attack")
    ref = rfrs_attack(inst)
    gain = _attack_gain(inst)
    strategy = S.byzantine_rounds(min_n=1, max_n=max_k, max_D=max_D, dtypes=dtypes, byzantine=False)
    out = []
    for spec in specs:
        if laws is not None and spec.name not in laws:
            continue
        checker = getattr(L, spec.checker or spec.name)
        opts: dict = {}
        if spec.name in ("reference_attack", "permutation_invariance"):
            opts["gain"] = gain
        if spec.name == "reference_attack" and attack == "mimic":
            opts["exact"] = True

        def check(case, checker=checker, opts=opts, name=spec.name):
            try:
                return checker(attack_fn, case, reference=ref, **opts)
            except L.LawViolation as exc:
                if name != "reference_attack":
                    raise
                raise L.LawViolation(name, f"{exc.message}; {_variant_of(inst, attack)}",
                                     example=exc.example, **exc.details) from None

        large = attack_large_examples(dtypes) if spec.name in LARGE_LAWS else []
        out.append(_run_law(spec, strategy, check, _describe_vectors, max_examples, seed,
                            examples=attack_examples(max_D, dtypes) + large))
    return out


def format_results(results: list[LawResult], title: str) -> str:
    """A plain-text report: one line per law, and the counterexample of each failure."""
    import json

    lines = [title]
    width = max((len(r.law) for r in results), default=10)
    for r in results:
        mark = {"holds": "holds", "fails": "FAILS", "skipped": "skipped"}[r.status]
        extra = (f"({r.examples} examples{'; ' + r.message if r.message else ''})"
                 if r.status == "holds" else r.message)
        lines.append(f"  {r.law:<{width}}  {mark:<7}  {r.statement}  {extra}".rstrip())
    for r in results:
        if r.status == "fails" and r.counterexample is not None:
            lines.append("")
            how = ("a fixed example" if (r.counterexample or {}).get("fixed_example")
                   else "shrunk by Hypothesis")
            lines.append(f"counterexample for {r.law} ({how}):")
            lines.append("  " + r.message)
            lines.append("  " + json.dumps(r.counterexample, ensure_ascii=False, allow_nan=False))
    return "\n".join(lines)


__all__ = [
    "ATTACK_LAWS",
    "OPTIMIZER_LAWS",
    "PRE_LAWS",
    "RULE_LAWS",
    "LawResult",
    "LawSpec",
    "attack_examples",
    "attack_large_examples",
    "format_results",
    "run_attack_conformance",
    "run_optimizer_conformance",
    "run_pre_conformance",
    "run_rule_conformance",
]
