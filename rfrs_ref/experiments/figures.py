"""The paper's figures as experiments: a grid of runs each, and how to plot it.

``FIGURES`` maps a figure's number (as printed in the paper: "1", "2", "3",
"4", "7", "8", "10", "11", "12") to a :class:`Figure`; ``figure(name)`` also
accepts the figure's short name (``pca``, ``camouflage``, ``frs``,
``defenses``, ``frs-recall``, ``defenses-recall``, ``adam-sgd``, ``momentum``,
``adagrad``) or its LaTeX label (``fig:performance2``). Figures that plot the
same runs (3 and 7, 4 and 8) share an experiment name, hence an output
directory, so the second reuses the first's runs.

Decisions where the paper is silent (also in docs/reproduction.md):

- **Fig. 1** uses ML100K with FMF and Adam, no defence, the gradient-ascent
  attack, and draws the same for FISM (the model of A-FRS) in a second row.
  The paper shows 90 clients of one round (58 benign, 32 Byzantine):
  the client fraction is set so that exactly 90 clients are sampled per round
  (e = 90.5/943, so floor(e·943) = 90), and α = 32/90, so that 335 of the 943
  clients are Byzantine and a round holds 32 of them on average; the actual
  count of round 24 depends on the seed and is printed on the figure.
- **Fig. 2 (right)**: A-FRS (no defence) without attack vs under the
  camouflage attack with α = 0.4, one panel per dataset.
- **Fig. 3/7** (A-FRS vs FMF) and **Fig. 10** (Adam vs SGD): no Byzantine clients.
- **Fig. 4/8**: defences No defense, Krum, RFA, Trmean (parameter space) and
  A-RFRS (Krum on recovered gradients), gradient-ascent attack, α ∈ {0.2, 0.3,
  0.4}; panels: rows α, columns datasets.
- **Fig. 11/12** (momentum, AdaGrad): six panels in the paper, read as two
  datasets × three fractions; the datasets are Last.fm and ML100K.
- Rounds: the trainer's per-dataset default (``DEFAULT_ROUNDS``), every other
  hyperparameter at its default (the paper's appendix G values; init scale
  from ``TrainConfig``). Five trials (seeds 0–4).

Ablations (not figures of the paper; registered beside them so that
``rfrs-ref reproduce ablation-init`` runs one): Fig. 4's five series at
α = 0.4 on Last.fm and ML100K, 3 trials (seeds 0–2), with one change each:

- ``ablation-init``: θ̄⁰ ~ N(0, 1), the paper's stated initialisation, instead of N(0, 0.1²);
- ``ablation-sampled``: one sampled BPR negative per positive instead of exact BPR;
- ``ablation-krum1``: classic Krum (k = 1: the single best client) for Krum and A-RFRS;
- ``ablation-exact``: the server is told the number of Byzantine clients in each round
  (``assumed_byzantine = "exact"``) instead of assuming floor(α · n); where a round holds
  more than a rule tolerates, the rule runs with the largest f it allows (its
  ``fallback = "reduce-f"``; the paper's f = floor(α · n) never needs it);
- ``ablation-rounds``: three times the rounds of the other runs (the default rounds, or
  ``--rounds``); it also runs Fig. 10's two series (Adam and SGD, no attack) at three times
  the rounds, to tell whether Adam catches up with SGD given time. Its figure has a row
  per fraction (α = 0 holds Adam and SGD, α = 0.4 the five defences).

The ranking of the defences (``rfrs-ref reproduce ranking``, not a figure of the
paper either): every registered rule, with and without NNM, in both detection
spaces, under gradient ascent and the targeted A-ra attack, α ∈ {0.2, 0.4},
Adam, Last.fm and ML100K, 3 trials (:mod:`rfrs_ref.experiments.ranking`); its
"figure" is the Markdown ranking ``figures/ranking.md``.

A run whose rule cannot aggregate a round of its dataset (its precondition on the
round's n and f fails, the same in every round) is left out of a figure's runs and
listed by :meth:`Figure.left_out` (MDA and SMEA of the ranking on CiteULike; Krum at
α = 0.4 on the default synthetic dataset); the paper's datasets lose nothing.

``--quick`` (:class:`Scale` with ``quick=True``) reduces every figure the same
way: datasets → ML100K only, trials 5 → 2 (seeds 0, 1), rounds → a third of
the dataset's default rounds; fractions, series and every hyperparameter are
unchanged. Fig. 1 is the same in both (one run of 24 rounds).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import pathlib
from typing import Callable, Sequence

from rfrs_ref.experiments.spec import RunSpec, apply_fields
from rfrs_ref.federated.config import DEFAULT_ROUNDS, FALLBACK_ROUNDS, TrainConfig
from rfrs_ref.registry import Registry

#: the paper's datasets, in the paper's order
DATASETS = ("lastfm", "ml100k", "citeulike-a", "citeulike-t")
QUICK_DATASETS = ("ml100k",)
FRACTIONS = (0.2, 0.3, 0.4)
FULL_TRIALS = 5
QUICK_TRIALS = 2
#: quick runs train for DEFAULT_ROUNDS[dataset] // QUICK_ROUNDS_DIVISOR rounds
QUICK_ROUNDS_DIVISOR = 3

#: the paper's defence names (Fig. 4) -> preset of rfrs_ref.aggregate.PRESETS
DEFENSES = (("No defense", "no-defense"), ("Krum", "krum"), ("RFA", "rfa"), ("Trmean", "trmean"),
            ("A-RFRS", "a-rfrs"))

#: Fig. 1: round captured, clients per round and Byzantine clients among them
PCA_ROUND = 24
PCA_CLIENTS = 90
PCA_BYZANTINE = 32
PCA_DATASET = "ml100k"
#: Fig. 1's models: FMF as in the paper's caption, and FISM (the model of A-FRS) beside it
PCA_MODELS = (("fmf", "FMF, Adam"), ("fism", "FISM (A-FRS), Adam"))


@dataclasses.dataclass(frozen=True)
class Scale:
    """How big a reproduction is.

    Attributes:
        quick: the reduced version (see the module docstring).
        datasets: override the datasets (None: the figure's, reduced when quick).
        trials: override the number of trials (seeds 0..trials−1).
        rounds: override the rounds of every run (not Fig. 1's capture round).
        resilience: record the Definition 1–4 sums in every run.
        backend: kernel backend of every run.
        overrides: TrainConfig fields set in every run, after the figure's own
            (``preset`` allowed; ``*_params`` merged). Overriding a field the
            figure varies collapses its grid, which is reported as duplicate runs.
        fractions: override the Byzantine fractions α of a figure that varies them
            (None: the figure's own), in the order given, e.g. ``(0.4, 0.2)`` to have
            the larger fraction's runs first.
    """

    quick: bool = False
    datasets: tuple[str, ...] | None = None
    trials: int | None = None
    rounds: int | None = None
    resilience: bool = False
    backend: str = "numba"
    overrides: tuple[tuple[str, object], ...] = ()
    fractions: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.overrides, dict):
            object.__setattr__(self, "overrides", tuple(self.overrides.items()))
        if self.fractions is not None:
            fractions = tuple(dict.fromkeys(float(a) for a in self.fractions))
            if not fractions:
                raise ValueError("no Byzantine fraction given (fractions is empty)")
            bad = [a for a in fractions if not (math.isfinite(a) and 0.0 <= a < 1.0)]
            if bad:
                raise ValueError(f"a Byzantine fraction α must lie in [0, 1), got {bad[0]!r}")
            object.__setattr__(self, "fractions", fractions)

    def pick_datasets(self, full: Sequence[str]) -> tuple[str, ...]:
        if self.datasets:
            return tuple(self.datasets)
        if self.quick:
            return tuple(d for d in full if d in QUICK_DATASETS) or tuple(full[:1])
        return tuple(full)

    def pick_fractions(self, full: Sequence[float]) -> tuple[float, ...]:
        return tuple(self.fractions) if self.fractions else tuple(full)

    def seeds(self) -> list[int]:
        n = self.trials or (QUICK_TRIALS if self.quick else FULL_TRIALS)
        if n < 1:
            raise ValueError(f"trials must be at least 1, got {n}")
        return list(range(n))

    def rounds_for(self, dataset: str) -> int:
        if self.rounds is not None:
            return int(self.rounds)
        full = DEFAULT_ROUNDS.get(dataset, FALLBACK_ROUNDS)
        return max(1, full // QUICK_ROUNDS_DIVISOR) if self.quick else full

    def describe(self) -> str:
        """The scale in words, before the runs are built (see :func:`describe_runs`)."""
        ds = ", ".join(self.datasets) if self.datasets else ("ML100K" if self.quick else "all four")
        tr = self.trials or (QUICK_TRIALS if self.quick else FULL_TRIALS)
        rd = (f"{self.rounds} rounds" if self.rounds is not None else
              (f"each dataset's default rounds // {QUICK_ROUNDS_DIVISOR}" if self.quick
               else "each dataset's default rounds"))
        fr = f"; α = {', '.join(f'{a:g}' for a in self.fractions)}" if self.fractions else ""
        return f"datasets {ds}; {tr} trials; {rd}{fr}"


def describe_runs(runs) -> str:
    """What a list of runs actually is: how many, on which datasets, how many rounds,
    how many trials; e.g. ``2 runs: ml100k 24 rounds; 1 trial``."""
    per: dict[str, set] = {}
    for r in runs:
        c = r.config.resolved() if r.config.rounds is None else r.config
        per.setdefault(c.dataset, set()).add(int(c.rounds))
    trials = len({r.trial for r in runs})
    ds = ", ".join(f"{d} {'/'.join(str(x) for x in sorted(rs))} rounds" for d, rs in per.items())
    return (f"{len(runs)} run{'s' if len(runs) != 1 else ''}: {ds}; "
            f"{trials} trial{'s' if trials != 1 else ''}")


@dataclasses.dataclass(frozen=True)
class Figure:
    """One of the paper's figures.

    Attributes:
        id: the paper's figure number.
        name: short name (CLI alias).
        latex_label: the figure's ``\\label`` in the paper's source.
        title: one line.
        experiment: output folder name, shared by figures plotting the same runs.
        build: ``build(scale) -> [RunSpec]``; each run's ``labels["series"]`` is its series.
        kind: ``k`` (Metric@K panels), ``pca`` (Fig. 1).
        metric: ``precision`` or ``recall`` for ``k`` figures.
        rows, cols: panel layout (table columns), None for one.
        series: legend order.
        datasets: the datasets of the full figure.
        trials: trials of the full figure (None: FULL_TRIALS).
        fractions: the Byzantine fractions α the full figure compares (empty: it
            compares none, and a scale that names some is refused).
    """

    id: str
    name: str
    latex_label: str
    title: str
    experiment: str
    build: Callable[[Scale], list[RunSpec]]
    kind: str = "k"
    metric: str = "precision"
    rows: str | None = None
    cols: str | None = "dataset"
    series: tuple[str, ...] = ()
    datasets: tuple[str, ...] = DATASETS
    trials: int | None = None
    fractions: tuple[float, ...] = ()

    def runs(self, scale: Scale = Scale()) -> list[RunSpec]:
        """The figure's runs at ``scale``: those of its grid whose rule can aggregate a
        round of their dataset (see :meth:`left_out`)."""
        return self._grid(scale)[0]

    def left_out(self, scale: Scale = Scale()) -> list[tuple[RunSpec, Exception]]:
        """The runs of the figure's grid at ``scale`` that are not among its runs, each
        with the :class:`~rfrs_ref.aggregate.PreconditionError` its rule would raise
        before the first round: n (the clients of a round, from the dataset's size and
        the client fraction) and f (from the assumed fraction) are the same in every
        round, so such a run could never start (MDA's and SMEA's exact search over
        C(n, f) subsets on CiteULike, Krum at α = 0.4 with 6 clients a round). The
        figure is drawn without them (:func:`left_out_notes` says which)."""
        return self._grid(scale)[1]

    def _grid(self, scale: Scale) -> tuple[list[RunSpec], list[tuple[RunSpec, Exception]]]:
        from rfrs_ref.experiments.sweep import unmet_precondition

        kept, left = [], []
        seen: dict = {}  # the check depends on neither the seed nor the trial

        def unmet(config):
            marker = json.dumps({**config.to_json(), "seed": None}, sort_keys=True, default=repr)
            if marker not in seen:
                seen[marker] = unmet_precondition(config)
            return seen[marker]

        runs = self.build(self, self.scale(scale))
        # the same grid without the caller's overrides (--set): a run is left out only where
        # the figure's own grid cannot run it; one that an override makes impossible is
        # kept, and refused before anything is written like any impossible configuration
        own = (self.build(self, self.scale(dataclasses.replace(scale, overrides=())))
               if scale.overrides else runs)
        if len(own) != len(runs):  # not the same grid: judge the runs as they are
            own = runs
        for r, base in zip(runs, own):
            why = unmet(r.config)
            (kept.append(r) if why is None or unmet(base.config) is None else left.append((r, why)))
        return kept, left

    def scale(self, scale: Scale) -> Scale:
        """``scale`` with this figure's own number of trials where it sets none (not quick).

        Raises ValueError where ``scale`` names Byzantine fractions and the figure
        compares none (Figs. 1, 2, 3, 7 and 10 fix theirs)."""
        if scale.fractions and not self.fractions:
            raise ValueError(f"Fig. {self.id} ({self.name}) compares no Byzantine fractions, so "
                             f"--alphas does not apply to it; it applies to "
                             f"{', '.join(i for i, f in FIGURES.items() if f.fractions)}")
        if self.trials is not None and scale.trials is None and not scale.quick:
            return dataclasses.replace(scale, trials=self.trials)
        return scale

    def default_out(self, scale: "Scale | bool" = False) -> pathlib.Path:
        """``results/<experiment>``, with a suffix per way ``scale`` departs from the
        paper's runs (``-quick``, ``-20rounds``, ``-1trials``, ``-resilience``, the
        backend, ``-set`` for ``--set`` overrides): a reduced reproduction gets a
        directory of its own, rather than rewriting the tables of the full one, which
        hold the runs of one scale. The datasets do not count: a call restricted to some
        writes the same tables (:func:`whole_grid`). A bool is ``quick`` alone."""
        if isinstance(scale, bool):
            scale = Scale(quick=scale)
        parts = [self.experiment]
        if scale.quick:
            parts.append("quick")
        if scale.rounds is not None:
            parts.append(f"{scale.rounds}rounds")
        usual = QUICK_TRIALS if scale.quick else (self.trials or FULL_TRIALS)
        if scale.trials is not None and scale.trials != usual:
            parts.append(f"{scale.trials}trials")
        if scale.resilience:
            parts.append("resilience")
        if scale.backend != "numba":
            parts.append(scale.backend)
        if scale.overrides:
            parts.append("set")
        return pathlib.Path("results") / "-".join(parts)


def _config(scale: Scale, dataset: str, **fields):
    fields.setdefault("rounds", scale.rounds_for(dataset))
    merged = apply_fields({"dataset": dataset, "resilience": scale.resilience,
                           "backend": scale.backend}, fields, "figure: ")
    merged = apply_fields(merged, dict(scale.overrides), "override: ")
    return TrainConfig(**merged)


def _grid(scale: Scale, cases, *, kind: str = "train") -> list[RunSpec]:
    """Runs for ``cases`` = [(labels, dataset, fields)], one per seed."""
    runs = []
    for labels, dataset, fields in cases:
        for trial, seed in enumerate(scale.seeds()):
            runs.append(RunSpec(_config(scale, dataset, seed=seed, **fields), kind=kind,
                                trial=trial, labels=labels))
    return runs


# -- builders --------------------------------------------------------------------------------
def _build_pca(fig: Figure, scale: Scale) -> list[RunSpec]:
    from rfrs_ref.data import manifest

    dataset = (scale.datasets or (PCA_DATASET,))[0]
    if dataset == "synthetic":
        from rfrs_ref.data import DATASETS as REGISTRY

        params = dict(dict(scale.overrides).get("dataset_params") or {})
        n_users = REGISTRY.get("synthetic")(**params).n_users
    else:
        n_users = manifest(dataset).n_users
    if n_users < PCA_CLIENTS:
        raise ValueError(f"Fig. 1 samples {PCA_CLIENTS} clients per round, but {dataset} has "
                         f"only {n_users} clients")
    fraction = (PCA_CLIENTS + 0.5) / n_users
    if math.floor(fraction * n_users) != PCA_CLIENTS:  # pragma: no cover - arithmetic guard
        raise ValueError(f"client fraction {fraction} does not sample {PCA_CLIENTS} of {n_users}")
    runs = []
    # one seed unless trials are asked for explicitly (the verdict on Fig. 1 needs several);
    # the figure draws the first
    seeds = scale.seeds() if scale.trials is not None else scale.seeds()[:1]
    for model, label in PCA_MODELS:
        for trial, seed in enumerate(seeds):
            cfg = _config(scale, dataset, model=model, optimizer="adam", defense="none",
                          detect="gradient", attack="ascent",
                          byzantine_fraction=PCA_BYZANTINE / PCA_CLIENTS,
                          client_fraction=fraction, rounds=PCA_ROUND, seed=seed)
            runs.append(RunSpec(cfg, kind="capture", trial=trial, labels={"series": label}))
    return runs


def _series_builder(*series: tuple[str, dict]):
    """A figure whose series are fixed configuration changes, on each of its datasets."""
    def build(fig: Figure, scale: Scale) -> list[RunSpec]:
        return _grid(scale, [({"series": label}, d, dict(changes))
                             for d in scale.pick_datasets(fig.datasets)
                             for label, changes in series])
    return build


_build_camouflage = _series_builder(
    ("No attack", {"attack": "none", "byzantine_fraction": 0.0}),
    ("Camouflage attack (40%)", {"attack": "camouflage", "byzantine_fraction": 0.4}))
_build_frs = _series_builder(("A-FRS", {"model": "fism"}), ("FMF", {"model": "fmf"}))
ADAM_SGD = (("Adam", {"optimizer": "adam"}), ("SGD", {"optimizer": "sgd"}))
_build_adam_sgd = _series_builder(*ADAM_SGD)


def _defense_builder(optimizer: str, robust_name: str):
    def build(fig: Figure, scale: Scale) -> list[RunSpec]:
        cases = []
        for d in scale.pick_datasets(fig.datasets):
            for alpha in scale.pick_fractions(fig.fractions):
                for name, preset in DEFENSES:
                    label = robust_name if preset == "a-rfrs" else name
                    cases.append(({"series": label}, d,
                                  {"optimizer": optimizer, "attack": "ascent",
                                   "byzantine_fraction": alpha, "preset": preset}))
        return _grid(scale, cases)

    return build


#: the ablations of Fig. 4: (name, title, change applied to each run's fields)
ABLATION_FRACTION = 0.4
ABLATION_DATASETS = ("lastfm", "ml100k")
ABLATION_TRIALS = 3
ROUNDS_FACTOR = 3


def _krum1(fields: dict) -> dict:
    if fields["preset"] in ("krum", "a-rfrs"):
        return {**fields, "defense_params": {"k": 1}}
    return fields


def _exact(fields: dict) -> dict:
    # a round may sample more Byzantine clients than a rule tolerates (Krum: n > 2f + 2;
    # 4 of ML100K's 9 clients at α = 0.4): the rule then runs with the largest f it allows
    out = {**fields, "assumed_byzantine": "exact"}
    if fields["preset"] != "no-defense":
        out["defense_params"] = {"fallback": "reduce-f"}
    return out


ABLATIONS = (
    ("ablation-init", "initialisation N(0, 1)", lambda f: {**f, "init_scale": 1.0}),
    ("ablation-sampled", "one sampled BPR negative per positive",
     lambda f: {**f, "model_params": {"negatives": 1}}),
    ("ablation-krum1", "classic Krum (k = 1) for Krum and A-RFRS", _krum1),
    ("ablation-exact", "the server told the number of Byzantine clients of each round",
     _exact),
    ("ablation-rounds", f"{ROUNDS_FACTOR} times the rounds", None),
)


def _ablation_builder(change):
    def build(fig: Figure, scale: Scale) -> list[RunSpec]:
        cases = []
        for d in scale.pick_datasets(fig.datasets):
            for alpha, (name, preset) in itertools.product(scale.pick_fractions(fig.fractions),
                                                           DEFENSES):
                fields = {"optimizer": "adam", "attack": "ascent",
                          "byzantine_fraction": alpha, "preset": preset}
                if change is None:
                    fields["rounds"] = ROUNDS_FACTOR * scale.rounds_for(d)
                else:
                    fields = change(fields)
                cases.append(({"series": name}, d, fields))
            if change is None:
                # Fig. 10's runs, longer: does Adam catch up with SGD given time?
                cases.extend(({"series": name}, d,
                              {**changes, "rounds": ROUNDS_FACTOR * scale.rounds_for(d)})
                             for name, changes in ADAM_SGD)
        return _grid(scale, cases)

    return build


def _series(robust: str) -> tuple[str, ...]:
    return ("No defense", "Krum", "RFA", "Trmean", robust)


FIGURES: Registry[Figure] = Registry("figure")
for _fig in (
    Figure("1", "pca", "fig:visualization",
           "Fig. 1: model parameters vs gradients of 90 clients (PCA), FMF with Adam, round 24",
           "pca", _build_pca, kind="pca", datasets=(PCA_DATASET,)),
    Figure("2", "camouflage", "fig:camouflage_result",
           "Fig. 2 (right): camouflage attack (40% Byzantine) vs no attack, A-FRS",
           "camouflage", _build_camouflage, series=("No attack", "Camouflage attack (40%)")),
    Figure("3", "frs", "fig:performance1", "Fig. 3: Precision@K of A-FRS and FMF",
           "frs", _build_frs, series=("A-FRS", "FMF")),
    Figure("4", "defenses", "fig:performance2",
           "Fig. 4: Precision@K of the defences under gradient ascent (Adam)",
           "defenses", _defense_builder("adam", "A-RFRS"), rows="alpha", cols="dataset",
           series=_series("A-RFRS"), fractions=FRACTIONS),
    Figure("7", "frs-recall", "fig:recall_performance1", "Fig. 7: Recall@K of A-FRS and FMF",
           "frs", _build_frs, metric="recall", series=("A-FRS", "FMF")),
    Figure("8", "defenses-recall", "fig:recall_performance2",
           "Fig. 8: Recall@K of the defences under gradient ascent (Adam)",
           "defenses", _defense_builder("adam", "A-RFRS"), metric="recall", rows="alpha",
           cols="dataset", series=_series("A-RFRS"), fractions=FRACTIONS),
    Figure("10", "adam-sgd", "fig:adam_sgd", "Fig. 10: Precision@K of FRS based on Adam and SGD",
           "adam-sgd", _build_adam_sgd, series=("Adam", "SGD")),
    Figure("11", "momentum", "fig:momentum",
           "Fig. 11: Precision@K of the defences, SGD with momentum (S-RFRS)",
           "momentum", _defense_builder("momentum", "S-RFRS"), rows="dataset", cols="alpha",
           series=_series("S-RFRS"), datasets=("lastfm", "ml100k"), fractions=FRACTIONS),
    Figure("12", "adagrad", "fig:adagrad",
           "Fig. 12: Precision@K of the defences, AdaGrad (AG-RFRS)",
           "adagrad", _defense_builder("adagrad", "AG-RFRS"), rows="dataset", cols="alpha",
           series=_series("AG-RFRS"), datasets=("lastfm", "ml100k"), fractions=FRACTIONS),
    *(Figure(name, name, "", f"Ablation of Fig. 4 (α = {ABLATION_FRACTION}): {title}", name,
             _ablation_builder(change), cols="dataset", series=_series("A-RFRS"),
             datasets=ABLATION_DATASETS, trials=ABLATION_TRIALS, fractions=(ABLATION_FRACTION,))
      for name, title, change in ABLATIONS if change is not None),
    Figure("ablation-rounds", "ablation-rounds", "",
           f"Ablation of Fig. 4 (α = {ABLATION_FRACTION}) and Fig. 10 (α = 0): "
           f"{ROUNDS_FACTOR} times the rounds", "ablation-rounds", _ablation_builder(None),
           rows="alpha", cols="dataset",
           series=(*_series("A-RFRS"), *(name for name, _ in ADAM_SGD)),
           datasets=ABLATION_DATASETS, trials=ABLATION_TRIALS, fractions=(ABLATION_FRACTION,)),
):
    FIGURES.register(_fig.id, _fig)


def figure(name: str) -> Figure:
    """A figure by number, short name or LaTeX label (``4``, ``defenses``, ``fig:performance2``)."""
    name = str(name).strip()
    if name.lower().startswith("fig") and not name.startswith("fig:"):
        name = name.lower().removeprefix("figure").removeprefix("fig").strip(". ")
    if name in FIGURES:
        return FIGURES.get(name)
    for _, f in FIGURES.items():
        if name in (f.name, f.latex_label) and name:
            return f
    choices = ", ".join(f"{i} ({f.name})" for i, f in FIGURES.items())
    raise KeyError(f"unknown figure {name!r}; choose one of: {choices}")


# -- plotting a figure -------------------------------------------------------------------------
def plot_figure(fig: Figure, table, base: pathlib.Path, out: pathlib.Path,
                notes: list[str] | None = None) -> list[pathlib.Path]:
    """Draw ``fig`` from a results table whose run directories are under ``base``.

    Writes ``fig<id>.png/.pdf`` (the paper's panels), ``fig<id>_curves.png/.pdf``
    (training curves) and, when the runs recorded them, ``fig<id>_resilience``. A file of
    one of these names that is not a figure this package drew is a ValueError, before any
    is written (:func:`rfrs_ref.experiments.plots.refuse_foreign`).
    ``notes``, when given, receives one line per panel whose lines are drawn over
    fewer runs than the table holds (diverged runs, a metric not recorded), as its
    title says. A finished run whose record cannot be read is a ValueError naming
    the file.
    """
    import json

    from rfrs_ref.experiments import plots
    from rfrs_ref.experiments.results import run_path

    out = pathlib.Path(out)
    base = pathlib.Path(base)
    name = f"fig{fig.id}" if fig.id.isdigit() else fig.id  # ablations: ablation-init.png
    stem = out / name
    if fig.kind == "ranking":
        from rfrs_ref.experiments.ranking import write_ranking

        return [write_ranking(table, out)]
    resilience = fig.kind != "pca" and plots.has_resilience(table, base)
    # every file the figure writes is refused before any is drawn when one of them is not
    # a figure drawn here (a user's fig4_curves.png must not leave a new fig4.png beside it)
    plots.refuse_foreign(figure_files(fig, out, resilience))
    if fig.kind == "pca":
        runs = table[(table["status"] == "ok") & (table["kind"] == "capture")]
        if runs.empty:
            raise ValueError("no finished capture run in the table (Fig. 1 needs one)")
        runs = runs.drop_duplicates("key")
        runs = runs[runs["seed"] == runs["seed"].min()]
        if "init_scale" in runs.columns:
            runs = runs[runs["init_scale"] == runs["init_scale"].min()]
        order = [label for _, label in PCA_MODELS]
        runs = runs.assign(_o=[order.index(x) if x in order else len(order)
                               for x in runs.get("label_series", runs["method"])]).sort_values("_o")
        panels = []
        for _, r in runs.iterrows():
            capture = _capture(run_path(base, r["run_dir"]))
            label = r["label_series"] if "label_series" in runs.columns else r["model"]
            panels.append((f"{plots.DATASET_NAMES.get(r['dataset'], r['dataset'])}, {label}",
                           capture))
        title = f"Round {panels[0][1]['round']}, gradient-ascent Byzantine clients, no defence"
        return plots.plot_pca(panels, stem, title=title)
    # the curves read every finished run's record: a damaged one is refused before the
    # panels are drawn, so a refused figure leaves no part of itself behind
    plots.check_curve_records(table, base, metric=fig.metric)
    paths = plots.plot_k_panels(table, stem, metric=fig.metric, rows=fig.rows, cols=fig.cols,
                                series_order=fig.series, dataset_order=DATASETS,
                                title=fig.title, notes=notes)
    paths += plots.plot_curves(table, base, out / f"{name}_curves", metric=fig.metric,
                               rows=fig.rows, cols=fig.cols, series_order=fig.series,
                               dataset_order=DATASETS, title=f"{fig.title}: training curves",
                               notes=notes)
    if resilience:
        panels = [p for p in (fig.rows, fig.cols) if p]
        paths += plots.plot_resilience(table, base, out / f"{name}_resilience",
                                       panels=panels, series_order=fig.series,
                                       title=f"{fig.title}: resilience sums", notes=notes)
    return paths


def _capture(run_dir: pathlib.Path) -> dict:
    """The ``capture`` record of a finished capture run's record in ``run_dir`` (its
    outcome.json, or outcome.json.gz), checked
    for what Fig. 1 draws: ``byzantine``, one boolean per captured client; ``theta_pca`` and
    ``gradient_pca``, one pair of finite coordinates per client (matplotlib leaves a NaN
    or ±inf point out without a word); ``theta_explained`` and ``gradient_explained``,
    two finite shares of variance; and the separations ``theta`` and ``gradient``, finite
    numbers where recorded (verdict --claim pca refuses the same run).

    Raises:
        ValueError: naming the file and the first field that is not of this form.
    """
    from rfrs_ref.experiments.results import record_bytes, the_record
    from rfrs_ref.untrusted import parse_json

    path = the_record(run_dir)
    try:
        o = parse_json(record_bytes(path), str(path))
    except (OSError, ValueError) as exc:  # not JSON, or one key twice in an object
        reason = str(exc).split("\n")[0].removeprefix(f"{path}: ")
        raise ValueError(f"{path}: not a readable run record ({reason})") from None
    capture = o.get("capture") if isinstance(o, dict) else None
    if not isinstance(capture, dict):
        raise ValueError(f"{path}: a finished capture run without its capture record")

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    byz = capture.get("byzantine")
    if not isinstance(byz, list) or not byz or not all(isinstance(b, bool) for b in byz):
        raise ValueError(f"{path}: capture.byzantine is not a list of booleans, one per client")
    for key in ("theta_pca", "gradient_pca"):
        xy = capture.get(key)
        if not (isinstance(xy, list) and len(xy) == len(byz)
                and all(isinstance(p, list) and len(p) == 2 and all(map(number, p))
                        for p in xy)):
            raise ValueError(f"{path}: capture.{key} is not {len(byz)} pairs of finite "
                             "coordinates (one per client of capture.byzantine)")
    for key in ("theta_explained", "gradient_explained"):
        ev = capture.get(key)
        if not (isinstance(ev, list) and len(ev) == 2 and all(map(number, ev))):
            raise ValueError(f"{path}: capture.{key} is {ev!r}, not two finite shares of "
                             "variance")
    sep = capture.get("separation") or {}
    if not isinstance(sep, dict):
        raise ValueError(f"{path}: capture.separation is not an object")
    for key in ("theta", "gradient"):
        if sep.get(key) is not None and not number(sep[key]):
            raise ValueError(f"{path}: capture.separation.{key} = {sep[key]!r} is not a "
                             "finite number (a finished capture run records it as one)")
    return capture


def left_out_notes(left: Sequence[tuple[RunSpec, Exception]]) -> list[str]:
    """One line per dataset, fraction and series of :meth:`Figure.left_out`'s runs: how
    many were left out and the precondition their rule misses."""
    groups: dict = {}
    for r, why in left:
        c = r.config
        key = (c.dataset, c.byzantine_fraction, r.labels.get("series", c.defense))
        groups.setdefault(key, [0, why])[0] += 1
    lines = []
    for (dataset, alpha, series), (count, why) in groups.items():
        reason = (f"{why.rule} needs {why.condition}, but n={why.n} and f={why.f}"
                  if hasattr(why, "condition") else str(why))
        lines.append(f"left out on {dataset} at α = {alpha:g}: {series} ({count} "
                     f"run{'s' if count != 1 else ''}; {reason}, in every round)")
    return lines


def figure_files(fig: Figure, out: pathlib.Path, resilience: bool = True) -> list[pathlib.Path]:
    """The files :func:`plot_figure` writes into ``out`` for ``fig`` (the resilience sums'
    figure with ``resilience``; the ranking's ``ranking.md`` aside)."""
    from rfrs_ref.experiments import plots

    out = pathlib.Path(out)
    name = f"fig{fig.id}" if fig.id.isdigit() else fig.id
    if fig.kind == "ranking":
        return []
    stems = [out / name] if fig.kind == "pca" else [
        out / name, out / f"{name}_curves", *([out / f"{name}_resilience"] if resilience else [])]
    return [p for s in stems for p in plots.figure_files(s)]


def refuse_foreign_figures(out: pathlib.Path, files: Sequence[pathlib.Path]) -> None:
    """Before a sweep runs into ``out``: a directory that is not yet a results directory
    (:func:`rfrs_ref.experiments.results.is_store`) gets the tables, and then its
    ``figures/`` folder is the results directory's to redraw; so a figure of a name the call
    draws that is already in ``out/figures`` and was not drawn by this package (a user's
    own ``figures/fig4.png``) is refused now, before anything runs (ValueError)."""
    from rfrs_ref.experiments import plots
    from rfrs_ref.experiments.results import is_store

    if not is_store(out):
        plots.refuse_foreign(files)


def whole_grid(fig: Figure, scale: Scale) -> list[RunSpec]:
    """``fig``'s runs at ``scale`` on every dataset and Byzantine fraction of the full
    figure and every one asked for, and for as many trials as the figure's own at that
    scale or as asked, whichever is more, in the figure's order: what its tables hold,
    whichever datasets, fractions and trials a call runs.

    A call restricted to some datasets (``--datasets lastfm``), fractions
    (``--alphas 0.4``) or fewer trials (``--datasets citeulike-a --trials 2`` into the
    directory of five) thus leaves the runs already recorded for the others in the
    directory's tables and figures, and two calls that differ only in these write the
    same tables. (The tables list recorded runs only: the grid's other runs add no row.)
    """
    datasets = tuple(dict.fromkeys([*fig.datasets, *(scale.datasets or ())]))
    fractions = (tuple(dict.fromkeys([*fig.fractions, *(scale.fractions or ())]))
                 if fig.fractions else None)
    own = len(fig.scale(dataclasses.replace(scale, trials=None)).seeds())
    trials = max(own, len(fig.scale(scale).seeds()))
    return fig.runs(dataclasses.replace(scale, datasets=datasets, fractions=fractions,
                                        trials=trials))


def reproduce(fig: Figure, scale: Scale = Scale(), out: str | pathlib.Path | None = None,
              *, plot: bool = True, **sweep_kwargs):
    """Run ``fig``'s sweep (skipping finished runs), write its tables and draw it.

    Returns ``(report, paths)``: the :class:`~rfrs_ref.experiments.sweep.SweepReport`
    and the figure files (``out/figures/``). ``sweep_kwargs`` go to
    :func:`~rfrs_ref.experiments.sweep.run_sweep` (scheduler, workers, on_event...).
    """
    from rfrs_ref.experiments.sweep import run_sweep

    out = pathlib.Path(out) if out is not None else fig.default_out(scale)
    runs = sweep_kwargs.pop("runs", None) or fig.runs(scale)
    if plot:
        refuse_foreign_figures(out, figure_files(fig, out / "figures"))
    report = run_sweep(runs, out, label_columns=("label_series",),
                       table_runs=whole_grid(fig, scale), **sweep_kwargs)
    paths: list[pathlib.Path] = []
    if plot and report.table is not None and (report.table["status"] == "ok").any():
        paths = plot_figure(fig, report.table, out, out / "figures")
    return report, paths


# -- the ranking of the defences (not a figure of the paper) --------------------------------------
def _build_ranking(fig: Figure, scale: Scale) -> list[RunSpec]:
    from rfrs_ref.experiments import ranking

    return _grid(scale, ranking.cases(scale.pick_datasets(fig.datasets),
                                      fractions=scale.pick_fractions(fig.fractions)))


def _register_ranking() -> None:
    from rfrs_ref.experiments import ranking

    FIGURES.register(ranking.NAME, Figure(
        ranking.NAME, ranking.NAME, "",
        "The defences ranked by Precision@5: every rule, with and without NNM, both detection "
        "spaces, gradient ascent and A-ra (Adam)", ranking.NAME, _build_ranking, kind="ranking",
        datasets=ranking.DATASETS, trials=ranking.TRIALS, fractions=ranking.FRACTIONS))


_register_ranking()
