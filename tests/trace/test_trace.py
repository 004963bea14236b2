"""Run traces: the written format, `train --trace`, resume, and finding the first divergence."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import assume, given
from hypothesis import strategies as st

from rfrs_ref import trace as T
from rfrs_ref.federated.trainer import Trainer


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _rewrite(path, lines) -> None:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


# -- the format ---------------------------------------------------------------------------------

def test_trace_header_and_round_lines(traces):
    import sys

    from rfrs_ref.data import load_dataset

    lines = _lines(traces["a"])
    head, rounds = lines[0], lines[1:]
    assert head["format"] == "rfrs-trace" and head["version"] == 1
    assert head["state_arrays"] == ["m", "v", "theta"] and head["dtype"] == "float32"
    assert head["byte_order"] == sys.byteorder and head["checksum"] == "sha256"
    assert head["run"]["seed"] == 0 and "backend" not in head["run"] and head["producer"]["backend"] == "numba"
    data = load_dataset("synthetic", **head["run"]["dataset_params"])
    assert head["dataset"]["users"] == data.n_users
    assert head["n_params"] == 2 * data.n_items * 8
    assert [r["round"] for r in rounds] == [1, 2, 3, 4, 5]
    for r in rounds:
        n = len(r["clients"])
        assert n == 10 and r["clients"] == sorted(r["clients"])
        for k in ("byzantine", "n_samples", "grad_norms", "kept", "weights"):
            assert len(r[k]) == n, k
        assert abs(sum(r["weights"]) - 1) < 1e-12
        assert r["rule"]["rule"] == "krum" and "backend" not in r["rule"]
        assert set(r["state_checksums"]) == {"m", "v", "theta"}
        assert all(len(h) == 64 for h in r["state_checksums"].values())
    assert [("metrics" in r) for r in rounds] == [False, True, False, True, True]
    assert 0 <= rounds[1]["metrics"]["precision@5"] <= 1


def test_header_checksums_are_those_of_the_initial_state(traces):
    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.trace import read_trace

    tr = read_trace(traces["a"])
    cfg = TrainConfig.from_json({**tr.header["run"], "backend": "numba"})
    state, _ = Trainer(cfg).initial_state()
    assert tr.header["initial"]["state_checksums"] == {k: T.checksum(v) for k, v in state.items()}
    assert tr.header["initial"]["state_norms"]["theta"] == pytest.approx(
        float(np.linalg.norm(state["theta"].astype(np.float64))), rel=1e-15)


def test_grad_norms_are_the_norms_of_the_recovered_gradients(traces):
    """Round 1 by hand: honest clients recover g, ascent clients −g, so ‖ĝᵢ‖ = ‖gᵢ‖
    to the recovery's float32 rounding."""
    from rfrs_ref.federated.config import TrainConfig

    tr = T.read_trace(traces["a"])
    trainer = Trainer(TrainConfig.from_json({**tr.header["run"], "backend": "numba"}))
    state, _ = trainer.initial_state()
    r1 = tr.rounds[0]
    clients = np.array(r1["clients"])
    G = np.empty((clients.size, tr.header["n_params"]), dtype=np.float32)
    trainer.model.grads_batch(state["theta"], trainer.split.train, clients, G)
    expected = np.linalg.norm(G.astype(np.float64), axis=1)
    np.testing.assert_allclose(r1["grad_norms"], expected, rtol=1e-3)
    assert r1["byzantine"] == trainer.byzantine[clients].tolist()


def test_trace_lines_are_strict_json(traces):
    for line in traces["a"].read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


# -- comparing ---------------------------------------------------------------------------------------

def test_identical_runs_agree_bit_for_bit(traces):
    res = T.compare(traces["a"], traces["b"])
    assert res.agree and res.divergence is None and res.rounds_compared == 5
    assert res.checksums_compared and res.notes == []


def test_another_learning_rate_diverges_in_round_one(traces):
    res = T.compare(traces["a"], traces["lr"])
    assert not res.agree
    d = res.divergence
    assert d.round == 1
    # everything the round computes before the update agrees; the new state does not
    assert d.field.startswith("state_norms.")
    assert d.a != d.b
    assert any("optimizer_params" in n for n in res.notes)


