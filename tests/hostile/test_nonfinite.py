"""Non-finite is never success: every command that reads or measures a model, a run or a
table whose values hold NaN or ±inf says so, instead of printing a normal-looking number,
a mean that silently left a value out, or a top-K of a model that is not finite.

Each case is an input that once passed as a success (exit 0, a plain table); the tests
pin what happens now.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _rewrite_npz(path, change):
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    change(arrays)
    np.savez(path, **arrays)


# -- mechanism: a run that diverges ------------------------------------------------------------
def test_mechanism_stops_at_the_divergence_and_says_so(tmp_path):
    # SGD at lr 1e3 under 40% gradient ascent with no defence: the server state becomes
    # ±inf at round 11 of 12; the command once measured all 12 rounds (empty cells from round
    # 11 on), printed means over them and exited 0 with no word of it
    out = tmp_path / "mech"
    res = invoke("mechanism", "4", "--dataset", "synthetic", "--alpha", 0.4, "--rounds", 12,
                 "--series", "No defense", "--set", "client_fraction=0.2",
                 "--set", 'dataset_params={"n_users": 100, "n_items": 120}',
                 "--set", "optimizer=sgd", "--set", 'optimizer_params={"lr": 1e3}',
                 "--set", "backend=numpy", "--out", out)
    assert "Traceback" not in res.output, res.output
    # a divergence is the run's outcome (as in a sweep), so the command finishes and says where
    assert res.exit_code == 0, res.output
    assert "the run diverged at round 11 (non-finite server state" in res.output
    stem = "defenses-synthetic-a0.4-seed0"
    df = pd.read_csv(out / f"{stem}-no-defense.csv")
    assert list(df["round"]) == list(range(1, 11))  # nothing of round 11 or after
    summary = (out / f"{stem}.md").read_text()
    assert "| No defense (diverged at round 11) |" in summary
    assert "No defense at round 11 (non-finite server state" in summary


def test_mechanism_checks_every_series_before_measuring_any(tmp_path):
    # at client fraction 0.03 each round samples 3 of the 100 clients: enough for the mean,
    # not for Krum; the command once measured and wrote No defense, then stopped at Krum.
    # Such a series is left out of the figure, with a note saying so, as reproduce does
    args = ["mechanism", "4", "--dataset", "synthetic", "--alpha", 0.4, "--rounds", 2,
            "--set", "client_fraction=0.03",
            "--set", 'dataset_params={"n_users": 100, "n_items": 120}']
    out = tmp_path / "mech"
    res = invoke(*args, "--series", "No defense", "--series", "Krum", "--out", out)
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert res.output.strip().splitlines() == [res.output.strip().splitlines()[-1]]
    assert "Krum: krum needs n > 2f + 2" in res.output and "nothing was measured" in res.output
    assert not out.exists()
    res = invoke(*args, "--out", out)
    assert res.exit_code == 0, res.output
    notes = [line for line in res.output.splitlines() if line.startswith("note: left out")]
    assert any("Krum" in line and "n > 2f + 2" in line for line in notes), res.output
    assert not list(out.glob("*-krum.csv")) and list(out.glob("*-no-defense.csv"))


def test_measure_run_raises_diverged_with_the_rows_before_it(tmp_path):
    from rfrs_ref.experiments.mechanism import measure_run
    from rfrs_ref.experiments.spec import RunSpec
    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.trainer import Diverged

    config = TrainConfig(dataset="synthetic", dataset_params={"n_users": 100, "n_items": 120},
                         client_fraction=0.2, rounds=4, optimizer="sgd", attack="inf",
                         byzantine_fraction=0.4, backend="numpy")
    with pytest.raises(Diverged) as info:
        measure_run(RunSpec(config))
    assert info.value.round == 1 and info.value.rows == []


# -- a resilience sum that is not finite ----------------------------------------------------------
#: SGD at lr 1e-300 in float64 under noise: a kept client's recovered gradient (θ̄ − θ)/η
#: overflows, so C_g is inf from round 1 while the model trains normally
RESILIENCE_INF = ["--dataset", "synthetic", "--synthetic-users", 100, "--synthetic-items", 120,
                  "--client-fraction", 0.1, "--backend", "numpy", "--rounds", 3,
                  "--dtype", "float64", "--optimizer", "sgd", "--lr", "1e-300",
                  "--attack", "noise", "--noise-sigma", 100, "--byzantine-fraction", 0.2,
                  "--resilience"]


def _strict_json(text):
    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=refuse)


def test_train_whose_resilience_sum_is_not_finite_is_not_a_success(tmp_path, refused):
    # it once printed "C_g inf" and exited 0, wrote the token Infinity into
    # final_metrics.json and rounds.jsonl, and its resume refused the run's own checkpoint
    # as "does not belong to this run (accumulator resilience = {'C_g': inf...})"
    out = tmp_path / "run"
    res = invoke("train", *RESILIENCE_INF, "--out", out)
    refused(res, "C_g at round 1", "non-finite")
    assert "after round 3" in res.output  # the training finished, its evaluation shown
    assert "C_g non-finite (from round 1)" in res.output and "C_g inf" not in res.output
    final = _strict_json((out / "final_metrics.json").read_text())
    assert final["resilience"]["C_g"] is None and final["resilience_non_finite"] == {"C_g": 1}
    assert np.isfinite(final["resilience"]["C_theta"])
    recs = [_strict_json(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [r["resilience"]["C_g"] for r in recs] == [None, None, None]
    assert all(r["resilience_non_finite"] == {"C_g": 1} for r in recs)
    _strict_json((out / "config.json").read_text())
    # the run's own checkpoint continues; the finished run is shown and is still no success
    res = invoke("train", "--resume", out)
    err = refused(res, "C_g at round 1", never="does not belong")
    assert "already finished all 3 rounds" in res.output, err


def test_a_non_finite_resilience_total_read_back_must_be_marked(tmp_path, refused):
    out = tmp_path / "run"
    invoke("train", *RESILIENCE_INF, "--out", out)
    path = out / "final_metrics.json"
    final = json.loads(path.read_text())
    del final["resilience_non_finite"]  # a null total without its round: not a result
    path.write_text(json.dumps(final))
    refused(invoke("train", "--resume", out), "final_metrics.json", "resilience C_g is None")


# -- a finished run read back: train --resume ---------------------------------------------------
def _nan_precision(final):
    final["model"]["precision@5"] = float("nan")


def _inf_recall(final):
    final["popularity"]["recall@1"] = float("inf")


def _string_metric(final):
    final["model"]["ndcg@2"] = "0.5"


@pytest.mark.parametrize("tamper", [_nan_precision, _inf_recall, _string_metric])
def test_resume_of_a_finished_run_never_shows_a_non_finite_result(run_copy, tamper, refused):
    # it once printed "already finished" and a table holding nan / inf, and exited 0
    path = run_copy / "final_metrics.json"
    final = json.loads(path.read_text())
    tamper(final)
    path.write_text(json.dumps(final))
    before = path.read_bytes()
    refused(invoke("train", "--resume", run_copy), "final_metrics.json", "not a finite number")
    assert path.read_bytes() == before


@pytest.mark.parametrize("field, value, said", [
    ("beats_popularity", float("nan"), "beats_popularity is nan"),
    ("beats_popularity", "no", "beats_popularity is 'no'"),
    ("beats_popularity", "flip", "which its precision@5"),
    ("byzantine_share_sampled", float("nan"), "byzantine_share_sampled is nan"),
    ("byzantine_share_kept", "x", "byzantine_share_kept is 'x'")])
def test_resume_of_a_finished_run_never_says_what_its_metrics_do_not(run_copy, field, value,
                                                                      said, refused):
    # it once printed "the model beats the popularity ranking" for a beats_popularity of NaN
    # or "no" (truthy), or the opposite of its numbers; a share of "x" was a traceback
    path = run_copy / "final_metrics.json"
    final = json.loads(path.read_text())
    if field == "beats_popularity":
        final[field] = (not final[field]) if value == "flip" else value
    else:
        final["selection"][field] = value
        final["selection"]["byzantine_share_sampled"] = final["selection"].get(
            "byzantine_share_sampled") if field != "byzantine_share_kept" else 0.5
    path.write_text(json.dumps(final))
    before = path.read_bytes()
    refused(invoke("train", "--resume", run_copy), "final_metrics.json", said,
            never="the model beats")
    assert path.read_bytes() == before


@pytest.mark.parametrize("array", ["theta", "m"])
def test_resume_of_a_finished_run_with_a_non_finite_state(run_copy, array, refused):
    def poison(z):
        z[array][3] = np.inf

    _rewrite_npz(run_copy / "state.npz", poison)
    refused(invoke("train", "--resume", run_copy), "state.npz", "non-finite", repr(array))


def test_resume_of_a_finished_run_without_its_state(run_copy, refused):
    (run_copy / "state.npz").unlink()
    refused(invoke("train", "--resume", run_copy), "state.npz", "missing")


def test_resume_of_a_sound_finished_run_still_shows_it(run_copy):
    res = invoke("train", "--resume", run_copy)
    assert res.exit_code == 0, res.output
    assert "already finished all 4 rounds" in res.output


# -- recommend: a state that is not a finished run's model ---------------------------------------
def _nan_in_m(z):
    z["m"][5] = np.nan  # the model (theta) is finite, the optimiser's moment is not


def _inf_in_theta(z):
    z["theta"][0] = np.inf


def _no_round(z):
    del z["round"]


@pytest.mark.parametrize("tamper, needles", [
    (_nan_in_m, ["'m'", "NaN or ±inf", "nothing to recommend"]),
    (_inf_in_theta, ["'theta'", "NaN or ±inf", "nothing to recommend"]),
    (_no_round, ["not the final state", "round"]),
], ids=["nan-moment", "inf-theta", "no-round"])
def test_recommend_never_ranks_with_a_state_that_is_not_finite(run_copy, tamper, needles, refused):
    # a NaN moment once passed (only this user's scores were checked), and a state without
    # its round ended in a traceback after the top-K was computed
    _rewrite_npz(run_copy / "state.npz", tamper)
    res = invoke("recommend", run_copy, "--user", 1, "-k", 3)
    refused(res, "state.npz", *needles)
    assert " item " not in res.output  # no ranking printed


def test_recommend_on_a_truncated_state(run_copy, refused):
    data = (run_copy / "state.npz").read_bytes()
    (run_copy / "state.npz").write_bytes(data[: len(data) // 3])
    refused(invoke("recommend", run_copy, "--user", 1), "state.npz", "not the final state")


# -- sweep tables: an outcome that records a non-finite metric -----------------------------------
@pytest.fixture
def sweep_dir(finished_sweep, tmp_path):
    """A finished 2-trial sweep (one configuration), copied afresh per test."""
    d = tmp_path / "sweep"
    shutil.copytree(finished_sweep, d)
    return d


def _edit_outcome(sweep_dir, change):
    from rfrs_ref.experiments.spec import load_sweep

    key = load_sweep(sweep_dir / "s.toml").runs[0].key
    path = sweep_dir / "out" / "runs" / key / "outcome.json"
    outcome = json.loads(path.read_text())
    change(outcome)
    path.write_text(json.dumps(outcome))  # Python's json writes NaN and Infinity as such
    return key



def _tabulated_as_no_result(invoke, sweep_dir, monkeypatch, change):
    """Edit one record of the sweep with ``change``, run the sweep again without retrying
    failures, and return that run's row: said as no result, tabulated as failed."""
    from rfrs_ref.experiments.results import read_table

    key = _edit_outcome(sweep_dir, change)
    monkeypatch.chdir(sweep_dir)
    res = invoke("sweep", "s.toml", "--out", "out", "--workers", 0, "--no-retry-failed",
                 "--no-plot")
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "1 recorded as finished or diverged without a result" in res.output, res.output
    run = read_table(sweep_dir / "out").query("key == @key")
    assert len(run) == 1 and run["status"].iloc[0] == "failed"
    return run

