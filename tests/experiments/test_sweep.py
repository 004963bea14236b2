"""Sweeps on Dask: a quick Fig. 4 on a LocalCluster, failures, resume after SIGKILL, plots."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest

from rfrs_ref.experiments.figures import Scale, figure, reproduce
from rfrs_ref.experiments.results import METRICS, Store, read_table
from rfrs_ref.experiments.spec import RunSpec, load_sweep
from rfrs_ref.experiments.sweep import plan_workers, run_sweep

pytest.importorskip("distributed")

VALUE_COLUMNS = ["key", "k", "metric", "value", "status", "dataset", "alpha", "seed",
                 "label_series"]


def _values(df):
    cols = [c for c in VALUE_COLUMNS if c in df.columns]
    return df[cols].sort_values(["key", "k", "metric"]).reset_index(drop=True)


def test_quick_fig4_on_a_local_cluster_with_two_workers(ex, tmp_path):
    scale = Scale(quick=True, datasets=("synthetic",), rounds=3, trials=2,
                  overrides={"dataset_params": ex.TINY_DATA, "client_fraction": 0.1})
    out = tmp_path / "defenses"
    report, paths = reproduce(figure("4"), scale, out, workers=2)
    assert report.workers == 2
    assert (report.total, report.finished, report.failed, report.skipped) == (30, 30, 0, 0)
    table = read_table(out / "results.parquet")
    assert len(table) == 30 * 5 * len(METRICS)
    assert set(table["status"]) == {"ok"}
    assert set(table["label_series"]) == {"No defense", "Krum", "RFA", "Trmean", "A-RFRS"}
    assert sorted(table["alpha"].unique()) == [0.2, 0.3, 0.4]
    assert table["worker"].nunique() == 2  # both worker processes ran runs
    assert len(read_table(out / "results.csv")) == len(table)
    summary = pd.read_csv(out / "summary.csv")
    # a row per configuration (5 series × 3 fractions), K and metric; the popularity
    # ranking's once per fraction, whatever the series
    popularity = summary["metric"].str.startswith("popularity_")
    n_pop = sum(m.startswith("popularity_") for m in METRICS)
    assert len(summary[~popularity]) == 15 * 5 * (len(METRICS) - n_pop)
    assert len(summary[popularity]) == 3 * 5 * n_pop and set(summary["n"]) == {2}
    assert set(summary.loc[popularity, "method"]) == {"popularity"}
    assert "A-RFRS" in (out / "summary.md").read_text()
    names = {p.name for p in paths}
    assert {"fig4.png", "fig4.pdf", "fig4_curves.png", "fig4_curves.pdf"} <= names
    for p in paths:
        if p.suffix == ".png":
            ex.assert_image_not_blank(p)
        else:
            ex.assert_pdf(p)
    # the same command again finds everything done
    again, _ = reproduce(figure("4"), scale, out, workers=2, plot=False)
    assert (again.skipped, again.finished, again.failed) == (30, 0, 0)
    pd.testing.assert_frame_equal(_values(again.table), _values(table))


def test_a_run_that_raises_is_recorded_and_the_others_go_on(ex, tmp_path):
    good = [RunSpec(ex.tiny_config(seed=s), labels={"series": "ok"}) for s in range(3)]
    # fails when its data are generated (a K above the items is refused before any run)
    bad = RunSpec(ex.tiny_config(dataset_params={**ex.TINY_DATA, "n_items": 1}, ks=(1,)),
                  labels={"series": "bad"})
    runs = good[:2] + [bad] + good[2:]
    report = run_sweep(runs, tmp_path, workers=2)
    assert (report.finished, report.failed) == (3, 1)
    failed = report.table[report.table["status"] == "failed"]
    assert len(failed) == 1
    assert failed["key"].iloc[0] == bad.key
    assert "n_items" in failed["error"].iloc[0] and "Traceback" in failed["traceback"].iloc[0]
    outcome = Store(tmp_path).read_outcome(bad.key)
    assert outcome["status"] == "failed" and "ValueError" in outcome["error"]
    # the finished runs are skipped; the failed one is tried again unless told otherwise
    kept = run_sweep(runs, tmp_path, workers=0, retry_failed=False)
    assert (kept.pending, kept.skipped, kept.kept_failed, kept.no_result) == (0, 4, 1, 0)
    again = run_sweep(runs, tmp_path, workers=0)
    assert (again.skipped, again.finished, again.failed) == (3, 0, 1)


def test_invalid_configurations_stop_the_sweep_before_it_starts(ex, tmp_path):
    # built past make_config, which refuses the name itself: run_sweep checks on its own
    bogus = dataclasses.replace(ex.tiny_config(), optimizer="bogus")
    runs = [RunSpec(ex.tiny_config()), RunSpec(bogus)]
    with pytest.raises(ValueError, match="run 1 .*bogus"):
        run_sweep(runs, tmp_path, workers=0)
    assert not (tmp_path / "runs").exists()


SPEC = textwrap.dedent('''
    name = "killed"
    trials = 2

    [base]
    dataset = "synthetic"
    dataset_params = { n_users = 200, n_items = 100, mean_items = 12.0 }
    client_fraction = 0.1
    rounds = 200
    eval_every = 50
    checkpoint_every = 10
    attack = "ascent"

    [axes]
    byzantine_fraction = [0.2, 0.4]
    preset = ["no-defense", "krum", "a-rfrs"]
''')


def _finished(out) -> dict[str, bytes]:
    found = {}
    for p in (out / "runs").glob("*/outcome.json"):
        try:
            data = p.read_bytes()
            if json.loads(data).get("status") == "ok":
                found[p.parent.name] = data
        except (OSError, ValueError):
            pass
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_resume_after_sigkill_skips_finished_runs_and_gives_the_same_table(tmp_path):
    spec_path = tmp_path / "killed.toml"
    spec_path.write_text(SPEC)
    runs = list(load_sweep(spec_path).runs)
    assert len(runs) == 12
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "rfrs_ref.cli.main", "sweep", str(spec_path), "--out", str(out),
         "--workers", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while len(_finished(out)) < 3:
            if proc.poll() is not None:
                pytest.fail(f"the sweep ended before it could be killed: {proc.stderr.read()!r}")
            if time.monotonic() > deadline:
                pytest.fail("no 3 runs finished within 240 s")
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # the workers go with the sweep that started them
        deadline = time.monotonic() + 60
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _group_alive(proc.pid), "worker processes survived the killed sweep"
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stderr.close()
    before = _finished(out)
    assert 3 <= len(before) < len(runs), "kill the sweep while runs are still going"
    assert (out / ".lock").exists()  # left behind by the killed sweep; taken over below

    report = run_sweep(runs, out, workers=2)
    assert report.skipped == len(before)
    assert report.finished == len(runs) - len(before) and report.failed == 0
    after = _finished(out)
    for key, data in before.items():
        assert after[key] == data, f"finished run {key} was touched"

    # single-threaded workers, as in the sweep: Numba's thread pool on a busy machine only slows
    # runs this small down
    reference = run_sweep(runs, tmp_path / "reference", workers=2, threads=1)
    assert reference.finished == len(runs)
    pd.testing.assert_frame_equal(_values(report.table), _values(reference.table))


def test_plots_of_a_recorded_sweep_pca_and_resilience(ex, tmp_path):
    from click.testing import CliRunner

    from rfrs_ref.cli.experiments import plot

    # Fig. 1 from a capture run, through the command line
    scale = Scale(datasets=("synthetic",), overrides={"dataset_params": {"n_users": 150,
                                                                         "n_items": 200}})
    report, paths = reproduce(figure("1"), scale, tmp_path / "pca", workers=0)
    assert report.finished == 2 and [p.name for p in paths] == ["fig1.png", "fig1.pdf"]
    res = CliRunner().invoke(plot, [str(tmp_path / "pca"), "--figure", "pca", "--out",
                                    str(tmp_path / "pca-plots")])
    assert res.exit_code == 0, res.output
    ex.assert_image_not_blank(tmp_path / "pca-plots" / "fig1.png")
    ex.assert_pdf(tmp_path / "pca-plots" / "fig1.pdf")

    # resilience curves when the runs recorded them
    scale = Scale(quick=True, datasets=("synthetic",), rounds=3, trials=1, resilience=True,
                  overrides={"dataset_params": ex.TINY_DATA, "client_fraction": 0.1})
    report, paths = reproduce(figure("11"), scale, tmp_path / "momentum", workers=0)
    assert report.failed == 0
    names = {p.name for p in paths}
    assert {"fig11.png", "fig11_curves.png", "fig11_resilience.png"} <= names
    for p in paths:
        if p.suffix == ".png":
            ex.assert_image_not_blank(p)
    # and from the CSV table, through the command line
    res = CliRunner().invoke(plot, [str(tmp_path / "momentum" / "results.csv"), "--figure", "11"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "momentum" / "figures" / "fig11_resilience.pdf").exists()


def test_plot_says_what_is_missing(tmp_path):
    from click.testing import CliRunner

    from rfrs_ref.cli.experiments import plot

    res = CliRunner().invoke(plot, [str(tmp_path), "--figure", "4"])
    assert res.exit_code != 0 and "no results table" in res.output
    res = CliRunner().invoke(plot, [str(tmp_path), "--figure", "99"])
    assert res.exit_code != 0 and "unknown figure" in res.output


def test_default_workers_follow_cores_and_memory(ex):
    runs = [RunSpec(ex.tiny_config(seed=s)) for s in range(5)]
    assert plan_workers(runs, cores=4, memory=10**12) == 4
    assert plan_workers(runs[:1], cores=4, memory=10**12) == 1
    assert plan_workers(runs, cores=4, memory=1) == 1
    big = [RunSpec(figure("4").runs()[0].config)]  # a full-size run of the first dataset
    from rfrs_ref.experiments.sweep import estimate_run_memory

    need = estimate_run_memory(big[0])
    assert plan_workers(big * 4, cores=4, memory=int(2.5 * need / 0.8)) == 2


def test_an_existing_cluster_without_shared_files(ex, tmp_path):
    """--scheduler ADDRESS: workers train in their own temporary directories and send back
    what the tables need; the driver writes the run's small files."""
    from distributed import LocalCluster

    runs = [RunSpec(ex.tiny_config(seed=s), labels={"series": "x"}) for s in range(2)]
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None, env={"NUMBA_NUM_THREADS": "1"}) as cluster:
        report = run_sweep(runs, tmp_path, scheduler=cluster.scheduler_address)
    assert (report.finished, report.failed, report.workers) == (2, 0, 1)
    for r in runs:
        d = tmp_path / "runs" / r.key
        assert {"outcome.json", "config.json", "metrics.csv", "final_metrics.json"} <= \
            {p.name for p in d.iterdir()}
        assert not (d / "rounds.jsonl").exists()  # the outcome carried the per-round summary
        assert "rounds" not in json.loads((d / "outcome.json").read_text())
        assert len(Store(tmp_path).read_rounds(r.key)) == 4
    reference = run_sweep(runs, tmp_path / "ref", workers=0, threads=1)
    pd.testing.assert_frame_equal(_values(report.table), _values(reference.table))


