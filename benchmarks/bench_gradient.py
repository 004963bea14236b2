"""Per-client BPR gradient on real citeulike-a clients: NumPy oracle vs Numba.

The round loop computes the gradients of about 55 clients per round
(citeulike-a, e = 0.01 of 5,551 clients; n_items = 16,980, d = 64,
D = 2,173,440 for FISM) in float32 with exact negatives. This script times, in
one run and on the same clients:

- the oracle (``backend="numpy"``, one client at a time): the baseline;
- the Numba kernel on one client at a time;
- the Numba kernel on the whole batch (parallel over clients).

and prints ms per client and the speedup over the oracle. Each figure is the
minimum over ``--repeat`` runs (the median is printed beside it), so a noisy,
shared machine inflates the median more than the minimum.

    RFRS_DATA_DIR=/path/to/data python benchmarks/bench_gradient.py
    python benchmarks/bench_gradient.py --model fmf --clients 55 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import rfrs_ref.kernels  # noqa: F401  (picks Numba's threading layer, as training does)
from rfrs_ref.data import load_dataset, split_interactions
from rfrs_ref.model import MODELS
from rfrs_ref.seeding import generator

from machine import describe


def timed(fn, repeat: int) -> tuple[float, float]:
    """(min, median) wall time of fn() over ``repeat`` calls, in seconds."""
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), statistics.median(ts)


def copy_floor(n_params: int, dtype, repeat: int) -> float:
    """Seconds to read θ and write one output row (D entries each) at the copy bandwidth
    measured now (np.copyto between pre-touched arrays): a client's gradient cannot be
    faster, since every entry of its row depends on θ."""
    src = np.ones(n_params, dtype)
    dst = np.zeros(n_params, dtype)
    t, _ = timed(lambda: np.copyto(dst, src), repeat)
    return t


def bench(model, train, clients, dtype, repeat: int, oracle_clients: int) -> list[tuple]:
    rng = np.random.default_rng(0)
    theta = model.init_params(rng, 1.0, dtype)
    n = clients.size
    out = np.empty((n, model.n_params()), dtype)
    kw, kw1 = {}, {}
    if model.has_private:
        U = model.private_init(train.n_users, rng, 1.0, dtype)
        kw = dict(private=U, private_out=np.empty((n, model.dim), dtype))
        kw1 = dict(private=U, private_out=np.empty((1, model.dim), dtype))

    # compile (or load from cache) outside the timings
    model.grads_batch(theta, train, clients[:1], out[:1], **kw1)

    k = min(oracle_clients, n)
    sub = clients[:k]

    def oracle():
        for c in sub:
            model.grads_batch(theta, train, np.array([c]), out[:1], backend="numpy", **kw1)

    def single():
        for c in sub:
            model.grads_batch(theta, train, np.array([c]), out[:1], **kw1)

    def batch():
        model.grads_batch(theta, train, clients, out, **kw)

    rows = []
    o_min, o_med = timed(oracle, max(1, repeat // 2))
    base = o_min / k
    rows.append(("numpy oracle", k, base, o_med / k, 1.0))
    s_min, s_med = timed(single, repeat)
    rows.append(("numba, 1 client", k, s_min / k, s_med / k, base / (s_min / k)))
    b_min, b_med = timed(batch, repeat)
    rows.append((f"numba, batch of {n}", n, b_min / n, b_med / n, base / (b_min / n)))
    rows.append((f"  (whole batch of {n})", n, b_min, b_med, float("nan")))
    floor = copy_floor(model.n_params(), dtype, repeat)
    rows.append(("  (memory floor, 1 thread)", 1, floor, floor, float("nan")))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["fism", "fmf", "all"], default="fism")
    ap.add_argument("--dataset", default="citeulike-a")
    ap.add_argument("--clients", type=int, default=55, help="batch size (clients per round)")
    ap.add_argument("--oracle-clients", type=int, default=10,
                    help="clients timed one by one (oracle and numba single)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    data = load_dataset(args.dataset, download=False)
    train = split_interactions(data, args.seed).train
    # the clients of round 1, drawn as the round loop draws them
    clients = np.sort(generator(args.seed, "sampling", 1).choice(
        train.n_users, size=min(args.clients, train.n_users), replace=False)).astype(np.int64)
    counts = train.counts()[clients]

    print(f"dataset {args.dataset}: {train.n_users} clients, {train.n_items} items; "
          f"batch of {clients.size} clients, training items per client: mean "
          f"{counts.mean():.1f}, max {counts.max()}")
    print(describe())
    names = ["fism", "fmf"] if args.model == "all" else [args.model]
    header = f"{'model':6} {'dtype':8} {'path':24} {'clients':>7} {'ms/client':>10} " \
             f"{'(median)':>9} {'speedup':>8}"
    print(header)
    print("-" * len(header))
    for name in names:
        model = MODELS.get(name)(train.n_items, dim=args.dim)
        for dtype in (np.float32, np.float64):
            for path, k, t_min, t_med, speed in bench(model, train, clients, dtype, args.repeat,
                                                      args.oracle_clients):
                sp = "" if np.isnan(speed) else f"{speed:7.1f}x"
                print(f"{name:6} {np.dtype(dtype).name:8} {path:24} {k:7d} "
                      f"{t_min * 1e3:10.2f} {t_med * 1e3:9.2f} {sp:>8}")
    print("ms/client: minimum over the repeats (median in brackets); speedup over the "
          "oracle measured in this run. '(whole batch)' rows are ms per batch; the memory "
          "floor is one copy of D entries (read θ, write a row) at this machine's measured "
          "single-thread copy bandwidth.")


if __name__ == "__main__":
    main()
