"""Optimisers in federated form (docs/optimizers.md).

A federated optimiser is a set of pure functions over explicit state, in the
manner of optax:

- ``init(theta0) -> state``: the server's initial state, a dict of equally
  shaped 1-D arrays named by ``arrays`` (``theta`` always, plus ``m``, ``v`` or
  ``r``); moments start at zero.
- ``client_rule(state, g, t) -> upload``: what a client that computed gradient
  ``g`` on the server state of round ``t`` uploads (a dict with the same names).
- ``recover(state, upload, t) -> g``: the server's recovery of the gradient.
- ``verify(state, upload, t) -> Verdict``: whether the upload obeys the rule
  (docs/optimizers.md, the paper's footnote 1), within a tolerance derived from rounding
  (:mod:`rfrs_ref.optim.tolerance`).

Round numbers t start at 1 (the first round); ``state`` is the server's state
after round t − 1. The server aggregates every uploaded array with the same
weights, and the aggregate is its new state.

The functions above are the readable NumPy float64 oracle: they accept arrays
of any float dtype, compute in float64 and return float64. The ``*_batch``
methods are the fast paths used by the round loop: they process the rows of an
(n, D) matrix of gradients or uploads and write into caller-owned buffers, in
the buffers' dtype; ``backend="numba"`` (default) runs one fused kernel of
:mod:`rfrs_ref.kernels.optim`, ``backend="numpy"`` loops over the oracle.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import numbers
from typing import ClassVar, Mapping, Sequence

import numpy as np

from rfrs_ref.optim.tolerance import VERIFY_SAFETY, roundoff
from rfrs_ref.params import check_kinds, hyper

State = Mapping[str, np.ndarray]

#: ``"cuda"`` is accepted so that a run's backend can be passed through: the
#: optimiser's arrays live in host memory and its kernels are memory-bound
#: element-wise passes, so they run on the CPU kernels of ``"numba"``.
BACKENDS = ("numba", "numpy", "cuda")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The result of update-rule verification of one upload.

    Attributes:
        ok: the upload passed every check.
        check: the first failed check in the optimiser's ``checks`` order
            (``"nonfinite"``, ``"negative-v"``, ``"v-rule"``, ``"theta-rule"``...),
            None when ``ok``.
        violation: the largest residual-to-tolerance ratio over the rule checks
            (the upload passes when it is at most 1); ``inf`` when a value is
            non-finite or a second moment negative.
        ratios: the largest ratio of each check (``inf`` for a failed structural
            check, 0 for one that passed).
    """

    ok: bool
    check: str | None
    violation: float
    ratios: Mapping[str, float]


# -- hyperparameter fields shared by the optimisers --------------------------------------
# Each optimiser declares its own fields with these factories, so that a name has
# the same default and meaning everywhere (the CLI exposes their union).

def lr_field():
    return hyper(1e-3, "learning rate η")


def beta1_field():
    return hyper(0.9, "Adam: decay of the first moment m, β₁ ∈ [0, 1)")


def beta2_field():
    return hyper(0.999, "Adam: decay of the second moment v, β₂ ∈ [0, 1)")


def beta3_field():
    return hyper(0.9, "momentum: weight of the aggregated momentum, β₃ ∈ [0, 1)")


def beta4_field():
    return hyper(0.99, "RMSProp: decay of the squared-gradient average r, β₄ ∈ [0, 1)")


def eps_field():
    return hyper(1e-8, "ε added to the root of the second moment (outside the square root), > 0")


# -- argument validation ------------------------------------------------------------------

def check_round(t) -> int:
    """t as an int, or an error: rounds are numbered from 1."""
    if isinstance(t, bool) or not isinstance(t, numbers.Integral):
        raise TypeError(f"round number t must be an integer (rounds are numbered from 1), got {t!r}")
    if t < 1:
        raise ValueError(f"round number t must be at least 1 (rounds are numbered from 1), got t={t}")
    return int(t)


def check_positive(name: str, value) -> None:
    if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {name}={value!r}")


