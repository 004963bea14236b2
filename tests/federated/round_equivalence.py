"""Server-state digests of 50 rounds on ML100K for every optimiser × rule × detection space × attack.

The digests in ``data/round_digests_ml100k.json`` were recorded from the round
loop as it stood before its verification was screened and its phases split
(the reference); ``test_round_equivalence.py`` replays every configuration on
the numba backend and requires the same server state, bit for bit, after
round 50 (a digest of every array of the state).

Numba compiles for the host CPU (LLVM's name for it: znver4, rocketlake...), and the
kernels whose sums use fast-math reassociation may group terms differently on another
CPU, so each recording names the CPU it was made on (``host_cpu``) and the test uses the
one of the CPU it runs on. Record for a new CPU from the code before a change (a clean
checkout of the earlier commit, installed), or again when a change of results is
intended and documented:

    RFRS_DATA_DIR=... python tests/federated/round_equivalence.py tests/federated/data/round_digests_ml100k-CPU.json

A recording may also list, under ``changed``, configurations whose results a documented
change altered after it was made (with the reason): the test skips them on that CPU until
they are recorded there again. RFA's steps on the distance matrix changed two of them
(the ALIE attack in gradient space with Adam and RMSProp); rocketlake's digests of those
were recorded again, znver4's are listed as changed. The znver3 recording (an AMD EPYC
with AVX2 only) was made from the code before the gradient-space rounds derived their
features in the rules' kernels (docs/performance.md, "Gradient-space rounds without
feature rows").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys

import numpy as np

DATASET = "ml100k"
ROUNDS = 50
#: a small embedding keeps 360 runs of 50 rounds to minutes; the round's code
#: paths do not depend on d
DIM = 8
CLIENT_FRACTION = 0.01
BYZANTINE_FRACTION = 0.4


#: the rules the digests were recorded with; rules added since have no earlier
#: results to keep (their own tests compare them with their NumPy oracle)
RECORDED_RULES = ("mean", "krum", "median", "trmean", "rfa", "bulyan")
#: the attacks the digests were recorded with; attacks added since have no earlier
#: results to keep (tests/attack checks them against their oracles and ByzFL)
RECORDED_ATTACKS = ("none", "ascent", "noise", "camouflage", "alie", "ipm")


def configurations():
    """(optimizer, rule, detect, attack) of every run the round loop accepts, for the
    rules of :data:`RECORDED_RULES` and the attacks of :data:`RECORDED_ATTACKS`."""
    from rfrs_ref.attack import ATTACKS
    from rfrs_ref.optim import OPTIMIZERS

    out = []
    for opt in OPTIMIZERS.names():
        for rule in RECORDED_RULES:
            for detect in ("gradient", "parameter"):
                for attack in (a for a in ATTACKS.names() if a in RECORDED_ATTACKS):
                    try:
                        ATTACKS.get(attack)().check_optimizer(opt)
                    except ValueError:
                        continue
                    out.append((opt, rule, detect, attack))
    return out


def digest(state) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(np.ascontiguousarray(state[k]).tobytes())
    return h.hexdigest()[:20]


def run(data, opt, rule, detect, attack, low_memory_rows: int | None = None,
        shared_columns: bool = False) -> str | None:
    """The digest of the server state after round ``ROUNDS``; ``low_memory_rows``: the
    run's robust rounds hold that many uploads at a time and compute them twice
    (``Trainer(low_memory=True)``; None when ``Federation.recomputes_uploads`` does not
    hold for the run), on full rows, or, ``shared_columns``, on the columns where the
    clients differ of the rounds that compute the shared rows once (the trainer's
    buffers' columns)."""
    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.round import run_round
    from rfrs_ref.federated.trainer import Trainer

    from rfrs_ref.aggregate import RULES

    # 9 clients a round cannot meet Bulyan's n ≥ 4f + 3 at α = 0.4: such rules take
    # the largest f that they can
    fields = {f.name for f in dataclasses.fields(RULES.get(rule))}
    defense_params = {"fallback": "reduce-f"} if "fallback" in fields else {}
    trainer = Trainer(TrainConfig(
        dataset=DATASET, optimizer=opt, defense="none" if rule == "mean" else rule,
        defense_params=defense_params,
        detect=detect, attack=attack, byzantine_fraction=0.0 if attack == "none" else BYZANTINE_FRACTION,
        model_params={"dim": DIM}, rounds=ROUNDS, client_fraction=CLIENT_FRACTION,
        backend="numba", dtype="float32", seed=0), data=data,
        low_memory=low_memory_rows is not None)
    state, private = trainer.initial_state()
    buf = trainer.buffers()
    if low_memory_rows is not None:
        from rfrs_ref.federated.round import RoundBuffers

        if not trainer.federation.recomputes_uploads:
            return None  # e.g. SGD, whose uploads are not verified by default
        columns = None
        if shared_columns:
            assert buf.shared_columns, "the run's rounds do not compute the shared rows once"
            columns = buf.features.shape[1]
        buf = RoundBuffers(buf.n_max, buf.n_params, buf.dtype, buf.names,
                           features=buf.features is not None, grad_rows=low_memory_rows,
                           upload_rows=low_memory_rows, columns=columns)
    for t in range(1, ROUNDS + 1):
        state, _ = run_round(trainer.federation, state, t, buf, private)
    return digest(state)


def main(path: str) -> None:
    from rfrs_ref.data import load_dataset

    data = load_dataset(DATASET)
    table = {}
    for cfg in configurations():
        table["/".join(cfg)] = run(data, *cfg)
        print("/".join(cfg), table["/".join(cfg)], flush=True)
    import llvmlite.binding

    with open(path, "w") as fh:
        json.dump({"dataset": DATASET, "rounds": ROUNDS, "dim": DIM,
                   "host_cpu": llvmlite.binding.get_host_cpu_name(), "digests": table}, fh,
                  indent=1, sort_keys=True)
        fh.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
