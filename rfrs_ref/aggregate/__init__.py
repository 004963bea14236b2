"""Robust aggregation rules (docs/aggregation.md).

``RULES`` maps the command line's names to the rule classes; instantiate one
(``RULES.get("krum")(k=1)``) and call ``aggregate(features, arrays, n_samples,
f)``. ``PRESETS`` maps the paper's defence names to (rule, detection space)
pairs. See docs/aggregation.md for the formulas and conventions.
"""

from rfrs_ref.aggregate.base import (
    BACKENDS,
    DETECT,
    FALLBACKS,
    AggregationResult,
    PreconditionError,
    Rule,
    parameter_features,
)
from rfrs_ref.aggregate.bulyan import Bulyan
from rfrs_ref.aggregate.coordinate import Median, TrimmedMean
from rfrs_ref.aggregate.krum import Krum
from rfrs_ref.aggregate.mean import Mean
from rfrs_ref.aggregate.rfa import RFA
from rfrs_ref.registry import Registry

RULES: Registry = Registry("aggregation rule")
for _cls in (Mean, Krum, Median, TrimmedMean, RFA, Bulyan):
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
    "AggregationResult", "BACKENDS", "Bulyan", "DETECT", "FALLBACKS", "Krum", "Mean", "Median",
    "PRESETS", "PreconditionError", "RFA", "RULES", "Rule", "TrimmedMean", "parameter_features",
]
