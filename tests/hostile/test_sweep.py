"""Hostile sweep files: every path or name read from a sweep file stays in its folder, and
every bad value is refused, before anything runs, with one line naming the file, the key
and the value."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main
from rfrs_ref.experiments.spec import load_sweep, parse_sweep

#: a sweep that runs in well under a second per run (synthetic, 2 rounds)
TINY = textwrap.dedent('''
    [base]
    dataset = "synthetic"
    dataset_params = { n_users = 60, n_items = 40, mean_items = 8.0 }
    client_fraction = 0.2
    rounds = 2
''')


def sweep_cli(*args):
    """Run ``rfrs-ref sweep ARGS``; exceptions other than click's exits propagate (a traceback
    would fail the test)."""
    res = CliRunner().invoke(main, ["sweep", *args], catch_exceptions=False)
    return res.exit_code, res.output


def assert_one_line_error(code: int, output: str, *parts: str) -> None:
    assert code != 0, output
    assert "Traceback" not in output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    for part in parts:
        assert part in lines[0], (part, output)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory holding a finished-looking sweep ``x`` beside results/."""
    monkeypatch.chdir(tmp_path)
    for folder in ("x", "results/old"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "summary.md").write_text("precious summary\n")
        (tmp_path / folder / "results.csv").write_text("precious,table\n")
    return tmp_path


def snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("name", ["../x", "../../x", "results/../x", "/tmp/x", "..", ".",
                                  ".hidden", "a/b", "a\\b", "", "x\u0000y", "é" * 200])
def test_name_leading_out_of_results_is_refused(workdir, name):
    (workdir / "grid.toml").write_text(f"name = {json.dumps(name)}\n" + TINY)
    before = snapshot(workdir)
    code, out = sweep_cli("grid.toml", "--workers", "0")
    assert_one_line_error(code, out, "grid.toml", "name must be a plain folder name",
                          json.dumps(name)[:40])
    assert snapshot(workdir) == before


def test_name_from_the_file_name_is_checked_too(workdir):
    (workdir / "...toml").write_text(TINY)  # its stem is ".."
    before = snapshot(workdir)
    code, out = sweep_cli("...toml", "--workers", "0")
    assert_one_line_error(code, out, "...toml", "name = ...")
    assert snapshot(workdir) == before and not (workdir / "summary.md").exists()


def test_a_plain_name_still_runs_into_results(workdir):
    (workdir / "grid.toml").write_text('name = "tiny-1"\n' + TINY)
    code, out = sweep_cli("grid.toml", "--workers", "0")
    assert code == 0, out
    assert (workdir / "results" / "tiny-1" / "summary.md").is_file()
    assert (workdir / "x" / "summary.md").read_text() == "precious summary\n"


@pytest.mark.parametrize("value, why", [
    ("/etc", "not absolute"), ("../data", "no '..'"), ("a/../../b", "no '..'"),
    ("~/data", "not absolute"), ("", "non-empty"), (3, "non-empty relative path"),
])
def test_data_dir_must_stay_in_the_sweep_folder(workdir, value, why):
    (workdir / "grid.toml").write_text(TINY + f"data_dir = {json.dumps(value)}\n")
    code, out = sweep_cli("grid.toml", "--dry-run")
    assert_one_line_error(code, out, "grid.toml", "base.data_dir", why)


def test_data_dir_leaving_through_a_symlink_is_refused(workdir):
    os.symlink("/", workdir / "escape")
    (workdir / "grid.toml").write_text(TINY + 'data_dir = "escape/etc"\n')
    code, out = sweep_cli("grid.toml", "--dry-run")
    assert_one_line_error(code, out, "base.data_dir", "symbolic link")


def test_data_dir_in_an_axis_table_is_checked(workdir):
    (workdir / "grid.toml").write_text(
        TINY + '[axes]\nm = [{ label = "a", data_dir = "../elsewhere" }]\n')
    code, out = sweep_cli("grid.toml", "--dry-run")
    assert_one_line_error(code, out, "axes.m[0].data_dir", "../elsewhere")


def test_relative_data_dir_is_resolved_against_the_sweep_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "grid.toml"
    path.write_text(TINY + 'data_dir = "datasets"\n')
    sw = load_sweep(path)
    assert {r.config.data_dir for r in sw.runs} == {str((tmp_path / "sub" / "datasets").resolve())}
    from rfrs_ref.experiments.spec import confine

    assert confine("a/b", None, "x") == "a/b"