def _summary_row(sweep_dir, metric, k):
    s = pd.read_csv(sweep_dir / "out" / "summary.csv")
    return s[(s["metric"] == metric) & (s["k"] == k)].iloc[0]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "0.3", 7.5, -3.0])
def test_a_recorded_non_finite_metric_is_never_a_result(sweep_dir, monkeypatch, value):
    # once: the run stayed "ok"; its NaN was dropped from the mean while n still counted it
    # ("0.2000", trials 2), its inf was shown as the mean ("inf")
    def change(o):
        o["final"]["model"]["precision@1"] = value

    key = _edit_outcome(sweep_dir, change)
    monkeypatch.chdir(sweep_dir)
    res = invoke("sweep", "s.toml", "--out", "out", "--workers", 0, "--no-retry-failed")
    # once: exit 0 with the run shown as failed, as if the sweep had succeeded
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    # once: the final line counted it among the runs "skipped (already finished)"
    assert "1 skipped (already finished)" in res.output, res.output
    assert "1 recorded as finished or diverged without a result" in res.output
    from rfrs_ref.experiments.results import read_table

    table = read_table(sweep_dir / "out")
    run = table[table["key"] == key]
    assert len(run) == 1 and run["status"].iloc[0] == "failed"
    assert "precision@1" in run["error"].iloc[0] and "not a finite number" in run["error"].iloc[0]
    assert run["value"].isna().all()
    # the summary is over the other trial only, and says so
    row = _summary_row(sweep_dir, "precision", 1)
    assert row["n"] == 1 and np.isfinite(row["mean"])
    assert "| 1 |" in (sweep_dir / "out" / "summary.md").read_text()


