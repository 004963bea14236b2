"""The Flower ServerApp and ClientApp, talking through an in-process grid (no Ray).

The apps are the real ones; only the transport is :class:`DirectGrid`
(conftest.py), which lets a test kill a node or rewrite a reply.
"""

from __future__ import annotations

import functools

import json
import math
import pathlib
import re

import numpy as np
import pytest

from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.trainer import Trainer

BASE = dict(dataset="synthetic", rounds=4, eval_every=2, client_fraction=0.02, seed=3)
#: record fields a Flower round adds or measures differently (wall-clock, bytes, per-node diagnostics)
FLOWER_ONLY = ("timing", "wire", "sampled", "dropped", "malformed", "attack")


def _nodes(n_users: int, n_nodes: int) -> dict[int, list[int]]:
    return {1000 + i: list(range(i, n_users, n_nodes)) for i in range(n_nodes)}


def _flower_run(direct_grid, cfg, run_dir=None, **grid_kw):
    from rfrs_ref.flower.client import client_app
    from rfrs_ref.flower.server import FlowerTrainer

    grid = direct_grid(client_app(cfg), _nodes(600, 4), **grid_kw)
    trainer = FlowerTrainer(cfg, grid, connect_timeout=5)
    return trainer, trainer.run(run_dir)


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name,kw", [
    ("a-frs", dict(defense="none", detect="parameter")),
    ("a-rfrs-ascent", dict(defense="krum", detect="gradient", attack="ascent",
                           byzantine_fraction=0.3)),
    ("krum-parameter-noise", dict(defense="krum", detect="parameter", attack="noise",
                                  byzantine_fraction=0.3, attack_params={"sigma": 0.5})),
    ("median-camouflage", dict(defense="median", detect="gradient", attack="camouflage",
                               byzantine_fraction=0.3, dtype="float64")),
    ("krum-parameter-nan", dict(defense="krum", detect="parameter", attack="inf",
                                byzantine_fraction=0.3, attack_params={"value": "nan"})),
    ("nnm-krum-ascent", dict(defense="krum", detect="gradient", pre=("nnm",), attack="ascent",
                             byzantine_fraction=0.3)),
])
def test_flower_run_equals_the_in_process_run_bit_for_bit(direct_grid, tmp_path, name, kw):
    cfg = TrainConfig(**BASE, **kw, model_params={"dim": 4})
    # the simulation holding every row, as the Flower server does: a Krum round that
    # computes the shared rows once sums its distances in other groups, so its scores
    # (not its state, below) may differ in their last bits (docs/performance.md,
    # "Robust rounds on shared rows")
    full = Trainer(cfg)
    full.buffers = functools.partial(Trainer.buffers, full, shared_rows=False)
    ref = full.run(tmp_path / "ref")
    _, res = _flower_run(direct_grid, cfg, tmp_path / "flower")
    for k in ref.state:
        np.testing.assert_array_equal(res.state[k], ref.state[k], err_msg=k)
    default = Trainer(cfg).run(tmp_path / "default")
    for k in ref.state:
        np.testing.assert_array_equal(default.state[k], ref.state[k], err_msg=k)
    a, b = _records(tmp_path / "ref"), _records(tmp_path / "flower")
    assert len(a) == len(b) == cfg.rounds
    for ra, rb in zip(a, b):
        assert rb["sampled"] == rb["clients"] and rb["dropped"] == [] and rb["malformed"] == []
        assert {k: v for k, v in ra.items() if k not in FLOWER_ONLY} == \
               {k: v for k, v in rb.items() if k not in FLOWER_ONLY}
    assert (tmp_path / "flower" / "metrics.csv").read_text() == \
        (tmp_path / "ref" / "metrics.csv").read_text()
    for f in ("config.json", "final_metrics.json", "state.npz", "checkpoint.npz"):
        assert (tmp_path / "flower" / f).exists()
    if "noise" in name or "nan" in name:
        assert any(r["excluded"] for r in b)  # the noise broke the rule: verification saw it
    if "nan" in name:  # every Byzantine upload is NaN: each one excluded, none kept
        assert all(e["check"] == "nonfinite" for r in b for e in r["excluded"])
        assert all(len(r["excluded"]) == r["n_byzantine_sampled"] for r in b)


