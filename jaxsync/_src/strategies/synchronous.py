"""Synchronous strategies: a barrier every round, the K gradients (or the k fastest) averaged.

BSP through a parameter server, over a ring all-reduce (the data-parallel
baseline of every paper), and fastest-k rounds that drop the stragglers.
The two-level all-reduce is in :mod:`hierarchical`; the local-update family
(local SGD, DiLoCo) in :mod:`low_communication`.
"""

from __future__ import annotations

import dataclasses

from jaxsync._src.core import validation
from jaxsync._src.strategies import pieces
from jaxsync._src.strategies.strategy import Blueprint, Engine, ServerTraffic, WorkerProtocol
from jaxsync._src.strategies.table import Recipe, register

_BSP_MEANINGS = {
  "communication": "how the K gradients are summed: parameter_server, ring or hierarchical (all-reduce)",
}
_FASTEST_K_MEANINGS = {
  "drop_rate": "the share of the slowest workers' gradients a round drops, when k is not given",
}


@register("bsp", learning_rate=0.01, meanings=_BSP_MEANINGS)
def bsp(
  num_workers,
  *,
  momentum=0.9,
  communication="parameter_server",
  group_size=None,
  weight_decay=0.0,
  server_optimizer="sgd",
) -> Recipe:
  """Bulk-synchronous SGD with momentum: a barrier, the mean of K gradients (the papers' synchronous baseline).

  ``server_optimizer="adam"`` (or ``"rmsprop"``) applies that optimizer to the mean gradient instead
  (``momentum`` is then unused): fully synchronous Adam, DiLoCo's baseline.
  """
  name = "bsp"
  communication = validation.check_choice(
    name, "communication", communication, ("parameter_server", "ring", "hierarchical")
  )
  if communication == "hierarchical":
    group_size = pieces.check_divides(
      name, "group_size", min(4, num_workers) if group_size is None else group_size, num_workers
    )
  elif group_size is not None:
    raise validation.invalid(name, "group_size", group_size, "None unless communication='hierarchical'")
  momentum = pieces.check_momentum(name, momentum)
  decay = pieces.check_decay(name, weight_decay)
  blueprint = Blueprint(
    name=name,
    num_workers=num_workers,
    engine=Engine.SYNC,
    protocol=WorkerProtocol.GRADIENT,
    communication=communication,
    gradients_per_round=num_workers,
    group_size=group_size or 1,
    gradients_per_update=float(num_workers),
    # A parameter server sums the K pushes; a ring does it in the network.
    server_traffic=ServerTraffic(pieces.ACCUMULATE_TRAFFIC, pieces.sgd_traffic(momentum)),
  )
  if server_optimizer != "sgd":
    optimizer, traffic = pieces.server_optimizer(name, server_optimizer)
    blueprint = dataclasses.replace(
      blueprint, server_traffic=ServerTraffic(pieces.ACCUMULATE_TRAFFIC, traffic)
    )
    return Recipe(blueprint, lambda lr: (pieces.decayed(optimizer(lr), decay), None))
  return Recipe(blueprint, lambda lr: (pieces.decayed(pieces.sgd(lr, momentum), decay), None))


@register("allreduce", learning_rate=0.01)
def _allreduce(num_workers, *, momentum=0.9, weight_decay=0.0, server_optimizer="sgd") -> Recipe:
  """BSP over a ring all-reduce instead of a parameter server (Horovod-style; Wongpanich et al., HPCAsia 2020)."""
  return bsp(
    num_workers,
    momentum=momentum,
    communication="ring",
    weight_decay=weight_decay,
    server_optimizer=server_optimizer,
  )


@register("fastest_k", "drop_worker", learning_rate=0.01, meanings=_FASTEST_K_MEANINGS)
def _fastest_k(num_workers, *, momentum=0.9, k=None, drop_rate=0.5, weight_decay=0.0) -> Recipe:
  """Synchronous rounds that aggregate the k fastest gradients and drop the rest (Dutta et al., AISTATS 2018)."""
  name = "fastest_k"
  rate = validation.check_real(name, "drop_rate", drop_rate, low=0.0, high=1.0, high_open=True)
  if k is None:
    k = max(1, round((1.0 - rate) * num_workers))
  k = validation.check_int(name, "k", k)
  if k > num_workers:
    raise validation.invalid(name, "k", k, f"an integer in [1, num_workers={num_workers}]")
  bsp_recipe = bsp(num_workers, momentum=momentum, weight_decay=weight_decay)
  return bsp_recipe._replace(
    blueprint=dataclasses.replace(bsp_recipe.blueprint, gradients_per_round=k, gradients_per_update=float(k))
  )
