"""The ``jax.distributed`` coordination service in a process of its own, so that process 0 may die like any other.

JAX starts the coordination service (the key-value store, barriers and
heartbeats every process of a run talks to) inside process 0. When process 0
dies the service goes with it, and JAX's client ends every other process at
once: a synchronous run then loses what its survivors held. ``jaxsync launch``
runs the service here instead, one process per start of the run, and tells
process 0 not to start its own (``JAXSYNC_COORDINATION_SERVICE=launcher``,
read by :func:`cluster.initialize`): the survivors of process 0 keep their
client, and process 1 writes the run's checkpoint in process 0's place.

    python -m jaxsync._src.distributed.coordination_service HOST:PORT NUM_PROCESSES HEARTBEAT_SECONDS

It prints ``ready`` once it listens, and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import signal
import sys
import threading

ENV = "JAXSYNC_COORDINATION_SERVICE"  # "launcher": the launcher hosts it; process 0 starts none


def serve(address: str, num_processes: int, heartbeat_seconds: int) -> None:
  """Runs the service at ``address`` for ``num_processes`` recoverable tasks until SIGTERM or SIGINT."""
  from jax._src.lib import _jax

  # Recoverable tasks, as cluster.initialize asks for (jax_enable_recoverability): a task that dies is
  # marked so, and its error is not sent to the others.
  service = _jax.get_distributed_runtime_service(
    address, num_processes, heartbeat_timeout=heartbeat_seconds, shutdown_timeout=60, recoverable=True
  )
  stop = threading.Event()
  for signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, lambda *_: stop.set())
  print("ready", flush=True)
  stop.wait()
  service.shutdown()


if __name__ == "__main__":
  serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
