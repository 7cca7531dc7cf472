"""jaxsync.models: flax (nnx) models by name, as pure functions over plain parameter dicts.

``make(name, input_shape=..., num_classes=...)`` returns a :class:`Model` with
its initial parameters, a pure ``apply(params, images)``, its parameter count
and its forward FLOPs per image; :func:`classification_loss` and
:func:`classification_metrics` turn it into the ``loss_fn`` and ``eval_fn``
that :mod:`jaxsync.sim` takes.
"""

from jaxsync._src.models.networks import (
  MODELS,
  BatchStatNorm,
  Model,
  classification_loss,
  classification_metrics,
  make,
  zeros_batch,
)

__all__ = [
  "MODELS",
  "BatchStatNorm",
  "Model",
  "classification_loss",
  "classification_metrics",
  "make",
  "zeros_batch",
]
