"""``rfrs-ref reproduce``, ``sweep`` and ``plot`` through click."""

from __future__ import annotations

import json
import textwrap

from click.testing import CliRunner

from rfrs_ref.cli.experiments import reproduce, sweep
from rfrs_ref.cli.main import main


def test_commands_are_registered():
    res = CliRunner().invoke(main, ["--help"])
    assert res.exit_code == 0
    for name in ("reproduce", "sweep", "plot"):
        assert name in res.output
    res = CliRunner().invoke(main, ["reproduce", "--help"])
    assert res.exit_code == 0 and "--quick" in res.output and "--scheduler" in res.output


def test_reproduce_unknown_figure():
    res = CliRunner().invoke(reproduce, ["6", "--workers", "0"])
    assert res.exit_code != 0 and "unknown figure '6'" in res.output


def test_reproduce_test_sized_figure_in_process(ex, tmp_path):
    out = tmp_path / "fig10"
    args = ["10", "--quick", "--datasets", "synthetic", "--rounds", "3", "--trials", "1",
            "--set", "client_fraction=0.1", "--set", f"dataset_params={json.dumps(ex.TINY_DATA)}",
            "--workers", "0", "--threads", "1", "--out", str(out)]
    res = CliRunner().invoke(reproduce, args)
    assert res.exit_code == 0, res.output
    assert "2 runs: 0 skipped (already finished), 2 finished, 0 failed" in res.output
    assert "| Adam |" in res.output and "| SGD |" in res.output
    assert (out / "figures" / "fig10.png").exists()
    res = CliRunner().invoke(reproduce, args + ["--no-plot"])
    assert res.exit_code == 0 and "2 skipped" in res.output


def test_reproduce_no_run_tabulates_what_is_recorded_and_runs_nothing(ex, tmp_path):
    out = tmp_path / "fig10"
    args = ["10", "--quick", "--datasets", "synthetic", "--rounds", "3",
            "--set", "client_fraction=0.1", "--set", f"dataset_params={json.dumps(ex.TINY_DATA)}",
            "--workers", "0", "--threads", "1", "--out", str(out)]
    res = CliRunner().invoke(reproduce, [*args, "--trials", "1"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(reproduce, [*args, "--trials", "2", "--no-run"])
    assert res.exit_code == 0, res.output
    assert "4 runs: 2 skipped (already finished), 0 finished, 0 failed 2 not run" in res.output
    assert len(list((out / "runs").iterdir())) == 2
    assert (out / "figures" / "fig10.png").exists() and "| Adam |" in res.output


def test_reproduce_bad_override():
    res = CliRunner().invoke(reproduce, ["3", "--set", "nothing", "--workers", "0"])
    assert res.exit_code != 0 and "FIELD=VALUE" in res.output


def test_sweep_dry_run_lists_runs_and_failing_runs_exit_non_zero(ex, tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(textwrap.dedent('''
        trials = 1
        [base]
        dataset = "synthetic"
        dataset_params = { n_users = 200, n_items = 100, mean_items = 12.0 }
        client_fraction = 0.1
        rounds = 2
        [axes]
        dataset_params = [{ n_items = 100 }, { n_items = 1 }]
    '''))
    res = CliRunner().invoke(sweep, [str(spec), "--out", str(tmp_path / "o"), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert res.output.count("to run") == 2
    res = CliRunner().invoke(sweep, [str(spec), "--out", str(tmp_path / "o"), "--workers", "0",
                                     "--threads", "1"])
    assert res.exit_code == 1
    assert "1 finished, 1 failed" in res.output
    res = CliRunner().invoke(sweep, [str(spec), "--out", str(tmp_path / "o"), "--dry-run"])
    assert "ok" in res.output and "failed" in res.output


def test_sweep_reports_a_bad_file(tmp_path):
    spec = tmp_path / "bad.toml"
    spec.write_text("[base]\ncolour = 1\n")
    res = CliRunner().invoke(sweep, [str(spec), "--workers", "0"])
    assert res.exit_code != 0 and "colour" in res.output
