"""The simulator's strategies reduce to known algorithms in the cases the issue lists."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

import jaxsync

from helpers import assert_trees_close
from sim_cases import concatenated, loss_fn, problem, sgd_reference, simulate

K = 4
LR = 0.2


def no_jitter(k=K, **kw):
  return jaxsync.sim.TimeModel(num_workers=k, jitter_shape=None, **kw)


def test_bsp_equals_sgd_momentum_on_the_concatenated_batch():
  rounds = 12
  final, history, data = simulate("bsp", K, events=rounds, options={"learning_rate": LR, "momentum": 0.9})
  _, params, _ = problem(K)
  batches = [concatenated(data, range(K), r) for r in range(rounds)]
  expected = sgd_reference(params, batches, optax.sgd(LR, momentum=0.9))
  assert_trees_close(final, expected, rtol=1e-5, atol=1e-6)
  assert history.version[-1] == rounds and (history.k == K).all()


def test_asp_with_one_worker_equals_sgd():
  steps = 20
  final, history, data = simulate(
    "asp", 1, events=steps, options={"learning_rate": LR}, problem_kw={"per_worker": 64}
  )
  _, params, _ = problem(1, per_worker=64)
  expected = sgd_reference(params, [data.batch(0, t) for t in range(steps)], optax.sgd(LR))
  assert_trees_close(final, expected, rtol=1e-5, atol=1e-6)
  assert (history.staleness == 0).all()


def test_ssp_with_zero_bound_equals_bsp_with_summed_gradients():
  rounds = 8
  ssp, history, _ = simulate(
    "ssp",
    K,
    events=rounds * K,
    options={"learning_rate": LR, "staleness_bound": 0},
    time=jaxsync.sim.TimeModel(num_workers=K),
  )
  bsp, _, _ = simulate("bsp", K, events=rounds, options={"learning_rate": K * LR, "momentum": 0.0})
  assert_trees_close(ssp, bsp, rtol=1e-5, atol=1e-6)
  # Every round's K arrivals were computed on the same version: staleness 0..K-1.
  assert history.staleness.max() == K - 1


def test_fastest_k_with_k_equal_to_num_workers_equals_bsp():
  a, _, _ = simulate("fastest_k", K, events=10, options={"learning_rate": LR, "k": K})
  b, _, _ = simulate("bsp", K, events=10, options={"learning_rate": LR})
  assert_trees_close(a, b, rtol=0, atol=0)


def test_k_async_with_k_one_equals_asp():
  a, ha, _ = simulate("k_async", K, events=40, options={"learning_rate": LR, "k": 1})
  b, hb, _ = simulate("asp", K, events=40, options={"learning_rate": LR})
  assert_trees_close(a, b, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(ha.worker, hb.worker)
  np.testing.assert_array_equal(ha.staleness, hb.staleness)


def test_allreduce_forms_equal_bsp_in_parameters_not_in_time():
  time = jaxsync.sim.TimeModel(num_workers=8, message_bytes=4_000_000)
  runs = {
    name: simulate(name, 8, events=6, options={"learning_rate": LR}, time=time)
    for name in ("bsp", "allreduce", "hierarchical_allreduce")
  }
  for name in ("allreduce", "hierarchical_allreduce"):
    assert_trees_close(runs[name][0], runs["bsp"][0], rtol=0, atol=0)
  times = {name: run[1].simulated_time for name, run in runs.items()}
  assert len(set(times.values())) == 3, times
  assert times["allreduce"] < times["bsp"]  # a ring beats one server's interface


def test_easgd_one_worker_zero_elastic_force_equals_sgd():
  steps = 15
  final_centre, history, data = simulate(
    "easgd",
    1,
    events=steps,
    options={"learning_rate": LR, "moving_rate": 0.0, "period": 1},
    problem_kw={"per_worker": 64},
  )
  _, params, _ = problem(1, per_worker=64)
  # The centre never moves with alpha = 0; the worker's own model is plain SGD.
  assert_trees_close(final_centre, params, rtol=0, atol=0)
  sim = jaxsync.sim.Simulator(
    jaxsync.strategies.make("easgd", 1, learning_rate=LR, moving_rate=0.0, period=1),
    loss_fn,
    data,
    jaxsync.sim.TimeModel(num_workers=1),
  )
  state, _ = sim.advance(sim.init(params), steps)
  worker = jax.tree.map(lambda x: x[0], state.workers.params)
  expected = sgd_reference(params, [data.batch(0, t) for t in range(steps)], optax.sgd(LR))
  assert_trees_close(worker, expected, rtol=1e-5, atol=1e-6)


def test_inhad_one_node_threshold_k_lockstep_equals_bsp():
  rounds = 10
  options = {
    "learning_rate": LR,
    "momentum": 0.9,
    "local_workers": K,
    "pull_threshold": K,
    "wait_for_pull": True,
  }
  inhad, history, _ = simulate("inhad", K, events=rounds * K, options=options, time=no_jitter())
  bsp, _, _ = simulate("bsp", K, events=rounds, options={"learning_rate": LR, "momentum": 0.9})
  assert_trees_close(inhad, bsp, rtol=1e-5, atol=1e-6)
  assert history.version[-1] == rounds and (history.k[history.released] == K).all()


@pytest.mark.parametrize("name", ["ormo", "ormo_da"])
def test_ormo_reproduces_the_transform_on_the_same_arrival_trace(name):
  events = 60
  time = jaxsync.sim.TimeModel(num_workers=K, slow_fraction=0.25, slowdown=3.0)
  final, history, data = simulate(name, K, events=events, options={"learning_rate": LR}, time=time)
  _, params, _ = problem(K)
  tx = jaxsync.ordered_momentum(LR, 0.9, num_workers=K, delay_adaptive=name == "ormo_da")
  update = jax.jit(lambda g, s, p, v: tx.update(g, s, p, version=v))
  grad = jax.jit(jax.grad(loss_fn))
  # Replay the recorded arrival order with a plain Python parameter server.
  state = tx.init(params)
  pulled = {k: (params, 0) for k in range(K)}
  steps = dict.fromkeys(range(K), 0)
  for e in range(events):
    k = int(history.worker[e])
    worker_params, version = pulled[k]
    assert history.staleness[e] == int(state.count) - version
    updates, state = update(grad(worker_params, data.batch(k, steps[k])), state, params, version)
    params = optax.apply_updates(params, updates)
    steps[k] += 1
    pulled[k] = (params, int(state.count))
  assert_trees_close(final, params, rtol=1e-5, atol=1e-6)
  assert history.staleness.max() > 2 * K  # the slow worker's arrivals are really stale