def test_backends_agree_within_tolerance_but_not_bit_for_bit(traces):
    res = T.compare(traces["a"], traces["numpy"])
    if res.agree:  # the two backends happened to round every stored value alike
        return
    assert res.divergence.field.startswith("state_checksums")
    res = T.compare(traces["a"], traces["numpy"], checksums=False, rtol=1e-5)
    assert res.agree, str(res.divergence)


def _perturbed(src, tmp_path, t, edit):
    lines = _lines(src)
    edit(lines[t])
    dst = tmp_path / "perturbed.jsonl"
    _rewrite(dst, lines)
    return dst


def test_a_changed_weight_is_found_at_its_round_and_index(traces, tmp_path):
    def edit(r):
        r["weights"][2] += 1e-3

    b = _perturbed(traces["a"], tmp_path, 3, edit)
    res = T.compare(traces["a"], b)
    d = res.divergence
    assert (d.round, d.field) == (3, "weights[2]")
    assert d.b == pytest.approx(d.a + 1e-3)
    assert res.rounds_compared == 2
    assert T.compare(traces["a"], b, ignore=["weights"]).agree


def test_a_changed_checksum_or_client_is_found(traces, tmp_path):
    def edit_sum(r):
        r["state_checksums"]["v"] = "0" * 64

    res = T.compare(traces["a"], _perturbed(traces["a"], tmp_path, 4, edit_sum))
    assert (res.divergence.round, res.divergence.field) == (4, "state_checksums.v")

    def edit_client(r):
        r["clients"][0] += 1

    res = T.compare(traces["a"], _perturbed(traces["a"], tmp_path, 2, edit_client))
    assert (res.divergence.round, res.divergence.field) == (2, "clients[0]")


def test_checksums_are_not_compared_across_dtypes(traces, tmp_path):
    lines = _lines(traces["a"])
    lines[0]["dtype"] = "float64"
    for r in lines[1:]:
        # float64 bytes: other digests (one per array and round, as real ones are)
        r["state_checksums"] = {k: hashlib.sha256(f"{k}{r['round']}".encode()).hexdigest()
                                for k in r["state_checksums"]}
    b = tmp_path / "f64.jsonl"
    _rewrite(b, lines)
    res = T.compare(traces["a"], b)
    assert res.agree and not res.checksums_compared
    assert any("checksums not compared" in n and "dtype" in n for n in res.notes)


def test_a_shorter_trace_diverges_where_it_ends(traces, tmp_path):
    b = tmp_path / "short.jsonl"
    _rewrite(b, _lines(traces["a"])[:3])
    d = T.compare(traces["a"], b).divergence
    assert (d.round, d.field) == (3, "round") and "ends after 2 rounds" in d.reason


def test_a_different_initial_state_diverges_at_round_zero(traces, tmp_path):
    lines = _lines(traces["a"])
    lines[0]["initial"]["state_norms"]["theta"] *= 1.01
    b = tmp_path / "init.jsonl"
    _rewrite(b, lines)
    d = T.compare(traces["a"], b).divergence
    assert (d.round, d.field) == (0, "initial.state_norms.theta")
    assert "the header" in str(d)


def test_null_matches_only_null(traces, tmp_path):
    def edit(r):
        r["loss"] = None

    d = T.compare(traces["a"], _perturbed(traces["a"], tmp_path, 1, edit)).divergence
    assert (d.round, d.field, d.b) == (1, "loss", None)


@pytest.mark.parametrize("content, message", [
    ("", "empty trace"),
    ('{"format": "other"}\n', "first line must be a header"),
    # a run directory's rounds.jsonl, taken for a trace
    ('{"round": 1, "clients": [3, 5]}\n', "a round record, as a run's rounds.jsonl does, which is "
                                         "not a trace; write a trace with `rfrs-ref train"),
    ('{"format": "rfrs-trace", "version": 9}\n', "version 9"),
    ('{"format": "rfrs-trace", "version": 1}\n{"round": 1,\n', ":2: not valid JSON"),
    ('{"format": "rfrs-trace", "version": 1}\n{"round": 1}\n', ":2: round line lacks clients"),
])
def test_malformed_traces_name_file_and_line(tmp_path, content, message):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(T.TraceFormatError, match=message):
        T.read_trace(p)


