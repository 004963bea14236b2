"""Hostile input to the ranking metrics: K outside 1..n_items, non-finite scores.

The Numba ranking kernel must never be reached with such input (K = 0 once
crashed the process), and the command line answers with one line.
"""

import numpy as np
import pytest
from click.testing import CliRunner

import rfrs_ref.metrics as metrics
from rfrs_ref.data.base import Interactions


def _case():
    train = Interactions.from_lists("t", 6, [[0], [1, 2]])
    test = Interactions.from_lists("t", 6, [[2, 5], [3]])
    scores = np.arange(12, dtype=np.float64).reshape(2, 6)
    return train, test, scores


def _no_kernel(monkeypatch):
    def boom(*args):
        raise AssertionError("the ranking kernel was reached")

    monkeypatch.setattr(metrics, "topk_numba", boom)
    monkeypatch.setattr(metrics, "topk_numpy", boom)


@pytest.mark.parametrize("ks", [(0,), (0, 5), (-1,), (7,), (1, 7), (), (2.0,), (True,), ("3",)])
def test_invalid_k_is_rejected_before_the_kernel(monkeypatch, ks):
    train, test, scores = _case()
    _no_kernel(monkeypatch)
    with pytest.raises(ValueError, match=r"K must be an integer in 1\.\.6|ks is empty"):
        metrics.rank_metrics(lambda u: scores[u], train, test, np.array([0, 1]), ks)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_non_finite_scores_are_rejected(monkeypatch, bad, backend):
    train, test, scores = _case()
    scores = scores.copy()
    scores[1, 4] = bad
    _no_kernel(monkeypatch)
    with pytest.raises(ValueError, match="user 1 hold NaN or infinity"):
        metrics.rank_metrics(lambda u: scores[u], train, test, np.array([0, 1]), (1, 2),
                             backend=backend)


def test_k_equal_to_n_items_is_valid():
    train, test, scores = _case()
    m = metrics.rank_metrics(lambda u: scores[u], train, test, np.array([0, 1]), (6,))
    # every candidate is ranked: every test item is found
    assert m.recall == (1.0,) and m.hr == (1.0,)


@pytest.mark.parametrize("ks, code, message", [
    ("0", 2, "K must be integers 1..n_items"),
    ("0,5", 2, "K must be integers 1..n_items"),
    ("-1", 2, "K must be integers 1..n_items"),
    ("1,x", 2, "not a comma-separated list of integers"),
    ("5,5,1", 2, "names a K twice"),
    ("1,1001", 1, "K must be an integer in 1..1000"),
])
def test_cli_rejects_invalid_k_in_one_line_and_writes_nothing(tmp_path, ks, code, message):
    from rfrs_ref.cli.main import main

    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["train", "--ks", ks, "--rounds", "2", "--out", str(out)])
    assert res.exit_code == code, res.output
    assert message in res.output
    assert "Traceback" not in res.output and res.exception is None or isinstance(
        res.exception, SystemExit)
    assert not out.exists()
