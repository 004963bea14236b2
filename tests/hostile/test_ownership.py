"""A run directory has one owner: no command reads, removes or writes in a directory that
another live process owns, and no command deletes or overwrites a file it did not write.

The attacks: a sweep worker on a run directory a `train --resume` holds, a stale lock
naming a dead process or another host, a user's directory (with a `.lock` of its own, an
`ids.npz`, a `valid_metrics.csv`) given as `--out`, `mechanism` and `plot` writing into a
directory a run or a sweep owns.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main
from rfrs_ref.files import LOCK_NAME

SMALL = ["--dataset", "synthetic", "--synthetic-users", "100", "--synthetic-items", "120",
         "--client-fraction", "0.1", "--backend", "numpy"]
HOLD = ("import sys, time; from rfrs_ref.files import DirectoryLock; "
        "DirectoryLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)")


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


class Holder:
    """Another live process holding ``directory``'s lock (as a `train` working there would)."""

    def __init__(self, directory) -> None:
        self.proc = subprocess.Popen([sys.executable, "-P", "-c", HOLD, str(directory)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"
        self.pid = self.proc.pid

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)  # as a crash would: no clean-up
        self.proc.wait()
        self.proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()


def files(directory):
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != LOCK_NAME}


# -- a sweep worker and another process on one run directory ----------------------------------
def test_a_sweep_never_clears_a_run_directory_another_process_holds(tmp_path, tiny_sweep):
    from rfrs_ref.experiments.spec import load_sweep
    from rfrs_ref.experiments.sweep import run_sweep

    spec = tmp_path / "s.toml"
    spec.write_text(tiny_sweep)
    runs = load_sweep(spec).runs
    out = tmp_path / "out"
    run_dir = out / "runs" / runs[0].key
    run_dir.mkdir(parents=True)
    (run_dir / "notes.txt").write_text("the holder's file\n")
    with Holder(run_dir) as holder:
        # the worker once removed the whole directory (the holder's files and its lock) and
        # trained there while the holder still ran
        report = run_sweep(runs, out, workers=0)
        assert report.failed == 1 and report.finished == 0
        assert "in use by process" in report.failures[0][1]
        assert f"process {holder.pid} " in report.failures[0][1]
        assert (run_dir / "notes.txt").read_text() == "the holder's file\n"
        assert f"process {holder.pid} " in (run_dir / LOCK_NAME).read_text()
        assert not (run_dir / "config.json").exists()
    # the holder gone, the next call runs it (a failed run is retried)
    report = run_sweep(runs, out, workers=0)
    assert report.finished == 1 and report.failed == 0
    assert not (run_dir / LOCK_NAME).exists()


def test_a_capture_run_never_writes_into_a_run_directory_another_process_holds(tmp_path):
    # a sweep worker takes its run directory's lock before touching it, but a capture run
    # (Fig. 1) took none: it wrote config.json, final_metrics.json, capture.json and
    # capture.npz into a directory another process held, and was recorded as finished
    from rfrs_ref.experiments.spec import RunSpec, make_config
    from rfrs_ref.experiments.worker import execute_run

    spec = RunSpec(make_config({"dataset": "synthetic", "client_fraction": 0.2, "rounds": 2,
                                "dataset_params": {"n_users": 60, "n_items": 40,
                                                   "mean_items": 8.0},
                                "model": "fmf", "attack": "ascent",
                                "byzantine_fraction": 0.4, "backend": "numpy"}),
                   kind="capture")
    run_dir = tmp_path / "runs" / spec.key
    run_dir.mkdir(parents=True)
    (run_dir / "notes.txt").write_text("the holder's file\n")
    task = {"spec": spec.to_json(), "key": spec.key, "run_dir": str(run_dir),
            "data_dir": None, "keep_state": False}
    with Holder(run_dir) as holder:
        out = execute_run(task)
        assert out["status"] == "failed" and f"process {holder.pid} " in out["error"]
        assert files(run_dir) == {"notes.txt": b"the holder's file\n"}
    out = execute_run(task)  # the holder gone, it runs
    assert out["status"] == "ok", out["traceback"]
    assert (run_dir / "capture.npz").exists() and not (run_dir / LOCK_NAME).exists()


def test_a_sweep_never_records_an_outcome_into_a_run_directory_another_process_took(tmp_path):
    """The worker releases its run directory when it has trained, and the sweep's parent
    writes the record after: a `train --resume` that took the directory in between had
    outcome.json, round_summary.json and the returned files written beside its own."""
    from rfrs_ref.experiments.results import OUTCOME, Store
    from rfrs_ref.experiments.spec import RunSpec, make_config

    spec = RunSpec(make_config({"dataset": "synthetic", "rounds": 2, "backend": "numpy"}))
    store = Store(tmp_path)
    run_dir = store.run_dir(spec.key)
    run_dir.mkdir(parents=True)
    (run_dir / "notes.txt").write_text("the holder's file\n")
    outcome = {"status": "ok", "final": {"precision@5": 0.1}, "wall_s": 1.0,
               "files": {"config.json": "{}\n"}, "rounds": [{"round": 1, "kept": 1.0}]}
    with Holder(run_dir) as holder:
        record = store.write_outcome(spec, outcome)
        assert record["status"] == "failed" and f"process {holder.pid} " in record["error"], record
        assert "not recorded" in record["error"] and record["key"] == spec.key
        assert files(run_dir) == {"notes.txt": b"the holder's file\n"}
    record = store.write_outcome(spec, outcome)  # the holder gone, it is recorded
    assert record["status"] == "ok" and (run_dir / OUTCOME).exists()
    assert not (run_dir / LOCK_NAME).exists()


# -- stale locks ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["process 1 on another-host\n", "process 999999 on vm\n", ""])
def test_a_lock_file_no_live_process_holds_is_taken_over(tmp_path, text):
    # no pid or host in the file is trusted: only a live flock holds a directory (a pid
    # reused by an unrelated process, a host that crashed, an empty file)
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).write_text(text)
    res = invoke("train", *SMALL, "--rounds", 1, "--out", out)
    assert res.exit_code == 0, res.output
    assert not (out / LOCK_NAME).exists()


# -- a user's directory as --out -----------------------------------------------------------------
def test_a_users_files_beside_a_run_are_left_as_they_are(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes\n")
    (out / "data").mkdir()
    (out / "data" / "ratings.csv").write_text("1,2,5\n")
    before = files(out)
    res = invoke("train", *SMALL, "--rounds", 1, "--out", out)
    assert res.exit_code == 0, res.output
    after = files(out)
    assert {k: after[k] for k in before} == before


@pytest.mark.parametrize("name", ["ids.npz", "valid_metrics.csv"])
def test_a_users_file_named_like_a_run_file_is_never_overwritten(tmp_path, name, refused):
    # a run once wrote its ids.npz over the user's, and appended its validation rows to a
    # valid_metrics.csv of the user's: neither name was among the files prepare() checks
    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_bytes(b"the user's own\n")
    before = files(out)
    refused(invoke("train", *SMALL, "--rounds", 1, "--valid-fraction", 0.2, "--out", out),
              out, name, "another run directory")
    assert files(out) == before


def test_a_link_planted_at_a_run_file_is_not_followed(tmp_path, refused):
    # a dangling link metrics.csv -> elsewhere: open("w") in start() would create its target
    out = tmp_path / "run"
    out.mkdir()
    target = tmp_path / "elsewhere.csv"
    (out / "metrics.csv").symlink_to(target)
    refused(invoke("train", *SMALL, "--rounds", 1, "--out", out), out, "metrics.csv")
    assert not target.exists()


def test_a_lock_file_of_someone_else_is_never_truncated_or_removed(tmp_path, refused):
    out = tmp_path / "mine"
    out.mkdir()
    (out / LOCK_NAME).write_text("{\"owner\": \"another tool\", \"since\": 1700000000}\n")
    before = (out / LOCK_NAME).read_bytes()
    refused(invoke("train", *SMALL, "--rounds", 1, "--out", out),
              out / LOCK_NAME, "not a lock file of rfrs-ref", "move it away")
    assert (out / LOCK_NAME).read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]


