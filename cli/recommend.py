"""``rfrs-ref recommend``: a user's top-K items from a trained run, by name."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import zipfile

import click

from rfrs_ref.cli.train import _one_line


@click.command("recommend")
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--user", "-u", "user", type=int, required=True,
              help="The user's id in the dataset's own files (MovieLens u.data, Last.fm "
                   "user_artists.dat; CiteULike: the line of users.dat, from 0; synthetic: 0..).")
@click.option("-k", "k", type=click.IntRange(min=1), default=10, show_default=True,
              help="How many items.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Directory holding the dataset's folder, e.g. DIR for DIR/ml-100k/ "
                   "[default: the run's, else RFRS_DATA_DIR, the cache].")
@click.option("--include-seen", is_flag=True,
              help="Also rank the user's training items (excluded by default, as in evaluation).")
def recommend(run_dir, user, k, data_dir, include_seen):
    """Print USER's top-K items under the final model of the run in RUN_DIR.

    Items are ranked by the model's scores exactly as evaluation ranks them
    (docs/training.md, "Evaluation"): the user's training items left out, ties
    to the smaller item id. Each line gives the rank, the score, the item's id
    in the dataset's files and its name where the dataset has names
    (MovieLens titles from u.item, Last.fm artists from artists.dat);
    [test item] marks the items the split held out, [target] the target
    items of an attack that has them (--attack a-ra).

    \b
    Example:
      rfrs-ref train --dataset ml100k --rounds 300 --out runs/ml100k
      rfrs-ref recommend runs/ml100k --user 1 -k 10
    """
    import numpy as np

    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.kernels.topk import topk_numpy
    from rfrs_ref.untrusted import parse_json

    run = pathlib.Path(run_dir)
    raw = _run_file(run / "config.json", "run's configuration (config.json)")
    if raw is None:
        raise click.ClickException(
            f"{run}: no run here (no config.json); give the directory `rfrs-ref train` wrote "
            "(its --out, e.g. runs/ml100k, or the runs/<time>-<dataset> it printed)")
    try:
        record = parse_json(raw, "config.json")
        _check_config(record["config"])
        config = TrainConfig.from_json(record["config"])
    except (ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"{run / 'config.json'}: not a run's configuration "
                                   f"({_one_line(exc)})")
    _refuse_too_large(run / "config.json", config)
    _check_data_files(run / "config.json", record.get("data_files"))
    state_path = run / "state.npz"
    state = _run_file(state_path, "run's final state (state.npz)", opened=True)
    if state is None:
        try:
            final = parse_json(_run_file(run / "final_metrics.json", "run's final metrics")
                               or b"", "final_metrics.json")
        except ValueError:
            final = None
        if isinstance(final, dict) and final.get("status") == "diverged":
            raise click.ClickException(
                f"{run}: the run diverged at round {final.get('round')} ({final.get('reason')}: "
                f"{final.get('what')}); it has no final model, so there is nothing to recommend")
        holder = _training_now(run)
        if holder is not None:  # resuming it now would be refused as "in use"
            raise click.ClickException(
                f"{state_path}: the run has no final state yet: it is still training "
                f"({holder}); ask again once it has finished")
        if (isinstance(final, dict) and type(final.get("round")) is int
                and not (run / "checkpoint.npz").exists()):
            # a sweep's or a reproduction's run: finished, its state dropped (--keep-state keeps
            # it); --resume would answer that there is nothing to resume
            raise click.ClickException(
                f"{state_path}: the run finished (round {final['round']}) without keeping its "
                "final state: a sweep or a reproduction keeps each run's state.npz only with "
                "--keep-state. To ask its model for recommendations, run it again from its "
                "config.json into a directory DIR of your own: python -c \"from "
                "rfrs_ref.federated.trainer import Trainer, load_config; "
                f"Trainer(load_config({str(run)!r})).run('DIR')\", then "
                "`rfrs-ref recommend DIR`")
        raise click.ClickException(f"{state_path}: the run has no final state (it has not "
                                   f"finished); finish it with `rfrs-ref train --resume {run}`")
    if data_dir is not None:
        config.data_dir = data_dir
    config.backend = "numpy"  # one user: the oracle is fast enough and needs no compilation
    trainer = _trainer(config, record, run / "config.json")
    try:
        users, items = _checked_ids(run, trainer)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise click.ClickException(f"{run / 'ids.npz'}: unreadable ({_one_line(exc)})") from None
    where = np.flatnonzero(users == user)
    if where.size == 0:
        lo, hi = int(users.min()), int(users.max())
        raise click.BadParameter(f"user {user} is not in {config.dataset} (its user ids run "
                                 f"from {lo} to {hi}, {users.size} users)", param_hint="--user")
    u = int(where[0])
    from rfrs_ref.federated.trainer import first_non_finite

    try:
        # from the headers first, on the file itself: a file claiming more values than the
        # model has is refused before anything of it is read into memory
        with state:
            _check_state_headers(state, trainer)
            state.seek(0)
            with np.load(state, allow_pickle=False) as z:
                arrays = {name: z[name] for name in z.files}
        theta, final_round = arrays["theta"], _final_round(arrays["round"])
        private = arrays.get("private_theta")
        # every array, not only this user's scores: a state holding NaN or ±inf anywhere (an
        # optimiser moment, another user's private vector) is no finished run's model
        bad = first_non_finite(arrays)
        if bad is not None:
            raise click.ClickException(
                f"{state_path}: {bad[0]!r} holds {bad[1]} NaN or ±inf value(s) of {bad[2]}; "
                "not the state of a run that finished, so there is nothing to recommend")
        scores = trainer.model.scores(theta, trainer.split.train, np.array([u]),
                                      private=private, backend="numpy")
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:  # damaged
        raise click.ClickException(f"{state_path}: not the final state of this run "
                                   f"({_one_line(exc)})") from None
    if not np.isfinite(scores).all():
        raise click.ClickException(f"{state_path}: the model's scores hold NaN or infinity "
                                   "(the run diverged); there is nothing to recommend")
    seen = trainer.split.train.items_of(u)
    excl = np.zeros(0, np.int64) if include_seen else seen.astype(np.int64)
    k = min(k, trainer.data.n_items - excl.size)
    top = topk_numpy(scores, np.array([0, excl.size]), excl, k)[0]
    names = _names(trainer.config)  # the folder the data was found in (the run's, if need be)
    click.echo(f"{config.dataset} user {user}: {seen.size} training items, "
               f"{trainer.split.test.counts()[u]} test items; top {k} of the model after round "
               f"{final_round}" + ("" if include_seen else " (training items left out)"))
    test = set(trainer.split.test.items_of(u).tolist())
    targets = _target_items(record, trainer.data.n_items)
    for rank, j in enumerate(top, 1):
        name = names[j] if names is not None else ""
        mark = ("  [test item]" if j in test else "") + ("  [target]" if j in targets else "")
        click.echo(f"{rank:>3}  {scores[0, j]: .4f}  item {int(items[j])}"
                   + (f"  {name}" if name else "") + mark)


def _target_items(record, n_items: int) -> set:
    """The dense indices of the run's target items (``derived.target_items`` of config.json,
    written by an attack with targets such as ``a-ra``); empty for a run without any, or
    where the record holds anything but item indices."""
    derived = record.get("derived") if isinstance(record, dict) else None
    got = derived.get("target_items") if isinstance(derived, dict) else None
    if not isinstance(got, list) or not all(type(t) is int and 0 <= t < n_items for t in got):
        return set()
    return set(got)


#: the most bytes a run's JSON file (config.json, final_metrics.json) can hold: the trainer
#: writes a few kilobytes; a larger file is refused before it is read into memory
JSON_MAX_BYTES = 1 << 24


def _run_file(path: pathlib.Path, what: str, opened: bool = False):
    """The bytes of the run's own file at ``path`` (``opened``: the file, open, for the
    caller to read as it needs and close), or None when there is none. Refused in one line
    naming it: a link (the run's files are read as they are inside its directory, never
    from wherever a link leads), anything but a regular file (a FIFO would wait for a
    writer for ever, a device be read without end), and, read whole, a file of more than
    :data:`JSON_MAX_BYTES` (a sparse file of terabytes would take all memory)."""
    from rfrs_ref.experiments.results import read_input
    from rfrs_ref.files import open_input

    try:
        if opened:
            return open_input(path, what, links=False)
        return read_input(path, what, links=False, max_bytes=JSON_MAX_BYTES)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise click.ClickException(" ".join(str(exc).split())) from None
    except OSError as exc:
        raise click.ClickException(f"{path}: cannot read the {what} "
                                   f"({exc.strerror or exc})") from None


def _check_config(cfg) -> None:
    """ValueError naming the field (``config.seed must be ...``) unless every field of a run's
    recorded configuration is a value of its kind and range, as a sweep file's are
    (:func:`rfrs_ref.experiments.spec.check_field`, ``check_params``): a forged value (a
    seed of 1.5, a list as the dataset) would otherwise rank under a split no run made or
    end in a traceback."""
    from rfrs_ref.experiments.spec import CONFIG_FIELDS, check_field, check_params

    if not isinstance(cfg, dict):
        raise ValueError(f"config is {type(cfg).__name__}, expected an object of fields")
    for name, value in cfg.items():
        if name in CONFIG_FIELDS:  # an unknown one is TrainConfig.from_json's to name
            check_field(name, value, "config.")
    check_params(cfg, {f"{f}.{k}": f"config.{f}.{k}" for f in cfg
                       if f.endswith("_params") and isinstance(cfg[f], dict)
                       for k in cfg[f]})


def _refuse_too_large(path: pathlib.Path, config) -> None:
    """A recorded configuration whose run could not fit in this machine's memory (a forged
    ``n_users`` of 10⁸: the data generated for it had the process killed, without a word) is
    refused in one line naming the field, before the dataset is built (``train``'s limit,
    :func:`rfrs_ref.cli.train.memory_limit`)."""
    from rfrs_ref.cli.train import memory_limit
    from rfrs_ref.experiments.sweep import RunTooLarge, check_size

    try:
        check_size(config, *memory_limit())
    except RunTooLarge as exc:
        raise click.ClickException(f"{path}: config.{exc.field} = {exc.value}{exc.reason}; "
                                   "not the configuration of a run that finished here") from None


def _training_now(run: pathlib.Path) -> str | None:
    """Who holds ``run``'s lock (``process 123 on host``) while a process trains it, else
    None. Read only: the lock file is opened, never made, and a shared ``flock`` tried on
    it, which a live run's exclusive lock refuses."""
    import fcntl
    import os

    from rfrs_ref.files import LOCK_NAME, DirectoryLock

    try:
        fd = os.open(run / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return DirectoryLock(run)._holder()
    except OSError:
        return None
    finally:
        os.close(fd)  # releases the shared lock, if it was taken
    return None


def _final_round(a) -> int:
    """The round of ``state.npz`` (``round``, one integer ≥ 0, as the trainer writes it), or a
    ValueError saying what it is instead: a round of 2.7 is no round to round down."""
    import numpy as np

    a = np.asarray(a)
    if a.dtype.kind not in "iu" or a.size != 1 or int(a.reshape(-1)[0]) < 0:
        shown = a.reshape(-1)[0].item() if a.size == 1 else f"{a.size} values"
        raise ValueError(f"'round' is {a.dtype}{list(a.shape)} ({shown!r}), not the one "
                         "integer ≥ 0 the trainer writes (the round the state is after)")
    return int(a.reshape(-1)[0])


def _recorded_data_dir(recorded):
    """The data directory (the parent of the dataset's folder) of the files a run's
    config.json records, when every one of them is still there; None otherwise."""
    if not isinstance(recorded, list) or not recorded:
        return None
    try:
        paths = [pathlib.Path(f["path"]) for f in recorded]
    except (KeyError, TypeError):
        return None
    roots = {p.parent.parent for p in paths}
    try:
        if len(roots) != 1 or not all(p.is_file() for p in paths):
            return None
    except (OSError, ValueError):  # a path the system refuses (too long, a NUL): not there
        return None
    return roots.pop()


def _trainer(config, record, config_path):
    """The run's trainer (its data, split and model), the dataset read from disk only:
    ``--data-dir``, else ``RFRS_DATA_DIR`` and the cache, else the folder config.json
    records. Nothing is downloaded: a tool asked about a run that someone handed over does
    not fetch data over the network on that run's say (``rfrs-ref data fetch NAME`` does,
    and the message says so)."""
    from rfrs_ref.data import load_dataset
    from rfrs_ref.federated.trainer import Trainer
    from rfrs_ref.provenance import data_files

    from rfrs_ref.data.errors import DatasetNotFoundError, DownloadError

    recorded = record.get("data_files")

    def build(cfg):
        c = cfg.resolved()
        return Trainer(cfg, data=load_dataset(c.dataset, c.data_dir, download=False,
                                              **c.dataset_params))

    try:
        trainer = build(config)
    except (DatasetNotFoundError, DownloadError) as exc:
        # not where the loader looks (another shell, RFRS_DATA_DIR unset): the folder the
        # run read it from, as config.json records it, if it is still there (the sha256
        # check below then proves it the same data)
        here = _recorded_data_dir(recorded)
        if here is None:
            raise click.ClickException(" ".join(str(exc).split())) from None
        click.echo(f"(the dataset from the folder the run read it from: {here})")
        config = dataclasses.replace(config, data_dir=str(here))
        try:
            trainer = build(config)
        except (ValueError, KeyError, OSError, RuntimeError) as exc2:
            raise click.ClickException(" ".join(str(exc2).split())) from exc2
    except (ValueError, KeyError, FileNotFoundError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    except MemoryError:  # a configuration whose data or model no memory holds
        raise click.ClickException(
            f"{config_path}: the dataset cannot be built: the configuration's data or model "
            "do not fit in memory; not the configuration of a run that finished") from None
    # the split, hence the training items left out, must be the run's: same data file
    if isinstance(recorded, list) and recorded:
        try:
            now = {f["file"]: f["sha256"] for f in data_files(config.dataset, config.data_dir)}
        except Exception:  # noqa: BLE001
            now = {}
        for f in recorded:
            if f["file"] in now and now[f["file"]] != f["sha256"]:
                raise click.ClickException(
                    f"{f['file']}: sha256 {now[f['file']]} differs from the run's "
                    f"{f['sha256']}; give the run's data with --data-dir")
    return trainer


def _check_data_files(path: pathlib.Path, recorded) -> None:
    """``data_files`` of a run's config.json: a list of ``{"file", "path", "sha256", ...}``
    objects with string values (or, for data that a caller handed in, a string saying it is
    unknown). Anything else is a one-line error naming config.json: the entries decide which
    folder the data is read from and prove it the run's data, so a malformed one is never
    skipped."""
    if recorded is None or isinstance(recorded, str):
        return
    if not isinstance(recorded, list):
        raise click.ClickException(f"{path}: data_files is {type(recorded).__name__} "
                                   f"{_short(recorded)}, expected a list of files")
    for i, f in enumerate(recorded):
        bad = (not isinstance(f, dict)
               or not all(isinstance(f.get(k), str) for k in ("file", "path", "sha256")))
        if bad:
            raise click.ClickException(
                f"{path}: data_files[{i}] is {_short(f)}, expected an object with the strings "
                "\"file\", \"path\" and \"sha256\"")


def _short(value) -> str:
    text = " ".join(json.dumps(value, default=str).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _check_state_headers(fh, trainer) -> None:
    """Refuse a ``state.npz`` (its bytes in ``fh``) holding an array this run's final state
    cannot hold, from the arrays' .npy headers alone, before any array is read: an array of
    another name, or one larger than the model's (θ and the optimiser's and rule's arrays
    have the model's n_params values; a private array one row of at most the model's
    dimension per user; ``round`` one value). So a file with a huge extra array is refused,
    not loaded."""
    D = trainer.model.n_params()
    private_max = trainer.data.n_users * max(1, int(getattr(trainer.model, "dim", 1)))
    limits = {name: D for name in (*trainer.optimizer.arrays,
                                   *getattr(trainer.rule, "state_arrays", ()))}
    limits["round"] = 1
    _check_npz_headers(fh, limits, "this run's final state",
                       private_max if trainer.model.has_private else None)


def _check_npz_headers(fh, limits: dict, what: str, private_max: int | None = None) -> None:
    """ValueError unless every array of the .npz in ``fh`` is named in ``limits`` (or, with
    ``private_max``, starts with ``private_``) and its header claims at most that many
    values; read from the headers alone, so that a header claiming terabytes (a few bytes
    of a zip) is refused before anything is allocated."""
    import numpy as np

    with zipfile.ZipFile(fh) as zf:
        for info in zf.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            limit = limits.get(name)
            if limit is None and name.startswith("private_") and private_max is not None:
                limit = private_max
            if limit is None:
                raise ValueError(f"array {name!r} is no array of {what}")
            with zf.open(info) as member:
                version = np.lib.format.read_magic(member)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(member)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(member)
            count = 1
            for n in shape:
                count *= int(n)
            if dtype.hasobject or count > limit:
                raise ValueError(f"array {name!r} is {dtype}{list(shape)}, more than the "
                                 f"{limit} value(s) {what} holds there")


def _ids(run: pathlib.Path, trainer):
    """(user_ids, item_ids) of ids.npz, or None when the run has none (made before ids.npz
    existed)."""
    import numpy as np

    fh = _run_file(run / "ids.npz", "run's ids (ids.npz)", opened=True)
    if fh is None:
        return None
    with fh:
        # from the headers first: a few bytes claiming 10^11 ids are refused, not allocated
        _check_npz_headers(fh, {"user_ids": trainer.data.n_users,
                                "item_ids": trainer.data.n_items},
                           "the run's ids (one per user and item of the dataset)")
        fh.seek(0)
        with np.load(fh, allow_pickle=False) as z:
            return z["user_ids"], z["item_ids"]


def _checked_ids(run: pathlib.Path, trainer):
    """The dataset's own user and item ids of the run's dense ids.

    The mapping is a function of the data file, so it is computed from the dataset
    (:func:`rfrs_ref.provenance.dataset_ids`); the run's ``ids.npz`` must hold exactly
    those ids (integer arrays of the dataset's sizes, no id twice, equal element by
    element). An ``ids.npz`` that differs is refused naming it: a user's list printed
    under another user's id, or items labelled with ids that disagree with their names,
    would be a wrong answer, not a damaged file."""
    import numpy as np

    from rfrs_ref.provenance import dataset_ids

    path = run / "ids.npz"
    want_u, want_i = dataset_ids(trainer.config.dataset, trainer.data, trainer.config.data_dir)
    stored = _ids(run, trainer)
    if stored is None:
        return want_u, want_i
    users, items = stored
    if users.shape != (trainer.data.n_users,) or items.shape != (trainer.data.n_items,):
        raise click.ClickException(f"{path}: {users.size} users and {items.size} "
                                   f"items, but the dataset has {trainer.data.n_users} and "
                                   f"{trainer.data.n_items}; the file is not this run's")
    for what, got, want in (("user_ids", users, want_u), ("item_ids", items, want_i)):
        if got.dtype.kind not in "iu":
            raise click.ClickException(f"{path}: {what} is {got.dtype}, expected integer ids "
                                       "(the dataset's own ids); the file is not this run's")
        if np.unique(got).size != got.size:
            raise click.ClickException(f"{path}: {what} holds an id more than once; the file "
                                       "is not this run's")
        differ = np.flatnonzero(got != want)
        if differ.size:
            j = int(differ[0])
            raise click.ClickException(
                f"{path}: {what}[{j}] is {int(got[j])}, but the dataset's id there is "
                f"{int(want[j])} ({differ.size} such); the file is not this run's")
    return want_u, want_i


def _names(config):
    from rfrs_ref.data.datasets import load_item_names

    try:
        return load_item_names(config.dataset, config.data_dir)
    except Exception:  # noqa: BLE001 - names are a nicety: ids are always shown
        return None
