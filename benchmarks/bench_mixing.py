"""The pre-aggregators' row mixing: ``kernels.mixing.mix_rows`` on NNM's matrix.

NNM (docs/aggregation.md, pre-aggregation) replaces each of the n rows of every
array the rule reads by the nᵢ-weighted mean of its n − f nearest rows:
A′ = S + M (A − S), float64 sums over each row's non-zero weights in index order,
rounded once to A's dtype. A coordinate-wise rule behind NNM reads every mixed
upload, so a round mixes four arrays (the features, m, v, θ); on Last.fm's 18
clients that was about half of an NNM + median round.

For each layout of the rows (``general``: standard normal rows, in general
position; ``round``: a gradient-space round under attack, the honest rows close
together and the ⌊0.2n⌋ Byzantine ones copies of one far row, so that every honest
row has the same NNM neighbours), each n (18 Last.fm, 55 citeulike-a, 100) and D
(FISM's 2,256,896 on Last.fm), float32 rows and an NNM matrix of n − f neighbours
a row (f = ⌊0.2 n⌋, the ranking's α = 0.2; ``rows``: how many of its rows are
distinct), one run times:

- ``mix_rows`` as the round calls it (``backend="numba"``, into a kept output),
  which sums each distinct row of the matrix once and copies it to the rows equal
  to it;
- ``every row``: the same kernel summing every row of the matrix, equal rows again
  (as before it summed each distinct row once; the same bits);
- the same kernel as it was before: each term added into the float64 accumulator
  one at a time, every row's difference A[i] − S recomputed for each output row that
  uses it (kept here as the "before"; the same bits);
- plain NumPy, the best formulation of the same product with one OpenBLAS thread:
  blocks of 4,096 columns converted to float64, S subtracted, multiplied by the
  distinct rows of M (``np.unique``; BLAS), S added, each result put in the rows
  equal to its own, rounded to float32 (the same result within rounding; another
  order of the sums);
- the machine's copy of A (``np.copyto``), for scale.

Times: minimum (median) over ``--repeat`` runs, one Numba thread by default
(``--threads``), as a sweep worker runs. ``same`` says whether the kernel's rows
are the one-term kernel's and the oracle's (``mix_rows_numpy``, at the smallest
size only: it is one output row at a time) bit for bit.

    python benchmarks/bench_mixing.py
    python benchmarks/bench_mixing.py --n 18 55 100 --dim 2256896 --repeat 5 --layout round
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402

import numpy as np  # noqa: E402
from numba import njit, prange  # noqa: E402

from machine import describe, timed  # noqa: E402

from rfrs_ref.aggregate.pre import NNM  # noqa: E402
from rfrs_ref.kernels.distances import n_chunks  # noqa: E402
from rfrs_ref.kernels.mixing import (distinct_rows, _mix_block, _mix_numba,  # noqa: E402
                                     mix_rows, mix_rows_numpy)


@njit(parallel=True)
def _mix_one_term(A, ptr, cols, vals, S, out, block, nchunks):
    """The kernel before: one term at a time into the accumulator (with a reference)."""
    m = ptr.size - 1
    D = A.shape[1]
    nblocks = (D + block - 1) // block
    for c in prange(nchunks):
        acc = np.empty(block)
        for b in range(c * nblocks // nchunks, (c + 1) * nblocks // nchunks):
            k0 = b * block
            bw = min(D, k0 + block) - k0
            s = S[k0:k0 + bw]
            for j in range(m):
                for k in range(bw):
                    acc[k] = 0.0
                for p in range(ptr[j], ptr[j + 1]):
                    a = A[cols[p], k0:k0 + bw]
                    w = vals[p]
                    for k in range(bw):
                        acc[k] += w * (np.float64(a[k]) - s[k])
                o = out[j, k0:k0 + bw]
                for k in range(bw):
                    o[k] = s[k] + acc[k]


def one_term(M, A, S, out):
    ptr = np.concatenate([[0], np.cumsum(np.count_nonzero(M, axis=1))]).astype(np.int64)
    rows, cols = np.nonzero(M)
    _mix_one_term(A, ptr, cols.astype(np.int64), M[rows, cols].copy(),
                  np.asarray(S, np.float64), out, 1024, n_chunks(A.shape[1], 1024))
    return out


def every_row(M, A, S, out):
    """The kernel summing every row of M, equal rows again (as before equal rows were
    summed once and copied)."""
    ptr = np.concatenate([[0], np.cumsum(np.count_nonzero(M, axis=1))]).astype(np.int64)
    rows, cols = np.nonzero(M)
    block = _mix_block(A.shape[0])
    _mix_numba(A, ptr, cols.astype(np.int64), M[rows, cols].copy(), np.asarray(S, np.float64),
               True, out, np.arange(M.shape[0], dtype=np.int64), block,
               n_chunks(A.shape[1], block))
    return out


def numpy_blocks(M, A, S, out, block=4096):
    """Plain NumPy: the distinct rows of M (np.unique) times the blocks of A − S (BLAS),
    S added, each row's result put in every row equal to it."""
    S64 = np.asarray(S, np.float64)
    U, inverse = np.unique(M, axis=0, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    for k0 in range(0, A.shape[1], block):
        s = S64[k0:k0 + block]
        out[:, k0:k0 + block] = (s + U @ (A[:, k0:k0 + block].astype(np.float64) - s))[inverse]
    return out


def rows_of(layout: str, n: int, D: int, rng) -> np.ndarray:
    """``general``: standard normal rows (general position: every NNM neighbour set its
    own). ``round``: a gradient-space round under attack, the n − ⌊0.2n⌋ honest rows
    close to one another (a common row plus noise 10⁻³ its size) and the Byzantine ones
    copies of one far row, so that the honest rows share one neighbour set."""
    if layout == "general":
        return rng.standard_normal((n, D), dtype=np.float32)
    base = rng.standard_normal(D, dtype=np.float32)
    A = base + 1e-3 * rng.standard_normal((n, D), dtype=np.float32)
    A[n - int(0.2 * n):] = -10.0 * base
    return A


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[18, 55, 100])
    ap.add_argument("--dim", type=int, nargs="+", default=[2_256_896])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layout", nargs="+", default=["general", "round"],
                    choices=["general", "round"],
                    help="rows in general position, or as a gradient-space round under attack")
    args = ap.parse_args(argv)
    import numba
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    print(describe())
    print("# seconds: min (median); x = that column's time / mix_rows'")
    header = (f"{'layout':>7} {'n':>4} {'D':>9} {'f':>3} {'rows':>5} | {'copy A':>7} | "
              f"{'mix_rows':>15} | {'every row':>15} {'x':>5} | "
              f"{'one term (before)':>17} {'x':>5} | {'NumPy + BLAS':>15} {'x':>5} | same")
    print(header)
    print("-" * len(header))
    first = True
    for layout in args.layout:
        for D in args.dim:
            for n in args.n:
                rng = np.random.default_rng(0)
                A = rows_of(layout, n, D, rng)
                S = rng.standard_normal(D, dtype=np.float32)
                f = int(0.2 * n)
                M = NNM().mixing(A, rng.integers(1, 60, size=n).astype(float), f,
                                 np.ones(n, bool), None, "numba").matrix
                distinct = len(distinct_rows(M)[0])
                out, every, before, plain, copy = (np.empty_like(A) for _ in range(5))
                small = np.ascontiguousarray(A[:, :2048])
                mix_rows(M, small, S[:2048])
                every_row(M, small, S[:2048], np.empty_like(small))
                one_term(M, small, S[:2048], np.empty_like(small))  # compile
                t_copy = timed(lambda: np.copyto(copy, A), args.repeat)
                t_ours = timed(lambda: mix_rows(M, A, S, out=out), args.repeat)
                t_every = timed(lambda: every_row(M, A, S, every), args.repeat)
                t_before = timed(lambda: one_term(M, A, S, before), args.repeat)
                t_np = timed(lambda: numpy_blocks(M, A, S, plain), args.repeat)
                same = (np.array_equal(out.view(np.uint32), before.view(np.uint32))
                        and np.array_equal(out.view(np.uint32), every.view(np.uint32)))
                if first or layout == "round":
                    oracle = mix_rows_numpy(M, small, S[:2048])
                    same = same and np.array_equal(mix_rows(M, small, S[:2048]), oracle)
                    first = False
                print(f"{layout:>7} {n:4d} {D:9d} {f:3d} {distinct:5d} | {t_copy[0]:7.4f} | "
                      f"{t_ours[0]:7.4f} ({t_ours[1]:5.3f}) | "
                      f"{t_every[0]:7.4f} ({t_every[1]:5.3f}) {t_every[0] / t_ours[0]:5.2f} | "
                      f"{t_before[0]:8.4f} ({t_before[1]:5.3f}) {t_before[0] / t_ours[0]:5.2f} | "
                      f"{t_np[0]:7.4f} ({t_np[1]:5.3f}) {t_np[0] / t_ours[0]:5.2f} | {same}",
                      flush=True)
                del A, out, every, before, plain, copy


if __name__ == "__main__":
    main()
