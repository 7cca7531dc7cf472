"""jaxsync.sim: K heterogeneous workers and a server in one process, compiled end to end.

Build a strategy (:mod:`jaxsync.strategies`), a loss function, per-worker data
(:class:`WorkerData`) and a :class:`TimeModel`, then call :func:`run` (or use a
:class:`Simulator` to advance in chunks and checkpoint the state between them).
"""

from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.runtime.history import History
from jaxsync._src.sim.events import EventState
from jaxsync._src.sim.rounds import RoundState
from jaxsync._src.sim.simulator import Simulator, run
from jaxsync._src.sim.time_model import (
  LINK_PRESETS,
  Link,
  TimeModel,
  compute_time_from_flops,
  link,
  message_bytes,
)
from jaxsync._src.steps.records import EventRecord

__all__ = [
  "LINK_PRESETS",
  "EventRecord",
  "EventState",
  "History",
  "Link",
  "RoundState",
  "Simulator",
  "TimeModel",
  "WorkerData",
  "compute_time_from_flops",
  "link",
  "message_bytes",
  "run",
]
