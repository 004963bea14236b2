"""A rule with state (centered clipping): the trainer keeps its centre with the
server state and in checkpoints, so a resumed run is the uninterrupted one."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.trainer import CheckpointError, Trainer, train

SMALL = dict(n_users=120, n_items=150, n_clusters=4, mean_items=12.0)


def cfg(**kw):
    base = dict(dataset="synthetic", dataset_params=SMALL, rounds=6, eval_every=3,
                client_fraction=0.1, attack="ascent", byzantine_fraction=0.2, defense="cc",
                defense_params={"tau": 0.05})
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("detect", ["gradient", "parameter"])
@pytest.mark.parametrize("pre", [(), ("nnm",)])
def test_resume_continues_the_centre_bit_for_bit(tmp_path, detect, pre):
    c = cfg(detect=detect, pre=pre)
    full = train(c, tmp_path / "full")
    assert set(full.state) == {"theta", "m", "v", "cc_center"}
    assert full.state["cc_center"].dtype == np.float64 and np.isfinite(full.state["cc_center"]).all()
    Trainer(dataclasses.replace(c, rounds=3)).run(tmp_path / "part")
    rec = json.loads((tmp_path / "part/config.json").read_text())
    rec["config"]["rounds"] = 6
    (tmp_path / "part/config.json").write_text(json.dumps(rec))
    done = Trainer(c).run(tmp_path / "part", resume=True)
    for k in full.state:
        assert done.state[k].tobytes() == full.state[k].tobytes(), k
    recs = [json.loads(x) for x in open(tmp_path / "full/rounds.jsonl")]
    assert all(r["rule"]["rule"] == "cc" and 0 <= r["rule"]["center_weight"] <= 1 for r in recs)


def test_the_centre_moves_the_run(tmp_path):
    a = train(cfg(rounds=2, eval_every=2), tmp_path / "a")
    b = train(cfg(rounds=2, eval_every=2, defense_params={"tau": 1e6}), tmp_path / "b")
    assert a.state["theta"].tobytes() != b.state["theta"].tobytes()


def test_a_checkpoint_without_the_centre_is_refused(tmp_path):
    train(cfg(defense="krum", defense_params={}, rounds=2, eval_every=1), tmp_path / "run")
    rec = json.loads((tmp_path / "run/config.json").read_text())
    with pytest.raises(CheckpointError, match="cc_center"):
        out_cfg = cfg(rounds=2, eval_every=1)
        t = Trainer(out_cfg)
        from rfrs_ref.federated.trainer import RunDirectory

        RunDirectory(tmp_path / "run").load_checkpoint(t)
    assert rec["config"]["defense"] == "krum"


@pytest.mark.parametrize("detect", ["gradient", "parameter"])
def test_cli_runs_cc(tmp_path, detect):
    from click.testing import CliRunner

    from rfrs_ref.cli.main import main

    res = CliRunner().invoke(main, [
        "train", "--dataset", "synthetic", "--synthetic-users", "100", "--synthetic-items", "120",
        "--client-fraction", "0.1", "--rounds", "2", "--eval-every", "2", "--defense", "cc",
        "--cc-tau", "0.1", "--cc-iterations", "2", "--detect", detect, "--attack", "ascent",
        "--byzantine-fraction", "0.2", "--out", str(tmp_path / "r")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    c = json.loads((tmp_path / "r/config.json").read_text())["config"]
    assert c["defense_params"] == {"tau": 0.1, "iterations": 2}
    with np.load(tmp_path / "r/state.npz") as z:
        assert "cc_center" in z.files
