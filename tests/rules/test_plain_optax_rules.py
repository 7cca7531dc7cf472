"""Rules that are plain optax (spec §1-4): the identities that justify not re-implementing them."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import apply, jit_update, quadratic


@pytest.mark.parametrize("k", [1, 3])
def test_shifted_momentum_is_worker_trace_plus_server_sgd(k):
  """Round robin, K workers with local optax.trace, server optax.sgd:
  w_{t+1} = w_t - eta g(w_{t-tau}) + m (w_{t-tau} - w_{t-tau-1}), tau = K - 1 (spec §4);
  K = 1 is heavy-ball SGD momentum (form B)."""
  eta, m = 0.05, 0.9
  _, grad = quadratic([1.0, 2.0])
  worker = optax.trace(decay=m)
  server = optax.sgd(eta)
  worker_update, server_update = jit_update(worker), jit_update(server)
  w = jnp.array([1.0, -1.0])
  history = [w]
  pulled = [w] * k  # the parameters each worker holds
  worker_states = [worker.init(w) for _ in range(k)]
  server_state = server.init(w)
  for t in range(30):
    i = t % k
    v, worker_states[i] = worker_update(grad(pulled[i]), worker_states[i], pulled[i], {})
    u, server_state = server_update(v, server_state, w, {})
    new_w = apply(w, u)
    if t >= k:  # steady state: worker i holds w_{t-tau}, pulled after its arrival at t - K
      np.testing.assert_array_equal(pulled[i], history[t - k + 1])
      expected = w - eta * grad(history[t - k + 1]) + m * (history[t - k + 1] - history[t - k])
      np.testing.assert_allclose(new_w, expected, rtol=1e-5, atol=1e-6)
    w = new_w
    pulled[i] = w
    history.append(w)


def test_naive_asgd_momentum_with_one_worker_is_sgd_momentum_form_a():
  """optax.sgd(eta, beta) per arrival, K = 1: u <- beta u + eta g; w <- w - u."""
  eta, beta = 0.05, 0.9
  _, grad = quadratic([1.0, 4.0])
  tx = optax.sgd(eta, momentum=beta)
  update = jit_update(tx)
  w = ref = jnp.array([1.0, -2.0])
  u_ref = jnp.zeros(2)
  state = tx.init(w)
  for _ in range(30):
    u, state = update(grad(w), state, w, {})
    u_ref = beta * u_ref + eta * grad(ref)
    w, ref = apply(w, u), ref - u_ref
    np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-6)


def test_apply_if_finite_gives_plain_rules_the_jaxsync_nan_policy():
  tx = optax.apply_if_finite(optax.sgd(0.1, momentum=0.9), max_consecutive_errors=2**30)
  w = jnp.ones(2)
  state = tx.init(w)
  u, state = jit_update(tx)(jnp.array([jnp.nan, 1.0]), state, w, {})
  np.testing.assert_array_equal(u, 0.0)
  assert int(state.total_notfinite) == 1
  np.testing.assert_array_equal(state.inner_state[0].trace, 0.0)
