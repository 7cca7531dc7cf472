"""The strategy registry: every synchronization model of the papers, by name.

A strategy is three pure pieces (design.md): a *server rule* (an optax
transform applied to each arrival, or to each round's aggregate), a *dispatch
policy* (which waiting workers get parameters after an arrival) and a *worker
rule* (what a worker does to its gradient, or to its own model, before it
sends). Both runtimes, the simulator and the multi-process runtime, take a
:class:`Strategy` and run exactly these pieces.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import optax

from jaxsync._src.core import validation
from jaxsync._src.rules import barzilai_borwein, guard
from jaxsync._src.rules.adaptive_k import adaptive_k as adaptive_k_rule
from jaxsync._src.rules.elastic import ea_wild_center, easgd_center, easgd_worker
from jaxsync._src.rules.ordered_momentum import ordered_momentum
from jaxsync._src.rules.release import on_release
from jaxsync._src.rules.smega2 import smega2 as smega2_rule
from jaxsync._src.rules.staleness import scale_by_staleness


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
  """Who gets the parameters after an asynchronous arrival (docs/algorithms.md)."""

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


def _enum(what: str, name: str, value: Any, kind: type[enum.StrEnum]) -> enum.StrEnum:
  validation.check_choice(
    what, name, str(value) if isinstance(value, kind) else value, [m.value for m in kind]
  )
  return kind(value)


@dataclasses.dataclass(frozen=True)
class Strategy:
  """One synchronization strategy: its rules, its dispatch policy, its topology.

  Attributes:
    name: the registry name.
    num_workers: ``K``, the workers the rules were built for.
    engine: :class:`Engine`: rounds behind a barrier (``"sync"``) or one
      arrival at a time (``"async"``).
    protocol: :class:`WorkerProtocol`, what a worker sends: ``"gradient"``
      (the server rule takes the message as a gradient), ``"elastic"`` (the
      worker keeps its own model and exchanges it with an elastic centre) or
      ``"local"`` (workers take ``local_steps`` local steps, then the server
      averages their models).
    server_rule: applied per arrival (async) or to the round's aggregate
      (sync). Extra args it may read: ``version``, ``num_live_workers``,
      ``grads_finite``, ``center_read``.
    worker_rule: applied by the worker to its gradient before sending (or to
      its own model, for ``"elastic"`` and ``"local"``); ``None`` sends the
      raw gradient. Extra args it may read: ``noise_ratio``, ``value_fn``,
      ``center``, ``grads_finite``.
    dispatch: :class:`Dispatch`, who gets parameters after an async arrival.
    communication: :class:`Communication`, the cost model of an exchange.
    staleness_bound: SSP's ``s`` (``dispatch="ssp"`` only).
    gradients_per_round: sync only: how many of the ``K`` gradients of a round
      are aggregated (the fastest ones); ``K`` for BSP.
    local_steps: ``"local"`` protocol: steps between model averages.
    group_size: workers per synchronous group: the lower level of a
      hierarchical all-reduce, or an EA-wild group that all-reduces its
      gradient and exchanges as one (the engine schedules it as one worker).
    node_size: workers per node that push to their node's aggregator (InHAD).
    lock_free: elastic: the centre increment is computed against the centre
      the worker read when it started its step (EA-wild), not the current one.
    options: the resolved options the strategy was made with.
  """

  name: str
  num_workers: int
  engine: Engine
  protocol: WorkerProtocol
  server_rule: optax.GradientTransformationExtraArgs
  worker_rule: optax.GradientTransformationExtraArgs | None
  dispatch: Dispatch = Dispatch.IMMEDIATE
  communication: Communication = Communication.PARAMETER_SERVER
  staleness_bound: int | None = None
  gradients_per_round: int | None = None
  local_steps: int = 1
  group_size: int = 1
  node_size: int = 1
  lock_free: bool = False
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    what = f"Strategy {self.name!r}"
    for name, kind in (
      ("engine", Engine),
      ("protocol", WorkerProtocol),
      ("dispatch", Dispatch),
      ("communication", Communication),
    ):
      object.__setattr__(self, name, _enum(what, name, getattr(self, name), kind))


def reject_nonfinite(tx: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
  """Gives a plain optax rule jaxsync's NaN/Inf policy: a non-finite arrival changes nothing.

  ``u, s' = tx(g, s)`` when ``g`` is finite, else ``0, s``. The extra arg
  ``grads_finite`` replaces the scan, as for every jaxsync rule.
  """
  tx = optax.with_extra_args_support(tx)

  def update_fn(updates, state, params=None, *, grads_finite=None, **extra_args):
    finite = guard.tree_all_finite(updates) if grads_finite is None else grads_finite
    new_updates, new_state = tx.update(updates, state, params, **extra_args)
    new_updates = guard.keep_if(finite, new_updates, optax.tree.zeros_like(new_updates))
    return new_updates, guard.keep_if(finite, new_state, state)

  return optax.GradientTransformationExtraArgs(tx.init, update_fn)


def _sgd(learning_rate: float, momentum: float = 0.0, nesterov: bool = False):
  return reject_nonfinite(optax.sgd(learning_rate, momentum=momentum or None, nesterov=nesterov))


def _check_momentum(name: str, momentum: float) -> float:
  return validation.check_real(name, "momentum", momentum, low=0.0, high=1.0, high_open=True)


def _check_lr(name: str, learning_rate: float) -> float:
  return validation.check_real(name, "learning_rate", learning_rate, low=0.0, low_open=True)


def _check_divides(name: str, option: str, value: int, num_workers: int) -> int:
  value = validation.check_int(name, option, value)
  if num_workers % value:
    raise validation.invalid(name, option, value, f"a divisor of num_workers={num_workers}")
  return value


def _moving_rate(name: str, moving_rate: float | None, num_workers: int) -> float:
  # EASGD's beta = p alpha = 0.9 (docs/algorithms.md §12, the authors' mpiT code): alpha = 0.9 / p.
  if moving_rate is None:
    return 0.9 / num_workers
  return validation.check_real(name, "moving_rate", moving_rate, low=0.0, high=1.0)


# ---------------------------------------------------------------------------
# The registry.
# ---------------------------------------------------------------------------

_REGISTRY: dict[str, Callable[..., Strategy]] = {}


def _register(*names: str):
  def add(factory):
    for name in names:
      _REGISTRY[name] = factory
    return factory

  return add


def names() -> tuple[str, ...]:
  """The registered strategy names, sorted."""
  return tuple(sorted(_REGISTRY))


@dataclasses.dataclass(frozen=True)
class StrategyInfo:
  """What ``jaxsync strategies`` prints: a strategy's summary and options with defaults."""

  name: str
  summary: str
  options: Mapping[str, Any]


