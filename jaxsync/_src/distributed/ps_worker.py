"""A parameter-server worker process: pull parameters, compute one message, push it, repeat.

Worker ``k`` runs the simulator's own worker side on its batch
``data.batch(k, step)`` (the step comes from the server: its count of the
worker's pushes, or the round's number, so a worker that rejoins after a
restart continues its data where the checkpoint left it). An EA-wild group
of ``G`` workers is one worker process: its batch is its members' batches
(:func:`arrival.unit_batch`), its gradient their mean, computed
data-parallel over the process's devices when it has several:

* gradient strategies (asynchronous, and synchronous rounds such as
  ``fastest_k``): :func:`arrival.worker_message`, pushed; the reply is the
  next parameters. Replies that queued while it computed (rounds that closed
  without it) are skipped to the newest.
* asynchronous local SGD: the same loop, the message being its local steps'
  pseudo-gradient (:func:`arrival.local_message`, from data step ``step``).
* elastic strategies (EASGD, EAMSGD, EA-wild): the worker keeps its own model
  ``x`` and steps it (:func:`arrival.elastic_worker_step`). A local step is
  reported to the server in a header (no payload, no reply). An exchange
  step costs one round trip: it sends ``x`` and steps against the reply:
  the centre before the exchange (locked: the centre it reads is the one the
  exchange used), or, for EA-wild, against the centre it read at its last
  exchange, the reply being its next read.

It holds its worker-rule state (local momentum, BB, its elastic model)
itself; a restarted worker starts that state afresh, an elastic one from the
centre.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import zmq
from jax.flatten_util import ravel_pytree

from jaxsync._src.core import validation
from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.distributed import local_devices, wire
from jaxsync._src.distributed.cluster import RunFaultError
from jaxsync._src.distributed.server import server_step, shards
from jaxsync._src.rules import contracts, guard
from jaxsync._src.steps import arrival, sync_round
from jaxsync._src.strategies.strategy import Strategy, WorkerProtocol

log = logging.getLogger("jaxsync.worker")
_WHAT = "ps_worker"


# Seconds a worker that got a preemption notice goes on working, waiting for the server's STOP: the
# server stops at the end of its chunk when the whole run is preempted (its own notice).
PREEMPTION_GRACE = 10.0


class ServerGoneError(RunFaultError):
  """The server stopped answering (killed, or the network is down)."""


class RejectedError(RunFaultError):
  """The server rejected this worker's message (a bug or a misconfigured worker)."""


