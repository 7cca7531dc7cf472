"""Per-worker BB step sizes and Armijo backtracking (spec §11c)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsync

from helpers import apply, jit_update, quadratic


def bb_optimizer(initial, **kwargs):
  return optax.chain(jaxsync.bb_step_size(initial, **kwargs), optax.scale(-1.0))


def test_deterministic_quadratic_converges_in_one_bb_step():
  """f = (nu/2)|x|^2, r = 0, smoothing 1: alpha = 1/nu, so the second step hits 0."""
  nu = 3.0
  _, grad = quadratic([nu] * 4)
  tx = bb_optimizer(0.1, smoothing=1.0)
  update = jit_update(tx)
  x = jnp.array([1.0, -2.0, 0.5, 3.0])
  state = tx.init(x)
  u, state = update(grad(x), state, x, {})
  x = apply(x, u)
  assert float(state[0].step_size) == pytest.approx(0.1)  # the first step: no curvature yet
  u, state = update(grad(x), state, x, {})
  x = apply(x, u)
  assert float(state[0].curvature) == pytest.approx(nu, rel=1e-5)
  assert float(state[0].step_size) == pytest.approx(1 / nu, rel=1e-5)
  np.testing.assert_allclose(x, 0.0, atol=1e-6)


def test_smoothing_and_noise_correction():
  """alpha = (1 - beta_s) alpha_prev + beta_s (1 - r)/nu with nu from (1 - r_prev) g_prev."""
  tx = jaxsync.bb_step_size(0.5, smoothing=0.25)
  update = jit_update(tx)
  x0, g0 = jnp.array([1.0, 0.0]), jnp.array([2.0, 0.0])
  x1, g1 = jnp.array([0.0, 0.0]), jnp.array([-1.0, 0.0])
  state = tx.init(x0)
  out, state = update(g0, state, x0, {"noise_ratio": jnp.float32(0.5)})
  np.testing.assert_allclose(out, 0.5 * g0)  # the scaled gradient a worker sends
  out, state = update(g1, state, x1, {"noise_ratio": jnp.float32(0.2)})
  s = x1 - x0
  nu = float(jnp.vdot(g1 - 0.5 * g0, s) / jnp.vdot(s, s))  # (-1 - 1) * (-1) / 1 = 2
  expected = 0.75 * 0.5 + 0.25 * (1 - 0.2) / nu
  assert float(state.step_size) == pytest.approx(expected, rel=1e-6)
  np.testing.assert_allclose(out, expected * g1, rtol=1e-6)
  assert bool(state.accepted)


@pytest.mark.parametrize(
  "case,noise_ratio",
  [("negative curvature", 0.0), ("no movement", 0.0), ("noise ratio >= 1", 1.5)],
)
def test_safeguards_keep_the_previous_step(case, noise_ratio):
  tx = jaxsync.bb_step_size(0.3, smoothing=0.5)
  update = jit_update(tx)
  x0, g0 = jnp.array([1.0]), jnp.array([1.0])
  if case == "negative curvature":
    x1, g1 = jnp.array([0.0]), jnp.array([2.0])  # gradient grew along a descent move
  elif case == "no movement":
    x1, g1 = x0, jnp.array([0.5])
  else:
    x1, g1 = jnp.array([0.0]), jnp.array([0.5])
  state = tx.init(x0)
  _, state = update(g0, state, x0, {})
  _, state = update(g1, state, x1, {"noise_ratio": jnp.float32(noise_ratio)})
  assert float(state.step_size) == pytest.approx(0.3)
  assert not bool(state.accepted)
  assert np.isfinite(float(state.step_size))


def test_armijo_backtracking_known_value():
  """(1 - 10 a)^2 <= 1 - 2 c 10 a first holds at a = 1/8 when halving from 1."""
  loss = lambda x: 5.0 * jnp.sum(x**2)
  x = jnp.array([1.0, -1.0])
  step = jax.jit(lambda p: jaxsync.armijo_backtracking(loss, p, jax.grad(loss)(p), 1.0))(x)
  assert float(step) == pytest.approx(0.125)
  # An already acceptable step is kept; a capped search returns the last step.
  assert float(jaxsync.armijo_backtracking(loss, x, 10 * x, 0.05)) == pytest.approx(0.05)
  assert float(jaxsync.armijo_backtracking(loss, x, 10 * x, 1.0, max_backtracks=1)) == 0.5


def test_armijo_treats_a_nan_loss_as_failure():
  loss = lambda x: jnp.where(jnp.abs(x[0]) > 2.0, jnp.nan, jnp.sum(x**2))
  step = jaxsync.armijo_backtracking(loss, jnp.array([1.0]), jnp.array([2.0]), 4.0)
  assert float(step) == pytest.approx(0.5)  # 4 and 2 and 1 overshoot or give NaN; 0.5 lands on 0


def test_bb_with_armijo_inside_the_update():
  """Passing value_fn backtracks an overlong BB step and stores the accepted one."""
  loss = lambda x: 5.0 * jnp.sum(x**2)
  tx = jaxsync.bb_step_size(1.0, smoothing=1.0)
  x = jnp.array([1.0])

  @jax.jit
  def step(x, state):
    return tx.update(jax.grad(loss)(x), state, x, value_fn=loss)

  out, state = step(x, tx.init(x))
  assert float(state.step_size) == pytest.approx(0.125)
  np.testing.assert_allclose(out, 0.125 * 10.0)


def test_gradient_noise_ratio():
  per_example = {"w": jnp.array([[1.0, 0.0], [3.0, 2.0]]), "b": jnp.array([1.0, 1.0])}
  # mean (2, 1 | 1); V = (1 + 1 + 1 + 1 + 0 + 0) / 1 = 4; r = 4 / (2 * 6)
  assert float(jaxsync.gradient_noise_ratio(per_example)) == pytest.approx(4 / 12)
  with pytest.raises(ValueError, match="leading batch axis"):
    jaxsync.gradient_noise_ratio(jnp.ones((1, 3)))


def test_full_batch_ignores_the_noise_ratio_and_takes_one_over_nu():
  """|B| = N (smoothing 1): alpha = 1/nu even when a noise ratio is passed (spec §11c)."""
  _, grad = quadratic([2.0, 2.0])
  tx = jaxsync.bb_step_size(0.1, smoothing=1.0)
  update = jit_update(tx)
  x = jnp.array([1.0, -1.0])
  state = tx.init(x)
  for _ in range(2):
    u, state = update(grad(x), state, x, {"noise_ratio": jnp.float32(0.5)})
    x = x - u  # bb_step_size returns alpha g, the scaled gradient
  assert float(state.step_size) == pytest.approx(0.5, rel=1e-5)
  np.testing.assert_allclose(x, 0.0, atol=1e-6)


def test_a_non_finite_noise_ratio_does_not_poison_the_next_estimate():
  """adaptive_k reports r = inf for a zero mean gradient; the next BB step must still work."""
  _, grad = quadratic([4.0])
  tx = jaxsync.bb_step_size(0.05, smoothing=0.5)
  update = jit_update(tx)
  x = jnp.array([1.0])
  state = tx.init(x)
  u, state = update(grad(x), state, x, {"noise_ratio": jnp.float32(jnp.inf)})
  assert float(state.noise_ratio) == 1.0
  x = x - u
  _, state = update(grad(x), state, x, {"noise_ratio": jnp.float32(0.0)})
  # r_prev = 1 drops g_prev: nu = <g, s>/<s, s> = 4 x1 / (x1 - x0) < 0 here, so the
  # step is kept rather than turned into NaN or inf.
  assert np.isfinite(float(state.step_size)) and float(state.step_size) == pytest.approx(0.05)
