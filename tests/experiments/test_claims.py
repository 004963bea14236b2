"""Paired differences over seeds, their Student-t intervals, the verdicts, the claims
registry and ``rfrs-ref verdict``."""

from __future__ import annotations

import math
import pathlib

import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from rfrs_ref.experiments.claims import (CLAIMS, FAILS, HOLDS, INCONCLUSIVE, NOT_RUN,
                                         TableError, claim, evaluate, evaluate_claim,
                                         find_results, paired_difference, paired_interval,
                                         verdict, verdict_markdown)
from rfrs_ref.experiments.figures import FIGURES

# -- known answers, by hand: t(0.975, 2) = 4.303, t(0.975, 4) = 2.776 (printed tables) ----------


def test_three_differences_by_hand():
    p = paired_interval([1.0, 2.0, 3.0])
    # mean 2, s = 1, s/sqrt(3) = 0.57735; half-width 4.303 * 0.57735 = 2.484
    assert p.n == 3 and p.mean == pytest.approx(2.0) and p.sd == pytest.approx(1.0)
    assert p.lo == pytest.approx(2 - 2.4842, abs=2e-3) and p.hi == pytest.approx(4.4842, abs=2e-3)
    assert p.verdict(+1) == INCONCLUSIVE and p.verdict(-1) == INCONCLUSIVE


def test_five_differences_by_hand():
    p = paired_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    # mean 3, s = sqrt(2.5) = 1.5811, s/sqrt(5) = 0.70711; half-width 2.776 * 0.70711 = 1.963
    assert p.lo == pytest.approx(1.0368, abs=2e-3) and p.hi == pytest.approx(4.9632, abs=2e-3)
    assert p.verdict(+1) == HOLDS and p.verdict(-1) == FAILS


def test_degenerate_samples():
    assert paired_interval([]).n == 0 and paired_interval([]).verdict() == INCONCLUSIVE
    one = paired_interval([0.5])
    assert one.n == 1 and one.mean == 0.5 and one.lo is None and one.verdict() == INCONCLUSIVE
    same = paired_interval([0.0, 0.0, 0.0])  # identical runs: the interval is the point 0
    assert (same.lo, same.hi) == (0.0, 0.0) and same.verdict() == INCONCLUSIVE
    shifted = paired_interval([0.1, 0.1, 0.1])
    assert shifted.verdict() == HOLDS
    with pytest.raises(ValueError, match="finite"):
        paired_interval([1.0, float("nan")])
    with pytest.raises(ValueError, match="direction"):
        verdict(1.0, 2.0, 0)


diffs = st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=2, max_size=12)


@given(diffs)
def test_swapping_the_series_negates_the_interval(d):
    p, q = paired_interval(d), paired_interval([-x for x in d])
    assert q.mean == pytest.approx(-p.mean, abs=1e-12)
    assert q.lo == pytest.approx(-p.hi, abs=1e-12) and q.hi == pytest.approx(-p.lo, abs=1e-12)
    flipped = {HOLDS: FAILS, FAILS: HOLDS, INCONCLUSIVE: INCONCLUSIVE}
    if min(abs(p.lo), abs(p.hi)) > 1e-9:  # away from the boundary, rounding cannot flip it
        assert q.verdict(+1) == flipped[p.verdict(+1)]


@given(diffs, st.floats(-2.0, 2.0, allow_nan=False))
def test_a_constant_shift_moves_the_interval_by_that_constant(d, c):
    p, q = paired_interval(d), paired_interval([x + c for x in d])
    assert q.sd == pytest.approx(p.sd, abs=1e-9)
    assert q.lo == pytest.approx(p.lo + c, abs=1e-9) and q.hi == pytest.approx(p.hi + c, abs=1e-9)


@given(st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=2, max_size=12))
def test_the_interval_contains_the_mean_and_widens_with_confidence(d):
    p90, p95 = paired_interval(d, 0.90), paired_interval(d, 0.95)
    assert p95.lo <= p90.lo + 1e-15 <= p90.mean + 2e-15 and p90.hi <= p95.hi + 1e-15


