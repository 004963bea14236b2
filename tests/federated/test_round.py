"""The round loop against a hand-computed two-client example (SPEC §2–5).

Three items, d = 1, γ = 1, exact negatives. Client A trains on {0, 1}, client
B on {2} (a client with one item, whose own-item score is 0). The gradients
below are written out by hand from the FISM/BPR formulas, independently of
the library's model code.
"""

import numpy as np
import pytest

from rfrs_ref.aggregate import RULES
from rfrs_ref.attack import ATTACKS
from rfrs_ref.data.base import Interactions
from rfrs_ref.federated.round import Federation, RoundBuffers, run_round
from rfrs_ref.model import MODELS
from rfrs_ref.optim import OPTIMIZERS

LAM = 1e-3
B1, B2, ETA, EPS = 0.9, 0.999, 0.01, 1e-8


def sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def hand_gradients(theta):
    p0, p1, p2, q0, q1, q2 = theta
    # client A: S = {0, 1}, S- = {2}
    y0, y1, y2 = p0 * q1, p1 * q0, p2 * (q0 + q1) / 2
    c0, c1 = sig(-(y0 - y2)), sig(-(y1 - y2))
    gA = np.array([
        -c0 * q1,
        -c1 * q0,
        (c0 + c1) * (q0 + q1) / 2,
        -c1 * p1 + (c0 + c1) * p2 / 2,
        -c0 * p0 + (c0 + c1) * p2 / 2,
        0.0,
    ]) + 2 * LAM * theta
    # client B: S = {2} (own score 0), S- = {0, 1}
    e0, e1 = sig(p0 * q2), sig(p1 * q2)
    gB = np.array([e0 * q2, e1 * q2, 0.0, 0.0, 0.0, e0 * p0 + e1 * p1]) + 2 * LAM * theta
    return gA, gB


def hand_adam(theta, m, v, g, t):
    m1 = B1 * m + (1 - B1) * g
    v1 = B2 * v + (1 - B2) * g * g
    eta_t = ETA * np.sqrt(1 - B2**t) / (1 - B1**t)
    return theta - eta_t * m1 / (np.sqrt(v1) + EPS), m1, v1


def federation(backend):
    train = Interactions.from_lists("two", 3, [[0, 1], [2]])
    model = MODELS.get("fism")(n_items=3, dim=1, gamma=1.0, lam=LAM, negatives=0)
    opt = OPTIMIZERS.get("adam")(lr=ETA, beta1=B1, beta2=B2, eps=EPS)
    fed = Federation(model=model, optimizer=opt, rule=RULES.get("mean")(), detect="gradient",
                     attack=ATTACKS.get("none")(), train=train, byzantine=np.zeros(2, bool),
                     client_fraction=1.0, assumed_fraction=0.0, seed=0, verify=True,
                     backend=backend)
    return fed, opt


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_two_rounds_match_hand_computation(backend):
    fed, opt = federation(backend)
    theta0 = np.array([0.3, -0.7, 0.5, 1.1, -0.4, 0.8])
    state = opt.init(theta0)
    buf = RoundBuffers(2, 6, np.float64, opt.arrays)

    theta, m, v = theta0.copy(), np.zeros(6), np.zeros(6)
    for t in (1, 2):
        gA, gB = hand_gradients(theta)
        tA, mA, vA = hand_adam(theta, m, v, gA, t)
        tB, mB, vB = hand_adam(theta, m, v, gB, t)
        wA, wB = 2 / 3, 1 / 3  # n_A = 2, n_B = 1 training items
        theta, m, v = wA * tA + wB * tB, wA * mA + wB * mB, wA * vA + wB * vB

        state, record = run_round(fed, state, t, buf)
        np.testing.assert_allclose(state["theta"], theta, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(state["m"], m, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(state["v"], v, rtol=1e-12, atol=1e-16)
        assert record["clients"] == [0, 1]
        assert record["weights"] == pytest.approx([2 / 3, 1 / 3])
        assert record["excluded"] == []


def test_round_does_not_modify_the_state_it_is_given():
    fed, opt = federation("numba")
    state = opt.init(np.array([0.3, -0.7, 0.5, 1.1, -0.4, 0.8]))
    before = {k: v.copy() for k, v in state.items()}
    run_round(fed, state, 1, RoundBuffers(2, 6, np.float64, opt.arrays))
    for k in state:
        np.testing.assert_array_equal(state[k], before[k])
