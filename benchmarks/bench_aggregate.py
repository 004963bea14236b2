"""Aggregation rules: our kernels against plain NumPy, Flower and ByzFL.

For every rule and every (n, D) of the grid (default n ∈ {20, 55, 100},
D ∈ {100,000, 2,173,440}, float32; D = 2,173,440 is FISM on citeulike-a), one
run times on the same matrix X (n × D, the detection features, also the one
uploaded array, as the other libraries aggregate the vectors they rank):

- ours: ``rule.aggregate(X, {"theta": X}, n_samples, f)`` (``backend="numba"``);
- NumPy: the best formulation one writes without kernels, with one OpenBLAS
  thread: the mean as ``X.T @ w`` with w in X's dtype (a float64 w would
  make NumPy copy X to float64 first), Gram-matrix distances
  ‖a‖² + ‖b‖² − 2a·b in float32 for krum and bulyan, ``np.median``,
  ``np.partition``, and a Weiszfeld step as two matrix-vector products
  (z = Xᵀα/Σα, then ‖xᵢ − z‖² = ‖xᵢ‖² − 2xᵢ·z + ‖z‖² with the row norms
  computed once per call): no n × D temporary;
- Flower (``flwr.server.strategy.aggregate``) and ByzFL (``byzfl`` aggregators)
  when importable;
- the machine's one-pass read of X (a parallel finiteness check of every
  value): the floor for any rule that reads X once.

f is ⌊0.4 n⌋ (the paper's largest Byzantine fraction), ⌊(n − 3)/4⌋ for Bulyan
(n ≥ 4f + 3: 24 at n = 100); centered clipping (``cc``) runs one iteration from
the centre 0 with τ = 100, the defaults of ours and of ByzFL, whose object
starts from 0 too; ``caf`` with f = ⌊(n − 1)/2⌋, ``smea`` and ``mda`` with
f = 2 (their searches are combinatorial); ByzFL's SMEA copies every subset of
n − f rows and is run only up to D = 100,000 (``--slow`` for more). RFA is timed per Weiszfeld step: ours runs 10
steps (tolerance 0), NumPy and ByzFL run 10 steps of the same map. Every
figure is the minimum over ``--repeat`` runs (``--repeat-slow`` for Flower
and ByzFL), the median beside it; speedups are ratios within this run.

    python benchmarks/bench_aggregate.py                       # the full grid (long)
    python benchmarks/bench_aggregate.py --n 100 --dim 2173440 --rules krum median
    python benchmarks/bench_aggregate.py --n 20 --dim 100000 --no-flower
    python benchmarks/bench_aggregate.py --n 100 --dim 2173440 --threads 1   # one core each
    python benchmarks/bench_aggregate.py --pre nnm bucketing clip arc --n 100 --dim 100000

``--pre ... --behind RULE ...`` times each pre-aggregator in front of each of
those rules, on X and a round's three uploads (m, v, θ, float32, verified:
``FiniteUploads``), two ways in one run: as the round runs it (a rule that
combines by weights reads the mixed features only and the uploads are summed
from the clients' rows with c = Mᵀw′) and with the rule reading every mixed
upload (the way before; the same weights, the arrays within one rounding):

    python benchmarks/bench_aggregate.py --pre nnm --behind krum rfa median --n 18 55 --dim 2260480

``--pre`` alone times the pre-aggregators instead, each in front of ``mean`` on X
and one uploaded array θ = X (so the mixing runs on both, as in a round): ours
(``backend="numba"``), our NumPy float64 oracle (``backend="numpy"``, one
output row at a time), and ByzFL's pre-aggregator followed by its ``Average``
when importable; ByzFL mixes the features only, so it is compared with ours on
the features only (``X only``: the upload is X itself, mixed once). ByzFL's
clipping and ARC scale their input's rows in place: they get a copy of X made
before the clock starts (ours never modifies X).

Every rule is also timed with our float64 oracle (``backend="numpy"``, one
run; ``--no-oracle`` skips it: minutes at full size) beside the best plain
NumPy formulation where that differs from the oracle (mean, krum, median,
trmean, rfa, bulyan, cc, meamed, monna). mda and smea run with f = 2 (their
searches are combinatorial: C(100, 2) = 4,950 subsets), caf with
f = ⌊(n − 1)/2⌋.

On a shared machine the figures of the parallel kernels suffer most (a
parallel region waits for its slowest thread); compare ratios from one run on a
quiet machine, or one core against one core with ``--threads 1``.
"""