def check_unit_interval(name: str, value) -> None:
    if not (isinstance(value, numbers.Real) and 0.0 <= value < 1.0):
        raise ValueError(f"{name} must lie in [0, 1), got {name}={value!r}")


def one_minus_pow(beta: float, t: int) -> float:
    """1 − βᵗ in float64, accurate for β close to 1 (−expm1(t·log β))."""
    if beta == 0.0:
        return 1.0
    return -math.expm1(t * math.log(beta))


def _as_f64(x, what: str) -> np.ndarray:
    a = np.asarray(x)
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise TypeError(f"{what} must hold real numbers, got dtype {a.dtype}")
    return a.astype(np.float64)


def _float_dtype(a: np.ndarray) -> np.dtype:
    return a.dtype if np.issubdtype(a.dtype, np.floating) else np.dtype(np.float64)


@dataclasses.dataclass(frozen=True)
class Optimizer(abc.ABC):
    """A federated optimiser: client rule, server recovery and verification.

    Subclasses define ``name``, ``arrays`` (the uploaded arrays, which are also
    the names of the server state), ``checks`` (the verification checks in the
    order they are reported), and the oracle methods.
    """

    lr: float = lr_field()

    name: ClassVar[str] = ""
    #: names of the arrays a client uploads; the server state has the same names
    arrays: ClassVar[tuple[str, ...]] = ("theta",)
    #: verification checks, in the order of precedence used to report a failure
    checks: ClassVar[tuple[str, ...]] = ("nonfinite",)
    #: the uploaded array that must be non-negative (a second moment), if any
    nonnegative: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        check_kinds(self)
        check_positive("lr", self.lr)

    # -- the oracle ------------------------------------------------------------------
    def init(self, theta0: np.ndarray) -> dict[str, np.ndarray]:
        """Initial server state: θ̄⁰ = theta0 (copied), every moment 0 (same dtype)."""
        theta0 = np.asarray(theta0)
        if theta0.ndim != 1:
            raise ValueError(f"theta0 must be a flat 1-D parameter vector, got shape {theta0.shape}")
        state = {k: np.zeros_like(theta0) for k in self.arrays}
        state["theta"] = np.array(theta0, copy=True)
        return state

    def step_size(self, t: int) -> float:
        """The factor of the step taken from θ̄ in round t (η; Adam: ηₜ)."""
        check_round(t)
        return float(self.lr)

    @abc.abstractmethod
    def client_rule(self, state: State, g: np.ndarray, t: int) -> dict[str, np.ndarray]:
        """The upload of a client with gradient ``g`` in round ``t`` (NumPy oracle, float64)."""

    def feature_derivation(self, space: str) -> tuple[str, tuple[float, float, bool]] | None:
        """How a detection feature is derived from one uploaded array, where a kernel reads
        it: ``(name, (a, c, flip))`` such that the feature of an upload is
        ``rfrs_ref.kernels.distances.derived_features(upload[name], state[name], (a, c,
        flip))``, bit for bit, or None where it is not so derived.

        In parameter space every optimiser's feature is θᵢ − θ̄: ``("theta", (1, 1,
        False))``. In gradient space it is the recovered gradient, which is such a
        function of one array for SGD, momentum and Adam (their recovery kernels' very
        expressions; AdaGrad's and RMSProp's recovery reads two arrays: None).
        """
        if space == "parameter":
            return "theta", (1.0, 1.0, False)
        if space != "gradient":
            raise ValueError(f"space must be 'gradient' or 'parameter', got {space!r}")
        return self._gradient_derivation()

    def _gradient_derivation(self) -> tuple[str, tuple[float, float, bool]] | None:
        return None

    @abc.abstractmethod
    def recover(self, state: State, upload: State, t: int) -> np.ndarray:
        """The server's recovery of the gradient from ``upload`` (NumPy oracle, float64)."""

    @abc.abstractmethod
    def recovery_bound(self, state: State, upload: State, t: int,
                       recovered: np.ndarray | None = None) -> np.ndarray:
        """Per-coordinate bound on |ĝ − g| for an honest upload (float64, no safety factor).

        ``g`` is the gradient the client used and ĝ the recovery from ``upload``
        (``recovered`` when given, else :meth:`recover`), for uploads stored in
        their arrays' dtype. Derivation: :mod:`rfrs_ref.optim.tolerance`.
        """

    def _bound_dtypes(self, upload: State, recovered=None) -> list:
        dts = [_float_dtype(np.asarray(upload[k])) for k in self.arrays]
        if recovered is not None:
            dts.append(_float_dtype(np.asarray(recovered)))
        return dts

    def _rule_checks(self, state64: dict, upload64: dict, g_hat: np.ndarray, t: int,
                     u: float, tiny: float) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """(check, residual, bound) of each rule check (coordinates already finite)."""
        return []

    def verify(self, state: State, upload: State, t: int, recovered: np.ndarray | None = None,
               *, safety: float = VERIFY_SAFETY) -> Verdict:
        """Check that ``upload`` obeys the rule for the gradient recovered from it (oracle).

        Checks, in order: every uploaded value is finite (``nonfinite``); the
        second moment, if any, is non-negative (``negative-v``/``negative-r``);
        then each rule check of the optimiser, which compares a residual that is
        zero in exact arithmetic with ``safety`` times its derived rounding bound
        (:mod:`rfrs_ref.optim.tolerance`), in the upload's dtype (and
        ``recovered``'s, when given: ĝ is then read from it instead of being
        recovered in float64).

        Preconditions: the state is finite (it is the server's own). Honest
        uploads pass whenever every intermediate of the rule is finite.
        """
        t = check_round(t)
        self._check_state(state)
        D = state["theta"].shape[0]
        up = {}
        for k in self.arrays:
            if k not in upload:
                raise KeyError(f"{self.name} upload has no array {k!r}; expected {self.arrays}")
            a = np.asarray(upload[k])
            if a.shape != (D,):
                raise ValueError(f"{self.name} upload {k!r} has shape {a.shape}, expected ({D},)")
            up[k] = a
        dtypes = [_float_dtype(a) for a in up.values()]
        if recovered is not None:
            recovered = np.asarray(recovered)
            if recovered.shape != (D,):
                raise ValueError(f"recovered has shape {recovered.shape}, expected ({D},)")
            dtypes.append(_float_dtype(recovered))
        u, tiny = roundoff(*dtypes)
        ratios = {c: 0.0 for c in self.checks}
        up64 = {k: _as_f64(a, f"upload {k!r}") for k, a in up.items()}
        if not all(np.isfinite(a).all() for a in up64.values()):
            ratios["nonfinite"] = math.inf
            return Verdict(False, "nonfinite", math.inf, ratios)
        if self.nonnegative is not None and (up64[self.nonnegative] < 0).any():
            ratios[f"negative-{self.nonnegative}"] = math.inf
            return Verdict(False, f"negative-{self.nonnegative}", math.inf, ratios)
        st64 = {k: _as_f64(state[k], f"state {k!r}") for k in self.arrays}
        if recovered is None:
            g_hat = self.recover(state, up, t)
        else:
            g_hat = _as_f64(recovered, "recovered")
        for check, residual, bound in self._rule_checks(st64, up64, g_hat, t, u, tiny):
            with np.errstate(all="ignore"):
                ratio = np.abs(residual) / (safety * bound)
            worst = float(np.max(ratio, initial=0.0))
            # NaN (an overflow in the residual) fails like an excess
            ratios[check] = math.inf if (math.isnan(worst) or np.isnan(ratio).any()) else worst
        failed = [c for c in self.checks if not ratios[c] <= 1.0]
        violation = max(ratios.values(), default=0.0)
        return Verdict(not failed, failed[0] if failed else None, violation, ratios)

    # -- fast paths ----------------------------------------------------------------------
    def client_rule_batch(
        self, state: State, grads: np.ndarray, t: int, out: Mapping[str, np.ndarray],
        backend: str = "numba", *, rows: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        """Write the upload of gradient row i into ``out[name][rows[i]]`` for every array.

        Args:
            state: the server state after round t − 1 (1-D arrays of length D).
            grads: (k, D) gradients, float32 or float64; not modified.
            t: the round, from 1.
            out: name -> (n, D) caller-owned buffers (float32 or float64), one per
                name in ``arrays``; written in their dtype.
            backend: ``"numba"`` (one fused pass over D per row: the state and
                the gradient read once, every uploaded array written once,
                float64 arithmetic) or ``"numpy"`` (the oracle, row by row);
                ``"cuda"`` runs the numba kernels (host arrays).
            rows: the output rows to write, one per gradient row (distinct);
                None means ``range(k)``. Other rows of ``out`` are left as they
                are, so an attack can push only the Byzantine rows through the
                rule.
        """
        t = check_round(t)
        self._check_state(state)
        grads = self._check_matrix(grads, "grads", state["theta"].shape[0])
        n_out = self._check_out(out, state["theta"].shape[0])
        rows = self._check_rows(rows, grads.shape[0], n_out)
        backend = self._check_backend(backend)
        if grads.shape[0] == 0:
            return
        if backend == "numpy":
            for i, r in enumerate(rows):
                up = self.client_rule(state, grads[i], t)
                for k in self.arrays:
                    out[k][r] = up[k]
        else:
            from rfrs_ref.kernels.optim import threads_for

            with threads_for(grads.size):
                self._rule_numba(state, grads, t, out, rows)

    def recover_batch(
        self, state: State, uploads: Mapping[str, np.ndarray], t: int, out: np.ndarray,
        backend: str = "numba", *, rows: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        """Write the gradient recovered from upload row r into ``out[r]``.

        Args:
            uploads: name -> (n, D) uploads; not modified.
            out: (n, D) caller-owned buffer, float32 or float64.
            rows: the rows to recover (distinct); None means all. Other rows of
                ``out`` are left as they are.
        A non-finite upload gives a non-finite (or meaningless) row: recovery
        never fails, verification is what rejects such uploads.
        """
        t = check_round(t)
        self._check_state(state)
        D = state["theta"].shape[0]
        n = self._check_uploads(uploads, D)
        out = self._check_out_matrix(out, "out", n, D)
        rows = self._check_rows(rows, n if rows is None else len(rows), n)
        backend = self._check_backend(backend)
        if rows.size == 0:
            return
        if backend == "numpy":
            for r in rows:
                out[r] = self.recover(state, {k: uploads[k][r] for k in self.arrays}, t)
        else:
            from rfrs_ref.kernels.optim import threads_for

            with threads_for(rows.size * D):
                self._recover_numba(state, uploads, t, out, rows)

    def verify_batch(
        self, state: State, uploads: Mapping[str, np.ndarray], t: int,
        recovered: np.ndarray | None = None, backend: str = "numba", *,
        safety: float = VERIFY_SAFETY, screen: bool = False, screen32: bool = True,
    ) -> tuple[np.ndarray, list[str | None], np.ndarray]:
        """Verify every upload row (see :meth:`verify` for the checks).

        Args:
            recovered: (n, D) gradients already recovered from ``uploads`` (the
                round loop's feature buffer); None recovers them in float64
                registers inside the kernel.
            screen: (numba backend) decide first, without a division per
                check, which rows certainly pass (every coordinate has
                |ρ| ≤ S·τ with the exact kernel's own ρ and S·τ, so its ratio
                rounds to at most 1), and run the exact kernel on the other
                rows only. Every ``ok`` and every failed row's ``check`` and
                ``violation`` are those of the exact evaluation; a row the
                screen passes reports ``violation`` NaN (not evaluated; it is
                ≤ 1). The round loop screens: it only reports the violation of
                excluded uploads. Derivation: docs/optimizers.md ("Verification
                at speed").
            screen32: (with ``screen``) let the screen first decide in float32
                arithmetic where that is conclusive (Adam, AdaGrad, RMSProp, float32
                arrays; docs/optimizers.md, "The screen in float32"). The same rows
                are found sure either way; False screens in float64 only (to compare
                the two, as the benchmarks do).

        Returns:
            ``(ok, check, violation)``: bool (n,); the name of the first failed
            check of each row, or None; float64 (n,) largest residual-to-
            tolerance ratio (inf for a non-finite value or a negative moment).
        """
        t = check_round(t)
        self._check_state(state)
        D = state["theta"].shape[0]
        n = self._check_uploads(uploads, D)
        if recovered is not None:
            recovered = self._check_matrix(recovered, "recovered", D)
            if recovered.shape[0] != n:
                raise ValueError(f"recovered has {recovered.shape[0]} rows, the uploads {n}")
        backend = self._check_backend(backend)
        check_positive("safety", safety)
        if backend == "numpy":
            verdicts = [
                self.verify(state, {k: uploads[k][r] for k in self.arrays}, t,
                            None if recovered is None else recovered[r], safety=safety)
                for r in range(n)
            ]
            ok = np.array([v.ok for v in verdicts], dtype=bool)
            return ok, [v.check for v in verdicts], np.array([v.violation for v in verdicts])
        dtypes = [uploads[k].dtype for k in self.arrays]
        if recovered is not None:
            dtypes.append(recovered.dtype)
        u, tiny = roundoff(*dtypes)
        from rfrs_ref.kernels.optim import threads_for

        all_rows = np.arange(n, dtype=np.int64)
        with threads_for(n * D):
            sure = None
            if screen:
                sure = self._screen_numba(state, uploads, t, recovered, u, tiny, float(safety),
                                          bool(screen32))
            if sure is None:
                return _summarise(
                    self._verify_numba(state, uploads, t, recovered, u, tiny, float(safety), all_rows),
                    self.checks)
            ratios = np.zeros((n, len(self.checks)))
            unsure = all_rows[~sure]
        if unsure.size:
            with threads_for(unsure.size * D):
                ratios[unsure] = self._verify_numba(state, uploads, t, recovered, u, tiny,
                                                    float(safety), unsure)
        ok, check, violation = _summarise(ratios, self.checks)
        violation[sure] = np.nan
        return ok, check, violation

    def screen_sum_batch(
        self, state: State, uploads: Mapping[str, np.ndarray], t: int, weights: np.ndarray, *,
        safety: float = VERIFY_SAFETY, into: Mapping[str, np.ndarray] | None = None,
        screen: bool = True, screen32: bool = True,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
        """The server's one pass over the uploads for a rule with fixed weights (numba).

        Formula: ``sums[name] = Σᵢ wᵢ · uploads[name][i]`` (float64 sums rounded once to
        the uploads' dtype, rows grouped by four exactly as
        :func:`rfrs_ref.aggregate.combine.combine_rows` groups them, so the result is
        that function's bit for bit), and ``sure``, the rows the screen of
        :meth:`verify_batch` certainly passes (ĝ recovered in registers).

        Guarantee: when ``sure.all()``, every upload passes verification and ``sums`` is
        the weighted aggregate of all of them, the same bits as verifying then
        combining. Otherwise ``sums`` includes rows that may fail: the caller must
        verify exactly (:meth:`verify_batch`) and aggregate the rows that pass.

        Args:
            weights: (n,) float64 weights, every one > 0 (a rule that gives some
                client weight 0 does not have fixed weights).
            into: name -> float64 (D,) running sums to add this call's weighted rows
                into, for uploads that come in batches: batches of a multiple of four
                rows, in order (the last may be shorter), continue the grouping of one
                call over every row, so rounding ``into`` to the uploads' dtype at the
                end gives the one call's sums. The returned sums are then ``into``.
            screen: False skips the screen (every row is returned as sure): the sums
                alone, for a server that does not verify.
            screen32: as in :meth:`verify_batch` (the same sure rows either way).

        Returns ``None`` when the optimiser has no such kernel (the caller verifies,
        then aggregates). Derivation: docs/optimizers.md ("The server's one pass").
        """
        t = check_round(t)
        self._check_state(state)
        D = state["theta"].shape[0]
        n = self._check_uploads(uploads, D)
        w = np.ascontiguousarray(weights, dtype=np.float64)
        if w.shape != (n,) or not (w > 0).all():
            raise ValueError(f"screen_sum_batch needs {n} weights, every one > 0; got shape "
                             f"{w.shape} with {int((~(w > 0)).sum())} not > 0")
        check_positive("safety", safety)
        if into is not None:
            for k in self.arrays:
                a = into.get(k) if hasattr(into, "get") else None
                if not (isinstance(a, np.ndarray) and a.dtype == np.float64 and a.shape == (D,)
                        and a.flags.c_contiguous and a.flags.writeable):
                    raise ValueError(f"into[{k!r}] must be a writeable contiguous float64 array of "
                                     f"shape ({D},)")
        from rfrs_ref.kernels.distances import n_chunks
        from rfrs_ref.kernels.optim import SCREEN_SUM_BLOCK, SCREEN_SUM_ROWS, threads_for

        u, tiny = roundoff(*[uploads[k].dtype for k in self.arrays])
        acc = into if into is not None else {k: np.zeros(D) for k in self.arrays}
        parts = []
        # SCREEN_SUM_ROWS rows at a time (a multiple of four: the same sums): a block of
        # every row of a slice stays in cache between the screen and the sums
        for lo in range(0, n, SCREEN_SUM_ROWS):
            hi = min(n, lo + SCREEN_SUM_ROWS)
            with threads_for((hi - lo) * D):
                part = self._screen_sum_numba(
                    state, {k: uploads[k][lo:hi] for k in self.arrays}, t, w[lo:hi], u, tiny,
                    float(safety), acc, n_chunks(D, SCREEN_SUM_BLOCK), bool(screen),
                    bool(screen32))
            if part is None:
                return None
            parts.append(part)
        sure = np.concatenate(parts) if parts else np.ones(0, dtype=bool)
        if into is not None:
            return sure, dict(into)
        return sure, {k: acc[k].astype(uploads[k].dtype) for k in self.arrays}

    def features_verify_batch(
        self, state: State, uploads: Mapping[str, np.ndarray], t: int, out: np.ndarray,
        space: str = "gradient", backend: str = "numba", *, safety: float = VERIFY_SAFETY,
        screen32: bool = True,
    ) -> tuple[np.ndarray, list[str | None], np.ndarray]:
        """The server's one read of the uploads for a rule that compares every row: each
        upload's detection feature into ``out`` and its verification verdict.

        Formula: ``out[r]`` is the gradient recovered from upload r (``space="gradient"``,
        :meth:`recover_batch`'s values) or θᵣ − θ̄ (``space="parameter"``,
        :func:`rfrs_ref.aggregate.base.parameter_features`'s values), and the verdicts are
        those of :meth:`verify_batch` with ``screen=True`` (given the recovered gradients in
        gradient space; recovering them in float64 registers in parameter space).

        Guarantee: the same ``out``, ``ok``, ``check`` and ``violation`` as those two calls,
        bit for bit (on the numba backend one fused kernel reads each upload once, writes
        the feature and screens it; the rows the screen cannot pass go through the exact
        kernel, as in :meth:`verify_batch`). Hostile rows (NaN, ±inf, 1e38) give whatever
        feature the formula gives and fail verification as they do there.

        Args:
            out: (n, D) caller-owned buffer, float32 or float64 (the rows' features).
            space: ``"gradient"`` or ``"parameter"``.
            backend: ``"numpy"`` runs the two calls (the oracle), ``"numba"`` (and
                ``"cuda"``, on the CPU) the fused kernel.
            screen32: as in :meth:`verify_batch` (the same verdicts either way).

        Returns:
            ``(ok, check, violation)`` as :meth:`verify_batch` (a row the screen passes
            reports ``violation`` NaN, except for an optimiser whose only check is
            finiteness, whose exact ratio 0 is reported).
        """
        if space not in ("gradient", "parameter"):
            raise ValueError(f"space must be 'gradient' or 'parameter', got {space!r}")
        t = check_round(t)
        self._check_state(state)
        D = state["theta"].shape[0]
        n = self._check_uploads(uploads, D)
        out = self._check_out_matrix(out, "out", n, D)
        backend = self._check_backend(backend)
        check_positive("safety", safety)
        gradient = space == "gradient"
        from rfrs_ref.kernels.optim import threads_for

        sure = None
        if backend != "numpy" and n > 0:
            dtypes = [uploads[k].dtype for k in self.arrays] + ([out.dtype] if gradient else [])
            u, tiny = roundoff(*dtypes)
            with threads_for(n * D):
                sure = self._recover_screen_numba(state, uploads, t, out[:n], gradient, u, tiny,
                                                  float(safety), True, bool(screen32))
        if sure is None:
            if gradient:
                self.recover_batch(state, uploads, t, out, backend=backend)
            else:
                # the round's own parameter features: θ − θ̄ in the arrays' common dtype
                with np.errstate(invalid="ignore", over="ignore"):
                    np.subtract(uploads["theta"], state["theta"], out=out[:n])
            return self.verify_batch(state, uploads, t, recovered=out[:n] if gradient else None,
                                     backend=backend, safety=safety, screen=True,
                                     screen32=screen32)
        ratios = np.zeros((n, len(self.checks)))
        unsure = np.flatnonzero(~sure).astype(np.int64)
        if unsure.size:
            with threads_for(unsure.size * D):
                ratios[unsure] = self._verify_numba(state, uploads, t, out[:n] if gradient else None,
                                                    u, tiny, float(safety), unsure)
        ok, check, violation = _summarise(ratios, self.checks)
        if self.checks != ("nonfinite",):
            # as verify_batch: a row the screen passed has no ratio evaluated
            violation[sure] = np.nan
        return ok, check, violation

    # -- numba hooks (one fused kernel each) ----------------------------------------------
    @abc.abstractmethod
    def _rule_numba(self, state, grads, t, out, rows) -> None: ...

    @abc.abstractmethod
    def _recover_numba(self, state, uploads, t, out, rows) -> None: ...

    @abc.abstractmethod
    def _verify_numba(self, state, uploads, t, recovered, u, tiny, safety, rows) -> np.ndarray:
        """float64 (len(rows), len(checks)) largest ratio of each check of each listed
        row (inf: failed structurally)."""

    def _screen_sum_numba(self, state, uploads, t, w, u, tiny, safety, acc, nchunks, screen,
                          screen32=True):
        """bool (n,) sure rows, with the weighted rows added into ``acc`` (see
        :meth:`screen_sum_batch`); None when the optimiser has no such kernel."""
        return None

    def _recover_screen_numba(self, state, uploads, t, out, gradient, u, tiny, safety,
                              screen, screen32=True) -> np.ndarray | None:
        """bool (n,) rows the screen certainly passes (every row when not ``screen``),
        with each row's feature written into ``out`` (see :meth:`features_verify_batch`);
        None when the optimiser has no such kernel (the caller makes the two calls)."""
        return None

    def _screen_numba(self, state, uploads, t, recovered, u, tiny, safety,
                      screen32=True) -> np.ndarray | None:
        """bool (n,): the rows that certainly pass the exact kernel; None when the
        exact kernel is as cheap as a screen (no rule check). ``screen32`` False: the
        float64 screen alone (the same rows)."""
        return None

    # -- argument checks ------------------------------------------------------------------
    def _check_state(self, state: State) -> None:
        for k in self.arrays:
            if k not in state:
                raise KeyError(f"{self.name} state has no array {k!r}; expected {self.arrays}")
        shape = np.shape(state["theta"])
        if len(shape) != 1:
            raise ValueError(f"state 'theta' must be 1-D, got shape {shape}")
        for k in self.arrays:
            if np.shape(state[k]) != shape:
                raise ValueError(
                    f"state arrays must share one shape: 'theta' has {shape}, {k!r} has {np.shape(state[k])}")

    @staticmethod
    def _check_matrix(a, what: str, D: int) -> np.ndarray:
        a = np.asarray(a)
        if a.ndim != 2 or a.shape[1] != D:
            raise ValueError(f"{what} must have shape (n, {D}) (one row per client), got {a.shape}")
        if a.dtype not in (np.float32, np.float64):
            raise TypeError(f"{what} must be float32 or float64, got {a.dtype}")
        return a

    @staticmethod
    def _check_out_matrix(a, what: str, n: int, D: int) -> np.ndarray:
        if not isinstance(a, np.ndarray) or a.ndim != 2 or a.shape[1] != D or a.shape[0] < n:
            raise ValueError(f"{what} must be a NumPy array of shape ({n}, {D}), got "
                             f"{getattr(a, 'shape', type(a).__name__)}")
        if a.dtype not in (np.float32, np.float64):
            raise TypeError(f"{what} must be float32 or float64, got {a.dtype}")
        if not a.flags.writeable:
            raise ValueError(f"{what} is read-only")
        return a

    def _check_out(self, out: Mapping[str, np.ndarray], D: int) -> int:
        n = None
        for k in self.arrays:
            if k not in out:
                raise KeyError(f"{self.name} output has no buffer {k!r}; expected {self.arrays}")
            a = out[k]
            self._check_out_matrix(a, f"out[{k!r}]", 0, D)
            if n is None:
                n = a.shape[0]
            elif a.shape[0] != n:
                raise ValueError(f"output buffers must have the same number of rows, "
                                 f"got {n} and {a.shape[0]} ({k!r})")
        return int(n)

    def _check_uploads(self, uploads: Mapping[str, np.ndarray], D: int) -> int:
        n = None
        for k in self.arrays:
            if k not in uploads:
                raise KeyError(f"{self.name} uploads have no array {k!r}; expected {self.arrays}")
            a = self._check_matrix(uploads[k], f"uploads[{k!r}]", D)
            if n is None:
                n = a.shape[0]
            elif a.shape[0] != n:
                raise ValueError(f"upload arrays must have the same number of rows, "
                                 f"got {n} and {a.shape[0]} ({k!r})")
        return int(n)

    @staticmethod
    def _check_rows(rows, k: int, n_out: int) -> np.ndarray:
        if rows is None:
            if k > n_out:
                raise ValueError(f"{k} gradient rows do not fit in output buffers of {n_out} rows")
            return np.arange(k, dtype=np.int64)
        idx = np.asarray(rows)
        if idx.ndim != 1 or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
            raise ValueError(f"rows must be a 1-D sequence of row indices, got {rows!r}")
        idx = idx.astype(np.int64)
        if idx.size != k:
            raise ValueError(f"rows has {idx.size} entries for {k} gradient rows")
        if idx.size and (idx.min() < 0 or idx.max() >= n_out):
            raise ValueError(f"rows must lie in 0..{n_out - 1}, got min {idx.min()} max {idx.max()}")
        if np.unique(idx).size != idx.size:
            raise ValueError("rows must be distinct (each output row is written once)")
        return idx

    @staticmethod
    def _check_backend(backend: str) -> str:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; optimisers run on 'numba' or 'numpy' "
                             f"('cuda' runs the numba CPU kernels on host arrays)")
        return "numba" if backend == "cuda" else backend


def _summarise(ratios: np.ndarray, checks: tuple[str, ...]):
    """(ok, check, violation) from the (n, n_checks) ratios of a verification kernel."""
    ratios = np.where(np.isnan(ratios), np.inf, ratios)
    bad = ~(ratios <= 1.0)
    ok = ~bad.any(axis=1)
    first = np.argmax(bad, axis=1)
    check = [None if ok[r] else checks[first[r]] for r in range(ratios.shape[0])]
    violation = ratios.max(axis=1, initial=0.0)
    return ok, check, violation
