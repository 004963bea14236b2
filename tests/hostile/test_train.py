"""``rfrs-ref train`` and ``--resume`` against a hostile user: concurrent runs, exploding
states, interrupted and damaged run directories, conflicting options, full disks.

Every refusal is checked the same way: a non-zero exit, one ``Error:`` line naming
the file or option, no traceback, and the files already there unchanged.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main
from rfrs_ref.files import LOCK_NAME

SMALL = ["--dataset", "synthetic", "--synthetic-users", "100", "--synthetic-items", "120",
         "--client-fraction", "0.1"]
# -P keeps the repository root off sys.path, so the installed package is imported
CLI = [sys.executable, "-P", "-c", "from rfrs_ref.cli.main import main; main()"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def snapshot(directory):
    """Every file under ``directory`` (the lock aside: it belongs to its holder) -> bytes."""
    if not directory.exists():
        return None
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != LOCK_NAME}


def assert_refused(res, *needles):
    """A one-line error containing every needle, a non-zero exit, no traceback."""
    out = res.output if hasattr(res, "output") else res.stderr
    code = res.exit_code if hasattr(res, "exit_code") else res.returncode
    assert code not in (0, None), out
    assert "Traceback" not in out, out
    if hasattr(res, "exception") and res.exception is not None:
        assert isinstance(res.exception, SystemExit), repr(res.exception)
    errors = [line for line in out.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, out
    for needle in needles:
        assert str(needle) in errors[0], (needle, errors[0])
    return errors[0]


def read_rounds(path, *, killed=False):
    """The round numbers of rounds.jsonl (``killed``: the last line may be cut short)."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if killed and lines:
        try:
            json.loads(lines[-1])
        except json.JSONDecodeError:
            lines.pop()
    return [json.loads(line)["round"] for line in lines]


