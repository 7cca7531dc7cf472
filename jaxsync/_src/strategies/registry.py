"""The strategy registry: every synchronization model of the papers, by name.

``make(name, num_workers, **options)`` builds a :class:`Strategy` from the
factory registered under ``name``; its keyword-only arguments are the
strategy's options, with the papers' defaults (``describe(name)`` lists them),
and it returns the strategy's :class:`Blueprint` with its rules as a function
of the learning rate. So ``blueprint(name, num_workers, **options)`` reads a
strategy's clock and costs without building a rule: a learning-rate schedule
on that clock is made first, and the strategy once, with it.

Every strategy takes the papers' training protocol:

* ``learning_rate`` is a number or an optax schedule (``step -> rate``). Its
  clock is the strategy's :class:`RateClock`: the server rule's updates for a
  rate applied by the server (an arrival applied, a release, a round), each
  worker's own steps for a rate applied by the workers (local SGD, EASGD's
  family, per-worker BB).
* ``weight_decay`` is coupled L2, ``g + lambda w``, added where the papers add
  it: at the server with its current parameters for a rate applied by the
  server (the optimizers' weight decay of the papers' PyTorch trainers, and
  the SMEGA² authors' server), at the worker for a rate applied by the workers
  (EAMSGD at its look-ahead point ``x + delta v``, as the EASGD authors' code;
  per-worker BB at the parameters it pulled, so that the decay is scaled by
  the worker's own rate).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import optax

from jaxsync._src.core import validation
from jaxsync._src.rules import barzilai_borwein
from jaxsync._src.rules.adaptive_k import adaptive_k as adaptive_k_rule
from jaxsync._src.rules.delay_compensation import dc_asgd as dc_asgd_rule
from jaxsync._src.rules.delayed_nesterov import delayed_nesterov
from jaxsync._src.rules.diloco import OUTER_LEARNING_RATE, OUTER_MOMENTUM, by_fragment, check_exchange
from jaxsync._src.rules.elastic import ea_wild_center, easgd_center, easgd_worker
from jaxsync._src.rules.ordered_momentum import ordered_momentum
from jaxsync._src.rules.release import on_release
from jaxsync._src.rules.smega2 import smega2 as smega2_rule
from jaxsync._src.rules.staleness import scale_by_staleness
from jaxsync._src.strategies.strategy import (
  Blueprint,
  Communication,
  Dispatch,
  Engine,
  PseudoGradientExchange,
  RateClock,
  ServerTraffic,
  Strategy,
  WorkerProtocol,
  reject_nonfinite,
)

# Memory traffic of the server's update, in parameter-sized arrays read + written (ServerTraffic).
_SGD, _MOMENTUM, _ADAM = 3.0, 5.0, 7.0
_ACCUMULATE = 3.0  # a buffered arrival: read the gradient, read and write the sum
SERVER_OPTIMIZERS = ("sgd", "adam", "rmsprop")


# ---------------------------------------------------------------------------
# Pieces the factories share.
# ---------------------------------------------------------------------------


def _sgd(learning_rate, momentum: float = 0.0, nesterov: bool = False):
  return reject_nonfinite(optax.sgd(learning_rate, momentum=momentum or None, nesterov=nesterov))


def _sgd_traffic(momentum: float) -> float:
  return _MOMENTUM if momentum else _SGD


def _server_optimizer(name: str, choice: str) -> tuple[Callable[[Any], Any], float]:
  """The optimizer a server applies per update (SGD, Adam or RMSProp) as a function of the rate; its traffic."""
  choice = validation.check_choice(name, "server_optimizer", choice, SERVER_OPTIMIZERS)
  if choice == "adam":
    return lambda learning_rate: reject_nonfinite(optax.adam(learning_rate)), _ADAM
  if choice == "rmsprop":
    return lambda learning_rate: reject_nonfinite(optax.rmsprop(learning_rate)), _MOMENTUM
  return _sgd, _SGD


def _decayed(rule, weight_decay: float):
  """``rule`` after coupled L2, ``g + lambda w`` with the parameters the rule is given (no extra traffic:
  the update reads ``w`` anyway)."""
  if not weight_decay:
    return rule
  return optax.chain(optax.add_decayed_weights(weight_decay), rule)


def _check_momentum(name: str, momentum: float) -> float:
  return validation.check_real(name, "momentum", momentum, low=0.0, high=1.0, high_open=True)


def _check_decay(name: str, weight_decay: float) -> float:
  return validation.check_real(name, "weight_decay", weight_decay, low=0.0)


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

_Rules = tuple[optax.GradientTransformationExtraArgs, optax.GradientTransformationExtraArgs | None]


class _Recipe(NamedTuple):
  """What a factory returns: the strategy less its rules, and ``learning_rate -> (server rule, worker rule)``."""

  blueprint: Blueprint
  rules: Callable[[Any], _Rules]


class _Entry(NamedTuple):
  """A registered factory (its keyword-only arguments are the options) and its default learning rate."""

  factory: Callable[..., _Recipe]
  learning_rate: float
  canonical: str  # the first name it was registered under; the others are other names for it


_REGISTRY: dict[str, _Entry] = {}


def _register(*names: str, learning_rate: float):
  """Registers a factory under ``names``; every strategy takes ``learning_rate``, this is its default."""

  def add(factory):
    for name in names:
      _REGISTRY[name] = _Entry(factory, learning_rate, names[0])
    return factory

  return add


def names() -> tuple[str, ...]:
  """The registered strategy names, sorted."""
  return tuple(sorted(_REGISTRY))


# What each option means, in a user's words (``jaxsync strategies``); by option name, or by
# (strategy, option) where a strategy gives the name a meaning of its own.
OPTION_MEANINGS: dict[str | tuple[str, str], str] = {
  "learning_rate": "the step size (a number, or an optax schedule in Python)",
  "momentum": "the momentum coefficient, in [0, 1)",
  "weight_decay": "coupled L2: adds weight_decay * w to each gradient",
  "server_optimizer": "the server's optimizer: sgd, adam or rmsprop",
  "communication": "how the K gradients are summed: parameter_server, ring or hierarchical (all-reduce)",
  "group_size": "workers per group of the two-level all-reduce (must divide K; default min(4, K))",
  ("ea_wild", "group_size"): "workers per synchronous group, each group one elastic worker (must divide K)",
  "k": "gradients per round: the k fastest are kept (default (1 - drop_rate) K)",
  ("k_async", "k"): "arrivals per update, stale or not (default K/2)",
  "drop_rate": "the share of the slowest workers' gradients a round drops, when k is not given",
  "period": "local steps between two exchanges",
  "outer_learning_rate": "the rate of the averaged models' step (1.0: plain model averaging)",
  "outer_momentum": "momentum of the averaged models' step (0: none)",
  "moving_rate": "alpha, how far a worker and the centre move toward each other (default 0.9 / K)",
  "theta": "how much gradient noise a release tolerates, in (0, 1]: smaller waits for more gradients",
  "confidence": "the confidence level of the t-interval test that decides a release, in (0, 1)",
  "ci_endpoint": "which end of the confidence interval the test reads: upper (the paper) or lower (stricter)",
  "max_k": "the most gradients one release waits for (default: every live worker)",
  "fresh_staleness": "how many steps old a gradient may be and still count toward k and wait for the"
  " release: 0 (the current step), 1, ..., or null (every arrival)",
  "bb_step_size": "per-worker Barzilai-Borwein step sizes (workers scale their own gradients)",
  "bb_smoothing": "smoothing of the Barzilai-Borwein step sizes between steps, in (0, 1]",
  "bb_max_scale": "the largest Barzilai-Borwein step size, as a multiple of learning_rate",
  "armijo": "Armijo backtracking on each worker's Barzilai-Borwein step (needs bb_step_size)",
  "local_workers": "workers per node (must divide K; default min(4, K))",
  "pull_threshold": "the sum of the nodes' iteration numbers at which the server pulls (default K)",
  "wait_for_pull": "workers wait for each pull's broadcast (lockstep) instead of computing on",
  "delay_measure": "how OrMo-DA measures a gradient's delay: iterations or groups",
  "dampening": "the momentum's dampening, in [0, 1)",
  "look_ahead": "the parameters the server replies with: advanced (the look-ahead point) or current",
  "staleness_bound": "how many clocks the fastest worker may run ahead of the slowest",
  "mode": "how staleness scales the rate: linear (1/staleness) or exponential (penalty^staleness)",
  "penalty": "the base of the exponential penalty (mode=exponential)",
  "gradients_per_update": "arrivals summed per update (n-softsync's K/n)",
  ("diloco", "period"): "inner AdamW steps per worker between two outer steps (DiLoCo's H)",
  (
    "diloco",
    "outer_learning_rate",
  ): "the outer Nesterov step's rate on the averaged pseudo-gradient (DiLoCo: 0.7)",
  ("diloco", "outer_momentum"): "the outer Nesterov step's momentum (DiLoCo: 0.9)",
  (
    "streaming_diloco",
    "outer_learning_rate",
  ): "each fragment's outer Nesterov rate on its averaged pseudo-gradient",
  ("streaming_diloco", "outer_momentum"): "each fragment's outer Nesterov momentum",
  (
    "async_local_sgd",
    "outer_learning_rate",
  ): "epsilon, the server's Delayed Nesterov rate on each pushed pseudo-gradient",
  (
    "async_local_sgd",
    "outer_momentum",
  ): "beta, Delayed Nesterov's momentum, updated once every delay arrivals",
  ("diloco", "weight_decay"): "AdamW's decoupled weight decay of the inner steps",
  "variance_control": "lambda_0, the weight of the delay compensation g*g*(w - w_pulled) (0: plain ASGD)",
  "adaptive": "DC-ASGD-a: lambda_0 divided by the root of the running mean of g*g",
  "mean_square_decay": "the decay of DC-ASGD-a's running mean of g*g, in [0, 1)",
  ("async_local_sgd", "period"): "local AdamW steps of the fastest worker between two pushes (H)",
  ("async_local_sgd", "weight_decay"): "AdamW's decoupled weight decay of the local steps",
  ("streaming_diloco", "period"): "inner AdamW steps between two syncs of one fragment (H)",
  ("streaming_diloco", "weight_decay"): "AdamW's decoupled weight decay of the inner steps",
  "fragments": "how many fragments the parameters are cut into; one is synchronized every period / fragments steps",
  "overlap": "local steps a fragment's exchange overlaps (tau < period / fragments)",
  "mixing": "alpha: a worker keeps (1 - alpha) of the new global fragment and alpha of its own",
  "quantize": "the pseudo-gradients' wire format: null (full precision), bfloat16, int8 or int4 (per-block scales)",
  "quantize_block": "values per float32 scale of the int8 and int4 wire formats",
  "dylu": "Dynamic Local Updates: each worker's local steps in proportion to its speed",
  "min_local_steps": "the fewest local steps a slow worker takes under DyLU",
  "delay": "arrivals per Delayed Nesterov momentum update (default K)",
  "activation": "c in [0, 1/delay]: the momentum applied between Delayed Nesterov updates",
}

# Where the default learning rates come from: ``jaxsync strategies`` says it once.
DEFAULT_RATES = (
  "Default learning rates are the papers' starting points, not tuned for your model: 0.1 for the "
  "momentum rules (as in the SMEGA\N{SUPERSCRIPT TWO} authors' code, ICPP 2022) and for EASGD and "
  "EA-wild (the EASGD authors' example), 0.01 elsewhere (the adaptive-k paper's Table 3, JPDC 2022; "
  "EAMSGD in the EASGD authors' example). Tune yours on one grid: jaxsync compare with compare.options."
)


@dataclasses.dataclass(frozen=True)
class StrategyInfo:
  """What ``jaxsync strategies`` prints: a strategy's summary, kind and options with defaults and meanings.

  Attributes:
    name: the strategy's name.
    summary: one line: what it does and its paper.
    options: each option's default (``learning_rate`` first).
    meanings: each option's meaning, in words.
    synchronous: whether its workers wait for each other (rounds behind a barrier).
    alias_of: the name this one is another name for, or None.
  """

  name: str
  summary: str
  options: Mapping[str, Any]
  meanings: Mapping[str, str] = dataclasses.field(default_factory=dict)
  synchronous: bool = False
  alias_of: str | None = None


def option_meaning(name: str, option: str) -> str:
  """What ``option`` of strategy ``name`` means (see :data:`OPTION_MEANINGS`)."""
  return OPTION_MEANINGS.get((name, option)) or OPTION_MEANINGS[option]


def describe(name: str) -> StrategyInfo:
  """The summary line, the kind and the options (with their defaults and meanings) of strategy ``name``."""
  entry = _lookup(name)
  doc = inspect.getdoc(entry.factory) or ""
  options = {"learning_rate": entry.learning_rate}
  for p in inspect.signature(entry.factory).parameters.values():
    if p.kind == p.KEYWORD_ONLY:
      options[p.name] = p.default
  return StrategyInfo(
    name=name,
    summary=doc.splitlines()[0] if doc else "",
    options=options,
    meanings={o: option_meaning(entry.canonical, o) for o in options},
    synchronous=entry.factory(4).blueprint.engine == Engine.SYNC,  # 4 workers: every default divides it
    alias_of=None if name == entry.canonical else entry.canonical,
  )


def _lookup(name: str) -> _Entry:
  if name not in _REGISTRY:
    raise ValueError(f"strategy name={name!r} is unknown; expected one of: {', '.join(names())}.")
  return _REGISTRY[name]


def _recipe(
  name: str, num_workers: int, options: Mapping[str, Any]
) -> tuple[Blueprint, Callable[[], _Rules]]:
  """Strategy ``name``'s options checked and through its factory: its blueprint, and its rules to build."""
  entry = _lookup(name)
  num_workers = validation.check_int(f"strategy {name!r}", "num_workers", num_workers)
  valid = describe(name).options
  unknown = sorted(set(options) - set(valid))
  if unknown:
    raise ValueError(
      f"strategy {name!r}: unknown option(s) {', '.join(unknown)}; valid options: {', '.join(sorted(valid))}."
    )
  resolved = {**valid, **options}
  learning_rate = validation.check_learning_rate(name, resolved["learning_rate"])
  rest = {k: v for k, v in resolved.items() if k != "learning_rate"}
  design, rules = entry.factory(num_workers, **rest)
  return dataclasses.replace(design, name=name, options=resolved), functools.partial(rules, learning_rate)


