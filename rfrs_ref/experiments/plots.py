"""Figures like the paper's: Precision/Recall@K panels, training curves, PCA, resilience.

Every function draws with matplotlib's Agg backend (no display needed) and
writes a PNG and a PDF, returning their paths.

Conventions of the paper's figures that are kept: K = 1..5 on the x axis,
one panel per dataset (and per Byzantine fraction), mean over trials with the
standard deviation as error bars (over the trials that finished: a diverged
trial has no metric, and each panel's title names the series that diverged
and on how many trials, e.g. "diverged: RFA 5/5"), the paper's series names, and the proposed
method (A-FRS, A-RFRS, S-RFRS, AG-RFRS) in red. In Fig. 1, benign clients are
blue dots and Byzantine clients orange triangles.
"""

from __future__ import annotations

import math
import os
import pathlib
from typing import Sequence

import numpy as np

from rfrs_ref.experiments.results import record_path, run_path

RED = "#d62728"
BLUE = "#1f77b4"
ORANGE = "#ff7f0e"

#: colour and marker of every series name the figures use
SERIES_STYLE = {
    "A-FRS": (RED, "o"),
    "A-RFRS": (RED, "o"),
    "S-RFRS": (RED, "o"),
    "AG-RFRS": (RED, "o"),
    "Adam": (RED, "P"),  # markers apart from A-RFRS and Krum: ablation-rounds draws all four
    "Camouflage attack (40%)": (RED, "o"),
    "FMF": (BLUE, "s"),
    "SGD": (BLUE, "v"),
    "No attack": (BLUE, "s"),
    "No defense": ("#555555", "x"),
    "Krum": (BLUE, "s"),
    "RFA": ("#2ca02c", "^"),
    "Trmean": ("#9467bd", "D"),
}
_FALLBACK = ["#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]

METRIC_NAMES = {"precision": "Precision", "recall": "Recall", "ndcg": "NDCG", "hr": "HR",
                "mrr": "MRR", "popularity_precision": "Popularity precision",
                "popularity_recall": "Popularity recall"}

DATASET_NAMES = {"lastfm": "Last.fm", "ml100k": "ML100K", "citeulike-a": "Citeulike-a",
                 "citeulike-t": "Citeulike-t", "synthetic": "Synthetic"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _style(name: str, i: int):
    if name in SERIES_STYLE:
        return SERIES_STYLE[name]
    return _FALLBACK[i % len(_FALLBACK)], "v"


def refuse_linked(fig, *paths: pathlib.Path) -> None:
    """Raise ValueError (closing ``fig``, writing nothing) when any of ``paths`` (a figure's
    folder and files) is a symbolic link: a figure is written into the folder it is given,
    never through a link to a file or folder elsewhere."""
    for p in paths:
        if p.is_symlink():
            _pyplot().close(fig)
            raise ValueError(f"{p} is a link (to {os.readlink(p)}): figures are written into "
                             "the folder given, never through a link; remove it or give "
                             "another folder")


#: what every figure this package draws says of itself: the PNG's ``Software`` text and the
#: PDF's ``Creator`` begin with it (:func:`drawn_here` reads it back)
DRAWN_BY = "rfrs-ref"


def _metadata(fmt: str) -> dict:
    from rfrs_ref import __version__

    return {("Software" if fmt == "png" else "Creator"): f"{DRAWN_BY} {__version__}"}


#: how much of a PDF's end is searched for its Creator (the information dictionary is
#: written after the pages, followed only by the cross-reference table)
_PDF_TAIL = 1 << 20


def drawn_here(path: str | os.PathLike) -> bool:
    """Whether the file at ``path`` is a PNG or PDF figure this package drew: a PNG whose
    ``Software`` text chunk, or a PDF whose ``Creator``, begins with :data:`DRAWN_BY`
    (:func:`save` and :func:`write_png` write them). False for anything else, an unreadable
    file and anything but a regular file (a FIFO is not waited on) included."""
    import struct

    from rfrs_ref.files import open_regular

    fh = open_regular(path)
    if fh is None:
        return False
    try:
        with fh:
            head = fh.read(8)
            if head == b"\x89PNG\r\n\x1a\n":
                while True:  # the text chunks come before the image data
                    hdr = fh.read(8)
                    if len(hdr) < 8:
                        return False
                    size, kind = struct.unpack(">I4s", hdr)
                    if kind in (b"IDAT", b"IEND"):
                        return False
                    if kind == b"tEXt" and size <= 4096:
                        key, _, value = fh.read(size).partition(b"\0")
                        if key == b"Software" and value.startswith(DRAWN_BY.encode()):
                            return True
                        fh.seek(4, os.SEEK_CUR)
                    else:
                        fh.seek(size + 4, os.SEEK_CUR)
            if head.startswith(b"%PDF-"):
                end = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, end - _PDF_TAIL))
                return f"/Creator ({DRAWN_BY} ".encode() in fh.read()
    except (OSError, struct.error):
        return False
    return False


