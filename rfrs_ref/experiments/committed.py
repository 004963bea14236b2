"""What of a results directory goes into version control, and where it came from.

A sweep's output directory (see :mod:`rfrs_ref.experiments.results`) holds
two kinds of files:

- **the record** (committed): every run's ``runs/<key>/outcome.json`` (a few
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
import subprocess
import sys
from typing import Iterable

from rfrs_ref.files import atomic_write
from rfrs_ref.jsonsafe import jsonable

PROVENANCE = "provenance.json"

#: the files of a results directory that are committed (paths relative to it)
COMMITTED_GLOBS = ("runs/*/outcome.json", "*.csv", "*.md", "figures/*.png", PROVENANCE)


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
    """The provenance of results directory ``out`` (``{"calls": []}`` when there is none)."""
    try:
        doc = json.loads((pathlib.Path(out) / PROVENANCE).read_text())
    except (OSError, ValueError):
        return {"calls": []}
    if not isinstance(doc, dict) or not isinstance(doc.get("calls"), list):
        return {"calls": []}
    return doc


def record_call(out: str | os.PathLike, *, started: str, wall_s: float, total: int,
                skipped: int, finished: int, failed: int, workers: int,
                run_wall_s: Iterable[float] = (), command: list[str] | None = None,
                diverged: int = 0, reused: int = 0) -> dict:
    """Append one call to ``out/provenance.json`` (atomically) and return the entry.

    ``runs`` counts the call's runs; ``diverged`` and ``reused`` appear in it only when
    some run diverged or was copied from another directory (so entries of other calls
    keep their old form)."""
    from rfrs_ref.federated.trainer import software_versions

    out = pathlib.Path(out)
    doc = read_provenance(out)
    entry = {
        "started": started,
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(float(wall_s), 3),
        "runs": {"total": total, "skipped": skipped, "finished": finished, "failed": failed,
                 **({"diverged": diverged} if diverged else {}),
                 **({"reused": reused} if reused else {})},
        "run_wall_s_sum": round(float(sum(run_wall_s)), 3),
        "workers": workers,
        "command": list(sys.argv if command is None else command),
        **git_commit(),
        "machine": machine(),
        "versions": software_versions(),
    }
    doc["calls"].append(entry)
    text = json.dumps(jsonable(doc), indent=1, allow_nan=False) + "\n"
    atomic_write(out / PROVENANCE, lambda fh: fh.write(text.encode("utf-8")))
    return entry


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
