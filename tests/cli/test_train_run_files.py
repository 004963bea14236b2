"""``rfrs-ref train`` and ``--resume`` on run directories whose files are not what a run
wrote: a FIFO at a run file's name, a validation table missing or a link to nowhere, an
initial model whose scores overflow. Each is one ``Error:`` line naming the file or the
option, never a hang, never a write outside the run directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main

SMALL = ["--dataset", "synthetic", "--synthetic-users", "100", "--synthetic-items", "120",
         "--client-fraction", "0.1", "--backend", "numpy"]
# -P keeps the repository root off sys.path, so the installed package is imported
CLI = [sys.executable, "-P", "-c", "from rfrs_ref.cli.main import main; main()"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error(output: str, *needles) -> str:
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, output
    for needle in needles:
        assert str(needle) in errors[0], (needle, errors[0])
    return errors[0]


def files(directory):
    return {p.name: (p.read_bytes() if p.is_file() and not p.is_symlink() else os.readlink(p)
                     if p.is_symlink() else "?")
            for p in sorted(directory.iterdir()) if p.name != ".lock"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-round run (checkpoints at rounds 2 and 4) with a validation split."""
    d = tmp_path_factory.mktemp("finished") / "run"
    res = invoke("train", *SMALL, "--rounds", 4, "--eval-every", 2, "--valid-fraction", 0.2,
                 "--out", d)
    assert res.exit_code == 0, res.output
    return d


@pytest.fixture
def interrupted(cut_back):
    """``interrupted(finished, where)``: a copy of ``finished`` cut back to its round-2
    checkpoint (as if killed after it)."""
    def copy(finished, where):
        run = where / "run"
        shutil.copytree(finished, run)
        return cut_back(run, 2)
    return copy


# -- a FIFO at a run file's name -------------------------------------------------------------------
@pytest.mark.parametrize("state", ["finished", "interrupted"])
@pytest.mark.parametrize("name", ["checkpoint.npz", "final_metrics.json", "state.npz",
                                  "metrics.csv", "rounds.jsonl", "valid_metrics.csv"])
def test_resume_never_waits_on_a_fifo_at_a_run_files_name(finished, tmp_path, state, name,
                                                           interrupted):
    # opening a FIFO for reading waits for a writer: `train --resume` hung for ever on one
    if state == "finished":
        run = tmp_path / "run"
        shutil.copytree(finished, run)
    else:
        run = interrupted(finished, tmp_path)
    (run / name).unlink(missing_ok=True)  # an interrupted run has no final_metrics.json
    os.mkfifo(run / name)
    before = files(run)
    try:
        res = subprocess.run([*CLI, "train", "--resume", str(run)], capture_output=True,
                             text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"train --resume waited on the FIFO {name}")
    assert res.returncode != 0, res.stdout + res.stderr
    one_error(res.stderr, run / name, "not a regular file")
    assert files(run) == before


def test_a_new_run_never_waits_on_a_fifo_at_a_run_files_name(tmp_path):
    # a directory holding metrics.csv and a FIFO named config.json: the new run read
    # config.json to compare configurations, and waited for a writer for ever
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.csv").write_text("round,k\n")
    os.mkfifo(out / "config.json")
    before = files(out)
    try:
        res = subprocess.run([*CLI, "train", *SMALL, "--rounds", "2", "--out", str(out)],
                             capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("train --out waited on the FIFO config.json")
    assert res.returncode != 0, res.stdout + res.stderr
    one_error(res.stderr, out / "config.json", "not a regular file")
    assert files(out) == before


# -- the validation table of a run with a validation split -----------------------------------------
@pytest.mark.parametrize("how", ["missing", "link to nowhere"])
def test_resume_needs_the_validation_table_of_a_run_with_a_validation_split(finished, tmp_path,
                                                                              interrupted, how):
    # without it the run went on and began a new table of the rounds after the checkpoint
    # only (a record that lacks the evaluations before it), and through a link to nowhere it
    # created that table outside the run directory
    run = interrupted(finished, tmp_path)
    (run / "valid_metrics.csv").unlink()
    outside = tmp_path / "outside"
    outside.mkdir()
    if how == "link to nowhere":
        (run / "valid_metrics.csv").symlink_to(outside / "planted.csv")
    before = files(run)
    res = invoke("train", "--resume", run)
    assert res.exit_code != 0, res.output
    one_error(res.output, run / "valid_metrics.csv", "validation split")
    assert files(run) == before
    assert list(outside.iterdir()) == []


# -- an initial model whose scores overflow -----------------------------------------------------
def test_an_initial_scale_whose_scores_overflow_is_a_configuration_error_writing_nothing(tmp_path):
    # θ̄⁰ of scale 1e30 is finite in float32, but its scores are not: the run wrote its
    # config.json, ids.npz and empty tables, and said "the model diverged" before any round
    out = tmp_path / "out"
    res = invoke("train", *SMALL, "--rounds", 2, "--init-scale", "1e30", "--out", out)
    assert res.exit_code != 0, res.output
    line = one_error(res.output, "init_scale", "1e+30")
    assert "diverged" not in line, line
    assert not out.exists()


def test_an_initial_scale_whose_scores_overflow_is_no_divergence_in_a_sweep(tmp_path):
    from rfrs_ref.experiments.results import divergence_of
    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.trainer import Diverged, Trainer

    config = TrainConfig(dataset="synthetic", dataset_params=dict(n_users=100, n_items=120),
                         client_fraction=0.1, rounds=2, init_scale=1e30, backend="numpy")
    with pytest.raises(ValueError) as caught:
        Trainer(config).run(tmp_path / "run")
    assert not isinstance(caught.value, Diverged)
    assert not (tmp_path / "run").exists() or list((tmp_path / "run").iterdir()) == []
    # a sweep records the error as its message: a failure (a configuration error), never
    # read back as a run that diverged
    error = f"{type(caught.value).__name__}: {caught.value}"
    assert divergence_of({"status": "failed", "error": error}) is None
