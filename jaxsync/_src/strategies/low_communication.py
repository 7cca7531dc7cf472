"""Low-communication strategies: many local steps per exchange of models or pseudo-gradients.

Local SGD (model averaging), DiLoCo (inner AdamW, outer Nesterov on the
averaged pseudo-gradient; Douillard et al., 2023), Streaming DiLoCo
(fragments, an overlapped exchange, 4-bit pseudo-gradients; Douillard et al.,
2025) and asynchronous local SGD (pseudo-gradients pushed as workers finish,
Delayed Nesterov, Dynamic Local Updates; Liu et al., 2024).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

import optax

from jaxsync._src.core import validation
from jaxsync._src.core.suggestions import did_you_mean
from jaxsync._src.rules.delayed_nesterov import delayed_nesterov
from jaxsync._src.rules.diloco import OUTER_LEARNING_RATE, OUTER_MOMENTUM, by_fragment, check_exchange
from jaxsync._src.strategies import pieces
from jaxsync._src.strategies.strategy import (
  Blueprint,
  Communication,
  Engine,
  PseudoGradientExchange,
  RateClock,
  ServerTraffic,
  WorkerProtocol,
  reject_nonfinite,
)
from jaxsync._src.strategies.table import Recipe, register

_INNER_MEANINGS = {
  "inner_optimizer": "the workers' inner optimizer, an optax optimizer by name: adamw (DiLoCo), adam, lion, sgd, ...",
  "inner_options": "the inner optimizer's own arguments, e.g. {b1: 0.9, b2: 0.95, eps: 1e-8} (null: optax's defaults)",
}
_EXCHANGE_MEANINGS = {
  "fragments": "how many fragments the parameters are cut into; one is synchronized every period / fragments steps",
  "overlap": "local steps a fragment's exchange overlaps (tau < period / fragments)",
  "mixing": "alpha: a worker keeps (1 - alpha) of the new global fragment and alpha of its own",
  "quantize": "the pseudo-gradients' wire format: null (full precision), bfloat16, int8 or int4 (per-block scales)",
  "quantize_block": "values per float32 scale of the int8 and int4 wire formats",
}
_MEMBERSHIP_MEANINGS = {
  "membership": (
    "fixed (every round waits for all K workers, exchanged by all-reduce) or elastic (through a parameter"
    " server; workers may leave and join, a round averages the pseudo-gradients of those that delivered)"
  ),
  "quorum": "elastic: the fewest pseudo-gradients an outer step averages (default 1); a round waits for them",
  "deadline": (
    "elastic: seconds a round waits after its first pseudo-gradient for the other live workers' (null: for"
    " all of them)"
  ),
}
_DILOCO_MEANINGS = {
  **_MEMBERSHIP_MEANINGS,
  **_EXCHANGE_MEANINGS,
  **_INNER_MEANINGS,
  "period": "inner AdamW steps per worker between two outer steps (DiLoCo's H)",
  "outer_learning_rate": "the outer Nesterov step's rate on the averaged pseudo-gradient (DiLoCo: 0.7)",
  "outer_momentum": "the outer Nesterov step's momentum (DiLoCo: 0.9)",
  "weight_decay": "the inner optimizer's weight decay (AdamW's is decoupled); 0 for one that takes none",
}
_STREAMING_DILOCO_MEANINGS = {
  **_MEMBERSHIP_MEANINGS,
  **_EXCHANGE_MEANINGS,
  **_INNER_MEANINGS,
  "period": "inner AdamW steps between two syncs of one fragment (H)",
  "outer_learning_rate": "each fragment's outer Nesterov rate on its averaged pseudo-gradient",
  "outer_momentum": "each fragment's outer Nesterov momentum",
  "weight_decay": "the inner optimizer's weight decay (AdamW's is decoupled); 0 for one that takes none",
}
_ASYNC_LOCAL_SGD_MEANINGS = {
  **_INNER_MEANINGS,
  "period": "local AdamW steps of the fastest worker between two pushes (H)",
  "outer_learning_rate": "epsilon, the server's Delayed Nesterov rate on each pushed pseudo-gradient",
  "outer_momentum": "beta, Delayed Nesterov's momentum, updated once every momentum_period arrivals",
  "weight_decay": "the inner optimizer's weight decay on the local steps (AdamW's is decoupled)",
  "dylu": "Dynamic Local Updates: each worker's local steps in proportion to its speed",
  "min_local_steps": "the fewest local steps a slow worker takes under DyLU",
  "momentum_period": "arrivals per Delayed Nesterov momentum update (the paper's N, its 'delay'; default K)",
  "activation": "c in [0, 1/momentum_period]: the momentum applied between Delayed Nesterov updates",
}


MEMBERSHIPS = ("fixed", "elastic")


def _membership(
  name: str, num_workers: int, membership: str, quorum, deadline, exchange: PseudoGradientExchange
) -> tuple[Communication, int | None, float | None]:
  """The checked membership options: how rounds exchange (all-reduce or a parameter server), quorum, deadline.

  Fixed membership all-reduces among all ``K`` workers every round. Elastic
  membership runs the rounds through a parameter server, which can lose and
  gain workers: a round closes when every live worker delivered, or
  ``deadline`` seconds after its first pseudo-gradient, with at least
  ``quorum`` of them.
  """
  membership = validation.check_choice(name, "membership", membership, MEMBERSHIPS)
  if membership == "fixed":
    for option, value in (("quorum", quorum), ("deadline", deadline)):
      if value is not None:
        raise validation.invalid(
          name, option, value, "null unless membership='elastic' (it sets elastic rounds)"
        )
    return Communication.RING, None, None
  quorum = 1 if quorum is None else quorum
  if not isinstance(quorum, int) or isinstance(quorum, bool) or not 1 <= quorum <= num_workers:
    raise validation.invalid(name, "quorum", quorum, f"an integer in [1, num_workers={num_workers}]")
  if deadline is not None:
    deadline = validation.check_real(name, "deadline", deadline, low=0.0, low_open=True)
  if exchange.quantize is not None:
    raise validation.invalid(
      name,
      "quantize",
      exchange.quantize,
      "null with membership='elastic' (the parameter server carries pseudo-gradients in the parameters' dtype)",
    )
  return Communication.PARAMETER_SERVER, quorum, deadline


def _local_rounds(
  name,
  num_workers,
  period,
  outer_learning_rate,
  outer_momentum,
  inner,
  exchange=None,
  membership=("fixed", None, None),
) -> Recipe:
  """Rounds of ``period`` local steps of ``inner(lr)`` per worker, then the outer Nesterov step on the averaged models.

  With ``exchange.fragments = P > 1`` a round is ``period / P`` steps and synchronizes one fragment,
  each fragment with its own outer optimizer. ``membership`` is ``(membership, quorum, deadline)``, the
  options of :func:`_membership`.
  """
  period = validation.check_int(name, "period", period)
  outer_lr = validation.check_real(name, "outer_learning_rate", outer_learning_rate, low=0.0, low_open=True)
  outer_m = validation.check_real(name, "outer_momentum", outer_momentum, low=0.0, high=1.0, high_open=True)
  exchange = PseudoGradientExchange() if exchange is None else exchange
  communication, quorum, deadline = _membership(name, num_workers, *membership, exchange)
  round_steps = period // exchange.fragments
  blueprint = Blueprint(
    name=name,
    num_workers=num_workers,
    engine=Engine.SYNC,
    protocol=WorkerProtocol.LOCAL,
    communication=communication,
    quorum=quorum,
    deadline=deadline,
    local_steps=round_steps,
    exchange=exchange,
    rate_clock=RateClock.WORKER_STEPS,
    gradients_per_update=float(num_workers * round_steps),
    # A server sums each pushed pseudo-gradient into the round's (reads 2 arrays, writes 1).
    server_traffic=ServerTraffic(3.0 if quorum else 0.0, pieces.sgd_traffic(outer_m)),
  )

  def rules(lr):
    outer = pieces.sgd(outer_lr, outer_m, nesterov=outer_m > 0)
    return (outer if exchange.fragments == 1 else by_fragment(outer, exchange.fragments)), inner(lr)

  return Recipe(blueprint, rules)


def _exchange(name, *, period, fragments=1, overlap=0, mixing=0.0, quantize=None, quantize_block=64):
  """The checked :class:`PseudoGradientExchange` of a local strategy (the checks of :func:`jaxsync.diloco`)."""
  _, fragments, overlap, mixing, quantize, quantize_block = check_exchange(
    name, period, fragments, overlap, mixing, quantize, quantize_block
  )
  return PseudoGradientExchange(fragments, overlap, mixing, quantize, quantize_block)


@register("local_sgd", learning_rate=0.01, meanings=_MEMBERSHIP_MEANINGS)
def _local_sgd(
  num_workers,
  *,
  momentum=0.0,
  period=8,
  outer_learning_rate=1.0,
  outer_momentum=0.0,
  weight_decay=0.0,
  membership="fixed",
  quorum=None,
  deadline=None,
) -> Recipe:
  """Local SGD: ``period`` local steps per worker, then the models are averaged (DiLoCo's outer step).

  The server rule is the outer optimizer on the pseudo-gradient
  ``theta - mean_k x_k``: SGD with rate 1 is plain model averaging; a
  Nesterov outer momentum gives DiLoCo's outer loop. ``learning_rate`` (and
  its schedule) and ``weight_decay`` are the workers' local optimizer's.
  """
  name = "local_sgd"
  momentum = pieces.check_momentum(name, momentum)
  decay = pieces.check_decay(name, weight_decay)
  return _local_rounds(
    name,
    num_workers,
    period,
    outer_learning_rate,
    outer_momentum,
    lambda lr: pieces.decayed(pieces.sgd(lr, momentum), decay),
    membership=(membership, quorum, deadline),
  )


# The optax optimizers a worker may take as its inner one (DiLoCo: AdamW; MuLoCo-style work swaps it).
INNER_OPTIMIZERS = ("adamw", "adam", "lion", "sgd", "rmsprop", "adafactor", "nadamw", "adabelief")


def _inner(name: str, optimizer: str, options: Any, weight_decay: float):
  """A worker's inner optimizer, ``optax.<optimizer>(lr, weight_decay=..., **options)``, as ``lr -> rule``.

  ``options`` are the optimizer's own keyword arguments (AdamW's ``b1``, ``b2``, ``eps``, ...), checked
  against its signature now; ``weight_decay`` is its own (decoupled for AdamW) and must be 0 for an
  optimizer that takes none.
  """
  optimizer = validation.check_choice(name, "inner_optimizer", optimizer, INNER_OPTIMIZERS)
  decay = pieces.check_decay(name, weight_decay)
  options = {} if options is None else options
  if not isinstance(options, Mapping):
    raise validation.invalid(
      name, "inner_options", options, f"a mapping of optax.{optimizer}'s arguments, or null"
    )
  factory = getattr(optax, optimizer)
  takes = set(inspect.signature(factory).parameters)
  accepted = takes - {"learning_rate", "weight_decay"}  # the strategy's weight_decay is the optimizer's
  unknown = sorted(set(options) - accepted)
  if unknown:
    hint = "".join(did_you_mean(k, tuple(accepted)) for k in unknown)
    raise validation.invalid(
      name,
      "inner_options",
      dict(options),
      f"arguments of optax.{optimizer}{hint}: {', '.join(sorted(accepted))}",
    )
  kwargs = dict(options)
  if "weight_decay" in takes:
    kwargs["weight_decay"] = decay
  elif decay:
    raise validation.invalid(
      name,
      "weight_decay",
      weight_decay,
      f"0 with inner_optimizer={optimizer!r}: optax.{optimizer} takes no weight decay (the default 0.1 is"
      " AdamW's, DiLoCo's inner optimizer)",
    )
  factory(0.001, **kwargs)  # checks the values now, before a learning rate is known
  return lambda lr: reject_nonfinite(factory(lr, **kwargs))


@register("diloco", learning_rate=0.001, meanings=_DILOCO_MEANINGS)
def _diloco(
  num_workers,
  *,
  period=50,
  outer_learning_rate=OUTER_LEARNING_RATE,
  outer_momentum=OUTER_MOMENTUM,
  weight_decay=0.1,
  quantize=None,
  quantize_block=64,
  inner_optimizer="adamw",
  inner_options=None,
  membership="fixed",
  quorum=None,
  deadline=None,
) -> Recipe:
  """DiLoCo: ``period`` AdamW steps per worker, then Nesterov on the averaged pseudo-gradient (Douillard et al., 2023).

  Local SGD with the paper's optimizers: inner AdamW (``learning_rate``,
  decoupled ``weight_decay``, its moments kept across rounds) and outer
  Nesterov SGD (lr 0.7, momentum 0.9) on ``theta - mean_k x_k``. The paper
  syncs every 500 inner steps on C4; the default here, 50, suits runs of a
  few thousand steps. ``quantize`` sends the pseudo-gradients as bfloat16,
  int8 or int4 (per-block scales). With ``membership="elastic"`` the rounds
  run through a parameter server and workers may leave and join: each outer
  step averages the pseudo-gradients delivered by the round's close (every
  live worker's, or those in ``deadline`` seconds after the first, at least
  ``quorum``).
  """
  name = "diloco"
  exchange = _exchange(name, period=period, quantize=quantize, quantize_block=quantize_block)
  return _local_rounds(
    name,
    num_workers,
    period,
    outer_learning_rate,
    outer_momentum,
    _inner(name, inner_optimizer, inner_options, weight_decay),
    exchange,
    (membership, quorum, deadline),
  )


@register("streaming_diloco", learning_rate=0.001, meanings=_STREAMING_DILOCO_MEANINGS)
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
  inner_optimizer="adamw",
  inner_options=None,
  membership="fixed",
  quorum=None,
  deadline=None,
) -> Recipe:
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
    name,
    num_workers,
    period,
    outer_learning_rate,
    outer_momentum,
    _inner(name, inner_optimizer, inner_options, weight_decay),
    exchange,
    (membership, quorum, deadline),
  )


@register(
  "async_local_sgd",
  learning_rate=0.001,
  meanings=_ASYNC_LOCAL_SGD_MEANINGS,
  renamed={"delay": "momentum_period"},
)
def _async_local_sgd(
  num_workers,
  *,
  period=50,
  dylu=False,
  min_local_steps=1,
  outer_learning_rate=OUTER_LEARNING_RATE,
  outer_momentum=OUTER_MOMENTUM,
  momentum_period=None,
  activation=0.0,
  weight_decay=0.1,
  inner_optimizer="adamw",
  inner_options=None,
) -> Recipe:
  """Asynchronous local SGD: AdamW local steps, pseudo-gradients pushed as workers finish, Delayed Nesterov (Liu et al., 2024).

  Each worker takes ``period`` AdamW steps (``learning_rate``,
  ``weight_decay``) from the parameters it pulled and pushes its
  pseudo-gradient; the server applies each with Delayed Nesterov (rate
  ``outer_learning_rate``, momentum updated every ``momentum_period`` arrivals, default
  K) and replies at once. With ``dylu`` (Dynamic Local Updates) a worker
  takes steps in proportion to its speed, at least ``min_local_steps``.
  """
  name = "async_local_sgd"
  period = validation.check_int(name, "period", period)
  dylu = validation.check_bool(name, "dylu", dylu)
  validation.check_int(name, "min_local_steps", min_local_steps)
  if min_local_steps > period:
    raise validation.invalid(name, "min_local_steps", min_local_steps, f"an integer in [1, period={period}]")
  momentum_period = (
    num_workers if momentum_period is None else validation.check_int(name, "momentum_period", momentum_period)
  )
  outer = functools.partial(
    delayed_nesterov, momentum=outer_momentum, momentum_period=momentum_period, activation=activation
  )
  outer_lr = validation.check_real(name, "outer_learning_rate", outer_learning_rate, low=0.0, low_open=True)
  outer(outer_lr)  # checks the outer options now
  # The Delayed Nesterov step reads g, theta, m and D and writes theta and D (m on every N-th): about 7.
  blueprint = pieces.asynchronous(
    name,
    num_workers,
    protocol=WorkerProtocol.LOCAL,
    local_steps=period,
    rate_clock=RateClock.WORKER_STEPS,
    gradients_per_update=float(period),
    server_traffic=ServerTraffic(0.0, pieces.ADAM_TRAFFIC),
  )
  inner = _inner(name, inner_optimizer, inner_options, weight_decay)
  return Recipe(blueprint, lambda lr: (outer(outer_lr), inner(lr)))
