"""The time model: staleness patterns, SSP's bound, fastest-k's drops, round times from the formulas."""

from __future__ import annotations

import numpy as np
import pytest

import jaxsync

from sim_cases import simulate

LR = 0.1


def test_homogeneous_asp_staleness_is_k_minus_one_in_steady_state():
  k = 6
  time = jaxsync.sim.TimeModel(num_workers=k, jitter_shape=None)
  _, history, _ = simulate("asp", k, events=10 * k, options={"learning_rate": LR}, time=time)
  np.testing.assert_array_equal(history.staleness[k:], k - 1)
  np.testing.assert_array_equal(history.staleness[:k], np.arange(k))


def test_slow_workers_gradients_are_staler():
  k = 8
  time = jaxsync.sim.TimeModel(num_workers=k, slow_fraction=0.25, slowdown=4.0)
  _, history, _ = simulate("asp", k, events=400, options={"learning_rate": LR}, time=time)
  slow = np.isin(history.worker, time.slow_workers)
  assert time.slow_workers == (6, 7)
  assert history.staleness[slow].mean() > 3 * history.staleness[~slow].mean()
  # A slow worker computes a quarter as many gradients.
  steps = history.worker_steps
  assert steps[6] < steps[0] / 3 and steps[7] < steps[1] / 3


def test_ssp_never_exceeds_its_bound_and_the_bound_binds():
  k, bound = 6, 2
  time = jaxsync.sim.TimeModel(num_workers=k, slow_fraction=1 / 6, slowdown=5.0)
  _, history, _ = simulate(
    "ssp", k, events=300, options={"learning_rate": LR, "staleness_bound": bound}, time=time
  )
  clocks = np.zeros(k, int)
  gaps = []
  for w in history.worker:  # a worker computes only while it is within the bound
    gaps.append(clocks[w] - clocks.min())
    clocks[w] += 1
  assert max(gaps) == bound
  # Without the bound, the fast workers would run far ahead of the slow one.
  _, free, _ = simulate("asp", k, events=300, options={"learning_rate": LR}, time=time)
  assert free.worker_steps.max() - free.worker_steps.min() > 10 * bound
  assert history.worker_steps.max() - history.worker_steps.min() <= bound + 1
  assert history.worker_idle[:5].sum() > 0  # fast workers waited


def test_fastest_k_drops_the_slow_workers_gradients():
  k = 8
  time = jaxsync.sim.TimeModel(num_workers=k, slow_fraction=0.25, slowdown=4.0)
  _, history, _ = simulate("fastest_k", k, events=30, options={"learning_rate": LR, "k": 6}, time=time)
  np.testing.assert_array_equal(history.worker_used, [30] * 6 + [0, 0])
  np.testing.assert_array_equal(history.worker_steps, 30)
  assert (history.k == 6).all()
  # A round ends with the 6th finisher: about one fast compute time, not four.
  assert np.diff(history.time).max() < 2.0


@pytest.mark.parametrize(
  ("name", "options", "cost"),
  [
    ("bsp", {}, lambda tm, k: tm.parameter_server_round_time(k)),
    ("allreduce", {}, lambda tm, k: tm.ring_allreduce_time(k)),
    ("hierarchical_allreduce", {"group_size": 4}, lambda tm, k: tm.hierarchical_allreduce_time(k, 4)),
  ],
)
def test_sync_round_time_is_the_slowest_worker_plus_the_exchange_formula(name, options, cost):
  k = 8
  time = jaxsync.sim.TimeModel(
    num_workers=k,
    jitter_shape=None,
    slow_fraction=0.25,
    slowdown=3.0,
    link="1gbps",
    message_bytes=10_000_000,
    apply_time=0.01,
  )
  _, history, _ = simulate(name, k, events=5, options=options, time=time)
  expected = 3.0 + cost(time, k)
  np.testing.assert_allclose(np.diff(np.concatenate([[0.0], history.time])), expected, rtol=1e-5)
  # By hand, for the ring: 2 (P-1) (l + n/(P B)) at 1 Gbit/s.
  if name == "allreduce":
    np.testing.assert_allclose(cost(time, k), 2 * 7 * (50e-6 + 10e6 / 8 / 125e6), rtol=1e-9)