from __future__ import annotations

import os

# one BLAS thread for the NumPy baselines: set before NumPy is imported
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

from rfrs_ref.aggregate import RFA, RULES  # noqa: E402
from rfrs_ref.kernels.weiszfeld import rows_finite, weiszfeld_pass  # noqa: E402

from machine import describe  # noqa: E402

ALL_RULES = ["mean", "krum", "median", "trmean", "rfa", "bulyan", "mda", "meamed", "monna", "cc",
             "caf", "smea"]
RFA_STEPS = 10


def timed(fn, repeat: int) -> tuple[float, float, object]:
    ts = []
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), statistics.median(ts), out


def f_for(rule: str, n: int) -> int:
    if rule == "bulyan":
        return (n - 3) // 4
    if rule in ("smea", "mda"):
        return 2  # C(n, f) subsets: f = 2 keeps C(100, 2) = 4950 (ByzFL enumerates them too)
    if rule == "caf":
        return (n - 1) // 2
    return min(int(0.4 * n), (n - 3) // 2)


# ------------------------------------------------------------------ plain NumPy baselines

def np_gram_sq_dists(X):
    sq = np.einsum("ij,ij->i", X, X)
    return sq[:, None] + sq[None, :] - 2 * (X @ X.T)


def np_krum_select(D2, f, candidates):
    R = np.asarray(candidates)
    sub = D2[np.ix_(R, R)].astype(np.float64)
    np.fill_diagonal(sub, np.inf)
    m = min(R.size - 1, max(1, R.size - f - 2))
    return np.sort(sub, axis=1)[:, :m].sum(axis=1)


def np_mean(X, ns, f):
    # weights in X's dtype: a float64 vector times a float32 matrix would copy X to float64
    return X.T @ (ns / ns.sum()).astype(X.dtype)


def np_krum(X, ns, f):
    n = X.shape[0]
    scores = np_krum_select(np_gram_sq_dists(X), f, np.arange(n))
    kept = np.argsort(scores, kind="stable")[: n - f]
    w = ns[kept] / ns[kept].sum()
    return X[kept].T @ w.astype(X.dtype)


def np_median(X, ns, f):
    return np.median(X, axis=0)


def np_trmean(X, ns, f):
    n = X.shape[0]
    return np.partition(X, (f, n - f - 1), axis=0)[f: n - f].mean(axis=0)


def np_sq_norms(X):
    """‖xᵢ‖² of every row, accumulated in float64 (once per RFA call)."""
    return np.einsum("ij,ij->i", X, X, dtype=np.float64)


def np_weiszfeld_step(X, alpha, sq):
    """One Weiszfeld step as two matrix-vector products: z = Σαᵢxᵢ/Σαᵢ and
    ‖xᵢ − z‖² = ‖xᵢ‖² − 2xᵢ·z + ‖z‖² (no n × D temporary)."""
    z = X.T @ (alpha / alpha.sum()).astype(X.dtype)
    d2 = sq - 2.0 * (X @ z).astype(np.float64) + float(z.astype(np.float64) @ z.astype(np.float64))
    return z, np.sqrt(np.maximum(d2, 0.0))


def np_rfa(X, ns, f):
    alpha = ns.astype(np.float64)
    sq = np_sq_norms(X)
    for _ in range(RFA_STEPS):
        z, d = np_weiszfeld_step(X, alpha, sq)
        alpha = ns / np.maximum(1e-6, d)
    return z


def np_bulyan(X, ns, f):
    n = X.shape[0]
    D2 = np_gram_sq_dists(X)
    remaining = list(range(n))
    selected = []
    for _ in range(n - 2 * f):
        scores = np_krum_select(D2, f, remaining)
        best = remaining[int(np.argmin(scores))]
        selected.append(best)
        remaining.remove(best)
    S = X[np.sort(selected)]
    med = np.median(S, axis=0)
    beta = S.shape[0] - 2 * f
    idx = np.argpartition(np.abs(S - med), beta - 1, axis=0)[:beta]
    return np.take_along_axis(S, idx, axis=0).mean(axis=0)


def np_cc(X, ns, f, tau=100.0):
    """One centered-clipping iteration from the centre 0: ‖xᵢ‖ by a matrix-vector
    free row norm, the clip factors, and one weighted sum (no n × D temporary)."""
    norms = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64))
    c = np.minimum(1.0, tau / np.maximum(norms, 1e-300))
    p = ns / ns.sum()
    return X.T @ (p * c).astype(X.dtype)