def test_a_dead_node_drops_its_clients_and_the_run_finishes(direct_grid, tmp_path):
    cfg = TrainConfig(**BASE, defense="krum", detect="gradient", attack="ascent",
                      byzantine_fraction=0.3, model_params={"dim": 4})
    trainer, res = _flower_run(direct_grid, cfg, tmp_path / "run", dead={1001})
    dead_users = set(range(1, 600, 4))
    recs = _records(tmp_path / "run")
    assert len(recs) == cfg.rounds and res.final["round"] == cfg.rounds
    n_dropped = 0
    for r in recs:
        dropped = {d["client"] for d in r["dropped"]}
        assert dropped == set(r["sampled"]) & dead_users
        assert set(r["clients"]) == set(r["sampled"]) - dropped
        assert len(r["byzantine"]) == len(r["clients"])  # dropped: neither Byzantine nor honest
        # f is the sampled clients' count: floor(α · |sampled|)
        assert r["f"] == math.floor(0.3 * len(r["sampled"]))
        n_dropped += len(dropped)
        # Krum needs n > 2f + 2: with too few answers the round runs with reduce-f
        if len(r["clients"]) <= 2 * r["f"] + 2:
            assert r["dropout_fallback"]["fallback"] == "reduce-f"
            assert r["rule"]["fallback"] is not None
        else:
            assert "dropout_fallback" not in r
    assert n_dropped > 0
    assert all(np.isfinite(v).all() for v in res.state.values())


def test_an_error_reply_is_a_drop_with_its_reason(direct_grid, tmp_path):
    cfg = TrainConfig(**BASE, model_params={"dim": 4})

    def tamper(msg, reply):
        from flwr.app import Error, Message

        if msg.metadata.message_type == "train" and \
                int(msg.content.config_records["round"]["user"]) % 2 == 0:
            return Message(Error(code=7, reason="disk full"), reply_to=msg)
        return None

    _, res = _flower_run(direct_grid, cfg, tmp_path / "run", tamper=tamper)
    recs = _records(tmp_path / "run")
    assert all(d["client"] % 2 == 0 and "node error 7: disk full" in d["reason"]
               for r in recs for d in r["dropped"])
    assert any(r["dropped"] for r in recs)
    assert all(c % 2 == 1 for r in recs for c in r["clients"])


def test_a_node_of_another_configuration_refuses_and_is_dropped(direct_grid, tmp_path):
    from rfrs_ref.flower.client import client_app, config_digest
    from rfrs_ref.flower.server import FlowerTrainer

    cfg = TrainConfig(**{**BASE, "rounds": 1}, model_params={"dim": 4})
    other = TrainConfig(**{**BASE, "rounds": 1, "seed": 4}, model_params={"dim": 4})
    grid = direct_grid(client_app(other), _nodes(600, 2))
    trainer = FlowerTrainer(cfg, grid, connect_timeout=5)
    trainer.run(tmp_path / "run")
    rec = _records(tmp_path / "run")[0]
    assert rec["clients"] == [] and len(rec["dropped"]) == len(rec["sampled"])
    assert f"the server runs configuration {config_digest(cfg)}" in rec["dropped"][0]["reason"]
    assert config_digest(other) in rec["dropped"][0]["reason"]
    assert rec["rule"] == {"skipped": "no upload passed verification"}


