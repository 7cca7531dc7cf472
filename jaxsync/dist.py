"""jaxsync.dist: the registry's strategies on real processes, on ``jax.distributed``.

Asynchronous strategies (gradient and elastic) and synchronous rounds that
drop the slowest gradients (``fastest_k``) run on a :class:`ParameterServer`
(process 0, or processes ``0 .. S-1`` each owning a slice of the parameters:
``num_shards``) with :func:`run_worker` in every other process, each worker on
all its local devices (InHAD's workers through their node's
:class:`NodeAggregator`); the other synchronous ones on a :class:`SyncRuntime`
in every process. :func:`initialize` joins a run
(explicit, from ``jaxsync launch``, or a detected SLURM / TPU / Kubernetes
cluster) and :func:`launch` starts N local processes and restarts what fails
(:class:`RestartPolicy`). ``jaxsync launch`` and
``jaxsync train`` on a cluster put these together; see the documentation's
user guide, "Multi-process runs".
"""

from jaxsync._src.distributed.cluster import (
  ClusterError,
  Heartbeat,
  HeartbeatMonitor,
  ProcessGroup,
  RunFaultError,
  initialize,
)
from jaxsync._src.distributed.launch import RestartPolicy, launch
from jaxsync._src.distributed.node_aggregator import NodeAggregator
from jaxsync._src.distributed.ps_worker import RejectedError, ServerGoneError, run_worker
from jaxsync._src.distributed.server.param_server import ParameterServer, WorkerLostError
from jaxsync._src.distributed.server.server_step import ServerState
from jaxsync._src.distributed.sync_runtime import ProcessLostError, SyncRuntime, SyncState

__all__ = [
  "ClusterError",
  "Heartbeat",
  "HeartbeatMonitor",
  "NodeAggregator",
  "ParameterServer",
  "ProcessGroup",
  "ProcessLostError",
  "RejectedError",
  "RestartPolicy",
  "RunFaultError",
  "ServerGoneError",
  "ServerState",
  "SyncRuntime",
  "SyncState",
  "WorkerLostError",
  "initialize",
  "launch",
  "run_worker",
]
