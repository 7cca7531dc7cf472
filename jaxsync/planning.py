"""jaxsync.planning: plan a run at any scale on the simulator's own clock, without training.

:func:`jaxsync.plan` (also here as :func:`plan`) takes a model described by
its size (:class:`ModelSize`), a topology of workers and links
(:class:`Topology`), accelerators and an MFU, failures (:class:`Failures`) and
a list of strategies, and gives each strategy's step time, compute
utilization, bytes over the links, goodput, wall-clock time to a budget and
the bandwidth it needs for each level of compute utilization
(:class:`Plan`). ``jaxsync plan configs/plan/FILE.yaml`` does the same from a
config. The planner says nothing about accuracy or loss.
"""

from jaxsync._src.plan.hardware import ACCELERATORS, Accelerator, accelerator
from jaxsync._src.plan.planner import (
  LEVELS,
  PAPER_BANDWIDTHS,
  VALUE_DEPENDENT,
  Plan,
  StrategyPlan,
  event_timeline,
  needed_bandwidths,
  plan,
)
from jaxsync._src.plan.workload import Failures, ModelSize, Topology, gbits, goodput

__all__ = [
  "ACCELERATORS",
  "Accelerator",
  "Failures",
  "LEVELS",
  "ModelSize",
  "PAPER_BANDWIDTHS",
  "Plan",
  "StrategyPlan",
  "Topology",
  "VALUE_DEPENDENT",
  "accelerator",
  "event_timeline",
  "gbits",
  "goodput",
  "needed_bandwidths",
  "plan",
]
