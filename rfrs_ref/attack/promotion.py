"""A targeted item-promotion attack: approximated user embeddings, A-ra and A-hum (Rong et al. 2022)."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

from rfrs_ref.attack.base import Attack, AttackContext
from rfrs_ref.params import hyper
from rfrs_ref.seeding import generator

#: the models whose item matrix P (θ's first n_items·d coordinates) scores items as p_k · u
PROMOTABLE_MODELS = ("fism", "fmf")


def parse_targets(text: str, n_items: int) -> np.ndarray:
    """Item ids from a comma-separated string, sorted, distinct, in 0..n_items − 1."""
    from rfrs_ref.metrics import check_targets

    try:
        ids = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"target items must be comma-separated integer item ids, got {text!r}") from None
    return check_targets(np.asarray(ids, dtype=np.int64), n_items)


def promotion_gradient(P: np.ndarray, targets: np.ndarray, users: np.ndarray,
                       hum_steps: int = 0, hum_lr: float = 1e-3) -> np.ndarray:
    """The A-ra (A-hum with ``hum_steps`` > 0) gradient on the item matrix (NumPy float64 oracle).

    ``users``: (S, d) approximated user embeddings û_s. A-hum first moves each
    û_s ``hum_steps`` times down the gradient of the loss that would *demote* the
    targets, û ← û − hum_lr · (1/|T|) Σ_t σ(p_t·û) p_t (hard users, who rate
    the targets low). The attack's loss, the promotion of the targets to those
    users, is

        L = (1/S) Σ_s (1/|T|) Σ_t −log σ(p_t · û_s),

    and its gradient is zero except at the targets' rows of P:

        ∂L/∂p_t = −(1/(S·|T|)) Σ_s (1 − σ(p_t · û_s)) û_s.

    Returns (|T|, d) float64, row j for ``targets[j]``.
    """
    P = np.asarray(P)
    T = np.asarray(targets, dtype=np.int64)
    Pt = P[T].astype(np.float64)
    U = np.array(users, dtype=np.float64, copy=True)
    S = U.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(int(hum_steps)):
            sig = _sigmoid(U @ Pt.T)                 # (S, |T|)
            U -= hum_lr * (sig @ Pt) / T.size
        w = 1.0 - _sigmoid(U @ Pt.T)                 # (S, |T|)
        return -(w.T @ U) / (S * T.size)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # the two branches keep exp from overflowing; σ(±inf) = 1 or 0, σ(NaN) = NaN
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    e = np.exp(x[~pos])
    out[~pos] = e / (1.0 + e)
    return out


@dataclasses.dataclass(frozen=True)
class ARA(Attack):
    """A-ra / A-hum (Rong et al., IJCAI 2022): promote target items to approximated users.

    The Byzantine clients know neither the honest users' embeddings nor their
    data. Each approximates S users by embeddings û_s ~ N(0, σ² I_d) (A-ra, the
    random approximation; A-hum, "hard user mining", first moves each û_s
    ``hum_steps`` gradient steps towards users that rate the targets low), and
    uploads rule(state, g, t) for the gradient g of the loss that pushes the
    targets' predicted scores σ(p_t · û_s) towards 1 (binary cross-entropy
    with label 1, as the reference implementation):
    :func:`promotion_gradient`, non-zero only at the targets' rows of the item
    matrix P. For FISM, ŷ_k = p_k · u with u = n^(−γ) Σ_{l∈S} q_l, and for FMF
    ŷ_k = p_k · u_i: in both, the items' P rows are θ's first n_items·d
    coordinates and û plays the part of u; nothing else of θ moves.

    Conventions (the reference implementation, rdz98/PoisonFedDLRS, ``attack.py``):
    S = 10 samples, σ = 0.01, A-hum 30 steps at rate 10⁻³; every Byzantine
    client draws its own samples every round (from the round's attack generator,
    S·d float64 standard normals per Byzantine client, in row order). The
    reference model is a neural one (NCF) whose layers also receive gradient;
    FISM and FMF have no shared layers. Target items: ``targets`` (comma-separated
    ids) or, when empty, ``n_targets`` items drawn uniformly without replacement
    with the run's seed (stream ``targets``) — the reference takes the least
    popular item; the trainer resolves them once per run and records them.

    The upload obeys the update rule (it passes verification); the attack's
    effect is measured by ER@K and the target hit ratio (docs/attacks.md).

    Hostile input: a non-finite θ̄ gives a non-finite gradient at the target
    rows (σ of NaN is NaN), uploaded as such. Diagnostics: ``targets``,
    ``gradient_norm`` (‖g‖ per Byzantine client).

    Reference: D. Rong, Q. He, J. Chen, "Poisoning Deep Learning Based
    Recommender Model in Federated Learning Scenarios", IJCAI 2022.

    Preconditions: the model is FISM or FMF; samples ≥ 1, n_targets ≥ 1,
    σ > 0, hum_steps ≥ 0, hum_lr ≥ 0 and finite; targets resolved before the
    first round (:meth:`resolve_targets`).
    """

    targets: str = hyper("", "a-ra: comma-separated target items as dense indices 0..n_items − 1, "
                         "not the ids of the dataset's files (index i is item_ids[i] of a run's "
                         "ids.npz: MovieLens id − 1); empty: n-targets items drawn with the run's "
                         "seed")
    n_targets: int = hyper(1, "a-ra: how many target items to draw when none are given")
    samples: int = hyper(10, "a-ra: approximated users per Byzantine client and round (S)")
    sigma: float = hyper(0.01, "a-ra: standard deviation σ of the approximated user embeddings")
    hum_steps: int = hyper(0, "a-ra: hard-user-mining steps per approximated user (0: A-ra; "
                           "30: A-hum)")
    hum_lr: float = hyper(1e-3, "a-ra: step size of hard user mining")

    name: ClassVar[str] = "a-ra"
    #: needs the model (the item matrix) in the attack context
    needs_model: ClassVar[bool] = True
    #: each Byzantine upload is the client rule on the promotion gradient, computed from
    #: the state and the client's own draws of the round's stream: a round computes it
    #: with the honest uploads, a batch of clients at a time (the draws in the order of
    #: the Byzantine rows, as here, kept per client in ``ctx.draws``)
    in_client_rule: ClassVar[bool] = True
    #: the gradient is zero outside the targets' rows of P, on FISM's Q in particular:
    #: a round on shared rows computes the Byzantine clients' shared rows once
    shares_rows: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("n_targets", "samples"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"a-ra {name} must be an integer ≥ 1, got {name}={v!r}")
        if isinstance(self.hum_steps, bool) or not isinstance(self.hum_steps, int) or self.hum_steps < 0:
            raise ValueError(f"a-ra hum_steps must be an integer ≥ 0, got hum_steps={self.hum_steps!r}")
        if not (isinstance(self.sigma, (int, float)) and math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"a-ra sigma must be a finite number > 0, got sigma={self.sigma!r}")
        if not (isinstance(self.hum_lr, (int, float)) and math.isfinite(self.hum_lr) and self.hum_lr >= 0):
            raise ValueError(f"a-ra hum_lr must be a finite number ≥ 0, got hum_lr={self.hum_lr!r}")
        if not isinstance(self.targets, str):
            raise ValueError(f"a-ra targets must be a string of comma-separated ids, got {self.targets!r}")

    def check_model(self, model) -> None:
        """ValueError unless ``model`` (instance or name) scores items as p_k · u."""
        name = model if isinstance(model, str) else getattr(model, "name", None)
        if name not in PROMOTABLE_MODELS:
            raise ValueError(f"attack 'a-ra' applies to models {', '.join(PROMOTABLE_MODELS)} "
                             f"only (item scores p_k · u), got model {name!r}")

    def resolve_targets(self, n_items: int, seed: int) -> np.ndarray:
        """The target item ids: ``targets`` parsed, or ``n_targets`` items drawn
        uniformly without replacement (stream ``targets`` of ``seed``), sorted."""
        if self.targets.strip():
            return parse_targets(self.targets, n_items)
        if self.n_targets > n_items:
            raise ValueError(f"a-ra needs n_targets ≤ n_items, got n_targets={self.n_targets} "
                             f"with {n_items} items")
        ids = generator(seed, "targets").choice(n_items, size=self.n_targets, replace=False)
        return np.sort(ids).astype(np.int64)

    def apply_inplace(self, ctx: AttackContext) -> dict:
        rows = ctx.byzantine_rows()
        if rows.size == 0:
            return {}
        G = ctx.grads
        S = ctx.scratch("grads", G.shape, G.dtype)[: rows.size]
        diag = self._promote(ctx, S, np.arange(rows.size), rows)
        ctx.optimizer.client_rule_batch(ctx.state, S, ctx.t, ctx.uploads, ctx.backend, rows=rows)
        return diag

    def own_gradients_inplace(self, ctx: AttackContext, G: np.ndarray, rows: np.ndarray) -> dict:
        """Rows ``rows`` of ``G`` (the Byzantine clients' honest gradients) become their
        promotion gradients (zero but at the targets' rows of P), each from the client's
        draws: the rows ``apply_inplace`` pushes through the rule, bit for bit."""
        if rows.size == 0:
            return {}
        return self._promote(ctx, G, rows, rows)

    def own_parts_inplace(self, ctx: AttackContext, parts: list, rows: np.ndarray) -> dict:
        """:meth:`own_gradients_inplace` on rows given by columns: the first part holds θ's
        first coordinates, every target's row of P among them; the others (FISM's Q rows
        the sampled clients own) are zero in a promotion gradient."""
        if rows.size == 0:
            return {}
        for G in parts[1:]:
            G[rows] = 0
        return self._promote(ctx, parts[0], rows, rows)

    def shared_gradient_inplace(self, g: np.ndarray) -> None:
        """The promotion gradient is zero on the rows every client shares (FISM's Q)."""
        g[...] = 0

    def merge_diagnostics(self, parts: list[dict], D: int) -> dict:
        """The targets and every Byzantine row's ‖g‖ in row order, as ``apply_inplace``
        records them for the whole round ({} when no Byzantine client was sampled)."""
        parts = [p for p in parts if p]
        if not parts:
            return {}
        return {"targets": parts[0]["targets"],
                "gradient_norm": [v for p in parts for v in p["gradient_norm"]]}

    def _promote(self, ctx: AttackContext, G: np.ndarray, out_rows: np.ndarray,
                 rows: np.ndarray) -> dict:
        """Row ``out_rows[i]`` of ``G`` (θ's first n_items·d coordinates at least) becomes
        the promotion gradient of the Byzantine client of context row ``rows[i]``: zero,
        but at the targets' rows of P. Each client's approximated users are its draws from
        ``ctx.rng`` (S·d standard normals, in the order of ``rows``), kept in
        ``ctx.draws`` when the context keeps them, and taken from there for a client
        whose row is computed again."""
        model = ctx.model
        if model is None:
            raise ValueError("attack 'a-ra' needs the model in the attack context (model=None)")
        self.check_model(model)
        if not self.targets.strip():
            raise ValueError("attack 'a-ra' needs its target items resolved before the round "
                             "(targets='' : call resolve_targets and pass them as targets=)")
        n_items, d = int(model.n_items), int(model.dim)
        T = parse_targets(self.targets, n_items)
        theta = np.asarray(ctx.state["theta"])
        P = theta[: n_items * d].reshape(n_items, d)
        cols = (T[:, None] * d + np.arange(d)[None, :])
        norms = []
        for i, r in zip(out_rows, rows):
            client = int(ctx.clients[r])
            z = None if ctx.draws is None else ctx.draws.get(client)
            if z is None:
                z = np.empty((self.samples, d))
                ctx.rng.standard_normal(out=z)
                if ctx.draws is not None:
                    ctx.draws[client] = z
            g = promotion_gradient(P, T, float(self.sigma) * z, self.hum_steps, float(self.hum_lr))
            G[i] = 0
            with np.errstate(over="ignore", invalid="ignore"):
                G[i, cols] = g
            norms.append(float(np.linalg.norm(g)))
        return {"targets": T.tolist(), "gradient_norm": norms}