def test_rounds_must_increase(traces, tmp_path):
    lines = _lines(traces["a"])
    lines[2], lines[3] = lines[3], lines[2]
    p = tmp_path / "swapped.jsonl"
    _rewrite(p, lines)
    with pytest.raises(T.TraceFormatError, match=r":4: round 2 after round 3"):
        T.read_trace(p)


# -- command line ------------------------------------------------------------------------------------

def test_cli_compare_exit_status(traces, tmp_path):
    from rfrs_ref.cli.main import main

    runner = CliRunner()
    res = runner.invoke(main, ["trace", "compare", str(traces["a"]), str(traces["b"])])
    assert res.exit_code == 0 and "the traces agree: 5 rounds" in res.output
    res = runner.invoke(main, ["trace", "compare", str(traces["a"]), str(traces["lr"])])
    assert res.exit_code == 1
    assert "traces diverge at round 1, field state_norms." in res.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    res = runner.invoke(main, ["trace", "compare", str(traces["a"]), str(bad)])
    assert res.exit_code == 1 and "bad.jsonl:1" in res.output


def _train_args(out, trace, rounds=4):
    return ["train", "--dataset", "synthetic", "--synthetic-users", "80", "--synthetic-items", "90",
            "--rounds", str(rounds), "--client-fraction", "0.125", "--dim", "8", "--attack", "ascent",
            "--byzantine-fraction", "0.2", "--defense", "krum", "--eval-every", "2",
            "--checkpoint-every", "2", "--out", str(out), "--trace", str(trace)]


def test_cli_train_trace_matches_the_python_api_and_survives_resume(tmp_path):
    """`train --trace` writes what run_traced writes; a run interrupted after round 3
    (checkpoint at 2) and resumed with --trace ends with the uninterrupted trace."""
    from rfrs_ref.cli.main import main

    from rfrs_ref.federated.config import TrainConfig

    runner = CliRunner()
    res = runner.invoke(main, _train_args(tmp_path / "run", tmp_path / "cli.jsonl"))
    assert res.exit_code == 0, res.output
    full = T.read_trace(tmp_path / "cli.jsonl")
    assert len(full.rounds) == 4 and "metrics" in full.rounds[1]

    cfg = TrainConfig(dataset="synthetic", dataset_params={"n_users": 80, "n_items": 90}, rounds=4,
                      client_fraction=0.125, model_params={"dim": 8}, attack="ascent",
                      byzantine_fraction=0.2, defense="krum", eval_every=2, checkpoint_every=2)
    T.run_traced(cfg, tmp_path / "api.jsonl", tmp_path / "api")
    assert T.compare(full, tmp_path / "api.jsonl").agree

    class Stop(Exception):
        pass

    trainer = Trainer(TrainConfig(**{**cfg.to_json(), "ks": tuple(cfg.ks), "trace": True}))
    writer = T.TraceWriter(tmp_path / "cut.jsonl", trainer)

    def progress(t, record, latest):
        writer.progress(t, record, latest)
        if t == 3:
            raise Stop

    with pytest.raises(Stop):
        trainer.run(tmp_path / "cut", progress=progress)
    writer.close()
    assert len(T.read_trace(tmp_path / "cut.jsonl").rounds) == 3
    res = runner.invoke(main, ["train", "--resume", str(tmp_path / "cut"), "--trace", str(tmp_path / "cut.jsonl")])
    assert res.exit_code == 0, res.output
    resumed = T.compare(full, tmp_path / "cut.jsonl")
    assert resumed.agree, str(resumed.divergence)
    assert [r["round"] for r in T.read_trace(tmp_path / "cut.jsonl").rounds] == [1, 2, 3, 4]


def test_writer_needs_trace_records(tmp_path, small_config):
    trainer = Trainer(small_config(rounds=1))
    with pytest.raises(ValueError, match="trace=True"):
        T.TraceWriter(tmp_path / "t.jsonl", trainer)
    with pytest.raises(ValueError, match="state_checksums"):
        T.round_line({"round": 1, "clients": [0], "state_norms": {}})


# -- the agreement rule as a law: one corrupted value always diverges, where it is ------------------------