def test_out_as_a_link_to_a_directory_runs_there(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    res = invoke("train", *SMALL, "--rounds", 1, "--out", link)
    assert res.exit_code == 0, res.output
    assert (target / "final_metrics.json").exists() and link.is_symlink()


def test_out_as_a_dangling_link_is_one_line(tmp_path, refused):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere", target_is_directory=True)
    refused(invoke("train", *SMALL, "--rounds", 1, "--out", link), "--out")
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()


# -- mechanism and plot into a directory another process owns -------------------------------------
MECHANISM = ["mechanism", "4", "--dataset", "synthetic", "--alpha", "0.4", "--rounds", "2",
             "--series", "No defense", "--set", "client_fraction=0.2", "--set",
             'dataset_params={"n_users": 60, "n_items": 40, "mean_items": 8.0}',
             "--set", "backend=numpy"]


def test_mechanism_does_not_write_into_a_directory_a_run_owns(tmp_path, refused):
    out = tmp_path / "run"
    out.mkdir()
    with Holder(out) as holder:
        refused(invoke(*MECHANISM, "--out", out), out, f"process {holder.pid} ")
        assert files(out) == {}
    res = invoke(*MECHANISM, "--out", out)
    assert res.exit_code == 0, res.output
    assert not (out / LOCK_NAME).exists()


@pytest.fixture(scope="module")
def tiny_results(finished_sweep, tmp_path_factory):
    """A copy of the finished 2-trial sweep's results, for this module (plots write into it)."""
    d = tmp_path_factory.mktemp("sweep") / "out"
    shutil.copytree(finished_sweep / "out", d)
    return d


def test_plot_does_not_write_into_a_directory_another_process_owns(tiny_results, tmp_path, refused):
    out = tmp_path / "figs"
    out.mkdir()
    with Holder(out) as holder:
        refused(invoke("plot", tiny_results, "--figure", "3", "--out", out), out,
                  f"process {holder.pid} ")
        assert files(out) == {}
    # a sweep owns its results directory, not its figures/ folder: plotting a sweep under
    # way is allowed (the sweep's lock is not in the way)
    with Holder(tiny_results):
        res = invoke("plot", tiny_results, "--figure", "3")
        assert res.exit_code == 0, res.output
    assert (tiny_results / "figures" / "fig3.png").exists()
    assert not (tiny_results / "figures" / LOCK_NAME).exists()


def test_a_sweeps_plot_does_not_write_into_a_directory_another_process_owns(tiny_results, tmp_path,
                                                                          refused):
    """Without --figure (a sweep's panels) the plot took no hold on --out: it wrote sweep.png
    and sweep.pdf into a directory a live run owns, where --figure is refused."""
    out = tmp_path / "figs"
    out.mkdir()
    with Holder(out) as holder:
        refused(invoke("plot", tiny_results, "--out", out), out, f"process {holder.pid} ")
        assert files(out) == {}
    res = invoke("plot", tiny_results, "--out", out)
    assert res.exit_code == 0, res.output
    assert (out / "sweep.png").exists() and not (out / LOCK_NAME).exists()


def test_plot_and_mechanism_never_write_into_a_runs_directory(tiny_results, tmp_path, refused):
    """A finished run's directory took a plot's PNGs and mechanism's tables (nobody held its
    lock), where train, flower, golden export and sweep refuse such an --out: a sweep clears
    a run's directory when the run starts again."""
    run = sorted((tiny_results / "runs").iterdir())[0]
    before = files(run)
    for where in (run, run / "figs"):
        refused(invoke("plot", tiny_results, "--figure", "3", "--out", where), run,
                "is or lies inside the run directory", "nothing was written")
        refused(invoke("plot", tiny_results, "--out", where), run, "is or lies inside the run")
        refused(invoke(*MECHANISM, "--out", where), run, "is or lies inside the run directory")
    assert files(run) == before and not (run / "figs").exists()


def test_plot_and_mechanism_never_write_into_a_results_directorys_runs_folder(tiny_results,
                                                                            refused):
    """--out RESULTS/runs (the folder of the sweep's run directories itself, not one run's)
    was accepted, and the PNGs, PDFs and mechanism's tables went among the run directories,
    which a sweep reads as runs and clears."""
    runs = tiny_results / "runs"
    before = files(runs)
    entries = sorted(p.name for p in runs.iterdir())
    for where in (runs, runs / "figs"):
        refused(invoke("plot", tiny_results, "--figure", "3", "--out", where), where,
                f"is or lies inside {runs}, the runs/ folder of the results directory",
                "nothing was written")
        refused(invoke("plot", tiny_results, "--out", where), "the runs/ folder")
        refused(invoke(*MECHANISM, "--out", where), "the runs/ folder", "nothing was written")
    assert files(runs) == before and sorted(p.name for p in runs.iterdir()) == entries


def test_a_run_cannot_start_in_a_directory_a_plot_is_writing(tmp_path, refused):
    from rfrs_ref.files import DirectoryLock

    out = tmp_path / "figs"
    with DirectoryLock(out, shared=True):  # as `plot` or `mechanism` holds it
        refused(invoke("train", *SMALL, "--rounds", 1, "--out", out), out, "in use")
        assert files(out) == {}


# -- --resume of a directory whose files are links out of it --------------------------------------
def test_resume_never_writes_through_a_link_out_of_the_run_directory(tmp_path):
    # the tables are rewritten by rename (truncated to the checkpoint) before anything is
    # appended, so a link planted at metrics.csv or rounds.jsonl is replaced, not followed
    run = tmp_path / "run"
    res = invoke("train", *SMALL, "--rounds", 4, "--eval-every", 2, "--checkpoint-every", 2,
                 "--out", run)
    assert res.exit_code == 0, res.output
    for name in ("final_metrics.json", "state.npz"):
        (run / name).unlink()
    import numpy as np

    with np.load(run / "checkpoint.npz") as z:
        arrays = {k: z[k] for k in z.files}
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("metrics.csv", "rounds.jsonl"):
        shutil.copyfile(run / name, outside / name)
        (run / name).unlink()
        (run / name).symlink_to(outside / name)
    np.savez(outside / "checkpoint.npz", **arrays)
    (run / "checkpoint.npz").unlink()
    (run / "checkpoint.npz").symlink_to(outside / "checkpoint.npz")
    before = files(outside)
    res = invoke("train", "--resume", run)
    assert res.exit_code == 0, res.output
    assert files(outside) == before
    assert not any((run / n).is_symlink() for n in ("metrics.csv", "rounds.jsonl"))


# -- --resume of a run another version started ----------------------------------------------------
def _interrupted_run(tmp_path, cut_back):
    """A 4-round run cut off after its round-2 checkpoint (the rounds after it dropped)."""
    import json

    run = tmp_path / "run"
    res = invoke("train", *SMALL, "--rounds", 4, "--eval-every", 2, "--checkpoint-every", 2,
                 "--out", run)
    assert res.exit_code == 0, res.output
    cut_back(run, 2)
    return run, json.loads((run / "config.json").read_text())


def test_resume_by_another_version_is_said_and_recorded(tmp_path, cut_back):
    # a deliberate decision: a run may be resumed by other code (a patch release), but its
    # numbers after the checkpoint are then that code's; once this was silent, and config.json
    # went on naming only the version that started the run
    import json

    run, record = _interrupted_run(tmp_path, cut_back)
    record["code"] = {"package": "0.0.9", "git_commit": "0" * 40, "git_dirty": False}
    record["versions"]["numpy"] = "1.26.0"
    (run / "config.json").write_text(json.dumps(record, indent=2))
    res = invoke("train", "--resume", run)
    assert res.exit_code == 0, res.output
    assert "note: the run was started by rfrs-ref 0.0.9 (commit 0000000), numpy 1.26.0" \
        in res.output
    assert "may not end bit for bit" in res.output
    after = json.loads((run / "config.json").read_text())
    (entry,) = after["resumed"]
    assert entry["round"] == 2 and entry["then"]["code"]["package"] == "0.0.9"
    assert entry["now"]["versions"]["numpy"] == np_version()
    assert after["code"] == record["code"]  # what started the run is kept as it was


@pytest.mark.parametrize("edit", [{"seed": 9}, {"init_scale": 0.5}, {"test_fraction": 0.3},
                                  {"valid_fraction": 0.2}, {"pre": ["clip"]},
                                  {"optimizer_params": {"lr": 0.05}}])
def test_resume_refuses_a_config_json_edited_since_the_checkpoint(tmp_path, edit, refused,
                                                                cut_back):
    # the checkpoint used to be checked for shapes only: a run resumed with another seed,
    # initialisation, split, validation split, pre-aggregation or learning rate in
    # config.json finished as one run recording the new values (raising `rounds` stays
    # allowed: round t is the same whatever the total). Fields to_json leaves out at their
    # default (valid_fraction 0, no pre) are compared too
    import json

    run, record = _interrupted_run(tmp_path, cut_back)
    key = next(iter(edit))
    original = json.dumps(record, indent=2)
    record["config"].update(edit)
    (run / "config.json").write_text(json.dumps(record, indent=2))
    before = files(run)
    refused(invoke("train", "--resume", run), "checkpoint.npz", "config.json differs", key)
    assert files(run) == before
    (run / "config.json").write_text(original)  # restored, the run continues
    res = invoke("train", "--resume", run)
    assert res.exit_code == 0, res.output


def test_resume_by_code_that_knows_other_configuration_fields_is_allowed(tmp_path, cut_back):
    # another version may add or drop a configuration field: only the fields both know
    # are compared, so a resume across versions is not refused for that alone
    import json

    import numpy as np

    run, _ = _interrupted_run(tmp_path, cut_back)
    with np.load(run / "checkpoint.npz") as z:
        arrays = {k: z[k] for k in z.files}
    trained = json.loads(str(arrays["config"]))
    trained.pop("init_scale")
    trained["a_field_of_another_version"] = 1
    arrays["config"] = np.array(json.dumps(trained))
    np.savez(run / "checkpoint.npz", **arrays)
    res = invoke("train", "--resume", run)
    assert res.exit_code == 0, res.output


def np_version():
    import numpy

    return numpy.__version__


def test_resume_by_the_same_code_changes_no_provenance(tmp_path, cut_back):
    run, record = _interrupted_run(tmp_path, cut_back)
    before = (run / "config.json").read_bytes()
    res = invoke("train", "--resume", run)
    assert res.exit_code == 0, res.output
    assert "note:" not in res.output
    assert (run / "config.json").read_bytes() == before


def test_resume_of_a_finished_sweep_run_never_trains_it_again(tmp_path, tiny_sweep, refused):
    # a sweep removes a finished run's checkpoint (and state): `train --resume runs/<key>`
    # once took that for "stopped before its first checkpoint", trained the run again from
    # round 0 and rewrote its records
    from rfrs_ref.experiments.spec import load_sweep
    from rfrs_ref.experiments.sweep import run_sweep

    spec = tmp_path / "s.toml"
    spec.write_text(tiny_sweep)
    runs = load_sweep(spec).runs
    run_sweep(runs, tmp_path / "out", workers=0)
    run_dir = tmp_path / "out" / "runs" / runs[0].key
    assert not (run_dir / "checkpoint.npz").exists()
    before = files(run_dir)
    refused(invoke("train", "--resume", run_dir), run_dir, "finished run",
              "nothing to resume")
    assert files(run_dir) == before


def test_a_sweep_never_clears_a_directory_its_run_directory_links_to(tmp_path, tiny_sweep, monkeypatch, refused):
    # a run that starts again clears its directory; runs/<key> planted as a link must not
    # make it clear the directory the link points to
    from rfrs_ref.experiments.spec import load_sweep

    spec = tmp_path / "s.toml"
    spec.write_text(tiny_sweep)
    runs = load_sweep(spec).runs
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work\n")
    (tmp_path / "out" / "runs").mkdir(parents=True)
    (tmp_path / "out" / "runs" / runs[0].key).symlink_to(precious, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    res = invoke("sweep", spec, "--out", "out", "--workers", 0)
    refused(res, runs[0].key, "is a link", "nothing was run")
    assert sorted(p.name for p in precious.iterdir()) == ["thesis.tex"]
    # the worker refuses a linked run directory too (the sweep hands it over unresolved)
    from rfrs_ref.experiments.worker import execute_run

    outcome = execute_run({"spec": runs[0].to_json(), "key": runs[0].key,
                           "run_dir": str(tmp_path / "out" / "runs" / runs[0].key)})
    assert outcome["status"] == "failed" and "is a link" in outcome["error"]
    assert sorted(p.name for p in precious.iterdir()) == ["thesis.tex"]


@pytest.mark.parametrize("linked", ["runs", "figures", "runs/other", "results.csv"])
def test_a_sweep_never_writes_through_a_link_in_its_output(tmp_path, tiny_sweep, monkeypatch,
                                                         linked, refused):
    # the check used to look at runs/<key> only: `runs` itself linked to a user's folder
    # holding a directory named like a run had that directory emptied and the run's files
    # written there
    from rfrs_ref.experiments.spec import load_sweep

    spec = tmp_path / "s.toml"
    spec.write_text(tiny_sweep)
    key = load_sweep(spec).runs[0].key
    precious = tmp_path / "precious"
    (precious / key).mkdir(parents=True)
    (precious / key / "thesis.tex").write_text("years of work\n")
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    target = precious / key / "thesis.tex" if linked.endswith(".csv") else precious
    if linked == "runs":
        (out / "runs").rmdir()
    (out / linked).symlink_to(target)
    before = files(precious)
    monkeypatch.chdir(tmp_path)
    refused(invoke("sweep", spec, "--out", "out", "--workers", 0), linked.split("/")[-1],
            "is a link", "nothing was run")
    assert files(precious) == before


def test_a_figure_is_never_written_through_a_link(tiny_results, tmp_path, refused):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "figs"
    out.mkdir()
    (out / "sweep.png").symlink_to(elsewhere / "victim.png")
    refused(invoke("plot", tiny_results, "--out", out), "sweep.png", "is a link")
    assert not list(elsewhere.iterdir())


def test_a_figure_stopped_half_way_leaves_the_previous_one_whole(tiny_results, tmp_path,
                                                                  monkeypatch):
    """A figure was written in place (savefig on the path): a plot stopped half-way (a full
    disk, a kill) left half a PNG over the previous one, and two plots of one figure into
    one folder, which their shared hold allows, interleaved their bytes. Each file is now
    written beside it and renamed over it."""
    import io

    import matplotlib.figure

    out = tmp_path / "figs"
    assert invoke("plot", tiny_results, "--figure", "3", "--out", out).exit_code == 0
    before = files(out)
    assert {"fig3.png", "fig3.pdf"} <= set(before)
    real = matplotlib.figure.Figure.savefig

    def half_then_full_disk(self, fname, **kw):
        buf = io.BytesIO()
        real(self, buf, **{"format": "png", **kw})
        data = buf.getvalue()[:100]
        if hasattr(fname, "write"):
            fname.write(data)
        else:
            with open(fname, "wb") as fh:
                fh.write(data)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", half_then_full_disk)
    res = invoke("plot", tiny_results, "--figure", "3", "--out", out)
    assert res.exit_code != 0
    assert files(out) == before and sorted(p.name for p in out.iterdir()) == sorted(before)
    # said in one line, not a traceback (the OSError used to escape the command)
    assert isinstance(res.exception, SystemExit), res.exception
    assert f"could not write the figures into {out}" in res.output
    assert "No space left on device" in res.output


@pytest.mark.parametrize("figure", [("--figure", "3"), ()])
def test_a_failed_plot_leaves_none_of_the_folders_it_made(tiny_results, tmp_path, monkeypatch,
                                                          figure):
    """`plot --out a/b/figs` made a, a/b and a/b/figs; a plot that then failed removed only
    figs, leaving a/b behind."""
    import matplotlib.figure

    def full_disk(self, fname, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full_disk)
    out = tmp_path / "a" / "b" / "figs"
    res = invoke("plot", tiny_results, *figure, "--out", out)
    assert res.exit_code == 1 and "No space left on device" in res.output, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))
    # a folder that was there is left, with what it holds
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "mine.txt").write_text("x")
    assert invoke("plot", tiny_results, *figure, "--out", out).exit_code == 1
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "mine.txt"]