def blueprint(name: str, num_workers: int, **options: Any) -> Blueprint:
  """Strategy ``name`` less its rules: its clock, costs and topology, with its options checked.

  What a learning-rate schedule on the strategy's clock needs, without
  building a rule (the options only the rules read are checked by :func:`make`).

  Args:
    name: a registry name, see :func:`names`.
    num_workers: ``K >= 1``.
    **options: the strategy's options, as for :func:`make`.

  Returns:
    A :class:`Blueprint`.

  Example:
    >>> import jaxsync
    >>> b = jaxsync.strategies.blueprint("adaptive_k", 8, bb_step_size=True)
    >>> str(b.rate_clock), b.gradients_per_update
    ('worker_steps', None)
  """
  return _recipe(name, num_workers, options)[0]


def make(name: str, num_workers: int, **options: Any) -> Strategy:
  """Builds strategy ``name`` for ``num_workers`` workers with the given options.

  Every option has the papers' default (see :func:`describe`); an unknown name
  or option raises ``ValueError`` listing the valid ones, and an invalid value
  raises ``ValueError`` naming it, all before anything is compiled.
  ``learning_rate`` may be an optax schedule and every strategy takes
  ``weight_decay`` (see the module docstring for their clocks and placement).

  Args:
    name: a registry name, see :func:`names`.
    num_workers: ``K >= 1``.
    **options: the strategy's options.

  Returns:
    A :class:`Strategy`.

  Example:
    >>> import jaxsync, optax
    >>> s = jaxsync.strategies.make("ormo", num_workers=8, learning_rate=0.05)
    >>> str(s.engine), str(s.dispatch), s.options["momentum"]
    ('async', 'immediate', 0.9)
    >>> warm = optax.linear_schedule(0.05 / 8, 0.05, transition_steps=500)  # SMEGA²'s lr/N warm-up
    >>> str(jaxsync.strategies.make("smega2", 8, learning_rate=warm, weight_decay=1e-4).rate_clock)
    'server_updates'
  """
  design, rules = _recipe(name, num_workers, options)
  server_rule, worker_rule = rules()
  fields = {f.name: getattr(design, f.name) for f in dataclasses.fields(Blueprint)}
  return Strategy(**fields, server_rule=server_rule, worker_rule=worker_rule)


