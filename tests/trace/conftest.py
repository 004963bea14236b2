"""Fixtures of the trace tests: small traced runs, shared by the session."""

from __future__ import annotations

import dataclasses

import pytest

from rfrs_ref.federated.config import TrainConfig

SMALL = dict(n_users=80, n_items=90, n_clusters=3, mean_items=10.0)


def _small_config(**kw) -> TrainConfig:
    base = dict(dataset="synthetic", dataset_params=SMALL, rounds=5, eval_every=2, client_fraction=0.125,
                model_params={"dim": 8}, attack="ascent", byzantine_fraction=0.2, defense="krum")
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="session")
def traces(tmp_path_factory):
    """Paths of traces: ``a`` and ``b`` the same run twice, ``lr`` a run with another
    learning rate, ``numpy`` the same run on the NumPy oracle backend."""
    from rfrs_ref.trace import run_traced

    root = tmp_path_factory.mktemp("traces")
    cfg = _small_config()
    out = {}
    for name, c in {"a": cfg, "b": cfg,
                    "lr": dataclasses.replace(cfg, optimizer_params={"lr": 2e-3}),
                    "numpy": dataclasses.replace(cfg, backend="numpy")}.items():
        out[name] = root / f"{name}.jsonl"
        run_traced(c, out[name], root / name)
    return out


@pytest.fixture(scope="session")
def small_config():
    """A factory of small traced-run configurations (keyword overrides)."""
    return _small_config
