"""Strategies and utilities of the attack tests, shared through the fixture ``at``."""

from __future__ import annotations

import types

import numpy as np
import pytest
from hypothesis import strategies as st

from rfrs_ref.attack import ATTACKS, AttackContext
from rfrs_ref.optim import OPTIMIZERS

DTYPES = (np.float32, np.float64)
GRADIENT_SPACE = ("ascent", "alie", "ipm", "camouflage", "opt-ipm", "opt-alie")


def optimizers_for(attack: str) -> tuple[str, ...]:
    """The optimisers an attack runs with."""
    cls = ATTACKS.get(attack)
    return tuple(cls.optimizers) if cls.optimizers is not None else tuple(OPTIMIZERS.names())


def realistic_state(opt, rng, D, dtype, m_scale=1e-2, v_scale=1e-6):
    """θ̄ ~ N(0, 1) and moments of the magnitude training produces (|m̄|/√v̄ of order
    ten, where Adam's update has second preimages on a fair share of coordinates)."""
    state = opt.init(rng.standard_normal(D).astype(dtype))
    for k in opt.arrays:
        if k == "m":
            state[k] = (m_scale * rng.standard_normal(D)).astype(dtype)
        elif k in ("v", "r"):
            state[k] = (v_scale * rng.gamma(1.0, 1.0, D)).astype(dtype)
    return state


def honest_uploads(opt, state, grads, t, backend="numba"):
    out = {k: np.full(grads.shape, np.nan, dtype=grads.dtype) for k in opt.arrays}
    opt.client_rule_batch(state, grads, t, out, backend=backend)
    return out


def context(opt, state, grads, byzantine, t, *, backend="numba", seed=0, f=None, workspace=None,
            rule=None, detect="gradient", n_samples=None, model=None):
    """(ctx, honest): a context over freshly computed honest uploads, and a copy of them.

    ``rule`` defaults to the mean (the attacks that tune themselves against the
    server's rule need one); every client has 5 samples unless ``n_samples``."""
    from rfrs_ref.aggregate import Mean

    up = honest_uploads(opt, state, grads, t, backend)
    honest = {k: v.copy() for k, v in up.items()}
    byzantine = np.asarray(byzantine, dtype=bool)
    n = grads.shape[0]
    ctx = AttackContext(
        t=t, optimizer=opt, state=state, grads=grads, uploads=up, byzantine=byzantine,
        clients=np.arange(n, dtype=np.int64),
        n_samples=np.full(n, 5, dtype=np.int64) if n_samples is None else np.asarray(n_samples),
        f=int(byzantine.sum()) if f is None else f, rng=np.random.default_rng(seed),
        backend=backend, workspace=workspace, rule=Mean() if rule is None else rule,
        detect=detect, model=model)
    return ctx, honest


def run(attack, opt, state, grads, byzantine, t, *, backend="numba", seed=0, workspace=None,
        **kw):
    """(uploads, honest, diagnostics) of ``attack`` on a fresh context (``kw``: of
    :func:`context`)."""
    ctx, honest = context(opt, state, grads, byzantine, t, backend=backend, seed=seed,
                          workspace=workspace, **kw)
    diag = attack.apply_inplace(ctx)
    return ctx.uploads, honest, diag


@st.composite
def scenarios(draw, optimizers=None, n_max=5, D_max=40):
    """(opt, state, grads, byzantine, t, dtype): a small round with at least one
    Byzantine row, random realistic magnitudes (any optimiser unless given)."""
    name = draw(st.sampled_from(optimizers or OPTIMIZERS.names()))
    opt = OPTIMIZERS.get(name)()
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(1, n_max))
    D = draw(st.integers(1, D_max))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    m_scale = draw(st.sampled_from([1e-4, 1e-3, 1e-2, 1e-1]))
    state = realistic_state(opt, rng, D, dtype, m_scale=m_scale)
    g_scale = draw(st.sampled_from([1e-4, 1e-3, 1e-1, 10.0]))
    grads = (g_scale * rng.standard_normal((n, D))).astype(dtype)
    byz = rng.random(n) < 0.5
    byz[rng.integers(n)] = True
    t = draw(st.integers(1, 3) | st.integers(4, 10_000))
    return opt, state, grads, byz, t, dtype


@pytest.fixture
def rng():
    return np.random.default_rng(20200711)


@pytest.fixture(scope="session")
def at():
    """The utilities of this folder (test modules cannot import conftest in importlib mode)."""
    return types.SimpleNamespace(
        DTYPES=DTYPES, GRADIENT_SPACE=GRADIENT_SPACE, optimizers_for=optimizers_for,
        realistic_state=realistic_state, honest_uploads=honest_uploads, context=context,
        run=run, scenarios=scenarios,
    )
