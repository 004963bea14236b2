"""The interface of aggregation rules (docs/aggregation.md).

A rule sees the round's detection features ``X`` (n × D): the recovered
gradients (``detect = gradient``) or the uploaded parameters minus the server's
(``detect = parameter``, see :func:`parameter_features`); the uploaded arrays
(θ, m, v, r), the clients' training-set sizes nᵢ and the assumed number of
Byzantine clients f. It decides on the features, and applies the same decision
to every uploaded array:

- per-client rules (mean, krum, rfa, mda, monna, cc, caf, smea) give weights wᵢ ≥ 0, Σ wᵢ = 1, and every
  array is aggregated as ``Σᵢ wᵢ · A[i]``;
- coordinate-wise rules (median, trmean, bulyan, meamed) choose at every coordinate a
  set of kept clients on the features, and every array is aggregated at that
  coordinate over those clients with weights ∝ nᵢ.

So with equal weights per client at every coordinate the aggregated second
moment stays a convex combination of non-negative uploads.

Hostile input: a client whose feature row, or any of whose uploaded rows,
holds a NaN or ±inf is treated as infinitely far by the per-client robust rules
(it gets weight 0), and its value at such a coordinate is ranked as an extreme
by the coordinate-wise rules. Only ``mean`` (no defence) lets it through.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import ClassVar, Mapping

import numpy as np

from rfrs_ref.jsonsafe import jsonable  # noqa: F401  (re-exported for the rules)
from rfrs_ref.params import check_kinds, hyper, values

BACKENDS = ("numpy", "numba", "cuda")

#: What a rule does when n and f violate its precondition.
FALLBACKS = ("error", "reduce-f", "mean")

#: Detection spaces (docs/aggregation.md): what the rows of ``features`` are.
DETECT = ("gradient", "parameter")


class PreconditionError(ValueError):
    """A rule's precondition on the number of clients n and the assumed number of
    Byzantine clients f does not hold (the message names n, f and the condition)."""

    def __init__(self, rule: str, n: int, f: int, condition: str, detail: str = "") -> None:
        self.rule, self.n, self.f, self.condition = rule, n, f, condition
        msg = f"{rule} needs {condition}, but n={n} and f={f}"
        if detail:
            msg += f" ({detail})"
        # advice that can help: with f = 0 already, only more clients (or a fallback) can
        ways = (["lower the assumed Byzantine fraction (--assumed-byzantine)"] if f > 0 else [])
        ways += ["sample more clients per round (--client-fraction)",
                 "set the rule's fallback to 'reduce-f' or 'mean' (--fallback, or the "
                 "defense_params field 'fallback')"]
        msg += "; " + ", ".join(ways[:-1]) + ", or " + ways[-1]
        super().__init__(msg)


class NothingFinite(ValueError):
    """Every client the rule would aggregate holds NaN or ±inf in its features or uploads.

    Not a configuration error but a round's input: Byzantine clients may upload
    non-finite values, and with update-rule verification off (SGD, ``--no-verify``) a
    round may hold nothing else (every sampled client Byzantine). A rule that drops
    non-finite clients raises it when nothing is left; the round loop then keeps the
    server state as it is for that round, as it does when verification excludes every
    upload (docs/aggregation.md, "Hostile input")."""


@dataclasses.dataclass
class AggregationResult:
    """What a rule returns.

    Attributes:
        arrays: name -> aggregated (D,) array, one per uploaded array, in the
            upload's dtype (sums are float64 internally).
        weights: (n,) float64 per-client weights (≥ 0, sum 1) for per-client rules;
            None for coordinate-wise rules, whose weights vary by coordinate.
        kept: (n,) float64 in [0, 1]: the fraction of coordinates at which the
            client's value takes part in the aggregate (1 or 0 for per-client
            rules: 1 iff its weight is positive).
        diagnostics: strict-JSON facts about the decision (lists, not arrays;
            ``None`` where a score or distance is infinite): the rule, n, f, the
            f actually used, scores, selected ids, iterations, convergence,
            fallback...
        state: the rule's state for the next round, for rules that keep one
            (``state_arrays``, e.g. ``cc``'s centre); None for the others.
    """

    arrays: dict[str, np.ndarray]
    weights: np.ndarray | None
    kept: np.ndarray
    diagnostics: dict
    state: dict | None = None


@dataclasses.dataclass(frozen=True)
class Rule(abc.ABC):
    """An aggregation rule: a frozen dataclass whose fields are hyperparameters.

    Subclasses set ``name`` and ``coordinatewise``, implement ``_condition`` (the
    precondition on n and f, or None) and ``_aggregate`` (the rule proper, called
    with validated inputs and the f to use).
    """

    name: ClassVar[str] = ""
    coordinatewise: ClassVar[bool] = False
    #: False for rules that never read the features (the round loop may skip building them)
    uses_features: ClassVar[bool] = True
    #: True for rules whose weights are a function of the nᵢ alone (:meth:`fixed_weights`),
    #: whatever the uploads: the server may then sum while it verifies (``sums=``)
    has_fixed_weights: ClassVar[bool] = False
    #: True for rules whose result arrays are ``combine(arrays, result.weights)`` and that
    #: read the uploads for nothing else than their finiteness: given a
    #: :class:`FiniteUploads` with no array at all, such a rule returns its weights and
    #: diagnostics (and no arrays), and the caller may compute the weighted sums itself
    #: (the round that recomputes its uploads, docs/performance.md)
    combines_by_weights: ClassVar[bool] = False
    #: the rule's weights are a function of the features' pairwise squared distances
    #: and of which clients are finite, nothing else (Krum): :meth:`from_distances`
    #: takes them from a distance matrix the caller computed (a round that computes the
    #: rows the clients share once, docs/performance.md, "Robust rounds on shared rows")
    weighs_by_distances: ClassVar[bool] = False
    #: such a rule's distances are float64 differences with an error bound (RFA's
    #: Weiszfeld steps on the matrix), not the blocked kernel's (Krum)
    distances64: ClassVar[bool] = False
    #: the rule keeps, at each coordinate, a window of ranks of that coordinate's
    #: features alone (:attr:`window` "trim": median, trimmed mean; "nearest": Meamed),
    #: so on columns where every client of a class holds the same values it needs them
    #: once per class (:meth:`aggregate_by_columns`; docs/performance.md, "Robust rounds
    #: on shared rows")
    trims_by_column: ClassVar[bool] = False
    #: such a rule's window (``coordinatewise_combine``'s ``mode``)
    window: ClassVar[str] = "trim"
    #: the rule selects its candidates by the features' pairwise distances, then keeps a
    #: window of each coordinate's ranks among them (Bulyan): :meth:`aggregate_by_columns`
    #: with the distances the caller computed
    selects_by_distances: ClassVar[bool] = False

    def fixed_weights(self, n_samples: np.ndarray) -> np.ndarray:
        """(n,) the weights of a rule with ``has_fixed_weights``, from the nᵢ."""
        raise TypeError(f"{self.name}'s weights depend on the uploads: it has no fixed weights")

    def __post_init__(self) -> None:
        check_kinds(self)
        fb = getattr(self, "fallback", "error")
        if fb not in FALLBACKS:
            raise ValueError(f"{self.name} fallback must be one of {', '.join(FALLBACKS)}, got {fb!r}")

    # -- precondition -------------------------------------------------------------
    def _condition(self, n: int, f: int) -> str | None:
        """The violated precondition as text (e.g. "n > 2f + 2"), or None if it holds."""
        return None

    def check(self, n: int, f: int) -> None:
        """Raise :class:`PreconditionError` unless the rule can run with n clients
        of which at most f are Byzantine (ignores the fallback)."""
        _check_counts(n, f)
        cond = self._condition(n, f)
        if cond is not None:
            raise PreconditionError(self.name, n, f, cond)

    def _resolve_f(self, n: int, f: int) -> tuple[int | None, dict | None]:
        """The f to run with (None: run the mean), and the fallback record if any."""
        cond = self._condition(n, f)
        if cond is None:
            return f, None
        action = getattr(self, "fallback", "error")
        if action == "error":
            raise PreconditionError(self.name, n, f, cond)
        record = {"reason": f"{self.name} needs {cond}, but n={n} and f={f}", "action": action}
        if action == "reduce-f":
            for f2 in range(f - 1, -1, -1):
                if self._condition(n, f2) is None:
                    record["f_used"] = f2
                    return f2, record
            record["action"] = "mean"
            record["reason"] += f"; no f ≥ 0 satisfies it with n={n}, so the mean is used"
        record["f_used"] = None
        return None, record

    # -- the rule -----------------------------------------------------------------
    def aggregate(
        self,
        features: np.ndarray,
        arrays: Mapping[str, np.ndarray],
        n_samples: np.ndarray,
        f: int,
        *,
        backend: str = "numba",
    ) -> AggregationResult:
        """Aggregate the round's uploads.

        Args:
            features: (n, D) detection features (float32 or float64).
            arrays: name -> (n, D) uploaded arrays (θ, m, v, r), same n and D.
            n_samples: (n,) the clients' training-set sizes nᵢ (> 0).
            f: the assumed number of Byzantine clients (0 ≤ f).
            backend: ``"numpy"`` (float64 oracle), ``"numba"`` or ``"cuda"``.

        Inputs are never modified. Raises :class:`PreconditionError` when n and f
        violate the rule's precondition and its fallback is ``"error"``.
        """
        X, mats, w = validate_inputs(features, arrays, n_samples, f, backend)
        n = X.shape[0]
        f_used, record = self._resolve_f(n, f)
        if f_used is None:
            from rfrs_ref.aggregate.mean import Mean

            res = Mean()._aggregate(X, mats, w, 0, backend)
        else:
            res = self._aggregate(X, mats, w, f_used, backend)
        return self._described(res, n, f, f_used, record, backend)

    def from_sums(self, sums: Mapping[str, np.ndarray], n_samples: np.ndarray, f: int, *,
                  backend: str = "numba") -> AggregationResult:
        """The result of a rule with fixed weights whose sums the caller computed.

        ``sums[name] = Σᵢ wᵢ·A[i]`` with wᵢ = :meth:`fixed_weights` of the nᵢ, over every
        client (the server's one pass, ``Optimizer.screen_sum_batch``, which sums while
        it verifies, a batch of clients at a time). The result, weights and diagnostics
        are those :meth:`aggregate` returns for the same uploads.
        """
        if not self.has_fixed_weights:
            raise TypeError(f"{self.name} cannot take precomputed sums: its weights depend on "
                            "the uploads")
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
        n = np.shape(n_samples)[0] if np.ndim(n_samples) == 1 else -1
        _check_counts(n, f)
        w = sample_sizes(n_samples, n)
        f_used, record = self._resolve_f(n, f)
        res = AggregationResult(dict(sums), self.fixed_weights(w), np.ones(n), {})
        return self._described(res, n, f, f_used, record, backend)

    def from_distances(self, D2: np.ndarray, finite: np.ndarray, n_samples: np.ndarray, f: int,
                       *, backend: str = "numba", error: float | None = None) -> AggregationResult:
        """The weights, kept clients and diagnostics of a rule with ``weighs_by_distances``,
        from the features' squared distances; the result holds no arrays (the caller
        computes Σᵢ wᵢ·A[i] itself, e.g. with
        :func:`~rfrs_ref.aggregate.combine.add_rows_inplace`).

        Args:
            D2: float64 (n, n) symmetric squared distances between the clients' features,
                as :func:`~rfrs_ref.kernels.distances.pairwise_sq_dists` computes them
                (+inf where a pair involves a non-finite feature; never NaN).
            finite: (n,) bool, the clients whose feature and uploads are finite.
            n_samples: (n,) the clients' training-set sizes nᵢ (> 0).
            f: the assumed number of Byzantine clients.
            error: for a rule with ``distances64`` (RFA), whose steps run on float64
                differences: D2's relative error bound between finite clients
                (``pairwise_sq_dists64_by_parts``'s); such a rule raises
                :class:`NeedsRows` where its iteration on the rows would need the rows.

        The same weights, kept clients and diagnostics as :meth:`aggregate` on features
        whose distances are ``D2`` (the fallback of a violated precondition included).
        """
        if not self.weighs_by_distances:
            raise TypeError(f"{self.name}'s weights are not a function of the distances alone")
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
        D2 = np.asarray(D2, dtype=np.float64)
        n = D2.shape[0] if D2.ndim == 2 else -1
        if D2.shape != (n, n) or np.isnan(D2).any():
            raise ValueError(f"D2 must be a square (n, n) matrix of squared distances without "
                             f"NaN, got shape {D2.shape}")
        finite = np.asarray(finite, dtype=bool)
        if finite.shape != (n,):
            raise ValueError(f"finite must hold one flag per client, shape ({n},), got {finite.shape}")
        _check_counts(n, f)
        w = sample_sizes(n_samples, n)
        f_used, record = self._resolve_f(n, f)
        if f_used is None:
            from rfrs_ref.aggregate.mean import Mean

            res = AggregationResult({}, Mean().fixed_weights(w), np.ones(n), {})
        else:
            res = self._from_distances(D2, finite, w, f_used, error)
        return self._described(res, n, f, f_used, record, backend)

    def aggregate_by_columns(self, parts, shared, cls: np.ndarray, n_samples: np.ndarray, f: int,
                             *, backend: str = "numba", distances=None) -> AggregationResult:
        """:meth:`aggregate` of a rule with ``trims_by_column`` (or ``selects_by_distances``)
        on rows given by columns: ``parts``, a list of (features (n, Dₚ), uploads
        {name: (n, Dₚ)}), of (θ (n, Dₚ), uploads, θ̄ (Dₚ,)), whose features are θᵢ − θ̄,
        or of (X, uploads, base, coef), whose features are ``derived_features(X, base,
        coef)``, computed where the kernel reads them (``coordinatewise_combine(...,
        base=, coef=)``;
        a rule that ``selects_by_distances`` takes the former only), and ``shared``, (features (c, S), uploads {name: (c, S)}) where
        row i holds row ``cls[i]``; ``distances``, for a rule that selects by them, the
        squared distances of the whole rows' features and which clients are finite
        (``(D2, finite)`` as :meth:`from_distances` takes them).

        Returns the result of :meth:`aggregate` on the whole rows (their columns in the
        order parts, then shared), bit for bit given the distances, except that
        ``arrays[name]`` is the list of its (Dₚ,) pieces, then its (S,) piece. Raises
        :class:`NeedsRows` where the whole rows are needed (a shared feature not finite;
        a precondition whose fallback is the mean). The numba backend.
        """
        if not (self.trims_by_column or self.selects_by_distances):
            raise TypeError(f"{self.name} does not combine each column by a window of ranks")
        if backend != "numba":
            raise ValueError(f"aggregate_by_columns runs on the numba backend, not {backend!r}")
        from rfrs_ref.kernels.coordinatewise import coordinatewise_combine, window_shared_combine

        cls = np.asarray(cls, dtype=np.int64)
        n = cls.shape[0]
        _check_counts(n, f)
        w = sample_sizes(n_samples, n)
        f_used, record = self._resolve_f(n, f)
        if f_used is None:
            raise NeedsRows(f"{self.name}: its fallback is the mean of the whole rows")
        rows, t, diag = self._column_plan(n, f_used, distances)
        pieces, kept, bad, D = [], np.zeros(n, dtype=np.int64), 0, 0
        for X, arrays, *derive in parts:
            base, coef = (*derive, None, None)[:2]
            if np.shape(X)[1] == 0:
                pieces.append({k: np.zeros(0, dtype=np.asarray(v).dtype) for k, v in arrays.items()})
                continue
            out, k_p, b_p = coordinatewise_combine(X, arrays, w, mode=self.window, t=t,
                                                   rows=rows, backend=backend,
                                                   base=base, coef=coef)
            pieces.append(out)
            kept += k_p
            bad += b_p
            D += np.shape(X)[1]
        sel = np.arange(n) if rows is None else rows  # the candidates, in the kernel's order
        res = window_shared_combine(shared[0], shared[1], cls[sel], w[sel], mode=self.window, t=t)
        if res is None:
            raise NeedsRows(f"{self.name}: a shared column holds a value that is not finite, "
                            "or its weighted sum overflows")
        pieces.append(res[0])
        kept[sel] += res[1]
        D += np.shape(shared[0])[1]
        arrays_out = {k: [p[k] for p in pieces] for k in shared[1]}
        result = AggregationResult(arrays_out, None, kept / D,
                                   {**diag, **self._window_diagnostics(t, bad)})
        return self._described(result, n, f, f_used, record, backend)

    def aggregate_copies(self, features, arrays: Mapping[str, np.ndarray], copies: np.ndarray,
                         n_samples: np.ndarray, f: int, *, backend: str = "numba") -> AggregationResult:
        """:meth:`aggregate` of a rule with ``trims_by_column`` on rows given once for
        several clients: ``features`` and every array hold u distinct rows, and client i's
        rows are their row ``copies[i]`` (rows a pre-aggregator made equal bit for bit,
        NNM's honest rows when the Byzantine ones lie apart). The result is that of
        :meth:`aggregate` on the n rows written out, bit for bit, without writing them
        (``coordinatewise_combine``'s ``copies``). Raises :class:`NeedsRows` where the
        rule's fallback is the mean of the whole rows.
        """
        if not self.trims_by_column:
            raise TypeError(f"{self.name} does not combine each column by a window of ranks")
        X, mats, _ = validate_inputs(features, arrays, np.ones(np.shape(features)[0]), 0, backend)
        from rfrs_ref.kernels.coordinatewise import coordinatewise_combine

        copies = np.asarray(copies, dtype=np.int64)
        n = copies.shape[0] if copies.ndim == 1 else -1
        _check_counts(n, f)
        w = sample_sizes(n_samples, n)
        f_used, record = self._resolve_f(n, f)
        if f_used is None:
            raise NeedsRows(f"{self.name}: its fallback is the mean of the whole rows")
        t = self._trim(n, f_used)
        out, kept, bad = coordinatewise_combine(X, mats, w, mode=self.window, t=t, backend=backend,
                                                copies=copies)
        result = AggregationResult(out, None, kept / X.shape[1], self._window_diagnostics(t, bad))
        return self._described(result, n, f, f_used, record, backend)

    def _trim(self, n: int, f: int) -> int:
        """The window's t for n clients and f assumed Byzantine (``trims_by_column``)."""
        raise TypeError(f"{self.name} does not combine each column by a window of ranks")

    def _column_plan(self, n: int, f: int, distances) -> tuple:
        """(candidate rows or None for all, the window's t, diagnostics before the
        window's) of :meth:`aggregate_by_columns`."""
        return None, self._trim(n, f), {}

    def _window_diagnostics(self, t: int, bad: int) -> dict:
        """The diagnostics :meth:`aggregate` records for a window of parameter t
        (``trims_by_column``), ``bad`` coordinates whose window kept a non-finite value."""
        return {"trim": t, "nonfinite_kept_coordinates": bad}

    def _from_distances(self, D2, finite, n_samples, f, error=None) -> AggregationResult:
        """The rule's weights from validated distances (``weighs_by_distances`` rules)."""
        raise TypeError(f"{self.name}'s weights are not a function of the distances alone")

    def _described(self, res: AggregationResult, n, f, f_used, record, backend) -> AggregationResult:
        diag = {"rule": self.name, "n": n, "f": int(f), "f_used": f_used,
                "hyperparameters": values(self), "backend": backend}
        diag.update(res.diagnostics)
        diag["fallback"] = record
        res.diagnostics = jsonable(diag)
        return res

    @abc.abstractmethod
    def _aggregate(self, X: np.ndarray, arrays: dict[str, np.ndarray], n_samples: np.ndarray,
                   f: int, backend: str) -> AggregationResult:
        """The rule on validated inputs (``X`` 2-D float, ``n_samples`` float64 > 0)."""


class NeedsRows(Exception):
    """A rule given the features' distances (:meth:`Rule.from_distances`) cannot decide
    from them alone here and needs the features themselves (RFA: a Weiszfeld step the
    matrix cannot certify); the caller runs the rule on the rows."""


class FiniteUploads(dict):
    """Uploaded arrays (name -> (n, D)) whose every value the caller has checked finite.

    The round hands a rule its uploads so after update-rule verification, whose first
    check is that every uploaded value is finite (an upload that fails it is excluded
    before the rule runs). The rules then test only the features for NaN and ±inf
    (:func:`rfrs_ref.aggregate.combine.finite_clients`) instead of reading every upload
    once more for it; the features are still tested (θ − θ̄ or a recovered gradient may
    overflow where the uploads do not). Any other mapping is tested in full. Handing a
    rule a FiniteUploads that holds a non-finite value breaks the rules' hostile-input
    guarantee: only a caller that has checked the values may build one.
    """


def fallback_field():
    return hyper("error", "when n and f violate the rule's precondition: error, reduce-f "
                 "(largest f that satisfies it) or mean (no defence this round); recorded "
                 "in the diagnostics", cli="fallback", choices=FALLBACKS)


def check_max_subsets(rule: str, max_subsets) -> None:
    """The cap of a rule that searches the C(n, f) subsets of n − f clients (MDA, SMEA): an
    integer ≥ 1 (a bool is not one), or ValueError naming the rule and the value."""
    if (isinstance(max_subsets, (bool, np.bool_))
            or not isinstance(max_subsets, (int, np.integer)) or max_subsets < 1):
        raise ValueError(f"{rule} max_subsets must be an integer ≥ 1, got {max_subsets!r}")


def subset_search_condition(n: int, f: int, max_subsets: int) -> str | None:
    """The precondition a subset-searching rule's (n, f) breaks, or None: n > 2f, and
    C(n, f) ≤ ``max_subsets`` subsets to search."""
    if not n > 2 * f:
        return "n > 2f"
    if math.comb(n, f) > max_subsets:
        return (f"C(n, f) ≤ max_subsets={max_subsets} subsets to search "
                f"(C({n}, {f}) = {math.comb(n, f):.3g})")
    return None


def _check_counts(n: int, f: int) -> None:
    if isinstance(f, (bool, np.bool_)) or not isinstance(f, (int, np.integer)) or f < 0:
        raise ValueError(f"f (the assumed number of Byzantine clients) must be an integer ≥ 0, got {f!r}")
    if n < 1:
        raise ValueError(f"aggregation needs at least one client, got n={n}")


def validate_inputs(features, arrays, n_samples, f, backend):
    """Check shapes, dtypes and values; return (features, arrays, n_samples float64).

    Nothing is copied unless a dtype conversion is needed; nothing is modified.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    X = np.asarray(features)
    if X.ndim != 2:
        raise ValueError(f"features must be a 2-D (n clients × D) array, got shape {X.shape}")
    if X.dtype not in (np.float32, np.float64):
        X = X.astype(np.float64)
    n, D = X.shape
    _check_counts(n, f)
    if D < 1:
        raise ValueError(f"features must have at least one coordinate, got shape {X.shape}")
    # the caller's word that every uploaded value is finite travels with the arrays
    mats: dict[str, np.ndarray] = FiniteUploads() if isinstance(arrays, FiniteUploads) else {}
    for name, A in arrays.items():
        A = np.asarray(A)
        if A.shape != (n, D):
            raise ValueError(
                f"uploaded array {name!r} has shape {A.shape}, but the features are {X.shape}: "
                "every upload must have one row per client and the features' length"
            )
        if not np.issubdtype(A.dtype, np.floating):
            raise TypeError(f"uploaded array {name!r} must be floating point, got dtype {A.dtype}")
        mats[name] = A
    return X, mats, sample_sizes(n_samples, n)


def sample_sizes(n_samples, n: int) -> np.ndarray:
    """The clients' training-set sizes nᵢ as the rules weigh them: float64, checked
    finite and > 0, scaled by a power of two when their sum would overflow."""
    w = np.asarray(n_samples, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"n_samples must have one entry per client, shape ({n},), got {w.shape}")
    if not (np.isfinite(w).all() and (w > 0).all()):
        bad = np.flatnonzero(~(np.isfinite(w) & (w > 0)))
        raise ValueError(
            f"n_samples must be finite and > 0 (every client trains on at least one item); "
            f"clients {bad.tolist()[:10]} have {w[bad].tolist()[:10]}"
        )
    with np.errstate(over="ignore"):
        total = w.sum()
    if not np.isfinite(total):
        # Every rule weighs by nᵢ/Σ nⱼ: a power-of-two scale keeps every ratio
        # exact, where Σ nᵢ = inf would turn every weight into 0 or NaN.
        w = np.ldexp(w, -int(np.frexp(w.max())[1]))
    return w


def parameter_features(
    theta_uploads: np.ndarray, theta_bar: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """Parameter-space detection features θᵢ − θ̄ (docs/aggregation.md), row by row.

    Every rule is translation-equivariant, so comparing θᵢ − θ̄ chooses what
    comparing θᵢ would, but keeps the values near 0, where float32 has its
    precision (the differences of nearby floats are exact).

    Args:
        theta_uploads: (n, D) uploaded θ. theta_bar: (D,) the server's θ̄ᵗ⁻¹.
        out: optional (n, D) buffer to write into (may not alias the inputs).

    Returns:
        (n, D) array in the uploads' dtype (``out`` when given).
    """
    T = np.asarray(theta_uploads)
    tb = np.asarray(theta_bar)
    if T.ndim != 2 or tb.shape != (T.shape[1],):
        raise ValueError(
            f"parameter_features needs θ uploads (n, D) and θ̄ (D,), got {T.shape} and {tb.shape}"
        )
    if out is None:
        out = np.empty_like(T)
    with np.errstate(invalid="ignore", over="ignore"):
        np.subtract(T, tb.astype(T.dtype, copy=False), out=out)
    return out


def combine(arrays: Mapping[str, np.ndarray], weights: np.ndarray, backend: str) -> dict[str, np.ndarray]:
    """Σᵢ wᵢ · A[i] for every array, float64 sums, rows with wᵢ = 0 skipped (so a
    NaN in a row with zero weight cannot reach the result)."""
    from rfrs_ref.aggregate.combine import combine_rows

    return {name: combine_rows(A, weights, backend=backend) for name, A in arrays.items()}
