"""diloco, async_local_sgd and dc_asgd as strategies: one worker equals the plain loop, DyLU paces the workers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsync
from jaxsync._src.distributed import sync_runtime

from helpers import assert_trees_close
from sim_cases import problem, sgd_reference, simulate

H, ROUNDS, LR = 4, 3, 0.05
ONE = {"per_worker": 64}


def test_one_worker_diloco_is_the_diloco_transform_in_a_plain_loop():
  final, history, data = simulate(
    "diloco", 1, events=ROUNDS, options={"learning_rate": LR, "period": H}, problem_kw=ONE
  )
  _, params, _ = problem(1, **ONE)
  batches = [data.batch(0, t) for t in range(H * ROUNDS)]
  expected = sgd_reference(params, batches, jaxsync.diloco(optax.adamw(LR, weight_decay=0.1), period=H))
  assert_trees_close(final, expected, rtol=1e-5, atol=1e-6)
  assert list(history.version) == [1, 2, 3]


def test_one_worker_async_local_sgd_is_one_worker_diloco():
  # One worker: Delayed Nesterov with N = K = 1 is Nesterov, and every push is fresh.
  options = {"learning_rate": LR, "period": H}
  a, history, _ = simulate("async_local_sgd", 1, events=ROUNDS, options=options, problem_kw=ONE)
  d, _, _ = simulate("diloco", 1, events=ROUNDS, options=options, problem_kw=ONE)
  assert_trees_close(a, d, rtol=1e-5, atol=1e-6)
  assert (history.staleness == 0).all()


def test_one_worker_dc_asgd_is_asp():
  a, _, _ = simulate(
    "dc_asgd", 1, events=20, options={"learning_rate": 0.2, "adaptive": True}, problem_kw=ONE
  )
  b, _, _ = simulate("asp", 1, events=20, options={"learning_rate": 0.2}, problem_kw=ONE)
  assert_trees_close(a, b, rtol=1e-6, atol=1e-7)


def test_the_all_reduce_loop_runs_diloco_as_the_simulator_does():
  loss, params, data = problem(1, **ONE)
  strategy = jaxsync.strategies.make("diloco", 1, learning_rate=LR, period=H)
  runtime = sync_runtime.SyncRuntime(strategy, loss, data, devices=jax.devices()[:1])
  state, _ = runtime.advance(runtime.init(params), ROUNDS)
  simulated, _, _ = simulate(
    "diloco", 1, events=ROUNDS, options={"learning_rate": LR, "period": H}, problem_kw=ONE
  )
  assert_trees_close(state.params, simulated, rtol=1e-5, atol=1e-6)


def test_dynamic_local_updates_let_a_four_times_slower_worker_push_as_often():
  time = jaxsync.sim.TimeModel(num_workers=4, slow_fraction=0.25, slowdown=4.0, jitter_shape=None)
  options = {"learning_rate": LR, "period": 8}
  _, dylu, _ = simulate("async_local_sgd", 4, events=40, options={**options, "dylu": True}, time=time)
  _, fixed, _ = simulate("async_local_sgd", 4, events=40, options=options, time=time)
  # H_k = floor(8 * t_fast / t_k): the slow worker takes 2 local steps per push.
  assert jaxsync.strategies.dynamic_local_steps(8, time.mean_compute_times()) == (8, 8, 8, 2)
  assert list(np.bincount(dylu.worker, minlength=4)) == [10, 10, 10, 10]
  pushes = np.bincount(fixed.worker, minlength=4)
  assert pushes[3] * 3 < pushes[:3].min(), pushes
  # A push stands for its local steps: the slow worker's 10 pushes are 20 gradients.
  assert dylu.worker_steps[3] == 20 and dylu.worker_steps[0] == 80


def test_a_config_sizes_dylus_local_steps_from_its_cluster_for_the_simulator_and_real_processes():
  import helpers

  exp = helpers.quickstart_experiment(
    "strategy.name=async_local_sgd", "strategy.options={period: 4, dylu: true}", "cluster.num_workers=4"
  )
  # The quickstart cluster: a quarter of the workers 4x slower, the last one here.
  assert exp.strategy.unit_local_steps == (4, 4, 4, 1)
  assert exp.simulator().strategy.unit_local_steps == (4, 4, 4, 1)


def test_dylu_needs_one_step_time_per_worker_and_valid_options():
  strategy = jaxsync.strategies.make("async_local_sgd", 2, dylu=True, period=4)
  with pytest.raises(ValueError, match=r"step_times=\[0.1\].*2 mean step times"):
    jaxsync.strategies.with_worker_speeds(strategy, [0.1])
  assert jaxsync.strategies.with_worker_speeds(strategy, [0.1, 0.3]).unit_local_steps == (4, 1)
  with pytest.raises(ValueError, match=r"min_local_steps=9.*\[1, period=4\]"):
    jaxsync.strategies.make("async_local_sgd", 2, dylu=True, period=4, min_local_steps=9)
  with pytest.raises(ValueError, match=r"activation=0.9"):
    jaxsync.strategies.make("async_local_sgd", 2, activation=0.9)
  with pytest.raises(ValueError, match=r"variance_control=-1"):
    jaxsync.strategies.make("dc_asgd", 2, variance_control=-1.0)
  loss, params, data = problem(2)
  with pytest.raises(ValueError, match=r"gradient_batch=2.*local steps per push"):
    jaxsync.sim.Simulator(strategy, loss, data, jaxsync.sim.TimeModel(num_workers=2), gradient_batch=2)


STREAMING = {
  "learning_rate": LR,
  "period": 4,
  "fragments": 2,
  "overlap": 1,
  "mixing": 0.5,
  "quantize": "int8",
}


def test_one_worker_streaming_diloco_is_the_streaming_transform_in_a_plain_loop():
  rounds = 6  # three syncs of each fragment, two steps apart
  final, history, data = simulate("streaming_diloco", 1, events=rounds, options=STREAMING, problem_kw=ONE)
  _, params, _ = problem(1, **ONE)
  tx = jaxsync.diloco(
    optax.adamw(LR, weight_decay=0.1), period=4, fragments=2, overlap=1, mixing=0.5, quantize="int8"
  )
  expected = sgd_reference(params, [data.batch(0, t) for t in range(2 * rounds)], tx)
  # The strategy's server parameters are theta; the wrapper's are the worker's mixed model: compare the
  # worker's model in the simulator.
  sim = jaxsync.sim.Simulator(
    jaxsync.strategies.make("streaming_diloco", 1, **STREAMING),
    *_problem_sim(),
    jaxsync.sim.TimeModel(num_workers=1),
  )
  state, _ = sim.advance(sim.init(params, 0), rounds)
  worker_model = jax.tree.map(lambda a: a[0], state.worker_params)
  assert_trees_close(worker_model, expected, rtol=1e-5, atol=1e-6)
  assert_trees_close(state.params, final, rtol=0, atol=0)
  assert list(history.version) == list(range(1, rounds + 1))


def _problem_sim():
  loss, _, data = problem(1, **ONE)
  return loss, data


def test_streaming_diloco_moves_a_fragment_per_round_in_its_wire_format_on_both_runtimes():
  loss, params, data = problem(1, **ONE)
  strategy = jaxsync.strategies.make("streaming_diloco", 1, **STREAMING)
  runtime = sync_runtime.SyncRuntime(strategy, loss, data, devices=jax.devices()[:1])
  state, _ = runtime.advance(runtime.init(params), 6)
  sim = jaxsync.sim.Simulator(strategy, loss, data, jaxsync.sim.TimeModel(num_workers=1))
  simulated, _ = sim.advance(sim.init(params, 0), 6)
  assert_trees_close(state.params, simulated.params, rtol=1e-5, atol=1e-6)
  assert_trees_close(state.worker_params, simulated.worker_params, rtol=1e-5, atol=1e-6)
  # Fragment 0 is the bias (3 values), fragment 1 the weights (18): int8 with one 4-byte scale per block.
  sizes = [3 + 4, 18 + 4]
  _, four, _ = simulate("streaming_diloco", 4, events=6, options=STREAMING)
  assert four.bytes_moved == 3 * sum(sizes) * 2 * 3  # 6 rounds, 3 per fragment; a ring moves 2(K-1) messages


@pytest.mark.parametrize(
  "name, options",
  [
    ("streaming_diloco", {**STREAMING, "period": 4}),
    ("async_local_sgd", {"learning_rate": LR, "period": 3, "dylu": True}),
    ("dc_asgd", {"learning_rate": 0.1, "adaptive": True}),
  ],
)
def test_a_run_resumed_from_its_checkpoint_ends_bit_for_bit_like_the_uninterrupted_one(
  tmp_path, name, options
):
  from jaxsync._src.train.progress import Reporter
  from jaxsync._src.train.training import train

  class Interrupted(Exception):
    pass

  class StopAfter(Reporter):  # interrupts the run past event 20: its checkpoint at 20 stays the latest
    def update(self, snapshot):
      if snapshot["event"] > 20:
        raise Interrupted

  k = 4
  loss, params, data = problem(k)
  time = jaxsync.sim.TimeModel(num_workers=k, slow_fraction=0.25, slowdown=3.0)

  def run(run_dir, reporter=None):
    sim = jaxsync.sim.Simulator(jaxsync.strategies.make(name, k, **options), loss, data, time)
    run_dir.mkdir(exist_ok=True)
    kwargs = dict(log_every=10, checkpoint_every=10, tensorboard=False, make_plots=False)
    return train(sim, params, run_dir, num_events=30, reporter=reporter, **kwargs)

  whole = run(tmp_path / "whole")
  with pytest.raises(Interrupted):
    run(tmp_path / "cut", StopAfter())
  resumed = run(tmp_path / "cut")
  assert resumed.summary["events"] == whole.summary["events"] == 30
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(whole.history.time, resumed.history.time)


def test_a_streaming_round_costs_its_steps_the_ring_of_its_wire_bytes_and_the_update_of_its_float_bytes():
  time = jaxsync.sim.TimeModel(
    num_workers=4, compute_time=0.01, jitter_shape=None, link="1gbps", server_bandwidth="10GB/s"
  )
  options = {**STREAMING, "overlap": 0, "quantize": "int4"}
  _, history, _ = simulate("streaming_diloco", 4, events=1, options=options, time=time)
  _, params, _ = problem(4)
  strategy = jaxsync.strategies.make("streaming_diloco", 4, **options)
  # Round 0 synchronizes fragment 0, the bias: 3 values, 4-bit codes and one scale on the wire (6 bytes),
  # 12 bytes of float32 updated (5 arrays read and written by Nesterov's step) in memory.
  wire = jaxsync.sim.TimeModel(**{**time.__dict__, "message_bytes": 6})
  held = jaxsync.sim.TimeModel(**{**time.__dict__, "message_bytes": 12})
  expected = 2 * 0.01 + wire.ring_allreduce_time(4) + held.memory_time(strategy.server_traffic.release)
  assert history.time[0] == pytest.approx(expected, rel=1e-6)


def test_the_inner_optimizer_of_the_diloco_family_is_any_optax_optimizer_with_its_own_options():
  # AdamW's betas are the DiLoCo papers' to tune: diloco with b2 = 0.95 is optax.adamw(b2=0.95) inside.
  inner = {"b2": 0.95, "eps": 1e-6}
  options = {"learning_rate": LR, "period": H, "inner_options": inner}
  final, _, data = simulate("diloco", 1, events=ROUNDS, options=options, problem_kw=ONE)
  _, params, _ = problem(1, **ONE)
  batches = [data.batch(0, t) for t in range(H * ROUNDS)]
  expected = sgd_reference(
    params, batches, jaxsync.diloco(optax.adamw(LR, weight_decay=0.1, **inner), period=H)
  )
  assert_trees_close(final, expected, rtol=1e-5, atol=1e-6)
  default, _, _ = simulate(
    "diloco", 1, events=ROUNDS, options={"learning_rate": LR, "period": H}, problem_kw=ONE
  )
  assert not np.allclose(jax.tree.leaves(default)[0], jax.tree.leaves(final)[0])  # b2 did change the run
  lion = jaxsync.strategies.make("streaming_diloco", 4, inner_optimizer="lion", inner_options={"b1": 0.95})
  assert lion.options["inner_optimizer"] == "lion"
  with pytest.raises(ValueError, match=r"inner_options=\{'b3': 0.9\}.*arguments of optax.adamw"):
    jaxsync.strategies.make("diloco", 4, inner_options={"b3": 0.9})
  with pytest.raises(ValueError, match="optax.sgd takes no weight decay"):
    jaxsync.strategies.make("async_local_sgd", 4, inner_optimizer="sgd")
  with pytest.raises(ValueError, match="did you mean 'adamw'"):
    jaxsync.strategies.make("diloco", 4, inner_optimizer="adam_w")
  assert jaxsync.strategies.make("diloco", 4, inner_optimizer="sgd", weight_decay=0.0).num_workers == 4


def test_dc_asgd_takes_the_papers_variance_control_for_each_variant():
  # Zheng et al. (ICML 2017): lambda_0 = 0.04 for DC-ASGD-c, 2 for DC-ASGD-a.
  x = jnp.array([1.0])

  def second_update(tx):
    state = tx.init(x)
    _, state = tx.update(jnp.array([1.0]), state, x, worker=0)
    moved = x - 0.5
    update, _ = tx.update(jnp.array([2.0]), state, moved, worker=1)
    return update

  for adaptive, lam in ((False, 0.04), (True, 2.0)):
    default = second_update(jaxsync.dc_asgd(0.5, num_workers=2, adaptive=adaptive))
    explicit = second_update(jaxsync.dc_asgd(0.5, lam, num_workers=2, adaptive=adaptive))
    np.testing.assert_array_equal(default, explicit)
  assert jaxsync.strategies.describe("dc_asgd").options["variance_control"] is None


def test_renamed_arguments_warn_and_keep_working():
  with pytest.warns(FutureWarning, match="sync_every= is the old name of period="):
    old = jaxsync.diloco(optax.sgd(0.1), sync_every=3)
  new = jaxsync.diloco(optax.sgd(0.1), period=3)
  x = jnp.ones(2)
  np.testing.assert_array_equal(old.update(x, old.init(x), x)[0], new.update(x, new.init(x), x)[0])
  with pytest.warns(FutureWarning, match="delay= is the old name of momentum_period="):
    jaxsync.delayed_nesterov(0.1, delay=2)
  with pytest.raises(ValueError, match="sync_every=3 is invalid; expected unset"):
    jaxsync.diloco(optax.sgd(0.1), sync_every=3, period=3)
  with pytest.raises(ValueError, match="period=None is invalid"):
    jaxsync.diloco(optax.sgd(0.1))
