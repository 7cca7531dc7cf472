"""Per-worker BB step sizes and Armijo backtracking (docs/algorithms.md §11c)."""

import pathlib

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
  """f = (nu/2)|x|^2, r = 0, smoothing 1: alpha = 1/nu, so the second step hits 0 (the spec's rule)."""
  nu = 3.0
  _, grad = quadratic([nu] * 4)
  tx = bb_optimizer(0.1, smoothing=1.0, max_scale=None)
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
  tx = jaxsync.bb_step_size(0.1, smoothing=1.0, max_scale=None)
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


def _two_steps(tx, curvature, x0=1.0):
  """Two jitted updates on f = (curvature/2) x^2 from x0: the second takes the BB step 1/curvature."""
  _, grad = quadratic([curvature])
  update = jit_update(tx)
  x = jnp.array([x0])
  state = tx.init(x)
  u, state = update(grad(x), state, x, {})
  x = x - u
  g = grad(x)
  u, state = update(g, state, x, {})
  return u, g, state


@pytest.mark.parametrize("max_scale", [2.0, 10.0])
@pytest.mark.parametrize("curvature", [0.01, 1000.0])
def test_max_scale_bounds_the_bb_step(max_scale, curvature):
  """jaxsync's bound: alpha in [alpha_0 / c, c alpha_0], where the unbounded rule's 1/nu is outside it."""
  initial = 0.1
  _, _, free = _two_steps(jaxsync.bb_step_size(initial, smoothing=1.0, max_scale=None), curvature)
  u, g, state = _two_steps(jaxsync.bb_step_size(initial, smoothing=1.0, max_scale=max_scale), curvature)
  unbounded = float(free.step_size)
  assert unbounded == pytest.approx(1.0 / curvature, rel=1e-4)  # 100 or 0.001: outside both bounds
  low, high = initial / max_scale, initial * max_scale
  assert not low <= unbounded <= high
  bound = high if curvature < 1.0 else low
  assert float(state.step_size) == pytest.approx(bound, rel=1e-6)
  np.testing.assert_allclose(u, bound * g, rtol=1e-6)  # the worker sends the bounded step
  assert bool(state.accepted) and int(state.clipped_count) == 1 and int(free.clipped_count) == 0


def test_max_scale_bounds_a_noise_dominated_step_and_armijo_only_shrinks_it():
  """g - g_prev nearly orthogonal to s (batch noise): nu tiny, alpha_hat huge; the bound holds, Armijo below it."""
  x0, g0 = jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0])
  x1, g1 = jnp.array([0.0, 0.0]), jnp.array([-1e-3, 1.0])  # nu = <g1 - g0, s>/<s, s> = 1e-3

  def run(tx, value_fn=None):
    @jax.jit
    def steps(state):
      _, state = tx.update(g0, state, x0)
      return tx.update(g1, state, x1, **({} if value_fn is None else {"value_fn": value_fn}))[1]

    return steps(tx.init(x0))

  free = run(jaxsync.bb_step_size(0.01, smoothing=0.5, max_scale=None))
  bounded = run(jaxsync.bb_step_size(0.01, smoothing=0.5, max_scale=4.0))
  assert float(free.step_size) == pytest.approx(0.5 * 0.01 + 0.5 * 1e3, rel=1e-3)  # ~500
  assert float(bounded.step_size) == pytest.approx(0.04)

  def batch_loss(k):  # (k/2)|x - x1 + g1/k|^2: its gradient at x1 is g1; Armijo accepts alpha <= 1.8/k
    return lambda x: 0.5 * k * jnp.sum((x - x1 + g1 / k) ** 2)

  # Armijo starts from the bounded step (not from ~500) and the accepted step is stored.
  assert float(run(jaxsync.bb_step_size(0.01, smoothing=0.5, max_scale=4.0), batch_loss(1.0)).step_size) == (
    pytest.approx(0.04)
  )
  shrunk = run(jaxsync.bb_step_size(0.01, smoothing=0.5, max_scale=4.0), batch_loss(100.0))
  assert float(shrunk.step_size) == pytest.approx(0.01)  # 0.04 and 0.02 fail, 0.01 passes
  # Unbounded, ten halvings of ~500 (the default max_backtracks) still leave ~0.49: Armijo gives up.
  assert (
    float(run(jaxsync.bb_step_size(0.01, smoothing=0.5, max_scale=None), batch_loss(100.0)).step_size) > 0.4
  )


def _reference_bb(initial, smoothing, steps):
  """The spec's unbounded rule (§11c, eqs. 21-26), written out independently in float64."""
  alpha, r_prev, prev = initial, 0.0, None
  alphas = []
  for x, g, r in steps:
    x, g = np.asarray(x, np.float64), np.asarray(g, np.float64)
    if prev is not None:
      s = x - prev[0]
      nu = np.dot(g - (1.0 - r_prev) * prev[1], s) / np.dot(s, s)
      proposal = (1.0 - r) / nu
      if np.isfinite(nu) and nu > 0 and r < 1 and np.isfinite(proposal) and proposal > 0:
        alpha = (1.0 - smoothing) * alpha + smoothing * proposal
    alphas.append(alpha)
    r_prev, prev = min(max(r, 0.0), 1.0), (x, g)
  return np.array(alphas)


