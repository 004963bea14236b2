"""Peak memory of a few rounds, one fresh process per kind of run.

    python benchmarks/bench_memory.py                          # citeulike-t, 3 rounds
    python benchmarks/bench_memory.py --dataset citeulike-a --rounds 5

Each case runs in a child process of its own (its high-water mark of resident
memory, ``VmHWM``, is then that run's alone: a parent's would be inherited
through fork): the dataset, the trainer, its round buffers and the rounds,
without evaluation. The target of docs/performance.md is a citeulike-t run
within 2.5 GB. Cases: A-FRS (the weighted mean, no attack), "No defense" under
the ascent attack at α = 0.4, A-RFRS (Krum on recovered gradients) and RFA
(parameter space) under the same attack, holding every upload and with
``low_memory`` (``--low-memory``: the uploads 16 clients at a time, the
weighed clients' computed twice, on the columns where the clients differ), and
A-RFRS (held and in low memory), the trimmed mean, the median, Meamed and Bulyan with
every client's rows in full where their rounds compute the rows the clients share once and
hold the columns where they differ only (docs/performance.md, "Robust rounds on shared
rows"; on parameters those rounds then hold no feature rows, "Parameter-space rounds
without feature rows"). ``--only TEXT`` runs the cases whose name contains TEXT. Prints the machine, then a table: peak GiB,
the round buffers' GiB, the median round time and, for low memory, the
time of the second computation.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from machine import describe  # noqa: E402

_CHILD = """
import json, sys, time
import numpy as np
from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.round import run_round
from rfrs_ref.federated.trainer import Trainer

dataset, rounds, fields, low = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4] == "1"
trainer = Trainer(TrainConfig(dataset=dataset, seed=0, **fields), low_memory=low)
state, private = trainer.initial_state()
buf = trainer.buffers(shared_rows=sys.argv[5] == "1")
times, again = [], []
for t in range(1, rounds + 1):
    tick = time.perf_counter()
    state, rec = run_round(trainer.federation, state, t, buf, private)
    times.append(time.perf_counter() - tick)
    again.append(rec["timing"].get("uploads_again", float("nan")))
with open("/proc/self/status") as fh:
    hwm = int(next(line for line in fh if line.startswith("VmHWM")).split()[1])
print(json.dumps({"peak": hwm / 2**20, "buffers": buf.nbytes / 2**30,
                  "round": float(np.median(times[1:] or times)),
                  "again": float(np.median(again[1:] or again)),
                  "recomputes": trainer.federation.recomputes_uploads}))
"""

ASCENT = {"attack": "ascent", "byzantine_fraction": 0.4}
BULYAN = {"defense": "bulyan", "detect": "parameter", "defense_params": {"fallback": "reduce-f"}}
#: (name, configuration fields, low memory, shared rows)
CASES = [
    ("A-FRS", {}, False, True),
    ("No defense, ascent", ASCENT, False, True),
    ("A-RFRS, ascent", {**ASCENT, "defense": "krum", "detect": "gradient"}, False, True),
    ("A-RFRS, ascent, every row", {**ASCENT, "defense": "krum", "detect": "gradient"}, False,
     False),
    ("A-RFRS, ascent, low memory", {**ASCENT, "defense": "krum", "detect": "gradient"}, True,
     True),
    ("A-RFRS, ascent, low mem., every row", {**ASCENT, "defense": "krum", "detect": "gradient"},
     True, False),
    ("Krum (parameters), ascent", {**ASCENT, "defense": "krum", "detect": "parameter"}, False,
     True),
    ("RFA, ascent", {**ASCENT, "defense": "rfa", "detect": "parameter"}, False, True),
    ("RFA, ascent, low memory", {**ASCENT, "defense": "rfa", "detect": "parameter"}, True, True),
    ("Trmean, ascent", {**ASCENT, "defense": "trmean", "detect": "parameter"}, False, True),
    ("Trmean, ascent, every row", {**ASCENT, "defense": "trmean", "detect": "parameter"}, False,
     False),
    ("Median, ascent", {**ASCENT, "defense": "median", "detect": "parameter"}, False, True),
    ("Meamed, ascent", {**ASCENT, "defense": "meamed", "detect": "parameter"}, False, True),
    ("Meamed, ascent, every row", {**ASCENT, "defense": "meamed", "detect": "parameter"}, False,
     False),
    # n = 79 cannot meet Bulyan's n ≥ 4f + 3 at α = 0.4: the largest f it tolerates
    ("Bulyan, ascent", {**ASCENT, **BULYAN}, False, True),
    ("Bulyan, ascent, every row", {**ASCENT, **BULYAN}, False, False),
]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="citeulike-t")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=None, help="the cases whose name contains this text")
    args = ap.parse_args(argv)
    print(describe())
    print(f"{args.dataset}, {args.rounds} rounds per case, a fresh process each "
          f"(RFRS_DATA_DIR={os.environ.get('RFRS_DATA_DIR', 'unset')})")
    print(f"{'case':<36} {'peak, GiB':>10} {'buffers, GiB':>13} {'round, s':>9} {'again, s':>9}")
    for name, fields, low, shared in CASES:
        if args.only and args.only.lower() not in name.lower():
            continue
        out = subprocess.run([sys.executable, "-c", _CHILD, args.dataset, str(args.rounds),
                              json.dumps(fields), "1" if low else "0", "1" if shared else "0"],
                             capture_output=True, text=True, cwd="/")
        if out.returncode != 0:
            print(f"{name:<36} failed: {out.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        if low and not r["recomputes"]:
            name += " (not applicable)"
        again = "" if r["again"] != r["again"] else f"{r['again']:.3f}"
        print(f"{name:<36} {r['peak']:>10.2f} {r['buffers']:>13.2f} {r['round']:>9.3f} {again:>9}")


if __name__ == "__main__":
    main()
