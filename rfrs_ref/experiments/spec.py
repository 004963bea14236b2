"""Runs of a sweep: what one run is, its key, and grids of runs (TOML sweep files).

A :class:`RunSpec` is one training run of a sweep: a :class:`TrainConfig`,
the run's kind (``train``: an ordinary run; ``capture``: a run that also keeps
the uploads and recovered gradients of its last round, for the PCA of Fig. 1),
its trial number and display labels.

The run key
-----------
A run is identified by ``run_key(spec)``: the first 16 hex digits of the
sha256 of the canonical JSON (sorted keys, no spaces) of

    {"kind": kind, "config": TrainConfig.resolved().to_json() minus NON_RESULT_FIELDS}

so two runs with the same key compute the same numbers, and a sweep that is
run again skips every run whose key already has a finished result.
``NON_RESULT_FIELDS`` are the fields that cannot change what a run computes:
``data_dir`` (where the files are, not what they hold: the loader verifies
the datasets' checksums) and ``checkpoint_every`` (a resumed run ends exactly
where the uninterrupted one ends). Everything else is part of the key, the
backend included: the fast kernels agree with the NumPy oracle to rounding,
not bit for bit, and a sweep may compare backends. Labels and the trial
number are not part of the key (the seed is); the package version is recorded
beside each result but is not part of the key either, so after changing the
code, use a fresh output directory.

Sweep files (TOML)
------------------
::

    name = "defenses-ml100k"        # optional, used in messages and file names
    trials = 3                      # seeds 0, 1, 2 (or: seeds = [0, 7, 11])

    [base]                          # any TrainConfig field; omitted fields take defaults
    dataset = "ml100k"
    rounds = 200
    attack = "ascent"
    optimizer_params = { lr = 0.001 }

    [axes]                          # crossed with each other (Cartesian product)
    byzantine_fraction = [0.2, 0.3, 0.4]
    method = [                      # an axis that is not a field: tables merged into the config
        { label = "A-RFRS", preset = "a-rfrs" },
        { label = "Krum", preset = "krum" },
        { label = "Krum-1", defense = "krum", detect = "gradient", defense_params = { k = 1 } },
    ]
    # the paper's five defences, more simply:
    # preset = ["no-defense", "krum", "rfa", "trmean", "a-rfrs"]

- An axis named after a ``TrainConfig`` field takes a list of values of that
  field. ``preset`` is a pseudo-field: a name of ``rfrs_ref.aggregate.PRESETS``
  (``no-defense``, ``krum``, ``rfa``, ``trmean``, ``a-rfrs``) that sets
  ``defense`` and ``detect``; it is allowed in ``[base]`` too.
- Any other axis name takes a list of tables; each table is merged into the
  configuration (``*_params`` tables are merged key by key), and its optional
  ``label`` becomes the run's label for that axis (a column of the results
  table named after the axis).
- ``kind = "capture"`` (top level) makes every run a capture run.
- Runs are ordered as the axes are written, the last axis varying fastest,
  trials innermost. Two runs of a sweep with the same key are an error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import pathlib
import tomllib
from typing import Any, Iterable, Mapping, Sequence

from rfrs_ref.federated.config import TrainConfig

KINDS = ("train", "capture")

#: TrainConfig fields that do not change what a run computes (not in the key).
NON_RESULT_FIELDS = ("data_dir", "checkpoint_every")

#: the fields of TrainConfig, in declaration order
CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig))

#: fields whose value is a table of hyperparameters, merged key by key
PARAM_FIELDS = ("dataset_params", "model_params", "optimizer_params", "defense_params",
                "attack_params")

KEY_LENGTH = 16


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of a sweep.

    Attributes:
        config: the run's configuration (need not be resolved; the key resolves it).
        kind: ``train`` or ``capture`` (keep the last round's uploads for the PCA).
        trial: trial number within its group (0-based); the seed is ``config.seed``.
        labels: display labels (axis name -> label), not part of the key.
    """

    config: TrainConfig
    kind: str = "train"
    trial: int = 0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"run kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        object.__setattr__(self, "labels", dict(self.labels))

    @property
    def key(self) -> str:
        return run_key(self)

    def to_json(self) -> dict:
        return {"kind": self.kind, "trial": self.trial, "labels": dict(self.labels),
                "config": self.config.to_json()}

    @classmethod
    def from_json(cls, d: Mapping) -> "RunSpec":
        return cls(config=TrainConfig.from_json(d["config"]), kind=d.get("kind", "train"),
                   trial=int(d.get("trial", 0)), labels=d.get("labels") or {})


