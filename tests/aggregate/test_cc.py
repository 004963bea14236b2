"""Centered clipping: known answers, its law, the state between rounds, hostile
input, backends, and ByzFL 0.0.11's CenteredClipping."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.aggregate import RULES, CenteredClipping

HOSTILE = [np.nan, np.inf, -np.inf, 1e38, -1e38, 3.4e38]
CPU = ["numpy", "numba"]


def _reference_cc(X, p, v0, tau, L):
    v = v0.astype(np.float64)
    for _ in range(L):
        diff = X.astype(np.float64) - v
        norms = np.linalg.norm(diff, axis=1)
        c = np.minimum(1.0, tau / np.where(norms > 0, norms, 1.0))
        v = v + (p * c) @ diff
    return v


@pytest.mark.parametrize("backend", CPU)
def test_known_answer_state_and_uploads(backend):
    X = np.array([[3.0, 4.0], [0.0, 1.0], [0.0, 0.0]])
    ns = np.array([1.0, 1.0, 2.0])
    theta_bar = np.array([10.0, 20.0])
    theta = theta_bar + X
    res = CenteredClipping(tau=1.0).aggregate(X, {"x": X, "theta": theta}, ns, 1, backend=backend,
                                              reference={"theta": theta_bar})
    # from v₀ = 0: (3, 4) is clipped to (0.6, 0.8); p = (¼, ¼, ½)
    expect = 0.25 * np.array([0.6, 0.8]) + 0.25 * np.array([0.0, 1.0])
    np.testing.assert_allclose(res.arrays["x"], expect, rtol=1e-15)
    np.testing.assert_allclose(res.state["cc_center"], expect, rtol=1e-15)
    # the centre's share goes to θ̄: θ̄ᵗ − θ̄ = Σ wᵢ(θᵢ − θ̄) = v − a·v₀ (v₀ = 0 here)
    np.testing.assert_allclose(res.arrays["theta"] - theta_bar, expect, rtol=1e-14)
    a = res.diagnostics["center_weight"]
    np.testing.assert_allclose(a, 1 - (0.25 * 0.2 + 0.25 + 0.5), rtol=1e-15)
    # the next round starts from the returned state
    res2 = CenteredClipping(tau=1.0).aggregate(X, {"x": X}, ns, 1, backend=backend,
                                               rule_state=res.state)
    np.testing.assert_allclose(res2.arrays["x"], _reference_cc(X, ns / 4, expect, 1.0, 1), rtol=1e-14)


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.integers(1, 9), st.integers(0, 4), st.integers(1, 6), st.data())
def test_law_byzantine_pull_at_most_tau_times_their_share(seed, n_honest, f, D, data):
    """With L = 1, replacing the Byzantine rows by the centre (no vote) moves the
    aggregate by at most τ·Σ_B pᵢ; every iteration moves the centre by at most τ."""
    rng = np.random.default_rng(seed)
    n = n_honest + f
    X = rng.normal(size=(n, D)) * rng.choice([1e-2, 1.0, 1e2])
    v0 = rng.normal(size=D)
    byz = rng.permutation(n)[:f]
    for i in byz:
        X[i] = data.draw(st.sampled_from(HOSTILE + [5.0, -7.0]))
    ns = rng.integers(1, 9, size=n).astype(float)
    tau = data.draw(st.sampled_from([1e-2, 1.0, 10.0]))
    L = data.draw(st.integers(1, 3))
    backend = data.draw(st.sampled_from(CPU))
    rule = CenteredClipping(tau=tau, iterations=L)
    res = rule.aggregate(X, {"x": X}, ns, f, backend=backend, rule_state={"cc_center": v0})
    assert np.isfinite(res.arrays["x"]).all()
    assert all(m <= tau * (1 + 1e-12) for m in res.diagnostics["moves"])
    if L == 1:
        Xh = X.copy()
        Xh[byz] = v0
        clean = rule.aggregate(Xh, {"x": Xh}, ns, f, backend=backend, rule_state={"cc_center": v0})
        share = ns[byz].sum() / ns.sum()
        assert np.linalg.norm(res.state["cc_center"] - clean.state["cc_center"]) <= tau * share * (1 + 1e-9) + 1e-12


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(1, 300), st.data())
def test_backends_agree_with_a_plain_reference(seed, n, D, data):
    rng = np.random.default_rng(seed)
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    X = (rng.normal(size=(n, D)) * 3).astype(dtype)
    v0 = rng.normal(size=D)
    ns = rng.integers(1, 9, size=n).astype(float)
    tau, L = data.draw(st.sampled_from([0.5, 5.0, 100.0])), data.draw(st.integers(1, 4))
    a = CenteredClipping(tau=tau, iterations=L).aggregate(X, {"x": X}, ns, 0, backend="numpy",
                                                          rule_state={"cc_center": v0})
    b = CenteredClipping(tau=tau, iterations=L).aggregate(X, {"x": X}, ns, 0, backend="numba",
                                                          rule_state={"cc_center": v0})
    ref = _reference_cc(X, ns / ns.sum(), v0, tau, L)
    np.testing.assert_allclose(a.state["cc_center"], ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(b.state["cc_center"], a.state["cc_center"], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("backend", CPU)
def test_hostile_rows_do_not_move_the_centre(backend):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(9, 4)).astype(np.float32)
    X[[1, 2, 3, 4, 5]] = np.nan  # more than half: still no effect
    m = rng.normal(size=(9, 4)).astype(np.float32)
    m[7, 0] = np.inf  # a hostile upload behind a harmless feature
    res = CenteredClipping(tau=1.0).aggregate(X, {"x": X, "m": m}, np.ones(9), 2, backend=backend,
                                              reference={"m": np.zeros(4, np.float32)})
    assert np.isfinite(res.arrays["x"]).all() and np.isfinite(res.arrays["m"]).all()
    assert res.weights[[1, 2, 3, 4, 5, 7]].max() == 0
    X[0] = 3.4e38  # clipped to τ like any other row
    res = CenteredClipping(tau=1.0).aggregate(X, {"x": X}, np.ones(9), 2, backend=backend)
    assert np.linalg.norm(res.arrays["x"].astype(np.float64)) <= 1.0 + 1e-6


def test_hyperparameters_and_registration():
    assert "cc" in RULES.names()
    with pytest.raises(ValueError, match="cc tau must be a finite number > 0"):
        CenteredClipping(tau=0.0)
    with pytest.raises(ValueError, match="cc iterations must be an integer ≥ 1"):
        CenteredClipping(iterations=0)
    with pytest.raises(ValueError, match=r"centre must be a finite \(3,\) array"):
        CenteredClipping().aggregate(np.ones((4, 3)), {}, np.ones(4), 0,
                                     rule_state={"cc_center": np.full(3, np.nan)})


@pytest.mark.crosscheck
@pytest.mark.parametrize("seed", range(5))
def test_byzfl_centered_clipping_agrees_with_equal_weights_over_rounds(byzfl_aggregators, seed):
    """ByzFL's object keeps its centre between calls (from 0), ours passes it as state."""
    rng = np.random.default_rng(seed)
    theirs = byzfl_aggregators.CenteredClipping(L=2, tau=1.5)
    state = None
    for _ in range(3):
        X = rng.normal(size=(8, 6)) * 2
        ours = CenteredClipping(tau=1.5, iterations=2).aggregate(X, {"x": X}, np.full(8, 3), 0,
                                                                 rule_state=state)
        np.testing.assert_allclose(ours.arrays["x"], theirs(X), rtol=1e-12)
        state = ours.state
