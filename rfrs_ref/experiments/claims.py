"""The paper's claims as data, and their verdicts from paired differences over seeds.

Statistics
----------
Two series of a results table are compared on the runs that share a seed
(same seed = same split, client sampling and Byzantine set), per dataset × α
× metric@K. With dᵢ = value(a, seed i) − value(b, seed i) over the n seeds
both series finished (a finished run's value that is not a metric in [0, 1],
NaN included, is refused, not dropped: :func:`_values`), the interval is
Student's t with n − 1 degrees of freedom::

    d̄ = mean(dᵢ),  s = std(dᵢ, ddof = 1),
    CI = d̄ ± t₀.₉₇₅,ₙ₋₁ · s / √n          (95 %)

The verdict, for a claim that a > b (``direction = +1``; −1 for a < b):
"holds" only where the interval excludes 0 in the claim's direction, "does
not hold" where it excludes 0 the other way, otherwise "inconclusive" (also
with n < 2: no interval). Identical runs (d = 0 for every seed) are
inconclusive: the interval is the single point 0.

Diverged runs
-------------
A run whose model diverged (status ``diverged``: its state or its scores
became NaN or ±inf) has no ranking, so it is worse than any finished run on
every metric. On the seeds where both series have an outcome (finished or
diverged), let k and j count the seeds where a and b diverged:

- k ≠ j: the series that diverged on more seeds is the worse one, whatever
  the metrics of the seeds where both finished: the claim holds when that is
  the series it says is worse (b for a > b), else it does not hold; the cell
  says "diverged k/n vs j/n";
- k = j (0 included): the Student-t interval above, over the seeds where both
  finished (inconclusive with fewer than 2); the counts are shown when not 0.

"The best baseline" is then the baseline with the fewest diverged seeds, and
among those the highest mean over its finished seeds.

Claims
------
:data:`CLAIMS` lists every claim of the paper this project checks, each
naming the experiment (the results directory of ``rfrs-ref reproduce``), the
two series, the direction, and where it applies (datasets, fractions,
metrics). "The best baseline" is, per dataset × α × metric@K, the baseline
series with the highest mean over seeds (chosen on the same runs, so the
comparison favours the baseline). Fig. 1's claim compares, per capture run,
the separation of the Byzantine and benign clients in gradient space with
that in parameter space (``rfrs_ref.experiments.worker.separation``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from typing import Iterable, Mapping, Sequence

import numpy as np

from rfrs_ref.experiments.results import METRIC_MAX, TABLE_METRICS

HOLDS, FAILS, INCONCLUSIVE, NOT_RUN = "holds", "does not hold", "inconclusive", "not run"
CONFIDENCE = 0.95
#: the metrics of every verdict: (metric, K)
METRICS = (("precision", 1), ("precision", 5), ("recall", 5))
BASELINES = ("No defense", "Krum", "RFA", "Trmean")


# -- statistics ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Paired:
    """The paired difference a − b over seeds and its confidence interval.

    Attributes:
        n: pairs used; mean: d̄ (None when n = 0); sd: s (None when n < 2);
        lo, hi: the interval (None when n < 2); confidence: its level;
        seeds: the seeds of the pairs; mean_a, mean_b: the two series' means on them.
    """

    n: int
    mean: float | None
    sd: float | None
    lo: float | None
    hi: float | None
    confidence: float = CONFIDENCE
    seeds: tuple = ()
    mean_a: float | None = None
    mean_b: float | None = None
    diverged_a: int = 0
    diverged_b: int = 0
    compared: int | None = None
    #: seeds finished by a only, by b only (a table whose two series share no seed judges
    #: nothing, and must say so rather than "not run")
    only_a: int = 0
    only_b: int = 0

    @property
    def total(self) -> int:
        """Seeds where both series have an outcome (finished or diverged)."""
        return self.n if self.compared is None else self.compared

    @property
    def disjoint(self) -> bool:
        """Both series finished runs, on no common seed: nothing could be paired."""
        return self.total == 0 and bool(self.only_a and self.only_b)

    @property
    def diverged(self) -> bool:
        """Whether either series diverged on one of the compared seeds."""
        return bool(self.diverged_a or self.diverged_b)

    def verdict(self, direction: int = 1) -> str:
        """holds / does not hold / inconclusive for the claim sign(a − b) = ``direction``;
        a series that diverged on more seeds is the worse one (module docstring)."""
        if self.diverged_a != self.diverged_b:
            if direction not in (1, -1):
                raise ValueError(f"direction must be +1 or -1, got {direction}")
            a_worse = self.diverged_a > self.diverged_b
            return HOLDS if a_worse == (direction == -1) else FAILS
        return verdict(self.lo, self.hi, direction)

    def divergence(self) -> str:
        """"diverged k/n vs j/n" (a's count first), or "" when neither diverged."""
        if not self.diverged:
            return ""
        return f"diverged {self.diverged_a}/{self.total} vs {self.diverged_b}/{self.total}"

    def describe(self) -> str:
        if self.n == 0:
            text = "no pairs" if not self.diverged else "no seed finished by both"
        elif self.lo is None:
            text = f"{self.mean:+.4f} (n = 1, no interval)"
        else:
            text = f"{self.mean:+.4f} [{self.lo:+.4f}, {self.hi:+.4f}]"
        return f"{self.divergence()}; Δ {text}" if self.diverged else text


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (scipy)."""
    from scipy import stats

    return float(stats.t.ppf(p, df))


def paired_interval(diffs: Iterable[float], confidence: float = CONFIDENCE,
                    seeds: Sequence = (), mean_a=None, mean_b=None) -> Paired:
    """d̄ and the Student-t interval d̄ ± t_{(1+c)/2, n−1} · s/√n of the differences ``diffs``.

    Non-finite differences are an error (the caller decides what to drop);
    ``confidence`` must be in (0, 1).
    """
    d = np.asarray(list(diffs), dtype=np.float64)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if d.size and not np.isfinite(d).all():
        raise ValueError("paired differences must be finite; drop the runs with NaN or inf "
                         "metrics first")
    n = int(d.size)
    if n == 0:
        return Paired(0, None, None, None, None, confidence, tuple(seeds), mean_a, mean_b)
    mean = float(d.mean())
    if n < 2:
        return Paired(1, mean, None, None, None, confidence, tuple(seeds), mean_a, mean_b)
    sd = float(d.std(ddof=1))
    half = t_quantile((1.0 + confidence) / 2.0, n - 1) * sd / math.sqrt(n)
    return Paired(n, mean, sd, mean - half, mean + half, confidence, tuple(seeds), mean_a,
                  mean_b)


def verdict(lo: float | None, hi: float | None, direction: int = 1) -> str:
    """"holds" if the interval [lo, hi] excludes 0 on the side of ``direction`` (+1: a > b,
    −1: a < b), "does not hold" if it excludes 0 on the other side, else "inconclusive"."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")
    if lo is None or hi is None:
        return INCONCLUSIVE
    if lo > 0:
        return HOLDS if direction == 1 else FAILS
    if hi < 0:
        return HOLDS if direction == -1 else FAILS
    return INCONCLUSIVE


