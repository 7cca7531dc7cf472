"""The simulator's clock: compute times, links, and the cost of every exchange."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsync._src.core import validation

_WHAT = "TimeModel"


@dataclasses.dataclass(frozen=True)
class Link:
  """A network link: a fixed latency plus a transfer at a bandwidth.

  Sending ``n`` bytes takes ``latency + n / bandwidth`` seconds.

  Attributes:
    latency: seconds per message, ``>= 0``.
    bandwidth: bytes per second, ``> 0``.
  """

  latency: float
  bandwidth: float

  def __post_init__(self):
    validation.check_real("Link", "latency", self.latency, low=0.0)
    validation.check_real("Link", "bandwidth", self.bandwidth, low=0.0, low_open=True)

  def transfer(self, num_bytes: float) -> float:
    """Seconds to move ``num_bytes`` without latency."""
    return num_bytes / self.bandwidth


# Ethernet-class latencies for 1 and 10 Gbit/s, InfiniBand-class for 100 Gbit/s:
# the three clusters of the adaptive-k paper (Zhang, Ji, Wang, JPDC 2022; docs/algorithms.md §16).
LINK_PRESETS: dict[str, Link] = {
  "1gbps": Link(latency=50e-6, bandwidth=1e9 / 8),
  "10gbps": Link(latency=20e-6, bandwidth=10e9 / 8),
  "100gbps": Link(latency=2e-6, bandwidth=100e9 / 8),
}


# Effective memory bandwidth of a server applying an update (bytes read + written per second), for
# ServerTraffic: a typical server's 10 GB/s; 3 GB/s is what one XLA:CPU thread measured for
# optax.sgd(momentum) on 10M parameters here, 30 GB/s a many-core server's.
SERVER_PRESETS: dict[str, float] = {"3GB/s": 3e9, "10GB/s": 10e9, "30GB/s": 30e9}


def server_bandwidth(spec: str | float | None) -> float | None:
  """Bytes per second from a preset (``3GB/s``, ``10GB/s``, ``30GB/s``), a number, or None (no memory cost)."""
  if spec is None:
    return None
  if isinstance(spec, str):
    if spec not in SERVER_PRESETS:
      raise validation.invalid(
        _WHAT, "server_bandwidth", spec, f"one of {sorted(SERVER_PRESETS)}, bytes per second, or None"
      )
    return SERVER_PRESETS[spec]
  return validation.check_real(_WHAT, "server_bandwidth", spec, low=0.0, low_open=True)


def link(spec: str | Link) -> Link:
  """A :class:`Link` from a preset name (``1gbps``, ``10gbps``, ``100gbps``) or a Link."""
  if isinstance(spec, Link):
    return spec
  if not isinstance(spec, str) or spec not in LINK_PRESETS:
    raise validation.invalid("link", "preset", spec, f"one of {sorted(LINK_PRESETS)} or a jaxsync.sim.Link")
  return LINK_PRESETS[spec]


def compute_time_from_flops(flops_per_sample: float, batch_size: int, flops_per_second: float) -> float:
  """Mean seconds of one worker-step: forward plus backward, ``3 F b / R``.

  A backward pass costs about twice the forward pass, so one gradient of a
  ``b``-sample batch of a model with ``F`` forward FLOPs per sample costs
  ``3 F b`` FLOPs; at a sustained ``R`` FLOP/s it takes ``3 F b / R`` seconds.
  """
  validation.check_real(
    "compute_time_from_flops", "flops_per_sample", flops_per_sample, low=0.0, low_open=True
  )
  validation.check_int("compute_time_from_flops", "batch_size", batch_size)
  validation.check_real(
    "compute_time_from_flops", "flops_per_second", flops_per_second, low=0.0, low_open=True
  )
  return 3.0 * flops_per_sample * batch_size / flops_per_second


def message_bytes(params: Any) -> int:
  """Bytes of one message carrying a full model or gradient shaped like ``params``."""
  return int(sum(np.dtype(x.dtype).itemsize * math.prod(x.shape) for x in jax.tree.leaves(params)))


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
  ``Gamma(a) = Gamma(a + 1) U^{1/a}``. ``seed`` is a ``uint32[2]``.
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


@dataclasses.dataclass(frozen=True)
class TimeModel:
  r"""How long everything takes in the simulated cluster.

  **Compute.** Worker ``i`` takes ``c_i X`` seconds per gradient, with mean
  ``c_i = compute_time`` (``x slowdown`` for the slow workers: the last
  ``round(slow_fraction K)`` ids) and ``X ~ Gamma(jitter_shape, 1/jitter_shape)``
  (mean 1, coefficient of variation ``1/sqrt(jitter_shape)``; SMEGA²'s simulator
  uses shape 100). ``jitter_shape=None`` makes compute deterministic.

  **Messages.** A message of ``n = message_bytes`` bytes over a link of latency
  ``l`` and bandwidth ``B`` takes ``l + n/B``. The parameter server's network
  interface moves one message at a time in each direction (pushes queue on
  arrival, replies queue on departure), and under a lock the server applies one
  arrival at a time. That queue is what makes a parameter server the
  bottleneck of many fast workers.

  **The server's own time.** Applying an arrival costs the server
  ``apply_time`` plus its memory traffic at ``server_bandwidth`` ``M``: a
  strategy declares (``Strategy.server_traffic``) how many parameter-sized
  arrays it reads and writes per accepted arrival (``a``: accumulating it) and
  per update it releases (``r``), so

  .. math::

    t_{server} = t_{apply} + \frac{(a + r\,[\text{released}])\, n}{M}

  and arrivals queue behind it (Zhang, Ji, Wang, JPDC 2022, §3.6: on a fast
  network the server's memory bandwidth, not the network, bounds ASP, and
  buffering k gradients per update relieves it). A locked server receives a
  push and applies it in one loop, as a single-threaded server does (and the
  EASGD authors' ``mpiT`` server), so its receive side is free again only when
  the update is applied: busy all the time, it takes ``k`` gradients per update
  at ``1 / (n/B + t_apply + (a + r/k) n / M)`` gradients per second. EA-wild's
  lock-free centre frees the receive side as soon as a push is in. A synchronous round through a
  server pays ``k a + r``; an all-reduce pays ``r`` on each worker, in parallel.

  **Collectives** over ``P`` workers (``G`` per group for the hierarchical form,
  groups joined by ``link``, members of a group by ``intra_link``):

  .. math::

    T_{ring}(P) &= 2 (P-1) \left(l + \frac{n}{P B}\right) \\
    T_{hier}(P, G) &= \underbrace{(G-1)\left(l_i + \frac{n}{G B_i}\right)}_{\text{reduce}}
        + T_{ring}(P/G) + \underbrace{(G-1)\left(l_i + \frac{n}{G B_i}\right)}_{\text{broadcast}} \\
    T_{ps}(P, k) &= 2 l + \frac{(k + P)\, n}{B} + t_{apply}

  where ``T_ps`` is a synchronous round through a parameter server: ``k``
  pushes (``P``, or fastest-k's ``k``) and ``P`` replies through its interface.

  Attributes:
    num_workers: ``K >= 1``.
    compute_time: mean seconds of one worker-step (a gradient of one batch),
      ``> 0``; see :func:`compute_time_from_flops`.
    jitter_shape: Gamma shape ``> 0`` of the compute-time noise, or ``None``.
    slow_fraction: fraction of slow workers in ``[0, 1]``.
    slowdown: the slow workers' time factor, ``>= 1``.
    link: the inter-machine link, a :class:`Link` or a preset name.
    intra_link: the link inside a group or node (hierarchical all-reduce,
      InHAD's node-local aggregation, EA-wild groups); default 10x the
      bandwidth of ``link`` at a tenth of its latency.
    message_bytes: bytes of one model or gradient message; ``None`` means
      "from the model's parameters" (the simulator fills it in).
    apply_time: fixed seconds the server takes per arrival, ``>= 0``.
    server_bandwidth: the server's effective memory bandwidth for applying
      updates, bytes per second, or a preset of :data:`SERVER_PRESETS`
      (``"10GB/s"``: a typical server); ``None`` (default): memory traffic
      costs no time.
    compute_times: optional explicit per-worker mean compute times (length
      ``K``), replacing ``compute_time``, ``slow_fraction`` and ``slowdown``.
  """

  num_workers: int
  compute_time: float = 1.0
  jitter_shape: float | None = 100.0
  slow_fraction: float = 0.0
  slowdown: float = 1.0
  link: Link | str = "10gbps"
  intra_link: Link | str | None = None
  message_bytes: int | None = None
  apply_time: float = 0.0
  compute_times: Sequence[float] | None = None
  server_bandwidth: float | str | None = None

  def __post_init__(self):
    validation.check_int(_WHAT, "num_workers", self.num_workers)
    validation.check_real(_WHAT, "compute_time", self.compute_time, low=0.0, low_open=True)
    if self.jitter_shape is not None:
      validation.check_real(_WHAT, "jitter_shape", self.jitter_shape, low=0.0, low_open=True)
    validation.check_real(_WHAT, "slow_fraction", self.slow_fraction, low=0.0, high=1.0)
    validation.check_real(_WHAT, "slowdown", self.slowdown, low=1.0)
    inter = link(self.link)
    object.__setattr__(self, "link", inter)
    if self.intra_link is None:
      intra = Link(latency=inter.latency / 10, bandwidth=inter.bandwidth * 10)
    else:
      intra = link(self.intra_link)
    object.__setattr__(self, "intra_link", intra)
    if self.message_bytes is not None:
      validation.check_int(_WHAT, "message_bytes", self.message_bytes, low=0)
    validation.check_real(_WHAT, "apply_time", self.apply_time, low=0.0)
    object.__setattr__(self, "server_bandwidth", server_bandwidth(self.server_bandwidth))
    if self.compute_times is not None:
      times = tuple(self.compute_times)
      if len(times) != self.num_workers:
        raise validation.invalid(
          _WHAT, "compute_times", self.compute_times, f"{self.num_workers} positive numbers (one per worker)"
        )
      for t in times:
        validation.check_real(_WHAT, "compute_times[i]", t, low=0.0, low_open=True)
      object.__setattr__(self, "compute_times", times)

  @property
  def slow_workers(self) -> tuple[int, ...]:
    """The ids of the slow workers (the last ``round(slow_fraction K)``)."""
    if self.compute_times is not None:
      return ()
    n = round(self.slow_fraction * self.num_workers)
    return tuple(range(self.num_workers - n, self.num_workers))

  def mean_compute_times(self) -> np.ndarray:
    """Per-worker mean seconds of one worker-step, shape ``[K]``."""
    if self.compute_times is not None:
      return np.asarray(self.compute_times, np.float32)
    means = np.full([self.num_workers], self.compute_time, np.float32)
    means[list(self.slow_workers)] *= self.slowdown
    return means

  def with_message_bytes(self, params: Any) -> TimeModel:
    """This model with ``message_bytes`` taken from ``params`` when unset."""
    if self.message_bytes is not None:
      return self
    return dataclasses.replace(self, message_bytes=message_bytes(params))

  def _bytes(self) -> float:
    if self.message_bytes is None:
      raise ValueError(
        f"{_WHAT}: message_bytes=None; give it, or call with_message_bytes(params) first"
        " (the simulator does)."
      )
    return float(self.message_bytes)

  def sample_compute(self, seed: jax.Array, workers: jax.Array, steps: jax.Array) -> jax.Array:
    """Compute times of the given workers' next steps; a pure function of (seed, worker, step).

    ``seed`` is a ``uint32[2]`` (``jax.random.key_data`` of a key), so that a
    simulation state holds only plain arrays and checkpoints as such.
    """
    means = jnp.asarray(self.mean_compute_times())[workers]
    if self.jitter_shape is None:
      return means
    seed = jnp.asarray(seed, jnp.uint32).reshape(-1)[:2]
    return means * jax.vmap(lambda w, s: unit_gamma(seed, w, s, self.jitter_shape))(workers, steps)

  # Costs of exchanges, in seconds (Python floats: the topology is static).

  def message_time(self) -> float:
    """``l + n/B``: one push or one reply over ``link``."""
    return self.link.latency + self.link.transfer(self._bytes())

  def memory_time(self, arrays: float) -> float:
    """``arrays n / M``: seconds the server takes to read and write ``arrays`` parameter-sized arrays."""
    if self.server_bandwidth is None or not arrays:
      return 0.0
    return arrays * self._bytes() / self.server_bandwidth

  def transfer_time(self) -> float:
    """``n/B``: how long one message occupies the server's interface."""
    return self.link.transfer(self._bytes())

  def ring_allreduce_time(self, participants: int, over: Link | None = None) -> float:
    """``2 (P-1) (l + n/(P B))``: a bandwidth-optimal ring all-reduce."""
    over = self.link if over is None else over
    p = participants
    if p <= 1:
      return 0.0
    return 2 * (p - 1) * (over.latency + over.transfer(self._bytes()) / p)

  def hierarchical_allreduce_time(self, participants: int, group_size: int) -> float:
    """Intra-group reduce, ring all-reduce among the leaders, intra-group broadcast."""
    g = group_size
    leaders = participants // g
    intra = (
      (g - 1) * (self.intra_link.latency + self.intra_link.transfer(self._bytes()) / g) if g > 1 else 0.0
    )
    return 2 * intra + self.ring_allreduce_time(leaders)

  def parameter_server_round_time(self, participants: int, pushes: int | None = None) -> float:
    """``2 l + (k + P) n/B + t_apply``: ``k`` pushes (default ``P``) and ``P`` replies through one server."""
    pushes = participants if pushes is None else pushes
    return 2 * self.link.latency + (pushes + participants) * self.transfer_time() + self.apply_time