def test_a_low_memory_sweep_gives_the_same_results(ex, tmp_path, monkeypatch):
    """``run_sweep(low_memory=True)`` reaches the workers' trainers: the robust run holds
    its uploads a batch at a time (checked through the buffers its rounds are given, on
    full rows or on the columns where clients differ) and its results are the same."""
    from rfrs_ref.federated import round as rnd

    seen = []

    def spy(inner):
        def batched(fed, state, rd, buf, *args, **kw):
            seen.append(buf.uploads["theta"].shape[0] < rd.clients.size)
            return inner(fed, state, rd, buf, *args, **kw)
        return batched

    for name in ("_recomputed_round", "_shared_rows_compared_round"):
        monkeypatch.setattr(rnd, name, spy(getattr(rnd, name)))
    runs = [ex.tiny_config(defense="krum", attack="ascent", byzantine_fraction=0.2,
                           client_fraction=0.2)]
    plain = run_sweep(runs, tmp_path / "plain", workers=0)
    assert not any(seen)
    seen.clear()
    low = run_sweep(runs, tmp_path / "low", workers=0, low_memory=True)
    assert seen and all(seen)
    a, b = (read_table(d / "results.csv") for d in (tmp_path / "plain", tmp_path / "low"))
    cols = ["dataset", "seed", "metric", "k", "value"]
    assert a[cols].equals(b[cols]) and plain.finished == low.finished == 1


