"""Attacks inside real training runs: the trainer, the round record, the CLI.

Small synthetic runs (60 clients, 15 sampled per round, 18 of them Byzantine
overall, f = 4) under every attack, with Krum in both detection spaces. The
round records' selection statistics are recomputed from their own raw fields
and from the trainer's Byzantine set; the run summary from the records.
"""

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from rfrs_ref.attack import ATTACKS
from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.round import run_round
from rfrs_ref.federated.trainer import Trainer

SMALL = {"n_users": 60, "n_items": 50, "mean_items": 8.0}
SMALL_CLI = ["--dataset", "synthetic", "--synthetic-users", "60", "--synthetic-items", "50",
             "--synthetic-mean-items", "8", "--dim", "4", "--client-fraction", "0.25",
             "--byzantine-fraction", "0.3"]


def config(attack, defense="krum", detect="gradient", rounds=5, **kw):
    return TrainConfig(dataset="synthetic", dataset_params=SMALL, model_params={"dim": 4},
                       rounds=rounds, client_fraction=0.25, byzantine_fraction=0.3,
                       attack=attack, defense=defense, detect=detect, eval_every=rounds, **kw)


def train(cfg):
    trainer = Trainer(cfg)
    records = []
    result = trainer.run(progress=lambda t, rec, latest: records.append(rec))
    return trainer, result, records


def check_selection_statistics(trainer, result, records):
    sampled = byz_sampled = 0
    kept_sum = byz_kept_sum = 0.0
    excluded_byz = 0
    for rec in records:
        clients = np.asarray(rec["clients"])
        byz = np.asarray(rec["byzantine"], dtype=bool)
        kept = np.asarray(rec["kept"])
        np.testing.assert_array_equal(byz, trainer.byzantine[clients])
        assert rec["n_byzantine_sampled"] == byz.sum()
        assert rec["n_byzantine_kept"] == (kept[byz] > 0).sum()
        assert rec["byzantine_share_sampled"] == pytest.approx(byz.mean())
        if kept.sum() > 0:
            assert rec["byzantine_share_kept"] == pytest.approx(kept[byz].sum() / kept.sum())
        excluded = {e["client"] for e in rec["excluded"]}
        for e in rec["excluded"]:
            assert e["byzantine"] == bool(trainer.byzantine[e["client"]])
        # an excluded client is never kept
        assert all(kept[i] == 0 for i, c in enumerate(clients) if c in excluded)
        sampled += byz.size
        byz_sampled += byz.sum()
        kept_sum += kept.sum()
        byz_kept_sum += kept[byz].sum()
        excluded_byz += sum(e["byzantine"] for e in rec["excluded"])
    sel = result.final["selection"]
    assert sel["byzantine_share_sampled"] == pytest.approx(byz_sampled / sampled)
    assert sel["byzantine_share_kept"] == pytest.approx(byz_kept_sum / kept_sum if kept_sum else 0.0)
    assert sel["excluded_byzantine"] == excluded_byz
    assert byz_sampled > 0


@pytest.mark.parametrize("detect", ["gradient", "parameter"])
@pytest.mark.parametrize("attack", ATTACKS.names())
def test_training_under_attack_with_krum(attack, detect):
    trainer, result, records = train(config(attack, "krum", detect))
    check_selection_statistics(trainer, result, records)
    assert len(records) == 5
    excluded = [e for rec in records for e in rec["excluded"]]
    if ATTACKS.get(attack).obeys_rule:
        # honest and rule-abiding uploads always pass verification
        assert excluded == []
    else:
        # every Byzantine upload of the noise attack is caught, and only those
        n_byz = sum(rec["n_byzantine_sampled"] for rec in records)
        assert len(excluded) == n_byz and all(e["byzantine"] for e in excluded)
        assert result.final["selection"]["byzantine_share_kept"] == 0.0
    for rec in records:
        diag = rec["attack"]
        if rec["n_byzantine_sampled"] == 0 or attack in ("none", "ascent"):
            assert diag == {}
        elif attack == "camouflage":
            assert len(diag["camouflaged_fraction_per_client"]) == rec["n_byzantine_sampled"]
            assert 0.0 <= diag["camouflaged_fraction"] <= 1.0
            if rec["round"] == 1:
                assert diag["camouflaged_fraction"] == 0.0
        elif attack == "alie":
            assert (diag["n"], diag["f"]) == (15, rec["n_byzantine_sampled"])
        elif attack == "noise":
            assert len(diag["noise_norm"]) == rec["n_byzantine_sampled"]
        elif attack == "ipm":
            assert diag["statistic_rows"] == rec["n_byzantine_sampled"]
    for rec in records:
        assert all(np.isfinite(v) for v in rec["state_norms"].values())
    if attack == "camouflage":
        assert max(r["attack"].get("camouflaged_fraction", 0.0) for r in records) > 0.0


