"""``rfrs-ref data``: list, fetch and describe datasets.

The library is imported inside each command so that ``rfrs-ref --help`` and
``rfrs-ref data --help`` stay fast.
"""

from __future__ import annotations

import json
import sys

import click


def _n(x) -> str:
    return f"{x:,}"


class _ProgressBars:
    """Adapter from the downloader's ``progress(label, done, total)`` to click progress bars.

    A response without Content-Length gets a line when it starts and its size when it ends.
    """

    def __init__(self) -> None:
        self._bar = None
        self._label: str | None = None
        self._done = 0
        self._total: int | None = None

    def __call__(self, label: str, done: int, total: int | None) -> None:
        if label != self._label:
            self.close()
            self._label, self._done, self._total = label, 0, total
            if total:
                self._bar = click.progressbar(length=total, label=f"downloading {label}",
                                              file=sys.stderr)
                self._bar.__enter__()
            else:
                click.echo(f"downloading {label} (size unknown)...", err=True)
        if self._bar is not None:
            self._bar.update(done - self._done)
        self._done = done

    def close(self, ok: bool = True) -> None:
        """End the current bar; ``ok=False`` (a failed download) reports no size."""
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None
        elif self._label is not None and not self._total and ok:
            click.echo(f"downloaded {self._label}: {_n(self._done)} bytes", err=True)
        self._label = None


def _synthetic_options(f):
    """Add one option per hyperparameter of the synthetic generator (used by ``info``)."""
    from rfrs_ref.data.datasets import Synthetic
    from rfrs_ref.params import hyperparameters

    for h in reversed(hyperparameters(Synthetic)):
        opt = h.cli or h.name.replace("_", "-")
        f = click.option(f"--{opt}", f"synthetic_{h.name}", type=h.type, default=None,
                         help=f"{h.help} [default: {h.default}]")(f)
    return f


@click.group()
def data() -> None:
    """List, fetch and describe datasets (see docs/datasets.md).

    Real datasets are looked up in --data-dir, then $RFRS_DATA_DIR, then the cache
    ($RFRS_CACHE_DIR/datasets, else ~/.cache/rfrs-ref/datasets).
    """


@data.command("list")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Directory searched first (holds <folder>/ of each dataset).")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Dataset cache directory.")
def list_(data_dir, cache_dir) -> None:
    """Every dataset with its size and where it is found.

    A copy found is shown by its folder only when the sha256 of each of its required
    files is the published one; otherwise the row says "damaged:" and which file
    differs (a run would refuse that copy)."""
    from rfrs_ref.data import (
        DATASETS,
        DatasetNotFoundError,
        Synthetic,
        locate,
        manifests,
        verify_folder,
    )
    from rfrs_ref.data.datasets import fetch_command

    rows = [("name", "users", "items", "interactions", "location")]
    real = manifests()
    for name in DATASETS:
        if name in real:
            m = real[name]
            try:
                where = locate(name, data_dir, cache_dir=cache_dir)
                shown = str(where) if where is not None else "not present"
                problems = verify_folder(where, m) if where is not None else []
                if problems:
                    fix = fetch_command(name, where.parent, data_dir, cache_dir)
                    shown = f"damaged: {'; '.join(problems)} (`{fix}` installs a fresh copy)"
            except DatasetNotFoundError as e:
                shown = f"unreadable: {e}"
            except OSError as e:  # a file of the copy that cannot be read: say so, go on
                shown = f"unreadable: {e.filename}: {e.strerror or e}"
            rows.append((name, _n(m.n_users), _n(m.n_items), _n(m.n_interactions), shown))
        else:
            d = DATASETS.get(name)().load()
            where = "generated (default parameters)" if DATASETS.get(name) is Synthetic \
                else "generated"
            rows.append((name, _n(d.n_users), _n(d.n_items), _n(d.n_interactions), where))
    widths = [max(len(r[k]) for r in rows) for k in range(4)]
    for r in rows:
        click.echo(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  "
                   f"{r[3]:>{widths[3]}}  {r[4]}")


@data.command()
@click.argument("name")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Install into this directory (as <data-dir>/<folder>/) instead of the cache.")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Dataset cache directory (default: $RFRS_CACHE_DIR/datasets or "
                   "~/.cache/rfrs-ref/datasets).")
@click.option("--mirror", default=None, metavar="URL",
              help="Download from a mirror laid out as <URL>/<mirror path> "
                   "(default: $RFRS_DATA_MIRROR, else the public sources).")