def describe(name: str) -> StrategyInfo:
  """The summary line and the options (with their defaults) of strategy ``name``."""
  factory = _lookup(name)
  doc = inspect.getdoc(factory) or ""
  options = {
    p.name: p.default for p in inspect.signature(factory).parameters.values() if p.kind == p.KEYWORD_ONLY
  }
  return StrategyInfo(name=name, summary=doc.splitlines()[0] if doc else "", options=options)


def _lookup(name: str) -> Callable[..., Strategy]:
  if name not in _REGISTRY:
    raise ValueError(f"strategy name={name!r} is unknown; expected one of: {', '.join(names())}.")
  return _REGISTRY[name]


def make(name: str, num_workers: int, **options: Any) -> Strategy:
  """Builds strategy ``name`` for ``num_workers`` workers with the given options.

  Every option has the papers' default (see :func:`describe`); an unknown name
  or option raises ``ValueError`` listing the valid ones, and an invalid value
  raises ``ValueError`` naming it, all before anything is compiled.

  Args:
    name: a registry name, see :func:`names`.
    num_workers: ``K >= 1``.
    **options: the strategy's options.

  Returns:
    A :class:`Strategy`.

  Example:
    >>> import jaxsync
    >>> s = jaxsync.strategies.make("ormo", num_workers=8, learning_rate=0.05)
    >>> str(s.engine), str(s.dispatch), s.options["momentum"]
    ('async', 'immediate', 0.9)
  """
  factory = _lookup(name)
  num_workers = validation.check_int(f"strategy {name!r}", "num_workers", num_workers)
  valid = describe(name).options
  unknown = sorted(set(options) - set(valid))
  if unknown:
    raise ValueError(
      f"strategy {name!r}: unknown option(s) {', '.join(unknown)}; valid options: {', '.join(sorted(valid))}."
    )
  resolved = {**valid, **options}
  strategy = factory(num_workers, **resolved)
  return dataclasses.replace(strategy, name=name, options=resolved)


