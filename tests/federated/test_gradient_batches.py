"""A run that reads no gradient after the client rule computes gradients a batch of
clients at a time (``RoundBuffers(grad_rows=)``), and a run that streams goes from the
gradients to the weighted sums a batch at a time (``RoundBuffers(upload_rows=)``): the same
rounds, bit for bit, with less memory (docs/performance.md)."""

from __future__ import annotations

import numpy as np
import pytest

from rfrs_ref.federated.config import TrainConfig
from rfrs_ref.federated.round import GRADIENT_BATCH, RoundBuffers, run_round
from rfrs_ref.federated.trainer import Trainer

SMALL = dict(n_users=200, n_items=120, n_clusters=4, mean_items=10.0)


def _rounds(trainer, buf, rounds=4):
    state, private = trainer.initial_state()
    records = []
    for t in range(1, rounds + 1):
        state, rec = run_round(trainer.federation, state, t, buf, private)
        rec.pop("timing")
        records.append(rec)
    return state, private, records


def _buffers(trainer, grad_rows, upload_rows=None):
    fed, c = trainer.federation, trainer.config
    n = trainer.buffers(full=True).uploads["theta"].shape[0]
    return RoundBuffers(n, trainer.model.n_params(), c.dtype, trainer.optimizer.arrays,
                        private_dim=trainer.model.dim if trainer.model.has_private else 0,
                        features=fed.needs_features, grad_rows=grad_rows, upload_rows=upload_rows)


def _same_rounds(a, b, label):
    for k in a[0]:
        assert np.array_equal(a[0][k].view(np.uint8), b[0][k].view(np.uint8)), (label, k)
    if a[1] is not None:
        for k in a[1]:
            assert np.array_equal(a[1][k], b[1][k]), (label, k)
    assert a[2] == b[2], label


@pytest.mark.parametrize("model,negatives,optimizer", [
    ("fism", 0, "adam"), ("fism", 1, "momentum"), ("fmf", 0, "adagrad"), ("fmf", 1, "sgd")])
def test_batches_of_gradients_give_the_same_rounds(model, negatives, optimizer):
    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.1,
                         model=model, model_params={"dim": 8, "negatives": negatives},
                         optimizer=optimizer, seed=3)
    trainer = Trainer(config)
    assert not trainer.federation.keeps_gradients
    full = _rounds(trainer, _buffers(trainer, None))
    for rows in (1, 3, 7):
        _same_rounds(full, _rounds(trainer, _buffers(trainer, rows)), rows)
    # streamed: gradients to weighted sums by batches of 4, 8, 16 (20 clients a round)
    assert trainer.federation.streams
    for rows in (4, 8, 16):
        _same_rounds(full, _rounds(trainer, _buffers(trainer, rows, rows)), ("streamed", rows))


@pytest.mark.parametrize("verify", [True, False])
def test_the_trainer_streams_the_weighted_mean(verify):
    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                         verify=verify, seed=1)
    trainer = Trainer(config)
    buf = trainer.buffers()
    assert buf.uploads["theta"].shape[0] == GRADIENT_BATCH < 40
    _same_rounds(_rounds(trainer, trainer.buffers(full=True)), _rounds(trainer, buf), verify)
    for kw in (dict(defense="krum"), dict(detect="gradient", resilience=True),
               dict(attack="noise", byzantine_fraction=0.2)):
        other = Trainer(TrainConfig(dataset="synthetic", dataset_params=SMALL,
                                    client_fraction=0.2, **kw))
        assert not other.federation.streams
        assert other.buffers().uploads["theta"].shape[0] == 40


def test_an_upload_that_fails_verification_in_a_streamed_round_is_excluded(corrupt_one_upload):
    """A client whose upload fails verification (here a client rule that writes NaN for
    one client) is excluded as in a round that holds every upload."""
    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2, seed=2)
    trainer = Trainer(config)
    full = _rounds(trainer, trainer.buffers(full=True), rounds=2)
    streamed = _rounds(trainer, trainer.buffers(), rounds=2)
    _same_rounds(full, streamed, "corrupt")
    assert all(len(r["excluded"]) >= 1 for r in streamed[2])


def test_the_trainer_keeps_every_gradient_only_when_a_run_reads_them():
    base = dict(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2)
    plain = Trainer(TrainConfig(**base))
    assert plain.buffers().grads.shape[0] == min(GRADIENT_BATCH, 40)
    for kw in (dict(attack="noise", byzantine_fraction=0.2), dict(resilience=True),
               dict(attack="ascent", byzantine_fraction=0.2, resilience=True)):
        t = Trainer(TrainConfig(**base, **kw))
        assert t.federation.keeps_gradients and not t.federation.streams
        assert t.buffers().grads.shape[0] == 40
    # an elementwise attack is computed in the client rule: gradients a batch at a time,
    # and with the weighted mean the round streams
    t = Trainer(TrainConfig(**base, attack="ascent", byzantine_fraction=0.2))
    assert t.federation.streams
    assert t.buffers().grads.shape[0] == t.buffers().uploads["theta"].shape[0] == GRADIENT_BATCH
    t = Trainer(TrainConfig(**base, attack="ascent", byzantine_fraction=0.2, defense="krum"))
    assert not t.federation.keeps_gradients and not t.federation.streams
    assert t.buffers().grads.shape[0] == GRADIENT_BATCH
    assert t.buffers().uploads["theta"].shape[0] == 40