def test_malformed_and_non_finite_uploads_are_excluded_by_verification(direct_grid, tmp_path):
    from flwr.app import Array, ArrayRecord

    cfg = TrainConfig(**BASE, defense="krum", detect="gradient", model_params={"dim": 4})
    hostile = {}

    def tamper(msg, reply):
        if msg.metadata.message_type != "train" or reply.has_error():
            return None
        user = int(msg.content.config_records["round"]["user"])
        t = int(msg.content.config_records["round"]["round"])
        ar = reply.content.array_records["upload"]
        if t == 2 and "short" not in hostile:
            hostile["short"] = user  # one value short: malformed
            ar["theta"] = Array(ar["theta"].numpy()[:-1].copy())
        elif t == 3 and "nan" not in hostile:
            hostile["nan"] = user
            m = ar["m"].numpy().copy()
            m[5] = np.nan
            ar["m"] = Array(m)
        elif t == 4 and "huge" not in hostile:
            hostile["huge"] = user
            reply.content.array_records["upload"] = ArrayRecord(
                {k: Array(np.full_like(ar[k].numpy(), 1e38)) for k in ar})
        return reply

    _, res = _flower_run(direct_grid, cfg, tmp_path / "run", tamper=tamper)
    recs = _records(tmp_path / "run")
    by_round = {r["round"]: r for r in recs}
    r2, r3, r4 = by_round[2], by_round[3], by_round[4]
    assert [m["client"] for m in r2["malformed"]] == [hostile["short"]]
    assert "expected float32" in r2["malformed"][0]["reason"]
    for r, key in ((r2, "short"), (r3, "nan"), (r4, "huge")):
        assert hostile[key] in r["clients"]  # it answered: not a drop
        assert [e["client"] for e in r["excluded"]] == [hostile[key]]
        assert r["kept"][r["clients"].index(hostile[key])] == 0.0
        assert r["f_rule"] == max(0, r["f"] - 1)
    assert all(np.isfinite(v).all() for v in res.state.values())


def test_a_reply_whose_n_samples_is_not_the_users_own_is_malformed(direct_grid, tmp_path):
    """The server holds the data: a node's n_samples (the rule's weight) that is not the
    user's own count is malformed, listed and excluded, never taken as the weight."""
    cfg = TrainConfig(**BASE, defense="mean", detect="gradient", model_params={"dim": 4})

    def tamper(msg, reply):
        if msg.metadata.message_type == "train" and not reply.has_error() and \
                int(msg.content.config_records["round"]["user"]) % 7 == 0:
            reply.content.metric_records["metrics"]["n_samples"] = 10 ** 9
        return reply

    _, res = _flower_run(direct_grid, cfg, tmp_path / "run", tamper=tamper)
    recs = _records(tmp_path / "run")
    own = Trainer(cfg).federation.n_samples
    lying = [c for r in recs for c in r["clients"] if c % 7 == 0]
    assert lying  # the seed samples some
    for r in recs:
        liars = [c for c in r["clients"] if c % 7 == 0]
        assert [m["client"] for m in r["malformed"]] == liars
        assert all(f"n_samples 1000000000 is not the user's {own[m['client']]} training"
                   in m["reason"] for m in r["malformed"])
        assert [e["client"] for e in r["excluded"]] == liars
        assert r["n_samples"] == [int(own[c]) for c in r["clients"]]
        assert r["dropped"] == []
    assert all(np.isfinite(v).all() for v in res.state.values())


def test_a_reply_whose_loss_or_role_is_no_such_value_is_malformed(direct_grid, tmp_path):
    """A node's loss of NaN or ±inf, or a role other than 0 or 1, is malformed: listed,
    excluded, and left out of the round's loss, which stays a number (never null)."""
    cfg = TrainConfig(**BASE, defense="mean", detect="gradient", model_params={"dim": 4})
    lies = {1: ("loss", math.nan), 2: ("loss", -math.inf), 4: ("byzantine", 0.5)}

    def tamper(msg, reply):
        if msg.metadata.message_type != "train" or reply.has_error():
            return reply
        rc = msg.content.config_records["round"]
        t = int(rc["round"])
        if t in lies and int(rc["user"]) % 7 == 0:
            reply.content.metric_records["metrics"][lies[t][0]] = lies[t][1]
        return reply

    _, res = _flower_run(direct_grid, cfg, tmp_path / "run", tamper=tamper)
    recs = {r["round"]: r for r in _records(tmp_path / "run")}
    for t, (field, value) in lies.items():
        r = recs[t]
        liars = [c for c in r["clients"] if c % 7 == 0]
        assert liars  # the seed samples some
        assert [m["client"] for m in r["malformed"]] == liars
        what = "is not a finite number" if field == "loss" else "is not 0 or 1"
        assert all(f"metrics: {field} {value!r} {what}" in m["reason"] for m in r["malformed"])
        assert [e["client"] for e in r["excluded"]] == liars
        assert not any(r["byzantine"])  # a malformed reply's role is the run's: honest here
        assert isinstance(r["loss"], float) and math.isfinite(r["loss"])
    assert all(np.isfinite(v).all() for v in res.state.values())


