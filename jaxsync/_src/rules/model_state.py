"""A rule that sees only a model's parameters, while the model's state (BatchNorm statistics) rides beside it."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxsync._src.core import variables
from jaxsync._src.rules import guard
from jaxsync._src.rules.look_ahead import look_ahead

# Extra args that are trees shaped like the carried model: the rule gets their parameter part.
_TREE_ARGS = ("center", "center_read")


class KeepModelStateState(NamedTuple):
  """The state of :func:`keep_model_state`: the wrapped rule's, built on the parameters alone.

  Attributes:
    inner: the wrapped rule's state.
  """

  inner: Any

  def look_ahead(self, carried: Any) -> Any:
    """The wrapped rule's look-ahead point for the parameters (SMEGA², EAMSGD); the model state as it is."""
    params = variables.params_of(carried)
    point = look_ahead(params, self.inner)
    if point is params:
      return carried
    return variables.join(point, variables.model_state_of(carried))


def keep_model_state(rule: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
  r"""Applies ``rule`` to a model's parameters and each arriving change of its state as it is.

  The model is carried as ``{"params": theta, "model_state": s}`` and its loss
  is built so that the state's gradient slot holds ``s - s'``, the change of
  the training pass (``jaxsync.models.classification_loss``). So

  .. math::

    u_\theta, S' = \text{rule}(g_\theta, S, \theta), \qquad u_s = -g_s = s' - s

  and ``optax.apply_updates`` sets the state to the one the gradient's pass
  computed. What a runtime averages before a rule (an all-reduce of the
  workers' gradients, DiLoCo's pseudo-gradients) is then the average of the
  workers' new states. No weight decay, momentum or learning rate touches the
  state. A rejected (non-finite) arrival changes neither part. Extra args
  that are model trees (``center``, ``center_read``) reach the rule as their
  parameter part, and ``value_fn`` (Armijo's batch loss) takes the parameters
  with the state fixed.

  A tree without state (a plain parameter tree) passes to ``rule`` as it is.

  Args:
    rule: any optax transform over the parameters.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` over the carried tree.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> from jaxsync._src.rules.model_state import keep_model_state
    >>> tx = keep_model_state(optax.chain(optax.add_decayed_weights(0.5), optax.sgd(0.1)))
    >>> model = {"params": jnp.ones(2), "model_state": {"mean": jnp.zeros(2)}}
    >>> grads = {"params": jnp.ones(2), "model_state": {"mean": jnp.array([-0.3, 0.1])}}
    >>> updates, _ = tx.update(grads, tx.init(model), model)
    >>> optax.apply_updates(model, updates)["model_state"]["mean"]  # s' = s - g_s, never decayed
    Array([ 0.3, -0.1], dtype=float32)

  References:
    Ioffe, Szegedy, "Batch Normalization", ICML 2015 (the running statistics);
    PyTorch's ``DistributedDataParallel(broadcast_buffers=...)`` carries them
    beside the gradients, as buffers.
  """
  rule = optax.with_extra_args_support(rule)

  def init_fn(carried):
    return KeepModelStateState(rule.init(variables.params_of(carried)))

  def update_fn(updates, state, params=None, **extra_args):
    if not variables.carries_state(updates):
      new_updates, inner = rule.update(updates, state.inner, params, **extra_args)
      return new_updates, KeepModelStateState(inner)
    model_state = None if params is None else variables.model_state_of(params)
    for name in _TREE_ARGS:
      if extra_args.get(name) is not None:
        extra_args[name] = variables.params_of(extra_args[name])
    value_fn = extra_args.get("value_fn")
    if value_fn is not None and model_state is not None:
      extra_args["value_fn"] = lambda p: value_fn(variables.join(p, model_state))
    param_updates, inner = rule.update(
      updates[variables.PARAMS],
      state.inner,
      variables.params_of(params) if params is not None else None,
      **extra_args,
    )
    change = jax.tree.map(jnp.negative, updates[variables.MODEL_STATE])
    finite = extra_args.get("grads_finite")
    finite = guard.tree_all_finite(change) if finite is None else finite
    change = guard.keep_if(finite, change, optax.tree.zeros_like(change))
    return variables.join(param_updates, change), KeepModelStateState(inner)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
