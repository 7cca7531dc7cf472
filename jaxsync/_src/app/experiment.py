"""Where configs end: a :class:`Config` turned, eagerly and once, into the library's plain objects.

Everything a run needs (data, model, strategy, time model, loss, evaluation)
is built and checked here before training starts, so a bad value fails in
seconds with the config key it came from, not minutes into a run. Library
errors (``ValueError`` with the argument's name) are re-raised as
:class:`ConfigError` prefixed with the config section they belong to. The
runtime itself (the simulator, or a multi-process runtime) is built from these
pieces by whoever runs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxsync._src.advisor import advisor
from jaxsync._src.app.config import Config, ConfigError, ScheduleConfig
from jaxsync._src.core import import_path
from jaxsync._src.data import datasets
from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.interface.history import History
from jaxsync._src.models import networks as models
from jaxsync._src.sim.simulator import Simulator, check_gradient_batch
from jaxsync._src.sim.time_model import TimeModel
from jaxsync._src.steps.records import EvalSchedule
from jaxsync._src.strategies import registry as strategies
from jaxsync._src.strategies import schedules
from jaxsync._src.strategies.strategy import (
  Blueprint,
  RateClock,
  Strategy,
  with_model_state,
  with_worker_speeds,
)

# The share of the training examples a tuning run holds out and scores on (6,000 of Fashion-MNIST's 60,000).
TUNING_VALIDATION = 0.1


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
  """A config's run, built: the plain objects every runtime takes.

  Attributes:
    config: the config it was built from.
    dataset: the data, in memory.
    model: the model and its initial parameters.
    strategy: the registry strategy.
    time_model: the simulated cluster's clock (the simulator's only).
    data: the training data sharded over the workers.
    loss_fn: ``(params, batch) -> scalar``: the mean cross-entropy (per token, for a language model).
    eval_fn: ``params -> {"loss", "accuracy"}`` on the test split (next-token accuracy for a language model);
      with a validation split (``data.validation``) also ``validation_loss`` and ``validation_accuracy``,
      and only those with ``data.evaluate_on: validation`` (the test set is then never read).
    eval_every, eval_every_time: the evaluation schedule (one of them).
    num_events: events in the whole run (arrivals, or rounds).
  """

  config: Config
  dataset: datasets.Dataset
  model: models.Model
  strategy: Strategy
  time_model: TimeModel
  data: WorkerData
  loss_fn: Callable[[Any, Any], Any]
  eval_fn: Callable[[Any], dict[str, Any]]
  eval_every: int | None
  eval_every_time: float | None
  num_events: int

  def evaluation(self) -> dict[str, Any]:
    """The evaluation keyword arguments every runtime takes (``eval_fn``, ``eval_every``, ``eval_every_time``)."""
    return dict(eval_fn=self.eval_fn, eval_every=self.eval_every, eval_every_time=self.eval_every_time)

  def simulator(self) -> Simulator:
    """The simulated cluster of this run."""
    with _section("run"):
      return Simulator(
        self.strategy,
        self.loss_fn,
        self.data,
        self.time_model,
        gradient_batch=self.config.run.gradient_batch,
        **self.evaluation(),
      )

  def short_run(self, gradients: int, evaluations: int = 12) -> History:
    """The beginning of this run, its first ``gradients`` gradients (what ``jaxsync advise`` runs)."""
    return advisor.short_run(
      self.strategy,
      self.loss_fn,
      self.data,
      self.time_model,
      self.model.params,
      eval_fn=self.eval_fn,
      gradients=gradients,
      seed=self.config.seed,
      evaluations=evaluations,
    )

  def slowdowns(self) -> tuple[float, ...] | None:
    """Each unit's (worker's, or EA-wild group's) compute-time factor over a fast worker, when real
    processes emulate the cluster's slow workers (``cluster.emulate_slow_workers``); None otherwise."""
    if not self.config.cluster.emulate_slow_workers:
      return None
    factors = self.time_model.mean_compute_times() / np.min(self.time_model.mean_compute_times())
    g = self.strategy.workers_per_unit
    return tuple(float(np.max(factors[u * g : (u + 1) * g])) for u in range(len(factors) // g))

  @property
  def metric(self) -> str:
    """The accuracy a run's target, the advisor and tuning read: ``"accuracy"`` (test), or
    ``"validation_accuracy"`` when the run evaluates the validation split only."""
    return "validation_accuracy" if self.config.data.evaluate_on == "validation" else "accuracy"

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
      target=None if run.target_accuracy is None else (self.metric, run.target_accuracy),
      chance_accuracy=1.0 / self.dataset.num_classes,
      label=self.label,
    )


def build(config: Config) -> Experiment:
  """Builds the data, model, strategy and time model of ``config`` and checks its run; raises ConfigError.

  The strategy is made once: with a schedule, its blueprint gives the clock the
  schedule counts on (:func:`learning_rate`), without building a rule.
  """
  data_cfg, cluster, run = config.data, config.cluster, config.run
  dataset = build_dataset(config)
  model = build_model(config, dataset)
  name, options = config.strategy.name, config.strategy.options
  if config.strategy.schedule != ScheduleConfig():
    with _section(f"strategy {name!r}"):
      blueprint = strategies.blueprint(name, cluster.num_workers, **options)
    with _section("strategy.schedule"):
      rate = learning_rate(config, blueprint, num_examples=len(dataset.train["label"]))
    options = {**options, "learning_rate": rate}
  with _section(f"strategy {name!r}"):
    strategy = strategies.make(name, cluster.num_workers, **options)
  if model.has_state:  # the rules see the parameters; the state rides beside them (docs/guide/own_model.md)
    strategy = with_model_state(strategy)
  with _section("data.batch_size"):
    data = WorkerData(
      dataset.train,
      num_workers=cluster.num_workers,
      batch_size=data_cfg.batch_size,
      seed=config.seed,
      rng=model.uses_rng,
    )
  with _section("cluster"):
    time_model = TimeModel(
      **cluster.time_model_options(flops_per_sample=model.flops_per_sample, batch_size=data_cfg.batch_size)
    )
    # Dynamic Local Updates: each worker's local steps from its speed in this cluster, for the simulator
    # and for real processes alike.
    strategy = with_worker_speeds(strategy, time_model.mean_compute_times())
  with _section("run"):  # the simulator's checks, without building one
    EvalSchedule.make(lambda params: {}, run.eval_every, run.eval_every_time)
    check_gradient_batch(strategy, run.gradient_batch)
  return Experiment(
    config=config,
    dataset=dataset,
    model=model,
    strategy=strategy,
    time_model=time_model,
    data=data,
    loss_fn=models.classification_loss(model),
    eval_fn=held_out_metrics(model, dataset, data_cfg.evaluate_on),
    eval_every=run.eval_every,
    eval_every_time=run.eval_every_time,
    num_events=math.ceil(run.gradients / strategy.gradients_per_event),
  )


def build_dataset(config: Config) -> datasets.Dataset:
  """The dataset of ``config`` (with its validation split when it holds one out), checked; raises ConfigError."""
  data_cfg = config.data
  with _section("data"):
    dataset = datasets.load(
      data_cfg.name,
      data_dir=data_cfg.data_dir,
      seed=config.seed,
      num_examples=data_cfg.num_examples,
      sequence_length=data_cfg.sequence_length,
    )
    if data_cfg.validation:
      dataset = datasets.hold_out(dataset, data_cfg.validation)
  return dataset


def build_model(config: Config, dataset: datasets.Dataset) -> models.Model:
  """The model of ``config`` for ``dataset``'s inputs and classes, checked against them; raises ConfigError."""
  data_cfg, cluster = config.data, config.cluster
  with _section("model"):
    own = import_path.is_import_path(config.model.name)
    reads = dataset.input_key if own else models.input_key(config.model.name)
    if reads != dataset.input_key:
      raise ConfigError(
        f"model: model.name={config.model.name!r} reads {reads!r} but data.name={data_cfg.name!r} gives "
        f"{dataset.input_key!r}; expected a model of {dataset.input_key!r} "
        f"({', '.join(n for n in models.MODELS if models.input_key(n) == dataset.input_key)})."
      )
    options = dict(config.model.options)
    if config.model.hidden:
      if "hidden" in options:
        raise ConfigError("model: model.hidden and model.options.hidden are both set; expected one of them.")
      options["hidden"] = tuple(config.model.hidden)
    model = models.make(
      config.model.name,
      input_shape=dataset.input_shape,
      num_classes=dataset.num_classes,
      seed=config.seed,
      inputs=dataset.input_key if own else None,
      **options,
    )
    if model.has_state and cluster.servers > 1:
      raise ConfigError(
        f"cluster: cluster.servers={cluster.servers} is invalid for model.name={config.model.name!r}, which "
        "keeps state beside its parameters (BatchNorm statistics); expected 1: a sharded parameter server "
        "serves raveled parameters only."
      )
  return model


def held_out_metrics(model: models.Model, dataset: datasets.Dataset, evaluate_on: str = "test"):
  """The run's ``eval_fn``: the test split's ``loss`` and ``accuracy``, and with a validation split its
  ``validation_loss`` and ``validation_accuracy`` beside them; with ``evaluate_on="validation"`` the
  validation split's alone: the test arrays are not even placed on the device."""

  def on(arrays: dict[str, np.ndarray]):
    return models.classification_metrics(model, arrays[dataset.input_key], arrays["label"])

  if dataset.validation is None:
    if evaluate_on == "validation":
      raise ValueError(f"{evaluate_on=} needs a validation split (data.validation > 0)")
    return on(dataset.test)
  if evaluate_on == "validation":
    return models.split_metrics(validation=on(dataset.validation))
  return models.split_metrics(test=on(dataset.test), validation=on(dataset.validation))


def for_tuning(config: Config, share: float = TUNING_VALIDATION) -> Config:
  """``config`` as a tuning run: trained without a validation slice of ``share`` of its training examples
  (its own share when it sets one) and evaluated on that slice only, so that nothing chosen from the run
  has read the test set. Returns the new config."""
  data = dataclasses.replace(
    config.data, validation=config.data.validation or share, evaluate_on="validation"
  )
  return dataclasses.replace(config, data=data)


def learning_rate(config: Config, strategy: Blueprint, *, num_examples: int):
  """The schedule of ``config.strategy.schedule`` for ``strategy``, on its rate clock; raises ValueError.

  ``strategy`` is a :class:`Blueprint` (``strategies.blueprint``) or a built strategy.

  Lengths in ``unit: epochs`` become steps of the strategy's clock
  (:func:`schedules.steps_per_epoch`); a cosine without a ``length`` lasts
  the whole run (``run.gradients`` on that clock).
  """
  spec, peak = config.strategy.schedule, strategy.options["learning_rate"]
  if callable(peak):
    raise ValueError(
      f"learning_rate={peak!r} is a schedule already; expected a number with strategy.schedule."
    )
  batch = config.data.batch_size
  per_epoch = (
    schedules.steps_per_epoch(strategy, num_examples=num_examples, batch_size=batch)
    if spec.unit == "epochs"
    else 1.0
  )
  server_clock = strategy.rate_clock == RateClock.SERVER_UPDATES
  if spec.scale_with_batch:  # the linear scaling rule: the rate grows with the batch an update averages
    per_update = (strategy.gradients_per_update or 1.0) if server_clock else 1.0
    peak = peak * batch * per_update / spec.scale_with_batch
  length = None
  if spec.kind == "cosine":
    if spec.length is not None:
      length = spec.length * per_epoch
    elif not server_clock:
      length = config.run.gradients / strategy.num_workers - spec.warmup * per_epoch
    elif strategy.gradients_per_update is not None:
      length = config.run.gradients / strategy.gradients_per_update - spec.warmup * per_epoch
    else:
      raise ValueError(
        f"length=None is invalid for {strategy.name}, whose updates combine a varying number of gradients; "
        "expected strategy.schedule.length (in updates) for the cosine."
      )
  start = 1.0 / strategy.num_workers if spec.warmup_from == "1/num_workers" else float(spec.warmup_from)
  return schedules.learning_rate_schedule(
    float(peak),
    kind=spec.kind,
    warmup_steps=spec.warmup * per_epoch,
    warmup_from=start,
    boundaries=[b * per_epoch for b in spec.boundaries],
    decay=spec.decay,
    decay_steps=length,
    end=spec.end,
  )


def for_strategy(config: Config, name: str, seed: int) -> Config:
  """``config`` with strategy ``name`` and ``seed``: the shared options it accepts, then ``compare.options[name]``.

  Returns the new config and is pure; options of ``strategy.options`` that
  ``name`` does not take are left out (see :func:`dropped_options`).
  """
  accepted = _accepted_options(name)
  options = {k: v for k, v in config.strategy.options.items() if k in accepted}
  options.update(config.compare.options.get(name, {}))
  return dataclasses.replace(
    config,
    seed=seed,
    strategy=dataclasses.replace(config.strategy, name=name, options=options),
  )


def dropped_options(config: Config, name: str) -> list[str]:
  """The shared ``strategy.options`` that strategy ``name`` does not take."""
  accepted = _accepted_options(name)
  return sorted(k for k in config.strategy.options if k not in accepted)


def _accepted_options(name: str) -> set[str]:
  """The options strategy ``name`` takes, the old names of renamed ones included (they still work)."""
  info = strategies.describe(name)
  return set(info.options) | set(info.renamed)
