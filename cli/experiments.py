"""``rfrs-ref reproduce``, ``rfrs-ref sweep`` and ``rfrs-ref plot``: the paper's figures."""

from __future__ import annotations

import pathlib
import time

import click

_FIGURE_HELP = ("Figure number (1, 2, 3, 4, 7, 8, 10, 11, 12) or name (pca, camouflage, frs, "
                "defenses, frs-recall, defenses-recall, adam-sgd, momentum, adagrad).")


def _execution_options(f):
    f = click.option("--scheduler", default=None, metavar="ADDRESS",
                     help="Run on an existing Dask cluster (e.g. tcp://host:8786) instead of an "
                          "embedded LocalCluster.")(f)
    f = click.option("--workers", type=click.IntRange(min=0), default=None,
                     help="LocalCluster worker processes [default: one per core, fewer if memory "
                          "is short]; 0 runs in this process without Dask.")(f)
    f = click.option("--threads", type=click.IntRange(min=1), default=None,
                     help="Numba/OpenMP threads per LocalCluster worker "
                          "[default: cores // workers].")(f)
    f = click.option("--shared-fs/--no-shared-fs", default=None,
                     help="Whether the workers see the output directory [default: yes for a "
                          "LocalCluster, no for --scheduler].")(f)
    f = click.option("--retry-failed/--no-retry-failed", default=True, show_default=True,
                     help="Run again the runs recorded as failed, and those recorded as "
                          "finished or diverged without a result (shown as failed); never "
                          "those recorded as diverged at a round of the run: a divergence is "
                          "an outcome. Without it a call that "
                          "leaves a failed run exits with status 1 all the same.")(f)
    f = click.option("--keep-state", is_flag=True,
                     help="Keep each run's final state.npz (large for the big datasets).")(f)
    f = click.option("--low-memory", is_flag=True,
                     help="Robust runs (Krum, RFA, MDA, MoNNA, CAF, SMEA with verification) "
                          "hold their uploads 16 clients at a time and compute the kept "
                          "clients' uploads twice: the same results, bit for bit, in about "
                          "two thirds of the memory, about 1.15 times the time "
                          "(docs/performance.md).")(f)
    f = click.option("--reuse-from", "reuse_from", multiple=True,
                     type=click.Path(file_okay=False, exists=True), metavar="DIR",
                     help="Another results directory of yours (repeatable): a run it records "
                          "as finished or diverged, with the same configuration, is copied "
                          "instead of run (Fig. 3's A-FRS, Fig. 2's No attack and Fig. 10's "
                          "Adam are the same runs).")(f)
    return f


def missing_folders(out: pathlib.Path) -> list[pathlib.Path]:
    """The folders of the path ``out`` that do not exist yet, ``out`` first: those a hold on
    it makes (``cli.train._remove_if_empty`` removes them again, innermost first, while
    they are empty)."""
    made, p = [], pathlib.Path(out)
    while not (p.exists() or p.is_symlink()) and p != p.parent:
        made.append(p)
        p = p.parent
    return made


def shared_hold(out: pathlib.Path):
    """A shared hold on the output directory ``out`` (acquired; the caller releases it):
    commands that only add files (plot, mechanism) may write beside each other, but not
    into a directory a run or a sweep owns, nor may one start there meanwhile; nor into a
    run's directory at all, finished or not, nor into a results directory's ``runs/`` folder
    (:func:`~rfrs_ref.experiments.results.sweep_owned`). A refusal is one line. The hold
    makes ``out`` and its missing parents (:func:`missing_folders`); refused, or released
    with those folders still empty (the command failed before writing), it removes them."""
    from rfrs_ref.experiments.results import sweep_owned
    from rfrs_ref.files import DirectoryLock, DirectoryLocked

    why = sweep_owned(out)
    if why is not None:
        # a run's directory is its run's, finished or not (a sweep clears it when the run
        # starts again), as train, flower, golden export and sweep refuse it for --out; the
        # runs/ folder holds the sweep's run directories only
        raise click.ClickException(f"--out {out} {why}; give a directory outside any run's "
                                   "and outside runs/; nothing was written")
    made = missing_folders(out)
    lock = DirectoryLock(out, shared=True)
    try:
        lock.acquire()
    except (DirectoryLocked, OSError) as exc:
        from rfrs_ref.cli.train import _remove_if_empty

        _remove_if_empty(made)  # a hold refused leaves none of the folders it made
        if isinstance(exc, DirectoryLocked):
            raise click.ClickException(str(exc)) from None
        raise click.ClickException(f"--out {out}: {exc.strerror or exc}") from None
    return _Hold(lock, made)


