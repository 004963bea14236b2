"""Hostile results tables handed to `rfrs-ref verdict`: values that are no metric, a seed
recorded twice, a run both finished and diverged, seeds that are no integer.

A verdict pairs runs by seed; each of these would make the pairing ambiguous or
the statistic meaningless (a P@1 of 1e300 "holds" any claim). They are refused in
one line naming the file, the line, the series and the seed, never a traceback and
never a verdict. A missing value (NaN: a metric the run did not record) is an
unpaired seed, as documented, and the divergence rule decides as documented.
"""

from __future__ import annotations

import functools
import pandas as pd
import pytest
from click.testing import CliRunner

from rfrs_ref.experiments.claims import (FAILS, HOLDS, INCONCLUSIVE, TableError, claim, evaluate_claim,
                                         find_results, paired_difference)


def _rows(values: dict, status="ok") -> list[dict]:
    """values[(series, seed)] = P@1 = P@5 = R@5 of Fig. 10 (Adam vs SGD) on ML100K."""
    rows = []
    for (series, seed), v in values.items():
        for metric, k in (("precision", 1), ("precision", 5), ("recall", 5)):
            rows.append({"status": status, "label_series": series, "dataset": "ml100k", "alpha": 0.0,
                         "seed": seed, "metric": metric if status == "ok" else None,
                         "k": k if status == "ok" else None, "value": v if status == "ok" else None})
            if status != "ok":
                break
    return rows


GOOD = {**{("Adam", s): 0.30 + 0.01 * s for s in range(5)}, **{("SGD", s): 0.20 + 0.012 * s for s in range(5)}}


def _store(tmp_path, rows) -> str:
    d = tmp_path / "adam-sgd"
    d.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(d / "results.csv", index=False)
    return str(tmp_path)


def _verdict(path, *extra):
    from rfrs_ref.cli.main import main

    return CliRunner().invoke(main, ["verdict", path, "--claim", "adam-sgd", *extra])


@pytest.fixture
def refused(refused):
    """A refusal that prints no verdict."""
    return functools.partial(refused, never='| holds |')


def test_the_clean_table_holds(tmp_path):
    res = _verdict(_store(tmp_path, _rows(GOOD)))
    assert res.exit_code == 0 and "| holds |" in res.output, res.output


@pytest.mark.parametrize("value, fragment", [
    (1e300, "not a metric in [0, 1]"), (float("inf"), "not a metric in [0, 1]"),
    (-0.5, "not a metric in [0, 1]"), (1.5, "not a metric in [0, 1]"), ("abc", "is not a number"),
])
def test_a_value_that_is_no_metric_is_refused(tmp_path, value, fragment, refused):
    """SGD's seed 2 at P@1: with 1e300 (or +inf, dropped before) Adam's claim could flip or 'hold'."""
    rows = _rows(GOOD)
    i = next(i for i, r in enumerate(rows) if r["label_series"] == "SGD" and r["seed"] == 2)
    rows[i]["value"] = value
    refused(_verdict(_store(tmp_path, rows)), "adam-sgd/results.csv", f"line {i + 2}", "'SGD'",
             "seed 2", fragment)


@pytest.mark.parametrize("column, value", [("alpha", float("nan")), ("alpha", float("inf")),
                                           ("alpha", 1.5), ("alpha", "x"), ("k", float("nan")),
                                           ("k", float("inf")), ("k", 2.5)])
def test_a_row_of_no_fraction_or_no_k_is_refused_not_dropped(tmp_path, column, value, refused):
    """SGD's seed 2 with α or K NaN matched no cell: the claim 'held' on the 4 seeds left,
    exit 0; with α = inf it also made a row of its own."""
    rows = _rows(GOOD)
    i = next(i for i, r in enumerate(rows) if r["label_series"] == "SGD" and r["seed"] == 2)
    rows[i][column] = value
    refused(_verdict(_store(tmp_path, rows)), "adam-sgd/results.csv", f"line {i + 2}", "'SGD'",
            "seed 2", "alpha" if column == "alpha" else "K is not a whole number")


@pytest.mark.parametrize("column, value", [("status", None), ("status", "0k"), ("dataset", None),
                                           ("label_series", None), ("label_series", " "),
                                           ("metric", None)])
