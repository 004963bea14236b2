"""Implicit-feedback interaction data as a per-user CSR structure."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Interactions:
    """Users × items implicit positive feedback.

    ``indices[indptr[u]:indptr[u + 1]]`` are user u's items, 0-based, strictly
    increasing (no duplicates). Ids are dense: users ``0..n_users-1``, items
    ``0..n_items-1`` (an item may have no interaction, as in citeulike).

    Attributes:
        name: dataset name (``ml100k``, ``synthetic``...).
        n_users, n_items: sizes.
        indptr: int64 array, shape (n_users + 1,).
        indices: int32 array, shape (n_interactions,).
        source: where the data came from (a path or a generator description).
    """

    name: str
    n_users: int
    n_items: int
    indptr: np.ndarray
    indices: np.ndarray
    source: str = ""

    def __post_init__(self) -> None:
        if self.indptr.shape != (self.n_users + 1,):
            raise ValueError(
                f"{self.name}: indptr has shape {self.indptr.shape}, expected ({self.n_users + 1},)"
            )
        if self.indptr[0] != 0 or self.indptr[-1] != self.indices.shape[0]:
            raise ValueError(f"{self.name}: indptr does not span indices")

    @property
    def n_interactions(self) -> int:
        return int(self.indices.shape[0])

    def items_of(self, user: int) -> np.ndarray:
        """User ``user``'s items (a read-only view)."""
        v = self.indices[self.indptr[user] : self.indptr[user + 1]]
        v.flags.writeable = False
        return v

    def counts(self) -> np.ndarray:
        """Number of items per user, int64 (n_users,)."""
        return np.diff(self.indptr)

    def item_counts(self) -> np.ndarray:
        """Number of users per item (popularity), int64 (n_items,)."""
        return np.bincount(self.indices, minlength=self.n_items).astype(np.int64)

    @classmethod
    def from_lists(cls, name: str, n_items: int, lists, source: str = "") -> "Interactions":
        """Build from one iterable of item ids per user (sorted and de-duplicated here)."""
        rows = [np.unique(np.asarray(x, dtype=np.int64)) for x in lists]
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows], out=indptr[1:])
        indices = (np.concatenate(rows) if rows else np.zeros(0, np.int64)).astype(np.int32)
        if indices.size and (indices.min() < 0 or indices.max() >= n_items):
            raise ValueError(f"{name}: item id out of range 0..{n_items - 1}")
        return cls(name, len(rows), int(n_items), indptr, indices, source)


@dataclasses.dataclass(frozen=True)
class Split:
    """A per-user train/test split of one dataset (docs/datasets.md): same users, same items."""

    train: Interactions
    test: Interactions
    seed: int
    test_fraction: float
    #: validation items taken out of the training set (None without a validation split)
    valid: Interactions | None = None
    valid_fraction: float = 0.0