class _Hold:
    """:func:`shared_hold`'s lock: :meth:`release` frees it, then removes the folders the
    hold made while they are empty (only a command that wrote nothing leaves them so)."""

    def __init__(self, lock, made: list[pathlib.Path]) -> None:
        self.lock, self.made = lock, made

    def release(self) -> None:
        from rfrs_ref.cli.train import _remove_if_empty

        self.lock.release()
        _remove_if_empty(self.made)


def _parse_overrides(items) -> dict:
    import json

    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"{item!r} is not FIELD=VALUE", param_hint="--set")
        try:
            out[name.strip()] = json.loads(value)
        except ValueError:
            out[name.strip()] = value
    return out


def _dataset_names() -> tuple[str, ...]:
    from rfrs_ref.data import DATASETS

    return tuple(DATASETS)


def _parse_datasets(text):
    """``--datasets ml100k,lastfm`` as dataset names (None where not given): each a
    registered dataset, spaces around a name allowed; an empty entry (``ml100k,``) or an
    unknown name is refused here, before any run is planned (a sweep of runs of dataset
    ``foo`` would fail every one of them)."""
    if text is None or text == "":
        return None
    names = [part.strip() for part in text.split(",")]
    for name in names:
        if name not in _dataset_names():
            what = "an empty name" if not name else f"{name!r}"
            raise click.BadParameter(f"{what} in {text!r} is not a dataset; choose among "
                                     f"{', '.join(_dataset_names())} (comma-separated)",
                                     param_hint="--datasets")
    return tuple(names)


def _parse_alphas(text):
    """``--alphas 0.4,0.2`` as floats (None where not given)."""
    if text is None:
        return None
    out = []
    for part in text.split(","):
        try:
            out.append(float(part))
        except ValueError:
            raise click.BadParameter(f"{part.strip()!r} in {text!r} is not a number; give "
                                     f"fractions such as 0.4,0.2", param_hint="--alphas") from None
    return tuple(out)


class _Progress:
    """Run-level progress (:class:`rfrs_ref.cli.progress.Progress`), fed by run_sweep's events."""

    def __init__(self, started: float | None = None) -> None:
        self.bar = None
        self.runs_done_at = None  # elapsed seconds when the last run finished
        self.started = time.perf_counter() if started is None else started

    def __call__(self, event, spec, outcome, report) -> None:
        from rfrs_ref.cli.progress import Progress

        if event == "reused":
            return
        if event == "plan":
            todo = report.total - report.skipped - report.reused
            where = (f"{report.workers} Dask worker(s)" if report.workers else "this process")
            reused = f"{report.reused} copied from --reuse-from, " if report.reused else ""
            click.echo(f"{report.total} runs: {_recorded(report, 'already finished')}{reused}"
                       f"{todo} to run on {where}")
            self.bar = Progress(todo, label="run", started=self.started,
                                parallel=max(1, report.workers or 1),
                                first_note="the first runs also compile the Numba kernels "
                                           "(up to a minute the first time; cached afterwards)")
            return
        label = ", ".join(f"{v}" for v in spec.labels.values())
        c = spec.config
        # the fraction tells apart runs of one series at several α (Fig. 4's grid)
        alpha = (f" α={c.byzantine_fraction:g}" if c.byzantine_fraction
                 and f"{c.byzantine_fraction:g}" not in label else "")
        what = f"{c.dataset}{alpha} {label} seed {c.seed}".strip()
        if event == "failed":
            last = f"FAILED {what}"
            click.echo(f"\nrun {spec.key} ({what}) failed: {outcome.get('error')}", err=True)
        elif event == "diverged":
            d = outcome.get("divergence") or {}
            last = f"DIVERGED {what} at round {d.get('round')}"
            click.echo(f"\nrun {spec.key} ({what}) diverged at round {d.get('round')} "
                       f"({d.get('reason')}: {d.get('what')}); recorded as an outcome", err=True)
        else:
            model = ((outcome.get("final") or {}).get("model") or {})
            kmax = max(c.ks)
            p = model.get(f"precision@{kmax}")
            last = f"last: {what} {outcome.get('wall_s', 0):.0f}s" + (
                f" P@{kmax} {p:.4f}" if p is not None else "")
        if self.bar is not None:
            self.bar.update(report.finished + report.failed + report.diverged, last)

    def close(self) -> None:
        if self.bar is not None:
            self.runs_done_at = self.bar.last_update
            self.bar.close()
            self.bar = None


