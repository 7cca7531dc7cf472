"""jaxsync.sim: K heterogeneous workers and a server in one process, compiled end to end.

Build a strategy (:mod:`jaxsync.strategies`), a loss function, per-worker data
(:class:`WorkerData`) and a :class:`TimeModel`, then call :func:`run` (or use a
:class:`Simulator` to advance in chunks and checkpoint the state between them).
:func:`advise` runs several candidate strategies briefly on the same setup and
says which to use.
"""

from jaxsync._src.advisor.advisor import Advice, Estimate, advise, estimate, prefix, rank, short_run
from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.interface.history import History
from jaxsync._src.sim.events import EventState
from jaxsync._src.sim.layer_clock import LayerClock, RoundTimes
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
  "Advice",
  "Estimate",
  "EventRecord",
  "EventState",
  "History",
  "LayerClock",
  "Link",
  "RoundState",
  "RoundTimes",
  "Simulator",
  "TimeModel",
  "WorkerData",
  "advise",
  "compute_time_from_flops",
  "estimate",
  "link",
  "message_bytes",
  "prefix",
  "rank",
  "run",
  "short_run",
]
