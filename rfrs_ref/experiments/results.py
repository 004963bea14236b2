"""Results of a sweep: the on-disk store, the tidy table and the summary table.

The store (a sweep's output directory)
--------------------------------------
::

    OUT/
      runs/<key>/outcome.json   one per attempted run: the run (spec), its status, error and
                                traceback, wall time, final metrics, evaluation history,
                                PCA capture (capture runs)
      runs/<key>/round_summary.json  the run's per-round summary (bulky: 1000 rounds are
                                about 200 kB, so it stays beside the outcome; runs that
                                recorded the resilience sums keep it inside outcome.json)
      runs/<key>/...            the trainer's run directory (config.json, metrics.csv,
                                rounds.jsonl, final_metrics.json; state.npz with keep_state)
      results.csv, runs.csv     the tidy table of the sweep's runs (below), stored as two
                                CSV files: ``runs.csv`` one row per run (its configuration,
                                status and run-level facts), ``results.csv`` one row per
                                run × K × metric (the run's key, a few columns to read it
                                by, K, metric, value); :func:`read_table` joins them
      results.parquet           the whole tidy table in one file, when pyarrow is installed
                                (the ``distributed`` extra)
      summary.csv, summary.md   mean ± std over trials (``summary.csv``: a row per
                                configuration, K and metric, the popularity ranking's
                                once per configuration of what it depends on, and the
                                columns that take several values: :func:`summary_csv_frame`)
      .lock                     held while a sweep writes here (rfrs_ref.files.DirectoryLock)

A run's record may also be ``outcome.json.gz``, the same bytes gzip-compressed
(:func:`rfrs_ref.experiments.committed.gzip_records`, ``rfrs-ref compact``): it is read
wherever ``outcome.json`` is (:func:`record_path`, :func:`record_bytes`), and a run
directory holding two records that differ has none (:func:`two_records`).

``outcome.json`` is the durable record: it is written atomically (a temporary
file, fsync, rename) as soon as a run finishes, before anything else, and the
tables are rebuilt from these files. An interruption at any moment therefore
loses at most the runs that were still going.

The tidy table
--------------
One row per run × K × metric, ``metric`` being ``precision``, ``recall``,
``ndcg``, ``hr``, ``mrr`` or the same with a ``popularity_`` prefix (the
popularity baseline on the same clients, docs/training.md "Evaluation") and
``value`` its final value (NaN for a metric a run did not record, e.g. NDCG
of a run made before it existed). A run with a validation split
(``valid_fraction > 0``) also has ``valid_<metric>`` and
``valid_popularity_<metric>`` rows, measured on its validation items, and a run
with target items (an item-promotion attack such as ``a-ra``) ``er`` and
``target_hr`` rows: the targets' exposure ratio ER@K and hit ratio among the
evaluated clients' top K (:mod:`rfrs_ref.metrics`; NaN where such a run did not
record one, as above). Every row carries
the run's configuration (``dataset``, ``model``, ``optimizer``, ``defense``,
``detect``, ``attack``, ``alpha`` (= byzantine_fraction), ``seed``, ``trial``,
``rounds`` ..., the ``*_params`` as JSON), its paper name (``method``), its
labels (one column per sweep axis), and run-level facts (``status``,
``error``, ``traceback``, ``wall_s``, ``beats_popularity``, the Byzantine
share of sampled and kept clients, the number of uploads excluded by
verification, the package version). A failed run has one row with ``status``
``failed``, its error and traceback, and no metric. A diverged run (its model
became NaN or ±inf, see docs/reproduction.md "Diverged runs") has one row with
``status`` ``diverged``, its message in ``error``, the round of divergence in
``diverged_round``, the reason in ``diverged_reason``, and no metric (a
diverged recommender has no ranking, so no value is written, not even 0).
The two ``diverged_*`` columns exist only in tables holding a diverged run, so
tables without one are byte for byte those of earlier versions.

Outcomes recorded as ``failed`` by versions that did not yet treat divergence
as an outcome are read as diverged when their error is exactly one of the two
divergence errors of those versions (:func:`divergence_of`); their round is
the one in the message (non-finite state) or unknown (non-finite scores).

On disk the CSV form is normalised, because the run-level columns (about 50,
the configuration among them) repeated on each of a run's 50 metric rows
made a table ten times the size of its content: ``runs.csv`` holds them once
per run, and ``results.csv`` holds, per metric row, the run's ``key`` and
:data:`RESULT_ID_COLUMNS` (dataset, α and trial, so that the file reads
alone; the method's name is in ``runs.csv``), ``k``, ``metric`` and ``value``. A failed or diverged run has its one row there too, with
empty ``k``, ``metric`` and ``value``. :func:`read_table` joins the two on
``key`` and returns the tidy table, column for column as
:func:`results_frame` makes it; a ``results.csv`` with every column (written
by earlier versions, or by hand) is read as it is.

The summary table
-----------------
Mean, sample standard deviation (ddof = 1; empty for one trial) and count
over the trials of each configuration (every configuration column but the
seed), for each K and metric, of the runs that finished; the count ``n`` is
the number of trials in the mean (a metric a run did not record is in
neither, so a mean never silently covers fewer trials than ``n`` says). When some run of
the table diverged, two more columns say, per configuration, how many of its
trials diverged: ``n_diverged`` and ``diverged`` ("4/5": of the trials with
an outcome, finished or diverged); mean, std and n are then over the finished
trials only, and a configuration whose every trial diverged has rows with an
empty mean and n = 0.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pathlib
import re
import stat
from typing import Iterable, Mapping, Sequence

import numpy as np

from rfrs_ref.experiments.spec import KEY_LENGTH, RunSpec
from rfrs_ref.experiments.worker import foreign_run_outcome
from rfrs_ref.files import DirectoryLock, DirectoryLocked, atomic_write, open_input, open_regular

OUTCOME = "outcome.json"
#: the same record gzip-compressed (:func:`gzip_records`, ``rfrs-ref compact``): read as
#: ``outcome.json`` is, wherever a record is read; a run directory holds one or the other
OUTCOME_GZ = "outcome.json.gz"
#: the names a run's record may have
RECORD_NAMES = (OUTCOME, OUTCOME_GZ)
#: the most a compressed record may hold once decompressed: a record is kilobytes, and a
#: file of a few kilobytes that decompresses to gigabytes would otherwise fill the memory
MAX_RECORD_BYTES = 64 * 1024 * 1024
#: the one-row-per-run half of the tidy table's CSV form (see the module docstring)
RUNS_TABLE = "runs"
#: columns of results.csv besides key, k, metric and value: the run as a person reads it
RESULT_ID_COLUMNS = ("dataset", "alpha", "trial")
#: the run-level columns a results.csv row may repeat, checked against runs.csv when it
#: does: RESULT_ID_COLUMNS, and ``method``, which earlier versions repeated too (the paper's
#: name of the method, the longest of them: the ranking's table passed 2 MiB with it)
_REPEATED_COLUMNS = ("dataset", "method", "alpha", "trial")
#: the per-round summary of a run, beside its outcome (see the module docstring)
ROUNDS_FILE = "round_summary.json"
TABLE = "results"
SUMMARY = "summary"
#: the files a sweep writes beside ``runs/`` and rewrites on every call
STORE_FILES = (f"{TABLE}.csv", f"{RUNS_TABLE}.csv", f"{SUMMARY}.csv", f"{SUMMARY}.md",
               "provenance.json")
#: the names of a results directory's own tables (``results.parquet`` too): no other
#: command's output may take one of them
TABLE_NAMES = frozenset({*STORE_FILES, f"{TABLE}.parquet"})
#: a ranking's metrics, and those of target items (a run with an item-promotion attack), as
#: its final evaluation names them (rfrs_ref.metrics, not imported here: it compiles kernels)
METRIC_NAMES = ("precision", "recall", "ndcg", "hr", "mrr")
TARGET_METRIC_NAMES = ("er", "target_hr")
METRICS = ("precision", "recall", "popularity_precision", "popularity_recall",
           "ndcg", "hr", "mrr", "popularity_ndcg", "popularity_hr", "popularity_mrr")
#: every name a results table's ``metric`` column may hold (a run with a validation split
#: adds ``valid_`` and ``valid_popularity_`` ones)
TABLE_METRICS = METRICS + TARGET_METRIC_NAMES + tuple(
    f"{prefix}{m}" for prefix in ("valid_", "valid_popularity_") for m in METRIC_NAMES)
#: how the tables name each metric
METRIC_LABELS = {"precision": "Precision", "recall": "Recall", "ndcg": "NDCG", "hr": "HR",
                 "mrr": "MRR", "er": "ER", "target_hr": "Target HR", **{f"popularity_{m}": f"Popularity {n}" for m, n in (
                     ("precision", "precision"), ("recall", "recall"), ("ndcg", "NDCG"),
                     ("hr", "HR"), ("mrr", "MRR"))}}

#: configuration columns of the tidy table (besides the *_params JSON columns)
CONFIG_COLUMNS = ("dataset", "model", "optimizer", "defense", "detect", "attack", "alpha",
                  "assumed_byzantine", "rounds", "client_fraction", "init_scale", "dtype",
                  "test_fraction", "valid_fraction", "eval_every", "verify", "resilience",
                  "backend", "trace")
PARAM_COLUMNS = ("dataset_params", "model_params", "optimizer_params", "defense_params",
                 "pre", "pre_params", "attack_params", "ks")
#: what a parameter column holds when the configuration's JSON leaves the field out
#: (the pre-aggregators are written only when there are some)
_PARAM_DEFAULTS = {"pre": [], "pre_params": {}}
#: columns of a diverged run (present only in tables holding one)
DIVERGED_COLUMNS = ("diverged_round", "diverged_reason")
RUN_COLUMNS = ("key", "kind", "method", "trial", "seed", "status", "error", "traceback",
               "wall_s", "started", "finished", "worker", "resumed_from", "final_round",
               "beats_popularity", "byzantine_share_sampled", "byzantine_share_kept",
               "excluded_byzantine", "excluded_honest", "evaluated_clients", "version",
               "run_dir")
ROW_COLUMNS = ("k", "metric", "value")


# -- paper names ---------------------------------------------------------------------------
#: the paper's names of the robust method per optimiser (A-RFRS with Adam; appendix F, G)
ROBUST_NAMES = {"adam": "A-RFRS", "momentum": "S-RFRS", "adagrad": "AG-RFRS", "rmsprop": "R-RFRS",
                "sgd": "SGD-RFRS"}
#: the paper's names of the plain federated recommender per optimiser
FRS_NAMES = {"adam": "A-FRS", "momentum": "S-FRS", "adagrad": "AG-FRS", "rmsprop": "R-FRS",
             "sgd": "SGD-FRS"}
#: the paper's baselines: (rule, detect) -> name
BASELINE_NAMES = {("krum", "parameter"): "Krum", ("rfa", "parameter"): "RFA",
                  ("trmean", "parameter"): "Trmean"}


def method_name(config) -> str:
    """The paper's name of a configuration's method.

    FMF for the matrix-factorisation baseline; without Byzantine clients the
    federated recommender (A-FRS for Adam); with them the defence: "No
    defense", "Krum", "RFA", "Trmean" (parameter space) or the robust method
    (krum on gradients: A-RFRS, S-RFRS, AG-RFRS). Other combinations are named
    by rule and detection space (e.g. "median (gradient)").
    """
    if config.model == "fmf":
        base = "FMF"
        if config.byzantine_fraction == 0 or config.attack == "none":
            return base
    attacked = config.byzantine_fraction > 0 and config.attack != "none"
    if not attacked:
        return FRS_NAMES.get(config.optimizer, f"{config.optimizer} FRS")
    if config.defense in ("none", "mean"):
        return "No defense"
    if config.defense == "krum" and config.detect == "gradient":
        return ROBUST_NAMES.get(config.optimizer, f"{config.optimizer} RFRS")
    if (config.defense, config.detect) in BASELINE_NAMES:
        return BASELINE_NAMES[(config.defense, config.detect)]
    return f"{config.defense} ({config.detect})"


# -- atomic files and the lock -------------------------------------------------------------
def atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never half."""
    atomic_write(path, lambda fh: fh.write(data))


