"""The BPR pair terms: stable sigmoid / softplus, the oracle's pair sums and the
kernels' scalar building blocks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.kernels import fism as K
from rfrs_ref.model import bpr_exact, bpr_sampled, log_sigmoid, sigmoid, softplus

finite = st.floats(min_value=-1e30, max_value=1e30, allow_nan=False)


def test_sigmoid_softplus_extremes():
    x = np.array([-1e30, -1e6, -800.0, -40.0, 0.0, 40.0, 800.0, 1e6, 1e30, -np.inf, np.inf])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        s = sigmoid(x)
        sp = softplus(x)
        ls = log_sigmoid(x)
    assert np.all(np.isfinite(s[:-2])) and np.all(np.isfinite(sp[:-1]))
    assert s[0] == 0.0 and s[8] == 1.0 and s[4] == 0.5
    assert s[-2] == 0.0 and s[-1] == 1.0
    assert sp[0] == 0.0 and sp[8] == 1e30 and sp[-1] == np.inf
    assert sp[4] == math.log(2.0)
    assert ls[0] == -1e30 and ls[8] == 0.0
    # tails keep relative accuracy: σ(−40) = e^−40 / (1 + e^−40)
    assert sigmoid(-40.0) == pytest.approx(math.exp(-40.0) / (1.0 + math.exp(-40.0)), rel=1e-15)
    assert softplus(-40.0) == pytest.approx(math.log1p(math.exp(-40.0)), rel=1e-15)


@given(finite)
def test_sigmoid_laws(x):
    s, sm = float(sigmoid(x)), float(sigmoid(-x))
    assert 0.0 <= s <= 1.0
    # each of σ(x), σ(−x) is within one rounding of its value, and so is their sum:
    # at most 3 units of roundoff (u = 2⁻⁵³) of 1 apart
    assert s + sm == pytest.approx(1.0, abs=3 * 2.0**-53)
    # softplus(x) − softplus(−x) = x, and d softplus/dx = σ
    assert float(softplus(x) - softplus(-x)) == pytest.approx(x, rel=1e-15, abs=1e-15)
    assert float(log_sigmoid(x)) == -float(softplus(-x))


def test_bpr_exact_matches_pairwise_definition(mt):
    rng = np.random.default_rng(3)
    y_pos, y_neg = rng.normal(size=7) * 3, rng.normal(size=11) * 3
    loss, a, b = bpr_exact(y_pos, y_neg)
    x = y_pos[:, None] - y_neg[None, :]
    sig = 1.0 / (1.0 + np.exp(x))  # σ(−x), moderate x: direct form is fine here
    assert loss == pytest.approx(np.sum(np.log1p(np.exp(-x))), rel=1e-13)
    np.testing.assert_allclose(a, -sig.sum(axis=1), rtol=1e-13)
    np.testing.assert_allclose(b, sig.sum(axis=0), rtol=1e-13)
    # Σ a = −Σ b: every pair enters both with opposite signs
    assert a.sum() == pytest.approx(-b.sum(), rel=1e-13)


def test_bpr_exact_blocks_do_not_change_the_result(monkeypatch):
    import rfrs_ref.model.bpr as bpr

    rng = np.random.default_rng(4)
    y_pos, y_neg = rng.normal(size=9), rng.normal(size=13)
    want = bpr.bpr_exact(y_pos, y_neg)
    monkeypatch.setattr(bpr, "PAIR_BLOCK", 5)  # 1 row per block
    got = bpr.bpr_exact(y_pos, y_neg)
    assert got[0] == pytest.approx(want[0], rel=1e-14)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-14)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-14)


def test_bpr_sampled_counts_repetitions():
    y_pos = np.array([0.3, -1.0])
    y_neg = np.array([[0.1, 0.1, 2.0], [0.5, 0.5, 0.5]])
    loss, a, sig = bpr_sampled(y_pos, y_neg)
    x = y_pos[:, None] - y_neg
    assert loss == pytest.approx(np.sum(np.log1p(np.exp(-x))), rel=1e-14)
    np.testing.assert_allclose(sig, 1.0 / (1.0 + np.exp(x)), rtol=1e-14)
    np.testing.assert_allclose(a, -sig.sum(axis=1), rtol=1e-14)


def test_log1p_unit_accuracy():
    # normal numbers only: the shifted pair form never produces w below e^−600
    w = np.concatenate([np.linspace(0.0, 1.0 + 1e-9, 20001), np.logspace(-300, 0, 601),
                        [K.SQRT2_M1, np.nextafter(K.SQRT2_M1, 1.0)]])
    got = np.array([K.log1p_unit(v) for v in w])
    want = np.log1p(w)
    pos = want > 0
    rel = np.abs(got[pos] - want[pos]) / want[pos]
    assert rel.max() < 8 * np.finfo(np.float64).eps
    assert got[w == 0.0][0] == 0.0


@given(st.floats(-700, 700), st.floats(-700, 700))
def test_pair_direct_matches_oracle(yj, yk):
    sig, lp = K.pair_direct(yj, yk)
    assert sig == pytest.approx(float(sigmoid(yk - yj)), rel=1e-14, abs=1e-300)
    assert lp == pytest.approx(float(softplus(yk - yj)), rel=1e-14, abs=1e-300)


@settings(max_examples=25)
@given(st.integers(1, 70), st.floats(-290, 290), st.floats(0.01, 290), st.integers(0, 2**32 - 1))
def test_pairs_block_shifted_matches_oracle(cnt, yj, spread, seed):
    """The shifted-exp block form against the stable oracle, for scores within the limit."""
    rng = np.random.default_rng(seed)
    c = 0.0
    yb = np.clip(yj + rng.uniform(-spread, spread, size=cnt), -K.SHIFT_LIMIT, K.SHIFT_LIMIT)
    eb, eib = np.exp(yb - c), np.exp(c - yb)
    bb = np.zeros(cnt)
    ssum, lsum = K.pairs_block_shifted(yj, math.exp(yj - c), math.exp(c - yj), yb, eb, eib,
                                       bb, cnt)
    x = yj - yb
    want_sig = sigmoid(-x)
    want_loss = softplus(-x)
    # the shifted arguments carry |ŷ − c|·2⁻⁵³ absolute error into the exponentials
    rtol = 1e-15 * (10 + np.max(np.abs(np.append(yb, yj))))
    np.testing.assert_allclose(bb, want_sig, rtol=rtol, atol=1e-300)
    assert ssum == pytest.approx(want_sig.sum(), rel=rtol)
    assert lsum == pytest.approx(want_loss.sum(), rel=rtol, abs=1e-300)


def test_sum_squares_float32_accumulates_in_float64():
    x = np.full(1 << 20, 1e-3, dtype=np.float32)
    want = float(np.sum(x.astype(np.float64) ** 2))
    assert K.sum_squares(x) == pytest.approx(want, rel=1e-12)


def test_schedule_balances_and_covers_every_row():
    costs = np.array([10.0, 1.0, 1.0, 1.0, 9.0, 2.0, 0.5])
    ptr, rows = K.schedule(costs, 2)
    assert sorted(rows.tolist()) == list(range(costs.size))
    loads = [costs[rows[ptr[w] : ptr[w + 1]]].sum() for w in range(2)]
    assert max(loads) - min(loads) <= costs.max()
    assert np.array_equal(K.schedule(costs, 2)[1], rows)  # deterministic
    ptr1, rows1 = K.schedule(costs, 8)  # more workers than rows
    assert ptr1.size == costs.size + 1 and sorted(rows1.tolist()) == list(range(costs.size))
    ptr0, rows0 = K.schedule(np.zeros(0), 2)
    assert rows0.size == 0 and ptr0.tolist() == [0, 0]
    # a batch too small to share: one worker (computed on the calling thread)
    assert K.schedule(costs, 2, min_cost=costs.sum())[0].size == 2
    assert K.schedule(costs, 2, min_cost=costs.sum() / 2)[0].size == 3
