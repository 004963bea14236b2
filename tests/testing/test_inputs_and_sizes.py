"""The conformance suite holds every family to what its docs promise about inputs and sizes:
a rule, pre-aggregator, attack or optimiser leaves the arrays it is given alone and returns
new ones (``inputs_unchanged``), and a candidate wrong only on rounds larger than the drawn
ones fails on the fixed large rounds (docs/conformance.md)."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest

import rfrs_ref
from rfrs_ref.optim import SGD
from rfrs_ref.testing import adapters, laws, strategies
from rfrs_ref.testing.conformance import (
    ATTACK_LAWS,
    LARGE_LAWS,
    OPTIMIZER_LAWS,
    PRE_LAWS,
    RULE_LAWS,
    run_attack_conformance,
    run_optimizer_conformance,
    run_pre_conformance,
    run_rule_conformance,
)

_MEDIAN = adapters.rfrs("median")
_CLIP = adapters.rfrs_pre("clip")


def _one(results):
    r, = results
    return r


# -- every family has the law -------------------------------------------------------------------

def test_every_family_member_has_the_inputs_law():
    for table in (RULE_LAWS, PRE_LAWS):
        for name, (_, _, specs) in table.items():
            assert "inputs_unchanged" in [s.name for s in specs], name
    for name, specs in ATTACK_LAWS.items():
        assert "inputs_unchanged" in [s.name for s in specs], name
    for name, specs in OPTIMIZER_LAWS.items():
        assert "inputs_unchanged" in [s.name for s in specs], name


# -- optimisers: recover's results are the caller's --------------------------------------------

class _BufferRecoverSGD:
    """SGD whose recover() writes every result into one buffer it keeps and returns it."""

    name = "sgd"

    def __init__(self, lr=0.01):
        self.lr = lr
        self._buf = None

    def client_rule(self, state, g, t):
        return {"theta": np.asarray(state["theta"], dtype=np.float64) - self.lr * np.asarray(g, dtype=np.float64)}

    def recover(self, state, upload, t):
        tb = np.asarray(state["theta"], dtype=np.float64)
        if self._buf is None or self._buf.shape != tb.shape:
            self._buf = np.empty_like(tb)
        np.subtract(tb, np.asarray(upload["theta"], dtype=np.float64), out=self._buf)
        self._buf /= self.lr
        return self._buf


def test_a_recover_that_reuses_one_buffer_fails():
    r = _one(run_optimizer_conformance("sgd", _BufferRecoverSGD, max_examples=3,
                                       laws=["inputs_unchanged"]))
    assert r.status == "fails"
    assert "when recover was called on another upload" in r.message
    assert "\n" not in r.message
    # the other laws call recover once per example and cannot see it
    st = {x.law: x.status for x in run_optimizer_conformance("sgd", _BufferRecoverSGD, max_examples=3,
                                                              laws=["recovery_exact", "update_rule"])}
    assert st == {"recovery_exact": "holds", "update_rule": "holds"}


def _pair(D=4, dtype=np.float64):
    rng = np.random.default_rng(3)
    state = {k: rng.normal(size=D).astype(dtype) for k in ("theta", "m")}
    state["v"] = state["r"] = (np.abs(rng.normal(size=D)) + 1.0).astype(dtype)
    g = rng.normal(size=D).astype(dtype)
    return strategies.PairCase(SGD(lr=0.5), state, g, -g, 3, 0.0)


class _ViewSGD(SGD):
    """Right uploads; recover returns a view of the upload it is given."""

    def recover(self, state, upload, t):
        return upload["theta"][:]


class _StateUploadSGD(SGD):
    """An upload whose θ is the state's θ̄ array itself when g is zero."""

    def client_rule(self, state, g, t):
        if not np.any(g):
            return {"theta": state["theta"]}
        return super().client_rule(state, g, t)


