"""Known answers of the five rules, their hyperparameters, registry and argument checks."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from rfrs_ref.optim import (
    OPTIMIZERS, SGD, AdaGrad, Adam, Momentum, RMSProp, Verdict, from_options,
)
from rfrs_ref.params import hyperparameters

SPEC_DEFAULTS = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "beta3": 0.9, "beta4": 0.99}


def test_registry_names_and_uploaded_arrays():
    assert OPTIMIZERS.names() == ["sgd", "momentum", "adam", "adagrad", "rmsprop"]
    expected = {"sgd": ("theta",), "momentum": ("m", "theta"), "adam": ("m", "v", "theta"),
                "adagrad": ("r", "theta"), "rmsprop": ("r", "theta")}
    for name, cls in OPTIMIZERS.items():
        assert cls.name == name
        assert cls.arrays == expected[name]
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen


def test_hyperparameters_share_name_default_and_help_across_optimisers():
    seen = {}
    for _, cls in OPTIMIZERS.items():
        for h in hyperparameters(cls):
            assert h.default == SPEC_DEFAULTS[h.name], (cls.name, h.name)
            assert seen.setdefault(h.name, (h.default, h.help)) == (h.default, h.help)
    assert set(seen) == set(SPEC_DEFAULTS)
    assert {h.name for h in hyperparameters(Adam)} == {"lr", "beta1", "beta2", "eps"}
    assert {h.name for h in hyperparameters(Momentum)} == {"lr", "beta3"}
    assert {h.name for h in hyperparameters(RMSProp)} == {"lr", "beta4", "eps"}


def test_from_options_takes_the_optimisers_own_fields():
    opt = from_options("momentum", {"lr": 0.1, "beta3": 0.5, "beta1": 0.3, "eps": 1e-6})
    assert opt == Momentum(lr=0.1, beta3=0.5)
    with pytest.raises(ValueError, match="betaa"):
        from_options("adam", {"betaa": 0.1})


@pytest.mark.parametrize("bad", [
    (SGD, {"lr": 0.0}), (SGD, {"lr": math.inf}), (Adam, {"beta1": 1.0}), (Adam, {"beta2": -0.1}),
    (Adam, {"eps": 0.0}), (Momentum, {"beta3": 1.5}), (RMSProp, {"beta4": 1.0}),
    (AdaGrad, {"eps": -1e-8}),
])
def test_invalid_hyperparameters_are_refused_by_name(bad):
    cls, kw = bad
    (key, value), = kw.items()
    with pytest.raises(ValueError, match=f"{key}.*{value}"):
        cls(**kw)


def test_round_number_starts_at_one():
    opt = Adam()
    st = opt.init(np.zeros(3))
    with pytest.raises(ValueError, match="t=0"):
        opt.client_rule(st, np.ones(3), 0)
    with pytest.raises(TypeError, match="integer"):
        opt.client_rule(st, np.ones(3), 1.5)


def test_sgd_known_answer():
    st = SGD(lr=0.5).init(np.array([1.0, -2.0, 0.0]))
    up = SGD(lr=0.5).client_rule(st, np.array([2.0, 1.0, -4.0]), 7)
    np.testing.assert_array_equal(up["theta"], [0.0, -2.5, 2.0])


def test_momentum_two_rounds_by_hand():
    opt = Momentum(lr=0.1, beta3=0.5)
    st = opt.init(np.array([1.0, 1.0]))
    up1 = opt.client_rule(st, np.array([1.0, -2.0]), 1)  # m = g
    np.testing.assert_allclose(up1["m"], [1.0, -2.0])
    np.testing.assert_allclose(up1["theta"], [0.9, 1.2])
    up2 = opt.client_rule(up1, np.array([0.0, 4.0]), 2)  # m = 0.5·m̄ + g
    np.testing.assert_allclose(up2["m"], [0.5, 3.0])
    np.testing.assert_allclose(up2["theta"], [0.85, 0.9])


def test_adam_first_round_by_hand():
    opt = Adam(lr=1e-3)
    st = opt.init(np.array([1.0, 1.0, 1.0]))
    g = np.array([2.0, -0.5, 0.0])
    up = opt.client_rule(st, g, 1)
    lr_1 = 1e-3 * math.sqrt(1 - 0.999) / (1 - 0.9)
    assert opt.step_size(1) == pytest.approx(lr_1, rel=1e-15)
    for k, gk in enumerate(g):
        m, v = 0.1 * gk, 0.001 * gk * gk
        assert up["m"][k] == pytest.approx(m, rel=1e-15)
        assert up["v"][k] == pytest.approx(v, rel=1e-15)
        assert up["theta"][k] == pytest.approx(1.0 - lr_1 * m / (math.sqrt(v) + 1e-8), rel=1e-15)
    # the bias correction makes the first step η·sign(g), up to ε
    np.testing.assert_allclose(up["theta"], 1.0 - 1e-3 * np.sign(g), rtol=0, atol=1e-9)


def test_adam_step_size_tends_to_lr_and_uses_the_global_round():
    opt = Adam(lr=2e-3)
    assert opt.step_size(10**7) == pytest.approx(2e-3, rel=1e-12)
    assert opt.step_size(10) == pytest.approx(
        2e-3 * math.sqrt(1 - 0.999**10) / (1 - 0.9**10), rel=1e-13)


def test_adagrad_and_rmsprop_first_round_steps():
    g = np.array([3.0, -1e-3, 0.0])
    st = {"r": np.zeros(3), "theta": np.zeros(3)}
    up = AdaGrad(lr=1e-2, eps=1e-12).client_rule(st, g, 1)
    np.testing.assert_allclose(up["r"], g * g)
    np.testing.assert_allclose(up["theta"], -1e-2 * np.sign(g), rtol=1e-8, atol=0)
    up = RMSProp(lr=1e-2, beta4=0.99, eps=1e-12).client_rule(st, g, 1)
    np.testing.assert_allclose(up["r"], 0.01 * g * g)
    np.testing.assert_allclose(up["theta"], -1e-2 * np.sign(g) / math.sqrt(0.01), rtol=1e-7)


@pytest.mark.parametrize("name", OPTIMIZERS.names())
def test_init_zero_moments_and_copied_theta(name):
    opt = OPTIMIZERS.get(name)()
    theta0 = np.arange(4, dtype=np.float32)
    st = opt.init(theta0)
    assert set(st) == set(opt.arrays)
    assert st["theta"] is not theta0 and np.array_equal(st["theta"], theta0)
    for k in opt.arrays:
        assert st[k].dtype == np.float32
        if k != "theta":
            assert not st[k].any()


@pytest.mark.parametrize("name", OPTIMIZERS.names())
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_inputs_are_not_modified(name, backend, rng):
    opt = OPTIMIZERS.get(name)()
    D, n = 50, 3
    st = {k: np.abs(rng.standard_normal(D)) for k in opt.arrays}
    G = rng.standard_normal((n, D))
    copies = {k: v.copy() for k, v in st.items()}, G.copy()
    out = {k: np.empty((n, D)) for k in opt.arrays}
    opt.client_rule_batch(st, G, 2, out, backend=backend)
    ups = {k: v.copy() for k, v in out.items()}
    X = np.empty((n, D))
    opt.recover_batch(st, out, 2, X, backend=backend)
    opt.verify_batch(st, out, 2, recovered=X, backend=backend)
    opt.verify(st, {k: out[k][0] for k in opt.arrays}, 2)
    for k in opt.arrays:
        np.testing.assert_array_equal(st[k], copies[0][k])
        np.testing.assert_array_equal(out[k], ups[k])
    np.testing.assert_array_equal(G, copies[1])


def test_batch_argument_errors_name_the_problem():
    opt = Adam()
    st = opt.init(np.zeros(5))
    out = {k: np.empty((3, 5)) for k in opt.arrays}
    with pytest.raises(ValueError, match=r"shape \(n, 5\)"):
        opt.client_rule_batch(st, np.zeros((3, 4)), 1, out)
    with pytest.raises(KeyError, match="'v'"):
        opt.client_rule_batch(st, np.zeros((3, 5)), 1, {"m": out["m"], "theta": out["theta"]})
    with pytest.raises(ValueError, match="distinct"):
        opt.client_rule_batch(st, np.zeros((2, 5)), 1, out, rows=[1, 1])
    with pytest.raises(ValueError, match="0..2"):
        opt.client_rule_batch(st, np.zeros((1, 5)), 1, out, rows=[3])
    with pytest.raises(ValueError, match="'opencl'"):
        opt.client_rule_batch(st, np.zeros((3, 5)), 1, out, backend="opencl")
    with pytest.raises(ValueError, match="read-only"):
        ro = {k: v.copy() for k, v in out.items()}
        ro["v"].flags.writeable = False
        opt.client_rule_batch(st, np.zeros((3, 5)), 1, ro)


def test_verdict_is_reported_by_check_name():
    opt = Adam()
    st = opt.init(np.zeros(2))
    up = opt.client_rule(st, np.array([1.0, 2.0]), 1)
    v = opt.verify(st, up, 1)
    assert isinstance(v, Verdict) and v.ok and v.check is None and v.violation <= 1
    assert set(v.ratios) == set(opt.checks)