@pytest.mark.parametrize("value", [True, float("nan"), float("inf"), "yes", 1])
def test_a_recorded_beats_popularity_its_metrics_do_not_say_is_no_result(sweep_dir, monkeypatch,
                                                                          value):
    # once: true (the model's P@5 below the popularity ranking's) went into runs.csv as
    # True, NaN as an empty cell, and "yes" or inf stopped the tables with a traceback
    from rfrs_ref.experiments.results import read_table

    def change(o):
        if value is True:
            assert o["final"]["beats_popularity"] is False  # the tiny runs lose to popularity
        o["final"]["beats_popularity"] = value

    run = _tabulated_as_no_result(invoke, sweep_dir, monkeypatch, change)
    assert "beats_popularity" in run["error"].iloc[0] and run["beats_popularity"].isna().all()


@pytest.mark.parametrize("where, name, value", [
    ("selection", "excluded_byzantine", "x"), ("selection", "excluded_honest", 1.5),
    ("selection", "byzantine_share_kept", float("inf")), ("record", "wall_s", float("inf")),
    ("record", "resumed_from", "x"), ("model", "n_users", "x")])
def test_a_run_level_value_not_of_its_kind_is_left_empty(sweep_dir, monkeypatch, where, name,
                                                         value):
    # once: "x" or 1.5 in a count stopped the tables ("Error: invalid literal for int()",
    # naming no file, or a traceback) until the record was moved away; inf was tabulated
    import math

    from rfrs_ref.experiments.results import RUNS_TABLE, read_table

    column = {"n_users": "evaluated_clients"}.get(name, name)

    def change(o):
        target = {"selection": o["final"].setdefault("selection", {}), "record": o,
                  "model": o["final"]["model"]}[where]
        target[name] = value

    key = _edit_outcome(sweep_dir, change)
    monkeypatch.chdir(sweep_dir)
    res = invoke("sweep", "s.toml", "--out", "out", "--workers", 0, "--no-plot")
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "2 skipped (already finished)" in res.output
    runs = pd.read_csv(sweep_dir / "out" / f"{RUNS_TABLE}.csv")
    assert runs.loc[runs["key"] == key, column].isna().all()
    table = read_table(sweep_dir / "out")
    assert (table.loc[table["key"] == key, "status"] == "ok").all()
    assert all(math.isfinite(v) for v in runs["wall_s"].dropna())


