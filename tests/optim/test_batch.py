"""The fused kernels agree with the oracle; a row's upload depends on its gradient only."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.optim import OPTIMIZERS

NAMES = tuple(OPTIMIZERS.names())
DTYPES = (np.float32, np.float64)


def _assert_rounded_oracle(got: np.ndarray, oracle: np.ndarray, dtype) -> None:
    """|kernel − oracle| ≤ (u_dtype + 8·u_64)|oracle| + tiny_dtype.

    The kernel evaluates the oracle's float64 expression in the same order,
    so the only difference is the single rounding of the store into ``dtype``
    (u_dtype, or an underflow to a subnormal, tiny_dtype) plus, should the
    compiler pick a different but equally rounded instruction sequence, a few
    float64 roundings.
    """
    fi = np.finfo(dtype)
    u = float(fi.eps) / 2
    err = np.abs(got.astype(np.float64) - oracle)
    bound = (u + 8 * 2.0**-53) * np.abs(oracle) + float(fi.smallest_subnormal)
    assert (err <= bound).all(), (err, bound)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_numba_rule_and_recovery_equal_the_oracle(name, dtype, data, ot):
    opt, state, grads, t = data.draw(ot.cases(name, dtype))
    n, D = grads.shape
    up = ot.upload_numba(opt, state, grads, t, dtype)
    X = np.full((n, D), np.nan, dtype)
    opt.recover_batch(state, up, t, X)
    for r in range(n):
        want = opt.client_rule(state, grads[r], t)
        for k in opt.arrays:
            _assert_rounded_oracle(up[k][r], want[k], dtype)
        _assert_rounded_oracle(X[r], opt.recover(state, ot.row(up, r), t), dtype)
    # the numpy backend is the oracle itself
    up2 = ot.empty_uploads(opt, n, D, dtype)
    opt.client_rule_batch(state, grads, t, up2, backend="numpy")
    X2 = np.full((n, D), np.nan, dtype)
    opt.recover_batch(state, up2, t, X2, backend="numpy")
    for k in opt.arrays:
        _assert_rounded_oracle(up2[k], np.stack([opt.client_rule(state, g, t)[k] for g in grads]), dtype)


@pytest.mark.parametrize("name", NAMES)
def test_float64_kernels_equal_the_oracle_bit_for_bit(name, rng, ot):
    """Same expression, same order, no fast-math: identical float64 results."""
    opt = OPTIMIZERS.get(name)()
    state = ot.realistic_state(opt, rng, 3000, np.float64)
    G = rng.standard_normal((3, 3000))
    up = ot.upload_numba(opt, state, G, 4, np.float64)
    X = np.empty_like(G)
    opt.recover_batch(state, up, 4, X)
    for r in range(3):
        want = opt.client_rule(state, G[r], 4)
        for k in opt.arrays:
            np.testing.assert_array_equal(up[k][r], want[k])
        np.testing.assert_array_equal(X[r], opt.recover(state, ot.row(up, r), 4))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=20)
@given(data=st.data())
def test_a_rows_upload_is_invariant_to_the_other_rows(name, data, ot):
    """Row r of the batch equals the single-client batch of its gradient, whatever the
    other rows hold (NaN, ±inf, 1e38) and in whatever order the rows are written."""
    dtype = data.draw(st.sampled_from(DTYPES))
    opt, state, grads, t = data.draw(ot.cases(name, dtype, n_max=5))
    n, D = grads.shape
    junk = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e38]))
    G = grads.copy()
    r = data.draw(st.integers(0, n - 1))
    G[np.arange(n) != r] = junk
    perm = np.array(data.draw(st.permutations(range(n))))
    out = ot.empty_uploads(opt, n, D, dtype)
    opt.client_rule_batch(state, G[perm], t, out, rows=perm)  # row i of G[perm] -> out row perm[i]
    alone = ot.upload_numba(opt, state, grads[r:r + 1], t, dtype)
    for k in opt.arrays:
        np.testing.assert_array_equal(out[k][r], alone[k][0])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_rows_subset_writes_only_those_rows(name, backend, rng, ot):
    """The attack family's path: push a few rows' gradients through the rule in place."""
    opt = OPTIMIZERS.get(name)()
    D, n = 700, 6
    state = ot.realistic_state(opt, rng, D, np.float32)
    G = rng.standard_normal((n, D)).astype(np.float32)
    out = ot.upload_numba(opt, state, G, 3, np.float32)
    before = {k: v.copy() for k, v in out.items()}
    idx = np.array([4, 1])
    Gb = -G[idx]
    opt.client_rule_batch(state, Gb, 3, out, rows=idx, backend=backend)
    want = ot.upload_numba(opt, state, -G, 3, np.float32)
    for k in opt.arrays:
        np.testing.assert_array_equal(out[k][idx], want[k][idx])
        keep = np.setdiff1d(np.arange(n), idx)
        np.testing.assert_array_equal(out[k][keep], before[k][keep])
    X = np.full((n, D), 7.0, np.float32)
    opt.recover_batch(state, out, 3, X, rows=idx, backend=backend)
    assert (X[[0, 2, 3, 5]] == 7.0).all()
    np.testing.assert_allclose(X[idx], -G[idx], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("name", NAMES)
def test_kernels_cover_every_chunk_and_row(name, rng, ot):
    """D not a multiple of the chunk width, more rows than threads: every value written."""
    from rfrs_ref.kernels.optim import CHUNK

    opt = OPTIMIZERS.get(name)()
    D, n = 2 * CHUNK + 37, 5
    state = ot.realistic_state(opt, rng, D, np.float32)
    G = rng.standard_normal((n, D)).astype(np.float32)
    up = ot.upload_numba(opt, state, G, 2, np.float32)  # starts as NaN
    for k in opt.arrays:
        assert np.isfinite(up[k]).all()
    X = np.full((n, D), np.nan, np.float32)
    opt.recover_batch(state, up, 2, X)
    assert np.isfinite(X).all()
