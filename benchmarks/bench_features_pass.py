"""The server's one read of the uploads for a robust rule, against recovery then verification.

For each optimiser and detection space: 55 honest upload rows of D = 2,173,440
float32 (a citeulike-a round), the server state. Times (best of --repeat, the
variants interleaved) of

- the passes the round made before: in gradient space the recovery of every ĝ into
  the feature rows (``recover_batch``), then the screened verification reading the
  uploads and those rows again; in parameter space the screened verification, then
  the features θ − θ̄ (a NumPy subtraction reading θ again);
- ``Optimizer.features_verify_batch``: the features and the screen in one read of the
  uploads, with the screen's float32 test (the round's) and with the float64 screen
  alone (``screen32=False``).

All give the same features and verdicts bit for bit (checked here too).

A second table times the robust rules on those features and Adam's three uploaded
arrays, as the round calls them before and after it told them that its verified
uploads are finite (a plain mapping, whose every array the rule reads once more
for NaN and ±inf, against ``FiniteUploads``, whose features alone are read): the
same results bit for bit (checked).

Usage: python benchmarks/bench_features_pass.py [--n 55] [--dim 2173440] [--repeat 5]
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
    ap.add_argument("--optimizers", default="", help="comma-separated names (default: all)")
    ap.add_argument("--rules", default="krum,rfa,bulyan",
                    help="rules of the second table (empty: none)")
    args = ap.parse_args(argv)
    print(describe())

    from rfrs_ref.optim import OPTIMIZERS

    n, D = args.n, args.dim
    rng = np.random.default_rng(0)
    names = args.optimizers.split(",") if args.optimizers else OPTIMIZERS.names()
    print(f"n = {n}, D = {D:,}, float32; ms, best of {args.repeat}")
    print(f"{'optimiser':<10} {'space':<10} {'two passes':>11} {'one read':>10} {'×':>6} "
          f"{'one read, float64 screen':>25} {'×':>6}")
    for name in names:
        opt = OPTIMIZERS.get(name)()
        state = opt.init((0.1 * rng.standard_normal(D)).astype(np.float32))
        for k in state:
            if k != "theta":
                state[k] = (1e-3 * np.abs(rng.standard_normal(D))).astype(np.float32)
        G = (1e-2 * rng.standard_normal((n, D))).astype(np.float32)
        U = {k: np.empty((n, D), np.float32) for k in opt.arrays}
        opt.client_rule_batch(state, G, 3, U)
        del G
        X1 = np.ones((n, D), np.float32)
        X2 = np.ones((n, D), np.float32)
        for space in ("gradient", "parameter"):
            best = np.full(3, np.inf)
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                if space == "gradient":
                    opt.recover_batch(state, U, 3, X1)
                    ok1 = opt.verify_batch(state, U, 3, recovered=X1, screen=True)[0]
                else:
                    ok1 = opt.verify_batch(state, U, 3, screen=True)[0]
                    np.subtract(U["theta"], state["theta"], out=X1)
                t1 = time.perf_counter()
                ok2 = opt.features_verify_batch(state, U, 3, X2, space)[0]
                t2 = time.perf_counter()
                ok3 = opt.features_verify_batch(state, U, 3, X2, space, screen32=False)[0]
                t3 = time.perf_counter()
                best = np.minimum(best, [t1 - t0, t2 - t1, t3 - t2])
            assert ok1.all() and ok2.all() and ok3.all()
            assert np.array_equal(X1.view(np.uint32), X2.view(np.uint32))
            ms = best * 1e3
            print(f"{name:<10} {space:<10} {ms[0]:>11.1f} {ms[1]:>10.1f} {ms[0] / ms[1]:>6.2f} "
                  f"{ms[2]:>25.1f} {ms[2] / ms[1]:>6.2f}", flush=True)
        if name == "adam":
            opt.recover_batch(state, U, 3, X2)  # the gradient features
            adam = (state, U, X2)
        else:
            del U, X1, X2
    if args.rules and "adam" in names:
        rules_table(*adam, args)


def rules_table(state, U, X, args) -> None:
    from rfrs_ref.aggregate import RULES
    from rfrs_ref.aggregate.base import FiniteUploads

    n = X.shape[0]
    f = int(0.4 * n)
    ns = np.random.default_rng(1).integers(1, 100, n)
    print(f"\nrules on the gradient features and Adam's uploads (m, v, θ), f = {f}; ms, best of "
          f"{args.repeat}")
    print(f"{'rule':<10} {'plain':>11} {'finite':>10} {'×':>6}")
    for name in args.rules.split(","):
        rule = RULES.get(name)(**({"fallback": "reduce-f"} if name == "bulyan" else {}))
        best = np.full(2, np.inf)
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            a = rule.aggregate(X, dict(U), ns, f)
            t1 = time.perf_counter()
            b = rule.aggregate(X, FiniteUploads(U), ns, f)
            t2 = time.perf_counter()
            best = np.minimum(best, [t1 - t0, t2 - t1])
        for k in U:
            assert np.array_equal(a.arrays[k].view(np.uint32), b.arrays[k].view(np.uint32))
        ms = best * 1e3
        print(f"{name:<10} {ms[0]:>11.1f} {ms[1]:>10.1f} {ms[0] / ms[1]:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
