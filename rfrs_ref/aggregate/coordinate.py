"""``median``, ``trmean`` and ``meamed``: coordinate-wise rules (docs/aggregation.md)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from rfrs_ref.aggregate.base import AggregationResult, Rule, fallback_field
from rfrs_ref.kernels.coordinatewise import coordinatewise_combine


def _run(X, arrays, n_samples, t, backend):
    out, kept, bad = coordinatewise_combine(X, arrays, n_samples, mode="trim", t=t, backend=backend)
    D = X.shape[1]
    return AggregationResult(out, None, kept / D, {"trim": t, "nonfinite_kept_coordinates": bad})


@dataclasses.dataclass(frozen=True)
class Median(Rule):
    r"""Coordinate-wise median (Yin et al. 2018) on the detection features.

    Formula: at every coordinate k the clients are ranked by their feature
    value xᵢₖ; the middle one (odd n) or the two middle ones (even n) are kept,
    and every uploaded array is combined at k over the kept clients with
    weights ∝ nᵢ:

        Āₖ = Σ_{i kept at k} nᵢ · A[i, k] / Σ_{i kept at k} nᵢ

    Conventions: the choice of clients is unweighted (nᵢ cannot buy a client
    its way into the middle); for odd n the aggregate of the features is the
    median exactly; for even n it is the nᵢ-weighted mean of the two middle
    values, i.e. np.median when the two clients have equal nᵢ. Ties of value go
    to the smaller client index. Values are ordered as by ``np.sort``: −inf
    lowest, +inf highest, NaN (no order) as +inf; a finite feature whose row
    holds a NaN or ±inf in any upload at that coordinate ranks as +inf. So the
    median of [1, 2, 3, 4, −inf] is 2, as ``np.median`` says. ``kept[i]`` is
    the fraction of coordinates at which client i is one of the middle values.

    Guarantee (tested): with at most f < n/2 arbitrary values at a coordinate,
    the aggregated feature lies within the honest values' range there, and so
    does every other array when the uploads are ordered like the features
    (e.g. θ with parameter features): the kept clients are the same. An upload
    not tied to the features (v with gradient features) has no such guarantee.

    Reference: D. Yin, Y. Chen, K. Ramchandran, P. Bartlett, "Byzantine-Robust
    Distributed Learning: Towards Optimal Statistical Rates", ICML 2018.

    Precondition: f < n/2 (n > 2f).
    """

    fallback: str = fallback_field()

    name: ClassVar[str] = "median"
    coordinatewise: ClassVar[bool] = True
    trims_by_column: ClassVar[bool] = True

    def _trim(self, n: int, f: int) -> int:
        return (n - 1) // 2

    def _condition(self, n: int, f: int) -> str | None:
        return None if n > 2 * f else "f < n/2 (n > 2f)"

    def _aggregate(self, X, arrays, n_samples, f, backend):
        return _run(X, arrays, n_samples, (X.shape[0] - 1) // 2, backend)


@dataclasses.dataclass(frozen=True)
class TrimmedMean(Rule):
    r"""Coordinate-wise trimmed mean (Yin et al. 2018) on the detection features.

    Formula: at every coordinate k the f largest and the f smallest feature
    values are removed; every uploaded array is combined at k over the n − 2f
    remaining clients with weights ∝ nᵢ:

        Āₖ = Σ_{i kept at k} nᵢ · A[i, k] / Σ_{i kept at k} nᵢ

    Conventions: the choice is unweighted (by rank, as in Yin et al.), the
    combination is weighted by nᵢ (weights proportional to nᵢ over the
    clients the rule kept, docs/aggregation.md). With equal nᵢ this is Yin et al.'s trimmed
    mean exactly; Flower and ByzFL always take the plain mean of the kept
    values (see docs/aggregation.md). With f = 0 it is the ``mean`` rule.
    Ranking as in :class:`Median` (ties by index; −inf lowest, +inf and NaN
    highest; a finite feature with a non-finite upload value as +inf).
    Coordinate-wise, not by norm: the paper's appendix describes Trmean as
    removing "model parameters with large norms or small norms", but the rule it cites (Yin et al.) is coordinate-wise.

    Guarantee (tested): with at most f arbitrary values at a coordinate, the
    aggregated feature lies within the honest values' range there.

    Reference: D. Yin, Y. Chen, K. Ramchandran, P. Bartlett, ICML 2018.

    Precondition: n > 2f.
    """

    fallback: str = fallback_field()

    name: ClassVar[str] = "trmean"
    coordinatewise: ClassVar[bool] = True
    trims_by_column: ClassVar[bool] = True

    def _trim(self, n: int, f: int) -> int:
        return f

    def _condition(self, n: int, f: int) -> str | None:
        return None if n > 2 * f else "n > 2f"

    def _aggregate(self, X, arrays, n_samples, f, backend):
        return _run(X, arrays, n_samples, f, backend)


@dataclasses.dataclass(frozen=True)
class Meamed(Rule):
    r"""Mean around the median (Xie, Koyejo, Gupta 2018), coordinate-wise on the
    detection features.

    Formula: at every coordinate k, with med the median of the n feature values
    (for even n the mean of the two middle ones), keep the n − f clients whose
    values are closest to med, and combine every uploaded array at k over them
    with weights ∝ nᵢ:

        Āₖ = Σ_{i kept at k} nᵢ · A[i, k] / Σ_{i kept at k} nᵢ

    Conventions: the n − f closest values form a window of consecutive ranks,
    found by removing f times the end of the window farther from med, the
    upper one on a tie (Bulyan's window with f removals instead of 2f; ranks
    tie by client index; values ordered as in :class:`Median`). ByzFL's
    ``Meamed`` picks the closest by ``argpartition`` of |xᵢₖ − med|, whose
    order among equal distances is unspecified, and takes the plain mean: the
    same for equal nᵢ and distinct distances. With f = 0 it is the ``mean``
    rule.

    Hostile input: a NaN or ±inf is the farthest value from a finite median,
    so it is removed first; it is kept only when more than f values at that
    coordinate are extreme (``nonfinite_kept_coordinates`` counts them).

    Guarantee (tested): with at most f < n/2 arbitrary values at a coordinate,
    med lies within the honest values' range [lo, hi] and every kept value is
    no farther from med than some honest value left out (n − f kept, at least
    n − f honest), so the aggregate lies within [med − w′, med + w′],
    w′ = max(med − lo, hi − med) ≤ hi − lo.

    Reference: C. Xie, O. Koyejo, I. Gupta, "Generalized Byzantine-tolerant
    SGD", arXiv:1802.10116 (2018).

    Precondition: n > 2f.
    """

    fallback: str = fallback_field()

    name: ClassVar[str] = "meamed"
    coordinatewise: ClassVar[bool] = True
    trims_by_column: ClassVar[bool] = True
    window: ClassVar[str] = "nearest"

    def _trim(self, n: int, f: int) -> int:
        return f

    def _window_diagnostics(self, t: int, bad: int) -> dict:
        return {"removed": t, "nonfinite_kept_coordinates": bad}

    def _condition(self, n: int, f: int) -> str | None:
        return None if n > 2 * f else "n > 2f"

    def _aggregate(self, X, arrays, n_samples, f, backend):
        out, kept, bad = coordinatewise_combine(X, arrays, n_samples, mode=self.window, t=f,
                                                backend=backend)
        D = X.shape[1]
        return AggregationResult(out, None, kept / D, self._window_diagnostics(f, bad))
