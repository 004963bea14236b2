"""metrics.csv with the five ranking metrics, and runs started by earlier versions."""

import csv

import numpy as np

from rfrs_ref.federated.trainer import METRICS_FIELDS, RunDirectory
from rfrs_ref.metrics import RankingMetrics

OLD_FIELDS = ["round", "k", "precision", "recall", "popularity_precision", "popularity_recall"]


def _metrics(scale):
    ks = (1, 5)
    return RankingMetrics(ks, (0.1 * scale, 0.2 * scale), (0.3 * scale, 0.4 * scale), 7,
                          (0.5 * scale, 0.6 * scale), (0.7 * scale, 0.8 * scale),
                          (0.9 * scale, 0.95 * scale))


def test_metrics_csv_keeps_the_old_columns_first_and_reads_back(tmp_path):
    assert METRICS_FIELDS[:6] == OLD_FIELDS
    run = RunDirectory(tmp_path)
    (tmp_path / "metrics.csv").write_text(",".join(METRICS_FIELDS) + "\n")
    run.append_metrics(10, _metrics(1.0), _metrics(0.5))
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [r["k"] for r in rows] == ["1", "5"]
    assert float(rows[1]["ndcg"]) == 0.6 and float(rows[1]["popularity_mrr"]) == 0.475
    history = run.read_history()
    assert history == [{"round": 10, "precision@1": 0.1, "recall@1": 0.3, "ndcg@1": 0.5,
                        "hr@1": 0.7, "mrr@1": 0.9, "precision@5": 0.2, "recall@5": 0.4,
                        "ndcg@5": 0.6, "hr@5": 0.8, "mrr@5": 0.95}]


def test_a_run_started_by_an_earlier_version_keeps_its_columns(tmp_path):
    run = RunDirectory(tmp_path)
    (tmp_path / "metrics.csv").write_text(",".join(OLD_FIELDS) + "\n0,1,0.0,0.0,0.0,0.0\n")
    run.append_metrics(10, _metrics(1.0), _metrics(0.5))
    rows = list(csv.reader(open(tmp_path / "metrics.csv")))
    assert rows[0] == OLD_FIELDS and all(len(r) == 6 for r in rows)
    history = run.read_history()
    assert history[-1] == {"round": 10, "precision@1": 0.1, "recall@1": 0.3, "precision@5": 0.2,
                           "recall@5": 0.4}
    assert np.isclose(history[0]["precision@1"], 0.0)