class TableError(ValueError):
    """A results table cannot be judged: the message names the series, seed and metric (the
    caller adds the file)."""


def _line(table, i) -> str:
    """"line N" of a row read from a CSV with a default index (the header is line 1)."""
    return f"line {int(i) + 2}, " if isinstance(i, (int, np.integer)) else ""


def _seed(table, i, seed, series: str) -> int:
    """A seed as an integer; 1.5 or "x" would pair with the wrong run (or crash)."""
    try:
        f = float(seed)
    except (TypeError, ValueError):
        f = math.nan
    if not (math.isfinite(f) and f.is_integer()):
        raise TableError(f"{_line(table, i)}series {series!r}: seed {seed!r} is not an integer")
    return int(f)


def metric_value(v, where: str, metric: str, *, unrecorded: bool = False) -> float:
    """A finished run's recorded metric ``v`` as a float in [0, 1], or :class:`TableError`
    naming ``where`` (the line, series and metric): a value that is not a number, ±inf, or
    outside [0, 1] (every metric here is a fraction; NDCG's ratio may round a hair above 1:
    ``results.METRIC_MAX``, the bound the tables check too). An empty or NaN value (a metric the run
    did not record) is refused too, unless ``unrecorded``: it is then returned as NaN, for a
    caller that says which runs lack it."""
    try:
        f = float(v) if v is not None else math.nan
    except (TypeError, ValueError):
        raise TableError(f"{where}: value {v!r} is not a number") from None
    if math.isnan(f):
        if unrecorded:
            return f
        raise TableError(f"{where}: no value (empty or NaN) in a finished run (status ok); "
                         "a finished run records its metrics as numbers in [0, 1] (a "
                         f"run made before {metric} was recorded has none: judge a "
                         "metric every run recorded, or run it again)")
    if not 0.0 <= f <= METRIC_MAX:
        raise TableError(f"{where}: value {f!r} is not a metric in [0, 1]")
    return f


#: the statuses a results table gives a run (``results.run_status``)
STATUSES = ("ok", "failed", "diverged")


def _spelling(v: str) -> str:
    """A label as a reader sees it: spaces collapsed and trimmed, case folded."""
    return " ".join(v.split()).casefold()


def _misspelt(values, known: Sequence[str] = (), closed: bool = False) -> dict[str, str]:
    """{value: why it selects no cell} for the labels ``values`` (a column's values, one
    per row) that differ from another label of the column, or from a ``known`` name,
    only in spaces or case (which of the two a row means is a guess; the spelling kept
    is the known name, else the most common one, else the one without stray spaces),
    and, when ``closed``, for every label that is not a known name."""
    import pandas as pd

    counts = pd.Series(values).astype(str).value_counts()
    canon: dict[str, str] = {_spelling(v): v for v in reversed(list(known))}
    ranked = sorted(counts.items(), key=lambda vc: (vc[0] != " ".join(vc[0].split()), -vc[1], vc[0]))
    for v, _ in ranked:
        canon.setdefault(_spelling(v), v)
    out = {}
    for v in counts.index:
        c = canon[_spelling(v)]
        if v != c:
            out[v] = f"{v!r} differs from {c!r} only in spaces or case"
        elif closed and v not in known:
            out[v] = f"{v!r} is not one of {', '.join(map(repr, known))}"
    return out


def check_cells(table, cells: Sequence[str] = (), known: Mapping[str, Sequence[str]] | None = None,
                closed: Sequence[str] = ()) -> None:
    """Refuse, with :class:`TableError` naming the line, a row of a finished or diverged run
    (status ``ok`` or ``diverged``) whose ``alpha`` is not a Byzantine fraction (a finite
    number in [0, 1)), and a metric row of a finished run whose ``k`` is not a whole number
    ≥ 1 (a column the table lacks is not checked). Such a row belongs to no cell that is
    judged or drawn: NaN matched no fraction and no K, so
    its seed was dropped from the comparison without a word (a claim "held" on the seeds
    left), and ±inf made a cell of its own; a run's fraction and K are numbers by
    construction.

    So is a row whose ``status`` is empty or not one of :data:`STATUSES`, and a row of a
    finished or diverged run with an empty (or blank) cell that selects its cell: its
    ``dataset``, its series (``label_series``, else ``method``), each column of ``cells``
    the caller selects on too (the ranking's ``label_space``, ``label_pre``, ``attack``),
    and, in a finished run's row, its ``metric``. Every run records them; a failed run's
    row, in no cell, is not checked.

    So is a row whose run (its ``key``, where the table has one) is recorded elsewhere with
    another status, dataset, series, fraction, seed or cell of ``cells``: a run is one seed
    of one series, and its rows copied under other seeds (its key kept) counted one run as
    several, each a pair of its own.

    So is such a cell whose label selects no cell: one that differs from another label of
    its column, or from a name the caller knows (``known``: column -> names; the metric's
    are :data:`~rfrs_ref.experiments.results.TABLE_METRICS`, the dataset's the
    registry's), only in spaces or case (``'precision '``, ``'Precision'``, ``'A-FRS '``:
    the row matched no cell, and its seed left the comparison without a word while the
    verdict was judged on the others), and in a column of ``closed`` (the metric's, and
    the ranking's detection space and pre-aggregator, whose cells are a fixed list) any
    label that is not a known name."""
    import pandas as pd

    t = table
    scol = next((c for c in ("label_series", "method") if c in t.columns), None)

    def cell(i, col):
        v = t.at[i, col]
        return v.item() if isinstance(v, np.generic) else v  # 2, not np.int64(2)

    def refuse(i, what: str) -> None:
        series = f"series {cell(i, scol)!r}, " if scol is not None else ""
        seed = f"seed {cell(i, 'seed')!r}: " if "seed" in t.columns else ""
        raise TableError(f"{_line(t, i)}{series}{seed}{what}")

    def empty(col):
        return t[col].isna() | (t[col].astype(str).str.strip() == "")

    bad = empty("status") | ~t["status"].astype(str).isin(STATUSES)
    if bad.any():
        i = t.index[bad][0]
        what = ("column status is empty" if empty("status")[i]
                else f"status {cell(i, 'status')!r} is not one of {', '.join(STATUSES)}")
        refuse(i, f"{what} (every run's row records its outcome, {', '.join(STATUSES)}; this "
                  "row lies in no cell of the results)")
    outcome = t["status"].isin(("ok", "diverged"))
    for col, rows in ([(c, outcome) for c in ("dataset", scol, *cells) if c in t.columns]
                      + [("metric", t["status"] == "ok")]):
        bad = rows & empty(col)
        if bad.any():
            i = t.index[bad][0]
            refuse(i, f"column {col} is empty in a {cell(i, 'status')} run's row (every "
                      f"such row records its {col}; this row lies in no cell of the results)")
    if "alpha" in t.columns:
        alpha = pd.to_numeric(t["alpha"], errors="coerce").astype(float)
        bad = (t["status"].isin(("ok", "diverged"))
               & ~(np.isfinite(alpha) & (alpha >= 0.0) & (alpha < 1.0)))
        if bad.any():
            i = t.index[bad][0]
            refuse(i, f"alpha {cell(i, 'alpha')!r} is not a Byzantine fraction in [0, 1) (a "
                      "run's fraction is one; this row lies in no cell of the results)")
    if "key" in t.columns:
        _check_keys(t, [c for c in ("status", "dataset", scol, "alpha", "seed", *cells)
                        if c is not None and c in t.columns], refuse)
    names = {"metric": TABLE_METRICS, "dataset": _dataset_names(), **(known or {})}
    shut = {"metric", *closed}
    for col, rows in ([(c, outcome) for c in ("dataset", scol, *cells) if c in t.columns]
                      + [("metric", t["status"] == "ok")]):
        why = _misspelt(t.loc[rows, col], tuple(names.get(col, ())), col in shut)
        if why:
            bad = rows & t[col].astype(str).isin(list(why))
            i = t.index[bad][0]
            refuse(i, f"column {col}: {why[str(cell(i, col))]} (this row lies in no cell of "
                      "the results; its run would be left out of every comparison without a "
                      "word)")
    k = pd.to_numeric(t["k"], errors="coerce").astype(float)
    bad = ((t["status"] == "ok") & t["metric"].notna()
           & ~(np.isfinite(k) & (k >= 1) & (np.mod(k, 1) == 0)))
    if bad.any():
        i = t.index[bad][0]
        refuse(i, f"{cell(i, 'metric')} at k {cell(i, 'k')!r}: K is not a whole number ≥ 1 "
                  "(a metric row of a finished run records its K; this row lies at no K of the "
                  "results)")


