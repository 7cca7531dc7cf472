"""The asynchronous parameter server: the registry's server rule and dispatch policy on real arrivals.

Process 0 serves (or processes ``0 .. S-1``, each owning a slice of the
parameters: :mod:`shards`); every other process is one worker
(:mod:`ps_worker`). The server applies, per arrival, exactly what the
simulator applies per event:
the pure, jitted :func:`server_step.arrive` decides everything, this module
only moves messages and watches liveness. The clock differs (wall seconds
instead of simulated ones).

Planes:

* control, on the ``jax.distributed`` coordination service: the server
  publishes its data-plane address and the run token under ``jaxsync/``;
  liveness comes from heartbeats the workers write to its key-value store
  (``get_live_nodes`` is a barrier over the processes it names, which busy
  workers cannot join), so a worker killed with SIGKILL is noticed within the
  heartbeat timeout;
* data, on ZeroMQ (a ROUTER socket bound to the configured interface only):
  :mod:`wire` messages, received without a copy and checked field by field.

:class:`ParameterServer` implements the :class:`Runtime` interface, so
:func:`training.train` drives it as it drives the simulator: metrics, orbax
checkpoints, resume, summary and plots. Not thread-safe: one host loop owns it.
"""

from __future__ import annotations

import collections
import logging
import secrets
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import zmq
from jax.flatten_util import ravel_pytree

from jaxsync._src.core import validation
from jaxsync._src.distributed import node_aggregator, wire
from jaxsync._src.distributed.cluster import RunFaultError, heartbeat_timeout
from jaxsync._src.distributed.server import server_step, shards
from jaxsync._src.distributed.server.server_step import ServerState, ServerStep
from jaxsync._src.interface.history import RunTotals
from jaxsync._src.interface.runtime import RuntimeBase
from jaxsync._src.steps.records import EvalSchedule, EventRecord
from jaxsync._src.strategies.strategy import Engine, Strategy

log = logging.getLogger("jaxsync.server")

KEY_ADDRESS = shards.key_address(0)
KEY_TOKEN = "jaxsync/server/token"
_WHAT = "ParameterServer"


class WorkerLostError(RunFaultError):
  """Every worker process is gone: the run cannot go on."""


def serves(strategy: Strategy) -> bool:
  """Whether a multi-process run of ``strategy`` runs on this server (else on the multi-controller loop).

  Asynchronous strategies do; so do synchronous rounds that drop gradients
  (``fastest_k``), which a collective cannot cancel. Every other synchronous
  strategy all-reduces (``dist.SyncRuntime``).
  """
  if strategy.engine == Engine.ASYNC:
    return True
  return server_step.mode(strategy) == "rounds" and strategy.gradients_per_round < strategy.num_workers


def _check_protocol(strategy: Strategy) -> Strategy:
  if server_step.mode(strategy) is None:
    raise validation.invalid(
      _WHAT,
      "strategy",
      f"{strategy.name} (engine={strategy.engine!r}, protocol={strategy.protocol!r}, "
      f"communication={strategy.communication!r}, group_size={strategy.group_size})",
      "an asynchronous strategy (gradient or elastic: one worker, or one EA-wild group, per process), "
      "or a synchronous one whose workers talk to a parameter server, such as fastest_k (all-reduce "
      "and local SGD run on the multi-controller loop)",
    )
  return strategy


