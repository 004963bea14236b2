"""Training runs: set-up, the loop over rounds, evaluation, run records, resume.

A run directory holds:

- ``config.json``: the resolved configuration, the dataset's provenance and
  counts, the software versions and the machine;
- ``metrics.csv``: one row per evaluation and K (model and popularity);
- ``valid_metrics.csv``: the same on the validation items, when the run has a
  validation split (``valid_fraction > 0``);
- ``rounds.jsonl``: one JSON record per round (sampled clients, Byzantine
  flags, exclusions, kept clients and weights, rule and attack diagnostics,
  resilience sums, timings);
- ``final_metrics.json``: the final evaluation, the popularity baseline, the
  selection statistics and the resilience totals;
- ``state.npz``: the final server state (``allow_pickle=False``);
- ``ids.npz``: the dataset's own id of each user and item (``user_ids``,
  ``item_ids``), for showing recommendations in the dataset's terms;
- ``checkpoint.npz``: the latest checkpoint, from which ``resume`` continues;
- ``.lock``: present while a process owns the directory
  (:class:`rfrs_ref.files.DirectoryLock`).

One process at a time owns a run directory: :meth:`Trainer.run` takes its lock
before writing anything and a second process is refused (``DirectoryLocked``).
A directory that already holds a run is never overwritten by a new run
(:class:`RunExists`), except a run that stopped before its first checkpoint
with the very same configuration, which starts again. A round whose aggregated
server state holds NaN or ±inf, or whose evaluation meets NaN or ±inf scores,
ends the run as diverged (:class:`Diverged`, a :class:`NonFiniteState`;
``final_metrics.json`` then says ``"status": "diverged"``), and a checkpoint
that cannot continue is refused (:class:`CheckpointError`); in both cases the
files already written stay as they were. A resilience sum (``--resilience``)
that becomes NaN or ±inf is recorded as null with the round where it did, and
the run, once it has trained every round and written its files, raises
:class:`NonFiniteResilience`. Every JSON file a run writes is strict JSON (no
``NaN`` or ``Infinity`` tokens). See docs/training.md, "Failure behaviour".

Every random choice is drawn from a stream keyed by (seed, name, round), so a
resumed run draws exactly what the uninterrupted run drew and ends with the
same result, bit for bit, on the same machine.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime
import json
import math
import os
import pathlib
import platform
import sys
import time
import zipfile
from typing import Callable, Mapping

import numpy as np

from rfrs_ref.federated.config import TrainConfig, _rule_name
from rfrs_ref.federated.population import assumed_byzantine, byzantine_mask, clients_per_round
from rfrs_ref.federated.round import (GRADIENT_BATCH, Federation, RoundBuffers, run_round,
                                      shared_rows_columns)
from rfrs_ref.files import DirectoryLock, atomic_write
from rfrs_ref.jsonsafe import jsonable
from rfrs_ref.seeding import generator

# the first six columns are those of earlier versions, so older readers keep working
METRICS_FIELDS = ["round", "k", "precision", "recall", "popularity_precision", "popularity_recall",
                  "ndcg", "hr", "mrr", "popularity_ndcg", "popularity_hr", "popularity_mrr"]
#: the columns a run with target items (an item-promotion attack) adds to metrics.csv
TARGET_FIELDS = ["er", "target_hr"]


#: the validation metrics of a run with a validation split, same columns as metrics.csv
VALID_METRICS = "valid_metrics.csv"


#: the files a run writes into its directory (see the module docstring)
RUN_FILES = ("config.json", "metrics.csv", "rounds.jsonl", "checkpoint.npz", "final_metrics.json",
             "state.npz")


class RunExists(ValueError):
    """The run directory already holds a run that a new run would overwrite."""


class CheckpointError(ValueError):
    """A checkpoint (or the run files beside it) from which a run cannot continue:
    unreadable, of another configuration, or holding non-finite values."""


class NonFiniteState(ValueError):
    """The server state holds NaN or ±inf after a round: training stops there.

    Attributes:
        round: the round after which the state is not finite (0: the initial state).
        array: the name of the first non-finite array (``theta``, ``m``, ...).
        count: how many of its values are NaN or ±inf.
        checkpoint: the round of the last checkpoint written (all finite), or None.
    """

    def __init__(self, t: int, array: str, count: int, size: int, checkpoint: int | None,
                 run_dir: pathlib.Path | None) -> None:
        self.round, self.array, self.count, self.checkpoint = t, array, count, checkpoint
        super().__init__(_state_message(t, array, count, size, checkpoint, run_dir))


def _state_message(t, array, count, size, checkpoint, run_dir) -> str:
    what = "the initial state" if t == 0 else f"round {t}: the aggregated server state"
    msg = (f"{what} {array!r} holds {count} non-finite value(s) (NaN or ±inf) of {size}; "
           "training stopped before evaluating it")
    if run_dir is not None:
        msg += (f". {run_dir}/checkpoint.npz (round {checkpoint}) is kept" if checkpoint
                else f". No checkpoint was written in {run_dir}")
    msg += (". The initial scale is too large for the dtype" if t == 0 else
            ". Such uploads reach the state only without a robust defence or without "
            "update-rule verification")
    return msg


#: :attr:`Diverged.reason` of a run whose aggregated server state became NaN or ±inf
DIVERGED_STATE = "non-finite server state"
#: :attr:`Diverged.reason` of a run whose state is finite but whose scores overflow
DIVERGED_SCORES = "non-finite scores"
#: :attr:`Diverged.reason` of a run whose state is finite but an honest client's upload
#: is not (its gradient or the client rule overflowed; verification excluded it, or
#: without verification the round record names it)
DIVERGED_UPLOADS = "non-finite honest uploads"
#: every reason a run can diverge for
DIVERGED_REASONS = (DIVERGED_STATE, DIVERGED_SCORES, DIVERGED_UPLOADS)


class Diverged(NonFiniteState):
    """The model diverged at round t ≥ 1: training stops there, and that is the run's outcome.

    Raised in two cases, both after round t's aggregation and before anything of
    round t is recorded:

    - ``reason == DIVERGED_STATE``: the aggregated server state holds NaN or
      ±inf (``array``, ``count`` name the first such array);
    - ``reason == DIVERGED_SCORES``: the state is finite, but the scores of
      an evaluated client hold NaN or ±inf (its values are so large that a
      dot product overflows; ``user`` names the first such client), at an
      evaluation round, on the test or the validation items;
    - ``reason == DIVERGED_UPLOADS``: the state is finite, but the upload of an
      honest client of round t holds NaN or ±inf, so verification excluded it,
      or, without verification, a rule received it (its gradient or the client
      rule overflowed: parameters or hyperparameters so large, e.g. λ = 1e308,
      that no honest client can train; ``user`` names the first such client).
      Byzantine uploads are input and never end a run.

    A ``NonFiniteState`` (hence a ``ValueError``), so every caller that stopped on
    a non-finite state stops on both. A non-finite *initial* state (round 0) is
    a configuration error (the initial scale), not a divergence: it raises a plain
    ``NonFiniteState``.

    Attributes:
        round: the round of divergence (≥ 1); reason: one of the two above;
        what: what was non-finite, in words (``'theta': 12 of 3400 values``,
        ``the scores of user 3``); array, count: the state array and its
        non-finite count (None for scores); user: the client (None for the
        state); checkpoint: the round of the last checkpoint written (finite),
        or None; history: the evaluation rows recorded before round t (round 0
        first), as in :attr:`TrainResult.history`.
    """

    def __init__(self, t: int, reason: str, what: str, message: str, *,
                 checkpoint: int | None, history: list[dict], array: str | None = None,
                 count: int | None = None, user: int | None = None,
                 plain: str | None = None) -> None:
        ValueError.__init__(self, message)
        #: the message without what it says of the run directory's files (a sweep
        #: records this one: its outcome names no host path, and the sweep removes the
        #: checkpoint of a diverged run)
        self.plain = message if plain is None else plain
        self.round, self.reason, self.what, self.checkpoint = t, reason, what, checkpoint
        self.array, self.count, self.user = array, count, user
        self.history = [dict(row) for row in history]

    def record(self) -> dict:
        """The divergence as plain data (``round``, ``reason``, ``what``, ``checkpoint``)."""
        return {"round": self.round, "reason": self.reason, "what": self.what,
                "checkpoint": self.checkpoint}


def _private_problems(trainer: "Trainer", private: dict, t: int) -> list[str]:
    """What keeps ``private``, a checkpoint's private client state at round ``t``, from being
    the one :meth:`Trainer.initial_state` starts and the rounds update: each of the
    optimiser's arrays, one row of the model's dimension per user in the run's dtype (a
    float64 row in a float32 run would be trained in another precision, an int64 one
    rounded at every step), and ``steps``, the int64 count of rounds each client took
    part in (0 to ``t``: its bias corrections follow it)."""
    n, dim = trainer.data.n_users, int(trainer.model.dim)
    template = trainer.optimizer.init(np.zeros(dim, dtype=trainer.dtype))
    want = {k: (np.dtype(v.dtype), (n, dim)) for k, v in template.items()}
    want["steps"] = (np.dtype(np.int64), (n,))
    problems = []
    if set(private) != set(want):
        problems.append(f"private arrays {sorted(private)}, expected {sorted(want)}")
    for k, (dt, shape) in want.items():
        v = private.get(k)
        if v is not None and (v.dtype != dt or v.shape != shape):
            problems.append(f"private {k!r} is {v.dtype}{list(v.shape)}, expected "
                            f"{dt}{list(shape)}")
    steps = private.get("steps")
    if (steps is not None and steps.dtype == np.int64 and steps.size
            and not (0 <= int(steps.min()) and int(steps.max()) <= t)):
        problems.append(f"private 'steps' runs from {int(steps.min())} to {int(steps.max())}, "
                        f"outside 0..{t} (a client takes part in a round at most once)")
    return problems


def first_non_finite(arrays: Mapping[str, np.ndarray],
                     norms: Mapping[str, float] | None = None) -> tuple[str, int, int] | None:
    """(name, number of non-finite values, size) of the first floating-point array of
    ``arrays`` holding NaN or ±inf, or None when every value is finite.

    Cheap: NaN or ±inf anywhere makes an array's sum (and its norm) NaN or ±inf, so
    a finite sum proves the array finite, in one pass without a temporary. A sum
    can also overflow from finite values near the largest of their dtype; only then,
    or for a non-finite array, is the exact element-wise count paid. ``norms``:
    the arrays' norms already computed elsewhere (the round record's
    ``state_norms``); a finite one proves its array finite with no pass at all.
    """
    norms = norms or {}
    for name, a in arrays.items():
        a = np.asarray(a)
        if a.dtype.kind not in "fc":
            continue
        known = norms.get(name)
        if isinstance(known, (int, float)) and math.isfinite(known):
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            total = np.add.reduce(a, axis=None)
        if np.isfinite(total):
            continue
        bad = int(a.size - np.count_nonzero(np.isfinite(a)))
        if bad:
            return name, bad, int(a.size)
    return None


@dataclasses.dataclass
class TrainResult:
    config: TrainConfig
    final: dict
    history: list[dict]
    state: dict[str, np.ndarray]
    run_dir: pathlib.Path | None


class NonFiniteResilience(ValueError):
    """The run trained every round and wrote its files, but a resilience sum
    (Definitions 1–4, ``resilience=True``) became NaN or ±inf: its total is not a
    number, so the run is not a success.

    ``final_metrics.json`` and the round records hold such a sum as null and name the
    round where it became non-finite under ``resilience_non_finite``; the checkpoint
    records the same, so a resume continues (and ends the same way).

    Attributes:
        result: the run's :class:`TrainResult` (its evaluation is valid);
        non_finite: quantity → the round where its sum became NaN or ±inf.
    """

    def __init__(self, result: TrainResult, non_finite: Mapping[str, int]) -> None:
        self.result = result
        self.non_finite = dict(non_finite)
        super().__init__(resilience_message(self.non_finite))


def resilience_message(non_finite: Mapping) -> str:
    """One line saying which resilience sums became NaN or ±inf, and at which round."""
    what = ", ".join(f"{k} at round {t}" for k, t in non_finite.items())
    return (f"a resilience sum became non-finite (NaN or ±inf): {what}, so the run's "
            "resilience totals are not numbers (null in final_metrics.json, the round under "
            "resilience_non_finite); the training itself finished (a kept client's recovered "
            "gradient, or its distance to a benign one, overflows the dtype, e.g. at a tiny "
            "learning rate)")


def software_versions() -> dict:
    """Versions of Python and of every package a run's numbers depend on."""
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for dist in ("rfrs-ref", "numpy", "numba", "llvmlite", "scipy", "pandas", "click"):
        try:
            out[dist.replace("-", "_")] = metadata.version(dist)
        except metadata.PackageNotFoundError:  # pragma: no cover
            out[dist.replace("-", "_")] = None
    return out


