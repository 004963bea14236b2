"""Models of the federated recommender (docs/model.md): the interface.

A model is a frozen dataclass built for a dataset's item count. It owns the
layout of the flat parameter vector θ (length D), the initialisation, the
per-client BPR loss and its hand-written gradient, and the scores used by
evaluation.

Two paths compute the same gradient:

- ``loss_grad`` is the oracle: readable NumPy float64, one client;
- ``grads_batch`` is the fast path of the round loop: many clients at once,
  written into a caller-owned (n, D) buffer; ``backend="numba"`` runs the
  kernels of ``rfrs_ref.kernels`` (parallel over clients, deterministic),
  ``backend="numpy"`` loops over the oracle.

Conventions shared by every model:

- Items of a client are its training set S⁺ (sorted, unique item ids); S⁻ is
  every other item.
- Exact mode (``negatives = 0``, the paper's loss): every item of S⁻ is a
  negative of every positive. Sampled mode (``negatives = N``): each positive
  j has its own N negatives drawn uniformly with replacement from S⁻; a
  negative drawn twice counts twice and the sum is not rescaled, so the
  sampled loss estimates N/|S⁻| times the exact pair sum.
- The regulariser is λ‖θ‖² (squared norm over the whole θ, gradient 2λθ), added
  to every client's loss: the paper writes λ‖θ‖ (docs/model.md).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import ClassVar, Sequence

import numpy as np

from rfrs_ref.params import check_kinds, hyper

#: ``cuda`` is accepted for runs whose other families use CUDA kernels: the model
#: family has no GPU kernel and runs its Numba CPU kernels there
BACKENDS = ("numpy", "numba", "cuda")


def check_backend(name: str, backend: str) -> str:
    """``numpy`` or ``numba`` (the kernels that serve ``cuda`` too)."""
    if backend not in BACKENDS:
        raise ValueError(f"{name}: backend must be one of {BACKENDS}, got {backend!r}")
    return "numpy" if backend == "numpy" else "numba"


@dataclasses.dataclass(frozen=True)
class Model(abc.ABC):
    """A recommendation model trained with the BPR loss (docs/model.md).

    Attributes:
        n_items: number of items (structural: fixed by the dataset, not a
            hyperparameter).
        dim: embedding dimension d.
        lam: L2 coefficient λ of the regulariser λ‖θ‖².
        negatives: BPR negatives per positive; 0 means exact (every unrated item).
    """

    n_items: int
    dim: int = hyper(64, "embedding dimension d")
    lam: float = hyper(1e-4, "L2 coefficient λ of the regulariser λ‖θ‖² (gradient 2λθ)")
    negatives: int = hyper(0, "BPR negatives per positive; 0 = exact, every unrated item")

    name: ClassVar[str] = ""
    #: whether clients hold private parameters that never leave them (FMF: user vectors)
    has_private: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_kinds(self)
        if isinstance(self.n_items, bool) or not isinstance(self.n_items, (int, np.integer)) \
                or self.n_items < 1:
            raise ValueError(f"{type(self).__name__}: n_items must be a positive integer, "
                             f"got {self.n_items!r}")
        if isinstance(self.dim, bool) or not isinstance(self.dim, (int, np.integer)) \
                or self.dim < 1:
            raise ValueError(f"{type(self).__name__}: dim must be a positive integer, "
                             f"got {self.dim!r}")
        if not (math.isfinite(self.lam) and self.lam >= 0):
            raise ValueError(f"{type(self).__name__}: lam must be finite and >= 0, "
                             f"got {self.lam!r}")
        if isinstance(self.negatives, bool) or not isinstance(self.negatives, (int, np.integer)) \
                or self.negatives < 0:
            raise ValueError(f"{type(self).__name__}: negatives must be an integer >= 0 "
                             f"(0 = exact), got {self.negatives!r}")

    # -- layout and initialisation ---------------------------------------------------
    @abc.abstractmethod
    def n_params(self) -> int:
        """D, the length of the federated parameter vector θ."""

    def init_params(self, rng: np.random.Generator, scale: float = 1.0,
                    dtype=np.float32) -> np.ndarray:
        """θ̄⁰ with entries i.i.d. N(0, scale²), shape (D,).

        The draw is made in float64 and rounded to ``dtype``, so the float32
        and float64 initialisations of one generator state agree to rounding.
        """
        dtype = _float_dtype(dtype, "dtype")
        if not (math.isfinite(scale) and scale >= 0):
            raise ValueError(f"init scale must be finite and >= 0, got {scale!r}")
        theta = rng.standard_normal(self.n_params())
        theta *= scale
        return theta.astype(dtype, copy=False)

    # -- negatives -------------------------------------------------------------------
    def sample_negatives(self, items, rng: np.random.Generator) -> np.ndarray | None:
        """The sampled negatives of one client, or None in exact mode.

        Returns an int32 array (len(items), N), N = ``self.negatives``: row j
        holds N items drawn uniformly with replacement from S⁻ (the items not
        in ``items``), for the j-th positive in sorted item order. A client
        holding every item has no negative: the result then has shape
        (len(items), 0).

        Draws ``rng.integers(0, |S⁻|, size=(n, N))`` and maps rank r to the
        r-th item of S⁻, so the negatives are a pure function of the
        generator's state.
        """
        if self.negatives == 0:
            return None
        s = self.check_items(items, sorted_=True)
        n = s.size
        m = self.n_items - n
        if m == 0:
            return np.zeros((n, 0), dtype=np.int32)
        r = rng.integers(0, m, size=(n, self.negatives), dtype=np.int64)
        # S[i] − i negatives precede S[i]; the r-th negative has every positive with
        # S[i] − i <= r before it.
        shift = np.searchsorted(s - np.arange(n), r, side="right")
        return (r + shift).astype(np.int32)

    # -- loss and gradient -----------------------------------------------------------
    @abc.abstractmethod
    def loss_grad(self, theta: np.ndarray, items, negatives: np.ndarray | None = None,
                  private: np.ndarray | None = None) -> tuple:
        """Oracle: (loss, ∇θ loss) of one client in float64 (FMF adds the private gradient)."""

    @abc.abstractmethod
    def grads_batch(self, theta: np.ndarray, train, clients, out: np.ndarray, *,
                    negatives: Sequence[np.ndarray | None] | None = None,
                    private: np.ndarray | None = None, private_out: np.ndarray | None = None,
                    backend: str = "numba") -> np.ndarray:
        """Fast path: the gradient of client ``clients[r]`` into ``out[r]``; returns the losses."""

    @abc.abstractmethod
    def scores(self, theta: np.ndarray, train, users, private: np.ndarray | None = None,
               backend: str = "numba", out: np.ndarray | None = None) -> np.ndarray:
        """Scores of every item for each user, (len(users), n_items), for evaluation."""

    # -- validation shared by the models ---------------------------------------------
    def check_theta(self, theta: np.ndarray) -> np.ndarray:
        """θ as given, after checking that it is a 1-D float32/float64 array of length D."""
        theta = np.asarray(theta)
        D = self.n_params()
        if theta.ndim != 1 or theta.shape[0] != D:
            raise ValueError(f"{self.name}: theta has shape {theta.shape}, expected ({D},) "
                             f"(n_items={self.n_items}, dim={self.dim})")
        _float_dtype(theta.dtype, "theta")
        return theta

    def check_items(self, items, sorted_: bool = False) -> np.ndarray:
        """A client's items as a sorted int64 array, after checking range and uniqueness.

        With ``sorted_`` the items must already be in increasing order (sampled
        negatives are given per positive in that order, so a permuted item list
        would silently pair them with the wrong positives).
        """
        s = np.asarray(items)
        if s.ndim != 1:
            raise ValueError(f"{self.name}: items must be 1-D, got shape {s.shape}")
        if s.size and not np.issubdtype(s.dtype, np.integer):
            raise ValueError(f"{self.name}: items must be integer item ids, got dtype {s.dtype}")
        s = s.astype(np.int64)
        if sorted_ and s.size > 1 and np.any(s[1:] < s[:-1]):
            raise ValueError(f"{self.name}: with sampled negatives the items must be in "
                             "increasing order (row j of negatives belongs to the j-th "
                             "smallest item)")
        s = np.sort(s)
        if s.size and (s[0] < 0 or s[-1] >= self.n_items):
            bad = s[0] if s[0] < 0 else s[-1]
            raise ValueError(f"{self.name}: item id {bad} out of range 0..{self.n_items - 1}")
        if s.size > 1:
            dup = np.flatnonzero(s[1:] == s[:-1])
            if dup.size:
                raise ValueError(f"{self.name}: item {s[dup[0]]} occurs twice in the client's "
                                 "items; S⁺ is a set")
        return s

    def check_negatives(self, negatives, items: np.ndarray) -> np.ndarray:
        """Sampled negatives of a client with sorted ``items``, as int64 (n, N), checked."""
        neg = np.asarray(negatives)
        n = items.size
        if neg.ndim != 2 or neg.shape[0] != n:
            raise ValueError(f"{self.name}: negatives have shape {neg.shape}, expected "
                             f"({n}, N): one row per positive")
        if neg.size and not np.issubdtype(neg.dtype, np.integer):
            raise ValueError(f"{self.name}: negatives must be integer item ids, "
                             f"got dtype {neg.dtype}")
        neg = neg.astype(np.int64)
        if neg.size:
            lo, hi = int(neg.min()), int(neg.max())
            if lo < 0 or hi >= self.n_items:
                raise ValueError(f"{self.name}: negative item {lo if lo < 0 else hi} out of "
                                 f"range 0..{self.n_items - 1}")
            if n:
                pos = np.searchsorted(items, neg)
                hit = items[np.minimum(pos, n - 1)] == neg
                if hit.any():
                    j, t = np.argwhere(hit)[0]
                    raise ValueError(f"{self.name}: negative {neg[j, t]} (row {j}, column {t}) "
                                     "is one of the client's training items; negatives "
                                     "must come from S⁻")
        return neg

    def _check_batch(self, theta, train, clients, out, negatives, backend, width=None):
        """Common checks of ``grads_batch``; returns (theta, clients, negatives, backend).
        ``width``: out's row length where it is not D (a model writing part of a row)."""
        backend = check_backend(self.name, backend)
        theta = self.check_theta(theta)
        if train.n_items != self.n_items:
            raise ValueError(f"{self.name}: the model has n_items={self.n_items} but the "
                             f"interactions {train.name!r} have {train.n_items}")
        clients = np.asarray(clients)
        if clients.ndim != 1 or (clients.size and not np.issubdtype(clients.dtype, np.integer)):
            raise ValueError(f"{self.name}: clients must be a 1-D array of user ids, "
                             f"got shape {clients.shape}, dtype {clients.dtype}")
        clients = clients.astype(np.int64)
        if clients.size and (clients.min() < 0 or clients.max() >= train.n_users):
            bad = clients.min() if clients.min() < 0 else clients.max()
            raise ValueError(f"{self.name}: client id {bad} out of range "
                             f"0..{train.n_users - 1}")
        n, D = clients.size, (self.n_params() if width is None else width)
        if not isinstance(out, np.ndarray) or out.ndim != 2 or out.shape[1] != D \
                or out.shape[0] != n:
            shape = getattr(out, "shape", None)
            raise ValueError(f"{self.name}: out has shape {shape}, expected ({n}, {D}): "
                             "one row per client")
        if out.dtype != theta.dtype:
            raise ValueError(f"{self.name}: out has dtype {out.dtype} but theta has "
                             f"{theta.dtype}; the gradient is written in theta's dtype")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"{self.name}: out must be a writeable C-contiguous array")
        if negatives is not None:
            if len(negatives) != n:
                raise ValueError(f"{self.name}: {len(negatives)} negative arrays for "
                                 f"{n} clients")
            kinds = {x is None for x in negatives}
            if len(kinds) > 1:
                raise ValueError(f"{self.name}: negatives mixes None (exact) and arrays "
                                 "(sampled) within one batch")
            if kinds == {True}:
                negatives = None
        if negatives is None and self.negatives > 0:
            raise ValueError(f"{self.name}: the model samples {self.negatives} negatives per "
                             "positive but none were given; pass "
                             "negatives=[model.sample_negatives(items, rng) ...]")
        return theta, clients, negatives, backend

    def _schedule(self, train, clients, width=None):
        """Rows of the batch per Numba worker (see ``rfrs_ref.kernels.fism.schedule``)."""
        import numba

        from rfrs_ref.kernels.fism import MIN_WORKER_COST, client_costs, schedule

        counts = (train.indptr[clients + 1] - train.indptr[clients]).astype(np.float64)
        # a sampled pair also computes its negative's score: about d + 40 units
        pairs = None if width is None else counts * width * (self.dim + 40)
        costs = client_costs(counts, self.n_items, self.dim, pairs)
        return schedule(costs, numba.get_num_threads(), MIN_WORKER_COST)

    def _pack_negatives(self, train, clients, negatives):
        """Checked negatives of a batch as (flat int32, offsets int64, N per client int64)."""
        n = clients.size
        ptr = np.zeros(n + 1, dtype=np.int64)
        width = np.zeros(n, dtype=np.int64)
        parts = []
        for r, c in enumerate(clients):
            items = np.asarray(train.items_of(c), dtype=np.int64)
            neg = self.check_negatives(negatives[r], items)
            width[r] = neg.shape[1]
            ptr[r + 1] = ptr[r] + neg.size
            parts.append(neg.ravel())
        flat = np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)
        return flat, ptr, width


