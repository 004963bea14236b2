"""FMF: known answer, finite differences of the federated and private gradients,
private initialisation, scores and validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.model import FMF
from rfrs_ref.seeding import generator


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_known_answer():
    """d = 1, u = 1, p = (1, 0, 2), S = {0}: pairs x₀₁ = 1 and x₀₂ = −1.

    ℓ = softplus(−1) + softplus(1) + λ(‖p‖² + u²); a₀ = −(σ(−1) + σ(1)) = −1,
    b₁ = σ(−1), b₂ = σ(1); ∂p = (a₀, b₁, b₂)·u, ∂u = a₀p₀ + b₁p₁ + b₂p₂ + 2λu.
    """
    lam = 0.25
    m = FMF(3, dim=1, lam=lam)
    theta = np.array([1.0, 0.0, 2.0])
    u = np.array([1.0])
    loss, g, gu = m.loss_grad(theta, [0], private=u)
    want_loss = math.log1p(math.exp(-1.0)) + math.log1p(math.exp(1.0)) + lam * (5.0 + 1.0)
    assert loss == pytest.approx(want_loss, rel=1e-14)
    np.testing.assert_allclose(g, np.array([-1.0, sig(-1.0), sig(1.0)]) + 2 * lam * theta,
                               rtol=1e-14)
    np.testing.assert_allclose(gu, [-1.0 + 2.0 * sig(1.0) + 2 * lam], rtol=1e-14)


@st.composite
def fmf_cases(draw):
    n_items = draw(st.integers(2, 7))
    dim = draw(st.integers(1, 3))
    lam = draw(st.sampled_from([0.0, 0.05]))
    size = draw(st.sampled_from(["one", "all_but_one", "all", "random"]))
    n = {"one": 1, "all_but_one": n_items - 1, "all": n_items}.get(size) or \
        draw(st.integers(1, n_items))
    n_neg = draw(st.integers(1, 3)) if draw(st.booleans()) and n < n_items else 0
    return n_items, dim, lam, n, n_neg, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=30)
@given(fmf_cases())
def test_fmf_gradients_match_central_differences(mt, case):
    n_items, dim, lam, n, n_neg, seed = case
    m = FMF(n_items, dim=dim, lam=lam, negatives=n_neg)
    rng = np.random.default_rng(seed)
    items = np.sort(rng.choice(n_items, size=n, replace=False))
    neg = m.sample_negatives(items, rng)
    theta = rng.normal(scale=0.8, size=m.n_params())
    u = rng.normal(scale=0.8, size=dim)
    loss, g, gu = m.loss_grad(theta, items, neg, private=u)
    D = m.n_params()
    x = np.concatenate([theta, u])
    fd = mt.central_differences(lambda z: m.loss_grad(z[:D], items, neg, private=z[D:])[0],
                                x, 1e-6)
    mt.assert_grad_close(np.concatenate([g, gu]), fd, rtol=1e-6, scale_tol=1e-7)
    assert loss >= lam * (float(theta @ theta) + float(u @ u)) - 1e-12


def test_private_init_and_checks():
    m = FMF(20, dim=5)
    U = m.private_init(100, generator(0, "init", 1), 0.1, np.float64)
    U32 = m.private_init(100, generator(0, "init", 1), 0.1, np.float32)
    assert U.shape == (100, 5) and U32.dtype == np.float32
    np.testing.assert_array_equal(U32, U.astype(np.float32))
    assert U.std() == pytest.approx(0.1, rel=0.1)
    theta = m.init_params(generator(0, "init"), 1.0, np.float64)
    with pytest.raises(ValueError, match="private user vector"):
        m.loss_grad(theta, [1, 2])
    with pytest.raises(ValueError, match=r"expected \(5,\)"):
        m.loss_grad(theta, [1, 2], private=np.zeros(4))


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_scores_are_u_times_p(mt, backend):
    rng = np.random.default_rng(1)
    train = mt.interactions(12, mt.random_lists(rng, 12, [1, 4, 0]))
    m = FMF(12, dim=3)
    theta = m.init_params(rng, 1.0, np.float64)
    U = m.private_init(3, rng, 1.0, np.float64)
    got = m.scores(theta, train, [2, 0], private=U, backend=backend)
    np.testing.assert_allclose(got, U[[2, 0]] @ m.unpack(theta).T, rtol=1e-14)
    with pytest.raises(ValueError, match="private user vectors"):
        m.scores(theta, train, [0], backend=backend)