# -- tables -------------------------------------------------------------------------------------
def _table(values: dict, *, dataset="ml100k", alpha=0.4, extra_rows=()) -> pd.DataFrame:
    """A tidy table: values[(series, seed)] = P@1 (P@5 and R@5 the same minus 0.01)."""
    rows = []
    for (series, seed), v in values.items():
        for metric, k, off in (("precision", 1, 0.0), ("precision", 5, 0.01),
                               ("recall", 5, 0.01)):
            rows.append({"status": "ok", "label_series": series, "dataset": dataset,
                         "alpha": alpha, "seed": seed, "metric": metric, "k": k,
                         "value": v - off})
    rows.extend(extra_rows)
    return pd.DataFrame(rows)


def test_pairs_are_matched_by_seed_and_unpaired_or_failed_runs_are_left_out():
    t = _table({("A", 0): 0.3, ("A", 1): 0.5, ("A", 2): 0.4, ("B", 0): 0.1, ("B", 1): 0.2,
                ("B", 2): 0.3, ("A", 3): 0.9},
               extra_rows=[{"status": "failed", "label_series": "B", "dataset": "ml100k",
                            "alpha": 0.4, "seed": 3, "metric": None, "k": None,
                            "value": None},
                           {"status": "failed", "label_series": "B", "dataset": "ml100k",
                            "alpha": 0.4, "seed": 4, "metric": "precision", "k": 1,
                            "value": float("nan")}])
    p = paired_difference(t, "A", "B", dataset="ml100k", alpha=0.4, metric="precision", k=1)
    assert p.seeds == (0, 1, 2) and p.n == 3
    assert p.mean == pytest.approx(0.2) and p.mean_a == pytest.approx(0.4)
    # differences 0.2, 0.3, 0.1: s = 0.1, half-width 4.303 * 0.1 / sqrt(3) = 0.2484
    assert p.lo == pytest.approx(-0.0484, abs=2e-3) and p.verdict() == INCONCLUSIVE
    other = paired_difference(t, "A", "B", dataset="lastfm", alpha=0.4, metric="precision", k=1)
    assert other.n == 0


def test_every_claim_names_a_figure_and_series_of_that_figure():
    assert len(CLAIMS) == len({c.id for c in CLAIMS}) >= 9
    for c in CLAIMS:
        fig = FIGURES.get(c.figure)
        assert fig.experiment == c.experiment
        if c.kind == "table":
            assert c.a in fig.series
            assert all(b in fig.series or b == "best baseline" for b in c.against)
    lastfm = claim("arfrs-lastfm-33.7")
    assert lastfm.datasets == ("lastfm",) and lastfm.alphas == (0.4,)
    assert lastfm.paper_relative == pytest.approx(0.337)


def _write_store(d, table):
    d.mkdir(parents=True)
    table.to_csv(d / "results.csv", index=False)


def test_verdicts_from_directories_and_not_run_rows(tmp_path):
    seeds = range(5)
    good = {**{("A-RFRS", s): 0.30 + 0.01 * s for s in seeds},
            **{("Krum", s): 0.20 + 0.012 * s for s in seeds},
            **{("Trmean", s): 0.40 + 0.01 * s for s in seeds},
            **{("No defense", s): 0.30 + 0.01 * s for s in seeds}}
    _write_store(tmp_path / "fig4", _table(good, dataset="lastfm"))
    found = find_results([tmp_path])
    assert set(found) == {"fig4"}
    rows = evaluate_claim(claim("arfrs-all"), found)
    by = {r.against: r for r in rows}
    assert by["Krum"].verdict == HOLDS and by["Trmean"].verdict == FAILS
    assert by["No defense"].verdict == INCONCLUSIVE  # identical runs
    assert by["RFA"].verdict == NOT_RUN and by["RFA"].n == 0
    assert by["Krum"].command() == f"rfrs-ref reproduce 4 --datasets lastfm --out {tmp_path / 'fig4'}"
    best = evaluate_claim(claim("arfrs-lastfm-33.7"), found)
    assert len(best) == 1 and best[0].verdict == FAILS and "Trmean" in best[0].note
    assert "-23.8%" in best[0].note and "+33.7%" in best[0].note  # 0.32 / 0.42 - 1
    every = evaluate(found)
    assert {r.claim.id for r in every} == {c.id for c in CLAIMS}
    (tmp_path / "fig4").rename(tmp_path / "ablation-init")
    ablated = evaluate(find_results([tmp_path]), ablations=["ablation-init"])
    krum = [r for r in ablated if r.figure == "ablation-init" and r.against == "Krum"]
    assert krum and all(r.verdict == HOLDS and r.alpha == 0.4 for r in krum)
    assert krum[0].command().startswith("rfrs-ref reproduce ablation-init --datasets lastfm")
    assert all(r.verdict == NOT_RUN for r in ablated if r.figure is None
               and r.claim.experiment == "defenses")
    missing = [r for r in every if r.claim.id == "adam-sgd"]
    assert missing and all(r.verdict == NOT_RUN for r in missing)
    md = verdict_markdown(every)
    assert md.count("\n") == len(every) + 2 and "not run" in md and "| holds |" in md