def _numeric_leaves(obj, path: str):
    """(path, value) of every number under ``obj``, paths written as compare reports them."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _numeric_leaves(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _numeric_leaves(v, f"{path}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield path, obj


def _set(obj, path: str, value) -> None:
    import re

    keys = [k for k in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path)]
    steps = [k if k else int(i) for k, i in keys]
    for s in steps[:-1]:
        obj = obj[s]
    obj[steps[-1]] = value


def _compared_leaves(lines):
    """(line index, round, path, value) of every number compare() looks at."""
    out = [(0, 0, p, v) for p, v in _numeric_leaves(lines[0]["initial"]["state_norms"], "initial.state_norms")]
    out += [(0, 0, "n_params", lines[0]["n_params"])]
    for i, r in enumerate(lines[1:], start=1):
        for field in T.ROUND_FIELDS:
            if field in r and field not in ("round", "state_checksums"):
                out += [(i, r["round"], p[1:], v) for p, v in _numeric_leaves(r[field], "." + field)]
    return out


@given(data=st.data(), bad=st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e38, -1e38]))
def test_any_value_corrupted_to_nonfinite_or_huge_diverges_where_it_is(traces, tmp_path_factory, data, bad):
    """Take a candidate that agrees, corrupt any one compared number to NaN, ±inf or
    ±1e38: compare reports a divergence at exactly that round and field."""
    lines = _lines(traces["b"])
    leaves = _compared_leaves(lines)
    i, t, path, value = data.draw(st.sampled_from(leaves), label="leaf")
    assume(value != bad)
    folder = tmp_path_factory.mktemp("corrupt")
    good = folder / "good.jsonl"
    _rewrite(good, lines)
    assert T.compare(traces["a"], good).agree
    _set(lines[i], "." + path, bad)
    corrupt = folder / "bad.jsonl"
    _rewrite(corrupt, lines)  # json.dumps writes NaN / Infinity literals
    res = T.compare(traces["a"], corrupt)
    assert not res.agree
    assert (res.divergence.round, res.divergence.field) == (t, path), str(res.divergence)


# -- state sums: what the norms cannot see ------------------------------------------------------------

def test_state_sums_follow_the_documented_formula():
    x = np.array([[1.0, -2.0, 3.0, 0.5], [-4.0, 5.0, 6.0, -7.0]], dtype=np.float32)
    flat = x.astype(np.float64).ravel()
    w = np.array([1, 2, 3, 4, 5, 6, 7, 1], dtype=np.float64)  # w_k = (k mod 7) + 1
    assert np.array_equal(T.sum_weights(8), w)
    s = T.state_sums({"theta": x})["theta"]
    phase = 1.0 + np.array([(k * 0.6180339887498949) % 1.0 for k in range(8)])
    assert np.array_equal(T.phase_weights(8), phase)
    assert s == {"sum": float(flat.sum()), "weighted_sum": float(w @ flat), "abs_sum": float(np.abs(flat).sum()),
                 "phase_sum": float(phase @ flat)}
    # a sign flip changes the sum, a permutation the weighted sum; the norm sees neither
    neg, perm = T.state_sums({"t": -x})["t"], T.state_sums({"t": x.ravel()[::-1].copy()})["t"]
    assert neg["sum"] == -s["sum"] and perm["sum"] == s["sum"] and perm["weighted_sum"] != s["weighted_sum"]
    assert T.state_sums({"m": np.array([np.inf, 1.0])})["m"]["sum"] is None


def test_trace_lines_record_state_sums(traces):
    lines = _lines(traces["a"])
    D = lines[0]["n_params"]
    for obj in [lines[0]["initial"]] + lines[1:]:
        assert set(obj["state_sums"]) == {"m", "v", "theta"}
        for k, s in obj["state_sums"].items():
            norm = obj["state_norms"][k]
            assert set(s) == {"sum", "weighted_sum", "abs_sum", "phase_sum"}
            assert abs(s["sum"]) <= s["abs_sum"] * (1 + 1e-12) and abs(s["weighted_sum"]) <= 7 * s["abs_sum"] * (1 + 1e-12)
            assert abs(s["phase_sum"]) <= 2 * s["abs_sum"] * (1 + 1e-12)
            assert norm * (1 - 1e-9) <= s["abs_sum"] <= norm * np.sqrt(D) * (1 + 1e-9) + 1e-300


def test_a_negated_first_moment_diverges_without_checksums(small_config, tmp_path, monkeypatch):
    """An Adam that stores m with the opposite sign (and steps θ by +ηₜm/(√v + ε)) has
    the same state norms, gradient norms and Krum scores as rfrs-ref's: the traces
    agreed under --no-checksums until the state's sums were recorded."""
    from rfrs_ref.optim import adam as A

    cfg = small_config(backend="numpy", verify=False, rounds=3, attack="none", byzantine_fraction=0.0)
    T.run_traced(cfg, tmp_path / "a.jsonl", tmp_path / "a")

    def client_rule(self, state, g, t):
        mb, vb, tb = (np.asarray(state[k], dtype=np.float64) for k in ("m", "v", "theta"))
        g = np.asarray(g, dtype=np.float64)
        m = self.beta1 * mb - (1 - self.beta1) * g
        v = self.beta2 * vb + (1 - self.beta2) * g * g
        return {"m": m, "v": v, "theta": tb + self.step_size(t) * m / (np.sqrt(v) + self.eps)}

    monkeypatch.setattr(A.Adam, "client_rule", client_rule)
    T.run_traced(cfg, tmp_path / "b.jsonl", tmp_path / "b")
    res = T.compare(tmp_path / "a.jsonl", tmp_path / "b.jsonl", checksums=False)
    assert not res.agree and res.divergence.round == 1
    assert res.divergence.field == "state_sums.m.sum", res.divergence
    # the norms alone (a trace written before the sums) cannot tell them apart
    for name in ("a", "b"):
        lines = _lines(tmp_path / f"{name}.jsonl")
        lines[0]["initial"].pop("state_sums")
        for r in lines[1:]:
            r.pop("state_sums")
        _rewrite(tmp_path / f"old-{name}.jsonl", lines)
    assert T.compare(tmp_path / "old-a.jsonl", tmp_path / "old-b.jsonl", checksums=False).agree


