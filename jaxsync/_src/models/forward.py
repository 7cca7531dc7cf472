"""A user's module (flax nnx or Linen) as pure forward passes over the tree the runtimes carry.

Both kinds become the same three functions over the carried tree
(:mod:`jaxsync._src.core.variables`: the parameters, and beside them the state
that is not a parameter):

* ``evaluate(carried, inputs) -> logits``: evaluation mode (nnx ``eval()``;
  Linen ``train=False`` or ``deterministic=True``), the running statistics
  read, no randomness;
* ``train(carried, inputs, rng) -> (logits, new_state)``: training mode (nnx
  ``train()``; Linen ``train=True`` / ``deterministic=False``), the state
  updated by the pass (BatchNorm's running averages), the random streams
  (dropout) drawn from ``rng``, a ``uint32`` that differs per worker and step;
* ``export(carried)``: the user's own model back: an nnx module in ``eval()``
  mode holding the carried values, or Linen's ``{"params", "batch_stats",
  ...}`` variables.

What is a parameter: nnx ``Param`` variables, Linen's ``params`` collection.
What is state: every other nnx ``Variable`` type (``BatchStat``, one's own)
and every other Linen collection, except random streams: nnx ``RngState``
(keys and counts) is kept out of the carried tree, its keys folded with each
step's ``rng``, so that each worker's streams are its own and a resumed run
draws the same numbers. State must be floating point: it is averaged where a
strategy combines models.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen, nnx

from jaxsync._src.core import validation, variables

_WHAT = "models"
# Linen's call conventions for the mode, in the order they are looked for: (argument, its value in training).
LINEN_MODE_ARGUMENTS = (("train", True), ("training", True), ("is_training", True), ("deterministic", False))
# The random streams a Linen module is given (``rngs=``) in training.
LINEN_RNG_STREAMS = ("dropout",)


@dataclasses.dataclass(frozen=True)
class Forward:
  """A module's forward passes over the carried tree (see the module docstring).

  Attributes:
    carried: the initial carried tree (parameters, and state when there is some).
    evaluate: ``(carried, inputs) -> logits`` in evaluation mode.
    train: ``(carried, inputs, rng) -> (logits, new_state)`` in training mode;
      ``new_state`` is ``{}`` for a model without state.
    export: ``carried -> the user's model`` (an nnx module, or Linen variables).
    uses_rng: the training pass draws random numbers (dropout).
    kind: ``"nnx"`` or ``"linen"``.
  """

  carried: Any
  evaluate: Callable[[Any, jax.Array], jax.Array]
  train: Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]
  export: Callable[[Any], Any]
  uses_rng: bool
  kind: str

  @property
  def has_state(self) -> bool:
    return variables.carries_state(self.carried)


def is_linen(obj: Any) -> bool:
  """Whether ``obj`` is a Linen module (an instance) or a Linen module class."""
  return isinstance(obj, linen.Module) or (inspect.isclass(obj) and issubclass(obj, linen.Module))


def _check_floating_state(name: str, state: Any, kind: str) -> None:
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    if not jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.floating):
      where = jax.tree_util.keystr(path)
      raise ValueError(
        f"{_WHAT}: name={name!r} keeps model state {where} of dtype {jnp.asarray(leaf).dtype}, which no "
        "strategy can combine; expected floating-point state (BatchNorm statistics: averaged where a "
        f"strategy combines models) besides the parameters and the random streams ({kind})."
      )


def _folded(rng_state: Any, rng: jax.Array) -> Any:
  """The random streams' keys folded with this step's ``rng`` (the counts as they were)."""

  def fold(leaf):
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      return jax.random.fold_in(leaf, rng)
    return leaf

  return jax.tree.map(fold, rng_state)


def from_nnx(name: str, module: nnx.Module) -> Forward:
  """The forward passes of an nnx module: ``Param`` the parameters, ``RngState`` the streams, the rest state."""
  module.train()
  train_def, params, rng_state, state = nnx.split(module, nnx.Param, nnx.RngState, ...)
  module.eval()
  eval_def, *_ = nnx.split(module, nnx.Param, nnx.RngState, ...)
  params, rng_state, state = (nnx.to_pure_dict(s) for s in (params, rng_state, state))
  _check_floating_state(name, state, "nnx Variables other than Param and RngState")
  uses_rng = bool(jax.tree.leaves(rng_state))

  def evaluate(carried, inputs):
    model = nnx.merge(eval_def, variables.params_of(carried), rng_state, variables.model_state_of(carried))
    return model(inputs)

  def train(carried, inputs, rng):
    streams = rng_state if rng is None else _folded(rng_state, rng)
    model = nnx.merge(train_def, variables.params_of(carried), streams, variables.model_state_of(carried))
    logits = model(inputs)
    *_, new_state = nnx.split(model, nnx.Param, nnx.RngState, ...)
    return logits, nnx.to_pure_dict(new_state)

  def export(carried):
    return nnx.merge(eval_def, variables.params_of(carried), rng_state, variables.model_state_of(carried))

  return Forward(variables.join(params, state), evaluate, train, export, uses_rng, "nnx")


def _linen_mode(module: linen.Module) -> str | None:
  """The argument of ``module.__call__`` that sets its mode (``train``, ``deterministic``, ...), or None."""
  accepted = inspect.signature(type(module).__call__).parameters
  return next((arg for arg, _ in LINEN_MODE_ARGUMENTS if arg in accepted), None)


def from_linen(name: str, module: linen.Module, example: jax.Array, seed: int) -> Forward:
  """The forward passes of a Linen module, initialized on ``example`` inputs with ``seed``.

  ``params`` is the parameters; every other collection (``batch_stats``, ...) is state, made
  mutable in training. The mode goes through the first of ``train``, ``training``,
  ``is_training`` (True in training) or ``deterministic`` (False in training) that
  ``__call__`` takes; a module with none of them runs the same in both. Training draws the
  ``dropout`` stream.
  """
  mode = _linen_mode(module)
  in_training = dict(LINEN_MODE_ARGUMENTS)

  def mode_args(training: bool) -> dict[str, bool]:
    if mode is None:
      return {}
    return {mode: in_training[mode] if training else not in_training[mode]}

  key = jax.random.key(seed)
  init_rngs = {"params": key, **{s: jax.random.fold_in(key, i + 1) for i, s in enumerate(LINEN_RNG_STREAMS)}}
  try:
    initial = module.init(init_rngs, example, **mode_args(False))
  except Exception as err:
    raise ValueError(
      f"{_WHAT}: name={name!r}: the Linen module's init on inputs of shape {tuple(example.shape)} raised "
      f"{type(err).__name__}: {err}"
    ) from None
  initial = dict(initial)
  if "params" not in initial:
    raise ValueError(
      f"{_WHAT}: name={name!r} is a Linen module with no 'params' collection (it has {sorted(initial)}); "
      "expected a module with trainable parameters."
    )
  params = initial.pop("params")
  state = {c: v for c, v in initial.items() if c != "intermediates"}
  _check_floating_state(name, state, "Linen collections other than params")
  collections = sorted(state)

  def evaluate(carried, inputs):
    return module.apply(
      {"params": variables.params_of(carried), **variables.model_state_of(carried)},
      inputs,
      **mode_args(False),
    )

  def train(carried, inputs, rng):
    rngs = {}
    if rng is not None:
      base = jax.random.fold_in(jax.random.key(seed), rng)
      rngs = {s: jax.random.fold_in(base, i) for i, s in enumerate(LINEN_RNG_STREAMS)}
    given = {"params": variables.params_of(carried), **variables.model_state_of(carried)}
    if not collections:
      return module.apply(given, inputs, rngs=rngs, **mode_args(True)), {}
    logits, mutated = module.apply(given, inputs, rngs=rngs, mutable=collections, **mode_args(True))
    return logits, {c: mutated[c] for c in collections}

  def export(carried):
    return {"params": variables.params_of(carried), **variables.model_state_of(carried)}

  # Whether the module draws random numbers: a training pass without streams fails on the first draw.
  uses_rng = mode is not None
  if uses_rng:
    try:
      jax.eval_shape(lambda c, x: train(c, x, None), variables.join(params, state), example)
      uses_rng = False
    except Exception:  # it asked for a stream: give it one each step
      uses_rng = True
  return Forward(variables.join(params, state), evaluate, train, export, uses_rng, "linen")


def linen_instance(name: str, obj: Any, num_classes: int, options: dict[str, Any]) -> linen.Module:
  """A Linen module from a class (built with ``num_classes`` when it has that field, and ``options``) or an instance."""
  if isinstance(obj, linen.Module):
    if options:
      raise ValueError(
        f"{_WHAT}: name={name!r} is a Linen module instance, which takes no options; got {sorted(options)}."
      )
    return obj
  fields = {f.name for f in dataclasses.fields(obj)} - {"parent", "name"}
  unknown = sorted(set(options) - fields)
  if unknown:
    raise ValueError(
      f"{_WHAT}: unknown option(s) {unknown} for name={name!r}; its fields are {', '.join(sorted(fields))}."
    )
  kwargs = dict(options)
  if "num_classes" in fields and "num_classes" not in kwargs:
    kwargs["num_classes"] = num_classes
  try:
    return obj(**kwargs)
  except TypeError as err:
    raise validation.invalid(_WHAT, "name", name, f"a Linen module class its options build ({err})") from None