def run_worker(
  strategy: Strategy,
  loss_fn,
  data: WorkerData,
  params_like: Any,
  *,
  worker: int,
  address: str | list[str],
  token: bytes,
  reply_timeout: float = 300.0,
  server_alive=None,
  devices=None,
  peer: str = "the parameter server (process 0)",
  stop_requested=None,
  preemption_grace: float = PREEMPTION_GRACE,
  slowdown: float = 1.0,
) -> dict[str, Any]:
  """Works for the server at ``address`` until it says STOP; returns counters.

  Args:
    strategy: the run's strategy (the worker rule is applied here).
    loss_fn: ``(params, batch) -> scalar``.
    data: the run's data, sharded over ``strategy.num_workers`` workers.
    params_like: parameters with the run's structure (to unravel payloads).
    worker: this worker's id ``k`` (an EA-wild group's id, ``0 .. K/G - 1``).
    address: the server's ``tcp://host:port``, or a sharded server's, one per
      shard (shard 0 first): the worker pushes and pulls each shard's slice of
      the raveled parameters (:mod:`shards`) in parallel.
    token: the run token (from the coordination service).
    reply_timeout: seconds to wait for any reply before giving up.
    server_alive: optional ``() -> bool`` checked while waiting (the
      coordination service's view of ``peer``'s process).
    devices: the devices this worker computes on (default: this process's
      ``jax.local_devices()``); with several, each gradient is computed
      data-parallel over them (:mod:`local_devices`), the batch split evenly.
    peer: what ``address`` is, in errors (InHAD's workers talk to their node's aggregator).
    stop_requested: optional ``() -> bool``, True once a preemption notice
      (SIGTERM) reached this process. The worker goes on until the server says
      STOP (the whole run is being preempted: the server stops at its next
      chunk), or leaves ``preemption_grace`` seconds after the notice (only
      this machine is being taken: the server goes on without it, as after a
      kill, and nothing it applied is lost).
    preemption_grace: see ``stop_requested``.
    slowdown: ``>= 1``; above 1 the worker emulates a slow one: after each
      step it sleeps ``slowdown - 1`` times that step's measured compute time
      (``cluster.emulate_slow_workers``).

  Returns:
    ``{"pushes": n, "wall_seconds": s, "compute_seconds": [per step], "devices": D,
    "preempted": whether it left on its notice rather than on the server's STOP}``.

  Raises:
    ServerGoneError: no reply within ``reply_timeout`` or the server is dead.
    RejectedError: the server rejected a message.
  """
  worker = validation.check_int(_WHAT, "worker", worker, low=0)
  preemption_grace = validation.check_real(_WHAT, "preemption_grace", preemption_grace, low=0.0)
  slowdown = validation.check_real(_WHAT, "slowdown", slowdown, low=1.0)
  flat_like, unravel = ravel_pytree(params_like)
  count, dtype = int(flat_like.size), str(flat_like.dtype)
  devices = list(jax.local_devices() if devices is None else devices)
  local_devices.check_batch(data.batch_size, len(devices), strategy.workers_per_unit)
  gradient = local_devices.gradient_fn(loss_fn, devices)
  addresses = [address] if isinstance(address, str) else list(address)
  layout = shards.layout(count, len(addresses))
  sockets = []
  for shard, at in enumerate(addresses):
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    # A fixed identity: after ZeroMQ reconnects (a network blip) the server still knows this worker.
    socket.setsockopt(zmq.ROUTING_ID, f"w{worker}-{token[:4].hex()}".encode())
    lo, hi = layout.bounds(shard)
    socket.setsockopt(zmq.MAXMSGSIZE, wire.max_message_bytes(hi - lo, dtype))
    socket.connect(at)
    sockets.append(socket)
  link = _Link(sockets, layout, token, worker, dtype, reply_timeout, (peer, server_alive))
  link.leave_when = _Notice(stop_requested, preemption_grace)
  link.slowdown = slowdown
  loop = _elastic_loop if server_step.mode(strategy) == "elastic" else _gradient_loop
  if strategy.elastic_membership:
    steps = _LocalRoundSteps(strategy, loss_fn, data, params_like, unravel, worker)
    loop = functools.partial(_local_rounds_loop, steps=steps)
  link.send(wire.Header(kind=wire.Kind.HELLO, token=token, worker=worker))
  start = time.perf_counter()
  try:
    pushes, compute_times = loop(strategy, loss_fn, gradient, data, params_like, unravel, link)
  finally:
    for socket in sockets:
      socket.close(linger=0)
  return {
    "pushes": pushes,
    "wall_seconds": time.perf_counter() - start,
    "compute_seconds": compute_times,  # per step, the first one includes compilation
    "devices": len(devices),
    "preempted": link.leave_when.left,
  }


class _Stop(Exception):
  """The server said STOP (or the worker leaves on its preemption notice)."""


class _Notice:
  """Raises :class:`_Stop` ``grace`` seconds after ``stop_requested()`` first said True."""

  def __init__(self, stop_requested, grace: float):
    self.stop_requested, self.grace = stop_requested, grace
    self.since: float | None = None
    self.left = False

  def check(self) -> None:
    if self.stop_requested is None or not self.stop_requested():
      return
    now = time.perf_counter()
    self.since = now if self.since is None else self.since
    if now - self.since >= self.grace:
      self.left = True
      raise _Stop


