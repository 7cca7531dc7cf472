"""The multi-controller synchronous loop: every process runs the same jitted round over a mesh.

Worker ``k`` is device ``k`` of the mesh (one CPU device per process; on a
GPU/TPU host, one per accelerator). A round is one jitted ``shard_map``:

.. math::

  g = \\sum_k \\tfrac{1}{K} \\nabla L(\\theta; \\text{batch}(k, t)), \\qquad
  \\theta, s \\leftarrow \\text{server\\_rule}(g, s, \\theta)

where the sum is a ``psum`` across processes (gloo on CPU) and, for
hierarchical all-reduce, two ``psum``s: inside each group of ``G`` workers,
then across the groups' results. The server rule then runs on every process
on the same reduced gradient, so the parameters stay bit-identical on every
process without a broadcast. Local SGD keeps each worker's model on its own
device and averages the models every ``local_steps``.

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
import optax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


from jaxsync._src.dist.cluster import RunFaultError
from jaxsync._src.steps.records import EvalSchedule, EventRecord
from jaxsync._src.sim.simulator import History, assemble_history
from jaxsync._src.strategies.registry import Strategy
from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.core import validation
from jaxsync._src.rules import guard

log = logging.getLogger("jaxsync.sync")
_WHAT = "SyncRuntime"
_AXES = ("groups", "members")


class ProcessLostError(RunFaultError):
  """A process of a synchronous run is gone: the round cannot complete."""


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


def check_strategy(strategy: Strategy, num_devices: int) -> Strategy:
  """Checks that ``strategy`` runs on this loop with ``num_devices`` workers; raises ValueError."""
  if strategy.engine != "sync":
    raise validation.invalid(_WHAT, "strategy", strategy.name, "a synchronous strategy (engine 'sync')")
  if strategy.gradients_per_round not in (None, strategy.num_workers):
    raise validation.invalid(
      _WHAT,
      "strategy",
      f"{strategy.name} (gradients_per_round={strategy.gradients_per_round})",
      "a strategy that aggregates every worker's gradient; dropping the slowest (fastest_k) needs "
      "cancellable collectives and runs in the simulator only",
    )
  if strategy.num_workers != num_devices:
    raise validation.invalid(
      _WHAT,
      "num_workers",
      strategy.num_workers,
      f"the number of devices in the run ({num_devices}: one worker per device)",
    )
  return strategy


class SyncRuntime:
  """Runs a synchronous strategy with one worker per device across processes.

  Args:
    strategy: ``bsp``, ``allreduce``, ``hierarchical_allreduce`` or ``local_sgd``.
    loss_fn: ``(params, batch) -> scalar``.
    data: the run's data, sharded over ``K`` workers (every process holds it).
    eval_fn, eval_every, eval_every_time: as for the simulator (wall seconds).
    devices: the mesh's devices (default: ``jax.devices()``, every process's).
    liveness: ``() -> set of live process ids`` used to name a lost process.

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
  ):
    devices = list(jax.devices() if devices is None else devices)
    self.strategy = check_strategy(strategy, len(devices))
    self.loss_fn, self.data = loss_fn, data
    self.schedule = EvalSchedule.make(eval_fn, eval_every, eval_every_time)
    groups = strategy.group_size if strategy.communication == "hierarchical" else 1
    self.mesh = Mesh(np.asarray(devices).reshape(strategy.num_workers // groups, groups), _AXES)
    self._hierarchical = groups > 1
    self._replicated = NamedSharding(self.mesh, P())
    self._per_worker = NamedSharding(self.mesh, P(_AXES))
    self._liveness = liveness
    self._evaluate = jax.jit(self.schedule.evaluate) if eval_fn is not None else None
    self._started = time.perf_counter()
    self._clock_offset: float | None = None

  # -- collectives ------------------------------------------------------------------------------

  def _sum(self, tree):
    """``sum_k x_k`` over the workers: one all-reduce, or two levels (inside groups, then across)."""
    if self._hierarchical:
      return jax.lax.psum(jax.lax.psum(tree, "members"), "groups")
    return jax.lax.psum(tree, _AXES)

  def _worker_index(self):
    return jax.lax.axis_index("groups") * self.mesh.shape["members"] + jax.lax.axis_index("members")

  # -- the simulator's interface ----------------------------------------------------------------

  def _prepare(self, params) -> None:
    self._metric_names = tuple(sorted(self.schedule.metric_shapes(params)))
    self._round = jax.jit(self._round_impl)

  def init(self, params, seed: int = 0) -> SyncState:
    """The state before the first round: every worker holds ``params``."""
    del seed
    params = jax.tree.map(jnp.asarray, params)
    self._prepare(params)
    self._initial_metrics = self._evaluate(params) if self._evaluate is not None else {}
    k = self.strategy.num_workers
    local = self.strategy.protocol == "local"
    stack = lambda tree: jax.tree.map(lambda x: jnp.broadcast_to(x, (k, *x.shape)), tree)  # noqa: E731
    state = SyncState(
      clock=jnp.zeros([], jnp.float32),
      params=params,
      rule_state=self.strategy.server_rule.init(params),
      version=jnp.zeros([], jnp.int32),
      steps=jnp.zeros([k], jnp.int32),
      worker_params=stack(params) if local else (),
      worker_state=stack(self.strategy.worker_rule.init(params)) if local else (),
      next_eval=self.schedule.first_due(),
      event=jnp.zeros([], jnp.int32),
    )
    return jax.tree.map(lambda x: jnp.array(x, copy=True), state)

  @property
  def initial_metrics(self) -> dict[str, float]:
    """The metrics of the parameters given to :meth:`init`."""
    return {name: float(v) for name, v in getattr(self, "_initial_metrics", {}).items()}

  def evaluate(self, params) -> dict[str, float]:
    """``eval_fn(params)`` as floats (``{}`` without one)."""
    if self._evaluate is None:
      return {}
    return {name: float(v) for name, v in self._evaluate(params).items()}

  def history(self, records: list[EventRecord], state: SyncState, *, initial_metrics=None) -> History:
    """A :class:`History` of the run (``time`` in wall seconds; bytes as a ring all-reduce moves them)."""
    k = self.strategy.num_workers
    message = float(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params)))
    rounds = sum(len(r.time) for r in records)
    steps = np.asarray(state.steps)
    return assemble_history(
      records,
      self.initial_metrics if initial_metrics is None else initial_metrics,
      self._metric_names,
      worker_steps=steps,
      worker_used=steps,
      worker_idle=np.zeros([k]),
      bytes_moved=2.0 * (k - 1) * rounds * message,  # a ring all-reduce per round
      bytes_moved_intra=0.0,
    )

  # -- one round, compiled ----------------------------------------------------------------------

  def _gradient_round(self, params, rule_state, version, steps):
    k = self.strategy.num_workers

    def per_worker(params, steps):
      worker = self._worker_index()
      batch = self.data.batch(worker, steps[worker])
      # Each worker's share of the round's mean loss (the simulator's w_k = 1/K).
      loss, grads = jax.value_and_grad(lambda p: self.loss_fn(p, batch) / k)(params)
      return self._sum(grads), self._sum(loss)

    grads, loss = jax.shard_map(
      per_worker, mesh=self.mesh, in_specs=(P(), P()), out_specs=(P(), P()), check_vma=False
    )(params, steps)
    finite = guard.tree_all_finite(grads)
    updates, rule_state = self.strategy.server_rule.update(
      grads, rule_state, params, version=version, num_live_workers=k, grads_finite=finite
    )
    return optax.apply_updates(params, updates), rule_state, loss, finite, steps + 1, (), ()

  def _local_round(self, params, rule_state, steps, worker_params, worker_state):
    strategy = self.strategy
    k = strategy.num_workers

    def per_worker(params, xs, states, steps):
      worker = self._worker_index()
      x, state = jax.tree.map(lambda a: a[0], (xs, states))

      def local_step(carry, _):
        x, state, step = carry
        loss, grads = jax.value_and_grad(self.loss_fn)(x, self.data.batch(worker, step))
        updates, state = strategy.worker_rule.update(grads, state, x)
        return (optax.apply_updates(x, updates), state, step + 1), loss

      (x, state, _), losses = jax.lax.scan(local_step, (x, state, steps[worker]), None, strategy.local_steps)
      mean_model = jax.tree.map(lambda m: m / k, self._sum(x))
      return mean_model, self._sum(jnp.mean(losses) / k), jax.tree.map(lambda a: a[None], state)

    spec = P(_AXES)
    mean_model, loss, worker_state = jax.shard_map(
      per_worker,
      mesh=self.mesh,
      in_specs=(P(), spec, spec, P()),
      out_specs=(P(), P(), spec),
      check_vma=False,
    )(params, worker_params, worker_state, steps)
    pseudo_grads = jax.tree.map(lambda p, m: (p - m).astype(p.dtype), params, mean_model)
    finite = guard.tree_all_finite(pseudo_grads)
    updates, rule_state = strategy.server_rule.update(pseudo_grads, rule_state, params, grads_finite=finite)
    params = optax.apply_updates(params, updates)
    xs = jax.tree.map(lambda x: jnp.broadcast_to(x, (k, *x.shape)), params)
    return params, rule_state, loss, finite, steps + strategy.local_steps, xs, worker_state

  def _round_impl(self, s: SyncState, now):
    if self.strategy.protocol == "local":
      params, rule_state, loss, finite, steps, xs, ws = self._local_round(
        s.params, s.rule_state, s.steps, s.worker_params, s.worker_state
      )
    else:
      params, rule_state, loss, finite, steps, xs, ws = self._gradient_round(
        s.params, s.rule_state, s.version, s.steps
      )
    version = s.version + finite.astype(jnp.int32)
    evaluated, metrics, next_eval = self.schedule.maybe_evaluate(
      s.next_eval, params, version, now, self._metric_names
    )
    new = SyncState(now, params, rule_state, version, steps, xs, ws, next_eval, s.event + 1)
    record = EventRecord(
      time=now,
      worker=jnp.asarray(-1, jnp.int32),
      staleness=jnp.asarray(0, jnp.int32),
      version=version,
      released=finite,
      k=jnp.where(finite, self.strategy.num_workers, 0).astype(jnp.int32),
      loss=jnp.asarray(loss, jnp.float32),
      rejected=~finite,
      step_size=jnp.asarray(jnp.nan, jnp.float32),
      evaluated=evaluated,
      metrics=metrics,
    )
    return new, record

  # -- the host loop ----------------------------------------------------------------------------

  def _global(self, state: SyncState) -> SyncState:
    """Process-local arrays -> arrays on the mesh (replicated; local models sharded by worker)."""

    def put(x, sharding):
      x = np.asarray(x)
      if sharding is self._replicated:
        return jax.make_array_from_process_local_data(sharding, x, x.shape)
      rows = [d.id for d in self.mesh.devices.reshape(-1)]
      local = [
        i for i, d in enumerate(self.mesh.devices.reshape(-1)) if d.process_index == jax.process_index()
      ]
      del rows
      return jax.make_array_from_process_local_data(sharding, x[local], x.shape)

    fields = state._asdict()
    out = {}
    for name, value in fields.items():
      sharding = self._per_worker if name in ("worker_params", "worker_state") else self._replicated
      out[name] = jax.tree.map(lambda x, sh=sharding: put(x, sh), value)
    return SyncState(**out)

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
    if not hasattr(self, "_round"):  # a state restored from a checkpoint
      self._prepare(state.params)
    if self._clock_offset is None:
      self._clock_offset = float(state.clock)
      self._started = time.perf_counter()
    s = self._global(state)
    rows = []
    try:
      for _ in range(num_events):
        # Process 0's clock for everyone: time-based evaluation must decide the same on every process.
        now = multihost_utils.broadcast_one_to_all(
          np.float32(self._clock_offset + time.perf_counter() - self._started)
        )
        s, row = self._round(s, jax.make_array_from_process_local_data(self._replicated, np.float32(now), ()))
        rows.append(jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), row))
      local = self._local(s)
    except jax.errors.JaxRuntimeError as err:
      raise ProcessLostError(self._lost_message(err)) from None
    return local, jax.tree.map(lambda *xs: np.stack(xs), *rows)

  @staticmethod
  def fingerprint(params) -> str:
    """A hash of the parameters' bytes: equal on every process of a healthy synchronous run."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
      digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return digest.hexdigest()[:16]

  def _lost_message(self, err: Exception) -> str:
    lost = ""
    if self._liveness is not None:
      # get_live_nodes returns once every survivor asks (they all hit the failed collective) or the
      # dead are declared dead; a survivor blocked elsewhere must not hang this one: ask in a thread.
      import threading

      answer: list = []
      asking = threading.Thread(target=lambda: answer.append(self._liveness()), daemon=True)
      asking.start()
      asking.join(timeout=60.0)
      if answer:
        gone = sorted(set(range(jax.process_count())) - set(answer[0]))
        if gone:
          lost = f"process {', '.join(map(str, gone))} is lost; "
    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    return (
      f"{lost}a synchronous round cannot complete without every process ({first}). "
      "Resume from the last checkpoint with `jaxsync resume RUN_DIR`."
    )