def _ok_rows(sweep_dir):
    from rfrs_ref.experiments.results import read_table

    table = read_table(sweep_dir / "out")
    return table[table["status"] == "ok"]


@pytest.mark.parametrize("edit", ["nan", "no_final", "round"])
def test_a_recorded_finish_without_a_result_is_run_again(sweep_dir, monkeypatch, edit):
    # a run recorded "ok" without a result (a NaN metric; no final evaluation; a final
    # evaluation after round 1 of 2, its final_metrics.json saying it diverged) was never run
    # again, --retry-failed or not: the sweep exited 0 with the run shown as failed (or,
    # for the early final round, counted as finished with a run that did not finish)
    def change(o):
        if edit == "nan":
            o["final"]["model"]["precision@1"] = float("nan")
        elif edit == "no_final":
            del o["final"]
        else:
            o["final"]["round"] = 1

    key = _edit_outcome(sweep_dir, change)
    if edit == "round":
        final = sweep_dir / "out" / "runs" / key / "final_metrics.json"
        final.write_text(json.dumps({**json.loads(final.read_text()), "status": "diverged"}))
    monkeypatch.chdir(sweep_dir)
    res = invoke("sweep", "s.toml", "--out", "out", "--workers", 0, "--no-plot")
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "1 skipped (already finished), 1 finished, 0 failed" in res.output, res.output
    ok = _ok_rows(sweep_dir)
    assert set(ok["key"]) >= {key} and (ok["final_round"] == ok["rounds"]).all()
    assert ok["value"].map(np.isfinite).all()
    again = invoke("sweep", "s.toml", "--out", "out", "--workers", 0, "--no-plot")
    assert again.exit_code == 0 and "2 skipped (already finished), 0 finished" in again.output


