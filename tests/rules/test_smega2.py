"""SMEGA² (spec §5): Nesterov for one worker, SSGDm per cycle, the look-ahead reply."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsync

from helpers import apply, jit_update, quadratic


def test_one_worker_is_nesterov_sgd_sutskever_form():
  """N = 1: g at w - eta beta v; v <- beta v + g; w <- w - eta v."""
  eta, beta = 0.05, 0.9
  _, grad = quadratic([1.0, 4.0])
  tx = jaxsync.smega2(eta, beta, num_workers=1)
  update = jit_update(tx)
  w = ref_w = jnp.array([1.0, -1.0])
  ref_v = jnp.zeros(2)
  state = tx.init(w)
  for _ in range(40):
    u, state = update(grad(jaxsync.look_ahead(w, state)), state, w, {})
    w = apply(w, u)
    ref_v = beta * ref_v + grad(ref_w - eta * beta * ref_v)
    ref_w = ref_w - eta * ref_v
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)


def test_a_cycle_of_gradients_at_one_point_is_one_summed_ssgdm_step():
  """All N gradients of a cycle at the cycle-start point: V = N v, SSGDm summed."""
  n, eta, beta = 4, 0.02, 0.9
  _, grad = quadratic([1.0, 2.0, 3.0])
  rng = np.random.default_rng(0)
  tx = jaxsync.smega2(eta, beta, num_workers=n)
  update = jit_update(tx)
  w = ref_w = jnp.array([1.0, 1.0, 1.0])
  ref_v = jnp.zeros(3)
  state = tx.init(w)
  for _ in range(10):
    grads = [grad(ref_w) + rng.normal(scale=0.1, size=3).astype(np.float32) for _ in range(n)]
    for g in grads:
      u, state = update(g, state, w, {})
      w = apply(w, u)
    ref_v = beta * ref_v + sum(grads)
    ref_w = ref_w - eta * ref_v
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(n * state.momentum_buffer, ref_v, rtol=1e-5, atol=1e-6)
    assert int(state.cycle_position) == 0


@pytest.mark.parametrize("mode", ["advanced", "naive"])
def test_look_ahead_formula(mode):
  n, eta, beta = 4, 0.1, 0.5
  tx = jaxsync.smega2(eta, beta, num_workers=n, look_ahead=mode)
  update = jit_update(tx)
  w = jnp.array([1.0])
  state = tx.init(w)
  for g in ([1.0], [2.0], [4.0], [8.0], [3.0]):  # a full cycle, then one more
    u, state = update(jnp.array(g), state, w, {})
    w = apply(w, u)
  c, v, acc = int(state.cycle_position), float(state.momentum_buffer[0]), float(state.accumulator[0])
  assert (c, acc) == (1, 3.0) and v == pytest.approx(15.0 / 4)
  if mode == "advanced":
    expected = w[0] - eta * beta * ((n - c + c * beta) * v + c / n * acc)
  else:
    expected = w[0] - eta * beta * n * v
  assert float(jaxsync.look_ahead(w, state)[0]) == pytest.approx(float(expected), rel=1e-6)


def test_weight_decay_is_plain_optax_before_smega2():
  tx = optax.chain(optax.add_decayed_weights(0.1), jaxsync.smega2(1.0, 0.0, num_workers=1))
  w = jnp.array([2.0])
  u, _ = jit_update(tx)(jnp.array([1.0]), tx.init(w), w, {})
  np.testing.assert_allclose(u, [-1.2])  # g + lambda w with the server's w


def smega2_reference(grads, n, eta, beta, dampening, w0, mode="advanced"):
  """Spec §5 in float64 NumPy: the server step and the reply, per arrival."""
  w, v, acc, c = np.array(w0, np.float64), np.zeros(len(w0)), np.zeros(len(w0)), 0
  history = []
  for g in grads:
    g = np.asarray(g, np.float64)
    c = (c + 1) % n
    acc = acc + g
    d = g + beta * v
    if c == 0:
      v = beta * v + (1 - dampening) * acc / n
      acc = np.zeros_like(acc)
    w = w - eta * d
    if mode == "advanced":
      reply = w - eta * beta * ((n - c + c * beta) * v + c / n * acc)
    else:
      reply = w - eta * beta * n * v
    history.append((w.copy(), reply))
  return history


@pytest.mark.parametrize("mode", ["advanced", "naive"])
def test_matches_reference_with_dampening_and_a_rejection_at_a_cycle_end(mode):
  n, eta, beta, damp = 3, 0.1, 0.8, 0.3
  rng = np.random.default_rng(4)
  grads = rng.normal(size=(10, 4)).astype(np.float32)
  expected = smega2_reference(grads, n, eta, beta, damp, np.ones(4), mode)
  tx = jaxsync.smega2(eta, beta, num_workers=n, dampening=damp, look_ahead=mode)
  update = jit_update(tx)
  w = jnp.ones(4)
  state = tx.init(w)
  for i, g in enumerate(grads):
    if i == 5:  # the arrival that would end the second cycle comes poisoned first
      u, rejected = update(jnp.full(4, jnp.nan), state, w, {})
      np.testing.assert_array_equal(u, 0.0)
      assert int(rejected.cycle_position) == int(state.cycle_position) == 2
      state = rejected
    u, state = update(g, state, w, {})
    w = apply(w, u)
    w_ref, reply_ref = expected[i]
    np.testing.assert_allclose(w, w_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jaxsync.look_ahead(w, state), reply_ref, rtol=1e-5, atol=1e-6)
  assert int(state.nonfinite_count) == 1


def test_bfloat16_gradients_sum_in_float32():
  """A cycle of 64 bfloat16 gradients: the momentum is their mean to float32 accuracy."""
  n = 64
  rng = np.random.default_rng(5)
  grads = jnp.asarray(1.0 + 0.3 * rng.normal(size=(n, 1000)), jnp.bfloat16)
  tx = jaxsync.smega2(0.1, 0.9, num_workers=n)
  update = jit_update(tx)
  w = jnp.zeros(1000, jnp.bfloat16)
  state = tx.init(w)
  for g in grads:
    _, state = update(g, state, w, {})
  exact = np.asarray(grads, np.float64).mean(0)
  assert state.momentum_buffer.dtype == jnp.float32
  np.testing.assert_allclose(state.momentum_buffer, exact, rtol=1e-5)
