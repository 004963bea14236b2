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
- ``pre`` is a list of pre-aggregator names run in front of the rule
  (``{ label = "NNM-Krum", pre = ["nnm"], defense = "krum" }``), their
  hyperparameters in ``pre_params``.
- ``kind = "capture"`` (top level) makes every run a capture run.
- Runs are ordered as the axes are written, the last axis varying fastest,
  trials innermost. Two runs of a sweep with the same key are an error, and so
  are two values of one axis with the same label (the tables and figures tell
  the runs apart by their labels) and more than ``MAX_RUNS`` runs.

A sweep file is hostile input. Before any run is built, every key is checked
(unknown keys are errors naming the closest known one) and every value against
the field it sets (``grid.toml: base.rounds must be a positive integer, got
"ten"``; see :func:`check_field` and :func:`check_params`); ``name`` must be
a plain folder name and ``data_dir`` a relative path inside the file's folder
(:func:`check_name`, :func:`confine`), so nothing read from the file leads out
of its folder. The file must be a regular file (a FIFO or a device is refused unread) and
nest tables and arrays at most ``MAX_DEPTH`` deep. See docs/reproduction.md, "Failure
behaviour".
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import json
import math
import numbers
import os
import pathlib
import re
import tomllib
import unicodedata
from typing import Any, Callable, Iterable, Mapping, Sequence

from rfrs_ref.federated.config import TrainConfig

KINDS = ("train", "capture")

#: TrainConfig fields that do not change what a run computes (not in the key).
NON_RESULT_FIELDS = ("data_dir", "checkpoint_every")

#: the fields of TrainConfig, in declaration order
CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig))

#: fields whose value is a table of hyperparameters, merged key by key
PARAM_FIELDS = ("dataset_params", "model_params", "optimizer_params", "defense_params",
                "attack_params", "pre_params")

KEY_LENGTH = 16

#: the most runs one sweep may hold (trials × the product of the axes' lengths); counted
#: before any run is built, so that ``trials = 9223372036854775807`` is one line, not a
#: MemoryError
MAX_RUNS = 100_000