# ---------------------------------------------------------------------------
# Synchronous strategies.
# ---------------------------------------------------------------------------


@_register("bsp", learning_rate=0.01)
def _bsp(
  num_workers,
  *,
  momentum=0.9,
  communication="parameter_server",
  group_size=None,
  weight_decay=0.0,
  server_optimizer="sgd",
) -> _Recipe:
  """Bulk-synchronous SGD with momentum: a barrier, the mean of K gradients (the papers' synchronous baseline).

  ``server_optimizer="adam"`` (or ``"rmsprop"``) applies that optimizer to the mean gradient instead
  (``momentum`` is then unused): fully synchronous Adam, DiLoCo's baseline.
  """
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
  momentum = _check_momentum(name, momentum)
  decay = _check_decay(name, weight_decay)
  blueprint = Blueprint(
    name=name,
    num_workers=num_workers,
    engine=Engine.SYNC,
    protocol=WorkerProtocol.GRADIENT,
    communication=communication,
    gradients_per_round=num_workers,
    group_size=group_size or 1,
    gradients_per_update=float(num_workers),
    # A parameter server sums the K pushes; a ring does it in the network.
    server_traffic=ServerTraffic(_ACCUMULATE, _sgd_traffic(momentum)),
  )
  if server_optimizer != "sgd":
    optimizer, traffic = _server_optimizer(name, server_optimizer)
    blueprint = dataclasses.replace(blueprint, server_traffic=ServerTraffic(_ACCUMULATE, traffic))
    return _Recipe(blueprint, lambda lr: (_decayed(optimizer(lr), decay), None))
  return _Recipe(blueprint, lambda lr: (_decayed(_sgd(lr, momentum), decay), None))


