"""A-RFRS on Flower: time per round and bytes per round against the in-process trainer.

The same configuration (default: MovieLens 100K, FISM d = 64, Adam, A-RFRS =
Krum on recovered gradients, gradient ascent by α = 0.2 of the users, e = 0.01:
9 clients per round, D = 215,296) runs

- in process (:class:`rfrs_ref.federated.trainer.Trainer`), the baseline;
- on Flower's simulation engine (Ray; one virtual SuperNode per user);
- on a loopback deployment (flower-superlink and ``--nodes`` flower-supernode
  processes on 127.0.0.1; Flower 1.41 starts one ClientApp process per message);

each for ``--rounds`` rounds, and the script checks that the three end in the
same server state (bit for bit). Time per round is the round's own time from its
record (clients, recovery, verification, aggregation; the evaluations are left
out), the median over the rounds after the first (which pays one-off start-up
costs); the nodes' discovery (the server asking every node which users it
holds) is shown apart. Bytes per round are the serialised Flower messages
(the state down to each sampled client, the uploads up), against the minimum
n · |arrays| · D · 4 bytes (float32) each way.

    python benchmarks/bench_flower.py                        # ML100K, 5 rounds
    python benchmarks/bench_flower.py --rounds 3 --no-deploy
    python benchmarks/bench_flower.py --dataset synthetic --dim 16

Needs the flower extra and RFRS_DATA_DIR (or a download) for ML100K.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from machine import describe  # noqa: E402


def _records(run_dir: pathlib.Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]


def _per_round(recs: list[dict]) -> float:
    times = [sum(v for v in r["timing"].values()) for r in recs]
    return statistics.median(times[1:] if len(times) > 1 else times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="ml100k")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--client-fraction", type=float, default=0.01)
    ap.add_argument("--alpha", type=float, default=0.2)
    ap.add_argument("--nodes", type=int, default=3, help="SuperNodes of the loopback deployment")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs for Ray in the simulation")
    ap.add_argument("--no-simulation", action="store_true")
    ap.add_argument("--no-deploy", action="store_true")
    args = ap.parse_args(argv)

    from rfrs_ref.aggregate import PRESETS
    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.trainer import Trainer

    cfg = TrainConfig(dataset=args.dataset, rounds=args.rounds, eval_every=args.rounds,
                      model_params={"dim": args.dim}, client_fraction=args.client_fraction,
                      defense=PRESETS["a-rfrs"][0], detect=PRESETS["a-rfrs"][1],
                      attack="ascent", byzantine_fraction=args.alpha)
    print(describe())
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-flower-"))
    trainer = Trainer(cfg)
    n = trainer.buffers().uploads["theta"].shape[0]
    D = trainer.model.n_params()
    arrays = len(trainer.optimizer.arrays)
    minimum = n * arrays * D * 4
    print(f"{cfg.dataset}: {trainer.data.n_users} users, n = {n} clients per round, D = {D:,}, "
          f"{arrays} arrays (adam); minimum per round each way n·{arrays}·D·4 = {minimum:,} B")

    rows = []
    tick = time.perf_counter()
    Trainer(cfg).run(work / "warm")  # compiles the kernels: not timed
    ref = Trainer(cfg).run(work / "inprocess")
    base = _per_round(_records(work / "inprocess"))
    rows.append(("in-process trainer", base, None, None, None, "-"))
    print(f"in-process: {time.perf_counter() - tick:.1f} s", flush=True)

    def same(state) -> str:
        return "yes" if all(np.array_equal(state[k], ref.state[k]) for k in ref.state) else "NO"

    if not args.no_simulation:
        from rfrs_ref.flower.run import simulate

        tick = time.perf_counter()
        out = simulate(cfg, work / "simulation", num_cpus=args.cpus)
        recs = _records(work / "simulation")
        rows.append((f"Flower simulation (Ray, {args.cpus} CPUs)", _per_round(recs),
                     out["discovery_seconds"],
                     statistics.median(r["wire"]["bytes_down"] for r in recs),
                     statistics.median(r["wire"]["bytes_up"] for r in recs),
                     same(out["result"].state)))
        print(f"simulation: {time.perf_counter() - tick:.1f} s", flush=True)
    if not args.no_deploy:
        from rfrs_ref.flower.deploy import deploy

        tick = time.perf_counter()
        deploy(cfg, work / "deploy", nodes=args.nodes, timeout=3000, round_timeout=1200,
               connect_timeout=600)
        recs = _records(work / "deploy")
        meta = json.loads((work / "deploy" / "flower.json").read_text())
        with np.load(work / "deploy" / "state.npz") as z:
            state = {k: z[k] for k in ref.state}
        rows.append((f"Flower loopback deployment ({args.nodes} SuperNodes)", _per_round(recs),
                     meta["discovery_seconds"],
                     statistics.median(r["wire"]["bytes_down"] for r in recs),
                     statistics.median(r["wire"]["bytes_up"] for r in recs), same(state)))
        print(f"deployment: {time.perf_counter() - tick:.1f} s", flush=True)

    print()
    print(f"{'run':<42} {'s/round':>9} {'ratio':>8} {'discovery s':>12} {'MB down':>9} "
          f"{'MB up':>8} {'up/min':>7} {'same state':>10}")
    for name, t, disc, down, up, eq in rows:
        print(f"{name:<42} {t:>9.3f} {t / base:>8.1f} "
              f"{'-' if disc is None else f'{disc:.1f}':>12} "
              f"{'-' if down is None else f'{down / 1e6:.2f}':>9} "
              f"{'-' if up is None else f'{up / 1e6:.2f}':>8} "
              f"{'-' if up is None else f'{up / minimum:.3f}':>7} {eq:>10}")
    print(f"minimum each way: {minimum / 1e6:.2f} MB per round; results under {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
