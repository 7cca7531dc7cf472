"""Train once, time per link: a run whose updates cannot depend on the clock, re-timed on another cluster's
clock, equals a full simulation on that clock, bit for bit."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import jaxsync
from tests import sim_cases

K = 4
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _sim(name, link, *, options=None, eval_time=0.01, **time_kw):
  loss, params, data = sim_cases.problem(K)
  strategy = jaxsync.strategies.make(name, K, **(options or {"learning_rate": 0.3}))
  speeds = {"jitter_shape": 4.0, "slow_fraction": 0.25, "slowdown": 3.0}
  time_model = jaxsync.sim.TimeModel(num_workers=K, link=link, eval_time=eval_time, **{**speeds, **time_kw})
  sim = jaxsync.sim.Simulator(
    strategy, loss, data, time_model, eval_fn=sim_cases.accuracy_fn(data), eval_every=3
  )
  return sim, params, time_model


CASES = {
  "bsp": None,
  "allreduce": {"learning_rate": 0.3, "momentum": 0.9},
  "hierarchical_allreduce": {"learning_rate": 0.3, "group_size": 2},
  "fastest_k": {"learning_rate": 0.3, "k": 3},
  "local_sgd": {"learning_rate": 0.3, "period": 4},
  "diloco": {"learning_rate": 0.01, "period": 5},
  "streaming_diloco": {"learning_rate": 0.01, "period": 6},
}


def _compare(name, **speeds):
  """A run on a slow link re-timed on a fast one (whose workers run at ``speeds``, where given), and a full
  simulation on the fast one."""
  options = CASES[name]
  # A collective's overhead of 0.5 s (the slow link's) is more than Streaming DiLoCo's overlapped step hides.
  slow, params, slow_clock = _sim(name, "100mbps", options=options, collective_overhead=0.5)
  fast, _, _ = _sim(name, "10gbps", options=options, **speeds)
  assert slow.clock_dependence() is None
  _, trained = slow.run(params, 40, seed=3)
  _, simulated = fast.run(params, 40, seed=3)
  retimed = fast.retime(trained, params, seed=3, trained_on=slow_clock)
  # The test can fail: the clocks differ, and the updates are the same.
  assert retimed.time[-1] < trained.time[-1]
  np.testing.assert_array_equal(trained.loss, simulated.loss)
  for field in ("time", "eval_time", "worker_idle", "eval_event", "version", "loss", "worker_steps"):
    np.testing.assert_array_equal(getattr(retimed, field), getattr(simulated, field), err_msg=field)
  for metric, values in simulated.eval_metrics.items():
    np.testing.assert_array_equal(retimed.eval_metrics[metric], values, err_msg=metric)
  assert retimed.bytes_moved == simulated.bytes_moved


# At the suite's XLA optimization level 0 (tests/conftest.py), fastest-k's k-th compute draw, Streaming
# DiLoCo's idle seconds and local SGD's and DiLoCo's round times can differ in their last bit between the
# training program and the replay (and DiLoCo's losses between programs whose workers' speeds differ): level 0
# fuses the clock's sums differently in the two programs; at XLA's default level (what a user runs) every case
# is equal bit for bit, which the next tests check for those in a process of their own.
AT_DEFAULT_LEVEL = ("fastest_k", "streaming_diloco", "local_sgd", "diloco")


@pytest.mark.parametrize("name", sorted(set(CASES) - set(AT_DEFAULT_LEVEL)))
def test_a_run_re_timed_on_another_link_equals_a_full_simulation_there_bit_for_bit(name):
  _compare(name)


# Workers all as fast (none slow, no jitter) on the fast link: the rounds' updates do not look at the speeds.
EQUAL_SPEEDS = {"slow_fraction": 0.0, "jitter_shape": None}


@pytest.mark.parametrize("name", ["allreduce", "bsp", "local_sgd"])
def test_a_run_re_timed_at_other_worker_speeds_equals_a_full_simulation_there_bit_for_bit(name):
  _compare(name, **EQUAL_SPEEDS)


def test_bit_for_bit_at_xlas_default_optimization_level():
  code = (
    "from tests.sim.test_retime import _compare, EQUAL_SPEEDS\nfor name in ('fastest_k', 'bsp', 'diloco', 'local_sgd'):"
    " _compare(name)\nfor name in ('diloco', 'streaming_diloco'): _compare(name, **EQUAL_SPEEDS)"
  )
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]


def test_a_run_whose_updates_follow_the_clock_is_refused():
  asp, params, clock = _sim("asp", "100mbps")
  assert asp.clock_dependence() == "asynchronous arrivals (their order is the clock's)"
  _, history = asp.run(params, 10)
  with pytest.raises(
    ValueError, match=r"retime: asp's updates can depend on the clock \(asynchronous arrivals"
  ):
    asp.retime(history, params, trained_on=clock)
  loss, params, data = sim_cases.problem(K)
  by_time = jaxsync.sim.Simulator(
    jaxsync.strategies.make("bsp", K, learning_rate=0.3),
    loss,
    data,
    clock,
    eval_fn=sim_cases.accuracy_fn(data),
    eval_every_time=0.5,
  )
  assert "evaluations every so many simulated seconds" in by_time.clock_dependence()
  # Fastest-k keeps each round's fastest gradients: other compute times are another run.
  fastest, params, clock = _sim("fastest_k", "100mbps", options=CASES["fastest_k"])
  _, history = fastest.run(params, 6)
  other = dataclasses.replace(clock, slowdown=5.0)
  with pytest.raises(ValueError, match="fastest-k with other compute times"):
    fastest.retime(history, params, trained_on=other)
  assert fastest.clock_dependence() is None  # on another link at the same speeds it re-times
  assert "fastest-k with other compute times" in fastest.clock_dependence(compute_times=True)


def test_a_benchmark_trains_a_clock_independent_run_once_and_times_it_on_every_link(tmp_path):
  """The results store keeps one training of all-reduce's updates; its run on another link is that training
  re-timed (no training), and equals a run trained there; an asynchronous strategy is trained per link."""
  import importlib

  from jaxsync._src.app import config as config_lib

  harness = importlib.import_module("benchmarks.common.harness")

  def bench(where):
    args = harness.parser("").parse_args(["--results-dir", str(where), "--runs-dir", str(where / "runs")])
    return harness.Benchmark("made_up", "Made up", args, [], seeds=1)

  def config(link, *speeds):
    sets = ["data.name=digits", "model.name=mlp", "cluster.num_workers=4", f"cluster.link={link}", *speeds]
    sets += ["run.gradients=400", "run.chunk=25", "run.eval_every=10", "run.target_accuracy=0.8"]
    return config_lib.load(ROOT / "configs" / "quickstart.yaml", sets)

  once = bench(tmp_path / "once")
  slow = once.run(config("100mbps"), "allreduce", setting="100 Mbit/s")
  fast = once.run(config("10gbps"), "allreduce", setting="10 Gbit/s")
  entries = list(harness.results_store.read_entries(once.store.path).values())
  assert [bool(e.get("retimed_from")) for e in entries] == [False, True]
  assert entries[1]["retimed_from"] == entries[0]["key"] and fast.summaries[0]["wall_seconds"] == 0.0
  assert (once.run_count, once.reused_count) == (2, 1)
  trained = bench(tmp_path / "trained").run(config("10gbps"), "allreduce", setting="10 Gbit/s")
  for key in ("simulated_time", "time_to_target", "time_to_target_held", "final_accuracy", "updates"):
    assert fast.summaries[0][key] == trained.summaries[0][key], key
  assert fast.summaries[0]["simulated_time"] < slow.summaries[0]["simulated_time"]
  np.testing.assert_array_equal(fast.histories[0].eval_time, trained.histories[0].eval_time)
  np.testing.assert_array_equal(fast.histories[0].worker_idle, trained.histories[0].worker_idle)
  # Every worker as fast: the same rounds' updates, re-timed from the same run, as trained there.
  even = ["cluster.slow_fraction=0", "cluster.jitter_shape=null"]
  level = once.run(config("10gbps", *even), "allreduce", setting="10 Gbit/s, equal workers")
  assert list(once.store.entries.values())[-1]["retimed_from"] == entries[0]["key"]
  trained = bench(tmp_path / "even").run(config("10gbps", *even), "allreduce", setting="even")
  for key in ("simulated_time", "time_to_target_held", "final_accuracy"):
    assert level.summaries[0][key] == trained.summaries[0][key], key
  assert (
    level.summaries[0]["simulated_time"] < fast.summaries[0]["simulated_time"]
  )  # no straggler to wait for
  # Asynchronous arrivals follow the clock: trained on each link.
  once.run(config("100mbps"), "asp", setting="100 Mbit/s")
  once.run(config("10gbps"), "asp", setting="10 Gbit/s")
  entries = list(harness.results_store.read_entries(once.store.path).values())
  assert [bool(e.get("retimed_from")) for e in entries[3:]] == [False, False]
