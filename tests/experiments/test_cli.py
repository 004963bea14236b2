"""``rfrs-ref reproduce``, ``sweep`` and ``plot`` through click."""

from __future__ import annotations

import json
import textwrap

import pytest
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
    # the tables line names every table written (summary.csv was left out)
    tables = next(line for line in res.output.splitlines() if line.startswith("tables: "))
    for name in ("results.csv", "runs.csv", "summary.csv", "summary.md"):
        assert (out / name).is_file() and str(out / name) in tables, tables
    res = CliRunner().invoke(reproduce, args + ["--no-plot"])
    assert res.exit_code == 0 and "2 skipped" in res.output
    # --dry-run lists the runs with their status, and writes nothing
    res = CliRunner().invoke(reproduce, args + ["--dry-run"])
    assert res.exit_code == 0 and res.output.count(" ok ") == 2, res.output
    other = tmp_path / "elsewhere"
    res = CliRunner().invoke(reproduce, args[:-1] + [str(other), "--dry-run"])
    assert res.exit_code == 0 and res.output.count(" to run ") == 2 and not other.exists()


def test_reproduce_alphas_runs_the_fractions_given_and_refuses_what_is_not_one(tmp_path):
    out = str(tmp_path / "o")
    res = CliRunner().invoke(reproduce, ["4", "--quick", "--alphas", "0.4", "--dry-run",
                                         "--out", out])
    assert res.exit_code == 0, res.output
    assert res.output.count("α=0.4") == 10 and "α=0.2" not in res.output, res.output
    for args, message in [(["4", "--alphas", "0.4,x"], "'x' in '0.4,x' is not a number"),
                          (["4", "--alphas", "0.5,1"], "must lie in [0, 1), got 1.0"),
                          (["3", "--alphas", "0.4"], "Fig. 3 (frs) compares no Byzantine")]:
        res = CliRunner().invoke(reproduce, [*args, "--dry-run", "--out", out])
        assert res.exit_code == 2 and "--alphas" in res.output and message in res.output, \
            res.output
    assert not (tmp_path / "o").exists()


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


@pytest.mark.parametrize("value, where", [('{"n_users": NaN}', "n_users"),
                                          ('{"n_users": 50, "noise": 1e400}', "noise")])
def test_reproduce_non_finite_override_is_named(tmp_path, value, where):
    # JSON's NaN and an overflowing 1e400 parse; they used to reach the run keys and end
    # in "Out of range float values are not JSON compliant", naming nothing
    res = CliRunner().invoke(reproduce, ["4", "--datasets", "synthetic", "--trials", "1",
                                         "--out", str(tmp_path / "r"), "--dry-run",
                                         "--set", f"dataset_params={value}"])
    assert res.exit_code != 0
    assert f"override: dataset_params.{where} must be a finite number" in res.output, res.output
    assert not (tmp_path / "r").exists()


def _tiny_sweep(tmp_path, axis: str):
    """A sweep file of 2-round synthetic runs, one trial, crossed over ``axis``."""
    spec = tmp_path / "s.toml"
    spec.write_text(textwrap.dedent('''
        trials = 1
        [base]
        dataset = "synthetic"
        dataset_params = { n_users = 200, n_items = 100, mean_items = 12.0 }
        client_fraction = 0.1
        rounds = 2
        [axes]
    ''') + axis + "\n")
    return spec


def test_sweep_dry_run_lists_runs_and_failing_runs_exit_non_zero(ex, tmp_path):
    spec = _tiny_sweep(tmp_path, 'dataset_params = [{ n_items = 100 }, { n_items = 1 }]')
    # K = 1: a K above the items is refused before any run; one item fails inside the run
    spec.write_text(spec.read_text().replace("rounds = 2\n", "rounds = 2\nks = [1]\n"))
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


def test_a_sweep_draws_its_panels_and_plot_refuses_a_foreign_figure(ex, tmp_path):
    """A sweep writes figures/sweep.png (one line per label combination); `plot` without
    --figure draws the same, and `plot --figure 3` of a table without Fig. 3's series is
    refused instead of drawn under Fig. 3's title."""
    from rfrs_ref.cli.experiments import plot

    spec = _tiny_sweep(tmp_path, 'defense = ["median", "trmean"]')
    out = tmp_path / "o"
    res = CliRunner().invoke(sweep, [str(spec), "--out", str(out), "--workers", "0"])
    assert res.exit_code == 0, res.output
    assert f"figure: {out / 'figures' / 'sweep.png'}" in res.output
    ex.assert_image_not_blank(out / "figures" / "sweep.png")
    again = CliRunner().invoke(plot, [str(out), "--out", str(tmp_path / "f")])
    assert again.exit_code == 0, again.output
    ex.assert_image_not_blank(tmp_path / "f" / "sweep.png")
    foreign = CliRunner().invoke(plot, [str(out), "--figure", "3"])
    assert foreign.exit_code == 1 and "is a sweep's table (series by label_defense)" in foreign.output
    assert not (out / "figures" / "fig3.png").exists()
    # a figure's table (series in label_series) with none of Fig. 3's series
    import shutil

    fig = tmp_path / "fig"
    shutil.copytree(out, fig)
    (fig / "results.parquet").unlink(missing_ok=True)  # the CSV is then the table read
    (fig / "runs.csv").write_text((fig / "runs.csv").read_text().replace("label_defense",
                                                                         "label_series"))
    foreign = CliRunner().invoke(plot, [str(fig), "--figure", "3"])
    assert foreign.exit_code == 1 and "none of figure 3's (A-FRS, FMF)" in foreign.output
    assert "median, trmean" in foreign.output
    res = CliRunner().invoke(sweep, [str(spec), "--out", str(tmp_path / "p"), "--workers", "0",
                                     "--no-plot"])
    assert res.exit_code == 0 and not (tmp_path / "p" / "figures").exists()