def machine_info() -> dict:
    import numba

    return {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpus": os.cpu_count(),
        "numba_threads": numba.config.NUMBA_NUM_THREADS,
    }


class Trainer:
    """A configured run: data, model, optimiser, rule, attack and the federation.

    ``Trainer(config)`` resolves the configuration and loads the data; ``run()``
    trains. The pieces are attributes so that experiments and tools can reuse
    them (``trainer.split``, ``trainer.federation``, ``trainer.evaluate``).
    """

    #: the honest clients' uploads are computed in this process, by the client rule on
    #: their own gradients: one that is NaN or ±inf is an overflow, and the run diverged
    #: (``DIVERGED_UPLOADS``); a subclass whose uploads arrive from elsewhere (a Flower
    #: federation) sets it False, its non-finite uploads being input
    uploads_computed_here = True

    def __init__(self, config: TrainConfig, data=None, *, low_memory: bool = False) -> None:
        """``data``: the dataset already loaded (an ``Interactions`` of
        ``config.dataset``), e.g. cached by a sweep worker; None loads it.
        ``low_memory``: robust rounds that can hold their uploads a batch of clients at
        a time and compute them twice (``Federation.recomputes_uploads``); the same
        results, bit for bit, which is why it is not part of the configuration."""
        from rfrs_ref.aggregate import RULES
        from rfrs_ref.attack import ATTACKS
        from rfrs_ref.data import load_dataset, split_interactions
        from rfrs_ref.model import MODELS
        from rfrs_ref.optim import OPTIMIZERS

        self.config = c = config.resolved()
        if c.backend == "cuda":
            from rfrs_ref.kernels.cuda import require_cuda

            require_cuda()  # fail before loading anything, with the reason
        self.data = data if data is not None else load_dataset(c.dataset, c.data_dir,
                                                               **c.dataset_params)
        from rfrs_ref.metrics import check_ks

        check_ks(c.ks, self.data.n_items)  # before anything is trained or written
        self.split = split_interactions(self.data, c.seed, c.test_fraction, c.valid_fraction)
        self.model = MODELS.get(c.model)(n_items=self.data.n_items, **c.model_params)
        self.optimizer = OPTIMIZERS.get(c.optimizer)(**c.optimizer_params)
        from rfrs_ref.aggregate.pre import build as with_pre

        self.rule = with_pre(c.pre, c.pre_params, RULES.get(_rule_name(c.defense))(**c.defense_params))
        self.attack = ATTACKS.get(c.attack)(**c.attack_params)
        if self.attack.needs_model:
            self.attack.check_model(self.model)
        #: target items of an item-promotion attack, resolved once per run (None: no targets)
        self.targets = None
        if hasattr(self.attack, "resolve_targets"):
            self.targets = self.attack.resolve_targets(self.data.n_items, c.seed)
            self.attack = dataclasses.replace(self.attack,
                                              targets=",".join(map(str, self.targets.tolist())))
        self.byzantine = byzantine_mask(c.seed, self.data.n_users, c.byzantine_fraction)
        self.federation = Federation(
            model=self.model, optimizer=self.optimizer, rule=self.rule, detect=c.detect,
            attack=self.attack, train=self.split.train, byzantine=self.byzantine,
            client_fraction=c.client_fraction, assumed_fraction=c.assumed_byzantine,
            seed=c.seed, verify=c.verify, resilience=c.resilience, backend=c.backend,
            trace=c.trace, low_memory=low_memory)
        self._check_rule_precondition()
        self.dtype = np.dtype(c.dtype)
        from rfrs_ref.metrics import eval_users

        self.eval_users = eval_users(self.split.test, exclude=self.byzantine)
        if self.eval_users.size == 0:
            # every metric would be an average over nobody: recorded as 0, a run that
            # measured nothing would read as a model that learned nothing (or, for the
            # targets' exposure, as a perfect defence)
            raise ValueError(
                f"no benign client holds a test item ({self.data.n_users} clients, "
                f"{int(self.byzantine.sum())} Byzantine, test_fraction "
                f"{c.test_fraction:g}): nothing would be evaluated; give a test_fraction "
                "that leaves some benign client a test item, or fewer Byzantine clients")
        self.valid_users = (None if self.split.valid is None
                            else eval_users(self.split.valid, exclude=self.byzantine))

    def _check_rule_precondition(self) -> None:
        """Every round samples the same n clients and assumes the same f, so a rule
        whose precondition fails (and which would raise rather than fall back) fails
        here, before anything is written, instead of in round 1."""
        check_rule_precondition(self.rule, self.config, self.data.n_users)
        check_attack_precondition(self.attack, self.config, self.data.n_users)

    # -- state ----------------------------------------------------------------------
    def initial_state(self) -> tuple[dict[str, np.ndarray], dict | None]:
        """θ̄⁰ ~ N(0, init_scale²) (stream ``init``), moments 0; private client state."""
        c = self.config
        theta0 = self.model.init_params(generator(c.seed, "init"), c.init_scale, self.dtype)
        state = self.optimizer.init(theta0)
        if getattr(self.rule, "state_arrays", ()):
            # a rule with state (centered clipping's centre) keeps it with the server state
            state.update(self.rule.init_state(theta0.size))
        private = None
        if self.model.has_private:
            u0 = self.model.private_init(self.data.n_users, generator(c.seed, "init", 1),
                                         c.init_scale, self.dtype)
            private = self.optimizer.init(u0.ravel())
            private = {k: v.reshape(u0.shape) for k, v in private.items()}
            private["steps"] = np.zeros(self.data.n_users, dtype=np.int64)
        return state, private

    def buffers(self, full: bool = False, shared_rows: bool = True) -> RoundBuffers:
        """The round's buffers: a batch of rows where the run allows it
        (``Federation.keeps_gradients``, ``Federation.streams``); ``full``: every row of
        every buffer, for code that reads the round's uploads after it; ``shared_rows``
        False: every client's rows computed in full (``RoundBuffers.shared_rows``)."""
        n = clients_per_round(self.data.n_users, self.config.client_fraction)
        fed = self.federation
        columns = None
        if shared_rows and not full and fed.compares_shared_rows:
            # the columns where the round's clients differ only (in low memory: the
            # features of n clients and the uploads of a batch)
            columns = shared_rows_columns(self.model.shared_block, n,
                                          float(self.split.train.counts().mean()))
        return RoundBuffers(n, self.model.n_params(), self.dtype, self.optimizer.arrays,
                            private_dim=self.model.dim if self.model.has_private else 0,
                            # rounds on shared rows that derive their features hold none
                            features=fed.needs_features and not (columns is not None
                                                                 and fed.derives_features),
                            grad_rows=None if full or fed.keeps_gradients else GRADIENT_BATCH,
                            upload_rows=(GRADIENT_BATCH if (fed.streams or fed.recomputes_uploads)
                                         and not full else None),
                            shared_rows=shared_rows, columns=columns)

    # -- evaluation -----------------------------------------------------------------
    def evaluate(self, state, private=None):
        """Precision@K / Recall@K of the model on the benign clients' test items."""
        from rfrs_ref.metrics import rank_metrics

        backend = "numpy" if self.config.backend == "numpy" else "numba"
        priv = None if private is None else private["theta"]
        return rank_metrics(
            lambda u: self.model.scores(state["theta"], self.split.train, u, private=priv,
                                        backend=backend),
            self.split.train, self.split.test, self.eval_users, self.config.ks, backend=backend,
            targets=self.targets)

    def popularity(self):
        from rfrs_ref.metrics import popularity_metrics

        return popularity_metrics(self.split.train, self.split.test, self.eval_users, self.config.ks)

    def evaluate_valid(self, state, private=None):
        """The metrics of :meth:`evaluate` on the validation items (None without them); the
        model's and the popularity ranking's."""
        if self.split.valid is None:
            return None
        from rfrs_ref.metrics import popularity_metrics, rank_metrics

        backend = "numpy" if self.config.backend == "numpy" else "numba"
        priv = None if private is None else private["theta"]
        model = rank_metrics(
            lambda u: self.model.scores(state["theta"], self.split.train, u, private=priv,
                                        backend=backend),
            self.split.train, self.split.valid, self.valid_users, self.config.ks, backend=backend)
        pop = popularity_metrics(self.split.train, self.split.valid, self.valid_users,
                                 self.config.ks, backend=backend)
        return model, pop

    # -- the loop -------------------------------------------------------------------
    def run_round(self, state, t: int, buf: RoundBuffers, private=None):
        """Round ``t`` (:func:`rfrs_ref.federated.round.run_round`, in this process); a
        subclass may run the clients elsewhere (``rfrs_ref.flower`` on a Flower federation)."""
        return run_round(self.federation, state, t, buf, private)

    def run(self, run_dir: str | os.PathLike | None = None, *, resume: bool = False,
            progress: Callable[[int, dict, dict | None], None] | None = None,
            locked: bool = False) -> TrainResult:
        """Train for ``config.rounds`` rounds, evaluating every ``eval_every`` rounds.

        ``progress(t, record, latest_metrics)`` is called after every round.
        With ``resume``, continue from ``run_dir``'s checkpoint (from round 0
        when the run stopped before its first one). ``locked``: the caller
        already holds ``run_dir``'s :class:`~rfrs_ref.files.DirectoryLock` (else
        the run takes it, and releases it when it ends).

        Raises:
            rfrs_ref.files.DirectoryLocked: another process owns ``run_dir``
                (nothing is written).
            RunExists: ``run_dir`` holds a run and ``resume`` is False.
            CheckpointError: the checkpoint cannot continue (unreadable, another
                configuration, non-finite values); nothing is changed.
            NonFiniteState: the initial state holds NaN/±inf (nothing is written).
            Diverged: (a NonFiniteState) at round t ≥ 1 the server state became
                NaN/±inf, or the scores at an evaluation did, or an honest client's
                upload did (verification on); the files stay as
                after the previous round, the last checkpoint intact, and
                ``final_metrics.json`` says ``"status": "diverged"`` with the round.
            OSError: a file could not be written (full disk, read-only
                directory); files already complete stay so (atomic writes).
        """
        if run_dir is None:
            if resume:
                raise ValueError("resume needs the run directory")
            return self._run(None, False, progress)
        with contextlib.nullcontext() if locked else DirectoryLock(run_dir):
            out = RunDirectory(run_dir)
            from_checkpoint = out.prepare(self.config, resume)
            try:
                return self._run(out, from_checkpoint, progress)
            except Diverged as exc:
                out.diverged(exc)
                raise

    def _run(self, out: "RunDirectory | None", resume: bool, progress) -> TrainResult:
        c = self.config
        pop = self.popularity()
        t0, acc = 0, _Accumulators()
        if resume:
            state, private, t0, acc = out.load_checkpoint(self)
            out.truncate_after(t0, valid=self.split.valid is not None)
            out.record_resume(t0)
            history = out.read_history()
        else:
            state, private = self.initial_state()
            self._check_finite(0, state, private, None, out)
            # evaluated before anything is written: scores of the initial model that
            # overflow are a configuration error, as a non-finite initial state is
            first = self._initial_evaluation(state, private)
            if out is not None:
                out.start(self)
            history = []
        for row in history:  # metrics.csv does not repeat the (fixed) evaluated-client count
            row.setdefault("n_users", int(self.eval_users.size))
        if not resume:
            history.append(self._evaluation_row(0, state, private, pop, out, computed=first))
        last_checkpoint = t0 if resume else None
        buf = self.buffers()
        started = time.perf_counter()
        for t in range(t0 + 1, c.rounds + 1):
            state, record = self.run_round(state, t, buf, private)
            evaluate = t % c.eval_every == 0 or t == c.rounds
            checkpoint = out is not None and (t % c.checkpoint_every == 0 or t == c.rounds)
            # the private vectors only feed the scores: checked when they are evaluated, and
            # before a checkpoint holds them (one with NaN or ±inf could not be resumed, yet
            # a divergence after it would name it as the one kept)
            self._check_finite(t, state, private if evaluate or checkpoint else None,
                               last_checkpoint, out, norms=record.get("state_norms"),
                               history=history)
            if self.uploads_computed_here:
                self._check_honest_uploads(t, record, last_checkpoint, out, history)
            if c.trace:
                from rfrs_ref.trace import state_sums

                record["state_checksums"] = state_checksums(state)
                record["state_sums"] = state_sums(state)
            acc.add(record)
            if acc.resilience:
                record["resilience_cumulative"] = dict(acc.resilience)
            if acc.resilience_non_finite:
                record["resilience_non_finite"] = dict(acc.resilience_non_finite)
            latest = None
            if evaluate:
                latest = self._evaluation_row(t, state, private, pop, out,
                                              checkpoint=last_checkpoint, history=history)
                history.append(latest)
            if out is not None:
                out.append_round(record)
                if checkpoint:
                    out.save_checkpoint(state, private, t, acc, config=c)
                    last_checkpoint = t
            if progress is not None:
                progress(t, record, latest)
        final = self._final(history[-1], pop, acc, time.perf_counter() - started)
        if out is not None:
            out.finish(final, state, private, c.rounds)
        result = TrainResult(c, final, history, state, out.path if out else None)
        if acc.resilience_non_finite:
            # the training finished and its files are written: a total that is not a
            # number is still not a success
            raise NonFiniteResilience(result, acc.resilience_non_finite)
        return result

    @staticmethod
    def _check_finite(t, state, private, last_checkpoint, out, norms=None,
                      history=()) -> None:
        # the round record's state norms, when there, make this check free
        bad = first_non_finite(state, norms)
        if bad is None and private is not None:
            bad = first_non_finite({f"private {k}": v for k, v in private.items()})
        if bad is not None:
            name, count, size = bad
            run_dir = out.path if out is not None else None
            if t == 0:
                raise NonFiniteState(t, name, count, size, last_checkpoint, run_dir)
            raise Diverged(t, DIVERGED_STATE, f"{name!r}: {count} of {size} values",
                           _state_message(t, name, count, size, last_checkpoint, run_dir),
                           checkpoint=last_checkpoint, history=history, array=name, count=count,
                           plain=_state_message(t, name, count, size, last_checkpoint, None))

    @staticmethod
    def _check_honest_uploads(t, record, last_checkpoint, out, history=()) -> None:
        """:class:`Diverged` (``DIVERGED_UPLOADS``) when an honest client's upload of round
        ``t`` holds NaN or ±inf: verification excluded it for that, or, in a round without
        verification, the round record names it (``nonfinite_honest``). An honest upload is
        the client rule on the client's own gradient, which only an overflow makes
        non-finite, and a run whose honest clients cannot train is no success (every round
        would carry the state over, or, without verification, a robust rule rank every
        honest upload as infinitely far and skip the round, and the run end with the
        initial model's metrics)."""
        users = [e.get("client") for e in record.get("excluded") or ()
                 if e.get("check") == "nonfinite" and not e.get("byzantine")]
        users += list(record.get("nonfinite_honest") or ())
        for user in users[:1]:
            where = (f"; {out.path}/checkpoint.npz (round {last_checkpoint}) is kept"
                     if last_checkpoint else "") if out is not None else ""
            # after round 1 the state itself may have grown (Byzantine uploads a rule let
            # through can push it near the dtype's range): the message names both causes
            grown = ("a state grown too large in the rounds before (e.g. by Byzantine uploads "
                     "the rule let through), or " if t > 1 else "")
            plain = (f"round {t}: the model diverged: its state is finite, but the upload of "
                     f"honest client {user} holds NaN or ±inf (its gradient or the client "
                     f"rule overflowed: {grown}parameters or hyperparameters such as λ or "
                     "the learning rate so large that no honest client can train); training "
                     "stopped before recording the round")
            raise Diverged(t, DIVERGED_UPLOADS, f"the upload of honest client {user}",
                           plain + where, checkpoint=last_checkpoint, history=history,
                           user=user, plain=plain)

    def _initial_evaluation(self, state, private):
        """Both evaluations of the initial state, ``(metrics, valid)``. Scores holding NaN or
        ±inf there (a finite θ̄⁰ so large that a score overflows) are no divergence, since
        nothing has trained: a ``ValueError`` naming the initial scale, as for a non-finite
        initial state."""
        from rfrs_ref.metrics import NonFiniteScores

        try:
            return self.evaluate(state, private), self.evaluate_valid(state, private)
        except NonFiniteScores as exc:
            raise ValueError(
                f"the initial state (init_scale {self.config.init_scale:g}) is finite, but "
                f"the scores of user {exc.user} overflow to NaN or ±inf: a configuration "
                "error, not a divergence (nothing was trained or written); choose a smaller "
                "init_scale") from None

    def _evaluation_row(self, t, state, private, pop, out, checkpoint=None, history=(),
                        computed=None) -> dict:
        from rfrs_ref.metrics import NonFiniteScores

        # both evaluations before either is written: a divergence leaves no row of round t
        try:
            m, valid = computed if computed is not None else (
                self.evaluate(state, private), self.evaluate_valid(state, private))
        except NonFiniteScores as exc:
            if t == 0:
                raise
            where = (f"; {out.path}/checkpoint.npz (round {checkpoint}) is kept" if checkpoint
                     else "") if out is not None else ""
            plain = (f"round {t}: the model diverged: its state is finite, but the scores "
                     f"of user {exc.user} hold NaN or ±inf (parameters so large that a "
                     f"score overflows); training stopped before recording the round")
            raise Diverged(t, DIVERGED_SCORES, f"the scores of user {exc.user}", plain + where,
                           checkpoint=checkpoint, history=history, user=exc.user,
                           plain=plain) from None
        row = {"round": t, **m.as_dict()}
        if out is not None:
            out.append_metrics(t, m, pop)
        if valid is not None:
            self._last_valid = {"round": t, "model": valid[0].as_dict(),
                                "popularity": valid[1].as_dict()}
            if out is not None:
                out.append_metrics(t, *valid, name=VALID_METRICS)
        return row

    def _final(self, last: dict, pop, acc: "_Accumulators", seconds: float) -> dict:
        ks = self.config.ks
        model = {"n_users": int(self.eval_users.size),
                 **{k: v for k, v in last.items() if k not in ("round", "n_users")}}
        popd = pop.as_dict()
        kmax = max(ks)
        final = {
            "round": last["round"],
            "model": model,
            "popularity": popd,
            "beats_popularity": model[f"precision@{kmax}"] > popd[f"precision@{kmax}"],
            "selection": acc.selection(),
            "exclusions": acc.exclusions,
            "resilience": acc.resilience or None,
            "seconds": seconds,
        }
        if acc.resilience_non_finite:
            final["resilience_non_finite"] = dict(acc.resilience_non_finite)
        valid = getattr(self, "_last_valid", None)
        if valid is not None and valid["round"] == last["round"]:
            final["valid"] = valid
        if self.targets is not None:
            final["target_items"] = self.targets.tolist()
        return final


