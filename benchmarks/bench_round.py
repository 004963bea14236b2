"""One A-FRS round on citeulike-a: seconds per round against the round's minimal memory traffic.

A round of federated Adam with mean aggregation on citeulike-a samples 55
clients (e = 0.01 of 5,551); D = 2 · 16,980 · 64 = 2,173,440 parameters. Its
minimal memory traffic is every client's upload (m, v, θ) written once and the
server state (m̄, v̄, θ̄) read once per client: 2 · 55 · 3 · D · 4 bytes in
float32. The benchmark measures the machine's copy bandwidth in the same run
(np.copyto between pre-touched arrays, bytes read + written per second), turns
the minimal traffic into a time, and compares the measured round with it. It
also reports the process's peak memory and that of a short
`rfrs-ref train --dataset citeulike-a` run, measured in a fresh process started
before this one allocates (its own VmHWM, which is not inherited).

A second case times an A-RFRS round (Krum on recovered gradients, the ascent
attack with α = 0.4) on the same data, and reports its ratio to the A-FRS round.
A third times the A-FRS round as it was before the server's one pass (the
verification screen, then the weighted sums, each reading every upload): the
same rounds, bit for bit, so the ratio of the two is the one pass's gain. A
fourth times the A-RFRS round as it was before the server built the features
while it verified (recovery, then the screened verification, each reading every
upload) and before the rule was told that the verified uploads are finite (so
that it read them once more for NaN and ±inf): again the same rounds, so the
ratio is those two changes' gain. A fifth times the A-FRS round computing every
client's FISM rows in full, where the round computes the Q rows that clients share
(2λq outside each client's own items) once per round: the same rounds, bit for bit,
so the ratio is that change's gain. A sixth and a seventh time Fig. 4's "No defense"
(the weighted mean under the ascent attack with α = 0.4): streamed, each Byzantine
upload computed with the honest ones (the rule on −g, and on −2λq once for the shared
rows), and holding every upload while the attack rewrites the Byzantine rows, as every
attacked round did before: the same rounds, bit for bit. The next two do the same
for Fig. 2's camouflage attack (α = 0.4), whose streamed round computes every row in
full (its diagnostics sum over each client's whole row). The last times the A-RFRS
round with every client's rows in full, where the round computes the rows the clients
share once (FISM's Q outside the sampled clients' items, one row per class of client):
the same states, Krum's distances summed in another grouping (docs/performance.md,
"Robust rounds on shared rows"). The fourth column (the A-RFRS round as before the
one read) computes every row in full too.

Usage: RFRS_DATA_DIR=../shared/data python benchmarks/bench_round.py [--rounds 10] [--dtype float32]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from machine import describe


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


#: run in the child: the CLI, then its own high-water mark of resident memory.
#: VmHWM belongs to the process's address space, which exec replaces, so it is
#: not inherited from the parent (getrusage's ru_maxrss survives exec on Linux
#: and would report the parent's peak if that were larger)
_CHILD = """
import atexit, os, sys
def _report():
    with open('/proc/self/status') as fh:
        hwm = next(line for line in fh if line.startswith('VmHWM'))
    with open(os.environ['RFRS_BENCH_HWM'], 'w') as out:
        out.write(hwm.split()[1])