def _message(exc: BaseException) -> str:
    """One line for a person: a KeyError without its quotes, an OSError as "path: reason"."""
    if isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    elif isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = str(exc)
    return " ".join(text.split())


def _run(go, progress: _Progress):
    from rfrs_ref.experiments.results import StoreLocked

    try:
        return go()
    except KeyboardInterrupt:
        progress.close()
        click.echo("\ninterrupted: finished runs are recorded; run the same command again to "
                   "continue", err=True)
        raise SystemExit(130) from None
    except (ValueError, StoreLocked, KeyError, OSError) as exc:
        progress.close()
        raise click.ClickException(_message(exc)) from exc
    finally:
        progress.close()


def _check_extras(workers, scheduler) -> None:
    """Before anything is written: Dask asked for but not installed is a one-line error; the
    default without it runs in this process, and says so."""
    from rfrs_ref.experiments.sweep import DASK_MISSING, dask_available

    if workers == 0 or dask_available():
        return
    if scheduler is not None or workers is not None:
        raise click.UsageError(DASK_MISSING)
    click.echo("Dask is not installed (pip install 'rfrs-ref[distributed]' for parallel runs): "
               "running the runs one after the other in this process")


def _tables(out: pathlib.Path) -> None:
    names = [n for n in ("results.parquet", "results.csv", "runs.csv", "summary.csv", "summary.md")
             if (out / n).exists()]
    click.echo("tables: " + ", ".join(str(out / n) for n in names))


def _recorded(report, finished: str) -> str:
    """The runs a sweep did not run because they were recorded before, by what they are:
    finished (or diverged), failed and not retried, or recorded as finished or diverged
    without a result (a metric that is not a finite number, a final evaluation before the
    last round, a divergence at no round of the run: the tables show those as failed) and
    not retried."""
    done = report.skipped - report.kept_failed - report.no_result
    return (f"{done} {finished}, "
            + (f"{report.kept_failed} failed before (not retried), " if report.kept_failed else "")
            + (f"{report.no_result} recorded as finished or diverged without a result (a "
               "metric that is not a finite number in [0, 1], a final evaluation before the "
               "last round, a beats_popularity its precision does not say, or a divergence "
               "at no round of the run or for no reason of the trainer's; shown as failed, "
               "not retried), " if report.no_result else ""))


def _failed(report) -> bool:
    """Whether the call leaves a run of the sweep failed: one that failed now, or a failure
    recorded before and not retried (``--no-retry-failed``), a record of a finished run
    without a result included. Such a call exits with status 1: a sweep whose runs did not
    all finish (or diverge) is no success."""
    return bool(report.failed or report.kept_failed or report.no_result)


def _report(report, started: float, progress: _Progress, after: str = "tables") -> None:
    from rfrs_ref.cli.progress import duration

    runs = ("" if progress.runs_done_at is None else
            f" (runs done at {duration(progress.runs_done_at)}, then {after})")
    click.echo(f"{report.total} runs: {_recorded(report, 'skipped (already finished)')}"
               + (f"{report.reused} copied (--reuse-from), " if report.reused else "")
               + f"{report.finished} finished, "
               + (f"{report.diverged} diverged, " if report.diverged else "")
               + f"{report.failed} failed "
               + (f"{report.pending} not run (--no-run) " if report.pending else "")
               + f"in {duration(time.perf_counter() - started)}{runs} -> {report.out}")
    for spec, error in report.failures:
        click.echo(f"  failed: {spec.key} {dict(spec.labels)} seed {spec.config.seed}: {error}",
                   err=True)
    for path, why, again in getattr(report, "damaged", ()):
        click.echo(f"  note: {path} does not read as a run's record ({why}): "
                   + ("run again" if again else "counted as failed, not retried (--no-retry-failed)"),
                   err=True)