def test_a_recovered_gradient_must_not_be_a_view_of_the_upload():
    obj = dataclasses.replace(_ViewSGD(), lr=0.5)
    with pytest.raises(laws.LawViolation, match="what recover returned shares memory with recover's upload"):
        laws.inputs_unchanged(obj, _pair())


def test_an_upload_must_not_be_the_state_array():
    case = dataclasses.replace(_pair(), g=np.zeros(4))
    obj = dataclasses.replace(_StateUploadSGD(), lr=0.5)
    with pytest.raises(laws.LawViolation, match=r"client_rule's upload\['theta'\] shares memory with "
                                                r"client_rule's state\['theta'\]"):
        laws.inputs_unchanged(obj, case)


# -- rules --------------------------------------------------------------------------------------

def _destroying_median(features, n_samples, f):
    out = np.array(_MEDIAN(features, n_samples, f).vector, copy=True)
    features.sort(axis=0)
    features[:] = np.nan
    return out


def _median_zeroing_ns(features, n_samples, f):
    out = _MEDIAN(np.array(features, copy=True), n_samples, f).vector
    n_samples[:] = 0
    return out


def _median_in_a_buffer_of_its_own(features, n_samples, f):
    """rfrs-ref's median returned as a view of a buffer the rule allocated: not an input."""
    out = _MEDIAN(np.array(features, copy=True), n_samples, f).vector
    buf = np.empty((2, features.shape[1]), dtype=np.float64)
    buf[0] = out
    return buf[0]


class _KeepsAndWritesLater:
    """A median that keeps the features it was given and writes into them on its next call."""

    def __init__(self):
        self.kept = None

    def __call__(self, features, n_samples, f):
        if self.kept is not None:
            self.kept[:] = 0
        self.kept = features
        return _MEDIAN(np.array(features, copy=True), n_samples, f).vector


@pytest.mark.parametrize("fn, words", [
    (_destroying_median, "features[0, 0] was changed in place"),
    (_median_zeroing_ns, "n_samples[0] was changed in place"),
    (_KeepsAndWritesLater(), "(after a second call on other arrays)"),
])
def test_a_rule_that_modifies_its_inputs_fails(fn, words):
    results = run_rule_conformance("median", adapters.vector(fn), max_examples=5)
    st = {r.law: r for r in results}
    assert st["inputs_unchanged"].status == "fails", st["inputs_unchanged"]
    assert words in st["inputs_unchanged"].message
    assert "\n" not in st["inputs_unchanged"].message


def test_an_aggregate_that_is_a_view_of_an_input_fails():
    one = strategies.RoundCase(np.array([[1.0, 2.0, 3.0]]), np.array([True]), 0, np.array([4]),
                               np.array([0]), np.zeros(3))

    def median_of_one_row(features, n_samples, f):  # right: the median of one row is that row
        return features[0] if features.shape[0] == 1 else _MEDIAN(features, n_samples, f).vector

    with pytest.raises(laws.LawViolation, match="what the rule returned shares memory with features"):
        laws.rule_inputs_unchanged(adapters.vector(median_of_one_row), one)
    # weights that are the nᵢ array itself: the clause is about memory, checked on any output
    r = _one(run_rule_conformance("mean", adapters.weights(lambda X, ns, f: ns), max_examples=3,
                                  laws=["inputs_unchanged"]))
    assert r.status == "fails" and "what the rule returned shares memory with n_samples" in r.message
    r = _one(run_rule_conformance("median", adapters.vector(_median_in_a_buffer_of_its_own),
                                  max_examples=3, laws=["inputs_unchanged"]))
    assert r.status == "holds"