class _Link:
  """This worker's sockets to the server, one per shard: typed sends, checked and assembled replies."""

  def __init__(self, sockets, layout, token, worker, dtype, reply_timeout, peer):
    self.sockets, self.layout, self.token, self.worker, self.dtype = sockets, layout, token, worker, dtype
    self.count = layout.count
    self.reply_timeout, self.peer = reply_timeout, peer  # (its name, () -> whether it is alive)
    self.pollers = []
    for socket in sockets:
      self.pollers.append(zmq.Poller())
      self.pollers[-1].register(socket, zmq.POLLIN)
    self.itemsize = np.dtype(wire.numpy_dtype(dtype)).itemsize
    self.inbox = wire.Inbox(wire.max_message_bytes(self.count, dtype))
    self.leave_when = _Notice(None, 0.0)  # run_worker sets the process's preemption notice
    self.slowdown = 1.0  # run_worker sets the emulated slowdown

  def pace(self, compute_times: list[float]) -> None:
    """An emulated slow worker sleeps ``(slowdown - 1)`` times the step it just measured, so its steps
    take ``slowdown`` times its own compute, as the simulator's slow workers' do (the first step, which
    compiles, is not stretched)."""
    if self.slowdown > 1.0 and len(compute_times) > 1:
      time.sleep((self.slowdown - 1.0) * compute_times[-1])

  def send(self, header: wire.Header, payload=None) -> None:
    """To every shard (the others before the leader, so their slices are there when it orders them
    applied), each its slice of ``payload``; a local step's header to the leader only."""
    order = range(len(self.sockets) - 1, -1, -1) if header.kind != wire.Kind.STEP else [0]
    for shard in order:
      lo, hi = self.layout.bounds(shard)
      piece = None if payload is None else payload[lo:hi]
      part = header if piece is None else dataclasses.replace(header, count=hi - lo)
      self.sockets[shard].send_multipart(wire.encode(part, piece), copy=False)

  def header(self, kind, **fields) -> wire.Header:
    return wire.Header(kind=kind, token=self.token, worker=self.worker, dtype=self.dtype, **fields)

  def _receive(self, shard: int) -> wire.Header:
    """The next message of shard ``shard``, its slice received in place (STOP raises :class:`_Stop`)."""
    lo, hi = self.layout.bounds(shard)
    frames = self.inbox.receive(self.sockets[shard], at=lo * self.itemsize, size=(hi - lo) * self.itemsize)
    reply = wire.decode_header(frames[0], token=self.token)
    if reply.kind == wire.Kind.STOP:
      raise _Stop
    if reply.kind == wire.Kind.ERROR:
      raise RejectedError(
        f"worker {self.worker}: the server rejected its message ({reply.reason or 'no reason'})."
      )
    wire.decode_payload(reply, frames[1:], dtype=self.dtype, count=hi - lo)
    return reply

  def reply(self, *, newest: bool = False) -> tuple[wire.Header, np.ndarray]:
    """The next reply (STOP raises :class:`_Stop`); with ``newest``, later queued replies supersede it.

    A sharded server's shards send the same replies in the same order: the
    leader's decides which, and each other shard's slice is the one of its
    replies with the same header.
    """
    self.leave_when.check()
    _wait(self.pollers[0], self.reply_timeout, *self.peer, self.leave_when.check)
    reply = self._receive(0)
    while newest and self.pollers[0].poll(0):
      reply = self._receive(0)
    for shard in range(1, len(self.sockets)):
      while True:
        _wait(self.pollers[shard], self.reply_timeout, *self.peer)
        got = self._receive(shard)
        if (got.version, got.step) == (reply.version, reply.step):
          break
    return reply, self.inbox.view(wire.numpy_dtype(self.dtype), self.count)

  def check_stop(self) -> None:
    """Raises :class:`_Stop` (or the rejection) if the server has said something since."""
    self.leave_when.check()
    while self.pollers[0].poll(0):
      self._receive(0)


