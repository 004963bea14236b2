"""What of a results directory goes into version control, and where it came from.

A sweep's output directory (see :mod:`rfrs_ref.experiments.results`) holds
two kinds of files:

- **the record** (committed): every run's ``runs/<key>/outcome.json``, or
  ``outcome.json.gz``, the same bytes compressed by :func:`gzip_records` (a few
  kilobytes: the run, its status, wall time, final metrics, evaluation
  history; PCA capture for Fig. 1; for a diverged run its ``divergence``
  (round, reason, what was non-finite) and the history before it), the tables ``results.csv``,
  ``runs.csv``, ``summary.csv``, ``summary.md``, the figures ``figures/*.png``, the
  mechanism and verdict tables (``*.csv``, ``*.md``) and ``provenance.json``;
- **the bulk** (not committed): each run's trainer files (``config.json``,
  ``metrics.csv``, ``rounds.jsonl``, ``final_metrics.json``, checkpoints,
  ``state.npz``, ``capture.npz``), the per-round summary
  ``round_summary.json``, ``results.parquet`` (the CSV's content again, in a
  binary form) and the PDF figures (they embed their creation date).

The record is enough to redo everything: a sweep finds a run finished from
its outcome.json alone, and the tables and PNG figures are drawn from the
outcomes, so running the same command on a copy holding only the record runs
nothing and writes the same ``results.csv``, ``runs.csv``, ``summary.*`` and PNG files,
byte for byte. The repository's ``.gitignore`` states the same split;
:data:`COMMITTED_GLOBS` is its list form, used by tests and tools.

``provenance.json`` lists every call that ran something in the directory:
the commit of the code (and whether its working tree had changes), the
machine, the software versions, the command, when it ran, its wall time and
how many runs it finished. A call that runs nothing leaves it untouched.
Runs recorded by a version that wrote no provenance get one entry, marked
``reconstructed``, made from their outcomes (hosts, versions, first start,
last finish, summed wall time; the commit and command are unknown), the first
time a sweep reads them.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import socket
import stat
import subprocess
import sys
from typing import Iterable

from rfrs_ref.files import atomic_write
from rfrs_ref.jsonsafe import jsonable

PROVENANCE = "provenance.json"

#: the files of a results directory that are committed (paths relative to it)
COMMITTED_GLOBS = ("runs/*/outcome.json", "runs/*/outcome.json.gz", "*.csv", "*.md", "figures/*.png", PROVENANCE)


def committed_files(out: str | os.PathLike) -> list[pathlib.Path]:
    """The committed files of results directory ``out`` (relative paths, sorted)."""
    out = pathlib.Path(out)
    found: set[pathlib.Path] = set()
    for pattern in COMMITTED_GLOBS:
        found.update(p.relative_to(out) for p in out.glob(pattern) if p.is_file())
    return sorted(found)


def git_commit(where: str | os.PathLike | None = None) -> dict:
    """``{"commit": sha or None, "dirty": bool or None}`` of the git checkout holding ``where``
    (default: this package). None when the code is not in a git checkout or git is absent."""
    where = pathlib.Path(where or pathlib.Path(__file__).resolve().parent)
    try:
        sha = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if sha.returncode != 0:
            return {"commit": None, "dirty": None}
        status = subprocess.run(["git", "-C", str(where), "status", "--porcelain",
                                 "--untracked-files=no"], capture_output=True, text=True,
                                timeout=30)
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
        return {"commit": sha.stdout.strip(), "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def machine() -> dict:
    """The machine a call ran on: host name, platform, processor, cores, memory."""
    from rfrs_ref.experiments.sweep import available_cores

    info = {"host": socket.gethostname(), "platform": platform.platform(),
            "processor": _cpu_model() or platform.machine(), "cores": available_cores(),
            "memory_bytes": None}
    try:
        info["memory_bytes"] = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        pass
    return info


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover - not Linux
        pass
    return None


def read_provenance(out: str | os.PathLike) -> dict:
    """The provenance of results directory ``out`` (``{"calls": []}`` when there is none, or
    when it is not a regular file: a FIFO at its name is never waited on)."""
    return _read_provenance(out)[0]


def _read_provenance(out: str | os.PathLike) -> tuple[dict, bool]:
    """``(doc, unreadable)``: :func:`read_provenance`'s record, and whether a regular file
    was there that could not be read as one (not UTF-8, not JSON, not an object with a list
    of calls), which :func:`record_call` keeps aside instead of overwriting."""
    from rfrs_ref.files import open_regular

    fh = open_regular(pathlib.Path(out) / PROVENANCE)
    if fh is None:
        return {"calls": []}, False
    try:
        with fh:
            doc = json.loads(fh.read().decode("utf-8"))
    except OSError:
        return {"calls": []}, False
    except ValueError:
        return {"calls": []}, True
    if not isinstance(doc, dict) or not isinstance(doc.get("calls"), list):
        return {"calls": []}, True
    return doc, False


def record_call(out: str | os.PathLike, *, started: str, wall_s: float, total: int,
                skipped: int, finished: int, failed: int, workers: int,
                run_wall_s: Iterable[float] = (), command: list[str] | None = None,
                diverged: int = 0, reused: int = 0, reused_wall_s: Iterable[float] = (),
                reused_from: Iterable[str] = ()) -> dict:
    """Append one call to ``out/provenance.json`` (atomically) and return the entry.

    ``runs`` counts the call's runs; ``diverged`` and ``reused`` appear in it only when
    some run diverged or was copied from another directory (so entries of other calls
    keep their old form). ``run_wall_s_sum`` is the time of the runs this call ran;
    with copied runs, ``reused_wall_s_sum`` is the time they took where they ran (their
    records' ``wall_s``, each record naming its host) and ``reused_from`` the
    directories they were copied from, relative to ``out``, so that the directory's
    provenance still says what its runs cost after the source is gone."""
    from rfrs_ref.federated.trainer import software_versions

    out = pathlib.Path(out)
    doc, unreadable = _read_provenance(out)
    kept = _keep_aside(out) if unreadable else None
    entry = {
        "started": started,
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(float(wall_s), 3),
        "runs": {"total": total, "skipped": skipped, "finished": finished, "failed": failed,
                 **({"diverged": diverged} if diverged else {}),
                 **({"reused": reused} if reused else {})},
        "run_wall_s_sum": round(float(sum(run_wall_s)), 3),
        **({"reused_wall_s_sum": round(float(sum(reused_wall_s)), 3),
            "reused_from": sorted(set(reused_from))} if reused else {}),
        "workers": workers,
        "command": list(sys.argv if command is None else command),
        **git_commit(),
        "machine": machine(),
        "versions": software_versions(),
        **({"unreadable_provenance_kept_as": kept} if kept else {}),
    }
    doc["calls"].append(entry)
    text = json.dumps(jsonable(doc), indent=1, allow_nan=False) + "\n"
    atomic_write(out / PROVENANCE, lambda fh: fh.write(text.encode("utf-8")))
    return entry


def _keep_aside(out: pathlib.Path) -> str | None:
    """Move ``out``'s unreadable provenance.json aside as ``provenance.json.unreadable``
    (``.unreadable.2``, ... when that name is taken) and return that name: the calls it
    recorded are never overwritten by the new record without a trace. None where it cannot
    be moved (the new record then replaces it, as before)."""
    for i in range(1, 1000):
        aside = out / (f"{PROVENANCE}.unreadable" + (f".{i}" if i > 1 else ""))
        if not (aside.exists() or aside.is_symlink()):
            try:
                os.rename(out / PROVENANCE, aside)
            except OSError:
                return None
            return aside.name
    return None


def record_reconstructed(out: str | os.PathLike, outcomes: list[dict]) -> dict | None:
    """Append the entry of runs recorded without provenance (see the module docstring),
    unless ``out/provenance.json`` already exists; returns the entry or None."""
    out = pathlib.Path(out)
    if (out / PROVENANCE).exists() or not outcomes:
        return None
    started = [o["started"] for o in outcomes if o.get("started")]
    finished = [o["finished"] for o in outcomes if o.get("finished")]
    hosts = sorted({(o.get("worker") or {}).get("host") for o in outcomes} - {None})
    versions = sorted({json.dumps(o.get("versions"), sort_keys=True) for o in outcomes
                       if o.get("versions")})
    entry = {
        "reconstructed": True,
        "started": min(started) if started else None,
        "finished": max(finished) if finished else None,
        "runs": {"total": len(outcomes),
                 "finished": sum(o.get("status") == "ok" for o in outcomes),
                 "failed": sum(o.get("status") not in ("ok", "diverged") for o in outcomes),
                 **({"diverged": n} if (n := sum(o.get("status") == "diverged"
                                                 for o in outcomes)) else {})},
        "run_wall_s_sum": round(float(sum(o.get("wall_s") or 0.0 for o in outcomes)), 3),
        "hosts": hosts,
        "versions": [json.loads(v) for v in versions],
        "commit": None, "dirty": None, "command": None,
    }
    doc = {"calls": [entry]}
    text = json.dumps(jsonable(doc), indent=1, allow_nan=False) + "\n"
    atomic_write(out / PROVENANCE, lambda fh: fh.write(text.encode("utf-8")))
    return entry


class CompactReport:
    """What :func:`gzip_records` did in one results directory.

    Attributes:
        compressed: runs whose outcome.json became outcome.json.gz.
        already: runs whose record was compressed before.
        left: (run directory, reason) of each record left as it was: a link, not a
            regular file, not a JSON object, or two records that differ.
        bytes_before, bytes_after: the records' sizes on disk, before and after.
    """

    def __init__(self) -> None:
        self.compressed: list[str] = []
        self.already: list[str] = []
        self.left: list[tuple[pathlib.Path, str]] = []
        self.bytes_before = 0
        self.bytes_after = 0


def gzip_records(out: str | os.PathLike) -> CompactReport:
    """Replace every run's ``runs/<key>/outcome.json`` in the results directory ``out`` by
    ``outcome.json.gz``: the same bytes, gzip-compressed (no time stamp, no file name), which
    every reader of a run's record reads as it reads outcome.json. A record is kilobytes
    of indented JSON with repeated metric names; compressed, about a quarter of that, which
    keeps a committed grid of many runs small (docs/reproduction.md).

    Each record is checked before it is replaced: a link, a file that is not a regular
    file or not a JSON object, and a run holding two records that differ are left as they
    are and reported. The compressed file is written beside the name and renamed, read back
    and compared byte for byte with the original, and only then is outcome.json removed: an
    interruption leaves the original, or both files with the same bytes (one record, which
    a later call finishes). The directory's lock is held throughout, so no sweep writes there
    meanwhile.

    Raises:
        ValueError: ``out`` is not a results directory a sweep wrote (no ``runs/``, or
            neither a sweep's tables nor ``provenance.json`` beside it), or ``runs/`` is a link.
        rfrs_ref.experiments.results.StoreLocked: a sweep holds the directory.
    """
    from rfrs_ref.experiments.results import (OUTCOME, OUTCOME_GZ, gzip_bytes, is_store,
                                              record_bytes, store_lock, two_records)
    from rfrs_ref.files import atomic_write
    from rfrs_ref.untrusted import parse_json

    out = pathlib.Path(out)
    runs = out / "runs"
    if runs.is_symlink():
        raise ValueError(f"{runs} is a link (to {os.readlink(runs)}); rfrs-ref compresses the "
                         "records inside the results directory it is given, never through a "
                         "link; nothing was changed")
    if not runs.is_dir() or not is_store(out):
        # a folder of the user's with a runs/ of its own (train's default place for runs) is
        # not a sweep's: its files are not records to replace
        raise ValueError(f"{out} is not a results directory (it has no runs/ folder of run "
                         "records beside a sweep's tables or provenance.json); nothing was "
                         "changed")
    report = CompactReport()
    with store_lock(out):
        for d in sorted(runs.iterdir()):
            if d.is_symlink() or not d.is_dir():
                if d.is_symlink():
                    report.left.append((d, f"a link (to {os.readlink(d)}), not a run directory"))
                continue
            plain, gz = d / OUTCOME, d / OUTCOME_GZ
            problem = two_records(d)
            if problem is not None:
                report.left.append((d, problem))
                continue
            if not (plain.exists() or plain.is_symlink()):
                if gz.exists() or gz.is_symlink():
                    report.already.append(d.name)
                continue
            if plain.is_symlink() or not stat.S_ISREG(plain.lstat().st_mode):
                why = (f"a link (to {os.readlink(plain)})" if plain.is_symlink()
                       else "not a regular file")
                report.left.append((d, f"{OUTCOME} is {why}, not the run's own record"))
                continue
            text = plain.read_bytes()
            try:
                value = parse_json(text, str(plain))
            except ValueError as exc:
                report.left.append((d, str(exc).split("\n")[0]))
                continue
            if not isinstance(value, dict):
                report.left.append((d, f"{plain}: not a JSON object"))
                continue
            if not gz.exists():
                data = gzip_bytes(text)
                atomic_write(gz, lambda fh, data=data: fh.write(data))
            if record_bytes(gz) != text:
                # a file of the same name appeared meanwhile, or the disk returned other bytes
                report.left.append((d, f"{gz} does not read back as {OUTCOME}'s bytes"))
                continue
            report.bytes_before += len(text)
            report.bytes_after += gz.stat().st_size
            plain.unlink()
            report.compressed.append(d.name)
    return report
