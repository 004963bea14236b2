"""Strategies and functions shared by the optimiser tests through the fixture ``ot``."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rfrs_ref.optim import OPTIMIZERS

NAMES = tuple(OPTIMIZERS.names())
DTYPES = (np.float32, np.float64)

# Magnitude limits of the "arbitrary" cases: every intermediate of every rule
# stays finite in float32 (g² ≤ 1e30, moments ≤ 1e30, θ ≤ 1e6 + a step).
G_MAX = 1e15
M_MAX = 1e15
V_MAX = 1e30
THETA_MAX = 1e6


def finite(lo: float, hi: float, dtype) -> st.SearchStrategy:
    if np.dtype(dtype) == np.float32:
        # the float32 values nearest the bounds, inside them
        lo = float(np.nextafter(np.float32(lo), np.float32(np.inf))) if float(np.float32(lo)) < lo else float(np.float32(lo))
        hi = float(np.nextafter(np.float32(hi), np.float32(-np.inf))) if float(np.float32(hi)) > hi else float(np.float32(hi))
        return st.floats(lo, hi, width=32, allow_nan=False, allow_infinity=False)
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


def vec(draw, D, lo, hi, dtype):
    return draw(hnp.arrays(dtype, D, elements=finite(lo, hi, dtype)))


@st.composite
def hyperparameters(draw, name: str) -> dict:
    """Hyperparameters of optimiser ``name``: the paper's defaults or arbitrary ones."""
    cls = OPTIMIZERS.get(name)
    fields = {f.name for f in dataclasses.fields(cls)}
    if draw(st.booleans()):
        return {}
    out = {"lr": draw(st.floats(1e-5, 1.0))}
    for b in ("beta1", "beta2", "beta3", "beta4"):
        if b in fields:
            out[b] = draw(st.sampled_from([0.0, 0.5, 0.9, 0.99, 0.999]) | st.floats(0.0, 0.9999))
    if "eps" in fields:
        out["eps"] = draw(st.floats(1e-12, 1e-2))
    return out


@st.composite
def cases(draw, name: str, dtype, n_max: int = 4, D_max: int = 12):
    """(optimizer, state, grads (n, D), t): arbitrary state and gradients of ``dtype``."""
    opt = OPTIMIZERS.get(name)(**draw(hyperparameters(name)))
    D = draw(st.integers(1, D_max))
    n = draw(st.integers(1, n_max))
    state = {"theta": vec(draw, D, -THETA_MAX, THETA_MAX, dtype)}
    for k in opt.arrays:
        if k == "m":
            state[k] = vec(draw, D, -M_MAX, M_MAX, dtype)
        elif k in ("v", "r"):
            state[k] = vec(draw, D, 0.0, V_MAX, dtype)
    grads = draw(hnp.arrays(dtype, (n, D), elements=finite(-G_MAX, G_MAX, dtype)))
    t = draw(st.integers(1, 10) | st.integers(1, 10**6))
    return opt, state, grads, t


def empty_uploads(opt, n, D, dtype, fill=np.nan):
    return {k: np.full((n, D), fill, dtype=dtype) for k in opt.arrays}


def upload_numba(opt, state, grads, t, dtype):
    out = empty_uploads(opt, grads.shape[0], grads.shape[1], dtype)
    opt.client_rule_batch(state, grads, t, out, backend="numba")
    return out


def upload_oracle(opt, state, grads, t, dtype):
    """The oracle's float64 upload of every row, stored in ``dtype``."""
    out = empty_uploads(opt, grads.shape[0], grads.shape[1], dtype)
    for r in range(grads.shape[0]):
        up = opt.client_rule(state, grads[r], t)
        for k in opt.arrays:
            out[k][r] = up[k]
    return out


#: values written into one coordinate of an honest upload by :func:`tamper`
TAMPER = (np.nan, np.inf, -1.0, 1e38, 0.0)


def tamper(data, opt, uploads, values=TAMPER) -> bool:
    """Maybe (a drawn boolean) set one drawn coordinate of one drawn array of one drawn
    row of ``uploads`` to one of ``values`` or a drawn finite float32, in place; returns
    whether it did."""
    if not data.draw(st.booleans()):
        return False
    n, D = uploads["theta"].shape
    r = data.draw(st.integers(0, n - 1))
    k = data.draw(st.sampled_from(opt.arrays))
    c = data.draw(st.integers(0, D - 1))
    uploads[k][r, c] = data.draw(st.sampled_from(list(values)) | finite(-1e30, 1e30, np.float32))
    return True


def row(uploads, r):
    return {k: v[r] for k, v in uploads.items()}


def realistic_state(opt, rng, D, dtype, t=5):
    """A state as training produces it: θ̄ ~ N(0, 1), moments of a few past rounds."""
    state = opt.init(rng.standard_normal(D).astype(dtype))
    for k in opt.arrays:
        if k == "m":
            state[k] = (0.1 * rng.standard_normal(D)).astype(dtype)
        elif k in ("v", "r"):
            state[k] = (0.01 * rng.standard_normal(D) ** 2).astype(dtype)
    return state


@pytest.fixture
def rng():
    return np.random.default_rng(20200711)


@pytest.fixture(scope="session")
def ot():
    """This folder's strategies and functions (test modules cannot import conftest in importlib mode)."""
    return types.SimpleNamespace(
        NAMES=NAMES, DTYPES=DTYPES, cases=cases, hyperparameters=hyperparameters, finite=finite,
        empty_uploads=empty_uploads, upload_numba=upload_numba, upload_oracle=upload_oracle,
        row=row, realistic_state=realistic_state, tamper=tamper,
    )
