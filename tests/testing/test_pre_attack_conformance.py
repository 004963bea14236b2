"""The conformance suite of pre-aggregators and attacks: rfrs-ref's own pass every law,
and each law catches a deliberately wrong implementation (docs/conformance.md)."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import numpy as np
import pytest
from click.testing import CliRunner

from rfrs_ref.aggregate.pre import PRE
from rfrs_ref.attack import ATTACKS
from rfrs_ref.testing import adapters, laws, strategies
from rfrs_ref.testing.conformance import (
    ATTACK_LAWS,
    PRE_LAWS,
    attack_examples,
    format_results,
    run_attack_conformance,
    run_pre_conformance,
)

EXAMPLES = 15


def _status(results) -> dict[str, str]:
    return {r.law: r.status for r in results}


def _pre(name, fn, law=None, **kw):
    return _status(run_pre_conformance(name, fn, max_examples=EXAMPLES,
                                       laws=None if law is None else [law], **kw))


def _attack(name, fn, law=None, **kw):
    return _status(run_attack_conformance(name, fn, max_examples=EXAMPLES,
                                          laws=None if law is None else [law], **kw))


# -- rfrs-ref's own code passes -----------------------------------------------------------------

def test_every_registered_pre_aggregator_has_laws():
    assert list(PRE_LAWS) == PRE.names()
    # the attacks rfrs-ref shares with ByzFL 0.0.11 (Inf, Mimic, IPM, ALIE); camouflage is
    # checked through --optimizer adam, the optimal attacks need the server's rule
    assert set(ATTACK_LAWS) == {"ipm", "alie", "mimic", "inf"} <= set(ATTACKS.names())


@pytest.mark.parametrize("name", list(PRE_LAWS))
def test_our_pre_aggregators_obey_every_law(name):
    st = _pre(name, adapters.rfrs_pre(name))
    assert all(v == "holds" for v in st.values()), st


@pytest.mark.parametrize("name", list(PRE_LAWS))
def test_our_pre_aggregators_obey_every_law_on_numba(name):
    """The fixed rounds (the hostile row last and first, large rounds) and one drawn example,
    mixed by the numba kernels."""
    st = _status(run_pre_conformance(name, adapters.rfrs_pre(name, backend="numba"),
                                     max_examples=1))
    assert all(v == "holds" for v in st.values()), st


@pytest.mark.parametrize("options", [{"clip_norm": 0.01}, {"clip_norm": 100.0}])
def test_clipping_with_another_threshold_is_held_to_that_threshold(options):
    assert all(v == "holds" for v in _pre("clip", adapters.rfrs_pre("clip", **options),
                                          reference_options=options).values())
    # the same clipping against rfrs-ref's default C = 1 fails
    st = _pre("clip", adapters.rfrs_pre("clip", **options), law="clip_norm_bound")
    assert st == {"clip_norm_bound": "fails"}


@pytest.mark.parametrize("s", [1, 3, 20])
def test_bucketing_of_any_size_is_a_partition(s):
    st = _pre("bucketing", adapters.rfrs_pre("bucketing", bucket_size=s),
              reference_options={"bucket_size": s})
    # buckets of one row are one partition, in any order: nothing to shuffle
    shuffles = st.pop("bucketing_shuffles")
    assert shuffles == ("skipped" if s == 1 else "holds")
    assert all(v == "holds" for v in st.values()), st


@pytest.mark.parametrize("name, options", [("ipm", {}), ("ipm", {"epsilon": -3.0}),
                                           ("alie", {"z": 1.5}), ("alie", {"z": -0.7, "ddof": 0}),
                                           ("mimic", {}), ("mimic", {"index": 2}),
                                           ("inf", {}), ("inf", {"value": "nan"})])
def test_our_attacks_obey_every_law(name, options):
    st = _attack(name, adapters.rfrs_attack(name, **options), reference_options=options)
    if options.get("ddof") == 0:  # the population σ is μ − z'·σ₁ with another z': the form holds
        assert st["alie_form"] == "holds"
    assert all(v == "holds" for v in st.values()), st


def test_alie_needs_its_z():
    with pytest.raises(adapters.AdapterError, match="give z"):
        adapters.rfrs_attack("alie")
    with pytest.raises(adapters.AdapterError, match="give z"):
        run_attack_conformance("alie", adapters.rfrs_attack("alie", z=1.0))
    with pytest.raises(adapters.AdapterError, match="reads the server's rule"):
        adapters.rfrs_attack("opt-ipm")
    with pytest.raises(adapters.AdapterError, match="--optimizer adam"):
        adapters.rfrs_attack("camouflage")


# -- each law catches a wrong implementation ------------------------------------------------------

def _nnm(X, ns, f, k=None, weighted=True):
    """NNM with k neighbours (default n − f), nᵢ-weighted or plain; non-finite rows last."""
    X64 = np.asarray(X, dtype=np.float64)
    n = X64.shape[0]
    k = n - f if k is None else k
    with np.errstate(all="ignore"):
        d = ((X64[:, None, :] - X64[None, :, :]) ** 2).sum(axis=-1)
    d = np.where(np.isnan(d), np.inf, d)
    out = np.empty_like(X64)
    for i in range(n):
        di = d[i].copy()
        di[i] = -1.0
        nb = np.argsort(di, kind="stable")[:k]
        w = ns[nb].astype(np.float64) if weighted else np.ones(nb.size)
        with np.errstate(all="ignore"):
            out[i] = w @ X64[nb] / w.sum()
    return out


def nnm_with_one_neighbour_fewer(X, ns, f):
    return _nnm(X, ns, f, k=max(1, X.shape[0] - f - 1))


def nnm_unweighted(X, ns, f):
    """ByzFL's convention: the plain mean of the neighbours."""
    return _nnm(X, ns, f, weighted=False)


