"""The one interface every runtime implements, and the parts they share, written once.

Three runtimes run a strategy: the simulated cluster (``sim.Simulator``), the
parameter server of the multi-process runtime (``dist.ParameterServer``) and
its synchronous loop (``dist.SyncRuntime``). :func:`jaxsync._src.train.training.train`
drives any of them through :class:`Runtime`: it only ever calls ``init``,
``advance``, ``history``, ``evaluate`` and ``initial_metrics``, and reads
``clock`` to name the time axis. :class:`RuntimeBase` holds what they share:
the evaluation schedule, ``eval_fn`` compiled once, the initial model's
metrics, the late set-up of a runtime whose state was restored from a
checkpoint, and the assembly of the :class:`History`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax
import optax

from jaxsync._src.interface.history import History, RunTotals, assemble_history
from jaxsync._src.steps.records import EvalSchedule, EventRecord

CLOCKS = ("simulated", "wall")


class PreemptedError(Exception):
  """A process stopped on request (a preemption notice) at a safe point, losing nothing.

  Attributes:
    done: the events the run's last checkpoint holds (``resume`` continues
      from there, exactly), or None for a process that holds no part of the
      run's state (a worker of a parameter-server run: its applied work is on
      the server).
  """

  def __init__(self, done: int | None, message: str | None = None):
    super().__init__(message or f"preempted after {done} events, all of them in the run's last checkpoint")
    self.done = done


class FaultAfterProgress(Exception):
  """A runtime's fault that came after some events of an ``advance`` had completed.

  A multi-process runtime raises an error of this kind (as a mixin, next to its
  own error class) when a peer is lost mid-chunk. ``completed`` is
  ``(state, records)`` as ``advance`` would have returned them after the last
  event that completed (``records`` may hold no event), or None where the
  runtime cannot rebuild them in this process. The host loop writes those
  events' rows and saves a checkpoint of them (or, with None, of the last
  chunk's end) before the error goes on, so that a restart redoes no completed
  event (with None: none of the completed chunks).

  ``writes_run`` is True in the process that writes the run directory in the
  place of a lost process 0 (a synchronous run's process 1, which holds the
  same state): it writes those rows and that checkpoint itself.
  """

  completed: tuple[Any, EventRecord] | None = None
  writes_run: bool = False


@runtime_checkable
class Runtime(Protocol):
  """What a host loop needs from a runtime (simulated or real).

  Attributes:
    clock: what ``EventRecord.time`` measures: ``"simulated"`` seconds of the
      simulator's time model, or ``"wall"`` seconds of a real run.
  """

  clock: str

  def init(self, params: optax.Params, seed: int = 0) -> Any:
    """The state before the first event, every worker holding ``params``."""

  def advance(self, state: Any, num_events: int, *, max_time: float | None = None) -> tuple[Any, EventRecord]:
    """Runs up to ``num_events`` more events; returns the new state and their records."""

  def history(
    self, records: list[EventRecord], state: Any, *, initial_metrics: dict[str, float] | None = None
  ) -> History:
    """The :class:`History` of the records of one or more ``advance`` calls, ending in ``state``."""

  def agree_to_stop(self, requested: bool) -> bool:
    """Whether the run stops at this safe point (between chunks), given this process's ``requested``."""

  def saved_state(self, state: Any) -> Any:
    """What a checkpoint of ``state`` holds (the state less what can be computed again)."""

  def restored_state(self, saved: Any) -> Any:
    """A state ``advance`` takes, from what :meth:`saved_state` returned."""

  def earlier_states(self, saved: Any, step: int) -> list[tuple[Any, Callable[[Any], Any]]]:
    """Saved states of this run's earlier shapes a checkpoint at ``step`` may hold, most recent first, each
    with the function that makes it a saved state of this shape (``saved``'s)."""

  def evaluate(self, params: optax.Params) -> dict[str, float]:
    """``eval_fn(params)`` as Python floats (``{}`` without an ``eval_fn``)."""

  @property
  def initial_metrics(self) -> dict[str, float]:
    """The metrics of the parameters given to the last ``init``."""


