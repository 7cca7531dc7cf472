"""Hierarchical strategies: gradients summed within groups (nodes) first, then across them.

The two-level all-reduce (groups, then their leaders; Wongpanich et al.,
HPCAsia 2020) and InHAD, iteration-number based hierarchical aggregation
(J. Supercomputing 2021): node-local sums that the server pulls when the
nodes' iteration numbers reach a threshold.
"""

from __future__ import annotations

from jaxsync._src.core import validation
from jaxsync._src.strategies import pieces
from jaxsync._src.strategies.strategy import Communication, Dispatch, ServerTraffic
from jaxsync._src.strategies.synchronous import bsp
from jaxsync._src.strategies.table import Recipe, register

_INHAD_MEANINGS = {
  "local_workers": "workers per node (must divide K; default min(4, K))",
  "pull_threshold": "the sum of the nodes' iteration numbers at which the server pulls (default K)",
  "wait_for_pull": "workers wait for each pull's broadcast (lockstep) instead of computing on",
}


@register("hierarchical_allreduce", learning_rate=0.01)
def _hierarchical_allreduce(num_workers, *, momentum=0.9, group_size=None, weight_decay=0.0) -> Recipe:
  """BSP over a two-level all-reduce: groups of ``group_size`` (default 4), then leaders (HPCAsia 2020)."""
  return bsp(
    num_workers,
    momentum=momentum,
    communication="hierarchical",
    group_size=group_size,
    weight_decay=weight_decay,
  )


@register("inhad", learning_rate=0.01, meanings=_INHAD_MEANINGS)
def _inhad(
  num_workers,
  *,
  momentum=0.0,
  local_workers=None,
  pull_threshold=None,
  wait_for_pull=False,
  weight_decay=0.0,
) -> Recipe:
  """InHAD: node-local gradient sums, pulled by the server when their counts reach a threshold (J. Supercomputing 2021).

  ``local_workers`` per node (default ``min(4, K)``, dividing ``K``); the
  server pulls every node's sum when the nodes' iteration numbers add up to
  ``pull_threshold`` (default ``K``). Workers keep computing on the last
  broadcast unless ``wait_for_pull`` (lockstep).
  """
  name = "inhad"
  local = pieces.check_divides(
    name, "local_workers", min(4, num_workers) if local_workers is None else local_workers, num_workers
  )
  threshold = validation.check_int(
    name, "pull_threshold", num_workers if pull_threshold is None else pull_threshold
  )
  lockstep = validation.check_bool(name, "wait_for_pull", wait_for_pull)
  if lockstep and threshold > num_workers:
    raise validation.invalid(
      name, "pull_threshold", threshold, f"at most num_workers={num_workers} with wait_for_pull=True"
    )
  momentum = pieces.check_momentum(name, momentum)
  decay = pieces.check_decay(name, weight_decay)
  blueprint = pieces.asynchronous(
    name,
    num_workers,
    dispatch=Dispatch.ON_RELEASE if lockstep else Dispatch.IMMEDIATE,
    communication=Communication.NODE_LOCAL,
    node_size=local,
    gradients_per_update=float(threshold),
    # Arrivals are summed at their node; the server's cost is the pull's update.
    server_traffic=ServerTraffic(pieces.ACCUMULATE_TRAFFIC, pieces.sgd_traffic(momentum)),
  )
  return Recipe(
    blueprint, lambda lr: (pieces.decayed(pieces.buffered_sgd(threshold, lr, momentum), decay), None)
  )