# -- a user's directory as a sweep's output ----------------------------------------------------
@pytest.mark.parametrize("name, text", [
    ("results.csv", "precious,table\n"),
    ("summary.md", "# My summary\n"),
    ("summary.csv", "a,b\n1,2\n"),
    ("runs.csv", "run,when\n1,today\n"),
    ("provenance.json", "not json\n"),
])
def test_a_sweep_never_overwrites_a_users_table(tmp_path, tiny_sweep, monkeypatch, name, text, refused):
    # the tables were rewritten whatever the directory held: a user's results.csv or
    # summary.md in the directory given as --out was replaced
    spec = tmp_path / "s.toml"
    spec.write_text(tiny_sweep)
    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_text(text)
    (out / "notes.txt").write_text("mine\n")
    before = files(out)
    monkeypatch.chdir(tmp_path)
    refused(invoke("sweep", spec, "--out", out, "--workers", 0), out / name,
              "not written by a sweep", "nothing was run")
    assert files(out) == before and sorted(p.name for p in out.iterdir()) == sorted(before)



class _Unblocking:
    """Records whether a reader waited on the FIFO ``path`` for ``after`` seconds, and then
    opens it for writing and closes it, so that a command that would wait for ever fails its
    test instead of hanging it (``hung`` is then True)."""

    def __init__(self, path, after: float = 10.0) -> None:
        import threading

        self.path, self.after, self.hung = path, after, False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        if self.stop.wait(self.after):
            return
        while not self.stop.is_set():
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader has it open
                self.stop.wait(0.05)
                continue
            self.hung = True
            os.close(fd)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


