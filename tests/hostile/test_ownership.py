"""A run directory has one owner: no command reads, removes or writes in a directory that
another live process owns, and no command deletes or overwrites a file it did not write.

The attacks: a sweep worker on a run directory a `train --resume` holds, a stale lock
naming a dead process or another host, a user's directory (with a `.lock` of its own, an
`ids.npz`, a `valid_metrics.csv`) given as `--out`, `mechanism` and `plot` writing into a
directory a run or a sweep owns.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main
from rfrs_ref.files import LOCK_NAME

SMALL = ["--dataset", "synthetic", "--synthetic-users", "100", "--synthetic-items", "120",
         "--client-fraction", "0.1", "--backend", "numpy"]
TINY_SWEEP = textwrap.dedent('''
    [base]
    dataset = "synthetic"
    dataset_params = { n_users = 60, n_items = 40, mean_items = 8.0 }
    client_fraction = 0.2
    rounds = 2
    backend = "numpy"
''')
HOLD = ("import sys, time; from rfrs_ref.files import DirectoryLock; "
        "DirectoryLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(600)")


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error(res, *needles):
    """A non-zero exit with one ``Error:`` line holding every needle, no traceback."""
    assert res.exit_code not in (0, None), res.output
    assert "Traceback" not in res.output, res.output
    if res.exception is not None:
        assert isinstance(res.exception, SystemExit), repr(res.exception)
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, res.output
    for needle in needles:
        assert str(needle) in errors[0], (needle, errors[0])
    return errors[0]


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
def test_a_sweep_never_clears_a_run_directory_another_process_holds(tmp_path):
    from rfrs_ref.experiments.spec import load_sweep
    from rfrs_ref.experiments.sweep import run_sweep

    spec = tmp_path / "s.toml"
    spec.write_text(TINY_SWEEP)
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