def check_rule_precondition(rule, config: TrainConfig, n_users: int) -> None:
    """PreconditionError (naming n, f and where they come from) when ``rule`` (built from
    the resolved ``config``) cannot aggregate the n = clients_per_round(n_users, e)
    uploads of a round with the f = floor(α_assumed · n) Byzantine clients it assumes.

    Every round samples the same n and assumes the same f, so this holds for every
    round or for none. Not checked (the round checks, or falls back): a rule whose
    ``fallback`` is not ``error``, and ``assumed_byzantine = "exact"``.
    """
    from rfrs_ref.aggregate import PreconditionError

    c = config
    if getattr(rule, "fallback", "error") != "error" or c.assumed_byzantine == "exact":
        # with "exact", f is each round's true count: the rule's check runs in the round
        return
    n = clients_per_round(n_users, c.client_fraction)
    f = assumed_byzantine(c.assumed_byzantine, n)
    try:
        rule.check(n, f)
    except PreconditionError as exc:
        raise PreconditionError(
            exc.rule, n, f, exc.condition,
            detail=f"each round samples n = {n} of the {n_users} clients at client "
                   f"fraction {c.client_fraction} and assumes f = {f} Byzantine at assumed "
                   f"fraction {c.assumed_byzantine}") from None


def check_attack_precondition(attack, config: TrainConfig, n_users: int) -> None:
    """ValueError when the attack can never do what it is asked in any round: a mimic
    ``index`` at or beyond the most honest clients a round can hold, min(n, n_users −
    floor(α · n_users)) with n = clients_per_round(n_users, e) (ByzFL's Mimic raises for an
    index beyond its honest clients; an index that only some rounds cannot reach is
    clamped in those rounds, see ``Mimic``)."""
    index = getattr(attack, "index", None)
    if getattr(attack, "name", None) != "mimic" or not isinstance(index, int):
        return
    n = clients_per_round(n_users, config.client_fraction)
    honest = n_users - math.floor(config.byzantine_fraction * n_users)
    most = min(n, honest)
    if index >= most:
        raise ValueError(
            f"--mimic-index (attack_params.index) {index} is beyond the honest clients of every "
            f"round: a round samples {n} clients at client fraction {config.client_fraction} "
            f"({honest} of the {n_users} clients are honest), so it holds at most {most} "
            f"honest ones; give an index in 0..{most - 1}")


