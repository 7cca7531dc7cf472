"""The asynchronous engine: one compiled step per arrival at the server.

Each step takes the earliest finisher ``k``, computes its one gradient on the
parameters it pulled, runs the worker rule, the server rule and the dispatch
policy, and schedules the next finish of every worker that gets parameters.
Parameters a worker pulled live in a ring of ``K + 1`` snapshots (``K``
workers hold at most ``K`` distinct versions, so one slot is always free):
sending a version to many workers writes it once and moves ``K`` pointers.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.rules import guard
from jaxsync._src.rules.look_ahead import look_ahead
from jaxsync._src.sim.time_model import TimeModel
from jaxsync._src.steps.arrival import dispatch, reply_parameters, server_arrival, worker_message
from jaxsync._src.steps.records import EvalSchedule, EventRecord, stack_workers
from jaxsync._src.strategies.registry import Strategy


class EventState(NamedTuple):
  """The whole state of an asynchronous simulation (checkpoint it to resume).

  Attributes:
    clock: simulated seconds of the last event (events are recorded in
      nondecreasing time).
    finish: when each worker finishes its current gradient (``inf`` while it
      waits for parameters).
    idle_since: when each worker last finished a gradient.
    idle: seconds each worker spent not computing.
    steps: gradients each worker computed (SSP's clocks).
    used: gradients of each worker the server accepted.
    params: the server parameters (the centre, for elastic strategies).
    rule_state: the server rule's state.
    version: server updates so far.
    pending: accepted arrivals since the last update.
    snapshots: ``[K+1, ...]`` parameter versions the workers pulled.
    snapshot_of: the snapshot slot of each worker.
    pulled_version: the version of the parameters each worker pulled.
    noise_ratio: the noise ratio each worker received with its parameters.
    worker_params: ``[K, ...]`` the workers' own models (elastic), else ``()``.
    worker_state: ``[K, ...]`` the worker rule's states, else ``()``.
    waiting: workers in the server's waiting set ``C``.
    node_count: gradients per node since the last pull (InHAD).
    nic_in: when the server's receive queue is next free.
    nic_out: when the server's send queue is next free.
    inter_messages: full-size messages over the inter-machine link.
    intra_messages: full-size messages inside a node or an EA-wild group.
    next_eval: the next evaluation point (updates or seconds).
    event: events simulated.
    key: the compute-time jitter seed, ``uint32[2]``.
  """

  clock: jax.Array
  finish: jax.Array
  idle_since: jax.Array
  idle: jax.Array
  steps: jax.Array
  used: jax.Array
  params: Any
  rule_state: Any
  version: jax.Array
  pending: jax.Array
  snapshots: Any
  snapshot_of: jax.Array
  pulled_version: jax.Array
  noise_ratio: jax.Array
  worker_params: Any
  worker_state: Any
  waiting: jax.Array
  node_count: jax.Array
  nic_in: jax.Array
  nic_out: jax.Array
  inter_messages: jax.Array
  intra_messages: jax.Array
  next_eval: jax.Array
  event: jax.Array
  key: jax.Array


def _row(tree: Any, i: jax.Array) -> Any:
  return jax.tree.map(lambda x: x[i], tree)


def _set_row(tree: Any, i: jax.Array, row: Any) -> Any:
  return jax.tree.map(lambda x, r: x.at[i].set(r), tree, row)


def num_units(strategy: Strategy) -> int:
  """Workers as the engine schedules them: EA-wild groups act as one worker each."""
  if strategy.protocol == "elastic":
    return strategy.num_workers // strategy.group_size
  return strategy.num_workers


def _compute_times(strategy: Strategy, time_model: TimeModel, key, units, steps) -> jax.Array:
  """Next compute times of ``units``; a group takes its slowest member plus its all-reduce (spec §13)."""
  g = strategy.group_size
  if strategy.protocol != "elastic" or g == 1:
    return time_model.sample_compute(key, units, steps)
  members = (units[:, None] * g + jnp.arange(g, dtype=jnp.int32)).reshape(-1)
  times = time_model.sample_compute(key, members, jnp.repeat(steps, g)).reshape(-1, g)
  return jnp.max(times, axis=1) + time_model.ring_allreduce_time(g, over=time_model.intra_link)


def _batch(strategy: Strategy, data: WorkerData, unit, step):
  """A unit's batch: a group's is its members' batches, concatenated (their mean gradient)."""
  g = strategy.group_size
  if strategy.protocol != "elastic" or g == 1:
    return data.batch(unit, step)
  parts = [data.batch(unit * g + i, step) for i in range(g)]
  return jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)


