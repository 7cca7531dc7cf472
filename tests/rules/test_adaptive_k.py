"""Adaptive k-synchronization and progressive momentum (spec §11a, §11b, §11d checks)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsync

from helpers import apply, assert_state_unchanged_but, jit_update, quadratic


def feed(tx, grads_and_versions, params, **extra):
  """Feeds arrivals through a jitted update; returns outputs and states after each."""
  update = jit_update(tx)
  state = tx.init(params)
  outs, states = [], []
  for g, v in grads_and_versions:
    u, state = update(jnp.asarray(g, jnp.float32), state, params, {"version": jnp.int32(v), **extra})
    outs.append(np.asarray(u))
    states.append(state)
  return outs, states


def test_tests_that_always_fail_give_bsp_with_momentum():
  """theta -> 0: no early release, k = M every round: SGD momentum on the mean gradient."""
  m, gamma, lr = 4, 0.9, 0.05
  _, grad = quadratic([1.0, 3.0, 5.0])
  rng = np.random.default_rng(0)
  tx = optax.chain(jaxsync.adaptive_k(momentum=gamma, theta=1e-6, max_k=m), optax.scale_by_learning_rate(lr))
  bsp = optax.sgd(lr, momentum=gamma)
  update, bsp_update = jit_update(tx), jit_update(bsp)
  w = ref = jnp.array([1.0, -1.0, 2.0])
  state, bsp_state = tx.init(w), bsp.init(ref)
  for step in range(15):
    grads = [grad(w) + rng.normal(scale=0.3, size=3).astype(np.float32) for _ in range(m)]
    for i, g in enumerate(grads):
      u, state = update(g, state, w, {"version": jnp.int32(step)})
      if i < m - 1:
        np.testing.assert_array_equal(u, 0.0)
        assert not bool(state[0].released)
      w = apply(w, u)
    assert bool(state[0].released) and int(state[0].last_k) == m and int(state[0].count) == step + 1
    v, bsp_state = bsp_update(sum(grads) / m, bsp_state, ref, {})
    ref = apply(ref, v)
    np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-6)


def test_identical_gradients_release_at_two():
  g = np.array([1.0, -2.0, 0.5])
  outs, states = feed(jaxsync.adaptive_k(max_k=8), [(g, 0), (g, 0)], jnp.zeros(3))
  np.testing.assert_array_equal(outs[0], 0.0)
  assert not bool(states[0].released) and int(states[0].fresh_count) == 1
  assert bool(states[1].released) and int(states[1].last_k) == 2
  np.testing.assert_allclose(outs[1], g, rtol=1e-6)  # mc_0 = mean = g
  assert float(states[1].noise_ratio) == 0.0


def test_zero_mean_symmetric_gradients_push_k_to_max_k():
  g = np.random.default_rng(1).normal(size=16)
  arrivals = [(g if i % 2 == 0 else -g, 0) for i in range(8)]
  outs, states = feed(jaxsync.adaptive_k(max_k=8), arrivals, jnp.zeros(16))
  assert [bool(s.released) for s in states] == [False] * 7 + [True]
  assert int(states[-1].last_k) == 8
  np.testing.assert_allclose(outs[-1], 0.0, atol=1e-6)  # the mean of the pairs


def test_num_live_workers_bounds_k_when_max_k_is_none():
  g = np.ones(4)
  arrivals = [(g, 0), (-g, 0), (g, 0)]
  _, states = feed(jaxsync.adaptive_k(), arrivals, jnp.zeros(4), num_live_workers=jnp.int32(3))
  assert [bool(s.released) for s in states] == [False, False, True]
  with pytest.raises(ValueError, match="num_live_workers"):
    tx = jaxsync.adaptive_k()
    tx.update(jnp.ones(4), tx.init(jnp.zeros(4)), version=0)


def test_the_defaults_train_in_an_ordinary_single_process_chain():
  # The design card's first use: no version, no num_live_workers. The tests alone bound k (big-batch SGD).
  _, grad = quadratic([1.0, 3.0, 5.0])
  rng = np.random.default_rng(2)
  tx = optax.chain(jaxsync.adaptive_k(), optax.scale_by_learning_rate(0.05))
  update = jax.jit(tx.update)
  w = jnp.array([1.0, -1.0, 2.0])
  state, ks = tx.init(w), []
  for _ in range(300):
    u, state = update(grad(w) + rng.normal(scale=0.5, size=3).astype(np.float32), state, w)
    w = apply(w, u)
    if bool(state[0].released):
      ks.append(int(state[0].last_k))
  assert float(jnp.linalg.norm(w)) < 0.2 * float(jnp.linalg.norm(jnp.array([1.0, -1.0, 2.0])))
  assert len(ks) > 20 and min(ks) >= 2 and max(ks) > 2  # adaptive: more gradients as the signal fades


def test_its_first_line_says_it_is_a_direction_to_chain_a_rate_after():
  # adaptive_k alone in an optimizer climbs the loss (it returns +direction, as optax.scale_by_adam does).
  first = jaxsync.adaptive_k.__doc__.strip().splitlines()[0]
  assert "direction" in first and "chain a learning rate after it" in first


def test_progressive_momentum_merges_stale_gradients_with_their_weight():
  """mc_S = gamma mc_{S-1} + (1/k) sum_F g + (1/k) sum_R gamma^(S - j_r) g_r (eq. of §11b)."""
  gamma = 0.5
  rng = np.random.default_rng(2)
  g1, g2, g3, g4, g5 = rng.normal(size=(5, 3)).astype(np.float32)
  arrivals = [(g1, 0), (g2, 0), (g3, 0), (g4, 1), (g5, 1)]  # g3 arrives stale at S = 1
  outs, states = feed(jaxsync.adaptive_k(momentum=gamma, max_k=2), arrivals, jnp.zeros(3))
  mc0 = (g1 + g2) / 2
  np.testing.assert_allclose(outs[1], mc0, rtol=1e-6)
  # The stale arrival releases nothing, changes no momentum, and is counted.
  np.testing.assert_array_equal(outs[2], 0.0)
  np.testing.assert_allclose(states[2].momentum_buffer, mc0, rtol=1e-6)
  assert int(states[2].stale_count) == 1 and int(states[2].fresh_count) == 0
  np.testing.assert_array_equal(outs[3], 0.0)
  mc1 = gamma * mc0 + (g4 + g5) / 2 + gamma**1 * g3 / 2
  np.testing.assert_allclose(outs[4], mc1, rtol=1e-5, atol=1e-6)
  assert int(states[4].stale_count) == 0 and int(states[4].count) == 2


def test_which_gradients_are_fresh_is_an_option():
  """The same arrivals as above under the other readings: g3 (computed on step 0, arriving at S = 1) counts
  toward k with fresh_staleness=1 or None, so it releases with g4; with None even a gradient of step 0 at
  S = 2 does, and the stale path is never used."""
  gamma = 0.5
  rng = np.random.default_rng(2)
  g1, g2, g3, g4, g5 = rng.normal(size=(5, 3)).astype(np.float32)
  arrivals = [(g1, 0), (g2, 0), (g3, 0), (g4, 1), (g5, 1)]
  mc0 = (g1 + g2) / 2
  for slack in (1, None):
    outs, states = feed(
      jaxsync.adaptive_k(momentum=gamma, max_k=2, fresh_staleness=slack), arrivals, jnp.zeros(3)
    )
    np.testing.assert_allclose(outs[1], mc0, rtol=1e-6)
    assert int(states[2].fresh_count) == 1 and int(states[2].stale_count) == 0  # g3 is fresh at S = 1
    mc1 = gamma * mc0 + (g3 + g4) / 2  # g3 undiscounted: a member of F, not of R
    np.testing.assert_allclose(outs[3], mc1, rtol=1e-5, atol=1e-6)
    assert bool(states[3].released) and int(states[3].count) == 2
    # g5 (step 1) at S = 2: fresh under both readings; a gradient of step 0 at S = 2 only under None.
    assert int(states[4].fresh_count) == 1
  late = [(g1, 0), (g2, 0), (g3, 1), (g4, 1), (g5, 0)]
  for slack, fresh in ((0, 0), (1, 0), (None, 1)):
    _, states = feed(jaxsync.adaptive_k(momentum=gamma, max_k=2, fresh_staleness=slack), late, jnp.zeros(3))
    assert (int(states[-1].fresh_count), int(states[-1].stale_count)) == (fresh, 1 - fresh), slack
  with pytest.raises(ValueError, match=r"fresh_staleness.*-1.*an integer >= 0"):
    jaxsync.adaptive_k(fresh_staleness=-1)


def test_stale_weight_is_gamma_to_the_staleness():
  gamma = 0.5
  g = np.ones(2, np.float32)
  # Reach S = 3 with single-worker releases (max_k = 1), then a gradient of step 0.
  arrivals = [(np.zeros(2), 0), (np.zeros(2), 1), (np.zeros(2), 2), (g, 0)]
  _, states = feed(jaxsync.adaptive_k(momentum=gamma, max_k=1), arrivals, jnp.zeros(2))
  np.testing.assert_allclose(states[-1].stale_sum, gamma**3 * g, rtol=1e-6)


def test_lower_confidence_endpoint_is_more_conservative():
  """Test 1 passes for two close gradients; the lower t-interval endpoint rejects them."""
  arrivals = [(np.array([1.0, 0.0]), 0), (np.array([1.2, 0.0]), 0)]
  _, upper = feed(jaxsync.adaptive_k(ci_endpoint="upper", max_k=8), arrivals, jnp.zeros(2))
  _, lower = feed(jaxsync.adaptive_k(ci_endpoint="lower", max_k=8), arrivals, jnp.zeros(2))
  assert bool(upper[-1].released)
  # h = t_{0.975,1} * s / sqrt(2) = 12.71 * 0.1414 / 1.414 = 1.27 > |g_bar| = 1.1
  assert not bool(lower[-1].released)


def test_gaussian_gradients_release_near_the_predicted_k():
  """g_i ~ N(mu, sigma^2 I_d): Test 1 holds iff V/k <= theta^2 (|mu|^2 + V/k), i.e.
  k >= d sigma^2 (1 - theta^2) / (theta^2 |mu|^2) = 12 for d = 400, |mu|^2 = 100, theta = 0.5."""
  d, theta, arrivals = 400, 0.5, 600
  mu = jnp.full(d, 0.5)
  tx = jaxsync.adaptive_k(momentum=0.0, theta=theta, max_k=64)

  def run(key):
    def body(state, key):
      g = mu + jax.random.normal(key, (d,))
      _, state = tx.update(g, state, None, version=state.count)
      return state, (state.released, state.last_k)

    _, (released, last_k) = jax.lax.scan(body, tx.init(mu), jax.random.split(key, arrivals))
    return released, last_k

  released, last_k = jax.jit(run)(jax.random.key(0))
  ks = np.asarray(last_k)[np.asarray(released)]
  assert len(ks) >= 30
  assert ks.min() >= 9 and ks.max() <= 16, ks
  assert 11.5 <= ks.mean() <= 13.5, ks.mean()


def test_rejected_arrivals_leave_the_buffer_alone():
  tx = jaxsync.adaptive_k(max_k=4)
  update = jit_update(tx)
  params = jnp.zeros(2)
  state = tx.init(params)
  _, state = update(jnp.ones(2), state, params, {"version": jnp.int32(0)})
  u, bad = update(jnp.array([jnp.nan, 1.0]), state, params, {"version": jnp.int32(0)})
  np.testing.assert_array_equal(u, 0.0)
  assert_state_unchanged_but(state, bad, "nonfinite_count")
  assert int(bad.nonfinite_count) == 1
  u, bad = update(jnp.ones(2), state, params, {"version": jnp.int32(3)})
  assert_state_unchanged_but(state, bad, "invalid_version_count")
  assert int(bad.invalid_version_count) == 1 and not bool(bad.released)


def test_readme_composition_with_clipping_and_a_stateless_learning_rate():
  tx = optax.chain(
    optax.clip_by_global_norm(1.0), jaxsync.adaptive_k(max_k=2), optax.scale_by_learning_rate(0.05)
  )
  update = jit_update(tx)
  params = jnp.zeros(2)
  state = tx.init(params)
  u1, state = update(jnp.array([30.0, 40.0]), state, params, {"version": jnp.int32(0)})
  u2, state = update(jnp.array([3.0, 4.0]), state, params, {"version": jnp.int32(0)})
  np.testing.assert_array_equal(u1, 0.0)
  np.testing.assert_allclose(u2, [-0.03, -0.04], rtol=1e-6)  # both clipped to (0.6, 0.8)
  assert bool(optax.tree.get(state, "released"))


def test_on_release_lets_adam_see_only_released_aggregates():
  """Adam inside on_release == Adam fed the released aggregates directly."""
  rng = np.random.default_rng(3)
  grads = rng.normal(size=(12, 3)).astype(np.float32)
  buffer = jaxsync.adaptive_k(momentum=0.0, max_k=3, theta=1e-6)  # release every 3rd
  tx = jaxsync.on_release(buffer, optax.adam(0.1))
  update = jit_update(tx)
  adam = optax.adam(0.1)
  adam_update = jit_update(adam)
  w = ref = jnp.ones(3)
  state, adam_state = tx.init(w), adam.init(ref)
  for t, g in enumerate(grads):
    u, state = update(g, state, w, {"version": jnp.int32(t // 3)})
    w = apply(w, u)
    if t % 3 == 2:
      v, adam_state = adam_update(grads[t - 2 : t + 1].mean(0), adam_state, ref, {})
      ref = apply(ref, v)
      assert bool(optax.tree.get(state, "released"))
    else:
      np.testing.assert_array_equal(u, 0.0)
    assert int(state.inner[0].count) == (t + 1) // 3
    np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-6)
  # A plain chain would have stepped Adam on every arrival: different parameters.
  naive = optax.chain(jaxsync.adaptive_k(momentum=0.0, max_k=3, theta=1e-6), optax.adam(0.1))
  naive_update = jit_update(naive)
  x, naive_state = jnp.ones(3), naive.init(jnp.ones(3))
  for t, g in enumerate(grads):
    u, naive_state = naive_update(g, naive_state, x, {"version": jnp.int32(t // 3)})
    x = apply(x, u)
  assert int(naive_state[1][0].count) == 12
  assert not np.allclose(x, ref, rtol=1e-3)


def test_on_release_requires_a_buffering_rule():
  with pytest.raises(ValueError, match="released"):
    jaxsync.on_release(optax.sgd(0.1), optax.adam(0.1)).init(jnp.zeros(2))


@pytest.mark.parametrize("endpoint", ["upper", "lower"])
def test_statistics_match_a_direct_computation_over_several_releases(endpoint):
  """V, k and r = V / (k |g_bar|^2) at every release, against NumPy on the fresh set;
  exercises the lazily reset buffers (and the per-coordinate M2 of the lower endpoint)."""
  rng = np.random.default_rng(6)
  mu = np.array([1.0, -0.5, 0.25, 2.0])
  tx = jaxsync.adaptive_k(momentum=0.5, theta=0.6, ci_endpoint=endpoint, max_k=6)
  update = jit_update(tx)
  params = jnp.zeros(4)
  state = tx.init(params)
  fresh, releases = [], 0
  for _ in range(60):
    g = (mu + rng.normal(scale=0.8, size=4)).astype(np.float32)
    stale = rng.random() < 0.2 and int(state.count) > 0
    version = int(state.count) - 1 if stale else int(state.count)
    _, state = update(g, state, params, {"version": jnp.int32(version)})
    if not stale:
      fresh.append(g)
    if bool(state.released):
      k = len(fresh)
      f = np.asarray(fresh, np.float64)
      v = ((f - f.mean(0)) ** 2).sum() / (k - 1) if k > 1 else 0.0
      assert int(state.last_k) == k
      expected_r = v / (k * (f.mean(0) ** 2).sum()) if k > 1 else 0.0
      np.testing.assert_allclose(float(state.noise_ratio), expected_r, rtol=1e-4)
      fresh, releases = [], releases + 1
  assert releases >= 8


def test_lower_endpoint_decision_matches_a_direct_computation():
  """The t-interval test with the lower endpoint, recomputed with scipy's t quantile.

  Strong signal (mean 3, sd 1, theta 0.5): the interval test decides at k = 3-4,
  where t quantiles of neighbouring degrees of freedom differ by 30%."""
  from scipy import stats

  rng = np.random.default_rng(7)
  theta = 0.5
  tx = jaxsync.adaptive_k(ci_endpoint="lower", theta=theta, max_k=40)
  update = jit_update(tx)
  params = jnp.zeros(8)
  state = tx.init(params)
  fresh, release_ks, interval_decided = [], [], 0
  for _ in range(200):
    g = (3.0 + rng.normal(size=8)).astype(np.float32)
    _, state = update(g, state, params, {"version": state.count})
    fresh.append(g.astype(np.float64))
    f = np.asarray(fresh)
    k = len(f)
    expected = False
    if k >= 2:
      mean, var = f.mean(0), f.var(0, ddof=1)
      error = var.sum() / k
      h = stats.t.ppf(0.975, k - 1) * np.sqrt(var / k)
      lower = np.maximum(np.abs(mean) - h, 0.0)
      norm_test = error <= theta**2 * (mean**2).sum()
      interval_test = error <= theta**2 * (lower**2).sum()
      interval_decided += norm_test and not interval_test
      expected = (norm_test and interval_test) or k >= 40
    assert bool(state.released) == expected, k
    if expected:
      release_ks.append(k)
      fresh = []
  assert interval_decided >= 10 and len(release_ks) >= 20, (interval_decided, release_ks)
