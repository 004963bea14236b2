"""The defences ranked: every registered rule, with and without NNM, in both detection
spaces, under two attacks (docs/defenses.md).

The experiment (``rfrs-ref reproduce ranking``, results in ``results/ranking``)
crosses

- every rule of :data:`rfrs_ref.aggregate.RULES` (read when the grid is built,
  so a rule registered later joins it),
- no pre-aggregator and nearest-neighbour mixing (``pre = ("nnm",)``),
- the detection spaces ``gradient`` and ``parameter``,
- the attacks ``ascent`` (the paper's gradient ascent) and ``a-ra`` (the
  targeted promotion attack),
- α ∈ {0.2, 0.4}, on Last.fm and ML100K, federated Adam, each dataset's
  default rounds, 3 trials (seeds 0–2).

The plain mean without pre-aggregator never reads the features, so it runs
once per cell (in parameter space, as the paper's "No defense"), not once per
space: it is the reference "no defence" of both spaces. Bulyan needs
n ≥ 4f + 3, which a round of 9 (ML100K) or 18 (Last.fm) clients at α = 0.4
violates: it runs with ``fallback = "reduce-f"`` (the largest f it
tolerates; the diagnostics of every such round say so), the only rule of the
grid that needs it. On another dataset, a rule that cannot aggregate its rounds
(MDA's and SMEA's exact search over C(n, f) subsets on CiteULike) is left out of
that dataset's grid, and said (``Figure.left_out``; docs/defenses.md).

The analysis (:func:`ranking_markdown`, ``rfrs-ref ranking``): for each
(dataset, α, attack, detection space, pre-aggregator) the rules ranked by
Precision@5 (mean over seeds; a rule that diverged on more seeds ranks below
one that diverged on fewer, as in the verdicts), with the paired difference
over seeds (same seed = same split, client sampling and Byzantine set) and
its 95 % Student-t interval against no defence (the mean, no
pre-aggregator) and against A-RFRS (Krum on recovered gradients, no
pre-aggregator), computed by :func:`rfrs_ref.experiments.claims.paired_difference`.
By the targets' exposure (``metric`` ``er`` or ``target_hr``, recorded by the
targeted attack's runs only) the rules rank the other way, least exposure
first, over the cells of that attack alone.
"""

from __future__ import annotations

import os
import pathlib
from typing import Sequence

from rfrs_ref.experiments.claims import (CONFIDENCE, _values, check_cells, numeric_alpha,
                                         paired_difference)

NAME = "ranking"
DATASETS = ("lastfm", "ml100k")
FRACTIONS = (0.2, 0.4)
ATTACKS = ("ascent", "a-ra")
SPACES = ("gradient", "parameter")
#: the pre-aggregator settings: label -> ``pre`` of the run
PRES = (("none", ()), ("nnm", ("nnm",)))
TRIALS = 3
OPTIMIZER = "adam"
#: rules that need a fallback at some fraction of the grid, and the one they get
FALLBACK = {"bulyan": "reduce-f"}
#: the references every rule is compared with: (column title, rule, space, pre)
NO_DEFENSE = ("mean", "parameter", "none")
A_RFRS = ("krum", "gradient", "none")
METRIC, K = "precision", 5
#: metrics of the target items of an item-promotion attack (ER@K, the targets' hit ratio),
#: recorded by its runs only: lower is better, so a rule protects where Δ vs no defence < 0
LOWER_IS_BETTER = ("er", "target_hr")
#: how a table's head names a metric
_SHORT = {"precision": "P", "er": "ER", "target_hr": "Target HR"}


def rules() -> tuple[str, ...]:
    """Every registered rule, in the registry's order."""
    from rfrs_ref.aggregate import RULES

    return tuple(name for name, _ in RULES.items())


def cases(datasets: Sequence[str], rule_names: Sequence[str] | None = None,
          fractions: Sequence[float] = FRACTIONS, attacks: Sequence[str] = ATTACKS) -> list:
    """``[(labels, dataset, fields)]`` of the grid (one entry per configuration; the
    seeds are added by the figure's grid). ``rule_names``, ``fractions`` and
    ``attacks`` restrict it (None: every registered rule)."""
    out = []
    for d in datasets:
        for alpha in fractions:
            for attack in attacks:
                for pre_label, pre in PRES:
                    for space in SPACES:
                        for rule in (rule_names or rules()):
                            if rule == "mean" and not pre and space != NO_DEFENSE[1]:
                                continue  # the mean alone never reads the features
                            fields = {"optimizer": OPTIMIZER, "attack": attack,
                                      "byzantine_fraction": alpha, "defense": rule,
                                      "detect": space, "pre": pre}
                            if rule in FALLBACK:
                                fields["defense_params"] = {"fallback": FALLBACK[rule]}
                            out.append(({"series": rule, "space": space, "pre": pre_label},
                                        d, fields))
    return out


