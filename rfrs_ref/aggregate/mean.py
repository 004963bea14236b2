"""``mean``: the weighted mean of all uploads, no defence (docs/aggregation.md, Option I)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from rfrs_ref.aggregate.base import AggregationResult, Rule, combine


@dataclasses.dataclass(frozen=True)
class Mean(Rule):
    r"""Weighted mean of every client's upload (federated averaging).

    Formula: for every uploaded array A,

        Ā = Σᵢ nᵢ · A[i] / Σᵢ nᵢ

    Convention: weights proportional to the training-set sizes nᵢ (McMahan et
    al. 2017), as in Flower's ``aggregate``; the features are not read.

    Reference: the paper's Option I ("no defence"), Algorithm 1.

    Precondition: none (f is ignored). Not robust: one NaN, ±inf or 1e38 in any
    upload reaches the aggregate, as it would in a real server without defence.
    """

    name: ClassVar[str] = "mean"
    coordinatewise: ClassVar[bool] = False
    uses_features: ClassVar[bool] = False
    has_fixed_weights: ClassVar[bool] = True

    def fixed_weights(self, n_samples):
        """wᵢ = nᵢ / Σⱼ nⱼ."""
        n_samples = np.asarray(n_samples, dtype=np.float64)
        return n_samples / n_samples.sum()

    def _aggregate(self, X, arrays, n_samples, f, backend):
        w = self.fixed_weights(n_samples)
        out = combine(arrays, w, backend)
        return AggregationResult(out, w, np.ones(X.shape[0]), {})
