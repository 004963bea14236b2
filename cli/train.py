"""``rfrs-ref train``: train a federated recommender, optionally under attack."""

from __future__ import annotations

import contextlib
import datetime
import errno
import pathlib

import click

from rfrs_ref.aggregate import PRE, PRESETS, RULES
from rfrs_ref.attack import ATTACKS
from rfrs_ref.cli.options import apply, collect, registry_options
from rfrs_ref.cli.progress import Progress
from rfrs_ref.data import DATASETS
from rfrs_ref.federated.config import DEFAULT_ROUNDS, TrainConfig
from rfrs_ref.files import DirectoryLock, DirectoryLocked
from rfrs_ref.model import MODELS
from rfrs_ref.optim import OPTIMIZERS

_model_opts, _model_gen = registry_options("model", MODELS, prefixed=False)
_opt_opts, _opt_gen = registry_options("optimizer", OPTIMIZERS, prefixed=False)
_rule_opts, _rule_gen = registry_options("defense", RULES, prefixed=True)
_attack_opts, _attack_gen = registry_options("attack", ATTACKS, prefixed=True)
_data_opts, _data_gen = registry_options("dataset", DATASETS, prefixed=False)
_pre_opts, _pre_gen = registry_options("pre", PRE, prefixed=False)
_GENERATED = _model_gen + _opt_gen + _rule_gen + _attack_gen + _data_gen + _pre_gen

DEFENSES = ["none", *[r for r in RULES.names() if r != "mean"]]


def _default_run_dir(dataset: str) -> pathlib.Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return pathlib.Path("runs") / f"{stamp}-{dataset}"


def _reserve_default_run_dir(dataset: str) -> tuple[pathlib.Path, list[pathlib.Path]]:
    """A new ``runs/<time>-<dataset>``, made here, or ``...-2``, ``-3``... when a run started
    in the same second has that name (``mkdir`` is atomic, so runs started together, e.g. by
    a loop over seeds, get one directory each instead of refusing each other). Returns it
    and the directories made for it, removed again if still empty at the end."""
    base = _default_run_dir(dataset)
    made = [] if base.parent.exists() else [base.parent]
    base.parent.mkdir(parents=True, exist_ok=True)
    for i in range(1, 10_000):
        candidate = base if i == 1 else base.with_name(f"{base.name}-{i}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate, [candidate, *made]
    raise click.ClickException(f"{base}: no free run directory name; give one with --out")


def _remove_if_empty(dirs) -> None:
    for p in dirs:
        try:
            p.rmdir()  # only when empty
        except OSError:
            break


@click.command("train")
@click.option("--dataset", type=click.Choice(DATASETS.names()), default="synthetic", show_default=True,
              help="Dataset (see `rfrs-ref data list`).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Directory holding the dataset's folder, e.g. DIR for DIR/ml-100k/ "
                   "(else RFRS_DATA_DIR, the cache, a download).")
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
              help="Aggregation rule (none: weighted mean, the paper's Option I). With the "
                   "default --detect gradient, krum is the paper's A-RFRS; the paper's Krum "
                   "baseline is --preset krum (parameter space).")
@click.option("--detect", type=click.Choice(["gradient", "parameter"]), default="gradient",
              show_default=True, help="What the rule compares: recovered gradients or uploaded θ.")
@click.option("--preset", type=click.Choice(list(PRESETS)), default=None,
              help="The paper's defences by name (sets --defense and --detect; giving either with "
                   "another value is an error): a-rfrs is krum on recovered gradients, krum, rfa "
                   "and trmean the baselines on uploaded θ (docs/aggregation.md).")
