"""The asynchronous engine: one compiled step per arrival at the server, gradients computed in batches.

Each step takes the earliest finisher ``k``, takes its gradient on the
parameters it pulled, runs the worker rule, the server rule and the dispatch
policy, and schedules the next finish of every worker that gets parameters.
Parameters a worker pulled live in a ring of ``K + 1`` snapshots (``K``
workers hold at most ``K`` distinct versions, so one slot is always free):
sending a version to many workers writes it once and moves ``K`` pointers.

A worker's gradient depends only on what it pulled (or its own model, for the
elastic strategies), its rule's look-ahead and its batch; only the server's
application of arrivals is sequential. So the gradients of in-flight workers
are computed ahead of their arrivals, up to ``B`` at a time in one ``vmap``
call (:func:`prepare`), into a cache of ``B`` gradients; arrivals then take
theirs from the cache (:func:`step`) until one finds none, and the next batch
is computed. Memory: the ``K + 1`` snapshots plus ``B`` gradients.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.rules import contracts
from jaxsync._src.sim.time_model import TimeModel
from jaxsync._src.steps.arrival import (
  WorkerGradient,
  dispatch,
  elastic_center_arrival,
  elastic_worker_step,
  gradient_point,
  server_arrival,
  unit_batch,
  worker_gradient,
  worker_message,
)
from jaxsync._src.steps.records import EvalSchedule, EventRecord, stack_workers
from jaxsync._src.strategies.strategy import Communication, Dispatch, Strategy, WorkerProtocol


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
    gradient_of: the cache slot of each worker's gradient computed ahead of
      its arrival, ``-1`` when not computed; ``()`` when ``B = 1`` (each
      gradient is computed at its arrival).
    gradients: ``[B, ...]`` the gradient cache (:class:`WorkerGradient` rows),
      else ``()``.
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
  gradient_of: Any
  gradients: Any


def _row(tree: Any, i: jax.Array) -> Any:
  return jax.tree.map(lambda x: x[i], tree)


def _set_row(tree: Any, i: jax.Array, row: Any) -> Any:
  return jax.tree.map(lambda x, r: x.at[i].set(r), tree, row)


def _compute_times(strategy: Strategy, time_model: TimeModel, key, units, steps) -> jax.Array:
  """Next compute times of ``units``; a group takes its slowest member plus its all-reduce (docs/algorithms.md §13)."""
  g = strategy.workers_per_unit
  if g == 1:
    return time_model.sample_compute(key, units, steps)
  members = (units[:, None] * g + jnp.arange(g, dtype=jnp.int32)).reshape(-1)
  times = time_model.sample_compute(key, members, jnp.repeat(steps, g)).reshape(-1, g)
  return jnp.max(times, axis=1) + time_model.ring_allreduce_time(g, over=time_model.intra_link)


def _uses_snapshots(strategy: Strategy) -> bool:
  # Locked EASGD reads the current centre at its exchange; nothing is pulled ahead.
  return strategy.protocol == WorkerProtocol.GRADIENT or strategy.lock_free


def init(
  strategy: Strategy,
  params: Any,
  time_model: TimeModel,
  schedule: EvalSchedule,
  key: jax.Array,
  gradient_batch: int | None = None,
) -> EventState:
  """The state at time 0: every worker has pulled ``params`` (version 0) and starts.

  ``gradient_batch`` is ``B``, the gradients computed together ahead of their
  arrivals and kept; with 1 (the default) each arrival computes its own.
  """
  num_workers = strategy.num_units
  workers = jnp.arange(num_workers, dtype=jnp.int32)
  steps = jnp.zeros([num_workers], jnp.int32)
  worker_state = ()
  if strategy.worker_rule is not None:
    worker_state = stack_workers(strategy.worker_rule.init(params), num_workers)
  nodes = strategy.num_workers // strategy.node_size
  zero = jnp.zeros([], jnp.float32)
  state = EventState(
    clock=jnp.zeros([], jnp.float32),
    finish=_compute_times(strategy, time_model, key, workers, steps),
    idle_since=jnp.zeros([num_workers], jnp.float32),
    idle=jnp.zeros([num_workers], jnp.float32),
    steps=steps,
    used=jnp.zeros([num_workers], jnp.int32),
    params=params,
    rule_state=strategy.server_rule.init(params),
    version=jnp.zeros([], jnp.int32),
    pending=jnp.zeros([], jnp.int32),
    snapshots=stack_workers(params, num_workers + 1) if _uses_snapshots(strategy) else (),
    snapshot_of=jnp.zeros([num_workers], jnp.int32),
    pulled_version=jnp.zeros([num_workers], jnp.int32),
    noise_ratio=jnp.zeros([num_workers], jnp.float32),
    worker_params=stack_workers(params, num_workers) if strategy.protocol == WorkerProtocol.ELASTIC else (),
    worker_state=worker_state,
    waiting=jnp.zeros([num_workers], jnp.bool_),
    node_count=jnp.zeros([nodes], jnp.int32),
    nic_in=zero,
    nic_out=zero,
    inter_messages=jnp.zeros([], jnp.int32),
    intra_messages=jnp.zeros([], jnp.int32),
    next_eval=schedule.first_due(),
    event=jnp.zeros([], jnp.int32),
    key=key,
    gradient_of=(),
    gradients=(),
  )
  return empty_gradients(state, 1 if gradient_batch is None else gradient_batch)


def drop_gradients(s: EventState) -> EventState:
  """``s`` without the gradients computed ahead: what a checkpoint keeps (they are computed again, bit for bit)."""
  return s._replace(gradient_of=(), gradients=())


def empty_gradients(s: EventState, gradient_batch: int) -> EventState:
  """``s`` with room for ``gradient_batch`` gradients computed ahead and none computed (``1``: no room kept)."""
  if gradient_batch <= 1:
    return drop_gradients(s)
  size = min(gradient_batch, s.finish.shape[0])
  return s._replace(
    gradient_of=jnp.full(s.finish.shape, -1, jnp.int32),
    gradients=WorkerGradient(
      loss=jnp.zeros([size], jnp.float32),
      grads=jax.tree.map(lambda x: jnp.zeros((size, *jnp.shape(x)), jnp.result_type(x)), s.params),
      finite=jnp.zeros([size], jnp.bool_),
    ),
  )


class Exchange(NamedTuple):
  """What one arrival costs on the network (the time model's queues, see ``TimeModel``).

  Attributes:
    server_time: when the server finished with the arrival (the event's time).
    receive_time: when the worker that gets a reply has it.
    nic_in: when the server's receive side is next free.
    nic_out: when the server's send side is next free.
    inter_messages: full-size messages over the inter-machine link so far.
    intra_messages: full-size messages inside nodes or groups so far.
  """

  server_time: jax.Array
  receive_time: jax.Array
  nic_in: jax.Array
  nic_out: jax.Array
  inter_messages: jax.Array
  intra_messages: jax.Array


def _exchange(strategy, time_model, s: EventState, t, communicates, released, n_send) -> Exchange:
  """The network cost of an arrival at time ``t`` that sends ``n_send`` replies."""
  comm = strategy.communication
  traffic = strategy.server_traffic
  accumulate = time_model.memory_time(traffic.arrival)  # the arrival into a buffer, if the rule buffers
  update = time_model.memory_time(traffic.release)  # the update it releases
  if comm == Communication.SHARED_MEMORY:
    # Hogwild!: no network and no lock; the worker applies its own update to the shared parameters.
    done = t + jnp.where(released, update, 0.0)
    return Exchange(done, done, s.nic_in, s.nic_out, s.inter_messages, s.intra_messages)
  n_over = time_model.transfer_time()
  latency = time_model.link.latency
  apply = time_model.apply_time + jnp.where(released, update, 0.0)
  if comm == Communication.NODE_LOCAL:
    intra = time_model.intra_link.latency + time_model.intra_link.transfer(float(time_model.message_bytes))
    at_node = t + intra + accumulate  # summed into the node's buffer
    # On a pull (docs/algorithms.md §15) the server collects every active node's sum, applies,
    # and broadcasts to all nodes; the nodes hand the new parameters down.
    nodes = strategy.num_workers // strategy.node_size
    active = jnp.sum(s.node_count > 0).astype(jnp.float32)
    pull_start = jnp.maximum(s.nic_in, at_node + latency)
    nic_in = jnp.where(released, pull_start + active * n_over + apply, s.nic_in)
    out_start = jnp.maximum(s.nic_out, nic_in)
    nic_out = jnp.where(released, out_start + nodes * n_over, s.nic_out)
    return Exchange(
      server_time=jnp.where(released, nic_in, at_node),
      receive_time=jnp.where(released, nic_out + latency + intra, at_node + intra),
      nic_in=nic_in,
      nic_out=nic_out,
      inter_messages=s.inter_messages + jnp.where(released, active.astype(jnp.int32) + nodes, 0),
      intra_messages=s.intra_messages + 1 + n_send,
    )
  # A parameter server: pushes queue on its receive side, replies on its send side.
  locked = not (strategy.protocol == WorkerProtocol.ELASTIC and strategy.lock_free)
  in_done = jnp.maximum(s.nic_in, t + latency) + n_over
  server_time = in_done + apply + accumulate
  nic_out = jnp.maximum(s.nic_out, server_time) + n_send.astype(jnp.float32) * n_over
  return Exchange(
    server_time=jnp.where(communicates, server_time, t),
    receive_time=jnp.where(communicates, nic_out + latency, t),
    nic_in=jnp.where(communicates, server_time if locked else in_done, s.nic_in),
    nic_out=jnp.where(communicates, nic_out, s.nic_out),
    inter_messages=jnp.where(communicates, s.inter_messages + 1 + n_send, s.inter_messages),
    intra_messages=s.intra_messages,
  )


def next_event_time(s: EventState) -> jax.Array:
  """When the next arrival's worker finishes computing."""
  return jnp.min(s.finish)


class Arrival(NamedTuple):
  """One arrival through a strategy's protocol (its worker side and its server side).

  Attributes:
    loss: the batch loss of the arriving worker's gradient.
    finite: the gradient (and message) had no NaN/Inf.
    step_size: the sender's adaptive learning rate (BB), else NaN.
    params: the server parameters (the elastic centre) after the arrival.
    rule_state: the server rule's new state.
    released: the parameters changed.
    k_used: gradients (or worker models) combined in the update.
    pending: accepted arrivals since the last update.
    worker_params: the workers' own models (elastic), else ``()``.
    worker_state: the workers' rule states, else ``()``.
    communicates: the arrival went over the network (an elastic worker's
      local step between exchanges does not).
  """

  loss: jax.Array
  finite: jax.Array
  step_size: jax.Array
  params: Any
  rule_state: Any
  released: jax.Array
  k_used: jax.Array
  pending: jax.Array
  worker_params: Any
  worker_state: Any
  communicates: jax.Array


def _gradient_arrival(
  strategy, loss_fn, s: EventState, worker, batch, pulled, gradient, num_workers
) -> Arrival:
  """The ``"gradient"`` protocol: the worker's message on the parameters it pulled, then the server rule."""
  worker_state = _row(s.worker_state, worker) if strategy.worker_rule is not None else None
  sent = worker_message(
    strategy, loss_fn, pulled, worker_state, batch, s.noise_ratio[worker], gradient=gradient
  )
  worker_states = s.worker_state
  if strategy.worker_rule is not None:
    worker_states = _set_row(worker_states, worker, sent.worker_state)
  arrived = server_arrival(
    strategy,
    s.params,
    s.rule_state,
    sent.message,
    version=s.pulled_version[worker],
    pending=s.pending,
    num_live_workers=num_workers,
    finite=sent.finite,
  )
  return Arrival(
    loss=sent.loss,
    finite=sent.finite,
    step_size=sent.step_size,
    params=arrived.params,
    rule_state=arrived.rule_state,
    released=arrived.released,
    k_used=arrived.k_used,
    pending=arrived.pending,
    worker_params=s.worker_params,
    worker_state=worker_states,
    communicates=jnp.asarray(True),
  )


def _elastic_arrival(strategy, loss_fn, s: EventState, worker, batch, pulled, gradient) -> Arrival:
  """The ``"elastic"`` protocol: a local step against the centre read; on exchange steps the centre moves."""
  x = _row(s.worker_params, worker)
  center_read = pulled if strategy.lock_free else s.params
  stepped = elastic_worker_step(
    strategy, loss_fn, x, _row(s.worker_state, worker), batch, center_read, gradient=gradient
  )
  # The centre takes the worker's pre-exchange model (docs/algorithms.md §12, §13).
  params, rule_state = elastic_center_arrival(
    strategy, s.params, s.rule_state, stepped.sent, exchanged=stepped.exchanged, center_read=center_read
  )
  released = stepped.exchanged
  return Arrival(
    loss=stepped.loss,
    finite=stepped.finite,
    step_size=jnp.asarray(jnp.nan, jnp.float32),
    params=params,
    rule_state=rule_state,
    released=released,
    k_used=released.astype(jnp.int32),  # one worker model per exchange
    pending=jnp.where(released, 0, s.pending + stepped.finite.astype(jnp.int32)),
    worker_params=_set_row(s.worker_params, worker, stepped.model),
    worker_state=_set_row(s.worker_state, worker, stepped.worker_state),
    communicates=released,
  )


def _pulled_point(strategy: Strategy, s: EventState, worker) -> Any:
  """Where ``worker`` takes its next gradient: its rule's look-ahead of what it pulled (or of its own model)."""
  worker_state = _row(s.worker_state, worker) if strategy.worker_rule is not None else None
  if strategy.protocol == WorkerProtocol.ELASTIC:
    x = _row(s.worker_params, worker)
  else:
    x = _row(s.snapshots, s.snapshot_of[worker])
  return gradient_point(x, worker_state)


def _batched(s: EventState) -> bool:
  return isinstance(s.gradients, WorkerGradient)


def ready(s: EventState) -> jax.Array:
  """Whether the next arrival's gradient is at hand (else :func:`prepare` must run first)."""
  if not _batched(s):
    return jnp.asarray(True)
  return s.gradient_of[jnp.argmin(s.finish)] >= 0


def prepare(strategy: Strategy, loss_fn, data: WorkerData, s: EventState) -> EventState:
  """Computes ahead, in one batched call, the gradients of the next ``B`` arrivals whose pulls are known.

  A worker's pull is known once it has parameters (its finish time is finite)
  and it does not change until it arrives: replies go only to the sender and
  to waiting workers, and a worker's model, rule state and step count change
  only at its own arrival. The ``B`` earliest finishers with known pulls get
  their gradients (``jax.vmap`` of :func:`worker_gradient` over their points
  and batches), slot ``j`` of the cache the ``j``-th earliest's.

  The batch replaces the whole cache: a gradient still cached from the last
  batch is computed again (bit for bit the same, it depends only on the
  pull), which costs the share of the batch that was ready (a few percent in
  steady ASP: the batch runs when the next arrival finds none) and saves
  reading and selecting the old cache; in memory-bound runs (``K`` snapshots
  out of the CPU's caches) that select cost more than the recomputation.
  """
  if not _batched(s):
    return s
  num_workers = s.finish.shape[0]
  size = s.gradients.loss.shape[0]
  known = jnp.isfinite(s.finish)
  order = jnp.argsort(jnp.where(known, s.finish, jnp.inf), stable=True).astype(jnp.int32)
  batch_workers = order[:size]
  kept = known[batch_workers]

  def one(worker):
    batch = unit_batch(strategy, data, worker, s.steps[worker])
    return worker_gradient(loss_fn, _pulled_point(strategy, s, worker), batch)

  gradients = jax.vmap(one)(batch_workers)
  slots = jnp.arange(size, dtype=jnp.int32)
  gradient_of = (
    jnp.full([num_workers], -1, jnp.int32)
    .at[jnp.where(kept, batch_workers, num_workers)]
    .set(slots, mode="drop")
  )
  return s._replace(gradient_of=gradient_of, gradients=gradients)


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
  num_workers = strategy.num_units
  worker = jnp.argmin(s.finish).astype(jnp.int32)
  t = s.finish[worker]
  batch = unit_batch(strategy, data, worker, s.steps[worker])
  elastic = strategy.protocol == WorkerProtocol.ELASTIC

  pulled = None
  if _uses_snapshots(strategy):
    # The barrier materializes the read before the ring is written in place
    # below; a read fused past the write makes XLA copy the whole ring.
    pulled = jax.lax.optimization_barrier(_row(s.snapshots, s.snapshot_of[worker]))
  # Computed ahead by prepare() (the caller runs it first when the slot is -1), or here.
  gradient = _row(s.gradients, s.gradient_of[worker]) if _batched(s) else None
  if elastic:
    a = _elastic_arrival(strategy, loss_fn, s, worker, batch, pulled, gradient)
  else:
    a = _gradient_arrival(strategy, loss_fn, s, worker, batch, pulled, gradient, num_workers)

  rejected = ~a.finite
  version = s.version + a.released.astype(jnp.int32)
  steps = s.steps.at[worker].add(1)
  fresh = s.pulled_version[worker] == s.version
  if elastic:
    send = (jnp.arange(num_workers) == worker) & a.communicates
    waiting = s.waiting
  else:
    send, waiting = dispatch(strategy, s.waiting, worker, steps, a.released, fresh, rejected)
  n_send = jnp.sum(send).astype(jnp.int32)
  node_count = s.node_count.at[worker // strategy.node_size].add(a.finite.astype(jnp.int32))
  cost = _exchange(
    strategy, time_model, s._replace(node_count=node_count), t, a.communicates, a.released, n_send
  )
  node_count = jnp.where(a.released, 0, node_count)

  # Replies: the current parameters (SMEGA2's look-ahead estimate), written once.
  snapshots, snapshot_of = s.snapshots, s.snapshot_of
  if _uses_snapshots(strategy):
    reply = a.params if elastic else contracts.reply_params(a.params, a.rule_state)
    kept = jnp.where(send, -1, s.snapshot_of)
    in_use = jnp.any(kept[None, :] == jnp.arange(num_workers + 1)[:, None], axis=1)
    slot = jnp.argmin(in_use).astype(jnp.int32)  # the first free slot
    snapshots = _set_row(s.snapshots, slot, reply)
    snapshot_of = jnp.where(send, slot, s.snapshot_of)
  noise = contracts.noise_ratio(a.rule_state)

  # Next finish times; elastic workers continue locally without waiting.
  idle_since = s.idle_since.at[worker].set(t)
  if strategy.dispatch == Dispatch.IMMEDIATE or elastic:
    duration = _compute_times(strategy, time_model, s.key, worker[None], steps[worker][None])[0]
    finish = s.finish.at[worker].set(cost.receive_time + duration)
    idle = s.idle.at[worker].add(cost.receive_time - t)
  else:
    everyone = jnp.arange(num_workers, dtype=jnp.int32)
    durations = _compute_times(strategy, time_model, s.key, everyone, steps)
    finish = jnp.where(send, cost.receive_time + durations, s.finish)
    finish = finish.at[worker].set(jnp.where(send[worker], finish[worker], jnp.inf))
    idle = s.idle + jnp.where(send, cost.receive_time - idle_since, 0.0)

  # Events are taken in finish order; an exchange that queued at the server
  # ends later than a following local step, so the clock is the running max.
  clock = jnp.maximum(s.clock, cost.server_time)
  evaluated, metrics, next_eval = schedule.maybe_evaluate(s.next_eval, a.params, version, clock, metric_names)
  intra = cost.intra_messages
  if elastic and strategy.group_size > 1:
    intra = intra + 2 * (strategy.group_size - 1)  # the group's all-reduce of its gradient
  new = EventState(
    clock=clock,
    finish=finish,
    idle_since=idle_since,
    idle=idle,
    steps=steps,
    used=s.used.at[worker].add(a.finite.astype(jnp.int32)),
    params=a.params,
    rule_state=a.rule_state,
    version=version,
    pending=a.pending,
    snapshots=snapshots,
    snapshot_of=snapshot_of,
    pulled_version=jnp.where(send, version, s.pulled_version),
    noise_ratio=s.noise_ratio if noise is None else jnp.where(send, noise, s.noise_ratio),
    worker_params=a.worker_params,
    worker_state=a.worker_state,
    waiting=waiting,
    node_count=node_count,
    nic_in=cost.nic_in,
    nic_out=cost.nic_out,
    inter_messages=cost.inter_messages,
    intra_messages=intra,
    next_eval=next_eval,
    event=s.event + 1,
    key=s.key,
    gradient_of=s.gradient_of.at[worker].set(-1) if _batched(s) else (),
    gradients=s.gradients,
  )
  record = EventRecord(
    time=clock,
    worker=worker,
    staleness=s.version - s.pulled_version[worker],
    version=version,
    released=a.released,
    k=jnp.asarray(a.k_used, jnp.int32),
    loss=jnp.asarray(a.loss, jnp.float32),
    rejected=rejected,
    step_size=a.step_size,
    evaluated=evaluated,
    metrics=metrics,
  )
  return new, record