def nnm_of_every_row(X, ns, f):
    """Mixes every row into every row: the mean, which a 1e38 or NaN row carries everywhere."""
    return _nnm(X, ns, 0)


def nnm_by_position(X, ns, f):
    """Each row mixed with the rows that follow it (cyclically): depends on the order."""
    n = X.shape[0]
    X64 = np.asarray(X, dtype=np.float64)
    idx = (np.arange(n)[:, None] + np.arange(n - f)[None, :]) % n
    with np.errstate(all="ignore"):
        return X64[idx].mean(axis=1)


def bucketing_sliding(X, ns, f, s=2):
    """Overlapping 'buckets' (row b with row b + 1): no partition."""
    n = X.shape[0]
    X64 = np.asarray(X, dtype=np.float64)
    rows = -(-n // s)
    with np.errstate(all="ignore"):
        return np.array([X64[[b, (b + 1) % n]].mean(axis=0) for b in range(rows)])


def bucketing_in_order(X, ns, f, s=2):
    """Buckets of consecutive rows, never shuffled: right on every single call (a partition,
    weighted means), but f Byzantine clients at chosen positions spoil f buckets every
    round."""
    X64 = X.astype(np.float64)
    w = ns.astype(np.float64)
    with np.errstate(all="ignore"):
        rows = [w[b:b + s] @ X64[b:b + s] / w[b:b + s].sum() for b in range(0, X.shape[0], s)]
    return np.array(rows).astype(X.dtype)


def test_a_bucketing_that_never_shuffles_fails():
    """Consecutive buckets are a partition with the right means on every call, and held
    every law of bucketing; called again on the same round they never change."""
    st = _pre("bucketing", adapters.vector_pre(bucketing_in_order))
    assert st == {"reference_pre": "holds", "weighted_mixing": "holds",
                  "bucketing_shuffles": "fails", "inputs_unchanged": "holds"}, st
    # a fresh generator seeded alike on every call is no shuffle either
    def same_seed(X, ns, f):
        p = np.random.default_rng(0).permutation(X.shape[0])
        return bucketing_in_order(X[p], ns[p], f)

    assert _pre("bucketing", adapters.vector_pre(same_seed), law="bucketing_shuffles") == {
        "bucketing_shuffles": "fails"}
    # plain means (ByzFL's convention, which weighted_mixing reports) are told apart too:
    # in order, they fail; shuffled by a generator that moves, they hold
    assert _pre("bucketing", adapters.vector_pre(
        lambda X, ns, f: bucketing_in_order(X, np.ones_like(ns), f)),
        law="bucketing_shuffles") == {"bucketing_shuffles": "fails"}
    moving = np.random.default_rng(7)

    def plain_shuffled(X, ns, f):
        p = moving.permutation(X.shape[0])
        return bucketing_in_order(X[p], np.ones_like(ns), f)

    assert _pre("bucketing", adapters.vector_pre(plain_shuffled),
                law="bucketing_shuffles") == {"bucketing_shuffles": "holds"}


def bucketing_unweighted(X, ns, f, s=2):
    n = X.shape[0]
    perm = np.random.default_rng(1).permutation(n)
    X64 = np.asarray(X, dtype=np.float64)
    with np.errstate(all="ignore"):
        return np.array([X64[perm[b:b + s]].mean(axis=0) for b in range(0, n, s)])


def clip_coordinatewise(X, ns, f, c=1.0):
    """Clips every coordinate to [−C, C]: not a scaling of the row."""
    return np.clip(np.asarray(X, dtype=np.float64), -c, c)


def clip_skipping_row_zero(X, ns, f, c=1.0):
    out = np.array(X, dtype=np.float64, copy=True)
    with np.errstate(all="ignore"):
        for i in range(1, out.shape[0]):
            norm = np.linalg.norm(out[i])
            if norm > c:
                out[i] *= c / norm
    return out


def arc_clipping_one_more(X, ns, f):
    """Clips k + 1 rows to the (k + 2)-th largest norm."""
    out = np.array(X, dtype=np.float64, copy=True)
    n = out.shape[0]
    k = min(n - 1, (2 * f * (n - f)) // n + 1)
    with np.errstate(all="ignore"):
        norms = np.linalg.norm(out, axis=1)
    key = np.where(np.isnan(norms), np.inf, norms)
    order = np.lexsort((np.arange(n), key))
    tau = key[order[n - k - 1]]
    with np.errstate(all="ignore"):
        for i in order[n - k:]:
            if np.isfinite(norms[i]) and norms[i] > tau:
                out[i] *= tau / norms[i]
    return out


def _example(name: str):
    path = pathlib.Path(__file__).parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, fn, law", [
    ("nnm", nnm_with_one_neighbour_fewer, "reference_pre"),
    ("nnm", nnm_unweighted, "weighted_mixing"),
    ("nnm", nnm_of_every_row, "nnm_honest_bound"),
    ("nnm", nnm_by_position, "permutation_equivariance"),
    ("bucketing", bucketing_sliding, "reference_pre"),
    ("bucketing", bucketing_unweighted, "weighted_mixing"),
    ("bucketing", bucketing_in_order, "bucketing_shuffles"),
    ("clip", clip_coordinatewise, "reference_pre"),
    ("clip", clip_coordinatewise, "clip_norm_bound"),
    ("clip", clip_skipping_row_zero, "permutation_equivariance"),
    ("arc", arc_clipping_one_more, "reference_pre"),
    ("arc", arc_clipping_one_more, "arc_clipping"),
    ("arc", "wrong_arc", "permutation_equivariance"),
])
def test_each_pre_aggregator_law_catches_a_wrong_implementation(name, fn, law):
    if isinstance(fn, str):
        fn = _example(fn).arc
    assert _pre(name, adapters.vector_pre(fn), law=law) == {law: "fails"}