def test_max_scale_none_is_the_unbounded_spec_rule():
  """With max_scale=None the steps follow the spec's rule, including ones far beyond any bound."""
  rng = np.random.default_rng(0)
  steps = [
    (rng.normal(size=5).astype(np.float32), rng.normal(size=5).astype(np.float32), float(r))
    for r in rng.uniform(0.0, 0.6, size=40)
  ]
  tx = jaxsync.bb_step_size(0.01, smoothing=0.3, max_scale=None)
  update = jit_update(tx)
  state = tx.init(jnp.asarray(steps[0][0]))
  alphas = []
  for x, g, r in steps:
    out, state = update(jnp.asarray(g), state, jnp.asarray(x), {"noise_ratio": jnp.float32(r)})
    np.testing.assert_allclose(out, float(state.step_size) * g, rtol=1e-6)
    alphas.append(float(state.step_size))
  expected = _reference_bb(0.01, 0.3, steps)
  np.testing.assert_allclose(alphas, expected, rtol=1e-4)
  assert max(alphas) > 0.01 * 100 and int(state.clipped_count) == 0  # a bound of 100 would have bitten


@pytest.mark.parametrize("value", [0.5, 0.0, -2.0, float("nan"), float("inf"), True, "2"])
def test_invalid_max_scale_raises_naming_the_argument(value):
  with pytest.raises(
    ValueError, match=r"max_scale=.*None \(no bound\) or a finite real number in \[1\.0, inf\)"
  ):
    jaxsync.bb_step_size(0.1, smoothing=0.5, max_scale=value)
  with pytest.raises(ValueError, match=r"adaptive_k: bb_max_scale="):
    jaxsync.strategies.make("adaptive_k", 4, bb_step_size=True, bb_max_scale=value)


def test_adaptive_k_plumbs_bb_max_scale_to_the_worker_rule():
  def second_step(**options):
    strategy = jaxsync.strategies.make("adaptive_k", 4, bb_step_size=True, learning_rate=0.1, **options)
    _, _, state = _two_steps(strategy.worker_rule, curvature=0.01)
    return float(state.step_size)

  # Without server momentum, smoothing 0.1: 0.9 * 0.1 + 0.1 * 100 = 10.09 unbounded.
  assert second_step(bb_max_scale=None, momentum=0.0) == pytest.approx(10.09, rel=1e-4)
  assert second_step(bb_max_scale=3.0, momentum=0.0) == pytest.approx(0.3)
  assert second_step(momentum=0.0) == pytest.approx(
    0.1 * jaxsync.strategies.describe("adaptive_k").options["bb_max_scale"]
  )
  # The server's momentum (0.9 by default) reaches the worker rule: 0.9 * 0.1 + 0.1 * (0.1 * 100) = 1.09
  # unbounded, and the bound's top is the rate itself.
  assert second_step(bb_max_scale=None) == pytest.approx(1.09, rel=1e-4)
  assert second_step() == pytest.approx(0.1)


def test_server_momentum_scales_the_step_by_one_minus_gamma():
  """Through heavy-ball momentum gamma a rate a moves the parameters a / (1 - gamma): the BB step is scaled."""
  nu, gamma = 4.0, 0.75
  _, grad = quadratic([nu] * 3)
  x0 = jnp.array([1.0, -2.0, 0.5])
  for momentum, expected in ((0.0, 1 / nu), (gamma, (1 - gamma) / nu)):
    tx = jaxsync.bb_step_size(0.1, smoothing=1.0, max_scale=None, server_momentum=momentum)
    state = tx.init(x0)
    _, state = tx.update(grad(x0), state, x0)
    x1 = x0 - 0.3 * grad(x0)  # any move: on a quadratic the secant curvature is nu
    _, state = tx.update(grad(x1), state, x1)
    assert float(state.step_size) == pytest.approx(expected, rel=1e-5), momentum


@pytest.mark.parametrize("curvature", [1e-4, 1e4])
def test_under_server_momentum_bb_may_lower_a_rate_but_not_raise_it(curvature):
  _, grad = quadratic([curvature] * 3)
  tx = jaxsync.bb_step_size(0.1, smoothing=1.0, max_scale=2.0, server_momentum=0.9)
  x0 = jnp.array([1.0, -2.0, 0.5])
  state = tx.init(x0)
  _, state = tx.update(grad(x0), state, x0)
  x1 = 0.5 * x0
  _, state = tx.update(grad(x1), state, x1)
  assert float(state.step_size) == pytest.approx(
    0.1 if curvature < 1 else 0.05
  )  # top alpha_0, bottom alpha_0/2


@pytest.mark.heavy
def test_adaptive_k_with_bb_and_momentum_trains_the_quickstart():
  """The documented use (bb_step_size with the default momentum 0.9): its steps sat at 2x the rate and the
  run died at chance accuracy before the momentum reading; now it trains like plain adaptive_k."""
  from jaxsync._src.app import config, experiment

  cfg = config.load(
    pathlib.Path(__file__).parents[2] / "configs" / "quickstart.yaml",
    ["strategy.name=adaptive_k", "strategy.options.bb_step_size=true", "run.eval_every=1000"],
  )
  exp = experiment.build(cfg)
  simulator = exp.simulator()
  state, records = simulator.advance(simulator.init(exp.model.params, 0), 1000)
  assert simulator.evaluate(state.params)["accuracy"] > 0.9  # 0.986; the old rule was at 0.089 here
  steps = np.asarray(records.step_size)[np.isfinite(records.step_size)]
  assert steps.max() <= 0.02 + 1e-7 and steps.min() >= 0.01 - 1e-7 and (steps < 0.0199).mean() > 0.2