def _check_keys(t, cols: Sequence[str], refuse) -> None:
    """``refuse(i, why)`` for the first row ``i`` whose run (its ``key``) an earlier row
    records with another value in one of ``cols`` (a run's rows agree on them)."""
    keyed = t["key"].notna() & (t["key"].astype(str).str.strip() != "")
    if not keyed.any() or not cols:
        return
    sub = t.loc[keyed, cols]
    vals = sub.astype(object).where(sub.notna(), "").astype(str)
    keys = t.loc[keyed, "key"].astype(str)
    first = vals.groupby(keys, sort=False).transform("first")
    bad = (vals != first).any(axis=1)
    if not bad.any():
        return
    i = bad.index[bad.to_numpy().argmax()]
    j = keys.index[(keys == keys[i]).to_numpy().argmax()]
    col = next(c for c in cols if vals.at[i, c] != vals.at[j, c])
    here, there = (v.item() if isinstance(v, np.generic) else v
                   for v in (t.at[i, col], t.at[j, col]))
    refuse(i, f"run {keys[i]} has {col} {here!r} here and {there!r} at "
              f"{_line(t, j).rstrip(', ') or f'row {j}'} (one run is one seed of one series, "
              "its rows alike but for their metric: its rows copied under another seed or "
              "series would count it twice)")


def numeric_alpha(table):
    """A copy of ``table`` with its ``alpha`` column (if any) as floats: after :func:`check_cells` only a failed run's row (in no cell) may hold one that
    is not a number (text), which becomes NaN instead of stopping the comparison of the
    others with a message naming no line."""
    import pandas as pd

    t = table.copy()
    if "alpha" in t.columns:
        t["alpha"] = pd.to_numeric(t["alpha"], errors="coerce").astype(float)
    return t


def _dataset_names() -> tuple[str, ...]:
    """The registry's dataset names (the labels a table's ``dataset`` is checked against)."""
    from rfrs_ref.data.datasets import DATASETS

    return tuple(DATASETS.names())


def _diverged(table, series: str, *, dataset: str, alpha, series_col: str) -> set:
    """The seeds on which ``series`` diverged, in one cell (dataset, α).

    A row of status ``diverged`` whose ``diverged_round`` is not a round of the run (an
    integer from 1 to its ``rounds``; both columns present) is refused with
    :class:`TableError`: a run stops at the round whose state or scores are not finite,
    and a divergence at no round of it (an edited table) would count against its series.
    An empty ``diverged_round`` passes (a divergence recorded by an early version, whose
    round is unknown)."""
    t = table
    sel = ((t["status"] == "diverged") & (t[series_col].astype(str) == series)
           & (t["dataset"] == dataset))
    if alpha is not None:
        sel &= np.isclose(t["alpha"].astype(float), float(alpha))
    if "diverged_round" in t.columns and "rounds" in t.columns:
        for i, seed, at, rounds in zip(t.index[sel], t.loc[sel, "seed"],
                                       t.loc[sel, "diverged_round"], t.loc[sel, "rounds"]):
            _check_diverged_round(at, rounds, f"{_line(t, i)}series {series!r}, seed {seed!r}")
    return {_seed(t, i, seed, series) for i, seed in zip(t.index[sel], t.loc[sel, "seed"])}


def _check_diverged_round(at, rounds, where: str) -> None:
    """Refuse a diverged row whose ``diverged_round`` ``at`` is not an integer in
    1..``rounds`` (empty ``at`` or ``rounds``: nothing to check)."""
    import pandas as pd

    if pd.isna(at) or pd.isna(rounds):
        return
    try:
        t, last = float(at), float(rounds)
    except (TypeError, ValueError):
        t = last = math.nan
    if not (t.is_integer() and 1.0 <= t <= last):
        raise TableError(f"{where}: a diverged run (status diverged) whose diverged_round "
                         f"{at!r} is not a round of the run (1 to {rounds!r}): a run diverges "
                         "at a round it trained; run the sweep again (it runs such a run again)")


