"""A checkpoint leaves out the gradients computed ahead: a resumed run computes them again."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxsync
from jaxsync._src.train.progress import Reporter
from jaxsync._src.train.training import train

from helpers import assert_trees_close
from sim_cases import accuracy_fn, problem

K = 8


class _Interrupted(Exception):
  pass


class _StopAfter(Reporter):
  """Interrupts the run when a chunk past ``events`` reports (the checkpoint before it stays the latest)."""

  def __init__(self, events: int):
    self.events = events

  def update(self, snapshot):
    if snapshot["event"] > self.events:
      raise _Interrupted


def _train(run_dir, gradient_batch, reporter=None, num_events=120):
  loss, params, data = problem(K)
  sim = jaxsync.sim.Simulator(
    jaxsync.strategies.make("ormo", K, learning_rate=0.05),
    loss,
    data,
    jaxsync.sim.TimeModel(num_workers=K, slow_fraction=0.25, slowdown=3.0),
    eval_fn=accuracy_fn(data),
    eval_every=40,
    gradient_batch=gradient_batch,
  )
  run_dir.mkdir(exist_ok=True)
  kwargs = dict(num_events=num_events, log_every=40, checkpoint_every=40, tensorboard=False, make_plots=False)
  return train(sim, params, run_dir, reporter=reporter, **kwargs)


def _interrupted(run_dir, gradient_batch):
  with pytest.raises(_Interrupted):
    _train(run_dir, gradient_batch, _StopAfter(80))


@pytest.mark.heavy
def test_a_resumed_batched_run_equals_the_uninterrupted_one_and_resumes_at_another_batch(tmp_path):
  whole = _train(tmp_path / "whole", 4)
  _interrupted(tmp_path / "cut", 4)
  resumed = _train(tmp_path / "cut", 4)
  assert resumed.summary["updates"] == whole.summary["updates"]
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(whole.history.time, resumed.history.time)
  # Saved with B = 4, resumed one gradient at a time (a CPU's default): the same run but for rounding.
  _interrupted(tmp_path / "moved", 4)
  moved = _train(tmp_path / "moved", 1)
  np.testing.assert_array_equal(whole.history.worker, moved.history.worker)
  assert_trees_close(moved.params, whole.params, atol=2e-6)


def test_a_checkpoint_at_or_past_a_smaller_budget_ends_the_run_without_advancing(tmp_path):
  # E.g. a run saved when EA-wild's group steps counted one gradient each, resumed where a budget counts G.
  _interrupted(tmp_path / "cut", 1)  # its latest checkpoint: event 80 of 120
  resumed = _train(tmp_path / "cut", 1, num_events=60)
  assert resumed.summary["events"] == 80 and resumed.summary["stopped_by"] == "events"
