"""``rfrs-ref mechanism``: per-round measurements of why a defence keeps Byzantine clients."""

from __future__ import annotations

import pathlib
import re

import click

from rfrs_ref.cli.experiments import _parse_overrides, shared_hold, write_error


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", str(text).lower()).strip("-")


@click.command("mechanism")
@click.argument("figure_name", metavar="FIGURE")
@click.option("--dataset", required=True, help="The dataset of the figure's runs to measure.")
@click.option("--alpha", type=float, default=None,
              help="Byzantine fraction of the runs (required when the figure has several).")
@click.option("--series", "series", multiple=True,
              help="Series to measure (repeatable) [default: every series of the figure].")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=None,
              help="Rounds [default: the figure's].")
@click.option("--every", type=click.IntRange(min=1), default=1, show_default=True,
              help="Measure every N-th round (and the last).")
@click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE",
              help="Set a TrainConfig field, as in `rfrs-ref reproduce`.")
@click.option("--out", type=click.Path(file_okay=False), required=True,
              help="Directory for the per-round CSV files, the summary and the PNG.")
@click.option("--again", is_flag=True,
              help="Measure every series again, even one whose table in --out is complete.")
def mechanism(figure_name, dataset, alpha, series, seed, rounds, every, overrides, out, again):
    """Measure, after every round of a figure's runs, the cosines between gradients, the
    rank correlation of Krum's score with the gradient norm, and the Byzantine share
    sampled -> kept.

    The runs are the figure's own (same configuration and seed as in
    `rfrs-ref reproduce FIGURE`), one per series. Writes one CSV per series
    (a row per round), a Markdown summary (means over the rounds) and a PNG.
    A series whose table in --out already holds this run (same key) at every
    round asked for is read, not measured again (--again measures it anyway),
    so an interrupted call continues, and series measured by separate calls
    (--series) are summarised together by a last call. See docs/reproduction.md.

    \b
    Example:
      rfrs-ref mechanism 4 --dataset ml100k --alpha 0.4 --out results/mechanism
    """
    from rfrs_ref.experiments.figures import Scale, figure

    try:
        fig = figure(figure_name)
    except KeyError as exc:
        raise click.BadParameter(str(exc.args[0]), param_hint="FIGURE") from None
    if fig.kind != "k":
        raise click.BadParameter(f"figure {fig.id} has no training runs to measure",
                                 param_hint="FIGURE")
    try:
        scale = Scale(datasets=(dataset,), trials=seed + 1, rounds=rounds,
                      overrides=_parse_overrides(overrides))
        runs = [r for r in fig.runs(scale) if r.config.seed == seed]
    except (ValueError, KeyError) as exc:
        raise click.ClickException(str(exc)) from exc
    alphas = sorted({r.config.byzantine_fraction for r in runs})
    if alpha is None and len(alphas) > 1:
        raise click.BadParameter(f"figure {fig.id} runs α = {', '.join(map(str, alphas))}; "
                                 "choose one", param_hint="--alpha")
    if alpha is not None:
        runs = [r for r in runs if abs(r.config.byzantine_fraction - alpha) < 1e-12]
        if not runs:
            raise click.BadParameter(f"figure {fig.id} has no run at α = {alpha}; it runs "
                                     f"{', '.join(map(str, alphas))}", param_hint="--alpha")
    # series whose rule cannot aggregate a round of this dataset are no part of the figure
    # here (as reproduce leaves them out); named, they are refused with the reason
    left = [(r, why) for r, why in fig.left_out(scale) if r.config.seed == seed
            and (alpha is None or abs(r.config.byzantine_fraction - alpha) < 1e-12)]
    named = [(r, why) for r, why in left if r.labels["series"] in series]
    if named:
        r, why = named[0]
        raise click.ClickException(f"{r.labels['series']}: {why}; nothing was measured or written")
    from rfrs_ref.experiments.figures import left_out_notes

    for note in left_out_notes(left):
        click.echo(f"note: {note}")
    known = [r.labels["series"] for r in runs]
    unknown = [s for s in series if s not in known]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: not a series of figure {fig.id}; "
                                 f"series: {', '.join(known)}", param_hint="--series")
    runs = [r for r in runs if not series or r.labels["series"] in series]
    from rfrs_ref.experiments.sweep import check_feasible

    for r in runs:  # every series can start (K, the rule's n and f) before any is measured
        try:
            check_feasible(r.config)
        except (ValueError, KeyError, TypeError) as exc:
            raise click.ClickException(f"{r.labels['series']}: {exc}; nothing was measured "
                                       "or written") from None
    out = pathlib.Path(out)
    lock = shared_hold(out)
    try:
        _measure(fig, runs, dataset, seed, every, out, again=again)
    finally:
        lock.release()  # removes the folders the hold made, if nothing was written