# ---------------------------------------------------------------------------
# Synchronous strategies.
# ---------------------------------------------------------------------------


@_register("bsp")
def _bsp(
  num_workers, *, learning_rate=0.01, momentum=0.9, communication="parameter_server", group_size=None
) -> Strategy:
  """Bulk-synchronous SGD with momentum: a barrier, the mean of K gradients (the papers' synchronous baseline)."""
  name = "bsp"
  communication = validation.check_choice(
    name, "communication", communication, ("parameter_server", "ring", "hierarchical")
  )
  if communication == "hierarchical":
    group_size = _check_divides(
      name, "group_size", min(4, num_workers) if group_size is None else group_size, num_workers
    )
  elif group_size is not None:
    raise validation.invalid(name, "group_size", group_size, "None unless communication='hierarchical'")
  return Strategy(
    name=name,
    num_workers=num_workers,
    engine="sync",
    protocol="gradient",
    server_rule=_sgd(_check_lr(name, learning_rate), _check_momentum(name, momentum)),
    worker_rule=None,
    communication=communication,
    gradients_per_round=num_workers,
    group_size=group_size or 1,
  )


@_register("allreduce")
def _allreduce(num_workers, *, learning_rate=0.01, momentum=0.9) -> Strategy:
  """BSP over a ring all-reduce instead of a parameter server (Horovod-style; Wongpanich et al., HPCAsia 2020)."""
  return _bsp(num_workers, learning_rate=learning_rate, momentum=momentum, communication="ring")


@_register("hierarchical_allreduce")
def _hierarchical_allreduce(num_workers, *, learning_rate=0.01, momentum=0.9, group_size=None) -> Strategy:
  """BSP over a two-level all-reduce: groups of ``group_size`` (default 4), then leaders (HPCAsia 2020)."""
  return _bsp(
    num_workers,
    learning_rate=learning_rate,
    momentum=momentum,
    communication="hierarchical",
    group_size=group_size,
  )


@_register("fastest_k", "drop_worker")
def _fastest_k(num_workers, *, learning_rate=0.01, momentum=0.9, k=None, drop_rate=0.5) -> Strategy:
  """Synchronous rounds that aggregate the k fastest gradients and drop the rest (Dutta et al., AISTATS 2018)."""
  name = "fastest_k"
  rate = validation.check_real(name, "drop_rate", drop_rate, low=0.0, high=1.0, high_open=True)
  if k is None:
    k = max(1, round((1.0 - rate) * num_workers))
  k = validation.check_int(name, "k", k)
  if k > num_workers:
    raise validation.invalid(name, "k", k, f"an integer in [1, num_workers={num_workers}]")
  strategy = _bsp(num_workers, learning_rate=learning_rate, momentum=momentum)
  return dataclasses.replace(strategy, gradients_per_round=k)


@_register("local_sgd")
def _local_sgd(
  num_workers,
  *,
  learning_rate=0.01,
  momentum=0.0,
  period=8,
  outer_learning_rate=1.0,
  outer_momentum=0.0,
) -> Strategy:
  """Local SGD: ``period`` local steps per worker, then the models are averaged (DiLoCo's outer step).

  The server rule is the outer optimizer on the pseudo-gradient
  ``theta - mean_k x_k``: SGD with rate 1 is plain model averaging; a
  Nesterov outer momentum gives DiLoCo's outer loop.
  """
  name = "local_sgd"
  period = validation.check_int(name, "period", period)
  outer_lr = validation.check_real(name, "outer_learning_rate", outer_learning_rate, low=0.0, low_open=True)
  outer_m = validation.check_real(name, "outer_momentum", outer_momentum, low=0.0, high=1.0, high_open=True)
  return Strategy(
    name=name,
    num_workers=num_workers,
    engine="sync",
    protocol="local",
    server_rule=_sgd(outer_lr, outer_m, nesterov=outer_m > 0),
    worker_rule=_sgd(_check_lr(name, learning_rate), _check_momentum(name, momentum)),
    communication="ring",
    local_steps=period,
  )


