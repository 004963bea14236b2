"""Whole attacked rounds, as they run and as they ran when the attack rewrote held uploads.

An attack computed in the client rule (``Attack.in_client_rule``: gradient ascent,
camouflage, a-ra) has each Byzantine client's upload computed with the honest ones, a
batch of gradients at a time, and, where it ``shares_rows`` (ascent, a-ra), lets a
round of FISM compute the Q rows the clients share once per class of client
(docs/performance.md, "Attacked rounds that stream" and "A-ra in the client rule").
The baseline, in the same run, is the round that keeps every honest gradient and upload
and lets the attack's ``apply_inplace`` rewrite the Byzantine rows (the way every
attacked round ran before): ``Federation.attacks_in_client_rule`` turned off. The two
kinds of round alternate round by round from the same states; the table gives each
kind's median seconds per round, their ratio, and whether the two new states agree
(bit for bit, or for Krum and the other rules on shared rows within their distances'
rounding: the largest relative difference is printed).

    python benchmarks/bench_attack_rounds.py                       # Last.fm, the ranking's a-ra rounds
    python benchmarks/bench_attack_rounds.py --dataset ml100k --rounds 8 --cases krum:gradient:a-ra
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # noqa: E402

from rfrs_ref.federated.config import TrainConfig  # noqa: E402
from rfrs_ref.federated.round import Federation, run_round  # noqa: E402
from rfrs_ref.federated.trainer import Trainer  # noqa: E402

CASES = ("none:parameter:a-ra", "krum:gradient:a-ra", "krum:parameter:a-ra",
         "median:gradient:a-ra", "trmean:parameter:a-ra", "mda:gradient:a-ra",
         "krum:gradient:ascent")


@contextlib.contextmanager
def held_uploads():
    """Rounds as they ran before: every upload held, the attack rewriting Byzantine rows."""
    before = Federation.attacks_in_client_rule
    Federation.attacks_in_client_rule = property(lambda self: False)
    try:
        yield
    finally:
        Federation.attacks_in_client_rule = before


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="lastfm")
    ap.add_argument("--alpha", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=6, help="rounds timed per kind (after 2 warm-up)")
    ap.add_argument("--cases", nargs="+", default=list(CASES),
                    help="rule:detection space:attack, e.g. krum:gradient:a-ra")
    ap.add_argument("--threads", type=int, default=None,
                    help="Numba threads (default: all; a sweep worker runs with 1)")
    args = ap.parse_args(argv)
    if args.threads:
        import numba

        numba.set_num_threads(args.threads)
    print(describe())
    print(f"# {args.dataset}, Adam, α = {args.alpha}; seconds per round, median of "
          f"{args.rounds}, the two kinds alternating; 'x' = held / as it runs")
    header = (f"{'rule':8} {'space':9} {'attack':7} | {'path':27} | {'as it runs':>10} | "
              f"{'held':>8} {'x':>5} | {'state diff':>10}")
    print(header)
    print("-" * len(header))
    data = None
    for case in args.cases:
        rule, space, attack = case.split(":")
        config = TrainConfig(dataset=args.dataset, optimizer="adam", defense=rule, detect=space,
                             attack=attack, byzantine_fraction=args.alpha, seed=0)
        trainer = Trainer(config, data=data)
        data = trainer.data
        fed = trainer.federation
        path = ("streams" if fed.streams else "shared rows" if fed.compares_shared_rows
                else "full rows") + (", in client rule" if fed.attacks_in_client_rule else "")
        buf_new = trainer.buffers()
        with held_uploads():
            buf_old = trainer.buffers()
        state, private = trainer.initial_state()
        times = {"new": [], "old": []}
        worst = 0.0
        for t in range(1, args.rounds + 3):
            tick = time.perf_counter()
            new, _ = run_round(fed, state, t, buf_new, private)
            t_new = time.perf_counter() - tick
            with held_uploads():
                tick = time.perf_counter()
                old, _ = run_round(fed, state, t, buf_old, private)
                t_old = time.perf_counter() - tick
            if t > 2:
                times["new"].append(t_new)
                times["old"].append(t_old)
            for k in old:
                a, b = old[k].astype(np.float64), new[k].astype(np.float64)
                scale = max(float(np.max(np.abs(a))), 1e-300)
                worst = max(worst, float(np.max(np.abs(a - b))) / scale)
            state = old
        tn, to = statistics.median(times["new"]), statistics.median(times["old"])
        print(f"{rule:8} {space:9} {attack:7} | {path:27} | {tn:10.3f} | {to:8.3f} "
              f"{to / tn:5.2f} | {worst:10.1e}", flush=True)


if __name__ == "__main__":
    main()
