"""One A-FRS round on citeulike-a: seconds per round against the round's minimal memory traffic.

A round of federated Adam with mean aggregation on citeulike-a samples 55
clients (e = 0.01 of 5,551); D = 2 · 16,980 · 64 = 2,173,440 parameters. Its
minimal memory traffic is every client's upload (m, v, θ) written once and the
server state (m̄, v̄, θ̄) read once per client: 2 · 55 · 3 · D · 4 bytes in
float32. The benchmark measures the machine's copy bandwidth in the same run
(np.copyto between pre-touched arrays, bytes read + written per second), turns
the minimal traffic into a time, and compares the measured round with it. It
also reports the process's peak memory and that of a short
`rfrs-ref train --dataset citeulike-a` run.

Usage: RFRS_DATA_DIR=../shared/data python benchmarks/bench_round.py [--rounds 10] [--dtype float32]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np


def copy_bandwidth(nbytes: int, repeats: int = 5) -> float:
    """Bytes moved (read + written) per second by np.copyto on pre-touched arrays."""
    a = np.ones(nbytes // 4, dtype=np.float32)
    b = np.ones_like(a)
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * a.nbytes / best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="citeulike-a")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--no-verify", action="store_true",
                    help="the paper's A-FRS exactly: no update-rule verification")
    ap.add_argument("--skip-cli", action="store_true", help="skip the peak-memory run of the CLI")
    args = ap.parse_args(argv)

    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.trainer import Trainer
    from rfrs_ref.federated.round import run_round

    trainer = Trainer(TrainConfig(dataset=args.dataset, dtype=args.dtype, rounds=args.rounds + args.warmup,
                                  verify=False if args.no_verify else None))
    fed = trainer.federation
    state, private = trainer.initial_state()
    buf = trainer.buffers()
    n = buf.grads.shape[0]
    D = trainer.model.n_params()
    itemsize = np.dtype(args.dtype).itemsize
    k = len(trainer.optimizer.arrays)

    times, phases = [], {}
    for t in range(1, args.warmup + args.rounds + 1):
        tick = time.perf_counter()
        state, rec = run_round(fed, state, t, buf, private)
        dt = time.perf_counter() - tick
        if t > args.warmup:
            times.append(dt)
            for name, v in rec["timing"].items():
                phases.setdefault(name, []).append(v)

    minimal_bytes = 2 * n * k * D * itemsize
    bw = copy_bandwidth(n * D * itemsize)
    t_min = minimal_bytes / bw
    med = float(np.median(times))
    peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB

    print(f"dataset {args.dataset}: {trainer.data.n_users} clients, {n} per round, D = {D:,}, {args.dtype}, "
          f"verification {'on' if trainer.config.verify else 'off'}")
    print(f"{'quantity':<44} {'value':>12}")
    print(f"{'copy bandwidth (read + write), GB/s':<44} {bw / 1e9:>12.2f}")
    print(f"{'minimal traffic per round, GB':<44} {minimal_bytes / 1e9:>12.3f}")
    print(f"{'minimal-traffic time, s':<44} {t_min:>12.3f}")
    print(f"{'round, median of %d, s' % len(times):<44} {med:>12.3f}")
    print(f"{'round / minimal-traffic time':<44} {med / t_min:>12.2f}")
    for name, v in phases.items():
        print(f"{'  ' + name + ', s':<44} {float(np.median(v)):>12.3f}")
    print(f"{'peak memory of this process, GiB':<44} {peak_self:>12.2f}")

    if not args.skip_cli:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "rfrs_ref.cli.main", "train", "--dataset", args.dataset,
                   "--rounds", "20", "--eval-every", "20", "--out", os.path.join(tmp, "run")]
            tick = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=tmp)
            wall = time.perf_counter() - tick
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        print(f"{'rfrs-ref train, 20 rounds: wall s':<44} {wall:>12.1f}")
        print(f"{'rfrs-ref train: peak memory, GiB':<44} {peak:>12.2f}")


if __name__ == "__main__":
    main()