@pytest.mark.parametrize("name", ["results.csv", "summary.md", "provenance.json"])
def test_a_fifo_at_a_tables_name_is_refused_by_a_sweep_without_waiting(tmp_path, tiny_sweep,
                                                                         monkeypatch, name,
                                                                         refused):
    """A FIFO at the name of a table a sweep rewrites, in the directory given as --out: the
    sweep opened it to read its first line and waited for ever for a writer."""
    import stat

    spec = tmp_path / "s.toml"
    spec.write_text(tiny_sweep)
    out = tmp_path / "mine"
    out.mkdir()
    os.mkfifo(out / name)
    monkeypatch.chdir(tmp_path)
    with _Unblocking(out / name) as watch:
        res = invoke("sweep", spec, "--out", out, "--workers", 0, "--no-plot")
    assert not watch.hung, "the sweep waited on the FIFO"
    refused(res, out / name, "not written by a sweep", "nothing was run")
    assert stat.S_ISFIFO(os.lstat(out / name).st_mode)


@pytest.mark.parametrize("name", ["results.csv", "runs.csv"])
def test_a_fifo_at_a_tables_name_never_hangs_train(tmp_path, name):
    """train --out DIR asks whether DIR is a sweep's results directory by the first line of
    its tables: a FIFO at a table's name made it wait for ever. A FIFO is no sweep's table."""
    import stat

    out = tmp_path / "mine"
    out.mkdir()
    os.mkfifo(out / name)
    with _Unblocking(out / name) as watch:
        res = invoke("train", *SMALL, "--rounds", 1, "--out", out)
    assert not watch.hung, "train waited on the FIFO"
    assert res.exit_code == 0, res.output
    assert stat.S_ISFIFO(os.lstat(out / name).st_mode)

def test_a_fifo_at_the_provenance_of_a_store_never_hangs_a_sweep(tmp_path, tiny_sweep,
                                                                 monkeypatch):
    """A store's provenance.json as a FIFO: the sweep ran its runs and then waited for ever
    reading it, to append its call."""
    import json

    spec = tmp_path / "s.toml"
    spec.write_text("trials = 2\n" + tiny_sweep)
    out = tmp_path / "src"
    monkeypatch.chdir(tmp_path)
    assert invoke("sweep", spec, "--out", out, "--workers", 0, "--no-plot").exit_code == 0
    shutil.rmtree(sorted((out / "runs").iterdir())[0])  # one run to run again
    (out / "provenance.json").unlink()
    os.mkfifo(out / "provenance.json")
    with _Unblocking(out / "provenance.json") as watch:
        res = invoke("sweep", spec, "--out", out, "--workers", 0, "--no-plot")
    assert not watch.hung, "the sweep waited on the FIFO"
    assert res.exit_code == 0, res.output
    calls = json.loads((out / "provenance.json").read_text())["calls"]
    assert [c["runs"]["finished"] for c in calls] == [1]

@pytest.mark.parametrize("stray", ["notes.txt", "mystuff/data.csv", "0123456789abcdef.txt"])
@pytest.mark.parametrize("table", [None, "results.csv"])
def test_a_sweep_never_adopts_a_users_runs_folder(tmp_path, tiny_sweep, monkeypatch, stray,
                                                  table, refused):
    # a directory holding runs/ was taken for a store whatever runs/ held: the sweep put its
    # run directories among the user's files there, and rewrote the user's results.csv
    # beside it as its own table
    spec = tmp_path / "s.toml"
    spec.write_text(tiny_sweep)
    out = tmp_path / "mine"
    (out / "runs" / stray).parent.mkdir(parents=True, exist_ok=True)
    (out / "runs" / stray).write_text("mine\n")
    if table:
        (out / table).write_text("precious,table\n")
    before = files(out)
    monkeypatch.chdir(tmp_path)
    culprit = out / table if table else out / "runs" / stray.split("/")[0]
    phrase = "not written by a sweep" if table else "not a run directory of a sweep"
    refused(invoke("sweep", spec, "--out", out, "--workers", 0), culprit, phrase,
            "nothing was run")
    assert files(out) == before
    assert sorted(p.name for p in (out / "runs").iterdir()) == [stray.split("/")[0]]


def test_an_empty_runs_folder_does_not_make_a_users_table_a_sweeps(tmp_path, tiny_sweep,
                                                                   monkeypatch, refused):
    spec = tmp_path / "s.toml"
    spec.write_text(tiny_sweep)
    out = tmp_path / "mine"
    (out / "runs").mkdir(parents=True)
    (out / "summary.md").write_text("# My summary\n")
    monkeypatch.chdir(tmp_path)
    refused(invoke("sweep", spec, "--out", out, "--workers", 0), out / "summary.md",
            "not written by a sweep", "nothing was run")
    assert (out / "summary.md").read_text() == "# My summary\n"
    assert list((out / "runs").iterdir()) == []


