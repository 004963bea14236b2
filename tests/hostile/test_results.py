"""Hostile results tables: a ``run_dir`` read from a table a user hands ``rfrs-ref plot``
never leads the plots out of the results directory; the refusal is one line naming the
directory and the value, before anything is drawn."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading

import pandas as pd
import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main
from rfrs_ref.experiments.results import run_path
from rfrs_ref.experiments.spec import RunSpec, make_config
from rfrs_ref.experiments.sweep import run_sweep

TINY = {"dataset": "synthetic", "dataset_params": {"n_users": 60, "n_items": 40, "mean_items": 8.0},
        "client_fraction": 0.2, "rounds": 2, "eval_every": 1}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "res"
    runs = [RunSpec(make_config({**TINY, "seed": s, **opt}), trial=s, labels={"series": name})
            for s in (0, 1) for name, opt in (("Adam", {}), ("SGD", {"optimizer": "sgd"}))]
    run_sweep(runs, out, workers=0, threads=1, label_columns=("label_series",))
    return out


def _tampered(store, tmp_path, value, *, secret=True):
    """A copy of the store's tables (not its runs) whose first run's run_dir is ``value``,
    beside a directory ``secret`` holding an outcome.json that must never be read."""
    d = tmp_path / "res"
    d.mkdir()
    for name in ("results.csv", "runs.csv"):
        (d / name).write_bytes((store / name).read_bytes())
    shutil.copytree(store / "runs", d / "runs")
    runs = pd.read_csv(d / "runs.csv")
    runs["run_dir"] = runs["run_dir"].astype(object)
    runs.loc[0, "run_dir"] = value
    runs.to_csv(d / "runs.csv", index=False)
    if secret:
        (tmp_path / "secret").mkdir()
        (tmp_path / "secret" / "outcome.json").write_text('{"history": [{"round": 1}]}')
    return d


@pytest.mark.parametrize("value", ["../secret", "runs/../../secret", "/etc", "", None])
def test_plot_refuses_a_run_dir_that_leaves_the_results_directory(store, tmp_path, value):
    d = _tampered(store, tmp_path, value)
    res = CliRunner().invoke(main, ["plot", str(d), "--figure", "10"], catch_exceptions=False)
    assert res.exit_code != 0, res.output
    assert "Traceback" not in res.output
    line, = res.output.strip().splitlines()
    said = "run_dir is empty" if not value else f"run_dir {value!r}"
    assert said in line and str(d) in line


def test_a_link_out_of_the_directory_is_refused(store, tmp_path):
    d = _tampered(store, tmp_path, "runs/away")
    os.symlink(tmp_path / "secret", d / "runs" / "away")
    with pytest.raises(ValueError, match="leads outside"):
        run_path(d, "runs/away")
    res = CliRunner().invoke(main, ["plot", str(d), "--figure", "10"], catch_exceptions=False)
    # refused before anything is read, as verdict and ranking refuse it
    assert res.exit_code != 0 and f"{d / 'runs' / 'away'} is a link" in res.output
    assert "nothing was drawn" in res.output


def test_the_untampered_tables_still_plot(store, tmp_path):
    res = CliRunner().invoke(main, ["plot", str(store), "--figure", "10", "--out",
                                    str(tmp_path / "fig")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "fig" / "fig10_curves.png").exists()
    assert run_path(store, "runs/abc") == store / "runs" / "abc"


def test_an_outcome_with_a_key_twice_is_no_outcome(tmp_path):
    """JSON readers disagree on which of two values of one key wins: a record saying
    "status": "failed" and then "ok" is no record of either (the sweep runs it again)."""
    from rfrs_ref.experiments.results import Store

    store = Store(tmp_path)
    path = store.outcome_path("k")
    path.parent.mkdir(parents=True)
    path.write_text('{"status": "ok"}')
    assert store.read_outcome("k") == {"status": "ok"}
    path.write_text('{"status": "failed", "status": "ok"}')
    assert store.read_outcome("k") is None
    assert store.outcomes() == {}


@pytest.mark.parametrize("damage", [b'{"status": "ok",', b'{"status": "failed", "status": "ok"}',
                                    b'[1, 2]', b'\xff\xfe'])
def test_a_damaged_record_is_a_failure_that_the_sweep_names(tmp_path, damage):
    """An outcome.json that does not read (cut short, a key twice, not an object, not
    UTF-8) was taken as no record at all: the sweep ran the run again without a word, and
    with --no-retry-failed too, clearing the directory. It is now a failure like any
    other: run again by default with a note naming the file and why, and kept (exit 1)
    with --no-retry-failed."""
    from rfrs_ref.experiments.results import Store

    out = tmp_path / "res"
    runs = [RunSpec(make_config({**TINY, "seed": 0}), trial=0, labels={"series": "Adam"})]
    run_sweep(runs, out, workers=0, threads=1)
    key = runs[0].key
    store = Store(out)
    assert store.outcome_problem(key) is None
    store.outcome_path(key).write_bytes(damage)
    why = store.outcome_problem(key)
    assert why and store.read_outcome(key) is None
    kept = run_sweep(runs, out, workers=0, threads=1, retry_failed=False)
    assert (kept.finished, kept.kept_failed) == (0, 1)
    assert [(p.name, again) for p, _, again in kept.damaged] == [("outcome.json", False)]
    assert store.outcome_path(key).read_bytes() == damage  # left as it was
    again = run_sweep(runs, out, workers=0, threads=1)
    assert again.finished == 1 and again.damaged[0][2] is True
    assert store.read_outcome(key)["status"] == "ok"


@pytest.mark.parametrize("swap", ["other seed", "key removed", "spec of the other seed"])
def test_another_runs_record_in_a_runs_directory_is_no_result(tmp_path, swap):
    """Seed 1's outcome.json copied into seed 0's run directory was skipped as seed 0's
    finished run and tabulated under its labels (both seeds showed seed 1's metrics, exit 0):
    a record whose key or configuration is another run's is now no result, named in a note,
    kept and counted failed with --no-retry-failed (out of the tables), run again otherwise."""
    import json

    from rfrs_ref.experiments.results import Store

    out = tmp_path / "res"
    runs = [RunSpec(make_config({**TINY, "seed": s}), trial=s, labels={"series": "Adam"})
            for s in (0, 1)]
    run_sweep(runs, out, workers=0, threads=1)
    store = Store(out)
    k0, k1 = runs[0].key, runs[1].key
    mine, other = (json.loads(store.outcome_path(k).read_text()) for k in (k0, k1))
    record = {"other seed": other, "key removed": {n: v for n, v in other.items() if n != "key"},
              "spec of the other seed": {**mine, "spec": other["spec"]}}[swap]
    text = json.dumps(record)
    store.outcome_path(k0).write_text(text)
    kept = run_sweep(runs, out, workers=0, threads=1, retry_failed=False)
    assert (kept.finished, kept.kept_failed) == (0, 1)
    assert [(p.parent.name, again) for p, _, again in kept.damaged] == [(k0, False)]
    assert k0 not in set(pd.read_csv(out / "results.csv")["key"])
    assert store.outcome_path(k0).read_text() == text  # left as it was
    again = run_sweep(runs, out, workers=0, threads=1)
    assert again.finished == 1 and again.damaged[0][2] is True
    assert store.read_outcome(k0)["key"] == k0


def test_a_record_linked_in_from_elsewhere_is_not_this_runs_result(tmp_path):
    """runs/<key>/outcome.json as a link to a record elsewhere was read through and skipped
    as finished without a word, though rfrs-ref verdict then refused the whole results
    directory for that link; it is now no record of the run (as a FIFO there is not): named
    in a note, run again, the link replaced by the run's own record and its target left
    as it was."""
    from rfrs_ref.experiments.results import Store

    out = tmp_path / "res"
    runs = [RunSpec(make_config({**TINY, "seed": 0}), trial=0, labels={"series": "Adam"})]
    run_sweep(runs, out, workers=0, threads=1)
    store = Store(out)
    path = store.outcome_path(runs[0].key)
    elsewhere = tmp_path / "elsewhere.json"
    shutil.move(path, elsewhere)
    path.symlink_to(elsewhere)
    before = elsewhere.read_bytes()
    assert "link" in store.outcome_problem(runs[0].key) and store.read_outcome(runs[0].key) is None
    again = run_sweep(runs, out, workers=0, threads=1)
    assert again.finished == 1 and [p for p, _, _ in again.damaged] == [path]
    assert not path.is_symlink() and store.read_outcome(runs[0].key)["status"] == "ok"
    assert elsewhere.read_bytes() == before


# -- a FIFO or a link among the files verdict, ranking and plot read ---------------------------

@contextlib.contextmanager
def _unblocking(fifo, after: float = 10.0):
    """Yields a list that holds True once a reader had waited ``after`` seconds on the FIFO
    ``fifo``: it is then opened for writing and closed, so that the reader sees its end and
    a command that would wait for ever fails its test instead of hanging it."""
    hung: list[bool] = []
    stop = threading.Event()

    def watch():
        if stop.wait(after):
            return
        while not stop.is_set():
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader has it open
                stop.wait(0.05)
                continue
            hung.append(True)
            os.close(fd)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield hung
    finally:
        stop.set()
        thread.join()


def _copy(store, tmp_path, name="adam-sgd"):
    """A copy of the store, named as verdict reads Fig. 10's runs (series Adam and SGD)."""
    d = tmp_path / name
    shutil.copytree(store, d, ignore=shutil.ignore_patterns(".lock", "figures"))
    return d


@pytest.mark.parametrize("command", ["verdict", "ranking"])
@pytest.mark.parametrize("table", ["runs.csv", "results.csv", "results.parquet"])
def test_a_fifo_in_place_of_a_table_is_refused_without_waiting(store, tmp_path, refused, command,
                                                               table):
    """runs.csv (or results.csv) as a FIFO: verdict and ranking waited for ever for a writer;
    they now refuse it in one line naming the file (results.parquet too, where pyarrow
    reads it: it is read before the CSV files then)."""
    from rfrs_ref.experiments.results import parquet_available

    d = _copy(store, tmp_path)
    if table.endswith(".csv"):
        (d / "results.parquet").unlink(missing_ok=True)  # the CSV form is the one read
    elif not parquet_available():
        pytest.skip("pyarrow reads results.parquet")
    (d / table).unlink(missing_ok=True)
    os.mkfifo(d / table)
    with _unblocking(d / table) as hung:
        res = CliRunner().invoke(main, [command, str(d)])
    assert not hung, "the command waited on the FIFO"
    if (command, table) == ("verdict", "results.parquet"):
        assert res.exit_code == 0, res.output  # verdict reads the results.csv beside it
        return
    refused(res, f"{d / table}: not a regular file")


def test_a_fifo_in_place_of_a_record_is_refused_by_plot_without_waiting(store, tmp_path, refused):
    """A run's outcome.json as a FIFO: plot waited for ever reading the training curve."""
    from rfrs_ref.experiments.results import Store

    d = _copy(store, tmp_path)
    path = Store(d).outcome_path(pd.read_csv(d / "runs.csv")["key"].iloc[0])
    path.unlink()
    os.mkfifo(path)
    with _unblocking(path) as hung:
        res = CliRunner().invoke(main, ["plot", str(d), "--figure", "10", "--out",
                                        str(tmp_path / "fig")])
    assert not hung, "plot waited on the FIFO"
    refused(res, str(path), "not a regular file")


@pytest.mark.parametrize("named", ["directory", "results.csv"])
def test_plot_refuses_a_record_linked_from_outside(store, tmp_path, refused, named):
    """runs/<key>/outcome.json as a link to a file outside the results directory: plot drew
    that file's curve as the run's (verdict and ranking refused the link). Named as the
    directory, plot refuses the link as they do; named by its table, the record is refused
    where it is read."""
    import json

    from rfrs_ref.experiments.results import Store

    d = _copy(store, tmp_path)
    path = Store(d).outcome_path(pd.read_csv(d / "runs.csv")["key"].iloc[0])
    record = json.loads(path.read_text())
    record["history"][-1]["precision@5"] = 0.75  # what must never be drawn as this run's
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(record))
    path.unlink()
    path.symlink_to(outside)
    target = d if named == "directory" else d / "results.csv"
    res = CliRunner().invoke(main, ["plot", str(target), "--figure", "10", "--out",
                                    str(tmp_path / "fig")])
    refused(res, str(path), "link", str(outside))
    if named == "directory":  # refused before anything is drawn
        assert not (tmp_path / "fig").exists() or not any((tmp_path / "fig").iterdir())


@pytest.mark.parametrize("name", ["outcome.json", "round_summary.json"])
@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_runs_files_are_read_only_as_its_own_regular_files(store, tmp_path, name, kind):
    """The shared reader of a run's files (its record, its per-round summary) refuses a
    link (outside the directory or not) and a FIFO, in one line naming the file."""
    from rfrs_ref.experiments.results import ROUNDS_FILE, Store, read_rounds

    d = _copy(store, tmp_path)
    key = pd.read_csv(d / "runs.csv")["key"].iloc[0]
    run = Store(d).run_dir(key)
    path = run / name
    if not path.exists():
        assert name == ROUNDS_FILE
        path.write_text('[{"round": 1}]')
    moved = tmp_path / f"elsewhere-{name}"
    shutil.move(path, moved)
    if kind == "link":
        path.symlink_to(moved)
    else:
        os.mkfifo(path)
    with _unblocking(path) as hung, pytest.raises(ValueError) as err:
        read_rounds(run)
    assert not hung
    message = str(err.value)
    assert str(path) in message and "\n" not in message
    assert ("a link (to" if kind == "link" else "not a regular file") in message