def state_checksums(state: dict[str, np.ndarray]) -> dict[str, str]:
    import hashlib

    return {k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest() for k, v in state.items()}


@dataclasses.dataclass
class _Accumulators:
    """Sums over the rounds so far, kept in checkpoints."""

    byz_sampled: int = 0
    byz_kept: float = 0.0
    sampled: int = 0
    kept: float = 0.0
    exclusions: int = 0
    excluded_byzantine: int = 0
    excluded_honest: int = 0
    #: quantity → its sum over the rounds; None once it became NaN or ±inf
    resilience: dict = dataclasses.field(default_factory=dict)
    #: quantity → the round where its sum became NaN or ±inf
    resilience_non_finite: dict = dataclasses.field(default_factory=dict)

    def add(self, rec: dict) -> None:
        kept = np.asarray(rec["kept"])
        byz = np.asarray(rec["byzantine"], dtype=bool)
        self.sampled += len(byz)
        self.byz_sampled += int(byz.sum())
        self.kept += float(kept.sum())
        self.byz_kept += float(kept[byz].sum())
        self.exclusions += len(rec["excluded"])
        self.excluded_byzantine += sum(e["byzantine"] for e in rec["excluded"])
        self.excluded_honest += sum(not e["byzantine"] for e in rec["excluded"])
        for k, v in (rec.get("resilience") or {}).items():
            if k in self.resilience_non_finite:
                continue  # stays None: no later round makes it a number again
            total = self.resilience.get(k, 0.0) + (math.nan if v is None else float(v))
            if math.isfinite(total):
                self.resilience[k] = total
            else:  # a non-finite term, or a sum that overflowed
                self.resilience[k] = None
                self.resilience_non_finite[k] = int(rec["round"])

    def problems(self) -> list[str]:
        """What is wrong with sums read back from a checkpoint (hostile input)."""
        out = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "resilience":
                marks = self.resilience_non_finite
                ok = isinstance(v, dict) and all(
                    (x is None and isinstance(marks, dict) and k in marks)
                    or (isinstance(x, (int, float)) and not isinstance(x, bool)
                        and math.isfinite(x))
                    for k, x in v.items())
            elif f.name == "resilience_non_finite":
                ok = isinstance(v, dict) and all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 1
                    and isinstance(self.resilience, dict) and k in self.resilience
                    and self.resilience[k] is None
                    for k, x in v.items())
            else:
                ok = (isinstance(v, (int, float)) and not isinstance(v, bool)
                      and math.isfinite(v) and v >= 0)
            if not ok:
                out.append(f"accumulator {f.name} = {v!r}")
        return out

    def selection(self) -> dict:
        return {
            "byzantine_share_sampled": self.byz_sampled / self.sampled if self.sampled else 0.0,
            "byzantine_share_kept": self.byz_kept / self.kept if self.kept else 0.0,
            "excluded_byzantine": self.excluded_byzantine,
            # honest uploads always pass verification: anything but 0 is a bug
            "excluded_honest": self.excluded_honest,
        }


