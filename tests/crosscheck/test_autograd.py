"""The hand-written FISM/BPR and FMF gradients agree with PyTorch autograd on real clients.

The PyTorch side is written from the formulas of SPEC §2–3 (paper Eqs. 1 and 7)
with autograd doing the differentiation, in float64, on real clients of
ml100k and citeulike-a (the smallest, median, 90th-percentile and largest
training sets) with exact negatives (every unrated item) and with sampled ones.
"""

from __future__ import annotations

import numpy as np
import pytest

from rfrs_ref.model import FISM, FMF
from rfrs_ref.seeding import generator

pytestmark = pytest.mark.crosscheck

DIM = 8
DATASETS = ["ml100k", "citeulike-a"]


def _picks(train) -> list[int]:
    counts = train.counts()
    order = np.argsort(counts, kind="stable")
    return [int(order[0]), int(order[len(order) // 2]), int(order[(9 * len(order)) // 10]), int(order[-1])]


def fism_loss_torch(torch, theta, items, n_items, d, gamma, lam, negatives=None):
    """ℓ = −Σ_j Σ_k log σ(ŷ_j − ŷ_k) + λ‖θ‖², ŷ of Eq. 1 (own q left out for rated items)."""
    P = theta[: n_items * d].reshape(n_items, d)
    Q = theta[n_items * d :].reshape(n_items, d)
    S = torch.as_tensor(items, dtype=torch.long)
    n = S.numel()
    s = Q[S].sum(0)
    c2 = float(n - 1) ** (-gamma) if n > 1 else 0.0
    y_pos = (P[S] * (c2 * (s[None, :] - Q[S]))).sum(1)
    y_all = float(n) ** (-gamma) * (P @ s)
    if negatives is None:
        mask = torch.ones(n_items, dtype=torch.bool)
        mask[S] = False
        x = y_pos[:, None] - y_all[mask][None, :]
    else:
        x = y_pos[:, None] - y_all[torch.as_tensor(negatives, dtype=torch.long)]
    return -torch.nn.functional.logsigmoid(x).sum() + lam * (theta * theta).sum()


def fmf_loss_torch(torch, theta, u, items, n_items, d, lam, negatives=None):
    P = theta.reshape(n_items, d)
    y = P @ u
    S = torch.as_tensor(items, dtype=torch.long)
    if negatives is None:
        mask = torch.ones(n_items, dtype=torch.bool)
        mask[S] = False
        x = y[S][:, None] - y[mask][None, :]
    else:
        x = y[S][:, None] - y[torch.as_tensor(negatives, dtype=torch.long)]
    return -torch.nn.functional.logsigmoid(x).sum() + lam * ((theta * theta).sum() + (u * u).sum())


def _assert_close(ours, ref, what):
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    scale = float(np.abs(ref).max())
    err = float(np.abs(ours - ref).max())
    # float64 sums of up to ~10⁶ pair terms in different orders: 1e-10 of the largest entry
    assert err <= 1e-10 * scale + 1e-300, f"{what}: max |Δ| = {err:.3g}, max |autograd| = {scale:.3g}"


@pytest.mark.parametrize("dataset", DATASETS)
@pytest.mark.parametrize("sampled", [False, True], ids=["exact", "sampled"])
def test_fism_gradient_matches_autograd(torch, real_splits, dataset, sampled):
    train = real_splits[dataset].train
    model = FISM(n_items=train.n_items, dim=DIM, lam=1e-3, gamma=0.9, negatives=5 if sampled else 0)
    theta = model.init_params(generator(7, "init"), 0.3, np.float64)
    for c in _picks(train):
        items = np.asarray(train.items_of(c), dtype=np.int64)
        neg = model.sample_negatives(items, generator(7, "negatives", 1, c)) if sampled else None
        loss, grad = model.loss_grad(theta, items, neg)
        th = torch.tensor(theta, requires_grad=True)
        ref = fism_loss_torch(torch, th, items, model.n_items, DIM, model.gamma, model.lam, neg)
        ref.backward()
        assert loss == pytest.approx(ref.item(), rel=1e-12), (dataset, c)
        _assert_close(grad, th.grad.numpy(), f"{dataset} client {c} ({items.size} items) oracle")
        out = np.empty((1, theta.size))
        model.grads_batch(theta, train, np.array([c]), out, negatives=None if neg is None else [neg])
        _assert_close(out[0], th.grad.numpy(), f"{dataset} client {c} numba")


@pytest.mark.parametrize("dataset", DATASETS)
@pytest.mark.parametrize("sampled", [False, True], ids=["exact", "sampled"])
def test_fmf_gradients_match_autograd(torch, real_splits, dataset, sampled):
    train = real_splits[dataset].train
    model = FMF(n_items=train.n_items, dim=DIM, lam=1e-3, negatives=5 if sampled else 0)
    theta = model.init_params(generator(7, "init"), 0.3, np.float64)
    U = model.private_init(train.n_users, generator(7, "init", 1), 0.3, np.float64)
    for c in _picks(train):
        items = np.asarray(train.items_of(c), dtype=np.int64)
        neg = model.sample_negatives(items, generator(7, "negatives", 1, c)) if sampled else None
        loss, grad, gu = model.loss_grad(theta, items, neg, U[c])
        th = torch.tensor(theta, requires_grad=True)
        u = torch.tensor(U[c], requires_grad=True)
        ref = fmf_loss_torch(torch, th, u, items, model.n_items, DIM, model.lam, neg)
        ref.backward()
        assert loss == pytest.approx(ref.item(), rel=1e-12), (dataset, c)
        _assert_close(grad, th.grad.numpy(), f"{dataset} client {c} P")
        _assert_close(gu, u.grad.numpy(), f"{dataset} client {c} u")
        out, pout = np.empty((1, theta.size)), np.empty((1, DIM))
        model.grads_batch(theta, train, np.array([c]), out, negatives=None if neg is None else [neg],
                          private=U, private_out=pout)
        _assert_close(out[0], th.grad.numpy(), f"{dataset} client {c} P numba")
        _assert_close(pout[0], u.grad.numpy(), f"{dataset} client {c} u numba")


def test_float32_fast_path_matches_autograd_to_float32_rounding(torch, real_splits):
    """The numba kernel on float32 θ: float64 arithmetic, one rounding per entry."""
    train = real_splits["citeulike-a"].train
    model = FISM(n_items=train.n_items, dim=DIM, lam=1e-3)
    theta = model.init_params(generator(7, "init"), 0.3, np.float32)
    c = _picks(train)[2]
    items = np.asarray(train.items_of(c), dtype=np.int64)
    th = torch.tensor(theta.astype(np.float64), requires_grad=True)
    fism_loss_torch(torch, th, items, model.n_items, DIM, model.gamma, model.lam).backward()
    out = np.empty((1, theta.size), dtype=np.float32)
    model.grads_batch(theta, train, np.array([c]), out)
    ref = th.grad.numpy()
    np.testing.assert_allclose(out[0], ref, rtol=2.0**-23, atol=1e-10 * np.abs(ref).max())