def atomic_write_text(path: pathlib.Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


class StoreLocked(DirectoryLocked):
    """Another live sweep (or any process holding its lock) is writing to the same
    output directory."""


@contextlib.contextmanager
def store_lock(out: pathlib.Path):
    """Hold the lock of ``out`` (:class:`rfrs_ref.files.DirectoryLock`, ``out/.lock``)
    while writing. The lock goes with the process that holds it, so one left by a
    killed sweep is taken over; a live holder raises :class:`StoreLocked` naming it."""
    lock = DirectoryLock(out)
    try:
        lock.acquire()
    except DirectoryLocked as exc:
        raise StoreLocked(exc.directory, exc.holder, str(exc)) from None
    try:
        yield
    finally:
        lock.release()


def _is_store_table(name: str, head: str) -> bool:
    """Whether ``head``, the first line of the file ``name``, starts as a store's table of
    that name does (to tell a store's tables from a user's files: :func:`foreign_file`)."""
    if name in (f"{TABLE}.csv", f"{RUNS_TABLE}.csv"):
        return head.split(",")[0].strip() == "key"
    if name == f"{SUMMARY}.csv":
        return "mean" in [c.strip() for c in head.split(",")]
    if name == f"{SUMMARY}.md":
        return head.startswith(("| ", "_no finished runs_"))
    return head.lstrip().startswith("{")  # provenance.json


def foreign_file(out: str | os.PathLike) -> pathlib.Path | None:
    """A file in ``out`` that a sweep would rewrite (its tables, ``provenance.json``) but that
    is not a sweep's (a user's ``results.csv``, ``summary.md``...), or None.

    A directory whose ``runs/`` holds a sweep's run directories and nothing else
    (:func:`foreign_runs_entry`) is a store: its tables are the sweep's to rewrite.
    Otherwise (no ``runs/``, an empty one, or a ``runs/`` of the user's own) each such
    file must start as a store's does (``results.csv`` and ``runs.csv`` with the column
    ``key``, ``summary.csv`` with ``mean``, ``summary.md`` with a table or "_no finished
    runs_", ``provenance.json`` with a JSON object): a sweep never overwrites a file it
    did not write.
    """
    out = pathlib.Path(out)
    runs = out / "runs"
    if (runs.is_dir() and not runs.is_symlink() and foreign_runs_entry(out) is None
            and any(_RUN_KEY.fullmatch(e.name) for e in runs.iterdir())):
        return None
    for name in STORE_FILES:
        path = out / name
        if not (path.exists() or path.is_symlink()):
            continue
        # a FIFO or a device at the name is no sweep's table (a plain open of a FIFO
        # waits for a writer for ever)
        fh = open_regular(path)
        if fh is None:
            return path
        try:
            with fh:
                head = fh.read(4096).decode("utf-8", "replace").split("\n")[0]
        except OSError:
            return path
        if path.is_symlink() or not _is_store_table(name, head):
            return path
    return None


def foreign_runs_entry(out: str | os.PathLike) -> pathlib.Path | None:
    """The first entry of ``out/runs`` that is not a run directory of a sweep, or None.

    A sweep's ``runs/`` holds one directory per run, named by the run's key (16 hex
    digits), and nothing else: the sweep makes them, reads each as its run's record and
    clears one when its run starts again. A ``runs/`` holding anything else (a user's
    ``notes.txt``, a folder ``mystuff``, runs of another tool) is not a sweep's, and a
    sweep given its parent as ``--out`` would mix its runs into the user's folder (and
    take the user's tables beside it for its own: :func:`foreign_file`). Hidden entries
    (a name starting with a dot: ``.DS_Store``, an editor's) are neither: the sweep never
    reads or removes them. A link is refused as one (:func:`linked_entry`)."""
    runs = pathlib.Path(out) / "runs"
    if runs.is_symlink() or not runs.is_dir():
        return None
    for entry in sorted(runs.iterdir()):
        if entry.is_symlink() or entry.name.startswith("."):
            continue
        if not (_RUN_KEY.fullmatch(entry.name) and entry.is_dir()):
            return entry
    return None


def is_store(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a results directory a sweep wrote: its ``results.csv`` or
    ``runs.csv`` begins with the column ``key`` (:func:`foreign_file` tells a sweep's table
    from a user's the same way), or it holds ``runs/`` beside ``provenance.json``."""
    p = pathlib.Path(path)
    for name in (f"{TABLE}.csv", f"{RUNS_TABLE}.csv"):
        fh = open_regular(p / name)  # a FIFO there is no table, and is never waited on
        if fh is None:
            continue
        try:
            with fh:
                head = fh.read(4096).decode("utf-8", "replace").split("\n")[0]
        except OSError:
            continue
        if _is_store_table(name, head):
            return True
    return (p / "runs").is_dir() and (p / "provenance.json").is_file()


def run_directory_above(out: str | os.PathLike) -> pathlib.Path | None:
    """The run directory that ``out`` is or lies inside, or None: a directory holding a
    run's record (``outcome.json``, or ``config.json`` beside ``metrics.csv`` or
    ``checkpoint.npz``: ``rfrs-ref train``'s), or a store's run directory
    (:func:`store_of_run_directory`)."""
    p = pathlib.Path(out).resolve()
    for d in (p, *p.parents):
        if any((d / n).is_file() for n in RECORD_NAMES) or ((d / "config.json").is_file()
                                       and ((d / "metrics.csv").is_file()
                                            or (d / "checkpoint.npz").is_file())):
            return d
        if store_of_run_directory(d) is not None:
            return d
    return None


def store_of_run_directory(path: str | os.PathLike) -> pathlib.Path | None:
    """The results directory (store) whose run directory ``path`` is, or None.

    A store's run directory is named by a run key (16 hex digits) inside a ``runs/``
    beside the store's ``provenance.json``, ``results.csv`` or ``runs.csv`` (so
    ``runs/a/b`` of a working directory that holds a ``results.csv`` of its own is no
    run's). It is the store's whether or not the run has started: a sweep clears it
    when that run starts again, so nothing else may be written there. ``path`` is
    compared resolved (a link to a store's run directory is one)."""
    d = pathlib.Path(path).resolve()
    if d.parent.name == "runs" and _RUN_KEY.fullmatch(d.name):
        store = d.parent.parent
        if any((store / n).is_file() for n in
               ("provenance.json", f"{TABLE}.csv", f"{RUNS_TABLE}.csv")):
            return store
    return None


_RUN_KEY = re.compile(f"[0-9a-f]{{{KEY_LENGTH}}}")


def runs_folder_above(out: str | os.PathLike) -> pathlib.Path | None:
    """The ``runs/`` folder of a results directory that ``out`` is or lies inside, or None:
    a folder named ``runs`` in a directory :func:`is_store` takes for a sweep's. It is the
    sweep's: every entry in it is a run directory the sweep makes, reads as a run's and
    clears when that run starts again. ``out`` is compared resolved."""
    p = pathlib.Path(out).resolve()
    for d in (p, *p.parents):
        if d.name == "runs" and is_store(d.parent):
            return d
    return None


def figures_folder_above(out: str | os.PathLike) -> pathlib.Path | None:
    """The ``figures/`` folder of a results directory that ``out`` is or lies inside, or
    None: a folder named ``figures`` in a directory :func:`is_store` takes for a sweep's.
    The sweep draws its figures there (and plot redraws them, whoever drew a file of that
    name), so it is no place for a run's files. ``out`` is compared resolved."""
    p = pathlib.Path(out).resolve()
    for d in (p, *p.parents):
        if d.name == "figures" and is_store(d.parent):
            return d
    return None


def sweep_owned(out: str | os.PathLike) -> str | None:
    """Why no command but a run or a sweep may write into the directory ``out``, or None:
    the words that follow ``out`` in a refusal. ``out`` is or lies inside a run's directory
    (:func:`run_directory_above`: the run's, finished or not, which a sweep clears when the
    run starts again), or is or lies inside a results directory's ``runs/`` folder
    (:func:`runs_folder_above`: the sweep's, whose entries are run directories). The one
    decision of ``plot``, ``mechanism``, ``verdict`` and ``ranking`` for their output."""
    owner = run_directory_above(out)
    if owner is not None:
        return f"is or lies inside the run directory {owner}"
    runs = runs_folder_above(out)
    if runs is not None:
        return (f"is or lies inside {runs}, the runs/ folder of the results directory "
                f"{runs.parent}, which holds only the run directories of its sweep")
    return None


def linked_entry(out: str | os.PathLike) -> pathlib.Path | None:
    """The first entry of the results directory ``out`` that a sweep or a plot would write
    through and that is a symbolic link, or None: ``runs/`` and each run directory in it,
    ``figures/`` and each file in it, the tables and ``provenance.json``.

    A run directory is cleared when its run starts again and the tables are rewritten, so a
    link there would let the sweep delete and write files outside the directory it was
    given (``runs`` linked to a user's folder: the run of the same key emptied it). The
    directory ``out`` itself may be a link: that one the user named."""
    out = pathlib.Path(out)
    names = [*STORE_FILES, "runs", "figures"]
    for name in names:
        if (out / name).is_symlink():
            return out / name
    for sub in ("runs", "figures"):
        if (out / sub).is_dir():
            for entry in sorted((out / sub).iterdir()):
                if entry.is_symlink():
                    return entry
    return None


def refuse_links(out: str | os.PathLike) -> None:
    """Raise ValueError naming the first link :func:`linked_entry` finds in ``out``."""
    link = linked_entry(out)
    if link is not None:
        raise ValueError(f"{link} is a link (to {os.readlink(link)}), and rfrs-ref writes only "
                         f"inside the results directory it is given, never through a link; "
                         "remove the link (or give the directory it points to as the output); "
                         "nothing was run")


def linked_input(path: str | os.PathLike) -> pathlib.Path | None:
    """The first entry that a command judging the results at ``path`` (``verdict``,
    ``ranking``) would read and that is a symbolic link, or None.

    For a results directory: its tables (``results.parquet``, ``results.csv``,
    ``runs.csv``), ``runs/``, each run directory in it and each run's ``outcome.json``;
    for a table file: the runs file read beside it. The path the user names (the
    directory or the file) may itself be a link, as a sweep's output may: a link inside
    it would let a table judged as this directory's be any file of the machine."""
    path = pathlib.Path(path)
    if not path.is_dir():
        beside = path.with_name(f"{runs_stem(path.stem)}.csv") if path.suffix == ".csv" else None
        return beside if beside is not None and beside.is_symlink() else None
    for name in (f"{TABLE}.parquet", f"{TABLE}.csv", f"{RUNS_TABLE}.csv", "runs"):
        if (path / name).is_symlink():
            return path / name
    runs = path / "runs"
    if runs.is_dir():
        for entry in sorted(runs.iterdir()):
            if entry.is_symlink():
                return entry
            for name in RECORD_NAMES:
                if (entry / name).is_symlink():
                    return entry / name
    return None


def refuse_linked_input(path: str | os.PathLike, done: str = "judged") -> None:
    """Raise ValueError naming the first link :func:`linked_input` finds at ``path``
    (``verdict``, ``ranking``: "nothing was judged"; ``plot``: ``done="drawn"``)."""
    link = linked_input(path)
    if link is not None:
        raise ValueError(f"{link} is a link (to {os.readlink(link)}), and rfrs-ref reads a "
                         "results directory only from the files inside it, never through a "
                         "link; replace the link by the file (or give the directory it points "
                         f"to); nothing was {done}")


def read_input(path: str | os.PathLike, what: str = "file", *, links: bool = True,
               max_bytes: int | None = None) -> bytes:
    """The bytes of the file at ``path`` (:func:`rfrs_ref.files.open_input`, read whole).

    ``max_bytes``: the most a file of this kind can hold; a larger one is a ValueError
    naming it, from the size of the file opened, before a byte is read (a sparse file of
    terabytes takes a few bytes of disk, and reading it whole would take all memory)."""
    with open_input(path, what, links=links) as fh:
        if max_bytes is not None:
            size = os.fstat(fh.fileno()).st_size
            if size > max_bytes:
                raise ValueError(f"{path}: {size} bytes, more than the {max_bytes} a {what} "
                                 "can hold; not such a file, nothing is read from it")
        return fh.read()


def record_path(run_dir: str | os.PathLike) -> pathlib.Path:
    """The path of the record of the run in ``run_dir``: ``outcome.json.gz`` when that entry
    is there (a file, a link, anything) and ``outcome.json`` is not, else ``outcome.json``
    (which may not exist). A directory holding both is :func:`two_records`'."""
    run_dir = pathlib.Path(run_dir)
    gz = run_dir / OUTCOME_GZ
    plain = run_dir / OUTCOME
    if _entry_exists(gz) and not _entry_exists(plain):
        return gz
    return plain


def two_records(run_dir: str | os.PathLike) -> str | None:
    """Why ``run_dir``'s record is ambiguous, or None: ``outcome.json`` beside an
    ``outcome.json.gz`` that does not hold the same bytes (or is not a regular file, or
    cannot be read) are two records of one run that may disagree, and no tool picks one of
    them silently (a sweep takes the run as unrecorded and runs it again). The same bytes
    twice are one record (a compression stopped before it removed the plain file)."""
    run_dir = pathlib.Path(run_dir)
    plain, gz = run_dir / OUTCOME, run_dir / OUTCOME_GZ
    if not (_entry_exists(plain) and _entry_exists(gz)):
        return None
    try:
        if (stat.S_ISREG(plain.lstat().st_mode) and stat.S_ISREG(gz.lstat().st_mode)
                and record_bytes(gz) == record_bytes(plain)):
            return None
    except (OSError, ValueError):
        pass
    return (f"two records that differ, {OUTCOME} and {OUTCOME_GZ}: keep the one that is the "
            "run's and remove the other")


def _entry_exists(path: pathlib.Path) -> bool:
    return path.exists() or path.is_symlink()


def record_bytes(path: str | os.PathLike) -> bytes:
    """The JSON text of the record at ``path``: the file's bytes, decompressed when its name
    ends in ``.gz`` (one gzip member, at most :data:`MAX_RECORD_BYTES` once decompressed).

    Every file of a run's directory that a tool reads (its record, its per-round summary)
    is read here, through :func:`read_input` without following a link: a FIFO or a device
    at its name is refused without waiting, and so is a symbolic link (a record elsewhere,
    outside the results directory or another run's, is not this run's).

    Raises:
        OSError: the file cannot be read (FileNotFoundError: there is none).
        ValueError: naming the file: a link, not a regular file, not gzip data, truncated,
            followed by other data, or larger than the limit once decompressed.
    """
    import zlib

    path = pathlib.Path(path)
    what = ("run's record" if path.name in RECORD_NAMES else
            "run's per-round summary" if path.name == ROUNDS_FILE else "run's file")
    data = read_input(path, what, links=False)
    if not path.name.endswith(".gz"):
        return data
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # the gzip container only
    try:
        text = d.decompress(data, MAX_RECORD_BYTES + 1)
    except zlib.error as exc:
        raise ValueError(f"{path}: not gzip-compressed data ({exc})") from None
    if len(text) > MAX_RECORD_BYTES:
        raise ValueError(f"{path}: more than {MAX_RECORD_BYTES // 2**20} MiB once decompressed; "
                         "a run's record is a few kilobytes")
    if not d.eof:
        raise ValueError(f"{path}: the gzip data is truncated")
    if d.unused_data:
        raise ValueError(f"{path}: other data follows the gzip-compressed record")
    return text


def write_record(path: pathlib.Path, text: str) -> None:
    """Write a run's record atomically at ``path``, gzip-compressed when its name ends in
    ``.gz``."""
    data = text.encode("utf-8")
    atomic_write_bytes(path, gzip_bytes(data) if path.name.endswith(".gz") else data)


def the_record(run_dir: str | os.PathLike) -> pathlib.Path:
    """:func:`record_path` of ``run_dir``, for a reader that needs the run's one record.

    Raises:
        ValueError: naming ``run_dir``, when it holds two records that differ
            (:func:`two_records`).
    """
    both = two_records(run_dir)
    if both is not None:
        raise ValueError(f"{run_dir}: {both}")
    return record_path(run_dir)


def gzip_bytes(text: bytes) -> bytes:
    """``text`` gzip-compressed, the same bytes on every call (no time stamp, no file name)."""
    import gzip

    return gzip.compress(text, compresslevel=9, mtime=0)


# -- the store --------------------------------------------------------------------------------
class Store:
    """A sweep's output directory (see the module docstring)."""

    def __init__(self, out: str | os.PathLike) -> None:
        self.path = pathlib.Path(out)
        self.runs = self.path / "runs"

    def run_dir(self, key: str) -> pathlib.Path:
        return self.runs / key

    def outcome_path(self, key: str) -> pathlib.Path:
        """Run ``key``'s record: ``outcome.json``, or ``outcome.json.gz`` when that is the
        one there (:func:`record_path`)."""
        return record_path(self.run_dir(key))

    def read_outcome(self, key: str) -> dict | None:
        """The recorded outcome of run ``key``, or None (absent, unreadable, not JSON, JSON
        with one key twice in an object, or not a regular file: a FIFO or a device there
        would block the read or never end, and a link would make a record elsewhere this
        run's)."""
        from rfrs_ref.untrusted import parse_json

        path = self.outcome_path(key)
        if two_records(self.run_dir(key)) is not None:
            return None
        try:
            if not stat.S_ISREG(path.lstat().st_mode):
                return None
            value = parse_json(record_bytes(path), str(path))
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def outcome_problem(self, key: str) -> str | None:
        """Why run ``key``'s outcome.json cannot be read, or None when there is none or it
        reads (what :meth:`read_outcome` takes as no record: a damaged or edited file is
        not a run's result, and a sweep says so before it runs the run again)."""
        from rfrs_ref.untrusted import parse_json

        path = self.outcome_path(key)
        both = two_records(self.run_dir(key))
        if both is not None:
            return both
        try:
            if not (path.exists() or path.is_symlink()):
                return None
            if path.is_symlink():
                # verdict and ranking refuse such a link; the sweep runs the run again
                return f"a link (to {os.readlink(path)}), not the run's own record"
            if not stat.S_ISREG(path.stat().st_mode):
                return "not a regular file"
            value = parse_json(record_bytes(path), str(path))
        except (OSError, ValueError) as exc:
            return str(exc) or type(exc).__name__
        return None if isinstance(value, dict) else "not a JSON object"

    def outcomes(self) -> dict[str, dict]:
        """Every readable outcome in the store, by key."""
        out = {}
        if self.runs.is_dir():
            for d in sorted(self.runs.iterdir()):
                o = self.read_outcome(d.name)
                if o is not None:
                    out[d.name] = o
        return out

    def read_rounds(self, key: str) -> list[dict]:
        """The per-round summary of run ``key`` ([] when not recorded or not kept)."""
        return read_rounds(self.run_dir(key))

    def write_outcome(self, spec: RunSpec, outcome: dict) -> dict:
        """Record a run's outcome (atomically) with its spec; write returned files.

        The per-round summary goes to ``ROUNDS_FILE`` beside the outcome, unless it
        carries the resilience sums (plotted from it), so that outcome.json stays a
        few kilobytes whatever the number of rounds.

        A directory holding a run that is not this one (a ``config.json`` of another
        configuration, :func:`rfrs_ref.experiments.worker.refuse_foreign_run`) is never
        overwritten: an outcome that would write files there (returned files, a per-round
        summary) is recorded as the run's failure, with the reason, instead.

        The run's directory has one owner while its record is written: the record is
        written holding the directory's lock (:class:`rfrs_ref.files.DirectoryLock`), as
        the worker trained holding it. Another process that took the directory in
        between (a ``train --resume`` of it) is left alone: nothing is written, and the
        record returned says the run failed, naming the holder; a later sweep sees the
        directory as that process leaves it.
        """
        key = spec.key
        d = self.run_dir(key)
        d.mkdir(parents=True, exist_ok=True)
        try:
            with DirectoryLock(d):
                return self._write_outcome_locked(spec, d, dict(outcome))
        except DirectoryLocked as exc:
            kept = {n: outcome[n] for n in ("started", "finished", "wall_s", "worker") if n in outcome}
            return {**kept, "status": "failed", "key": key, "spec": spec.to_json(),
                    "error": f"{exc}; this attempt's outcome was not recorded there (run the "
                             "sweep again once that process is done)"}

    def _write_outcome_locked(self, spec: RunSpec, d: pathlib.Path, outcome: dict) -> dict:
        key = spec.key
        if outcome.get("files") or outcome.get("rounds") or outcome.get("status") != "failed":
            refused = foreign_run_outcome(d, spec)
            if refused is not None:
                outcome = {**refused, **{n: outcome[n] for n in ("started", "finished", "wall_s",
                                                                 "worker") if n in outcome}}
        for name, text in (outcome.pop("files", None) or {}).items():
            atomic_write_text(d / pathlib.Path(name).name, text)
        rounds = outcome.pop("rounds", None)
        if rounds and any("resilience" in r for r in rounds):
            outcome["rounds"] = rounds
        elif rounds:
            atomic_write_text(d / ROUNDS_FILE, json.dumps(rounds, allow_nan=False,
                                                          default=_json_default) + "\n")
        record = {**outcome, "key": key, "spec": spec.to_json()}
        atomic_write_text(d / OUTCOME, _outcome_text(record))
        # a compressed record of an earlier attempt would make two records of one run
        (d / OUTCOME_GZ).unlink(missing_ok=True)
        return record

    def compact(self, key: str, outcome: dict) -> dict:
        """``outcome`` of run ``key`` in its compact form: an outcome.json written with its
        per-round summary inside (by an older version) is rewritten with the summary moved
        to ``ROUNDS_FILE``, as :meth:`write_outcome` does now. Resilience runs keep theirs."""
        rounds = outcome.get("rounds")
        if not rounds or any("resilience" in r for r in rounds):
            return outcome
        d = self.run_dir(key)
        if not (d / ROUNDS_FILE).exists():
            atomic_write_text(d / ROUNDS_FILE, json.dumps(rounds, allow_nan=False,
                                                          default=_json_default) + "\n")
        outcome = {k: v for k, v in outcome.items() if k != "rounds"}
        write_record(self.outcome_path(key), _outcome_text(outcome))
        return outcome

    def finished(self, keys: Iterable[str]) -> dict[str, dict]:
        """The outcomes with status ``ok`` among ``keys`` (a record of another run in a run's
        directory, :func:`record_of_another_run`, is not that run's)."""
        out = {}
        for k in keys:
            o = self.read_outcome(k)
            if o is not None and o.get("status") == "ok" and record_of_another_run(o, k) is None:
                out[k] = o
        return out


def record_of_another_run(outcome: dict, key: str) -> str | None:
    """Why ``outcome``, read from the store's ``runs/<key>/outcome.json``, is not run ``key``'s
    record, or None when it is. The store writes every record with its run's key and
    configuration (``Store.write_outcome``); a record stating another key, or a configuration
    that hashes to another key (another seed's record copied into this run's directory, or
    either field removed), would be skipped as this run's result and tabulated under its
    labels. Such a record is no record of this run: a failure, run again unless failures
    are kept, as a damaged one is (the sweep), and never a result of the directory (the
    capture runs ``verdict`` reads from their records, :meth:`Store.finished`)."""
    stated = outcome.get("key")
    if stated != key:
        return (f"it states the key {stated!r}, not {key!r}: it is the record of another run "
                "(or edited), not this run's result")
    try:
        spec_key = RunSpec.from_json(outcome["spec"]).key
    except (KeyError, TypeError, ValueError, AttributeError):
        return "it holds no readable configuration of its run ('spec'), so it cannot be this run's"
    if spec_key != key:
        return (f"its configuration ('spec') is that of run {spec_key}, not {key}: it is the "
                "record of another run (or edited), not this run's result")
    return None


def run_path(base: str | os.PathLike, run_dir) -> pathlib.Path:
    """The directory of a run named by a table's ``run_dir`` value (``runs/<key>``),
    under the results directory ``base``.

    A table is input (a user may hand any file to ``rfrs-ref plot``): a value that is
    not a relative path leading to a directory inside ``base`` (an absolute path, a
    ``..`` that climbs out, a link pointing elsewhere, an empty cell) is refused
    rather than followed.

    Raises:
        ValueError: naming ``base`` and the value.
    """
    base = pathlib.Path(base)
    if run_dir is None or run_dir == "" or (isinstance(run_dir, float) and math.isnan(run_dir)):
        raise ValueError(f"{base}: a run's run_dir is empty; expected runs/<key>")
    if not isinstance(run_dir, str) or pathlib.PurePath(run_dir).is_absolute():
        raise ValueError(f"{base}: run_dir {run_dir!r} is not a path relative to the results "
                         "directory (runs/<key>)")
    path = base / run_dir
    root = base.resolve()
    if not path.resolve().is_relative_to(root):
        raise ValueError(f"{base}: run_dir {run_dir!r} leads outside the results directory")
    return path


def read_rounds(run_dir: str | os.PathLike) -> list[dict]:
    """A run directory's per-round summary: inside outcome.json (resilience runs, and
    stores written before the summary moved out of it), else ``ROUNDS_FILE``; [] if neither
    is there (a run that kept no per-round summary).

    A file that is there but cannot be read (not JSON, not UTF-8, or not of this form:
    an outcome that is not an object, a summary that is not a list of round objects) is
    an error naming it, not a run without rounds: its plots would silently draw fewer runs.

    Raises:
        ValueError: naming the file and what is wrong with it.
    """
    run_dir = pathlib.Path(run_dir)
    rounds = None
    path = the_record(run_dir)
    if _entry_exists(path):  # a link that leads nowhere is named (_json_file), not skipped
        record = _json_file(path)
        if not isinstance(record, dict):
            raise ValueError(f"{path}: not a run record (a JSON object)")
        rounds = record.get("rounds")
    if not rounds:
        path = run_dir / ROUNDS_FILE
        if not _entry_exists(path):
            return []
        rounds = _json_file(path)
    if not isinstance(rounds, list) or not all(isinstance(r, dict) for r in rounds):
        raise ValueError(f"{path}: the per-round summary is not a list of rounds")
    return rounds


def _json_file(path: pathlib.Path):
    """The JSON value in ``path``; a file that cannot be read as JSON (or has one key twice
    in an object) is a ValueError naming it."""
    from rfrs_ref.untrusted import parse_json

    try:
        return parse_json(record_bytes(path), str(path))
    except (OSError, ValueError) as exc:  # UntrustedFileError included
        reason = str(exc).split("\n")[0].removeprefix(f"{path}: ")
        raise ValueError(f"{path}: not readable as JSON ({reason})") from None


def _outcome_text(record: dict) -> str:
    return json.dumps(record, indent=1, allow_nan=False, default=_json_default) + "\n"


def recordable(spec: RunSpec, outcome: dict, key: str) -> bool:
    """Whether ``outcome`` is a record the tables can read (:func:`tidy_rows`) and a store can
    write (strict JSON): a record handed over from elsewhere that is not is not taken."""
    try:
        tidy_rows(spec, outcome, key=key)
        _outcome_text(outcome)
    except (AttributeError, KeyError, TypeError, ValueError):
        return False
    return True


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


# -- divergence ------------------------------------------------------------------------------------
#: the errors with which earlier versions recorded a diverged run as failed: non-finite scores
#: at an evaluation (round unknown), and a non-finite aggregated state at round ≥ 1
_LEGACY_SCORES = re.compile(r"ValueError: the scores of user \d+ hold NaN or infinity "
                            r"\(the model diverged\): ranking metrics are only defined for "
                            r"finite scores$")
_LEGACY_STATE = re.compile(r"NonFiniteState: round (\d+): the aggregated server state "
                           r"'([^']+)' holds (\d+) non-finite value\(s\) \(NaN or ±inf\) of "
                           r"(\d+); training stopped before evaluating it")


def divergence_of(outcome: Mapping, rounds: int | None = None) -> dict | None:
    """How the run of ``outcome`` diverged (``round``, ``reason``, ``what``), or None.

    A ``diverged`` outcome carries it (``divergence``). A ``failed`` outcome
    recorded by an earlier version is read as diverged when its error is one of
    that version's two divergence errors, matched whole: the ``ValueError`` of
    non-finite scores (round unknown: None) or the ``NonFiniteState`` of a
    round of the run, 1 to ``rounds`` (its round and array; any round ≥ 1 when
    ``rounds`` is None); ``legacy`` is then True. Any other failure, the
    non-finite *initial* state and an error naming round 0 or a round past the
    run's last included, stays a failure.
    """
    status = outcome.get("status")
    if status == "diverged":
        d = dict(outcome.get("divergence") or {})
        return {"round": d.get("round"), "reason": d.get("reason"), "what": d.get("what")}
    if status != "failed":
        return None
    error = outcome.get("error")
    if not isinstance(error, str):
        return None
    from rfrs_ref.federated.trainer import DIVERGED_SCORES, DIVERGED_STATE

    if _LEGACY_SCORES.match(error):
        user = error.split("user ", 1)[1].split(" ", 1)[0]
        return {"round": None, "reason": DIVERGED_SCORES, "what": f"the scores of user {user}",
                "legacy": True}
    m = _LEGACY_STATE.match(error)
    if m and 1 <= int(m.group(1)) <= (rounds if _is_int(rounds) else int(m.group(1))):
        return {"round": int(m.group(1)), "reason": DIVERGED_STATE,
                "what": f"'{m.group(2)}': {m.group(3)} of {m.group(4)} values", "legacy": True}
    return None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def run_status(outcome: Mapping, rounds: int | None = None) -> str | None:
    """The status the tables give a recorded outcome: ``diverged`` for a legacy failure that
    was a divergence of a run of ``rounds`` rounds (:func:`divergence_of`), else the
    recorded one."""
    if outcome.get("status") == "failed" and divergence_of(outcome, rounds) is not None:
        return "diverged"
    return outcome.get("status")


# -- tidy rows ---------------------------------------------------------------------------------
def _config_columns(config) -> dict:
    c = config.to_json()
    row = {name: c.get(name) for name in CONFIG_COLUMNS if name != "alpha"}
    row["alpha"] = c["byzantine_fraction"]
    row["valid_fraction"] = c.get("valid_fraction", 0.0)  # absent from the JSON when 0
    for name in PARAM_COLUMNS:
        row[name] = json.dumps(c[name] if name in c else _PARAM_DEFAULTS[name], sort_keys=True)
    return row


def _count(v) -> int | None:
    """A record's count or round (untrusted JSON) for an integer column: an int, else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _share(v, upper: float = 1.0) -> float | None:
    """A record's fraction (or, with ``upper`` inf, a time) for a float column: a finite
    number in [0, upper], else None (NaN, ±inf, text: no such value is tabulated)."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return v if ok and 0.0 <= v <= upper else None


def tidy_rows(spec: RunSpec, outcome: Mapping, key: str | None = None) -> list[dict]:
    """The tidy rows of one run (one per K × metric; a single row for a failed or
    diverged run).

    The run-level columns read from the record (untrusted JSON) hold only values of their
    kind: a count or round that is not an integer, a share that is not a finite number in
    [0, 1], a wall time that is not a finite number ≥ 0, a ``beats_popularity`` that is not
    a boolean is left empty, neither tabulated nor a reason for the tables to fail."""
    try:
        config = spec.config.resolved()
    except Exception:  # noqa: BLE001 - an invalid configuration is reported as given
        config = spec.config
    key = key or outcome.get("key") or spec.key
    base = {
        "key": key, "kind": spec.kind, "method": method_name(config), "trial": spec.trial,
        "seed": config.seed, **_config_columns(config),
        "status": run_status(outcome, getattr(config, "rounds", None)),
        "error": outcome.get("error"),
        "traceback": outcome.get("traceback"),
        "wall_s": _share(outcome.get("wall_s"), math.inf),
        "started": outcome.get("started"), "finished": outcome.get("finished"),
        "worker": _worker(outcome.get("worker")),
        "resumed_from": _count(outcome.get("resumed_from")),
        "version": (outcome.get("versions") or {}).get("rfrs_ref"),
        "run_dir": f"runs/{key}",
    }
    for name, label in spec.labels.items():
        base[f"label_{name}"] = label
    divergence = divergence_of(outcome, getattr(config, "rounds", None))
    if divergence is not None:
        base["diverged_round"] = divergence["round"]
        base["diverged_reason"] = divergence["reason"]
    final = outcome.get("final") or {}
    sel = final.get("selection") or {}
    base.update({
        "final_round": _count(final.get("round")),
        "beats_popularity": b if isinstance(b := final.get("beats_popularity"), bool) else None,
        "byzantine_share_sampled": _share(sel.get("byzantine_share_sampled")),
        "byzantine_share_kept": _share(sel.get("byzantine_share_kept")),
        "excluded_byzantine": _count(sel.get("excluded_byzantine")),
        "excluded_honest": _count(sel.get("excluded_honest")),
        "evaluated_clients": _count((final.get("model") or {}).get("n_users")),
    })
    if outcome.get("status") in ("ok", "diverged"):
        reason = unfinished_reason(outcome, config)
        if reason is not None:
            # an edited or damaged outcome.json: no row may read like a normal number, and no
            # mean, verdict or ranking may count it (nor silently leave it out: it is failed)
            base["status"] = "failed"
            base["error"] = f"outcome.json {reason}; " + (
                "the run's metrics are left out of the tables" if outcome.get("status") == "ok"
                else "the run is not counted as diverged")
            base.pop("diverged_round", None)
            base.pop("diverged_reason", None)
            base["beats_popularity"] = None  # no result beats anything
            return [{**base, "k": None, "metric": None, "value": None}]
    if outcome.get("status") != "ok":
        return [{**base, "k": None, "metric": None, "value": None}]
    rows = []
    model, pop = final["model"], final["popularity"]
    for k in config.ks:
        for metric in METRICS:
            source, name = (pop, metric[len("popularity_"):]) if metric.startswith("popularity_") \
                else (model, metric)
            v = source.get(f"{name}@{k}")
            rows.append({**base, "k": int(k), "metric": metric,
                         "value": float("nan") if v is None else float(v)})
    targeted = _has_targets(config)
    for k in config.ks:  # a run with target items (an item-promotion attack): their exposure
        for name in TARGET_METRIC_NAMES:
            v = model.get(f"{name}@{k}")
            # the attack's runs record them: one that does not has them empty (NaN), as an
            # unrecorded metric above, never a seed left out of the exposure without a word
            if v is not None or targeted:
                rows.append({**base, "k": int(k), "metric": name,
                             "value": float("nan") if v is None else float(v)})
    valid = final.get("valid")
    if valid:  # runs with a validation split: the metrics that choose hyperparameters
        for k in config.ks:
            for name in ("precision", "recall", "ndcg", "hr", "mrr"):
                for prefix, source in (("valid_", valid["model"]),
                                       ("valid_popularity_", valid["popularity"])):
                    v = source.get(f"{name}@{k}")
                    rows.append({**base, "k": int(k), "metric": prefix + name,
                                 "value": float("nan") if v is None else float(v)})
    return rows


def _has_targets(config) -> bool:
    """Whether the run's attack has target items (an item-promotion attack, whose runs record
    ER@K and the targets' hit ratio); False for an attack this version does not know."""
    from rfrs_ref.attack import ATTACKS

    try:
        return hasattr(ATTACKS.get(config.attack), "resolve_targets")
    except (KeyError, ValueError, AttributeError, TypeError):
        return False


#: a metric (precision, recall, NDCG, HR, MRR@K) lies in [0, 1]; NDCG's ratio may round a
#: hair above 1
METRIC_MAX = 1.0 + 1e-9


def non_finite_metric(final: Mapping, ks) -> tuple[str, object] | None:
    """(name, value) of the first metric of a finished run's ``final`` that is recorded but is
    not a finite number in [0, 1] (NaN, ±inf, text, 7.5, −3), or None. A metric not recorded
    at all (a run made before it existed) is not one: the tables show it empty."""
    parts = [("", final.get("model") or {}), ("popularity ", final.get("popularity") or {})]
    valid = final.get("valid") or {}
    parts += [("valid ", valid.get("model") or {}), ("valid popularity ", valid.get("popularity") or {})]
    for prefix, source in parts:
        for k in ks:
            for name in (*METRIC_NAMES, *TARGET_METRIC_NAMES):
                v = source.get(f"{name}@{k}")
                if v is None:
                    continue
                if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                        or not 0.0 <= v <= METRIC_MAX):
                    return f"{prefix}{name}@{k}", v
    return None


def unfinished_reason(outcome: Mapping, config) -> str | None:
    """Why ``outcome``, a record with status ``ok`` or ``diverged``, is not a finished (or
    diverged) run's result, or None when it is one (and for a record of any other status).

    A finished run's record holds its final evaluation (``final``), made after the last of
    the ``config.rounds`` rounds (``final.round`` is that number), without a status of its
    own (only a diverged run's ``final_metrics.json`` has one), and its metrics are finite
    numbers in [0, 1] (:func:`non_finite_metric`): the trainer writes nothing else. A record
    that says ``ok`` but is not of this form (edited, damaged, or copied from a run that
    stopped early) is no result: the tables show it as failed and a sweep runs it again.

    A diverged run's record says where and why (``divergence``, :func:`divergence_reason`):
    a record of status ``diverged`` that does not is no result either, and counts as no
    divergence (the verdict's worse series is the one that diverged on more seeds).

    Args:
        outcome: the record as read (untrusted: any JSON).
        config: the run's resolved configuration (``rounds`` and ``ks`` are read).
    Returns:
        The reason, worded to follow "outcome.json" (e.g. "records precision@1 = nan, not a
        finite number in [0, 1]"), or None.
    """
    if outcome.get("status") == "diverged":
        return divergence_reason(outcome.get("divergence"), getattr(config, "rounds", None))
    if outcome.get("status") != "ok":
        return None
    final = outcome.get("final")
    if not isinstance(final, dict) or not final:
        return "records no final evaluation"
    if final.get("status") is not None:
        return f"records a final evaluation of status {final.get('status')!r}, not a finished run's"
    rounds, last = getattr(config, "rounds", None), final.get("round")
    if isinstance(rounds, int) and (isinstance(last, bool) or not isinstance(last, int)
                                    or last != rounds):
        return (f"records a final evaluation after round {last!r}, not after the run's last "
                f"round ({rounds}): the run did not finish")
    try:
        bad = non_finite_metric(final, config.ks)
    except (AttributeError, TypeError):
        return "records a final evaluation that is not of a finished run's form"
    if bad is not None:
        # a finished run's metrics are finite numbers by construction (a non-finite score
        # makes the run diverge)
        return f"records {bad[0]} = {bad[1]!r}, not a finite number in [0, 1]"
    if final.get("beats_popularity") is not None:
        from rfrs_ref.metrics import beats_popularity_problem

        # a record that says otherwise than its precisions (or NaN, "yes") says what no run said
        why = beats_popularity_problem(final, config.ks)
        if why is not None:
            return f"records {why}"
    return None


def divergence_reason(divergence, rounds) -> str | None:
    """Why ``divergence``, the ``divergence`` of a record of status ``diverged``, is not a
    run's divergence, or None when it is one: an object whose ``round`` is an integer in
    1..``rounds`` (the trainer stops a run at the round t ≥ 1 whose state or scores are not
    finite; round 0 is a configuration error, never a divergence) and whose ``reason`` is
    one of the trainer's (``DIVERGED_REASONS``: the state, the scores, an honest upload).
    Worded, like :func:`unfinished_reason`'s reasons, to follow "outcome.json"."""
    from rfrs_ref.federated.trainer import DIVERGED_REASONS

    if not isinstance(divergence, dict):
        return "records status 'diverged' without its divergence (the round and the reason)"
    t, reason = divergence.get("round"), divergence.get("reason")
    if isinstance(t, bool) or not isinstance(t, int) or not (
            1 <= t <= (rounds if isinstance(rounds, int) else t)):
        return (f"records a divergence at round {t!r}, not a round of the run (1 to "
                f"{rounds!r})")
    if reason not in DIVERGED_REASONS:
        return (f"records a divergence for the reason {reason!r}, not one of the trainer's "
                f"({', '.join(repr(r) for r in DIVERGED_REASONS)})")
    return None


def _worker(w) -> str | None:
    if not w:
        return None
    return f"{w.get('host')}:{w.get('pid')}"


def results_frame(pairs: Iterable[tuple[RunSpec, Mapping]]):
    """The tidy table (a pandas DataFrame) of (spec, outcome) pairs."""
    rows = []
    for spec, outcome in pairs:
        rows.extend(tidy_rows(spec, outcome))
    return frame_from_rows(rows)


def frame_from_rows(rows: list[dict]):
    """The tidy table from rows made by :func:`tidy_rows`."""
    import pandas as pd

    df = pd.DataFrame(rows)
    if df.empty:
        df = pd.DataFrame(columns=[*RUN_COLUMNS, *CONFIG_COLUMNS, *PARAM_COLUMNS, *ROW_COLUMNS])
    df = _ordered(df)
    for col in ("k", "final_round", "resumed_from", "excluded_byzantine", "excluded_honest",
                "evaluated_clients", "diverged_round"):
        if col in df.columns:
            df[col] = df[col].astype("Int64")
    if "assumed_byzantine" in df.columns and df["assumed_byzantine"].dropna().map(type).nunique() > 1:
        df["assumed_byzantine"] = df["assumed_byzantine"].astype(str)  # fractions and "exact"
    for col in ("beats_popularity", "verify", "resilience", "trace"):
        if col in df.columns:
            df[col] = df[col].astype("boolean")
    return df


#: the tidy table's leading columns, in this order (the others follow as the rows made them)
_FIRST_COLUMNS = ("key", "status", "method", "dataset", "model", "optimizer", "defense", "detect",
                  "attack", "alpha", "trial", "seed", "rounds", "k", "metric", "value")


def _ordered(df):
    first = [c for c in _FIRST_COLUMNS if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]]


def parquet_available() -> bool:
    """Whether pandas can write Parquet here (pyarrow, from the ``distributed`` extra)."""
    import importlib.util

    return importlib.util.find_spec("pyarrow") is not None


def runs_stem(stem: str = TABLE) -> str:
    """The stem of the one-row-per-run file beside ``stem.csv`` (``runs`` for ``results``)."""
    return RUNS_TABLE if stem == TABLE else f"{stem}_{RUNS_TABLE}"


def split_table(df):
    """The CSV form of the tidy table ``df``: ``(runs, results)``, one row per run and one
    per run × K × metric (see the module docstring); ``df`` is unchanged.

    Raises:
        ValueError: two rows of one key disagree on a run-level column (the tidy rows of
            one run carry the same run-level values by construction).
    """
    row_cols = [c for c in ROW_COLUMNS if c in df.columns]
    run_cols = [c for c in df.columns if c not in row_cols]
    runs = df[run_cols].drop_duplicates()
    if runs["key"].duplicated().any():
        dup = runs.loc[runs["key"].duplicated(), "key"].iloc[0]
        raise ValueError(f"the rows of run {dup} disagree on a run-level column; "
                         "a tidy table has one configuration per key")
    ids = ["key", *[c for c in RESULT_ID_COLUMNS if c in df.columns]]
    return runs.reset_index(drop=True), df[ids + row_cols].reset_index(drop=True)


def write_table(df, out: pathlib.Path, stem: str = TABLE) -> list[pathlib.Path]:
    """Write the tidy table ``df`` in ``out``, atomically: its CSV form ``stem.csv`` and
    :func:`runs_stem` ``.csv`` (one row per K × metric, one row per run: see the module
    docstring) and, when pyarrow is installed, the whole table as ``stem.parquet``.

    Without pyarrow (a plain ``pip install .``) the CSV files alone are written;
    every reader of the project accepts either.
    """
    import io

    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    if parquet_available():
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        atomic_write_bytes(out / f"{stem}.parquet", buf.getvalue())
        paths.append(out / f"{stem}.parquet")
    else:
        # a stale Parquet file from an earlier install would shadow the fresh CSV in read_table
        (out / f"{stem}.parquet").unlink(missing_ok=True)
    runs, results = split_table(df)
    runs_path = out / f"{runs_stem(stem)}.csv"
    # the runs first: a reader never finds a results.csv whose runs are not written yet
    atomic_write_text(runs_path, runs.to_csv(index=False))
    atomic_write_text(out / f"{stem}.csv", results.to_csv(index=False))
    return [*paths, out / f"{stem}.csv", runs_path]


def read_table(path: str | os.PathLike):
    """The tidy table from a results file (.parquet or .csv) or a sweep directory.

    A ``results.csv`` in the normalised form (without the run-level columns) is
    joined with the ``runs.csv`` beside it on ``key``.

    Raises:
        FileNotFoundError: no table at ``path``, or a normalised ``results.csv``
            without its ``runs.csv``.
        ValueError: a file that is not a table of this form: a key of
            ``results.csv`` absent from ``runs.csv`` or present there twice, a row of
            ``results.csv`` whose dataset, α, trial (or method, in a file of an earlier
            version) differ from its run's, or
            a column ``key`` missing (the message names the file, line and key).
    """
    import pandas as pd

    path = table_source(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no results table (results.parquet or results.csv); "
                                + _what_to_give(path.parent))
    if path.suffix == ".parquet":
        if not parquet_available():
            raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install "
                             "'rfrs-ref[distributed]'); or give the results.csv beside it")
        import io

        # opened as a regular file: a FIFO there would hang the tool (read_input)
        df = pd.read_parquet(io.BytesIO(read_input(path, "results table")))
        check_unique_columns(df.columns, path)
        return df
    if path.suffix != ".csv":
        raise ValueError(f"{path}: a results table is a .parquet or .csv file")
    df = read_csv_table(path)
    if "status" in df.columns or "metric" not in df.columns:
        return df  # the whole tidy table in one file (or not a tidy table: the caller says)
    return _joined(df, path)


