"""Per-run cost of the paper's figures, and the wall time of their full reproduction.

For each dataset and each kind of run the figures use (model × optimiser ×
defence), the script times a few rounds and one evaluation in this process,
single-threaded as a sweep worker is (NUMBA_NUM_THREADS=1 unless set), and
estimates one full run as

    rounds · t_round + evaluations · t_eval,   evaluations = rounds // eval_every + 1,

with the run's resolved rounds and evaluation interval. The estimated wall
time of a figure is the sum over its full grid divided by the number of
workers (``--workers``, default 2: a 2-core machine). The baseline of each
row is the first kind measured for the dataset, in the same process: the
plain mean, without attack where a grid has such runs (the "No defense"
Adam FISM run of the paper's figures); the ratio column is each kind's cost
relative to it.

    python benchmarks/bench_sweep.py                    # all four datasets
    python benchmarks/bench_sweep.py --datasets ml100k --rounds 5
    python benchmarks/bench_sweep.py --figures ranking --datasets ml100k,lastfm --rounds 3
    python benchmarks/bench_sweep.py --figures 4 --datasets citeulike-a,citeulike-t --rfa-passes

A kind of run is (model, optimiser, rule, detection space, attack, pre-aggregators);
the α of a run changes its cost little (the same rule on the same number of rows)
and is not measured separately: each kind is timed at the first α the grids use.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402

from rfrs_ref.experiments.figures import DATASETS, FIGURES, Scale  # noqa: E402
from rfrs_ref.federated.round import run_round  # noqa: E402
from rfrs_ref.federated.trainer import Trainer  # noqa: E402

from machine import describe  # noqa: E402


def kind_of(config) -> tuple:
    """What a run's cost depends on besides the dataset (seed, α and labels aside)."""
    return (config.model, config.optimizer, config.defense, config.detect, config.attack,
            "+".join(config.pre) or "-")


def measure(config, rounds: int, shared_rows: bool = True) -> tuple[float, float]:
    """(seconds per round, seconds per evaluation) of ``config``, after a warm-up round
    (``shared_rows`` False: every client's rows computed in full)."""
    trainer = Trainer(config)
    state, private = trainer.initial_state()
    buf = trainer.buffers(shared_rows=shared_rows)
    state, _ = run_round(trainer.federation, state, 1, buf, private)  # compile / warm caches
    tick = time.perf_counter()
    for t in range(2, rounds + 2):
        state, _ = run_round(trainer.federation, state, t, buf, private)
    per_round = (time.perf_counter() - tick) / rounds
    trainer.evaluate(state, private)
    tick = time.perf_counter()
    trainer.evaluate(state, private)
    return per_round, time.perf_counter() - tick


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--rounds", type=int, default=8, help="rounds timed per kind of run")
    ap.add_argument("--workers", type=int, default=2, help="workers of the estimated full sweep")
    ap.add_argument("--figures", default=None,
                    help="comma-separated figures/experiments to estimate (default: all but Fig. 1)")
    ap.add_argument("--rfa-passes", action="store_true",
                    help="also time each RFA kind with its Weiszfeld steps in passes over the "
                         "features (as before the steps ran on the distance matrix), in a row "
                         "of its own that the figure totals leave out")
    ap.add_argument("--no-shared-rows", action="store_true",
                    help="compute every client's rows in full, as the rounds did before they "
                         "computed the rows the clients share once (the 'before' of "
                         "docs/performance.md)")
    args = ap.parse_args()
    datasets = args.datasets.split(",")
    wanted = None if args.figures is None else set(args.figures.split(","))

    # every kind of run the full figures use, per dataset, with its count and resolved config
    # (Fig. 1 is one capture run of 24 rounds: not worth estimating)
    grids = {fid: [r.config.resolved() for r in fig.runs(Scale())] for fid, fig in FIGURES.items()
             if fig.kind != "pca" and (wanted is None or fid in wanted or fig.name in wanted)}
    kinds: dict[tuple, object] = {}
    for configs in grids.values():
        for c in configs:
            if c.dataset in datasets:
                kinds.setdefault((c.dataset, *kind_of(c)), c)

    threads = os.environ["NUMBA_NUM_THREADS"]
    print(describe())
    print(f"NUMBA_NUM_THREADS={threads}, {args.rounds} rounds timed per kind")
    print(f"{'dataset':12s} {'model':5s} {'optim':8s} {'defense':7s} {'detect':9s} {'attack':10s} "
          f"{'pre':5s} {'s/round':>8s} {'s/eval':>7s} {'run (est.)':>10s} {'× first':>7s}")
    cost: dict[tuple, float] = {}
    for d in datasets:
        # the first row is the baseline: the plain mean without attack where a grid has it
        keys = sorted((k for k in kinds if k[0] == d),
                      key=lambda k: (k[3] not in ("none", "mean"), k[5] != "none", k[6] != "-"))
        base = None
        for key in keys:
            c = kinds[key]
            per_round, per_eval = measure(c, args.rounds, shared_rows=not args.no_shared_rows)
            evaluations = c.rounds // c.eval_every + 1
            est = c.rounds * per_round + evaluations * per_eval
            cost[key] = est
            base = est if base is None else base
            print(f"{d:12s} {key[1]:5s} {key[2]:8s} {key[3]:7s} {key[4]:9s} "
                  f"{key[5]:10s} {key[6]:5s} {per_round:8.3f} {per_eval:7.2f} "
                  f"{est / 60:8.1f} m {est / base:7.2f}", flush=True)
            if args.rfa_passes and key[3] == "rfa":
                import rfrs_ref.kernels.weiszfeld as W

                limit, W.GRAM_MAX_ROWS = W.GRAM_MAX_ROWS, 0
                try:
                    per_round_p, _ = measure(c, args.rounds, shared_rows=False)
                finally:
                    W.GRAM_MAX_ROWS = limit
                est_p = c.rounds * per_round_p + evaluations * per_eval
                print(f"{d:12s} {key[1]:5s} {key[2]:8s} {'rfa*':7s} {key[4]:9s} "
                      f"{key[5]:10s} {key[6]:5s} {per_round_p:8.3f} {per_eval:7.2f} "
                      f"{est_p / 60:8.1f} m {est_p / base:7.2f}   (* in passes, as before)",
                      flush=True)

    print()
    wall = f"wall hours ({args.workers} workers)"
    print(f"{'figure':7s} {'runs':>5s} {'CPU hours':>9s} {wall:>22s}")
    for fid, configs in grids.items():
        todo = [c for c in configs if c.dataset in datasets]
        total = sum(cost[(c.dataset, *kind_of(c))] for c in todo)
        print(f"{fid:7s} {len(todo):5d} {total / 3600:9.1f} {total / 3600 / args.workers:22.1f}")
    print("figures 7 and 8 plot the runs of figures 3 and 4: after those they cost nothing")


if __name__ == "__main__":
    main()