def _gradient_loop(
  strategy: Strategy, loss_fn, gradient, data: WorkerData, params_like, unravel, link: _Link
):
  """Pull, compute the message, push, until STOP: asynchronous gradient strategies and synchronous rounds."""
  worker_rule = strategy.worker_rule
  rule_state = worker_rule.init(params_like) if worker_rule is not None else None
  worker = link.worker

  local = strategy.protocol == WorkerProtocol.LOCAL
  local_steps = strategy.local_steps_per_unit[worker] if local else 0

  @jax.jit
  def compute(flat, rule_state, step, noise_ratio, data):  # data an argument: a buffer, not a constant
    x = unravel(flat)
    if local:  # asynchronous local SGD: the local steps, then the pseudo-gradient
      out = arrival.local_message(
        strategy, loss_fn, x, rule_state, lambda t: data.batch(worker, t), step, local_steps
      )
    else:
      batch = data.batch(worker, step)
      got = gradient(arrival.gradient_point(x, rule_state), batch)
      out = arrival.worker_message(strategy, loss_fn, x, rule_state, batch, noise_ratio, gradient=got)
    return ravel_pytree(out.message)[0], out.worker_state, out.loss, out.finite, out.step_size

  pushes, compute_times = 0, []
  try:
    while True:
      reply, payload = link.reply(newest=True)
      began = time.perf_counter()
      flat, rule_state, loss, finite, step_size = compute(
        wire.to_device(payload), rule_state, jnp.int32(reply.step), jnp.float32(reply.noise_ratio), data
      )
      flat = np.asarray(flat)  # waits for the result: the step's compute time ends here
      compute_times.append(time.perf_counter() - began)
      link.pace(compute_times)
      push = link.header(
        wire.Kind.PUSH,
        version=reply.version,
        step=reply.step,
        loss=float(loss),
        step_size=float(step_size),
        finite=bool(finite),
        count=link.count,
      )
      link.send(push, flat)
      pushes += 1
  except _Stop:
    return pushes, compute_times


class _LocalRoundSteps:
  """Elastic DiLoCo's worker steps, compiled before the worker says HELLO (a joining worker must not hold
  its first round up by its compilation).

  ``before``: the round's ``H - tau`` local steps and its pseudo-gradient
  (:func:`sync_round.work_before_exchange`), ``during``: the ``tau``
  overlapped steps, ``mixed``: the worker's model after the outer step
  (:func:`sync_round.mixed_model`).
  """

  def __init__(self, strategy: Strategy, loss_fn, data: WorkerData, params_like, unravel, worker: int):
    batch_fn = lambda data: lambda t: data.batch(worker, t)  # noqa: E731

    def before(theta_flat, x, state, step, fragment, data):
      theta = unravel(theta_flat)
      work = sync_round.work_before_exchange(
        strategy, loss_fn, batch_fn(data), theta, x, state, step, fragment
      )
      message = ravel_pytree(work.contribution)[0]
      return work, message, jnp.mean(work.losses), guard.tree_all_finite(work.contribution)

    def during(work, step, data):
      return sync_round.work_during_exchange(strategy, loss_fn, batch_fn(data), work, step)

    def mixed(theta_flat, x, fragment):
      return sync_round.mixed_model(strategy, unravel(theta_flat), x, fragment)

    flat = ravel_pytree(params_like)[0]
    x, state = unravel(flat), strategy.worker_rule.init(params_like)
    step = fragment = jnp.int32(0)
    self.before = jax.jit(before).lower(flat, x, state, step, fragment, data).compile()
    work = jax.eval_shape(before, flat, x, state, step, fragment, data)[0]
    self.during = jax.jit(during).lower(work, step, data).compile()
    self.mixed = jax.jit(mixed).lower(flat, x, fragment).compile()
    self.initial_state = state


def _local_rounds_loop(
  strategy: Strategy, loss_fn, gradient, data: WorkerData, params_like, unravel, link: _Link, *, steps
):
  """Elastic DiLoCo's worker: each round's local steps from the global parameters, its pseudo-gradient pushed.

  The reply names the round (its number is the version on the wire) and carries the global parameters
  ``theta`` after the previous round; the worker mixes them into its model (:func:`sync_round.mixed_model`,
  ``x = theta`` for DiLoCo), takes the round's ``H - tau`` local steps, pushes the pseudo-gradient of the
  round's fragment, and takes the ``tau`` overlapped steps while the server collects the round. A worker
  that (re)joins starts from ``theta`` with a fresh inner optimizer. A round that closed without this
  worker's push drops it (the server counts it); the worker goes on from the newest parameters.
  ``steps``: the :class:`_LocalRoundSteps`, compiled.
  """
  del loss_fn, gradient, params_like  # the local steps take their own gradients (one device)
  held = None  # (model, fragment) of the last round this worker pushed
  state = steps.initial_state
  pushes, compute_times = 0, []
  try:
    while True:
      reply, payload = link.reply(newest=True)
      began = time.perf_counter()
      theta = wire.to_device(payload)
      x = unravel(theta) if held is None else steps.mixed(theta, *held)
      fragment = sync_round.round_fragment(strategy, reply.version)
      step = jnp.int32(reply.step)
      work, flat, loss, finite = steps.before(theta, x, state, step, fragment, data)
      flat = np.asarray(flat)  # waits for the result: the compute before the exchange ends here
      compute_times.append(time.perf_counter() - began)
      link.pace(compute_times)
      push = link.header(
        wire.Kind.PUSH, version=reply.version, step=reply.step, loss=float(loss), finite=bool(finite),
        count=link.count,
      )  # fmt: skip
      link.send(push, flat)
      pushes += 1
      work = steps.during(work, step, data)
      held, state = (work.model, fragment), work.worker_state
  except _Stop:
    return pushes, compute_times