def _what_to_give(folder: pathlib.Path) -> str:
    """What to name instead of ``folder``, which holds no results table: a run directory of
    ``rfrs-ref train`` is said to be one (its evaluations are its metrics.csv)."""
    give = ("give a results directory that `rfrs-ref reproduce` or `rfrs-ref sweep` wrote "
            "(e.g. results/defenses-quick), or its results.csv")
    if (folder / "config.json").is_file() and (folder / "metrics.csv").is_file():
        return (f"{folder} is the directory of one `rfrs-ref train` run, whose evaluations "
                f"are its metrics.csv; {give}")
    return give


def table_source(path: str | os.PathLike) -> pathlib.Path:
    """The file :func:`read_table` reads for ``path``: ``path`` itself, or for a directory
    its results.parquet (when pyarrow can read it) or else its results.csv (the line
    numbers of a message about the table are this file's)."""
    path = pathlib.Path(path)
    if path.is_dir():
        return path / f"{TABLE}.parquet" if (path / f"{TABLE}.parquet").exists() \
            and parquet_available() else path / f"{TABLE}.csv"
    return path


def table_files(path: str | os.PathLike) -> list[pathlib.Path]:
    """The files :func:`read_table` may read for ``path`` (those that exist): the table
    itself and, for a CSV, the runs file beside it; for a directory, every table of it.
    A command that writes beside its input refuses an output among them, so that it
    never replaces the table it read."""
    path = pathlib.Path(path)
    if path.is_dir():
        candidates = [path / f"{TABLE}.parquet", path / f"{TABLE}.csv",
                      path / f"{runs_stem(TABLE)}.csv"]
    elif path.suffix == ".csv":
        candidates = [path, path.with_name(f"{runs_stem(path.stem)}.csv")]
    else:
        candidates = [path]
    return [c for c in candidates if c.exists()]


