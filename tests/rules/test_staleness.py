"""Staleness-aware learning rates and n-softsync (spec §10)."""

import math

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsync

from helpers import jit_update


def run(tx, arrivals, params):
  update = jit_update(tx)
  state = tx.init(params)
  outs = []
  for g, v in arrivals:
    u, state = update(jnp.asarray(g, jnp.float32), state, params, {"version": jnp.int32(v)})
    outs.append(np.asarray(u))
  return outs, state


@pytest.mark.parametrize(
  "mode,penalty,factor",
  [("linear", None, lambda tau: 1 / max(tau, 1)), ("exponential", 0.3, lambda tau: math.exp(-0.3 * tau))],
)
def test_staleness_factor(mode, penalty, factor):
  g = np.array([1.0, 2.0])
  arrivals = [(g, 0), (g, 1), (g, 2), (g, 0), (g, 1), (g, 5)]  # tau = 0, 0, 0, 3, 3, 0
  outs, state = run(jaxsync.scale_by_staleness(mode, penalty=penalty), arrivals, jnp.zeros(2))
  taus = [0, 0, 0, 3, 3, 0]
  for out, tau in zip(outs, taus):
    np.testing.assert_allclose(out, factor(tau) * g, rtol=1e-6)
  assert int(state.count) == 6 and int(state.last_staleness) == 0


def test_one_softsync_with_fresh_gradients_is_bsp():
  """c = lambda learners, all fresh: the mean of the c gradients, once per round."""
  lam = 4
  rng = np.random.default_rng(0)
  grads = rng.normal(size=(3 * lam, 2)).astype(np.float32)
  tx = optax.chain(jaxsync.scale_by_staleness(gradients_per_update=lam), optax.scale_by_learning_rate(0.1))
  outs, state = run(tx, [(g, i // lam) for i, g in enumerate(grads)], jnp.zeros(2))
  for r in range(3):
    for i in range(lam - 1):
      np.testing.assert_array_equal(outs[r * lam + i], 0.0)
    np.testing.assert_allclose(
      outs[r * lam + lam - 1], -0.1 * grads[r * lam : (r + 1) * lam].mean(0), rtol=1e-5
    )
  assert int(state[0].count) == 3


def test_softsync_scales_each_gradient_by_its_own_staleness():
  g1, g2 = np.array([1.0]), np.array([4.0])
  tx = jaxsync.scale_by_staleness(gradients_per_update=2)
  # Version 0 first (fresh), then bring the server to step 2, then mix tau = 2 and tau = 0.
  arrivals = [(g1, 0), (g1, 0), (g1, 1), (g1, 1), (g1, 0), (g2, 2)]
  outs, state = run(tx, arrivals, jnp.zeros(1))
  np.testing.assert_allclose(outs[-1], (g1 / 2 + g2) / 2)
  assert bool(state.released)


def test_future_versions_are_rejected():
  outs, state = run(jaxsync.scale_by_staleness(), [(np.ones(1), 1)], jnp.zeros(1))
  np.testing.assert_array_equal(outs[0], 0.0)
  assert int(state.invalid_version_count) == 1 and int(state.count) == 0


def test_penalty_is_required_for_exponential_only():
  with pytest.raises(ValueError, match="penalty=None"):
    jaxsync.scale_by_staleness("exponential")
  with pytest.raises(ValueError, match="penalty=0.5"):
    jaxsync.scale_by_staleness("linear", penalty=0.5)