class ParameterServer(RuntimeBase):
  """Serves a strategy to worker processes over ZeroMQ, alone or as one of ``num_shards`` shard processes.

  Every message runs one pure step of :mod:`server_step`, compiled once, by
  the strategy's :func:`server_step.mode`: an asynchronous push through the
  server rule and the dispatch policy (:func:`server_step.arrive`), an
  elastic worker's local step or exchange (:func:`server_step.elastic_step`),
  or a gradient of a synchronous round that closes on its ``k``-th
  (:func:`server_step.round_arrive`, e.g. ``fastest_k``). Replies carry the
  parameters (SMEGA2's look-ahead estimate; the centre for elastic
  strategies), their version (the round's number in ``"rounds"`` mode), the
  worker's next data step and the noise ratio (BB). This class is the
  transport around it: the socket, message checks, liveness and the host loop.

  InHAD's workers push to their node's aggregator (:mod:`node_aggregator`),
  which reports each gradient's header here and keeps the gradient: the step
  runs on a zero message for every report but the one that completes a pull,
  which carries the pulled sum of all ``T`` (the rule's buffer adds zeros
  until then, so the released mean is the same). A node then holds each new
  version once (BROADCAST) and answers its workers with it on the server's word.

  Every change of the server's state is one :class:`shards.Command` applied
  by :meth:`_apply`. A sharded server (``num_shards > 1``, :mod:`shards`) runs
  one of these per shard process: shard 0 leads (it checks the workers'
  headers, watches liveness and decides each command, and sends it to the
  other shards before applying it), the others apply the leader's commands
  in its order, to their slice, and reply with it.

  Args:
    strategy: a strategy :func:`server_step.mode` serves; one worker process
      per worker (per EA-wild group: ``strategy.num_units``).
    eval_fn, eval_every, eval_every_time: evaluation, as for the simulator
      (``eval_every_time`` in wall seconds).
    bind: the interface to bind (``127.0.0.1`` by default: loopback only).
    port: 0 picks a free port.
    client: the coordination-service client (``None``: no control plane;
      the address and token are then read from :attr:`address` /
      :attr:`token` by the caller, e.g. a test or benchmark). A sharded
      server needs one.
    liveness: ``() -> set of live worker ids``; default with a ``client``:
      the workers' key-value heartbeats (:class:`cluster.HeartbeatMonitor`;
      worker ``k`` is process ``k + num_shards``), without one: every worker is live.
    idle_timeout: seconds without any message (and with live workers)
      before the server gives up on the run.
    advertise: the host workers connect to (published on the control plane);
      required when ``bind`` is every interface (``0.0.0.0``).
    num_shards: server processes (processes ``0 .. num_shards - 1``), each
      owning a slice of the parameters.
    shard: this process's shard (0 leads).

  Example:
    See ``tests/distributed/test_multiprocess.py``; ``jaxsync launch -n 3 configs/quickstart.yaml
    --set cluster.num_workers=2`` runs one, ``jaxsync launch -n 4 ... --set cluster.servers=2``
    a sharded one.
  """

  def __init__(
    self,
    strategy: Strategy,
    *,
    eval_fn=None,
    eval_every: int | None = None,
    eval_every_time: float | None = None,
    bind: str = "127.0.0.1",
    port: int = 0,
    client: Any = None,
    liveness=None,
    idle_timeout: float = 300.0,
    advertise: str | None = None,
    num_shards: int = 1,
    shard: int = 0,
  ):
    self.strategy = _check_protocol(strategy)
    self.mode = server_step.mode(strategy)
    super().__init__(eval_fn, eval_every, eval_every_time)
    self.num_workers = strategy.num_units  # worker processes: an EA-wild group is one
    self.idle_timeout = validation.check_real(_WHAT, "idle_timeout", idle_timeout, low=0.0, low_open=True)
    self.num_shards = validation.check_int(_WHAT, "num_shards", num_shards)
    self.shard = validation.check_int(_WHAT, "shard", shard, low=0)
    if self.shard >= self.num_shards:
      raise validation.invalid(_WHAT, "shard", shard, f"0 .. num_shards - 1 = {self.num_shards - 1}")
    if self.num_shards > 1 and client is None:
      raise validation.invalid(
        _WHAT, "client", client, "the coordination-service client: the shards find each other on it"
      )
    self.token = secrets.token_bytes(16)
    self._bind_to, self._port_wanted = bind, port
    if advertise is None and bind in ("0.0.0.0", "*", "::"):
      raise validation.invalid(
        _WHAT, "advertise", advertise, f"the host workers connect to when bind={bind!r}"
      )
    self._advertise = advertise
    self._socket = None
    self._commands: list = []  # the leader's PUSH socket to each other shard, or a follower's PULL socket
    self.address: str | None = None
    self._client = client
    if liveness is None and client is not None:
      # get_live_nodes is a barrier over the processes it names: the workers' heartbeats are one-sided.
      from jaxsync._src.distributed.cluster import HeartbeatMonitor

      monitor = HeartbeatMonitor(client)
      first = self.num_shards
      liveness = lambda: {p - first for p in monitor.live(range(first, first + self.num_workers))}  # noqa: E731
    self._liveness = liveness
    self._identity: dict[int, bytes] = {}
    self._worker_of: dict[bytes, int] = {}
    self._unsent: dict[int, list] = {}  # a follower's replies to workers whose HELLO it has not seen yet
    self.rejected_messages: collections.Counter[str] = collections.Counter()
    self.lost: list[dict[str, Any]] = []
    self._started = time.perf_counter()
    self._clock_offset, self._clock_started = 0.0, False
    self._last_liveness = 0.0
    self._state: ServerState | None = None
    self._mesh: shards.ShardedState | None = None
    self._nodes = _Nodes(strategy) if node_aggregator.aggregates(strategy) else None
    if self._nodes is not None and self.num_shards > 1:
      raise validation.invalid(
        _WHAT, "num_shards", num_shards, f"1 for {strategy.name} (its node aggregators pull from one server)"
      )
    self._deferred: collections.deque = collections.deque()  # messages that came during a pull

  @property
  def leads(self) -> bool:
    """Whether this process decides the run's events (a single server, or shard 0)."""
    return self.shard == 0

  def _open_socket(self, max_bytes: int) -> None:
    """Binds the data plane and publishes its address (and, leading, the run token) on the control plane."""
    socket = zmq.Context.instance().socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished worker raises, not vanishes
    socket.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a worker that reconnects keeps its identity
    # Set before bind (a listener copies its options): a longer frame is refused before it is read whole.
    socket.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    self._socket, self.address = socket, self._bind(socket)
    if self._client is None:
      return
    if not self.leads:
      self.token = self._client.blocking_key_value_get_bytes(KEY_TOKEN, 300_000)
      pull = zmq.Context.instance().socket(zmq.PULL)
      pull.setsockopt(zmq.LINGER, 0)
      self._client.key_value_set(shards.key_commands(self.shard), self._bind(pull), allow_overwrite=True)
      self._commands = [pull]
    self._client.key_value_set(shards.key_address(self.shard), self.address, allow_overwrite=True)
    if self.leads:
      self._client.key_value_set_bytes(KEY_TOKEN, self.token, allow_overwrite=True)
      for shard in range(1, self.num_shards):
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(self._client.blocking_key_value_get(shards.key_commands(shard), 300_000))
        self._commands.append(push)

  def _bind(self, socket) -> str:
    bind, port = self._bind_to, self._port_wanted if socket.type == zmq.ROUTER else 0
    if port == 0:
      port = socket.bind_to_random_port(f"tcp://{bind}")
    else:
      socket.bind(f"tcp://{bind}:{port}")
    return f"tcp://{self._advertise or bind}:{port}"

  # -- the runtime interface ------------------------------------------------------------------

  clock = "wall"

  def _prepare(self, params) -> None:
    super()._prepare(params)
    flat, unravel = ravel_pytree(params)
    self.count, self.dtype = int(flat.size), str(flat.dtype)
    leaf_dtypes = {str(x.dtype) for x in jax.tree.leaves(params)}
    if len(leaf_dtypes) != 1:
      raise validation.invalid(_WHAT, "params dtypes", sorted(leaf_dtypes), "one dtype for every leaf")
    self._unravel = unravel
    step_unravel = unravel
    if self.num_shards > 1:
      layout = shards.layout(self.count, self.num_shards)
      lo, hi = layout.bounds(self.shard)
      self._slice_count, self._slice_at = hi - lo, lo
      step_unravel = lambda padded: padded  # noqa: E731
      init_flat = lambda x: server_step.init(self.strategy, x, self.schedule)  # noqa: E731
      self._mesh = shards.ShardedState(init_flat, layout, shards.shard_devices(self.num_shards), flat.dtype)
      self._slots = {w: wire.aligned_zeros(layout.chunk, flat.dtype) for w in range(self.num_workers)}
      self._slot_headers: dict[int, tuple[int, int]] = {}
      chunk_bytes = layout.chunk * flat.dtype.itemsize
    else:
      self._slice_count, self._slice_at, chunk_bytes = self.count, 0, None
    max_bytes = wire.max_message_bytes(self._slice_count, self.dtype)
    if self._socket is None:
      self._open_socket(max_bytes)
      self._inbox = wire.Inbox(max_bytes, capacity=chunk_bytes)
    self._no_payload = self._payload(np.zeros([self._slice_count], flat.dtype))  # a local step's stand-in
    self._compile(step_unravel)

  def _schedule_with(self, eval_arrays: list) -> EvalSchedule:
    """The evaluation schedule inside a compiled step, the held-out arrays being its arguments."""
    schedule = self.schedule.with_eval_arrays(eval_arrays)
    if self._mesh is None or schedule.eval_fn is None:
      return schedule
    # The sharded step runs on the raveled parameters, padded: evaluation sees the model's tree.
    evaluate = schedule.eval_fn
    return schedule._replace(eval_fn=lambda padded: evaluate(self._unravel(padded[: self.count])))

  def _compile(self, unravel) -> None:
    """Jits this mode's steps and the state changes around them (on the shards' mesh, when sharded)."""
    mesh = self._mesh
    state_out = None if mesh is None else mesh.shardings
    step_out = None if mesh is None else ServerStep(*mesh.step_shardings)
    # The held-out set is an argument of the steps that evaluate, not a constant folded into each
    # compiled program (a copy of it per program, and a compile time that grows with it).
    arrays = self.schedule.eval_arrays()
    self._eval_arrays = arrays if mesh is None else [self._mesh_array(np.asarray(x)) for x in arrays]

    def jit(fn, out=state_out, **kwargs):
      return jax.jit(fn, **kwargs) if mesh is None else jax.jit(fn, out_shardings=out, **kwargs)

    def evaluating(step, out, *, donate: str = "state", **static):
      """``step(strategy, schedule, metric_names, unravel, state, *args)`` jitted, called as ``(state, *args)``.

      The held-out arrays are passed in on every call. ``donate``: ``"state"`` (updated in place),
      ``"all but params"`` or ``"nothing"``. A step that writes new parameters keeps its input's: a reply
      ZeroMQ may still be sending reads them (the parameters' own buffers, _host_reply), and JAX copies
      a donated buffer a NumPy view still reads (18 ms for 40 MB, against 4 ms for the step). A step
      that passes them through (an elastic local step, a round that stays open) donates them: kept,
      they would be copied to its output on every call.
      """

      def run(eval_arrays, state, *args):
        schedule = self._schedule_with(eval_arrays)
        return step(self.strategy, schedule, self.metric_names, unravel, state, *args, **static)

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

    if self.mode == "elastic":
      self._arrive = evaluating(server_step.elastic_step, step_out, donate="all but params", exchange=True)
      local_out = None if mesh is None else step_out._replace(reply=mesh.replicated)
      self._local_step = evaluating(server_step.elastic_step, local_out, exchange=False)
    elif self.mode == "rounds":
      self._arrive = evaluating(server_step.round_arrive, step_out)
      self._close_round = evaluating(server_step.close_round, step_out, donate="nothing")
    else:
      self._arrive = evaluating(server_step.arrive, step_out, donate="all but params")
    self._join = jit(server_step.join)
    self._drop = jit(server_step.drop)
    self._release = jit(
      server_step.release_waiting, None if mesh is None else (mesh.shardings, mesh.replicated)
    )
    self._late = jit(server_step.late)
    self._revive = jit(server_step.revive)
    self._reply_payload = jit(server_step.reply_payload, None if mesh is None else mesh.sliced)

  def init(self, params, seed: int = 0) -> ServerState:
    """The state before the first arrival: every worker will get ``params`` (version 0)."""
    del seed  # the real cluster has no jitter seed
    params = jax.tree.map(jnp.asarray, params)
    self._start(params)
    if self.num_shards > 1:  # the rule's state is that of the raveled parameters (see :mod:`shards`)
      state = server_step.init(self.strategy, ravel_pytree(params)[0], self.schedule)._replace(params=params)
    else:
      state = server_step.init(self.strategy, params, self.schedule)
    self._state = jax.tree.map(lambda x: jnp.array(x, copy=True), state)
    return self._state

  def totals(self, state: ServerState) -> RunTotals:
    """Per-worker pushes, accepted pushes and waiting seconds; bytes of every push and reply."""
    message = float(self.count * np.dtype(wire.numpy_dtype(self.dtype)).itemsize)
    moved, intra = float(state.inter_messages) * message, 0.0
    if self._nodes is not None:
      # Pushes and answers stay inside the nodes; the server's card moves the pulled sums and broadcasts
      # (counted since this server process started: a resumed run's earlier ones are not in it).
      moved, intra = self._nodes.payload_messages * message, moved
    return RunTotals(
      worker_steps=np.asarray(state.steps),
      worker_used=np.asarray(state.used),
      worker_idle=np.asarray(state.idle),
      bytes_moved=moved,
      bytes_moved_intra=intra,
    ).per_worker(self.strategy.workers_per_unit)

  def _to_device(self, state: ServerState) -> ServerState:
    """A host state (NumPy, e.g. restored) -> the step's: on the default device, or sliced over the shards."""
    if self._mesh is None:
      return jax.tree.map(jnp.asarray, state)
    return self._mesh.to_mesh(state._replace(params=ravel_pytree(state.params)[0]))

  def _to_host(self, state: ServerState) -> ServerState:
    """The step's state -> what ``advance`` returns (a sharded server's: gathered, the model's tree)."""
    if self._mesh is None:
      return state
    host = self._mesh.to_host(state)
    return host._replace(params=self._unravel(jnp.asarray(host.params)))

  # -- the host loop ----------------------------------------------------------------------------

  def _now(self) -> float:
    return self._clock_offset + time.perf_counter() - self._started

  def _send(self, worker: int, header: wire.Header, payload=None) -> None:
    if self._nodes is not None:
      payload = None  # a directive: the node answers with its copy of the version the header names
    identity = self._identity.get(worker)
    if identity is None:
      if not self.leads:  # its HELLO to this shard is on its way: the reply waits for it
        self._unsent[worker] = [header, None if payload is None else np.array(payload)]
      return
    try:
      self._socket.send_multipart([identity, *wire.encode(header, payload)], copy=False, flags=zmq.NOBLOCK)
    except zmq.ZMQError:  # gone (ROUTER_MANDATORY) or not reading (zmq.Again): liveness will tell
      log.warning("worker %d: reply not delivered (its connection is gone)", worker)

  def _params_header(self, state: ServerState, worker: int) -> wire.Header:
    # In rounds every worker computes the round's number-th batch (the simulator's round), sent or not.
    step = _host(state.event) if self.mode == "rounds" else _host(state.steps)[worker]
    return wire.Header(
      kind=wire.Kind.PARAMS,
      token=self.token,
      worker=worker,
      version=int(_host(state.pulled_version)[worker]),
      step=int(step),
      noise_ratio=float(_host(state.noise_ratio)[worker]),
      dtype=self.dtype,
      count=self._slice_count,
    )

  def _reply(self, state: ServerState, workers, reply) -> None:
    """Sends ``workers`` the step's ``reply`` (``None``: the parameters themselves)."""
    if self._nodes is not None:  # directives; the parameters cross only in a node's first copy of a version
      self._broadcast(int(_host(state.version)), state, reply)
      payload = None
    else:
      payload = self._host_reply(state, reply)
    for w in workers:
      self._send(int(w), self._params_header(state, int(w)), payload)

  def _host_reply(self, state: ServerState, reply) -> np.ndarray | list[np.ndarray]:
    """A reply's payload on the host: without a copy of the parameters (the step's ``reply`` is ``None``
    when it is them) on a CPU server, this shard's slice when sharded."""
    if self._mesh is not None:
      return self._mesh.local_slice(state.params if reply is None else reply, self.shard)
    if reply is None:  # the leaves, one frame each, in the order ravel_pytree lays them out
      return [np.asarray(leaf) for leaf in jax.tree.leaves(state.params)]
    return np.asarray(reply)

  def _reject(self, identity: bytes, reason: str, detail: str, worker: int | None) -> None:
    self.rejected_messages[reason] += 1
    who = f"worker {worker}" if worker is not None else "an unknown peer"
    log.warning("rejected a message from %s: %s (%s)", who, reason, detail)
    header = wire.Header(
      kind=wire.Kind.ERROR, token=self.token, worker=-1 if worker is None else worker, reason=reason
    )
    if reason in ("malformed", "token"):
      return  # not one of this run's processes: no answer to feed a flood
    try:
      self._socket.send_multipart([identity, *wire.encode(header)], copy=False, flags=zmq.NOBLOCK)
    except zmq.ZMQError:
      pass

  # -- every state change: one command ------------------------------------------------------------

  def _do(self, state: ServerState, command: shards.Command, payload=None):
    """Applies ``command`` (the leader sends it to the other shards first); returns (state, row or None)."""
    for socket in self._commands if self.leads else ():
      socket.send_multipart(command.encode())
    return self._apply(state, command, payload)

  def _apply(self, state: ServerState, command: shards.Command, payload=None):
    """One state change of the server, the same on every shard; replies with this shard's slice."""
    op, worker = command.op, command.worker
    row, now = None, self._scalar(command.now, np.float32)
    if op == shards.Op.ARRIVE:
      args = (self._scalar(worker, np.int32), payload, self._scalar(command.finite, np.bool_))
      args += (self._scalar(command.loss, np.float32),)
      if self.mode == "gradient":
        args += (self._scalar(command.step_size, np.float32),)
      state, row, send, reply = self._arrive(state, *args, now)
      send = self._last_send = np.asarray(_host(send))
      if send.any():
        self._reply(state, np.nonzero(send)[0], reply)
      elif self.mode == "rounds":
        row = None  # the round is still open: an event is a closed round
    elif op == shards.Op.LOCAL_STEP:  # an elastic worker's local step (back, with its own model, if lost)
      state = self._revive(state, self._scalar(worker, np.int32))
      flags = (self._scalar(command.finite, np.bool_), self._scalar(command.loss, np.float32))
      step = self._local_step(state, self._scalar(worker, np.int32), self._no_payload, *flags, now)
      state, row = step.state, step.record
    elif op == shards.Op.JOIN:
      state = self._join(state, self._scalar(worker, np.int32))
      self._reply(state, [worker], self._reply_payload(state))
    elif op == shards.Op.DROP:
      state = self._drop(state, self._mesh_array(command.gone(self.num_workers)))
    elif op == shards.Op.RELEASE:
      state, send = self._release(state, now)
      self._reply(state, np.nonzero(np.asarray(_host(send)))[0], self._reply_payload(state))
    elif op == shards.Op.CLOSE_ROUND:
      state, row, send, reply = self._close_round(state, now)
      self._reply(state, np.nonzero(np.asarray(_host(send)))[0], reply)
    elif op == shards.Op.LATE:
      state = self._late(state, self._scalar(worker, np.int32))
    self._state = state  # what stop() tells the waiting workers, even after an error
    return state, row

  def _scalar(self, value, dtype):
    return jnp.asarray(value, dtype) if self._mesh is None else self._mesh.scalar(value, dtype)

  def _mesh_array(self, value: np.ndarray):
    if self._mesh is None:
      return jnp.asarray(value)
    return jax.make_array_from_callback(value.shape, self._mesh.replicated, lambda index: value[index])

  def _payload(self, piece: np.ndarray):
    """A message's payload on the device: this shard's (padded) slice becomes its part of the whole."""
    if self._mesh is None:
      # The payload lives in the inbox until the next message: the step consumes it before that.
      return wire.to_device(piece)
    missing = self._mesh.layout.chunk - piece.size  # 0 for a piece from the inbox's padded view
    return self._mesh.slices({self.shard: np.pad(piece, (0, missing)) if missing else piece})

  def _check_liveness(self, state: ServerState, rows: list) -> ServerState:
    now = time.perf_counter()
    if now - self._last_liveness < 0.5:
      return state
    self._last_liveness = now
    live = self._live_workers()
    if live is None:
      return state
    was = np.asarray(_host(state.live))
    lost = [w for w in range(self.num_workers) if was[w] and w not in live]
    if self._nodes is not None:
      lost = self._nodes.with_their_nodes(lost, was)
    version = int(_host(state.version))
    for worker in lost:
      event = {
        "worker": worker,
        "process": worker + self.num_shards,
        "wall_time": self._now(),
        "version": version,
      }
      self.lost.append(event)
      log.warning(
        "worker %d (process %d) lost at %.1f s, server version %d; going on with %d worker(s)",
        worker,
        event["process"],
        event["wall_time"],
        version,
        int(was.sum()) - len(lost),
      )
    if lost:
      state, _ = self._do(
        state,
        shards.Command(
          shards.Op.DROP, mask=shards.Command.mask_of(np.isin(np.arange(self.num_workers), lost))
        ),
      )
      if not np.asarray(_host(state.live)).any():
        raise WorkerLostError(
          f"every worker process is lost (last: {', '.join(f'worker {w}' for w in lost)}); "
          f"the server stops at version {version}. Resume with `jaxsync resume RUN_DIR`."
        )
    if self.mode == "rounds":
      return self._close_if_complete(state, rows) if lost else state
    waiting, live_now = np.asarray(_host(state.waiting)), np.asarray(_host(state.live))
    if waiting.any() and not (live_now & ~waiting).any():  # server_step.stuck_on_lost_workers
      log.info("released %d waiting worker(s) that no live worker could release", int(waiting.sum()))
      state, _ = self._do(state, shards.Command(shards.Op.RELEASE, now=self._now()))
    return state

  def _close_if_complete(self, state: ServerState, rows: list) -> ServerState:
    """Closes the open round when the live workers it still waited for are lost (it has min(k, live))."""
    count, live = int(_host(state.exchange.count)), int(np.sum(_host(state.live)))
    if count == 0 or count < min(self.strategy.gradients_per_round, live):
      return state
    log.info(
      "closing round %d with %d gradient(s): the workers it waited for are lost",
      int(_host(state.event)),
      count,
    )
    state, row = self._do(state, shards.Command(shards.Op.CLOSE_ROUND, now=self._now()))
    rows.append(row)
    return state

  @property
  def dropped_gradients(self) -> int:
    """Messages never applied for coming too late: after their round closed, or from a worker declared lost."""
    return 0 if self._state is None else int(_host(self._state.dropped))

  def _live_workers(self) -> set[int] | None:
    if self._liveness is None:
      return None
    try:
      return set(self._liveness())
    except Exception as err:  # the service could not answer this time; ask again later
      log.warning("liveness query failed: %s", err)
      return None

  def advance(self, state: ServerState, num_events: int, *, max_time: float | None = None):
    """Serves until ``num_events`` more arrivals (or ``max_time`` wall seconds); returns (state, records).

    On a sharded server's other shards, until the leader's ``advance`` ends.
    """
    num_events = validation.check_int(_WHAT, "num_events", num_events)
    self._ensure_prepared(state.params)
    state = self._to_device(state)  # a restored state is NumPy (see checkpoints)
    if not self._clock_started:  # wall time counts from the first advance (after compiling and restoring)
      self._clock_offset, self._started, self._clock_started = (
        float(_host(state.clock)),
        time.perf_counter(),
        True,
      )
    rows: list[EventRecord] = []
    if self._nodes is not None:
      self._count_orphans(state)
    if self.leads:
      try:
        state = self._lead_sharded(state, rows, num_events, max_time)
      except BaseException as err:
        for socket in self._commands:  # the other shards stop with the leader's reason
          socket.send_multipart(
            shards.Command(shards.Op.ABORT, message=str(err) or type(err).__name__).encode()
          )
        raise
      for socket in self._commands:
        socket.send_multipart(shards.Command(shards.Op.END).encode())
    else:
      state = self._follow(state, rows)
    self._state = state
    if not rows:
      empty = jax.eval_shape(self._arrive, state, *self._placeholder_args()).record
      return self._to_host(state), jax.tree.map(lambda x: np.zeros((0, *x.shape), x.dtype), empty)
    rows = [jax.tree.map(_host, r) for r in rows]
    return self._to_host(state), jax.tree.map(lambda *xs: np.stack(xs), *rows)

  def _count_orphans(self, state: ServerState) -> None:
    """Gradients the rule's buffer counts that no node of this run holds: a checkpoint's, after a restart."""
    buffered = int(_host(optax.tree_utils.tree_get(state.rule_state, "accumulated_count")))
    orphans = buffered - int(self._nodes.counted.sum())
    if orphans != self._nodes.orphans:
      self._nodes.orphans = orphans
      log.warning(
        "%d gradient(s) counted before the checkpoint were held by the nodes of the run that wrote it; they "
        "count as zeros at the next pull",
        orphans,
      )

  def _placeholder_args(self, payload=None) -> tuple:
    """The arguments after the state of this mode's step: an empty message of worker 0 (or ``payload``)."""
    payload = self._no_payload if payload is None else self._payload(payload)
    args = (self._scalar(0, np.int32), payload, self._scalar(True, np.bool_), self._scalar(0.0, np.float32))
    if self.mode == "gradient":
      args += (self._scalar(0.0, np.float32),)
    return (*args, self._scalar(0.0, np.float32))

  def _lead_sharded(
    self, state: ServerState, rows: list, num_events: int, max_time: float | None
  ) -> ServerState:
    try:
      return self._lead(state, rows, num_events, max_time)
    except jax.errors.JaxRuntimeError as err:
      if self._mesh is None:
        raise
      # A step's all-reduce whose peer died: a shard process is lost.
      raise WorkerLostError(
        f"a server shard process is lost ({str(err).splitlines()[0]}); the server cannot go on without its "
        "slice of the parameters. Resume with `jaxsync resume RUN_DIR`."
      ) from None

  def _lead(self, state: ServerState, rows: list, num_events: int, max_time: float | None) -> ServerState:
    poller = zmq.Poller()
    poller.register(self._socket, zmq.POLLIN)
    quiet_since = time.perf_counter()
    while len(rows) < num_events:
      if max_time is not None and self._now() >= max_time:
        break
      state = self._check_liveness(state, rows)
      if self._deferred:
        state, row = self._handle(state, self._deferred.popleft())
        self._state = state
        if row is not None:
          rows.append(row)
        continue
      if not poller.poll(100):
        if time.perf_counter() - quiet_since > self.idle_timeout:
          raise WorkerLostError(
            f"no message for idle_timeout={self.idle_timeout} s from {int(np.sum(_host(state.live)))} live "
            "worker(s); the run is stuck. Resume with `jaxsync resume RUN_DIR`."
          )
        continue
      quiet_since = time.perf_counter()
      frames = self._inbox.receive(self._socket, routed=True)
      state, row = self._handle(state, frames)
      self._state = state
      if row is not None:
        rows.append(row)
    return state

  def _handle(self, state: ServerState, frames) -> tuple[ServerState, EventRecord | None]:
    """The leader's view of a worker's message: checked, then the command it makes (or a rejection)."""
    identity, worker = frames[0].bytes, self._worker_of.get(frames[0].bytes)
    if self._nodes is not None:
      worker = None  # a node speaks for several workers: only a checked header names one
    try:
      header, payload = self._decode(frames)
      if self._nodes is not None:  # every message comes through a node aggregator
        if header.kind == wire.Kind.NODE_HELLO:
          return self._node_hello(state, identity, header.worker), None
        if header.kind == wire.Kind.SUM:  # its pull gave up on it (see _pull): too late to apply
          self.rejected_messages["version"] += 1
          log.warning(
            "node %d's sum for pull %d came after that pull; dropped", header.worker, header.version
          )
          return state, None
        if not self._nodes.speaks_for(identity, header.worker):
          if identity in self._nodes.node_of_identity or header.kind == wire.Kind.REPORT:
            # A node that was declared lost, or speaks out of turn: the ERROR names the worker, so the node
            # discards its gradient and the worker stops saying why.
            worker = header.worker
          raise wire.MessageError(
            "worker", f"worker={header.worker} through a connection that is not its node's"
          )
        worker = header.worker
      if header.kind == wire.Kind.HELLO:
        return self._hello(state, identity, header.worker), None
      if worker != header.worker:
        raise wire.MessageError(
          "worker", f"worker={header.worker} from a connection registered as {worker!r}"
        )
      if header.kind == wire.Kind.BYE:
        log.info("worker %d left", worker)
        return self._do(state, shards.Command(shards.Op.DROP, mask=1 << worker))
      elastic_step = header.kind == wire.Kind.STEP and self.mode == "elastic"
      pushed = wire.Kind.PUSH if self._nodes is None else wire.Kind.REPORT
      if header.kind != pushed and not elastic_step:
        raise wire.MessageError("malformed", f"a {header.kind.name} message sent to a {self.mode} server")
      current = int(_host(state.event if self.mode == "rounds" else state.version))
      if header.version > current:
        raise wire.MessageError("future_version", f"version={header.version} but the server is at {current}")
      if self.mode == "rounds" and header.version < current:
        # Computed on a round that closed without it: dropped, never applied to another round. The
        # worker was sent the new round when it closed, so nothing is owed to it.
        return self._do(state, shards.Command(shards.Op.LATE, worker=worker))
      pulled = int(_host(state.pulled_version)[worker])
      if header.version != pulled:
        raise wire.MessageError("version", f"version={header.version} but worker {worker} was sent {pulled}")
    except wire.MessageError as err:
      self._reject(identity, err.reason, str(err), worker)
      return state, None
    if not bool(_host(state.live)[worker]) and not elastic_step:
      # Back after being declared lost (a stopped process, continued): the run went on without it, so
      # its pull is void and its message is dropped, not applied hundreds of versions late. It rejoins
      # as a worker that says HELLO: the current parameters, at its data step.
      log.info(
        "worker %d is back after it was declared lost: its message of version %d is dropped (the server is "
        "at %d); it rejoins",
        worker,
        header.version,
        int(_host(state.version)),
      )
      state, _ = self._do(state, shards.Command(shards.Op.LATE, worker=worker))
      if self._nodes is not None:  # its node discards the gradient it holds
        self._send(worker, wire.Header(kind=wire.Kind.DROP, token=self.token, worker=worker))
      return self._hello(state, identity, worker), None
    fields = dict(
      worker=worker, version=header.version, step=header.step, loss=header.loss, finite=header.finite,
      now=self._now(),
    )  # fmt: skip
    if elastic_step:
      return self._do(state, shards.Command(shards.Op.LOCAL_STEP, **fields))
    command = shards.Command(shards.Op.ARRIVE, step_size=header.step_size, **fields)
    if self._nodes is not None:
      return self._report(state, command)
    if self._mesh is not None:  # the inbox's whole buffer: the slice, then zeros to the shards' equal size
      payload = self._inbox.view(wire.numpy_dtype(self.dtype), self._mesh.layout.chunk)
    return self._do(state, command, self._payload(payload))

  def _decode(self, frames) -> tuple[wire.Header, np.ndarray | None]:
    """A routed message's header and payload (this shard's slice), checked field by field."""
    if len(frames) < 2:
      raise wire.MessageError("malformed", "an empty message")
    header = wire.decode_header(frames[1], token=self.token)
    payload = wire.decode_payload(header, frames[2:], dtype=self.dtype, count=self._slice_count)
    if not 0 <= header.worker < self.num_workers:
      raise wire.MessageError("worker", f"worker={header.worker}; expected 0..{self.num_workers - 1}")
    return header, payload

  def _hello(self, state: ServerState, identity: bytes, worker: int) -> ServerState:
    self._register(identity, worker)
    log.info(
      "worker %d joined at version %d, data step %d",
      worker,
      int(_host(state.version)),
      int(_host(state.steps)[worker]),
    )
    # A (re)joining worker is sent the current parameters; its earlier pull is void.
    return self._do(state, shards.Command(shards.Op.JOIN, worker=worker))[0]

  def _register(self, identity: bytes, worker: int) -> None:
    old = self._identity.get(worker)
    if old is not None and old != identity:
      self._worker_of.pop(old, None)
    self._identity[worker] = identity
    self._worker_of[identity] = worker

  # -- InHAD's node aggregators ----------------------------------------------------------------

  def _node_hello(self, state: ServerState, identity: bytes, node: int) -> ServerState:
    if not 0 <= node < self._nodes.count:
      raise wire.MessageError("worker", f"node={node}; expected 0..{self._nodes.count - 1}")
    self._nodes.register(identity, node)
    log.info("node %d's aggregator joined", node)
    self._broadcast(int(_host(state.version)), state, self._reply_payload(state))
    return state

  def _broadcast(self, version: int, state: ServerState, reply) -> None:
    """Every node that does not hold ``version`` yet gets it: one message per node per release."""
    nodes, payload = self._nodes, None
    for node in list(nodes.identity):
      if nodes.version.get(node) != version:
        payload = self._host_reply(state, reply) if payload is None else payload  # once, and only if sent
        header = wire.Header(kind=wire.Kind.BROADCAST, token=self.token, worker=node, version=version)
        if self._send_node(node, header, payload):
          nodes.version[node] = version
          nodes.payload_messages += 1

  def _send_node(self, node: int, header: wire.Header, payload=None) -> bool:
    try:
      self._socket.send_multipart(
        [self._nodes.identity[node], *wire.encode(header, payload)], copy=False, flags=zmq.NOBLOCK
      )
    except zmq.ZMQError:  # its process is gone (liveness will tell), or a blip ZeroMQ reconnects
      if node not in self._nodes.unreachable:
        log.warning("node %d: %s not delivered (its connection is gone)", node, header.kind.name)
      self._nodes.unreachable.add(node)
      return False
    self._nodes.unreachable.discard(node)
    return True

  def _report(self, state: ServerState, command: shards.Command):
    """A gradient its node holds: the step on a zero message, or on the pulled sum if it completes a pull.

    The rule's buffer adds zeros for the reports before, so the mean it
    releases is the pulled sum's over ``T`` (docs/algorithms.md §15).
    """
    nodes, worker = self._nodes, command.worker
    counted = bool(command.finite)  # the node's verdict; a NaN/Inf gradient is neither kept nor counted
    completes = counted and nodes.completes()
    payload = self._no_payload
    if counted:
      nodes.counted[node_aggregator.node_of(self.strategy, worker)] += 1
    hold = wire.Header(kind=wire.Kind.HOLD, token=self.token, worker=worker)
    if completes:
      self._send(worker, hold)  # into its node's sum before the pull that counts it
      payload = self._pull()
    state, row = self._do(state, command, payload)
    if completes and bool(_host(row.rejected)):
      # Finite gradients whose sum is not (an overflow): the rule rejected it, its T - 1 zeros stay counted.
      nodes.orphans = nodes.threshold - 1
      log.warning("pull %d: the pulled sum is not finite (an overflow); its gradients are lost", nodes.pulls)
    elif completes and not bool(_host(row.released)):
      raise RunFaultError(
        f"pull {nodes.pulls} did not release an update: the server's count of the nodes' gradients "
        "disagrees with its rule's (a bug; please report it)."
      )
    if counted and not completes and not self._last_send[worker]:
      self._send(worker, hold)
    return state, row

  def _pull(self):
    """InHAD's pull: every node that holds counted gradients sends their sum; returns the sum over nodes.

    A node that does not answer within the heartbeat timeout (its process
    stopped or lost) adds nothing: its gradients count as zeros in the mean.
    """
    nodes = self._nodes
    nodes.pulls += 1
    wanted = {}
    for node, count in enumerate(nodes.counted):
      pull = wire.Header(
        kind=wire.Kind.PULL, token=self.token, worker=node, version=nodes.pulls, step=int(count)
      )
      if count > 0 and node in nodes.identity and self._send_node(node, pull):
        wanted[node] = int(count)
    sums: dict[int, np.ndarray | None] = {}  # None: an answer that was rejected
    poller = zmq.Poller()
    poller.register(self._socket, zmq.POLLIN)
    started = time.perf_counter()
    while len(sums) < len(wanted) and self._still_pulling(started, set(wanted) - set(sums)):
      if poller.poll(100):
        frames = self._inbox.receive(self._socket, routed=True)
        if not self._take_sum(frames, wanted, sums):
          # Handled after the pull; a payload's frame is the inbox's, which the next sum overwrites.
          self._deferred.append(
            [f if isinstance(f, (zmq.Frame, wire.OversizedPayload)) else bytes(f) for f in frames]
          )
    sums = {node: got for node, got in sums.items() if got is not None}
    total = np.zeros([self.count], wire.numpy_dtype(self.dtype))
    for node in sorted(wanted):  # in node order: the same sum whatever order the nodes answered in
      if node in sums:
        np.add(total, sums[node], out=total)
    lost = nodes.orphans + int(nodes.counted.sum()) - sum(wanted[n] for n in sums)
    if lost:
      log.warning(
        "pull %d: %d gradient(s) were held by nodes that are lost, did not answer, or sent a sum it rejected; "
        "they count as zeros in its mean",
        nodes.pulls,
        lost,
      )
    nodes.counted[:], nodes.orphans = 0, 0
    nodes.payload_messages += len(sums)
    return self._payload(total)

  def _still_pulling(self, started: float, missing: set[int]) -> bool:
    """Whether to wait on for the ``missing`` nodes' sums: within the heartbeat timeout, and after it while
    every one of their aggregators' processes still beats (a large sum on a slow card), up to idle_timeout."""
    waited = time.perf_counter() - started
    if waited < heartbeat_timeout():
      return True
    if waited > self.idle_timeout:
      return False
    live = self._live_workers()
    return live is not None and all(node * self._nodes.size in live for node in missing)

  def _take_sum(self, frames, wanted: dict[int, int], sums: dict) -> bool:
    """Whether ``frames`` are a node's answer to the open pull (kept in ``sums`` when they check out)."""
    nodes = self._nodes
    try:
      header = wire.decode_header(frames[1], token=self.token) if len(frames) > 1 else None
    except wire.MessageError:
      return False  # _handle rejects it
    if header is None or header.kind != wire.Kind.SUM:
      return False
    node = nodes.node_of_identity.get(frames[0].bytes)
    try:
      if node not in wanted or header.version != nodes.pulls:
        raise wire.MessageError(
          "version", f"a sum for pull {header.version} from node {node} during pull {nodes.pulls}"
        )
      payload = wire.decode_payload(header, frames[2:], dtype=self.dtype, count=self.count)
      if header.step != wanted[node]:
        raise wire.MessageError(
          "shape", f"a sum of {header.step} gradient(s); the server counted {wanted[node]}"
        )
    except wire.MessageError as err:
      self.rejected_messages[err.reason] += 1
      log.warning("rejected a sum: %s", err)
      if node in wanted and header.version == nodes.pulls:
        sums[node] = None  # answered: the pull does not wait for it any longer
      return True
    sums[node] = np.array(payload)  # the inbox's buffer takes the next sum
    return True

  # -- a shard that follows the leader ------------------------------------------------------------

  def _follow(self, state: ServerState, rows: list) -> ServerState:
    """Applies the leader's commands until its ``advance`` ends; keeps the workers' slices as they come."""
    commands = self._commands[0]
    poller = zmq.Poller()
    poller.register(self._socket, zmq.POLLIN)
    poller.register(commands, zmq.POLLIN)
    quiet_since = time.perf_counter()
    while True:
      ready = dict(poller.poll(100))
      if self._socket in ready:
        self._keep(self._inbox.receive(self._socket, routed=True))
      if commands not in ready:
        if time.perf_counter() - quiet_since > self.idle_timeout:
          raise WorkerLostError(
            f"shard {self.shard}: no command from the leading shard (process 0) for "
            f"idle_timeout={self.idle_timeout} s; it is lost. Resume with `jaxsync resume RUN_DIR`."
          )
        continue
      quiet_since = time.perf_counter()
      command = shards.Command.decode(commands.recv_multipart())
      if command.op == shards.Op.END:
        return state
      if command.op == shards.Op.ABORT:
        raise WorkerLostError(f"shard {self.shard}: the leading shard stopped: {command.message}")
      payload = self._slice_for(command, poller) if command.op == shards.Op.ARRIVE else None
      state, row = self._apply(state, command, payload)
      if row is not None:
        rows.append(row)

  def _keep(self, frames) -> None:
    """A follower's view of a worker's message: HELLO registers it; a push's slice waits for its command."""
    identity, worker = frames[0].bytes, self._worker_of.get(frames[0].bytes)
    try:
      header, payload = self._decode(frames)
      if header.kind == wire.Kind.HELLO:
        self._register(identity, header.worker)
        waiting = self._unsent.pop(header.worker, None)
        if waiting is not None:
          self._send(header.worker, *waiting)
        return
      if worker != header.worker:
        raise wire.MessageError(
          "worker", f"worker={header.worker} from a connection registered as {worker!r}"
        )
      if header.kind != wire.Kind.PUSH:
        raise wire.MessageError("malformed", f"a {header.kind.name} message sent to shard {self.shard}")
    except wire.MessageError as err:
      self._reject(identity, err.reason, str(err), worker)
      return
    self._slots[worker][: payload.size] = payload
    self._slot_headers[worker] = (header.version, header.step)

  def _slice_for(self, command: shards.Command, poller) -> Any:
    """This shard's slice of the message the leader ordered applied: it came, or comes within the timeout.

    A slice that never comes (its worker died between its pushes to the
    shards) or was rejected here becomes NaN: the step's NaN/Inf check, global
    over the shards, rejects the whole message on every shard alike.
    """
    worker, wanted = command.worker, (command.version, command.step)
    deadline = time.perf_counter() + heartbeat_timeout()
    while self._slot_headers.get(worker) != wanted and time.perf_counter() < deadline:
      if self._socket in dict(poller.poll(100)):
        self._keep(self._inbox.receive(self._socket, routed=True))
    slot = self._slots[worker]
    if self._slot_headers.pop(worker, None) != wanted:
      log.warning(
        "shard %d: worker %d's slice of version %d never came: the message is rejected",
        self.shard,
        worker,
        command.version,
      )
      slot = np.full_like(slot, np.nan)
    return self._mesh.slices({self.shard: slot})

  def stop(self, *, timeout: float = 30.0) -> None:
    """Tells every worker the run is over (on its next message) and closes the socket.

    Waits up to ``timeout`` seconds for the live workers' last pushes; those
    are answered with STOP and not applied (the run's events are counted).
    The other shards of a sharded server close their sockets: the leader's STOP ends the workers.
    """
    if self._socket is None:
      return
    for socket in self._commands:
      socket.close(linger=1000)
    if not self.leads:
      self._socket.close(linger=0)
      return
    if self._nodes is not None:  # each node tells its workers
      for node in list(self._nodes.identity):
        self._send_node(node, wire.Header(kind=wire.Kind.STOP, token=self.token, worker=node))
      self._socket.close(linger=1000)
      return
    try:
      live_mask, waiting = np.asarray(_host(self._state.live)), np.asarray(_host(self._state.waiting))
    except (AttributeError, RuntimeError):  # no state yet, or one donated to a step that failed
      live_mask, waiting = np.ones(self.num_workers, bool), np.zeros(self.num_workers, bool)
    told = set()
    live = {w for w in range(self.num_workers) if live_mask[w] and w in self._identity}
    stop = wire.Header(kind=wire.Kind.STOP, token=self.token, worker=0)
    for worker in np.nonzero(waiting)[0]:
      self._send(int(worker), stop)
      told.add(int(worker))
    deadline = time.perf_counter() + timeout
    poller = zmq.Poller()
    poller.register(self._socket, zmq.POLLIN)
    while told < live and time.perf_counter() < deadline:
      if not poller.poll(100):
        alive = self._live_workers()
        if alive is not None:
          live &= alive
        continue
      frames = self._socket.recv_multipart(copy=False)
      worker = self._worker_of.get(frames[0].bytes)
      if worker is not None:
        self._send(worker, stop)
        told.add(worker)
    self._socket.close(linger=1000)


