"""The machine a benchmark ran on, in one line: CPU, instruction set, threads, versions;
and :func:`timed`, the benchmarks' clock.

Every benchmark prints :func:`describe` first, so that a table can be matched
with the vector width its kernels were compiled for (AVX2: 8 float32 lanes,
AVX-512: 16). The instruction set is read from ``/proc/cpuinfo`` where it
exists, and from LLVM's view of the host CPU (the one Numba compiles for)
always.
"""

from __future__ import annotations

import os
import platform
import statistics
import time

def timed(fn, repeat: int) -> tuple[float, float, object]:
    """(min, median, last result) of fn()'s wall time over ``repeat`` calls, in seconds."""
    ts, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), statistics.median(ts), out


VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpuinfo_flags() -> set[str]:
    """The CPU flags of /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def llvm_host() -> tuple[str, set[str]]:
    """(CPU name, enabled features) of the host as LLVM, hence Numba, sees it."""
    try:
        import llvmlite.binding as llvm

        feats = llvm.get_host_cpu_features()
        return llvm.get_host_cpu_name(), {k for k, on in feats.items() if on}
    except Exception:  # an llvmlite without host queries: report what /proc says
        return "unknown", set()


def instruction_set() -> str:
    """The widest vector extension, e.g. ``AVX-512 (f, dq, bw, vl), FMA``."""
    name, llvm = llvm_host()
    flags = cpuinfo_flags() | {f.replace("-", "") for f in llvm}
    if "avx512f" in flags:
        sub = [s for s in ("f", "dq", "bw", "vl") if f"avx512{s}" in flags]
        isa = f"AVX-512 ({', '.join(sub)})"
    elif "avx2" in flags:
        isa = "AVX2"
    elif "avx" in flags:
        isa = "AVX"
    elif "sse4_2" in flags or "sse4.2" in flags:
        isa = "SSE4.2"
    else:
        isa = "no x86 vector extension reported"
    if "fma" in flags:
        isa += ", FMA"
    return f"{isa}; LLVM host CPU {name}{numba_target()}"


def numba_target() -> str:
    """``"; Numba compiles for haswell"`` where NUMBA_CPU_NAME or NUMBA_CPU_FEATURES
    makes Numba generate code for another CPU than the host (e.g. AVX2 code on an
    AVX-512 machine: ``NUMBA_CPU_NAME=haswell``); empty otherwise."""
    import numba

    name, feats = numba.config.CPU_NAME, numba.config.CPU_FEATURES
    if not name and not feats:
        return ""
    return f"; Numba compiles for {name or 'the host'}{f' ({feats})' if feats else ''}"


def describe() -> str:
    """One line: CPU model, instruction set, CPUs, Numba threads and layer, versions."""
    import numba
    import numpy as np

    import rfrs_ref.kernels  # noqa: F401  (picks the threading layer, as training does)
    from rfrs_ref.kernels.weiszfeld import rows_finite

    rows_finite(np.zeros((1, 1), np.float32))  # starts Numba's thread pool, so the layer is known
    return (f"# {cpu_model()}; {instruction_set()}; {os.cpu_count()} CPUs; numba {numba.__version__} "
            f"({numba.get_num_threads()} threads, {numba.threading_layer()} layer); numpy {np.__version__}")


if __name__ == "__main__":
    print(describe())