@click.option("--pre", "pre", type=click.Choice(PRE.names()), multiple=True,
              help="Pre-aggregator run on the rows before the rule (repeat for a chain, applied "
                   "in the order given, e.g. --pre clip --pre nnm; docs/aggregation.md).")
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
@click.option("--low-memory", is_flag=True,
              help="Robust rounds (Krum, RFA, MDA, MoNNA, CAF, SMEA with verification) hold "
                   "their uploads 16 clients at a time and compute the kept clients' uploads "
                   "twice: the same results, bit for bit, in less memory (Krum, RFA or "
                   "A-RFRS on citeulike-t: 1.6 GB instead of 2.3), about 1.15 times the time "
                   "(docs/performance.md, \"Low memory on shared rows\").")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Run directory [default: runs/<time>-<dataset>, -2, -3... for runs started in "
                   "the same second]; one that already holds a run "
                   "is refused (continue it with --resume), and so is a sweep's run directory "
                   "(RESULTS/runs/<key>), which the sweep clears when that run starts again.")
@click.option("--resume", "resume", type=click.Path(file_okay=False, exists=True), default=None,
              help="Continue the run in this directory from its last checkpoint (from round 0 if it "
                   "stopped before one); options that would change the run are refused.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Also write a per-round trace to this file (JSON Lines, docs/traces.md).")
@apply(_data_opts + _model_opts + _opt_opts + _rule_opts + _pre_opts + _attack_opts)
def train(dataset, data_dir, model, optimizer, rounds, client_fraction, init_scale, dtype, seed,
          valid_fraction, eval_every, ks, defense, detect, preset, pre, attack, alpha, assumed_byzantine, verify,
          resilience, backend, checkpoint_every, low_memory, out, resume, trace_path, **hyper):
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
    from rfrs_ref.federated.trainer import RunDirectory, Trainer, load_config

    ctx = click.get_current_context()
    made: list[pathlib.Path] = []  # directories made for a default run directory
    if resume:
        _refuse_options_with_resume(ctx)
        run_dir = pathlib.Path(resume)
    else:
        if preset is not None:
            _refuse_conflicts_with_preset(ctx, preset, defense=defense, detect=detect)
            defense, detect = PRESETS[preset]
            defense = "none" if defense == "mean" else defense
        if attack != "none" and alpha == 0:
            # the attack would do nothing: no client is Byzantine
            raise click.UsageError(f"--attack {attack} needs Byzantine clients: give "
                                   "--byzantine-fraction (e.g. 0.4; the default 0 makes none)")
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
            pre=tuple(pre), pre_params=_collect_pre(hyper, pre),
            attack=attack, attack_params=collect(_GENERATED, hyper, "attack", attack, ATTACKS),
            byzantine_fraction=alpha, assumed_byzantine=assumed_byzantine, rounds=rounds,
            client_fraction=client_fraction, init_scale=init_scale, dtype=dtype, seed=seed,
            valid_fraction=valid_fraction, eval_every=eval_every, ks=ks_t, verify=verify, resilience=resilience,
            checkpoint_every=checkpoint_every, backend=backend)
        try:
            config.resolved()  # names and hyperparameters, before anything is written
        except (ValueError, KeyError, TypeError) as exc:
            raise click.ClickException(_one_line(exc)) from None
        _refuse_too_large(config)
        run_dir = pathlib.Path(out) if out else _default_run_dir(dataset)
        _refuse_out_in_a_run_directory(run_dir)
        if not out:
            run_dir, made = _reserve_default_run_dir(dataset)

    if trace_path:
        try:
            _refuse_trace_among_run_files(pathlib.Path(trace_path), run_dir)
        except click.ClickException:
            _remove_if_empty(made)
            raise
    # the directory is this process's from here on: a second `train` or `--resume` on it
    # is refused, with nothing written, until this one exits
    with _own(run_dir, made):
        if resume:
            try:
                # before any is read: a FIFO at a run file's name would be waited on for ever
                RunDirectory(run_dir).check_regular_files()
                config = load_config(resume)
            except (ValueError, FileNotFoundError) as exc:
                raise click.ClickException(str(exc)) from None
        else:
            try:
                RunDirectory(run_dir).prepare(config.resolved(), resume=False)
            except ValueError as exc:
                raise click.ClickException(_one_line(exc)) from None
        _train(config, run_dir, resume, trace_path, low_memory)


