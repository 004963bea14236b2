"""The figure registry: every figure's grid, full and quick, as the paper describes it."""

from __future__ import annotations

import math

import pytest

from rfrs_ref.aggregate import PRESETS
from rfrs_ref.experiments.figures import (DATASETS, FIGURES, FRACTIONS, FULL_TRIALS,
                                          PCA_BYZANTINE, PCA_CLIENTS, QUICK_ROUNDS_DIVISOR,
                                          QUICK_TRIALS, Scale, figure)
from rfrs_ref.experiments.results import read_table
from rfrs_ref.experiments.spec import check_unique
from rfrs_ref.federated.config import DEFAULT_ROUNDS
from rfrs_ref.federated.population import clients_per_round

PAPER_FIGURES = ["1", "2", "3", "4", "7", "8", "10", "11", "12"]
ABLATION_NAMES = ["ablation-init", "ablation-sampled", "ablation-krum1", "ablation-exact",
                  "ablation-rounds"]


def test_registry_has_the_papers_figures():
    assert list(FIGURES) == PAPER_FIGURES + ABLATION_NAMES + ["ranking"]
    assert figure("defenses") is figure("4") is figure("fig:performance2") is figure("Fig. 4")
    with pytest.raises(KeyError, match="unknown figure '5'"):
        figure("5")


