"""Pre-aggregators: maps of the round's rows applied in front of any rule
(docs/aggregation.md, pre-aggregation).

``PRE`` maps the command line's names to the classes; ``PreAggregated(pre=(NNM(),),
rule=Krum())`` is a rule (same ``aggregate`` call) that runs the pre-aggregators
in order and then the rule on their output.

Every pre-aggregator is a non-negative matrix M (n′ × n) chosen on the
features: the features become X′ = M X, and every uploaded array A (θ, m, v, r)
follows with the same matrix around the server's value S of that array,

    A′ = S + M (A − S),

so the uploads stay tied to the features exactly as before. Where M's rows sum
to 1 (nearest-neighbour mixing, bucketing) S cancels, A′ = M A, and every
mixed upload is a convex combination of uploads (a mixed v stays ≥ 0). Where
they do not (clipping: M = diag(sᵢ), sᵢ ≤ 1) the upload is shrunk toward the
server's state by the factor that shrinks its features: θ′ = θ̄ + sᵢ(θᵢ − θ̄)
is exactly the clipped parameter-space feature, and with SGD in gradient space
(θᵢ = θ̄ − ηgᵢ) exactly the upload of the clipped gradient; for stateful
optimisers in gradient space it is the upload moved toward the server's state
by sᵢ, not the optimiser's upload of sᵢgᵢ (docs/aggregation.md says why).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, ClassVar, Mapping

import numpy as np
from numba import njit, prange

from rfrs_ref.aggregate.base import (
    AggregationResult,
    FiniteUploads,
    NeedsRows,
    PreconditionError,
    Rule,
    jsonable,
    sample_sizes,
    validate_inputs,
)
from rfrs_ref.aggregate.combine import finite_clients
from rfrs_ref.kernels.distances import as_float_matrix, pairwise_sq_dists
from rfrs_ref.kernels.mixing import distinct_rows, mix_rows
from rfrs_ref.params import check_kinds, hyper, values
from rfrs_ref.registry import Registry


# -- row norms ---------------------------------------------------------------------------------

def row_norms_numpy(X: np.ndarray) -> np.ndarray:
    """Oracle of :func:`row_norms`: ‖xᵢ‖ in float64, scaled by the row's largest
    magnitude so that no finite row's norm overflows; NaN for a row with a NaN,
    +inf for a row with ±inf and no NaN."""
    A = np.abs(np.asarray(X, dtype=np.float64))
    out = np.empty(A.shape[0])
    with np.errstate(invalid="ignore", over="ignore"):
        for i, a in enumerate(A):
            m = a.max(initial=0.0)
            if np.isnan(a).any():
                out[i] = np.nan
            elif m == 0.0 or not np.isfinite(m):
                out[i] = m
            else:
                out[i] = m * np.sqrt(np.sum((a / m) ** 2))
    return out


@njit(cache=True)
def _sum_sq(x):
    acc = 0.0
    for k in range(x.shape[0]):
        v = np.float64(x[k])
        acc += v * v
    return acc


# ``reassoc`` vectorises the sum of squares (its order differs from the oracle's by
# rounding); it does not touch inf or NaN (no ``nnan``/``ninf``)
_sum_sq_fast = njit(cache=True, fastmath={"reassoc", "contract"})(_sum_sq.py_func)


@njit(cache=True, parallel=True)
def _row_norms_numba(X, out):
    n, D = X.shape
    for i in prange(n):
        acc = _sum_sq_fast(X[i])
        if acc < np.inf:
            out[i] = math.sqrt(acc)
            continue
        # ±inf, NaN, or a float64 row beyond 1e154: scale by its largest magnitude
        m = 0.0
        nan = False
        for k in range(D):
            v = abs(np.float64(X[i, k]))
            if v != v:
                nan = True
            elif v > m:
                m = v
        if nan:
            out[i] = np.nan
        elif m == np.inf:
            out[i] = np.inf
        else:
            s = 0.0
            for k in range(D):
                v = np.float64(X[i, k]) / m
                s += v * v
            out[i] = m * math.sqrt(s)


def row_norms(X: np.ndarray, backend: str = "numba") -> np.ndarray:
    """‖xᵢ‖ (float64, (n,)): one pass over X; see :func:`row_norms_numpy`."""
    if backend == "numpy":
        return row_norms_numpy(X)
    M = as_float_matrix(X, "X")
    out = np.empty(M.shape[0])
    _row_norms_numba(M, out)
    return out


# -- the pre-aggregators -----------------------------------------------------------------------

@dataclasses.dataclass
class Mixing:
    """One pre-aggregator's decision.

    Attributes:
        matrix: (n′, n) float64 non-negative mixing matrix M.
        n_samples: (n′,) float64 training-set sizes of the output rows.
        diagnostics: strict-JSON facts (neighbours, buckets, scales...).
    """

    matrix: np.ndarray
    n_samples: np.ndarray
    diagnostics: dict


@dataclasses.dataclass(frozen=True)
class PreAggregator(abc.ABC):
    """A pre-aggregator: a frozen dataclass whose fields are its hyperparameters."""

    name: ClassVar[str] = ""
    #: whether it needs the round's random generator
    random: ClassVar[bool] = False
    #: whether it reads the finite-client mask (a pass over every upload)
    needs_finite: ClassVar[bool] = False

    def rows_out(self, n: int) -> int:
        """n′, the number of rows it outputs for n input rows."""
        return n

    def condition(self, n: int, f: int) -> str | None:
        """The violated precondition as text, or None."""
        return None

    def __post_init__(self) -> None:
        check_kinds(self)

    @abc.abstractmethod
    def mixing(self, X: np.ndarray, n_samples: np.ndarray, f: int, ok: np.ndarray,
               rng: np.random.Generator | None, backend: str) -> Mixing:
        """M for the rows X (n × D) with sizes nᵢ, assumed f, finite-client mask ``ok``."""


@dataclasses.dataclass(frozen=True)
class NNM(PreAggregator):
    r"""Nearest-neighbour mixing (Allouah et al. 2023).

    Formula: every row is replaced by the nᵢ-weighted mean of its n − f nearest
    rows, itself included,

        x′ᵢ = Σ_{j ∈ N(i)} nⱼ xⱼ / Σ_{j ∈ N(i)} nⱼ,

    and every upload follows with the same weights (rows of M sum to 1). The
    row keeps its client's nᵢ.

    Conventions: squared float64 distances by direct differences
    (:mod:`rfrs_ref.kernels.distances`); the row itself comes first (also when
    another row equals it), then the others by distance, ties by the smaller
    index (ByzFL's ``argpartition`` leaves their order unspecified). The mean
    is weighted by nᵢ (ByzFL: plain mean; the same for equal nᵢ).

    Hostile input: a client with a NaN or ±inf in its features or any upload is
    infinitely far from every other and ranks after every finite row, so no
    finite row mixes it in while at most f clients are such (beyond that, it is
    dropped from N(i): ``dropped_nonfinite``). Its own row is left as it is
    (M's row is eᵢ), for the rule to treat.

    Guarantee (tested): with at most f arbitrary rows, at least n − f honest
    rows lie within r = maxₕ ‖xₕ − xᵢ‖ ≤ Δ of an honest row i (h honest, Δ the
    honest diameter), so all of N(i) does, and so does x′ᵢ: ‖x′ᵢ − xᵢ‖ ≤ Δ.
    Allouah et al. (Lemma 1) bound the mixed rows' distance to the honest mean.

    Reference: Y. Allouah, S. Farhadkhani, R. Guerraoui, N. Gupta, R. Pinot,
    J. Stephan, "Fixing by Mixing: A Recipe for Optimal Byzantine ML under
    Heterogeneity", AISTATS 2023.

    Precondition: f < n.
    """

    name: ClassVar[str] = "nnm"
    needs_finite: ClassVar[bool] = True

    def condition(self, n: int, f: int) -> str | None:
        return None if f < n else "f < n (each row mixes its n − f nearest rows)"

    def mixing(self, X, n_samples, f, ok, rng, backend):
        n = X.shape[0]
        D2 = pairwise_sq_dists(X, backend="numpy" if backend == "numpy" else
                               ("cuda" if backend == "cuda" else "numba"))
        D2[~ok, :] = np.inf
        D2[:, ~ok] = np.inf
        k = n - f
        M = np.zeros((n, n))
        idx = np.arange(n)
        dropped = []
        for i in range(n):
            if not ok[i]:
                M[i, i] = 1.0
                continue
            d = D2[i].copy()
            d[i] = -1.0  # itself first
            order = np.lexsort((idx, d, ~ok))[:k]
            nb = order[ok[order]]
            dropped.extend(int(j) for j in order[~ok[order]])
            M[i, nb] = n_samples[nb] / n_samples[nb].sum()
        diag = {"neighbours": k, "dropped_nonfinite": sorted(set(dropped))}
        return Mixing(M, n_samples.copy(), diag)


@dataclasses.dataclass(frozen=True)
class Bucketing(PreAggregator):
    r"""Bucketing (Karimireddy, He, Jaggi 2022).

    Formula: the rows are shuffled by a random permutation π (the round's
    generator, stream ``pre``), cut into ⌈n/s⌉ consecutive buckets of s rows
    (the last one holds the n mod s left over, as in ByzFL), and every bucket
    becomes one row, the nᵢ-weighted mean of its members,

        x′_b = Σ_{i ∈ b} nᵢ xᵢ / Σ_{i ∈ b} nᵢ,   n′_b = Σ_{i ∈ b} nᵢ,

    and every upload follows with the same weights (rows of M sum to 1).

    Conventions: with n′_b = Σ nᵢ, bucketing followed by ``mean`` is the mean
    exactly (tested). The rule after it sees n′ = ⌈n/s⌉ rows and assumes
    f′ = min(f, n′): a Byzantine client spoils at most its own bucket. ByzFL
    shuffles with NumPy's global generator and takes plain means (the same
    buckets give the same rows for equal nᵢ).

    Hostile input: a bucket with a NaN or ±inf member is non-finite, one
    hostile row per spoilt bucket, for the rule to treat.

    Guarantee (Karimireddy et al. 2022, Lemma 1): with at most f Byzantine rows,
    at most f buckets hold one, and the honest buckets' variance is the honest
    variance divided by s.

    Reference: S. P. Karimireddy, L. He, M. Jaggi, "Byzantine-Robust Learning on
    Heterogeneous Datasets via Bucketing", ICLR 2022.

    Precondition: s ≥ 1 (an integer).
    """

    bucket_size: int = hyper(2, "bucketing: rows per bucket s (the last bucket holds the rest)",
                             cli="bucket-size")

    name: ClassVar[str] = "bucketing"
    random: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        s = self.bucket_size
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) or s < 1:
            raise ValueError(f"bucketing bucket_size must be an integer ≥ 1, got {s!r}")

    def rows_out(self, n: int) -> int:
        return -(-n // self.bucket_size)

    def mixing(self, X, n_samples, f, ok, rng, backend):
        if rng is None:
            raise ValueError("bucketing shuffles the rows: it needs the round's random generator "
                             "(rng=...)")
        n = X.shape[0]
        s = self.bucket_size
        perm = rng.permutation(n)
        nb = self.rows_out(n)
        M = np.zeros((nb, n))
        ns = np.empty(nb)
        for b in range(nb):
            members = perm[b * s:(b + 1) * s]
            ns[b] = n_samples[members].sum()
            M[b, members] = n_samples[members] / ns[b]
        diag = {"bucket_size": s, "buckets": [sorted(int(i) for i in perm[b * s:(b + 1) * s])
                                              for b in range(nb)]}
        return Mixing(M, ns, diag)


def _scales(norms: np.ndarray, threshold: np.ndarray | float, rows: np.ndarray) -> np.ndarray:
    """sᵢ = min(1, τ/‖xᵢ‖) for the finite rows among ``rows``, 1 elsewhere."""
    s = np.ones(norms.size)
    tau = np.broadcast_to(np.asarray(threshold, dtype=np.float64), norms.shape)
    for i in rows:
        if np.isfinite(norms[i]) and norms[i] > tau[i]:
            s[i] = tau[i] / norms[i]
    return s


@dataclasses.dataclass(frozen=True)
class Clip(PreAggregator):
    r"""Static clipping: every row to norm at most C.

    Formula: x′ᵢ = sᵢ xᵢ with sᵢ = min(1, C/‖xᵢ‖), and every upload
    A′ᵢ = S + sᵢ(Aᵢ − S), S the server's value of that array (module docstring:
    with parameter features, θ′ᵢ − θ̄ is exactly the clipped feature).

    Conventions: Euclidean norms in float64 (scaled so that no finite row
    overflows); n′ = n, nᵢ kept; the rule's weights on the clipped rows are
    reported as the clients' weights (the server's state takes the rest,
    Σ wᵢ(1 − sᵢ), of the aggregate of an upload). ByzFL's ``Clipping`` (c = 2.0)
    scales the rows the same way.

    Hostile input: a row with a NaN or ±inf has no norm to scale by: it is left
    as it is (sᵢ = 1), for the rule to treat; a huge finite row (1e38) is
    scaled to norm C.

    Guarantee (tested): every finite output row has norm ≤ C (to rounding), and
    a row within the ball is unchanged.

    Reference: e.g. Karimireddy, He, Jaggi, ICML 2021 (clipping as the
    building block of centered clipping).

    Precondition: C > 0, finite.
    """

    clip_norm: float = hyper(1.0, "clip: the largest norm C a row keeps", cli="clip-norm")

    name: ClassVar[str] = "clip"

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.clip_norm
        if (isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, float, np.floating, np.integer))
                or not math.isfinite(c) or c <= 0):
            raise ValueError(f"clip clip_norm must be a finite number > 0, got {c!r}")

    def mixing(self, X, n_samples, f, ok, rng, backend):
        norms = row_norms(X, "numpy" if backend == "numpy" else "numba")
        s = _scales(norms, float(self.clip_norm), np.arange(X.shape[0]))
        return Mixing(np.diag(s), n_samples.copy(),
                      {"clip_norm": float(self.clip_norm), "scales": jsonable(s),
                       "clipped": [int(i) for i in np.flatnonzero(s < 1)]})


@dataclasses.dataclass(frozen=True)
class ARC(PreAggregator):
    r"""Adaptive robust clipping (Allouah et al. 2024).

    Formula: with k = ⌊2(f/n)(n − f)⌋, the k rows of largest norm are clipped
    to the norm of the (k + 1)-th largest, τ = ‖x_(n−k)‖ (rows in increasing
    order of norm): x′ᵢ = min(1, τ/‖xᵢ‖) xᵢ for those k rows, the others
    unchanged. Uploads follow as in :class:`Clip`.

    Conventions: ranks by norm, ties by index (the larger index counts as the
    larger norm, as ByzFL's sort of (norm, id) pairs); k computed in integers,
    ⌊2f(n − f)/n⌋ (ByzFL: ``int((2f/n)(n − f))``, the same but where float
    rounding moves it across an integer). f = 0 changes nothing.

    Hostile input: a row with a NaN or ±inf ranks as the largest norm and is
    left as it is (no norm to scale by), for the rule to treat; the threshold
    τ is the norm of a finite row while at most k rows are non-finite (k ≥ f
    whenever f ≤ n/2), so a huge finite row is scaled down to τ.

    Guarantee (tested): at most k rows change, none grows, and every output
    row's norm is at most the largest of the n − k smallest norms.

    Reference: Y. Allouah, R. Guerraoui, N. Gupta, A. Jellouli, G. Rizk,
    J. Stephan, "Boosting Robustness by Clipping Gradients in Distributed
    Learning", 2024 (arXiv:2405.14432).

    Precondition: f < n.
    """

    name: ClassVar[str] = "arc"

    def condition(self, n: int, f: int) -> str | None:
        return None if f < n else "f < n"

    def mixing(self, X, n_samples, f, ok, rng, backend):
        n = X.shape[0]
        k = (2 * f * (n - f)) // n
        norms = row_norms(X, "numpy" if backend == "numpy" else "numba")
        if k == 0:
            s = np.ones(n)
            tau = None
        else:
            key = np.where(np.isnan(norms), np.inf, norms)
            order = np.lexsort((np.arange(n), key))
            tau = float(key[order[n - k - 1]])
            s = _scales(norms, tau, order[n - k:])
        return Mixing(np.diag(s), n_samples.copy(),
                      {"clipped_count": k, "threshold": jsonable(tau), "scales": jsonable(s),
                       "clipped": [int(i) for i in np.flatnonzero(s < 1)]})


PRE: Registry = Registry("pre-aggregator")
for _cls in (NNM, Bucketing, Clip, ARC):
    PRE.register(_cls.name, _cls)


# -- a rule behind pre-aggregators ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PreAggregated:
    """The pre-aggregators ``pre`` (in order), then ``rule``: a rule itself.

    ``aggregate`` takes the rule's arguments and the round's ``reference``
    (name -> the server's (D,) value of each uploaded array, needed by the
    clipping pre-aggregators) and ``rng`` (the round's generator, needed by
    bucketing). The result's weights are each client's share of the clients'
    part of the aggregate, (M̃ᵀw′)ᵢ, M̃ the composed mixing matrix with rows
    normalised to 1 and w′ the rule's weights on the mixed rows; ``kept[i]`` is
    the largest kept fraction of a mixed row that client i enters (for
    per-client rules: 1 iff its weight is positive). The diagnostics are the
    rule's, on the mixed rows, with ``pre``: one record per pre-aggregator.

    A rule with weights fixed by the nᵢ (the mean) is summed from the clients'
    rows directly on the fast paths (:func:`_sums_by_weights`: within one
    rounding of the oracle, which mixes every row first). So is a rule that
    combines the uploads by weights it takes from the features alone
    (``combines_by_weights``: Krum, RFA, MDA, MoNNA, CAF, SMEA) when every mixed
    row is finite: it reads the mixed features only, and its weights w′ on the
    mixed rows give the sums. The other rules (the coordinate-wise ones), and
    these where a mixed row holds a non-finite client, read mixed rows written
    into arrays kept between calls. A rule that ranks each column (median,
    trimmed mean, Meamed) reads the mixed rows that are equal bit for bit once
    each (NNM's honest rows share one neighbour set whenever the Byzantine rows
    lie apart): :meth:`Rule.aggregate_copies`, the same result bit for bit
    (``write_copies=True`` writes every row out instead, for comparison).
    """

    pre: tuple
    rule: Rule
    #: write every mixed row out, copies of equal rows included, for the rule's
    #: :meth:`~Rule.aggregate` (the fast paths otherwise give a rule that ranks each
    #: column the distinct rows once each; the same result, bit for bit)
    write_copies: bool = dataclasses.field(default=False, compare=False, repr=False)
    #: the mixed rows' arrays, kept from one call to the next (name -> (n′, D) array):
    #: a round's mixed features and uploads are n′ × D each, and writing them into
    #: fresh memory every round (page faults) cost more than the mixing. Not part of
    #: the rule's identity; one instance must not aggregate in two threads at once.
    _buffers: dict = dataclasses.field(default_factory=dict, init=False, compare=False, hash=False,
                                       repr=False)

    #: the round loop passes ``reference`` and ``rng``
    takes_round_inputs: ClassVar[bool] = True
    uses_features: ClassVar[bool] = True

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def coordinatewise(self) -> bool:
        return self.rule.coordinatewise

    @property
    def fallback(self) -> str:
        return getattr(self.rule, "fallback", "error")

    @property
    def state_arrays(self) -> tuple[str, ...]:
        return tuple(getattr(self.rule, "state_arrays", ()))

    def init_state(self, D: int) -> dict:
        return self.rule.init_state(D)

    def _shapes(self, n: int, f: int) -> tuple[int, int]:
        for p in self.pre:
            cond = p.condition(n, f)
            if cond is not None:
                raise PreconditionError(p.name, n, f, cond)
            n = p.rows_out(n)
            f = min(f, n)
        return n, f

    def _buffer(self, key: str, shape: tuple, dtype, backend: str,
                rows: int | None = None) -> np.ndarray | None:
        """The kept array for ``key`` if it has this shape and dtype, else a new one kept
        in its place (None for a dtype the fast paths do not write: they allocate); with
        ``rows``, its first ``rows`` rows (a contiguous view)."""
        dtype = np.dtype(dtype)
        if backend == "numpy" or dtype not in (np.float32, np.float64):
            return None  # the oracle allocates its own
        buf = self._buffers.get(key)
        if buf is None or buf.shape != tuple(shape) or buf.dtype != dtype:
            buf = np.empty(shape, dtype=dtype)
            self._buffers[key] = buf
        return buf if rows is None else buf[:rows]

    def check(self, n: int, f: int) -> None:
        """The pre-aggregators' preconditions on (n, f), then the rule's on what they output."""
        n2, f2 = self._shapes(n, f)
        self.rule.check(n2, f2)

    def aggregate(self, features, arrays: Mapping[str, np.ndarray], n_samples, f: int, *,
                  backend: str = "numba", reference: Mapping[str, np.ndarray] | None = None,
                  rng: np.random.Generator | None = None,
                  rule_state: Mapping[str, np.ndarray] | None = None) -> AggregationResult:
        X, mats, w = validate_inputs(features, arrays, n_samples, f, backend)
        n, D = X.shape
        self._shapes(n, f)
        # a rule that combines the uploads by weights it takes from the features alone
        # (Krum, RFA, MDA, MoNNA, CAF, SMEA) reads only the mixed features: where every
        # mixed row is finite, the uploads are summed from the clients' rows directly, as
        # for the mean (no mixed n′ × D upload is written; see _sums_by_weights)
        by_weights = (backend != "numpy" and getattr(self.rule, "combines_by_weights", False)
                      and not getattr(self.rule, "has_fixed_weights", False)
                      and not getattr(self.rule, "takes_round_inputs", False)
                      and not self.state_arrays)
        if any(p.needs_finite for p in self.pre) or by_weights:
            ok = finite_clients(X, mats, "numpy" if backend == "numpy" else "numba")
        else:
            ok = np.ones(n, dtype=bool)  # not read
        Mcum = np.eye(n)
        Xc, ns, fc, okc = X, w, f, ok
        records: list[dict[str, Any]] = []
        # a rule whose weights are fixed by the nᵢ (the mean) is a weighted sum of the mixed
        # rows, i.e. a weighted sum of the rows themselves: the fast path sums them directly
        # (no mixed n′ × D array is written; see _sums_by_weights)
        direct = backend != "numpy" and getattr(self.rule, "has_fixed_weights", False)
        # a rule that ranks each column (median, trimmed mean, Meamed) takes the mixed rows
        # that are equal bit for bit once each, with the map of their copies, when there
        # are any: no copy is written, and each distinct row is ranked once
        by_copies = (backend == "numba" and not self.write_copies
                     and getattr(self.rule, "trims_by_column", False)
                     and not direct and not by_weights and not self.state_arrays
                     and not getattr(self.rule, "takes_round_inputs", False))
        first = copies = None
        for idx, p in enumerate(self.pre):
            mx = p.mixing(Xc, ns, fc, okc, rng, backend)
            M = mx.matrix
            last = idx == len(self.pre) - 1
            Mnext = M @ Mcum
            if by_copies and last:
                # equal rows of M and of the cumulative matrix: equal mixed features and
                # uploads (each distinct row of a mix is one computation)
                first, group = distinct_rows(np.hstack([M, Mnext]))
                if first.size < M.shape[0]:
                    copies = group
                else:
                    first = None
            if not (direct and last):  # the last features: not read
                Mx = M if copies is None else M[first]  # copies: the last stage only
                Xc = mix_rows(Mx, Xc, _zero_if_needed(Mx, D), backend=backend, zero_reference=True,
                              out=self._buffer(f"features{len(records)}", (M.shape[0], D),
                                               Xc.dtype, backend, rows=Mx.shape[0]))
            okc = ((M != 0).astype(np.int64) @ (~okc).astype(np.int64)) == 0
            Mcum = Mnext
            ns = mx.n_samples
            n_in = M.shape[1]
            fc = min(fc, M.shape[0])
            records.append({"name": p.name, "hyperparameters": values(p), "n_in": n_in,
                            "n_out": int(M.shape[0]), **mx.diagnostics})
        stochastic = np.allclose(Mcum.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        # a mixed row holding a non-finite client goes to the rule as it is, for it to treat
        by_weights = by_weights and bool(okc.all())
        mixed = {}
        refs = {}
        for name, A in mats.items():
            if A is X:
                mixed[name] = Xc
                refs[name] = None if stochastic else np.zeros(D)  # features are deviations
                continue
            S = None
            if not stochastic:
                if reference is None or name not in reference:
                    raise ValueError(
                        f"pre-aggregators {', '.join(p.name for p in self.pre)} scale uploaded "
                        f"array {name!r} toward the server's value of it: pass reference="
                        f"{{{name!r}: ...}}")
                S = np.asarray(reference[name])
                if S.shape != (D,):
                    raise ValueError(f"reference {name!r} has shape {S.shape}, expected ({D},)")
            refs[name] = S
            if not (direct or by_weights):
                Mx = Mcum if copies is None else Mcum[first]
                mixed[name] = mix_rows(Mx, A, S, backend=backend,
                                       out=self._buffer(f"upload:{name}", (Mcum.shape[0], D),
                                                        A.dtype, backend, rows=Mx.shape[0]))
        res = None
        if copies is not None:
            try:
                res = self.rule.aggregate_copies(Xc, mixed, copies, ns, fc, backend=backend)
            except NeedsRows:  # the fallback is the mean of the rows written out
                Xc = Xc[copies]
                mixed = {name: A[copies] for name, A in mixed.items()}
        if res is not None:
            pass
        elif direct:
            wfix = self.rule.fixed_weights(sample_sizes(ns, Mcum.shape[0]))
            res = self.rule.from_sums(_sums_by_weights(wfix, Mcum, mats, refs, backend),
                                      ns, fc, backend=backend)
        elif by_weights:
            # every mixed row is finite (okc), so the rule may take the mixed uploads as
            # checked (FiniteUploads with no array): it returns its weights w′ on the
            # mixed rows, its kept rows and diagnostics, and no arrays
            res = self.rule.aggregate(Xc, FiniteUploads(), ns, fc, backend=backend)
            res = dataclasses.replace(
                res, arrays=_sums_by_weights(np.asarray(res.weights, dtype=np.float64), Mcum,
                                             mats, refs, backend))
        else:
            kw = {}
            if getattr(self.rule, "takes_round_inputs", False):
                kw = dict(reference=reference, rng=rng)
            if self.state_arrays:
                kw["rule_state"] = rule_state
            if (isinstance(mats, FiniteUploads) and Mcum.sum(axis=1).max() <= 1.0 + 1e-12
                    and all(S is None or np.isfinite(S).all() for S in refs.values())):
                # rows checked finite by the caller, mixed with weights summing to at most
                # 1 toward a finite reference, lie between them: finite too, and the rule
                # need not read every mixed upload again for NaN and ±inf
                mixed = FiniteUploads(mixed)
            res = self.rule.aggregate(Xc, mixed, ns, fc, backend=backend, **kw)
        rows = Mcum.sum(axis=1)
        Mn = Mcum / rows[:, None]
        support = Mcum != 0
        if res.weights is not None:
            weights = Mn.T @ np.asarray(res.weights, dtype=np.float64)
            total = weights.sum()
            if total > 0:  # cc gives every weight 0 when no row votes
                weights /= total
            kept = (weights > 0).astype(np.float64)
        else:
            weights = None
            kr = np.asarray(res.kept, dtype=np.float64)
            kept = np.array([kr[support[:, i]].max(initial=0.0) for i in range(n)])
        diag = dict(res.diagnostics)
        diag["pre"] = jsonable(records)
        diag["clients"] = n
        return AggregationResult(res.arrays, weights, kept, diag, state=res.state)


def _sums_by_weights(w: np.ndarray, Mcum: np.ndarray, mats, refs, backend: str) -> dict:
    """Σⱼ w′ⱼ A′ⱼ for every array without writing the mixed rows A′ = S + M(A − S):

        Σⱼ w′ⱼ A′ⱼ = (1 − Σᵢ cᵢ) S + Σᵢ cᵢ Aᵢ,   c = Mᵀw′,

    w′ (``w``) the rule's weights of the mixed rows: the mean's nᵢ′/Σnⱼ′, or the
    weights a rule that combines by weights took from the mixed features (Krum's
    selected rows, RFA's Weiszfeld weights). Sums in float64, rounded once to the
    array's dtype. The mixed path rounds each A′ⱼ to that dtype first (relative
    error u, the unit roundoff) and then sums: the two differ by at most
    u·Σⱼ w′ⱼ|A′ⱼ| ≤ u·max|A′| before the final rounding, i.e. by one rounding of
    the result (tested). A row with cᵢ = 0 (in no mixed row, or only in rows of
    weight 0) is skipped, as the mixed path never sums it; cᵢ > 0 for every row a
    summed mixed row holds, so a non-finite row reaches the sum exactly when it
    reaches a summed mixed row.
    """
    from rfrs_ref.aggregate.cc import _combine64

    c = Mcum.T @ w
    out = {}
    for name, A in mats.items():
        total = _combine64(A, c, backend)
        S = refs.get(name)
        if S is not None:
            total += (1.0 - float(c.sum())) * np.asarray(S, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            out[name] = total.astype(A.dtype)
    return out


def _zero_if_needed(M: np.ndarray, D: int) -> np.ndarray | None:
    """Features are deviations (θᵢ − θ̄ or ĝᵢ): their reference is 0 (None where it
    cancels or where M is diagonal, whose fast path scales without a reference)."""
    if np.allclose(M.sum(axis=1), 1.0, rtol=0, atol=1e-12):
        return None
    return np.zeros(D)


def build(pre_names, pre_params: Mapping[str, Any], rule: Rule):
    """``rule`` behind the pre-aggregators named (in order), each taking its
    hyperparameters from ``pre_params``; the rule itself when none is named."""
    if not pre_names:
        return rule
    stages = []
    for name in pre_names:
        cls = PRE.get(name)
        own = {h: pre_params[h] for h in _hyper_names(cls) if h in pre_params}
        stages.append(cls(**own))
    return PreAggregated(tuple(stages), rule)


def _hyper_names(cls) -> list[str]:
    from rfrs_ref.params import hyperparameters

    return [h.name for h in hyperparameters(cls)]


def pre_hyperparameters(pre_names) -> dict[str, Any]:
    """The hyperparameters the named pre-aggregators take, with their defaults."""
    from rfrs_ref.params import hyperparameters

    out: dict[str, Any] = {}
    for name in pre_names:
        for h in hyperparameters(PRE.get(name)):
            out.setdefault(h.name, h.default)
    return out


__all__ = ["ARC", "Bucketing", "Clip", "Mixing", "NNM", "PRE", "PreAggregated", "PreAggregator",
           "build", "pre_hyperparameters", "row_norms"]
