"""Fixtures of the round tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def corrupt_one_upload(monkeypatch):
    """Adam's client rule writes NaN into row 5 of every batch of more than 5 uploads (an
    upload that fails verification, which the guarantee rules out for honest ones)."""
    from rfrs_ref.optim.adam import Adam

    honest = Adam.client_rule_batch

    def corrupt(self, state, grads, t, out, backend="numba", **kw):
        honest(self, state, grads, t, out, backend=backend, **kw)
        if out["theta"].shape[0] > 5:
            out["theta"][5, 3] = np.nan

    monkeypatch.setattr(Adam, "client_rule_batch", corrupt)


@pytest.fixture
def corrupt_by_gradient(monkeypatch):
    """Adam's client rule writes NaN into the uploads of the clients whose gradient's bits
    sum to a multiple of 7, whatever their batch (an upload that fails verification in
    rounds that compute a client's upload twice)."""
    from rfrs_ref.optim.adam import Adam

    honest = Adam.client_rule_batch

    def corrupt(self, state, grads, t, out, backend="numba", **kw):
        honest(self, state, grads, t, out, backend=backend, **kw)
        for r in range(grads.shape[0]):
            if int(grads[r].view(np.uint32).sum(dtype=np.uint64)) % 7 == 0:
                out["theta"][r, min(5, out["theta"].shape[1] - 1)] = np.nan

    monkeypatch.setattr(Adam, "client_rule_batch", corrupt)


@pytest.fixture
def calls(monkeypatch):
    """How many rounds took the path on shared rows, and how many of those returned one."""
    from rfrs_ref.federated import round as round_module

    seen = {"called": 0, "returned": 0}
    inner = round_module._shared_rows_compared_round

    def counted(*a, **kw):
        seen["called"] += 1
        out = inner(*a, **kw)
        seen["returned"] += out is not None
        return out

    monkeypatch.setattr(round_module, "_shared_rows_compared_round", counted)
    return seen