class DuplicateColumnError(ValueError):
    """A table names a column twice: which of the two holds the values is anyone's guess."""


def check_unique_columns(names, where) -> None:
    """Raise :class:`DuplicateColumnError` naming ``where`` and the first repeated name."""
    seen: dict[str, int] = {}
    for i, name in enumerate(map(str, names), start=1):
        if name in seen:
            raise DuplicateColumnError(
                f"{where}: column {name[:80]!r} appears twice (columns {seen[name]} and {i}); a "
                "table names each column once (which of the two would be read is a guess)")
        seen[name] = i


def read_csv_table(path: pathlib.Path):
    """``pd.read_csv(path)``; a file that is not CSV text (binary, empty, not UTF-8) is a
    ValueError naming the file (pandas' own message does not), and a header that repeats a
    name is a :class:`DuplicateColumnError` (pandas would rename the second ``value.1`` and
    read the first, whichever a writer meant).

    Raises:
        ValueError: naming the file, also when it is not a regular file (a FIFO, a device).
    """
    import csv
    import io

    import pandas as pd

    # opened as a regular file: a FIFO there would hang the tool (read_input)
    data = read_input(path, "CSV table")
    try:
        with io.TextIOWrapper(io.BytesIO(data), newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh), [])
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{path}: not a readable CSV table ({str(exc).splitlines()[0]})") from None
    check_unique_columns(header, f"{path}, line 1")
    try:
        return pd.read_csv(io.BytesIO(data))
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        msg = str(exc).split("\n")[0]
        raise ValueError(f"{path}: not a readable CSV table ({msg})") from None