# -- analysis ------------------------------------------------------------------------------------
def _key(rule: str, space: str, pre: str) -> str:
    return f"{rule}|{space}|{pre}"


def _resolve(key: str) -> str:
    """The mean without pre-aggregator is the no-defence reference of every space."""
    rule, _, pre = key.split("|")
    return _key(*NO_DEFENSE) if (rule, pre) == (NO_DEFENSE[0], NO_DEFENSE[2]) else key


def _prepare(table):
    """The table with a ``_cell`` series column ``rule|space|pre`` (the mean without a
    pre-aggregator is the same run in both spaces)."""
    need = ("label_series", "label_space", "label_pre", "attack", "dataset", "alpha", "seed",
            "status", "metric", "k", "value")
    missing = [c for c in need if c not in table.columns]
    if missing:
        raise ValueError(f"not a results table of the ranking experiment (missing column(s) "
                         f"{', '.join(missing)}); give the directory written by "
                         "rfrs-ref reproduce ranking")
    from rfrs_ref.aggregate import RULES
    from rfrs_ref.attack import ATTACKS as ATTACK_NAMES

    # a row of no fraction, no K or an empty cell of its own is refused, not dropped
    check_cells(table, ("label_space", "label_pre", "attack"),
                known={"label_space": SPACES, "label_pre": tuple(p for p, _ in PRES),
                       "label_series": tuple(RULES.names()), "attack": tuple(ATTACK_NAMES.names())},
                closed=("label_space", "label_pre"))
    t = numeric_alpha(table)
    t["_cell"] = [_resolve(_key(r, s, p)) for r, s, p in zip(t["label_series"].astype(str),
                                                                t["label_space"].astype(str),
                                                                t["label_pre"].astype(str))]
    return t


def ranking_rows(table, metric: str = METRIC, k: int = K,
                 confidence: float = CONFIDENCE) -> list[dict]:
    """One record per (dataset, α, attack, space, pre, rule) with its rank in its cell.

    Each record: ``dataset, alpha, attack, space, pre, rule, rank, n`` (finished
    seeds), ``diverged`` (diverged seeds), ``failed`` (seeds whose run failed without an
    outcome: a crash, not the rule's result; shown beside ``n``, not ranked on), ``mean``
    (over the finished seeds,
    None if none), and ``vs_none``, ``vs_arfrs``: the
    :class:`~rfrs_ref.experiments.claims.Paired` difference rule − reference
    (None for the reference itself).
    """
    import numpy as np

    t = _prepare(table)
    rows = []
    # the cells come from the rows that name them: a failed run may leave its cells empty
    # (check_cells refuses that of a finished one), and NaN is no dataset, fraction or attack
    datasets = set(t["dataset"].dropna())
    for dataset in [d for d in DATASETS if d in datasets] + sorted(datasets - set(DATASETS)):
        here = t[t["dataset"] == dataset]
        for alpha in sorted({float(a) for a in here["alpha"].dropna()}):
            for attack in sorted(set(here["attack"].dropna()),
                                 key=lambda a: (ATTACKS + (a,)).index(a)):
                sub = t[(t["dataset"] == dataset) & (t["attack"] == attack)
                        & np.isclose(t["alpha"].astype(float), alpha)]
                if metric in LOWER_IS_BETTER and not (sub["metric"] == metric).any():
                    continue  # an attack without target items: nothing exposed to rank
                for pre, _ in PRES:
                    for space in SPACES:
                        cell = []
                        present = set(sub["_cell"])
                        keys = sorted(key for key in present if key.split("|")[2] == pre)
                        keys = [key for key in keys if key.split("|")[1] == space
                                or key == _key(*NO_DEFENSE)]
                        for key in keys:
                            rule = key.split("|")[0]
                            # one value per seed, each a metric in [0, 1] (a duplicate
                            # or an infinite value is refused, not averaged or dropped)
                            finite = list(_values(sub, key, dataset=dataset, alpha=alpha,
                                                  metric=metric, k=k, series_col="_cell").values())
                            mine = sub[sub["_cell"] == key]
                            div = len(set(mine.loc[mine["status"] == "diverged", "seed"]))
                            # seeds whose run crashed and has no outcome: not the rule's result,
                            # but a mean over fewer seeds than the grid's must say so
                            done = set(mine.loc[mine["status"].isin(("ok", "diverged")), "seed"])
                            failed = len(set(mine.loc[mine["status"] == "failed", "seed"]) - done)
                            rec = {"dataset": dataset, "alpha": alpha, "attack": attack,
                                   "space": space, "pre": pre, "rule": rule, "n": len(finite),
                                   "diverged": div, "failed": failed,
                                   "mean": float(np.mean(finite)) if finite else None}
                            for col, ref in (("vs_none", NO_DEFENSE), ("vs_arfrs", A_RFRS)):
                                rec[col] = None if key == _key(*ref) else paired_difference(
                                    sub, key, _key(*ref), dataset=dataset, alpha=alpha,
                                    metric=metric, k=k, series_col="_cell",
                                    confidence=confidence)
                            cell.append(rec)
                        sign = 1.0 if metric in LOWER_IS_BETTER else -1.0
                        cell.sort(key=lambda r: (r["diverged"], r["mean"] is None,
                                                 sign * (r["mean"] or 0.0), r["rule"]))
                        for i, r in enumerate(cell, 1):
                            r["rank"] = i
                        rows.extend(cell)
    return rows


