"""Uploads the caller has checked finite (``FiniteUploads``: the round's verified uploads)
are not read again for NaN and ±inf; the features still are, and the rules' results are
those of a plain mapping of the same finite arrays, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from rfrs_ref.aggregate import RULES
from rfrs_ref.aggregate.base import FiniteUploads, validate_inputs
from rfrs_ref.aggregate.combine import finite_clients

CPU = ("numpy", "numba")


@pytest.mark.parametrize("backend", CPU)
def test_finite_clients_reads_only_the_features_of_finite_uploads(backend):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((5, 30)).astype(np.float32)
    U = {"theta": rng.standard_normal((5, 30)).astype(np.float32)}
    U["theta"][1, 3] = np.nan  # a value the caller's word says is not there
    X[3, 0] = np.inf
    assert finite_clients(X, U, backend).tolist() == [True, False, True, False, True]
    # the word is taken: only the features are read
    assert finite_clients(X, FiniteUploads(U), backend).tolist() == [True, True, True, False, True]


def test_validate_inputs_keeps_the_callers_word():
    X = np.zeros((2, 3))
    _, mats, _ = validate_inputs(X, FiniteUploads(theta=X.copy()), np.ones(2), 0, "numba")
    assert isinstance(mats, FiniteUploads)
    _, mats, _ = validate_inputs(X, {"theta": X.copy()}, np.ones(2), 0, "numba")
    assert not isinstance(mats, FiniteUploads)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("name", ["krum", "rfa", "bulyan", "mda", "monna", "cc", "caf", "smea",
                                  "median", "trmean"])
def test_rules_give_the_same_result_for_finite_uploads(name, backend):
    rng = np.random.default_rng(1)
    n, D = 11, 40
    X = rng.standard_normal((n, D)).astype(np.float32)
    X[2] = np.nan  # a non-finite feature row is still seen
    U = {"m": rng.standard_normal((n, D)).astype(np.float32),
         "theta": rng.standard_normal((n, D)).astype(np.float32)}
    ns = rng.integers(1, 30, n)
    rule = RULES.get(name)()
    plain = rule.aggregate(X, U, ns, 2, backend=backend)
    marked = rule.aggregate(X, FiniteUploads(U), ns, 2, backend=backend)
    for k in U:
        assert np.array_equal(plain.arrays[k].view(np.uint8), marked.arrays[k].view(np.uint8)), k
    assert plain.diagnostics == marked.diagnostics


@pytest.mark.parametrize("backend", CPU)
def test_a_pre_aggregated_rule_gives_the_same_result_for_finite_uploads(backend):
    """NNM reads the clients' finiteness before it mixes them; the rule after it sees
    mixed rows, which it checks in full."""
    from rfrs_ref.aggregate.pre import PRE, PreAggregated

    rng = np.random.default_rng(2)
    n, D = 11, 40
    X = rng.standard_normal((n, D)).astype(np.float32)
    X[4, 7] = -np.inf
    U = {"theta": rng.standard_normal((n, D)).astype(np.float32)}
    ns = rng.integers(1, 30, n)
    rule = PreAggregated(pre=(PRE.get("nnm")(),), rule=RULES.get("krum")())
    plain = rule.aggregate(X, U, ns, 2, backend=backend, rng=np.random.default_rng(0))
    marked = rule.aggregate(X, FiniteUploads(U), ns, 2, backend=backend,
                            rng=np.random.default_rng(0))
    assert np.array_equal(plain.arrays["theta"].view(np.uint8), marked.arrays["theta"].view(np.uint8))
    assert plain.diagnostics == marked.diagnostics