@pytest.mark.parametrize(
  ("name", "options", "collectives"),
  [
    ("allreduce", {}, 1),
    ("hierarchical_allreduce", {"group_size": 2}, 2),
    ("hierarchical_allreduce", {"group_size": 4}, 1),  # one group: the leaders' ring joins one
    ("local_sgd", {"period": 3}, 1),
    ("diloco", {"period": 3, "quantize": "int8"}, 3),  # all-to-all, all-gather, the loss's all-reduce
    ("bsp", {}, 0),
  ],
)
def test_each_collective_of_a_round_costs_the_measured_collective_overhead(name, options, collectives):
  base = jaxsync.sim.TimeModel(num_workers=4, jitter_shape=None, link="1gbps", message_bytes=1_000_000)
  slower = jaxsync.sim.TimeModel(
    num_workers=4, jitter_shape=None, link="1gbps", message_bytes=1_000_000, collective_overhead=0.004
  )
  _, plain, _ = simulate(name, 4, events=4, options=options, time=base)
  _, charged, _ = simulate(name, 4, events=4, options=options, time=slower)
  # Rounds end 4 ms later per collective that joins several workers; a parameter server's round pays none.
  np.testing.assert_allclose(np.diff(charged.time) - np.diff(plain.time), 0.004 * collectives, atol=1e-6)


def test_a_negative_collective_overhead_is_refused_with_its_value():
  with pytest.raises(ValueError, match="collective_overhead=-0.001"):
    jaxsync.sim.TimeModel(num_workers=2, collective_overhead=-0.001)


def test_parameter_server_interface_is_the_asp_bottleneck():
  k = 16
  fast_net = jaxsync.sim.TimeModel(num_workers=k, link="100gbps", message_bytes=40_000_000)
  slow_net = jaxsync.sim.TimeModel(num_workers=k, link="1gbps", message_bytes=40_000_000)
  _, fast, _ = simulate("asp", k, events=200, options={"learning_rate": LR}, time=fast_net)
  _, slow, _ = simulate("asp", k, events=200, options={"learning_rate": LR}, time=slow_net)
  # At 1 Gbit/s one 40 MB push and one reply take 0.64 s of the server's interface each:
  # throughput is bounded by the interface, not by the 16 workers.
  rate = 200 / slow.simulated_time
  assert 0.9 / 0.32 < rate <= 1 / 0.32
  assert fast.simulated_time < slow.simulated_time / 5
  assert slow.worker_idle.sum() > fast.worker_idle.sum()
  assert slow.bytes_moved == pytest.approx(400 * 40_000_000)


def test_a_slower_server_card_bounds_asp_at_its_own_bandwidth_and_leaves_all_reduce_alone():
  """Three workers' flows into one card moved 0.77x what one stream did at 100 Mbit/s (incast): with
  ``server_link`` at that rate an interface-bound ASP run updates at ``B_s / n``, not ``B / n``."""
  k, n = 16, 1_000_000
  link = jaxsync.sim.Link(latency=0.0, bandwidth=1e8)
  card = jaxsync.sim.Link(latency=0.0, bandwidth=0.77e8)
  runs = {}
  for name, server in (("link", None), ("card", card)):
    time = jaxsync.sim.TimeModel(
      num_workers=k, compute_time=1e-5, link=link, message_bytes=n, server_link=server
    )
    _, history, _ = simulate("asp", k, events=300, options={"learning_rate": LR}, time=time)
    runs[name] = (history.updates - 100) / (history.time[-1] - history.time[99])
    assert time.transfer_time() == pytest.approx(n / (link if server is None else server).bandwidth)
    # A ring all-reduce does not go through the server's card.
    assert time.ring_allreduce_time(k) == pytest.approx(2 * (k - 1) * n / (k * link.bandwidth))
  assert runs["link"] == pytest.approx(1e8 / n, rel=0.01)
  assert runs["card"] == pytest.approx(0.77e8 / n, rel=0.01)
  # A synchronous round through a server pays its card for every push and reply.
  model = jaxsync.sim.TimeModel(num_workers=4, link=link, message_bytes=n, server_link=card)
  assert model.parameter_server_round_time(4) == pytest.approx(8 * n / card.bandwidth)
  # Unset, the card follows the link, also in a copy with another link.
  import dataclasses

  plain = dataclasses.replace(jaxsync.sim.TimeModel(num_workers=4, message_bytes=n), link=link)
  assert plain.server_link is None and plain.transfer_time() == pytest.approx(n / link.bandwidth)
  with pytest.raises(ValueError, match="5gbps"):
    jaxsync.sim.TimeModel(num_workers=4, server_link="5gbps")


FREE_NET = jaxsync.sim.Link(latency=0.0, bandwidth=1e15)  # the network costs nothing: only the server does


