"""SGD with momentum in federated form (docs/optimizers.md; paper appendix C)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from rfrs_ref.optim import tolerance as tol
from rfrs_ref.optim.base import (
    Optimizer, State, _as_f64, beta3_field, check_round, check_unit_interval, lr_field,
)


@dataclasses.dataclass(frozen=True)
class Momentum(Optimizer):
    """SGD with (heavy-ball) momentum, as in the paper's appendix C.

    Client rule:  m = β₃·m̄ + g;  θ = θ̄ − η·m        (uploads m, θ)
    Recovery:     ĝ = m − β₃·m̄
    Verification: θ = θ̄ − η·m (check ``theta-rule``), m as uploaded; any
    finite m is the rule's m for the recovered ĝ.

    Convention: the gradient enters m with weight 1 (not 1 − β₃), so
    ‖m‖ ≤ g_max/(1 − β₃) under convex aggregation (the analogue of Lemma 2),
    and β₃ = 0 is plain SGD.

    Preconditions: η > 0, β₃ ∈ [0, 1).
    """

    lr: float = lr_field()
    beta3: float = beta3_field()

    name: ClassVar[str] = "momentum"
    arrays: ClassVar[tuple[str, ...]] = ("m", "theta")
    checks: ClassVar[tuple[str, ...]] = ("nonfinite", "theta-rule")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_unit_interval("beta3", self.beta3)

    def client_rule(self, state: State, g: np.ndarray, t: int) -> dict[str, np.ndarray]:
        check_round(t)
        mb = _as_f64(state["m"], "state 'm'")
        tb = _as_f64(state["theta"], "state 'theta'")
        g = _as_f64(g, "g")
        m = self.beta3 * mb + g
        return {"m": m, "theta": tb - self.lr * m}

    def recover(self, state: State, upload: State, t: int) -> np.ndarray:
        check_round(t)
        return _as_f64(upload["m"], "upload 'm'") - self.beta3 * _as_f64(state["m"], "state 'm'")

    def _gradient_derivation(self):
        # m − β₃m̄ as momentum_recover computes it (the division by 1 is exact)
        return "m", (float(self.beta3), 1.0, False)

    def recovery_bound(self, state, upload, t, recovered=None):
        u, tiny = tol.roundoff(*self._bound_dtypes(upload, recovered))
        g_hat = self.recover(state, upload, t) if recovered is None else _as_f64(recovered, "recovered")
        return tol.momentum_recovery_bound(_as_f64(state["m"], "state"), g_hat, self.beta3, u, tiny)

    def _rule_checks(self, state64, upload64, g_hat, t, u, tiny):
        tb, m, th = state64["theta"], upload64["m"], upload64["theta"]
        return [("theta-rule", th - (tb - self.lr * m),
                 tol.momentum_theta_bound(tb, m, self.lr, u, tiny))]

    def _rule_numba(self, state, grads, t, out, rows):
        from rfrs_ref.kernels import optim as K

        K.momentum_rule(np.asarray(state["m"]), np.asarray(state["theta"]), grads, rows,
                        float(self.beta3), float(self.lr), out["m"], out["theta"])

    def _recover_numba(self, state, uploads, t, out, rows):
        from rfrs_ref.kernels import optim as K

        K.momentum_recover(np.asarray(state["m"]), uploads["m"], rows, float(self.beta3), out)

    def _verify_numba(self, state, uploads, t, recovered, u, tiny, safety, rows):
        from rfrs_ref.kernels import optim as K

        return K.momentum_verify(np.asarray(state["theta"]), uploads["m"], uploads["theta"], rows,
                                 float(self.lr), u, tiny, safety)

    def _screen_numba(self, state, uploads, t, recovered, u, tiny, safety, screen32=True):
        from rfrs_ref.kernels import optim as K

        return K.momentum_screen(np.asarray(state["theta"]), uploads["m"], uploads["theta"],
                                 float(self.lr), u, tiny, safety)

    def _screen_sum_numba(self, state, uploads, t, w, u, tiny, safety, acc, nchunks, screen,
                          screen32=True):
        from rfrs_ref.kernels import optim as K

        return K.momentum_screen_sum(np.asarray(state["theta"]), uploads["m"], uploads["theta"], w,
                                     float(self.lr), u, tiny, safety, acc["m"], acc["theta"],
                                     nchunks, screen)

    def _recover_screen_numba(self, state, uploads, t, out, gradient, u, tiny, safety, screen,
                              screen32=True):
        from rfrs_ref.kernels import optim as K

        return K.momentum_recover_screen(np.asarray(state["m"]), np.asarray(state["theta"]),
                                         uploads["m"], uploads["theta"], out, gradient,
                                         float(self.beta3), float(self.lr), u, tiny, safety,
                                         screen)
