"""Values made ready for strict JSON (``json.dumps(..., allow_nan=False)``)."""

from __future__ import annotations

from typing import Any

import numpy as np


def jsonable(x: Any) -> Any:
    """Lists and Python scalars for strict JSON: NumPy values converted, tuples
    as lists, keys as strings, and a non-finite float (an infinitely far
    client's score, a diverged norm) as None."""
    if isinstance(x, np.ndarray):
        return [jsonable(v) for v in x.tolist()] if x.ndim else jsonable(x.item())
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    return x