def test_coordinatewise_defence_and_sgd_under_attack():
    for attack in ("ascent", "alie", "ipm", "noise"):
        trainer, result, records = train(config(attack, "trmean", "parameter", rounds=3,
                                                optimizer="sgd"))
        check_selection_statistics(trainer, result, records)
        # SGD uploads θ alone: nothing to verify, nothing excluded
        assert all(rec["excluded"] == [] for rec in records)


def test_camouflage_is_invisible_in_parameter_space_within_a_round():
    # the same round on the same state, with and without camouflage: Krum on
    # θᵢ − θ̄ keeps the same clients and the new θ̄ is the same to rounding, while
    # the aggregated moments are poisoned and the recovered gradients moved
    trainer = Trainer(config("none", "krum", "parameter", rounds=3, dtype="float64"))
    result = trainer.run()
    state = result.state
    buf = trainer.buffers()
    fed = trainer.federation
    t = 4
    plain_state, plain = run_round(fed, state, t, buf)
    fed_cam = dataclasses.replace(fed, attack=ATTACKS.get("camouflage")())
    cam_state, cam = run_round(fed_cam, state, t, buf)
    assert cam["n_byzantine_sampled"] > 0 and cam["attack"]["camouflaged_fraction"] > 0.01
    assert cam["kept"] == plain["kept"]
    np.testing.assert_allclose(cam_state["theta"], plain_state["theta"], rtol=0, atol=1e-14)
    assert np.abs(cam_state["m"] - plain_state["m"]).max() > 1e-3 * np.abs(plain_state["m"]).max()
    assert cam["excluded"] == []


def test_cli_train_under_camouflage(tmp_path):
    from rfrs_ref.cli.main import main

    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["train", *SMALL_CLI, "--rounds", "3", "--attack", "camouflage",
                                    "--camouflage-include-eps", "false", "--preset", "krum",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "Byzantine share:" in res.output and "of kept clients" in res.output
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["attack"] == "camouflage" and cfg["attack_params"] == {"include_eps": False}
    records = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2, 3]
    assert any("camouflaged_fraction" in r["attack"] for r in records)
    final = json.loads((out / "final_metrics.json").read_text())
    assert set(final["selection"]) >= {"byzantine_share_sampled", "byzantine_share_kept"}


def test_cli_noise_sigma_option(tmp_path):
    from rfrs_ref.cli.main import main

    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["train", *SMALL_CLI, "--rounds", "2", "--attack", "noise",
                                    "--noise-sigma", "0.5", "--out", str(out)])
    assert res.exit_code == 0, res.output
    cfg = json.loads((out / "config.json").read_text())["config"]
    assert cfg["attack_params"] == {"sigma": 0.5}
    records = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert all(r["attack"]["sigma"] == 0.5 for r in records if r["n_byzantine_sampled"])


def test_cli_rejects_an_option_of_another_attack(tmp_path):
    from rfrs_ref.cli.main import main

    res = CliRunner().invoke(main, ["train", *SMALL_CLI, "--rounds", "1", "--attack", "ipm",
                                    "--noise-sigma", "0.5", "--out", str(tmp_path / "r")])
    assert res.exit_code != 0
    assert "--noise-sigma does not apply to attack 'ipm'" in res.output


def test_cli_camouflage_with_sgd_fails_clearly(tmp_path):
    from rfrs_ref.cli.main import main

    res = CliRunner().invoke(main, ["train", *SMALL_CLI, "--rounds", "2", "--optimizer", "sgd",
                                    "--attack", "camouflage", "--out", str(tmp_path / "r")])
    assert res.exit_code != 0
    assert "applies to optimiser(s) adam only, got optimiser 'sgd'" in res.output