_DATASET_NAMES = {"lastfm": "Last.fm", "ml100k": "ML100K"}


def _cell_text(p) -> str:
    return "—" if p is None else p.describe()


def recorded_ks(table, metric: str = METRIC) -> list[int]:
    """The Ks at which some finished run (status ``ok``) of ``table`` recorded ``metric``."""
    t = _prepare(table)
    sel = (t["status"] == "ok") & (t["metric"] == metric)
    ks = set()
    for k in t.loc[sel, "k"].dropna():
        try:
            ks.add(int(k))
        except (TypeError, ValueError):
            continue
    return sorted(ks)


def check_k(table, metric: str = METRIC, k: int = K) -> None:
    """Refuse a K at which no run recorded ``metric`` while runs recorded it at other Ks.

    Ranking at such a K would show every rule with no value and no pair, ranked
    alphabetically: a table that looks like a result and judged nothing. A table
    without any finished run passes (the caller reports that there is nothing to
    rank).

    A target metric (ER, the targets' hit ratio) that no finished run recorded is
    refused too: a table of the ascent attack alone has no targets to rank by.

    Raises:
        ValueError: naming the K asked for and the recorded ones.
    """
    ks = recorded_ks(table, metric)
    if not ks and metric in LOWER_IS_BETTER and (_prepare(table)["status"] == "ok").any():
        raise ValueError(f"no run recorded {metric}: only the runs of an attack with target "
                         "items (a-ra) do; rank these results by precision, recall, ndcg, "
                         "hr or mrr")
    if ks and int(k) not in ks:
        raise ValueError(f"no run recorded {metric}@{k}; the runs recorded {metric} at "
                         f"K = {', '.join(map(str, ks))} (choose one with --k)")


def judged_pairs(rows: list[dict]) -> int:
    """How many comparisons of ``rows`` (:func:`ranking_rows`) were judged: a rule and a
    reference with an outcome (finished or diverged) on a common seed."""
    return sum(1 for r in rows for col in ("vs_none", "vs_arfrs")
               if r[col] is not None and r[col].total > 0)


def ranking_markdown(table, metric: str = METRIC, k: int = K,
                     confidence: float = CONFIDENCE, rows: list[dict] | None = None) -> str:
    """The ranking as Markdown: one table per (dataset, α, attack, space, pre).

    ``rows``: the records of :func:`ranking_rows` for this table, metric and K,
    when the caller has them already (they are computed otherwise)."""
    if rows is None:
        rows = ranking_rows(table, metric, k, confidence)
    if not rows:
        return "No finished run of the ranking experiment in this table.\n"
    level = f"{round(confidence * 100)} %"
    mname = f"{_SHORT.get(metric, metric)}@{k}"
    order = (" (the target items' exposure: lowest first, and a rule protects where Δ vs no "
             "defence is below 0)" if metric in LOWER_IS_BETTER else "")
    lines = [f"Rules ranked by {mname}{order} (mean over the finished seeds). Δ: the paired "
             f"difference rule − reference over the seeds both finished, with its {level} "
             "Student-t interval; no defence = the mean without pre-aggregator, A-RFRS = Krum "
             "on recovered gradients without pre-aggregator. A rule that diverged on more "
             "seeds ranks lower; a seed whose run failed (a crash, no outcome) is counted "
             "beside the finished ones, and its rule's mean is over the seeds that finished.", ""]
    held: dict[tuple, set] = {}
    for r in rows:
        held.setdefault((r["dataset"], r["alpha"]), set()).add(r["rule"])
    for (dataset, alpha), present in held.items():
        # say which rules are missing rather than rank as if every rule had run: a rule that
        # cannot aggregate a round of the dataset at α is left out of its grid
        # (Figure.left_out), and a table may hold a sweep that is not finished
        absent = [rule for rule in rules() if rule not in present]
        if absent:
            lines += [f"Registered rules with no finished run on "
                      f"{_DATASET_NAMES.get(dataset, dataset)} at α = {alpha:g}: "
                      f"{', '.join(absent)} (not run yet, or left out of the grid because "
                      "they cannot aggregate a round there: docs/defenses.md).", ""]
    cells: dict = {}
    for r in rows:
        cells.setdefault((r["dataset"], r["alpha"], r["attack"], r["pre"], r["space"]), []).append(r)
    for (dataset, alpha, attack, pre, space), cell in cells.items():
        title = (f"### {_DATASET_NAMES.get(dataset, dataset)}, α = {alpha:g}, {attack}, "
                 f"{space} space, {'NNM' if pre == 'nnm' else 'no pre-aggregator'}")
        lines += [title, "",
                  f"| rank | rule | {mname} | seeds | Δ vs no defence | Δ vs A-RFRS |",
                  "|---|---|---|---|---|---|"]
        for r in cell:
            value = "—" if r["mean"] is None else f"{r['mean']:.4f}"
            seeds = (f"{r['n']}" + (f" (+{r['diverged']} diverged)" if r["diverged"] else "")
                     + (f" (+{r['failed']} failed)" if r.get("failed") else ""))
            lines.append(f"| {r['rank']} | {r['rule']} | {value} | {seeds} | "
                         f"{_cell_text(r['vs_none'])} | {_cell_text(r['vs_arfrs'])} |")
        lines.append("")
    return "\n".join(lines)


