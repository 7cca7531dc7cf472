"""What a strategy is: its rules, its dispatch policy, its topology, and what it costs a server.

A strategy is three pure pieces (docs/design.md): a *server rule* (an optax
transform applied to each arrival, or to each round's aggregate), a *dispatch
policy* (which waiting workers get parameters after an arrival) and a *worker
rule* (what a worker does to its gradient, or to its own model, before it
sends). Both runtimes, the simulator and the multi-process runtime, take a
:class:`Strategy` and run exactly these pieces; the registry
(:mod:`jaxsync._src.strategies.registry`) builds one per name.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any, NamedTuple

import optax

from jaxsync._src.core import validation
from jaxsync._src.rules import guard
from jaxsync._src.rules.model_state import keep_model_state, keeps_model_state


class Engine(enum.StrEnum):
  """How a strategy's events run: rounds behind a barrier, or one arrival at a time."""

  SYNC = "sync"
  ASYNC = "async"


class WorkerProtocol(enum.StrEnum):
  """What a worker sends: a gradient, its own model to an elastic centre, or local models to average."""

  GRADIENT = "gradient"
  ELASTIC = "elastic"
  LOCAL = "local"


class Dispatch(enum.StrEnum):
  """Who gets the parameters after an asynchronous arrival (docs/algorithms.md §0)."""

  IMMEDIATE = "immediate"  # the sender, at once
  SSP = "ssp"  # waiting senders within the staleness bound of the slowest
  ON_RELEASE = "on_release"  # the waiting senders, when the server rule releases an update
  ON_RELEASE_FRESH = "on_release_fresh"  # stale senders at once, fresh ones on release (adaptive-k)


class Communication(enum.StrEnum):
  """The cost model of an exchange (see ``TimeModel``)."""

  PARAMETER_SERVER = "parameter_server"
  RING = "ring"
  HIERARCHICAL = "hierarchical"
  SHARED_MEMORY = "shared_memory"  # no network (Hogwild!)
  NODE_LOCAL = "node_local"  # workers push to their node, the server pulls node sums (InHAD)


class RateClock(enum.StrEnum):
  """What counts the steps of a strategy's learning-rate schedule."""

  SERVER_UPDATES = "server_updates"  # the server rule's updates (an arrival applied, or a release)
  WORKER_STEPS = "worker_steps"  # each worker's own steps (its rule holds the rate: local SGD, EASGD, BB)


class ServerTraffic(NamedTuple):
  """The server's memory traffic, in parameter-sized arrays read plus written (the equations' minimum).

  A server applying a rule is bound by memory bandwidth on a fast network (the
  argument of Zhang, Ji, Wang, JPDC 2022, §3.6): SGD reads the gradient and the
  parameters and writes the parameters (3 arrays); momentum adds a buffer read
  and written (5); Adam two (7). A buffering rule pays for accumulating each
  arrival and, on a release, for the update.

  Attributes:
    arrival: arrays per accepted arrival (accumulating it; 0 for a rule that
      applies every arrival, whose cost is all in ``release``).
    release: arrays per update the arrival releases.
  """

  arrival: float
  release: float


def _enum(what: str, name: str, value: Any, kind: type[enum.StrEnum]) -> enum.StrEnum:
  validation.check_choice(
    what, name, str(value) if isinstance(value, kind) else value, [m.value for m in kind]
  )
  return kind(value)


@dataclasses.dataclass(frozen=True)
class PseudoGradientExchange:
  """How synchronous local workers exchange their pseudo-gradients (DiLoCo, Streaming DiLoCo).

  Attributes:
    fragments: ``P``: the parameters are cut into ``P`` fragments and round
      ``r`` synchronizes fragment ``r mod P`` (1: every parameter every round).
    overlap: ``tau``: the fragment's pseudo-gradient is taken ``tau`` local
      steps before the round ends, and its exchange overlaps them.
    mixing: ``alpha``: a worker's synchronized fragment becomes
      ``(1 - alpha) theta_new + alpha x`` (0: the new global parameters).
    quantize: the wire format of the pseudo-gradients: ``None`` (full
      precision), ``"bfloat16"``, ``"int8"`` or ``"int4"`` (per-block scales).
    quantize_block: values per scale of the integer formats.
  """

  fragments: int = 1
  overlap: int = 0
  mixing: float = 0.0
  quantize: str | None = None
  quantize_block: int = 64


