"""One federated round (docs/training.md, the paper's Algorithms 1 and 2).

Round t (from 1), on the server state after round t − 1:

1. the server samples ``max(1, floor(e · n_clients))`` clients (stream
   ``sampling``, key t);
2. every sampled client computes its gradient gᵢ = ∇ℓᵢ(θ̄ᵗ⁻¹) on its training
   set (one gradient, no local epochs) and applies its optimiser's rule to the
   server state, producing its upload;
3. Byzantine clients rewrite their uploads (the attack);
4. the server recovers ĝᵢ from every upload when it needs it (gradient-space
   detection, verification or the resilience monitor), excludes uploads that
   fail update-rule verification, builds the detection features (ĝᵢ, or
   θᵢ − θ̄ᵗ⁻¹ in parameter space), and lets the aggregation rule combine the
   uploads into the new state.

Each uploaded client that fails verification is provably not honest (honest
uploads always pass), so the server's assumed Byzantine count for the rule is
reduced by one per exclusion: f_rule = max(0, f − excluded), with
f = floor(α_assumed · |sampled|).

Everything of size n × D lives in :class:`RoundBuffers`, allocated once per
run: writing into fresh memory every round costs more than the arithmetic.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Mapping

import numpy as np

from rfrs_ref.attack.base import AttackContext
from rfrs_ref.federated.population import assumed_byzantine, sample_clients
from rfrs_ref.seeding import generator

DETECT_SPACES = ("gradient", "parameter")


@dataclasses.dataclass
class Federation:
    """The fixed ingredients of a run.

    Attributes:
        model: the recommender (``rfrs_ref.model``).
        optimizer: the federated optimiser (``rfrs_ref.optim``).
        rule: the aggregation rule (``rfrs_ref.aggregate``).
        detect: ``"gradient"`` (recovered ĝ, the paper's proposal) or
            ``"parameter"`` (uploaded θ − θ̄, the existing defences).
        attack: what Byzantine clients do (``rfrs_ref.attack``).
        train: the clients' training sets, or None for a federation built only to ask
            what its rounds do (:func:`rounds_recompute_uploads`), which runs no round.
        byzantine: (n_clients,) bool, the fixed Byzantine set.
        client_fraction: e, the fraction of clients sampled per round.
        assumed_fraction: α_assumed; f = floor(α_assumed · |sampled|).
        seed: the trial seed.
        verify: check every upload against the update rule.
        resilience: record the Definition 1–4 sums every round.
        backend: kernel backend (``numpy``, ``numba``, ``cuda``).
        trace: record per-client gradient norms and state checksums.
        low_memory: let a robust round that can (:attr:`recomputes_uploads`) hold its
            uploads a batch of clients at a time and compute the kept clients' uploads
            a second time for the rule's weighted sums: the same state and record, bit
            for bit, with two n × D arrays fewer per upload array (docs/performance.md,
            "Robust rounds in low memory").
    """

    model: Any
    optimizer: Any
    rule: Any
    detect: str
    attack: Any
    train: Any
    byzantine: np.ndarray
    client_fraction: float
    assumed_fraction: float
    seed: int
    verify: bool = True
    resilience: bool = False
    backend: str = "numba"
    trace: bool = False
    low_memory: bool = False

    def __post_init__(self) -> None:
        if self.detect not in DETECT_SPACES:
            raise ValueError(f"detect must be one of {DETECT_SPACES}, got {self.detect!r}")
        self.n_samples = None if self.train is None else self.train.counts().astype(np.int64)

    @property
    def n_clients(self) -> int:
        return self.train.n_users

    @property
    def needs_features(self) -> bool:
        """Whether rounds need the (n × D) feature buffer."""
        return self.needs_recovery or getattr(self.rule, "uses_features", True)

    @property
    def attacks_in_client_rule(self) -> bool:
        """Whether the Byzantine clients' uploads are computed with the honest ones: the
        attack is ``in_client_rule`` (each Byzantine upload is the rule on a gradient
        computed from the client's own, e.g. ascent's −g, camouflage's g̃), and nothing
        reads the honest gradients afterwards (no resilience monitor). The round then
        rewrites the Byzantine rows of each batch of gradients before the client rule
        (``Attack.own_gradients_inplace``), where ``apply_inplace`` would compute the
        honest upload and overwrite it with the rule on the attack's gradient: the same
        uploads and diagnostics, bit for bit, each upload written once."""
        return getattr(self.attack, "in_client_rule", False) and not self.resilience

    @property
    def keeps_gradients(self) -> bool:
        """Whether the sampled clients' honest gradients are read after the client rule
        (an attack that is not :attr:`attacks_in_client_rule` reads them, the
        resilience monitor compares with them); when not, the round computes them a
        batch of clients at a time (:class:`RoundBuffers`)."""
        return (self.attack.name != "none" and not self.attacks_in_client_rule) or self.resilience

    @property
    def streams(self) -> bool:
        """Whether rounds can run a batch of clients at a time from the gradients to the
        aggregate (:func:`run_round` with :class:`RoundBuffers` of fewer upload rows than
        clients): nobody rewrites or rereads the uploads or the gradients (no attack
        but one computed in the client rule, no resilience monitor, no recovered
        gradients wanted) and the rule's weights are fixed by the nᵢ (the weighted
        mean), so the server's one pass can sum each batch as it comes. The numba
        backend only."""
        return (not self.keeps_gradients and not self.needs_recovery and self.backend == "numba"
                and getattr(self.rule, "has_fixed_weights", False))

    @property
    def recomputes_uploads(self) -> bool:
        """Whether rounds hold the uploads a batch at a time although the rule compares
        every client (``low_memory``): the rule combines the uploads by weights it takes
        from the features alone (``Rule.combines_by_weights``), the features are built in
        verification's read, the honest gradients are not read after the client rule
        (:attr:`keeps_gradients`), no client keeps private state, and no trace wants the
        uploads. The round then computes the uploads twice, once for the features and
        verification, once, for the clients the rule weighs, for the weighted sums
        (:func:`_recomputed_round`; on the columns where the clients differ only, in a
        round that computes the shared rows once, :func:`_shared_rows_compared_round`).
        The numba backend only."""
        rule = self.rule
        return (self.low_memory and self.backend == "numba" and self.verify
                and getattr(rule, "combines_by_weights", False)
                and getattr(rule, "uses_features", True)
                and not getattr(rule, "takes_round_inputs", False)
                and not getattr(rule, "state_arrays", ())
                and not self.keeps_gradients and not self.trace
                and not getattr(self.model, "has_private", False) and not self.streams)

    @property
    def compares_shared_rows(self) -> bool:
        """Whether a round that holds its uploads computes the rows its clients share once
        (:func:`_shared_rows_compared_round`): a model whose clients' gradients share rows
        (FISM's Q outside each client's items), no private client state, a rule whose
        weights are a function of the features' pairwise distances alone
        (``Rule.weighs_by_distances``: Krum, hence A-RFRS, and RFA, whose Weiszfeld
        steps run on the distance matrix) or of each column's ranks alone
        (``Rule.trims_by_column``: the median, the trimmed mean, Meamed; or selects by the
        distances and then keeps such a window, ``Rule.selects_by_distances``: Bulyan),
        verification on, no attack
        or one computed in the client rule that ``shares_rows`` (ascent, a-ra), nothing that
        reads the gradients or the uploads' rows afterwards (no monitor, no trace), no
        pre-aggregation or rule state. The numba backend only."""
        rule, attack = self.rule, self.attack
        attack_ok = attack.name == "none" or (self.attacks_in_client_rule
                                              and getattr(attack, "shares_rows", False))
        if (attack.name != "none" and not getattr(attack, "elementwise", False)
                and getattr(rule, "distances64", False)):
            # RFA under a-ra: the Byzantine features nearly coincide (zero but at the
            # targets' rows), and the Weiszfeld steps' certainty test on the distances by
            # parts failed in most rounds, each then computed twice (by parts, then on
            # full rows): the round holds every row from the start
            attack_ok = False
        return (self.backend == "numba" and self.verify and attack_ok
                and (getattr(rule, "weighs_by_distances", False)
                     or getattr(rule, "trims_by_column", False)
                     or getattr(rule, "selects_by_distances", False))
                and getattr(rule, "uses_features", True)
                and not getattr(rule, "takes_round_inputs", False)
                and not getattr(rule, "state_arrays", ())
                and not self.keeps_gradients and not self.trace and not self.resilience
                and hasattr(self.model, "shared_block")
                and not getattr(self.model, "has_private", False))

    @property
    def derives_features(self) -> bool:
        """Whether a round on shared rows (:attr:`compares_shared_rows`) holds no feature
        rows on the columns where the clients differ: every feature is then a function of
        one uploaded array and the server's state, coordinate by coordinate
        (``Optimizer.feature_derivation``): θᵢ − θ̄ with parameter-space detection, and
        with gradient-space detection the recovered gradient of SGD, momentum and Adam
        (A-RFRS: (mᵢ − β₁m̄)/(1 − β₁)). The rule's kernels compute it where they read the
        upload (the distances a column block at a time, ``pairwise_sq_dists(...,
        base=, coef=)`` and ``pairwise_sq_dists64``; the coordinate-wise windows per
        column, ``coordinatewise_combine(..., base=, coef=)``). Verification reads the
        uploads without keeping features: in parameter space ``verify_batch(screen=True)``
        (whose verdicts ``features_verify_batch`` gives bit for bit), in gradient space
        ``features_verify_batch`` a batch of clients at a time, its ĝ written into the
        gradient rows the client rule has consumed. The same features, verdicts, state
        and record as the round that holds them, with one n × |C| array fewer
        (docs/performance.md, "Parameter-space rounds without feature rows" and
        "Gradient-space rounds without feature rows"). Not for AdaGrad and RMSProp in
        gradient space (their recovery reads two arrays), nor in low memory
        (:attr:`recomputes_uploads`), whose rounds hold the features instead of the
        uploads."""
        space = "gradient" if self.needs_recovery else "parameter"
        return (self.compares_shared_rows and not self.recomputes_uploads
                and self.optimizer.feature_derivation(space) is not None)

    @property
    def needs_recovery(self) -> bool:
        """Whether the server materialises ĝ for every upload (verification
        recovers it on the fly when nothing else needs it)."""
        gradient_features = self.detect == "gradient" and getattr(self.rule, "uses_features", True)
        return gradient_features or self.resilience or self.trace


#: rows of the gradient buffer of a run that does not keep its gradients, and of the
#: upload buffers of a run that streams (``RoundBuffers(grad_rows=, upload_rows=)``):
#: enough clients per batch for the gradient kernel to balance its threads, and a
#: multiple of four, the group of rows of the weighted sums
GRADIENT_BATCH = 16


def shared_rows_columns(shared_block: tuple[int, int, int], n: int, mean_items: float) -> int:
    """How many columns the buffers of a run whose rounds compute the shared rows once
    hold per row at first (``Trainer.buffers``; a sweep's memory estimate counts the
    same): the dense part and Q's rows of n clients' items, at most their count, taken a
    quarter over its mean to leave room for most rounds (a round that needs more grows
    them, :meth:`RoundBuffers.flat`)."""
    start, n_rows, width = shared_block
    return start + min(n_rows, int(1.25 * n * mean_items) + 1) * width


def rounds_recompute_uploads(config) -> bool:
    """Whether the rounds of a run of ``config`` (a ``TrainConfig``) given ``low_memory``
    hold their uploads a batch at a time (:attr:`Federation.recomputes_uploads`), asked of
    the very objects a trainer builds, without the data (a sweep's memory estimate). False
    for a configuration that does not resolve."""
    fed = _federation_without_data(config, low_memory=True)
    return fed is not None and fed.recomputes_uploads


def rounds_compare_shared_rows(config) -> bool:
    """Whether the rounds of a run of ``config`` compute the rows the clients share once
    and hold the columns where they differ only (:attr:`Federation.compares_shared_rows`;
    with ``low_memory`` too, whose rounds then hold the uploads of a batch of clients on
    those columns), asked as :func:`rounds_recompute_uploads` asks."""
    fed = _federation_without_data(config, low_memory=False)
    return fed is not None and fed.compares_shared_rows


def rounds_derive_features(config) -> bool:
    """Whether the rounds of a run of ``config`` on shared rows hold no feature rows
    (:attr:`Federation.derives_features`), asked as :func:`rounds_recompute_uploads`
    asks."""
    fed = _federation_without_data(config, low_memory=False)
    return fed is not None and fed.derives_features


def _federation_without_data(config, low_memory: bool):
    """The Federation a trainer of ``config`` builds, with a one-item model and no data;
    None for a configuration that does not resolve."""
    from rfrs_ref.aggregate import RULES
    from rfrs_ref.aggregate.pre import build as with_pre
    from rfrs_ref.attack import ATTACKS
    from rfrs_ref.federated.config import _rule_name
    from rfrs_ref.model import MODELS
    from rfrs_ref.optim import OPTIMIZERS

    try:
        c = config.resolved()
        fed = Federation(
            model=MODELS.get(c.model)(n_items=1, **c.model_params),
            optimizer=OPTIMIZERS.get(c.optimizer)(**c.optimizer_params),
            rule=with_pre(c.pre, c.pre_params, RULES.get(_rule_name(c.defense))(**c.defense_params)),
            detect=c.detect, attack=ATTACKS.get(c.attack)(**c.attack_params), train=None,
            byzantine=np.zeros(0, dtype=bool), client_fraction=c.client_fraction,
            assumed_fraction=0.0, seed=c.seed, verify=c.verify, resilience=c.resilience,
            backend=c.backend, trace=c.trace, low_memory=low_memory)
    except (ValueError, KeyError, TypeError):
        return None
    return fed


class RoundBuffers:
    """Per-run scratch: gradients, uploads and features, each (n_max, D).

    ``grads`` holds the clients' honest gradients, ``uploads[name]`` what they
    send, ``features`` what the rule compares (recovered gradients or θ − θ̄).
    ``grad_rows`` < n_max makes ``grads`` that many rows only, for a run that
    reads no gradient after the client rule (``Federation.keeps_gradients`` is
    False): the round then computes gradients and uploads a batch of clients at
    a time, the same rows bit for bit (each client's gradient is computed on its
    own), with one n × D array less. ``upload_rows`` < n_max (a multiple of 4)
    does the same for the uploads of a run that streams (``Federation.streams``):
    the round then goes from gradients to the weighted sums a batch at a time,
    holding O(batch · D) instead of O(n · D).
    """

    def __init__(self, n_max: int, n_params: int, dtype, names: tuple[str, ...],
                 private_dim: int = 0, features: bool = True, grad_rows: int | None = None,
                 upload_rows: int | None = None, shared_rows: bool = True,
                 columns: int | None = None) -> None:
        dtype = np.dtype(dtype)
        if upload_rows is not None and upload_rows < n_max and upload_rows % 4:
            raise ValueError(f"upload_rows must be a multiple of 4 (the weighted sums' group of "
                             f"rows), got {upload_rows}")
        self.n_max, self.n_params, self.dtype, self.names = n_max, n_params, dtype, tuple(names)
        self.private_dim = private_dim
        #: a streamed round computes the rows of θ a model's clients share once
        #: (``_shared_rows_round``); False computes every client's row in full (the same
        #: bits, for the tests that prove it)
        self.shared_rows = bool(shared_rows)
        rows = n_max if upload_rows is None else min(n_max, upload_rows)
        #: the upload and feature buffers hold ``columns`` < D values a row: a run whose
        #: rounds compute the rows the clients share once (``_shared_rows_compared_round``)
        #: needs n × |C| only, C the columns where clients differ; they grow when a round
        #: needs more (:meth:`flat`), and a round that must hold every row takes
        #: :meth:`full` buffers for itself
        self.compact = columns is not None and columns < n_params
        #: buffers laid out for the rounds on shared rows (``columns`` given, by
        #: ``Trainer.buffers`` for a run whose rounds compute them): only such buffers
        #: run them, so buffers of every row (``full``) always hold the round's uploads
        #: and features row by row for whoever reads them after the round
        self.shared_columns = columns is not None
        cols = min(n_params, columns) if self.compact else n_params
        # np.ones touches every page now rather than during the first round
        self.grads = np.ones((n_max if grad_rows is None else min(n_max, grad_rows), n_params),
                             dtype)
        self.uploads = {k: np.ones((rows, cols), dtype) for k in names}
        #: None when the run never needs features (a rule that ignores them, and
        #: no recovered gradients wanted): one n × D array less
        self.features = np.ones((n_max, cols), dtype) if features else None
        self.private_grads = np.zeros((n_max, private_dim), dtype) if private_dim else None
        #: scratch arrays an attack keeps from round to round
        self.attack_workspace: dict = {}

    def full(self, features: bool, rows: int | None = None,
             grad_rows: int | None = None) -> "RoundBuffers":
        """Buffers of the same run with every row and column (a streamed or compact
        round that has to hold every upload after all); ``rows``: gradients and uploads
        of that many clients only, every column (a compact round in low memory that
        falls back to the round on full rows in low memory); ``grad_rows``: gradients of
        that many clients at a time (default ``rows``)."""
        return RoundBuffers(self.n_max, self.n_params, self.dtype, self.names,
                            private_dim=self.private_dim, features=features,
                            shared_rows=self.shared_rows,
                            grad_rows=rows if grad_rows is None else grad_rows,
                            upload_rows=rows)

    def flat(self, name: str, size: int) -> np.ndarray:
        """The first ``size`` values of buffer ``name`` (``"features"`` or an uploaded
        array) as a flat writable view; a compact buffer too small for them is replaced
        by one with a tenth more columns than they need (its values are not kept)."""
        arr = self.features if name == "features" else self.uploads[name]
        if arr.size < size:
            rows = arr.shape[0]
            cols = min(self.n_params, -(-size // rows) * 11 // 10 + 1)
            arr = np.empty((rows, cols), self.dtype)
            if name == "features":
                self.features = arr
            else:
                self.uploads[name] = arr
        return arr.reshape(-1)[:size]

    @property
    def nbytes(self) -> int:
        rows = sum(a.nbytes for a in self.uploads.values())
        return self.grads.nbytes + rows + (0 if self.features is None else self.features.nbytes)


def _compact_rows_inplace(ok: np.ndarray, arrays: list[np.ndarray]) -> None:
    """Move the rows where ``ok`` is True to the front, in order (each array in place)."""
    dst = 0
    for src in range(ok.size):
        if ok[src]:
            if src != dst:
                for a in arrays:
                    a[dst] = a[src]
            dst += 1


@dataclasses.dataclass
class _Round:
    """What one round's phases hand to each other (rows: the sampled clients, in order)."""

    t: int
    clients: np.ndarray
    byz: np.ndarray
    n_samples: np.ndarray
    f: int
    timing: dict
    #: what the feature rows hold once the server has built them in its one read of the
    #: uploads ("gradient" or "parameter"); None until then
    features: str | None = None
    #: the diagnostics of an attack computed in the client rule, one part per batch
    attack_parts: list = dataclasses.field(default_factory=list)
    #: the round's attack stream (``attack``, key t) for an attack computed in the client
    #: rule, one generator for all the round's batches (made when first needed), and the
    #: draws it gave each Byzantine client (``AttackContext.draws``)
    attack_rng: np.random.Generator | None = None
    attack_draws: dict = dataclasses.field(default_factory=dict)


def run_round(fed: Federation, state: Mapping[str, np.ndarray], t: int, buf: RoundBuffers,
              private: dict | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """Run round ``t`` on ``state`` (the server state after round t − 1).

    Returns the new server state (fresh arrays; ``state`` is not modified) and
    the round's record (JSON-serialisable). ``private`` (models with private
    client state, e.g. FMF) is updated in place for the sampled clients.

    The body is the round's phases in the order of the paper's Algorithms 1
    (clients) and 2 (server), one function each; their arithmetic lives in the
    kernels of the families (model, optimiser, attack, rule), not here. The
    server's half is :func:`server_round`, which a real federation
    (``rfrs_ref.flower``) calls with the uploads it received.
    """
    rd = _sample(fed, t)                                        # server: who takes part
    if buf.shared_rows and buf.shared_columns and fed.compares_shared_rows:
        out = _shared_rows_compared_round(fed, state, rd, buf)  # Alg. 1 and 2, shared rows once
        if out is not None:
            return out
        # a part not certainly verified: the round as below, on every row (in low memory,
        # still a batch of uploads at a time)
        rd = _sample(fed, t)
        if buf.compact:
            low = buf.uploads["theta"].shape[0] < rd.clients.size
            buf = buf.full(fed.needs_features,
                           rows=buf.uploads["theta"].shape[0] if low else None,
                           grad_rows=buf.grads.shape[0])
    if buf.features is None and fed.needs_features:
        # buffers of rounds that derive their features (``Federation.derives_features``)
        # handed to a round that holds them: take buffers with features (the gradients
        # still a batch at a time where the run's are)
        low = buf.uploads["theta"].shape[0] < rd.clients.size
        buf = buf.full(True, rows=buf.uploads["theta"].shape[0] if low else None,
                       grad_rows=buf.grads.shape[0])
    if buf.uploads["theta"].shape[0] < rd.clients.size and fed.recomputes_uploads:
        return _recomputed_round(fed, state, rd, buf)           # Alg. 1 and 2, uploads twice
    if buf.uploads["theta"].shape[0] < rd.clients.size:
        streamed = _streamed_round(fed, state, rd, buf, private)  # Alg. 1 and 2, by batches
        if streamed is not None:
            return streamed
        # an upload failed verification, which the guarantee rules out for honest ones:
        # the round again, holding every upload, excludes it as any round would
        rd, buf = _sample(fed, t), buf.full(fed.needs_features)
    G, U, losses = _client_uploads(fed, state, rd, buf, private)  # Alg. 1: gradient, rule
    attack_diag = _byzantine_uploads(fed, state, rd, G, U, buf)  # Byzantine clients rewrite
    return server_round(fed, state, rd, U, buf, losses=losses, attack_diag=attack_diag, honest=G)


def sample_round(fed: Federation, t: int) -> _Round:
    """Who takes part in round ``t``: the sampled clients (stream ``sampling``, key t,
    ascending), their Byzantine flags and training-set sizes, and the assumed f
    (``floor(α_assumed · |sampled|)``), as :func:`run_round` draws them."""
    return _sample(fed, t)


def server_round(fed: Federation, state: Mapping[str, np.ndarray], rd: "_Round | int",
                 uploads: Mapping[str, np.ndarray], buf: RoundBuffers, *, losses=None,
                 attack_diag: dict | None = None,
                 honest: np.ndarray | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """The server's half of round t (Algorithm 2) on the round's uploads.

    Args:
        fed: the federation.
        state: the server state after round t − 1 (not modified).
        rd: the round's clients (:func:`sample_round`, possibly narrowed to the
            clients that answered, with ``f`` kept), or the round number t
            (then sampled here).
        uploads: name -> (n, D) writable arrays, row r the upload of
            ``rd.clients[r]``; rows that pass verification are moved to the front
            in place (hostile values, NaN, ±inf, are input).
        buf: the run's buffers (features, private gradients).
        losses: (n,) the clients' losses (the record's mean over benign rows), or None.
        attack_diag: the attack's diagnostics for the record.
        honest: (n, D) the clients' honest gradients, compacted like the uploads;
            only the resilience monitor reads them (a real server has none).

    Returns:
        (new state, the round's record), as :func:`run_round`.

    Raises:
        ValueError: ``fed.resilience`` without ``honest`` gradients.
    """
    if isinstance(rd, (int, np.integer)):
        rd = _sample(fed, int(rd))
    if fed.resilience and honest is None:
        raise ValueError("the resilience monitor compares recovered with honest gradients; "
                         "server_round needs honest= (n, D) for it, and a real server has none")
    n = rd.clients.size
    U = dict(uploads)
    X = buf.features[:n] if buf.features is not None else None
    sums = _screen_and_sum(fed, state, rd, U)                    # Alg. 2 in one pass, if it can
    if sums is not None:
        ok, excluded = np.ones(n, dtype=bool), []
    elif X is not None and _features_in_one_read(fed):
        ok, excluded = _features_and_verify(fed, state, rd, U, X)  # Alg. 2: features, check
    else:
        ok, excluded = _recover_and_verify(fed, state, rd, U, X)  # Alg. 2: ĝ, update-rule check
    # without verification nothing else tells an honest upload that overflowed from one
    # a robust rule ranks as infinitely far (and whose round it may skip)
    nonfinite_honest = None if fed.verify else _nonfinite_honest(fed, rd, U)
    grad_norms = None
    if fed.trace and fed.needs_recovery:
        grad_norms = [float(np.linalg.norm(X[r].astype(np.float64))) for r in range(X.shape[0])]
    rows, Gk, Xk, Uk = _keep_verified(ok, honest, U, X, buf)     # excluded rows leave the buffers
    new_state, weights, kept_m, rule_diag, f_rule = _aggregate(fed, state, rd, rows, Xk, Uk, sums)
    record = _record(fed, rd, new_state, np.zeros(n) if losses is None else losses, excluded,
                     rows, weights, kept_m, rule_diag, f_rule, attack_diag or {}, grad_norms)
    if losses is None:
        record["loss"] = None
    if nonfinite_honest:
        record["nonfinite_honest"] = nonfinite_honest
    if fed.resilience and rows.size > 0:
        tick = time.perf_counter()
        gradients_in_x = fed.detect == "gradient" or not getattr(fed.rule, "uses_features", True)
        record["resilience"] = _resilience(fed, Gk, Xk if gradients_in_x else None,
                                           Uk, state, rd.t, kept_m > 0, ~rd.byz[rows])
        rd.timing["resilience"] = time.perf_counter() - tick
    record["timing"] = rd.timing
    return new_state, record


def _streamed_round(fed, state, rd: _Round, buf: RoundBuffers, private):
    """The round a batch of clients at a time, for a run that streams
    (``Federation.streams``): each batch's gradients, client rule, then the server's one
    pass (verification screen and weighted sums, ``Optimizer.screen_sum_batch``) adding
    into float64 running sums, so that no array of n × D is held.

    The same state and record as :func:`run_round` with every row held, bit for bit:
    gradients and uploads are computed client by client, the screen is the screen, and
    batches of a multiple of four rows continue the weighted sums' grouping of rows.
    Returns None, before anything is modified, when an upload fails verification (the
    caller runs the round again holding every upload).
    """
    opt, model, t, clients = fed.optimizer, fed.model, rd.t, rd.clients
    n, batch = clients.size, buf.uploads["theta"].shape[0]
    from rfrs_ref.aggregate.base import sample_sizes

    w = fed.rule.fixed_weights(sample_sizes(rd.n_samples, n))
    negatives = _negatives(fed, rd)
    # the shared rows map to one upload per class of client only under an attack that
    # ``shares_rows`` (h(2λq), or a-ra's 0, is the same for every Byzantine client)
    shared = not fed.attacks_in_client_rule or fed.attack.shares_rows
    if shared and buf.shared_rows and hasattr(model, "shared_block") and not model.has_private:
        out = _shared_rows_round(fed, state, rd, buf, w, negatives)
        if out is not None:
            return out
        rd.timing.clear()
        rd.attack_parts.clear()  # the rows again, from the same draws (rd.attack_draws)
    acc = {k: np.zeros(buf.n_params) for k in opt.arrays}
    losses = np.empty(n)
    for name in ("gradients", "client_rule", "verification_sums"):
        rd.timing[name] = 0.0
    for lo in range(0, n, batch):
        hi = min(n, lo + batch)
        U = {k: buf.uploads[k][:hi - lo] for k in opt.arrays}
        losses[lo:hi] = _batch_uploads(fed, state, rd, buf, lo, hi, negatives, private, U)
        tick = time.perf_counter()
        sure, _ = opt.screen_sum_batch(state, U, t, w[lo:hi], into=acc, screen=fed.verify)
        if fed.verify and not sure.all() and not opt.verify_batch(state, U, t, screen=True)[0].all():
            return None
        rd.timing["verification_sums"] += time.perf_counter() - tick
    if model.has_private:
        _update_private_inplace(opt, private, clients, buf.private_grads[:n])
    return _streamed_result(fed, state, rd, buf, acc, losses)


def _streamed_result(fed, state, rd: _Round, buf: RoundBuffers, acc, losses):
    """A streamed round's new state and record from its float64 running sums (rounded
    once to the state's dtype) and the clients' losses: no upload was excluded."""
    sums = {k: acc[k].astype(buf.dtype) for k in fed.optimizer.arrays}
    rows = np.arange(rd.clients.size)
    new_state, weights, kept_m, rule_diag, f_rule = _aggregate(fed, state, rd, rows, None, None, sums)
    record = _record(fed, rd, new_state, losses, [], rows, weights, kept_m, rule_diag, f_rule,
                     _client_rule_attack_diagnostics(fed, rd, buf.n_params), None)
    record["timing"] = rd.timing
    return new_state, record


def _shared_rows_round(fed, state, rd: _Round, buf: RoundBuffers, w, negatives):
    """:func:`_streamed_round` for a model whose gradients share rows (FISM's Q: a
    client's gradient there is 2λq outside the rows of its own items): the rows that
    every client of a batch shares are computed once per round, not once per client.

    1. The shared rows' gradient (``model.shared_gradient``), upload and screen, once
       (twice under an ``elementwise`` attack: the honest clients' and the Byzantine
       clients' h(2λq)).
    2. Each batch: the gradients, uploads, screen and weighted sums of the dense part
       (P) and of the rows of the batch's own items only.
    3. The other rows' sums from the one shared upload (``add_shared_rows``): rows some
       other batch owns after each batch, rows nobody owns once at the end.

    Every client's upload is what it would be in full (each value is the same
    expression of the same inputs), the screen's verdict of a row is the conjunction of
    its parts', and every coordinate's sum takes the same operations in the same order
    as summing whole rows, so the state and record are :func:`_streamed_round`'s, bit
    for bit (docs/performance.md, "Shared rows"). Returns None, before anything is
    modified, when some part is not certainly verified (the caller runs the round as
    before).
    """
    from rfrs_ref.kernels.optim import SCREEN_SUM_ROWS, add_shared_rows, threads_for

    opt, model, t, clients = fed.optimizer, fed.model, rd.t, rd.clients
    n, batch, arrays = clients.size, buf.uploads["theta"].shape[0], opt.arrays
    start, n_rows, width = model.shared_block
    for name in ("gradients", "client_rule", "verification_sums"):
        rd.timing[name] = 0.0
    sq, u_sh, cls = _shared_uploads(fed, state, rd)
    tick = time.perf_counter()
    if fed.verify and not opt.screen_sum_batch(sq, u_sh, t, np.ones(u_sh["theta"].shape[0]))[0].all():
        return None
    starts = range(0, n, batch)
    own = [np.unique(np.concatenate([fed.train.items_of(c) for c in clients[lo:lo + batch]]
                                    + [np.zeros(0, np.int64)])).astype(np.int64) for lo in starts]
    owned = np.zeros(n_rows, dtype=bool)
    for rows_b in own:
        owned[rows_b] = True
    acc = {k: np.zeros(buf.n_params) for k in arrays}
    head = {k: acc[k][:start] for k in arrays}
    accq = {k: acc[k][start:].reshape(n_rows, width) for k in arrays}
    flat_g = buf.grads.reshape(-1)
    flat_u = {k: buf.uploads[k].reshape(-1) for k in arrays}
    losses = np.empty(n)
    rd.timing["verification_sums"] += time.perf_counter() - tick
    for lo, rows_b in zip(starts, own):
        hi = min(n, lo + batch)
        m, q = hi - lo, rows_b.size * width
        tick = time.perf_counter()
        parts = [(slice(0, m * start), start), (slice(m * start, m * (start + q)), q)]
        G = [flat_g[sl].reshape(m, cols) for sl, cols in parts]
        U = [{k: flat_u[k][sl].reshape(m, cols) for k in arrays} for sl, cols in parts]
        losses[lo:hi] = model.grads_batch(
            state["theta"], fed.train, clients[lo:hi], G[0], q_rows=rows_b, out_q=G[1],
            negatives=None if negatives is None else negatives[lo:hi], backend=fed.backend)
        rd.timing["gradients"] += time.perf_counter() - tick
        _own_attack_inplace(fed, state, rd, buf, slice(lo, hi), G)
        tick = time.perf_counter()
        S = [{k: state[k][:start] for k in arrays},
             {k: state[k][start:].reshape(n_rows, width)[rows_b].ravel() for k in arrays}]
        for Sp, Gp, Up in zip(S, G, U):
            if Gp.shape[1]:
                opt.client_rule_batch(Sp, Gp, t, Up, backend=fed.backend)
        rd.timing["client_rule"] += time.perf_counter() - tick
        tick = time.perf_counter()
        mine = {k: accq[k][rows_b].ravel() for k in arrays}
        for Sp, Up, into in zip(S, U, (head, mine)):
            if Up["theta"].shape[1] and not opt.screen_sum_batch(
                    Sp, Up, t, w[lo:hi], into=into, screen=fed.verify)[0].all():
                return None
        bounds = np.append(np.arange(lo, hi, SCREEN_SUM_ROWS), hi).astype(np.int64) - lo
        others = owned.copy()
        others[rows_b] = False
        others = np.flatnonzero(others)
        with threads_for(others.size * width * m):
            for k in arrays:
                accq[k][rows_b] = mine[k].reshape(-1, width)
                add_shared_rows(u_sh[k], cls[lo:hi], w[lo:hi], bounds, others, width,
                                accq[k].reshape(-1))
        rd.timing["verification_sums"] += time.perf_counter() - tick
    tick = time.perf_counter()
    bounds = np.unique(np.concatenate([np.arange(lo, min(n, lo + batch), SCREEN_SUM_ROWS)
                                       for lo in starts] + [[n]])).astype(np.int64)
    nobody = np.flatnonzero(~owned)
    with threads_for(nobody.size * width * n):
        for k in arrays:
            add_shared_rows(u_sh[k], cls, w, bounds, nobody, width, accq[k].reshape(-1))
    rd.timing["verification_sums"] += time.perf_counter() - tick
    return _streamed_result(fed, state, rd, buf, acc, losses)


def _shared_uploads(fed, state, rd: _Round):
    """The rows every client of a class shares (FISM's Q outside each client's items):
    the state's rows there, the class of each sampled client (0 honest; 1 Byzantine
    under an attack computed in the client rule, whose clients share h(2λq) there), and
    one upload per class, the client rule on 2λq (and on h(2λq)); timed into the round's
    ``gradients`` and ``client_rule``. Returns (state rows, uploads (classes, L), cls)."""
    opt, model = fed.optimizer, fed.model
    start = model.shared_block[0]
    tick = time.perf_counter()
    sq = {k: state[k][start:] for k in opt.arrays}
    g_sh = model.shared_gradient(state["theta"]).reshape(1, -1)
    rd.timing["gradients"] += time.perf_counter() - tick
    attacked = fed.attacks_in_client_rule and bool(rd.byz.any())
    if attacked:
        # the Byzantine clients' shared rows: the rule on h(2λq) (a-ra: on 0), row 1 of the
        # shared rows
        g_sh = np.concatenate([g_sh, g_sh])
        fed.attack.shared_gradient_inplace(g_sh[1])
    n = rd.clients.size
    cls = rd.byz.astype(np.int64) if attacked else np.zeros(n, dtype=np.int64)
    tick = time.perf_counter()
    u_sh = {k: np.empty_like(g_sh) for k in opt.arrays}
    opt.client_rule_batch(sq, g_sh, rd.t, u_sh, backend=fed.backend)
    rd.timing["client_rule"] += time.perf_counter() - tick
    return sq, u_sh, cls


def _shared_rows_compared_round(fed, state, rd: _Round, buf: RoundBuffers):
    """The round of a rule that compares every client by its features' distances
    (``Federation.compares_shared_rows``: Krum, A-RFRS, RFA) or combines each column by
    a window of its ranks (the median, the trimmed mean, Meamed), with the rows the clients
    share computed once (docs/performance.md, "Robust rounds on shared rows").

    FISM's gradient on the history embeddings Q is 2λq on every row outside the client's
    own items, so on the rows that no sampled client owns (S) every honest upload and
    feature is one shared row, and under an ``elementwise`` attack every Byzantine one
    is another: there are as many distinct rows as classes of client. The round:

    1. computes the shared rows' gradient, upload, feature and screen once per class;
    2. computes every client's gradient, upload, feature and screen on the columns C
       where clients differ: P, and the Q rows some sampled client owns (a batch of
       clients at a time for the gradients and the client rule);
    3. the squared distances ‖xᵢ − xⱼ‖² = d_C(i, j) + [class i ≠ class j]·‖s₀ − s₁‖²_S,
       each term by :func:`~rfrs_ref.kernels.distances.pairwise_sq_dists` (RFA:
       float64 differences, ``pairwise_sq_dists64_by_parts``, with their error bound),
       and the rule's weights from them (``Rule.from_distances``);
    4. the weighted sums: on C by :func:`~rfrs_ref.aggregate.combine.add_rows_inplace`,
       on S by ``add_shared_rows``, rounded once to the state's dtype;

    or, for a rule that ``trims_by_column``, 3–4: the fused coordinate-wise kernel on C
    and, on S, each column from its one or two class values (``Rule.aggregate_by_columns``:
    the kernel's own operations, so the state and record of full rows bit for bit).

    In low memory (``Federation.recomputes_uploads``: buffers of fewer upload rows than
    clients) step 2 verifies and keeps the features of each batch as it comes and holds
    the uploads of one batch only, and step 4 computes the weighed clients' uploads on C
    a second time, a batch at a time (as :func:`_recomputed_round` does on full rows):
    the same state and record as the round that holds them, bit for bit.

    Every upload, feature and verdict is the one the round holding every row computes,
    and so are the sums given the weights (the same operations in the same order as
    ``combine_rows``). The distances are the same sums grouped otherwise: each is within
    the kernel's relative error of the exact sum, as the full matrix's is, so Krum
    chooses the same clients unless two of its scores are within that error of each
    other, and RFA's weights agree to about 1e-9 (docs/performance.md says which runs
    this changes). Returns None, before the state is touched, when some part is not
    certainly verified or RFA's steps need the rows themselves (the caller then runs
    the round holding every row, which excludes the upload as any round does).
    """
    opt, model, t, clients = fed.optimizer, fed.model, rd.t, rd.clients
    arrays, n = opt.arrays, clients.size
    start, n_rows, width = model.shared_block
    space = "gradient" if fed.needs_recovery else "parameter"
    for name in ("gradients", "client_rule", "features_verification"):
        rd.timing[name] = 0.0
    sq, u_sh, cls = _shared_uploads(fed, state, rd)  # the shared rows, once per class
    tick = time.perf_counter()
    x_sh = np.empty(u_sh["theta"].shape, dtype=buf.dtype)
    if not opt.features_verify_batch(sq, u_sh, t, x_sh, space, backend=fed.backend)[0].all():
        return None
    rd.timing["features_verification"] += time.perf_counter() - tick
    # the columns where the clients differ: P and the Q rows some sampled client owns
    owned = np.zeros(n_rows, dtype=bool)
    for c in clients:
        owned[fed.train.items_of(c)] = True
    own = np.flatnonzero(owned).astype(np.int64)
    nobody = np.flatnonzero(~owned).astype(np.int64)
    q = own.size * width

    def rows_of(flat, m):
        return flat[:m * start].reshape(m, start), flat[m * start:m * (start + q)].reshape(m, q)

    # low memory (``Federation.recomputes_uploads``): uploads of a batch of clients at a
    # time, verified as they come, and those the rule weighs computed again for the sums
    low = buf.uploads["theta"].shape[0] < n
    # in low memory a batch is the upload buffers' rows (a multiple of 4, as the sums need)
    batch = buf.uploads["theta"].shape[0] if low else min(GRADIENT_BATCH, buf.grads.shape[0])
    held = batch if low else n
    U = [dict(zip(arrays, parts)) for parts in zip(*(rows_of(buf.flat(k, held * (start + q)), held)
                                                     for k in arrays))]
    S = [{k: state[k][:start] for k in arrays},
         {k: state[k][start:].reshape(n_rows, width)[own].ravel() for k in arrays}]
    # features derived where the rule's kernels read the uploads, never held
    # (``Federation.derives_features``): each part of X is then the triple (upload array,
    # state array, derivation): θᵢ − θ̄, or ĝᵢ of an affine recovery (Adam's from m)
    derive = fed.derives_features and not low
    if derive:
        name, coef = opt.feature_derivation(space)
        X = [(Up[name], Sp[name], coef) for Sp, Up in zip(S, U)]
    else:
        X = rows_of(buf.flat("features", n * (start + q)), n)
    # gradient-space features derived so are verified a batch at a time, their ĝ written
    # into the gradient rows the client rule has consumed (the verdicts of the round
    # that holds the features, from the same ĝ in the same dtype)
    scratch = derive and space == "gradient"
    negatives = _negatives(fed, rd)

    def uploads_of(sel, r0):
        """Gradients, attack and client rule of sampled clients ``sel`` (a slice or an
        index array) into U's rows from r0; returns their losses."""
        m = clients[sel].size
        tick = time.perf_counter()
        G = rows_of(buf.grads.reshape(-1), m)
        negs = None
        if negatives is not None:
            negs = negatives[sel] if isinstance(sel, slice) else [negatives[i] for i in sel]
        out = model.grads_batch(state["theta"], fed.train, clients[sel], G[0], q_rows=own,
                                out_q=G[1], negatives=negs, backend=fed.backend)
        rd.timing["gradients"] += time.perf_counter() - tick
        _own_attack_inplace(fed, state, rd, buf, sel, G)
        tick = time.perf_counter()
        for Sp, Gp, Up in zip(S, G, U):
            if Gp.shape[1]:
                opt.client_rule_batch(Sp, Gp, t, {k: Up[k][r0:r0 + m] for k in arrays},
                                      backend=fed.backend)
        rd.timing["client_rule"] += time.perf_counter() - tick
        return out

    def verified(lo, hi, r0):
        """The features of sampled clients lo..hi − 1 (uploads from U's row r0; none
        when the rule derives them) and whether every one of them certainly passes
        verification."""
        tick = time.perf_counter()
        for p, (Sp, Up) in enumerate(zip(S, U)):
            if not Up["theta"].shape[1]:
                continue
            ups = {k: Up[k][r0:r0 + hi - lo] for k in arrays}
            if scratch:
                out = rows_of(buf.grads.reshape(-1), hi - lo)[p]
                ok = opt.features_verify_batch(Sp, ups, t, out, space, backend=fed.backend)[0]
            elif derive:
                ok = opt.verify_batch(Sp, ups, t, backend=fed.backend, screen=True)[0]
            else:
                ok = opt.features_verify_batch(Sp, ups, t, X[p][lo:hi], space,
                                               backend=fed.backend)[0]
            if not ok.all():
                return False
        rd.timing["features_verification"] += time.perf_counter() - tick
        return True

    losses = np.empty(n)
    for lo in range(0, n, batch):
        hi = min(n, lo + batch)
        losses[lo:hi] = uploads_of(slice(lo, hi), 0 if low else lo)
        if low and not verified(lo, hi, 0):
            return None
    if not low:
        # every upload at once, or (features into the gradient rows) a batch at a time
        step = batch if scratch else n
        for lo in range(0, n, step):
            if not verified(lo, min(n, lo + step), lo):
                return None
    rd.features = space
    attack_diag = _client_rule_attack_diagnostics(fed, rd, buf.n_params)
    # the rule: on the distances (C's by the kernel, S's by class), or column by column
    tick = time.perf_counter()
    x_s = x_sh.reshape(-1, n_rows, width)[:, nobody].reshape(x_sh.shape[0], -1)
    layout = (start, n_rows, width, own, nobody)

    def add_uploads(weights, acc):
        """Σᵢ wᵢ · uploadᵢ on C into acc (name -> [P's part, the owned rows' part], float64):
        the held rows, or, in low memory, the weighed clients' uploads again, a batch at
        a time (batches of a multiple of four rows: the same sums, bit for bit)."""
        from rfrs_ref.aggregate.combine import add_rows_inplace

        if not low:
            for k in arrays:
                for Up, a in zip(U, acc[k]):
                    if a.size:
                        add_rows_inplace(Up[k], weights, a)
            return
        with _uploads_again(rd):
            for part in _live_batches(weights, batch):
                uploads_of(part, 0)
                for k in arrays:
                    for Up, a in zip(U, acc[k]):
                        if a.size:
                            add_rows_inplace(Up[k][:part.size], weights[part], a)

    if getattr(fed.rule, "trims_by_column", False) or getattr(fed.rule, "selects_by_distances",
                                                              False):
        agg = _trimmed_by_columns(fed, state, rd, buf, layout, X, U, x_s, u_sh, cls)
    else:
        agg = _weighed_by_distances(fed, state, rd, buf, layout, X, add_uploads, x_s, u_sh, cls)
    if agg is None:
        return None  # the rule needs the rows themselves: the round on full rows
    rd.timing["aggregation"] = time.perf_counter() - tick - rd.timing.get("uploads_again", 0.0)
    new_state, weights, kept_m, rule_diag, f_rule = agg
    record = _record(fed, rd, new_state, losses, [], np.arange(n), weights, kept_m, rule_diag,
                     f_rule, attack_diag, None)
    record["timing"] = rd.timing
    return new_state, record


def _weighed_by_distances(fed, state, rd: _Round, buf: RoundBuffers, layout, X, add_uploads,
                          x_s, u_sh, cls):
    """A ``weighs_by_distances`` rule's aggregate on the parts of a round on shared rows:
    the distances by parts (float64 differences with their bound for RFA), the rule's
    weights from them, the weighted sums on C (``add_uploads(weights, acc)``, which adds
    the held uploads or computes the weighed ones again) and on S (``add_shared_rows``),
    rounded once. Returns :func:`_aggregate`'s tuple, or None where the rule needs the
    rows themselves."""
    from rfrs_ref.aggregate.base import NeedsRows, NothingFinite
    from rfrs_ref.kernels.optim import add_shared_rows, threads_for

    start, n_rows, width, own, nobody = layout
    n, arrays = rd.clients.size, fed.optimizer.arrays
    D2, ok, error = _distances_by_parts(fed, X, x_s, cls)
    try:
        result = fed.rule.from_distances(D2, ok, rd.n_samples, rd.f, backend=fed.backend,
                                         error=error)
    except NeedsRows:
        return None
    except NothingFinite as exc:
        return _carry_over(fed, state, f"no finite upload ({exc})", rd.f, n)
    weights = result.weights
    acc = {k: np.zeros(buf.n_params) for k in arrays}
    bounds = np.array([0, n], dtype=np.int64)
    owned = {k: [acc[k][:start], np.zeros(own.size * width)] for k in arrays}
    add_uploads(weights, owned)
    for k in arrays:
        accq = acc[k][start:].reshape(n_rows, width)
        accq[own] = owned[k][1].reshape(-1, width)
        with threads_for(nobody.size * width * n):
            add_shared_rows(u_sh[k], cls, weights, bounds, nobody, width, accq.reshape(-1))
    new_state = {k: acc[k].astype(buf.dtype) for k in arrays}
    return new_state, weights, np.asarray(result.kept, float), result.diagnostics, rd.f


def _distances_by_parts(fed, X, x_s, cls):
    """``(D2, finite, error)``: the squared distances of the whole rows' features summed
    by parts (C's parts ``X``, each a matrix or a triple (upload array, state array,
    derivation) of features ``derived_features`` of it (θᵢ − θ̄, or ĝᵢ), and
    S's by class), +inf for a client with a non-finite feature (as
    ``client_distances``), and which clients are finite; for a rule with
    ``distances64`` (RFA) float64 differences of the finite clients with their relative
    error bound, else the blocked kernel's (error None)."""
    from rfrs_ref.aggregate.base import FiniteUploads
    from rfrs_ref.aggregate.combine import finite_clients
    from rfrs_ref.kernels.distances import (derived_rows_finite, pairwise_sq_dists64_by_parts,
                                            pairwise_sq_dists_by_parts)

    n = cls.size
    ok = finite_clients(x_s, FiniteUploads())[cls]
    for Xp in X:
        ok &= (derived_rows_finite(*Xp) if isinstance(Xp, tuple)
               else finite_clients(Xp, FiniteUploads()))
    error = None
    if getattr(fed.rule, "distances64", False):
        live = np.flatnonzero(ok)
        D2 = np.full((n, n), np.inf)
        D2[np.ix_(live, live)], error = pairwise_sq_dists64_by_parts(X, x_s, cls, live)
    else:
        D2 = pairwise_sq_dists_by_parts(X, x_s, cls, backend=fed.backend)
        D2[~ok, :] = np.inf  # a non-finite client is far from all
        D2[:, ~ok] = np.inf
    return D2, ok, error


def _trimmed_by_columns(fed, state, rd: _Round, buf: RoundBuffers, layout, X, U, x_s, u_sh,
                        cls):
    """A ``trims_by_column`` rule's aggregate (median, trimmed mean, Meamed), or a
    ``selects_by_distances`` one's (Bulyan: its selection on the distances by parts), on
    the parts of a round on shared rows: the fused kernel on C, and on S each column from
    its class values (``Rule.aggregate_by_columns``), the pieces put back in place.
    A part of ``X`` that is a triple (upload array, state array, derivation)
    (``Federation.derives_features``) is the features ``derived_features`` of it
    (θᵢ − θ̄, or an affine recovery ĝᵢ), computed in the kernels.
    Returns :func:`_aggregate`'s tuple, or None where the rule needs the rows
    themselves."""
    from rfrs_ref.aggregate.base import FiniteUploads, NeedsRows, NothingFinite

    start, n_rows, width, own, nobody = layout
    arrays = fed.optimizer.arrays
    u_s = {k: u_sh[k].reshape(-1, n_rows, width)[:, nobody].reshape(x_s.shape[0], -1)
           for k in arrays}
    parts = [(Xp[0], FiniteUploads(Up), *Xp[1:]) if isinstance(Xp, tuple)
             else (Xp, FiniteUploads(Up)) for Xp, Up in zip(X, U)]
    distances = None
    if getattr(fed.rule, "selects_by_distances", False):
        D2, ok, _ = _distances_by_parts(fed, X, x_s, cls)
        distances = (D2, ok)
    try:
        result = fed.rule.aggregate_by_columns(parts, (x_s, u_s), cls, rd.n_samples, rd.f,
                                               backend=fed.backend, distances=distances)
    except NeedsRows:
        return None
    except NothingFinite as exc:
        return _carry_over(fed, state, f"no finite upload ({exc})", rd.f, cls.size)
    new_state = {}
    for k in arrays:
        p_part, q_part, s_part = result.arrays[k]
        out = np.empty(buf.n_params, dtype=p_part.dtype)
        out[:start] = p_part
        outq = out[start:].reshape(n_rows, width)
        outq[own] = q_part.reshape(-1, width)
        outq[nobody] = s_part.reshape(-1, width)
        new_state[k] = out
    return new_state, None, np.asarray(result.kept, float), result.diagnostics, rd.f


def _recomputed_round(fed, state, rd: _Round, buf: RoundBuffers):
    """The round of a robust rule in low memory (``Federation.recomputes_uploads``).

    1. Each batch of clients: gradients, attack (in the client rule), client rule, then
       the server's one read of the batch's uploads (``features_verify_batch``): the
       detection features into their rows of ``buf.features`` and the verdicts.
    2. The rule on the verified features, its uploads standing for themselves as a
       :class:`~rfrs_ref.aggregate.base.FiniteUploads` with no array (the rule
       ``combines_by_weights``): its weights, kept clients and diagnostics.
    3. The clients with a non-zero weight again, a batch of them at a time: the same
       gradients and uploads (each client's is computed on its own, from the same
       state and streams), their weighted sums into float64 running sums
       (:func:`~rfrs_ref.aggregate.combine.add_rows_inplace`, batches of a multiple of
       four such clients), rounded once to the state's dtype.

    Every feature, verdict, weight and sum is what :func:`run_round` holding every
    upload computes, with the same operations in the same order, so the new state and
    the record are the same, bit for bit (but for the timing, whose phases are
    ``gradients``, ``client_rule``, ``features_verification``, ``aggregation`` and
    ``uploads_again``).
    """
    from rfrs_ref.aggregate.base import FiniteUploads
    from rfrs_ref.aggregate.combine import add_rows_inplace

    opt, t, clients = fed.optimizer, rd.t, rd.clients
    n, batch = clients.size, buf.uploads["theta"].shape[0]
    X = buf.features[:n]
    negatives = _negatives(fed, rd)
    losses = np.empty(n)
    ok = np.empty(n, dtype=bool)
    checks: list = [None] * n
    violation = np.empty(n)
    space = "gradient" if fed.needs_recovery else "parameter"
    for name in ("gradients", "client_rule", "features_verification"):
        rd.timing[name] = 0.0
    for lo in range(0, n, batch):
        hi = min(n, lo + batch)
        U = {k: buf.uploads[k][:hi - lo] for k in opt.arrays}
        losses[lo:hi] = _batch_uploads(fed, state, rd, buf, lo, hi, negatives, None, U)
        tick = time.perf_counter()
        ok[lo:hi], checks[lo:hi], violation[lo:hi] = opt.features_verify_batch(
            state, U, t, X[lo:hi], space, backend=fed.backend)
        rd.timing["features_verification"] += time.perf_counter() - tick
    rd.features = space
    excluded = _exclusions(rd, ok, checks, violation)
    rows, _, Xk, _ = _keep_verified(ok, None, {}, X, buf)
    attack_diag = _client_rule_attack_diagnostics(fed, rd, buf.n_params)
    m = rows.size
    if m == 0:
        new_state, weights, kept_m, rule_diag, f_rule = _aggregate(fed, state, rd, rows, Xk, {})
    else:
        tick = time.perf_counter()
        f_rule = _f_rule(rd, m)
        result = fed.rule.aggregate(Xk, FiniteUploads(), rd.n_samples[rows], f_rule,
                                    backend=fed.backend)
        weights, rule_diag = result.weights, result.diagnostics
        kept_m = np.asarray(result.kept, float)
        rd.timing["aggregation"] = time.perf_counter() - tick
        acc = {k: np.zeros(buf.n_params) for k in opt.arrays}
        with _uploads_again(rd):
            for part in _live_batches(weights, batch):
                U = {k: buf.uploads[k][:part.size] for k in opt.arrays}
                _batch_uploads(fed, state, rd, buf, 0, part.size, negatives, None, U,
                               which=rows[part])
                for k in opt.arrays:
                    add_rows_inplace(U[k], weights[part], acc[k])
        new_state = {k: acc[k].astype(buf.dtype) for k in opt.arrays}
    record = _record(fed, rd, new_state, losses, excluded, rows, weights, kept_m, rule_diag,
                     f_rule, attack_diag, None)
    record["timing"] = rd.timing
    return new_state, record


@contextlib.contextmanager
def _uploads_again(rd: _Round):
    """Time a second computation of uploads (a low-memory round's weighted sums) as the
    round's ``uploads_again`` phase, leaving the first computation's phases as they were."""
    tick = time.perf_counter()
    timing = dict(rd.timing)
    parts = len(rd.attack_parts)
    yield
    # the attack's diagnostics are the first computation's (the rows computed again are
    # some of the same rows, from the same draws)
    del rd.attack_parts[parts:]
    rd.timing.clear()
    rd.timing.update(timing)
    rd.timing["uploads_again"] = time.perf_counter() - tick


def _live_batches(weights: np.ndarray, batch: int):
    """The indices of the non-zero weights, ``batch`` at a time (a multiple of four: the
    weighted sums' group of rows, so that the batches' sums are those of all rows)."""
    live = np.flatnonzero(weights != 0)
    for b0 in range(0, live.size, batch):
        yield live[b0:b0 + batch]


def _sample(fed: Federation, t: int) -> _Round:
    """The round's clients (stream ``sampling``), their Byzantine flags and sizes, and f."""
    clients = sample_clients(fed.seed, t, fed.n_clients, fed.client_fraction)
    byz = fed.byzantine[clients]
    return _Round(t=t, clients=clients, byz=byz, n_samples=fed.n_samples[clients],
                  f=assumed_byzantine(fed.assumed_fraction, clients.size, byz), timing={})


def _client_uploads(fed, state, rd: _Round, buf: RoundBuffers, private):
    """Every sampled client's gradient on θ̄ᵗ⁻¹ (into ``buf.grads``) and its
    optimiser's upload (into ``buf.uploads``); private vectors step in place."""
    opt, model, clients = fed.optimizer, fed.model, rd.clients
    n = clients.size
    U = {k: buf.uploads[k][:n] for k in opt.arrays}
    batch = buf.grads.shape[0]
    if batch < n and fed.keeps_gradients:
        raise ValueError(f"this run reads the clients' gradients after the client rule, but the "
                         f"round's gradient buffer holds {batch} rows for {n} clients")
    negatives = _negatives(fed, rd)
    losses = np.empty(n)
    rd.timing["gradients"] = rd.timing["client_rule"] = 0.0
    for lo in range(0, n, batch):
        hi = min(n, lo + batch)
        losses[lo:hi] = _batch_uploads(fed, state, rd, buf, lo, hi, negatives, private,
                                       {k: v[lo:hi] for k, v in U.items()})
    if model.has_private:
        tick = time.perf_counter()
        _update_private_inplace(opt, private, clients, buf.private_grads[:n])
        rd.timing["gradients"] += time.perf_counter() - tick
    # the honest gradients of the round, when the buffer holds them all and no attack
    # computed in the client rule rewrote its Byzantine rows
    honest = batch >= n and not fed.attacks_in_client_rule
    return (buf.grads[:n] if honest else None), U, losses


def _batch_uploads(fed, state, rd: _Round, buf: RoundBuffers, lo, hi, negatives, private, U,
                   which=None):
    """The gradients of sampled clients lo..hi − 1 (or of the sampled clients ``which``, an
    index array, hi − lo of them, in a model without private state) into the first rows
    of ``buf.grads`` and their uploads into ``U`` (their rows); returns their losses
    (timed into the round's ``gradients`` and ``client_rule``). Under an attack computed
    in the client rule the Byzantine rows upload the rule on the attack's gradient
    (:func:`_attack_batch_inplace`)."""
    sel = slice(lo, hi) if which is None else which
    tick = time.perf_counter()
    G = buf.grads[:hi - lo]
    negs = None
    if negatives is not None:
        negs = negatives[lo:hi] if which is None else [negatives[i] for i in which]
    losses = _gradients(fed, state, rd.clients[sel], G, negs, private,
                        None if buf.private_grads is None else buf.private_grads[sel])
    rd.timing["gradients"] += time.perf_counter() - tick
    _attack_batch_inplace(fed, state, rd, buf, sel, G, U)
    tick = time.perf_counter()
    fed.optimizer.client_rule_batch(state, G, rd.t, U, backend=fed.backend)
    rd.timing["client_rule"] += time.perf_counter() - tick
    return losses


def _attack_batch_inplace(fed, state, rd: _Round, buf: RoundBuffers, sel, G, U) -> None:
    """An attack computed in the client rule (``Federation.attacks_in_client_rule``):
    the Byzantine rows of the gradients ``G`` of sampled clients ``sel`` (a slice or an
    index array) become the
    gradients their clients push through the rule (``Attack.own_gradients_inplace``),
    before the rule runs, so that each Byzantine upload is the one ``apply_inplace``
    would write over the honest upload (the same rule on the same gradient), bit for
    bit; the rows' diagnostics are kept for the round's record. Timed into ``attack``."""
    byz = rd.byz[sel]
    rows = np.flatnonzero(byz)
    if rows.size == 0 or not fed.attacks_in_client_rule:
        return
    tick = time.perf_counter()
    ctx = _client_rule_context(fed, state, rd, buf, sel, G, U)
    rd.attack_parts.append(fed.attack.own_gradients_inplace(ctx, G, rows))
    rd.timing["attack"] = rd.timing.get("attack", 0.0) + time.perf_counter() - tick


def _client_rule_context(fed, state, rd: _Round, buf: RoundBuffers, sel, G, U) -> AttackContext:
    """The attack's context for the sampled clients ``sel`` of a round whose attack runs in
    the client rule: the round's one attack stream (``rd.attack_rng``, made at the first
    batch, so the batches draw in the order of the Byzantine rows) and the draws kept per
    client (``rd.attack_draws``: a row computed again draws nothing)."""
    if rd.attack_rng is None:
        rd.attack_rng = generator(fed.seed, "attack", rd.t)
    return AttackContext(
        t=rd.t, optimizer=fed.optimizer, state=state, grads=G, uploads=U, byzantine=rd.byz[sel],
        clients=rd.clients[sel], n_samples=rd.n_samples[sel], f=rd.f, rng=rd.attack_rng,
        backend=fed.backend, workspace=buf.attack_workspace, rule=fed.rule, detect=fed.detect,
        model=fed.model, draws=rd.attack_draws)


def _client_rule_attack_diagnostics(fed, rd: _Round, D: int) -> dict:
    """The record's attack diagnostics of a round whose attack ran in the client rule:
    the attack's merge of its batches' parts ({} without Byzantine clients, as a round
    that calls ``apply_inplace`` records)."""
    if not fed.attacks_in_client_rule or not rd.byz.any():
        return {}
    return fed.attack.merge_diagnostics(rd.attack_parts, D)


def _own_attack_inplace(fed, state, rd: _Round, buf: RoundBuffers, sel, parts: list) -> None:
    """An attack that ``shares_rows`` in a round that computes FISM's shared rows once: the
    Byzantine rows among the sampled clients ``sel`` of each gradient array in ``parts``
    (P, then the Q rows the sampled clients own) become the attack's before the rule runs
    (:func:`_attack_batch_inplace` on parts of rows, ``Attack.own_parts_inplace``: h(g)
    for an ``elementwise`` attack), its diagnostics kept for the record. Timed into
    ``attack``."""
    rows = np.flatnonzero(rd.byz[sel])
    if rows.size == 0 or not fed.attacks_in_client_rule:
        return
    tick = time.perf_counter()
    ctx = _client_rule_context(fed, state, rd, buf, sel, parts[0], {})
    rd.attack_parts.append(fed.attack.own_parts_inplace(ctx, parts, rows))
    rd.timing["attack"] = rd.timing.get("attack", 0.0) + time.perf_counter() - tick


def _negatives(fed, rd: _Round):
    """Each sampled client's BPR negatives (stream ``negatives``, keys t and the client),
    or None for exact BPR."""
    if not fed.model.negatives:
        return None
    return [fed.model.sample_negatives(fed.train.items_of(c), generator(fed.seed, "negatives", rd.t, c))
            for c in rd.clients]


def _gradients(fed, state, clients, G, negatives, private, private_out):
    """The gradients of ``clients`` on θ̄ᵗ⁻¹ into G (a model's private gradients into
    ``private_out``); returns their losses."""
    kw = {}
    if fed.model.has_private:
        kw = dict(private=private["theta"], private_out=private_out)
    return fed.model.grads_batch(state["theta"], fed.train, clients, G, negatives=negatives,
                                 backend=fed.backend, **kw)


def _byzantine_uploads(fed, state, rd: _Round, G, U, buf: RoundBuffers) -> dict:
    """The attack rewrites the Byzantine rows of ``U`` in place (the honest gradients
    ``G`` are read-only to it); returns its diagnostics. An attack computed in the
    client rule (``Federation.attacks_in_client_rule``) has nothing left to do."""
    if fed.attacks_in_client_rule:  # its uploads were computed with the honest ones
        return _client_rule_attack_diagnostics(fed, rd, U["theta"].shape[1])
    if not rd.byz.any() or fed.attack.name == "none":
        return {}
    tick = time.perf_counter()
    G.flags.writeable = False
    try:
        diag = fed.attack.apply_inplace(AttackContext(
            t=rd.t, optimizer=fed.optimizer, state=state, grads=G, uploads=U, byzantine=rd.byz,
            clients=rd.clients, n_samples=rd.n_samples, f=rd.f,
            rng=generator(fed.seed, "attack", rd.t), backend=fed.backend,
            workspace=buf.attack_workspace, rule=fed.rule, detect=fed.detect,
            model=fed.model))
    finally:
        G.flags.writeable = True
    rd.timing["attack"] = time.perf_counter() - tick
    return diag


def _screen_and_sum(fed, state, rd: _Round, U):
    """The server's one pass for a rule with fixed weights (the weighted mean): the
    verification screen and the weighted sums together, reading every upload once.

    Returns the sums when every upload certainly passes verification, and None when the
    pass does not apply (no verification, recovered gradients wanted, a rule whose
    weights depend on the uploads, another backend) or some upload needs the exact
    check, which :func:`_recover_and_verify` then runs as usual. Either way the
    round's state and record are the same, bit for bit (docs/performance.md).
    """
    if not (fed.verify and fed.backend == "numba" and not fed.needs_recovery
            and getattr(fed.rule, "has_fixed_weights", False)):
        return None
    from rfrs_ref.aggregate.base import sample_sizes

    tick = time.perf_counter()
    w = fed.rule.fixed_weights(sample_sizes(rd.n_samples, rd.clients.size))
    out = fed.optimizer.screen_sum_batch(state, U, rd.t, w)
    rd.timing["verification_sums"] = time.perf_counter() - tick
    if out is None or not out[0].all():
        return None
    return out[1]


def _features_in_one_read(fed) -> bool:
    """Whether the server builds the detection features while it verifies, in one read of
    the uploads (:func:`_features_and_verify`): verification on, a rule that reads the
    features, and features that are the recovered gradients (whenever the server
    recovers them) or θ − θ̄ (parameter space); not on the NumPy oracle backend."""
    if not (fed.verify and fed.backend != "numpy"):
        return False
    if fed.needs_recovery:
        return True
    return fed.detect == "parameter" and getattr(fed.rule, "uses_features", True)


def _features_and_verify(fed, state, rd: _Round, U, X):
    """Every upload's detection feature into ``X`` (ĝ when the server recovers gradients,
    else θ − θ̄) and its update-rule verdict, in one read of the uploads
    (``Optimizer.features_verify_batch``); the same features and verdicts as recovery,
    then verification, then the parameter features, bit for bit."""
    tick = time.perf_counter()
    space = "gradient" if fed.needs_recovery else "parameter"
    ok, checks, violation = fed.optimizer.features_verify_batch(state, U, rd.t, X, space,
                                                                backend=fed.backend)
    rd.features = space
    excluded = _exclusions(rd, ok, checks, violation)
    rd.timing["features_verification"] = time.perf_counter() - tick
    return ok, excluded


def _nonfinite_honest(fed, rd: _Round, U) -> list[int]:
    """The honest clients of a round without verification whose upload holds NaN or ±inf
    (ascending rows). An honest upload is the client rule on the client's own gradient,
    which only an overflow makes non-finite; verification would exclude it as any
    non-finite upload (``check`` = ``nonfinite``), and without it the rules receive it as
    they receive a Byzantine one. The round record names them (``nonfinite_honest``)
    so that the trainer can tell such a run from one whose hostile uploads are input."""
    from rfrs_ref.aggregate.combine import finite_clients

    honest = ~np.asarray(rd.byz, dtype=bool)
    if not honest.any():
        return []
    backend = "numpy" if fed.backend == "numpy" else "numba"
    ok = finite_clients(U["theta"], U, backend)
    return [int(rd.clients[r]) for r in np.flatnonzero(honest & ~ok)]


def _exclusions(rd: _Round, ok, checks, violation) -> list[dict]:
    """The round record's entry of every upload that failed verification."""
    return [{"client": int(rd.clients[r]), "byzantine": bool(rd.byz[r]), "check": checks[r],
             "violation": float(violation[r])} for r in np.flatnonzero(~ok)]


def _recover_and_verify(fed, state, rd: _Round, U, X):
    """ĝ of every upload into ``X`` when the server needs it, then update-rule
    verification; returns (bool rows that passed, the exclusions' records)."""
    tick = time.perf_counter()
    opt, n = fed.optimizer, rd.clients.size
    if fed.needs_recovery:
        opt.recover_batch(state, U, rd.t, X, backend=fed.backend)
    excluded: list[dict] = []
    ok = np.ones(n, dtype=bool)
    if fed.verify:
        # screened: the exact decisions, with the ratios computed for excluded rows only
        ok, checks, violation = opt.verify_batch(
            state, U, rd.t, recovered=X if fed.needs_recovery else None, backend=fed.backend,
            screen=True)
        ok = np.asarray(ok, dtype=bool)
        excluded = _exclusions(rd, ok, checks, violation)
    rd.timing["recovery_verification"] = time.perf_counter() - tick
    return ok, excluded


def _keep_verified(ok, G, U, X, buf: RoundBuffers):
    """Move the rows that passed verification to the front of every buffer, in order;
    returns their indices and the (m, D) views the rule sees."""
    n = ok.size
    rows = np.flatnonzero(ok)
    m = rows.size
    if m < n:
        extra = [buf.private_grads[:n]] if buf.private_grads is not None else []
        kept = ([G] if G is not None else []) + ([X] if X is not None else [])
        _compact_rows_inplace(ok, [*kept, *U.values(), *extra])  # G None: no honest gradients
    # a rule that ignores the features is handed the θ uploads in their place
    Xk = X[:m] if X is not None else U["theta"][:m]
    return rows, None if G is None else G[:m], Xk, {k: v[:m] for k, v in U.items()}


def _f_rule(rd: _Round, m: int) -> int:
    """The Byzantine count the rule assumes with m of the round's uploads verified: one
    less per exclusion (an excluded upload is provably not honest), at least 0."""
    return max(0, rd.f - (rd.clients.size - m))


def _aggregate(fed, state, rd: _Round, rows, Xk, Uk, sums=None):
    """The rule combines the verified uploads into the new state, with the assumed
    Byzantine count reduced by one per exclusion (``sums``: the weighted sums the
    server's one pass already computed, every upload having passed)."""
    names, theta_bar = fed.optimizer.arrays, state["theta"]
    m = rows.size
    f_rule = _f_rule(rd, m)
    if m == 0:
        # nothing trustworthy arrived: the state carries over unchanged
        return _carry_over(fed, state, "no upload passed verification", f_rule, 0)
    tick = time.perf_counter()
    if sums is not None:
        # the server's one pass summed the uploads already (a rule with fixed weights)
        result = fed.rule.from_sums(sums, rd.n_samples[rows], f_rule, backend=fed.backend)
    else:
        if (fed.detect == "parameter" and getattr(fed.rule, "uses_features", True)
                and rd.features != "parameter"):
            np.subtract(Uk["theta"], theta_bar, out=Xk)
        if fed.verify:
            # every kept upload passed verification, whose first check is that each
            # uploaded value is finite: the rule need not read the uploads again for it
            from rfrs_ref.aggregate.base import FiniteUploads

            Uk = FiniteUploads(Uk)
        kw = {}
        if getattr(fed.rule, "takes_round_inputs", False):
            # pre-aggregation: clipping shrinks uploads toward the server's state; bucketing
            # shuffles with the round's own stream
            kw = dict(reference=state, rng=generator(fed.seed, "pre", rd.t))
        if getattr(fed.rule, "state_arrays", ()):
            kw["rule_state"] = {k: state[k] for k in fed.rule.state_arrays}
        from rfrs_ref.aggregate.base import NothingFinite

        try:
            result = fed.rule.aggregate(Xk, Uk, rd.n_samples[rows], f_rule, backend=fed.backend,
                                        **kw)
        except NothingFinite as exc:
            # a round of non-finite uploads only (verification off): nothing to aggregate,
            # as when verification excludes every upload; the rule says so, the run goes on
            rd.timing["aggregation"] = time.perf_counter() - tick
            return _carry_over(fed, state, f"no finite upload ({exc})", f_rule, m)
    new_state = {k: result.arrays[k] for k in names}
    if result.state:
        new_state.update(result.state)  # the rule's state for the next round
    rd.timing["aggregation"] = time.perf_counter() - tick
    return new_state, result.weights, np.asarray(result.kept, float), result.diagnostics, f_rule


def _carry_over(fed, state, why: str, f_rule, m: int):
    """The round's aggregate when nothing is aggregated: the state as it is (copied), no
    weights (weight 0 and not kept for each of the ``m`` uploads given to the rule), and
    ``skipped`` saying why."""
    names = fed.optimizer.arrays
    new_state = {k: np.array(state[k], copy=True)
                 for k in (*names, *getattr(fed.rule, "state_arrays", ()))}
    return new_state, (None if m == 0 else np.zeros(m)), np.zeros(m), {"skipped": why}, f_rule


def _record(fed, rd: _Round, new_state, losses, excluded, rows, weights, kept_m, rule_diag,
            f_rule, attack_diag, grad_norms) -> dict[str, Any]:
    """The round's JSON record."""
    n, byz = rd.clients.size, rd.byz
    kept = np.zeros(n)
    kept[rows] = kept_m
    record: dict[str, Any] = {
        "round": rd.t,
        "clients": rd.clients.tolist(),
        "byzantine": byz.tolist(),
        "n_samples": rd.n_samples.tolist(),
        "f": rd.f,
        "f_rule": f_rule,
        "loss": float(np.mean(losses[~byz])) if (~byz).any() else None,
        "excluded": excluded,
        "kept": kept.tolist(),
        "weights": None if weights is None else _expand(weights, rows, n).tolist(),
        "n_byzantine_sampled": int(byz.sum()),
        "n_byzantine_kept": int((kept[byz] > 0).sum()),
        "byzantine_share_sampled": float(byz.mean()) if n else 0.0,
        "byzantine_share_kept": float(kept[byz].sum() / kept.sum()) if kept.sum() > 0 else 0.0,
        "rule": rule_diag,
        "attack": attack_diag,
        "state_norms": {k: float(np.linalg.norm(new_state[k].astype(np.float64)))
                        for k in fed.optimizer.arrays},
    }
    if grad_norms is not None:
        record["grad_norms"] = grad_norms
    return record


def _expand(values: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n)
    out[rows] = values
    return out


def _resilience(fed, G, X, U, state, t, kept, benign) -> dict:
    """Definition 1–4 sums for this round over kept × benign client pairs."""
    from rfrs_ref.optim.resilience import resilience_round

    if X is None:  # parameter-space detection left the recovered gradients behind
        X = np.empty_like(G)
        fed.optimizer.recover_batch(state, U, t, X, backend=fed.backend)
    return resilience_round(fed.optimizer, recovered=X, honest=G, uploads=U,
                            kept=kept, benign=benign, backend=fed.backend)


def _update_private_inplace(opt, private: dict, clients: np.ndarray, grads: np.ndarray) -> None:
    """Each sampled client applies the run's optimiser to its own private vector.

    The private vector has private moments and its own step count (the number
    of rounds the client has taken part in), so bias corrections follow the
    client's history, not the global round.
    """
    for r, c in enumerate(clients):
        steps = int(private["steps"][c]) + 1
        st = {k: private[k][c] for k in opt.arrays}
        up = opt.client_rule(st, grads[r].astype(np.float64), steps)
        for k in opt.arrays:
            private[k][c] = up[k]
        private["steps"][c] = steps