atexit.register(_report)
from rfrs_ref.cli.main import main
sys.argv = ['rfrs-ref'] + sys.argv[1:]
main()
"""


def cli_peak(dataset: str, rounds: int) -> tuple[float, float]:
    """(wall seconds, peak resident GiB) of `rfrs-ref train` in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        hwm = os.path.join(tmp, "hwm")
        cmd = [sys.executable, "-c", _CHILD, "train", "--dataset", dataset,
               "--rounds", str(rounds), "--eval-every", str(rounds), "--out", os.path.join(tmp, "run")]
        tick = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=tmp,
                       env={**os.environ, "RFRS_BENCH_HWM": hwm})
        wall = time.perf_counter() - tick
        with open(hwm) as fh:
            return wall, int(fh.read()) / 2**20  # KiB -> GiB


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="citeulike-a")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--no-verify", action="store_true",
                    help="the paper's A-FRS exactly: no update-rule verification")
    ap.add_argument("--skip-cli", action="store_true", help="skip the peak-memory run of the CLI")
    ap.add_argument("--interleaved", action="store_true",
                    help="only the A-FRS round, the A-RFRS round and the A-RFRS round with every "
                         "row in full, their rounds alternating (fairer on a shared machine)")
    args = ap.parse_args(argv)
    print(describe())
    if args.interleaved:
        return interleaved(args)

    # the CLI's run first, in a fresh process, while this one is still small
    cli = None if args.skip_cli else cli_peak(args.dataset, 20)

    from rfrs_ref.federated.config import TrainConfig

    verify = False if args.no_verify else None
    afrs = TrainConfig(dataset=args.dataset, dtype=args.dtype, rounds=args.rounds + args.warmup,
                       verify=verify)
    # A-RFRS: Krum on recovered gradients, under the ascent attack with α = 0.4
    arfrs = TrainConfig(dataset=args.dataset, dtype=args.dtype, rounds=args.rounds + args.warmup,
                        verify=verify, defense="krum", detect="gradient", attack="ascent",
                        byzantine_fraction=0.4)
    base = time_rounds(afrs, args.rounds, args.warmup)
    robust = time_rounds(arfrs, args.rounds, args.warmup, data=base["data"])
    two_pass = time_rounds(afrs, args.rounds, args.warmup, data=base["data"], two_pass=True)
    robust_two = time_rounds(arfrs, args.rounds, args.warmup, data=base["data"], two_pass=True,
                             shared_rows=False)
    # A-RFRS with every client's rows in full, as before its round computed the rows the
    # clients share once (the same states; Krum's distances summed in another grouping)
    robust_whole = time_rounds(arfrs, args.rounds, args.warmup, data=base["data"],
                               shared_rows=False)
    whole = time_rounds(afrs, args.rounds, args.warmup, data=base["data"], shared_rows=False)
    # Fig. 4's "No defense": the weighted mean under ascent at α = 0.4, streamed (the
    # Byzantine uploads computed with the honest ones) and holding every upload (the
    # attack rewriting the Byzantine rows), as every attacked round did before
    attacked = dataclasses.replace(afrs, attack="ascent", byzantine_fraction=0.4)
    asc = time_rounds(attacked, args.rounds, args.warmup, data=base["data"])
    asc_held = time_rounds(attacked, args.rounds, args.warmup, data=base["data"], full=True,
                           attack_after=True)
    # Fig. 2: the weighted mean under camouflage at α = 0.4, the same two ways
    camo = dataclasses.replace(afrs, attack="camouflage", byzantine_fraction=0.4)
    cam = time_rounds(camo, args.rounds, args.warmup, data=base["data"])
    cam_held = time_rounds(camo, args.rounds, args.warmup, data=base["data"], full=True,
                           attack_after=True)

    n, D = base["n"], base["D"]
    itemsize = np.dtype(args.dtype).itemsize
    minimal_bytes = 2 * n * base["k"] * D * itemsize
    bw = copy_bandwidth(n * D * itemsize)
    t_min = minimal_bytes / bw
    peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB

    print(f"dataset {args.dataset}: {base['data'].n_users} clients, {n} per round, D = {D:,}, "
          f"{args.dtype}, verification {'on' if base['verify'] else 'off'}")
    print(f"{'quantity':<50} {'A-FRS':>10} {'A-RFRS':>10} {'2 passes':>10} {'A-RFRS 2p':>10} "
          f"{'full rows':>10} {'ascent':>10} {'asc. held':>10} {'camouflage':>10} "
          f"{'cam. held':>10} {'A-RFRS full':>11}")
    print(f"{'copy bandwidth (read + write), GB/s':<50} {bw / 1e9:>10.2f}")
    print(f"{'minimal traffic per round, GB':<50} {minimal_bytes / 1e9:>10.3f}")
    print(f"{'minimal-traffic time, s':<50} {t_min:>10.3f}")
    cases = (base, robust, two_pass, robust_two, whole, asc, asc_held, cam, cam_held, robust_whole)
    print(f"{'round, median of %d, s' % args.rounds:<50} "
          + " ".join(f"{r['median']:>10.3f}" for r in cases))
    print(f"{'round / minimal-traffic time':<50} "
          + " ".join(f"{r['median'] / t_min:>10.2f}" for r in cases))
    print(f"{'A-RFRS round / A-FRS round':<50} {'':>10} {robust['median'] / base['median']:>10.2f}")
    print(f"{'A-FRS round, two passes / one pass':<50} {'':>10} {'':>10} "
          f"{two_pass['median'] / base['median']:>10.2f}")
    print(f"{'A-RFRS round, two passes / one read':<50} {'':>10} {'':>10} {'':>10} "
          f"{robust_two['median'] / robust['median']:>10.2f}")
    print(f"{'A-FRS round, full rows / shared rows once':<50} {'':>10} {'':>10} {'':>10} "
          f"{'':>10} {whole['median'] / base['median']:>10.2f}")
    print(f"{'No defense under ascent: held / streamed':<50} {'':>10} {'':>10} {'':>10} "
          f"{'':>10} {'':>10} {'':>10} {asc_held['median'] / asc['median']:>10.2f}")
    print(f"{'No defense under ascent, streamed / A-FRS round':<50} {'':>10} {'':>10} {'':>10} "
          f"{'':>10} {'':>10} {asc['median'] / base['median']:>10.2f}")
    print(f"{'camouflage: held / streamed':<50} {'':>10} {'':>10} {'':>10} {'':>10} {'':>10} "
          f"{'':>10} {'':>10} {'':>10} {cam_held['median'] / cam['median']:>10.2f}")
    print(f"{'A-RFRS round, every row in full / shared rows once':<50} "
          f"{robust_whole['median'] / robust['median']:>10.2f}")
    print(f"{'A-RFRS round, every row in full / A-FRS round':<50} "
          f"{robust_whole['median'] / base['median']:>10.2f}")
    for name in dict.fromkeys(p for r in cases for p in r["phases"]):
        cells = [f"{float(np.median(r['phases'][name])):>10.3f}" if name in r["phases"] else f"{'-':>10}"
                 for r in cases]
        print(f"{'  ' + name + ', s':<50} {' '.join(cells)}")
    print(f"{'peak memory of this process (both cases), GiB':<50} {peak_self:>10.2f}")

    if cli is not None:
        print(f"{'rfrs-ref train, 20 rounds: wall s':<50} {cli[0]:>10.1f}")
        print(f"{'rfrs-ref train: peak memory (fresh process), GiB':<50} {cli[1]:>10.2f}")