def test_low_memory_estimates_and_worker_plans(ex):
    """With low memory a Krum run counts the features of n clients and batches of 16, so
    more workers fit; a rule that still holds every upload counts as before."""
    from rfrs_ref.experiments.sweep import estimate_run_memory

    big = dict(dataset_params={"n_users": 2000, "n_items": 4000, "mean_items": 12.0},
               client_fraction=0.05)  # 100 clients a round
    krum = RunSpec(config=ex.tiny_config(defense="krum", attack="ascent",
                                         byzantine_fraction=0.2, **big))
    trmean = RunSpec(config=ex.tiny_config(defense="trmean", **big))
    # a Krum run holds the columns where its clients differ (rounds on shared rows), and
    # with low memory the features and batches of 16: each less than a run holding all
    assert estimate_run_memory(krum, True) < estimate_run_memory(krum)
    held = RunSpec(config=ex.tiny_config(defense="caf", attack="ascent",
                                         byzantine_fraction=0.2, **big))
    assert estimate_run_memory(krum, True) < 0.6 * estimate_run_memory(held)
    assert estimate_run_memory(trmean, True) == estimate_run_memory(trmean)
    noise = RunSpec(config=ex.tiny_config(defense="krum", attack="noise",
                                          byzantine_fraction=0.2, **big))
    assert estimate_run_memory(noise, True) == estimate_run_memory(noise)
    memory = int(2.5 * estimate_run_memory(held) / 0.8)
    assert plan_workers([held] * 8, cores=8, memory=memory) == 2
    assert plan_workers([krum] * 8, cores=8, memory=memory) >= 3
    assert plan_workers([krum] * 8, cores=8, memory=memory, low_memory=True) >= 4