def test_a_row_with_an_empty_cell_that_selects_it_is_refused_not_dropped(tmp_path, column, value,
                                                                         refused):
    """SGD's seed 2 with an empty status, dataset, series or metric matched no cell: the
    claim 'held' on the 4 seeds left, exit 0."""
    rows = _rows(GOOD)
    i = next(i for i, r in enumerate(rows) if r["label_series"] == "SGD" and r["seed"] == 2)
    rows[i][column] = value
    refused(_verdict(_store(tmp_path, rows)), "adam-sgd/results.csv", f"line {i + 2}", "seed 2",
            f"status {value!r} is not one of" if value == "0k" else f"column {column} is empty")


def test_a_diverged_row_with_no_dataset_is_refused(tmp_path, refused):
    """A divergence of SGD's seed 3 whose dataset is empty was counted nowhere."""
    rows = _rows(GOOD) + _rows({("SGD", 3): None}, status="diverged")
    rows = [r for r in rows if not (r["label_series"] == "SGD" and r["seed"] == 3
                                    and r["status"] == "ok")]
    rows[-1]["dataset"] = None
    refused(_verdict(_store(tmp_path, rows)), "adam-sgd/results.csv", f"line {len(rows) + 1}",
            "seed 3", "column dataset is empty in a diverged run's row")


def test_a_failed_row_may_leave_its_cells_empty(tmp_path):
    """A failed run is in no cell: its empty dataset or series is not a reason to refuse."""
    rows = _rows(GOOD) + [{**r, "dataset": None, "label_series": None}
                          for r in _rows({("SGD", 9): None}, status="failed")]
    res = _verdict(_store(tmp_path, rows))
    assert res.exit_code == 0 and "| holds |" in res.output, res.output


def test_a_metric_the_tables_take_is_one_the_verdict_takes(tmp_path):
    """One bound for a metric (results.METRIC_MAX): an NDCG that rounds 5e-10 above 1, which
    the tables count as a finished run's, was refused by the verdict as no metric."""
    from rfrs_ref.experiments.claims import metric_value
    from rfrs_ref.experiments.results import METRIC_MAX, non_finite_metric

    hair = 1.0 + 5e-10
    assert non_finite_metric({"model": {"ndcg@5": hair}}, [5]) is None
    assert metric_value(hair, "w", "ndcg@5") == hair
    beyond = METRIC_MAX * (1 + 1e-9)
    assert non_finite_metric({"model": {"ndcg@5": beyond}}, [5]) is not None
    with pytest.raises(TableError, match="not a metric in"):
        metric_value(beyond, "w", "ndcg@5")
    rows = _rows({**GOOD, ("Adam", 0): hair})
    res = _verdict(_store(tmp_path, rows))
    assert res.exit_code == 0 and "| Adam vs SGD |" in res.output, res.output


def test_a_seed_recorded_twice_is_refused(tmp_path, refused):
    """Two finished runs of Adam with seed 0 (a concatenated table): which one pairs with SGD's?"""
    rows = _rows(GOOD) + _rows({("Adam", 0): 0.9})
    refused(_verdict(_store(tmp_path, rows)), "results.csv", "'Adam'", "seed 0", "two finished runs")


def _keyed(values: dict) -> list[dict]:
    """:func:`_rows` with each run's ``key``: values[(series, seed)] = (key, value)."""
    return [{"key": key, **r} for (series, seed), (key, v) in values.items()
            for r in _rows({(series, seed): v})]


@pytest.mark.parametrize("column", ["seed", "label_series"])
def test_one_run_counted_as_several_is_refused(tmp_path, column, refused):
    """Adam's two runs copied as seeds 2-4 (their keys kept): five 'pairs' from two runs, and
    a claim inconclusive on the two seeds Adam ran held on the five. With a series
    relabelled instead, one run was the other series' run too."""
    sgd = {("SGD", s): (f"s{s}", 0.20 + 0.012 * s) for s in range(5)}
    adam = {("Adam", 0): ("a0", 0.40), ("Adam", 1): ("a1", 0.26)}
    assert "| inconclusive |" in _verdict(_store(tmp_path / "two", _keyed({**adam, **sgd}))).output
    if column == "seed":
        copies = {("Adam", 2): ("a0", 0.40), ("Adam", 3): ("a1", 0.26), ("Adam", 4): ("a0", 0.40)}
        rows = _keyed({**adam, **sgd, **copies})
        line = 2 + next(i for i, r in enumerate(rows) if r["seed"] == 2 and r["key"] == "a0")
    else:
        rows = _keyed({**adam, **sgd})
        rows += [{**r, "label_series": "Adam", "seed": 2} for r in rows if r["key"] == "s2"]
        line = len(rows) - 1
    refused(_verdict(_store(tmp_path / "copied", rows)), "results.csv", f"line {line}",
            "run a0" if column == "seed" else "run s2", column)