@pytest.mark.parametrize("body, message", [
    ('[base]\nrounds = "ten"', 'base.rounds must be a positive integer, got "ten"'),
    ("[base]\nrounds = 0", "base.rounds must be a positive integer, got 0"),
    ("[base]\nrounds = 2.5", "base.rounds must be a positive integer, got 2.5"),
    ("[base]\nrounds = true", "base.rounds must be a positive integer, got true"),
    ('[base]\nclient_fraction = "0.1"', 'base.client_fraction must be a number in (0, 1]'),
    ("[base]\nclient_fraction = nan", "base.client_fraction must be a number in (0, 1], got NaN"),
    ("[base]\nbyzantine_fraction = 1.0", "base.byzantine_fraction must be a number in [0, 1)"),
    ("[base]\ninit_scale = -inf", "base.init_scale must be a finite non-negative number"),
    ("[base]\nks = []", "base.ks must be a non-empty list of positive integers"),
    ('[base]\nks = [1, "5"]', "base.ks must be a non-empty list of positive integers"),
    ('[base]\nresilience = "yes"', 'base.resilience must be true or false, got "yes"'),
    ("[base]\neval_every = -1", "base.eval_every must be a positive integer, got -1"),
    ("[base]\ncheckpoint_every = 0", "base.checkpoint_every must be a positive integer"),
    ("[base]\nseed = -3", "base.seed must be a non-negative integer, got -3"),
    ("[base]\ndataset = 3", "base.dataset must be one of"),
    ('[base]\ndataset = "ml100"', "did you mean 'ml100k'?"),
    ('[base]\nbackend = "gpu"', 'base.backend must be one of numpy, numba, cuda, got "gpu"'),
    ('[base]\ndtype = "float16"', "base.dtype must be one of float32, float64"),
    ('[base]\ndetect = "params"', "base.detect must be one of gradient, parameter"),
    ('[base]\npreset = "krumm"', "did you mean 'krum'?"),
    ("[base]\nroundz = 3", "base.roundz is not a configuration field (did you mean 'rounds'?)"),
    # a hyperparameter where a field goes: the table it belongs in is named
    ("[base]\nlr = 0.01", "base.lr is not a configuration field ('lr' is a hyperparameter of "
     "sgd, momentum, adam, adagrad, rmsprop: set it in optimizer_params, e.g. "
     "optimizer_params = { lr = ... })"),
    ("[axes]\nlr = [0.1, 0.01]", "axes.lr is not a configuration field ('lr' is a "
     "hyperparameter of sgd, momentum, adam, adagrad, rmsprop: set it in optimizer_params, "
     "e.g. optimizer_params = [{ lr = ... }, { lr = ... }])"),
    ("[base]\noptimizer_params = 3", "base.optimizer_params must be a table"),
    ('[base]\noptimizer_params = { lr = "big" }', "base.optimizer_params.lr must be a finite"),
    ("[base]\noptimizer_params = { lr = inf }", "base.optimizer_params.lr must be a finite"),
    ('[base]\noptimizer = "sgd"\noptimizer_params = { beta1 = 0.9 }',
     "base.optimizer_params.beta1: optimizer 'sgd' has no hyperparameter 'beta1'"),
    ("[base]\ndefense = \"krum\"\ndefense_params = { k = 1.5 }",
     "base.defense_params.k must be an integer, got 1.5"),
    ('[base]\ndefense = "krum"\ndefense_params = { fallback = "panic" }',
     "base.defense_params.fallback must be one of"),
    ("[base]\nattack = \"ipm\"\nattack_params = { omniscient = 1 }",
     "base.attack_params.omniscient must be true or false, got 1"),
    ("[base]\ndataset_params = { n_user = 5 }", "did you mean 'n_users'?"),
    ('trials = "3"', 'trials must be a positive integer, got "3"'),
    ("trials = true", "trials must be a positive integer, got true"),
    ("trials = -1", "trials must be a positive integer, got -1"),
    ('seeds = [1, "2"]', "seeds must be a non-empty list of non-negative integers"),
    ("seeds = 4", "seeds must be a non-empty list of non-negative integers, got 4"),
    ('kind = "capturee"', "kind must be one of train, capture, got \"capturee\""),
    ("trails = 3", "unknown top-level key 'trails' (did you mean 'trials'?)"),
    ("base = 3", "base must be a table"),
    ("axes = [1]", "axes must be a table"),
    ("[axes]\nrounds = 3", "axes.rounds must be a non-empty list, got 3"),
    ('[axes]\nrounds = [3, "x"]', 'axes.rounds[1] must be a positive integer, got "x"'),
    ('[axes]\nm = [{ label = "a", defense = "krumm" }]', "axes.m[0].defense must be one of"),
    ('[axes]\nm = [{ label = "a", roundz = 1 }]', "axes.m[0].roundz is not a configuration"),
    ("[axes]\nm = [{ label = [1] }]", "axes.m[0].label must be a string"),
    ('[axes]\nmethod = ["krum"]', "axes.method is not a configuration field"),
    ('[axes]\noptimizer = ["sgd"]\n[base]\noptimizer_params = { beta2 = 0.9 }',
     "base.optimizer_params.beta2: optimizer 'sgd' has no hyperparameter"),
    # a count too large to build is refused before any run is (it was a MemoryError)
    ("trials = 9223372036854775807", "trials must be at most 100,000"),
    ("trials = 400\n[axes]\nrounds = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n"
     "init_scale = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, "
     "1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6]",
     "the sweep holds more than 100,000 runs"),
    # two values of an axis with one label are two configurations drawn as one series
    ('[axes]\nm = [{ label = "a", rounds = 2 }, { label = "a", rounds = 3 }]',
     'axes.m[1] has the label "a" of axes.m[0]'),
    ('[axes]\nm = [{ label = "1", rounds = 2 }, { label = 1, rounds = 3 }]',
     'axes.m[1] has the label "1" of axes.m[0]'),
    # runs that would stop before their first round (they were recorded as failed runs)
    ("[base]\nks = [1001]", "K must be an integer in 1..1000 (the number of items), got 1001"),
    ('[base]\ndataset = "ml100k"\nks = [1, 1683]', "K must be an integer in 1..1682"),
    ('[base]\ndataset_params = { n_users = 40, n_items = 50 }\nclient_fraction = 0.2\n'
     'defense = "krum"\nattack = "ascent"\n[axes]\nbyzantine_fraction = [0.2, 0.45]',
     "krum needs n > 2f + 2, but n=8 and f=3"),
])
def test_every_value_is_checked_before_anything_runs(workdir, body, message):
    (workdir / "grid.toml").write_text(body + "\n")
    before = snapshot(workdir)
    # the file is checked before the dry run's listing, as before a real run
    code, out = sweep_cli("grid.toml", "--dry-run")
    assert_one_line_error(code, out, "grid.toml: ", message)
    assert snapshot(workdir) == before
    assert not (workdir / "results" / "grid").exists()


