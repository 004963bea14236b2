"""Plain SGD in federated form (docs/optimizers.md): the client uploads θ only."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from rfrs_ref.optim import tolerance as tol
from rfrs_ref.optim.base import Optimizer, State, _as_f64, check_round, lr_field


@dataclasses.dataclass(frozen=True)
class SGD(Optimizer):
    """Stochastic gradient descent.

    Client rule:  θ = θ̄ − η·g                       (uploads θ)
    Recovery:     ĝ = (θ̄ − θ)/η
    Verification: every value finite (any finite θ is the rule's θ for some ĝ).

    Recovery divides the step η·g, about η relative to θ̄, by η: in float32 it
    keeps about −log10(u·|θ̄|/(η|g|)) digits of g
    (:func:`rfrs_ref.optim.tolerance.sgd_recovery_bound`).
    """

    lr: float = lr_field()

    name: ClassVar[str] = "sgd"
    arrays: ClassVar[tuple[str, ...]] = ("theta",)
    checks: ClassVar[tuple[str, ...]] = ("nonfinite",)

    def client_rule(self, state: State, g: np.ndarray, t: int) -> dict[str, np.ndarray]:
        check_round(t)
        tb = _as_f64(state["theta"], "state 'theta'")
        g = _as_f64(g, "g")
        return {"theta": tb - self.lr * g}

    def recover(self, state: State, upload: State, t: int) -> np.ndarray:
        check_round(t)
        tb = _as_f64(state["theta"], "state 'theta'")
        return (tb - _as_f64(upload["theta"], "upload 'theta'")) / self.lr

    def _gradient_derivation(self):
        # (θ̄ − θ)/η as sgd_recover computes it: (1·θ̄ − θ)/η, flip True
        return "theta", (1.0, float(self.lr), True)

    def recovery_bound(self, state, upload, t, recovered=None):
        u, tiny = tol.roundoff(*self._bound_dtypes(upload, recovered))
        g_hat = self.recover(state, upload, t) if recovered is None else _as_f64(recovered, "recovered")
        return tol.sgd_recovery_bound(_as_f64(state["theta"], "state"), g_hat, self.lr, u, tiny)

    def _rule_numba(self, state, grads, t, out, rows):
        from rfrs_ref.kernels import optim as K

        K.sgd_rule(np.asarray(state["theta"]), grads, rows, float(self.lr), out["theta"])

    def _recover_numba(self, state, uploads, t, out, rows):
        from rfrs_ref.kernels import optim as K

        K.sgd_recover(np.asarray(state["theta"]), uploads["theta"], rows, float(self.lr), out)

    def _verify_numba(self, state, uploads, t, recovered, u, tiny, safety, rows):
        from rfrs_ref.kernels import optim as K

        return K.sgd_verify(uploads["theta"], rows)

    def _screen_sum_numba(self, state, uploads, t, w, u, tiny, safety, acc, nchunks, screen,
                          screen32=True):
        from rfrs_ref.kernels import optim as K

        return K.sgd_screen_sum(uploads["theta"], w, acc["theta"], nchunks, screen)

    def _recover_screen_numba(self, state, uploads, t, out, gradient, u, tiny, safety, screen,
                              screen32=True):
        from rfrs_ref.kernels import optim as K

        return K.sgd_recover_screen(np.asarray(state["theta"]), uploads["theta"], out, gradient,
                                    float(self.lr), screen)
