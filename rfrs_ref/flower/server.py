"""The paper's server (Algorithm 2) as a Flower ServerApp.

:class:`FlowerTrainer` is the in-process :class:`~rfrs_ref.federated.trainer.Trainer`
(configuration, evaluation, checkpoints, run directory, the same writers)
whose rounds run on a Flower federation instead of in this process. Round t:

1. sample the round's clients with the run's stream
   (:func:`rfrs_ref.federated.round.sample_round`: ``sampling`` keyed t, and
   f = floor(α_assumed · |sampled|));
2. send each sampled user's node a ``train`` message: the server state (one
   array per optimiser array) and {round t, user};
3. wait for the replies (at most ``round_timeout`` seconds); a client whose
   node reports an error, or that does not answer in time, is *dropped* from
   the round; an answer that is not an upload of the run's shape and dtype is
   *malformed* and enters the round as a row of NaN, which update-rule
   verification excludes as it excludes any non-finite upload;
4. :func:`rfrs_ref.federated.round.server_round` on the rows of the clients
   that answered, in ascending client order: recovery, verification,
   detection features, the rule, the new state: the in-process code.

Drop-outs. f stays floor(α_assumed · |sampled|), the count for the clients
the server sampled: the Byzantine clients among those that answered are a
subset of the sampled ones, so the assumption the server made when it sampled
still bounds them; each verification exclusion reduces it by one as in the
simulation. A rule whose precondition the answered clients no longer meet
(e.g. Krum's n > 2f + 2) applies its fallback; a rule configured to raise
instead (fallback ``error``, checked when the run starts) runs that round with
``reduce-f`` (the largest f its precondition allows), recorded in the round's
``dropout_fallback``: a drop-out is not a configuration error, and the run
goes on. The round record lists the
``sampled`` clients, the ``dropped`` ones (neither Byzantine nor honest:
absent) and the ``malformed`` ones; ``clients`` are those that answered.

What the server cannot do on a federation, refused before anything runs: the
resilience monitor (it compares recovered with *honest* gradients, which only
the clients hold); ``assumed_byzantine = "exact"`` (the server would have to be
told who is Byzantine); models with private client vectors (FMF: the server
evaluates with them).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import pathlib
import time

import numpy as np

from rfrs_ref.federated.round import sample_round, server_round
from rfrs_ref.federated.trainer import Trainer
from rfrs_ref.flower.client import (
    ATTACK, METRICS, QUERY_USERS, ROUND, STATE, UPLOAD, USERS, check_attack_runs_on_a_node,
    config_digest)

#: seconds a round waits for its replies by default
ROUND_TIMEOUT = 600.0
#: seconds the server waits for the nodes of every user to connect by default
CONNECT_TIMEOUT = 120.0
#: the most a node's attack diagnostics may hold: bytes of JSON text, nesting depth (an
#: attack's own are a flat object of numbers and short lists, well inside both)
DIAGNOSTICS_MAX_BYTES = 1 << 16
DIAGNOSTICS_MAX_DEPTH = 8


def check_federation_config(config) -> None:
    """Raise ValueError if ``config`` asks for what a server on a federation cannot do
    (see the module docstring); names the value and the reason."""
    c = config.resolved()
    if c.resilience:
        raise ValueError("resilience=True compares the recovered gradients with the clients' "
                         "honest gradients, which a server on a federation does not have; run "
                         "the resilience monitor with the in-process trainer (rfrs-ref train "
                         "--resilience)")
    if isinstance(c.assumed_byzantine, str):
        raise ValueError(f"assumed_byzantine={c.assumed_byzantine!r} tells the server who is "
                         "Byzantine, which a server on a federation cannot know; give a fraction")
    if c.model == "fmf":
        raise ValueError("model 'fmf' keeps private client vectors that the server evaluates "
                         "with; on a Flower federation use fism")
    if c.backend == "cuda":
        raise ValueError("backend 'cuda' is not supported on a Flower federation; use numba "
                         "(or numpy, the oracle)")
    check_attack_runs_on_a_node(c.attack)


def message_bytes(msg) -> int:
    """Bytes of a Flower message as it travels: its serialised object tree (the
    message, its records, arrays and array chunks; identical chunks once)."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return sum(len(o.deflate()) for o in get_all_nested_objects(msg).values())