def test_a_run_that_reads_gradients_refuses_a_short_buffer():
    trainer = Trainer(TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                                  attack="noise", byzantine_fraction=0.2))
    state, private = trainer.initial_state()
    with pytest.raises(ValueError, match="gradient buffer holds 4 rows for 40 clients"):
        run_round(trainer.federation, state, 1, _buffers(trainer, 4), private)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "adagrad", "rmsprop"])
@pytest.mark.parametrize("negatives,verify", [(0, True), (1, True), (0, False)])
def test_a_streamed_round_computes_the_shared_rows_once_with_the_same_bits(
        optimizer, negatives, verify, monkeypatch):
    """FISM's Q rows outside a client's items are 2λq for every client: the streamed round
    computes their upload once (``_shared_rows_round``), and gives the state and record of
    the round that computes every client's row in full, bit for bit."""
    from rfrs_ref.model.fism import FISM

    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                         model_params={"dim": 8, "negatives": negatives}, optimizer=optimizer,
                         verify=verify, seed=5)
    trainer = Trainer(config)
    assert trainer.federation.streams
    calls = []
    shared = FISM.shared_gradient
    monkeypatch.setattr(FISM, "shared_gradient", lambda self, th: calls.append(1) or shared(self, th))
    for rows in (4, 16):
        whole = _buffers(trainer, rows, rows)
        whole.shared_rows = False
        before = len(calls)
        want = _rounds(trainer, whole, rounds=5)
        assert len(calls) == before
        got = _rounds(trainer, _buffers(trainer, rows, rows), rounds=5)
        assert len(calls) == before + 5
        _same_rounds(want, got, (optimizer, rows))


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "adagrad", "rmsprop"])
@pytest.mark.parametrize("model,negatives,verify", [
    ("fism", 0, True), ("fism", 1, True), ("fism", 0, False), ("fmf", 0, True)])
def test_an_elementwise_attack_streams_with_the_same_bits(optimizer, model, negatives, verify,
                                                          monkeypatch):
    """Under gradient ascent with the weighted mean (Fig. 4's "No defense"), the streamed
    round computes each Byzantine upload with the honest ones (the rule on −g, and for
    FISM's shared rows the rule on −2λq once): the same state and record as the round
    that holds every upload and lets the attack rewrite the Byzantine rows, bit for bit."""
    from rfrs_ref.attack.basic import Ascent

    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                         model=model, model_params={"dim": 8, "negatives": negatives},
                         optimizer=optimizer, verify=verify, attack="ascent",
                         byzantine_fraction=0.3, seed=7)
    trainer = Trainer(config)
    assert trainer.federation.streams
    applied, own = [], []
    apply, own_inplace = Ascent.apply_inplace, Ascent.own_gradient_inplace
    monkeypatch.setattr(Ascent, "apply_inplace", lambda self, ctx: applied.append(1) or apply(self, ctx))
    monkeypatch.setattr(Ascent, "own_gradient_inplace",
                        lambda self, g: own.append(1) or own_inplace(self, g))
    from rfrs_ref.federated.round import Federation

    with monkeypatch.context() as held:        # the attack as it ran on held uploads
        held.setattr(Federation, "attacks_in_client_rule", property(lambda self: False))
        want = _rounds(trainer, trainer.buffers(full=True), rounds=5)
    assert len(applied) == 5                   # the attack rewrote Byzantine rows every round
    assert all(r["n_byzantine_sampled"] >= 4 for r in want[2])
    for rows, shared in ((4, True), (16, True), (16, False)):
        buf = _buffers(trainer, rows, rows)
        buf.shared_rows = shared
        before, own_before = len(applied), len(own)
        got = _rounds(trainer, buf, rounds=5)
        assert len(applied) == before and len(own) > own_before
        _same_rounds(want, got, (optimizer, model, rows, shared))


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adagrad"])
@pytest.mark.parametrize("defense,detect", [
    ("krum", "gradient"), ("krum", "parameter"), ("trmean", "parameter"), ("rfa", "gradient"),
    ("median", "gradient")])
