"""The ranking of the defences: its grid, its statistics by hand, and a tiny run end to end."""

from __future__ import annotations

import pandas as pd
import pytest
from click.testing import CliRunner

from rfrs_ref.aggregate import RULES
from rfrs_ref.experiments import ranking
from rfrs_ref.experiments.figures import FIGURES, Scale, _grid, figure, reproduce
from rfrs_ref.experiments.spec import check_unique


def test_the_grid_crosses_every_rule_pre_space_attack_fraction_dataset_and_seed():
    runs = figure("ranking").runs()
    assert len(check_unique(runs)) == len(runs)
    n_rules = len(list(RULES))
    per_cell = 2 * 2 * n_rules - 1  # pre × space × rule, the plain mean once
    assert len(runs) == 2 * 2 * 2 * per_cell * 3  # datasets × α × attacks × configurations × seeds
    configs = {(r.config.dataset, r.config.byzantine_fraction, r.config.attack, r.config.defense,
                r.config.detect, r.config.pre) for r in runs}
    assert {c[0] for c in configs} == {"lastfm", "ml100k"}
    assert {c[1] for c in configs} == {0.2, 0.4}
    assert {c[2] for c in configs} == {"ascent", "a-ra"}
    assert {c[3] for c in configs} == set(RULES)
    assert {c[5] for c in configs} == {(), ("nnm",)}
    # the mean without pre-aggregator is the no-defence reference, once (parameter space)
    assert {c[4] for c in configs if c[3] == "mean" and c[5] == ()} == {"parameter"}
    assert {c[4] for c in configs if c[3] == "mean" and c[5] == ("nnm",)} == {"gradient", "parameter"}
    for r in runs:
        c = r.config.resolved()
        assert c.optimizer == "adam" and c.rounds == {"lastfm": 600, "ml100k": 1000}[c.dataset]
        assert r.labels == {"series": c.defense, "space": c.detect, "pre": "nnm" if c.pre else "none"}
        if c.defense == "bulyan":
            assert c.defense_params["fallback"] == "reduce-f"
    assert sorted({r.config.seed for r in runs}) == [0, 1, 2]
    assert list(FIGURES)[-1] == "ranking"


def _table(values: dict, diverged=()) -> pd.DataFrame:
    """A tidy table: values[(rule, space, pre, seed)] = P@5 on ML100K, α = 0.4, ascent."""
    rows = []
    for (rule, space, pre, seed), v in values.items():
        rows.append({"status": "ok", "label_series": rule, "label_space": space, "label_pre": pre,
                     "attack": "ascent", "dataset": "ml100k", "alpha": 0.4, "seed": seed,
                     "metric": "precision", "k": 5, "value": v})
        rows.append({**rows[-1], "k": 1, "value": -1.0})  # another K: never read at K = 5
    for rule, space, pre, seed in diverged:
        rows.append({"status": "diverged", "label_series": rule, "label_space": space,
                     "label_pre": pre, "attack": "ascent", "dataset": "ml100k", "alpha": 0.4,
                     "seed": seed, "metric": None, "k": None, "value": None})
    return pd.DataFrame(rows)