@pytest.mark.parametrize("fid", PAPER_FIGURES)
@pytest.mark.parametrize("quick", [False, True])
def test_every_grid_resolves_with_unique_keys(fid, quick):
    runs = figure(fid).runs(Scale(quick=quick))
    keys = check_unique(runs)
    assert len(keys) == len(runs) > 0
    for r in runs:
        c = r.config.resolved()
        assert r.labels.get("series")
        if fid != "1":
            base = DEFAULT_ROUNDS[c.dataset]
            assert c.rounds == (base // QUICK_ROUNDS_DIVISOR if quick else base)
    seeds = sorted({r.config.seed for r in runs})
    if fid != "1":
        assert seeds == list(range(QUICK_TRIALS if quick else FULL_TRIALS))
        assert {r.config.dataset for r in runs} == (
            {"ml100k"} if quick else set(figure(fid).datasets))


def test_fig4_is_defenses_by_fraction_by_dataset():
    runs = figure("4").runs()
    assert len(runs) == len(DATASETS) * len(FRACTIONS) * 5 * FULL_TRIALS
    assert len(figure("4").runs(Scale(quick=True))) == len(FRACTIONS) * 5 * QUICK_TRIALS
    for r in runs:
        c = r.config
        assert c.optimizer == "adam" and c.attack == "ascent" and c.model == "fism"
        assert c.byzantine_fraction in FRACTIONS
        expected = dict(zip(["No defense", "Krum", "RFA", "Trmean", "A-RFRS"],
                            ["no-defense", "krum", "rfa", "trmean", "a-rfrs"]))
        rule, detect = PRESETS[expected[r.labels["series"]]]
        assert (c.defense if c.defense != "none" else "mean", c.detect) == (rule, detect)


def test_recall_figures_reuse_the_precision_figures_runs():
    for a, b in (("3", "7"), ("4", "8")):
        ka = [r.key for r in figure(a).runs()]
        kb = [r.key for r in figure(b).runs()]
        assert ka == kb
        assert figure(a).experiment == figure(b).experiment
        assert (figure(a).metric, figure(b).metric) == ("precision", "recall")


def test_fig3_compares_fism_and_fmf_without_attack():
    runs = figure("3").runs()
    assert {(r.labels["series"], r.config.model) for r in runs} == {("A-FRS", "fism"),
                                                                     ("FMF", "fmf")}
    assert all(r.config.byzantine_fraction == 0 and r.config.attack == "none" for r in runs)


def test_fig10_compares_adam_and_sgd():
    runs = figure("10").runs(Scale(quick=True))
    assert {(r.labels["series"], r.config.optimizer) for r in runs} == {("Adam", "adam"),
                                                                       ("SGD", "sgd")}


@pytest.mark.parametrize("fid, optimizer, robust", [("11", "momentum", "S-RFRS"),
                                                      ("12", "adagrad", "AG-RFRS")])
def test_other_optimizer_figures(fid, optimizer, robust):
    runs = figure(fid).runs()
    assert {r.config.optimizer for r in runs} == {optimizer}
    assert robust in {r.labels["series"] for r in runs}
    assert len(runs) == 2 * len(FRACTIONS) * 5 * FULL_TRIALS


def test_fig2_camouflage_at_forty_percent():
    runs = figure("2").runs(Scale(quick=True))
    attacked = [r for r in runs if r.config.attack == "camouflage"]
    assert attacked and all(r.config.byzantine_fraction == 0.4 for r in attacked)
    assert all(r.config.defense == "none" and r.config.optimizer == "adam" for r in runs)


def test_fig1_samples_ninety_clients_with_a_byzantine_share_of_32_in_90():
    runs = figure("1").runs()
    assert [r.config.model for r in runs] == ["fmf", "fism"]
    for run in runs:
        c = run.config.resolved()
        assert run.kind == "capture" and c.optimizer == "adam" and c.defense == "none"
        assert c.rounds == 24 and c.attack == "ascent" and c.dataset == "ml100k"
        assert clients_per_round(943, c.client_fraction) == PCA_CLIENTS
        assert math.isclose(c.byzantine_fraction * PCA_CLIENTS, PCA_BYZANTINE)
    assert [r.key for r in figure("1").runs(Scale(quick=True))] == [r.key for r in runs]


def test_scale_overrides_apply_to_every_run():
    runs = figure("3").runs(Scale(quick=True, rounds=7, trials=1, datasets=("lastfm",),
                                  overrides={"client_fraction": 0.05}))
    assert {(r.config.rounds, r.config.client_fraction, r.config.dataset) for r in runs} == \
        {(7, 0.05, "lastfm")}
    # overriding what a figure varies collapses its grid: reported as duplicates
    with pytest.raises(ValueError, match="same key"):
        check_unique(figure("3").runs(Scale(quick=True, overrides={"model": "fism"})))


def _fig4_at_forty_percent(trials=3):
    runs = figure("4").runs(Scale(trials=trials, datasets=("lastfm", "ml100k")))
    return {(r.config.dataset, r.labels["series"], r.config.seed): r.config.resolved().to_json()
            for r in runs if r.config.byzantine_fraction == 0.4}


@pytest.mark.parametrize("name", ABLATION_NAMES)
def test_each_ablation_is_fig4_at_forty_percent_with_one_change(name):
    runs = [r for r in figure(name).runs() if r.labels["series"] not in ("Adam", "SGD")]
    assert len(check_unique(runs)) == len(runs) == 2 * 5 * 3
    reference = _fig4_at_forty_percent()
    changed = {}
    for r in runs:
        ours = r.config.resolved().to_json()
        theirs = reference[(r.config.dataset, r.labels["series"], r.config.seed)]
        changed[r.labels["series"]] = {k for k in ours if ours[k] != theirs[k]}
        if name == "ablation-rounds":
            assert ours["rounds"] == 3 * theirs["rounds"]
    expected = {"ablation-init": {"init_scale"}, "ablation-sampled": {"model_params"},
                "ablation-rounds": {"rounds",
                "eval_every", "checkpoint_every"}}
    if name == "ablation-krum1":
        assert changed == {"No defense": set(), "RFA": set(), "Trmean": set(),
                           "Krum": {"defense_params"}, "A-RFRS": {"defense_params"}}
        assert {r.config.resolved().defense_params["k"] for r in runs
                if r.labels["series"] in ("Krum", "A-RFRS")} == {1}
    elif name == "ablation-exact":
        assert changed.pop("No defense") == {"assumed_byzantine"}
        assert set(map(frozenset, changed.values())) == {frozenset({"assumed_byzantine",
                                                                    "defense_params"})}
        assert {r.config.resolved().defense_params["fallback"] for r in runs
                if r.labels["series"] != "No defense"} == {"reduce-f"}
    else:
        assert set(map(frozenset, changed.values())) == {frozenset(expected[name])}
    quick = figure(name).runs(Scale(quick=True, rounds=3, trials=1))
    assert {r.config.dataset for r in quick} == {"ml100k"}
    assert len(quick) == (7 if name == "ablation-rounds" else 5)


def test_the_rounds_ablation_also_runs_fig10_three_times_longer():
    runs = figure("ablation-rounds").runs()
    longer = {(r.config.dataset, r.labels["series"], r.config.seed): r.config.resolved().to_json()
              for r in runs if r.labels["series"] in ("Adam", "SGD")}
    fig10 = {(r.config.dataset, r.labels["series"], r.config.seed): r.config.resolved().to_json()
             for r in figure("10").runs(Scale(trials=3, datasets=("lastfm", "ml100k")))}
    assert set(longer) == set(fig10) and len(longer) == 2 * 2 * 3
    for key, ours in longer.items():
        theirs = fig10[key]
        assert ours["rounds"] == 3 * theirs["rounds"]
        assert {k for k in ours if ours[k] != theirs[k]} <= {"rounds", "eval_every",
                                                             "checkpoint_every"}
    assert figure("ablation-rounds").rows == "alpha"
    assert figure("ablation-rounds").series[-2:] == ("Adam", "SGD")


def test_the_rounds_ablation_draws_a_row_per_fraction(ex, tmp_path):
    from rfrs_ref.experiments.figures import reproduce

    scale = Scale(datasets=("synthetic",), rounds=2, trials=1,
                  overrides={"dataset_params": ex.TINY_DATA, "client_fraction": 0.1})
    report, paths = reproduce(figure("ablation-rounds"), scale, tmp_path, workers=0, threads=1)
    assert (report.finished, report.failed) == (7, 0), report.failures
    table = read_table(tmp_path)
    assert set(table["rounds"]) == {6}
    assert set(table.loc[table["label_series"].isin(["Adam", "SGD"]), "alpha"]) == {0.0}
    ex.assert_image_not_blank(tmp_path / "figures" / "ablation-rounds.png")


def test_an_ablation_runs_end_to_end_and_draws_its_figure(ex, tmp_path):
    import pandas as pd

    from rfrs_ref.experiments.figures import reproduce

    scale = Scale(datasets=("synthetic",), rounds=3, trials=1,
                  overrides={"dataset_params": ex.TINY_DATA, "client_fraction": 0.1})
    report, paths = reproduce(figure("ablation-exact"), scale, tmp_path, workers=0, threads=1)
    assert (report.finished, report.failed) == (5, 0), report.failures
    assert tmp_path / "figures" / "ablation-exact.png" in paths
    ex.assert_image_not_blank(tmp_path / "figures" / "ablation-exact.png")
    table = read_table(tmp_path)
    assert set(table["assumed_byzantine"]) == {"exact"} and set(table["alpha"]) == {0.4}


@pytest.mark.parametrize("dataset", ["lastfm", "ml100k", "citeulike-a", "citeulike-t",
                                     "synthetic"])
@pytest.mark.parametrize("quick", [False, True])
def test_every_registered_run_can_start_on_every_dataset(dataset, quick):
    """The checks a sweep makes before anything is written (check_feasible, from the
    manifest's counts, no data loaded) accept every run of every registered figure,
    ablation and the ranking, full and quick, on every dataset: ``rfrs-ref reproduce X
    --datasets D`` never refuses its own grid. (MDA and SMEA on CiteULike, whose exact
    search over C(n, f) subsets is out of reach, stopped ``reproduce ranking --datasets
    citeulike-a`` before any run; so did Krum at α = 0.4 on the synthetic dataset's 6
    clients a round.)"""
    from rfrs_ref.data import manifests
    from rfrs_ref.experiments.sweep import check_feasible

    assert dataset in manifests() or dataset == "synthetic"
    for name, fig in FIGURES.items():
        for r in fig.runs(Scale(quick=quick, datasets=(dataset,))):
            try:
                check_feasible(r.config)
            except ValueError as exc:
                pytest.fail(f"{name}, {r.labels}, α = {r.config.byzantine_fraction}: {exc}")


def test_a_run_whose_rule_cannot_start_is_left_out_of_the_figure_and_said():
    from rfrs_ref.experiments.figures import left_out_notes

    scale = Scale(quick=True, datasets=("synthetic",))
    left = figure("4").left_out(scale)
    assert {(r.labels["series"], r.config.byzantine_fraction) for r, _ in left} == {
        ("Krum", 0.4), ("A-RFRS", 0.4)}
    kept = figure("4").runs(scale)
    assert not {r.key for r, _ in left} & {r.key for r in kept}
    assert len(kept) + len(left) == 3 * 5 * QUICK_TRIALS
    assert left_out_notes(left) == [
        f"left out on synthetic at α = 0.4: {s} ({QUICK_TRIALS} runs; krum needs n > 2f + 2, "
        "but n=6 and f=2, in every round)" for s in ("Krum", "A-RFRS")]
    # the paper's datasets lose nothing
    for fid in FIGURES:
        assert figure(fid).left_out(Scale()) == []


def test_a_run_an_override_makes_impossible_is_refused_not_left_out():
    """--set client_fraction=0.005 gives ML100K rounds of 4 clients, too few for Krum at
    α = 0.3: the figure's own grid runs Krum there, so the run is kept, and refused before
    anything is written as any impossible configuration, rather than dropped with a note."""
    from click.testing import CliRunner

    from rfrs_ref.cli.main import main

    scale = Scale(datasets=("ml100k",), overrides={"client_fraction": 0.005})
    assert figure("4").left_out(scale) == []
    res = CliRunner().invoke(main, ["reproduce", "4", "--datasets", "ml100k", "--set",
                                    "client_fraction=0.005", "--dry-run"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "krum needs n > 2f + 2" in res.output and "nothing was run" in res.output


def test_a_reduced_reproduction_gets_a_directory_of_its_own():
    """`reproduce 4 --rounds 20 --trials 1` used to write results/defenses, rewriting the
    tables of the full reproduction with its 15 runs."""
    from rfrs_ref.experiments.figures import Scale, figure

    fig4, abl = figure("4"), figure("ablation-exact")
    assert str(fig4.default_out(Scale())) == "results/defenses"
    assert str(fig4.default_out(Scale(datasets=("ml100k",)))) == "results/defenses"
    assert str(fig4.default_out(Scale(quick=True))) == "results/defenses-quick"
    assert str(fig4.default_out(True)) == "results/defenses-quick"
    assert str(fig4.default_out(Scale(rounds=20, trials=1))) == "results/defenses-20rounds-1trials"
    assert str(fig4.default_out(Scale(resilience=True, backend="numpy",
                                      overrides={"init_scale": 1.0}))) == \
        "results/defenses-resilience-numpy-set"
    # the figure's own number of trials is not a departure
    assert str(abl.default_out(abl.scale(Scale()))) == "results/ablation-exact"
    assert str(abl.default_out(Scale(trials=1))) == "results/ablation-exact-1trials"





def test_sweep_panels_never_average_several_byzantine_fractions_into_one_line(monkeypatch,
                                                                              tmp_path):
    """`rfrs-ref plot results/defenses` without --figure drew one line per series over the
    runs of α = 0.2, 0.3 and 0.4 together; such a table gets a row of panels per fraction,
    while a sweep whose labels tell its fractions apart keeps one row."""
    import pandas as pd

    from rfrs_ref.experiments import plots

    seen = {}
    monkeypatch.setattr(plots, "plot_k_panels", lambda df, stem, **kw: seen.update(kw) or [])
    figure_table = pd.DataFrame({"dataset": ["ml100k"] * 4, "alpha": [0.2, 0.4, 0.2, 0.4],
                                 "label_series": ["Krum", "Krum", "RFA", "RFA"]})
    plots.plot_sweep(figure_table, tmp_path / "s")
    assert seen["rows"] == "alpha" and seen["cols"] == "dataset"
    sweep_table = pd.DataFrame({"dataset": ["ml100k"] * 4, "alpha": [0.2, 0.4, 0.2, 0.4],
                                "label_byzantine_fraction": ["0.2", "0.4", "0.2", "0.4"],
                                "label_preset": ["krum", "krum", "rfa", "rfa"]})
    plots.plot_sweep(sweep_table, tmp_path / "s")
    assert seen["rows"] is None


def test_alphas_pick_and_order_the_fractions_of_a_grid():
    """`--alphas 0.4,0.2` runs the figure's runs at those fractions, the first given first,
    with the keys of the full grid's (so records are shared); the tables keep every one."""
    from rfrs_ref.experiments.figures import whole_grid

    fig = figure("4")
    full = {r.key for r in fig.runs(Scale(datasets=("ml100k",)))}
    picked = fig.runs(Scale(datasets=("ml100k",), fractions=(0.4, 0.2, 0.4)))
    n = len(picked) // 2
    assert len(picked) == 2 * 5 * FULL_TRIALS
    assert [r.config.byzantine_fraction for r in picked] == [0.4] * n + [0.2] * n
    assert {r.key for r in picked} <= full
    assert [r.key for r in whole_grid(fig, Scale(fractions=(0.4,)))] == \
        [r.key for r in whole_grid(fig, Scale())]
    extra = whole_grid(fig, Scale(datasets=("ml100k",), fractions=(0.1,)))
    assert {r.config.byzantine_fraction for r in extra} == {*FRACTIONS, 0.1}
    assert {r.key for r in whole_grid(fig, Scale())} < {r.key for r in extra}


def test_alphas_apply_to_the_ablations_and_the_ranking():
    runs = figure("ablation-init").runs(Scale(fractions=(0.2,)))
    assert runs and all(r.config.byzantine_fraction == 0.2 and r.config.init_scale == 1.0
                        for r in runs)
    rounds = figure("ablation-rounds").runs(Scale(datasets=("ml100k",), fractions=(0.3,)))
    # Fig. 10's longer runs have no Byzantine client, whatever the fractions
    assert {(r.labels["series"] in ("Adam", "SGD"), r.config.byzantine_fraction)
            for r in rounds} == {(False, 0.3), (True, 0.0)}
    ranking = figure("ranking").runs(Scale(datasets=("ml100k",), fractions=(0.4,)))
    assert ranking and {r.config.byzantine_fraction for r in ranking} == {0.4}
    assert len(ranking) * 2 == len(figure("ranking").runs(Scale(datasets=("ml100k",))))


@pytest.mark.parametrize("fid", ["1", "2", "3", "7", "10"])
def test_alphas_are_refused_by_a_figure_that_compares_no_fractions(fid):
    with pytest.raises(ValueError, match=r"--alphas does not apply to it; it applies to 4, 8, 11"):
        figure(fid).runs(Scale(fractions=(0.4,)))


@pytest.mark.parametrize("fractions, message", [
    ((), "no Byzantine fraction"), ((1.0,), "in \\[0, 1\\), got 1.0"),
    ((-0.1,), "got -0.1"), ((math.nan,), "got nan"), ((math.inf,), "got inf")])
def test_a_scale_refuses_fractions_outside_zero_one(fractions, message):
    with pytest.raises(ValueError, match=message):
        Scale(fractions=fractions)
