"""Optimisers in federated form (docs/optimizers.md): client rule, server recovery, verification.

``OPTIMIZERS`` maps the CLI names to the optimiser classes (frozen dataclasses
whose fields are the hyperparameters ``lr``, ``beta1``, ``beta2``, ``beta3``,
``beta4``, ``eps``; a name has the same default and meaning in every optimiser).
"""

from __future__ import annotations

from typing import Any, Mapping

from rfrs_ref.optim.adam import Adam
from rfrs_ref.optim.adaptive import AdaGrad, RMSProp
from rfrs_ref.optim.base import Optimizer, State, Verdict
from rfrs_ref.optim.momentum import Momentum
from rfrs_ref.optim.sgd import SGD
from rfrs_ref.optim.tolerance import VERIFY_SAFETY
from rfrs_ref.params import hyperparameters
from rfrs_ref.registry import Registry

OPTIMIZERS: Registry[type[Optimizer]] = Registry("optimizer")
for _cls in (SGD, Momentum, Adam, AdaGrad, RMSProp):
    OPTIMIZERS.register(_cls.name, _cls)


def from_options(name: str, options: Mapping[str, Any]) -> Optimizer:
    """The optimiser ``name`` built from the union of every optimiser's options.

    Options that belong to another optimiser (``beta1`` for ``sgd``) are
    ignored; a name that is no optimiser's hyperparameter is an error.
    """
    cls = OPTIMIZERS.get(name)
    known = {h.name for _, c in OPTIMIZERS.items() for h in hyperparameters(c)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown optimiser option(s) {unknown}; known: {sorted(known)}")
    mine = {h.name for h in hyperparameters(cls)}
    return cls(**{k: v for k, v in options.items() if k in mine})


__all__ = [
    "OPTIMIZERS", "Optimizer", "State", "Verdict", "VERIFY_SAFETY",
    "SGD", "Momentum", "Adam", "AdaGrad", "RMSProp", "from_options",
]
