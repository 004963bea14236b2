"""Descriptive statistics of a dataset (``rfrs-ref data info``)."""

from __future__ import annotations

import dataclasses

import numpy as np

from rfrs_ref.data.base import Interactions

#: quantiles of the per-user and per-item interaction counts that are reported
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """Counts, density and interaction-count quantiles of a dataset.

    Attributes:
        name, source, n_users, n_items, n_interactions: as in Interactions.
        density: n_interactions / (n_users · n_items).
        items_with_interactions: items interacted with at least once.
        users_without_items: users with no interaction.
        per_user_mean: mean interactions per user.
        per_user_quantiles: quantile -> interactions per user (linear interpolation).
        per_item_quantiles: quantile -> interactions per item, over all n_items items.
    """

    name: str
    source: str
    n_users: int
    n_items: int
    n_interactions: int
    density: float
    items_with_interactions: int
    users_without_items: int
    per_user_mean: float
    per_user_quantiles: dict[float, float]
    per_item_quantiles: dict[float, float]

    def to_dict(self) -> dict:
        """JSON-friendly (quantile keys as strings such as ``"0.5"``)."""
        d = dataclasses.asdict(self)
        d["per_user_quantiles"] = {f"{q:g}": v for q, v in self.per_user_quantiles.items()}
        d["per_item_quantiles"] = {f"{q:g}": v for q, v in self.per_item_quantiles.items()}
        return d


def dataset_info(
    data: Interactions | str, quantiles: tuple[float, ...] = QUANTILES, **load_kwargs
) -> DatasetInfo:
    """Describe ``data``: counts, density, and quantiles of interactions per user and per item.

    ``data`` is an Interactions, or a dataset name loaded with
    ``load_dataset(data, **load_kwargs)``.
    """
    if isinstance(data, str):
        from rfrs_ref.data.datasets import load_dataset

        data = load_dataset(data, **load_kwargs)
    per_user = data.counts()
    per_item = data.item_counts()
    cells = data.n_users * data.n_items

    def q(x: np.ndarray) -> dict[float, float]:
        if x.size == 0:
            return {float(p): float("nan") for p in quantiles}
        values = np.quantile(x, quantiles)
        return {float(p): float(v) for p, v in zip(quantiles, values, strict=True)}

    return DatasetInfo(
        name=data.name,
        source=data.source,
        n_users=data.n_users,
        n_items=data.n_items,
        n_interactions=data.n_interactions,
        density=data.n_interactions / cells if cells else float("nan"),
        items_with_interactions=int(np.count_nonzero(per_item)),
        users_without_items=int(np.count_nonzero(per_user == 0)),
        per_user_mean=float(per_user.mean()) if per_user.size else float("nan"),
        per_user_quantiles=q(per_user),
        per_item_quantiles=q(per_item),
    )
