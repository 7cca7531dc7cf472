"""A rule that sees only a model's parameters, while the model's state (BatchNorm statistics) rides beside it."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxsync._src.core import validation, variables
from jaxsync._src.rules import contracts, guard
from jaxsync._src.rules.look_ahead import look_ahead

# Extra args that are trees shaped like the carried model: the rule gets their parameter part.
_TREE_ARGS = ("center", "center_read")


# How a rule's arriving state changes become updates (see keep_model_state).
MODES = ("apply", "share", "message")


class KeepsModelState(optax.GradientTransformationExtraArgs):
  """What :func:`keep_model_state` returns: an optax transform that keeps a model's state apart (a marked
  ``GradientTransformationExtraArgs``, so that a runtime can tell a wrapped rule from a bare one)."""


class KeepModelStateState(NamedTuple):
  """The state of :func:`keep_model_state`: the wrapped rule's, and the changes a buffering rule holds.

  Attributes:
    inner: the wrapped rule's state, built on the parameters alone.
    pending: the sum of the state changes accepted since the last release (a buffering rule's; ``()``
      for a rule that applies every arrival).
    pending_count: how many changes ``pending`` sums (int32; ``()`` likewise).
  """

  inner: Any
  pending: Any = ()
  pending_count: Any = ()

  def look_ahead(self, carried: Any) -> Any:
    """The wrapped rule's look-ahead point for the parameters (SMEGA², EAMSGD); the model state as it is."""
    params = variables.params_of(carried)
    point = look_ahead(params, self.inner)
    if point is params:
      return carried
    return variables.join(point, variables.model_state_of(carried))


def keep_model_state(
  rule: optax.GradientTransformation, mode: str = "apply"
) -> optax.GradientTransformationExtraArgs:
  r"""Applies ``rule`` to a model's parameters, and each arriving change of the model's state as ``mode`` says.

  The model is carried as ``{"params": theta, "model_state": s}`` and its loss
  is built so that the state's gradient slot holds ``c = s - s'``, the change
  of the training pass (``jaxsync.models.classification_loss``); a
  pseudo-gradient (DiLoCo's ``theta - x``) holds it likewise. The rule sees
  ``theta`` alone; no weight decay, momentum or learning rate touches ``s``:

  .. math::

    u_\theta, S' = \text{rule}(g_\theta, S, \theta), \qquad
    u_s = \begin{cases} -c & \text{apply: a worker's own step, a round's mean} \\
                        -c / K & \text{share: one of } K \text{ asynchronous arrivals} \\
                        c & \text{message: a worker's message to its server} \end{cases}

  With ``apply`` a worker's step sets its state to ``s'``, and an all-reduce
  round (or DiLoCo's outer step) that averaged the workers' changes sets it to
  the mean of their new states. With ``share`` (a parameter server's rule,
  ``K = num_live_workers``) ``K`` arrivals computed from the same state move it
  by the mean of their changes, as a synchronous round would, and stale
  arrivals cannot overshoot it. A rule that buffers (``adaptive_k``,
  ``k_async``, InHAD: its state's ``released``) holds the changes too and
  applies their mean when it releases. ``message`` passes the change on
  unchanged: a worker rule whose output the server rule takes as a gradient
  (Barzilai-Borwein's). A rejected (non-finite) arrival changes neither
  part. Extra args that are model trees (``center``, ``center_read``) reach
  the rule as their parameter part, and ``value_fn`` (Armijo's batch loss)
  takes the parameters with the state fixed. A tree without state (a plain
  parameter tree) passes to ``rule`` as it is.

  Args:
    rule: any optax transform over the parameters.
    mode: ``"apply"``, ``"share"`` or ``"message"`` (above).

  Returns:
    A :class:`KeepsModelState` (an ``optax.GradientTransformationExtraArgs``) over the carried tree.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> from jaxsync._src.rules.model_state import keep_model_state
    >>> tx = keep_model_state(optax.chain(optax.add_decayed_weights(0.5), optax.sgd(0.1)))
    >>> model = {"params": jnp.ones(2), "model_state": {"mean": jnp.zeros(2)}}
    >>> grads = {"params": jnp.ones(2), "model_state": {"mean": jnp.array([-0.3, 0.1])}}
    >>> updates, _ = tx.update(grads, tx.init(model), model)
    >>> optax.apply_updates(model, updates)["model_state"]["mean"]  # s' = s - c, never decayed
    Array([ 0.3, -0.1], dtype=float32)

  References:
    Ioffe, Szegedy, "Batch Normalization", ICML 2015 (the running statistics);
    PyTorch's ``DistributedDataParallel(broadcast_buffers=...)`` carries them
    beside the gradients, as buffers.
  """
  mode = validation.check_choice("keep_model_state", "mode", mode, MODES)
  rule = optax.with_extra_args_support(rule)

  def init_fn(carried):
    inner = rule.init(variables.params_of(carried))
    if variables.carries_state(carried) and contracts.released(inner) is not None and mode != "message":
      pending = optax.tree.zeros_like(variables.model_state_of(carried))
      return KeepModelStateState(inner, pending, jnp.zeros([], jnp.int32))
    return KeepModelStateState(inner)

  def update_fn(updates, state, params=None, **extra_args):
    if not variables.carries_state(updates):
      new_updates, inner = rule.update(updates, state.inner, params, **extra_args)
      return new_updates, state._replace(inner=inner)
    model_state = None if params is None else variables.model_state_of(params)
    for name in _TREE_ARGS:
      if extra_args.get(name) is not None:
        extra_args[name] = variables.params_of(extra_args[name])
    value_fn = extra_args.get("value_fn")
    if value_fn is not None and model_state is not None:
      extra_args["value_fn"] = lambda p: value_fn(variables.join(p, model_state))
    theta = None if params is None else variables.params_of(params)
    param_updates, inner = rule.update(updates[variables.PARAMS], state.inner, theta, **extra_args)
    arrived = updates[variables.MODEL_STATE]
    finite = extra_args.get("grads_finite")
    finite = guard.tree_all_finite(arrived) if finite is None else jnp.asarray(finite)
    arrived = guard.keep_if(finite, arrived, optax.tree.zeros_like(arrived))
    if mode == "message":
      return variables.join(param_updates, arrived), state._replace(inner=inner)
    if not isinstance(state.pending_count, tuple):  # a buffering rule: hold the changes, apply their mean
      pending = jax.tree.map(jnp.add, state.pending, arrived)
      count = state.pending_count + finite.astype(jnp.int32)
      released = jnp.asarray(contracts.released(inner)) & (count > 0)
      mean = jax.tree.map(lambda p: p / jnp.maximum(count, 1).astype(p.dtype), pending)
      change = guard.keep_if(released, mean, optax.tree.zeros_like(mean))
      pending = guard.keep_if(released, optax.tree.zeros_like(pending), pending)
      count = jnp.where(released, 0, count)
      new_state = KeepModelStateState(inner, pending, count)
    else:
      change, new_state = arrived, state._replace(inner=inner)
      if mode == "share":
        workers = extra_args.get("num_live_workers")
        share = 1.0 if workers is None else 1.0 / jnp.maximum(jnp.asarray(workers), 1).astype(jnp.float32)
        change = jax.tree.map(lambda c: (c * share).astype(c.dtype), change)
    state_updates = jax.tree.map(jnp.negative, change)
    return variables.join(param_updates, state_updates), new_state

  return KeepsModelState(init_fn, update_fn)


def keeps_model_state(rule: Any) -> bool:
  """Whether ``rule`` is a :func:`keep_model_state` transform."""
  return isinstance(rule, KeepsModelState)
