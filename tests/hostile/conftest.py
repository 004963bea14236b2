"""Shared checks of the hostile-input tests."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main

#: a small training run of the CLI (synthetic data, NumPy backend)
SMALL = ["--dataset", "synthetic", "--synthetic-users", "100", "--synthetic-items", "120",
         "--client-fraction", "0.1", "--backend", "numpy"]
#: a one-configuration sweep that runs in well under a second per run
TINY_SWEEP = """[base]
dataset = "synthetic"
dataset_params = { n_users = 60, n_items = 40, mean_items = 8.0 }
client_fraction = 0.2
rounds = 2
backend = "numpy"
"""


def _refused(res, *fragments, never: str | None = None) -> str:
    """A command's refusal: a non-zero exit without a traceback, exactly one ``Error`` line
    naming every fragment, and (``never``) none of a success's output."""
    assert res.exit_code != 0, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    if never is not None:
        assert never not in res.output, res.output
    errors = [x for x in res.output.splitlines() if x.startswith("Error")]
    assert len(errors) == 1, res.output
    for frag in fragments:
        assert str(frag) in errors[0], (frag, errors[0])
    return errors[0]


@pytest.fixture
def refused():
    """``refused(result, *fragments, never=...)``: see :func:`_refused`."""
    return _refused


@pytest.fixture(scope="session")
def tiny_sweep():
    """The TOML of a one-configuration sweep that runs in well under a second per run
    (synthetic, 2 rounds, NumPy backend), one trial."""
    return TINY_SWEEP


@pytest.fixture(scope="session")
def train_finished(tmp_path_factory):
    """``train_finished(*options)``: the directory of a finished 4-round run of ``rfrs-ref
    train OPTIONS`` (checkpoints at rounds 2 and 4); read only."""
    def make(*options):
        d = tmp_path_factory.mktemp("finished") / "run"
        res = CliRunner().invoke(main, [str(a) for a in ("train", *options, "--rounds", 4,
                                                         "--eval-every", 2, "--out", d)])
        assert res.exit_code == 0, res.output
        return d
    return make


@pytest.fixture(scope="module")
def finished(train_finished):
    """A finished 4-round run on the NumPy backend (:data:`SMALL`); tests change
    :func:`run_copy`."""
    return train_finished(*SMALL)


@pytest.fixture
def run_copy(finished, tmp_path):
    """A copy of :func:`finished`, afresh per test."""
    d = tmp_path / "run"
    shutil.copytree(finished, d)
    return d


@pytest.fixture(scope="session")
def finished_sweep(tmp_path_factory):
    """A finished 2-trial sweep of :data:`TINY_SWEEP`: ``DIR/s.toml`` and its results in
    ``DIR/out``; read only (copy it to change it)."""
    from rfrs_ref.experiments.spec import load_sweep
    from rfrs_ref.experiments.sweep import run_sweep

    d = tmp_path_factory.mktemp("tiny-sweep")
    (d / "s.toml").write_text(TINY_SWEEP.replace("[base]", "trials = 2\n[base]"))
    run_sweep(load_sweep(d / "s.toml").runs, d / "out", workers=0)
    return d