def test_values_are_checked_by_the_library_too():
    with pytest.raises(ValueError, match='base.rounds must be a positive integer, got "ten"'):
        parse_sweep({"base": {"rounds": "ten"}})


def test_a_sweep_file_that_is_not_text(workdir):
    (workdir / "grid.toml").write_bytes(b"\xff\xfe\x00name")
    code, out = sweep_cli("grid.toml", "--dry-run")
    assert_one_line_error(code, out, "grid.toml", "not valid TOML")


def test_a_sweep_file_that_is_a_directory(workdir):
    (workdir / "grid.toml").mkdir()
    code, out = sweep_cli("grid.toml", "--dry-run")
    assert code != 0 and "Traceback" not in out and "grid.toml" in out


def test_reproduce_overrides_are_checked_before_anything_is_written(workdir):
    res = CliRunner().invoke(main, ["reproduce", "10", "--quick", "--set", 'rounds="ten"',
                                    "--workers", "0", "--no-plot", "--out", "o"],
                             catch_exceptions=False)
    assert res.exit_code != 0
    assert "Traceback" not in res.output
    assert res.output.strip().splitlines()[-1] == \
        'Error: override: rounds must be a positive integer, got "ten"'
    assert not (workdir / "o").exists()
    # a hyperparameter given as a field: the --set that sets it is shown
    res = CliRunner().invoke(main, ["reproduce", "10", "--quick", "--set", "lr=0.01",
                                    "--workers", "0", "--no-plot", "--out", "o"],
                             catch_exceptions=False)
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert "override: lr is not a configuration field ('lr' is a hyperparameter of sgd, " \
           "momentum, adam, adagrad, rmsprop: set it in optimizer_params, e.g. --set " \
           """'optimizer_params={"lr": ...}')""" in res.output.strip().splitlines()[-1]
    assert not (workdir / "o").exists()


