"""Recovery returns the gradient, to the rounding of the rule and its inverse (SPEC §9)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rfrs_ref.optim import OPTIMIZERS, VERIFY_SAFETY

NAMES = tuple(OPTIMIZERS.names())
DTYPES = (np.float32, np.float64)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_recovery_returns_the_gradient(name, dtype, data, ot):
    """|ĝ − g| ≤ S·B per coordinate, for arbitrary states and gradients.

    B is the derived first-order bound of :mod:`rfrs_ref.optim.tolerance`: the
    rule's roundings (float64 registers, one store per uploaded array in the
    arrays' dtype; or every operation in that dtype), divided by the factor
    the inverse applies (1/η for SGD, 1/(1 − β₁) for Adam, (√r + ε)/η for
    AdaGrad/RMSProp, 1 for momentum), plus the inverse's own roundings and
    the store of ĝ. Per optimiser, with u the dtype's unit roundoff:
    sgd u(2|θ̄|/η + 7|ĝ|), momentum u(5β₃|m̄| + 6|ĝ|), adam
    u(6β₁|m̄|/(1 − β₁) + 9|ĝ|), adagrad/rmsprop u(2|θ̄|(√r + ε)/η + 14|ĝ|),
    and absolute terms for underflow. S = VERIFY_SAFETY covers second-order
    terms. Checked on the fused kernels (rule and recovery) and on the oracle
    (rule in float64 stored in dtype, float64 recovery).
    """
    opt, state, grads, t = data.draw(ot.cases(name, dtype))
    n, D = grads.shape
    for up in (ot.upload_numba(opt, state, grads, t, dtype), ot.upload_oracle(opt, state, grads, t, dtype)):
        X = np.full((n, D), np.nan, dtype=dtype)
        opt.recover_batch(state, up, t, X)
        for r in range(n):
            g = grads[r].astype(np.float64)
            err = np.abs(X[r].astype(np.float64) - g)
            bound = opt.recovery_bound(state, ot.row(up, r), t, recovered=X[r])
            assert (err <= VERIFY_SAFETY * bound).all(), (r, err, bound)
            g_oracle = opt.recover(state, ot.row(up, r), t)
            assert (np.abs(g_oracle - g) <= VERIFY_SAFETY * opt.recovery_bound(state, ot.row(up, r), t)).all()


@pytest.mark.parametrize("name", NAMES)
def test_recovery_is_exact_to_float64_rounding_in_float64(name, rng):
    """In float64 at the paper's hyperparameters, recovery keeps ≥ 9 significant digits."""
    from rfrs_ref.optim import OPTIMIZERS

    opt = OPTIMIZERS.get(name)()
    D = 1000
    state = opt.init(rng.standard_normal(D))
    g = rng.standard_normal(D)
    up = opt.client_rule(state, g, 3)
    np.testing.assert_allclose(opt.recover(state, up, 3), g, rtol=1e-9, atol=0)
