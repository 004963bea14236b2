"""When does a candidate value agree with a reference value? One rule for every checking tool.

The golden-vector check (:mod:`rfrs_ref.golden`), the trace comparison
(:mod:`rfrs_ref.trace`) and the conformance laws (:mod:`rfrs_ref.testing`)
compare what an implementation under test produced (the *candidate*) with
what it should have produced (the *reference*). They all use this module, so
that the rule is the same everywhere:

- A finite reference value r is matched by a finite candidate value c with
  ``|c − r| ≤ atol + rtol·|r|``. The tolerance is computed from the
  reference's magnitude only: a candidate cannot widen its own tolerance by
  being large (with ``max(|c|, |r|)`` a candidate of +inf would have an
  infinite tolerance and agree with anything).
- A non-finite candidate (NaN, ±inf) where the reference is finite is a
  disagreement, whatever the tolerance.
- A non-finite reference is matched only by the same non-finite value: NaN
  by NaN, +inf by +inf, −inf by −inf. The reference holding NaN means the
  computation itself is undefined there (e.g. a Byzantine row that is NaN), and
  an implementation that reproduces it agrees.
- Exact comparison is the same rule with ``rtol = atol = 0``.

``rtol`` and ``atol`` must be finite and non-negative (a tolerance read from a
file is input like any other: :func:`check_tolerance` rejects NaN, inf and
negative values with a one-line message). A value too large for a float
(a JSON integer with hundreds of digits) counts as ±inf.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def check_tolerance(rtol, atol, where: str = "tolerance") -> tuple[float, float]:
    """``(rtol, atol)`` as floats; raises ValueError unless both are finite numbers ≥ 0
    (the message names ``where``)."""
    out = []
    for name, v in (("rtol", rtol), ("atol", atol)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ValueError(f"{where}: {name} must be a number, got {v!r}")
        f = as_float(v)
        if not (math.isfinite(f) and f >= 0.0):
            raise ValueError(f"{where}: {name} must be finite and ≥ 0, got {v!r}")
        out.append(f)
    return out[0], out[1]


def as_float(x) -> float:
    """``float(x)``, with an integer too large for a float mapped to ±inf (not OverflowError)."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def tolerance(reference, rtol: float = 0.0, atol=0.0) -> np.ndarray:
    """``atol + rtol·|reference|`` where the reference is finite (float64; ``atol`` may be
    an array broadcasting against ``reference``)."""
    r = np.asarray(reference, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(atol, dtype=np.float64) + rtol * np.abs(np.where(np.isfinite(r), r, 0.0))


def disagree(reference, candidate, rtol: float = 0.0, atol=0.0) -> np.ndarray:
    """Elementwise: True where ``candidate`` does not agree with ``reference`` (the
    module's rule). The two broadcast together; both are read as float64."""
    r = np.asarray(reference, dtype=np.float64)
    c = np.asarray(candidate, dtype=np.float64)
    tol = tolerance(r, rtol, atol)
    fin_r, fin_c = np.isfinite(r), np.isfinite(c)
    with np.errstate(over="ignore", invalid="ignore"):
        close = fin_r & fin_c & (np.abs(c - r) <= tol)
    same_special = ~fin_r & ((np.isnan(r) & np.isnan(c)) | (np.isinf(r) & (c == r)))
    return ~(close | same_special)


def agrees(reference, candidate, rtol: float = 0.0, atol: float = 0.0) -> bool:
    """Scalar form of :func:`disagree` for Python numbers (a huge int counts as ±inf).

    The same rule in plain Python float arithmetic (IEEE float64, as NumPy's: the same
    operations in the same order, so the same verdict on every input), since a trace
    or a golden case compares numbers one at a time and a NumPy call per number took
    most of a comparison's time."""
    r, c = as_float(reference), as_float(candidate)
    if not math.isfinite(r):
        return math.isnan(c) if math.isnan(r) else c == r
    if not math.isfinite(c):
        return False
    # as tolerance(): atol + rtol·|r|; a difference or tolerance that overflows is +inf
    return abs(c - r) <= as_float(atol) + as_float(rtol) * abs(r)


def first_disagreement(reference, candidate, rtol: float = 0.0, atol=0.0) -> dict[str, Any] | None:
    """None when every element agrees; else ``{"index", "reference", "candidate",
    "tolerance", "count", "size"}`` of the first element (C order) that does not.
    ``reference`` and ``candidate`` must have the same shape."""
    r = np.asarray(reference, dtype=np.float64)
    c = np.asarray(candidate, dtype=np.float64)
    if r.shape != c.shape:
        raise ValueError(f"shapes differ: reference {r.shape}, candidate {c.shape}")
    bad = disagree(r, c, rtol, atol)
    if not bad.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
    tol = np.broadcast_to(tolerance(r, rtol, atol), r.shape)
    return {"index": idx, "reference": float(r[idx]), "candidate": float(c[idx]),
            "tolerance": float(tol[idx]), "count": int(bad.sum()), "size": int(bad.size)}


def describe(reference: float, candidate: float, tol: float, ref_name: str = "the reference") -> str:
    """Why two scalars disagree, in words (for reports); ``ref_name`` names the reference."""
    if math.isfinite(reference) and not math.isfinite(candidate):
        return f"{candidate!r} where {ref_name} is finite"
    if not math.isfinite(reference):
        return f"{ref_name} is {reference!r}; only the same value matches it"
    bar = "|reference|" if ref_name == "the reference" else f"|{ref_name}|"
    return f"|Δ| = {abs(candidate - reference):.3g} > atol + rtol·{bar} = {tol:.3g}"


__all__ = ["agrees", "as_float", "check_tolerance", "describe", "disagree", "first_disagreement",
           "tolerance"]
