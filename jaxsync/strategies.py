"""jaxsync.strategies: every synchronization strategy of the papers, by name.

``make(name, num_workers, **options)`` builds a :class:`Strategy` (server rule,
dispatch policy, worker rule) with the papers' defaults; ``names()`` lists the
registry and ``describe(name)`` a strategy's options and defaults;
``blueprint(name, num_workers, **options)`` gives its clock, topology and costs
without building a rule. Every strategy takes an optax schedule as
``learning_rate`` (counted on its :class:`RateClock`) and a coupled-L2
``weight_decay``.
"""

from jaxsync._src.strategies.registry import StrategyInfo, blueprint, describe, make, names
from jaxsync._src.strategies.strategy import (
  Blueprint,
  RateClock,
  ServerTraffic,
  Strategy,
  dynamic_local_steps,
  reject_nonfinite,
  with_model_state,
  with_worker_speeds,
)

__all__ = [
  "Blueprint",
  "RateClock",
  "ServerTraffic",
  "Strategy",
  "StrategyInfo",
  "blueprint",
  "describe",
  "dynamic_local_steps",
  "make",
  "names",
  "reject_nonfinite",
  "with_model_state",
  "with_worker_speeds",
]
