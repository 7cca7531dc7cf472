"""The simulator's clock: compute times, links, and the cost of every exchange."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsync._src import common

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
    common.check_real("Link", "latency", self.latency, low=0.0)
    common.check_real("Link", "bandwidth", self.bandwidth, low=0.0, low_open=True)

  def transfer(self, num_bytes: float) -> float:
    """Seconds to move ``num_bytes`` without latency."""
    return num_bytes / self.bandwidth


# Ethernet-class latencies for 1 and 10 Gbit/s, InfiniBand-class for 100 Gbit/s:
# the three clusters of seed 000 (spec §16).
LINK_PRESETS: dict[str, Link] = {
  "1gbps": Link(latency=50e-6, bandwidth=1e9 / 8),
  "10gbps": Link(latency=20e-6, bandwidth=10e9 / 8),
  "100gbps": Link(latency=2e-6, bandwidth=100e9 / 8),
}


def link(spec: str | Link) -> Link:
  """A :class:`Link` from a preset name (``1gbps``, ``10gbps``, ``100gbps``) or a Link."""
  if isinstance(spec, Link):
    return spec
  if not isinstance(spec, str) or spec not in LINK_PRESETS:
    raise common.invalid("link", "preset", spec, f"one of {sorted(LINK_PRESETS)} or a jaxsync.sim.Link")
  return LINK_PRESETS[spec]


def compute_time_from_flops(flops_per_sample: float, batch_size: int, flops_per_second: float) -> float:
  """Mean seconds of one worker-step: forward plus backward, ``3 F b / R``.

  A backward pass costs about twice the forward pass, so one gradient of a
  ``b``-sample batch of a model with ``F`` forward FLOPs per sample costs
  ``3 F b`` FLOPs; at a sustained ``R`` FLOP/s it takes ``3 F b / R`` seconds.
  """
  common.check_real("compute_time_from_flops", "flops_per_sample", flops_per_sample, low=0.0, low_open=True)
  common.check_int("compute_time_from_flops", "batch_size", batch_size)
  common.check_real("compute_time_from_flops", "flops_per_second", flops_per_second, low=0.0, low_open=True)
  return 3.0 * flops_per_sample * batch_size / flops_per_second


def message_bytes(params: Any) -> int:
  """Bytes of one message carrying a full model or gradient shaped like ``params``."""
  return int(sum(np.dtype(x.dtype).itemsize * math.prod(x.shape) for x in jax.tree.leaves(params)))


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
  arrival at a time in ``apply_time`` seconds. That queue is what makes a
  parameter server the bottleneck of many fast workers.

  **Collectives** over ``P`` workers (``G`` per group for the hierarchical form,
  groups joined by ``link``, members of a group by ``intra_link``):

  .. math::

    T_{ring}(P) &= 2 (P-1) \left(l + \frac{n}{P B}\right) \\
    T_{hier}(P, G) &= \underbrace{(G-1)\left(l_i + \frac{n}{G B_i}\right)}_{\text{reduce}}
        + T_{ring}(P/G) + \underbrace{(G-1)\left(l_i + \frac{n}{G B_i}\right)}_{\text{broadcast}} \\
    T_{ps}(P) &= 2 \left(l + \frac{P n}{B}\right) + t_{apply}

  where ``T_ps`` is a synchronous round through a parameter server: ``P`` pushes
  and ``P`` replies through its interface.

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
    apply_time: seconds the server takes to apply one arrival, ``>= 0``.
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

  def __post_init__(self):
    common.check_int(_WHAT, "num_workers", self.num_workers)
    common.check_real(_WHAT, "compute_time", self.compute_time, low=0.0, low_open=True)
    if self.jitter_shape is not None:
      common.check_real(_WHAT, "jitter_shape", self.jitter_shape, low=0.0, low_open=True)
    common.check_real(_WHAT, "slow_fraction", self.slow_fraction, low=0.0, high=1.0)
    common.check_real(_WHAT, "slowdown", self.slowdown, low=1.0)
    inter = link(self.link)
    object.__setattr__(self, "link", inter)
    if self.intra_link is None:
      intra = Link(latency=inter.latency / 10, bandwidth=inter.bandwidth * 10)
    else:
      intra = link(self.intra_link)
    object.__setattr__(self, "intra_link", intra)
    if self.message_bytes is not None:
      common.check_int(_WHAT, "message_bytes", self.message_bytes, low=0)
    common.check_real(_WHAT, "apply_time", self.apply_time, low=0.0)
    if self.compute_times is not None:
      times = tuple(self.compute_times)
      if len(times) != self.num_workers:
        raise common.invalid(
          _WHAT, "compute_times", self.compute_times, f"{self.num_workers} positive numbers (one per worker)"
        )
      for t in times:
        common.check_real(_WHAT, "compute_times[i]", t, low=0.0, low_open=True)
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

  def sample_compute(self, key: jax.Array, workers: jax.Array, steps: jax.Array) -> jax.Array:
    """Compute times of the given workers' next steps; a pure function of (key, worker, step)."""
    means = jnp.asarray(self.mean_compute_times())[workers]
    if self.jitter_shape is None:
      return means

    def one(w, s):
      k = jax.random.fold_in(jax.random.fold_in(key, w), s)
      return jax.random.gamma(k, self.jitter_shape) / self.jitter_shape

    return means * jax.vmap(one)(workers, steps)

  # Costs of exchanges, in seconds (Python floats: the topology is static).

  def message_time(self) -> float:
    """``l + n/B``: one push or one reply over ``link``."""
    return self.link.latency + self.link.transfer(self._bytes())

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

  def parameter_server_round_time(self, participants: int) -> float:
    """``2 (l + P n/B) + t_apply``: a synchronous round through one server."""
    return 2 * (self.link.latency + participants * self.transfer_time()) + self.apply_time
