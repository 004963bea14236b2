"""One measured round of ``rfrs-ref mechanism``: the fast measures against the oracle.

``rfrs-ref mechanism`` measures, after a round, the cosines between the clients'
recovered gradients, their cosines to the honest mean, and Spearman's correlation
between Krum's score and the norm, in gradient and in parameter space
(docs/reproduction.md, "Mechanism"). For each n (clients per round: 18 Last.fm,
55 citeulike-a, 79 citeulike-t) and D (FISM's 2,173,440 on citeulike-a), on float64
rows shaped like an attacked round (honest rows around a common gradient, ⌊0.4 n⌋
Byzantine rows at its negation), one run times:

- ``round_measures(..., backend="numpy")``, the readable oracle (a Python loop of
  (n, D) differences for the squared distances, an (n, D) temporary per cosine);
- ``backend="numba"``, what ``mechanism`` runs (the blocked float64 distance kernel,
  one Gram matrix, one sum vector);
- plain NumPy's best formulation of the same numbers: one Gram matrix ``G @ G.T`` per
  space (BLAS) and every measure from it (distances by the Gram identity, which
  loses the digits of close rows that the differences keep);
- the machine's one read of G and P (their sums).

Peak: the most memory the call allocated beyond its inputs (tracemalloc sees NumPy's
allocations; the kernel's own are n × n). Times: minimum over ``--repeat`` runs
(the oracle once); ratios within the run.

    python benchmarks/bench_mechanism.py [--n 18 55 79] [--dim 2173440]
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402

from machine import describe  # noqa: E402

from rfrs_ref.aggregate.krum import krum_scores  # noqa: E402
from rfrs_ref.experiments.mechanism import round_measures, spearman  # noqa: E402


def rows(n, D, seed=0):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(D) * 1e-3
    G = g + rng.standard_normal((n, D)) * 3e-3
    f = int(0.4 * n)
    G[n - f:] *= -1
    P = rng.standard_normal((n, D)) * 1e-2
    byz = np.zeros(n, dtype=bool)
    byz[n - f:] = True
    return G, P, byz, f


def gram_baseline(G, P, byz, f):
    """The same measures from one Gram matrix per space (plain NumPy, BLAS)."""
    out = {}
    h = np.flatnonzero(~byz)
    for name, X in (("gradient", G), ("parameter", P)):
        K = X @ X.T
        sq = np.diagonal(K)
        norms = np.sqrt(sq)
        D2 = np.maximum(sq[:, None] + sq[None, :] - 2 * K, 0.0)
        scores, _ = krum_scores(D2, f)
        out[f"spearman_{name}"] = spearman(scores, norms)
        if name == "gradient":
            C = K[np.ix_(h, h)] / np.outer(norms[h], norms[h])
            out["honest_cos_mean"] = float(C[np.triu_indices(h.size, 1)].mean())
            s = K[:, h].sum(axis=1)                     # ĝᵢ · S
            ss = float(K[np.ix_(h, h)].sum())           # ‖S‖²
            out["to_mean"] = s / (norms * math.sqrt(ss))
            out["loo"] = (s[h] - sq[h]) / (norms[h] * np.sqrt(ss - 2 * s[h] + sq[h]))
    return out


def measure(fn, repeat):
    best, peak = math.inf, 0
    for _ in range(repeat):
        tracemalloc.start()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        peak = max(peak, tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    return best, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[18, 55, 79])
    ap.add_argument("--dim", type=int, default=2_173_440)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(describe())
    print(f"D = {args.dim:,}, float64 rows; one measured round (both spaces)\n")
    head = (f"{'n':>4} {'read G,P s':>10} {'oracle s':>9} {'numba s':>8} {'Gram np s':>9} "
            f"{'oracle/numba':>12} {'Gram/numba':>10} {'peak oracle':>11} {'peak numba':>10}")
    print(head)
    print("-" * len(head))
    for n in args.n:
        G, P, byz, f = rows(n, args.dim)
        round_measures(G[:3, :64], P[:3, :64], byz[:3], 0, backend="numba")  # compile
        t_read, _ = measure(lambda: (G.sum(), P.sum()), args.repeat)
        t_fast, m_fast = measure(lambda: round_measures(G, P, byz, f, backend="numba"),
                                 args.repeat)
        t_gram, _ = measure(lambda: gram_baseline(G, P, byz, f), args.repeat)
        t_orc, m_orc = measure(lambda: round_measures(G, P, byz, f), 1)
        print(f"{n:>4} {t_read:>10.3f} {t_orc:>9.2f} {t_fast:>8.3f} {t_gram:>9.3f} "
              f"{t_orc / t_fast:>12.1f} {t_gram / t_fast:>10.2f} "
              f"{m_orc / 2**30:>9.2f} GB {m_fast / 2**30:>7.3f} GB")


if __name__ == "__main__":
    main()