def _values(table, series: str, *, dataset: str, alpha, metric: str, k: int,
            series_col: str) -> dict:
    """seed -> value of the finished runs of ``series`` in one cell.

    Only rows whose status is ``ok`` hold values: a failed run is in no pair,
    and a diverged one is counted by :func:`_diverged` (their rows have no
    metric). A finished run's metrics are finite numbers by construction (a
    non-finite score makes a run diverge, and the tables write a recorded
    non-finite metric as a failure), so a value of a finished run that is not a
    metric is refused with :class:`TableError`, never dropped or averaged: a
    value that is NaN or empty, ±inf, outside [0, 1] (every metric here is a
    fraction) or not a number, a seed that is not an integer, and two rows for
    one seed (which of them would the verdict use?). NaN is refused like inf
    although the tables write it for a metric a run did not record (NDCG of a
    run made before it existed): dropping the seed would change which seeds
    are compared, and which baseline is best, without a word; a table judged on
    such a metric must be judged on one every run recorded. A row of status ``ok``
    whose ``final_round`` is not its ``rounds`` (both columns present) is no finished
    run either (the tables write such a record as failed) and is refused the same way.
    """
    t = table
    sel = ((t["status"] == "ok") & (t[series_col].astype(str) == series)
           & (t["dataset"] == dataset) & (t["metric"] == metric) & (t["k"] == k))
    if alpha is not None:
        sel &= np.isclose(t["alpha"].astype(float), float(alpha))
    out: dict[int, float] = {}
    rounds = _last_rounds(t, sel)
    for i, seed, v, last in zip(t.index[sel], t.loc[sel, "seed"], t.loc[sel, "value"], rounds):
        where = f"{_line(t, i)}series {series!r}, seed {seed!r}, {metric}@{k}"
        s = _seed(t, i, seed, series)
        _check_last_round(*last, where)
        f = metric_value(v, where, metric)
        if s in out:
            raise TableError(f"{where}: two finished runs with this seed (values {out[s]!r} and "
                             f"{f!r}); one run per series and seed")
        out[s] = f
    return out


def _last_rounds(table, sel) -> list[tuple]:
    """(final_round, rounds) of the rows ``sel`` of ``table``; (None, None) each when the
    table lacks either column (a table written by hand: nothing to check)."""
    if "final_round" not in table.columns or "rounds" not in table.columns:
        return [(None, None)] * int(sel.sum())
    return list(zip(table.loc[sel, "final_round"], table.loc[sel, "rounds"]))


def _check_last_round(last, rounds, where: str) -> None:
    """Refuse a row of status ``ok`` whose final evaluation was not made after the run's
    last round (``final_round`` ≠ ``rounds``): a run that did not finish, recorded as
    finished (an edited record, or a table written before such records were shown as
    failed). Without the columns (None), or with ``rounds`` empty, it passes."""
    import pandas as pd

    if pd.isna(rounds):  # None, NaN, pd.NA: no configured rounds to compare with
        return
    try:
        same = not pd.isna(last) and float(last) == float(rounds)
    except (TypeError, ValueError):
        raise TableError(f"{where}: final_round {last!r} or rounds {rounds!r} is not a "
                         "number") from None
    if not same:  # an empty final_round included: a finished run records its final round
        raise TableError(f"{where}: a finished run (status ok) whose final evaluation is of "
                         f"round {last!r}, not of its last round {rounds!r}: the run did not "
                         "finish; run the sweep again (it runs such a run again)")


#: the columns of a run that set the protocol a paired difference holds fixed: two runs of
#: one seed are a pair only if they trained as long, on as many clients a round, on the same
#: split of the same data (the series themselves differ in model, optimiser, defence, attack)
PROTOCOL_COLUMNS = ("rounds", "client_fraction", "test_fraction", "valid_fraction", "dataset_params")


def _check_same_protocol(table, series: Sequence[str], seeds, *, dataset: str, alpha,
                         series_col: str) -> None:
    """Refuse (:class:`TableError`) a seed whose finished runs of the ``series`` differ in a
    column of :data:`PROTOCOL_COLUMNS` (those the table has): 600 rounds against 10 paired
    without a word, and the verdict read like one of the protocol."""
    import pandas as pd

    cols = [c for c in PROTOCOL_COLUMNS if c in table.columns]
    if not cols or not seeds:
        return
    t = table
    sel = ((t["status"] == "ok") & (t["dataset"] == dataset)
           & t[series_col].astype(str).isin(list(series)))
    if alpha is not None:
        sel &= np.isclose(t["alpha"].astype(float), float(alpha))
    # a run's rows (one per metric) repeat its run-level columns: one row per distinct value
    sub = t.loc[sel, ["seed", *cols]].drop_duplicates()
    sub = sub[pd.to_numeric(sub["seed"], errors="coerce").isin(list(seeds))]  # _values checked them
    if sub.empty:
        return
    vals = sub[cols].astype(object).where(sub[cols].notna(), "").astype(str)
    vals["_seed"] = pd.to_numeric(sub["seed"]).astype(int)
    uniq = vals.drop_duplicates(subset=["_seed", *cols])
    clash = uniq["_seed"].duplicated(keep=False)
    if not clash.any():
        return
    first = uniq[clash]
    i, j = first.index[0], first.index[first["_seed"] == first["_seed"].iloc[0]][1]
    col = next(c for c in cols if uniq.at[i, c] != uniq.at[j, c])
    raise TableError(f"{_line(t, j)}series {t.at[j, series_col]!r} and {t.at[i, series_col]!r}, "
                     f"seed {int(uniq.at[i, '_seed'])}: the runs paired differ in {col} "
                     f"({uniq.at[j, col]!r} against {uniq.at[i, col]!r}, "
                     f"{_line(t, i).rstrip(', ')}); a paired difference compares runs of one "
                     "protocol (the same rounds, clients a round and split)")


def paired_difference(table, a: str, b: str, *, dataset: str, alpha=None, metric: str,
                      k: int, series_col: str = "label_series",
                      confidence: float = CONFIDENCE) -> Paired:
    """The paired difference a − b over the seeds both series finished, in one cell
    (dataset, α (None: any), metric@k) of a tidy results table, with the number of
    seeds each diverged on among those where both have an outcome."""
    va = _values(table, a, dataset=dataset, alpha=alpha, metric=metric, k=k,
                 series_col=series_col)
    vb = _values(table, b, dataset=dataset, alpha=alpha, metric=metric, k=k,
                 series_col=series_col)
    seeds = sorted(set(va) & set(vb))
    _check_same_protocol(table, (a, b), seeds, dataset=dataset, alpha=alpha, series_col=series_col)
    p = paired_interval([va[s] - vb[s] for s in seeds], confidence, seeds,
                        _mean([va[s] for s in seeds]), _mean([vb[s] for s in seeds]))
    da = _diverged(table, a, dataset=dataset, alpha=alpha, series_col=series_col)
    db = _diverged(table, b, dataset=dataset, alpha=alpha, series_col=series_col)
    for series, v, d in ((a, va, da), (b, vb, db)):
        both = sorted(set(v) & d)
        if both:  # one seed, two outcomes: neither rule of the module docstring applies
            raise TableError(f"series {series!r}, seed {both[0]}: both finished and diverged; "
                             "one run per series and seed")
    p = dataclasses.replace(p, only_a=len(set(va) - set(vb)), only_b=len(set(vb) - set(va)))
    if not (da or db):
        return p
    both = (set(va) | da) & (set(vb) | db)  # the seeds where both have an outcome
    return dataclasses.replace(p, diverged_a=len(da & both), diverged_b=len(db & both),
                               compared=len(both))