def test_a_recorded_finish_before_the_last_round_is_no_result(sweep_dir, monkeypatch):
    # final.round = 1 of 2: runs.csv once showed the run "ok" with rounds 2 and final_round
    # 1, its metrics in the means, and a later sweep skipped it as finished
    key = _edit_outcome(sweep_dir, lambda o: o["final"].update(round=1))
    monkeypatch.chdir(sweep_dir)
    res = invoke("sweep", "s.toml", "--out", "out", "--workers", 0, "--no-plot",
                 "--no-retry-failed")
    assert res.exit_code == 1
    assert "1 recorded as finished or diverged without a result" in res.output
    from rfrs_ref.experiments.results import read_table

    run = read_table(sweep_dir / "out").query("key == @key")
    assert len(run) == 1 and run["status"].iloc[0] == "failed"
    assert "after round 1" in run["error"].iloc[0] and "did not finish" in run["error"].iloc[0]
    assert _summary_row(sweep_dir, "precision", 1)["n"] == 1
    # verdict and ranking read the tables, where the run is failed; a table that still says
    # "ok" for such a run (written before such records were shown as failed) is refused
    from rfrs_ref.experiments.claims import TableError, paired_difference

    ok = _ok_rows(sweep_dir)
    assert key not in set(ok["key"])
    good = pd.concat([ok.assign(label_series="S"), ok.assign(label_series="T")])
    assert paired_difference(good, "S", "T", dataset="synthetic", metric="precision", k=1).n == 1
    stale = pd.concat([ok.assign(label_series="S"), ok.assign(label_series="T", final_round=1)])
    with pytest.raises(TableError, match="series 'T'.*not of its last round"):
        paired_difference(stale, "S", "T", dataset="synthetic", metric="precision", k=1)