class _Nodes:
  """The server's side of InHAD's node aggregators: who they are, what they hold, what a pull takes.

  Attributes:
    size, count: workers per node (``W``) and nodes (``K / W``).
    threshold: ``T``, the gradients a pull takes (the rule's ``gradients_per_update``).
    identity, node_of_identity: each registered node's connection, both ways.
    version: the parameter version each node holds.
    counted: per node, the gradients the server counted since the last pull (``IN_n``).
    orphans: gradients in the rule's buffer no node holds (counted before a restart).
    pulls: pulls so far (a SUM names the pull it answers).
    payload_messages: sums pulled and broadcasts sent: the payloads on the server's card.
  """

  def __init__(self, strategy: Strategy):
    self.size = strategy.node_size
    self.count = strategy.num_workers // self.size
    self.threshold = int(strategy.gradients_per_update)
    self.identity: dict[int, bytes] = {}
    self.node_of_identity: dict[bytes, int] = {}
    self.version: dict[int, int] = {}
    self.counted = np.zeros([self.count], np.int64)
    self.orphans = 0
    self.pulls = 0
    self.payload_messages = 0
    self.unreachable: set[int] = set()  # nodes whose last message could not be sent (warned once)

  def register(self, identity: bytes, node: int) -> None:
    self.forget(node)
    self.identity[node], self.node_of_identity[identity] = identity, node

  def forget(self, node: int) -> None:
    """A node that is gone (or joins again): no more pulls or broadcasts go to its old connection."""
    self.node_of_identity.pop(self.identity.pop(node, b""), None)
    self.version.pop(node, None)

  def speaks_for(self, identity: bytes, worker: int) -> bool:
    """Whether the connection ``identity`` is worker ``worker``'s node's aggregator."""
    return self.node_of_identity.get(identity) == worker // self.size

  def completes(self) -> bool:
    """Whether one more counted gradient makes ``T``: the report that completes a pull."""
    return self.orphans + int(self.counted.sum()) + 1 >= self.threshold

  def with_their_nodes(self, lost: list[int], live: np.ndarray) -> list[int]:
    """``lost`` and, for a lost node's first worker (whose process runs the aggregator), its node's live workers."""
    out = list(lost)
    for worker in lost:
      if worker % self.size == 0:
        node = worker // self.size
        self.forget(node)
        out += [w for w in range(worker, worker + self.size) if live[w] and w not in out]
        held = int(self.counted[node])
        log.warning(
          "node %d's aggregator (in worker %d's process) is lost: its workers are dropped with it%s",
          node,
          worker,
          f"; the {held} gradient(s) it held count as zeros at the next pull" if held else "",
        )
    return sorted(out)


def _host(x) -> np.ndarray:
  """A (replicated) array's value on this host, without a computation the other shards would have to join."""
  if isinstance(x, jax.Array):
    return np.asarray(x.addressable_data(0))
  return np.asarray(x)