def np_meamed(X, ns, f):
    """The n − f values closest to ``np.median`` per coordinate, as ByzFL writes it
    (``np.argpartition`` of |X − med|, then a gather): two n × D temporaries."""
    k = X.shape[0] - f
    med = np.median(X, axis=0)
    idx = np.argpartition(np.abs(X - med), k - 1, axis=0)[:k]
    return np.take_along_axis(X, idx, axis=0).mean(axis=0)


def np_monna(X, ns, f, pivot=0):
    """The n − f rows nearest to the pivot, distances by the Gram identity in X's
    dtype (‖xᵢ‖² − 2xᵢ·xₚ + ‖xₚ‖²: one matrix-vector product, no temporary)."""
    k = X.shape[0] - f
    sq = np.einsum("ij,ij->i", X, X, dtype=np.float64)
    d2 = sq - 2.0 * (X @ X[pivot]).astype(np.float64) + sq[pivot]
    idx = np.sort(np.argsort(d2, kind="stable")[:k])
    w = np.zeros(X.shape[0], dtype=X.dtype)
    w[idx] = 1.0 / k
    return X.T @ w


#: the plain-NumPy formulation of a rule, where it differs from our float64 oracle
#: (for mda, caf and smea the oracle is the plain formulation: the column is empty)
NUMPY = {"mean": np_mean, "krum": np_krum, "median": np_median, "trmean": np_trmean,
         "rfa": np_rfa, "bulyan": np_bulyan, "cc": np_cc, "meamed": np_meamed, "monna": np_monna}


# ------------------------------------------------------------------ other libraries

def load_flower():
    try:
        return importlib.import_module("flwr.server.strategy.aggregate")
    except Exception:
        return None


def load_byzfl():
    """ByzFL's aggregators without running ``byzfl/__init__`` (which imports
    torchvision): a bare package module with the real ``__path__``."""
    try:
        import torch  # noqa: F401
    except Exception:
        return None
    spec = importlib.util.find_spec("byzfl")
    if spec is None or not spec.submodule_search_locations:
        return None
    if "byzfl" not in sys.modules:
        pkg = types.ModuleType("byzfl")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        sys.modules["byzfl"] = pkg
    return importlib.import_module("byzfl.aggregators.aggregators")


def flower_call(fl, rule, X, ns, f, slow):
    results = [([X[i]], int(ns[i])) for i in range(X.shape[0])]
    n = X.shape[0]
    if rule == "mean":
        return lambda: fl.aggregate(results)
    if rule == "krum":
        return lambda: fl.aggregate_krum(results, num_malicious=f, to_keep=n - f)
    if rule == "median":
        return lambda: fl.aggregate_median(results)
    if rule == "trmean":
        return lambda: fl.aggregate_trimmed_avg(results, proportiontocut=(f + 0.5) / n)
    if rule == "bulyan" and slow:
        return lambda: fl.aggregate_bulyan(list(results), num_malicious=f,
                                           aggregation_rule=fl.aggregate_krum, to_keep=0)
    return None


def byzfl_call(bz, rule, X, ns, f, slow=False):
    if rule == "mean":
        return bz.Average()
    if rule == "krum":
        return bz.MultiKrum(f)
    if rule == "median":
        return bz.Median()
    if rule == "trmean":
        return bz.TrMean(f)
    if rule == "rfa":
        return bz.GeometricMedian(nu=1e-6, T=RFA_STEPS)
    if rule == "cc":
        return bz.CenteredClipping(L=1, tau=100.0)
    if rule == "mda":
        return bz.MDA(f)
    if rule == "meamed":
        return bz.Meamed(f)
    if rule == "monna":
        return bz.MoNNA(f, 0)
    if rule == "caf":
        return bz.CAF(f)
    if rule == "smea" and (slow or X.shape[1] <= 100_000):
        # ByzFL copies every subset of n − f rows (C(n, f) of them): hours at full size
        return bz.SMEA(f)
    return None


# ------------------------------------------------------------------ main