def _list_runs(runs, out: pathlib.Path, low_memory: bool = False) -> None:
    """One line per run: its key, its status in ``out`` (to run, ok, failed, diverged; a
    record of a finished or diverged run without a result is failed, as the tables show
    it), its dataset, labels, seed and estimated memory (``--dry-run``: nothing is
    written)."""
    from rfrs_ref.experiments.results import Store, record_of_another_run, unfinished_reason
    from rfrs_ref.experiments.sweep import estimate_run_memory

    store = Store(out)
    try:
        for i, r in enumerate(runs):
            o = store.read_outcome(r.key) if out.exists() else None
            if isinstance(o, dict) and record_of_another_run(o, r.key) is not None:
                o = None  # another run's record: none of this run's (the sweep runs it again)
            status = o.get("status") if isinstance(o, dict) else "to run"
            if (status in ("ok", "diverged")
                    and unfinished_reason(o, r.config.resolved()) is not None):
                status = "failed"
            c = r.config
            alpha = f" α={c.byzantine_fraction:g}" if c.byzantine_fraction else ""
            click.echo(f"{i:4d} {r.key} {status:8s} {c.dataset}{alpha} {dict(r.labels)} "
                       f"seed {c.seed} ~{estimate_run_memory(r, low_memory) / 1e9:.1f} GB")
    except BrokenPipeError:
        raise  # the reader has gone (`| head`): click ends quietly, as other commands do
    except (ValueError, KeyError, OSError) as exc:
        raise click.ClickException(_message(exc)) from None


@click.command("reproduce")
@click.argument("figure_name", metavar="FIGURE")
@click.option("--quick", is_flag=True,
              help="Reduced version: ML100K only, 2 trials, a third of the default rounds.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Output directory [default: results/<experiment>, with a suffix for a "
                   "reduced scale, e.g. results/defenses-quick or results/defenses-20rounds-1trials].")
@click.option("--datasets", default=None,
              help=f"Comma-separated datasets (overrides the figure's), among "
                   f"{', '.join(_dataset_names())}; anything else is refused before a run "
                   "is planned.")
@click.option("--trials", type=click.IntRange(min=1), default=None, help="Trials (seeds 0..N-1), on every dataset of the figure (add --datasets ml100k for a small run).")
@click.option("--rounds", type=click.IntRange(min=1), default=None, help="Rounds of every run, on every dataset of the figure (add --datasets ml100k for a small run).")
@click.option("--alphas", default=None, metavar="A,B,...",
              help="Comma-separated Byzantine fractions α, run in the order given (overrides "
                   "the figure's, e.g. --alphas 0.4,0.2; figures 4, 8, 11, 12, the ablations "
                   "and the ranking). The tables keep the runs recorded at the others.")
@click.option("--resilience", is_flag=True, help="Record the Definition 1–4 sums in every run.")
@click.option("--backend", type=click.Choice(["numba", "numpy", "cuda"]), default="numba",
              show_default=True)
@click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE",
              help="Set a TrainConfig field in every run (VALUE is JSON, else a string), e.g. "
                   "--set client_fraction=0.05 --set 'dataset_params={\"n_users\": 200}'.")
@click.option("--no-plot", is_flag=True, help="Run and tabulate only.")
@click.option("--dry-run", is_flag=True,
              help="List the runs, their keys, status in the output directory and memory; "
                   "run and write nothing.")
@click.option("--no-run", is_flag=True,
              help="Run nothing: write the tables and figures of the runs already recorded "
                   "in the output directory (e.g. of a sweep that is not finished).")
