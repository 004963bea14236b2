"""``rfrs-ref train`` with the rules cc, caf and smea and the pre-aggregators, in both
detection spaces."""

import json

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main

SMALL = ["--dataset", "synthetic", "--synthetic-users", "100", "--synthetic-items", "120",
         "--client-fraction", "0.1", "--rounds", "2", "--eval-every", "2"]


@pytest.mark.parametrize("defense, pre", [("caf", []), ("smea", []), ("cc", ["arc"]),
                                          ("caf", ["nnm"]), ("smea", ["bucketing"])])
@pytest.mark.parametrize("detect", ["gradient", "parameter"])
def test_runs_end_to_end(tmp_path, defense, pre, detect):
    args = ["train", *SMALL, "--defense", defense, "--detect", detect, "--attack", "ascent",
            "--byzantine-fraction", "0.2", "--out", str(tmp_path / "r")]
    for p in pre:
        args += ["--pre", p]
    if "bucketing" in pre:
        args += ["--bucket-size", "1"]  # a shuffle: 10 rows stay 10, f = 2
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    recs = [json.loads(x) for x in open(tmp_path / "r/rounds.jsonl")]
    assert all(r["rule"]["rule"] == defense for r in recs)
    assert all([p["name"] for p in r["rule"].get("pre", [])] == pre for r in recs)


def test_help_lists_the_new_rules_and_options():
    res = CliRunner().invoke(main, ["train", "--help"])
    for text in ("cc", "caf", "smea", "--cc-tau", "--cc-iterations", "--smea-max-subsets", "--pre",
                 "--bucket-size", "--clip-norm"):
        assert text in res.output, text