@_register("allreduce", learning_rate=0.01)
def _allreduce(num_workers, *, momentum=0.9, weight_decay=0.0, server_optimizer="sgd") -> _Recipe:
  """BSP over a ring all-reduce instead of a parameter server (Horovod-style; Wongpanich et al., HPCAsia 2020)."""
  return _bsp(
    num_workers,
    momentum=momentum,
    communication="ring",
    weight_decay=weight_decay,
    server_optimizer=server_optimizer,
  )


@_register("hierarchical_allreduce", learning_rate=0.01)
def _hierarchical_allreduce(num_workers, *, momentum=0.9, group_size=None, weight_decay=0.0) -> _Recipe:
  """BSP over a two-level all-reduce: groups of ``group_size`` (default 4), then leaders (HPCAsia 2020)."""
  return _bsp(
    num_workers,
    momentum=momentum,
    communication="hierarchical",
    group_size=group_size,
    weight_decay=weight_decay,
  )


@_register("fastest_k", "drop_worker", learning_rate=0.01)
def _fastest_k(num_workers, *, momentum=0.9, k=None, drop_rate=0.5, weight_decay=0.0) -> _Recipe:
  """Synchronous rounds that aggregate the k fastest gradients and drop the rest (Dutta et al., AISTATS 2018)."""
  name = "fastest_k"
  rate = validation.check_real(name, "drop_rate", drop_rate, low=0.0, high=1.0, high_open=True)
  if k is None:
    k = max(1, round((1.0 - rate) * num_workers))
  k = validation.check_int(name, "k", k)
  if k > num_workers:
    raise validation.invalid(name, "k", k, f"an integer in [1, num_workers={num_workers}]")
  bsp = _bsp(num_workers, momentum=momentum, weight_decay=weight_decay)
  return bsp._replace(
    blueprint=dataclasses.replace(bsp.blueprint, gradients_per_round=k, gradients_per_update=float(k))
  )


def _local_rounds(
  name, num_workers, period, outer_learning_rate, outer_momentum, inner, exchange=None
) -> _Recipe:
  """Rounds of ``period`` local steps of ``inner(lr)`` per worker, then the outer Nesterov step on the averaged models.

  With ``exchange.fragments = P > 1`` a round is ``period / P`` steps and synchronizes one fragment,
  each fragment with its own outer optimizer.
  """
  period = validation.check_int(name, "period", period)
  outer_lr = validation.check_real(name, "outer_learning_rate", outer_learning_rate, low=0.0, low_open=True)
  outer_m = validation.check_real(name, "outer_momentum", outer_momentum, low=0.0, high=1.0, high_open=True)
  exchange = PseudoGradientExchange() if exchange is None else exchange
  round_steps = period // exchange.fragments
  blueprint = Blueprint(
    name=name,
    num_workers=num_workers,
    engine=Engine.SYNC,
    protocol=WorkerProtocol.LOCAL,
    communication=Communication.RING,
    local_steps=round_steps,
    exchange=exchange,
    rate_clock=RateClock.WORKER_STEPS,
    gradients_per_update=float(num_workers * round_steps),
    server_traffic=ServerTraffic(0.0, _sgd_traffic(outer_m)),
  )

  def rules(lr):
    outer = _sgd(outer_lr, outer_m, nesterov=outer_m > 0)
    return (outer if exchange.fragments == 1 else by_fragment(outer, exchange.fragments)), inner(lr)

  return _Recipe(blueprint, rules)


def _exchange(name, *, period, fragments=1, overlap=0, mixing=0.0, quantize=None, quantize_block=64):
  """The checked :class:`PseudoGradientExchange` of a local strategy (the checks of :func:`jaxsync.diloco`)."""
  _, fragments, overlap, mixing, quantize, quantize_block = check_exchange(
    name, period, fragments, overlap, mixing, quantize, quantize_block
  )
  return PseudoGradientExchange(fragments, overlap, mixing, quantize, quantize_block)


@_register("local_sgd", learning_rate=0.01)
def _local_sgd(
  num_workers,
  *,
  momentum=0.0,
  period=8,
  outer_learning_rate=1.0,
  outer_momentum=0.0,
  weight_decay=0.0,
) -> _Recipe:
  """Local SGD: ``period`` local steps per worker, then the models are averaged (DiLoCo's outer step).

  The server rule is the outer optimizer on the pseudo-gradient
  ``theta - mean_k x_k``: SGD with rate 1 is plain model averaging; a
  Nesterov outer momentum gives DiLoCo's outer loop. ``learning_rate`` (and
  its schedule) and ``weight_decay`` are the workers' local optimizer's.
  """
  name = "local_sgd"
  momentum = _check_momentum(name, momentum)
  decay = _check_decay(name, weight_decay)
  return _local_rounds(
    name,
    num_workers,
    period,
    outer_learning_rate,
    outer_momentum,
    lambda lr: _decayed(_sgd(lr, momentum), decay),
  )