def _mean(xs):
    return float(np.mean(xs)) if xs else None


# -- claims -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim of the paper.

    Attributes:
        id: short identifier; text: the claim as the paper makes it; figure: the paper's
        figure number (the reproduce command's FIGURE); experiment: the results directory
        name of ``rfrs-ref reproduce`` (also found as ``fig<figure>``).
        a: the series claimed better; against: the series it is compared with (one row each;
        ``"best baseline"`` is the best of BASELINES per cell).
        direction: +1 (a above) or −1 (a below).
        datasets: where the claim applies (None: every dataset in the results).
        alphas: the fractions (None: every fraction in the results).
        metrics: (metric, K) pairs; paper_relative: the paper's relative difference, shown
        beside ours (e.g. 0.337); kind: ``table`` or ``separation`` (Fig. 1).
        by_alpha: one row per fraction; False when the two series differ in α (Fig. 2:
        no attack against 40% Byzantine clients), which then pair by seed alone.
    """

    id: str
    text: str
    figure: str
    experiment: str
    a: str
    against: tuple[str, ...]
    direction: int = 1
    datasets: tuple[str, ...] | None = None
    alphas: tuple[float, ...] | None = None
    metrics: tuple[tuple[str, int], ...] = METRICS
    paper_relative: float | None = None
    kind: str = "table"
    by_alpha: bool = True

    def dirs(self) -> tuple[str, ...]:
        from rfrs_ref.experiments.figures import FIGURES

        ids = [i for i, f in FIGURES.items() if f.experiment == self.experiment]
        return (self.experiment, *(f"fig{i}" for i in ids))


CLAIMS: tuple[Claim, ...] = (
    Claim("frs-fmf", "A-FRS outperforms FMF on all datasets (Fig. 3/7)", "3", "frs",
          "A-FRS", ("FMF",)),
    Claim("camouflage", "The camouflage attack (40% Byzantine) degrades A-FRS (Fig. 2)", "2",
          "camouflage", "No attack", ("Camouflage attack (40%)",), by_alpha=False),
    Claim("arfrs-all", "A-RFRS outperforms every other defence at every fraction (Fig. 4/8)",
          "4", "defenses", "A-RFRS", BASELINES),
    Claim("arfrs-lastfm-33.7", "On Last.fm with 40% Byzantine clients, A-RFRS improves the best "
          "baseline by 33.7% on Precision@1", "4", "defenses", "A-RFRS", ("best baseline",),
          datasets=("lastfm",), alphas=(0.4,), metrics=(("precision", 1),),
          paper_relative=0.337),
    Claim("arfrs-krum", "A-RFRS outperforms Krum on all four datasets (Fig. 4)", "4", "defenses",
          "A-RFRS", ("Krum",)),
    Claim("pca", "Model parameters of Byzantine and benign clients are less distinguishable "
          "than their gradients (Fig. 1; separation, gradient minus parameter)", "1", "pca",
          "gradient", ("theta",), kind="separation"),
    Claim("adam-sgd", "Adam outperforms SGD (Fig. 10)", "10", "adam-sgd", "Adam", ("SGD",)),
    Claim("srfrs", "With momentum, S-RFRS outperforms the other defences (Fig. 11)", "11",
          "momentum", "S-RFRS", BASELINES),
    Claim("agrfrs", "With AdaGrad, AG-RFRS outperforms the other defences (Fig. 12)", "12",
          "adagrad", "AG-RFRS", BASELINES),
)


def claim(name: str) -> Claim:
    for c in CLAIMS:
        if c.id == name:
            return c
    raise KeyError(f"unknown claim {name!r}; claims: {', '.join(c.id for c in CLAIMS)}")


# -- finding results -----------------------------------------------------------------------------
def claim_directory_names() -> tuple[str, ...]:
    """Every directory name some claim reads (a name with a ``-suffix`` is read too)."""
    names = {n for c in CLAIMS for n in c.dirs()}
    return tuple(sorted(names))


def unread_directories(found: Mapping[str, pathlib.Path]) -> list[pathlib.Path]:
    """The results directories no claim reads by their name (``NAME``, ``NAME-suffix``
    for a name of :func:`claim_directory_names`, or ``ablation-*``)."""
    known = claim_directory_names()
    return [p for n, p in sorted(found.items())
            if not (n.startswith("ablation-") or any(n == k or n.startswith(f"{k}-") for k in known))]


def find_results(paths: Iterable[str | pathlib.Path]) -> dict[str, pathlib.Path]:
    """Results directories by name: each path is a results directory (it holds results.csv or
    results.parquet) or a folder of them (its subdirectories that do). Two different
    directories of one name (``a/defenses`` and ``b/defenses``) are refused (ValueError
    naming both): a claim reads its experiment's directory by name, and the first used to
    win while the other, named by the user, was left aside without a word.

    A path given may be a link; a link inside it is refused (ValueError naming it): a
    results directory of a folder that is a link to another folder, or a table, run
    directory or outcome a results directory reads through a link
    (:func:`rfrs_ref.experiments.results.linked_input`), would be judged as this
    folder's results while it may be any file of the machine."""
    from rfrs_ref.experiments.results import refuse_linked_input

    found: dict[str, pathlib.Path] = {}
    for p in map(pathlib.Path, paths):
        if not p.is_dir():
            raise FileNotFoundError(f"{p}: not a directory; give results directories "
                                    "(e.g. results/defenses) or a folder holding them")
        candidates = [p] if _has_table(p) else sorted(c for c in p.iterdir() if c.is_dir()
                                                      and _has_table(c))
        for c in candidates:
            if c != p and c.is_symlink():
                raise ValueError(f"{c} is a link (to {os.readlink(c)}), and rfrs-ref judges the "
                                 f"results directories inside {p}, never one through a link; "
                                 "give the directory it points to by its own path; nothing was "
                                 "judged")
            refuse_linked_input(c)
            prev = found.setdefault(c.name, c)
            if prev.resolve() != c.resolve():
                raise ValueError(f"{prev} and {c} are both results directories named {c.name!r}, "
                                 "and a claim reads its experiment's directory by name: judging "
                                 "one would leave the other aside; give one of them (or rename "
                                 "the other, e.g. with a suffix); nothing was judged")
    return found


def _has_table(d: pathlib.Path) -> bool:
    """Whether ``d`` holds a results table: a results.csv or results.parquet that is not a
    folder. One that is no regular file (a FIFO) is a table to read, and refused when read
    (:func:`rfrs_ref.experiments.results.read_input`) rather than the directory passed over."""
    return any(os.path.lexists(d / n) and not (d / n).is_dir()
               for n in ("results.csv", "results.parquet"))


#: columns a results table needs for a verdict
NEEDED = ("status", "dataset", "alpha", "seed", "metric", "k", "value")


def _whole(x) -> int | None:
    """``x`` (a table cell) as an int when it is a whole number, else None."""
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) and f.is_integer() else None