def read_npz(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def finished(train_finished):
    """A finished 4-round run on the default backend, which this module's runs are compared
    with bit for bit (conftest's ``finished`` runs on the NumPy backend); ``run_copy``
    copies this one here."""
    return train_finished(*SMALL)


# -- 1. one process per run directory ---------------------------------------------------------
def _wait_for_holder(directory, pid, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the first run ended early: {proc.stderr.read()!r}")
        try:
            if f"process {pid} " in (directory / LOCK_NAME).read_text():
                return
        except OSError:
            pass
        time.sleep(0.05)
    pytest.fail("the first run never took its directory's lock")


def test_a_second_train_or_resume_on_a_running_directory_is_refused(tmp_path):
    out = tmp_path / "run"
    first = subprocess.Popen(CLI + ["train", *SMALL, "--rounds", "1000000", "--eval-every", "50",
                                    "--backend", "numpy", "--out", str(out)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_holder(out, first.pid, first)
        second = subprocess.run(CLI + ["train", *SMALL, "--rounds", "20", "--seed", "1",
                                       "--backend", "numpy", "--out", str(out)],
                                capture_output=True, text=True, timeout=300)
        third = subprocess.run(CLI + ["train", "--resume", str(out)], capture_output=True,
                               text=True, timeout=300)
        assert first.poll() is None, "the first run must still hold the directory"
    finally:
        first.kill()
        first.wait()
        first.stderr.close()
    for proc in (second, third):
        line = assert_refused(proc, out, f"process {first.pid} ")
        assert "in use" in line
    # only the first run wrote: its configuration, its rounds in order, no duplicate rows
    assert json.loads((out / "config.json").read_text())["config"]["seed"] == 0
    rounds = read_rounds(out / "rounds.jsonl", killed=True)
    assert rounds == list(range(1, len(rounds) + 1))
    rows = (out / "metrics.csv").read_text().splitlines()[1:-1]  # the last may be cut short
    keys = [tuple(r.split(",")[:2]) for r in rows]
    assert len(keys) == len(set(keys))


HOLD = ("import sys, time; from rfrs_ref.files import DirectoryLock; "
        "DirectoryLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)")


def test_a_live_holder_refuses_and_a_dead_one_is_taken_over(run_copy):
    before = snapshot(run_copy)
    holder = subprocess.Popen([sys.executable, "-P", "-c", HOLD, str(run_copy)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert_refused(invoke("train", "--resume", run_copy), run_copy, f"process {holder.pid} ")
        assert_refused(invoke("train", *SMALL, "--rounds", 4, "--out", run_copy),
                       run_copy, f"process {holder.pid} ")
        assert snapshot(run_copy) == before
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # as a crash would: no clean-up
        holder.wait()
        holder.stdout.close()
    assert (run_copy / LOCK_NAME).exists()
    res = invoke("train", "--resume", run_copy)
    assert res.exit_code == 0, res.output
    assert not (run_copy / LOCK_NAME).exists()


def test_a_sweep_on_a_held_directory_is_refused_and_writes_nothing(tmp_path):
    spec = tmp_path / "sweep.toml"
    spec.write_text('trials = 1\n[base]\ndataset = "synthetic"\nrounds = 1\n'
                    'dataset_params = { n_users = 100, n_items = 120 }\n')
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-P", "-c", HOLD, str(out)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert_refused(invoke("sweep", spec, "--out", out, "--workers", 0), out,
                       f"process {holder.pid} ")
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        holder.stdout.close()


# -- 2. non-finite server state --------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["--optimizer", "sgd", "--attack", "noise", "--noise-sigma", "1e38"],
    ["--attack", "noise", "--noise-sigma", "1e38", "--no-verify"],
    ["--optimizer", "sgd", "--attack", "ipm", "--ipm-epsilon", "1e30"],
    ["--optimizer", "sgd", "--attack", "alie", "--alie-z", "1e30"],
    ["--optimizer", "sgd", "--attack", "inf"],
    ["--attack", "inf", "--inf-value", "nan", "--no-verify"],
], ids=["sgd-noise", "adam-noverify-noise", "sgd-ipm", "sgd-alie", "sgd-inf", "adam-noverify-nan"])
def test_a_state_that_explodes_stops_the_run_at_that_round(tmp_path, args):
    out = tmp_path / "run"
    res = invoke("train", *SMALL, "--rounds", 12, "--eval-every", 4, "--byzantine-fraction", 0.3,
                 *args, "--out", out)
    line = assert_refused(res, "round ", "non-finite", "'theta'" if "sgd" in args else "'")
    t = int(line.split("round ")[1].split(":")[0])
    assert 1 <= t <= 12
    # the run is over and says so: diverged at round t, no final state
    final = json.loads((out / "final_metrics.json").read_text())
    assert final["status"] == "diverged" and final["round"] == t
    assert final["reason"] == "non-finite server state" and "model" not in final
    assert not (out / "state.npz").exists()
    # no metric computed from NaN scores, no record of the failed round
    for row in (out / "metrics.csv").read_text().splitlines()[1:]:
        assert all(np.isfinite(float(x)) for x in row.split(",")[2:]), row
        assert int(row.split(",")[0]) < t
    assert read_rounds(out / "rounds.jsonl") == list(range(1, t))
    if (out / "checkpoint.npz").exists():
        ckpt = read_npz(out / "checkpoint.npz")
        assert int(ckpt["round"]) < t
        assert all(np.isfinite(v).all() for k, v in ckpt.items() if v.dtype.kind == "f")
        assert f"round {int(ckpt['round'])}) is kept" in line


def test_scores_that_overflow_from_a_finite_state_stop_the_run_as_diverged(tmp_path):
    out = tmp_path / "run"
    res = invoke("train", *SMALL, "--rounds", 8, "--eval-every", 1, "--byzantine-fraction", 0.4,
                 "--optimizer", "momentum", "--lr", "1e6", "--attack", "ascent",
                 "--preset", "no-defense", "--out", out)
    line = assert_refused(res, "round ", "the model diverged", "scores of user")
    t = int(line.split("round ")[1].split(":")[0])
    final = json.loads((out / "final_metrics.json").read_text())
    assert final["status"] == "diverged" and final["round"] == t
    assert final["reason"] == "non-finite scores"
    assert final["last_evaluation"]["round"] == t - 1
    assert not (out / "state.npz").exists()
    assert read_rounds(out / "rounds.jsonl") == list(range(1, t))
    assert [int(r.split(",")[0]) for r in (out / "metrics.csv").read_text().splitlines()[1:]
            if r.split(",")[1] == "1"] == list(range(t))


@pytest.mark.parametrize("scale, needles", [
    ("nan", ["init_scale", "finite"]),
    ("inf", ["init_scale", "finite"]),
    ("1e39", ["initial state", "'theta'", "initial scale"]),  # beyond float32
])
def test_an_initial_state_that_is_not_finite_writes_nothing(tmp_path, scale, needles):
    out = tmp_path / "run"
    assert_refused(invoke("train", *SMALL, "--rounds", 2, "--init-scale", scale, "--out", out),
                   *needles)
    assert not out.exists()


def test_resume_refuses_a_checkpoint_holding_nan(run_copy):
    z = read_npz(run_copy / "checkpoint.npz")
    z["state_theta"][7] = np.nan
    z["round"] = np.array(2)
    np.savez(run_copy / "checkpoint.npz", **z)
    before = snapshot(run_copy)
    assert_refused(invoke("train", "--resume", run_copy), "checkpoint.npz", "non-finite", "'theta'")
    assert snapshot(run_copy) == before


# -- 3. interrupted runs, impossible configurations, existing runs ------------------------------
def test_an_impossible_rule_configuration_writes_nothing(tmp_path):
    out = tmp_path / "run"
    # 10 clients per round, f = floor(0.4 * 10) = 4: Krum needs n > 2f + 2 = 10
    res = invoke("train", *SMALL, "--rounds", 3, "--defense", "krum", "--byzantine-fraction", 0.4,
                 "--out", out)
    assert_refused(res, "krum needs n > 2f + 2", "n=10", "f=4")
    assert not out.exists()


@pytest.mark.parametrize("args, needles", [
    # 120 is an item's id in a 1-based dataset file, not an index: the message says which
    (["--a-ra-targets", "3,120"], ["target items must lie in 0..119", "[120]",
                                   "item_ids[i] of a run's ids.npz"]),
    (["--a-ra-targets", "3,x"], ["comma-separated integer item ids", "'3,x'"]),
    (["--a-ra-n-targets", "121"], ["n_targets ≤ n_items", "n_targets=121", "120 items"]),
])
def test_impossible_target_items_write_nothing(tmp_path, args, needles):
    out = tmp_path / "run"
    res = invoke("train", *SMALL, "--rounds", 2, "--attack", "a-ra", "--byzantine-fraction", 0.1,
                 *args, "--out", out)
    assert_refused(res, *needles)
    assert not out.exists()


def test_the_help_says_target_items_are_dense_indices_not_the_files_ids():
    res = invoke("train", "--help")
    text = " ".join(res.output.split())
    assert res.exit_code == 0
    assert "--a-ra-targets" in text and "not the ids of the dataset's files" in text


def test_an_attack_without_byzantine_clients_is_refused(tmp_path):
    """--attack ascent without --byzantine-fraction used to train without attackers."""
    out = tmp_path / "run"
    res = invoke("train", *SMALL, "--rounds", 2, "--attack", "ascent", "--out", out)
    assert_refused(res, "--attack ascent needs Byzantine clients", "--byzantine-fraction")
    assert not out.exists()


def test_an_unknown_name_in_a_recorded_configuration_is_refused(run_copy):
    record = json.loads((run_copy / "config.json").read_text())
    record["config"]["defense"] = "no-such-rule"
    (run_copy / "config.json").write_text(json.dumps(record))
    (run_copy / "checkpoint.npz").unlink()
    before = snapshot(run_copy)
    assert_refused(invoke("train", "--resume", run_copy), "no-such-rule")
    assert snapshot(run_copy) == before


def _interrupt_at(monkeypatch, when):
    """Ctrl-C during round ``when`` (as the user's interruption would arrive)."""
    from rfrs_ref.federated import trainer

    real = trainer.run_round

    def run_round(fed, state, t, *a, **kw):
        if t == when:
            raise KeyboardInterrupt
        return real(fed, state, t, *a, **kw)

    monkeypatch.setattr(trainer, "run_round", run_round)


STUB = [*SMALL, "--rounds", 6, "--eval-every", 3, "--checkpoint-every", 6]


def test_a_run_interrupted_before_its_first_checkpoint_can_be_resumed_or_run_again(
        tmp_path, monkeypatch):
    ref = tmp_path / "reference"
    assert invoke("train", *STUB, "--out", ref).exit_code == 0
    stubs = [tmp_path / "resumed", tmp_path / "again"]
    with monkeypatch.context() as m:
        _interrupt_at(m, 4)
        for d in stubs:
            res = invoke("train", *STUB, "--out", d)
            assert res.exit_code != 0 and "Traceback" not in res.output
            assert (d / "config.json").exists() and not (d / "checkpoint.npz").exists()
            assert read_rounds(d / "rounds.jsonl") == [1, 2, 3]

    # another configuration may not take the stub over
    before = snapshot(stubs[1])
    assert_refused(invoke("train", *STUB, "--seed", 3, "--out", stubs[1]), "another configuration",
                   "--resume")
    assert snapshot(stubs[1]) == before

    assert invoke("train", "--resume", stubs[0]).exit_code == 0
    assert invoke("train", *STUB, "--out", stubs[1]).exit_code == 0
    for d in stubs:
        assert (d / "metrics.csv").read_text() == (ref / "metrics.csv").read_text()
        assert read_rounds(d / "rounds.jsonl") == list(range(1, 7))
        a, b = read_npz(ref / "state.npz"), read_npz(d / "state.npz")
        assert all(a[k].tobytes() == b[k].tobytes() for k in a)


def test_train_refuses_a_directory_holding_a_run(run_copy):
    before = snapshot(run_copy)
    assert_refused(invoke("train", *SMALL, "--rounds", 4, "--seed", 5, "--out", run_copy),
                   run_copy, "already holds a run", f"--resume {run_copy}")
    assert snapshot(run_copy) == before


def test_train_never_writes_into_another_runs_directory(run_copy, tmp_path):
    # a run directory is its run's: a run or a trace nested in it was once written there
    before = snapshot(run_copy)
    assert_refused(invoke("train", *SMALL, "--rounds", 1, "--out", run_copy / "nested"),
                   f"--out {run_copy / 'nested'}", f"inside the run directory {run_copy}")
    assert_refused(invoke("train", *SMALL, "--rounds", 1, "--out", tmp_path / "mine",
                          "--trace", run_copy / "t.jsonl"),
                   "--trace", f"directory of another run, {run_copy}")
    assert snapshot(run_copy) == before
    assert not (tmp_path / "mine").exists()
    # a trace in the run's own directory is still fine
    res = invoke("train", *SMALL, "--rounds", 1, "--out", tmp_path / "mine",
                 "--trace", tmp_path / "mine" / "t.jsonl")
    assert res.exit_code == 0, res.output


def test_a_working_directory_with_a_results_table_is_no_store(tmp_path, monkeypatch):
    # only a folder named by a run key inside a store's runs/ is a sweep's run directory: a
    # user's own results.csv beside runs/ must not make runs/a/b someone else's
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results.csv").write_text("x\n1\n")
    res = invoke("train", *SMALL, "--rounds", 1, "--out", pathlib.Path("runs") / "ml" / "seed0")
    assert res.exit_code == 0, res.output
    nested = pathlib.Path("runs") / "0123456789abcdef" / "nested"
    assert_refused(invoke("train", *SMALL, "--rounds", 1, "--out", nested),
                   "inside the run directory")


# -- 4. options that conflict ------------------------------------------------------------------
@pytest.mark.parametrize("args, needles", [
    (["--preset", "no-defense", "--defense", "krum"], ["--preset no-defense", "--defense krum"]),
    (["--preset", "a-rfrs", "--detect", "parameter"], ["--preset a-rfrs", "--detect parameter"]),
    (["--preset", "krum", "--defense", "median"], ["--preset krum", "--defense median"]),
])
def test_an_option_that_conflicts_with_the_preset_is_an_error(tmp_path, args, needles):
    out = tmp_path / "run"
    assert_refused(invoke("train", *SMALL, "--rounds", 1, *args, "--out", out), *needles)
    assert not out.exists()


def test_a_preset_with_the_same_explicit_value_is_accepted(tmp_path):
    out = tmp_path / "run"
    res = invoke("train", *SMALL, "--rounds", 1, "--preset", "a-rfrs", "--defense", "krum",
                 "--out", out)
    assert res.exit_code == 0, res.output
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert (cfg["defense"], cfg["detect"]) == ("krum", "gradient")


def test_options_that_would_change_a_resumed_run_are_an_error(run_copy):
    before = snapshot(run_copy)
    assert_refused(invoke("train", "--resume", run_copy, "--rounds", 8, "--lr", 0.1),
                   "--rounds", "--lr", "--resume")
    assert snapshot(run_copy) == before


# -- 5. one-line errors instead of tracebacks ----------------------------------------------------
def test_a_missing_dataset_without_network(tmp_path, monkeypatch):
    monkeypatch.delenv("RFRS_DATA_DIR", raising=False)
    monkeypatch.setenv("RFRS_CACHE_DIR", str(tmp_path / "cache"))

    def offline(*a, **kw):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    out = tmp_path / "run"
    assert_refused(invoke("train", "--dataset", "ml100k", "--rounds", 1, "--out", out),
                   "ml100k", "--data-dir")
    assert not out.exists()


def test_an_out_that_cannot_be_a_directory(tmp_path):
    (tmp_path / "file").write_text("not a directory\n")
    assert_refused(invoke("train", *SMALL, "--rounds", 1, "--out", tmp_path / "file" / "run"),
                   tmp_path / "file", "--out")
    assert_refused(invoke("train", *SMALL, "--rounds", 1, "--out", tmp_path / "file"), "--out")
    assert (tmp_path / "file").read_text() == "not a directory\n"


def test_a_trace_that_cannot_be_written(tmp_path):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "run"
    assert_refused(invoke("train", *SMALL, "--rounds", 1, "--out", out,
                          "--trace", tmp_path / "file" / "trace.jsonl"), "--trace", "Not a directory")
    assert not out.exists()


def test_a_read_only_out(tmp_path, monkeypatch):
    # a read-only file system, emulated (root may write anywhere a mode bit forbids)
    def read_only(path, *a, **kw):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(os, "mkdir", read_only)
    assert_refused(invoke("train", *SMALL, "--rounds", 1, "--out", tmp_path / "ro" / "run"),
                   "Read-only file system", "writable")


def _disk_full_on(monkeypatch, name, nth=1):
    """The ``nth`` atomic write of ``name`` writes half, then the disk is full."""
    from rfrs_ref.federated import trainer

    real, seen = trainer.atomic_write, {"n": 0}

    def atomic_write(path, write):
        if os.path.basename(path) != name:
            return real(path, write)
        seen["n"] += 1
        if seen["n"] != nth:
            return real(path, write)

        def half(fh):
            fh.write(b"PK\x03\x04 half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        return real(path, half)

    monkeypatch.setattr(trainer, "atomic_write", atomic_write)


def test_a_full_disk_before_the_run_starts(tmp_path, monkeypatch):
    out = tmp_path / "run"
    args = ["train", *SMALL, "--rounds", 4, "--eval-every", 2, "--out", out]
    with monkeypatch.context() as m:
        _disk_full_on(m, "config.json")
        assert_refused(invoke(*args), "config.json", "No space left", "same command again")
    assert not (out / "config.json").exists()
    assert invoke(*args).exit_code == 0


def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch, finished):
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        _disk_full_on(m, "checkpoint.npz", nth=2)
        assert_refused(invoke("train", *SMALL, "--rounds", 4, "--eval-every", 2, "--out", out),
                       "checkpoint.npz", "No space left", f"--resume {out}")
    assert int(read_npz(out / "checkpoint.npz")["round"]) == 2
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    res = invoke("train", "--resume", out)
    assert res.exit_code == 0, res.output
    assert (out / "metrics.csv").read_text() == (finished / "metrics.csv").read_text()
    a, b = read_npz(finished / "state.npz"), read_npz(out / "state.npz")
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)


def test_a_full_disk_while_appending_a_round_record(tmp_path, monkeypatch):
    from rfrs_ref.federated.trainer import RunDirectory

    out = tmp_path / "run"
    real = RunDirectory.append_round

    def append_round(self, record):
        if record["round"] == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path / "rounds.jsonl"))
        return real(self, record)

    with monkeypatch.context() as m:
        m.setattr(RunDirectory, "append_round", append_round)
        assert_refused(invoke("train", *SMALL, "--rounds", 4, "--eval-every", 2, "--out", out),
                       "rounds.jsonl", "No space left", "--resume")
    assert invoke("train", "--resume", out).exit_code == 0
    assert read_rounds(out / "rounds.jsonl") == [1, 2, 3, 4]