class FlowerTrainer(Trainer):
    """A :class:`Trainer` whose clients are the nodes of a Flower federation (``grid``).

    Args:
        config: the run's TrainConfig.
        grid: the ServerApp's :class:`flwr.serverapp.Grid`.
        round_timeout: seconds a round waits for replies before dropping the missing.
        connect_timeout: seconds to wait for nodes holding every user to connect.
        data: the dataset already loaded (as :class:`Trainer`).

    Every upload arrives over the wire, so a non-finite one is input, whoever sent it
    (a node that is honest in the configuration may still be compromised, or its reply
    corrupted): verification excludes it and the run goes on; it never ends the run as a
    divergence (``Trainer.uploads_computed_here``).
    """

    uploads_computed_here = False

    def __init__(self, config, grid, *, round_timeout: float = ROUND_TIMEOUT,
                 connect_timeout: float = CONNECT_TIMEOUT, data=None) -> None:
        check_federation_config(config)
        super().__init__(config, data=data)
        self.grid = grid
        self.round_timeout = float(round_timeout)
        self.connect_timeout = float(connect_timeout)
        self.node_of: dict[int, int] | None = None
        self.discovery_seconds: float | None = None
        self.wire = {"bytes_down": 0, "bytes_up": 0, "messages": 0}
        self.digest = config_digest(self.config)

    # -- nodes -----------------------------------------------------------------------
    def discover(self) -> dict[int, int]:
        """user → node id, asking every connected node which users it holds; waits up to
        ``connect_timeout`` for every user to have a node (users still without one are
        dropped whenever sampled)."""
        from flwr.app import Message, RecordDict

        started = time.monotonic()
        deadline = started + self.connect_timeout
        node_of: dict[int, int] = {}
        asked: set[int] = set()
        n_users = self.data.n_users
        while True:
            new = [int(n) for n in self.grid.get_node_ids() if int(n) not in asked]
            if new:
                msgs = [Message(RecordDict(), dst_node_id=n, message_type=QUERY_USERS)
                        for n in new]
                left = max(1.0, deadline - time.monotonic())
                for reply in self.grid.send_and_receive(msgs, timeout=left):
                    if reply.has_error():
                        continue
                    node = int(reply.metadata.src_node_id)
                    asked.add(node)
                    for u in _read_users(reply, node):
                        if not 0 <= u < n_users:
                            continue
                        if node_of.setdefault(u, node) != node:
                            raise ValueError(
                                f"nodes {node_of[u]} and {node} both say they hold user {u}: "
                                "each user's data is on one node (node config users); give "
                                "the nodes disjoint users and start the run again")
            if len(node_of) == n_users or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        self.node_of = node_of
        self.discovery_seconds = time.monotonic() - started
        return node_of

    # -- one round -------------------------------------------------------------------
    def buffers(self, full: bool = True):
        """Every row: the uploads arrive from the nodes all together, one row each."""
        return super().buffers(full=True)

    def run_round(self, state, t: int, buf, private=None):
        from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

        if self.node_of is None:
            self.discover()
        fed, names = self.federation, self.optimizer.arrays
        rd = sample_round(fed, t)
        tick = time.perf_counter()
        content = RecordDict({STATE: ArrayRecord({k: Array(np.ascontiguousarray(state[k]))
                                                  for k in names})})
        msgs, unreachable = {}, []
        for c in rd.clients.tolist():
            node = self.node_of.get(c)
            if node is None:
                unreachable.append(c)
                continue
            rc = RecordDict({STATE: content.array_records[STATE],
                             ROUND: ConfigRecord({"round": t, "user": c,
                                                  "config": self.digest})})
            msgs[c] = Message(rc, dst_node_id=node, message_type="train", group_id=str(t))
        bytes_down = sum(message_bytes(m) for m in msgs.values())
        sent_ids = {}
        replies = list(self.grid.send_and_receive(list(msgs.values()), timeout=self.round_timeout))
        for c, m in msgs.items():
            sent_ids[m.metadata.message_id] = c
        by_client = {}
        for r in replies:
            c = sent_ids.get(r.metadata.reply_to_message_id)
            if c is not None:
                by_client[c] = r
        wait = time.perf_counter() - tick

        D, dtype = self.model.n_params(), self.dtype
        dropped, malformed = [], []
        rows, n_samples, losses, byz, diags = [], [], [], [], {}
        bytes_up = 0
        for i, c in enumerate(rd.clients.tolist()):
            r = by_client.get(c)
            if r is None:
                dropped.append({"client": c, "reason": "unreachable" if c in unreachable
                                else f"no reply within {self.round_timeout:g} s"})
                continue
            if r.has_error():
                dropped.append({"client": c, "reason": f"node error {r.error.code}: "
                                f"{(r.error.reason or '').strip()[-300:]}"})
                continue
            bytes_up += message_bytes(r)
            row = len(rows)
            rows.append(c)
            own = int(self.federation.n_samples[c])
            upload, n, loss, role, diag, problem = _read_reply(r, names, D, dtype, own,
                                                               bool(rd.byz[i]),
                                                               node=self.node_of.get(c))
            for k in names:
                buf.uploads[k][row] = upload[k] if upload is not None else np.nan
            if problem:
                malformed.append({"client": c, "reason": problem})
            n_samples.append(n)
            losses.append(loss)
            byz.append(role)
            if diag:
                diags[str(c)] = diag
        m = len(rows)
        answered = dataclasses.replace(
            rd, clients=np.asarray(rows, dtype=np.int64), byz=np.asarray(byz, dtype=bool),
            n_samples=np.asarray(n_samples, dtype=np.int64), timing={"clients": wait})
        U = {k: buf.uploads[k][:m] for k in names}
        fed, fallback = self._federation_for(m, rd.f, dropped)
        new_state, record = server_round(fed, state, answered, U, buf,
                                         losses=np.asarray(losses, dtype=np.float64),
                                         attack_diag={"per_client": diags} if diags else {})
        if malformed:
            # a malformed reply's loss is no loss: the round's is the mean of the others'
            bad = {m["client"] for m in malformed}
            kept = [x for c, x, b in zip(rows, losses, byz) if c not in bad and not b]
            record["loss"] = float(np.mean(kept)) if kept else None
        if fallback:
            record["dropout_fallback"] = fallback
        record["sampled"] = rd.clients.tolist()
        record["dropped"] = dropped
        record["malformed"] = malformed
        record["wire"] = {"bytes_down": bytes_down, "bytes_up": bytes_up,
                          "messages": len(msgs) + len(by_client)}
        self.wire["bytes_down"] += bytes_down
        self.wire["bytes_up"] += bytes_up
        self.wire["messages"] += record["wire"]["messages"]
        return new_state, record


    def _federation_for(self, m: int, f: int, dropped: list):
        """The federation for a round where ``m`` clients answered: the run's own, or, when
        drop-outs leave fewer clients than the rule's precondition needs for f and the rule
        would raise, the same with the rule's ``reduce-f`` fallback for this round."""
        from rfrs_ref.aggregate import PreconditionError

        fed = self.federation
        rule = fed.rule
        if not dropped or m == 0 or getattr(rule, "fallback", None) != "error":
            return fed, None
        try:
            rule.check(m, min(f, m))
            return fed, None
        except (PreconditionError, ValueError) as exc:
            reason = str(exc)
        narrowed = copy.copy(fed)
        narrowed.rule = dataclasses.replace(rule, fallback="reduce-f")
        return narrowed, {"answered": m, "f": f, "fallback": "reduce-f", "because": reason}


