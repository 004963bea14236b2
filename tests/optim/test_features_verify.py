"""The server's one read of the uploads for a rule that compares every row: the detection
features and the verification verdicts together (``Optimizer.features_verify_batch``,
docs/performance.md).

Its contract: the features are ``recover_batch``'s (gradient space) or the round's
θ − θ̄ (parameter space), and the verdicts ``verify_batch(screen=True)``'s, bit for bit,
whatever the rows hold; the NumPy backend (the oracle) makes those calls itself.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.optim import OPTIMIZERS

NAMES = tuple(OPTIMIZERS.names())
DTYPES = (np.float32, np.float64)
SPACES = ("gradient", "parameter")


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def _two_calls(opt, state, up, t, space, dtype, backend="numba"):
    """The features and verdicts as the round computed them before the one read."""
    n, D = up["theta"].shape
    X = np.full((n, D), np.nan, dtype=dtype)
    if space == "gradient":
        opt.recover_batch(state, up, t, X, backend=backend)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            np.subtract(up["theta"], state["theta"], out=X)
    verdicts = opt.verify_batch(state, up, t, recovered=X if space == "gradient" else None,
                                backend=backend, screen=True)
    return X, verdicts


def _check(opt, state, up, t, space, dtype):
    n, D = up["theta"].shape
    X = np.full((n, D), -7.0, dtype=dtype)
    ok, check, violation = opt.features_verify_batch(state, up, t, X, space)
    X2, (ok2, check2, violation2) = _two_calls(opt, state, up, t, space, dtype)
    assert _same_bits(X, X2)
    assert np.array_equal(ok, ok2) and check == check2
    assert _same_bits(violation, violation2)
    return ok


@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=15)
@given(data=st.data())
def test_features_and_verdicts_are_those_of_the_separate_passes(name, dtype, space, data, ot):
    """Arbitrary states, gradients and hyperparameters (the extremes of the verification
    tests), honest uploads with one coordinate possibly tampered or non-finite."""
    opt, state, grads, t = data.draw(ot.cases(name, dtype, n_max=9))
    up = ot.upload_numba(opt, state, grads, t, dtype)
    tampered = ot.tamper(data, opt, up)
    ok = _check(opt, state, up, t, space, dtype)
    if not tampered:
        assert ok.all()  # honest uploads always pass


@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
def test_many_chunks_and_an_upload_that_fails(name, dtype, space, rng, ot):
    """D over several column chunks with a ragged last one; a row whose θ is moved far
    off the rule fails verification (for every optimiser with a rule check), rows with
    NaN or inf fail, honest rows pass; features and verdicts are the exact path's."""
    from rfrs_ref.kernels.optim import CHUNK

    D, n = 2 * CHUNK + 37, 6
    opt = OPTIMIZERS.get(name)()
    state = ot.realistic_state(opt, rng, D, dtype)
    G = (0.01 * rng.standard_normal((n, D))).astype(dtype)
    up = ot.upload_numba(opt, state, G, 4, dtype)
    assert _check(opt, state, up, 4, space, dtype).all()
    up["theta"][1, CHUNK + 3] = np.nan
    up[opt.arrays[0]][2, D - 1] = np.inf
    if opt.checks != ("nonfinite",):
        up["theta"][4] += np.asarray(1e-2, dtype=dtype)  # off the rule everywhere
    ok = _check(opt, state, up, 4, space, dtype)
    expect = np.ones(n, dtype=bool)
    expect[[1, 2]] = False
    if opt.checks != ("nonfinite",):
        expect[4] = False
    assert np.array_equal(ok, expect)


@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize("name", NAMES)
def test_the_oracle_backend_makes_the_two_calls(name, space, rng, ot):
    D, n = 300, 5
    opt = OPTIMIZERS.get(name)()
    state = ot.realistic_state(opt, rng, D, np.float32)
    up = ot.upload_numba(opt, state, (0.01 * rng.standard_normal((n, D))).astype(np.float32), 3,
                         np.float32)
    up["theta"][3, 7] = np.inf
    X = np.zeros((n, D), np.float32)
    ok, check, _ = opt.features_verify_batch(state, up, 3, X, space, backend="numpy")
    X2, (ok2, check2, _) = _two_calls(opt, state, up, 3, space, np.float32, backend="numpy")
    assert _same_bits(X, X2) and np.array_equal(ok, ok2) and check == check2
    assert not ok[3] and ok[[0, 1, 2, 4]].all()
    # the fused kernel's features agree with the oracle's to the dtype's rounding
    Xf = np.zeros((n, D), np.float32)
    okf, _, _ = opt.features_verify_batch(state, up, 3, Xf, space)
    assert np.array_equal(okf, ok)
    np.testing.assert_allclose(Xf[okf], X[ok], rtol=1e-6, atol=0)


def test_arguments_are_checked(rng, ot):
    opt = OPTIMIZERS.get("adam")()
    state = ot.realistic_state(opt, rng, 50, np.float32)
    up = ot.upload_numba(opt, state, rng.standard_normal((3, 50)).astype(np.float32), 2, np.float32)
    with pytest.raises(ValueError, match="space"):
        opt.features_verify_batch(state, up, 2, np.zeros((3, 50), np.float32), "features")
    with pytest.raises(ValueError, match=r"shape \(3, 50\)"):
        opt.features_verify_batch(state, up, 2, np.zeros((2, 50), np.float32))


@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=15)
@given(data=st.data())
def test_a_feature_derivation_gives_the_features_bit_for_bit(name, dtype, space, data, ot):
    """``feature_derivation(space)`` (the features a rule's kernels derive where they read
    one uploaded array: θᵢ − θ̄, or SGD's, momentum's and Adam's recovered gradients) gives
    ``recover_batch``'s and θ − θ̄'s values bit for bit, tampered and non-finite uploads
    included; AdaGrad's and RMSProp's recovery reads two arrays, and they say so."""
    from rfrs_ref.kernels.distances import derived_features

    opt, state, grads, t = data.draw(ot.cases(name, dtype, n_max=9))
    up = ot.upload_numba(opt, state, grads, t, dtype)
    ot.tamper(data, opt, up, (np.nan, np.inf, -np.inf, 3e38, -1e38, 0.0))
    derivation = opt.feature_derivation(space)
    if derivation is None:
        assert space == "gradient" and name in ("adagrad", "rmsprop")
        return
    array, coef = derivation
    X, _ = _two_calls(opt, state, up, t, space, dtype)
    assert _same_bits(derived_features(up[array], state[array], coef), X)


def test_a_feature_derivation_names_its_space():
    with pytest.raises(ValueError, match="'gradient' or 'parameter'"):
        OPTIMIZERS.get("adam")().feature_derivation("features")