@pytest.mark.parametrize("divergence, said", [
    ({"round": 99, "reason": "non-finite scores"}, "divergence at round 99"),
    ({"round": 0, "reason": "non-finite server state"}, "divergence at round 0"),
    ({"round": 1, "reason": "because"}, "for the reason 'because'"),
    (None, "without its divergence"),
])
def test_a_recorded_divergence_at_no_round_of_the_run_is_no_result(sweep_dir, monkeypatch,
                                                                   divergence, said):
    # a run of 2 rounds recorded "diverged" at round 99 for a reason of no trainer's was
    # skipped as diverged (exit 0), shown as diverged in the tables and counted against its
    # series by the verdict
    def change(o):
        o["status"] = "diverged"
        o.pop("final", None)
        o["divergence"] = divergence

    run = _tabulated_as_no_result(invoke, sweep_dir, monkeypatch, change)
    assert said in run["error"].iloc[0] and "not counted as diverged" in run["error"].iloc[0]
    again = invoke("sweep", "s.toml", "--out", "out", "--workers", 0, "--no-plot")
    assert again.exit_code == 0 and "1 skipped (already finished), 1 finished" in again.output
    assert run["key"].iloc[0] in set(_ok_rows(sweep_dir)["key"])


@pytest.mark.parametrize("at", [99, 0, 1.5, "x"])
def test_verdict_refuses_a_diverged_row_at_no_round_of_the_run(sweep_dir, at):
    # a table edited to say that series T diverged at round 99 of 2 once made T the worse
    # series ("diverged 0/2 vs 1/2") without a word
    from rfrs_ref.experiments.claims import TableError, paired_difference

    ok = _ok_rows(sweep_dir)
    seed = ok["seed"].iloc[0]
    gone = ok[ok["seed"] == seed].iloc[[0]].assign(
        status="diverged", metric=None, k=None, value=None, diverged_round=at)
    good = pd.concat([ok.assign(label_series="S"), ok.assign(label_series="T")])
    edited = pd.concat([good[(good["label_series"] == "S") | (good["seed"] != seed)],
                        gone.assign(label_series="T")], ignore_index=True)
    with pytest.raises(TableError, match=f"series 'T', seed {seed}: .*diverged_round "
                                         r"\S+ is not a round of the run \(1 to 2\)"):
        paired_difference(edited, "S", "T", dataset="synthetic", metric="precision", k=1)
    sound = edited.assign(diverged_round=edited["diverged_round"].where(
        edited["status"] != "diverged", 2))
    p = paired_difference(sound, "S", "T", dataset="synthetic", metric="precision", k=1)
    assert (p.diverged_a, p.diverged_b) == (0, 1)


@pytest.mark.parametrize("value,said", [("inf", "value inf is not a metric in [0, 1]"),
                                        ("7", "value 7.0 is not a metric in [0, 1]"),
                                        ("-0.5", "value -0.5 is not a metric in [0, 1]"),
                                        ("abc", "value 'abc' is not a number")])
def test_plot_refuses_a_table_value_that_is_not_a_metric(sweep_dir, tmp_path, value, said,
                                                        refused):
    # once: inf left its point out of the line without a word (exit 0), 7 was averaged in
    out = sweep_dir / "out"
    (out / "results.parquet").unlink(missing_ok=True)  # the CSV is the table read
    path = out / "results.csv"
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    i = next(n for n, line in enumerate(lines) if n and line.split(",")[header.index("metric")]
             == "precision" and line.split(",")[header.index("k")] == "5")
    row = lines[i].split(",")
    row[header.index("value")] = value
    lines[i] = ",".join(row)
    path.write_text("\n".join(lines) + "\n")
    refused(invoke("plot", out, "--out", tmp_path / "fig"), str(path), f"line {i + 1}",
            "precision@5", said)
    assert not (tmp_path / "fig" / "sweep.png").exists()


