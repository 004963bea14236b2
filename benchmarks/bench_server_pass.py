"""The server's one pass against verify-then-combine, for the weighted mean.

For each optimiser: 55 honest upload rows of D = 2,173,440 float32 (a citeulike-a
round), the server state, weights nᵢ/Σnⱼ. Times (best of --repeat, the variants
interleaved) of

- the two passes the round made before: the screened verification, then the
  weighted sums of every uploaded array (``combine_rows``), each reading every upload;
- ``Optimizer.screen_sum_batch``: both in one read of the uploads (one call);
- the same by batches of 16 rows into float64 running sums, as a streamed round does;
- the one pass with the float64 screen alone (``screen32=False``), against which the
  screen's float32 test (Adam, AdaGrad, RMSProp) is measured.

All give the same sums and sure rows bit for bit (checked here too).

Usage: python benchmarks/bench_server_pass.py [--n 55] [--dim 2173440] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from machine import describe


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=55)
    ap.add_argument("--dim", type=int, default=2_173_440)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    print(describe())

    from rfrs_ref.aggregate.combine import combine_rows
    from rfrs_ref.optim import OPTIMIZERS

    n, D = args.n, args.dim
    rng = np.random.default_rng(0)
    print(f"n = {n}, D = {D:,}, float32; ms, best of {args.repeat}")
    print(f"{'optimiser':<10} {'two passes':>11} {'one pass':>10} {'×':>6} {'by 16 rows':>11} {'×':>6} "
          f"{'one pass, float64 screen':>25} {'×':>6}")
    for name in OPTIMIZERS.names():
        opt = OPTIMIZERS.get(name)()
        state = opt.init((0.1 * rng.standard_normal(D)).astype(np.float32))
        for k in state:
            if k != "theta":
                state[k] = (1e-3 * np.abs(rng.standard_normal(D))).astype(np.float32)
        G = (1e-2 * rng.standard_normal((n, D))).astype(np.float32)
        U = {k: np.empty((n, D), np.float32) for k in opt.arrays}
        opt.client_rule_batch(state, G, 3, U)
        del G
        w = rng.integers(1, 50, n).astype(np.float64)
        w /= w.sum()
        best = np.full(4, np.inf)
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            ok = opt.verify_batch(state, U, 3, screen=True)[0]
            two = {k: combine_rows(U[k], w) for k in opt.arrays}
            t1 = time.perf_counter()
            sure, one = opt.screen_sum_batch(state, U, 3, w)
            t2 = time.perf_counter()
            acc = {k: np.zeros(D) for k in opt.arrays}
            for lo in range(0, n, 16):
                opt.screen_sum_batch(state, {k: v[lo:lo + 16] for k, v in U.items()}, 3,
                                     w[lo:lo + 16], into=acc)
            t3 = time.perf_counter()
            sure64, one64 = opt.screen_sum_batch(state, U, 3, w, screen32=False)
            t4 = time.perf_counter()
            best = np.minimum(best, [t1 - t0, t2 - t1, t3 - t2, t4 - t3])
        assert ok.all() and sure.all() and sure64.all()
        for k in opt.arrays:
            assert np.array_equal(two[k].view(np.uint32), one[k].view(np.uint32))
            assert np.array_equal(one64[k].view(np.uint32), one[k].view(np.uint32))
            assert np.array_equal(two[k].view(np.uint32), acc[k].astype(np.float32).view(np.uint32))
        ms = best * 1e3
        print(f"{name:<10} {ms[0]:>11.1f} {ms[1]:>10.1f} {ms[0] / ms[1]:>6.2f} {ms[2]:>11.1f} "
              f"{ms[0] / ms[2]:>6.2f} {ms[3]:>25.1f} {ms[3] / ms[1]:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
