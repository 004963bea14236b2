"""The Numba kernels of the colluding attacks against their NumPy float64 oracles."""

import numpy as np
import pytest

from rfrs_ref.attack import alie_gradient, ipm_gradient
from rfrs_ref.kernels.attacks import CHUNK, alie_row, scaled_mean_row


@pytest.fixture(scope="module")
def grads():
    rng = np.random.default_rng(3)
    # more columns than two chunks, rows of very different scales
    G = rng.standard_normal((6, 2 * CHUNK + 77)) * np.array([[1e-3], [1.0], [1e3], [1.0], [5.0], [1e-6]])
    G[:, :5] = 7.0  # constant columns: σ must be exactly 0 there
    return G


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [[0], [1, 4], [5, 0, 2, 3], [0, 1, 2, 3, 4, 5]])
@pytest.mark.parametrize("ddof", [0, 1])
def test_alie_row_matches_oracle(grads, dtype, rows, ddof):
    G = grads.astype(dtype)
    rows = np.array(rows, dtype=np.int64)
    out = np.full(G.shape[1], np.nan, dtype)
    alie_row(G, rows, 0.7, ddof, out)
    want = alie_gradient(G, rows, 0.7, ddof)
    scale = np.abs(G[rows].astype(np.float64)).max(axis=0)
    u = np.finfo(dtype).eps / 2
    assert np.all(np.abs(out - want) <= u * np.abs(want) + 1e-14 * scale)
    np.testing.assert_array_equal(out[:5], np.float64(7.0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [[2], [1, 4], [5, 0, 2, 3]])
def test_scaled_mean_row_matches_ipm_oracle(grads, dtype, rows):
    G = grads.astype(dtype)
    rows = np.array(rows, dtype=np.int64)
    out = np.full(G.shape[1], np.nan, dtype)
    scaled_mean_row(G, rows, -0.3, out)
    want = ipm_gradient(G, rows, 0.3)
    scale = np.abs(G[rows].astype(np.float64)).max(axis=0)
    u = np.finfo(dtype).eps / 2
    assert np.all(np.abs(out - want) <= u * np.abs(want) + 1e-14 * scale)


def test_single_row_alie_is_the_row():
    G = np.arange(12.0).reshape(3, 4)
    out = np.empty(4)
    alie_row(G, np.array([1], dtype=np.int64), 3.0, 1, out)
    np.testing.assert_array_equal(out, G[1])
    np.testing.assert_array_equal(alie_gradient(G, [1], 3.0, 1), G[1])
