"""Non-finite uploads (ByzFL's ``Inf``) and the mimic attack (Karimireddy et al. 2022)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from rfrs_ref.attack.base import Attack, AttackContext
from rfrs_ref.params import hyper

#: the values a non-finite upload may hold, as spelled on the command line
NONFINITE_VALUES = {"inf": np.inf, "-inf": -np.inf, "nan": np.nan}


@dataclasses.dataclass(frozen=True)
class NonFinite(Attack):
    """Non-finite uploads: every uploaded array of a Byzantine client is filled with ``value``.

    Inf(x₁, …, xₙ) = (v, …, v) ∈ ℝᴰ, v ∈ {+inf, −inf, NaN}, written into every
    uploaded array (θ, and m, v or r) of every Byzantine row, in the upload's
    dtype. ``value = inf`` is ByzFL's ``Inf`` attack (which returns one +inf
    vector in the gradient space); ``-inf`` and ``nan`` are its variants.

    Convention: ByzFL's vector is the aggregated quantity itself; here the
    clients upload arrays, and the attack writes the value into all of them
    (a NaN θ with honest moments would test less of the server). The upload
    breaks the update rule (``obeys_rule`` is False): with verification on, a
    stateful optimiser's check rejects it (a non-finite θ is never the rule's
    output for a finite state) and the round goes on without it; SGD's θ
    cannot be checked, and the rules receive ±inf or NaN features, which every
    robust rule ranks as infinitely far (docs/aggregation.md); ``mean`` lets it
    through.

    Guarantee: honest rows, gradients and state are untouched; nothing is drawn
    from the generator. Diagnostics: ``value`` (its spelling).

    Reference: ByzFL 0.0.11, ``byzfl.attacks.Inf`` (J. Stephan et al., EPFL).

    Precondition: ``value`` is one of ``inf``, ``-inf``, ``nan``.
    """

    value: str = hyper("inf", "what every Byzantine upload is filled with: inf, -inf or nan",
                       choices=tuple(NONFINITE_VALUES))

    name: ClassVar[str] = "inf"
    per_client: ClassVar[bool] = True
    obeys_rule: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.value not in NONFINITE_VALUES:
            raise ValueError(f"inf attack value must be one of {', '.join(NONFINITE_VALUES)}, "
                             f"got value={self.value!r}")

    def apply_inplace(self, ctx: AttackContext) -> dict:
        rows = ctx.byzantine_rows()
        v = NONFINITE_VALUES[self.value]
        for U in ctx.uploads.values():
            U[rows] = v
        return {"value": self.value}


@dataclasses.dataclass(frozen=True)
class Mimic(Attack):
    """Mimic (Karimireddy et al. 2022): every Byzantine client uploads one honest client's upload.

    Mimic_ε(x₁, …, x_h) = x_{ε+1}: with the round's honest clients in row order
    (ascending client id), every Byzantine row receives a copy of every
    uploaded array of honest row number ``index`` (ByzFL's ``epsilon``, from 0).
    The copy obeys the update rule (it is an honest upload on the same server
    state), so it passes verification; its effect is to over-weight one
    client's data, which hurts most under heterogeneous (non-IID) clients,
    as in federated recommendation where every client is one user.

    Conventions: ByzFL indexes a fixed list of honest workers; here the honest
    clients change every round, so ``index`` counts the round's honest rows and
    is clamped to the last one when the round has fewer (``index_used`` in the
    diagnostics). An index that no round can reach (≥ min(n, the dataset's honest
    clients), n the clients sampled per round) is refused before the run starts, as
    ByzFL refuses one beyond its honest workers
    (``rfrs_ref.federated.trainer.check_attack_precondition``). A round with no honest client leaves the Byzantine uploads
    honest (there is nothing to mimic). Byzantine clients do not read the
    honest uploads of ByzFL's separate list: their mimicked upload is the round's
    honest upload itself, the knowledge of an omniscient attacker.

    Guarantee: honest rows, gradients and state are untouched; the Byzantine
    rows equal the mimicked row bit for bit (any backend). Diagnostics:
    ``index_used``, ``client`` (the mimicked client's id), or ``client: null``.

    Reference: S. P. Karimireddy, L. He, M. Jaggi, "Byzantine-Robust Learning on
    Heterogeneous Datasets via Bucketing", ICLR 2022; ByzFL 0.0.11
    ``byzfl.attacks.Mimic``.

    Precondition: ``index`` is an integer ≥ 0.
    """

    index: int = hyper(0, "mimic: which of the round's honest clients (0: the first, in "
                       "ascending client id) every Byzantine client copies")

    name: ClassVar[str] = "mimic"

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise ValueError(f"mimic index must be an integer ≥ 0, got index={self.index!r}")

    def apply_inplace(self, ctx: AttackContext) -> dict:
        rows = ctx.byzantine_rows()
        if rows.size == 0:
            return {}
        honest = np.flatnonzero(~np.asarray(ctx.byzantine))
        if honest.size == 0:
            return {"index_used": None, "client": None}
        i = min(int(self.index), honest.size - 1)
        src = int(honest[i])
        for U in ctx.uploads.values():
            U[rows] = U[src]
        return {"index_used": i, "client": int(ctx.clients[src])}