class RunDirectory:
    """The files of one run (see the module docstring)."""

    def __init__(self, path) -> None:
        self.path = pathlib.Path(path)

    def prepare(self, config: TrainConfig, resume: bool) -> bool:
        """Decide what a run of ``config`` does with this directory (the caller holds
        its lock); True: continue from the checkpoint, False: start at round 0.

        A new run (``resume`` False) needs a directory without a run, or one whose
        run stopped before its first checkpoint with the same configuration (it
        starts again: nothing but its round-0 evaluation is lost, and that is
        recomputed identically), and never one holding a sweep's record of a run
        (``outcome.json``: a sweep's run directory, which the sweep clears when that
        run starts again). ``resume`` continues from the checkpoint, or starts at
        round 0 when the run stopped before its first one.
        """
        p = self.path
        self.check_regular_files()
        has_checkpoint = (p / "checkpoint.npz").exists()
        record = next((n for n in ("outcome.json", "outcome.json.gz")
                       if (p / n).exists() or (p / n).is_symlink()), None)
        if not resume and record is not None:
            # a sweep worker clears the directory before its run starts, so only another
            # run would find the record here, and the sweep would wipe that run
            raise RunExists(f"{p} holds {record}, a sweep's record of a run: it is a "
                            "sweep's run directory, which the sweep clears when that run "
                            "starts again; choose another run directory (--out)")
        if resume:
            if not (p / "config.json").exists():
                raise FileNotFoundError(f"{p}: no run to resume (no config.json)")
            if not has_checkpoint and _finished(p):
                # restarting would train the whole run again and rewrite the records of a
                # finished run (a sweep removes a finished run's checkpoint and state)
                raise RunExists(f"{p} holds a finished run (final_metrics.json) and no "
                                "checkpoint: there is nothing to resume; its final evaluation "
                                "is in final_metrics.json (start a new run in another "
                                "directory to train it again)")
            return has_checkpoint
        # every file a run writes, ids.npz and valid_metrics.csv included: a new run never
        # writes over a file of that name that it did not write itself (a user's own)
        present = [name for name in (*RUN_FILES, VALID_METRICS, "ids.npz")
                   if (p / name).exists() or (p / name).is_symlink()]
        if not present:
            return False
        hint = f"resume it (rfrs-ref train --resume {p}) or choose another run directory (--out)"
        if has_checkpoint or "final_metrics.json" in present or "state.npz" in present:
            raise RunExists(f"{p} already holds a run; {hint}")
        try:
            recorded = json.loads((p / "config.json").read_text())["config"]
        except (OSError, ValueError, KeyError, TypeError):
            raise RunExists(f"{p} holds {', '.join(present)} without a readable config.json "
                            "(files a run writes, which it would overwrite); choose another run "
                            "directory (--out)") from None
        if _comparable(recorded) != _comparable(config.to_json()):
            raise RunExists(f"{p} holds a run of another configuration that stopped before its "
                            f"first checkpoint; {hint}")
        return False

    def check_regular_files(self) -> None:
        """:class:`CheckpointError` naming the first file of a run here (its name, or what a
        link of that name leads to) that is not a regular file: a FIFO, a device, a socket
        or a folder. Opening a FIFO for reading waits for a writer, so a run reading one
        would wait for ever; no run writes anything but regular files. Reads nothing."""
        import stat

        for name in (*RUN_FILES, VALID_METRICS, "ids.npz"):
            path = self.path / name
            try:
                mode = path.stat().st_mode  # a link: what it leads to (read through it)
            except FileNotFoundError:
                continue  # absent, or a link to nowhere (never read)
            except OSError as exc:
                raise CheckpointError(f"{path} cannot be examined ({exc.strerror or exc}); "
                                      "restore it, or start a new run in another "
                                      "directory") from None
            if not stat.S_ISREG(mode):
                kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode)
                        else "a socket" if stat.S_ISSOCK(mode) else "a device")
                raise CheckpointError(f"{path} is {kind}, not a regular file as a run writes "
                                      "its files; nothing was read or changed: move it away, "
                                      "or use another run directory")

    def start(self, trainer: Trainer) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        # a run starting (again) at round 0 here begins every file afresh: the rows of an
        # earlier attempt (one that diverged or stopped before its first checkpoint, perhaps
        # with another config.json) would otherwise precede this one's, and its diverged
        # final_metrics.json stand for this attempt until it ends (prepare() lets only such
        # an attempt's files be here)
        for name in (VALID_METRICS, "final_metrics.json"):
            (self.path / name).unlink(missing_ok=True)
        c = trainer.config
        record = {
            "config": c.to_json(),
            "dataset": {"name": trainer.data.name, "source": trainer.data.source,
                        "users": trainer.data.n_users, "items": trainer.data.n_items,
                        "interactions": trainer.data.n_interactions},
            "derived": {
                "n_params": trainer.model.n_params(),
                "clients_per_round": clients_per_round(trainer.data.n_users, c.client_fraction),
                "byzantine_clients": int(trainer.byzantine.sum()),
                "evaluated_clients": int(trainer.eval_users.size),
                "random_streams": ["split", "init", "sampling[t]", "byzantine",
                                   "negatives[t, client]", "attack[t]"],
            },
            **_code_and_data(trainer),
            "versions": software_versions(),
            "machine": machine_info(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        if trainer.targets is not None:
            record["derived"]["target_items"] = trainer.targets.tolist()
        text = json.dumps(record, indent=2, allow_nan=False) + "\n"
        atomic_write(self.path / "config.json", lambda fh: fh.write(text.encode("utf-8")))
        _write_ids(trainer, self.path)
        # replaced by rename, not opened for writing: a run restarting over its own earlier
        # attempt may find links planted at these names, and must not write through them
        header = ",".join(METRICS_FIELDS + (TARGET_FIELDS if trainer.targets is not None
                                            else [])) + "\r\n"  # csv.writer's line
        atomic_write(self.path / "metrics.csv", lambda fh: fh.write(header.encode("utf-8")))
        atomic_write(self.path / "rounds.jsonl", lambda fh: None)

    def append_metrics(self, t: int, m, pop, *, name: str = "metrics.csv") -> None:
        path = self.path / name
        if not path.exists():
            with open(path, "w", newline="") as fh:
                csv.writer(fh).writerow(METRICS_FIELDS)
        with open(path, newline="") as fh:  # a run started by an older version keeps its columns
            header = next(csv.reader(fh), METRICS_FIELDS)
        with open(path, "a", newline="") as fh:
            w = csv.writer(fh)
            for i, k in enumerate(m.ks):
                row = {"round": t, "k": k}
                for name in ("precision", "recall", "ndcg", "hr", "mrr"):
                    row[name] = repr(getattr(m, name)[i])
                    row[f"popularity_{name}"] = repr(getattr(pop, name)[i])
                for name in TARGET_FIELDS if m.er else ():
                    row[name] = repr(getattr(m, name)[i])
                w.writerow([row.get(f, "") for f in header])

    def append_round(self, record: dict) -> None:
        try:
            line = json.dumps(record, separators=(",", ":"), allow_nan=False)
        except ValueError:  # a NaN or ±inf (a diagnostic, a resilience term): JSON null
            line = json.dumps(jsonable(record), separators=(",", ":"), allow_nan=False)
        with open(self.path / "rounds.jsonl", "a") as fh:
            fh.write(line + "\n")

    def read_history(self) -> list[dict]:
        rows: dict[int, dict] = {}
        with open(self.path / "metrics.csv", newline="") as fh:
            for r in csv.DictReader(fh):
                t, k = int(r["round"]), int(r["k"])
                row = rows.setdefault(t, {"round": t})
                for name in ("precision", "recall", "ndcg", "hr", "mrr", *TARGET_FIELDS):
                    if r.get(name):
                        row[f"{name}@{k}"] = float(r[name])
        return [rows[t] for t in sorted(rows)]

    # -- checkpoints ---------------------------------------------------------------
    def save_checkpoint(self, state, private, t: int, acc: _Accumulators,
                        config: TrainConfig | None = None) -> None:
        """Write ``checkpoint.npz``: the state, private state, round, accumulators and
        (given ``config``) the configuration the run was trained with, which a resume
        compares with config.json (:meth:`load_checkpoint`)."""
        arrays = {f"state_{k}": v for k, v in state.items()}
        if private is not None:
            arrays.update({f"private_{k}": v for k, v in private.items()})
        arrays["round"] = np.array(t)
        arrays["accumulators"] = np.array(json.dumps(dataclasses.asdict(acc), allow_nan=False))
        if config is not None:
            arrays["config"] = np.array(json.dumps(config.to_json(), sort_keys=True, default=list,
                                                   allow_nan=False))
        atomic_write(self.path / "checkpoint.npz", lambda fh: np.savez(fh, **arrays))

    def load_checkpoint(self, trainer: Trainer):
        """(state, private, round, accumulators) of the checkpoint, checked against the
        trainer's configuration; :class:`CheckpointError` when it cannot continue."""
        path = self.path / "checkpoint.npz"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no checkpoint to resume from")
        restart = (f"move it away and resume again to restart the run from round 0, or start "
                   f"a new run in another directory")
        try:
            with np.load(path, allow_pickle=False) as z:
                state = {k[6:]: z[k] for k in z.files if k.startswith("state_")}
                private = {k[8:]: z[k] for k in z.files if k.startswith("private_")} or None
                t = int(z["round"])
                acc = _Accumulators(**json.loads(str(z["accumulators"])))
                trained = json.loads(str(z["config"])) if "config" in z.files else None
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
            raise CheckpointError(f"{path} is damaged or not a checkpoint "
                                  f"({type(exc).__name__}: {exc}); {restart}") from None
        c = trainer.config
        D = trainer.model.n_params()
        problems = []
        if trained is not None:
            # the rounds so far were trained with the checkpoint's configuration: one edited
            # in config.json (another seed, rate, number of rounds) would continue the run
            # as another and record it as one
            now = TrainConfig.trajectory(c.to_json())
            if not isinstance(trained, dict):
                problems.append("its configuration is not a JSON object")
            else:
                was = TrainConfig.trajectory(trained)
                changed = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
                if changed:
                    what = ", ".join(f"{k} {was.get(k)!r} -> {now.get(k)!r}" for k in changed[:4])
                    problems.append(f"config.json differs from the configuration the checkpoint was "
                                    f"trained with ({what}{', ...' if len(changed) > 4 else ''})")
        if not 0 <= t <= c.rounds:
            problems.append(f"round {t} is outside 0..{c.rounds}")
        rule_arrays = tuple(getattr(trainer.rule, "state_arrays", ()))
        expected = (*trainer.optimizer.arrays, *rule_arrays)
        if set(state) != set(expected):
            problems.append(f"state arrays {sorted(state)}, expected {sorted(expected)}")
        for k, v in state.items():
            dt = np.dtype(np.float64) if k in rule_arrays else trainer.dtype  # rule state: float64
            if v.shape != (D,) or v.dtype != dt:
                problems.append(f"state {k!r} is {v.dtype}{list(v.shape)}, expected {dt}[{D}]")
        if (private is not None) != trainer.model.has_private:
            problems.append("private client state " + ("missing" if private is None else "unexpected"))
        elif private is not None:
            problems += _private_problems(trainer, private, t)
        old = {k: v for k, v in (acc.resilience.items() if isinstance(acc.resilience, dict) else ())
               if isinstance(v, float) and not math.isfinite(v)}
        if old:
            k, v = next(iter(old.items()))
            raise CheckpointError(f"{path} records the resilience sum {k} as {v!r}, without the "
                                  "round where it became non-finite (rfrs-ref now records such a "
                                  "sum as null, with that round), so it cannot continue; "
                                  f"{restart}")
        problems += acc.problems()
        if problems:
            raise CheckpointError(f"{path} does not belong to this run ({'; '.join(problems)}); "
                                  f"{restart}")
        bad = first_non_finite({**state, **{f"private {k}": v for k, v in (private or {}).items()}})
        if bad is not None:
            raise CheckpointError(f"{path} holds {bad[1]} non-finite value(s) (NaN or ±inf) in "
                                  f"{bad[0]!r} at round {t}, so it cannot continue; {restart}")
        return state, private, t, acc

    def check_resumable(self, trainer: "Trainer") -> int:
        """Check, writing nothing, that the run can continue (its checkpoint and its
        tables); returns the checkpoint's round. :class:`CheckpointError` otherwise."""
        self.check_regular_files()
        t = self.load_checkpoint(trainer)[2]
        self._read_tables(t, valid=trainer.split.valid is not None)
        return t

    def record_resume(self, t: int) -> None:
        """When the code resuming the run from round ``t`` is not the code that started it
        (:func:`code_change`), append ``{"round", "then", "now", "at"}`` to config.json's
        ``resumed`` list (atomically), so that its provenance names both. Nothing is
        written for a resume by the same code."""
        path = self.path / "config.json"
        record = json.loads(path.read_text())
        change = code_change(record)
        if change is None:
            return
        entry = {"round": int(t), **change,
                 "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        record.setdefault("resumed", []).append(entry)
        text = json.dumps(record, indent=2, allow_nan=False) + "\n"
        atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))

    def read_finished(self, trainer: "Trainer") -> dict:
        """The final evaluation of a run that finished, once its files prove it finished
        with a finite model: the checkpoint and tables (:meth:`check_resumable`), a
        ``final_metrics.json`` whose model and popularity metrics are all finite numbers,
        whose ``beats_popularity`` is the boolean its precision at the largest K says and
        whose Byzantine shares are numbers in [0, 1], and a ``state.npz`` whose arrays are
        all finite. Writes nothing.

        Raises :class:`CheckpointError` naming the file otherwise: a NaN or ±inf read back
        from a finished run (a damaged or edited file) is never shown as its result.
        """
        self.check_resumable(trainer)
        path = self.path / "final_metrics.json"
        restore = "restore it, or start a new run in another directory"
        try:
            final = json.loads(path.read_text())
            parts = {part: final[part] for part in ("model", "popularity")}
            if final.get("valid"):
                parts.update({f"valid {part}": final["valid"][part]
                              for part in ("model", "popularity")})
            values = {f"{part} {name}": v for part, d in parts.items()
                      for name, v in d.items() if name != "n_users"}
            final["round"], final["beats_popularity"], final["selection"]  # noqa: B018 - printed
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{path}: {type(exc).__name__}: {exc}; {restore}") from None
        bad = [k for k, v in values.items()
               if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)]
        if bad:
            raise CheckpointError(f"{path}: {bad[0]} is {values[bad[0]]!r}, not a finite number "
                                  f"({len(bad)} such value(s)); {restore}")
        # what the summary prints besides the metrics: whether the model beats the popularity
        # ranking (the trainer writes the comparison of precision at the largest K) and the
        # Byzantine shares; a NaN or "no" read back printed "beats", true is checked too
        from rfrs_ref.metrics import beats_popularity_problem

        why = beats_popularity_problem(final, trainer.config.ks, need_precisions=True)
        if why is not None:
            raise CheckpointError(f"{path}: {why}; {restore}")
        sel = final["selection"]
        shares = {n: sel.get(n) for n in ("byzantine_share_sampled", "byzantine_share_kept")} \
            if isinstance(sel, dict) else {"selection": sel}
        bad = [n for n, v in shares.items() if isinstance(v, bool)
               or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0]
        if bad:
            raise CheckpointError(f"{path}: {bad[0]} is {shares[bad[0]]!r}, not a share in "
                                  f"[0, 1]; {restore}")
        problem = _resilience_problem(final.get("resilience"), final.get("resilience_non_finite"))
        if problem:
            raise CheckpointError(f"{path}: {problem}; {restore}")
        path = self.path / "state.npz"
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise CheckpointError(f"{path} is damaged or missing ({type(exc).__name__}: {exc}); "
                                  f"{restore}") from None
        found = first_non_finite(arrays)
        if found is not None:
            raise CheckpointError(f"{path} holds {found[1]} non-finite value(s) (NaN or ±inf) in "
                                  f"{found[0]!r}: not the state of a finished run; {restore}")
        return final

    def _read_tables(self, t: int, valid: bool = False):
        """The metrics tables' (header, rows up to round t) and round records up to round t,
        each checked; :class:`CheckpointError` if any file is damaged. ``valid``: the run
        has a validation split, so its ``valid_metrics.csv`` must be there (it holds the
        evaluations up to round t, which a resume would not write again)."""
        rounds = self.path / "rounds.jsonl"
        tables = {}
        path = rounds
        try:
            for name in ("metrics.csv", VALID_METRICS):
                path = self.path / name
                if name != "metrics.csv" and not path.exists():
                    if valid:
                        raise CheckpointError(
                            f"{path} is missing{' (a link to nowhere)' if path.is_symlink() else ''}"
                            f": the run has a validation split, whose evaluations up to round "
                            f"{t} that file holds; nothing was changed: restore it, or start "
                            "a new run in another directory")
                    continue
                with open(path, newline="") as fh:
                    reader = csv.reader(fh)
                    header = next(reader)
                    rows = [r for r in reader if int(r[0]) <= t]
                self._check_metrics(header, rows)
                tables[path] = (header, rows)
            kept = []
            path = rounds
            with open(rounds) as fh:
                for line in fh:
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        break  # a record cut short by the interruption
                    if int(rec["round"]) <= t:
                        kept.append(line if line.endswith("\n") else line + "\n")
        except CheckpointError:
            raise
        except (OSError, ValueError, KeyError, IndexError, TypeError, StopIteration,
                UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path} is damaged ({type(exc).__name__}: {exc}); restore "
                                  "it, or start a new run in another directory") from None
        return tables, kept

    def truncate_after(self, t: int, valid: bool = False) -> None:
        """Drop what was written after round t (metrics rows, validation rows, round records);
        ``valid``: the run has a validation split (see :meth:`_read_tables`).

        Every file is read and checked before any is rewritten (atomically), so a
        damaged file raises :class:`CheckpointError` and changes nothing."""
        rounds = self.path / "rounds.jsonl"
        tables, kept = self._read_tables(t, valid)

        def write_csv(header, rows):
            def write(fh):
                import io

                text = io.StringIO(newline="")
                w = csv.writer(text)
                w.writerow(header)
                w.writerows(rows)
                fh.write(text.getvalue().encode("utf-8"))
            return write

        for path, (header, rows) in tables.items():
            atomic_write(path, write_csv(header, rows))
        atomic_write(rounds, lambda fh: fh.write("".join(kept).encode("utf-8")))

    @staticmethod
    def _check_metrics(header, rows) -> None:
        if header[:2] != ["round", "k"]:
            raise ValueError(f"header {header} does not start with round,k")
        for r in rows:
            if len(r) != len(header):
                raise ValueError(f"row {r} has {len(r)} fields, the header {len(header)}")
            int(r[1])
            if not all(math.isfinite(float(x)) for x in r[2:]):
                raise ValueError(f"row {r} holds a non-finite value")

    def diverged(self, exc: "Diverged") -> None:
        """Record that the run diverged: ``final_metrics.json`` holds ``"status":
        "diverged"``, the round, the reason, what was non-finite, the last checkpoint
        and the last evaluation before it (no ``state.npz``: there is no final state)."""
        last = exc.history[-1] if exc.history else None
        final = {"status": "diverged", **exc.record(), "message": str(exc),
                 "last_evaluation": last}
        text = json.dumps(final, indent=2, allow_nan=False) + "\n"
        atomic_write(self.path / "final_metrics.json", lambda fh: fh.write(text.encode("utf-8")))

    def finish(self, final: dict, state, private, t: int) -> None:
        text = json.dumps(jsonable(final), indent=2, allow_nan=False) + "\n"
        atomic_write(self.path / "final_metrics.json", lambda fh: fh.write(text.encode("utf-8")))
        arrays = dict(state)
        if private is not None:
            arrays.update({f"private_{k}": v for k, v in private.items()})
        arrays["round"] = np.array(t)
        atomic_write(self.path / "state.npz", lambda fh: np.savez(fh, **arrays))