def _read_users(reply, node: int) -> list[int]:
    """The user ids of ``node``'s reply to the ``query`` message: a list of integers in
    the ConfigRecord ``users``; any other reply is a ValueError naming the node (the
    server cannot tell which users such a node holds, and runs nothing on a guess)."""
    try:
        users = reply.content.config_records[USERS]["users"]
    except Exception as exc:  # noqa: BLE001 - a hostile reply is input, not a crash
        users = exc
    if not isinstance(users, list) or not all(
            isinstance(u, (int, np.integer)) and not isinstance(u, bool) for u in users):
        what = (f"{type(users).__name__}: {users}" if isinstance(users, Exception)
                else f"{users!r}"[:200])
        raise ValueError(f"node {node} answered the query of the users it holds with a "
                         f"malformed reply ({what}), not a list of user ids in the config "
                         f"record {USERS!r}: run rfrs-ref's ClientApp of the same version "
                         "on every node")
    return [int(u) for u in users]


def _read_reply(reply, names, D: int, dtype, own: int, configured: bool = False,
                node: int | None = None) -> tuple:
    """(upload or None, n_samples, loss, role, diagnostics, problem) of one reply; a reply
    that is not an upload of ``D`` values of ``dtype`` per array, whose ``n_samples`` is
    not ``own`` (the user's training-set size in the server's copy of the data), whose
    ``loss`` is not a finite number, whose ``byzantine`` is not 0 or 1, or whose attack
    diagnostics are not strict JSON of an attack's form (:func:`_read_diagnostics`, the
    problem naming ``node``) is malformed (``problem`` says why; the upload is then None
    and enters the round as NaN, the loss is NaN, the role is ``configured``, the user's
    in the run's Byzantine set, and the diagnostics are none).
    The n_samples returned is ``own`` whatever the node reports: the rule's weights never
    take a node's word for its size."""
    content = reply.content
    problem = ""
    upload = None
    n, loss, role, diag = own, math.nan, bool(configured), {}
    try:
        ar = content.array_records[UPLOAD]
        arrays = {}
        for k in names:
            if k not in ar:
                raise ValueError(f"no array {k!r}")
            a = ar[k].numpy()
            if a.shape != (D,) or a.dtype != dtype:
                raise ValueError(f"array {k!r} is {a.dtype}{list(a.shape)}, expected {dtype}[{D}]")
            arrays[k] = a
        upload = arrays
    except Exception as exc:  # noqa: BLE001 - a hostile reply is input, not a crash
        problem = f"upload: {exc}"
    try:
        mr = content.metric_records[METRICS]
        n_raw = mr["n_samples"]
        if not (isinstance(n_raw, (int, np.integer)) and not isinstance(n_raw, bool)
                and 1 <= n_raw < 2 ** 62):
            raise ValueError(f"n_samples {n_raw!r} is not a positive integer")
        if int(n_raw) != own:
            raise ValueError(f"n_samples {int(n_raw)} is not the user's {own} training "
                             "interactions")
        loss_raw, role_raw = mr["loss"], mr["byzantine"]
        if not (isinstance(loss_raw, (int, float, np.integer, np.floating))
                and not isinstance(loss_raw, bool) and math.isfinite(loss_raw)):
            raise ValueError(f"loss {loss_raw!r} is not a finite number")
        if not (isinstance(role_raw, (int, np.integer)) and role_raw in (0, 1)):
            raise ValueError(f"byzantine {role_raw!r} is not 0 or 1")
        loss, role = float(loss_raw), bool(role_raw)
    except Exception as exc:  # noqa: BLE001
        problem = (problem + "; " if problem else "") + f"metrics: {exc}"
        upload = None
    try:
        record = content.config_records[ATTACK] if ATTACK in content.config_records else None
        text = record["diagnostics"] if record is not None and "diagnostics" in record else None
        if text is not None:  # none sent: no diagnostics
            diag = _read_diagnostics(text, node)
    except Exception as exc:  # noqa: BLE001 - a hostile reply is input, not a crash
        problem = (problem + "; " if problem else "") + f"diagnostics: {exc}"
        upload, loss, role, diag = None, math.nan, bool(configured), {}
    return upload, n, loss, role, diag, problem


