"""InHAD's node aggregator: a node's workers push to it, the server pulls one sum per node.

InHAD ("Iteration number-based hierarchical gradient aggregation for
distributed deep learning", J. Supercomputing 2021) sums the gradients of a
node's ``W`` workers on the node, ``A_n += g``, counts them in the node's
iteration number ``IN_n``, reports ``IN_n`` to the server and sends ``A_n``
only when the server pulls it (docs/algorithms.md §15). The aggregator is the
node's half of that, between its workers and the parameter server:

* to its workers it is the server: the same messages (HELLO, PUSH, then
  PARAMS, STOP or ERROR), so :func:`ps_worker.run_worker` talks to it as it is;
* a worker's gradient stays on the node. The server gets its header alone
  (REPORT: the worker, the version, the data step, the loss and the node's
  own NaN/Inf verdict), so the server records the arrival and decides who is
  answered exactly as for a push;
* the server's answer to a REPORT settles that gradient: PARAMS (answer the
  worker now) or HOLD (answer it later) add it to ``A_n`` and one to
  ``IN_n``; ERROR or DROP discard it;
* PULL: the server counted ``c`` of the node's gradients since its last pull;
  the node sends SUM, ``A_n`` with ``IN_n = c``, and starts a new sum;
* BROADCAST: the parameters of a new version, once per node per release; a
  PARAMS directive names the version, and the node answers its worker with
  its own copy.

ZeroMQ keeps each connection's order, so a gradient is settled before any
PULL that counts it, and a node holds every version a directive names. The
node sums, in the parameters' dtype, in the order the server settled its
gradients: the arrival order, so a one-worker float32 run's pulled mean is
bit for bit the simulator's.

The aggregator is a thread of the node's first worker process (workers
``n W .. n W + W - 1`` form node ``n``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

import numpy as np
import zmq

from jaxsync._src.core import validation
from jaxsync._src.distributed import wire
from jaxsync._src.strategies.strategy import Communication, Strategy

log = logging.getLogger("jaxsync.node")
_WHAT = "NodeAggregator"


def key_address(node: int) -> str:
  """The coordination-service key under which node ``node``'s aggregator publishes its address."""
  return f"jaxsync/node/{node}/address"


def aggregates(strategy: Strategy) -> bool:
  """Whether ``strategy``'s workers push to node aggregators on real processes (InHAD)."""
  return strategy.communication == Communication.NODE_LOCAL


def node_of(strategy: Strategy, worker: int) -> int:
  """The node worker ``worker`` belongs to (its aggregator runs in the process of worker ``node * W``)."""
  return worker // strategy.node_size


