"""``rfrs-ref train``: train a federated recommender, optionally under attack."""

from __future__ import annotations

import datetime
import pathlib

import click

from rfrs_ref.aggregate import PRESETS, RULES
from rfrs_ref.attack import ATTACKS
from rfrs_ref.cli.options import apply, collect, registry_options
from rfrs_ref.cli.progress import Progress
from rfrs_ref.data import DATASETS
from rfrs_ref.federated.config import DEFAULT_ROUNDS, TrainConfig
from rfrs_ref.model import MODELS
from rfrs_ref.optim import OPTIMIZERS

_model_opts, _model_gen = registry_options("model", MODELS, prefixed=False)
_opt_opts, _opt_gen = registry_options("optimizer", OPTIMIZERS, prefixed=False)
_rule_opts, _rule_gen = registry_options("defense", RULES, prefixed=True)
_attack_opts, _attack_gen = registry_options("attack", ATTACKS, prefixed=True)
_data_opts, _data_gen = registry_options("dataset", DATASETS, prefixed=False)
_GENERATED = _model_gen + _opt_gen + _rule_gen + _attack_gen + _data_gen

DEFENSES = ["none", *[r for r in RULES.names() if r != "mean"]]


def _default_run_dir(dataset: str) -> pathlib.Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return pathlib.Path("runs") / f"{stamp}-{dataset}"


@click.command("train")
@click.option("--dataset", type=click.Choice(DATASETS.names()), default="synthetic", show_default=True,
              help="Dataset (see `rfrs-ref data list`).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Directory holding the dataset (else RFRS_DATA_DIR, the cache, a download).")
@click.option("--model", type=click.Choice(MODELS.names()), default="fism", show_default=True)
@click.option("--optimizer", type=click.Choice(OPTIMIZERS.names()), default="adam", show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=None,
              help="Rounds T [default: per dataset: "
                   + ", ".join(f"{k} {v}" for k, v in DEFAULT_ROUNDS.items()) + "].")
@click.option("--client-fraction", "-e", type=click.FloatRange(0, 1, min_open=True), default=0.01,
              show_default=True, help="Fraction e of clients sampled per round.")
@click.option("--init-scale", type=float, default=0.1, show_default=True,
              help="θ̄⁰ ~ N(0, scale²).")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32", show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Trial seed.")
@click.option("--valid-fraction", type=click.FloatRange(0, 0.8, max_open=True), default=0.0,
              show_default=True,
              help="Share of each client's items held out for validation, taken from its "
                   "training items (0: none, the paper's protocol; the test set is the same "
                   "either way). Metrics on it go to valid_metrics.csv (docs/datasets.md).")
@click.option("--eval-every", type=click.IntRange(min=1), default=None,
              help="Evaluate every N rounds and at the end [default: rounds // 10].")
@click.option("--ks", default="1,2,3,4,5", show_default=True,
              help="K values of Precision, Recall, NDCG, HR and MRR@K (integers 1..n_items; "
                   "e.g. 1,2,3,4,5,10,20; docs/training.md).")
@click.option("--defense", type=click.Choice(DEFENSES), default="none", show_default=True,
              help="Aggregation rule (none: weighted mean, the paper's Option I).")
@click.option("--detect", type=click.Choice(["gradient", "parameter"]), default="gradient",
              show_default=True, help="What the rule compares: recovered gradients or uploaded θ.")
@click.option("--preset", type=click.Choice(list(PRESETS)), default=None,
              help="The paper's defences by name (sets --defense and --detect).")
@click.option("--attack", type=click.Choice(ATTACKS.names()), default="none", show_default=True)
@click.option("--byzantine-fraction", "alpha", type=click.FloatRange(0, 1, max_open=True), default=0.0,
              show_default=True, help="Fraction α of clients that are Byzantine (fixed set).")
@click.option("--assumed-byzantine", type=click.FloatRange(0, 1, max_open=True), default=None,
              help="Fraction the server assumes: f = floor(α_assumed · sampled) [default: α].")
@click.option("--verify/--no-verify", default=None,
              help="Update-rule verification of uploads [default: on for stateful optimisers].")
