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


def split_interactions(data: Interactions, seed: int, test_fraction: float = 0.2,
                       valid_fraction: float = 0.0) -> Split:
    """Split every user's items into a training and a test set, and optionally a
    validation set (docs/datasets.md, "The per-client split").

    User i with nᵢ items gets ``n_test = floor(test_fraction · nᵢ)`` of them,
    chosen uniformly at random without replacement, as test items, then
    ``n_valid = floor(valid_fraction · nᵢ)`` more as validation items; the
    other ``nᵢ − n_test − n_valid`` are its training set S⁺ᵢ. With
    ``test_fraction + valid_fraction < 1`` every user with at least one item
    keeps at least one training item.

    Randomness: one generator, stream ``split`` of
    :func:`rfrs_ref.seeding.generator` with the trial ``seed``. It draws one
    uniform key per interaction (users in order, items in order); each user's
    test items are those with the ``n_test`` smallest keys, its validation
    items the next ``n_valid``. The draws do not depend on ``valid_fraction``:
    the test set is the same with or without a validation split, the
    validation items come out of the training set, and ``valid_fraction = 0``
    gives exactly the split of the paper's protocol.

    Args:
        data: the interactions (not modified).
        seed: the trial seed, non-negative.
        test_fraction: in [0, 1).
        valid_fraction: in [0, 1 − test_fraction); 0 (the default) makes no
            validation set.

    Returns:
        Split(train, test, seed, test_fraction, valid, valid_fraction); train,
        test and valid have the same name, n_users and n_items as ``data``, and
        their item lists are sorted; valid is None when valid_fraction is 0.
    """
    tf = float(test_fraction)
    if not (0.0 <= tf < 1.0) or math.isnan(tf):
        raise ValueError(
            "test_fraction must be in [0, 1) so that every user keeps a training item, "
            f"got {test_fraction}"
        )
    vf = float(valid_fraction)
    if not (0.0 <= vf and tf + vf < 1.0) or math.isnan(vf):
        raise ValueError(
            f"valid_fraction must be in [0, 1 - test_fraction) = [0, {1 - tf:g}) so that every "
            f"user keeps a training item, got {valid_fraction}"
        )
    counts = data.counts()
    n_test = n_test_items(counts, tf)
    n_valid = n_test_items(counts, vf)
    user = np.repeat(np.arange(data.n_users, dtype=np.int64), counts)
    keys = generator(int(seed), "split").random(data.n_interactions)
    order = np.lexsort((keys, user))  # by user, then key
    rank = np.empty(data.n_interactions, dtype=np.int64)
    rank[order] = np.arange(data.n_interactions) - np.repeat(data.indptr[:-1], counts)
    is_test = rank < n_test[user]
    is_valid = ~is_test & (rank < (n_test + n_valid)[user])

    def part(mask: np.ndarray, per_user: np.ndarray, what: str) -> Interactions:
        indptr = np.zeros(data.n_users + 1, dtype=np.int64)
        np.cumsum(per_user, out=indptr[1:])
        extra = f", valid_fraction={vf:g}" if vf else ""
        return Interactions(
            data.name, data.n_users, data.n_items, indptr,
            np.ascontiguousarray(data.indices[mask]),
            source=f"{data.source} [{what}: split seed={seed}, test_fraction={tf:g}{extra}]",
        )

    train = part(~is_test & ~is_valid, counts - n_test - n_valid, "train")
    test = part(is_test, n_test, "test")
    valid = part(is_valid, n_valid, "valid") if vf else None
    return Split(train=train, test=test, seed=int(seed), test_fraction=tf, valid=valid,
                 valid_fraction=vf)