def test_ranks_and_paired_differences_by_hand():
    v = {}
    for seed, (none, krum_g, trmean_g, krum_p) in enumerate([(0.10, 0.12, 0.30, 0.20),
                                                             (0.20, 0.25, 0.40, 0.30),
                                                             (0.30, 0.29, 0.50, 0.35)]):
        v[("mean", "parameter", "none", seed)] = none
        v[("krum", "gradient", "none", seed)] = krum_g
        v[("trmean", "gradient", "none", seed)] = trmean_g
        v[("krum", "parameter", "none", seed)] = krum_p
    rows = ranking.ranking_rows(_table(v))
    grad = [r for r in rows if r["space"] == "gradient"]
    assert [r["rule"] for r in grad] == ["trmean", "krum", "mean"]
    assert [r["rank"] for r in grad] == [1, 2, 3]
    tr = grad[0]
    assert tr["mean"] == pytest.approx(0.4) and tr["n"] == 3
    # trmean − no defence: 0.2, 0.2, 0.2 (sd 0: the interval is the point)
    assert tr["vs_none"].mean == pytest.approx(0.2) and tr["vs_none"].lo == pytest.approx(0.2)
    # trmean − A-RFRS: 0.18, 0.15, 0.21: mean 0.18, s = 0.03, half-width 4.303·0.03/√3
    assert tr["vs_arfrs"].mean == pytest.approx(0.18)
    assert tr["vs_arfrs"].lo == pytest.approx(0.18 - 4.3027 * 0.03 / 3 ** 0.5, abs=1e-4)
    krum = grad[1]
    assert krum["vs_arfrs"] is None and krum["vs_none"].mean == pytest.approx(0.02)
    assert grad[2]["vs_none"] is None
    # the parameter-space cell: Krum on θ and the no-defence reference; A-RFRS is in the
    # gradient space but is still the reference of every cell
    par = [r for r in rows if r["space"] == "parameter"]
    assert [r["rule"] for r in par] == ["krum", "mean"]
    assert par[0]["vs_arfrs"].mean == pytest.approx((0.08 + 0.05 + 0.06) / 3)
    text = ranking.ranking_markdown(_table(v))
    assert "### ML100K, α = 0.4, ascent, gradient space, no pre-aggregator" in text
    assert "| 1 | trmean | 0.4000 | 3 | +0.2000 [+0.2000, +0.2000] |" in text


def test_a_rule_that_diverged_on_more_seeds_ranks_last():
    v = {("mean", "parameter", "none", s): 0.1 for s in range(3)}
    v.update({("krum", "gradient", "none", s): 0.05 for s in range(3)})
    v.update({("cc", "gradient", "none", s): 0.9 for s in (0, 1)})
    rows = ranking.ranking_rows(_table(v, diverged=[("cc", "gradient", "none", 2)]))
    grad = [r for r in rows if r["space"] == "gradient"]
    assert [r["rule"] for r in grad] == ["mean", "krum", "cc"]
    assert grad[2]["diverged"] == 1 and grad[2]["vs_none"].divergence() == "diverged 1/3 vs 0/3"
    assert "(+1 diverged)" in ranking.ranking_markdown(_table(v, diverged=[("cc", "gradient", "none", 2)]))


def test_a_seed_whose_run_failed_is_shown_beside_the_finished_ones():
    # one finished seed of cc, two that crashed: its mean is one seed's, and the table says so
    v = {("mean", "parameter", "none", s): 0.1 for s in range(3)}
    v.update({("krum", "gradient", "none", s): 0.05 for s in range(3)})
    v[("cc", "gradient", "none", 0)] = 0.9
    t = _table(v, diverged=[("cc", "gradient", "none", 1)])
    failed = {"status": "failed", "label_series": "cc", "label_space": "gradient",
              "label_pre": "none", "attack": "ascent", "dataset": "ml100k", "alpha": 0.4,
              "metric": None, "k": None, "value": None}
    # seed 2 failed; seed 1 has a failed row and its diverged outcome: the outcome counts
    t = pd.concat([t, pd.DataFrame([{**failed, "seed": 2}, {**failed, "seed": 1}])],
                  ignore_index=True)
    rows = ranking.ranking_rows(t)
    cc = next(r for r in rows if r["rule"] == "cc")
    assert (cc["n"], cc["diverged"], cc["failed"]) == (1, 1, 1)
    assert all(r["failed"] == 0 for r in rows if r["rule"] != "cc")
    assert "| cc | 0.9000 | 1 (+1 diverged) (+1 failed) |" in ranking.ranking_markdown(t)


