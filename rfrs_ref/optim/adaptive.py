"""AdaGrad and RMSProp in federated form (docs/optimizers.md; paper appendices D and E).

Both scale the gradient by the root of an accumulated square,
θ = θ̄ − η·g/(√r + ε), with r = decay·r̄ + coef·g²: AdaGrad (1, 1), RMSProp
(β₄, 1 − β₄). The server recovers the gradient from θ (r only gives |g|) and
checks that r is consistent with ĝ².
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from rfrs_ref.optim import tolerance as tol
from rfrs_ref.optim.base import (
    Optimizer, State, _as_f64, beta4_field, check_positive, check_round, check_unit_interval,
    eps_field, lr_field,
)


@dataclasses.dataclass(frozen=True)
class _RootScaled(Optimizer):
    arrays: ClassVar[tuple[str, ...]] = ("r", "theta")
    checks: ClassVar[tuple[str, ...]] = ("nonfinite", "negative-r", "r-rule")
    nonnegative: ClassVar[str | None] = "r"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("eps", self.eps)

    def _decay_coef(self) -> tuple[float, float]:
        raise NotImplementedError

    def client_rule(self, state: State, g: np.ndarray, t: int) -> dict[str, np.ndarray]:
        check_round(t)
        decay, coef = self._decay_coef()
        rb = _as_f64(state["r"], "state 'r'")
        tb = _as_f64(state["theta"], "state 'theta'")
        g = _as_f64(g, "g")
        r = decay * rb + coef * (g * g)
        return {"r": r, "theta": tb - self.lr * g / (np.sqrt(r) + self.eps)}

    def recover(self, state: State, upload: State, t: int) -> np.ndarray:
        check_round(t)
        tb = _as_f64(state["theta"], "state 'theta'")
        r = _as_f64(upload["r"], "upload 'r'")
        with np.errstate(invalid="ignore"):  # a negative r is verification's business
            return (tb - _as_f64(upload["theta"], "upload 'theta'")) * (np.sqrt(r) + self.eps) / self.lr

    def recovery_bound(self, state, upload, t, recovered=None):
        u, tiny = tol.roundoff(*self._bound_dtypes(upload, recovered))
        g_hat = self.recover(state, upload, t) if recovered is None else _as_f64(recovered, "recovered")
        return tol.root_recovery_bound(_as_f64(state["theta"], "state"), _as_f64(upload["r"], "r"),
                                       g_hat, self.lr, self.eps, u, tiny)

    def _rule_checks(self, state64, upload64, g_hat, t, u, tiny):
        decay, coef = self._decay_coef()
        rb, tb = state64["r"], state64["theta"]
        r = upload64["r"]
        b = tol.root_recovery_bound(tb, r, g_hat, self.lr, self.eps, u, tiny)
        with np.errstate(all="ignore"):
            return [("r-rule", r - decay * rb - coef * (g_hat * g_hat),
                     tol.second_moment_bound(r, rb, g_hat, b, decay, coef, u, tiny))]

    def _rule_numba(self, state, grads, t, out, rows):
        from rfrs_ref.kernels import optim as K

        decay, coef = self._decay_coef()
        K.root_rule(np.asarray(state["r"]), np.asarray(state["theta"]), grads, rows, decay, coef,
                    float(self.lr), float(self.eps), out["r"], out["theta"])

    def _recover_numba(self, state, uploads, t, out, rows):
        from rfrs_ref.kernels import optim as K

        K.root_recover(np.asarray(state["theta"]), uploads["r"], uploads["theta"], rows,
                       float(self.lr), float(self.eps), out)

    def _verify_args(self, state, uploads, recovered):
        decay, coef = self._decay_coef()
        has = recovered is not None
        rec = recovered if has else np.zeros((1, 1), dtype=uploads["r"].dtype)
        return ((np.asarray(state["r"]), np.asarray(state["theta"]), uploads["r"],
                 uploads["theta"], rec, has),
                (decay, coef, float(self.lr), float(self.eps)))

    def _verify_numba(self, state, uploads, t, recovered, u, tiny, safety, rows):
        from rfrs_ref.kernels import optim as K

        arrays, scalars = self._verify_args(state, uploads, recovered)
        return K.root_verify(*arrays, rows, *scalars, u, tiny, safety)

    def _screen_numba(self, state, uploads, t, recovered, u, tiny, safety, screen32=True):
        from rfrs_ref.kernels import optim as K

        arrays, scalars = self._verify_args(state, uploads, recovered)
        k32, use32 = K.screen32_root(arrays[:4], *scalars, u, tiny, safety)
        return K.root_screen(*arrays, *scalars, u, tiny, safety, k32, use32 and screen32)

    def _screen_sum_numba(self, state, uploads, t, w, u, tiny, safety, acc, nchunks, screen,
                          screen32=True):
        from rfrs_ref.kernels import optim as K

        arrays, scalars = self._verify_args(state, uploads, None)
        k32, use32 = K.screen32_root(arrays[:4], *scalars, u, tiny, safety)
        return K.root_screen_sum(*arrays[:4], w, *scalars, u, tiny, safety, acc["r"],
                                 acc["theta"], nchunks, screen, k32, use32 and screen32)


    def _recover_screen_numba(self, state, uploads, t, out, gradient, u, tiny, safety, screen,
                              screen32=True):
        from rfrs_ref.kernels import optim as K

        arrays, scalars = self._verify_args(state, uploads, None)
        k32, use32 = K.screen32_root(arrays[:4], *scalars, u, tiny, safety)
        return K.root_recover_screen(*arrays[:4], out, gradient, *scalars, u, tiny, safety,
                                     screen, k32, use32 and screen32)


@dataclasses.dataclass(frozen=True)
class AdaGrad(_RootScaled):
    """AdaGrad (Duchi et al. 2011), the paper's appendix D.

    Client rule:  r = r̄ + g²;  θ = θ̄ − η·g/(√r + ε)     (uploads r, θ)
    Recovery:     ĝ = (θ̄ − θ)(√r + ε)/η
    Verification: r ≥ 0; r − r̄ = ĝ² (``r-rule``).

    Convention: ε outside the square root. Recovery from θ in float32 keeps
    about −log10(u·|θ̄|(√r + ε)/(η|g|)) digits of g
    (:func:`rfrs_ref.optim.tolerance.root_recovery_bound`), so the r-rule's
    tolerance grows where the step is small next to θ̄.

    Preconditions: η > 0, ε > 0.
    """

    lr: float = lr_field()
    eps: float = eps_field()

    name: ClassVar[str] = "adagrad"

    def _decay_coef(self) -> tuple[float, float]:
        return 1.0, 1.0


@dataclasses.dataclass(frozen=True)
class RMSProp(_RootScaled):
    """RMSProp (Tieleman & Hinton 2012), the paper's appendix E.

    Client rule:  r = β₄·r̄ + (1 − β₄)·g²;  θ = θ̄ − η·g/(√r + ε)   (uploads r, θ)
    Recovery:     ĝ = (θ̄ − θ)(√r + ε)/η
    Verification: r ≥ 0; r − β₄r̄ = (1 − β₄)ĝ² (``r-rule``).

    Convention: ε outside the square root, no bias correction. Adam with
    β₁ = 0 is RMSProp with β₄ = β₂ and learning rate ηₜ = η·√(1 − β₂ᵗ) at
    round t (same v/r, same θ; docs/optimizers.md).

    Preconditions: η > 0, ε > 0, β₄ ∈ [0, 1).
    """

    lr: float = lr_field()
    beta4: float = beta4_field()
    eps: float = eps_field()

    name: ClassVar[str] = "rmsprop"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_unit_interval("beta4", self.beta4)

    def _decay_coef(self) -> tuple[float, float]:
        return float(self.beta4), 1.0 - self.beta4
