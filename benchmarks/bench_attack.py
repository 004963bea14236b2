"""Time of each attack's rewrite of a round's Byzantine uploads, against the optimiser's rule.

One round at FISM's size on citeulike-a by default: D = 2 · 16,980 · 64 =
2,173,440 parameters, 18 sampled clients of which 5 Byzantine, Adam, float32.
The baseline, timed in the same run, is the optimiser's batch rule on the 5
Byzantine rows (what every gradient-space attack must do at least); the
table gives each attack's best time and its ratio to that baseline, and the
time of one aggregation of the round by ``--rule`` (the unit of the optimal
attacks' cost). The
optimal attacks run their 20 evaluations against the rule given by ``--rule``
(each evaluation aggregates the whole round); ``a-ra`` promotes 10 targets
(A-ra, S = 10). Honest uploads are rewritten before every timing, outside it.

Usage: python benchmarks/bench_attack.py [--rows 18] [--byzantine 5] [--dim 2173440]
       [--repeat 3] [--rule trmean]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import rfrs_ref.kernels  # noqa: F401  (picks Numba's threading layer, as training does)
from rfrs_ref.aggregate import RULES
from rfrs_ref.attack import ATTACKS, AttackContext
from rfrs_ref.model import MODELS
from rfrs_ref.optim import OPTIMIZERS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=18)
    ap.add_argument("--byzantine", type=int, default=5)
    ap.add_argument("--dim", type=int, default=2_173_440)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rule", default="trmean")
    args = ap.parse_args()
    d = 64
    n_items = max(10, args.dim // (2 * d))
    model = MODELS.get("fism")(n_items=n_items, dim=d)
    D = model.n_params()
    opt = OPTIMIZERS.get("adam")()
    rng = np.random.default_rng(0)
    state = opt.init(rng.normal(size=D).astype(np.float32))
    state["m"] = (1e-3 * rng.normal(size=D)).astype(np.float32)
    state["v"] = (1e-6 * rng.gamma(1.0, 1.0, D)).astype(np.float32)
    G = (1e-3 * rng.normal(size=(args.rows, D))).astype(np.float32)
    honest = {k: np.empty((args.rows, D), np.float32) for k in opt.arrays}
    opt.client_rule_batch(state, G, 5, honest)
    up = {k: v.copy() for k, v in honest.items()}
    byz = np.zeros(args.rows, bool)
    byz[rng.choice(args.rows, size=args.byzantine, replace=False)] = True
    rows = np.flatnonzero(byz)
    rule = RULES.get(args.rule)()
    f = args.byzantine
    workspace: dict = {}
    targets = ",".join(map(str, range(0, n_items, max(1, n_items // 10))[:10]))
    attacks = {"ascent": ATTACKS.get("ascent")(), "ipm": ATTACKS.get("ipm")(),
               "inf": ATTACKS.get("inf")(), "mimic": ATTACKS.get("mimic")(),
               "opt-ipm": ATTACKS.get("opt-ipm")(), "opt-alie": ATTACKS.get("opt-alie")(),
               "a-ra": ATTACKS.get("a-ra")(targets=targets)}

    def baseline():
        opt.client_rule_batch(state, G[rows], 5, up, rows=rows)

    def runner(attack):
        def run():
            attack.apply_inplace(AttackContext(
                t=5, optimizer=opt, state=state, grads=G, uploads=up, byzantine=byz,
                clients=np.arange(args.rows), n_samples=np.full(args.rows, 20), f=f,
                rng=np.random.default_rng(1), workspace=workspace, rule=rule, detect="gradient",
                model=model))
        return run

    def aggregate():
        rule.aggregate(G, up, np.full(args.rows, 20), f)

    fns = {"rule on the Byzantine rows": baseline, f"{args.rule} of the round": aggregate, **{k: runner(a) for k, a in attacks.items()}}
    for fn in fns.values():  # compile the kernels, fill the workspace
        fn()
    best = {k: float("inf") for k in fns}
    for _ in range(args.repeat):  # the variants in turn: the same chances of a quiet moment
        for name, fn in fns.items():
            for k in opt.arrays:
                np.copyto(up[k], honest[k])
            tick = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - tick)
    from machine import describe

    print(f"D = {D:,} float32, {args.rows} clients of which {args.byzantine} Byzantine, adam, "
          f"rule {args.rule} (optimal attacks), best of {args.repeat}")
    print(f"{'attack':28s} {'ms':>10s} {'× rule':>8s}")
    base = best["rule on the Byzantine rows"]
    for name, t in best.items():
        print(f"{name:28s} {1e3 * t:10.1f} {t / base:8.2f}")
    print(describe())


if __name__ == "__main__":
    main()
