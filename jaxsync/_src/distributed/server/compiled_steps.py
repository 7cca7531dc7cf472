"""The server's state changes, each a compiled :mod:`server_step` function, the host's counters kept in step.

The strategy's :func:`server_step.mode` picks the step a worker's message
runs; the other changes (a join, a drop, a release, a round closed, a late
message) are compiled too, on the shards' mesh when sharded. Each change
also updates :class:`counters.HostCounters`, from the counters the step
returns or from its known effect, so the host never reads the state to
check a message or to write a reply's header.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from jaxsync._src.distributed import wire
from jaxsync._src.distributed.server import counters, server_step, shards
from jaxsync._src.distributed.server.counters import HostCounters
from jaxsync._src.distributed.server.server_step import ServerState, ServerStep
from jaxsync._src.steps.records import EvalSchedule, EventRecord
from jaxsync._src.strategies.strategy import Strategy, WorkerProtocol


class CompiledSteps:
  """One server process's compiled steps, called with host values, and the counters they keep.

  Args:
    strategy: the strategy served; ``mode`` its :func:`server_step.mode`.
    schedule, metric_names: evaluation (its held-out arrays are the steps' arguments).
    unravel: raveled parameters -> the model's tree.
    count, dtype: the parameters' element count and dtype.
    mesh, shard: the shards' mesh and this process's shard (``None, 0``: a single server).

  Attributes:
    counters: the state's counters on the host (:meth:`track`).
    arrival_step: the compiled step of a worker's message: ``(state, *placeholder_args()) ->
      (ServerStep, packed counters)``; ``.lower`` lowers it.
    slice_count: the elements of a message this process receives (its shard's slice).
    no_payload: a message of zeros on the device (an elastic local step's stand-in).
  """

  def __init__(
    self,
    strategy: Strategy,
    mode: str,
    schedule: EvalSchedule,
    metric_names: tuple[str, ...],
    unravel,
    count: int,
    dtype,
    mesh: shards.ShardedState | None,
    shard: int,
  ):
    self._strategy, self._mode, self._schedule, self._metric_names = strategy, mode, schedule, metric_names
    self.strategy = strategy
    # Data steps a worker takes in one round: a local round's H, else one gradient's batch.
    self.round_steps = strategy.local_steps if strategy.protocol == WorkerProtocol.LOCAL else 1
    self._unravel, self._count, self._mesh, self._shard = unravel, count, mesh, shard
    self.counters: HostCounters | None = None
    lo, hi = (0, count) if mesh is None else mesh.layout.bounds(shard)
    self.slice_count = hi - lo
    self.no_payload = self.payload(np.zeros([self.slice_count], dtype))
    # The sharded step runs on the raveled parameters, padded (see :mod:`shards`).
    self._compile(unravel if mesh is None else lambda padded: padded)

  def _schedule_with(self, eval_arrays: list) -> EvalSchedule:
    """The evaluation schedule inside a compiled step, the held-out arrays being its arguments."""
    schedule = self._schedule.with_eval_arrays(eval_arrays)
    if self._mesh is None or schedule.eval_fn is None:
      return schedule
    # The sharded step runs on the raveled parameters, padded: evaluation sees the model's tree.
    evaluate = schedule.eval_fn
    return schedule._replace(eval_fn=lambda padded: evaluate(self._unravel(padded[: self._count])))

  def _compile(self, unravel) -> None:
    """Jits this mode's steps and the state changes around them (on the shards' mesh, when sharded)."""
    mesh = self._mesh
    state_out = None if mesh is None else mesh.shardings
    step_out = None if mesh is None else (ServerStep(*mesh.step_shardings), mesh.replicated)
    # The held-out set is an argument of the steps that evaluate, not a constant folded into each
    # compiled program (a copy of it per program, and a compile time that grows with it).
    arrays = self._schedule.eval_arrays()
    self._eval_arrays = arrays if mesh is None else [self._mesh_array(np.asarray(x)) for x in arrays]

    def jit(fn, out=state_out, **kwargs):
      return jax.jit(fn, **kwargs) if mesh is None else jax.jit(fn, out_shardings=out, **kwargs)

    def evaluating(step, out, *, donate: str = "state", **static):
      """``step(strategy, schedule, metric_names, unravel, state, *args)`` jitted, called as
      ``(state, *args)``; returns the step's :class:`ServerStep` and its new counters (:func:`counters.pack`).

      The held-out arrays are passed in on every call. ``donate``: ``"state"`` (updated in place),
      ``"all but params"`` or ``"nothing"``. A step that writes new parameters keeps its input's: a reply
      ZeroMQ may still be sending reads them (the parameters' own buffers, :meth:`host_reply`), and JAX
      copies a donated buffer a NumPy view still reads (18 ms for 40 MB, against 4 ms for the step). A step
      that passes them through (an elastic local step, a round that stays open) donates them: kept,
      they would be copied to its output on every call.
      """

      def run(eval_arrays, state, *args):
        schedule = self._schedule_with(eval_arrays)
        out = step(self._strategy, schedule, self._metric_names, unravel, state, *args, **static)
        return out, counters.pack(out.state, out.send)

      # The parameters are an argument of their own, so that they can be donated or kept apart.
      donated = {"state": (1, 2), "all but params": (2,), "nothing": ()}[donate]
      split = jit(
        lambda arrays, params, rest, *a: run(arrays, rest._replace(params=params), *a),
        out,
        donate_argnums=donated,
      )

      def arguments(state, *args):
        return (self._eval_arrays, state.params, state._replace(params=None), *args)

      call = lambda state, *args: split(*arguments(state, *args))  # noqa: E731
      call.lower = lambda state, *args: split.lower(*arguments(state, *args))
      return call

    if self._mode == "elastic":
      self.arrival_step = evaluating(
        server_step.elastic_step, step_out, donate="all but params", exchange=True
      )
      local_out = None if mesh is None else (step_out[0]._replace(reply=mesh.replicated), mesh.replicated)
      self._local_step = evaluating(server_step.elastic_step, local_out, exchange=False)
    elif self._mode == "rounds":
      self.arrival_step = evaluating(server_step.round_arrive, step_out)
      self._close_round = evaluating(server_step.close_round, step_out, donate="nothing")
    else:
      self.arrival_step = evaluating(server_step.arrive, step_out, donate="all but params")
    self._join = jit(server_step.join)
    self._drop = jit(server_step.drop)
    self._release = jit(
      _release_waiting, None if mesh is None else (state_out, mesh.replicated, mesh.replicated)
    )
    self._late = jit(functools.partial(server_step.late, self._strategy))
    self._revive = jit(server_step.revive)
    self._reply_payload = jit(server_step.reply_payload, None if mesh is None else mesh.sliced)

  # -- the state changes --------------------------------------------------------------------------

  def track(self, state: ServerState) -> None:
    """Reads the counters off ``state``, the one the next changes apply to (e.g. a restored one)."""
    self.counters = HostCounters.of(state)

  def arrive(self, state, worker: int, payload, *, finite: bool, loss: float, step_size: float, now: float):
    """A worker's message (its ``payload`` on the device: :meth:`payload`) through the mode's step.

    Returns:
      ``(state, record, send, reply)``: the record is None while a round stays open; ``send``, the
      workers to reply to (``bool[K]``, on the host); ``reply``, what they are sent (:class:`ServerStep`).
    """
    args = (
      self._scalar(worker, np.int32),
      payload,
      self._scalar(finite, np.bool_),
      self._scalar(loss, np.float32),
    )
    if self._mode == "gradient":
      args += (self._scalar(step_size, np.float32),)
    (state, row, _, reply), packed = self.arrival_step(state, *args, self._scalar(now, np.float32))
    send = self.counters.take(packed)
    if self._mode == "rounds" and not send.any():
      row = None  # the round is still open: an event is a closed round
    return state, row, send, reply

  def local_step(self, state, worker: int, *, finite: bool, loss: float, now: float):
    """An elastic worker's local step (back, with its own model, if it was declared lost); (state, record)."""
    state = self._revive(state, self._scalar(worker, np.int32))
    flags = (self._scalar(finite, np.bool_), self._scalar(loss, np.float32))
    step, packed = self._local_step(
      state, self._scalar(worker, np.int32), self.no_payload, *flags, self._scalar(now, np.float32)
    )
    self.counters.take(packed)
    return step.state, step.record

  def join(self, state, worker: int, *, wait: bool = False, now: float = 0.0) -> ServerState:
    """Worker ``worker`` (re)joins: it is live and will be sent the current parameters (with ``wait``, at
    the open round's close: :func:`server_step.joins_next_round`)."""
    state = self._join(
      state, self._scalar(worker, np.int32), self._scalar(wait, np.bool_), self._scalar(now, np.float32)
    )
    self.counters.join(worker, rounds=self._mode == "rounds", wait=wait)
    return state

  def drop(self, state, gone: np.ndarray) -> ServerState:
    """Workers ``gone`` (``bool[K]``) left or were lost."""
    state = self._drop(state, self._mesh_array(gone))
    self.counters.drop(gone, rounds=self._mode == "rounds")
    return state

  def release(self, state, now: float) -> tuple[ServerState, np.ndarray]:
    """Every waiting worker is sent the current parameters; returns (state, the workers to reply to)."""
    state, _, packed = self._release(state, self._scalar(now, np.float32))
    return state, self.counters.take(packed)

  def close_round(self, state, now: float):
    """The open round closes with the gradients it has; returns (state, record, send, reply), as
    :meth:`arrive` does."""
    (state, row, _, reply), packed = self._close_round(state, self._scalar(now, np.float32))
    return state, row, self.counters.take(packed), reply

  def late(self, state, worker: int) -> ServerState:
    """A message of ``worker`` that is never applied: counted, its data steps spent."""
    state = self._late(state, self._scalar(worker, np.int32))
    self.counters.late(worker, int(server_step.data_steps(self._strategy, worker)))
    return state

  # -- values in and out ----------------------------------------------------------------------------

  def _scalar(self, value, dtype):
    return jnp.asarray(value, dtype) if self._mesh is None else self._mesh.scalar(value, dtype)

  def _mesh_array(self, value: np.ndarray):
    if self._mesh is None:
      return jnp.asarray(value)
    return jax.make_array_from_callback(value.shape, self._mesh.replicated, lambda index: value[index])

  def payload(self, piece: np.ndarray):
    """A message's payload on the device: this shard's (padded) slice becomes its part of the whole."""
    if self._mesh is None:
      # The payload lives in the inbox until the next message: the step consumes it before that.
      return wire.to_device(piece)
    missing = self._mesh.layout.chunk - piece.size  # 0 for a piece from the inbox's padded view
    return self._mesh.slices({self._shard: np.pad(piece, (0, missing)) if missing else piece})

  def placeholder_args(self, payload=None) -> tuple:
    """The arguments after the state of this mode's step: an empty message of worker 0 (or ``payload``)."""
    payload = self.no_payload if payload is None else self.payload(payload)
    args = (self._scalar(0, np.int32), payload, self._scalar(True, np.bool_), self._scalar(0.0, np.float32))
    if self._mode == "gradient":
      args += (self._scalar(0.0, np.float32),)
    return (*args, self._scalar(0.0, np.float32))

  def no_records(self, state) -> EventRecord:
    """Records of no event: each field empty along its first axis."""
    empty = jax.eval_shape(self.arrival_step, state, *self.placeholder_args())[0].record
    return jax.tree.map(lambda x: np.zeros((0, *x.shape), x.dtype), empty)

  def reply_payload(self, state):
    """What a worker is sent besides the parameters themselves (:func:`server_step.reply_payload`)."""
    return self._reply_payload(state)

  def host_reply(self, state: ServerState, reply) -> np.ndarray | list[np.ndarray]:
    """A reply's payload on the host: without a copy of the parameters (the step's ``reply`` is ``None``
    when it is them) on a CPU server, this shard's slice when sharded."""
    if self._mesh is not None:
      return self._mesh.local_slice(state.params if reply is None else reply, self._shard)
    if reply is None:  # the leaves, one frame each, in the order ravel_pytree lays them out
      return [np.asarray(leaf) for leaf in jax.tree.leaves(state.params)]
    return np.asarray(reply)

  def to_device(self, state: ServerState) -> ServerState:
    """A host state (NumPy, e.g. restored) -> the step's: on the default device, or sliced over the shards."""
    if self._mesh is None:
      return jax.tree.map(jnp.asarray, state)
    return self._mesh.to_mesh(state._replace(params=ravel_pytree(state.params)[0]))

  def to_host(self, state: ServerState) -> ServerState:
    """The step's state -> what ``advance`` returns (a sharded server's: gathered, the model's tree)."""
    if self._mesh is None:
      return state
    host = self._mesh.to_host(state)
    return host._replace(params=self._unravel(jnp.asarray(host.params)))


def _release_waiting(state: ServerState, now: jax.Array) -> tuple[ServerState, jax.Array, jax.Array]:
  """:func:`server_step.release_waiting`, and its new counters (:func:`counters.pack`)."""
  state, send = server_step.release_waiting(state, now)
  return state, send, counters.pack(state, send)
