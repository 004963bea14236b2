"""The round loop gives today's server states bit for bit (numba backend, ML100K, 50 rounds,
on a CPU for which digests were recorded).

Every optimiser × rule × detection space × attack the loop accepts (α = 0.4
under attack), replayed and compared with the digest recorded from the round
loop before its verification was screened (see ``round_equivalence.py``): a
change of any verdict, any row order, or any sum's order changes the digest.

Two tiers. By default (the README's test command, the CI's) the ML100K replays cover every
configuration of Adam (every rule, space and attack) and, for every other
optimiser, every rule in both spaces under gradient ascent: 120 of the 312,
every optimiser, rule, space and attack at least once. The Last.fm comparisons
of two code paths run 20 rounds. ``RFRS_EQUIVALENCE=all`` replays all 312 and
runs the Last.fm comparisons for 50 rounds: run it before changing anything the
round computes (docs/performance.md, "Results are unchanged, bit for bit").
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).parent
#: every replay (RFRS_EQUIVALENCE=all), or the default tier
EVERY = os.environ.get("RFRS_EQUIVALENCE", "").strip().lower() == "all"


def _host_cpu() -> str:
    import llvmlite.binding

    return llvmlite.binding.get_host_cpu_name()


def _recordings() -> dict[str, dict]:
    """host CPU -> the digests recorded on it. Numba compiles for the host CPU, and the
    kernels' vectorised sums (fast-math ``reassoc``/``contract``) may group their terms
    differently on another CPU, so a digest holds for the CPU it was recorded on."""
    out = {}
    for path in sorted((HERE / "data").glob("round_digests_ml100k*.json")):
        rec = json.loads(path.read_text())
        out[rec["host_cpu"]] = rec
    return out


RECORDINGS = _recordings()
RECORDED = RECORDINGS.get(_host_cpu())

sys.path.insert(0, str(HERE))
import round_equivalence as eq  # noqa: E402

sys.path.pop(0)


@pytest.fixture(scope="module")
def ml100k(data_dir):
    from rfrs_ref.data import load_dataset

    try:
        return load_dataset(eq.DATASET, data_dir)
    except Exception as exc:  # the set is not in RFRS_DATA_DIR
        pytest.skip(f"{eq.DATASET} not available: {exc}")


@pytest.mark.parametrize("host", sorted(RECORDINGS))
def test_the_recordings_are_of_these_configurations(host):
    """The znver4 and rocketlake recordings cover every configuration; one of another
    CPU may cover part of them (the rest are skipped there)."""
    rec = RECORDINGS[host]
    assert rec["rounds"] == eq.ROUNDS and rec["dim"] == eq.DIM
    every = sorted("/".join(c) for c in eq.configurations())
    changed = rec.get("changed", {})
    assert set(rec["digests"]) <= set(every) and not set(rec["digests"]) & set(changed)
    assert all(reason.strip() for reason in changed.values())
    if host in ("znver4", "rocketlake"):
        # a configuration whose results a documented change altered after the recording
        # is listed with the change, until it is recorded again on that CPU
        assert sorted({*rec["digests"], *changed}) == every


def test_the_recordings_agree_wherever_the_cpus_round_alike():
    """Most configurations give the same bits on every recorded CPU (the differences are
    in the few kernels whose sums the compiler may regroup per CPU)."""
    recs = list(RECORDINGS.values())
    if len(recs) < 2:
        pytest.skip("one CPU recorded")
    common = set.intersection(*(set(r["digests"]) for r in recs))
    same = sum(all(r["digests"][c] == recs[0]["digests"][c] for r in recs) for c in common)
    assert same >= len(common) // 2


def _default_tier(config: tuple[str, ...]) -> bool:
    """Adam's every configuration, and every other optimiser's rules in both spaces under
    gradient ascent (the paper's attack)."""
    opt, _, _, attack = config
    return opt == "adam" or attack == "ascent"


def _replayed() -> list[str]:
    return sorted("/".join(c) for c in eq.configurations() if EVERY or _default_tier(c))


def test_the_default_tier_covers_every_optimiser_rule_space_and_attack():
    every, tier = eq.configurations(), [c for c in eq.configurations() if _default_tier(c)]
    for i in range(4):
        assert {c[i] for c in tier} == {c[i] for c in every}, i
    assert {(c[0], c[1], c[2]) for c in tier} == {(c[0], c[1], c[2]) for c in every}


@pytest.mark.slow
@pytest.mark.parametrize("config", _replayed())
def test_server_state_after_50_rounds_is_unchanged(config, ml100k):
    if RECORDED is None:
        pytest.skip(f"no digests recorded on this CPU ({_host_cpu()}; recorded: "
                    f"{', '.join(sorted(RECORDINGS))}); see round_equivalence.py to record them "
                    "from the code before a change")
    if config in RECORDED.get("changed", {}):
        pytest.skip(f"{config}: changed since it was recorded on this CPU: "
                    f"{RECORDED['changed'][config]}")
    if config not in RECORDED["digests"]:
        pytest.skip(f"{config} was not recorded on this CPU ({_host_cpu()})")
    assert eq.run(ml100k, *config.split("/")) == RECORDED["digests"][config], config


def _low_memory_configurations():
    """The recorded runs whose robust rounds can recompute their uploads: a rule that
    combines by weights (Krum, RFA) under no attack or one computed in the client rule."""
    return sorted("/".join(c) for c in eq.configurations()
                  if c[1] in ("krum", "rfa") and c[3] in ("none", "ascent", "camouflage")
                  and (EVERY or _default_tier(c)))


@pytest.mark.slow
@pytest.mark.parametrize("config", _low_memory_configurations())
def test_low_memory_rounds_give_the_recorded_server_state(config, ml100k):
    """The same digests with the uploads held 4 at a time and computed twice
    (``Trainer(low_memory=True)``, 9 clients a round: three batches, then the kept
    clients again)."""
    if RECORDED is None or config not in RECORDED["digests"]:
        pytest.skip(f"{config}: no digest recorded on this CPU ({_host_cpu()})")
    got = eq.run(ml100k, *config.split("/"), low_memory_rows=4)
    if got is None:
        pytest.skip(f"{config}: its rounds do not recompute their uploads (no verification)")
    assert got == RECORDED["digests"][config], config


@pytest.mark.slow
@pytest.mark.parametrize("config", ["adam/krum/gradient/ascent", "adam/rfa/parameter/ascent",
                                    "adagrad/krum/parameter/none"])
def test_low_memory_rounds_on_shared_rows_give_the_recorded_server_state(config, ml100k):
    """The same digests in low memory on the columns where the clients differ (the rows
    they share computed once, the uploads of 4 clients held, the weighed ones computed
    again there)."""
    if RECORDED is None or config not in RECORDED["digests"]:
        pytest.skip(f"{config}: no digest recorded on this CPU ({_host_cpu()})")
    got = eq.run(ml100k, *config.split("/"), low_memory_rows=4, shared_columns=True)
    assert got == RECORDED["digests"][config], config


@pytest.fixture(scope="module")
def lastfm(data_dir):
    from rfrs_ref.data import load_dataset

    try:
        return load_dataset("lastfm", data_dir)
    except Exception as exc:  # the set is not in RFRS_DATA_DIR
        pytest.skip(f"lastfm not available: {exc}")


#: rounds of the Last.fm comparisons (two code paths on this machine, no recording)
LASTFM_ROUNDS = eq.ROUNDS if EVERY else 20


def _final_state(trainer, buf):
    """The server state after :data:`LASTFM_ROUNDS` rounds of ``trainer``'s run on ``buf``."""
    from rfrs_ref.federated.round import run_round

    state, private = trainer.initial_state()
    for t in range(1, LASTFM_ROUNDS + 1):
        state, _ = run_round(trainer.federation, state, t, buf, private)
    return state


def _same_states(a, b):
    import numpy as np

    for k in a:
        assert np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)), k


