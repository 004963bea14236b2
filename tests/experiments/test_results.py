"""The store, the tidy table and the summary table."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pandas as pd
import pytest

from rfrs_ref.experiments.results import (METRICS, RESULT_ID_COLUMNS, Store, StoreLocked,
                                          method_name, read_table, results_frame, store_lock,
                                          summarise, summary_markdown, tidy_rows, write_table)
from rfrs_ref.experiments import results as results_module
from rfrs_ref.experiments.spec import RunSpec, make_config


def _outcome(p1: float, ks=(1, 2)) -> dict:
    model = {"n_users": 10, **{f"precision@{k}": p1 / k for k in ks},
             **{f"recall@{k}": p1 / 2 for k in ks}}
    pop = {"n_users": 10, **{f"precision@{k}": 0.1 for k in ks},
           **{f"recall@{k}": 0.05 for k in ks}}
    return {"status": "ok", "wall_s": 1.5, "final": {
        "round": 4, "model": model, "popularity": pop, "beats_popularity": p1 > 0.1,
        "selection": {"byzantine_share_sampled": 0.2, "byzantine_share_kept": 0.0,
                      "excluded_byzantine": 0, "excluded_honest": 0}}}


def _spec(seed=0, **fields):
    # 4 rounds: the final evaluation of _outcome is after round 4
    return RunSpec(make_config({"dataset": "ml100k", "ks": (1, 2), "seed": seed, "rounds": 4,
                                **fields}),
                   trial=seed, labels={"series": "S"})


def test_tidy_rows_one_per_k_and_metric():
    rows = tidy_rows(_spec(), _outcome(0.4))
    assert len(rows) == 2 * len(METRICS)
    by = {(r["k"], r["metric"]): r["value"] for r in rows}
    assert by[(1, "precision")] == 0.4 and by[(2, "precision")] == 0.2
    assert by[(2, "recall")] == 0.2 and by[(1, "popularity_precision")] == 0.1
    r = rows[0]
    assert r["label_series"] == "S" and r["dataset"] == "ml100k" and r["alpha"] == 0.0
    assert r["status"] == "ok" and r["final_round"] == 4 and r["run_dir"] == f"runs/{r['key']}"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1.5, "0.3"])
def test_a_targeted_runs_exposure_is_tabulated_and_a_non_finite_one_is_no_result(value):
    """A run with target items records ER@K and the targets' hit ratio: rows ``er`` and
    ``target_hr`` beside the others (none for a run without targets); an exposure that is
    not a number in [0, 1] makes the record no finished run's."""
    from rfrs_ref import metrics

    assert (metrics.METRIC_NAMES, metrics.TARGET_METRIC_NAMES) == (
        results_module.METRIC_NAMES, results_module.TARGET_METRIC_NAMES)
    outcome = _outcome(0.4)
    outcome["final"]["model"].update({"er@1": 0.25, "er@2": 0.5, "target_hr@1": 0.1,
                                      "target_hr@2": 0.2})
    rows = tidy_rows(_spec(), outcome)
    assert len(rows) == 2 * len(METRICS) + 4
    by = {(r["k"], r["metric"]): r["value"] for r in rows}
    assert by[(2, "er")] == 0.5 and by[(1, "target_hr")] == 0.1
    assert "| ER@1 | ER@2 |" in summary_markdown(summarise(results_frame([(_spec(), outcome)])))
    outcome["final"]["model"]["er@2"] = value
    rows = tidy_rows(_spec(), outcome)
    assert len(rows) == 1 and rows[0]["status"] == "failed" and "er@2" in rows[0]["error"]


def test_a_targeted_run_without_its_exposure_has_empty_exposure_rows():
    """A finished run of an attack with target items records ER@K and the targets' hit
    ratio; a record without them (er@2 deleted) lost its rows, and with them its seed from
    the ranking by exposure without a word. Its rows are now empty (NaN), which the
    ranking refuses as it refuses an unrecorded precision."""
    spec = _spec(attack="a-ra", byzantine_fraction=0.2)
    outcome = _outcome(0.4)
    outcome["final"]["model"].update({"er@1": 0.25, "target_hr@1": 0.1, "target_hr@2": 0.2})
    by = {(r["k"], r["metric"]): r["value"] for r in tidy_rows(spec, outcome)}
    assert by[(1, "er")] == 0.25 and math.isnan(by[(2, "er")]) and by[(2, "target_hr")] == 0.2
    assert not any(r["metric"] in ("er", "target_hr") for r in tidy_rows(_spec(), _outcome(0.4)))

def test_failed_run_is_one_row_with_its_error():
    rows = tidy_rows(_spec(), {"status": "failed", "error": "ValueError: boom",
                               "traceback": "Traceback...\nValueError: boom\n"})
    assert len(rows) == 1
    assert rows[0]["status"] == "failed" and rows[0]["metric"] is None
    assert "boom" in rows[0]["error"] and "Traceback" in rows[0]["traceback"]


