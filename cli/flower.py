"""``rfrs-ref flower``: train on a Flower federation (simulation engine or loopback deployment).

Flower is the ``flower`` extra; the library is imported inside each command so
that ``rfrs-ref --help`` stays fast.
"""

from __future__ import annotations

import json
import pathlib

import click

from rfrs_ref.aggregate import PRE, PRESETS, RULES
from rfrs_ref.cli.options import apply, collect, registry_options
from rfrs_ref.data import DATASETS
from rfrs_ref.flower import PER_CLIENT_ATTACKS
from rfrs_ref.optim import OPTIMIZERS

#: the datasets' own options (--synthetic-users, ...), as `rfrs-ref train` has them
_data_opts, _data_gen = registry_options("dataset", DATASETS, prefixed=False)


def _config_options(f):
    """The run's configuration: a file, or the common options of ``rfrs-ref train``."""
    options = [
        click.option("--config", "config_file", type=click.Path(dir_okay=False, exists=True),
                     default=None, help="A training configuration as JSON (the 'config' of a "
                     "run's config.json, or the file itself); the options below are then "
                     "not allowed."),
        click.option("--dataset", type=click.Choice(DATASETS.names()), default="synthetic",
                     show_default=True),
        click.option("--data-dir", type=click.Path(file_okay=False), default=None,
                     help="Directory holding the dataset's folder, e.g. DIR for "
                          "DIR/ml-100k/ [default: RFRS_DATA_DIR, cache, download]."),
        click.option("--optimizer", type=click.Choice(OPTIMIZERS.names()), default="adam",
                     show_default=True),
        click.option("--rounds", type=click.IntRange(min=1), default=None,
                     help="Rounds T [default: the dataset's]."),
        click.option("--client-fraction", "-e", type=click.FloatRange(0, 1, min_open=True),
                     default=0.01, show_default=True, help="Fraction e of clients per round."),
        click.option("--dim", type=click.IntRange(min=1), default=None,
                     help="Embedding dimension d [default: the model's]."),
        click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True),
        click.option("--eval-every", type=click.IntRange(min=1), default=None,
                     help="Evaluate every this many rounds [default: T/10]."),
        click.option("--preset", type=click.Choice(list(PRESETS)), default=None,
                     help="The paper's defences: sets --defense and --detect."),
        click.option("--defense", type=click.Choice(["none", *RULES.names()]), default="none",
                     show_default=True),
        click.option("--detect", type=click.Choice(["gradient", "parameter"]),
                     default="gradient", show_default=True),
        click.option("--pre", type=click.Choice(PRE.names()), multiple=True,
                     help="Pre-aggregator run by the server before the rule (repeat for a "
                          "chain, e.g. --pre nnm; docs/aggregation.md)."),
        click.option("--attack", type=click.Choice(list(PER_CLIENT_ATTACKS)), default="none",
                     show_default=True, help="What Byzantine nodes do (attacks that need no "
                     "other client's data)."),
        click.option("--byzantine-fraction", "alpha", type=click.FloatRange(0, 1, max_open=True),
                     default=0.0, show_default=True, help="α, the Byzantine share of users."),
        click.option("--out", type=click.Path(file_okay=False), required=True,
                     help="The run directory (the files of rfrs-ref train, and flower.json)."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return apply(_data_opts)(f)


def _config(ctx: click.Context, p: dict):
    from rfrs_ref.federated.config import TrainConfig

    if p["config_file"]:
        given = [name for name in ("dataset", "data_dir", "optimizer", "rounds", "client_fraction",
                                   "dim", "seed", "eval_every", "preset", "defense", "detect",
                                   "pre", "attack", "alpha", *(g.param for g in _data_gen))
                 if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"--config gives the whole configuration; drop "
                                   f"{', '.join('--' + g.replace('_', '-') for g in given)}")
        try:
            d = json.loads(pathlib.Path(p["config_file"]).read_text())
            config = TrainConfig.from_json(d.get("config", d) if isinstance(d, dict) else d)
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise click.ClickException(f"{p['config_file']}: not a training configuration "
                                       f"({exc})") from None
    else:
        defense, detect = p["defense"], p["detect"]
        if p["preset"] is not None:
            defense, detect = PRESETS[p["preset"]]
            defense = "none" if defense == "mean" else defense
        config = TrainConfig(
            dataset=p["dataset"], data_dir=p["data_dir"],
            dataset_params=collect(_data_gen, p, "dataset", p["dataset"], DATASETS),
            optimizer=p["optimizer"],
            rounds=p["rounds"], client_fraction=p["client_fraction"], seed=p["seed"],
            eval_every=p["eval_every"], defense=defense, detect=detect, pre=tuple(p["pre"]),
            attack=p["attack"],
            byzantine_fraction=p["alpha"],
            model_params={} if p["dim"] is None else {"dim": p["dim"]})
    from rfrs_ref.flower.server import check_federation_config

    try:
        check_federation_config(config)
    except (ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(str(exc)) from None
    return config


#: what a Flower run writes into its run directory besides rfrs-ref train's files
FLOWER_FILES = ("flower.json", "flower-logs")


def _refuse_out(out: str) -> None:
    """``--out`` as ``rfrs-ref train --out`` takes it: neither a sweep's run directory nor
    a directory inside a run's; nor a directory holding ``flower.json`` or ``flower-logs``
    of its own, which the run replaces when it ends (the trainer refuses another run's
    files). Refused before anything runs or is written."""
    from rfrs_ref.cli.train import _refuse_out_in_a_run_directory

    run_dir = pathlib.Path(out)
    _refuse_out_in_a_run_directory(run_dir)
    present = [n for n in FLOWER_FILES if (run_dir / n).exists() or (run_dir / n).is_symlink()]
    if present:
        raise click.UsageError(f"--out {out} already holds {' and '.join(present)}, which a "
                               "Flower run writes when it ends (replacing what is there); "
                               "choose another run directory")


def _final_stamp(run_dir):
    """What identifies the ``final_metrics.json`` in ``run_dir`` now (its inode and time of
    change), or None when there is none: a run that ends writes a new one."""
    try:
        st = (pathlib.Path(run_dir) / "final_metrics.json").stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _refuse_if_diverged(run_dir, before) -> None:
    """A run that diverged on the federation is never reported as finished: the trainer's
    ``final_metrics.json`` says ``"status": "diverged"`` (docs/training.md, "Failure
    behaviour"), and Flower itself may end without passing the error on. ``before``: the
    file's :func:`_final_stamp` before this run started; a file this run did not write
    (another run's, which this one was refused next to) says nothing of this run."""
    if _final_stamp(run_dir) == before:
        return
    try:
        final = json.loads((pathlib.Path(run_dir) / "final_metrics.json").read_text())
    except (OSError, ValueError):
        return
    if isinstance(final, dict) and final.get("status") == "diverged":
        raise click.ClickException(
            f"the run diverged at round {final.get('round')} ({final.get('reason')}: "
            f"{final.get('what')}); it has no final model. {run_dir}/final_metrics.json says so")


def _summary(final: dict, ks, run_dir, how: str = "", after: str = "") -> None:
    """The run's final Precision@K (the largest K) beside the popularity ranking's, once
    every metric of ``final`` is a finite number in [0, 1] (``results.non_finite_metric``,
    the check the tables make of a finished run's record): a NaN or ±inf is never shown as
    the run's result, but refused naming the metric and ``run_dir``'s final_metrics.json.
    ``how``: words after the round (time, nodes); ``after``: words after the results."""
    from rfrs_ref.experiments.results import non_finite_metric

    k = max(ks)
    where = pathlib.Path(run_dir) / "final_metrics.json"
    if not isinstance(final, dict):
        raise click.ClickException(f"{where}: not a run's final evaluation (a JSON object); "
                                   "the run has no result to show")
    shown = {"": (final.get("model") or {}).get(f"precision@{k}"),
             "popularity ": (final.get("popularity") or {}).get(f"precision@{k}")}
    bad = non_finite_metric(final, ks) or next(((f"{part}precision@{k}", v)
                                                 for part, v in shown.items() if v is None), None)
    if bad is not None:
        raise click.ClickException(f"{where}: {bad[0]} is {bad[1]!r}, not a finite number in "
                                   "[0, 1]; the run has no result to show")
    click.echo(f"after round {final.get('round')}{how}: Precision@{k} {shown['']:.4f} (popularity "
               f"{shown['popularity ']:.4f}); results: {run_dir}{after}")


@click.group("flower")
def flower() -> None:
    """Train on a Flower federation: the simulation engine or a loopback deployment.

    The server is the paper's (sampling, recovery, verification, the rule in
    either detection space), the clients compute their uploads on their own
    data; with the same configuration and seed the final state equals
    `rfrs-ref train`'s bit for bit. Needs the flower extra:
    pip install "rfrs-ref[flower]". See docs/flower.md.
    """


@flower.command("simulate")
@_config_options
@click.option("--cpus", type=click.IntRange(min=1), default=None,
              help="CPUs for Ray [default: all]; one ClientApp per CPU at a time.")
def simulate(cpus, **p) -> None:
    """Flower's simulation engine (Ray): one virtual SuperNode per user.

    \b
    Example:
      rfrs-ref flower simulate --dataset ml100k --rounds 50 --preset a-rfrs \\
          --attack ascent --byzantine-fraction 0.2 --out runs/flower-sim
    """
    from rfrs_ref.flower import FlowerUnavailable

    config = _config(click.get_current_context(), p)
    _refuse_out(p["out"])
    before = _final_stamp(p["out"])
    try:
        from rfrs_ref.flower.run import simulate as run

        out = run(config, p["out"], num_cpus=cpus)
    except FlowerUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    except (RuntimeError, ValueError) as exc:  # the run ended without finishing (diverged...)
        _refuse_if_diverged(p["out"], before)
        raise click.ClickException(" ".join(str(exc).split())) from None
    _summary(out["result"].final, out["result"].config.ks, p["out"])


@flower.command("deploy")
@_config_options
@click.option("--nodes", type=click.IntRange(min=1), default=3, show_default=True,
              help="flower-supernode processes; node i holds the users u ≡ i (mod nodes).")
@click.option("--timeout", type=click.FloatRange(min=1), default=1800.0, show_default=True,
              help="Seconds for the whole deployment; every process is stopped after it.")
@click.option("--round-timeout", type=click.FloatRange(min=1), default=120.0, show_default=True,
              help="Seconds a round waits for replies; later ones are dropped.")
@click.option("--kill-node", nargs=2, type=click.IntRange(min=0), default=None,
              metavar="I R", help="Fault test: kill SuperNode I once round R is recorded.")
def deploy(nodes, timeout, round_timeout, kill_node, **p) -> None:
    """A real federation on 127.0.0.1: flower-superlink, NODES flower-supernode, flwr run.

    Started, waited for and stopped by this one command (its processes only,
    after at most --timeout seconds). Loopback only: no address other than
    127.0.0.1 is used.

    \b
    Example:
      rfrs-ref flower deploy --dataset ml100k --rounds 5 --preset a-rfrs \\
          --attack ascent --byzantine-fraction 0.2 --nodes 4 --out runs/flower-loopback
    """
    from rfrs_ref.flower import FlowerUnavailable

    config = _config(click.get_current_context(), p)
    if kill_node is not None and kill_node[0] >= nodes:
        raise click.UsageError(f"--kill-node {kill_node[0]}: nodes are numbered 0..{nodes - 1}")
    _refuse_out(p["out"])
    before = _final_stamp(p["out"])
    try:
        from rfrs_ref.flower.deploy import DeploymentError
        from rfrs_ref.flower.deploy import deploy as run

        out = run(config, p["out"], nodes=nodes, timeout=timeout, round_timeout=round_timeout,
                  kill_node=tuple(kill_node) if kill_node else None,
                  echo=lambda line: click.echo(line, err=True))
    except FlowerUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    except DeploymentError as exc:
        _refuse_if_diverged(p["out"], before)
        raise click.ClickException(str(exc)) from None
    _refuse_if_diverged(p["out"], before)
    if _final_stamp(p["out"]) == before:
        # the federation ended, but this run wrote no final evaluation: a final_metrics.json
        # there is another run's (this one was refused beside it, or stopped), never shown
        raise click.ClickException(f"the deployment ended, but the run wrote no "
                                   f"{p['out']}/final_metrics.json (refused or stopped); the "
                                   f"logs are in {out['logs']}")
    try:
        final = json.loads((pathlib.Path(p["out"]) / "final_metrics.json").read_text())
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"{p['out']}/final_metrics.json: {exc}; the run has no "
                                   "result to show") from None
    _summary(final, config.resolved().ks, p["out"],
             how=f" ({out['seconds']:.0f} s on {nodes} nodes)", after=f"; logs: {out['logs']}")
