"""A parameter-server worker process: pull parameters, compute one message, push it, repeat.

Worker ``k`` runs :func:`arrival.worker_message`, the simulator's own worker
side, on its batch ``data.batch(k, step)`` (the step is the server's count of
its pushes, so a worker that rejoins after a restart continues its data where
the checkpoint left it). It holds its worker-rule state (local momentum, BB)
itself; a restarted worker starts that state afresh.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import zmq
from jax.flatten_util import ravel_pytree

from jaxsync._src.steps import arrival
from jaxsync._src.dist import wire
from jaxsync._src.dist.cluster import RunFaultError
from jaxsync._src.strategies.strategy import Strategy
from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.core import validation

log = logging.getLogger("jaxsync.worker")
_WHAT = "ps_worker"


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
  address: str,
  token: bytes,
  reply_timeout: float = 300.0,
  server_alive=None,
) -> dict[str, Any]:
  """Works for the server at ``address`` until it says STOP; returns counters.

  Args:
    strategy: the run's strategy (the worker rule is applied here).
    loss_fn: ``(params, batch) -> scalar``.
    data: the run's data, sharded over ``strategy.num_workers`` workers.
    params_like: parameters with the run's structure (to unravel payloads).
    worker: this worker's id ``k``.
    address: the server's ``tcp://host:port``.
    token: the run token (from the coordination service).
    reply_timeout: seconds to wait for any reply before giving up.
    server_alive: optional ``() -> bool`` checked while waiting (the
      coordination service's view of process 0).

  Returns:
    ``{"pushes": n, "wall_seconds": s, "compute_seconds": [per step]}``.

  Raises:
    ServerGoneError: no reply within ``reply_timeout`` or the server is dead.
    RejectedError: the server rejected a message.
  """
  worker = validation.check_int(_WHAT, "worker", worker, low=0)
  flat_like, unravel = ravel_pytree(params_like)
  count, dtype = int(flat_like.size), str(flat_like.dtype)
  worker_rule = strategy.worker_rule
  rule_state = worker_rule.init(params_like) if worker_rule is not None else None

  @jax.jit
  def compute(flat, rule_state, step, noise_ratio, data):  # data an argument: a buffer, not a constant
    out = arrival.worker_message(
      strategy, loss_fn, unravel(flat), rule_state, data.batch(worker, step), noise_ratio
    )
    return ravel_pytree(out.message)[0], out.worker_state, out.loss, out.finite, out.step_size

  socket = zmq.Context.instance().socket(zmq.DEALER)
  socket.setsockopt(zmq.LINGER, 0)
  # A fixed identity: after ZeroMQ reconnects (a network blip) the server still knows this worker.
  socket.setsockopt(zmq.ROUTING_ID, f"w{worker}-{token[:4].hex()}".encode())
  socket.setsockopt(zmq.MAXMSGSIZE, wire.max_message_bytes(count, dtype))
  socket.connect(address)
  poller = zmq.Poller()
  poller.register(socket, zmq.POLLIN)
  header = wire.Header(kind=wire.Kind.HELLO, token=token, worker=worker)
  socket.send_multipart(wire.encode(header))
  pushes, start, compute_times = 0, time.perf_counter(), []
  try:
    while True:
      frames = _receive(socket, poller, reply_timeout, server_alive)
      reply = wire.decode_header(frames[0], token=token)
      if reply.kind == wire.Kind.STOP:
        break
      if reply.kind == wire.Kind.ERROR:
        raise RejectedError(f"worker {worker}: the server rejected its message ({reply.reason or 'no reason'}).")
      payload = wire.decode_payload(reply, frames[1:], dtype=dtype, count=count)
      began = time.perf_counter()
      flat, rule_state, loss, finite, step_size = compute(
        jnp.asarray(payload), rule_state, jnp.int32(reply.step), jnp.float32(reply.noise_ratio), data
      )
      flat = np.asarray(flat)  # waits for the result: the step's compute time ends here
      compute_times.append(time.perf_counter() - began)
      push = wire.Header(
        kind=wire.Kind.PUSH,
        token=token,
        worker=worker,
        version=reply.version,
        step=reply.step,
        loss=float(loss),
        step_size=float(step_size),
        finite=bool(finite),
        dtype=dtype,
        count=count,
      )
      socket.send_multipart(wire.encode(push, flat), copy=False)
      pushes += 1
  finally:
    socket.close(linger=0)
  return {
    "pushes": pushes,
    "wall_seconds": time.perf_counter() - start,
    "compute_seconds": compute_times,  # per step, the first one includes compilation
  }


def _receive(socket, poller, timeout: float, server_alive) -> list[Any]:
  deadline = time.perf_counter() + timeout
  while time.perf_counter() < deadline:
    if poller.poll(200):
      return socket.recv_multipart(copy=False)
    if server_alive is not None and not server_alive():
      raise ServerGoneError("the parameter server (process 0) is lost; resume with `jaxsync resume RUN_DIR`.")
  raise ServerGoneError(
    f"no reply from the parameter server for reply_timeout={timeout} s; it is stuck or unreachable."
  )