def _adamw(name: str, weight_decay: float):
  """AdamW as a worker's inner optimizer (decoupled decay), ``learning_rate -> rule``."""
  decay = _check_decay(name, weight_decay)
  return lambda lr: reject_nonfinite(optax.adamw(lr, weight_decay=decay))


@_register("diloco", learning_rate=0.001)
def _diloco(
  num_workers,
  *,
  period=50,
  outer_learning_rate=OUTER_LEARNING_RATE,
  outer_momentum=OUTER_MOMENTUM,
  weight_decay=0.1,
  quantize=None,
  quantize_block=64,
) -> _Recipe:
  """DiLoCo: ``period`` AdamW steps per worker, then Nesterov on the averaged pseudo-gradient (Douillard et al., 2023).

  Local SGD with the paper's optimizers: inner AdamW (``learning_rate``,
  decoupled ``weight_decay``, its moments kept across rounds) and outer
  Nesterov SGD (lr 0.7, momentum 0.9) on ``theta - mean_k x_k``. The paper
  syncs every 500 inner steps on C4; the default here, 50, suits runs of a
  few thousand steps. ``quantize`` sends the pseudo-gradients as bfloat16,
  int8 or int4 (per-block scales).
  """
  name = "diloco"
  exchange = _exchange(name, period=period, quantize=quantize, quantize_block=quantize_block)
  return _local_rounds(
    name, num_workers, period, outer_learning_rate, outer_momentum, _adamw(name, weight_decay), exchange
  )


@_register("streaming_diloco", learning_rate=0.001)
def _streaming_diloco(
  num_workers,
  *,
  period=50,
  fragments=2,
  overlap=1,
  mixing=0.5,
  quantize="int4",
  quantize_block=64,
  outer_learning_rate=OUTER_LEARNING_RATE,
  outer_momentum=OUTER_MOMENTUM,
  weight_decay=0.1,
) -> _Recipe:
  """Streaming DiLoCo: DiLoCo one fragment at a time, the exchange overlapped and mixed in, 4-bit on the wire (Douillard et al., 2025).

  The parameters are cut into ``fragments`` contiguous blocks; every
  ``period / fragments`` AdamW steps one fragment is synchronized, so each
  syncs every ``period`` steps. Its pseudo-gradient is taken ``overlap``
  steps before the round ends and sent ``quantize``d while the workers go
  on; the new global fragment ``theta`` is then mixed into each worker's
  as ``(1 - mixing) theta + mixing x``.
  """
  name = "streaming_diloco"
  exchange = _exchange(
    name,
    period=period,
    fragments=fragments,
    overlap=overlap,
    mixing=mixing,
    quantize=quantize,
    quantize_block=quantize_block,
  )
  return _local_rounds(
    name, num_workers, period, outer_learning_rate, outer_momentum, _adamw(name, weight_decay), exchange
  )


# ---------------------------------------------------------------------------
# Asynchronous strategies with a parameter server.
# ---------------------------------------------------------------------------


def _async(name, num_workers, *, protocol=WorkerProtocol.GRADIENT, **fields) -> Blueprint:
  return Blueprint(name=name, num_workers=num_workers, engine=Engine.ASYNC, protocol=protocol, **fields)


@_register("asp", learning_rate=0.01)
def _asp(num_workers, *, weight_decay=0.0, server_optimizer="sgd") -> _Recipe:
  """Asynchronous SGD through a parameter server: apply each arrival, reply at once (Dean et al., NeurIPS 2012).

  ``server_optimizer`` is what the server applies per arrival: ``"sgd"``, or
  ``"adam"`` / ``"rmsprop"``, the optimizers whose memory traffic the
  adaptive-k paper (JPDC 2022, §3.6) names as the server's bottleneck.
  """
  name = "asp"
  optimizer, traffic = _server_optimizer(name, server_optimizer)
  decay = _check_decay(name, weight_decay)
  blueprint = _async(name, num_workers, server_traffic=ServerTraffic(0.0, traffic))
  return _Recipe(blueprint, lambda lr: (_decayed(optimizer(lr), decay), None))


@_register("hogwild", learning_rate=0.01)
def _hogwild(num_workers, *, weight_decay=0.0) -> _Recipe:
  """Hogwild: ASGD on shared memory, lock-free, no network cost (Niu et al. 2011)."""
  name = "hogwild"
  decay = _check_decay(name, weight_decay)
  blueprint = _async(name, num_workers, communication=Communication.SHARED_MEMORY)
  return _Recipe(blueprint, lambda lr: (_decayed(_sgd(lr), decay), None))


@_register("naive_asgdm", learning_rate=0.1)
def _naive_asgdm(num_workers, *, momentum=0.9, weight_decay=0.0) -> _Recipe:
  """ASGD with server momentum applied straight to stale gradients (the OrMo paper's baseline, NeurIPS 2024)."""
  name = "naive_asgdm"
  momentum = _check_momentum(name, momentum)
  decay = _check_decay(name, weight_decay)
  blueprint = _async(name, num_workers, server_traffic=ServerTraffic(0.0, _sgd_traffic(momentum)))
  return _Recipe(blueprint, lambda lr: (_decayed(_sgd(lr, momentum), decay), None))


@_register("shifted_momentum", learning_rate=0.1)
def _shifted_momentum(num_workers, *, momentum=0.9, weight_decay=0.0) -> _Recipe:
  """Shifted momentum: each worker keeps a local momentum and sends it (Giladi et al., ICLR 2020)."""
  name = "shifted_momentum"
  momentum = _check_momentum(name, momentum)
  decay = _check_decay(name, weight_decay)
  return _Recipe(
    _async(name, num_workers),
    lambda lr: (_decayed(_sgd(lr), decay), reject_nonfinite(optax.trace(decay=momentum))),
  )