def test_the_mean_without_pre_aggregator_is_the_reference_in_whichever_space_it_ran():
    v = {("mean", "gradient", "none", s): 0.1 + s / 10 for s in range(3)}
    v.update({("krum", "gradient", "none", s): 0.3 + s / 10 for s in range(3)})
    rows = ranking.ranking_rows(_table(v))
    mean = [r for r in rows if r["rule"] == "mean" and r["space"] == "gradient"]
    assert len(mean) == 1 and mean[0]["vs_none"] is None and mean[0]["n"] == 3
    krum = [r for r in rows if r["rule"] == "krum"][0]
    assert krum["vs_none"].mean == pytest.approx(0.2)


def test_on_ml100k_and_lastfm_no_rule_is_left_out():
    # the committed results/ranking (ML100K) keeps its runs
    for quick in (False, True):
        for d in ranking.DATASETS:
            scale = Scale(quick=quick, datasets=(d,))
            assert figure("ranking").left_out(scale) == []
            full = _grid(figure("ranking").scale(scale), ranking.cases((d,)))
            assert [r.key for r in figure("ranking").runs(scale)] == [r.key for r in full]


@pytest.mark.parametrize("dataset, n, fs", [("citeulike-a", 55, (11, 22)),
                                            ("citeulike-t", 79, (15, 31))])
def test_a_rule_whose_exact_search_is_out_of_reach_is_left_out_and_said(tmp_path, dataset, n, fs):
    """MDA and SMEA search the C(n, f) subsets of a round: on CiteULike, beyond their
    max_subsets, they are left out of the dataset's grid (every other rule runs), and
    reproduce says so, before listing or running anything; it stopped on them before."""
    from rfrs_ref.cli.main import main

    scale = Scale(quick=True, datasets=(dataset,))
    left = figure("ranking").left_out(scale)
    assert {r.config.defense for r, _ in left} == {"mda", "smea"}
    assert {(why.n, why.f) for _, why in left} == {(n, f) for f in fs}
    assert {r.config.defense for r in figure("ranking").runs(scale)} == set(RULES) - {"mda", "smea"}
    out = tmp_path / "r"
    res = CliRunner().invoke(main, ["reproduce", "ranking", "--quick", "--datasets", dataset,
                                    "--workers", "0", "--dry-run", "--out", str(out)])
    assert res.exit_code == 0, res.output
    for rule, cap in (("mda", 10_000_000), ("smea", 100_000)):
        for alpha, f in zip((0.2, 0.4), fs):
            assert (f"note: left out on {dataset} at α = {alpha:g}: {rule} (16 runs; {rule} needs "
                    f"C(n, f) ≤ max_subsets={cap} subsets to search (C({n}, {f}) = ") in res.output
    listing = res.output.split("note:")[-1].split("\n", 1)[1]
    assert "'series': 'krum'" in listing and "'series': 'mda'" not in listing
    assert not out.exists()


def test_the_tables_name_the_registered_rules_without_a_run():
    v = {(rule, "gradient", "none", s): 0.1 for rule in ("mean", "krum") for s in range(3)}
    text = ranking.ranking_markdown(_table(v))
    absent = [r for r in RULES if r not in ("mean", "krum")]
    assert f"Registered rules with no finished run on ML100K at α = 0.4: {', '.join(absent)} (" in text
    every = {(rule, "gradient", "none", 0): 0.1 for rule in RULES}
    assert "Registered rules with no" not in ranking.ranking_markdown(_table(every))
    # a rule missing at one fraction only is named at that fraction
    both = pd.concat([_table(every).assign(alpha=0.2),
                      _table({k: v for k, v in every.items() if k[0] != "krum"})])
    text = ranking.ranking_markdown(both)
    assert "no finished run on ML100K at α = 0.4: krum (" in text
    assert "at α = 0.2" not in text.split("###")[0]


def test_a_table_of_another_experiment_is_refused_with_the_reason():
    t = pd.DataFrame([{"status": "ok", "label_series": "Krum", "dataset": "ml100k", "alpha": 0.4,
                       "seed": 0, "metric": "precision", "k": 5, "value": 0.1}])
    with pytest.raises(ValueError, match="missing column.*label_space.*reproduce ranking"):
        ranking.ranking_rows(t)