def test_a_seed_both_finished_and_diverged_is_refused(tmp_path, refused):
    rows = _rows(GOOD) + _rows({("SGD", 3): None}, status="diverged")
    refused(_verdict(_store(tmp_path, rows)), "results.csv", "'SGD'", "seed 3", "both finished and diverged")


@pytest.mark.parametrize("seed", [1.5, "x"])
def test_a_seed_that_is_no_integer_is_refused(tmp_path, seed, refused):
    """1.5 would be read as seed 1 and pair with another run's seed 1."""
    rows = _rows(GOOD)
    for r in rows:
        if r["label_series"] == "SGD" and r["seed"] == 4:
            r["seed"] = seed
    refused(_verdict(_store(tmp_path, rows)), "results.csv", "'SGD'", "is not an integer")


def test_a_missing_value_in_a_finished_run_is_refused_a_failed_run_is_unpaired(tmp_path, refused):
    """Decision (documented): a finished run records every metric, so NaN in an ok row is
    damage, refused naming the line as inf is (it used to leave the seed out, and a
    baseline could win by losing its values). A failed run is in no pair: with fewer
    than 2 pairs nothing holds."""
    rows = _rows(GOOD)
    for r in rows:
        if r["label_series"] == "SGD" and r["seed"] >= 1:
            r["value"] = float("nan")
    refused(_verdict(_store(tmp_path / "a", rows)), "results.csv", "no value")
    failed = [r for r in rows if not (r["label_series"] == "SGD" and r["seed"] >= 1)]
    failed += _rows({("SGD", s): None for s in range(1, 5)}, status="failed")
    res = _verdict(_store(tmp_path / "b", failed))
    assert res.exit_code == 0 and "| holds |" not in res.output, res.output
    rows_ = evaluate_claim(claim("adam-sgd"), find_results([tmp_path / "b"]))
    assert all(r.n == 1 and r.verdict == INCONCLUSIVE for r in rows_)


def test_the_divergence_rule_decides_as_documented():
    """Decision (documented): on the seeds where both have an outcome, the series that
    diverged on more seeds is the worse one, whatever the metrics of the others; a seed
    where only one series has an outcome counts for nothing."""
    t = pd.DataFrame(_rows(GOOD) + _rows({("SGD", 0): None, ("SGD", 1): None}, status="diverged"))
    t = t[~((t["label_series"] == "SGD") & t["seed"].isin([0, 1]) & (t["status"] == "ok"))]
    p = paired_difference(t, "Adam", "SGD", dataset="ml100k", metric="precision", k=1)
    assert (p.diverged_a, p.diverged_b, p.total) == (0, 2, 5) and p.verdict(1) == HOLDS
    assert p.verdict(-1) == FAILS
    # Adam diverged on a seed SGD never ran: not compared, the t interval decides
    t2 = pd.DataFrame(_rows(GOOD) + _rows({("Adam", 7): None}, status="diverged"))
    p2 = paired_difference(t2, "Adam", "SGD", dataset="ml100k", metric="precision", k=1)
    assert (p2.diverged_a, p2.total) == (0, 5) and p2.verdict(1) == HOLDS


def test_the_python_api_raises_a_table_error():
    t = pd.DataFrame(_rows(GOOD) + _rows({("Adam", 1): 0.5}))
    with pytest.raises(TableError, match="two finished runs"):
        paired_difference(t, "Adam", "SGD", dataset="ml100k", metric="precision", k=1)
    assert issubclass(TableError, ValueError)


# -- Fig. 1: the capture runs' outcome.json files ---------------------------------------------------------

def _key(o) -> str | None:
    """The key the record ``o``'s spec hashes to (the name of its run's folder), or None."""
    from rfrs_ref.experiments.spec import RunSpec

    try:
        return RunSpec.from_json(o["spec"]).key
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _pca(tmp_path, outcomes: dict) -> str:
    """A results directory pca of the records ``outcomes``, each as a sweep writes it: in
    the folder named by its key, the key in it (``name: record``; ``name`` is the folder
    of a record whose spec hashes to no key)."""
    import json

    d = tmp_path / "pca"
    (d / "runs").mkdir(parents=True)
    (d / "results.csv").write_text("status\n")
    for name, o in outcomes.items():
        key = _key(o) or name
        if isinstance(o, dict):
            o = {**o, "key": key}
        (d / "runs" / key).mkdir()
        (d / "runs" / key / "outcome.json").write_text(o if isinstance(o, str) else json.dumps(o))
    return str(tmp_path)


