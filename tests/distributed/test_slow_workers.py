"""Emulated slow workers on real processes (``cluster.emulate_slow_workers``): a real, measured delay."""

from __future__ import annotations

import time

import jax
import pytest

from jaxsync._src.distributed import sync_runtime

import helpers


def _runtime(slowdowns):
  exp = helpers.quickstart_experiment(
    "cluster.num_workers=1", "strategy.name=bsp", "strategy.options={learning_rate: 0.05}", "run.gradients=20"
  )
  runtime = sync_runtime.SyncRuntime(
    exp.strategy, exp.loss_fn, exp.data, devices=jax.devices()[:1], slowdowns=slowdowns
  )
  return runtime, runtime.init(exp.model.params)


def test_a_slow_all_reduce_worker_sleeps_its_factor_less_one_times_its_measured_compute_before_each_round():
  runtime, state = _runtime((4.0,))
  state, _ = runtime.advance(state, 1)  # measures, compiles
  assert runtime._delay > 0
  began = time.perf_counter()
  runtime.advance(state, 5)
  assert time.perf_counter() - began >= 5 * runtime._delay


def test_a_worker_at_its_own_speed_does_not_sleep():
  runtime, state = _runtime(None)
  runtime.advance(state, 1)
  assert runtime._delay is None


def test_a_slowdown_below_one_is_refused():
  with pytest.raises(ValueError, match=r"slowdowns\[i\]=0.5"):
    _runtime((0.5,))
