"""One asynchronous arrival, cut where a real cluster cuts it: the worker's side and the server's side.

Both runtimes run exactly these functions: the simulator's event step
(``sim_events``, both sides in one compiled step) and the multi-process
parameter server (``param_server``: :func:`worker_message` in each worker
process, :func:`server_arrival` and :func:`dispatch` in the server process).
That is what makes a one-worker real run equal the simulated one.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxsync._src.rules import guard
from jaxsync._src.rules.look_ahead import look_ahead
from jaxsync._src.strategies.registry import Strategy


class WorkerMessage(NamedTuple):
  """What a worker computes from the parameters it pulled.

  Attributes:
    loss: the batch loss at the point the gradient was taken.
    message: what it sends (the gradient through the worker rule).
    worker_state: the worker rule's new state (``None`` without a rule).
    finite: no NaN/Inf in the gradient nor in the message.
    step_size: the worker's adaptive step size (BB), else NaN.
  """

  loss: jax.Array
  message: Any
  worker_state: Any
  finite: jax.Array
  step_size: jax.Array


def worker_message(strategy: Strategy, loss_fn, x, worker_state, batch, noise_ratio) -> WorkerMessage:
  """The worker's side of an arrival (``"gradient"`` protocol): gradient at the look-ahead point, worker rule.

  ``g = grad L(look_ahead(x), batch)``; ``m, s' = worker_rule(g, s, x)`` (``m = g`` without a rule).
  """
  point = look_ahead(x, worker_state) if worker_state is not None else x
  loss, grads = jax.value_and_grad(loss_fn)(point, batch)
  # The worker checks its gradient (off the server's path in a real cluster);
  # its rule then rejects a bad one, and so does the server.
  finite = guard.tree_all_finite(grads)
  step_size = jnp.asarray(jnp.nan, jnp.float32)
  message, new_state = grads, worker_state
  if strategy.worker_rule is not None:
    extra = {"grads_finite": finite}
    if strategy.uses_noise_ratio:
      extra["noise_ratio"] = noise_ratio
    if strategy.armijo:
      extra["value_fn"] = lambda p: loss_fn(p, batch)
    message, new_state = strategy.worker_rule.update(grads, worker_state, x, **extra)
    # A finite gradient can still make a non-finite message (a momentum or a
    # BB step that overflows): the server must not trust the gradient's flag.
    finite = finite & guard.tree_all_finite(message)
    size = optax.tree.get(new_state, "step_size", None)
    if size is not None:
      step_size = jnp.asarray(size, jnp.float32)
  return WorkerMessage(jnp.asarray(loss, jnp.float32), message, new_state, finite, step_size)


class ServerArrival(NamedTuple):
  """The server's side of an arrival.

  Attributes:
    params: the server parameters after the rule.
    rule_state: the server rule's new state.
    released: the arrival changed the parameters (accepted and, for a
      buffering rule, released).
    k_used: gradients combined in the update (0 when nothing was released).
    pending: accepted arrivals since the last update, after this one.
  """

  params: Any
  rule_state: Any
  released: jax.Array
  k_used: jax.Array
  pending: jax.Array


def server_arrival(
  strategy: Strategy, params, rule_state, message, *, version, pending, num_live_workers, finite
) -> ServerArrival:
  """Applies the server rule to one message computed on parameters of ``version``.

  ``u, s' = server_rule(m, s, theta; version, num_live_workers, grads_finite)``;
  ``theta' = theta + u``. A non-finite message changes nothing (the rules
  keep their state) and releases nothing.
  """
  updates, new_rule_state = strategy.server_rule.update(
    message,
    rule_state,
    params,
    version=version,
    num_live_workers=jnp.asarray(num_live_workers, jnp.int32),
    grads_finite=finite,
  )
  params = optax.apply_updates(params, updates)
  flag = optax.tree.get(new_rule_state, "released", None)
  released = finite if flag is None else jnp.logical_and(flag, finite)
  pending = pending + finite.astype(jnp.int32)
  last_k = optax.tree.get(new_rule_state, "last_k", None)
  k_used = jnp.where(released, pending if last_k is None else last_k, 0).astype(jnp.int32)
  return ServerArrival(params, new_rule_state, released, k_used, jnp.where(released, 0, pending))


def reply_parameters(params, rule_state):
  """What the server sends a worker: the parameters, or SMEGA2's look-ahead estimate of them."""
  return look_ahead(params, rule_state)


def dispatch(strategy: Strategy, waiting, k, steps, released, fresh, rejected):
  """Who gets the current parameters after worker ``k``'s arrival, and who keeps waiting.

  Args:
    strategy: gives the policy (``Strategy.dispatch``) and SSP's bound.
    waiting: ``bool[K]``, the server's waiting set ``C`` before the arrival.
    k: the arriving worker.
    steps: ``int[K]``, gradients each worker computed, this one included (SSP's clocks).
    released, fresh, rejected: the arrival released an update / was computed
      on the current version / was rejected as non-finite.

  Returns:
    ``(send, waiting)``: ``bool[K]`` masks.
  """
  onehot = jnp.arange(waiting.shape[0]) == k
  policy = strategy.dispatch
  if policy == "immediate":
    return onehot, waiting
  if policy == "ssp":
    waiting = waiting | onehot
    # Spec §8: send to every waiting worker within s clocks of the slowest.
    send = waiting & (steps - jnp.min(steps) <= strategy.staleness_bound)
  elif policy == "on_release":
    waiting = waiting | (onehot & ~rejected)
    send = (waiting & released) | (onehot & rejected)
  else:  # on_release_fresh: stale (and rejected) arrivals get parameters at once (spec §11d).
    joins = onehot & fresh & ~rejected
    waiting = waiting | joins
    send = (waiting & released) | (onehot & ~joins)
  return send, waiting & ~send
