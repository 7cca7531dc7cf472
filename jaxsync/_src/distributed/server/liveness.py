"""Which workers are alive: their heartbeats, asked at most twice a second, and the record of those lost.

``get_live_nodes`` on the coordination service is a barrier over the
processes it names, which busy workers cannot join; so each worker writes a
heartbeat to its key-value store and the server reads them on its own clock
(:class:`cluster.HeartbeatMonitor`). A worker killed with SIGKILL is noticed
within the heartbeat timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxsync._src.distributed.cluster import HeartbeatMonitor
from jaxsync._src.distributed.server.node_pulls import NodePulls

log = logging.getLogger("jaxsync.server")

_ASK_EVERY = 0.5  # seconds between two questions to the coordination service


class Liveness:
  """Asks which workers are live, and keeps the record of each worker declared lost.

  Args:
    query: ``() -> set of live worker ids``; None with a ``client``: the workers' heartbeats
      (worker ``k`` is process ``k + first_process``); None without one: every worker is live.
    client: the coordination-service client, or None.
    num_workers: the worker processes.
    first_process: worker 0's process (the processes before it serve).

  Attributes:
    lost: one entry per worker declared lost: its ``worker``, ``process``, ``wall_time`` and the
      server's ``version`` then.
  """

  def __init__(self, query: Callable[[], Any] | None, client: Any, *, num_workers: int, first_process: int):
    if query is None and client is not None:
      monitor = HeartbeatMonitor(client)
      processes = range(first_process, first_process + num_workers)
      query = lambda: {p - first_process for p in monitor.live(processes)}  # noqa: E731
    self._query, self._num_workers, self._first_process = query, num_workers, first_process
    self._asked = 0.0
    self.lost: list[dict[str, Any]] = []

  def live_workers(self) -> set[int] | None:
    """The live workers (None: not known, with no liveness or when the service did not answer)."""
    if self._query is None:
      return None
    try:
      return set(self._query())
    except Exception as err:  # the service could not answer this time; ask again later
      log.warning("liveness query failed: %s", err)
      return None

  def newly_lost(
    self, live: np.ndarray, *, version: int, clock: Callable[[], float], nodes: NodePulls | None
  ) -> list[int] | None:
    """The workers ``live`` (``bool[K]``: the server's view) holds live that are lost now; logged, recorded.

    With InHAD's ``nodes``, a lost aggregator's node is lost whole. None when
    the service was not asked (asked less than half a second ago) or did not
    answer.
    """
    now = time.perf_counter()
    if now - self._asked < _ASK_EVERY:
      return None
    self._asked = now
    alive = self.live_workers()
    if alive is None:
      return None
    lost = [w for w in range(self._num_workers) if live[w] and w not in alive]
    if nodes is not None:
      lost = nodes.with_their_nodes(lost, live)
    for worker in lost:
      event = {
        "worker": worker,
        "process": worker + self._first_process,
        "wall_time": clock(),
        "version": version,
      }
      self.lost.append(event)
      log.warning(
        "worker %d (process %d) lost at %.1f s, server version %d; going on with %d worker(s)",
        worker,
        event["process"],
        event["wall_time"],
        version,
        int(live.sum()) - len(lost),
      )
    return lost
