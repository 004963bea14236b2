"""Shared checks of the hostile-input tests."""

from __future__ import annotations

import pytest


def _refused(res, *fragments, never: str | None = None) -> str:
    """A command's refusal: a non-zero exit without a traceback, exactly one ``Error`` line
    naming every fragment, and (``never``) none of a success's output."""
    assert res.exit_code != 0, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    if never is not None:
        assert never not in res.output, res.output
    errors = [x for x in res.output.splitlines() if x.startswith("Error")]
    assert len(errors) == 1, res.output
    for frag in fragments:
        assert str(frag) in errors[0], (frag, errors[0])
    return errors[0]


@pytest.fixture
def refused():
    """``refused(result, *fragments, never=...)``: see :func:`_refused`."""
    return _refused