def _joined(results, path: pathlib.Path):
    """The tidy table from its normalised CSV form: ``results`` (read from ``path``) and the
    runs file beside it."""
    import pandas as pd

    runs_path = path.with_name(f"{runs_stem(path.stem)}.csv")
    if not runs_path.exists():
        raise FileNotFoundError(f"{path}: holds one row per metric and needs {runs_path.name} "
                                f"beside it (one row per run), which is missing")
    runs = read_csv_table(runs_path)
    for name, t in ((path, results), (runs_path, runs)):
        if "key" not in t.columns:
            raise ValueError(f"{name}: no column 'key'; not a results table of rfrs-ref")
    dup = runs["key"].duplicated()
    if dup.any():
        raise ValueError(f"{runs_path}: run {runs.loc[dup, 'key'].iloc[0]} has more than one "
                         "row; a runs table has one row per run")
    missing = ~results["key"].isin(runs["key"])
    if missing.any():
        line = int(missing.to_numpy().argmax()) + 2  # the header is line 1
        raise ValueError(f"{path}, line {line}: run {results.loc[missing, 'key'].iloc[0]} has "
                         f"no row in {runs_path.name}")
    rows = results[["key", *[c for c in ROW_COLUMNS if c in results.columns]]]
    joined = rows.merge(runs, on="key", how="left", sort=False)
    # the columns results.csv repeats to be read alone must say what runs.csv says
    for col in _REPEATED_COLUMNS:
        if col in results.columns and col in runs.columns:
            ours, theirs = results[col].astype(str), joined[col].astype(str)
            both = (results[col].isna() & joined[col].isna()).to_numpy()  # "nan" == "nan"
            bad = (ours != theirs).to_numpy(dtype=bool, na_value=True) | both
            if bad.any():
                i = int(bad.argmax())
                where = f"{path}, line {i + 2}: run {results['key'].iloc[i]}"
                if both[i]:  # empty in both: they agree, on a value no run has
                    what = (": nan is not a Byzantine fraction (a number in [0, 1)), which "
                            "every run records" if col == "alpha" else
                            ", which every run records")
                    raise ValueError(f"{where} has no {col} (empty or NaN here and in "
                                     f"{runs_path.name}){what}")
                raise ValueError(f"{where} has {col} {ours.iloc[i]!r}, but {runs_path.name} "
                                 f"says {theirs.iloc[i]!r}")
    return _ordered(joined)


