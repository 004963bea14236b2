"""The attack registry, hyperparameters, CLI options and configuration errors."""

import dataclasses

import numpy as np
import pytest

from rfrs_ref.attack import ATTACKS, Camouflage, optimizer_name
from rfrs_ref.optim import OPTIMIZERS, Adam
from rfrs_ref.params import hyperparameters, values


def test_registered_names():
    assert ATTACKS.names() == ["none", "ascent", "noise", "camouflage", "alie", "ipm", "inf",
                               "mimic", "opt-ipm", "opt-alie", "a-ra"]
    for name, cls in ATTACKS.items():
        assert cls.name == name
        assert dataclasses.is_dataclass(cls)
        assert cls.__doc__ and cls.__doc__.strip()
    assert [n for n, c in ATTACKS.items() if not c.obeys_rule] == ["noise", "inf"]


def test_hyperparameters_and_defaults():
    got = {name: values(cls()) for name, cls in ATTACKS.items()}
    assert got == {
        "none": {}, "ascent": {},
        "noise": {"sigma": 0.1},
        "camouflage": {"include_eps": True},
        "alie": {"z": 0.0, "ddof": 1, "omniscient": False},
        "ipm": {"epsilon": 0.1, "omniscient": False},
        "inf": {"value": "inf"},
        "mimic": {"index": 0},
        "opt-ipm": {"evals": 20, "start": 0.0, "delta": 10.0, "ratio": 0.8},
        "opt-alie": {"evals": 20, "start": 0.0, "delta": 10.0, "ratio": 0.8},
        "a-ra": {"targets": "", "n_targets": 1, "samples": 10, "sigma": 0.01, "hum_steps": 0,
                 "hum_lr": 1e-3},
    }
    for _, cls in ATTACKS.items():
        for h in hyperparameters(cls):
            assert h.help


def test_entries_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ATTACKS.get("noise")().sigma = 3.0


@pytest.mark.parametrize("name, kwargs, match", [
    ("noise", {"sigma": -1.0}, "sigma=-1.0"),
    ("noise", {"sigma": float("nan")}, "sigma=nan"),
    ("alie", {"z": float("inf")}, "ALIE z"),
    ("alie", {"ddof": 2}, "ddof=2"),
    ("ipm", {"epsilon": float("nan")}, "IPM epsilon"),
    ("inf", {"value": "huge"}, "value='huge'"),
    ("mimic", {"index": -1}, "index=-1"),
    ("mimic", {"index": 1.5}, "index=1.5"),
    ("opt-ipm", {"evals": 0}, "evals=0"),
    ("opt-ipm", {"delta": 0.0}, "delta=0"),
    ("opt-alie", {"ratio": 0.5}, "ratio=0.5"),
    ("opt-alie", {"start": float("inf")}, "start=inf"),
    ("a-ra", {"samples": 0}, "samples=0"),
    ("a-ra", {"n_targets": 0}, "n_targets=0"),
    ("a-ra", {"sigma": 0.0}, "sigma=0.0"),
    ("a-ra", {"hum_steps": -1}, "hum_steps=-1"),
    ("a-ra", {"hum_lr": float("nan")}, "hum_lr=nan"),
])
def test_invalid_hyperparameters_are_named(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ATTACKS.get(name)(**kwargs)


@pytest.mark.parametrize("opt", ["sgd", "momentum", "adagrad", "rmsprop"])
def test_camouflage_refuses_other_optimisers(opt, at):
    cam = Camouflage()
    for given in (opt, OPTIMIZERS.get(opt), OPTIMIZERS.get(opt)()):
        with pytest.raises(ValueError, match=rf"applies to optimiser\(s\) adam only, got optimiser '{opt}'"):
            cam.check_optimizer(given)
    # and at run time, before touching anything
    o = OPTIMIZERS.get(opt)()
    rng = np.random.default_rng(0)
    state = at.realistic_state(o, rng, 5, np.float64)
    ctx, honest = at.context(o, state, rng.standard_normal((2, 5)), [True, False], 3)
    with pytest.raises(ValueError, match="adam only"):
        cam.apply_inplace(ctx)
    for k in o.arrays:
        np.testing.assert_array_equal(ctx.uploads[k], honest[k])


def test_other_attacks_accept_every_optimiser():
    for name, cls in ATTACKS.items():
        for opt in OPTIMIZERS.names():
            if name != "camouflage":
                cls().check_optimizer(opt)
    Camouflage().check_optimizer(Adam(lr=0.1))
    Camouflage().check_optimizer("adam")


def test_optimizer_name_rejects_other_things():
    with pytest.raises(TypeError, match="expected an optimiser"):
        optimizer_name(3)


def test_cli_options_are_generated():
    from rfrs_ref.cli.train import train

    flags = {opt for p in train.params for opt in p.opts}
    for flag in ("--noise-sigma", "--camouflage-include-eps", "--alie-z", "--alie-ddof",
                 "--alie-omniscient", "--ipm-epsilon", "--ipm-omniscient", "--inf-value",
                 "--mimic-index", "--opt-ipm-evals", "--opt-ipm-start", "--opt-ipm-delta",
                 "--opt-ipm-ratio", "--opt-alie-evals", "--a-ra-targets",
                 "--a-ra-n-targets", "--a-ra-samples", "--a-ra-sigma", "--a-ra-hum-steps",
                 "--a-ra-hum-lr"):
        assert flag in flags
    choices = next(p for p in train.params if p.name == "attack").type.choices
    assert list(choices) == ATTACKS.names()
