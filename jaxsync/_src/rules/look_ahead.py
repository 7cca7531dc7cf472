"""Where a worker computes its next gradient, read from a rule's state."""

from __future__ import annotations

from typing import Any

import jax
import optax

from jaxsync._src.rules import guard


def _states_with_look_ahead(state: Any) -> list[Any]:
  """Every node of a (chained, wrapped) optimizer state that defines ``look_ahead``."""
  found = []
  stack = [state]
  while stack:
    node = stack.pop()
    if callable(getattr(node, "look_ahead", None)) and isinstance(node, tuple):
      found.append(node)
    elif isinstance(node, (tuple, list)):
      stack.extend(node)
    elif isinstance(node, dict):
      stack.extend(node.values())
  return found


def look_ahead(params: optax.Params, opt_state: Any) -> optax.Params:
  r"""The parameters at which the next gradient must be computed: ``params``, or a rule's look-ahead point.

  Most rules take gradients at the parameters themselves. Two take them at a
  point ahead, kept in their state, to make up for where the parameters will
  have moved: :func:`smega2` replies ``w_hat = w - a v - b G`` to its sender,
  and :func:`easgd_worker` with momentum (EAMSGD) takes its gradient at
  ``x + delta v``, Nesterov's point. Call it wherever a gradient is about to be
  computed: it searches ``opt_state`` (through ``optax.chain`` tuples and
  wrappers) for such a rule and applies it, and without one returns ``params``
  unchanged, so the same loop serves every rule.

  .. math::

    \text{point} = \begin{cases} w - a v - b G & \text{SMEGA}^2 \\
                                 x + \delta v & \text{EAMSGD} \\
                                 \text{params} & \text{otherwise} \end{cases}

  Args:
    params: the parameters the rule's state belongs to.
    opt_state: the rule's (possibly chained) state.

  Returns:
    The gradient point, a tree like ``params``.

  Raises:
    ValueError: when the state holds more than one look-ahead rule.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> tx = optax.chain(optax.add_decayed_weights(1e-4), jaxsync.smega2(0.1, num_workers=4))
    >>> w = jnp.ones(2); state = tx.init(w)
    >>> jaxsync.look_ahead(w, state)  # no momentum yet: w itself
    Array([1., 1.], dtype=float32)

  References:
    Cohen, Hakimi, Schuster, "SMEGA2: Distributed Asynchronous Deep Neural
    Network Training With a Single Momentum Buffer", ICPP 2022; Zhang,
    Choromanska, LeCun, "Deep learning with Elastic Averaging SGD", NeurIPS 2015.
  """
  found = _states_with_look_ahead(opt_state)
  if len(found) > 1:
    names = ", ".join(type(s).__name__ for s in found)
    raise ValueError(
      f"look_ahead: opt_state holds {len(found)} look-ahead rules ({names}); expected at most one."
    )
  return _look_ahead_of(found[0], params) if found else params


def _look_ahead_of(state: Any, params: optax.Params) -> optax.Params:
  """``state.look_ahead`` on the leaves the rule trains; under ``optax.masked`` / ``multi_transform`` (whose
  states hold ``MaskedNode`` on the other leaves) those others are the parameters themselves."""
  masks = [
    field
    for field in state
    if any(guard.is_masked(x) for x in jax.tree.leaves(field, is_leaf=guard.is_masked))
  ]
  if not masks:
    return state.look_ahead(params)
  point = state.look_ahead(guard.masked_like(params, masks[0]))
  return jax.tree.map(lambda p, x: x if guard.is_masked(p) else p, point, params, is_leaf=guard.is_masked)
