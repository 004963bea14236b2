"""The fast path on real clients at full size (citeulike-a, d = 64), against the oracle."""

from __future__ import annotations

import numpy as np
import pytest

from rfrs_ref.model import FISM, FMF


@pytest.fixture(scope="module")
def citeulike_train(data_dir):
    from rfrs_ref.data import load_dataset, split_interactions

    data = load_dataset("citeulike-a", data_dir, download=False)
    return split_interactions(data, seed=0).train


@pytest.mark.parametrize("model_cls", [FISM, FMF])
def test_real_clients_float32_match_the_oracle(mt, citeulike_train, model_cls):
    train = citeulike_train
    m = model_cls(train.n_items)  # defaults: d = 64, exact negatives
    rng = np.random.default_rng(0)
    theta = m.init_params(rng, 1.0, np.float32)
    counts = train.counts()
    # the smallest, a typical and the largest client
    clients = np.array([np.argmin(counts), np.argsort(counts)[counts.size // 2],
                        np.argmax(counts)])
    kw = {}
    U = None
    if m.has_private:
        U = m.private_init(train.n_users, rng, 1.0, np.float32)
        kw = dict(private=U, private_out=np.empty((3, m.dim), np.float32))
    out = np.empty((3, m.n_params()), np.float32)
    losses = m.grads_batch(theta, train, clients, out, **kw)
    for r, c in enumerate(clients):
        res = m.loss_grad(theta, train.items_of(c), private=None if U is None else U[c])
        assert losses[r] == pytest.approx(res[0], rel=1e-10)
        mt.assert_grad_close(out[r], res[1], 2.0**-23, 1e-12)
        if U is not None:
            mt.assert_grad_close(kw["private_out"][r], res[2], 2.0**-23, 1e-12)
