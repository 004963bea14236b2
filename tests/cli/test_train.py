"""``rfrs-ref train`` through click's test runner."""

import json

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main

SMALL = ["--dataset", "synthetic", "--synthetic-users", "100", "--synthetic-items", "120",
         "--client-fraction", "0.1"]


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_train_writes_a_run_and_prints_the_table(tmp_path):
    res = run("train", *SMALL, "--rounds", "6", "--eval-every", "3", "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    for metric in ("Precision@K", "Recall@K", "NDCG@K", "HR@K", "MRR@K"):
        assert metric in res.output
    assert "model   popular" in res.output
    for k in range(1, 6):
        assert f"\n   {k}  " in res.output
    assert "popularity ranking on Precision@5" in res.output
    for name in ("config.json", "metrics.csv", "rounds.jsonl", "final_metrics.json", "state.npz"):
        assert (tmp_path / "r" / name).exists(), name
    cfg = json.loads((tmp_path / "r/config.json").read_text())["config"]
    assert cfg["dataset_params"]["n_users"] == 100


def test_options_reach_the_configuration(tmp_path):
    res = run("train", *SMALL, "--rounds", "2", "--out", str(tmp_path / "r"), "--optimizer", "momentum",
              "--beta3", "0.5", "--lr", "0.01", "--dim", "8", "--gamma", "0.5", "--negatives", "3",
              "--dtype", "float64", "--seed", "7", "--preset", "a-rfrs", "--krum-k", "1",
              "--attack", "noise", "--noise-sigma", "0.5", "--byzantine-fraction", "0.2", "--no-verify")
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "r/config.json").read_text())["config"]
    assert cfg["optimizer"] == "momentum" and cfg["optimizer_params"] == {"lr": 0.01, "beta3": 0.5}
    assert cfg["model_params"]["dim"] == 8 and cfg["model_params"]["gamma"] == 0.5
    assert cfg["model_params"]["negatives"] == 3 and cfg["dtype"] == "float64" and cfg["seed"] == 7
    assert (cfg["defense"], cfg["detect"]) == ("krum", "gradient")
    assert cfg["defense_params"]["k"] == 1
    assert cfg["attack"] == "noise" and cfg["attack_params"]["sigma"] == 0.5
    assert cfg["byzantine_fraction"] == 0.2 and cfg["verify"] is False


@pytest.mark.parametrize("args, message", [
    (["--krum-k", "1"], "--krum-k does not apply"),
    (["--optimizer", "sgd", "--beta1", "0.5"], "--beta1 does not apply"),
    (["--optimizer", "sgd", "--attack", "camouflage", "--byzantine-fraction", "0.2"], "Adam"),
    (["--ks", "1,x"], "comma-separated"),
])
def test_bad_configurations_are_reported(tmp_path, args, message):
    res = CliRunner().invoke(main, ["train", *SMALL, "--rounds", "1", "--out", str(tmp_path / "r"), *args])
    assert res.exit_code != 0
    assert message in res.output


def test_refuses_to_overwrite_a_run(tmp_path):
    assert run("train", *SMALL, "--rounds", "1", "--out", str(tmp_path / "r")).exit_code == 0
    res = CliRunner().invoke(main, ["train", *SMALL, "--rounds", "1", "--out", str(tmp_path / "r")])
    assert res.exit_code != 0 and "--resume" in res.output