def test_a_sweeps_runs_folder_with_a_hidden_file_is_still_its_own(tmp_path, tiny_sweep,
                                                                   monkeypatch):
    # .DS_Store and the like appear in any folder a file browser opened; the sweep never
    # reads or removes them, and its damaged table is still its own to rewrite
    from rfrs_ref.experiments.spec import load_sweep
    from rfrs_ref.experiments.sweep import run_sweep

    spec = tmp_path / "s.toml"
    spec.write_text(tiny_sweep)
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    runs = load_sweep(spec).runs
    assert run_sweep(runs, out, workers=0).finished == 1
    (out / "runs" / ".DS_Store").write_bytes(b"\0\1")
    (out / "results.csv").write_text("damaged\n")
    report = run_sweep(runs, out, workers=0)
    assert report.skipped == 1 and report.finished == 0
    assert (out / "results.csv").read_text().startswith("key,")
    assert (out / "runs" / ".DS_Store").read_bytes() == b"\0\1"


def test_a_sweeps_own_tables_are_rewritten_even_before_any_run(tmp_path, tiny_sweep, monkeypatch):
    # --no-run on a new directory writes (empty) tables and no runs/: they are the sweep's
    spec = tmp_path / "s.toml"
    spec.write_text(tiny_sweep)
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    from rfrs_ref.experiments.spec import load_sweep
    from rfrs_ref.experiments.sweep import run_sweep

    runs = load_sweep(spec).runs
    run_sweep(runs, out, workers=0, run=False)
    assert (out / "results.csv").exists() and not (out / "runs").exists()
    report = run_sweep(runs, out, workers=0)
    assert report.finished == 1


def test_a_plot_that_draws_nothing_leaves_no_folder(tmp_path):
    import pandas as pd

    table = tmp_path / "results.csv"
    pd.DataFrame([{"key": "a", "status": "failed", "metric": None, "k": None,
                   "value": None}]).to_csv(table, index=False)
    res = invoke("plot", table, "--figure", "3")
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert not (tmp_path / "figures").exists()


# -- records handed over by another results directory (--reuse-from) and one's own -------------

def _source(tmp_path, tiny_sweep):
    from rfrs_ref.experiments.spec import load_sweep

    spec = tmp_path / "s.toml"
    spec.write_text(tiny_sweep)
    key = load_sweep(spec).runs[0].key
    assert invoke("sweep", spec, "--out", tmp_path / "src", "--workers", 0, "--no-plot").exit_code == 0
    return spec, key, tmp_path / "src" / "runs" / key / "outcome.json"


def test_a_reused_record_never_writes_files_into_the_run_directory(tmp_path, tiny_sweep):
    import json

    spec, key, path = _source(tmp_path, tiny_sweep)
    record = json.loads(path.read_text())
    record["files"] = {"config.json": '{"evil": 1}', "state.npz": "junk", "..": "x"}
    path.write_text(json.dumps(record))
    res = invoke("sweep", spec, "--out", tmp_path / "d", "--workers", 0, "--no-plot",
                 "--reuse-from", tmp_path / "src")
    assert res.exit_code == 0, res.output
    run = tmp_path / "d" / "runs" / key
    assert sorted(p.name for p in run.iterdir()) == ["outcome.json", "round_summary.json"]
    assert "files" not in json.loads((run / "outcome.json").read_text())


@pytest.mark.parametrize("edit", ["model_list", "no_popularity", "infinite_history",
                                  "metric_out_of_range", "divergence_beyond_the_rounds"])
def test_a_malformed_reused_record_is_run_again_not_copied(tmp_path, tiny_sweep, edit):
    import json

    spec, key, path = _source(tmp_path, tiny_sweep)
    record = json.loads(path.read_text())
    if edit == "model_list":
        record["final"]["model"] = [1, 2]
    elif edit == "no_popularity":
        del record["final"]["popularity"]
    elif edit == "metric_out_of_range":  # finite, but no precision
        record["final"]["model"]["precision@1"] = 7.5
    elif edit == "divergence_beyond_the_rounds":  # once copied, and counted as diverged
        record.update(status="diverged", divergence={"round": 99, "reason": "non-finite scores"})
        del record["final"]
    else:
        record["history"][-1]["precision@1"] = float("inf")
    path.write_text(json.dumps(record))
    res = invoke("sweep", spec, "--out", tmp_path / "d", "--workers", 0, "--no-plot",
                 "--reuse-from", tmp_path / "src")
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "reused_from" not in json.loads((tmp_path / "d" / "runs" / key / "outcome.json").read_text())


@pytest.mark.parametrize("linked", ["runs", "run", "outcome", "rounds"])
def test_a_reused_record_is_never_read_through_a_link(tmp_path, tiny_sweep, linked, refused):
    # --reuse-from src, whose runs/<key> (or runs/, outcome.json, round_summary.json) was a
    # link to another results directory's, copied that directory's record with "../src" as
    # its provenance (reused_from) and exited 0
    import shutil

    spec, key, path = _source(tmp_path, tiny_sweep)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(tmp_path / "src", elsewhere)
    run = tmp_path / "src" / "runs" / key
    run.parent.mkdir(parents=True)
    if linked == "runs":
        run.parent.rmdir()
        link, target = run.parent, elsewhere / "runs"
    elif linked == "run":
        link, target = run, elsewhere / "runs" / key
    else:
        run.mkdir()
        name = "outcome.json" if linked == "outcome" else "round_summary.json"
        for f in ("outcome.json", "round_summary.json"):
            if f != name:
                shutil.copy(elsewhere / "runs" / key / f, run / f)
        link, target = run / name, elsewhere / "runs" / key / name
    link.symlink_to(target)
    res = invoke("sweep", spec, "--out", tmp_path / "d", "--workers", 0, "--no-plot",
                 "--reuse-from", tmp_path / "src")
    refused(res, str(link), "is a link", "--reuse-from", "nothing was run")
    assert not (tmp_path / "d" / "runs").exists()


def test_a_malformed_record_in_the_output_is_one_line_naming_it(tmp_path, tiny_sweep, refused):
    import json

    spec, key, path = _source(tmp_path, tiny_sweep)
    record = json.loads(path.read_text())
    del record["final"]["popularity"]
    path.write_text(json.dumps(record))
    refused(invoke("sweep", spec, "--out", tmp_path / "src", "--workers", 0, "--no-plot"),
            str(path), "not a run record")


def test_a_fifo_in_place_of_a_record_is_no_record(tmp_path, tiny_sweep):
    spec, key, path = _source(tmp_path, tiny_sweep)
    path.unlink()
    os.mkfifo(path)
    from rfrs_ref.experiments.results import Store

    assert Store(tmp_path / "src").read_outcome(key) is None  # returns instead of blocking


@pytest.mark.parametrize("where", ["store_run", "train_run"])
def test_a_sweep_never_writes_inside_a_run_directory(tmp_path, tiny_sweep, where, refused):
    spec, key, _ = _source(tmp_path, tiny_sweep)
    if where == "store_run":
        out = tmp_path / "src" / "runs" / key / "nested"
    else:
        assert invoke("train", *SMALL, "--rounds", 1, "--out", tmp_path / "run").exit_code == 0
        out = tmp_path / "run" / "sweep"
    refused(invoke("sweep", spec, "--out", out, "--workers", 0, "--no-plot"),
            "inside the run directory", "nothing was run")
    assert not out.exists()


