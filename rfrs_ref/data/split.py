"""The per-client train/test split (docs/datasets.md)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from rfrs_ref.data.base import Interactions, Split
from rfrs_ref.seeding import generator


def n_test_items(n: np.ndarray, test_fraction: float) -> np.ndarray:
    """``floor(test_fraction · n)`` for each count n, computed exactly.

    The fraction is taken as the decimal it is written as (``0.2`` is 1/5, not
    the binary double slightly above it), so ``floor(0.29 · 100)`` is 29 and not
    28 as float arithmetic would give.
    """
    frac = Fraction(repr(float(test_fraction)))
    n = np.asarray(n, dtype=np.int64)
    uniq, inverse = np.unique(n, return_inverse=True)
    per = np.array([(int(k) * frac.numerator) // frac.denominator for k in uniq], dtype=np.int64)
    return per[inverse].reshape(n.shape)


def split_interactions(data: Interactions, seed: int, test_fraction: float = 0.2) -> Split:
    """Split every user's items into a training and a test set (docs/datasets.md).

    User i with nᵢ items gets ``n_test = floor(test_fraction · nᵢ)`` of them,
    chosen uniformly at random without replacement, as test items; the other
    ``nᵢ − n_test`` are its training set S⁺ᵢ. With ``test_fraction < 1`` every
    user with at least one item keeps at least one training item.

    Randomness: one generator, stream ``split`` of
    :func:`rfrs_ref.seeding.generator` with the trial ``seed``. It draws one
    uniform key per interaction (users in order, items in order) and each user's
    test items are those with the ``n_test`` smallest keys, which is a uniform
    random subset of that size.

    Args:
        data: the interactions (not modified).
        seed: the trial seed, non-negative.
        test_fraction: in [0, 1).

    Returns:
        Split(train, test, seed, test_fraction); train and test have the same
        name, n_users and n_items as ``data``, and their item lists are sorted.
    """
    tf = float(test_fraction)
    if not (0.0 <= tf < 1.0) or math.isnan(tf):
        raise ValueError(
            "test_fraction must be in [0, 1) so that every user keeps a training item, "
            f"got {test_fraction}"
        )
    counts = data.counts()
    n_test = n_test_items(counts, tf)
    user = np.repeat(np.arange(data.n_users, dtype=np.int64), counts)
    keys = generator(int(seed), "split").random(data.n_interactions)
    order = np.lexsort((keys, user))  # by user, then key
    rank = np.empty(data.n_interactions, dtype=np.int64)
    rank[order] = np.arange(data.n_interactions) - np.repeat(data.indptr[:-1], counts)
    is_test = rank < n_test[user]

    def part(mask: np.ndarray, per_user: np.ndarray, what: str) -> Interactions:
        indptr = np.zeros(data.n_users + 1, dtype=np.int64)
        np.cumsum(per_user, out=indptr[1:])
        return Interactions(
            data.name, data.n_users, data.n_items, indptr,
            np.ascontiguousarray(data.indices[mask]),
            source=f"{data.source} [{what}: split seed={seed}, test_fraction={tf:g}]",
        )

    train = part(~is_test, counts - n_test, "train")
    test = part(is_test, n_test, "test")
    return Split(train=train, test=test, seed=int(seed), test_fraction=tf)
