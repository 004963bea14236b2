"""FMF, federated matrix factorisation (Ammad-ud-din et al. 2019), the baseline model.

Scores ŷ_ij = u_i · p_j. The item matrix P (n_items, d) is federated,
θ = P.ravel() (D = n_items·d); the user vector u_i is private to client i: it
never leaves the client, which updates it locally each time it is sampled
(the round loop decides how). The model only provides gradients for both.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

from rfrs_ref.model.base import (SCORE_BLOCK, Model, _float_dtype, check_backend,
                                 check_users, matmul_into, prepare_scores_out)
from rfrs_ref.model.bpr import bpr_exact, bpr_sampled


@dataclasses.dataclass(frozen=True)
class FMF(Model):
    """Matrix factorisation with private user vectors, trained with BPR (docs/model.md).

    Loss of client i (exact mode; sampled mode as for FISM):

        ℓ_i(θ, u_i) = −Σ_{j∈S} Σ_{k∉S} log σ(u_i·p_j − u_i·p_k) + λ‖θ‖² + λ‖u_i‖².

    The regulariser λ‖θ‖² on the federated P is the project's (docs/model.md); the private vector
    gets the same λ, squared norm, so ∂/∂u_i includes 2λu_i.

    Gradient: with a_j = −Σ_k σ(ŷ_k − ŷ_j), b_k = Σ_j σ(ŷ_k − ŷ_j),

        ∂ℓ/∂p_j = a_j u (j ∈ S),   ∂ℓ/∂p_k = b_k u (k ∉ S),
        ∂ℓ/∂u = Σ_{j∈S} a_j p_j + Σ_{k∉S} b_k p_k + 2λu,

    plus 2λθ on every coordinate of θ.
    """

    name: ClassVar[str] = "fmf"
    has_private: ClassVar[bool] = True

    def n_params(self) -> int:
        return self.n_items * self.dim

    def unpack(self, theta: np.ndarray) -> np.ndarray:
        """View P of θ, (n_items, d)."""
        return self.check_theta(theta).reshape(self.n_items, self.dim)

    def private_init(self, n_users: int, rng: np.random.Generator, scale: float = 1.0,
                     dtype=np.float32) -> np.ndarray:
        """Initial private user vectors U, (n_users, d), entries i.i.d. N(0, scale²).

        Drawn in float64 and rounded to ``dtype``, like ``init_params``.
        """
        dtype = _float_dtype(dtype, "dtype")
        if isinstance(n_users, bool) or int(n_users) != n_users or n_users < 0:
            raise ValueError(f"fmf: n_users must be an integer >= 0, got {n_users!r}")
        if not (math.isfinite(scale) and scale >= 0):
            raise ValueError(f"fmf: init scale must be finite and >= 0, got {scale!r}")
        U = rng.standard_normal((int(n_users), self.dim))
        U *= scale
        return U.astype(dtype, copy=False)

    def _check_private_vector(self, u) -> np.ndarray:
        if u is None:
            raise ValueError("fmf needs the client's private user vector: pass private=u (d,)")
        u = np.asarray(u)
        if u.shape != (self.dim,):
            raise ValueError(f"fmf: the private vector has shape {u.shape}, expected "
                             f"({self.dim},)")
        _float_dtype(u.dtype, "private vector")
        return u

    def _check_private_matrix(self, U, n_users: int, what: str = "private") -> np.ndarray:
        if U is None:
            raise ValueError(f"fmf needs the private user vectors: pass {what}=U "
                             f"({n_users}, {self.dim}), row u for user u")
        U = np.asarray(U)
        if U.shape != (n_users, self.dim):
            raise ValueError(f"fmf: {what} has shape {U.shape}, expected ({n_users}, "
                             f"{self.dim}): one row per user of the interactions")
        _float_dtype(U.dtype, what)
        return U

    # -- oracle ------------------------------------------------------------------
    def loss_grad(self, theta, items, negatives=None, private=None):
        """Loss, gradient and private gradient of one client, NumPy float64 (the oracle).

        Args:
            theta: (D,) = P.ravel(), float32 or float64.
            items: the client's training items.
            negatives: None (exact) or (n, N) item ids from S⁻, row j for the j-th
                smallest positive.
            private: the client's user vector u, (d,).

        Returns:
            ``(loss, grad, private_grad)``: loss (λ‖θ‖² and λ‖u‖² included), grad
            float64 (D,), private_grad float64 (d,).
        """
        if negatives is None and self.negatives > 0:
            raise ValueError(f"fmf: the model samples {self.negatives} negatives per positive "
                             "but none were given")
        P = self.unpack(theta).astype(np.float64, copy=False)
        u = self._check_private_vector(private).astype(np.float64)
        S = self.check_items(items, sorted_=negatives is not None)
        y_all = P @ u
        b = np.zeros(self.n_items)  # ∂L/∂ŷ_k of the negatives
        if negatives is None:
            neg = np.ones(self.n_items, dtype=bool)
            neg[S] = False
            neg = np.flatnonzero(neg)
            loss, a, b_neg = bpr_exact(y_all[S], y_all[neg])
            b[neg] = b_neg
        else:
            ids = self.check_negatives(negatives, S)
            loss, a, sig = bpr_sampled(y_all[S], y_all[ids])
            b += np.bincount(ids.ravel(), weights=sig.ravel(), minlength=self.n_items)
        dy = b  # ∂L/∂ŷ for every item: a on S, b elsewhere
        dy[S] += a
        gP = 2.0 * self.lam * P + np.outer(dy, u)
        gu = dy @ P + 2.0 * self.lam * u
        loss += self.lam * (float(np.sum(P * P)) + float(u @ u))
        return float(loss), gP.ravel(), gu

    # -- fast path ---------------------------------------------------------------
    def grads_batch(self, theta, train, clients, out, *, negatives=None, private=None,
                    private_out=None, backend="numba"):
        """Gradients of clients ``clients`` into ``out`` and ``private_out``.

        Args:
            theta: (D,) float32 or float64, the server's P.
            train: the clients' training sets (``Interactions``).
            clients: (n,) user ids.
            out: (n, D) buffer of theta's dtype.
            negatives: None (exact) or one (n_r, N) array per client.
            private: U, (train.n_users, d): row ``clients[r]`` is client r's vector.
            private_out: (n, d) float buffer; row r receives ∂ℓ/∂u of client clients[r].
            backend: ``numba``, ``numpy``, or ``cuda`` (runs the Numba kernels).

        Returns:
            (n,) float64 losses, λ‖θ‖² and λ‖u‖² included.
        """
        theta, clients, negatives, backend = self._check_batch(theta, train, clients, out,
                                                               negatives, backend)
        n = clients.size
        U = self._check_private_matrix(private, train.n_users)
        if private_out is None:
            raise ValueError(f"fmf: pass private_out, an ({n}, {self.dim}) buffer for the "
                             "private gradients")
        if not isinstance(private_out, np.ndarray) or private_out.shape != (n, self.dim) \
                or not private_out.flags.writeable:
            raise ValueError(f"fmf: private_out has shape {getattr(private_out, 'shape', None)}, "
                             f"expected ({n}, {self.dim}), writeable")
        _float_dtype(private_out.dtype, "private_out")
        losses = np.zeros(n)
        if backend == "numpy":
            for r, c in enumerate(clients):
                neg = None if negatives is None else negatives[r]
                losses[r], g, gu = self.loss_grad(theta, train.items_of(c), neg, U[c])
                out[r] = g
                private_out[r] = gu
            return losses
        from rfrs_ref.kernels import fmf as K
        from rfrs_ref.kernels.fism import sum_squares

        indptr = np.ascontiguousarray(train.indptr, dtype=np.int64)
        indices = np.ascontiguousarray(train.indices, dtype=np.int32)
        theta = np.ascontiguousarray(theta)
        U = np.ascontiguousarray(U)
        args = (theta, self.n_items, self.dim, indptr, indices, clients)
        rest = (U, float(self.lam), out, private_out, losses)
        # one worker: run on this thread, without waking the thread pool
        if negatives is None:
            wptr, wrows = self._schedule(train, clients)
            if wptr.size == 2:
                K.fmf_rows_exact(*args, *rest, wrows)
            else:
                K.fmf_grads_exact(*args, *rest, wptr, wrows)
        else:
            packed = self._pack_negatives(train, clients, negatives)
            wptr, wrows = self._schedule(train, clients, packed[2])
            if wptr.size == 2:
                K.fmf_rows_sampled(*args, *packed, *rest, wrows)
            else:
                K.fmf_grads_sampled(*args, *packed, *rest, wptr, wrows)
        if n:
            losses += self.lam * sum_squares(theta)
        return losses

    # -- evaluation --------------------------------------------------------------
    def scores(self, theta, train, users, private=None, backend="numba", out=None):
        """Scores u·p_k of every item for each user, (len(users), n_items), theta's dtype.

        ``private`` is U (train.n_users, d); both backends use one matmul per
        block of ``SCORE_BLOCK`` users.
        """
        backend = check_backend("fmf", backend)
        theta = self.check_theta(theta)
        if train.n_items != self.n_items:
            raise ValueError(f"fmf: the model has n_items={self.n_items} but the "
                             f"interactions {train.name!r} have {train.n_items}")
        users = check_users(users, train.n_users)
        U = self._check_private_matrix(private, train.n_users)
        P = self.unpack(theta)
        out = prepare_scores_out(out, users.size, self.n_items, theta.dtype)
        for lo in range(0, users.size, SCORE_BLOCK):
            block = users[lo : lo + SCORE_BLOCK]
            matmul_into(U[block].astype(theta.dtype, copy=False), P.T,
                        out[lo : lo + block.size])
        return out
