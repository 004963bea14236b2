"""FISM: the oracle's loss and gradient (known answer, finite differences,
stability, memory), negatives, initialisation, scores and validation."""

from __future__ import annotations

import dataclasses
import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.model import FISM, FMF, MODELS
from rfrs_ref.params import hyperparameters
from rfrs_ref.seeding import generator


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


# -- known answer -------------------------------------------------------------------

def test_known_answer_three_items():
    """Three items, d = 1, γ = 1, S = {0, 1}; worked by hand.

    p = (1, 2, 2), q = (0.5, 1, 3): s = 1.5, ŷ₀ = p₀q₁ = 1, ŷ₁ = p₁q₀ = 1,
    ŷ₂ = p₂ s/2 = 1.5, so both pairs have x = −0.5 and σ(−x) = σ(0.5) =: σ.
    ℓ = 2 log(1 + e^0.5) + λ‖θ‖²; ∂p₀ = −σ q₁, ∂p₁ = −σ q₀, ∂p₂ = 2σ·s/2,
    ∂q₀ = σ(p₂/2 + p₂/2 − p₁) = 0, ∂q₁ = σ(p₂/2 − p₀ + p₂/2) = σ, ∂q₂ = 0.
    """
    lam = 0.1
    m = FISM(3, dim=1, lam=lam, gamma=1.0)
    theta = np.array([1.0, 2.0, 2.0, 0.5, 1.0, 3.0])
    loss, g = m.loss_grad(theta, [0, 1])
    s = sig(0.5)
    want_loss = 2.0 * math.log1p(math.exp(0.5)) + lam * float(theta @ theta)
    want_g = np.array([-s * 1.0, -s * 0.5, 2.0 * s * 0.75, 0.0, s, 0.0]) + 2.0 * lam * theta
    assert loss == pytest.approx(want_loss, rel=1e-14)
    np.testing.assert_allclose(g, want_g, rtol=1e-14, atol=1e-15)


def test_known_answer_single_item_client_has_zero_positive_score():
    """n = 1: S \\ {j} is empty, ŷ_j = 0 (SPEC §2), so p_j gets only 2λp_j."""
    m = FISM(3, dim=2, lam=0.0, gamma=0.5)
    rng = np.random.default_rng(0)
    theta = rng.normal(size=m.n_params())
    P, Q = m.unpack(theta)
    loss, g = m.loss_grad(theta, [1])
    gP, gQ = m.unpack(g)
    y_neg = P[[0, 2]] @ Q[1]  # c₁ = 1^−γ = 1
    assert loss == pytest.approx(np.sum(np.log1p(np.exp(y_neg))), rel=1e-13)
    assert np.all(gP[1] == 0.0)
    b = 1.0 / (1.0 + np.exp(-y_neg))  # σ(ŷ_k − 0)
    np.testing.assert_allclose(gP[[0, 2]], b[:, None] * Q[1], rtol=1e-13)
    np.testing.assert_allclose(gQ[1], b @ P[[0, 2]], rtol=1e-13)
    assert np.all(gQ[[0, 2]] == 0.0)


# -- finite differences -------------------------------------------------------------

@st.composite
def fism_cases(draw, max_items=7, max_dim=3):
    n_items = draw(st.integers(2, max_items))
    dim = draw(st.integers(1, max_dim))
    gamma = draw(st.sampled_from([0.0, 0.5, 1.0]))
    lam = draw(st.sampled_from([0.0, 0.05]))
    size = draw(st.sampled_from(["one", "all_but_one", "all", "random"]))
    n = {"one": 1, "all_but_one": n_items - 1, "all": n_items}.get(size) or \
        draw(st.integers(1, n_items))
    sampled = draw(st.booleans()) and n < n_items
    n_neg = draw(st.integers(1, 3)) if sampled else 0
    seed = draw(st.integers(0, 2**32 - 1))
    return n_items, dim, gamma, lam, n, n_neg, seed