def _zeroing_nonfinite_rows(pre):
    """rfrs-ref's pre-aggregator, with every non-finite row then replaced by zeros."""
    def call(X, ns, f):
        out = np.asarray(pre(X, ns, f), dtype=np.float64).copy()
        out[~np.isfinite(out).all(axis=1)] = 0.0
        return out
    return call


@pytest.mark.parametrize("name", ["nnm", "clip", "arc"])
def test_a_pre_aggregator_that_makes_a_hostile_row_finite_fails(name):
    """rfrs-ref leaves a non-finite row non-finite (the rule's to treat); reference_pre did
    not compare such a row at all, so a pre-aggregator that turned a NaN row into zeros (a
    Byzantine client at the origin, which the rule then counts) held every law."""
    fn = adapters.vector_pre(_zeroing_nonfinite_rows(adapters.rfrs_pre(name)))
    res = run_pre_conformance(name, fn, max_examples=EXAMPLES)
    st = {r.law: r for r in res}
    for law in ("reference_pre", "weighted_mixing"):  # one checker, two kinds of round
        if law in st:
            assert st[law].status == "fails", st[law]
            assert "non-finite there" in st[law].message
    assert all(r.status == "holds" for r in res
               if r.law not in ("reference_pre", "weighted_mixing")), _status(res)


