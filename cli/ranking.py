"""``rfrs-ref ranking``: the defences ranked from the ranking experiment's results."""

from __future__ import annotations

import pathlib

import click


@click.command("ranking")
@click.argument("results", type=click.Path())
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the Markdown here [default: print it].")
@click.option("--metric", type=click.Choice(["precision", "recall", "ndcg", "hr", "mrr"]),
              default="precision", show_default=True)
@click.option("--k", "k", type=click.IntRange(min=1), default=5, show_default=True)
def ranking(results, out, metric, k):
    """Rank the rules of RESULTS (the directory of ``rfrs-ref reproduce ranking``, or its
    results.csv / results.parquet) by Metric@K.

    One Markdown table per (dataset, α, attack, detection space, pre-aggregator):
    each rule's mean over seeds and its paired difference over seeds, with the
    95 % interval, against no defence and against A-RFRS (docs/defenses.md).

    \b
    Example:
      rfrs-ref ranking results/ranking --out ranking.md
    """
    from rfrs_ref.experiments.ranking import ranking_markdown
    from rfrs_ref.experiments.results import atomic_write_text, read_table

    try:
        text = ranking_markdown(read_table(pathlib.Path(results)), metric, k)
    except (ValueError, OSError, KeyError) as exc:  # TableError included: name the file
        msg = " ".join(str(exc).split())
        raise click.ClickException(msg if str(results) in msg else f"{results}: {msg}") from None
    if out is None:
        click.echo(text)
        return
    atomic_write_text(pathlib.Path(out), text)
    click.echo(f"ranking: {out}")