@dataclasses.dataclass(frozen=True)
class Blueprint:
  """A strategy less its rules: its protocol, dispatch policy, topology, clocks and costs.

  What the registry knows of a strategy before it builds a rule
  (``jaxsync.strategies.blueprint``): enough to make a learning-rate schedule
  on the strategy's clock (``rate_clock``, ``gradients_per_update``) and to
  price its exchanges (``server_traffic``), so that the strategy is then made
  once, with that schedule.

  Attributes:
    name: the registry name.
    num_workers: ``K``, the workers the rules are built for.
    engine: :class:`Engine`: rounds behind a barrier (``"sync"``) or one
      arrival at a time (``"async"``).
    protocol: :class:`WorkerProtocol`, what a worker sends: ``"gradient"``
      (the server rule takes the message as a gradient), ``"elastic"`` (the
      worker keeps its own model and exchanges it with an elastic centre) or
      ``"local"`` (workers take ``local_steps`` local steps, then the server
      averages their models).
    dispatch: :class:`Dispatch`, who gets parameters after an async arrival.
    communication: :class:`Communication`, the cost model of an exchange.
    staleness_bound: SSP's ``s`` (``dispatch="ssp"`` only).
    fresh_staleness: ``dispatch="on_release_fresh"`` only: the largest
      staleness at which an arrival counts as fresh (waits for the release and
      counts toward its ``k``); ``None``: every arrival. Equals the server
      rule's own reading (adaptive k's ``fresh_staleness``).
    gradients_per_round: sync only: how many of the ``K`` gradients of a round
      are aggregated (the fastest ones); ``K`` for BSP.
    local_steps: ``"local"`` protocol: steps between model averages (sync),
      or between pushes (async; the fastest worker's with DyLU).
    exchange: :class:`PseudoGradientExchange`, a synchronous ``"local"``
      strategy's fragments, overlap, mixing and wire format.
    unit_local_steps: an asynchronous ``"local"`` strategy's local steps per
      unit, or ``None`` for ``local_steps`` each (set by
      :func:`with_worker_speeds` when the strategy uses Dynamic Local Updates).
    quorum: a synchronous local strategy with elastic membership (on a
      parameter server, :attr:`elastic_membership`): the fewest
      pseudo-gradients an outer step averages; ``None``: fixed membership.
    deadline: elastic membership: seconds a round waits, after its first
      pseudo-gradient, for the other live workers' (then it closes with
      those in, at least ``quorum``); ``None``: it waits for every live worker.
    group_size: workers per synchronous group: the lower level of a
      hierarchical all-reduce, or an EA-wild group that all-reduces its
      gradient and exchanges as one (the engine schedules it as one worker).
    node_size: workers per node that push to their node's aggregator (InHAD).
    lock_free: elastic: the centre increment is computed against the centre
      the worker read when it started its step (EA-wild), not the current one.
    rate_clock: :class:`RateClock`, what counts the steps of the learning
      rate's schedule (the server rule's updates, or each worker's own steps).
    gradients_per_update: worker gradients one server update combines (1 for
      a rule that applies every arrival, ``K`` for BSP); ``None`` where it
      varies (adaptive-k). Converts a schedule given in epochs to its clock.
    server_traffic: :class:`ServerTraffic`, the server's memory traffic, which
      the time model charges at its memory bandwidth.
    options: the resolved options the strategy is made with.
  """

  name: str
  num_workers: int
  engine: Engine
  protocol: WorkerProtocol
  dispatch: Dispatch = Dispatch.IMMEDIATE
  communication: Communication = Communication.PARAMETER_SERVER
  staleness_bound: int | None = None
  fresh_staleness: int | None = 0
  gradients_per_round: int | None = None
  local_steps: int = 1
  unit_local_steps: tuple[int, ...] | None = None
  exchange: PseudoGradientExchange = PseudoGradientExchange()
  quorum: int | None = None
  deadline: float | None = None
  group_size: int = 1
  node_size: int = 1
  lock_free: bool = False
  rate_clock: RateClock = RateClock.SERVER_UPDATES
  gradients_per_update: float | None = 1.0
  server_traffic: ServerTraffic = ServerTraffic(0.0, 3.0)
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    what = f"Strategy {self.name!r}"
    for name, kind in (
      ("engine", Engine),
      ("protocol", WorkerProtocol),
      ("dispatch", Dispatch),
      ("communication", Communication),
      ("rate_clock", RateClock),
    ):
      object.__setattr__(self, name, _enum(what, name, getattr(self, name), kind))

  @property
  def num_units(self) -> int:
    """The workers as the runtimes schedule them: an EA-wild group of ``group_size`` acts as one.

    ``K / G`` for an elastic strategy with synchronous groups (one simulated
    worker, one worker process each), else ``K``.
    """
    return self.num_workers // self.workers_per_unit

  @property
  def elastic_membership(self) -> bool:
    """Whether rounds average the pseudo-gradients of whichever workers delivered (DiLoCo on a parameter server).

    Workers may leave and join between rounds; a round closes when every
    live worker delivered, or ``deadline`` seconds after its first delivery,
    with at least ``quorum`` pseudo-gradients.
    """
    return self.quorum is not None

  @property
  def workers_per_unit(self) -> int:
    """Workers in one of :attr:`num_units`: an EA-wild group's ``G``, else 1."""
    return self.group_size if self.protocol == WorkerProtocol.ELASTIC else 1

  @property
  def gradients_per_event(self) -> int:
    """Worker gradients one simulator event costs: 1 for an arrival (``G`` for an EA-wild group's step),
    ``K x local_steps`` for a round.

    Every worker computes in a round, also those fastest-k cancels: a gradient budget counts what
    the workers computed, not what the server applied.
    """
    if self.engine == Engine.ASYNC and self.protocol == WorkerProtocol.LOCAL:
      return max(1, round(sum(self.local_steps_per_unit) / self.num_units))
    if self.engine == Engine.ASYNC:
      return self.workers_per_unit
    return self.num_workers * self.local_steps

  @property
  def local_steps_per_unit(self) -> tuple[int, ...]:
    """Local steps each unit takes per exchange (asynchronous local SGD): ``unit_local_steps``, else ``local_steps`` each."""
    if self.unit_local_steps is not None:
      return self.unit_local_steps
    return (self.local_steps,) * self.num_units


