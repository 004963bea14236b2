"""``rfrs-ref golden``: export or check language-neutral golden test vectors."""

from __future__ import annotations

import time

import click


@click.group("golden")
def golden() -> None:
    """Golden test vectors of every family (docs/golden-vectors.md).

    \b
    Examples:
      rfrs-ref golden export vectors/
      rfrs-ref golden check vectors/ --backend all
    """


@golden.command("export", short_help="Write every golden case into DIRECTORY.")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--only", multiple=True, metavar="PATTERN",
              help="Export only the cases matching this glob or family folder (repeatable), "
                   "e.g. 'aggregate/krum-*' or 'optim'.")
def export_cmd(directory, only):
    """Write every case into DIRECTORY: case.json and .npy arrays per case, and index.json.

    The export is deterministic: exporting again on the same machine writes the
    same bytes.
    """
    from rfrs_ref import golden as G
    from rfrs_ref.files import DirectoryLocked

    started = time.perf_counter()
    try:
        names = G.export(directory, only or None)
    except (ValueError, OSError) as exc:  # an existing index that cannot be merged, an unwritable folder
        raise click.ClickException(str(exc)) from None
    except DirectoryLocked as exc:  # another export (or any rfrs-ref writer) holds the folder
        raise click.ClickException(str(exc)) from None
    if not names:
        raise click.ClickException(
            f"no case matches {', '.join(only)}: a pattern is a glob over the case names, "
            "family/what-dtype (e.g. 'aggregate/krum-*'), or a family folder (model, optim, "
            "aggregate, attack, federated)")
    families = {}
    for n in names:
        families[n.split("/")[0]] = families.get(n.split("/")[0], 0) + 1
    click.echo(f"wrote {len(names)} cases to {directory} "
               f"({', '.join(f'{k} {v}' for k, v in families.items())}) "
               f"in {time.perf_counter() - started:.1f} s")


@golden.command("check", short_help="Recompute the cases in DIRECTORY and compare.")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.option("--backend", type=click.Choice(["numpy", "numba", "all"]), default="numpy", show_default=True,
              help="Recompute with the NumPy oracles, the Numba fast paths, or both.")
@click.option("--only", multiple=True, metavar="PATTERN", help="Check only the matching cases (repeatable).")
@click.option("--quiet", "-q", is_flag=True, help="Print only the failures and the summary.")
def check_cmd(directory, backend, only, quiet):
    """Recompute every case in DIRECTORY with the current code and compare.

    Prints one line per case and backend: ok, or FAIL with the first
    location (output, index, expected, got, tolerance). Exit status 1 when a
    case fails or the index cannot be read. The vectors are read as untrusted
    input: paths must stay inside DIRECTORY, and a NaN or infinite value where
    the expected one is finite is a failure (docs/golden-vectors.md).
    """
    from rfrs_ref import golden as G

    backends = ("numpy", "numba") if backend == "all" else (backend,)
    if "numba" in backends and not quiet:
        click.echo("the numba backend compiles its kernels as the cases first need them (a few "
                   "minutes the first time; cached for later checks)", err=True)
    try:
        results = G.check(directory, backends, only or None)
    except (ValueError, OSError) as exc:  # the index: missing, unreadable, not an index; no case
        raise click.ClickException(str(exc)) from None
    failed = [r for r in results if not r.ok]
    for r in results:
        if not (quiet and r.ok):
            # a folder name that is not UTF-8 (b"x\xff", read as "x\udcff") is written escaped:
            # a terminal that writes UTF-8 strictly would end the check with a traceback
            click.echo(r.line().encode("utf-8", "backslashreplace").decode("utf-8"))
    cases = len({r.name for r in results})
    click.echo(f"{cases} cases, {len(results)} checks: {len(results) - len(failed)} ok, {len(failed)} FAIL")
    if failed:
        raise SystemExit(1)