@settings(max_examples=30)
@given(fism_cases())
def test_fism_gradient_matches_central_differences(mt, case):
    n_items, dim, gamma, lam, n, n_neg, seed = case
    m = FISM(n_items, dim=dim, lam=lam, gamma=gamma, negatives=n_neg)
    rng = np.random.default_rng(seed)
    items = np.sort(rng.choice(n_items, size=n, replace=False))
    neg = m.sample_negatives(items, rng)
    theta = rng.normal(scale=0.7, size=m.n_params())
    loss, g = m.loss_grad(theta, items, neg)
    fd = mt.central_differences(lambda th: m.loss_grad(th, items, neg)[0], theta, 1e-6)
    mt.assert_grad_close(g, fd, rtol=1e-6, scale_tol=1e-7)
    assert np.isfinite(loss) and loss >= lam * float(theta @ theta) - 1e-12


def test_fism_gradient_client_with_every_item_is_the_regulariser():
    m = FISM(5, dim=2, lam=0.3)
    theta = np.random.default_rng(1).normal(size=m.n_params())
    loss, g = m.loss_grad(theta, np.arange(5))
    assert loss == pytest.approx(0.3 * float(theta @ theta), rel=1e-14)
    np.testing.assert_allclose(g, 0.6 * theta, rtol=1e-15)


def test_fism_gradient_does_not_depend_on_item_order():
    m = FISM(9, dim=3, lam=0.01)
    theta = np.random.default_rng(2).normal(size=m.n_params())
    a = m.loss_grad(theta, [1, 4, 7])
    b = m.loss_grad(theta, np.array([7, 1, 4], dtype=np.int32))
    assert a[0] == b[0] and np.array_equal(a[1], b[1])


def test_loss_grad_does_not_modify_inputs():
    m = FISM(6, dim=2, lam=0.1, negatives=2)
    rng = np.random.default_rng(3)
    theta = rng.normal(size=m.n_params()).astype(np.float32)
    items = np.array([0, 3], dtype=np.int32)
    neg = m.sample_negatives(items, rng)
    copies = [theta.copy(), items.copy(), neg.copy()]
    m.loss_grad(theta, items, neg)
    for before, after in zip(copies, [theta, items, neg]):
        assert np.array_equal(before, after)


# -- stability and cost -------------------------------------------------------------

@pytest.mark.parametrize("scale", [1e6, 1e15])
def test_oracle_is_finite_for_huge_parameters(scale):
    """Scores up to ~1e30 and more: no overflow, no NaN, in the loss or the gradient."""
    m = FISM(40, dim=4, lam=1e-4)
    rng = np.random.default_rng(4)
    theta = rng.normal(size=m.n_params()) * scale
    with np.errstate(over="raise", invalid="raise"):
        loss, g = m.loss_grad(theta, [0, 5, 6, 20, 39])
    assert np.isfinite(loss) and np.all(np.isfinite(g))


def test_oracle_memory_is_linear_in_parameters():
    """No n_items × n_items or per-pair d-vector intermediate: the peak stays O(D).

    500 positives × 19,500 negatives would be a 78 MB pair matrix; D·8 bytes is
    0.3 MB. The bound allows a few copies of θ and the oracle's pair block.
    """
    import rfrs_ref.model.bpr as bpr

    n_items, dim = 20000, 2
    m = FISM(n_items, dim=dim, lam=1e-4)
    rng = np.random.default_rng(5)
    theta = rng.normal(size=m.n_params())
    items = np.sort(rng.choice(n_items, size=500, replace=False))
    D = m.n_params()
    tracemalloc.start()
    try:
        m.loss_grad(theta, items)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    bound = 16 * D * 8 + 8 * bpr.PAIR_BLOCK * 8
    assert peak < bound, f"peak {peak / 1e6:.1f} MB > {bound / 1e6:.1f} MB"


# -- negatives ----------------------------------------------------------------------