def combine_tables(tables: Sequence[tuple[str, object]]):
    """One table of the ranking from the tables of several results directories, given as
    ``(name, table)`` pairs (the name is what a message calls the table: its file).

    Each dataset's runs come from one table: a dataset recorded in two (a row of it in
    each, whatever its status) is refused, naming both, since its cells would hold two
    runs per seed, or seeds judged against references of another sweep; so is a run key
    in two. A directory holds the whole grid of the datasets recorded there
    (``rfrs-ref reproduce ranking --datasets lastfm --out results/ranking-lastfm``), so
    the ranking of several directories is the ranking of each dataset of its own. The
    rows keep their order, table after table; the tables are not modified.

    Raises:
        ValueError: no table, a dataset or a key in two tables.
    """
    import pandas as pd

    if not tables:
        raise ValueError("no results table to rank")
    seen_dataset: dict = {}
    seen_key: dict = {}
    for name, table in tables:
        if "dataset" in table.columns:
            for d in sorted({str(x) for x in table["dataset"].dropna()}):
                if d in seen_dataset:
                    raise ValueError(f"{seen_dataset[d]} and {name} both record runs of "
                                     f"{d}: each dataset's runs are ranked from one results "
                                     "directory; give one of them")
                seen_dataset[d] = name
        if "key" in table.columns:
            for k in sorted({str(x) for x in table["key"].dropna()}):
                if k in seen_key:
                    raise ValueError(f"{seen_key[k]} and {name} both record run {k}; give each "
                                     "results directory once")
                seen_key[k] = name
    if len(tables) == 1:
        return tables[0][1]
    return pd.concat([t for _, t in tables], ignore_index=True, sort=False)


def merge_rows(rows_of_tables: Sequence[list[dict]]) -> list[dict]:
    """The records of :func:`ranking_rows` of tables of disjoint datasets
    (:func:`combine_tables`), in the order :func:`ranking_rows` gives for their combined
    table: dataset by dataset (the registered order, then the others by name), each
    dataset's records as its own table ranked them."""
    merged = [r for rows in rows_of_tables for r in rows]
    known = list(DATASETS)
    return sorted(merged, key=lambda r: (0, known.index(r["dataset"]), "")
                  if r["dataset"] in known else (1, 0, str(r["dataset"])))


#: how :func:`ranking_markdown`'s text begins (with rows, and without): an existing
#: ``ranking.md`` that begins otherwise is not a ranking this package wrote
RANKING_HEADS = ("Rules ranked by ", "No finished run of the ranking experiment")


def write_ranking(table, out: str | pathlib.Path, metric: str = METRIC, k: int = K) -> pathlib.Path:
    """Write ``ranking.md`` into ``out`` (created) and return its path.

    Raises ValueError, writing nothing, when ``out/ranking.md`` is a link or exists and
    is not a ranking this package wrote (its first line is not one of
    :data:`RANKING_HEADS`): a user's own ranking.md in ``plot --out`` is left as it is."""
    from rfrs_ref.experiments.plots import refuse_foreign
    from rfrs_ref.experiments.results import atomic_write_text
    from rfrs_ref.files import first_line

    out = pathlib.Path(out)
    path = out / "ranking.md"
    if path.is_symlink():
        raise ValueError(f"{path} is a link (to {os.readlink(path)}): the ranking is written "
                         "into the folder given, never through a link; nothing was written")
    refuse_foreign([path], "a ranking rfrs-ref wrote",
                   ours=lambda p: (first_line(p) or "").startswith(RANKING_HEADS))
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, ranking_markdown(table, metric, k))
    return path
