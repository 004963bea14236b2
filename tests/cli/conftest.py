"""Fixtures of the command-line tests."""

from __future__ import annotations

import os
import shutil

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main


@pytest.fixture
def ml100k_run_on_copied_data(tmp_path, monkeypatch, data_dir):
    """(data, out): ML100K copied to ``tmp_path/data``, RFRS_DATA_DIR pointing at it, and a
    2-round run trained from it into ``tmp_path/run`` (for tests that then leave the
    shell without the variable)."""
    src = os.path.join(str(data_dir), "ml-100k")
    if not os.path.isdir(src):
        pytest.skip("ml100k not available")
    data = tmp_path / "data"
    shutil.copytree(src, data / "ml-100k")
    monkeypatch.setenv("RFRS_DATA_DIR", str(data))
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["train", "--dataset", "ml100k", "--rounds", "2",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    return data, out
