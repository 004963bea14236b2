"""``rfrs-ref compact``: a results directory's run records, gzip-compressed."""

from __future__ import annotations

import pathlib

import click


@click.command("compact")
@click.argument("results", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False))
def compact(results):
    """Gzip-compress the run records (runs/<key>/outcome.json) of each results directory.

    RESULTS are results directories of `rfrs-ref reproduce` or `sweep` (those holding a
    runs/ folder), or folders holding them (e.g. results/).

    Each record becomes runs/<key>/outcome.json.gz, the same bytes compressed, which every
    command that reads a run's record (sweep, reproduce, plot, verdict, ranking) reads as it
    reads outcome.json: a sweep still finds those runs finished and redraws the same tables
    and figures. For results that are committed or shipped: a record is about four times
    smaller. A record that is a link, not a JSON object, or one of two records that differ
    is left as it is and named; the exit status is then 1. A directory a sweep is writing
    to is refused. See docs/reproduction.md ("What a results directory commits").
    """
    from rfrs_ref.experiments.committed import gzip_records
    from rfrs_ref.experiments.results import StoreLocked

    failed = False
    for out in _directories(results):
        try:
            report = gzip_records(out)
        except (ValueError, StoreLocked, OSError) as exc:
            raise click.ClickException(str(exc)) from None
        saved = ""
        if report.compressed:
            saved = (f" ({report.bytes_before / 1e6:.2f} MB -> {report.bytes_after / 1e6:.2f} MB)")
        click.echo(f"{out}: {len(report.compressed)} records compressed{saved}, "
                   f"{len(report.already)} already compressed, {len(report.left)} left as they are")
        for where, why in report.left:
            click.echo(f"  left: {where}: {why}", err=True)
            failed = True
    if failed:
        raise SystemExit(1)


def _directories(results) -> list[pathlib.Path]:
    """The results directories named: each argument that a sweep wrote (``is_store``), else
    each folder in it that is one (sorted); an argument that is neither is a usage error. A
    folder of yours that merely holds a ``runs/`` (``rfrs-ref train``'s default place for
    runs) is no results directory: its files are not a sweep's records to replace."""
    from rfrs_ref.experiments.results import is_store

    found = []
    for arg in results:
        path = pathlib.Path(arg)
        if is_store(path):
            found.append(path)
            continue
        inner = sorted(d for d in path.iterdir()
                       if not d.is_symlink() and d.is_dir() and is_store(d))
        if not inner:
            raise click.BadParameter(f"{path} is not a results directory (no runs/ folder of "
                                     "run records beside a sweep's tables or provenance.json) "
                                     "and holds none; nothing was changed",
                                     param_hint="RESULTS")
        found += inner
    return found
