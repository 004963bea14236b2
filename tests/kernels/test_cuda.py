"""CUDA kernels: agreement with the oracles (Numba's simulator when no GPU is
present, set up by the root conftest), and compilation to PTX."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numba.core.config
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rfrs_ref.kernels.coordinatewise import coordinatewise_combine
from rfrs_ref.kernels.distances import pairwise_sq_dists, pairwise_sq_dists_numpy
from rfrs_ref.kernels.weiszfeld import weiszfeld_pass, weiszfeld_pass_numpy

pytestmark = pytest.mark.cuda

# Numba reads NUMBA_ENABLE_CUDASIM when numba.core.config is first imported, which
# pytest does before any conftest runs when it resolves the Numba warning class
# named in the warning filters; numba.cuda picks the simulator from the config
# when it is imported, so re-reading the config now is still in time.
if (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" and not numba.core.config.ENABLE_CUDASIM
        and "numba.cuda" not in sys.modules):
    numba.core.config.reload_config()


@pytest.fixture(scope="module", autouse=True)
def _cuda_or_skip():
    from numba import cuda

    if not cuda.is_available():
        pytest.skip("no CUDA device and NUMBA_ENABLE_CUDASIM is not set")


def _data(seed, dtype, n, D, hostile=True):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)).astype(dtype)
    if hostile and n > 2:
        X[0, rng.integers(D)] = np.nan
        X[1] = dtype(1e38) if dtype == np.float32 else 1e300
    return X


# the simulator runs every thread in Python: sizes stay small
@settings(max_examples=3)
@given(st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64]), st.integers(1, 18),
       st.integers(1, 70))
def test_pairwise_agrees_with_oracle(seed, dtype, n, D):
    X = _data(seed, dtype, n, D)
    d = pairwise_sq_dists(X, backend="cuda")
    ref = pairwise_sq_dists_numpy(X)
    np.testing.assert_array_equal(np.isinf(d), np.isinf(ref))
    np.testing.assert_allclose(d[np.isfinite(ref)], ref[np.isfinite(ref)], rtol=1e-12)
    Y = X[: max(1, n // 2)]
    np.testing.assert_allclose(pairwise_sq_dists(X, Y, backend="cuda"), pairwise_sq_dists_numpy(X, Y),
                               rtol=1e-12)


@settings(max_examples=4)
@given(st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64]), st.integers(1, 9),
       st.integers(1, 12), st.sampled_from(["trim", "closest", "nearest"]), st.data())
def test_coordinatewise_agrees_with_oracle(seed, dtype, n, D, mode, data):
    rng = np.random.default_rng(seed)
    F = rng.integers(-2, 3, size=(n, D)).astype(dtype)
    F[rng.integers(n), rng.integers(D)] = np.nan
    A = {"theta": F + 1, "m": rng.normal(size=(n, D)).astype(dtype)}
    w = rng.integers(1, 5, size=n).astype(float)
    rows = np.sort(rng.choice(n, size=data.draw(st.integers(1, n)), replace=False))
    t = data.draw(st.integers(0, (rows.size - 1) // 2))
    o1, k1, b1 = coordinatewise_combine(F, A, w, mode=mode, t=t, rows=rows, backend="numpy")
    o2, k2, b2 = coordinatewise_combine(F, A, w, mode=mode, t=t, rows=rows, backend="cuda")
    for name in A:
        assert o2[name].dtype == A[name].dtype
        np.testing.assert_allclose(o2[name], o1[name], rtol=1e-6, equal_nan=True)
    np.testing.assert_array_equal(k1, k2)
    assert b1 == b2


@settings(max_examples=3)
@given(st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64]), st.integers(1, 6),
       st.integers(1, 300))
def test_weiszfeld_pass_agrees_with_oracle(seed, dtype, n, D):
    X = _data(seed, dtype, n, D, hostile=False)
    alpha = np.random.default_rng(seed).uniform(0.1, 2, size=n)
    z1, d1 = weiszfeld_pass_numpy(X, alpha)
    z2, d2 = weiszfeld_pass(X, alpha, backend="cuda")
    np.testing.assert_allclose(z2, z1, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(d2, d1, rtol=1e-9)


def test_rules_run_on_cuda():
    from rfrs_ref.aggregate import RULES

    rng = np.random.default_rng(0)
    n, D = 11, 5
    X = rng.normal(size=(n, D)).astype(np.float32)
    X[0] = np.nan
    X[1] = 1e38
    A = {"theta": X + 1, "v": np.abs(rng.normal(size=(n, D))).astype(np.float32)}
    ns = rng.integers(1, 9, size=n)
    for name in RULES:
        rule = RULES.get(name)(max_iter=3) if name == "rfa" else RULES.get(name)()
        if name == "monna":
            rule = RULES.get(name)(pivot=4)  # a finite, trusted pivot
        a = rule.aggregate(X, A, ns, 2, backend="numpy")
        b = rule.aggregate(X, A, ns, 2, backend="cuda")
        for k in A:
            np.testing.assert_allclose(b.arrays[k], a.arrays[k], rtol=1e-5, equal_nan=True, err_msg=name)
        np.testing.assert_allclose(b.kept, a.kept, err_msg=name)


PTX_SCRIPT = """
import json, sys
from rfrs_ref.kernels import cuda as k
try:
    ptx = k.compile_ptx()
except Exception as e:  # NVVM missing is a skip, anything else a failure
    text = f"{type(e).__name__}: {e}"
    if "nvvm" in text.lower():
        print(json.dumps({"skip": text[:400]}))
        sys.exit(0)
    raise
print(json.dumps({name: len(p) for name, p in ptx.items()}))
"""


def test_kernels_compile_to_ptx():
    """Compiles for a real GPU target (sm_80), which the simulator never does; runs
    in a fresh interpreter because the simulator is chosen when Numba is imported."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, "-c", PTX_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip("NVVM is not installed (a CUDA toolkit, or the gpu extra: numba-cuda[cu12]): "
                    + result["skip"])
    for name in ("pairwise", "coordinatewise", "weiszfeld", "combine", "rows_nonfinite"):
        for dt in ("float32", "float64"):
            assert result[f"{name}[{dt}]"] > 1000


NO_GPU_SCRIPT = """
import numpy as np
from numba import cuda
if cuda.is_available():
    print("available")
else:
    from rfrs_ref.kernels.distances import pairwise_sq_dists
    try:
        pairwise_sq_dists(np.zeros((2, 3)), backend="cuda")
    except RuntimeError as e:
        print("error:", e)
"""


def test_cuda_backend_without_a_gpu_says_so():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, "-c", NO_GPU_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if proc.stdout.startswith("available"):
        pytest.skip("a CUDA GPU is present")
    assert "backend='cuda' needs an NVIDIA GPU" in proc.stdout and "backend='numba'" in proc.stdout
    assert "pip install 'rfrs-ref[gpu]'" in proc.stdout  # the extra that brings NVVM


def test_pairwise_copies_of_a_row_have_the_same_distances():
    """As on the numba backend: a copy takes its first occurrence's distances."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(9, 300)).astype(np.float32)
    X[[4, 7]] = X[1]
    d = pairwise_sq_dists(X, backend="cuda")
    for i in (4, 7):
        np.testing.assert_array_equal(d[i, [0, 2, 3, 5, 6, 8]], d[1, [0, 2, 3, 5, 6, 8]])
    assert d[1, 4] == d[4, 7] == 0.0
