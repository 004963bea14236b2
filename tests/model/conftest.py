"""Helpers of the model tests, shared through the session fixture ``mt``."""

from __future__ import annotations

import types

import numpy as np
import pytest

from rfrs_ref.data import Interactions


def interactions(n_items: int, lists) -> Interactions:
    """Interactions with one (sorted, unique) item list per user."""
    return Interactions.from_lists("test", n_items, lists)


def random_lists(rng: np.random.Generator, n_items: int, sizes) -> list[np.ndarray]:
    """One uniformly drawn item set of each size."""
    return [np.sort(rng.choice(n_items, size=int(k), replace=False)) for k in sizes]


def central_differences(f, x: np.ndarray, h: float) -> np.ndarray:
    """(f(x + h e_i) − f(x − h e_i)) / 2h for every coordinate i, float64."""
    x = np.array(x, dtype=np.float64)
    g = np.empty_like(x)
    for i in range(x.size):
        xi = x[i]
        x[i] = xi + h
        fp = f(x)
        x[i] = xi - h
        fm = f(x)
        x[i] = xi
        g[i] = (fp - fm) / (2.0 * h)
    return g


def assert_grad_close(got: np.ndarray, want: np.ndarray, rtol: float, scale_tol: float) -> None:
    """|got − want| <= rtol·|want| + scale_tol·max(1, ‖want‖∞), elementwise.

    The scale term covers entries that are sums of larger terms cancelling
    (e.g. c₁B + c₂(A − a_l p_l) + 2λq_l), whose rounding is relative to the
    terms, not to the result.
    """
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    assert np.all(np.isfinite(got)), "non-finite entries"
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    bound = rtol * np.abs(want) + scale_tol * scale
    err = np.abs(got - want)
    worst = int(np.argmax(err - bound)) if err.size else 0
    assert np.all(err <= bound), (
        f"entry {worst}: got {got.flat[worst]!r}, want {want.flat[worst]!r}, "
        f"|err| {err.flat[worst]:.3e} > bound {bound.flat[worst]:.3e}"
    )


@pytest.fixture(scope="session")
def mt():
    """The helpers above, as a namespace (test modules cannot import each other)."""
    return types.SimpleNamespace(
        interactions=interactions,
        random_lists=random_lists,
        central_differences=central_differences,
        assert_grad_close=assert_grad_close,
    )