@pytest.mark.parametrize("value", ["inf", "1.5", "-0.1"])
def test_plot_refuses_a_run_at_no_byzantine_fraction(sweep_dir, tmp_path, value, refused):
    # once: a run edited to α = inf was drawn, exit 0, in a panel "inf% Byzantine" of its own
    out = sweep_dir / "out"
    (out / "results.parquet").unlink(missing_ok=True)  # the CSV is the table read
    key = sorted(p.name for p in (out / "runs").iterdir())[1]
    first = None
    for name in ("runs.csv", "results.csv"):  # both say the run's α (they must agree)
        table = pd.read_csv(out / name)
        table["alpha"] = table["alpha"].astype(object)
        table.loc[table["key"] == key, "alpha"] = value
        table.to_csv(out / name, index=False)
        if name == "results.csv":
            first = int((table["key"] == key).to_numpy().argmax()) + 2
    for figure in ((), ("--figure", "4")):
        refused(invoke("plot", out, *figure, "--out", tmp_path / "fig"),
                str(out / "results.csv"), f"line {first}", f"alpha {float(value)!r}",
                "not a Byzantine fraction")
    assert not (tmp_path / "fig").exists()


def test_n_counts_the_trials_in_the_mean():
    # NaN in an "ok" row means "not recorded" (a run made before the metric existed): pandas'
    # mean skips it, and n once counted every row, so a mean over 1 trial read "n = 2" (as in
    # ML100K's RFA at α = 0.4, whose NDCG two of five seeds did not record)
    from rfrs_ref.experiments.results import summarise, summary_markdown

    ok = {"status": "ok", "method": "A-FRS", "dataset": "synthetic", "k": 5, "wall_s": 1.0}
    df = pd.DataFrame([
        {**ok, "key": "a", "seed": 0, "metric": "ndcg", "value": 0.25},
        {**ok, "key": "b", "seed": 1, "metric": "ndcg", "value": float("nan")},
        {**ok, "key": "a", "seed": 0, "metric": "precision", "value": 0.2},
        {**ok, "key": "b", "seed": 1, "metric": "precision", "value": 0.3},
        {**ok, "key": "c", "seed": 0, "method": "old", "metric": "ndcg", "value": float("nan")},
        {**ok, "key": "d", "seed": 0, "method": "edited", "metric": "ndcg", "value": float("inf")},
        {**ok, "key": "e", "seed": 1, "method": "edited", "metric": "ndcg", "value": 0.5},
    ])
    s = summarise(df).set_index(["method", "metric"])
    assert (s.loc[("A-FRS", "ndcg"), "mean"], s.loc[("A-FRS", "ndcg"), "n"]) == (0.25, 1)
    assert (s.loc[("A-FRS", "precision"), "mean"], s.loc[("A-FRS", "precision"), "n"]) == (
        pytest.approx(0.25), 2)
    assert np.isnan(s.loc[("old", "ndcg"), "mean"]) and s.loc[("old", "ndcg"), "n"] == 0
    # an infinite value is never the mean, nor counted in it
    assert (s.loc[("edited", "ndcg"), "mean"], s.loc[("edited", "ndcg"), "n"]) == (0.5, 1)
    md = summary_markdown(summarise(df), metrics=("ndcg",))
    assert "| A-FRS | 0.2500 | 1 |" in md and "inf" not in md


# -- flower: a run that diverged on the federation ---------------------------------------------
def _diverged_final(run_dir):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "final_metrics.json").write_text(json.dumps({
        "status": "diverged", "round": 3, "reason": "non-finite server state",
        "what": "'theta': 5 of 100 values", "checkpoint": None, "message": "m",
        "last_evaluation": None}))


def test_flower_simulate_reports_a_diverged_run_in_one_line(tmp_path, monkeypatch, refused):
    # Flower ends the simulation without passing the trainer's Diverged on: the command
    # once ended in a traceback (RuntimeError) instead of saying the run diverged
    import rfrs_ref.flower.run

    out = tmp_path / "run"

    def simulate(config, run_dir, **kw):
        _diverged_final(out)
        raise RuntimeError("the Flower simulation ended without finishing the run; see the "
                           "log above")

    monkeypatch.setattr(rfrs_ref.flower.run, "simulate", simulate)
    res = invoke("flower", "simulate", "--rounds", 3, "--out", out)
    refused(res, "diverged at round 3", "non-finite server state")


