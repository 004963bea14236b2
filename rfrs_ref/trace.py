"""Run traces: a per-round record of a training run that another implementation can write.

A trace is a JSON Lines file (UTF-8, one JSON object per line, strict JSON:
non-finite numbers are written as ``null``). The first line is the header,
every other line one round, in increasing round order. docs/traces.md
specifies every field, its units and conventions.

Header::

    {"format": "rfrs-trace", "version": 1,
     "producer": {"name", "version", "backend", "data_dir"},
     "run": {dataset, model, optimizer, defense, detect, attack, their
             hyperparameters, byzantine_fraction, assumed_byzantine,
             client_fraction, init_scale, dtype, seed, rounds, ...},
     "dataset": {"name", "users", "items", "interactions"},
     "n_params": D, "state_arrays": ["m", "v", "theta"], "dtype": "float32",
     "layout": "...", "byte_order": "little", "checksum": "sha256",
     "initial": {"state_norms": {...}, "state_sums": {...}, "state_checksums": {...}}}

Round line::

    {"round": t, "clients": [...], "byzantine": [...], "n_samples": [...],
     "f": f, "f_rule": f_rule, "excluded": [{"client", "check"}],
     "grad_norms": [...], "loss": ..., "rule": {...}, "kept": [...],
     "weights": [...] | null, "attack": {...}, "state_norms": {...},
     "state_sums": {...}, "state_checksums": {...}, "metrics": {...}}
     (metrics on evaluated rounds)

``TraceWriter`` writes a trace while :class:`rfrs_ref.federated.trainer.Trainer`
runs (its ``progress`` callback); ``rfrs-ref train --trace FILE`` uses it.
``compare(a, b)`` finds the first round and field where two traces diverge.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import re
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np

from rfrs_ref import agreement
from rfrs_ref.jsonsafe import jsonable
from rfrs_ref.untrusted import UntrustedFileError, depth_exceeds, describe_object, one_line, parse_json

FORMAT = "rfrs-trace"
VERSION = 1

#: fields of a round line, in the order a round computes them (and compare reports them)
ROUND_FIELDS = ("round", "clients", "byzantine", "n_samples", "f", "f_rule", "excluded", "grad_norms",
                "loss", "rule", "kept", "weights", "attack", "state_norms", "state_sums",
                "state_checksums", "metrics", "resilience")
#: fields every round line has (others may be absent or null)
REQUIRED_FIELDS = ("round", "clients", "byzantine", "n_samples", "f", "f_rule", "excluded", "kept",
                   "state_norms")
#: fields that hold integers (client ids, nᵢ, f) or records of them: their numbers compare
#: exactly, also when a writer gives them as floats (3.0 is 3, 3.000001 is not), since a
#: relative tolerance would let a large client id be off by more than one
EXACT_FIELDS = ("round", "clients", "byzantine", "n_samples", "f", "f_rule", "excluded")
#: the keys of an ``excluded`` entry: each must be in B where A has it (an entry sharing
#: no key with A's would compare nothing)
EXCLUDED_KEYS = ("client", "check")
#: configuration keys that describe the machine or the code path, not the computation
PRODUCER_KEYS = ("backend", "data_dir")

LAYOUTS = {
    "fism": "theta = concat(P.ravel(), Q.ravel()); P, Q of shape (n_items, dim), row-major",
    "fmf": "theta = P.ravel(); P of shape (n_items, dim), row-major (user vectors are private)",
}


class TraceRefused(ValueError):
    """A trace file that a run must not write: another process is writing it, it is not a
    trace, or (on resume) it is the trace of another run."""


class TraceFormatError(ValueError):
    """A trace file does not follow the format (the message names file and line, on one
    line: a name from the file with a newline in it is shown escaped)."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


# -- writing ------------------------------------------------------------------------------------

def checksum(a: np.ndarray) -> str:
    """sha256 (hex) of the array's IEEE-754 bytes in C order, in its own dtype and the
    machine's byte order (the header's ``byte_order``), as the trainer computes them."""
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


#: the statistics of ``state_sums``, per array x = (x_0, ..., x_{D−1}) (the header's layout,
#: C order, k from 0), each computed in float64 from the stored values: a sign flip or a
#: permutation of the coordinates changes the first two, never ‖x‖₂
SUM_STATS = ("sum", "weighted_sum", "abs_sum")
#: the weights of ``weighted_sum``: w_k = (k mod SUM_PERIOD) + 1, so 1 ≤ w_k ≤ SUM_PERIOD
SUM_PERIOD = 7


def sum_weights(D: int) -> np.ndarray:
    """w_k = (k mod 7) + 1 for k = 0..D−1 (float64): 1, 2, ..., 7, 1, 2, ..."""
    return (np.arange(D, dtype=np.int64) % SUM_PERIOD + 1).astype(np.float64)


#: statistics that a trace may lack (written before they existed): compared where A has them
OPTIONAL_SUM_STATS = ("phase_sum",)
#: φ = (√5 − 1)/2 as a float64: the weights of ``phase_sum`` are 1 + frac(k·φ)
PHASE = 0.6180339887498949


def phase_weights(D: int) -> np.ndarray:
    """w_k = 1 + (k·φ − ⌊k·φ⌋), k = 0..D−1, the product k·φ rounded once in float64 (as
    any IEEE-754 language computes it), so 1 ≤ w_k < 2 and no two k < D share a weight:
    unlike (k mod 7) + 1, no permutation of the coordinates keeps every weight (a matrix
    stored transposed keeps k mod 7 when both its sides are ≡ 1 mod 7, as d = 64 is)."""
    t = np.arange(D, dtype=np.float64) * PHASE
    return 1.0 + (t - np.floor(t))


def state_sums(state) -> dict:
    """{name: {"sum": Σ x_k, "weighted_sum": Σ w_k x_k, "abs_sum": Σ |x_k|,
    "phase_sum": Σ p_k x_k}}, float64, w_k = (k mod 7) + 1 and p_k = 1 + frac(k·φ)
    (:func:`phase_weights`) over the flattened array (C order); non-finite values as null."""
    out = {}
    for k, v in state.items():
        x = np.asarray(v, dtype=np.float64).ravel()
        with np.errstate(all="ignore"):
            out[k] = {"sum": float(x.sum()), "weighted_sum": float(sum_weights(x.size) @ x),
                      "abs_sum": float(np.abs(x).sum()),
                      "phase_sum": float(phase_weights(x.size) @ x)}
    return jsonable(out)


def state_summary(state) -> dict:
    """{"state_norms": {name: ‖x‖₂ in float64}, "state_sums": :func:`state_sums`,
    "state_checksums": {name: sha256}}."""
    return {"state_norms": {k: jsonable(float(np.linalg.norm(np.asarray(v, dtype=np.float64))))
                            for k, v in state.items()},
            "state_sums": state_sums(state),
            "state_checksums": {k: checksum(v) for k, v in state.items()}}


def run_of(trainer) -> dict:
    """The header's ``run``: the configuration without what only says how it was produced."""
    cfg = trainer.config.to_json()
    return jsonable({k: v for k, v in cfg.items() if k not in PRODUCER_KEYS and k != "trace"})


def header(trainer, initial_state: dict | None = None) -> dict:
    """The header line of a trace of ``trainer``'s run (its initial state is
    recomputed when not given: it is a pure function of the seed)."""
    from rfrs_ref import __version__

    c = trainer.config
    cfg = c.to_json()
    run = run_of(trainer)
    if initial_state is None:
        initial_state, _ = trainer.initial_state()
    return jsonable({
        "format": FORMAT, "version": VERSION,
        "producer": {"name": "rfrs-ref", "version": __version__,
                     **{k: cfg.get(k) for k in PRODUCER_KEYS}},
        "run": run,
        "dataset": {"name": trainer.data.name, "users": trainer.data.n_users,
                    "items": trainer.data.n_items, "interactions": trainer.data.n_interactions},
        "n_params": int(trainer.model.n_params()),
        "state_arrays": list(trainer.optimizer.arrays),
        "dtype": str(np.dtype(c.dtype)),
        "layout": LAYOUTS.get(c.model, c.model),
        "byte_order": sys.byteorder,
        "checksum": "sha256",
        "initial": state_summary(initial_state),
    })


