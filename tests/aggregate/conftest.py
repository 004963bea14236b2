"""Fixtures of the aggregation tests: the other libraries of the cross-checks."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import pytest


@pytest.fixture(scope="session")
def flower_aggregate():
    """``flwr.server.strategy.aggregate`` (pinned flwr==1.41.0), or skip."""
    return pytest.importorskip("flwr.server.strategy.aggregate")


@pytest.fixture(scope="session")
def byzfl_aggregators():
    """ByzFL's ``byzfl.aggregators.aggregators`` module (0.0.11), or skip.

    ``import byzfl`` runs the package's ``__init__``, which imports its training
    framework and with it torchvision (not installable next to a CPU-only torch
    2.13). The aggregators themselves only need numpy, torch and scipy, so the
    package is registered in ``sys.modules`` as a bare package module (its real
    directory as ``__path__``, its ``__init__`` not run) and the aggregators
    submodule is then imported normally from the installed files.
    """
    pytest.importorskip("torch")
    if "byzfl.aggregators.aggregators" in sys.modules:
        return sys.modules["byzfl.aggregators.aggregators"]
    spec = importlib.util.find_spec("byzfl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("byzfl is not installed (the crosscheck extra: byzfl==0.0.11 --no-deps)")
    if "byzfl" not in sys.modules:
        pkg = types.ModuleType("byzfl")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        pkg.__file__ = spec.origin
        sys.modules["byzfl"] = pkg
    return importlib.import_module("byzfl.aggregators.aggregators")