def test_flower_deploy_never_reports_a_diverged_run_as_finished(tmp_path, monkeypatch, refused):
    # a deployment whose server app diverged: its final_metrics.json has no model, and the
    # command once ended in a KeyError traceback reading it as a finished run's
    import rfrs_ref.flower.deploy

    out = tmp_path / "run"

    def deploy(config, run_dir, **kw):
        _diverged_final(out)
        return {"seconds": 1.0, "logs": str(tmp_path)}

    monkeypatch.setattr(rfrs_ref.flower.deploy, "deploy", deploy)
    res = invoke("flower", "deploy", "--rounds", 3, "--out", out)
    refused(res, "diverged at round 3")
    assert "after round" not in res.output


# -- a checkpoint is written only from a finite state --------------------------------------------
def test_a_checkpoint_never_holds_a_non_finite_private_state(tmp_path):
    """FMF's private client state (here AdaGrad's accumulator r at lr 1e18, float32) can
    overflow while the shared state stays finite. It was checked only at evaluation rounds,
    so checkpoints between them were written with ±inf in 'private r': the run diverged at
    its next evaluation, "checkpoint.npz (round 3) is kept", and train --resume refused that
    checkpoint as non-finite. A round that writes a checkpoint now checks the private state
    too: the run diverges at that round and the checkpoint kept is the last finite one."""
    run = tmp_path / "run"
    res = invoke("train", "--dataset", "synthetic", "--synthetic-users", 80,
                 "--synthetic-items", 50, "--client-fraction", 0.5, "--backend", "numpy",
                 "--model", "fmf", "--optimizer", "adagrad", "--lr", 1e18, "--dtype", "float32",
                 "--rounds", 4, "--eval-every", 4, "--checkpoint-every", 1, "--out", run)
    assert res.exit_code != 0 and "'private r'" in res.output, res.output
    final = json.loads((run / "final_metrics.json").read_text())
    assert final["status"] == "diverged"
    with np.load(run / "checkpoint.npz", allow_pickle=False) as z:
        assert int(z["round"]) == final["checkpoint"] == final["round"] - 1
        assert all(np.isfinite(z[k]).all() for k in z.files if z[k].dtype.kind == "f")
    res = invoke("train", "--resume", run)  # continues from it, and diverges again there
    assert f"Error: round {final['round']}:" in res.output, res.output


# -- a round whose every upload is non-finite ------------------------------------------------
@pytest.mark.parametrize("defense", ["krum", "rfa", "mda", "monna", "caf", "smea"])
def test_a_round_of_non_finite_uploads_only_keeps_the_state_and_the_run_goes_on(tmp_path,
                                                                                 defense):
    """With verification off (SGD) a round may sample only Byzantine clients uploading +inf:
    a robust rule has nothing finite to combine. The run once stopped there with "every
    client holds NaN or ±inf ... nothing finite to aggregate" (and MoNNA whenever a
    Byzantine client sat at its pivot position): Byzantine uploads are input, not a crash.
    Such a round now keeps the server state, as a round whose every upload verification
    excluded does, and says why in its record."""
    res = invoke("train", "--dataset", "synthetic", "--synthetic-users", 100,
                 "--synthetic-items", 60, "--synthetic-mean-items", 8, "--client-fraction", 0.1,
                 "--rounds", 10, "--eval-every", 10, "--optimizer", "sgd", "--defense", defense,
                 "--attack", "inf", "--byzantine-fraction", 0.9, "--assumed-byzantine", 0.2,
                 "--out", tmp_path / "run")
    assert res.exit_code == 0, res.output
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    skipped = [r for r in rounds if "no finite upload" in str(r["rule"].get("skipped"))]
    assert skipped, "the test needs a round whose every sampled client is Byzantine"
    by_round = {r["round"]: r for r in rounds}
    for r in skipped:
        assert all(w == 0 for w in r["weights"]) and r["n_byzantine_kept"] == 0
        before = by_round.get(r["round"] - 1)
        if before is not None:  # the state after the round is the state before it
            assert r["state_norms"] == before["state_norms"]
    assert json.loads((tmp_path / "run" / "final_metrics.json").read_text())