@dataclasses.dataclass(frozen=True, kw_only=True)
class Strategy(Blueprint):
  """One synchronization strategy: its :class:`Blueprint` (protocol, dispatch, topology, costs) and its rules.

  Attributes:
    server_rule: applied per arrival (async) or to the round's aggregate
      (sync). Extra args it may read: ``worker``, ``version``, ``num_live_workers``,
      ``grads_finite``, ``center_read``.
    worker_rule: applied by the worker to its gradient before sending (or to
      its own model, for ``"elastic"`` and ``"local"``); ``None`` sends the
      raw gradient. Extra args it may read: ``noise_ratio``, ``value_fn``,
      ``center``, ``grads_finite``.

  and every attribute of :class:`Blueprint`.
  """

  server_rule: optax.GradientTransformationExtraArgs
  worker_rule: optax.GradientTransformationExtraArgs | None


def dynamic_local_steps(period: int, step_times, minimum: int = 1) -> tuple[int, ...]:
  """Dynamic Local Updates: ``H_k = max(minimum, floor(H v_k / max_j v_j))``, ``v_k = 1 / step_times[k]``.

  Each worker takes as many local steps as it can in the time the fastest
  takes ``H``, so slow workers push as often as fast ones (Liu et al., 2024).

  Args:
    period: ``H``, the fastest worker's local steps.
    step_times: each worker's mean seconds per step.
    minimum: the fewest local steps a worker takes.

  Returns:
    ``H_k`` per worker.
  """
  times = [float(t) for t in step_times]
  fastest = min(times)
  # A hair below 1 absorbs rounding in t_min / t_k when two workers are equally fast.
  return tuple(max(minimum, int(period * fastest / t + 1e-9)) for t in times)