def test_a_changed_nan_payload_is_a_change():
    X = np.array([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]])
    X[2] = np.array([0x7FF8000000000001], dtype=np.uint64).view(np.float64)[0]
    case = strategies.RoundCase(X, np.array([True, True, False]), 1, np.array([1, 2, 3]),
                                np.array([2, 0, 1]), np.zeros(2))

    def canonical_nan(features, n_samples, f):
        features[np.isnan(features)] = np.nan  # the same NaN, another payload
        return adapters.Outcome(np.zeros(2))

    with pytest.raises(laws.LawViolation, match=r"features\[2, 0\] was changed in place: nan "
                                                r"\(bits 0x7ff8000000000001\) became nan "
                                                r"\(bits 0x7ff8000000000000\)"):
        laws.rule_inputs_unchanged(canonical_nan, case)
    laws.rule_inputs_unchanged(lambda X, ns, f: adapters.Outcome(np.zeros(2)), case)


# -- pre-aggregators and attacks ----------------------------------------------------------------

def _clip_in_place(features, n_samples, f, C=1.0):
    x = features
    norms = np.linalg.norm(x.astype(np.float64), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.where(np.isfinite(norms) & (norms > C), C / norms, 1.0)
    x *= scale[:, None].astype(x.dtype)
    return x


_WIDE_CLIP = adapters.rfrs_pre("clip", clip_norm=1e9)


def _clip_returning_its_input(features, n_samples, f):
    """Clipping at C = 1e9 that returns the features themselves when no row changes."""
    out = _WIDE_CLIP(features, n_samples, f)
    return features if np.array_equal(out, features, equal_nan=True) else out


def test_a_pre_aggregator_that_scales_in_place_or_returns_its_input_fails():
    r = _one(run_pre_conformance("clip", adapters.vector_pre(_clip_in_place), max_examples=5,
                                 laws=["inputs_unchanged"]))
    assert r.status == "fails" and "was changed in place" in r.message
    clean = strategies.RoundCase(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), np.ones(3, dtype=bool),
                                 1, np.array([1, 2, 3]), np.array([2, 0, 1]), np.zeros(2))
    with pytest.raises(laws.LawViolation, match="the mixed rows shares memory with features"):
        laws.pre_inputs_unchanged(adapters.vector_pre(_clip_returning_its_input), clean)


def test_an_attack_that_overwrites_or_returns_an_honest_row_fails():
    def ipm_overwriting(vectors, epsilon=0.1):
        m = vectors.mean(axis=0)
        vectors[:] = -epsilon * m
        return vectors[0]

    r = _one(run_attack_conformance("ipm", adapters.vector_attack(ipm_overwriting), max_examples=5,
                                    laws=["inputs_unchanged"]))
    assert r.status == "fails" and "vectors[0, 0] was changed in place" in r.message
    r = _one(run_attack_conformance("mimic", adapters.vector_attack(lambda V: V[0]), max_examples=5,
                                    laws=["inputs_unchanged"]))
    assert r.status == "fails" and "the Byzantine vector shares memory with vectors" in r.message
    r = _one(run_attack_conformance("mimic", adapters.vector_attack(lambda V: V[0].copy()),
                                    max_examples=5, laws=["inputs_unchanged"]))
    assert r.status == "holds"


# -- sizes beyond the drawn ones ----------------------------------------------------------------

def _median_small_only(features, n_samples, f):
    """rfrs-ref's median on rounds of at most 13 clients and 12 features, the mean beyond."""
    if features.shape[0] > 13 or features.shape[1] > 12:
        return np.mean(features, axis=0)
    return np.array(_MEDIAN(features, n_samples, f).vector, copy=True)


def _median_wrong_tail(features, n_samples, f):
    """rfrs-ref's median, but past a block of 256 coordinates the tail is off by one."""
    out = np.array(_MEDIAN(features, n_samples, f).vector, copy=True)
    out[256:] += 1.0
    return out


