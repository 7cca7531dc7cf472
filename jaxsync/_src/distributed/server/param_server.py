"""The asynchronous parameter server: the registry's server rule and dispatch policy on real arrivals.

Process 0 serves (or processes ``0 .. S-1``, each owning a slice of the
parameters: :mod:`shards`); every other process is one worker
(:mod:`ps_worker`). The server applies, per arrival, exactly what the
simulator applies per event:
the pure, jitted :func:`server_step.arrive` decides everything, the server
only moves messages and watches liveness. The clock differs (wall seconds
instead of simulated ones).

Planes:

* control, on the ``jax.distributed`` coordination service: the server
  publishes its data-plane address and the run token under ``jaxsync/``;
  liveness comes from heartbeats the workers write to its key-value store
  (:mod:`liveness`);
* data, on ZeroMQ (a ROUTER socket bound to the configured interface only):
  :mod:`wire` messages, received without a copy and checked field by field.

This module is the host loop: a message in, checked, the state change it
makes, a reply out. Its parts are modules of their own: :mod:`transport`
(the socket, the inbox, who is on each connection), :mod:`checks` (a message
decoded and held against the counters), :mod:`counters` (the state's
counters mirrored on the host), :mod:`compiled_steps` (each state change,
compiled), :mod:`state_changes` (a change ordered to every shard, applied,
replied to), :mod:`shards` (a server in several processes: the leader's
commands, a follower's slices), :mod:`liveness` and :mod:`node_pulls`
(InHAD's node aggregators).

:class:`ParameterServer` implements the :class:`Runtime` interface, so
:func:`training.train` drives it as it drives the simulator: metrics, orbax
checkpoints, resume, summary and plots. Not thread-safe: one host loop owns it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from jaxsync._src.core import validation, variables
from jaxsync._src.distributed import node_aggregator, wire
from jaxsync._src.distributed.cluster import RunFaultError
from jaxsync._src.distributed.server import checks, server_step, shards
from jaxsync._src.distributed.server.compiled_steps import CompiledSteps
from jaxsync._src.distributed.server.counters import host_value
from jaxsync._src.distributed.server.liveness import Liveness
from jaxsync._src.distributed.server.node_pulls import NodePulls
from jaxsync._src.distributed.server.server_step import ServerState
from jaxsync._src.distributed.server.state_changes import StateChanges
from jaxsync._src.distributed.server.transport import Transport
from jaxsync._src.interface.history import RunTotals
from jaxsync._src.interface.runtime import FaultAfterProgress, PreemptedError, RuntimeBase
from jaxsync._src.steps.records import EventRecord
from jaxsync._src.strategies.strategy import Engine, Strategy

log = logging.getLogger("jaxsync.server")

KEY_ADDRESS = shards.key_address(0)
KEY_TOKEN = "jaxsync/server/token"
_WHAT = "ParameterServer"


class WorkerLostError(RunFaultError, FaultAfterProgress):
  """Every worker process is gone, or a shard: the run cannot go on.

  From a single server, ``completed`` holds every update it applied in the
  interrupted chunk: the checkpoint written then loses none of them.
  """


def serves(strategy: Strategy) -> bool:
  """Whether a multi-process run of ``strategy`` runs on this server (else on the multi-controller loop).

  Asynchronous strategies do; so do synchronous rounds that drop gradients
  (``fastest_k``), which a collective cannot cancel, and local rounds with
  elastic membership (DiLoCo whose workers may leave and join: a collective's
  members are fixed). Every other synchronous strategy all-reduces
  (``dist.SyncRuntime``).
  """
  if strategy.engine == Engine.ASYNC or strategy.elastic_membership:
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
      "or a synchronous one whose workers talk to a parameter server, such as fastest_k or DiLoCo with "
      "membership='elastic' (all-reduce and fixed-membership local SGD run on the multi-controller loop)",
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
  worker's next data step and the noise ratio (BB). This class is the host
  loop around it: it checks each message against the counters the host keeps
  (:mod:`counters`: no device read), applies the state change it makes,
  replies, and watches liveness.

  InHAD's workers push to their node's aggregator (:mod:`node_aggregator`),
  which reports each gradient's header here and keeps the gradient: the step
  runs on a zero message for every report but the one that completes a pull,
  which carries the pulled sum of all ``T`` (:mod:`node_pulls`).

  A sharded server (``num_shards > 1``, :mod:`shards`) runs one of these per
  shard process: shard 0 leads (it checks the workers' headers, watches
  liveness and decides each state change, and sends it to the other shards
  as a :class:`shards.Command` before applying it), the others apply the
  leader's commands in its order, to their slice, and reply with it. A single
  server applies each change directly.

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
    rejoin_wait: seconds a server that has lost every worker waits for one
      to rejoin before it stops the run (``0``: it stops at once). A
      supervisor that restarts failed workers sets it (``jaxsync launch
      --max-restarts``: ``JAXSYNC_REJOIN_WAIT``).
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
    rejoin_wait: float = 0.0,
    advertise: str | None = None,
    num_shards: int = 1,
    shard: int = 0,
  ):
    self.strategy = _check_protocol(strategy)
    self.mode = server_step.mode(strategy)
    super().__init__(eval_fn, eval_every, eval_every_time)
    self.num_workers = strategy.num_units  # worker processes: an EA-wild group is one
    self.idle_timeout = validation.check_real(_WHAT, "idle_timeout", idle_timeout, low=0.0, low_open=True)
    self.rejoin_wait = validation.check_real(_WHAT, "rejoin_wait", rejoin_wait, low=0.0)
    self._all_lost_since: float | None = None
    self.num_shards = validation.check_int(_WHAT, "num_shards", num_shards)
    self.shard = validation.check_int(_WHAT, "shard", shard, low=0)
    if self.shard >= self.num_shards:
      raise validation.invalid(_WHAT, "shard", shard, f"0 .. num_shards - 1 = {self.num_shards - 1}")
    if self.num_shards > 1 and client is None:
      raise validation.invalid(
        _WHAT, "client", client, "the coordination-service client: the shards find each other on it"
      )
    if advertise is None and bind in ("0.0.0.0", "*", "::"):
      raise validation.invalid(
        _WHAT, "advertise", advertise, f"the host workers connect to when bind={bind!r}"
      )
    self._transport = Transport(bind=bind, port=port, advertise=advertise)
    self.rejected_messages = self._transport.rejected
    self._client = client
    self._liveness = Liveness(liveness, client, num_workers=self.num_workers, first_process=self.num_shards)
    self.lost = self._liveness.lost
    self._started = time.perf_counter()
    self._clock_offset, self._clock_started = 0.0, False
    self._state: ServerState | None = None
    self._steps: CompiledSteps | None = None
    self._changes: StateChanges | None = None
    self._chunk: int | None = None  # a sharded server's slice, padded
    self._leader: shards.Leader | None = None  # a sharded server's leading shard's command stream
    self._follower: shards.Follower | None = None  # or another shard's
    self._nodes: NodePulls | None = None
    self._deadline = strategy.elastic_membership and strategy.deadline is not None
    self._round_opened: tuple[int, float] | None = None  # (round, when its first pseudo-gradient came)
    if node_aggregator.aggregates(strategy):
      self._nodes = NodePulls(strategy, self._transport, self._liveness.live_workers, self.idle_timeout)
      if self.num_shards > 1:
        one_server = f"1 for {strategy.name} (its node aggregators pull from one server)"
        raise validation.invalid(_WHAT, "num_shards", num_shards, one_server)

  @property
  def leads(self) -> bool:
    """Whether this process decides the run's events (a single server, or shard 0)."""
    return self.shard == 0

  @property
  def token(self) -> bytes:
    """The run token every message carries."""
    return self._transport.token

  @property
  def address(self) -> str | None:
    """The data plane's address, once :meth:`init` bound it."""
    return self._transport.address

  def _join_control_plane(self) -> None:
    """Publishes the data plane's address (and, leading, the run token); connects the shards' commands."""
    client = self._client
    if not self.leads:
      self._transport.token = client.blocking_key_value_get_bytes(KEY_TOKEN, 300_000)
      self._follower.open(client)
    client.key_value_set(shards.key_address(self.shard), self.address, allow_overwrite=True)
    if self.leads:
      client.key_value_set_bytes(KEY_TOKEN, self.token, allow_overwrite=True)
      if self.num_shards > 1:
        self._leader = shards.Leader(client, self.num_shards)

  # -- the runtime interface ------------------------------------------------------------------

  clock = "wall"

  def _prepare(self, params) -> None:
    super()._prepare(params)
    flat, unravel = ravel_pytree(params)
    self.count, self.dtype = int(flat.size), str(flat.dtype)
    leaf_dtypes = {str(x.dtype) for x in jax.tree.leaves(params)}
    if len(leaf_dtypes) != 1:
      raise validation.invalid(_WHAT, "params dtypes", sorted(leaf_dtypes), "one dtype for every leaf")
    mesh = None
    if self.num_shards > 1:
      layout = shards.layout(self.count, self.num_shards)
      init_flat = lambda x: server_step.init(self.strategy, x, self.schedule)  # noqa: E731
      mesh = shards.ShardedState(init_flat, layout, shards.shard_devices(self.num_shards), flat.dtype)
      self._chunk = layout.chunk
    self._steps = CompiledSteps(
      self.strategy, self.mode, self.schedule, self.metric_names, unravel, self.count, flat.dtype, mesh,
      self.shard,
    )  # fmt: skip
    if self._nodes is not None:
      self._nodes.expect(self.count, self.dtype)
    if not self._transport.is_open:
      max_bytes = wire.max_message_bytes(self._steps.slice_count, self.dtype)
      self._transport.open(max_bytes, capacity=None if mesh is None else self._chunk * flat.dtype.itemsize)
      if not self.leads:
        self._follower = shards.Follower(
          self.shard, self._transport, self._chunk, self.num_workers, flat.dtype, self._decode
        )
      if self._client is not None:
        self._join_control_plane()
    self._changes = StateChanges(
      self._steps, self._transport, mode=self.mode, num_workers=self.num_workers, dtype=self.dtype,
      leader=self._leader, follower=self._follower, nodes=self._nodes,
    )  # fmt: skip

  def init(self, params, seed: int = 0) -> ServerState:
    """The state before the first arrival: every worker will get ``params`` (version 0)."""
    del seed  # the real cluster has no jitter seed
    if self.num_shards > 1 and variables.carries_state(params):
      raise validation.invalid(
        _WHAT, "num_shards", self.num_shards,
        "1 for a model with state beside its parameters (BatchNorm statistics): the shards serve raveled "
        "parameters, whose rule would act on the state",
      )  # fmt: skip
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

  @property
  def dropped_gradients(self) -> int:
    """Messages never applied for coming too late: after their round closed, or from a worker declared lost."""
    return 0 if self._state is None else int(host_value(self._state.dropped))

  def advance(self, state: ServerState, num_events: int, *, max_time: float | None = None):
    """Serves until ``num_events`` more arrivals (or ``max_time`` wall seconds); returns (state, records).

    On a sharded server's other shards, until the leader's ``advance`` ends.
    """
    num_events = validation.check_int(_WHAT, "num_events", num_events)
    self._ensure_prepared(state.params)
    state = self._steps.to_device(state)  # a restored state is NumPy (see checkpoints)
    self._steps.track(state)
    if not self._clock_started:  # wall time counts from the first advance (after compiling and restoring)
      self._clock_offset, self._started, self._clock_started = (
        float(host_value(state.clock)),
        time.perf_counter(),
        True,
      )
    rows: list[EventRecord] = []
    if self._nodes is not None:
      self._nodes.count_orphans(state)
    if self.leads:
      try:
        state = self._lead_sharded(state, rows, num_events, max_time)
      except BaseException as err:
        if self._leader is not None:  # the other shards stop with the leader's reason
          self._leader.order(shards.Command(shards.Op.ABORT, message=str(err) or type(err).__name__))
        elif isinstance(err, WorkerLostError) and rows:
          err.completed = (self._steps.to_host(self._state), self._records(rows))
        raise
      if self._leader is not None:
        self._leader.order(shards.Command(shards.Op.END))
    else:
      state = self._follow(state, rows)
    self._state = state
    if not rows:
      return self._steps.to_host(state), self._steps.no_records(state)
    return self._steps.to_host(state), self._records(rows)

  @staticmethod
  def _records(rows: list[EventRecord]) -> EventRecord:
    rows = [jax.tree.map(host_value, r) for r in rows]
    return jax.tree.map(lambda *xs: np.stack(xs), *rows)

  def agree_to_stop(self, requested: bool) -> bool:
    """The leading shard decides on its own notice and orders the others to stop with it; they ask nothing."""
    if not self.leads:
      return False  # its own notice waits for the leader's STOP (the launcher sends SIGTERM to every process)
    if requested and self._leader is not None:
      self._leader.order(shards.Command(shards.Op.STOP))
    return requested

  def _now(self) -> float:
    return self._clock_offset + time.perf_counter() - self._started

  # -- the leader's loop: a worker's message, checked, makes a state change ----------------------

  def _lead_sharded(
    self, state: ServerState, rows: list, num_events: int, max_time: float | None
  ) -> ServerState:
    try:
      return self._lead(state, rows, num_events, max_time)
    except jax.errors.JaxRuntimeError as err:
      if self._leader is None:
        raise
      # A step's all-reduce whose peer died: a shard process is lost.
      raise WorkerLostError(
        f"a server shard process is lost ({str(err).splitlines()[0]}); the server cannot go on without its "
        "slice of the parameters. Resume with `jaxsync resume RUN_DIR`."
      ) from None

  def _lead(self, state: ServerState, rows: list, num_events: int, max_time: float | None) -> ServerState:
    quiet_since = time.perf_counter()
    while len(rows) < num_events:
      if max_time is not None and self._now() >= max_time:
        break
      state = self._check_liveness(state, rows)
      if self._deadline:
        state = self._close_at_deadline(state, rows)
      self._state = state  # with the rows so far (a round closed for its lost workers adds one)
      if len(rows) >= num_events:  # that close was the chunk's last event
        break
      if self._transport.deferred:  # messages that came during an InHAD pull
        frames = self._transport.deferred.popleft()
      elif self._transport.poll(self._deadline_poll_ms() if self._deadline else 100):
        quiet_since = time.perf_counter()
        frames = self._transport.receive()
      else:
        if time.perf_counter() - quiet_since > self.idle_timeout:
          raise WorkerLostError(
            f"no message for idle_timeout={self.idle_timeout} s from {int(self._steps.counters.live.sum())} "
            "live worker(s); the run is stuck. Resume with `jaxsync resume RUN_DIR`."
          )
        continue
      state, row = self._handle(state, frames)
      self._state = state
      if row is not None:
        rows.append(row)
    return state

  def _handle(self, state: ServerState, frames) -> tuple[ServerState, EventRecord | None]:
    """The leader's view of a worker's message: checked, then the state change it makes (or a rejection)."""
    identity, counters = frames[0].bytes, self._steps.counters
    # A node speaks for several workers: only a checked header names one.
    worker = self._transport.worker_of(identity) if self._nodes is None else None
    try:
      header, payload = self._decode(frames)
      if self._nodes is not None:  # every message comes through a node aggregator
        if header.kind == wire.Kind.NODE_HELLO:
          on_host = lambda: self._steps.host_reply(state, self._steps.reply_payload(state))  # noqa: E731
          self._nodes.hello(identity, header.worker, counters.version, on_host)
          return state, None
        if header.kind == wire.Kind.SUM:  # its pull gave up on it: too late to apply
          self._nodes.late_sum(header)
          return state, None
        worker = self._nodes.answered_worker(identity, header)
        if not self._nodes.speaks_for(identity, header.worker):
          raise wire.MessageError(
            "worker", f"worker={header.worker} through a connection that is not its node's"
          )
      if header.kind == wire.Kind.HELLO:
        return self._closing_if_complete(self._hello(state, identity, header.worker))
      checks.check_sender(header, worker)
      if header.kind == wire.Kind.BYE:
        log.info("worker %d left", worker)
        state = self._changes.drop(state, np.arange(self.num_workers) == worker)
        return self._closing_if_complete(state)  # the open round may have waited only for it
      elastic_step = header.kind == wire.Kind.STEP and self.mode == "elastic"
      if not elastic_step:
        pushed = wire.Kind.PUSH if self._nodes is None else wire.Kind.REPORT
        checks.check_kind(header, pushed, f"a {self.mode} server")
      if checks.is_late(header, worker, counters, rounds=self.mode == "rounds"):
        # Computed on a round that closed without it: dropped, never applied to another round. The
        # worker was sent the new round when it closed, so nothing is owed to it.
        return self._changes.late(state, worker), None
    except wire.MessageError as err:
      self._transport.reject(identity, err.reason, str(err), worker)
      return state, None
    if not counters.live[worker] and not elastic_step:
      # Back after being declared lost (a stopped process, continued): the run went on without it, so
      # its pull is void and its message is dropped, not applied hundreds of versions late. It rejoins
      # as a worker that says HELLO: the current parameters, at its data step.
      log.info(
        "worker %d is back after it was declared lost: its message of version %d is dropped (the server is "
        "at %d); it rejoins",
        worker,
        header.version,
        counters.version,
      )
      state = self._changes.late(state, worker)
      if self._nodes is not None:  # its node discards the gradient it holds
        self._changes.send(worker, wire.Header(kind=wire.Kind.DROP, token=self.token, worker=worker))
      return self._hello(state, identity, worker), None
    fields = dict(
      worker=worker, version=header.version, step=header.step, loss=header.loss, finite=header.finite,
      now=self._now(),
    )  # fmt: skip
    if elastic_step:
      return self._changes.local_step(state, **fields)
    if self._nodes is not None:

      def arrive(pulled_sum):  # a zero message, or the pull's sum
        message = self._steps.no_payload if pulled_sum is None else self._steps.payload(pulled_sum)
        return self._changes.arrival(state, message, step_size=header.step_size, **fields)

      return self._nodes.report(worker, header.finite, arrive)
    if self._chunk is not None:  # the inbox's whole buffer: the slice, then zeros to the shards' equal size
      payload = self._transport.inbox.view(wire.numpy_dtype(self.dtype), self._chunk)
    state, row, _ = self._changes.arrival(
      state, self._steps.payload(payload), step_size=header.step_size, **fields
    )
    return state, row

  def _decode(self, frames) -> tuple[wire.Header, np.ndarray | None]:
    """A routed message's header and payload (this shard's slice), checked field by field."""
    return checks.decode(
      frames, token=self.token, dtype=self.dtype, count=self._steps.slice_count, num_workers=self.num_workers
    )

  def _hello(self, state: ServerState, identity: bytes, worker: int) -> ServerState:
    self._transport.register(identity, worker)
    counters = self._steps.counters
    if self.mode == "rounds":
      waits = server_step.joins_next_round(self.strategy, counters.live, counters.waiting, worker)
      log.info(
        "worker %d joined at round %d%s",
        worker,
        counters.event,
        " (it starts with the next one)" if waits else "",
      )
    else:
      log.info(
        "worker %d joined at version %d, data step %d", worker, counters.version, int(counters.steps[worker])
      )
    # A (re)joining worker is sent the current parameters; its earlier pull is void.
    return self._changes.join(state, worker, self._now())

  # -- a shard that follows the leader ------------------------------------------------------------

  def _follow(self, state: ServerState, rows: list) -> ServerState:
    """Applies the leader's commands until its ``advance`` ends."""
    while True:
      command, payload = self._follower.next_command(self.idle_timeout)
      if command is None:
        raise WorkerLostError(
          f"shard {self.shard}: no command from the leading shard (process 0) for "
          f"idle_timeout={self.idle_timeout} s; it is lost. Resume with `jaxsync resume RUN_DIR`."
        )
      if command.op == shards.Op.END:
        return state
      if command.op == shards.Op.ABORT:
        raise WorkerLostError(f"shard {self.shard}: the leading shard stopped: {command.message}")
      if command.op == shards.Op.STOP:
        raise PreemptedError(None, f"shard {self.shard}: the leading shard stopped on a preemption notice")
      state, row = self._changes.apply(state, command, payload)
      if row is not None:
        rows.append(row)

  # -- liveness -----------------------------------------------------------------------------------

  def _check_liveness(self, state: ServerState, rows: list) -> ServerState:
    """Drops the workers lost since the last look; releases workers, or closes a round, only they held up."""
    counters = self._steps.counters
    version = counters.version
    lost = self._liveness.newly_lost(
      counters.live.copy(), version=version, clock=self._now, nodes=self._nodes
    )
    if lost is None:
      return state
    if lost:
      state = self._changes.drop(state, np.isin(np.arange(self.num_workers), lost))
    if counters.live.any():
      self._all_lost_since = None
    elif lost or self._all_lost_since is not None:
      # Every worker is gone. Under a supervisor that restarts them, one is on its way back: wait for it.
      now = time.perf_counter()
      self._all_lost_since = self._all_lost_since or now
      if now - self._all_lost_since >= self.rejoin_wait:
        raise WorkerLostError(
          f"every worker process is lost (none rejoined within rejoin_wait={self.rejoin_wait:g} s); "
          f"the server stops at version {version}. Resume with `jaxsync resume RUN_DIR`."
        )
      if lost:
        log.info("every worker is lost; waiting up to %g s for one to rejoin", self.rejoin_wait)
    if self.mode == "rounds":
      return self._close_if_complete(state, rows) if lost else state
    if counters.waiting.any() and not (counters.live & ~counters.waiting).any():  # stuck_on_lost_workers
      log.info("released %d waiting worker(s) that no live worker could release", int(counters.waiting.sum()))
      state = self._changes.release(state, self._now())
    return state

  def _close_if_complete(self, state: ServerState, rows: list) -> ServerState:
    """Closes the open round when the live workers it still waited for are lost (it has min(k, live); with
    elastic membership, every live worker's and at least the quorum)."""
    counters = self._steps.counters
    count = int(host_value(state.exchange.count))
    if count == 0 or not server_step.round_complete(self.strategy, count, counters.live, counters.waiting):
      return state
    log.info(
      "closing round %d with %d gradient(s): the workers it waited for are lost", counters.event, count
    )
    state, row = self._changes.close_round(state, self._now())
    rows.append(row)
    return state

  def _closing_if_complete(self, state: ServerState) -> tuple[ServerState, EventRecord | None]:
    """After a membership change (a join, a leave): the open round closed if it now has all it waits for."""
    if self.mode != "rounds":
      return state, None
    closed: list = []
    state = self._close_if_complete(state, closed)
    return state, (closed[0] if closed else None)

  def _close_at_deadline(self, state: ServerState, rows: list) -> ServerState:
    """Elastic membership: closes the open round ``deadline`` seconds after its first pseudo-gradient, with
    those in (once there are ``quorum``); the late ones are dropped when they come (:func:`checks.is_late`)."""
    counters, deadline = self._steps.counters, self.strategy.deadline
    if self._round_opened is None or self._round_opened[0] != counters.event:
      self._round_opened = (counters.event, self._now()) if counters.waiting.any() else None
      return state
    if self._now() - self._round_opened[1] < deadline:
      return state
    count = int(host_value(state.exchange.count))
    if count < self.strategy.quorum:
      return state  # it waits for the quorum; the first arrival that makes it closes the round
    waited = [int(w) for w in np.nonzero(counters.live & ~counters.waiting)[0]]
    log.info(
      "closing round %d at its deadline (%g s) with %d pseudo-gradient(s), without worker(s) %s",
      counters.event, deadline, count, waited,
    )  # fmt: skip
    state, row = self._changes.close_round(state, self._now())
    rows.append(row)
    self._round_opened = None
    return state

  def _deadline_poll_ms(self) -> int:
    """How long the loop may wait for a message: 100 ms, or less when the open round's deadline is nearer."""
    if self._round_opened is None:
      return 100
    left = self._round_opened[1] + self.strategy.deadline - self._now()
    if left <= 0:  # passed, short of the quorum: the next message (or liveness) can close it
      return 100
    return int(min(100.0, max(1.0, left * 1000.0)))

  # -- the end --------------------------------------------------------------------------------------

  def stop(self, *, timeout: float = 30.0) -> None:
    """Tells every worker the run is over (on its next message) and closes the socket.

    Waits up to ``timeout`` seconds for the live workers' last pushes; those
    are answered with STOP and not applied (the run's events are counted).
    The other shards of a sharded server close their sockets: the leader's STOP ends the workers.
    """
    if not self._transport.is_open:
      return
    for stream in (self._leader, self._follower):
      if stream is not None:
        stream.close()
    if not self.leads:
      self._transport.close(linger=0)
      return
    if self._nodes is not None:  # each node tells its workers
      self._nodes.stop()
      self._transport.close(linger=1000)
      return
    counters = None if self._steps is None else self._steps.counters
    if counters is None:  # no advance yet: every worker live, none waiting
      live_mask, waiting = np.ones(self.num_workers, bool), np.zeros(self.num_workers, bool)
    else:
      live_mask, waiting = counters.live, counters.waiting
    told = set()
    live = {w for w in range(self.num_workers) if live_mask[w] and self._transport.registered(w)}
    stop = wire.Header(kind=wire.Kind.STOP, token=self.token, worker=0)
    for worker in np.nonzero(waiting)[0]:
      self._changes.send(int(worker), stop)
      told.add(int(worker))
    deadline = time.perf_counter() + timeout
    while told < live and time.perf_counter() < deadline:
      if not self._transport.poll(100):
        alive = self._liveness.live_workers()
        if alive is not None:
          live &= alive
        continue
      worker = self._transport.sender_of_next()
      if worker is not None:
        self._changes.send(worker, stop)
        told.add(worker)
    self._transport.close(linger=1000)
