"""Runs shared between figures are copied from another results directory, not run again."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main
from rfrs_ref.experiments.figures import Scale, figure, reproduce
from rfrs_ref.experiments.results import Store, read_table


@pytest.fixture
def scale(ex):
    return Scale(datasets=("synthetic",), rounds=2, trials=1,
                 overrides={"dataset_params": ex.TINY_DATA, "client_fraction": 0.1})


def _p1(table, series):
    rows = table[(table["label_series"] == series) & (table["metric"] == "precision")
                 & (table["k"] == 1)]
    return rows["value"].tolist()


def test_fig3_copies_fig10s_adam_run_and_runs_only_fmf(scale, tmp_path):
    adam_sgd, frs = tmp_path / "adam-sgd", tmp_path / "frs"
    first, _ = reproduce(figure("10"), scale, adam_sgd, workers=0, plot=False)
    assert first.finished == 2
    report, _ = reproduce(figure("3"), scale, frs, workers=0, plot=False,
                          reuse_from=[adam_sgd])
    assert (report.reused, report.finished, report.skipped, report.pending) == (1, 1, 0, 0)
    table = read_table(frs)
    # the copy is labelled as Fig. 3's series, with Fig. 10's numbers
    assert _p1(table, "A-FRS") == _p1(read_table(adam_sgd), "Adam")
    [key] = table.loc[table["label_series"] == "A-FRS", "key"].unique()
    outcome = Store(frs).read_outcome(key)
    assert outcome["reused_from"] == {"directory": "../adam-sgd", "labels": {"series": "Adam"}}
    assert outcome["spec"]["labels"] == {"series": "A-FRS"}
    assert Store(frs).read_rounds(key) == Store(adam_sgd).read_rounds(key) != []
    calls = json.loads((frs / "provenance.json").read_text())["calls"]
    assert calls[-1]["runs"]["reused"] == 1 and calls[-1]["runs"]["finished"] == 1
    # the copied run's time, where it ran, and its source are kept beside the runs' own
    # (the call recorded 0 s for it, and nothing of its source)
    assert calls[-1]["reused_wall_s_sum"] == round(outcome["wall_s"], 3) > 0
    assert calls[-1]["reused_from"] == ["../adam-sgd"]
    assert calls[-1]["run_wall_s_sum"] == round(
        Store(frs).read_outcome(next(k for k in table["key"].unique() if k != key))["wall_s"], 3)
    assert "reused_from" not in json.loads((adam_sgd / "provenance.json").read_text())["calls"][-1]
    again, _ = reproduce(figure("3"), scale, frs, workers=0, plot=False, reuse_from=[adam_sgd])
    assert (again.skipped, again.reused, again.finished) == (2, 0, 0)


def test_a_failed_or_foreign_record_is_not_copied(scale, tmp_path):
    adam_sgd, frs = tmp_path / "adam-sgd", tmp_path / "frs"
    reproduce(figure("10"), scale, adam_sgd, workers=0, plot=False)
    adam = [r for r in figure("10").runs(scale) if r.labels["series"] == "Adam"][0]
    path = Store(adam_sgd).outcome_path(adam.key)
    good = json.loads(path.read_text())
    # a record whose configuration is not the run's (edited by hand, or another run's)
    foreign = {**good, "spec": {**good["spec"],
                                "config": {**good["spec"]["config"], "seed": 7}}}
    path.write_text(json.dumps(foreign))
    report, _ = reproduce(figure("3"), scale, frs, workers=0, plot=False, reuse_from=[adam_sgd])
    assert (report.reused, report.finished) == (0, 2)
    nan = json.loads(json.dumps(good))
    nan["final"]["model"]["precision@1"] = float("nan")
    path.write_text(json.dumps(nan))
    report, _ = reproduce(figure("3"), scale, tmp_path / "frs-nan", workers=0, plot=False,
                          reuse_from=[adam_sgd])
    assert (report.reused, report.finished) == (0, 2)
    # a damaged per-round summary: the run is run again, not copied without its rounds
    path.write_text(json.dumps(good))
    rounds = Store(adam_sgd).run_dir(adam.key) / "round_summary.json"
    assert rounds.is_file()
    rounds.write_text("not json {")
    report, _ = reproduce(figure("3"), scale, tmp_path / "frs-rounds", workers=0, plot=False,
                          reuse_from=[adam_sgd])
    assert (report.reused, report.finished) == (0, 2)
    failed = {**good, "status": "failed", "error": "boom"}
    path.write_text(json.dumps(failed))
    other = tmp_path / "frs2"
    report, _ = reproduce(figure("3"), scale, other, workers=0, plot=False,
                          reuse_from=[adam_sgd, tmp_path / "missing"])
    assert (report.reused, report.finished) == (0, 2)


def test_reproduce_reuse_from_on_the_command_line(ex, tmp_path):
    adam_sgd, frs = tmp_path / "adam-sgd", tmp_path / "frs"
    common = ["--datasets", "synthetic", "--rounds", "2", "--trials", "1", "--workers", "0",
              "--no-plot", "--set", "client_fraction=0.1",
              "--set", "dataset_params=" + json.dumps(ex.TINY_DATA)]
    r = CliRunner().invoke(main, ["reproduce", "10", "--out", str(adam_sgd), *common])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["reproduce", "3", "--out", str(frs), *common,
                                  "--reuse-from", str(adam_sgd)])
    assert r.exit_code == 0, r.output
    assert "1 copied from --reuse-from" in r.output and "1 copied (--reuse-from)" in r.output
    r = CliRunner().invoke(main, ["reproduce", "3", "--out", str(tmp_path / "x"), *common,
                                  "--reuse-from", str(tmp_path / "nowhere")])
    assert r.exit_code == 2 and "nowhere" in r.output