@pytest.mark.parametrize("name", ["clip", "arc"])
def test_a_clipping_that_zeroes_a_huge_row_fails(name):
    """Clipping scales a row at 1e38 by about C/1e38 to norm C. reference_pre measured the
    rounding of that row on the 1e38 it was mixed from (64u·1e38 ≈ 7e23), so a clipping
    that zeroed such rows (a Byzantine client moved to the origin, not to norm C) held every
    law: each row is now measured on the magnitudes it is mixed from, Σⱼ Mᵢⱼ|xⱼ|."""
    ref = adapters.rfrs_pre(name)

    def zero_huge(X, ns, f):
        out = np.array(ref(X, ns, f), dtype=np.float64)
        A = np.abs(np.asarray(X, np.float64))
        out[np.isfinite(A).all(axis=1) & (A.max(axis=1) > 1e30)] = 0.0
        return out

    X = np.array([[0.1, 0.2], [0.3, -0.1], [-0.2, 0.0], [0.0, 0.3], [1e38, 1e38]])
    case = strategies.RoundCase(X, np.array([True] * 4 + [False]), 2, np.ones(5, np.int64),
                                np.arange(5), np.zeros(2))
    inst = PRE.get(name)()
    laws.reference_pre(ref, case, inst)
    with pytest.raises(laws.LawViolation, match="row 4"):
        laws.reference_pre(adapters.vector_pre(zero_huge), case, inst)
    assert _pre(name, adapters.vector_pre(zero_huge), law="reference_pre") == {"reference_pre": "fails"}


def test_a_hostile_row_may_stay_non_finite_in_another_way():
    """ByzFL's Clipping scales a row with +inf by C/inf = 0: its +inf becomes NaN and its
    finite coordinates 0. The row is still non-finite where it was: it holds."""
    def clip_by_zero(X, ns, f, c=1.0):
        out = np.array(X, dtype=np.float64, copy=True)
        with np.errstate(all="ignore"):
            norms = np.linalg.norm(out, axis=1)
            for i in range(out.shape[0]):
                if norms[i] > c:
                    out[i] *= c / norms[i]
        return out

    assert _pre("clip", adapters.vector_pre(clip_by_zero), law="reference_pre") == {"reference_pre": "holds"}


def nnm_by_python_sort(X, ns, f):
    """NNM whose neighbours are ordered by Python's ``sorted``: nothing compares smaller
    than NaN, so a NaN distance to row 0 stays first (row 0 is everyone's neighbour) and
    one to the last row stays last."""
    X64 = np.asarray(X, dtype=np.float64)
    n = X64.shape[0]
    with np.errstate(all="ignore"):
        d = ((X64[:, None, :] - X64[None, :, :]) ** 2).sum(axis=-1)
    out = np.empty_like(X64)
    for i in range(n):
        nb = np.array(sorted(range(n), key=lambda j: -1.0 if j == i else d[i, j])[: n - f])
        w = np.asarray(ns, dtype=np.float64)[nb]
        with np.errstate(all="ignore"):
            out[i] = w @ X64[nb] / w.sum()
    return out


def test_the_hostile_rounds_put_the_byzantine_row_first_too():
    """With the hostile row last only, an NNM that sorts its neighbours with ``sorted`` held
    nnm_honest_bound on every fixed hostile round; with the row first (rows moved down one)
    a NaN row is every honest row's neighbour."""
    f_bound, min_n, _ = PRE_LAWS["nnm"]
    cases = strategies.hostile_examples(min_n=min_n, max_f=f_bound)
    last = [c for c in cases if not c.honest[-1]]
    first = [c for c in cases if not c.honest[0]]
    assert len(last) == len(first) == 16 and len(cases) == 32
    fn = adapters.vector_pre(nnm_by_python_sort)

    def violates(case):
        try:
            laws.nnm_honest_bound(fn, case)
        except laws.LawViolation:
            return True
        return False

    assert not any(violates(c) for c in last)
    assert any(violates(c) for c in first)


def test_the_unweighted_nnm_is_right_with_equal_weights():
    # ByzFL's convention: only the nᵢ weighting tells it from rfrs-ref's
    st = _pre("nnm", adapters.vector_pre(nnm_unweighted))
    assert st == {"reference_pre": "holds", "weighted_mixing": "fails", "nnm_honest_bound": "holds",
                  "permutation_equivariance": "holds", "inputs_unchanged": "holds"}


def ipm_of_the_sum(V, eps=0.1):
    return -eps * np.asarray(V, dtype=np.float64).sum(axis=0)


def ipm_of_the_median(V, eps=0.1):
    return -eps * np.median(np.asarray(V, dtype=np.float64), axis=0)