def _capture(seed, grad=0.9, theta=0.2, **config):
    return {"status": "ok", "capture": {"separation": {"gradient": grad, "theta": theta}},
            "final": {"round": 24, "model": {}, "popularity": {}},
            "spec": {"kind": "capture", "labels": {"series": "FISM"},
                     "config": {"model": "fism", "dataset": "ml100k", "seed": seed, "rounds": 24,
                                "init_scale": 0.1, **config}}}


def _pca_verdict(path):
    from rfrs_ref.cli.main import main

    return CliRunner().invoke(main, ["verdict", path, "--claim", "pca"])


def test_clean_capture_runs_are_judged(tmp_path):
    res = _pca_verdict(_pca(tmp_path, {f"k{s}": _capture(s, grad=0.9 + 0.01 * s) for s in range(3)}))
    assert res.exit_code == 0 and "| holds |" in res.output, res.output


@pytest.mark.parametrize("edit, fragment", [
    (lambda o: o["capture"]["separation"].update(gradient="0.9"), "not both numbers"),
    (lambda o: o["capture"]["separation"].update(theta=True), "not both numbers"),
    (lambda o: o["spec"]["config"].pop("seed"), "no 'seed'"),
    (lambda o: o["spec"]["config"].update(seed=1.5), "is not an integer"),
    (lambda o: o["spec"].update(config=[1]), "outcome.json"),
])
def test_a_malformed_capture_outcome_is_refused(tmp_path, edit, fragment, refused):
    """A string separation crashed the verdict with a traceback (TypeError)."""
    outcomes = {f"k{s}": _capture(s) for s in range(1, 4)}  # no seed: seed 0, another key
    edit(outcomes["k1"])
    refused(_pca_verdict(_pca(tmp_path, outcomes)),
            f"runs/{_key(outcomes['k1']) or 'k1'}/outcome.json", fragment)


def test_two_results_directories_of_one_name_are_refused(tmp_path, refused):
    """verdict a b, where a/adam-sgd holds and b/adam-sgd does not, judged a/adam-sgd and
    left b's aside without a word (exit 0): a claim reads its directory by name."""
    from rfrs_ref.cli.main import main

    a = _store(tmp_path / "a", _rows(GOOD))
    b = _store(tmp_path / "b", _rows({(s, seed): 0.5 - v for (s, seed), v in GOOD.items()}))
    res = CliRunner().invoke(main, ["verdict", a, b, "--claim", "adam-sgd"])
    refused(res, f"{tmp_path / 'a' / 'adam-sgd'} and {tmp_path / 'b' / 'adam-sgd'}",
            "both results directories named 'adam-sgd'", "nothing was judged")
    # one directory named twice is one directory
    res = CliRunner().invoke(main, ["verdict", a, str(tmp_path / "a" / "adam-sgd"), "--claim",
                                    "adam-sgd"])
    assert res.exit_code == 0 and "| holds |" in res.output, res.output


@pytest.mark.parametrize("value", [float("nan"), float("-inf"), None, "missing"])
def test_a_capture_run_without_a_finite_separation_is_refused(tmp_path, value, refused):
    """Four finished runs with separations 5, 6, NaN and 5.5: the NaN run was left out
    without a word and the claim "held" with n = 3."""
    outcomes = {f"k{s}": _capture(s, grad=g) for s, g in enumerate((5.0, 6.0, 5.2, 5.5))}
    if value == "missing":
        del outcomes["k2"]["capture"]["separation"]["gradient"]
    else:
        outcomes["k2"]["capture"]["separation"]["gradient"] = value
    refused(_pca_verdict(_pca(tmp_path, outcomes)), f"runs/{_key(outcomes['k2'])}/outcome.json",
            "gradient",
            "not both", never="| holds |")


