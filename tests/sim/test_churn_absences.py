"""Churn in the simulator: elastic DiLoCo's rounds count the workers that are not gone (``cluster.absences``)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import helpers


def _experiment(*overrides):
  return helpers.quickstart_experiment(
    "model.name=mlp",
    "cluster.num_workers=3",
    "cluster.jitter_shape=null",
    "cluster.compute_time=0.01",  # a round of 5 steps: 0.05 s and the exchange
    "strategy.name=diloco",
    "run.eval_every=1000",
    *overrides,
  )


def test_churn_a_gone_worker_is_left_out_of_the_rounds_that_start_while_it_is_gone():
  exp = _experiment(
    "strategy.options={period: 5, membership: elastic}",
    "cluster.absences=[{worker: 2, start: 0.3, end: 0.6}]",
  )
  sim = exp.simulator()
  state, records = sim.advance(sim.init(exp.model.params, 0), 20)
  starts = np.concatenate([[0.0], np.asarray(records.time)[:-1]])  # a round starts when the last one ended
  gone = (starts >= 0.3) & (starts < 0.6)
  assert gone.any() and (~gone).any()
  np.testing.assert_array_equal(np.asarray(records.k), np.where(gone, 2, 3))
  # The gone worker computed nothing meanwhile: 5 steps a round it was there for.
  assert int(state.steps[2]) == 5 * int((~gone).sum()) and int(state.steps[0]) == 5 * 20
  assert float(np.min(np.asarray(state.idle))) >= 0.0
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))


def test_churn_without_absences_elastic_rounds_are_the_fixed_membership_rounds_on_the_same_data():
  """Every worker in every round: the same outer steps as all-reduce DiLoCo (the clock differs: a server)."""
  fixed, elastic = (
    _experiment("strategy.options={period: 5}"),
    _experiment("strategy.options={period: 5, membership: elastic}"),
  )
  (a, _), (b, _) = (
    (lambda s, e: s.advance(s.init(e.model.params, 0), 6))(e.simulator(), e) for e in (fixed, elastic)
  )
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-5, atol=1e-7)


def test_churn_a_deadline_leaves_a_slow_worker_out_of_every_round_without_negative_idle_time():
  exp = _experiment(
    "strategy.options={period: 5, membership: elastic, deadline: 0.01}",
    "cluster.slow_fraction=0.3",
    "cluster.slowdown=4",
  )
  sim = exp.simulator()
  state, records = sim.advance(sim.init(exp.model.params, 0), 5)
  np.testing.assert_array_equal(np.asarray(records.k), [2] * 5)
  # Worker 2 is cut at each round's close: busy the whole round, never idle below zero.
  idle = np.asarray(state.idle)
  assert idle.min() >= 0.0 and idle[2] < 1e-6, idle


@pytest.mark.parametrize(
  "overrides, message",
  [
    (("strategy.options={period: 5}",), "none for diloco with a fixed membership"),
    (
      ("strategy.options={period: 5, membership: elastic, quorum: 3}",),
      "absences that leave at least quorum=3 workers at once \\(here 2\\)",
    ),
  ],
)
def test_churn_absences_the_simulator_cannot_model_are_rejected(overrides, message):
  exp = _experiment(*overrides, "cluster.absences=[{worker: 1, start: 1.0, end: 2.0}]")
  with pytest.raises(ValueError, match=message):
    exp.simulator()


@pytest.mark.parametrize(
  "absence, message",
  [
    (
      "{worker: 3, start: 0.0, end: 1.0}",
      r"cluster.absences\[0\]=.* is invalid; expected a worker in \[0, 3\)",
    ),
    ("{worker: 0, start: 2.0, end: 1.0}", r"simulated seconds 0 <= start < end"),
    ("{worker: 0, start: 1.0}", r"end missing"),
  ],
)
def test_churn_a_bad_absence_is_refused_naming_it(absence, message):
  from jaxsync._src.app.config import ConfigError

  with pytest.raises(ConfigError, match=message):
    _experiment("strategy.options={period: 5, membership: elastic}", f"cluster.absences=[{absence}]")
