"""Throughput of the optimisers' client rule and recovery: fused kernels vs NumPy.

One round of citeulike-a by default: D = 2 · 16,980 · 64 = 2,173,440 parameters,
55 client rows, float32. For every optimiser the script times

- the client rule (gradients -> uploads) and the server's recovery (uploads ->
  gradients), with the fused Numba kernels (``backend="numba"``) and with plain
  NumPy expressions on the same float32 arrays (what one would write without a
  kernel: ``out["m"][...] = b1 * m_bar + (1 - b1) * G`` ...);
- the fused update-rule verification (informative, no NumPy counterpart), exact
  and screened, and the screen with its float32 test against the float64 screen
  alone (``screen32=False``; the same sure rows), given the recovered rows and
  recovering ĝ in registers;
- the float32 test alone (``kernels.optim.adam_unsure32`` / ``root_unsure32``)
  reducing each block by OR, as the screen kernels do, against counting its
  coordinates in int64 (the kernels' reduction before: the int64 lanes held the
  loop to four float32 lanes a vector);

and reports effective bandwidth: the bytes each operation must move at least
(every input row read once, every output row written once, the state read
once) divided by the best time. The baseline is the machine's copy bandwidth
measured in the same run: ``np.copyto`` between two preallocated, pre-touched
(n, D) float32 arrays, counted as read + write.

Every buffer is allocated and touched before timing (first-touch page faults
cost more than the arithmetic); NumPy's temporaries are allocated by NumPy as
they would be in real use.

Usage: python benchmarks/bench_optim.py [--rows 55] [--dim 2173440] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import rfrs_ref.kernels  # noqa: F401  (picks Numba's threading layer, as training does)
from rfrs_ref.kernels import optim as K
from rfrs_ref.optim import OPTIMIZERS, VERIFY_SAFETY
from rfrs_ref.optim import screen32 as S32


def best_times(fns: dict, repeat: int) -> dict:
    """Best time of each function, the functions timed in turn within every repetition.

    Interleaving gives every variant the same chances of a quiet moment on a
    shared machine; the best of the repetitions estimates the uncontended time.
    """
    for fn in fns.values():
        fn()  # warm-up (compilation, caches)
    best = {k: np.inf for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def numpy_rule(opt, state, G, t, out):
    """Plain NumPy expressions of the client rule, in the arrays' dtype."""
    tb = state["theta"]
    if opt.name == "sgd":
        out["theta"][...] = tb - opt.lr * G
    elif opt.name == "momentum":
        out["m"][...] = opt.beta3 * state["m"] + G
        out["theta"][...] = tb - opt.lr * out["m"]
    elif opt.name == "adam":
        out["m"][...] = opt.beta1 * state["m"] + (1 - opt.beta1) * G
        out["v"][...] = opt.beta2 * state["v"] + (1 - opt.beta2) * G * G
        out["theta"][...] = tb - opt.step_size(t) * out["m"] / (np.sqrt(out["v"]) + opt.eps)
    else:
        decay, coef = opt._decay_coef()
        out["r"][...] = decay * state["r"] + coef * G * G
        out["theta"][...] = tb - opt.lr * G / (np.sqrt(out["r"]) + opt.eps)


def numpy_recover(opt, state, U, t, X):
    """Plain NumPy expressions of the recovery."""
    if opt.name == "sgd":
        X[...] = (state["theta"] - U["theta"]) / opt.lr
    elif opt.name == "momentum":
        X[...] = U["m"] - opt.beta3 * state["m"]
    elif opt.name == "adam":
        X[...] = (U["m"] - opt.beta1 * state["m"]) / (1 - opt.beta1)
    else:
        X[...] = (state["theta"] - U["theta"]) * (np.sqrt(U["r"]) + opt.eps) / opt.lr


#: upload arrays the recovery reads
RECOVERY_READS = {"sgd": ("theta",), "momentum": ("m",), "adam": ("m",),
                  "adagrad": ("r", "theta"), "rmsprop": ("r", "theta")}
