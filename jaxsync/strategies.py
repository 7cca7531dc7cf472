"""jaxsync.strategies: every synchronization strategy of the papers, by name.

``make(name, num_workers, **options)`` builds a :class:`Strategy` (server rule,
dispatch policy, worker rule) with the papers' defaults; ``names()`` lists the
registry and ``describe(name)`` a strategy's options and defaults.
"""

from jaxsync._src.strategies.registry import (
  Strategy,
  StrategyInfo,
  describe,
  make,
  names,
  reject_nonfinite,
)

__all__ = [
  "Strategy",
  "StrategyInfo",
  "describe",
  "make",
  "names",
  "reject_nonfinite",
]
