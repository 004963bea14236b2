"""NDCG, HR and MRR in the results tables, and the popularity ranking in every summary
table and figure."""

from __future__ import annotations

import pytest

from rfrs_ref.experiments.spec import RunSpec


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from rfrs_ref.experiments.spec import make_config
    from rfrs_ref.experiments.sweep import run_sweep

    tiny = {"dataset": "synthetic", "dataset_params": {"n_users": 200, "n_items": 100,
                                                       "mean_items": 12.0},
            "client_fraction": 0.1, "rounds": 4, "eval_every": 2, "ks": (1, 5, 10)}
    runs = [RunSpec(make_config({**tiny, "optimizer": opt, "seed": s}), trial=s,
                    labels={"series": opt})
            for opt in ("adam", "sgd") for s in (0, 1)]
    out = tmp_path_factory.mktemp("tables")
    report = run_sweep(runs, out, workers=0, label_columns=("label_series",))
    assert report.finished == 4
    return out, report


def test_tidy_table_has_every_metric_and_its_popularity(store):
    _, report = store
    metrics = set(report.table["metric"])
    for name in ("precision", "recall", "ndcg", "hr", "mrr"):
        assert name in metrics and f"popularity_{name}" in metrics
    t = report.table
    ndcg1 = t[(t["metric"] == "ndcg") & (t["k"] == 1)]["value"]
    p1 = t[(t["metric"] == "precision") & (t["k"] == 1)]["value"]
    # at K = 1 NDCG, HR, MRR and Precision are the same number
    assert list(ndcg1) == list(p1)
    assert set(t["k"].dropna().astype(int)) == {1, 5, 10}


def test_summary_markdown_ends_every_table_with_popularity(store):
    out, _ = store
    md = (out / "summary.md").read_text()
    tables = md.strip().split("\n\n")
    assert [t.splitlines()[0].split(" | ")[2].split("@")[0] for t in tables] == [
        "Precision", "Recall", "NDCG", "HR", "MRR"]
    for t in tables:
        assert t.splitlines()[-1].startswith("| popularity |"), t


def test_every_figure_draws_the_popularity_line(store, monkeypatch):
    from rfrs_ref.experiments import plots
    from rfrs_ref.experiments.figures import figure, plot_figure

    out, report = store
    legends = []

    def keep(fig, stem, dpi=110):
        legends.append([t.get_text() for lg in fig.legends for t in lg.get_texts()])
        return []

    monkeypatch.setattr(plots, "save", keep)
    plot_figure(figure("10"), report.table, out, out / "figures")
    assert len(legends) == 2  # the Metric@K panels and the training curves
    for labels in legends:
        assert "Popularity" in labels, labels