@_execution_options
def reproduce(figure_name, quick, out, datasets, trials, rounds, alphas, resilience, backend,
              overrides,
              no_plot, dry_run, no_run, scheduler, workers, threads, shared_fs, retry_failed, keep_state,
              low_memory, reuse_from):
    """Reproduce one of the paper's figures: sweep, tables, plots.

    FIGURE is the paper's figure number or name: 1 (pca), 2 (camouflage),
    3 (frs), 4 (defenses), 7 (frs-recall), 8 (defenses-recall),
    10 (adam-sgd), 11 (momentum), 12 (adagrad); or an ablation of Fig. 4:
    ablation-init, ablation-sampled, ablation-krum1, ablation-exact,
    ablation-rounds (see docs/reproduction.md); or ranking, every rule with
    and without NNM ranked by Precision@5 (figures/ranking.md; docs/defenses.md).

    Runs already finished in the output directory are skipped, so an
    interrupted reproduction continues where it stopped, and figures that
    share runs (3 and 7, 4 and 8) reuse them.

    \b
    Examples:
      rfrs-ref reproduce 4 --quick
      rfrs-ref reproduce defenses --scheduler tcp://10.0.0.5:8786
      rfrs-ref reproduce 3 --out results/frs --reuse-from results/adam-sgd
    """
    from rfrs_ref.experiments.figures import (Scale, describe_runs, figure, left_out_notes,
                                              reproduce as run_figure)
    from rfrs_ref.experiments.results import summary_markdown

    try:
        fig = figure(figure_name)
    except KeyError as exc:
        raise click.BadParameter(str(exc.args[0]), param_hint="FIGURE") from None
    try:
        scale = fig.scale(Scale(
            quick=quick, datasets=_parse_datasets(datasets),
            trials=trials, rounds=rounds, resilience=resilience, backend=backend,
            overrides=_parse_overrides(overrides), fractions=_parse_alphas(alphas)))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--alphas") from None
    out = pathlib.Path(out) if out else fig.default_out(scale)
    _check_extras(workers, scheduler)
    try:
        runs = fig.runs(scale)
        left = fig.left_out(scale)
    except (ValueError, KeyError) as exc:
        raise click.ClickException(str(exc.args[0] if exc.args else exc)) from None
    click.echo(f"{fig.title}\n{'quick: ' if quick else ''}{describe_runs(runs)} -> {out}")
    for note in left_out_notes(left):  # runs whose rule could not aggregate any round
        click.echo(f"note: {note}")
    if dry_run:
        from rfrs_ref.experiments.spec import check_unique
        from rfrs_ref.experiments.sweep import check_runs

        try:  # what a real call refuses before anything is written, in the same line
            check_runs(runs, feasible=not no_run)
            check_unique(runs)
        except (ValueError, KeyError) as exc:
            raise click.ClickException(_message(exc)) from None
        _list_runs(runs, out, low_memory)
        return
    started = time.perf_counter()
    progress = _Progress(started)
    after = "tables" if no_plot else "tables and figures"
    report, paths = _run(lambda: run_figure(
        fig, scale, out, plot=not no_plot, scheduler=scheduler, workers=workers, threads=threads,
        shared_fs=shared_fs, retry_failed=retry_failed, keep_state=keep_state,
        low_memory=low_memory, on_event=progress, runs=runs, run=not no_run,
        reuse_from=reuse_from), progress)
    _report(report, started, progress, after)
    if report.summary is not None and not report.summary.empty:
        metrics = (fig.metric, "ndcg", "hr", "mrr")
        click.echo("")
        click.echo(summary_markdown(report.summary, metrics=metrics,
                                    label_columns=report.label_columns))
    _tables(out)
    for p in paths:
        click.echo(f"figure: {p}")
    if _failed(report):
        raise SystemExit(1)


@click.command("sweep")
@click.argument("spec", metavar="FILE", type=click.Path(dir_okay=False, exists=True))
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Output directory [default: results/<sweep name>].")
@click.option("--dry-run", is_flag=True, help="List the runs, their keys and memory, run nothing.")
@click.option("--no-plot", is_flag=True, help="Write the tables only, no figure.")
@_execution_options
def sweep(spec, out, dry_run, no_plot, scheduler, workers, threads, shared_fs, retry_failed,
          keep_state, low_memory, reuse_from):
    """Run the grid of training runs described in the TOML file FILE.

    \b
    The file has a [base] table (TrainConfig fields), an [axes] table whose
    lists are crossed, and trials = N (or seeds = [...]); see
    docs/reproduction.md. Example:
      trials = 2
      [base]
      dataset = "ml100k"
      attack = "ascent"
      [axes]
      byzantine_fraction = [0.2, 0.4]
      preset = ["no-defense", "a-rfrs"]
    """
    from rfrs_ref.experiments.results import summary_markdown
    from rfrs_ref.experiments.spec import load_sweep
    from rfrs_ref.experiments.sweep import run_sweep

    try:
        sw = load_sweep(spec)
    except ValueError as exc:
        raise click.ClickException(_message(exc)) from None
    out = pathlib.Path(out) if out else pathlib.Path("results") / sw.name
    label_columns = tuple(f"label_{k}" for k in (sw.runs[0].labels if sw.runs else {}))
    if dry_run:  # where the runs would go, as reproduce --dry-run says it
        click.echo(f"sweep {sw.name}: {len(sw.runs)} runs -> {out}")
        _list_runs(sw.runs, out, low_memory)
        return
    _check_extras(workers, scheduler)
    if not no_plot:
        from rfrs_ref.experiments.figures import refuse_foreign_figures
        from rfrs_ref.experiments.plots import figure_files

        try:  # a user's own figures/sweep.png in a new --out: refused before anything runs
            refuse_foreign_figures(out, figure_files(out / "figures" / "sweep"))
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"sweep {sw.name}: {len(sw.runs)} runs -> {out}")
    started = time.perf_counter()
    progress = _Progress(started)
    report = _run(lambda: run_sweep(
        sw.runs, out, scheduler=scheduler, workers=workers, threads=threads, shared_fs=shared_fs,
        retry_failed=retry_failed, keep_state=keep_state, low_memory=low_memory,
        on_event=progress,
        label_columns=label_columns, reuse_from=reuse_from), progress)
    _report(report, started, progress)
    if report.summary is not None and not report.summary.empty:
        click.echo("")
        click.echo(summary_markdown(report.summary, label_columns=report.label_columns))
    _tables(out)
    if not no_plot and report.summary is not None and not report.summary.empty:
        for p in _plot_sweep(out):
            click.echo(f"figure: {p}")
    if _failed(report):
        raise SystemExit(1)