@click.option("--force", is_flag=True, help="Download even when a verified copy is present.")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds of network silence before giving up.")
def fetch(name, data_dir, cache_dir, mirror, force, timeout) -> None:
    """Download dataset NAME, verify its sha256 and report where it is."""
    from rfrs_ref.data import (
        DATASETS,
        DatasetNotFoundError,
        DownloadError,
        locate,
        manifests,
        verify_folder,
    )
    from rfrs_ref.data import fetch as fetch_dataset

    if name not in DATASETS:
        raise click.BadParameter(f"unknown dataset {name!r}; choose one of: "
                                 f"{', '.join(DATASETS)}", param_hint="NAME")
    if name not in manifests():
        click.echo(f"{name} is generated on demand; there is nothing to fetch.")
        return
    if data_dir is None and not force:
        try:
            found = locate(name, cache_dir=cache_dir)
        except DatasetNotFoundError as e:
            raise click.ClickException(str(e)) from None
        if found is not None:
            problems = verify_folder(found, manifests()[name])
            if not problems:
                click.echo(f"{name}: already present and verified at {found}")
                return
            click.echo(f"{name}: the copy at {found} is damaged:", err=True)
            for p in problems:
                click.echo(f"  {p}", err=True)
    bars = _ProgressBars()
    try:
        result = fetch_dataset(name, data_dir, cache_dir=cache_dir, base_url=mirror,
                               force=force, progress=bars, timeout=timeout)
    except DownloadError as e:
        bars.close(ok=False)
        msg = str(e)
        if e.expected is None:  # the transfer failed (no network, a mirror that refuses)
            folder = manifests()[name].folder
            msg += (f"; where this machine has no network access, run `rfrs-ref data fetch "
                    f"{name}` on one that has, copy its {folder}/ folder here and point "
                    f"--data-dir or RFRS_DATA_DIR at the directory holding it")
        raise click.ClickException(msg) from None
    except OSError as e:  # the destination itself (a path the system refuses, a full disk)
        bars.close(ok=False)
        raise click.ClickException(f"{e.filename}: {e.strerror}" if e.filename and e.strerror
                                   else str(e)) from None
    except KeyboardInterrupt:
        bars.close(ok=False)
        click.echo(f"\ninterrupted: nothing of {name} was installed; run the same command "
                   "again to download it", err=True)
        raise SystemExit(130) from None
    finally:
        bars.close()
    if result.url is None:
        click.echo(f"{name}: already present and verified at {result.folder}")
        return
    click.echo(f"{name}: downloaded {result.url}")
    click.echo(f"{name}: verified {', '.join(result.installed)} (sha256) into {result.folder}")
    for fname, reason in result.skipped:
        click.echo(f"{name}: optional {fname} not installed: {reason}", err=True)
    try:
        found = locate(name, cache_dir=cache_dir)
    except DatasetNotFoundError:
        found = None
    if data_dir is None and found is not None and found != result.folder:
        click.echo(f"note: {found} is found first when loading {name}", err=True)


@data.command()
@click.argument("name")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Directory searched first (holds <folder>/ of each dataset).")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Dataset cache directory.")
@click.option("--download/--no-download", default=False, show_default=True,
              help="Download the dataset into the cache when it is absent.")
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
@_synthetic_options
def info(name, data_dir, cache_dir, download, as_json, **synthetic_params) -> None:
    """Counts, density and per-user interaction quantiles of dataset NAME."""
    from rfrs_ref.data import (
        DATASETS,
        DatasetFormatError,
        DatasetNotFoundError,
        DownloadError,
        Synthetic,
        dataset_info,
        load_dataset,
        manifests,
    )

    if name not in DATASETS:
        raise click.BadParameter(f"unknown dataset {name!r}; choose one of: "
                                 f"{', '.join(DATASETS)}", param_hint="NAME")
    params = {k.removeprefix("synthetic_"): v for k, v in synthetic_params.items()
              if v is not None}
    if params and DATASETS.get(name) is not Synthetic:
        raise click.UsageError(f"--synthetic-* options apply to the synthetic dataset, not {name}")
    if DATASETS.get(name) is Synthetic:
        _refuse_generation_beyond_memory(name, params)
    try:
        data = load_dataset(name, data_dir, cache_dir=cache_dir, download=download, **params)
    except (DatasetNotFoundError, DatasetFormatError, DownloadError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:  # unreadable between lookup and reading, e.g. permissions changed
        raise click.ClickException(f"{e.filename}: {e.strerror}" if e.filename else str(e)) \
            from None
    except MemoryError:  # a generated dataset of more users or items than memory holds
        shown = ", ".join(f"{k} = {v}" for k, v in params.items())
        raise click.ClickException(
            f"{name}{f' ({shown})' if shown else ''}: the dataset does not fit in memory; "
            "give fewer users or items") from None
    stats = dataset_info(data)
    if as_json:
        click.echo(json.dumps(stats.to_dict(), indent=2))
        return

    def quantiles(q: dict) -> str:
        names = {0.0: "min", 0.5: "median", 1.0: "max"}
        return ", ".join(f"{names.get(p, f'{p:.0%}')} {v:g}" for p, v in q.items())

    title = manifests()[name].title if name in manifests() else "generated"
    click.echo(f"{name}: {title}")
    click.echo(f"  source        {data.source}")
    click.echo(f"  users         {_n(stats.n_users)}"
               + (f" ({_n(stats.users_without_items)} without items)"
                  if stats.users_without_items else ""))
    click.echo(f"  items         {_n(stats.n_items)} ({_n(stats.items_with_interactions)} "
               "with interactions)")
    click.echo(f"  interactions  {_n(stats.n_interactions)}")
    click.echo(f"  density       {stats.density:.4%}")
    click.echo(f"  per user      mean {stats.per_user_mean:.1f}; "
               f"{quantiles(stats.per_user_quantiles)}")
    click.echo(f"  per item      {quantiles(stats.per_item_quantiles)}")


def _refuse_generation_beyond_memory(name: str, params: dict) -> None:
    """A generated dataset whose generation needs more than this machine's memory (by
    :func:`rfrs_ref.data.synthetic.generation_bytes`, a bound above the generator's peak
    and within 1.4 times it, tested) is refused in one line before it starts:
    ``--synthetic-users 100000000`` had the process killed by the system for memory,
    without a word."""
    from rfrs_ref.cli.train import memory_limit
    from rfrs_ref.data.synthetic import generation_bytes

    limit, beyond = memory_limit(1)
    try:
        need = generation_bytes(**params)
    except TypeError:  # a parameter the generator does not take: load_dataset names it
        return
    if limit is not None and need > limit:
        shown = ", ".join(f"{k} = {v}" for k, v in params.items())
        raise click.ClickException(
            f"{name}{f' ({shown})' if shown else ''}: generating it would need about "
            f"{need:.3g} bytes, {beyond}; give fewer users or items")
