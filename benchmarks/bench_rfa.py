"""RFA on the distance matrix: Weiszfeld's steps in O(n²) against one pass over X per step.

RFA (the nᵢ-weighted geometric median by smoothed Weiszfeld, docs/aggregation.md)
used to take every step as one fused pass over the n × D features. Every iterate is
z = Σⱼ aⱼxⱼ, so with the matrix Dⱼₖ = ‖xⱼ − xₖ‖² (one pass, differences in float64)
each step's distances are ‖z − xᵢ‖² = Σⱼ aⱼDⱼᵢ − ½ aᵀDa, checked against their rounding
bound (docs/performance.md, "RFA on the distance matrix"). For each n (the paper's
clients per round: 18 Last.fm, 55 citeulike-a, 79 citeulike-t; 100) and D (FISM's
2,173,440 on citeulike-a), float32 features shaped like an attacked round (honest rows
around a common gradient, ⌊0.4 n⌋ Byzantine rows at its negation), one run times:

- ``RFA()`` as the round calls it (defaults ν = 1e-6, tol = 1e-6, at most 100 steps),
  weights and the weighted sum of one uploaded array (X itself): on the matrix
  (``method="auto"``) and in passes (``method="passes"``, as before);
- plain NumPy, the best formulations of the same iteration with one OpenBLAS thread:
  the matrix as ``X64 @ X64.T`` in float64 (the Gram identity; X converted once),
  then the same steps in n-space; and the passes as two matrix-vector products a step
  (z = Xᵀα/Σα, ‖xᵢ − z‖² = ‖xᵢ‖² − 2xᵢ·z + ‖z‖²);
- the machine's one read of X (a parallel finiteness check).

Times: minimum (median) over ``--repeat`` runs; ratios within the run. ``dev``: the
largest difference of the normalised weights from our passes. Synthetic rows converge
in 5–6 steps, fewer than a real round's, so the matrix gains less here than in rounds.

With ``--datasets`` (and ``RFRS_DATA_DIR``), a second table times RFA inside real
rounds: Adam, the ascent attack at α = 0.4, both detection spaces, ``--rounds`` rounds
alternating between the matrix and the passes (odd rounds on the matrix), the
aggregation phase alone (RFA's weights and the weighted sums of m, v, θ), with the
steps each round took.

    python benchmarks/bench_rfa.py [--n 18 55 79 100] [--dim 2173440]
    RFRS_DATA_DIR=... python benchmarks/bench_rfa.py --n --datasets citeulike-a citeulike-t --rounds 8
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from machine import describe, timed  # noqa: E402

from rfrs_ref.aggregate import RFA  # noqa: E402
from rfrs_ref.aggregate.base import combine  # noqa: E402
from rfrs_ref.kernels.weiszfeld import (geometric_median_weights, rows_finite,  # noqa: E402
                                        weighted_median)


def features(n, D, seed=0):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(D, dtype=np.float32) * np.float32(1e-3)
    X = g + rng.standard_normal((n, D), dtype=np.float32) * np.float32(3e-3)
    f = int(0.4 * n)
    X[n - f:] *= -1
    return X, rng.integers(20, 60, size=n).astype(np.float64)


def _np_steps(dist_of, w, nu=1e-6, tol=1e-6, max_iter=100):
    """The same smoothed Weiszfeld iteration, given dist_of(a) -> (distances, z-step²)."""
    a = w / w.sum()
    d, _ = dist_of(a, None)
    for _ in range(max_iter):
        alpha = w / np.maximum(nu, d)
        a_new = alpha / alpha.sum()
        d, step2 = dist_of(a_new, a)
        a = a_new
        if np.sqrt(max(step2, 0.0)) <= tol * max(nu, weighted_median(d, w)):
            break
    return w / np.maximum(nu, d)


def np_rfa_matrix(X, w):
    X64 = X.astype(np.float64)
    G = X64 @ X64.T
    sq = np.diag(G).copy()
    Dm = np.maximum(sq[:, None] + sq[None, :] - 2 * G, 0.0)

    def dist_of(a, a_prev):
        s = Dm @ a
        d = np.sqrt(np.maximum(s - 0.5 * (a @ s), 0.0))
        c = a - a_prev if a_prev is not None else a * 0
        return d, -0.5 * c @ (Dm @ c)

    alpha = _np_steps(dist_of, w)
    return (alpha / alpha.sum()).astype(X.dtype) @ X


def np_rfa_passes(X, w):
    sq = np.einsum("ij,ij->i", X, X, dtype=np.float64)
    state = {}

    def dist_of(a, a_prev):
        z = X.T @ a.astype(X.dtype)
        d2 = sq - 2.0 * (X @ z).astype(np.float64) + float(z.astype(np.float64) @ z)
        step2 = 0.0 if a_prev is None else float(np.sum((z - state["z"]).astype(np.float64) ** 2))
        state["z"] = z
        return np.sqrt(np.maximum(d2, 0.0)), step2

    alpha = _np_steps(dist_of, w)
    return (alpha / alpha.sum()).astype(X.dtype) @ X


def ours(X, w, method):
    gm = geometric_median_weights(X, w, nu=1e-6, tol=1e-6, max_iter=100, method=method)
    wn = gm["alpha"] / gm["alpha"].sum()
    return combine({"theta": X}, wn, "numba")["theta"], wn, gm


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="*", default=[18, 55, 79, 100],
                    help="rows of the synthetic table (none: skip it)")
    ap.add_argument("--dim", type=int, nargs="+", default=[2_173_440])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--datasets", nargs="*", default=[])
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args(argv)
    print(describe())
    print("# seconds: min (median); 'x' = that time / ours on the matrix")
    head = (f"{'n':>4} {'D':>9} | {'read X':>7} | {'ours: matrix':>15} {'steps':>5} | "
            f"{'ours: passes':>15} {'x':>5} | {'numpy: matrix':>15} {'x':>5} | "
            f"{'numpy: passes':>15} {'x':>5} | {'dev':>7}")
    print(head)
    print("-" * len(head))
    small, sw = features(8, 1000)
    ours(small, sw, "auto"), ours(small, sw, "passes"), RFA().aggregate(small, {"t": small}, sw, 2)
    for D in args.dim:
        for n in args.n:
            X, w = features(n, D)
            rows_finite(X)
            read = timed(lambda: rows_finite(X), args.repeat)
            mat = timed(lambda: ours(X, w, "auto"), args.repeat)
            pas = timed(lambda: ours(X, w, "passes"), args.repeat)
            npm = timed(lambda: np_rfa_matrix(X, w), max(1, args.repeat - 1))
            npp = timed(lambda: np_rfa_passes(X, w), max(1, args.repeat - 1))
            assert mat[2][2]["method"] == "distances", mat[2][2]["method"]
            dev = float(np.abs(mat[2][1] - pas[2][1]).max())

            def c(t):
                return f"{t[0]:7.3f} ({t[1]:5.3f})"

            def x(t):
                return f"{t[0] / mat[0]:5.1f}"
            print(f"{n:4d} {D:9d} | {read[0]:7.4f} | {c(mat)} {mat[2][2]['iterations']:5d} | "
                  f"{c(pas)} {x(pas)} | {c(npm)} {x(npm)} | {c(npp)} {x(npp)} | {dev:7.1e}",
                  flush=True)
            del X
    for ds in args.datasets:
        for detect in ("parameter", "gradient"):
            in_rounds(ds, detect, args.rounds)


def in_rounds(dataset, detect, rounds):
    """RFA's aggregation phase in real rounds, alternating the two methods."""
    import rfrs_ref.kernels.weiszfeld as W
    from rfrs_ref.data import load_dataset
    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.round import run_round
    from rfrs_ref.federated.trainer import Trainer

    record = {"distances": [], "passes": []}
    steps = {"distances": [], "passes": []}
    inner = RFA._aggregate
    gm = W._geometric_median
    current = {}

    def timed_aggregate(self, *a):
        t = time.perf_counter()
        out = inner(self, *a)
        record[current["method"]].append(time.perf_counter() - t)
        return out

    def counted(*a, **k):
        res = gm(*a, **k)
        steps[current["method"]].append(res["iterations"])
        return res

    trainer = Trainer(TrainConfig(dataset=dataset, optimizer="adam", defense="rfa", detect=detect,
                                  attack="ascent", byzantine_fraction=0.4, rounds=rounds + 1,
                                  backend="numba", dtype="float32", seed=0),
                      data=load_dataset(dataset))
    state, private = trainer.initial_state()
    buf = trainer.buffers()
    limit = W.GRAM_MAX_ROWS
    try:
        RFA._aggregate = timed_aggregate
        W._geometric_median = counted
        for t in range(1, rounds + 2):
            current["method"] = "distances" if t % 2 else "passes"
            W.GRAM_MAX_ROWS = limit if t % 2 else 0
            state, _ = run_round(trainer.federation, state, t, buf, private)
    finally:
        RFA._aggregate, W._geometric_median, W.GRAM_MAX_ROWS = inner, gm, limit
    # round 1 compiles: left out
    mat, pas = record["distances"][1:], record["passes"]
    n = max(1, int(trainer.federation.client_fraction * trainer.federation.n_clients))
    print(f"# {dataset} ({n} clients a round), {detect} space, aggregation phase, s: matrix {' '.join(f'{x:.3f}' for x in mat)} "
          f"(steps {steps['distances'][1:]}); passes {' '.join(f'{x:.3f}' for x in pas)} "
          f"(steps {steps['passes']}); median passes / matrix "
          f"{statistics.median(pas) / statistics.median(mat):.2f}", flush=True)


if __name__ == "__main__":
    main()
