"""Attacks of Byzantine clients (docs/attacks.md): the interface.

An attack is a frozen dataclass whose ``apply_inplace`` rewrites the Byzantine
rows of the round's uploads. Byzantine clients hold real data and have already
computed their real gradient and their honest upload (docs/training.md); the attack sees
the round's context and returns JSON-serialisable diagnostics.

Threat model (docs/attacks.md): the Byzantine clients of a round know the
server state, the optimiser and its hyperparameters, the round number and their
own honest gradients; they collude (they know which sampled clients are
Byzantine). Omniscient variants also read the honest gradients of every sampled
client. They may upload anything, but an upload that breaks the optimiser's
update rule is caught by verification (the paper's footnote 1), so the
gradient-space attacks craft a gradient and push it through the rule.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar, Mapping

import numpy as np

from rfrs_ref.params import check_kinds


@dataclasses.dataclass
class AttackContext:
    """What a Byzantine client (or a coalition of them) knows in round t.

    Attributes:
        t: the round (from 1).
        optimizer: the federated optimiser every client runs.
        state: the server state after round t − 1 (read-only).
        grads: (n, D) honest gradients of the round's sampled clients (read-only).
        uploads: name -> (n, D) uploads of the round; rewrite only Byzantine rows.
        byzantine: (n,) bool, which rows are Byzantine.
        clients: (n,) client ids of the rows.
        n_samples: (n,) training-set sizes.
        f: the number of Byzantine clients the server assumes this round.
        rng: the round's attack generator (stream ``attack``, key t).
        backend: kernel backend of the run.
        workspace: optional dict owned by the caller and kept across rounds;
            attacks keep their scratch buffers in it (allocated once per run
            instead of once per round). None: scratch is allocated per call.
        rule: the server's aggregation rule (``rfrs_ref.aggregate``), read by the
            attacks that tune themselves against it (``opt-ipm``, ``opt-alie``);
            None when the caller does not say.
        detect: the server's detection space, ``"gradient"`` or ``"parameter"``.
        model: the recommender (``rfrs_ref.model``), read by the attacks that
            craft gradients for it (``a-ra``); None when the caller does not say.
        draws: client -> its draws from ``rng`` this round, kept by a round that
            computes the Byzantine uploads a batch of clients at a time (an attack
            ``in_client_rule`` that draws): the first computation of a client's row
            draws from the one stream of the round, in the order of the Byzantine rows,
            as ``apply_inplace`` over the whole round does, and a row computed again
            (a low-memory round's second pass) reuses its draws. None: draw from
            ``rng`` every time.
    """

    t: int
    optimizer: object
    state: Mapping[str, np.ndarray]
    grads: np.ndarray
    uploads: Mapping[str, np.ndarray]
    byzantine: np.ndarray
    clients: np.ndarray
    n_samples: np.ndarray
    f: int
    rng: np.random.Generator
    backend: str = "numba"
    workspace: dict | None = None
    rule: object | None = None
    detect: str = "gradient"
    model: object | None = None
    draws: dict | None = None

    # -- helpers shared by the attacks ----------------------------------------------
    def byzantine_rows(self) -> np.ndarray:
        """int64 indices of the Byzantine rows, ascending."""
        byz = np.asarray(self.byzantine)
        n = self.grads.shape[0]
        if byz.shape != (n,) or byz.dtype != np.bool_:
            raise ValueError(f"byzantine must be a bool array of shape ({n},) (one flag per "
                             f"gradient row), got dtype {byz.dtype} shape {byz.shape}")
        return np.flatnonzero(byz).astype(np.int64)

    def scratch(self, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An uninitialised buffer of ``shape`` and ``dtype``.

        With a workspace, the buffer is kept under ``name`` and reused while a
        request fits in it (the first dimension may shrink; a larger request or
        another dtype or row length replaces it).
        """
        dtype = np.dtype(dtype)
        if self.workspace is None:
            return np.empty(shape, dtype)
        buf = self.workspace.get(name)
        if (buf is None or buf.dtype != dtype or buf.ndim != len(shape)
                or buf.shape[1:] != tuple(shape[1:]) or buf.shape[0] < shape[0]):
            buf = np.empty(shape, dtype)
            self.workspace[name] = buf
        return buf[: shape[0]]

    def kernel_backend(self) -> str:
        """``numpy`` for the float64 oracles, ``numba`` for every other backend (the
        attack's buffers live in host memory)."""
        return "numpy" if self.backend == "numpy" else "numba"


def optimizer_name(optimizer: Any) -> str:
    """The registry name of an optimiser given as an instance, a class or a name."""
    if isinstance(optimizer, str):
        return optimizer
    name = getattr(optimizer, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"expected an optimiser (instance, class or name), got {optimizer!r}")
    return name


@dataclasses.dataclass(frozen=True)
class Attack(abc.ABC):
    name: ClassVar[str] = ""
    #: the attack keeps the update rule, so its uploads pass verification
    obeys_rule: ClassVar[bool] = True
    #: optimiser names the attack applies to (None: every optimiser)
    optimizers: ClassVar[tuple[str, ...] | None] = None
    #: the attack reads the model from the context (and checks it with ``check_model``)
    needs_model: ClassVar[bool] = False
    #: the Byzantine upload is the client rule applied to a gradient computed from the
    #: client's own honest gradient and the round's public context alone
    #: (``own_gradients_inplace``; no other client; random draws only from the round's
    #: attack stream, each client's kept in ``ctx.draws``): a round computes it a batch
    #: of clients at a time, before the rule (docs/performance.md, "Attacked rounds that
    #: stream")
    in_client_rule: ClassVar[bool] = False
    #: ``in_client_rule``, with the gradient h(g) a function of each coordinate alone
    #: (``own_gradient_inplace``) and no diagnostics: a round also computes it once for
    #: coordinates where the honest gradients agree (FISM's shared rows)
    elementwise: ClassVar[bool] = False
    #: ``in_client_rule``, with every Byzantine client's gradient one function of the
    #: honest ones on the rows all clients share (FISM's Q outside the sampled clients'
    #: items: :meth:`shared_gradient_inplace`) and computed on the columns where they
    #: differ by :meth:`own_parts_inplace`: a round on shared rows can run it (every
    #: ``elementwise`` attack; a-ra, whose gradient is zero outside its targets' rows)
    shares_rows: ClassVar[bool] = False
    #: a Byzantine client computes its upload from its own gradient and upload, the server
    #: state and the round's attack stream alone, with no other client's data: it can run
    #: on a node of a real federation (``rfrs_ref.flower.PER_CLIENT_ATTACKS``)
    per_client: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_kinds(self)

    def check_optimizer(self, optimizer: Any) -> None:
        """Raise ValueError if the attack cannot run with ``optimizer`` (an
        instance, class or registry name). Call it when a run is configured, so
        that an impossible combination fails before training starts."""
        if self.optimizers is None:
            return
        name = optimizer_name(optimizer)
        if name not in self.optimizers:
            raise ValueError(
                f"attack {self.name!r} applies to optimiser(s) {', '.join(self.optimizers)} only, "
                f"got optimiser {name!r}{self._optimizer_reason()}")

    def check_model(self, model) -> None:
        """Raise ValueError if the attack cannot run with ``model``; every model by default."""

    def _optimizer_reason(self) -> str:
        return ""

    @abc.abstractmethod
    def apply_inplace(self, ctx: AttackContext) -> dict:
        """Rewrite ``ctx.uploads`` at the Byzantine rows; return diagnostics."""

    def own_gradient_inplace(self, g: np.ndarray) -> None:
        """Rewrite ``g`` (rows of honest gradients, any shape) in place into what a
        Byzantine client pushes through the client rule: g̃ᵢ = h(gᵢ), one function h of
        each coordinate alone. For attacks with ``elementwise`` True only."""
        raise NotImplementedError(f"attack {self.name!r} is not elementwise: its uploads need "
                                  f"the round's context (apply_inplace)")

    def own_gradients_inplace(self, ctx: AttackContext, G: np.ndarray, rows: np.ndarray) -> dict:
        """Rewrite rows ``rows`` (ascending) of ``G`` (n, D), the honest gradients of the
        Byzantine clients among n clients of the round, in place into the gradients they
        push through the client rule, from ``ctx``'s public fields (t, optimizer, state,
        the uploads' dtypes); return the rows' diagnostics, which
        :meth:`merge_diagnostics` combines over the batches of a round. For attacks with
        ``in_client_rule`` True only; an ``elementwise`` attack applies
        ``own_gradient_inplace`` to each row and records nothing."""
        if not self.elementwise:
            raise NotImplementedError(f"attack {self.name!r} is not computed in the client "
                                      f"rule: its uploads need the round's context")
        for r in rows:
            self.own_gradient_inplace(G[r])
        return {}

    def shared_gradient_inplace(self, g: np.ndarray) -> None:
        """Rewrite ``g``, the honest clients' gradient on the rows every client shares
        (FISM's 2λq outside the sampled clients' items), into the Byzantine clients' there.
        For attacks with ``shares_rows`` True only; an ``elementwise`` attack applies h."""
        self.own_gradient_inplace(g)

    def own_parts_inplace(self, ctx: AttackContext, parts: list, rows: np.ndarray) -> dict:
        """:meth:`own_gradients_inplace` on rows given by columns: ``parts``, the (n, Dₚ)
        pieces of the gradients on the columns where the clients differ, the first one
        θ's first coordinates (FISM's P), the others further rows (the Q rows the sampled
        clients own). For attacks with ``shares_rows`` True only; an ``elementwise``
        attack applies h to each piece."""
        if not self.elementwise:
            raise NotImplementedError(f"attack {self.name!r} cannot run in a round on "
                                      f"shared rows")
        for G in parts:
            for r in rows:
                self.own_gradient_inplace(G[r])
        return {}

    def merge_diagnostics(self, parts: list[dict], D: int) -> dict:
        """The round's diagnostics from :meth:`own_gradients_inplace`'s ``parts`` (the
        round's batches in row order, D coordinates): what ``apply_inplace`` returns for
        the same round."""
        return {}
