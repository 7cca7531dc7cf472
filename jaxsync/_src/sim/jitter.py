"""The compute-time noise: ``Gamma(shape, 1/shape)`` draws (mean 1) as pure functions of (seed, worker, step)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

_GAMMA_CANDIDATES = 4


def _mix32(x: jax.Array) -> jax.Array:
  """Wellons' lowbias32 integer hash: a bijection of uint32 with good avalanche."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def _uniforms(seed: jax.Array, worker: jax.Array, step: jax.Array, count: int) -> jax.Array:
  """``count`` uniforms in (0, 1) from a counter-based hash of (seed, worker, step).

  Cheaper than threefry inside a compiled event loop (a few fused integer ops
  instead of several hash rounds per draw); these numbers only jitter
  simulated compute times, they are not used for anything statistical.
  """
  h = _mix32(seed[0] ^ _mix32(worker.astype(jnp.uint32) + seed[1] * jnp.uint32(0x9E3779B9)))
  h = _mix32(h ^ _mix32(step.astype(jnp.uint32) * jnp.uint32(0x85EBCA6B) + jnp.uint32(1)))
  bits = _mix32(h + jnp.arange(1, count + 1, dtype=jnp.uint32) * jnp.uint32(0x27D4EB2D))
  return ((bits >> 8).astype(jnp.float32) + 0.5) * (1.0 / (1 << 24))


def unit_gamma(seed: jax.Array, worker: jax.Array, step: jax.Array, shape: float) -> jax.Array:
  r"""One draw of ``Gamma(shape, 1/shape)`` (mean 1), loop-free, from (seed, worker, step).

  Marsaglia and Tsang's method (ACM TOMS 2000) with ``d = a - 1/3``,
  ``c = 1/sqrt(9d)``: for ``z ~ N(0, 1)``, ``u ~ U(0, 1)`` and
  ``v = (1 + c z)^3``, accept ``d v`` when ``v > 0`` and
  ``log u < z^2/2 + d - d v + d log v``. ``jax.random.gamma`` loops until
  acceptance (a ``while_loop`` inside every simulated event); here four
  candidates are drawn at once (normals by Box-Muller) and the first accepted
  one is kept. The acceptance rate is above 0.95 for ``a >= 1`` (0.99 and up
  for the usual shapes), so all four fail with probability below ``7e-6``,
  and then the last candidate is used. Shapes below 1 use
  ``Gamma(a) = Gamma(a + 1) U^{1/a}``.

  Args:
    seed: a ``uint32[2]``.
    worker: the worker's id.
    step: the worker's step.
    shape: the Gamma shape ``a > 0``.

  Returns:
    A float32 scalar with mean 1 over (worker, step).
  """
  boost = shape < 1.0
  a = shape + 1.0 if boost else shape
  d = a - 1.0 / 3.0
  c = 1.0 / math.sqrt(9.0 * d)
  n = _GAMMA_CANDIDATES
  u = _uniforms(seed, worker, step, 2 * n + 1)
  radius = jnp.sqrt(-2.0 * jnp.log(u[: n // 2]))
  angle = 2.0 * math.pi * u[n // 2 : n]
  z = jnp.concatenate([radius * jnp.cos(angle), radius * jnp.sin(angle)])
  accept_u = u[n : 2 * n]
  v = (1.0 + c * z) ** 3
  safe_v = jnp.where(v > 0, v, 1.0)
  accept = (v > 0) & (jnp.log(accept_u) < 0.5 * z * z + d - d * safe_v + d * jnp.log(safe_v))
  first = jnp.argmax(accept)
  draw = jnp.where(accept.any(), d * safe_v[first], d * safe_v[-1])
  if boost:
    draw = draw * u[2 * n] ** (1.0 / shape)
  return draw / shape