def test_a_server_bound_asp_run_updates_at_bandwidth_over_bytes_per_update():
  """ASP's update reads the gradient and the parameters and writes the parameters: 3 x 1 MB at 1 GB/s is
  3 ms per update, so 16 fast workers get 333 updates per simulated second, whatever their speed."""
  k, n, bandwidth = 16, 1_000_000, 1e9
  time = jaxsync.sim.TimeModel(
    num_workers=k, compute_time=1e-5, link=FREE_NET, message_bytes=n, server_bandwidth=bandwidth
  )
  _, history, _ = simulate("asp", k, events=300, options={"learning_rate": LR}, time=time)
  per_update = jaxsync.strategies.make("asp", k).server_traffic.release * n / bandwidth
  assert per_update == pytest.approx(3e-3)
  rate = (history.updates - 100) / (history.time[-1] - history.time[99])  # past the start-up
  assert rate == pytest.approx(1 / per_update, rel=0.01)
  # A server-side Adam moves 7 arrays per update: the same workers get 3/7 of the updates.
  _, adam, _ = simulate(
    "asp", k, events=300, options={"learning_rate": LR, "server_optimizer": "adam"}, time=time
  )
  assert (adam.updates - 100) / (adam.time[-1] - adam.time[99]) == pytest.approx(rate * 3 / 7, rel=0.01)


def test_adaptive_k_pays_the_accumulation_per_gradient_and_a_share_of_each_update():
  k, n, bandwidth = 8, 1_000_000, 1e9
  time = jaxsync.sim.TimeModel(
    num_workers=k, compute_time=1e-5, link=FREE_NET, message_bytes=n, server_bandwidth=bandwidth
  )
  _, history, _ = simulate("adaptive_k", k, events=400, time=time)
  traffic = jaxsync.strategies.make("adaptive_k", k).server_traffic
  arrivals, releases = 300, int(history.released[100:].sum())  # past the start-up
  busy = (arrivals * traffic.arrival + releases * traffic.release) * n / bandwidth
  assert history.time[-1] - history.time[99] == pytest.approx(busy, rel=0.02)
  # Per gradient: the accumulation plus a share 1/k of one update, k the gradients a release combined.
  mean_k = arrivals / releases
  per_gradient = (traffic.arrival + traffic.release / mean_k) * n / bandwidth
  assert busy / arrivals == pytest.approx(per_gradient)


def test_without_a_server_bandwidth_memory_costs_nothing_and_presets_name_one():
  assert jaxsync.sim.TimeModel(num_workers=2, message_bytes=10).memory_time(5) == 0.0
  tm = jaxsync.sim.TimeModel(num_workers=2, message_bytes=10**9, server_bandwidth="10GB/s")
  assert tm.server_bandwidth == 10e9 and tm.memory_time(3) == pytest.approx(0.3)
  with pytest.raises(ValueError, match="server_bandwidth='fast'.*10GB/s"):
    jaxsync.sim.TimeModel(num_workers=2, server_bandwidth="fast")
  with pytest.raises(ValueError, match="server_bandwidth=-1"):
    jaxsync.sim.TimeModel(num_workers=2, server_bandwidth=-1.0)


def _run_with_eval_time(strategy: str, eval_time: float, *overrides: str):
  import helpers

  exp = helpers.quickstart_experiment(
    "model.name=mlp",
    f"strategy.name={strategy}",
    "strategy.options={learning_rate: 0.02}",
    "cluster.jitter_shape=null",
    "cluster.slow_fraction=0",
    "run.gradients=60",
    "run.eval_every=5",
    f"cluster.eval_time={eval_time}",
    *overrides,
  )
  sim = exp.simulator()
  _, records = sim.advance(sim.init(exp.model.params, 0), exp.num_events)
  return records


@pytest.mark.parametrize(
  ("strategy", "workers", "pause"),
  [
    # A synchronous round that evaluates ends eval_time later on every worker.
    ("bsp", 4, 0.25),
    # A parameter server evaluates before replying: with one worker, each arrival waits for its reply.
    ("asp", 1, 0.5),
  ],
)
def test_each_evaluation_delays_everything_after_it_by_eval_time(strategy, workers, pause):
  plain = _run_with_eval_time(strategy, 0.0, f"cluster.num_workers={workers}")
  paying = _run_with_eval_time(strategy, pause, f"cluster.num_workers={workers}")
  np.testing.assert_array_equal(plain.evaluated, paying.evaluated)
  evaluations_before = np.cumsum(paying.evaluated) - paying.evaluated
  np.testing.assert_allclose(paying.time, plain.time + pause * evaluations_before, rtol=1e-5)
  # No cost (the default): the same clock to the bit.
  again = _run_with_eval_time(strategy, 0.0, f"cluster.num_workers={workers}")
  np.testing.assert_array_equal(plain.time, again.time)


def test_eval_time_must_not_be_negative():
  with pytest.raises(ValueError, match="eval_time=-1"):
    jaxsync.sim.TimeModel(num_workers=2, eval_time=-1.0)