def test_ascent_in_the_client_rule_gives_the_same_robust_rounds(optimizer, defense, detect,
                                                                monkeypatch):
    """A robust round under gradient ascent computes the Byzantine uploads in the client
    rule, a batch of gradients at a time (the rule on −g), where the attack used to
    overwrite the honest uploads with the rule on −g: the same state and record, bit for
    bit, against the round that keeps every honest gradient and runs ``apply_inplace``."""
    from rfrs_ref.federated.round import Federation

    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                         model_params={"dim": 8}, optimizer=optimizer, defense=defense,
                         detect=detect, attack="ascent", byzantine_fraction=0.3, seed=11)
    trainer = Trainer(config)
    assert trainer.federation.attacks_in_client_rule and not trainer.federation.keeps_gradients
    # every row in full (Krum's round on shared rows has its own test file)
    got = _rounds(trainer, trainer.buffers(shared_rows=False), rounds=4)
    assert trainer.buffers().grads.shape[0] == GRADIENT_BATCH < 40
    monkeypatch.setattr(Federation, "attacks_in_client_rule", property(lambda self: False))
    assert trainer.federation.keeps_gradients
    want = _rounds(trainer, trainer.buffers(), rounds=4)
    assert all(r["n_byzantine_sampled"] >= 4 for r in want[2])
    _same_rounds(want, got, (optimizer, defense, detect))


@pytest.mark.parametrize("defense", ["mean", "krum"])
@pytest.mark.parametrize("negatives,verify", [(0, True), (1, True), (0, False)])
def test_camouflage_in_the_client_rule_gives_the_same_rounds_and_diagnostics(
        defense, negatives, verify, monkeypatch):
    """Camouflage (Fig. 2) computes each Byzantine client's g̃ from its own gradient, a
    batch at a time before the client rule: with the weighted mean the round streams
    (every row in full: its diagnostics sum over each client's whole row), with Krum it
    holds the uploads. Both give the state, the record and the attack's diagnostics of
    the round that keeps the honest gradients and runs ``apply_inplace``, bit for bit."""
    from rfrs_ref.federated.round import Federation

    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                         model_params={"dim": 8, "negatives": negatives}, verify=verify,
                         defense=defense, attack="camouflage", byzantine_fraction=0.3, seed=13)
    trainer = Trainer(config)
    fed = trainer.federation
    assert fed.attacks_in_client_rule and not fed.keeps_gradients
    assert fed.streams == (defense == "mean")
    with monkeypatch.context() as held:
        held.setattr(Federation, "attacks_in_client_rule", property(lambda self: False))
        want = _rounds(trainer, trainer.buffers(), rounds=5)
    assert all(r["attack"]["camouflaged_fraction"] > 0 for r in want[2][1:])
    for rows in ((4, 16) if defense == "mean" else (None,)):
        buf = trainer.buffers() if rows is None else _buffers(trainer, rows, rows)
        _same_rounds(want, _rounds(trainer, buf, rounds=5), (defense, rows))


@pytest.mark.parametrize("defense,low_memory", [("mean", False), ("krum", False), ("krum", True),
                                                ("trmean", False)])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_a_ra_in_the_client_rule_gives_the_same_rounds_and_diagnostics(defense, low_memory,
                                                                       optimizer, monkeypatch):
    """A-ra's Byzantine uploads are the client rule on its promotion gradient, computed a
    batch of clients at a time with the honest ones, the draws of each client from the
    round's one attack stream in the order of the Byzantine rows (kept, so that a
    low-memory round's second pass reuses them): the state, the record and the attack's
    diagnostics (the targets, every Byzantine row's ‖g‖) of the round that keeps the honest
    gradients and runs ``apply_inplace`` over the whole round, bit for bit. With the
    weighted mean the round streams (batches of 4 and 16, FISM's shared rows once or every
    row in full); Krum and the trimmed mean hold their uploads, here on full rows (their
    rounds on shared rows: tests/federated/test_shared_rows_compared.py)."""
    from rfrs_ref.federated.round import Federation

    config = TrainConfig(dataset="synthetic", dataset_params=SMALL, client_fraction=0.2,
                         model_params={"dim": 8}, optimizer=optimizer, defense=defense,
                         detect="parameter", attack="a-ra", attack_params={"n_targets": 3},
                         byzantine_fraction=0.3, verify=True, seed=17)
    trainer = Trainer(config, low_memory=low_memory)
    fed = trainer.federation
    assert fed.attacks_in_client_rule and not fed.keeps_gradients
    assert fed.streams == (defense == "mean") and fed.recomputes_uploads == low_memory
    with monkeypatch.context() as held:
        held.setattr(Federation, "attacks_in_client_rule", property(lambda self: False))
        want = _rounds(trainer, trainer.buffers(full=True, shared_rows=False), rounds=5)
    assert all(len(r["attack"]["gradient_norm"]) == r["n_byzantine_sampled"] >= 2
               for r in want[2])
    if defense == "mean":
        bufs = []
        for rows, shared in ((4, True), (16, True), (16, False)):
            buf = _buffers(trainer, rows, rows)
            buf.shared_rows = shared
            bufs.append(buf)
    else:
        bufs = [trainer.buffers(shared_rows=False)]
    for buf in bufs:
        _same_rounds(want, _rounds(trainer, buf, rounds=5), (defense, low_memory, optimizer))
