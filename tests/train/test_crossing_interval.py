"""A time to a target is known to within the evaluation interval around its crossing, and two times closer
than that interval are not told apart."""

from __future__ import annotations

import importlib
import types

import pytest

from jaxsync._src.train.summary import target_crossings
from tests.helpers import made_up_history

harness = importlib.import_module("benchmarks.common.harness")


def test_the_crossing_that_holds_lies_after_the_evaluation_before_it():
  history = made_up_history(30, {"accuracy": [0.5, 0.7, 0.86]})  # evaluated at 0, 10 and 20 s; ends at 30 s
  held = target_crossings(history, {"accuracy": 0.87}, ("accuracy", 0.84))
  assert (held["time_to_target_held_after"], held["time_to_target_held"]) == (10.0, 20.0)
  at_once = target_crossings(history, {"accuracy": 0.9}, ("accuracy", 0.4))
  assert (at_once["time_to_target_held_after"], at_once["time_to_target_held"]) == (0.0, 0.0)
  at_the_end = target_crossings(history, {"accuracy": 0.9}, ("accuracy", 0.88))  # only the final one holds
  assert (at_the_end["time_to_target_held_after"], at_the_end["time_to_target_held"]) == (20.0, 30.0)
  missed = target_crossings(history, {"accuracy": 0.8}, ("accuracy", 0.84))
  assert missed["time_to_target_held_after"] is None and missed["time_to_target_held"] is None


def _cell(*crossings):
  runs = [
    types.SimpleNamespace(summary={"time_to_target_held_after": after, "time_to_target_held": at})
    for after, at in crossings
  ]
  return harness.Cell("x", runs, "")


def test_two_cells_closer_than_their_evaluation_interval_are_not_told_apart():
  fine, coarse = _cell((0.9, 1.0), (0.91, 1.01), (0.92, 1.02)), _cell((0.8, 1.2), (0.81, 1.21), (0.82, 1.22))
  assert harness.crossing_width(fine, coarse) == pytest.approx(0.4)  # the coarser cell's mean interval
  assert harness.crossing_width(_cell((None, None))) is None
  a, b = fine.values("time_to_target_held"), coarse.values("time_to_target_held")
  assert harness.time_test(a, b)["p"] < 0.05  # Welch alone calls 1.01 s against 1.21 s significant ...
  undecided = harness.time_test(
    a, b, within=harness.crossing_width(fine, coarse)
  )  # ... within 0.4 s it is not
  assert undecided == {"p": 1.0, "test": "within one evaluation interval (0.4 s): not decided"}
  assert harness.time_test(a, [3.0, 3.1, 3.2], within=0.4)["test"] == "Welch"  # 2 s apart: decided
  assert harness.time_test(a, [1.2, None, 1.3], within=0.4)["test"] == "rank test, a miss as the slowest"


def test_a_speed_ups_standard_error_is_the_delta_methods_and_none_where_a_seed_missed():
  a, b = [1.0, 1.2, 1.4], [2.0, 2.2, 2.4]  # means 1.2 and 2.2, sample variances 0.04
  expected = (0.04 / (3 * 1.2**2) + 0.04 / (3 * 2.2**2)) ** 0.5
  assert harness.log_ratio_se(a, b) == pytest.approx(expected)
  assert harness.log_ratio_se(a, [2.0, None, 2.4]) is None and harness.log_ratio_se([1.0], b) is None