@pytest.mark.slow
@pytest.mark.parametrize("negatives", [0, 1])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "adagrad", "rmsprop"])
def test_shared_rows_give_the_same_50_rounds_on_lastfm(optimizer, negatives, lastfm):
    """Last.fm's 18 clients a round stream in two batches; computing FISM's shared Q rows
    once per round (``_shared_rows_round``) gives the server state of computing every
    client's rows in full, bit for bit, after 20 rounds (50 with RFRS_EQUIVALENCE=all; d = 8,
    verification on)."""
    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.trainer import Trainer

    trainer = Trainer(TrainConfig(dataset="lastfm", optimizer=optimizer,
                                  model_params={"dim": eq.DIM, "negatives": negatives}, seed=0),
                      data=lastfm)
    assert trainer.federation.streams
    finals = []
    for shared in (False, True):
        buf = trainer.buffers()
        assert buf.uploads["theta"].shape[0] < trainer.buffers(full=True).uploads["theta"].shape[0]
        buf.shared_rows = shared
        finals.append(_final_state(trainer, buf))
    _same_states(*finals)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "adagrad", "rmsprop"])
def test_a_streamed_ascent_round_gives_the_same_50_rounds_on_lastfm(optimizer, lastfm,
                                                                     monkeypatch):
    """Fig. 4's "No defense" (the weighted mean under gradient ascent, α = 0.4) streams on
    Last.fm, the Byzantine uploads computed with the honest ones: after 20 rounds (50 with
    RFRS_EQUIVALENCE=all) the
    server state equals the round that holds every upload and lets the attack rewrite the
    Byzantine rows afterwards, bit for bit (d = 8, verification on)."""
    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.round import Federation
    from rfrs_ref.federated.trainer import Trainer

    trainer = Trainer(TrainConfig(dataset="lastfm", optimizer=optimizer, attack="ascent",
                                  byzantine_fraction=0.4, model_params={"dim": eq.DIM}, seed=0),
                      data=lastfm)
    assert trainer.federation.streams
    streamed = _final_state(trainer, trainer.buffers())
    monkeypatch.setattr(Federation, "attacks_in_client_rule", property(lambda self: False))
    assert not trainer.federation.streams
    _same_states(_final_state(trainer, trainer.buffers()), streamed)


