"""One synchronous round, cut into the pieces both runtimes share.

The simulator's rounds (``sim.rounds``: all ``K`` workers in one batched
computation) and the multi-process loop (``dist.sync_runtime``: one worker per
device, a ``psum`` across processes) differ only in how the workers' gradients
or models are summed. What happens to the sum is written here once: the
server rule on the round's aggregate (:func:`apply_aggregate`), local SGD's
local steps (:func:`local_steps`) and outer step on the averaged models
(:func:`outer_step`), and the round's record (:func:`round_record`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxsync._src.rules import guard
from jaxsync._src.steps.records import EventRecord
from jaxsync._src.strategies.strategy import Strategy


class RoundUpdate(NamedTuple):
  """The server side of a round.

  Attributes:
    params: the parameters after the round.
    rule_state: the server rule's new state.
    finite: the aggregate had no NaN/Inf (a round with one is rejected: no update).
  """

  params: Any
  rule_state: Any
  finite: jax.Array


def apply_aggregate(strategy: Strategy, params, rule_state, grads, *, version, num_workers) -> RoundUpdate:
  """``theta, s = server_rule(g_bar, s, theta; version, num_live_workers)`` on the round's mean gradient."""
  finite = guard.tree_all_finite(grads)
  updates, rule_state = strategy.server_rule.update(
    grads, rule_state, params, version=version, num_live_workers=num_workers, grads_finite=finite
  )
  return RoundUpdate(optax.apply_updates(params, updates), rule_state, finite)


def local_steps(
  strategy: Strategy, loss_fn, batch_fn: Callable[[jax.Array], Any], x, worker_state, step
) -> tuple[Any, Any, jax.Array]:
  """One worker's ``local_steps`` steps of its worker rule (local SGD), from its data ``step``.

  Returns:
    ``(x, worker_state, losses)``: the local model, its optimizer state, and
    the ``[local_steps]`` batch losses.
  """

  def one(carry, _):
    x, state, step = carry
    loss, grads = jax.value_and_grad(loss_fn)(x, batch_fn(step))
    updates, state = strategy.worker_rule.update(grads, state, x)
    return (optax.apply_updates(x, updates), state, step + 1), loss

  (x, worker_state, _), losses = jax.lax.scan(one, (x, worker_state, step), None, length=strategy.local_steps)
  return x, worker_state, losses


def outer_step(strategy: Strategy, params, rule_state, mean_model) -> RoundUpdate:
  """Local SGD's outer step: the server rule on the pseudo-gradient ``theta - mean_k x_k`` (DiLoCo's form)."""
  pseudo_grads = jax.tree.map(lambda p, m: (p - m).astype(p.dtype), params, mean_model)
  finite = guard.tree_all_finite(pseudo_grads)
  updates, rule_state = strategy.server_rule.update(pseudo_grads, rule_state, params, grads_finite=finite)
  return RoundUpdate(optax.apply_updates(params, updates), rule_state, finite)


def round_record(*, time, version, finite, k, loss, evaluated, metrics) -> EventRecord:
  """The record of a round: no arriving worker, no staleness, ``k`` gradients combined when it updated."""
  return EventRecord(
    time=time,
    worker=jnp.asarray(-1, jnp.int32),
    staleness=jnp.asarray(0, jnp.int32),
    version=version,
    released=finite,
    k=jnp.where(finite, k, 0).astype(jnp.int32),
    loss=jnp.asarray(loss, jnp.float32),
    rejected=~finite,
    step_size=jnp.asarray(jnp.nan, jnp.float32),
    evaluated=evaluated,
    metrics=metrics,
  )