def key_payload(spec: RunSpec) -> dict:
    """What the key hashes: the kind and the resolved configuration minus NON_RESULT_FIELDS."""
    cfg = spec.config.resolved().to_json()
    for name in NON_RESULT_FIELDS:
        cfg.pop(name, None)
    return {"kind": spec.kind, "config": cfg}


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def run_key(spec: RunSpec) -> str:
    """The run's key: 16 hex digits of sha256(canonical JSON of :func:`key_payload`)."""
    digest = hashlib.sha256(canonical_json(key_payload(spec)).encode("utf-8")).hexdigest()
    return digest[:KEY_LENGTH]


def check_unique(runs: Sequence[RunSpec]) -> list[str]:
    """The runs' keys; ValueError naming the clashing runs if two runs share a key."""
    keys, seen = [], {}
    for i, spec in enumerate(runs):
        k = spec.key
        if k in seen:
            j = seen[k]
            raise ValueError(
                f"runs {j} and {i} of the sweep have the same key {k}: they compute the same "
                f"thing (labels {dict(runs[j].labels)} and {dict(spec.labels)}, seed "
                f"{spec.config.seed}); the fields {', '.join(NON_RESULT_FIELDS)} are not part of "
                "a run's identity, so an axis over them gives duplicates")
        seen[k] = i
        keys.append(k)
    return keys


# -- building configurations ------------------------------------------------------------
def apply_fields(base: Mapping[str, Any], fields: Mapping[str, Any], where: str = "") -> dict:
    """``base`` (a dict of TrainConfig fields) updated with ``fields``.

    ``preset`` sets ``defense`` and ``detect``; ``*_params`` tables are merged
    key by key; ``ks`` becomes a tuple; unknown names are an error naming
    ``where``.
    """
    from rfrs_ref.aggregate import PRESETS

    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for name, value in fields.items():
        if name == "preset":
            if value not in PRESETS:
                raise ValueError(f"{where}preset {value!r} is not one of {', '.join(PRESETS)}")
            rule, detect = PRESETS[value]
            out["defense"] = "none" if rule == "mean" else rule
            out["detect"] = detect
        elif name in PARAM_FIELDS:
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}{name} must be a table of hyperparameters, got {value!r}")
            out[name] = {**out.get(name, {}), **value}
        elif name == "ks":
            out["ks"] = tuple(int(k) for k in value)
        elif name in CONFIG_FIELDS:
            out[name] = value
        else:
            raise ValueError(f"{where}{name!r} is not a configuration field; fields are: "
                             f"preset, {', '.join(CONFIG_FIELDS)}")
    return out


def make_config(fields: Mapping[str, Any], where: str = "") -> TrainConfig:
    """A TrainConfig from a dict of fields (``preset`` allowed)."""
    return TrainConfig(**apply_fields({}, fields, where))


@dataclasses.dataclass(frozen=True)
class Axis:
    """A sweep axis: a name and its values.

    A value is either a plain value of the field ``name`` (``label`` is its
    string form) or a dict of fields merged into the configuration (``label``
    from its ``label`` entry, else a compact rendering of the dict).
    """

    name: str
    values: tuple

    def cases(self) -> list[tuple[str, dict]]:
        out = []
        is_field = self.name in CONFIG_FIELDS or self.name == "preset"
        for v in self.values:
            if isinstance(v, Mapping) and not (is_field and self.name in PARAM_FIELDS):
                v = dict(v)
                label = str(v.pop("label", _render(v)))
                out.append((label, v))
            elif is_field:
                out.append((_render_value(v), {self.name: v}))
            else:
                raise ValueError(f"axis {self.name!r} is not a configuration field, so its values "
                                 f"must be tables of fields; got {v!r}")
        return out


