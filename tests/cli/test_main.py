"""The command group: errors every subcommand shares."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import LazyGroup, main
from rfrs_ref.data.errors import DatasetFormatError, DatasetNotFoundError, DownloadError


@pytest.mark.parametrize("error", [
    DownloadError("dataset 'ml100k' (u.data) was not found in: /x; and downloading it\nfailed",
                  url="https://files.grouplens.org/datasets/movielens/ml-100k.zip"),
    DatasetNotFoundError("dataset 'lastfm' was not found"),
    DatasetFormatError("/data/ml-100k/u.data", 7, "4 fields", "3"),
])
def test_a_dataset_error_in_any_command_is_one_line(monkeypatch, error):
    """mechanism, recommend and flower simulate used to print a 35-frame traceback for a
    missing dataset, where train printed one line."""

    @click.command("fake")
    def fake():
        raise error

    original = LazyGroup.get_command
    monkeypatch.setattr(LazyGroup, "get_command", lambda self, ctx, name: (
        fake if name == "fake" else original(self, ctx, name)))
    res = CliRunner().invoke(main, ["fake"])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and str(error).split()[0] in lines[0]
