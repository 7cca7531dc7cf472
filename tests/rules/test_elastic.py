"""EASGD, EAMSGD and EA-wild (spec §12, §13)."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsync

from helpers import apply, jit_update, quadratic


def test_one_worker_without_elastic_force_is_sgd():
  _, grad = quadratic([1.0, 5.0])
  tx = jaxsync.easgd_worker(0.1, moving_rate=0.0)
  ref = optax.sgd(0.1)
  update, ref_update = jit_update(tx), jit_update(ref)
  x = r = jnp.array([1.0, -1.0])
  center = jnp.array([100.0, 100.0])  # irrelevant when alpha = 0
  state, ref_state = tx.init(x), ref.init(r)
  for _ in range(30):
    u, state = update(grad(x), state, x, {"center": center})
    v, ref_state = ref_update(grad(r), ref_state, r, {})
    x, r = apply(x, u), apply(r, v)
    np.testing.assert_allclose(x, r, rtol=1e-6)


def test_eamsgd_without_elastic_force_is_nesterov_sgd():
  """x <- x + v, v <- delta v - eta g(x + delta v): optax's Nesterov at the look-ahead point."""
  _, grad = quadratic([1.0, 5.0])
  eta, delta = 0.05, 0.9
  tx = jaxsync.easgd_worker(eta, moving_rate=0.0, momentum=delta)
  ref = optax.sgd(eta, momentum=delta, nesterov=True)
  update, ref_update = jit_update(tx), jit_update(ref)
  x = r = jnp.array([1.0, -1.0])
  state, ref_state = tx.init(x), ref.init(r)
  for _ in range(30):
    point = jaxsync.look_ahead(x, state)
    u, state = update(grad(point), state, x, {"center": x})
    v, ref_state = ref_update(grad(r), ref_state, r, {})
    x, r = apply(x, u), apply(r, v)
    # optax's Nesterov iterate is the gradient point x + delta v of Sutskever's form.
    np.testing.assert_allclose(jaxsync.look_ahead(x, state), r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("momentum", [0.0, 0.99])
def test_elastic_exchange_conserves_worker_plus_center(momentum):
  worker = jaxsync.easgd_worker(0.1, moving_rate=0.3, momentum=momentum)
  center_rule = jaxsync.easgd_center(0.3)
  x, center = jnp.array([2.0, -1.0]), jnp.array([0.5, 0.5])
  # Zero gradient: only the exchange moves anything.
  u, wstate = jit_update(worker)(jnp.zeros(2), worker.init(x), x, {"center": center})
  e, _ = jit_update(center_rule)(x, center_rule.init(center), center, {})
  assert bool(wstate.exchanged)
  np.testing.assert_allclose(apply(x, u) + apply(center, e), x + center, rtol=1e-6)
  np.testing.assert_allclose(e, 0.3 * (x - center), rtol=1e-6)


def test_exchange_happens_every_period_steps():
  tx = jaxsync.easgd_worker(0.1, moving_rate=0.5, period=3)
  update = jit_update(tx)
  x, state, flags = jnp.array([1.0]), tx.init(jnp.array([1.0])), []
  for _ in range(7):
    _, state = update(jnp.zeros(1), state, x, {"center": jnp.zeros(1)})
    flags.append(bool(state.exchanged))
  assert flags == [True, False, False, True, False, False, True]


def test_ea_wild_sequential_arrivals_equal_locked_easgd():
  """Conflict-free arrivals (the read is the current centre) == async EASGD with tau = 1."""
  _, grad = quadratic([1.0, 3.0])
  p, alpha, eta = 3, 0.9 / 3, 0.05
  worker = jaxsync.easgd_worker(eta, moving_rate=alpha)
  locked, wild = jaxsync.easgd_center(alpha), jaxsync.ea_wild_center(alpha)
  worker_update, locked_update, wild_update = map(jit_update, (worker, locked, wild))
  xs = [jnp.array([1.0, 1.0]) * (i + 1) for i in range(p)]
  states = [worker.init(x) for x in xs]
  c_locked = c_wild = jnp.zeros(2)
  s_locked, s_wild = locked.init(c_locked), wild.init(c_wild)
  for t in range(300):
    i = t % p
    e_locked, s_locked = locked_update(xs[i], s_locked, c_locked, {})
    e_wild, s_wild = wild_update(xs[i], s_wild, c_wild, {"center_read": c_wild})
    u, states[i] = worker_update(grad(xs[i]), states[i], xs[i], {"center": c_locked})
    xs[i] = apply(xs[i], u)
    c_locked, c_wild = apply(c_locked, e_locked), apply(c_wild, e_wild)
    np.testing.assert_allclose(c_wild, c_locked, rtol=1e-6)
  assert float(jnp.abs(c_locked).max()) < 0.05  # the centre converges to the optimum 0
  assert int(s_wild.count) == 300


def test_ea_wild_stale_read_is_added_without_a_lock():
  wild = jaxsync.ea_wild_center(0.5)
  center = jnp.array([1.0])
  e, _ = jit_update(wild)(jnp.array([3.0]), wild.init(center), center, {"center_read": jnp.array([0.0])})
  np.testing.assert_allclose(apply(center, e), [2.5])  # 1 + 0.5 * (3 - 0): the stale read counts


def test_zero_elastic_force_keeps_the_center_constant():
  wild = jaxsync.ea_wild_center(0.0)
  center = jnp.array([1.0, 2.0])
  e, _ = jit_update(wild)(jnp.array([9.0, 9.0]), wild.init(center), center, {"center_read": center})
  np.testing.assert_array_equal(apply(center, e), center)


def test_synchronous_easgd_is_the_sum_of_lock_free_increments_against_the_old_centre():
  """w_c <- w_c + alpha sum_i (x_i - w_c), all with old values (spec §12)."""
  wild = jaxsync.ea_wild_center(0.2)
  center = jnp.array([0.0, 1.0])
  xs = [jnp.array([1.0, 1.0]), jnp.array([2.0, -1.0]), jnp.array([0.0, 4.0])]
  update = jit_update(wild)
  state, new_center = wild.init(center), center
  for x in xs:
    e, state = update(x, state, new_center, {"center_read": center})
    new_center = apply(new_center, e)
  np.testing.assert_allclose(new_center, center + 0.2 * sum(x - center for x in xs), rtol=1e-6)


def test_required_extra_args():
  with pytest.raises(ValueError, match="center"):
    tx = jaxsync.easgd_worker(0.1, moving_rate=0.1)
    tx.update(jnp.ones(1), tx.init(jnp.ones(1)), jnp.ones(1))
  with pytest.raises(ValueError, match="center_read"):
    tx = jaxsync.ea_wild_center(0.1)
    tx.update(jnp.ones(1), tx.init(jnp.ones(1)))  # neither a read nor the current centre


def test_lock_free_centre_without_a_read_is_a_fresh_read_the_locked_centre():
  """center_read omitted: the worker read the current centre, and EA-wild is EASGD's centre."""
  wild, locked = jaxsync.ea_wild_center(0.3), jaxsync.easgd_center(0.3)
  center = jnp.array([0.5, -1.0])
  x = jnp.array([2.0, 1.0])
  e, _ = jit_update(wild)(x, wild.init(center), center, {})
  expected, _ = jit_update(locked)(x, locked.init(center), center, {})
  np.testing.assert_array_equal(e, expected)
  np.testing.assert_allclose(apply(center, e), center + 0.3 * (x - center), rtol=1e-6)


def test_synchronous_easgd_without_elastic_force_is_independent_sgd_runs():
  """rho = 0: p workers never feel the centre, each is plain SGD; the centre stays put."""
  _, grad = quadratic([1.0, 4.0])
  p = 3
  worker, center_rule = jaxsync.easgd_worker(0.1, moving_rate=0.0), jaxsync.ea_wild_center(0.0)
  worker_update, center_update = jit_update(worker), jit_update(center_rule)
  sgd_update = jit_update(optax.sgd(0.1))
  xs = [jnp.array([1.0, -1.0]) * (i + 1) for i in range(p)]
  refs, states, sgd_states = list(xs), [worker.init(x) for x in xs], [optax.sgd(0.1).init(x) for x in xs]
  center, center_state = jnp.array([5.0, 5.0]), center_rule.init(jnp.zeros(2))
  for _ in range(10):
    old_center = center
    for i in range(p):
      e, center_state = center_update(xs[i], center_state, center, {"center_read": old_center})
      center = apply(center, e)
      u, states[i] = worker_update(grad(xs[i]), states[i], xs[i], {"center": old_center})
      xs[i] = apply(xs[i], u)
      v, sgd_states[i] = sgd_update(grad(refs[i]), sgd_states[i], refs[i], {})
      refs[i] = apply(refs[i], v)
      np.testing.assert_allclose(xs[i], refs[i], rtol=1e-6)
  np.testing.assert_array_equal(center, [5.0, 5.0])


def test_off_exchange_steps_do_not_read_the_centre():
  tx = jaxsync.easgd_worker(0.1, moving_rate=0.5, period=2)
  update = jit_update(tx)
  x = jnp.array([1.0])
  _, state = update(jnp.zeros(1), tx.init(x), x, {"center": jnp.zeros(1)})
  u, state = update(jnp.ones(1), state, x, {"center": jnp.array([jnp.inf])})
  assert not bool(state.exchanged)
  np.testing.assert_allclose(u, [-0.1])