def _read_diagnostics(text, node: int | None) -> dict:
    """A node's attack diagnostics (the JSON text of its reply's ``attack`` record), read
    as untrusted input: a JSON object of at most :data:`DIAGNOSTICS_MAX_BYTES` bytes,
    nested at most :data:`DIAGNOSTICS_MAX_DEPTH` deep, without a key twice in one object,
    whose numbers are finite (no ``NaN``, ``Infinity`` or ``1e999``, which a node's
    ClientApp writes as null) and whose integers fit 64 bits. Anything else is a
    ValueError naming the node: the reply is refused, never recorded with a NaN or a
    number no reader of the round records can hold."""
    from rfrs_ref.untrusted import depth_exceeds, parse_json

    who = f"node {node}" if node is not None else "the node"
    if not isinstance(text, str):
        raise ValueError(f"{who} sent diagnostics of type {type(text).__name__}, not JSON text")
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > DIAGNOSTICS_MAX_BYTES:
        raise ValueError(f"{who} sent {len(data)} bytes of diagnostics, more than "
                         f"{DIAGNOSTICS_MAX_BYTES}")
    diag = parse_json(data, f"{who}'s diagnostics")
    if not isinstance(diag, dict):
        raise ValueError(f"{who}'s diagnostics are a JSON {type(diag).__name__}, not an object")
    if depth_exceeds(diag, DIAGNOSTICS_MAX_DEPTH):
        raise ValueError(f"{who}'s diagnostics nest more than {DIAGNOSTICS_MAX_DEPTH} deep")
    stack: list = [diag]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, float) and not math.isfinite(x):
            raise ValueError(f"{who}'s diagnostics hold {x!r}, not a finite number (an "
                             "attack's diagnostics write a non-finite value as null)")
        elif isinstance(x, int) and not isinstance(x, bool) and not -2 ** 63 <= x < 2 ** 63:
            raise ValueError(f"{who}'s diagnostics hold an integer of {len(str(abs(x)))} "
                             "digits, beyond 64 bits")
    return diag