# -- summary -------------------------------------------------------------------------------------
#: columns that differ between the trials of one configuration
TRIAL_COLUMNS = ("key", "trial", "seed", "status", "error", "traceback", "wall_s", "started",
                 "finished", "worker", "resumed_from", "final_round", "beats_popularity",
                 "byzantine_share_sampled", "byzantine_share_kept", "excluded_byzantine",
                 "excluded_honest", "evaluated_clients", "version", "run_dir", "value",
                 *DIVERGED_COLUMNS)


def group_columns(df) -> list[str]:
    """The columns that identify a configuration up to its seed, plus k and metric."""
    return [c for c in df.columns if c not in TRIAL_COLUMNS and c != "value"]


def summarise(df):
    """Mean, std (ddof=1) and count of ``value`` over trials, per configuration, K and metric.

    The count ``n`` is the number of trials in the mean: those with a finite value. A
    metric a run did not record (NaN: a run made before it existed) is left out of the
    mean and of ``n``, so a configuration whose trials all lack it has an empty mean and
    n = 0, and one where only some have it says over how many the mean is.

    When some run diverged, ``n_diverged`` and ``diverged`` ("k/n") count per
    configuration the diverged trials among those with an outcome (finished or
    diverged); the mean, std and n stay over the finished trials, and a
    configuration whose every trial diverged gets rows (one per K × model
    metric) with an empty mean and n = 0 (see the module docstring).
    """
    import pandas as pd

    ok = df[(df["status"] == "ok") & df["metric"].notna()]
    value = ok["value"].astype(float)
    ok = ok.assign(_finite=value.where(np.isfinite(value)))
    cols = group_columns(df)
    diverged = df[df["status"] == "diverged"]
    empty = pd.DataFrame(columns=[*cols, "mean", "std", "n", "wall_s_mean"])
    if ok.empty and diverged.empty:
        return empty
    out, out_ids = empty, []
    if not ok.empty:
        keyed = ok[cols].astype(str).fillna("")
        by = [keyed[c] for c in cols]
        grouped = ok.groupby(by, sort=False, dropna=False)
        # n counts the values in the mean: pandas' mean skips NaN (a metric a run did not
        # record), so counting every row made a mean over 3 trials read "n = 5"; a non-finite
        # value (edited into a table; outcomes cannot hold one, see tidy_rows) is not counted
        # either, nor shown as the mean
        out = grouped.agg(mean=("_finite", "mean"), std=("_finite", "std"),
                          n=("_finite", "count"),
                          wall_s_mean=("wall_s", "mean")).reset_index(drop=True)
        firsts = grouped[cols].first().reset_index(drop=True)
        out = pd.concat([firsts, out], axis=1)
    if diverged.empty:
        return out
    config_cols = [c for c in cols if c not in ("k", "metric")]
    # one identity per row of the whole table, so finished and diverged runs compare alike
    ids = pd.Series(list(df[config_cols].astype(str).fillna("").itertuples(index=False,
                                                                             name=None)),
                    index=df.index)
    if not ok.empty:
        out_ids = list(ids.loc[ok.index].groupby(by, sort=False, dropna=False).first())
    return _with_divergence(df, out, out_ids, ids, cols)