def test_a_run_that_cannot_start_is_refused_before_anything_is_written(tmp_path):
    """The library's sweep (and so ``reproduce``) checks each run's K and its rule's n and f
    against the dataset's size before it writes anything, as the trainer would in each run."""
    from rfrs_ref.experiments.spec import make_config
    from rfrs_ref.experiments.sweep import run_sweep

    fields = {"dataset": "synthetic", "dataset_params": {"n_users": 40, "n_items": 50},
              "client_fraction": 0.2, "rounds": 1, "attack": "ascent"}
    fine = make_config({**fields, "byzantine_fraction": 0.2, "defense": "krum"})
    krum = make_config({**fields, "byzantine_fraction": 0.45, "defense": "krum"})
    with pytest.raises(ValueError, match=r"(?s)nothing was run:.*krum needs n > 2f \+ 2, but n=8"):
        run_sweep([fine, krum], tmp_path / "out", workers=0)
    big_k = make_config({**fields, "ks": (5, 51)})
    with pytest.raises(ValueError, match="(?s)nothing was run:.*got 51"):
        run_sweep([big_k], tmp_path / "out", workers=0)
    assert not (tmp_path / "out").exists()
    # with a fallback the rule never refuses a round: such a run is not refused either
    fallback = make_config({**fields, "byzantine_fraction": 0.45, "defense": "krum",
                            "defense_params": {"fallback": "reduce-f"}})
    from rfrs_ref.experiments.sweep import check_feasible

    check_feasible(fallback)


TINY_FIELDS = {"dataset": "synthetic", "dataset_params": {"n_users": 40, "n_items": 30},
               "client_fraction": 0.25, "rounds": 1}


def test_runs_the_summary_would_merge_get_the_columns_that_tell_them_apart(tmp_path):
    """Two runs with the same labels and the same columns shown in summary.md but another
    learning rate (or pre-aggregator) were one row of summary.md, as if they were two trials
    of one configuration: the Markdown summary now adds the columns in which they differ,
    and summary.csv records the pre-aggregators."""
    from rfrs_ref.experiments.spec import RunSpec, make_config
    from rfrs_ref.experiments.sweep import run_sweep

    configs = [make_config({**TINY_FIELDS, "optimizer_params": {"lr": 0.01}}),
               make_config({**TINY_FIELDS, "optimizer_params": {"lr": 0.02}}),
               make_config({**TINY_FIELDS, "defense": "median", "optimizer_params": {"lr": 0.01}}),
               make_config({**TINY_FIELDS, "defense": "median", "pre": ["nnm"],
                            "optimizer_params": {"lr": 0.01}})]
    runs = [RunSpec(c, labels={"m": "a"}) for c in configs]
    run_sweep(runs, tmp_path / "out", workers=0, threads=1)
    md = (tmp_path / "out" / "summary.md").read_text()
    table = md.split("\n\n")[0].splitlines()
    head, rows = table[0], [r for r in table[2:] if "popularity" not in r]
    assert "optimizer_params" in head and "pre" in head, head
    assert len(rows) == 4 and len(set(rows)) == 4, md
    # one popularity row: the learning rate and the pre-aggregator do not change it
    assert sum("popularity" in r for r in table[2:]) == 1, md
    import pandas as pd

    summary = pd.read_csv(tmp_path / "out" / "summary.csv")
    model = ~summary["metric"].str.startswith("popularity_")
    assert set(summary.loc[model, "pre"]) == {"[]", '["nnm"]'}
    # summary.csv too has the popularity ranking once: its rows leave the model's columns empty
    assert summary.loc[~model, "pre"].isna().all()
    assert len(summary[~model]) == len(summary[model]) // 4
    # trials of one configuration (the seed alone differs) are still one row
    out2 = tmp_path / "out2"
    trials = [RunSpec(make_config({**TINY_FIELDS, "seed": s}), trial=s, labels={"m": "a"})
              for s in (0, 1)]
    run_sweep(trials, out2, workers=0, threads=1)
    table = (out2 / "summary.md").read_text().split("\n\n")[0].splitlines()
    assert [r for r in table[2:] if "popularity" not in r][0].endswith("| 2 |")


