"""The multi-controller synchronous loop: every process runs the same jitted round over a mesh.

Worker ``k`` is device ``k`` of the mesh (one CPU device per process; on a
GPU/TPU host, one per accelerator). A round is one jitted ``shard_map``:

.. math::

  g = \\sum_k \\tfrac{1}{K} \\nabla L(\\theta; \\text{batch}(k, t)), \\qquad
  \\theta, s \\leftarrow \\text{server\\_rule}(g, s, \\theta)

where the sum is a ``psum`` across processes (gloo on CPU) and, for
hierarchical all-reduce, two ``psum``s: inside each group of ``G`` workers,
then across the groups' results. The round's whole exchange (the gradient's
leaves, the loss and the clock) travels as few, large buffers
(:mod:`jaxsync._src.distributed.bucketed_all_reduce`): one collective per
bucket, not one per leaf, and no clock broadcast (a quantized exchange adds
one small all-reduce of the loss and the clock). The server rule then runs on every process
on the same reduced gradient, so the parameters stay bit-identical on every
process without a broadcast. Local SGD and DiLoCo keep each worker's model on
its own device and average their pseudo-gradients every ``local_steps``: only
the leaves of the round's fragment cross the wire (Streaming DiLoCo), in the
exchange's format: a ``psum`` of float32, or quantized (bfloat16, int8, int4)
through an all-to-all and an all-gather of the packed bytes
(:mod:`jaxsync._src.distributed.quantized_all_reduce`).

:class:`SyncRuntime` has the simulator's interface, so :func:`training.train`
drives it; every process calls it with the same chunks, process 0 writes the
run directory.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxsync._src.core import validation
from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.distributed import bucketed_all_reduce, cluster, quantized_all_reduce
from jaxsync._src.distributed.cluster import RunFaultError
from jaxsync._src.interface.history import RunTotals
from jaxsync._src.interface.runtime import FaultAfterProgress, RuntimeBase
from jaxsync._src.rules import contracts, diloco
from jaxsync._src.steps import sync_round
from jaxsync._src.steps.records import stack_workers
from jaxsync._src.strategies.strategy import Communication, Engine, Strategy, WorkerProtocol

log = logging.getLogger("jaxsync.sync")
_WHAT = "SyncRuntime"
_AXES = ("groups", "members")
_LIVENESS_WAIT = 5.0  # seconds a survivor waits to learn which process was lost


class ProcessLostError(RunFaultError, FaultAfterProgress):
  """A process of a synchronous run is gone: the round cannot complete.

  ``completed`` holds the state and records of the rounds of the interrupted
  ``advance`` that completed in this process (see :class:`FaultAfterProgress`).
  """


def _collective_failed(err: BaseException) -> bool:
  """Whether an error is a cross-process collective that failed (a peer is gone), not a bug."""
  text = str(err)
  return any(word in text for word in ("Gloo", "gloo", "UNAVAILABLE", "Connection reset", "collective"))


class SyncState(NamedTuple):
  """The state of a synchronous multi-process run, process-local and the same on every process.

  Attributes:
    clock: wall seconds at the end of the last round (summed over resumes).
    params: the parameters.
    rule_state: the server rule's state.
    version: updates so far.
    steps: ``[K]`` gradients each worker computed (its data step).
    worker_params, worker_state: ``[K, ...]`` local models and their optimizer
      states (local SGD), else ``()``.
    next_eval: the next evaluation point.
    event: rounds so far.
  """

  clock: jax.Array
  params: Any
  rule_state: Any
  version: jax.Array
  steps: jax.Array
  worker_params: Any
  worker_state: Any
  next_eval: jax.Array
  event: jax.Array


class EarlierShape(NamedTuple):
  """A shape a synchronous run had before it shrank or grew (``jaxsync launch --min-workers``).

  Attributes:
    from_event: the round it started at: a checkpoint at an earlier round is
      not its.
    num_workers: its workers.
    batch_size: its workers' batch.
    sources: for each worker of the run now, the worker of that shape whose
      local state it continues, or None (joined since: the global model and a
      fresh optimizer state).
  """

  from_event: int
  num_workers: int
  batch_size: int
  sources: tuple[int | None, ...]


def resized_state(
  saved: SyncState, sources, *, batch_size: int, new_batch_size: int, fresh_worker_state: Any
) -> SyncState:
  r"""A saved state of a run of ``len(sources)`` workers, from one of ``saved.steps.size`` workers.

  .. math::

    t' = \Big\lfloor \frac{b \sum_k t_k}{K' b'} \Big\rfloor \text{ for every worker}, \qquad
    \theta'_j = \theta_{\text{sources}[j]} \text{ (or the global } \theta \text{ for None)}

  The global model, the server rule's state, the clock and the counters
  carry over. The data steps ``t`` are re-counted for the new split, so that
  the examples every worker has walked through so far are the same share of
  the training set: the re-split data (``K'`` shards) goes on at the same
  place in its epoch. A local strategy's worker ``j`` keeps worker
  ``sources[j]``'s model and optimizer state; a joining worker starts from
  the global model with ``fresh_worker_state``.

  Args:
    saved: a saved :class:`SyncState` (host arrays).
    sources: per worker of the new run, an index into the old workers or None.
    batch_size, new_batch_size: a worker's batch before and after.
    fresh_worker_state: a joining worker's optimizer state (the worker
      rule's ``init`` of the global model).

  Returns:
    The saved state of the resized run.
  """
  new = len(sources)
  walked = int(np.sum(np.asarray(saved.steps, np.int64))) * batch_size
  steps = np.full([new], walked // (new * new_batch_size), np.asarray(saved.steps).dtype)

  def rows(stacked, fresh):
    def pick(x, f):
      x = np.asarray(x)
      return np.stack([x[k] if k is not None else np.asarray(f, x.dtype) for k in sources])

    return jax.tree.map(pick, stacked, fresh)

  local = bool(jax.tree.leaves(saved.worker_params))
  return saved._replace(
    steps=steps,
    worker_params=rows(saved.worker_params, saved.params) if local else saved.worker_params,
    worker_state=rows(saved.worker_state, fresh_worker_state) if local else saved.worker_state,
  )


def check_strategy(strategy: Strategy, num_devices: int) -> Strategy:
  """Checks that ``strategy`` runs on this loop with ``num_devices`` workers; raises ValueError."""
  if strategy.engine != Engine.SYNC:
    raise validation.invalid(_WHAT, "strategy", strategy.name, "a synchronous strategy (engine 'sync')")
  if strategy.gradients_per_round not in (None, strategy.num_workers):
    raise validation.invalid(
      _WHAT,
      "strategy",
      f"{strategy.name} (gradients_per_round={strategy.gradients_per_round})",
      "a strategy that aggregates every worker's gradient; dropping the slowest (fastest_k) needs "
      "cancellable collectives: it runs on the parameter server (jaxsync launch -n K+1)",
    )
  if strategy.exchange.quantize is not None and strategy.communication == Communication.HIERARCHICAL:
    raise validation.invalid(
      _WHAT,
      "quantize",
      strategy.exchange.quantize,
      "None with hierarchical communication: a quantized exchange runs over one flat group of workers",
    )
  if strategy.num_workers != num_devices:
    raise validation.invalid(
      _WHAT,
      "num_workers",
      strategy.num_workers,
      f"the number of devices in the run ({num_devices}: one worker per device)",
    )
  return strategy


class SyncRuntime(RuntimeBase):
  """Runs a synchronous strategy with one worker per device across processes.

  Args:
    strategy: ``bsp``, ``allreduce``, ``hierarchical_allreduce`` or ``local_sgd``.
    loss_fn: ``(params, batch) -> scalar``.
    data: the run's data, sharded over ``K`` workers (every process holds it).
    eval_fn, eval_every, eval_every_time: as for the simulator (wall seconds).
    devices: the mesh's devices (default: ``jax.devices()``, every process's).
    liveness: ``() -> set of live process ids`` used to name a lost process.
    slowdowns: optional per-worker compute-time factors ``>= 1``; a process
      whose workers' largest factor ``s`` exceeds 1 sleeps ``(s - 1)`` times its
      measured compute of a round before each round, as the simulator's slow
      workers are slower (``cluster.emulate_slow_workers``).
    bucket_bytes: the largest buffer of a round's exchange (its leaves end to
      end per dtype; one all-reduce per buffer).
    earlier: the run's earlier shapes, most recent first (a run that shrank
      or grew): a checkpoint one of them wrote restores into this run's
      workers (:func:`resized_state`).

  Example:
    ``jaxsync launch -n 2 configs/quickstart.yaml --set strategy.name=bsp --set cluster.num_workers=2``
  """

  def __init__(
    self,
    strategy: Strategy,
    loss_fn,
    data: WorkerData,
    *,
    eval_fn=None,
    eval_every: int | None = None,
    eval_every_time: float | None = None,
    devices=None,
    liveness=None,
    slowdowns=None,
    bucket_bytes: int = bucketed_all_reduce.DEFAULT_BUCKET_BYTES,
    earlier: tuple[EarlierShape, ...] = (),
  ):
    devices = list(jax.devices() if devices is None else devices)
    self._bucket_bytes = validation.check_int(_WHAT, "bucket_bytes", bucket_bytes, low=1)
    super().__init__(eval_fn, eval_every, eval_every_time)
    self.strategy = check_strategy(strategy, len(devices))
    self.loss_fn, self.data = loss_fn, data
    groups = strategy.group_size if strategy.communication == Communication.HIERARCHICAL else 1
    self.mesh = Mesh(np.asarray(devices).reshape(strategy.num_workers // groups, groups), _AXES)
    self._hierarchical = groups > 1
    self._replicated = NamedSharding(self.mesh, P())
    self._per_worker = NamedSharding(self.mesh, P(_AXES))
    self._liveness = liveness
    # The fragment a round exchanges is static: its leaves, and only they, cross the wire.
    self._round = jax.jit(self._round_impl, static_argnames=("fragment",))
    self._inputs = None  # (the training data, the held-out arrays) on the mesh, made on the first advance
    self._started = time.perf_counter()
    self._clock_offset: float | None = None
    self._rounds_done: int | None = None  # after the last advance
    # An emulated slow worker (cluster.emulate_slow_workers): this process's slowest worker's factor;
    # it sleeps (factor - 1) x its measured compute before each round (measured on the first advance).
    mine = [i for i, d in enumerate(devices) if d.process_index == jax.process_index()]
    factors = [1.0] if slowdowns is None else [float(slowdowns[i]) for i in mine] or [1.0]
    for factor in factors:
      validation.check_real(_WHAT, "slowdowns[i]", factor, low=1.0)
    self._slowdown, self._my_worker = max(factors), (mine or [0])[0]
    self._local_workers = len(mine)
    self._delay: float | None = None
    self._earlier = tuple(earlier)

  # -- collectives ------------------------------------------------------------------------------

  def _sum(self, tree):
    """``sum_k x_k`` over the workers, one all-reduce per bucket of the tree's leaves (two levels for
    hierarchical all-reduce: inside groups, then across)."""
    if self._hierarchical:
      reduce = lambda x: jax.lax.psum(jax.lax.psum(x, "members"), "groups")  # noqa: E731
    else:
      reduce = lambda x: jax.lax.psum(x, _AXES)  # noqa: E731
    return bucketed_all_reduce.bucketed_sum(tree, reduce, self._bucket_bytes)

  def _clock_share(self, now):
    """This worker's part of the round's clock: its process's time from worker 0, zero from the others
    (worker 0 is process 0's first device with the default device order).

    Summed with the round's exchange, every process gets process 0's time exactly (adding zeros), and
    time-based evaluation decides the same everywhere without a collective of its own.
    """
    return jnp.where(self._worker_index() == 0, now[0], jnp.zeros_like(now[0]))

  def _worker_index(self):
    return jax.lax.axis_index("groups") * self.mesh.shape["members"] + jax.lax.axis_index("members")

  # -- the runtime interface ------------------------------------------------------------------

  clock = "wall"

  def init(self, params, seed: int = 0) -> SyncState:
    """The state before the first round: every worker holds ``params``."""
    del seed
    params = jax.tree.map(jnp.asarray, params)
    self._start(params)
    num_workers = self.strategy.num_workers
    local = self.strategy.protocol == WorkerProtocol.LOCAL
    state = SyncState(
      clock=jnp.zeros([], jnp.float32),
      params=params,
      rule_state=contracts.init_server_rule(self.strategy.server_rule, params, self.strategy.worker_rule),
      version=jnp.zeros([], jnp.int32),
      steps=jnp.zeros([num_workers], jnp.int32),
      worker_params=stack_workers(params, num_workers) if local else (),
      worker_state=stack_workers(self.strategy.worker_rule.init(params), num_workers) if local else (),
      next_eval=self.schedule.first_due(),
      event=jnp.zeros([], jnp.int32),
    )
    return jax.tree.map(lambda x: jnp.array(x, copy=True), state)

  def earlier_states(self, saved: SyncState, step: int) -> list:
    """The saved states of the run's earlier shapes that a checkpoint at ``step`` may hold, each with its
    conversion to this run's workers (:func:`resized_state`)."""
    out = []
    for shape in self._earlier:
      if shape.from_event > step:
        continue

      def like(x, k=shape.num_workers):
        x = np.asarray(x)
        return np.zeros((k, *x.shape[1:]), x.dtype)

      earlier = saved._replace(
        steps=like(saved.steps),
        worker_params=jax.tree.map(like, saved.worker_params),
        worker_state=jax.tree.map(like, saved.worker_state),
      )

      def convert(old, shape=shape):
        local = self.strategy.protocol == WorkerProtocol.LOCAL
        if jax.process_index() == 0:
          log.info(
            "a checkpoint of %d workers goes on with %d, the data re-split%s", shape.num_workers,
            self.strategy.num_workers,
            f"; worker j's local model is worker {list(shape.sources)}[j]'s (None: the global model and a fresh "
            "optimizer state)" if local else "",
          )  # fmt: skip
        return resized_state(
          old, shape.sources, batch_size=shape.batch_size, new_batch_size=self.data.batch_size,
          fresh_worker_state=self.strategy.worker_rule.init(old.params) if local else (),
        )  # fmt: skip

      out.append((earlier, convert))
    return out

  def totals(self, state: SyncState) -> RunTotals:
    """Gradients per worker, and the bytes a ring all-reduce of one message per round moves."""
    num_workers = self.strategy.num_workers
    message = float(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params)))
    steps = np.asarray(state.steps)
    per_round = 2.0 * (num_workers - 1)  # a ring all-reduce per round
    moved = per_round * int(state.event) * message
    if self.strategy.protocol == WorkerProtocol.LOCAL:  # each round moves its fragment, in the wire format
      moved = self._exchanged_bytes(state.params, int(state.event), per_round)
    return RunTotals(
      worker_steps=steps,
      worker_used=steps,
      worker_idle=np.zeros([num_workers]),
      bytes_moved=moved,
      bytes_moved_intra=0.0,
    )

  def _fragment_leaves(self, tree) -> list[list[int]]:
    """The leaf indices of each fragment (all of them with one fragment)."""
    fragments = self.strategy.exchange.fragments
    owner = diloco.fragment_of_leaves(tree, fragments) if fragments > 1 else [0] * len(jax.tree.leaves(tree))
    return [[i for i, p in enumerate(owner) if p == fragment] for fragment in range(fragments)]

  def _exchanged_bytes(self, params, rounds: int, per_round: float) -> float:
    """Bytes ``rounds`` local rounds moved: float32 as a ring all-reduce counts them, or exactly what the
    quantized collectives sent (the packed slices and their scales, padded to whole blocks)."""
    exchange = self.strategy.exchange
    if exchange.quantize is None:
      return sync_round.exchanged_bytes(self.strategy, params, rounds, per_round)
    sizes = [x.size for x in jax.tree.leaves(params)]
    per_fragment = [
      quantized_all_reduce.bytes_moved(
        [sizes[i] for i in leaves], exchange.quantize, exchange.quantize_block, self.strategy.num_workers
      )
      for leaves in self._fragment_leaves(params)
    ]
    return float(
      sum(b * n for b, n in zip(per_fragment, sync_round.rounds_per_fragment(rounds, len(per_fragment))))
    )

  def _mean_of_fragment(self, contribution, fragment: int, extra):
    """(``mean_k`` of the workers' pseudo-gradients: the fragment's leaves over the wire, zeros elsewhere;
    ``sum_k`` of ``extra``, a few scalars that travel with them)."""
    exchange, num_workers = self.strategy.exchange, self.strategy.num_workers
    leaves, treedef = jax.tree.flatten(contribution)
    picked = self._fragment_leaves(contribution)[fragment]
    sent = [leaves[i] for i in picked]
    if exchange.quantize is None:
      summed, extra = self._sum((sent, extra))
      mean = [x / num_workers for x in summed]
    else:  # a flat mesh: "groups" holds every worker ("members" is 1); the scalars cannot be quantized
      mean = quantized_all_reduce.quantized_mean(
        sent, exchange.quantize, exchange.quantize_block, "groups", num_workers
      )
      extra = self._sum(extra)
    out = [jnp.zeros_like(x) for x in leaves]
    for i, m in zip(picked, mean):
      out[i] = m
    return treedef.unflatten(out), extra

  # -- one round, compiled ----------------------------------------------------------------------

  def _gradient_round(self, s: SyncState, now, data: WorkerData):
    num_workers = self.strategy.num_workers

    def per_worker(params, steps, now, data):
      worker = self._worker_index()
      batch = data.batch(worker, steps[worker])
      # Each worker's share of the round's mean loss (the simulator's w_k = 1/K).
      loss, grads = jax.value_and_grad(lambda p: self.loss_fn(p, batch) / num_workers)(params)
      return self._sum((grads, loss, self._clock_share(now)))

    grads, loss, clock = jax.shard_map(
      per_worker, mesh=self.mesh, in_specs=(P(), P(), P(_AXES), P()), out_specs=P(), check_vma=False
    )(s.params, s.steps, now, data)
    update = sync_round.apply_aggregate(
      self.strategy, s.params, s.rule_state, grads, version=s.version, num_workers=num_workers
    )
    return update, loss, clock, s._replace(steps=s.steps + 1)

  def _local_round(self, s: SyncState, now, data: WorkerData, fragment: int):
    strategy = self.strategy
    num_workers = strategy.num_workers

    def per_worker(params, xs, states, steps, now, data):
      worker = self._worker_index()
      x, state = jax.tree.map(lambda a: a[0], (xs, states))
      work = sync_round.local_work(
        strategy, self.loss_fn, lambda t: data.batch(worker, t), params, x, state, steps[worker], fragment
      )
      extra = (jnp.mean(work.losses) / num_workers, self._clock_share(now))
      mean_delta, (loss, clock) = self._mean_of_fragment(work.contribution, fragment, extra)
      return mean_delta, loss, clock, jax.tree.map(lambda a: a[None], (work.model, work.worker_state))

    spec = P(_AXES)
    mean_delta, loss, clock, (models, worker_state) = jax.shard_map(
      per_worker,
      mesh=self.mesh,
      in_specs=(P(), spec, spec, P(), spec, P()),
      out_specs=(P(), P(), P(), spec),
      check_vma=False,
    )(s.params, s.worker_params, s.worker_state, s.steps, now, data)
    update = sync_round.outer_step(strategy, s.params, s.rule_state, mean_delta, fragment)
    worker_params = jax.vmap(lambda x: sync_round.mixed_model(strategy, update.params, x, fragment))(models)
    return (
      update,
      loss,
      clock,
      s._replace(
        steps=s.steps + strategy.local_steps, worker_params=worker_params, worker_state=worker_state
      ),
    )

  def _round_impl(self, s: SyncState, now, data: WorkerData, eval_arrays: list, *, fragment: int = 0):
    """One round (of ``fragment``, ``event mod P``); the training and held-out arrays are arguments, not
    constants folded into the program. ``now`` is ``[K]``, each process's wall clock on its workers; the
    round's exchange carries process 0's to every process."""
    if self.strategy.protocol == WorkerProtocol.LOCAL:
      update, loss, now, s = self._local_round(s, now, data, fragment)
    else:
      update, loss, now, s = self._gradient_round(s, now, data)
    version = s.version + update.finite.astype(jnp.int32)
    evaluated, metrics, next_eval = self.schedule.with_eval_arrays(eval_arrays).maybe_evaluate(
      s.next_eval, update.params, version, now, self.metric_names
    )
    new = s._replace(
      clock=now,
      params=update.params,
      rule_state=update.rule_state,
      version=version,
      next_eval=next_eval,
      event=s.event + 1,
    )
    record = sync_round.round_record(
      time=now,
      version=version,
      finite=update.finite,
      k=self.strategy.num_workers,
      loss=loss,
      evaluated=evaluated,
      metrics=metrics,
    )
    return new, record

  # -- the host loop ----------------------------------------------------------------------------

  def _global(self, state: SyncState) -> SyncState:
    """Process-local arrays -> arrays on the mesh (replicated; local models sharded by worker)."""
    per_worker = ("worker_params", "worker_state")
    return SyncState(
      **{name: self._on_mesh(x, per_worker=name in per_worker) for name, x in state._asdict().items()}
    )

  def _on_mesh(self, tree, *, per_worker: bool = False):
    """Process-local arrays (the same on every process) -> replicated on the mesh, or sliced by worker."""
    local = [i for i, d in enumerate(self.mesh.devices.reshape(-1)) if d.process_index == jax.process_index()]

    def put(x):
      x = np.asarray(x)
      if not per_worker:
        return jax.make_array_from_process_local_data(self._replicated, x, x.shape)
      return jax.make_array_from_process_local_data(self._per_worker, x[local], x.shape)

    return jax.tree.map(put, tree)

  def _local(self, tree):
    """Arrays on the mesh -> this process's copy (replicated values are the same on every process)."""

    def get(x):
      if x.sharding.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(get, tree)

  def advance(self, state: SyncState, num_events: int, *, max_time: float | None = None):
    """Runs ``num_events`` rounds on every process; returns (state, records)."""
    num_events = validation.check_int(_WHAT, "num_events", num_events)
    if max_time is not None:
      raise validation.invalid(
        _WHAT, "max_time", max_time, "None: the processes of a synchronous run must agree on when to stop"
      )
    self._ensure_prepared(state.params)
    if self._clock_offset is None:
      self._clock_offset = float(state.clock)
      self._started = time.perf_counter()
    s = self._global(state)
    if self._inputs is None:  # every process holds the same arrays: replicated on the mesh once
      self._inputs = self._on_mesh((self.data, self.schedule.eval_arrays()))
    rows, first, fragments = [], int(state.event), self.strategy.exchange.fragments
    if self._slowdown > 1.0 and self._delay is None:
      # On this process's own copy of the parameters: reading the mesh's worker-sharded models back
      # (local SGD's) would be a collective the other processes are not in.
      self._delay = (self._slowdown - 1.0) * self._round_compute(state.params)
    try:
      for i in range(num_events):
        if self._delay:
          time.sleep(self._delay)
        # This process's clock on its workers; the round's own exchange carries process 0's to every
        # process (time-based evaluation must decide the same everywhere): no collective of its own.
        now = np.full(
          [self._local_workers], self._clock_offset + time.perf_counter() - self._started, np.float32
        )
        after, row = self._round(
          s,
          jax.make_array_from_process_local_data(self._per_worker, now, (self.strategy.num_workers,)),
          *self._inputs,
          fragment=(first + i) % fragments,
        )
        # Waiting for one scalar waits for the round: a collective that failed raises here, ``s`` stays
        # the last round that completed, and the next round's clock starts when this one ends. The
        # records are read back once, at the chunk's end.
        jax.block_until_ready(row.time)
        rows.append(row)
        s = after
      local = self._local(s)
    except (jax.errors.JaxRuntimeError, ValueError) as err:
      # A collective whose peer died raises JaxRuntimeError from a compiled round; gloo's errors raised
      # on the host (a process_allgather) are ValueError ("UNKNOWN: Gloo all-reduce failed ..."):
      # both mean a lost process.
      if isinstance(err, ValueError) and not _collective_failed(err):
        raise
      lost = self._lost(err, int(state.event) + len(rows))
      lost.completed = self._completed(s, rows)
      raise lost from None
    self._rounds_done = int(local.event)
    return local, self._stack(rows)

  def _round_compute(self, params) -> float:
    """Seconds of this process's compute in a round, measured alone: the median of 5 gradients of its
    worker's batch (after one that compiles), times the local steps of a round."""
    step = jax.jit(jax.value_and_grad(self.loss_fn))
    batch = self.data.batch(self._my_worker, 0)
    times = []
    for _ in range(6):
      began = time.perf_counter()
      jax.block_until_ready(step(params, batch))
      times.append(time.perf_counter() - began)
    local = self.strategy.local_steps if self.strategy.protocol == WorkerProtocol.LOCAL else 1
    return float(np.median(times[1:])) * local

  @staticmethod
  def _stack(rows: list):
    """The rounds' records (on the mesh; replicated) as this process's ``[rounds, ...]`` arrays."""
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x.addressable_data(0)) for x in xs]), *rows)

  def _completed(self, s: SyncState, rows: list):
    """This process's copy of the last completed round's state and the records, without a collective.

    Replicated values are read from this process's devices. Local SGD's worker models equal the
    average after a round; the workers' optimizer states live on their own processes: a run whose
    worker rule keeps one (momentum) cannot be rebuilt here (None).
    """
    if not rows or jax.tree.leaves(s.worker_state):  # no round completed: the chunk's start is the host's
      return None
    try:
      replicated = {k: v for k, v in s._asdict().items() if k not in ("worker_params", "worker_state")}
      local = jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), replicated)
      worker_params = (
        stack_workers(local["params"], self.strategy.num_workers) if jax.tree.leaves(s.worker_params) else ()
      )
      local = SyncState(**local, worker_params=jax.tree.map(np.asarray, worker_params), worker_state=())
      return local, self._stack(rows)
    except Exception:  # noqa: BLE001 - a round's output that never completed: fall back to the last chunk
      return None

  def agree_to_stop(self, requested: bool) -> bool:
    """True on every process when any process asks (a preemption notice reaches one host, or all)."""
    try:
      votes = multihost_utils.process_allgather(np.int32(bool(requested)))
    except (jax.errors.JaxRuntimeError, ValueError) as err:
      if isinstance(err, ValueError) and not _collective_failed(err):
        raise
      # Between chunks: the rounds done are those of the last chunk, which the host loop saves.
      raise self._lost(err, self._rounds_done) from None
    return bool(np.any(votes))

  @staticmethod
  def fingerprint(params) -> str:
    """A hash of the parameters' bytes: equal on every process of a healthy synchronous run."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
      digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return digest.hexdigest()[:16]

  def _lost(self, err: Exception, rounds: int | None) -> ProcessLostError:
    """The error of a round (or a vote) that failed because a process is gone, naming it when the
    coordination service says which; ``writes_run`` in the survivor that writes the run in a lost process
    0's place (the lowest-numbered one: every survivor holds the same state of the completed rounds)."""
    gone: list[int] = []
    if self._liveness is not None:
      # get_live_nodes returns once every survivor asks (they all hit the failed collective) and the dead
      # are declared dead (a heartbeat timeout); a survivor blocked elsewhere must not hang this one: ask
      # in a thread. With several survivors the answer can take a minute: the checkpoint of the completed
      # rounds, and the restart, do not wait that long for a name (the launcher names the process).
      import threading

      answer: list = []
      asking = threading.Thread(target=lambda: answer.append(self._liveness()), daemon=True)
      asking.start()
      asking.join(timeout=_LIVENESS_WAIT + cluster.heartbeat_timeout())
      if answer:
        gone = sorted(set(range(jax.process_count())) - set(answer[0]))
    survivors = sorted(set(range(jax.process_count())) - set(gone))
    lost = f"process {', '.join(map(str, gone))} is lost; " if gone else ""
    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    after = "" if rounds is None else f" after {rounds} completed rounds"
    error = ProcessLostError(
      f"{lost}a synchronous round cannot complete without every process{after} ({first}). The completed "
      "rounds are in the run's checkpoint (process 0 writes it, or the first survivor when process 0 is "
      "the one lost); resume with `jaxsync resume RUN_DIR`, or let `jaxsync launch --max-restarts N` "
      "restart the run."
    )
    error.writes_run = 0 in gone and bool(survivors) and jax.process_index() == survivors[0]
    return error
