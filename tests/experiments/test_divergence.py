"""Diverged runs are outcomes: the worker records them, sweeps never run them again, the
tables count them, the figures name them, the verdicts judge them; and outcomes recorded
as failures by earlier versions are read as diverged when they were."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from rfrs_ref.experiments.claims import (FAILS, HOLDS, INCONCLUSIVE, Paired, claim,
                                         evaluate_claim, find_results, paired_difference,
                                         paired_interval, verdict_frame, verdict_markdown)
from rfrs_ref.experiments.committed import read_provenance
from rfrs_ref.experiments.results import (Store, divergence_of, read_table, run_status,
                                          summarise, summary_markdown, tidy_rows)
from rfrs_ref.experiments.spec import RunSpec
from rfrs_ref.experiments.sweep import run_sweep
from rfrs_ref.experiments.worker import execute_run
from rfrs_ref.federated.trainer import DIVERGED_SCORES, DIVERGED_STATE

#: momentum at a huge learning rate against 40% gradient-ascent clients and no defence: the
#: state stays finite but the scores overflow float32 at an evaluation (round 3 to 5 here)
SCORES = {"optimizer": "momentum", "optimizer_params": {"lr": 1e6}, "attack": "ascent",
          "byzantine_fraction": 0.4, "defense": "none", "rounds": 6, "eval_every": 1}
#: SGD (its uploads cannot be verified) against 1e38 noise: the aggregated state overflows
STATE = {"optimizer": "sgd", "attack": "noise", "attack_params": {"sigma": 1e38},
         "byzantine_fraction": 0.3, "rounds": 4, "eval_every": 2}

LEGACY_SCORES = ("ValueError: the scores of user 3 hold NaN or infinity (the model diverged): "
                 "ranking metrics are only defined for finite scores")
LEGACY_STATE = ("NonFiniteState: round 7: the aggregated server state 'theta' holds 55 "
                "non-finite value(s) (NaN or ±inf) of 12800; training stopped before evaluating "
                "it. No checkpoint was written in /x. Such uploads reach the state only without "
                "a robust defence or without update-rule verification")
LEGACY_INITIAL = ("NonFiniteState: the initial state 'theta' holds 12800 non-finite value(s) "
                  "(NaN or ±inf) of 12800; training stopped before evaluating it. The initial "
                  "scale is too large for the dtype")


def _task(spec, run_dir=None):
    return {"spec": spec.to_json(), "key": spec.key, "run_dir": run_dir, "data_dir": None,
            "keep_state": False}


# -- the worker ------------------------------------------------------------------------------
@pytest.mark.parametrize("fields, reason", [(SCORES, DIVERGED_SCORES), (STATE, DIVERGED_STATE)],
                         ids=["scores", "state"])
def test_a_diverged_run_is_an_outcome_with_its_round_reason_and_history(ex, tmp_path, fields,
                                                                        reason):
    spec = RunSpec(ex.tiny_config(**fields))
    out = execute_run(_task(spec, str(tmp_path / "run")))
    assert out["status"] == "diverged" and out["traceback"] is None
    d = out["divergence"]
    assert d["reason"] == reason and 1 <= d["round"] <= spec.config.rounds
    assert out["error"].startswith(f"Diverged: round {d['round']}: ")
    # the recorded message names no path of this host, and no checkpoint (the sweep removes
    # it); it once said "/tmp/.../run/checkpoint.npz (round 600) is kept" of a deleted file
    assert str(tmp_path) not in out["error"] and "checkpoint" not in out["error"]
    # the history before the divergence: round 0 first, every row finite and before it
    assert out["history"][0]["round"] == 0
    assert all(row["round"] < d["round"] for row in out["history"])
    assert [r["round"] for r in out["rounds"]] == list(range(1, d["round"]))
    assert "final" not in out and out["dataset"]["users"] == ex.TINY_DATA["n_users"]
    # the run directory says so, and keeps neither checkpoint nor state
    final = json.loads((tmp_path / "run" / "final_metrics.json").read_text())
    assert final["status"] == "diverged" and final["round"] == d["round"]
    assert final["reason"] == reason
    assert not (tmp_path / "run" / "checkpoint.npz").exists()
    assert not (tmp_path / "run" / "state.npz").exists()
    # deterministic: the same run diverges at the same round, in a temporary directory too
    again = execute_run(_task(spec))
    assert again["divergence"] == d and again["history"] == out["history"]
    assert json.loads(again["files"]["final_metrics.json"])["status"] == "diverged"


# -- the sweep -------------------------------------------------------------------------------
def _specs(ex, seeds=(0, 1)):
    ok = [RunSpec(ex.tiny_config(seed=s, rounds=2, eval_every=1), trial=s,
                  labels={"series": "A"}) for s in seeds]
    bad = [RunSpec(ex.tiny_config(seed=s, **SCORES), trial=s, labels={"series": "B"})
           for s in seeds]
    return ok, bad


def test_a_sweep_records_diverged_runs_once_and_never_runs_them_again(ex, tmp_path):
    ok, bad = _specs(ex)
    report = run_sweep(ok + bad, tmp_path, workers=0, threads=1)
    assert (report.finished, report.diverged, report.failed, report.pending) == (2, 2, 0, 0)
    assert [d["round"] >= 1 for _, d in report.divergences] == [True, True]
    (call,) = read_provenance(tmp_path)["calls"]
    assert call["runs"] == {"total": 4, "skipped": 0, "finished": 2, "failed": 0, "diverged": 2}
    stored = Store(tmp_path).read_outcome(bad[0].key)
    assert stored["status"] == "diverged" and stored["divergence"]["round"] >= 1
    assert stored["history"] and "rounds" not in stored  # the compact layout
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()
              and p.name != ".lock"}
    again = run_sweep(ok + bad, tmp_path, workers=0, threads=1, retry_failed=True)
    assert (again.skipped, again.finished, again.diverged, again.failed) == (4, 0, 0, 0)
    assert {p: p.read_bytes() for p in before} == before


def test_tables_count_diverged_trials_and_keep_the_finished_ones_apart(ex, tmp_path):
    ok, bad = _specs(ex)
    report = run_sweep(ok + bad, tmp_path, workers=0, threads=1, label_columns=("label_series",))
    t = read_table(tmp_path)
    div = t[t["status"] == "diverged"]
    assert div["key"].nunique() == 2 and len(div) == 2  # one row per diverged run
    assert div["value"].isna().all() and div["metric"].isna().all()
    assert (div["diverged_round"] >= 1).all()
    assert set(div["diverged_reason"]) == {DIVERGED_SCORES}
    s = report.summary
    p1 = s[(s["metric"] == "precision") & (s["k"] == 1)].set_index("label_series")
    assert p1.loc["A", "diverged"] == "0/2" and p1.loc["A", "n"] == 2
    assert p1.loc["B", "diverged"] == "2/2" and p1.loc["B", "n"] == 0
    assert pd.isna(p1.loc["B", "mean"])
    # the popularity rows of B's configuration are not invented
    assert set(s.loc[s["label_series"] == "B", "metric"]) == {
        "precision", "recall", "ndcg", "hr", "mrr"}
    md = (tmp_path / "summary.md").read_text()
    assert "| finished | diverged |" in md and "trials that finished" in md
    b_line = next(line for line in md.splitlines() if line.startswith("| B |"))
    assert "—" in b_line and b_line.rstrip().endswith("| 0 | 2/2 |")


def test_tables_without_divergence_keep_their_columns(ex, tmp_path):
    ok, _ = _specs(ex)
    report = run_sweep(ok, tmp_path, workers=0, threads=1)
    t = read_table(tmp_path)
    assert not {"diverged_round", "diverged_reason"} & set(t.columns)
    assert not {"diverged", "n_diverged"} & set(report.summary.columns)
    md = (tmp_path / "summary.md").read_text()
    assert "| trials |" in md and "diverged" not in md
    (call,) = read_provenance(tmp_path)["calls"]
    assert "diverged" not in call["runs"]


def test_figures_name_the_diverged_series_instead_of_drawing_them(ex, tmp_path):
    from rfrs_ref.experiments import plots

    ok, bad = _specs(ex)
    run_sweep(ok + bad, tmp_path, workers=0, threads=1)
    t = read_table(tmp_path)
    runs = t[t["status"] == "ok"]
    note = plots._divergence_note(t, runs, "label_series", ["A"], ("dataset", None))
    assert note == "diverged: B 2/2"
    assert plots._divergence_note(t[t["label_series"] == "A"], runs, "label_series", ["A"],
                                  ("dataset",)) == ""
    for path in plots.plot_k_panels(t, tmp_path / "k", series_order=["A", "B"]):
        assert path.exists()
    ex.assert_image_not_blank(tmp_path / "k.png")
    ex.assert_image_not_blank(plots.plot_curves(t, tmp_path, tmp_path / "c")[0])


# -- outcomes recorded as failures by earlier versions ---------------------------------------
def test_legacy_failures_that_were_divergences_are_read_as_diverged():
    scores = divergence_of({"status": "failed", "error": LEGACY_SCORES})
    assert scores == {"round": None, "reason": DIVERGED_SCORES,
                      "what": "the scores of user 3", "legacy": True}
    state = divergence_of({"status": "failed", "error": LEGACY_STATE})
    assert state["round"] == 7 and state["reason"] == DIVERGED_STATE
    assert state["what"] == "'theta': 55 of 12800 values"
    # anything else stays a failure: the initial state, other errors, a message cut or changed
    for error in (LEGACY_INITIAL, "ValueError: K must be an integer in 1..100", None,
                  LEGACY_SCORES[:-10], "RuntimeError: " + LEGACY_SCORES.split(": ", 1)[1],
                  "KilledWorker: " + LEGACY_SCORES):
        assert divergence_of({"status": "failed", "error": error}) is None, error
        assert run_status({"status": "failed", "error": error}) == "failed"
    assert run_status({"status": "failed", "error": LEGACY_SCORES}) == "diverged"
    assert run_status({"status": "ok", "error": LEGACY_SCORES}) == "ok"


@pytest.mark.parametrize("t", [0, 5, 10 ** 30])
def test_a_legacy_divergence_at_no_round_of_the_run_stays_a_failure(tmp_path, t):
    """An earlier version's NonFiniteState names a round of the run, 1 to its rounds: one
    naming round 0 or a round past the last (an edited record or table) was counted as a
    divergence, against its series in verdicts and rankings."""
    from rfrs_ref.experiments.claims import _table
    from rfrs_ref.experiments.spec import make_config

    error = LEGACY_STATE.replace("round 7:", f"round {t}:")
    legacy = {"status": "failed", "error": error}
    spec = RunSpec(make_config({"dataset": "synthetic", "rounds": 4}), trial=0,
                   labels={"series": "A"})
    (row,) = tidy_rows(spec, legacy)
    assert row["status"] == "failed" and "diverged_round" not in row
    # a table written before divergence was an outcome says "failed" with the error
    rows = [{"status": "failed", "error": error, "label_series": "A", "dataset": "ml100k",
             "alpha": 0.2, "seed": 0, "metric": None, "k": None, "value": None, "rounds": 4}]
    pd.DataFrame(rows).to_csv(tmp_path / "results.csv", index=False)
    assert list(_table(tmp_path)["status"]) == ["failed"]
    assert divergence_of(legacy, 4) is None and run_status(legacy, 4) == "failed"
    assert divergence_of({**legacy, "error": LEGACY_STATE.replace("round 7:", "round 4:")},
                         4)["round"] == 4
    assert (divergence_of(legacy) is None) == (t == 0)  # rounds unknown: any round ≥ 1


def test_a_legacy_failure_is_tabulated_as_diverged_and_run_once_more(ex, tmp_path):
    _, bad = _specs(ex, seeds=(0,))
    spec = bad[0]
    legacy = {"key": spec.key, "status": "failed", "error": LEGACY_SCORES,
              "traceback": "Traceback ...", "wall_s": 1.0}
    (row,) = tidy_rows(spec, legacy)
    assert row["status"] == "diverged" and row["diverged_round"] is None
    store = Store(tmp_path)
    store.write_outcome(spec, legacy)
    # still stored as failed: the next sweep runs it once and records it with its round
    report = run_sweep([spec], tmp_path, workers=0, threads=1)
    assert (report.skipped, report.diverged) == (0, 1)
    assert store.read_outcome(spec.key)["divergence"]["round"] >= 1


# -- verdicts --------------------------------------------------------------------------------
def _cell(values: dict, diverged: dict = (), *, alpha=0.4) -> pd.DataFrame:
    """A tidy table: values[(series, seed)] = P@1 (P@5, R@5 the same); diverged[(series,
    seed)] = True for a diverged run (one row without metric)."""
    rows = []
    for (series, seed), v in values.items():
        for metric, k in (("precision", 1), ("precision", 5), ("recall", 5)):
            rows.append({"status": "ok", "label_series": series, "dataset": "ml100k",
                         "alpha": alpha, "seed": seed, "metric": metric, "k": k, "value": v,
                         "error": None})
    for series, seed in diverged:
        rows.append({"status": "diverged", "label_series": series, "dataset": "ml100k",
                     "alpha": alpha, "seed": seed, "metric": None, "k": None, "value": None,
                     "error": "Diverged: round 3: ..."})
    return pd.DataFrame(rows)


def _pd(t, a, b):
    return paired_difference(t, a, b, dataset="ml100k", alpha=0.4, metric="precision", k=1)


def test_the_series_that_diverged_on_more_seeds_is_the_worse_one():
    # A diverged on 4 of 5 seeds, B on none; A's one finished seed is far better
    t = _cell({("A", 0): 0.9, **{("B", s): 0.1 for s in range(5)}},
              {("A", s) for s in range(1, 5)})
    p = _pd(t, "A", "B")
    assert (p.n, p.total, p.diverged_a, p.diverged_b) == (1, 5, 4, 0)
    assert p.verdict(+1) == FAILS and p.verdict(-1) == HOLDS
    assert p.divergence() == "diverged 4/5 vs 0/5"
    assert p.describe().startswith("diverged 4/5 vs 0/5; Δ +0.8000")
    q = _pd(t, "B", "A")
    assert q.verdict(+1) == HOLDS and q.divergence() == "diverged 0/5 vs 4/5"


def test_equal_divergence_counts_leave_the_interval_over_the_seeds_both_finished():
    # each diverged once, on different seeds: the three seeds both finished decide
    values = {**{("A", s): 0.30 + 0.01 * s for s in range(5)},
              **{("B", s): 0.10 + 0.01 * s for s in range(5)}}
    del values[("A", 0)], values[("B", 1)]
    t = _cell(values, {("A", 0), ("B", 1)})
    p = _pd(t, "A", "B")
    assert (p.n, p.total, p.diverged_a, p.diverged_b) == (3, 5, 1, 1)
    assert p.seeds == (2, 3, 4) and p.mean == pytest.approx(0.2)
    assert p.verdict(+1) == HOLDS  # differences all 0.2: the interval is the point 0.2
    # both diverged on every seed they share, none finished by both: inconclusive
    both = _pd(_cell({}, {("A", 0), ("B", 0), ("A", 1), ("B", 1)}), "A", "B")
    assert (both.n, both.total, both.diverged_a, both.diverged_b) == (0, 2, 2, 2)
    assert both.verdict(+1) == INCONCLUSIVE
    # seeds that only one series ran are not compared
    lone = _pd(_cell({("B", 0): 0.1, ("B", 1): 0.1}, {("A", 0), ("A", 7)}), "A", "B")
    assert (lone.total, lone.diverged_a) == (1, 1) and lone.verdict(+1) == FAILS


def test_without_divergence_a_paired_result_is_as_before():
    t = _cell({**{("A", s): 0.3 + 0.01 * s for s in range(3)},
               **{("B", s): 0.1 for s in range(3)}})
    p = _pd(t, "A", "B")
    diffs = [(0.3 + 0.01 * s) - 0.1 for s in range(3)]
    assert p == paired_interval(diffs, seeds=[0, 1, 2], mean_a=p.mean_a, mean_b=p.mean_b)
    assert p.total == p.n == 3 and not p.diverged and p.divergence() == ""
    assert Paired(0, None, None, None, None).total == 0


def test_verdict_tables_show_divergence_counts(tmp_path):
    seeds = range(5)
    values = {**{("S-RFRS", s): 0.3 for s in seeds}, **{("Trmean", s): 0.4 for s in seeds},
              ("Krum", 0): 0.9}
    diverged = {("RFA", s) for s in seeds} | {("No defense", s) for s in seeds} | {
        ("Krum", s) for s in range(1, 5)}
    d = tmp_path / "momentum"
    d.mkdir()
    _cell(values, diverged).to_csv(d / "results.csv", index=False)
    rows = evaluate_claim(claim("srfrs"), find_results([tmp_path]))
    by = {r.against: r for r in rows}
    assert by["RFA"].verdict == HOLDS and by["No defense"].verdict == HOLDS
    assert by["Krum"].verdict == HOLDS and by["Krum"].divergence == "diverged 0/5 vs 4/5"
    assert by["Trmean"].verdict == FAILS and by["Trmean"].divergence == ""
    assert all(r.n == 5 for r in rows)
    md = verdict_markdown(rows)
    assert "| holds (diverged 0/5 vs 5/5) |" in md and "| does not hold |" in md
    frame = verdict_frame(rows)
    krum = frame[(frame["b"] == "Krum") & (frame["k"] == 1)].iloc[0]
    assert (krum["n"], krum["compared"], krum["diverged_a"], krum["diverged_b"]) == (1, 5, 0, 4)
    assert pd.isna(frame[frame["b"] == "Trmean"]["compared"]).all()


def test_the_best_baseline_is_the_one_that_diverged_least(tmp_path):
    # Krum's one finished seed is the best mean, but it diverged on 4 seeds: RFA is chosen
    seeds = range(5)
    values = {**{("A-RFRS", s): 0.5 for s in seeds}, ("Krum", 0): 0.9,
              **{("RFA", s): 0.3 for s in seeds}, **{("Trmean", s): 0.2 for s in range(4)}}
    d = tmp_path / "defenses"
    d.mkdir()
    t = _cell(values, {("Krum", s) for s in range(1, 5)} | {("Trmean", 4)})
    t["dataset"] = "lastfm"
    t.to_csv(d / "results.csv", index=False)
    (row,) = evaluate_claim(claim("arfrs-lastfm-33.7"), find_results([tmp_path]))
    assert "best baseline: RFA" in row.note and row.verdict == HOLDS


def test_a_results_table_of_an_earlier_version_reads_its_divergences(tmp_path):
    t = _cell({**{("S-RFRS", s): 0.3 for s in range(3)}}, {("Krum", s) for s in range(3)})
    t.loc[t["status"] == "diverged", "status"] = "failed"
    t.loc[t["status"] == "failed", "error"] = LEGACY_SCORES
    d = tmp_path / "momentum"
    d.mkdir()
    t.to_csv(d / "results.csv", index=False)
    krum = next(r for r in evaluate_claim(claim("srfrs"), find_results([tmp_path]))
                if r.against == "Krum")
    assert krum.verdict == HOLDS and krum.divergence == "diverged 0/3 vs 3/3"
    # a failure that is not a divergence stays out of the comparison
    t.loc[t["status"] == "failed", "error"] = "KilledWorker: ..."
    t.to_csv(d / "results.csv", index=False)
    krum = next(r for r in evaluate_claim(claim("srfrs"), find_results([tmp_path]))
                if r.against == "Krum")
    assert krum.n == 0 and krum.verdict == "not run"


def test_the_summary_of_a_hand_built_table_and_its_markdown():
    base = {"dataset": "ml100k", "method": "x", "alpha": 0.4, "ks": "[1]", "wall_s": 1.0}
    rows = [{**base, "key": "a", "status": "ok", "label_series": "A", "seed": 0, "k": 1,
             "metric": "precision", "value": 0.2},
            {**base, "key": "b", "status": "diverged", "label_series": "A", "seed": 1,
             "k": None, "metric": None, "value": None, "diverged_round": 3},
            {**base, "key": "c", "status": "failed", "label_series": "A", "seed": 2,
             "k": None, "metric": None, "value": None}]
    s = summarise(pd.DataFrame(rows))
    assert list(s["diverged"]) == ["1/2"] and list(s["n"]) == [1]  # a failure is no outcome
    md = summary_markdown(s, label_columns=("label_series",))
    assert "| A | ml100k | 0.4 | 0.2000 | 1 | 1/2 |" in md


def test_a_panel_without_a_finished_run_says_so(ex, tmp_path, monkeypatch):
    """A grid cell with no finished run (a sweep still under way) holds no line and says
    so in words; the others hold their lines and no such words."""
    from rfrs_ref.experiments import plots

    ok, _ = _specs(ex)
    run_sweep(ok, tmp_path, workers=0, threads=1, label_columns=("label_series",))
    t = read_table(tmp_path)
    c = t[t["seed"] == 1].copy()
    c["label_series"] = "C"
    t = pd.concat([t[t["seed"] == 0], c], ignore_index=True)  # no (A, 1), no (C, 0)
    figs = []
    monkeypatch.setattr(plots, "save", lambda fig, stem: figs.append(fig) or [])
    plots.plot_k_panels(t, tmp_path / "k", rows="label_series", cols="seed")
    plots.plot_curves(t, tmp_path, tmp_path / "c", rows="label_series", cols="seed")
    assert len(figs) == 2
    for fig in figs:
        said = {ax.get_title(): [x.get_text() for x in ax.texts] for ax in fig.axes}
        empty = sorted(title for title, words in said.items() if words == ["no finished run"])
        assert len(said) == 4 and len(empty) == 2, said
        assert all(words == [] for title, words in said.items() if title not in empty)


def test_a_panel_says_which_series_do_not_record_its_metric(ex, tmp_path, monkeypatch):
    """A finished run without the plotted metric (NaN: recorded before the metric existed)
    is left out of its series' mean, and the panel's title says how many of the series'
    runs lack it; it once averaged the others silently."""
    from rfrs_ref.experiments import plots

    ok, _ = _specs(ex)
    run_sweep(ok, tmp_path, workers=0, threads=1, label_columns=("label_series",))
    t = read_table(tmp_path)
    figs = []
    monkeypatch.setattr(plots, "save", lambda fig, stem: figs.append(fig) or [])
    plots.plot_k_panels(t, tmp_path / "k", metric="ndcg")
    assert "not recorded" not in figs[-1].axes[0].get_title()
    old = t["metric"].eq("ndcg") & t["seed"].eq(1)
    t.loc[old, "value"] = np.nan
    plots.plot_k_panels(t, tmp_path / "k", metric="ndcg")
    assert "NDCG not recorded: A 1/2" in figs[-1].axes[0].get_title()