@pytest.mark.parametrize("damage", ["truncated", "empty", "not-a-zip"])
def test_resume_from_a_damaged_checkpoint(run_copy, damage):
    path = run_copy / "checkpoint.npz"
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "empty": b"",
                      "not-a-zip": b"garbage\n" * 10}[damage])
    before = snapshot(run_copy)
    assert_refused(invoke("train", "--resume", run_copy), "checkpoint.npz", "damaged",
                   "restart the run from round 0")
    assert snapshot(run_copy) == before


def _shorter_theta(z):
    z["state_theta"] = z["state_theta"][:-1]


def _string_sums(z):
    acc = json.loads(str(z["accumulators"]))
    acc["kept"] = "many"
    z["accumulators"] = np.array(json.dumps(acc))


def _round_beyond_the_end(z):
    z["round"] = np.array(99)


@pytest.mark.parametrize("tamper", [_shorter_theta, _string_sums, _round_beyond_the_end])
def test_resume_from_a_checkpoint_of_another_run(run_copy, tamper):
    z = read_npz(run_copy / "checkpoint.npz")
    tamper(z)
    np.savez(run_copy / "checkpoint.npz", **z)
    before = snapshot(run_copy)
    assert_refused(invoke("train", "--resume", run_copy), "checkpoint.npz", "does not belong")
    assert snapshot(run_copy) == before


