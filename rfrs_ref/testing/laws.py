"""Law checkers for docs/conformance.md, usable on any implementation.

A checker is a plain function that returns None when the law holds on one
example and raises :class:`LawViolation` (an ``AssertionError``) naming the
values when it does not. The conformance runner
(:mod:`rfrs_ref.testing.conformance`) feeds checkers with the strategies of
:mod:`rfrs_ref.testing.strategies`; a test suite can call them directly.

Aggregation checkers take ``rule(features, n_samples, f) -> Outcome`` (see
:mod:`rfrs_ref.testing.adapters`) and a :class:`RoundCase`:

- ``weights_sum_to_one``: wᵢ ≥ 0 and Σ wᵢ = 1 (docs/training.md, convex combination).
- ``finite_output``: with at most f arbitrary rows the aggregate is finite.
- ``krum_kept_bound``: every kept feature is within (n − f − 2)/(n − 2f − 2)·diam²
  (squared distance) of some honest feature, diam the honest diameter (docs/conformance.md).
- ``krum_output_bound``: the aggregate is within that squared distance of the
  convex hull of the honest features (implied by the previous law for any
  convex combination of kept features; checkable on vector-only outputs).
- ``coordinate_range``: every output coordinate lies in the honest values'
  range at that coordinate (trimmed mean, median; docs/conformance.md).
- ``bulyan_range``: [lo − w, hi + w] with w = hi − lo, Bulyan's guarantee.
- ``permutation_invariance``: reordering the clients permutes the weights and
  leaves the aggregate unchanged (rows in general position: no ties).
- ``translation_equivariance``: rule(X + c) = rule(X) + c, the shift exact in float64 (:func:`exact_shift`).
- ``unanimity``: when every honest row is the same x, the aggregate is x.
- ``reference_rule``: the output (aggregate and, when both expose them, weights) is
  rfrs-ref's rule's on the same round, ties broken by index as rfrs-ref breaks them.
- ``weighted_mean``: the mean is Σ nᵢxᵢ / Σ nᵢ (docs/training.md, the convention of
  ``mean``; a library that averages without nᵢ breaks it).
- ``mda_kept_diameter``: the kept rows' diameter is at most the honest diameter Δ.
- ``mda_output_bound``: the aggregate is within Δ of some honest feature.
- ``meamed_range``: every coordinate within max(med − lo, hi − med) of the median of all values.
- ``smea_eigen_bound``: SMEA's kept rows spread no more than the best n − f honest rows.
- ``cc_byzantine_pull``: centered clipping's Byzantine rows move the aggregate by at
  most τ·Σ_B pᵢ (one iteration).
- ``monna_pivot_bound``: with an honest pivot, the kept rows and the aggregate are within
  the farthest honest row's distance of the pivot.

Pre-aggregator checkers take ``pre(features, n_samples, f) -> (n′, D)``, a
:class:`RoundCase` and ``reference``, rfrs-ref's pre-aggregator instance:
``reference_pre`` (the rows rfrs-ref's gives; bucketing: the means of a partition
into buckets), ``nnm_honest_bound``, ``clip_norm_bound``, ``arc_clipping``,
``pre_permutation_equivariance``. Attack checkers take ``attack(vectors) -> (D,)``
and a :class:`RoundCase` whose features are the vectors: ``reference_attack``,
``ipm_direction`` (−ϵ·μ), ``alie_form`` (μ − z·σ), ``mimic_copy``, ``inf_nonfinite``,
``attack_permutation_invariance``.

Every family has ``inputs_unchanged`` (``rule_inputs_unchanged``, ``pre_inputs_unchanged``,
``attack_inputs_unchanged``, and ``inputs_unchanged`` for optimisers): the code under test,
called on the example's arrays themselves (every other law calls it on copies), leaves
them byte for byte as they were (docs/aggregation.md, docs/attacks.md, docs/optimizers.md:
inputs are never modified), and what it returns shares no memory with them; an optimiser's
uploads and recovered gradients also survive its later calls.

Optimiser checkers take an object with ``client_rule(state, g, t) -> dict``
and ``recover(state, upload, t) -> g`` and the hyperparameter attributes of
docs/optimizers.md (``lr``, ``beta1``, ``beta2``, ``beta3``, ``beta4``, ``eps``):
``recovery_exact``, ``update_rule``, ``inputs_unchanged``, ``lemma2``, ``theorem1`` (Adam), ``theorem2`` (momentum),
``theorem3`` (AdaGrad), ``theorem4`` (RMSProp), ``camouflage_same_theta``.

Tolerances: each comparison allows the rounding of the quantities it
involves (a few units in the last place of the largest magnitude, scaled by
the dtype's unit roundoff u); inequalities of real numbers are checked with
that slack, never with a loose relative factor. The magnitudes come from the
reference side (the honest rows, the drawn inputs, rfrs-ref's own rule on the
same inputs), never from what the implementation under test returned, and a
NaN or infinite value where the reference is finite always violates the law
(:mod:`rfrs_ref.agreement`).

Types and shapes: what the implementation returns is checked before any value
is compared, and never converted into the convention first. An aggregate is a
real (float or integer dtype) array of shape exactly (D,), weights exactly (n,),
a recovered gradient exactly (D,); an upload holds θ (and m, v or r) as float32
or float64 arrays of shape exactly (D,), the dtypes rfrs-ref stores and whose
rounding the tolerances are derived for. A complex, string, object or boolean
array, another shape, or an upload in another dtype violates the law being
checked: converting first would drop an imaginary part, parse strings, flatten
(1, D, 1) into (D,) or let a float16 upload set its own, wider, tolerance.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from rfrs_ref import agreement
from rfrs_ref.testing.adapters import Outcome, OutputError, real_array, weighted_vector
from rfrs_ref.testing.strategies import GradientSequence, PairCase, RoundCase, unanimous

U64 = 2.0**-53
#: what a law returns when the example left it nothing to compare: for a law that compares
#: the candidate with itself (two orders of the rows, a shifted round), the candidate's
#: output was non-finite at every coordinate where rfrs-ref's is finite (a non-finite value
#: agrees with itself in any order and after any shift), or the shift could not be applied
#: exactly (translation_equivariance); for camouflage_same_theta, the attack applied at no
#: coordinate. The runner reports a law that compared nothing on every example as skipped,
#: never as holding (a rule returning NaN everywhere held permutation_invariance and
#: translation_equivariance; every attack held camouflage_same_theta under β₁ = 0)
NOT_COMPARED = "not compared"


def _compared(expected, *outputs) -> bool:
    """Whether some coordinate where ``expected`` (rfrs-ref's output on the example) is
    finite has every one of ``outputs`` (the candidate's) finite too, so that a law comparing
    them compared a finite value; True when ``expected`` is None (no reference to tell)."""
    if expected is None:
        return True
    fin = np.isfinite(np.asarray(expected, dtype=np.float64))
    for out in outputs:
        fin &= np.isfinite(np.asarray(out, dtype=np.float64))
    return bool(fin.any())
TINY = float(np.finfo(np.float64).smallest_subnormal)


class LawViolation(AssertionError):
    """A law failed on one example.

    Attributes:
        law: the law's name.
        message: what failed, with the values.
        details: JSON-friendly values (indices, both sides, the bound).
        example: the input the law gave the code under test when it is not the example
            drawn (unanimity replaces the honest rows): the counterexample to report.
            None: the drawn example.
    """

    def __init__(self, law: str, message: str, *, example: Any = None, **details: Any) -> None:
        self.law = law
        self.message = message
        self.details = details
        self.example = example
        super().__init__(f"{law}: {message}")


def _r(x) -> str:
    """A number as Python writes a float (no NumPy scalar wrapper)."""
    return repr(float(x))


def _u(dtype) -> float:
    dt = np.dtype(dtype)
    return float(np.finfo(dt if np.issubdtype(dt, np.floating) else np.float64).eps) / 2.0


def nrm(x) -> float:
    """Euclidean norm, scaled like BLAS nrm2 so that squares neither underflow nor overflow."""
    a = np.abs(np.asarray(x, dtype=np.float64))
    s = float(a.max(initial=0.0))
    if s == 0.0 or not np.isfinite(s):
        return s
    return s * float(np.sqrt(np.sum((a / s) ** 2)))


def _real(law: str, value, shape, what: str, meaning: str = "", dtypes=None) -> np.ndarray:
    """:func:`~rfrs_ref.testing.adapters.real_array` as float64, with a mismatch as a
    violation of ``law``: a complex, string, object or boolean array, or one of another
    shape, is the implementation's failure, reported with the example, not a crash."""
    try:
        return real_array(value, shape, what, meaning, dtypes=dtypes).astype(np.float64)
    except OutputError as exc:
        raise LawViolation(law, str(exc), **exc.details) from None


def _outcome(rule, X, ns, f, law) -> Outcome:
    """The rule's Outcome on copies of X and ns, its vector a real (D,) array and its
    weights None or a real (n,) array, both float64.

    The rule gets copies: the laws judge its output against the example's rows, and a
    rule that overwrote its input (every row set to its own output) would make any
    output lie "within the honest range" of what is left. The arrays are checked
    here too, not only in the adapters, because a rule written directly against this
    convention builds its Outcome itself.
    """
    try:
        out = rule(np.array(X, copy=True), np.array(ns, copy=True), f)
    except OutputError as exc:  # what an adapter found wrong in the output
        raise LawViolation(law, str(exc), **exc.details) from None
    if not isinstance(out, Outcome):
        raise LawViolation(law, f"the adapted rule returned {type(out).__name__}, not an Outcome")
    n, D = np.shape(X)
    vector = _real(law, out.vector, (D,), "the rule", "the aggregated feature vector")
    weights = (None if out.weights is None
               else _real(law, out.weights, (n,), "the rule", "one weight per client"))
    return Outcome(vector, weights)


def _honest_scale(case: RoundCase) -> float:
    H = case.features[case.honest].astype(np.float64)
    return float(np.abs(H).max(initial=0.0))


# -- aggregation laws -----------------------------------------------------------------------------

def weights_sum_to_one(rule, case: RoundCase) -> None:
    """wᵢ ≥ 0, finite, Σ wᵢ = 1 within n·64·u (float64 weights)."""
    out = _outcome(rule, case.features, case.n_samples, case.f, "weights_sum_to_one")
    w = out.weights
    if w is None:
        raise LawViolation("weights_sum_to_one", "the rule exposes no weights")
    if not np.isfinite(w).all():
        i = int(np.flatnonzero(~np.isfinite(w))[0])
        raise LawViolation("weights_sum_to_one", f"weight {i} is {w[i]}", index=i, weight=float(w[i]))
    if (w < 0).any():
        i = int(np.argmin(w))
        raise LawViolation("weights_sum_to_one", f"weight {i} is negative: {_r(w[i])}", index=i,
                           weight=float(w[i]))
    s = float(np.sum(w))
    if abs(s - 1.0) > 64 * U64 * max(1, w.size):
        raise LawViolation("weights_sum_to_one", f"the weights sum to {_r(s)}, not 1", sum=s)


def finite_output(rule, case: RoundCase) -> None:
    """With at most f arbitrary rows (some non-finite or 1e38), the aggregate is finite."""
    out = _outcome(rule, case.features, case.n_samples, case.f, "finite_output")
    bad = np.flatnonzero(~np.isfinite(out.vector))
    if bad.size:
        raise LawViolation("finite_output",
                           f"aggregate coordinate {int(bad[0])} is {out.vector[bad[0]]} with "
                           f"{int((~case.honest).sum())} Byzantine rows and f={case.f}",
                           coordinate=int(bad[0]), value=str(out.vector[bad[0]]))


def _krum_bound(case: RoundCase) -> tuple[float, np.ndarray]:
    n, f = case.n, case.f
    H = case.features[case.honest].astype(np.float64)
    diff = H[:, None, :] - H[None, :, :]
    diam2 = float(np.einsum("ijk,ijk->ij", diff, diff).max(initial=0.0))
    return (n - f - 2) / (n - 2 * f - 2) * diam2, H


def _rounding_radius(case: RoundCase) -> float:
    """How far rounding may move a point, in Euclidean norm: 4u of the dtype per coordinate
    of the honest magnitude (a weighted mean stored in the features' dtype)."""
    return 4 * _u(case.features.dtype) * _honest_scale(case) * math.sqrt(case.D)


def krum_kept_bound(rule, case: RoundCase) -> str | None:
    """Every kept row (wᵢ > 0) is within (n − f − 2)/(n − 2f − 2)·diam² of some honest row
    (:data:`NOT_COMPARED` where n ≤ 2f + 2: the bound's precondition)."""
    law = "krum_kept_bound"
    if not case.n > 2 * case.f + 2:
        return NOT_COMPARED
    out = _outcome(rule, case.features, case.n_samples, case.f, law)
    if out.weights is None:
        raise LawViolation(law, "the rule exposes no weights (use krum_output_bound)")
    bound, H = _krum_bound(case)
    X = case.features.astype(np.float64)
    for i in np.flatnonzero(~(out.weights <= 0)):  # a NaN weight counts as kept
        if not np.isfinite(X[i]).all():
            raise LawViolation(law, f"client {int(i)} holds a non-finite feature and has weight "
                               f"{_r(out.weights[i])}", client=int(i))
        with np.errstate(over="ignore"):
            d2 = float(np.min(np.sum((H - X[i]) ** 2, axis=1)))
        if not d2 <= bound * (1 + 1e-9) + TINY:
            raise LawViolation(law, f"kept client {int(i)} is at squared distance {_r(d2)} from the "
                               f"nearest honest feature; the bound is {_r(bound)} "
                               f"((n − f − 2)/(n − 2f − 2)·diam², n={case.n}, f={case.f})",
                               client=int(i), distance2=d2, bound=bound)


def hull_distance(z: np.ndarray, H: np.ndarray) -> float:
    """Euclidean distance from z to the convex hull of the rows of H (an upper
    bound within ~1e-10 relative: non-negative least squares with the sum-to-one
    constraint as a heavily weighted row)."""
    from scipy.optimize import nnls

    z = np.asarray(z, dtype=np.float64)
    H = np.asarray(H, dtype=np.float64)
    c = H.mean(axis=0)
    A, b = (H - c).T, z - c
    scale = max(float(np.abs(A).max(initial=0.0)), float(np.abs(b).max(initial=0.0)), 1e-300)
    M = 1e6 * scale
    lam, _ = nnls(np.vstack([A, M * np.ones((1, H.shape[0]))]), np.concatenate([b, [M]]),
                  maxiter=50 * H.shape[0])
    s = lam.sum()
    lam = lam / s if s > 0 else np.full(H.shape[0], 1.0 / H.shape[0])
    return float(np.linalg.norm(lam @ H - z))


def krum_output_bound(rule, case: RoundCase) -> str | None:
    """The aggregate is within squared distance (n − f − 2)/(n − 2f − 2)·diam² of the
    honest features' convex hull (each kept row is, and the distance to a convex set
    is convex); :data:`NOT_COMPARED` where n ≤ 2f + 2 (the bound's precondition)."""
    law = "krum_output_bound"
    if not case.n > 2 * case.f + 2:
        return NOT_COMPARED
    out = _outcome(rule, case.features, case.n_samples, case.f, law)
    z = out.vector
    if not np.isfinite(z).all():
        raise LawViolation(law, f"the aggregate is not finite: {z.tolist()}")
    bound, H = _krum_bound(case)
    slack = _rounding_radius(case)
    d_point = float(np.sqrt(np.min(np.sum((H - z) ** 2, axis=1))))
    if d_point <= math.sqrt(bound) * (1 + 1e-9) + slack:
        return
    d = hull_distance(z, H)
    if not d <= math.sqrt(bound) * (1 + 1e-6) + slack:
        raise LawViolation(law, f"the aggregate is at distance {_r(d)} from the honest features' "
                           f"convex hull; the bound is √{_r(bound)} = {_r(math.sqrt(bound))} "
                           f"(n={case.n}, f={case.f})", distance=d, bound=math.sqrt(bound))


def _range_check(law, case: RoundCase, widen: bool, rule) -> None:
    out = _outcome(rule, case.features, case.n_samples, case.f, law)
    H = case.features[case.honest].astype(np.float64)
    lo, hi = H.min(axis=0), H.max(axis=0)
    w = (hi - lo) if widen else 0.0
    slack = 4 * _u(case.features.dtype) * np.maximum(np.abs(lo), np.abs(hi)) + TINY
    z = out.vector
    ok = (z >= lo - w - slack) & (z <= hi + w + slack)
    if not ok.all():
        k = int(np.flatnonzero(~ok)[0])
        where = "[lo − w, hi + w]" if widen else "[lo, hi]"
        lo_k = float(lo[k] - (w[k] if widen else 0.0))
        hi_k = float(hi[k] + (w[k] if widen else 0.0))
        raise LawViolation(law, f"coordinate {k} is {_r(z[k])}, outside the honest range {where} = "
                           f"[{_r(lo_k)}, {_r(hi_k)}]", coordinate=k, value=float(z[k]), lo=lo_k, hi=hi_k)


def coordinate_range(rule, case: RoundCase) -> None:
    """Every aggregated coordinate lies within the honest values' range there."""
    _range_check("coordinate_range", case, False, rule)


def bulyan_range(rule, case: RoundCase) -> None:
    """Every aggregated coordinate lies in [lo − w, hi + w], w = hi − lo (Bulyan keeps
    the values closest to its selection's median, which lies in the honest range)."""
    _range_check("bulyan_range", case, True, rule)


def _vectors_close(reference, candidate, scale, u, rtol_extra=0.0, atol=0.0) -> np.ndarray:
    """Elementwise agreement of ``candidate`` with ``reference`` (:mod:`rfrs_ref.agreement`):
    within 64u·scale + rtol_extra·scale + atol, ``scale`` taken from the reference side;
    a non-finite candidate never matches a finite reference."""
    tol = 64 * u * scale + rtol_extra * scale + atol + TINY
    return ~agreement.disagree(reference, candidate, 0.0, tol)


def _reference_scale(case: RoundCase, R: Outcome | None) -> float | np.ndarray:
    """The magnitude the rounding of an aggregate is measured against, from the inputs and
    rfrs-ref's outcome ``R`` on them only (never from the candidate's output): per
    coordinate k, the largest of the honest rows' largest |x|, ``R``'s aggregate at k
    (where finite) and Σᵢ wᵢ|xᵢₖ|, w ``R``'s weights normalised to sum 1, over the finite
    rows it combines (wᵢ > 0). Each row counts by its weight: a row at 1e38 that centered
    clipping or RFA keeps with a weight of 1e-36 adds about 100 to the sum, not 1e38. And
    each coordinate by its own magnitudes: a Byzantine 1e38 at one coordinate makes the
    mean about 1e37 there, and measured at every coordinate it let a mean off by 1 at all
    the others hold. Without ``R``, the honest rows' largest |x| (a float)."""
    scale = _honest_scale(case)
    if R is None:
        return scale
    fin = np.isfinite(R.vector)
    out = np.maximum(scale, np.where(fin, np.abs(R.vector), 0.0))
    if R.weights is not None:
        X = case.features.astype(np.float64)
        rows = ~(R.weights <= 0) & np.isfinite(X).all(axis=1) & np.isfinite(R.weights)
        w = np.abs(R.weights[rows])
        if w.sum() > 0:
            w = w / w.sum()
            out = np.maximum(out, w @ np.abs(X[rows]))
    return out


def permutation_invariance(rule, case: RoundCase, rtol: float = 0.0, reference=None):
    """rule(X[π], n[π], f) = rule(X, n, f), and its weights are the permuted weights.

    The aggregates are compared within 64u·s + rtol·s, s from the inputs and ``reference``
    (rfrs-ref's rule, as the runner passes it; :func:`_reference_scale`): per coordinate,
    the largest |x| among the honest rows, rfrs-ref's aggregate and the rows it combines;
    without a reference, the honest rows'. Never from the candidate's output: a median shifted by
    1e13 had a tolerance of 0.07 and hid an aggregate that moved with the order of the rows."""
    law = "permutation_invariance"
    a = _outcome(rule, case.features, case.n_samples, case.f, law)
    p = case.perm
    b = _outcome(rule, case.features[p], case.n_samples[p], case.f, law)
    R = (None if reference is None
         else _outcome(reference, case.features, case.n_samples, case.f, law))
    scale = _reference_scale(case, R)
    ok = _vectors_close(a.vector, b.vector, scale, _u(case.features.dtype), rtol)
    if not ok.all():
        k = int(np.flatnonzero(~ok)[0])
        raise LawViolation(law, f"coordinate {k}: {_r(a.vector[k])} in the original order, "
                           f"{_r(b.vector[k])} with the rows permuted by {p.tolist()}",
                           coordinate=k, original=float(a.vector[k]), permuted=float(b.vector[k]),
                           permutation=p.tolist())
    if a.weights is not None and b.weights is not None:
        ok = _vectors_close(a.weights[p], b.weights, 1.0, U64, rtol)
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            raise LawViolation(law, f"client {int(p[i])} has weight {_r(a.weights[p[i]])} in the "
                               f"original order and {_r(b.weights[i])} when permuted",
                               client=int(p[i]))
    if not _compared(None if R is None else R.vector, a.vector, b.vector):
        return NOT_COMPARED
    return None


#: significant bits the translation law keeps of each shift cₖ: every finite entry up to
#: 2^(52 − SHIFT_BITS)·|cₖ| is then shifted exactly (docs/conformance.md)
SHIFT_BITS = 12


def exact_shift(X, c, bits: int = SHIFT_BITS):
    """Rows ``A`` close to ``X`` and a shift ``c′`` close to ``c`` such that ``A + c′`` is
    exact in float64 wherever it can be: the pair the translation law compares.

    X + c in float64 rounds each entry by up to half an ulp of |x + c|, and rounding can
    make two distinct values equal (1e-33 and −7e-34 both become c): a rule that ranks
    the values then breaks the new tie by index and keeps another client, whose nᵢ weighs
    differently, and rule(X + c) moves by a fraction of the kept values' spread, not by a
    rounding. No tolerance covers that, so the law shifts exactly instead: cₖ is rounded
    to ``bits`` significant bits (a multiple of 2^(eₖ − bits), |cₖ| < 2^eₖ), and every
    finite entry x with |x| < 2^E, E = max(e_x, eₖ) ≤ eₖ + 52 − bits, is rounded to a
    multiple of Q = 2^(E − 52): x′ and c′ are then multiples of Q with |x′ + c′| ≤ 2^(E + 1)
    = 2^53·Q, so x′ + c′ is a float64. The rounding of x is at most 2^(E − 53): x's last
    bit when |x| ≥ |c|, and below |c|·2^-52 (what x + c would lose anyway) when smaller.

    Returns (A, B, c′, exact): B = A + c′ as float64, and ``exact`` (n, D) True where that
    sum is exact (every finite entry but those beyond 2^(eₖ + 52 − bits), such as a
    Byzantine 1e30 beside a shift of 1; non-finite entries are True: NaN and ±inf shift to
    themselves).
    """
    X = np.asarray(X, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    _, ec = np.frexp(c)
    cq = np.where(c == 0.0, 0.0, np.ldexp(np.round(np.ldexp(c, bits - ec)), ec - bits))
    fin = np.isfinite(X)
    _, ex = np.frexp(np.where(fin, X, 0.0))
    ex = np.where(X == 0.0, ec[None, :], ex)  # 0 + c is c: exact whatever c
    E = np.maximum(ex, ec[None, :])
    exact = ~fin | (cq[None, :] == 0.0) | (E <= ec[None, :] + 52 - bits)
    shiftable = fin & exact & (cq[None, :] != 0.0)  # a zero shift leaves the rows as they are
    q_exp = np.maximum(E - 52, -1074)  # Q a power of two, never below the smallest subnormal
    A = X.copy()
    A[shiftable] = np.ldexp(np.round(np.ldexp(X[shiftable], -q_exp[shiftable])), q_exp[shiftable])
    with np.errstate(all="ignore"):
        B = A + cq
    return A, B, cq, exact


def _order_kept(A, B) -> bool:
    """Whether every column of ``B`` orders its finite entries as ``A``'s does, ties
    included (sign(Bᵢ − Bⱼ) = sign(Aᵢ − Aⱼ) for every pair finite in both)."""
    fin = np.isfinite(A) & np.isfinite(B)
    with np.errstate(all="ignore"):
        sa = np.sign(A[:, None, :] - A[None, :, :])
        sb = np.sign(B[:, None, :] - B[None, :, :])
    both = fin[:, None, :] & fin[None, :, :]
    return bool((sa[both] == sb[both]).all())


def translation_equivariance(rule, case: RoundCase, rtol: float = 0.0, reference=None):
    """rule(A + c′) = rule(A) + c′ with A + c′ exact in float64 (:func:`exact_shift`: the
    example's rows and shift rounded so that the shift does not round; features as float64).

    A shift that rounds may reorder near-ties and change which clients a rule keeps, so
    the law compares exact shifts only: an entry too large for c′ to be added exactly
    (|x| > 2^(52 − SHIFT_BITS)·|c|) is shifted with rounding, and an example where that
    rounding changed the order of some column's values (made or broke a tie) compares
    nothing: :data:`NOT_COMPARED`. With ``reference`` (rfrs-ref's rule, as the runner
    passes it), so does an example where both aggregates are non-finite at every
    coordinate where rfrs-ref's aggregate of A is finite. A violation reports the rows
    and shift the rule was given (A, c′)."""
    law = "translation_equivariance"
    A, B, c, exact = exact_shift(case.features, case.shift)
    if not exact.all() and not _order_kept(A, B):
        return NOT_COMPARED
    src = case.source and (f"rfrs_ref.testing.laws.exact_shift({case.source}.features, "
                           f"{case.source}.shift)")
    given = dataclasses.replace(case, features=A, shift=c, source=src and (
        f"dataclasses.replace({case.source}, features={src}[0], shift={src}[2])"))
    a = _outcome(rule, A, case.n_samples, case.f, law)
    b = _outcome(rule, B, case.n_samples, case.f, law)
    scale = _honest_scale(given) + float(np.abs(c).max(initial=0.0))
    with np.errstate(all="ignore"):
        expected = a.vector + c
    ok = _vectors_close(expected, b.vector, scale, U64, rtol)
    if not ok.all():
        k = int(np.flatnonzero(~ok)[0])
        raise LawViolation(law, f"coordinate {k}: rule(X) + c = {_r(expected[k])} but rule(X + c) = "
                           f"{_r(b.vector[k])} (c = {_r(c[k])})", example=given, coordinate=k,
                           expected=float(expected[k]), got=float(b.vector[k]))
    if reference is not None:
        R = _outcome(reference, A, case.n_samples, case.f, law)
        if not _compared(R.vector, a.vector, b.vector):
            return NOT_COMPARED
    return None


def unanimity(rule, case: RoundCase, rtol: float = 0.0, atol: float = 0.0) -> None:
    """With every honest row equal to x (and at most f other rows), the aggregate is x
    (within 64u·|x| + rtol·|x| + atol)."""
    law = "unanimity"
    u_case = unanimous(case)
    x = u_case.features[np.flatnonzero(u_case.honest)[0]].astype(np.float64)
    out = _outcome(rule, u_case.features, u_case.n_samples, u_case.f, law)
    ok = _vectors_close(x, out.vector, float(np.abs(x).max(initial=0.0)), _u(case.features.dtype), rtol,
                        atol)
    if not ok.all():
        k = int(np.flatnonzero(~ok)[0])
        raise LawViolation(law, f"every honest client sends x, but coordinate {k} of the aggregate "
                           f"is {_r(out.vector[k])}, not {_r(x[k])}", example=u_case, coordinate=k,
                           expected=float(x[k]), got=float(out.vector[k]))


def weighted_mean(rule, case: RoundCase) -> None:
    """The aggregate is Σ nᵢxᵢ / Σ nᵢ (the ``mean`` rule's convention, docs/training.md)."""
    law = "weighted_mean"
    out = _outcome(rule, case.features, case.n_samples, case.f, law)
    X = case.features.astype(np.float64)
    w = case.n_samples.astype(np.float64)
    expected = (w @ X) / w.sum()
    ok = _vectors_close(expected, out.vector, float(np.abs(X).max(initial=0.0)), _u(case.features.dtype))
    if not ok.all():
        k = int(np.flatnonzero(~ok)[0])
        raise LawViolation(law, f"coordinate {k} is {_r(out.vector[k])}; Σ nᵢxᵢ/Σ nᵢ = {_r(expected[k])} "
                           f"(nᵢ = {case.n_samples.tolist()})", coordinate=k,
                           expected=float(expected[k]), got=float(out.vector[k]))


def _top_eigenvalue(D2: np.ndarray) -> float:
    """λ_max of the plain covariance of the rows whose squared distances are ``D2``
    (rfrs-ref's SMEA objective, :mod:`rfrs_ref.aggregate.spectral`)."""
    from rfrs_ref.aggregate.spectral import centred_products, top_eigen

    c = np.ones(D2.shape[0])
    return top_eigen(centred_products(D2, c), c)[0]


def _smea_tied_subsets(case: RoundCase) -> list[np.ndarray]:
    """The subsets of n − f finite rows whose SMEA objective is within rounding of the
    smallest, 64·n·u·(max D2 over the subset + max D2 over the smallest's) (u of the
    features' dtype: each eigenvalue is computed from its own subset's squared distances,
    so a row at 1e38 outside both allows nothing: with max D2 over every finite row it
    tied every subset of the other rows), in ``itertools.combinations`` order; none where
    the finite rows are too few to choose among."""
    import itertools

    X = case.features.astype(np.float64)
    fin = np.flatnonzero(np.isfinite(X).all(axis=1))
    k = case.n - case.f
    if fin.size <= k or k < 1:
        return []
    F = X[fin]
    diff = F[:, None, :] - F[None, :, :]
    with np.errstate(over="ignore", invalid="ignore"):
        D2 = np.einsum("ijk,ijk->ij", diff, diff)
    if not np.isfinite(D2).all():
        return []
    subsets = [np.array(S) for S in itertools.combinations(range(fin.size), k)]
    lams = np.array([_top_eigenvalue(D2[np.ix_(S, S)]) for S in subsets])
    spans = np.array([float(D2[np.ix_(S, S)].max(initial=0.0)) for S in subsets])
    best = int(np.argmin(lams))
    tol = 64 * case.n * _u(case.features.dtype) * (spans + spans[best]) + TINY
    return [fin[S] for S, lam, t in zip(subsets, lams, tol) if lam <= lams[best] + t]


def _inherited_nonfinite(reference: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per coordinate: whether ``reference`` (a row the reference computed from ``rows``,
    the rows it combines) is non-finite there because one of those rows is (NaN or ±inf
    at that coordinate). A non-finite reference coordinate whose rows are all finite there
    is an overflow of the reference's own arithmetic, not inherited."""
    R = np.asarray(reference, dtype=np.float64)
    A = np.asarray(rows, dtype=np.float64).reshape(-1, R.shape[0])
    return ~np.isfinite(R) & (~np.isfinite(A)).any(axis=0)


def _first_mismatch(R: np.ndarray, got: np.ndarray, tol, inherited: np.ndarray) -> int | None:
    """The first coordinate where ``got`` does not match the reference ``R``: where R is
    finite, within ``tol`` (a non-finite ``got`` never matches); where R is non-finite
    because a row it combines is (``inherited``), ``got`` must be non-finite too (NaN or
    ±inf: which one can depend on the order of the arithmetic: a running mean turns +inf
    then a finite row into NaN where a sum gives +inf); where R overflowed from finite rows,
    nothing (the reference has no value there, and a more careful candidate may be finite)."""
    fin = np.isfinite(R)
    bad = (fin & agreement.disagree(R, got, 0.0, tol)) | (inherited & np.isfinite(got))
    return int(np.flatnonzero(bad)[0]) if bad.any() else None


def _reference_mismatch(R: Outcome, C: Outcome, case: RoundCase, spread_rtol: float,
                        compare_weights: bool, gain: float = 1.0) -> LawViolation | None:
    law = "reference_rule"
    u = gain * _u(case.features.dtype)
    X = case.features.astype(np.float64)
    fin_R = np.isfinite(R.vector)
    scale = _reference_scale(case, R)
    combined = np.ones(case.n, dtype=bool) if R.weights is None else ~(R.weights <= 0)
    inherited = _inherited_nonfinite(R.vector, X[combined])
    H = X[case.honest][:, fin_R]
    r = (float(np.sqrt(np.max(np.sum((H - R.vector[fin_R]) ** 2, axis=1), initial=0.0)))
         if H.size else 0.0)
    tol = np.broadcast_to(64 * u * scale + spread_rtol * r + TINY, R.vector.shape)

    def mismatch(got: np.ndarray, what: str) -> LawViolation | None:
        k = _first_mismatch(R.vector, got, tol, inherited)
        if k is None:
            return None
        if inherited[k]:
            rows_k = [int(i) for i in np.flatnonzero(combined & ~np.isfinite(X[:, k]))]
            return LawViolation(law, f"{what}coordinate {k} is {_r(got[k])}; rfrs-ref's rule gives "
                                f"{_r(R.vector[k])}: row(s) {rows_k} that it combines are non-finite "
                                "there, and a finite aggregate hides them", coordinate=k,
                                expected=str(R.vector[k]), got=str(got[k]), rows=rows_k)
        return LawViolation(law, f"{what}coordinate {k} is {_r(got[k])}; rfrs-ref's rule gives "
                            f"{_r(R.vector[k])} (tolerance {_r(tol[k])})", coordinate=k,
                            expected=float(R.vector[k]), got=float(got[k]), tolerance=float(tol[k]))

    v = mismatch(C.vector, "")
    if v is not None:
        return v
    if not compare_weights and C.weights is not None:
        # weights not compared one by one (RFA's move with where its iteration stops) still
        # combine the uploads: the aggregate they give, Σ wᵢxᵢ over wᵢ ≠ 0, is held to the
        # aggregate's tolerance (a geometric median reported with the mean's weights would
        # hand the round the mean of the uploads)
        implied = weighted_vector(X, C.weights)
        v = mismatch(implied, "Σ wᵢxᵢ ")
        if v is not None:
            k = v.details["coordinate"]
            return LawViolation(law, f"the candidate's weights give Σ wᵢxᵢ = {_r(implied[k])} at "
                                f"coordinate {k}, where its aggregate is {_r(C.vector[k])} and rfrs-ref's "
                                f"rule gives {_r(R.vector[k])} (tolerance {_r(tol[k])}): the weights combine "
                                "every uploaded array, so they must give the aggregate", **v.details)
    if compare_weights and R.weights is not None and C.weights is not None:
        ok = _vectors_close(R.weights, C.weights, 1.0, u)
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            return LawViolation(law, f"client {i} has weight {_r(C.weights[i])}; rfrs-ref's rule gives "
                                f"{_r(R.weights[i])} (kept by rfrs-ref: "
                                f"{np.flatnonzero(R.weights > 0).tolist()}, by the candidate: "
                                f"{np.flatnonzero(~(C.weights <= 0)).tolist()})", client=i,
                                expected=float(R.weights[i]), got=float(C.weights[i]))
    return None


def _gm_excess(z: np.ndarray, R: np.ndarray, case: RoundCase) -> tuple[float, float]:
    """(Σᵢ nᵢ(‖z − xᵢ‖ − ‖R − xᵢ‖) over the finite rows, its rounding slack), float64.

    Each term is computed as (z − R)·(z + R − 2xᵢ)/(‖z − xᵢ‖ + ‖R − xᵢ‖), which keeps its
    accuracy where ‖z − xᵢ‖ is huge (a row at 1e38): the difference of the two objectives,
    each about 1e38 there, lost every digit of it. The slack is 64u·Σnᵢ·(‖z − R‖ + ‖R‖),
    u of the features' dtype: the rounding of those terms and of an aggregate stored in
    that dtype (the objective is Σnᵢ-Lipschitz)."""
    X = case.features.astype(np.float64)
    fin = np.isfinite(X).all(axis=1)
    F, ns = X[fin], case.n_samples[fin].astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        num = (z - R)[None, :] * (z + R - 2.0 * F)
        den = np.sqrt(np.sum((F - z) ** 2, axis=1)) + np.sqrt(np.sum((F - R) ** 2, axis=1))
        terms = np.where(den > 0, num.sum(axis=1) / np.where(den > 0, den, 1.0), 0.0)
    excess = float(ns @ terms)
    slack = 64 * _u(case.features.dtype) * float(ns.sum()) * (nrm(z - R) + nrm(R)) + TINY
    return excess, slack


def _at_least_as_near_the_median(R: Outcome, C: Outcome, case: RoundCase) -> bool:
    """Whether the candidate's aggregate, and the one its weights give, are at least as
    near the nᵢ-weighted geometric median as rfrs-ref's in objective, to rounding
    (:func:`_gm_excess`): RFA stops its Weiszfeld steps at a tolerance, and near a data
    point they converge so slowly that a correct implementation run further stops farther
    than the spread allowance from rfrs-ref's iterate, but always with a smaller objective."""
    if not np.isfinite(R.vector).all():
        return False
    outs = [C.vector] + ([] if C.weights is None else
                         [weighted_vector(case.features.astype(np.float64), C.weights)])
    for v in outs:
        if not np.isfinite(v).all():
            return False
        excess, slack = _gm_excess(v, R.vector, case)
        if not excess <= slack:
            return False
    return True


def reference_rule(rule, case: RoundCase, reference, spread_rtol: float = 0.0,
                   compare_weights: bool = True, tied_subsets: bool = False,
                   skip_copies: bool = False, gain: float = 1.0,
                   nearer_median: bool = False) -> str | None:
    """The candidate gives rfrs-ref's rule's output on the same round (``reference``, e.g.
    ``adapters.rfrs("krum")``): the aggregate within 64u·s + spread_rtol·r per coordinate,
    u of the features' dtype, s the largest magnitude among the reference's aggregate,
    the honest rows and the finite rows the reference weights, r the largest distance
    from the reference's aggregate to an honest row (an iterative rule's stopping
    tolerance is relative to that spread); when both expose weights, every weight within
    64u of the reference's. Every magnitude is the reference's (its finite coordinates).
    Where the reference's aggregate is not finite at a coordinate because a row it combines
    (wᵢ > 0; every row for a reference without weights) is NaN or ±inf there, the
    candidate's must be non-finite there too, NaN or ±inf (which one can depend on the
    order of the arithmetic): a finite value there hides a hostile row, as a mean that
    drops NaN rows does. Where the reference overflowed from finite rows (float32 sums
    near 3.4e38) it has no value to compare with and a more careful candidate may be
    finite: that coordinate is not compared (the other laws still judge it). Ties (equal
    values, distances, scores) go as the reference breaks them, by index
    (docs/aggregation.md).

    ``tied_subsets`` (SMEA): subsets of equal objective (copied rows) tie only to
    rounding, and which one is first depends on it, so the candidate also holds when it
    is the nᵢ-weighted mean (and weights) of another subset of n − f finite rows whose
    largest covariance eigenvalue is within 64·n·u·max D2 of the smallest.
    ``skip_copies`` (CAF): with two equal finite rows the filter's steps hinge on the
    rounding of equal τ (1 − τᵢ/max τ is 0 or a rounding-sized weight that keeps the
    filter going one more step), so on such rounds the law says nothing.
    ``nearer_median`` (RFA): an aggregate outside the allowance still holds when it, and
    the aggregate its weights give, are at least as near the geometric median in
    objective, Σᵢ nᵢ‖z − xᵢ‖ over the finite rows, as the reference's (to 64u of it)."""
    law = "reference_rule"
    if skip_copies:
        X = case.features
        fin = X[np.isfinite(X).all(axis=1)]
        if len({row.tobytes() for row in fin}) < fin.shape[0]:
            return NOT_COMPARED
    R = _outcome(reference, case.features, case.n_samples, case.f, law)
    C = _outcome(rule, case.features, case.n_samples, case.f, law)
    v = _reference_mismatch(R, C, case, spread_rtol, compare_weights, gain)
    if v is None:
        return
    if nearer_median and _at_least_as_near_the_median(R, C, case):
        return
    if tied_subsets:
        ns = case.n_samples.astype(np.float64)
        X = case.features.astype(np.float64)
        for S in _smea_tied_subsets(case):
            w = np.zeros(case.n)
            w[S] = ns[S]
            w /= w.sum()
            alt = Outcome(w @ np.where(w[:, None] > 0, X, 0.0), w)
            if _reference_mismatch(alt, C, case, spread_rtol, compare_weights, gain) is None:
                return
    raise v


def _honest_sq_diameter(case: RoundCase) -> tuple[float, np.ndarray]:
    H = case.features[case.honest].astype(np.float64)
    diff = H[:, None, :] - H[None, :, :]
    return float(np.einsum("ijk,ijk->ij", diff, diff).max(initial=0.0)), H


def mda_kept_diameter(rule, case: RoundCase) -> None:
    """The kept rows (wᵢ > 0) are n − f finite rows and their diameter is at most the
    honest diameter Δ (some n − f honest rows form a subset of diameter ≤ Δ, so the
    smallest-diameter subset is no wider). Fewer rows make a smaller diameter, so the
    count is part of the law: a rule keeping one row, or none, held it on every round."""
    law = "mda_kept_diameter"
    out = _outcome(rule, case.features, case.n_samples, case.f, law)
    if out.weights is None:
        raise LawViolation(law, "the rule exposes no weights (use mda_output_bound)")
    delta2, _ = _honest_sq_diameter(case)
    X = case.features.astype(np.float64)
    kept = np.flatnonzero(~(out.weights <= 0))  # a NaN weight counts as kept
    if kept.size != case.n - case.f:
        raise LawViolation(law, f"{kept.size} rows kept ({kept.tolist()}); MDA keeps n − f = "
                           f"{case.n - case.f} (n={case.n}, f={case.f})", kept=kept.tolist(),
                           expected=case.n - case.f)
    for i in kept:
        if not np.isfinite(X[i]).all():
            raise LawViolation(law, f"client {int(i)} holds a non-finite feature and has weight "
                               f"{_r(out.weights[i])}", client=int(i))
    K = X[kept]
    diff = K[:, None, :] - K[None, :, :]
    with np.errstate(over="ignore"):
        d2 = np.einsum("ijk,ijk->ij", diff, diff)
    slack = (2 * _rounding_radius(case)) ** 2 + 8 * _u(case.features.dtype) * delta2
    if not float(d2.max(initial=0.0)) <= delta2 * (1 + 1e-9) + slack + TINY:
        i, j = np.unravel_index(int(np.argmax(d2)), d2.shape)
        raise LawViolation(law, f"kept clients {int(kept[i])} and {int(kept[j])} are at squared "
                           f"distance {_r(d2[i, j])}; the honest squared diameter is {_r(delta2)}",
                           clients=[int(kept[i]), int(kept[j])], distance2=float(d2[i, j]),
                           bound=delta2)


def mda_output_bound(rule, case: RoundCase) -> None:
    """The aggregate is within the honest diameter Δ of some honest feature (the kept
    set has diameter ≤ Δ and holds at least n − 2f ≥ 1 honest rows, and the aggregate
    is a convex combination of the kept rows)."""
    law = "mda_output_bound"
    out = _outcome(rule, case.features, case.n_samples, case.f, law)
    z = out.vector
    if not np.isfinite(z).all():
        raise LawViolation(law, f"the aggregate is not finite: {z.tolist()}")
    delta2, H = _honest_sq_diameter(case)
    d = float(np.sqrt(np.min(np.sum((H - z) ** 2, axis=1))))
    bound = math.sqrt(delta2)
    if not d <= bound * (1 + 1e-9) + 2 * _rounding_radius(case):
        raise LawViolation(law, f"the aggregate is at distance {_r(d)} from the nearest honest "
                           f"feature; the honest diameter is {_r(bound)} (n={case.n}, f={case.f})",
                           distance=d, bound=bound)


def meamed_range(rule, case: RoundCase) -> None:
    """At every coordinate the aggregate lies within w′ = max(med − lo, hi − med) of
    the median med of all n values (the mean of the two middle ones for even n;
    NaN ordered as +inf), [lo, hi] the honest range: the n − f values closest to
    med are each no farther than some honest value."""
    law = "meamed_range"
    out = _outcome(rule, case.features, case.n_samples, case.f, law)
    X = case.features.astype(np.float64)
    n = case.n
    S = np.sort(X, axis=0)  # NaN last, as +inf
    with np.errstate(invalid="ignore", over="ignore"):
        med = S[(n - 1) // 2] if n % 2 else 0.5 * S[n // 2 - 1] + 0.5 * S[n // 2]
    H = X[case.honest]
    lo, hi = H.min(axis=0), H.max(axis=0)
    w = np.maximum(med - lo, hi - med)
    slack = 8 * _u(case.features.dtype) * np.maximum(np.abs(lo), np.abs(hi)) + TINY
    z = out.vector
    ok = (z >= med - w - slack) & (z <= med + w + slack)
    if not ok.all():
        k = int(np.flatnonzero(~ok)[0])
        raise LawViolation(law, f"coordinate {k} is {_r(z[k])}, farther than w′ = {_r(w[k])} from "
                           f"the median {_r(med[k])} (honest range [{_r(lo[k])}, {_r(hi[k])}])",
                           coordinate=k, value=float(z[k]), median=float(med[k]), width=float(w[k]))


def monna_pivot_bound(rule, case: RoundCase, pivot: int = 0) -> None:
    """With an honest pivot p (the row at position ``pivot``), every kept row (wᵢ > 0,
    when exposed) and the aggregate lie within r = maxₕ ‖xₕ − xₚ‖ of xₚ, h honest:
    at least n − f honest rows lie within r, so the n − f nearest do too."""
    law = "monna_pivot_bound"
    if not case.honest[pivot]:
        raise LawViolation(law, f"the pivot (row {pivot}) must be honest: the law assumes a trusted "
                           "pivot")
    out = _outcome(rule, case.features, case.n_samples, case.f, law)
    X = case.features.astype(np.float64)
    p = X[pivot]
    H = X[case.honest]
    r = float(np.sqrt(np.max(np.sum((H - p) ** 2, axis=1))))
    slack = 2 * _rounding_radius(case)
    if out.weights is not None:
        for i in np.flatnonzero(~(out.weights <= 0)):
            with np.errstate(over="ignore", invalid="ignore"):
                d = float(np.sqrt(np.sum((X[i] - p) ** 2)))
            if not d <= r * (1 + 1e-9) + slack:
                raise LawViolation(law, f"kept client {int(i)} is at distance {_r(d)} from the pivot; "
                                   f"the farthest honest client is at {_r(r)}", client=int(i),
                                   distance=d, bound=r)
    z = out.vector
    with np.errstate(over="ignore", invalid="ignore"):
        d = float(np.sqrt(np.sum((z - p) ** 2)))
    if not d <= r * (1 + 1e-9) + slack:
        raise LawViolation(law, f"the aggregate is at distance {_r(d)} from the pivot; the farthest "
                           f"honest client is at {_r(r)} (n={case.n}, f={case.f})", distance=d, bound=r)


def cc_byzantine_pull(rule, case: RoundCase, tau: float = 100.0, iterations: int = 1):
    """Centered clipping (one iteration from the centre 0, radius ``tau``): replacing the
    Byzantine rows by the centre (no vote) moves the aggregate by at most τ·Σ_B pᵢ,
    pᵢ = nᵢ/Σ nⱼ: each clipped difference has norm ≤ τ. ``tau`` and ``iterations`` are
    the candidate's (``--rule-option tau=10``); with more than one iteration a row at the
    first centre votes again once the centre has moved, so the bound does not follow and
    the law compares nothing (:data:`NOT_COMPARED`)."""
    law = "cc_byzantine_pull"
    if iterations != 1:
        return NOT_COMPARED
    a = _outcome(rule, case.features, case.n_samples, case.f, law)
    Xc = case.features.copy()
    Xc[~case.honest] = 0
    b = _outcome(rule, Xc, case.n_samples, case.f, law)
    if not (np.isfinite(a.vector).all() and np.isfinite(b.vector).all()):
        raise LawViolation(law, "the aggregate is not finite")
    ns = case.n_samples.astype(np.float64)
    bound = tau * float(ns[~case.honest].sum() / ns.sum())
    d = nrm(a.vector - b.vector)
    # rounding of the two aggregates, from what a correct rule returns (a convex combination
    # of clipped differences from the centre 0: norm ≤ τ), never from what the candidate
    # returned: 64u·(‖a‖ + ‖b‖) let an aggregate shifted by 1e17 hide a pull of hundreds
    slack = 2 * _rounding_radius(case) + 64 * _u(case.features.dtype) * 2 * tau + TINY
    if not d <= bound * (1 + 1e-9) + slack:
        raise LawViolation(law, f"the Byzantine rows move the aggregate by {_r(d)}; τ·Σ_B pᵢ = "
                           f"{_r(bound)} (τ = {_r(tau)})", distance=d, bound=bound)


def _cov_top(H: np.ndarray) -> float:
    H = np.asarray(H, dtype=np.float64)
    Y = H - H.mean(axis=0)
    return float(np.linalg.eigvalsh(Y.T @ Y / H.shape[0])[-1]) if H.shape[0] > 1 else 0.0


def smea_eigen_bound(rule, case: RoundCase) -> None:
    """The kept rows (wᵢ > 0) are n − f finite rows whose covariance's largest eigenvalue
    is at most that of every subset of n − f honest rows (one of them is a candidate)."""
    import itertools

    law = "smea_eigen_bound"
    out = _outcome(rule, case.features, case.n_samples, case.f, law)
    if out.weights is None:
        raise LawViolation(law, "the rule exposes no weights")
    X = case.features.astype(np.float64)
    kept = np.flatnonzero(~(out.weights <= 0))
    if not np.isfinite(X[kept]).all():
        raise LawViolation(law, f"a kept row is not finite (kept {kept.tolist()})")
    honest = np.flatnonzero(case.honest)
    k = case.n - case.f
    best = min(_cov_top(X[list(T)]) for T in itertools.combinations(honest, k))
    got = _cov_top(X[kept])
    scale = float(np.abs(X[honest] - X[honest].mean(axis=0)).max(initial=0.0)) ** 2
    if kept.size != k or not got <= best * (1 + 1e-9) + 64 * _u(case.features.dtype) * scale * case.D + TINY:
        raise LawViolation(law, f"{kept.size} rows kept with largest covariance eigenvalue {_r(got)}; "
                           f"the best {k} honest rows have {_r(best)}", kept=kept.tolist(),
                           eigenvalue=got, bound=best)


# -- optimiser laws ------------------------------------------------------------------------------

def _h(opt, name: str, default=None) -> float:
    v = getattr(opt, name, default)
    if v is None:
        raise LawViolation("hyperparameters", f"the optimiser under test has no attribute {_r(name)}")
    return float(v)


def adam_lr_t(opt, t: int) -> float:
    """ηₜ = η·√(1 − β₂ᵗ)/(1 − β₁ᵗ) (docs/optimizers.md), from the object's hyperparameters."""
    from rfrs_ref.optim.base import one_minus_pow

    return _h(opt, "lr") * math.sqrt(one_minus_pow(_h(opt, "beta2"), t)) / one_minus_pow(_h(opt, "beta1"), t)


def _slack(*mags, amp=1.0, u=U64) -> float:
    """32u times the magnitudes' norms, plus underflow (amplified by ``amp`` where a later
    division by √v + ε ≥ ε scales it up); u the unit roundoff of the uploads' storage
    (float64's, or float32's for an object that stores its uploads in float32)."""
    return 32 * u * sum(nrm(np.atleast_1d(m)) for m in mags) + 64 * _tiny(u) * (1.0 + amp)


def _tiny(u: float) -> float:
    """The smallest subnormal of the storage whose unit roundoff is u: a value below it
    stores as 0 (float32's 1.4e-45, where float64 keeps 1e-308)."""
    return TINY if u <= U64 else float(np.finfo(np.float32).smallest_subnormal)


def _close(law, what, a, b, *mags, amp=1.0, u=U64):
    """a (measured on the object under test) = b (the law's value), with the slack of
    b and of the reference magnitudes ``mags``: never of a itself."""
    if agreement.disagree(b, a, 0.0, _slack(b, *mags, amp=amp, u=u)):
        raise LawViolation(law, f"{what}: {_r(a)} ≠ {_r(b)}", lhs=str(a), rhs=b)


def _leq(law, what, a, b, *mags, amp=1.0, u=U64):
    """a ≤ b + slack(b, mags); a NaN a fails."""
    if not a <= b + _slack(b, *mags, amp=amp, u=u):
        raise LawViolation(law, f"{what}: {_r(a)} > {_r(b)}", lhs=str(a), rhs=b)


def _pair_uploads(law: str, opt, case: PairCase):
    """The object's uploads A (for g) and H (for ĝ), float64, the reference's RA and RH
    (``case.optimizer``, rfrs-ref's rule with the same hyperparameters), and the unit
    roundoff of each array's storage, ``u[name]`` (float32's where the object stores that
    array in float32 in either upload, float64's otherwise: both are rfrs-ref's
    conventions, anything else is refused); None when the reference's rule overflows
    (the law says nothing there). The object's uploads must be finite wherever the
    reference's are.

    Each statement of a theorem takes the largest u of the arrays it reads (:func:`_u_of`):
    a float32 θ does not widen the slack of a float64 m."""
    st, g, gh, t = case.state, case.g, case.g_hat, case.t
    RA, RH = _up(case.optimizer, st, g, t, law), _up(case.optimizer, st, gh, t, law)
    if not all(np.isfinite(x).all() for x in (*RA.values(), *RH.values())):
        return None
    raw = opt.client_rule(st, g, t), opt.client_rule(st, gh, t)
    A = _finite_where_reference_is(law, "client_rule(state, g, t)", RA, raw[0], RA)
    H = _finite_where_reference_is(law, "client_rule(state, ĝ, t)", RH, raw[1], RH)
    u = {k: max(_input_u(case), *(_u(np.asarray(up[k]).dtype) for up in raw)) for k in RA}
    return A, H, RA, RH, u


def _input_u(case: PairCase) -> float:
    """The unit roundoff of the example's inputs (state and gradients): float32's for a
    float32 example, where an implementation may compute in the inputs' dtype (β₁m̄ of a
    float32 m̄ rounds to float32), float64's otherwise."""
    return max(_u(np.asarray(x).dtype) for x in (*case.state.values(), case.g, case.g_hat))


def _u_of(u: dict, *arrays: str) -> float:
    """The unit roundoff a statement reading ``arrays`` of the uploads is judged with: the
    largest of theirs (a statement about θ, computed from m and v, reads all three)."""
    return max(u[k] for k in arrays)


#: the dtypes an upload may be stored in: rfrs-ref's optimisers store, recover and verify
#: float32 and float64 arrays, and the rounding tolerances are derived for those two
UPLOAD_DTYPES = (np.float32, np.float64)


def _upload(law: str, what: str, upload, arrays, D: int) -> dict:
    """``upload`` checked against the convention: a dict holding each of ``arrays`` as a
    float32 or float64 array of shape (D,). Returns the arrays in their own dtype.

    A float16 upload would be judged with a float16 tolerance, and an integer or
    complex one converted to float64 before it is judged; neither is an upload
    rfrs-ref stores, so each is a violation, not a value to compare."""
    if not isinstance(upload, dict):
        raise LawViolation(law, f"{what} returned {type(upload).__name__}, not a dict of arrays")
    out = {}
    for k in arrays:
        if k not in upload:
            raise LawViolation(law, f"{what} returned no {k!r} array", array=k)
        try:
            out[k] = real_array(upload[k], (D,), f"{what} (its {k!r})", "one value per coordinate",
                                dtypes=UPLOAD_DTYPES)
        except OutputError as exc:
            raise LawViolation(law, str(exc), array=k, **exc.details) from None
    return out


def _up(opt, state, g, t, law: str = "client_rule", arrays=None) -> dict:
    """``opt.client_rule(state, g, t)``'s ``arrays`` (default ``opt.arrays``, rfrs-ref's
    names: θ, plus m, v or r) as float64, each checked as an upload (:func:`_upload`)."""
    up = opt.client_rule(state, g, t)
    checked = _upload(law, "client_rule", up, arrays or opt.arrays, int(np.shape(g)[0]))
    return {k: v.astype(np.float64) for k, v in checked.items()}


def _stored_like(ref_upload: dict, cand_upload: dict) -> dict:
    """The reference's upload stored in the candidate's dtypes: the candidate's storage
    sets the precision (float32 or float64, the only dtypes :func:`_upload` accepts,
    both rfrs-ref's own), the reference the magnitudes. Any other dtype (never reached
    after that check) is taken as float64, the tighter bound."""
    out = {}
    for k, v in ref_upload.items():
        dt = np.asarray(cand_upload.get(k, v)).dtype
        out[k] = np.asarray(v).astype(dt if dt in UPLOAD_DTYPES else np.float64)
    return out


def _finite_where_reference_is(law: str, what: str, reference: dict, candidate, arrays) -> dict:
    """The candidate's upload as float64 arrays, after checking that it has every array of
    the reference as a float32 or float64 array of the reference's shape (:func:`_upload`),
    finite wherever the reference's is."""
    D = int(np.shape(reference[next(iter(arrays))])[0])
    checked = _upload(law, what, candidate, arrays, D)
    out = {}
    for k in arrays:
        c = checked[k].astype(np.float64)
        r = np.asarray(reference[k], dtype=np.float64)
        bad = np.flatnonzero(np.isfinite(r) & ~np.isfinite(c))
        if bad.size:
            j = int(bad[0])
            raise LawViolation(law, f"{what} returned {k}[{j}] = {c[j]} where the rule gives "
                               f"{_r(r[j])}", array=k, coordinate=j, value=str(c[j]))
        out[k] = c
    return out


def _other_gradient(g: np.ndarray, g_hat: np.ndarray) -> np.ndarray:
    """A gradient that differs from ``g`` in every coordinate: ĝ where it differs from g,
    g + 1 + |g| elsewhere (finite for the drawn |g| ≤ 1e3), in g's dtype."""
    g64 = np.asarray(g, dtype=np.float64)
    other = np.where(np.asarray(g_hat, dtype=np.float64) != g64, g_hat, g64 + 1.0 + np.abs(g64))
    return other.astype(np.asarray(g).dtype)


def recovery_exact(opt, case: PairCase, reference: str | None = None) -> str | None:
    """recover(state, U, t) = g within the rounding bound of docs/optimizers.md
    recovery (rfrs-ref's derived per-coordinate bound, times the verification safety
    factor), where U is rfrs-ref's upload client_rule(state, g, t): only the arrays
    the optimiser uploads, each stored in the dtype the object stores it in.

    The object's own client_rule(state, g, t) is called first (its upload must be
    finite wherever the reference's is), then client_rule on another gradient, then
    recover: a recovery that returns the last gradient client_rule saw, or reads an
    array of its own that it hid in its upload, does not recover U.

    ``reference`` names the rfrs-ref optimiser whose rule and bound apply
    (default ``opt.name``), with the example's hyperparameters (``case.optimizer``: those
    the object was built with, or read from its attributes, as for update_rule). The bound is
    computed from the reference's own upload (stored in the dtypes the object
    stores its upload in), never from what the object returned: a recovery of
    +inf cannot widen its own bound. Where rfrs-ref's rule gives a finite
    upload, a NaN or infinite value in the object's upload or recovery is a
    violation; where rfrs-ref's rule itself overflows, there is nothing to
    recover and the law holds.
    """
    from rfrs_ref.optim import OPTIMIZERS, VERIFY_SAFETY
    from rfrs_ref.params import hyperparameters

    law = "recovery_exact"
    kind = reference or getattr(opt, "name", None)
    cls = OPTIMIZERS.get(kind)
    if isinstance(case.optimizer, cls):
        # the hyperparameters the object was built with (or read from it), as update_rule's:
        # read again from its attributes, a recover that ignores η and exposes it under
        # another name (an SGD dividing by 1e-3 whatever η) was held to its own mistake
        ref = case.optimizer
    else:
        ref = cls(**{h.name: getattr(opt, h.name) for h in hyperparameters(cls) if hasattr(opt, h.name)})
    state = {k: case.state[k] for k in ref.arrays}
    ref_up = ref.client_rule(state, case.g, case.t)
    if not all(np.isfinite(np.asarray(v, dtype=np.float64)).all() for v in ref_up.values()):
        # the rule overflows: nothing to recover (verification rejects such uploads)
        return NOT_COMPARED
    up = opt.client_rule(state, case.g, case.t)
    _finite_where_reference_is(law, "client_rule", ref_up, up, ref.arrays)
    # recover is given the reference's upload (its arrays only, stored in the object's
    # dtypes), after a client_rule call on another gradient: what client_rule left
    # behind (a remembered g, an extra array in its upload) cannot stand in for recovery
    stored = _stored_like({k: ref_up[k] for k in ref.arrays}, up)
    opt.client_rule(state, _other_gradient(case.g, case.g_hat), case.t)
    given = {k: v.copy() for k, v in stored.items()}
    g_hat = _real(law, opt.recover(state, given, case.t), case.g.shape, "recover", "the gradient")
    # a float32 example is judged with float32's rounding (the recovery may compute in
    # the state's dtype): the bound of a recovery stored in float32
    rec = None if _input_u(case) == U64 else ref.recover(state, stored, case.t).astype(np.float32)
    bound = VERIFY_SAFETY * ref.recovery_bound(state, stored, case.t, recovered=rec)
    bad = np.flatnonzero(agreement.disagree(case.g, g_hat, 0.0, bound))
    if bad.size:
        k = int(bad[0])
        err = abs(g_hat[k] - case.g[k])
        raise LawViolation(law, f"coordinate {k}: recovered {_r(g_hat[k])} from an honest upload of "
                           f"g = {_r(case.g[k])} (error {_r(err)}, rounding bound {_r(bound[k])})",
                           coordinate=k, g=float(case.g[k]), recovered=str(g_hat[k]),
                           bound=float(bound[k]))


#: roundings an update rule may accumulate per coordinate (as the golden vectors allow)
C_RULE = 64


def _step_gain(ref, t: int) -> float:
    """How much θ's step scales a value of its numerator: ηₜ/(√v + ε) ≤ ηₜ/ε for Adam,
    η/(√r + ε) ≤ η/ε for AdaGrad and RMSProp, η for SGD and momentum. A subnormal m, v, r
    or g rounds (absolutely, by up to the smallest subnormal) before the division, and the
    division carries that error into θ scaled by this gain (docs/conformance.md)."""
    name = getattr(ref, "name", "")
    lr = abs(_h(ref, "lr"))
    if name == "adam":
        return abs(adam_lr_t(ref, t)) / _h(ref, "eps")
    if name in ("adagrad", "rmsprop"):
        return lr / _h(ref, "eps")
    return lr


def update_rule(opt, case: PairCase) -> str | None:
    """client_rule(state, g, t) is the update rule of docs/optimizers.md: every uploaded
    array equals rfrs-ref's (``case.optimizer``, same hyperparameters) within
    C_RULE·u·(max|reference upload| + max|state|) per array, u of the dtype the
    object stores the array in, or float32's for a float32 example: float32 or
    float64, the dtypes rfrs-ref stores uploads in (any other dtype, float16 included, is a violation, so that no
    storage of the object's choosing widens its tolerance). The magnitudes come
    from the reference alone; a NaN or infinite value where the reference is
    finite is a violation."""
    law = "update_rule"
    ref, st, g, t = case.optimizer, case.state, case.g, case.t
    state = {k: st[k] for k in ref.arrays}
    R = ref.client_rule(state, g, t)
    if not all(np.isfinite(np.asarray(v, dtype=np.float64)).all() for v in R.values()):
        return NOT_COMPARED  # the rule overflows: no finite reference to match
    raw = opt.client_rule(state, g, t)
    C = _finite_where_reference_is(law, "client_rule", R, raw, ref.arrays)
    for k in ref.arrays:
        r = np.asarray(R[k], dtype=np.float64)
        scale = float(np.abs(r).max(initial=0.0)) + float(np.abs(state[k]).max(initial=0.0))
        # the candidate's dtype is float32 or float64 here (_upload refuses any other):
        # both are rfrs-ref's storage, so this u is one the reference allows
        u = max(_u(np.asarray(raw[k]).dtype), _input_u(case))
        tol = C_RULE * u * scale + _tiny(u) * (1.0 + (_step_gain(ref, t) if k == "theta" else 0.0))
        bad = np.flatnonzero(agreement.disagree(r, C[k], 0.0, tol))
        if bad.size:
            j = int(bad[0])
            raise LawViolation(law, f"{k}[{j}] = {_r(C[k][j])}, the rule gives {_r(r[j])} (tolerance "
                               f"{_r(tol)})", array=k, coordinate=j, got=str(C[k][j]),
                               expected=float(r[j]))


def _show(x) -> str:
    """One array value for a message: a float as Python writes it, a NaN with its bits
    (two NaNs of different payloads are different inputs), an integer as an integer."""
    v = np.asarray(x)
    if v.dtype.kind == "f" and np.isnan(v):
        bits = int(v.reshape(1).view(np.dtype(f"u{v.dtype.itemsize}"))[0])
        return f"nan (bits 0x{bits:0{2 * v.dtype.itemsize}x})"
    if v.dtype.kind in "iub":
        return str(int(v))
    return _r(v) if v.dtype.kind == "f" else str(v.tolist())


def _changed(law: str, what: str, before: np.ndarray, after) -> None:
    """``after`` is ``before`` byte for byte (−0.0 is not 0.0, a NaN keeps its payload),
    with the same dtype and shape; any number of dimensions (a (n, D) matrix is reported
    at [row, coordinate])."""
    a = np.asarray(after)
    if a.dtype != before.dtype or a.shape != before.shape:
        raise LawViolation(law, f"{what} was changed in place: dtype {before.dtype}, shape "
                           f"{before.shape} became {a.dtype}, {a.shape} (inputs are never modified)")
    bits = [np.ascontiguousarray(x).reshape(-1).view(np.uint8).reshape(x.size, -1) for x in (before, a)]
    diff = np.flatnonzero((bits[0] != bits[1]).any(axis=1))
    if diff.size:
        j = int(diff[0])
        idx = np.unravel_index(j, before.shape)
        where = ", ".join(str(int(i)) for i in idx)
        raise LawViolation(law, f"{what}[{where}] was changed in place: {_show(before[idx])} became "
                           f"{_show(a[idx])} (inputs are never modified)", index=[int(i) for i in idx],
                           before=_show(before[idx]), after=_show(a[idx]))


def _as_array(value) -> np.ndarray | None:
    """What the code under test returned, as the NumPy array it is or views (a torch tensor
    through NumPy), without copying; None for anything NumPy reads only by copying (a list,
    a scalar) or cannot read: such a value shares no memory with an input."""
    from rfrs_ref.testing.adapters import _to_numpy

    if not (isinstance(value, np.ndarray) or (hasattr(value, "detach") and hasattr(value, "cpu"))):
        return None
    try:
        return _to_numpy(value)
    except Exception:  # noqa: BLE001 - an output the other laws judge
        return None


def _shares(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays share memory (:func:`numpy.shares_memory`, exact up to a bounded
    amount of work, beyond which overlapping address ranges count as shared)."""
    try:
        return bool(np.shares_memory(a, b, max_work=100_000))
    except Exception:  # noqa: BLE001 - numpy's TooHardError: the bounds overlap
        return bool(np.may_share_memory(a, b))


def _aliases(law: str, what: str, value, inputs) -> None:
    """``value`` (what the code under test returned) shares no memory with any of
    ``inputs`` ((name, array) pairs): the caller owns both, and a result that is an input,
    or a view of one, changes when the caller writes either."""
    arr = _as_array(value)
    if arr is None:
        return
    for name, x in inputs:
        if isinstance(x, np.ndarray) and _shares(arr, x):
            raise LawViolation(law, f"{what} shares memory with {name} (it is that array or a view "
                               "of it): return a new array", returned=what, input=name)


def _outcome_as_returned(rule, X, ns, f, law) -> Outcome:
    """The rule's Outcome on X and ns themselves (no copies: the law watches what the rule
    does to them), an adapter's :class:`OutputError` as a violation of ``law``."""
    try:
        out = rule(X, ns, f)
    except OutputError as exc:
        raise LawViolation(law, str(exc), **exc.details) from None
    if not isinstance(out, Outcome):
        raise LawViolation(law, f"the adapted rule returned {type(out).__name__}, not an Outcome")
    return out


def _returned(out: Outcome) -> list:
    """(label, array) for what a rule returned, as it returned it: an adapter records it in
    ``Outcome.returned`` (its vector and weights are converted copies); an Outcome the
    rule built itself holds it as its vector and weights."""
    return ([("what the rule returned", x) for x in out.returned]
            + [("the aggregate", out.vector), ("the weights", out.weights)])


def _inputs_law(law: str, call, inputs: dict, second: dict) -> None:
    """The clauses of ``inputs_unchanged`` shared by rules, pre-aggregators and attacks:
    ``call(**inputs)`` leaves every input byte for byte as it was, returns arrays (a list
    of (label, array)) that share no memory with them, and a second call on other arrays
    (``second``) leaves the first call's inputs as they were too (a callable that keeps a
    reference to an input and writes into it on its next call modified it)."""
    before = {k: v.copy() for k, v in inputs.items()}
    returned = call(**inputs)
    for k, v in inputs.items():
        _changed(law, k, before[k], v)
    for label, value in returned:
        _aliases(law, label, value, list(inputs.items()))
    before2 = {k: v.copy() for k, v in second.items()}
    call(**second)
    for k, v in inputs.items():
        _changed(law, f"{k} (after a second call on other arrays)", before[k], v)
    for k, v in second.items():
        _changed(law, f"{k} (the second call's)", before2[k], v)


def rule_inputs_unchanged(rule, case: RoundCase) -> None:
    """The rule, called on the example's features and nᵢ themselves (every other law calls
    it on copies), leaves both byte for byte as they were, dtype and shape included
    (docs/aggregation.md: inputs are never modified), and what it returns (aggregate,
    weights) is a new array, sharing no memory with either; a second call, on the round
    with its rows permuted, leaves the first call's arrays as they were too."""
    law = "inputs_unchanged"

    def call(features, n_samples):
        out = _outcome_as_returned(rule, features, n_samples, case.f, law)
        _real(law, out.vector, (case.D,), "the rule", "the aggregated feature vector")
        if out.weights is not None:
            _real(law, out.weights, (case.n,), "the rule", "one weight per client")
        return _returned(out)

    p = case.perm
    _inputs_law(law, call, {"features": np.array(case.features, copy=True),
                            "n_samples": np.array(case.n_samples, copy=True)},
                {"features": np.array(case.features[p], copy=True),
                 "n_samples": np.array(case.n_samples[p], copy=True)})


def inputs_unchanged(opt, case: PairCase) -> None:
    """client_rule(state, g, t) and recover(state, upload, t) leave every array they are
    given as it was (rfrs-ref's rule: inputs are never modified in place), then and
    later, and what they return is the caller's: a later call does not change it, and it
    shares no memory with an input. The object is called on the example's own arrays
    (copies of the case, compared byte for byte with copies taken before the call):
    client_rule on (state, g), client_rule again on another gradient g₂ (after which the
    first upload must be as it was: a server keeps every client's upload of a round, and
    one buffer returned to every call would give it the last client's for all), then
    recover on rfrs-ref's upload of g and on rfrs-ref's upload of g₂, each stored in the
    dtypes the object stores its upload in (after which the first recovered gradient must
    be as it was: a server recovers every client's gradient of a round before it
    aggregates them, and a recover that reuses one output buffer gives it the last
    client's gradient n times). Each upload and recovered gradient must share no memory
    with the state, the gradients, the uploads given or another result. After each call
    every input given so far (g included: an object that keeps it and writes into it one
    call later modified it) is checked again. Where rfrs-ref's rule overflows, only
    client_rule is checked."""
    law = "inputs_unchanged"
    ref, t = case.optimizer, case.t
    state = {k: np.array(case.state[k], copy=True) for k in ref.arrays}
    g = np.array(case.g, copy=True)
    before = {k: v.copy() for k, v in state.items()}, g.copy()

    given = [(f"client_rule's state[{k!r}]", before[0][k], state[k]) for k in ref.arrays]
    given.append(("client_rule's g", before[1], g))

    def unchanged(call: str) -> None:
        for what, was, now in given:
            _changed(law, what + call, was, now)

    def inputs():
        return [(what, now) for what, _, now in given]

    up = opt.client_rule(state, g, t)
    unchanged("")
    ref_up = ref.client_rule(before[0], before[1], t)
    if not all(np.isfinite(np.asarray(v, dtype=np.float64)).all() for v in ref_up.values()):
        return
    checked = _upload(law, "client_rule", up, ref.arrays, int(g.shape[0]))
    for k in ref.arrays:
        _aliases(law, f"client_rule's upload[{k!r}]", up[k], inputs())
    first = {k: np.array(checked[k], copy=True) for k in ref.arrays}
    g2 = _other_gradient(before[1], before[1])
    g2_before = g2.copy()
    given.append(("the second client_rule call's g", g2_before, g2))
    up2 = opt.client_rule(state, g2, t)
    unchanged(" (after a second client_rule call)")
    for k in ref.arrays:
        after = np.asarray(checked[k])
        if after.shape == first[k].shape and not np.array_equal(after, first[k], equal_nan=True):
            j = int(np.flatnonzero(~((after == first[k]) | (np.isnan(after) & np.isnan(first[k]))))[0])
            raise LawViolation(law, f"the upload's {k}[{j}] changed from {_r(first[k][j])} to "
                               f"{_r(after[j])} when client_rule was called again: the upload "
                               "shares memory with what a later call writes (a server keeps "
                               "every upload of a round; return a new array per call)",
                               array=k, coordinate=j)
    if isinstance(up2, dict):
        for k in ref.arrays:
            if k in up2:
                _aliases(law, f"the second client_rule call's upload[{k!r}]", up2[k],
                         inputs() + [(f"the first upload[{j!r}]", up[j]) for j in ref.arrays])
    ref_up2 = ref.client_rule(before[0], g2_before, t)
    uploads = [_stored_like({k: ref_up[k] for k in ref.arrays}, checked)]
    if all(np.isfinite(np.asarray(v, dtype=np.float64)).all() for v in ref_up2.values()):
        uploads.append(_stored_like({k: ref_up2[k] for k in ref.arrays}, checked))
    client_uploads = [(f"client_rule's upload[{k!r}]", up[k]) for k in ref.arrays]
    given += [(f"recover's upload[{k!r}]", v.copy(), v) for k, v in uploads[0].items()]
    rec = opt.recover(state, uploads[0], t)
    unchanged(" (after recover)")
    _aliases(law, "what recover returned", rec, inputs() + client_uploads)
    _real(law, rec, g.shape, "recover", "the gradient")
    if len(uploads) < 2:
        return
    first_rec = _as_array(rec)
    kept_rec = None if first_rec is None else np.array(first_rec, copy=True)
    given += [(f"the second recover call's upload[{k!r}]", v.copy(), v) for k, v in uploads[1].items()]
    rec2 = opt.recover(state, uploads[1], t)
    unchanged(" (after a second recover call)")
    if (first_rec is not None and first_rec.ndim == 1 and first_rec.shape == kept_rec.shape
            and first_rec.dtype == kept_rec.dtype):
        bits = [np.ascontiguousarray(x).view(np.uint8).reshape(x.size, -1) for x in (kept_rec, first_rec)]
        diff = np.flatnonzero((bits[0] != bits[1]).any(axis=1))
        if diff.size:
            j = int(diff[0])
            raise LawViolation(law, f"the gradient recover returned for one upload changed at [{j}] "
                               f"from {_show(kept_rec[j])} to {_show(first_rec[j])} when recover was "
                               "called on another upload: a server recovers every client's gradient "
                               "of a round before aggregating them, and a buffer that the next call "
                               "overwrites gives it the last client's n times (return a new array "
                               "per call)", coordinate=j, before=_show(kept_rec[j]),
                               after=_show(first_rec[j]))
    _aliases(law, "what the second recover call returned", rec2,
             inputs() + client_uploads + [("what recover returned for the first upload", rec)])


def _run_sequence(opt, seq: GradientSequence, law: str, arrays):
    state = {k: np.zeros(seq.D) for k in ("theta", "m", "v", "r")}
    for t, (G, w) in enumerate(seq.rounds, start=1):
        ups = [_up(opt, state, g, t, law, arrays) for g in G]
        yield t, ups
        state = {k: sum(wi * up[k] for wi, up in zip(w, ups, strict=True)) for k in ups[0]}


def lemma2(opt, seq: GradientSequence, kind: str = "adam") -> None:
    """‖g‖ ≤ g_max for every gradient and convex aggregation: Adam's ‖m‖ ≤ g_max
    every round (the paper's Lemma 2); momentum's ‖m‖ ≤ g_max/(1 − β₃)."""
    from rfrs_ref.optim import OPTIMIZERS

    law = "lemma2"
    if kind == "adam":
        limit = seq.g_max
    elif kind == "momentum":
        limit = seq.g_max / (1.0 - _h(opt, "beta3"))
    else:
        raise ValueError(f"lemma2 applies to adam and momentum, not {_r(kind)}")
    for t, ups in _run_sequence(opt, seq, law, OPTIMIZERS.get(kind).arrays):
        for i, up in enumerate(ups):
            m = nrm(up["m"])
            if not m <= limit * (1 + 1e-12):
                raise LawViolation(law, f"round {t}, client {i}: ‖m‖ = {_r(m)} > {_r(limit)}",
                                   round=t, client=i, norm=m, limit=limit)


def _inv(v, eps):
    return 1.0 / (np.sqrt(v) + eps)


def theorem1(opt, case: PairCase) -> str | None:
    """Adam, for uploads built from ĝ and g on the same state (v̄ ≥ v_min):
    ‖m̂ − m‖ = (1 − β₁)‖ĝ − g‖; ‖v̂ − v‖ ≤ (1 − β₂)(‖Δg‖² + 2‖Δg‖‖g‖);
    ‖√v̂ − √v‖ ≤ ‖v̂ − v‖/(2√(β₂v_min)) (v_min > 0);
    ‖1/(√v̂ + ε) − 1/(√v + ε)‖ ≤ ‖√v̂ − √v‖/(√(β₂v_min) + ε)²;
    ‖θ̂ − θ‖ ≤ ηₜ(‖m‖‖Δinv‖ + ‖Δm‖/(√(β₂v_min) + ε) + ‖Δm‖‖Δinv‖)."""
    law = "theorem1"
    b1, b2, eps = _h(case.optimizer, "beta1"), _h(case.optimizer, "beta2"), _h(case.optimizer, "eps")
    st, g, gh, t, vmin = case.state, case.g, case.g_hat, case.t, case.floor
    pair = _pair_uploads(law, opt, case)
    if pair is None:
        return NOT_COMPARED
    # left-hand sides from the object's uploads (A, H); rounding slack from the reference's (RA, RH)
    A, H, RA, RH, u = pair
    c1, c2 = 1 - b1, 1 - b2
    d = nrm(gh - g)
    _close(law, "‖m̂ − m‖ = (1 − β₁)‖ĝ − g‖", nrm(H["m"] - A["m"]), c1 * d, b1 * st["m"], c1 * g, c1 * gh,
           u=_u_of(u, "m"))
    dv = nrm(H["v"] - A["v"])
    _leq(law, "‖v̂ − v‖ ≤ (1 − β₂)(‖Δg‖² + 2‖Δg‖‖g‖)", dv, c2 * (d * d + 2 * d * nrm(g)), RA["v"], RH["v"],
         u=_u_of(u, "v"))
    a = math.sqrt(b2 * vmin)
    droot = nrm(np.sqrt(H["v"]) - np.sqrt(A["v"]))
    if a > 0:
        _leq(law, "‖√v̂ − √v‖ ≤ ‖v̂ − v‖/(2√(β₂v_min))", droot, dv / (2 * a), np.sqrt(RA["v"]),
             np.sqrt(RH["v"]), (RA["v"] + RH["v"]) / (2 * a), u=_u_of(u, "v"))
    ia, ih = _inv(A["v"], eps), _inv(H["v"], eps)
    ria, rih = _inv(RA["v"], eps), _inv(RH["v"], eps)
    dinv = nrm(ih - ia)
    lo = (a + eps) ** 2
    _leq(law, "‖Δ 1/(√v + ε)‖ ≤ ‖√v̂ − √v‖/(√(β₂v_min) + ε)²", dinv, droot / lo, rih, ria,
         (np.sqrt(RA["v"]) + np.sqrt(RH["v"])) / lo, amp=1 / eps, u=_u_of(u, "v"))
    dm = nrm(H["m"] - A["m"])
    bound_u = nrm(A["m"]) * dinv + dm / (a + eps) + dm * dinv
    dm_ops = 2 * b1 * np.abs(st["m"]) + c1 * (np.abs(g) + np.abs(gh))
    mags = [RH["m"] * rih, RA["m"] * ria, nrm(RA["m"]) * (ria + rih),
            dm_ops * (1 / (a + eps) + nrm(ria + rih))]
    lr_t = adam_lr_t(case.optimizer, t)
    _leq(law, "‖θ̂ − θ‖ ≤ ηₜ·(update bound)", nrm(H["theta"] - A["theta"]), lr_t * bound_u,
         st["theta"], st["theta"], *[lr_t * m for m in mags], amp=1 / eps, u=_u_of(u, "theta", "m", "v"))


def theorem2(opt, case: PairCase) -> str | None:
    """Momentum: ‖m̂ − m‖ = ‖ĝ − g‖ and ‖θ̂ − θ‖ = η‖ĝ − g‖."""
    law = "theorem2"
    b3, lr = _h(case.optimizer, "beta3"), _h(case.optimizer, "lr")
    st, g, gh, t = case.state, case.g, case.g_hat, case.t
    pair = _pair_uploads(law, opt, case)
    if pair is None:
        return NOT_COMPARED
    A, H, RA, RH, u = pair
    d = nrm(gh - g)
    _close(law, "‖m̂ − m‖ = ‖ĝ − g‖", nrm(H["m"] - A["m"]), d, b3 * st["m"], g, gh, u=_u_of(u, "m"))
    _close(law, "‖θ̂ − θ‖ = η‖ĝ − g‖", nrm(H["theta"] - A["theta"]), lr * d, st["theta"], st["theta"],
           lr * RA["m"], lr * RH["m"], u=_u_of(u, "theta", "m"))


def _root_chain(law, opt, case: PairCase, decay: float, coef: float) -> str | None:
    lr, eps = _h(case.optimizer, "lr"), _h(case.optimizer, "eps")
    st, g, gh, t, rmin = case.state, case.g, case.g_hat, case.t, case.floor
    pair = _pair_uploads(law, opt, case)
    if pair is None:
        return NOT_COMPARED
    # left-hand sides from the object's uploads (A, H); rounding slack from the reference's (RA, RH)
    A, H, RA, RH, u = pair
    d = nrm(gh - g)
    dr = nrm(H["r"] - A["r"])
    _leq(law, "‖r̂ − r‖ ≤ coef(‖Δg‖² + 2‖Δg‖‖g‖)", dr, coef * (d * d + 2 * d * nrm(g)), RA["r"], RH["r"],
         amp=1 / eps, u=_u_of(u, "r"))
    droot = nrm(np.sqrt(H["r"]) - np.sqrt(A["r"]))
    a = math.sqrt(decay * rmin)
    if a > 0:
        _leq(law, "‖√r̂ − √r‖ ≤ ‖r̂ − r‖/(2√(decay·r_min))", droot, dr / (2 * a), np.sqrt(RA["r"]),
             np.sqrt(RH["r"]), (RA["r"] + RH["r"]) / (2 * a), amp=1 / eps, u=_u_of(u, "r"))
    ia, ih = _inv(A["r"], eps), _inv(H["r"], eps)
    ria, rih = _inv(RA["r"], eps), _inv(RH["r"], eps)
    dinv = nrm(ih - ia)
    _leq(law, "‖Δ 1/(√r + ε)‖ ≤ ‖√r̂ − √r‖/(√(decay·r_min) + ε)²", dinv, droot / (a + eps) ** 2, ria, rih,
         (np.sqrt(RA["r"]) + np.sqrt(RH["r"])) / (a + eps) ** 2, amp=1 / eps, u=_u_of(u, "r"))
    lhs_u = nrm(gh * ih - g * ia)
    mags = [gh * rih, g * ria, nrm(g) * (ria + rih),
            (np.abs(g) + np.abs(gh)) * (1 / (a + eps) + nrm(ria + rih))]
    _leq(law, "‖ĝ/(√r̂ + ε) − g/(√r + ε)‖ ≤ ‖g‖‖Δinv‖ + ‖Δg‖/(√(decay·r_min) + ε) + ‖Δg‖‖Δinv‖",
         lhs_u, nrm(g) * dinv + d / (a + eps) + d * dinv, *mags, amp=1 / eps, u=_u_of(u, "r"))
    steps = lr * (np.abs(g) * ria + np.abs(gh) * rih)
    _close(law, "‖θ̂ − θ‖ = η‖ĝ/(√r̂ + ε) − g/(√r + ε)‖", nrm(H["theta"] - A["theta"]), lr * lhs_u,
           st["theta"], st["theta"], steps, amp=1 / eps, u=_u_of(u, "theta", "r"))


def theorem3(opt, case: PairCase) -> str | None:
    """AdaGrad (r = r̄ + g²): the chain of Theorem 1 with (decay, coef) = (1, 1), and
    ‖θ̂ − θ‖ = η·‖ĝ/(√r̂ + ε) − g/(√r + ε)‖."""
    return _root_chain("theorem3", opt, case, 1.0, 1.0)


def theorem4(opt, case: PairCase) -> str | None:
    """RMSProp (r = β₄r̄ + (1 − β₄)g²): the chain with (decay, coef) = (β₄, 1 − β₄)."""
    b4 = _h(case.optimizer, "beta4")
    return _root_chain("theorem4", opt, case, b4, 1.0 - b4)


def camouflage_upload_dtype(opt, state, g, t) -> np.dtype:
    """The dtype whose rounding a camouflaged θ is judged with: the narrowest of the
    arrays ``opt.client_rule(state, g, t)`` uploads (float64 for rfrs-ref's Adam, whatever
    the dtype of the state and g; float32 for an Adam that stores its uploads in float32).
    An attack that rounds g̃ to float32 against an Adam storing float64 must still give θ
    to float64's rounding, as rfrs-ref's attack does (``upload_dtype`` of
    :func:`rfrs_ref.attack.camouflage.camouflage_gradient`, the dtype of the round's
    uploads): where the float32 g̃ cannot, it keeps g."""
    up = _upload("camouflage_same_theta", "client_rule", opt.client_rule(state, g, t),
                 opt.arrays, int(np.shape(g)[0]))
    return max((np.dtype(a.dtype) for a in up.values()), key=_u)


def camouflage_same_theta(camouflage: Callable, case: PairCase):
    """Where camouflage applies, the camouflaged θ equals the honest θ to rounding
    while the recovered gradient differs (docs/conformance.md); where rfrs-ref's attack
    camouflages some coordinate, the attack under test must change at least one of
    those (an attack that changes nothing would hold every other clause). An example
    where neither rfrs-ref's attack nor the one under test changes any coordinate
    compared nothing: :data:`NOT_COMPARED` (with β₁ = 0 the equation has no solution
    anywhere, and the law held "on every example" without checking one).

    ``camouflage(state, g, t, optimizer) -> g̃`` (float64, g̃ = g where it does not
    apply). θ is compared with the tolerance the attack promises (module docstring of
    :mod:`rfrs_ref.attack.camouflage`): (THETA_TOLERANCE + 2)·u·(|θ̄| + |ηₜu(g)|), u the
    unit roundoff of the uploads θ(g) and θ(g̃) are stored in (:func:`camouflage_upload_dtype`:
    float64's for rfrs-ref's Adam, on a float32 example too). THETA_TOLERANCE·u bounds
    the step's difference the attack accepts, 2u the rounding of storing θ̄ − step twice.
    Judged with the example's dtype instead, a float32 example allowed 6·2⁻²⁴ relative
    and an attack whose θ was off by 1e-8 relative held the law.
    """
    from rfrs_ref.attack.camouflage import THETA_TOLERANCE, camouflage_gradient

    law = "camouflage_same_theta"
    opt, st, g, t = case.optimizer, case.state, case.g, case.t
    gt = _real(law, camouflage(st, g, t, opt), g.shape, "camouflage", "the camouflaged gradient")
    where = gt != g
    # where rfrs-ref's attack camouflages (Eq. 6 has a solution that keeps θ), an attack
    # that changes no coordinate there is no camouflage: without this a no-op held the law.
    # "There" is where both documented forms of the equation (with ε, and the paper's
    # without it) have a solution, so that an attack of either form can meet the law; both
    # with g̃ in g's dtype and θ to the rounding of the uploads, as rfrs-ref's attack runs
    up_dtype = camouflage_upload_dtype(opt, st, g, t)
    hyper = dict(beta1=_h(opt, "beta1"), beta2=_h(opt, "beta2"), lr_t=adam_lr_t(opt, t),
                 eps=_h(opt, "eps"), upload_dtype=up_dtype)
    ref_gt, with_eps = camouflage_gradient(st["m"], st["v"], st["theta"], g, **hyper)
    _, without_eps = camouflage_gradient(st["m"], st["v"], st["theta"], g, include_eps=False, **hyper)
    ref_where = with_eps & without_eps
    if ref_where.any() and not (where & ref_where).any():
        k = int(np.flatnonzero(ref_where)[0])
        raise LawViolation(law, f"camouflage applies at {int(ref_where.sum())} coordinate(s) (first: "
                           f"{k}, g = {_r(g[k])}, rfrs-ref's g̃ = {_r(ref_gt[k])}) but the attack "
                           "changed none of them", coordinate=k)
    if not where.any():
        return NOT_COMPARED
    A, B = _up(opt, st, g, t, law), _up(opt, st, gt, t, law)
    step = np.abs(A["theta"] - st["theta"])
    # both uploads' rounding: an Adam storing in g's dtype stores θ(g) of a float32 g in float32
    u = max(_u(up_dtype), _u(camouflage_upload_dtype(opt, st, gt, t)))
    tol = (THETA_TOLERANCE + 2) * u * (np.abs(st["theta"]) + step) + _tiny(u)
    bad = np.flatnonzero(where & agreement.disagree(A["theta"], B["theta"], 0.0, tol))
    if bad.size:
        k = int(bad[0])
        raise LawViolation(law, f"coordinate {k}: g̃ = {_r(gt[k])} ≠ g = {_r(g[k])} but θ(g̃) = "
                           f"{_r(B['theta'][k])} differs from θ(g) = {_r(A['theta'][k])} by more than "
                           f"{_r(tol[k])} ((THETA_TOLERANCE + 2)·u·(|θ̄| + |step|), u = {_r(u)} of the "
                           f"uploads' {np.dtype(up_dtype).name})", coordinate=k)
    g_rec = _real(law, opt.recover(st, B, t), g.shape, "recover", "the gradient")
    same = np.flatnonzero(where & (g_rec == g))
    if same.size:
        k = int(same[0])
        raise LawViolation(law, f"coordinate {k}: the recovered gradient equals g although the "
                           "attack changed it", coordinate=k)
    return None


# -- pre-aggregator laws ------------------------------------------------------------------------
#
# A pre-aggregator under test is ``pre(features, n_samples, f) -> (n′, D)`` (an adapter of
# :mod:`rfrs_ref.testing.adapters`); ``reference`` is rfrs-ref's pre-aggregator instance
# (:mod:`rfrs_ref.aggregate.pre`) with the hyperparameters the candidate claims. Every
# tolerance is 64u of a magnitude from the reference side: for a mixed row, per coordinate
# the magnitude rfrs-ref mixes into it, Σⱼ Mᵢⱼ|xⱼ| (bucketing: the largest among a bucket's
# rows). A row rfrs-ref leaves
# non-finite (a hostile row's own, for the rule to treat, or a bucket with a hostile
# member) is not compared, except in the bucketing law, where it must be non-finite too.


def _pre_rows(law: str, pre, X: np.ndarray, case: RoundCase, rows: int) -> np.ndarray:
    """The candidate's mixed rows on copies of X and nᵢ: a real (rows, D) array, float64."""
    try:
        out = pre(np.array(X, copy=True), np.array(case.n_samples, copy=True), case.f)
    except OutputError as exc:
        raise LawViolation(law, str(exc), **exc.details) from None
    return _real(law, out, (rows, X.shape[1]), "the pre-aggregator", "the mixed rows")


def _reference_mixing(reference, X: np.ndarray, case: RoundCase) -> np.ndarray:
    """rfrs-ref's mixing matrix M (n′ × n, float64) on the round (NumPy oracle)."""
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(X).all(axis=1)
    mx = reference.mixing(X, case.n_samples.astype(np.float64), case.f, ok,
                          np.random.default_rng(0), "numpy")
    return mx.matrix


def _mixed_scale(M: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scale, finite): per output row i and coordinate k the magnitude mixed into it,
    Σⱼ |Mᵢⱼ|·|xⱼₖ| over the rows M mixes into it (an nᵢ-weighted mean: at most their
    largest |x|; a row clipped by λ: λ|x|, not |x|: measured on the |x| of a row at 1e38
    that clipping brings to norm C, the tolerance was 64u·1e38 and a clipping that zeroed
    the row held), and per output row whether all those rows are finite."""
    A = np.abs(X.astype(np.float64))
    scale = np.zeros((M.shape[0], X.shape[1]))
    finite = np.zeros(M.shape[0], dtype=bool)
    for i in range(M.shape[0]):
        S = np.flatnonzero(M[i] != 0)
        finite[i] = bool(np.isfinite(A[S]).all())
        if finite[i] and S.size:
            scale[i] = np.abs(M[i, S]) @ A[S]
    return scale, finite


def reference_pre(pre, case: RoundCase, reference) -> None:
    """The candidate gives rfrs-ref's pre-aggregator's rows on the same round.

    Deterministic pre-aggregators (nnm, clip, arc): every row that rfrs-ref's mixes from
    finite rows, within 64u·s per coordinate (u of the features' dtype, s the magnitude
    mixed into it, Σⱼ Mᵢⱼ|xⱼ|: :func:`_mixed_scale`); a row it leaves non-finite (the rule's to treat)
    must be non-finite (NaN or ±inf) wherever rfrs-ref's is because a row it mixes is,
    its other coordinates not compared. Bucketing, whose permutation is random: the rows are a partition of
    the clients into ⌈n/s⌉ buckets, s rows each but the last, which holds the n mod s
    left over, each row the nᵢ-weighted mean of its bucket within 64u·s (a bucket with a
    non-finite member non-finite wherever its mean is)."""
    law = "reference_pre"
    X = case.features
    rows = int(reference.rows_out(case.n))
    C = _pre_rows(law, pre, X, case, rows)
    if reference.random:
        _bucket_partition(law, C, case, int(reference.bucket_size))
        return
    M = _reference_mixing(reference, X, case)
    from rfrs_ref.kernels.mixing import mix_rows_numpy

    R = mix_rows_numpy(M, X).astype(np.float64)
    scale, finite = _mixed_scale(M, X)
    u = _u(X.dtype)
    ties = _nnm_boundary_ties(X, case.f) if reference.name == "nnm" else {}
    ns = case.n_samples.astype(np.float64)
    X64 = X.astype(np.float64)
    for i in np.flatnonzero(~finite):
        # a row rfrs-ref leaves non-finite stays non-finite where a row it mixes is: a
        # finite value there (a NaN row made zeros) hands the rule a Byzantine row it
        # would count, where rfrs-ref's rule would treat it as hostile
        S = np.flatnonzero(M[i] != 0)
        owed = _inherited_nonfinite(R[i], X64[S])
        bad = np.flatnonzero(owed & np.isfinite(C[i]))
        if bad.size:
            k = int(bad[0])
            rows_k = [int(j) for j in S if not np.isfinite(X64[j, k])]
            raise LawViolation(law, f"row {int(i)}, coordinate {k}: {_r(C[i, k])}, finite, where "
                               f"rfrs-ref's {reference.name} gives {_r(R[i, k])}: row(s) {rows_k} "
                               "that it mixes into it are non-finite there (a hostile row stays "
                               "non-finite, for the rule to treat)", row=int(i), coordinate=k,
                               got=str(C[i, k]), expected=str(R[i, k]), rows=rows_k)
    for i in np.flatnonzero(finite):
        tol = 64 * u * scale[i] + TINY
        bad = np.flatnonzero(agreement.disagree(R[i], C[i], 0.0, tol))
        if bad.size and i in ties:
            # another neighbour set of the same distances: the rows tied at the boundary
            # are kept by index in rfrs-ref, in no specified order in ByzFL
            from itertools import combinations

            sure, tied, need = ties[i]
            for T in combinations(tied, need):
                S = np.array(sure + list(T))
                alt = ns[S] @ X64[S] / ns[S].sum()
                tol_alt = 64 * u * np.abs(X64[S]).max(axis=0) + TINY
                if not agreement.disagree(alt, C[i], 0.0, tol_alt).any():
                    bad = bad[:0]
                    break
        if bad.size:
            k = int(bad[0])
            mixed = [int(j) for j in np.flatnonzero(M[i] != 0)]
            raise LawViolation(law, f"row {int(i)}, coordinate {k}: {_r(C[i, k])}, rfrs-ref's "
                               f"{reference.name} gives {_r(R[i, k])} (tolerance {_r(tol[k])}; it "
                               f"mixes rows {mixed} with weights "
                               f"{[round(float(M[i, j]), 6) for j in mixed]})",
                               row=int(i), coordinate=k, got=str(C[i, k]), expected=float(R[i, k]),
                               mixed_rows=mixed)


def _nnm_boundary_ties(X: np.ndarray, f: int) -> dict:
    """Rows whose n − f nearest rows (NNM's neighbour set, squared float64 distances by
    direct differences, itself first, non-finite rows last) are decided by an exact tie:
    row -> (the rows nearer than the boundary distance, the rows at it, how many of those
    the set takes)."""
    from rfrs_ref.kernels.distances import pairwise_sq_dists

    n = X.shape[0]
    k = n - f
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(X).all(axis=1)
    D2 = pairwise_sq_dists(X, backend="numpy")
    D2[~ok, :] = np.inf
    D2[:, ~ok] = np.inf
    out = {}
    for i in np.flatnonzero(ok):
        d = D2[i].copy()
        d[i] = -1.0
        d[~ok] = np.inf
        order = np.argsort(d, kind="stable")
        if k >= n:
            continue
        b = d[order[k - 1]]
        if not (np.isfinite(b) and d[order[k]] == b):
            continue
        sure = [int(j) for j in np.flatnonzero(d < b)]
        tied = [int(j) for j in np.flatnonzero(d == b)]
        out[int(i)] = (sure, tied, k - len(sure))
    return out


def _bucket_partition(law: str, C: np.ndarray, case: RoundCase, s: int) -> None:
    """The rows of C are nᵢ-weighted means of a partition of the clients into buckets of
    s (the last of n mod s when s does not divide n), in some order but with the smaller
    bucket last. Exact cover by backtracking over the subsets that match each row."""
    n = case.n
    sizes = [s] * (n // s) + ([n % s] if n % s else [])
    options = _bucket_options(law, C, case, s)
    used = np.zeros(n, dtype=bool)

    def cover(b: int) -> bool:
        if b == len(sizes):
            return True
        for S in options[b]:
            if not used[list(S)].any():
                used[list(S)] = True
                if cover(b + 1):
                    return True
                used[list(S)] = False
        return False

    if not cover(0):
        raise LawViolation(law, f"every mixed row is the mean of some bucket, but no choice of "
                           f"buckets of sizes {sizes} uses each of the n = {n} rows exactly once",
                           bucket_size=s, sizes=sizes)


def _bucket_options(law: str, C: np.ndarray, case: RoundCase, s: int,
                    weighted: bool = True) -> list[list[tuple]]:
    """Per mixed row b of C, the buckets (tuples of client indices, of the size the b-th
    bucket has) whose nᵢ-weighted mean it is (plain mean with ``weighted=False``), to 64u
    of their magnitude; a violation where a row is the mean of none."""
    from itertools import combinations

    X = case.features.astype(np.float64)
    ns = case.n_samples.astype(np.float64) if weighted else np.ones(case.n)
    n = case.n
    sizes = [s] * (n // s) + ([n % s] if n % s else [])
    u = _u(case.features.dtype)

    def matches(b: int, S: tuple) -> bool:
        rows = X[list(S)]
        w = ns[list(S)]
        with np.errstate(all="ignore"):
            mean = (w[:, None] * rows).sum(axis=0) / w.sum()
            scale = np.abs(rows).max(axis=0)
        fin = np.isfinite(mean) & np.isfinite(scale)
        if (~fin).any() and np.isfinite(C[b][~fin]).any():
            return False  # a hostile member's coordinate must stay non-finite
        tol = 64 * u * np.where(fin, scale, 0.0) + TINY
        return not agreement.disagree(mean[fin], C[b][fin], 0.0, tol[fin]).any()

    options = []
    for b, size in enumerate(sizes):
        options.append([S for S in combinations(range(n), size) if matches(b, S)])
        if not options[-1]:
            raise LawViolation(law, f"mixed row {b} ({C[b].tolist()[:4]}...) is the nᵢ-weighted "
                               f"mean of no bucket of {size} rows (buckets of s = {s}, the last "
                               f"holding the n mod s = {n % s} left over; n = {n})",
                               row=b, bucket_size=s, sizes=sizes)
    return options


def _bucket_options_by_either_mean(law: str, C: np.ndarray, case: RoundCase,
                                   s: int) -> tuple[list[list[tuple]], bool]:
    """(:func:`_bucket_options`, weighted): the buckets told apart by their nᵢ-weighted
    means or, where those fit none, by their plain means (ByzFL's, which weighted_mixing
    reports); the weighted means' violation where neither fits."""
    try:
        return _bucket_options(law, C, case, s), True
    except LawViolation as first:
        try:
            return _bucket_options(law, C, case, s, weighted=False), False
        except LawViolation:
            raise first from None


def bucketing_partitions(n: int, s: int) -> int:
    """How many partitions of n clients into buckets of s (the last holding n mod s) there
    are: n!/((s!)^q·q!·r!), q = ⌊n/s⌋, r = n mod s."""
    q, r = divmod(n, s)
    return math.factorial(n) // (math.factorial(s) ** q * math.factorial(q) * math.factorial(r))


#: a uniformly random partition repeats on every call of bucketing_shuffles with
#: probability below 2^-SHUFFLE_BITS
SHUFFLE_BITS = 40


def bucketing_shuffles(pre, case: RoundCase, reference) -> str | None:
    """Bucketing shuffles: called again and again on the same round, it does not always cut
    the clients into the same buckets (Karimireddy et al.'s guarantee needs a random
    permutation per round: buckets fixed by position let f Byzantine clients at chosen
    positions spoil f buckets every round, and such a bucketing held every other law).

    The round's rows are told apart by the buckets whose means they are
    (:func:`_bucket_options`); an example where some mixed row is the mean of more than one
    bucket (rows too close for the dtype) compares nothing, as does one with a single
    partition (s = 1, or s ≥ n). Otherwise the candidate is called R times, R the fewest
    with P^(1−R) ≤ 2^-SHUFFLE_BITS for the P partitions, and must give two partitions."""
    law = "bucketing_shuffles"
    s = int(reference.bucket_size)
    parts = bucketing_partitions(case.n, s)
    if parts <= 1:
        return NOT_COMPARED
    calls = 1 + math.ceil(SHUFFLE_BITS / math.log2(parts))
    rows = int(reference.rows_out(case.n))
    seen = set()
    weighted = None
    for _ in range(calls):
        C = _pre_rows(law, pre, case.features, case, rows)
        if weighted is None:
            options, weighted = _bucket_options_by_either_mean(law, C, case, s)
        else:
            options = _bucket_options(law, C, case, s, weighted=weighted)
        if any(len(o) != 1 for o in options):
            return NOT_COMPARED
        seen.add(frozenset(o[0] for o in options))
        if len(seen) > 1:
            return None
    buckets = sorted(sorted(int(i) for i in S) for S in next(iter(seen)))
    raise LawViolation(law, f"{calls} calls on the same round (n = {case.n}, buckets of s = {s}: "
                       f"{parts} partitions) all gave the buckets {buckets}: the clients are not "
                       "shuffled (a random partition repeats that often with probability below "
                       f"2^-{SHUFFLE_BITS})", buckets=buckets, calls=calls, partitions=parts)


def nnm_honest_bound(pre, case: RoundCase, reference=None) -> None:
    """Every honest row's mixed row is finite and within the honest diameter Δ of it
    (at least n − f honest rows are within Δ of an honest row, so all its n − f
    neighbours are, and so is their weighted mean; docs/aggregation.md)."""
    law = "nnm_honest_bound"
    C = _pre_rows(law, pre, case.features, case, case.n)
    d2, _ = _honest_sq_diameter(case)
    bound = math.sqrt(d2)
    X = case.features.astype(np.float64)
    slack = 16 * _rounding_radius(case) + TINY
    for i in np.flatnonzero(case.honest):
        if not np.isfinite(C[i]).all():
            raise LawViolation(law, f"honest row {int(i)} becomes {C[i].tolist()}, not finite, with "
                               f"{int((~case.honest).sum())} Byzantine rows and f={case.f}", row=int(i))
        d = nrm(C[i] - X[i])
        if not d <= bound * (1 + 1e-9) + slack:
            raise LawViolation(law, f"honest row {int(i)} moves by {_r(d)}, beyond the honest "
                               f"diameter Δ = {_r(bound)} (n={case.n}, f={case.f})",
                               row=int(i), distance=d, bound=bound)


def _scaled_copy(law: str, x: np.ndarray, c: np.ndarray, u: float, i: int) -> float:
    """λ with c = λx, 0 ≤ λ ≤ 1, to rounding (64u of |x| per coordinate); a violation
    otherwise (the row grew, turned, or was not scaled uniformly)."""
    m = float(np.abs(x).max(initial=0.0))
    if m == 0.0:
        if np.abs(c).max(initial=0.0) > TINY:
            raise LawViolation(law, f"row {i} is zero and becomes {c.tolist()}", row=i)
        return 1.0
    xs, cs = x / m, c / m
    lam = float(xs @ cs) / float(xs @ xs)
    tol = 64 * u * np.abs(x) + TINY
    bad = np.flatnonzero(np.abs(c - lam * x) > tol)
    if bad.size:
        k = int(bad[0])
        raise LawViolation(law, f"row {i} is not scaled uniformly: coordinate {k} is {_r(c[k])}, "
                           f"{_r(lam)}·x gives {_r(lam * x[k])}", row=i, coordinate=k)
    if not -64 * u <= lam <= 1 + 64 * u:
        raise LawViolation(law, f"row {i} is scaled by {_r(lam)}, outside [0, 1] (a clipped row "
                           "never grows nor turns)", row=i, scale=lam)
    return lam


def clip_norm_bound(pre, case: RoundCase, reference) -> None:
    """Static clipping with rfrs-ref's C (``reference.clip_norm``): every finite row
    becomes λx with 0 ≤ λ ≤ 1 and norm at most C (to 64u), a row within the ball is
    unchanged; a non-finite row is the rule's to treat."""
    law = "clip_norm_bound"
    Cn = float(reference.clip_norm)
    C = _pre_rows(law, pre, case.features, case, case.n)
    X = case.features.astype(np.float64)
    u = _u(case.features.dtype)
    for i in range(case.n):
        if not np.isfinite(X[i]).all():
            continue
        if not np.isfinite(C[i]).all():
            raise LawViolation(law, f"finite row {i} becomes {C[i].tolist()}, not finite", row=i)
        norm_in = nrm(X[i])
        if norm_in <= Cn:
            bad = np.flatnonzero(agreement.disagree(X[i], C[i], 0.0, 64 * u * np.abs(X[i]) + TINY))
            if bad.size:
                k = int(bad[0])
                raise LawViolation(law, f"row {i} has norm {_r(norm_in)} ≤ C = {_r(Cn)} but "
                                   f"coordinate {k} changed from {_r(X[i, k])} to {_r(C[i, k])}",
                                   row=i, coordinate=k)
            continue
        _scaled_copy(law, X[i], C[i], u, i)
        norm_out = nrm(C[i])
        if not norm_out <= Cn * (1 + 64 * u) + TINY:
            raise LawViolation(law, f"row {i} (norm {_r(norm_in)}) has norm {_r(norm_out)} after "
                               f"clipping, above C = {_r(Cn)}", row=i, norm=norm_out, bound=Cn)


def arc_clipping(pre, case: RoundCase, reference=None) -> None:
    """ARC with k = ⌊2f(n − f)/n⌋: every finite row becomes λx, 0 ≤ λ ≤ 1 (none grows
    or turns), of norm at most τ, the (k + 1)-th largest norm (non-finite rows ranked
    largest), and at most k rows change (k = 0: none)."""
    from rfrs_ref.aggregate.pre import row_norms_numpy

    law = "arc_clipping"
    n, f = case.n, case.f
    k = (2 * f * (n - f)) // n
    C = _pre_rows(law, pre, case.features, case, n)
    X = case.features.astype(np.float64)
    u = _u(case.features.dtype)
    norms = row_norms_numpy(X)
    key = np.where(np.isnan(norms), np.inf, norms)
    tau = float(np.sort(key)[n - k - 1]) if k > 0 else math.inf
    changed = []
    for i in range(n):
        if agreement.disagree(X[i], C[i], 0.0, 64 * u * np.where(np.isfinite(X[i]), np.abs(X[i]), 0.0)
                              + TINY).any():
            changed.append(i)
        if not np.isfinite(X[i]).all():
            continue
        if not np.isfinite(C[i]).all():
            raise LawViolation(law, f"finite row {i} becomes {C[i].tolist()}, not finite", row=i)
        _scaled_copy(law, X[i], C[i], u, i)
        out = nrm(C[i])
        if not out <= tau * (1 + 64 * u) + TINY:
            raise LawViolation(law, f"row {i} has norm {_r(out)} after ARC, above τ = {_r(tau)}, the "
                               f"(k + 1)-th largest norm (k = ⌊2f(n − f)/n⌋ = {k}, n={n}, f={f})",
                               row=i, norm=out, threshold=tau, k=k)
    if len(changed) > k:
        raise LawViolation(law, f"{len(changed)} rows change ({changed}); ARC clips at most "
                           f"k = ⌊2f(n − f)/n⌋ = {k} (n={n}, f={f})", changed=changed, k=k)


def pre_permutation_equivariance(pre, case: RoundCase, reference):
    """pre(X[π]) = pre(X)[π]: reordering the clients reorders the mixed rows, each within
    64u of the rows rfrs-ref mixes into it (rows rfrs-ref leaves non-finite are not
    compared; rows in general position, ``distinct``)."""
    law = "permutation_equivariance"
    X, p = case.features, case.perm
    C1 = _pre_rows(law, pre, X, case, case.n)
    moved = dataclasses.replace(case, features=X[p], n_samples=case.n_samples[p],
                                honest=case.honest[p])
    C2 = _pre_rows(law, pre, X[p], moved, case.n)
    M = _reference_mixing(reference, X, case)
    scale, finite = _mixed_scale(M, X)
    u = _u(X.dtype)
    ties = _nnm_boundary_ties(X, case.f) if reference.name == "nnm" else {}
    from rfrs_ref.kernels.mixing import mix_rows_numpy

    R = mix_rows_numpy(M, X).astype(np.float64)
    compared = False
    for j, i in enumerate(p):
        if not finite[i] or int(i) in ties:  # a tie decided by the index moves with it
            continue
        tol = 64 * u * scale[i] + TINY
        bad = np.flatnonzero(agreement.disagree(C1[i], C2[j], 0.0, tol))
        if bad.size:
            k = int(bad[0])
            raise LawViolation(law, f"row {int(i)} gives {_r(C1[i, k])} at coordinate {k}, and "
                               f"{_r(C2[j, k])} when it is row {j} of the reordered round "
                               f"(order {p.tolist()})", row=int(i), coordinate=k)
        compared = compared or _compared(R[i], C1[i], C2[j])
    return None if compared else NOT_COMPARED


def pre_inputs_unchanged(pre, case: RoundCase, reference=None) -> None:
    """The pre-aggregator, called on the example's features and nᵢ themselves (every other
    law calls it on copies), leaves both byte for byte as they were, dtype and shape
    included (docs/aggregation.md: inputs are never modified; a clipping that scales the
    rows it is handed in place rewrites every client's upload), and the mixed rows it
    returns are a new array, sharing no memory with either (a clipping that returns its
    input when no row needs clipping hands the rule the uploads themselves); a second
    call, on the round with its rows permuted, leaves the first call's arrays as they
    were too."""
    law = "inputs_unchanged"

    rows = None if reference is None else _reference_mixing(reference, case.features, case).shape[0]

    def call(features, n_samples):
        try:
            out = pre(features, n_samples, case.f)
        except OutputError as exc:
            raise LawViolation(law, str(exc), **exc.details) from None
        if rows is not None:
            _real(law, out, (rows, case.D), "the pre-aggregator", "the mixed rows")
        return [("the mixed rows", out)]

    p = case.perm
    _inputs_law(law, call, {"features": np.array(case.features, copy=True),
                            "n_samples": np.array(case.n_samples, copy=True)},
                {"features": np.array(case.features[p], copy=True),
                 "n_samples": np.array(case.n_samples[p], copy=True)})


# -- attack laws --------------------------------------------------------------------------------
#
# An attack under test is ``attack(vectors) -> (D,)``: the (k, D) gradients it reads (the
# example's features) and the Byzantine vector it returns. ``reference`` is rfrs-ref's
# attack as such a callable (:func:`rfrs_ref.testing.adapters.rfrs_attack`).


def _attack_vector(law: str, attack, V: np.ndarray) -> np.ndarray:
    try:
        out = attack(np.array(V, copy=True))
    except OutputError as exc:
        raise LawViolation(law, str(exc), **exc.details) from None
    return _real(law, out, (V.shape[1],), "the attack", "the Byzantine vector")


def _mean_std(V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """μ and the sample σ (ddof 1; σ = 0 for one vector), float64."""
    X = V.astype(np.float64)
    with np.errstate(all="ignore"):
        mu = X.mean(axis=0)
        sd = X.std(axis=0, ddof=1) if X.shape[0] > 1 else np.zeros(X.shape[1])
    return mu, sd


def reference_attack(attack, case: RoundCase, reference, gain: float = 0.0,
                     exact: bool = False) -> None:
    """The candidate's Byzantine vector is rfrs-ref's on the same vectors: within
    64u·(|r| + (1 + gain)·max|x|) per coordinate (u of the vectors' dtype, r rfrs-ref's
    vector, max over the vectors at that coordinate, ``gain`` the attack's factor: |ϵ|
    for IPM, 3|z| for ALIE), bit for bit when ``exact`` (mimic: a copy). A non-finite
    reference is matched by the same non-finite value only (:mod:`rfrs_ref.agreement`)."""
    law = "reference_attack"
    V = case.features
    R = _real(law, reference(np.array(V, copy=True)), (case.D,), "rfrs-ref's attack")
    C = _attack_vector(law, attack, V)
    tol = np.zeros(case.D) if exact else _attack_tolerance(V, R, gain)
    bad = np.flatnonzero(agreement.disagree(R, C, 0.0, tol))
    if bad.size:
        k = int(bad[0])
        raise LawViolation(law, f"coordinate {k}: {_r(C[k])}, rfrs-ref's attack gives {_r(R[k])} "
                           f"(tolerance {_r(tol[k])}; k = {case.n} vectors)", coordinate=k,
                           got=str(C[k]), expected=str(R[k]))


def _attack_tolerance(V, R, gain: float) -> np.ndarray:
    """64u·(|r| + (1 + gain)·max|x|) + TINY per coordinate: u of the vectors' dtype, r
    rfrs-ref's Byzantine vector (0 where not finite), max over the finite vectors there."""
    with np.errstate(all="ignore"):
        mag = np.abs(V.astype(np.float64))
        mag = np.where(np.isfinite(mag), mag, 0.0).max(axis=0)
    return 64 * _u(V.dtype) * (np.where(np.isfinite(R), np.abs(R), 0.0) + (1 + gain) * mag) + TINY


def ipm_direction(attack, case: RoundCase, reference=None) -> str | None:
    """IPM for some ϵ: the vector is −ϵ·μ, one scalar ϵ for every coordinate (μ the
    vectors' mean; coordinates where μ is not finite are not compared)."""
    law = "ipm_direction"
    V = case.features
    C = _attack_vector(law, attack, V)
    mu, _ = _mean_std(V)
    fin = np.isfinite(mu)
    if not fin.any():
        return NOT_COMPARED
    j = int(np.flatnonzero(fin)[np.argmax(np.abs(mu[fin]))])
    eps = -C[j] / mu[j] if mu[j] != 0 else 0.0
    with np.errstate(all="ignore"):
        mag = np.abs(V.astype(np.float64)).max(axis=0)
        resid = np.abs(C + eps * mu)
    tol = 128 * _u(V.dtype) * (1 + abs(eps)) * mag + TINY
    bad = np.flatnonzero(fin & ~(resid <= tol))
    if bad.size:
        k = int(bad[0])
        raise LawViolation(law, f"the vector is no multiple −ϵ·μ of the mean: ϵ = {_r(eps)} from "
                           f"coordinate {j}, but coordinate {k} is {_r(C[k])} where −ϵ·μ = "
                           f"{_r(-eps * mu[k])}", coordinate=k, epsilon=eps)


def alie_form(attack, case: RoundCase, reference=None) -> str | None:
    """ALIE for some z: the vector is μ − z·σ, one scalar z for every coordinate (μ the
    mean, σ the sample standard deviation, ddof 1, of the vectors; σ = 0 for a single
    vector, which is then the vector returned); coordinates where μ or σ is not finite
    are not compared."""
    law = "alie_form"
    V = case.features
    C = _attack_vector(law, attack, V)
    mu, sd = _mean_std(V)
    fin = np.isfinite(mu) & np.isfinite(sd)
    if not fin.any():
        return NOT_COMPARED
    j = int(np.flatnonzero(fin)[np.argmax(sd[fin])])
    z = (mu[j] - C[j]) / sd[j] if sd[j] > 0 else 0.0
    with np.errstate(all="ignore"):
        mag = np.abs(V.astype(np.float64)).max(axis=0)
        resid = np.abs(C - (mu - z * sd))
    tol = 256 * _u(V.dtype) * (1 + abs(z)) * mag + TINY
    bad = np.flatnonzero(fin & ~(resid <= tol))
    if bad.size:
        k = int(bad[0])
        raise LawViolation(law, f"the vector is not μ − z·σ for one z: z = {_r(z)} from coordinate "
                           f"{j}, but coordinate {k} is {_r(C[k])} where μ − z·σ = "
                           f"{_r(mu[k] - z * sd[k])} (k = {case.n} vectors"
                           + ("; one vector has no spread: σ = 0" if case.n == 1 else "") + ")",
                           coordinate=k, z=float(z))


def mimic_copy(attack, case: RoundCase, reference=None) -> None:
    """Mimic: the vector is one of the vectors it was given, bit for bit."""
    law = "mimic_copy"
    V = case.features.astype(np.float64)
    C = _attack_vector(law, attack, case.features)
    for row in V:
        if np.array_equal(row, C, equal_nan=True):
            return
    raise LawViolation(law, f"the vector {C.tolist()[:4]}... is none of the {case.n} vectors given")


def inf_nonfinite(attack, case: RoundCase, reference=None) -> None:
    """Inf: every coordinate of the vector is non-finite (+inf in ByzFL and rfrs-ref's
    default; −inf and NaN are rfrs-ref's variants)."""
    law = "inf_nonfinite"
    C = _attack_vector(law, attack, case.features)
    fin = np.flatnonzero(np.isfinite(C))
    if fin.size:
        k = int(fin[0])
        raise LawViolation(law, f"coordinate {k} is finite: {_r(C[k])}", coordinate=k)


def attack_permutation_invariance(attack, case: RoundCase, reference, gain: float = 0.0):
    """attack(V[π]) = attack(V): the order of the vectors does not matter (their mean and
    spread do not depend on it), within reference_attack's tolerance."""
    law = "permutation_invariance"
    V, p = case.features, case.perm
    C1 = _attack_vector(law, attack, V)
    C2 = _attack_vector(law, attack, V[p])
    R = _real(law, reference(np.array(V, copy=True)), (case.D,), "rfrs-ref's attack")
    tol = _attack_tolerance(V, R, gain)
    bad = np.flatnonzero(agreement.disagree(C1, C2, 0.0, tol))
    if bad.size:
        k = int(bad[0])
        raise LawViolation(law, f"coordinate {k}: {_r(C1[k])} on the vectors, {_r(C2[k])} on the "
                           f"same vectors in the order {p.tolist()}", coordinate=k)
    return None if _compared(R, C1, C2) else NOT_COMPARED


def attack_inputs_unchanged(attack, case: RoundCase, reference=None) -> None:
    """The attack, called on the example's vectors themselves (every other law calls it on
    copies), leaves them byte for byte as they were, dtype and shape included
    (docs/attacks.md: honest rows, the gradients and the state are never modified), and
    the Byzantine vector it returns is a new array, sharing no memory with them (mimic's
    is a copy of an honest row, not that row: a view turns into whatever the row later
    holds); a second call, on the vectors in another order, leaves the first call's
    vectors as they were too."""
    law = "inputs_unchanged"

    def call(vectors):
        try:
            out = attack(vectors)
        except OutputError as exc:
            raise LawViolation(law, str(exc), **exc.details) from None
        _real(law, out, (case.D,), "the attack", "the Byzantine vector")
        return [("the Byzantine vector", out)]

    _inputs_law(law, call, {"vectors": np.array(case.features, copy=True)},
                {"vectors": np.array(case.features[case.perm], copy=True)})


# -- federated rounds ---------------------------------------------------------------------------

def round_record_invariants(record: dict) -> None:
    """Invariants of one round record of the round loop (docs/training.md): weights convex,
    kept fractions in [0, 1], no honest client excluded by verification (honest
    uploads always pass), f_rule = max(0, f − excluded)."""
    law = "round_record"
    w = record.get("weights")
    if w is not None:
        w = np.asarray(w, dtype=np.float64)
        # written so that a NaN weight fails (every comparison with NaN is false)
        if not ((w >= 0).all() and abs(w.sum() - 1) <= 64 * U64 * max(1, w.size)):
            raise LawViolation(law, f"round {record['round']}: weights {w.tolist()} are not convex")
    kept = np.asarray(record["kept"], dtype=np.float64)
    if not ((kept >= 0) & (kept <= 1)).all():  # a NaN fraction fails too
        raise LawViolation(law, f"round {record['round']}: kept fractions {kept.tolist()} leave [0, 1]")
    honest_out = [e for e in record["excluded"] if not e["byzantine"]]
    if honest_out:
        raise LawViolation(law, f"round {record['round']}: honest client {honest_out[0]['client']} "
                           f"failed verification ({honest_out[0]['check']})", excluded=honest_out)
    if record["f_rule"] != max(0, record["f"] - len(record["excluded"])):
        raise LawViolation(law, f"round {record['round']}: f_rule = {record['f_rule']} but f = "
                           f"{record['f']} with {len(record['excluded'])} exclusions")


__all__ = [
    "LawViolation", "bulyan_range", "camouflage_same_theta", "camouflage_upload_dtype",
    "cc_byzantine_pull", "coordinate_range", "finite_output",
    "hull_distance", "krum_kept_bound", "krum_output_bound", "lemma2", "mda_kept_diameter",
    "mda_output_bound", "meamed_range", "monna_pivot_bound", "nrm", "permutation_invariance",
    "recovery_exact", "reference_rule", "round_record_invariants", "smea_eigen_bound", "theorem1", "theorem2", "theorem3", "theorem4",
    "translation_equivariance", "unanimity", "update_rule", "weighted_mean", "weights_sum_to_one",
    # pre-aggregators and attacks
    "alie_form", "arc_clipping", "attack_permutation_invariance", "bucketing_shuffles", "clip_norm_bound",
    "inf_nonfinite",
    "ipm_direction", "mimic_copy", "nnm_honest_bound", "pre_permutation_equivariance", "reference_attack",
    "reference_pre",
    # every family
    "attack_inputs_unchanged", "inputs_unchanged", "pre_inputs_unchanged", "rule_inputs_unchanged",
]
