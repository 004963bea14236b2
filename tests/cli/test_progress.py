"""Progress on a terminal and in a log: durations, cadence, the compilation note."""

import re

import pytest

from click.testing import CliRunner

from rfrs_ref.cli.main import main
from rfrs_ref.cli.progress import Progress, duration

SMALL = ["--dataset", "synthetic", "--synthetic-users", "100", "--synthetic-items", "120",
         "--client-fraction", "0.1"]


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_durations_never_read_as_clock_times():
    assert duration(0) == "0s" and duration(59.4) == "59s" and duration(61) == "1m01s"
    assert duration(3 * 3600 + 5 * 60 + 7) == "3h05m"
    assert duration(-3) == "0s"
    # a clock time has two colons; a duration here has none
    assert ":" not in duration(19 * 3600 + 40 * 60 + 27)


def test_log_mode_prints_a_line_every_few_percent_with_the_remaining_duration(capsys):
    clock = FakeClock()
    p = Progress(200, label="round", first_note="the first round compiles the kernels",
                 tty=False, every_percent=10, every_s=1e9, clock=clock)
    clock.t += 30.0  # the first round: compilation
    p.update(1)
    for t in range(2, 201):
        clock.t += 0.5
        p.update(t, metric="P@5 0.1234" if t % 50 == 0 else None)
    p.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "the first round compiles the kernels"
    rounds = [int(re.match(r"round (\d+)/200", x).group(1)) for x in lines[1:]]
    # round 1, then every 20 rounds (10 %), on the multiples of 20
    assert rounds == [1, 20, 40, 60, 80, 100, 120, 140, 160, 180, 200]
    # the pace excludes the compiling first round: 0.5 s per round after it
    line = lines[2]  # round 20: 30 s + 19 × 0.5 s
    assert "elapsed 40s" in line and "remaining ~1m30s" in line, line
    assert "remaining" not in lines[-1] and "P@5 0.1234" in lines[-1]
    assert "elapsed 2m10s" in lines[-1]


def test_parallel_steps_estimate_from_the_elapsed_time_per_finished_step():
    """Two workers: runs of 100 s finish in pairs, 2 s apart. The pace between the two
    finishes of a pair (2 s) would promise the sweep's end far too early."""
    clock = FakeClock()
    p = Progress(10, label="run", tty=False, every_percent=1, every_s=1e9, clock=clock,
                 parallel=2)
    clock.t += 100.0
    p.update(1)
    assert p.remaining() is None  # half a wave finished
    clock.t += 2.0
    p.update(2)
    assert p.remaining() == pytest.approx(102.0 / 2 * 8)  # 8 runs, two at a time, ~100 s each
    assert "remaining ~6m48s" in p.status()


def test_log_mode_also_prints_every_minute():
    clock = FakeClock()
    out = []
    p = Progress(1000, tty=False, every_percent=50, every_s=60, clock=clock)
    import click

    orig = click.echo
    click.echo = lambda s="", **k: out.append(s)
    try:
        for t in range(1, 11):
            clock.t += 25.0
            p.update(t)
    finally:
        click.echo = orig
    # round 1 (the first), then whenever a minute has passed since the last line
    assert [int(re.match(r"round (\d+)", x).group(1)) for x in out] == [1, 4, 7, 10]


def test_train_in_a_log_announces_compilation_and_reports_rounds(tmp_path):
    res = CliRunner().invoke(main, ["train", *SMALL, "--rounds", "40", "--eval-every", "10",
                                    "--out", str(tmp_path / "r")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "the first round compiles the Numba kernels" in res.output
    lines = [x for x in res.output.splitlines() if re.match(r"round \d+/40 ", x)]
    assert 3 <= len(lines) <= 25
    assert lines[-1].startswith("round 40/40") and "P@5" in lines[-1]
    # a line between two evaluations says which round its P@5 is from
    assert all(re.search(r"P@5 [0-9.]+ \(round (10|20|30|40)\)", x) for x in lines if "P@5" in x)
    assert "(round 40)" in lines[-1]
    assert not re.search(r"\d\d:\d\d:\d\d", res.output)  # no clock-like ETA
    # the summary's elapsed time is the progress clock's: at least the last line's
    last = int(re.search(r"elapsed (\d+)s", lines[-1]).group(1))
    summary = float(re.search(r"after round 40 \(([\d.]+) s\)", res.output).group(1))
    assert summary >= last - 0.5


def test_resume_says_where_it_resumes(tmp_path):
    out = tmp_path / "r"
    res = CliRunner().invoke(main, ["train", *SMALL, "--rounds", "6", "--eval-every", "3",
                                    "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 0
    # cut the run back to its round-3 checkpoint, as an interruption would leave it
    import numpy as np

    from rfrs_ref.federated.trainer import Trainer, load_config

    trainer = Trainer(load_config(out))
    state, private = trainer.initial_state()
    from rfrs_ref.federated.trainer import RunDirectory, _Accumulators

    RunDirectory(out).save_checkpoint(state, private, 3, _Accumulators())
    (out / "final_metrics.json").unlink()
    res = CliRunner().invoke(main, ["train", "--resume", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"resuming {out} from round 3 of 6")
    assert np.load(out / "state.npz")["round"] == 6


def test_train_with_a_validation_split_reports_it(tmp_path):
    import json

    out = tmp_path / "v"
    res = CliRunner().invoke(main, ["train", *SMALL, "--rounds", "4", "--eval-every", "2",
                                    "--valid-fraction", "0.2", "--out", str(out)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "validation items (" in res.output
    rows = (out / "valid_metrics.csv").read_text().splitlines()
    assert rows[0] == (out / "metrics.csv").read_text().splitlines()[0]
    assert len(rows) == 1 + 3 * 5  # rounds 0, 2, 4 × K = 1..5
    final = json.loads((out / "final_metrics.json").read_text())
    assert final["valid"]["round"] == 4 and "ndcg@5" in final["valid"]["model"]
    assert json.loads((out / "config.json").read_text())["config"]["valid_fraction"] == 0.2
    res = CliRunner().invoke(main, ["train", *SMALL, "--valid-fraction", "0.8",
                                    "--out", str(tmp_path / "w")])
    assert res.exit_code == 2 and not (tmp_path / "w").exists()