def _recorded(path: pathlib.Path, spec, every: int):
    """The per-round table at ``path`` if it is complete for ``spec``: its key at every row,
    and exactly the rounds a call with ``every`` measures (each ``every``-th and the last);
    else None. A diverged run's table stops early, so it is measured again.

    A complete table is read instead of measured, so it is checked as input
    (:func:`rfrs_ref.experiments.mechanism.check_frame`): a cell that is not a
    measurement in its range is an error naming the file, line and column, never
    printed as a result."""
    from rfrs_ref.experiments.mechanism import check_frame
    from rfrs_ref.experiments.results import DuplicateColumnError, read_csv_table

    if not path.is_file():
        return None
    try:
        df = read_csv_table(path)
    except DuplicateColumnError as exc:
        raise click.ClickException(f"{exc} (--again measures the series again, replacing "
                                   "the file)") from None
    except (OSError, ValueError):
        return None
    rounds = spec.config.resolved().rounds
    expected = {t for t in range(1, rounds + 1) if t % every == 0 or t == rounds}
    if ("key" not in df.columns or "round" not in df.columns
            or not (df["key"].astype(str) == spec.key).all()
            or len(df) != len(expected) or set(df["round"].tolist()) != expected):
        return None
    try:
        check_frame(df, path)
    except ValueError as exc:
        raise click.ClickException(f"{exc} (--again measures the series again, replacing "
                                   "the file)") from None
    return df