def _resilience_problem(sums, marks) -> str | None:
    """What is wrong with a finished run's recorded resilience totals (``sums``) and the
    rounds where some became non-finite (``marks``), or None: each total is a finite number,
    or null with its round (an integer ≥ 1) in ``marks``."""
    sums = {} if sums is None else sums
    marks = {} if marks is None else marks
    if not isinstance(sums, dict) or not isinstance(marks, dict):
        return "resilience and resilience_non_finite must be JSON objects"
    for k, t in marks.items():
        if isinstance(t, bool) or not isinstance(t, int) or t < 1 or k not in sums \
                or sums[k] is not None:
            return (f"resilience_non_finite {k} is {t!r}: not the round (≥ 1) of a resilience "
                    "total recorded as null")
    for k, v in sums.items():
        if v is None and k in marks:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return (f"resilience {k} is {v!r}, not a finite number (nor null with the round "
                    "where it became non-finite under resilience_non_finite)")
    return None


def _finished(path: pathlib.Path) -> bool:
    """Whether ``path/final_metrics.json`` records a finished run (not a diverged one, which
    has no final model: resuming it replays it, from round 0 when it has no checkpoint)."""
    try:
        final = json.loads((path / "final_metrics.json").read_text())
    except (OSError, ValueError):
        return (path / "final_metrics.json").exists()  # unreadable: never rewritten blindly
    return not (isinstance(final, dict) and final.get("status") == "diverged")


