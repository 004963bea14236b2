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
