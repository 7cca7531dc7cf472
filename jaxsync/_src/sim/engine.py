"""What the simulator's compiled loop runs: one kind of event as pure functions of a state."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import jax

from jaxsync._src.data.worker_data import WorkerData
from jaxsync._src.interface.history import RunTotals
from jaxsync._src.steps.records import EvalSchedule, EventRecord

State = TypeVar("State")


class Engine(Protocol[State]):
  """An event engine: the asynchronous one (``sim.events.EventEngine``, an arrival per event) or the
  synchronous one (``sim.rounds.RoundEngine``, a round per event).

  An engine holds what stays fixed over a run (the strategy, the loss, the time
  model, ``gradient_batch``); its state is a pytree of arrays, every method is
  pure and traceable, and :class:`jaxsync._src.sim.simulator.Simulator` runs
  them in one ``lax.while_loop``: events while :meth:`ready`, then
  :meth:`prepare`, until :meth:`next_event_time` passes the run's limit.
  """

  def init(self, params: Any, schedule: EvalSchedule, key: jax.Array) -> State:
    """The state at time 0, every worker holding ``params``; ``key`` is the jitter seed, ``uint32[2]``."""

  def next_event_time(self, state: State) -> jax.Array:
    """When the next event starts (an arrival's worker finishes, or a round begins)."""

  def ready(self, state: State) -> jax.Array:
    """Whether :meth:`step` can run now (else :meth:`prepare` must run first)."""

  def prepare(self, data: WorkerData, state: State) -> State:
    """``state`` with what the next steps need computed ahead (gradients of in-flight workers)."""

  def step(
    self, data: WorkerData, schedule: EvalSchedule, metric_names: tuple[str, ...], state: State
  ) -> tuple[State, EventRecord]:
    """One event: the new state and its record."""

  def saved_state(self, state: State) -> State:
    """What a checkpoint of ``state`` holds: all but what is computed again, bit for bit."""

  def restored_state(self, saved: State) -> State:
    """A state :meth:`step` takes, from :meth:`saved_state`'s."""

  def totals(self, state: State) -> RunTotals:
    """Per-worker gradients, applied gradients and idle seconds, and the bytes moved, of ``state``."""
