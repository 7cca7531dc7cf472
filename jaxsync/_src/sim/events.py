"""The asynchronous engine: one compiled step per arrival at the server, gradients computed in batches.

Each step takes the earliest finisher ``k``, takes its gradient on the
parameters it pulled, runs the worker rule, the server rule and the dispatch
policy, asks the time model what the exchange costs (``TimeModel.exchange``:
the server's interface queues live in ``EventState.network``), and schedules
the next finish of every worker that gets parameters.
Parameters a worker pulled live in a ring of ``K + 1`` snapshots (``K``
workers hold at most ``K`` distinct versions, so one slot is always free):
sending a version to many workers writes it once and moves ``K`` pointers.

A worker's gradient depends only on what it pulled (or its own model, for the
elastic strategies), its rule's look-ahead and its batch; only the server's
application of arrivals is sequential. So the gradients of in-flight workers
are computed ahead of their arrivals, up to ``B`` at a time in one ``vmap``
call (:meth:`EventEngine.prepare`), into a cache of ``B`` gradients; arrivals
then take theirs from the cache (:meth:`EventEngine.step`) until one finds
none, and the next batch is computed. Memory: the ``K + 1`` snapshots plus
``B`` gradients.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.interface.history import RunTotals
from jaxsync._src.rules import contracts
from jaxsync._src.sim.time_model import NetworkState, TimeModel
from jaxsync._src.steps.arrival import (
  WorkerGradient,
  counts_as_fresh,
  dispatch,
  elastic_center_arrival,
  elastic_worker_step,
  gradient_point,
  local_message,
  server_arrival,
  unit_batch,
  worker_gradient,
  worker_message,
)
from jaxsync._src.steps.records import EvalSchedule, EventRecord, stack_workers
from jaxsync._src.strategies.strategy import Dispatch, Strategy, WorkerProtocol


class ServerState(NamedTuple):
  """The server: its parameters, its rule's state, and the workers waiting on it.

  Attributes:
    params: the server parameters (the centre, for elastic strategies).
    rule_state: the server rule's state.
    version: server updates so far.
    pending: accepted arrivals since the last update.
    waiting: workers in the server's waiting set ``C``.
  """

  params: Any
  rule_state: Any
  version: jax.Array
  pending: jax.Array
  waiting: jax.Array


class WorkersState(NamedTuple):
  """The workers (one row each): when they finish, what they pulled, their own models and counters.

  Attributes:
    finish: when each worker finishes its current gradient (``inf`` while it
      waits for parameters).
    idle_since: when each worker last finished a gradient.
    idle: seconds each worker spent not computing.
    steps: gradients each worker computed (SSP's clocks).
    used: gradients of each worker the server accepted.
    snapshots: ``[K+1, ...]`` parameter versions the workers pulled, else ``()``.
    snapshot_of: the snapshot slot of each worker.
    pulled_version: the version of the parameters each worker pulled.
    noise_ratio: the noise ratio each worker received with its parameters.
    params: ``[K, ...]`` the workers' own models (elastic), else ``()``.
    rule_state: ``[K, ...]`` the worker rule's states, else ``()``.
  """

  finish: jax.Array
  idle_since: jax.Array
  idle: jax.Array
  steps: jax.Array
  used: jax.Array
  snapshots: Any
  snapshot_of: jax.Array
  pulled_version: jax.Array
  noise_ratio: jax.Array
  params: Any
  rule_state: Any


class GradientCache(NamedTuple):
  """The gradients of in-flight workers, computed ahead of their arrivals (:meth:`EventEngine.prepare`).

  Attributes:
    slot_of: the cache slot of each worker's gradient, ``-1`` when not computed.
    gradients: ``[B, ...]`` the cached :class:`WorkerGradient` rows.
  """

  slot_of: jax.Array
  gradients: WorkerGradient


class EventState(NamedTuple):
  """The whole state of an asynchronous simulation (checkpoint it to resume).

  Attributes:
    clock: simulated seconds of the last event (events are recorded in
      nondecreasing time).
    server: the server's parameters, rule state and waiting set.
    workers: each worker's finish time, pull, own model and counters.
    network: the server's interface queues and the messages sent
      (:class:`jaxsync._src.sim.time_model.NetworkState`).
    cache: the gradients computed ahead of their arrivals, ``()`` when
      ``B = 1`` (each gradient is computed at its arrival) and in a checkpoint.
    next_eval: the next evaluation point (updates or seconds).
    event: events simulated.
    key: the compute-time jitter seed, ``uint32[2]``.
  """

  clock: jax.Array
  server: ServerState
  workers: WorkersState
  network: NetworkState
  cache: GradientCache | tuple
  next_eval: jax.Array
  event: jax.Array
  key: jax.Array

  @property
  def params(self) -> Any:
    """The server parameters: what every runtime's state holds as ``params``."""
    return self.server.params


def _row(tree: Any, i: jax.Array) -> Any:
  return jax.tree.map(lambda x: x[i], tree)


def _read_row(tree: Any, i: jax.Array) -> Any:
  """Row ``i`` of a per-worker array that this event then writes in place (``_set_row``), materialized.

  XLA fuses a plain ``x[i]`` into each of its consumers, so some read the whole array after the write:
  it then copies the ``[K, ...]`` array every event, twice (shifted momentum's worker momenta and
  EAMSGD's worker models ran 7-20x slower at 64 workers). An optimization barrier does not stop it on
  CPU; a conditional's result is materialized, and the predicate (always true) is one XLA cannot fold.
  """
  return jax.lax.cond(i >= 0, lambda t: _row(t, i), lambda t: _row(t, 0), tree)


def _set_row(tree: Any, i: jax.Array, row: Any) -> Any:
  return jax.tree.map(lambda x, r: x.at[i].set(r), tree, row)


def _uses_snapshots(strategy: Strategy) -> bool:
  # Locked EASGD reads the current centre at its exchange; nothing is pulled ahead.
  return strategy.protocol in (WorkerProtocol.GRADIENT, WorkerProtocol.LOCAL) or strategy.lock_free


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
  strategy, loss_fn, s: EventState, worker, batch, pulled, gradient, num_workers, sent=None
) -> Arrival:
  """The ``"gradient"`` protocol: the worker's message on the parameters it pulled, then the server rule.

  ``sent``, when given, is the message already computed (a ``"local"`` worker's pseudo-gradient).
  """
  workers, server = s.workers, s.server
  worker_state = _read_row(workers.rule_state, worker) if strategy.worker_rule is not None else None
  if sent is None:
    sent = worker_message(
      strategy, loss_fn, pulled, worker_state, batch, workers.noise_ratio[worker], gradient=gradient
    )
  worker_states = workers.rule_state
  if strategy.worker_rule is not None:
    worker_states = _set_row(worker_states, worker, sent.worker_state)
  arrived = server_arrival(
    strategy,
    server.params,
    server.rule_state,
    sent.message,
    worker=worker,
    version=workers.pulled_version[worker],
    pending=server.pending,
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
    worker_params=workers.params,
    worker_state=worker_states,
    communicates=jnp.asarray(True),
  )