def ipm_of_the_first_half(V, eps=0.1):
    V = np.asarray(V, dtype=np.float64)
    return -eps * V[: max(1, V.shape[0] // 2)].mean(axis=0)


def alie_population(V, z=1.5):
    V = np.asarray(V, dtype=np.float64)
    return V.mean(axis=0) - z * V.std(axis=0)


def alie_signed(V, z=1.5):
    """Shifts every coordinate towards 0: μ − z·σ·sign(μ), no single z."""
    V = np.asarray(V, dtype=np.float64)
    with np.errstate(all="ignore"):
        sd = V.std(axis=0, ddof=1) if V.shape[0] > 1 else np.zeros(V.shape[1])
        return V.mean(axis=0) - z * sd * np.sign(V.mean(axis=0))


def mimic_the_mean(V):
    return np.asarray(V, dtype=np.float64).mean(axis=0)


def mimic_the_last(V):
    return np.asarray(V)[-1]


def mimic_the_first_finite(V):
    """Vector 0, unless it is non-finite: then the first finite vector (wrong only when the
    copied vector, index 0, is hostile)."""
    V = np.asarray(V)
    rows = np.flatnonzero(np.isfinite(V).all(axis=1))
    return V[rows[0] if rows.size else 0].copy()


def mimic_repairing_vector_0(V):
    """Vector 0 with its non-finite values zeroed."""
    return np.nan_to_num(np.asarray(V)[0], nan=0.0, posinf=0.0, neginf=0.0)


def inf_as_a_huge_number(V):
    return np.full(np.shape(V)[1], 1e308)


@pytest.mark.parametrize("name, fn, law, options", [
    ("ipm", ipm_of_the_sum, "reference_attack", None),
    ("ipm", ipm_of_the_median, "ipm_direction", None),
    ("ipm", ipm_of_the_first_half, "permutation_invariance", None),
    ("alie", alie_population, "reference_attack", {"z": 1.5}),
    ("alie", alie_signed, "alie_form", {"z": 1.5}),
    ("mimic", mimic_the_last, "reference_attack", None),
    ("mimic", mimic_the_mean, "mimic_copy", None),
    ("mimic", mimic_the_first_finite, "reference_attack", None),
    ("mimic", mimic_repairing_vector_0, "reference_attack", None),
    ("mimic", mimic_repairing_vector_0, "mimic_copy", None),
    ("inf", inf_as_a_huge_number, "reference_attack", None),
    ("inf", inf_as_a_huge_number, "inf_nonfinite", None),
])
def test_each_attack_law_catches_a_wrong_implementation(name, fn, law, options):
    assert _attack(name, adapters.vector_attack(fn), law=law, reference_options=options) == {law: "fails"}


def test_the_hostile_vector_is_at_both_ends_of_the_attack_rounds():
    """Mimic copies the vector at an index (0 by default, the last one past it): the fixed
    rounds put the hostile vector at index 0 and at the last index."""
    def hostile_row(X):
        X = X.astype(np.float64)
        return int(np.flatnonzero(~(np.abs(X) < 1e37).all(axis=1))[0])

    at = {hostile_row(c.features) for c in attack_examples() if c.n > 1}
    assert at == {0, 4}, at


def test_a_failure_names_the_variant_and_reproduces():
    res = run_attack_conformance("ipm", adapters.vector_attack(ipm_of_the_sum), max_examples=5,
                                 laws=["reference_attack"])
    assert "epsilon=0.1" in res[0].message and "--rule-option" in res[0].message
    ce = res[0].counterexample
    V = np.array(ce["vectors"], dtype=ce["dtype"])
    with pytest.raises(laws.LawViolation):
        laws.reference_attack(adapters.vector_attack(ipm_of_the_sum), strategies.RoundCase(
            V, np.ones(len(V), bool), 0, np.ones(len(V), np.int64), np.arange(len(V)),
            np.zeros(V.shape[1])), adapters.rfrs_attack("ipm"), gain=0.1)
    assert "counterexample for reference_attack" in format_results(res, "t")


def test_hostile_outputs_fail_instead_of_crashing():
    def wrong_shape(X, ns, f):
        return np.asarray(X)[:, :1]

    def strings(V):
        return np.array(["0.5"] * np.shape(V)[1])

    def crash(V):
        raise RuntimeError("boom")

    res = run_pre_conformance("nnm", adapters.vector_pre(wrong_shape), max_examples=3,
                              laws=["reference_pre"])
    assert res[0].status == "fails" and "shape" in res[0].message
    res = run_attack_conformance("ipm", adapters.vector_attack(strings), max_examples=3,
                                 laws=["ipm_direction"])
    assert res[0].status == "fails" and "strings" in res[0].message
    res = run_attack_conformance("mimic", adapters.vector_attack(crash), max_examples=3)
    assert all(r.status == "fails" and "boom" in r.message for r in res)


def test_unknown_laws_and_options_are_refused():
    with pytest.raises(ValueError, match="no law 'unanimity' for pre-aggregator 'nnm'"):
        run_pre_conformance("nnm", adapters.rfrs_pre("nnm"), laws=["unanimity"])
    with pytest.raises(ValueError, match="no laws are defined for attack 'ascent'"):
        run_attack_conformance("ascent", adapters.rfrs_attack("ipm"))
    with pytest.raises(adapters.AdapterError, match="does not take"):
        run_pre_conformance("clip", adapters.rfrs_pre("clip"), reference_options={"c": 1.0})
    with pytest.raises(adapters.AdapterError, match="does not apply to attacks"):
        adapters.adapt_family(print, "flower", "attack")


# -- the command ---------------------------------------------------------------------------------

def test_cli_conformance_pre_and_attack():
    from rfrs_ref.cli.main import main

    runner = CliRunner()
    res = runner.invoke(main, ["conformance", "--pre", "clip", "--callable", "rfrs_ref.aggregate.pre:Clip",
                               "--option", "clip_norm=3.0", "--max-examples", "3"])
    assert res.exit_code == 0, res.output
    assert "clip_norm_bound" in res.output and "FAILS" not in res.output
    res = runner.invoke(main, ["conformance", "--attack", "alie", "--callable", "rfrs_ref.attack:ALIE",
                               "--option", "z=1.0", "--max-examples", "3", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["attack"] == "alie" and {r["status"] for r in doc["results"]} == {"holds"}
    example = pathlib.Path(__file__).parents[2] / "examples" / "wrong_arc.py"
    res = runner.invoke(main, ["conformance", "--pre", "arc", "--callable", f"{example}:arc",
                               "--max-examples", "2", "--law", "permutation_equivariance"])
    assert res.exit_code == 1 and "counterexample for permutation_equivariance" in res.output
    res = runner.invoke(main, ["conformance", "--pre", "nnm", "--attack", "ipm", "--callable", "x:y"])
    assert res.exit_code == 2 and "got --pre and --attack" in res.output
    res = runner.invoke(main, ["conformance", "--attack", "ipm", "--adapter", "weights", "--callable", "x:y"])
    assert res.exit_code == 2 and "does not apply to --attack" in res.output
    res = runner.invoke(main, ["conformance", "--attack", "ascent", "--callable", "x:y"])
    assert res.exit_code == 2  # an attack without laws is not offered
    res = runner.invoke(main, ["conformance", "--pre", "nnm", "--callable", "rfrs_ref.aggregate.pre:NNM",
                               "--law", "unanimity"])
    assert res.exit_code == 2 and "no law 'unanimity' for pre-aggregator 'nnm'" in res.output
    res = runner.invoke(main, ["conformance", "--attack", "alie", "--callable", "rfrs_ref.attack:ALIE",
                               "--option", "z=1.0", "--reference-option", "zz=1"])
    assert res.exit_code == 2 and "does not take" in res.output
    res = runner.invoke(main, ["conformance", "--help"])
    assert "--pre" in res.output and "--attack" in res.output and "--reference-option" in res.output


def test_an_attack_that_ends_the_process_fails_the_check(tmp_path):
    from rfrs_ref.cli.main import main

    path = tmp_path / "exiting.py"
    path.write_text("import os, sys\n\n"
                    "def quits(V):\n    sys.exit(0)\n\n"
                    "def ends(V):\n    os._exit(0)\n")
    res = CliRunner().invoke(main, ["conformance", "--attack", "inf", "--callable", f"{path}:quits",
                                    "--max-examples", "1"])
    assert res.exit_code == 1 and "exit(0)" in res.output
    res = CliRunner().invoke(main, ["conformance", "--attack", "inf", "--callable", f"{path}:ends",
                                    "--max-examples", "1"])
    assert res.exit_code == 1 and "before the suite reported" in res.output