@_register("smega2", learning_rate=0.1)
def _smega2(num_workers, *, momentum=0.9, dampening=0.0, look_ahead="advanced", weight_decay=0.0) -> _Recipe:
  """SMEGA²: one shared momentum updated per cycle of K arrivals, look-ahead replies (Cohen et al., ICPP 2022)."""
  decay = _check_decay("smega2", weight_decay)
  # The update (gradient, cycle sum, momentum, parameters: 7 arrays) and the look-ahead reply (4).
  blueprint = _async("smega2", num_workers, server_traffic=ServerTraffic(0.0, 11.0))
  return _Recipe(
    blueprint,
    lambda lr: (
      _decayed(
        smega2_rule(lr, momentum, num_workers=num_workers, dampening=dampening, look_ahead=look_ahead), decay
      ),
      None,
    ),
  )


@_register("ormo", learning_rate=0.1)
def _ormo(num_workers, *, momentum=0.9, weight_decay=0.0) -> _Recipe:
  """OrMo: ordered momentum, stale gradients placed by their iteration group (Shi et al., NeurIPS 2024)."""
  decay = _check_decay("ormo", weight_decay)
  blueprint = _async("ormo", num_workers, server_traffic=ServerTraffic(0.0, _MOMENTUM))
  return _Recipe(
    blueprint, lambda lr: (_decayed(ordered_momentum(lr, momentum, num_workers=num_workers), decay), None)
  )


@_register("ormo_da", learning_rate=0.1)
def _ormo_da(num_workers, *, momentum=0.9, delay_measure="iterations", weight_decay=0.0) -> _Recipe:
  """OrMo-DA: OrMo with a delay-adaptive learning rate (Shi et al., NeurIPS 2024)."""
  decay = _check_decay("ormo_da", weight_decay)
  blueprint = _async("ormo_da", num_workers, server_traffic=ServerTraffic(0.0, _MOMENTUM))

  def rules(lr):
    rule = ordered_momentum(
      lr, momentum, num_workers=num_workers, delay_adaptive=True, delay_measure=delay_measure
    )
    return _decayed(rule, decay), None

  return _Recipe(blueprint, rules)


@_register("dc_asgd", learning_rate=0.01)
def _dc_asgd(
  num_workers, *, variance_control=0.04, adaptive=False, mean_square_decay=0.95, weight_decay=0.0
) -> _Recipe:
  """DC-ASGD: asynchronous SGD whose server compensates each stale gradient to first order (Zheng et al., ICML 2017)."""
  name = "dc_asgd"
  decay = _check_decay(name, weight_decay)
  rule = functools.partial(
    dc_asgd_rule,
    variance_control=variance_control,
    num_workers=num_workers,
    adaptive=adaptive,
    mean_square_decay=mean_square_decay,
  )
  rule(0.01)  # checks the options now, before a learning rate is known
  # Read g, w and the sender's backup, write w and the backup (5); MeanSquare read and written (7).
  traffic = _ADAM if adaptive else _MOMENTUM
  blueprint = _async(name, num_workers, server_traffic=ServerTraffic(0.0, traffic))
  return _Recipe(blueprint, lambda lr: (_decayed(rule(lr), decay), None))


@_register("async_local_sgd", learning_rate=0.001)
def _async_local_sgd(
  num_workers,
  *,
  period=50,
  dylu=False,
  min_local_steps=1,
  outer_learning_rate=OUTER_LEARNING_RATE,
  outer_momentum=OUTER_MOMENTUM,
  delay=None,
  activation=0.0,
  weight_decay=0.1,
) -> _Recipe:
  """Asynchronous local SGD: AdamW local steps, pseudo-gradients pushed as workers finish, Delayed Nesterov (Liu et al., 2024).

  Each worker takes ``period`` AdamW steps (``learning_rate``,
  ``weight_decay``) from the parameters it pulled and pushes its
  pseudo-gradient; the server applies each with Delayed Nesterov (rate
  ``outer_learning_rate``, momentum updated every ``delay`` arrivals, default
  K) and replies at once. With ``dylu`` (Dynamic Local Updates) a worker
  takes steps in proportion to its speed, at least ``min_local_steps``.
  """
  name = "async_local_sgd"
  period = validation.check_int(name, "period", period)
  dylu = validation.check_bool(name, "dylu", dylu)
  validation.check_int(name, "min_local_steps", min_local_steps)
  if min_local_steps > period:
    raise validation.invalid(name, "min_local_steps", min_local_steps, f"an integer in [1, period={period}]")
  delay = num_workers if delay is None else validation.check_int(name, "delay", delay)
  outer = functools.partial(delayed_nesterov, momentum=outer_momentum, delay=delay, activation=activation)
  outer_lr = validation.check_real(name, "outer_learning_rate", outer_learning_rate, low=0.0, low_open=True)
  outer(outer_lr)  # checks the outer options now
  # The Delayed Nesterov step reads g, theta, m and D and writes theta and D (m on every N-th): about 7.
  blueprint = _async(
    name,
    num_workers,
    protocol=WorkerProtocol.LOCAL,
    local_steps=period,
    rate_clock=RateClock.WORKER_STEPS,
    gradients_per_update=float(period),
    server_traffic=ServerTraffic(0.0, _ADAM),
  )
  return _Recipe(blueprint, lambda lr: (outer(outer_lr), _adamw(name, weight_decay)(lr)))