def _render_value(v) -> str:
    if isinstance(v, Mapping):
        return _render(v)
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v))
    return str(v)


def _render(d: Mapping) -> str:
    return " ".join(f"{k}={_render_value(v)}" for k, v in d.items())


def expand(base: Mapping[str, Any], axes: Sequence[Axis] = (), *, seeds: Sequence[int] = (0,),
           kind: str = "train", labels: Mapping[str, str] | None = None) -> list[RunSpec]:
    """Every combination of the axes' values applied to ``base``, for each seed.

    Args:
        base: TrainConfig fields (``preset`` allowed) shared by every run.
        axes: crossed in order, the last varying fastest.
        seeds: the trials' seeds, innermost; trial i gets ``seeds[i]``.
        kind: the runs' kind.
        labels: extra labels given to every run.
    Returns:
        The runs (configurations are not resolved; ``check_unique`` resolves them).
    """
    base_fields = apply_fields({}, base, "base: ")
    runs = []
    per_axis = [a.cases() for a in axes]
    for combo in itertools.product(*per_axis):
        fields = dict(base_fields)
        lab = dict(labels or {})
        for axis, (label, values) in zip(axes, combo):
            fields = apply_fields(fields, values, f"axis {axis.name}: ")
            lab[axis.name] = label
        for trial, seed in enumerate(seeds):
            cfg = TrainConfig(**{**fields, "seed": int(seed)})
            runs.append(RunSpec(cfg, kind=kind, trial=trial, labels=lab))
    return runs


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A named list of runs."""

    name: str
    runs: tuple[RunSpec, ...]

    def __len__(self) -> int:
        return len(self.runs)


def parse_sweep(doc: Mapping[str, Any], name: str = "sweep") -> Sweep:
    """A :class:`Sweep` from a parsed sweep document (the TOML format of the module docstring)."""
    known = {"name", "trials", "seeds", "base", "axes", "kind"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ValueError(f"unknown top-level key(s) {unknown} in the sweep; known: {sorted(known)}")
    name = str(doc.get("name", name))
    if "trials" in doc and "seeds" in doc:
        raise ValueError("give either trials = N or seeds = [...], not both")
    if "seeds" in doc:
        seeds = [int(s) for s in doc["seeds"]]
        if not seeds or any(s < 0 for s in seeds):
            raise ValueError("seeds must be a non-empty list of non-negative integers, "
                             f"got {doc['seeds']}")
    else:
        trials = doc.get("trials", None)
        if trials is None:
            seeds = [int(doc.get("base", {}).get("seed", 0))]
        else:
            if not isinstance(trials, int) or trials < 1:
                raise ValueError(f"trials must be a positive integer, got {trials!r}")
            seeds = list(range(trials))
    base = dict(doc.get("base", {}))
    base.pop("seed", None)
    axes_doc = doc.get("axes", {})
    axes = []
    for axis_name, values in axes_doc.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"axis {axis_name!r} must be a non-empty list, got {values!r}")
        if axis_name == "seed":
            raise ValueError("use trials = N or seeds = [...] rather than an axis over seed")
        axes.append(Axis(axis_name, tuple(values)))
    runs = expand(base, axes, seeds=seeds, kind=doc.get("kind", "train"))
    return Sweep(name, tuple(runs))


def load_sweep(path: str | pathlib.Path) -> Sweep:
    """Read a sweep file (TOML, see the module docstring)."""
    path = pathlib.Path(path)
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    try:
        return parse_sweep(doc, name=path.stem)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def runs_from(items: Iterable[RunSpec | TrainConfig]) -> list[RunSpec]:
    """RunSpecs from RunSpecs or bare TrainConfigs (trial 0, no labels)."""
    return [x if isinstance(x, RunSpec) else RunSpec(x) for x in items]