#: the deepest nesting of tables and arrays a sweep file may hold (a sweep needs five: the
#: file, [axes], an axis, its table, a ``*_params`` table): deeper, it is refused in one line
#: before anything renders or walks it recursively
MAX_DEPTH = 32


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control character (a newline, tab, NUL...) or a line or
    paragraph separator: what would break a row of the tables that show it."""
    return any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in text)


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
        for name, label in self.labels.items():
            for what, text in (("label name", name), (f"label {name}", label)):
                if isinstance(text, str) and has_control(text):
                    raise ValueError(f"{what} of a run must not hold a control character (a "
                                     f"label is a cell of the tables' rows), got {_show(text)}")

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


# -- checking values read from a file ---------------------------------------------------
def _show(value: Any) -> str:
    """A value as a message shows it: JSON where possible (``"ten"``, ``[1, 2]``), else repr."""
    try:
        text = json.dumps(value, allow_nan=True, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _suggest(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(name), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _field_hint(name: str, axis: bool = False, override: bool = False) -> str:
    """What to write instead of ``name``, which is no configuration field: the ``*_params``
    table when it is a hyperparameter of some entry (``lr`` of the optimisers; ``axis``: as
    an axis of such tables; ``override``: as ``--set`` takes it), else the closest field
    name, if any."""
    from rfrs_ref.aggregate import PRE, RULES
    from rfrs_ref.attack import ATTACKS
    from rfrs_ref.data import DATASETS
    from rfrs_ref.model import MODELS
    from rfrs_ref.optim import OPTIMIZERS
    from rfrs_ref.params import hyperparameters

    for field, registry in (("optimizer_params", OPTIMIZERS), ("model_params", MODELS),
                            ("defense_params", RULES), ("attack_params", ATTACKS),
                            ("pre_params", PRE), ("dataset_params", DATASETS)):
        owners = [n for n in registry.names()
                  if any(h.name == name for h in hyperparameters(registry.get(n)))]
        if owners:
            table = f"{{ {name} = ... }}"
            example = f"[{table}, {table}]" if axis else table
            if override:  # --set FIELD=VALUE, the value in JSON
                return (f" ({name!r} is a hyperparameter of {', '.join(owners)}: set it in "
                        f"{field}, e.g. --set '{field}={{\"{name}\": ...}}')")
            return (f" ({name!r} is a hyperparameter of {', '.join(owners)}: set it in "
                    f"{field}, e.g. {field} = {example})")
    return _suggest(name, ("preset", *CONFIG_FIELDS))


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _positive_int(v: Any) -> str | None:
    return None if _is_int(v) and v >= 1 else "a positive integer"


def _non_negative_int(v: Any) -> str | None:
    return None if _is_int(v) and v >= 0 else "a non-negative integer"


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _text(v: Any) -> str | None:
    return None if isinstance(v, str) else "a string"


def _fraction(lo: float, hi: float, lo_open: bool, hi_open: bool) -> Callable[[Any], str | None]:
    lb, rb = "(" if lo_open else "[", ")" if hi_open else "]"
    want = f"a number in {lb}{lo:g}, {hi:g}{rb}"

    def check(v: Any) -> str | None:
        if not _is_number(v) or not math.isfinite(v):
            return want
        if (v <= lo if lo_open else v < lo) or (v >= hi if hi_open else v > hi):
            return want
        return None

    return check


def _assumed_byzantine(v: Any) -> str | None:
    if v == "exact":
        return None
    return None if _fraction(0.0, 1.0, False, True)(v) is None else (
        "a number in [0, 1) or \"exact\" (each round's true count)")


def _pre_names(v: Any) -> str | None:
    from rfrs_ref.aggregate import PRE

    names = PRE.names()
    ok = isinstance(v, (list, tuple)) and all(isinstance(p, str) and p in names for p in v)
    return None if ok else f"a list of pre-aggregator names (each one of {', '.join(names)})"


def _non_negative_number(v: Any) -> str | None:
    ok = _is_number(v) and math.isfinite(v) and v >= 0
    return None if ok else "a finite non-negative number"


def _non_finite_at(v: Any, path: str = "") -> tuple[str, float] | None:
    """(key path, value) of the first NaN or ±inf in ``v`` (nested tables and lists), or None."""
    if isinstance(v, float) and not math.isfinite(v):
        return path, v
    items = (v.items() if isinstance(v, Mapping)
             else enumerate(v) if isinstance(v, (list, tuple)) else ())
    for k, x in items:
        bad = _non_finite_at(x, f"{path}.{k}" if path else str(k))
        if bad is not None:
            return bad
    return None


def _table(v: Any) -> str | None:
    return None if isinstance(v, Mapping) else "a table of hyperparameters (e.g. { lr = 0.01 })"


def _ks(v: Any) -> str | None:
    ok = isinstance(v, (list, tuple)) and len(v) > 0 and all(_is_int(k) and k >= 1 for k in v)
    return None if ok else "a non-empty list of positive integers (e.g. [1, 5])"


def _choices() -> dict[str, Sequence[str]]:
    """The names each name-valued field accepts (read from the registries, so new entries count)."""
    from rfrs_ref.aggregate import RULES
    from rfrs_ref.attack import ATTACKS
    from rfrs_ref.data import DATASETS
    from rfrs_ref.federated.round import DETECT_SPACES
    from rfrs_ref.model import MODELS
    from rfrs_ref.optim import OPTIMIZERS

    return {"dataset": DATASETS.names(), "model": MODELS.names(),
            "optimizer": OPTIMIZERS.names(), "defense": ["none", *RULES.names()],
            "attack": ATTACKS.names(), "detect": list(DETECT_SPACES),
            "dtype": ["float32", "float64"], "backend": ["numpy", "numba", "cuda"]}


#: what each TrainConfig field accepts in a sweep file or an override: a check returning None
#: when the value is acceptable, else what was expected
_FIELD_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "data_dir": _text,
    "test_fraction": _fraction(0.0, 1.0, False, True),
    "valid_fraction": _fraction(0.0, 1.0, False, True),
    "byzantine_fraction": _fraction(0.0, 1.0, False, True),
    "assumed_byzantine": _assumed_byzantine,
    "rounds": _positive_int,
    "client_fraction": _fraction(0.0, 1.0, True, False),
    "init_scale": _non_negative_number,
    "seed": _non_negative_int,
    "eval_every": _positive_int,
    "ks": _ks,
    "verify": _boolean,
    "resilience": _boolean,
    "checkpoint_every": _positive_int,
    "trace": _boolean,
    "pre": _pre_names,
    **{name: _table for name in PARAM_FIELDS},
}


#: fields whose default None means "work it out" (rounds from the dataset...)
_NONE_MEANS_DEFAULT = frozenset(f.name for f in dataclasses.fields(TrainConfig)
                                if f.default is None)


def check_field(name: str, value: Any, where: str = "", label: str | None = None) -> None:
    """ValueError ``<label> must be <what>, got <value>`` unless ``value`` suits the
    TrainConfig field ``name`` (type, range, and for names the registry's choices);
    ``label`` defaults to ``<where><name>``."""
    label = label or f"{where}{name}"
    if value is None and name in _NONE_MEANS_DEFAULT:
        return  # JSON null (from --set) asks for the default; TOML has no null
    choices = _choices()
    if name in choices:
        if not isinstance(value, str):
            raise ValueError(f"{label} must be one of {', '.join(choices[name])}, "
                             f"got {_show(value)}")
        if value not in choices[name]:
            raise ValueError(f"{label} must be one of {', '.join(choices[name])}, got "
                             f"{_show(value)}{_suggest(value, choices[name])}")
        return
    check = _FIELD_CHECKS.get(name)
    want = check(value) if check is not None else None
    if want is not None:
        raise ValueError(f"{label} must be {want}, got {_show(value)}")
    if name in PARAM_FIELDS:
        # a run's key and records are strict JSON, which has no NaN or infinity: such a
        # value (TOML's nan and inf, JSON's NaN and 1e400 from --set) configures no run,
        # whatever the hyperparameter (one the entry does not take is named later)
        bad = _non_finite_at(value)
        if bad is not None:
            raise ValueError(f"{label}.{bad[0]} must be a finite number, got {_show(bad[1])}")


def _param_owner(field: str, fields: Mapping[str, Any]):
    """The registry entry (class) whose hyperparameters the ``*_params`` field ``field`` sets."""
    from rfrs_ref.aggregate import RULES
    from rfrs_ref.attack import ATTACKS
    from rfrs_ref.data import DATASETS
    from rfrs_ref.model import MODELS
    from rfrs_ref.optim import OPTIMIZERS

    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    owner = field.removesuffix("_params")
    name = fields.get(owner, defaults[owner])
    registry = {"dataset": DATASETS, "model": MODELS, "optimizer": OPTIMIZERS,
                "defense": RULES, "attack": ATTACKS}[owner]
    if owner == "defense" and name == "none":
        name = "mean"
    return owner, name, registry.get(name)


def check_params(fields: Mapping[str, Any], origins: Mapping[str, str] | None = None) -> None:
    """ValueError unless every ``*_params`` entry of ``fields`` is a hyperparameter of the
    entry it configures (``optimizer_params`` of the chosen optimizer...) with a value of
    that hyperparameter's type. ``origins[f"{field}.{key}"]`` is where the value was set."""
    from rfrs_ref.params import hyperparameters

    origins = origins or {}
    for field in PARAM_FIELDS:
        table = fields.get(field) or {}
        if not table:
            continue
        if field == "pre_params":
            from rfrs_ref.aggregate import PRE

            owner, name = "pre", ", ".join(fields.get("pre") or ()) or "none"
            specs = {h.name: h for p in (fields.get("pre") or ()) if p in PRE.names()
                     for h in hyperparameters(PRE.get(p))}
        else:
            owner, name, cls = _param_owner(field, fields)
            specs = {h.name: h for h in hyperparameters(cls)}
        for key, value in table.items():
            where = origins.get(f"{field}.{key}", f"{field}.{key}")
            h = specs.get(key)
            if h is None:
                takes = ", ".join(specs) if specs else "none"
                raise ValueError(f"{where}: {owner} {name!r} has no hyperparameter {key!r}"
                                 f"{_suggest(key, specs)}; it takes: {takes}")
            if h.default is None or h.type is str and value is None:
                continue  # no declared type to check against
            if h.type is bool:
                want = _boolean(value)
            elif h.type is int:
                want = None if _is_int(value) else "an integer"
            elif h.type is float:
                ok = _is_number(value) and math.isfinite(value)
                want = None if ok else "a finite number"
            elif h.type is str:
                want = _text(value)
            else:
                want = None
            if want is None and h.choices and value not in h.choices:
                want = f"one of {', '.join(map(str, h.choices))}"
            if want is not None:
                raise ValueError(f"{where} must be {want}, got {_show(value)}")


#: a sweep's name becomes a folder name (results/<name>): one plain path component
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=,@-]{0,127}")


