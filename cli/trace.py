"""``rfrs-ref trace``: compare per-round traces of two runs or implementations."""

from __future__ import annotations

import click


@click.group("trace")
def trace() -> None:
    """Per-round run traces (docs/traces.md); write one with `rfrs-ref train --trace FILE`."""


@trace.command("compare")
@click.argument("a", type=click.Path(dir_okay=False, exists=True))
@click.argument("b", type=click.Path(dir_okay=False, exists=True))
@click.option("--rtol", type=click.FloatRange(min=0), default=1e-6, show_default=True,
              help="Relative tolerance of floating-point fields; must be < 1.")
@click.option("--atol", type=click.FloatRange(min=0), default=1e-9, show_default=True,
              help="Absolute tolerance of floating-point fields; must be below (1 − rtol)·max|A|, "
                   "the largest float of A compared under it (a state sum counts as |A| − rtol·c·Σ|x|; "
                   "at or above it 0 agrees with every value compared: refused after the comparison).")
@click.option("--no-checksums", is_flag=True,
              help="Do not compare state checksums (e.g. two backends that round differently).")
@click.option("--ignore", multiple=True, metavar="FIELD",
              help="Skip a field path, e.g. 'rule.objective' or 'metrics' (repeatable).")
def compare_cmd(a, b, rtol, atol, no_checksums, ignore):
    """Report the first round and field where trace B diverges from the reference trace A.

    Integers, flags and names compare exactly, floats within atol + rtol·|A|
    (the tolerance comes from the reference A; a NaN or infinite value in B
    where A is finite always diverges; a tolerance under which 0 would agree
    with every float of A compared, rtol ≥ 1 or atol ≥ (1 − rtol)·max|A| over
    the floats compared, is refused: it checks nothing), checksums exactly when both traces
    state the same dtype, layout and byte order. Exit status 0 when the traces
    agree, 1 when they diverge or a trace cannot be read (docs/traces.md).
    """
    from rfrs_ref.trace import compare

    try:
        res = compare(a, b, rtol=rtol, atol=atol, checksums=not no_checksums, ignore=ignore)
    except (ValueError, OSError, ArithmeticError) as exc:  # TraceFormatError, a non-finite tolerance
        raise click.ClickException(str(exc)) from None
    for note in res.notes:
        click.echo(f"note: {note}")
    if res.agree:
        what = "values and checksums" if res.checksums_compared else "values (checksums not compared)"
        click.echo(f"the traces agree: {res.rounds_compared} rounds, {what} within rtol={rtol:g}, atol={atol:g}")
        return
    click.echo(str(res.divergence))
    click.echo(f"({res.rounds_compared} rounds agree before it)")
    raise SystemExit(1)
