"""What a run recorded, whatever ran it: the :class:`History` every runtime returns."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import numpy as np

from jaxsync._src.steps.records import EventRecord


class RunTotals(NamedTuple):
  """Per-worker and per-run totals a runtime reads off its final state (what the records do not hold).

  Attributes:
    worker_steps: ``[K]`` gradients each worker computed.
    worker_used: ``[K]`` gradients of each worker the server applied.
    worker_idle: ``[K]`` seconds each worker waited.
    bytes_moved: bytes over the inter-machine network.
    bytes_moved_intra: bytes inside nodes or groups.
  """

  worker_steps: np.ndarray
  worker_used: np.ndarray
  worker_idle: np.ndarray
  bytes_moved: float
  bytes_moved_intra: float

  def per_worker(self, workers_per_unit: int) -> RunTotals:
    """Totals counted per unit (an EA-wild group of ``G``: ``[K/G]``) spread over its workers (``[K]``).

    Every member of a group computes a gradient at each of the group's steps
    and waits as long as the group.
    """
    if workers_per_unit == 1:
      return self
    spread = lambda x: np.repeat(np.asarray(x), workers_per_unit)  # noqa: E731
    return self._replace(
      worker_steps=spread(self.worker_steps),
      worker_used=spread(self.worker_used),
      worker_idle=spread(self.worker_idle),
    )


@dataclasses.dataclass
class History:
  """Everything a run recorded, as NumPy arrays (one row per event unless noted).

  An *event* is one arrival at the server (asynchronous strategies) or one
  synchronous round. ``bytes_moved`` and the per-worker arrays describe the
  whole run.

  Attributes:
    time, worker, staleness, version, released, k, loss, rejected, step_size:
      see :class:`jaxsync.sim.EventRecord`.
    eval_time, eval_version, eval_event: when each evaluation was taken
      (the first row is the initial model).
    eval_metrics: ``{name: [num_evals]}``, e.g. loss and accuracy.
    worker_steps: ``[K]`` gradients each worker computed.
    worker_used: ``[K]`` gradients of each worker the server applied.
    worker_idle: ``[K]`` seconds each worker waited.
    bytes_moved: bytes over the inter-machine network.
    bytes_moved_intra: bytes inside nodes (InHAD).
    rejected_count: arrivals rejected as non-finite.
    clock: what ``time`` measures: ``"simulated"`` seconds (the simulator's
      time model) or ``"wall"`` seconds (a real multi-process run).
  """

  time: np.ndarray
  worker: np.ndarray
  staleness: np.ndarray
  version: np.ndarray
  released: np.ndarray
  k: np.ndarray
  loss: np.ndarray
  rejected: np.ndarray
  step_size: np.ndarray
  eval_time: np.ndarray
  eval_version: np.ndarray
  eval_event: np.ndarray
  eval_metrics: dict[str, np.ndarray]
  worker_steps: np.ndarray
  worker_used: np.ndarray
  worker_idle: np.ndarray
  bytes_moved: float
  bytes_moved_intra: float
  rejected_count: int
  clock: str = "simulated"

  @property
  def updates(self) -> int:
    """Server updates applied."""
    return int(self.version[-1]) if len(self.version) else 0

  @property
  def elapsed(self) -> float:
    """Seconds of the run's :attr:`clock` at the last event."""
    return float(self.time[-1]) if len(self.time) else 0.0

  @property
  def simulated_time(self) -> float:
    """Simulated seconds at the last event (a simulated run's :attr:`elapsed`)."""
    if self.clock != "simulated":
      raise ValueError(f"History: a {self.clock}-clock run has no simulated time; read elapsed instead.")
    return self.elapsed

  @property
  def time_key(self) -> str:
    """How rows and summaries name this run's time: ``"simulated_time"`` or ``"wall_time"``."""
    return f"{self.clock}_time"

  def mean_staleness(self) -> float:
    """Mean staleness over accepted arrivals."""
    ok = ~self.rejected
    return float(np.mean(self.staleness[ok])) if ok.any() else 0.0

  def time_to(
    self,
    metric: str,
    target: float,
    *,
    higher_is_better: bool = True,
    holds: bool = False,
    final: float | None = None,
  ) -> tuple[float, int] | None:
    """(seconds of the run's clock, server updates) of the first evaluation reaching ``target``, else None.

    ``holds=True``: the first evaluation from which ``metric`` stays at ``target`` or better to the last
    one (a crossing that holds, not one lucky evaluation); None if the last evaluation misses it.
    ``final``: the run's final evaluation of ``metric`` (taken at its end, :attr:`elapsed` and
    :attr:`updates`), counted as the last evaluation: a scheduled evaluation usually comes before the end,
    and a crossing holds only if the run also ends at the target."""
    values, times, versions = self.eval_metrics[metric], self.eval_time, self.eval_version
    if final is not None:
      values = np.append(values, final)
      times, versions = np.append(times, self.elapsed), np.append(versions, self.updates)
    i = crossing(values, target, higher_is_better=higher_is_better, holds=holds)
    return None if i is None else (float(times[i]), int(versions[i]))


def crossing(values, target: float, *, higher_is_better: bool = True, holds: bool = False) -> int | None:
  """Index of the first of ``values`` at ``target`` or better, else None; ``holds=True``: the first from
  which every later value is too (None when the last one misses)."""
  values = np.asarray(values, float)
  hit = values >= target if higher_is_better else values <= target
  if not hit.any():
    return None
  if not holds:
    return int(np.argmax(hit))
  if not hit[-1]:
    return None
  missed = np.flatnonzero(~hit)
  return 0 if not missed.size else int(missed[-1]) + 1


def assemble_history(
  records: list[EventRecord],
  initial_metrics: dict[str, float],
  metric_names: tuple[str, ...],
  totals: RunTotals,
  *,
  clock: str = "simulated",
) -> History:
  """A :class:`History` from the records of one or more chunks (every runtime's, simulated or real).

  The first evaluation row is ``initial_metrics`` (the model before any
  event); the others are the events whose record says ``evaluated``.
  """
  rec = jax.tree.map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]), *records)
  evaluated = rec.evaluated
  first = {name: np.asarray([float(initial_metrics.get(name, np.nan))]) for name in metric_names}
  eval_metrics = {name: np.concatenate([first[name], rec.metrics[name][evaluated]]) for name in metric_names}
  events = np.nonzero(evaluated)[0]
  has_evals = bool(metric_names)
  return History(
    time=rec.time,
    worker=rec.worker,
    staleness=rec.staleness,
    version=rec.version,
    released=rec.released,
    k=rec.k,
    loss=rec.loss,
    rejected=rec.rejected,
    step_size=rec.step_size,
    eval_time=np.concatenate([[0.0], rec.time[events]]) if has_evals else np.zeros([0]),
    eval_version=np.concatenate([[0], rec.version[events]]) if has_evals else np.zeros([0], int),
    eval_event=np.concatenate([[0], events + 1]) if has_evals else np.zeros([0], int),
    eval_metrics=eval_metrics,
    worker_steps=np.asarray(totals.worker_steps),
    worker_used=np.asarray(totals.worker_used),
    worker_idle=np.asarray(totals.worker_idle),
    bytes_moved=float(totals.bytes_moved),
    bytes_moved_intra=float(totals.bytes_moved_intra),
    rejected_count=int(rec.rejected.sum()),
    clock=clock,
  )