def test_sample_negatives_come_from_the_complement_uniformly():
    m = FISM(10, dim=2, negatives=4000)
    items = np.array([0, 3, 4, 9], dtype=np.int32)
    neg = m.sample_negatives(items, generator(7, "negatives", 1, 2))
    assert neg.shape == (4, 4000) and neg.dtype == np.int32
    assert not np.isin(neg, items).any()
    counts = np.bincount(neg.ravel(), minlength=10)
    expected = neg.size / 6
    allowed = [1, 2, 5, 6, 7, 8]
    assert np.all(counts[items] == 0)
    # each of the 6 negatives has probability 1/6: within 5 standard deviations
    sd = math.sqrt(neg.size * (1 / 6) * (5 / 6))
    assert np.all(np.abs(counts[allowed] - expected) < 5 * sd)


def test_sample_negatives_are_reproducible_and_exact_mode_returns_none():
    m = FISM(50, dim=2, negatives=3)
    items = np.array([2, 7, 8, 30], dtype=np.int32)
    a = m.sample_negatives(items, generator(1, "negatives", 5, 9))
    b = m.sample_negatives(items, generator(1, "negatives", 5, 9))
    c = m.sample_negatives(items, generator(1, "negatives", 6, 9))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert FISM(50, dim=2).sample_negatives(items, generator(1, "negatives")) is None
    full = m.sample_negatives(np.arange(50), generator(1, "negatives"))
    assert full.shape == (50, 0)


def test_sampled_loss_with_every_negative_listed_equals_exact_loss():
    """Each positive paired once with each negative is the exact loss, not an estimate."""
    m = FISM(6, dim=3, lam=0.01, gamma=0.5)
    rng = np.random.default_rng(8)
    theta = rng.normal(size=m.n_params())
    items = np.array([1, 4])
    neg = np.tile(np.array([0, 2, 3, 5]), (2, 1))
    exact = m.loss_grad(theta, items)
    sampled = dataclasses.replace(m, negatives=4).loss_grad(theta, items, neg)
    assert sampled[0] == pytest.approx(exact[0], rel=1e-14)
    np.testing.assert_allclose(sampled[1], exact[1], rtol=1e-13, atol=1e-15)


def test_invalid_negatives_are_rejected():
    m = FISM(6, dim=2, negatives=2)
    theta = np.zeros(m.n_params())
    items = np.array([1, 4])
    with pytest.raises(ValueError, match="S⁻"):
        m.loss_grad(theta, items, np.array([[0, 4], [2, 3]]))
    with pytest.raises(ValueError, match="out of range"):
        m.loss_grad(theta, items, np.array([[0, 6], [2, 3]]))
    with pytest.raises(ValueError, match="one row per positive"):
        m.loss_grad(theta, items, np.array([[0, 2]]))
    with pytest.raises(ValueError, match="none were given"):
        m.loss_grad(theta, items)
    with pytest.raises(ValueError, match="increasing order"):
        m.loss_grad(theta, [4, 1], np.array([[0, 2], [2, 3]]))


# -- construction, layout, initialisation ----------------------------------------------

def test_registry_and_hyperparameters():
    assert MODELS.names() == ["fism", "fmf"]
    assert MODELS.get("fism") is FISM and MODELS.get("fmf") is FMF
    assert [h.name for h in hyperparameters(FISM)] == ["dim", "lam", "negatives", "gamma"]
    assert [h.name for h in hyperparameters(FMF)] == ["dim", "lam", "negatives"]
    m = FISM(10)
    assert (m.dim, m.lam, m.negatives, m.gamma) == (64, 1e-4, 0, 1.0)
    assert m.n_params() == 2 * 10 * 64 and FMF(10).n_params() == 10 * 64
    assert not FISM.has_private and FMF.has_private


@pytest.mark.parametrize("kw", [dict(n_items=0), dict(dim=0), dict(lam=-1.0),
                                dict(lam=float("nan")), dict(negatives=-1),
                                dict(gamma=float("inf"))])
def test_invalid_hyperparameters_are_rejected(kw):
    args = dict(n_items=5) | kw
    with pytest.raises(ValueError, match=next(iter(kw))):
        FISM(**args)


