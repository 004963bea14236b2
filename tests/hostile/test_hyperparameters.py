"""Hostile hyperparameters: a boolean where a number is expected.

Python's ``True`` and ``False`` are the integers 1 and 0, so ``Krum(k=False)`` ran as
``k = 0`` (multi-Krum) and ``Adam(lr=True)`` as ``lr = 1``: a JSON or TOML ``false``
written for a number became a number silently. Every entry of every registry refuses a
boolean for a hyperparameter whose default is a number, naming it, the value and what it
takes; hyperparameters that are flags still take ``True`` and ``False``.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from rfrs_ref.aggregate import PRE, RULES
from rfrs_ref.attack import ATTACKS
from rfrs_ref.model import MODELS
from rfrs_ref.optim import OPTIMIZERS
from rfrs_ref.params import hyperparameters

REGISTRIES = {"rule": RULES, "pre": PRE, "optimizer": OPTIMIZERS, "attack": ATTACKS, "model": MODELS}


def _entries(kind):
    """(registry family, entry name, class, extra constructor arguments, spec) for every
    hyperparameter of every registered entry whose declared type is ``kind``."""
    out = []
    for family, registry in REGISTRIES.items():
        for name, cls in registry.items():
            extra = {"n_items": 5} if family == "model" else {}
            for h in hyperparameters(cls):
                if h.type in kind:
                    out.append(pytest.param(cls, extra, h, id=f"{family}-{name}-{h.name}"))
    return out


@pytest.mark.parametrize("value", [True, False, np.True_, np.False_], ids=repr)
@pytest.mark.parametrize("cls, extra, h", _entries((int, float)))
def test_a_boolean_is_no_number_for_any_hyperparameter(cls, extra, h, value):
    cls(**extra)  # the defaults construct
    with pytest.raises(ValueError) as err:
        cls(**extra, **{h.name: value})
    msg = str(err.value)
    want = "an integer" if h.type is int else "a number"
    assert f"{h.name} must be {want}, not a boolean" in msg, msg
    assert f"{h.name}={value!r}" in msg, msg


@pytest.mark.parametrize("cls, extra, h", _entries((bool,)))
def test_a_flag_still_takes_true_and_false(cls, extra, h):
    for value in (True, False):
        assert getattr(cls(**extra, **{h.name: value}), h.name) is value


@pytest.mark.parametrize("value", [1, 0, "false", None, 1.0], ids=repr)
@pytest.mark.parametrize("cls, extra, h", _entries((bool,)))
def test_a_flag_takes_nothing_but_true_and_false(cls, extra, h, value):
    # ALIE(omniscient=1), Camouflage(include_eps="false"): a truthy value that is no flag
    with pytest.raises(ValueError) as err:
        cls(**extra, **{h.name: value})
    assert f"{h.name} must be true or false, got {h.name}={value!r}" in str(err.value)


def test_krum_k_false_and_adam_lr_true_are_refused():
    with pytest.raises(ValueError, match=r"krum k must be an integer, not a boolean: got k=False"):
        RULES.get("krum")(k=False)
    with pytest.raises(ValueError, match=r"adam lr must be a number, not a boolean: got lr=True"):
        OPTIMIZERS.get("adam")(lr=True)
    # an integer for a number is still a number, and 0 is still Krum's n − f
    assert OPTIMIZERS.get("adam")(lr=1).lr == 1
    assert RULES.get("krum")(k=0).k == 0


@pytest.mark.parametrize("option, fragment", [("k=false", "k=False"), ("k=true", "k=True")])
def test_the_conformance_command_refuses_a_boolean_rule_option(option, fragment):
    """``--rule-option k=false`` (JSON false) compared the candidate with multi-Krum."""
    from rfrs_ref.cli.main import main

    res = CliRunner().invoke(main, ["conformance", "--rule", "krum", "--callable",
                                    "rfrs_ref.aggregate:Krum", "--rule-option", option,
                                    "--law", "reference_rule", "--max-examples", "1"])
    assert res.exit_code != 0, res.output
    assert "Traceback" not in res.output
    errors = [x for x in res.output.splitlines() if x.startswith("Error")]
    assert len(errors) == 1 and "k must be an integer, not a boolean" in errors[0], res.output
    assert fragment in errors[0], errors[0]
    # a value refused, not an option unknown to the rule
    assert "krum refuses the value of ['k']" in errors[0] and "does not take" not in errors[0]


def test_the_conformance_command_still_takes_a_boolean_flag():
    from rfrs_ref.cli.main import main

    res = CliRunner().invoke(main, ["conformance", "--rule", "rfa", "--callable",
                                    "rfrs_ref.aggregate:RFA", "--option", "restart=true",
                                    "--rule-option", "restart=true", "--law", "reference_rule",
                                    "--max-examples", "1"])
    assert res.exit_code == 0, res.output


def test_a_sweep_table_takes_true_and_false_for_flags_only():
    from rfrs_ref.experiments.spec import check_params

    check_params({"defense": "rfa", "defense_params": {"restart": True}})
    with pytest.raises(ValueError, match="defense_params.k must be an integer, got false"):
        check_params({"defense": "krum", "defense_params": {"k": False}})
    with pytest.raises(ValueError, match="optimizer_params.lr must be a finite number, got true"):
        check_params({"optimizer": "adam", "optimizer_params": {"lr": True}})


@pytest.fixture(scope="module")
def krum_case(tmp_path_factory):
    from rfrs_ref import golden

    root = tmp_path_factory.mktemp("golden-krum-bool") / "vectors"
    golden.export(root, only=["aggregate/krum-gradient-f64"])
    return root


def test_a_golden_case_cannot_state_a_number_hyperparameter_as_a_boolean(krum_case, tmp_path):
    """A krum case stating ``"k": false`` recomputed multi-Krum (k = 0) and passed."""
    from rfrs_ref.cli.main import main

    name = "aggregate/krum-gradient-f64"
    root = tmp_path / "vectors"
    shutil.copytree(krum_case, root)
    path = root / name / "case.json"
    doc = json.loads(path.read_text())
    assert doc["params"]["hyperparameters"].get("k", 0) == 0
    for out in doc["outputs"].values():  # tighter than the export: allowed, and the params may differ
        out.pop("rtol", None)
        out.pop("atol", None)
        out["compare"] = "exact"
    path.write_text(json.dumps(doc))
    assert CliRunner().invoke(main, ["golden", "check", str(root)]).exit_code == 0
    doc["params"]["hyperparameters"]["k"] = False
    path.write_text(json.dumps(doc))
    res = CliRunner().invoke(main, ["golden", "check", str(root)])
    assert res.exit_code == 1, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("FAIL") and name in x)
    assert "k must be an integer, not a boolean" in line, line
