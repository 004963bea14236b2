"""Command-line options generated from the families' registries.

Every hyperparameter declared with ``rfrs_ref.params.hyper`` on a registry
entry becomes an option. Model and optimiser hyperparameters keep their own
names (``--dim``, ``--lr``, ``--beta1``); those of aggregation rules and attacks
are prefixed by the entry's name (``--krum-k``, ``--noise-sigma``) because
they only make sense with that entry. An option left out takes the entry's
default; giving one that does not apply to the chosen entry is an error.
"""

from __future__ import annotations

import dataclasses

import click

from rfrs_ref.params import hyperparameters


@dataclasses.dataclass(frozen=True)
class GeneratedOption:
    family: str
    entry: str | None  # None: shared by every entry of the family that declares it
    field: str
    param: str  # click parameter name
    flag: str


def _click_type(spec):
    if spec.choices:
        return click.Choice([str(c) for c in spec.choices])
    if spec.type is bool:
        return click.BOOL
    if spec.type is int:
        return click.INT
    if spec.type is float:
        return click.FLOAT
    return click.STRING


def registry_options(family: str, registry, *, prefixed: bool):
    """(decorators, generated) for every hyperparameter of every entry in ``registry``."""
    decorators, generated, seen = [], [], {}
    for name, cls in registry.items():
        for spec in hyperparameters(cls):
            base = spec.cli or spec.name.replace("_", "-")
            flag = f"{name}-{base}" if prefixed and not spec.cli else base
            param = flag.replace("-", "_")
            entry = name if prefixed and not spec.cli else None
            if param in seen:
                continue
            seen[param] = True
            owners = [n for n, c in registry.items()
                      if any(h.name == spec.name for h in hyperparameters(c))]
            where = "" if prefixed else f" ({', '.join(owners)})"
            decorators.append(click.option(
                f"--{flag}", param, type=_click_type(spec), default=None,
                help=f"{spec.help}{where} [default: {spec.default}]"))
            generated.append(GeneratedOption(family, entry, spec.name, param, flag))
    return decorators, generated


def collect(generated, kwargs: dict, family: str, chosen: str, registry) -> dict:
    """The hyperparameters given for ``chosen``; error on options of other entries."""
    fields = {h.name for h in hyperparameters(registry.get(chosen))}
    out = {}
    for g in generated:
        if g.family != family:
            continue
        value = kwargs.pop(g.param, None)
        if value is None:
            continue
        if (g.entry is not None and g.entry != chosen) or g.field not in fields:
            raise click.UsageError(f"--{g.flag} does not apply to {family} {chosen!r}")
        out[g.field] = value
    return out


def apply(decorators):
    def wrap(f):
        for d in reversed(decorators):
            f = d(f)
        return f

    return wrap
