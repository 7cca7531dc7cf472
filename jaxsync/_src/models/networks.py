"""Flax (nnx) models by name, as pure ``apply(params, inputs)`` functions over plain dicts.

Image classifiers (``mlp``, ``cnn``, ``lenet``, ``resnet20``, ``mobilenet``)
map float32 images ``[batch, height, width, channels]`` to logits
``[batch, classes]``; the language model (``transformer``) maps int32 tokens
``[batch, T]`` to next-token logits ``[batch, T, vocabulary]``. The loss and
metrics below take both: a label per example, or one per token.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen, nnx

from jaxsync._src.core import validation, variables
from jaxsync._src.core.registry import Registry
from jaxsync._src.models import forward as forward_lib
from jaxsync._src.models.layers import BatchStatNorm, ShiftConv
from jaxsync._src.models.transformer import Transformer

_WHAT = "models"
# What a model reads from a batch: its input key, the dtype of those inputs, and the shape of one example.
INPUTS = {
  "image": (jnp.float32, "(height, width, channels)", 3),
  "tokens": (jnp.int32, "(sequence_length,)", 1),
}


class Mlp(nnx.Module):
  """Flatten, then dense layers with ReLU."""

  def __init__(self, in_features: int, num_classes: int, hidden: tuple[int, ...], rngs: nnx.Rngs):
    sizes = (in_features, *hidden)
    self.depth = len(hidden)
    for i in range(self.depth):
      setattr(self, f"dense{i}", nnx.Linear(sizes[i], sizes[i + 1], rngs=rngs))
    self.head = nnx.Linear(sizes[-1], num_classes, rngs=rngs)

  def __call__(self, x):
    x = x.reshape(x.shape[0], -1)
    for i in range(self.depth):
      x = nnx.relu(getattr(self, f"dense{i}")(x))
    return self.head(x)


class SmallCnn(nnx.Module):
  """Two 3x3 convolutions (32, 64 channels), 2x2 max pooling, a 128-unit dense layer."""

  def __init__(self, channels: int, height: int, width: int, num_classes: int, rngs: nnx.Rngs):
    self.conv0 = ShiftConv(channels, 32, (3, 3), rngs=rngs)
    self.conv1 = ShiftConv(32, 64, (3, 3), rngs=rngs)
    self.dense = nnx.Linear((height // 2) * (width // 2) * 64, 128, rngs=rngs)
    self.head = nnx.Linear(128, num_classes, rngs=rngs)

  def __call__(self, x):
    x = nnx.relu(self.conv0(x))
    x = nnx.relu(self.conv1(x))
    x = nnx.max_pool(x, (2, 2), strides=(2, 2))
    x = nnx.relu(self.dense(x.reshape(x.shape[0], -1)))
    return self.head(x)


class LeNet(nnx.Module):
  """LeNet-style: 3x3 convolution, 2x2 max pooling, again, then a dense layer (widths 16, 32, 64).

  Sized for 28x28 images on a CPU: pooling after each convolution keeps the
  second convolution at a quarter of the pixels (about 2.4 MFLOPs per 28x28
  image forward, against 30 for ``cnn``, which convolves at full resolution).
  """

  def __init__(self, channels: int, height: int, width: int, num_classes: int, rngs: nnx.Rngs):
    self.conv0 = ShiftConv(channels, 16, (3, 3), rngs=rngs)
    self.conv1 = ShiftConv(16, 32, (3, 3), rngs=rngs)
    self.dense = nnx.Linear((height // 4) * (width // 4) * 32, 64, rngs=rngs)
    self.head = nnx.Linear(64, num_classes, rngs=rngs)

  def __call__(self, x):
    x = nnx.max_pool(nnx.relu(self.conv0(x)), (2, 2), strides=(2, 2))
    x = nnx.max_pool(nnx.relu(self.conv1(x)), (2, 2), strides=(2, 2))
    x = nnx.relu(self.dense(x.reshape(x.shape[0], -1)))
    return self.head(x)


class _BasicBlock(nnx.Module):
  def __init__(self, in_channels: int, out_channels: int, stride: int, rngs: nnx.Rngs):
    self.conv0 = ShiftConv(in_channels, out_channels, (3, 3), strides=stride, use_bias=False, rngs=rngs)
    self.norm0 = BatchStatNorm(out_channels)
    self.conv1 = ShiftConv(out_channels, out_channels, (3, 3), use_bias=False, rngs=rngs)
    self.norm1 = BatchStatNorm(out_channels)
    self.stride = stride
    self.pad = out_channels - in_channels

  def __call__(self, x):
    y = nnx.relu(self.norm0(self.conv0(x)))
    y = self.norm1(self.conv1(y))
    shortcut = x[:, :: self.stride, :: self.stride, :]
    if self.pad:  # option A of He et al.: identity with zero-padded channels
      shortcut = jnp.pad(shortcut, ((0, 0), (0, 0), (0, 0), (0, self.pad)))
    return nnx.relu(y + shortcut)


class ResNet20(nnx.Module):
  """ResNet-20 for CIFAR (He et al. 2016, §4.2): 3 stages of 3 basic blocks, 16/32/64 channels."""

  def __init__(self, channels: int, num_classes: int, rngs: nnx.Rngs, blocks_per_stage: int = 3):
    self.stem = ShiftConv(channels, 16, (3, 3), use_bias=False, rngs=rngs)
    self.stem_norm = BatchStatNorm(16)
    self.num_blocks = 3 * blocks_per_stage
    in_channels = 16
    for stage, width in enumerate((16, 32, 64)):
      for b in range(blocks_per_stage):
        stride = 2 if stage > 0 and b == 0 else 1
        setattr(self, f"block{stage * blocks_per_stage + b}", _BasicBlock(in_channels, width, stride, rngs))
        in_channels = width
    self.head = nnx.Linear(64, num_classes, rngs=rngs)

  def __call__(self, x):
    x = nnx.relu(self.stem_norm(self.stem(x)))
    for i in range(self.num_blocks):
      x = getattr(self, f"block{i}")(x)
    return self.head(jnp.mean(x, axis=(1, 2)))


class SmallMobileNet(nnx.Module):
  """A small MobileNet (Howard et al. 2017): depthwise-separable 3x3 blocks, 32 to 256 channels."""

  _PLAN = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1))

  def __init__(self, channels: int, num_classes: int, rngs: nnx.Rngs):
    self.stem = ShiftConv(channels, 32, (3, 3), use_bias=False, rngs=rngs)
    self.stem_norm = BatchStatNorm(32)
    in_channels = 32
    for i, (width, stride) in enumerate(self._PLAN):
      setattr(
        self,
        f"depthwise{i}",
        ShiftConv(
          in_channels, in_channels, (3, 3), strides=stride, depthwise=True, use_bias=False, rngs=rngs
        ),
      )
      setattr(self, f"depthwise_norm{i}", BatchStatNorm(in_channels))
      setattr(self, f"pointwise{i}", ShiftConv(in_channels, width, (1, 1), use_bias=False, rngs=rngs))
      setattr(self, f"pointwise_norm{i}", BatchStatNorm(width))
      in_channels = width
    self.head = nnx.Linear(in_channels, num_classes, rngs=rngs)

  def __call__(self, x):
    x = nnx.relu(self.stem_norm(self.stem(x)))
    for i in range(len(self._PLAN)):
      x = nnx.relu(getattr(self, f"depthwise_norm{i}")(getattr(self, f"depthwise{i}")(x)))
      x = nnx.relu(getattr(self, f"pointwise_norm{i}")(getattr(self, f"pointwise{i}")(x)))
    return self.head(jnp.mean(x, axis=(1, 2)))


MODELS: Registry[Callable[..., nnx.Module]] = Registry(_WHAT)
# The input key of each registered model (``register(name, inputs=...)``), by (name, builder): an entry
# outlives its builder's registration (a test's scratch registry) but is found only with it.
_INPUT_KEYS: dict[tuple[str, Callable[..., nnx.Module]], str] = {}


def register(
  name: str, *, inputs: str = "image"
) -> Callable[[Callable[..., nnx.Module]], Callable[..., nnx.Module]]:
  """Registers a model builder under ``name``: :func:`make` (and a config's ``model.name``) then takes it.

  The builder is called as ``builder(input_shape, num_classes, rngs, **options)``
  with an ``nnx.Rngs`` and returns an ``nnx.Module``; its keyword-only
  parameters are the options :func:`make` accepts for it. With
  ``inputs="image"`` (the default) ``input_shape = (height, width,
  channels)`` and the module maps float32 images ``[batch, height, width,
  channels]`` to logits ``[batch, num_classes]``; with ``inputs="tokens"``
  ``input_shape = (sequence_length,)``, ``num_classes`` is the vocabulary
  size, and the module maps int32 tokens ``[batch, T]`` (``T <=
  sequence_length``) to logits ``[batch, T, num_classes]``. The built-in
  models are registered so.

  Args:
    name: the model's name, not registered yet (a ``ValueError`` otherwise).
    inputs: the batch key the model reads, ``"image"`` or ``"tokens"``; a
      dataset's :attr:`~jaxsync.datasets.Dataset.input_key` must match it.

  Returns:
    A decorator that registers the builder and returns it unchanged.

  Example:
    >>> import jaxsync
    >>> from flax import linen, nnx
    >>> @jaxsync.models.register("linear_example")
    ... def linear(input_shape, num_classes, rngs, *, bias=True):
    ...   height, width, channels = input_shape
    ...   dense = nnx.Linear(height * width * channels, num_classes, use_bias=bias, rngs=rngs)
    ...   return nnx.Sequential(lambda x: x.reshape(x.shape[0], -1), dense)
    >>> jaxsync.models.make("linear_example", input_shape=(8, 8, 1), num_classes=10, bias=False).num_params
    640
  """
  inputs = validation.check_choice(_WHAT, "inputs", inputs, tuple(INPUTS))
  add = MODELS.register(name)

  def register_with_inputs(builder: Callable[..., nnx.Module]) -> Callable[..., nnx.Module]:
    _INPUT_KEYS[name, builder] = inputs
    return add(builder)

  return register_with_inputs


def input_key(name: str) -> str:
  """The batch key model ``name`` reads, ``"image"`` or ``"tokens"``: the ``inputs`` it was registered with.

  A dataset's :attr:`~jaxsync.datasets.Dataset.input_key` must be the same
  for the model to train on it (a config that pairs them otherwise is refused).

  Args:
    name: one of :data:`MODELS`.

  Returns:
    ``"image"`` or ``"tokens"``.

  Example:
    >>> import jaxsync
    >>> jaxsync.models.input_key("cnn"), jaxsync.models.input_key("transformer")
    ('image', 'tokens')
  """
  return _INPUT_KEYS.get((name, MODELS.lookup(name)), "image")


@register("mlp")
def _mlp(input_shape, num_classes: int, rngs: nnx.Rngs, *, hidden=(128,)) -> nnx.Module:
  height, width, channels = input_shape
  return Mlp(height * width * channels, num_classes, tuple(hidden), rngs)


@register("cnn")
def _cnn(input_shape, num_classes: int, rngs: nnx.Rngs) -> nnx.Module:
  height, width, channels = input_shape
  return SmallCnn(channels, height, width, num_classes, rngs)


@register("lenet")
def _lenet(input_shape, num_classes: int, rngs: nnx.Rngs) -> nnx.Module:
  height, width, channels = input_shape
  return LeNet(channels, height, width, num_classes, rngs)


@register("resnet20")
def _resnet20(input_shape, num_classes: int, rngs: nnx.Rngs) -> nnx.Module:
  return ResNet20(input_shape[2], num_classes, rngs)


@register("mobilenet")
def _mobilenet(input_shape, num_classes: int, rngs: nnx.Rngs) -> nnx.Module:
  return SmallMobileNet(input_shape[2], num_classes, rngs)


@register("transformer", inputs="tokens")
def _transformer(
  input_shape,
  num_classes: int,
  rngs: nnx.Rngs,
  *,
  layers: int = 2,
  width: int = 64,
  heads: int = 2,
  mlp_ratio: int = 4,
  tied: bool = True,
) -> nnx.Module:
  layers = validation.check_int(_WHAT, "layers", layers)
  width = validation.check_int(_WHAT, "width", width)
  heads = validation.check_int(_WHAT, "heads", heads)
  mlp_ratio = validation.check_int(_WHAT, "mlp_ratio", mlp_ratio)
  if width % heads:
    raise validation.invalid(_WHAT, "width", width, f"a multiple of heads={heads}")
  if not isinstance(tied, bool):
    raise validation.invalid(_WHAT, "tied", tied, "true or false")
  (length,) = input_shape
  return Transformer(
    num_classes, length, layers=layers, width=width, heads=heads, mlp_ratio=mlp_ratio, tied=tied, rngs=rngs
  )


def _options(builder: Callable[..., nnx.Module]) -> tuple[str, ...] | None:
  """The options ``builder`` takes (its keyword-only parameters); None if it takes any (``**options``)."""
  parameters = inspect.signature(builder).parameters.values()
  if any(p.kind == p.VAR_KEYWORD for p in parameters):
    return None
  return tuple(p.name for p in parameters if p.kind == p.KEYWORD_ONLY)


# Forward FLOPs per example by (name, input shape, classes, options): XLA's cost analysis needs a compile.
_FLOPS: dict[tuple, float] = {}


@dataclasses.dataclass(frozen=True)
class Model:
  """A model as plain functions over the tree the runtimes carry: what the simulator and the runtimes need.

  A model with state that is not a parameter (BatchNorm's running statistics,
  any nnx ``Variable`` that is not a ``Param``, any Linen collection but
  ``params``) is carried as ``{"params": theta, "model_state": s}``; one
  without, as its parameters alone (``jaxsync._src.core.variables``).

  Attributes:
    name: the registry name, or the ``module:attribute`` it was imported from.
    params: the initial carried tree: the parameters, with the state beside
      them when there is some (:attr:`has_state`).
    apply: ``(params, inputs) -> logits`` in evaluation mode (the running
      statistics, no dropout), pure and jittable; ``inputs`` is
      ``[batch, *input_shape]`` of :attr:`input_dtype` (float32 images
      ``[batch, height, width, channels]``, or int32 tokens ``[batch, T]``).
    input_shape: one example's shape: ``(height, width, channels)``, or
      ``(sequence_length,)`` for a language model.
    num_classes: the number of output classes (a language model's vocabulary
      size).
    num_params: the number of trainable parameters (the state not counted).
    flops_per_sample: forward FLOPs for one example (an image, or a whole
      sequence of ``sequence_length`` tokens), from XLA's cost analysis of
      the compiled forward pass as implemented (convolutions as
      :class:`ShiftConv` also count the zero padding at the borders, about 20%
      more than the valid taps for ResNet-20 on 32x32). The simulator's
      compute time uses ``3x`` this per example; the EA-wild paper's
      computation-to-communication ratio (HPCAsia 2020) uses it.
    input_key: the batch key the model reads: ``"image"`` (labels ``[batch]``)
      or ``"tokens"`` (labels ``[batch, T]``, one per position).
    train_apply: ``(params, inputs, rng) -> (logits, new_model_state)`` in
      training mode; ``rng`` (a ``uint32``, per worker and step: the batch's
      ``"_rng"``) seeds the random streams (dropout), ``None`` for a model
      without any. ``new_model_state`` is ``{}`` for a model without state.
    export: ``params -> the user's own model``: an nnx module in ``eval()``
      mode, or Linen variables ``{"params", "batch_stats", ...}``.
    uses_rng: the training pass draws random numbers (dropout): its batches
      need ``"_rng"`` (``WorkerData(..., rng=True)``).
    kind: ``"nnx"`` or ``"linen"``.
  """

  name: str
  params: Any
  apply: Callable[[Any, jax.Array], jax.Array]
  input_shape: tuple[int, ...]
  num_classes: int
  num_params: int
  flops_per_sample: float
  input_key: str = "image"
  train_apply: Callable[[Any, jax.Array, Any], tuple[jax.Array, Any]] | None = None
  export: Callable[[Any], Any] | None = None
  uses_rng: bool = False
  kind: str = "nnx"

  @property
  def input_dtype(self) -> Any:
    """The dtype of the inputs: float32 for images, int32 for tokens."""
    return INPUTS[self.input_key][0]

  @property
  def has_state(self) -> bool:
    """Whether the model keeps state beside its parameters (BatchNorm's running statistics)."""
    return variables.carries_state(self.params)


def make(
  name: str,
  *,
  input_shape: tuple[int, ...],
  num_classes: int,
  seed: int = 0,
  inputs: str | None = None,
  **options: Any,
) -> Model:
  """Builds the model registered as ``name`` (``mlp``, ``cnn``, ``transformer``, ...), or one's own, for ``input_shape``.

  ``name`` is a registered name or ``module:attribute``, imported as Python
  finds modules (the current directory, ``PYTHONPATH``, installed packages),
  naming one of:

  * an nnx builder ``builder(input_shape, num_classes, rngs, **options) ->
    nnx.Module`` (a function, or an ``nnx.Module`` class with that
    ``__init__``), as :func:`register` takes;
  * a Linen module class, built with ``num_classes`` when it has that field and
    with ``options`` as its other fields, or a Linen module instance;
  * a factory ``factory(input_shape, num_classes, rngs, **options)`` returning
    a Linen module.

  Args:
    name: one of :data:`MODELS`, or ``module:attribute``.
    input_shape: ``(height, width, channels)`` of one image, or
      ``(sequence_length,)`` for a model of tokens (``transformer``).
    num_classes: output classes, ``>= 2`` (the vocabulary size for tokens).
    seed: the initialization seed.
    inputs: the batch key the model reads (``"image"`` or ``"tokens"``);
      ``None``: the registered model's own, ``"image"`` for an imported one.
    **options: the builder's keyword-only options: ``hidden`` (a tuple of
      layer widths) for ``mlp``; ``layers`` (2), ``width`` (64), ``heads``
      (2), ``mlp_ratio`` (4) and ``tied`` (True: the output layer is the token
      embedding's transpose) for ``transformer``.

  Returns:
    A :class:`Model`.

  Raises:
    ValueError: an unknown name or option, a module that fails to import, a
      builder that returns no module, or a model whose outputs are not one
      logit per class (``[batch, num_classes]``, ``[batch, T, num_classes]``
      for tokens): each in one line naming what would be valid.

  Example:
    >>> import jaxsync
    >>> model = jaxsync.models.make("cnn", input_shape=(8, 8, 1), num_classes=10)
    >>> model.num_params, model.apply(model.params, jaxsync.models.zeros_batch(model, 2)).shape
    (151306, (2, 10))
    >>> lm = jaxsync.models.make("transformer", input_shape=(64,), num_classes=256)
    >>> lm.num_params, lm.apply(lm.params, jaxsync.models.zeros_batch(lm, 2)).shape
    (120576, (2, 64, 256))

  References:
    He, Zhang, Ren, Sun, "Deep Residual Learning for Image Recognition", CVPR
    2016 (ResNet-20, §4.2); Howard et al., "MobileNets", arXiv:1704.04861, 2017;
    Vaswani et al., "Attention Is All You Need", NeurIPS 2017 (the transformer).
  """
  builder = MODELS.lookup(name)
  if inputs is None:
    key_name = input_key(name)
  else:
    key_name = validation.check_choice(_WHAT, "inputs", inputs, tuple(INPUTS))
  dtype, expected, ndim = INPUTS[key_name]
  shape = tuple(input_shape)
  if len(shape) != ndim or not all(isinstance(d, int) and d >= 1 for d in shape):
    raise validation.invalid(_WHAT, "input_shape", input_shape, f"{expected}, positive integers")
  num_classes = validation.check_int(_WHAT, "num_classes", num_classes, low=2)
  seed = validation.check_int(_WHAT, "seed", seed, low=0)
  example = jnp.zeros((2, *shape), dtype)
  forward = _build(name, builder, shape, num_classes, seed, options, example)
  params = forward.carried

  key = (name, shape, num_classes, repr(sorted(options.items())))
  if key not in _FLOPS:  # the same network at any seed: checked and compiled once per process
    _check_outputs(name, forward.evaluate, params, example, num_classes)
    _check_training_pass(name, forward, example)
    one = jnp.zeros((1, *shape), dtype)
    cost = jax.jit(forward.evaluate).lower(params, one).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    _FLOPS[key] = float(cost.get("flops", 0.0)) if cost else 0.0
  trainable = variables.params_of(params)
  num_params = sum(math.prod(x.shape) for x in jax.tree.leaves(trainable))
  return Model(
    name, params, forward.evaluate, shape, num_classes, num_params, _FLOPS[key], key_name,
    train_apply=forward.train, export=forward.export, uses_rng=forward.uses_rng, kind=forward.kind,
  )  # fmt: skip


def _build(name, builder, shape, num_classes, seed, options, example) -> forward_lib.Forward:
  """The user's module from ``builder`` (nnx or Linen), as forward passes; checks the options it takes."""
  if forward_lib.is_linen(builder):
    module = forward_lib.linen_instance(name, builder, num_classes, options)
    return forward_lib.from_linen(name, module, example, seed)
  if not callable(builder):
    raise validation.invalid(
      _WHAT,
      "name",
      name,
      f"a model builder, an nnx.Module class or a Linen module (it names a {type(builder).__name__})",
    )
  accepted = _options(builder)
  unknown = [] if accepted is None else sorted(set(options) - set(accepted))
  if unknown:
    takes = ", ".join(repr(o) for o in accepted) or "no options"
    raise ValueError(f"{_WHAT}: unknown option(s) {unknown} for name={name!r}; {name!r} takes {takes}.")
  try:
    module = builder(shape, num_classes, nnx.Rngs(seed), **options)
  except Exception as err:  # the user's builder: whatever it raises is said in one line
    raise ValueError(
      f"{_WHAT}: name={name!r}: calling it as builder(input_shape={shape}, num_classes={num_classes}, "
      f"rngs, **options) raised {type(err).__name__}: {_first_line(err)}; expected the signature of "
      "jaxsync.models.register's builders."
    ) from None
  if isinstance(module, linen.Module):
    return forward_lib.from_linen(name, module, example, seed)
  if not isinstance(module, nnx.Module):
    raise ValueError(
      f"{_WHAT}: the builder of name={name!r} returned a {type(module).__name__}; expected an nnx.Module "
      "(or a Linen module)."
    )
  return forward_lib.from_nnx(name, module)


def _first_line(err: BaseException) -> str:
  text = str(err).strip()
  return text.splitlines()[0] if text else ""


def _check_training_pass(name, forward, example) -> None:
  """The training pass runs (it is traced, not run): a model's error surfaces before training, in one line."""
  rng = jnp.zeros([], jnp.uint32) if forward.uses_rng else None
  try:
    jax.eval_shape(lambda c, x: forward.train(c, x, rng), forward.carried, example)
  except Exception as err:
    raise ValueError(
      f"{_WHAT}: name={name!r}: its training pass on inputs of shape {tuple(example.shape)} raised "
      f"{type(err).__name__}: {_first_line(err)}"
    ) from None


def _check_outputs(name, evaluate, params, example, num_classes) -> None:
  """The model gives one logit per class: ``[batch, num_classes]`` (``[batch, T, num_classes]`` for tokens)."""
  try:
    out = jax.eval_shape(evaluate, params, example)
  except Exception as err:
    raise ValueError(
      f"{_WHAT}: name={name!r}: its forward pass on inputs of shape {tuple(example.shape)} "
      f"({example.dtype}) raised {type(err).__name__}: {_first_line(err)}"
    ) from None
  want = (*example.shape, num_classes) if example.dtype == jnp.int32 else (example.shape[0], num_classes)
  got = getattr(out, "shape", None)
  if got != want:
    raise ValueError(
      f"{_WHAT}: name={name!r} returns outputs of shape {got} for inputs of shape {tuple(example.shape)}; "
      f"expected {want}: one logit per class of the dataset (num_classes={num_classes})."
    )


def zeros_batch(model: Model, size: int) -> jax.Array:
  """A batch of ``size`` zero inputs shaped for ``model``: float32 images, or int32 tokens (all id 0)."""
  return jnp.zeros((size, *model.input_shape), model.input_dtype)


RNG_KEY = "_rng"


def classification_loss(model: Model) -> Callable[[Any, dict], jax.Array]:
  r"""``loss_fn(params, batch)``: mean softmax cross-entropy of the model's logits against ``batch["label"]``.

  The model reads ``batch[model.input_key]``: images with one label each, or
  tokens ``[batch, T]`` with one label (the next token) per position, the
  loss then being the mean over every position of every sequence.

  The pass runs in training mode. For a model with state (``params =
  {"params": theta, "model_state": s}``) the loss carries the state's change
  in its gradient and nothing in its value:

  .. math::

    L(\theta, s) = \mathrm{CE}(f_\theta(x; \bar s)) + \langle \bar{(s - s')}, s \rangle
      - \overline{\langle (s - s'), s \rangle}, \qquad \nabla_s L = s - s'

  (bars: ``stop_gradient``; ``s'`` the state after the pass), which the
  strategies' rules apply as ``s <- s - grad_s = s'``
  (``jaxsync.strategies.with_model_state``). A model that draws random
  numbers (dropout) takes them from ``batch["_rng"]`` (``WorkerData(...,
  rng=True)``: per worker and step, the same on a resumed run).

  Args:
    model: a :class:`Model`.

  Returns:
    ``loss_fn(params, batch) -> scalar``, pure and jittable.
  """
  key = model.input_key

  def cross_entropy(logits, batch):
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

  if not model.has_state and not model.uses_rng:

    def loss_fn(params, batch):
      return cross_entropy(model.apply(params, batch[key]), batch)

    return loss_fn

  def stateful_loss_fn(params, batch):
    rng = None
    if model.uses_rng:
      if RNG_KEY not in batch:
        raise ValueError(
          f"{_WHAT}: model {model.name!r} draws random numbers (dropout) and its batch has no {RNG_KEY!r}; "
          f"expected batches of WorkerData(..., rng=True) (it has {sorted(batch)})."
        )
      rng = batch[RNG_KEY].reshape(-1)[0]
    state = variables.model_state_of(params)
    frozen = variables.join(variables.params_of(params), jax.lax.stop_gradient(state))
    logits, new_state = model.train_apply(frozen, batch[key], rng)
    loss = cross_entropy(logits, batch)
    if not model.has_state:
      return loss
    change = jax.tree.map(lambda s, n: jax.lax.stop_gradient(s - n), state, new_state)
    inner = sum(
      jnp.vdot(c, s).astype(jnp.float32) for c, s in zip(jax.tree.leaves(change), jax.tree.leaves(state))
    )
    # Zero in value, s - s' in gradient (the equation above).
    return loss + (inner - jax.lax.stop_gradient(inner))

  return stateful_loss_fn


def classification_metrics(
  model: Model, inputs: Any, labels: Any, *, batch_size: int = 500
) -> Callable[[Any], dict[str, jax.Array]]:
  """``eval_fn(params) -> {"loss", "accuracy"}`` over a held-out set, in fixed batches (jittable).

  The set is cut into ``ceil(N / batch_size)`` equal batches (the last one
  completed with the first examples and masked), so that memory stays bounded
  and batch-statistics normalization sees large batches of real images.
  ``eval_fn`` is a ``jax.tree_util.Partial`` whose leaves are the batches: the
  runtimes pass them to their compiled programs as arguments, so the set is
  not a constant folded into every program. For a language model (labels
  ``[N, T]``) ``loss`` is the mean next-token cross-entropy (its exponential
  the perplexity) and ``accuracy`` the fraction of positions whose most likely
  next token is the true one.

  Args:
    model: a :class:`Model`.
    inputs: ``N`` held-out examples, ``[N, *model.input_shape]``.
    labels: their labels, ``[N]`` (or ``[N, T]`` for tokens).
    batch_size: examples per evaluation batch.

  Returns:
    ``eval_fn(params) -> {"loss": scalar, "accuracy": scalar}``.
  """
  inputs = jnp.asarray(inputs, model.input_dtype)
  labels = jnp.asarray(labels, jnp.int32)
  n = inputs.shape[0]
  batch_size = min(validation.check_int(_WHAT, "batch_size", batch_size), n)
  batches = -(-n // batch_size)
  # The last batch is filled with the first examples again (masked out of the
  # metrics) so that batch statistics always see real images.
  order = jnp.arange(batches * batch_size) % n
  inputs_b = inputs[order].reshape(batches, batch_size, *inputs.shape[1:])
  labels_b = labels[order].reshape(batches, batch_size, *labels.shape[1:])
  mask_b = (jnp.arange(batches * batch_size) < n).reshape(batches, batch_size)

  return jax.tree_util.Partial(
    functools.partial(_batched_metrics, model.apply, n), inputs_b, labels_b, mask_b
  )


def split_metrics(**eval_fns: Callable[[Any], dict[str, jax.Array]]) -> Callable[[Any], dict[str, jax.Array]]:
  """One ``eval_fn`` evaluating several held-out splits, each split's metrics under its own prefix.

  ``split_metrics(test=f, validation=g)(params)`` is ``{"loss", "accuracy",
  "validation_loss", "validation_accuracy"}``: the split named ``test`` keeps
  the bare names (what a run's target and summary read), every other split's
  metrics are prefixed with its name. Like :func:`classification_metrics` it is
  a ``jax.tree_util.Partial`` whose leaves are the splits' batches.

  Args:
    **eval_fns: ``{split: eval_fn}``, each ``eval_fn(params) -> {metric: scalar}``.

  Returns:
    ``eval_fn(params) -> {metric or f"{split}_{metric}": scalar}``.
  """
  if not eval_fns:
    raise ValueError(f"{_WHAT}: split_metrics needs at least one split; got {eval_fns=}")
  names = tuple(eval_fns)
  return jax.tree_util.Partial(functools.partial(_merged_metrics, names), *eval_fns.values())


def _merged_metrics(names, *fns_and_params):
  *fns, params = fns_and_params
  out: dict[str, jax.Array] = {}
  for name, fn in zip(names, fns):
    prefix = "" if name == "test" else f"{name}_"
    out.update({f"{prefix}{metric}": value for metric, value in fn(params).items()})
  return out


def _batched_metrics(apply, n, inputs_b, labels_b, mask_b, params):
  def one(carry, xs):
    x, y, m = xs
    logits = apply(params, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    correct = jnp.argmax(logits, -1) == y
    if loss.ndim > 1:  # one label per token: each sequence's mean over its positions
      positions = tuple(range(1, loss.ndim))
      loss, correct = jnp.mean(loss, axis=positions), jnp.mean(correct, axis=positions)
    return (carry[0] + jnp.sum(loss * m), carry[1] + jnp.sum(correct * m)), None

  (loss, correct), _ = jax.lax.scan(one, (0.0, 0.0), (inputs_b, labels_b, mask_b))
  return {"loss": loss / n, "accuracy": correct / n}
