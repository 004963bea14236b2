"""Datasets: loaders, download, synthetic generator, per-client split (SPEC §1)."""

from rfrs_ref.data.base import Interactions, Split

__all__ = ["Interactions", "Split"]