def test_a_capture_run_recorded_ok_without_a_result_is_in_no_pair(tmp_path):
    """A record whose final evaluation is of round 1 of 24 is a run that did not finish (the
    tables show it failed): its separation, which would turn the verdict, is not used."""
    outcomes = {f"k{s}": _capture(s, grad=g) for s, g in enumerate((5.0, 6.0, 5.2, 5.5))}
    outcomes["k2"]["capture"]["separation"]["gradient"] = -100.0
    outcomes["k2"]["final"]["round"] = 1
    res = _pca_verdict(_pca(tmp_path, outcomes))
    assert res.exit_code == 0 and "| holds |" in res.output, res.output
    assert "| 3 |" in res.output


def test_two_capture_runs_with_one_seed_are_refused(tmp_path, refused):
    """The second silently replaced the first in the pairing."""
    outcomes = {**{f"k{s}": _capture(s) for s in range(3)},
                "dup": _capture(0, grad=0.1, client_fraction=0.5)}  # another run, one seed
    refused(_pca_verdict(_pca(tmp_path, outcomes)), "outcome.json", "a second capture run", "seed 0")


@pytest.mark.parametrize("forge", ["the key of the run copied", "the key of its folder"])
def test_a_record_of_another_run_is_not_counted(tmp_path, forge):
    """Two folders holding a copy of another run's record, its seed edited (and its
    separation moved a little): verdict counted them as two more seeds, and a claim
    inconclusive on one seed "held" on three. A record whose key or configuration is not
    its folder's is no run's result (the sweep counts it failed and runs it again): in no
    pair, and the rows say how many were left out and name the first."""
    import json

    path = _pca(tmp_path, {"k0": _capture(0, grad=0.9)})
    runs = tmp_path / "pca" / "runs"
    src, = runs.iterdir()
    record = json.loads((src / "outcome.json").read_text())
    for fake, seed in (("00000000000000a1", 1), ("00000000000000a2", 2)):
        forged = json.loads(json.dumps(record))
        forged["spec"]["config"]["seed"] = seed
        forged["capture"]["separation"]["gradient"] += 0.01 * seed
        if forge == "the key of its folder":
            forged["key"] = fake
        (runs / fake).mkdir()
        (runs / fake / "outcome.json").write_text(json.dumps(forged))
    res = _pca_verdict(path)
    assert res.exit_code == 0, res.output
    assert "| holds |" not in res.output and "| inconclusive |" in res.output, res.output
    assert "n = 1" in res.output
    assert "2 record(s) of another run not counted" in res.output
    assert "runs/00000000000000a1/outcome.json" in res.output


@pytest.mark.parametrize("content", [bytes(range(256)) * 4, b"", b"a,b\n1,2,3,4\n5\n"])
def test_a_results_file_that_is_not_csv_is_refused_naming_it(tmp_path, content, refused):
    """pandas' messages ('No columns to parse from file', a codec error) named no file."""
    d = tmp_path / "adam-sgd"
    d.mkdir()
    (d / "results.csv").write_bytes(content)
    refused(_verdict(str(tmp_path)), "adam-sgd/results.csv")
    from rfrs_ref.cli.main import main

    res = CliRunner().invoke(main, ["ranking", str(d / "results.csv")])
    refused(res, "adam-sgd/results.csv")


@pytest.mark.parametrize("where, column", [("results.csv", "value"), ("results.csv", "label_series"),
                                           ("results.csv", "seed"), ("runs.csv", "label_series"),
                                           ("runs.csv", "seed")])
def test_a_table_that_names_a_column_twice_is_refused(tmp_path, refused, where, column):
    """pandas reads a repeated name as `value`, `value.1` and keeps the first: a table whose
    second `value` column said SGD beats Adam was judged on the first, which says the
    opposite, without a word."""
    d = tmp_path / "adam-sgd"
    d.mkdir()
    df = pd.DataFrame(_rows(GOOD))
    if where == "runs.csv":  # the normalised pair: results.csv (key, metric, k, value) + runs.csv
        df["key"] = [f"{s}-{seed}" for s, seed in zip(df["label_series"], df["seed"])]
        runs = df.drop(columns=["metric", "k", "value"]).drop_duplicates("key")
        df[["key", "dataset", "alpha", "seed", "k", "metric", "value"]].to_csv(d / "results.csv", index=False)
        table, frame = d / "runs.csv", runs
    else:
        table, frame = d / "results.csv", df
    lines = frame.to_csv(index=False).splitlines()
    other = frame[column].iloc[::-1].astype(str).tolist()  # the same values in another order
    table.write_text("\n".join([lines[0] + f",{column}"]
                               + [f"{x},{y}" for x, y in zip(lines[1:], other)]) + "\n")
    refused(_verdict(str(tmp_path)), f"{where}, line 1", f"column {column!r} appears twice")
    from rfrs_ref.cli.main import main

    refused(CliRunner().invoke(main, ["ranking", str(d / "results.csv")]), f"column {column!r} appears twice")


