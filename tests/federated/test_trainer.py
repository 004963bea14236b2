"""Training runs: determinism, run records, resume after a real interruption, end to end."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.trainer import Trainer, train

SMALL = dict(n_users=120, n_items=150, n_clusters=4, mean_items=12.0)


def small_config(**kw):
    base = dict(dataset="synthetic", dataset_params=SMALL, rounds=12, eval_every=4,
                client_fraction=0.1)
    base.update(kw)
    return TrainConfig(**base)


def read_state(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def rounds_without_timing(path):
    out = []
    with open(path) as fh:
        for line in fh:
            rec = json.loads(line)
            rec.pop("timing")
            out.append(rec)
    return out


def test_same_seed_same_bits_different_seed_differs(tmp_path):
    a = train(small_config(), tmp_path / "a")
    b = train(small_config(), tmp_path / "b")
    c = train(small_config(seed=1), tmp_path / "c")
    for k in a.state:
        assert a.state[k].tobytes() == b.state[k].tobytes()
    assert a.history == b.history
    assert (tmp_path / "a/metrics.csv").read_text() == (tmp_path / "b/metrics.csv").read_text()
    assert rounds_without_timing(tmp_path / "a/rounds.jsonl") == rounds_without_timing(tmp_path / "b/rounds.jsonl")
    assert a.state["theta"].tobytes() != c.state["theta"].tobytes()


def test_run_directory_contents(tmp_path):
    res = train(small_config(dtype="float64"), tmp_path / "run")
    d = tmp_path / "run"
    record = json.loads((d / "config.json").read_text())
    cfg = record["config"]
    # every default is resolved and recorded
    assert cfg["rounds"] == 12 and cfg["optimizer_params"]["beta2"] == 0.999
    assert cfg["model_params"]["dim"] == 64 and cfg["verify"] is True
    assert {"numpy", "numba", "rfrs_ref", "python"} <= set(record["versions"])
    assert record["dataset"]["users"] == 120
    rows = list(csv.DictReader(open(d / "metrics.csv")))
    assert sorted({int(r["round"]) for r in rows}) == [0, 4, 8, 12]
    assert {int(r["k"]) for r in rows} == {1, 2, 3, 4, 5}
    recs = [json.loads(x) for x in open(d / "rounds.jsonl")]
    assert [r["round"] for r in recs] == list(range(1, 13))
    assert all(len(r["clients"]) == 12 for r in recs)
    final = json.loads((d / "final_metrics.json").read_text())
    assert final["round"] == 12 and set(final["model"]) >= {"precision@5", "recall@1"}
    state = read_state(d / "state.npz")
    assert set(state) == {"theta", "m", "v", "round"} and int(state["round"]) == 12
    assert state["theta"].dtype == np.float64
    np.testing.assert_array_equal(state["theta"], res.state["theta"])


def _run(command):
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, f"{command} exited {proc.returncode}:\n{proc.stderr}"


def test_resume_after_a_real_kill_ends_where_the_uninterrupted_run_ends(tmp_path):
    rounds = 150
    args = ["--dataset", "synthetic", "--synthetic-users", "120", "--synthetic-items", "150",
            "--rounds", str(rounds), "--eval-every", "25", "--checkpoint-every", "5",
            "--client-fraction", "0.1", "--backend", "numpy"]
    # -P keeps the repository root off sys.path, so the installed package (with its
    # rfrs_ref.cli) is the one imported, not the source tree's rfrs_ref/
    cli = [sys.executable, "-P", "-c", "from rfrs_ref.cli.main import main; main()", "train"]
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "interrupted"
    _run(cli + args + ["--out", str(ref_dir)])

    proc = subprocess.Popen(cli + args + ["--out", str(run_dir)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    ckpt = run_dir / "checkpoint.npz"
    deadline = time.time() + 120
    killed_at = None
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists():
            try:
                done = int(read_state(ckpt)["round"])
            except Exception:  # being replaced right now
                done = 0
            if 30 <= done < rounds - 30:
                os.kill(proc.pid, signal.SIGKILL)
                killed_at = done
                break
        time.sleep(0.005)
    proc.wait()
    assert killed_at is not None and proc.returncode == -signal.SIGKILL, "the run was not interrupted"
    assert not (run_dir / "final_metrics.json").exists()

    _run(cli + ["--resume", str(run_dir)])
    assert (run_dir / "metrics.csv").read_text() == (ref_dir / "metrics.csv").read_text()
    ref, got = read_state(ref_dir / "state.npz"), read_state(run_dir / "state.npz")
    assert set(ref) == set(got)
    for k in ref:
        assert ref[k].tobytes() == got[k].tobytes(), k
    assert rounds_without_timing(run_dir / "rounds.jsonl") == rounds_without_timing(ref_dir / "rounds.jsonl")
    fa = json.loads((ref_dir / "final_metrics.json").read_text())
    fb = json.loads((run_dir / "final_metrics.json").read_text())
    fa.pop("seconds"), fb.pop("seconds")
    assert fa == fb


def test_beats_popularity_on_synthetic(tmp_path):
    res = train(TrainConfig(dataset="synthetic"), tmp_path / "run")
    assert res.final["beats_popularity"], res.final


@pytest.mark.slow
def test_beats_popularity_on_ml100k(data_dir, tmp_path):
    res = train(TrainConfig(dataset="ml100k", data_dir=str(data_dir), rounds=300, eval_every=300),
                tmp_path / "run")
    m, p = res.final["model"], res.final["popularity"]
    assert m["precision@5"] > 1.05 * p["precision@5"], res.final


def test_fmf_trains_and_keeps_private_vectors(tmp_path):
    res = train(small_config(model="fmf", rounds=6, eval_every=3), tmp_path / "run")
    state = read_state(tmp_path / "run/state.npz")
    assert "private_theta" in state and state["private_theta"].shape == (120, 64)
    assert "theta" in res.state and res.state["theta"].size == 150 * 64


# -- failure behaviour of the library (the CLI's is in tests/hostile/test_train.py) ------------
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from rfrs_ref.federated.trainer import (CheckpointError, NonFiniteState, RunExists,  # noqa: E402
                                        first_non_finite)
from rfrs_ref.files import DirectoryLock, DirectoryLocked  # noqa: E402


def _oracle_non_finite(arrays):
    for name, a in arrays.items():
        bad = int((~np.isfinite(a)).sum())
        if bad:
            return name, bad, a.size
    return None


@given(st.lists(st.tuples(st.sampled_from([np.float32, np.float64]), st.integers(0, 40)),
                min_size=1, max_size=3).flatmap(
    lambda specs: st.tuples(*[hnp.arrays(dt, n, elements=st.one_of(
        st.floats(width=32 if dt is np.float32 else 64),
        st.sampled_from([3.0e38, -3.0e38, 1.7e308, -1.7e308] if dt is np.float64
                        else [3.0e38, -3.0e38]))) for dt, n in specs])))
def test_first_non_finite_agrees_with_the_elementwise_oracle(arrays):
    named = {f"a{i}": a for i, a in enumerate(arrays)}
    assert first_non_finite(named) == _oracle_non_finite(named)
    # norms computed elsewhere (the round record's), as the trainer passes them
    with np.errstate(over="ignore", invalid="ignore"):
        norms = {k: float(np.linalg.norm(a.astype(np.float64))) for k, a in named.items()}
    assert first_non_finite(named, norms) == _oracle_non_finite(named)


def test_first_non_finite_ignores_integer_arrays_and_counts_exactly():
    theta = np.zeros(10, np.float32)
    theta[[2, 5]] = [np.inf, np.nan]
    big = np.full(4, 1e308)  # its sum overflows, every value is finite
    assert first_non_finite({"steps": np.arange(3), "big": big}) is None
    assert first_non_finite({"big": big, "theta": theta}) == ("theta", 2, 10)


def test_a_non_finite_state_stops_the_run_and_keeps_the_last_checkpoint(tmp_path):
    cfg = small_config(optimizer="sgd", attack="noise", attack_params={"sigma": 1e38},
                       byzantine_fraction=0.3, checkpoint_every=1)
    with pytest.raises(NonFiniteState) as info:
        Trainer(cfg).run(tmp_path / "run")
    err = info.value
    assert err.array == "theta" and err.count > 0 and err.round >= 1
    assert err.checkpoint == (err.round - 1 or None)
    if err.checkpoint:
        assert int(read_state(tmp_path / "run/checkpoint.npz")["round"]) == err.checkpoint
    # without a run directory too: the state is checked whatever the caller
    with pytest.raises(NonFiniteState, match=f"round {err.round}: "):
        Trainer(cfg).run()


def test_honest_uploads_that_overflow_end_the_run_as_a_divergence(tmp_path):
    """λ = 1e308: every honest gradient 2λθ + ... overflows, verification excludes every
    honest upload, and a run going on would carry the initial state over to the end and
    report its metrics as a result. It diverges at round 1, naming the first honest
    client, before anything of round 1 is recorded."""
    from rfrs_ref.federated.trainer import DIVERGED_UPLOADS, Diverged

    cfg = small_config(model_params={"lam": 1e308}, rounds=4, eval_every=2)
    with pytest.raises(Diverged) as info:
        Trainer(cfg).run(tmp_path / "run")
    err = info.value
    assert err.reason == DIVERGED_UPLOADS and err.round == 1 and err.user is not None
    assert err.what == f"the upload of honest client {err.user}"
    assert "round 1: the model diverged" in str(err) and "honest client" in str(err)
    # nothing has trained before round 1: only the hyperparameters can be the cause
    assert "such as λ" in str(err) and "grown too large" not in str(err)
    assert [row["round"] for row in err.history] == [0]
    final = json.loads((tmp_path / "run/final_metrics.json").read_text())
    assert final["status"] == "diverged" and final["reason"] == DIVERGED_UPLOADS
    assert (tmp_path / "run/rounds.jsonl").read_text() == ""


@pytest.mark.parametrize("defense", ["krum", "rfa", "mda"])
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_honest_uploads_that_overflow_without_verification_end_the_run(defense, backend):
    """The same λ = 1e308 with SGD, whose uploads are not verified: a robust rule ranks every
    honest upload (+inf or NaN) as infinitely far, finds nothing finite to aggregate and
    keeps the state, round after round, and the run once ended as a success with the
    initial model's metrics. It diverges at round 1 for the same reason, naming the
    first honest client."""
    from rfrs_ref.federated.trainer import DIVERGED_UPLOADS, Diverged

    cfg = small_config(optimizer="sgd", defense=defense, model_params={"lam": 1e308},
                       rounds=3, eval_every=3, backend=backend)
    with pytest.raises(Diverged) as info:
        Trainer(cfg).run()
    err = info.value
    assert err.reason == DIVERGED_UPLOADS and err.round == 1 and err.user is not None
    assert err.what == f"the upload of honest client {err.user}"


def test_non_finite_byzantine_uploads_never_end_a_run():
    """The inf attack's uploads are excluded by verification like an overflowing honest
    upload, but they are input: the run trains to its end."""
    cfg = small_config(attack="inf", byzantine_fraction=0.3, rounds=3, eval_every=3)
    res = Trainer(cfg).run()
    assert res.final["model"]


def test_divergence_is_raised_with_its_round_and_the_history_before_it(tmp_path):
    from rfrs_ref.federated.trainer import DIVERGED_SCORES, DIVERGED_STATE, Diverged

    state_cfg = small_config(optimizer="sgd", attack="noise", attack_params={"sigma": 1e38},
                             byzantine_fraction=0.3, eval_every=1)
    with pytest.raises(Diverged) as info:
        Trainer(state_cfg).run()
    err = info.value
    assert isinstance(err, NonFiniteState) and err.reason == DIVERGED_STATE
    assert err.array == "theta" and err.user is None and err.what.startswith("'theta': ")
    assert [row["round"] for row in err.history] == list(range(err.round))
    # finite state, overflowing scores: momentum at a huge step against ascent, no defence
    scores_cfg = small_config(optimizer="momentum", optimizer_params={"lr": 1e6},
                              attack="ascent", byzantine_fraction=0.4, defense="none",
                              rounds=8, eval_every=1, checkpoint_every=1)
    with pytest.raises(Diverged) as info:
        Trainer(scores_cfg).run(tmp_path / "run")
    err = info.value
    assert err.reason == DIVERGED_SCORES and err.array is None and err.user is not None
    assert err.round >= 1 and err.checkpoint == err.round - 1
    assert [row["round"] for row in err.history] == list(range(err.round))
    assert f"round {err.round}: the model diverged" in str(err)
    final = json.loads((tmp_path / "run/final_metrics.json").read_text())
    assert final == {"status": "diverged", **err.record(), "message": str(err),
                     "last_evaluation": json.loads(json.dumps(err.history[-1]))}
    # a non-finite initial state is a configuration error, not a divergence
    with pytest.raises(NonFiniteState) as info:
        Trainer(small_config(init_scale=1e39)).run()
    assert not isinstance(info.value, Diverged) and info.value.round == 0


def test_run_refuses_a_directory_holding_another_run(tmp_path):
    train(small_config(rounds=2, eval_every=1), tmp_path / "run")
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    with pytest.raises(RunExists, match="already holds a run"):
        Trainer(small_config(rounds=2, eval_every=1, seed=4)).run(tmp_path / "run")
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before


def test_run_holds_the_directory_lock_while_it_trains(tmp_path):
    seen = []

    def progress(t, record, latest):
        with pytest.raises(DirectoryLocked):
            DirectoryLock(tmp_path / "run").acquire()
        seen.append(t)

    Trainer(small_config(rounds=2, eval_every=1)).run(tmp_path / "run", progress=progress)
    assert seen == [1, 2]
    assert not (tmp_path / "run/.lock").exists()


def test_a_rule_precondition_fails_when_the_trainer_is_built():
    from rfrs_ref.aggregate import PreconditionError

    # 12 clients per round, f = floor(0.45 * 12) = 5: Krum needs n > 2f + 2 = 12
    cfg = small_config(defense="krum", byzantine_fraction=0.45)
    with pytest.raises(PreconditionError, match="n=12 and f=5"):
        Trainer(cfg)
    Trainer(small_config(defense="krum", byzantine_fraction=0.45,
                         defense_params={"fallback": "reduce-f"}))


def test_a_checkpoint_of_another_configuration_is_refused(tmp_path):
    train(small_config(rounds=2, eval_every=1), tmp_path / "run")
    with pytest.raises(CheckpointError, match="does not belong"):
        Trainer(small_config(rounds=2, eval_every=1, dtype="float64")).run(tmp_path / "run",
                                                                          resume=True)


def test_exact_assumed_byzantine_tells_the_server_each_rounds_count(tmp_path):
    attacked = dict(attack="ascent", byzantine_fraction=0.3, defense="krum", rounds=6,
                    eval_every=6, dtype="float64", defense_params={"fallback": "reduce-f"})
    res = train(small_config(assumed_byzantine="exact", **attacked), tmp_path / "exact")
    recs = rounds_without_timing(tmp_path / "exact" / "rounds.jsonl")
    assert [r["f"] for r in recs] == [r["n_byzantine_sampled"] for r in recs]
    # the default (None: f = floor(α n)) and an explicit α are the same run, bit for bit
    train(small_config(**attacked), tmp_path / "default")
    train(small_config(assumed_byzantine=0.3, **attacked), tmp_path / "alpha")
    default = rounds_without_timing(tmp_path / "default" / "rounds.jsonl")
    assert default == rounds_without_timing(tmp_path / "alpha" / "rounds.jsonl")
    assert [r["f"] for r in default] == [3] * 6  # floor(0.3 * 12)
    assert [r["f"] for r in recs] != [r["f"] for r in default]
    assert res.final["round"] == 6
    with pytest.raises(ValueError, match="'exact'"):
        small_config(assumed_byzantine="most").resolved()


def _overflowing_resilience(**kw):
    # SGD at lr 1e-300 in float64: a kept noisy client's recovered gradient overflows
    return small_config(rounds=3, eval_every=3, checkpoint_every=1, dtype="float64",
                        optimizer="sgd", optimizer_params={"lr": 1e-300}, attack="noise",
                        attack_params={"sigma": 100.0}, byzantine_fraction=0.2,
                        resilience=True, backend="numpy", **kw)


def test_a_non_finite_resilience_sum_is_marked_and_resumes_to_the_same_end(tmp_path):
    from rfrs_ref.federated.trainer import NonFiniteResilience

    cfg = _overflowing_resilience()
    with pytest.raises(NonFiniteResilience, match="C_g at round 1") as whole:
        Trainer(cfg).run(tmp_path / "whole")
    assert whole.value.non_finite == {"C_g": 1}
    assert whole.value.result.final["round"] == 3  # the training finished

    class Stop(Exception):
        pass

    def stop(t, record, latest):
        if t == 2:
            raise Stop

    with pytest.raises(Stop):
        Trainer(cfg).run(tmp_path / "cut", progress=stop)
    # the checkpoint of round 2 holds the null sum and its round: it continues
    with pytest.raises(NonFiniteResilience, match="C_g at round 1") as resumed:
        Trainer(cfg).run(tmp_path / "cut", resume=True)
    a, b = whole.value.result.final, resumed.value.result.final
    assert b["resilience"] == a["resilience"] and b["resilience"]["C_g"] is None
    assert b["resilience_non_finite"] == a["resilience_non_finite"] == {"C_g": 1}
    assert b["model"] == a["model"]


def test_resilience_sums_overflowing_from_finite_terms_are_marked_at_their_round():
    from rfrs_ref.federated.trainer import _Accumulators

    acc = _Accumulators()
    for t, term in ((1, 1e308), (2, 1e308), (3, 1.0)):
        acc.add({"round": t, "kept": [1.0], "byzantine": [False], "excluded": [],
                 "resilience": {"C_g": term, "C_theta": 1.0}})
    assert acc.resilience == {"C_g": None, "C_theta": 3.0}
    assert acc.resilience_non_finite == {"C_g": 2}
    assert acc.problems() == []
    acc.resilience_non_finite = {}  # a null sum without its round is damage
    assert acc.problems() == ["accumulator resilience = {'C_g': None, 'C_theta': 3.0}"]


@pytest.mark.parametrize("edit", [{"test_fraction": 0.0},
                                  {"test_fraction": 0.01, "byzantine_fraction": 0.0}])
def test_a_run_that_would_evaluate_nobody_is_a_configuration_error(tmp_path, edit):
    """With no benign client holding a test item every metric is an average over nobody:
    such a run finished "ok" with Precision 0 (and, with targets, an exposure of 0, the
    targets never shown). It is refused before anything is written."""
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="no benign client holds a test item"):
        # 0.01 of at most a few dozen items per client is no test item for anyone
        train(small_config(**edit), out)
    assert not out.exists() or not any(out.iterdir())


def test_honest_uploads_that_overflow_after_round_1_name_a_grown_state_too():
    """λ = 1e30 with SGD: round 1's step multiplies θ by about 1 − 2ηλ, a finite state of
    about 1e26, and round 2's gradients 2λθ overflow. The state the rounds before grew (as
    Byzantine uploads a rule let through can make it grow) is then a cause the message
    names beside the hyperparameters; at round 1 only the hyperparameters can be."""
    from rfrs_ref.federated.trainer import DIVERGED_UPLOADS, Diverged

    cfg = small_config(optimizer="sgd", defense="krum", model_params={"lam": 1e30}, rounds=4,
                       eval_every=2)
    with pytest.raises(Diverged) as info:
        Trainer(cfg).run(None)
    err = info.value
    assert err.reason == DIVERGED_UPLOADS and err.round == 2
    assert "a state grown too large in the rounds before" in str(err) and "such as λ" in str(err)
