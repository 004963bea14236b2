"""Fixtures of the aggregation tests: the other libraries of the cross-checks."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def flower_aggregate():
    """``flwr.server.strategy.aggregate`` (pinned flwr==1.41.0), or skip."""
    return pytest.importorskip("flwr.server.strategy.aggregate")


@pytest.fixture(scope="session")
def byzfl_aggregators():
    """ByzFL's ``byzfl.aggregators.aggregators`` module (0.0.11), or skip.

    Imported without running ``byzfl/__init__.py``, which needs torchvision
    (see :func:`rfrs_ref.testing.adapters.load_byzfl_aggregators`).
    """
    pytest.importorskip("torch")
    from rfrs_ref.testing.adapters import load_byzfl_aggregators

    try:
        return load_byzfl_aggregators()
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))
