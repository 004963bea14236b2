"""An adaptive robust clipping with a classic mistake, for trying ``rfrs-ref conformance --pre``.

It is textbook ARC (Allouah et al. 2024): with k = ⌊2f(n − f)/n⌋, the k rows
of largest norm are clipped to the norm of the (k + 1)-th largest. It is right
on finite input. Its mistake: it ranks the rows with Python's ``sorted`` on
their norms, and a Byzantine client may upload NaN, whose norm is NaN. Every
comparison with NaN is false, so ``sorted`` no longer sorts: which rows count
as the k largest, and the threshold τ, then depend on where the NaN row sits.
rfrs-ref's ARC ranks a non-finite row as the largest norm
(docs/aggregation.md). The conformance suite finds it:

    rfrs-ref conformance --pre arc --callable examples/wrong_arc.py:arc

reports ``permutation_equivariance`` as failing (the same rows in another
order are clipped differently), with the counterexample, and exits with 1.
"""

import numpy as np


def arc(features, n_samples, f):
    """(n, D) features, per-client sizes (unused), f Byzantine -> (n, D) clipped rows."""
    x = np.array(features, dtype=np.float64, copy=True)
    n = x.shape[0]
    k = (2 * f * (n - f)) // n
    if k == 0:
        return x
    with np.errstate(invalid="ignore", over="ignore"):
        norms = [float(np.linalg.norm(row)) for row in x]
    ranked = sorted(range(n), key=lambda i: norms[i])  # the bug: NaN keys do not sort
    tau = norms[ranked[n - k - 1]]
    for i in ranked[n - k:]:
        if norms[i] > tau:
            x[i] *= tau / norms[i]
    return x