def _table(d: pathlib.Path):
    from rfrs_ref.experiments.results import read_table

    path = d / "results.csv" if (d / "results.csv").is_file() else d
    table = read_table(path)
    if "status" in table.columns and "error" in table.columns:
        from rfrs_ref.experiments.results import run_status

        # tables written before divergence was an outcome: their diverged runs say "failed"
        # (at a round of the run: 1 to its rounds, where the table says them)
        rounds = table["rounds"] if "rounds" in table.columns else [None] * len(table)
        table["status"] = [run_status({"status": st, "error": er if isinstance(er, str) else None},
                                      _whole(n))
                           for st, er, n in zip(table["status"], table["error"], rounds)]
    missing = [c for c in NEEDED if c not in table.columns]
    if missing or ("label_series" not in table.columns and "method" not in table.columns):
        raise ValueError(f"{path}: not a results table of rfrs-ref (missing column(s) "
                         f"{', '.join(missing) or 'label_series or method'}); give the "
                         "directories written by rfrs-ref reproduce")
    return table


# -- verdict rows --------------------------------------------------------------------------------
@dataclasses.dataclass
class Row:
    """One row of the verdict table: a claim in one setting (dataset, α, comparator)."""

    claim: Claim
    dataset: str | None
    alpha: float | None
    against: str
    results: dict            # (metric, k) -> Paired
    directory: str | None
    note: str = ""
    options: str = ""        # reproduce options that made these runs (Fig. 1: --trials, --set)
    figure: str | None = None  # the experiment to reproduce, when not the claim's (ablations)

    @property
    def verdicts(self) -> dict:
        return {m: p.verdict(self.claim.direction) for m, p in self.results.items()}

    @property
    def verdict(self) -> str:
        """The verdict shared by every metric; "mixed" when they differ; "not run"."""
        if not self.results or all(p.total == 0 for p in self.results.values()):
            return NOT_RUN
        vs = set(self.verdicts.values())
        return vs.pop() if len(vs) == 1 else "mixed"

    @property
    def unpaired(self) -> bool:
        """Both series finished runs, but on no common seed (nothing could be paired)."""
        return any(p.disjoint for p in self.results.values())

    @property
    def n(self) -> int:
        """Seeds compared (both series finished or diverged), the least over the metrics."""
        return min((p.total for p in self.results.values()), default=0)

    @property
    def divergence(self) -> str:
        """"diverged k/n vs j/n" when a series diverged on a compared seed, else ""."""
        return next((p.divergence() for p in self.results.values() if p.diverged), "")

    def command(self) -> str:
        where = f" --out {self.directory}" if self.directory else ""
        if self.claim.kind == "separation":
            return f"rfrs-ref reproduce {self.claim.figure}{self.options}{where}"
        ds = f" --datasets {self.dataset}" if self.dataset else ""
        return f"rfrs-ref reproduce {self.figure or self.claim.figure}{ds}{self.options}{where}"


def evaluate_claim(c: Claim, results: Mapping[str, pathlib.Path],
                   directory_name: str | None = None, *, present_only: bool = False) -> list[Row]:
    """The rows of claim ``c`` from the results directories ``results`` (name -> path).

    ``directory_name`` evaluates the claim on that directory instead of the claim's own
    (an ablation of the same figure). A missing directory gives one "not run" row.
    ``present_only`` keeps only the fractions at which the claim's own series (``c.a``)
    has runs in the table, and gives no row where it has none: an ablation directory
    may hold several figures' runs (``ablation-rounds``: Fig. 4's at α = 0.4, Fig. 10's
    at α = 0), and a claim is judged only where its runs are."""
    names = (directory_name,) if directory_name else c.dirs()
    if c.kind == "separation":
        # Fig. 1 may be run once per initialisation, in directories pca, pca-init1, ...
        dirs = [results[n] for n in sorted(results)
                if any(n == a or n.startswith(f"{a}-") for a in names)]
        if not dirs:
            return [Row(c, None, None, c.against[0], {}, None,
                        note=f"no results directory ({' or '.join(names)})")]
        return [r for d in dirs for r in _separation_rows(c, d)]
    d = next((results[n] for n in names if n in results), None)
    if d is None:
        # a name with a suffix: ``reproduce --quick`` writes defenses-quick, a user may
        # keep defenses-20rounds beside the full run (the exact name wins). Two of them
        # and no exact name: which one the claim is judged on is not for us to guess
        suffixed = [n for a in names for n in sorted(results) if n.startswith(f"{a}-")]
        if len(suffixed) > 1:
            return [Row(c, None, None, b, {}, None, note=f"several results directories "
                        f"({', '.join(suffixed)}): not judged; give the one to judge "
                        f"(rfrs-ref verdict {results[suffixed[0]]})") for b in c.against]
        d = results[suffixed[0]] if suffixed else None
    if d is None:
        return [Row(c, None, None, b, {}, None, note="no results directory "
                    f"({' or '.join(names)})") for b in c.against]
    table = _table(d)
    try:
        return _claim_rows(c, table, d, present_only=present_only,
                           figure_id=directory_name if directory_name else c.figure)
    except (TableError, ValueError, TypeError) as exc:  # a defect of the table: name the file
        where = d / "results.csv" if (d / "results.csv").is_file() else d
        raise TableError(f"{where}: {exc}") from None