@pytest.mark.slow
@pytest.mark.parametrize("detect", ["gradient", "parameter"])
@pytest.mark.parametrize("defense,optimizer", [
    (d, o) for d in ("krum", "rfa", "trmean") for o in ("sgd", "adam")] + [("meamed", "adam")])
def test_robust_rounds_on_shared_rows_give_the_same_50_rounds_on_lastfm(defense, optimizer,
                                                                      detect, lastfm):
    """Krum (A-RFRS in gradient space), RFA, the trimmed mean and Meamed under gradient ascent
    (α = 0.4) on Last.fm, its 18 clients a round in two batches: computing the rows the
    clients share once (``_shared_rows_compared_round``) gives the server state of
    computing every row in full, bit for bit, after 20 rounds (50 with RFRS_EQUIVALENCE=all;
    d = 8, verification on).
    The trimmed mean's and Meamed's columns are the kernel's operations; the distances are summed in
    another grouping, and here no Krum score came within their rounding of another, nor
    did RFA's weights, 1e-15 apart, round any aggregate otherwise (docs/performance.md,
    "Robust rounds on shared rows")."""
    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.trainer import Trainer

    trainer = Trainer(TrainConfig(dataset="lastfm", optimizer=optimizer, defense=defense,
                                  detect=detect, attack="ascent", byzantine_fraction=0.4,
                                  verify=True, model_params={"dim": eq.DIM}, seed=0),
                      data=lastfm)
    assert trainer.federation.compares_shared_rows
    finals = [_final_state(trainer, trainer.buffers(shared_rows=shared)) for shared in (False, True)]
    _same_states(*finals)


@pytest.mark.slow
@pytest.mark.parametrize("defense,detect,attack", [
    ("median", "gradient", "a-ra"), ("median", "parameter", "ascent"),
    ("trmean", "gradient", "ascent"), ("trmean", "parameter", "a-ra"),
    ("meamed", "gradient", "ascent"), ("meamed", "parameter", "a-ra")])
def test_rules_behind_nnm_reading_equal_rows_once_give_the_same_rounds_on_lastfm(
        defense, detect, attack, lastfm, monkeypatch):
    """The median, the trimmed mean and Meamed behind NNM (Adam, α = 0.2, the defences
    ranking's runs) read the mixed rows that are equal bit for bit once each
    (``Rule.aggregate_copies``): the server state after 20 rounds (50 with
    RFRS_EQUIVALENCE=all) is that of writing every mixed row out, bit for bit, and the
    rounds did take the rows once (d = 8, verification on)."""
    import dataclasses

    from rfrs_ref.aggregate.base import Rule
    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.trainer import Trainer

    taken = []
    real = Rule.aggregate_copies
    monkeypatch.setattr(Rule, "aggregate_copies",
                        lambda self, *a, **k: taken.append(1) or real(self, *a, **k))
    trainer = Trainer(TrainConfig(dataset="lastfm", optimizer="adam", pre=("nnm",),
                                  defense=defense, detect=detect, attack=attack,
                                  byzantine_fraction=0.2, verify=True,
                                  model_params={"dim": eq.DIM}, seed=0), data=lastfm)
    once = _final_state(trainer, trainer.buffers())
    assert taken
    fed = trainer.federation
    fed.rule = dataclasses.replace(fed.rule, write_copies=True)
    _same_states(_final_state(trainer, trainer.buffers()), once)
