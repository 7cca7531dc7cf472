"""The synchronous engine: one compiled step per round behind a barrier.

All ``K`` workers start a round on the same parameters, so their gradients are
one batched computation: the gradient of ``sum_k w_k L(theta; batch_k)``
equals ``sum_k w_k g_k`` (``w_k = 1/k`` for the ``k`` gradients kept, 0 for
the dropped ones) and costs what the ``K`` separate gradients cost, without
``K`` gradient copies. Local SGD keeps the ``K`` models (a leading worker axis)
and ``vmap``s their local steps.
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
from jaxsync._src.sim.time_model import TimeModel
from jaxsync._src.steps import sync_round
from jaxsync._src.steps.records import EvalSchedule, EventRecord, stack_workers
from jaxsync._src.strategies.strategy import Strategy, WorkerProtocol


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


class RoundSpan(NamedTuple):
  """What a round costs on the clock, whatever it computes.

  Attributes:
    end: when its update is in (its record's ``time``).
    busy: ``[K]`` seconds each worker computed in it.
    started: ``[K]`` (or a scalar) gradients each worker started in it.
  """

  end: jax.Array
  busy: jax.Array
  started: jax.Array


@dataclasses.dataclass(frozen=True)
class RoundEngine:
  """The synchronous engine: one round per step, every worker's gradient in one batched computation.

  A :class:`jaxsync._src.sim.engine.Engine` over :class:`RoundState`; a round
  keeps no gradients between steps, so it has nothing to prepare and a
  checkpoint holds the whole state.

  Attributes:
    strategy: a synchronous strategy.
    loss_fn: ``(params, batch) -> scalar``.
    time_model: the cluster's clock, with ``message_bytes`` set.
  """

  strategy: Strategy
  loss_fn: Callable[[Any, Any], jax.Array]
  time_model: TimeModel

  def init(self, params: Any, schedule: EvalSchedule, key: jax.Array) -> RoundState:
    """The state at time 0: every worker holds ``params``."""
    strategy = self.strategy
    num_workers = strategy.num_workers
    local = strategy.protocol == WorkerProtocol.LOCAL
    return RoundState(
      clock=jnp.zeros([], jnp.float32),
      idle=jnp.zeros([num_workers], jnp.float32),
      steps=jnp.zeros([num_workers], jnp.int32),
      used=jnp.zeros([num_workers], jnp.int32),
      params=params,
      rule_state=contracts.init_server_rule(strategy.server_rule, params, strategy.worker_rule),
      version=jnp.zeros([], jnp.int32),
      worker_params=stack_workers(params, num_workers) if local else (),
      worker_state=stack_workers(strategy.worker_rule.init(params), num_workers) if local else (),
      inter_messages=jnp.zeros([], jnp.int32),
      intra_messages=jnp.zeros([], jnp.int32),
      next_eval=schedule.first_due(),
      event=jnp.zeros([], jnp.int32),
      key=key,
    )

  def saved_state(self, s: RoundState) -> RoundState:
    """``s`` itself: a round keeps nothing that could be computed again."""
    return s

  def restored_state(self, saved: RoundState) -> RoundState:
    """``saved`` itself."""
    return saved

  def totals(self, s: RoundState) -> RunTotals:
    """Per-worker gradients, applied gradients and idle seconds, and the bytes moved, of ``s``."""
    message = float(self.time_model.message_bytes)
    moved = float(s.inter_messages) * message
    if self.strategy.protocol == WorkerProtocol.LOCAL:  # each round moves its fragment, in the wire format
      per_round = self.time_model.round_messages(self.strategy, self.strategy.num_workers)[0]
      moved = sync_round.exchanged_bytes(self.strategy, s.params, int(s.event), per_round)
    return RunTotals(
      worker_steps=np.asarray(s.steps),
      worker_used=np.asarray(s.used),
      worker_idle=np.asarray(s.idle),
      bytes_moved=moved,
      bytes_moved_intra=float(s.intra_messages) * message,
    )

  def next_event_time(self, s: RoundState) -> jax.Array:
    """When the next round starts."""
    return s.clock

  def ready(self, s: RoundState) -> jax.Array:
    """Always: a round computes its gradients in its own step."""
    del s
    return jnp.asarray(True)

  def prepare(self, data: WorkerData, s: RoundState) -> RoundState:
    """``s`` itself: nothing to compute ahead."""
    del data
    return s

  def step(
    self, data: WorkerData, schedule: EvalSchedule, metric_names: tuple[str, ...], s: RoundState
  ) -> tuple[RoundState, EventRecord]:
    """One round: every worker computes, the server aggregates, everyone gets the result."""
    strategy, loss_fn = self.strategy, self.loss_fn
    if strategy.protocol == WorkerProtocol.LOCAL:
      return self._local_round(data, schedule, metric_names, s)
    num_workers = strategy.num_workers
    workers = jnp.arange(num_workers, dtype=jnp.int32)
    keep = strategy.gradients_per_round
    span, durations = self._gradient_span(s.key, s.steps, s.clock)
    if keep < num_workers:
      # Fastest-k (docs/algorithms.md §9): the k earliest finishers are kept, the rest cancelled.
      rank = jnp.argsort(jnp.argsort(durations, stable=True), stable=True)
      kept = rank < keep
    else:
      kept = jnp.ones([num_workers], jnp.bool_)
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
    update = sync_round.apply_aggregate(
      strategy, s.params, s.rule_state, grads, version=s.version, num_workers=num_workers
    )
    return self._finish_round(
      schedule,
      metric_names,
      s,
      update,
      span,
      kept=kept & update.finite,
      loss=loss,
      keep=keep,
      worker_params=s.worker_params,
      worker_state=s.worker_state,
    )

  def _local_round(self, data, schedule, metric_names, s: RoundState):
    """Each of the ``K`` models' round of local steps (vmapped), then the outer step on their mean pseudo-gradient.

    With an overlap ``tau`` (Streaming DiLoCo) the fragment's exchange runs
    during the round's last ``tau`` steps: the round ends when both the
    slowest worker's steps and the exchange are done. With elastic membership
    and a deadline, the mean is over the workers whose pseudo-gradients came
    by it (:meth:`TimeModel.delivered_by_deadline`) and the round waits only
    for them; the others' models go on from the new parameters, as a real
    worker whose push came late does. A worker gone when the round starts
    (:attr:`TimeModel.absences`) computes nothing; it comes back, as its
    replacement, with the global parameters and a fresh inner optimizer. With
    elastic membership every worker computes the round's batches (data steps
    from the round's number times ``H``), as the real server sends them.
    """
    strategy, time_model = self.strategy, self.time_model
    num_workers = strategy.num_workers
    workers = jnp.arange(num_workers, dtype=jnp.int32)
    fragment = sync_round.round_fragment(strategy, s.event)

    def one_worker(worker, x, state, step):
      return sync_round.local_work(
        strategy, self.loss_fn, lambda t: data.batch(worker, t), s.params, x, state, step, fragment
      )

    elastic = strategy.elastic_membership
    span, steps, present, kept = self._local_span(s.key, s.steps, s.clock, s.event, s.params)
    work = jax.vmap(one_worker)(workers, s.worker_params, s.worker_state, steps)
    weights = kept.astype(jnp.float32) / jnp.sum(kept).astype(jnp.float32)

    def kept_mean(d):  # a left-out worker's NaN must not reach the mean (0 * NaN = NaN)
      mask = kept.reshape((-1,) + (1,) * (d.ndim - 1))
      return jnp.tensordot(weights.astype(d.dtype), jnp.where(mask, d, 0), axes=1)

    mean_delta = jax.tree.map(lambda d: kept_mean(d) if elastic else jnp.mean(d, axis=0), work.contribution)
    update = sync_round.outer_step(strategy, s.params, s.rule_state, mean_delta, fragment)
    models = jax.vmap(lambda x: sync_round.mixed_model(strategy, update.params, x, fragment))(work.model)
    worker_state = work.worker_state
    if time_model.absences:  # a gone worker's slot: its replacement's start, the global parameters
      fresh = stack_workers(strategy.worker_rule.init(update.params), num_workers)
      models = _where_present(present, models, stack_workers(update.params, num_workers))
      worker_state = _where_present(present, worker_state, fresh)
    return self._finish_round(
      schedule,
      metric_names,
      s,
      update,
      span,
      kept=kept & update.finite,
      loss=_mean_loss(work.losses, present if time_model.absences else None),
      keep=jnp.sum(kept).astype(jnp.int32),
      worker_params=models,
      worker_state=worker_state,
    )

  # -- the clock: what a round costs, apart from what it computes ---------------------------------------

  def _gradient_span(self, key, steps, clock) -> tuple[RoundSpan, jax.Array]:
    """A gradient round's span from ``clock`` (its compute, then its exchange), and the workers' compute times."""
    strategy, time_model = self.strategy, self.time_model
    keep = strategy.gradients_per_round
    workers = jnp.arange(strategy.num_workers, dtype=jnp.int32)
    key, steps, clock = _fenced((key, steps, clock))
    durations = time_model.sample_compute(key, workers, steps)
    round_compute = time_model.gradient_round_compute(durations, keep)
    end = clock + round_compute + time_model.round_time(strategy, keep)
    busy = jnp.minimum(durations, round_compute)  # dropped workers are cancelled at the cut
    return _fenced((RoundSpan(end, busy, jnp.ones_like(steps)), durations))

  def _local_span(self, key, steps, clock, event, params):
    """A local round's span from ``clock``: its steps up to the exchange, then the longer of the exchange and the
    overlapped steps (``TimeModel.local_round_compute``); with the data steps it computes, the workers
    present and those it waits for."""
    strategy, time_model = self.strategy, self.time_model
    num_workers = strategy.num_workers
    workers = jnp.arange(num_workers, dtype=jnp.int32)
    elastic = strategy.elastic_membership
    key, steps, clock, event = _fenced((key, steps, clock, event))
    steps = jnp.full_like(steps, event * strategy.local_steps) if elastic else steps
    offsets = jnp.arange(strategy.local_steps, dtype=jnp.int32)
    step_times = jax.vmap(lambda i: time_model.sample_compute(key, workers, steps + i))(offsets)
    present = time_model.present(clock) if elastic else jnp.ones([num_workers], jnp.bool_)
    kept = time_model.delivered_by_deadline(strategy, step_times, present)
    before, during = time_model.local_round_compute(step_times, strategy.exchange.overlap, kept)
    fragment = sync_round.round_fragment(strategy, event)
    exchange = jnp.asarray(self._exchange_times(params), jnp.float32)[fragment]  # Python floats: not x64
    end = clock + before + jnp.maximum(exchange, during)
    span = RoundSpan(
      end,
      # A worker the round does not wait for is cut at its close, as fastest-k's are.
      jnp.minimum(jnp.sum(step_times, axis=0), end - clock) * present,
      strategy.local_steps * present.astype(jnp.int32),
    )
    return _fenced((span, steps, present, kept))

  def _after(self, clock, idle, span: RoundSpan, evaluated) -> tuple[jax.Array, jax.Array]:
    """The clock and the workers' idle seconds after a round: every worker evaluates inside the round (as the
    multi-controller loop does), so the next round starts after it."""
    clock, idle, span, evaluated = _fenced((clock, idle, span, evaluated))
    pause = jnp.where(evaluated, self.time_model.eval_time, 0.0) if self.time_model.eval_time else 0.0
    return _fenced((span.end + pause, idle + (span.end - clock - span.busy) + pause))

  def clock_dependence(self) -> str | None:
    """Why this engine's sequence of updates could depend on its clock, or None when it cannot: then one run
    gives every cluster clock's times (:meth:`replay_clock`). Rounds of equal or fixed-order workers do not
    look at the clock; elastic membership (who is present, who makes the deadline) and absences do."""
    if self.strategy.elastic_membership:
      return "elastic membership (who makes a round's deadline depends on its clock)"
    if self.time_model.absences:
      return "worker absences (who is present depends on the clock)"
    return None

  def replay_clock(self, params: Any, key: jax.Array, evaluated: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The clock of a run of ``len(evaluated)`` rounds on this engine's time model, without training it.

    A round's span depends on its compute draws (a pure function of the seed, the worker and the step), its
    exchange and its evaluation, never on the parameters' values (:meth:`clock_dependence` says when the
    updates are independent of the clock too). The same functions as :meth:`step` give the same
    float32 operations in the same order: the ends equal a full simulation's, bit for bit.

    Args:
      params: the parameters (their shapes size the exchange).
      key: the run's compute-time seed (``uint32[2]``, as :meth:`init` takes it).
      evaluated: ``bool[R]``, whether round ``r`` evaluated (it pauses the clock by ``eval_time``).

    Returns:
      ``(ends, idle)``: ``[R]`` each round's end, as its record's ``time``, and the workers' idle seconds.
    """
    local = self.strategy.protocol == WorkerProtocol.LOCAL
    num_workers = self.strategy.num_workers

    def one(carry, was_evaluated):
      clock, idle, steps, event = carry
      if local:
        span = self._local_span(key, steps, clock, event, params)[0]
      else:
        span = self._gradient_span(key, steps, clock)[0]
      clock, idle = self._after(clock, idle, span, was_evaluated)
      return (clock, idle, steps + span.started, event + 1), span.end

    start = (
      jnp.zeros([], jnp.float32),
      jnp.zeros([num_workers], jnp.float32),
      jnp.zeros([num_workers], jnp.int32),
      jnp.zeros([], jnp.int32),
    )
    (_, idle, _, _), ends = jax.lax.scan(one, start, jnp.asarray(evaluated, jnp.bool_))
    return ends, idle

  def _exchange_times(self, params) -> tuple[float, ...]:
    """Seconds each fragment's exchange and outer step take (``TimeModel.local_exchange_time``)."""
    strategy = self.strategy
    return tuple(
      self.time_model.local_exchange_time(strategy, wire, held)
      for wire, held in zip(
        sync_round.fragment_bytes(strategy, params),
        sync_round.fragment_bytes(strategy, params, on_wire=False),
      )
    )

  def _finish_round(
    self,
    schedule,
    metric_names,
    s: RoundState,
    update: sync_round.RoundUpdate,
    span: RoundSpan,
    *,
    kept,
    loss,
    keep,
    worker_params,
    worker_state,
  ) -> tuple[RoundState, EventRecord]:
    version = s.version + update.finite.astype(jnp.int32)
    inter, intra = self.time_model.round_messages(self.strategy, keep)
    end = span.end
    evaluated, metrics, next_eval = schedule.maybe_evaluate(
      s.next_eval, update.params, version, end, metric_names
    )
    clock, idle = self._after(s.clock, s.idle, span, evaluated)
    new = RoundState(
      clock=clock,
      idle=idle,
      steps=s.steps + span.started,
      used=s.used + kept.astype(jnp.int32) * span.started,
      params=update.params,
      rule_state=update.rule_state,
      version=version,
      worker_params=worker_params,
      worker_state=worker_state,
      inter_messages=s.inter_messages + inter,
      intra_messages=s.intra_messages + intra,
      next_eval=next_eval,
      event=s.event + 1,
      key=s.key,
    )
    record = sync_round.round_record(
      time=end,
      version=version,
      finite=update.finite,
      k=keep,
      loss=loss,
      evaluated=evaluated,
      metrics=metrics,
    )
    return new, record


def _fenced(tree):
  """``tree`` behind an optimization barrier: the clock's arithmetic between two fences compiles alike in the
  training program and in :meth:`RoundEngine.replay_clock` (XLA fuses, and may order a sum's terms, by what
  surrounds it), so that a re-timed run equals a full simulation bit for bit."""
  return jax.lax.optimization_barrier(tree)


def _where_present(present: jax.Array, tree, otherwise):
  """Each worker's slice of ``tree`` (a leading worker axis) where it is present, else of ``otherwise``."""
  return jax.tree.map(
    lambda a, b: jnp.where(present.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), tree, otherwise
  )


def _mean_loss(losses: jax.Array, present: jax.Array | None) -> jax.Array:
  """A local round's loss: over the workers (the present ones), then over their ``[K, H]`` local steps."""
  if present is None:
    return jnp.mean(jnp.mean(losses, axis=0))
  return jnp.sum(jnp.where(present, jnp.mean(losses, axis=1), 0.0)) / jnp.sum(present)