def test_a_tiny_ranking_runs_end_to_end_and_writes_its_table(ex, tmp_path):
    from rfrs_ref.cli.main import main

    scale = Scale(datasets=("synthetic",), rounds=2, trials=2,
                  overrides={"dataset_params": ex.TINY_DATA, "client_fraction": 0.1})
    runs = _grid(scale, ranking.cases(("synthetic",), ["mean", "krum"], fractions=(0.4,),
                                      attacks=("a-ra",)))
    assert len(runs) == (1 + 2 + 4) * 2
    report, paths = reproduce(figure("ranking"), scale, tmp_path, workers=0, threads=1, runs=runs)
    assert (report.finished, report.failed) == (len(runs), 0), report.failures
    assert paths == [tmp_path / "figures" / "ranking.md"]
    text = paths[0].read_text()
    assert text.count("### synthetic, α = 0.4, a-ra") == 4
    assert "| krum |" in text and "| mean |" in text
    # the CLI regenerates the same Markdown from the results directory
    res = CliRunner().invoke(main, ["ranking", str(tmp_path), "--out", str(tmp_path / "r.md")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r.md").read_text() == text
    res = CliRunner().invoke(main, ["ranking", str(tmp_path / "runs")])
    assert res.exit_code != 0 and "Error" in res.output


# -- nothing ranked is not a success ---------------------------------------------------------------
def _write(table: pd.DataFrame, d) -> None:
    """``table`` as a results directory's normalised CSV pair (results.csv, runs.csv)."""
    from rfrs_ref.experiments.results import write_table

    t = table.copy()
    t["key"] = [f"{ds}-{r}-{s}-{p}-{seed}-{a}" for ds, r, s, p, seed, a in zip(
        t["dataset"], t["label_series"], t["label_space"], t["label_pre"], t["seed"],
        t["attack"])]
    t["method"], t["trial"] = t["label_series"], t["seed"]
    write_table(t, d)
    (d / "results.parquet").unlink(missing_ok=True)  # the CSV form, as committed


def _three_seeds():
    v = {("mean", "parameter", "none", s): 0.1 + s / 10 for s in range(3)}
    v.update({("krum", "gradient", "none", s): 0.2 + s / 10 for s in range(3)})
    v.update({("rfa", "gradient", "none", s): 0.3 + s / 20 for s in range(3)})
    return _table(v)


def test_the_cli_ranks_a_table_with_pairs_and_exits_0(tmp_path):
    from rfrs_ref.cli.main import main

    _write(_three_seeds(), tmp_path)
    res = CliRunner().invoke(main, ["ranking", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "| rfa |" in res.output


def test_a_header_only_table_ranks_nothing_and_exits_1(tmp_path):
    from rfrs_ref.cli.main import main

    _write(_three_seeds(), tmp_path)
    for name in ("results.csv", "runs.csv"):
        path = tmp_path / name
        path.write_text(path.read_text().splitlines()[0] + "\n")
    res = CliRunner().invoke(main, ["ranking", str(tmp_path), "--out", str(tmp_path / "r.md")])
    assert res.exit_code == 1, res.output
    assert "no pair was judged" in res.output and "no finished or diverged run" in res.output
    assert "Traceback" not in res.output
    # the table is still written, as rfrs-ref verdict writes its table of "not run"
    assert "No finished run" in (tmp_path / "r.md").read_text()


def test_a_k_no_run_recorded_is_refused_naming_the_recorded_ks(tmp_path):
    from rfrs_ref.cli.main import main

    _write(_three_seeds(), tmp_path)
    res = CliRunner().invoke(main, ["ranking", str(tmp_path), "--k", "50"])
    assert res.exit_code == 1, res.output
    assert "precision@50" in res.output and "K = 1, 5" in res.output
    assert "no pairs" not in res.output
    with pytest.raises(ValueError, match="K = 1, 5"):
        ranking.check_k(_three_seeds(), "precision", 50)
    ranking.check_k(_three_seeds(), "precision", 1)


def test_rules_without_a_common_seed_with_a_reference_rank_nothing(tmp_path):
    from rfrs_ref.cli.main import main

    # the references never finished a seed that krum finished: no pair, no ranking
    t = _table({("mean", "parameter", "none", 0): 0.1, ("krum", "gradient", "none", 1): 0.2,
                ("rfa", "gradient", "none", 2): 0.3})
    assert ranking.judged_pairs(ranking.ranking_rows(t)) == 0
    _write(t, tmp_path)
    res = CliRunner().invoke(main, ["ranking", str(tmp_path)])
    assert res.exit_code == 1, res.output
    assert "no pair was judged" in res.output and "| krum |" in res.output


@pytest.mark.parametrize("name", ["results.csv", "runs.csv"])
def test_an_out_that_is_a_table_read_is_refused_and_the_table_kept(tmp_path, name):
    from rfrs_ref.cli.main import main

    _write(_three_seeds(), tmp_path)
    before = (tmp_path / name).read_bytes()
    for given in (tmp_path, tmp_path / "results.csv"):
        res = CliRunner().invoke(main, ["ranking", str(given), "--out", str(tmp_path / name)])
        assert res.exit_code == 2, res.output
        assert "a table the ranking reads" in res.output
        assert (tmp_path / name).read_bytes() == before


@pytest.mark.parametrize("name", ["results.csv", "runs.csv", "outcome.json", "notes.md", "link.md"])
def test_an_out_that_is_not_a_ranking_of_its_own_is_refused_and_kept(tmp_path, name):
    """--out another results directory's results.csv (or a run's outcome.json, a user's file,
    a link) was replaced by the Markdown, exit 0: only a ranking an earlier call wrote is."""
    from rfrs_ref.cli.main import main

    read, other = tmp_path / "ranking", tmp_path / "defenses"
    for d in (read, other):
        d.mkdir()
        _write(_three_seeds(), d)
    (other / "notes.md").write_text("my notes\n")
    (tmp_path / "target.md").write_text("elsewhere\n")
    (other / "link.md").symlink_to(tmp_path / "target.md")
    target = other / name  # outcome.json: refused by its name (a folder holding one is a run's)
    before = target.read_bytes() if target.exists() else None
    res = CliRunner().invoke(main, ["ranking", str(read), "--out", str(target)])
    assert res.exit_code == 2, res.output
    assert "nothing was written" in res.output and "Traceback" not in res.output
    assert (target.read_bytes() if target.exists() else None) == before
    assert (tmp_path / "target.md").read_text() == "elsewhere\n"
    # a ranking written before is replaced, as it always was
    res = CliRunner().invoke(main, ["ranking", str(read), "--out", str(other / "r.md")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["ranking", str(read), "--out", str(other / "r.md")])
    assert res.exit_code == 0, res.output


def test_an_out_that_cannot_be_written_is_one_line_and_a_new_folder_is_made(tmp_path):
    """--out under a file (a folder that cannot be made) ended in a NotADirectoryError
    traceback, and --out in a folder not yet there in a FileNotFoundError one."""
    from rfrs_ref.cli.main import main

    read = tmp_path / "ranking"
    read.mkdir()
    _write(_three_seeds(), read)
    (tmp_path / "file").write_text("mine\n")
    res = CliRunner().invoke(main, ["ranking", str(read), "--out", str(tmp_path / "file" / "r.md")])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    assert f"could not write the ranking {tmp_path / 'file' / 'r.md'}" in res.output, res.output
    assert (tmp_path / "file").read_text() == "mine\n"
    res = CliRunner().invoke(main, ["ranking", str(read), "--out", str(tmp_path / "new" / "r.md")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "new" / "r.md").read_text().startswith("Rules ranked by ")


def test_ranking_out_and_plot_tell_a_ranking_by_one_definition(tmp_path, monkeypatch):
    """rfrs-ref ranking --out kept its own copy of how a ranking begins, beside
    RANKING_HEADS, which plot's ranking.md reads: a ranking whose first line changed in one
    would be replaced by one command and refused by the other."""
    import rfrs_ref.experiments.ranking as ranking_module
    from rfrs_ref.cli.main import main

    read = tmp_path / "ranking"
    read.mkdir()
    _write(_three_seeds(), read)
    target = tmp_path / "r.md"
    target.write_text("Defences ranked by Precision@5\n")
    monkeypatch.setattr(ranking_module, "RANKING_HEADS", ("Defences ranked by ",))
    res = CliRunner().invoke(main, ["ranking", str(read), "--out", str(target)])
    assert res.exit_code == 0, res.output
    assert target.read_text().startswith("Rules ranked by ")


@pytest.mark.parametrize("value", ["nan", "", "inf"])
def test_a_finished_run_without_a_finite_value_is_refused_naming_file_and_line(tmp_path, value):
    """A NaN of a finished run was once shown as "— / 0 seeds", unflagged; it is refused as
    inf is, naming results.csv and its line."""
    from rfrs_ref.cli.main import main

    _write(_three_seeds(), tmp_path)
    results = pd.read_csv(tmp_path / "results.csv", dtype=str, keep_default_na=False)
    row = results.index[results["key"].str.startswith("ml100k-krum-") & (results["k"] == "5")][1]
    results.loc[row, "value"] = value
    results.to_csv(tmp_path / "results.csv", index=False)
    res = CliRunner().invoke(main, ["ranking", str(tmp_path)])
    assert res.exit_code == 1, res.output
    assert f"{tmp_path / 'results.csv'}: line {row + 2}, series 'krum|gradient|none'" in res.output
    assert "Traceback" not in res.output and "| krum |" not in res.output


def test_by_the_targets_exposure_the_rules_rank_lowest_first_over_the_targeted_cells(tmp_path):
    """ER@K and the targets' hit ratio are recorded by the targeted attack's runs only: the
    ranking by them covers those cells, least exposure first, and a rule that exposes the
    targets less than no defence has Δ below 0; a table without them is refused."""
    from rfrs_ref.cli.main import main

    ascent = _three_seeds()
    er = {("mean", "parameter", "none"): (0.5, 0.6, 0.7), ("krum", "gradient", "none"): (0.4, 0.5, 0.6),
          ("median", "gradient", "none"): (0.1, 0.1, 0.2)}
    rows = []
    for (rule, space, pre), vals in er.items():
        for seed, v in enumerate(vals):
            base = {"status": "ok", "label_series": rule, "label_space": space, "label_pre": pre,
                    "attack": "a-ra", "dataset": "ml100k", "alpha": 0.4, "seed": seed, "k": 5}
            rows += [{**base, "metric": "precision", "value": 0.2},
                     {**base, "metric": "er", "value": v},
                     {**base, "metric": "target_hr", "value": v / 2}]
    table = pd.concat([ascent, pd.DataFrame(rows)], ignore_index=True)
    got = ranking.ranking_rows(table, "er", 5)
    assert {r["attack"] for r in got} == {"a-ra"}
    grad = [r for r in got if r["space"] == "gradient"]
    assert [r["rule"] for r in grad] == ["median", "krum", "mean"]
    assert grad[0]["vs_none"].mean == pytest.approx(-(0.4 + 0.5 + 0.5) / 3)
    # by precision the same table ranks both attacks, highest first
    assert {r["attack"] for r in ranking.ranking_rows(table, "precision", 5)} == {"ascent", "a-ra"}
    _write(table, tmp_path)
    res = CliRunner().invoke(main, ["ranking", str(tmp_path), "--metric", "er"])
    assert res.exit_code == 0, res.output
    assert "Rules ranked by ER@5 (the target items' exposure: lowest first" in res.output
    assert "| 1 | median | 0.1333 |" in res.output and "ascent" not in res.output
    with pytest.raises(ValueError, match="no run recorded target_hr"):
        ranking.check_k(ascent, "target_hr", 5)
    _write(ascent, tmp_path / "ascent")
    res = CliRunner().invoke(main, ["ranking", str(tmp_path / "ascent"), "--metric", "er"])
    assert res.exit_code == 1 and "only the runs of an attack with target items" in res.output


def _on(table: pd.DataFrame, dataset: str, shift: float = 0.0) -> pd.DataFrame:
    t = table.copy()
    t["dataset"] = dataset
    t.loc[t["value"] >= 0, "value"] += shift
    return t


def test_several_directories_rank_as_one_directory_holding_them_all(tmp_path):
    """Last.fm's half of the ranking may lie in a directory of its own: ranked together,
    the two give the ranking of one directory holding both, whatever their order."""
    from rfrs_ref.cli.main import main

    ml, fm = _three_seeds(), _on(_three_seeds(), "lastfm", shift=0.05)
    for name, t in (("ml", ml), ("fm", fm), ("both", pd.concat([fm, ml], ignore_index=True))):
        (tmp_path / name).mkdir()
        _write(t, tmp_path / name)
    one = CliRunner().invoke(main, ["ranking", str(tmp_path / "both")])
    assert one.exit_code == 0, one.output
    assert "### ML100K" in one.output and "### Last.fm" in one.output
    # the registered order of the datasets (ranking.DATASETS), not the directories'
    assert one.output.index("### Last.fm") < one.output.index("### ML100K")
    for order in (["ml", "fm"], ["fm", "ml"]):
        res = CliRunner().invoke(main, ["ranking", *(str(tmp_path / d) for d in order)])
        assert res.exit_code == 0, res.output
        assert res.output == one.output
    # each alone ranks its own dataset only
    res = CliRunner().invoke(main, ["ranking", str(tmp_path / "fm")])
    assert "### Last.fm" in res.output and "### ML100K" not in res.output


def test_a_dataset_in_two_directories_is_refused_naming_both(tmp_path):
    from rfrs_ref.cli.main import main

    for name, shift in (("a", 0.0), ("b", 0.01)):
        (tmp_path / name).mkdir()
        _write(_on(_three_seeds(), "ml100k", shift), tmp_path / name)
    res = CliRunner().invoke(main, ["ranking", str(tmp_path / "a"), str(tmp_path / "b"),
                                    "--out", str(tmp_path / "r.md")])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output and "both record runs of ml100k" in res.output
    assert str(tmp_path / "a" / "results.csv") in res.output
    assert str(tmp_path / "b" / "results.csv") in res.output
    assert not (tmp_path / "r.md").exists()
    # the same directory twice: its keys twice
    res = CliRunner().invoke(main, ["ranking", str(tmp_path / "a"), str(tmp_path / "a")])
    assert res.exit_code == 1 and "both record" in res.output and "Traceback" not in res.output


def test_a_defect_of_the_second_directory_names_its_file_and_line(tmp_path):
    from rfrs_ref.cli.main import main

    (tmp_path / "ml").mkdir()
    (tmp_path / "fm").mkdir()
    _write(_three_seeds(), tmp_path / "ml")
    _write(_on(_three_seeds(), "lastfm"), tmp_path / "fm")
    path = tmp_path / "fm" / "results.csv"
    lines = path.read_text().splitlines()
    head = lines[0].split(",")
    cells = lines[1].split(",")
    cells[head.index("value")] = "inf"
    lines[1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    res = CliRunner().invoke(main, ["ranking", str(tmp_path / "ml"), str(tmp_path / "fm")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert str(path) in res.output and "line 2" in res.output, res.output