def round_line(record: dict, metrics: dict | None = None) -> dict:
    """A round line from a round record of :func:`rfrs_ref.federated.round.run_round`
    (with the trainer's ``state_checksums``) and the round's evaluation, if any."""
    missing = [k for k in ("clients", "state_norms") if k not in record]
    if missing:
        raise ValueError(f"round record of round {record.get('round')} lacks {missing}")
    if "state_checksums" not in record:
        raise ValueError("round records lack state_checksums: run the trainer with "
                         "TrainConfig(trace=True)")
    rule = {k: v for k, v in (record.get("rule") or {}).items() if k not in PRODUCER_KEYS}
    line = {
        "round": record["round"],
        "clients": record["clients"],
        "byzantine": record["byzantine"],
        "n_samples": record["n_samples"],
        "f": record["f"],
        "f_rule": record["f_rule"],
        "excluded": [{"client": e["client"], "check": e["check"]} for e in record["excluded"]],
        "grad_norms": record.get("grad_norms"),
        "loss": record.get("loss"),
        "rule": rule,
        "kept": record["kept"],
        "weights": record.get("weights"),
        "attack": record.get("attack") or {},
        "state_norms": record["state_norms"],
        "state_sums": record.get("state_sums"),
        "state_checksums": record["state_checksums"],
    }
    if line["state_sums"] is None:
        del line["state_sums"]
    if metrics is not None:
        line["metrics"] = {k: v for k, v in metrics.items() if k != "round"}
    if record.get("resilience"):
        line["resilience"] = record["resilience"]
    return jsonable(line)


def _dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


#: how every header line this writer writes begins (``header`` puts "format" first)
_HEADER_START = ('{"format":' + json.dumps(FORMAT)).encode("utf-8")


class TraceWriter:
    """Writes a trace while a :class:`~rfrs_ref.federated.trainer.Trainer` runs.

    >>> with TraceWriter(path, trainer) as w:                      # doctest: +SKIP
    ...     trainer.run(run_dir, progress=w.progress)

    The trainer's configuration must have ``trace=True`` (records then carry
    the recovered-gradient norms and the state checksums). Each line is
    flushed when written, so an interrupted run leaves a valid prefix. With
    ``resume_after=t0`` an existing trace keeps its header and rounds ≤ t0 and
    the run's next rounds are appended (``rfrs-ref train --resume``); reading
    stops at the first line that is not a JSON object (a line cut short by the
    interruption, or damage), and a trace without a readable header is
    written afresh.
    """

    def __init__(self, path, trainer, *, resume_after: int | None = None) -> None:
        import fcntl

        if not trainer.config.trace:
            raise ValueError("a trace needs TrainConfig(trace=True): the round records must carry "
                             "gradient norms and state checksums")
        self.path = pathlib.Path(path)
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # opened without truncating, then locked: a second run given the same file stops
        # here instead of interleaving its lines with the first's
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise TraceRefused(f"{self.path} is being written by another process (the --trace of "
                               "another run); give each run its own trace file") from None
        self._fh = os.fdopen(fd, "r+b")
        try:
            try:
                kept = self._kept(trainer, resume_after)
            except TraceFormatError as exc:
                # a line or file past the limits of a trace, or a read that failed: the file
                # is left as it is
                raise TraceRefused(f"{exc}; rfrs-ref does not overwrite a file it cannot read "
                                   "as a trace: give another --trace file") from None
            self._fh.seek(0)
            self._fh.truncate()
            if kept:
                self._fh.write("".join(kept).encode("utf-8"))
            else:
                self._write(header(trainer))
            self._fh.flush()
        except BaseException:
            self._fh.close()
            raise

    def _kept(self, trainer, resume_after: int | None) -> list[str]:
        """The lines of the existing file to keep: the header and rounds ≤ ``resume_after``
        of this run's own trace on resume, else none. An existing file that is not a trace
        is refused (never overwritten), and so, on resume, is the trace of another run."""
        self._fh.seek(0)
        # read as compare reads a trace: a first line past MAX_LINE_BYTES (or a file past
        # MAX_TRACE_BYTES) is refused, naming the file, line and limit, and left as it is
        first = next((raw for _, raw, _ in _trace_lines(self._fh, self.path)), b"")
        if not first:
            return []  # an empty file (or one just created)
        try:
            head = json.loads(first.decode("utf-8"))
        except (ValueError, RecursionError):
            head = None
        if not (isinstance(head, dict) and head.get("format") == FORMAT):
            if resume_after is not None and head is None and first.startswith(_HEADER_START):
                # the header line of our own trace, cut short by an interruption (the writer
                # puts "format" first): the format lets a trace be written afresh
                return []
            raise TraceRefused(f"{self.path} exists and is not an rfrs-ref trace (its first line "
                               "is not a trace header); rfrs-ref does not overwrite a file it did "
                               "not write: give another --trace file")
        if resume_after is None:
            return []  # a trace of an earlier run, replaced by this run's
        from rfrs_ref.federated.config import TrainConfig

        mine, theirs = TrainConfig.trajectory(run_of(trainer)), TrainConfig.trajectory(head.get("run"))
        if mine != theirs:
            changed = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            what = ", ".join(f"{k} {theirs.get(k)!r} where the run has {mine.get(k)!r}"
                             for k in changed[:3])
            raise TraceRefused(f"{self.path} is the trace of another run ({what}), not of the run "
                               "being resumed; give the run's own trace, or a new file")
        self._fh.seek(0)
        return _prefix_lines(self._fh, resume_after, self.path)

    def _write(self, obj) -> None:
        self._fh.write((_dumps(obj) + "\n").encode("utf-8"))
        self._fh.flush()

    def write_round(self, record: dict, metrics: dict | None = None) -> None:
        self._write(round_line(record, metrics))

    def progress(self, t: int, record: dict, latest: dict | None) -> None:
        """Trainer.run's ``progress`` callback."""
        self.write_round(record, latest)

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _prefix(path: pathlib.Path, t0: int) -> list[str]:
    """The header and the round lines ≤ t0 of the trace at ``path``."""
    with open(path, "rb") as fh:
        return _prefix_lines(fh, t0, path)


def _prefix_lines(fh, t0: int, path) -> list[str]:
    """The header and the round lines ≤ t0 of an existing trace open in ``fh`` (binary,
    buffered) at ``path``, read as :func:`read_trace` reads one (:func:`_trace_lines`): a
    line longer than :data:`MAX_LINE_BYTES`, read no further, or a file larger than
    :data:`MAX_TRACE_BYTES` raises :class:`TraceFormatError` naming the file, line and
    limit. Reading stops at the first line that is not a JSON object."""
    out = []
    for lineno, raw, _ in _trace_lines(fh, pathlib.Path(path)):
        i = lineno - 1
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
            obj = json.loads(line)
        except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
            break  # a line cut short by the interruption, or damage: keep the prefix before it
        if not isinstance(obj, dict):
            break
        t = obj.get("round", t0 + 1)
        if i == 0 or (_is_int(t) and t <= t0):
            out.append(line if line.endswith("\n") else line + "\n")
    return out


def run_traced(config, trace_path, run_dir=None, *, progress=None):
    """Train ``config`` (with ``trace`` switched on) and write its trace to ``trace_path``.

    Returns the :class:`~rfrs_ref.federated.trainer.TrainResult`.
    """
    from rfrs_ref.federated.trainer import Trainer

    trainer = Trainer(dataclasses.replace(config, trace=True))
    with TraceWriter(trace_path, trainer) as w:
        def both(t, record, latest):
            w.progress(t, record, latest)
            if progress is not None:
                progress(t, record, latest)

        return trainer.run(run_dir, progress=both)


# -- reading ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Trace:
    header: dict
    rounds: list[dict]
    path: str = ""
    #: the file's line number of the header, then of each round (empty: not read from a file)
    lines: list[int] = dataclasses.field(default_factory=list)


#: how deeply a trace line may nest lists and objects (rfrs-ref writes 4 levels)
MAX_DEPTH = 32
#: header fields that must be JSON objects when present
_HEADER_OBJECTS = ("producer", "run", "dataset", "initial")
#: the largest ``n_params`` a header may state (2⁴⁰, a terabyte of float32 parameters): the
#: checks of a reference's sums allow a relative rounding of D·2⁻⁵³, which stays below 2⁻¹³
MAX_PARAMS = 2**40
#: the largest round number a trace may hold (the largest integer a float64 writer keeps
#: exact; a report names the round, and a 4,000-digit one would be the whole line)
MAX_ROUND = 2**53
#: the most bytes one line of a trace may hold, its line end included (16 MiB). A round line
#: takes about 80 bytes per sampled client (id, flag, nᵢ, gradient norm, kept, weight, a
#: rule's score or distance) and 2 kB more (state, metrics): a round of every client of
#: the largest dataset rfrs-ref reads (citeulike-t, 7,947 users) is under a megabyte, so
#: this leaves room for some 200,000 clients a round. A line is read at most this far: a
#: longer one (a file of one multi-gigabyte line) is refused without being read whole
MAX_LINE_BYTES = 1 << 24
#: the most bytes a trace file may hold (2 GiB). The longest default run (citeulike-t,
#: 1,500 rounds) with every client sampled each round writes about 1 GB; read, a trace
#: takes 2–3 times its size in memory, and ``compare`` reads two. Judged from the size of
#: the file opened before a byte is read (a sparse file of terabytes takes a few bytes of
#: disk), and again on the bytes read (a file that grows while it is read)
MAX_TRACE_BYTES = 1 << 31