def test_every_label_is_a_column_of_the_summary(tmp_path):
    """Labels left out of ``label_columns`` were not shown in summary.md, so runs told apart
    by them alone were one row: every label is now a column there."""
    from rfrs_ref.experiments.spec import RunSpec, make_config
    from rfrs_ref.experiments.sweep import run_sweep

    runs = [RunSpec(make_config({**TINY_FIELDS, "optimizer_params": {"lr": lr}}),
                    labels={"m": name}) for name, lr in (("a", 0.01), ("b", 0.02))]
    report = run_sweep(runs, tmp_path / "out", workers=0, threads=1)
    assert report.label_columns == ("label_m",)
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| A-FRS | a |" in md and "| A-FRS | b |" in md, md


def test_a_label_with_a_pipe_stays_in_its_cell(tmp_path):
    from rfrs_ref.experiments.spec import RunSpec, make_config
    from rfrs_ref.experiments.sweep import run_sweep

    runs = [RunSpec(make_config({**TINY_FIELDS, "optimizer_params": {"lr": lr}}),
                    labels={"m": name}) for name, lr in (("a|b", 0.01), ("c", 0.02))]
    run_sweep(runs, tmp_path / "out", workers=0, threads=1)
    rows = [r for r in (tmp_path / "out" / "summary.md").read_text().splitlines()
            if r.startswith("| A-FRS |")]
    assert rows and all(r.replace("\\|", "").count("|") == rows[0].replace("\\|", "").count("|")
                        for r in rows)
    assert any("| a\\|b |" in r for r in rows), rows


@pytest.mark.parametrize("axis, message", [
    ('m = [{ label = "x\\ny", rounds = 3 }]', 'axes.m[0].label'),
    ('m = [{ label = "ok", rounds = 2 }, { label = "a\\tb", rounds = 3 }]', 'axes.m[1].label'),
    ('m = [{ label = "x\\u2028y", rounds = 3 }]', 'axes.m[0].label'),
    ('"m\\rn" = [{ label = "x", rounds = 3 }]', 'axes.m\\rn'),
])
def test_a_label_with_a_control_character_is_refused(workdir, axis, message):
    """A label is a cell of summary.md's rows and of the tables: a newline in one broke the
    row in two. Labels (and axis names, the label columns' names) with control characters
    are refused in one line naming the axis and the value."""
    (workdir / "s.toml").write_text(TINY + "[axes]\n" + axis + "\n")
    code, output = sweep_cli("s.toml", "--out", "o", "--workers", "0")
    assert_one_line_error(code, output, "s.toml", message, "control character")
    assert not (workdir / "o").exists()


def test_a_run_label_with_a_control_character_is_refused_by_the_library():
    from rfrs_ref.experiments.spec import RunSpec, make_config

    with pytest.raises(ValueError, match=r'label m of a run must not hold a control '
                                         r'character .*, got "x\\ny"$'):
        RunSpec(make_config(TINY_FIELDS), labels={"m": "x\ny"})


@pytest.mark.parametrize("table, name", [("model_params", "dim"),
                                         ("dataset_params", "n_users")])
def test_a_run_no_machine_could_hold_is_refused_by_sweep_and_reproduce(workdir, table, name):
    """Such a run was listed by --dry-run at ~84,855,022,739,064 GB and recorded as failed:
    sweep files, --dry-run and reproduce --set now refuse it before anything is written,
    naming the field, its value and the limit."""
    huge = 9223372036854775807
    base = TINY.replace("n_users = 60", f"n_users = {huge}") if table == "dataset_params" \
        else TINY.replace("[base]\n", f"[base]\n{table} = {{ {name} = {huge} }}\n")
    (workdir / "s.toml").write_text(base)
    for extra in ([], ["--dry-run"]):
        code, output = sweep_cli("s.toml", "--out", "o", "--workers", "0", *extra)
        assert_one_line_error(code, output, "s.toml", f"{table}.{name} = {huge}", "2^57")
    res = CliRunner().invoke(main, ["reproduce", "10", "--quick", "--datasets", "synthetic",
                                    "--out", "r", "--workers", "0",
                                    "--set", f'{table}={{"{name}": {huge}}}'],
                             catch_exceptions=False)
    assert res.exit_code != 0, res.output
    assert f"{table}.{name} = {huge}" in res.output and "2^57" in res.output, res.output
    assert "Traceback" not in res.output
    assert not (workdir / "o").exists() and not (workdir / "r").exists()