def interleaved(args) -> None:
    """A-FRS, A-RFRS (shared rows once) and A-RFRS (every row in full): round t of each
    in turn, so that a machine's load falls on the three alike; medians and phases."""
    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.round import run_round
    from rfrs_ref.federated.trainer import Trainer

    rounds = args.rounds + args.warmup
    afrs = TrainConfig(dataset=args.dataset, dtype=args.dtype, rounds=rounds)
    arfrs = dataclasses.replace(afrs, defense="krum", detect="gradient", attack="ascent",
                                byzantine_fraction=0.4)
    first = Trainer(afrs)
    cases = {"A-FRS": (first, True), "A-RFRS": (Trainer(arfrs, data=first.data), True),
             "A-RFRS full": (Trainer(arfrs, data=first.data), False)}
    runs = {}
    for name, (trainer, shared) in cases.items():
        buf = trainer.buffers(shared_rows=shared)
        runs[name] = [trainer, buf, trainer.initial_state()[0], [], {}]
    for t in range(1, rounds + 1):
        for name, run in runs.items():
            trainer, buf, state, times, phases = run
            tick = time.perf_counter()
            run[2], rec = run_round(trainer.federation, state, t, buf, None)
            if t > args.warmup:
                times.append(time.perf_counter() - tick)
                for k, v in rec["timing"].items():
                    phases.setdefault(k, []).append(v)
    D = first.model.n_params()
    n = runs["A-FRS"][1].n_max
    bw = copy_bandwidth(n * D * np.dtype(args.dtype).itemsize)
    t_min = 2 * n * len(first.optimizer.arrays) * D * np.dtype(args.dtype).itemsize / bw
    print(f"dataset {args.dataset}: {n} clients a round, D = {D:,}, {args.dtype}; rounds "
          f"alternating, median of {args.rounds}; copy bandwidth {bw / 1e9:.1f} GB/s, "
          f"minimal-traffic time {t_min:.3f} s")
    print(f"{'quantity':<34}" + "".join(f"{k:>14}" for k in runs))
    med = {k: float(np.median(r[3])) for k, r in runs.items()}
    print(f"{'round, s':<34}" + "".join(f"{med[k]:>14.3f}" for k in runs))
    print(f"{'round / A-FRS round':<34}" + "".join(f"{med[k] / med['A-FRS']:>14.2f}" for k in runs))
    print(f"{'round / minimal-traffic time':<34}" + "".join(f"{med[k] / t_min:>14.2f}" for k in runs))
    for ph in dict.fromkeys(p for r in runs.values() for p in r[4]):
        print(f"{'  ' + ph + ', s':<34}" + "".join(
            f"{float(np.median(r[4][ph])):>14.3f}" if ph in r[4] else f"{'-':>14}"
            for r in runs.values()))