def test_a_trace_without_state_sums(traces, tmp_path):
    """A reference without sums (written before them) is compared on norms with a note; a
    B without them, where the reference has them, agrees only when checksums are compared
    too: on norms alone a sign flip of a state array would agree."""
    lines = _lines(traces["b"])
    lines[0]["initial"].pop("state_sums")
    for r in lines[1:]:
        r.pop("state_sums")
    _rewrite(tmp_path / "old.jsonl", lines)
    res = T.compare(tmp_path / "old.jsonl", traces["a"], checksums=False)
    assert res.agree
    notes = [n for n in res.notes if n.startswith("state_sums:")]
    assert len(notes) == 1 and "norms only" in notes[0]
    res = T.compare(traces["a"], tmp_path / "old.jsonl", checksums=False)
    assert not res.agree and res.divergence.field == "initial.state_sums", res.divergence
    assert "checksums are not compared" in res.divergence.reason
    res = T.compare(traces["a"], tmp_path / "old.jsonl")
    assert res.agree
    notes = [n for n in res.notes if n.startswith("state_sums:")]
    assert len(notes) == 1 and "norms and checksums" in notes[0]
    assert not [n for n in T.compare(traces["a"], traces["b"]).notes if "state_sums" in n]


def test_state_sums_compare_relative_to_the_sum_of_magnitudes(traces, tmp_path):
    """A sum cancels: B's is held to rtol·Σ|x| of A (7·Σ|x| for the weighted sum), so a
    difference of rounding agrees and one beyond it diverges; an array dropped from B's
    sums diverges."""
    lines = _lines(traces["a"])
    s = lines[2]["state_sums"]["theta"]
    for stat, scale in (("sum", 1.0), ("weighted_sum", 7.0), ("abs_sum", 1.0)):
        for factor, agree in ((0.5, True), (2.0, False)):
            ed = _lines(traces["a"])
            ed[2]["state_sums"]["theta"][stat] = s[stat] + factor * 1e-6 * scale * s["abs_sum"]
            _rewrite(tmp_path / "b.jsonl", ed)
            res = T.compare(traces["a"], tmp_path / "b.jsonl", checksums=False, atol=0.0)
            assert res.agree is agree, (stat, factor, res.divergence)
            if not agree:
                assert res.divergence.field == f"state_sums.theta.{stat}" and res.divergence.round == 2
    ed = _lines(traces["a"])
    del ed[1]["state_sums"]["v"]
    _rewrite(tmp_path / "b.jsonl", ed)
    res = T.compare(traces["a"], tmp_path / "b.jsonl", checksums=False)
    assert not res.agree and res.divergence.field == "state_sums.v" and res.divergence.reason == "missing in B"


