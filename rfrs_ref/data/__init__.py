"""Datasets: loaders, download, synthetic generator, per-client split (docs/datasets.md).

>>> from rfrs_ref.data import load_dataset, split_interactions
>>> data = load_dataset("synthetic", n_users=50, n_items=80)
>>> split = split_interactions(data, seed=0)
>>> bool((split.train.counts() >= 1).all())
True

Real datasets (``lastfm``, ``ml100k``, ``citeulike-a``, ``citeulike-t``) are
found in an explicit directory, ``RFRS_DATA_DIR`` or the cache, or downloaded
and verified; see ``docs/datasets.md``.
"""

from rfrs_ref.data.base import Interactions, Split
from rfrs_ref.data.datasets import (
    DATASETS,
    Dataset,
    RealDataset,
    Synthetic,
    default_cache_dir,
    fetch,
    load_dataset,
    load_item_names,
    locate,
    search_path,
    user_cache_dir,
    verify_folder,
)
from rfrs_ref.data.download import Fetched
from rfrs_ref.data.errors import DatasetFormatError, DatasetNotFoundError, DownloadError
from rfrs_ref.data.info import DatasetInfo, dataset_info
from rfrs_ref.data.manifest import DatasetManifest, manifest, manifests
from rfrs_ref.data.split import split_interactions
from rfrs_ref.data.synthetic import synthetic

__all__ = [
    "DATASETS",
    "Dataset",
    "DatasetFormatError",
    "DatasetInfo",
    "DatasetManifest",
    "DatasetNotFoundError",
    "DownloadError",
    "Fetched",
    "Interactions",
    "RealDataset",
    "Split",
    "Synthetic",
    "dataset_info",
    "default_cache_dir",
    "fetch",
    "load_dataset",
    "load_item_names",
    "locate",
    "manifest",
    "manifests",
    "search_path",
    "split_interactions",
    "synthetic",
    "user_cache_dir",
    "verify_folder",
]