def test_verdict_command_writes_the_table_and_reports_missing_results(tmp_path):
    from rfrs_ref.cli.main import main

    seeds = range(3)
    _write_store(tmp_path / "adam-sgd",
                 _table({**{("Adam", s): 0.2 + 0.01 * s for s in seeds},
                         **{("SGD", s): 0.3 + 0.02 * s for s in seeds}}, alpha=0.0))
    out = tmp_path / "v" / "verdict.md"
    res = CliRunner().invoke(main, ["verdict", str(tmp_path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    md = out.read_text()
    adam = [line for line in md.splitlines() if "Adam outperforms SGD" in line]
    assert len(adam) == 1 and "| does not hold |" in adam[0] and "| 3 |" in adam[0]
    assert "| ml100k | 0 |" in adam[0]
    assert "rfrs-ref reproduce 10 --datasets ml100k" in adam[0]
    assert "not run" in md
    csv = pd.read_csv(out.with_suffix(".csv"))
    row = csv[(csv["claim"] == "adam-sgd") & (csv["k"] == 1)].iloc[0]
    assert row["verdict"] == FAILS and row["mean"] == pytest.approx(-0.11)  # -0.10, -0.11, -0.12
    bad = CliRunner().invoke(main, ["verdict", str(tmp_path), "--out", str(tmp_path / "x.txt")])
    assert bad.exit_code != 0 and ".md" in bad.output and "Traceback" not in bad.output
    assert not (tmp_path / "x.txt").exists()
    (tmp_path / "fig3").mkdir()
    (tmp_path / "fig3" / "results.csv").write_text("a,b\n1,2\n")
    hostile = CliRunner().invoke(main, ["verdict", str(tmp_path)])
    assert hostile.exit_code != 0 and "not a results table" in hostile.output
    assert "Traceback" not in hostile.output
    unknown = CliRunner().invoke(main, ["verdict", str(tmp_path), "--claim", "nope"])
    assert unknown.exit_code != 0 and "unknown claim" in unknown.output


@pytest.mark.parametrize("name", ["adam-sgd-quick", "fig10-20rounds"])
def test_a_results_directory_with_a_suffix_is_read(tmp_path, name):
    """``reproduce --quick`` writes adam-sgd-quick: its claims are judged from it."""
    from rfrs_ref.cli.main import main

    seeds = range(3)
    _write_store(tmp_path / name, _table({**{("Adam", s): 0.2 + 0.01 * s for s in seeds},
                                          **{("SGD", s): 0.3 + 0.02 * s for s in seeds}},
                                         alpha=0.0))
    res = CliRunner().invoke(main, ["verdict", str(tmp_path / name)])
    assert res.exit_code == 0, res.output
    adam = [line for line in res.output.splitlines() if "Adam outperforms SGD" in line]
    assert len(adam) == 1 and "| does not hold |" in adam[0] and f"--out {tmp_path / name}" in adam[0]


def test_two_suffixed_directories_and_no_exact_one_are_not_guessed_between(tmp_path):
    """adam-sgd-a and adam-sgd-b, no adam-sgd: the first in name order used to be judged
    without a word; now neither is, the row says why, and each alone is judged."""
    from rfrs_ref.cli.main import main

    seeds = range(3)
    for name, shift in (("adam-sgd-a", 0.0), ("adam-sgd-b", 0.2)):
        _write_store(tmp_path / name, _table({**{("Adam", s): 0.2 + shift + 0.01 * s for s in seeds},
                                              **{("SGD", s): 0.3 + 0.02 * s for s in seeds}},
                                             alpha=0.0))
    res = CliRunner().invoke(main, ["verdict", str(tmp_path), "--claim", "adam-sgd"])
    assert res.exit_code == 1, res.output
    assert "several results directories (adam-sgd-a, adam-sgd-b)" in res.output
    assert "| does not hold |" not in res.output and "| holds |" not in res.output
    res = CliRunner().invoke(main, ["verdict", str(tmp_path / "adam-sgd-b"), "--claim", "adam-sgd"])
    assert res.exit_code == 0 and "| holds |" in res.output, res.output


def test_a_results_directory_no_claim_reads_is_named(tmp_path):
    from rfrs_ref.cli.main import main

    seeds = range(3)
    _write_store(tmp_path / "mine", _table({**{("Adam", s): 0.2 for s in seeds},
                                            **{("SGD", s): 0.3 for s in seeds}}, alpha=0.0))
    res = CliRunner().invoke(main, ["verdict", str(tmp_path / "mine")])
    assert res.exit_code == 1, res.output
    assert f"the results in {tmp_path / 'mine'} are in directories whose names no claim reads" \
        in res.output and "adam-sgd" in res.output and "Traceback" not in res.output


def test_verdict_that_judged_nothing_is_not_a_success(tmp_path):
    """Results folders with no run of any claim's series (an empty folder, a typo in a
    path's parent) give a table of "not run" rows and exit status 1."""
    from rfrs_ref.cli.main import main

    (tmp_path / "empty").mkdir()
    out = tmp_path / "verdict.md"
    res = CliRunner().invoke(main, ["verdict", str(tmp_path / "empty"), "--out", str(out)])
    assert res.exit_code == 1, res.output
    assert "no claim could be judged" in res.output and "Traceback" not in res.output
    assert out.exists() and "| not run |" in out.read_text()
    assert "| holds |" not in out.read_text() and "does not hold" not in out.read_text()


def test_fig1_separation_claim_from_capture_runs(ex, tmp_path):
    from rfrs_ref.experiments.figures import Scale, figure, reproduce

    data = {"dataset_params": {"n_users": 200, "n_items": 60, "mean_items": 10.0}}
    reproduce(figure("1"), Scale(datasets=("synthetic",), overrides=data), tmp_path / "pca",
              workers=0, threads=1, plot=False)
    rows = evaluate_claim(claim("pca"), find_results([tmp_path]))
    assert len(rows) == 2 and all(r.n == 1 for r in rows)
    assert all(r.verdict == INCONCLUSIVE for r in rows)  # one seed: no interval
    assert all(math.isfinite(r.results[("separation", 0)].mean) for r in rows)
    # explicit trials give several seeds; another initialisation sits in pca-<name>
    scale = Scale(datasets=("synthetic",), trials=2, overrides={**data, "init_scale": 1.0})
    report, paths = reproduce(figure("1"), scale, tmp_path / "pca-init1", workers=0, threads=1)
    assert report.finished == 4 and paths
    rows = evaluate_claim(claim("pca"), find_results([tmp_path]))
    assert [r.n for r in rows] == [1, 1, 2, 2]
    assert all("init N(0, 1²)" in r.against for r in rows[2:])
    assert rows[2].command().startswith("rfrs-ref reproduce 1 --trials 2 --set init_scale=1 ")


def test_fig2_pairs_no_attack_with_the_attacked_runs_across_fractions(tmp_path):
    clean = _table({("No attack", s): 0.30 + 0.01 * s for s in range(3)}, alpha=0.0)
    attacked = _table({("Camouflage attack (40%)", s): 0.20 + 0.012 * s for s in range(3)},
                      alpha=0.4)
    _write_store(tmp_path / "camouflage", pd.concat([clean, attacked]))
    (row,) = evaluate_claim(claim("camouflage"), find_results([tmp_path]))
    assert row.n == 3 and row.alpha is None and row.verdict == HOLDS


def test_the_rounds_ablation_is_judged_on_fig4_and_fig10_where_their_runs_are(tmp_path):
    seeds = range(3)
    defences = _table({**{("A-RFRS", s): 0.30 + 0.01 * s for s in seeds},
                       **{("Krum", s): 0.20 + 0.012 * s for s in seeds}}, alpha=0.4)
    adam_sgd = _table({**{("Adam", s): 0.30 + 0.01 * s for s in seeds},
                       **{("SGD", s): 0.40 + 0.011 * s for s in seeds}}, alpha=0.0)
    _write_store(tmp_path / "ablation-rounds", pd.concat([defences, adam_sgd]))
    rows = [r for r in evaluate(find_results([tmp_path]), ablations=["ablation-rounds"])
            if r.figure == "ablation-rounds"]
    by_claim: dict = {}
    for r in rows:
        by_claim.setdefault(r.claim.id, []).append(r)
    # Fig. 10's claim only at α = 0, where Adam and SGD ran: SGD is better
    assert [(r.alpha, r.against, r.verdict) for r in by_claim["adam-sgd"]] == [(0.0, "SGD", FAILS)]
    # Fig. 4's claims only at α = 0.4 and only on the dataset that has A-RFRS runs
    assert {r.alpha for c in ("arfrs-all", "arfrs-krum") for r in by_claim[c]} == {0.4}
    assert "arfrs-lastfm-33.7" not in by_claim  # no Last.fm run in this directory
    krum = [r for r in by_claim["arfrs-krum"]]
    assert len(krum) == 1 and krum[0].verdict == HOLDS
    assert krum[0].command().startswith("rfrs-ref reproduce ablation-rounds --datasets ml100k")


def test_the_command_of_a_reduced_run_repeats_its_scale(tmp_path):
    """A verdict row of 20-round, 1-trial runs used to give the command of the full grid
    (1,000 rounds, 5 trials) with that directory as --out."""
    from rfrs_ref.experiments.claims import scale_options
    from rfrs_ref.experiments.figures import DEFAULT_ROUNDS

    d = tmp_path / "adam-sgd-20rounds-1trials"
    d.mkdir()
    pd.DataFrame({"dataset": ["ml100k"] * 2, "rounds": [20, 20], "trial": [0, 0]}).to_csv(
        d / "runs.csv", index=False)
    assert scale_options(d, "ml100k", "10") == " --rounds 20 --trials 1"
    full = tmp_path / "adam-sgd"
    full.mkdir()
    pd.DataFrame({"dataset": ["ml100k"] * 5, "rounds": [DEFAULT_ROUNDS["ml100k"]] * 5,
                  "trial": range(5)}).to_csv(full / "runs.csv", index=False)
    assert scale_options(full, "ml100k", "10") == ""
    assert scale_options(tmp_path / "nowhere", "ml100k", "10") == ""
    # Fig. 4 on a dataset run at some of its fractions only: the command runs those
    fig4 = tmp_path / "defenses"
    fig4.mkdir()
    rows = [{"dataset": ds, "rounds": DEFAULT_ROUNDS[ds], "trial": t, "alpha": a}
            for ds, alphas, trials in (("ml100k", (0.2, 0.3, 0.4), 5),
                                       ("citeulike-a", (0.4, 0.2), 2))
            for a in alphas for t in range(trials)]
    pd.DataFrame(rows).to_csv(fig4 / "runs.csv", index=False)
    assert scale_options(fig4, "ml100k", "4") == ""
    assert scale_options(fig4, "citeulike-a", "4") == " --trials 2 --alphas 0.2,0.4"


@pytest.mark.parametrize("value", [float("nan"), None, float("inf"), -float("inf")])
def test_a_finished_run_without_a_finite_value_is_refused_not_unpaired(value):
    """A NaN in a row whose status is ok was once left out as an unpaired seed, which
    silently changed the seeds compared and the best baseline; it is refused like inf."""
    t = _table({("A", 0): 0.3, ("A", 1): 0.5, ("A", 2): 0.4, ("B", 0): 0.1, ("B", 1): 0.2},
               extra_rows=[{"status": "ok", "label_series": "B", "dataset": "ml100k",
                            "alpha": 0.4, "seed": 2, "metric": "precision", "k": 1,
                            "value": value}])
    with pytest.raises(TableError, match=r"line \d+, series 'B', seed 2, precision@1: "):
        paired_difference(t, "A", "B", dataset="ml100k", alpha=0.4, metric="precision", k=1)
    # another metric of the same run is judged as before
    paired_difference(t, "A", "B", dataset="ml100k", alpha=0.4, metric="recall", k=5)


def _defenses_copy(tmp_path):
    import shutil

    src = pathlib.Path(__file__).resolve().parents[2] / "results" / "defenses"
    if not (src / "runs.csv").is_file():
        pytest.skip("results/defenses is not in this checkout")
    d = tmp_path / "defenses"
    shutil.copytree(src, d, ignore=shutil.ignore_patterns("runs", "figures", ".lock"))
    (d / "results.parquet").unlink(missing_ok=True)
    return d


@pytest.mark.parametrize("value", ["nan", ""])
def test_verdict_refuses_a_nan_metric_of_a_finished_run_naming_file_and_line(tmp_path, value):
    import pandas as pd

    from rfrs_ref.cli.main import main

    d = _defenses_copy(tmp_path)
    results = pd.read_csv(d / "results.csv", dtype=str, keep_default_na=False)
    runs = pd.read_csv(d / "runs.csv")
    krum = runs.loc[(runs["label_series"] == "Krum") & (runs["dataset"] == "lastfm")
                    & (runs["alpha"] == 0.4) & (runs["seed"] == 0), "key"].iloc[0]
    row = results.index[(results["key"] == krum) & (results["metric"] == "precision")
                        & (results["k"] == "1")][0]
    results.loc[row, "value"] = value
    results.to_csv(d / "results.csv", index=False)
    res = CliRunner().invoke(main, ["verdict", str(d), "--out", str(tmp_path / "v.md")])
    assert res.exit_code == 1, res.output
    assert (f"{d / 'results.csv'}: line {row + 2}, series 'Krum', seed 0, precision@1: "
            "no value (empty or NaN) in a finished run") in res.output
    assert "Traceback" not in res.output


def test_the_committed_defenses_table_is_still_judged(tmp_path):
    from rfrs_ref.cli.main import main

    d = _defenses_copy(tmp_path)
    res = CliRunner().invoke(main, ["verdict", str(d), "--claim", "arfrs-lastfm-33.7"])
    assert res.exit_code == 0, res.output
    assert "best baseline: Krum" in res.output


@pytest.mark.parametrize("name", ["results.md", "summary.md", "report.md"])
def test_verdict_out_never_replaces_a_table_it_did_not_write(tmp_path, name):
    """--out X.md also writes X.csv: into a results directory as results.md it replaced the
    sweep's results.csv, as summary.md its summary; a user's report.csv beside report.md
    was replaced too."""
    from rfrs_ref.cli.main import main

    seeds = range(3)
    d = tmp_path / "adam-sgd"
    _write_store(d, _table({**{("Adam", s): 0.2 + 0.01 * s for s in seeds},
                            **{("SGD", s): 0.3 + 0.02 * s for s in seeds}}, alpha=0.0))
    (d / "report.csv").write_text("my,own\n1,2\n")
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    res = CliRunner().invoke(main, ["verdict", str(tmp_path), "--out", str(d / name)])
    assert res.exit_code == 2, res.output
    assert "nothing was written" in res.output or "own table" in res.output, res.output
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before
    # a verdict table written before is rewritten
    res = CliRunner().invoke(main, ["verdict", str(tmp_path), "--out", str(tmp_path / "v.md")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["verdict", str(tmp_path), "--out", str(tmp_path / "v.md")])
    assert res.exit_code == 0, res.output