def check_name(name: Any, where: str = "name") -> str:
    """``name`` if it is a plain folder name (letters, digits, ``._+=,@-``, not starting with
    a dot, at most 128 characters), else ValueError: a name may not lead out of its folder."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"{where} must be a plain folder name (letters, digits and . _ + = , @ -, not "
            f"starting with '.', no '/'), got {_show(name)}")
    return name


def confine(value: Any, folder: str | os.PathLike | None, where: str) -> str:
    """A relative path read from a file in ``folder``, checked to stay inside ``folder``.

    Refused (ValueError naming ``where`` and the value): a non-string, an empty or
    absolute path, a ``..`` component, a NUL, and a path that leaves ``folder`` through
    a symbolic link. Returns the path resolved against ``folder`` (as given when
    ``folder`` is None).
    """
    why = None
    if not isinstance(value, str) or not value:
        why = "a non-empty relative path"
    elif "\0" in value or os.path.isabs(value) or value.startswith("~") or \
            ".." in pathlib.PurePath(value).parts:
        why = "a relative path inside the sweep file's folder (no '..', not absolute)"
    if why is None and folder is not None:
        base = pathlib.Path(folder).resolve()
        target = (base / value).resolve()
        if target != base and base not in target.parents:
            why = f"a path inside {base} (it leads to {target} through a symbolic link)"
        else:
            value = str(target)
    if why is not None:
        raise ValueError(f"{where} must be {why}, got {_show(value)}; to read datasets "
                         "from elsewhere, set RFRS_DATA_DIR")
    return value


# -- building configurations ------------------------------------------------------------
def apply_fields(base: Mapping[str, Any], fields: Mapping[str, Any], where: str = "", *,
                 labels: Mapping[str, str] | None = None,
                 origins: dict[str, str] | None = None) -> dict:
    """``base`` (a dict of TrainConfig fields) updated with ``fields``.

    ``preset`` sets ``defense`` and ``detect``; ``*_params`` tables are merged
    key by key; ``ks`` becomes a tuple. Every value is checked first
    (:func:`check_field`): a value of the wrong type or outside its range, and an
    unknown name (with the closest field name when there is one), are a
    ValueError naming it as ``labels[name]``, else ``<where><name>``.
    ``origins``, when given, records that label for each field set (and
    ``"<field>.<key>"`` for each hyperparameter), for :func:`check_params`.
    """
    from rfrs_ref.aggregate import PRESETS

    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for name, value in fields.items():
        label = (labels or {}).get(name, f"{where}{name}")
        if name == "preset":
            if not isinstance(value, str) or value not in PRESETS:
                raise ValueError(f"{label} must be one of {', '.join(PRESETS)}, got "
                                 f"{_show(value)}{_suggest(value, PRESETS)}")
            rule, detect = PRESETS[value]
            out["defense"] = "none" if rule == "mean" else rule
            out["detect"] = detect
            if origins is not None:
                origins["defense"] = origins["detect"] = label
            continue
        if name not in CONFIG_FIELDS:
            raise ValueError(f"{label} is not a configuration field"
                             f"{_field_hint(name, override=where == 'override: ')}; "
                             "fields are: "
                             f"preset, {', '.join(CONFIG_FIELDS)}")
        check_field(name, value, label=label)
        if name in PARAM_FIELDS:
            bad = [k for k in value if not isinstance(k, str)]
            if bad:
                raise ValueError(f"{label} has a key that is not a name: {_show(bad[0])}")
            out[name] = {**out.get(name, {}), **value}
            if origins is not None:
                origins.update({f"{name}.{k}": f"{label}.{k}" for k in value})
        elif name == "ks":
            out["ks"] = tuple(int(k) for k in value)
        elif name == "pre":
            out["pre"] = tuple(value)
        else:
            out[name] = value
        if origins is not None:
            origins[name] = label
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
        """(label, fields) of each value, in order."""
        return [(label, fields) for label, fields, _ in self._cases()]

    def _cases(self) -> list[tuple[str, dict, dict]]:
        """(label, fields, where) of each value; ``where`` names each field's place in a
        sweep file (``axes.rounds[1]``, ``axes.method[0].defense``) for messages."""
        out = []
        seen: dict[str, int] = {}
        is_field = self.name in CONFIG_FIELDS or self.name == "preset"
        for i, v in enumerate(self.values):
            here = f"axes.{self.name}[{i}]"
            if isinstance(v, Mapping) and not (is_field and self.name in PARAM_FIELDS):
                v = dict(v)
                label = v.pop("label", None)
                if label is None:
                    label = _render(v)
                elif not isinstance(label, (str, int, float)) or isinstance(label, bool):
                    raise ValueError(f"{here}.label must be a string, got {_show(label)}")
                out.append((str(label), v, {k: f"{here}.{k}" for k in v}))
            elif is_field:
                out.append((_render_value(v), {self.name: v}, {self.name: here}))
            else:
                raise ValueError(
                    f"axes.{self.name} is not a configuration field"
                    f"{_field_hint(self.name, axis=True)}, so its values must "
                    f"be tables of fields; got {_show(v)} at {here}")
            # the label is what tells the runs of this axis apart in the tables and figures:
            # two values with one label would be drawn and summarised as one series
            label = out[-1][0]
            if has_control(label):
                where = f"{here}.label" if isinstance(v, Mapping) else f"{here} (its label)"
                raise ValueError(f"{where} must not hold a control character (a label is a "
                                 f"cell of the tables' rows), got {_show(label)}")
            if label in seen:
                raise ValueError(
                    f"{here} has the label {_show(label)} of axes.{self.name}[{seen[label]}]; "
                    "the values of an axis need distinct labels (the tables and figures "
                    "tell the runs apart by them)")
            seen[label] = i
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
    base_origins: dict[str, str] = {}
    base_fields = apply_fields({}, base, "base.", origins=base_origins)
    runs = []
    per_axis = [a._cases() for a in axes]
    for combo in itertools.product(*per_axis):
        fields = dict(base_fields)
        origins = dict(base_origins)
        lab = dict(labels or {})
        for axis, (label, values, where) in zip(axes, combo):
            fields = apply_fields(fields, values, labels=where, origins=origins)
            lab[axis.name] = label
        check_params(fields, origins)
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


#: the top-level keys of a sweep file
SWEEP_KEYS = ("name", "trials", "seeds", "base", "axes", "kind")


def parse_sweep(doc: Mapping[str, Any], name: str = "sweep",
                folder: str | os.PathLike | None = None) -> Sweep:
    """A :class:`Sweep` from a parsed sweep document (the TOML format of the module docstring).

    Everything is checked before a run is built, so that a bad file fails at once
    with a message naming the key (``base.rounds must be a positive integer, got
    "ten"``): unknown keys (with the closest known one), each value's type and
    range against the TrainConfig field it sets, each hyperparameter against the
    entry it configures, then every run's resolved configuration. The sweep's
    ``name`` (a folder name of the results) must be a plain folder name; a
    ``data_dir`` must be a relative path that stays inside ``folder`` (the sweep
    file's folder; it is resolved against it), since nothing read from a file
    may lead out of its folder.
    """
    if not isinstance(doc, Mapping):
        raise ValueError(f"a sweep is a table of keys, got {_show(doc)}")
    from rfrs_ref.untrusted import depth_exceeds

    if depth_exceeds(doc, MAX_DEPTH):
        raise ValueError(f"tables and arrays nested more than {MAX_DEPTH} levels deep; a sweep "
                         "needs a few")
    for key in doc:
        if key not in SWEEP_KEYS:
            raise ValueError(f"unknown top-level key {key!r}{_suggest(key, SWEEP_KEYS)}; "
                             f"the keys of a sweep file are: {', '.join(SWEEP_KEYS)}")
    name = check_name(doc["name"] if "name" in doc else name,
                      "name" if "name" in doc else "the file name (used when name = ... is absent)")
    for table in ("base", "axes"):
        if table in doc and not isinstance(doc[table], Mapping):
            raise ValueError(f"{table} must be a table ([{table}]), got {_show(doc[table])}")
    base = dict(doc.get("base", {}))
    kind = doc.get("kind", "train")
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {_show(kind)}"
                         f"{_suggest(kind, KINDS)}")
    if "trials" in doc and "seeds" in doc:
        raise ValueError("give either trials = N or seeds = [...], not both")
    if "seeds" in doc:
        seeds = doc["seeds"]
        if not isinstance(seeds, list) or not seeds or \
                not all(_is_int(s) and s >= 0 for s in seeds):
            raise ValueError("seeds must be a non-empty list of non-negative integers, "
                             f"got {_show(seeds)}")
        seeds = [int(s) for s in seeds]
    elif "trials" in doc:
        trials = doc["trials"]
        if not _is_int(trials) or trials < 1:
            raise ValueError(f"trials must be a positive integer, got {_show(trials)}")
        if trials > MAX_RUNS:
            raise ValueError(f"trials must be at most {MAX_RUNS:,} (the most runs a sweep may "
                             f"hold), got {_show(trials)}")
        seeds = list(range(trials))
    else:
        seed = base.get("seed", 0)
        check_field("seed", seed, "base.")
        seeds = [int(seed)]
    base.pop("seed", None)
    if "data_dir" in base:
        base["data_dir"] = confine(base["data_dir"], folder, "base.data_dir")
    axes = []
    count = len(seeds)
    if count > MAX_RUNS:
        raise ValueError(f"seeds must list at most {MAX_RUNS:,} seeds (the most runs a sweep "
                         f"may hold), got {count:,}")
    for axis_name, values in doc.get("axes", {}).items():
        if has_control(axis_name):
            raise ValueError(f"axes.{json.dumps(axis_name)[1:-1]}: an axis name must not hold a "
                             "control character (it names a column of the tables)")
        if axis_name == "seed":
            raise ValueError("axes.seed: use trials = N or seeds = [...] rather than an axis "
                             "over seed")
        if not isinstance(values, list) or not values:
            raise ValueError(f"axes.{axis_name} must be a non-empty list, got {_show(values)}")
        values = list(values)
        count *= len(values)
        if count > MAX_RUNS:
            raise ValueError(f"the sweep holds more than {MAX_RUNS:,} runs (trials × the "
                             f"lengths of the axes, counted up to axes.{axis_name}); split it "
                             "into several sweep files")
        for i, v in enumerate(values):
            if axis_name == "data_dir":
                values[i] = confine(v, folder, f"axes.data_dir[{i}]")
            elif isinstance(v, Mapping) and "data_dir" in v:
                values[i] = {**v, "data_dir": confine(v["data_dir"], folder,
                                                      f"axes.{axis_name}[{i}].data_dir")}
        axes.append(Axis(axis_name, tuple(values)))
    runs = expand(base, axes, seeds=seeds, kind=kind)
    from rfrs_ref.experiments.sweep import check_feasible

    for run in runs:
        try:
            run.config.resolved()
            check_feasible(run.config)  # ks within the items, the rule's n and f
        except (ValueError, TypeError, KeyError) as exc:
            what = ", ".join(f"{k} {v}" for k, v in run.labels.items()) or "every run"
            msg = exc.args[0] if exc.args else exc
            raise ValueError(f"the run with {what} (seed {run.config.seed}) is not valid: "
                             f"{msg}") from None
    check_unique(runs)
    return Sweep(name, tuple(runs))


def load_sweep(path: str | pathlib.Path) -> Sweep:
    """Read and check a sweep file (TOML, see the module docstring and :func:`parse_sweep`).

    Every error is a one-line ValueError starting with the file's path.
    """
    from rfrs_ref.experiments.results import read_input

    path = pathlib.Path(path)
    try:
        # opened without waiting and read only when a regular file: a FIFO would hang the
        # command, a device (/dev/zero) would be read for ever
        doc = tomllib.loads(read_input(path, "sweep file (TOML)").decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: not UTF-8 text ({exc.reason})") from None
    except RecursionError:
        raise ValueError(f"{path}: tables and arrays nested more than {MAX_DEPTH} levels "
                         "deep; a sweep needs a few") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the sweep file: {exc.strerror or exc}") from None
    except ValueError as exc:  # not a regular file (read_input names it)
        raise ValueError(" ".join(str(exc).split())) from None
    try:
        return parse_sweep(doc, name=path.stem, folder=path.parent)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def runs_from(items: Iterable[RunSpec | TrainConfig]) -> list[RunSpec]:
    """RunSpecs from RunSpecs or bare TrainConfigs (trial 0, no labels)."""
    return [x if isinstance(x, RunSpec) else RunSpec(x) for x in items]