@pytest.mark.parametrize("fn", [_median_small_only, _median_wrong_tail])
def test_a_median_wrong_only_beyond_the_drawn_sizes_fails_on_a_fixed_large_round(fn):
    r = _one(run_rule_conformance("median", adapters.vector(fn), max_examples=20,
                                  laws=["reference_rule"]))
    assert r.status == "fails", r
    ce = r.counterexample
    assert ce["fixed_example"] and ce["n"] >= 33 and ce["D"] >= 257
    # the report names the round instead of listing its values, and the name rebuilds it
    features = ce["features"]
    case = eval(features["rebuild"], {"rfrs_ref": rfrs_ref, "dataclasses": dataclasses})
    assert hashlib.sha256(np.ascontiguousarray(case.features).tobytes()).hexdigest() == features["sha256"]


class _SGDAscendingFromThe9th:
    name = "sgd"

    def __init__(self, lr=0.01):
        self.lr = lr

    def client_rule(self, state, g, t):
        tb, g = np.asarray(state["theta"], dtype=np.float64), np.asarray(g, dtype=np.float64)
        th = tb - self.lr * g
        th[8:] = tb[8:] + self.lr * g[8:]
        return {"theta": th}

    def recover(self, state, upload, t):
        g = (np.asarray(state["theta"], dtype=np.float64) - np.asarray(upload["theta"], dtype=np.float64)) / self.lr
        g[8:] = -g[8:]
        return g


def test_an_sgd_wrong_only_on_long_parameter_vectors_fails():
    st = {r.law: r for r in run_optimizer_conformance("sgd", _SGDAscendingFromThe9th, max_examples=5)}
    assert st["update_rule"].status == "fails" and st["recovery_exact"].status == "fails"
    assert st["update_rule"].counterexample["fixed_example"]
    assert "rebuild" in st["update_rule"].counterexample["arrays"]


def test_a_pre_aggregator_and_an_attack_wrong_only_on_large_rounds_fail():
    def clip_small_only(features, n_samples, f):
        out = _CLIP(features, n_samples, f)
        return out if features.shape[0] <= 13 else np.asarray(features, dtype=np.float64) * 1.0
    r = _one(run_pre_conformance("clip", adapters.vector_pre(clip_small_only), max_examples=10,
                                 laws=["reference_pre"]))
    assert r.status == "fails" and r.counterexample["fixed_example"]
    ipm = adapters.rfrs_attack("ipm")

    def ipm_short(vectors):
        out = ipm(vectors)
        out[8:] = 0.0
        return out
    r = _one(run_attack_conformance("ipm", adapters.vector_attack(ipm_short), max_examples=10,
                                    laws=["reference_attack"]))
    assert r.status == "fails" and r.counterexample["fixed_example"] and r.counterexample["D"] > 8


def test_the_large_rounds_respect_the_preconditions_and_are_fixed():
    bound = RULE_LAWS["bulyan"][0]
    a = strategies.large_examples(min_n=3, max_f=bound)
    b = strategies.large_examples(min_n=3, max_f=bound)
    assert [c.features.tobytes() for c in a] == [c.features.tobytes() for c in b]
    assert [(c.n, c.D) for c in a] == [(n, D) for n, D, _, _ in strategies.LARGE_ROUNDS]
    assert all(c.n > 13 and c.D > 12 for c in a)
    for c in a:
        assert c.f == bound(c.n) and int((~c.honest).sum()) == c.f  # f at the limit, all present
    none = strategies.large_examples(byzantine=False)
    assert all(c.honest.all() for c in none)
    finite = strategies.large_examples(hostile=False)
    assert all(np.isfinite(c.features).all() for c in finite)
    pivot = strategies.large_examples(trusted=0)
    assert all(c.honest[0] for c in pivot)
    mda = strategies.large_examples(max_f=RULE_LAWS["mda"][0], max_subsets=1000)
    import math
    assert all(math.comb(c.n, c.f) <= 1000 for c in mda)
    tied = strategies.large_examples(ties=True)
    assert len(tied) == len(strategies.LARGE_ROUNDS) + 1
    assert {"reference_rule", "reference_pre", "reference_attack"} <= LARGE_LAWS