@pytest.mark.parametrize("bad", [[1.0], {"theta": 3.0}, {"theta": {"sum": 1.0}}, {"theta": {"sum": "1", "weighted_sum": 1,
                                                                                             "abs_sum": 1}}])
def test_malformed_state_sums_are_refused(traces, tmp_path, bad):
    lines = _lines(traces["a"])
    lines[2]["state_sums"] = bad
    _rewrite(tmp_path / "b.jsonl", lines)
    with pytest.raises(T.TraceFormatError, match="state_sums must map"):
        T.read_trace(tmp_path / "b.jsonl")


def test_a_transposed_matrix_changes_the_phase_sum():
    """A matrix stored transposed keeps every k mod 7 when both its sides are ≡ 1 mod 7
    (d = 64 embeddings of 1,737 items: i·64 + j ≡ i + j ≡ j·1,737 + i): sum, weighted_sum,
    abs_sum and the norm all stay, and only the phase weights, which no permutation keeps,
    tell it from the reference."""
    x = np.random.default_rng(0).normal(size=(1737, 64)).astype(np.float32)
    a, b = T.state_sums({"P": x})["P"], T.state_sums({"P": x.T.copy()})["P"]
    assert a["sum"] == pytest.approx(b["sum"], rel=1e-12, abs=1e-9)
    assert a["weighted_sum"] == pytest.approx(b["weighted_sum"], rel=1e-12, abs=1e-9)
    assert a["abs_sum"] == pytest.approx(b["abs_sum"], rel=1e-12)
    assert abs(a["phase_sum"] - b["phase_sum"]) > 1e-5 * a["abs_sum"]  # the default rtol: 1e-6


def test_a_trace_of_a_transposed_state_diverges_without_checksums(traces, tmp_path):
    """B's state_sums are those of its state stored transposed (an 8 × 8 array here, both
    sides ≡ 1 mod 7): without checksums the other sums agreed; the phase sum diverges, and
    a B that leaves the phase sum out diverges where A has it (with checksums compared it
    agrees, with a note)."""
    x = np.random.default_rng(1).normal(size=(8, 8))
    lines_a, lines_b = _lines(traces["a"]), _lines(traces["a"])
    for obj in [lines_a[0]["initial"]] + lines_a[1:]:
        obj["state_sums"]["theta"] = T.state_sums({"t": x})["t"]
    for obj in [lines_b[0]["initial"]] + lines_b[1:]:
        obj["state_sums"]["theta"] = T.state_sums({"t": x.T.copy()})["t"]
    _rewrite(tmp_path / "a.jsonl", lines_a)
    _rewrite(tmp_path / "b.jsonl", lines_b)
    res = T.compare(tmp_path / "a.jsonl", tmp_path / "b.jsonl", checksums=False)
    assert not res.agree and res.divergence.field == "initial.state_sums.theta.phase_sum", res.divergence
    for obj in [lines_b[0]["initial"]] + lines_b[1:]:
        for v in obj["state_sums"].values():
            v.pop("phase_sum")
    _rewrite(tmp_path / "old-b.jsonl", lines_b)
    res = T.compare(tmp_path / "a.jsonl", tmp_path / "old-b.jsonl", checksums=False)
    assert not res.agree and "phase_sum" in res.divergence.field
    assert "checksums are not compared" in res.divergence.reason
    # a reference written before the phase sum compares on the other sums, with a note
    res = T.compare(tmp_path / "old-b.jsonl", tmp_path / "old-b.jsonl", checksums=False)
    assert res.agree and any("records no phase_sum" in n for n in res.notes)


def test_a_checksum_divergence_names_the_option_that_compares_values_instead(traces, tmp_path):
    # two backends agree on values, not bits: the report must say how to compare them
    def edit_sum(r):
        r["state_checksums"]["v"] = "0" * 64

    res = T.compare(traces["a"], _perturbed(traces["a"], tmp_path, 4, edit_sum))
    assert res.divergence.field == "state_checksums.v"
    assert "--no-checksums" in res.divergence.reason and "checksums=False" in res.divergence.reason
