"""Comparing a simulated run with a real one: the clocks, rates, staleness, time to target."""

from __future__ import annotations

import numpy as np
import pytest

from jaxsync._src.calibration import agreement
from jaxsync._src.steps.records import EventRecord


def _records(time, worker, *, staleness=None, evaluated=None, accuracy=None, released=None):
  n = len(time)
  return EventRecord(
    time=np.asarray(time, np.float32),
    worker=np.asarray(worker, np.int32),
    staleness=np.asarray(staleness if staleness is not None else np.zeros(n), np.int32),
    version=np.arange(1, n + 1, dtype=np.int32),
    released=np.asarray(released if released is not None else np.ones(n), bool),
    k=np.ones(n, np.int32),
    loss=np.zeros(n, np.float32),
    rejected=np.zeros(n, bool),
    step_size=np.full(n, np.nan, np.float32),
    evaluated=np.asarray(evaluated if evaluated is not None else np.zeros(n), bool),
    metrics={"accuracy": np.asarray(accuracy if accuracy is not None else np.full(n, np.nan), np.float32)},
  )


def test_the_clock_starts_when_every_worker_has_arrived_once():
  # Worker 0 arrives at 5, 6, 7; worker 1 (slower to start) first at 9, then 10 .. 13.
  time = [5, 6, 7, 9, 10, 11, 12, 13]
  worker = [0, 0, 0, 1, 0, 1, 0, 1]
  evaluated = [1, 0, 1, 0, 1, 0, 0, 1]
  accuracy = [0.1, 0, 0.3, 0, 0.5, 0, 0, 0.9]
  m = agreement.measures(_records(time, worker, evaluated=evaluated, accuracy=accuracy), 1)
  assert m.start == 9.0 and m.duration == 4.0
  # The last evaluation before the start counts at 0; the later ones on the new clock.
  np.testing.assert_allclose(m.eval_time, [0.0, 1.0, 4.0])
  np.testing.assert_allclose(m.accuracy, [0.3, 0.5, 0.9], rtol=1e-6)
  # Rates over the second half: events 4 .. 7 after the 4th event's time (9): 4 events in 4 s.
  assert m.gradients_per_second == pytest.approx(1.0)
  assert m.updates_per_second == pytest.approx(1.0)


def test_a_synchronous_run_starts_at_its_first_round_and_has_no_staleness():
  m = agreement.measures(_records([1.0, 2.0, 3.0, 4.0], [-1] * 4), gradients_per_event=6)
  assert m.start == 1.0
  assert m.gradients_per_second == pytest.approx(6 * 2 / 2.0)
  assert m.staleness.size == 0


def test_a_real_synchronous_run_starts_after_the_rounds_that_compiled():
  # Round 1 compiles (9 s), round 2 waits for the first chunk's end (6.5 s), then 0.25 s a round.
  time = [0.0, 9.0, 15.5, 15.75, 16.0, 16.25, 16.5, 16.75]
  m = agreement.measures(_records(time, [-1] * 8), gradients_per_event=12)
  assert m.start == 15.5 and m.duration == 1.25


def test_time_to_target_is_a_crossing_that_holds():
  t = np.asarray([0.0, 1.0, 2.0, 3.0, 4.0])
  assert agreement.time_to_hold(t, np.asarray([0.1, 0.96, 0.90, 0.97, 0.98]), 0.95) == 3.0
  assert agreement.time_to_hold(t, np.asarray([0.96, 0.97, 0.98, 0.99, 0.99]), 0.95) == 0.0
  assert agreement.time_to_hold(t, np.asarray([0.1, 0.96, 0.97, 0.98, 0.9]), 0.95) is None


def test_total_variation_of_staleness_distributions():
  assert agreement.total_variation(np.asarray([0, 1, 1, 2]), np.asarray([0, 1, 1, 2])) == 0.0
  assert agreement.total_variation(np.asarray([0, 0]), np.asarray([3, 3])) == 1.0
  # p = (1/2, 1/2, 0), q = (1/4, 1/4, 1/2): half of |1/4| + |1/4| + |1/2| = 1/2.
  assert agreement.total_variation(np.asarray([0, 1]), np.asarray([0, 1, 2, 2])) == pytest.approx(0.5)


