"""The server's data plane: its ZeroMQ ROUTER socket, the inbox messages land in, who is on each connection.

A message arrives as ``[identity, header, payload...]``; its payload lands in
one preallocated, aligned buffer (:class:`wire.Inbox`) that the compiled step
adopts without a copy. A reply goes out without blocking: a worker that is
gone (``ROUTER_MANDATORY``) or not reading is left to liveness to notice.
"""

from __future__ import annotations

import collections
import logging
import secrets

import zmq

from jaxsync._src.distributed import wire

log = logging.getLogger("jaxsync.server")

UNANSWERED = ("malformed", "token")
"""Rejections with no ERROR reply: not one of this run's processes, so no answer to feed a flood."""


class Transport:
  """The socket, the inbox and the connections' registry of one server process.

  Args:
    bind: the interface to bind.
    port: the ROUTER socket's port (0: a free one); other sockets bound here take a free one.
    advertise: the host others connect to (default ``bind``).

  Attributes:
    token: the run token every message carries (a shard that follows takes its leader's).
    address: the ROUTER socket's address, once :meth:`open`.
    rejected: rejected messages by reason.
    deferred: messages received while the server waited for others (InHAD's pulls), handled next.
  """

  def __init__(self, *, bind: str, port: int, advertise: str | None):
    self.token = secrets.token_bytes(16)
    self._bind_to, self._port, self._advertise = bind, port, advertise
    self.socket = None
    self.address: str | None = None
    self.inbox: wire.Inbox | None = None
    self._identity: dict[int, bytes] = {}
    self._worker_of: dict[bytes, int] = {}
    self.rejected: collections.Counter[str] = collections.Counter()
    self.deferred: collections.deque = collections.deque()

  @property
  def is_open(self) -> bool:
    return self.socket is not None

  def open(self, max_bytes: int, capacity: int | None = None) -> None:
    """Binds the ROUTER socket, refusing frames over ``max_bytes``; ``capacity``: the inbox's bytes."""
    socket = zmq.Context.instance().socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished worker raises, not vanishes
    socket.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a worker that reconnects keeps its identity
    # Set before bind (a listener copies its options): a longer frame is refused before it is read whole.
    socket.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    self.socket, self.address = socket, self.bind(socket)
    self.inbox = wire.Inbox(max_bytes, capacity=capacity)
    self._poller = zmq.Poller()
    self._poller.register(socket, zmq.POLLIN)

  def bind(self, socket) -> str:
    """Binds ``socket`` to the interface (the ROUTER socket to the port asked for); returns its address."""
    port = self._port if socket.type == zmq.ROUTER else 0
    if port == 0:
      port = socket.bind_to_random_port(f"tcp://{self._bind_to}")
    else:
      socket.bind(f"tcp://{self._bind_to}:{port}")
    return f"tcp://{self._advertise or self._bind_to}:{port}"

  def close(self, linger: int) -> None:
    self.socket.close(linger=linger)

  # -- who is on each connection ----------------------------------------------------------------

  def register(self, identity: bytes, worker: int) -> None:
    """Worker ``worker`` speaks on the connection ``identity`` (its HELLO came on it)."""
    old = self._identity.get(worker)
    if old is not None and old != identity:
      self._worker_of.pop(old, None)
    self._identity[worker] = identity
    self._worker_of[identity] = worker

  def worker_of(self, identity: bytes) -> int | None:
    return self._worker_of.get(identity)

  def registered(self, worker: int) -> bool:
    return worker in self._identity

  # -- sending ----------------------------------------------------------------------------------

  def send(self, worker: int, header: wire.Header, payload=None) -> bool:
    """Sends worker ``worker`` a message; False when no connection is registered for it (nothing sent)."""
    identity = self._identity.get(worker)
    if identity is None:
      return False
    try:
      self.send_to(identity, header, payload)
    except zmq.ZMQError:  # gone (ROUTER_MANDATORY) or not reading (zmq.Again): liveness will tell
      log.warning("worker %d: reply not delivered (its connection is gone)", worker)
    return True

  def send_to(self, identity: bytes, header: wire.Header, payload=None) -> None:
    """Sends the connection ``identity`` a message; raises ``zmq.ZMQError`` if it cannot be sent now."""
    self.socket.send_multipart([identity, *wire.encode(header, payload)], copy=False, flags=zmq.NOBLOCK)

  def reject(self, identity: bytes, reason: str, detail: str, worker: int | None) -> None:
    """Counts and logs a rejected message; answers its sender with an ERROR unless :data:`UNANSWERED`."""
    self.rejected[reason] += 1
    who = f"worker {worker}" if worker is not None else "an unknown peer"
    log.warning("rejected a message from %s: %s (%s)", who, reason, detail)
    if reason in UNANSWERED:
      return
    header = wire.Header(
      kind=wire.Kind.ERROR, token=self.token, worker=-1 if worker is None else worker, reason=reason
    )
    try:
      self.send_to(identity, header)
    except zmq.ZMQError:
      pass

  # -- receiving --------------------------------------------------------------------------------

  def poll(self, timeout_ms: int) -> bool:
    """Whether a message is waiting, within ``timeout_ms``."""
    return bool(self._poller.poll(timeout_ms))

  def receive(self) -> list:
    """The next message's frames: its sender's identity, the header, then the payload in the inbox.

    The payload is valid until the next :meth:`receive`.
    """
    return self.inbox.receive(self.socket, routed=True)

  def defer(self, frames: list) -> None:
    """Keeps a received message to handle later: a payload's frame is the inbox's, which the next receive
    overwrites, so it is copied (an oversized one is kept as its length)."""
    self.deferred.append(
      [f if isinstance(f, (zmq.Frame, wire.OversizedPayload)) else bytes(f) for f in frames]
    )

  def sender_of_next(self) -> int | None:
    """Receives the next message whole, whatever its size; returns its sender (None: no one registered)."""
    return self._worker_of.get(self.socket.recv_multipart(copy=False)[0].bytes)
