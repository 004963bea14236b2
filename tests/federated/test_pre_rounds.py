"""Pre-aggregators in training runs: configuration, round records, resume, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main
from rfrs_ref.experiments.spec import make_config, run_key, RunSpec
from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.trainer import Trainer, train

SMALL = dict(n_users=120, n_items=150, n_clusters=4, mean_items=12.0)


def cfg(**kw):
    base = dict(dataset="synthetic", dataset_params=SMALL, rounds=4, eval_every=2,
                client_fraction=0.1, attack="ascent", byzantine_fraction=0.2, dtype="float64")
    base.update(kw)
    return TrainConfig(**base)


def test_configuration_resolves_checks_and_round_trips():
    c = cfg(pre=("clip", "nnm"), pre_params={"clip_norm": 0.5}).resolved()
    assert c.pre == ("clip", "nnm") and c.pre_params == {"clip_norm": 0.5}
    assert TrainConfig.from_json(json.loads(c.dumps())) == c
    c = cfg(pre=["bucketing"]).resolved()
    assert c.pre_params == {"bucket_size": 2}
    # no pre-aggregator: the JSON (and every run key hashed from it) is what it was
    assert "pre" not in cfg().resolved().to_json()
    with pytest.raises(ValueError, match="'clip_norm' is not a hyperparameter of nnm"):
        cfg(pre=("nnm",), pre_params={"clip_norm": 1.0}).resolved()
    with pytest.raises(KeyError, match="unknown pre-aggregator 'nmm'"):
        cfg(pre=("nmm",)).resolved()
    with pytest.raises(ValueError, match="clip_norm must be a finite number > 0"):
        cfg(pre=("clip",), pre_params={"clip_norm": -1.0}).resolved()


def test_sweep_fields():
    c = make_config({"pre": ["arc", "nnm"], "defense": "krum"})
    assert c.pre == ("arc", "nnm")
    assert RunSpec(c).key != RunSpec(make_config({"defense": "krum"})).key
    with pytest.raises(ValueError, match="pre must be a list of pre-aggregator names"):
        make_config({"pre": ["median"]})
    from rfrs_ref.experiments.spec import check_params

    with pytest.raises(ValueError, match="has no hyperparameter 'bucket_size'"):
        check_params({"pre": ["clip"], "pre_params": {"bucket_size": 3}})
    check_params({"pre": ["bucketing"], "pre_params": {"bucket_size": 3}})


@pytest.mark.parametrize("detect", ["gradient", "parameter"])
@pytest.mark.parametrize("pre", [("nnm",), ("bucketing",), ("clip",), ("arc",), ("clip", "nnm")])
def test_runs_record_the_pre_aggregation(tmp_path, pre, detect):
    res = train(cfg(pre=pre, defense="median", detect=detect, pre_params=(
        {"clip_norm": 0.05} if "clip" in pre else {})), tmp_path / "r")
    recs = [json.loads(x) for x in open(tmp_path / "r/rounds.jsonl")]
    assert all([p["name"] for p in r["rule"]["pre"]] == list(pre) for r in recs)
    assert all(np.isfinite(v).all() for v in res.state.values())
    assert (res.state["v"] >= 0).all()


def test_bucketing_runs_repeat_and_resume_bit_for_bit(tmp_path):
    c = cfg(pre=("bucketing", "nnm"), defense="krum", defense_params={"fallback": "reduce-f"},
            rounds=6, eval_every=3)
    a = train(c, tmp_path / "a")
    b = train(c, tmp_path / "b")
    for k in a.state:
        assert a.state[k].tobytes() == b.state[k].tobytes()
    t = Trainer(c.resolved())
    part = Trainer(dataclasses_replace(c, rounds=3))
    part.run(tmp_path / "c")
    # the resumed run continues from round 3's checkpoint with the configuration of 6 rounds
    cfg_path = tmp_path / "c" / "config.json"
    rec = json.loads(cfg_path.read_text())
    rec["config"]["rounds"] = 6
    cfg_path.write_text(json.dumps(rec))
    done = t.run(tmp_path / "c", resume=True)
    for k in a.state:
        assert done.state[k].tobytes() == a.state[k].tobytes()


def dataclasses_replace(c, **kw):
    import dataclasses

    return dataclasses.replace(c, **kw)


def test_cli(tmp_path):
    args = ["train", "--dataset", "synthetic", "--synthetic-users", "100", "--synthetic-items", "120",
            "--client-fraction", "0.1", "--rounds", "2", "--eval-every", "2", "--defense", "krum",
            "--pre", "clip", "--pre", "nnm", "--clip-norm", "0.5", "--out", str(tmp_path / "r")]
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "defense clip then nnm then krum" in res.output
    c = json.loads((tmp_path / "r/config.json").read_text())["config"]
    assert c["pre"] == ["clip", "nnm"] and c["pre_params"] == {"clip_norm": 0.5}
    res = CliRunner().invoke(main, ["train", "--resume", str(tmp_path / "r"), "--pre", "nnm"])
    assert res.exit_code != 0 and "--pre" in res.output
    res = CliRunner().invoke(main, args[:-2] + ["--bucket-size", "3", "--out", str(tmp_path / "s")])
    assert res.exit_code != 0 and "--bucket-size applies to --pre bucketing" in res.output
    res = CliRunner().invoke(main, ["train", "--help"])
    assert "--pre [nnm|bucketing|clip|arc]" in res.output and "--clip-norm" in res.output