#: state arrays the recovery reads
RECOVERY_STATE = {"sgd": 1, "momentum": 1, "adam": 1, "adagrad": 1, "rmsprop": 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=55, help="client rows per round")
    ap.add_argument("--dim", type=int, default=2 * 16_980 * 64, help="parameter count D")
    ap.add_argument("--repeat", type=int, default=5, help="timed repetitions (best is kept)")
    ap.add_argument("--optimizers", default=",".join(OPTIMIZERS.names()))
    args = ap.parse_args()
    n, D, dt = args.rows, args.dim, np.float32
    item = np.dtype(dt).itemsize
    row_bytes = n * D * item
    rng = np.random.default_rng(0)

    from machine import describe

    print(describe())
    print(f"D = {D:,}, rows = {n}, float32, "
          f"one (n, D) array = {row_bytes / 1e6:.0f} MB")

    src = rng.standard_normal((n, D), dtype=dt)
    dst = np.empty_like(src)
    dst.fill(0)

    def copy():
        np.copyto(dst, src)

    G = src  # gradients
    header = (f"{'optimizer':<9} {'phase':<8} {'bytes':>8} {'fused ms':>9} {'GB/s':>6} "
              f"{'% copy':>6} {'numpy ms':>9} {'GB/s':>6} {'speed-up':>8}")
    copy_bw = 0.0
    rows_out = []
    screened = []
    for name in args.optimizers.split(","):
        opt = OPTIMIZERS.get(name)()
        state = opt.init(rng.standard_normal(D, dtype=dt))
        for k in opt.arrays:
            if k != "theta":
                state[k] = np.abs(rng.standard_normal(D, dtype=dt)) * dt(0.01)
        U = {k: np.zeros((n, D), dt) for k in opt.arrays}
        X = np.zeros((n, D), dt)
        k_up = len(opt.arrays)
        t = 10

        rule_bytes = row_bytes * (1 + k_up) + D * item * k_up
        rec_bytes = row_bytes * (len(RECOVERY_READS[name]) + 1) + D * item * RECOVERY_STATE[name]
        ver_bytes = row_bytes * (k_up + 1) + D * item * k_up
        opt.client_rule_batch(state, G, t, U)
        opt.recover_batch(state, U, t, X)
        best = best_times({
            "copy": copy,
            "rule": lambda: opt.client_rule_batch(state, G, t, U),
            "rule_np": lambda: numpy_rule(opt, state, G, t, U),
            "rec": lambda: opt.recover_batch(state, U, t, X),
            "rec_np": lambda: numpy_recover(opt, state, U, t, X),
            "ver": lambda: opt.verify_batch(state, U, t, recovered=X),
            "ver_screen": lambda: opt.verify_batch(state, U, t, recovered=X, screen=True),
            "scr64_rec": lambda: opt.verify_batch(state, U, t, recovered=X, screen=True,
                                                  screen32=False),
            "scr64_reg": lambda: opt.verify_batch(state, U, t, screen=True, screen32=False),
            "scr32_reg": lambda: opt.verify_batch(state, U, t, screen=True),
        }, args.repeat)
        t32 = {}
        if name in ("adam", "adagrad", "rmsprop"):
            if name == "adam":
                arrays, sc = opt._verify_args(state, U, t, X)
                k32, _ = S32.adam_constants(arrays[:6], *sc, S32.U32, S32.TINY32, VERIFY_SAFETY)
                test32 = K.adam_unsure32
            else:
                arrays, sc = opt._verify_args(state, U, X)
                k32, _ = S32.root_constants(arrays[:4], *sc, S32.U32, S32.TINY32, VERIFY_SAFETY)
                test32 = K.root_unsure32
            t32 = best_times({"count": lambda: test32(*arrays, k32, True),
                              "or": lambda: test32(*arrays, k32, False)}, args.repeat)
            assert not test32(*arrays, k32, True).any(), "honest uploads pass the float32 test"
        ok = opt.verify_batch(state, U, t, recovered=X)[0]
        assert ok.all(), "honest uploads must pass verification"
        copy_bw = max(copy_bw, 2 * row_bytes / best["copy"] / 1e9)
        t_rule, t_rule_np, t_rec, t_rec_np, t_ver = (
            best[k] for k in ("rule", "rule_np", "rec", "rec_np", "ver"))
        rows_out.append((name, rule_bytes, rec_bytes, ver_bytes, t_rule, t_rule_np, t_rec,
                         t_rec_np, t_ver))
        screened.append((name, t_ver, best["ver_screen"], best["scr64_rec"], best["scr64_reg"],
                         best["scr32_reg"], t32))
        del U, X

    print(f"copy bandwidth (np.copyto, read + write, best over the run): {copy_bw:.2f} GB/s\n")
    print(header)
    print("-" * len(header))
    summary = []
    for name, rule_bytes, rec_bytes, ver_bytes, t_rule, t_rule_np, t_rec, t_rec_np, t_ver in rows_out:
        for phase, b, tf, tn in (("rule", rule_bytes, t_rule, t_rule_np),
                                 ("recover", rec_bytes, t_rec, t_rec_np),
                                 ("verify", ver_bytes, t_ver, None)):
            bw = b / tf / 1e9
            np_cols = (f"{tn * 1e3:9.1f} {b / tn / 1e9:6.2f} {tn / tf:7.1f}x" if tn is not None
                       else f"{'-':>9} {'-':>6} {'-':>8}")
            print(f"{name:<9} {phase:<8} {b / 1e9:6.2f}GB {tf * 1e3:9.1f} {bw:6.2f} "
                  f"{100 * bw / copy_bw:5.0f}% {np_cols}")
        both_f = t_rule + t_rec
        both_n = t_rule_np + t_rec_np
        both_bw = (rule_bytes + rec_bytes) / both_f / 1e9
        summary.append((name, both_bw, 100 * both_bw / copy_bw, both_n / both_f))

    print("\nupload + recovery (fused): GB/s, share of copy bandwidth, speed-up over NumPy")
    for name, bw, pct, sp in summary:
        print(f"  {name:<9} {bw:6.2f} GB/s  {pct:4.0f}% of copy  {sp:5.1f}x NumPy")

    print("\nverification of honest uploads: exact ratios vs screened (the round loop's; same verdicts)")
    for name, t_exact, t_screen, *_ in screened:
        print(f"  {name:<9} exact {t_exact * 1e3:8.1f} ms  screened {t_screen * 1e3:8.1f} ms  "
              f"{t_exact / t_screen:5.2f}x")
    print("\nthe screen: float64 alone vs with its float32 test (same sure rows); ms")
    print(f"  {'':<9} {'recovered rows given':>32}   {'ĝ recovered in registers':>32}")
    print(f"  {'':<9} {'float64':>10} {'float32':>10} {'×':>10}   {'float64':>10} {'float32':>10} "
          f"{'×':>10}")
    for name, _, t32r, t64r, t64g, t32g, _ in screened:
        print(f"  {name:<9} {t64r * 1e3:10.1f} {t32r * 1e3:10.1f} {t64r / t32r:10.2f}   "
              f"{t64g * 1e3:10.1f} {t32g * 1e3:10.1f} {t64g / t32g:10.2f}")
    print("\nthe float32 test alone, recovered rows given: its coordinates counted in int64 "
          "(before) vs OR per block (the kernels'); ms")
    for name, *_, t32 in screened:
        if t32:
            print(f"  {name:<9} count {t32['count'] * 1e3:8.1f}  OR {t32['or'] * 1e3:8.1f}  "
                  f"{t32['count'] / t32['or']:5.2f}x")


if __name__ == "__main__":
    main()
