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
              help="Directory holding the dataset [default: the run's, else RFRS_DATA_DIR, "
                   "the cache].")
@click.option("--include-seen", is_flag=True,
              help="Also rank the user's training items (excluded by default, as in evaluation).")
def recommend(run_dir, user, k, data_dir, include_seen):
    """Print USER's top-K items under the final model of the run in RUN_DIR.

    Items are ranked by the model's scores exactly as evaluation ranks them
    (docs/training.md, "Evaluation"): the user's training items left out, ties
    to the smaller item id. Each line gives the rank, the score, the item's id
    in the dataset's files and its name where the dataset has names
    (MovieLens titles from u.item, Last.fm artists from artists.dat).

    \b
    Example:
      rfrs-ref train --dataset ml100k --rounds 300 --out runs/ml100k
      rfrs-ref recommend runs/ml100k --user 1 -k 10
    """
    import numpy as np

    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.kernels.topk import topk_numpy

    run = pathlib.Path(run_dir)
    try:
        record = json.loads((run / "config.json").read_text())
        config = TrainConfig.from_json(record["config"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"{run / 'config.json'}: not a run's configuration ({exc})")
    state_path = run / "state.npz"
    if not state_path.is_file():
        try:
            final = json.loads((run / "final_metrics.json").read_text())
        except (OSError, ValueError):
            final = None
        if isinstance(final, dict) and final.get("status") == "diverged":
            raise click.ClickException(
                f"{run}: the run diverged at round {final.get('round')} ({final.get('reason')}: "
                f"{final.get('what')}); it has no final model, so there is nothing to recommend")
        raise click.ClickException(f"{state_path}: the run has no final state (it has not "
                                   f"finished); finish it with `rfrs-ref train --resume {run}`")
    if data_dir is not None:
        config.data_dir = data_dir
    config.backend = "numpy"  # one user: the oracle is fast enough and needs no compilation
    trainer = _trainer(config, record)
    try:
        users, items = _checked_ids(run, trainer)
    except (OSError, ValueError, KeyError) as exc:
        raise click.ClickException(f"{run / 'ids.npz'}: unreadable ({exc})") from None
    where = np.flatnonzero(users == user)
    if where.size == 0:
        lo, hi = int(users.min()), int(users.max())
        raise click.BadParameter(f"user {user} is not in {config.dataset} (its user ids run "
                                 f"from {lo} to {hi}, {users.size} users)", param_hint="--user")
    u = int(where[0])
    from rfrs_ref.federated.trainer import first_non_finite

    try:
        with np.load(state_path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
        theta, final_round = arrays["theta"], int(arrays["round"])
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
    names = _names(config)
    click.echo(f"{config.dataset} user {user}: {seen.size} training items, "
               f"{trainer.split.test.counts()[u]} test items; top {k} of the model after round "
               f"{final_round}" + ("" if include_seen else " (training items left out)"))
    test = set(trainer.split.test.items_of(u).tolist())
    for rank, j in enumerate(top, 1):
        name = names[j] if names is not None else ""
        mark = "  [test item]" if j in test else ""
        click.echo(f"{rank:>3}  {scores[0, j]: .4f}  item {int(items[j])}"
                   + (f"  {name}" if name else "") + mark)


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
    if len(roots) != 1 or not all(p.is_file() for p in paths):
        return None
    return roots.pop()


def _trainer(config, record):
    from rfrs_ref.federated.trainer import Trainer
    from rfrs_ref.provenance import data_files

    from rfrs_ref.data.errors import DatasetNotFoundError, DownloadError

    recorded = record.get("data_files")
    try:
        trainer = Trainer(config)
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
            trainer = Trainer(config)
        except (ValueError, KeyError, OSError, RuntimeError) as exc2:
            raise click.ClickException(" ".join(str(exc2).split())) from exc2
    except (ValueError, KeyError, FileNotFoundError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
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


def _ids(run: pathlib.Path, trainer):
    import numpy as np

    from rfrs_ref.provenance import dataset_ids

    path = run / "ids.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as z:
            return z["user_ids"], z["item_ids"]
    # a run made before ids.npz existed: the mapping is a function of the data file
    return dataset_ids(trainer.config.dataset, trainer.data, trainer.config.data_dir)


def _checked_ids(run: pathlib.Path, trainer):
    users, items = _ids(run, trainer)
    if users.shape != (trainer.data.n_users,) or items.shape != (trainer.data.n_items,):
        raise click.ClickException(f"{run / 'ids.npz'}: {users.size} users and {items.size} "
                                   f"items, but the dataset has {trainer.data.n_users} and "
                                   f"{trainer.data.n_items}; the file is not this run's")
    return users, items


def _names(config):
    from rfrs_ref.data.datasets import load_item_names

    try:
        return load_item_names(config.dataset, config.data_dir)
    except Exception:  # noqa: BLE001 - names are a nicety: ids are always shown
        return None