def _claim_rows(c: Claim, table, d: pathlib.Path, *, present_only: bool = False,
                figure_id: str | None = None) -> list[Row]:
    scol = "label_series" if "label_series" in table.columns else "method"
    check_cells(table, known={scol: tuple(dict.fromkeys((c.a, *c.against, *BASELINES)))})
    table = numeric_alpha(table)
    datasets = c.datasets or tuple(_ordered(table["dataset"].dropna().unique()))
    rows = []
    for ds in datasets:
        here = table["dataset"] == ds
        if present_only:
            here &= table[scol] == c.a
            if not here.any():
                continue
        alphas = c.alphas or tuple(sorted({float(x) for x in table.loc[here, "alpha"].dropna()}))
        if present_only and c.alphas:
            alphas = tuple(a for a in alphas if (table.loc[here, "alpha"] == a).any())
            if not alphas:
                continue
        alphas = alphas if c.by_alpha and alphas else (None,)
        for alpha in alphas:
            for b in c.against:
                res, note = {}, ""
                for metric, k in c.metrics:
                    against = b
                    if b == "best baseline":
                        against = _best(table, BASELINES, ds, alpha, metric, k, scol)
                        note = f"best baseline: {against}" if against else "no baseline run"
                    res[(metric, k)] = (paired_difference(table, c.a, against, dataset=ds,
                                                          alpha=alpha, metric=metric, k=k,
                                                          series_col=scol)
                                        if against else paired_interval([]))
                unpaired = next((p for p in res.values() if p.disjoint), None)
                if unpaired is not None:  # both ran, on different seeds: nothing to pair
                    note += (f"; no seed in common: {c.a} finished {unpaired.only_a} seed(s), "
                             f"{against} {unpaired.only_b}, none the same")
                if c.paper_relative is not None:
                    p = res[c.metrics[0]]
                    if p.mean_b:
                        note += (f"; {c.a} vs it: {p.mean_a / p.mean_b - 1:+.1%} "
                                 f"(paper: {c.paper_relative:+.1%})")
                rows.append(Row(c, ds, alpha, b, res, str(d), note=note.strip("; "),
                                options=scale_options(d, ds, figure_id or c.figure)))
    return rows


def scale_options(d: pathlib.Path, dataset: str, figure_id: str) -> str:
    """The ``reproduce`` options (``--rounds N``, ``--trials N``, ``--alphas A,B``) that
    made the runs of ``dataset`` in results directory ``d`` where they depart from figure
    ``figure_id``'s own grid, read from ``d/runs.csv``; "" when they do not, or when it
    cannot tell. A verdict row's command then repeats the runs it judged, not the full
    grid (``--alphas`` where some of the figure's fractions have no run of the dataset:
    citeulike-a's Fig. 4 at α = 0.2 and 0.4 only)."""
    from rfrs_ref.experiments.figures import Scale, figure

    try:
        import pandas as pd

        runs = pd.read_csv(d / "runs.csv",
                           usecols=lambda col: col in ("dataset", "rounds", "trial", "alpha"))
        here = runs[runs["dataset"] == dataset]
        rounds = {int(r) for r in here["rounds"].dropna()}
        trials = int(here["trial"].max()) + 1
        fig = figure(figure_id)
        usual = fig.runs(fig.scale(Scale(datasets=(dataset,))))
        alphas = ({float(a) for a in here["alpha"].dropna()} if "alpha" in here.columns
                  else set())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ""
    opts = ""
    if len(rounds) == 1 and rounds != {s.config.rounds for s in usual}:
        opts += f" --rounds {rounds.pop()}"
    if trials != (fig.trials or len({s.config.seed for s in usual})):
        opts += f" --trials {trials}"
    own = [a for a in fig.fractions if any(math.isclose(a, b) for b in alphas)]
    if own and len(own) < len(fig.fractions) and len(own) == len(alphas):
        opts += f" --alphas {','.join(f'{a:g}' for a in own)}"
    return opts


def _ordered(datasets) -> list[str]:
    from rfrs_ref.experiments.figures import DATASETS

    return sorted(map(str, datasets), key=lambda x: (DATASETS.index(x) if x in DATASETS
                                                      else len(DATASETS), x))


def _best(table, candidates, dataset, alpha, metric, k, scol) -> str | None:
    """The baseline that diverged on the fewest seeds, and among those the one with the
    highest mean over its finished seeds (None: no baseline has an outcome)."""
    best, best_key = None, None
    for s in candidates:
        v = _values(table, s, dataset=dataset, alpha=alpha, metric=metric, k=k, series_col=scol)
        d = _diverged(table, s, dataset=dataset, alpha=alpha, series_col=scol)
        if not v and not d:
            continue
        key = (-len(d), float(np.mean(list(v.values()))) if v else -math.inf)
        if best_key is None or key > best_key:
            best, best_key = s, key
    return best


