"""Where configs end: a :class:`Config` turned, eagerly and once, into the library's plain objects.

Everything a run needs (data, model, strategy, time model, simulator) is built
here before training starts, so a bad value fails in seconds with the config
key it came from, not minutes into a run. Library errors (``ValueError`` with
the argument's name) are re-raised as :class:`ConfigError` prefixed with the
config section they belong to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

from jaxsync._src.app.config import Config, ConfigError
from jaxsync._src.data import datasets
from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.models import networks as models
from jaxsync._src.sim.simulator import Simulator
from jaxsync._src.sim.time_model import TimeModel, compute_time_from_flops
from jaxsync._src.strategies import registry as strategies


@contextlib.contextmanager
def _section(name: str):
  try:
    yield
  except ConfigError:
    raise
  except ValueError as err:
    raise ConfigError(f"{name}: {err}") from None


@dataclasses.dataclass
class Experiment:
  """A config's run, built: everything :func:`jaxsync._src.training.train` takes, as plain objects."""

  config: Config
  dataset: datasets.Dataset
  model: models.Model
  strategy: strategies.Strategy
  time_model: TimeModel
  simulator: Simulator
  num_events: int

  @property
  def label(self) -> str:
    return f"{self.strategy.name} K={self.strategy.num_workers} seed={self.config.seed}"

  def train_kwargs(self) -> dict[str, Any]:
    """The plain keyword arguments of ``training.train`` this config asks for."""
    run = self.config.run
    return dict(
      num_events=self.num_events,
      seed=self.config.seed,
      log_every=run.chunk,
      checkpoint_every=run.checkpoint_every or 10 * run.chunk,
      max_time=run.max_time,
      target=None if run.target_accuracy is None else ("accuracy", run.target_accuracy),
      label=self.label,
    )


def gradients_per_event(strategy: strategies.Strategy) -> int:
  """Worker gradients one simulator event costs: 1 for an arrival, ``K x local_steps`` for a round."""
  if strategy.engine == "async":
    return 1
  # Every worker computes in a round, also those fastest-k cancels: the budget counts computed gradients.
  return strategy.num_workers * strategy.local_steps


def build(config: Config) -> Experiment:
  """Builds the data, model, strategy, time model and simulator of ``config``; raises ConfigError."""
  data_cfg, cluster = config.data, config.cluster
  with _section("data"):
    dataset = datasets.load(
      data_cfg.name, data_dir=data_cfg.data_dir, seed=config.seed, num_examples=data_cfg.num_examples
    )
  with _section("model"):
    hidden = {"hidden": tuple(config.model.hidden)} if config.model.hidden else {}
    model = models.make(
      config.model.name,
      input_shape=dataset.input_shape,
      num_classes=dataset.num_classes,
      seed=config.seed,
      **hidden,
    )
  with _section(f"strategy {config.strategy.name!r}"):
    strategy = strategies.make(config.strategy.name, cluster.num_workers, **config.strategy.options)
  with _section("data.batch_size"):
    data = WorkerData(
      dataset.train, num_workers=cluster.num_workers, batch_size=data_cfg.batch_size, seed=config.seed
    )
  with _section("cluster"):
    compute_time = cluster.compute_time or compute_time_from_flops(
      model.flops_per_sample, data_cfg.batch_size, cluster.device_flops
    )
    time_model = TimeModel(
      num_workers=cluster.num_workers,
      compute_time=compute_time,
      jitter_shape=cluster.jitter_shape,
      slow_fraction=cluster.slow_fraction,
      slowdown=cluster.slowdown,
      link=cluster.link,
      apply_time=cluster.apply_time,
      message_bytes=cluster.message_bytes,
    )
  run = config.run
  with _section("run"):
    simulator = Simulator(
      strategy,
      models.classification_loss(model),
      data,
      time_model,
      eval_fn=models.classification_metrics(model, dataset.test["image"], dataset.test["label"]),
      eval_every=run.eval_every,
      eval_every_time=run.eval_every_time,
    )
  num_events = math.ceil(run.gradients / gradients_per_event(strategy))
  return Experiment(config, dataset, model, strategy, time_model, simulator, num_events)


def for_strategy(config: Config, name: str, seed: int) -> Config:
  """``config`` with strategy ``name`` and ``seed``: the shared options it accepts, then ``compare.options[name]``.

  Returns the new config and is pure; options of ``strategy.options`` that
  ``name`` does not take are left out (see :func:`dropped_options`).
  """
  accepted = strategies.describe(name).options
  options = {k: v for k, v in config.strategy.options.items() if k in accepted}
  options.update(config.compare.options.get(name, {}))
  return dataclasses.replace(
    config,
    seed=seed,
    strategy=dataclasses.replace(config.strategy, name=name, options=options),
  )


def dropped_options(config: Config, name: str) -> list[str]:
  """The shared ``strategy.options`` that strategy ``name`` does not take."""
  accepted = strategies.describe(name).options
  return sorted(k for k in config.strategy.options if k not in accepted)
