"""The synchronous engine: one compiled step per round behind a barrier.

All ``K`` workers start a round on the same parameters, so their gradients are
one batched computation: the gradient of ``sum_k w_k L(theta; batch_k)``
equals ``sum_k w_k g_k`` (``w_k = 1/k`` for the ``k`` gradients kept, 0 for
the dropped ones) and costs what the ``K`` separate gradients cost, without
``K`` gradient copies. Local SGD keeps the ``K`` models (a leading worker axis)
and ``vmap``s their local steps.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.rules import guard
from jaxsync._src.sim.time_model import TimeModel
from jaxsync._src.steps.records import EvalSchedule, EventRecord, stack_workers
from jaxsync._src.strategies.registry import Strategy


class RoundState(NamedTuple):
  """The whole state of a synchronous simulation (checkpoint it to resume).

  Attributes:
    clock: simulated seconds at the end of the last round.
    idle: seconds each worker spent not computing.
    steps: gradients each worker started.
    used: gradients of each worker that were aggregated.
    params: the server (global) parameters.
    rule_state: the server rule's state (the outer optimizer for local SGD).
    version: server updates so far.
    worker_params: ``[K, ...]`` local models (local SGD), else ``()``.
    worker_state: ``[K, ...]`` local optimizer states (local SGD), else ``()``.
    inter_messages: full-size messages sent between machines.
    intra_messages: full-size messages inside a group (hierarchical all-reduce).
    next_eval: the next evaluation point (updates or seconds).
    event: rounds simulated.
    key: the compute-time jitter seed, ``uint32[2]``.
  """

  clock: jax.Array
  idle: jax.Array
  steps: jax.Array
  used: jax.Array
  params: Any
  rule_state: Any
  version: jax.Array
  worker_params: Any
  worker_state: Any
  inter_messages: jax.Array
  intra_messages: jax.Array
  next_eval: jax.Array
  event: jax.Array
  key: jax.Array


def init(
  strategy: Strategy, params: Any, time_model: TimeModel, schedule: EvalSchedule, key: jax.Array
) -> RoundState:
  """The state at time 0: every worker holds ``params``."""
  del time_model
  k_workers = strategy.num_workers
  local = strategy.protocol == "local"

  return RoundState(
    clock=jnp.zeros([], jnp.float32),
    idle=jnp.zeros([k_workers], jnp.float32),
    steps=jnp.zeros([k_workers], jnp.int32),
    used=jnp.zeros([k_workers], jnp.int32),
    params=params,
    rule_state=strategy.server_rule.init(params),
    version=jnp.zeros([], jnp.int32),
    worker_params=stack_workers(params, k_workers) if local else (),
    worker_state=stack_workers(strategy.worker_rule.init(params), k_workers) if local else (),
    inter_messages=jnp.zeros([], jnp.int32),
    intra_messages=jnp.zeros([], jnp.int32),
    next_eval=schedule.first_due(),
    event=jnp.zeros([], jnp.int32),
    key=key,
  )


def communication_time(strategy: Strategy, time_model: TimeModel, pushes: int) -> float:
  """Seconds of one round's exchange (the formulas of :class:`TimeModel`)."""
  k_workers = strategy.num_workers
  comm = strategy.communication
  if comm == "ring":
    return time_model.ring_allreduce_time(k_workers)
  if comm == "hierarchical":
    return time_model.hierarchical_allreduce_time(k_workers, strategy.group_size)
  return time_model.parameter_server_round_time(k_workers, pushes)


