"""Test-suite configuration shared by every test folder.

- Hypothesis profiles: ``ci`` (derandomized, so a CI failure reproduces) and
  ``dev`` (random, more examples). Chosen with ``HYPOTHESIS_PROFILE``; ``ci`` is
  the default so that a plain ``pytest`` behaves as CI does.
- The CUDA kernels are tested with Numba's CUDA simulator when no NVIDIA device
  is present. The variable must be set before Numba is first imported.
"""

from __future__ import annotations

import os
import pathlib

if "NUMBA_ENABLE_CUDASIM" not in os.environ and not pathlib.Path("/dev/nvidiactl").exists():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    # pyproject's warning filter names a Numba class, so pytest has imported
    # numba.core.config (which reads the environment once) before this file runs
    import sys

    if "numba.core.config" in sys.modules:
        sys.modules["numba.core.config"].reload_config()

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=40,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _check_installed() -> None:
    import rfrs_ref

    try:
        import rfrs_ref.cli  # noqa: F401
    except ModuleNotFoundError:
        raise pytest.UsageError(
            f"rfrs_ref is imported from {pathlib.Path(rfrs_ref.__file__).parent} without its "
            "command-line package: install the project (pip install -e '.[test]') and run "
            "`pytest`, not `python -m pytest`, from the repository root."
        ) from None


_check_installed()


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
    """The directory of the real datasets (``RFRS_DATA_DIR``); skips when unset or missing."""
    value = os.environ.get("RFRS_DATA_DIR")
    if not value:
        pytest.skip("RFRS_DATA_DIR is not set: real-dataset tests need it")
    path = pathlib.Path(value)
    if not path.is_dir():
        pytest.skip(f"RFRS_DATA_DIR={value} is not a directory")
    return path


def _cut_back(run: pathlib.Path, t: int = 2) -> pathlib.Path:
    """``run``, a finished run, made a run interrupted after its checkpoint: its final
    files removed and its checkpoint's round set to ``t`` (as if killed after round t)."""
    import numpy as np

    (run / "final_metrics.json").unlink()
    (run / "state.npz").unlink()
    with np.load(run / "checkpoint.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["round"] = np.array(t)
    np.savez(run / "checkpoint.npz", **arrays)
    return run


@pytest.fixture
def cut_back():
    """:func:`_cut_back`: a finished run directory made an interrupted one."""
    return _cut_back