@pytest.mark.parametrize("edit, fragment", [
    (lambda f: f.update(round=1), "after round 1, not after the run's last round (4)"),
    (lambda f: f.update(round=5), "after round 5"),
    (lambda f: f.update(round="4"), "after round '4'"),
    (lambda f: f.update(status="diverged"), "status 'diverged'"),
    (lambda f: f.clear(), "no final evaluation"),
])
def test_a_record_of_a_run_that_did_not_finish_is_failed(edit, fragment):
    # a record "ok" whose final evaluation is not after the run's last round was tabulated
    # as a finished run (status ok, rounds 4, final_round 1), its metrics in every mean
    outcome = _outcome(0.4)
    edit(outcome["final"])
    rows = tidy_rows(_spec(), outcome)
    assert len(rows) == 1 and rows[0]["status"] == "failed" and rows[0]["value"] is None
    assert fragment in rows[0]["error"], rows[0]["error"]
    assert summarise(results_frame([(_spec(), outcome)]))["n"].sum() == 0


def test_summary_mean_and_sample_std_over_trials():
    pairs = [(_spec(0), _outcome(0.1)), (_spec(1), _outcome(0.3)),
             (_spec(2), {"status": "failed", "error": "x"})]
    df = results_frame(pairs)
    s = summarise(df)
    p1 = s[(s["metric"] == "precision") & (s["k"].astype(int) == 1)]
    assert len(p1) == 1
    assert p1["mean"].iloc[0] == pytest.approx(0.2)
    assert p1["std"].iloc[0] == pytest.approx(math.sqrt(0.02))  # ddof = 1
    assert p1["n"].iloc[0] == 2
    md = summary_markdown(s, label_columns=("label_series",))
    assert "| label_series |" in md and "Precision@1" in md and "0.2000 ± 0.1414" in md


def test_summary_keeps_configurations_apart():
    pairs = [(_spec(0), _outcome(0.1)), (_spec(0, attack="ascent", byzantine_fraction=0.2),
                                         _outcome(0.3))]
    s = summarise(results_frame(pairs))
    p1 = s[(s["metric"] == "precision") & (s["k"].astype(int) == 1)]
    assert sorted(p1["mean"]) == [0.1, 0.3] and (p1["n"] == 1).all()


def test_table_round_trips_through_parquet_and_csv(tmp_path):
    df = results_frame([(_spec(0), _outcome(0.1)), (_spec(1), {"status": "failed", "error": "e"})])
    write_table(df, tmp_path)
    for name in ("results.parquet", "results.csv"):
        back = read_table(tmp_path / name)
        assert len(back) == len(df)
        assert list(back["status"]) == list(df["status"])
    assert len(read_table(tmp_path)) == len(df)
    with pytest.raises(FileNotFoundError, match="no results table"):
        read_table(tmp_path / "nothing")


def _written(tmp_path):
    df = results_frame([(_spec(s), _outcome(0.1 * (s + 1))) for s in range(3)]
                       + [(_spec(9), {"status": "failed", "error": "e"})])
    write_table(df, tmp_path)
    return df


@pytest.mark.parametrize("column, fragment", [
    ("alpha", "has no alpha (empty or NaN here and in runs.csv): nan is not a Byzantine fraction"),
    ("dataset", "has no dataset (empty or NaN here and in runs.csv), which every run records")])
def test_a_column_empty_in_both_files_is_said_to_be_empty(tmp_path, column, fragment):
    """An α NaN in results.csv and in runs.csv was refused as "run … has alpha nan, but
    runs.csv says nan": a disagreement where the two files agree, on no fraction."""
    _written(tmp_path)
    for name in ("results.csv", "runs.csv"):
        t = pd.read_csv(tmp_path / name)
        t[column] = t[column].astype(object)
        t.loc[0, column] = None
        t.to_csv(tmp_path / name, index=False)
    with pytest.raises(ValueError) as err:
        read_table(tmp_path / "results.csv")
    assert "line 2: run " in str(err.value) and fragment in str(err.value), str(err.value)
    assert "but runs.csv says" not in str(err.value)


def test_csv_form_is_one_row_per_run_beside_one_row_per_metric(tmp_path):
    df = _written(tmp_path)
    runs = pd.read_csv(tmp_path / "runs.csv")
    results = pd.read_csv(tmp_path / "results.csv")
    assert list(runs["key"]) == list(dict.fromkeys(df["key"]))
    assert list(results.columns) == ["key", *RESULT_ID_COLUMNS, "k", "metric", "value"]
    assert len(results) == len(df)
    # the join gives back the tidy table, column for column, dtype for dtype of a CSV read
    whole = tmp_path / "whole"
    whole.mkdir()
    df.to_csv(whole / "results.csv", index=False)
    expected = pd.read_csv(whole / "results.csv")
    pd.testing.assert_frame_equal(read_table(tmp_path / "results.csv"), expected)
    # the run-level columns are no longer repeated per metric row
    assert (tmp_path / "results.csv").stat().st_size + (tmp_path / "runs.csv").stat().st_size \
        < (whole / "results.csv").stat().st_size / 2


