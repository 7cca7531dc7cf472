"""Typed run configs: YAML in, validated dataclasses out, dotted ``--set`` overrides.

Configs stop at the command line: the CLI turns a :class:`Config` into plain
arguments for the library (``strategies.make``, ``sim.TimeModel``, ...), and
no library function takes a config object.
"""

from __future__ import annotations

import dataclasses
import pathlib
import types
import typing
from typing import Any

import yaml

from jaxsync._src.core.suggestions import did_you_mean
from jaxsync._src.core.yaml_text import load_yaml


class ConfigError(ValueError):
  """A config key with an invalid value, or an unknown key; the message names both."""


def _require(ok: bool, key: str, value: Any, expected: str) -> None:
  """Range checks of the config dataclasses (types are checked while building)."""
  if not ok:
    raise ConfigError(f"{key}={value!r} is invalid; expected {expected}.")


def _require_choice(key: str, value: Any, options: Any, expected: str | None = None) -> None:
  """``value`` is one of ``options``; the message lists them and suggests the closest one."""
  options = tuple(options)
  if value not in options:
    hint = did_you_mean(value, options)
    raise ConfigError(
      f"{key}={value!r} is invalid{hint}; expected {expected or 'one of ' + ', '.join(options)}."
    )


def _require_builder(key: str, value: Any, registry: Any) -> None:
  """``value`` is a registered name of ``registry``, or ``module:attribute`` naming one's own (imported now)."""
  try:
    registry.lookup(value, key)
  except ValueError as err:  # the registry's message, less its "models: " prefix
    raise ConfigError(str(err).split(": ", 1)[1]) from None


def _unknown_keys(where: str, unknown: list[str], valid: Any) -> str:
  """``strategy.options.momentom (did you mean 'momentum'?)``: each unknown key with its closest valid one."""
  valid = tuple(valid)
  return ", ".join(
    f"{where}.{k}{did_you_mean(k, valid)}" if where else f"{k}{did_you_mean(k, valid)}" for k in unknown
  )


def _key(default: Any = dataclasses.MISSING, *, meaning: str, factory: Any = dataclasses.MISSING) -> Any:
  """A config key: its default and what it means (``jaxsync config`` prints both)."""
  return dataclasses.field(default=default, default_factory=factory, metadata={"meaning": meaning})