@pytest.mark.parametrize("inside", ["runs", "runs/mine"])
def test_neither_a_sweep_nor_a_run_writes_into_a_results_directorys_runs_folder(tmp_path, tiny_sweep,
                                                                              inside, refused):
    """`sweep --out RESULTS/runs` made a results directory inside another's runs/ (whose
    entries that sweep reads as its runs), and `train --out RESULTS/runs/mine` (not a run
    key) a run directory there: both refused before anything is written."""
    spec, _, _ = _source(tmp_path, tiny_sweep)
    out = tmp_path / "src" / inside
    before = sorted(p.name for p in (tmp_path / "src" / "runs").iterdir())
    refused(invoke("sweep", spec, "--out", out / "nested", "--workers", 0, "--no-plot"),
            "the runs/ folder of the results directory", "nothing was run")
    refused(invoke("train", *SMALL, "--rounds", 1, "--out", out / "mine"),
            "the runs/ folder of the results directory")
    assert sorted(p.name for p in (tmp_path / "src" / "runs").iterdir()) == before


# -- a sweep's run directory is the sweep's ------------------------------------------------------
def _crashed(tmp_path, tiny_sweep):
    """A 1-run sweep whose run's record is a failure as a crashed run leaves it: only
    ``runs/<key>/outcome.json``, status failed. (spec file, key, the run's directory)."""
    import json

    spec, key, path = _source(tmp_path, tiny_sweep)
    run_dir = path.parent
    shutil.rmtree(run_dir)
    run_dir.mkdir()
    path.write_text(json.dumps({"key": key, "status": "failed", "error": "KilledWorker: x"}))
    return spec, key, run_dir


@pytest.mark.parametrize("which", ["recorded", "not_yet_run"])
def test_train_never_writes_into_a_sweeps_run_directory(tmp_path, tiny_sweep, which, refused):
    # `train --out runs/<key>` once checked only the directories above the run directory: it
    # wrote a run of its own beside the failed record, and the next sweep retried the key
    # and wiped that run without a word; a key no run of the sweep has yet is the store's too
    spec, key, run_dir = _crashed(tmp_path, tiny_sweep)
    out = run_dir if which == "recorded" else run_dir.parent / ("0123456789abcdef")
    before = files(tmp_path / "src")
    refused(invoke("train", *SMALL, "--rounds", 2, "--out", out), f"--out {out}",
            "results directory", "a sweep clears")
    assert files(tmp_path / "src") == before
    assert which == "recorded" or not out.exists()


def test_train_never_writes_into_a_results_directory(tmp_path, tiny_sweep, refused):
    # `train --out RESULTS` (a sweep's results directory itself) wrote config.json,
    # metrics.csv... beside the tables and runs/, which made the results directory a run
    # directory: every later sweep into it stopped with "RESULTS is inside the run directory
    # RESULTS", and the flower commands, which check --out as train does, did the same
    spec, key, _ = _source(tmp_path, tiny_sweep)
    store = tmp_path / "src"
    before = files(store)
    refused(invoke("train", *SMALL, "--rounds", 1, "--out", store), f"--out {store}",
            "results directory")
    assert files(store) == before
    res = invoke("sweep", spec, "--out", store, "--workers", 0, "--no-plot")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("inside", ["figures", "figures/mine"])
def test_train_never_writes_into_a_results_directorys_figures_folder(tmp_path, tiny_sweep, inside,
                                                                     refused):
    # `train --out RESULTS/figures` made the folder where the sweep draws a run directory:
    # the next sweep into RESULTS wrote its tables and stopped with "--out RESULTS/figures is
    # or lies inside the run directory", and no figure of the results could be drawn again
    spec, key, _ = _source(tmp_path, tiny_sweep)
    store = tmp_path / "src"
    out = store / inside
    before = files(store)
    refused(invoke("train", *SMALL, "--rounds", 1, "--out", out), f"--out {out}",
            "the figures/ folder of the results directory")
    assert files(store) == before
    res = invoke("sweep", spec, "--out", store, "--workers", 0)
    assert res.exit_code == 0, res.output
    assert (store / "figures" / "sweep.png").is_file()


def test_train_may_write_beside_a_users_own_results_csv(tmp_path):
    # a folder of the user's with a results.csv of its own (not a sweep's) is no results
    # directory: a run goes there as before
    (tmp_path / "results.csv").write_text("model,score\nmine,0.3\n")
    res = invoke("train", *SMALL, "--rounds", 1, "--out", tmp_path)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "results.csv").read_text() == "model,score\nmine,0.3\n"


def test_a_trace_is_never_written_where_a_sweeps_run_directory_goes(tmp_path, tiny_sweep,
                                                                    refused):
    # a file named like a run key in runs/ would stand where the sweep makes that run's
    # directory
    spec, key, run_dir = _crashed(tmp_path, tiny_sweep)
    trace = run_dir.parent / "0123456789abcdef"
    refused(invoke("train", *SMALL, "--rounds", 1, "--out", tmp_path / "mine", "--trace", trace),
            f"--trace {trace}", "directory of another run")
    assert not trace.exists() and not (tmp_path / "mine").exists()


def test_train_never_starts_beside_a_sweeps_record(tmp_path, refused):
    # a sweep's run directory moved out of its results directory still holds the sweep's
    # record: a new run there is refused as well (RunDirectory.prepare)
    out = tmp_path / "moved"
    out.mkdir()
    (out / "outcome.json").write_text('{"status": "failed", "error": "x"}\n')
    refused(invoke("train", *SMALL, "--rounds", 1, "--out", out), str(out), "outcome.json",
            "sweep's run directory")
    assert sorted(p.name for p in out.iterdir()) == ["outcome.json"]


@pytest.mark.parametrize("shared_fs", [True, False])
def test_a_sweep_never_clears_a_run_it_did_not_start(tmp_path, tiny_sweep, shared_fs):
    # a run of another configuration in runs/<key> (written there by `train --out` of an
    # earlier version, or copied there) beside the sweep's failed record: retrying the key
    # once cleared the directory and trained the sweep's run in its place; where the
    # workers do not share the filesystem (--scheduler, --no-shared-fs) the driver once
    # wrote the files they returned over that run's
    from rfrs_ref.experiments.spec import load_sweep
    from rfrs_ref.experiments.sweep import run_sweep

    spec, key, run_dir = _crashed(tmp_path, tiny_sweep)
    mine = tmp_path / "mine"
    assert invoke("train", *SMALL, "--rounds", 2, "--out", mine).exit_code == 0
    for p in mine.iterdir():
        if p.name != LOCK_NAME:
            shutil.copy(p, run_dir / p.name)
    theirs = {n: b for n, b in files(run_dir).items() if n != "outcome.json"}
    report = run_sweep(load_sweep(spec).runs, tmp_path / "src", workers=0, shared_fs=shared_fs)
    assert report.failed == 1 and report.finished == 0
    error = report.failures[0][1]
    assert str(run_dir) in error and "not this sweep's run" in error
    assert "move the directory" in error
    assert {n: b for n, b in files(run_dir).items() if n != "outcome.json"} == theirs
    # moved away, the sweep's run runs
    shutil.rmtree(run_dir)
    report = run_sweep(load_sweep(spec).runs, tmp_path / "src", workers=0, shared_fs=shared_fs)
    assert report.finished == 1 and report.failed == 0


