"""Entry point of ``rfrs-ref``.

Subcommands live in their own modules and are imported only when used, so
``rfrs-ref --help`` stays fast and one command's heavy imports (Numba, Dask)
never slow down another.
"""

from __future__ import annotations

import importlib

import click

from rfrs_ref import __version__

# command name -> (module under rfrs_ref.cli, attribute, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("train", "train", "Train a federated recommender (optionally under attack)."),
    "data": ("data", "data", "List, fetch and describe datasets."),
    "reproduce": ("experiments", "reproduce", "Reproduce one of the paper's figures."),
    "sweep": ("experiments", "sweep", "Run a grid of training runs described in a TOML file."),
    "plot": ("experiments", "plot", "Plot a results table like the paper's figures."),
    "mechanism": ("mechanism", "mechanism",
                  "Per-round gradient cosines, Krum score vs norm, Byzantine share kept."),
    "compact": ("compact", "compact", "Gzip-compress the run records of results directories."),
    "verdict": ("verdict", "verdict", "Judge the paper's claims from results (paired CIs)."),
    "ranking": ("ranking", "ranking", "Rank the defences from the ranking experiment (paired CIs)."),
    "golden": ("golden", "golden", "Export or check language-neutral golden test vectors."),
    "trace": ("trace", "trace", "Compare per-round traces of two implementations."),
    "recommend": ("recommend", "recommend", "A user's top-K items from a trained run, by name."),
    "conformance": ("conformance", "conformance", "Check a third-party rule, optimiser, pre-aggregator or attack against the laws."),
    "flower": ("flower", "flower", "Train on a Flower federation (simulation engine or loopback)."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(f"rfrs_ref.cli.{module}"), attr)

    def invoke(self, ctx):
        # a dataset that is missing, failed to download or is malformed is the user's to
        # fix, in every command that loads one: one line, never a traceback
        from rfrs_ref.data.errors import DatasetFormatError, DatasetNotFoundError, DownloadError

        try:
            return super().invoke(ctx)
        except (DownloadError, DatasetNotFoundError, DatasetFormatError) as exc:
            # their messages say where the loader looked and what to do
            raise click.ClickException(" ".join(str(exc).split())) from None

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rfrs-ref")
def main() -> None:
    """rfrs-ref: the reference robust federated recommendation system (Chen et al. 2020)."""


if __name__ == "__main__":  # pragma: no cover
    main()
