"""``rfrs-ref flower``: its options, and the refusals it makes before anything runs."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rfrs_ref.cli.main import main


def _run(*args):
    return CliRunner().invoke(main, ["flower", *args])


def test_the_group_lists_simulate_and_deploy():
    res = _run("--help")
    assert res.exit_code == 0
    assert "simulate" in res.output and "deploy" in res.output


def test_colluding_attacks_are_not_choices_and_are_refused_from_a_file(tmp_path):
    res = _run("simulate", "--attack", "alie", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "alie" in res.output
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"config": {"dataset": "synthetic", "attack": "ipm",
                                          "byzantine_fraction": 0.2}}))
    res = _run("simulate", "--config", str(cfg), "--out", str(tmp_path / "r"))
    assert res.exit_code == 1 and "colluding" in res.output
    assert not (tmp_path / "r").exists()


def test_a_config_file_excludes_the_options_it_would_contradict(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"dataset": "synthetic"}))
    res = _run("deploy", "--config", str(cfg), "--rounds", "3", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "drop --rounds" in res.output
    cfg.write_text("[1, 2")
    res = _run("deploy", "--config", str(cfg), "--out", str(tmp_path / "r"))
    assert res.exit_code == 1 and "not a training configuration" in res.output


def test_pre_aggregation_is_an_option_and_a_config_file_excludes_it(tmp_path):
    res = _run("simulate", "--help")
    assert res.exit_code == 0 and "--pre" in res.output and "nnm" in res.output
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"config": {"dataset": "synthetic"}}))
    res = _run("simulate", "--config", str(cfg), "--pre", "nnm", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "--pre" in res.output


def test_kill_node_must_name_a_node(tmp_path):
    res = _run("deploy", "--nodes", "2", "--kill-node", "2", "1", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "0..1" in res.output


def test_the_synthetic_datasets_options_as_in_train(tmp_path, monkeypatch):
    """--synthetic-users and the other dataset options reach the configuration; they are
    refused for another dataset and beside --config."""
    import rfrs_ref.flower.run as run_mod

    seen = {}

    def fake(config, out, **kw):
        seen["config"] = config
        raise RuntimeError("stopped before the federation")

    monkeypatch.setattr(run_mod, "simulate", fake, raising=False)
    res = _run("simulate", "--synthetic-users", "40", "--synthetic-items", "30",
               "--out", str(tmp_path / "r"))
    assert seen["config"].dataset_params == {"n_users": 40, "n_items": 30}, res.output
    res = _run("simulate", "--dataset", "ml100k", "--synthetic-users", "40", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "--synthetic-users does not apply" in res.output
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"dataset": "synthetic"}))
    res = _run("deploy", "--config", str(cfg), "--synthetic-users", "40", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "drop --synthetic-users" in res.output


def _fake_runs(monkeypatch) -> list:
    """The federation replaced by a stand-in that records that it was started."""
    import rfrs_ref.flower.deploy as deploy_mod
    import rfrs_ref.flower.run as run_mod

    started = []

    def fake(config, out, **kw):
        started.append(out)
        raise RuntimeError("stopped before the federation")

    monkeypatch.setattr(run_mod, "simulate", fake, raising=False)
    monkeypatch.setattr(deploy_mod, "deploy", fake, raising=False)
    return started


@pytest.mark.parametrize("command", ["simulate", "deploy"])
@pytest.mark.parametrize("where", ["sweep", "inside", "flower.json", "flower-logs"])
def test_out_is_refused_where_train_refuses_it_or_flower_files_are(tmp_path, monkeypatch,
                                                                   command, where):
    """--out RESULTS/runs/<key> (a sweep's run directory, which the sweep clears when that
    run starts again) or a folder inside a run's directory started the federation there,
    where `train --out` refuses both; a flower.json or flower-logs/ of the user's in --out
    was replaced when the run ended."""
    started = _fake_runs(monkeypatch)
    if where == "sweep":
        (tmp_path / "results.csv").write_text("key\n")
        out = tmp_path / "runs" / "0123456789abcdef"
        out.mkdir(parents=True)
    elif where == "inside":
        run = tmp_path / "run"
        run.mkdir()
        (run / "config.json").write_text("{}")
        (run / "metrics.csv").write_text("round\n")
        out = run / "flower"
    else:
        out = tmp_path / "mine"
        out.mkdir()
        if where == "flower.json":
            (out / where).write_text('{"mine": true}')
        else:
            (out / where).mkdir()
            (out / where / "notes.txt").write_text("mine")
    res = _run(command, "--out", str(out))
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "--out" in res.output, res.output
    assert started == []
    assert not (where == "inside" and out.exists())
    # a directory of the user's own files, none of them a run's, is taken as train takes it
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "notes.txt").write_text("mine")
    res = _run(command, "--out", str(fresh))
    assert started == [str(fresh)], res.output


@pytest.mark.parametrize("part, value", [("model", float("nan")), ("popularity", float("inf")),
                                         ("model", 1e300), ("model", None), ("popularity", "x")])
def test_the_summary_never_shows_a_metric_that_is_no_number_as_the_result(tmp_path, part, value):
    """simulate and deploy printed 'Precision@5 nan (popularity ...)', exit 0, from a final
    evaluation whose P@K was NaN (deploy reads it back from final_metrics.json)."""
    import click

    from rfrs_ref.cli.flower import _summary

    final = {"round": 3, "model": {"precision@1": 0.2, "precision@5": 0.1},
             "popularity": {"precision@1": 0.1, "precision@5": 0.05}}
    _summary(final, (1, 5), tmp_path)  # the sound one is shown
    final[part]["precision@5"] = value
    if value is None:
        del final[part]["precision@5"]
    with pytest.raises(click.ClickException) as err:
        _summary(final, (1, 5), tmp_path)
    msg = err.value.message
    assert str(tmp_path / "final_metrics.json") in msg and "precision@5" in msg, msg
    assert "not a finite number" in msg, msg
    with pytest.raises(click.ClickException):
        _summary(["not", "a", "record"], (1, 5), tmp_path)


def test_the_summary_of_a_sound_run(tmp_path, capsys):
    from rfrs_ref.cli.flower import _summary

    final = {"round": 3, "model": {"precision@5": 0.1}, "popularity": {"precision@5": 0.05}}
    _summary(final, (5,), tmp_path, how=" (9 s on 2 nodes)", after="; logs: L")
    assert capsys.readouterr().out == (f"after round 3 (9 s on 2 nodes): Precision@5 0.1000 "
                                       f"(popularity 0.0500); results: {tmp_path}; logs: L\n")


@pytest.mark.parametrize("command", ["simulate", "deploy"])
def test_a_refused_run_never_reports_the_divergence_of_the_run_already_there(tmp_path,
                                                                            monkeypatch, command):
    """--out holding a run that diverged earlier: the new run is refused (the trainer's
    RunExists, inside the federation), and the command says the run failed, not that it
    diverged at the old run's round."""
    import rfrs_ref.flower.deploy as deploy_mod
    import rfrs_ref.flower.run as run_mod

    out = tmp_path / "run"
    out.mkdir()
    (out / "final_metrics.json").write_text(json.dumps(
        {"status": "diverged", "round": 7, "reason": "non-finite scores",
         "what": "the scores of user 3"}))

    def refused(config, where, **kw):
        if command == "deploy":
            raise deploy_mod.DeploymentError("the run ended finished:failed; logs in /tmp/x")
        raise RuntimeError("the Flower simulation ended without finishing the run")

    monkeypatch.setattr(run_mod, "simulate", refused, raising=False)
    monkeypatch.setattr(deploy_mod, "deploy", refused, raising=False)
    res = _run(command, "--out", str(out))
    assert res.exit_code == 1, res.output
    assert "diverged at round 7" not in res.output and "ended" in res.output, res.output


def test_a_deployment_that_wrote_no_final_evaluation_never_shows_another_runs(tmp_path,
                                                                              monkeypatch):
    """A deployment that ends "completed" without this run writing final_metrics.json (the
    run was refused beside a finished one) never shows the old run's Precision as its own."""
    import rfrs_ref.flower.deploy as deploy_mod

    out = tmp_path / "run"
    out.mkdir()
    old = {"round": 5, "model": {"precision@5": 0.5}, "popularity": {"precision@5": 0.1}}
    (out / "final_metrics.json").write_text(json.dumps(old))
    monkeypatch.setattr(deploy_mod, "deploy", lambda config, where, **kw: {
        "run_dir": where, "seconds": 1.0, "logs": tmp_path / "logs", "killed": None,
        "process_groups": []}, raising=False)
    res = _run("deploy", "--out", str(out))
    assert res.exit_code == 1, res.output
    assert "wrote no" in res.output and "0.5000" not in res.output, res.output