def _comparable(config_json: dict) -> dict:
    """A configuration as JSON, without what does not change the run's results."""
    d = json.loads(json.dumps(config_json))
    d.pop("trace", None)
    return d


#: versions in config.json whose change can change a run's numbers (see code_change)
_NUMERIC_VERSIONS = ("rfrs_ref", "numpy", "numba", "llvmlite", "scipy")


def code_change(record: Mapping) -> dict | None:
    """How the code running now differs from the code that wrote a run's ``config.json``
    (``record``, as parsed), or None when it does not: ``{"then": ..., "now": ...}``, each
    with ``code`` (package version, git commit) and the ``versions`` of the packages the
    numbers depend on. A git commit of ``"unknown"`` on either side compares equal to any.

    Resuming across such a change is allowed (a patch release, a run started before an
    upgrade), but the rounds after the checkpoint are then this code's, and a resumed run
    ends bit for bit where an uninterrupted one ends only with the same code: the change
    is said, and recorded in config.json (``resumed``), never silent.
    """
    from rfrs_ref.provenance import code_version

    then_code = record.get("code") if isinstance(record.get("code"), dict) else {}
    then_versions = record.get("versions") if isinstance(record.get("versions"), dict) else {}
    now_code, now_versions = code_version(), software_versions()
    differs = then_code.get("package", now_code["package"]) != now_code["package"]
    a, b = then_code.get("git_commit", "unknown"), now_code["git_commit"]
    differs |= "unknown" not in (a, b) and a != b
    differs |= any(name in then_versions and then_versions[name] != now_versions.get(name)
                   for name in _NUMERIC_VERSIONS)
    if not differs:
        return None
    pick = lambda v: {n: v.get(n) for n in _NUMERIC_VERSIONS}  # noqa: E731
    return {"then": {"code": dict(then_code), "versions": pick(then_versions)},
            "now": {"code": now_code, "versions": pick(now_versions)}}


