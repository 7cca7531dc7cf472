"""The roles a process plays in a multi-process run, and the order in which they start and leave.

Every process of a run calls :func:`run_process` with the same strategy, data
and model; its index in the :class:`ProcessGroup` picks its role:

* a synchronous strategy (BSP, all-reduce, local SGD, ...): every process is
  one worker of a :class:`SyncRuntime`; they all leave together, process 0
  (the coordinator's host) last;
* a strategy with a parameter server: processes ``0 .. S-1`` serve (process 0
  alone, or ``S`` shards of the parameters, shard 0 leading), every other
  process runs one worker (or one group of an EA-wild run) with
  :func:`run_worker`; for InHAD the first worker process of each node also
  runs the node's :class:`NodeAggregator`, and its workers talk to it instead
  of the server.

Rendezvous goes through the ``jax.distributed`` key-value store (the servers'
addresses, the run's token, each node aggregator's address), liveness through
heartbeats. The host loop that drives a runtime (checkpoints, evaluation,
progress) belongs to the training layer above this one: it comes in as
``drive(runtime, primary)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.distributed import cluster, node_aggregator, ps_worker, sync_runtime
from jaxsync._src.distributed.cluster import ProcessGroup
from jaxsync._src.distributed.server import param_server, shards
from jaxsync._src.interface.runtime import PreemptedError
from jaxsync._src.strategies.strategy import Strategy, WorkerProtocol

serves = param_server.serves


def run_process(
  strategy: Strategy,
  loss_fn: Callable,
  data: WorkerData,
  params: Any,
  *,
  group: ProcessGroup,
  servers: int,
  evaluation: dict[str, Any],
  drive: Callable[[Any, bool], Any],
  stop_requested: Callable[[], bool] | None = None,
  slowdowns: Sequence[float] | None = None,
  earlier: tuple[sync_runtime.EarlierShape, ...] = (),
) -> Any:
  """Plays this process's role in the run until the run ends; process 0's result, None elsewhere.

  Args:
    strategy: the run's strategy (every process builds the same one).
    loss_fn: ``loss_fn(params, batch) -> scalar``.
    data: the workers' data.
    params: the initial parameters.
    group: this process's place in the run (``cluster.initialize``).
    servers: how many parameter-server shards (``1``: one server process).
    evaluation: the runtimes' evaluation keyword arguments (``eval_fn``,
      ``eval_every`` and ``eval_every_time``).
    drive: ``drive(runtime, primary)`` runs the host loop over ``runtime``
      (the training layer's ``train``) and returns its result; ``primary`` is
      True in the process that writes the run directory.
    stop_requested: ``() -> bool``, True once this process got a preemption
      notice (the drive asks it too, between chunks); a parameter-server
      worker asks it while it works (:func:`ps_worker.run_worker`).
    slowdowns: optional per-worker (per EA-wild group) compute-time factors
      ``>= 1``: a worker with a factor ``s > 1`` sleeps ``(s - 1)`` times each
      step's measured compute time after it, as the simulator's slow workers
      are slower (``cluster.emulate_slow_workers``).
    earlier: a synchronous run's earlier shapes, when it shrank or grew
      (``jaxsync launch --min-workers``; ``SyncRuntime``'s ``earlier``).

  Returns:
    What ``drive`` returned in process 0 (with the parameter server's fault
    counts added to its ``summary`` when there is a server); None in every
    other process.
  """
  _log_to_stderr()
  client = cluster.coordination_client()
  if not serves(strategy):
    return _sync_worker(strategy, loss_fn, data, group, client, evaluation, drive, slowdowns, earlier)
  if group.index < servers:
    return _serve(strategy, group, servers, client, evaluation, drive)
  slowdown = 1.0 if slowdowns is None else slowdowns[group.index - servers]
  _ps_worker(strategy, loss_fn, data, params, group, servers, client, stop_requested, slowdown)
  return None


class RestartRoles(NamedTuple):
  """What a supervisor does when a process of a run fails (see :mod:`launch`).

  Attributes:
    alone: processes restarted alone; the rest of the run goes on meanwhile.
    kept_down: processes not restarted: the run goes on without them.
    settle: seconds to wait for process 0 to save and leave before every
      process restarts (a synchronous run's process 0 checkpoints every
      completed round when it loses a peer; a server saves what it can).
    host_service: whether the launcher hosts the coordination service (a
      synchronous run: its process 1 holds process 0's state, and writes the
      run in its place when process 0 dies, which a service inside process 0
      would not survive).
  """

  alone: frozenset[int]
  kept_down: frozenset[int]
  settle: float
  host_service: bool = False


def restart_roles(strategy: Strategy, num_processes: int, servers: int) -> RestartRoles:
  """Which processes of a run a supervisor restarts alone, which it leaves down, and how long to settle.

  A worker of a parameter-server run rejoins the running server (which drops
  it while it is gone and sends it the current parameters and its data step
  when it says HELLO): it restarts alone. An InHAD worker process is left down:
  the server drops its node whole and goes on with the others (a restarted
  aggregator cannot take its node's place in a running server). Every other
  process is part of what the run cannot go on without (a synchronous run's
  every worker, a server shard): its failure restarts the whole run from its
  checkpoint.
  """
  workers = frozenset(range(servers, num_processes))
  if not serves(strategy):
    return RestartRoles(frozenset(), frozenset(), settle=90.0, host_service=True)
  if node_aggregator.aggregates(strategy):
    return RestartRoles(frozenset(), workers, settle=15.0)
  return RestartRoles(workers, frozenset(), settle=15.0)


def _log_to_stderr() -> None:
  handler = logging.StreamHandler()
  handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
  logger = logging.getLogger("jaxsync")
  logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False  # absl configures the root logger too


def _sync_worker(
  strategy, loss_fn, data, group: ProcessGroup, client, evaluation, drive, slowdowns, earlier
) -> Any:
  """One worker of a synchronous run; every process leaves at the same barrier, process 0 last."""
  client.wait_at_barrier("jaxsync/run_directory_ready", 300_000)  # process 0 made it
  liveness = lambda: client.get_live_nodes(list(range(group.count)))  # noqa: E731
  runtime = sync_runtime.SyncRuntime(
    strategy, loss_fn, data, liveness=liveness, slowdowns=slowdowns, earlier=earlier, **evaluation
  )
  try:
    result = drive(runtime, group.is_primary)
  except PreemptedError:  # every process stopped at the same round (SyncRuntime.agree_to_stop)
    _leave_in_order(client, group)
    raise
  print(f"process {group.index}: final parameters sha256 {runtime.fingerprint(result.params)}", flush=True)
  _leave_in_order(client, group)
  return result if group.is_primary else None


def _ps_worker(
  strategy, loss_fn, data, params, group: ProcessGroup, servers: int, client, stop_requested, slowdown
) -> None:
  """A worker process of a parameter-server run (and, for InHAD, its node's aggregator)."""
  heartbeat = cluster.Heartbeat(client, group.index).start()
  # Process 0 may still compile; the other shards publish once the leader's token is out.
  worker = group.index - servers
  import jax

  try:
    addresses = [client.blocking_key_value_get(shards.key_address(s), 300_000) for s in range(servers)]
    token = client.blocking_key_value_get_bytes(param_server.KEY_TOKEN, 300_000)
  except (
    jax.errors.JaxRuntimeError
  ) as err:  # process 0 left (the run ended or stopped) while this one started
    raise ps_worker.ServerGoneError(
      f"worker {worker}: the coordination service (process 0) went away before this worker joined "
      f"({str(err).splitlines()[0]}); the run has ended, stopped or lost its server."
    ) from None
  aggregator, server_alive, peer = None, None, "the parameter server (process 0)"
  if node_aggregator.aggregates(strategy):  # InHAD: the node's first worker process runs its aggregator
    node = node_aggregator.node_of(strategy, worker)
    aggregator = node_aggregator.aggregator_for(
      strategy, worker, params, server=addresses[0], token=token, bind=group.bind, advertise=group.advertise,
    )  # fmt: skip
    if aggregator is not None:
      client.key_value_set(
        node_aggregator.key_address(node), aggregator.start().address, allow_overwrite=True
      )
    addresses = client.blocking_key_value_get(node_aggregator.key_address(node), 300_000)
    monitor = cluster.HeartbeatMonitor(client)
    lead = node * strategy.node_size + servers  # the aggregator's process
    server_alive = lambda: lead in monitor.live([lead])  # noqa: E731
    peer = f"node {node}'s aggregator (process {lead})"
  done = ps_worker.run_worker(
    strategy, loss_fn, data, params, worker=worker, address=addresses, token=token,
    server_alive=server_alive, peer=peer, stop_requested=stop_requested, slowdown=slowdown,
  )  # fmt: skip
  if aggregator is not None:
    aggregator.stop()
  heartbeat.stop()
  if done["preempted"]:  # the server goes on without it, as after a kill; it may be started again
    raise PreemptedError(
      None,
      f"worker {worker} left {ps_worker.PREEMPTION_GRACE:.0f} s after its preemption notice (SIGTERM), "
      f"after {done['pushes']} pushes; the server applied every one it received and goes on without it",
    )
  steps = done["compute_seconds"][1:]  # the first compiled
  per = "step"
  if strategy.protocol == WorkerProtocol.LOCAL:
    per = f"push ({strategy.local_steps_per_unit[worker]} local steps)"
  print(
    f"worker {worker}: {done['pushes']} pushes in {done['wall_seconds']:.1f} s on "
    f"{done['devices']} device(s), {1e3 * sum(steps) / max(len(steps), 1):.2f} ms of compute per {per} "
    f"(slowdown {slowdown:g}); the server said stop"
  )
  jax.distributed.shutdown()  # before process 0, which waits for this worker's heartbeat to go


def _serve(strategy, group: ProcessGroup, servers: int, client, evaluation, drive) -> Any:
  """A parameter-server process: the server (process 0), or one shard of a sharded server."""
  monitor = cluster.HeartbeatMonitor(client)
  workers = range(servers, group.count)
  if not group.is_primary:
    client.blocking_key_value_get_bytes(param_server.KEY_TOKEN, 600_000)  # the leader made the run directory
  server = param_server.ParameterServer(
    strategy,
    bind=group.bind,
    advertise=group.advertise,
    client=client,
    liveness=lambda: {p - servers for p in monitor.live(workers)},
    rejoin_wait=cluster.rejoin_wait(),
    num_shards=servers,
    shard=group.index,
    **evaluation,
  )
  if not group.is_primary:
    try:
      drive(server, False)
    except PreemptedError:  # the leader's: it stopped at its chunk's end, and this shard with it
      pass
    finally:
      server.stop()
    print(f"server shard {group.index}: done", flush=True)
    import jax

    jax.distributed.shutdown()
    return None
  preempted = None
  try:
    result = drive(server, True)
  except PreemptedError as err:  # its checkpoint is written; the workers are told to stop, and leave first
    preempted = err
  finally:
    server.stop()
  if preempted is not None:
    _wait_for_workers_to_leave(monitor, server)
    raise preempted
  result.summary.update(
    lost_workers=server.lost,
    rejected_messages=dict(server.rejected_messages),
    dropped_gradients=server.dropped_gradients,
  )
  _wait_for_workers_to_leave(monitor, server)
  return result


def _wait_for_workers_to_leave(monitor, server) -> None:
  """Process 0 hosts the coordinator: it leaves last, once the workers have left (15 s at most)."""
  lost = {x["process"] for x in server.lost}
  deadline = time.monotonic() + 15.0
  # A worker killed near the end leaves its key behind: it stops counting once its beats stop.
  while monitor.live(set(monitor.beats()) - lost) and time.monotonic() < deadline:
    time.sleep(0.2)
  time.sleep(1.0)


def _leave_in_order(client, group: ProcessGroup) -> None:
  """Every process finishes together; process 0, the coordinator's host, shuts down last."""
  import jax

  client.wait_at_barrier("jaxsync/finished", 600_000)
  if group.is_primary:
    time.sleep(1.0)  # the others' shutdown calls reach the coordinator first
  else:
    jax.distributed.shutdown()
