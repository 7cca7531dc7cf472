"""jaxsync.models: flax (nnx) models by name, as pure functions over plain parameter dicts.

``make(name, input_shape=..., num_classes=...)`` returns a :class:`Model` with
its initial parameters, a pure ``apply(params, inputs)``, its parameter count
and its forward FLOPs per example; :func:`classification_loss` and
:func:`classification_metrics` turn it into the ``loss_fn`` and ``eval_fn``
that :mod:`jaxsync.sim` takes. :data:`MODELS` is the registry of names
(image classifiers ``mlp``, ``cnn``, ``lenet``, ``resnet20``, ``mobilenet``;
the language model ``transformer``, tokens ``[batch, T]`` to next-token logits
``[batch, T, vocabulary]``); :func:`register` adds a model of one's own::

  @jaxsync.models.register("wide_mlp")
  def wide_mlp(input_shape, num_classes, rngs, *, width=512):
    ...  # returns an nnx.Module: images [batch, H, W, C] -> logits [batch, num_classes]

or, with no registration, a config's ``model.name: mymodule:MyModel`` names
one's own nnx builder or Linen module, imported where Python finds it
(:func:`make`); its BatchNorm statistics and dropout streams are carried
beside its parameters. :class:`ShiftConv` is the convolution jaxsync's own
networks use, for a model of one's own: inside the simulator's compiled loop
XLA's CPU convolution (what ``nnx.Conv`` runs) is tens of times slower.
"""

from jaxsync._src.models.networks import (
  MODELS,
  BatchStatNorm,
  Model,
  ShiftConv,
  classification_loss,
  classification_metrics,
  input_key,
  make,
  register,
  zeros_batch,
)

__all__ = [
  "MODELS",
  "BatchStatNorm",
  "Model",
  "ShiftConv",
  "classification_loss",
  "classification_metrics",
  "input_key",
  "make",
  "register",
  "zeros_batch",
]