def _what_a_trace_is() -> str:
    """What a trace is, for the messages that refuse a file as too large to be one."""
    return ("a trace is a JSON Lines file of a header line and one line per round, each line at "
            f"most {MAX_LINE_BYTES:,} bytes and the file at most {MAX_TRACE_BYTES:,} bytes "
            "(docs/traces.md)")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _parse_line(raw: bytes, where: str, last: bool):
    try:
        return parse_json(raw, where)
    except UntrustedFileError as exc:
        msg = str(exc)
        if last and not raw.endswith(b"\n") and "not valid JSON" in msg:
            msg += (" (the line is cut short: was the run writing it interrupted? "
                    "`rfrs-ref train --resume` rewrites the trace from its last checkpoint)")
        raise TraceFormatError(msg) from None


#: a state checksum: the sha256 digest of an array's bytes, in hex (docs/traces.md)
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


def _check_state_summary(obj: dict, where: str) -> None:
    for key in ("state_norms", "state_checksums"):
        v = obj.get(key)
        if v is None:
            continue
        if not isinstance(v, dict):
            raise TraceFormatError(f"{where}: {key} must be an object (array name -> value), "
                                   f"got {type(v).__name__}")
        if key == "state_checksums":
            for name, x in v.items():
                # a placeholder ("", "n/a") that both traces write would match itself, and
                # count as a state compared bit for bit (and excuse B's missing sums)
                if not (isinstance(x, str) and _SHA256.fullmatch(x)):
                    raise TraceFormatError(
                        f"{where}: state_checksums must map array names to hex strings, sha256 "
                        f"digests of 64 hex digits; state_checksums.{describe_object(name, 60)} is "
                        f"{describe_object(x, 80)} (leave out state_checksums where an "
                        "implementation computes none)")
        if key == "state_norms":
            for name, x in v.items():
                # a list or a string would count as a state compared without a norm being
                # checked; null is the format's non-finite norm (a negative one diverges)
                if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))):
                    raise TraceFormatError(
                        f"{where}: state_norms.{describe_object(name, 60)} must be a number "
                        f"(‖x‖₂) or null, got {describe_object(x, 60)}")
    sums = obj.get("state_sums")
    if sums is not None:
        def number(v):
            return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))

        ok = isinstance(sums, dict) and all(
            isinstance(x, dict) and all(s in x and number(x[s]) for s in SUM_STATS)
            and all(number(x[s]) for s in OPTIONAL_SUM_STATS if s in x)
            for x in sums.values())
        if not ok:
            raise TraceFormatError(f"{where}: state_sums must map array names to objects with the "
                                   f"numbers {', '.join(SUM_STATS)} (and {', '.join(OPTIONAL_SUM_STATS)})")


#: how far two norms of one array's bytes may differ (relative) before they count as two
#: arrays: an implementation whose reductions are not deterministic (atomic adds on a GPU)
#: may round a norm of the same bytes differently in two rounds
_SAME_BYTES_NORM_RTOL = 1e-6


def _check_digests_against_norms(obj: dict, where: str, seen: dict) -> None:
    """Refuse a checksum that stands for two arrays: one digest of one array's name at
    norms that differ (beyond :data:`_SAME_BYTES_NORM_RTOL`) anywhere in the trace.

    The same bytes have one norm, so such a digest is a placeholder written in the form
    of a sha256 digest ("0" * 64): two traces that both write it would match their
    checksums, which excuse the state sums, and a candidate with m's sign flipped would
    agree. ``seen`` maps (array, digest) to the first (norm, where)."""
    sums = obj.get("state_checksums")
    norms = obj.get("state_norms")
    if not isinstance(sums, dict) or not isinstance(norms, dict):
        return
    for name, digest in sums.items():
        x = norms.get(name)
        if not isinstance(digest, str) or isinstance(x, bool) or not isinstance(x, (int, float)):
            continue
        x = float(x)
        if not math.isfinite(x):
            continue
        key = (name, digest.lower())
        first = seen.setdefault(key, (x, where))
        y, at = first
        if abs(x - y) > _SAME_BYTES_NORM_RTOL * max(abs(x), abs(y)):
            raise TraceFormatError(
                f"{where}: state_checksums.{describe_object(name, 60)} is the digest it was at "
                f"{at}, but the norm of {describe_object(name, 60)} was {y!r} there and is {x!r} "
                "here: the same bytes have one norm, so the digest is no checksum of the array "
                "(leave out state_checksums where an implementation computes none)")


def _check_header(obj: dict, where: str) -> None:
    if obj.get("format") != FORMAT:
        # a run directory's rounds.jsonl starts with a round record: not a trace
        what = ("; it starts with a round record, as a run's rounds.jsonl does, which is "
                "not a trace" if "round" in obj and "format" not in obj else "")
        raise TraceFormatError(f"{where}: the first line must be a header with "
                               f"\"format\": \"{FORMAT}\", got format {obj.get('format')!r}"
                               f"{what}; write a trace with `rfrs-ref train ... --trace FILE` "
                               "(docs/traces.md)")
    v = obj.get("version")
    if not (_is_int(v) and v == VERSION):
        raise TraceFormatError(f"{where}: trace format version {v!r} is not supported "
                               f"(this is version {VERSION})")
    for key in _HEADER_OBJECTS:
        if obj.get(key) is not None and not isinstance(obj[key], dict):
            raise TraceFormatError(f"{where}: header field {key} must be an object, "
                                   f"got {type(obj[key]).__name__}")
    arrays = obj.get("state_arrays")
    if arrays is not None and not (isinstance(arrays, list) and all(isinstance(x, str) for x in arrays)):
        raise TraceFormatError(f"{where}: state_arrays must be a list of array names, "
                               f"got {describe_object(arrays, 120)}")
    D = obj.get("n_params")
    if D is not None and not (_is_int(D) and 1 <= D <= MAX_PARAMS):
        # 4.0 or 10**400 would switch off the checks of a reference's sums (or overflow them)
        raise TraceFormatError(f"{where}: n_params must be an integer from 1 to 2**40 (the number "
                               f"of parameters), got {describe_object(D, 60)}")
    _check_state_summary(obj.get("initial") or {}, where + " (initial)")


def _state_lines(trace: Trace) -> list[tuple[int, dict]]:
    """(round, line) of the lines that hold a state: the header's initial one (0), if it has
    one, and every round."""
    initial = trace.header.get("initial")
    return ([(0, initial)] if isinstance(initial, dict) else []) + [(r["round"], r) for r in trace.rounds]


def _check_all_arrays(trace: Trace) -> None:
    """The reference's state norms name every array of its header's ``state_arrays``, and
    its state sums, if it records them at all, every array in every line.

    An array of A missing in B diverges; one missing in A itself (or all: ``{}``)
    would be compared in neither, so the reference is refused instead. The sums are
    what tells a sign flip or a permutation of an array from the reference's state: a
    line or an array they leave out would let one agree, with no more than a note."""
    arrays = trace.header.get("state_arrays") or []
    lines = _state_lines(trace)
    with_sums = any(obj.get("state_sums") is not None for _, obj in lines)
    name = trace.path or "trace A"
    for t, obj in lines:
        where = "the header's initial state" if t == 0 else f"round {t}"
        norms = obj.get("state_norms")
        if not isinstance(norms, dict) and obj.get("state_sums") is not None:
            # the sums' Σ|x| sets B's tolerance, and only the norms bound it
            # (_check_sums_consistent): without them an inflated Σ|x| would pass unchecked
            raise TraceFormatError(f"{name}: {where}: state_sums without state_norms; the "
                                   "reference must record the norm of every array where it "
                                   "records its sums (they are checked against each other)")
        if isinstance(norms, dict):
            missing = [k for k in arrays if k not in norms]
            if missing:
                raise TraceFormatError(f"{name}: {where}: state_norms lacks "
                                       f"{', '.join(missing)} (its header's state_arrays are "
                                       f"{', '.join(arrays)}); the reference must record every array")
        if not with_sums:
            continue
        sums = obj.get("state_sums")
        if not isinstance(sums, dict):
            raise TraceFormatError(f"{name}: {where}: no state_sums, which other lines of the trace "
                                   "record; the reference must record them in every line or in none")
        needed = _arrays_of(trace.header, obj)
        missing = [k for k in needed if k not in sums]
        if missing or not sums:
            raise TraceFormatError(f"{name}: {where}: state_sums lacks {', '.join(missing) or 'every array'} "
                                   f"(its state arrays are {', '.join(needed) or 'not named'}); the "
                                   "reference must record the sums of every array")