# ---------------------------------------------------------------------------
# Asynchronous strategies with a parameter server.
# ---------------------------------------------------------------------------


def _async(name, num_workers, server_rule, worker_rule=None, *, protocol="gradient", **fields) -> Strategy:
  return Strategy(
    name=name,
    num_workers=num_workers,
    engine="async",
    protocol=protocol,
    server_rule=server_rule,
    worker_rule=worker_rule,
    **fields,
  )


@_register("asp")
def _asp(num_workers, *, learning_rate=0.01) -> Strategy:
  """Asynchronous SGD through a parameter server: apply each arrival, reply at once (Dean et al., NeurIPS 2012)."""
  return _async("asp", num_workers, _sgd(_check_lr("asp", learning_rate)))


@_register("hogwild")
def _hogwild(num_workers, *, learning_rate=0.01) -> Strategy:
  """Hogwild: ASGD on shared memory, lock-free, no network cost (Niu et al. 2011)."""
  return _async(
    "hogwild", num_workers, _sgd(_check_lr("hogwild", learning_rate)), communication="shared_memory"
  )


@_register("naive_asgdm")
def _naive_asgdm(num_workers, *, learning_rate=0.1, momentum=0.9) -> Strategy:
  """ASGD with server momentum applied straight to stale gradients (the OrMo paper's baseline, NeurIPS 2024)."""
  name = "naive_asgdm"
  return _async(name, num_workers, _sgd(_check_lr(name, learning_rate), _check_momentum(name, momentum)))


@_register("shifted_momentum")
def _shifted_momentum(num_workers, *, learning_rate=0.1, momentum=0.9) -> Strategy:
  """Shifted momentum: each worker keeps a local momentum and sends it (Giladi et al., ICLR 2020)."""
  name = "shifted_momentum"
  worker = reject_nonfinite(optax.trace(decay=_check_momentum(name, momentum)))
  return _async(name, num_workers, _sgd(_check_lr(name, learning_rate)), worker)


@_register("smega2")
def _smega2(
  num_workers, *, learning_rate=0.1, momentum=0.9, dampening=0.0, look_ahead="advanced"
) -> Strategy:
  """SMEGA²: one shared momentum updated per cycle of K arrivals, look-ahead replies (Cohen et al., ICPP 2022)."""
  rule = smega2_rule(
    learning_rate, momentum, num_workers=num_workers, dampening=dampening, look_ahead=look_ahead
  )
  return _async("smega2", num_workers, rule)


@_register("ormo")
def _ormo(num_workers, *, learning_rate=0.1, momentum=0.9) -> Strategy:
  """OrMo: ordered momentum, stale gradients placed by their iteration group (Shi et al., NeurIPS 2024)."""
  return _async("ormo", num_workers, ordered_momentum(learning_rate, momentum, num_workers=num_workers))


@_register("ormo_da")
def _ormo_da(num_workers, *, learning_rate=0.1, momentum=0.9, delay_measure="iterations") -> Strategy:
  """OrMo-DA: OrMo with a delay-adaptive learning rate (Shi et al., NeurIPS 2024)."""
  rule = ordered_momentum(
    learning_rate, momentum, num_workers=num_workers, delay_adaptive=True, delay_measure=delay_measure
  )
  return _async("ormo_da", num_workers, rule)


