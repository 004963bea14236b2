"""Fixtures of the cross-checks against other libraries (the ``crosscheck`` extra).

Install (CPU only): ``pip install torch==2.13.0``, then ``pip install byzfl==0.0.11
--no-deps`` and ``pip install flwr==1.41.0``, then this project. Every test here is
skipped when its library is missing.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def torch():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(2)
    return torch


@pytest.fixture(scope="session")
def real_splits(data_dir):
    """name -> the seed-0 split of ml100k and citeulike-a (skips without RFRS_DATA_DIR)."""
    from rfrs_ref.data import load_dataset, split_interactions

    return {name: split_interactions(load_dataset(name, data_dir, download=False), seed=0)
            for name in ("ml100k", "citeulike-a")}


@pytest.fixture(scope="session")
def flower_aggregate():
    """``flwr.server.strategy.aggregate`` (pinned flwr==1.41.0), or skip."""
    return pytest.importorskip("flwr.server.strategy.aggregate")


@pytest.fixture(scope="session")
def byzfl_aggregators(torch):
    """ByzFL's aggregators module (0.0.11) without its torchvision-importing ``__init__``, or skip."""
    from rfrs_ref.testing.adapters import load_byzfl_aggregators

    try:
        return load_byzfl_aggregators()
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))
