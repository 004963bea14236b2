"""Aggregation rules: known answers, registry, preconditions, invariants, backends."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from rfrs_ref.aggregate import (
    PRESETS,
    RULES,
    AggregationResult,
    Bulyan,
    Krum,
    Mean,
    Median,
    NothingFinite,
    PreconditionError,
    RFA,
    TrimmedMean,
    parameter_features,
)
from rfrs_ref.aggregate.krum import client_distances
from rfrs_ref.params import hyperparameters

HOSTILE = [np.nan, np.inf, -np.inf, 1e38, -1e38, 3.4e38]


def largest_f(name: str, n: int) -> int:
    """The largest f each rule accepts with n clients."""
    if name == "mean":
        return n
    if name == "krum":
        return max(0, (n - 3) // 2)
    if name == "bulyan":
        return max(0, (n - 3) // 4)
    return (n - 1) // 2


def test_registry_and_presets():
    assert RULES.names() == ["mean", "krum", "median", "trmean", "rfa", "bulyan", "mda", "meamed", "monna",
                             "cc", "caf", "smea"]
    for name, cls in RULES.items():
        assert cls.name == name
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
        cls()  # defaults are valid
        for h in hyperparameters(cls):
            assert h.help
    assert [RULES.get(n).coordinatewise for n in RULES] == [False, False, True, True, False, True, False, True, False,
                                                            False, False, False]
    assert PRESETS == {
        "no-defense": ("mean", "parameter"), "a-rfrs": ("krum", "gradient"),
        "krum": ("krum", "parameter"), "rfa": ("rfa", "parameter"), "trmean": ("trmean", "parameter"),
    }
    assert all(rule in RULES for rule, _ in PRESETS.values())


def test_mean_weights_by_n_samples():
    X = np.array([[0.0, 0.0], [1.0, 1.0], [np.nan, 0.0]])
    A = {"theta": np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])}
    res = Mean().aggregate(X, A, [1, 1, 2], 5)
    np.testing.assert_allclose(res.weights, [0.25, 0.25, 0.5])
    np.testing.assert_allclose(res.arrays["theta"], [3.5, 4.5])
    np.testing.assert_array_equal(res.kept, [1, 1, 1])


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_krum_known_answer(backend):
    X = np.array([[0.0], [1.0], [2.0], [3.0], [100.0]])
    A = {"x": X, "id": np.arange(5.0)[:, None]}
    ns = np.array([1, 2, 3, 4, 5])
    # m = n − f − 2 = 2 neighbours: scores 5, 2, 2, 5, 97² + 98²
    res = Krum().aggregate(X, A, ns, 1, backend=backend)
    assert res.diagnostics["scores"] == [5.0, 2.0, 2.0, 5.0, 97.0**2 + 98.0**2]
    assert res.diagnostics["selected"] == [1, 2, 0, 3]
    np.testing.assert_allclose(res.weights, [0.1, 0.2, 0.3, 0.4, 0.0])
    np.testing.assert_allclose(res.arrays["x"], [(2 + 6 + 12) / 10])
    np.testing.assert_array_equal(res.kept, [1, 1, 1, 1, 0])
    classic = Krum(k=1).aggregate(X, A, ns, 1, backend=backend)
    np.testing.assert_array_equal(classic.arrays["id"], [1.0])  # tie 1 vs 2 -> smaller index


def _rows_some_hostile(seed, n):
    """(X, nᵢ): n float32 rows of 5, up to two entries NaN, inf or 1e30."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5)).astype(np.float32)
    for _ in range(int(rng.integers(0, 3))):
        X[rng.integers(n), rng.integers(5)] = rng.choice([np.nan, np.inf, 1e30])
    return X, rng.integers(1, 20, size=n)


def _same_but_arrays(got, want):
    """from_distances' result (no arrays) against aggregate's: weights, kept, diagnostics."""
    assert got.arrays == {}
    np.testing.assert_array_equal(got.weights, want.weights)
    np.testing.assert_array_equal(got.kept, want.kept)
    assert got.diagnostics == want.diagnostics


