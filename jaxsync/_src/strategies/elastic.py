"""Elastic averaging: workers and a centre pulled toward each other (EASGD, EAMSGD, EA-wild).

Asynchronous EASGD and EAMSGD (Zhang, Choromanska, LeCun, NeurIPS 2015) with a
locked centre every ``period`` steps, and EA-wild (Wongpanich, You, Demmel,
HPCAsia 2020): an exchange every step against a lock-free, possibly stale
read of the centre, optionally by synchronous groups.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from jaxsync._src.core import validation
from jaxsync._src.rules.elastic import ea_wild_center, easgd_center, easgd_worker
from jaxsync._src.strategies import pieces
from jaxsync._src.strategies.strategy import RateClock, ServerTraffic, WorkerProtocol
from jaxsync._src.strategies.table import Recipe, register

_EA_WILD_MEANINGS = {
  "group_size": "workers per synchronous group, each group one elastic worker (must divide K)",
}


def _moving_rate(name: str, moving_rate: float | None, num_workers: int) -> float:
  # EASGD's beta = p alpha = 0.9 (the EASGD authors' mpiT code): alpha = 0.9 / p.
  if moving_rate is None:
    return 0.9 / num_workers
  return validation.check_real(name, "moving_rate", moving_rate, low=0.0, high=1.0)


def _elastic(name, num_workers, worker: Callable[[Any], Any], center, traffic: float) -> Recipe:
  """An elastic strategy: ``worker`` is its worker rule as a function of the learning rate."""
  blueprint = pieces.asynchronous(
    name,
    num_workers,
    protocol=WorkerProtocol.ELASTIC,
    rate_clock=RateClock.WORKER_STEPS,
    gradients_per_update=None,
    # The centre's update on an exchange: the worker's model read, the centre read and written.
    server_traffic=ServerTraffic(0.0, traffic),
  )
  return Recipe(blueprint, lambda lr: (center, worker(lr)))


@register("easgd", learning_rate=0.1)
def _easgd(num_workers, *, moving_rate=None, period=10, weight_decay=0.0) -> Recipe:
  """Asynchronous EASGD: local SGD, an elastic exchange with a locked centre every ``period`` steps (Zhang et al., NeurIPS 2015)."""
  alpha = _moving_rate("easgd", moving_rate, num_workers)
  worker = functools.partial(easgd_worker, moving_rate=alpha, period=period, weight_decay=weight_decay)
  return _elastic("easgd", num_workers, worker, easgd_center(alpha), pieces.SGD_TRAFFIC)


@register("eamsgd", learning_rate=0.01)
def _eamsgd(num_workers, *, momentum=0.99, moving_rate=None, period=10, weight_decay=0.0) -> Recipe:
  """EAMSGD: EASGD with local Nesterov momentum (Zhang, Choromanska, LeCun, NeurIPS 2015)."""
  alpha = _moving_rate("eamsgd", moving_rate, num_workers)
  worker = functools.partial(
    easgd_worker, moving_rate=alpha, period=period, momentum=momentum, weight_decay=weight_decay
  )
  return _elastic("eamsgd", num_workers, worker, easgd_center(alpha), pieces.SGD_TRAFFIC)


@register("ea_wild", learning_rate=0.1, meanings=_EA_WILD_MEANINGS)
def _ea_wild(num_workers, *, moving_rate=None, group_size=1, weight_decay=0.0) -> Recipe:
  """EA-wild: an elastic exchange every step against a lock-free, possibly stale read of the centre (HPCAsia 2020).

  With ``group_size`` G > 1 the workers form K/G groups: inside a group the
  gradients are all-reduced synchronously (the group steps on the mean of its
  members' batches, as fast as its slowest member plus a ring all-reduce over
  ``intra_link``), and each group makes one EA-wild exchange per step. The
  default moving rate is then ``0.9 / (K/G)``.
  """
  groups = pieces.check_divides("ea_wild", "group_size", group_size, num_workers)
  alpha = _moving_rate("ea_wild", moving_rate, num_workers // groups)
  worker = functools.partial(easgd_worker, moving_rate=alpha, period=1, weight_decay=weight_decay)
  # The lock-free increment also reads the centre the worker read.
  recipe = _elastic("ea_wild", num_workers, worker, ea_wild_center(alpha), 4.0)
  return recipe._replace(blueprint=dataclasses.replace(recipe.blueprint, lock_free=True, group_size=groups))