def _elastic_arrival(strategy, loss_fn, s: EventState, worker, batch, pulled, gradient) -> Arrival:
  """The ``"elastic"`` protocol: a local step against the centre read; on exchange steps the centre moves."""
  workers, server = s.workers, s.server
  x = _read_row(workers.params, worker)
  center_read = pulled if strategy.lock_free else server.params
  stepped = elastic_worker_step(
    strategy, loss_fn, x, _read_row(workers.rule_state, worker), batch, center_read, gradient=gradient
  )
  # The centre takes the worker's pre-exchange model (docs/algorithms.md §12, §13).
  params, rule_state = elastic_center_arrival(
    strategy,
    server.params,
    server.rule_state,
    stepped.sent,
    exchanged=stepped.exchanged,
    center_read=center_read,
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
    pending=jnp.where(released, 0, server.pending + stepped.finite.astype(jnp.int32)),
    worker_params=_set_row(workers.params, worker, stepped.model),
    worker_state=_set_row(workers.rule_state, worker, stepped.worker_state),
    communicates=released,
  )


def _pulled_point(strategy: Strategy, workers: WorkersState, worker) -> Any:
  """Where ``worker`` takes its next gradient: its rule's look-ahead of what it pulled (or of its own model)."""
  worker_state = _row(workers.rule_state, worker) if strategy.worker_rule is not None else None
  if strategy.protocol == WorkerProtocol.ELASTIC:
    x = _row(workers.params, worker)
  else:
    x = _row(workers.snapshots, workers.snapshot_of[worker])
  return gradient_point(x, worker_state)


