"""The simulator's clock: compute times, links, the server's interface, and the cost of every exchange.

Every cost of the simulated cluster is computed here; the engines ask for
them: the round engine for a round's exchange (:meth:`TimeModel.round_time`,
:meth:`TimeModel.round_messages`), the event engine for a unit's compute time
(:meth:`TimeModel.unit_compute_times`) and an arrival's exchange through the
server's queues (:meth:`TimeModel.exchange`, on a :class:`NetworkState`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsync._src.core import validation
from jaxsync._src.sim.jitter import unit_gamma
from jaxsync._src.strategies.strategy import Communication, Engine, Strategy, WorkerProtocol

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
# 100 Mbit/s with a wide-area 10 ms: the slow links between clusters or sites that the DiLoCo family
# (Douillard et al., 2023, 2025) is made for.
LINK_PRESETS: dict[str, Link] = {
  "100mbps": Link(latency=10e-3, bandwidth=100e6 / 8),
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
  """A :class:`Link` from a preset name (``100mbps``, ``1gbps``, ``10gbps``, ``100gbps``) or a Link."""
  if isinstance(spec, Link):
    return spec
  if not isinstance(spec, str) or spec not in LINK_PRESETS:
    raise validation.invalid("link", "preset", spec, f"one of {sorted(LINK_PRESETS)} or a jaxsync.sim.Link")
  return LINK_PRESETS[spec]


def _checked_absences(absences, num_workers: int) -> tuple[tuple[int, float, float], ...]:
  """``absences`` as ``(worker, start, end)`` triples, each checked: a worker id, ``0 <= start < end``."""
  checked = []
  for i, item in enumerate(absences):
    expected = f"(worker, start, end): a worker in [0, {num_workers}) and simulated seconds 0 <= start < end"
    if isinstance(item, dict):
      item = (item.get("worker"), item.get("start"), item.get("end"))
    try:
      worker, start, end = item
    except (TypeError, ValueError):
      raise validation.invalid(_WHAT, f"absences[{i}]", item, expected) from None
    if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < num_workers:
      raise validation.invalid(_WHAT, f"absences[{i}]", item, expected)
    start = validation.check_real(_WHAT, f"absences[{i}].start", start, low=0.0)
    end = validation.check_real(_WHAT, f"absences[{i}].end", end, low=0.0)
    if not start < end:
      raise validation.invalid(_WHAT, f"absences[{i}]", item, expected)
    checked.append((worker, start, end))
  return tuple(checked)


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


class NetworkState(NamedTuple):
  """The server's network interface between two arrivals, and the traffic so far (the event engine's).

  Attributes:
    nic_in: when the server's receive side is next free.
    nic_out: when the server's send side is next free.
    node_count: gradients summed at each node since the server last pulled
      them (InHAD; one node per worker elsewhere).
    inter_messages: full-size messages over the inter-machine link.
    intra_messages: full-size messages inside a node or an EA-wild group.
  """

  nic_in: jax.Array
  nic_out: jax.Array
  node_count: jax.Array
  inter_messages: jax.Array
  intra_messages: jax.Array


class Exchange(NamedTuple):
  """When one arrival's exchange is done (:meth:`TimeModel.exchange`).

  Attributes:
    server_time: when the server is done with the arrival (the event's time).
    receive_time: when a worker that gets a reply has it.
  """

  server_time: jax.Array
  receive_time: jax.Array


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
  bottleneck of many fast workers. Its interface moves ``B_s`` bytes per second
  (``server_link``; default ``link``'s ``B``): several workers' flows into one
  card can move less than one stream does (a queue overflows and the flows back
  off: incast), which ``jaxsync calibrate --link-senders`` measures.

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

  **Evaluations.** With ``eval_time`` ``e > 0``, an arrival after which the
  server evaluates holds it ``e`` more before its replies and its next receive
  (a real server evaluates inside its step); a synchronous round that
  evaluates ends ``e`` later on every worker.

  **Collectives** over ``P`` workers (``G`` per group for the hierarchical form,
  groups joined by ``link``, members of a group by ``intra_link``):

  .. math::

    T_{ring}(P) &= 2 (P-1) \left(l + \frac{n}{P B}\right) \\
    T_{hier}(P, G) &= \underbrace{(G-1)\left(l_i + \frac{n}{G B_i}\right)}_{\text{reduce}}
        + T_{ring}(P/G) + \underbrace{(G-1)\left(l_i + \frac{n}{G B_i}\right)}_{\text{broadcast}} \\
    T_{ps}(P, k) &= 2 l + \frac{(k + P)\, n}{B_s} + t_{apply}

  where ``T_ps`` is a synchronous round through a parameter server: ``k``
  pushes (``P``, or fastest-k's ``k``) and ``P`` replies through its interface.
  Each collective of a round also costs ``collective_overhead`` ``c``, what a
  real collective takes beyond the ring's formula (gloo's own steps,
  dispatch): ``T_ring + c`` per round, ``T_hier + 2c`` (two levels; one with
  groups of one or a single group), and ``3c`` for a quantized exchange (an
  all-to-all, an all-gather, and the loss's all-reduce). The real runtime
  sends a round's exchange as one buffer up to 64 MiB per dtype; a larger
  model's round has more buffers, which ``c`` per round does not count.
  An EA-wild group of ``G`` steps as fast as its slowest member plus
  ``T_ring(G)`` over ``intra_link``.

  **Node-local aggregation** (InHAD): a push goes over ``intra_link`` to its
  node, which sums it; on a pull the server receives the sums of the active
  nodes through its interface, applies them, and sends the update to every
  node, which hands it down over ``intra_link``.

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
    server_link: the parameter server's interface as its workers share it:
      a :class:`Link` or a preset name whose bandwidth ``B_s`` each push and
      reply occupies it for (``n / B_s``); ``None`` (default): ``link``.
    server_bandwidth: the server's effective memory bandwidth for applying
      updates, bytes per second, or a preset of :data:`SERVER_PRESETS`
      (``"10GB/s"``: a typical server); ``None`` (default): memory traffic
      costs no time.
    compute_times: optional explicit per-worker mean compute times (length
      ``K``), replacing ``compute_time``, ``slow_fraction`` and ``slowdown``.
    eval_time: seconds one evaluation on the held-out data takes, ``>= 0``:
      a parameter server evaluates between applying an arrival and replying
      (its replies and its next receive wait), a synchronous round's workers
      inside the round (the next round waits). ``0`` (default): evaluations
      cost no time, as if a separate process took them.
    collective_overhead: seconds each all-reduce takes beyond the ring
      formula, ``>= 0`` (``jaxsync calibrate --collective-processes`` measures
      it); ``0`` (default): the formula alone.
    absences: churn, for a strategy with elastic membership: ``(worker,
      start, end)`` triples, simulated seconds during which that worker is
      gone (it left at ``start``; from ``end`` on a replacement takes its
      place, from the global parameters with a fresh inner optimizer). A
      round counts a worker when the round starts outside its absences.
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
  server_link: Link | str | None = None
  compute_times: Sequence[float] | None = None
  server_bandwidth: float | str | None = None
  eval_time: float = 0.0
  collective_overhead: float = 0.0
  absences: Sequence[tuple[int, float, float]] = ()

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
    if self.server_link is not None:  # None stays None: ``link`` then, even after a replace(link=...)
      object.__setattr__(self, "server_link", link(self.server_link))
    if self.message_bytes is not None:
      validation.check_int(_WHAT, "message_bytes", self.message_bytes, low=0)
    validation.check_real(_WHAT, "apply_time", self.apply_time, low=0.0)
    validation.check_real(_WHAT, "eval_time", self.eval_time, low=0.0)
    validation.check_real(_WHAT, "collective_overhead", self.collective_overhead, low=0.0)
    object.__setattr__(self, "server_bandwidth", server_bandwidth(self.server_bandwidth))
    object.__setattr__(self, "absences", _checked_absences(self.absences, self.num_workers))
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
    """``n/B_s``: how long one message occupies the server's interface (``server_link``)."""
    return (self.server_link or self.link).transfer(self._bytes())

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
    """``2 l + (k + P) n/B_s + t_apply``: ``k`` pushes (default ``P``) and ``P`` replies through one server."""
    pushes = participants if pushes is None else pushes
    return 2 * self.link.latency + (pushes + participants) * self.transfer_time() + self.apply_time

  # What the engines ask.

  def unit_compute_times(
    self, strategy: Strategy, seed: jax.Array, units: jax.Array, steps: jax.Array
  ) -> jax.Array:
    """Compute times of the next steps of ``units`` (:attr:`Strategy.num_units`).

    A unit is one worker, or an EA-wild group of ``G``, which takes its slowest
    member plus a ring all-reduce over ``intra_link`` (docs/algorithms.md §13).
    An asynchronous local-SGD worker's next step is its ``H_k`` local steps
    (``Strategy.local_steps_per_unit``), the sum of their draws, as a
    synchronous local round charges them.
    """
    g = strategy.workers_per_unit
    if strategy.engine == Engine.ASYNC and strategy.protocol == WorkerProtocol.LOCAL:
      per_unit = jnp.asarray(strategy.local_steps_per_unit, jnp.int32)[units]
      offsets = jnp.arange(max(strategy.local_steps_per_unit), dtype=jnp.int32)
      draws = jax.vmap(lambda i: self.sample_compute(seed, units, steps + i))(offsets)  # [H_max, units]
      return jnp.sum(jnp.where(offsets[:, None] < per_unit[None, :], draws, 0.0), axis=0)
    if g == 1:
      return self.sample_compute(seed, units, steps)
    members = (units[:, None] * g + jnp.arange(g, dtype=jnp.int32)).reshape(-1)
    times = self.sample_compute(seed, members, jnp.repeat(steps, g)).reshape(-1, g)
    return jnp.max(times, axis=1) + self.ring_allreduce_time(g, over=self.intra_link)

  def round_time(self, strategy: Strategy, pushes: int) -> float:
    """Seconds of one synchronous round's exchange and update, after its compute.

    Through a parameter server: ``T_ps`` plus the server's summing of the
    ``pushes`` (``a`` each) and its update (``r``); after an all-reduce
    (``T_ring`` or ``T_hier``, and the collectives' own overhead) every worker
    applies the update (``r``), in parallel.
    """
    traffic = strategy.server_traffic
    update = self.memory_time(traffic.release)
    if strategy.communication == Communication.RING:
      return self.ring_allreduce_time(strategy.num_workers) + self.collectives_time(strategy) + update
    if strategy.communication == Communication.HIERARCHICAL:
      exchange = self.hierarchical_allreduce_time(strategy.num_workers, strategy.group_size)
      return exchange + self.collectives_time(strategy) + update
    summing = self.memory_time(pushes * traffic.arrival)
    return self.parameter_server_round_time(strategy.num_workers, pushes) + summing + update

  def collectives_time(self, strategy: Strategy) -> float:
    """``c`` times the collectives of one synchronous round that span more than one worker: one all-reduce
    (two levels for hierarchical all-reduce, each only if it joins several), three for a quantized
    exchange; none through a parameter server."""
    if not self.collective_overhead or strategy.communication == Communication.PARAMETER_SERVER:
      return 0.0
    k = strategy.num_workers
    if strategy.communication == Communication.HIERARCHICAL:
      g = strategy.group_size
      return self.collective_overhead * (int(g > 1) + int(k // g > 1))
    quantized = strategy.protocol == WorkerProtocol.LOCAL and strategy.exchange.quantize is not None
    return self.collective_overhead * (3 if quantized else 1) * int(k > 1)

  def gradient_round_compute(self, durations: jax.Array, keep: int) -> jax.Array:
    """Seconds until a gradient round's ``keep`` gradients are in: the slowest of ``K`` workers, or fastest-k's ``k``-th.

    Args:
      durations: ``[K]`` the workers' compute times of this round.
      keep: gradients the round waits for (``K``: a barrier).
    """
    if keep < durations.shape[-1]:
      return jnp.sort(durations, axis=-1)[..., keep - 1]
    return jnp.max(durations, axis=-1)

  def present(self, clock: jax.Array) -> jax.Array:
    """``bool[K]``: the workers that are not gone at ``clock`` (:attr:`absences`)."""
    present = jnp.ones([self.num_workers], jnp.bool_)
    for worker, start, end in self.absences:
      present = present.at[worker].set(present[worker] & ~((clock >= start) & (clock < end)))
    return present

  def fewest_present(self) -> int:
    """The fewest workers present at once under :attr:`absences` (``K`` without any)."""
    edges = sorted({t for _, start, end in self.absences for t in (start, end)})
    gone = [len({w for w, start, end in self.absences if start <= t < end}) for t in edges]
    return self.num_workers - max(gone, default=0)

  def delivered_by_deadline(
    self, strategy: Strategy, step_times: jax.Array, present: jax.Array | None = None
  ) -> jax.Array:
    r"""Which workers' pseudo-gradients a local round averages: every worker's, or with elastic membership and a
    deadline ``d``, those that came by the round's close.

    With ``b_k`` worker ``k``'s compute before its exchange (the round's first ``H - tau`` steps) and
    ``b_{(q)}`` the ``q``-th smallest (``q``: the quorum), the round closes at
    ``max(min_k b_k + d, b_{(q)})``: ``d`` after the first pushed pseudo-gradient, later if the quorum was
    not in by then. The pushes' transfer is the same for every worker, so it shifts every arrival alike.

    Args:
      strategy: a synchronous local strategy.
      step_times: ``[H, K]`` each worker's step times of the round.
      present: ``bool[K]``, the workers the round has (:meth:`present`); default all.

    Returns:
      ``bool[K]``, within ``present``.
    """
    num_workers = step_times.shape[1]
    present = jnp.ones([num_workers], jnp.bool_) if present is None else present
    if not strategy.elastic_membership or strategy.deadline is None:
      return present
    local_steps = step_times.shape[0]
    before = jnp.where(
      present, jnp.sum(step_times[: local_steps - strategy.exchange.overlap], axis=0), jnp.inf
    )
    close = jnp.maximum(jnp.min(before) + strategy.deadline, jnp.sort(before)[strategy.quorum - 1])
    return present & (before <= close)

  def local_round_compute(
    self, step_times: jax.Array, overlap: int, kept: jax.Array | None = None
  ) -> tuple[jax.Array, jax.Array]:
    r"""A local round's compute, split at its exchange: ``(before, during)``.

    Every worker takes its ``H`` local steps on its own; the pseudo-gradient
    is taken ``tau = overlap`` steps before the round ends and its exchange
    overlaps the last ``tau`` steps (Streaming DiLoCo), so the round ends at

    .. math::

      t_{round} = \max_k \sum_{h < H - \tau} t_{k,h}
        + \max\Bigl(T_{exchange},\ \max_k \sum_{h \ge H - \tau} t_{k,h}\Bigr)

    Args:
      step_times: ``[H, K]`` each worker's step times of the round.
      overlap: ``tau``, the steps the exchange overlaps.
      kept: ``bool[K]``, the workers the round waits for (:meth:`delivered_by_deadline`); default all.

    Returns:
      ``before`` (the slowest kept worker's steps up to the exchange) and
      ``during`` (the slowest kept worker's overlapped steps).
    """
    local_steps = step_times.shape[0]
    offsets = jnp.arange(local_steps, dtype=jnp.int32)
    overlapped = offsets[:, None] >= local_steps - overlap
    waited = jnp.ones(step_times.shape[1:], jnp.bool_) if kept is None else kept
    before = jnp.max(jnp.where(waited, jnp.sum(jnp.where(overlapped, 0.0, step_times), axis=0), 0.0))
    during = jnp.max(jnp.where(waited, jnp.sum(jnp.where(overlapped, step_times, 0.0), axis=0), 0.0))
    return before, during

  def local_exchange_time(self, strategy: Strategy, wire_bytes: float, held_bytes: float) -> float:
    """Seconds a local round's exchange and outer step take: ``wire_bytes`` (the pseudo-gradients in their
    wire format) through the round's collective, the update at the parameters' own precision (``held_bytes``)
    through the memory."""
    release = strategy.server_traffic.release
    moved = dataclasses.replace(self, message_bytes=int(wire_bytes))
    applied = dataclasses.replace(self, message_bytes=int(held_bytes))
    return (
      moved.round_time(strategy, strategy.num_workers)
      - moved.memory_time(release)
      + applied.memory_time(release)
    )

  def round_messages(self, strategy: Strategy, pushes: int) -> tuple[int, int]:
    """Full-size messages one synchronous round moves: (between machines, inside groups).

    A ring all-reduce over ``P`` moves ``2(P-1)/P`` of a message per member,
    ``2(P-1)`` in all; the hierarchical form runs that ring over the ``P/G``
    leaders and a reduce plus a broadcast inside each group.
    """
    num_workers = strategy.num_workers
    if strategy.communication == Communication.PARAMETER_SERVER:
      return pushes + num_workers, 0
    if strategy.communication == Communication.HIERARCHICAL:
      g = strategy.group_size
      return 2 * (num_workers // g - 1), 2 * (g - 1) * (num_workers // g)
    return 2 * (num_workers - 1), 0

  def idle_network(self, strategy: Strategy) -> NetworkState:
    """The server's interface at time 0: free both ways, no node sums, nothing sent."""
    nodes = strategy.num_workers // strategy.node_size
    zero = jnp.zeros([], jnp.float32)
    return NetworkState(
      nic_in=zero,
      nic_out=zero,
      node_count=jnp.zeros([nodes], jnp.int32),
      inter_messages=jnp.zeros([], jnp.int32),
      intra_messages=jnp.zeros([], jnp.int32),
    )

  def exchange(
    self,
    strategy: Strategy,
    network: NetworkState,
    *,
    time: jax.Array,
    unit: jax.Array,
    accepted: jax.Array,
    communicates: jax.Array,
    released: jax.Array,
    replies: jax.Array,
    pause: jax.Array | float = 0.0,
  ) -> tuple[Exchange, NetworkState]:
    r"""One arrival's exchange through the server's queues (the formulas of the class docstring).

    Through a parameter server, a push waits for the receive side, the server
    applies it, and the replies wait for the send side:

    .. math::

      t_{in} = \max(q_{in}, t + l) + \frac{n}{B_s}, \quad
      t_{server} = t_{in} + t_{apply} + \frac{(a + r\,[\text{released}])\, n}{M}, \quad
      q_{out}' = \max(q_{out}, t_{server}) + \text{replies} \cdot \frac{n}{B_s}

    and a reply lands at ``q_out' + l``; a locked server's receive side is
    free again at ``t_server`` (``q_in' = t_server``), a lock-free one's at ``t_in``.

    Args:
      strategy: its communication, server traffic and node or group layout.
      network: the queues and counters before the arrival.
      time: when the arriving unit finished computing, ``t``.
      unit: the arriving unit.
      accepted: its gradient was finite (a node sums only those).
      communicates: it went over the network (an elastic worker's local step
        between exchanges does not).
      released: the server released an update.
      replies: how many units get the parameters.
      pause: seconds a parameter server spends after applying the arrival and
        before replying (an evaluation, ``eval_time``): its replies and its
        next receive wait; replies already queued go on leaving meanwhile.

    Returns:
      The exchange's times, and the network after it.
    """
    node_count = network.node_count.at[unit // strategy.node_size].add(accepted.astype(jnp.int32))
    comm = strategy.communication
    traffic = strategy.server_traffic
    accumulate = self.memory_time(traffic.arrival)  # the arrival into a buffer, if the rule buffers
    update = self.memory_time(traffic.release)  # the update it releases
    apply = self.apply_time + jnp.where(released, update, 0.0)
    n_over, latency = self.transfer_time(), self.link.latency
    if comm == Communication.SHARED_MEMORY:
      # Hogwild!: no network and no lock; the worker applies its own update to the shared parameters.
      done = time + jnp.where(released, update, 0.0)
      exchange, after = Exchange(done, done), network
    elif comm == Communication.NODE_LOCAL:
      intra = self.intra_link.latency + self.intra_link.transfer(self._bytes())
      at_node = time + intra + accumulate  # summed into the node's buffer
      # On a pull (docs/algorithms.md §15) the server collects every active node's sum, applies,
      # and broadcasts to all nodes; the nodes hand the new parameters down.
      nodes = strategy.num_workers // strategy.node_size
      active = jnp.sum(node_count > 0).astype(jnp.float32)
      pull_start = jnp.maximum(network.nic_in, at_node + latency)
      nic_in = jnp.where(released, pull_start + active * n_over + apply, network.nic_in)
      out_start = jnp.maximum(network.nic_out, nic_in)
      nic_out = jnp.where(released, out_start + nodes * n_over, network.nic_out)
      exchange = Exchange(
        server_time=jnp.where(released, nic_in, at_node),
        receive_time=jnp.where(released, nic_out + latency + intra, at_node + intra),
      )
      after = network._replace(
        nic_in=nic_in,
        nic_out=nic_out,
        inter_messages=network.inter_messages + jnp.where(released, active.astype(jnp.int32) + nodes, 0),
        intra_messages=network.intra_messages + 1 + replies,
      )
    else:
      # A parameter server: pushes queue on its receive side, replies on its send side.
      locked = not (strategy.protocol == WorkerProtocol.ELASTIC and strategy.lock_free)
      in_done = jnp.maximum(network.nic_in, time + latency) + n_over
      server_time = in_done + apply + accumulate
      nic_out = jnp.maximum(network.nic_out, server_time + pause) + replies.astype(jnp.float32) * n_over
      exchange = Exchange(
        server_time=jnp.where(communicates, server_time, time),
        receive_time=jnp.where(communicates, nic_out + latency, time),
      )
      # Receiving again once the arrival is applied (locked) or read (lock-free), and any evaluation done.
      base = server_time if locked else in_done
      free = jnp.where(pause > 0, jnp.maximum(base, server_time + pause), base)
      after = network._replace(
        nic_in=jnp.where(communicates, free, network.nic_in),
        nic_out=jnp.where(communicates, nic_out, network.nic_out),
        inter_messages=jnp.where(communicates, network.inter_messages + 1 + replies, network.inter_messages),
      )
    intra_messages = after.intra_messages
    if strategy.workers_per_unit > 1:
      intra_messages = intra_messages + 2 * (strategy.workers_per_unit - 1)  # the group's all-reduce
    return exchange, after._replace(
      node_count=jnp.where(released, 0, node_count), intra_messages=intra_messages
    )
