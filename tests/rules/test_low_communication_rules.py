"""DiLoCo, Delayed Nesterov and DC-ASGD against NumPy references written from the equations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsync


def _grads(rng, n, shape=(5,)):
  return [rng.normal(size=shape).astype(np.float32) for _ in range(n)]


def test_diloco_equals_a_numpy_loop_of_inner_sgd_and_outer_nesterov():
  rng = np.random.default_rng(0)
  h, steps, lr, outer_lr, beta = 3, 10, 0.1, 0.7, 0.9
  grads = _grads(rng, steps)
  tx = jaxsync.diloco(optax.sgd(lr), period=h)
  x = jnp.asarray(rng.normal(size=5), jnp.float32)
  state = tx.init(x)
  # Reference: x moves by SGD; every h steps Delta = theta - x, Nesterov on theta, x = theta.
  ref_x, theta, buf = np.asarray(x, np.float64), np.asarray(x, np.float64), np.zeros(5)
  for t, g in enumerate(grads):
    u, state = tx.update(jnp.asarray(g), state, x)
    x = optax.apply_updates(x, u)
    ref_x = ref_x - lr * g
    if (t + 1) % h == 0:
      delta = theta - ref_x
      buf = beta * buf + delta
      theta = theta - outer_lr * (delta + beta * buf)
      ref_x = theta.copy()
    np.testing.assert_allclose(np.asarray(x), ref_x, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(state.anchor), theta, rtol=1e-5, atol=1e-6)
  assert int(state.count) == steps


def test_diloco_with_period_one_and_unit_outer_sgd_is_its_inner_optimizer():
  rng = np.random.default_rng(1)
  tx = jaxsync.diloco(optax.adam(0.01), optax.sgd(1.0), period=1)
  ref = optax.adam(0.01)
  x = y = jnp.asarray(rng.normal(size=5), jnp.float32)
  s, r = tx.init(x), ref.init(y)
  for g in _grads(rng, 6):
    u, s = tx.update(jnp.asarray(g), s, x)
    v, r = ref.update(jnp.asarray(g), r, y)
    x, y = optax.apply_updates(x, u), optax.apply_updates(y, v)
  np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)
  # The inner optimizer's moments survive the outer steps: Adam counted all six gradients.
  assert int(s.inner_state[0].count) == 6


def test_diloco_rejects_a_nonfinite_gradient_and_keeps_its_rounds():
  tx = jaxsync.diloco(optax.sgd(0.1), period=2)
  x = jnp.ones(3)
  state = tx.init(x)
  u, state = tx.update(jnp.array([1.0, jnp.nan, 1.0]), state, x)
  assert not np.asarray(u).any() and int(state.count) == 0 and int(state.nonfinite_count) == 1


def test_delayed_nesterov_equals_its_equations_and_with_delay_one_is_optax_nesterov():
  rng = np.random.default_rng(2)
  lr, beta, n, c = 0.3, 0.9, 3, 0.2
  grads = _grads(rng, 11)
  tx = jaxsync.delayed_nesterov(lr, beta, momentum_period=n, activation=c)
  w = jnp.zeros(5)
  state = tx.init(w)
  ref, m, d = np.zeros(5), np.zeros(5), np.zeros(5)
  for t, g in enumerate(grads):
    u, state = tx.update(jnp.asarray(g), state, w)
    w = optax.apply_updates(w, u)
    d = d + g
    if (t + 1) % n == 0:
      m = beta * m + d / n
      ref = ref - lr * ((1 - c * n + c) * beta * m + g / n)
      d = np.zeros(5)
    else:
      ref = ref - lr * (c * beta * m + g / n)
    np.testing.assert_allclose(np.asarray(w), ref, rtol=1e-5, atol=1e-6)
  one = jaxsync.delayed_nesterov(lr, beta, momentum_period=1)
  nesterov = optax.sgd(lr, beta, nesterov=True)
  a = b = jnp.zeros(5)
  sa, sb = one.init(a), nesterov.init(b)
  for g in grads:
    ua, sa = one.update(jnp.asarray(g), sa, a)
    ub, sb = nesterov.update(jnp.asarray(g), sb, b)
    a, b = optax.apply_updates(a, ua), optax.apply_updates(b, ub)
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("adaptive", [False, True])
def test_dc_asgd_equals_the_authors_update_on_a_stale_arrival_trace(adaptive):
  rng = np.random.default_rng(3)
  k, lr, lam, mu, eps = 3, 0.05, (2.0 if adaptive else 0.5), 0.95, 1e-7
  order = [0, 1, 2, 2, 0, 1, 1, 0, 2, 2, 1, 0]
  tx = jaxsync.dc_asgd(lr, lam, num_workers=k, adaptive=adaptive)
  w = jnp.asarray(rng.normal(size=4), jnp.float32)
  state = tx.init(w)
  ref = np.asarray(w, np.float64)
  backup = np.stack([ref] * k)
  ms = np.zeros((k, 4))
  pulled = np.stack([ref] * k)  # each worker's gradient is computed where it last pulled
  for m in order:
    g = np.sin(3.0 * pulled[m] + m).astype(np.float32)  # a gradient that depends on the pulled point
    u, state = tx.update(jnp.asarray(g), state, w, worker=m)
    w = optax.apply_updates(w, u)
    if adaptive:
      ms[m] = mu * ms[m] + (1 - mu) * g * g
      lam_t = lam / np.sqrt(ms[m] + eps)
    else:
      lam_t = lam
    ref = ref - lr * (g + lam_t * g * g * (ref - backup[m]))
    backup[m] = ref
    pulled[m] = np.asarray(w)
    np.testing.assert_allclose(np.asarray(w), ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(state.backups), backup, rtol=1e-5, atol=1e-6)


def test_dc_asgd_without_compensation_is_sgd_and_a_bad_worker_id_is_counted():
  tx = jaxsync.dc_asgd(0.1, 0.0, num_workers=2)
  w = jnp.ones(3)
  state = tx.init(w)
  u, state = tx.update(jnp.full(3, 2.0), state, w + 1.0, worker=1)  # moved since the pull: no compensation
  np.testing.assert_allclose(np.asarray(u), -0.2)
  u, state = tx.update(jnp.ones(3), state, w, worker=2)
  assert not np.asarray(u).any() and int(state.invalid_worker_count) == 1 and int(state.count) == 1


def _int4(x, block):
  """The int4 wire format in NumPy: per-block absmax scale, 7 levels each side."""
  flat = np.asarray(x, np.float64).reshape(-1)
  out = np.zeros_like(flat)
  for i in range(0, flat.size, block):
    part = flat[i : i + block]
    scale = np.abs(part).max() / 7 if np.abs(part).max() > 0 else 1.0
    out[i : i + block] = np.clip(np.round(part / scale), -7, 7) * scale
  return out.reshape(np.shape(x))


def test_streaming_diloco_equals_a_numpy_loop_of_fragments_overlap_mixing_and_int4():
  rng = np.random.default_rng(4)
  h_total, frags, tau, alpha, lr, outer_lr, beta, block = 4, 2, 1, 0.5, 0.1, 0.7, 0.9, 4
  shapes = {"a": (3,), "b": (5,)}  # two leaves: fragment 0 is "a", fragment 1 is "b"
  x = {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in shapes.items()}
  tx = jaxsync.diloco(
    optax.sgd(lr),
    period=h_total,
    fragments=frags,
    overlap=tau,
    mixing=alpha,
    quantize="int4",
    quantize_block=block,
  )
  state = tx.init(x)
  ref = {k: np.asarray(v, np.float64) for k, v in x.items()}
  theta = {k: v.copy() for k, v in ref.items()}
  buf = {k: np.zeros(s) for k, s in shapes.items()}
  pending = {}
  h = h_total // frags
  for count in range(1, 13):
    g = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    u, state = tx.update({k: jnp.asarray(v) for k, v in g.items()}, state, x)
    x = optax.apply_updates(x, u)
    ref = {k: ref[k] - lr * g[k] for k in ref}
    key = "ab"[((count - 1) // h) % frags]
    step_in_round = count - ((count - 1) // h) * h
    if step_in_round == h - tau:
      pending[key] = _int4(theta[key] - ref[key], block)
    if step_in_round == h:
      buf[key] = beta * buf[key] + pending[key]
      theta[key] = theta[key] - outer_lr * (pending[key] + beta * buf[key])
      ref[key] = (1 - alpha) * theta[key] + alpha * ref[key]
    for k in shapes:
      np.testing.assert_allclose(np.asarray(x[k]), ref[k], rtol=1e-5, atol=1e-5, err_msg=f"{k} at {count}")


def test_the_wire_formats_round_trip_and_count_their_bytes():
  from jaxsync._src.rules import quantize

  x = jnp.asarray(np.random.default_rng(5).normal(size=130), jnp.float32)
  np.testing.assert_allclose(
    np.asarray(quantize.quantized(x, "int4", 64)), _int4(x, 64), rtol=1e-6, atol=1e-7
  )
  assert (
    float(jnp.max(jnp.abs(quantize.quantized(x, "int8", 64) - x))) <= float(jnp.max(jnp.abs(x))) / 254 + 1e-6
  )
  assert quantize.quantized(x, "bfloat16", 64).dtype == jnp.float32
  # 130 values: float32 520 B; bfloat16 260; int8 130 + 3 scales of 4 B; int4 65 + 12.
  assert [quantize.wire_bytes(x, f, 64) for f in (None, "bfloat16", "int8", "int4")] == [520, 260, 142, 77]
  # What the wire carries: int4 integers two to a byte, each nibble q + 8; the scales beside them.
  codes = jnp.asarray([-7, 7, 0, -1, 3, -4], jnp.int8)
  packed = quantize.pack(codes, "int4")
  assert packed.dtype == jnp.uint8 and np.asarray(packed).tolist() == [1 | 15 << 4, 8 | 7 << 4, 11 | 4 << 4]
  np.testing.assert_array_equal(np.asarray(quantize.unpack(packed, "int4")), np.asarray(codes))
  padded = jnp.pad(x, (0, 62))  # three whole blocks
  for fmt in ("int4", "int8", "bfloat16"):
    values, scales = quantize.encode(padded, fmt, 64)
    assert scales.shape == ((0,) if fmt == "bfloat16" else (3,))
    sent = quantize.unpack(quantize.pack(values, fmt), fmt)
    np.testing.assert_array_equal(
      np.asarray(quantize.decode(sent, scales, fmt, 64))[:130], np.asarray(quantize.quantized(x, fmt, 64))
    )
  with pytest.raises(ValueError, match=r"quantize='fp4'.*'bfloat16', 'int8', 'int4'"):
    jaxsync.diloco(optax.sgd(0.1), period=4, quantize="fp4")
  with pytest.raises(ValueError, match=r"overlap=2.*\[0, 2\)"):
    jaxsync.diloco(optax.sgd(0.1), period=4, fragments=2, overlap=2)
  with pytest.raises(ValueError, match=r"fragments=3.*divisor"):
    jaxsync.diloco(optax.sgd(0.1), period=4, fragments=3)


@pytest.mark.parametrize("shape", [(64, 32), (8, 128), (3, 5, 64), (7, 9), (128,), (4, 16), (2, 3, 32)])
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_integer_formats_keep_a_leafs_shape_and_equal_the_wire_bit_for_bit(shape, fmt):
  """The simulated round trip views a leaf's blocks without flattening it (so a tensor-parallel parameter is not
  gathered); it must equal what the wire's encode / decode of the flattened leaf gives, bit for bit."""
  from jaxsync._src.rules import quantize

  x = 3.0 * jax.random.normal(jax.random.PRNGKey(0), shape)
  flat = jnp.pad(x.reshape(-1), (0, -x.size % 64))
  values, scales = quantize.encode(flat, fmt, 64)
  wire = quantize.decode(values, scales, fmt, 64)[: x.size].reshape(shape)
  np.testing.assert_array_equal(quantize.quantized({"x": x}, fmt, 64)["x"], wire)
