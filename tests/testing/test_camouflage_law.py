"""camouflage_same_theta fails an attack that never camouflages where Eq. 6 applies."""

from __future__ import annotations

import numpy as np
import pytest

from rfrs_ref.attack import AttackContext, Camouflage, camouflage_gradient
from rfrs_ref.optim import Adam
from rfrs_ref.testing.conformance import run_optimizer_conformance
from rfrs_ref.testing.laws import adam_lr_t, camouflage_upload_dtype


def test_camouflage_that_never_camouflages_fails():
    def noop(state, g, t, opt):
        return np.array(g, dtype=np.float64)

    r, = run_optimizer_conformance("adam", Adam, max_examples=30, laws=["camouflage_same_theta"],
                                   camouflage=noop)
    assert r.status == "fails" and "changed none of them" in r.message
    r, = run_optimizer_conformance("adam", Adam, max_examples=30, laws=["camouflage_same_theta"])
    assert r.status == "holds", r.message



def test_both_documented_forms_of_the_camouflage_hold():
    """The paper's Eq. 6 without ε (``include_eps=False``) is a documented form of the
    attack: the law asks for a change only where both forms have a solution."""
    def paper_form(state, g, t, opt):
        gt, _ = camouflage_gradient(state["m"], state["v"], state["theta"], g, beta1=opt.beta1,
                                    beta2=opt.beta2, lr_t=adam_lr_t(opt, t), eps=opt.eps,
                                    include_eps=False,
                                    upload_dtype=camouflage_upload_dtype(opt, state, g, t))
        return np.asarray(gt, dtype=np.float64)

    r, = run_optimizer_conformance("adam", Adam, max_examples=100, laws=["camouflage_same_theta"],
                                   camouflage=paper_form)
    assert r.status == "holds", r.message


def test_camouflage_that_applies_nowhere_is_skipped_not_holding():
    """With β₁ = 0 Eq. 6 has no solution that keeps θ: neither rfrs-ref's attack nor the one
    under test changes a coordinate on any example, and the law "held (36 examples)"."""
    r, = run_optimizer_conformance("adam", Adam(beta1=0.0), max_examples=30, laws=["camouflage_same_theta"])
    assert r.status == "skipped" and "changed any coordinate" in r.message, r
    r, = run_optimizer_conformance("adam", Adam(beta1=0.0), max_examples=30, laws=["camouflage_same_theta"],
                                   camouflage=lambda state, g, t, opt: np.array(g, dtype=np.float64))
    assert r.status == "skipped", r


class _AdamWithOtherNames:
    """rfrs-ref's Adam built from the hyperparameters, keeping them under other names."""

    name = "adam"

    def __init__(self, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8):
        self._inner = Adam(lr=lr, beta1=beta1, beta2=beta2, eps=eps)
        self.arrays = self._inner.arrays
        self.hyper = (lr, beta1, beta2, eps)

    def client_rule(self, state, g, t):
        return self._inner.client_rule(state, g, t)

    def recover(self, state, upload, t):
        return self._inner.recover(state, upload, t)


def test_rfrs_refs_attack_reads_the_claimed_hyperparameters_not_the_candidates_attributes():
    """The default attack read beta1, beta2, eps and lr from the Adam under test, so an Adam
    that keeps them under other names failed camouflage_same_theta ("has no attribute
    'beta1'") although every other law held; it reads the example's (those drawn for the
    candidate) instead."""
    st = {r.law: (r.status, r.message) for r in
          run_optimizer_conformance("adam", _AdamWithOtherNames, max_examples=20)}
    assert {k: v[0] for k, v in st.items()} == {k: "holds" for k in st}, st


def _rfrs_ref_attack(backend):
    """rfrs-ref's Camouflage attack on one Byzantine row, as a round runs it: g̃ in g's
    dtype, the round's uploads those of the attacked Adam's client_rule."""
    def camouflage(state, g, t, opt):
        up = opt.client_rule(state, g, t)
        uploads = {k: np.array(up[k])[None, :] for k in opt.arrays}
        G = np.array(g)[None, :]
        ctx = AttackContext(t=t, optimizer=opt, state=state, grads=G.copy(), uploads=uploads,
                            byzantine=np.array([True]), clients=np.array([0]),
                            n_samples=np.array([1]), f=1, rng=np.random.default_rng(0),
                            backend=backend)
        Camouflage().own_gradients_inplace(ctx, G, np.array([0], dtype=np.int64))
        return G[0].astype(np.float64)
    return camouflage


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_rfrs_refs_attack_holds_on_both_backends(backend):
    r, = run_optimizer_conformance("adam", Adam, max_examples=30, laws=["camouflage_same_theta"],
                                   camouflage=_rfrs_ref_attack(backend))
    assert r.status == "holds", r.message


def _nudged(delta, *, float32_only, upload_dtype):
    """rfrs-ref's g̃ times 1 + delta where it camouflages (on float32 examples only with
    ``float32_only``); θ to the rounding of the uploads' dtype, or, with
    ``upload_dtype=False``, of the example's dtype."""
    def camouflage(state, g, t, opt):
        kw = {"upload_dtype": camouflage_upload_dtype(opt, state, g, t)} if upload_dtype else {}
        gt, ok = camouflage_gradient(state["m"], state["v"], state["theta"], g, beta1=opt.beta1,
                                     beta2=opt.beta2, lr_t=adam_lr_t(opt, t), eps=opt.eps, **kw)
        gt = np.array(gt, dtype=np.float64)
        if np.asarray(g).dtype == np.float64 or not float32_only:
            gt[ok] *= 1.0 + delta
        return gt
    return camouflage


def test_a_theta_off_by_a_nudge_fails_on_float32_examples():
    """A float32 example was judged with float32's unit roundoff although rfrs-ref's Adam
    stores θ in float64: an attack whose g̃ was nudged by 1e-11 (and 1e-8) relative on
    float32 examples held the law, as did one that accepted a step 4·2⁻²⁴ off the honest
    one there. θ is judged with the rounding of the uploads (float64)."""
    for delta in (1e-11, 1e-8):
        r, = run_optimizer_conformance("adam", Adam, max_examples=30, laws=["camouflage_same_theta"],
                                       camouflage=_nudged(delta, float32_only=True, upload_dtype=False))
        assert r.status == "fails" and "differs from θ(g)" in r.message, (delta, r)
    r, = run_optimizer_conformance("adam", Adam, max_examples=30, laws=["camouflage_same_theta"],
                                   camouflage=_nudged(0.0, float32_only=True, upload_dtype=False))
    assert r.status == "fails" and "differs from θ(g)" in r.message, r


@pytest.mark.parametrize("float32_only", [True, False])
def test_a_nudge_fails_and_no_nudge_holds(float32_only):
    r, = run_optimizer_conformance("adam", Adam, max_examples=30, laws=["camouflage_same_theta"],
                                   camouflage=_nudged(0.0, float32_only=float32_only, upload_dtype=True))
    assert r.status == "holds", r.message
    r, = run_optimizer_conformance("adam", Adam, max_examples=30, laws=["camouflage_same_theta"],
                                   camouflage=_nudged(1e-11, float32_only=float32_only, upload_dtype=True))
    assert r.status == "fails" and "differs from θ(g)" in r.message, r