@_register("ssp")
def _ssp(num_workers, *, learning_rate=0.01, momentum=0.0, staleness_bound=3) -> Strategy:
  """Stale synchronous parallel: no worker runs more than ``staleness_bound`` clocks ahead (Ho et al., NeurIPS 2013)."""
  name = "ssp"
  bound = validation.check_int(name, "staleness_bound", staleness_bound, low=0)
  rule = _sgd(_check_lr(name, learning_rate), _check_momentum(name, momentum))
  return _async(name, num_workers, rule, dispatch="ssp", staleness_bound=bound)


def _buffered_sgd(per_update: int, learning_rate: float, momentum: float):
  # Averages `per_update` arrivals, then one SGD(-momentum) step on each release only.
  return on_release(
    scale_by_staleness("none", gradients_per_update=per_update), _sgd(learning_rate, momentum)
  )


@_register("k_async")
def _k_async(num_workers, *, learning_rate=0.01, momentum=0.0, k=None) -> Strategy:
  """K-async SGD: update on any k arrivals (stale or not), reply to those k (Dutta et al., AISTATS 2018)."""
  name = "k_async"
  k = validation.check_int(name, "k", max(1, num_workers // 2) if k is None else k)
  if k > num_workers:
    raise validation.invalid(name, "k", k, f"an integer in [1, num_workers={num_workers}]")
  rule = _buffered_sgd(k, _check_lr(name, learning_rate), _check_momentum(name, momentum))
  return _async(name, num_workers, rule, dispatch="on_release")


@_register("staleness_aware_asp")
def _staleness_aware_asp(
  num_workers, *, learning_rate=0.01, mode="linear", penalty=None, gradients_per_update=1
) -> Strategy:
  """ASGD with a learning rate divided by staleness (or its exponential penalty), n-softsync (Zhang et al., IJCAI 2016)."""
  name = "staleness_aware_asp"
  rule = optax.chain(
    scale_by_staleness(mode, penalty=penalty, gradients_per_update=gradients_per_update),
    optax.scale_by_learning_rate(_check_lr(name, learning_rate)),
  )
  return _async(name, num_workers, rule)


@_register("adaptive_k")
def _adaptive_k(
  num_workers,
  *,
  learning_rate=0.01,
  momentum=0.9,
  theta=1.0,
  confidence=0.95,
  ci_endpoint="upper",
  max_k=None,
  bb_step_size=False,
  bb_smoothing=0.1,
  bb_max_scale=barzilai_borwein.DEFAULT_MAX_SCALE,
  armijo=False,
) -> Strategy:
  """Adaptive-k release, progressive momentum, optional per-worker BB step sizes (Zhang, Ji, Wang, JPDC 2022).

  ``bb_max_scale`` (jaxsync's safeguard, not the paper's) bounds each worker's BB
  step to ``[learning_rate / bb_max_scale, learning_rate * bb_max_scale]``;
  ``None`` is the paper's unbounded rule (see :func:`jaxsync.bb_step_size`).
  """
  name = "adaptive_k"
  lr = _check_lr(name, learning_rate)
  max_scale = barzilai_borwein.check_max_scale(name, "bb_max_scale", bb_max_scale)
  use_bb = validation.check_bool(name, "bb_step_size", bb_step_size)
  use_armijo = validation.check_bool(name, "armijo", armijo)
  if use_armijo and not use_bb:
    raise validation.invalid(name, "armijo", armijo, "False unless bb_step_size=True")
  if max_k is not None:
    max_k = validation.check_int(name, "max_k", max_k)
    if max_k > num_workers:
      raise validation.invalid(name, "max_k", max_k, f"None or an integer in [1, num_workers={num_workers}]")
  server = adaptive_k_rule(
    momentum=momentum, theta=theta, confidence=confidence, ci_endpoint=ci_endpoint, max_k=max_k or num_workers
  )
  if use_bb:
    # Workers send alpha_i g_i (docs/algorithms.md §11c); the server applies rate 1 (§11b).
    worker = barzilai_borwein.bb_step_size(
      lr, smoothing=bb_smoothing, max_scale=max_scale, armijo=use_armijo, server_momentum=momentum
    )
    rule = optax.chain(server, optax.scale(-1.0))
  else:
    worker = None
    rule = optax.chain(server, optax.scale_by_learning_rate(lr))
  return _async(
    name,
    num_workers,
    rule,
    worker,
    dispatch="on_release_fresh",
  )


@_register("inhad")
def _inhad(
  num_workers,
  *,
  learning_rate=0.01,
  momentum=0.0,
  local_workers=None,
  pull_threshold=None,
  wait_for_pull=False,
) -> Strategy:
  """InHAD: node-local gradient sums, pulled by the server when their counts reach a threshold (J. Supercomputing 2021).

  ``local_workers`` per node (default ``min(4, K)``, dividing ``K``); the
  server pulls every node's sum when the nodes' iteration numbers add up to
  ``pull_threshold`` (default ``K``). Workers keep computing on the last
  broadcast unless ``wait_for_pull`` (lockstep).
  """
  name = "inhad"
  local = _check_divides(
    name, "local_workers", min(4, num_workers) if local_workers is None else local_workers, num_workers
  )
  threshold = validation.check_int(
    name, "pull_threshold", num_workers if pull_threshold is None else pull_threshold
  )
  lockstep = validation.check_bool(name, "wait_for_pull", wait_for_pull)
  if lockstep and threshold > num_workers:
    raise validation.invalid(
      name, "pull_threshold", threshold, f"at most num_workers={num_workers} with wait_for_pull=True"
    )
  rule = _buffered_sgd(threshold, _check_lr(name, learning_rate), _check_momentum(name, momentum))
  return _async(
    name,
    num_workers,
    rule,
    dispatch="on_release" if lockstep else "immediate",
    communication="node_local",
    node_size=local,
  )


# ---------------------------------------------------------------------------
# Elastic averaging.
# ---------------------------------------------------------------------------


def _elastic(name, num_workers, worker, center) -> Strategy:
  return _async(name, num_workers, center, worker, protocol="elastic")


@_register("easgd")
def _easgd(num_workers, *, learning_rate=0.1, moving_rate=None, period=10) -> Strategy:
  """Asynchronous EASGD: local SGD, an elastic exchange with a locked centre every ``period`` steps (Zhang et al., NeurIPS 2015)."""
  alpha = _moving_rate("easgd", moving_rate, num_workers)
  worker = easgd_worker(_check_lr("easgd", learning_rate), moving_rate=alpha, period=period)
  return _elastic("easgd", num_workers, worker, easgd_center(alpha))


@_register("eamsgd")
def _eamsgd(num_workers, *, learning_rate=0.01, momentum=0.99, moving_rate=None, period=10) -> Strategy:
  """EAMSGD: EASGD with local Nesterov momentum (Zhang, Choromanska, LeCun, NeurIPS 2015)."""
  alpha = _moving_rate("eamsgd", moving_rate, num_workers)
  worker = easgd_worker(
    _check_lr("eamsgd", learning_rate), moving_rate=alpha, period=period, momentum=momentum
  )
  return _elastic("eamsgd", num_workers, worker, easgd_center(alpha))


@_register("ea_wild")
def _ea_wild(num_workers, *, learning_rate=0.1, moving_rate=None, group_size=1) -> Strategy:
  """EA-wild: an elastic exchange every step against a lock-free, possibly stale read of the centre (HPCAsia 2020).

  With ``group_size`` G > 1 the workers form K/G groups: inside a group the
  gradients are all-reduced synchronously (the group steps on the mean of its
  members' batches, as fast as its slowest member plus a ring all-reduce over
  ``intra_link``), and each group makes one EA-wild exchange per step. The
  default moving rate is then ``0.9 / (K/G)``.
  """
  groups = _check_divides("ea_wild", "group_size", group_size, num_workers)
  alpha = _moving_rate("ea_wild", moving_rate, num_workers // groups)
  worker = easgd_worker(_check_lr("ea_wild", learning_rate), moving_rate=alpha, period=1)
  strategy = _elastic("ea_wild", num_workers, worker, ea_wild_center(alpha))
  return dataclasses.replace(strategy, lock_free=True, group_size=groups)
