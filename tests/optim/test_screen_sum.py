"""The server's one pass for a rule with fixed weights: the verification screen and the
weighted sums together (``Optimizer.screen_sum_batch``, docs/performance.md).

Its contract: the sums are ``combine_rows``'s bit for bit, whatever the rows hold, and
the rows it calls sure are exactly those the screened verification passes without the
exact kernel, so that a round that uses it ends in the same state as one that verifies,
then combines.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.aggregate import RULES
from rfrs_ref.aggregate.combine import combine_rows
from rfrs_ref.optim import OPTIMIZERS

NAMES = tuple(OPTIMIZERS.names())
DTYPES = (np.float32, np.float64)


def _weights(rng, n):
    w = rng.integers(1, 300, size=n).astype(np.float64)
    return w / w.sum()


def _same_bits(a, b):
    return a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _check(opt, state, up, t, w):
    out = opt.screen_sum_batch(state, up, t, w)
    assert out is not None, f"{opt.name} has no one-pass kernel"
    sure, sums = out
    for k in opt.arrays:
        assert _same_bits(sums[k], combine_rows(up[k], w)), k
    ok, _, violation = opt.verify_batch(state, up, t, screen=True)
    if opt.checks == ("nonfinite",):
        # SGD's one check is its screen: sure is the exact verdict
        assert np.array_equal(sure, ok)
    else:
        # a row is sure exactly when the screened verification passed it without the
        # exact kernel (no ratio reported); sure rows pass
        assert np.array_equal(sure, ok & np.isnan(violation))
    return sure


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=15)
@given(data=st.data())
def test_sums_and_sure_rows_agree_with_verify_then_combine(name, dtype, data, ot):
    """Arbitrary states, gradients and hyperparameters (the extremes of the verification
    tests), honest uploads with one coordinate possibly tampered or non-finite."""
    opt, state, grads, t = data.draw(ot.cases(name, dtype, n_max=9))
    up = ot.upload_numba(opt, state, grads, t, dtype)
    ot.tamper(data, opt, up)
    w = _weights(np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))), grads.shape[0])
    sure = _check(opt, state, up, t, w)
    honest = ot.upload_numba(opt, state, grads, t, dtype)
    if all(np.array_equal(up[k], honest[k], equal_nan=True) for k in opt.arrays):
        assert sure.all()


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [1, 4, 7])
def test_many_blocks_ragged_rows_and_hostile_rows(name, dtype, n, rng, ot):
    """D spanning several column blocks with a ragged last one, row counts around the
    sums' groups of four; NaN, inf and 1e38 rows are not sure, honest ones are."""
    from rfrs_ref.kernels.optim import SCREEN_SUM_BLOCK

    D = 3 * SCREEN_SUM_BLOCK + 37
    opt = OPTIMIZERS.get(name)()
    state = ot.realistic_state(opt, rng, D, dtype)
    G = (0.01 * rng.standard_normal((n, D))).astype(dtype)
    up = ot.upload_numba(opt, state, G, 4, dtype)
    w = _weights(rng, n)
    assert _check(opt, state, up, 4, w).all()
    bad = {0: np.nan, min(1, n - 1): np.inf, n - 1: 1e38}
    for r, value in bad.items():
        up["theta"][r, D - 1 - r] = value
    sure = _check(opt, state, up, 4, w)
    for r, value in bad.items():
        # a finite 1e38 θ is a valid SGD upload (its one check is finiteness)
        assert sure[r] == (np.isfinite(value) and opt.checks == ("nonfinite",)), (r, value)


def test_weights_must_be_positive_and_one_per_row(rng, ot):
    opt = OPTIMIZERS.get("adam")()
    state = ot.realistic_state(opt, rng, 50, np.float32)
    up = ot.upload_numba(opt, state, rng.standard_normal((3, 50)).astype(np.float32), 2, np.float32)
    with pytest.raises(ValueError, match="every one > 0"):
        opt.screen_sum_batch(state, up, 2, np.array([0.5, 0.5, 0.0]))
    with pytest.raises(ValueError, match="3 weights"):
        opt.screen_sum_batch(state, up, 2, np.array([0.5, 0.5]))


def test_a_rule_takes_precomputed_sums_only_when_its_weights_are_fixed(rng):
    X = rng.standard_normal((6, 40)).astype(np.float32)
    arrays = {"theta": X}
    n_samples = rng.integers(1, 20, size=6)
    mean = RULES.get("mean")()
    plain = mean.aggregate(X, arrays, n_samples, 0)
    w = mean.fixed_weights(n_samples.astype(np.float64))
    given_sums = mean.from_sums({"theta": combine_rows(X, w)}, n_samples, 0)
    assert _same_bits(plain.arrays["theta"], given_sums.arrays["theta"])
    assert np.array_equal(plain.weights, given_sums.weights)
    assert np.array_equal(plain.kept, given_sums.kept)
    assert plain.diagnostics == given_sums.diagnostics
    for name in RULES.names():
        rule = RULES.get(name)()
        if not rule.has_fixed_weights:
            with pytest.raises(TypeError, match="weights"):
                rule.fixed_weights(n_samples)
            with pytest.raises(TypeError, match="precomputed sums"):
                rule.from_sums({"theta": X[0]}, n_samples, 0)


@pytest.mark.parametrize("name", NAMES)
def test_batches_of_rows_continue_the_sums_of_one_call(name, rng, ot):
    """Rows added into running sums in batches of a multiple of four (the last shorter)
    give one call's sums bit for bit; the sure rows are the same."""
    D, n = 700, 23
    opt = OPTIMIZERS.get(name)()
    state = ot.realistic_state(opt, rng, D, np.float32)
    up = ot.upload_numba(opt, state, (0.01 * rng.standard_normal((n, D))).astype(np.float32), 3,
                         np.float32)
    up["theta"][9, 5] = np.nan
    w = _weights(rng, n)
    sure, sums = opt.screen_sum_batch(state, up, 3, w)
    for batch in (4, 8, 12):
        acc = {k: np.zeros(D) for k in opt.arrays}
        parts = [opt.screen_sum_batch(state, {k: v[lo:lo + batch] for k, v in up.items()}, 3,
                                      w[lo:lo + batch], into=acc)[0] for lo in range(0, n, batch)]
        assert np.array_equal(np.concatenate(parts), sure)
        for k in opt.arrays:
            assert _same_bits(acc[k].astype(np.float32), sums[k]), (batch, k)
    unscreened = opt.screen_sum_batch(state, up, 3, w, screen=False)
    assert unscreened[0].all()
    assert all(_same_bits(unscreened[1][k], sums[k]) for k in opt.arrays)
    with pytest.raises(ValueError, match="float64 array"):
        opt.screen_sum_batch(state, up, 3, w, into={k: np.zeros(D, np.float32) for k in opt.arrays})