@pytest.mark.parametrize("column, value, said", [
    ("metric", "precision ", "'precision ' differs from 'precision' only in spaces or case"),
    ("metric", "Precision", "'Precision' differs from 'precision'"),
    ("metric", "precission", "'precission' is not one of"),
    ("label_series", "Adam ", "'Adam ' differs from 'Adam'"),
    ("label_series", "adam", "'adam' differs from 'Adam'"),
    ("dataset", "ml100k ", "'ml100k ' differs from 'ml100k'"),
    ("dataset", "ML100K", "'ML100K' differs from 'ml100k'"),
])
def test_a_label_that_selects_no_cell_is_refused(tmp_path, column, value, said, refused):
    """Adam's seeds 0-2 with metric 'precision ' (or series 'Adam ') matched no cell: the claim
    was judged on seeds 3 and 4 alone, without a word; a table where Adam loses on
    seeds 0-2 then 'held'."""
    rows = _rows(GOOD)
    idx = [i for i, r in enumerate(rows) if r["label_series"] == "Adam" and r["seed"] < 3]
    for i in idx:
        rows[i][column] = value
    refused(_verdict(_store(tmp_path, rows)), "adam-sgd/results.csv", f"line {idx[0] + 2}",
            f"column {column}", said)


@pytest.mark.parametrize("column, value", [("rounds", 10), ("client_fraction", 0.5),
                                           ("test_fraction", 0.3)])
def test_runs_of_different_protocols_are_not_paired(tmp_path, column, value, refused):
    """SGD's runs of 10 rounds were paired with Adam's of 600 and the verdict read like one of
    the protocol."""
    rows = _rows(GOOD)
    for r in rows:
        r.update(rounds=600, final_round=600, client_fraction=0.01, test_fraction=0.2)
        if r["label_series"] == "SGD" and r["seed"] == 2:
            r[column] = value
            if column == "rounds":
                r["final_round"] = value
    refused(_verdict(_store(tmp_path, rows)), "adam-sgd/results.csv", "seed 2",
            f"the runs paired differ in {column}")


def test_a_failed_runs_fraction_that_is_no_number_does_not_stop_the_verdict(tmp_path):
    """A failed run (in no cell) with alpha 'abc' ended the verdict with `could not convert
    string to float: 'abc'`, naming no line."""
    rows = _rows(GOOD) + [{"status": "failed", "label_series": "SGD", "dataset": "ml100k",
                           "alpha": "abc", "seed": 9, "metric": None, "k": None, "value": None}]
    res = _verdict(_store(tmp_path, rows))
    assert res.exit_code == 0 and "| holds |" in res.output, res.output


def test_series_that_share_no_seed_say_so(tmp_path, refused):
    """SGD's seeds shifted by 100: the row read 'not run' and the error 'no finished runs of the
    claims' series', though both series finished five runs."""
    values = {(series, seed + (100 if series == "SGD" else 0)): v for (series, seed), v in GOOD.items()}
    res = _verdict(_store(tmp_path, _rows(values)))
    assert "no seed in common: Adam finished 5 seed(s), SGD 5, none the same" in res.output, res.output
    refused(res, "the series compared finished no seed in common")


def _elsewhere(tmp_path, rows) -> str:
    """A results table outside the folder judged."""
    d = tmp_path / "elsewhere"
    d.mkdir()
    pd.DataFrame(rows).to_csv(d / "results.csv", index=False)
    return str(d / "results.csv")


def test_a_table_linked_into_a_results_directory_is_refused(tmp_path, refused):
    """A results.csv that is a link to another file was read and judged as the directory's."""
    import os

    src = _elsewhere(tmp_path, _rows(GOOD))
    d = tmp_path / "results" / "adam-sgd"
    d.mkdir(parents=True)
    os.symlink(src, d / "results.csv")
    refused(_verdict(str(tmp_path / "results")), "adam-sgd/results.csv", "is a link", "elsewhere")