def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[20, 55, 100])
    ap.add_argument("--dim", type=int, nargs="+", default=[100_000, 2_173_440])
    ap.add_argument("--rules", nargs="+", default=ALL_RULES, choices=ALL_RULES)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--repeat-slow", type=int, default=1, help="repeats for Flower and ByzFL")
    ap.add_argument("--no-flower", action="store_true")
    ap.add_argument("--no-byzfl", action="store_true")
    ap.add_argument("--slow", action="store_true",
                    help="also run Flower's Bulyan and ByzFL's SMEA beyond D = 100,000 (hours at full size)")
    ap.add_argument("--no-oracle", action="store_true",
                    help="skip our float64 NumPy oracle (backend='numpy'; minutes at full size)")
    ap.add_argument("--pre", nargs="+", default=None, choices=["nnm", "bucketing", "clip", "arc"],
                    help="time these pre-aggregators (in front of mean) instead of the rules")
    ap.add_argument("--behind", nargs="+", default=None, choices=ALL_RULES,
                    help="with --pre: time the pre-aggregators in front of these rules, on a "
                         "round's three uploads, summed directly and reading mixed uploads")
    ap.add_argument("--threads", type=int, default=None,
                    help="Numba threads for our kernels (default: all; 1 compares one core with one core)")
    args = ap.parse_args(argv)
    if args.threads:
        numba.set_num_threads(args.threads)

    if args.pre and args.behind:
        bench_pre_rules(args)
        return
    if args.pre:
        bench_pre(args)
        return
    fl = None if args.no_flower else load_flower()
    bz = None if args.no_byzfl else load_byzfl()
    print(describe())
    print(f"# OpenBLAS threads 1; Flower: {'yes' if fl else 'no'}, ByzFL: {'yes' if bz else 'no'}")
    print("# times in seconds: min (median) over repeats; 'x' = that column's time / ours "
          "(> 1: ours is faster)")
    header = (f"{'rule':8} {'n':>4} {'D':>9} {'f':>3} | {'read X':>7} | {'ours':>15} | "
              f"{'oracle':>15} {'x':>6} | {'numpy':>15} {'x':>6} | {'flower':>15} {'x':>6} | "
              f"{'byzfl':>15} {'x':>6} | {'dev':>8}")
    print(header)
    print("-" * len(header))

    def cell(t):
        return f"{t[0]:7.3f} ({t[1]:5.3f})" if t else f"{'-':>15}"

    def ratio(base, ours):
        return f"{base[0] / ours[0]:6.1f}" if base else f"{'-':>6}"

    def rel_dev(got, ref):
        got = np.asarray(got, dtype=np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        return float(np.max(np.abs(got - ref)) / max(1e-30, np.max(np.abs(ref))))

    for D in args.dim:
        for n in args.n:
            rng = np.random.default_rng(0)
            X = rng.standard_normal((n, D), dtype=np.float32)
            ns = rng.integers(20, 60, size=n).astype(np.float64)
            rows_finite(X)  # compile and touch
            read = timed(lambda: rows_finite(X), max(3, args.repeat))
            for rule in args.rules:
                f = f_for(rule, n)
                ns_rule = np.full(n, 40.0) if rule != "mean" else ns  # the libraries ignore nᵢ
                if rule == "rfa":
                    ours_rule = RFA(tol=0.0, max_iter=RFA_STEPS)
                else:
                    ours_rule = RULES.get(rule)()
                ours_rule.aggregate(X[:, :1000].copy(), {"theta": X[:, :1000].copy()}, ns_rule, f)  # compile
                ours = timed(lambda: ours_rule.aggregate(X, {"theta": X}, ns_rule, f), args.repeat)
                got = ours[2].arrays["theta"]
                orc = None
                if not args.no_oracle:
                    orc = timed(lambda: ours_rule.aggregate(X, {"theta": X}, ns_rule, f,
                                                            backend="numpy"), 1)
                base = None
                if rule in NUMPY:
                    base = timed(lambda: NUMPY[rule](X, ns_rule, f), args.repeat)
                ref = orc[2].arrays["theta"] if orc else (base[2] if base else None)
                dev = f"{rel_dev(got, ref):8.1e}" if ref is not None else f"{'-':>8}"
                flw = None
                if fl is not None:
                    call = flower_call(fl, rule, X, ns_rule, f, args.slow)
                    if call is not None:
                        flw = timed(call, args.repeat_slow)
                byz = None
                if bz is not None:
                    agg = byzfl_call(bz, rule, X, ns_rule, f, args.slow)
                    if agg is not None:
                        byz = timed(lambda: agg(X), args.repeat_slow)
                print(f"{rule:8} {n:4d} {D:9d} {f:3d} | {read[0]:7.4f} | {cell(ours)} | {cell(orc)} "
                      f"{ratio(orc, ours)} | {cell(base)} {ratio(base, ours)} | {cell(flw)} "
                      f"{ratio(flw, ours)} | {cell(byz)} {ratio(byz, ours)} | {dev}", flush=True)
                if rule == "rfa":
                    # per Weiszfeld step: our fused pass against one NumPy step
                    alpha = ns_rule / ns_rule.sum()
                    step = timed(lambda: weiszfeld_pass(X, alpha), args.repeat)
                    sq = np_sq_norms(X)
                    npstep = timed(lambda: np_weiszfeld_step(X, alpha, sq), args.repeat)
                    print(f"{'  1 step':8} {n:4d} {D:9d} {'':3} | {'':7} | {cell(step)} | {'-':>15} "
                          f"{'-':>6} | {cell(npstep)} {ratio(npstep, step)} |", flush=True)
                del ours, orc, base, got, ref
            del X
    print("# dev: max |ours − oracle| / max |oracle| on the aggregate (without the oracle: against "
          "the NumPy column; krum/bulyan: the float32 Gram baseline may rank clients differently; "
          "rfa: 10 steps from different starts)")


def load_byzfl_pre():
    if load_byzfl() is None:
        return None
    return importlib.import_module("byzfl.aggregators.preaggregators")


def bench_pre(args) -> None:
    from rfrs_ref.aggregate import Mean
    from rfrs_ref.aggregate.pre import PRE, PreAggregated

    bzp = None if args.no_byzfl else load_byzfl_pre()
    bz = load_byzfl() if bzp is not None else None
    print(describe())
    print(f"# OpenBLAS threads 1; ByzFL: {'yes' if bzp else 'no'}")
    print("# pre-aggregator then mean, on X and θ = X; seconds: min (median); 'x' = oracle or "
          "ByzFL time / ours")
    header = (f"{'pre':10} {'n':>4} {'D':>9} {'f':>3} | {'read X':>7} | {'ours X, θ':>15} | "
              f"{'oracle X, θ':>15} {'x':>6} | {'ours X only':>15} | {'byzfl X only':>15} {'x':>6} | "
              f"{'dev':>8}")
    print(header)
    print("-" * len(header))

    def cell(t):
        return f"{t[0]:7.3f} ({t[1]:5.3f})" if t else f"{'-':>15}"

    def ratio(base, ours):
        return f"{base[0] / ours[0]:6.1f}" if base else f"{'-':>6}"

    for D in args.dim:
        for n in args.n:
            rng = np.random.default_rng(0)
            X = rng.standard_normal((n, D), dtype=np.float32)
            T = X.copy()
            ns = np.full(n, 40.0)
            f = int(0.4 * n) if n > 4 else 0
            ref = {"theta": np.zeros(D, np.float32)}
            rows_finite(X)
            read = timed(lambda: rows_finite(X), max(3, args.repeat))
            for name in args.pre:
                params = {"clip_norm": float(np.sqrt(D))} if name == "clip" else {}
                rule = PreAggregated((PRE.get(name)(**params),), Mean())

                def run(backend, X=X, rule=rule):
                    return rule.aggregate(X, {"theta": T}, ns, f, backend=backend, reference=ref,
                                          rng=np.random.default_rng(1))

                small = X[:, :1000].copy()
                rule.aggregate(small, {"theta": small.copy()}, ns, f, reference={"theta": ref["theta"][:1000]},
                               rng=np.random.default_rng(1))  # compile
                ours = timed(lambda: run("numba"), args.repeat)
                base = None if args.no_oracle else timed(lambda: run("numpy"), 1)
                dev = float("nan")
                if base is not None:
                    a, b = ours[2].arrays["theta"], base[2].arrays["theta"]
                    dev = float(np.max(np.abs(a.astype(np.float64) - b)) / max(1e-30, np.max(np.abs(b))))
                ours_x = timed(lambda: rule.aggregate(X, {"x": X}, ns, f, backend="numba",
                                                      rng=np.random.default_rng(1)), args.repeat)
                byz = byz_note = None
                if bzp is not None:
                    obj = {"nnm": lambda: bzp.NNM(f), "bucketing": lambda: bzp.Bucketing(2),
                           "clip": lambda: bzp.Clipping(float(np.sqrt(D))), "arc": lambda: bzp.ARC(f)}[name]()
                    avg = bz.Average()
                    if name in ("clip", "arc"):
                        # ByzFL scales the rows of its input in place: each run gets its own
                        # copy, made outside the timing (ours leaves X as it is)
                        copies = iter([X.copy() for _ in range(args.repeat_slow)])
                        byz = timed(lambda: avg(obj(next(copies))), args.repeat_slow)
                    else:
                        try:
                            byz = timed(lambda: avg(obj(X)), args.repeat_slow)
                        except MemoryError as exc:
                            # ByzFL's NNM gathers every row's n − f neighbours into one
                            # (n, n − f, D) array: at full size more memory than the machine has
                            byz_note = f"ByzFL {name}: out of memory ({exc})"
                byz_cell = cell(byz) if byz is not None or byz_note is None else f"{'out of memory':>15}"
                print(f"{name:10} {n:4d} {D:9d} {f:3d} | {read[0]:7.4f} | {cell(ours)} | {cell(base)} "
                      f"{ratio(base, ours)} | {cell(ours_x)} | {byz_cell} {ratio(byz, ours_x)} | "
                      f"{dev:8.1e}", flush=True)
                if byz_note:
                    print(f"# {byz_note}", flush=True)
            del X, T
    print("# dev: max |ours − oracle| / max |oracle| on the aggregated θ")


def bench_pre_rules(args) -> None:
    import dataclasses

    from rfrs_ref.aggregate import RULES
    from rfrs_ref.aggregate.base import FiniteUploads
    from rfrs_ref.aggregate.pre import PRE, PreAggregated

    def reading_mixed_uploads(rule):
        cls = type(rule)
        sub = type(f"Mixed{cls.__name__}", (cls,), {"combines_by_weights": False})
        return sub(**{fl.name: getattr(rule, fl.name) for fl in dataclasses.fields(rule)})

    print(describe())
    print("# pre-aggregator then rule, on X and uploads m, v, θ (float32, verified); seconds: "
          "min (median); 'x' = mixed-uploads time / ours")
    header = (f"{'pre':10} {'rule':8} {'n':>4} {'D':>9} {'f':>3} | {'read X':>7} | "
              f"{'ours':>15} | {'mixed uploads':>15} {'x':>6} | {'dev':>8}")
    print(header)
    print("-" * len(header))

    def cell(t):
        return f"{t[0]:7.3f} ({t[1]:5.3f})"

    for D in args.dim:
        for n in args.n:
            rng = np.random.default_rng(0)
            X = rng.standard_normal((n, D), dtype=np.float32)
            U = FiniteUploads({k: rng.standard_normal((n, D), dtype=np.float32)
                               for k in ("m", "v", "theta")})
            ns = np.full(n, 40.0)
            ref = {k: np.zeros(D, np.float32) for k in U}
            read = timed(lambda: rows_finite(X), max(3, args.repeat))
            for name in args.pre:
                params = {"clip_norm": float(np.sqrt(D))} if name == "clip" else {}
                for rname in args.behind:
                    f = f_for(rname, n) if rname in ("bulyan", "smea", "mda", "caf") else n // 5
                    inner = RULES.get(rname)()
                    fast = PreAggregated((PRE.get(name)(**params),), inner)
                    slow = PreAggregated((PRE.get(name)(**params),), reading_mixed_uploads(inner))

                    def run(rule):
                        return rule.aggregate(X, U, ns, f, backend="numba", reference=ref,
                                              rng=np.random.default_rng(1))

                    try:
                        run(fast), run(slow)  # compile, and allocate the kept arrays
                    except Exception as exc:  # a precondition at this n
                        print(f"# {name} + {rname}, n = {n}: {exc}")
                        continue
                    ours = timed(lambda: run(fast), args.repeat)
                    before = timed(lambda: run(slow), args.repeat)
                    dev = max(float(np.max(np.abs(ours[2].arrays[k].astype(np.float64)
                                                  - before[2].arrays[k]))
                                    / max(1e-30, float(np.max(np.abs(before[2].arrays[k])))))
                              for k in U)
                    print(f"{name:10} {rname:8} {n:4d} {D:9d} {f:3d} | {read[0]:7.4f} | "
                          f"{cell(ours)} | {cell(before)} {before[0] / ours[0]:6.1f} | "
                          f"{dev:8.1e}", flush=True)
            del X, U
    print("# dev: max over m, v, θ of max |ours − mixed uploads| / max |mixed uploads|")


if __name__ == "__main__":
    main()