class RuntimeBase:
  """The shared half of every runtime: evaluation, initial metrics, late set-up, history.

  A subclass calls ``super().__init__(eval_fn, eval_every, eval_every_time)``,
  extends :meth:`_prepare` with what its compiled step needs from the
  parameters' shapes, calls :meth:`_start` in ``init`` and
  :meth:`_ensure_prepared` in ``advance`` (a state restored from a checkpoint
  reaches ``advance`` without ``init`` having seen parameters), and implements
  :meth:`totals`.

  Args:
    eval_fn: optional ``params -> {name: scalar}`` on held-out data.
    eval_every: evaluate every this many server updates, or
    eval_every_time: every this many seconds of the runtime's clock.
  """

  clock = "simulated"

  def __init__(
    self,
    eval_fn: Callable[[optax.Params], dict[str, Any]] | None,
    eval_every: int | None,
    eval_every_time: float | None,
  ):
    self.schedule = EvalSchedule.make(eval_fn, eval_every, eval_every_time)
    self._evaluate = jax.jit(self.schedule.evaluate_with) if eval_fn is not None else None
    self._initial_metrics: dict[str, float] = {}
    self._prepared = False
    self.metric_names: tuple[str, ...] = ()

  def _prepare(self, params: optax.Params) -> None:
    """What the compiled step needs from the parameters' shapes (no compute); subclasses extend it."""
    self.metric_names = tuple(sorted(self.schedule.metric_shapes(params)))

  def _ensure_prepared(self, params: optax.Params) -> None:
    if not self._prepared:
      self._prepare(params)
      self._prepared = True

  def _start(self, params: optax.Params) -> None:
    """``init``'s shared part: set up for ``params`` and evaluate them (the first evaluation row)."""
    self._prepared = False
    self._ensure_prepared(params)
    self._initial_metrics = self.evaluate(params)

  def evaluate(self, params: optax.Params) -> dict[str, float]:
    """``eval_fn(params)`` as Python floats (``{}`` without an ``eval_fn``); compiled once."""
    if self._evaluate is None:
      return {}
    metrics = self._evaluate(self.schedule.eval_arrays(), params)
    return {name: float(value) for name, value in metrics.items()}

  @property
  def initial_metrics(self) -> dict[str, float]:
    """The metrics of the parameters given to the last ``init`` (``{}`` before one)."""
    return dict(self._initial_metrics)

  def totals(self, state: Any) -> RunTotals:
    """Per-worker and per-run totals read off ``state``."""
    raise NotImplementedError

  def agree_to_stop(self, requested: bool) -> bool:
    """Whether the run stops at this safe point, given this process's ``requested``.

    One process decides alone; the processes of a synchronous run must all stop
    at the same round, so that runtime stops when any of them asks.
    """
    return requested

  def saved_state(self, state: Any) -> Any:
    """What a checkpoint of ``state`` holds: all of it, unless a subclass says otherwise."""
    return state

  def restored_state(self, saved: Any) -> Any:
    """A state ``advance`` takes, from :meth:`saved_state`'s: the same, unless a subclass says otherwise."""
    return saved

  def earlier_states(self, saved: Any, step: int) -> list[tuple[Any, Callable[[Any], Any]]]:
    """None: a run keeps its shape, unless a subclass says otherwise (a synchronous run that shrinks)."""
    del saved, step
    return []

  def history(
    self, records: list[EventRecord], state: Any, *, initial_metrics: dict[str, float] | None = None
  ) -> History:
    """Assembles a :class:`History` from the records of one or more ``advance`` calls.

    ``records`` is a list of what each ``advance`` returned, or one call's records alone.

    ``initial_metrics`` gives the first evaluation row for a state restored
    from a checkpoint (default: those of the last ``init``).
    """
    if isinstance(records, EventRecord):  # the records of one advance, as advance returned them
      records = [records]
    initial = self.initial_metrics if initial_metrics is None else initial_metrics
    return assemble_history(records, initial, self.metric_names, self.totals(state), clock=self.clock)