def test_resume_of_a_finished_run_reprints_the_result(tmp_path):
    assert run("train", *SMALL, "--rounds", "4", "--eval-every", "2", "--out", str(tmp_path / "r")).exit_code == 0
    before = (tmp_path / "r/metrics.csv").read_text()
    res = run("train", "--resume", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r/metrics.csv").read_text() == before
    assert "already finished all 4 rounds; nothing to resume" in res.output
    assert "(0.0 s)" not in res.output and "after round 4," in res.output


def test_help_lists_generated_options():
    res = run("train", "--help")
    for opt in ("--beta1", "--krum-k", "--rfa-max-iter", "--noise-sigma", "--fallback",
                "--synthetic-users", "--preset", "--detect"):
        assert opt in res.output, opt


@pytest.mark.parametrize("defense", ["none", "krum", "median", "trmean", "rfa", "bulyan"])
@pytest.mark.parametrize("detect", ["gradient", "parameter"])
def test_every_defense_in_both_spaces_runs_end_to_end(tmp_path, defense, detect):
    # 12 of 120 clients per round, 20% Byzantine: f = 2, enough for Bulyan (n >= 4f + 3)
    res = run("train", *SMALL[:-2], "--synthetic-users", "120", "--client-fraction", "0.1",
              "--rounds", "3", "--eval-every", "3", "--out", str(tmp_path / "r"),
              "--defense", defense, "--detect", detect, "--attack", "ascent",
              "--byzantine-fraction", "0.2", "--resilience")
    assert res.exit_code == 0, res.output
    recs = [json.loads(x) for x in open(tmp_path / "r/rounds.jsonl")]
    assert all(r["f"] == 2 and "C_g" in r["resilience"] for r in recs)
    assert recs[-1]["resilience_cumulative"]["C_theta"] >= recs[-1]["resilience"]["C_theta"]
    assert "Byzantine share" in res.output and "resilience sums" in res.output


def test_an_interrupted_run_says_how_to_resume(tmp_path, monkeypatch):
    from rfrs_ref.federated.trainer import Trainer

    def interrupted(self, *a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "run", interrupted)
    out = tmp_path / "r"
    res = CliRunner().invoke(main, ["train", *SMALL, "--rounds", "2", "--out", str(out)])
    assert res.exit_code == 130, res.output
    assert f"rfrs-ref train --resume {out}" in res.output and "Traceback" not in res.output


def test_a_dataset_missing_without_network_is_said_once(tmp_path, monkeypatch):
    """The README's first command without the data and without network: one line naming the
    dataset, where it was looked for and what to do, each said once."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    monkeypatch.delenv("RFRS_DATA_DIR", raising=False)
    monkeypatch.setenv("RFRS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RFRS_DATA_MIRROR", f"http://127.0.0.1:{port}")
    res = CliRunner().invoke(main, ["train", "--dataset", "ml100k", "--out", str(tmp_path / "r")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    line = " ".join(res.output.split())
    assert line.startswith("Error: dataset 'ml100k'"), line
    assert line.count("dataset 'ml100k'") == 1 and line.count("rfrs-ref data fetch ml100k") == 1
    assert "RFRS_DATA_DIR" in line and "--data-dir" in line and ".;" not in line
    assert not (tmp_path / "r").exists()


def test_a_resume_in_a_shell_without_the_data_names_the_runs_folder(tmp_path, monkeypatch,
                                                                   ml100k_run_on_copied_data):
    """`train --resume` in a new shell, without the RFRS_DATA_DIR the run was started with:
    the folder the run read its data from is named, with the command that resumes."""
    data, out = ml100k_run_on_copied_data
    monkeypatch.delenv("RFRS_DATA_DIR")
    monkeypatch.setenv("RFRS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RFRS_DATA_MIRROR", "http://127.0.0.1:9")
    res = CliRunner().invoke(main, ["train", "--resume", str(out)])
    assert res.exit_code == 1 and "Traceback" not in res.output
    line = " ".join(res.output.split())
    assert f"The run read it from {data}: resume with RFRS_DATA_DIR={data} rfrs-ref train " \
           f"--resume {out}" in line, line
    monkeypatch.setenv("RFRS_DATA_DIR", str(data))
    res = CliRunner().invoke(main, ["train", "--resume", str(out)])
    assert res.exit_code == 0 and "nothing to resume" in res.output, res.output


def test_runs_started_in_the_same_second_get_a_directory_each(tmp_path, monkeypatch):
    """Without --out the run directory is runs/<time>-<dataset>, to the second: a second run
    started within it (a loop over seeds) was refused as 'in use' or 'already holds a run';
    it now gets runs/<time>-<dataset>-2. A run refused before it starts leaves no folder."""
    import pathlib

    from rfrs_ref.cli import train as train_cli

    monkeypatch.chdir(tmp_path)
    fixed = pathlib.Path("runs") / "20260101-120000-synthetic"
    monkeypatch.setattr(train_cli, "_default_run_dir", lambda dataset: fixed)
    for seed, name in ((0, fixed.name), (1, f"{fixed.name}-2")):
        res = run("train", *SMALL, "--rounds", "1", "--seed", str(seed))
        assert res.exit_code == 0, res.output
        assert f"results: runs/{name}" in res.output
        assert (tmp_path / "runs" / name / "final_metrics.json").is_file()
    res = CliRunner().invoke(main, ["train", *SMALL, "--rounds", "1", "--trace",
                                    str(fixed / "t.jsonl")])
    assert res.exit_code != 0 and "lies in the directory of another run" in res.output
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [fixed.name,
                                                                     f"{fixed.name}-2"]


def test_target_items_are_also_named_by_the_ids_recommend_prints(tmp_path):
    # the summary's target items are dense indices; where the dataset's own ids differ
    # (MovieLens: id - 1) it gives those too, so that they can be found in `recommend`
    import numpy as np

    out = tmp_path / "r"
    res = run("train", *SMALL, "--rounds", "2", "--attack", "a-ra", "--byzantine-fraction",
              "0.2", "--a-ra-targets", "3,7", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "target items [3, 7]: ER@1 " in res.output  # synthetic: ids are the indices
    np.savez(out / "ids.npz", user_ids=np.arange(100), item_ids=np.arange(120) + 1)
    res = run("train", "--resume", str(out))  # finished: shows its summary again
    assert res.exit_code == 0, res.output
    assert ("target items [3, 7] (dense indices; items [4, 8] in the dataset's files, as "
            "recommend prints them): ER@1 ") in res.output