#: the metrics a configuration whose every trial diverged gets (empty) summary rows for
_DIVERGED_METRICS = ("precision", "recall", "ndcg", "hr", "mrr")


def _with_divergence(df, out, out_ids, ids, cols):
    """``out`` (the summary of the finished runs; ``out_ids`` the configuration of each of
    its rows) with the diverged-trial counts per configuration (``ids``: the configuration
    of each row of ``df``), and empty rows for configurations whose every trial diverged."""
    import pandas as pd

    runs = df[df["status"].isin(["ok", "diverged"])].drop_duplicates("key")
    counts: dict[tuple, list[int]] = {}
    firsts: dict[tuple, object] = {}
    for idx, r in runs.iterrows():
        c = counts.setdefault(ids.loc[idx], [0, 0])
        c[0] += r["status"] == "diverged"
        c[1] += 1
        firsts.setdefault(ids.loc[idx], r)
    have = set(out_ids)
    extra, extra_ids = [], []
    for i, first in firsts.items():
        if i in have:
            continue
        try:
            ks = [int(k) for k in json.loads(first["ks"])]
        except (KeyError, TypeError, ValueError):
            ks = sorted(int(k) for k in df["k"].dropna().unique())
        for k in ks:
            for metric in _DIVERGED_METRICS:
                extra.append({**{c: first[c] for c in cols}, "k": k, "metric": metric,
                              "mean": float("nan"), "std": float("nan"), "n": 0,
                              "wall_s_mean": float("nan")})
                extra_ids.append(i)
    if extra:
        extra = pd.DataFrame(extra, columns=out.columns)
        out = extra if out.empty else pd.concat([out, extra], ignore_index=True)
    all_ids = [*out_ids, *extra_ids]
    n_div = [int(counts.get(i, [0, 0])[0]) for i in all_ids]
    return out.assign(n_diverged=n_div,
                      diverged=[f"{d}/{counts.get(i, [0, 0])[1]}" for d, i in zip(n_div, all_ids)])