def _check_series(fig, table, path) -> None:
    """Refuse a figure none of whose series the table holds (Fig. 3's title over Fig. 4's
    defences)."""
    from rfrs_ref.experiments.figures import Scale
    from rfrs_ref.experiments.plots import series_column

    scol = series_column(table)  # the column the figure's lines are drawn from
    labels = [c for c in table.columns if c.startswith("label_") and c != "label_series"]
    if scol != "label_series" and labels:
        raise click.ClickException(
            f"{path} is a sweep's table (series by {', '.join(labels)}), not a figure's: "
            "plot it without --figure")
    if scol not in table.columns:
        return
    try:
        wanted = {s.labels.get("series") for s in fig.runs(Scale(quick=True))} - {None}
    except Exception:  # noqa: BLE001 - a grid that needs its dataset (Fig. 1): no check
        return
    held = set(table[scol].dropna().astype(str))
    if wanted and not wanted & held:
        raise click.ClickException(
            f"{path} holds the series {', '.join(sorted(held)) or '(none)'}, none of figure "
            f"{fig.id}'s ({', '.join(sorted(wanted))}): give the figure its runs were made "
            "for, or no --figure for a sweep's panels")


def _table_error(exc: BaseException, results: pathlib.Path) -> str:
    """The message of an error met while plotting the table read from ``results``; a
    defect of one of its rows (:class:`~rfrs_ref.experiments.claims.TableError`, which
    names the line) is prefixed with the file that line counts in."""
    from rfrs_ref.experiments.claims import TableError
    from rfrs_ref.experiments.results import table_source

    msg = " ".join(str(exc).split())
    if not isinstance(exc, TableError):
        return str(exc)
    where = str(table_source(results))
    return msg if where in msg else f"{where}: {msg}"


# the columns every table of `reproduce` and `sweep` has (read_table joins results.csv and
# runs.csv): a CSV without them is some other file, not a results table
_TABLE_COLUMNS = ("key", "status", "k", "metric", "value")


def _results_table(path: pathlib.Path):
    """The results table at ``path`` (a results directory, its results.csv or .parquet),
    refused in one line saying what to give when the file is some other table (a run's
    metrics.csv), instead of failing later on a column it lacks; a run's row whose α or K
    is no number of a run is refused (:func:`~rfrs_ref.experiments.claims.check_cells`)."""
    from rfrs_ref.experiments.results import read_table, table_source

    table = read_table(path)
    missing = [c for c in _TABLE_COLUMNS if c not in table.columns]
    if missing:
        source = table_source(path)
        raise ValueError(f"{source}: not a results table of rfrs-ref (without the column(s) "
                         f"{', '.join(missing)}); give a results directory that `rfrs-ref "
                         "reproduce` or `rfrs-ref sweep` wrote, or its results.csv")
    from rfrs_ref.experiments.claims import check_cells

    # a run at α = inf was drawn in a panel "inf% Byzantine" of its own, exit 0
    check_cells(table)
    return table