#: a run is refused when its estimated memory exceeds this many times the machine's: the
#: estimate is an upper bound (``sweep.estimate_run_memory``; about 2.7 times the peak of
#: an A-FRS run on citeulike-a), so a run refused so would not fit with any bound's slack
MEMORY_FACTOR = 4


def machine_memory() -> int | None:
    """This machine's physical memory in bytes, or None where the system does not say."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def memory_limit(factor: int = MEMORY_FACTOR) -> tuple[int | None, str]:
    """``(limit, wording)`` of ``sweep.check_size`` for a run on this machine: more than
    ``factor`` times its memory ((None, "") where the system does not say)."""
    memory = machine_memory()
    if memory is None or memory <= 0:
        return None, ""
    times = f"{factor} times " if factor != 1 else ""
    return factor * memory, (f"more than {times}this machine's memory ({memory:.3g} bytes; "
                             "the estimate is an upper bound)")


def _refuse_too_large(config) -> None:
    """A run no machine could hold (``--dim 9223372036854775807``: numpy's "Maximum allowed
    dimension exceeded" once the run had started), or one whose estimated memory is more than
    :data:`MEMORY_FACTOR` times this machine's (``--synthetic-users 100000000``: killed by
    the system for memory, without a word, while it generated the data), is refused in one
    line naming the option, its value and the limit (``sweep.check_size``), before anything
    is written."""
    from rfrs_ref.experiments.sweep import RunTooLarge, check_size

    try:
        check_size(config, *memory_limit())
    except RunTooLarge as exc:
        table, _, name = exc.field.partition(".")
        flags = [g.flag for g in _GENERATED
                 if f"{g.family}_params" == table and g.field == name]
        flag = f"--{flags[0]}" if flags else f"--{exc.field.replace('_', '-')}"
        raise click.ClickException(f"{flag} {exc.value}{exc.reason}") from None


def _refuse_out_in_a_run_directory(run_dir: pathlib.Path) -> None:
    """A new run's ``--out`` may be neither a sweep's results directory (``RESULTS``) nor one
    of its run directories (``RESULTS/runs/<key>``, whether or not that run has started:
    the sweep clears the directory when the run starts again, and would wipe this one) nor
    lie inside any run's directory, nor lie in a results directory's ``figures/`` (where its
    sweep draws); refused before anything is written. (Continuing a
    sweep's run by hand, ``--resume RESULTS/runs/<key>``, is that run's own.)"""
    from rfrs_ref.experiments.results import (figures_folder_above, is_store,
                                              run_directory_above, runs_folder_above,
                                              store_of_run_directory)

    if is_store(run_dir):
        # a run's files beside the tables would make the results directory a run directory,
        # into which no sweep writes again
        raise click.UsageError(f"--out {run_dir} is a results directory (a sweep's tables are "
                               "there); give a directory of its own")
    store = store_of_run_directory(run_dir)
    if store is not None:
        raise click.UsageError(f"--out {run_dir} is the directory of run {run_dir.resolve().name} "
                               f"of the results directory {store}, which a sweep clears when "
                               "that run starts again; give a directory outside its runs/")
    owner = run_directory_above(run_dir.resolve().parent)
    if owner is not None:
        # a run directory is its run's: a sweep clears it when the run starts again
        raise click.UsageError(f"--out {run_dir} lies inside the run directory {owner}; "
                               "give a directory outside any run's")
    runs = runs_folder_above(run_dir)
    if runs is not None:
        # RESULTS/runs/<not a key>: the sweep reads every entry of runs/ as a run of its own
        raise click.UsageError(f"--out {run_dir} lies inside {runs}, the runs/ folder of the "
                               f"results directory {runs.parent}, which holds only the run "
                               "directories of its sweep; give a directory outside it")
    figures = figures_folder_above(run_dir)
    if figures is not None:
        # the sweep redraws its figures there, and a plot into a run's directory is refused:
        # the results directory's figures could no longer be drawn
        raise click.UsageError(f"--out {run_dir} lies inside {figures}, the figures/ folder "
                               f"of the results directory {figures.parent}, where its sweep "
                               "draws its figures; give a directory outside it")


def _refuse_trace_among_run_files(trace: pathlib.Path, run_dir: pathlib.Path) -> None:
    """A trace named like a file of the run, in its directory (``rounds.jsonl``, the lock
    ``.lock``...), would be overwritten by the run or removed with the lock: refused before
    anything is written."""
    from rfrs_ref.federated.trainer import RUN_FILES, VALID_METRICS
    from rfrs_ref.files import LOCK_NAME

    names = (*RUN_FILES, VALID_METRICS, "ids.npz", LOCK_NAME)
    target = trace.resolve()  # a link of another name to one of them is one of them
    hit = next((name for name in names if target == (run_dir / name).resolve()), None)
    if hit is not None:
        raise click.UsageError(f"--trace {trace} is one of the run's own files ({hit}); "
                               f"give a file of another name, e.g. {run_dir / 'trace.jsonl'}")
    from rfrs_ref.experiments.results import run_directory_above

    # the trace itself included: a file named like a sweep's run directory (runs/<key>)
    # would stand where that run's directory is made
    owner = run_directory_above(target)
    if owner is not None and owner != run_dir.resolve():
        # another run's directory is that run's (a sweep clears it when the run starts again)
        raise click.UsageError(f"--trace {trace} is or lies in the directory of another run, "
                               f"{owner}; give a file outside it, or in {run_dir}")


def _train(config, run_dir: pathlib.Path, resume, trace_path, low_memory=False) -> None:
    from rfrs_ref.federated.trainer import Trainer

    if trace_path:
        config.trace = True  # the records then carry gradient norms and state checksums
    try:
        trainer = Trainer(config, low_memory=low_memory)
    except (ValueError, KeyError, TypeError) as exc:
        # on --resume the configuration is the file's: say which file holds the bad value
        where = f"{run_dir / 'config.json'}: " if resume else ""
        raise click.ClickException(where + _one_line(exc)) from None
    except (FileNotFoundError, RuntimeError) as exc:
        raise click.ClickException(_one_line(exc)) from None
    except OSError as exc:  # a download that failed (no network, checksum), an unreadable file
        msg = _one_line(exc)
        if f"rfrs-ref data fetch {config.dataset}" in msg:
            # the loader's message names the dataset, where it looked and what to do; a
            # resumed run keeps the --data-dir it recorded, a new one may be given one
            msg = (msg + _recorded_folder_hint(run_dir) if resume
                   else msg.rstrip(".") + ", or give that directory with --data-dir")
            raise click.ClickException(msg) from None
        # a resumed run keeps the --data-dir it recorded: only the variable can move it
        where = "RFRS_DATA_DIR" if resume else "--data-dir or RFRS_DATA_DIR"
        raise click.ClickException(
            f"dataset {config.dataset!r}: {msg}; fetch it where there is a network "
            f"(rfrs-ref data fetch {config.dataset}) and point {where} at it") from None
    done = _checkpoint_round(run_dir) if resume else 0
    c = trainer.config
    if resume and done >= c.rounds and (run_dir / "final_metrics.json").exists():
        from rfrs_ref.federated.trainer import CheckpointError, RunDirectory

        try:  # a finished run is shown, not trained again, once its files prove sound and finite
            final = RunDirectory(run_dir).read_finished(trainer)
        except CheckpointError as exc:
            raise click.ClickException(_one_line(exc)) from None
        click.echo(f"{run_dir} already finished all {c.rounds} rounds; nothing to resume. "
                   "Its final evaluation:")
        _print_summary(final, c.ks, run_dir, None)
        _refuse_non_finite_resilience(final)
        return  # nothing trained: a --trace file is left as it is
    tracer = None
    if trace_path:
        from rfrs_ref.trace import TraceRefused, TraceWriter

        try:
            tracer = TraceWriter(trace_path, trainer, resume_after=done if resume else None)
        except TraceRefused as exc:
            raise click.ClickException(f"--trace {trace_path}: {_one_line(exc)}") from None
        except OSError as exc:
            raise click.ClickException(f"--trace {trace_path}: {exc.strerror or _one_line(exc)}; "
                                       "choose a writable file") from None
    what = (f"{c.dataset}: {trainer.data.n_users} clients, {trainer.data.n_items} items, "
            f"{trainer.data.n_interactions} interactions; {c.model} d={trainer.model.dim}, "
            f"{c.optimizer}, defense {' then '.join((*c.pre, c.defense))} ({c.detect}), attack {c.attack} "
            f"α={c.byzantine_fraction}; {c.rounds} rounds")
    if resume:
        click.echo(f"resuming {run_dir} from round {done} of {c.rounds} ({what})")
        _say_code_change(run_dir)
    else:
        click.echo(f"{what} -> {run_dir}")

    kmax = max(c.ks)
    note = ("the first round compiles the Numba kernels (up to a minute the first time; "
            "cached for later runs)" if c.backend != "numpy" else None)
    bar = Progress(c.rounds, done, label="round", first_note=note)

    seen = {"latest": None, "round": None}

    def progress(t, record, latest):
        if latest is not None and latest is not seen["latest"]:
            seen.update(latest=latest, round=t)  # a new evaluation, after round t
        metric = None
        if latest is not None:
            # the latest evaluation's round: lines between evaluations repeat it
            metric = f"P@{kmax} {latest[f'precision@{kmax}']:.4f} (round {seen['round']})"
        bar.update(t, metric)
        if tracer is not None:
            tracer.write_round(record, latest)

    from rfrs_ref.federated.trainer import NonFiniteResilience

    try:
        result = trainer.run(run_dir, resume=bool(resume), progress=progress, locked=True)
    except NonFiniteResilience as exc:
        # the run trained every round and wrote its files: shown, then not a success
        result = exc.result
    except KeyboardInterrupt:
        bar.close()
        click.echo(f"\ninterrupted: continue from the last checkpoint with "
                   f"rfrs-ref train --resume {run_dir}", err=True)
        raise SystemExit(130) from None
    except (ValueError, KeyError, FileNotFoundError) as exc:
        raise click.ClickException(_one_line(exc)) from None
    except OSError as exc:
        raise click.ClickException(_os_error(exc, run_dir, started=True)) from None
    finally:
        bar.close()
        if tracer is not None:
            tracer.close()

    _print_summary(result.final, c.ks, result.run_dir, bar.elapsed())
    _refuse_non_finite_resilience(result.final)


def _refuse_non_finite_resilience(final: dict) -> None:
    """Exit non-zero, in one line, when the run's record marks a resilience sum that
    became NaN or ±inf (``resilience_non_finite``): a total that is not a number is never
    a success, even though the training finished."""
    from rfrs_ref.federated.trainer import resilience_message

    marks = final.get("resilience_non_finite")
    if marks:  # a dict of rounds: read_finished checks the record read back
        raise click.ClickException(_one_line(ValueError(resilience_message(marks))))


def _say_code_change(run_dir: pathlib.Path) -> None:
    """A note when the code resuming the run is not the code that started it (the run is
    resumed all the same; config.json records both, see docs/training.md)."""
    import json

    from rfrs_ref.federated.trainer import code_change, describe_code

    try:
        change = code_change(json.loads((run_dir / "config.json").read_text()))
    except (OSError, ValueError, AttributeError):
        return  # the run itself reports a damaged config.json
    if change is not None:
        click.echo(f"note: the run was started by {describe_code(change['then'])} and is resumed "
                   f"by {describe_code(change['now'])}; the rounds after the checkpoint are this "
                   "code's, so the run may not end bit for bit where an uninterrupted one would "
                   "(config.json records both under \"resumed\")", err=True)


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
    if len(set(ks)) != len(ks):
        raise click.BadParameter(f"{text!r} names a K twice; give each K once", param_hint="--ks")
    return ks


@contextlib.contextmanager
def _own(run_dir: pathlib.Path, made=()):
    """Hold ``run_dir``'s lock for the block. Directories this creates for it, and those
    ``made`` for it before (innermost first), are removed again if they are still empty
    at the end (a run refused before writing anything leaves nothing behind)."""
    created = list(made)
    for p in (run_dir, *run_dir.parents):
        if p.exists():
            break
        created.append(p)
    lock = DirectoryLock(run_dir)
    try:
        lock.acquire()
    except DirectoryLocked as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(_os_error(exc, run_dir, started=False)) from None
    try:
        yield
    finally:
        lock.release()
        _remove_if_empty(created)


#: parameters of `train` that make up the run's configuration (not --out, --resume, --trace)
_CONFIG_PARAMS = ("dataset", "data_dir", "model", "optimizer", "rounds", "client_fraction",
                  "init_scale", "dtype", "seed", "eval_every", "ks", "defense", "detect", "preset",
                  "pre", "attack", "alpha", "assumed_byzantine", "verify", "resilience", "backend",
                  "checkpoint_every", "out", *(g.param for g in _GENERATED))


def _collect_pre(kwargs: dict, pre) -> dict:
    """The pre-aggregators' hyperparameters given; an option none of them takes is an error."""
    from rfrs_ref.aggregate.pre import pre_hyperparameters

    takes = pre_hyperparameters(pre)
    out = {}
    for g in _pre_gen:
        value = kwargs.pop(g.param, None)
        if value is None:
            continue
        if g.field not in takes:
            owners = [n for n, cls in PRE.items() if g.field in pre_hyperparameters([n])]
            raise click.UsageError(f"--{g.flag} applies to --pre {' or '.join(owners)}, which is "
                                   "not among the pre-aggregators given")
        out[g.field] = value
    return out


