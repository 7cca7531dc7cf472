"""OrMo / OrMo-DA (spec §6, §7): the spec's equivalence checks and a NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxsync

from helpers import apply, asgd_trace, assert_state_unchanged_but, jit_update, quadratic


def ceil_div(a, b):
  return -(-a // b)


def ormo_reference(arrivals, num_workers, beta, eta, w0, delay_adaptive=False, measure="iterations"):
  """Algorithm 2 of the OrMo paper, in float64 NumPy, straight from spec §6-7.

  ``arrivals`` is a list of ``(gradient, version)``; returns the parameters and
  momentum after every arrival.
  """
  k = num_workers
  w = np.array(w0, np.float64)
  u = np.zeros_like(w)
  group = 0
  history = []
  for t, (g, s) in enumerate(arrivals):
    g = np.asarray(g, np.float64)
    if ceil_div(t, k) > group:  # (a) asynchronous scheduler: C is always empty
      w = w - beta * u
      u = beta * u
      group += 1
    delta = group - ceil_div(s, k)
    assert delta >= 0
    rate = eta
    if delay_adaptive and measure == "iterations":
      tau = t - s
      rate = eta if tau <= 2 * k else eta * k / tau
    elif delay_adaptive:
      rate = eta if delta <= 1 else eta / delta
    u = u + beta**delta * rate * g
    w = w - (1 - beta ** (delta + 1)) / (1 - beta) * rate * g
    history.append((w.copy(), u.copy()))
  return history


def run_ormo(tx, arrivals, w0, waiting_flags=None):
  update = jit_update(tx)
  w = jnp.asarray(w0, jnp.float32)
  state = tx.init(w)
  history = []
  for i, (g, s) in enumerate(arrivals):
    extra = {"version": jnp.int32(s)}
    if waiting_flags is not None:
      extra["waiting_set_empty"] = jnp.bool_(waiting_flags[i])
    u, state = update(jnp.asarray(g, jnp.float32), state, w, extra)
    w = apply(w, u)
    history.append((w, state))
  return history


def test_one_worker_is_heavy_ball_sgd_momentum():
  """K = 1 with fresh gradients == SGDm (form A == optax form B for constant lr)."""
  _, grad = quadratic([1.0, 4.0, 9.0])
  tx = jaxsync.ordered_momentum(0.05, 0.9, num_workers=1)
  ref = optax.sgd(0.05, momentum=0.9)
  ormo_update, ref_update = jit_update(tx), jit_update(ref)
  w = r = jnp.array([1.0, -1.0, 0.5])
  state, ref_state = tx.init(w), ref.init(r)
  for t in range(60):
    u, state = ormo_update(grad(w), state, w, {"version": jnp.int32(t)})
    v, ref_state = ref_update(grad(r), ref_state, r, {})
    w, r = apply(w, u), apply(r, v)
    np.testing.assert_allclose(w, r, rtol=1e-5, atol=1e-6)
  assert int(state.count) == 60


def test_zero_momentum_is_asgd():
  """beta = 0: every arrival is w <- w - eta g, whatever its delay."""
  rng = np.random.default_rng(0)
  trace = asgd_trace(rng.integers(0, 4, size=40), 4)
  grads = rng.normal(size=(40, 3)).astype(np.float32)
  history = run_ormo(
    jaxsync.ordered_momentum(0.1, 0.0, num_workers=4), [(g, s) for g, (_, s) in zip(grads, trace)], np.ones(3)
  )
  expected = np.ones(3) - 0.1 * np.cumsum(grads, axis=0)
  np.testing.assert_allclose(np.stack([w for w, _ in history]), expected, rtol=1e-5, atol=1e-5)


def test_synchronous_schedule_is_ssgdm_with_summed_gradients():
  """Driven by the synchronous scheduler, OrMo equals SSGDm (summed) at every round end."""
  k, beta, eta, rounds = 4, 0.9, 0.02, 12
  _, grad = quadratic([1.0, 2.0, 3.0])
  rng = np.random.default_rng(1)
  tx = jaxsync.ordered_momentum(eta, beta, num_workers=k)
  update = jit_update(tx)
  w = ref_w = jnp.array([1.0, 1.0, 1.0])
  ref_u = jnp.zeros(3)
  state = tx.init(w)
  for r in range(rounds):
    # All K workers compute on the parameters broadcast at the round start.
    noise = rng.normal(scale=0.1, size=(k, 3)).astype(np.float32)
    grads = [grad(ref_w) + noise[i] for i in range(k)]
    for i, g in enumerate(grads):
      u, state = update(g, state, w, {"version": jnp.int32(r * k), "waiting_set_empty": jnp.bool_(i == 0)})
      w = apply(w, u)
    ref_u = beta * ref_u + eta * sum(grads)
    ref_w = ref_w - ref_u
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state.momentum_buffer, ref_u, rtol=1e-5, atol=1e-6)
    assert int(state.group) == r


def test_final_state_is_invariant_to_arrival_order():
  """A fixed set of (g, s) pairs gives the same (w, u), whatever the order."""
  k, n, fixed = 4, 13, 5
  rng = np.random.default_rng(2)
  grads = rng.normal(size=(n, 5)).astype(np.float32)
  # The first `fixed` arrivals (version 0) bring t to 5 and I to 2; after them
  # any version s <= 5 (group <= 2) is admissible at any position.
  versions = np.concatenate([np.zeros(fixed, int), rng.integers(0, fixed + 1, size=n - fixed)])
  finals = []
  for seed in range(4):
    order = np.concatenate([np.arange(fixed), np.random.default_rng(seed).permutation(np.arange(fixed, n))])
    arrivals = [(grads[i], int(versions[i])) for i in order]
    w, state = run_ormo(jaxsync.ordered_momentum(0.1, 0.9, num_workers=k), arrivals, np.zeros(5))[-1]
    assert int(state.count) == n and int(state.invalid_version_count) == 0
    finals.append((np.asarray(w), np.asarray(state.momentum_buffer)))
  for w, u in finals[1:]:
    np.testing.assert_allclose(w, finals[0][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(u, finals[0][1], rtol=1e-5, atol=1e-5)


def test_paper_example_momentum_weights():
  """K = 4, round robin: u = beta^2 (group 0) + beta (group 1) + 1 (arrived part of group 2).

  The paper's example (spec §6.4); here after the nine arrivals t = 0..8, the
  last of which carries version 5, the first of group 2.
  """
  k, beta = 4, 0.5
  # Arrival t gets a one-hot gradient e_t so each weight can be read off u.
  trace = asgd_trace([t % k for t in range(9)], k)
  arrivals = [(np.eye(9)[t], s) for t, (_, s) in enumerate(trace)]
  _, state = run_ormo(jaxsync.ordered_momentum(1.0, beta, num_workers=k), arrivals, np.zeros(9))[-1]
  assert [s for _, s in trace] == [0, 0, 0, 0, 1, 2, 3, 4, 5]
  assert int(state.group) == 2
  np.testing.assert_allclose(state.momentum_buffer, [beta**2] * 4 + [beta] * 4 + [1.0], rtol=1e-6)


def test_delay_adaptive_equals_ormo_below_threshold():
  """Round-robin K workers: every delay is K - 1 <= 2K, so OrMo-DA == OrMo."""
  k = 3
  rng = np.random.default_rng(3)
  trace = asgd_trace([t % k for t in range(30)], k)
  arrivals = [(rng.normal(size=4), s) for _, s in trace]
  assert max(t - s for t, (_, s) in enumerate(trace)) <= 2 * k
  plain = run_ormo(jaxsync.ordered_momentum(0.1, 0.9, num_workers=k), arrivals, np.ones(4))
  adaptive = run_ormo(
    jaxsync.ordered_momentum(0.1, 0.9, num_workers=k, delay_adaptive=True), arrivals, np.ones(4)
  )
  for (w1, _), (w2, _) in zip(plain, adaptive):
    np.testing.assert_allclose(w1, w2, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("measure", ["iterations", "groups"])
def test_delay_adaptive_shrinks_long_delays(measure):
  """A gradient 9 iterations (3 groups) old with K = 2 gets eta K / tau or eta / delta."""
  k = 2
  trace = asgd_trace([0] + [1] * 9, k)  # worker 0 arrives at t=0 then stays away
  late = (0, 1)  # worker 0 returns at t = 10 with version 1
  arrivals = [(np.zeros(1), s) for _, s in trace] + [(np.ones(1), late[1])]
  tx = jaxsync.ordered_momentum(1.0, 0.0, num_workers=k, delay_adaptive=True, delay_measure=measure)
  history = run_ormo(tx, arrivals, np.zeros(1))
  w, state = history[-1]
  tau, delta = 10 - 1, ceil_div(10, k) - ceil_div(1, k)
  expected_rate = k / tau if measure == "iterations" else 1.0 / delta
  np.testing.assert_allclose(w, [-expected_rate], rtol=1e-6)
  assert int(state.last_delay) == tau


def test_impossible_versions_are_rejected_and_counted():
  tx = jaxsync.ordered_momentum(0.1, 0.9, num_workers=2)
  update = jit_update(tx)
  w = jnp.ones(2)
  state = tx.init(w)
  u, state = update(jnp.ones(2), state, w, {"version": jnp.int32(0)})
  w = apply(w, u)
  for bad in (5, -1):  # from the future; negative
    u, new_state = update(jnp.ones(2), state, w, {"version": jnp.int32(bad)})
    np.testing.assert_array_equal(u, 0.0)
    assert_state_unchanged_but(state, new_state, "invalid_version_count")
    assert int(new_state.invalid_version_count) == int(state.invalid_version_count) + 1
    state = new_state
  assert int(state.invalid_version_count) == 2 and int(state.count) == 1


def test_an_omitted_version_is_a_fresh_gradient():
  """Without ``version`` the gradient was computed on the current version (staleness 0), as in a
  single-process loop: the same updates and states as passing ``version=state.count``, under jit."""
  tx = jaxsync.ordered_momentum(0.1, 0.9, num_workers=2)
  update = jit_update(tx)
  w = v = jnp.array([1.0, -2.0])
  state = explicit = tx.init(w)
  for t in range(5):
    g = jnp.array([1.0, 0.5]) * (t + 1)
    u, state = update(g, state, w, {})
    e, explicit = update(g, explicit, v, {"version": explicit.count})
    w, v = apply(w, u), apply(v, e)
    jax.tree.map(np.testing.assert_array_equal, (w, state), (v, explicit))
  assert int(state.count) == 5 and int(state.invalid_version_count) == 0 and int(state.last_delay) == 0


def test_schedule_learning_rate_follows_the_count():
  schedule = optax.linear_schedule(1.0, 0.0, transition_steps=4)
  tx = jaxsync.ordered_momentum(schedule, 0.0, num_workers=1)
  history = run_ormo(tx, [(np.ones(1), t) for t in range(4)], np.zeros(1))
  np.testing.assert_allclose([float(w[0]) for w, _ in history], [-1.0, -1.75, -2.25, -2.5])


@settings(max_examples=30, deadline=None)
@given(
  num_workers=st.integers(1, 6),
  choices=st.lists(st.integers(0, 5), min_size=1, max_size=40),
  beta=st.floats(0.0, 0.99),
  eta=st.floats(0.01, 1.0),
  delay_adaptive=st.booleans(),
  measure=st.sampled_from(["iterations", "groups"]),
  seed=st.integers(0, 2**16),
)
def test_matches_numpy_reference_on_random_asynchronous_traces(
  num_workers, choices, beta, eta, delay_adaptive, measure, seed
):
  """Random arrival orders (hence random delays) against the spec's Algorithm 2."""
  trace = asgd_trace([c % num_workers for c in choices], num_workers)
  grads = np.random.default_rng(seed).normal(size=(len(trace), 3)).astype(np.float32)
  arrivals = [(g, s) for g, (_, s) in zip(grads, trace)]
  w0 = np.array([0.5, -1.0, 2.0])
  expected = ormo_reference(arrivals, num_workers, beta, eta, w0, delay_adaptive, measure)
  tx = jaxsync.ordered_momentum(
    eta, beta, num_workers=num_workers, delay_adaptive=delay_adaptive, delay_measure=measure
  )
  got = run_ormo(tx, arrivals, w0)
  scale = 1.0 + max(float(np.abs(w).max()) for w, _ in expected)
  for (w_ref, u_ref), (w, state) in zip(expected, got):
    np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=1e-5 * scale)
    np.testing.assert_allclose(state.momentum_buffer, u_ref, rtol=1e-4, atol=1e-5 * scale)
  final = got[-1][1]
  assert int(final.group) == ceil_div(len(trace) - 1, num_workers)
  assert int(final.invalid_version_count) == 0 and int(final.count) == len(trace)  # delta >= 0 always
