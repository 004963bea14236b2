"""What a worker does with one run: train it, and report the outcome as plain data.

:func:`execute_run` is the task a sweep sends to a Dask worker (or calls in
process). It never raises for a failure of the run itself: an exception is
caught and returned as ``status = "failed"`` with its message and traceback,
so one bad run cannot stop a sweep. A run whose model diverged
(:class:`rfrs_ref.federated.trainer.Diverged`: a non-finite server state,
non-finite scores at an evaluation, or a non-finite honest upload) is not a
failure but an outcome:
``status = "diverged"``, with ``divergence`` (the round, the reason, what was
non-finite, the last checkpoint), the evaluation ``history`` before it and the
per-round summary; it is never run again (docs/reproduction.md, "Diverged runs").
A run whose resilience sum became NaN or ±inf
(:class:`rfrs_ref.federated.trainer.NonFiniteResilience`) is a failure: its
totals are not numbers. The outcome is JSON-serialisable and holds
everything the results tables and plots need (final metrics, the evaluation
history, a per-round summary, the PCA capture of a capture run), so the
machine that collects results does not have to see the worker's files.

Run directories. When the driver and the workers share a filesystem (a
LocalCluster, or a remote cluster declared as sharing it), the trainer writes
straight into the sweep's ``runs/<key>/``; a run interrupted half-way leaves
its last checkpoint there, and the next attempt resumes from it (the determinism of
docs/training.md makes the resumed run end exactly where an uninterrupted one
ends). A directory there holding a run the sweep did not start (a ``config.json``
of another configuration) is never cleared: the run is recorded as failed,
saying so (:func:`refuse_foreign_run`). Otherwise the worker trains in a
temporary directory and returns the small files (``config.json``,
``metrics.csv``, ``final_metrics.json``) in the outcome for the driver to write;
the driver makes the same check before it sends a run anywhere, and never writes
returned files over a run of another configuration (:func:`foreign_run_outcome`).

Capture runs (Fig. 1) train ``rounds`` rounds with the trainer's pieces and,
after the last round, project the clients' uploaded θᵢ − θ̄ and the gradients
ĝᵢ the server recovers from the uploads onto their first two principal
components (:func:`pca_2d`).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import shutil
import socket
import tempfile
import time
import traceback
from typing import Any

import numpy as np

from rfrs_ref.jsonsafe import jsonable

#: files of a run directory that the outcome carries when the filesystem is not shared
SMALL_FILES = ("config.json", "metrics.csv", "final_metrics.json")

#: files removed from a finished run directory (large, and not needed by tables or plots)
LARGE_FILES = ("checkpoint.npz",)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def execute_run(task: dict) -> dict:
    """Run one task and return its outcome (never raises for a failing run).

    Args:
        task: ``{"spec": RunSpec.to_json(), "key": str, "run_dir": str | None,
            "data_dir": str | None, "keep_state": bool, "low_memory": bool}``. ``run_dir`` is the
            run's directory on a shared filesystem (None: train in a temporary
            directory); ``data_dir`` is the driver's ``RFRS_DATA_DIR``, used
            when the worker's environment has none.
    Returns:
        The outcome: ``key``, ``status`` (``ok``, ``diverged`` or ``failed``), ``error``,
        ``traceback``, ``wall_s``, ``started``, ``finished``, ``worker``,
        ``resumed_from`` and, for a finished run, ``final``, ``history``,
        ``rounds`` (per-round summary), ``capture`` (capture runs),
        ``dataset``, ``versions`` and ``files``; for a diverged run, ``error``
        (the message), ``divergence``, ``history``, ``rounds``, ``dataset``,
        ``versions`` and ``files``, and no ``final``.
    """
    started, tick = _now(), time.perf_counter()
    outcome: dict[str, Any] = {
        "key": task.get("key"), "status": "failed", "error": None, "traceback": None,
        "started": started, "worker": {"host": socket.gethostname(), "pid": os.getpid()},
        "resumed_from": None,
    }
    tmp = None
    try:
        from rfrs_ref.experiments.spec import RunSpec

        if task.get("data_dir") and not os.environ.get("RFRS_DATA_DIR"):
            os.environ["RFRS_DATA_DIR"] = task["data_dir"]
        spec = RunSpec.from_json(task["spec"])
        if task.get("run_dir"):
            run_dir = pathlib.Path(task["run_dir"])
        else:
            tmp = tempfile.mkdtemp(prefix="rfrs-run-")
            run_dir = pathlib.Path(tmp) / "run"
        if spec.kind == "capture":
            result = _capture(spec, run_dir)
        else:
            result = _train(spec, run_dir, keep_state=bool(task.get("keep_state")),
                            low_memory=bool(task.get("low_memory")))
        status = result.pop("status", "ok")
        outcome.update(result)
        if tmp is not None:
            outcome["files"] = {name: (run_dir / name).read_text() for name in SMALL_FILES
                                if (run_dir / name).exists()}
        outcome["status"] = status
    except BaseException as exc:  # noqa: BLE001 - the whole point is to report any failure
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        outcome["error"] = f"{type(exc).__name__}: {exc}"
        outcome["traceback"] = traceback.format_exc()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    outcome["finished"] = _now()
    outcome["wall_s"] = time.perf_counter() - tick
    return outcome


# -- ordinary runs ------------------------------------------------------------------------
def _same_config(run_dir: pathlib.Path, spec) -> bool:
    """Whether ``run_dir`` holds a run of exactly this configuration (non-result fields and
    the trace flag aside: ``train --resume`` of the sweep's run may add a trace)."""
    from rfrs_ref.experiments.spec import NON_RESULT_FIELDS

    try:
        recorded = json.loads((run_dir / "config.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if not isinstance(recorded, dict):
        return False
    ours = spec.config.resolved().to_json()
    for name in (*NON_RESULT_FIELDS, "trace"):
        recorded.pop(name, None)
        ours.pop(name, None)
    return json.loads(json.dumps(recorded)) == json.loads(json.dumps(ours))


def refuse_foreign_run(run_dir: pathlib.Path, spec) -> None:
    """Raise ValueError when ``run_dir`` holds a run that is not this sweep run's: a
    ``config.json`` (a run's first file) of another configuration, or one that cannot be
    read (the trainer writes it atomically). A sweep clears or overwrites its run's
    directory when the run starts again, and must never take another run with it (a
    ``train --out`` into ``runs/<key>`` by an earlier version, a directory copied there):
    the run is recorded as failed with this reason, and everything is left as it is.
    Anything else there (the sweep's own files, a failure's ``outcome.json``) is the
    run's to clear."""
    path = run_dir / "config.json"
    if (path.exists() or path.is_symlink()) and not _same_config(run_dir, spec):
        raise ValueError(f"{run_dir} holds a run that is not this sweep's run {spec.key} (its "
                         "config.json records another configuration, or cannot be read); a "
                         "sweep never removes a run it did not start: move the directory out "
                         "of the results directory and run the sweep again")


def foreign_run_outcome(run_dir: pathlib.Path, spec) -> dict | None:
    """The failed outcome of run ``spec`` whose directory ``run_dir`` holds a run that is
    not its own (:func:`refuse_foreign_run`, its reason as the error), or None when the
    directory is the run's. The driver records it without dispatching the run, and
    records it in place of an outcome whose returned files would overwrite that run's."""
    try:
        refuse_foreign_run(run_dir, spec)
    except ValueError as exc:
        now = _now()
        return {"key": spec.key, "status": "failed", "error": f"{type(exc).__name__}: {exc}",
                "traceback": None, "started": now, "finished": now, "wall_s": 0.0,
                "worker": {"host": socket.gethostname(), "pid": os.getpid()},
                "resumed_from": None}
    return None


def _clear(run_dir: pathlib.Path, lock) -> None:
    """Remove everything in ``run_dir`` but its lock file (which its holder, this
    process, keeps open: removing it would let another process lock a new one).

    Only the directory ``lock`` (a held :class:`~rfrs_ref.files.DirectoryLock`) owns is
    cleared: ``run_dir`` is opened without following a link at its name, its entries
    are removed relative to that open directory (never through a link inside it), and
    its ``.lock`` must be the file ``lock`` holds. A link or another directory put at
    the name after the caller checked it (the run directory moved away meanwhile) is
    refused with ``ValueError`` and nothing is removed: clearing by the name removed
    whatever directory the name had come to reach."""
    import stat

    from rfrs_ref.files import LOCK_NAME

    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
    refuse = (f"{run_dir} is no longer the run directory this run locked (a link or another "
              "directory was put at its name after the lock was taken); nothing was removed: "
              "put the run directory back, or remove what is there, and run the sweep again")
    try:
        fd = os.open(run_dir, flags)
    except OSError:
        raise ValueError(refuse) from None
    try:
        if not lock.holds(fd):
            raise ValueError(refuse)
        with os.scandir(fd) as entries:
            names = [e.name for e in entries if e.name != LOCK_NAME]
        for name in names:
            if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                shutil.rmtree(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)


def _train(spec, run_dir: pathlib.Path, keep_state: bool, low_memory: bool = False) -> dict:
    from rfrs_ref.federated.trainer import Trainer
    from rfrs_ref.files import DirectoryLock

    if run_dir.is_symlink():
        # a run that starts again clears its directory: through a link, that would remove
        # the files of whatever directory it points to
        raise ValueError(f"{run_dir} is a link (to {os.readlink(run_dir)}), not a run "
                         "directory of this sweep; remove the link and run the sweep again")
    trainer = Trainer(spec.config, low_memory=low_memory)
    # The run directory is this process's before anything in it is read or removed: a
    # `train --resume` (or any holder) working there meanwhile is refused, not wiped
    # out from under it (the run is then recorded as failed, naming the holder).
    with DirectoryLock(run_dir) as lock:
        return _train_locked(spec, trainer, run_dir, keep_state, low_memory, lock)


def _train_locked(spec, trainer, run_dir: pathlib.Path, keep_state: bool,
                  low_memory: bool, lock) -> dict:
    from rfrs_ref.federated.trainer import Diverged, NonFiniteResilience, Trainer

    resume = (run_dir / "checkpoint.npz").exists() and _same_config(run_dir, spec)
    resumed_from = None
    result = None
    try:
        if resume:
            try:
                from rfrs_ref.files import open_input

                # a FIFO or a device at the checkpoint's name is no checkpoint (a ValueError
                # here): np.load of a FIFO waits for a writer for ever
                with open_input(run_dir / "checkpoint.npz", "checkpoint") as fh, \
                        np.load(fh, allow_pickle=False) as z:
                    resumed_from = int(z["round"])
                result = trainer.run(run_dir, resume=True, locked=True)
            except (Diverged, NonFiniteResilience):
                raise  # the run's own outcome, not an unreadable checkpoint
            except Exception:  # noqa: BLE001 - an unreadable checkpoint: start again from scratch
                resumed_from, result = None, None
                trainer = Trainer(spec.config, low_memory=low_memory)
        if result is None:
            refuse_foreign_run(run_dir, spec)
            _clear(run_dir, lock)
            result = trainer.run(run_dir, locked=True)
    except Diverged as exc:
        # an outcome, not a failure: the run is finished, its checkpoint no longer needed
        for name in LARGE_FILES:
            (run_dir / name).unlink(missing_ok=True)
        return {
            "status": "diverged",
            # without the run directory's path (this host's) and its checkpoint, removed above
            "error": f"{type(exc).__name__}: {exc.plain}",
            "resumed_from": resumed_from,
            "divergence": jsonable(exc.record()),
            "history": _history(exc.history),
            "rounds": read_round_summary(run_dir / "rounds.jsonl"),
            "dataset": _dataset_record(trainer),
            "versions": _versions(),
        }
    for name in LARGE_FILES + (() if keep_state else ("state.npz",)):
        (run_dir / name).unlink(missing_ok=True)
    return {
        "resumed_from": resumed_from,
        "final": jsonable(result.final),
        "history": _history(result.history),
        "rounds": read_round_summary(run_dir / "rounds.jsonl"),
        "dataset": _dataset_record(trainer),
        "versions": _versions(),
    }


def _history(rows) -> list[dict]:
    """Evaluation rows reduced to round and metrics (a resumed run's rows, read back from
    metrics.csv, carry nothing else, so every run's history has the same fields)."""
    return jsonable([{k: v for k, v in row.items()
                       if k == "round" or k.startswith(("precision@", "recall@", "ndcg@", "hr@", "mrr@"))}
                      for row in rows])


def _dataset_record(trainer) -> dict:
    from rfrs_ref.federated.population import clients_per_round

    return {"name": trainer.data.name, "users": trainer.data.n_users,
            "items": trainer.data.n_items, "interactions": trainer.data.n_interactions,
            "clients_per_round": clients_per_round(trainer.data.n_users,
                                                   trainer.config.client_fraction),
            "byzantine_clients": int(trainer.byzantine.sum()),
            "evaluated_clients": int(trainer.eval_users.size)}


def _versions() -> dict:
    from rfrs_ref.federated.trainer import software_versions

    return software_versions()


def summarise_round(rec: dict) -> dict:
    """The part of a round record the tables and plots use."""
    out = {
        "round": rec["round"],
        "loss": rec.get("loss"),
        "f": rec.get("f"),
        "n_byzantine_sampled": rec.get("n_byzantine_sampled"),
        "n_byzantine_kept": rec.get("n_byzantine_kept"),
        "byzantine_share_kept": rec.get("byzantine_share_kept"),
        "excluded": len(rec.get("excluded") or ()),
        "seconds": float(sum((rec.get("timing") or {}).values())),
    }
    if rec.get("resilience"):
        # a term that was NaN or ±inf is null in the record (the run is recorded as failed)
        out["resilience"] = {k: None if v is None else float(v)
                             for k, v in rec["resilience"].items()}
    return out


def read_round_summary(path: pathlib.Path) -> list[dict]:
    """Per-round summaries from a run's rounds.jsonl (a record cut short ends the list)."""
    out = []
    if not path.exists():
        return out
    with open(path) as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                out.append(summarise_round(json.loads(line)))
            except (ValueError, KeyError):
                break
    return jsonable(out)


# -- capture runs (Fig. 1) ---------------------------------------------------------------
def pca_2d(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates of the rows of X on their first two principal components.

    Formula: Xc = X − mean(X) (float64); the eigenvectors u₁, u₂ of Xc·Xcᵀ
    with the two largest eigenvalues λ₁ ≥ λ₂ give the coordinates
    (√λ₁·u₁, √λ₂·u₂), which equal Xc·w₁, Xc·w₂ for the principal directions wₖ.
    Working with the n × n Gram matrix of the centred rows costs n²·D, and
    centring first in float64 keeps the small differences between rows.

    Conventions: each component's sign makes its largest-magnitude coordinate
    positive (the sign of a principal component is arbitrary), magnitudes
    within 1e-9 of the largest counting as ties, won by the first row (so
    rounding cannot flip a symmetric cloud); eigenvalues
    below 16·n·ε·λ₁ (rounding noise) count as 0.

    Returns:
        ``(coords (n, 2), explained (2,))``, explained being λₖ / Σλ (0 when
        every row is the same). Rows must be finite; n ≥ 1.
    """
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[0] < 1:
        raise ValueError(f"pca_2d needs an (n, D) array with n >= 1, got shape {X.shape}")
    if not np.isfinite(X).all():
        bad = np.flatnonzero(~np.isfinite(X).all(axis=1))
        raise ValueError(f"pca_2d needs finite rows; rows {bad.tolist()} hold NaN or inf")
    Xc = X.astype(np.float64) - X.astype(np.float64).mean(axis=0)
    gram = Xc @ Xc.T
    lam, u = np.linalg.eigh(gram)
    order = np.argsort(lam)[::-1]
    lam = np.clip(lam[order], 0.0, None)
    u = u[:, order]
    n = X.shape[0]
    # eigenvalues at the rounding level of the largest are zero variance, not directions
    lam[lam <= 16 * n * np.finfo(np.float64).eps * lam[0]] = 0.0
    coords = np.zeros((n, 2))
    k = min(2, n)
    coords[:, :k] = u[:, :k] * np.sqrt(lam[:k])
    for j in range(2):
        mag = np.abs(coords[:, j])
        i = int(np.flatnonzero(mag >= mag.max() * (1 - 1e-9))[0])
        if coords[i, j] < 0:
            coords[:, j] = -coords[:, j]
    total = lam.sum()
    explained = np.zeros(2)
    if total > 0:
        explained[:k] = lam[:k] / total
    return coords, explained


def separation(X: np.ndarray, byz: np.ndarray) -> float | None:
    """Between-class over within-class spread of the rows of X, Byzantine vs benign.

    Formula: ‖μ_B − μ_H‖² / (mean_{i∈B} ‖xᵢ − μ_B‖² + mean_{i∈H} ‖xᵢ − μ_H‖²),
    float64; large: the two groups are far apart relative to their own spread.
    None when one of the groups is empty or both have no spread.
    """
    X = np.asarray(X, dtype=np.float64)
    byz = np.asarray(byz, dtype=bool)
    if byz.all() or not byz.any():
        return None
    mb, mh = X[byz].mean(axis=0), X[~byz].mean(axis=0)
    within = (((X[byz] - mb) ** 2).sum(axis=1).mean() + ((X[~byz] - mh) ** 2).sum(axis=1).mean())
    if within == 0:
        return None
    return float(((mb - mh) ** 2).sum() / within)


#: the files a capture run writes into its directory, in the order it writes them:
#: ``final_metrics.json`` last, so that its presence says the others are whole
CAPTURE_FILES = ("config.json", "capture.npz", "capture.json", "final_metrics.json")


def _capture(spec, run_dir: pathlib.Path) -> dict:
    """Train ``rounds`` rounds and project the last round's uploads and recovered gradients."""
    from rfrs_ref.files import DirectoryLock

    if run_dir.is_symlink():
        # the run clears its directory before it starts (as _train does): through a link,
        # that would remove the files of whatever directory it points to
        raise ValueError(f"{run_dir} is a link (to {os.readlink(run_dir)}), not a run "
                         "directory of this sweep; remove the link and run the sweep again")
    # the run directory is this process's before anything in it is read or written, as for
    # a training run (_train): a directory another process holds is refused, untouched
    with DirectoryLock(run_dir) as lock:
        return _capture_locked(spec, run_dir, lock)


def _capture_locked(spec, run_dir: pathlib.Path, lock) -> dict:
    from rfrs_ref.federated.round import run_round
    from rfrs_ref.federated.trainer import Trainer
    from rfrs_ref.files import atomic_write

    refuse_foreign_run(run_dir, spec)  # its config.json and final_metrics.json are rewritten
    trainer = Trainer(spec.config)
    # an earlier attempt's files (one stopped half-way: a capture.npz without the
    # final_metrics.json that ends a capture) never stand beside this attempt's
    _clear(run_dir, lock)
    c = trainer.config
    started = time.perf_counter()
    state, private = trainer.initial_state()
    buf = trainer.buffers(full=True)  # the uploads are read after each round
    summaries = []
    prev = state
    record = None
    for t in range(1, c.rounds + 1):
        prev = state
        state, record = run_round(trainer.federation, state, t, buf, private)
        summaries.append(summarise_round(record))
    t = c.rounds
    excluded = {e["client"] for e in record["excluded"]}
    clients = np.asarray(record["clients"])
    ok = np.array([cl not in excluded for cl in clients], dtype=bool)
    m = int(ok.sum())
    byz = np.asarray(record["byzantine"], dtype=bool)[ok]
    # after the round, rows that passed verification are the first m rows of the buffers
    uploads = {k: buf.uploads[k][:m] for k in trainer.optimizer.arrays}
    theta_feat = uploads["theta"].astype(np.float64) - prev["theta"].astype(np.float64)
    grads = np.empty((m, prev["theta"].size), dtype=np.float64)
    trainer.optimizer.recover_batch(prev, uploads, t, grads,
                                    backend="numpy" if c.backend == "numpy" else "numba")
    theta_xy, theta_ev = pca_2d(theta_feat)
    grad_xy, grad_ev = pca_2d(grads)
    capture = {
        "round": t,
        "clients": clients[ok].tolist(),
        "byzantine": byz.tolist(),
        "theta_pca": theta_xy.tolist(),
        "theta_explained": theta_ev.tolist(),
        "gradient_pca": grad_xy.tolist(),
        "gradient_explained": grad_ev.tolist(),
        "separation": {"theta": separation(theta_feat, byz), "gradient": separation(grads, byz),
                       "theta_pca": separation(theta_xy, byz),
                       "gradient_pca": separation(grad_xy, byz)},
    }
    pop = trainer.popularity()
    metrics = trainer.evaluate(state, private)
    kmax = max(c.ks)
    model = metrics.as_dict()
    popd = pop.as_dict()
    final = {"round": t, "model": model, "popularity": popd,
             "beats_popularity": model[f"precision@{kmax}"] > popd[f"precision@{kmax}"],
             "seconds": time.perf_counter() - started}
    # each file is written beside its name and renamed over it (a crash or a full disk
    # mid-write leaves no part of one), final_metrics.json last (CAPTURE_FILES)
    texts = {"config.json": json.dumps({"config": c.to_json()}, indent=2) + "\n",
             "capture.json": json.dumps(jsonable(capture), allow_nan=False) + "\n",
             "final_metrics.json": json.dumps(jsonable(final), indent=2, allow_nan=False) + "\n"}
    for name in CAPTURE_FILES:
        if name == "capture.npz":
            atomic_write(run_dir / name, lambda fh: np.savez(
                fh, byzantine=byz, theta_pca=theta_xy, gradient_pca=grad_xy,
                clients=clients[ok]))
        else:
            atomic_write(run_dir / name, lambda fh, text=texts[name]: fh.write(text.encode()))
    return {
        "final": jsonable(final),
        "history": _history([{"round": t, **model}]),
        "rounds": jsonable(summaries),
        "capture": jsonable(capture),
        "dataset": _dataset_record(trainer),
        "versions": _versions(),
    }
