"""The agreement rule shared by the golden vectors, the traces and the conformance laws."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rfrs_ref import agreement

finite = st.floats(allow_nan=False, allow_infinity=False)
nonfinite = st.sampled_from([math.nan, math.inf, -math.inf])
tolerances = st.floats(0.0, 1e3)


@given(r=finite, rtol=tolerances, atol=tolerances)
def test_a_value_agrees_with_itself(r, rtol, atol):
    assert agreement.agrees(r, r, rtol, atol)


@given(r=finite, c=nonfinite, rtol=tolerances, atol=tolerances)
def test_nonfinite_never_matches_a_finite_reference(r, c, rtol, atol):
    assert not agreement.agrees(r, c, rtol, atol)
    assert agreement.disagree(np.array([r, r]), np.array([r, c]), rtol, atol).tolist() == [False, True]


@given(r=nonfinite, c=st.one_of(finite, nonfinite))
def test_a_nonfinite_reference_is_matched_by_itself_only(r, c):
    same = (math.isnan(r) and math.isnan(c)) or r == c
    assert agreement.agrees(r, c, 1e3, 1e3) == same


@given(r=finite, c=finite, rtol=st.floats(0.0, 0.9), atol=st.floats(0.0, 1.0))
def test_the_tolerance_comes_from_the_reference(r, c, rtol, atol):
    with np.errstate(over="ignore"):
        expected = abs(c - r) <= atol + rtol * abs(r)
    assert agreement.agrees(r, c, rtol, atol) == expected


def test_the_reported_defect_a_huge_candidate_cannot_widen_its_tolerance():
    assert not agreement.agrees(1.0, math.inf, 1e-6, 1e-9)  # max(|A|, |B|) made this agree
    assert not agreement.agrees(1.0, 1e300, 0.5, 0.0)
    assert agreement.agrees(1e300, 1.0, 1.0, 0.0)


def test_huge_integers_count_as_infinite():
    assert agreement.as_float(10 ** 400) == math.inf and agreement.as_float(-(10 ** 400)) == -math.inf
    assert not agreement.agrees(1.0, 10 ** 400)
    assert agreement.agrees(math.inf, 10 ** 400)


@pytest.mark.parametrize("rtol, atol", [(math.inf, 0.0), (0.0, math.nan), (-1.0, 0.0), ("1", 0.0), (True, 0.0),
                                        (None, 0.0)])
def test_unusable_tolerances_are_refused(rtol, atol):
    with pytest.raises(ValueError, match="somewhere: (rtol|atol)"):
        agreement.check_tolerance(rtol, atol, "somewhere")


def test_first_disagreement_names_the_element():
    r = np.array([[1.0, 2.0], [3.0, np.nan]])
    c = np.array([[1.0, 2.0], [np.inf, np.nan]])
    d = agreement.first_disagreement(r, c, 1e-6, 0.0)
    assert d["index"] == (1, 0) and d["candidate"] == math.inf and d["count"] == 1 and d["size"] == 4
    assert agreement.first_disagreement(r, r.copy()) is None
    with pytest.raises(ValueError, match="shapes differ"):
        agreement.first_disagreement(r, r[0])


@given(r=st.one_of(st.floats(), st.integers(-2**1100, 2**1100)),
       c=st.one_of(st.floats(), st.integers(-2**1100, 2**1100)),
       rtol=st.one_of(st.floats(0.0, 1e308), st.sampled_from([0.0, 1.0, 1e308])),
       atol=st.one_of(st.floats(0.0, 1e308), st.sampled_from([0.0, 5e-324, 1e308])))
def test_the_scalar_rule_is_the_array_rule(r, c, rtol, atol):
    # agrees() evaluates the rule in plain Python floats; disagree() in NumPy: the same
    # verdict everywhere, overflowing differences and tolerances, huge integers and NaN included
    expected = not bool(agreement.disagree(agreement.as_float(r), agreement.as_float(c), rtol, atol))
    assert agreement.agrees(r, c, rtol, atol) == expected