@settings(max_examples=60, deadline=None)
@given(st.integers(4, 12), st.integers(0, 3), st.integers(0, 2**32 - 1),
       st.sampled_from([{}, {"k": 1}, {"fallback": "mean"}, {"fallback": "reduce-f"}]))
def test_krum_from_distances_is_krum_on_the_features(n, f, seed, params):
    """Rule.from_distances on the features' distance matrix gives the weights, kept
    clients and diagnostics of Rule.aggregate, and no arrays (the round that computes
    the shared rows once sums the uploads itself); a non-finite client included."""
    from rfrs_ref.aggregate.krum import client_distances

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 7)).astype(np.float32)
    X[rng.integers(n), rng.integers(7)] = rng.choice([np.nan, np.inf, 1e30])
    ns = rng.integers(1, 20, size=n)
    rule = Krum(**params)
    if f > 0 and not n > 2 * f + 2 and "fallback" not in params:
        with pytest.raises(PreconditionError):
            rule.from_distances(*client_distances(X, {}, "numba"), ns, f)
        return
    if params.get("k", 0) > n - f:
        return
    want = rule.aggregate(X, {"x": X}, ns, f)
    got = rule.from_distances(*client_distances(X, {}, "numba"), ns, f)
    _same_but_arrays(got, want)


@settings(max_examples=60, deadline=None)
@given(st.integers(3, 12), st.integers(0, 4), st.integers(0, 2**32 - 1),
       st.sampled_from(["numba", "numpy"]))
def test_mda_from_distances_is_mda_on_the_features(n, f, seed, backend):
    """MDA's subset is a function of the features' squared distances and of which clients
    are finite: from_distances on client_distances' matrix gives aggregate's weights,
    kept clients and diagnostics (the round on shared rows sums the uploads itself);
    non-finite clients included, beyond f too."""
    from rfrs_ref.aggregate.mda import MDA

    X, ns = _rows_some_hostile(seed, n)
    rule = MDA()
    if not n > 2 * f:
        with pytest.raises(PreconditionError):
            rule.from_distances(*client_distances(X, {}, backend), ns, f)
        return
    D2, ok = client_distances(X, {}, backend)
    if not ok.any():
        with pytest.raises(NothingFinite):
            rule.from_distances(D2, ok, ns, f)
        return
    want = rule.aggregate(X, {"x": X}, ns, f, backend=backend)
    got = rule.from_distances(D2, ok, ns, f, backend=backend)
    _same_but_arrays(got, want)


@settings(max_examples=60, deadline=None)
@given(st.integers(3, 12), st.integers(0, 4), st.integers(0, 4), st.integers(0, 2**32 - 1),
       st.sampled_from(["numba", "numpy"]))
def test_monna_from_distances_is_monna_on_the_features(n, f, pivot, seed, backend):
    """MoNNA's choice is a function of the pivot's squared distances and of which clients
    are finite: from_distances on a matrix whose pivot row is the one the rule computes
    gives aggregate's weights, kept clients and diagnostics; a non-finite pivot moves to
    the next finite client in both."""
    from rfrs_ref.aggregate.combine import finite_clients
    from rfrs_ref.aggregate.monna import MoNNA
    from rfrs_ref.kernels.distances import pairwise_sq_dists

    X, ns = _rows_some_hostile(seed, n)
    rule = MoNNA(pivot=pivot)
    D2, ok = client_distances(X, {}, backend)
    if not (n > 2 * f and pivot < n):
        with pytest.raises(PreconditionError):
            rule.from_distances(D2, ok, ns, f)
        return
    if not ok.any():
        with pytest.raises(NothingFinite):
            rule.from_distances(D2, ok, ns, f)
        return
    p = pivot if ok[pivot] else int(np.flatnonzero(np.roll(ok, -pivot))[0] + pivot) % n
    row = pairwise_sq_dists(X[p:p + 1], X, backend=backend)[0]
    D2[p, :] = np.where(ok, row, np.inf)
    D2[:, p] = D2[p, :]
    assert np.array_equal(finite_clients(X, {}, "numba"), ok)
    want = rule.aggregate(X, {"x": X}, ns, f, backend=backend)
    got = rule.from_distances(D2, ok, ns, f, backend=backend)
    _same_but_arrays(got, want)


