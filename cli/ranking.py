"""``rfrs-ref ranking``: the defences ranked from the ranking experiment's results."""

from __future__ import annotations

import pathlib

import click


@click.command("ranking")
@click.argument("results", nargs=-1, required=True, type=click.Path())
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the Markdown here [default: print it].")
@click.option("--metric", type=click.Choice(["precision", "recall", "ndcg", "hr", "mrr", "er",
                                            "target_hr"]),
              default="precision", show_default=True,
              help="er, target_hr: the target items' exposure ratio and hit ratio of the "
                   "targeted attack's runs, ranked lowest first.")
@click.option("--k", "k", type=click.IntRange(min=1), default=5, show_default=True)
def ranking(results, out, metric, k):
    """Rank the rules of RESULTS (the directory of `rfrs-ref reproduce ranking`, or its
    results.csv / results.parquet; several, one per dataset or group of datasets) by
    Metric@K.

    One Markdown table per (dataset, α, attack, detection space, pre-aggregator):
    each rule's mean over seeds and its paired difference over seeds, with the
    95 % interval, against no defence and against A-RFRS (docs/defenses.md).
    By the target items' exposure (--metric er or target_hr), the targeted
    attack's cells only, lowest first. Given several directories, each dataset's
    runs are ranked from the one directory that records them (a dataset in two is
    refused).

    \b
    Example:
      rfrs-ref ranking results/ranking --out ranking.md
      rfrs-ref ranking results/ranking results/ranking-lastfm
      rfrs-ref ranking results/ranking --metric er --k 5
    """
    from rfrs_ref.experiments.ranking import (check_k, combine_tables, judged_pairs,
                                              merge_rows, ranking_markdown, ranking_rows)
    from rfrs_ref.experiments.claims import TableError
    from rfrs_ref.experiments.results import (atomic_write_text, read_table, refuse_linked_input,
                                              table_files, table_source)

    if out is not None:
        target = pathlib.Path(out).resolve()
        read = [f for r in results for f in table_files(r) if f.resolve() == target]
        if read:
            same = "" if str(read[0]) == str(out) else f" (it is {read[0]})"
            raise click.BadParameter(f"{out}: a table the ranking reads{same}, which the "
                                     "Markdown would replace; write the ranking to another "
                                     "file (e.g. ranking.md)",
                                     param_hint="--out")
        _refuse_out(pathlib.Path(out))

    def judged(one, step):
        try:
            return step()
        except (ValueError, OSError, KeyError) as exc:  # TableError included: name the file
            msg = " ".join(str(exc).split())
            # a defect of a row names the file its line number counts in
            where = table_source(one) if isinstance(exc, TableError) else one
            raise click.ClickException(msg if str(where) in msg else f"{where}: {msg}") from None

    def read(one):
        refuse_linked_input(one)  # the path named may be a link, not what lies inside it
        table = read_table(pathlib.Path(one))
        check_k(table, metric, k)
        return table

    tables = [(str(table_source(one)), judged(one, lambda: read(one))) for one in results]
    try:  # each dataset from one directory, before any is ranked
        table = combine_tables(tables)
    except ValueError as exc:
        raise click.ClickException(" ".join(str(exc).split())) from None
    # each table ranked alone, so that a defect's line number is its own file's
    rows_of = [judged(one, lambda t=t: ranking_rows(t, metric, k))
               for one, (_, t) in zip(results, tables)]
    rows = merge_rows(rows_of)
    text = ranking_markdown(table, metric, k, rows=rows)
    if out is None:
        click.echo(text)
    else:
        from rfrs_ref.cli.experiments import write_error

        path = pathlib.Path(out)
        try:  # a full disk, a file where the folder should be: one line, not a traceback
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, text)
        except OSError as exc:
            raise click.ClickException(write_error(exc, f"the ranking {path}")) from None
        click.echo(f"ranking: {out}")
    if not judged_pairs(rows):
        # a table of "no pairs" ranks nothing (its order is alphabetical): not a success
        if not rows:
            why = "it holds no finished or diverged run of the ranking experiment"
        else:
            why = (f"no rule has an outcome on a seed where its reference (no defence, "
                   f"A-RFRS) has one at {metric}@{k}")
        named = " ".join(str(r) for r in results)
        raise click.ClickException(f"{named}: no pair was judged: {why}; "
                                   "run rfrs-ref reproduce ranking first")


def _refuse_out(path: pathlib.Path) -> None:
    """``--out`` may replace a ranking an earlier call wrote, nothing else: not a results
    directory's own table (``--out results/defenses/results.csv`` replaced another sweep's
    results with Markdown, exit 0), not a link, not a file in a run's directory (which a sweep
    clears when the run starts again) or in a results directory's ``runs/`` folder, and not
    an existing file whose first line is not a ranking's (one of
    :data:`~rfrs_ref.experiments.ranking.RANKING_HEADS`; a user's notes.md was replaced the
    same way), as ``rfrs-ref verdict`` refuses for its table. Raises a usage error before
    anything is written."""
    from rfrs_ref.experiments.ranking import RANKING_HEADS
    from rfrs_ref.experiments.results import RECORD_NAMES, TABLE_NAMES, sweep_owned
    from rfrs_ref.files import first_line

    if path.name in TABLE_NAMES or path.name in RECORD_NAMES:
        raise click.BadParameter(f"{path}: the name of a results directory's own table or "
                                 "record, which the ranking would replace; write it to another "
                                 "file (e.g. ranking.md); nothing was written", param_hint="--out")
    why = sweep_owned(path.parent)
    if why is not None:  # a run's directory is its run's (a sweep clears it on a new start)
        raise click.BadParameter(f"{path}: its folder {why}; write the ranking outside any "
                                 "run's directory and outside runs/; nothing was written",
                                 param_hint="--out")
    if path.is_symlink():
        raise click.BadParameter(f"{path} is a link; the ranking is written into the folder "
                                 "given, never through a link; nothing was written",
                                 param_hint="--out")
    if path.exists():
        first = first_line(path)
        if first is None or not first.startswith(RANKING_HEADS):
            raise click.BadParameter(f"{path} exists and is not a ranking rfrs-ref wrote; move it "
                                     "away or choose another name; nothing was written",
                                     param_hint="--out")
