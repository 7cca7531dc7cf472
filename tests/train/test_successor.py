"""Process 0's successor: a process that does not write the run directory writes it when process 0 is lost.

A synchronous run's processes hold the same state, so when process 0 (the one
that writes checkpoints and metrics) dies mid-chunk, process 1 writes the rows
and the checkpoint of every completed round (``FaultAfterProgress.writes_run``).
Here the runtime is the simulator, wrapped to fail the way the multi-process
runtime does.
"""

from __future__ import annotations

import json

import jax
import pytest

import jaxsync
from jaxsync._src.interface.runtime import FaultAfterProgress
from jaxsync._src.train.checkpoints import RunCheckpoints
from jaxsync._src.train.training import train

from helpers import assert_trees_close
from sim_cases import problem

K = 4


class _Lost(RuntimeError, FaultAfterProgress):
  pass


class _LosesProcess0:
  """The simulator, but its ``fail_at``-th advance completes half its events and raises as a lost peer."""

  def __init__(self, sim, fail_at: int, writes_run: bool):
    self.sim, self.fail_at, self.writes_run, self.calls = sim, fail_at, writes_run, 0

  def __getattr__(self, name):
    return getattr(self.sim, name)

  def advance(self, state, num_events, *, max_time=None):
    self.calls += 1
    if self.calls != self.fail_at:
      return self.sim.advance(state, num_events, max_time=max_time)
    state, records = self.sim.advance(state, num_events // 2, max_time=max_time)
    lost = _Lost("process 0 is lost")
    lost.completed, lost.writes_run = (state, records), self.writes_run
    raise lost


def _sim():
  loss, params, data = problem(K)
  sim = jaxsync.sim.Simulator(
    jaxsync.strategies.make("bsp", K, learning_rate=0.05),
    loss,
    data,
    jaxsync.sim.TimeModel(num_workers=K),
    eval_fn=lambda p: {"loss": loss(p, data.arrays)},
    eval_every=50,
  )
  return sim, params


def _train(runtime, params, run_dir, *, primary):
  return train(
    runtime, params, run_dir, num_events=200, log_every=50, target=("loss", 1e-3), tensorboard=False,
    make_plots=False, primary=primary,
  )  # fmt: skip


@pytest.mark.parametrize("writes_run", [True, False])
def test_process_0s_successor_writes_the_rows_and_checkpoint_of_every_completed_round(tmp_path, writes_run):
  sim, params = _sim()
  with pytest.raises(_Lost):
    _train(_LosesProcess0(sim, fail_at=3, writes_run=writes_run), params, tmp_path, primary=False)
  if not writes_run:  # another survivor: it writes nothing (process 1 does)
    assert (
      not (tmp_path / "metrics.jsonl").exists()
      and RunCheckpoints(tmp_path / "checkpoints").latest_step() is None
    )
    return
  # Two chunks of 50, then 25 rounds of the third completed before the loss: all 125 are saved.
  assert RunCheckpoints(tmp_path / "checkpoints").latest_step() == 125
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["event"] for r in rows if r["kind"] == "train"] == [125]  # process 0 had written the others
  # The restarted run continues from those 125 rounds to the parameters of an uninterrupted run.
  resumed = _train(sim, params, tmp_path, primary=True)
  whole = _train(_sim()[0], params, tmp_path / "whole", primary=True)
  assert resumed.summary["updates"] == whole.summary["updates"] == 200
  assert_trees_close(jax.device_get(resumed.params), jax.device_get(whole.params))