@pytest.fixture
def fmf_copy(train_finished, tmp_path):
    """A copy of a finished 4-round FMF run (private client vectors), afresh per test."""
    import shutil

    d = tmp_path / "fmf"
    shutil.copytree(train_finished(*SMALL, "--backend", "numpy", "--model", "fmf"), d)
    return d


@pytest.mark.parametrize("tamper, needle", [
    (lambda z: z.update(private_theta=z["private_theta"].astype(np.float64)),
     "private 'theta' is float64[100, 64], expected float32[100, 64]"),
    (lambda z: z.update(private_theta=np.zeros(z["private_theta"].shape, np.int64)),
     "private 'theta' is int64[100, 64]"),
    (lambda z: z.update(private_v=z["private_v"][:, :1]), "private 'v' is float32[100, 1]"),
    (lambda z: z.pop("private_m"), "expected ['m', 'steps', 'theta', 'v']"),
    (lambda z: z.update(private_steps=z["private_steps"] + 10), "outside 0..4"),
    (lambda z: z.update(private_steps=z["private_steps"].astype(np.float64)),
     "private 'steps' is float64[100], expected int64[100]"),
])
def test_resume_refuses_private_client_state_of_another_form(fmf_copy, tamper, needle):
    # only the private arrays' first dimension was checked: with private_theta in float64 or
    # as int64 zeros, private_m left out or the step counts 10 rounds ahead, --resume exited
    # 0 and wrote them into the final state.npz (a resume from round 2 ended on "Error: m")
    z = read_npz(fmf_copy / "checkpoint.npz")
    tamper(z)
    np.savez(fmf_copy / "checkpoint.npz", **z)
    before = snapshot(fmf_copy)
    assert_refused(invoke("train", "--resume", fmf_copy), "checkpoint.npz", "does not belong",
                   needle)
    assert snapshot(fmf_copy) == before