def with_worker_speeds(strategy: Strategy, step_times) -> Strategy:
  """``strategy`` with its per-worker local steps set from the workers' speeds, if it uses Dynamic Local Updates.

  A strategy made with ``dylu=True`` (``async_local_sgd``) needs each worker's
  mean seconds per step to size its local steps (:func:`dynamic_local_steps`);
  the simulator calls this with its time model's, and ``jaxsync train`` and
  ``jaxsync launch`` with the config's ``cluster`` section's, so a run is
  deterministic and the real runtime takes the simulator's steps. Any other
  strategy is returned as it is.

  Args:
    strategy: a strategy.
    step_times: ``[K]`` mean seconds per step (``TimeModel.mean_compute_times()``).

  Returns:
    The strategy, with ``unit_local_steps`` set where DyLU applies.
  """
  if not strategy.options.get("dylu"):
    return strategy
  times = list(step_times)
  if len(times) != strategy.num_units:
    raise validation.invalid(
      strategy.name, "step_times", step_times, f"{strategy.num_units} mean step times, one per worker"
    )
  steps = dynamic_local_steps(strategy.local_steps, times, strategy.options.get("min_local_steps", 1))
  return dataclasses.replace(strategy, unit_local_steps=steps)


def with_model_state(strategy: Strategy) -> Strategy:
  """``strategy`` for a model carried with its state (``{"params", "model_state"}``: BatchNorm statistics).

  Its rules see the parameters alone (:func:`jaxsync._src.rules.model_state.keep_model_state`):
  no weight decay, momentum or learning rate touches the state, and each arriving change of the
  state is applied whole, or as a share of it (below). What that does to the state, family by family
  (docs/guide/own_model.md):

  * synchronous gradient strategies (all-reduce, BSP, fastest-k): a round's all-reduce averages the
    workers' changes, so the state ends at the mean of the workers' new states;
  * the parameter-server family: each accepted arrival moves the server's state by a ``1/K`` share of
    its change (``K`` live workers; a round of ``K`` arrivals from one state moves it by their mean),
    a buffering rule (adaptive-k, k-async, InHAD) by the mean of the changes it releases;
  * local strategies (local SGD, DiLoCo, Streaming DiLoCo): each worker keeps its own state through
    its local steps; a round's outer step sets the global state to the workers' mean, and every
    worker starts the next round from it (asynchronous local SGD: as the parameter-server family);
  * elastic strategies (EASGD, EAMSGD, EA-wild): each worker keeps its own state; the centre's
    moves towards each exchanging worker's as its parameters do, ``alpha (s_k - s_center)``.

  Args:
    strategy: a strategy (``jaxsync.strategies.make``).

  Returns:
    The same strategy, its rules wrapped; a rule already wrapped is not wrapped again.
  """
  elastic = strategy.protocol == WorkerProtocol.ELASTIC

  def wrapped(rule, mode):
    return rule if rule is None or keeps_model_state(rule) else keep_model_state(rule, mode)

  # A server applies a round's mean as it is, and one of K asynchronous arrivals by a K-th share (a
  # buffering rule, the mean of what it releases). The elastic centre rule takes a worker's model, not a
  # gradient: on the whole tree it moves the centre's state towards the worker's, as elastic averaging does.
  if elastic:
    server_rule = strategy.server_rule
  else:
    server_rule = wrapped(strategy.server_rule, "share" if strategy.engine == Engine.ASYNC else "apply")
  # A worker rule's output is its own step (local and elastic workers), or its message to the server.
  worker_mode = "message" if strategy.protocol == WorkerProtocol.GRADIENT else "apply"
  return dataclasses.replace(
    strategy, server_rule=server_rule, worker_rule=wrapped(strategy.worker_rule, worker_mode)
  )


def reject_nonfinite(tx: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
  """Gives a plain optax rule jaxsync's NaN/Inf policy: a non-finite arrival changes nothing.

  ``u, s' = tx(g, s)`` when ``g`` is finite, else ``0, s``. The extra arg
  ``grads_finite`` replaces the scan, as for every jaxsync rule.

  Args:
    tx: any optax transform.

  Returns:
    The same transform with extra-args support and the guard.
  """
  tx = optax.with_extra_args_support(tx)

  def update_fn(updates, state, params=None, *, grads_finite=None, **extra_args):
    finite = guard.tree_all_finite(updates) if grads_finite is None else grads_finite
    new_updates, new_state = tx.update(updates, state, params, **extra_args)
    new_updates = guard.keep_if(finite, new_updates, optax.tree.zeros_like(new_updates))
    return new_updates, guard.keep_if(finite, new_state, state)

  return optax.GradientTransformationExtraArgs(tx.init, update_fn)
