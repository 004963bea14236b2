"""The a-ra item-promotion attack (A-ra, A-hum): its gradient, its uploads, its targets, its runs."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.attack import ARA, parse_targets, promotion_gradient
from rfrs_ref.model import MODELS
from rfrs_ref.optim import OPTIMIZERS, SGD


def loss(P, T, U):
    """The attack's loss (1/S) Σ_s (1/|T|) Σ_t −log σ(p_t · û_s)."""
    x = U @ P[T].T
    return float(np.mean(np.logaddexp(0.0, -x)))


def mined(P, T, U, steps, lr):
    """Hard user mining written out: û ← û − lr · ∂/∂û mean_t −log(1 − σ(p_t·û))."""
    U = U.copy()
    for _ in range(steps):
        for s in range(U.shape[0]):
            sig = 1 / (1 + np.exp(-(P[T] @ U[s])))
            U[s] = U[s] - lr * (sig @ P[T]) / len(T)
    return U


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.integers(0, 3))
def test_gradient_is_the_derivative_of_the_loss(seed, steps):
    rng = np.random.default_rng(seed)
    n_items, d, S = 7, 3, 4
    P = rng.normal(size=(n_items, d))
    T = np.sort(rng.choice(n_items, size=rng.integers(1, 4), replace=False))
    U = rng.normal(size=(S, d))
    g = promotion_gradient(P, T, U, steps, 0.1)
    Um = mined(P, T, U, steps, 0.1)  # the mined users are fixed (detached) when L is derived
    h = 1e-6
    for j, t in enumerate(T):
        for c in range(d):
            Pp, Pm = P.copy(), P.copy()
            Pp[t, c] += h
            Pm[t, c] -= h
            fd = (loss(Pp, T, Um) - loss(Pm, T, Um)) / (2 * h)
            assert g[j, c] == pytest.approx(fd, rel=1e-5, abs=1e-9)


def test_known_answer_one_user_one_target():
    # p = (1, 0), û = (2, 1): x = 2, ∂L/∂p = −(1 − σ(2))·û
    g = promotion_gradient(np.array([[1.0, 0.0], [5.0, 5.0]]), [0], np.array([[2.0, 1.0]]))
    s = 1 / (1 + np.exp(-2.0))
    np.testing.assert_allclose(g, [[-(1 - s) * 2, -(1 - s) * 1]], rtol=1e-15)


def fism_round(n=5, n_items=9, d=3, opt="adam", seed=0, dtype=np.float64):
    model = MODELS.get("fism")(n_items=n_items, dim=d)
    o = OPTIMIZERS.get(opt)()
    rng = np.random.default_rng(seed)
    state = o.init(rng.normal(size=model.n_params()).astype(dtype))
    for k in o.arrays:
        if k != "theta":
            state[k] = (1e-3 * np.abs(rng.normal(size=model.n_params()))).astype(dtype)
    G = (1e-2 * rng.normal(size=(n, model.n_params()))).astype(dtype)
    return model, o, state, G


def test_sgd_upload_moves_only_the_targets_item_rows(at):
    model, opt, state, G = fism_round(opt="sgd")
    byz = np.array([True, False, True, False, False])
    attack = ARA(targets="2,7")
    up, honest, diag = at.run(attack, opt, state, G, byz, 3, model=model)
    assert diag["targets"] == [2, 7] and len(diag["gradient_norm"]) == 2
    d = model.dim
    moved = np.zeros(model.n_params(), bool)
    for t in (2, 7):
        moved[t * d:(t + 1) * d] = True
    for r in np.flatnonzero(byz):
        delta = up["theta"][r] - state["theta"]
        assert (delta[~moved] == 0).all() and (delta[moved] != 0).all()
    for k in opt.arrays:
        np.testing.assert_array_equal(up[k][~byz], honest[k][~byz])