def _measure(fig, runs, dataset, seed, every, out: pathlib.Path, *, again: bool = False) -> None:
    from rfrs_ref.experiments.mechanism import (SUMMARY_HEAD, measure_run, mechanism_frame,
                                                plot_mechanism, summary)
    from rfrs_ref.experiments.results import atomic_write_text
    from rfrs_ref.federated.trainer import Diverged

    a = runs[0].config.byzantine_fraction
    stem = f"{_slug(fig.experiment)}-{dataset}-a{a:g}-seed{seed}"
    _refuse_foreign(out, stem, [out / f"{stem}-{_slug(r.labels['series'])}.csv" for r in runs])
    frames = {}
    diverged = {}  # series -> Diverged
    for r in runs:
        name = r.labels["series"]
        path = out / f"{stem}-{_slug(name)}.csv"
        done = None if again else _recorded(path, r, every)
        if done is not None:
            frames[name] = done
            click.echo(f"{name}: already measured in {path} (--again measures it again)")
            continue
        with click.progressbar(length=r.config.resolved().rounds, label=name) as bar:
            last = [0]

            def progress(t, total, bar=bar, last=last):
                bar.update(t - last[0])
                last[0] = t

            try:
                rows = measure_run(r, every=every, progress=progress)
            except Diverged as exc:
                # an outcome of the run, as in a sweep: its rounds before the divergence are
                # measured and kept, and every table says where it stopped
                rows = exc.rows
                diverged[name] = exc
            except (ValueError, FileNotFoundError, KeyError) as exc:
                raise click.ClickException(f"{name}: {exc}") from exc
        if name in diverged:
            d = diverged[name]
            click.echo(f"{name}: the run diverged at round {d.round} ({d.reason}: {d.what}); "
                       f"measured the {len(rows)} round(s) before it", err=True)
        df = mechanism_frame(rows, {"series": name, "dataset": dataset, "alpha": a,
                                    "seed": seed, "key": r.key})
        frames[name] = df
        _write(lambda: atomic_write_text(path, df.to_csv(index=False)), path)
        click.echo(f"per-round table: {path}")
    lines = ["| series | honest cos | cos to honest mean: honest | honest, leaving itself out | "
             "Byzantine | Spearman(score, norm): gradient | parameter | "
             "Byzantine share sampled → kept |",
             "|---|---|---|---|---|---|---|---|"]
    for name, df in frames.items():
        s = summary(df)

        def g(k, s=s):
            v = s.get(k)
            return "—" if v is None else f"{v:.3f}"

        label = name if name not in diverged else f"{name} (diverged at round {diverged[name].round})"
        lines.append(f"| {label} | {g('honest_cos_mean')} | {g('honest_to_mean_cos')} | "
                     f"{g('honest_to_others_cos')} | "
                     f"{g('byzantine_to_mean_cos')} | {g('spearman_gradient')} | "
                     f"{g('spearman_parameter')} | {g('byzantine_share_sampled')} → "
                     f"{g('byzantine_share_kept')} |")
    if diverged:
        lines += ["", "Diverged (the state held NaN or ±inf): "
                  + "; ".join(f"{n} at round {d.round} ({d.reason}: {d.what})"
                              for n, d in diverged.items())
                  + ". Its means are over the rounds before the divergence."]
    text = (f"{SUMMARY_HEAD}{fig.title}, {dataset}, α = {a:g}, seed {seed}\n\n"
            + "\n".join(lines) + "\n")
    _write(lambda: atomic_write_text(out / f"{stem}.md", text), out / f"{stem}.md")
    try:
        paths = _write(lambda: plot_mechanism(frames, out / stem,
                                              title=f"{fig.title}: {dataset}, α = {a:g}, "
                                                    f"seed {seed}"), out)
    except ValueError as exc:  # a link where the plot goes
        raise click.ClickException(str(exc)) from None
    click.echo(text, nl=False)
    for p in paths:
        click.echo(f"figure: {p}")


def _refuse_foreign(out: pathlib.Path, stem: str, tables: list[pathlib.Path]) -> None:
    """Before anything is measured or written: every file the call writes into ``out`` (the
    per-round tables, the summary, the PNG) is absent or one this command wrote (a table
    whose header is the per-round table's, a summary that begins as one, a PNG drawn
    here, or one beside this command's summary of the same runs); none is a link. A user's
    own file of such a name is left as it is."""
    from rfrs_ref.experiments.mechanism import COLUMNS, is_summary
    from rfrs_ref.experiments.plots import drawn_here, refuse_foreign
    from rfrs_ref.files import first_line

    header = ",".join(COLUMNS)
    summary, png = out / f"{stem}.md", out / f"{stem}.png"
    for path in (*tables, summary, png):
        if path.is_symlink():
            raise click.ClickException(f"{path} is a link; mechanism writes into the folder "
                                       "given, never through a link; nothing was measured "
                                       "or written")
    try:
        refuse_foreign(tables, "a per-round table of rfrs-ref mechanism",
                       ours=lambda p: (first_line(p) or "").startswith(header))
        refuse_foreign([summary], "a summary of rfrs-ref mechanism", ours=is_summary)
        # a PNG beside this command's summary of the same runs is its own, one drawn before
        # figures said who drew them included
        mine = is_summary(summary)
        refuse_foreign([png], ours=lambda p: mine or drawn_here(p))
    except ValueError as exc:
        raise click.ClickException(str(exc).replace("nothing was written",
                                                     "nothing was measured or written")) from None


def _write(fn, where):
    """``fn()``, with an OSError (a full disk, a file that cannot be replaced) said in one
    line naming ``where`` instead of a traceback; what was there before stays whole (every
    file is replaced in one step)."""
    try:
        return fn()
    except OSError as exc:
        raise click.ClickException(write_error(exc, str(where))) from exc
