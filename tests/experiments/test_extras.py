"""A plain ``pip install .`` (no Dask, no pyarrow): sweeps run in process, tables are CSV,
and asking for Dask is a one-line error before anything is written."""

from __future__ import annotations

import textwrap

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main


@pytest.fixture
def plain_install(monkeypatch):
    """Neither distributed nor pyarrow, as after `pip install .`."""
    from rfrs_ref.experiments import results, sweep

    monkeypatch.setattr(sweep, "dask_available", lambda: False)
    monkeypatch.setattr(results, "parquet_available", lambda: False)

    def no_parquet(*a, **k):
        raise ImportError("Unable to find a usable engine; tried using: 'pyarrow', 'fastparquet'")

    import pandas as pd

    monkeypatch.setattr(pd.DataFrame, "to_parquet", no_parquet)
    monkeypatch.setattr(pd, "read_parquet", no_parquet)


def _sweep_file(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(textwrap.dedent('''
        trials = 1
        [base]
        dataset = "synthetic"
        dataset_params = { n_users = 200, n_items = 100, mean_items = 12.0 }
        client_fraction = 0.1
        rounds = 2
        [axes]
        byzantine_fraction = [0.0, 0.2]
    '''))
    return spec


def test_sweep_without_dask_runs_in_process_and_writes_csv(plain_install, tmp_path):
    out = tmp_path / "o"
    res = CliRunner().invoke(main, ["sweep", str(_sweep_file(tmp_path)), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "Dask is not installed" in res.output and "on this process" in res.output
    assert "2 finished, 0 failed" in res.output
    assert (out / "results.csv").exists() and not (out / "results.parquet").exists()
    assert "results.parquet" not in res.output
    # every reader accepts the CSV table
    res = CliRunner().invoke(main, ["plot", str(out), "--figure", "3", "--out", str(tmp_path / "f")])
    assert "Unable to find a usable engine" not in res.output


@pytest.mark.parametrize("extra", [["--workers", "2"], ["--scheduler", "tcp://127.0.0.1:1"]])
def test_asking_for_dask_without_it_is_one_line_and_writes_nothing(plain_install, tmp_path,
                                                                    extra):
    out = tmp_path / "o"
    res = CliRunner().invoke(main, ["sweep", str(_sweep_file(tmp_path)), "--out", str(out),
                                    *extra])
    assert res.exit_code == 2
    assert "pip install 'rfrs-ref[distributed]'" in res.output and "--workers 0" in res.output
    assert "Traceback" not in res.output
    assert not out.exists()


def test_reproduce_without_extras_writes_nothing_before_it_can_run(plain_install, tmp_path):
    out = tmp_path / "fig"
    res = CliRunner().invoke(main, ["reproduce", "1", "--quick", "--workers", "3",
                                    "--out", str(out)])
    assert res.exit_code == 2 and "rfrs-ref[distributed]" in res.output
    assert not out.exists()


def test_reproduce_announces_the_runs_it_makes(tmp_path):
    # the header states what will run, not the full figure's plan
    from rfrs_ref.cli.experiments import reproduce

    res = CliRunner().invoke(reproduce, ["10", "--quick", "--datasets", "synthetic", "--rounds",
                                         "3", "--trials", "1", "--set", "client_fraction=0.1",
                                         "--set", 'dataset_params={"n_users": 200, "n_items": '
                                         '100, "mean_items": 12.0}', "--workers", "0",
                                         "--no-plot", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "2 runs: synthetic 3 rounds; 1 trial ->" in res.output
    assert "DEFAULT_ROUNDS" not in res.output and "all four" not in res.output
    for metric in ("Precision@", "NDCG@", "HR@", "MRR@"):
        assert metric in res.output
    assert "| popularity |" in res.output
