"""Deliberately broken implementations, for showing that the conformance suite finds them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rfrs_ref.kernels.distances import pairwise_sq_dists_numpy
from rfrs_ref.optim import Adam, Momentum
from rfrs_ref.optim.base import _as_f64
from rfrs_ref.testing.adapters import Outcome


def krum_with_n_minus_f_neighbours(X, ns, f):
    """Multi-Krum whose score sums the n − f nearest squared distances instead of
    n − f − 2 (non-finite rows infinitely far, as they should be)."""
    n = X.shape[0]
    D2 = pairwise_sq_dists_numpy(X)
    np.fill_diagonal(D2, np.inf)
    m = min(n - 1, n - f)
    with np.errstate(all="ignore"):
        scores = np.sort(D2, axis=1)[:, :m].sum(axis=1)
    keep = np.argsort(scores, kind="stable")[: n - f]
    w = np.zeros(n)
    w[keep] = ns[keep]
    w /= w.sum()
    rows = np.flatnonzero(w)
    with np.errstate(all="ignore"):
        return Outcome(w[rows] @ X[rows].astype(np.float64), w)


def trmean_trimming_clients_by_norm(X, ns, f):
    """Removes the f clients with the largest and the f with the smallest norms (the
    paper appendix's wording), then averages: not Yin et al.'s coordinate-wise rule."""
    n = X.shape[0]
    with np.errstate(all="ignore"):
        norms = np.linalg.norm(X.astype(np.float64), axis=1)
    norms = np.where(np.isnan(norms), np.inf, norms)
    keep = np.argsort(norms, kind="stable")[f : n - f]
    return Outcome(X[keep].astype(np.float64).mean(axis=0))


def unweighted_mean(X, ns, f):
    return X.astype(np.float64).mean(axis=0)


@dataclasses.dataclass(frozen=True)
class AdamRecoveringWithBeta1(Adam):
    """Recovers ĝ = (m − β₁m̄)/β₁: the wrong denominator."""

    def recover(self, state, upload, t):
        with np.errstate(all="ignore"):  # β₁ = 0 is drawn too
            return (_as_f64(upload["m"], "m") - self.beta1 * _as_f64(state["m"], "m")) / self.beta1


@dataclasses.dataclass(frozen=True)
class AdamSwappingTheFirstMomentWeights(Adam):
    """m = (1 − β₁)m̄ + β₁g: the two weights of the first moment swapped."""

    def client_rule(self, state, g, t):
        mb, vb, tb = (_as_f64(state[k], k) for k in ("m", "v", "theta"))
        g = _as_f64(g, "g")
        m = (1.0 - self.beta1) * mb + self.beta1 * g
        v = self.beta2 * vb + (1.0 - self.beta2) * g * g
        return {"m": m, "v": v, "theta": tb - self.step_size(t) * m / (np.sqrt(v) + self.eps)}


@dataclasses.dataclass(frozen=True)
class MomentumDoublingTheGradient(Momentum):
    def client_rule(self, state, g, t):
        return super().client_rule(state, 2.0 * np.asarray(g, dtype=np.float64), t)


@dataclasses.dataclass(frozen=True)
class AdamRecoveringTheLastGradient(Adam):
    """Remembers the last g client_rule was given and returns it as the recovery."""

    def client_rule(self, state, g, t):
        _LAST[type(self)] = np.array(g, dtype=np.float64, copy=True)
        return super().client_rule(state, g, t)

    def recover(self, state, upload, t):
        return _LAST[type(self)].copy()


_LAST: dict = {}


@dataclasses.dataclass(frozen=True)
class AdamHidingTheGradientInItsUpload(Adam):
    """Uploads g as an extra array and recovers it from there."""

    def client_rule(self, state, g, t):
        up = super().client_rule(state, g, t)
        up["g"] = np.array(g, dtype=np.float64)
        return up

    def recover(self, state, upload, t):
        return np.asarray(upload["g"], dtype=np.float64)


@dataclasses.dataclass(frozen=True)
class AdamEpsInsideTheRootForFloat32(Adam):
    """ε outside the square root on float64 inputs, inside it on float32 ones."""

    def client_rule(self, state, g, t):
        if np.asarray(g).dtype != np.float32 and np.asarray(state["theta"]).dtype != np.float32:
            return super().client_rule(state, g, t)
        mb, vb, tb = (_as_f64(state[k], k) for k in ("m", "v", "theta"))
        g = _as_f64(g, "g")
        m = self.beta1 * mb + (1.0 - self.beta1) * g
        v = self.beta2 * vb + (1.0 - self.beta2) * g * g
        return {"m": m, "v": v, "theta": tb - self.step_size(t) * m / np.sqrt(v + self.eps)}


@dataclasses.dataclass(frozen=True)
class AdamUpdatingItsStateInPlace(Adam):
    """Right values, computed by updating the state arrays it is given (m̄ *= β₁ ...)."""

    def client_rule(self, state, g, t):
        g = _as_f64(g, "g")
        m, v, th = state["m"], state["v"], state["theta"]
        m *= self.beta1
        m += (1.0 - self.beta1) * g
        v *= self.beta2
        v += (1.0 - self.beta2) * g * g
        th -= self.step_size(t) * m / (np.sqrt(v) + self.eps)
        return {"m": m.copy(), "v": v.copy(), "theta": th.copy()}

    def recover(self, state, upload, t):
        return super().recover(state, upload, t)


@pytest.fixture(scope="session")
def broken():
    """name -> the broken implementation."""
    return {
        "krum_n_minus_f": krum_with_n_minus_f_neighbours,
        "trmean_by_norm": trmean_trimming_clients_by_norm,
        "unweighted_mean": unweighted_mean,
        "adam_recover_beta1": AdamRecoveringWithBeta1,
        "adam_swapped_m": AdamSwappingTheFirstMomentWeights,
        "momentum_double": MomentumDoublingTheGradient,
        "adam_recover_last_g": AdamRecoveringTheLastGradient,
        "adam_g_in_upload": AdamHidingTheGradientInItsUpload,
        "adam_eps_inside_f32": AdamEpsInsideTheRootForFloat32,
        "adam_in_place": AdamUpdatingItsStateInPlace,
    }