#: relative slack of the checks of a reference's sums against its own norms: the two are
#: computed in float64 from the same values, each with a relative rounding of at most
#: D·2⁻⁵³ (summed in any order), far below it
SUMS_SLACK = 1e-9


def _check_sums_consistent(trace: Trace) -> None:
    """The reference's state sums are consistent with its own state norms.

    A's ``abs_sum`` S sets the tolerance of B's sums (rtol·S, rtol·7S): an inflated S
    accepts any sums of B, so A's is checked against what A itself records, per array
    x with a finite norm N = ‖x‖₂ and a finite S, with D = ``n_params`` values (every
    state array has one per parameter): N ≤ S ≤ √D·N (Σ|x| ≥ ‖x‖₂, and Cauchy–Schwarz),
    and |sum| ≤ S, |weighted_sum| ≤ 7S, |phase_sum| ≤ 2S (weights in [1, 7] and [1, 2)),
    each within a relative D·2⁻⁵³ + :data:`SUMS_SLACK` (D ≤ :data:`MAX_PARAMS`, so at most
    2⁻¹³); and where N is finite (and 7√D·N too), every sum is: a null (or NaN, ±inf) sum
    of such an array is no value of it, and a B writing the same would match it. A
    reference with sums and without ``n_params`` is refused: its upper bound could
    not be checked. Raises :class:`TraceFormatError` naming the file, line, round and array."""
    D = trace.header.get("n_params")
    lines = _state_lines(trace)
    if not any(obj.get("state_sums") is not None for _, obj in lines):
        return
    if not (_is_int(D) and 1 <= D <= MAX_PARAMS):  # read_trace refuses any other value
        raise TraceFormatError(f"{trace.path or 'trace A'}: the header states no n_params, which "
                               "the checks of the reference's state_sums against its norms need "
                               "(Σ|x| ≤ √D·‖x‖₂); record it (docs/traces.md)")
    slack = SUMS_SLACK + D * 2.0**-53
    offset = 0 if isinstance(trace.header.get("initial"), dict) else 1  # trace.lines[0]: header
    for i, (t, obj) in enumerate(lines, start=offset):
        norms, sums = obj.get("state_norms"), obj.get("state_sums")
        if not isinstance(norms, dict) or not isinstance(sums, dict):
            continue
        for k, x in sums.items():
            if not isinstance(x, dict):
                continue
            S, N = _finite_number(x.get("abs_sum")), _finite_number(norms.get(k))
            problem = ""
            if N is not None and SUM_PERIOD * math.sqrt(D) * N * (1.0 + slack) < sys.float_info.max:
                # a finite norm bounds every sum (|Σ w_k x_k| ≤ 7Σ|x| ≤ 7√D·‖x‖₂): a sum A leaves
                # null (or NaN, ±inf) there is no value of the state, and B's null matches it
                gone = [stat for stat in SUM_STATS + OPTIONAL_SUM_STATS
                        if stat in x and _finite_number(x[stat]) is None]
                if gone:
                    line = f":{trace.lines[i]}" if i < len(trace.lines) else ""
                    where = "the header's initial state" if t == 0 else f"round {t}"
                    v = x[gone[0]]
                    raise TraceFormatError(
                        f"{trace.path or 'trace A'}{line}: {where}: state_sums.{k}.{gone[0]} is "
                        f"{'null' if v is None else describe_object(v, 60)} where state_norms.{k} = "
                        f"{float(N)!r} is finite, which bounds every sum of the array (|Σ w_k x_k| ≤ "
                        "7·√D·‖x‖₂): the reference's sums must be its state's (a B writing the same "
                        "non-finite value would match it, and no sum be compared; docs/traces.md)")
            if S is None:
                continue
            if S < 0:
                problem = "Σ|x| ≥ 0"
            elif N is not None and S < N * (1.0 - slack):
                problem = f"Σ|x| ≥ ‖x‖₂ = {float(N)!r} (state_norms.{k})"
            elif N is not None and D is not None and S > math.sqrt(D) * N * (1.0 + slack) + 1e-300:
                problem = (f"Σ|x| ≤ √D·‖x‖₂ = {float(math.sqrt(D) * N)!r} (D = n_params = {D}, "
                           f"‖x‖₂ = state_norms.{k} = {float(N)!r})")
            else:
                for stat, c in (("sum", 1.0), ("weighted_sum", float(SUM_PERIOD)), ("phase_sum", 2.0)):
                    v = _finite_number(x.get(stat))
                    if v is not None and abs(v) > c * S * (1.0 + slack) + 1e-300:
                        problem = (f"Σ|x| ≥ |{stat}|{'' if c == 1 else f'/{c:g}'} = {float(abs(v) / c)!r} "
                                   f"({stat} = {float(v)!r})")
                        break
            if problem:
                line = f":{trace.lines[i]}" if i < len(trace.lines) else ""
                where = "the header's initial state" if t == 0 else f"round {t}"
                raise TraceFormatError(
                    f"{trace.path or 'trace A'}{line}: {where}: state_sums.{k}.abs_sum = {float(S)!r} breaks "
                    f"{problem}, which the trace's own values require; the reference's Σ|x| "
                    "sets the tolerance of the other trace's sums, so it must be the state's "
                    "(docs/traces.md)")


