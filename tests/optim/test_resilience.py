"""Per-round terms of Definitions 1–4 (rfrs_ref.optim.resilience)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.optim import OPTIMIZERS
from rfrs_ref.optim.resilience import resilience_round, term_names

EXPECTED = {
    "adam": ("C_g", "C_m", "C_v", "C_theta"),
    "momentum": ("C_g", "C_m", "C_theta"),
    "adagrad": ("C_g", "C_r", "C_theta"),
    "rmsprop": ("C_g", "C_r", "C_theta"),
    "sgd": ("C_g", "C_theta"),
}


def _direct(opt, X, G, U, kept, benign):
    """Python double loop over client pairs, float64 differences."""
    def s(A, B):
        return sum(np.linalg.norm(A[i].astype(np.float64) - B[j].astype(np.float64))
                   for i in np.flatnonzero(kept) for j in np.flatnonzero(benign))
    out = {"C_g": s(X, G)}
    for k in opt.arrays:
        out[{"m": "C_m", "v": "C_v", "r": "C_r", "theta": "C_theta"}[k]] = s(U[k], U[k])
    return out


@pytest.mark.parametrize("name", list(EXPECTED))
def test_term_names_follow_the_definitions(name):
    assert term_names(OPTIMIZERS.get(name)()) == EXPECTED[name]


@pytest.mark.parametrize("name", list(EXPECTED))
@settings(max_examples=15)
@given(data=st.data())
def test_terms_equal_the_direct_double_sum(name, data, ot):
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    opt, state, grads, t = data.draw(ot.cases(name, dtype, n_max=6, D_max=20))
    n = grads.shape[0]
    up = ot.upload_numba(opt, state, grads, t, dtype)
    X = np.empty_like(grads)
    opt.recover_batch(state, up, t, X)
    kept = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    benign = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    for backend in ("numba", "numpy"):
        got = resilience_round(opt, recovered=X, honest=grads, uploads=up, kept=kept, benign=benign,
                               backend=backend)
        want = _direct(opt, X, grads, up, kept, benign)
        assert tuple(got) == EXPECTED[name]
        for k in got:
            assert got[k] == pytest.approx(want[k], rel=1e-5, abs=0), (backend, k)


def test_close_float32_rows_keep_their_distance(rng):
    """θᵢ = θ̄ − ηₜuᵢ with ‖θ̄‖ ≈ √D: the Gram identity in float32 would return noise."""
    opt = OPTIMIZERS.get("adam")()
    D, n = 100_000, 4
    theta_bar = (100 * rng.standard_normal(D)).astype(np.float32)
    th = (theta_bar + 1e-3 * rng.standard_normal((n, D))).astype(np.float32)
    U = {"m": np.zeros((n, D), np.float32), "v": np.zeros((n, D), np.float32), "theta": th}
    kept, benign = np.array([True, True, False, False]), np.array([False, True, True, True])
    got = resilience_round(opt, recovered=U["m"], honest=U["m"], uploads=U, kept=kept, benign=benign)
    want = _direct(opt, U["m"], U["m"], U, kept, benign)["C_theta"]
    assert got["C_theta"] == pytest.approx(want, rel=1e-6)
    gram = sum(np.sqrt(max(0.0, float(th[i] @ th[i] + th[j] @ th[j] - 2 * th[i] @ th[j])))
               for i in np.flatnonzero(kept) for j in np.flatnonzero(benign))
    assert abs(gram - want) > 0.05 * want  # what the identity would have given


def test_nonfinite_upload_gives_an_infinite_term_and_masks_are_checked():
    opt = OPTIMIZERS.get("momentum")()
    X = np.zeros((3, 5))
    U = {"m": np.zeros((3, 5)), "theta": np.zeros((3, 5))}
    U["theta"][0, 1] = np.nan
    res = resilience_round(opt, recovered=X, honest=X, uploads=U, kept=np.array([True, False, True]),
                           benign=np.array([False, True, True]))
    assert res["C_theta"] == np.inf and res["C_g"] == 0.0 and res["C_m"] == 0.0
    with pytest.raises(ValueError, match="masks of length 3"):
        resilience_round(opt, recovered=X, honest=X, uploads=U, kept=np.ones(2, bool), benign=np.ones(3, bool))
