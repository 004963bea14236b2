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


def hyper(default: Any, help: str, *, cli: str | None = None, choices: tuple | None = None):
    """A hyperparameter field: ``default``, a one-line ``help``, an optional CLI name."""
    return dataclasses.field(
        default=default, metadata={"help": help, "cli": cli, "choices": choices}
    )


@dataclasses.dataclass(frozen=True)
class HyperSpec:
    name: str  # field name
    default: Any
    type: type
    help: str
    cli: str | None  # option name without dashes, None: derived from the field name
    choices: tuple | None


def hyperparameters(entry) -> list[HyperSpec]:
    """The declared hyperparameters of a dataclass entry (class or instance)."""
    out = []
    for f in dataclasses.fields(entry):
        if "help" not in f.metadata:
            continue
        default = f.default
        typ = type(default) if default is not None else str
        out.append(HyperSpec(f.name, default, typ, f.metadata["help"], f.metadata.get("cli"),
                             f.metadata.get("choices")))
    return out


def values(entry) -> dict[str, Any]:
    """The entry's hyperparameter values, JSON-friendly: an integer given for a
    hyperparameter whose default is a float is that float (``lr = 1`` is ``lr = 1.0``),
    so that one configuration has one JSON form, and a sweep one key for it."""
    return {h.name: _as_declared(h, getattr(entry, h.name)) for h in hyperparameters(entry)}


def _as_declared(h: HyperSpec, v: Any) -> Any:
    if h.type is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v
