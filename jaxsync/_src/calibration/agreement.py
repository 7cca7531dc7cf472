"""How far a simulated run is from the real run of the same config: rates, staleness, time to a target, accuracy.

Both runs are read from their event records (:class:`EventRecord`: the
simulator's, and a real run's final checkpoint), on clocks that start at each
run's first event: a real run's seconds before its first arrival (starting
processes, compiling) are not what the time model predicts, and are reported
apart (:attr:`RunMeasures.start`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from jaxsync._src.core import validation
from jaxsync._src.steps.records import EventRecord

_WHAT = "agreement"


class RunMeasures(NamedTuple):
  """What one run is compared on.

  Attributes:
    start: seconds of the run's clock at its first event.
    gradients_per_second: gradients computed per second over the run's second
      half of events (its steady state).
    updates_per_second: server updates per second over the same events.
    staleness: every accepted arrival's staleness (``int[n]``).
    eval_time: each evaluation's seconds since the first event.
    accuracy: each evaluation's accuracy.
    duration: seconds from the first event to the last.
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
  evaluated = np.asarray(records.evaluated, bool)
  return RunMeasures(
    start=float(time[0]),
    gradients_per_second=events * gradients_per_event / span if span > 0 else math.inf,
    updates_per_second=float(released[half:].sum()) / span if span > 0 else math.inf,
    staleness=np.asarray(records.staleness)[accepted].astype(np.int64),
    eval_time=time[evaluated] - time[0],
    accuracy=np.asarray(records.metrics[metric], np.float64)[evaluated],
    duration=float(time[-1] - time[0]),
  )


def time_to_hold(eval_time: np.ndarray, accuracy: np.ndarray, target: float) -> float | None:
  """Seconds of the first evaluation from which accuracy stays at or above ``target`` to the run's end
  (a crossing that holds, not one lucky evaluation); None if the last evaluation is below it."""
  below = np.flatnonzero(np.asarray(accuracy) < target)
  if below.size and below[-1] == len(accuracy) - 1:
    return None
  first = 0 if not below.size else int(below[-1]) + 1
  return float(eval_time[first])


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


def compare(real: RunMeasures, simulated: RunMeasures, *, target: float) -> dict[str, float | None]:
  """The simulated run against the real one.

  Returns:
    ``gradients_per_second``, ``updates_per_second``, ``time_to_target`` (each
    ``{"real", "simulated", "error"}``, error relative to the real value),
    ``staleness`` (means, and ``total_variation`` of the two distributions),
    ``accuracy_at_equal_time`` (both runs' accuracy at the shorter run's end),
    and ``start`` (the real run's seconds before its first event).
  """
  out: dict = {}
  for key in ("gradients_per_second", "updates_per_second"):
    r, s = getattr(real, key), getattr(simulated, key)
    out[key] = {"real": r, "simulated": s, "error": relative_error(s, r)}
  r = time_to_hold(real.eval_time, real.accuracy, target)
  s = time_to_hold(simulated.eval_time, simulated.accuracy, target)
  out["time_to_target"] = {"real": r, "simulated": s, "error": relative_error(s, r), "target": target}
  out["staleness"] = {
    "real": float(real.staleness.mean()) if real.staleness.size else None,
    "simulated": float(simulated.staleness.mean()) if simulated.staleness.size else None,
    "total_variation": total_variation(real.staleness, simulated.staleness),
  }
  horizon = min(real.duration, simulated.duration)
  out["accuracy_at_equal_time"] = {
    "seconds": horizon,
    "real": accuracy_at(real.eval_time, real.accuracy, horizon),
    "simulated": accuracy_at(simulated.eval_time, simulated.accuracy, horizon),
  }
  out["start"] = real.start
  return out
