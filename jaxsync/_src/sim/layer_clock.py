r"""The per-layer clock of synchronous rounds: each layer's exchange overlapped with the backward pass.

The round engine (:mod:`jaxsync._src.sim.rounds`) charges a round its compute,
then its whole exchange. At scale the frameworks do better: a layer's gradient
is reduced as soon as its backward is done, while the backward of the layers
below it goes on, and the next step's forward of a layer waits only for that
layer's reduction. This clock follows one compute stream through that graph
(the simulator of Douillard et al., 2025, *Streaming DiLoCo*, Appendix: per
layer a forward node, a backward node and a reduction node), round by round:

* a round's first step runs its forward layer by layer, layer ``l`` no earlier
  than its last exchange has landed (``ready_l``);
* the round's compute up to its exchange, then the sending step's backward,
  layer ``L`` first; when layer ``l``'s backward is done and it belongs to the
  round's fragment, its bytes join one FIFO queue on the link:
  ``q = max(q, t) + T_l`` and ``ready_l = q``, where ``T_l`` is the exchange
  time of the layer's bytes alone; the exchange's latencies (what an exchange
  of no bytes costs) are paid once, with its first layer, as a pipelined
  collective pays them;
* then the ``tau`` overlapped steps (:meth:`TimeModel.local_round_compute`).

Every cost is the time model's: a round's compute
(:meth:`TimeModel.gradient_round_compute`,
:meth:`TimeModel.local_round_compute`, on the same draws), a layer's exchange
(:meth:`TimeModel.round_time` of a gradient round, or
:meth:`TimeModel.local_exchange_time` of a local one, on the layer's bytes). A
forward takes ``forward_share`` of a step, the backward the rest. With one layer
this is the round engine's clock, round for round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsync._src.core import validation
from jaxsync._src.rules import quantize
from jaxsync._src.rules.diloco import fragment_of_leaves
from jaxsync._src.sim.time_model import Link, TimeModel
from jaxsync._src.strategies.strategy import Blueprint, Communication, Engine, WorkerProtocol

_WHAT = "LayerClock"


class RoundTimes(NamedTuple):
  """What :meth:`LayerClock.run` measured, one column per link.

  Attributes:
    ends: ``[R, links]`` when each round's compute is done and its exchange
      has landed (the round engine's round end).
    compute_ends: ``[R, links]`` when each round's compute is done.
    steps_per_round: worker steps in one round (``H``; 1 for a gradient round).
    compute_per_step: a worker's mean compute seconds per step (no waiting).
    wire_bytes: ``[P]`` bytes a worker moves over the link (on average) in
      each fragment's exchange (all layers of a gradient round).
    inner_wire_bytes: ``[P]`` the same inside a group (the hierarchical
      all-reduce's lower level; 0 elsewhere).
    busiest_wire_bytes: ``[P]`` what the busiest sender sends over the link in
      each fragment's exchange (a hierarchical all-reduce's leaders send for
      their groups; a parameter server's workers one push each).
  """

  ends: np.ndarray
  compute_ends: np.ndarray
  steps_per_round: int
  compute_per_step: float
  wire_bytes: np.ndarray
  inner_wire_bytes: np.ndarray
  busiest_wire_bytes: np.ndarray


def layer_shapes(layer_sizes: Sequence[int], dtype: str) -> list[jax.ShapeDtypeStruct]:
  """One parameter array per layer, shaped for the byte counts of the time model (nothing allocated)."""
  return [jax.ShapeDtypeStruct((int(n),), jnp.dtype(dtype)) for n in layer_sizes]


@dataclasses.dataclass(frozen=True)
class LayerClock:
  """A synchronous strategy's rounds with each layer's exchange overlapped with the backward pass.

  Attributes:
    time_model: the cluster (``link`` is replaced by each link :meth:`run` is given).
    strategy: a synchronous strategy's blueprint (a gradient round, or a local
      round with its fragments, overlap and wire format).
    layer_sizes: parameters of each layer, first layer first.
    dtype: the parameters' and gradients' precision on the wire (``bfloat16``
      in the papers' plans), before any quantization of the pseudo-gradients.
    forward_share: the forward pass's share of a step (a third: the backward
      costs twice the forward).
    strided: Streaming DiLoCo's fragments as every ``P``-th layer (the paper's
      pattern) instead of contiguous blocks (the rules' own).
    layered: each layer's exchange starts when its backward is done and the
      next forward waits per layer; ``False``: the round engine's own clock
      (the fragment's exchange, one message, after the round's compute up to
      it; the next round after it has landed).
  """

  time_model: TimeModel
  strategy: Blueprint
  layer_sizes: tuple[int, ...]
  dtype: str = "bfloat16"
  forward_share: float = 1.0 / 3.0
  strided: bool = False
  layered: bool = True

  def __post_init__(self):
    strategy = self.strategy
    if strategy.engine != Engine.SYNC:
      raise validation.invalid(
        _WHAT, "strategy", strategy.name, "a synchronous strategy (rounds); asynchronous ones run on events"
      )
    sizes = tuple(self.layer_sizes)
    if not sizes or any(int(n) < 1 for n in sizes):
      raise validation.invalid(
        _WHAT, "layer_sizes", self.layer_sizes, "one positive parameter count per layer"
      )
    object.__setattr__(self, "layer_sizes", tuple(int(n) for n in sizes))
    validation.check_real(_WHAT, "forward_share", self.forward_share, low=0.0, high=1.0, high_open=True)
    if self.fragments > len(sizes):
      raise validation.invalid(
        _WHAT,
        "fragments",
        self.fragments,
        f"at most the {len(sizes)} layers (one fragment holds whole layers)",
      )

  @property
  def local(self) -> bool:
    return self.strategy.protocol == WorkerProtocol.LOCAL

  @property
  def fragments(self) -> int:
    return self.strategy.exchange.fragments if self.local else 1

  def owners(self) -> tuple[int, ...]:
    """Each layer's fragment."""
    if self.fragments == 1:
      return (0,) * len(self.layer_sizes)
    return fragment_of_leaves(
      layer_shapes(self.layer_sizes, self.dtype), self.fragments, strided=self.strided
    )

  def layer_wire_bytes(self) -> np.ndarray:
    """Bytes of each layer's message on the wire: its gradient, or its pseudo-gradient in the exchange's format."""
    exchange = self.strategy.exchange
    fmt = exchange.quantize if self.local else None
    return np.asarray(
      [
        quantize.wire_bytes([leaf], fmt, exchange.quantize_block)
        for leaf in layer_shapes(self.layer_sizes, self.dtype)
      ],
      np.float64,
    )

  def fixed_exchange_time(self, link: Link) -> float:
    """Seconds of an exchange that do not grow with its bytes (latencies, the server's fixed apply time):
    the exchange of 0 bytes. A fragment's exchange pays them once, its layers pipelined behind them."""
    return self._exchange_time(dataclasses.replace(self.time_model, link=link), 0, 0)

  def layer_exchange_times(self, link: Link) -> np.ndarray:
    """``[L]`` seconds each layer's exchange takes on ``link``, its bytes alone (the time model's formulas on
    its bytes, less :meth:`fixed_exchange_time`)."""
    held = [quantize.wire_bytes([leaf], None, 1) for leaf in layer_shapes(self.layer_sizes, self.dtype)]
    model = dataclasses.replace(self.time_model, link=link)
    known: dict[tuple[int, int], float] = {}  # most layers have the same size: each size once
    times = []
    for wire, size in zip(self.layer_wire_bytes(), held):
      key = (int(wire), int(size))
      if key not in known:
        known[key] = self._exchange_time(model, *key)
      times.append(known[key])
    return np.asarray(times, np.float64) - self.fixed_exchange_time(link)

  def _exchange_time(self, model: TimeModel, wire: int, held: int) -> float:
    if self.local:
      return model.local_exchange_time(self.strategy, wire, held)
    moved = dataclasses.replace(model, message_bytes=wire)
    return moved.round_time(self.strategy, self.strategy.gradients_per_round or self.strategy.num_workers)

  def round_compute(self, rounds: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(before, during)``, ``[rounds]`` each: the compute of each round up to its exchange, and overlapped with it.

    The same draws as the round engine's (``TimeModel.sample_compute`` of each
    worker's step), so round ``r`` here is round ``r`` there; deterministic
    compute is drawn once.
    """
    model, strategy = self.time_model, self.strategy
    workers = jnp.arange(model.num_workers, dtype=jnp.int32)
    key = jax.random.key_data(jax.random.key(seed))
    draws = rounds if model.jitter_shape is not None else 1
    if self.local:
      h, tau = strategy.local_steps, strategy.exchange.overlap

      def one(r):
        steps = jax.vmap(lambda i: model.sample_compute(key, workers, jnp.full_like(workers, r * h) + i))(
          jnp.arange(h, dtype=jnp.int32)
        )
        return model.local_round_compute(steps, tau)

      before, during = jax.jit(jax.vmap(one))(jnp.arange(draws, dtype=jnp.int32))
    else:
      keep = strategy.gradients_per_round or strategy.num_workers

      def one(r):
        return model.gradient_round_compute(
          model.sample_compute(key, workers, jnp.full_like(workers, r)), keep
        )

      before = jax.jit(jax.vmap(one))(jnp.arange(draws, dtype=jnp.int32))
      during = jnp.zeros_like(before)
    before, during = np.asarray(before, np.float64), np.asarray(during, np.float64)
    if draws < rounds:
      before, during = np.repeat(before, rounds), np.repeat(during, rounds)
    return before, during

  def run(self, links: Sequence[Link], rounds: int, seed: int = 0) -> RoundTimes:
    """``rounds`` rounds on each of ``links`` (vectorized over them).

    Args:
      links: the inter-worker links to time (e.g. a sweep over bandwidths).
      rounds: rounds to simulate.
      seed: the compute-time jitter seed (the simulator's).

    Returns:
      :class:`RoundTimes`.
    """
    validation.check_int(_WHAT, "rounds", rounds)
    strategy = self.strategy
    num_layers = len(self.layer_sizes)
    exchange_times = np.stack([self.layer_exchange_times(link) for link in links], axis=1)  # [L, links]
    fixed = np.asarray([self.fixed_exchange_time(link) for link in links], np.float64)
    owners = np.asarray(self.owners())
    before, during = self.round_compute(rounds, seed)
    steps = strategy.local_steps if self.local else 1
    sending_steps = steps - (strategy.exchange.overlap if self.local else 0)
    forward, backward = self.forward_share, 1.0 - self.forward_share
    width = len(links)
    t = np.zeros(width)
    queue = np.zeros(width)
    ready = np.zeros((num_layers, width))
    ends = np.zeros((rounds, width))
    compute_ends = np.zeros((rounds, width))
    waiting = False  # any layer's exchange still in flight at a round's start
    if not self.layered:
      return self._run_rounds(links, before, during, owners, steps)
    for r in range(rounds):
      step = before[r] / sending_steps  # the first and the sending step: a mean step of the round
      # The first step's forward, each layer once its last exchange has landed.
      if waiting:
        for layer in range(num_layers):
          t = np.maximum(t, ready[layer]) + forward * step / num_layers
      else:
        t = t + forward * step
      # The compute between, then the sending step's backward, last layer first, each layer's
      # exchange queued on the link as its backward is done.
      t = t + (before[r] - forward * step - backward * step)
      fragment = r % self.fragments
      first = True
      for layer in reversed(range(num_layers)):
        t = t + backward * step / num_layers
        if owners[layer] == fragment:
          # The exchange's latency once, when its first layer goes out; its layers' bytes then queue.
          queue = np.maximum(queue, t) + exchange_times[layer] + (fixed if first else 0.0)
          ready[layer] = queue
          first = False
      t = t + during[r]
      waiting = True
      compute_ends[r] = t
      ends[r] = np.maximum(t, queue)
    return self._times(ends, compute_ends, steps, self.fragment_wire_bytes(owners, on_wire=True))

  def fragment_wire_bytes(self, owners, *, on_wire: bool) -> np.ndarray:
    """``[P]`` bytes of each fragment's message: on the wire (the exchange's format), or as held."""
    exchange = self.strategy.exchange
    fmt = exchange.quantize if (self.local and on_wire) else None
    leaves = layer_shapes(self.layer_sizes, self.dtype)
    return np.asarray(
      [
        quantize.wire_bytes([leaf for leaf, o in zip(leaves, owners) if o == p], fmt, exchange.quantize_block)
        for p in range(self.fragments)
      ],
      np.float64,
    )

  def _run_rounds(self, links, before, during, owners, steps) -> RoundTimes:
    """The round engine's clock: ``t_{round} = t_{before} + max(T_{exchange}, t_{during})``, vectorized over links."""
    wire = self.fragment_wire_bytes(owners, on_wire=True)
    held = self.fragment_wire_bytes(owners, on_wire=False)
    exchange = np.asarray(
      [
        [
          self._exchange_time(dataclasses.replace(self.time_model, link=link), int(w), int(h))
          for link in links
        ]
        for w, h in zip(wire, held)
      ],
      np.float64,
    )  # [P, links]
    rounds = len(before)
    clock = np.zeros(len(links))
    ends = np.zeros((rounds, len(links)))
    compute_ends = np.zeros((rounds, len(links)))
    for r in range(rounds):
      compute_ends[r] = clock + before[r] + during[r]
      ends[r] = clock + before[r] + np.maximum(exchange[r % self.fragments], during[r])
      clock = ends[r]
    return self._times(ends, compute_ends, steps, wire)

  def _times(self, ends, compute_ends, steps, wire) -> RoundTimes:
    strategy = self.strategy
    keep = strategy.gradients_per_round or strategy.num_workers
    outer, inner = self.time_model.round_messages(strategy, keep)
    if strategy.communication == Communication.PARAMETER_SERVER:
      outer, senders = keep, keep  # the pushes: a worker sends one; the replies are the server's
    elif strategy.communication == Communication.HIERARCHICAL:
      senders = strategy.num_workers // strategy.group_size  # only the leaders cross the link
    else:
      senders = strategy.num_workers
    return RoundTimes(
      ends=ends,
      compute_ends=compute_ends,
      steps_per_round=steps,
      compute_per_step=float(np.mean(self.time_model.mean_compute_times())),
      wire_bytes=wire * outer / strategy.num_workers,
      inner_wire_bytes=wire * inner / strategy.num_workers,
      busiest_wire_bytes=wire * outer / senders,
    )