@_register("ssp", learning_rate=0.01)
def _ssp(num_workers, *, momentum=0.0, staleness_bound=3, weight_decay=0.0) -> _Recipe:
  """Stale synchronous parallel: no worker runs more than ``staleness_bound`` clocks ahead (Ho et al., NeurIPS 2013)."""
  name = "ssp"
  bound = validation.check_int(name, "staleness_bound", staleness_bound, low=0)
  momentum = _check_momentum(name, momentum)
  decay = _check_decay(name, weight_decay)
  blueprint = _async(
    name,
    num_workers,
    dispatch=Dispatch.SSP,
    staleness_bound=bound,
    server_traffic=ServerTraffic(0.0, _sgd_traffic(momentum)),
  )
  return _Recipe(blueprint, lambda lr: (_decayed(_sgd(lr, momentum), decay), None))


def _buffered_sgd(per_update: int, learning_rate, momentum: float):
  # Averages `per_update` arrivals, then one SGD(-momentum) step on each release only (so a schedule
  # counts releases).
  return on_release(
    scale_by_staleness("none", gradients_per_update=per_update), _sgd(learning_rate, momentum)
  )


@_register("k_async", learning_rate=0.01)
def _k_async(num_workers, *, momentum=0.0, k=None, weight_decay=0.0) -> _Recipe:
  """K-async SGD: update on any k arrivals (stale or not), reply to those k (Dutta et al., AISTATS 2018)."""
  name = "k_async"
  k = validation.check_int(name, "k", max(1, num_workers // 2) if k is None else k)
  if k > num_workers:
    raise validation.invalid(name, "k", k, f"an integer in [1, num_workers={num_workers}]")
  momentum = _check_momentum(name, momentum)
  decay = _check_decay(name, weight_decay)
  blueprint = _async(
    name,
    num_workers,
    dispatch=Dispatch.ON_RELEASE,
    gradients_per_update=float(k),
    server_traffic=ServerTraffic(_ACCUMULATE, _sgd_traffic(momentum)),
  )
  return _Recipe(blueprint, lambda lr: (_decayed(_buffered_sgd(k, lr, momentum), decay), None))


@_register("staleness_aware_asp", learning_rate=0.01)
def _staleness_aware_asp(
  num_workers, *, mode="linear", penalty=None, gradients_per_update=1, weight_decay=0.0
) -> _Recipe:
  """ASGD with a learning rate divided by staleness (or its exponential penalty), n-softsync (Zhang et al., IJCAI 2016)."""
  name = "staleness_aware_asp"
  # Made here, not with the rate: it checks mode, penalty and gradients_per_update.
  buffer = scale_by_staleness(mode, penalty=penalty, gradients_per_update=gradients_per_update)
  decay = _check_decay(name, weight_decay)
  per_update = int(gradients_per_update)
  blueprint = _async(
    name,
    num_workers,
    gradients_per_update=float(per_update),
    server_traffic=ServerTraffic(_ACCUMULATE if per_update > 1 else 0.0, _SGD),
  )
  # on_release: the rate (and its schedule) steps once per update, not per buffered arrival.
  return _Recipe(
    blueprint, lambda lr: (_decayed(on_release(buffer, optax.scale_by_learning_rate(lr)), decay), None)
  )


@_register("adaptive_k", learning_rate=0.01)
def _adaptive_k(
  num_workers,
  *,
  momentum=0.9,
  theta=1.0,
  confidence=0.95,
  ci_endpoint="upper",
  max_k=None,
  fresh_staleness=0,
  bb_step_size=False,
  bb_smoothing=0.1,
  bb_max_scale=barzilai_borwein.DEFAULT_MAX_SCALE,
  armijo=False,
  weight_decay=0.0,
  server_optimizer="sgd",
) -> _Recipe:
  """Adaptive-k release, progressive momentum, optional per-worker BB step sizes (Zhang, Ji, Wang, JPDC 2022).

  ``bb_max_scale`` (jaxsync's safeguard, not the paper's) bounds each worker's BB
  step to ``[learning_rate / bb_max_scale, learning_rate * bb_max_scale]``;
  ``None`` is the paper's unbounded rule (see :func:`jaxsync.bb_step_size`).
  ``server_optimizer="adam"`` (or ``"rmsprop"``) applies that optimizer to
  each released aggregate instead of the progressive momentum's SGD step (the
  server-side optimizers of the paper's §3.6); it needs ``bb_step_size=False``.
  ``fresh_staleness`` is which gradients count as fresh (see :func:`jaxsync.adaptive_k`):
  0 (the default: computed on the current step), 1, ..., or ``None`` (every arrival);
  the server's dispatch follows the same reading.
  """
  name = "adaptive_k"
  decay = _check_decay(name, weight_decay)
  max_scale = barzilai_borwein.check_max_scale(name, "bb_max_scale", bb_max_scale)
  use_bb = validation.check_bool(name, "bb_step_size", bb_step_size)
  use_armijo = validation.check_bool(name, "armijo", armijo)
  optimizer = validation.check_choice(name, "server_optimizer", server_optimizer, SERVER_OPTIMIZERS)
  if use_armijo and not use_bb:
    raise validation.invalid(name, "armijo", armijo, "False unless bb_step_size=True")
  if use_bb and optimizer != "sgd":
    raise validation.invalid(
      name,
      "server_optimizer",
      server_optimizer,
      "'sgd' with bb_step_size=True (the workers apply their rates)",
    )
  if max_k is not None:
    max_k = validation.check_int(name, "max_k", max_k)
    if max_k > num_workers:
      raise validation.invalid(name, "max_k", max_k, f"None or an integer in [1, num_workers={num_workers}]")
  if fresh_staleness is not None:
    fresh_staleness = validation.check_int(name, "fresh_staleness", fresh_staleness, low=0)
  # Made here, not with the rate: it checks momentum, theta, confidence and ci_endpoint.
  server = adaptive_k_rule(
    momentum=momentum,
    theta=theta,
    confidence=confidence,
    ci_endpoint=ci_endpoint,
    max_k=max_k or num_workers,
    fresh_staleness=fresh_staleness,
  )
  # An arrival: the gradient read, the fresh mean (or the stale sum) read and written, its squared
  # deviation summed in the same pass; a release: mean, stale sum, momentum (r+w), parameters (r+w).
  traffic = ServerTraffic(_ACCUMULATE, 6.0)
  if use_bb:
    # Workers send alpha_i g_i (docs/algorithms.md §11c); the server applies rate 1 (§11b). The decay is
    # the worker's, at the parameters it pulled, so that its own rate scales it.
    def bb_rules(lr):
      bb = barzilai_borwein.bb_step_size(
        lr, smoothing=bb_smoothing, max_scale=max_scale, armijo=use_armijo, server_momentum=momentum
      )
      return optax.chain(server, optax.scale(-1.0)), _decayed(bb, decay)

    blueprint = _async(
      name,
      num_workers,
      dispatch=Dispatch.ON_RELEASE_FRESH,
      fresh_staleness=fresh_staleness,
      rate_clock=RateClock.WORKER_STEPS,
      gradients_per_update=None,
      server_traffic=traffic,
    )
    return _Recipe(blueprint, bb_rules)
  if optimizer == "sgd":
    inner, extra = optax.scale_by_learning_rate, 0.0
  else:
    inner, update_traffic = _server_optimizer(name, optimizer)
    extra = update_traffic - _SGD  # the optimizer's own buffers, on top of the momentum's update
  blueprint = _async(
    name,
    num_workers,
    dispatch=Dispatch.ON_RELEASE_FRESH,
    fresh_staleness=fresh_staleness,
    gradients_per_update=None,
    server_traffic=ServerTraffic(traffic.arrival, traffic.release + extra),
  )
  # on_release: the rate (and its schedule) steps once per release, not per buffered arrival.
  return _Recipe(blueprint, lambda lr: (_decayed(on_release(server, inner(lr)), decay), None))


@_register("inhad", learning_rate=0.01)
def _inhad(
  num_workers,
  *,
  momentum=0.0,
  local_workers=None,
  pull_threshold=None,
  wait_for_pull=False,
  weight_decay=0.0,
) -> _Recipe:
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
  momentum = _check_momentum(name, momentum)
  decay = _check_decay(name, weight_decay)
  blueprint = _async(
    name,
    num_workers,
    dispatch=Dispatch.ON_RELEASE if lockstep else Dispatch.IMMEDIATE,
    communication=Communication.NODE_LOCAL,
    node_size=local,
    gradients_per_update=float(threshold),
    # Arrivals are summed at their node; the server's cost is the pull's update.
    server_traffic=ServerTraffic(_ACCUMULATE, _sgd_traffic(momentum)),
  )
  return _Recipe(blueprint, lambda lr: (_decayed(_buffered_sgd(threshold, lr, momentum), decay), None))


# ---------------------------------------------------------------------------
# Elastic averaging.
# ---------------------------------------------------------------------------


def _elastic(name, num_workers, worker: Callable[[Any], Any], center, traffic: float) -> _Recipe:
  """An elastic strategy: ``worker`` is its worker rule as a function of the learning rate."""
  blueprint = _async(
    name,
    num_workers,
    protocol=WorkerProtocol.ELASTIC,
    rate_clock=RateClock.WORKER_STEPS,
    gradients_per_update=None,
    # The centre's update on an exchange: the worker's model read, the centre read and written.
    server_traffic=ServerTraffic(0.0, traffic),
  )
  return _Recipe(blueprint, lambda lr: (center, worker(lr)))


@_register("easgd", learning_rate=0.1)
def _easgd(num_workers, *, moving_rate=None, period=10, weight_decay=0.0) -> _Recipe:
  """Asynchronous EASGD: local SGD, an elastic exchange with a locked centre every ``period`` steps (Zhang et al., NeurIPS 2015)."""
  alpha = _moving_rate("easgd", moving_rate, num_workers)
  worker = functools.partial(easgd_worker, moving_rate=alpha, period=period, weight_decay=weight_decay)
  return _elastic("easgd", num_workers, worker, easgd_center(alpha), _SGD)


@_register("eamsgd", learning_rate=0.01)
def _eamsgd(num_workers, *, momentum=0.99, moving_rate=None, period=10, weight_decay=0.0) -> _Recipe:
  """EAMSGD: EASGD with local Nesterov momentum (Zhang, Choromanska, LeCun, NeurIPS 2015)."""
  alpha = _moving_rate("eamsgd", moving_rate, num_workers)
  worker = functools.partial(
    easgd_worker, moving_rate=alpha, period=period, momentum=momentum, weight_decay=weight_decay
  )
  return _elastic("eamsgd", num_workers, worker, easgd_center(alpha), _SGD)


@_register("ea_wild", learning_rate=0.1)
def _ea_wild(num_workers, *, moving_rate=None, group_size=1, weight_decay=0.0) -> _Recipe:
  """EA-wild: an elastic exchange every step against a lock-free, possibly stale read of the centre (HPCAsia 2020).

  With ``group_size`` G > 1 the workers form K/G groups: inside a group the
  gradients are all-reduced synchronously (the group steps on the mean of its
  members' batches, as fast as its slowest member plus a ring all-reduce over
  ``intra_link``), and each group makes one EA-wild exchange per step. The
  default moving rate is then ``0.9 / (K/G)``.
  """
  groups = _check_divides("ea_wild", "group_size", group_size, num_workers)
  alpha = _moving_rate("ea_wild", moving_rate, num_workers // groups)
  worker = functools.partial(easgd_worker, moving_rate=alpha, period=1, weight_decay=weight_decay)
  # The lock-free increment also reads the centre the worker read.
  recipe = _elastic("ea_wild", num_workers, worker, ea_wild_center(alpha), 4.0)
  return recipe._replace(blueprint=dataclasses.replace(recipe.blueprint, lock_free=True, group_size=groups))