def time_rounds(config, rounds: int, warmup: int, data=None, two_pass: bool = False,
                shared_rows: bool = True, full: bool = False, attack_after: bool = False) -> dict:
    """Median round time and per-phase times of ``config`` after ``warmup`` rounds
    (``two_pass``: the weighted mean without the server's one pass; a robust rule with
    recovery and verification as separate passes over the uploads; ``shared_rows``
    False: a streamed round computes every client's rows in full; ``full``: the round
    holds every upload even where the run could stream; ``attack_after``: an elementwise
    attack rewrites the Byzantine uploads after the client rule, from the kept honest
    gradients, as before it was computed in the client rule)."""
    from rfrs_ref.federated import round as round_module
    from rfrs_ref.federated.round import run_round
    from rfrs_ref.federated.trainer import Trainer

    trainer = Trainer(config, data=data)
    fed = trainer.federation
    one_read = round_module._features_in_one_read
    in_rule = round_module.Federation.attacks_in_client_rule
    if two_pass and not getattr(fed.rule, "has_fixed_weights", False):
        # the server's passes as they were: recovery, then verification; and the rule
        # handed a plain mapping of the uploads, which it reads again for NaN and ±inf
        round_module._features_in_one_read = lambda fed: False
        rule_cls = type(fed.rule)

        class AsBefore(rule_cls):
            def aggregate(self, features, arrays, *a, **kw):
                return super().aggregate(features, dict(arrays), *a, **kw)

        fed = dataclasses.replace(fed, rule=AsBefore(**{
            f.name: getattr(fed.rule, f.name) for f in dataclasses.fields(fed.rule)}))
    elif two_pass:
        from rfrs_ref.aggregate.mean import Mean

        class TwoPassMean(Mean):
            has_fixed_weights = False  # the round verifies, then combines

        fed = dataclasses.replace(fed, rule=TwoPassMean())
    state, private = trainer.initial_state()
    # the two-pass round holds every upload, as every round did before
    buf = trainer.buffers(full=two_pass or full)
    buf.shared_rows = shared_rows
    times, phases = [], {}
    try:
        if attack_after:
            round_module.Federation.attacks_in_client_rule = property(lambda self: False)
        for t in range(1, warmup + rounds + 1):
            tick = time.perf_counter()
            state, rec = run_round(fed, state, t, buf, private)
            dt = time.perf_counter() - tick
            if t > warmup:
                times.append(dt)
                for name, v in rec["timing"].items():
                    phases.setdefault(name, []).append(v)
    finally:
        round_module._features_in_one_read = one_read
        round_module.Federation.attacks_in_client_rule = in_rule
    out = {"median": float(np.median(times)), "phases": phases, "data": trainer.data,
           "n": buf.n_max, "D": trainer.model.n_params(),
           "k": len(trainer.optimizer.arrays),
           "verify": trainer.config.verify}
    del trainer, buf, state  # free this case's buffers before the next one
    return out

if __name__ == "__main__":
    main()