def describe_code(side: Mapping) -> str:
    """``rfrs-ref 0.1.0 (commit 618716c), numpy 2.4.6, numba 0.68.1`` for one side of
    :func:`code_change`."""
    code, versions = side.get("code") or {}, side.get("versions") or {}
    commit = code.get("git_commit")
    text = f"rfrs-ref {code.get('package') or versions.get('rfrs_ref')}"
    if commit and commit != "unknown":
        text += f" (commit {str(commit)[:7]}{', with changes' if code.get('git_dirty') else ''})"
    return text + "".join(f", {n} {v}" for n, v in versions.items() if n != "rfrs_ref" and v)


def _code_and_data(trainer: "Trainer") -> dict:
    """``data_files`` (sha256 of each data file read) and ``code`` (version, git commit) for
    config.json. Never fails a run: what cannot be determined is recorded as ``"unknown"``
    with the reason."""
    from rfrs_ref.provenance import code_version, data_files

    c = trainer.config
    out: dict = {"code": code_version()}
    try:
        out["data_files"] = data_files(c.dataset, c.data_dir)
    except Exception as exc:  # noqa: BLE001 - e.g. data handed in by a caller, found nowhere
        out["data_files"] = f"unknown ({type(exc).__name__}: {exc})"
    return out


def _write_ids(trainer: "Trainer", path: pathlib.Path) -> None:
    """``ids.npz`` (the dataset's own user and item ids) beside config.json; never fails the
    run. Written after config.json, so that a directory holding an ``ids.npz`` but no
    config.json is never a run of this package (:meth:`RunDirectory.prepare` refuses it)."""
    from rfrs_ref.provenance import dataset_ids

    c = trainer.config
    try:
        users, items = dataset_ids(c.dataset, trainer.data, c.data_dir)
        if users.size == trainer.data.n_users and items.size == trainer.data.n_items:
            atomic_write(path / "ids.npz", lambda fh: np.savez(fh, user_ids=users, item_ids=items))
    except Exception:  # noqa: BLE001 - `rfrs-ref recommend` then says the ids are missing
        pass


def load_config(run_dir) -> TrainConfig:
    """The configuration recorded in ``run_dir/config.json``.

    Raises FileNotFoundError when there is none and ValueError (naming the file)
    when it is not a run record."""
    path = pathlib.Path(run_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no run to resume (no config.json)")
    try:
        record = json.loads(path.read_text())
        return TrainConfig.from_json(record["config"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not a run record ({type(exc).__name__}: {exc}); "
                         "restore it, or start a new run in another directory") from None


def train(config: TrainConfig, run_dir=None, *, resume: bool = False, progress=None) -> TrainResult:
    """Configure and run; see :class:`Trainer`."""
    if resume:
        config = load_config(run_dir)
    return Trainer(config).run(run_dir, resume=resume, progress=progress)