def test_a_resilience_sum_that_is_not_finite_is_a_gap_and_said(ex, tmp_path):
    """A trial whose sum turns NaN (a null term) used to vanish into the mean of the
    others (nanmean); the series' line now stops there, and the panel and the output
    say which series, how many trials and from which round."""
    import json

    from click.testing import CliRunner

    from rfrs_ref.cli.main import main

    scale = Scale(quick=True, datasets=("synthetic",), rounds=3, trials=2, resilience=True,
                  overrides={"dataset_params": ex.TINY_DATA, "client_fraction": 0.1})
    report, _ = reproduce(figure("11"), scale, tmp_path / "momentum", workers=0, plot=False)
    assert report.failed == 0
    out = sorted((tmp_path / "momentum" / "runs").glob("*/outcome.json"))[0]
    record = json.loads(out.read_text())
    assert record["rounds"][1]["resilience"]
    term = next(iter(record["rounds"][1]["resilience"]))
    record["rounds"][1]["resilience"][term] = None
    out.write_text(json.dumps(record))
    res = CliRunner().invoke(main, ["plot", str(tmp_path / "momentum"), "--figure", "11",
                                    "--out", str(tmp_path / "figs")])
    assert res.exit_code == 0, res.output
    assert "non-finite sums" in res.stderr and "1/2 from round 2" in res.stderr, res.stderr