def test_the_server_recovers_the_promotion_gradient(at):
    model, opt, state, G = fism_round(opt="sgd")
    byz = np.array([False, True, False, False, True])
    attack = ARA(targets="4", samples=3, sigma=0.5)
    ctx, _ = at.context(opt, state, G, byz, 2, model=model)
    rng = np.random.default_rng(0)
    ctx.rng = np.random.default_rng(0)
    attack.apply_inplace(ctx)
    P = model.unpack(state["theta"])[0]
    d = model.dim
    rec = np.empty(G.shape)
    opt.recover_batch(state, ctx.uploads, 2, rec, backend="numpy")
    for r in (1, 4):  # draws in row order, S·d standard normals per Byzantine client
        want = promotion_gradient(P, [4], 0.5 * rng.standard_normal((3, d)))
        np.testing.assert_allclose(rec[r, 4 * d:5 * d], want[0], rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("opt", OPTIMIZERS.names())
@pytest.mark.parametrize("model_name", ["fism", "fmf"])
def test_uploads_pass_verification_and_backends_agree(opt, model_name, at):
    model = MODELS.get(model_name)(n_items=8, dim=3)
    o = OPTIMIZERS.get(opt)()
    rng = np.random.default_rng(1)
    state = o.init(rng.normal(size=model.n_params()).astype(np.float32))
    G = (1e-2 * rng.normal(size=(4, model.n_params()))).astype(np.float32)
    byz = np.array([True, False, True, True])
    attack = ARA(targets="0,5", hum_steps=30)
    runs = [at.run(attack, o, state, G, byz, 3, backend=b, seed=7, model=model)
            for b in ("numba", "numpy")]
    for k in o.arrays:
        np.testing.assert_array_equal(runs[0][0][k], runs[1][0][k])
    ok, _, _ = o.verify_batch(state, runs[0][0], 3, backend="numpy")
    assert ok.all()
    assert runs[0][2] == runs[1][2]


def test_targets_are_resolved_from_ids_or_drawn_with_the_seed():
    assert ARA(targets=" 5, 1,3").resolve_targets(10, 0).tolist() == [1, 3, 5]
    a = ARA(n_targets=3)
    t0 = a.resolve_targets(50, 0)
    assert t0.tolist() == sorted(set(t0.tolist())) and len(t0) == 3 and t0.max() < 50
    np.testing.assert_array_equal(t0, a.resolve_targets(50, 0))
    assert any(not np.array_equal(t0, a.resolve_targets(50, s)) for s in range(1, 5))
    with pytest.raises(ValueError, match="n_targets=11 with 10 items"):
        ARA(n_targets=11).resolve_targets(10, 0)
    with pytest.raises(ValueError, match="comma-separated integer"):
        parse_targets("1,x", 10)
    with pytest.raises(ValueError, match=r"0\.\.9"):
        parse_targets("3,10", 10)


def test_configuration_errors_are_named(at):
    with pytest.raises(ValueError, match="applies to models fism, fmf only"):
        ARA().check_model("other")
    model, opt, state, G = fism_round()
    byz = np.array([True, False, False, False, False])
    ctx, _ = at.context(opt, state, G, byz, 1, model=model)
    with pytest.raises(ValueError, match="target items resolved"):
        ARA().apply_inplace(ctx)
    ctx, _ = at.context(opt, state, G, byz, 1)
    with pytest.raises(ValueError, match="needs the model"):
        ARA(targets="1").apply_inplace(ctx)


def test_non_finite_state_gives_a_non_finite_upload_not_a_crash(at):
    model, opt, state, G = fism_round(opt="sgd")
    state["theta"][model.dim * 3] = np.nan
    byz = np.array([True, False, False, False, False])
    up, _, diag = at.run(ARA(targets="3"), opt, state, G, byz, 1, model=model)
    assert np.isnan(diag["gradient_norm"][0])


@pytest.mark.parametrize("model", ["fism", "fmf"])
def test_cli_run_records_targets_and_their_metrics(model, tmp_path):
    from click.testing import CliRunner

    from rfrs_ref.cli.main import main

    out = tmp_path / "run"
    res = CliRunner().invoke(main, [
        "train", "--dataset", "synthetic", "--synthetic-users", "60", "--synthetic-items", "50",
        "--synthetic-mean-items", "8", "--dim", "4", "--client-fraction", "0.25",
        "--byzantine-fraction", "0.3", "--model", model, "--rounds", "3", "--attack", "a-ra",
        "--a-ra-n-targets", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    final = json.loads((out / "final_metrics.json").read_text())
    cfg = json.loads((out / "config.json").read_text())
    targets = final["target_items"]
    assert f"target items {targets}: ER@1 " in res.output and "TargetHR@5" in res.output
    assert len(targets) == 2 and cfg["derived"]["target_items"] == targets
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[-2:] == ["er", "target_hr"]
    for k in (1, 5):
        assert 0.0 <= final["model"][f"er@{k}"] <= 1.0
        assert 0.0 <= final["model"][f"target_hr@{k}"] <= 1.0
    records = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    assert all(r["attack"]["targets"] == targets for r in records if r["n_byzantine_sampled"])


def test_runs_without_targets_keep_their_files(tmp_path):
    from click.testing import CliRunner

    from rfrs_ref.cli.main import main

    out = tmp_path / "run"
    res = CliRunner().invoke(main, [
        "train", "--dataset", "synthetic", "--synthetic-users", "40", "--synthetic-items", "30",
        "--dim", "4", "--rounds", "2", "--attack", "ipm", "--byzantine-fraction", "0.2",
        "--out", str(out)])
    assert res.exit_code == 0, res.output
    final = json.loads((out / "final_metrics.json").read_text())
    assert "target_items" not in final and not any("er@" in k for k in final["model"])
    assert "target_items" not in json.loads((out / "config.json").read_text())["derived"]
    assert (out / "metrics.csv").read_text().splitlines()[0].endswith("popularity_mrr")


def test_resume_gives_the_uninterrupted_run_and_its_target_metrics(tmp_path):
    import dataclasses

    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.trainer import Trainer, train

    c = TrainConfig(dataset="synthetic", dataset_params={"n_users": 80, "n_items": 60},
                    rounds=6, eval_every=3, client_fraction=0.1, attack="a-ra",
                    attack_params={"n_targets": 3, "hum_steps": 2}, byzantine_fraction=0.2,
                    defense="trmean")
    full = train(c, tmp_path / "full")
    Trainer(dataclasses.replace(c, rounds=3)).run(tmp_path / "part")
    rec = json.loads((tmp_path / "part/config.json").read_text())
    rec["config"]["rounds"] = 6
    (tmp_path / "part/config.json").write_text(json.dumps(rec))
    done = Trainer(c).run(tmp_path / "part", resume=True)
    for k in full.state:
        assert done.state[k].tobytes() == full.state[k].tobytes(), k
    a = json.loads((tmp_path / "full/final_metrics.json").read_text())
    b = json.loads((tmp_path / "part/final_metrics.json").read_text())
    assert a["target_items"] == b["target_items"] and a["model"] == b["model"]
    assert (tmp_path / "full/metrics.csv").read_text() == (tmp_path / "part/metrics.csv").read_text()


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_laws_on_random_rounds(data, at):
    # honest rows, gradients and state untouched; uploads obey the rule; backends agree
    model = MODELS.get(data.draw(st.sampled_from(["fism", "fmf"])))(
        n_items=data.draw(st.integers(1, 12)), dim=data.draw(st.integers(1, 5)))
    opt = OPTIMIZERS.get(data.draw(st.sampled_from(OPTIMIZERS.names())))()
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    n = data.draw(st.integers(1, 5))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    state = opt.init(rng.normal(size=model.n_params()).astype(dtype))
    for k in opt.arrays:
        if k != "theta":
            state[k] = (1e-3 * np.abs(rng.normal(size=model.n_params()))).astype(dtype)
    G = (1e-2 * rng.normal(size=(n, model.n_params()))).astype(dtype)
    G.flags.writeable = False
    byz = rng.random(n) < 0.5
    byz[rng.integers(n)] = True
    T = sorted(rng.choice(model.n_items, size=rng.integers(1, model.n_items + 1), replace=False))
    attack = ARA(targets=",".join(map(str, T)), samples=data.draw(st.integers(1, 4)),
                 hum_steps=data.draw(st.integers(0, 3)))
    before = {k: v.copy() for k, v in state.items()}
    runs = [at.run(attack, opt, state, G, byz, 3, backend=b, seed=5, model=model)
            for b in ("numba", "numpy")]
    up, honest, diag = runs[0]
    for k in opt.arrays:
        np.testing.assert_array_equal(up[k][~byz], honest[k][~byz])
        np.testing.assert_array_equal(state[k], before[k])
        np.testing.assert_array_equal(up[k], runs[1][0][k])
    assert diag["targets"] == [int(t) for t in T]
    ok, _, _ = opt.verify_batch(state, up, 3, backend="numpy")
    assert ok.all()
