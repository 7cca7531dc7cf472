"""jaxsync.strategies: every synchronization strategy of the papers, by name.

``make(name, num_workers, **options)`` builds a :class:`Strategy` (server rule,
dispatch policy, worker rule) with the papers' defaults; ``names()`` lists the
registry and ``describe(name)`` a strategy's options and defaults. Every
strategy takes an optax schedule as ``learning_rate`` (counted on its
:class:`RateClock`) and a coupled-L2 ``weight_decay``.
"""

from jaxsync._src.strategies.registry import StrategyInfo, describe, make, names
from jaxsync._src.strategies.strategy import RateClock, ServerTraffic, Strategy, reject_nonfinite

__all__ = [
  "RateClock",
  "ServerTraffic",
  "Strategy",
  "StrategyInfo",
  "describe",
  "make",
  "names",
  "reject_nonfinite",
]
