"""What a plan is about: a model described by its size, a topology of workers and links, and failures."""

from __future__ import annotations

import dataclasses

from jaxsync._src.core import validation
from jaxsync._src.sim.time_model import Link

_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def gbits(gbit_per_second: float) -> float:
  """Bytes per second of a link of ``gbit_per_second`` Gbit/s."""
  return gbit_per_second * 1e9 / 8


@dataclasses.dataclass(frozen=True)
class ModelSize:
  """A model by its size: parameters, layers, and the compute of one worker's step.

  Give one of ``step_time`` (measured seconds of one step of one worker),
  ``flops_per_step`` or ``tokens_per_step`` (FLOPs ``6 N T``: Kaplan et al.,
  2020, forward and backward of ``N`` parameters on ``T`` tokens).

  Attributes:
    parameters: ``N``.
    layers: ``L``, the blocks whose gradients are reduced one at a time.
    tokens_per_step: tokens one worker (all its chips) trains on per step.
    flops_per_step: FLOPs of one worker's step.
    step_time: measured seconds of one worker's step (the rest is ignored).
    dtype: the gradients' (and pseudo-gradients') precision on the wire:
      ``bfloat16`` (2 bytes per parameter), ``float16`` or ``float32``.
  """

  parameters: float
  layers: int
  tokens_per_step: float | None = None
  flops_per_step: float | None = None
  step_time: float | None = None
  dtype: str = "bfloat16"

  def __post_init__(self):
    validation.check_real("ModelSize", "parameters", self.parameters, low=1.0)
    validation.check_int("ModelSize", "layers", self.layers)
    if self.layers > self.parameters:
      raise validation.invalid("ModelSize", "layers", self.layers, f"at most parameters={self.parameters:g}")
    given = [n for n in ("tokens_per_step", "flops_per_step", "step_time") if getattr(self, n) is not None]
    if len(given) != 1:
      raise validation.invalid(
        "ModelSize", "tokens_per_step/flops_per_step/step_time", given, "exactly one of the three"
      )
    validation.check_real("ModelSize", given[0], getattr(self, given[0]), low=0.0, low_open=True)
    validation.check_choice("ModelSize", "dtype", self.dtype, list(_BYTES))

  @property
  def bytes_per_parameter(self) -> int:
    return _BYTES[self.dtype]

  def layer_sizes(self) -> tuple[int, ...]:
    """Parameters per layer: ``N / L`` each (the remainder in the first layers)."""
    base, extra = divmod(int(self.parameters), self.layers)
    return tuple(base + (i < extra) for i in range(self.layers))

  def compute_time(self, peak_flops: float, mfu: float, chips: int) -> float:
    """Seconds of one worker's step: ``step_time``, or its FLOPs over ``R`` chips at ``mfu`` of their peak."""
    if self.step_time is not None:
      return float(self.step_time)
    flops = (
      self.flops_per_step if self.flops_per_step is not None else 6.0 * self.parameters * self.tokens_per_step
    )
    return flops / (chips * peak_flops * mfu)


@dataclasses.dataclass(frozen=True)
class Topology:
  """``M`` workers (a worker is a host, a pod or a datacenter of ``R`` chips) and the links between and inside them.

  Attributes:
    workers: ``M``.
    chips_per_worker: ``R``.
    outer: the link between workers (each worker's share of it).
    inner: the link inside a group of workers: the hierarchical all-reduce's
      lower level (its ``group_size`` workers), InHAD's nodes, EA-wild's
      groups; default 10x the outer bandwidth at a tenth of its latency, as
      the simulator's. A worker's own chips talk inside its step time (the
      MFU), not over a link of the plan.
  """

  workers: int
  outer: Link
  chips_per_worker: int = 1
  inner: Link | None = None

  def __post_init__(self):
    validation.check_int("Topology", "workers", self.workers)
    validation.check_int("Topology", "chips_per_worker", self.chips_per_worker)
    if not isinstance(self.outer, Link):
      raise validation.invalid("Topology", "outer", self.outer, "a jaxsync.sim.Link")

  @property
  def chips(self) -> int:
    return self.workers * self.chips_per_worker


@dataclasses.dataclass(frozen=True)
class Failures:
  """How often chips fail and what a failure costs.

  Attributes:
    chip_mtbf_hours: mean hours between failures of one chip.
    restart_time: seconds until a failed worker (or the job) runs again.
    checkpoint_interval: seconds between checkpoints.
    checkpoint_time: seconds training stops to write one.
  """

  chip_mtbf_hours: float
  restart_time: float = 600.0
  checkpoint_interval: float = 3600.0
  checkpoint_time: float = 60.0

  def __post_init__(self):
    validation.check_real("Failures", "chip_mtbf_hours", self.chip_mtbf_hours, low=0.0, low_open=True)
    validation.check_real("Failures", "restart_time", self.restart_time, low=0.0)
    validation.check_real("Failures", "checkpoint_interval", self.checkpoint_interval, low=0.0, low_open=True)
    validation.check_real("Failures", "checkpoint_time", self.checkpoint_time, low=0.0)


def goodput(
  failures: Failures | None, behaviour: str, *, chips: int, workers: int, lost_work: float
) -> float:
  r"""The share of the run's compute that ends up in the model, under failures.

  With ``lambda = R / MTBF`` failures per second of one worker of ``R`` chips
  (``M lambda`` of the job), a checkpoint of ``c`` seconds every ``I``:

  .. math::

    \text{restart}:&\ \frac{1}{1 + c/I} \cdot \frac{1}{1 + M\lambda\,(t_r + (I + c)/2)} \\
    \text{replace},\ \text{continue}:&\ \frac{1}{1 + c/I} \cdot \max\bigl(0,\ 1 - \lambda\,(t_r + w/2)\bigr)

  *restart*: a synchronous job stops on any failure and every worker redoes
  the work since the last checkpoint; *replace* (a parameter server's worker)
  and *continue* (a DiLoCo round goes on without the lost worker): only the
  failed worker is out, for the restart time ``t_r`` and half of its unit of
  work ``w`` (a step, or a round of local steps) on average.

  Args:
    failures: the failure model, or None (no failures: 1).
    behaviour: ``restart``, ``replace`` or ``continue``.
    chips: ``M R``.
    workers: ``M``.
    lost_work: ``w``, seconds of the unit of work a failed worker loses.
  """
  if failures is None:
    return 1.0
  mtbf = failures.chip_mtbf_hours * 3600.0
  per_worker = chips / workers / mtbf
  checkpoints = 1.0 / (1.0 + failures.checkpoint_time / failures.checkpoint_interval)
  if behaviour == "restart":
    lost = failures.restart_time + (failures.checkpoint_interval + failures.checkpoint_time) / 2
    return checkpoints / (1.0 + workers * per_worker * lost)
  return checkpoints * max(0.0, 1.0 - per_worker * (failures.restart_time + lost_work / 2))
