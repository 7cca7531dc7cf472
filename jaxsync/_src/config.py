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


class ConfigError(ValueError):
  """A config key with an invalid value, or an unknown key; the message names both."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Which data (``jaxsync.datasets.load``) and each worker's batch size."""

  name: str = "digits"
  data_dir: str | None = None
  batch_size: int = 32
  num_examples: int = 10_000


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Which model (``jaxsync.models.make``); ``hidden`` widths for ``mlp``."""

  name: str = "cnn"
  hidden: list[int] | None = None


@dataclasses.dataclass(frozen=True)
class StrategyConfig:
  """A registry strategy and its options (``jaxsync.strategies.describe`` lists them)."""

  name: str = "ormo"
  options: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
  """The simulated cluster (``jaxsync.sim.TimeModel``); ``compute_time: null`` uses the model's FLOPs."""

  num_workers: int = 8
  compute_time: float | None = None
  device_flops: float = 1e11
  jitter_shape: float | None = 100.0
  slow_fraction: float = 0.25
  slowdown: float = 4.0
  link: str = "10gbps"
  apply_time: float = 0.0


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """How long to run and how often to evaluate."""

  gradients: int = 4000
  max_time: float | None = None
  eval_every: int | None = 100
  eval_every_time: float | None = None
  chunk: int = 500


@dataclasses.dataclass(frozen=True)
class Config:
  """A whole run: data, model, strategy, cluster and run length."""

  name: str = "run"
  seed: int = 0
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  strategy: StrategyConfig = dataclasses.field(default_factory=StrategyConfig)
  cluster: ClusterConfig = dataclasses.field(default_factory=ClusterConfig)
  run: RunConfig = dataclasses.field(default_factory=RunConfig)


def _type_name(hint: Any) -> str:
  return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _coerce(path: str, hint: Any, value: Any) -> Any:
  """``value`` checked against the annotation ``hint``; ints are accepted for floats."""
  origin = typing.get_origin(hint)
  if origin in (typing.Union, types.UnionType):
    options = typing.get_args(hint)
    if value is None and type(None) in options:
      return None
    errors = []
    for option in options:
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
      raise ConfigError(f"{path}={value!r} is invalid; expected a list of {_type_name(item)}.")
    return [_coerce(f"{path}[{i}]", item, v) for i, v in enumerate(value)]
  if origin is dict:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
      raise ConfigError(f"{path}={value!r} is invalid; expected a mapping of names to values.")
    return dict(value)
  if hint is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ConfigError(f"{path}={value!r} is invalid; expected a number.")
    return float(value)
  if hint is int:
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
    dotted = ", ".join(f"{prefix}.{k}" if prefix else str(k) for k in unknown)
    raise ConfigError(
      f"unknown config key {dotted}; valid keys{' of ' + prefix if prefix else ''}: {_keys(cls)}."
    )
  values = {}
  for name, hint in hints.items():
    if name in raw:
      values[name] = _coerce(f"{prefix}.{name}" if prefix else name, hint, raw[name])
  return cls(**values)


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
    parsed = yaml.safe_load(value) if value.strip() else None
  except yaml.YAMLError as err:
    raise ConfigError(f"override {text!r}: the value is not valid YAML ({err}).") from None
  return parts, parsed


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
  """A copy of ``raw`` with each ``a.b=value`` set (``strategy.options.x=...`` may add an option)."""
  out = yaml.safe_load(yaml.safe_dump(raw)) or {}
  for text in overrides:
    parts, value = parse_override(text)
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


def load(path: str | pathlib.Path, overrides: list[str] = ()) -> Config:
  """Reads a YAML config, applies ``--set`` overrides, validates; raises :class:`ConfigError`."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise ConfigError(
      f"config file {str(path)!r} does not exist; expected a YAML file such as configs/quickstart.yaml."
    )
  try:
    raw = yaml.safe_load(path.read_text())
  except yaml.YAMLError as err:
    raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from None
  if raw is not None and not isinstance(raw, dict):
    raise ConfigError(
      f"config file {str(path)!r} holds {type(raw).__name__}; expected a mapping of sections."
    )
  return from_dict(apply_overrides(raw or {}, list(overrides)))
