"""Whole runs: determinism, chunking, recorded history, every strategy learning, bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsync

from helpers import assert_trees_close
from sim_cases import accuracy_fn, loss_fn, problem, simulate

K = 8


def _trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize(
  "name, gradient_batch", [("adaptive_k", 1), ("ormo", 1), ("ea_wild", 1), ("adaptive_k", K)]
)
def test_same_seed_is_bitwise_identical_and_chunks_equal_one_call(name, gradient_batch):
  time = jaxsync.sim.TimeModel(num_workers=K, slow_fraction=0.25, slowdown=3.0)
  loss, params, data = problem(K)
  sim = jaxsync.sim.Simulator(
    jaxsync.strategies.make(name, K),
    loss,
    data,
    time,
    eval_fn=accuracy_fn(data),
    eval_every=10,
    gradient_batch=gradient_batch,
  )
  a, ha = sim.run(params, 120, seed=3)
  b, hb = sim.run(params, 120, seed=3, chunk=50)
  _trees_equal(a, b)
  for field in ("time", "worker", "staleness", "version", "k", "loss", "eval_time"):
    np.testing.assert_array_equal(getattr(ha, field), getattr(hb, field))
  np.testing.assert_array_equal(ha.eval_metrics["accuracy"], hb.eval_metrics["accuracy"])
  c, hc = sim.run(params, 120, seed=4)
  assert not np.array_equal(ha.time, hc.time)  # the seed drives the jitter


ALL = jaxsync.strategies.names()


@pytest.mark.parametrize("name", ALL)
def test_every_strategy_learns_and_records_a_consistent_history(name):
  options = {"learning_rate": 0.05} if "learning_rate" in jaxsync.strategies.describe(name).options else {}
  if name == "eamsgd":
    options = {"learning_rate": 0.02, "momentum": 0.9}
  time = jaxsync.sim.TimeModel(num_workers=K, slow_fraction=0.25, slowdown=2.0)
  loss, params, data = problem(K)
  evaluate = accuracy_fn(data)
  final, history, _ = simulate(
    name, K, events=240, options=options, time=time, eval_fn=evaluate, eval_every_time=5.0
  )
  start, end = float(evaluate(params)["loss"]), float(evaluate(final)["loss"])
  assert end < 0.8 * start, (name, start, end)
  assert np.all(np.diff(history.time) >= 0) and np.all(np.diff(history.version) >= 0)
  assert history.eval_time[0] == 0.0 and len(history.eval_time) >= 3
  assert np.all(np.diff(history.eval_time) > 0)
  assert history.worker_steps.sum() >= 240
  assert history.bytes_moved > 0 or name == "hogwild"
  assert (history.staleness >= 0).all() and history.rejected_count == 0


def test_adaptive_k_records_k_over_time_and_bb_learning_rates():
  _, history, _ = simulate("adaptive_k", K, events=200, options={"bb_step_size": True, "learning_rate": 0.05})
  released = history.k[history.released]
  assert released.min() >= 1 and released.max() <= K and len(released) > 10
  assert np.isfinite(history.step_size).all() and (history.step_size > 0).all()
  # Per-worker learning rates drift from the initial one as BB adapts.
  assert np.abs(history.step_size[-50:] - 0.05).max() > 1e-3
  _, plain, _ = simulate("adaptive_k", K, events=50)
  assert np.isnan(plain.step_size).all()


def test_adaptive_k_readings_of_fresh_decide_how_many_updates_it_makes():
  """Fresh = computed on the current step: after a release only the k released workers hold it, so the
  server releases about once per compute time, G/K updates. One step of slack, or every arrival fresh,
  lets the tests release every ~k arrivals: more updates at the same small k."""
  updates, ks = {}, {}
  for slack in (0, 1, None):
    _, h, _ = simulate("adaptive_k", K, events=400, options={"fresh_staleness": slack, "learning_rate": 0.02})
    updates[slack], ks[slack] = h.updates, float(h.k[h.released].mean())
  assert updates[0] <= 400 // K + 1 < updates[1] < updates[None]
  assert updates[None] > 2 * updates[0] and all(2 <= k <= 4 for k in ks.values()), (updates, ks)


def test_sixty_four_workers_long_run():
  k = 64
  time = jaxsync.sim.TimeModel(num_workers=k, slow_fraction=0.25, slowdown=4.0)
  loss, params, data = problem(k, per_worker=16)
  evaluate = accuracy_fn(data)
  final, history, _ = simulate(
    "ormo",
    k,
    events=6400,
    options={"learning_rate": 0.02},
    time=time,
    problem_kw={"per_worker": 16},
    eval_fn=evaluate,
    eval_every=640,
  )
  assert history.worker_steps.sum() == 6400 and (history.worker_steps > 0).all()
  assert history.eval_metrics["accuracy"][-1] > 0.8
  assert float(evaluate(final)["loss"]) < float(evaluate(params)["loss"])


@pytest.mark.heavy
def test_nonfinite_gradients_are_rejected_counted_and_the_run_survives():
  loss, params, data = problem(K)
  x = np.array(data.arrays["x"])
  x[data.shards[3]] = np.nan  # worker 3's whole shard is corrupt
  bad = jaxsync.sim.WorkerData({"x": x, "y": data.arrays["y"]}, num_workers=K, batch_size=8)
  cases = [(name, 1) for name in ("ormo", "k_async", "adaptive_k", "bsp", "shifted_momentum")]
  rejected = {}
  for name, gradient_batch in cases + [("ormo", K), ("adaptive_k", K)]:  # and computed ahead in batches
    strategy = jaxsync.strategies.make(name, K)
    sim = jaxsync.sim.Simulator(
      strategy, loss, bad, jaxsync.sim.TimeModel(num_workers=K), gradient_batch=gradient_batch
    )
    final, history = sim.run(params, 80)
    assert all(np.isfinite(np.asarray(v)).all() for v in jax.tree.leaves(final)), name
    assert history.rejected_count > 0, name
    if strategy.engine == "async":
      assert set(history.worker[history.rejected]) == {3}, name
      assert history.worker_used[3] == 0 and history.worker_used.sum() > 0, name
    if gradient_batch > 1:  # computed ahead, the same arrivals are rejected
      assert history.rejected_count == rejected[name], name
    rejected[name] = history.rejected_count


def test_smega2_with_one_worker_is_nesterov_sgd_in_sutskever_form():
  lr, beta, steps = 0.1, 0.9, 12
  final, _, data = simulate(
    "smega2", 1, events=steps, options={"learning_rate": lr}, problem_kw={"per_worker": 64}
  )
  _, w, _ = problem(1, per_worker=64)
  grad = jax.jit(jax.grad(loss_fn))
  v = jax.tree.map(jnp.zeros_like, w)
  for t in range(steps):  # spec §5: g at w - lr beta v; v <- beta v + g; w <- w - lr v
    g = grad(jax.tree.map(lambda p, m: p - lr * beta * m, w, v), data.batch(0, t))
    v = jax.tree.map(lambda m, gi: beta * m + gi, v, g)
    w = jax.tree.map(lambda p, m: p - lr * m, w, v)
  assert_trees_close(final, w, rtol=1e-4, atol=1e-5)


def test_local_sgd_averages_every_period_and_with_period_one_equals_bsp():
  a, history, _ = simulate("local_sgd", K, events=5, options={"learning_rate": 0.2, "period": 1})
  b, _, _ = simulate("allreduce", K, events=5, options={"learning_rate": 0.2, "momentum": 0.0})
  assert_trees_close(a, b, rtol=1e-5, atol=1e-6)
  _, h4, _ = simulate("local_sgd", K, events=5, options={"period": 4})
  assert (h4.worker_steps == 20).all() and h4.version[-1] == 5


def test_ea_wild_reads_stale_centres_and_easgd_exchanges_every_period():
  _, wild, _ = simulate("ea_wild", K, events=100)
  assert wild.staleness.max() >= K - 1 and wild.version[-1] == 100
  _, locked, _ = simulate("easgd", K, events=160, options={"period": 4})
  # One exchange per 4 local steps, counted from each worker's first step.
  assert locked.version[-1] == np.sum(-(-locked.worker_steps // 4))
  assert locked.released.sum() == locked.version[-1]


def test_inhad_free_running_workers_never_wait_and_staleness_is_bounded():
  time = jaxsync.sim.TimeModel(num_workers=K, slow_fraction=0.25, slowdown=2.0)
  _, history, _ = simulate(
    "inhad", K, events=200, options={"local_workers": 4, "pull_threshold": K}, time=time
  )
  assert history.version[-1] == 200 // K
  assert history.staleness.max() <= 2  # a pull every K gradients
  assert history.bytes_moved_intra > 0
  # Per pull: 2 node sums in and 2 broadcasts out between nodes; per gradient: in and back inside a node.
  size = jaxsync.sim.message_bytes(problem(K)[1])
  assert history.bytes_moved == 25 * 4 * size
  assert history.bytes_moved_intra == 200 * 2 * size


@pytest.mark.heavy
def test_ea_wild_groups_all_reduce_inside_and_exchange_once_per_group_step():
  k, lr, steps = 4, 0.2, 6
  loss, params, data = problem(k)
  time = jaxsync.sim.TimeModel(
    num_workers=k, jitter_shape=None, slow_fraction=0.25, slowdown=2.0, message_bytes=10**6
  )
  strategy = jaxsync.strategies.make("ea_wild", k, learning_rate=lr, moving_rate=0.0, group_size=k)
  sim = jaxsync.sim.Simulator(strategy, loss, data, time)
  state, _ = sim.advance(sim.init(params), steps)
  # One group of all workers and no elastic force: the group's model is SGD on the mean gradient.
  group_model = jax.tree.map(lambda x: x[0], state.workers.params)
  bsp, _, _ = simulate("allreduce", k, events=steps, options={"learning_rate": lr, "momentum": 0.0})
  assert_trees_close(group_model, bsp, rtol=1e-5, atol=1e-6)
  _, history = sim.run(params, steps)
  # A group step lasts as long as its slowest member plus the intra-group ring all-reduce.
  step_time = 2.0 + time.ring_allreduce_time(k, over=time.intra_link)
  assert history.time[0] > step_time and (history.worker == 0).all()
  # Every member computed a gradient at each of the group's steps: K x steps gradients, per worker.
  assert history.worker_steps.tolist() == [steps] * k
  pairs = jaxsync.strategies.make("ea_wild", k, group_size=2)
  _, two = jaxsync.sim.run(pairs, loss, params, data, time, num_events=40)
  assert set(two.worker) == {0, 1} and two.version[-1] == 40
  assert two.worker_steps.sum() == 80 and two.worker_steps[0] == two.worker_steps[1]
  # A gradient budget counts the members' gradients: a group's step costs G of them.
  assert pairs.num_units == 2 and pairs.gradients_per_event == 2
  assert jaxsync.strategies.make("ea_wild", k).gradients_per_event == 1


@pytest.mark.parametrize("gradient_batch", [1, 5])
def test_a_state_advanced_by_a_fresh_simulator_continues_exactly(gradient_batch):
  loss, params, data = problem(K)
  strategy = jaxsync.strategies.make("adaptive_k", K)
  time = jaxsync.sim.TimeModel(num_workers=K)
  first = jaxsync.sim.Simulator(strategy, loss, data, time, gradient_batch=gradient_batch)
  state, _ = first.advance(first.init(params), 30)
  saved = jax.tree.map(np.asarray, state)  # what a checkpoint holds
  resumed = jaxsync.sim.Simulator(strategy, loss, data, time, gradient_batch=gradient_batch)
  state_b, _ = resumed.advance(jax.tree.map(jnp.asarray, saved), 30)
  state_a, _ = first.advance(state, 30)
  _trees_equal(state_a.params, state_b.params)
  np.testing.assert_array_equal(state_a.workers.finish, state_b.workers.finish)


def _corrupt(data, worker):
  x = np.array(data.arrays["x"])
  x[np.asarray(data.shards[worker])] = np.nan
  return jaxsync.sim.WorkerData(
    {"x": x, "y": data.arrays["y"]}, num_workers=data.num_workers, batch_size=data.batch_size
  )


def test_a_dropped_workers_nan_never_touches_fastest_k_and_a_bsp_round_with_one_is_skipped():
  loss, params, data = problem(K)
  bad = _corrupt(data, K - 1)  # the slowest worker: always dropped by fastest-k
  time = jaxsync.sim.TimeModel(num_workers=K, slow_fraction=0.125, slowdown=4.0)
  _, fastest = jaxsync.sim.run(
    jaxsync.strategies.make("fastest_k", K, k=6), loss, params, bad, time, num_events=10
  )
  assert fastest.rejected_count == 0 and fastest.version[-1] == 10 and fastest.worker_used[K - 1] == 0
  # A barrier cannot tell whose gradient poisoned the mean: the round is skipped, as a
  # synchronous job skips a non-finite step; the parameters stay finite and unchanged.
  final, bsp = jaxsync.sim.run(jaxsync.strategies.make("bsp", K), loss, params, bad, time, num_events=10)
  assert bsp.rejected_count == 10 and bsp.version[-1] == 0
  assert_trees_close(final, params, rtol=0, atol=0)


def test_a_worker_rule_that_overflows_is_rejected_at_the_server():
  # Gradients of 1e38: shifted momentum's local trace overflows to inf within a few steps.
  loss, params, data = problem(2)
  huge = lambda p, b: 1e38 * jnp.sum(p["w"]) + 0.0 * loss(p, b)  # noqa: E731
  final, history = jaxsync.sim.run(
    jaxsync.strategies.make("shifted_momentum", 2, learning_rate=1e-40),
    huge,
    params,
    data,
    jaxsync.sim.TimeModel(num_workers=2),
    num_events=10,
  )
  assert history.rejected_count > 0
  assert all(np.isfinite(np.asarray(v)).all() for v in jax.tree.leaves(final))


@pytest.mark.parametrize("name", ["easgd", "inhad", "k_async"])
def test_event_times_never_go_backwards_even_when_the_server_queues(name):
  time = jaxsync.sim.TimeModel(
    num_workers=K, link="1gbps", message_bytes=50_000_000, slow_fraction=0.25, slowdown=2.0
  )
  loss, params, data = problem(K)
  evaluate = accuracy_fn(data)
  options = {"period": 2} if name == "easgd" else {}
  _, history, _ = simulate(
    name, K, events=120, options=options, time=time, eval_fn=evaluate, eval_every_time=3.0
  )
  assert np.all(np.diff(history.time) >= 0)
  assert np.all(np.diff(history.eval_time) > 0)
  if name == "easgd":
    assert set(np.unique(history.k)) == {0, 1}  # one worker model per exchange
    np.testing.assert_array_equal(history.k, history.released)


def test_a_diverged_evaluation_keeps_its_row():
  loss, params, data = problem(K)
  evaluate = lambda p: {"loss": jnp.nan * jnp.sum(p["b"])}  # noqa: E731
  _, history, _ = simulate("asp", K, events=40, eval_fn=evaluate, eval_every=10)
  assert len(history.eval_version) == 5 and np.isnan(history.eval_metrics["loss"]).all()
  np.testing.assert_array_equal(history.eval_version, [0, 10, 20, 30, 40])


def test_hierarchical_allreduce_counts_only_the_leaders_ring_between_machines():
  time = jaxsync.sim.TimeModel(num_workers=8, message_bytes=1000)
  _, flat, _ = simulate("allreduce", 8, events=3, time=time)
  _, hier, _ = simulate("hierarchical_allreduce", 8, events=3, options={"group_size": 4}, time=time)
  assert flat.bytes_moved == 3 * 2 * 7 * 1000
  assert hier.bytes_moved == 3 * 2 * 1 * 1000 and hier.bytes_moved_intra == 3 * 2 * 3 * 2 * 1000


@pytest.mark.parametrize("name", ["asp", "bsp"])
def test_max_time_stops_at_a_simulated_time_budget(name):
  loss, params, data = problem(K)
  sim = jaxsync.sim.Simulator(
    jaxsync.strategies.make(name, K), loss, data, jaxsync.sim.TimeModel(num_workers=K)
  )
  full_params, full = sim.run(params, 400)
  cut_params, cut = sim.run(params, 400, max_time=20.0, chunk=64)
  n = len(cut.time)
  assert 0 < n < 400 and len(full.time) == 400
  # The budgeted run is the full run's prefix, and it stopped at the first event starting after 20 s.
  np.testing.assert_array_equal(cut.time, full.time[:n])
  np.testing.assert_array_equal(cut.version, full.version[:n])
  starts = full.time[n - 1] if name == "bsp" else None
  if name == "bsp":
    assert starts >= 20.0 and full.time[n - 2] < 20.0
  else:
    assert cut.time[-1] < 20.0 + 2.0 and full.time[n] >= 20.0


def test_the_state_init_returns_has_the_types_advance_returns_so_advance_compiles_once():
  """Weak-typed parameters (``jnp.full(n, 2.0)``) or rule states once made the second chunk recompile."""
  loss, params, data = problem(4)
  params = {**params, "d": jnp.full([2], 2.0)}  # weak-typed
  sim = jaxsync.sim.Simulator(
    jaxsync.strategies.make("ormo", 4, learning_rate=0.05), loss, data, jaxsync.sim.TimeModel(num_workers=4)
  )
  before = sim.init(params, 0)
  after, _ = sim.advance(before, 1)

  def types(state):
    return [(x.shape, x.dtype, x.weak_type) for x in jax.tree.leaves(state)]

  assert types(before) == types(after)


def test_a_second_init_and_advance_trace_nothing():
  """``init`` once made a new ``jax.jit`` per call: 0.2 s of tracing and compiling every run on an MLP."""
  loss, params, data = problem(4)
  sim = jaxsync.sim.Simulator(
    jaxsync.strategies.make("asp", 4, learning_rate=0.05), loss, data, jaxsync.sim.TimeModel(num_workers=4)
  )
  sim.advance(sim.init(params, 0), 3)
  traced = []

  def listener(name, duration, **kwargs):
    if name == "/jax/core/compile/jaxpr_trace_duration":
      traced.append(name)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    sim.advance(sim.init(params, 1), 3)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert traced == []


# One strategy per path of the batched computation and of who is in flight: the gradient
# protocol read from the snapshot ring, under each dispatch policy (immediate, SSP's bound,
# on release, on a fresh release, with a worker rule's state: per-worker BB); the elastic
# protocol, locked (no ring), lock-free, and with a look-ahead point (EAMSGD). Hogwild!,
# InHAD, SMEGA² and OrMo compute their gradients as ASP does; they differ after the arrival.
BATCHED_PATHS = [
  ("asp", {}),
  ("ssp", {}),
  ("k_async", {}),
  ("adaptive_k", {"bb_step_size": True}),
  ("eamsgd", {}),
  ("easgd", {}),
  ("ea_wild", {}),
]


@pytest.mark.parametrize("name, options", BATCHED_PATHS, ids=[name for name, _ in BATCHED_PATHS])
def test_gradients_computed_in_batches_ahead_give_the_one_at_a_time_run(name, options):
  """Same trace; parameters equal up to float32 rounding (a batched matrix product rounds its own way)."""
  time = jaxsync.sim.TimeModel(num_workers=K, slow_fraction=0.25, slowdown=3.0)
  loss, params, data = problem(K)
  strategy = jaxsync.strategies.make(name, K, **options)
  one_final, one = jaxsync.sim.Simulator(strategy, loss, data, time, gradient_batch=1).run(
    params, 120, seed=3
  )
  final, history = jaxsync.sim.Simulator(strategy, loss, data, time, gradient_batch=3).run(
    params, 120, seed=3
  )
  for field in ("worker", "staleness", "version", "released", "k", "rejected"):
    np.testing.assert_array_equal(getattr(history, field), getattr(one, field), err_msg=field)
  # The clock's sums are compiled into two different programs, and XLA may round one of them its own
  # way (seen: one event of ssp's 120 an ulp apart with XLA:CPU's classic emitter); the order of the
  # events, checked above, is the same.
  np.testing.assert_allclose(history.time, one.time, rtol=2e-7, atol=0)
  np.testing.assert_allclose(history.loss, one.loss, rtol=1e-5, atol=1e-6)
  assert_trees_close(final, one_final, atol=2e-6)


def test_where_in_a_batch_a_gradient_is_computed_changes_no_bit():
  time = jaxsync.sim.TimeModel(num_workers=K, slow_fraction=0.25, slowdown=3.0)
  loss, params, data = problem(K)
  strategy = jaxsync.strategies.make("ormo", K)
  a, ha = jaxsync.sim.Simulator(strategy, loss, data, time, gradient_batch=3).run(params, 120, seed=3)
  b, hb = jaxsync.sim.Simulator(strategy, loss, data, time, gradient_batch=K).run(params, 120, seed=3)
  _trees_equal(a, b)
  np.testing.assert_array_equal(ha.loss, hb.loss)


@pytest.mark.heavy
def test_a_batched_state_holds_the_pulled_snapshots_and_b_gradients():
  loss, params, data = problem(K)
  strategy = jaxsync.strategies.make("asp", K)
  for batch in (1, 3):
    sim = jaxsync.sim.Simulator(
      strategy, loss, data, jaxsync.sim.TimeModel(num_workers=K), gradient_batch=batch
    )
    state, _ = sim.advance(sim.init(params), 20)
    # Parameter-sized arrays: the server's, the K + 1 pulled snapshots, B cached gradients.
    copies = sum(
      x.size // params["w"].size for x in jax.tree.leaves(state) if x.shape[-2:] == params["w"].shape
    )
    assert copies == 1 + (K + 1) + (batch if batch > 1 else 0), (batch, copies)
    assert state.cache == () if batch == 1 else state.cache.gradients.grads["w"].shape == (batch, 6, 3)


@pytest.mark.parametrize("batch, message", [(0, ">= 1"), (K + 1, "from 1 to the 8 workers"), (2.5, ">= 1")])
def test_a_gradient_batch_outside_one_to_k_is_refused(batch, message):
  loss, params, data = problem(K)
  with pytest.raises(ValueError, match=f"gradient_batch={batch!r}.*{message}"):
    jaxsync.sim.Simulator(
      jaxsync.strategies.make("asp", K),
      loss,
      data,
      jaxsync.sim.TimeModel(num_workers=K),
      gradient_batch=batch,
    )


@pytest.mark.parametrize("name", ["ormo", "bsp"])
def test_a_server_rule_with_two_versions_is_refused_before_the_first_event(name):
  """The events engine and the rounds engine both start the rule through contracts.init_server_rule."""
  import dataclasses

  import optax

  loss, params, data = problem(2)
  strategy = jaxsync.strategies.make(name, 2)
  two = optax.chain(jaxsync.adaptive_k(), jaxsync.ordered_momentum(0.05, 0.9, num_workers=2))
  strategy = dataclasses.replace(strategy, server_rule=two)
  with pytest.raises(ValueError, match="adaptive_k.*ordered_momentum|ordered_momentum.*adaptive_k"):
    jaxsync.sim.run(strategy, loss, params, data, jaxsync.sim.TimeModel(num_workers=2), num_events=4)


@pytest.mark.parametrize("name, options", [("diloco", {"period": 5}), ("bsp", {}), ("asp", {})])
def test_run_takes_a_budget_in_gradients_whatever_an_event_is(name, options):
  """A DiLoCo round is K x H gradients, a BSP round K, an ASP arrival one: the same gradient budget."""
  loss, params, data = problem(4)
  strategy = jaxsync.strategies.make(name, 4, learning_rate=0.01, **options)
  _, history = jaxsync.sim.run(
    strategy, loss, params, data, jaxsync.sim.TimeModel(num_workers=4), num_gradients=200
  )
  assert int(history.worker_steps.sum()) == 200
  with pytest.raises(ValueError, match="exactly one of them"):
    jaxsync.sim.run(strategy, loss, params, data, jaxsync.sim.TimeModel(num_workers=4), num_events=5,
                    num_gradients=200)  # fmt: skip