def test_a_store_never_writes_returned_files_over_a_run_it_did_not_start(tmp_path, tiny_sweep):
    # the files a worker returns (it trained elsewhere) reaching a directory that meanwhile
    # holds a run of another configuration: recorded as the run's failure, nothing written
    import json

    from rfrs_ref.experiments.results import Store
    from rfrs_ref.experiments.spec import load_sweep

    spec, key, run_dir = _crashed(tmp_path, tiny_sweep)
    mine = tmp_path / "mine"
    assert invoke("train", *SMALL, "--rounds", 2, "--out", mine).exit_code == 0
    for p in mine.iterdir():
        if p.name != LOCK_NAME:
            shutil.copy(p, run_dir / p.name)
    theirs = {n: b for n, b in files(run_dir).items() if n != "outcome.json"}
    (run_spec,) = load_sweep(spec).runs
    returned = {"key": key, "status": "ok", "final": {"precision@5": 0.5}, "wall_s": 1.5,
                "rounds": [{"round": 1}], "files": {n: "returned\n" for n in
                                                    ("config.json", "metrics.csv",
                                                     "final_metrics.json")}}
    record = Store(tmp_path / "src").write_outcome(run_spec, returned)
    assert record["status"] == "failed" and "final" not in record and "rounds" not in record
    assert str(run_dir) in record["error"] and "not this sweep's run" in record["error"]
    assert record["wall_s"] == 1.5
    assert json.loads((run_dir / "outcome.json").read_text())["status"] == "failed"
    assert {n: b for n, b in files(run_dir).items() if n != "outcome.json"} == theirs


# -- a run that starts again from round 0 -------------------------------------------------------
DIVERGES = [*SMALL, "--rounds", 4, "--eval-every", 1, "--checkpoint-every", 10,
            "--valid-fraction", 0.1, "--attack", "inf", "--byzantine-fraction", 0.3,
            "--no-verify"]


@pytest.mark.parametrize("edit", [None, {"seed": 1}])
def test_a_restart_from_round_0_keeps_nothing_of_the_earlier_attempt(tmp_path, monkeypatch,
                                                                       edit):
    # a run without a checkpoint starts again from round 0 (a diverged run resumed, config.json
    # edited or not): metrics.csv and rounds.jsonl were begun afresh, but valid_metrics.csv
    # kept the earlier attempt's rows and took the new ones after them (round 0 twice, or
    # rows of seed 0 above those of seed 1), and the earlier attempt's final_metrics.json
    # said "diverged" while the new attempt ran
    import json

    from rfrs_ref.federated.trainer import RunDirectory

    run = tmp_path / "run"
    res = invoke("train", *DIVERGES, "--out", run)
    assert res.exit_code != 0 and "round 2" in res.output, res.output
    assert json.loads((run / "final_metrics.json").read_text())["status"] == "diverged"
    if edit is not None:
        record = json.loads((run / "config.json").read_text())
        record["config"].update(edit)
        (run / "config.json").write_text(json.dumps(record))
    seen = []  # whether a final_metrics.json is there as the new attempt writes its rows
    real = RunDirectory.append_metrics

    def spy(self, *args, **kwargs):
        seen.append((run / "final_metrics.json").exists())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RunDirectory, "append_metrics", spy)
    res = invoke("train", "--resume", run)
    monkeypatch.undo()
    assert res.exit_code != 0 and "Error: round" in res.output, res.output  # diverged again
    assert seen and not any(seen)
    fresh = tmp_path / "fresh"
    again = ["--seed", edit["seed"]] if edit else []
    assert invoke("train", *DIVERGES, *again, "--out", fresh).exit_code != 0

    def rounds(p):  # timings differ from run to run: the rounds recorded
        return [json.loads(x)["round"] for x in p.read_text().splitlines()]

    assert rounds(run / "rounds.jsonl") == rounds(fresh / "rounds.jsonl")
    for name in ("metrics.csv", "valid_metrics.csv"):
        assert (run / name).read_text() == (fresh / name).read_text(), name


@pytest.mark.parametrize("how", ["resume", "same_command"])
def test_a_restart_from_round_0_never_writes_through_a_link(tmp_path, how):
    # a run without a checkpoint starts again from round 0 (a diverged run resumed, or the
    # same command over a run that stopped before its first checkpoint): metrics.csv and
    # rounds.jsonl were begun with open("w"), which truncated and rewrote the files that
    # links planted at those names point to, outside the run directory
    run = tmp_path / "run"
    res = invoke("train", *DIVERGES, "--out", run)
    assert res.exit_code != 0 and "round 2" in res.output, res.output
    if how == "same_command":  # as if it stopped before its first checkpoint
        (run / "final_metrics.json").unlink()
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("metrics.csv", "rounds.jsonl"):
        (outside / name).write_text("precious\n")
        (run / name).unlink()
        (run / name).symlink_to(outside / name)
    res = invoke("train", "--resume", run) if how == "resume" else \
        invoke("train", *DIVERGES, "--out", run)
    assert "Error: round 2" in res.output, res.output
    assert {p.name: p.read_text() for p in outside.iterdir()} == {
        "metrics.csv": "precious\n", "rounds.jsonl": "precious\n"}
    assert not any((run / n).is_symlink() for n in ("metrics.csv", "rounds.jsonl"))