#: a hostile node's diagnostics per round, and what the malformed reply's reason then says
_BAD_DIAGNOSTICS = {
    1: ('{"noise_norm": NaN}', "not a finite number"),
    2: ('{"sigma": 1, "sigma": 2}', "duplicate key 'sigma'"),
    3: ('{"noise_norm": 1e999}', "inf, not a finite number"),
    4: ('{"a": ' + "[" * 50 + "]" * 50 + "}", "nest more than"),
    5: ('{"a": ' + "[" * 30000 + "]" * 30000 + "}", "nested too deeply"),
    6: ('{"a": 1' + "0" * 30 + "}", "beyond 64 bits"),
    7: ("[1, 2]", "a JSON list, not an object"),
    8: ('{"a": "' + "x" * 70000 + '"}', "bytes of diagnostics"),
}


def test_a_reply_whose_diagnostics_are_not_strict_json_is_malformed_naming_the_node(
        direct_grid, tmp_path):
    """A node's attack diagnostics were read with plain json.loads and recorded: NaN,
    Infinity and 1e999 became nulls, a key sent twice kept either value, a number of
    thousands of digits or nesting hundreds deep went into the round records. Such a
    reply is now malformed, its reason naming the node, and excluded like any other."""
    cfg = TrainConfig(**{**BASE, "rounds": len(_BAD_DIAGNOSTICS)}, defense="mean",
                      detect="gradient", model_params={"dim": 4})

    def tamper(msg, reply):
        if msg.metadata.message_type != "train" or reply.has_error():
            return reply
        rc = msg.content.config_records["round"]
        if int(rc["user"]) % 3 == 0:
            text = _BAD_DIAGNOSTICS[int(rc["round"])][0]
            reply.content.config_records["attack"]["diagnostics"] = text
        return reply

    _, res = _flower_run(direct_grid, cfg, tmp_path / "run", tamper=tamper)
    recs = {r["round"]: r for r in _records(tmp_path / "run")}
    for t, (_, says) in _BAD_DIAGNOSTICS.items():
        r = recs[t]
        liars = [c for c in r["clients"] if c % 3 == 0]
        assert liars  # the seed samples some
        assert [m["client"] for m in r["malformed"]] == liars, t
        for m in r["malformed"]:
            assert m["reason"].startswith(f"diagnostics: node {1000 + m['client'] % 4}"), m
            assert says in m["reason"], (t, m["reason"])
        assert [e["client"] for e in r["excluded"]] == liars
        assert not r.get("attack")  # nothing of theirs recorded
        assert isinstance(r["loss"], float) and math.isfinite(r["loss"])
    assert all(np.isfinite(v).all() for v in res.state.values())


@pytest.mark.parametrize("users,match", [
    (None, "KeyError: .users."), (["3"], r"\['3'\]"), ([True], r"\[True\]"), (7, "7"),
])
def test_a_malformed_answer_to_the_users_query_is_an_error_naming_the_node(
        direct_grid, users, match):
    from flwr.app import ConfigRecord

    from rfrs_ref.flower.client import client_app
    from rfrs_ref.flower.server import FlowerTrainer

    cfg = TrainConfig(**BASE, model_params={"dim": 4})

    def tamper(msg, reply):
        if msg.metadata.message_type == "query" and msg.metadata.dst_node_id == 1001:
            del reply.content.config_records["users"]
            if users is not None:
                reply.content.config_records["users"] = ConfigRecord({"users": users})
        return reply

    grid = direct_grid(client_app(cfg), _nodes(600, 4), tamper=tamper)
    with pytest.raises(ValueError, match="node 1001 answered the query of the users it holds "
                                         "with a malformed reply") as exc:
        FlowerTrainer(cfg, grid, connect_timeout=5).discover()
    assert re.search(match, str(exc.value))