def test_a_results_directory_linked_into_a_folder_is_refused(tmp_path, refused):
    import os

    _store(tmp_path / "other", _rows(GOOD))
    (tmp_path / "results").mkdir()
    os.symlink(tmp_path / "other" / "adam-sgd", tmp_path / "results" / "adam-sgd")
    refused(_verdict(str(tmp_path / "results")), "results/adam-sgd", "is a link", "own path")


def test_a_linked_capture_outcome_is_refused(tmp_path, refused):
    import json
    import os

    path = _pca(tmp_path, {f"k{s}": _capture(s, grad=0.9 + 0.01 * s) for s in range(3)})
    out = tmp_path / "outside.json"
    out.write_text(json.dumps(_capture(3, grad=0.95)))
    (tmp_path / "pca" / "runs" / "k3").mkdir()
    os.symlink(out, tmp_path / "pca" / "runs" / "k3" / "outcome.json")
    refused(_pca_verdict(path), "runs/k3/outcome.json", "is a link")


def test_a_results_directory_named_through_a_link_is_judged(tmp_path):
    """The directory the user names may be a link (as a sweep's output may)."""
    import os

    _store(tmp_path / "real", _rows(GOOD))
    os.symlink(tmp_path / "real" / "adam-sgd", tmp_path / "adam-sgd")
    res = _verdict(str(tmp_path / "adam-sgd"))
    assert res.exit_code == 0 and "| holds |" in res.output, res.output


def test_a_verdict_or_ranking_is_never_written_into_a_runs_directory(tmp_path, refused):
    """verdict --out RESULTS/runs/<key>/verdict.md wrote the table (and its .csv) into a run's
    directory, which a sweep clears when the run starts again; so did ranking --out."""
    from rfrs_ref.cli.main import main

    path = _store(tmp_path, _rows(GOOD))
    run = tmp_path / "adam-sgd" / "runs" / "0123456789abcdef"
    run.mkdir(parents=True)
    (run / "outcome.json").write_text('{"status": "ok"}')
    for out in (run / "verdict.md", run / "sub" / "verdict.md"):
        res = CliRunner().invoke(main, ["verdict", path, "--claim", "adam-sgd", "--out", str(out)])
        refused(res, str(run), "lies inside the run directory", "nothing was written")
        res = CliRunner().invoke(main, ["ranking", str(tmp_path / "adam-sgd"), "--out", str(out)])
        assert res.exit_code == 2 and "lies inside the run directory" in res.output, res.output
    assert sorted(p.name for p in run.iterdir()) == ["outcome.json"]


def test_a_verdict_out_that_cannot_be_written_is_one_line(tmp_path, refused):
    """--out under a file (a folder that cannot be made) ended in a FileExistsError
    traceback after the table was printed."""
    (tmp_path / "file").write_text("mine\n")
    res = _verdict(_store(tmp_path, _rows(GOOD)), "--out", str(tmp_path / "file" / "v.md"))
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    errors = [x for x in res.output.splitlines() if x.startswith("Error")]
    assert len(errors) == 1 and "could not write the verdict table" in errors[0], res.output
    assert (tmp_path / "file").read_text() == "mine\n"


def test_a_verdict_or_ranking_is_never_written_into_a_results_directorys_runs_folder(tmp_path,
                                                                                    refused):
    """--out RESULTS/runs/verdict.md (the folder of the sweep's run directories, not one run's)
    wrote the table among the run directories; so did ranking --out."""
    from rfrs_ref.cli.main import main

    path = _store(tmp_path, _rows(GOOD))
    runs = tmp_path / "adam-sgd" / "runs"
    runs.mkdir()
    (runs / "0123456789abcdef").mkdir()
    (tmp_path / "adam-sgd" / "provenance.json").write_text('{"calls": []}\n')  # a sweep's
    entries = sorted(p.name for p in runs.iterdir())
    for out in (runs / "verdict.md", runs / "sub" / "verdict.md"):
        res = CliRunner().invoke(main, ["verdict", path, "--claim", "adam-sgd", "--out", str(out)])
        refused(res, "the runs/ folder of the results directory", "nothing was written")
        res = CliRunner().invoke(main, ["ranking", str(tmp_path / "adam-sgd"), "--out", str(out)])
        assert res.exit_code == 2 and "the runs/ folder" in res.output, res.output
    assert sorted(p.name for p in runs.iterdir()) == entries and not (runs / "sub").exists()
