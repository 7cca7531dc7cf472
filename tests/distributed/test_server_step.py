"""The parameter server's pure step, without a socket: it decides what the simulator decides."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import jaxsync
from jaxsync._src.distributed.server import server_step
from jaxsync._src.steps import arrival
from jaxsync._src.steps.records import EvalSchedule

from sim_cases import loss_fn, problem


def _server(strategy, params):
  schedule = EvalSchedule.make(None, None, None)
  _, unravel = ravel_pytree(params)
  step = jax.jit(functools.partial(server_step.arrive, strategy, schedule, (), unravel))
  return server_step.init(strategy, params, schedule), step, unravel


@pytest.mark.parametrize("name", ["asp", "ormo", "smega2"])
def test_one_worker_driven_through_the_pure_step_equals_the_simulator(name):
  loss, params, data = problem(1)
  strategy = jaxsync.strategies.make(name, 1, learning_rate=0.1)
  state, step, unravel = _server(strategy, params)
  message = jax.jit(
    lambda flat, t: arrival.worker_message(strategy, loss_fn, unravel(flat), None, data.batch(0, t), 0.0)
  )

  def sent(state, reply):  # what the worker receives: the raveled parameters unless the step made a reply
    return ravel_pytree(state.params)[0] if reply is None else reply

  reply = sent(state, server_step.reply_payload(state))
  for t in range(30):
    pushed = message(reply, t)
    out = step(
      state,
      jnp.int32(0),
      ravel_pytree(pushed.message)[0],
      pushed.finite,
      pushed.loss,
      pushed.step_size,
      jnp.float32(t),
    )
    assert bool(out.send[0]) and int(out.record.version) == t + 1
    # Only SMEGA²'s look-ahead reply is an array of the step's own; the others are the parameters.
    assert (out.reply is None) == (name != "smega2")
    state, reply = out.state, sent(out.state, out.reply)
  simulated, _ = jaxsync.sim.run(
    strategy, loss, params, data, jaxsync.sim.TimeModel(num_workers=1), num_events=30
  )
  for a, b in zip(jax.tree.leaves(simulated), jax.tree.leaves(state.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
  assert int(state.version) == 30 and int(state.steps[0]) == 30


def test_a_nonfinite_message_is_rejected_even_when_the_sender_calls_it_finite():
  _, params, _ = problem(2)
  strategy = jaxsync.strategies.make("asp", 2)
  state, step, _ = _server(strategy, params)
  flat = ravel_pytree(params)[0].at[0].set(jnp.nan)
  out = step(
    state, jnp.int32(1), flat, jnp.bool_(True), jnp.float32(1.0), jnp.float32(jnp.nan), jnp.float32(0)
  )
  assert bool(out.record.rejected) and int(out.state.version) == 0
  np.testing.assert_array_equal(np.asarray(out.state.params["w"]), np.asarray(params["w"]))
  assert int(out.state.used[1]) == 0 and int(out.state.steps[1]) == 1


def test_waiting_workers_are_released_when_only_lost_ones_could_release_them():
  """k_async with k = K = 2: worker 0 waits for worker 1, which is lost; the server sends worker 0 the
  current parameters instead of waiting forever."""
  _, params, _ = problem(2)
  strategy = jaxsync.strategies.make("k_async", 2, k=2)
  state, step, _ = _server(strategy, params)
  grad = ravel_pytree(jax.tree.map(jnp.ones_like, params))[0]
  out = step(
    state, jnp.int32(0), grad, jnp.bool_(True), jnp.float32(1.0), jnp.float32(jnp.nan), jnp.float32(2.0)
  )
  assert not bool(out.send.any()) and bool(out.state.waiting[0])
  assert not bool(server_step.stuck_on_lost_workers(out.state))  # worker 1 may still arrive
  lost = server_step.drop(out.state, jnp.asarray([False, True]))
  assert bool(server_step.stuck_on_lost_workers(lost))
  released, send = server_step.release_waiting(lost, jnp.float32(5.0))
  np.testing.assert_array_equal(np.asarray(send), [True, False])
  assert not bool(released.waiting.any())
  assert int(released.pulled_version[0]) == int(released.version) == 0  # nothing was applied
  assert float(released.idle[0]) == pytest.approx(3.0)  # waited from 2 s to 5 s
  rejoined = server_step.join(released, 1)
  assert bool(rejoined.live[1]) and int(rejoined.pulled_version[1]) == int(rejoined.version)


@pytest.mark.parametrize("fresh_staleness, waits", [(0, False), (1, True), (None, True)])
def test_adaptive_k_dispatch_follows_the_rules_reading_of_fresh(fresh_staleness, waits):
  """Identical gradients release at k = 2. Workers 0 and 1 release step 0; worker 2, still on step 0,
  arrives at step 1: stale by default (answered at once, merged into the next release), fresh with one
  step of slack or with every arrival fresh (it waits for the release and counts toward its k)."""
  _, params, _ = problem(3)
  strategy = jaxsync.strategies.make("adaptive_k", 3, fresh_staleness=fresh_staleness)
  state, step, _ = _server(strategy, params)
  grad = ravel_pytree(jax.tree.map(jnp.ones_like, params))[0]

  def push(state, worker, t):
    nan = jnp.float32(jnp.nan)
    return step(state, jnp.int32(worker), grad, jnp.bool_(True), jnp.float32(1.0), nan, jnp.float32(t))

  first = push(state, 0, 1.0)
  assert not bool(first.send.any()) and bool(first.state.waiting[0])
  second = push(first.state, 1, 2.0)
  np.testing.assert_array_equal(np.asarray(second.send), [True, True, False])
  assert int(second.state.version) == 1 and int(second.state.pulled_version[2]) == 0
  third = push(second.state, 2, 3.0)
  assert bool(third.send[2]) != waits and bool(third.state.waiting[2]) == waits
  assert int(third.state.rule_state[0].fresh_count) == int(waits)


def test_churn_a_worker_dropped_after_it_delivered_waits_for_the_next_round_if_it_comes_back():
  """Elastic DiLoCo: worker 1 delivers to the open round, is declared lost, and its replacement says HELLO
  before the round closes: its pseudo-gradient is in the round's sum, so the replacement waits (it would
  count twice), and the round closes with the live workers' deliveries, 1's included, once."""
  _, params, _ = problem(3)
  strategy = jaxsync.strategies.make("diloco", 3, period=2, membership="elastic")
  schedule = EvalSchedule.make(None, None, None)
  flat, unravel = ravel_pytree(params)
  state = server_step.init(strategy, params, schedule)
  arrive = jax.jit(functools.partial(server_step.round_arrive, strategy, schedule, (), unravel))
  ones = jnp.ones_like(flat)

  def push(state, worker):
    return arrive(state, jnp.int32(worker), ones, jnp.bool_(True), jnp.float32(1.0), jnp.float32(0.0))

  state = push(state, 1).state
  state = server_step.drop(state, jnp.arange(3) == 1)
  assert server_step.joins_next_round(strategy, np.asarray(state.live), np.asarray(state.waiting), 1)
  state = server_step.join(state, 1, wait=True, now=5.0)
  assert bool(state.live[1]) and bool(state.waiting[1])
  state = push(state, 0).state
  closed = push(state, 2)
  assert int(closed.record.k) == 3 and bool(closed.send.all())  # 3 pseudo-gradients, each once; all told
  # A worker that had not delivered, back while the round already has its quorum: the next round too.
  state = server_step.drop(closed.state, jnp.arange(3) == 2)
  state = push(state, 0).state
  assert server_step.joins_next_round(strategy, np.asarray(state.live), np.asarray(state.waiting), 2)
  assert not server_step.joins_next_round(strategy, np.asarray(state.live), np.asarray(state.waiting), 1)