def server_app(config=None, run_dir=None, *, round_timeout: float | None = None,
               connect_timeout: float | None = None, resume: bool = False, progress=None,
               results: dict | None = None):
    """A Flower ServerApp that trains ``config`` into ``run_dir`` (None: read both from
    the run config ``config``/``config-file`` and ``run-dir``, as deployed apps do).

    ``results``: a dict that receives ``"result"`` (the TrainResult) and ``"wire"``
    (bytes sent and received) when the run ends, for callers in the same process.
    """
    from rfrs_ref.flower import require_flwr

    require_flwr()
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp

    from rfrs_ref.flower.client import config_from_run_config

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        rc = context.run_config
        cfg = config if config is not None else config_from_run_config(rc)
        out = run_dir if run_dir is not None else rc.get("run-dir") or None
        rt = round_timeout if round_timeout is not None else float(rc.get("round-timeout",
                                                                          ROUND_TIMEOUT))
        ct = connect_timeout if connect_timeout is not None else float(rc.get("connect-timeout",
                                                                            CONNECT_TIMEOUT))
        trainer = FlowerTrainer(cfg, grid, round_timeout=rt, connect_timeout=ct)
        resumed = resume or bool(rc.get("resume", False))
        if out is None:
            result = trainer.run(None, progress=progress)
        else:
            from rfrs_ref.files import DirectoryLock, atomic_write

            # the run directory is this server's from the first file to flower.json: the
            # trainer alone would release it before flower.json is written, and a
            # `train --resume` started in between would share it
            with DirectoryLock(out):
                result = trainer.run(out, resume=resumed, progress=progress, locked=True)
                text = json.dumps({"nodes": {str(u): n for u, n in
                                             sorted(trainer.node_of.items())},
                                   "discovery_seconds": trainer.discovery_seconds,
                                   "wire": trainer.wire}, indent=2) + "\n"
                atomic_write(pathlib.Path(out) / "flower.json",
                             lambda fh: fh.write(text.encode("utf-8")))
        if results is not None:
            results["result"] = result
            results["wire"] = dict(trainer.wire)
            results["nodes"] = dict(trainer.node_of)
            results["discovery_seconds"] = trainer.discovery_seconds

    return app
