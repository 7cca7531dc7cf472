"""Measurements of what the time model needs: a worker-step, a link's round trips, the server's work per arrival.

Each probe measures the real thing the multi-process runtime does: the
jitted gradient of the model on a batch, ZeroMQ messages between processes
(or hosts) in the runtime's framing, and the real :class:`ParameterServer`
answering pushes. The fits that turn the measurements into the time model's
numbers are in :mod:`fit`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import zmq

from jaxsync._src.core import validation
from jaxsync._src.distributed import wire
from jaxsync._src.distributed.server import param_server
from jaxsync._src.strategies import registry as strategies

_WHAT = "calibration"


def step_times(
  loss_fn: Callable[[Any, Any], Any],
  params: Any,
  batch_of: Callable[[int], Any],
  *,
  steps: int = 100,
  warmup: int = 3,
  start_at: float | None = None,
  slowdown: float = 1.0,
) -> np.ndarray:
  """Seconds of each of ``steps`` worker-steps: the jitted loss and gradient of ``loss_fn`` at ``params``
  on batch ``batch_of(i)``, waited for, after ``warmup`` steps (the first compiles).

  With ``slowdown`` above 1 the probe stands for an emulated slow worker: after
  each step it sleeps ``slowdown - 1`` times that step, as a run's emulated slow
  worker does (``cluster.emulate_slow_workers``), so that probes sharing the
  cores share them as the run's workers do. Only the steps are returned.

  Args:
    loss_fn: ``(params, batch) -> scalar``.
    params: the model's parameters.
    batch_of: ``step -> batch``.
    steps: steps timed, ``>= 2``.
    warmup: steps run first, not timed.
    start_at: optional ``time.time()`` to wait for after the warm-up, so that
      several processes measure over the same seconds (sharing the cores as
      a run's workers do).
    slowdown: ``>= 1``, the emulated slow worker's factor (1: a fast worker).

  Returns:
    ``float64[steps]``.
  """
  steps = validation.check_int(_WHAT, "steps", steps, low=2)
  warmup = validation.check_int(_WHAT, "warmup", warmup, low=1)
  slowdown = validation.check_real(_WHAT, "slowdown", slowdown, low=1.0)
  step = jax.jit(jax.value_and_grad(loss_fn))
  batches = [batch_of(i) for i in range(warmup + steps)]
  for i in range(warmup):
    jax.block_until_ready(step(params, batches[i]))
  if start_at is not None:
    time.sleep(max(0.0, start_at - time.time()))
  times = np.empty(steps)
  for i in range(steps):
    began = time.perf_counter()
    jax.block_until_ready(step(params, batches[warmup + i]))
    times[i] = time.perf_counter() - began
    if slowdown > 1.0:
      time.sleep((slowdown - 1.0) * times[i])
  return times


def evaluation_times(eval_fn: Callable[[Any], Any], params: Any, *, rounds: int = 10) -> np.ndarray:
  """Seconds of each of ``rounds`` jitted evaluations ``eval_fn(params)`` (after one that compiles)."""
  rounds = validation.check_int(_WHAT, "rounds", rounds, low=1)
  evaluate = jax.jit(eval_fn)
  jax.block_until_ready(evaluate(params))
  times = np.empty(rounds)
  for i in range(rounds):
    began = time.perf_counter()
    jax.block_until_ready(evaluate(params))
    times[i] = time.perf_counter() - began
  return times


# A control message of the shared-card probe: this prefix, then a verb and its argument.
_CONTROL = b"jaxsync-echo:"


def _control(frames) -> tuple[str, str] | None:
  """``(verb, argument)`` of a control message to the :class:`EchoServer` (a routed frame and one short
  frame with the prefix), None for any other message (echoed)."""
  if len(frames) != 2 or len(frames[1].buffer) > 64 or not bytes(frames[1].buffer).startswith(_CONTROL):
    return None
  verb, _, argument = bytes(frames[1].buffer)[len(_CONTROL) :].decode().partition(" ")
  return verb, argument


class EchoServer:
  """A ZeroMQ ROUTER that sends every message back as it came: the far end of :func:`round_trips`.

  Args:
    bind: the interface to listen on.
    port: the port (0: a free one).

  Example:
    >>> echo = EchoServer().start()  # doctest: +SKIP
    >>> round_trips(echo.address, [1024, 1 << 20])  # doctest: +SKIP
    >>> echo.stop()  # doctest: +SKIP
  """

  def __init__(self, bind: str = "127.0.0.1", port: int = 0):
    self._socket = zmq.Context.instance().socket(zmq.ROUTER)
    self._socket.setsockopt(zmq.LINGER, 0)
    if port:
      self._socket.bind(f"tcp://{bind}:{port}")
    else:
      port = self._socket.bind_to_random_port(f"tcp://{bind}")
    self.address = f"tcp://{bind}:{port}"
    self._stopping = threading.Event()
    self._thread = threading.Thread(target=self._serve, daemon=True)
    self._window: dict[str, Any] | None = None  # the shared-card probe's count, while it is on

  def start(self) -> EchoServer:
    self._thread.start()
    return self

  def serve_forever(self) -> None:
    """Echoes in this thread until the process is stopped (``jaxsync calibrate --serve-echo``)."""
    self._serve()

  def _serve(self) -> None:
    poller = zmq.Poller()
    poller.register(self._socket, zmq.POLLIN)
    while not self._stopping.is_set():
      if poller.poll(100):
        frames = self._socket.recv_multipart(copy=False)
        control = _control(frames)
        if control is None:
          self._count(frames)
          self._socket.send_multipart(frames, copy=False)
        else:
          self._socket.send_multipart([frames[0], self._answer(control)])

  def _count(self, frames) -> None:
    """Counts a message echoed while the shared-card probe is on: its sender and bytes (:func:`shared_card`)."""
    if self._window is not None:
      self._window["messages"] += 1
      self._window["bytes"] += sum(len(f.buffer) for f in frames[1:])
      self._window["senders"].add(bytes(frames[0].buffer))

  def _answer(self, control: tuple[str, str]) -> bytes:
    """The echo's side of :func:`shared_card` and :func:`stream_peer`: ``go SIZE`` starts the probe
    (peers polling ``state`` start pushing messages of SIZE bytes), ``state`` reports it, ``stop`` ends it."""
    verb, argument = control
    if verb == "go":
      self._window = {
        "size": int(argument),
        "messages": 0,
        "bytes": 0,
        "senders": set(),
        "since": time.perf_counter(),
      }
    elif verb == "stop":
      self._window = None
    window = self._window
    state = (
      {"on": False}
      if window is None
      else {
        "on": True,
        "size": window["size"],
        "messages": window["messages"],
        "bytes": window["bytes"],
        "senders": len(window["senders"]),
        "seconds": time.perf_counter() - window["since"],
      }
    )
    return _CONTROL + json.dumps(state).encode()

  def stop(self) -> None:
    self._stopping.set()
    self._thread.join(timeout=5)
    self._socket.close(linger=0)


def _dealer(address: str, timeout_ms: int = 60_000, *, unbounded: bool = False):
  """A DEALER connected to ``address`` (the runtime's transport), waiting ``timeout_ms`` at most for an
  answer; ``unbounded``: no high-water mark either way (a stream queues every message it sends)."""
  socket = zmq.Context.instance().socket(zmq.DEALER)
  socket.setsockopt(zmq.LINGER, 0)
  socket.setsockopt(zmq.RCVTIMEO, timeout_ms)
  if unbounded:
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
  socket.connect(address)
  return socket


def round_trips(
  address: str, sizes: Sequence[int], *, rounds: int = 20, warmup: int = 3, pause: float = 0.0
) -> dict[int, np.ndarray]:
  """Seconds of ``rounds`` round trips of a ``size``-byte message to the :class:`EchoServer` at ``address``
  and back, for each size (the runtime's transport: a DEALER to a ROUTER, zero-copy frames).

  With ``pause`` seconds idle before each (as a worker computes between its
  messages), a link that lets a burst through after an idle spell (a token
  bucket's allowance) shows it: the trips are faster than back to back.

  Returns:
    ``{size: float64[rounds]}``.
  """
  rounds = validation.check_int(_WHAT, "rounds", rounds, low=1)
  pause = validation.check_real(_WHAT, "pause", pause, low=0.0)
  socket = _dealer(address)
  out = {}
  try:
    for size in sizes:
      size = validation.check_int(_WHAT, "size", size, low=1)
      payload = np.ones(size, np.uint8)
      times = np.empty(rounds)
      for i in range(warmup + rounds):
        if pause:
          time.sleep(pause)
        began = time.perf_counter()
        socket.send(payload, copy=False)
        try:
          socket.recv(copy=False)
        except zmq.Again:
          raise TimeoutError(
            f"{_WHAT}: no echo from {address} within 60 s; is `jaxsync calibrate --serve-echo` running there?"
          ) from None
        if i >= warmup:
          times[i - warmup] = time.perf_counter() - began
      out[size] = times
  finally:
    socket.close(linger=0)
  return out


def stream_seconds(address: str, size: int, count: int) -> float:
  """Seconds to send ``count`` messages of ``size`` bytes back to back to the :class:`EchoServer` at
  ``address`` and have every echo back: a sustained transfer, which a shaped card's burst allowance does
  not hide (a single round trip of a message within the burst would be measured at the burst's speed)."""
  size = validation.check_int(_WHAT, "size", size, low=1)
  count = validation.check_int(_WHAT, "count", count, low=1)
  socket = _dealer(address, 120_000, unbounded=True)
  payload = np.ones(size, np.uint8)
  try:
    socket.send(payload, copy=False)  # connected, and the echo's first reply out of the way
    socket.recv(copy=False)
    began = time.perf_counter()
    for _ in range(count):
      socket.send(payload, copy=False)
    for _ in range(count):
      socket.recv(copy=False)
    return time.perf_counter() - began
  except zmq.Again:
    raise TimeoutError(f"{_WHAT}: the echo at {address} stopped answering within 120 s") from None
  finally:
    socket.close(linger=0)


def _ask(socket, verb: str, argument: str = "") -> dict[str, Any]:
  """Sends a control message to the echo on ``socket`` (a DEALER) and returns its state."""
  socket.send(_CONTROL + f"{verb} {argument}".encode())
  answer = bytes(socket.recv())
  return json.loads(answer[len(_CONTROL) :])


def stream_peer(address: str, *, lifetime: float = 3600.0, poll: float = 0.05, timeout: float = 60.0) -> int:
  """Another sender of :func:`shared_card` (``jaxsync calibrate --stream-peer``): waits until the probe
  is on at the :class:`EchoServer` at ``address``, then sends it messages of the probe's size, each as
  soon as the previous one's echo is back (a worker's push and pull), until the probe ends; again for
  the next probe, for ``lifetime`` seconds or until the echo leaves an answer out for ``timeout`` seconds.
  Returns the messages sent."""
  lifetime = validation.check_real(_WHAT, "lifetime", lifetime, low=0.0, low_open=True)
  timeout = validation.check_real(_WHAT, "timeout", timeout, low=0.0, low_open=True)
  socket = _dealer(address, int(timeout * 1000))
  sent, payload, until = 0, None, time.monotonic() + lifetime
  try:
    while time.monotonic() < until:
      state = _ask(socket, "state")
      if not state["on"]:
        time.sleep(poll)
        continue
      if payload is None or payload.size != state["size"]:
        payload = np.ones(state["size"], np.uint8)
      for _ in range(10):  # ten round trips between polls: the probe's own messages dominate
        socket.send(payload, copy=False)
        socket.recv(copy=False)
        sent += 1
  except zmq.Again:
    pass  # the echo is gone: the calibration is over
  finally:
    socket.close(linger=0)
  return sent


def shared_card(address: str, size: int, senders: int, *, seconds: float = 5.0, warmup: float = 1.0) -> dict:
  """The echo's card shared by ``senders`` hosts at once, each with one message of ``size`` bytes in
  flight (as a parameter server's workers push and pull): this process and ``senders - 1``
  :func:`stream_peer` processes on other hosts. Turns the probe on at the :class:`EchoServer` at
  ``address``, sends for ``warmup + seconds``, and reads the echo's count over the last ``seconds``.

  Several TCP flows into one card lose throughput a single stream does not (a switch's or a shaper's
  queue overflows and the flows back off: incast); what the card moves here is what a parameter server's
  interface moves when its workers push at once.

  Returns:
    ``{"messages", "bytes", "seconds", "senders"}`` over the measured window (``senders``: the distinct
    hosts whose messages the echo saw).

  Raises:
    RuntimeError: fewer than ``senders`` hosts sent (a peer not started, or started against another echo).
  """
  size = validation.check_int(_WHAT, "size", size, low=1)
  senders = validation.check_int(_WHAT, "senders", senders, low=1)
  seconds = validation.check_real(_WHAT, "seconds", seconds, low=0.0, low_open=True)
  socket = _dealer(address)
  payload = np.ones(size, np.uint8)
  try:
    _ask(socket, "go", str(size))
    began, first = time.monotonic(), None
    while time.monotonic() - began < warmup + seconds:
      socket.send(payload, copy=False)
      socket.recv(copy=False)
      if first is None and time.monotonic() - began >= warmup:
        first = _ask(socket, "state")
    last = _ask(socket, "state")
    _ask(socket, "stop")
  except zmq.Again:
    raise TimeoutError(f"{_WHAT}: the echo at {address} stopped answering within 60 s") from None
  finally:
    socket.close(linger=0)
  if last["senders"] < senders:
    raise RuntimeError(
      f"{_WHAT}: the shared-card probe expected {senders} senders at {address} but {last['senders']} sent; start "
      f"`jaxsync calibrate --stream-peer {address}` on {senders - 1} other host(s) first."
    )
  return {
    "messages": last["messages"] - first["messages"],
    "bytes": last["bytes"] - first["bytes"],
    "seconds": last["seconds"] - first["seconds"],
    "senders": last["senders"],
  }


# A worker's side of push and pull, without its compute: pushes a gradient of ``count`` float32 values
# as soon as the parameters arrive, ``rounds`` times, and prints each round trip's seconds.
_PUSH_CLIENT = textwrap.dedent(
  """
  import json, sys, time, numpy as np, zmq
  from jaxsync._src.distributed import wire
  wire.keep_freed_memory()  # as every process of a multi-process run
  address, token, count, rounds = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
  sock = zmq.Context.instance().socket(zmq.DEALER)
  sock.connect(address)
  sock.send_multipart(wire.encode(wire.Header(kind=wire.Kind.HELLO, token=token, worker=0)))
  reply = wire.decode_header(sock.recv_multipart(copy=False)[0], token=token)
  grad = np.full(count, 1e-6, np.float32)
  times = []
  for _ in range(rounds):
    began = time.perf_counter()
    header = wire.Header(kind=wire.Kind.PUSH, token=token, worker=0, version=reply.version, step=reply.step,
                         count=count)
    sock.send_multipart(wire.encode(header, grad), copy=False)
    frames = sock.recv_multipart(copy=False)
    reply = wire.decode_header(frames[0], token=token)
    wire.decode_payload(reply, frames[1:], dtype="float32", count=count)
    times.append(time.perf_counter() - began)
  print(json.dumps(times))
  """
)


def push_client(address: str, token: bytes, count: int, rounds: int) -> subprocess.Popen:
  """A process that pushes ``rounds`` gradients of ``count`` float32 values to the server at ``address``,
  each as soon as the previous reply is in, and prints the round trips' seconds as JSON on its stdout."""
  return subprocess.Popen(
    [sys.executable, "-c", _PUSH_CLIENT, address, token.hex(), str(count), str(rounds)],
    stdout=subprocess.PIPE,
    text=True,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )


def echo_of_pushes(count: int, rounds: int) -> np.ndarray:
  """The push client against a ROUTER that answers each push at once with a ready payload: the
  transport's share of a push and pull, none of the server's work."""
  token = bytes(16)
  socket = zmq.Context.instance().socket(zmq.ROUTER)
  socket.setsockopt(zmq.LINGER, 0)
  port = socket.bind_to_random_port("tcp://127.0.0.1")
  inbox, reply = wire.Inbox(4 * count), np.full(count, 1e-6, np.float32)
  header = wire.Header(kind=wire.Kind.PARAMS, token=token, worker=0)

  def serve():
    for _ in range(rounds + 1):  # HELLO, then every push
      frames = inbox.receive(socket, routed=True)
      socket.send_multipart([frames[0], *wire.encode(header, reply)], copy=False)

  thread = threading.Thread(target=serve, daemon=True)
  thread.start()
  client = push_client(f"tcp://127.0.0.1:{port}", token, count, rounds)
  out, _ = client.communicate(timeout=600)
  thread.join(timeout=60)
  socket.close(linger=0)
  return np.asarray(json.loads(out))


def _server_pushes(strategy_name: str, count: int, rounds: int) -> np.ndarray:
  """The push client against the real :class:`ParameterServer` running ``strategy_name`` (one worker) on
  ``count`` parameters: the transport plus the server's whole work per arrival."""
  strategy = strategies.make(strategy_name, 1, learning_rate=1e-3)
  server = param_server.ParameterServer(strategy)
  state = server.init({"w": jnp.zeros([count], jnp.float32)})
  client = push_client(server.address, server.token, count, rounds)
  server.advance(state, rounds)
  out, _ = client.communicate(timeout=600)
  server.stop(timeout=5)
  return np.asarray(json.loads(out))


def server_times(parameters: int, *, strategy: str = "asp", rounds: int = 30) -> dict[str, np.ndarray]:
  """Seconds per arrival the real parameter server spends on a push of ``parameters`` float32 values.

  A client process pushes ``rounds`` gradients, one after each reply, to the
  real server (ZeroMQ, header checks, the jitted rule, the reply) and to an
  echo of the same sockets that does no work; the difference of the medians
  is the server's own time per arrival. The first 5 round trips (compiling)
  are dropped.

  Returns:
    ``{"server": round trips through the server, "echo": through the echo}``, seconds.
  """
  parameters = validation.check_int(_WHAT, "parameters", parameters, low=1)
  rounds = validation.check_int(_WHAT, "rounds", rounds, low=2)
  echo = echo_of_pushes(parameters, rounds + 5)[5:]
  server = _server_pushes(strategy, parameters, rounds + 5)[5:]
  return {"server": server, "echo": echo}


def collective_times(sizes: Sequence[int], *, rounds: int = 20) -> dict[int, np.ndarray]:
  """Seconds of one all-reduce of ``size`` bytes across every process of this ``jax.distributed`` group.

  A jitted ``psum`` of one float32 buffer over all the group's devices (gloo
  on CPU), each call waited for, after one that compiles and connects: what a
  synchronous round's exchange pays. Every process of the group calls it with
  the same arguments, at the same time.

  Args:
    sizes: bytes per all-reduce (rounded down to whole float32 values, at least one).
    rounds: timed all-reduces per size.

  Returns:
    ``{size: [rounds] seconds}``.
  """
  import jax
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  rounds = validation.check_int("collective_times", "rounds", rounds, low=1)
  mesh = Mesh(np.asarray(jax.devices()), ("workers",))
  summed = jax.jit(
    jax.shard_map(
      lambda x: jax.lax.psum(x, "workers"), mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False
    )
  )
  out = {}
  for size in sizes:
    local = np.ones([max(1, int(size) // 4)], np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P()), local, local.shape)
    jax.block_until_ready(summed(x))
    times = []
    for _ in range(rounds):
      began = time.perf_counter()
      jax.block_until_ready(summed(x))
      times.append(time.perf_counter() - began)
    out[int(size)] = np.asarray(times)
  return out