def _separation_rows(c: Claim, d: pathlib.Path) -> list[Row]:
    """Fig. 1: per model (series), the paired difference of separations, gradient − θ.

    Each capture run's outcome.json is input. A finished capture run (status ``ok``, a
    ``capture`` record or a spec of kind ``capture``) whose two separations are not both
    finite numbers (NaN, ±inf, null or missing: the capture records both, and leaving the
    run out would judge the claim on the others without a word), a spec without its model,
    dataset or seed, or two runs of one series with one seed raise :class:`TableError`
    naming the file. A record of status ``ok`` that holds no finished run's result
    (``results.unfinished_reason``) is a failed run, as the tables show it: in no pair.
    So is a record of another run (``results.record_of_another_run``: its ``key``, or the
    key its ``spec`` hashes to, is not the name of its folder, as in a record copied from
    another run's folder with its seed edited), which a sweep takes as a failure and runs
    again: it is in no pair, and each row of the directory says how many there are and
    names the first (a spec without its model, dataset or seed is refused first)."""
    from rfrs_ref.experiments.results import (Store, record_of_another_run, record_path,
                                              unfinished_reason)
    from rfrs_ref.experiments.spec import RunSpec

    by_series: dict[str, dict[int, float]] = {}
    inits: dict[str, float] = {}
    dataset = None
    misplaced: list[tuple[pathlib.Path, str]] = []
    for key, o in Store(d).outcomes().items():
        where = record_path(d / "runs" / key)
        if not isinstance(o, dict) or o.get("status") != "ok":
            continue
        cap = o.get("capture")
        spec = o.get("spec")
        if not cap and not (isinstance(spec, dict) and spec.get("kind") == "capture"):
            continue  # another kind of run
        try:
            spec = spec or {}
            config = spec["config"]
            series = (spec.get("labels") or {}).get("series") or config["model"]
            init = config.get("init_scale", 0.1)
            seed = _seed(None, None, config["seed"], str(series))
            series = f"{series}, init N(0, {float(init):g}²)"
            why = record_of_another_run(o, key)
            if why is not None:
                misplaced.append((where, why))
                continue  # no result of this directory: a failed run (the sweep runs it again)
            if unfinished_reason(o, RunSpec.from_json(spec).config.resolved()) is not None:
                continue  # no result: a failed run (the tables say why)
            if not isinstance(cap, dict):
                raise TableError("a finished capture run without its capture record")
            sep = cap.get("separation")
            sep = sep if isinstance(sep, dict) else {}
            ga, gb = sep.get(c.a), sep.get(c.against[0])
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (ga, gb)):
                raise TableError(f"separations {c.a} {ga!r} and {c.against[0]} {gb!r} are not "
                                 "both numbers (a finished capture run records both)")
            if not (math.isfinite(ga) and math.isfinite(gb)):
                raise TableError(f"separations {c.a} {ga!r} and {c.against[0]} {gb!r} are not "
                                 "both finite (a finished capture run records both as finite "
                                 "numbers)")
            if seed in by_series.get(series, {}):
                raise TableError(f"a second capture run of {series!r} with seed {seed}")
            dataset = config["dataset"]
        except (TableError, KeyError, TypeError, ValueError, AttributeError) as exc:
            what = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
            raise TableError(f"{where}: {what}") from None
        inits[series] = float(init)
        by_series.setdefault(series, {})[seed] = float(ga) - float(gb)
    uncounted = ""
    if misplaced:
        first, why = misplaced[0]
        # a table cell: what the files say is kept on one line and cannot end the cell
        uncounted = " ".join(f"{len(misplaced)} record(s) of another run not counted, as "
                             f"failed runs are; the first: {first}: {why}".split())
        uncounted = uncounted.replace("|", "\\|")
    if not by_series:
        return [Row(c, None, None, c.against[0], {}, str(d),
                    note="; ".join(n for n in ("no finished capture run", uncounted) if n))]
    rows = []
    for series, diffs in sorted(by_series.items()):
        seeds = sorted(diffs)
        p = paired_interval([diffs[s] for s in seeds], seeds=seeds)
        options = f" --trials {len(seeds)}" if len(seeds) > 1 else ""
        if inits[series] != 0.1:
            options += f" --set init_scale={inits[series]:g}"
        rows.append(Row(c, dataset, None, series, {("separation", 0): p}, str(d),
                        note=uncounted, options=options))
    return rows


#: the experiments whose claims an ablation directory can hold runs of
ABLATED_EXPERIMENTS = ("defenses", "adam-sgd")


def evaluate(results: Mapping[str, pathlib.Path], claims: Sequence[Claim] = CLAIMS,
             ablations: Sequence[str] = ()) -> list[Row]:
    """Every claim's rows; for each ablation directory name, the rows of the claims of the
    figures it ablates (Fig. 4; Fig. 10 for ``ablation-rounds``) evaluated on it where
    their series have runs, marked with the ablation's name."""
    rows = []
    for c in claims:
        rows.extend(evaluate_claim(c, results))
    for name in ablations:
        for c in claims:
            if c.experiment in ABLATED_EXPERIMENTS and c.kind == "table":
                for r in evaluate_claim(c, results, directory_name=name, present_only=True):
                    r.note = f"ablation {name}" + (f"; {r.note}" if r.note else "")
                    r.figure = name
                    rows.append(r)
    return rows


# -- output ----------------------------------------------------------------------------------------
def _metric_name(m) -> str:
    metric, k = m
    if metric == "separation":
        return "separation"
    return {"precision": "P", "recall": "R"}.get(metric, metric) + f"@{k}"


def verdict_markdown(rows: Sequence[Row]) -> str:
    """The verdict table: claim, dataset, α, comparison, verdict, Δ [95% CI] per metric, n,
    command. A cell reads "mean difference [interval] (verdict)"; where a series diverged,
    the verdict and the cells also say "diverged k/n vs j/n" and n counts the seeds
    compared (finished or diverged by both)."""
    head = ["claim", "dataset", "α", "comparison", "verdict", "P@1 Δ [95% CI]",
            "P@5 Δ [95% CI]", "R@5 Δ [95% CI]", "n", "command"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = {}
        for m, p in r.results.items():
            name = _metric_name(m)
            text = f"{p.describe()} ({p.verdict(r.claim.direction)})" if p.total else "—"
            if name == "separation":  # Fig. 1 has one measure: shown in the first column
                name, text = "P@1", f"separation: {text}"
            cells[name] = text
        comparison = (f"{r.claim.a} vs {r.against}" if r.claim.kind == "table"
                      else f"{r.against}: gradient − θ separation")
        if r.note:
            comparison += f" ({r.note})"
        lines.append("| " + " | ".join([
            r.claim.text, r.dataset or "—", "—" if r.alpha is None else f"{r.alpha:g}",
            comparison, r.verdict + (f" ({r.divergence})" if r.divergence else ""),
            cells.get("P@1", "—"), cells.get("P@5", "—"),
            cells.get("R@5", "—"), str(r.n), f"`{r.command()}`"]) + " |")
    return "\n".join(lines) + "\n"


def verdict_frame(rows: Sequence[Row]):
    """The verdict rows as a tidy table: one row per claim row × metric. ``n`` counts the
    seeds both series finished; where a series diverged, ``compared`` (seeds where both have
    an outcome), ``diverged_a`` and ``diverged_b`` say on how many each diverged (columns
    present only when some series diverged)."""
    import pandas as pd

    out = []
    for r in rows:
        base = {"claim": r.claim.id, "text": r.claim.text, "dataset": r.dataset,
                "alpha": r.alpha, "a": r.claim.a, "b": r.against,
                "direction": r.claim.direction, "row_verdict": r.verdict, "note": r.note,
                "directory": r.directory, "command": r.command()}
        if not r.results:
            out.append({**base, "metric": None, "k": None, "n": 0, "mean": None, "lo": None,
                        "hi": None, "verdict": NOT_RUN, "seeds": ""})
        for (metric, k), p in r.results.items():
            out.append({**base, "metric": metric, "k": k, "n": p.n, "mean": p.mean,
                        "lo": p.lo, "hi": p.hi, "mean_a": p.mean_a, "mean_b": p.mean_b,
                        "verdict": p.verdict(r.claim.direction) if p.total else NOT_RUN,
                        "seeds": json.dumps(list(p.seeds)),
                        **({"compared": p.total, "diverged_a": p.diverged_a,
                            "diverged_b": p.diverged_b} if p.diverged else {})})
    df = pd.DataFrame(out)
    for col in ("compared", "diverged_a", "diverged_b"):  # only where something diverged
        if col in df.columns:
            df[col] = df[col].astype("Int64")
    return df
