"""The server's side of InHAD's node aggregators: who the nodes are, what they hold, and the pulls.

A node's workers push to their node's aggregator (:mod:`node_aggregator`),
which keeps each gradient and reports its header here. The compiled step
runs on a zero message for every report but the one that completes a pull of
``T`` gradients: that one carries the pulled sum over the nodes (the rule's
buffer adds zeros until then, so the mean it releases is the same,
docs/algorithms.md §15). Each node holds each new version once (BROADCAST)
and answers its workers with it on the server's word (PARAMS directives,
HOLD, DROP).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import optax
import zmq

from jaxsync._src.distributed import node_aggregator, wire
from jaxsync._src.distributed.cluster import RunFaultError, heartbeat_timeout
from jaxsync._src.distributed.server import checks
from jaxsync._src.distributed.server.counters import host_value
from jaxsync._src.distributed.server.server_step import ServerState
from jaxsync._src.distributed.server.transport import Transport
from jaxsync._src.steps.records import EventRecord
from jaxsync._src.strategies.strategy import Strategy

log = logging.getLogger("jaxsync.server")


class NodePulls:
  """The nodes' registry, their counted gradients, and the pulls and broadcasts on the server's socket.

  Args:
    strategy: InHAD (:func:`node_aggregator.aggregates`).
    transport: the server's data plane.
    live_workers: ``() -> set of live worker ids`` (None: not known now).
    idle_timeout: the longest a pull waits for a node whose process still beats.

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

  def __init__(
    self,
    strategy: Strategy,
    transport: Transport,
    live_workers: Callable[[], set[int] | None],
    idle_timeout: float,
  ):
    self._strategy, self._transport = strategy, transport
    self._live_workers, self._idle_timeout = live_workers, idle_timeout
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
    self._count, self._dtype = 0, "float32"

  def expect(self, count: int, dtype: str) -> None:
    """The parameters' element count and dtype: a node's sum's."""
    self._count, self._dtype = count, dtype

  # -- who the nodes are ------------------------------------------------------------------------

  def hello(self, identity: bytes, node: int, version: int, payload: Callable[[], Any]) -> None:
    """Node ``node``'s aggregator joins on ``identity``: it is sent ``version``'s ``payload()``."""
    if not 0 <= node < self.count:
      raise wire.MessageError("worker", f"node={node}; expected 0..{self.count - 1}")
    self._forget(node)
    self.identity[node], self.node_of_identity[identity] = identity, node
    log.info("node %d's aggregator joined", node)
    self.broadcast(version, payload)

  def _forget(self, node: int) -> None:
    """A node that is gone (or joins again): no more pulls or broadcasts go to its old connection."""
    self.node_of_identity.pop(self.identity.pop(node, b""), None)
    self.version.pop(node, None)

  def speaks_for(self, identity: bytes, worker: int) -> bool:
    """Whether the connection ``identity`` is worker ``worker``'s node's aggregator."""
    return self.node_of_identity.get(identity) == worker // self.size

  def answered_worker(self, identity: bytes, header: wire.Header) -> int | None:
    """The worker an answer to this message names: the header's when a node sent it, else no one.

    A node that was declared lost, or speaks out of turn, is told which
    worker's message was refused, so it discards that gradient and the
    worker stops saying why; a stranger is not.
    """
    known = identity in self.node_of_identity or header.kind == wire.Kind.REPORT
    return header.worker if known else None

  def with_their_nodes(self, lost: list[int], live: np.ndarray) -> list[int]:
    """``lost`` and, for a lost node's first worker (whose process runs the aggregator), its node's live workers."""
    out = list(lost)
    for worker in lost:
      if worker % self.size == 0:
        node = worker // self.size
        self._forget(node)
        out += [w for w in range(worker, worker + self.size) if live[w] and w not in out]
        held = int(self.counted[node])
        log.warning(
          "node %d's aggregator (in worker %d's process) is lost: its workers are dropped with it%s",
          node,
          worker,
          f"; the {held} gradient(s) it held count as zeros at the next pull" if held else "",
        )
    return sorted(out)

  def count_orphans(self, state: ServerState) -> None:
    """Gradients the rule's buffer counts that no node of this run holds: a checkpoint's, after a restart."""
    buffered = int(host_value(optax.tree_utils.tree_get(state.rule_state, "accumulated_count")))
    orphans = buffered - int(self.counted.sum())
    if orphans != self.orphans:
      self.orphans = orphans
      log.warning(
        "%d gradient(s) counted before the checkpoint were held by the nodes of the run that wrote it; they "
        "count as zeros at the next pull",
        orphans,
      )

  # -- what goes to the nodes -------------------------------------------------------------------

  def broadcast(self, version: int, payload: Callable[[], Any]) -> None:
    """Every node that does not hold ``version`` yet gets it: one message per node per release.

    ``payload()`` is the version's parameters on the host, read once, and only if one is sent.
    """
    host = None
    for node in list(self.identity):
      if self.version.get(node) != version:
        host = payload() if host is None else host
        header = wire.Header(
          kind=wire.Kind.BROADCAST, token=self._transport.token, worker=node, version=version
        )
        if self._send(node, header, host):
          self.version[node] = version
          self.payload_messages += 1

  def stop(self) -> None:
    """Tells each node the run is over (each tells its workers)."""
    for node in list(self.identity):
      self._send(node, wire.Header(kind=wire.Kind.STOP, token=self._transport.token, worker=node))

  def _send(self, node: int, header: wire.Header, payload=None) -> bool:
    try:
      self._transport.send_to(self.identity[node], header, payload)
    except zmq.ZMQError:  # its process is gone (liveness will tell), or a blip ZeroMQ reconnects
      if node not in self.unreachable:
        log.warning("node %d: %s not delivered (its connection is gone)", node, header.kind.name)
      self.unreachable.add(node)
      return False
    self.unreachable.discard(node)
    return True

  # -- a report, and the pull it may complete ---------------------------------------------------

  def report(
    self,
    worker: int,
    finite: bool,
    arrive: Callable[[np.ndarray | None], tuple[ServerState, EventRecord, Any]],
  ) -> tuple[ServerState, EventRecord]:
    """A gradient its node holds: ``arrive(None)`` runs the step on a zero message, ``arrive(sum)`` on the
    pulled sum when this report completes a pull; ``arrive`` returns (state, record, the workers answered).

    The rule's buffer adds zeros for the reports before, so the mean it
    releases is the pulled sum's over ``T`` (docs/algorithms.md §15).
    """
    counted = bool(finite)  # the node's verdict; a NaN/Inf gradient is neither kept nor counted
    completes = counted and self.orphans + int(self.counted.sum()) + 1 >= self.threshold
    if counted:
      self.counted[node_aggregator.node_of(self._strategy, worker)] += 1
    hold = wire.Header(kind=wire.Kind.HOLD, token=self._transport.token, worker=worker)
    total = None
    if completes:
      self._transport.send(worker, hold)  # into its node's sum before the pull that counts it
      total = self._pull()
    state, row, send = arrive(total)
    if completes and bool(host_value(row.rejected)):
      # Finite gradients whose sum is not (an overflow): the rule rejected it, its T - 1 zeros stay counted.
      self.orphans = self.threshold - 1
      log.warning("pull %d: the pulled sum is not finite (an overflow); its gradients are lost", self.pulls)
    elif completes and not bool(host_value(row.released)):
      raise RunFaultError(
        f"pull {self.pulls} did not release an update: the server's count of the nodes' gradients "
        "disagrees with its rule's (a bug; please report it)."
      )
    if counted and not completes and not send[worker]:
      self._transport.send(worker, hold)
    return state, row

  def _pull(self) -> np.ndarray:
    """InHAD's pull: every node that holds counted gradients sends their sum; returns the sum over nodes.

    A node that does not answer within the heartbeat timeout (its process
    stopped or lost) adds nothing: its gradients count as zeros in the mean.
    Other messages that come meanwhile are deferred (:meth:`Transport.defer`).
    """
    self.pulls += 1
    wanted = {}
    for node, count in enumerate(self.counted):
      pull = wire.Header(
        kind=wire.Kind.PULL, token=self._transport.token, worker=node, version=self.pulls, step=int(count)
      )
      if count > 0 and node in self.identity and self._send(node, pull):
        wanted[node] = int(count)
    sums: dict[int, np.ndarray | None] = {}  # None: an answer that was rejected
    started = time.perf_counter()
    while len(sums) < len(wanted) and self._still_pulling(started, set(wanted) - set(sums)):
      if self._transport.poll(100):
        frames = self._transport.receive()
        if not self._take_sum(frames, wanted, sums):
          self._transport.defer(frames)  # handled after the pull
    sums = {node: got for node, got in sums.items() if got is not None}
    total = np.zeros([self._count], wire.numpy_dtype(self._dtype))
    for node in sorted(wanted):  # in node order: the same sum whatever order the nodes answered in
      if node in sums:
        np.add(total, sums[node], out=total)
    lost = self.orphans + int(self.counted.sum()) - sum(wanted[n] for n in sums)
    if lost:
      log.warning(
        "pull %d: %d gradient(s) were held by nodes that are lost, did not answer, or sent a sum it rejected; "
        "they count as zeros in its mean",
        self.pulls,
        lost,
      )
    self.counted[:], self.orphans = 0, 0
    self.payload_messages += len(sums)
    return total

  def _still_pulling(self, started: float, missing: set[int]) -> bool:
    """Whether to wait on for the ``missing`` nodes' sums: within the heartbeat timeout, and after it while
    every one of their aggregators' processes still beats (a large sum on a slow card), up to idle_timeout."""
    waited = time.perf_counter() - started
    if waited < heartbeat_timeout():
      return True
    if waited > self._idle_timeout:
      return False
    live = self._live_workers()
    return live is not None and all(node * self.size in live for node in missing)

  def _take_sum(self, frames, wanted: dict[int, int], sums: dict) -> bool:
    """Whether ``frames`` are a node's answer to the open pull (kept in ``sums`` when they check out)."""
    try:
      header = wire.decode_header(frames[1], token=self._transport.token) if len(frames) > 1 else None
    except wire.MessageError:
      return False  # the server's handling of a message rejects it
    if header is None or header.kind != wire.Kind.SUM:
      return False
    node = self.node_of_identity.get(frames[0].bytes)
    try:
      payload = checks.check_sum(
        header, frames[2:], node, wanted=wanted, pull=self.pulls, dtype=self._dtype, count=self._count
      )
    except wire.MessageError as err:
      self._transport.rejected[err.reason] += 1
      log.warning("rejected a sum: %s", err)
      if node in wanted and header.version == self.pulls:
        sums[node] = None  # answered: the pull does not wait for it any longer
      return True
    sums[node] = np.array(payload)  # the inbox's buffer takes the next sum
    return True

  def late_sum(self, header: wire.Header) -> None:
    """A SUM after its pull gave up on it (:meth:`_pull`): too late to apply, dropped."""
    self._transport.rejected["version"] += 1
    log.warning("node %d's sum for pull %d came after that pull; dropped", header.worker, header.version)