class NodeAggregator:
  """Node ``node``'s aggregator: a ZeroMQ ROUTER for its workers, a DEALER to the server, one thread.

  Args:
    node: the node's id, ``0 .. K/W - 1``.
    workers: the node's worker ids.
    server: the parameter server's ``tcp://host:port``.
    token: the run token.
    count, dtype: the raveled parameters' size and dtype.
    bind: the interface the workers' socket binds to.
    advertise: the host the node's workers connect to (default ``bind``).

  Example:
    >>> node = NodeAggregator(node=0, workers=range(2), server=server.address, token=server.token,
    ...                       count=n, dtype="float32").start()  # doctest: +SKIP
    >>> run_worker(strategy, ..., worker=0, address=node.address, token=server.token)  # doctest: +SKIP

  References:
    InHAD, J. Supercomputing 2021 (doi:10.1007/s11227-021-04083-x).
  """

  def __init__(
    self,
    *,
    node: int,
    workers,
    server: str,
    token: bytes,
    count: int,
    dtype: str,
    bind: str = "127.0.0.1",
    advertise: str | None = None,
  ):
    self.node = validation.check_int(_WHAT, "node", node, low=0)
    if not isinstance(workers, range) or len(workers) < 1:
      raise validation.invalid(_WHAT, "workers", workers, "a non-empty range of worker ids")
    self.workers = workers
    self.server, self.token, self.count, self.dtype = server, token, int(count), str(dtype)
    self._bind, self._advertise = bind, advertise or bind
    np_dtype = wire.numpy_dtype(self.dtype)
    # Received frames are kept as they are (no copy): a BROADCAST replaces the parameters, never
    # overwrites them, since an answer still queued for a worker may point at the old ones.
    self._params: np.ndarray | None = None
    self._version: int | None = None
    self._sum = np.zeros([self.count], np_dtype)  # A_n
    self.iteration_number = 0  # IN_n: gradients in A_n
    self._unsettled: dict[int, np.ndarray] = {}  # a worker's gradient that waits for the server's word
    self._identity: dict[int, bytes] = {}
    self._worker_of: dict[bytes, int] = {}
    self._stopped = False
    self.rejected_messages = 0
    self.address: str | None = None
    self._ready, self._quit = threading.Event(), threading.Event()
    self._error: BaseException | None = None
    self._thread = threading.Thread(target=self._run, name=f"jaxsync-node-{node}", daemon=True)

  def start(self) -> NodeAggregator:
    """Starts the thread; returns once the workers' socket is bound (:attr:`address`)."""
    self._thread.start()
    self._ready.wait(60)
    if self._error is not None:
      raise self._error
    return self

  def stop(self, *, grace: float = 2.0) -> None:
    """Stops the thread after ``grace`` seconds more of answering late workers (with STOP, once stopped)."""
    self._quit.wait(grace)
    self._quit.set()
    self._thread.join(timeout=10)

  # -- the thread -------------------------------------------------------------------------------

  def _run(self) -> None:
    try:
      context = zmq.Context.instance()
      max_bytes = wire.max_message_bytes(self.count, self.dtype)
      local = context.socket(zmq.ROUTER)
      local.setsockopt(zmq.LINGER, 0)
      local.setsockopt(zmq.ROUTER_MANDATORY, 1)
      local.setsockopt(zmq.ROUTER_HANDOVER, 1)
      local.setsockopt(zmq.MAXMSGSIZE, max_bytes)
      port = local.bind_to_random_port(f"tcp://{self._bind}")
      up = context.socket(zmq.DEALER)
      up.setsockopt(zmq.LINGER, 1000)
      up.setsockopt(zmq.ROUTING_ID, f"n{self.node}-{self.token[:4].hex()}".encode())
      up.setsockopt(zmq.MAXMSGSIZE, max_bytes)
      up.connect(self.server)
    except BaseException as err:  # handed to start()
      self._error = err
      self._ready.set()
      return
    self._local, self._up = local, up
    self.address = f"tcp://{self._advertise}:{port}"
    self._ready.set()
    up.send_multipart(wire.encode(self._header(wire.Kind.NODE_HELLO, worker=self.node)))
    poller = zmq.Poller()
    poller.register(local, zmq.POLLIN)
    poller.register(up, zmq.POLLIN)
    try:
      while not self._quit.is_set():
        ready = dict(poller.poll(100))
        if up in ready:
          self._from_server(up.recv_multipart(copy=False))
        if local in ready:
          self._from_worker(local.recv_multipart(copy=False))
    finally:
      local.close(linger=0)
      up.close(linger=1000)

  def _header(self, kind: wire.Kind, **fields) -> wire.Header:
    return wire.Header(kind=kind, token=self.token, dtype=self.dtype, **fields)

  def _to_worker(self, worker: int, header: wire.Header, payload=None) -> None:
    identity = self._identity.get(worker)
    if identity is None:
      return
    try:
      self._local.send_multipart([identity, *wire.encode(header, payload)], copy=False, flags=zmq.NOBLOCK)
    except zmq.ZMQError:  # gone: the server's liveness check tells
      log.warning("node %d: worker %d's answer not delivered (its connection is gone)", self.node, worker)

  def _from_worker(self, frames) -> None:
    """A worker's message: HELLO and BYE go up as they are, a PUSH's gradient stays here (REPORT)."""
    identity = frames[0].bytes
    try:
      if len(frames) < 2:
        raise wire.MessageError("malformed", "an empty message")
      header = wire.decode_header(frames[1], token=self.token)
      payload = wire.decode_payload(header, frames[2:], dtype=self.dtype, count=self.count)
      if header.worker not in self.workers:
        raise wire.MessageError("worker", f"worker={header.worker}; node {self.node} has {self.workers}")
      if header.kind == wire.Kind.HELLO:
        self._identity[header.worker] = identity
        self._worker_of[identity] = header.worker
      elif self._worker_of.get(identity) != header.worker:
        raise wire.MessageError("worker", f"worker={header.worker} from a connection that did not say HELLO")
      elif header.kind not in (wire.Kind.PUSH, wire.Kind.BYE):
        raise wire.MessageError("malformed", f"a {header.kind.name} message sent to node {self.node}")
    except wire.MessageError as err:
      self.rejected_messages += 1
      log.warning("node %d: rejected a message: %s", self.node, err)
      return  # the server answers for what it rejects; a peer that is no worker of the node gets nothing
    if self._stopped:
      self._to_worker(header.worker, self._header(wire.Kind.STOP, worker=header.worker))
      return
    if header.kind == wire.Kind.PUSH:
      worker = header.worker
      # Never trust the sender's verdict: a NaN/Inf gradient is reported as such and never summed.
      finite = bool(header.finite) and bool(np.isfinite(payload).all())
      if finite:
        self._unsettled[worker] = payload
      header = dataclasses.replace(header, kind=wire.Kind.REPORT, finite=finite, count=0)
    self._up.send_multipart(wire.encode(header))

  def _settle(self, worker: int, *, keep: bool) -> None:
    """The server's word on ``worker``'s gradient: into ``A_n`` (``IN_n += 1``), or discarded."""
    gradient = self._unsettled.pop(worker, None)
    if gradient is None or not keep:
      return  # no gradient waits (a rejoin's answer, or a NaN/Inf gradient never kept), or it is dropped
    if self.iteration_number == 0:
      self._sum[:] = gradient
    else:
      np.add(self._sum, gradient, out=self._sum)
    self.iteration_number += 1

  def _from_server(self, frames) -> None:
    try:
      header = wire.decode_header(frames[0], token=self.token)
      payload = wire.decode_payload(header, frames[1:], dtype=self.dtype, count=self.count, directive=True)
    except wire.MessageError as err:
      log.error("node %d: a message from the server it cannot read: %s", self.node, err)
      return
    kind, worker = header.kind, header.worker
    if kind == wire.Kind.BROADCAST:
      self._params, self._version = payload, header.version
    elif kind == wire.Kind.PARAMS:
      self._settle(worker, keep=True)
      if header.version != self._version:
        log.error(
          "node %d: told to answer worker %d with version %d but holds %s", self.node, worker, header.version,
          self._version,
        )  # fmt: skip
        return
      self._to_worker(worker, dataclasses.replace(header, count=self.count), self._params)
    elif kind == wire.Kind.HOLD:
      self._settle(worker, keep=True)
    elif kind == wire.Kind.DROP:
      self._settle(worker, keep=False)
    elif kind == wire.Kind.ERROR:
      self._settle(worker, keep=False)
      self._to_worker(worker, header)
    elif kind == wire.Kind.PULL:
      self._pulled(header)
    elif kind == wire.Kind.STOP:
      self._stopped = True
      for w in self._identity:
        self._to_worker(w, self._header(wire.Kind.STOP, worker=w))
    else:
      log.error("node %d: a %s message from the server", self.node, kind.name)

  def _pulled(self, pull: wire.Header) -> None:
    """PULL: ``A_n`` (``IN_n`` gradients, the count the server names) goes up; a new sum starts."""
    if self.iteration_number != pull.step:
      log.error(
        "node %d: the server pulls %d gradients but the node holds %d", self.node, pull.step,
        self.iteration_number,
      )  # fmt: skip
    if self.iteration_number == 0:
      self._sum[:] = 0
    header = self._header(
      wire.Kind.SUM, worker=self.node, version=pull.version, step=self.iteration_number, count=self.count
    )
    self._up.send_multipart(wire.encode(header, self._sum), copy=True)  # the sum is reused at once
    self.iteration_number = 0


def aggregator_for(strategy: Strategy, worker: int, params_like: Any, **kwargs: Any) -> NodeAggregator | None:
  """The aggregator worker ``worker``'s process runs: its node's, when it is the node's first worker.

  Args:
    strategy: the run's strategy.
    worker: this process's worker id.
    params_like: parameters with the run's structure (the messages' size and dtype).
    **kwargs: :class:`NodeAggregator`'s ``server``, ``token``, ``bind``, ``advertise``.
  """
  if not aggregates(strategy) or worker % strategy.node_size:
    return None
  from jax.flatten_util import ravel_pytree

  flat = ravel_pytree(params_like)[0]
  node, size = node_of(strategy, worker), strategy.node_size
  return NodeAggregator(
    node=node, workers=range(node * size, (node + 1) * size), count=flat.size, dtype=str(flat.dtype), **kwargs
  )