def test_runs_refused_for_one_reason_are_one_short_error(workdir):
    """reproduce --set 'ks=[5000]' printed the same reason once per run, joined into one
    long line; each distinct reason is now said once, with the number of runs it concerns
    and the first of them."""
    res = CliRunner().invoke(main, ["reproduce", "10", "--quick", "--datasets", "synthetic",
                                    "--out", "r", "--workers", "0", "--set", "ks=[5000]"],
                             catch_exceptions=False)
    assert res.exit_code != 0, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and len(res.output.strip().splitlines()) <= 3, res.output
    assert errors[0].count("got 5000") == 1, errors[0]
    assert "4 runs" in errors[0] and "run 0" in errors[0], errors[0]
    assert len(errors[0]) < 400, errors[0]
    assert not (workdir / "r").exists()


@pytest.mark.parametrize("setting, said", [
    ("ks=[5000]", "got 5000"),
    ('model_params={"dim": 9223372036854775807}', "model_params.dim = 9223372036854775807")])
def test_reproduce_dry_run_refuses_what_a_real_call_refuses_with_the_same_line(workdir, setting,
                                                                               said):
    """reproduce --dry-run skipped the checks a real call makes: --set 'ks=[5000]' listed
    every run as "to run", and a dim of 2^63 − 1 listed them at ~1.8e15 GB; it now stops
    on the same one line as the call without --dry-run, before listing anything."""
    args = ["reproduce", "10", "--quick", "--datasets", "synthetic", "--out", "r",
            "--workers", "0", "--set", setting]
    real = CliRunner().invoke(main, args, catch_exceptions=False)
    dry = CliRunner().invoke(main, [*args, "--dry-run"], catch_exceptions=False)
    for res in (real, dry):
        assert res.exit_code == 1, res.output
        assert "Traceback" not in res.output and " GB" not in res.output, res.output
        assert "to run" not in res.output, res.output
    errors = [[line for line in res.output.splitlines() if line.startswith("Error:")]
              for res in (real, dry)]
    assert errors[0] == errors[1] and len(errors[1]) == 1, dry.output
    assert said in errors[1][0] and "nothing was run" in errors[1][0], errors[1][0]
    assert not (workdir / "r").exists()


def test_distinct_reasons_are_each_said_once(tmp_path):
    from rfrs_ref.experiments.spec import RunSpec, make_config
    from rfrs_ref.experiments.sweep import run_sweep

    fields = {"dataset": "synthetic", "dataset_params": {"n_users": 40, "n_items": 50},
              "client_fraction": 0.2, "rounds": 1}
    runs = [RunSpec(make_config({**fields, "ks": [k], "seed": s}), trial=s,
                    labels={"k": str(k)}) for k in (60, 70) for s in (0, 1, 2)]
    with pytest.raises(ValueError) as info:
        run_sweep(runs, tmp_path / "out", workers=0)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.count("got 60") == 1 and msg.count("got 70") == 1, msg
    assert msg.count("3 runs") == 2, msg
    assert not (tmp_path / "out").exists()


def test_a_scheduler_address_where_no_dask_scheduler_answers_is_one_line(workdir):
    """The docs' example address answered HTTP 400 on one network: the Dask client read the
    reply as a message of 3 EiB and the sweep ended on a traceback of its MemoryError."""
    pytest.importorskip("distributed")
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def answer():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    threading.Thread(target=answer, daemon=True).start()
    try:
        (workdir / "s.toml").write_text(TINY)
        address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
        code, output = sweep_cli("s.toml", "--out", "o", "--scheduler", address)
        assert code == 1 and "Traceback" not in output, output
        assert output.strip().splitlines()[-1].startswith(
            f"Error: no Dask scheduler answered at {address}"), output
    finally:
        server.close()
