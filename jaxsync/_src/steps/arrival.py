"""One asynchronous arrival, cut where a real cluster cuts it: the worker's side and the server's side.

Both runtimes run exactly these functions: the simulator's event step
(``sim.events``, both sides in one compiled step) and the multi-process
parameter server (:mod:`server_step` in the server process,
:func:`worker_message` in each worker process). That is what makes a
one-worker real run equal the simulated one.

Three protocols (``Strategy.protocol``): a *gradient* worker sends its gradient
through its worker rule and the server rule applies it
(:func:`worker_message`, :func:`server_arrival`); a *local* worker (asynchronous
local SGD) takes local steps from what it pulled and sends the pseudo-gradient,
which the server rule applies the same way (:func:`local_message`); an *elastic* worker keeps a
model of its own, steps it against the centre it read, and on exchange steps
the centre rule takes the worker's model (:func:`elastic_worker_step`,
:func:`elastic_center_arrival`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.rules import contracts, guard
from jaxsync._src.strategies.strategy import Dispatch, Strategy


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


def _recorded_step_size(worker_state: Any) -> jax.Array:
  size = contracts.step_size(worker_state)
  return jnp.asarray(jnp.nan if size is None else size, jnp.float32)


class WorkerGradient(NamedTuple):
  """A worker's gradient, the part of an arrival that needs only what the worker pulled.

  Attributes:
    loss: the batch loss at the point the gradient was taken.
    grads: the gradient of the batch loss there.
    finite: no NaN/Inf in ``grads``.
  """

  loss: jax.Array
  grads: Any
  finite: jax.Array


def unit_batch(strategy: Strategy, data: WorkerData, unit, step):
  """The batch of ``unit`` (:attr:`Strategy.num_units`) at its ``step``: an EA-wild group's is its members'.

  A group ``u`` of ``G`` steps on the mean gradient of its members
  ``uG, ..., uG + G - 1``: their batches concatenated (equal sizes, so the
  mean over the whole equals the mean of the members' means). Any other
  unit is one worker with its own batch.
  """
  g = strategy.workers_per_unit
  if g == 1:
    return data.batch(unit, step)
  parts = [data.batch(unit * g + i, step) for i in range(g)]
  return jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)


def gradient_point(x, worker_state):
  """Where a worker takes its gradient: the look-ahead point of its rule (SMEGA², EAMSGD), else ``x``."""
  return x if worker_state is None else contracts.reply_params(x, worker_state)


def worker_gradient(loss_fn, point, batch) -> WorkerGradient:
  """``loss, g = value_and_grad(L)(point, batch)`` and whether ``g`` is finite.

  It depends only on the worker's own model or pull and its batch, so the
  simulator computes the gradients of many in-flight workers in one batched
  call ahead of their arrivals (``sim.events``), and a real worker computes
  its own.
  """
  loss, grads = jax.value_and_grad(loss_fn)(point, batch)
  # The worker checks its gradient (off the server's path in a real cluster);
  # its rule then rejects a bad one, and so does the server.
  return WorkerGradient(jnp.asarray(loss, jnp.float32), grads, guard.tree_all_finite(grads))


def worker_message(
  strategy: Strategy, loss_fn, x, worker_state, batch, noise_ratio, gradient: WorkerGradient | None = None
) -> WorkerMessage:
  """The worker's side of an arrival (``"gradient"`` protocol): gradient at the look-ahead point, worker rule.

  ``g = grad L(look_ahead(x), batch)``; ``m, s' = worker_rule(g, s, x)`` (``m = g`` without a rule).
  The worker rule gets the extra args ``noise_ratio`` (the server's, for BB)
  and ``value_fn`` (the batch loss, for Armijo backtracking); a rule that does
  not use them ignores them. ``gradient``, when given, is
  :func:`worker_gradient` at :func:`gradient_point` computed ahead.
  """
  if gradient is None:
    gradient = worker_gradient(loss_fn, gradient_point(x, worker_state), batch)
  finite = gradient.finite
  message, new_state = gradient.grads, worker_state
  if strategy.worker_rule is not None:
    message, new_state = strategy.worker_rule.update(
      gradient.grads,
      worker_state,
      x,
      grads_finite=finite,
      noise_ratio=noise_ratio,
      value_fn=lambda p: loss_fn(p, batch),
    )
    # A finite gradient can still make a non-finite message (a momentum or a
    # BB step that overflows): the server must not trust the gradient's flag.
    finite = finite & guard.tree_all_finite(message)
  return WorkerMessage(gradient.loss, message, new_state, finite, _recorded_step_size(new_state))


def local_message(strategy: Strategy, loss_fn, x, worker_state, batch_fn, step, num_steps) -> WorkerMessage:
  """The worker's side of an asynchronous local-SGD arrival: ``num_steps`` local steps, then the pseudo-gradient.

  ``x_0 = x``; ``x_{i+1} = x_i + worker_rule(grad L(x_i, batch(step + i)))``
  for ``i < num_steps``; the message is ``x - x_H`` (DiLoCo's sign), the
  worker rule's state (the inner optimizer's moments) carried over. The loss
  is the mean of the local steps' batch losses. A non-finite local gradient is
  rejected by the worker rule (that step changes nothing).

  Args:
    strategy: a ``"local"``-protocol strategy.
    loss_fn: ``(params, batch) -> scalar``.
    x: the parameters the worker pulled.
    worker_state: its worker rule's state.
    batch_fn: ``step -> batch`` of this worker.
    step: the data step of the first local step.
    num_steps: the local steps to take (a traced int32 is fine: a loop, not an unrolled scan).
  """

  def one(i, carry):
    model, state, loss_sum = carry
    loss, grads = jax.value_and_grad(loss_fn)(model, batch_fn(step + i))
    updates, state = strategy.worker_rule.update(grads, state, model)
    return optax.apply_updates(model, updates), state, loss_sum + jnp.asarray(loss, jnp.float32)

  end, new_state, loss_sum = jax.lax.fori_loop(
    0, num_steps, one, (x, worker_state, jnp.zeros([], jnp.float32))
  )
  message = jax.tree.map(lambda a, b: (a - b).astype(a.dtype), x, end)
  return WorkerMessage(
    loss=loss_sum / jnp.maximum(num_steps, 1).astype(jnp.float32),
    message=message,
    worker_state=new_state,
    finite=guard.tree_all_finite(message),
    step_size=jnp.asarray(jnp.nan, jnp.float32),
  )


class ServerArrival(NamedTuple):
  """The server's side of an arrival.

  Attributes:
    params: the server parameters after the rule.
    rule_state: the server rule's new state.
    released: the arrival changed the parameters (accepted and, for a
      buffering rule, released).
    k_used: gradients (or worker models) combined in the update; 0 when
      nothing was released.
    pending: accepted arrivals since the last update, after this one.
  """

  params: Any
  rule_state: Any
  released: jax.Array
  k_used: jax.Array
  pending: jax.Array


def server_arrival(
  strategy: Strategy, params, rule_state, message, *, worker, version, pending, num_live_workers, finite
) -> ServerArrival:
  """Applies the server rule to one message of ``worker`` computed on parameters of ``version``.

  ``u, s' = server_rule(m, s, theta; worker, version, num_live_workers, grads_finite)``;
  ``theta' = theta + u``. A non-finite message changes nothing (the rules
  keep their state) and releases nothing.
  """
  updates, new_rule_state = strategy.server_rule.update(
    message,
    rule_state,
    params,
    worker=jnp.asarray(worker, jnp.int32),
    version=version,
    num_live_workers=jnp.asarray(num_live_workers, jnp.int32),
    grads_finite=finite,
  )
  params = optax.apply_updates(params, updates)
  flag = contracts.released(new_rule_state)
  released = finite if flag is None else jnp.logical_and(flag, finite)
  pending = pending + finite.astype(jnp.int32)
  combined = contracts.gradients_in(new_rule_state)
  k_used = jnp.where(released, pending if combined is None else combined, 0).astype(jnp.int32)
  return ServerArrival(params, new_rule_state, released, k_used, jnp.where(released, 0, pending))


class ElasticStep(NamedTuple):
  """An elastic worker's local step (its side of an EASGD / EA-wild arrival).

  Attributes:
    loss: the batch loss at the point the gradient was taken.
    model: the worker's model after its step (and its share of an exchange).
    worker_state: the worker rule's new state.
    exchanged: this step made an elastic exchange (the centre must take
      :attr:`sent`, the worker's pre-exchange model).
    sent: the worker's model before the step: what the centre takes.
    finite: no NaN/Inf in the gradient.
  """

  loss: jax.Array
  model: Any
  worker_state: Any
  exchanged: jax.Array
  sent: Any
  finite: jax.Array


def elastic_worker_step(
  strategy: Strategy, loss_fn, x, worker_state, batch, center_read, gradient: WorkerGradient | None = None
) -> ElasticStep:
  """An elastic worker's step against the centre it read (``"elastic"`` protocol, docs/algorithms.md §12-§13).

  ``g = grad L(look_ahead(x), batch)``; ``u, s' = worker_rule(g, s, x; center=center_read)``;
  ``x' = x + u``. On exchange steps ``u`` includes ``-alpha (x - center_read)``
  and the centre must take ``x`` (:func:`elastic_center_arrival`). ``gradient``,
  when given, is :func:`worker_gradient` at :func:`gradient_point` computed ahead.
  """
  if gradient is None:
    gradient = worker_gradient(loss_fn, gradient_point(x, worker_state), batch)
  local, new_state = strategy.worker_rule.update(
    gradient.grads, worker_state, x, center=center_read, grads_finite=gradient.finite
  )
  return ElasticStep(
    loss=gradient.loss,
    model=optax.apply_updates(x, local),
    worker_state=new_state,
    exchanged=contracts.exchanged(new_state),
    sent=x,
    finite=gradient.finite,
  )


def elastic_center_arrival(
  strategy: Strategy, center, rule_state, worker_model, *, exchanged, center_read
) -> tuple[Any, Any]:
  """The centre's side of an elastic exchange: ``w_center += alpha (x - w_ref)`` when ``exchanged``.

  ``w_ref`` is the current centre for a locked exchange (EASGD) and the
  worker's lock-free read ``center_read`` for EA-wild. Off exchange steps the
  centre and its rule state are unchanged.

  Returns:
    ``(center, rule_state)``.
  """
  update, new_rule_state = strategy.server_rule.update(
    worker_model, rule_state, center, center_read=center_read if strategy.lock_free else None
  )
  update = guard.keep_if(exchanged, update, optax.tree.zeros_like(update))
  new_rule_state = guard.keep_if(exchanged, new_rule_state, rule_state)
  return optax.apply_updates(center, update), new_rule_state


def counts_as_fresh(strategy: Strategy, pulled_version, version):
  """Whether an arrival computed on ``pulled_version`` is fresh at server ``version`` for the dispatch: within
  ``strategy.fresh_staleness`` steps of it (every arrival when that is None), the server rule's own reading."""
  if strategy.fresh_staleness is None:
    return jnp.asarray(True)
  return version - pulled_version <= strategy.fresh_staleness


def dispatch(strategy: Strategy, waiting, worker, steps, released, fresh, rejected):
  """Who gets the current parameters after ``worker``'s arrival, and who keeps waiting.

  Args:
    strategy: gives the policy (``Strategy.dispatch``) and SSP's bound.
    waiting: ``bool[K]``, the server's waiting set ``C`` before the arrival.
    worker: the arriving worker.
    steps: ``int[K]``, gradients each worker computed, this one included (SSP's clocks).
    released, fresh, rejected: the arrival released an update / counts as
      fresh (:func:`counts_as_fresh`) / was rejected as non-finite.

  Returns:
    ``(send, waiting)``: ``bool[K]`` masks.
  """
  sender = jnp.arange(waiting.shape[0]) == worker
  policy = strategy.dispatch
  if policy == Dispatch.IMMEDIATE:
    return sender, waiting
  if policy == Dispatch.SSP:
    waiting = waiting | sender
    # Spec §8: send to every waiting worker within s clocks of the slowest.
    send = waiting & (steps - jnp.min(steps) <= strategy.staleness_bound)
  elif policy == Dispatch.ON_RELEASE:
    waiting = waiting | (sender & ~rejected)
    send = (waiting & released) | (sender & rejected)
  else:  # ON_RELEASE_FRESH: stale (and rejected) arrivals get parameters at once (docs/algorithms.md §11d).
    joins = sender & fresh & ~rejected
    waiting = waiting | joins
    send = (waiting & released) | (sender & ~joins)
  return send, waiting & ~send
