"""Joining a multi-process run: ``jax.distributed.initialize``, explicit, from ``jaxsync launch``, or detected.

Which processes form the run is decided once, here, and logged:

1. explicit ``coordinator`` / ``num_processes`` / ``process_id`` (the
   ``jaxsync train --coordinator ... --num-processes ... --process-id ...``
   flags), else
2. the ``JAXSYNC_COORDINATOR`` / ``JAXSYNC_NUM_PROCESSES`` /
   ``JAXSYNC_PROCESS_ID`` environment that ``jaxsync launch`` sets, else
3. a cluster JAX detects itself (SLURM, TPU pods, Kubernetes, Open MPI) when
   it reports more than one process: ``jax.distributed.initialize()`` with no
   arguments, else
4. no one: a single process, which runs the simulator.

On CPU the cross-process collectives are gloo's, on this process's advertised
address (:func:`_gloo_on`). Recoverability is switched on so that the
coordination service outlives a lost worker process (an asynchronous run goes
on without it) and reports it in ``get_live_nodes``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable

import jax

from jaxsync._src.distributed import coordination_service, wire

ENV_COORDINATOR = "JAXSYNC_COORDINATOR"
ENV_NUM_PROCESSES = "JAXSYNC_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXSYNC_PROCESS_ID"
ENV_BIND = "JAXSYNC_BIND"
ENV_ADVERTISE = "JAXSYNC_ADVERTISE"

ENV_HEARTBEAT_TIMEOUT = "JAXSYNC_HEARTBEAT_TIMEOUT"
# Set by a supervisor that restarts failed worker processes (``jaxsync launch --max-restarts``): seconds a
# server that has lost every worker waits for one to rejoin before it stops the run.
ENV_REJOIN_WAIT = "JAXSYNC_REJOIN_WAIT"


def rejoin_wait() -> float:
  """``JAXSYNC_REJOIN_WAIT`` seconds (default 0: no supervisor restarts workers, so the server stops at once)."""
  raw = os.environ.get(ENV_REJOIN_WAIT, "0")
  try:
    value = float(raw)
  except ValueError:
    value = -1.0
  if not value >= 0:
    raise ClusterError(f"{ENV_REJOIN_WAIT}={raw!r} is invalid; expected seconds >= 0.")
  return value


def heartbeat_timeout() -> int:
  """Seconds without a heartbeat before a process counts as lost: ``JAXSYNC_HEARTBEAT_TIMEOUT``, default 10.

  Both the coordination service's own heartbeats and jaxsync's key-value
  heartbeats use it; it bounds how long a lost process goes unnoticed.
  """
  raw = os.environ.get(ENV_HEARTBEAT_TIMEOUT, "10")
  try:
    value = int(raw)
  except ValueError:
    value = 0
  if value < 1:
    raise ClusterError(
      f"{ENV_HEARTBEAT_TIMEOUT}={raw!r} is invalid; expected an integer number of seconds >= 1."
    )
  return value


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
  """This process's place in a multi-process run.

  Attributes:
    index: this process's id, ``0 .. count - 1`` (0 is the coordinator and,
      for asynchronous strategies, the parameter server).
    count: processes in the run.
    coordinator: the coordination service's ``host:port``.
    bind: the interface the run's sockets bind to (``127.0.0.1`` for
      ``jaxsync launch``; ``0.0.0.0`` only when asked for).
    how: how the group was found: ``"explicit"``, ``"launch"`` or the
      detected cluster's name.
    advertise: the host other processes reach this one at: the parameter
      server's published address and gloo's (``JAXSYNC_ADVERTISE``, else the
      bind address unless that is every interface, else the local address
      that routes to the coordinator).
  """

  index: int
  count: int
  coordinator: str
  bind: str
  how: str
  advertise: str = "127.0.0.1"

  @property
  def is_primary(self) -> bool:
    """Process 0: it writes the run directory."""
    return self.index == 0


class RunFaultError(RuntimeError):
  """A multi-process run lost a part it cannot go on without (a process, the server, every worker)."""


class ClusterError(ValueError):
  """Inconsistent or incomplete process-group arguments."""


def _explicit(coordinator, num_processes, process_id) -> tuple[str, int, int] | None:
  given = {"--coordinator": coordinator, "--num-processes": num_processes, "--process-id": process_id}
  if all(v is None for v in given.values()):
    return None
  missing = [k for k, v in given.items() if v is None]
  if missing:
    raise ClusterError(
      f"{', '.join(f'{k}={v!r}' for k, v in given.items())} is incomplete; expected all three "
      f"(missing {', '.join(missing)}), or none for auto-detection."
    )
  if not isinstance(num_processes, int) or num_processes < 1:
    raise ClusterError(f"--num-processes={num_processes!r} is invalid; expected an integer >= 1.")
  if not isinstance(process_id, int) or not 0 <= process_id < num_processes:
    raise ClusterError(f"--process-id={process_id!r} is invalid; expected 0 <= id < {num_processes}.")
  if ":" not in str(coordinator):
    raise ClusterError(f"--coordinator={coordinator!r} is invalid; expected HOST:PORT, e.g. 10.0.0.1:4321.")
  return str(coordinator), num_processes, process_id


def _from_launch() -> tuple[str, int, int] | None:
  if ENV_COORDINATOR not in os.environ:
    return None
  try:
    return os.environ[ENV_COORDINATOR], int(os.environ[ENV_NUM_PROCESSES]), int(os.environ[ENV_PROCESS_ID])
  except (KeyError, ValueError) as err:
    raise ClusterError(
      f"{ENV_COORDINATOR}={os.environ[ENV_COORDINATOR]!r} is set but {ENV_NUM_PROCESSES} / "
      f"{ENV_PROCESS_ID} are missing or not integers ({err})."
    ) from None


def _advertised_host(bind: str, coordinator: str) -> str:
  """The host others reach this process at: the bind address, or the one that routes to the coordinator."""
  if bind not in ("0.0.0.0", "*", "::"):
    return bind
  import socket

  host, port = coordinator.rsplit(":", 1)
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # no packet is sent: connect picks a route
    try:
      s.connect((host, int(port)))
      return s.getsockname()[0]
    except OSError:
      return socket.gethostbyname(socket.gethostname())


def detected_cluster() -> tuple[str, int] | None:
  """(name, process count) of the cluster environment JAX detects, when it has more than one process."""
  try:
    # The detectors jax.distributed.initialize() itself runs; JAX 0.10 exposes no public way to ask them.
    from jax._src import clusters

    for env in clusters.ClusterEnv._cluster_types:
      if env.is_env_present():
        count = env.get_process_count()
        return (env.__name__, int(count)) if count and int(count) > 1 else None
  except Exception:  # a detector that fails to read its environment means: not that cluster
    return None
  return None


def initialize(
  *,
  coordinator: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  bind: str | None = None,
  log: Callable[[str], None] = print,
) -> ProcessGroup | None:
  """Joins the multi-process run this process belongs to, or returns None for a single process.

  Args:
    coordinator, num_processes, process_id: explicit membership (all or none).
    bind: the interface the coordinator and the data plane bind to (default:
      ``JAXSYNC_BIND``, else ``127.0.0.1`` for a local coordinator and
      ``0.0.0.0`` for a cluster).
    log: where the decision is reported.

  Returns:
    The :class:`ProcessGroup`, or None when this is a single process.

  Raises:
    ClusterError: incomplete or invalid explicit arguments.
  """
  found = _explicit(coordinator, num_processes, process_id)
  how = "explicit"
  if found is None:
    found, how = _from_launch(), "launch"
  if found is None:
    cluster = detected_cluster()
    if cluster is None:
      return None
    how = cluster[0]
  # Both flags must be set before the backend starts; gloo only concerns CPU devices.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.config.update("jax_enable_recoverability", True)
  if found is not None:
    address, count, index = found
    host = address.rsplit(":", 1)[0]
    local = host in ("127.0.0.1", "localhost", "::1")
    bind = bind or os.environ.get(ENV_BIND) or ("127.0.0.1" if local else "0.0.0.0")
    port = address.rsplit(":", 1)[1]
    with _service_hosted_elsewhere():
      jax.distributed.initialize(
        coordinator_address=address,
        num_processes=count,
        process_id=index,
        coordinator_bind_address=f"{bind}:{port}",
        heartbeat_timeout_seconds=heartbeat_timeout(),
        initialization_timeout=120,
        local_device_ids=None,
      )
  else:
    bind = bind or os.environ.get(ENV_BIND) or "0.0.0.0"
    with _service_hosted_elsewhere():
      jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout(), initialization_timeout=300)
    address = str(_jax_distributed_state().coordinator_address)
  wire.keep_freed_memory()  # payload-sized buffers come and go with every message
  advertise = os.environ.get(ENV_ADVERTISE) or _advertised_host(bind, address)
  _gloo_on(advertise)  # before the backend starts: jax.process_index() below starts it
  group = ProcessGroup(
    index=jax.process_index(),
    count=jax.process_count(),
    coordinator=address,
    bind=bind,
    how=how,
    advertise=advertise,
  )
  jax.devices()  # the first device query is itself collective: every process makes it here
  log(
    f"jaxsync: process {group.index} of {group.count} ({how}; coordinator {group.coordinator}, "
    f"sockets on {group.bind}, reached at {group.advertise}, "
    f"{jax.local_device_count()} local {jax.default_backend()} device(s))"
  )
  return group


class _ServedElsewhere:
  """What process 0 holds for a coordination service another process runs: nothing to shut down."""

  def shutdown(self) -> None:
    pass


@contextlib.contextmanager
def _service_hosted_elsewhere():
  """Inside, ``jax.distributed.initialize`` in process 0 starts no coordination service when
  ``JAXSYNC_COORDINATION_SERVICE=launcher``: ``jaxsync launch`` (or a SLURM batch script) runs it
  (:mod:`coordination_service`), so that process 0's death is a peer's death.

  JAX 0.10 starts the service in process 0 unconditionally; its factory is replaced for the call.
  """
  if os.environ.get(coordination_service.ENV) != "launcher":
    yield
    return
  from jax._src import distributed

  factory = distributed._jax.get_distributed_runtime_service
  distributed._jax.get_distributed_runtime_service = lambda *args, **kwargs: _ServedElsewhere()
  try:
    yield
  finally:
    distributed._jax.get_distributed_runtime_service = factory


def _is_local_address(host: str) -> bool:
  """Whether a socket of this process can bind to ``host`` (an address of one of its interfaces)."""
  import socket

  try:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
      s.bind((host, 0))
    return True
  except OSError:
    return False


def _gloo_on(host: str) -> None:
  """Makes the CPU backend's gloo collectives listen on, and announce, ``host``: the advertised address.

  Left to itself gloo takes the address the machine's hostname resolves to,
  often 127.0.0.1 (or Debian's 127.0.1.1): a process on another host then
  dials its own loopback and the first collective fails with a connect
  timeout. JAX 0.10 has no setting for it, so the CPU backend's factory is
  registered again: the client JAX's own factory builds, with the host given
  to gloo (``make_gloo_tcp_collectives``'s ``hostname``). A host this process
  cannot bind to (a NAT's public address, say) leaves gloo's default.
  """
  if jax.config.jax_cpu_collectives_implementation != "gloo" or not _is_local_address(host):
    return
  from jax._src import xla_bridge
  from jax._src.lib import _jax
  from jax.extend import backend

  def make_cpu_client():
    collectives = _jax.make_gloo_tcp_collectives(
      distributed_client=_jax_distributed_state().client, hostname=host
    )
    return xla_bridge.make_cpu_client(collectives=collectives)

  backend.register_backend_factory("cpu", make_cpu_client, priority=0, fail_quietly=False)


def _jax_distributed_state():
  """``jax._src.distributed.global_state``: where jaxsync reads JAX's private distributed state.

  JAX 0.10 has no public accessor for the coordination service's client (its
  key-value store, barriers and ``get_live_nodes``) nor for the coordinator
  address it detected; ``jax.experimental.multihost_utils`` reads the same
  object internally.
  """
  from jax._src import distributed

  return distributed.global_state


def coordination_client():
  """The ``jax.distributed`` coordination service's client of this process (after :func:`initialize`).

  Its key-value store carries the run's control plane (the server's address,
  the run token, heartbeats) and its barriers order the processes' exits.
  """
  client = _jax_distributed_state().client
  if client is None:
    raise ClusterError("the coordination service is not running: call jaxsync's dist.initialize first.")
  return client


HEARTBEAT_PREFIX = "jaxsync/heartbeat/"


class Heartbeat:
  """A daemon thread that bumps ``jaxsync/heartbeat/INDEX`` in the coordination service's key-value store.

  ``get_live_nodes`` is a barrier over the processes it names (each must call
  it), so a parameter server cannot poll it while its workers compute; these
  heartbeats give it a one-sided view instead (:class:`HeartbeatMonitor`).
  """

  def __init__(self, client, index: int, *, every: float = 0.5):
    import threading

    self._client, self._key, self._every = client, f"{HEARTBEAT_PREFIX}{index}", every
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="jaxsync-heartbeat", daemon=True)

  def start(self) -> Heartbeat:
    self._thread.start()
    return self

  def _run(self) -> None:
    beat = 0
    while not self._stop.is_set():
      beat += 1
      try:
        self._client.key_value_set(self._key, str(beat), allow_overwrite=True)
      except Exception:  # the coordinator is gone; JAX itself ends this process
        return
      self._stop.wait(self._every)

  def stop(self) -> None:
    """Stops beating and removes the key: the process left on purpose."""
    self._stop.set()
    self._thread.join(timeout=5)
    try:
      self._client.key_value_delete(self._key)
    except Exception:
      pass


class HeartbeatMonitor:
  """Which processes still beat: a process is live until ``timeout`` seconds pass without a new beat.

  A process that has not beaten yet counts as live for ``startup`` seconds
  (it may still be compiling). Times are this process's own clock: no clock
  is compared across hosts.
  """

  def __init__(self, client, *, timeout: float | None = None, startup: float = 120.0):
    import time

    timeout = heartbeat_timeout() if timeout is None else timeout
    self._client, self._timeout, self._startup = client, timeout, startup
    self._clock = time.monotonic
    self._since = self._clock()
    self._seen: dict[int, tuple[str, float]] = {}

  def beats(self) -> dict[int, str]:
    """The current beat of every process that has a heartbeat key."""
    entries = self._client.key_value_dir_get(HEARTBEAT_PREFIX)
    return {int(key.rsplit("/", 1)[1]): value for key, value in entries}

  def live(self, processes) -> set[int]:
    """The subset of ``processes`` that is live now."""
    now, beats = self._clock(), self.beats()
    out = set()
    for p in processes:
      if p in beats:
        if self._seen.get(p, (None,))[0] != beats[p]:
          self._seen[p] = (beats[p], now)
        if now - self._seen[p][1] < self._timeout:
          out.add(p)
      elif p not in self._seen and now - self._since < self._startup:
        out.add(p)  # not started beating yet
    return out
