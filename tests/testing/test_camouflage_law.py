"""camouflage_same_theta fails an attack that never camouflages where Eq. 6 applies."""

from __future__ import annotations

import numpy as np

from rfrs_ref.optim import Adam
from rfrs_ref.testing.conformance import run_optimizer_conformance


def test_camouflage_that_never_camouflages_fails():
    def noop(state, g, t, opt):
        return np.array(g, dtype=np.float64)

    r, = run_optimizer_conformance("adam", Adam, max_examples=30, laws=["camouflage_same_theta"],
                                   camouflage=noop)
    assert r.status == "fails" and "changed none of them" in r.message
    r, = run_optimizer_conformance("adam", Adam, max_examples=30, laws=["camouflage_same_theta"])
    assert r.status == "holds", r.message

