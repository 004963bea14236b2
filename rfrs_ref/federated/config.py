"""The full configuration of a training run, and how it resolves into objects.

A :class:`TrainConfig` is plain data (JSON round-trip): names of registry
entries plus their hyperparameters. ``resolve()`` fills every default, so the
``config.json`` of a run states every value the run used.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from rfrs_ref.params import recorded

#: default number of rounds per dataset. Chosen so that a default run of each
#: real dataset beats the popularity ranking clearly and finishes within
#: minutes on a 2-core machine (see docs/training.md for the measurements).
DEFAULT_ROUNDS = {
    "synthetic": 1500,
    "ml100k": 1000,
    "lastfm": 600,
    "citeulike-a": 1000,
    "citeulike-t": 1500,
}
FALLBACK_ROUNDS = 300


@dataclasses.dataclass
class TrainConfig:
    """Everything that determines a run (docs/training.md).

    Attributes:
        dataset: dataset name (``rfrs_ref.data.DATASETS``).
        data_dir: explicit dataset directory (else RFRS_DATA_DIR, cache, download).
        dataset_params: generator parameters (synthetic only).
        test_fraction: per-client test share of the split (docs/datasets.md: 0.2).
        valid_fraction: per-client validation share, taken out of the training
            items (0: none, the paper's protocol; docs/datasets.md).
        model: ``fism`` or ``fmf``; model_params: its hyperparameters (dim, gamma, lam, negatives).
        optimizer: optimiser name; optimizer_params: lr, beta1, ...
        defense: aggregation rule name (``none`` is the plain weighted mean, Option I).
        detect: ``gradient`` or ``parameter``: what the rule compares.
        defense_params: the rule's hyperparameters.
        pre: pre-aggregators run in front of the rule, in order (``rfrs_ref.aggregate.PRE``;
            empty: none).
        pre_params: their hyperparameters (one table for all of them).
        attack: attack name; attack_params: its hyperparameters.
        byzantine_fraction: α, the fixed Byzantine share of all clients.
        assumed_byzantine: α_assumed (None: α); f = floor(α_assumed · |sampled|); ``"exact"``:
            f = the number of Byzantine clients actually sampled (an ablation).
        rounds: T (None: the dataset's default, DEFAULT_ROUNDS).
        client_fraction: e, clients sampled per round.
        init_scale: θ̄⁰ ~ N(0, init_scale²).
        dtype: ``float32`` or ``float64`` for parameters and uploads.
        seed: the trial seed (every random stream derives from it).
        eval_every: evaluate every this many rounds (None: rounds // 10), and at the end.
        ks: the K of Precision@K / Recall@K.
        verify: update-rule verification (None: on for stateful optimisers).
        resilience: record the Definition 1–4 sums.
        checkpoint_every: write a checkpoint every this many rounds (None: eval_every).
        backend: ``numpy`` (oracle), ``numba`` or ``cuda``.
        trace: also record per-client gradient norms and state checksums per round.
    """

    dataset: str = "synthetic"
    data_dir: str | None = None
    dataset_params: dict = dataclasses.field(default_factory=dict)
    test_fraction: float = 0.2
    valid_fraction: float = 0.0
    model: str = "fism"
    model_params: dict = dataclasses.field(default_factory=dict)
    optimizer: str = "adam"
    optimizer_params: dict = dataclasses.field(default_factory=dict)
    defense: str = "none"
    detect: str = "gradient"
    defense_params: dict = dataclasses.field(default_factory=dict)
    pre: tuple[str, ...] = ()
    pre_params: dict = dataclasses.field(default_factory=dict)
    attack: str = "none"
    attack_params: dict = dataclasses.field(default_factory=dict)
    byzantine_fraction: float = 0.0
    assumed_byzantine: float | str | None = None
    rounds: int | None = None
    client_fraction: float = 0.01
    init_scale: float = 0.1
    dtype: str = "float32"
    seed: int = 0
    eval_every: int | None = None
    ks: tuple[int, ...] = (1, 2, 3, 4, 5)
    verify: bool | None = None
    resilience: bool = False
    checkpoint_every: int | None = None
    backend: str = "numba"
    trace: bool = False

    # -- resolution -----------------------------------------------------------------
    def resolved(self) -> "TrainConfig":
        """A copy with every default filled in (rounds, eval interval, hyperparameters...)."""
        from rfrs_ref.aggregate import RULES
        from rfrs_ref.attack import ATTACKS
        from rfrs_ref.model import MODELS
        from rfrs_ref.optim import OPTIMIZERS
        from rfrs_ref.params import values

        c = dataclasses.replace(self)
        # one configuration, one JSON form (and one sweep key): a fraction or scale given
        # as an integer (--set init_scale=1) is the float it stands for
        for name in ("byzantine_fraction", "assumed_byzantine", "client_fraction", "init_scale",
                     "test_fraction", "valid_fraction"):
            v = getattr(c, name)
            if isinstance(v, int) and not isinstance(v, bool):
                setattr(c, name, float(v))
        if c.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, got {c.dtype!r}")
        if c.backend not in ("numpy", "numba", "cuda"):
            raise ValueError(f"backend must be numpy, numba or cuda, got {c.backend!r}")
        if not (isinstance(c.init_scale, (int, float)) and math.isfinite(c.init_scale)
                and c.init_scale >= 0):
            raise ValueError(f"init_scale must be a finite number ≥ 0, got {c.init_scale!r}")
        if not (0.0 <= c.valid_fraction and c.test_fraction + c.valid_fraction < 1.0):
            raise ValueError(f"valid_fraction must be in [0, 1 - test_fraction) = "
                             f"[0, {1 - c.test_fraction:g}), got {c.valid_fraction}")
        if c.rounds is None:
            c.rounds = DEFAULT_ROUNDS.get(c.dataset, FALLBACK_ROUNDS)
        if c.rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {c.rounds}")
        if c.eval_every is None:
            c.eval_every = max(1, c.rounds // 10)
        if c.checkpoint_every is None:
            c.checkpoint_every = c.eval_every
        if c.assumed_byzantine is None:
            c.assumed_byzantine = c.byzantine_fraction
        elif isinstance(c.assumed_byzantine, str) and c.assumed_byzantine != "exact":
            raise ValueError(f"assumed_byzantine must be a fraction in [0, 1) or 'exact', got "
                             f"{c.assumed_byzantine!r}")
        c.ks = tuple(int(k) for k in c.ks)
        if len(set(c.ks)) != len(c.ks):
            # a K twice would be two rows of the same metric in every table
            raise ValueError(f"ks must be distinct, got {list(c.ks)}")
        opt_cls = OPTIMIZERS.get(c.optimizer)
        c.optimizer_params = values(opt_cls(**c.optimizer_params))
        if c.verify is None:
            c.verify = opt_cls.arrays != ("theta",)
        c.defense_params = values(RULES.get(_rule_name(c.defense))(**c.defense_params))
        c.pre, c.pre_params = _resolve_pre(c.pre, c.pre_params)
        attack = ATTACKS.get(c.attack)(**c.attack_params)
        attack.check_optimizer(c.optimizer)
        c.attack_params = values(attack)
        model_cls = MODELS.get(c.model)
        c.model_params = values(model_cls(n_items=1, **c.model_params))
        return c

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["ks"] = list(self.ks)
        # absent means 0: configurations without a validation split keep the JSON (and the
        # sweep keys hashed from it) they had before the field existed
        if not d["valid_fraction"]:
            del d["valid_fraction"]
        d["pre"] = list(self.pre)
        if not d["pre"] and not d["pre_params"]:
            del d["pre"], d["pre_params"]
        # a hyperparameter added after runs were recorded is left out at its default, as
        # valid_fraction above (rfrs_ref.params.hyper's absent_is_default)
        for field, entry in self._entries().items():
            if entry is not None and isinstance(d.get(field), dict):
                d[field] = recorded(entry, d[field])
        return d

    def _entries(self) -> dict:
        """The registry entry (class) of each hyperparameter field, None where the name is
        not registered (a configuration that does not resolve is written as it is)."""
        from rfrs_ref.aggregate import RULES
        from rfrs_ref.attack import ATTACKS
        from rfrs_ref.model import MODELS
        from rfrs_ref.optim import OPTIMIZERS

        out = {}
        for field, registry, name in (("optimizer_params", OPTIMIZERS, self.optimizer),
                                      ("defense_params", RULES, _rule_name(self.defense)),
                                      ("attack_params", ATTACKS, self.attack),
                                      ("model_params", MODELS, self.model)):
            try:
                out[field] = registry.get(name)
            except (KeyError, TypeError, ValueError):
                out[field] = None
        return out

    #: fields that do not change a run's numbers from one round to the next: where the data
    #: are read from, the number of rounds (round t is the same whatever the total), what is
    #: evaluated or checkpointed when, the trace, and the kernels' backend (which changes
    #: roundings, like a resume by other code, and may move between machines)
    NOT_TRAJECTORY = ("data_dir", "rounds", "eval_every", "checkpoint_every", "trace", "backend")

    @classmethod
    def trajectory(cls, d) -> dict:
        """What of a configuration (as JSON, ``to_json``'s or a record of it) decides the
        run's rounds, for comparing a run with its checkpoint or its trace: every field this
        version knows, with defaults filled in and hyperparameters resolved (so that a field
        or hyperparameter another version adds, with its default, changes nothing), less
        :data:`NOT_TRAJECTORY`. Keys this version does not know are dropped; a
        configuration that does not resolve is compared as it is written."""
        if not isinstance(d, dict):
            return {"config": d}
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            c = cls.from_json({k: v for k, v in d.items() if k in known}).resolved()
            full = json.loads(json.dumps(dataclasses.asdict(c), default=list))
        except (ValueError, KeyError, TypeError):
            full = json.loads(json.dumps(d, default=str))
        return {k: v for k, v in full.items() if k not in cls.NOT_TRAJECTORY}

    @classmethod
    def from_json(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown configuration keys: {sorted(unknown)}")
        d = dict(d)
        if "ks" in d:
            d["ks"] = tuple(d["ks"])
        if "pre" in d:
            d["pre"] = tuple(d["pre"])
        return cls(**d)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True)


def _resolve_pre(pre, params: dict) -> tuple[tuple[str, ...], dict]:
    """The pre-aggregators' names (checked) and every hyperparameter they take, with
    defaults filled in; a hyperparameter none of them takes is an error."""
    from rfrs_ref.aggregate.pre import PRE, build, pre_hyperparameters

    if isinstance(pre, str) or not all(isinstance(p, str) for p in pre):
        raise ValueError(f"pre must be a list of pre-aggregator names, got {pre!r}")
    names = tuple(pre)
    for name in names:
        PRE.get(name)  # KeyError naming the choices
    takes = pre_hyperparameters(names)
    unknown = sorted(set(params) - set(takes))
    if unknown:
        which = ", ".join(names) if names else "no pre-aggregator"
        raise ValueError(f"pre_params {unknown[0]!r} is not a hyperparameter of {which}; they take: "
                         f"{', '.join(takes) or 'none'}")
    resolved = {**takes, **params}
    build(names, resolved, None)  # the pre-aggregators check their values
    return names, resolved


def _rule_name(defense: str) -> str:
    return "mean" if defense == "none" else defense