def test_memory_estimates_of_rounds_on_shared_rows(ex):
    """A Krum, A-RFRS or RFA run whose rounds compute the shared rows once counts its
    buffers on the columns where clients differ (P and the owned Q rows): less than a
    run holding every row, and no less than the buffers its trainer allocates."""
    from rfrs_ref.experiments.sweep import estimate_run_memory
    from rfrs_ref.federated.round import rounds_compare_shared_rows
    from rfrs_ref.federated.trainer import Trainer

    big = dict(dataset_params={"n_users": 2000, "n_items": 4000, "mean_items": 12.0},
               client_fraction=0.05, attack="ascent", byzantine_fraction=0.2)
    for rule, shared in (("krum", True), ("rfa", True), ("trmean", True), ("bulyan", True),
                         ("caf", False)):
        assert rounds_compare_shared_rows(ex.tiny_config(defense=rule, **big)) is shared, rule
    krum = ex.tiny_config(defense="krum", **big)
    held = ex.tiny_config(defense="caf", **big)
    assert estimate_run_memory(RunSpec(krum)) < 0.8 * estimate_run_memory(RunSpec(held))
    trainer = Trainer(krum)
    buf = trainer.buffers()
    assert buf.compact
    D, items, a = trainer.model.n_params(), 4000, len(trainer.optimizer.arrays)
    fixed = 3 * a * D * 8 + 1024 * items * 8 + 300e6
    assert estimate_run_memory(RunSpec(krum)) - fixed >= buf.nbytes
    # in low memory: the features of n clients and the uploads of 16 on those columns
    low = Trainer(krum, low_memory=True).buffers()
    assert low.compact and low.uploads["theta"].shape[0] == 16 < low.features.shape[0]
    assert buf.nbytes > estimate_run_memory(RunSpec(krum), True) - fixed >= low.nbytes


def test_memory_estimates_of_coordinatewise_rounds_without_feature_rows(ex):
    """The trimmed mean and Krum on parameters hold no feature rows on shared rows
    (``rounds_derive_features``): the estimate is one n × |C| array below that of the
    same rule on AdaGrad's recovered gradients (which read two arrays, and are held),
    still no less than the buffers its trainer allocates; in low memory Krum holds the
    features of every client instead of the uploads. Adam's recovered gradients (one
    array) are derived too."""
    from rfrs_ref.experiments.sweep import estimate_run_memory
    from rfrs_ref.federated.round import rounds_derive_features
    from rfrs_ref.federated.trainer import Trainer

    big = dict(dataset_params={"n_users": 2000, "n_items": 4000, "mean_items": 12.0},
               client_fraction=0.05, attack="ascent", byzantine_fraction=0.2,
               optimizer="adagrad")
    trmean = ex.tiny_config(defense="trmean", detect="parameter", **big)
    krum = ex.tiny_config(defense="krum", detect="parameter", **big)
    on_gradients = ex.tiny_config(defense="trmean", detect="gradient", **big)
    assert rounds_derive_features(trmean) and rounds_derive_features(krum)
    assert not rounds_derive_features(on_gradients)
    adam = ex.tiny_config(defense="trmean", detect="gradient", **{**big, "optimizer": "adam"})
    assert rounds_derive_features(adam) and Trainer(adam).buffers().features is None
    assert Trainer(krum, low_memory=True).buffers().features is not None
    trainer = Trainer(trmean)
    buf = trainer.buffers()
    assert buf.compact and buf.features is None
    assert Trainer(krum).buffers().features is None
    n, cols = buf.uploads["theta"].shape
    s = buf.dtype.itemsize
    D = trainer.model.n_params()
    # one n × |C| array (the estimate's |C| counts every interaction, the buffers the
    # training split's: no fewer columns)
    saved = estimate_run_memory(RunSpec(on_gradients)) - estimate_run_memory(RunSpec(trmean))
    assert n * cols * s <= saved < n * D * s
    assert estimate_run_memory(RunSpec(trmean)) == estimate_run_memory(RunSpec(krum))
    items, a = 4000, len(trainer.optimizer.arrays)
    fixed = 3 * a * D * 8 + 1024 * items * 8 + 300e6
    assert estimate_run_memory(RunSpec(trmean)) - fixed >= buf.nbytes
