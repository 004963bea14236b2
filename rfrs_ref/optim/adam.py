"""Adam in federated form (docs/optimizers.md; paper Eqs. 2–6, Algorithms 1–2, appendix B)."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

from rfrs_ref.optim import tolerance as tol
from rfrs_ref.optim.base import (
    Optimizer, State, _as_f64, beta1_field, beta2_field, check_positive, check_round,
    check_unit_interval, eps_field, lr_field, one_minus_pow,
)


@dataclasses.dataclass(frozen=True)
class Adam(Optimizer):
    """Adam (Kingma & Ba 2015) as the paper's clients run it (Eqs. 2–6).

    Client rule:
        m = β₁·m̄ + (1 − β₁)·g
        v = β₂·v̄ + (1 − β₂)·g²
        ηₜ = η·√(1 − β₂ᵗ)/(1 − β₁ᵗ)
        θ = θ̄ − ηₜ·m/(√v + ε)                          (uploads m, v, θ)
    Recovery:     ĝ = (m − β₁·m̄)/(1 − β₁)
    Verification: v ≥ 0; v − β₂v̄ = (1 − β₂)ĝ² (``v-rule``); θ = θ̄ − ηₜ·m/(√v + ε)
    with the uploaded m and v (``theta-rule``): given the v-rule, this is the
    rule's θ for ĝ, checked with a tolerance free of the recovery's error.

    Conventions: t is the global round number (from 1), the same for every
    client of the round; ε is added outside the square root and is not
    rescaled by the bias correction (the paper's Eq. 5, the "efficient" form of
    Kingma & Ba's algorithm 1, whose ε is ε·√(1 − β₂ᵗ) in the textbook form).

    Preconditions: η > 0, ε > 0, β₁, β₂ ∈ [0, 1).
    """

    lr: float = lr_field()
    beta1: float = beta1_field()
    beta2: float = beta2_field()
    eps: float = eps_field()

    name: ClassVar[str] = "adam"
    arrays: ClassVar[tuple[str, ...]] = ("m", "v", "theta")
    checks: ClassVar[tuple[str, ...]] = ("nonfinite", "negative-v", "v-rule", "theta-rule")
    nonnegative: ClassVar[str | None] = "v"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_unit_interval("beta1", self.beta1)
        check_unit_interval("beta2", self.beta2)
        check_positive("eps", self.eps)

    def step_size(self, t: int) -> float:
        """ηₜ = η·√(1 − β₂ᵗ)/(1 − β₁ᵗ), in float64."""
        t = check_round(t)
        return self.lr * math.sqrt(one_minus_pow(self.beta2, t)) / one_minus_pow(self.beta1, t)

    lr_t = step_size

    def client_rule(self, state: State, g: np.ndarray, t: int) -> dict[str, np.ndarray]:
        lr_t = self.step_size(t)
        mb = _as_f64(state["m"], "state 'm'")
        vb = _as_f64(state["v"], "state 'v'")
        tb = _as_f64(state["theta"], "state 'theta'")
        g = _as_f64(g, "g")
        m = self.beta1 * mb + (1.0 - self.beta1) * g
        v = self.beta2 * vb + (1.0 - self.beta2) * (g * g)
        theta = tb - lr_t * m / (np.sqrt(v) + self.eps)
        return {"m": m, "v": v, "theta": theta}

    def recover(self, state: State, upload: State, t: int) -> np.ndarray:
        check_round(t)
        m = _as_f64(upload["m"], "upload 'm'")
        return (m - self.beta1 * _as_f64(state["m"], "state 'm'")) / (1.0 - self.beta1)

    def _gradient_derivation(self):
        # (m − β₁m̄)/(1 − β₁) as adam_recover computes it (the arguments _recover_numba
        # passes)
        return "m", (float(self.beta1), 1.0 - self.beta1, False)

    def recovery_bound(self, state, upload, t, recovered=None):
        u, tiny = tol.roundoff(*self._bound_dtypes(upload, recovered))
        g_hat = self.recover(state, upload, t) if recovered is None else _as_f64(recovered, "recovered")
        return tol.adam_recovery_bound(_as_f64(state["m"], "state"), g_hat, self.beta1, u, tiny)

    def _rule_checks(self, state64, upload64, g_hat, t, u, tiny):
        mb, vb, tb = state64["m"], state64["v"], state64["theta"]
        m, v, th = upload64["m"], upload64["v"], upload64["theta"]
        b1, b2, c2 = self.beta1, self.beta2, 1.0 - self.beta2
        lr_t = self.step_size(t)
        b = tol.adam_recovery_bound(mb, g_hat, b1, u, tiny)
        with np.errstate(all="ignore"):
            return [
                ("v-rule", v - b2 * vb - c2 * (g_hat * g_hat),
                 tol.second_moment_bound(v, vb, g_hat, b, b2, c2, u, tiny)),
                ("theta-rule", th - (tb - lr_t * m / (np.sqrt(v) + self.eps)),
                 tol.adam_theta_bound(tb, m, v, lr_t, self.eps, u, tiny)),
            ]

    def _rule_numba(self, state, grads, t, out, rows):
        from rfrs_ref.kernels import optim as K

        K.adam_rule(np.asarray(state["m"]), np.asarray(state["v"]), np.asarray(state["theta"]),
                    grads, rows, float(self.beta1), 1.0 - self.beta1, float(self.beta2),
                    1.0 - self.beta2, self.step_size(t), float(self.eps),
                    out["m"], out["v"], out["theta"])

    def _recover_numba(self, state, uploads, t, out, rows):
        from rfrs_ref.kernels import optim as K

        K.adam_recover(np.asarray(state["m"]), uploads["m"], rows, float(self.beta1),
                       1.0 - self.beta1, out)

    def _verify_args(self, state, uploads, t, recovered):
        has = recovered is not None
        rec = recovered if has else np.zeros((1, 1), dtype=uploads["m"].dtype)
        return ((np.asarray(state["m"]), np.asarray(state["v"]), np.asarray(state["theta"]),
                 uploads["m"], uploads["v"], uploads["theta"], rec, has),
                (float(self.beta1), 1.0 - self.beta1, float(self.beta2), 1.0 - self.beta2,
                 self.step_size(t), float(self.eps)))

    def _verify_numba(self, state, uploads, t, recovered, u, tiny, safety, rows):
        from rfrs_ref.kernels import optim as K

        arrays, scalars = self._verify_args(state, uploads, t, recovered)
        return K.adam_verify(*arrays, rows, *scalars, u, tiny, safety)

    def _screen_numba(self, state, uploads, t, recovered, u, tiny, safety, screen32=True):
        from rfrs_ref.kernels import optim as K

        arrays, scalars = self._verify_args(state, uploads, t, recovered)
        k32, use32 = K.screen32_adam(arrays[:6], *scalars, u, tiny, safety)
        return K.adam_screen(*arrays, *scalars, u, tiny, safety, k32, use32 and screen32)

    def _screen_sum_numba(self, state, uploads, t, w, u, tiny, safety, acc, nchunks, screen,
                          screen32=True):
        from rfrs_ref.kernels import optim as K

        arrays, scalars = self._verify_args(state, uploads, t, None)
        k32, use32 = K.screen32_adam(arrays[:6], *scalars, u, tiny, safety)
        return K.adam_screen_sum(*arrays[:6], w, *scalars, u, tiny, safety, acc["m"], acc["v"],
                                 acc["theta"], nchunks, screen, k32, use32 and screen32)

    def _recover_screen_numba(self, state, uploads, t, out, gradient, u, tiny, safety, screen,
                              screen32=True):
        from rfrs_ref.kernels import optim as K

        arrays, scalars = self._verify_args(state, uploads, t, None)
        k32, use32 = K.screen32_adam(arrays[:6], *scalars, u, tiny, safety)
        return K.adam_recover_screen(*arrays[:6], out, gradient, *scalars, u, tiny, safety,
                                     screen, k32, use32 and screen32)