def test_csv_form_refuses_a_results_file_that_its_runs_do_not_explain(tmp_path):
    _written(tmp_path)
    results = (tmp_path / "results.csv").read_text().splitlines()
    runs_text = (tmp_path / "runs.csv").read_text()
    key = results[1].split(",")[0]
    # a metric row of a run that runs.csv does not hold
    (tmp_path / "results.csv").write_text("\n".join(
        [*results, results[1].replace(key, "0123456789abcdef")]) + "\n")
    with pytest.raises(ValueError, match=rf"line {len(results) + 1}: run 0123456789abcdef has no row"):
        read_table(tmp_path / "results.csv")
    # a row that names another α than its run
    cells = results[1].split(",")
    cells[2] = "0.9"
    (tmp_path / "results.csv").write_text("\n".join([results[0], ",".join(cells)]) + "\n")
    with pytest.raises(ValueError, match="line 2: .* alpha '0.9', but runs.csv says"):
        read_table(tmp_path / "results.csv")
    # an earlier version's file repeats the method too: it must say its run's
    header, first = results[0].split(","), results[1].split(",")
    old_form = [",".join([*header[:2], "method", *header[2:]]),
                ",".join([*first[:2], "Krum", *first[2:]])]
    (tmp_path / "results.csv").write_text("\n".join(old_form) + "\n")
    with pytest.raises(ValueError, match="line 2: .* method 'Krum', but runs.csv says"):
        read_table(tmp_path / "results.csv")
    # a run twice in runs.csv
    (tmp_path / "results.csv").write_text("\n".join(results) + "\n")
    lines = runs_text.splitlines()
    (tmp_path / "runs.csv").write_text("\n".join([*lines, lines[1]]) + "\n")
    with pytest.raises(ValueError, match=f"run {lines[1].split(',')[0]} has more than one row"):
        read_table(tmp_path / "results.csv")
    (tmp_path / "runs.csv").unlink()
    with pytest.raises(FileNotFoundError, match="needs runs.csv beside it"):
        read_table(tmp_path / "results.csv")


@pytest.mark.parametrize("fields, name", [
    ({}, "A-FRS"),
    ({"model": "fmf"}, "FMF"),
    ({"optimizer": "sgd"}, "SGD-FRS"),
    ({"attack": "ascent", "byzantine_fraction": 0.2, "preset": "no-defense"}, "No defense"),
    ({"attack": "ascent", "byzantine_fraction": 0.2, "preset": "a-rfrs"}, "A-RFRS"),
    ({"attack": "ascent", "byzantine_fraction": 0.2, "preset": "krum"}, "Krum"),
    ({"attack": "ascent", "byzantine_fraction": 0.2, "preset": "rfa"}, "RFA"),
    ({"attack": "ascent", "byzantine_fraction": 0.2, "preset": "trmean"}, "Trmean"),
    ({"attack": "ascent", "byzantine_fraction": 0.2, "preset": "a-rfrs", "optimizer": "momentum"},
     "S-RFRS"),
    ({"attack": "ascent", "byzantine_fraction": 0.2, "preset": "a-rfrs", "optimizer": "adagrad"},
     "AG-RFRS"),
    ({"attack": "ascent", "byzantine_fraction": 0.2, "defense": "median"}, "median (gradient)"),
])
def test_paper_names(fields, name):
    assert method_name(make_config(fields)) == name


def test_outcome_is_written_atomically_with_its_spec(tmp_path):
    store = Store(tmp_path)
    spec = _spec()
    rec = store.write_outcome(spec, {**_outcome(0.2), "files": {"metrics.csv": "round,k\n"}})
    assert rec["key"] == spec.key
    back = store.read_outcome(spec.key)
    assert RunSpec.from_json(back["spec"]).key == spec.key
    assert (store.run_dir(spec.key) / "metrics.csv").read_text() == "round,k\n"
    assert "files" not in back
    assert not [p for p in store.run_dir(spec.key).iterdir() if p.name.endswith(".tmp")]
    assert store.finished([spec.key, "0" * 16]) .keys() == {spec.key}


def test_lock_refuses_a_live_sweep_and_takes_over_a_dead_one(tmp_path):
    hold = ("import sys, time; from rfrs_ref.experiments.results import store_lock; "
            "lock = store_lock(sys.argv[1]); lock.__enter__(); print('held', flush=True); "
            "time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-P", "-c", hold, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreLocked, match=f"process {holder.pid} on "):
            with store_lock(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # the holder is gone (as after a SIGKILL): the kernel released its lock
    with store_lock(tmp_path):
        assert f"process {os.getpid()} on " in (tmp_path / ".lock").read_text()
    assert not (tmp_path / ".lock").exists()