def in_results_figures(folder: pathlib.Path) -> bool:
    """Whether ``folder`` is the ``figures/`` folder of a results directory (one a sweep
    wrote: :func:`rfrs_ref.experiments.results.is_store`): the results directory's own,
    whose figures are its to redraw, those drawn before figures said who drew them
    included."""
    from rfrs_ref.experiments.results import is_store

    folder = pathlib.Path(folder)
    return folder.name == "figures" and not folder.is_symlink() and is_store(folder.parent)


def refuse_foreign(paths: Sequence[pathlib.Path], what: str = "a figure rfrs-ref drew",
                   ours=drawn_here) -> None:
    """Raise ValueError, naming the first of ``paths`` that exists and is not ``what`` (its
    ``ours(path)`` is false): a command replaces the files it wrote before, never a file of
    the same name that it did not write (a user's own ``fig4.png`` in ``--out``). Figures in
    a results directory's own ``figures/`` folder (:func:`in_results_figures`) are its to
    redraw."""
    for p in map(pathlib.Path, paths):
        if not (p.exists() or p.is_symlink()) or p.is_symlink():
            continue  # a link is refused as one (refuse_linked)
        if ours is drawn_here and in_results_figures(p.parent):
            continue
        if p.is_dir() or not ours(p):
            raise ValueError(f"{p} exists and is not {what}; it is left as it is: move it "
                             "away or give another --out; nothing was written")


def figure_files(stem: pathlib.Path) -> list[pathlib.Path]:
    """The files :func:`save` writes for ``stem``."""
    stem = pathlib.Path(stem)
    return [stem.with_suffix(".png"), stem.with_suffix(".pdf")]


def save(fig, stem: pathlib.Path, dpi: int = 110) -> list[pathlib.Path]:
    """Write ``stem.png`` and ``stem.pdf``; close the figure.

    Raises ValueError (writing nothing) when the folder or either file is a symbolic
    link: a figure is written into the folder it is given, never through a link to a
    file or folder elsewhere; and when either file exists and is not a figure this
    package drew (:func:`refuse_foreign`: each says so in its metadata, :func:`drawn_here`).

    Each file is written atomically (:func:`rfrs_ref.files.atomic_write`): plots may write
    into one folder together (their hold on it is shared), and two drawing the same figure
    at once interleaved their bytes in one file (the PDFs differ in their creation date);
    a plot stopped half-way left half a PNG over the previous one."""
    from rfrs_ref.files import atomic_write

    plt = _pyplot()
    stem = pathlib.Path(stem)
    paths = figure_files(stem)
    refuse_linked(fig, stem.parent, *paths)
    try:
        refuse_foreign(paths)
    except ValueError:
        plt.close(fig)
        raise
    stem.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(paths[0], lambda fh: fig.savefig(fh, format="png", dpi=dpi, bbox_inches="tight",
                                                  metadata=_metadata("png")))
    atomic_write(paths[1], lambda fh: fig.savefig(fh, format="pdf", bbox_inches="tight",
                                                  metadata=_metadata("pdf")))
    plt.close(fig)
    return paths


