"""FISM, the factored item similarity model (paper Eq. 1; Kabbur et al. 2013).

Scores of client i with training items S (n = |S|):

    ŷ_j = p_j · |S \\ {j}|^(−γ) Σ_{k ∈ S \\ {j}} q_k

so an unrated item k scores p_k·s/n^γ with s = Σ_{l∈S} q_l, a rated item j
scores p_j·(s − q_j)/(n − 1)^γ (its own q excluded), and 0 when S \\ {j} is
empty (n = 1). At evaluation every item scores p_k·s/n^γ (docs/model.md).

Layout: θ = concat(P.ravel(), Q.ravel()), P and Q of shape (n_items, d),
row-major, D = 2·n_items·d. FISM has no private state.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

from rfrs_ref.model.base import (SCORE_BLOCK, Model, check_backend, check_users,
                                 matmul_into, prepare_scores_out)
from rfrs_ref.model.bpr import bpr_exact, bpr_sampled
from rfrs_ref.params import hyper


@dataclasses.dataclass(frozen=True)
class FISM(Model):
    """FISM trained with BPR (docs/model.md).

    Loss of one client (exact mode; sampled mode replaces S⁻ by each positive's
    N sampled negatives):

        ℓ(θ) = −Σ_{j∈S} Σ_{k∉S} log σ(ŷ_j − ŷ_k) + λ‖θ‖².

    Gradient (derived in ``docs/model.md``): with a_j = −Σ_k σ(ŷ_k − ŷ_j),
    b_k = Σ_j σ(ŷ_k − ŷ_j), c₁ = n^−γ, c₂ = (n−1)^−γ (0 for n = 1),
    B = Σ_{k∉S} b_k p_k and A = Σ_{j∈S} a_j p_j:

        ∂ℓ/∂p_j = a_j c₂ (s − q_j)                     (j ∈ S)
        ∂ℓ/∂p_k = b_k c₁ s                             (k ∉ S)
        ∂ℓ/∂q_l = c₁ B + c₂ (A − a_l p_l)              (l ∈ S)
        ∂ℓ/∂q_l = 0                                    (l ∉ S)

    plus 2λθ on every coordinate. A client holding every item has no negative
    (its loss is λ‖θ‖²); a client with no item has no positive (same).

    Attributes:
        gamma: normalisation exponent γ (paper: γ; 1 by default; any finite value).
    """

    gamma: float = hyper(1.0, "normalisation exponent γ")

    name: ClassVar[str] = "fism"
    has_private: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not math.isfinite(self.gamma):
            raise ValueError(f"fism: gamma must be finite, got {self.gamma!r}")

    def n_params(self) -> int:
        return 2 * self.n_items * self.dim

    def unpack(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Views (P, Q) of θ, each (n_items, d)."""
        theta = self.check_theta(theta)
        nd = self.n_items * self.dim
        return (theta[:nd].reshape(self.n_items, self.dim),
                theta[nd:].reshape(self.n_items, self.dim))

    def norms(self, n: int) -> tuple[float, float]:
        """(c₁, c₂) = (n^−γ, (n−1)^−γ), each 0 where its set is empty."""
        c1 = float(n) ** (-self.gamma) if n > 0 else 0.0
        c2 = float(n - 1) ** (-self.gamma) if n > 1 else 0.0
        return c1, c2

    # -- oracle ------------------------------------------------------------------
    def loss_grad(self, theta, items, negatives=None, private=None):
        """Loss and gradient of one client, NumPy float64 (the oracle).

        Args:
            theta: (D,) float32 or float64; read as float64.
            items: the client's training items S⁺ (unique ids; any order in exact mode,
                increasing in sampled mode).
            negatives: None for exact mode, or (n, N) item ids from S⁻, row j for
                the j-th smallest positive (see ``sample_negatives``).
            private: must be None (FISM has no private state).

        Returns:
            ``(loss, grad)``: loss a float, grad a new float64 (D,) array.

        Cost: O(n·|S⁻| + n_items·d) time (exact) and O(D + n·d) memory; the pair
        matrix is processed in blocks and never materialised in full.
        """
        if private is not None:
            raise ValueError("fism has no private parameters; pass private=None")
        if negatives is None and self.negatives > 0:
            raise ValueError(f"fism: the model samples {self.negatives} negatives per positive "
                             "but none were given")
        P, Q = (x.astype(np.float64, copy=False) for x in self.unpack(theta))
        S = self.check_items(items, sorted_=negatives is not None)
        n = S.size
        c1, c2 = self.norms(n)
        PS, QS = P[S], Q[S]
        s = QS.sum(axis=0)
        U = c2 * (s - QS)  # (n, d): the leave-one-out client vector of each positive
        y_pos = np.einsum("jd,jd->j", PS, U)
        y_all = c1 * (P @ s)  # every item scored as unrated; entries of S are unused

        b = np.zeros(self.n_items)  # ∂L/∂ŷ_k, zero on S and on never-drawn items
        if negatives is None:
            neg = np.ones(self.n_items, dtype=bool)
            neg[S] = False
            neg = np.flatnonzero(neg)
            loss, a, b_neg = bpr_exact(y_pos, y_all[neg])
            b[neg] = b_neg
        else:
            ids = self.check_negatives(negatives, S)
            loss, a, sig = bpr_sampled(y_pos, y_all[ids])
            b += np.bincount(ids.ravel(), weights=sig.ravel(), minlength=self.n_items)

        gP = 2.0 * self.lam * P
        gQ = 2.0 * self.lam * Q
        gP += np.outer(b, c1 * s)
        gP[S] += a[:, None] * U
        B = b @ P
        A = a @ PS
        gQ[S] += c1 * B + c2 * (A - a[:, None] * PS)
        loss += self.lam * (float(np.sum(P * P)) + float(np.sum(Q * Q)))
        return float(loss), np.concatenate([gP.ravel(), gQ.ravel()])

    # -- fast path ---------------------------------------------------------------
    def grads_batch(self, theta, train, clients, out, *, negatives=None, private=None,
                    private_out=None, backend="numba", q_rows=None, out_q=None):
        """Gradients of clients ``clients`` (ids into ``train``) written into ``out``.

        Args:
            theta: (D,) float32 or float64, the server's θ̄.
            train: ``rfrs_ref.data.Interactions``, the clients' training sets.
            clients: (n,) user ids.
            out: (n, D) C-contiguous buffer of theta's dtype; row r receives the
                gradient of client clients[r] (every entry is written).
            negatives: None (exact), or one (n_r, N) array per client from
                ``sample_negatives`` (rows in increasing item order).
            private, private_out: must be None (no private state).
            backend: ``numba`` (kernels, parallel over clients), ``numpy`` (loops
                over the oracle), or ``cuda`` (no GPU kernel here: the Numba kernels).
            q_rows, out_q: the gradient's q half on some rows only (a round that
                streams: docs/performance.md, "Shared rows"): ``q_rows`` sorted unique
                item ids containing every client's items; ``out`` (n, n_items·d) then
                receives the p half and ``out_q`` (n, len(q_rows)·d) the q rows
                ``q_rows``, the values the full rows would hold. Every other q row of
                every client is :meth:`shared_gradient`'s.

        Returns:
            (n,) float64 losses, λ‖θ‖² included.

        Float32: the numba kernel works in float64 throughout and rounds each
        gradient entry once, so it matches the float64 oracle on the same
        (float32-valued) θ to a relative 2⁻²⁴ per entry.
        """
        if private is not None or private_out is not None:
            raise ValueError("fism has no private parameters; pass private=None, "
                             "private_out=None")
        if q_rows is not None:
            return self._grads_rows(theta, train, clients, out, out_q, q_rows, negatives,
                                    backend)
        theta, clients, negatives, backend = self._check_batch(theta, train, clients, out,
                                                               negatives, backend)
        n = clients.size
        losses = np.zeros(n)
        if backend == "numpy":
            for r, c in enumerate(clients):
                neg = None if negatives is None else negatives[r]
                losses[r], g = self.loss_grad(theta, train.items_of(c), neg)
                out[r] = g
            return losses
        self._kernel_grads(theta, train, clients, out, losses, negatives)
        return losses

    def _kernel_grads(self, theta, train, clients, out, losses, negatives, rows_out=()):
        """The numba kernels into ``out`` (and ``rows_out`` = (out_q, q_rows)); losses
        with λ‖θ‖²."""
        from rfrs_ref.kernels import fism as K

        indptr = np.ascontiguousarray(train.indptr, dtype=np.int64)
        indices = np.ascontiguousarray(train.indices, dtype=np.int32)
        theta = np.ascontiguousarray(theta)
        args = (theta, self.n_items, self.dim, indptr, indices, clients)
        hyper = (float(self.gamma), float(self.lam), out, losses)
        # one worker: run on this thread, without waking the thread pool
        if negatives is None:
            wptr, wrows = self._schedule(train, clients)
            if wptr.size == 2:
                K.fism_rows_exact(*args, *hyper, wrows, *rows_out)
            else:
                K.fism_grads_exact(*args, *hyper, wptr, wrows, *rows_out)
        else:
            packed = self._pack_negatives(train, clients, negatives)
            wptr, wrows = self._schedule(train, clients, packed[2])
            if wptr.size == 2:
                K.fism_rows_sampled(*args, *packed, *hyper, wrows, *rows_out)
            else:
                K.fism_grads_sampled(*args, *packed, *hyper, wptr, wrows, *rows_out)
        if clients.size:
            losses += self.lam * K.sum_squares(theta)

    def _grads_rows(self, theta, train, clients, out, out_q, q_rows, negatives, backend):
        """grads_batch with the q half on the rows ``q_rows`` only."""
        nd, d = self.n_items * self.dim, self.dim
        theta, clients, negatives, backend = self._check_batch(theta, train, clients, out,
                                                               negatives, backend, width=nd)
        n = clients.size
        q_rows = np.asarray(q_rows)
        if q_rows.ndim != 1 or (q_rows.size and (not np.issubdtype(q_rows.dtype, np.integer)
                                                 or q_rows.min() < 0
                                                 or q_rows.max() >= self.n_items
                                                 or (np.diff(q_rows) <= 0).any())):
            raise ValueError(f"fism: q_rows must be sorted unique item ids in "
                             f"0..{self.n_items - 1}")
        q_rows = q_rows.astype(np.int64)
        if not (isinstance(out_q, np.ndarray) and out_q.shape == (n, q_rows.size * d)
                and out_q.flags.c_contiguous and out_q.flags.writeable
                and out_q.dtype == theta.dtype):
            raise ValueError(f"fism: out_q must be a writeable C-contiguous array of shape "
                             f"({n}, {q_rows.size * d}) in theta's dtype, got "
                             f"{getattr(out_q, 'shape', None)}")
        for c in clients:
            if not np.isin(train.items_of(c), q_rows).all():
                raise ValueError(f"fism: q_rows must contain every client's items; client {c} "
                                 "has items outside it")
        if backend == "numpy":
            full = np.empty((n, self.n_params()), dtype=theta.dtype)
            losses = self.grads_batch(theta, train, clients, full, negatives=negatives,
                                      backend="numpy")
            out[...] = full[:, :nd]
            out_q[...] = full[:, nd:].reshape(n, self.n_items, d)[:, q_rows].reshape(n, -1)
            return losses
        losses = np.zeros(n)
        self._kernel_grads(theta, train, clients, out, losses, negatives, (out_q, q_rows))
        return losses

    @property
    def shared_block(self) -> tuple[int, int, int]:
        """``(start, rows, width)``: θ[start:] is Q, ``rows`` rows of ``width``, where a
        client's gradient is :meth:`shared_gradient`'s except on the rows of its own
        items (a round that streams computes those rows only: docs/performance.md,
        "Shared rows")."""
        return self.n_items * self.dim, self.n_items, self.dim

    def shared_gradient(self, theta: np.ndarray) -> np.ndarray:
        """The q half of the gradient of a client on the q rows outside its items, 2λq
        (the same for every client), in θ's dtype: the values :meth:`grads_batch` writes
        there, bit for bit."""
        from rfrs_ref.kernels.fism import shared_q_gradient

        theta = self.check_theta(theta)
        return shared_q_gradient(theta, self.n_items, self.dim, self.lam)

    # -- evaluation --------------------------------------------------------------
    def scores(self, theta, train, users, private=None, backend="numba", out=None):
        """Scores p_k·s_u/n_u^γ of every item for each user (all training items), for ranking.

        Returns (len(users), n_items) in theta's dtype (or ``out``, filled).
        The user vectors are summed sparsely (float64), then multiplied with Pᵀ
        in blocks of ``SCORE_BLOCK`` users.
        """
        if private is not None:
            raise ValueError("fism has no private parameters; pass private=None")
        backend = check_backend("fism", backend)
        theta = np.ascontiguousarray(self.check_theta(theta))
        if train.n_items != self.n_items:
            raise ValueError(f"fism: the model has n_items={self.n_items} but the "
                             f"interactions {train.name!r} have {train.n_items}")
        users = check_users(users, train.n_users)
        P, Q = self.unpack(theta)
        out = prepare_scores_out(out, users.size, self.n_items, theta.dtype)
        for lo in range(0, users.size, SCORE_BLOCK):
            block = users[lo : lo + SCORE_BLOCK]
            V = np.empty((block.size, self.dim))
            if backend == "numpy":
                for r, u in enumerate(block):
                    S = train.items_of(u)
                    V[r] = self.norms(S.size)[0] * Q[S].astype(np.float64).sum(axis=0)
            else:
                from rfrs_ref.kernels import fism as K

                K.fism_user_vectors(theta, self.n_items, self.dim,
                                    np.ascontiguousarray(train.indptr, dtype=np.int64),
                                    np.ascontiguousarray(train.indices, dtype=np.int32),
                                    block, float(self.gamma), V)
            matmul_into(V.astype(theta.dtype, copy=False), P.T, out[lo : lo + block.size])
        return out
