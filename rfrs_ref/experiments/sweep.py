"""Run a list of runs on Dask (an embedded LocalCluster or a remote scheduler), with resume.

:func:`run_sweep` is the engine behind ``rfrs-ref sweep`` and ``rfrs-ref reproduce``:

- **One task per run.** Each run is submitted as one Dask task
  (:func:`rfrs_ref.experiments.worker.execute_run`); results are collected
  with ``as_completed`` in the order they finish.
- **Streaming, durable results.** As soon as a run finishes its outcome is
  written atomically to ``OUT/runs/<key>/outcome.json`` and the results table
  (``results.csv`` / ``runs.csv``, ``results.parquet``) is rewritten, so an interruption
  (Ctrl-C, SIGKILL, power loss) loses only the runs still going.
- **Tables of the whole experiment.** ``table_runs`` names the runs whose
  recorded outcomes make the tables, in their order, beside the ones asked
  for: a figure passes its whole grid, so that a call restricted to one
  dataset writes tables holding every dataset already recorded in the
  directory, in the same order whatever the call, instead of rewriting them
  with its own runs only.
- **Failure isolation.** A run that raises is recorded with its error and
  traceback (``status = failed``) and the others go on; so is a run whose
  worker died (e.g. out of memory: Dask's ``KilledWorker``).
- **Divergence is an outcome.** A run whose model diverged (non-finite server
  state or scores) is recorded with ``status = diverged``, its round and the
  history before it; like a run that finished, it is never run again.
- **Reuse.** ``reuse_from`` names other results directories: a run not yet
  recorded here whose key (the hash of its whole configuration) is recorded
  there as finished or diverged is copied, not run again, with
  ``reused_from`` in its outcome. Figures share runs this way (Fig. 3's A-FRS,
  Fig. 2's "No attack" and Fig. 10's Adam are the same runs).
- **Resume.** Runs are keyed by :func:`rfrs_ref.experiments.spec.run_key`;
  running the same sweep again skips every run already finished or diverged
  (failed runs are tried again unless ``retry_failed=False``, and so are runs recorded
  ``ok`` whose record holds no result: :func:`rfrs_ref.experiments.results.unfinished_reason`).
  On a shared filesystem a run that was cut off half-way continues from its last checkpoint.
- **Machine sizing.** The default LocalCluster has one single-threaded Dask
  worker process per core, fewer if the runs' estimated memory does not fit
  (:func:`plan_workers`), and each worker's Numba and OpenMP thread counts are
  set so that workers × threads ≤ cores. ``RFRS_DATA_DIR`` is passed to the
  workers. With ``scheduler=ADDRESS`` the runs go to an existing cluster,
  whose workers keep their own settings (they need ``rfrs_ref`` installed and
  the datasets reachable: their own ``RFRS_DATA_DIR``, else the driver's).
- ``workers=0`` runs everything in this process, one run after the other,
  without Dask; so does the default when Dask is not installed (a plain
  ``pip install .``). Asking for Dask workers or a scheduler without it is a
  ``ValueError`` naming the extra to install, raised before anything is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
import pathlib
import time
import traceback
from typing import Callable, Sequence

from rfrs_ref.experiments.committed import record_call, record_reconstructed
from rfrs_ref.experiments.results import (Store, foreign_file, foreign_runs_entry,
                                          frame_from_rows, record_of_another_run,
                                          refuse_links, recordable,
                                          store_lock, summary_label_columns, sweep_owned,
                                          tidy_rows, unfinished_reason,
                                          write_summary, write_table)
from rfrs_ref.experiments.spec import RunSpec, check_unique, runs_from
from rfrs_ref.experiments.worker import execute_run, foreign_run_outcome

#: share of the available memory the default LocalCluster plans to use
MEMORY_SHARE = 0.8

#: the one-line answer when Dask is needed but not installed
DASK_MISSING = ("running on Dask needs the distributed extra: pip install 'rfrs-ref[distributed]' "
                "(or run in this process with --workers 0)")


def dask_available() -> bool:
    """Whether ``distributed`` (Dask's scheduler, the ``distributed`` extra) is installed."""
    import importlib.util

    return importlib.util.find_spec("distributed") is not None


@dataclasses.dataclass
class SweepReport:
    """What a sweep did.

    Attributes:
        out: the output directory.
        total: runs in the sweep; skipped: not run by this call because recorded before it
            (finished or diverged, and ``kept_failed`` and ``no_result`` of them);
        kept_failed: skipped runs whose earlier failure is kept (``retry_failed`` False);
        damaged: (path, reason, run again) of each outcome.json of the sweep's runs that
            does not read (a damaged or edited record is no result: a failure, run again
            unless ``retry_failed`` is False, when it counts in ``kept_failed``);
        no_result: skipped runs (``retry_failed`` False) recorded as finished or diverged
            whose record holds no result (a metric that is not a finite number in [0, 1], a
            final evaluation before the last round, a divergence at no round of the run...:
            ``results.unfinished_reason``; a damaged or edited outcome.json): the tables
            show them as failed, and like ``kept_failed``
            they are failures the call leaves in place;
        reused: copied by this call from another directory's record (``reuse_from``);
        finished, diverged, failed: runs of this call that finished, diverged or failed.
        table, summary: the tidy and summary tables (pandas DataFrames) of the sweep's runs.
        wall_s: seconds this call took; workers: Dask workers used (0: in process).
        interrupted: the call was interrupted (KeyboardInterrupt) before the end.
        label_columns: the label columns of the Markdown summary (``label_columns``, then
            every other label of the runs).
    """

    out: pathlib.Path
    total: int
    skipped: int
    reused: int = 0
    finished: int = 0
    failed: int = 0
    table: object = None
    summary: object = None
    wall_s: float = 0.0
    workers: int = 0
    interrupted: bool = False
    failures: list = dataclasses.field(default_factory=list)
    diverged: int = 0
    divergences: list = dataclasses.field(default_factory=list)
    kept_failed: int = 0
    no_result: int = 0
    label_columns: tuple = ()
    damaged: list = dataclasses.field(default_factory=list)

    @property
    def pending(self) -> int:
        return (self.total - self.skipped - self.reused - self.finished - self.failed
                - self.diverged)


# -- sizing ----------------------------------------------------------------------------------
def available_cores() -> int:
    """Cores this process may use (CPU affinity where the OS reports it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def available_memory() -> int | None:
    """Bytes of memory available now (Linux MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover
        pass
    try:  # pragma: no cover - other POSIX systems
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return None


def estimate_run_memory(spec: RunSpec, low_memory: bool = False) -> int:
    """A rough upper bound of one run's peak memory in bytes.

    Formula: the round buffers, n·D·s·(2 + a) (gradients, features and the a
    uploaded arrays of n clients per round, D parameters, s bytes per value),
    plus the server state 3·a·D·8 (with its float64 copies), plus the
    evaluation's score block (1024 clients × n_items × 8) and 300 MB of
    interpreter, Numba and data. Counts come from the dataset manifest (real
    data) or the generator's parameters (synthetic). ``low_memory`` (a run whose
    rule combines by weights, with verification: ``Federation.recomputes_uploads``)
    counts the features of n clients and the other buffers of 16 only. A run whose rounds
    compute the rows the clients share once (``rounds_compare_shared_rows``: Krum, A-RFRS,
    RFA, the median, the trimmed mean, Meamed and Bulyan with FISM) counts the gradients of 16 clients and
    the features and uploads of n clients (in low memory, the uploads of 16) on the
    columns where they differ: FISM's P and 1.25 times the mean number of items of n
    users of Q's rows (the buffers' own allocation, ``Trainer.buffers``); out of low
    memory, with parameter-space detection, or gradient-space detection and an
    optimiser whose recovery reads one array (SGD, momentum, Adam), they hold no
    features there (``rounds_derive_features``).
    """
    from rfrs_ref.optim import OPTIMIZERS

    c = spec.config
    n, D, items = _round_size(c)
    a = len(OPTIMIZERS.get(c.optimizer).arrays)
    s = 4 if c.dtype == "float32" else 8
    rows = n * (2 + a)
    from rfrs_ref.federated.round import (GRADIENT_BATCH, rounds_compare_shared_rows,
                                          rounds_derive_features, rounds_recompute_uploads,
                                          shared_rows_columns)

    values = rows * D
    cols = D  # the columns of the features and uploads
    if rounds_compare_shared_rows(c):
        from rfrs_ref.model import MODELS

        block = MODELS.get(c.model)(n_items=items, **c.model_params).shared_block
        cols = shared_rows_columns(block, n, _mean_items(c))
    if low_memory and rounds_recompute_uploads(c):
        values = min(n, GRADIENT_BATCH) * D + (n + min(n, GRADIENT_BATCH) * a) * cols
    elif cols < D:
        values = min(n, GRADIENT_BATCH) * D + n * (a + (0 if rounds_derive_features(c) else 1)) * cols
    return int(values * s + 3 * a * D * 8 + 1024 * items * 8 + 300e6)


def _mean_items(c) -> float:
    """Mean number of items per user of configuration c's dataset (all interactions)."""
    if c.dataset == "synthetic":
        from rfrs_ref.data import DATASETS

        entry = DATASETS.get("synthetic")(**c.dataset_params)
        return float(getattr(entry, "mean_items", 20.0))
    from rfrs_ref.data import manifest

    m = manifest(c.dataset)
    return m.n_interactions / max(1, m.n_users)


def estimate_run_cost(spec: RunSpec) -> float:
    """Relative cost of a run, rounds · n · D (used to start the longest runs first)."""
    c = spec.config.resolved()
    n, D, _ = _round_size(c)
    return float(c.rounds) * n * D


def _round_size(c) -> tuple[int, int, int]:
    """(clients per round, parameter count D of the model, items) of configuration c."""
    from rfrs_ref.federated.population import clients_per_round
    from rfrs_ref.model import MODELS

    users, items = _dataset_size(c)
    D = MODELS.get(c.model)(n_items=items, **c.model_params).n_params()
    return clients_per_round(users, c.client_fraction), D, items


#: the most bytes a run may need: 2^57, the largest virtual address space of any 64-bit
#: processor (x86-64 with 5-level paging; ARMv8 addresses 2^52 at most), far above what
#: machines hold and far below where numpy's int64 sizes overflow (2^63 bytes)
MAX_RUN_BYTES = 2 ** 57

#: the size fields a run's memory grows with, as a sweep file and as ``train`` name them
SIZE_FIELDS = (("model_params", "dim"), ("dataset_params", "n_users"),
               ("dataset_params", "n_items"))


class RunTooLarge(ValueError):
    """A run whose estimated memory exceeds :data:`MAX_RUN_BYTES`. ``field`` and ``value``
    name the size that makes it so (``model_params.dim``), ``reason`` the rest of the
    message, so that a command can name the field as its own option."""

    def __init__(self, field: str, value, reason: str) -> None:
        self.field, self.value, self.reason = field, value, reason
        super().__init__(f"{field} = {value}{reason}")


def check_size(config, limit: int | None = None, beyond: str = "") -> None:
    """:class:`RunTooLarge` when the run's estimated memory (:func:`estimate_run_memory`,
    with at least 8 bytes per client of the dataset) exceeds ``limit`` (below
    :data:`MAX_RUN_BYTES`; ``beyond`` says what it is, for the message, e.g. "more than
    4 times this machine's memory"), else :data:`MAX_RUN_BYTES`: such a
    run could not allocate its parameter vector on any machine (``--dim
    9223372036854775807`` failed in numpy with "Maximum allowed dimension exceeded").
    Blamed is the first of the size fields set in the configuration (``model_params.dim``,
    ``dataset_params.n_users``, ``n_items``) whose default alone would make the run fit,
    else the largest of them. A dataset whose size is not known here is left alone."""
    c = config.resolved()

    def need(cfg) -> int | None:
        try:
            users, _ = _dataset_size(cfg)
            return max(estimate_run_memory(RunSpec(cfg)), 8 * users)
        except (KeyError, LookupError, ValueError, TypeError, OSError, ImportError,
                OverflowError):
            return None

    total = need(c)
    if total is None or total <= (MAX_RUN_BYTES if limit is None else min(limit, MAX_RUN_BYTES)):
        return
    if limit is None or total > MAX_RUN_BYTES:  # beyond any machine: the stronger reason
        limit = MAX_RUN_BYTES
        beyond = f"more than any machine can address ({MAX_RUN_BYTES:.3g} bytes, 2^57)"
    given = [(table, name, getattr(config, table).get(name)) for table, name in SIZE_FIELDS
             if name in getattr(config, table)]
    blamed = None
    for table, name, value in given:
        params = {k: v for k, v in getattr(config, table).items() if k != name}
        smaller = need(dataclasses.replace(config, **{table: params}).resolved())
        if smaller is not None and smaller <= limit:
            blamed = (table, name, value)
            break
    if blamed is None and given:
        blamed = max(given, key=lambda g: g[2] if isinstance(g[2], (int, float)) else 0)
    table, name, value = blamed or ("client_fraction", None, c.client_fraction)
    field = f"{table}.{name}" if name else table
    n, D, _ = _round_size(c)
    raise RunTooLarge(field, value, (
        f": the run would need about {total:.3g} bytes ({D:,} parameters, {n:,} clients a "
        f"round), {beyond}"))


def check_feasible(config) -> None:
    """ValueError, with the trainer's own message, when a run would stop before its first
    round: a run too large for any machine (:func:`check_size`), a K of ``ks`` above the
    dataset's number of items, a rule whose precondition on n and f fails (Krum's
    n > 2f + 2...; see ``trainer.check_rule_precondition``), or a mimic index no round
    can reach (``trainer.check_attack_precondition``).

    The trainer makes the same checks once its data are loaded; this one takes the counts
    from the dataset's manifest (the generator's parameters for synthetic data), so that a
    sweep refuses such a run before anything is written. A dataset whose size is not
    known here is left to the trainer.
    """
    from rfrs_ref.attack import ATTACKS
    from rfrs_ref.federated.trainer import check_attack_precondition, check_rule_precondition
    from rfrs_ref.metrics import check_ks

    c = config.resolved()
    try:
        users, items = _dataset_size(c)
    except (KeyError, LookupError, ValueError, TypeError, OSError, ImportError):
        return
    check_size(config)
    check_ks(c.ks, items)
    check_rule_precondition(_server_rule(c), c, users)
    check_attack_precondition(ATTACKS.get(c.attack)(**c.attack_params), c, users)


def _server_rule(c):
    """The resolved configuration ``c``'s rule with its pre-aggregators, as the round builds it."""
    from rfrs_ref.aggregate import RULES
    from rfrs_ref.aggregate.pre import build as with_pre
    from rfrs_ref.federated.config import _rule_name

    return with_pre(c.pre, c.pre_params, RULES.get(_rule_name(c.defense))(**c.defense_params))


def unmet_precondition(config):
    """The :class:`~rfrs_ref.aggregate.PreconditionError` that the run's rule (with its
    pre-aggregator) would raise before its first round, as :func:`check_feasible` finds
    it: n clients a round from the dataset's manifest counts (the generator's parameters
    for synthetic data) and the client fraction, f from the assumed fraction. None when
    the rule can aggregate such a round, and when this cannot be told here (a dataset
    whose size is not known, a configuration with another defect, which
    :func:`check_feasible` reports)."""
    from rfrs_ref.aggregate import PreconditionError
    from rfrs_ref.federated.trainer import check_rule_precondition

    try:
        c = config.resolved()
        users, _ = _dataset_size(c)
        check_rule_precondition(_server_rule(c), c, users)
    except PreconditionError as exc:
        return exc
    except (KeyError, LookupError, ValueError, TypeError, OSError, ImportError):
        pass
    return None


def _dataset_size(c) -> tuple[int, int]:
    if c.dataset == "synthetic":
        from rfrs_ref.data import DATASETS

        entry = DATASETS.get("synthetic")(**c.dataset_params)
        return entry.n_users, entry.n_items
    from rfrs_ref.data import manifest

    m = manifest(c.dataset)
    return m.n_users, m.n_items


def plan_workers(runs: Sequence[RunSpec], cores: int | None = None,
                 memory: int | None = None, low_memory: bool = False) -> int:
    """Default number of LocalCluster workers: one per core, as many as the largest run's
    estimated memory allows within MEMORY_SHARE of the available memory, at most one per
    run, at least 1 (``low_memory``: the runs' estimates with it)."""
    cores = cores or available_cores()
    n = min(cores, max(1, len(runs)))
    memory = available_memory() if memory is None else memory
    if memory and runs:
        peak = max(estimate_run_memory(r, low_memory) for r in runs)
        n = min(n, max(1, math.floor(MEMORY_SHARE * memory / peak)))
    return max(1, n)


def worker_env(threads: int) -> dict[str, str]:
    """Environment of LocalCluster workers: thread counts and the dataset directory."""
    env = {name: str(threads) for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS",
                                           "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    if os.environ.get("RFRS_DATA_DIR"):
        env["RFRS_DATA_DIR"] = os.environ["RFRS_DATA_DIR"]
    return env


def start_local_cluster(workers: int, threads: int | None = None):
    """A LocalCluster of ``workers`` single-threaded worker processes and its Client.

    Each worker gets ``threads`` Numba/OpenMP threads (default cores // workers,
    at least 1) and ``RFRS_DATA_DIR``. A task whose worker dies is not retried
    on another worker (``allowed-failures`` 0): the run is recorded as failed.
    """
    import warnings

    import dask
    from distributed import Client, LocalCluster

    threads = threads or max(1, available_cores() // workers)
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            warnings.catch_warnings():
        # the scheduler's HTTP server (health routes; no dashboard here) moves to a free
        # port when 8787 is taken, e.g. by another sweep: nothing to warn a user about
        warnings.filterwarnings("ignore", message=r"Port \d+ is already in use")
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               dashboard_address=None, env=worker_env(threads))
        client = Client(cluster)
    return cluster, client


def connect_scheduler(address: str):
    """A ``distributed.Client`` of the Dask scheduler at ``address``, or OSError in one line.

    Whatever answers at the address is input: a port that refuses, a server that is not a
    Dask scheduler (an HTTP server's reply read as a Dask message once asked for exabytes),
    or one that never answers, is "no Dask scheduler answered", with what went wrong."""
    from distributed import Client

    try:
        return Client(address, timeout=30)
    except Exception as exc:  # noqa: BLE001 - anything the peer makes the client raise
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise OSError(f"no Dask scheduler answered at {address} ({type(exc).__name__}: {detail}); "
                      "start one there (dask scheduler) or check the address") from None


# -- the sweep -------------------------------------------------------------------------------
Event = Callable[[str, RunSpec, dict | None, "SweepReport"], None]


def run_sweep(
    runs: Sequence[RunSpec],
    out: str | os.PathLike,
    *,
    scheduler: str | None = None,
    client=None,
    workers: int | None = None,
    threads: int | None = None,
    shared_fs: bool | None = None,
    retry_failed: bool = True,
    keep_state: bool = False,
    low_memory: bool = False,
    on_event: Event | None = None,
    label_columns: Sequence[str] = (),
    table_runs: Sequence[RunSpec] | None = None,
    run: bool = True,
    reuse_from: Sequence[str | os.PathLike] = (),
) -> SweepReport:
    """Run every run of ``runs`` not yet finished in ``out``; write the tables.

    Args:
        runs: the sweep (RunSpecs, or TrainConfigs taken as trial 0).
        out: the output directory (the store, see ``rfrs_ref.experiments.results``).
        scheduler: address of an existing Dask scheduler (``tcp://host:8786``);
            None starts a LocalCluster for the duration of the call.
        client: an existing ``distributed.Client`` to use instead (not closed).
        workers: LocalCluster workers (None: :func:`plan_workers`; 0: run in
            this process without Dask).
        threads: Numba/OpenMP threads per LocalCluster worker (None: cores // workers);
            with ``workers=0``, Numba threads of this process (None: unchanged).
        shared_fs: whether the workers see ``out`` (None: True for a LocalCluster
            and in process, False for a remote scheduler or a given client).
        retry_failed: run again the runs whose recorded outcome is a failure, and those
            recorded as finished or diverged whose record holds no result (shown as failed).
        keep_state: keep each run's final ``state.npz``.
        low_memory: robust runs hold their uploads a batch of clients at a time
            (``Trainer(low_memory=True)``): the same results, in less memory.
        on_event: ``on_event(event, spec, outcome, report)`` with event
            ``"plan"`` (once, spec None), ``"done"``, ``"diverged"`` or ``"failed"``.
        label_columns: label columns listed first in the Markdown summary; the other
            labels of the runs follow them (every label is a column there).
        table_runs: the runs whose recorded outcomes (in ``out``) make the tables,
            in this order; runs of ``runs`` not among them follow. None: ``runs``.
            None of them is run; one without an outcome is left out.
        run: False runs nothing: the tables (and a figure's plots) are written from
            the outcomes already recorded; the runs left are ``report.pending``.
        reuse_from: other results directories (your own: their records are trusted
            as results once the configuration they hold hashes to the run's key).
            A run to do whose key one of them records as finished or diverged is
            copied from the first that has it (outcome and per-round summary; the
            outcome gains ``reused_from``: the directory relative to ``out``, and
            the labels it had there) instead of being run. Failed runs are never
            copied. Ignored when ``run`` is False.
    Returns:
        A :class:`SweepReport`.
    Raises:
        ValueError: a run's configuration is invalid or two runs share a key (nothing is
            run then).
        StoreLocked: another sweep is writing to ``out``.
        KeyboardInterrupt: after the finished runs are recorded and the cluster is closed.
    """
    runs = runs_from(runs)
    check_runs(runs, feasible=run)
    keys = check_unique(runs)
    by_key = dict(zip(keys, runs))
    table_specs = {}  # key -> spec, in the tables' order
    for spec in [*(runs_from(table_runs) if table_runs is not None else []), *runs]:
        table_specs.setdefault(spec.key, spec)
    # every label is a column of summary.md
    label_columns = summary_label_columns(table_specs.values(), label_columns)
    if workers != 0 and client is None and not dask_available():
        if scheduler is not None or workers is not None:
            raise ValueError(DASK_MISSING)
        workers = 0  # the default without Dask: one run after the other, here
    store = Store(out)
    owned = sweep_owned(store.path)
    if owned is not None:
        # a run directory is cleared when its run starts again: a store inside one would go
        # with it, a store's files mixed into a run's are neither's, and an entry of another
        # store's runs/ is read by that sweep as a run of its own
        raise ValueError(f"{out} {owned}; give a results directory of its own; nothing was run")
    started = time.perf_counter()
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with store_lock(store.path):
        refuse_links(store.path)  # a link is named as one before anything else is judged
        foreign = foreign_file(store.path)
        if foreign is not None:
            raise ValueError(f"{foreign} was not written by a sweep, and a sweep rewrites "
                             f"{foreign.name} in its output directory; move it away or choose "
                             "another output directory; nothing was run")
        stray = foreign_runs_entry(store.path)
        if stray is not None:
            raise ValueError(f"{stray} is not a run directory of a sweep: a sweep keeps its "
                             f"runs in {store.runs}, one folder per run named by its key "
                             "(16 hex digits) and nothing else, and this runs/ is another's; "
                             "choose another output directory (or move it out); nothing was "
                             "run")
        refuse_other_scale(store, table_specs)
        outcomes: dict[str, dict] = {}
        copied_now: list[dict] = []  # the records this call copied (reuse_from)
        misplaced: dict[str, str] = {}  # key -> why its record is another run's
        compacted = False
        for k in keys:
            o = store.read_outcome(k)
            if o is not None and (why := record_of_another_run(o, k)) is not None:
                misplaced[k] = why
            elif o is not None:
                outcomes[k] = store.compact(k, o)
                compacted |= outcomes[k] is not o
        for k in table_specs:  # recorded runs of the experiment that this call does not run
            if k not in by_key:
                o = store.read_outcome(k)
                if o is not None and record_of_another_run(o, k) is None:
                    outcomes[k] = o
        if compacted:
            # outcomes written before provenance.json existed: say what they tell of their runs
            record_reconstructed(store.path, list(outcomes.values()))
        # a record that says "ok" or "diverged" but holds no result is a failure: shown as
        # one in the tables, run again like one, and never counted as done
        no_result = {k for k in keys if k in outcomes
                     and _not_a_result(outcomes[k], by_key[k].config)}
        done = {k for k in keys if k in outcomes and k not in no_result
                and outcomes[k].get("status") in ("ok", "diverged")}
        # an outcome.json there that does not read (damaged, edited, not JSON) is no
        # record: a failure like any other, run again unless failures are kept, and said
        damaged = {k: why for k in keys if k not in outcomes
                   and (why := misplaced.get(k) or store.outcome_problem(k)) is not None}
        failed_before = {k for k in keys if k in no_result or k in damaged
                         or (k in outcomes and outcomes[k].get("status") == "failed")}
        pending = [k for k in keys if k not in done
                   and (retry_failed or k not in failed_before)]
        linked = [store.run_dir(k) for k in pending if store.run_dir(k).is_symlink()]
        if linked:
            # a run's directory is cleared when the run starts again, and its outcome written
            # there: through a link, both would reach a directory outside the store
            raise ValueError(f"{linked[0]} is a link (to {os.readlink(linked[0])}), not a run "
                             f"directory of this sweep ({len(linked)} such); remove it and run "
                             "the sweep again; nothing was run")
        report = SweepReport(out=store.path, total=len(runs), skipped=len(keys) - len(pending),
                             label_columns=tuple(label_columns))
        waiting = set(pending)
        report.damaged = [(store.outcome_path(k), why, k in waiting) for k, why in damaged.items()]
        for k in (k for k in keys if k not in waiting):  # recorded before this call
            if k in no_result:
                report.no_result += 1
            elif k in damaged or outcomes[k].get("status") == "failed":
                report.kept_failed += 1
        if not run:
            pending = []
        sources = [Store(d) for d in reuse_from]
        sources = [src for src in sources if src.path.resolve() != store.path.resolve()]
        for src in sources if pending else ():
            link = _linked_record(src, pending)
            if link is not None:
                # a record read through a link is another directory's, copied with this
                # one's name as its provenance (reused_from)
                raise ValueError(f"{link} is a link (to {os.readlink(link)}), and rfrs-ref "
                                 "copies a run only from the files inside a --reuse-from "
                                 "directory, never through a link; replace the link by the "
                                 "files (or give the directory it points to); nothing was run")

        rows: dict[str, list[dict]] = {}  # tidy rows per recorded run, made once

        def flush():
            for k, spec in table_specs.items():
                if k in outcomes and k not in rows:
                    try:
                        rows[k] = tidy_rows(spec, outcomes[k], key=k)
                    except (AttributeError, KeyError, TypeError, ValueError) as exc:
                        raise ValueError(
                            f"{store.outcome_path(k)}: not a run record the tables can read "
                            f"({type(exc).__name__}: {exc}); move the run's directory away "
                            "and the run is run again") from None
            report.table = frame_from_rows([r for k in table_specs if k in rows
                                            for r in rows[k]])
            write_table(report.table, store.path)

        def record(spec, outcome):
            outcome = store.write_outcome(spec, outcome)
            outcomes[outcome["key"]] = outcome
            rows.pop(outcome["key"], None)
            if outcome.get("reused_from") is not None:
                report.reused += 1
                event = "reused"
            elif outcome["status"] == "ok":
                report.finished += 1
                event = "done"
            elif outcome["status"] == "diverged":
                report.diverged += 1
                report.divergences.append((spec, outcome.get("divergence")))
                event = "diverged"
            else:
                report.failed += 1
                report.failures.append((spec, outcome.get("error")))
                event = "failed"
            flush()
            if on_event is not None:
                on_event(event, spec, outcome, report)

        flush()
        # a directory holding a run the sweep did not start is never cleared nor written
        # over, wherever the run would train: recorded as failed, with the worker's reason
        for k in list(pending):
            refused = foreign_run_outcome(store.run_dir(k), by_key[k])
            if refused is not None:
                record(by_key[k], refused)
                pending.remove(k)
        if sources:
            for k in list(pending):
                copied = _reused_outcome(k, sources, store.path)
                if copied is not None:
                    record(by_key[k], copied)
                    copied_now.append(copied)
                    pending.remove(k)
        data_dir = os.environ.get("RFRS_DATA_DIR")
        in_process = workers == 0 and client is None and scheduler is None
        if shared_fs is None:
            shared_fs = in_process or (client is None and scheduler is None)
        # absolute for workers in other directories, but the run's own directory unresolved:
        # a link planted at runs/<key> must reach the worker as a link (which refuses it),
        # not as the directory it points to (which a restarted run would clear)
        runs_root = store.runs.resolve()
        tasks = {k: {"spec": by_key[k].to_json(), "key": k,
                     "run_dir": str(runs_root / k) if shared_fs else None,
                     "data_dir": data_dir, "keep_state": keep_state,
                     "low_memory": low_memory} for k in pending}
        cluster = own_client = None
        try:
            if pending:
                if in_process:
                    report.workers = 0
                    if on_event is not None:
                        on_event("plan", None, None, report)
                    with _numba_threads(threads):
                        for k in pending:
                            record(by_key[k], execute_run(tasks[k]))
                else:
                    if client is None:
                        if scheduler is not None:
                            client = own_client = connect_scheduler(scheduler)
                        else:
                            n = workers or plan_workers([by_key[k] for k in pending],
                                                        low_memory=low_memory)
                            cluster, client = start_local_cluster(n, threads)
                            own_client = client
                    report.workers = len(client.scheduler_info().get("workers", {}))
                    if on_event is not None:
                        on_event("plan", None, None, report)
                    _run_on_dask(client, pending, tasks, by_key, record)
        except KeyboardInterrupt:
            report.interrupted = True
            raise
        finally:
            if own_client is not None:
                _close(own_client, cluster)
            report.wall_s = time.perf_counter() - started
            flush()
            report.summary, _ = write_summary(report.table, store.path,
                                              label_columns=label_columns)
            if report.finished or report.failed or report.diverged or report.reused:
                # a call that ran nothing leaves the directory byte for byte as it was
                record_call(store.path, started=started_at, wall_s=report.wall_s,
                            total=report.total, skipped=report.skipped,
                            finished=report.finished, failed=report.failed,
                            diverged=report.diverged, reused=report.reused,
                            workers=report.workers,
                            run_wall_s=[outcomes[k].get("wall_s") or 0.0 for k in pending
                                        if k in outcomes],
                            reused_wall_s=[o.get("wall_s") or 0.0 for o in copied_now],
                            reused_from=[o["reused_from"]["directory"] for o in copied_now])
    return report


def check_runs(runs: Sequence[RunSpec], feasible: bool = True) -> None:
    """The checks :func:`run_sweep` makes before anything is written: each run's
    configuration resolves and (``feasible``) :func:`check_feasible` accepts it.

    Raises:
        ValueError: one line, ``invalid configuration(s), nothing was run: ...``,
            saying each distinct reason once, after the number of runs it concerns
            and the first of them.
    """
    invalid: dict[str, list[str]] = {}  # reason -> the runs it concerns
    for i, spec in enumerate(runs_from(runs)):
        try:
            spec.config.resolved()
            if feasible:
                check_feasible(spec.config)  # a run that would stop before its first round
        except (ValueError, KeyError, TypeError) as exc:
            reason = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
            invalid.setdefault(reason, []).append(
                f"run {i} ({dict(spec.labels)}, seed {spec.config.seed})")
    if invalid:
        # one line: each reason once, with the number of runs it concerns and the first
        raise ValueError("invalid configuration(s), nothing was run: " + "; ".join(
            f"{_runs_concerned(which)}: {reason}" for reason, which in invalid.items()))


def _runs_concerned(which: Sequence[str]) -> str:
    """``run 3 (...)`` for one run, ``4 runs (the first: run 0 (...))`` for several."""
    return which[0] if len(which) == 1 else f"{len(which)} runs (the first: {which[0]})"


def _not_a_result(outcome: dict, config) -> bool:
    """Whether ``outcome`` is recorded as finished (``ok``) or diverged but holds no result
    the tables count (:func:`~rfrs_ref.experiments.results.unfinished_reason`: no final
    evaluation, one before the configuration's last round, a metric that is not a finite
    number in [0, 1], a divergence without a round of the run or the trainer's reason: a
    damaged or edited record); ``config`` is the run's configuration."""
    if outcome.get("status") not in ("ok", "diverged"):
        return False
    try:
        return unfinished_reason(outcome, config.resolved()) is not None
    except (AttributeError, KeyError, TypeError, ValueError):  # a record not of this form
        return True


def refuse_other_scale(store, table_specs: dict) -> None:
    """Raise ValueError where ``store`` records finished runs (status ok or diverged, each its
    own run's record) that the tables of this call would not hold.

    A directory's tables hold the runs of one grid at one scale: a call at another scale
    (other ``--rounds``, a ``--set``) or of another grid (a sweep file's) would rewrite
    them without those runs' rows, and nothing would say so. A figure's call restricted
    to some datasets, fractions or fewer trials tabulates the whole grid
    (:func:`~rfrs_ref.experiments.figures.whole_grid`), so it keeps them and passes.
    """
    if not store.runs.is_dir():
        return
    outside = []
    for d in sorted(store.runs.iterdir()):
        if d.name in table_specs or not d.is_dir() or d.is_symlink():
            continue
        o = store.read_outcome(d.name)
        if (o is not None and o.get("status") in ("ok", "diverged")
                and record_of_another_run(o, d.name) is None):
            outside.append((d.name, o))
    if not outside:
        return
    key, o = outside[0]
    try:
        c = RunSpec.from_json(o["spec"]).config
        what = (f"{c.dataset}, α = {c.byzantine_fraction:g}, seed {c.seed}, "
                f"{c.rounds} rounds")
    except (KeyError, TypeError, ValueError, AttributeError):  # pragma: no cover - checked above
        what = "a run"
    raise ValueError(
        f"{store.path} records {len(outside)} finished run(s) that this call's tables would "
        f"not hold (the first {key}: {what}), so rewriting its tables would drop their rows: "
        "they are runs of another scale (--rounds, --set) or another grid. Call it "
        "at that directory's scale, or give this call a directory of its own (the default "
        "--out names one per scale); nothing was run")


def _linked_record(src: Store, keys: Sequence[str]) -> pathlib.Path | None:
    """The first entry of ``src`` that copying the runs ``keys`` from it would read and that
    is a symbolic link (``runs/``, a run's directory, its outcome.json or per-round
    summary), or None. ``src`` itself may be a link: that one the user named."""
    from rfrs_ref.experiments.results import RECORD_NAMES, ROUNDS_FILE

    if src.runs.is_symlink():
        return src.runs
    for k in keys:
        d = src.run_dir(k)
        for path in (d, *(d / n for n in RECORD_NAMES), d / ROUNDS_FILE):
            if path.is_symlink():
                return path
    return None


def _reused_outcome(key: str, sources: Sequence[Store], out: pathlib.Path) -> dict | None:
    """Run ``key``'s finished (or diverged) outcome from the first of ``sources`` that records
    one, ready to be recorded in ``out``; None when none does.

    An outcome counts only if the configuration it records hashes to ``key`` (a record
    of another run, or one edited by hand, is not taken for this one), and only when
    finished or diverged: a failure says nothing about the run's result, nor does a
    record of a finished or diverged run that holds no result (:func:`_not_a_result`),
    nor one whose per-round summary cannot be read.
    """
    for src in sources:
        o = src.read_outcome(key)
        if not isinstance(o, dict) or o.get("status") not in ("ok", "diverged"):
            continue
        try:
            spec = RunSpec.from_json(o["spec"])
            if spec.key != key:
                continue
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        if _not_a_result(o, spec.config):
            continue  # the tables would not count it as a result: run it here instead
        # what a worker hands back beside the result ("files" to write into the run's
        # directory) is not part of a record to copy: it would write them into ours
        copied = {n: v for n, v in o.items() if n not in ("key", "spec", "reused_from", "files")}
        try:
            rounds = src.read_rounds(key)
        except ValueError:
            continue  # a damaged per-round summary: run it here instead of copying it
        if rounds and "rounds" not in copied:
            copied["rounds"] = rounds
        if not recordable(spec, copied, key):
            continue  # the tables could not read it, or it is not strict JSON: run it here
        copied["reused_from"] = {"directory": os.path.relpath(src.path.resolve(), out.resolve()),
                                 "labels": dict(o["spec"].get("labels") or {})}
        return copied
    return None


@contextlib.contextmanager
def _numba_threads(threads: int | None):
    """Numba's thread count set to ``threads`` for the block (unchanged when None)."""
    if threads is None:
        yield
        return
    import numba

    import rfrs_ref.kernels  # noqa: F401  (picks the threading layer before Numba starts threads)

    old = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        yield
    finally:
        numba.set_num_threads(old)


def _run_on_dask(client, pending, tasks, by_key, record) -> None:
    from distributed import as_completed

    futures = {}
    # longest runs first, so that a long run does not start last and leave the other workers idle
    order = sorted(pending, key=lambda k: -estimate_run_cost(by_key[k]))
    for i, k in enumerate(order):
        fut = client.submit(execute_run, tasks[k], key=f"rfrs-run-{k}-{time.time_ns()}",
                            pure=False, priority=len(order) - i)
        futures[fut] = k
    try:
        for fut in as_completed(list(futures)):
            k = futures.pop(fut)
            try:
                outcome = fut.result()
            except Exception as exc:  # noqa: BLE001 - e.g. KilledWorker: record and go on
                outcome = {"key": k, "status": "failed", "error": f"{type(exc).__name__}: {exc}",
                           "traceback": "".join(traceback.format_exception(exc))}
            fut.release()
            record(by_key[k], outcome)
    finally:
        for fut in futures:
            fut.cancel()


def _close(client, cluster) -> None:
    try:
        client.close(timeout=10)
    except Exception:  # noqa: BLE001 - closing must not hide the sweep's own outcome
        pass
    if cluster is not None:
        try:
            cluster.close(timeout=10)
        except Exception:  # noqa: BLE001
            pass