def write_png(fig, path: pathlib.Path, dpi: int = 110, ours=drawn_here) -> pathlib.Path:
    """Write ``fig`` as the PNG ``path`` only (:func:`save`'s checks and metadata; ``ours``
    as for :func:`refuse_foreign`); close it."""
    from rfrs_ref.files import atomic_write

    plt = _pyplot()
    path = pathlib.Path(path)
    refuse_linked(fig, path.parent, path)
    try:
        refuse_foreign([path], ours=ours)
    except ValueError:
        plt.close(fig)
        raise
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=dpi, bbox_inches="tight",
                                              metadata=_metadata("png")))
    plt.close(fig)
    return path


def _panel_title(rows: Sequence[str], cols: Sequence[str], rv, cv) -> str:
    parts = []
    for name, v in list(zip(rows, rv)) + list(zip(cols, cv)):
        if name == "dataset":
            parts.append(DATASET_NAMES.get(v, str(v)))
        elif name == "alpha":
            parts.append(f"{float(v):.0%} Byzantine")
        else:
            parts.append(f"{name} {v}")
    return ", ".join(parts)


def _levels(df, col: str | None, order: Sequence | None = None) -> list:
    if col is None:
        return [None]
    vals = list(dict.fromkeys(df[col].tolist()))
    if order:
        vals = [v for v in order if v in vals] + [v for v in vals if v not in order]
    elif col == "alpha":
        vals = sorted(vals)
    return vals


def _layout(df, rows, cols):
    """Panel rows and columns; a single column of several rows is laid out as a row."""
    n_rows = 1 if rows is None else df[rows].nunique()
    n_cols = 1 if cols is None else df[cols].nunique()
    if n_cols == 1 and n_rows > 1:
        return cols, rows
    return rows, cols


def _figsize(n_rows: int, n_cols: int, w: float = 3.2, h: float = 2.7):
    return max(w * n_cols, 6.0), h * n_rows


def plot_sweep(table, stem, *, metric: str = "precision", title: str | None = None,
               notes: list[str] | None = None) -> list[pathlib.Path]:
    """A sweep's Metric@K panels (:func:`plot_k_panels`): one panel per dataset, one line
    per combination of the sweep's labels (its ``label_*`` columns joined, in order, or
    the method where it has none), the popularity ranking dotted.

    For a table that no paper figure lays out (``rfrs-ref sweep``, ``rfrs-ref plot``
    without ``--figure``)."""
    labels = [c for c in table.columns if c.startswith("label_")]
    df = table.copy()
    if labels:
        df["label_series"] = [", ".join(str(v) for v in row if v == v and v is not None)
                              for row in df[labels].itertuples(index=False)]
    # a line is one label combination on one dataset; where such a line would hold runs of
    # several Byzantine fractions (a figure's table, whose α is no label), it would average
    # them into one: one row of panels per fraction instead
    rows = None
    scol = series_column(df)
    if "alpha" in df.columns and "dataset" in df.columns and scol in df.columns \
            and df.groupby(["dataset", scol])["alpha"].nunique().max() > 1:
        rows = "alpha"
    return plot_k_panels(df, stem, metric=metric, rows=rows, cols="dataset",
                         title=title or f"{METRIC_NAMES.get(metric, metric)}@K of the sweep's runs",
                         notes=notes)


def series_column(df) -> str:
    """The column naming a row's series: ``label_series`` if present, else ``method``."""
    return "label_series" if "label_series" in df.columns else "method"


def _panel_grid(plt, df, rows, cols, dataset_order):
    """The figure, and per panel ``(ax, sub, title)``: the rows of ``df`` it draws."""
    rows, cols = _layout(df, rows, cols)
    rlev = _levels(df, rows, dataset_order if rows == "dataset" else None)
    clev = _levels(df, cols, dataset_order if cols == "dataset" else None)
    fig, axes = plt.subplots(len(rlev), len(clev), figsize=_figsize(len(rlev), len(clev)),
                             squeeze=False)
    panels = []
    for i, rv in enumerate(rlev):
        for j, cv in enumerate(clev):
            sub = df
            if rows is not None:
                sub = sub[sub[rows] == rv]
            if cols is not None:
                sub = sub[sub[cols] == cv]
            title = _panel_title([rows] if rows else [], [cols] if cols else [],
                                 [rv] if rows else [], [cv] if cols else [])
            panels.append((axes[i][j], sub, title))
    return fig, panels