def test_layout_is_p_then_q_row_major():
    m = FISM(3, dim=2)
    theta = np.arange(12.0)
    P, Q = m.unpack(theta)
    assert P[1, 0] == 2.0 and Q[0, 1] == 7.0 and np.shares_memory(P, theta)


def test_init_params_distribution_dtype_and_reproducibility():
    m = FISM(500, dim=8)
    a = m.init_params(generator(3, "init"), 0.5, np.float64)
    b = m.init_params(generator(3, "init"), 0.5, np.float32)
    assert a.shape == (m.n_params(),) and a.dtype == np.float64 and b.dtype == np.float32
    np.testing.assert_array_equal(b, a.astype(np.float32))
    assert abs(a.mean()) < 5 * 0.5 / math.sqrt(a.size)
    assert a.std() == pytest.approx(0.5, rel=0.02)
    with pytest.raises(ValueError, match="float32 or float64"):
        m.init_params(generator(3, "init"), 1.0, np.int32)


def test_items_are_checked():
    m = FISM(5, dim=1)
    theta = np.zeros(m.n_params())
    with pytest.raises(ValueError, match="occurs twice"):
        m.loss_grad(theta, [1, 1])
    with pytest.raises(ValueError, match="out of range"):
        m.loss_grad(theta, [5])
    with pytest.raises(ValueError, match=r"shape \(9,\)"):
        m.loss_grad(np.zeros(9), [1])


# -- scores -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_scores_are_the_full_client_vector_times_p(mt, dtype, backend):
    rng = np.random.default_rng(9)
    n_items = 30
    train = mt.interactions(n_items, mt.random_lists(rng, n_items, [1, 5, 12, 29, 0]))
    m = FISM(n_items, dim=4, gamma=0.5)
    theta = m.init_params(rng, 1.0, dtype)
    P, Q = (x.astype(np.float64) for x in m.unpack(theta))
    users = np.array([3, 0, 4, 1, 2])
    got = m.scores(theta, train, users, backend=backend)
    assert got.shape == (5, n_items) and got.dtype == dtype
    for r, u in enumerate(users):
        S = train.items_of(u)
        want = P @ Q[S].sum(axis=0) * (len(S) ** -0.5 if len(S) else 0.0)
        np.testing.assert_allclose(got[r], want, rtol=1e-5 if dtype == np.float32 else 1e-12,
                                   atol=1e-6 if dtype == np.float32 else 1e-13)
    out = np.empty((5, n_items), dtype=np.float64)
    assert m.scores(theta, train, users, backend=backend, out=out) is out
    np.testing.assert_allclose(out, got, rtol=1e-6)


def test_scores_of_unrated_items_equal_training_scores():
    """At evaluation an unrated item scores as in the loss (both use all of S)."""
    from rfrs_ref.data import Interactions

    m = FISM(8, dim=3, gamma=1.0)
    rng = np.random.default_rng(10)
    theta = rng.normal(size=m.n_params())
    train = Interactions.from_lists("t", 8, [[1, 2, 6]])
    sc = m.scores(theta, train, [0], backend="numpy")[0]
    P, Q = m.unpack(theta)
    np.testing.assert_allclose(sc[[0, 3]], P[[0, 3]] @ Q[[1, 2, 6]].sum(0) / 3, rtol=1e-14)


@pytest.mark.parametrize("model", ["fism", "fmf"])
def test_scores_that_overflow_are_left_to_the_callers_without_a_warning(model):
    # the callers test every score (evaluation ends the run, recommend refuses the model);
    # NumPy's "overflow encountered in matmul" was printed beside their message
    import warnings

    from rfrs_ref.model import MODELS
    from rfrs_ref.data.synthetic import synthetic

    data = synthetic(n_users=6, n_items=8, n_clusters=2, mean_items=3.0)
    m = MODELS.get(model)(n_items=8, dim=4)
    theta = np.full(m.n_params(), 1e30, dtype=np.float32)
    kw = {"private": np.full((6, 4), 1e30, dtype=np.float32)} if m.has_private else {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores = m.scores(theta, data, np.arange(6), backend="numpy", **kw)
    assert not np.isfinite(scores).any()
