"""Rules in one chain: one version owner per chain, on_release's inner a scope of its own (issue 36, item 2).

A chain has one server version, counted by at most one rule (``ordered_momentum``, ``smega2``,
``adaptive_k``, ``scale_by_staleness``). Two are refused with one line naming both; on_release's
inner sees each release as one fresh gradient, so a version-aware inner composes with a buffer.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from sklearn.datasets import load_digits

import jaxsync

from helpers import apply, jit_update

OWNERS = {
  "adaptive_k": lambda: jaxsync.adaptive_k(max_k=2),
  "scale_by_staleness": lambda: jaxsync.scale_by_staleness("linear"),
  "ordered_momentum": lambda: jaxsync.ordered_momentum(0.05, 0.9, num_workers=1),
  "smega2": lambda: jaxsync.smega2(0.05, 0.9, num_workers=1),
}
PAIRS = [
  ("adaptive_k", "ordered_momentum"),  # the issue's chain
  ("adaptive_k", "smega2"),
  ("scale_by_staleness", "ordered_momentum"),
  ("ordered_momentum", "smega2"),
]


@pytest.mark.parametrize("first,second", PAIRS, ids=[f"{a}+{b}" for a, b in PAIRS])
def test_two_version_owners_in_a_chain_are_refused_in_one_line_naming_both(first, second):
  tx = optax.chain(OWNERS[first](), OWNERS[second]())
  state = tx.init(jnp.zeros(3))
  with pytest.raises(ValueError) as error:
    jaxsync.server_version(state)
  message = str(error.value)
  assert "\n" not in message and len(message) < 600, message
  assert f"({first}, {second})" in message and "on_release" in message, message
  assert "Array" not in message  # not the parameter tree (the KeyError it replaces printed it all)


@pytest.mark.parametrize("where", ["buffer", "inner"])
def test_on_release_refuses_two_version_owners_at_init(where):
  two = optax.chain(jaxsync.adaptive_k(max_k=2), jaxsync.ordered_momentum(0.05, num_workers=1))
  buffer, inner = (two, optax.sgd(0.1)) if where == "buffer" else (jaxsync.adaptive_k(max_k=2), two)
  tx = jaxsync.on_release(buffer, inner)
  with pytest.raises(
    ValueError, match=rf"^on_release: {where} holds 2 rules .*\(adaptive_k, ordered_momentum\)"
  ):
    tx.init(jnp.zeros(3))


def test_one_owner_with_stateless_and_optax_neighbours_is_accepted():
  tx = optax.chain(
    optax.clip_by_global_norm(1.0),
    jaxsync.on_release(jaxsync.adaptive_k(max_k=2), jaxsync.ordered_momentum(0.1, num_workers=1)),
    optax.scale(1.0),
  )
  state = tx.init(jnp.zeros(2))
  assert int(jaxsync.server_version(state)) == 0
  assert jaxsync.server_version(optax.chain(optax.adam(0.1), optax.scale(1.0)).init(jnp.zeros(2))) is None


def test_the_issue_composition_runs_and_its_version_is_the_buffers():
  """on_release(adaptive_k(max_k=1), ordered_momentum) with version=server_version(state): the
  issue's KeyError. The version is the buffer's releases; the inner counts the same releases itself."""
  tx = jaxsync.on_release(jaxsync.adaptive_k(max_k=1), jaxsync.ordered_momentum(0.05, 0.9, num_workers=1))

  @jax.jit
  def step(w, state, g):
    u, state = tx.update(g, state, w, version=jaxsync.server_version(state))
    return apply(w, u), state

  w = jnp.ones(3)
  state = tx.init(w)
  for _ in range(5):
    w, state = step(w, state, w)
  assert int(jaxsync.server_version(state)) == 5
  assert int(state.buffer.count) == int(state.inner.count) == 5
  assert int(state.inner.invalid_version_count) == 0 and int(state.inner.last_delay) == 0


def test_ordered_momentum_after_adaptive_k_is_heavy_ball_on_the_released_means():
  """Tests that never pass (theta -> 0): every release is the mean of max_k fresh gradients, and OrMo
  with all-fresh gradients, K = 1, is heavy-ball momentum: SGD with momentum on the means (NumPy)."""
  m, beta, eta = 3, 0.9, 0.05
  buffer = jaxsync.adaptive_k(momentum=0.0, theta=1e-6, max_k=m)
  tx = jaxsync.on_release(buffer, jaxsync.ordered_momentum(eta, beta, num_workers=1))
  update = jit_update(tx)
  rng = np.random.default_rng(0)
  w = jnp.array([1.0, -1.0, 2.0])
  ref, velocity = np.asarray(w, np.float64), np.zeros(3)
  state = tx.init(w)
  for step in range(12):
    grads = [(np.asarray(w) + rng.normal(scale=0.3, size=3)).astype(np.float32) for _ in range(m)]
    for g in grads:
      u, state = update(g, state, w, {"version": jaxsync.server_version(state)})
      w = apply(w, u)
    velocity = beta * velocity + eta * np.mean(grads, axis=0)  # form A: u <- beta u + eta g; w <- w - u
    ref = ref - velocity
    np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-6)
    assert int(jaxsync.server_version(state)) == step + 1 == int(state.inner.count)


def _digits():
  digits = load_digits()
  x = (digits.data / 16.0).astype(np.float32)
  y = digits.target.astype(np.int32)
  order = np.random.default_rng(0).permutation(len(x))
  return jnp.asarray(x[order]), jnp.asarray(y[order])


def _train_async(tx, num_workers=4, arrivals=1200, batch=32):
  """Softmax regression on digits, K workers in round robin, each reply at once with the new
  parameters and jaxsync.server_version(state); returns the parameters and the final state."""
  x, y = _digits()
  x_train, y_train = x[:1400], y[:1400]

  def loss(w, xb, yb):
    logits = xb @ w["kernel"] + w["bias"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

  def body(carry, t):
    w, state, pulled, versions = carry
    i = t % num_workers
    start = (t * batch) % (x_train.shape[0] - batch)
    xb = jax.lax.dynamic_slice_in_dim(x_train, start, batch)
    yb = jax.lax.dynamic_slice_in_dim(y_train, start, batch)
    g = jax.grad(loss)(jax.tree.map(lambda p: p[i], pulled), xb, yb)
    u, state = tx.update(g, state, w, version=versions[i])
    w = optax.apply_updates(w, u)
    pulled = jax.tree.map(lambda p, n: p.at[i].set(n), pulled, w)
    versions = versions.at[i].set(jaxsync.server_version(state))
    return (w, state, pulled, versions), None

  w0 = {"kernel": jnp.zeros((64, 10)), "bias": jnp.zeros(10)}
  pulled = jax.tree.map(lambda p: jnp.broadcast_to(p, (num_workers, *p.shape)), w0)
  carry = (w0, tx.init(w0), pulled, jnp.zeros(num_workers, jnp.int32))
  (w, state, _, _), _ = jax.jit(lambda c: jax.lax.scan(body, c, jnp.arange(arrivals)))(carry)
  logits = x[1400:] @ w["kernel"] + w["bias"]
  return w, state, float(jnp.mean(jnp.argmax(logits, -1) == y[1400:]))


def test_ordered_momentum_inside_on_release_trains_asynchronously_as_optax_sgd_does():
  """The composition trains on digits with stale arrivals, and gives the parameters of its known-good
  equivalent, optax.sgd with momentum inside the same buffer (the inner sees fresh releases only)."""
  buffer = lambda: jaxsync.adaptive_k(momentum=0.0, max_k=4)  # noqa: E731
  ormo = jaxsync.on_release(buffer(), jaxsync.ordered_momentum(0.1, 0.9, num_workers=1))
  sgd = jaxsync.on_release(buffer(), optax.sgd(0.1, momentum=0.9))
  w, state, accuracy = _train_async(ormo)
  w_sgd, sgd_state, accuracy_sgd = _train_async(sgd)
  assert accuracy > 0.9, accuracy
  released = int(jaxsync.server_version(state))
  assert released == int(jaxsync.server_version(sgd_state)) == int(state.inner.count) > 100
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4), w, w_sgd)
  assert abs(accuracy - accuracy_sgd) <= 0.01
