"""Named, keyed random streams derived from one trial seed.

Every random choice of a run draws from its own stream,
``generator(seed, stream, *keys)``, built from
``SeedSequence(entropy=seed, spawn_key=(crc32(stream), *keys))``. Streams do not
depend on the order in which other streams were used, so a run resumed at round
t draws exactly what the uninterrupted run drew, and adding a new random choice
somewhere never changes the old ones.

Streams used by the project (keys in brackets):

- ``split`` : the per-client 80/20 split
- ``init`` : the initial parameters θ̄⁰ (and FMF's private user vectors)
- ``sampling`` [t] : the clients sampled in round t (t starts at 1)
- ``byzantine`` : the fixed set of Byzantine clients
- ``negatives`` [t, client] : sampled BPR negatives
- ``attack`` [t] : attack noise in round t
- ``synthetic`` : the synthetic dataset generator
"""

from __future__ import annotations

import zlib

import numpy as np


def stream_id(stream: str) -> int:
    """Stable 32-bit id of a stream name (crc32 of its UTF-8 bytes)."""
    return zlib.crc32(stream.encode("utf-8"))


def seed_sequence(seed: int, stream: str, *keys: int) -> np.random.SeedSequence:
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    return np.random.SeedSequence(entropy=int(seed), spawn_key=(stream_id(stream), *map(int, keys)))


def generator(seed: int, stream: str, *keys: int) -> np.random.Generator:
    """The generator of ``stream`` (with integer ``keys``) for trial ``seed``."""
    return np.random.Generator(np.random.PCG64(seed_sequence(seed, stream, *keys)))