@dataclasses.dataclass(frozen=True)
class EventEngine:
  """The asynchronous engine: one arrival per step, gradients computed ahead ``B`` at a time.

  A :class:`jaxsync._src.sim.engine.Engine` over :class:`EventState`.

  Attributes:
    strategy: an asynchronous strategy.
    loss_fn: ``(params, batch) -> scalar``.
    time_model: the cluster's clock, with ``message_bytes`` set.
    gradient_batch: ``B``, the gradients computed together ahead of their
      arrivals and kept; ``1``: each arrival computes its own.
  """

  strategy: Strategy
  loss_fn: Callable[[Any, Any], jax.Array]
  time_model: TimeModel
  gradient_batch: int = 1

  def init(self, params: Any, schedule: EvalSchedule, key: jax.Array) -> EventState:
    """The state at time 0: every worker has pulled ``params`` (version 0) and starts."""
    strategy = self.strategy
    num_workers = strategy.num_units
    workers = jnp.arange(num_workers, dtype=jnp.int32)
    steps = jnp.zeros([num_workers], jnp.int32)
    worker_state = ()
    if strategy.worker_rule is not None:
      worker_state = stack_workers(strategy.worker_rule.init(params), num_workers)
    state = EventState(
      clock=jnp.zeros([], jnp.float32),
      server=ServerState(
        params=params,
        rule_state=contracts.init_server_rule(strategy.server_rule, params, strategy.worker_rule),
        version=jnp.zeros([], jnp.int32),
        pending=jnp.zeros([], jnp.int32),
        waiting=jnp.zeros([num_workers], jnp.bool_),
      ),
      workers=WorkersState(
        finish=self.time_model.unit_compute_times(strategy, key, workers, steps),
        idle_since=jnp.zeros([num_workers], jnp.float32),
        idle=jnp.zeros([num_workers], jnp.float32),
        steps=steps,
        used=jnp.zeros([num_workers], jnp.int32),
        snapshots=stack_workers(params, num_workers + 1) if _uses_snapshots(strategy) else (),
        snapshot_of=jnp.zeros([num_workers], jnp.int32),
        pulled_version=jnp.zeros([num_workers], jnp.int32),
        noise_ratio=jnp.zeros([num_workers], jnp.float32),
        params=stack_workers(params, num_workers) if strategy.protocol == WorkerProtocol.ELASTIC else (),
        rule_state=worker_state,
      ),
      network=self.time_model.idle_network(strategy),
      cache=(),
      next_eval=schedule.first_due(),
      event=jnp.zeros([], jnp.int32),
      key=key,
    )
    return self.restored_state(state)

  def saved_state(self, s: EventState) -> EventState:
    """``s`` without the gradients computed ahead: what a checkpoint keeps (they are computed again, bit for bit)."""
    return s._replace(cache=())

  def restored_state(self, saved: EventState) -> EventState:
    """``saved`` with room for ``B`` gradients computed ahead and none computed (``B = 1``: no room kept)."""
    if self.gradient_batch <= 1:
      return self.saved_state(saved)
    size = self.gradient_batch
    return saved._replace(
      cache=GradientCache(
        slot_of=jnp.full(saved.workers.finish.shape, -1, jnp.int32),
        gradients=WorkerGradient(
          loss=jnp.zeros([size], jnp.float32),
          grads=jax.tree.map(lambda x: jnp.zeros((size, *jnp.shape(x)), jnp.result_type(x)), saved.params),
          finite=jnp.zeros([size], jnp.bool_),
        ),
      )
    )

  def totals(self, s: EventState) -> RunTotals:
    """Per-worker gradients, applied gradients and idle seconds, and the bytes moved, of ``s``."""
    message = float(self.time_model.message_bytes)
    return RunTotals(
      worker_steps=np.asarray(s.workers.steps),
      worker_used=np.asarray(s.workers.used),
      worker_idle=np.asarray(s.workers.idle),
      bytes_moved=float(s.network.inter_messages) * message,
      bytes_moved_intra=float(s.network.intra_messages) * message,
    ).per_worker(self.strategy.workers_per_unit)

  def next_event_time(self, s: EventState) -> jax.Array:
    """When the next arrival's worker finishes computing."""
    return jnp.min(s.workers.finish)

  def ready(self, s: EventState) -> jax.Array:
    """Whether the next arrival's gradient is at hand (else :meth:`prepare` must run first)."""
    if self.gradient_batch <= 1:
      return jnp.asarray(True)
    return s.cache.slot_of[jnp.argmin(s.workers.finish)] >= 0

  def prepare(self, data: WorkerData, s: EventState) -> EventState:
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
    if self.gradient_batch <= 1:
      return s
    strategy, workers = self.strategy, s.workers
    num_workers = workers.finish.shape[0]
    size = self.gradient_batch
    known = jnp.isfinite(workers.finish)
    order = jnp.argsort(jnp.where(known, workers.finish, jnp.inf), stable=True).astype(jnp.int32)
    batch_workers = order[:size]
    kept = known[batch_workers]

    def one(worker):
      batch = unit_batch(strategy, data, worker, workers.steps[worker])
      return worker_gradient(self.loss_fn, _pulled_point(strategy, workers, worker), batch)

    gradients = jax.vmap(one)(batch_workers)
    slots = jnp.arange(size, dtype=jnp.int32)
    slot_of = (
      jnp.full([num_workers], -1, jnp.int32)
      .at[jnp.where(kept, batch_workers, num_workers)]
      .set(slots, mode="drop")
    )
    return s._replace(cache=GradientCache(slot_of=slot_of, gradients=gradients))

  def step(
    self, data: WorkerData, schedule: EvalSchedule, metric_names: tuple[str, ...], s: EventState
  ) -> tuple[EventState, EventRecord]:
    """One arrival: the earliest finisher's gradient goes through the strategy."""
    strategy, time_model, loss_fn = self.strategy, self.time_model, self.loss_fn
    workers, server = s.workers, s.server
    num_workers = strategy.num_units
    worker = jnp.argmin(workers.finish).astype(jnp.int32)
    t = workers.finish[worker]
    batch = unit_batch(strategy, data, worker, workers.steps[worker])
    elastic = strategy.protocol == WorkerProtocol.ELASTIC
    batched = self.gradient_batch > 1

    pulled = None
    if _uses_snapshots(strategy):
      # Materialized before the ring is written in place below (see _read_row).
      pulled = _read_row(workers.snapshots, workers.snapshot_of[worker])
    # Computed ahead by prepare() (the caller runs it first when the slot is -1), or here.
    gradient = _row(s.cache.gradients, s.cache.slot_of[worker]) if batched else None
    taken = 1  # gradients this arrival's worker computed
    if elastic:
      a = _elastic_arrival(strategy, loss_fn, s, worker, batch, pulled, gradient)
    elif strategy.protocol == WorkerProtocol.LOCAL:
      # Asynchronous local SGD: the local steps from the pull, then the pseudo-gradient as a message.
      taken = jnp.asarray(strategy.local_steps_per_unit, jnp.int32)[worker]
      sent = local_message(
        strategy,
        loss_fn,
        pulled,
        _read_row(workers.rule_state, worker),
        lambda t: data.batch(worker, t),
        workers.steps[worker],
        taken,
      )
      a = _gradient_arrival(strategy, loss_fn, s, worker, None, pulled, None, num_workers, sent=sent)
    else:
      a = _gradient_arrival(strategy, loss_fn, s, worker, batch, pulled, gradient, num_workers)

    rejected = ~a.finite
    version = server.version + a.released.astype(jnp.int32)
    steps = workers.steps.at[worker].add(taken)
    fresh = counts_as_fresh(strategy, workers.pulled_version[worker], server.version)
    if elastic:
      send = (jnp.arange(num_workers) == worker) & a.communicates
      waiting = server.waiting
    else:
      send, waiting = dispatch(strategy, server.waiting, worker, steps, a.released, fresh, rejected)
    arrival = dict(
      time=t,
      unit=worker,
      accepted=a.finite,
      communicates=a.communicates,
      released=a.released,
      replies=jnp.sum(send).astype(jnp.int32),
    )
    cost, network = time_model.exchange(strategy, s.network, **arrival)

    # Replies: the current parameters (SMEGA2's look-ahead estimate), written once.
    snapshots, snapshot_of = workers.snapshots, workers.snapshot_of
    if _uses_snapshots(strategy):
      reply = a.params if elastic else contracts.reply_params(a.params, a.rule_state)
      kept = jnp.where(send, -1, workers.snapshot_of)
      in_use = jnp.any(kept[None, :] == jnp.arange(num_workers + 1)[:, None], axis=1)
      slot = jnp.argmin(in_use).astype(jnp.int32)  # the first free slot
      snapshots = _set_row(workers.snapshots, slot, reply)
      snapshot_of = jnp.where(send, slot, workers.snapshot_of)
    noise = contracts.noise_ratio(a.rule_state)

    # Events are taken in finish order; an exchange that queued at the server
    # ends later than a following local step, so the clock is the running max.
    clock = jnp.maximum(s.clock, cost.server_time)
    evaluated, metrics, next_eval = schedule.maybe_evaluate(
      s.next_eval, a.params, version, clock, metric_names
    )
    if time_model.eval_time:
      # The server evaluates after applying and before replying (as the real one's compiled step
      # does): the same exchange, its replies and its next receive waiting for it.
      pause = jnp.where(evaluated, time_model.eval_time, 0.0)
      cost, network = time_model.exchange(strategy, s.network, **arrival, pause=pause)

    # Next finish times; elastic workers continue locally without waiting.
    idle_since = workers.idle_since.at[worker].set(t)
    if strategy.dispatch == Dispatch.IMMEDIATE or elastic:
      duration = time_model.unit_compute_times(strategy, s.key, worker[None], steps[worker][None])[0]
      finish = workers.finish.at[worker].set(cost.receive_time + duration)
      idle = workers.idle.at[worker].add(cost.receive_time - t)
    else:
      everyone = jnp.arange(num_workers, dtype=jnp.int32)
      durations = time_model.unit_compute_times(strategy, s.key, everyone, steps)
      finish = jnp.where(send, cost.receive_time + durations, workers.finish)
      finish = finish.at[worker].set(jnp.where(send[worker], finish[worker], jnp.inf))
      idle = workers.idle + jnp.where(send, cost.receive_time - idle_since, 0.0)

    new = EventState(
      clock=clock,
      server=ServerState(
        params=a.params, rule_state=a.rule_state, version=version, pending=a.pending, waiting=waiting
      ),
      workers=WorkersState(
        finish=finish,
        idle_since=idle_since,
        idle=idle,
        steps=steps,
        used=workers.used.at[worker].add(a.finite.astype(jnp.int32) * taken),
        snapshots=snapshots,
        snapshot_of=snapshot_of,
        pulled_version=jnp.where(send, version, workers.pulled_version),
        noise_ratio=workers.noise_ratio if noise is None else jnp.where(send, noise, workers.noise_ratio),
        params=a.worker_params,
        rule_state=a.worker_state,
      ),
      network=network,
      cache=s.cache._replace(slot_of=s.cache.slot_of.at[worker].set(-1)) if batched else (),
      next_eval=next_eval,
      event=s.event + 1,
      key=s.key,
    )
    record = EventRecord(
      time=clock,
      worker=worker,
      staleness=server.version - workers.pulled_version[worker],
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