def _given(ctx: click.Context, name: str) -> bool:
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def _flag(ctx: click.Context, name: str) -> str:
    for p in ctx.command.params:
        if p.name == name:
            return p.opts[0]
    return f"--{name.replace('_', '-')}"  # pragma: no cover


def _refuse_options_with_resume(ctx: click.Context) -> None:
    """A resumed run is the recorded one: an option that would change it is an error,
    not silently ignored."""
    given = [_flag(ctx, n) for n in _CONFIG_PARAMS if _given(ctx, n)]
    if given:
        raise click.UsageError(f"--resume continues the run recorded in its directory, so "
                               f"{', '.join(given)} cannot be given with it; start a new run "
                               "(--out) to change the configuration")


def _refuse_conflicts_with_preset(ctx: click.Context, preset: str, **explicit) -> None:
    """A preset sets fields (the rule and the detection space); the same fields given
    explicitly with other values are an error naming both, never silently dropped."""
    rule, detect = PRESETS[preset]
    sets = {"defense": "none" if rule == "mean" else rule, "detect": detect}
    for name, value in explicit.items():
        if _given(ctx, name) and value != sets[name]:
            raise click.UsageError(f"--preset {preset} sets {_flag(ctx, name)} {sets[name]}, which "
                                   f"conflicts with {_flag(ctx, name)} {value}; give one of them")


