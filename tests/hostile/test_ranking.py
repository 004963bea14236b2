"""Hostile results tables handed to `rfrs-ref ranking`: a value that is no metric, a seed
recorded twice. A rule's mean and its paired differences read one value per seed; these
are refused in one line naming the file, never averaged into a rank or dropped."""

from __future__ import annotations

import functools

import pandas as pd
import pytest
from click.testing import CliRunner


def _rows(values: dict) -> list[dict]:
    """values[(rule, space, seed)] = P@5 on ML100K, α = 0.4, ascent, no pre-aggregator."""
    return [{"status": "ok", "label_series": rule, "label_space": space, "label_pre": "none",
             "attack": "ascent", "dataset": "ml100k", "alpha": 0.4, "seed": seed, "metric": "precision",
             "k": 5, "value": v} for (rule, space, seed), v in values.items()]


GOOD = {**{("mean", "parameter", s): 0.10 + 0.01 * s for s in range(3)},
        **{("krum", "gradient", s): 0.20 + 0.01 * s for s in range(3)},
        **{("trmean", "gradient", s): 0.15 + 0.02 * s for s in range(3)}}


def _ranking(tmp_path, rows):
    from rfrs_ref.cli.main import main

    path = tmp_path / "results.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return CliRunner().invoke(main, ["ranking", str(path)]), str(path)


@pytest.fixture
def refused(refused):
    """A refusal that prints no ranking."""
    return functools.partial(refused, never='| 1 |')


def test_the_clean_table_ranks(tmp_path):
    res, _ = _ranking(tmp_path, _rows(GOOD))
    assert res.exit_code == 0 and "| 1 | krum |" in res.output, res.output


@pytest.mark.parametrize("value", [float("inf"), 1e300, -1.0, "x"])
def test_a_value_that_is_no_metric_is_refused(tmp_path, value, refused):
    """trmean's seed 1 at +inf was dropped (trmean still ranked on two seeds); 1e300 ranked it first."""
    rows = _rows(GOOD)
    i = next(i for i, r in enumerate(rows) if r["label_series"] == "trmean" and r["seed"] == 1)
    rows[i]["value"] = value
    res, path = _ranking(tmp_path, rows)
    refused(res, path, f"line {i + 2}", "trmean", "seed 1")


@pytest.mark.parametrize("column, value", [("alpha", float("nan")), ("alpha", float("inf")),
                                           ("alpha", -0.2), ("k", float("nan")),
                                           ("k", float("inf"))])
def test_a_row_of_no_fraction_or_no_k_is_refused_not_dropped(tmp_path, column, value, refused):
    """trmean's seed 1 with α or K NaN matched no cell: trmean ranked on two seeds, exit 0; with
    α = inf it was ranked first in a cell 'α = inf' of its own."""
    rows = _rows(GOOD)
    i = next(i for i, r in enumerate(rows) if r["label_series"] == "trmean" and r["seed"] == 1)
    rows[i][column] = value
    res, path = _ranking(tmp_path, rows)
    refused(res, path, f"line {i + 2}", "trmean", "seed 1",
            "alpha" if column == "alpha" else "K is not a whole number")


@pytest.mark.parametrize("column", ["status", "dataset", "label_series", "label_space",
                                    "label_pre", "attack", "metric"])
def test_a_row_with_an_empty_cell_that_selects_it_is_refused_not_dropped(tmp_path, column,
                                                                         refused):
    """trmean's seed 1 with any of these empty matched no cell: trmean ranked on two seeds,
    exit 0."""
    rows = _rows(GOOD)
    i = next(i for i, r in enumerate(rows) if r["label_series"] == "trmean" and r["seed"] == 1)
    rows[i][column] = None
    res, path = _ranking(tmp_path, rows)
    refused(res, path, f"line {i + 2}", "seed 1",
            f"column {column} is empty")


def test_a_seed_recorded_twice_is_refused(tmp_path, refused):
    """Averaged into trmean's mean before: its rank came from four runs over three seeds."""
    res, path = _ranking(tmp_path, _rows(GOOD) + _rows({("trmean", "gradient", 0): 0.9}))
    refused(res, path, "trmean", "seed 0", "two finished runs")


def test_one_run_copied_under_another_seed_is_refused(tmp_path, refused):
    """trmean's seed-0 run copied as seed 3 (its key kept): one run counted twice, in its mean
    and in its pairs."""
    rows = [{"key": f"{r['label_series']}-{r['seed']}", **r} for r in _rows(GOOD)]
    copy = next(r for r in rows if r["key"] == "trmean-0")
    rows.append({**copy, "seed": 3})
    res, path = _ranking(tmp_path, rows)
    refused(res, path, f"line {len(rows) + 1}", "run trmean-0", "seed 3", "at line")