def _uses_snapshots(strategy: Strategy) -> bool:
  # Locked EASGD reads the current centre at its exchange; nothing is pulled ahead.
  return strategy.protocol == "gradient" or strategy.lock_free


def init(
  strategy: Strategy, params: Any, time_model: TimeModel, schedule: EvalSchedule, key: jax.Array
) -> EventState:
  """The state at time 0: every worker has pulled ``params`` (version 0) and starts."""
  k_workers = num_units(strategy)
  workers = jnp.arange(k_workers, dtype=jnp.int32)
  steps = jnp.zeros([k_workers], jnp.int32)
  worker_state = ()
  if strategy.worker_rule is not None:
    worker_state = stack_workers(strategy.worker_rule.init(params), k_workers)
  groups = strategy.num_workers // strategy.group_size
  zero = jnp.zeros([], jnp.float32)
  return EventState(
    clock=jnp.zeros([], jnp.float32),
    finish=_compute_times(strategy, time_model, key, workers, steps),
    idle_since=jnp.zeros([k_workers], jnp.float32),
    idle=jnp.zeros([k_workers], jnp.float32),
    steps=steps,
    used=jnp.zeros([k_workers], jnp.int32),
    params=params,
    rule_state=strategy.server_rule.init(params),
    version=jnp.zeros([], jnp.int32),
    pending=jnp.zeros([], jnp.int32),
    snapshots=stack_workers(params, k_workers + 1) if _uses_snapshots(strategy) else (),
    snapshot_of=jnp.zeros([k_workers], jnp.int32),
    pulled_version=jnp.zeros([k_workers], jnp.int32),
    noise_ratio=jnp.zeros([k_workers], jnp.float32),
    worker_params=stack_workers(params, k_workers) if strategy.protocol == "elastic" else (),
    worker_state=worker_state,
    waiting=jnp.zeros([k_workers], jnp.bool_),
    node_count=jnp.zeros([groups], jnp.int32),
    nic_in=zero,
    nic_out=zero,
    inter_messages=jnp.zeros([], jnp.int32),
    intra_messages=jnp.zeros([], jnp.int32),
    next_eval=schedule.first_due(),
    event=jnp.zeros([], jnp.int32),
    key=key,
  )


def _elapsed(strategy, time_model, s: EventState, t, communicates, released, n_send):
  """(server_time, receive_time, nic_in, nic_out, inter, intra) of one arrival."""
  comm = strategy.communication
  if comm == "shared_memory":
    return t, t, s.nic_in, s.nic_out, s.inter_messages, s.intra_messages
  n_over = time_model.transfer_time()
  latency = time_model.link.latency
  if comm == "node_local":
    intra = time_model.intra_link.latency + time_model.intra_link.transfer(float(time_model.message_bytes))
    at_node = t + intra
    # On a pull (spec §15) the server collects every active node's sum, applies,
    # and broadcasts to all nodes; the nodes hand the new parameters down.
    nodes = strategy.num_workers // strategy.group_size
    active = jnp.sum(s.node_count > 0).astype(jnp.float32)
    pull_start = jnp.maximum(s.nic_in, at_node + latency)
    nic_in = jnp.where(released, pull_start + active * n_over + time_model.apply_time, s.nic_in)
    out_start = jnp.maximum(s.nic_out, nic_in)
    nic_out = jnp.where(released, out_start + nodes * n_over, s.nic_out)
    server_time = jnp.where(released, nic_in, at_node)
    receive = jnp.where(released, nic_out + latency + intra, at_node + intra)
    inter = s.inter_messages + jnp.where(released, active.astype(jnp.int32) + nodes, 0)
    return server_time, receive, nic_in, nic_out, inter, s.intra_messages + 1 + n_send
  # A parameter server: pushes queue on its receive side, replies on its send side.
  locked = not (strategy.protocol == "elastic" and strategy.lock_free)
  in_done = jnp.maximum(s.nic_in, t + latency) + n_over
  server_time = in_done + time_model.apply_time
  nic_in = server_time if locked else in_done
  nic_out = jnp.maximum(s.nic_out, server_time) + n_send.astype(jnp.float32) * n_over
  receive = nic_out + latency
  inter = s.inter_messages + 1 + n_send
  return (
    jnp.where(communicates, server_time, t),
    jnp.where(communicates, receive, t),
    jnp.where(communicates, nic_in, s.nic_in),
    jnp.where(communicates, nic_out, s.nic_out),
    jnp.where(communicates, inter, s.inter_messages),
    s.intra_messages,
  )


