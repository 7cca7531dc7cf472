"""How far a simulated run is from the real run of the same config: rates, staleness, time to a target, accuracy.

Both runs are read from their event records (:class:`EventRecord`: the
simulator's, and a real run's final checkpoint), on clocks that start when
every worker is running: at the event that brings the last worker's first
arrival, or a synchronous run's first round after its warm-up (leading rounds
over 5 times the median round: compiling). A real run's seconds before it
(processes starting, each worker compiling its first step, which the fastest
ones do sooner) are not what the time model predicts, and are reported apart
(:attr:`RunMeasures.start`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from jaxsync._src.core import validation
from jaxsync._src.interface.history import crossing
from jaxsync._src.steps.records import EventRecord

_WHAT = "agreement"


class RunMeasures(NamedTuple):
  """What one run is compared on.

  Attributes:
    start: seconds of the run's clock when every worker is running (the event
      of the last worker's first arrival; a synchronous run's first round after
      its warm-up).
    gradients_per_second: gradients computed per second over the run's second
      half of events (its steady state).
    updates_per_second: server updates per second over the same events.
    staleness: every accepted arrival's staleness (``int[n]``).
    eval_time: each evaluation's seconds since ``start`` (the last one taken
      before it counts as taken at 0).
    accuracy: each evaluation's accuracy.
    duration: seconds from ``start`` to the last event.
  """

  start: float
  gradients_per_second: float
  updates_per_second: float
  staleness: np.ndarray
  eval_time: np.ndarray
  accuracy: np.ndarray
  duration: float


def measures(records: EventRecord, gradients_per_event: float, metric: str = "accuracy") -> RunMeasures:
  """A run's :class:`RunMeasures` from its event records.

  Args:
    records: one row per event (arrays).
    gradients_per_event: worker gradients one event stands for
      (``Strategy.gradients_per_event``: 1 for an arrival, ``K H`` for a round).
    metric: the evaluation metric compared.
  """
  time = np.asarray(records.time, np.float64)
  if time.size < 4:
    raise validation.invalid(_WHAT, "records", f"{time.size} events", "a run of 4 events or more")
  half = time.size // 2
  span = time[-1] - time[half - 1]
  released = np.asarray(records.released, bool)
  events = time.size - half
  accepted = ~np.asarray(records.rejected, bool)
  if np.asarray(records.worker).min() < 0:  # a synchronous round: no arrival, no staleness
    accepted = np.zeros_like(accepted)
  workers = np.asarray(records.worker)
  if workers.min() < 0:
    first = _warm_up_rounds(time)
  else:
    first = max(int(np.argmax(workers == w)) for w in np.unique(workers))
  start = float(time[first])
  evaluated = np.flatnonzero(np.asarray(records.evaluated, bool))
  accuracy = np.asarray(records.metrics[metric], np.float64)
  before = evaluated[evaluated < first]
  kept = np.concatenate([before[-1:], evaluated[evaluated >= first]])
  return RunMeasures(
    start=start,
    gradients_per_second=events * gradients_per_event / span if span > 0 else math.inf,
    updates_per_second=float(released[half:].sum()) / span if span > 0 else math.inf,
    staleness=np.asarray(records.staleness)[accepted].astype(np.int64),
    eval_time=np.maximum(time[kept] - start, 0.0),
    accuracy=accuracy[kept],
    duration=float(time[-1] - start),
  )


def _warm_up_rounds(time: np.ndarray) -> int:
  """Leading rounds that took over 5 times the median round: compiling the round, and on real processes
  the first chunk's end (reading the workers' models back compiles a collective). The clock starts after
  them; a simulated run has none."""
  gaps = np.diff(time)
  slow = gaps > 5 * np.median(gaps)
  return int(np.argmin(slow)) if not slow.all() else 0


def time_to_hold(eval_time: np.ndarray, accuracy: np.ndarray, target: float) -> float | None:
  """Seconds of the first evaluation from which accuracy stays at or above ``target`` to the run's end
  (a crossing that holds, not one lucky evaluation); None if the last evaluation is below it."""
  first = crossing(accuracy, target, holds=True)
  return None if first is None else float(eval_time[first])


def accuracy_at(eval_time: np.ndarray, accuracy: np.ndarray, seconds: float) -> float:
  """The accuracy of the last evaluation at or before ``seconds`` (the first evaluation's before it)."""
  i = int(np.searchsorted(eval_time, seconds, side="right")) - 1
  return float(accuracy[max(i, 0)])


def total_variation(a: np.ndarray, b: np.ndarray) -> float:
  """Total variation distance ``1/2 sum_s |p_a(s) - p_b(s)|`` of two integer samples' distributions."""
  a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
  if not a.size or not b.size:
    return math.nan
  length = int(max(a.max(), b.max())) + 1
  pa = np.bincount(a, minlength=length) / a.size
  pb = np.bincount(b, minlength=length) / b.size
  return 0.5 * float(np.abs(pa - pb).sum())


def relative_error(simulated: float | None, real: float | None) -> float | None:
  """``(simulated - real) / real``; None when either is missing."""
  if simulated is None or real is None or not real:
    return None
  return (simulated - real) / real


def _median(values: list[float | None]) -> float | None:
  """The median of the values, None unless more than half of them are there (a target most runs miss)."""
  present = [v for v in values if v is not None]
  return float(np.median(present)) if len(present) * 2 > len(values) else None


def compare(real: RunMeasures, simulated: list[RunMeasures], *, target: float) -> dict[str, dict | float]:
  """The real run against simulated runs of the same config (seeds: a real run is one draw of its data
  order and timing, the simulated runs say how much of a difference such draws make).

  Returns:
    ``gradients_per_second``, ``updates_per_second`` and ``time_to_target``,
    each ``{"real", "simulated", "error"}`` (the simulated median over seeds,
    the error relative to the real value; time to target also ``"range"``,
    the simulated runs' least and greatest); ``staleness`` (means, and the
    ``total_variation`` of the real distribution against the simulated runs'
    pooled one); ``accuracy_at_equal_time`` (at the shorter run's end, the
    simulated median); and ``start`` (the real run's seconds before every
    worker ran, which no simulated clock has).
  """
  out = compare_runs([real], simulated, target=target)
  for key in ("gradients_per_second", "updates_per_second"):
    out[key] = {k: out[key][k] for k in ("real", "simulated", "error")}
  out["time_to_target"] = {
    k: v
    for k, v in out["time_to_target"].items()
    if k not in ("real_range", "simulated_range", "real_times", "real_reached")
  }
  del out["runs"], out["start_range"]
  return out


def compare_runs(
  real: list[RunMeasures], simulated: list[RunMeasures], *, target: float
) -> dict[str, dict | float | int]:
  """Real runs of a config against its simulated runs: each side's median, with its range.

  :func:`compare` takes one real run. With several (each its own draw of
  data order and timing: seeds 0, 1, ...), the median of the real runs is
  what the simulated median is held against, and the real runs' least and
  greatest value say how far one real run is from another.

  Returns:
    The keys of :func:`compare`, their ``"real"`` and ``"simulated"`` now
    medians over runs (a time to target only where more than half of the runs
    reached it) and ``"error"`` the simulated median relative to the real one.
    ``gradients_per_second``, ``updates_per_second`` and ``time_to_target``
    also hold ``"real_range"`` and ``"simulated_range"`` (least, greatest;
    ``time_to_target["range"]`` is the simulated one, as in :func:`compare`),
    ``time_to_target`` also ``"real_times"`` (each real run's, None where it
    missed) and ``"real_reached"``; ``staleness`` pools each side's arrivals;
    ``start`` is the real runs' median, ``start_range`` their range; ``runs``
    the number of real runs.
  """
  if not real:
    raise validation.invalid(_WHAT, "real", real, "one or more real runs")
  if not simulated:
    raise validation.invalid(_WHAT, "simulated", simulated, "one or more simulated runs")
  out: dict = {"runs": len(real)}
  for key in ("gradients_per_second", "updates_per_second"):
    r, s = [getattr(m, key) for m in real], [getattr(m, key) for m in simulated]
    out[key] = {
      "real": _median(r),
      "simulated": _median(s),
      "error": relative_error(_median(s), _median(r)),
      "real_range": [min(r), max(r)],
      "simulated_range": [min(s), max(s)],
    }
  real_times = [time_to_hold(m.eval_time, m.accuracy, target) for m in real]
  sim_times = [time_to_hold(m.eval_time, m.accuracy, target) for m in simulated]
  real_reached = [t for t in real_times if t is not None]
  sim_reached = [t for t in sim_times if t is not None]
  sim_range = [min(sim_reached), max(sim_reached)] if sim_reached else None
  out["time_to_target"] = {
    "real": _median(real_times),
    "simulated": _median(sim_times),
    "error": relative_error(_median(sim_times), _median(real_times)),
    "target": target,
    "range": sim_range,
    "real_range": [min(real_reached), max(real_reached)] if real_reached else None,
    "simulated_range": sim_range,
    "real_times": real_times,
    "reached": f"{len(sim_reached)} of {len(sim_times)}",
    "real_reached": f"{len(real_reached)} of {len(real_times)}",
  }
  real_pooled = np.concatenate([m.staleness for m in real])
  sim_pooled = np.concatenate([m.staleness for m in simulated])
  out["staleness"] = {
    "real": float(real_pooled.mean()) if real_pooled.size else None,
    "simulated": float(sim_pooled.mean()) if sim_pooled.size else None,
    "total_variation": total_variation(real_pooled, sim_pooled),
  }
  horizon = min(m.duration for m in [*real, *simulated])
  out["accuracy_at_equal_time"] = {
    "seconds": horizon,
    "real": _median([accuracy_at(m.eval_time, m.accuracy, horizon) for m in real]),
    "simulated": _median([accuracy_at(m.eval_time, m.accuracy, horizon) for m in simulated]),
  }
  starts = [m.start for m in real]
  out["start"] = _median(starts)
  out["start_range"] = [min(starts), max(starts)]
  return out
