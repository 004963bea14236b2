"""Robust aggregation rules (docs/aggregation.md).

``RULES`` maps the command line's names to the rule classes; instantiate one
(``RULES.get("krum")(k=1)``) and call ``aggregate(features, arrays, n_samples,
f)``. ``PRESETS`` maps the paper's defence names to (rule, detection space)
pairs. ``PRE`` maps the pre-aggregators' names to their classes
(:mod:`rfrs_ref.aggregate.pre`): ``PreAggregated(pre, rule)`` runs them in
front of a rule. See docs/aggregation.md for the formulas and conventions.
"""

from rfrs_ref.aggregate.base import (
    BACKENDS,
    DETECT,
    FALLBACKS,
    AggregationResult,
    NothingFinite,
    PreconditionError,
    Rule,
    parameter_features,
)
from rfrs_ref.aggregate.bulyan import Bulyan
from rfrs_ref.aggregate.cc import CenteredClipping
from rfrs_ref.aggregate.coordinate import Meamed, Median, TrimmedMean
from rfrs_ref.aggregate.krum import Krum
from rfrs_ref.aggregate.mda import MDA
from rfrs_ref.aggregate.monna import MoNNA
from rfrs_ref.aggregate.mean import Mean
from rfrs_ref.aggregate.pre import PRE, PreAggregated
from rfrs_ref.aggregate.rfa import RFA
from rfrs_ref.aggregate.spectral import CAF, SMEA
from rfrs_ref.registry import Registry

RULES: Registry = Registry("aggregation rule")
for _cls in (Mean, Krum, Median, TrimmedMean, RFA, Bulyan, MDA, Meamed, MoNNA, CenteredClipping,
             CAF, SMEA):
    RULES.register(_cls.name, _cls)

#: The paper's defence names -> (rule, detection space). ``no-defense`` ignores
#: the features, so its detection space only says what not to bother computing.
PRESETS: dict[str, tuple[str, str]] = {
    "no-defense": ("mean", "parameter"),
    "a-rfrs": ("krum", "gradient"),
    "krum": ("krum", "parameter"),
    "rfa": ("rfa", "parameter"),
    "trmean": ("trmean", "parameter"),
}

__all__ = [
    "AggregationResult", "BACKENDS", "Bulyan", "CAF", "CenteredClipping", "DETECT", "FALLBACKS", "Krum", "MDA", "Mean", "Meamed", "Median", "MoNNA",
    "PRE", "PRESETS", "NothingFinite", "PreAggregated", "PreconditionError", "RFA", "RULES", "Rule", "SMEA", "TrimmedMean", "parameter_features",
]