def messages_per_round(strategy: Strategy, pushes: int) -> tuple[int, int]:
  """Full-size messages a round moves: (between machines, inside groups).

  A ring all-reduce over ``P`` moves ``2(P-1)/P`` of a message per member,
  ``2(P-1)`` in all; the hierarchical form runs that ring over the ``P/G``
  leaders and a reduce plus a broadcast inside each group.
  """
  k_workers = strategy.num_workers
  if strategy.communication == "parameter_server":
    return pushes + k_workers, 0
  if strategy.communication == "hierarchical":
    g = strategy.group_size
    return 2 * (k_workers // g - 1), 2 * (g - 1) * (k_workers // g)
  return 2 * (k_workers - 1), 0


def next_event_time(s: RoundState) -> jax.Array:
  """When the next round starts."""
  return s.clock


def step(
  strategy: Strategy,
  loss_fn,
  data: WorkerData,
  time_model: TimeModel,
  schedule: EvalSchedule,
  metric_names: tuple[str, ...],
  s: RoundState,
) -> tuple[RoundState, EventRecord]:
  """One round: every worker computes, the server aggregates, everyone gets the result."""
  k_workers = strategy.num_workers
  workers = jnp.arange(k_workers, dtype=jnp.int32)
  if strategy.protocol == "local":
    return _local_round(strategy, loss_fn, data, time_model, schedule, metric_names, s)

  keep = strategy.gradients_per_round
  durations = time_model.sample_compute(s.key, workers, s.steps)
  if keep < k_workers:
    # Fastest-k (spec §9): the k earliest finishers are kept, the rest cancelled.
    rank = jnp.argsort(jnp.argsort(durations, stable=True), stable=True)
    kept = rank < keep
    round_compute = jnp.sort(durations)[keep - 1]
  else:
    kept = jnp.ones([k_workers], jnp.bool_)
    round_compute = jnp.max(durations)
  weights = kept.astype(jnp.float32) / keep
  # A cancelled worker's gradient must not touch the round even when it is
  # NaN (0 * NaN = NaN): it is computed on the fastest worker's batch instead.
  fastest = jnp.argmin(durations).astype(jnp.int32)
  source = jnp.where(kept, workers, fastest)
  batches = jax.vmap(data.batch)(source, s.steps[source])

  def weighted_loss(p):
    losses = jax.vmap(loss_fn, in_axes=(None, 0))(p, batches)
    return jnp.sum(weights * losses)

  loss, grads = jax.value_and_grad(weighted_loss)(s.params)
  finite = guard.tree_all_finite(grads)
  updates, rule_state = strategy.server_rule.update(
    grads, s.rule_state, s.params, version=s.version, num_live_workers=k_workers, grads_finite=finite
  )
  params = optax.apply_updates(s.params, updates)
  end = s.clock + round_compute + communication_time(strategy, time_model, keep)
  busy = jnp.minimum(durations, round_compute)  # dropped workers are cancelled at the cut
  return _finish_round(
    strategy,
    schedule,
    metric_names,
    s,
    params=params,
    rule_state=rule_state,
    end=end,
    busy=busy,
    started=1,
    kept=kept & finite,
    finite=finite,
    loss=loss,
    keep=keep,
    worker_params=s.worker_params,
    worker_state=s.worker_state,
  )


def _local_round(strategy, loss_fn, data, time_model, schedule, metric_names, s: RoundState):
  """``local_steps`` vmapped local steps, then the outer step on ``theta - mean_k x_k``."""
  k_workers = strategy.num_workers
  workers = jnp.arange(k_workers, dtype=jnp.int32)
  worker_rule = strategy.worker_rule

  def local_step(carry, _):
    xs, states, steps, busy = carry
    durations = time_model.sample_compute(s.key, workers, steps)
    batches = jax.vmap(data.batch)(workers, steps)
    losses, grads = jax.vmap(jax.value_and_grad(loss_fn))(xs, batches)
    updates, states = jax.vmap(worker_rule.update)(grads, states, xs)
    xs = jax.vmap(optax.apply_updates)(xs, updates)
    return (xs, states, steps + 1, busy + durations), jnp.mean(losses)

  carry = (s.worker_params, s.worker_state, s.steps, jnp.zeros([k_workers], jnp.float32))
  (xs, states, _, busy), losses = jax.lax.scan(local_step, carry, None, length=strategy.local_steps)
  mean_model = jax.tree.map(lambda x: jnp.mean(x, axis=0), xs)
  pseudo_grads = jax.tree.map(lambda p, m: (p - m).astype(p.dtype), s.params, mean_model)
  finite = guard.tree_all_finite(pseudo_grads)
  updates, rule_state = strategy.server_rule.update(pseudo_grads, s.rule_state, s.params, grads_finite=finite)
  params = optax.apply_updates(s.params, updates)
  xs = stack_workers(params, k_workers)
  end = s.clock + jnp.max(busy) + communication_time(strategy, time_model, k_workers)
  return _finish_round(
    strategy,
    schedule,
    metric_names,
    s,
    params=params,
    rule_state=rule_state,
    end=end,
    busy=busy,
    started=strategy.local_steps,
    kept=jnp.full([k_workers], finite),
    finite=finite,
    loss=jnp.mean(losses),
    keep=k_workers,
    worker_params=xs,
    worker_state=states,
  )


def _finish_round(
  strategy,
  schedule,
  metric_names,
  s: RoundState,
  *,
  params,
  rule_state,
  end,
  busy,
  started,
  kept,
  finite,
  loss,
  keep,
  worker_params,
  worker_state,
) -> tuple[RoundState, EventRecord]:
  version = s.version + finite.astype(jnp.int32)
  inter, intra = messages_per_round(strategy, keep)
  evaluated, metrics, next_eval = schedule.maybe_evaluate(s.next_eval, params, version, end, metric_names)
  new = RoundState(
    clock=end,
    idle=s.idle + (end - s.clock - busy),
    steps=s.steps + started,
    used=s.used + kept.astype(jnp.int32) * started,
    params=params,
    rule_state=rule_state,
    version=version,
    worker_params=worker_params,
    worker_state=worker_state,
    inter_messages=s.inter_messages + inter,
    intra_messages=s.intra_messages + intra,
    next_eval=next_eval,
    event=s.event + 1,
    key=s.key,
  )
  record = EventRecord(
    time=end,
    worker=jnp.asarray(-1, jnp.int32),
    staleness=jnp.asarray(0, jnp.int32),
    version=version,
    released=finite,
    k=jnp.where(finite, keep, 0).astype(jnp.int32),
    loss=jnp.asarray(loss, jnp.float32),
    rejected=~finite,
    step_size=jnp.asarray(jnp.nan, jnp.float32),
    evaluated=evaluated,
    metrics=metrics,
  )
  return new, record