def _float_dtype(dtype, what: str) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise ValueError(f"{what} must be float32 or float64, got {dt}")
    return dt


def check_users(users, n_users: int, what: str = "users") -> np.ndarray:
    """User ids as int64, after checking range."""
    u = np.asarray(users)
    if u.ndim != 1 or (u.size and not np.issubdtype(u.dtype, np.integer)):
        raise ValueError(f"{what} must be a 1-D array of user ids, got shape {u.shape}, "
                         f"dtype {u.dtype}")
    u = u.astype(np.int64)
    if u.size and (u.min() < 0 or u.max() >= n_users):
        bad = u.min() if u.min() < 0 else u.max()
        raise ValueError(f"{what}: user id {bad} out of range 0..{n_users - 1}")
    return u


def prepare_scores_out(out, n_users: int, n_items: int, dtype) -> np.ndarray:
    """The (n_users, n_items) output of ``scores``: ``out`` checked, or a new array."""
    if out is None:
        return np.empty((n_users, n_items), dtype=dtype)
    if not isinstance(out, np.ndarray) or out.shape != (n_users, n_items) \
            or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"scores: out must be a writeable C-contiguous array of shape "
                         f"({n_users}, {n_items}), got {getattr(out, 'shape', None)}")
    _float_dtype(out.dtype, "scores out")
    return out


#: users per block of the evaluation matmul: bounds the float64 user-vector block
SCORE_BLOCK = 1024


def matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out[...] = a @ b, without a temporary when the dtypes agree. Scores that overflow
    to ±inf or NaN are left to the callers, which test every score (evaluation stops the
    run as a divergence, ``recommend`` refuses the model): NumPy's overflow warning would
    only repeat that, as noise beside the message."""
    with np.errstate(over="ignore", invalid="ignore"):
        if out.dtype == np.result_type(a, b):
            np.matmul(a, b, out=out)
        else:
            out[...] = a @ b