def test_resume_keeps_a_sound_private_client_state(fmf_copy):
    res = invoke("train", "--resume", fmf_copy)
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", '{"config": {"rounds": "many"}}',
                                  '{"config": {"colour": 1}}', "\x00\xff\xfe"])
def test_resume_with_a_garbage_config(run_copy, text):
    (run_copy / "config.json").write_bytes(text.encode("latin-1"))
    before = snapshot(run_copy)
    assert_refused(invoke("train", "--resume", run_copy), run_copy)
    assert snapshot(run_copy) == before


@pytest.mark.parametrize("text", ["round,k,precision\nx,1,0.5\n",
                                  "round,k,precision\n0,1,nan\n",
                                  "round,k,precision\n0,1\n",
                                  "\n"])
def test_resume_with_a_damaged_metrics_table(run_copy, text):
    (run_copy / "metrics.csv").write_text(text)
    before = snapshot(run_copy)
    assert_refused(invoke("train", "--resume", run_copy), "metrics.csv")
    assert snapshot(run_copy) == before


def test_resume_of_a_directory_without_a_run(tmp_path):
    (tmp_path / "empty").mkdir()
    assert_refused(invoke("train", "--resume", tmp_path / "empty"), tmp_path / "empty", "no run")
    assert list((tmp_path / "empty").iterdir()) == []


