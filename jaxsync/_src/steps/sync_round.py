"""One synchronous round, cut into the pieces both runtimes share.

The simulator's rounds (``sim.rounds``: all ``K`` workers in one batched
computation) and the multi-process loop (``dist.sync_runtime``: one worker per
device, a ``psum`` across processes) differ only in how the workers' gradients
or models are summed. What happens to the sum is written here once: the
server rule on the round's aggregate (:func:`apply_aggregate`), a local
worker's round (:func:`local_work`: local steps and its pseudo-gradient, of one
fragment, quantized), the outer step on their mean (:func:`outer_step`), each
worker's model after it (:func:`mixed_model`), and the round's record
(:func:`round_record`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxsync._src.rules import diloco, guard, quantize
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
  strategy: Strategy, loss_fn, batch_fn: Callable[[jax.Array], Any], x, worker_state, step, num_steps=None
) -> tuple[Any, Any, jax.Array]:
  """One worker's ``num_steps`` (default ``local_steps``) steps of its worker rule (local SGD), from its data ``step``.

  Returns:
    ``(x, worker_state, losses)``: the local model, its optimizer state, and
    the ``[num_steps]`` batch losses.
  """

  def one(carry, _):
    x, state, step = carry
    loss, grads = jax.value_and_grad(loss_fn)(x, batch_fn(step))
    updates, state = strategy.worker_rule.update(grads, state, x)
    return (optax.apply_updates(x, updates), state, step + 1), loss

  length = strategy.local_steps if num_steps is None else num_steps
  (x, worker_state, _), losses = jax.lax.scan(one, (x, worker_state, step), None, length=length)
  return x, worker_state, losses


def round_fragment(strategy: Strategy, event) -> jax.Array:
  """The fragment round ``event`` synchronizes: ``event mod P`` (Streaming DiLoCo's schedule; 0 with one fragment)."""
  return jnp.asarray(event, jnp.int32) % strategy.exchange.fragments


class LocalWork(NamedTuple):
  """One worker's part of a local round.

  Attributes:
    model: its model after the round's local steps.
    worker_state: its worker rule's state after them.
    losses: ``[local_steps]`` batch losses.
    contribution: its pseudo-gradient of the round's fragment as the wire
      delivers it (zeros outside the fragment): the runtimes average these.
  """

  model: Any
  worker_state: Any
  losses: jax.Array
  contribution: Any


def local_work(
  strategy: Strategy, loss_fn, batch_fn: Callable[[jax.Array], Any], params, x, worker_state, step, fragment
) -> LocalWork:
  """A worker's round: ``H - tau`` local steps, its pseudo-gradient ``theta - x`` of ``fragment``, ``tau`` more steps.

  The pseudo-gradient (DiLoCo's sign) is quantized to the exchange's wire
  format (:func:`jaxsync._src.rules.quantize.quantized`); with an overlap
  ``tau > 0`` (Streaming DiLoCo) it is taken ``tau`` steps before the round
  ends, and the exchange runs while the worker takes them. The two halves are
  :func:`work_before_exchange` and :func:`work_during_exchange` (a worker of a
  parameter server sends its pseudo-gradient between them).
  """
  work = work_before_exchange(strategy, loss_fn, batch_fn, params, x, worker_state, step, fragment)
  return work_during_exchange(strategy, loss_fn, batch_fn, work, step)


def work_before_exchange(
  strategy: Strategy, loss_fn, batch_fn: Callable[[jax.Array], Any], params, x, worker_state, step, fragment
) -> LocalWork:
  """The round's first ``H - tau`` local steps and the pseudo-gradient of ``fragment`` they end in (quantized)."""
  exchange = strategy.exchange
  first = strategy.local_steps - exchange.overlap
  x, worker_state, losses = local_steps(strategy, loss_fn, batch_fn, x, worker_state, step, first)
  delta = diloco.fragment_pseudo_gradient(params, x, fragment, exchange.fragments)
  delta = quantize.quantized(delta, exchange.quantize, exchange.quantize_block)
  return LocalWork(x, worker_state, losses, delta)


def work_during_exchange(
  strategy: Strategy, loss_fn, batch_fn: Callable[[jax.Array], Any], work: LocalWork, step
) -> LocalWork:
  """The round's last ``tau`` local steps, taken while its exchange runs (``work`` itself when ``tau = 0``).

  ``step`` is the round's first data step, as for :func:`work_before_exchange`.
  """
  exchange = strategy.exchange
  if not exchange.overlap:
    return work
  first = strategy.local_steps - exchange.overlap
  x, worker_state, more = local_steps(
    strategy, loss_fn, batch_fn, work.model, work.worker_state, step + first, exchange.overlap
  )
  return LocalWork(x, worker_state, jnp.concatenate([work.losses, more]), work.contribution)


def outer_step(strategy: Strategy, params, rule_state, pseudo_grads, fragment) -> RoundUpdate:
  """The outer step on the workers' mean pseudo-gradient ``mean_k Q(theta - x_k)`` of ``fragment`` (DiLoCo's form).

  With a wire format the mean is quantized once more, ``Q(mean_k Q(delta_k))``:
  a quantized all-reduce sends each worker's quantized slice to the worker
  that sums it, and that worker sends the sum quantized again (torchft's
  all-to-all, sum, all-gather). With several fragments the server rule is one
  outer optimizer per fragment (:func:`jaxsync._src.rules.diloco.by_fragment`),
  told which one by ``fragment``.
  """
  exchange = strategy.exchange
  pseudo_grads = quantize.quantized(pseudo_grads, exchange.quantize, exchange.quantize_block)
  finite = guard.tree_all_finite(pseudo_grads)
  extra = {"fragment": fragment} if strategy.exchange.fragments > 1 else {}
  updates, rule_state = strategy.server_rule.update(
    pseudo_grads, rule_state, params, grads_finite=finite, **extra
  )
  return RoundUpdate(optax.apply_updates(params, updates), rule_state, finite)


def mixed_model(strategy: Strategy, params, x, fragment):
  """A worker's model after the outer step: its fragment ``(1 - alpha) theta + alpha x``, the rest its own ``x``.

  With one fragment and ``alpha = 0`` (DiLoCo, local SGD) every worker starts
  the next round from the new global parameters.
  """
  exchange = strategy.exchange
  return diloco.mix_fragment(params, x, fragment, exchange.fragments, exchange.mixing)


def fragment_bytes(strategy: Strategy, params, *, on_wire: bool = True) -> tuple[int, ...]:
  """Bytes of each fragment: on the wire (the exchange's format), or as the parameters hold it.

  With elastic membership a parameter server carries every round's message as the whole raveled
  vector (zeros outside the fragment), so each fragment's wire bytes are the parameters'.
  """
  exchange = strategy.exchange
  leaves = jax.tree.leaves(params)
  if on_wire and strategy.elastic_membership:
    return (quantize.wire_bytes(leaves, None, exchange.quantize_block),) * exchange.fragments
  owner = diloco.fragment_of_leaves(params, exchange.fragments) if exchange.fragments > 1 else None
  return tuple(
    quantize.wire_bytes(
      [leaf for i, leaf in enumerate(leaves) if owner is None or owner[i] == p],
      exchange.quantize if on_wire else None,
      exchange.quantize_block,
    )
    for p in range(exchange.fragments)
  )


def rounds_per_fragment(rounds: int, fragments: int) -> list[int]:
  """How many of the first ``rounds`` rounds exchanged each fragment (round ``t`` exchanges ``t mod P``)."""
  return [rounds // fragments + (p < rounds % fragments) for p in range(fragments)]


def exchanged_bytes(strategy: Strategy, params, rounds: int, messages_per_round: float) -> float:
  """Bytes ``rounds`` local rounds moved: ``messages_per_round`` messages of each round's fragment's size."""
  sizes = fragment_bytes(strategy, params)
  return float(
    sum(b * n for b, n in zip(sizes, rounds_per_fragment(rounds, len(sizes)))) * messages_per_round
  )


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