def _divergence_note(table, sub, scol: str, names: Sequence[str], panel_cols) -> str:
    """"diverged: RFA 5/5, Krum 4/5" for the series of a panel (the rows ``sub``) that
    diverged on some trials (of those with an outcome), or "" when none did. Diverged runs
    have no metric: they are left out of the means and named here instead."""
    if "status" not in table.columns:
        return ""
    div = table[table["status"] == "diverged"]
    if div.empty:
        return ""
    ok = table[table["status"] == "ok"]
    for col in panel_cols:
        if col is not None and col in table.columns:
            div = div[div[col].isin(sub[col].unique())]
            ok = ok[ok[col].isin(sub[col].unique())]
    parts = []
    for name in [*names, *[n for n in dict.fromkeys(div[scol]) if n not in names]]:
        d = div.loc[div[scol] == name, "key"].nunique()
        if d:
            parts.append(f"{name} {d}/{d + ok.loc[ok[scol] == name, 'key'].nunique()}")
    return "diverged: " + ", ".join(parts) if parts else ""


def _note_panel(ax, panel_title: str, notes: list[str] | None, kind: str, diverged: str,
                metric: str, unrecorded: list[str]) -> None:
    """A panel's title with what it does not draw (diverged runs, runs that did not record
    ``metric``), and the same line added to ``notes`` for the caller to print."""
    said = [diverged] + ([f"{metric} not recorded: " + ", ".join(unrecorded)] if unrecorded else [])
    said = "; ".join(n for n in said if n)
    if said and notes is not None:
        notes.append(f"{panel_title or 'the panel'}{kind}: runs not drawn: {said}")
    ax.set_title(_titled(panel_title, said), fontsize=9)


def _titled(panel_title: str, note: str) -> str:
    """The panel's title, followed by its divergence note (wrapped) when there is one."""
    if not note:
        return panel_title
    import textwrap

    return panel_title + "\n" + "\n".join(textwrap.wrap(note, 44))


def _say_if_empty(ax, drawn: int) -> None:
    """A panel with no finished run says so, rather than showing empty axes a reader could
    take for a plotting error (a sweep still under way leaves such panels)."""
    if drawn:
        return
    ax.text(0.5, 0.5, "no finished run", transform=ax.transAxes, ha="center",
            va="center", fontsize=9, color="#666666")
    ax.set_xticks([])
    ax.set_yticks([])


def _finish(fig, handles, order, title):
    """Shared legend below the panels, optional title, tight layout."""
    fig.legend([handles[n] for n in order], order, loc="lower center", ncol=min(6, len(order)),
               fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.02))
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97 if title else 1))