def next_event_time(s: EventState) -> jax.Array:
  """When the next arrival's worker finishes computing."""
  return jnp.min(s.finish)


def step(
  strategy: Strategy,
  loss_fn,
  data: WorkerData,
  time_model: TimeModel,
  schedule: EvalSchedule,
  metric_names: tuple[str, ...],
  s: EventState,
) -> tuple[EventState, EventRecord]:
  """One arrival: the earliest finisher's gradient goes through the strategy."""
  k_workers = num_units(strategy)
  k = jnp.argmin(s.finish).astype(jnp.int32)
  t = s.finish[k]
  batch = _batch(strategy, data, k, s.steps[k])
  elastic = strategy.protocol == "elastic"

  if _uses_snapshots(strategy):
    # The barrier materializes the read before the ring is written in place
    # below; a read fused past the write makes XLA copy the whole ring.
    pulled = jax.lax.optimization_barrier(_row(s.snapshots, s.snapshot_of[k]))
  if elastic:
    x = _row(s.worker_params, k)
    center_read = pulled if strategy.lock_free else s.params
  else:
    x = pulled
  worker_state = _row(s.worker_state, k) if strategy.worker_rule is not None else None

  step_size = jnp.asarray(jnp.nan, jnp.float32)
  worker_states = s.worker_state
  worker_params = s.worker_params
  staleness = s.version - s.pulled_version[k]
  if elastic:
    loss, grads = jax.value_and_grad(loss_fn)(look_ahead(x, worker_state), batch)
    finite = guard.tree_all_finite(grads)
    local, new_ws = strategy.worker_rule.update(
      grads, worker_state, x, center=center_read, grads_finite=finite
    )
    worker_params = _set_row(worker_params, k, optax.apply_updates(x, local))
    worker_states = _set_row(worker_states, k, new_ws)
    communicates = new_ws.exchanged
    # The centre takes the worker's pre-exchange model (spec §12, §13).
    center_update, new_rule_state = strategy.server_rule.update(
      x, s.rule_state, s.params, center_read=center_read if strategy.lock_free else None
    )
    center_update = guard.keep_if(communicates, center_update, optax.tree.zeros_like(center_update))
    new_rule_state = guard.keep_if(communicates, new_rule_state, s.rule_state)
    params = optax.apply_updates(s.params, center_update)
    released = communicates
    k_used = released.astype(jnp.int32)  # one worker model per exchange
    pending = jnp.where(released, 0, s.pending + finite.astype(jnp.int32))
  else:
    sent = worker_message(strategy, loss_fn, x, worker_state, batch, s.noise_ratio[k])
    loss, finite, step_size = sent.loss, sent.finite, sent.step_size
    if strategy.worker_rule is not None:
      worker_states = _set_row(worker_states, k, sent.worker_state)
    arrived = server_arrival(
      strategy,
      s.params,
      s.rule_state,
      sent.message,
      version=s.pulled_version[k],
      pending=s.pending,
      num_live_workers=k_workers,
      finite=finite,
    )
    params, new_rule_state, released = arrived.params, arrived.rule_state, arrived.released
    k_used, pending = arrived.k_used, arrived.pending
    communicates = jnp.asarray(True)

  rejected = ~finite
  version = s.version + released.astype(jnp.int32)
  steps = s.steps.at[k].add(1)
  used = s.used.at[k].add(finite.astype(jnp.int32))
  fresh = s.pulled_version[k] == s.version

  if elastic:
    send = (jnp.arange(k_workers) == k) & communicates
    waiting = s.waiting
  else:
    send, waiting = dispatch(strategy, s.waiting, k, steps, released, fresh, rejected)
  n_send = jnp.sum(send).astype(jnp.int32)
  node = k // strategy.group_size
  node_count = s.node_count.at[node].add(finite.astype(jnp.int32))
  server_time, receive, nic_in, nic_out, inter, intra = _elapsed(
    strategy, time_model, s._replace(node_count=node_count), t, communicates, released, n_send
  )
  node_count = jnp.where(released, 0, node_count)

  # Replies: the current parameters (SMEGA2's look-ahead estimate), written once.
  snapshots, snapshot_of = s.snapshots, s.snapshot_of
  if _uses_snapshots(strategy):
    reply = params if elastic else reply_parameters(params, new_rule_state)
    kept = jnp.where(send, -1, s.snapshot_of)
    in_use = jnp.any(kept[None, :] == jnp.arange(k_workers + 1)[:, None], axis=1)
    slot = jnp.argmin(in_use).astype(jnp.int32)  # the first free slot
    snapshots = _set_row(s.snapshots, slot, reply)
    snapshot_of = jnp.where(send, slot, s.snapshot_of)
  pulled_version = jnp.where(send, version, s.pulled_version)
  noise = optax.tree.get(new_rule_state, "noise_ratio", None)
  noise_ratio = s.noise_ratio if noise is None else jnp.where(send, noise, s.noise_ratio)

  # Next finish times; elastic workers continue locally without waiting.
  idle_since = s.idle_since.at[k].set(t)
  if strategy.dispatch == "immediate" or elastic:
    duration = _compute_times(strategy, time_model, s.key, k[None], steps[k][None])[0]
    start = receive
    finish = s.finish.at[k].set(start + duration)
    idle = s.idle.at[k].add(start - t)
  else:
    durations = _compute_times(strategy, time_model, s.key, jnp.arange(k_workers, dtype=jnp.int32), steps)
    finish = jnp.where(send, receive + durations, s.finish)
    finish = finish.at[k].set(jnp.where(send[k], finish[k], jnp.inf))
    idle = s.idle + jnp.where(send, receive - idle_since, 0.0)

  # Events are taken in finish order; an exchange that queued at the server
  # ends later than a following local step, so the clock is the running max.
  clock = jnp.maximum(s.clock, server_time)
  evaluated, metrics, next_eval = schedule.maybe_evaluate(s.next_eval, params, version, clock, metric_names)
  if elastic and strategy.group_size > 1:
    intra = intra + 2 * (strategy.group_size - 1)  # the group's all-reduce of its gradient
  new = EventState(
    clock=clock,
    finish=finish,
    idle_since=idle_since,
    idle=idle,
    steps=steps,
    used=used,
    params=params,
    rule_state=new_rule_state,
    version=version,
    pending=pending,
    snapshots=snapshots,
    snapshot_of=snapshot_of,
    pulled_version=pulled_version,
    noise_ratio=noise_ratio,
    worker_params=worker_params,
    worker_state=worker_states,
    waiting=waiting,
    node_count=node_count,
    nic_in=nic_in,
    nic_out=nic_out,
    inter_messages=inter,
    intra_messages=intra,
    next_eval=next_eval,
    event=s.event + 1,
    key=s.key,
  )
  record = EventRecord(
    time=clock,
    worker=k,
    staleness=staleness,
    version=version,
    released=released,
    k=jnp.asarray(k_used, jnp.int32),
    loss=jnp.asarray(loss, jnp.float32),
    rejected=rejected,
    step_size=step_size,
    evaluated=evaluated,
    metrics=metrics,
  )
  return new, record
