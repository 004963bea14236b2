"""Laws every attack obeys, for random rounds (Hypothesis) and every optimiser.

- honest rows, the gradients and the server state are never touched;
- an attack is a function of its inputs and its generator (determinism);
- gradient-space attacks obey the update rule (verification passes), noise
  breaks it; the server recovers the gradient the attack chose;
- the Numba and NumPy backends give the same uploads;
- camouflaged clients' parameter-space features θᵢ − θ̄ are their honest twins'.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.attack import ATTACKS, alie_gradient, alie_z, ipm_gradient
from rfrs_ref.optim import VERIFY_SAFETY

# the attacks that run on any (state, gradients); those that read the model (a-ra) have
# their own laws in tests/attack/test_promotion.py
ATTACK_NAMES = tuple(n for n, c in ATTACKS.items() if not c.needs_model)


def snapshot(*arrays_or_dicts):
    out = []
    for x in arrays_or_dicts:
        if isinstance(x, dict):
            out.append({k: np.array(v, copy=True) for k, v in x.items()})
        else:
            out.append(np.array(x, copy=True))
    return out


@settings(max_examples=15)
@given(data=st.data())
@pytest.mark.parametrize("name", ATTACK_NAMES)
def test_honest_rows_gradients_and_state_are_never_touched(name, data, at):
    opt, state, grads, byz, t, _ = data.draw(at.scenarios(at.optimizers_for(name)))
    before_state, before_grads = snapshot(state, grads)
    grads.flags.writeable = False  # as in the round loop
    ctx, honest = at.context(opt, state, grads, byz, t,
                             backend=data.draw(st.sampled_from(["numba", "numpy"])))
    ATTACKS.get(name)().apply_inplace(ctx)
    for k in opt.arrays:
        np.testing.assert_array_equal(ctx.uploads[k][~byz], honest[k][~byz])
        np.testing.assert_array_equal(state[k], before_state[k])
    np.testing.assert_array_equal(grads, before_grads)


@settings(max_examples=10)
@given(data=st.data())
@pytest.mark.parametrize("name", ATTACK_NAMES)
def test_deterministic_given_the_generator(name, data, at):
    opt, state, grads, byz, t, _ = data.draw(at.scenarios(at.optimizers_for(name)))
    seed = data.draw(st.integers(0, 2**63))
    runs = [at.run(ATTACKS.get(name)(), opt, state, grads, byz, t, seed=seed) for _ in range(2)]
    for k in opt.arrays:
        np.testing.assert_array_equal(runs[0][0][k], runs[1][0][k])
    assert runs[0][2] == runs[1][2]


@settings(max_examples=10)
@given(data=st.data())
@pytest.mark.parametrize("name", ATTACK_NAMES)
def test_backends_agree(name, data, at):
    opt, state, grads, byz, t, dtype = data.draw(at.scenarios(at.optimizers_for(name)))
    nb, _, d_nb = at.run(ATTACKS.get(name)(), opt, state, grads, byz, t, backend="numba", seed=1)
    np_, _, d_np = at.run(ATTACKS.get(name)(), opt, state, grads, byz, t, backend="numpy", seed=1)
    # ALIE and IPM sum in a different order (pairwise in NumPy): the attack
    # gradients may differ by a rounding of the dtype, and the uploads by as much
    u = np.finfo(dtype).eps / 2
    for k in opt.arrays:
        if name in ("alie", "ipm"):
            scale = np.abs(np_[k].astype(np.float64)).max(axis=1, keepdims=True)
            assert np.all(np.abs(nb[k].astype(np.float64) - np_[k]) <= 8 * u * scale)
        else:
            np.testing.assert_array_equal(nb[k], np_[k])
    assert d_nb.keys() == d_np.keys()


@settings(max_examples=15)
@given(data=st.data())
@pytest.mark.parametrize("name", ["ascent", "alie", "ipm", "camouflage", "mimic", "opt-ipm",
                                  "opt-alie"])
def test_gradient_space_attacks_pass_verification(name, data, at):
    opt, state, grads, byz, t, _ = data.draw(at.scenarios(at.optimizers_for(name)))
    attack = ATTACKS.get(name)()
    assert attack.obeys_rule
    up, _, _ = at.run(attack, opt, state, grads, byz, t,
                      backend=data.draw(st.sampled_from(["numba", "numpy"])))
    for backend in ("numba", "numpy"):
        ok, check, violation = opt.verify_batch(state, up, t, backend=backend)
        assert ok.all(), (check, violation)


def intended_gradients(name, grads, byz):
    """What the server should recover from each Byzantine row (float64)."""
    G = grads.astype(np.float64)
    rows = np.flatnonzero(byz)
    if name == "ascent":
        return -G[rows]
    if name == "alie":
        g = alie_gradient(G, rows, alie_z(grads.shape[0], rows.size), 1)
    else:
        g = ipm_gradient(G, rows, 0.1)
    return np.repeat(g[None, :], rows.size, axis=0)


@settings(max_examples=15)
@given(data=st.data())
@pytest.mark.parametrize("name", ["ascent", "alie", "ipm"])
def test_server_recovers_the_attack_gradient(name, data, at):
    opt, state, grads, byz, t, dtype = data.draw(at.scenarios())
    up, _, _ = at.run(ATTACKS.get(name)(), opt, state, grads, byz, t)
    want = intended_gradients(name, grads, byz)
    rec = np.empty(grads.shape, np.float64)
    opt.recover_batch(state, up, t, rec, backend="numpy")
    # the attack gradient is computed in float64 (sums in another order than
    # here) and stored in the run's dtype before the rule: a few roundings of the
    # gradients it is made of, on top of the recovery's own error
    u = np.finfo(dtype).eps / 2
    rows = np.flatnonzero(byz)
    colmax = np.abs(grads[rows].astype(np.float64)).max(axis=0)
    z = alie_z(grads.shape[0], rows.size) if name == "alie" else 1.0
    for i, r in enumerate(rows):
        bound = VERIFY_SAFETY * opt.recovery_bound(state, {k: up[k][r] for k in opt.arrays}, t)
        tol = bound + 8 * u * (1 + z) * colmax
        assert np.all(np.abs(rec[r] - want[i]) <= tol)


@settings(max_examples=15)
@given(data=st.data())
def test_noise_fails_verification(data, at):
    # stateful optimisers only: SGD uploads θ alone, which nothing can check
    opt, state, grads, byz, t, _ = data.draw(
        at.scenarios(("momentum", "adam", "adagrad", "rmsprop")))
    # σ far above the rounding of θ (|θ̄| ~ 1 plus a step)
    sigma = data.draw(st.sampled_from([1e-2, 1.0]))
    D = grads.shape[1]
    up, _, _ = at.run(ATTACKS.get("noise")(sigma=sigma), opt, state, grads, byz, t,
                      seed=data.draw(st.integers(0, 1000)))
    ok, check, _ = opt.verify_batch(state, up, t)
    # a client whose D draws all land within rounding of 0 would pass: with
    # σ ≥ 1e-2 that needs every |z| < 1e-4, probability < 1e-4 per coordinate
    if D >= 2:
        assert not ok[byz].any()
        # a rule check fails, not a structural one (the noise is finite)
        assert all(check[r] not in (None, "nonfinite") for r in np.flatnonzero(byz))
    assert ok[~byz].all()


@settings(max_examples=15)
@given(data=st.data())
def test_camouflaged_parameter_features_equal_their_honest_twins(data, at):
    opt, state, grads, byz, t, dtype = data.draw(at.scenarios(("adam",)))
    up, honest, diag = at.run(ATTACKS.get("camouflage")(), opt, state, grads, byz, t)
    tb = state["theta"].astype(np.float64)
    u = np.finfo(dtype).eps / 2
    for r in np.flatnonzero(byz):
        feat = up["theta"][r].astype(np.float64) - tb
        twin = honest["theta"][r].astype(np.float64) - tb
        # to rounding of θ (a few ulps of |θ̄| + |step|), coordinate by coordinate
        assert np.all(np.abs(feat - twin) <= 6 * u * (np.abs(tb) + np.abs(twin)))
    assert 0.0 <= diag["camouflaged_fraction"] <= 1.0
    assert len(diag["camouflaged_fraction_per_client"]) == int(byz.sum())


@pytest.mark.parametrize("name", ATTACK_NAMES)
def test_no_byzantine_row_changes_nothing(name, at):
    rng = np.random.default_rng(0)
    from rfrs_ref.optim import Adam

    opt = Adam()
    state = at.realistic_state(opt, rng, 30, np.float32)
    G = (1e-3 * rng.standard_normal((3, 30))).astype(np.float32)
    up, honest, _ = at.run(ATTACKS.get(name)(), opt, state, G, [False, False, False], 4)
    for k in opt.arrays:
        np.testing.assert_array_equal(up[k], honest[k])


@pytest.mark.parametrize("name", ATTACK_NAMES)
def test_every_byzantine_row_and_single_client_round(name, at):
    rng = np.random.default_rng(1)
    from rfrs_ref.optim import Adam

    opt = Adam()
    state = at.realistic_state(opt, rng, 30, np.float64)
    for n in (1, 3):
        G = 1e-3 * rng.standard_normal((n, 30))
        up, _, diag = at.run(ATTACKS.get(name)(), opt, state, G, [True] * n, 4)
        for k in opt.arrays:
            if name == "inf":  # its uploads are +inf by definition
                assert np.isposinf(up[k]).all()
            else:
                assert np.isfinite(up[k]).all()
        if name == "alie" and n == 1:
            assert diag["z"] == 0.0