def plot_k_panels(table, stem, *, metric: str = "precision", rows: str | None = None,
                  cols: str | None = "dataset", series_order: Sequence[str] = (),
                  dataset_order: Sequence[str] = (), title: str | None = None,
                  baseline: bool = True, notes: list[str] | None = None) -> list[pathlib.Path]:
    """Metric@K panels: x = K, one line per series (mean over trials, ± std error bars).

    Args:
        table: the tidy results table (finished runs are used).
        stem: output path without suffix.
        metric: ``precision``, ``recall``, ``ndcg``, ``hr`` or ``mrr``.
        rows, cols: columns laid out as panel rows / columns (None: one).
        series_order: series names in legend order (others follow).
        dataset_order: dataset order when ``dataset`` is a panel axis.
        baseline: also draw the popularity ranking on the same clients (dotted
            grey), the line a trained model has to beat; on by default.
        notes: a list to which the notes of the panels' titles are appended
            (``"<panel>: diverged: RFA 2/5"``), for the caller to print: a line
            drawn over fewer runs than the table holds is said, not only drawn.
    """
    from rfrs_ref.experiments.claims import _line, metric_value

    plt = _pyplot()
    df = table[(table["status"] == "ok") & (table["metric"].isin([metric, f"popularity_{metric}"]))]
    if df.empty:
        raise ValueError(f"no finished run with metric {metric!r} in the table")
    scol = series_column(df)
    # a value of a finished run that is not a metric (±inf, 7, text) is refused with its
    # line, never averaged or left out of a line without a word; NaN is "not recorded",
    # said in the panel's title below
    df = df.assign(value=[
        metric_value(v, f"{_line(df, i)}series {name!r}, run {key}, {m}@{k}", m,
                     unrecorded=True)
        for i, name, key, m, k, v in zip(df.index, df[scol], df["key"], df["metric"],
                                         df["k"], df["value"])])
    fig, panels = _panel_grid(plt, df, rows, cols, dataset_order)
    names = _levels(df, scol, series_order)
    handles = {}
    for ax, sub, panel_title in panels:
        drawn_here = 0
        unrecorded = []
        for si, name in enumerate(names):
            s = sub[(sub[scol] == name) & (sub["metric"] == metric)]
            if s.empty:
                continue
            # NaN in a finished run is "not recorded" (a run from before the metric
            # existed): the mean leaves it out, and the panel says so instead of hiding it
            runs, recorded = s["key"].nunique(), s.loc[s["value"].notna(), "key"].nunique()
            if recorded < runs:
                unrecorded.append(f"{name} {runs - recorded}/{runs}")
            if not recorded:
                continue
            drawn_here += 1
            g = s.groupby("k")["value"]
            mean, std = g.mean(), g.std().fillna(0.0)
            color, marker = _style(name, si)
            h = ax.errorbar(mean.index.astype(int), mean.values, yerr=std.values, color=color,
                            marker=marker, markersize=4, capsize=3, linewidth=1.4, label=name)
            handles[name] = h
        if baseline:
            b = sub[sub["metric"] == f"popularity_{metric}"]
            if not b.empty:
                m = b.groupby("k")["value"].mean()
                h = ax.plot(m.index.astype(int), m.values, color="#999999", linestyle=":",
                            linewidth=1.2, label="Popularity")[0]
                handles["Popularity"] = h
        _note_panel(ax, panel_title, notes, "",
                    _divergence_note(table, sub, scol, names, (rows, cols)),
                    METRIC_NAMES.get(metric, metric), unrecorded)
        ax.set_xlabel("K", fontsize=8)
        ax.set_ylabel(f"{METRIC_NAMES.get(metric, metric)}@K", fontsize=8)
        ax.set_xticks(sorted(int(k) for k in df["k"].dropna().unique()))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        _say_if_empty(ax, drawn_here)
    order = [n for n in names if n in handles] + (["Popularity"] if "Popularity" in handles else [])
    _finish(fig, handles, order, title)
    return save(fig, stem)


def _history(run_dir: pathlib.Path) -> list[dict]:
    """The evaluation history of a finished run (``history`` of its outcome.json).

    The table lists the run as finished, so its record must be there: a missing
    or unreadable outcome.json, or one without a list of evaluation rows, is an
    error naming the file (never a run silently left out of its curve)."""
    from rfrs_ref.experiments.results import record_bytes, the_record
    from rfrs_ref.untrusted import parse_json

    try:
        path = the_record(run_dir)
    except ValueError as exc:
        raise ValueError(f"{exc}; the table lists this run as finished, and its training "
                         "curve is read from its record") from None
    try:
        o = parse_json(record_bytes(path), str(path))
    except FileNotFoundError:
        raise ValueError(f"{path}: missing; the table lists this run as finished (status "
                         "ok), and its training curve is read from this file") from None
    except (OSError, ValueError) as exc:  # not JSON, or one key twice in an object
        reason = str(exc).split("\n")[0].removeprefix(f"{path}: ")
        raise ValueError(f"{path}: not a readable run record ({reason}); the table lists "
                         "this run as finished, and its training curve is read from it") from None
    history = o.get("history") if isinstance(o, dict) else None
    if not isinstance(history, list) or not all(isinstance(row, dict) for row in history):
        raise ValueError(f"{path}: no evaluation history (a list of rows under 'history'); "
                         "the table lists this run as finished")
    return history