def _elastic_loop(strategy: Strategy, loss_fn, gradient, data: WorkerData, params_like, unravel, link: _Link):
  """Local steps of the worker's own model, an exchange with the centre when its rule says so, until STOP."""
  rule = strategy.worker_rule
  worker = link.worker

  @jax.jit
  def compute(x, rule_state, step, data):
    """The gradient at the rule's look-ahead point, and whether this step exchanges with the centre."""
    model = unravel(x)
    batch = arrival.unit_batch(strategy, data, worker, step)
    got = gradient(arrival.gradient_point(model, rule_state), batch)
    # The rule decides on its own clock; the centre only enters the step's value (probed with x).
    _, probe = rule.update(got.grads, rule_state, model, center=model, grads_finite=got.finite)
    return got, contracts.exchanged(probe)

  @jax.jit
  def local_step(x, rule_state, got, center):
    stepped = arrival.elastic_worker_step(
      strategy, loss_fn, unravel(x), rule_state, None, unravel(center), got
    )
    return ravel_pytree(stepped.model)[0], stepped.worker_state

  try:
    reply, center = link.reply()
  except _Stop:
    return 0, []
  del params_like  # the model starts from the centre the server sent
  # The reply's buffer is the inbox's, reused by the next receive: a centre kept is copied.
  x, read, version, step = jnp.array(center), jnp.array(center), reply.version, reply.step
  rule_state = rule.init(unravel(x))
  pushes, compute_times = 0, []
  try:
    while True:
      began = time.perf_counter()
      got, exchange = compute(x, rule_state, jnp.int32(step), data)
      exchange = bool(exchange)  # waits for the gradient
      compute_times.append(time.perf_counter() - began)
      link.pace(compute_times)
      header = dict(version=version, step=step, loss=float(got.loss), finite=bool(got.finite))
      if not exchange:
        link.send(link.header(wire.Kind.STEP, **header))
        x, rule_state = local_step(x, rule_state, got, x)  # the centre is not read off exchange steps
        link.check_stop()
      elif strategy.lock_free:  # EA-wild: step against the last read; the reply is the next read
        link.send(link.header(wire.Kind.PUSH, count=link.count, **header), np.asarray(x))
        x, rule_state = local_step(x, rule_state, got, read)
        reply, center = link.reply()
        read, version = jnp.array(center), reply.version
      else:  # EASGD, EAMSGD: the reply is the centre the exchange used
        link.send(link.header(wire.Kind.PUSH, count=link.count, **header), np.asarray(x))
        reply, center = link.reply()
        x, rule_state = local_step(x, rule_state, got, wire.to_device(center))
        version = reply.version
      step += 1
      pushes += 1
  except _Stop:
    return pushes, compute_times


def _wait(poller, timeout: float, peer: str, alive, notice=None) -> None:
  """Returns once a message is ready; raises ServerGoneError after ``timeout`` s or when ``peer`` is lost.

  ``notice()`` (the worker's :class:`_Notice`) is asked while it waits: a worker told to leave does not
  wait for a reply that may be a whole round away.
  """
  deadline = time.perf_counter() + timeout
  while time.perf_counter() < deadline:
    if poller.poll(200):
      return
    if notice is not None:
      notice()
    if alive is not None and not alive():
      raise ServerGoneError(f"{peer} is lost; resume with `jaxsync resume RUN_DIR`.")
  raise ServerGoneError(f"no reply from {peer} for reply_timeout={timeout} s; it is stuck or unreachable.")
