"""Experiments: the paper's figures as sweeps of training runs, on Dask, with tables and plots.

- :mod:`~rfrs_ref.experiments.spec`: a run (:class:`RunSpec`), its key, grids
  and TOML sweep files;
- :mod:`~rfrs_ref.experiments.sweep`: :func:`run_sweep` on a LocalCluster or a
  remote scheduler, failure isolation and resume;
- :mod:`~rfrs_ref.experiments.worker`: what a worker does with one run;
- :mod:`~rfrs_ref.experiments.results`: the store, the tidy and summary tables;
- :mod:`~rfrs_ref.experiments.figures`: the paper's figures (``FIGURES``) and
  :func:`reproduce`;
- :mod:`~rfrs_ref.experiments.plots`: matplotlib figures;
- :mod:`~rfrs_ref.experiments.committed`: what of a results directory is committed, provenance;
- :mod:`~rfrs_ref.experiments.claims`: the paper's claims, paired intervals over seeds, verdicts;
- :mod:`~rfrs_ref.experiments.mechanism`: per-round cosines, Krum score vs norm, Byzantine share.

See docs/reproduction.md.
"""

from rfrs_ref.experiments.figures import FIGURES, Figure, Scale, figure, plot_figure, reproduce
from rfrs_ref.experiments.results import (METRICS, Store, StoreLocked, method_name, read_table,
                                          results_frame, summarise, summary_markdown)
from rfrs_ref.experiments.spec import (NON_RESULT_FIELDS, Axis, RunSpec, Sweep, expand,
                                       load_sweep, parse_sweep, run_key)
from rfrs_ref.experiments.sweep import SweepReport, plan_workers, run_sweep
from rfrs_ref.experiments.worker import execute_run, pca_2d, separation

__all__ = [
    "Axis", "FIGURES", "Figure", "METRICS", "NON_RESULT_FIELDS", "RunSpec", "Scale", "Store",
    "StoreLocked", "Sweep", "SweepReport", "execute_run", "expand", "figure", "load_sweep",
    "method_name", "parse_sweep", "pca_2d", "plan_workers", "plot_figure", "read_table",
    "reproduce", "results_frame", "run_key", "run_sweep", "separation", "summarise",
    "summary_markdown",
]