def _points(path: pathlib.Path, history: list[dict], name: str) -> dict[int, float]:
    """round -> value of the metric ``name`` (``precision@5``) in a finished run's history.

    A row without the metric (a run recorded before the metric existed) has no
    point. A value that is not a finite number in [0, 1] (every metric is a fraction;
    NDCG's ratio may round a hair above 1: ``results.METRIC_MAX``) is an error naming the
    file and round: a finished run's metrics are such numbers by construction (a
    non-finite score makes the run diverge, and a diverged run is not drawn), so such a
    value is a damaged record, and averaging around it would draw a curve over
    fewer runs than the table holds, or through a 7.5."""
    from rfrs_ref.experiments.results import METRIC_MAX

    pts = {}
    for i, row in enumerate(history):
        v = row.get(name)
        if v is None:
            continue
        t = row.get("round")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not float(t).is_integer():
            raise ValueError(f"{path}: evaluation row {i + 1} has round {t!r}, not a round "
                             "number")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{path}: round {int(t)}: {name} = {v!r} is not a finite number; "
                             "the run is recorded as finished (status ok), whose metrics are "
                             "finite numbers")
        if not 0.0 <= v <= METRIC_MAX:
            raise ValueError(f"{path}: round {int(t)}: {name} = {v!r} is not a metric in "
                             "[0, 1]; the run is recorded as finished (status ok), whose "
                             "metrics are fractions")
        pts[int(t)] = float(v)
    return pts


def _rounds(run_dir: pathlib.Path) -> list[dict]:
    from rfrs_ref.experiments.results import read_rounds

    return read_rounds(run_dir)


def _runs(table):
    """One row per finished run (the tidy table has one per K × metric)."""
    ok = table[table["status"] == "ok"]
    return ok.drop_duplicates("key")


def check_curve_records(table, base: pathlib.Path, *, metric: str = "precision",
                        k: int | None = None) -> None:
    """Read every record :func:`plot_curves` reads, as it reads them, and draw nothing: a
    record that is missing, unreadable or holds a metric that is not a finite number is
    the same ValueError naming the file, raised before a figure that would be drawn
    beside the curves (the panels) is written."""
    runs = _runs(table)
    if runs.empty:
        return
    k = k or int(table["k"].dropna().max())
    for _, r in runs.iterrows():
        where = run_path(base, r["run_dir"])
        _points(record_path(where), _history(where), f"{metric}@{k}")