def _recorded_folder_hint(run_dir: pathlib.Path) -> str:
    """For a resumed run whose dataset the loader did not find (another shell, without
    RFRS_DATA_DIR): the folder the run read it from, as its config.json records it, when
    the files are still there, and the command that resumes with it; else nothing."""
    import shlex

    from rfrs_ref.cli.recommend import _recorded_data_dir
    from rfrs_ref.untrusted import parse_json

    try:
        record = parse_json((run_dir / "config.json").read_bytes(), "config.json")
        here = _recorded_data_dir(record.get("data_files"))
    except (OSError, ValueError, AttributeError):
        return ""
    if here is None:
        return ""
    return (f" The run read it from {here}: resume with RFRS_DATA_DIR={shlex.quote(str(here))} "
            f"rfrs-ref train --resume {shlex.quote(str(run_dir))}")


def _one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (a KeyError's message without its quotes)."""
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(str(text).split()) or type(exc).__name__


def _os_error(exc: OSError, run_dir: pathlib.Path, *, started: bool) -> str:
    """What went wrong writing the run directory, and what to do about it."""
    where = exc.filename or run_dir
    reason = exc.strerror or _one_line(exc)
    if started and (run_dir / "config.json").exists():
        again = (f"then continue with `rfrs-ref train --resume {run_dir}` (files written so "
                 "far are complete; the last checkpoint is intact)")
    else:
        again = "then run the same command again"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{where}: {reason}; free some space, {again}"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{where}: {reason}; choose a writable run directory (--out)"
    if exc.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
        return f"{where}: {reason}; --out must name a directory (or a path where one can be made)"
    return f"{where}: {reason}; fix this, {again}"


def _checkpoint_round(run_dir: pathlib.Path) -> int:
    """The round of ``run_dir``'s checkpoint (0 when there is none: the run restarts), for
    the progress bar; a damaged checkpoint is reported by the run itself."""
    import numpy as np

    try:
        with np.load(run_dir / "checkpoint.npz", allow_pickle=False) as z:
            return max(0, int(z["round"]))
    except Exception:  # noqa: BLE001 - absent or damaged: the run says which, with advice
        return 0


def _target_ids(targets, run_dir) -> str:
    """`` (dense indices; items [...] in the dataset's files)`` for the summary's target items,
    where the dataset's ids differ from the indices (MovieLens: id − 1), so that they can be
    found in what `rfrs-ref recommend` prints; empty where they agree or ids.npz is unreadable."""
    import numpy as np

    try:
        with np.load(pathlib.Path(run_dir) / "ids.npz", allow_pickle=False) as z:
            items = z["item_ids"]
        ids = [int(items[int(t)]) for t in targets]
    except Exception:  # noqa: BLE001 - the indices alone, as config.json records them
        return ""
    if ids == [int(t) for t in targets]:
        return ""
    return f" (dense indices; items {ids} in the dataset's files, as recommend prints them)"


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
    if final.get("target_items") is not None:
        targets = final["target_items"]
        click.echo(f"target items {targets}{_target_ids(targets, run_dir)}: "
                   + ", ".join(f"ER@{k} {m[f'er@{k}']:.4f}" for k in ks) + "; "
                   + ", ".join(f"TargetHR@{k} {m[f'target_hr@{k}']:.4f}" for k in ks))
    sel = final["selection"]
    if sel["byzantine_share_sampled"] > 0:
        click.echo(f"Byzantine share: {sel['byzantine_share_sampled']:.3f} of sampled clients, "
                   f"{sel['byzantine_share_kept']:.3f} of kept clients; "
                   f"{final['exclusions']} uploads excluded by verification")
    if final.get("resilience"):
        click.echo("resilience sums (the paper's Definitions 1-4; docs/optimizers.md, "
                   "\"Resilience quantities\"): " + ", ".join(
                       f"{k} {v:.4g}" if isinstance(v, (int, float)) and not isinstance(v, bool)
                       else f"{k} non-finite (from round "
                            f"{(final.get('resilience_non_finite') or {}).get(k, '?')})"
                       for k, v in final["resilience"].items()))
        click.echo("  C_g = Σ over rounds, kept clients i and benign clients j of ‖ĝᵢ − gⱼ‖ "
                   "(recovered vs true gradients); C_m, C_v, C_r, C_theta: the same distance "
                   "for each uploaded array. Smaller is more resilient; compare runs, not "
                   "absolute values (they grow with the rounds, clients and D)")
    click.echo(f"results: {run_dir}")