@pytest.mark.parametrize("args, needles", [
    (["--dim", 9223372036854775807], ["--dim 9223372036854775807", "2^57"]),
    (["--dim", 10 ** 12], ["--dim 1000000000000", "2^57"]),
    (["--synthetic-users", 10 ** 20], ["--synthetic-users 100000000000000000000", "2^57"]),
])
def test_a_run_no_machine_could_hold_is_refused_naming_the_option(tmp_path, args, needles):
    """--dim 9223372036854775807 started the run and stopped on numpy's "Maximum allowed
    dimension exceeded", naming neither the option nor the value: a run whose estimated
    memory exceeds what any 64-bit machine can address (2^57 bytes) is refused first."""
    out = tmp_path / "run"
    res = invoke("train", "--rounds", 2, *args, "--out", out)
    assert_refused(res, *needles)
    assert not out.exists()


def test_a_run_far_beyond_this_machines_memory_is_refused_naming_the_option(tmp_path,
                                                                          monkeypatch):
    """--synthetic-users 100000000 (2.6 TB by the estimate) started generating the data and
    was killed by the system for memory without a word: a run whose estimated memory is more
    than 4 times the machine's is refused first, naming the option. Here the machine is
    made 1 MB, so that a run of 200 users is such a run; a run within the limit starts."""
    from rfrs_ref.cli import train as train_cli

    monkeypatch.setattr(train_cli, "machine_memory", lambda: 1 << 20)
    out = tmp_path / "run"
    res = invoke("train", "--rounds", 1, "--synthetic-users", 200, "--out", out)
    assert_refused(res, "--synthetic-users 200", "more than 4 times this machine's memory",
                   "1.05e+06 bytes")
    assert not out.exists()
    monkeypatch.setattr(train_cli, "machine_memory", lambda: 1 << 40)
    res = invoke("train", "--rounds", 1, "--synthetic-users", 200, "--out", out)
    assert res.exit_code == 0, res.output


def test_a_mimic_index_no_round_can_reach_is_refused(tmp_path):
    """--mimic-index 99999 on a run of 10 clients a round ran to the end, every Byzantine
    client copying the last honest client of each round: ByzFL's Mimic raises for an index
    beyond its honest clients, and so does a run whose rounds never hold that many honest
    clients (an index some rounds cannot reach is still clamped, see docs/attacks.md)."""
    out = tmp_path / "run"
    res = invoke("train", *SMALL, "--rounds", 2, "--attack", "mimic", "--mimic-index", 99999,
                 "--byzantine-fraction", 0.2, "--out", out)
    assert_refused(res, "--mimic-index", "99999", "0..9", "10 clients")
    assert not out.exists()
    # the last index a round can reach runs
    res = invoke("train", *SMALL, "--rounds", 1, "--attack", "mimic", "--mimic-index", 9,
                 "--byzantine-fraction", 0.2, "--out", out)
    assert res.exit_code == 0, res.output