# -- files of the user's in a plot's or mechanism's --out -------------------------------------------
def _matplotlib_png(path):
    """A figure of the user's, drawn with matplotlib as ours are (its own metadata)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    fig.savefig(path)
    plt.close(fig)
    return path.read_bytes()


@pytest.mark.parametrize("name", ["fig3.png", "fig3_curves.pdf"])
def test_plot_never_replaces_a_users_figure_of_the_same_name(tiny_results, tmp_path, refused,
                                                             name):
    """`plot --out DIR` replaced DIR/fig3.png (and the other names it writes) whatever the
    file was: a user's own figure was silently lost. A file plot did not draw is refused,
    before any figure is drawn (none is left beside it)."""
    out = tmp_path / "figs"
    out.mkdir()
    mine = _matplotlib_png(out / name)
    refused(invoke("plot", tiny_results, "--figure", "3", "--out", out), out / name,
            "is not a figure rfrs-ref drew", "nothing was written")
    assert files(out) == {name: mine}
    (out / name).unlink()
    res = invoke("plot", tiny_results, "--figure", "3", "--out", out)
    assert res.exit_code == 0, res.output
    again = invoke("plot", tiny_results, "--figure", "3", "--out", out)  # its own: replaced
    assert again.exit_code == 0, again.output


def test_a_sweeps_plot_never_replaces_a_users_sweep_pdf(tiny_results, tmp_path, refused):
    out = tmp_path / "figs"
    out.mkdir()
    (out / "sweep.pdf").write_bytes(b"%PDF-1.4 the user's own\n")
    refused(invoke("plot", tiny_results, "--out", out), out / "sweep.pdf",
            "is not a figure rfrs-ref drew")
    assert files(out) == {"sweep.pdf": b"%PDF-1.4 the user's own\n"}


def test_a_results_directorys_own_figures_are_redrawn(tiny_results, tmp_path):
    """The figures/ folder of a results directory is its own: figures there from before
    figures said who drew them are redrawn, as reproduce redraws them after each call."""
    import shutil

    from rfrs_ref.experiments.plots import drawn_here

    d = tmp_path / "r"
    shutil.copytree(tiny_results, d)
    (d / "figures").mkdir(exist_ok=True)
    _matplotlib_png(d / "figures" / "fig3.png")
    assert not drawn_here(d / "figures" / "fig3.png")
    res = invoke("plot", d, "--figure", "3")
    assert res.exit_code == 0, res.output
    assert drawn_here(d / "figures" / "fig3.png") and drawn_here(d / "figures" / "fig3.pdf")


def test_write_ranking_never_replaces_a_users_ranking_md(tmp_path):
    import pandas as pd

    from rfrs_ref.experiments.ranking import write_ranking

    table = pd.DataFrame(columns=["key", "label_series", "label_space", "label_pre", "attack",
                                  "dataset", "alpha", "seed", "status", "k", "metric", "value"])
    (tmp_path / "ranking.md").write_text("# my notes\n")
    with pytest.raises(ValueError, match="is not a ranking rfrs-ref wrote"):
        write_ranking(table, tmp_path)
    assert (tmp_path / "ranking.md").read_text() == "# my notes\n"
    (tmp_path / "ranking.md").unlink()
    write_ranking(table, tmp_path)
    write_ranking(table, tmp_path)  # its own: replaced


@pytest.mark.parametrize("name", ["defenses-synthetic-a0.4-seed0-no-defense.csv",
                                  "defenses-synthetic-a0.4-seed0.md",
                                  "defenses-synthetic-a0.4-seed0.png"])
def test_mechanism_never_replaces_a_users_file_of_the_same_name(tmp_path, refused, name):
    """mechanism replaced a per-round table, summary or PNG of its names in --out whatever
    the file was (a table it could not read was measured again over it)."""
    out = tmp_path / "m"
    out.mkdir()
    (out / name).write_bytes(b"the user's own\n")
    refused(invoke(*MECHANISM, "--out", out), out / name, "is not ",
            "nothing was measured or written")
    assert files(out) == {name: b"the user's own\n"}


def test_mechanism_redraws_its_png_beside_its_own_summary(tmp_path):
    from rfrs_ref.experiments.plots import drawn_here

    out = tmp_path / "m"
    res = invoke(*MECHANISM, "--out", out)
    assert res.exit_code == 0, res.output
    png = out / "defenses-synthetic-a0.4-seed0.png"
    assert drawn_here(png)
    _matplotlib_png(png)  # as drawn before figures said who drew them
    res = invoke(*MECHANISM, "--out", out)
    assert res.exit_code == 0, res.output
    assert drawn_here(png)


def test_a_sweep_into_a_users_directory_never_replaces_its_figures(tmp_path, tiny_sweep, refused):
    """A directory that is not yet a results directory becomes one when the sweep writes its
    tables, and its figures/ folder then the results directory's to redraw: a user's own
    figures/sweep.png there is refused before anything runs."""
    spec = tmp_path / "s.toml"
    spec.write_text(tiny_sweep)
    out = tmp_path / "mine"
    (out / "figures").mkdir(parents=True)
    mine = _matplotlib_png(out / "figures" / "sweep.png")
    refused(invoke("sweep", spec, "--out", out, "--workers", 0), out / "figures" / "sweep.png",
            "is not a figure rfrs-ref drew")
    assert files(out) == {"figures/sweep.png": mine} and not (out / "runs").exists()
    res = invoke("sweep", spec, "--out", out, "--workers", 0, "--no-plot")
    assert res.exit_code == 0, res.output
    assert files(out)["figures/sweep.png"] == mine


def test_reproduce_into_a_users_directory_never_replaces_its_figures(tmp_path):
    from rfrs_ref.experiments.figures import Scale, figure, reproduce

    out = tmp_path / "mine"
    (out / "figures").mkdir(parents=True)
    mine = _matplotlib_png(out / "figures" / "fig10_curves.png")
    with pytest.raises(ValueError, match="fig10_curves.png exists and is not a figure rfrs-ref"):
        reproduce(figure("10"), Scale(quick=True, datasets=("synthetic",)), out, workers=0)
    assert files(out) == {"figures/fig10_curves.png": mine}


# -- a FIFO planted at an output's name --------------------------------------------------------------
class _FilledFifo:
    """A FIFO at ``path`` holding ``data``, with a writer open (the test's) so that opening it
    to read does not wait: what the checks read is the first line, or the PNG text chunk, of
    a file a command wrote. A FIFO is not such a file: opened without a writer it made the
    command wait for ever, and with one it read as the command's own file and was replaced."""

    def __init__(self, path, data: bytes) -> None:
        os.mkfifo(path)
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        os.write(self.fd, data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def _png_text_chunk(key: bytes, value: bytes) -> bytes:
    import struct
    import zlib

    body = b"tEXt" + key + b"\0" + value
    return struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))


def test_a_fifo_never_reads_as_a_file_a_command_wrote(tmp_path):
    import stat

    from rfrs_ref.experiments.mechanism import is_summary
    from rfrs_ref.experiments.plots import drawn_here
    from rfrs_ref.files import first_line

    with _FilledFifo(tmp_path / "ranking.md", b"Rules ranked by Precision@5\n"):
        assert first_line(tmp_path / "ranking.md") is None
    with _FilledFifo(tmp_path / "m.md", b"Means over the rounds: x\n"):
        assert not is_summary(tmp_path / "m.md")
    png = b"\x89PNG\r\n\x1a\n" + _png_text_chunk(b"Software", b"rfrs-ref 1.0")
    with _FilledFifo(tmp_path / "fig4.png", png):
        assert not drawn_here(tmp_path / "fig4.png")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fig4.png").st_mode)


def test_ranking_out_never_replaces_a_fifo(tmp_path, refused):
    import stat

    import pandas as pd

    read = tmp_path / "ranking"
    read.mkdir()
    pd.DataFrame([{"key": f"{rule}-{s}", "status": "ok", "label_series": rule, "label_space": "gradient",
                   "label_pre": "none", "attack": "ascent", "dataset": "ml100k", "alpha": 0.4,
                   "seed": s, "metric": "precision", "k": 5, "value": 0.1 + 0.01 * s}
                  for rule in ("mean", "krum") for s in range(3)]).to_csv(read / "results.csv",
                                                                         index=False)
    out = tmp_path / "r.md"
    with _FilledFifo(out, b"Rules ranked by Precision@5\n"):
        refused(invoke("ranking", read, "--out", out), out, "is not a ranking rfrs-ref wrote")
    assert stat.S_ISFIFO(os.lstat(out).st_mode)


# -- a run directory swapped for another between the check and the clearing ----------------------
@pytest.mark.parametrize("kind", ["train", "capture"])
@pytest.mark.parametrize("when, swap", [("before_lock", "link"), ("after_lock", "link"),
                                        ("after_lock", "directory")])
def test_a_worker_never_clears_a_directory_put_at_its_run_directory_after_the_check(
        tmp_path, tiny_sweep, monkeypatch, kind, when, swap):
    """The worker refused a linked run directory, then loaded the data, took the lock and
    cleared the directory by its name: a link put at that name in between (or, once the
    lock was taken, another directory) had the directory it reached emptied. Only the
    directory whose lock the worker holds is cleared, opened without following a link.
    (A plain directory at the name before the lock is taken is the run's directory: what
    it holds but a run of another configuration is the run's to clear.)"""
    import dataclasses

    import rfrs_ref.files
    from rfrs_ref.experiments.spec import load_sweep
    from rfrs_ref.experiments.worker import execute_run

    spec = tmp_path / "s.toml"
    spec.write_text(tiny_sweep)
    run = load_sweep(spec).runs[0]
    if kind == "capture":
        run = dataclasses.replace(run, kind="capture")
    run_dir = tmp_path / "out" / "runs" / run.key
    run_dir.mkdir(parents=True)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work\n")
    (precious / "figures").mkdir()
    (precious / "figures" / "f.png").write_bytes(b"png")
    before = files(precious)

    def plant():
        run_dir.rename(tmp_path / "moved")
        if swap == "link":
            run_dir.symlink_to(precious, target_is_directory=True)
        else:
            precious.rename(run_dir)  # the user's directory itself, now at the run's name

    class Racing(rfrs_ref.files.DirectoryLock):
        def acquire(self):
            if when == "before_lock":
                plant()
            out = super().acquire()
            if when == "after_lock":
                plant()
            return out

    monkeypatch.setattr(rfrs_ref.files, "DirectoryLock", Racing)
    outcome = execute_run({"spec": run.to_json(), "key": run.key, "run_dir": str(run_dir)})
    assert outcome["status"] == "failed", outcome
    assert "nothing was removed" in outcome["error"]
    users = precious if swap == "link" else run_dir
    assert files(users) == before
