"""Byzantine attacks (docs/attacks.md).

``ATTACKS`` maps the command line's names to the attack classes (frozen
dataclasses whose fields are their hyperparameters). The round loop calls
``attack.apply_inplace(AttackContext(...))`` after the honest uploads are
written; the attack rewrites the Byzantine rows and returns diagnostics for
the round record. ``attack.check_optimizer(optimizer)`` tells, before a run,
whether the attack can run with that optimiser. See docs/attacks.md.

| name | Byzantine upload |
|---|---|
| ``none`` | honest |
| ``ascent`` | rule(−g) |
| ``noise`` | honest, θ + N(0, σ²) (breaks the rule) |
| ``camouflage`` | θ honest, m and v from g̃ of Eq. 6 (Adam only) |
| ``alie`` | rule(μ − z·σ) of the Byzantine clients' gradients |
| ``ipm`` | rule(−ϵ · mean) of the Byzantine clients' gradients |
| ``inf`` | +inf (or −inf, NaN) in every uploaded array (breaks the rule) |
| ``mimic`` | a copy of one honest client's upload |
| ``opt-ipm`` | rule(−τ · mean) of the honest gradients, τ by line search against the rule |
| ``opt-alie`` | rule(μ + τ·σ) of the honest gradients, τ by line search against the rule |
| ``a-ra`` | rule(g) promoting target items to approximated users (FISM, FMF) |
"""

from __future__ import annotations

from rfrs_ref.attack.base import Attack, AttackContext, optimizer_name
from rfrs_ref.attack.basic import Ascent, NoAttack, Noise
from rfrs_ref.attack.camouflage import (
    Camouflage,
    adam_direction,
    camouflage_gradient,
    eq6_denominator,
)
from rfrs_ref.attack.colluding import ALIE, IPM, alie_gradient, alie_z, ipm_gradient
from rfrs_ref.attack.nonfinite import NONFINITE_VALUES, Mimic, NonFinite
from rfrs_ref.attack.promotion import ARA, parse_targets, promotion_gradient
from rfrs_ref.attack.optimal import OptimalALIE, OptimalIPM, line_search, mean_std
from rfrs_ref.registry import Registry

ATTACKS: Registry[type[Attack]] = Registry("attack")
for _cls in (NoAttack, Ascent, Noise, Camouflage, ALIE, IPM, NonFinite, Mimic, OptimalIPM,
             OptimalALIE, ARA):
    ATTACKS.register(_cls.name, _cls)

__all__ = [
    "ALIE",
    "ARA",
    "ATTACKS",
    "IPM",
    "Mimic",
    "NONFINITE_VALUES",
    "NonFinite",
    "OptimalALIE",
    "OptimalIPM",
    "Ascent",
    "Attack",
    "AttackContext",
    "Camouflage",
    "NoAttack",
    "Noise",
    "adam_direction",
    "alie_gradient",
    "alie_z",
    "camouflage_gradient",
    "eq6_denominator",
    "ipm_gradient",
    "line_search",
    "mean_std",
    "optimizer_name",
    "parse_targets",
    "promotion_gradient",
]