@settings(max_examples=40, deadline=None)
@given(st.integers(4, 12), st.integers(0, 2**32 - 1), st.booleans())
def test_rfa_from_distances_is_rfa_on_the_features(n, seed, hostile):
    """RFA.from_distances on the matrix pairwise_sq_dists64 computes (with its bound)
    gives RFA.aggregate's weights, kept clients and diagnostics bit for bit, or raises
    NeedsRows where the steps on the rows leave the matrix."""
    from rfrs_ref.aggregate.base import NeedsRows
    from rfrs_ref.kernels.distances import pairwise_sq_dists64, sq_dists64_error

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 9)).astype(np.float32)
    X[: n // 3] *= -1
    if hostile:
        X[rng.integers(n), rng.integers(9)] = rng.choice([np.nan, np.inf])
    ns = rng.integers(1, 20, size=n)
    ok = np.isfinite(X).all(axis=1)
    D2 = np.full((n, n), np.inf)
    live = np.flatnonzero(ok)
    D2[np.ix_(live, live)] = pairwise_sq_dists64(X, live)
    want = RFA().aggregate(X, {"x": X}, ns, 1)
    try:
        got = RFA().from_distances(D2, ok, ns, 1, error=sq_dists64_error(9))
    except NeedsRows:
        return
    assert got.arrays == {}
    np.testing.assert_array_equal(got.weights, want.weights)
    assert got.diagnostics == want.diagnostics
    with pytest.raises(ValueError, match="error bound"):
        RFA().from_distances(D2, ok, ns, 1)


@settings(max_examples=80, deadline=None)
@given(st.integers(3, 14), st.integers(0, 4), st.integers(0, 2**32 - 1),
       st.sampled_from(["median", "trmean", "meamed", "bulyan"]),
       st.sampled_from([{}, {"fallback": "reduce-f"}]))
def test_aggregate_by_columns_is_the_rule_on_the_whole_rows(n, f, seed, name, params):
    """Rule.aggregate_by_columns on parts and class-shared columns gives Rule.aggregate on
    the whole rows bit for bit (its arrays in pieces); a hostile value in a part is
    input as there; the mean fallback needs the rows."""
    from rfrs_ref.aggregate.base import NeedsRows

    rng = np.random.default_rng(seed)
    cls = rng.integers(0, 2, size=n)
    P = rng.normal(size=(n, 9)).astype(np.float32)
    P[rng.integers(n), rng.integers(9)] = rng.choice([np.nan, np.inf, 1e30])
    Q = rng.normal(size=(n, 4)).astype(np.float32)
    Sx = rng.normal(size=(2, 6)).astype(np.float32)
    Su = (3 * rng.normal(size=(2, 6))).astype(np.float32)
    Pu, Qu = 3 * P, (3 * rng.normal(size=(n, 4))).astype(np.float32)
    ns = rng.integers(1, 20, size=n)
    rule = RULES.get(name)(**params)
    X = np.concatenate([P, Q, Sx[cls]], axis=1)
    A = {"u": np.concatenate([Pu, Qu, Su[cls]], axis=1)}
    parts = [(P, {"u": Pu}), (Q, {"u": Qu})]
    # Bulyan selects by the distances of the whole rows, which the caller computes
    distances = client_distances(X, A, "numba") if name == "bulyan" else None
    try:
        want = rule.aggregate(X, A, ns, f)
    except PreconditionError:
        with pytest.raises(PreconditionError):
            rule.aggregate_by_columns(parts, (Sx, {"u": Su}), cls, ns, f, distances=distances)
        return
    got = rule.aggregate_by_columns(parts, (Sx, {"u": Su}), cls, ns, f, distances=distances)
    np.testing.assert_array_equal(np.concatenate(got.arrays["u"]).view(np.uint8),
                                  want.arrays["u"].view(np.uint8))
    np.testing.assert_array_equal(got.kept, want.kept)
    assert got.weights is None and got.diagnostics == want.diagnostics
    with pytest.raises(NeedsRows):
        TrimmedMean(fallback="mean").aggregate_by_columns(parts, (Sx, {"u": Su}), cls, ns, n)
    with pytest.raises(TypeError):
        Krum().aggregate_by_columns(parts, (Sx, {"u": Su}), cls, ns, 0)
    with pytest.raises(ValueError, match="distances"):
        Bulyan(fallback="reduce-f").aggregate_by_columns(
            parts, (Sx, {"u": Su}), cls, ns, 0)


def test_only_rules_that_weigh_by_distances_take_a_distance_matrix():
    D2 = np.zeros((5, 5))
    ok = np.ones(5, dtype=bool)
    for name in RULES.names():
        rule = RULES.get(name)()
        if name in ("krum", "rfa", "mda", "monna"):
            assert rule.weighs_by_distances
            continue
        assert not rule.weighs_by_distances, name
        with pytest.raises(TypeError, match="distances"):
            rule.from_distances(D2, ok, np.ones(5), 0)
    with pytest.raises(ValueError, match="square"):
        Krum().from_distances(np.zeros((5, 4)), ok, np.ones(5), 0)
    with pytest.raises(ValueError, match="without NaN"):
        Krum().from_distances(np.full((5, 5), np.nan), ok, np.ones(5), 0)
    with pytest.raises(ValueError, match="one flag per client"):
        Krum().from_distances(D2, ok[:3], np.ones(5), 0)


def test_median_and_trmean_match_numpy_and_scipy_with_equal_weights():
    rng = np.random.default_rng(0)
    for n in (7, 8):
        X = rng.normal(size=(n, 50))
        ones = np.ones(n)
        np.testing.assert_allclose(Median().aggregate(X, {"x": X}, ones, 2).arrays["x"],
                                   np.median(X, axis=0), rtol=1e-12)
        for f in range(0, (n - 1) // 2 + 1):
            ref = stats.trim_mean(X, (f + 0.5) / n, axis=0)
            np.testing.assert_allclose(TrimmedMean().aggregate(X, {"x": X}, ones, f).arrays["x"], ref,
                                       rtol=1e-12)


def test_median_even_n_weights_the_two_middle_values_by_n_samples():
    X = np.array([[1.0], [2.0], [3.0], [4.0]])
    res = Median().aggregate(X, {"x": X}, [1, 1, 3, 1], 0)
    np.testing.assert_allclose(res.arrays["x"], [(2 + 3 * 3) / 4])
    np.testing.assert_allclose(res.kept, [0, 1, 1, 0])
    assert res.weights is None


def test_rfa_known_answer_is_the_median_in_one_dimension():
    X = np.array([[0.0], [1.0], [10.0]])
    res = RFA(tol=1e-12, max_iter=1000).aggregate(X, {"x": X}, [1, 1, 1], 1)
    np.testing.assert_allclose(res.arrays["x"], [1.0], atol=1e-5)
    assert res.diagnostics["converged"]
    assert res.weights[1] > 0.99


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_rfa_comes_back_from_a_far_third_by_restarting_at_the_median(backend):
    """3 of 8 clients (35% of the weight) at 1e38, honest rows of size 1e-3: from the mean
    Weiszfeld is still at 2.9e10 after 100 steps; the restart from the coordinate-wise
    median reaches the honest rows' geometric median."""
    from rfrs_ref.kernels.weiszfeld import geometric_median

    rng = np.random.default_rng(0)
    X = rng.normal(0, 1e-3, (8, 10)).astype(np.float32)
    X[:3] = 1e38
    ns = np.array([29 / 3] * 3 + [54 / 5] * 5)
    res = RFA(restart=True).aggregate(X, {"x": X}, ns, 3, backend=backend)
    honest = geometric_median(X[3:], ns[3:], backend="numpy", tol=1e-12, max_iter=1000)["z"]
    assert np.abs(res.arrays["x"] - honest).max() < 1e-2
    d = res.diagnostics
    assert d["converged"] and d["restarted"]
    assert d["start"] == "median (the mean did not converge)"
    assert d["iterations_from_mean"] == 100 and d["iterations"] == d["iterations_from_median"]
    assert res.weights[:3].max() < 1e-30
    # off by default (Pillutla et al.'s RFA never restarts): the iteration from the mean,
    # still at 2.9e10 after its 100 steps, unconverged
    plain = RFA().aggregate(X, {"x": X}, ns, 3, backend=backend)
    assert RFA().restart is False and plain.diagnostics["hyperparameters"]["restart"] is False
    assert 2.8e10 < np.abs(plain.arrays["x"]).max() < 3.0e10
    p = plain.diagnostics
    assert not p["converged"] and p["iterations"] == 100 and p["start"] == "mean"
    assert "restarted" not in p


def test_rfa_restart_must_be_a_bool():
    with pytest.raises(ValueError, match="restart"):
        RFA(restart="yes")


def test_bulyan_known_answer():
    # n = 7, f = 1: θ = 5 selected by iterated Krum, β = 3 closest to their median
    X = np.array([[0.0], [1.0], [2.0], [3.0], [4.0], [50.0], [-60.0]])
    res = Bulyan().aggregate(X, {"x": X}, np.ones(7), 1)
    assert sorted(res.diagnostics["selected"]) == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(res.arrays["x"], [2.0])  # 1, 2, 3 around the median 2
    np.testing.assert_allclose(res.kept, [0, 1, 1, 1, 0, 0, 0])


@pytest.mark.parametrize("rule, n, f, condition", [
    (Krum(), 4, 1, "n > 2f + 2"), (Krum(k=6), 7, 2, "k ≤ n − f (k=6)"),
    (Median(), 4, 2, "f < n/2 (n > 2f)"), (TrimmedMean(), 4, 2, "n > 2f"),
    (RFA(), 6, 3, "n > 2f"), (Bulyan(), 6, 1, "n ≥ 4f + 3"),
])
def test_precondition_errors_name_n_f_and_the_condition(rule, n, f, condition):
    X = np.zeros((n, 3))
    with pytest.raises(PreconditionError) as e:
        rule.aggregate(X, {"x": X}, np.ones(n), f)
    msg = str(e.value)
    assert f"n={n}" in msg and f"f={f}" in msg and condition in msg and rule.name in msg
    assert (e.value.n, e.value.f) == (n, f)
    with pytest.raises(PreconditionError):
        rule.check(n, f)


def test_fallbacks_are_recorded():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(6, 4))
    A = {"x": X}
    res = Bulyan(fallback="reduce-f").aggregate(X, A, np.ones(6), 1)
    assert res.diagnostics["fallback"]["action"] == "reduce-f"
    assert res.diagnostics["fallback"]["f_used"] == 0 and res.diagnostics["f_used"] == 0
    assert "n ≥ 4f + 3" in res.diagnostics["fallback"]["reason"]
    res = Krum(fallback="mean").aggregate(X, A, np.ones(6), 2)
    np.testing.assert_allclose(res.arrays["x"], X.mean(axis=0))
    assert res.diagnostics["fallback"]["action"] == "mean"
    # no f satisfies krum with two clients: reduce-f falls back to the mean, and says so
    res = Krum(fallback="reduce-f").aggregate(X[:2], {"x": X[:2]}, np.ones(2), 0)
    assert res.diagnostics["fallback"]["action"] == "mean"
    assert Krum().aggregate(X, A, np.ones(6), 1).diagnostics["fallback"] is None


def test_bad_inputs_are_named():
    X = np.zeros((3, 2))
    with pytest.raises(ValueError, match="shape"):
        Mean().aggregate(X, {"theta": np.zeros((3, 3))}, np.ones(3), 0)
    with pytest.raises(ValueError, match="n_samples"):
        Mean().aggregate(X, {"theta": X}, [1, 0, 1], 0)
    with pytest.raises(ValueError, match="f "):
        Mean().aggregate(X, {"theta": X}, [1, 1, 1], -1)
    with pytest.raises(ValueError, match="backend"):
        Mean().aggregate(X, {"theta": X}, [1, 1, 1], 0, backend="tpu")
    with pytest.raises(ValueError, match="k must be"):
        Krum(k=-1)
    with pytest.raises(ValueError, match="nu"):
        RFA(nu=0.0)
    with pytest.raises(ValueError, match="fallback"):
        Median(fallback="ignore")
    with pytest.raises(ValueError, match="fallback"):
        Krum(fallback="skip")


def test_parameter_features():
    T = np.array([[1.0, 2.0], [3.0, 5.0]], dtype=np.float32)
    tb = np.array([1.0, 1.0])
    np.testing.assert_array_equal(parameter_features(T, tb), [[0, 1], [2, 4]])
    out = np.empty_like(T)
    assert parameter_features(T, tb, out=out) is out
    assert out.dtype == np.float32
    with pytest.raises(ValueError, match="θ̄"):
        parameter_features(T, np.zeros(3))


@st.composite
def rounds(draw, name):
    """A round: n clients, f of which hostile rows, uploads and nᵢ."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n = draw(st.integers(3 if name != "bulyan" else 3, 12))
    f = draw(st.integers(0, largest_f(name, n)))
    D = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    X = rng.normal(size=(n, D)).astype(dtype)
    bad = rng.choice(n, size=draw(st.integers(0, min(f, n))), replace=False)
    if name == "monna":
        bad = bad[bad != 0]  # MoNNA's pivot (client 0) is trusted
    for i in bad:
        kind = draw(st.sampled_from(["row", "coord", "scaled", "upload"]))
        v = draw(st.sampled_from(HOSTILE))
        if kind == "row":
            X[i] = v
        elif kind == "coord":
            X[i, rng.integers(D)] = v
        elif kind == "scaled":
            X[i] *= 1e30
    A = {"theta": (X + dtype(3)).astype(dtype), "m": rng.normal(size=(n, D)).astype(dtype),
         "v": np.abs(rng.normal(size=(n, D))).astype(dtype)}
    for i in bad:
        if draw(st.booleans()):
            A["v"][i, rng.integers(D)] = np.nan  # a hostile upload behind a harmless feature
    ns = rng.integers(1, 50, size=n)
    return X, A, ns, f


def _rule(name):
    return RFA(tol=1e-9, max_iter=300) if name == "rfa" else RULES.get(name)()


@pytest.mark.parametrize("name", RULES.names())
@settings(max_examples=15)
@given(data=st.data())
def test_backends_agree_and_invariants_hold(name, data):
    X, A, ns, f = data.draw(rounds(name))
    before = (X.copy(), {k: v.copy() for k, v in A.items()}, ns.copy())
    rule = _rule(name)
    a = rule.aggregate(X, A, ns, f, backend="numpy")
    b = rule.aggregate(X, A, ns, f, backend="numba")
    for res in (a, b):
        assert isinstance(res, AggregationResult)
        assert set(res.arrays) == set(A)
        for k in A:
            assert res.arrays[k].dtype == A[k].dtype and res.arrays[k].shape == (X.shape[1],)
        assert res.kept.shape == (X.shape[0],) and ((res.kept >= 0) & (res.kept <= 1)).all()
        if rule.coordinatewise:
            assert res.weights is None
        else:
            assert res.weights.dtype == np.float64 and (res.weights >= 0).all()
            assert res.weights.sum() == pytest.approx(1.0, abs=1e-12)
            np.testing.assert_array_equal(res.kept, (res.weights > 0).astype(float))
        json.dumps(res.diagnostics, allow_nan=False)
        if name != "mean":  # a robust rule keeps hostile values out of every array
            for k in A:
                assert np.isfinite(res.arrays[k]).all()
    for k in A:
        # rfa: the two backends may stop one Weiszfeld step apart
        atol = 1e-6 * (1 + np.abs(a.arrays[k])).max() if name == "rfa" else 0
        if name != "rfa" and a.weights is not None:
            # a weighted sum of values of both signs may cancel (CAF gave -0.0016824 and
            # -0.0016823 from values of about 1): its rounding is relative to Σ wᵢ|A[i]|
            kept = a.weights > 0
            scale = (a.weights[kept, None] * np.abs(A[k][kept].astype(np.float64))).sum(0)
            if np.isfinite(scale).all():
                atol = 64 * np.finfo(A[k].dtype).eps * float(scale.max(initial=0.0))
        np.testing.assert_allclose(b.arrays[k], a.arrays[k], rtol=1e-5, atol=atol, equal_nan=True)
    np.testing.assert_allclose(b.kept, a.kept, atol=1e-9 if name != "rfa" else 0)
    np.testing.assert_array_equal(X, before[0])
    for k in A:
        np.testing.assert_array_equal(A[k], before[1][k])
    np.testing.assert_array_equal(ns, before[2])


def _krum_iteration_ties(X, f) -> bool:
    """Whether Bulyan's iterated Krum (n − 2f steps) meets an exact tie of its lowest
    score at some step."""
    from rfrs_ref.aggregate.krum import krum_scores

    D2, _ = client_distances(X, {}, "numba")
    remaining = list(range(X.shape[0]))
    for _ in range(X.shape[0] - 2 * f):
        scores, _ = krum_scores(D2, f, np.array(remaining))
        low = sorted(scores[remaining])
        if len(low) > 1 and low[0] == low[1]:
            return True
        remaining.remove(remaining[int(np.argmin(scores[remaining]))])
    return False


def _diameter_ties(X, k) -> bool:
    """Whether two subsets of k rows of X have the smallest diameter (MDA's distances)."""
    import itertools

    D2, _ = client_distances(X, {}, "numba")
    diam = [max((D2[i, j] for i, j in itertools.combinations(S, 2)), default=0.0)
            for S in itertools.combinations(range(X.shape[0]), k)]
    return diam.count(min(diam)) > 1


@pytest.mark.parametrize("name", RULES.names())
@settings(max_examples=10)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(3, 11), D=st.integers(1, 30))
def test_invariant_to_permuting_clients(name, seed, n, D):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))  # continuous values: no ties, so no index tie-breaks
    A = {"x": X, "m": rng.normal(size=(n, D))}
    ns = rng.integers(1, 9, size=n)
    f = largest_f(name, n) // 2
    perm = rng.permutation(n)
    rule = _rule(name)
    a = rule.aggregate(X, A, ns, f)
    if name == "monna":  # the pivot is a position: it moves with its client
        rule = dataclasses.replace(rule, pivot=int(np.flatnonzero(perm == rule.pivot)[0]))
    b = rule.aggregate(X[perm], {k: v[perm] for k, v in A.items()}, ns[perm], f)
    if name == "bulyan" and _krum_iteration_ties(X, f):
        # Bulyan's last steps score each client by its one nearest neighbour, and two
        # mutual nearest neighbours have the same score: the smaller index is taken
        assert len(b.diagnostics["selected"]) == len(a.diagnostics["selected"])
        return
    if name == "mda" and _diameter_ties(X, n - f):
        # continuous values still tie here: a subset's diameter is one pair's distance,
        # shared by every subset holding that pair; the first in index order is kept,
        # so a permutation may keep another subset of the same diameter
        assert b.diagnostics["diameter"] == a.diagnostics["diameter"]
        return
    for k in A:
        np.testing.assert_allclose(b.arrays[k], a.arrays[k], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(b.kept, a.kept[perm], atol=1e-7)
    if a.weights is not None:
        np.testing.assert_allclose(b.weights, a.weights[perm], atol=1e-9)
