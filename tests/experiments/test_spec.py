"""Runs, keys, grids and TOML sweep files."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.experiments.spec import (NON_RESULT_FIELDS, Axis, RunSpec, check_unique, expand,
                                       key_payload, load_sweep, make_config, parse_sweep,
                                       run_key)
from rfrs_ref.federated.config import DEFAULT_ROUNDS, TrainConfig


def test_key_is_a_function_of_the_resolved_configuration():
    a = RunSpec(TrainConfig(dataset="ml100k"))
    b = RunSpec(TrainConfig(dataset="ml100k", rounds=DEFAULT_ROUNDS["ml100k"],
                            optimizer_params={"lr": 1e-3}, assumed_byzantine=0.0))
    assert a.key == b.key
    assert len(a.key) == 16 and int(a.key, 16) >= 0


@pytest.mark.parametrize("as_int, as_float", [
    ({"init_scale": 1}, {"init_scale": 1.0}),
    ({"byzantine_fraction": 0}, {"byzantine_fraction": 0.0}),
    ({"client_fraction": 1}, {"client_fraction": 1.0}),
    ({"assumed_byzantine": 0}, {"assumed_byzantine": 0.0}),
    ({"optimizer_params": {"lr": 1}}, {"optimizer_params": {"lr": 1.0}}),
    ({"defense": "krum", "defense_params": {"k": 2}}, {"defense": "krum", "defense_params": {"k": 2}}),
])
def test_one_configuration_has_one_key_whatever_the_number_type(as_int, as_float):
    """`--set init_scale=1` gave another key than the `init_scale = 1.0` its runs were
    recorded with: the documented command of a committed results directory found none of
    its runs. A float field (or float hyperparameter) given as an integer is that float."""
    a = RunSpec(make_config({"dataset": "ml100k", **as_int}))
    b = RunSpec(make_config({"dataset": "ml100k", **as_float}))
    assert a.key == b.key
    # an integer hyperparameter stays an integer
    assert RunSpec(make_config({"dataset": "ml100k", "defense": "krum",
                                "defense_params": {"k": 2}})).config.resolved().defense_params["k"] == 2


def test_the_committed_fig1_init_command_finds_its_runs(tmp_path):
    """docs/reproduction.md regenerates results/pca-init1 with `--set init_scale=1`."""
    import pathlib
    import shutil

    from click.testing import CliRunner

    from rfrs_ref.cli.main import main

    src = pathlib.Path(__file__).resolve().parents[2] / "results" / "pca-init1"
    out = tmp_path / "pca-init1"
    shutil.copytree(src, out)
    res = CliRunner().invoke(main, ["reproduce", "1", "--set", "init_scale=1", "--out", str(out),
                                    "--no-run", "--no-plot"])
    assert res.exit_code == 0, res.output
    assert "2 skipped (already finished)" in res.output


def test_key_ignores_labels_trial_and_non_result_fields():
    base = TrainConfig(dataset="ml100k")
    ref = RunSpec(base).key
    assert RunSpec(base, trial=3, labels={"series": "x"}).key == ref
    assert RunSpec(dataclasses.replace(base, data_dir="/elsewhere", checkpoint_every=7)).key == ref
    assert set(NON_RESULT_FIELDS) == {"data_dir", "checkpoint_every"}
    assert "data_dir" not in key_payload(RunSpec(base))["config"]


@pytest.mark.parametrize("change", [
    {"seed": 1}, {"rounds": 5}, {"backend": "numpy"}, {"optimizer_params": {"lr": 0.01}},
    {"model": "fmf"}, {"attack": "ascent", "byzantine_fraction": 0.2}, {"resilience": True},
    {"dtype": "float64"}, {"eval_every": 3},
])
def test_key_changes_with_anything_that_changes_results(change):
    base = TrainConfig(dataset="ml100k")
    assert RunSpec(dataclasses.replace(base, **change)).key != RunSpec(base).key


def test_kind_is_part_of_the_key():
    c = TrainConfig(dataset="ml100k", rounds=3)
    assert RunSpec(c, kind="capture").key != RunSpec(c).key
    with pytest.raises(ValueError, match="run kind"):
        RunSpec(c, kind="bogus")


@settings(max_examples=25)
@given(seed=st.integers(0, 2**31), lr=st.floats(1e-5, 1.0), data_dir=st.text(max_size=20),
       every=st.integers(1, 100))
def test_key_law_non_result_fields_never_matter(seed, lr, data_dir, every):
    c = TrainConfig(seed=seed, optimizer_params={"lr": lr})
    d = dataclasses.replace(c, data_dir=data_dir, checkpoint_every=every)
    assert run_key(RunSpec(c)) == run_key(RunSpec(d))
    assert run_key(RunSpec(dataclasses.replace(c, seed=seed + 1))) != run_key(RunSpec(c))


def test_json_round_trip():
    r = RunSpec(make_config({"dataset": "ml100k", "preset": "a-rfrs", "ks": [1, 3]}),
                kind="capture", trial=2, labels={"series": "A-RFRS"})
    back = RunSpec.from_json(r.to_json())
    assert back == r and back.key == r.key


def test_presets_set_defense_and_detect():
    c = make_config({"preset": "a-rfrs"})
    assert (c.defense, c.detect) == ("krum", "gradient")
    c = make_config({"preset": "no-defense"})
    assert c.defense == "none"
    with pytest.raises(ValueError, match='preset must be one of .*, got "bogus"'):
        make_config({"preset": "bogus"})
    with pytest.raises(ValueError, match="colour is not a configuration field"):
        make_config({"colour": "red"})


def test_expand_crosses_axes_last_fastest_and_trials_innermost():
    runs = expand({"dataset": "ml100k", "attack": "ascent"},
                  [Axis("byzantine_fraction", (0.2, 0.4)), Axis("preset", ("krum", "a-rfrs"))],
                  seeds=[0, 5])
    assert len(runs) == 8
    got = [(r.config.byzantine_fraction, r.labels["preset"], r.config.seed, r.trial) for r in runs]
    assert got[:4] == [(0.2, "krum", 0, 0), (0.2, "krum", 5, 1), (0.2, "a-rfrs", 0, 0),
                       (0.2, "a-rfrs", 5, 1)]
    assert got[4][0] == 0.4
    assert len(set(check_unique(runs))) == 8


def test_duplicate_runs_are_reported():
    runs = expand({"dataset": "ml100k"}, [Axis("data_dir", ("/a", "/b"))])
    with pytest.raises(ValueError, match="same key"):
        check_unique(runs)


def test_table_axis_merges_params_and_labels():
    runs = expand({"dataset": "ml100k", "optimizer_params": {"lr": 0.01}},
                  [Axis("method", ({"label": "K1", "defense": "krum", "defense_params": {"k": 1}},
                                   {"preset": "rfa"}))])
    assert runs[0].labels == {"method": "K1"}
    assert runs[0].config.defense_params == {"k": 1}
    assert runs[0].config.optimizer_params == {"lr": 0.01}
    assert runs[1].labels == {"method": "preset=rfa"}
    with pytest.raises(ValueError, match="must be tables"):
        expand({}, [Axis("method", ("krum",))])


EXAMPLE = textwrap.dedent('''
    name = "defenses-ml100k"
    trials = 3

    [base]
    dataset = "ml100k"
    rounds = 200
    attack = "ascent"
    optimizer_params = { lr = 0.001 }

    [axes]
    byzantine_fraction = [0.2, 0.3, 0.4]
    preset = ["no-defense", "krum", "rfa", "trmean", "a-rfrs"]
''')


def test_toml_sweep(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(EXAMPLE)
    sw = load_sweep(path)
    assert sw.name == "defenses-ml100k"
    assert len(sw) == 3 * 5 * 3
    assert {r.config.seed for r in sw.runs} == {0, 1, 2}
    assert all(r.config.rounds == 200 and r.config.attack == "ascent" for r in sw.runs)
    assert len(set(check_unique(list(sw.runs)))) == len(sw)


def test_toml_the_module_docstring_example_parses(tmp_path):
    from rfrs_ref.experiments import spec

    doc = spec.__doc__
    block = doc[doc.index("    name = "):doc.index("- An axis named")]
    path = tmp_path / "doc.toml"
    path.write_text(textwrap.dedent(block))
    sw = load_sweep(path)
    assert len(sw) == 3 * 3 * 3
    assert len(set(check_unique(list(sw.runs)))) == len(sw)
    assert {r.labels["method"] for r in sw.runs} == {"A-RFRS", "Krum", "Krum-1"}


@pytest.mark.parametrize("doc, message", [
    ({"trials": 2, "seeds": [1]}, "either trials"),
    ({"trials": 0}, "positive integer"),
    ({"seeds": []}, "non-empty"),
    ({"axes": {"seed": [1, 2]}}, "trials = N"),
    ({"axes": {"rounds": []}}, "non-empty list"),
    ({"bogus": 1}, "unknown top-level"),
    ({"base": {"colour": 1}}, "not a configuration field"),
    # TOML's nan and inf: no run's key or record (strict JSON) can hold them
    ({"base": {"dataset_params": {"noise": float("nan")}}},
     r"base.dataset_params.noise must be a finite number, got NaN"),
    ({"base": {"attack_params": {"scale": [1.0, float("-inf")]}}},
     r"base.attack_params.scale.1 must be a finite number, got -Infinity"),
])
def test_toml_errors_name_the_problem(doc, message):
    with pytest.raises(ValueError, match=message):
        parse_sweep(doc)


def test_toml_syntax_error_names_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("trials = \n")
    with pytest.raises(ValueError, match="bad.toml: not valid TOML"):
        load_sweep(path)


def test_every_configuration_field_has_a_check():
    """A new TrainConfig field needs its entry in the checks of sweep files and overrides."""
    from rfrs_ref.experiments import spec

    assert set(spec.CONFIG_FIELDS) == set(spec._FIELD_CHECKS) | set(spec._choices())


@pytest.mark.parametrize("name, value", [("rounds", None), ("verify", None), ("ks", [1, 10]),
                                         ("client_fraction", 1), ("byzantine_fraction", 0)])
def test_checks_accept_what_the_configuration_accepts(name, value):
    c = make_config({name: value})
    assert getattr(c, name) == (tuple(value) if isinstance(value, list) else value)


def test_a_hyperparameter_added_later_keeps_the_keys_of_the_runs_recorded_before_it():
    """RFA's ``restart`` came after runs of RFA were recorded: at its default the
    configuration's JSON leaves it out, so those runs keep their keys (and are found
    finished); set, it is written and is another run."""
    base = TrainConfig(dataset="ml100k", defense="rfa", attack="ascent", byzantine_fraction=0.4)
    off = dataclasses.replace(base, defense_params={"restart": False})
    on = dataclasses.replace(base, defense_params={"restart": True})
    assert "restart" not in base.resolved().to_json()["defense_params"]
    assert "restart" not in off.resolved().to_json()["defense_params"]
    assert on.resolved().to_json()["defense_params"]["restart"] is True
    assert RunSpec(off).key == RunSpec(base).key != RunSpec(on).key
    # left out of the JSON, it comes back at its default
    back = TrainConfig.from_json(off.resolved().to_json()).resolved()
    assert back.defense_params["restart"] is False
    assert TrainConfig.trajectory(off.resolved().to_json()) == TrainConfig.trajectory(
        base.resolved().to_json())


def test_recorded_leaves_out_only_a_later_hyperparameter_at_its_default_value_and_kind():
    from rfrs_ref.params import hyper, recorded

    @dataclasses.dataclass(frozen=True)
    class Entry:
        old: float = hyper(0.5, "recorded from the start")
        new: bool = hyper(False, "added later", absent_is_default=True)
        later: float = hyper(0.0, "added later too", absent_is_default=True)

    params = {"old": 0.5, "new": False, "later": 0.0}
    assert recorded(Entry, params) == {"old": 0.5}
    assert params == {"old": 0.5, "new": False, "later": 0.0}  # not modified
    assert recorded(Entry, {"old": 0.5, "new": True, "later": 1.0}) == {
        "old": 0.5, "new": True, "later": 1.0}
    # 0 is not False, 0 is not 0.0: a value of another kind is written as it is
    assert recorded(Entry, {"new": 0, "later": 0}) == {"new": 0, "later": 0}


@pytest.mark.parametrize("make", ["fifo", "device"])
def test_a_sweep_file_that_is_no_regular_file_is_refused_without_reading(tmp_path, make):
    # a FIFO waited for a writer for ever, and a device was read as a sweep file (/dev/null
    # as an empty one, /dev/zero until memory ran out)
    import os
    import threading

    path = tmp_path / "grid.toml"
    if make == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/null")
    result: list = []

    def load():
        try:
            load_sweep(path)
        except ValueError as exc:
            result.append(str(exc))

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive() and make == "fifo":
        with open(path, "wb"):  # release the reader blocked on the FIFO
            pass
    assert not t.is_alive() or make == "fifo", "load_sweep is still reading"
    t.join(10)
    assert result and str(path) in result[0] and "not a regular file" in result[0], result
    assert "\n" not in result[0]


@pytest.mark.parametrize("value", [
    "[" * 5000 + "]" * 5000,  # TOML's parser recursed until Python's limit
    "{a = " * 400 + "1" + "}" * 400,
])
def test_a_sweep_file_nested_too_deeply_is_one_line(tmp_path, value):
    path = tmp_path / "deep.toml"
    path.write_text(f'[base]\ndataset = "synthetic"\ndataset_params = {value}\n')
    with pytest.raises(ValueError, match=r"deep.toml: .*nested more than \d+ levels"):
        load_sweep(path)


def test_an_axis_table_nested_too_deeply_is_one_line():
    # an axis value without a label was rendered into one recursively: RecursionError
    deep: dict = {"a": 1}
    for _ in range(2000):
        deep = {"a": deep}
    doc = {"base": {"dataset": "synthetic"}, "axes": {"m": [{"dataset_params": deep}]}}
    with pytest.raises(ValueError, match=r"nested more than \d+ levels"):
        parse_sweep(doc)
