"""Hyperparameters of registry entries, declared once and exposed everywhere.

Every entry of a family (an optimiser, an aggregation rule, an attack, a model)
is a frozen dataclass whose fields are its hyperparameters. ``hyper(default,
help)`` declares such a field with its help text; the command line turns the
fields of all entries of a family into options (``--beta1``, ``--krum-k``,
``--noise-sigma``), and the run record stores ``asdict(entry)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


def hyper(default: Any, help: str, *, cli: str | None = None, choices: tuple | None = None,
          absent_is_default: bool = False):
    """A hyperparameter field: ``default``, a one-line ``help``, an optional CLI name.

    ``absent_is_default``: a hyperparameter added after runs were recorded without it. A
    configuration's JSON (and so a sweep's run key, hashed from it) leaves it out while it
    holds its default, so the runs recorded before it existed keep their keys and are found
    finished; set to anything else, it is written and makes another run."""
    return dataclasses.field(
        default=default, metadata={"help": help, "cli": cli, "choices": choices,
                                   "absent_is_default": absent_is_default}
    )


@dataclasses.dataclass(frozen=True)
class HyperSpec:
    name: str  # field name
    default: Any
    type: type
    help: str
    cli: str | None  # option name without dashes, None: derived from the field name
    choices: tuple | None
    absent_is_default: bool = False  # left out of a configuration's JSON at its default


def hyperparameters(entry) -> list[HyperSpec]:
    """The declared hyperparameters of a dataclass entry (class or instance)."""
    out = []
    for f in dataclasses.fields(entry):
        if "help" not in f.metadata:
            continue
        default = f.default
        typ = type(default) if default is not None else str
        out.append(HyperSpec(f.name, default, typ, f.metadata["help"], f.metadata.get("cli"),
                             f.metadata.get("choices"),
                             bool(f.metadata.get("absent_is_default", False))))
    return out


def check_kinds(entry) -> None:
    """ValueError unless no hyperparameter declared a number holds a boolean, and every
    flag holds a boolean.

    A hyperparameter whose default is an ``int`` or a ``float`` is a number; Python's
    ``True`` and ``False`` are integers too (1 and 0), so ``Krum(k=False)`` would run as
    ``k = 0`` and ``Adam(lr=True)`` as ``lr = 1`` unless refused here. A boolean (Python's
    or NumPy's) is refused where a number is expected, with a message naming the entry,
    the hyperparameter, the value and what it takes. The other way round, a flag (a
    ``bool`` default) takes ``True`` or ``False`` only: ``ALIE(omniscient=1)`` or
    ``Camouflage(include_eps="false")`` (a truthy string) would otherwise run as a flag
    the caller may not have meant. Other kinds are left to the entry's own checks.
    The base classes of every family call this first in ``__post_init__``."""
    owner = getattr(entry, "name", "") or type(entry).__name__
    for h in hyperparameters(entry):
        v = getattr(entry, h.name)
        if h.type is bool:
            if not isinstance(v, (bool, np.bool_)):
                raise ValueError(f"{owner} {h.name} must be true or false, got {h.name}={v!r}")
            continue
        if h.type not in (int, float):
            continue
        if isinstance(v, (bool, np.bool_)):
            want = "an integer" if h.type is int else "a number"
            raise ValueError(f"{owner} {h.name} must be {want}, not a boolean: got "
                             f"{h.name}={v!r} (true/false are not numbers)")


def values(entry) -> dict[str, Any]:
    """The entry's hyperparameter values, JSON-friendly: an integer given for a
    hyperparameter whose default is a float is that float (``lr = 1`` is ``lr = 1.0``),
    so that one configuration has one JSON form, and a sweep one key for it."""
    return {h.name: _as_declared(h, getattr(entry, h.name)) for h in hyperparameters(entry)}


def recorded(entry, params: dict) -> dict:
    """``params`` as a configuration's JSON records them for ``entry`` (a class or an
    instance): without the hyperparameters declared ``absent_is_default`` that hold their
    default (``True`` and ``1`` are not ``False`` and ``0``: a default is matched in value
    and kind), so that a run recorded before such a hyperparameter existed has the JSON,
    and the key, it had then. Other entries are kept as they are; ``params`` is not
    modified."""
    drop = {h.name for h in hyperparameters(entry)
            if h.absent_is_default and h.name in params
            and type(params[h.name]) is type(h.default) and params[h.name] == h.default}
    return {k: v for k, v in params.items() if k not in drop}


def _as_declared(h: HyperSpec, v: Any) -> Any:
    if h.type is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v
