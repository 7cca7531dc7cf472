"""The typed config of ``jaxsync plan`` (``configs/plan/*.yaml``), validated like every config, and its report."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from jaxsync._src.app.config import (
  ConfigError,
  _build,
  _key,
  _require,
  _require_choice,
  apply_overrides,
  read_file,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanModelConfig:
  """The model by its size: one of tokens_per_step, flops_per_step, step_time."""

  parameters: float = _key(meaning="N, the model's parameters")
  layers: int = _key(meaning="L, the blocks whose gradients are reduced one at a time")
  tokens_per_step: float | None = _key(None, meaning="tokens one worker trains on per step (FLOPs 6 N T)")
  flops_per_step: float | None = _key(None, meaning="FLOPs of one worker's step")
  step_time: float | None = _key(None, meaning="measured seconds of one worker's step")
  dtype: str = _key("bfloat16", meaning="the gradients' precision on the wire: bfloat16, float16, float32")

  def __post_init__(self):
    _require(self.parameters >= 1, "model.parameters", self.parameters, "a parameter count >= 1")
    _require(self.layers >= 1, "model.layers", self.layers, "an integer >= 1")
    _require(self.layers <= self.parameters, "model.layers", self.layers, "at most model.parameters")
    given = [n for n in ("tokens_per_step", "flops_per_step", "step_time") if getattr(self, n) is not None]
    _require(
      len(given) == 1, "model.tokens_per_step/flops_per_step/step_time", given, "exactly one of the three"
    )
    _require(getattr(self, given[0]) > 0, f"model.{given[0]}", getattr(self, given[0]), "a number > 0")
    _require_choice("model.dtype", self.dtype, ("bfloat16", "float16", "float32"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanLinkConfig:
  """A link: ``gbps`` Gbit/s and ``latency`` seconds per message."""

  gbps: float = _key(meaning="bandwidth, Gbit/s, > 0")
  latency: float = _key(0.0, meaning="seconds per message, >= 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanTopologyConfig:
  """M workers of R chips, the link between them and the link inside each."""

  workers: int = _key(meaning="M, workers (a host, a pod or a datacenter each)")
  chips_per_worker: int = _key(1, meaning="R, chips in each worker")
  outer: PlanLinkConfig = _key(meaning="the link between workers (each worker's share)")
  inner: PlanLinkConfig | None = _key(
    None,
    meaning="the link inside a group of workers: a hierarchical all-reduce's lower level, InHAD's nodes "
    "(null: 10x the outer); a worker's own chips talk inside its step time",
  )

  def __post_init__(self):
    _require(self.workers >= 1, "topology.workers", self.workers, "an integer >= 1")
    _require(
      self.chips_per_worker >= 1, "topology.chips_per_worker", self.chips_per_worker, "an integer >= 1"
    )
    for name in ("outer", "inner"):
      link = getattr(self, name)
      if link is None:
        continue
      _require(link.gbps > 0, f"topology.{name}.gbps", link.gbps, "a bandwidth > 0 Gbit/s")
      _require(link.latency >= 0, f"topology.{name}.latency", link.latency, "seconds >= 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanHardwareConfig:
  """The accelerator and the share of its peak the model reaches."""

  accelerator: str = _key("H100", meaning="H100, H200, B200, TPU v5p or TPU v5e (peak bf16 FLOP/s)")
  mfu: float = _key(0.4, meaning="model FLOPs utilization, in (0, 1]")

  def __post_init__(self):
    from jaxsync._src.plan.hardware import ACCELERATORS

    _require_choice("hardware.accelerator", self.accelerator, ACCELERATORS)
    _require(0 < self.mfu <= 1, "hardware.mfu", self.mfu, "a fraction in (0, 1]")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanStragglersConfig:
  """Step-time jitter and slow workers, as the simulator's cluster section."""

  jitter_shape: float | None = _key(None, meaning="Gamma shape of step-time jitter (null: none)")
  slow_fraction: float = _key(0.0, meaning="fraction of slow workers, in [0, 1)")
  slowdown: float = _key(1.0, meaning="how many times slower a slow worker is, >= 1")

  def __post_init__(self):
    _require(
      self.jitter_shape is None or self.jitter_shape > 0,
      "stragglers.jitter_shape",
      self.jitter_shape,
      "> 0 or null",
    )
    _require(
      0 <= self.slow_fraction < 1, "stragglers.slow_fraction", self.slow_fraction, "a fraction in [0, 1)"
    )
    _require(self.slowdown >= 1, "stragglers.slowdown", self.slowdown, "a factor >= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanFailuresConfig:
  """Chip failures and checkpoints."""

  chip_mtbf_hours: float = _key(meaning="mean hours between failures of one chip, > 0")
  restart_time: float = _key(600.0, meaning="seconds until a failed worker (or the job) runs again")
  checkpoint_interval: float = _key(3600.0, meaning="seconds between checkpoints, > 0")
  checkpoint_time: float = _key(60.0, meaning="seconds training stops to write one")

  def __post_init__(self):
    _require(self.chip_mtbf_hours > 0, "failures.chip_mtbf_hours", self.chip_mtbf_hours, "hours > 0")
    _require(self.restart_time >= 0, "failures.restart_time", self.restart_time, "seconds >= 0")
    _require(
      self.checkpoint_interval > 0, "failures.checkpoint_interval", self.checkpoint_interval, "seconds > 0"
    )
    _require(self.checkpoint_time >= 0, "failures.checkpoint_time", self.checkpoint_time, "seconds >= 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanStrategyConfig:
  """One strategy to plan: a registry name, its options, and a label for the table."""

  name: str = _key(meaning="a strategy of jaxsync strategies (allreduce, diloco, streaming_diloco, asp, ...)")
  label: str | None = _key(None, meaning="its name in the table and the plot (null: the strategy's name)")
  options: dict[str, Any] = _key(meaning="the strategy's options, e.g. {period: 100}", factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanSweepConfig:
  """The bandwidths swept for the utilization levels and the plot."""

  from_gbps: float = _key(0.1, meaning="the lowest outer bandwidth, Gbit/s")
  to_gbps: float = _key(1000.0, meaning="the highest outer bandwidth, Gbit/s")
  points: int = _key(50, meaning="bandwidths, evenly spaced in log (50 from 0.1 to 1000: the papers' sweep)")
  levels: list[float] = _key(
    meaning="compute utilizations to find the bandwidth for", factory=lambda: [0.5, 0.8, 0.9, 0.95, 0.99]
  )
  strided: bool = _key(
    False,
    meaning="Streaming DiLoCo's fragments as every P-th layer (the paper's) instead of contiguous blocks",
  )

  def __post_init__(self):
    _require(self.from_gbps > 0, "sweep.from_gbps", self.from_gbps, "a bandwidth > 0 Gbit/s")
    _require(
      self.to_gbps > self.from_gbps,
      "sweep.to_gbps",
      self.to_gbps,
      f"more than sweep.from_gbps={self.from_gbps}",
    )
    _require(self.points >= 2, "sweep.points", self.points, "an integer >= 2")
    for i, level in enumerate(self.levels):
      _require(0 < level <= 1, f"sweep.levels[{i}]", level, "a compute utilization in (0, 1]")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanConfig:
  """A plan: the model, hardware, topology, stragglers, failures, budget, strategies and sweep."""

  name: str = _key(
    "plan", meaning="the plan's name: its files go to runs/plan-NAME unless --out says otherwise"
  )
  model: PlanModelConfig = _key(meaning="the model by its size")
  hardware: PlanHardwareConfig = _key(meaning="the accelerator and MFU", factory=PlanHardwareConfig)
  topology: PlanTopologyConfig = _key(meaning="the workers and links")
  stragglers: PlanStragglersConfig = _key(meaning="jitter and slow workers", factory=PlanStragglersConfig)
  failures: PlanFailuresConfig | None = _key(None, meaning="chip failures and checkpoints (null: none)")
  budget_tokens: float | None = _key(
    None, meaning="tokens over all workers to time (needs model.tokens_per_step)"
  )
  budget_steps: float | None = _key(None, meaning="worker steps to time")
  strategies: list[PlanStrategyConfig] = _key(meaning="the strategies to plan")
  sweep: PlanSweepConfig = _key(meaning="the bandwidth sweep", factory=PlanSweepConfig)
  seed: int = _key(0, meaning="the jitter seed")

  def __post_init__(self):
    _require(bool(self.strategies), "strategies", self.strategies, "at least one strategy")
    _require(
      self.budget_tokens is None or self.budget_steps is None,
      "budget_tokens",
      self.budget_tokens,
      "null when budget_steps is given (one budget)",
    )
    _require(
      self.budget_tokens is None or self.model.tokens_per_step is not None,
      "budget_tokens",
      self.budget_tokens,
      "null unless model.tokens_per_step is given (or a budget_steps)",
    )
    for name in ("budget_tokens", "budget_steps"):
      value = getattr(self, name)
      _require(value is None or value > 0, name, value, "a number > 0 or null")
    from jaxsync._src.plan.planner import VALUE_DEPENDENT
    from jaxsync._src.strategies import registry

    for i, s in enumerate(self.strategies):
      _require_choice(f"strategies[{i}].name", s.name, registry.names())
      _require(
        s.name not in VALUE_DEPENDENT,
        f"strategies[{i}].name",
        s.name,
        f"a strategy whose timing the planner can run without gradients; {VALUE_DEPENDENT.get(s.name, '')}",
      )
      try:
        blueprint = registry.blueprint(s.name, self.topology.workers, **s.options)
        if blueprint.engine == "async":  # its rules read options the blueprint does not: build them
          registry.make(s.name, self.topology.workers, **s.options)
      except ValueError as err:
        raise ConfigError(f"strategies[{i}] ({s.name}): {' '.join(str(err).split())}") from None
      fragments = blueprint.exchange.fragments if blueprint.protocol == "local" else 1
      _require(
        fragments <= self.model.layers,
        f"strategies[{i}].options.fragments",
        fragments,
        f"at most model.layers={self.model.layers} (a fragment holds whole layers)",
      )


def load_plan(path: str | pathlib.Path, overrides: list[str] = ()) -> PlanConfig:
  """Reads a plan config, applies ``--set`` overrides, validates; raises :class:`ConfigError`."""
  raw = read_file(path, "plan file", "configs/plan/four_datacenters.yaml")
  return _build(PlanConfig, apply_overrides(raw, list(overrides)))


def run_plan(config: PlanConfig):
  """The plan of ``config`` (``jaxsync.plan`` with its plain arguments); a value the planner refuses is a
  :class:`ConfigError`."""
  try:
    return _run_plan(config)
  except ValueError as err:
    raise ConfigError(f"plan {config.name!r}: {' '.join(str(err).split())}") from None


def _run_plan(config: PlanConfig):
  import numpy as np

  from jaxsync._src.plan.planner import plan
  from jaxsync._src.plan.workload import Failures, ModelSize, Topology, gbits
  from jaxsync._src.sim.time_model import Link

  m, t = config.model, config.topology
  inner = None if t.inner is None else Link(t.inner.latency, gbits(t.inner.gbps))
  return plan(
    ModelSize(m.parameters, m.layers, m.tokens_per_step, m.flops_per_step, m.step_time, m.dtype),
    Topology(t.workers, Link(t.outer.latency, gbits(t.outer.gbps)), t.chips_per_worker, inner),
    [(s.label or s.name, s.name, s.options) for s in config.strategies],
    hardware=config.hardware.accelerator,
    mfu=config.hardware.mfu,
    jitter_shape=config.stragglers.jitter_shape,
    slow_fraction=config.stragglers.slow_fraction,
    slowdown=config.stragglers.slowdown,
    budget_steps=config.budget_steps,
    budget_tokens=config.budget_tokens,
    failures=None if config.failures is None else Failures(**dataclasses.asdict(config.failures)),
    bandwidths=tuple(
      np.logspace(np.log10(config.sweep.from_gbps), np.log10(config.sweep.to_gbps), config.sweep.points)
    ),
    levels=tuple(config.sweep.levels),
    strided=config.sweep.strided,
    seed=config.seed,
  )


def _duration(seconds: float | None) -> str:
  if seconds is None:
    return "-"
  for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
    if seconds >= size:
      return f"{seconds / size:.3g} {unit}"
  return f"{seconds:.3g} s"


def _bytes(n: float) -> str:
  for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if n >= size:
      return f"{n / size:.3g} {unit}"
  return "0" if n == 0 else f"{n:.3g} B"


def plan_table(result) -> str:
  """The plan as a Markdown table, one row per strategy, then its assumptions."""
  levels = list(result.strategies[0].needed_bandwidth)
  head = (
    "| strategy | clock | step (s) | compute util. | goodput | wall time | bytes/step/worker | inner bytes/step | "
    "largest exchange | " + " | ".join(f"Gbit/s for {lv:.0%}" for lv in levels) + " |"
  )
  lines = [head, "|" + "---|" * (9 + len(levels))]
  for s in result.strategies:
    need = [
      "-"
      if s.clock == "events"
      else ("> sweep" if s.needed_bandwidth[lv] is None else f"{s.needed_bandwidth[lv]:.3g}")
      for lv in levels
    ]
    lines.append(
      f"| {s.name} | {s.clock} | {s.step_time:.4g} | {s.compute_utilization:.1%} | {s.goodput:.1%} | "
      f"{_duration(s.wall_time)} | {_bytes(s.bytes_per_step)} | {_bytes(s.inner_bytes_per_step)} | "
      f"{_bytes(s.largest_exchange)} | " + " | ".join(need) + " |"
    )
  fastest = min(result.strategies, key=lambda s: s.step_time / s.goodput)
  done = f"{_duration(fastest.wall_time)} to the budget, " if fastest.wall_time is not None else ""
  lines += [
    "",
    f"Fastest on this link: {fastest.name} ({done}{fastest.step_time:.4g} s a step at "
    f"{fastest.compute_utilization:.1%} compute, goodput included).",
  ]
  lines += ["", *[f"- {a}" for a in result.assumptions]]
  lines.append(
    "- '-' under Gbit/s: an asynchronous strategy runs on events at the topology's own link (not swept)"
  )
  return "\n".join(lines)


def write_plan(result, out: pathlib.Path, title: str) -> list[pathlib.Path]:
  """Writes ``plan.md``, ``plan.json`` and ``utilization.png`` (utilization against bandwidth) to ``out``."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  out.mkdir(parents=True, exist_ok=True)
  table = plan_table(result)
  (out / "plan.md").write_text(f"# {title}\n\n{table}\n")
  (out / "plan.json").write_text(json.dumps(dataclasses.asdict(result), indent=1, default=str))
  fig, ax = plt.subplots(figsize=(7, 4.2))
  for s in result.strategies:
    if s.sweep:
      ax.plot(result.bandwidths, [100 * u for u in s.sweep], label=s.name)
  ax.axvline(result.link_gbps, color="0.5", linestyle="--", linewidth=1)
  ax.annotate(
    f" the plan's link, {result.link_gbps:g} Gbit/s", (result.link_gbps, 3), fontsize=8, color="0.4"
  )
  ax.set_xscale("log")
  ax.set_xlabel("bandwidth between workers (Gbit/s)")
  ax.set_ylabel("compute utilization (%)")
  ax.set_ylim(0, 101)
  ax.grid(True, which="both", alpha=0.3)
  ax.set_title(title, fontsize=10)
  ax.legend(fontsize=8)
  fig.tight_layout()
  figure = out / "utilization.png"
  fig.savefig(figure, dpi=120)
  plt.close(fig)
  return [out / "plan.md", out / "plan.json", figure]
