"""``rfrs-ref verdict``: the paper's claims judged from results directories."""

from __future__ import annotations

import pathlib

import click


@click.command("verdict")
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the verdict table to this Markdown file, and its tidy form beside it "
                   "(same name, .csv).")
@click.option("--claim", "claim_ids", multiple=True, metavar="ID",
              help="Only these claims (repeatable) [default: every claim].")
def verdict(results, out, claim_ids):
    """Judge each claim of the paper from the results in RESULTS.

    RESULTS are results directories of `rfrs-ref reproduce` (e.g. results/defenses or
    results/fig4, or with a suffix, results/defenses-quick), or folders holding them; a
    claim reads the directory by its name. For each claim, the two series it compares
    are paired by seed (same split, sampling and Byzantine set) per dataset, fraction and
    metric (P@1, P@5, R@5); the mean difference gets a 95% Student-t interval, and the
    claim "holds" only where the interval excludes 0 in the paper's direction, "does not
    hold" where it excludes 0 the other way, and is "inconclusive" otherwise. Claims
    whose results are missing are listed as "not run"; when every claim is, the table is
    still written, and the exit status is 1 (nothing was judged). Directories named ablation-*
    are judged on the claims of Fig. 4 as well (and ablation-rounds on Fig. 10's),
    where the claim's series has runs. See docs/reproduction.md.
    """
    from rfrs_ref.experiments.claims import (CLAIMS, NOT_RUN, claim, claim_directory_names,
                                             evaluate, find_results, unread_directories,
                                             verdict_frame, verdict_markdown)
    from rfrs_ref.experiments.results import atomic_write_text

    if out and pathlib.Path(out).suffix != ".md":
        raise click.BadParameter(f"{out}: the verdict table is a Markdown file (.md)",
                                 param_hint="--out")
    try:
        claims = [claim(i) for i in claim_ids] if claim_ids else list(CLAIMS)
    except KeyError as exc:
        raise click.BadParameter(str(exc.args[0]), param_hint="--claim") from None
    try:
        found = find_results(results)
        ablations = sorted(n for n in found if n.startswith("ablation-"))
        rows = evaluate(found, claims, ablations=ablations)
    except (OSError, ValueError, KeyError) as exc:
        raise click.ClickException(str(exc)) from exc
    text = verdict_markdown(rows)
    frame = verdict_frame(rows)
    if out:
        _refuse_out(pathlib.Path(out), text.splitlines()[0], ",".join(frame.columns))
    click.echo(text, nl=False)
    if out:
        from rfrs_ref.cli.experiments import write_error

        path = pathlib.Path(out)
        try:  # a full disk, a file where the folder should be: one line, not a traceback
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, text)
            atomic_write_text(path.with_suffix(".csv"), frame.to_csv(index=False))
        except OSError as exc:
            raise click.ClickException(write_error(exc, f"the verdict table {path}")) from None
        click.echo(f"verdict table: {path}, {path.with_suffix('.csv')}")
    if all(r.verdict == NOT_RUN for r in rows):
        # a table of "not run" says what to run, but judged nothing: not a success
        unread = unread_directories(found)
        if unread:
            raise click.ClickException(
                "no claim could be judged: the results in " + ", ".join(map(str, unread))
                + " are in directories whose names no claim reads; the claims read "
                + ", ".join(claim_directory_names()) + " (or such a name with a suffix, e.g. "
                "defenses-quick): rename the directory, or reproduce into one (--out)")
        if any(r.unpaired for r in rows):
            raise click.ClickException(
                "no claim could be judged: the series compared finished no seed in common "
                "under " + ", ".join(results) + " (a paired difference needs the same seeds; "
                "the table says which series ran which)")
        raise click.ClickException(
            "no claim could be judged: no finished runs of the claims' series under "
            + ", ".join(results) + " (the table lists the command for each)")


def _refuse_out(md: pathlib.Path, md_head: str, csv_head: str) -> None:
    """``--out X.md`` writes X.md and X.csv: neither may be a results directory's own table
    (``--out results/defenses/results.md`` would replace the sweep's results.csv), a link, a
    file in a run's directory or in a results directory's ``runs/`` folder, or a file of the user's that an earlier verdict did not write
    (its first line is not a verdict table's). Raises a usage error before anything is
    written."""
    from rfrs_ref.experiments.results import TABLE_NAMES, sweep_owned
    from rfrs_ref.files import first_line

    why = sweep_owned(md.parent)
    if why is not None:  # a run's directory is its run's (a sweep clears it on a new start)
        raise click.BadParameter(f"{md}: its folder {why}; write the verdict outside any run's "
                                 "directory and outside runs/; nothing was written",
                                 param_hint="--out")
    for path, head in ((md, md_head), (md.with_suffix(".csv"), csv_head)):
        if path.name in TABLE_NAMES:
            raise click.BadParameter(f"{md} would write {path}, the name of a results "
                                     "directory's own table; choose another name (e.g. verdict.md)",
                                     param_hint="--out")
        if path.is_symlink():
            raise click.BadParameter(f"{md} would write {path}, which is a link; the verdict "
                                     "is written into the folder given, never through a link",
                                     param_hint="--out")
        if path.exists():
            first = first_line(path)
            # the first two columns: a table written by another version is still ours
            sep = "|" if path.suffix == ".md" else ","
            if first is None or first.split(sep)[:3] != head.split(sep)[:3]:
                raise click.BadParameter(f"{md} would write {path}, which exists and is not a "
                                         "verdict table rfrs-ref wrote; move it away or choose "
                                         "another name; nothing was written", param_hint="--out")