def _run(rate, times, accuracy, staleness=(1,)):
  return agreement.RunMeasures(
    start=0.0,
    gradients_per_second=rate,
    updates_per_second=rate,
    staleness=np.asarray(staleness),
    eval_time=np.asarray(times, float),
    accuracy=np.asarray(accuracy, float),
    duration=float(times[-1]),
  )


def test_compare_takes_the_simulated_median_and_the_error_relative_to_the_real_run():
  real = _run(100.0, [0, 1, 2, 3, 4], [0.1, 0.5, 0.96, 0.97, 0.98])  # holds from 2 s
  sims = [
    _run(90.0, [0, 1, 2, 3], [0.1, 0.96, 0.97, 0.98]),  # 1 s
    _run(110.0, [0, 1, 2, 3], [0.1, 0.5, 0.5, 0.96]),  # 3 s
    _run(120.0, [0, 1, 2, 3], [0.1, 0.5, 0.96, 0.97]),  # 2 s
  ]
  c = agreement.compare(real, sims, target=0.95)
  assert c["gradients_per_second"] == {"real": 100.0, "simulated": 110.0, "error": pytest.approx(0.1)}
  t = c["time_to_target"]
  assert (t["real"], t["simulated"], t["error"], t["range"]) == (2.0, 2.0, 0.0, [1.0, 3.0])
  # At the shorter run's end (3 s): the real run's 0.97, the simulated median of 0.98, 0.96, 0.97.
  assert c["accuracy_at_equal_time"] == {"seconds": 3.0, "real": 0.97, "simulated": 0.97}


def test_compare_has_no_simulated_time_when_most_seeds_miss_the_target():
  real = _run(100.0, [0, 1, 2], [0.1, 0.96, 0.97])
  sims = [_run(90.0, [0, 1, 2], [0.1, 0.2, 0.3]), _run(90.0, [0, 1, 2], [0.1, 0.96, 0.97])]
  t = agreement.compare(real, sims, target=0.95)["time_to_target"]
  assert t["simulated"] is None and t["error"] is None and t["reached"] == "1 of 2"


def test_compare_runs_holds_the_real_median_against_the_simulated_one_with_both_ranges():
  reals = [
    _run(100.0, [0, 1, 2, 3, 4], [0.1, 0.5, 0.96, 0.97, 0.98]),  # holds from 2 s
    _run(80.0, [0, 1, 2, 3, 4], [0.1, 0.5, 0.5, 0.96, 0.97]),  # 3 s
    _run(120.0, [0, 1, 2, 3, 4], [0.1, 0.5, 0.5, 0.5, 0.5]),  # never
  ]
  sims = [_run(90.0, [0, 1, 2, 3], [0.1, 0.96, 0.97, 0.98]), _run(110.0, [0, 1, 2, 3], [0.1, 0.5, 0.5, 0.96])]
  c = agreement.compare_runs(reals, sims, target=0.95)
  g = c["gradients_per_second"]
  assert (g["real"], g["simulated"], g["real_range"], g["simulated_range"]) == (
    100.0,
    100.0,
    [80.0, 120.0],
    [90.0, 110.0],
  )
  t = c["time_to_target"]
  # Two of three real runs held it (2 s and 3 s): more than half, so the median of those that did.
  assert (
    t["real_times"] == [2.0, 3.0, None] and t["real_reached"] == "2 of 3" and t["real_range"] == [2.0, 3.0]
  )
  assert t["real"] == 2.5 and t["simulated"] == 2.0 and t["error"] == pytest.approx(-0.2)
  assert t["range"] == [1.0, 3.0] and c["runs"] == 3
  # One real run: the same numbers as compare, which keeps its own keys.
  one = agreement.compare(reals[0], sims, target=0.95)
  assert (
    one["time_to_target"]["real"]
    == agreement.compare_runs(reals[:1], sims, target=0.95)["time_to_target"]["real"]
  )
  assert set(one["gradients_per_second"]) == {"real", "simulated", "error"} and "runs" not in one
