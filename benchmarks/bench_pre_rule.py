"""A coordinate-wise rule behind NNM: the aggregation of a round, equal mixed rows read once.

Behind NNM (docs/aggregation.md, pre-aggregation) the median, the trimmed mean and
Meamed read every mixed upload. In a round under attack whose Byzantine rows lie
apart from the honest ones, the honest rows share one neighbour set, so most mixed
rows are equal bit for bit (3 to 6 distinct rows of 18 on Last.fm in gradient
space). ``PreAggregated`` then mixes each distinct row once and hands the rule the
distinct rows with the map of their copies (``Rule.aggregate_copies``): no copy is
written, each distinct row is ranked once (its ranks counted where few rows repeat),
and the weighted sums are still added row by row in index order, so the aggregate is
the one on the rows written out, bit for bit.

For the round layout of bench_mixing.py (the n − ⌊0.2n⌋ honest rows close together,
the Byzantine ones copies of one far row; ``rows``: the distinct mixed rows), each n
(18 Last.fm, 55 citeulike-a, 100) and D (FISM's 2,256,896 on Last.fm), float32
features and three uploads (m, v, θ, as Adam's round aggregates), one run times:

- ``once``: ``PreAggregated((NNM(),), rule).aggregate`` as the round calls it (numba);
- ``written out``: the same with ``write_copies=True``, every mixed row written out
  and ranked (as before; the same bits, checked: ``same``);
- ``NumPy``: the best plain-NumPy formulation of the same result with one OpenBLAS
  thread: the distinct rows of NNM's matrix (``np.unique``) times the float64 rows
  (BLAS), each result put in the rows equal to it, then per column a stable argsort of
  the features and, for the window's rows, the nᵢ-weighted mean of every upload (the
  median's window here; another order of the sums, so within rounding).

Times: minimum (median) over ``--repeat`` runs, one Numba thread by default
(``--threads``), as a sweep worker runs.

With ``--rounds R`` (and ``RFRS_DATA_DIR``), a second table times whole rounds of the
defences ranking on Last.fm (Adam, α = 0.2, FISM d = 64, verification on): for each
rule, detection space and attack asked for, two runs of the same configuration, one
reading equal mixed rows once and one writing them out, a round of each in turn;
seconds a round and of its aggregation phase, medians of the rounds after the first
two, and whether the two server states after R rounds are equal bit for bit.

    python benchmarks/bench_pre_rule.py
    python benchmarks/bench_pre_rule.py --n 18 55 --rules median meamed --repeat 3
    RFRS_DATA_DIR=../shared/data python benchmarks/bench_pre_rule.py --n 18 --rounds 10
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import dataclasses  # noqa: E402

import numpy as np  # noqa: E402

from machine import describe, timed  # noqa: E402

from rfrs_ref.aggregate import RULES, PreAggregated  # noqa: E402
from rfrs_ref.aggregate.pre import NNM  # noqa: E402
from rfrs_ref.kernels.mixing import distinct_rows  # noqa: E402


def round_rows(n: int, D: int, rng) -> np.ndarray:
    """The honest rows close to one another, the ⌊0.2n⌋ Byzantine ones one far row."""
    base = rng.standard_normal(D, dtype=np.float32)
    A = base + 1e-3 * rng.standard_normal((n, D), dtype=np.float32)
    A[n - int(0.2 * n):] = -10.0 * base
    return A


def numpy_median(M, X, uploads, w, block=65536):
    """Plain NumPy, the median's window: mixed rows by BLAS on the distinct rows of M,
    then a stable argsort per column and the weighted mean of the middle rows."""
    U, inverse = np.unique(M, axis=0, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    n = M.shape[0]
    lo, hi = (n - 1) // 2, n // 2
    out = {k: np.empty(X.shape[1], dtype=A.dtype) for k, A in uploads.items()}
    for k0 in range(0, X.shape[1], block):
        F = (U @ X[:, k0:k0 + block].astype(np.float64))[inverse]
        order = np.argsort(F, axis=0, kind="stable")[lo:hi + 1]
        ww = w[order]
        for k, A in uploads.items():
            mixed = (U @ A[:, k0:k0 + block].astype(np.float64))[inverse]
            vals = np.take_along_axis(mixed, order, axis=0)
            out[k][k0:k0 + block] = (ww * vals).sum(axis=0) / ww.sum(axis=0)
    return out


def round_table(configs, rounds: int) -> None:
    """Rounds of Last.fm behind NNM, equal mixed rows read once against written out."""
    import statistics
    import time

    from rfrs_ref.data import load_dataset
    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.round import run_round
    from rfrs_ref.federated.trainer import Trainer

    data = load_dataset("lastfm", os.environ.get("RFRS_DATA_DIR"))
    print()
    print(f"# Last.fm rounds behind NNM (Adam, α = 0.2), seconds: median of rounds 3..{rounds}")
    header = (f"{'rule':>7} {'space':>9} {'attack':>6} | {'round once':>10} {'written':>8} {'x':>5} | "
              f"{'agg. once':>9} {'written':>8} {'x':>5} | same state")
    print(header)
    print("-" * len(header))
    for rule, detect, attack in configs:
        cfg = TrainConfig(dataset="lastfm", optimizer="adam", pre=("nnm",), defense=rule,
                          detect=detect, attack=attack, byzantine_fraction=0.2, seed=0)
        runs = []
        for write in (False, True):
            tr = Trainer(cfg, data=data)
            tr.federation.rule = dataclasses.replace(tr.federation.rule, write_copies=write)
            state, private = tr.initial_state()
            runs.append([tr, tr.buffers(), state, private, [], []])
        for t in range(1, rounds + 1):
            for run in runs:
                tr, buf, state, private, total, agg = run
                t0 = time.perf_counter()
                run[2], rec = run_round(tr.federation, state, t, buf, private)
                total.append(time.perf_counter() - t0)
                agg.append(rec["timing"].get("aggregation", 0.0))
        med = [(statistics.median(r[4][2:]), statistics.median(r[5][2:])) for r in runs]
        same = all(np.array_equal(runs[0][2][k].view(np.uint8), runs[1][2][k].view(np.uint8))
                   for k in runs[0][2])
        print(f"{rule:>7} {detect:>9} {attack:>6} | {med[0][0]:10.3f} {med[1][0]:8.3f} "
              f"{med[1][0] / med[0][0]:5.2f} | {med[0][1]:9.3f} {med[1][1]:8.3f} "
              f"{med[1][1] / med[0][1]:5.2f} | {same}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[18, 55, 100])
    ap.add_argument("--dim", type=int, default=2_256_896)
    ap.add_argument("--rules", nargs="+", default=["median", "trmean", "meamed"],
                    choices=["median", "trmean", "meamed"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=0,
                    help="also time this many Last.fm rounds of each --configs (needs RFRS_DATA_DIR)")
    ap.add_argument("--configs", nargs="+",
                    default=["median/gradient/a-ra", "meamed/gradient/ascent",
                             "trmean/parameter/a-ra"],
                    help="rule/space/attack of the rounds timed")
    args = ap.parse_args(argv)
    import numba
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    print(describe())
    print("# seconds: min (median); x = that column's time / once's")
    header = (f"{'rule':>7} {'n':>4} {'D':>9} {'f':>3} {'rows':>5} | {'once':>15} | "
              f"{'written out':>15} {'x':>5} | {'NumPy (median)':>15} {'x':>5} | same")
    print(header)
    print("-" * len(header))
    D = args.dim
    for n in args.n:
        rng = np.random.default_rng(0)
        X = round_rows(n, D, rng)
        uploads = {"m": X + np.float32(0.5), "v": np.abs(X), "theta": X - np.float32(1.0)}
        arrays = {**uploads, "x": X}
        w = rng.integers(1, 60, size=n).astype(float)
        f = int(0.2 * n)
        M = NNM().mixing(X, w, f, np.ones(n, bool), None, "numba").matrix
        rows = len(distinct_rows(M)[0])
        small = {k: np.ascontiguousarray(A[:, :4096]) for k, A in arrays.items()}
        t_np = None
        for name in args.rules:
            once = PreAggregated((NNM(),), RULES.get(name)())
            written = dataclasses.replace(once, write_copies=True)
            for p in (once, written):  # compile, and the kept buffers
                p.aggregate(small["x"], small, w, f)
            a = timed(lambda: once.aggregate(X, arrays, w, f), args.repeat)
            b = timed(lambda: written.aggregate(X, arrays, w, f), args.repeat)
            same = all(np.array_equal(a[2].arrays[k].view(np.uint32), b[2].arrays[k].view(np.uint32))
                       for k in arrays) and np.array_equal(a[2].kept, b[2].kept)
            np_cell = f"{'':>15} {'':>5}"
            if name == "median":
                t_np = timed(lambda: numpy_median(M, X, uploads, w), 1)
                close = all(np.allclose(t_np[2][k], a[2].arrays[k], rtol=1e-5, atol=1e-6)
                            for k in uploads)
                same = same and close
                np_cell = f"{t_np[0]:7.3f} ({t_np[1]:5.3f}) {t_np[0] / a[0]:5.1f}"
            print(f"{name:>7} {n:4d} {D:9d} {f:3d} {rows:5d} | {a[0]:7.3f} ({a[1]:5.3f}) | "
                  f"{b[0]:7.3f} ({b[1]:5.3f}) {b[0] / a[0]:5.2f} | {np_cell} | {same}", flush=True)
        del X, uploads, arrays
    if args.rounds:
        round_table([c.split("/") for c in args.configs], args.rounds)


if __name__ == "__main__":
    main()