def write_error(exc: OSError, what: str) -> str:
    """One line for files that could not be written (a full disk...), ``what`` naming them;
    the files already there are whole: each is replaced in one step."""
    name = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return f"could not write {what}{name}: {exc.strerror or exc}"


def _plot_sweep(out: pathlib.Path, figures: pathlib.Path | None = None,
                source: pathlib.Path | None = None) -> list[pathlib.Path]:
    """The sweep's Precision@K panels into ``figures`` (default out/figures/sweep.*), from
    the table at ``source`` (default: the results directory ``out``)."""
    from rfrs_ref.experiments.plots import plot_sweep

    figures = figures or out / "figures"
    source = out if source is None else source
    notes: list[str] = []
    try:
        table = _results_table(source)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise click.ClickException(_table_error(exc, source)) from exc
    # the shared hold a figure's plot takes (see plot): without it, sweep.png and sweep.pdf
    # went into a directory a live run or sweep owns
    lock = shared_hold(figures)
    try:
        paths = plot_sweep(table, figures / "sweep", notes=notes)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise click.ClickException(_table_error(exc, source)) from exc
    except OSError as exc:  # a full disk, a file that cannot be replaced: said, not a traceback
        raise click.ClickException(write_error(exc, f"the figures into {figures}")) from exc
    finally:
        lock.release()  # removes the folders the hold made, if nothing was written
    for n in notes:  # a line drawn over fewer runs than the table holds is said
        click.echo(f"note: {n}", err=True)
    return paths


@click.command("plot")
@click.argument("results", type=click.Path(exists=True))
@click.option("--figure", "figure_name", default=None,
              help=_FIGURE_HELP + " [default: a sweep's panels, one per dataset, one line per "
                                  "label combination].")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Directory for the PNG and PDF files [default: figures/ beside the table].")
def plot(results, figure_name, out):
    """Plot a results table (results.parquet / results.csv, or its directory) like a paper figure.

    Draws the figure's panels (K on the x axis, mean ± std over trials), the
    training curves and, when recorded, the resilience sums, as PNG and PDF.
    Without --figure, the panels of a sweep (figures/sweep.png). A figure whose
    series the table does not hold is refused rather than drawn under its title.
    A finished run whose record (outcome.json) is missing, unreadable or holds a
    metric that is not a finite number is an error naming the file (exit status
    1); diverged runs are not drawn, and a line drawn over fewer runs than the
    table holds is named in its panel's title and in a "note:" line. A table, run
    directory or record inside RESULTS that is a link, or a file there that is no
    regular file (a FIFO), is refused, as verdict and ranking refuse them.
    """
    from rfrs_ref.experiments.figures import figure, plot_figure
    from rfrs_ref.experiments.results import refuse_linked_input

    try:
        # as verdict and ranking: a table, run directory or record read through a link
        # would be drawn as this directory's while it may be any file of the machine
        refuse_linked_input(results, done="drawn")
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if figure_name is None:
        path = pathlib.Path(results)
        base = path if path.is_dir() else path.parent
        # the table named (a results.csv of another name included), drawn beside it
        for p in _plot_sweep(base, pathlib.Path(out) if out else None, source=path):
            click.echo(f"figure: {p}")
        return
    try:
        fig = figure(figure_name)
    except KeyError as exc:
        raise click.BadParameter(str(exc.args[0]), param_hint="--figure") from None

    path = pathlib.Path(results)
    base = path if path.is_dir() else path.parent
    try:
        table = _results_table(path)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise click.ClickException(_table_error(exc, path)) from exc
    _check_series(fig, table, path)
    out = pathlib.Path(out) if out else base / "figures"
    # a shared hold on the figures' directory: other plots may write beside ours, but not
    # into a directory a run or a sweep owns (a sweep owns its results directory, not the
    # figures/ folder in it, so a sweep under way can be plotted)
    lock = shared_hold(out)
    notes: list[str] = []
    try:
        paths = plot_figure(fig, table, base, out, notes=notes)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise click.ClickException(_table_error(exc, path)) from exc
    except OSError as exc:
        raise click.ClickException(write_error(exc, f"the figures into {out}")) from exc
    finally:
        lock.release()  # removes the folders the hold made, if nothing was written
    for p in paths:
        click.echo(f"figure: {p}")
    for n in notes:  # a line drawn over fewer runs than the table holds is said
        click.echo(f"note: {n}", err=True)
