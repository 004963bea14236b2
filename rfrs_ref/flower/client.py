"""The paper's client (Algorithm 1) as a Flower ClientApp.

A node holds the training items of one user (or of several: the node config
says which), loaded through :mod:`rfrs_ref.data` and split with the run's seed
exactly as the in-process trainer splits them. On a ``train`` message (the
server state and the round t) it computes, for the user named in the message,

1. the BPR gradient g = ∇ℓ(θ̄ᵗ⁻¹) on its items with the project's kernels
   (the batched kernel on a one-row batch; sampled negatives from the stream
   ``negatives`` keyed (t, user), as in the simulation);
2. the optimiser's client rule, rule(state, g, t): its upload;
3. when Byzantine, the attack, rewriting its own upload (below);

and replies with the upload, its training-set size n, its loss and its role
(the experiment's bookkeeping, which the server records and never uses to
filter).

Byzantine nodes. The role comes from the run's Byzantine set (the stream
``byzantine`` of the seed, floor(α · n_users) users, as in the simulation); a
node config ``attack = "NAME"`` (and ``attack-params = "{json}"``) makes a node
Byzantine with that attack whatever the set says, and ``byzantine = false``
makes it honest. Only attacks that need no other client's data run on a node
(:data:`rfrs_ref.flower.PER_CLIENT_ATTACKS`: none, ascent, noise, camouflage,
inf); ALIE, IPM and the others pool the gradients of several clients and are
refused. The attack runs on a one-row round context: the node's state, gradient
and upload. Its randomness is the round's attack stream (``attack`` keyed t),
which the simulation's attack consumes for the Byzantine rows in ascending
client order; a Byzantine node knows the coalition (the threat model of
docs/attacks.md), so it first lets the attack consume the draws of the
coalition members sampled before it (their rows are placeholders whose results
are discarded) and then runs it on its own row, drawing exactly what the
simulation draws for it.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any, Mapping

import numpy as np

from rfrs_ref.flower import PER_CLIENT_ATTACKS

#: message types and record names shared by the client and the server
QUERY_USERS = "query"
STATE = "state"          # ArrayRecord: the server state, one array per optimiser array
ROUND = "round"          # ConfigRecord: {"round": t, "user": id, "config": digest}
UPLOAD = "upload"        # ArrayRecord: the upload, one (D,) array per optimiser array
METRICS = "metrics"      # MetricRecord: {"n_samples", "loss", "byzantine"}
ATTACK = "attack"        # ConfigRecord: {"diagnostics": JSON text}
USERS = "users"          # ConfigRecord of a query reply: {"users": [ids]}


def config_digest(config) -> str:
    """The first 16 hex digits of the sha256 of the resolved configuration's JSON: the
    server sends it with every round, and a node refuses a round of a configuration
    other than its own (it would compute another run's uploads)."""
    import hashlib

    return hashlib.sha256(config.resolved().dumps().encode("utf-8")).hexdigest()[:16]


def check_attack_runs_on_a_node(name: str, where: str = "") -> None:
    """Raise ValueError unless attack ``name`` runs on one client's own data."""
    if name not in PER_CLIENT_ATTACKS:
        raise ValueError(
            f"attack {name!r}{where} needs more than one client's own data (a colluding attack "
            f"pools the honest gradients of several clients), which a Flower node does not "
            f"hold; on a federation the attacks are "
            f"{', '.join(PER_CLIENT_ATTACKS)} (the in-process trainer runs {name!r})")


@dataclasses.dataclass
class ClientData:
    """What every node of a run derives from the run's configuration.

    ``train`` is the training split of every user, of which a node keeps the rows
    of its own users only (:meth:`items_of`): the split is a pure function of the
    dataset and the seed, so computing it whole is how each node finds its own
    share exactly as the trainer does.
    """

    config: Any                    # TrainConfig, resolved
    model: Any
    optimizer: Any
    attack: Any
    byzantine: np.ndarray          # the run's Byzantine set (n_users,) bool
    n_users: int
    n_items: int
    dtype: np.dtype
    _items: dict

    def items_of(self, user: int) -> np.ndarray:
        try:
            return self._items[int(user)]
        except KeyError:
            raise ValueError(f"this node does not hold user {user}; it holds "
                             f"{sorted(self._items)}") from None


_CACHE: dict[tuple[str, tuple[int, ...]], ClientData] = {}
_CACHE_LOCK = threading.Lock()


def client_data(config, users) -> ClientData:
    """The :class:`ClientData` of ``config`` keeping ``users``' training items (cached
    per process: a node answers every round without loading the data again)."""
    from rfrs_ref.aggregate import PRESETS  # noqa: F401  (registries imported once)
    from rfrs_ref.attack import ATTACKS
    from rfrs_ref.data import load_dataset, split_interactions
    from rfrs_ref.federated.population import byzantine_mask
    from rfrs_ref.model import MODELS
    from rfrs_ref.optim import OPTIMIZERS

    c = config.resolved()
    key = (c.dumps(), tuple(sorted(int(u) for u in users)))
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
        data = load_dataset(c.dataset, c.data_dir, **c.dataset_params)
        split = split_interactions(data, c.seed, c.test_fraction, c.valid_fraction)
        bad = [u for u in key[1] if not 0 <= u < data.n_users]
        if bad:
            raise ValueError(f"users {bad} are not users of {c.dataset} (0..{data.n_users - 1})")
        model = MODELS.get(c.model)(n_items=data.n_items, **c.model_params)
        if model.has_private:
            raise ValueError(f"model {c.model!r} keeps private client vectors that the server "
                             f"evaluates with; on a Flower federation use fism")
        out = ClientData(
            config=c, model=model, optimizer=OPTIMIZERS.get(c.optimizer)(**c.optimizer_params),
            attack=ATTACKS.get(c.attack)(**c.attack_params),
            byzantine=byzantine_mask(c.seed, data.n_users, c.byzantine_fraction),
            n_users=data.n_users, n_items=data.n_items, dtype=np.dtype(c.dtype),
            _items={u: np.array(split.train.items_of(u), dtype=np.int32) for u in key[1]})
        _CACHE[key] = out
        return out


def node_attack(cd: ClientData, user: int, node_config: Mapping[str, Any] | None):
    """The attack this node runs for ``user``, or None when it is honest (see the module
    docstring: the run's Byzantine set, overridden by the node config)."""
    from rfrs_ref.attack import ATTACKS

    node_config = node_config or {}
    if "attack" in node_config:
        params = node_config.get("attack-params") or "{}"
        try:
            params = json.loads(params) if isinstance(params, str) else dict(params)
        except ValueError as exc:
            raise ValueError(f"node config attack-params must be a JSON object, got "
                             f"{params!r} ({exc})") from None
        attack = ATTACKS.get(str(node_config["attack"]))(**params)
    else:
        attack = cd.attack
    byzantine = bool(cd.byzantine[user]) or "attack" in node_config
    if "byzantine" in node_config:
        byzantine = str(node_config["byzantine"]).lower() in ("true", "1", "yes")
    if not byzantine or attack.name == "none":
        return None
    check_attack_runs_on_a_node(attack.name, " (node config)" if "attack" in node_config else "")
    attack.check_optimizer(cd.optimizer)
    return attack


def client_upload(cd: ClientData, user: int, state: Mapping[str, np.ndarray], t: int,
                  attack=None) -> tuple[dict[str, np.ndarray], float, dict]:
    """One client's part of round ``t`` (Algorithm 1): its upload, loss and attack diagnostics.

    ``state``: the server state after round t − 1 (1-D arrays of length D in the run's
    dtype; not modified). ``attack``: :func:`node_attack`'s answer (None: honest).
    Returns ``(upload, loss, diagnostics)``, the upload one (D,) array per optimiser
    array, equal bit for bit to the row the in-process round computes for ``user``.
    """
    from rfrs_ref.data import Interactions
    from rfrs_ref.seeding import generator

    c, model, opt = cd.config, cd.model, cd.optimizer
    D = model.n_params()
    for k in opt.arrays:
        a = state[k]
        if a.shape != (D,) or a.dtype != cd.dtype:
            raise ValueError(f"server state {k!r} is {a.dtype}{list(a.shape)}, expected "
                             f"{cd.dtype}[{D}] for {c.model} on {c.dataset}")
    items = cd.items_of(user)
    mine = Interactions(f"{c.dataset}[user {user}]", 1, cd.n_items,
                        np.array([0, items.size], dtype=np.int64), items)
    negatives = None
    if model.negatives:
        negatives = [model.sample_negatives(items, generator(c.seed, "negatives", t, user))]
    G = np.empty((1, D), cd.dtype)
    losses = model.grads_batch(state["theta"], mine, np.zeros(1, dtype=np.int64), G,
                               negatives=negatives, backend=c.backend)
    U = {k: np.empty((1, D), cd.dtype) for k in opt.arrays}
    opt.client_rule_batch(state, G, t, U, backend=c.backend)
    diag: dict = {}
    if attack is not None:
        diag = _attack_own_row(cd, user, state, t, attack, G, U)
    return {k: U[k][0] for k in opt.arrays}, float(losses[0]), diag


def _attack_own_row(cd: ClientData, user: int, state, t: int, attack, G, U) -> dict:
    """The attack on this client's row, after the draws of the Byzantine clients sampled
    before it (placeholder rows, results discarded) from the round's attack stream."""
    from rfrs_ref.attack import AttackContext
    from rfrs_ref.federated.population import assumed_byzantine, sample_clients
    from rfrs_ref.seeding import generator

    c = cd.config
    sampled = sample_clients(c.seed, t, cd.n_users, c.client_fraction)
    byz = cd.byzantine[sampled]
    before = int(np.count_nonzero(byz & (sampled < user)))
    f = 0 if isinstance(c.assumed_byzantine, str) else assumed_byzantine(c.assumed_byzantine,
                                                                         sampled.size)
    rng = generator(c.seed, "attack", t)
    backend = c.backend
    G.flags.writeable = False
    try:
        if before:
            Gp = np.zeros((before, G.shape[1]), G.dtype)
            Gp.flags.writeable = False
            Up = {k: np.empty((before, G.shape[1]), G.dtype) for k in cd.optimizer.arrays}
            cd.optimizer.client_rule_batch(state, Gp, t, Up, backend=backend)
            attack.apply_inplace(AttackContext(
                t=t, optimizer=cd.optimizer, state=state, grads=Gp, uploads=Up,
                byzantine=np.ones(before, bool), clients=sampled[byz][:before],
                n_samples=np.ones(before, np.int64), f=f, rng=rng, backend=backend))
        return attack.apply_inplace(AttackContext(
            t=t, optimizer=cd.optimizer, state=state, grads=G, uploads=U,
            byzantine=np.ones(1, bool), clients=np.array([user], np.int64),
            n_samples=np.array([cd.items_of(user).size], np.int64), f=f, rng=rng,
            backend=backend))
    finally:
        G.flags.writeable = True


def node_users(node_config: Mapping[str, Any]) -> list[int]:
    """The users a node holds: node config ``users`` ("3,17,42" or one int), else
    ``partition-id`` (the simulation engine's one virtual node per user)."""
    if "users" in node_config:
        raw = node_config["users"]
        try:
            users = ([int(raw)] if isinstance(raw, (int, np.integer))
                     else [int(x) for x in str(raw).replace(" ", "").split(",") if x])
        except ValueError:
            raise ValueError(f"node config users must be user ids separated by commas, got "
                             f"{raw!r}") from None
    elif "partition-id" in node_config:
        users = [int(node_config["partition-id"])]
    else:
        raise ValueError("a node needs node config 'users' (e.g. users=\"0,1,2\") or "
                         "'partition-id' to know which users' data it holds")
    if not users:
        raise ValueError(f"node config users lists no user: {node_config.get('users')!r}")
    return users


def config_from_run_config(run_config: Mapping[str, Any]):
    """The TrainConfig of a deployed run: run config ``config`` (JSON text) or
    ``config-file`` (a path to it)."""
    from rfrs_ref.federated.config import TrainConfig

    if "config" in run_config:
        text = str(run_config["config"])
    elif "config-file" in run_config:
        with open(str(run_config["config-file"])) as fh:
            text = fh.read()
    else:
        raise ValueError("the run config needs 'config' (the training configuration as JSON) "
                         "or 'config-file' (its path); rfrs-ref flower deploy sets it")
    return TrainConfig.from_json(json.loads(text))


def client_app(config=None):
    """A Flower ClientApp for ``config``: a TrainConfig, several (the node serves the
    rounds of each, told apart by the digest the server sends), or None (read it from
    the run config, as deployed apps do). See the module docstring.

    A ``train`` message of a configuration the node does not hold is refused (an error
    reply naming both digests), so a node set up for another run cannot contribute
    uploads computed for it."""
    from rfrs_ref.flower import require_flwr

    require_flwr()
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    if config is None:
        configs = None
    elif isinstance(config, (list, tuple)):
        configs = {config_digest(c): c for c in config}
    else:
        configs = {config_digest(config): config}

    def _setup(context: Context, digest: str | None) -> ClientData:
        held = configs
        if held is None:
            cfg = config_from_run_config(context.run_config)
            held = {config_digest(cfg): cfg}
        if digest is None and len(held) == 1:
            cfg = next(iter(held.values()))
        elif digest in held:
            cfg = held[digest]
        else:
            raise ValueError(f"the server runs configuration {digest}, this node holds "
                             f"{', '.join(sorted(held))}: start it with the run's configuration")
        return client_data(cfg, node_users(context.node_config))

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        users = node_users(context.node_config)
        return Message(RecordDict({USERS: ConfigRecord({"users": [int(u) for u in users]})}),
                       reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        rc = msg.content.config_records[ROUND]
        t, user = int(rc["round"]), int(rc["user"])
        cd = _setup(context, str(rc["config"]) if "config" in rc else None)
        ar = msg.content.array_records[STATE]
        state = {k: ar[k].numpy() for k in cd.optimizer.arrays}
        attack = node_attack(cd, user, context.node_config)
        upload, loss, diag = client_upload(cd, user, state, t, attack)
        from rfrs_ref.jsonsafe import jsonable

        return Message(RecordDict({
            UPLOAD: ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in upload.items()}),
            METRICS: MetricRecord({"n_samples": int(cd.items_of(user).size), "loss": loss,
                                   "byzantine": int(attack is not None)}),
            ATTACK: ConfigRecord({"diagnostics": json.dumps(jsonable(diag))}),
        }), reply_to=msg)

    return app
