"""The simulated cluster: a strategy, a model, data and a time model, compiled end to end."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsync._src.core import validation
from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.interface.history import History, RunTotals
from jaxsync._src.interface.runtime import RuntimeBase
from jaxsync._src.sim.engine import Engine
from jaxsync._src.sim.events import EventEngine
from jaxsync._src.sim.rounds import RoundEngine
from jaxsync._src.sim.time_model import TimeModel
from jaxsync._src.steps.records import EventRecord
from jaxsync._src.strategies.strategy import Engine as Synchrony
from jaxsync._src.strategies.strategy import Strategy, WorkerProtocol, with_worker_speeds

_WHAT = "simulator"


def check_gradient_batch(strategy: Strategy, gradient_batch: int | None) -> int:
  """``B``, the gradients the simulator computes ahead at a time for ``strategy``; raises ValueError.

  Args:
    strategy: the strategy to simulate.
    gradient_batch: ``1`` to the strategy's computing units (its workers, or
      EA-wild groups), or ``None``: one per unit on a GPU or TPU, ``1`` on a CPU.

  Returns:
    ``gradient_batch`` checked, or its default.
  """
  units = strategy.num_units
  if strategy.engine == Synchrony.ASYNC and strategy.protocol == WorkerProtocol.LOCAL:
    # Each push's local steps run at its arrival: a loop of the worker's own steps, not one gradient.
    if gradient_batch not in (None, 1):
      raise validation.invalid(
        _WHAT,
        "gradient_batch",
        gradient_batch,
        f"1 (or None): {strategy.name!r} computes its local steps per push",
      )
    return 1
  if gradient_batch is None:
    # Batching pays where one gradient leaves the device idle (a GPU, a TPU); on a CPU one
    # gradient of a convolutional model already fills the cores and a vmap of per-worker
    # weights is slower per gradient (benchmarks/speed/simulator_throughput.py).
    return 1 if jax.default_backend() == "cpu" else units
  batch = validation.check_int(_WHAT, "gradient_batch", gradient_batch)
  if batch > units:
    raise validation.invalid(
      _WHAT, "gradient_batch", gradient_batch, f"an integer from 1 to the {units} workers that compute"
    )
  return batch


def _check_absences(strategy: Strategy, time_model: TimeModel) -> None:
  """Workers that leave and join (``time_model.absences``) are modeled for elastic membership, above its quorum."""
  if not time_model.absences:
    return
  if not strategy.elastic_membership:
    raise validation.invalid(
      _WHAT,
      "time_model.absences",
      time_model.absences,
      f"none for {strategy.name} with a fixed membership (workers that leave and join are modeled for"
      " membership='elastic': diloco, streaming_diloco, local_sgd)",
    )
  fewest = time_model.fewest_present()
  if fewest < strategy.quorum:
    raise validation.invalid(
      _WHAT,
      "time_model.absences",
      time_model.absences,
      f"absences that leave at least quorum={strategy.quorum} workers at once (here {fewest}): a round below"
      " its quorum waits for a worker to join, which the simulator does not model",
    )


class Simulator(RuntimeBase):
  r"""K simulated workers and a server (or an all-reduce group), compiled end to end.

  The run is one compiled ``lax.while_loop`` over events. An asynchronous strategy's event is
  one arrival: the earliest finisher's one gradient on the parameters it pulled
  (kept per worker; computed at the arrival, or ahead with other in-flight
  workers' in a batch of ``gradient_batch``), its worker rule and the server rule
  apply it, the dispatch policy decides who gets the new parameters, and the
  time model schedules their next finish. A synchronous strategy's event is a
  round: all workers' gradients in one batched computation (``vmap``), the
  server rule on their mean, time ``max_k c_k`` (the ``k``-th fastest for
  fastest-k) plus the exchange's cost. Decisions that depend on gradient values
  (adaptive-k's release) run inside the same compiled loop.

  Same strategy, data, time model and seed give bit-identical parameters,
  history and event trace; :meth:`advance` in chunks equals one long call.

  Args:
    strategy: from :func:`jaxsync.strategies.make`.
    loss_fn: ``(params, batch) -> scalar`` mean loss of a batch.
    data: the training data, sharded over the workers.
    time_model: the cluster's timing; ``message_bytes=None`` is filled in from
      the parameters.
    eval_fn: optional ``params -> {name: scalar}`` on held-out data.
    eval_every: evaluate every this many server updates, or
    eval_every_time: every this many simulated seconds.
    gradient_batch: ``B``, an asynchronous strategy's gradients computed
      together ahead of their arrivals, at most (``1``: each at its arrival).
      Default: one per worker (or EA-wild group) on a GPU or TPU, ``1`` on a
      CPU. The state keeps ``B`` gradients besides the ``K + 1`` pulled
      snapshots. The results do not depend on it but for float rounding: a
      batched matrix product may round differently from a single one.

  Example:
    >>> import jax.numpy as jnp, numpy as np, jaxsync
    >>> x = np.linspace(-1, 1, 64, dtype=np.float32)
    >>> data = jaxsync.sim.WorkerData({"x": x, "y": 3 * x}, num_workers=4, batch_size=8)
    >>> loss = lambda w, b: jnp.mean((w * b["x"] - b["y"]) ** 2)
    >>> sim = jaxsync.sim.Simulator(
    ...   jaxsync.strategies.make("asp", 4, learning_rate=0.5), loss, data,
    ...   jaxsync.sim.TimeModel(num_workers=4))
    >>> params, history = sim.run(jnp.zeros([]), num_events=200)
    >>> round(float(params), 3), int(history.staleness[-100:].max()) <= 6
    (3.0, True)
  """

  def __init__(
    self,
    strategy: Strategy,
    loss_fn: Callable[[optax.Params, Any], jax.Array],
    data: WorkerData,
    time_model: TimeModel,
    *,
    eval_fn: Callable[[optax.Params], dict[str, Any]] | None = None,
    eval_every: int | None = None,
    eval_every_time: float | None = None,
    gradient_batch: int | None = None,
  ):
    if not isinstance(strategy, Strategy):
      raise validation.invalid(_WHAT, "strategy", strategy, "a Strategy from jaxsync.strategies.make(...)")
    if not isinstance(time_model, TimeModel):
      raise validation.invalid(_WHAT, "time_model", time_model, "a jaxsync.sim.TimeModel")
    if not isinstance(data, WorkerData):
      raise validation.invalid(_WHAT, "data", data, "a jaxsync.sim.WorkerData")
    k = strategy.num_workers
    for name, value in (
      ("time_model.num_workers", time_model.num_workers),
      ("data.num_workers", data.num_workers),
    ):
      if value != k:
        raise validation.invalid(_WHAT, name, value, f"the strategy's num_workers={k}")
    _check_absences(strategy, time_model)
    super().__init__(eval_fn, eval_every, eval_every_time)
    # Dynamic Local Updates size each worker's local steps by its speed in this cluster.
    strategy = with_worker_speeds(strategy, time_model.mean_compute_times())
    self.strategy = strategy
    self.loss_fn = loss_fn
    self.data = data
    self.time_model = time_model
    self.gradient_batch = check_gradient_batch(strategy, gradient_batch)
    # Its time model gets the parameters' message size in _prepare; saving and restoring need none.
    self._engine = self._make_engine(time_model)
    self._advance = jax.jit(self._advance_impl, static_argnames="num_events", donate_argnums=0)
    # Made once: a jax.jit of the bound method per init() call traced and compiled it every time.
    self._init = jax.jit(self._init_impl)

  def _make_engine(self, time_model: TimeModel) -> Engine:
    if self.strategy.engine == "sync":
      return RoundEngine(self.strategy, self.loss_fn, time_model)
    return EventEngine(self.strategy, self.loss_fn, time_model, self.gradient_batch)

  def _prepare(self, params: optax.Params) -> None:
    super()._prepare(params)
    self._engine = self._make_engine(self.time_model.with_message_bytes(params))

  def init(self, params: optax.Params, seed: int = 0):
    """The simulation state at time 0 with every worker holding ``params``."""
    seed = validation.check_int(_WHAT, "seed", seed, low=0)
    params = jax.tree.map(jnp.asarray, params)
    self._start(params)
    # One compiled program: run eagerly, the state's set-up (first compute times, snapshot
    # stacks, rule states) compiled one small program per operation, about a second a run.
    return self._init(params, jax.random.key_data(jax.random.key(seed)))

  def _init_impl(self, params, seed):
    state = self._engine.init(params, self.schedule, seed)
    # advance() donates the state: every leaf a buffer of its own (init shares zeros between
    # fields, and the caller keeps its params), strongly typed as advance() returns it (a
    # weak-typed leaf, e.g. from jnp.full(n, 2.0), would compile advance twice).
    return jax.tree.map(lambda x: jnp.array(x, dtype=x.dtype, copy=True), state)

  def _step(self, state, data, eval_arrays):
    schedule = self.schedule.with_eval_arrays(eval_arrays)
    return self._engine.step(data, schedule, self.metric_names, state)

  def _advance_impl(self, state, max_time, data, eval_arrays, num_events: int):
    # While loops, not a scan, so that a run can stop at a simulated time; the
    # records go into preallocated buffers, one row per event run. The data and the
    # held-out arrays are arguments, not constants of the program. The inner loop runs
    # events while their gradients are ready (always, for rounds); the outer one
    # then computes the next batch of gradients ahead (EventEngine.prepare).
    shapes = jax.eval_shape(self._step, state, data, eval_arrays)[1]
    buffers = jax.tree.map(lambda x: jnp.zeros((num_events, *x.shape), x.dtype), shapes)

    def running(carry):
      i, s, _ = carry
      return (i < num_events) & (self._engine.next_event_time(s) < max_time)

    def event(carry):
      i, s, rec = carry
      s, row = self._step(s, data, eval_arrays)
      return i + 1, s, jax.tree.map(lambda buf, x: buf.at[i].set(x), rec, row)

    def batch(carry):
      i, s, rec, idle = carry
      start = i
      i, s, rec = jax.lax.while_loop(lambda c: running(c) & self._engine.ready(c[1]), event, (i, s, rec))
      idle = jnp.where(i > start, 0, idle + 1)
      return i, self._engine.prepare(data, s), rec, idle

    def batching(carry):
      # Two batches in a row that ran no event (only a first one, on an empty cache, may)
      # would loop forever: stop, and the host sees fewer events than it asked for.
      i, s, rec, idle = carry
      return running((i, s, rec)) & (idle < 2)

    zero = jnp.zeros([], jnp.int32)
    count, state, records, _ = jax.lax.while_loop(batching, batch, (zero, state, buffers, zero))
    return state, records, count

  def advance(self, state, num_events: int, *, max_time: float | None = None) -> tuple[Any, EventRecord]:
    """Runs up to ``num_events`` more events; returns the new state and their records.

    With ``max_time`` the run stops before the first event that would start at
    or after that simulated time (an arrival whose worker finishes then, or a
    round that begins then); the records hold only the events that ran.
    Compiled once per ``num_events``. The input state is donated: use the
    returned one.
    """
    num_events = validation.check_int(_WHAT, "num_events", num_events)
    limit = (
      np.inf
      if max_time is None
      else validation.check_real(_WHAT, "max_time", max_time, low=0.0, low_open=True)
    )
    self._ensure_prepared(state.params)
    state, records, count = self._advance(
      state, jnp.asarray(limit, jnp.float32), self.data, self.schedule.eval_arrays(), num_events=num_events
    )
    count = int(count)
    if count < num_events:
      records = jax.tree.map(lambda x: x[:count], records)
    return state, records

  def saved_state(self, state):
    """``state`` less the gradients computed ahead, which a restored run computes again, bit for bit.

    So a checkpoint does not depend on ``gradient_batch``: a run saved on a
    CPU (``B = 1``) resumes on a GPU (``B = K``) and the other way round.
    """
    return self._engine.saved_state(state)

  def restored_state(self, saved):
    """A state :meth:`advance` takes from :meth:`saved_state`'s (room for ``gradient_batch`` gradients)."""
    return self._engine.restored_state(saved)

  def totals(self, state) -> RunTotals:
    """Per-worker gradients, applied gradients and idle seconds, and the bytes moved, of ``state``."""
    return self._engine.totals(state)

  def clock_dependence(self, *, compute_times: bool = False) -> str | None:
    """Why this run's sequence of updates could depend on its cluster's clock, in words, or None when it
    cannot (synchronous rounds of equal or fixed-order workers, evaluated every so many updates): then one
    run gives its times on every link (:meth:`retime`). With ``compute_times``, whether it could depend on
    the workers' compute times as well (fastest-k's rounds keep their fastest gradients): None means one
    run gives its times on every link and at every speed of the workers."""
    if not isinstance(self._engine, RoundEngine):
      return "asynchronous arrivals (their order is the clock's)"
    if self.schedule.every_time is not None:
      return "evaluations every so many simulated seconds (which updates are evaluated is the clock's)"
    if (
      compute_times
      and (self.strategy.gradients_per_round or self.strategy.num_workers) < self.strategy.num_workers
    ):
      return "fastest-k with other compute times (which gradients a round keeps is the compute times')"
    return self._engine.clock_dependence()

  def retime(
    self, history: History, params: optax.Params, *, seed: int = 0, trained_on: TimeModel
  ) -> History:
    """``history``, a run of this simulator's strategy, data and seed on the clock ``trained_on``, on this
    simulator's clock instead, without training it again.

    Where the updates cannot depend on the clock (:meth:`clock_dependence`), a round's span is its compute
    draws (a pure function of the seed, the worker and the step), its exchange on the link, and its
    evaluation pause: :meth:`RoundEngine.replay_clock` replays them with the same float32 operations, so the
    result equals a full simulation on this clock bit for bit (times, evaluation times, idle seconds); the
    parameters, losses and metrics are the run's own. Fastest-k keeps the rounds' fastest gradients, so its
    compute-time model must be ``trained_on``'s too.

    Args:
      history: a simulated run of this strategy, data and ``seed``.
      params: its initial parameters (their shapes size the messages).
      seed: the run's compute-time jitter seed.
      trained_on: the time model the run was simulated on.

    Returns:
      The :class:`History` on this simulator's time model.

    Example:
      >>> import jax.numpy as jnp, numpy as np, jaxsync
      >>> x = np.linspace(-1, 1, 64, dtype=np.float32)
      >>> data = jaxsync.sim.WorkerData({"x": x, "y": 3 * x}, num_workers=4, batch_size=8)
      >>> loss = lambda w, b: jnp.mean((w * b["x"] - b["y"]) ** 2)
      >>> bsp = jaxsync.strategies.make("bsp", 4, learning_rate=0.5)
      >>> slow, fast = (jaxsync.sim.TimeModel(num_workers=4, link=link) for link in ("100mbps", "10gbps"))
      >>> _, history = jaxsync.sim.Simulator(bsp, loss, data, slow).run(jnp.zeros([]), num_events=50)
      >>> retimed = jaxsync.sim.Simulator(bsp, loss, data, fast).retime(history, jnp.zeros([]), trained_on=slow)
      >>> bool(retimed.time[-1] < history.time[-1]), bool((retimed.loss == history.loss).all())
      (True, True)
    """
    same = np.array_equal(trained_on.mean_compute_times(), self.time_model.mean_compute_times())
    why = self.clock_dependence(
      compute_times=not same or trained_on.jitter_shape != self.time_model.jitter_shape
    )
    if why is not None:
      raise ValueError(
        f"{_WHAT}: retime: {self.strategy.name}'s updates can depend on the clock ({why}); simulate it on "
        "this clock instead."
      )
    if history.clock != "simulated":
      raise validation.invalid(_WHAT, "history.clock", history.clock, "'simulated': a real run has no replay")
    seed = validation.check_int(_WHAT, "seed", seed, low=0)
    rounds = len(history.time)
    evaluated = np.zeros([rounds], bool)
    events = np.asarray(history.eval_event[1:], int) - 1  # row 0 is the initial model
    evaluated[events] = True
    params = jax.tree.map(jnp.asarray, params)
    engine = self._make_engine(self.time_model.with_message_bytes(params))
    key = jax.random.key_data(jax.random.key(seed))
    ends, idle = jax.jit(engine.replay_clock)(params, key, evaluated)
    ends = np.asarray(ends)
    eval_time = np.concatenate([[0.0], ends[events]]) if len(history.eval_time) else history.eval_time
    return dataclasses.replace(
      history, time=ends, eval_time=eval_time.astype(history.eval_time.dtype), worker_idle=np.asarray(idle)
    )

  def run(
    self,
    params: optax.Params,
    num_events: int,
    *,
    seed: int = 0,
    chunk: int | None = None,
    max_time: float | None = None,
  ) -> tuple[optax.Params, History]:
    """Simulates ``num_events`` events from ``params``; returns the final parameters and the history.

    Args:
      params: the initial parameters (every worker starts from them).
      num_events: arrivals (asynchronous) or rounds (synchronous) to simulate,
        at most.
      seed: the compute-time jitter seed (data order is ``data.seed``).
      chunk: events per compiled call (default: all at once).
      max_time: stop at this simulated time instead (see :meth:`advance`),
        e.g. to compare strategies on an equal time budget.
    """
    num_events = validation.check_int(_WHAT, "num_events", num_events)
    chunk = num_events if chunk is None else validation.check_int(_WHAT, "chunk", chunk)
    state = self.init(params, seed)
    records = []
    done = 0
    while done < num_events:
      n = min(chunk, num_events - done)
      state, rec = self.advance(state, n, max_time=max_time)
      records.append(rec)
      ran = len(rec.time)
      done += ran
      if ran < n:  # stopped at max_time
        break
    history = self.history(records, state)
    if history.rejected_count:  # said once, as `jaxsync train`'s summary line says it
      unit = "gradients" if self.strategy.engine == "async" else "rounds"
      logging.getLogger("jaxsync.sim").warning(
        "rejected %d of %d %s: not finite", history.rejected_count, len(history.time), unit
      )
    return state.params, history


def run(
  strategy: Strategy,
  loss_fn: Callable[[optax.Params, Any], jax.Array],
  params: optax.Params,
  data: WorkerData,
  time_model: TimeModel,
  *,
  num_events: int | None = None,
  num_gradients: int | None = None,
  seed: int = 0,
  eval_fn: Callable[[optax.Params], dict[str, Any]] | None = None,
  eval_every: int | None = None,
  eval_every_time: float | None = None,
  max_time: float | None = None,
) -> tuple[optax.Params, History]:
  """Simulates a strategy on a model, data and cluster; see :class:`Simulator`.

  The budget is given in events or in gradients (exactly one of them). An
  event is an arrival of one gradient for most asynchronous strategies, but a
  synchronous round computes ``K`` gradients, and a DiLoCo round ``K x H``:
  ``num_gradients=G`` runs ``ceil(G / strategy.gradients_per_event)`` events,
  the same work whatever the strategy.

  Args:
    strategy: from :func:`jaxsync.strategies.make`.
    loss_fn: ``(params, batch) -> scalar``.
    params: initial parameters.
    data: a :class:`WorkerData`.
    time_model: a :class:`TimeModel`.
    num_events: arrivals (async) or rounds (sync) to simulate.
    num_gradients: or the worker gradients to compute (``jaxsync train``'s
      ``run.gradients``).
    seed: jitter seed.
    eval_fn, eval_every, eval_every_time: the evaluation schedule.
    max_time: stop at this simulated time (at most ``num_events`` events).

  Returns:
    ``(final_params, history)``.
  """
  sim = Simulator(
    strategy,
    loss_fn,
    data,
    time_model,
    eval_fn=eval_fn,
    eval_every=eval_every,
    eval_every_time=eval_every_time,
  )
  if (num_events is None) == (num_gradients is None):
    raise ValueError(
      f"{_WHAT}: run takes one budget; got {num_events=} and {num_gradients=}: expected exactly one of them."
    )
  if num_gradients is not None:
    num_gradients = validation.check_int(_WHAT, "num_gradients", num_gradients)
    num_events = -(-num_gradients // strategy.gradients_per_event)
  return sim.run(params, num_events, seed=seed, max_time=max_time)
