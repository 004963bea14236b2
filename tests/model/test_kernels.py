"""The fast path (``backend="numba"``) against the oracle (``backend="numpy"``).

Tolerances: the kernels compute in float64 whatever the input dtype, so
- float64: the kernel and the oracle differ by rounding only, accumulated
  over sums of up to n_items terms: 1e-10 relative (plus 1e-12 of the row's
  largest entry for entries that are sums of cancelling terms);
- float32: the same float64 arithmetic on the same float32 values of θ, then
  one rounding of each gradient entry to float32 on the store: 2⁻²³ relative
  (one float32 ulp, twice the round-to-nearest bound) plus the float64 term.
Losses are float64 in both cases: 1e-10 relative.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.model import FISM, FMF

RTOL = {np.float64: 1e-10, np.float32: 2.0**-23}
SCALE_TOL = 1e-12


@pytest.fixture(scope="module", autouse=True)
def parallel_even_for_small_batches():
    """The batches here are far below the work that justifies a second thread;
    lift the threshold so that the parallel drivers are the ones tested."""
    import rfrs_ref.kernels.fism as K

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(K, "MIN_WORKER_COST", 0.0)
        yield


@st.composite
def batch_cases(draw):
    n_items = draw(st.integers(2, 160))
    dim = draw(st.sampled_from([1, 3, 8, 17]))
    n_clients = draw(st.integers(1, 5))
    sizes = [draw(st.sampled_from([0, 1, 2, n_items - 1, n_items, None]))
             for _ in range(n_clients)]
    sizes = [draw(st.integers(1, n_items)) if k is None else k for k in sizes]
    return dict(
        n_items=n_items, dim=dim, sizes=sizes,
        gamma=draw(st.sampled_from([0.0, 0.5, 1.0])),
        lam=draw(st.sampled_from([0.0, 1e-3])),
        n_neg=draw(st.sampled_from([0, 0, 1, 4])),
        dtype=draw(st.sampled_from([np.float32, np.float64])),
        scale=draw(st.sampled_from([0.1, 1.0, 3.0])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def _setup(mt, case, model_cls):
    rng = np.random.default_rng(case["seed"])
    lists = mt.random_lists(rng, case["n_items"], case["sizes"])
    train = mt.interactions(case["n_items"], lists)
    kw = dict(dim=case["dim"], lam=case["lam"], negatives=case["n_neg"])
    if model_cls is FISM:
        kw["gamma"] = case["gamma"]
    m = model_cls(case["n_items"], **kw)
    theta = m.init_params(rng, case["scale"], case["dtype"])
    clients = rng.permutation(train.n_users)
    negatives = None
    if case["n_neg"]:
        negatives = [m.sample_negatives(train.items_of(c), rng) for c in clients]
    return rng, train, m, theta, clients, negatives


def _both(m, theta, train, clients, negatives, U=None):
    """(losses, out, private_out) of the numba and numpy backends."""
    res = []
    for backend in ("numba", "numpy"):
        out = np.full((clients.size, m.n_params()), np.nan, dtype=theta.dtype)
        kw = {}
        if U is not None:
            kw = dict(private=U, private_out=np.full((clients.size, m.dim), np.nan, U.dtype))
        losses = m.grads_batch(theta, train, clients, out, negatives=negatives,
                               backend=backend, **kw)
        res.append((losses, out, kw.get("private_out")))
    return res


@settings(max_examples=30)
@given(batch_cases())
def test_fism_numba_matches_oracle(mt, case):
    _, train, m, theta, clients, negatives = _setup(mt, case, FISM)
    (l_nb, g_nb, _), (l_np, g_np, _) = _both(m, theta, train, clients, negatives)
    np.testing.assert_allclose(l_nb, l_np, rtol=1e-10)
    for r in range(clients.size):
        mt.assert_grad_close(g_nb[r], g_np[r], RTOL[case["dtype"]], SCALE_TOL)


@settings(max_examples=30)
@given(batch_cases())
def test_fmf_numba_matches_oracle(mt, case):
    rng, train, m, theta, clients, negatives = _setup(mt, case, FMF)
    U = m.private_init(train.n_users, rng, case["scale"], case["dtype"])
    (l_nb, g_nb, p_nb), (l_np, g_np, p_np) = _both(m, theta, train, clients, negatives, U)
    np.testing.assert_allclose(l_nb, l_np, rtol=1e-10)
    for r in range(clients.size):
        mt.assert_grad_close(g_nb[r], g_np[r], RTOL[case["dtype"]], SCALE_TOL)
        mt.assert_grad_close(p_nb[r], p_np[r], RTOL[case["dtype"]], SCALE_TOL)


def _mixed_scale_theta(m, rng, dtype, big):
    """θ ~ N(0, 1) with a few rows of P scaled by ``big``: some negatives' scores fall
    outside the shifted-exp range (their block uses the direct form), others not."""
    theta = rng.normal(size=m.n_params())
    P = theta[: m.n_items * m.dim].reshape(m.n_items, m.dim)
    P[rng.choice(m.n_items, size=5, replace=False)] *= big
    return theta.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("big", [30.0, 1e3, 1e6])
@pytest.mark.parametrize("model_cls", [FISM, FMF])
def test_numba_matches_oracle_across_the_shift_limit(mt, dtype, big, model_cls):
    rng = np.random.default_rng(11)
    n_items = 300
    train = mt.interactions(n_items, mt.random_lists(rng, n_items, [1, 3, 40, 150]))
    m = model_cls(n_items, dim=6, lam=1e-3)
    theta = _mixed_scale_theta(m, rng, dtype, big)
    clients = np.arange(train.n_users)
    U = m.private_init(train.n_users, rng, 1.0, dtype) if m.has_private else None
    (l_nb, g_nb, p_nb), (l_np, g_np, p_np) = _both(m, theta, train, clients, None, U)
    np.testing.assert_allclose(l_nb, l_np, rtol=1e-10)
    for r in range(clients.size):
        mt.assert_grad_close(g_nb[r], g_np[r], RTOL[dtype], SCALE_TOL)
        if U is not None:
            mt.assert_grad_close(p_nb[r], p_np[r], RTOL[dtype], SCALE_TOL)


@pytest.mark.parametrize("scale", [1e6, 1e15])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("model_cls", [FISM, FMF])
def test_huge_parameters_give_finite_results(mt, dtype, model_cls, scale):
    """θ entries of 1e6 (scores ~1e13) or 1e15 (scores ~1e31): finite losses and
    gradients on both backends, and the same values."""
    rng = np.random.default_rng(12)
    n_items = 200
    train = mt.interactions(n_items, mt.random_lists(rng, n_items, [1, 10, 100, 199]))
    m = model_cls(n_items, dim=8, lam=1e-4)
    theta = (rng.choice([-1.0, 1.0], size=m.n_params()) * scale).astype(dtype)
    U = (rng.choice([-1.0, 1.0], size=(train.n_users, 8)) * scale).astype(dtype) \
        if m.has_private else None
    clients = np.arange(train.n_users)
    (l_nb, g_nb, p_nb), (l_np, g_np, p_np) = _both(m, theta, train, clients, None, U)
    for x in (l_nb, g_nb, l_np, g_np) + ((p_nb, p_np) if U is not None else ()):
        assert np.all(np.isfinite(x))
    np.testing.assert_allclose(l_nb, l_np, rtol=1e-10)
    for r in range(clients.size):
        mt.assert_grad_close(g_nb[r], g_np[r], RTOL[dtype], SCALE_TOL)


@pytest.mark.parametrize("n_neg", [0, 3])
@pytest.mark.parametrize("model_cls", [FISM, FMF])
def test_rows_are_deterministic_and_independent_of_the_batch(mt, n_neg, model_cls):
    rng = np.random.default_rng(13)
    n_items = 250
    train = mt.interactions(n_items, mt.random_lists(rng, n_items, [5, 90, 1, 200, 17, 3]))
    m = model_cls(n_items, dim=9, lam=1e-3, negatives=n_neg)
    theta = m.init_params(rng, 1.0, np.float32)
    U = m.private_init(train.n_users, rng, 1.0, np.float32) if m.has_private else None
    negs = {c: m.sample_negatives(train.items_of(c), rng) for c in range(train.n_users)}

    def run(clients):
        clients = np.asarray(clients)
        out = np.empty((clients.size, m.n_params()), np.float32)
        kw = dict(private=U, private_out=np.empty((clients.size, 9), np.float32)) \
            if U is not None else {}
        neg = [negs[c] for c in clients] if n_neg else None
        losses = m.grads_batch(theta, train, clients, out, negatives=neg, **kw)
        return losses, out, kw.get("private_out")

    full = run([0, 1, 2, 3, 4, 5])
    again = run([0, 1, 2, 3, 4, 5])
    for a, b in zip(full, again):
        assert a is None or np.array_equal(a, b)
    for order in ([3], [5, 3, 0], [3, 3, 1]):
        part = run(order)
        for k, c in enumerate(order):
            assert part[0][k] == full[0][c]
            assert np.array_equal(part[1][k], full[1][c])
            if U is not None:
                assert np.array_equal(part[2][k], full[2][c])


def test_inputs_are_not_modified(mt):
    rng = np.random.default_rng(14)
    train = mt.interactions(70, mt.random_lists(rng, 70, [3, 9]))
    m = FMF(70, dim=4, negatives=2)
    theta = m.init_params(rng, 1.0, np.float64)
    U = m.private_init(2, rng, 1.0, np.float64)
    negs = [m.sample_negatives(train.items_of(c), rng) for c in (0, 1)]
    before = [theta.copy(), U.copy(), train.indices.copy()] + [x.copy() for x in negs]
    out = np.empty((2, m.n_params()))
    m.grads_batch(theta, train, [0, 1], out, negatives=negs, private=U,
                  private_out=np.empty((2, 4)))
    for b, a in zip(before, [theta, U, train.indices] + negs):
        assert np.array_equal(a, b)


def test_batch_arguments_are_checked(mt):
    rng = np.random.default_rng(15)
    train = mt.interactions(20, mt.random_lists(rng, 20, [3, 4]))
    m = FISM(20, dim=2)
    theta = m.init_params(rng, 1.0, np.float32)
    good = np.empty((2, m.n_params()), np.float32)
    with pytest.raises(ValueError, match="dtype"):
        m.grads_batch(theta, train, [0, 1], np.empty((2, m.n_params()), np.float64))
    with pytest.raises(ValueError, match="expected"):
        m.grads_batch(theta, train, [0, 1], np.empty((3, m.n_params()), np.float32))
    with pytest.raises(ValueError, match="out of range"):
        m.grads_batch(theta, train, [0, 2], good)
    with pytest.raises(ValueError, match="backend"):
        m.grads_batch(theta, train, [0, 1], good, backend="gpu")
    with pytest.raises(ValueError, match="none were given"):
        FISM(20, dim=2, negatives=3).grads_batch(theta, train, [0, 1], good)
    with pytest.raises(ValueError, match="mixes"):
        m.grads_batch(theta, train, [0, 1], good,
                      negatives=[None, np.zeros((4, 1), np.int32)])
    with pytest.raises(ValueError, match="S⁻"):
        m.grads_batch(theta, train, [0, 1], good,
                      negatives=[np.full((3, 1), train.items_of(0)[0]),
                                 np.zeros((4, 0), np.int32)])
    with pytest.raises(ValueError, match="n_items"):
        m.grads_batch(theta, mt.interactions(21, [[1]]), [0], good[:1])
    fmf = FMF(20, dim=2)
    with pytest.raises(ValueError, match="private_out"):
        fmf.grads_batch(fmf.init_params(rng), train, [0], np.empty((1, 40), np.float32),
                        private=np.zeros((2, 2), np.float32))


def test_empty_batch(mt):
    train = mt.interactions(10, [[1, 2]])
    m = FISM(10, dim=2)
    theta = np.zeros(m.n_params(), np.float32)
    losses = m.grads_batch(theta, train, np.zeros(0, np.int64),
                           np.empty((0, m.n_params()), np.float32))
    assert losses.shape == (0,)


@pytest.mark.parametrize("model_cls", [FISM, FMF])
def test_rows_do_not_depend_on_the_number_of_threads(mt, model_cls):
    import numba

    rng = np.random.default_rng(16)
    train = mt.interactions(120, mt.random_lists(rng, 120, [4, 60, 1, 30, 9]))
    m = model_cls(120, dim=5, lam=1e-3)
    theta = m.init_params(rng, 1.0, np.float64)
    U = m.private_init(train.n_users, rng, 1.0, np.float64) if m.has_private else None
    clients = np.arange(train.n_users)
    results = []
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, before}):
            numba.set_num_threads(threads)
            # one worker runs on the calling thread, several run the parallel driver
            assert m._schedule(train, clients)[0].size == 1 + min(threads, clients.size)
            out = np.empty((clients.size, m.n_params()))
            kw = dict(private=U, private_out=np.empty((clients.size, 5))) if U is not None \
                else {}
            losses = m.grads_batch(theta, train, clients, out, **kw)
            results.append((losses, out, kw.get("private_out")))
    finally:
        numba.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert a is None or np.array_equal(a, b)


def test_cuda_backend_runs_the_numba_kernels(mt):
    rng = np.random.default_rng(17)
    train = mt.interactions(40, mt.random_lists(rng, 40, [3, 8]))
    m = FISM(40, dim=3)
    theta = m.init_params(rng, 1.0, np.float32)
    a, b = (np.empty((2, m.n_params()), np.float32) for _ in range(2))
    la = m.grads_batch(theta, train, [0, 1], a, backend="cuda")
    lb = m.grads_batch(theta, train, [0, 1], b, backend="numba")
    assert np.array_equal(a, b) and np.array_equal(la, lb)
    np.testing.assert_array_equal(m.scores(theta, train, [1], backend="cuda"),
                                  m.scores(theta, train, [1], backend="numba"))


@settings(max_examples=30)
@given(batch_cases(), st.integers(0, 2**32 - 1), st.sampled_from(["numba", "numpy"]))
def test_fism_q_rows_are_the_full_rows_bit_for_bit(mt, case, extra_seed, backend):
    """``grads_batch(q_rows=)`` writes the p half and the chosen q rows with the bits of
    the full rows, and every other q row of every client is ``shared_gradient``'s."""
    _, train, m, theta, clients, negatives = _setup(mt, case, FISM)
    full = np.empty((clients.size, m.n_params()), dtype=theta.dtype)
    want = m.grads_batch(theta, train, clients, full, negatives=negatives, backend=backend)
    owned = np.zeros(m.n_items, dtype=bool)
    for c in clients:
        owned[train.items_of(c)] = True
    extra = np.random.default_rng(extra_seed).random(m.n_items) < 0.2
    q_rows = np.flatnonzero(owned | extra)
    nd, d = m.n_items * m.dim, m.dim
    out = np.full((clients.size, nd), np.nan, dtype=theta.dtype)
    out_q = np.full((clients.size, q_rows.size * d), np.nan, dtype=theta.dtype)
    got = m.grads_batch(theta, train, clients, out, negatives=negatives, backend=backend,
                        q_rows=q_rows, out_q=out_q)
    np.testing.assert_array_equal(got, want)
    fullq = full[:, nd:].reshape(clients.size, m.n_items, d)
    assert out.tobytes() == np.ascontiguousarray(full[:, :nd]).tobytes()
    assert out_q.tobytes() == np.ascontiguousarray(fullq[:, q_rows]).tobytes()
    shared = m.shared_gradient(theta).reshape(m.n_items, d)
    for r, c in enumerate(clients):
        others = np.ones(m.n_items, dtype=bool)
        others[train.items_of(c)] = False
        assert fullq[r][others].tobytes() == shared[others].tobytes()


def test_fism_q_rows_must_hold_every_clients_items(mt):
    train = mt.interactions(6, [np.array([0, 2]), np.array([3])])
    m = FISM(6, dim=2)
    theta = m.init_params(np.random.default_rng(0), 0.1, np.float32)
    out = np.empty((2, 12), np.float32)
    with pytest.raises(ValueError, match="client 1 has items outside"):
        m.grads_batch(theta, train, np.array([0, 1]), out, q_rows=np.array([0, 2]),
                      out_q=np.empty((2, 4), np.float32))
    with pytest.raises(ValueError, match="sorted unique"):
        m.grads_batch(theta, train, np.array([0, 1]), out, q_rows=np.array([3, 2, 0]),
                      out_q=np.empty((2, 6), np.float32))
