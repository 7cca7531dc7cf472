r"""Plans a run at any scale on the simulator's own clock: step time, compute utilization, bytes, goodput.

Nothing is trained. A synchronous strategy's rounds run on the per-layer clock
(:class:`jaxsync._src.sim.layer_clock.LayerClock`: each layer's exchange
overlapped with the backward pass, Streaming DiLoCo's fragments and overlap,
every cost from :class:`jaxsync._src.sim.time_model.TimeModel`), vectorized
over a sweep of bandwidths. An asynchronous strategy runs on the simulator's
own event engine with a stand-in model (one parameter, zero gradients) and the
planned model's message bytes: the same events and times as a trained run,
for every strategy whose timing does not depend on the gradients' values.
Adaptive k releases on what the gradients say; the planner refuses it and says
what to plan instead.

Compute utilization is the share of a worker's time spent computing,

.. math::

  CU = \frac{H\,\bar c}{t_{round}}

for a round of ``H`` steps (1 for a gradient round) of a worker's mean
compute ``c``; on events, the compute of the steps that arrived in the second
half of the simulated events over that half's time. The bandwidth a strategy
needs for a level of CU is the smallest swept bandwidth at which it reaches it.

Bytes are what one worker sends over a link per step (a ring all-reduce's
``2 (P - 1) / P`` of a message, a push to a server); the largest exchange is
what the busiest sender sends in one exchange (a leader of a hierarchical
all-reduce sends for its group).

Cost: a synchronous plan runs ``4 P`` rounds (``P`` fragments) when compute is
deterministic, a pattern that repeats every ``P`` rounds (the first ``2 P``
warm the queue up, the last ``2 P`` are measured), each round ``O(L)`` per
bandwidth: independent of ``M`` and of the run's length. With jitter or slow
workers it draws ``M H`` compute times per round over ``max(4 P, 2 P + 32)``
rounds. An asynchronous plan simulates ``events_per_worker M`` events of
``O(M)`` each.

The planner says nothing about accuracy or loss: it plans time, bytes and goodput.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxsync._src.core import validation
from jaxsync._src.plan.hardware import accelerator
from jaxsync._src.plan.workload import Failures, ModelSize, Topology, gbits, goodput
from jaxsync._src.sim.layer_clock import LayerClock
from jaxsync._src.sim.time_model import Link, TimeModel
from jaxsync._src.strategies import registry
from jaxsync._src.strategies.strategy import Blueprint, Engine, WorkerProtocol

# The papers' sweep (Douillard et al., 2025; Charles et al., 2025): 50 bandwidths from 0.1 to 1,000 Gbit/s,
# about 21% apart.
PAPER_BANDWIDTHS = tuple(float(b) for b in np.logspace(-1, 3, 50))
LEVELS = (0.5, 0.8, 0.9, 0.95, 0.99)
# Timing that follows what the gradients say: the planner cannot run it without them.
VALUE_DEPENDENT = {
  "adaptive_k": "adaptive k releases an update when the gradients' noise says so, so its timing needs trained "
  "gradients: plan k_async with options {k: K} for the k a short trained run settles on (history.k)",
}


@dataclasses.dataclass(frozen=True)
class StrategyPlan:
  """One strategy's plan.

  Attributes:
    name: the strategy's label (its registry name, or the label given).
    strategy: its registry name.
    step_time: wall seconds per worker step on the topology's outer link.
    compute_utilization: the share of that time spent computing.
    goodput: the share of compute that ends up in the model under failures.
    wall_time: seconds to the budget, failures included (None without a budget).
    bytes_per_step: bytes one worker sends over the outer link per step, on average.
    inner_bytes_per_step: bytes one worker sends inside its group per step
      (the hierarchical all-reduce's lower level, InHAD's nodes, EA-wild's groups).
    largest_exchange: bytes the busiest sender sends over the outer link in
      one exchange (what a peak bandwidth must carry).
    needed_bandwidth: ``{level: Gbit/s}``, the smallest swept bandwidth that
      reaches each compute utilization (None: none of the sweep does).
    sweep: ``[bandwidths]`` compute utilization over the sweep (empty if not swept).
    clock: ``"layers"`` (the per-layer round clock) or ``"events"`` (the event engine).
  """

  name: str
  strategy: str
  step_time: float
  compute_utilization: float
  goodput: float
  wall_time: float | None
  bytes_per_step: float
  inner_bytes_per_step: float
  largest_exchange: float
  needed_bandwidth: dict[float, float | None]
  sweep: tuple[float, ...]
  clock: str


@dataclasses.dataclass(frozen=True)
class Plan:
  """The plans of a list of strategies for one model, topology and hardware.

  Attributes:
    strategies: one :class:`StrategyPlan` each, in the order given.
    bandwidths: the swept outer-link bandwidths, Gbit/s.
    link_gbps: the topology's own outer bandwidth, Gbit/s (what the rows' step times are at).
    compute_time: a worker's compute seconds per step.
    budget_steps: worker steps to the budget (None: no budget).
    assumptions: what the plan assumed, one line each.
  """

  strategies: tuple[StrategyPlan, ...]
  bandwidths: tuple[float, ...]
  link_gbps: float
  compute_time: float
  budget_steps: float | None
  assumptions: tuple[str, ...]


def _behaviour(blueprint: Blueprint) -> str:
  if blueprint.engine == Engine.ASYNC:
    return "replace"
  return "continue" if blueprint.protocol == WorkerProtocol.LOCAL else "restart"


def needed_bandwidths(bandwidths: Sequence[float], utilization: Sequence[float], levels=LEVELS) -> dict:
  """``{level: the smallest of bandwidths whose utilization reaches it, or None}`` (bandwidths ascending)."""
  out = {}
  for level in levels:
    reached = [b for b, u in zip(bandwidths, utilization) if u >= level - 1e-12]
    out[level] = min(reached) if reached else None
  return out


def _rounds_clock(clock: LayerClock, links: Sequence[Link], seed: int) -> tuple[np.ndarray, Any]:
  """Compute utilization on each link, from the steady state of the round clock."""
  period = clock.fragments
  deterministic = clock.time_model.jitter_shape is None
  measured = 2 * period if deterministic else max(2 * period, 32)
  rounds = 2 * period + measured
  times = clock.run(links, rounds, seed)
  per_round = (times.compute_ends[-1] - times.compute_ends[-1 - measured]) / measured
  # Fastest-k's round waits for the k-th gradient only: faster than the workers' mean step, so CU is at most 1
  # while the step time is the round's own.
  utilization = np.minimum(times.steps_per_round * times.compute_per_step / per_round, 1.0)
  return utilization, per_round / times.steps_per_round, times


def _events_clock(strategy, time_model: TimeModel, history, totals) -> tuple[float, float, float, float]:
  """``(utilization, step time, bytes sent, bytes sent inside groups)`` per worker and step, over the second half of
  the events (the first half fills the server's queues)."""
  half = len(history.time) // 2
  window = float(history.time[-1] - history.time[half])
  arrivals = np.asarray(history.worker[half + 1 :])
  if strategy.protocol == WorkerProtocol.LOCAL:
    steps_per_arrival = np.asarray(strategy.local_steps_per_unit, np.float64)[arrivals]
  else:
    steps_per_arrival = np.ones(len(arrivals))
  # A unit is a worker, or an EA-wild group of G workers stepping together.
  unit_means = time_model.mean_compute_times().reshape(strategy.num_units, -1).mean(axis=1)
  busy = float(np.sum(steps_per_arrival * unit_means[arrivals]))
  utilization = min(1.0, busy / (window * strategy.num_units))
  step_time = window * strategy.num_units / float(np.sum(steps_per_arrival))
  steps = float(np.sum(totals.worker_steps)) / strategy.workers_per_unit
  # The server's messages both ways, over all the workers' steps: half of them a worker sends.
  sent = float(totals.bytes_moved) / 2 / max(steps, 1.0)
  inner = float(totals.bytes_moved_intra) / 2 / max(steps, 1.0)
  return utilization, step_time, sent, inner


def event_timeline(
  blueprint_name: str, options: Mapping[str, Any], time_model: TimeModel, num_events: int, seed: int = 0
):
  """The simulator's event engine on a stand-in model: ``(history, totals, strategy)`` of ``num_events`` arrivals.

  One parameter, a zero loss, and ``time_model.message_bytes`` for the planned
  model's messages: the timing is the trained simulator's for every strategy
  whose timing does not depend on the gradients' values. ``strategy`` is the
  one it ran (with Dynamic Local Updates, sized by the workers' speeds).
  """
  import jax.numpy as jnp

  from jaxsync._src.data.worker_data import WorkerData
  from jaxsync._src.sim.simulator import Simulator

  if time_model.message_bytes is None:
    raise validation.invalid(
      "plan", "time_model.message_bytes", None, "the planned model's bytes per message"
    )
  k = time_model.num_workers
  strategy = registry.make(blueprint_name, k, **dict(options))
  data = WorkerData({"x": np.zeros([k, 1], np.float32)}, num_workers=k, batch_size=1)
  sim = Simulator(strategy, lambda p, b: 0.0 * jnp.sum(p) + 0.0 * jnp.sum(b["x"]), data, time_model)
  state = sim.init(jnp.zeros([1], jnp.float32), seed)
  state, records = sim.advance(state, num_events)
  return sim.history([records], state), sim.totals(state), sim.strategy


def plan(
  model: ModelSize,
  topology: Topology,
  strategies: Sequence[tuple[str, str, Mapping[str, Any]]],
  *,
  hardware: str = "H100",
  mfu: float = 0.4,
  jitter_shape: float | None = None,
  slow_fraction: float = 0.0,
  slowdown: float = 1.0,
  budget_steps: float | None = None,
  budget_tokens: float | None = None,
  failures: Failures | None = None,
  bandwidths: Sequence[float] = PAPER_BANDWIDTHS,
  levels: Sequence[float] = LEVELS,
  strided: bool = False,
  events_per_worker: int = 20,
  seed: int = 0,
) -> Plan:
  """Plans each strategy on a model, topology and hardware: step time, utilization, bytes, goodput, bandwidth.

  Args:
    model: the model's size and compute (:class:`ModelSize`).
    topology: the workers and links (:class:`Topology`).
    strategies: ``(label, registry name, options)`` each.
    hardware: an accelerator preset (``H100``, ``H200``, ``B200``, ``TPU v5p``,
      ``TPU v5e``), for a model given by its FLOPs or tokens.
    mfu: the model FLOPs utilization of the compute, in ``(0, 1]``.
    jitter_shape: the Gamma shape of step-time jitter (None: none), as the simulator's.
    slow_fraction: the fraction of slow workers.
    slowdown: how many times slower they are.
    budget_steps: worker steps to time (or ``budget_tokens``, over all workers).
    budget_tokens: tokens over all workers (needs ``model.tokens_per_step``).
    failures: the failure model, or None.
    bandwidths: the outer-link bandwidths to sweep, Gbit/s (synchronous strategies).
    levels: the compute utilizations to find the bandwidth for.
    strided: Streaming DiLoCo's fragments as every ``P``-th layer (the paper's)
      instead of contiguous blocks (jaxsync's rules').
    events_per_worker: arrivals per worker an asynchronous plan simulates.
    seed: the jitter seed.

  Returns:
    A :class:`Plan`.

  Example:
    >>> import jaxsync
    >>> from jaxsync.planning import ModelSize, Topology, gbits
    >>> p = jaxsync.plan(
    ...   ModelSize(parameters=1e9, layers=24, step_time=0.1),
    ...   Topology(workers=2, outer=jaxsync.sim.Link(0.0, gbits(100))),
    ...   [("data-parallel", "allreduce", {})], bandwidths=(100.0, 1000.0))
    >>> round(p.strategies[0].compute_utilization, 2)
    0.51
  """
  validation.check_real("plan", "mfu", mfu, low=0.0, high=1.0, low_open=True)
  if budget_steps is not None and budget_tokens is not None:
    raise validation.invalid(
      "plan", "budget_steps/budget_tokens", (budget_steps, budget_tokens), "one of the two"
    )
  if budget_tokens is not None:
    if model.tokens_per_step is None:
      raise validation.invalid(
        "plan", "budget_tokens", budget_tokens, "a budget in steps: the model has no tokens_per_step"
      )
    budget_steps = budget_tokens / (model.tokens_per_step * topology.workers)
  bandwidths = tuple(sorted(float(b) for b in bandwidths))
  for b in bandwidths:
    validation.check_real("plan", "bandwidths[i]", b, low=0.0, low_open=True)
  chip = accelerator(hardware)
  compute = model.compute_time(chip.peak_flops, mfu, topology.chips_per_worker)
  base = TimeModel(
    num_workers=topology.workers,
    compute_time=compute,
    jitter_shape=jitter_shape,
    slow_fraction=slow_fraction,
    slowdown=slowdown,
    link=topology.outer,
    intra_link=topology.inner,  # None: the time model's default, 10x the outer link
    message_bytes=int(model.parameters * model.bytes_per_parameter),
  )
  sweep_links = [Link(topology.outer.latency, gbits(b)) for b in bandwidths]
  rows = []
  for label, name, options in strategies:
    if name in VALUE_DEPENDENT:
      raise validation.invalid(
        "plan", "strategy", name, f"a strategy whose timing runs without gradients; {VALUE_DEPENDENT[name]}"
      )
    blueprint = registry.blueprint(name, topology.workers, **dict(options))
    if blueprint.engine == Engine.SYNC:
      clock = LayerClock(base, blueprint, model.layer_sizes(), model.dtype, strided=strided)
      utilization, step_times, times = _rounds_clock(clock, [topology.outer, *sweep_links], seed)
      step_time = float(step_times[0])
      bytes_per_step = float(np.mean(times.wire_bytes)) / times.steps_per_round
      inner_bytes = float(np.mean(times.inner_wire_bytes)) / times.steps_per_round
      largest = float(np.max(times.busiest_wire_bytes))
      sweep = tuple(float(u) for u in utilization[1:])
      lost_work = step_time * times.steps_per_round
      clock_name = "layers"
    else:
      history, totals, ran = event_timeline(
        name, options, base, events_per_worker * blueprint.num_units, seed
      )
      cu, step_time, bytes_per_step, inner_bytes = _events_clock(ran, base, history, totals)
      utilization = np.asarray([cu])
      largest = float(base.message_bytes)
      sweep = ()
      local = ran.protocol == WorkerProtocol.LOCAL
      lost_work = step_time * max(ran.local_steps_per_unit) if local else step_time
      clock_name = "events"
    share = goodput(
      failures, _behaviour(blueprint), chips=topology.chips, workers=topology.workers, lost_work=lost_work
    )
    rows.append(
      StrategyPlan(
        name=label,
        strategy=name,
        step_time=float(step_time),
        compute_utilization=float(utilization[0]),
        goodput=share,
        wall_time=None if budget_steps is None else float(budget_steps * step_time / max(share, 1e-12)),
        bytes_per_step=bytes_per_step,
        inner_bytes_per_step=inner_bytes,
        largest_exchange=largest,
        needed_bandwidth=needed_bandwidths(bandwidths, sweep, levels)
        if sweep
        else {lv: None for lv in levels},
        sweep=sweep,
        clock=clock_name,
      )
    )
  assumptions = (
    f"compute: {compute:.4g} s per worker step"
    + (
      ""
      if model.step_time is not None
      else f" ({hardware}: {chip.peak_flops:.3g} FLOP/s peak, MFU {mfu:g}, "
      f"{topology.chips_per_worker} chips per worker; {chip.source})"
    ),
    f"{topology.workers} workers; outer link {topology.outer.bandwidth * 8 / 1e9:g} Gbit/s, "
    f"{topology.outer.latency:g} s latency per message",
    f"{model.layers} layers of {model.parameters / model.layers:.4g} parameters, {model.dtype} on the wire; "
    "each layer's exchange starts when its backward is done (forward 1/3 of a step, backward 2/3)",
    "time, bytes and goodput only: the planner predicts no accuracy or loss",
  )
  return Plan(
    strategies=tuple(rows),
    bandwidths=bandwidths,
    link_gbps=topology.outer.bandwidth * 8 / 1e9,
    compute_time=float(compute),
    budget_steps=budget_steps,
    assumptions=assumptions,
  )
