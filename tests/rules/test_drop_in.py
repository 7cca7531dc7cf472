"""Server rules in an ordinary single-process loop (issue 36, item 3): no ``version``, every gradient fresh.

``tx.update(grads, state, params)`` without the extra arg ``version`` treats the gradient as
computed on the rule's current version (staleness 0), which is what every gradient of a
single-process loop is. So the rules drop into a Linen ``TrainState``, ``flax.nnx.Optimizer``
(tests/test_flax_nnx_example.py) or a plain ``optax.apply_updates`` loop.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import train_state
from sklearn.datasets import load_digits

import jaxsync

from helpers import quadratic
from rule_cases import CASES, NUM_WORKERS

SERVER_CASES = [c for c in CASES if c.driver == "server"]


@pytest.mark.parametrize("case", SERVER_CASES, ids=[c.name for c in SERVER_CASES])
def test_an_omitted_version_equals_the_current_version_under_jit(case):
  """Bitwise: the update without ``version`` is the update with ``version=server_version(state)``."""
  tx = case.make()
  bound = {"num_live_workers": jnp.int32(NUM_WORKERS)}

  @jax.jit
  def fresh(g, state, w):
    return tx.update(g, state, w, **bound)

  @jax.jit
  def versioned(g, state, w):
    return tx.update(g, state, w, version=jaxsync.server_version(state), **bound)

  rng = np.random.default_rng(0)
  w = v = jnp.linspace(-1.0, 1.0, 5)
  state = explicit = tx.init(w)
  for _ in range(9):
    g = jnp.asarray(rng.normal(size=5), jnp.float32)
    u, state = fresh(g, state, w)
    e, explicit = versioned(g, explicit, v)
    w, v = optax.apply_updates(w, u), optax.apply_updates(v, e)
    jax.tree.map(np.testing.assert_array_equal, (w, state), (v, explicit))
  assert int(optax.tree.get(state, "invalid_version_count", 0)) == 0


@pytest.mark.parametrize("case", SERVER_CASES, ids=[c.name for c in SERVER_CASES])
def test_a_plain_apply_updates_loop_without_version_converges(case):
  """for step: u, s = tx.update(g, s, w); w = optax.apply_updates(w, u): no extra arg at all."""
  loss, grad = quadratic(np.linspace(1.0, 10.0, 10))
  tx = case.make(lr=case.quadratic_lr)

  def body(carry, _):
    w, state = carry
    u, state = tx.update(grad(jaxsync.look_ahead(w, state)), state, w)
    return (optax.apply_updates(w, u), state), None

  x0 = jnp.ones(10)
  (x, _), _ = jax.jit(lambda x: jax.lax.scan(body, (x, tx.init(x)), None, length=2000))(x0)
  assert float(loss(x)) < 1e-4 * float(loss(x0)), float(loss(x))


class _MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(10)(nn.relu(nn.Dense(32)(x)))


def _linen_run(tx, steps=300, batch=64):
  """A Linen TrainState loop (``state.apply_gradients(grads=...)``, no extra args) on digits."""
  digits = load_digits()
  order = np.random.default_rng(0).permutation(len(digits.target))
  x = jnp.asarray(digits.data[order] / 16.0, jnp.float32)
  y = jnp.asarray(digits.target[order], jnp.int32)
  model = _MLP()
  state = train_state.TrainState.create(
    apply_fn=model.apply, params=model.init(jax.random.key(0), x[:1])["params"], tx=tx
  )

  @jax.jit
  def step(state, xb, yb):
    def loss(params):
      logits = state.apply_fn({"params": params}, xb)
      return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    return state.apply_gradients(grads=jax.grad(loss)(state.params))

  for t in range(steps):
    start = (t * batch) % (1400 - batch)
    state = step(state, x[start : start + batch], y[start : start + batch])
  accuracy = float(jnp.mean(jnp.argmax(state.apply_fn({"params": state.params}, x[1400:]), -1) == y[1400:]))
  return state, accuracy


def test_ordered_momentum_in_a_linen_train_state_is_optax_sgd_with_momentum():
  """OrMo with every gradient fresh and K = 1 is heavy-ball momentum (form A, u = eta v): the same
  TrainState loop gives optax.sgd(lr, momentum)'s parameters up to float rounding."""
  ormo_state, ormo_accuracy = _linen_run(jaxsync.ordered_momentum(0.05, 0.9, num_workers=1))
  sgd_state, sgd_accuracy = _linen_run(optax.sgd(0.05, momentum=0.9))
  assert ormo_accuracy > 0.9 and abs(ormo_accuracy - sgd_accuracy) <= 0.01, (ormo_accuracy, sgd_accuracy)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4), ormo_state.params, sgd_state.params
  )
  assert int(ormo_state.opt_state.count) == 300 and int(ormo_state.opt_state.last_delay) == 0


def test_adaptive_k_in_a_linen_train_state_trains_on_adaptive_batches():
  tx = optax.chain(jaxsync.adaptive_k(momentum=0.9, max_k=4), optax.scale_by_learning_rate(0.05))
  state, accuracy = _linen_run(tx)
  releases = int(jaxsync.server_version(state.opt_state))
  assert 300 // 4 <= releases < 300 and accuracy > 0.9, (releases, accuracy)
