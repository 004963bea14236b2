"""``rfrs_ref.kernels.optim.add_shared_rows``, the weighted sums of the rows a streamed
round computes once (FISM's Q rows outside the clients' items): the sums of the whole
rows, bit for bit."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.aggregate.combine import add_rows_inplace
from rfrs_ref.kernels.optim import add_shared_rows


def _case(data):
    m = data.draw(st.integers(1, 9), label="m")
    start = data.draw(st.integers(0, 40), label="start")
    n_rows = data.draw(st.integers(1, 12), label="n_rows")
    width = data.draw(st.integers(1, 5), label="width")
    owned = np.array(data.draw(st.lists(st.booleans(), min_size=n_rows, max_size=n_rows)),
                     dtype=bool)
    classes = data.draw(st.integers(1, 2), label="classes")
    cls = np.array(data.draw(st.lists(st.integers(0, classes - 1), min_size=m, max_size=m)),
                   dtype=np.int64)
    dtype = data.draw(st.sampled_from([np.float32, np.float64]), label="dtype")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    R = np.flatnonzero(owned)
    head = rng.standard_normal((m, start)).astype(dtype)
    own = rng.standard_normal((m, R.size * width)).astype(dtype)
    shared = rng.standard_normal((classes, n_rows * width)).astype(dtype)
    # the whole rows: the head, the class's shared row, the client's own values on R
    whole = np.empty((m, start + n_rows * width), dtype=dtype)
    whole[:, :start] = head
    whole[:, start:] = shared[cls]
    whole[:, start:].reshape(m, n_rows, width)[:, R] = own.reshape(m, R.size, width)
    pos = np.full(n_rows, -1, dtype=np.int64)  # R's rows: their place in a client's own part
    pos[R] = np.arange(R.size)
    return head, own, shared, cls, pos, width, R, whole


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_add_shared_rows_sums_as_the_whole_rows_do(data):
    """Weights with zeros among them (rows given no weight): the rows that no client owns,
    summed from the shared rows (one row per class of client), take the bits of
    ``add_rows_inplace`` on the whole rows, one call over every row."""
    head, own, shared, cls, pos, width, R, whole = _case(data)
    m = whole.shape[0]
    start = head.shape[1]
    w = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.25, 1 / 3, 2.0, 1e-3]),
                                    min_size=m, max_size=m)))
    want = np.zeros(whole.shape[1])
    add_rows_inplace(whole, w, want)
    got = np.zeros(whole.shape[1])
    others = np.flatnonzero(pos < 0)
    add_shared_rows(shared, cls, w, np.array([0, m], dtype=np.int64), others, width,
                    got[start:])
    n_rows = pos.size
    mine = got[start:].reshape(n_rows, width)
    assert np.array_equal(mine[others].view(np.uint8),
                          want[start:].reshape(n_rows, width)[others].view(np.uint8))