def _finite_number(v) -> float | None:
    """``v`` as a finite float, None for null, a non-number or a non-finite number."""
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def read_trace(path) -> Trace:
    """Read and validate a trace file (header, then round lines in increasing order).

    Every defect of the file (not UTF-8, not JSON, nested more than
    :data:`MAX_DEPTH` levels, an unreadable number, a missing or mistyped field,
    rounds out of order, a last line cut short by an interruption) raises
    :class:`TraceFormatError` with a one-line message naming the file and line.
    ``NaN``/``Infinity`` literals are read as the floats they name (the format
    writes ``null``; :func:`compare` treats them by :mod:`rfrs_ref.agreement`'s rule).
    The file is read line by line: a line of more than :data:`MAX_LINE_BYTES` bytes
    (read no further than that) and a file of more than :data:`MAX_TRACE_BYTES` bytes
    (judged from its size before a byte is read, and on the bytes read) are a
    :class:`TraceFormatError` naming the file, the size and the limit, and so is a
    trace larger than the memory can hold once read, naming its size.
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such trace file")
    if not path.is_dir() and not path.is_file():
        # a device or a pipe (/dev/zero) would be read forever
        raise TraceFormatError(f"{path}: not a regular file, expected a trace")
    try:
        return _read_trace(path)
    except MemoryError:
        try:
            size = f"{path.stat().st_size:,} bytes"
        except OSError:
            size = "its size unknown"
        raise TraceFormatError(f"{path}: too large to read in this machine's memory ({size}); "
                               "is it a trace?") from None


def _trace_lines(fh, path: pathlib.Path):
    """(line number from 1, raw bytes with their line end, whether it is the file's last
    line) of each line of the trace open in ``fh`` (binary, buffered), read one at a time.

    Refuses (:class:`TraceFormatError`) a file whose size is above :data:`MAX_TRACE_BYTES`
    before reading it, a line longer than :data:`MAX_LINE_BYTES` after reading no more than
    one byte past the limit, and a file that has grown past the limit by the time it is
    read. Whether a line is the last is known by looking ahead (``peek``) without reading.
    A read that fails (an I/O error) is a :class:`TraceFormatError` too."""
    try:
        yield from _trace_lines_unchecked(fh, path)
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read the trace ({exc.strerror or exc})") from None


def _trace_lines_unchecked(fh, path: pathlib.Path):
    """:func:`_trace_lines`, an I/O error raised as it is."""
    size = os.fstat(fh.fileno()).st_size
    if size > MAX_TRACE_BYTES:
        raise TraceFormatError(f"{path}: {size:,} bytes, more than the {MAX_TRACE_BYTES:,} bytes a "
                               f"trace may hold; nothing is read from it: {_what_a_trace_is()}")
    total = 0
    lineno = 0
    while True:
        raw = fh.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) > MAX_LINE_BYTES:
            raise TraceFormatError(f"{path}:{lineno}: a line of more than {MAX_LINE_BYTES:,} bytes "
                                   f"(read no further), longer than a trace line may be: "
                                   f"{_what_a_trace_is()}")
        total += len(raw)
        if total > MAX_TRACE_BYTES:
            raise TraceFormatError(f"{path}:{lineno}: {total:,} bytes read by this line, more than "
                                   f"the {MAX_TRACE_BYTES:,} bytes a trace may hold (the file grew "
                                   f"while it was read; it held {size:,} bytes when opened): "
                                   f"{_what_a_trace_is()}")
        yield lineno, raw, not fh.peek(1)


def _read_trace(path: pathlib.Path) -> Trace:
    """:func:`read_trace` of a path tested to be a regular file or a directory."""
    rounds: list[dict] = []
    head = None
    from rfrs_ref.files import open_input

    if path.is_dir():
        raise TraceFormatError(f"{path}: is a directory, not a trace file")
    try:
        # opened without waiting and tested on the descriptor: a FIFO put at the name after
        # read_trace's test of it would otherwise block the read for ever
        fh = open_input(path, "trace")
    except ValueError:
        raise TraceFormatError(f"{path}: not a regular file, expected a trace") from None
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read the trace ({exc.strerror or exc})") from None
    digests: dict = {}
    with fh:
        for lineno, raw, last in _trace_lines(fh, path):
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            obj = _parse_line(raw, where, last)
            if not isinstance(obj, dict):
                raise TraceFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            if depth_exceeds(obj, MAX_DEPTH):
                raise TraceFormatError(f"{where}: nested more than {MAX_DEPTH} levels deep; a trace "
                                       "line is a flat record (docs/traces.md)")
            if head is None:
                _check_header(obj, where)
                head = obj
                numbers = [lineno]
                _check_digests_against_norms(obj.get("initial") or {}, where + " (initial)", digests)
                continue
            missing = [k for k in REQUIRED_FIELDS if k not in obj]
            if missing:
                raise TraceFormatError(f"{where}: round line lacks {', '.join(missing)}")
            t = obj["round"]
            if isinstance(t, float) and t.is_integer() and 1.0 <= t <= 2.0**53:
                t = obj["round"] = int(t)  # a writer's 1.0 is round 1 (the numbers compare exactly)
            if not _is_int(t) or (rounds and t <= rounds[-1]["round"]) or not 1 <= t <= MAX_ROUND:
                prev = rounds[-1]["round"] if rounds else 0
                raise TraceFormatError(f"{where}: round {describe_object(t, 60)} after round {prev}: "
                                       "rounds are integers from 1 to 2**53, in increasing order")
            _check_state_summary(obj, where)
            if obj["state_norms"] is None:
                raise TraceFormatError(f"{where}: state_norms must be an object (array name -> norm)")
            _check_digests_against_norms(obj, where, digests)
            rounds.append(obj)
            numbers.append(lineno)
    if head is None:
        raise TraceFormatError(f"{path}: empty trace (no header line)")
    return Trace(head, rounds, str(path), numbers)


# -- comparing ----------------------------------------------------------------------------------

@dataclasses.dataclass
class Divergence:
    """The first place where two traces differ.

    Attributes:
        round: the round (0: the header or the initial state).
        field: the path of the value (``weights[3]``, ``rule.scores[2]``, ``initial.state_norms.theta``).
        a, b: the two values, A the reference and B the candidate (None for a
            missing or non-finite value).
        reason: why they count as different.
    """

    round: int
    field: str
    a: Any
    b: Any
    reason: str

    def __str__(self) -> str:
        where = "the header" if self.round == 0 else f"round {self.round}"
        # a value may be a megabyte of text: the line shows its beginning
        field = self.field if len(self.field) <= 200 else self.field[:197] + "..."
        return one_line(f"traces diverge at {where}, field {field}: A {describe_object(self.a, 200)}, "
                        f"B {describe_object(self.b, 200)} ({self.reason})")


@dataclasses.dataclass
class TraceComparison:
    agree: bool
    rounds_compared: int
    divergence: Divergence | None
    notes: list[str]
    checksums_compared: bool


class _Diverged(Exception):
    def __init__(self, div: Divergence) -> None:
        self.div = div


class _Comparer:
    def __init__(self, rtol, atol, ignore, checksums: bool, notes: list[str]):
        self.rtol, self.atol = rtol, atol
        self.exact = False  # set while visiting an EXACT_FIELDS field
        self.checksums_seen = 0  # checksums actually compared (the report may say so only then)
        self.values_seen = 0  # values compared in the rounds (0: every field ignored)
        self.state_seen = 0  # finite state values compared, header and rounds (0: none compared)
        self.state_nonfinite = 0  # state values non-finite in both traces (not a comparison)
        # (bound, |A|, round, path, formula) of the finite non-zero float of A compared under
        # the tolerance whose bound is the largest: the atol at or above which a B of 0 agrees
        # with it ((1 − rtol)·|A|; |A| − rtol·c·Σ|x| for a state sum, whose tolerance is
        # relative to its scale), which an atol must stay below to check anything (None: none)
        self.largest: tuple[float, float, int, str, str] | None = None
        self.ignore = tuple(ignore)
        self.matched: set[str] = set()  # the --ignore paths that skipped something
        self.checksums = checksums
        self.notes = notes
        self._noted: set[str] = set()

    def note(self, text: str) -> None:
        text = one_line(text)
        if text not in self._noted:
            self._noted.add(text)
            self.notes.append(text)

    def note_only(self, path: str, keys: list[str]) -> None:
        """Note the keys of object ``path`` that one trace only has (the first 20, each cut
        to 60 characters), if any."""
        if keys:
            names = ", ".join(k if len(k) <= 60 else k[:57] + "..." for k in keys[:20])
            more = f" and {len(keys) - 20} more" if len(keys) > 20 else ""
            self.note(f"{path}: keys present in one trace only, not compared: {names}{more}")

    def ignored(self, path: str) -> bool:
        if path == "round":
            return False  # the round numbers pair the lines: always compared
        hits = [p for p in self.ignore if path == p or path.startswith((p + ".", p + "["))]
        self.matched.update(hits)
        return bool(hits)

    def checksums_cover(self, path: str, a, b, arrays) -> bool:
        """Whether this line's checksums are compared for every array of A's state: the
        headers allow them, ``--ignore`` leaves them, and A records one for each array
        (``arrays``) and B a checksums object. Only then may the line's sums be left out
        or incomplete: a checksum of one array, an ignored one or none says nothing of
        the others."""
        if not self.checksums or self.ignored(path) or not isinstance(a, dict) or not isinstance(b, dict):
            return False
        return bool(arrays) and all(k in a and not self.ignored(f"{path}.{k}") for k in arrays)

    def bound(self, bound: float, magnitude: float, t: int, path: str, formula: str) -> None:
        """Record a value of A compared under the tolerance, with the atol from which a B of 0
        would agree with it (:attr:`largest` keeps the largest)."""
        if self.largest is None or bound > self.largest[0]:
            self.largest = (bound, magnitude, t, path, formula)

    def fail(self, t, path, a, b, reason):
        raise _Diverged(Divergence(t, path, a, b, reason))

    def value(self, t: int, path: str, a, b) -> None:
        if self.ignored(path):
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for k in a:
                if k in b:
                    self.value(t, f"{path}.{k}", a[k], b[k])
            only = sorted(set(a) ^ set(b))
            for k in only:
                self.one_side(t, f"{path}.{k}", a.get(k), b.get(k), k in a,
                              nulls=path in ("state_norms", "initial.state_norms"))
            self.note_only(path, only)
            return
        self.values_seen += 1  # a value (or a list's length) compared
        state = path.startswith(("state_norms.", "initial.state_norms."))
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                self.fail(t, path, f"{len(a)} entries", f"{len(b)} entries", "different lengths")
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                self.value(t, f"{path}[{i}]", x, y)
            return
        if a is None or b is None:
            if a is None and b is None:
                self.state_nonfinite += state
                return
            self.fail(t, path, a, b, "one value is missing or not finite")
        if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
            if a != b or type(a) is not type(b):
                self.fail(t, path, a, b, "different values")
            return
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            if (isinstance(a, int) and not state) or self.exact:
                # A JSON integer in the reference is an integer quantity (a selection, a
                # count): it compares exactly, also against a float of B (2,000,000.5 is
                # not within rtol of client 2,000,000). Python compares an int and a float
                # by value, exactly (no rounding of 2**60); two floats bit for bit but for
                # NaN's sign and payload (−0.0 is not 0.0, which == calls equal)
                if not _exact_same(a, b):
                    self.fail(t, path, a, b, _ZERO_SIGN if a == b else "different integers")
                return
            # A is the reference: its magnitude sets the tolerance, and a non-finite B
            # (a NaN or Infinity literal, or 1e999) never matches a finite A
            fa, fb = agreement.as_float(a), agreement.as_float(b)
            if math.isfinite(fa) and fa != 0.0:
                self.bound(abs(fa) * (1.0 - self.rtol), abs(fa), t, path, "(1 − rtol)·|A|")
            if not agreement.agrees(fa, fb, self.rtol, self.atol):
                tol = float(agreement.tolerance(fa, self.rtol, self.atol))
                self.fail(t, path, a, b, agreement.describe(fa, fb, tol, "A"))
            # a norm non-finite in both traces matched, but compared no state
            if state and math.isfinite(fa):
                self.state_seen += 1
            elif state:
                self.state_nonfinite += 1
            return
        if type(a) is not type(b) or a != b:
            self.fail(t, path, a, b, f"different kinds of value ({type(a).__name__}, {type(b).__name__})")

    def one_side(self, t: int, path: str, a, b, in_a: bool, nulls: bool = False) -> None:
        """A value only one trace records (``in_a``: A's) is not compared, but a non-finite
        number in it (NaN, ±inf, an overflowing literal; with ``nulls`` also ``null``, the
        format's non-finite state norm) diverges: it has nothing to be compared with, and
        skipping it would call a NaN agreement."""
        for where, v in _nonfinite(a if in_a else b, path, nulls):
            if not self.ignored(where):
                self.fail(t, where, v if in_a else None, None if in_a else v,
                          f"not finite in {'A' if in_a else 'B'}, and {'B' if in_a else 'A'} has "
                          "nothing to compare it to")

    def one_side_keys(self, t: int, path: str, a, b, known) -> None:
        """Keys of object ``a`` or ``b`` that :meth:`state_sums` does not compare (B's arrays
        that A lacks, statistics other than ``known``): a non-finite number in one diverges,
        the others are noted."""
        if not isinstance(a, dict) or not isinstance(b, dict):
            return
        other = [(k, k in a) for k in dict.fromkeys([*a, *b]) if k not in known]
        for k, in_a in other:
            if k in a and k in b:
                self.value(t, f"{path}.{k}", a[k], b[k])
            else:
                self.one_side(t, f"{path}.{k}", a.get(k), b.get(k), in_a)
        self.note_only(path, [k for k, _ in other if (k in a) != (k in b)])

    def same_keys(self, t: int, path: str, a, b) -> None:
        """Every array of A's state is in B's (a required object: no key may be dropped)."""
        if self.ignored(path) or not isinstance(a, dict) or not isinstance(b, dict):
            return
        missing = [k for k in a if k not in b and not self.ignored(f"{path}.{k}")]
        if missing:
            self.fail(t, f"{path}.{missing[0]}", a[missing[0]], None, "missing in B")

    def required_keys(self, t: int, path: str, a, b, keys) -> None:
        """Each entry of list ``a`` that has one of ``keys`` must have it in ``b``'s entry too."""
        if self.ignored(path) or not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
            return  # value() reports the difference in kind or length
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if isinstance(x, dict) and isinstance(y, dict):
                for k in keys:
                    if k in x and k not in y and not self.ignored(f"{path}[{i}].{k}"):
                        self.fail(t, f"{path}[{i}].{k}", x[k], None, "missing in B")

    def state_sums(self, t: int, path: str, a: dict | None, b: dict | None,
                   checksummed: bool = False, norms=None) -> None:
        """The sums of each array of A's state (docs/traces.md), B's within atol + rtol·S,
        S from A alone: Σ|x| for the sum and Σ|x| itself, 7·Σ|x| for the weighted sum (a
        sum cancels: its error is relative to Σ|x|, as a norm's is to the norm). A trace
        without the field (written before it existed) is compared on its norms only,
        with a note; an array of A missing in B's sums diverges. ``checksummed``: this
        line's checksums are compared for every array (:meth:`checksums_cover`), which is
        what allows B to leave its sums out. An array whose norm A records as not finite
        lends its Σ|x| no authority as a scale (B's sums are then compared relative to
        their own value): a reference cannot inflate it where no bound checks it."""
        if self.ignored(path):
            return
        if a is None or b is None:
            # a NaN or ±inf in the sums of one trace only has nothing to be compared with
            self.one_side(t, path, a, b, a is not None)
            if a is not None and not checksummed:
                # without checksums the sums are all that tells a sign flip or a permutation
                # from the reference's state: a B that leaves them out cannot agree
                self.fail(t, path, f"{len(a)} arrays' sums", None,
                          "missing in B, and checksums are not compared: the norms alone cannot "
                          "tell a sign flip or a permutation of a state's coordinates; record "
                          "state_sums (docs/traces.md)")
            if a is not None or b is not None:
                who = "A" if a is None else "B"
                self.note(f"state_sums: trace {who} records none (written before they were): the "
                          "state was compared by its norms"
                          + (" and checksums" if checksummed else " only, which a sign flip or "
                             "a permutation of an array's coordinates leaves unchanged"))
            return
        self.one_side_keys(t, path, a, b, tuple(a))
        for k in a:
            if self.ignored(f"{path}.{k}"):
                continue
            if k not in b:
                self.fail(t, f"{path}.{k}", a[k], None, "missing in B")
            xa, xb = a[k], b[k]
            if not isinstance(xa, dict) or not isinstance(xb, dict):
                self.fail(t, f"{path}.{k}", xa, xb, "different kinds of value")
            scale = xa.get("abs_sum")
            if not isinstance(norms, dict) or _finite_number(norms.get(k)) is None:
                scale = None  # no finite norm bounds this Σ|x| (_check_sums_consistent)
            self.one_side_keys(t, f"{path}.{k}", xa, xb, SUM_STATS + OPTIONAL_SUM_STATS)
            for stat in SUM_STATS + OPTIONAL_SUM_STATS:
                where = f"{path}.{k}.{stat}"
                if self.ignored(where):
                    continue
                if stat in OPTIONAL_SUM_STATS and stat not in xa:
                    if stat in xb:
                        self.one_side(t, where, None, xb[stat], False)
                    self.note(f"state_sums: trace A records no {stat} (written before it was): "
                              "the state's coordinates were compared by the sums that a "
                              "permutation keeping k mod 7 leaves unchanged")
                    continue
                if stat in OPTIONAL_SUM_STATS and stat not in xb:
                    if not checksummed:
                        self.fail(t, where, xa[stat], None,
                                  "missing in B, and checksums are not compared: the other "
                                  "sums cannot tell a permutation of the coordinates that keeps "
                                  "k mod 7 (a matrix stored transposed whose sides are ≡ 1 mod 7) "
                                  "from the reference's state; record it (docs/traces.md)")
                    self.note(f"state_sums: trace B records no {stat} (written before it was): "
                              "its state was compared by the other sums and checksums")
                    continue
                va, vb = xa.get(stat), xb.get(stat)
                self.values_seen += 1
                if va is None or vb is None:
                    if va is None and vb is None:
                        self.state_nonfinite += 1
                        continue
                    self.fail(t, where, va, vb, "one value is missing or not finite")
                fa, fb = agreement.as_float(va), agreement.as_float(vb)
                s = agreement.as_float(scale) if scale is not None else math.inf
                s = {"weighted_sum": SUM_PERIOD, "phase_sum": 2.0}.get(stat, 1.0) * s
                if not math.isfinite(s):
                    s = abs(fa)  # Σ|x| overflowed: relative to the value itself
                bar = {"weighted_sum": "7·", "phase_sum": "2·"}.get(stat, "") + "Σ|x| of A"
                if math.isfinite(fa) and fa != 0.0 and math.isfinite(s):
                    # a B of 0 agrees with this value from atol = |A| − rtol·S on (S its scale,
                    # not the value: a bound of 7·Σ|x| let an atol above every value compared pass)
                    self.bound(abs(fa) - self.rtol * s, abs(fa), t, where, f"|A| − rtol·{bar}")
                tol = self.atol + self.rtol * s
                if not agreement.agrees(fa, fb, 0.0, tol):
                    why = agreement.describe(fa, fb, tol, "A")
                    if math.isfinite(fa) and math.isfinite(fb):
                        why = f"|Δ| = {abs(fb - fa):.3g} > atol + rtol·{bar} = {tol:.3g}"
                    self.fail(t, where, va, vb, why)
                if math.isfinite(fa):
                    self.state_seen += 1
                else:
                    self.state_nonfinite += 1

    def state_checksums(self, t: int, path: str, a: dict | None, b: dict | None) -> None:
        if not self.checksums or self.ignored(path) or a is None:
            return
        if b is None:
            # B holds no checksums where A does: as for one array missing, and the
            # report must not claim that checksums were compared
            self.fail(t, path, f"{len(a)} checksums", None, "missing in B")
        for k in a:
            if self.ignored(f"{path}.{k}"):
                continue
            if k not in b:
                self.fail(t, f"{path}.{k}", a[k], None, "missing in B")
            if not _same_digest(a[k], b[k]):
                self.fail(t, f"{path}.{k}", a[k], b[k], "checksums differ (same dtype, layout and byte "
                          "order: the states differ in at least one bit; two backends or machines "
                          "that round differently agree only within a tolerance: compare their "
                          "values with --no-checksums, checksums=False)")
            self.checksums_seen += 1


#: why an exact comparison fails a zero of the other sign (a Divergence's reason)
_ZERO_SIGN = ("the sign of zero differs under exact comparison: −0.0 is not 0.0; an integer 0 "
              "matches a zero of either sign, and any NaN any NaN")


def _exact_same(a, b) -> bool:
    """Whether JSON numbers ``a`` and ``b`` are the same under exact comparison: equal by
    value (Python compares an int and a float exactly), and when both are floats, bit for
    bit except that any NaN matches any NaN (whatever its sign or payload): a float zero of
    the other sign (−0.0 for 0.0) differs, which ``==`` would not see. An integer has no
    sign of zero: the int 0 matches 0.0 and −0.0."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b


def _same_digest(x, y) -> bool:
    """Whether two checksums are the same digest: hex digits compare in either case (a
    writer may print a sha256 in capitals); anything else compares as it is."""
    if isinstance(x, str) and isinstance(y, str):
        return x.lower() == y.lower()
    return type(x) is type(y) and x == y


def _nonfinite(x, path: str, nulls: bool = False):
    """(path, value) of every non-finite number nested in ``x`` (and of every null when
    ``nulls``: a state norm written as null is a non-finite one)."""
    if x is None:
        if nulls:
            yield path, None
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        if not math.isfinite(agreement.as_float(x)):
            yield path, x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _nonfinite(v, f"{path}.{k}", nulls)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _nonfinite(v, f"{path}[{i}]", nulls)


def _arrays_of(header: dict, line: dict) -> list[str]:
    """The arrays of a line's state: the header's ``state_arrays`` and the keys of the
    line's norms and sums."""
    out = list(header.get("state_arrays") or [])
    for key in ("state_norms", "state_sums"):
        if isinstance(line.get(key), dict):
            out += list(line[key])
    return list(dict.fromkeys(out))


def _vacuous_atol(cmp: _Comparer) -> str:
    """Why ``cmp``'s atol checked nothing in the comparison it made ('' when it checked
    something): with it, a B of 0 would have agreed with every float of A that was compared
    under the tolerance (|A|·(1 − rtol) ≤ atol for all; for a state sum, whose tolerance is
    atol + rtol·c·Σ|x|, |A| − rtol·c·Σ|x| ≤ atol). Values of A that were not compared (a field
    B leaves null or lacks, an ``--ignore``'d path, integers, checksums) do not count."""
    if cmp.largest is None:
        return ""
    bound, m, t, path, formula = cmp.largest
    if cmp.atol < bound:
        return ""
    where = "the header" if t == 0 else f"round {t}"
    return (f"trace compare: --atol {cmp.atol:g} checks nothing: with --rtol {cmp.rtol:g} a B of 0 "
            f"agrees with every float value of trace A that was compared (the largest bound, |A| = "
            f"{m:.6g} at {where}, field {path}); --atol must be below {formula} = {bound:.7g}")


def _same(x, y) -> bool:
    """Equal JSON values, a boolean equal to a boolean only (Python's ``True == 1``)."""
    if isinstance(x, bool) or isinstance(y, bool):
        return type(x) is type(y) and x == y
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same(u, v) for u, v in zip(x, y))
    return x == y


def compare(a: Trace | str | os.PathLike, b: Trace | str | os.PathLike, *, rtol: float = 1e-6,
            atol: float = 1e-9, checksums: bool = True, ignore: Iterable[str] = ()) -> TraceComparison:
    """Find the first round and field where trace ``b`` (the candidate) diverges from
    trace ``a`` (the reference).

    Rules: integers, booleans and strings (clients, Byzantine flags, nᵢ, f,
    exclusions and their checks, selections) compare exactly (and so do the numbers of
    :data:`EXACT_FIELDS`: two floats bit for bit, −0.0 not 0.0, but any NaN matches any
    NaN; an integer 0 matches a zero of either sign); floats (norms,
    weights, kept fractions, losses, diagnostics, metrics) by the rule of
    :mod:`rfrs_ref.agreement`: ``|B − A| ≤ atol + rtol·|A|`` with the tolerance
    from the reference A alone, a non-finite B (a ``NaN``/``Infinity`` literal or
    an overflowing number such as ``1e999``) never matches a finite A, and a
    non-finite A only the same value; null matches only null; lists must
    have the same length; dictionaries compare on the keys both have (keys of
    one side only are listed in ``notes``, and a non-finite number in such a key, or
    in an optional field one trace only records, diverges; a round line's fields that the
    format does not define, and the arrays and statistics of ``state_sums``, are such
    keys), except the state's norms and
    checksums, where a key of A missing in B is a divergence. Checksums compare exactly, and
    only when both headers state the same dtype, layout and byte order (and
    ``checksums`` is true). Fields are visited in the order a round computes
    them (:data:`ROUND_FIELDS`), so the reported field is the earliest
    difference of the earliest round. ``ignore`` lists field paths to skip
    (``rule.objective``, ``metrics``...).

    ``rtol`` and ``atol`` must be finite and ≥ 0, ``rtol`` < 1, and ``atol`` below
    ``(1 − rtol)·max|A|``, where max|A| is the largest finite float of A that the
    comparison actually compared under the tolerance (a value B leaves null or lacks, an
    ignored path, integers and checksums do not count; a state sum counts as
    ``|A| − rtol·c·Σ|x|``, the atol from which 0 agrees with it): a comparison that finds no
    divergence raises ValueError when ``atol`` is at or above it, since a B of 0 would
    then have agreed with every float of A compared, as with ``rtol`` ≥ 1;
    two traces without a round raise :class:`TraceFormatError` (nothing compared), and a
    comparison that compared no state norm, state sum or checksum in a round raises
    ValueError instead of agreeing (a reference recording no state in its rounds, or
    ``ignore`` leaving none; the header's initial state does not stand for a round's).

    Differences between the headers' ``run`` configurations are notes, not
    divergences: two runs with different settings can still compute the same
    rounds. A different parameter count or set of state arrays is a
    divergence at round 0, so is a different initial state.
    """
    rtol, atol = agreement.check_tolerance(rtol, atol, "trace compare")
    if rtol >= 1.0:
        # |0 − A| ≤ rtol·|A| for every A: a trace of zeros would agree with any trace
        raise ValueError(f"trace compare: rtol must be < 1, got {rtol!r} (with rtol ≥ 1 a B of 0 "
                         "agrees with every value of A)")
    ta = a if isinstance(a, Trace) else read_trace(a)
    tb = b if isinstance(b, Trace) else read_trace(b)
    _check_all_arrays(ta)
    _check_sums_consistent(ta)
    if not ta.rounds and not tb.rounds:
        # two headers alone compare no round: "the traces agree" would report a check
        # that never happened (e.g. two runs interrupted before their first round)
        raise TraceFormatError(f"{ta.path or 'trace A'} and {tb.path or 'trace B'} hold no round "
                               "(a header only): nothing to compare")
    ha, hb = ta.header, tb.header
    notes: list[str] = []
    same_repr = all(ha.get(k) == hb.get(k) for k in ("dtype", "layout", "byte_order", "checksum"))
    use_checksums = checksums and same_repr
    if checksums and not same_repr:
        diff = [f"{k} ({describe_object(ha.get(k), 120)} vs {describe_object(hb.get(k), 120)})"
                for k in ("dtype", "layout", "byte_order", "checksum")
                if ha.get(k) != hb.get(k)]
        notes.append("checksums not compared: the traces differ in " + ", ".join(diff))
    cmp = _Comparer(rtol, atol, ignore, use_checksums, notes)
    for field, what in (("run", "the run configurations"), ("dataset", "the datasets")):
        side_a, side_b = ha.get(field), hb.get(field)
        side_a, side_b = (x if isinstance(x, dict) else {} for x in (side_a, side_b))
        differing = [k for k in side_a if k in side_b and not _same(side_a[k], side_b[k])]
        if differing:
            notes.append(one_line(f"{what} differ in " + ", ".join(
                f"{k} ({describe_object(side_a[k], 120)} vs {describe_object(side_b[k], 120)})"
                for k in differing)))
    done = 0
    metrics_one_side = 0
    header_checksums = 0
    try:
        for k in ("n_params", "state_arrays"):
            cmp.value(0, k, ha.get(k), hb.get(k))
        ia, ib = ha.get("initial") or {}, hb.get("initial") or {}
        cmp.same_keys(0, "initial.state_norms", ia.get("state_norms"), ib.get("state_norms"))
        cmp.value(0, "initial.state_norms", ia.get("state_norms"), ib.get("state_norms"))
        cmp.state_sums(0, "initial.state_sums", ia.get("state_sums"), ib.get("state_sums"),
                       cmp.checksums_cover("initial.state_checksums", ia.get("state_checksums"),
                                           ib.get("state_checksums"), _arrays_of(ha, ia)),
                       ia.get("state_norms"))
        cmp.state_checksums(0, "initial.state_checksums", ia.get("state_checksums"), ib.get("state_checksums"))
        cmp.values_seen, header_checksums = 0, cmp.checksums_seen  # count the rounds' only
        # the rounds that compared no value of their state (an initial state alone says
        # nothing of the models the rounds trained, nor one round of the others')
        stateless: list[int] = []
        nonfinite_rounds: list[int] = []  # of those, the rounds whose state both traces left non-finite
        for ra, rb in zip(ta.rounds, tb.rounds, strict=False):  # lengths compared after
            t = ra["round"]
            state_before = (cmp.state_seen, cmp.checksums_seen)
            nonfinite_before = cmp.state_nonfinite
            if ra["round"] != rb["round"]:
                cmp.fail(min(ra["round"], rb["round"]), "round", ra["round"], rb["round"],
                         "the traces record different rounds")
            for field in ROUND_FIELDS:
                va, vb = ra.get(field), rb.get(field)
                if field == "state_checksums":
                    cmp.state_checksums(t, field, va, vb)
                    continue
                if field == "state_sums":
                    cmp.state_sums(t, field, va, vb,
                                   cmp.checksums_cover("state_checksums", ra.get("state_checksums"),
                                                       rb.get("state_checksums"), _arrays_of(ha, ra)),
                                   ra.get("state_norms"))
                    continue
                if (field in ra) != (field in rb) and field not in REQUIRED_FIELDS:
                    cmp.one_side(t, field, va, vb, field in ra)
                    if field != "metrics":
                        cmp.note(f"{field}: present in one trace only, not compared")
                    else:  # evaluated rounds may differ; say how many were not compared
                        metrics_one_side += 1
                    continue
                if field in ("rule", "attack") and (va is None or vb is None):
                    cmp.one_side(t, field, va, vb, vb is None)
                    if va is not vb:  # optional diagnostics: skipped, but not silently
                        cmp.note(f"{field}: null in one trace only, not compared")
                    continue
                if field == "state_norms":
                    cmp.same_keys(t, field, va, vb)
                if field == "excluded":
                    cmp.required_keys(t, field, va, vb, EXCLUDED_KEYS)
                cmp.exact = field in EXACT_FIELDS
                try:
                    cmp.value(t, field, va, vb)
                finally:
                    cmp.exact = False
            # fields this format does not define: compared as the keys of an object are
            for field in (k for k in dict.fromkeys([*ra, *rb]) if k not in ROUND_FIELDS):
                if field in ra and field in rb:
                    cmp.value(t, field, ra[field], rb[field])
                else:
                    cmp.one_side(t, field, ra.get(field), rb.get(field), field in ra)
                    cmp.note(f"{field}: present in one trace only, not compared")
            if (cmp.state_seen, cmp.checksums_seen) == state_before:
                stateless.append(t)
                if cmp.state_nonfinite > nonfinite_before:
                    nonfinite_rounds.append(t)
            done += 1
        if len(ta.rounds) != len(tb.rounds):
            short, long_ = ("A", "B") if len(ta.rounds) < len(tb.rounds) else ("B", "A")
            last = min(len(ta.rounds), len(tb.rounds))
            nxt = (tb.rounds if short == "A" else ta.rounds)[last]["round"]
            cmp.fail(nxt, "round", None if short == "A" else nxt, nxt if short == "A" else None,
                     f"trace {short} ends after {last} rounds, trace {long_} continues")
    except _Diverged as d:
        return TraceComparison(False, done, d.div, notes,
                               use_checksums and cmp.checksums_seen > header_checksums)
    if done and cmp.values_seen == done and cmp.checksums_seen == header_checksums:  # round numbers only
        raise ValueError(one_line(f"trace compare: --ignore {' '.join(cmp.ignore)} leaves no field "
                                  f"of the {done} rounds to compare"))
    if stateless:
        # clients, weights and losses alike, and no state of a round: "the traces agree"
        # would say nothing of the model that round trained (a reference recording no state
        # in its rounds compares none; its initial state alone says only where they began)
        first = next(r for r in ta.rounds if r["round"] == stateless[0])
        recorded = any(isinstance(first.get(k), dict) and first.get(k)
                       for k in ("state_norms", "state_sums", "state_checksums"))
        rounds = (f"round {stateless[0]}" if len(stateless) == 1 else
                  f"{len(stateless)} of the {done} rounds (the first: round {stateless[0]})")
        if stateless[0] in nonfinite_rounds:
            why = ("every value of the state recorded there is non-finite (null, NaN or ±inf) in "
                   "both traces (a state that is not finite is never a match)")
        elif recorded:
            skipped = ([f"--ignore {' '.join(cmp.ignore)}"] if cmp.ignore else []) + (
                [] if use_checksums else ["checksums not compared"])
            why = f"{' and '.join(skipped) or 'the comparison'} leaves none"
        else:
            why = (f"trace A records no state there (state_arrays {ha.get('state_arrays')!r}, no state "
                   "norm, sum or checksum in the round)")
        raise ValueError(one_line(f"trace compare: no value of the state (state norms, sums or checksums) was "
                         f"compared in {rounds}: {why}; an agreement would say nothing of the models "
                         "the rounds trained"))
    vacuous = _vacuous_atol(cmp)
    if vacuous:
        # judged on the values compared: a large value of A that B leaves null (rule
        # scores) or that --ignore skips must not make an atol above all the rest look sound
        raise ValueError(one_line(vacuous))
    if metrics_one_side:
        notes.append(f"metrics: recorded by one trace only on {metrics_one_side} round(s), not compared")
    if use_checksums and cmp.checksums_seen == header_checksums:
        notes.append("checksums not compared in the rounds: trace A holds none there, or "
                     "--ignore left none")
    unmatched = [p for p in cmp.ignore if p not in cmp.matched]
    if unmatched:
        notes.append(f"--ignore {' '.join(unmatched)}: no field of these traces has this path "
                     "(paths are exact, without wildcards: rule.objective, metrics, state_norms.m)")
    return TraceComparison(True, done, None, notes,
                           use_checksums and cmp.checksums_seen > header_checksums)


__all__ = [
    "FORMAT",
    "LAYOUTS",
    "ROUND_FIELDS",
    "VERSION",
    "Divergence",
    "Trace",
    "TraceComparison",
    "TraceFormatError",
    "TraceRefused",
    "TraceWriter",
    "checksum",
    "compare",
    "header",
    "read_trace",
    "round_line",
    "run_of",
    "run_traced",
    "state_summary",
    "state_sums",
    "sum_weights",
]
