"""Models: FISM and FMF with the BPR loss and hand-written gradients (docs/model.md).

``MODELS`` maps the command line's model names to the model classes; a model
is built for a dataset as ``MODELS.get(name)(n_items, **hyperparameters)``.
"""

from rfrs_ref.model.base import Model
from rfrs_ref.model.bpr import bpr_exact, bpr_sampled, log_sigmoid, sigmoid, softplus
from rfrs_ref.model.fism import FISM
from rfrs_ref.model.fmf import FMF
from rfrs_ref.registry import Registry

MODELS: Registry[type[Model]] = Registry("model")
MODELS.register("fism", FISM)
MODELS.register("fmf", FMF)

__all__ = ["MODELS", "Model", "FISM", "FMF", "bpr_exact", "bpr_sampled", "log_sigmoid",
           "sigmoid", "softplus"]