def test_a_dry_run_piped_into_head_ends_quietly(tmp_path):
    """`reproduce 8 --quick --dry-run | head -2` printed `Error: [Errno 32] Broken pipe`: the
    listing took the closed pipe for an error of its own (a listing longer than the output
    buffer meets the closed pipe while it is written)."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", "from rfrs_ref.cli.main import main; main()", "reproduce",
         "ranking", "--dry-run", "--out", str(tmp_path / "o")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    # the listing (~100 kB) outgrows the pipe's buffer: the writer is still listing when the
    # reader goes after two lines, as head does
    proc.stdout.readline()
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Error" not in err and "Traceback" not in err, err


def test_plot_of_what_is_no_results_table_says_what_to_give(ex, tmp_path):
    """A newcomer's first `plot`: a run directory of `rfrs-ref train`, its metrics.csv (with
    and without --figure), and a sweep's table saved under another name."""
    from rfrs_ref.cli.experiments import plot

    run_dir = tmp_path / "run"
    res = CliRunner().invoke(main, ["train", "--dataset", "synthetic", "--synthetic-users", "60",
                                    "--synthetic-items", "80", "--client-fraction", "0.1",
                                    "--rounds", "2", "--out", str(run_dir)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(plot, [str(run_dir)])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "is the directory of one `rfrs-ref train` run" in res.output
    assert "`rfrs-ref reproduce` or `rfrs-ref sweep`" in res.output
    for extra in ([], ["--figure", "4"]):
        res = CliRunner().invoke(plot, [str(run_dir / "metrics.csv"), *extra])
        assert res.exit_code == 1, res.output
        line = " ".join(res.output.split())
        # the file named, not the results.csv beside it, nor a bare "Error: 'status'"
        assert f"{run_dir / 'metrics.csv'}: not a results table of rfrs-ref" in line, line
        assert "`rfrs-ref reproduce` or `rfrs-ref sweep`" in line
    assert not (run_dir / "figures").exists()

    # a sweep's table kept under another name is the table drawn, not the folder's
    spec = _tiny_sweep(tmp_path, 'defense = ["median", "trmean"]')
    out = tmp_path / "o"
    res = CliRunner().invoke(sweep, [str(spec), "--out", str(out), "--workers", "0",
                                     "--no-plot"])
    assert res.exit_code == 0, res.output
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine.csv").write_bytes((out / "results.csv").read_bytes())
    (kept / "mine_runs.csv").write_bytes((out / "runs.csv").read_bytes())
    res = CliRunner().invoke(plot, [str(kept / "mine.csv"), "--out", str(tmp_path / "f")])
    assert res.exit_code == 0, res.output
    ex.assert_image_not_blank(tmp_path / "f" / "sweep.png")


@pytest.mark.parametrize("datasets, said", [("ml100k,", "an empty name"), (",", "an empty name"),
                                            ("foo", "'foo'"), ("ml100k,lastfmm", "'lastfmm'")])
def test_reproduce_refuses_a_dataset_list_naming_no_dataset(tmp_path, datasets, said):
    """--datasets with an empty entry or an unknown name planned runs of dataset '' or 'foo'
    (each failing when run, or two runs of one key); it is a usage error naming the entry
    and the datasets there are, and nothing is written."""
    out = tmp_path / "out"
    res = CliRunner().invoke(reproduce, ["3", "--datasets", datasets, "--out", str(out),
                                         "--no-run"])
    assert res.exit_code == 2, res.output
    assert f"{said} in {datasets!r} is not a dataset" in res.output, res.output
    assert "ml100k" in res.output and not out.exists()


def test_reproduce_takes_dataset_names_with_spaces_around_them(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(reproduce, ["3", "--datasets", " ml100k ", "--trials", "1",
                                         "--out", str(out), "--no-run"])
    assert res.exit_code == 0, res.output
    assert "ml100k" in res.output
