"""Optimisers in federated form (SPEC §5).

A federated optimiser is a set of pure functions over explicit state, in the
manner of optax:

- ``init(theta0) -> state``: the server's initial state, a dict of equally
  shaped 1-D arrays named by ``arrays`` (``theta`` always, plus ``m``, ``v`` or
  ``r``); moments start at zero.
- ``client_rule(state, g, t) -> upload``: what a client that computed gradient
  ``g`` on the server state of round ``t`` uploads (a dict with the same names).
- ``recover(state, upload, t) -> g``: the server's recovery of the gradient.

Round numbers t start at 1 (the first round); ``state`` is the server's state
after round t − 1. The server aggregates every uploaded array with the same
weights, and the aggregate is its new state.

The functions above are the readable NumPy float64 oracle. The ``*_batch``
methods are the fast paths used by the round loop: they process the rows of an
(n, D) matrix of gradients or uploads and write into caller-owned buffers.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar, Mapping

import numpy as np

from rfrs_ref.params import hyper

State = Mapping[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Optimizer(abc.ABC):
    lr: float = hyper(1e-3, "learning rate η")

    name: ClassVar[str] = ""
    #: names of the arrays a client uploads; the server state has the same names
    arrays: ClassVar[tuple[str, ...]] = ("theta",)

    def init(self, theta0: np.ndarray) -> dict[str, np.ndarray]:
        """Initial server state: θ̄⁰ = theta0 (copied), every moment 0."""
        state = {k: np.zeros_like(theta0) for k in self.arrays}
        state["theta"] = np.array(theta0, copy=True)
        return state

    @abc.abstractmethod
    def client_rule(self, state: State, g: np.ndarray, t: int) -> dict[str, np.ndarray]:
        """The upload of a client with gradient ``g`` in round ``t`` (NumPy oracle)."""

    @abc.abstractmethod
    def recover(self, state: State, upload: State, t: int) -> np.ndarray:
        """The server's recovery of the gradient from ``upload`` (NumPy oracle)."""

    # -- fast paths; defaults loop over the oracle ---------------------------------
    def client_rule_batch(
        self, state: State, grads: np.ndarray, t: int, out: Mapping[str, np.ndarray],
        backend: str = "numba",
    ) -> None:
        """Write the upload of client row r (gradient ``grads[r]``) into ``out[name][r]``."""
        for r in range(grads.shape[0]):
            up = self.client_rule(state, grads[r], t)
            for k in self.arrays:
                out[k][r] = up[k]

    def recover_batch(
        self, state: State, uploads: Mapping[str, np.ndarray], t: int, out: np.ndarray,
        backend: str = "numba",
    ) -> None:
        """Write the recovered gradient of upload row r into ``out[r]``."""
        for r in range(out.shape[0]):
            out[r] = self.recover(state, {k: uploads[k][r] for k in self.arrays}, t)
