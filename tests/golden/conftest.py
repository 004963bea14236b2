"""Fixtures of the golden-vector tests: one export per session (it takes about a second)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """A directory holding a full export; tests that modify files copy it first."""
    from rfrs_ref import golden

    root = tmp_path_factory.mktemp("golden") / "vectors"
    golden.export(root)
    return root
