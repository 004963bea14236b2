"""dataset_info: known answers on a small dataset."""

from __future__ import annotations

import json

import pytest

from rfrs_ref.data import Interactions, dataset_info


def test_known_answers():
    d = Interactions.from_lists("tiny", 5, [[0, 1], [1, 2, 3, 4], [], [1]])
    info = dataset_info(d)
    assert (info.n_users, info.n_items, info.n_interactions) == (4, 5, 7)
    assert info.density == pytest.approx(7 / 20)
    assert info.items_with_interactions == 5 and info.users_without_items == 1
    assert info.per_user_mean == pytest.approx(7 / 4)
    # per-user counts 2, 4, 0, 1 -> sorted 0, 1, 2, 4
    assert info.per_user_quantiles[0.0] == 0 and info.per_user_quantiles[1.0] == 4
    assert info.per_user_quantiles[0.5] == pytest.approx(1.5)
    # per-item counts 1, 3, 1, 1, 1
    assert info.per_item_quantiles[1.0] == 3 and info.per_item_quantiles[0.5] == 1
    d2 = json.loads(json.dumps(info.to_dict()))
    assert d2["per_user_quantiles"]["0.5"] == pytest.approx(1.5)


def test_by_name():
    info = dataset_info("synthetic", n_users=30, n_items=50)
    assert (info.n_users, info.n_items, info.name) == (30, 50, "synthetic")