def test_two_nodes_saying_they_hold_one_user_is_an_error(direct_grid):
    """Which node's uploads stand for a user is never decided by which answers first."""
    from rfrs_ref.flower.client import client_app
    from rfrs_ref.flower.server import FlowerTrainer

    cfg = TrainConfig(**BASE, model_params={"dim": 4})
    nodes = {999: [5], **_nodes(600, 4)}  # 1001 holds 5 too
    grid = direct_grid(client_app(cfg), nodes)
    with pytest.raises(ValueError, match="nodes 999 and 1001 both say they hold user 5"):
        FlowerTrainer(cfg, grid, connect_timeout=5).discover()


def test_server_app_writes_the_run_directory_and_the_node_map(direct_grid, tmp_path, flwr):
    from flwr.app import Context, RecordDict

    from rfrs_ref.flower.client import client_app
    from rfrs_ref.flower.server import server_app

    cfg = TrainConfig(**BASE, model_params={"dim": 4})
    results = {}
    app = server_app(cfg, tmp_path / "run", results=results)
    grid = direct_grid(client_app(cfg), _nodes(600, 3))
    app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}))
    meta = json.loads((tmp_path / "run" / "flower.json").read_text())
    assert len(meta["nodes"]) == 600 and set(meta["nodes"].values()) == {1000, 1001, 1002}
    assert meta["wire"]["bytes_up"] > 0 and meta["wire"]["bytes_down"] > 0
    assert results["result"].final["round"] == cfg.rounds


def test_the_deployed_apps_read_the_configuration_from_the_run_config(direct_grid, tmp_path):
    from flwr.app import Context, RecordDict

    from rfrs_ref.flower.client import client_app, config_from_run_config
    from rfrs_ref.flower.server import server_app

    cfg = TrainConfig(**{**BASE, "rounds": 2}, model_params={"dim": 4})
    path = tmp_path / "config.json"
    path.write_text(cfg.dumps())
    rc = {"config-file": str(path), "run-dir": str(tmp_path / "run")}
    assert config_from_run_config(rc).resolved() == cfg.resolved()
    grid = direct_grid(client_app(), _nodes(600, 2))
    for ctx in grid.contexts.values():
        ctx.run_config = rc
    server_app()(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                               run_config=rc))
    ref = Trainer(cfg).run(None)
    with np.load(tmp_path / "run" / "state.npz") as z:
        for k in ref.state:
            np.testing.assert_array_equal(z[k], ref.state[k])
    with pytest.raises(ValueError, match="run config needs 'config'"):
        config_from_run_config({})


@pytest.mark.parametrize("kw,match", [
    (dict(resilience=True), "honest gradients"),
    (dict(assumed_byzantine="exact"), "cannot know"),
    (dict(model="fmf"), "private client vectors"),
    (dict(attack="alie", byzantine_fraction=0.2), "colluding"),
    (dict(attack="ipm", byzantine_fraction=0.2), "colluding"),
])
def test_what_a_federated_server_cannot_do_is_refused_before_running(kw, match):
    from rfrs_ref.flower.server import check_federation_config

    with pytest.raises(ValueError, match=match):
        check_federation_config(TrainConfig(**BASE, **kw))


def test_the_server_holds_the_run_directory_until_flower_json_is_written(direct_grid, tmp_path,
                                                                          flwr, monkeypatch):
    """The trainer releases the run directory when its run ends; the server writes
    flower.json after it, and holds the directory until then (a `train --resume` started in
    between would otherwise work in it too)."""
    from flwr.app import Context, RecordDict

    import rfrs_ref.files as files
    from rfrs_ref.flower.client import client_app
    from rfrs_ref.flower.server import server_app

    cfg = TrainConfig(**{**BASE, "rounds": 2}, model_params={"dim": 4})
    run = tmp_path / "run"
    held = []
    real = files.atomic_write

    def watched(path, write):
        if pathlib.Path(path).name == "flower.json":
            try:
                with files.DirectoryLock(run):
                    held.append(False)
            except files.DirectoryLocked:
                held.append(True)
        return real(path, write)

    monkeypatch.setattr(files, "atomic_write", watched)
    grid = direct_grid(client_app(cfg), _nodes(600, 2))
    server_app(cfg, run)(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                       run_config={}))
    assert held == [True]
    assert (run / "flower.json").exists() and not (run / ".lock").exists()
