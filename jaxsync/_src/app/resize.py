"""A synchronous run on fewer (or again all) of its workers: the config each size runs with.

``jaxsync launch --min-workers M`` restarts a synchronous run's survivors as a
run of ``K' < K`` workers, and grows it back when a replacement arrives
(``RUN_DIR/membership.jsonl`` records each size and the round it started at).
A run directory keeps its config as written; every process of a resized run
builds :func:`resized_config` of it:

* ``cluster.num_workers``: ``K'``, with the training set re-split into ``K'``
  shards;
* ``cluster.shrink_keeps: global_batch`` (the default): each worker's batch
  becomes ``round(b K / K')``, so that a round averages as many examples as
  before and the learning rate stays; ``worker_batch``: the batch stays, and
  a strategy whose update averages every worker's gradient (``allreduce``,
  ``bsp``) scales its learning rate by ``K'/K``, the linear scaling rule
  (Goyal et al., "Accurate, Large Minibatch SGD", 2017); a
  ``strategy.schedule.scale_with_batch`` of the config already says how, and
  is followed instead; a local strategy's rate is its workers' own, and stays;
* ``run.gradients``: the budget is the config's examples, ``run.gradients x
  b``; the rounds left are what remains of it at the new size's examples per
  round, so a cosine schedule ends with the run.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

from jaxsync._src.app.config import Config, ConfigError
from jaxsync._src.distributed import membership, roles
from jaxsync._src.distributed.membership import Segment
from jaxsync._src.distributed.sync_runtime import EarlierShape
from jaxsync._src.strategies import registry as strategies
from jaxsync._src.strategies.strategy import Communication, Strategy, WorkerProtocol


def batch_size(config: Config, workers: int) -> int:
  """Each worker's batch in a run of ``workers`` of the config's ``K``."""
  full, b = config.cluster.num_workers, config.data.batch_size
  if config.cluster.shrink_keeps == "worker_batch" or workers == full:
    return b
  return max(1, round(b * full / workers))


def _gradients_per_event(config: Config, workers: int) -> int:
  return strategies.blueprint(config.strategy.name, workers, **config.strategy.options).gradients_per_event


def _scales_rate(config: Config, workers: int) -> bool:
  """Whether the learning rate follows the size: a kept worker batch, an averaged gradient, and no
  ``scale_with_batch`` (which rescales by itself, from the new size)."""
  blueprint = strategies.blueprint(config.strategy.name, workers, **config.strategy.options)
  return (
    config.cluster.shrink_keeps == "worker_batch"
    and blueprint.protocol == WorkerProtocol.GRADIENT
    and not config.strategy.schedule.scale_with_batch
  )


def resized_config(config: Config, segments: list[Segment]) -> Config:
  """``config`` as the last of ``segments`` runs it (the config itself for one segment of its size)."""
  full, last = config.cluster.num_workers, segments[-1]
  if len(segments) == 1 and last.workers == full:
    return config
  k = last.workers
  examples = config.run.gradients * config.data.batch_size
  for segment, following in zip(segments, segments[1:]):  # what the earlier segments walked through
    rounds = following.from_event - segment.from_event
    examples -= rounds * _gradients_per_event(config, segment.workers) * batch_size(config, segment.workers)
  per_round = _gradients_per_event(config, k)
  rounds_left = max(0, math.ceil(examples / (per_round * batch_size(config, k))))
  options = dict(config.strategy.options)
  if _scales_rate(config, k):
    default = strategies.describe(config.strategy.name).options["learning_rate"]
    options["learning_rate"] = float(options.get("learning_rate", default)) * k / full
  return dataclasses.replace(
    config,
    cluster=dataclasses.replace(config.cluster, num_workers=k),
    data=dataclasses.replace(config.data, batch_size=batch_size(config, k)),
    strategy=dataclasses.replace(config.strategy, options=options),
    run=dataclasses.replace(config.run, gradients=(last.from_event + rounds_left) * per_round),
  )


def earlier_shapes(config: Config, segments: list[Segment]) -> tuple[EarlierShape, ...]:
  """The shapes before the last segment, most recent first, for ``SyncRuntime(earlier=...)``."""
  return tuple(
    EarlierShape(
      s.from_event, s.workers, batch_size(config, s.workers), tuple(membership.row_sources(segments, i))
    )
    for i, s in reversed(list(enumerate(segments[:-1])))
  )


def describe(config: Config, resized: Config, segments: list[Segment]) -> str:
  """One line: the size the run goes on with, and what changed with it."""
  full, k, start = config.cluster.num_workers, resized.cluster.num_workers, segments[-1].from_event
  b, b2 = config.data.batch_size, resized.data.batch_size
  rate = resized.strategy.options.get("learning_rate")
  if _scales_rate(config, k):
    lr = f"learning rate {rate:g} (x {k}/{full}, the linear scaling rule)"
  elif config.strategy.schedule.scale_with_batch and config.cluster.shrink_keeps == "worker_batch":
    lr = "learning rate rescaled by strategy.schedule.scale_with_batch"
  else:
    lr = "learning rate unchanged"
  rounds = resized.run.gradients // _gradients_per_event(config, k)
  return (
    f"{k} of {full} workers from round {start} (cluster.shrink_keeps={config.cluster.shrink_keeps}): batch per "
    f"worker {b2} (config {b}), {k * b2} examples per round (config {full * b}), {lr}; "
    f"{rounds} rounds in all"
  )


def for_run_directory(
  config: Config, run_dir: str | pathlib.Path
) -> tuple[Config, tuple[EarlierShape, ...], str | None]:
  """The config a run directory's processes build now, its earlier shapes, and the line that says so
  (None for a run that never changed size)."""
  segments = membership.read(run_dir, config.cluster.num_workers)
  if len(segments) == 1:
    return config, (), None
  resized = resized_config(config, segments)
  return resized, earlier_shapes(config, segments), describe(config, resized, segments)


def check_min_workers(
  strategy: Strategy, minimum: int, num_processes: int, max_restarts, rejoin_delay
) -> None:
  """``--min-workers``: a synchronous run's smallest size, when it shrinks instead of waiting; raises
  ConfigError naming the value and what would be valid."""
  problem = None
  if minimum < 1:
    problem = "expected the fewest workers the run goes on with, an integer >= 1"
  elif minimum > num_processes:
    problem = f"expected at most -n/--num-processes={num_processes}"
  elif roles.serves(strategy):
    problem = (
      f"expected it with a synchronous strategy: the workers of {strategy.name!r} (on a parameter server) "
      "already restart alone while the run goes on"
    )
  elif strategy.communication == Communication.HIERARCHICAL:
    problem = f"expected a flat all-reduce: {strategy.name!r}'s groups of {strategy.group_size} fix its size"
  elif not max_restarts or not rejoin_delay:
    problem = (
      "expected it with --max-restarts N (the restarts it makes) and --rejoin-delay SECONDS (when a lost "
      "worker's replacement arrives, and the run grows back)"
    )
  if problem:
    raise ConfigError(f"--min-workers={minimum} is invalid; {problem}.")