def _fmt(mean, std) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return ""
    if std is None or (isinstance(std, float) and math.isnan(std)):
        return f"{mean:.4f}"
    return f"{mean:.4f} ± {std:.4f}"


#: columns shown in the Markdown summary, when they vary
_MD_COLUMNS = ("dataset", "alpha", "method", "model", "optimizer", "defense", "detect", "attack",
               "rounds")


#: columns that name the method; a popularity row shows "popularity" there
_METHOD_COLUMNS = ("label_series", "method", "model", "optimizer", "defense", "detect", "attack")


def markdown_columns(label_columns: Sequence[str]) -> list[str]:
    """The columns that tell the rows of ``summary.md`` apart: the label columns shown
    (those of ``label_columns`` the table has), then the configuration columns it shows
    (method, defense and detect only when no label column is shown). Where two
    configurations have the same values in all of them, :func:`summary_markdown` adds the
    columns in which they differ."""
    shown = _MD_COLUMNS if not label_columns else tuple(
        c for c in _MD_COLUMNS if c not in ("method", "defense", "detect"))
    return [*label_columns, *shown]


def summary_label_columns(specs: Iterable[RunSpec], first: Sequence[str] = ()) -> list[str]:
    """The label columns a summary of ``specs`` shows: ``first``, then the column of every
    other label the runs carry (in the order first met), so that no label is left out of
    the Markdown summary (runs told apart only by a label not shown were one row)."""
    cols = list(dict.fromkeys(first))
    for spec in specs:
        for name in spec.labels:
            if f"label_{name}" not in cols:
                cols.append(f"label_{name}")
    return cols


#: configuration columns that change the model but not the popularity ranking (scored on
#: the same clients whatever the model): a popularity row is not repeated for each value
_NOT_POPULARITY = ("optimizer_params", "model_params", "defense_params", "pre", "pre_params",
                   "attack_params", "init_scale", "dtype", "verify", "backend", "trace",
                   "resilience", "assumed_byzantine", "eval_every")
#: columns of the summary that are no part of a configuration's identity
_SUMMARY_VALUES = ("metric", "k", "mean", "std", "n", "n_diverged", "diverged", "wall_s_mean")


def _telling_apart(summary, columns: Sequence[str]) -> list[str]:
    """``columns``, then each other configuration column of ``summary`` (in its order) that
    takes several values among rows equal in the columns so far: so that two configurations
    (another learning rate, K, pre-aggregator...) are never one row of the Markdown table,
    whatever labels they were given."""
    cols = list(columns)
    model = summary[~summary["metric"].astype(str).str.startswith("popularity_")]
    s = model.drop(columns=[c for c in _SUMMARY_VALUES if c in model.columns]).astype(str)
    for c in s.columns:
        if c not in cols and s[[*cols, c]].drop_duplicates().duplicated(subset=cols).any():
            cols.append(c)
    return cols


def summary_markdown(summary, metrics: Sequence[str] = ("precision", "recall", "ndcg", "hr", "mrr",
                                                     "er", "target_hr"),
                     label_columns: Sequence[str] = ()) -> str:
    """Markdown tables (one per metric): a row per configuration, a column per K, mean ± std.

    Each table ends with the popularity ranking's rows (one per configuration
    that differs in anything but the method: dataset, α, rounds...), the line a
    trained model has to beat.

    When some run diverged (the summary has a ``diverged`` column), the
    ``trials`` column is headed ``finished`` (the trials in the mean), a
    ``diverged`` column ("4/5") follows it, a configuration whose every trial
    diverged shows "—" for its metrics, and each table ends with a line saying so.
    """
    if summary.empty:
        return "_no finished runs_\n"
    parts = []
    label_columns = [c for c in label_columns if c in summary.columns]
    ident = [c for c in markdown_columns(label_columns) if c in summary.columns]
    varying = [c for c in ident if summary[c].astype(str).nunique() > 1] or ident[:3]
    if not any(c in _METHOD_COLUMNS for c in varying) and "method" in summary.columns:
        varying = ["method", *varying]  # so that the popularity rows can be told apart
    varying = _telling_apart(summary, varying)
    for metric in metrics:
        s = summary[summary["metric"] == metric]
        if s.empty or s["mean"].isna().all():  # e.g. NDCG of runs recorded before it existed
            continue
        ks = sorted(int(k) for k in s["k"].unique())
        name = METRIC_LABELS.get(metric, metric)
        divergence = "diverged" in summary.columns
        head = [*varying, *[f"{name}@{k}" for k in ks],
                *(("finished", "diverged") if divergence else ("trials",))]
        lines = ["| " + " | ".join(h.replace("|", "\\|") for h in head) + " |",
                 "|" + "---|" * len(head)]
        rows: dict[tuple, dict] = {}
        for _, r in s.iterrows():
            ident_key = tuple(str(r[c]) for c in varying)
            row = rows.setdefault(ident_key, {"n": r["n"]})
            std = None if pd_isna(r["std"]) else float(r["std"])
            row[int(r["k"])] = _fmt(float(r["mean"]), std) or ("—" if divergence else "")
            row["n"] = min(row["n"], r["n"])
            if divergence:
                row["diverged"] = r["diverged"]
        pop: dict[tuple, dict] = {}
        for _, r in summary[summary["metric"] == f"popularity_{metric}"].iterrows():
            ident_key = tuple("popularity" if c in _METHOD_COLUMNS else
                              "" if c in _NOT_POPULARITY else str(r[c]) for c in varying)
            row = pop.setdefault(ident_key, {"n": r["n"]})
            if int(r["k"]) not in row:
                std = None if pd_isna(r["std"]) else float(r["std"])
                row[int(r["k"])] = _fmt(float(r["mean"]), std)
        for ident_key, row in [*rows.items(), *pop.items()]:
            # a "|" in a label would end its cell: written as "\|", which Markdown shows as "|"
            cells = [*(c.replace("|", "\\|") for c in ident_key), *[row.get(k, "") for k in ks],
                     str(int(row["n"]))]
            if divergence:
                cells.append(row.get("diverged", ""))
            lines.append("| " + " | ".join(cells) + " |")
        if divergence:
            lines += ["", "Mean ± std over the trials that finished; *diverged*: trials whose "
                      "model diverged (NaN or ±inf), left out of the mean (— : every trial "
                      "diverged)."]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def pd_isna(x) -> bool:
    try:
        return x is None or bool(np.isnan(x))
    except TypeError:
        return False


def summary_csv_frame(summary):
    """What ``summary.csv`` holds of :func:`summarise`'s frame.

    - The popularity ranking's rows once per configuration of what it depends on, as
      ``summary.md`` shows them: it is scored on the same clients whatever the model,
      so the method, the model's and rule's settings and the labels are left empty in
      those rows (and their wall time, a model's), and rows then equal are one row.
    - Without the configuration columns that take one value in the whole table (or
      none): ``runs.csv`` lists every run's full configuration. A grid of hundreds of
      configurations (the ranking) otherwise repeated its dozen JSON settings in every
      row of every metric and K, megabytes of the same text.
    """
    if summary.empty:
        return summary
    out = summary.copy()
    pop = out["metric"].astype(str).str.startswith("popularity_")
    if pop.any():
        blank = [c for c in out.columns
                 if c in (*_METHOD_COLUMNS, *_NOT_POPULARITY, "wall_s_mean")
                 or c.startswith("label_")]
        out = out.astype({c: object for c in blank})
        out.loc[pop, blank] = None
        out.loc[pop, [c for c in ("method", "label_series") if c in out.columns]] = "popularity"
        out = out[~(pop & out.astype(str).duplicated())]
    constant = [c for c in out.columns
                if c not in _SUMMARY_VALUES and out[c].astype(str)[out[c].notna()].nunique() <= 1]
    return out.drop(columns=constant)


def write_summary(df, out: pathlib.Path, stem: str = SUMMARY, label_columns=()) -> tuple:
    """Write ``stem.csv`` (:func:`summary_csv_frame`) and ``stem.md``; returns (summary
    DataFrame, paths)."""
    out = pathlib.Path(out)
    s = summarise(df)
    atomic_write_text(out / f"{stem}.csv", summary_csv_frame(s).to_csv(index=False))
    atomic_write_text(out / f"{stem}.md", summary_markdown(s, label_columns=label_columns))
    return s, [out / f"{stem}.csv", out / f"{stem}.md"]
