"""Helpers of the experiments tests, shared through the fixture ``ex`` (test modules cannot
import conftest in importlib mode): tiny synthetic configurations and image checks."""

from __future__ import annotations

import pathlib
import types

import numpy as np
import pytest

from rfrs_ref.experiments.spec import make_config

#: a synthetic dataset small enough for a run of a few rounds to take well under a second
TINY_DATA = {"n_users": 200, "n_items": 100, "mean_items": 12.0}

#: every run in these tests samples 20 clients per round: enough for Krum with f = 8 (40%)
TINY = {"dataset": "synthetic", "dataset_params": TINY_DATA, "client_fraction": 0.1,
        "rounds": 4, "eval_every": 2}


def tiny_config(**fields):
    """A TrainConfig of the tiny synthetic set-up with ``fields`` on top (``preset`` allowed)."""
    return make_config({**TINY, **fields})


def assert_image_not_blank(path: pathlib.Path) -> None:
    """The PNG at ``path`` exists and shows something: not a single colour, not almost all white."""
    import matplotlib.image as mpimg

    path = pathlib.Path(path)
    assert path.exists() and path.stat().st_size > 0, f"{path} is missing or empty"
    img = mpimg.imread(path)
    rgb = img[..., :3].astype(np.float64)
    assert rgb.std() > 0.01, f"{path} is a single colour"
    non_white = (rgb < 0.95).any(axis=-1).mean()
    assert non_white > 0.01, f"{path} is {1 - non_white:.1%} white"


def assert_pdf(path: pathlib.Path) -> None:
    path = pathlib.Path(path)
    assert path.exists(), f"{path} is missing"
    data = path.read_bytes()
    assert data.startswith(b"%PDF") and len(data) > 1000, f"{path} is not a PDF with content"


@pytest.fixture(autouse=True)
def _one_numba_thread():
    """Runs here are tiny: on a busy machine Numba's thread pool only slows them down (its
    threads wait for each other), and results do not depend on the thread count."""
    import numba

    old = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(old)


#: files of a tiny Fig. 10 whose bytes a re-run from its record must reproduce
REDRAWN = ("results.csv", "runs.csv", "summary.csv", "summary.md", "figures/fig10.png",
           "figures/fig10_curves.png")


def copy_files(src, dst, rel_paths):
    """Copy the files ``rel_paths`` (relative to ``src``) to the same places under ``dst``."""
    import shutil

    for rel in rel_paths:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst / rel)


def fig10_scale():
    """A Fig. 10 of 4 runs on the tiny synthetic set-up (2 trials, 3 rounds)."""
    from rfrs_ref.experiments.figures import Scale

    return Scale(datasets=("synthetic",), rounds=3, trials=2,
                 overrides={"dataset_params": TINY_DATA, "client_fraction": 0.1,
                            "eval_every": 1})


@pytest.fixture(scope="session")
def ex():
    return types.SimpleNamespace(TINY=TINY, TINY_DATA=TINY_DATA, tiny_config=tiny_config,
                                 assert_image_not_blank=assert_image_not_blank,
                                 assert_pdf=assert_pdf, fig10_scale=fig10_scale, copy_files=copy_files,
                                 REDRAWN=REDRAWN)