def plot_curves(table, base: pathlib.Path, stem, *, metric: str = "precision", k: int | None = None,
                rows: str | None = None, cols: str | None = "dataset",
                series_order: Sequence[str] = (), dataset_order: Sequence[str] = (),
                title: str | None = None, notes: list[str] | None = None
                ) -> list[pathlib.Path]:
    """Training curves: metric@K against the round, mean over trials with a ±std band.

    ``base`` is the directory of the results table; each finished run's history
    is read from ``base/<run_dir>/outcome.json``. A curve is drawn over every
    finished run of its series that the table lists: a run whose record is
    missing, unreadable or holds a metric that is not a finite number is an
    error naming the file (:func:`_history`, :func:`_points`). A diverged run has
    no curve (its history stops at its divergence), as in the panels of
    :func:`plot_k_panels`; it is named with a run that did not record the
    metric in the panel's title ("diverged: RFA 2/5; not recorded: …") and in
    ``notes`` (a list the caller prints).
    """
    plt = _pyplot()
    runs = _runs(table)
    if runs.empty:
        raise ValueError("no finished run in the table")
    k = k or int(table["k"].dropna().max())
    scol = series_column(runs)
    fig, panels = _panel_grid(plt, runs, rows, cols, dataset_order)
    names = _levels(runs, scol, series_order)
    handles = {}
    drawn = 0
    for ax, sub, panel_title in panels:
        drawn_here = 0
        unrecorded = []
        for si, name in enumerate(names):
            curves = []
            mine = sub[sub[scol] == name]
            for _, r in mine.iterrows():
                where = run_path(base, r["run_dir"])
                pts = _points(record_path(where), _history(where), f"{metric}@{k}")
                if pts:
                    curves.append(pts)
            if len(curves) < len(mine):
                unrecorded.append(f"{name} {len(mine) - len(curves)}/{len(mine)}")
            if not curves:
                continue
            ts = sorted(set().union(*curves))
            vals = np.array([[c.get(t, np.nan) for t in ts] for c in curves], dtype=float)
            # every value is finite (_points); NaN marks only a round at which one run
            # of the series was not evaluated (another schedule), and is no point of it
            mean = np.nanmean(vals, axis=0)
            std = np.nanstd(vals, axis=0)
            color, _ = _style(name, si)
            h = ax.plot(ts, mean, color=color, linewidth=1.4, label=name)[0]
            if len(curves) > 1:
                ax.fill_between(ts, mean - std, mean + std, color=color, alpha=0.15,
                                linewidth=0)
            handles[name] = h
            drawn += 1
            drawn_here += 1
        # the popularity ranking does not train: one dotted level per panel
        b = table[(table["status"] == "ok") & (table["metric"] == f"popularity_{metric}")
                  & (table["k"] == k) & table["key"].isin(sub["key"])]
        if not b.empty and np.isfinite(b["value"].mean()):
            handles["Popularity"] = ax.axhline(b["value"].mean(), color="#999999", linestyle=":",
                                               linewidth=1.2, label="Popularity")
        _note_panel(ax, panel_title, notes, " (curves)",
                    _divergence_note(table, sub, scol, names, (rows, cols)),
                    f"{METRIC_NAMES.get(metric, metric)}@{k}", unrecorded)
        ax.set_xlabel("round", fontsize=8)
        ax.set_ylabel(f"{METRIC_NAMES.get(metric, metric)}@{k}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        _say_if_empty(ax, drawn_here)
    if not drawn:
        plt.close(fig)
        raise ValueError(f"no evaluation history found under {base}")
    _finish(fig, handles, [n for n in names if n in handles]
            + (["Popularity"] if "Popularity" in handles else []), title)
    return save(fig, stem)


def _number(v) -> float:
    """A recorded value as a float; None (JSON null) and anything that is not a number are NaN."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return float("nan")
    return float(v)


def has_resilience(table, base: pathlib.Path) -> bool:
    """Whether the table's runs recorded the Definition 1–4 sums."""
    runs = _runs(table)
    if "resilience" in runs.columns and not runs["resilience"].fillna(False).astype(bool).any():
        return False
    for _, r in runs.iterrows():
        if any("resilience" in rec for rec in _rounds(run_path(base, r["run_dir"]))):
            return True
    return False


def plot_resilience(table, base: pathlib.Path, stem, *,
                    panels: Sequence[str] = ("dataset", "alpha"), series_order: Sequence[str] = (),
                    title: str | None = None, notes: list[str] | None = None) -> list[pathlib.Path]:
    """Resilience curves: cumulative Σ_t C_x(t) (Definitions 1–4) against the round.

    One row of panels per term (C_g first, then the uploaded arrays' terms), one
    column per combination of ``panels``; one line per series (mean over
    trials), log scale. A mean is over every trial recorded at that round: a sum
    that is not finite (a NaN or ±inf term) makes the series' mean non-finite from
    there on, drawn as a gap rather than averaged away; runs that recorded no sums,
    and series whose sums turn non-finite, are named in the panel's title and in
    ``notes`` (a list the caller prints).
    """
    plt = _pyplot()
    runs = _runs(table)
    scol = series_column(runs)
    panels = [p for p in panels if p in runs.columns and runs[p].nunique() > 0]
    combos = list(dict.fromkeys(tuple(r[p] for p in panels) for _, r in runs.iterrows()))
    data: dict = {}
    terms: list[str] = []
    missing: dict = {}  # combo -> {series: [runs without sums, runs]}
    for _, r in runs.iterrows():
        recs = [rec for rec in _rounds(run_path(base, r["run_dir"])) if "resilience" in rec]
        combo = tuple(r[p] for p in panels)
        count = missing.setdefault(combo, {}).setdefault(r[scol], [0, 0])
        count[1] += 1
        if not recs:
            count[0] += 1
            continue
        for term in recs[0]["resilience"]:
            if term not in terms:
                terms.append(term)
            ts = [rec["round"] for rec in recs]
            # a term written null (not finite) or missing in a later round is NaN: the sum
            # is not finite from there on (and said so)
            vals = np.cumsum([_number(rec["resilience"].get(term)) for rec in recs])
            data.setdefault((combo, r[scol], term), []).append(dict(zip(ts, vals)))
    if not data:
        raise ValueError(f"no resilience sums recorded under {base} (run with --resilience)")
    terms.sort(key=lambda t: (t != "C_g", t))
    names = _levels(runs, scol, series_order)
    fig, axes = plt.subplots(len(terms), len(combos), figsize=(3.2 * len(combos), 2.4 * len(terms)),
                             squeeze=False)
    handles = {}
    for i, term in enumerate(terms):
        for j, combo in enumerate(combos):
            ax = axes[i][j]
            said = [f"{n} {c[0]}/{c[1]}" for n, c in missing.get(combo, {}).items() if c[0]]
            said = ["no sums recorded: " + ", ".join(said)] if said else []
            broken = []
            for si, name in enumerate(names):
                curves = data.get((combo, name, term))
                if not curves:
                    continue
                ts = sorted(set().union(*curves))
                vals = np.array([[c.get(t, np.nan) for t in ts] for c in curves], dtype=float)
                there = np.array([[t in c for t in ts] for c in curves])
                bad = there & ~np.isfinite(vals)
                if bad.any():
                    first = ts[int(np.flatnonzero(bad.any(axis=0))[0])]
                    broken.append(f"{name} {int(bad.any(axis=1).sum())}/{len(curves)} from round {first}")
                # the mean of the trials recorded at each round (a run evaluated on another
                # schedule is no point there); a non-finite sum stays non-finite
                vals = np.where(bad, np.nan, vals)
                with np.errstate(invalid="ignore"):
                    mean = np.where(bad.any(axis=0), np.nan, np.nanmean(vals, axis=0))
                color, _ = _style(name, si)
                handles[name] = ax.plot(ts, mean, color=color, linewidth=1.3, label=name)[0]
            if broken:
                said.append("non-finite sums: " + ", ".join(broken))
            note = "; ".join(said)
            head = f"{_panel_title(panels, [], combo, [])}: Σ {term}"
            if note and notes is not None:
                notes.append(f"{head} (resilience): {note}")
            ax.set_yscale("log")
            ax.set_title(_titled(head, note), fontsize=8)
            ax.set_xlabel("round", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    order = [n for n in names if n in handles]
    fig.legend([handles[n] for n in order], order, loc="lower center", ncol=min(6, len(order)),
               fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.02))
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97 if title else 1))
    return save(fig, stem)


