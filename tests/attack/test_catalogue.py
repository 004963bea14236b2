"""Non-finite uploads, mimic, and the optimal (line-searched) IPM and ALIE.

Known answers, laws (Hypothesis), hostile input, and training runs under each.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.aggregate import Krum, Mean, Median, TrimmedMean
from rfrs_ref.attack import (
    ATTACKS,
    Mimic,
    NonFinite,
    OptimalALIE,
    OptimalIPM,
    line_search,
    mean_std,
)
from rfrs_ref.kernels.attacks import mean_std_rows
from rfrs_ref.optim import SGD, Adam, Momentum

BACKENDS = ("numba", "numpy")


def small_round(opt, n=6, D=12, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    state = opt.init(rng.standard_normal(D).astype(dtype))
    for k in opt.arrays:
        if k != "theta":
            state[k] = (1e-3 * np.abs(rng.standard_normal(D))).astype(dtype)
    G = (1e-2 * rng.standard_normal((n, D)) + 3e-3).astype(dtype)
    return state, G


# ----------------------------------------------------------------------------- inf

@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_inf_fills_every_uploaded_array_of_the_byzantine_rows(value, dtype, at):
    opt = Adam()
    state, G = small_round(opt, dtype=dtype)
    byz = np.array([True, False, True, False, False, True])
    up, honest, diag = at.run(NonFinite(value=value), opt, state, G, byz, 3)
    want = {"inf": np.inf, "-inf": -np.inf, "nan": np.nan}[value]
    assert diag == {"value": value}
    for k in opt.arrays:
        assert up[k].dtype == dtype
        np.testing.assert_array_equal(up[k][byz], np.full((3, G.shape[1]), want, dtype))
        np.testing.assert_array_equal(up[k][~byz], honest[k][~byz])


@pytest.mark.parametrize("opt", [SGD(), Momentum(), Adam()])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_verification_rejects_exactly_the_non_finite_uploads(opt, value, at):
    state, G = small_round(opt)
    byz = np.array([False, True, False, True, False, False])
    up, _, _ = at.run(NonFinite(value=value), opt, state, G, byz, 2)
    for backend in BACKENDS:
        ok, checks, _ = opt.verify_batch(state, up, 2, backend=backend)
        np.testing.assert_array_equal(ok, ~byz)


@pytest.mark.parametrize("rule", [Krum(), Median(), TrimmedMean()])
def test_robust_rules_keep_the_aggregate_finite_under_inf(rule, at):
    # without verification, the rules alone: f covers the Byzantine rows
    opt = SGD()
    state, G = small_round(opt, n=7)
    byz = np.array([True, False, False, True, False, False, False])
    up, _, _ = at.run(NonFinite(value="inf"), opt, state, G, byz, 2)
    X = up["theta"] - state["theta"]
    res = rule.aggregate(X, up, np.full(7, 5), 2)
    assert np.isfinite(res.arrays["theta"]).all()


# ----------------------------------------------------------------------------- mimic

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("index, src", [(0, 1), (1, 3), (2, 4), (9, 4)])
def test_mimic_copies_the_chosen_honest_upload(index, src, backend, at):
    opt = Adam()
    state, G = small_round(opt, n=5)
    byz = np.array([True, False, True, False, False])
    ctx, honest = at.context(opt, state, G, byz, 4, backend=backend)
    ctx.clients = np.array([10, 11, 12, 13, 14])
    diag = Mimic(index=index).apply_inplace(ctx)
    assert diag == {"index_used": min(index, 2), "client": 10 + src}
    for k in opt.arrays:
        for r in (0, 2):
            np.testing.assert_array_equal(ctx.uploads[k][r], honest[k][src])
        np.testing.assert_array_equal(ctx.uploads[k][~byz], honest[k][~byz])


def test_mimic_without_honest_clients_uploads_honestly(at):
    opt = Adam()
    state, G = small_round(opt, n=3)
    up, honest, diag = at.run(Mimic(), opt, state, G, [True] * 3, 2)
    assert diag == {"index_used": None, "client": None}
    for k in opt.arrays:
        np.testing.assert_array_equal(up[k], honest[k])


@settings(max_examples=20)
@given(data=st.data())
def test_mimic_rows_are_bitwise_an_honest_upload(data, at):
    opt, state, grads, byz, t, _ = data.draw(at.scenarios())
    index = data.draw(st.integers(0, 6))
    up, honest, diag = at.run(Mimic(index=index), opt, state, grads, byz, t)
    honest_rows = np.flatnonzero(~byz)
    if honest_rows.size == 0:
        return
    src = honest_rows[min(index, honest_rows.size - 1)]
    for k in opt.arrays:
        np.testing.assert_array_equal(up[k][byz], np.repeat(honest[k][src][None], byz.sum(), 0))


# ----------------------------------------------------------------------------- line search

def test_line_search_expands_while_the_objective_grows():
    # J(τ) = τ grows for ever: every step doubles, 20 evaluations reach 10·(2¹⁹ − 1)
    seen = []
    tau, y, used = line_search(lambda x: seen.append(x) or x, 20, 0.0, 10.0, 0.8)
    assert used == 20 and tau == 10.0 * (2**19 - 1) and y == tau
    assert seen[:4] == [0.0, 10.0, 30.0, 70.0]


def test_line_search_contracts_around_a_maximum():
    # J(τ) = −(τ − 25)²: 0 → 10 → 30 (better), 70 worse, then steps 32, 25.6, ... from 30
    seen = []
    tau, y, used = line_search(lambda x: seen.append(x) or -(x - 25.0) ** 2, 20, 0.0, 10.0, 0.8)
    assert seen[:5] == [0.0, 10.0, 30.0, 70.0, 30.0 + 40 * 0.8]
    assert used == 20 and tau == 30.0 and y == -25.0  # the search only moves forward


def test_line_search_never_prefers_nan():
    tau, y, _ = line_search(lambda x: float("nan") if x > 0 else 1.0, 5, 0.0, 1.0, 0.8)
    assert (tau, y) == (0.0, 1.0)


@settings(max_examples=50)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=1, max_size=30),
       st.integers(1, 25), st.floats(-5, 5), st.floats(-20, 20).filter(lambda d: abs(d) > 1e-3),
       st.floats(0.51, 0.99))
def test_line_search_returns_the_best_point_it_evaluated(values, evals, start, delta, ratio):
    seen = []

    def objective(x):
        y = values[len(seen) % len(values)]
        seen.append((x, y))
        return y

    tau, y, used = line_search(objective, evals, start, delta, ratio)
    assert used == len(seen) <= evals and seen[0][0] == start
    assert (tau, y) in seen or (np.isnan(y) and tau == start)
    finite = [v for _, v in seen if not np.isnan(v)]
    if not np.isnan(seen[0][1]):
        assert y == max(finite) or y >= seen[0][1]


# ----------------------------------------------------------------------------- mean and σ

@settings(max_examples=30)
@given(data=st.data())
def test_mean_std_kernel_equals_the_oracle_bit_for_bit(data, at):
    _, _, grads, byz, _, _ = data.draw(at.scenarios())
    rows = np.flatnonzero(byz).astype(np.int64)
    for ddof in (0, 1):
        mu, sd = mean_std(grads, rows, ddof)
        mu2, sd2 = np.full(grads.shape[1], np.nan), np.full(grads.shape[1], np.nan)
        mean_std_rows(grads, rows, ddof, mu2, sd2)
        np.testing.assert_array_equal(mu, mu2)
        np.testing.assert_array_equal(sd, sd2)
        X = grads[rows].astype(np.float64)
        np.testing.assert_allclose(mu, X.mean(0), rtol=1e-12, atol=1e-300)
        if rows.size > ddof:
            np.testing.assert_allclose(sd, X.std(0, ddof=ddof), rtol=1e-9, atol=1e-300)
        else:
            assert (sd == 0).all()


# ----------------------------------------------------------------------------- optimal IPM and ALIE

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cls", [OptimalIPM, OptimalALIE])
def test_optimal_against_the_mean_expands_to_the_end(cls, backend, at):
    # with the mean and equal weights, J(τ) = η·(k/n)·‖μ + τ·d‖ grows with τ ≥ 0
    # (d = −μ for IPM: |1 + τ|; d = σ for ALIE: ‖μ + τσ‖ once τ is past its minimum,
    # here with μ and σ positive, from τ = 0), so all 20 evaluations expand
    opt = SGD()
    state, G = small_round(opt)
    G = np.abs(G)
    byz = np.array([True, False, False, True, False, False])
    up, _, diag = at.run(cls(), opt, state, G, byz, 3, backend=backend, rule=Mean())
    assert diag["tau"] == 10.0 * (2**19 - 1) and diag["evals"] == 20
    assert diag["statistic_rows"] == 4
    mu, sd = mean_std(G, np.flatnonzero(~byz), 1)
    want = -diag["tau"] * mu if cls is OptimalIPM else mu + diag["tau"] * sd
    rec = np.empty_like(G)
    opt.recover_batch(state, up, 3, rec, backend="numpy")
    np.testing.assert_allclose(rec[byz], np.repeat(want[None], 2, 0), rtol=1e-9)


RULES = [Mean(), Median(), TrimmedMean(), Krum()]


@settings(max_examples=12, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("name", ["opt-ipm", "opt-alie"])
def test_optimal_objective_is_the_distance_its_uploads_produce(name, data, at):
    opt, state, grads, byz, t, _ = data.draw(at.scenarios(n_max=7))
    rule = data.draw(st.sampled_from(RULES))
    detect = data.draw(st.sampled_from(["gradient", "parameter"]))
    n = grads.shape[0]
    ns = np.asarray(data.draw(st.lists(st.integers(1, 50), min_size=n, max_size=n)))
    f = data.draw(st.integers(0, max(0, (n - 3) // 2)))
    evals = data.draw(st.integers(1, 8))
    attack = ATTACKS.get(name)(evals=evals)
    try:
        rule.check(n, f)
    except ValueError:
        return
    ctx, honest = at.context(opt, state, grads, byz, t, rule=rule, detect=detect, f=f,
                             n_samples=ns)
    diag = attack.apply_inplace(ctx)
    hon = np.flatnonzero(~byz)
    if hon.size == 0:
        assert diag["tau"] is None
        return
    assert 1 <= diag["evals"] <= evals
    # the server's view of the final uploads, as the round builds it
    U = ctx.uploads
    if detect == "gradient":
        X = np.empty_like(grads)
        opt.recover_batch(state, U, t, X, backend="numba")  # the attack's backend
    else:
        X = U["theta"] - state["theta"]
    res = rule.aggregate(X, U, ns, f)
    w = ns[hon] / ns[hon].sum()
    ref = w @ honest["theta"][hon].astype(np.float64)
    dist = float(np.linalg.norm(res.arrays["theta"].astype(np.float64) - ref))
    if isinstance(diag["objective"], float):
        assert dist == pytest.approx(diag["objective"], rel=1e-9, abs=1e-300)
    # the uploads obey the rule
    ok, _, _ = opt.verify_batch(state, U, t, backend="numpy")
    assert ok.all()


@pytest.mark.parametrize("name", ["opt-ipm", "opt-alie"])
def test_optimal_is_at_least_as_far_as_its_start(name, at):
    opt = Adam()
    state, G = small_round(opt, n=9, D=20, seed=3)
    byz = np.zeros(9, bool)
    byz[[1, 4, 7]] = True
    for rule in RULES:
        full = at.run(ATTACKS.get(name)(), opt, state, G, byz, 5, rule=rule, f=3)[2]
        first = at.run(ATTACKS.get(name)(evals=1), opt, state, G, byz, 5, rule=rule, f=3)[2]
        assert first["tau"] == 0.0 and first["evals"] == 1
        assert full["objective"] >= first["objective"]


def test_optimal_needs_the_rule(at):
    opt = SGD()
    state, G = small_round(opt)
    ctx, _ = at.context(opt, state, G, [True, False, False, False, False, False], 1)
    ctx.rule = None
    with pytest.raises(ValueError, match="'opt-ipm' tunes itself against the server's rule"):
        OptimalIPM().apply_inplace(ctx)


@pytest.mark.parametrize("name", ["opt-ipm", "opt-alie"])
def test_optimal_with_non_finite_honest_gradients_finishes(name, at):
    opt = Adam()
    state, G = small_round(opt, n=6)
    G[2, 3] = np.nan
    G[4, 0] = np.inf
    byz = np.array([True, False, False, True, False, False])
    up, honest, diag = at.run(ATTACKS.get(name)(), opt, state, G, byz, 2, rule=Median(), f=2)
    assert diag["evals"] == 20
    for k in opt.arrays:
        np.testing.assert_array_equal(up[k][~byz], honest[k][~byz])


# ----------------------------------------------------------------------------- training runs

def _train(attack, **kw):
    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.trainer import Trainer

    cfg = TrainConfig(dataset="synthetic",
                      dataset_params={"n_users": 60, "n_items": 50, "mean_items": 8.0},
                      model_params={"dim": 4}, rounds=4, client_fraction=0.25,
                      byzantine_fraction=0.3, attack=attack, eval_every=4, **kw)
    records = []
    trainer = Trainer(cfg)
    result = trainer.run(progress=lambda t, rec, latest: records.append(rec))
    return result, records


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_run_under_inf_excludes_every_byzantine_upload_and_stays_finite(value, optimizer):
    # the plain mean: only verification stands between the uploads and the state (on by
    # default for stateful optimisers; SGD's check is the finiteness of θ alone)
    result, records = _train("inf", attack_params={"value": value}, defense="mean",
                             optimizer=optimizer, verify=True)
    n_byz = sum(r["n_byzantine_sampled"] for r in records)
    excluded = [e for r in records for e in r["excluded"]]
    assert n_byz > 0 and len(excluded) == n_byz and all(e["byzantine"] for e in excluded)
    assert all(e["check"] == "nonfinite" for e in excluded)
    for r in records:
        assert all(np.isfinite(v) for v in r["state_norms"].values())
    assert np.isfinite(result.state["theta"]).all()


@pytest.mark.parametrize("attack", ["mimic", "opt-ipm", "opt-alie"])
@pytest.mark.parametrize("defense", ["krum", "trmean"])
def test_runs_under_mimic_and_optimal_attacks(attack, defense):
    result, records = _train(attack, defense=defense)
    assert all(r["excluded"] == [] for r in records)
    for r in records:
        if r["n_byzantine_sampled"]:
            if attack == "mimic":
                assert r["attack"]["client"] in r["clients"]
            else:
                assert r["attack"]["evals"] == 20
    assert np.isfinite(result.state["theta"]).all()


def test_sgd_run_under_inf_without_verification_stops_with_a_clear_error():
    from rfrs_ref.federated.trainer import NonFiniteState

    with pytest.raises(NonFiniteState, match="without a robust defence or without update-rule"):
        _train("inf", defense="mean", optimizer="sgd")


def _pre_rules():
    from rfrs_ref.aggregate.cc import CenteredClipping
    from rfrs_ref.aggregate.pre import build

    return [build(("bucketing",), {}, TrimmedMean()), build(("clip", "nnm"), {}, Krum()),
            CenteredClipping(tau=0.01)]


@pytest.mark.parametrize("rule_index", range(3))
@pytest.mark.parametrize("name", ["opt-ipm", "opt-alie"])
def test_optimal_simulates_pre_aggregation_and_rule_state_as_the_round_does(name, rule_index, at):
    # the round passes the server state to pre-aggregators and a rule with state; the
    # simulation does too, and draws bucketing's permutation from one seed per round
    rule = _pre_rules()[rule_index]
    opt = Adam()
    state, G = small_round(opt, n=9, D=16, seed=5)
    state.update(rule.init_state(16) if getattr(rule, "state_arrays", ()) else {})
    byz = np.zeros(9, bool)
    byz[[0, 5]] = True
    ctx, honest = at.context(opt, state, G, byz, 4, rule=rule, f=2, seed=11)
    diag = ATTACKS.get(name)(evals=6).apply_inplace(ctx)
    X = np.empty_like(G)
    opt.recover_batch(state, ctx.uploads, 4, X, backend="numba")
    kw = {}
    if getattr(rule, "takes_round_inputs", False):
        seed = int(np.random.default_rng(11).integers(2**63))
        kw = dict(reference=state, rng=np.random.default_rng(seed))
    if getattr(rule, "state_arrays", ()):
        kw["rule_state"] = {k: state[k] for k in rule.state_arrays}
    res = rule.aggregate(X, ctx.uploads, np.full(9, 5), 2, **kw)
    hon = ~byz
    ref = honest["theta"][hon].astype(np.float64).mean(axis=0)
    dist = float(np.linalg.norm(res.arrays["theta"].astype(np.float64) - ref))
    assert dist == pytest.approx(diag["objective"], rel=1e-9)
    assert diag["evals"] == 6


def test_runs_under_optimal_attacks_with_pre_aggregation_and_cc():
    for attack, kw in [("opt-ipm", dict(defense="mean", pre=("bucketing",))),
                       ("opt-ipm", dict(defense="trmean", pre=("clip",))),
                       ("opt-alie", dict(defense="cc", defense_params={"tau": 0.05}))]:
        result, records = _train(attack, **kw)
        assert all(r["excluded"] == [] for r in records)
        assert np.isfinite(result.state["theta"]).all()