def _positive(section: str, obj: Any, *names: str) -> None:
  for name in names:
    value = getattr(obj, name)
    _require(
      value is None or value > 0, f"{section}.{name}", value, "a positive number (or null where allowed)"
    )


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Which data (``jaxsync.datasets.load``) and each worker's batch size."""

  name: str = _key(
    "digits",
    meaning="the dataset: a name of jaxsync.datasets (digits, fashion_mnist, mnist, jargon, ...), or "
    "module:attribute naming your own loader",
  )
  data_dir: str | None = _key(
    None, meaning="where the dataset's files are (null: its default place, e.g. $FASHION_MNIST_DIR)"
  )
  batch_size: int = _key(32, meaning="examples in each worker's batch (one gradient)")
  num_examples: int = _key(10_000, meaning="examples of a synthetic dataset (the real ones are whole)")
  sequence_length: int = _key(64, meaning="tokens per example of a text dataset (jargon)")
  validation: float = _key(
    0.0,
    meaning="the share of the training examples held out as a validation split, never trained on (the last "
    "ones; 0: none)",
  )
  evaluate_on: str = _key(
    "test",
    meaning="the split the run's evaluations read: test, or validation (needs data.validation > 0; the test "
    "set is then never read: how tuning runs score)",
  )

  def __post_init__(self):
    from jaxsync._src.data.datasets import DATASETS

    _require_builder("data.name", self.name, DATASETS)
    _positive("data", self, "batch_size", "num_examples", "sequence_length")
    share = self.validation
    ok = not isinstance(share, bool) and isinstance(share, (int, float)) and 0.0 <= share < 1.0
    _require(ok, "data.validation", share, "a share of the training examples in [0, 1)")
    _require_choice("data.evaluate_on", self.evaluate_on, ("test", "validation"))
    unheld = (
      "'test' while data.validation is 0 (set data.validation, e.g. 0.1, to hold out a validation split)"
    )
    _require(self.evaluate_on == "test" or share > 0, "data.evaluate_on", self.evaluate_on, unheld)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Which model (``jaxsync.models.make``); ``hidden`` widths for ``mlp``, ``options`` for any."""

  name: str = _key(
    "cnn",
    meaning="the model: a name of jaxsync.models (mlp, cnn, lenet, resnet20, mobilenet, transformer), or "
    "module:attribute naming your own (an nnx builder, a Linen module class or factory)",
  )
  hidden: list[int] | None = _key(None, meaning="the hidden layer widths of an mlp (null: its default)")
  options: dict[str, Any] = _key(
    meaning="the model's options, e.g. layers, width, heads of a transformer (jaxsync.models.make)",
    factory=dict,
  )

  def __post_init__(self):
    from jaxsync._src.models.networks import MODELS

    _require_builder("model.name", self.name, MODELS)
    _require(
      self.hidden is None or (self.name == "mlp" and all(h > 0 for h in self.hidden)),
      "model.hidden",
      self.hidden,
      "null, or positive layer widths with model.name=mlp",
    )


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
  """The learning rate over the run: a linear warm-up, then constant, step decay or cosine.

  Counted on the strategy's clock (``jaxsync.strategies.Strategy.rate_clock``):
  the server rule's updates, or each worker's own steps for a rate the
  workers apply (local SGD, EASGD's family, per-worker BB). ``unit: epochs``
  converts passes over the training set to that clock. The peak rate is
  ``strategy.options.learning_rate`` (times ``global batch / scale_with_batch``
  for the linear scaling rule of large synchronous batches).
  """

  kind: str = _key("constant", meaning="constant, step (times decay at each boundary) or cosine (to end)")
  unit: str = _key(
    "updates", meaning="what warmup, boundaries and length count: updates (the strategy's clock) or epochs"
  )
  warmup: float = _key(0.0, meaning="the linear warm-up's length, in unit")
  warmup_from: float | str = _key(
    0.0, meaning="the warm-up's first rate, a fraction of the peak, or '1/num_workers' (SMEGA2's lr/N)"
  )
  boundaries: list[float] = _key(meaning="where a step schedule decays, in unit", factory=list)
  decay: float = _key(0.1, meaning="the step schedule's factor at each boundary")
  end: float = _key(0.0, meaning="the cosine's last rate, a fraction of the peak")
  length: float | None = _key(None, meaning="the cosine's length after the warm-up, in unit (null: the run)")
  scale_with_batch: int | None = _key(
    None, meaning="the linear scaling rule: the peak times global batch / this (null: no scaling)"
  )

  def __post_init__(self):
    from jaxsync._src.strategies.schedules import KINDS

    _require_choice("strategy.schedule.kind", self.kind, KINDS)
    _require_choice("strategy.schedule.unit", self.unit, UNITS)
    _require(self.warmup >= 0, "strategy.schedule.warmup", self.warmup, "a length >= 0")
    _require(
      self.warmup_from == "1/num_workers"
      or (isinstance(self.warmup_from, float) and 0 <= self.warmup_from <= 1),
      "strategy.schedule.warmup_from",
      self.warmup_from,
      "a fraction of the learning rate in [0, 1], or '1/num_workers' (SMEGA²'s lr/N)",
    )
    _require(
      self.boundaries == sorted(self.boundaries) and all(b >= 0 for b in self.boundaries),
      "strategy.schedule.boundaries",
      self.boundaries,
      "increasing points >= 0",
    )
    _require(
      not self.boundaries or self.kind == "step",
      "strategy.schedule.boundaries",
      self.boundaries,
      f"[] unless kind is step (kind={self.kind!r})",
    )
    _require(0 < self.decay <= 1, "strategy.schedule.decay", self.decay, "a factor in (0, 1]")
    _require(0 <= self.end <= 1, "strategy.schedule.end", self.end, "a fraction in [0, 1]")
    _positive("strategy.schedule", self, "length", "scale_with_batch")


UNITS = ("updates", "epochs")


@dataclasses.dataclass(frozen=True)
class StrategyConfig:
  """A registry strategy, its options (``jaxsync.strategies.describe`` lists them) and its schedule."""

  name: str = _key("ormo", meaning="the strategy (jaxsync strategies lists them)")
  options: dict[str, Any] = _key(
    meaning="the strategy's options, e.g. learning_rate, momentum (jaxsync strategies lists each one's)",
    factory=dict,
  )
  schedule: ScheduleConfig = _key(meaning="the learning rate over the run", factory=ScheduleConfig)

  def __post_init__(self):
    from jaxsync._src.strategies.registry import describe, names

    _require_choice("strategy.name", self.name, names())
    info = describe(self.name)
    valid = info.options
    unknown = sorted(set(self.options) - set(valid) - set(info.renamed))
    if unknown:
      raise ConfigError(
        f"unknown option {_unknown_keys('strategy.options', unknown[:1], valid)} for strategy {self.name!r};"
        f" valid options: {', '.join(valid) or 'none'}."
      )


@dataclasses.dataclass(frozen=True)
class LinkConfig:
  """A measured link (``jaxsync calibrate`` writes one): sending ``n`` bytes takes ``latency + n / bandwidth``."""

  latency: float = _key(meaning="seconds per message, >= 0")
  bandwidth: float = _key(meaning="bytes per second, > 0 (1 Gbit/s is 1.25e8)")

  def check(self, name: str) -> None:
    """Raises a ConfigError naming ``name`` (``cluster.link``, ``cluster.server_link``) for a bad value."""
    _require(self.latency >= 0, f"{name}.latency", self.latency, "seconds >= 0")
    _require(self.bandwidth > 0, f"{name}.bandwidth", self.bandwidth, "bytes per second > 0")


@dataclasses.dataclass(frozen=True)
class AbsenceConfig:
  """A worker gone for a while (churn, simulated): it leaves at ``start``, a replacement takes its place at ``end``."""

  worker: int = _key(meaning="the worker's id, 0 .. num_workers - 1")
  start: float = _key(meaning="simulated seconds when it leaves")
  end: float = _key(meaning="simulated seconds when its replacement joins (after start)")


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
  """The simulated cluster (``jaxsync.sim.TimeModel``); ``compute_time: null`` uses the model's FLOPs."""

  num_workers: int = _key(8, meaning="workers, K")
  compute_time: float | None = _key(
    None, meaning="seconds of one step of a fast worker (null: 3 x the model's FLOPs x batch / device_flops)"
  )
  device_flops: float = _key(1e11, meaning="a fast worker's FLOP/s, for compute_time: null")
  jitter_shape: float | None = _key(
    100.0, meaning="the Gamma shape of step-time jitter: coefficient of variation 1/sqrt(shape) (null: none)"
  )
  slow_fraction: float = _key(0.25, meaning="the fraction of workers that are slow, in [0, 1)")
  slowdown: float = _key(4.0, meaning="how many times slower a slow worker is")
  link: str | LinkConfig = _key(
    "10gbps",
    meaning="the network between workers and server: 100mbps, 1gbps, 10gbps, 100gbps, or a measured "
    "{latency: seconds, bandwidth: bytes/s}",
  )
  server_link: str | LinkConfig | None = _key(
    None,
    meaning="the parameter server's network card as its workers' pushes share it (jaxsync calibrate "
    "--link-senders measures it): a preset or {latency, bandwidth}; null: link",
  )
  apply_time: float = _key(
    0.0, meaning="seconds the server takes per applied update, on top of server_bandwidth"
  )
  # Set message_bytes to time the exchanges of a bigger model (e.g. a paper's) while training the small one.
  message_bytes: int | None = _key(
    None, meaning="bytes of one model or gradient message (null: the model's own size)"
  )
  server_bandwidth: str | float | None = _key(
    None,
    meaning="the server's memory bandwidth for applying updates: 3GB/s, 10GB/s, 30GB/s, bytes per second, "
    "or null (updates cost the server no time)",
  )
  eval_time: float = _key(
    0.0,
    meaning="seconds one evaluation takes: the server (or every all-reduce worker) stops for it, as a real run "
    "does (jaxsync calibrate measures it); 0: evaluations cost no time",
  )
  collective_overhead: float = _key(
    0.0,
    meaning="seconds each all-reduce of a synchronous round takes beyond the ring formula (gloo's own steps, "
    "dispatch; jaxsync calibrate --collective-processes measures it); 0: the formula alone",
  )
  emulate_slow_workers: bool = _key(
    False,
    meaning="on real processes (jaxsync launch), the slow workers sleep (slowdown - 1) x each step's measured "
    "compute time after it, as slow as the simulator's; false: real workers run at their own speed",
  )
  calibration: dict[str, str] | None = _key(
    None,
    meaning="where each measured value of this section came from (jaxsync calibrate writes it; the advisor "
    "prints it); null: presets, not measured",
  )
  absences: list[AbsenceConfig] = _key(
    meaning="churn for membership: elastic: workers gone for a while, [{worker, start, end}] in simulated"
    " seconds (empty: none)",
    factory=list,
  )
  shrink_keeps: str = _key(
    "global_batch",
    meaning="what a synchronous run on fewer workers keeps (jaxsync launch --min-workers): global_batch, each "
    "worker's batch grows by K/K' and the learning rate stays; worker_batch, the batch stays and the "
    "learning rate of an averaged gradient is scaled by K'/K (the linear scaling rule)",
  )
  # The workers are the processes after the server shards. The simulator ignores it.
  servers: int = _key(
    1, meaning="parameter-server processes of a multi-process run, each owning a slice of the parameters"
  )

  def __post_init__(self):
    from jaxsync._src.sim.time_model import LINK_PRESETS, SERVER_PRESETS

    _positive("cluster", self, "num_workers", "compute_time", "device_flops", "jitter_shape")
    _require(
      isinstance(self.servers, int) and not isinstance(self.servers, bool) and self.servers >= 1,
      "cluster.servers",
      self.servers,
      "an integer >= 1 (parameter-server processes)",
    )
    _require(0 <= self.slow_fraction < 1, "cluster.slow_fraction", self.slow_fraction, "a fraction in [0, 1)")
    _require(self.slowdown >= 1, "cluster.slowdown", self.slowdown, "a factor >= 1")
    for i, a in enumerate(self.absences):
      expected = f"a worker in [0, {self.num_workers}) and simulated seconds 0 <= start < end"
      _require(
        0 <= a.worker < self.num_workers and 0 <= a.start < a.end, f"cluster.absences[{i}]", a, expected
      )
    _require_choice("cluster.shrink_keeps", self.shrink_keeps, ("global_batch", "worker_batch"))
    _require(self.apply_time >= 0, "cluster.apply_time", self.apply_time, "seconds >= 0")
    _require(self.eval_time >= 0, "cluster.eval_time", self.eval_time, "seconds >= 0")
    _require(
      self.collective_overhead >= 0, "cluster.collective_overhead", self.collective_overhead, "seconds >= 0"
    )
    if self.message_bytes is not None:
      _require(
        self.message_bytes > 0, "cluster.message_bytes", self.message_bytes, "a byte count > 0 or null"
      )
    _require(
      isinstance(self.link, LinkConfig) or self.link in LINK_PRESETS,
      "cluster.link",
      self.link,
      f"one of {', '.join(LINK_PRESETS)}, or a mapping {{latency: seconds, bandwidth: bytes per second}}",
    )
    for name in ("link", "server_link"):
      if isinstance(getattr(self, name), LinkConfig):
        getattr(self, name).check(f"cluster.{name}")
    _require(
      self.server_link is None
      or isinstance(self.server_link, LinkConfig)
      or self.server_link in LINK_PRESETS,
      "cluster.server_link",
      self.server_link,
      f"null, one of {', '.join(LINK_PRESETS)}, or a mapping {{latency: seconds, bandwidth: bytes per second}}",
    )
    if self.calibration is not None:
      for key, source in self.calibration.items():
        _require(
          isinstance(source, str), f"cluster.calibration.{key}", source, "a string (where it came from)"
        )
    _require(
      self.server_bandwidth is None
      or self.server_bandwidth in SERVER_PRESETS
      or (isinstance(self.server_bandwidth, float) and self.server_bandwidth > 0),
      "cluster.server_bandwidth",
      self.server_bandwidth,
      f"one of {', '.join(SERVER_PRESETS)}, bytes per second > 0, or null",
    )

  def time_model_options(self, *, flops_per_sample: float, batch_size: int) -> dict[str, Any]:
    """The keyword arguments of ``jaxsync.sim.TimeModel`` for this cluster.

    Args:
      flops_per_sample: the model's forward FLOPs per sample, ``F``.
      batch_size: each worker's batch, ``b``.

    Returns:
      ``TimeModel``'s arguments; ``compute_time: null`` becomes the model's
      ``3 F b / device_flops`` (``jaxsync.sim.compute_time_from_flops``).
    """
    from jaxsync._src.sim.time_model import Link, compute_time_from_flops

    compute_time = self.compute_time or compute_time_from_flops(
      flops_per_sample, batch_size, self.device_flops
    )
    return dict(
      num_workers=self.num_workers,
      compute_time=compute_time,
      jitter_shape=self.jitter_shape,
      slow_fraction=self.slow_fraction,
      slowdown=self.slowdown,
      link=Link(self.link.latency, self.link.bandwidth) if isinstance(self.link, LinkConfig) else self.link,
      server_link=(
        Link(self.server_link.latency, self.server_link.bandwidth)
        if isinstance(self.server_link, LinkConfig)
        else self.server_link
      ),
      apply_time=self.apply_time,
      message_bytes=self.message_bytes,
      server_bandwidth=self.server_bandwidth,
      eval_time=self.eval_time,
      collective_overhead=self.collective_overhead,
      absences=tuple((a.worker, a.start, a.end) for a in self.absences),
    )


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """How long to run, how often to evaluate and checkpoint (``checkpoint_every: null``: every 10 chunks).

  ``gradient_batch``: an asynchronous strategy's gradients the simulator
  computes together ahead of their arrivals (``null``: 1 on a CPU, every
  worker on a GPU or TPU); the results do not depend on it but for float
  rounding.
  """

  gradients: int = _key(4000, meaning="worker gradients in the whole run (the budget)")
  max_time: float | None = _key(
    None, meaning="stop at this simulated time in seconds, if earlier (null: no limit)"
  )
  eval_every: int | None = _key(100, meaning="server updates between evaluations (or use eval_every_time)")
  eval_every_time: float | None = _key(
    None, meaning="simulated seconds between evaluations: fair to strategies of different update rates"
  )
  chunk: int = _key(500, meaning="events per compiled chunk and per metrics.jsonl train line")
  checkpoint_every: int | None = _key(
    None,
    meaning="events between checkpoints, a multiple of chunk (null: every 10 chunks); one is saved at the end",
  )
  target_accuracy: float | None = _key(
    0.9, meaning="the accuracy whose time and updates to reach the summary reports"
  )
  gradient_batch: int | None = _key(
    None, meaning="an asynchronous strategy's gradients computed together (null: 1 on a CPU, K on a GPU/TPU)"
  )

  def __post_init__(self):
    _positive(
      "run",
      self,
      "gradients",
      "max_time",
      "eval_every",
      "eval_every_time",
      "chunk",
      "checkpoint_every",
      "gradient_batch",
    )
    _require(
      (self.eval_every is None) != (self.eval_every_time is None),
      "run.eval_every",
      self.eval_every,
      f"exactly one of run.eval_every and run.eval_every_time (eval_every_time={self.eval_every_time!r})",
    )
    _require(
      self.checkpoint_every is None or self.checkpoint_every % self.chunk == 0,
      "run.checkpoint_every",
      self.checkpoint_every,
      f"null or a multiple of run.chunk={self.chunk} (checkpoints are taken between chunks)",
    )
    _require(
      self.target_accuracy is None or 0 < self.target_accuracy <= 1,
      "run.target_accuracy",
      self.target_accuracy,
      "null or a fraction in (0, 1]",
    )


@dataclasses.dataclass(frozen=True)
class CompareConfig:
  """What ``jaxsync compare`` runs: strategies, seeds, and per-strategy option overrides."""

  strategies: list[str] = _key(
    meaning="the strategies jaxsync compare runs (empty: strategy.name)", factory=list
  )
  seeds: int = _key(3, meaning="seeds per strategy (seed, seed + 1, ...)")
  options: dict[str, Any] = _key(
    meaning="per-strategy option overrides, e.g. {asp: {learning_rate: 0.01}}", factory=dict
  )

  def __post_init__(self):
    from jaxsync._src.strategies.registry import describe, names

    _positive("compare", self, "seeds")
    for name in self.strategies:
      _require_choice("compare.strategies", name, names(), f"names from {', '.join(names())}")
    for name, options in self.options.items():
      _require_choice("compare.options", name, names(), f"strategy names as keys, from {', '.join(names())}")
      _require(isinstance(options, dict), f"compare.options.{name}", options, "a mapping of option to value")
      info = describe(name)
      valid = info.options
      unknown = sorted(set(options) - set(valid) - set(info.renamed))
      _require(not unknown, f"compare.options.{name}", options, f"options of {name}: {', '.join(valid)}")


@dataclasses.dataclass(frozen=True)
class Config:
  """A whole run: data, model, strategy, cluster and run length (and what ``compare`` varies)."""

  name: str = _key("run", meaning="the run's name: its directory is runs/NAME unless --out says otherwise")
  seed: int = _key(
    0, meaning="the seed of the data order, the model's initialization and the cluster's jitter"
  )
  data: DataConfig = _key(meaning="the data", factory=DataConfig)
  model: ModelConfig = _key(meaning="the model", factory=ModelConfig)
  strategy: StrategyConfig = _key(meaning="the synchronization strategy", factory=StrategyConfig)
  cluster: ClusterConfig = _key(meaning="the (simulated) cluster", factory=ClusterConfig)
  run: RunConfig = _key(meaning="the run's length, evaluations and checkpoints", factory=RunConfig)
  compare: CompareConfig = _key(meaning="what jaxsync compare varies", factory=CompareConfig)


def type_name(hint: Any) -> str:
  """A type hint's short name, for messages (``int``, ``list[str]``)."""
  return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _coerce(path: str, hint: Any, value: Any) -> Any:
  """``value`` checked against the annotation ``hint``; ints are accepted for floats."""
  origin = typing.get_origin(hint)
  if origin in (typing.Union, types.UnionType):
    options = typing.get_args(hint)
    if value is None and type(None) in options:
      return None
    errors = []
    # A mapping is meant for a section's option: its error (a key out of range) is the one to report.
    for option in sorted(
      options, key=lambda o: not (isinstance(value, dict) and dataclasses.is_dataclass(o))
    ):
      if option is type(None):
        continue
      try:
        return _coerce(path, option, value)
      except ConfigError as err:
        errors.append(err)
    raise errors[0]
  if origin is list:
    (item,) = typing.get_args(hint)
    if not isinstance(value, list):
      raise ConfigError(f"{path}={value!r} is invalid; expected a list of {type_name(item)}.")
    return [_coerce(f"{path}[{i}]", item, v) for i, v in enumerate(value)]
  if origin is dict:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
      raise ConfigError(f"{path}={value!r} is invalid; expected a mapping of names to values.")
    return dict(value)
  if hint is float:
    if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
      try:
        value = float(value)
      except ValueError:
        pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ConfigError(f"{path}={value!r} is invalid; expected a number.")
    return float(value)
  if hint is int:
    if isinstance(value, float) and value.is_integer():  # 1e4 gradients, written as a float
      value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
      raise ConfigError(f"{path}={value!r} is invalid; expected an integer.")
    return value
  if hint is bool:
    if not isinstance(value, bool):
      raise ConfigError(f"{path}={value!r} is invalid; expected true or false.")
    return value
  if hint is str:
    if not isinstance(value, str):
      raise ConfigError(f"{path}={value!r} is invalid; expected a string.")
    return value
  if dataclasses.is_dataclass(hint):
    return _build(hint, value, path)
  raise TypeError(f"config: no rule for {hint!r} at {path}")  # a bug in this module, not user input


def _build(cls: type, raw: Any, prefix: str = "") -> Any:
  where = prefix or "config"
  if raw is None:
    raw = {}
  if not isinstance(raw, dict):
    raise ConfigError(f"{where}={raw!r} is invalid; expected a mapping with keys {_keys(cls)}.")
  hints = typing.get_type_hints(cls)
  unknown = sorted(set(raw) - set(hints))
  if unknown:
    dotted = _unknown_keys(prefix, [str(k) for k in unknown], hints)
    raise ConfigError(
      f"unknown config key {dotted}; valid keys{' of ' + prefix if prefix else ''}: {_keys(cls)}."
    )
  required = [
    f.name
    for f in dataclasses.fields(cls)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
  ]
  missing = [name for name in required if name not in raw]
  if missing:
    dotted = ", ".join(f"{prefix}.{k}" if prefix else k for k in missing)
    raise ConfigError(f"{where}={raw!r} is invalid; {dotted} missing (it needs {', '.join(required)}).")
  values = {}
  for name, hint in hints.items():
    if name in raw:
      values[name] = _coerce(f"{prefix}.{name}" if prefix else name, hint, raw[name])
  return cls(**values)


def _one_line(err: Exception) -> str:
  return " ".join(str(err).split())


def _keys(cls: type) -> str:
  return ", ".join(f.name for f in dataclasses.fields(cls))


def from_dict(raw: Any) -> Config:
  """A :class:`Config` from a plain mapping; unknown keys and wrong types raise :class:`ConfigError`."""
  return _build(Config, raw)


def to_dict(config: Config) -> dict[str, Any]:
  """The config as plain data (what ``config.yaml`` in a run directory holds)."""
  return dataclasses.asdict(config)


def parse_override(text: str) -> tuple[list[str], Any]:
  """``"a.b=value"`` as (``["a", "b"]``, the YAML value); e.g. ``run.gradients=800``."""
  if "=" not in text:
    raise ConfigError(f"override {text!r} is invalid; expected key.path=value, e.g. cluster.num_workers=16.")
  key, value = text.split("=", 1)
  parts = key.strip().split(".")
  if not all(parts):
    raise ConfigError(f"override {text!r} is invalid; expected key.path=value.")
  try:
    parsed = load_yaml(value) if value.strip() else None
  except yaml.YAMLError as err:
    raise ConfigError(f"override {text!r}: the value is not valid YAML ({_one_line(err)}).") from None
  return parts, parsed


# Keys that are alternatives to each other: a config sets exactly one. An override of one (to a value)
# unsets the other, so `--set run.eval_every=50` works on a config that evaluates on time.
ALTERNATIVES = {
  ("run", "eval_every"): ("run", "eval_every_time"),
  ("run", "eval_every_time"): ("run", "eval_every"),
}


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
  """A copy of ``raw`` with each ``a.b=value`` set (``strategy.options.x=...`` may add an option).

  Setting one of two :data:`ALTERNATIVES` to a value unsets the other, unless
  the overrides set both.
  """
  out = load_yaml(yaml.safe_dump(raw)) or {}
  settings = [(text, *parse_override(text)) for text in overrides]
  given = {tuple(parts) for _, parts, _ in settings}
  unset = [
    (text, list(ALTERNATIVES[tuple(parts)]), None)
    for text, parts, value in settings
    if tuple(parts) in ALTERNATIVES and value is not None and ALTERNATIVES[tuple(parts)] not in given
  ]
  for text, parts, value in unset + settings:
    node = out
    for part in parts[:-1]:
      child = node.get(part)
      if child is None:
        child = node[part] = {}
      if not isinstance(child, dict):
        raise ConfigError(f"override {text!r}: {part} is not a mapping.")
      node = child
    node[parts[-1]] = value
  return out


def read_file(path: str | pathlib.Path, what: str, example: str) -> dict[str, Any]:
  """The mapping a YAML config file holds (empty for an empty file); one-line :class:`ConfigError` otherwise.

  Args:
    path: the file.
    what: what it is, for the messages (``config file``, ``plan file``).
    example: a file of that kind, for the messages.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise ConfigError(f"{what} {str(path)!r} does not exist; expected a YAML file such as {example}.")
  try:
    raw = load_yaml(path.read_text())
  except yaml.YAMLError as err:
    raise ConfigError(f"{what} {str(path)!r} is not valid YAML: {_one_line(err)}") from None
  if raw is not None and not isinstance(raw, dict):
    raise ConfigError(f"{what} {str(path)!r} holds {type(raw).__name__}; expected a mapping of sections.")
  return raw or {}


def load(path: str | pathlib.Path, overrides: list[str] = ()) -> Config:
  """Reads a YAML config, applies ``--set`` overrides, validates; raises :class:`ConfigError`."""
  raw = read_file(path, "config file", "configs/quickstart.yaml")
  return from_dict(apply_overrides(raw, list(overrides)))
