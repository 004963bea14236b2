"""rfrs-ref: reference implementation of the robust federated recommendation
system of Chen et al., "Robust Federated Recommendation System" (2020)."""

from rfrs_ref._version import __version__

__all__ = ["__version__"]
