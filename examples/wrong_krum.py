"""A Krum with a classic mistake, for trying ``rfrs-ref conformance``.

It is textbook Krum (Blanchard et al. 2017): score every row by the sum of its
squared distances to its n − f − 2 nearest neighbours and return the row with
the smallest score. It is right on finite input. Its mistake: a Byzantine
client may upload NaN, and a NaN row's score is NaN, which ``numpy.argmin``
returns as "the minimum". rfrs-ref's Krum treats a non-finite row as
infinitely far (docs/aggregation.md); this one hands the NaN row to the
server. The conformance suite finds it:

    rfrs-ref conformance --rule krum --callable examples/wrong_krum.py:krum

reports the law ``finite_output`` (and the laws that need a finite aggregate)
as failing, each with a counterexample shrunk by Hypothesis, and exits with 1.
"""

import numpy as np


def krum(features, n_samples, f):
    """(n, D) features, per-client sizes (unused by Krum), f Byzantine -> (D,) the chosen row."""
    x = np.asarray(features, dtype=np.float64)
    n = x.shape[0]
    with np.errstate(invalid="ignore", over="ignore"):
        d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=-1)
    m = max(n - f - 2, 1)
    scores = np.array([np.sort(np.delete(d2[i], i))[:m].sum() for i in range(n)])
    return x[int(np.argmin(scores))]  # the bug: a NaN score wins