@click.option("--resilience", is_flag=True, help="Record the Definition 1–4 sums per round.")
@click.option("--backend", type=click.Choice(["numba", "numpy", "cuda"]), default="numba",
              show_default=True, help="Kernels: numba (CPU), numpy (oracle), cuda (NVIDIA GPU).")
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=None,
              help="Checkpoint interval in rounds [default: the evaluation interval].")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Run directory [default: runs/<time>-<dataset>].")
@click.option("--resume", "resume", type=click.Path(file_okay=False, exists=True), default=None,
              help="Continue the run in this directory from its last checkpoint (other options ignored).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Also write a per-round trace to this file (JSON Lines, docs/traces.md).")
@apply(_data_opts + _model_opts + _opt_opts + _rule_opts + _attack_opts)
def train(dataset, data_dir, model, optimizer, rounds, client_fraction, init_scale, dtype, seed,
          valid_fraction, eval_every, ks, defense, detect, preset, attack, alpha, assumed_byzantine, verify,
          resilience, backend, checkpoint_every, out, resume, trace_path, **hyper):
    """Train a federated recommender and evaluate Precision, Recall, NDCG, HR and MRR@K.

    With no options: FISM with federated Adam (the paper's A-FRS) on the
    synthetic dataset. Results go to a run directory (config.json,
    metrics.csv, rounds.jsonl, final_metrics.json, state.npz, ids.npz);
    `rfrs-ref recommend RUN_DIR --user U` then lists a user's top items.

    \b
    Examples:
      rfrs-ref train --dataset citeulike-a
      rfrs-ref train --dataset ml100k --attack ascent --byzantine-fraction 0.2 --preset a-rfrs
    """
    from rfrs_ref.federated.trainer import Trainer, load_config

    if resume:
        config = load_config(resume)
        run_dir = pathlib.Path(resume)
    else:
        if preset is not None:
            defense, detect = PRESETS[preset]
            defense = "none" if defense == "mean" else defense
        ks_t = _parse_ks(ks)
        config = TrainConfig(
            dataset=dataset, data_dir=data_dir,
            dataset_params=collect(_GENERATED, hyper, "dataset", dataset, DATASETS),
            model=model,
            model_params=collect(_GENERATED, hyper, "model", model, MODELS),
            optimizer=optimizer,
            optimizer_params=collect(_GENERATED, hyper, "optimizer", optimizer, OPTIMIZERS),
            defense=defense, detect=detect,
            defense_params=collect(_GENERATED, hyper, "defense",
                                   "mean" if defense == "none" else defense, RULES),
            attack=attack, attack_params=collect(_GENERATED, hyper, "attack", attack, ATTACKS),
            byzantine_fraction=alpha, assumed_byzantine=assumed_byzantine, rounds=rounds,
            client_fraction=client_fraction, init_scale=init_scale, dtype=dtype, seed=seed,
            valid_fraction=valid_fraction, eval_every=eval_every, ks=ks_t, verify=verify, resilience=resilience,
            checkpoint_every=checkpoint_every, backend=backend)
        run_dir = pathlib.Path(out) if out else _default_run_dir(dataset)
        if (run_dir / "config.json").exists():
            raise click.UsageError(f"{run_dir} already holds a run; use --resume {run_dir} or another --out")

    if trace_path:
        config.trace = True  # the records then carry gradient norms and state checksums
    try:
        trainer = Trainer(config)
    except (ValueError, KeyError, FileNotFoundError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    done = _checkpoint_round(run_dir) if resume else 0
    tracer = None
    if trace_path:
        from rfrs_ref.trace import TraceWriter

        tracer = TraceWriter(trace_path, trainer, resume_after=done if resume else None)
    c = trainer.config
    if resume and done >= c.rounds and (run_dir / "final_metrics.json").exists():
        import json

        click.echo(f"{run_dir} already finished all {c.rounds} rounds; nothing to resume. "
                   "Its final evaluation:")
        final = json.loads((run_dir / "final_metrics.json").read_text())
        _print_summary(final, c.ks, run_dir, None)
        return
    what = (f"{c.dataset}: {trainer.data.n_users} clients, {trainer.data.n_items} items, "
            f"{trainer.data.n_interactions} interactions; {c.model} d={trainer.model.dim}, "
            f"{c.optimizer}, defense {c.defense} ({c.detect}), attack {c.attack} "
            f"α={c.byzantine_fraction}; {c.rounds} rounds")
    if resume:
        click.echo(f"resuming {run_dir} from round {done} of {c.rounds} ({what})")
    else:
        click.echo(f"{what} -> {run_dir}")

    kmax = max(c.ks)
    note = ("the first round compiles the Numba kernels (up to a minute the first time; "
            "cached for later runs)" if c.backend != "numpy" else None)
    bar = Progress(c.rounds, done, label="round", first_note=note)

    def progress(t, record, latest):
        metric = f"P@{kmax} {latest[f'precision@{kmax}']:.4f}" if latest is not None else None
        bar.update(t, metric)
        if tracer is not None:
            tracer.write_round(record, latest)

    try:
        result = trainer.run(run_dir, resume=bool(resume), progress=progress)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        bar.close()
        if tracer is not None:
            tracer.close()

    _print_summary(result.final, c.ks, result.run_dir, bar.elapsed())


def _parse_ks(text: str) -> tuple[int, ...]:
    """``--ks 1,5,10``: positive integers (the upper bound, n_items, is checked once the
    dataset is loaded)."""
    try:
        ks = tuple(int(k) for k in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of integers, "
                                 "e.g. 1,2,3,4,5,10,20", param_hint="--ks") from None
    bad = [k for k in ks if k < 1]
    if bad:
        raise click.BadParameter(f"K must be integers 1..n_items (the number of items), "
                                 f"got {bad[0]}", param_hint="--ks")
    return ks


def _checkpoint_round(run_dir: pathlib.Path) -> int:
    import numpy as np

    path = run_dir / "checkpoint.npz"
    if not path.exists():
        raise click.ClickException(f"{path}: no checkpoint to resume from")
    with np.load(path, allow_pickle=False) as z:
        return int(z["round"])


def _print_summary(final: dict, ks, run_dir, elapsed: float | None) -> None:
    """The final evaluation as a table; ``elapsed``: this command's wall time (the
    progress display's clock), None for a run finished earlier."""
    m, p = final["model"], final["popularity"]
    click.echo("")
    when = "" if elapsed is None else f" ({elapsed:.1f} s)"
    click.echo(f"after round {final['round']}{when}, {m['n_users']} benign clients evaluated")
    names = [("Precision", "precision"), ("Recall", "recall"), ("NDCG", "ndcg"), ("HR", "hr"),
             ("MRR", "mrr")]
    names = [(a, n) for a, n in names if f"{n}@{ks[0]}" in m]  # runs made before NDCG/HR/MRR
    click.echo((" " * 4 + "".join(f"  {a + '@K':<15}" for a, _ in names)).rstrip())
    click.echo(f"{'K':>4}" + "  model   popular" * len(names))
    for k in ks:
        click.echo(f"{k:>4}" + "".join(f"  {m[f'{n}@{k}']:.4f}  {p[f'{n}@{k}']:.4f} "
                                       for _, n in names).rstrip())
    kmax = max(ks)
    if final.get("valid"):
        v = final["valid"]
        click.echo(f"validation items ({v['model']['n_users']} clients): "
                   + ", ".join(f"{a}@{kmax} {v['model'][f'{n}@{kmax}']:.4f} "
                               f"(popular {v['popularity'][f'{n}@{kmax}']:.4f})"
                               for a, n in names))
    verdict = "beats" if final["beats_popularity"] else "does NOT beat"
    click.echo(f"the model {verdict} the popularity ranking on Precision@{kmax}")
    sel = final["selection"]
    if sel["byzantine_share_sampled"] > 0:
        click.echo(f"Byzantine share: {sel['byzantine_share_sampled']:.3f} of sampled clients, "
                   f"{sel['byzantine_share_kept']:.3f} of kept clients; "
                   f"{final['exclusions']} uploads excluded by verification")
    if final.get("resilience"):
        click.echo("resilience sums (the paper's Definitions 1-4; docs/optimizers.md, "
                   "\"Resilience quantities\"): " + ", ".join(
                       f"{k} {v:.4g}" for k, v in final["resilience"].items()))
        click.echo("  C_g = Σ over rounds, kept clients i and benign clients j of ‖ĝᵢ − gⱼ‖ "
                   "(recovered vs true gradients); C_m, C_v, C_r, C_theta: the same distance "
                   "for each uploaded array. Smaller is more resilient; compare runs, not "
                   "absolute values (they grow with the rounds, clients and D)")
    click.echo(f"results: {run_dir}")
