"""Numba CPU and CUDA kernels behind the families' fast paths.

Threading layer. Numba's OpenMP layer (GNU libgomp) wakes its worker threads
late for short parallel loops: on a 2-core machine a kernel over 6 × 16,384
values took 8 ms with it and 0.1 ms with Numba's work-queue layer, which is as
fast on the large problems (55 × 2,173,440 values). The round loop launches
many such kernels per round, so the work-queue layer is the default here
unless the user chose a layer (``NUMBA_THREADING_LAYER``). It must be chosen
before the first parallel kernel runs, hence here, where every kernel module
is imported from. The work-queue layer does not support parallel kernels
launched concurrently from several Python threads; run concurrent trainings
in processes (as the experiment sweeps do) or choose another layer.
"""

import os

import numba

if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"
