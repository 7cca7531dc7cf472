"""The asynchronous parameter server: the registry's server rule and dispatch policy on real arrivals.

Process 0 serves; every other process is one worker (:mod:`ps_worker`). The
server applies, per arrival, exactly what the simulator applies per event:
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
import functools
import logging
import secrets
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import zmq
from jax.flatten_util import ravel_pytree

from jaxsync._src.core import validation
from jaxsync._src.dist import wire
from jaxsync._src.dist.cluster import RunFaultError
from jaxsync._src.runtime.history import RunTotals
from jaxsync._src.runtime.interface import RuntimeBase
from jaxsync._src.steps import server_step
from jaxsync._src.steps.records import EventRecord
from jaxsync._src.steps.server_step import ServerState
from jaxsync._src.strategies.strategy import Engine, Strategy

log = logging.getLogger("jaxsync.server")

KEY_ADDRESS = "jaxsync/server/address"
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
      "an asynchronous strategy (gradient or elastic, one worker per process), or a synchronous one "
      "whose workers talk to a parameter server, such as fastest_k (all-reduce and local SGD run on "
      "the multi-controller loop; EA-wild's synchronous groups run in the simulator only)",
    )
  return strategy


class ParameterServer(RuntimeBase):
  """Serves a strategy to worker processes over ZeroMQ.

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

  Args:
    strategy: a strategy :func:`server_step.mode` serves; one worker process
      per ``strategy.num_workers``.
    eval_fn, eval_every, eval_every_time: evaluation, as for the simulator
      (``eval_every_time`` in wall seconds).
    bind: the interface to bind (``127.0.0.1`` by default: loopback only).
    port: 0 picks a free port.
    client: the coordination-service client (``None``: no control plane;
      the address and token are then read from :attr:`address` /
      :attr:`token` by the caller, e.g. a test or benchmark).
    liveness: ``() -> set of live worker ids``; default with a ``client``:
      the workers' key-value heartbeats (:class:`cluster.HeartbeatMonitor`;
      worker ``k`` is process ``k + 1``), without one: every worker is live.
    idle_timeout: seconds without any message (and with live workers)
      before the server gives up on the run.
    advertise: the host workers connect to (published on the control plane);
      required when ``bind`` is every interface (``0.0.0.0``).

  Example:
    See ``tests/test_multiprocess.py``; ``jaxsync launch -n 3 configs/quickstart.yaml
    --set cluster.num_workers=2`` runs one.
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
  ):
    self.strategy = _check_protocol(strategy)
    self.mode = server_step.mode(strategy)
    super().__init__(eval_fn, eval_every, eval_every_time)
    self.num_workers = strategy.num_workers
    self.idle_timeout = validation.check_real(_WHAT, "idle_timeout", idle_timeout, low=0.0, low_open=True)
    self.token = secrets.token_bytes(16)
    self._bind_to, self._port_wanted = bind, port
    if advertise is None and bind in ("0.0.0.0", "*", "::"):
      raise validation.invalid(
        _WHAT, "advertise", advertise, f"the host workers connect to when bind={bind!r}"
      )
    self._advertise = advertise
    self._socket = None
    self.address: str | None = None
    self._client = client
    if liveness is None and client is not None:
      # get_live_nodes is a barrier over the processes it names: the workers' heartbeats are one-sided.
      from jaxsync._src.dist.cluster import HeartbeatMonitor

      monitor = HeartbeatMonitor(client)
      liveness = lambda: {p - 1 for p in monitor.live(range(1, self.num_workers + 1))}  # noqa: E731
    self._liveness = liveness
    self._identity: dict[int, bytes] = {}
    self._worker_of: dict[bytes, int] = {}
    self.rejected_messages: collections.Counter[str] = collections.Counter()
    self.lost: list[dict[str, Any]] = []
    self._started = time.perf_counter()
    self._clock_offset, self._clock_started = 0.0, False
    self._last_liveness = 0.0
    self._state: ServerState | None = None

  def _open_socket(self, max_bytes: int) -> None:
    """Binds the data plane and publishes its address and the run token on the control plane."""
    socket = zmq.Context.instance().socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished worker raises, not vanishes
    socket.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a worker that reconnects keeps its identity
    # Set before bind (a listener copies its options): a longer frame is refused before it is read whole.
    socket.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    bind, port = self._bind_to, self._port_wanted
    if port == 0:
      port = socket.bind_to_random_port(f"tcp://{bind}")
    else:
      socket.bind(f"tcp://{bind}:{port}")
    self._socket, self.address = socket, f"tcp://{self._advertise or bind}:{port}"
    if self._client is not None:
      self._client.key_value_set(KEY_ADDRESS, self.address, allow_overwrite=True)
      self._client.key_value_set_bytes(KEY_TOKEN, self.token, allow_overwrite=True)

  # -- the runtime interface ------------------------------------------------------------------

  clock = "wall"

  def _prepare(self, params) -> None:
    super()._prepare(params)
    flat, unravel = ravel_pytree(params)
    self.count, self.dtype = int(flat.size), str(flat.dtype)
    leaf_dtypes = {str(x.dtype) for x in jax.tree.leaves(params)}
    if len(leaf_dtypes) != 1:
      raise validation.invalid(_WHAT, "params dtypes", sorted(leaf_dtypes), "one dtype for every leaf")
    if self._socket is None:
      self._open_socket(wire.max_message_bytes(self.count, self.dtype))
      self._inbox = wire.Inbox(wire.max_message_bytes(self.count, self.dtype))
    self._no_payload = jnp.zeros([self.count], self.dtype)  # a local step's stand-in (never read)
    fixed = (self.strategy, self.schedule, self.metric_names, unravel)
    if self.mode == "elastic":
      self._arrive = jax.jit(
        functools.partial(server_step.elastic_step, *fixed, exchange=True), donate_argnums=0
      )
      self._local_step = jax.jit(
        functools.partial(server_step.elastic_step, *fixed, exchange=False), donate_argnums=0
      )
    elif self.mode == "rounds":
      self._arrive = jax.jit(functools.partial(server_step.round_arrive, *fixed), donate_argnums=0)
      self._close_round = jax.jit(functools.partial(server_step.close_round, *fixed))
    else:
      self._arrive = jax.jit(functools.partial(server_step.arrive, *fixed), donate_argnums=0)

  def init(self, params, seed: int = 0) -> ServerState:
    """The state before the first arrival: every worker will get ``params`` (version 0)."""
    del seed  # the real cluster has no jitter seed
    params = jax.tree.map(jnp.asarray, params)
    self._start(params)
    state = server_step.init(self.strategy, params, self.schedule)
    self._state = jax.tree.map(lambda x: jnp.array(x, copy=True), state)
    return self._state

  def totals(self, state: ServerState) -> RunTotals:
    """Per-worker pushes, accepted pushes and waiting seconds; bytes of every push and reply."""
    message = float(self.count * np.dtype(wire.numpy_dtype(self.dtype)).itemsize)
    return RunTotals(
      worker_steps=np.asarray(state.steps),
      worker_used=np.asarray(state.used),
      worker_idle=np.asarray(state.idle),
      bytes_moved=float(state.inter_messages) * message,
      bytes_moved_intra=0.0,
    )

  # -- the host loop ----------------------------------------------------------------------------

  def _now(self) -> float:
    return self._clock_offset + time.perf_counter() - self._started

  def _send(self, worker: int, header: wire.Header, payload=None) -> None:
    identity = self._identity.get(worker)
    if identity is None:
      return
    try:
      self._socket.send_multipart([identity, *wire.encode(header, payload)], copy=False, flags=zmq.NOBLOCK)
    except zmq.ZMQError:  # gone (ROUTER_MANDATORY) or not reading (zmq.Again): liveness will tell
      log.warning("worker %d: reply not delivered (its connection is gone)", worker)

  def _params_header(self, state: ServerState, worker: int) -> wire.Header:
    # In rounds every worker computes the round's number-th batch (the simulator's round), sent or not.
    step = state.event if self.mode == "rounds" else state.steps[worker]
    return wire.Header(
      kind=wire.Kind.PARAMS,
      token=self.token,
      worker=worker,
      version=int(state.pulled_version[worker]),
      step=int(step),
      noise_ratio=float(state.noise_ratio[worker]),
      dtype=self.dtype,
      count=self.count,
    )

  def _reply(self, state: ServerState, workers, reply_flat) -> None:
    payload = np.asarray(reply_flat)
    for w in workers:
      self._send(int(w), self._params_header(state, int(w)), payload)

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

  def _check_liveness(self, state: ServerState, rows: list) -> ServerState:
    now = time.perf_counter()
    if now - self._last_liveness < 0.5:
      return state
    self._last_liveness = now
    live = self._live_workers()
    if live is None:
      return state
    was = np.asarray(state.live)
    lost = [w for w in range(self.num_workers) if was[w] and w not in live]
    for worker in lost:
      event = {
        "worker": worker,
        "process": worker + 1,
        "wall_time": self._now(),
        "version": int(state.version),
      }
      self.lost.append(event)
      log.warning(
        "worker %d (process %d) lost at %.1f s, server version %d; going on with %d worker(s)",
        worker,
        worker + 1,
        event["wall_time"],
        event["version"],
        int(was.sum()) - len(lost),
      )
    if lost:
      gone = np.zeros(self.num_workers, bool)
      gone[lost] = True
      state = server_step.drop(state, jnp.asarray(gone))
      if not bool(np.asarray(state.live).any()):
        raise WorkerLostError(
          f"every worker process is lost (last: {', '.join(f'worker {w}' for w in lost)}); "
          f"the server stops at version {int(state.version)}. Resume with `jaxsync resume RUN_DIR`."
        )
    if self.mode == "rounds":
      return self._close_if_complete(state, rows) if lost else state
    if bool(server_step.stuck_on_lost_workers(state)):
      state, send = server_step.release_waiting(state, jnp.float32(self._now()))
      workers = np.nonzero(np.asarray(send))[0]
      log.info("released %d waiting worker(s) that no live worker could release", len(workers))
      self._reply(state, workers, server_step.reply_payload(state))
    return state

  def _close_if_complete(self, state: ServerState, rows: list) -> ServerState:
    """Closes the open round when the live workers it still waited for are lost (it has min(k, live))."""
    count, live = int(state.exchange.count), int(np.sum(state.live))
    if count == 0 or count < min(self.strategy.gradients_per_round, live):
      return state
    log.info(
      "closing round %d with %d gradient(s): the workers it waited for are lost", int(state.event), count
    )
    state, row, send, reply = self._close_round(state, jnp.float32(self._now()))
    rows.append(row)
    self._reply(state, np.nonzero(np.asarray(send))[0], reply)
    return state

  @property
  def dropped_gradients(self) -> int:
    """Messages never applied for coming too late: after their round closed, or from a worker declared lost."""
    return 0 if self._state is None else int(np.asarray(self._state.dropped))

  def _live_workers(self) -> set[int] | None:
    if self._liveness is None:
      return None
    try:
      return set(self._liveness())
    except Exception as err:  # the service could not answer this time; ask again later
      log.warning("liveness query failed: %s", err)
      return None

  def advance(self, state: ServerState, num_events: int, *, max_time: float | None = None):
    """Serves until ``num_events`` more arrivals (or ``max_time`` wall seconds); returns (state, records)."""
    num_events = validation.check_int(_WHAT, "num_events", num_events)
    state = jax.tree.map(jnp.asarray, state)  # a restored state is NumPy (see checkpoints)
    self._ensure_prepared(state.params)
    if not self._clock_started:  # wall time counts from the first advance (after compiling and restoring)
      self._clock_offset, self._started, self._clock_started = float(state.clock), time.perf_counter(), True
    rows: list[EventRecord] = []
    poller = zmq.Poller()
    poller.register(self._socket, zmq.POLLIN)
    quiet_since = time.perf_counter()
    while len(rows) < num_events:
      if max_time is not None and self._now() >= max_time:
        break
      state = self._check_liveness(state, rows)
      if not poller.poll(100):
        if time.perf_counter() - quiet_since > self.idle_timeout:
          raise WorkerLostError(
            f"no message for idle_timeout={self.idle_timeout} s from {int(np.sum(state.live))} live "
            "worker(s); the run is stuck. Resume with `jaxsync resume RUN_DIR`."
          )
        continue
      quiet_since = time.perf_counter()
      frames = self._inbox.receive(self._socket, routed=True)
      state, row = self._handle(state, frames)
      self._state = state  # what stop() tells the waiting workers, even after an error
      if row is not None:
        rows.append(row)
    if not rows:
      empty = jax.eval_shape(
        self._arrive, state, *self._arrival_args(0, np.zeros([self.count], self.dtype))
      ).record
      self._state = state
      return state, jax.tree.map(lambda x: np.zeros((0, *x.shape), x.dtype), empty)
    self._state = state
    rows = [jax.device_get(r) for r in rows]
    return state, jax.tree.map(lambda *xs: np.stack(xs), *rows)

  def _arrival_args(self, worker: int, payload, header: wire.Header | None = None) -> tuple:
    """The arguments after the state of this mode's step, from a message (or placeholders)."""
    finite = True if header is None else header.finite
    loss = 0.0 if header is None else header.loss
    # The payload lives in the inbox until the next message: the step consumes it before that.
    args = (jnp.int32(worker), wire.to_device(payload), jnp.bool_(finite), jnp.float32(loss))
    if self.mode == "gradient":
      args += (jnp.float32(0.0 if header is None else header.step_size),)
    return (*args, jnp.float32(self._now()))

  def _handle(self, state: ServerState, frames) -> tuple[ServerState, EventRecord | None]:
    identity, frames = frames[0].bytes, frames[1:]
    worker = self._worker_of.get(identity)
    try:
      if not frames:
        raise wire.MessageError("malformed", "an empty message")
      header = wire.decode_header(frames[0], token=self.token)
      payload = wire.decode_payload(header, frames[1:], dtype=self.dtype, count=self.count)
      if not 0 <= header.worker < self.num_workers:
        raise wire.MessageError("worker", f"worker={header.worker}; expected 0..{self.num_workers - 1}")
      if header.kind == wire.Kind.HELLO:
        return self._hello(state, identity, header.worker), None
      if worker != header.worker:
        raise wire.MessageError(
          "worker", f"worker={header.worker} from a connection registered as {worker!r}"
        )
      if header.kind == wire.Kind.BYE:
        state = server_step.drop(state, jnp.arange(self.num_workers) == worker)
        log.info("worker %d left", worker)
        return state, None
      elastic_step = header.kind == wire.Kind.STEP and self.mode == "elastic"
      if header.kind != wire.Kind.PUSH and not elastic_step:
        raise wire.MessageError("malformed", f"a {header.kind.name} message sent to a {self.mode} server")
      current = int(state.event if self.mode == "rounds" else state.version)
      if header.version > current:
        raise wire.MessageError("future_version", f"version={header.version} but the server is at {current}")
      if self.mode == "rounds" and header.version < current:
        # Computed on a round that closed without it: dropped, never applied to another round. The
        # worker was sent the new round when it closed, so nothing is owed to it.
        state = state._replace(dropped=state.dropped + 1, steps=state.steps.at[worker].add(1))
        return state, None
      if header.version != int(state.pulled_version[worker]):
        raise wire.MessageError(
          "version",
          f"version={header.version} but worker {worker} was sent {int(state.pulled_version[worker])}",
        )
    except wire.MessageError as err:
      self._reject(identity, err.reason, str(err), worker)
      return state, None
    if not bool(state.live[worker]) and not elastic_step:
      # Back after being declared lost (a stopped process, continued): the run went on without it, so
      # its pull is void and its message is dropped, not applied hundreds of versions late. It rejoins
      # as a worker that says HELLO: the current parameters, at its data step.
      log.info(
        "worker %d is back after it was declared lost: its message of version %d is dropped (the server is "
        "at %d); it rejoins",
        worker,
        header.version,
        int(state.version),
      )
      state = state._replace(dropped=state.dropped + 1, steps=state.steps.at[worker].add(1))
      return self._hello(state, identity, worker), None
    if not bool(state.live[worker]):  # an elastic worker's local step: it is back, with its own model
      state = state._replace(live=state.live.at[worker].set(True))
    if elastic_step:
      step = self._local_step(state, *self._arrival_args(worker, self._no_payload, header))
      return step.state, step.record
    state, row, send, reply = self._arrive(state, *self._arrival_args(worker, payload, header))
    send = np.asarray(send)
    if send.any():
      self._reply(state, np.nonzero(send)[0], reply)
    elif self.mode == "rounds":
      row = None  # the round is still open: an event is a closed round
    return state, row

  def _hello(self, state: ServerState, identity: bytes, worker: int) -> ServerState:
    old = self._identity.get(worker)
    if old is not None and old != identity:
      self._worker_of.pop(old, None)
    self._identity[worker] = identity
    self._worker_of[identity] = worker
    log.info(
      "worker %d joined at version %d, data step %d", worker, int(state.version), int(state.steps[worker])
    )
    # A (re)joining worker is sent the current parameters; its earlier pull is void.
    state = server_step.join(state, worker)
    self._reply(state, [worker], server_step.reply_payload(state))
    return state

  def stop(self, *, timeout: float = 30.0) -> None:
    """Tells every worker the run is over (on its next message) and closes the socket.

    Waits up to ``timeout`` seconds for the live workers' last pushes; those
    are answered with STOP and not applied (the run's events are counted).
    """
    if self._socket is None:
      return
    try:
      live_mask, waiting = np.asarray(self._state.live), np.asarray(self._state.waiting)
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