def plot_pca(captures, stem, *, title: str | None = None) -> list[pathlib.Path]:
    """Fig. 1: the clients' uploads (left) and recovered gradients (right) on their first
    two principal components; benign clients blue dots, Byzantine orange triangles.

    ``captures`` is a capture dict, or a list of ``(row label, capture)``: one row each.
    """
    plt = _pyplot()
    if isinstance(captures, dict):
        captures = [("", captures)]
    fig, axes = plt.subplots(len(captures), 2, figsize=(7.6, 3.4 * len(captures)), squeeze=False)
    panels = [("theta_pca", "theta_explained", "theta", "(a) Model parameters"),
              ("gradient_pca", "gradient_explained", "gradient", "(b) Gradients")]
    for row, (label, capture) in enumerate(captures):
        byz = np.asarray(capture["byzantine"], dtype=bool)
        for ax, (key, ev_key, sep_key, name) in zip(axes[row], panels):
            xy = np.asarray(capture[key], dtype=float)
            ev = capture.get(ev_key) or [math.nan, math.nan]
            ax.scatter(xy[~byz, 0], xy[~byz, 1], s=14, c=BLUE, marker="o",
                       label=f"benign ({int((~byz).sum())})")
            ax.scatter(xy[byz, 0], xy[byz, 1], s=22, c=ORANGE, marker="^",
                       label=f"Byzantine ({int(byz.sum())})")
            sep = (capture.get("separation") or {}).get(sep_key)
            sub = f"PC1 {ev[0]:.0%}, PC2 {ev[1]:.0%} of variance"
            if sep is not None:
                sub += f"; separation {sep:.2g}"
            head = f"{label}: {name}" if label else name
            ax.set_title(f"{head}\n{sub}", fontsize=8.5)
            ax.set_xlabel("PC1", fontsize=8)
            ax.set_ylabel("PC2", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=7, loc="best")
            ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save(fig, stem)