def test_a_value_at_another_k_is_not_read(tmp_path):
    """Only the ranked metric@K is judged: a row of another K is never read."""
    rows = _rows(GOOD) + [{**r, "k": 1, "value": 7.0} for r in _rows(GOOD)]
    res, _ = _ranking(tmp_path, rows)
    assert res.exit_code == 0 and "| 1 | krum |" in res.output, res.output


def test_a_table_linked_into_the_results_directory_is_refused(tmp_path, refused):
    """results.csv linked to a table elsewhere was ranked as the directory's."""
    import os

    from rfrs_ref.cli.main import main

    (tmp_path / "elsewhere").mkdir()
    _ranking(tmp_path / "elsewhere", _rows(GOOD))
    d = tmp_path / "ranking"
    d.mkdir()
    os.symlink(tmp_path / "elsewhere" / "results.csv", d / "results.csv")
    refused(CliRunner().invoke(main, ["ranking", str(d)]), "ranking/results.csv", "is a link")


def test_a_runs_file_linked_beside_the_table_is_refused(tmp_path, refused):
    import os

    from rfrs_ref.cli.main import main

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "runs.csv").write_text("key\n")
    pd.DataFrame(_rows(GOOD)).to_csv(tmp_path / "results.csv", index=False)
    os.symlink(tmp_path / "elsewhere" / "runs.csv", tmp_path / "runs.csv")
    refused(CliRunner().invoke(main, ["ranking", str(tmp_path / "results.csv")]), "runs.csv", "is a link")


def test_a_table_named_through_a_link_is_ranked(tmp_path):
    import os

    from rfrs_ref.cli.main import main

    (tmp_path / "real").mkdir()
    _ranking(tmp_path / "real", _rows(GOOD))
    os.symlink(tmp_path / "real", tmp_path / "ranking")
    res = CliRunner().invoke(main, ["ranking", str(tmp_path / "ranking")])
    assert res.exit_code == 0 and "| 1 | krum |" in res.output, res.output


def test_a_failed_run_with_empty_cells_beside_another_dataset_is_no_crash(tmp_path):
    """A failed run may leave its cells empty; beside a dataset outside the ranking's own,
    its NaN dataset was sorted with the names (TypeError: a traceback, no ranking)."""
    rows = _rows(GOOD) + [{**r, "dataset": "synthetic"} for r in _rows(GOOD)]
    rows.append({"status": "failed", "label_series": "krum", "label_space": "gradient",
                 "label_pre": "none", "attack": None, "dataset": None, "alpha": None,
                 "seed": 3, "metric": None, "k": None, "value": None})
    res, _ = _ranking(tmp_path, rows)
    assert res.exit_code == 0, res.output
    assert res.output.count("| 1 | krum |") == 2 and "nan" not in res.output.lower(), res.output


@pytest.mark.parametrize("column, value, said", [
    ("metric", "precision ", "'precision ' differs from 'precision' only in spaces or case"),
    ("metric", "Precision", "'Precision' differs from 'precision'"),
    ("metric", "precission", "'precission' is not one of"),
    ("label_space", "Gradient", "'Gradient' differs from 'gradient'"),
    ("label_space", "gradients", "'gradients' is not one of 'gradient', 'parameter'"),
    ("label_pre", "NNM", "'NNM' differs from 'nnm'"),
    ("label_pre", "bucket", "'bucket' is not one of 'none', 'nnm'"),
    ("label_series", "Trmean", "'Trmean' differs from 'trmean'"),
    ("dataset", "ml100k ", "'ml100k ' differs from 'ml100k'"),
    ("attack", "Ascent", "'Ascent' differs from 'ascent'"),
])
def test_a_label_that_selects_no_cell_is_refused(tmp_path, column, value, said, refused):
    """trmean's seeds 0 and 1 with metric 'precision ' (or space 'Gradient') matched no cell:
    trmean was ranked on seed 2 alone, first, exit 0, the other two never mentioned."""
    rows = _rows(GOOD)
    idx = [i for i, r in enumerate(rows) if r["label_series"] == "trmean" and r["seed"] < 2]
    for i in idx:
        rows[i][column] = value
    res, path = _ranking(tmp_path, rows)
    refused(res, path, f"line {idx[0] + 2}", f"column {column}", said)
