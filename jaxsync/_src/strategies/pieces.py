"""What the strategy families build with: the server's optimizers, coupled L2, the option checks, memory traffic.

Each family module (:mod:`synchronous`, :mod:`hierarchical`, :mod:`parameter_server`,
:mod:`low_communication`, :mod:`elastic`) assembles its strategies from these
pieces and the rules of :mod:`jaxsync._src.rules`, so that an optimizer, a
check or a traffic figure is written once for all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optax

from jaxsync._src.core import validation
from jaxsync._src.rules.release import on_release
from jaxsync._src.rules.staleness import scale_by_staleness
from jaxsync._src.strategies.strategy import Blueprint, Engine, WorkerProtocol, reject_nonfinite

# Memory traffic of the server's update, in parameter-sized arrays read + written (ServerTraffic).
SGD_TRAFFIC, MOMENTUM_TRAFFIC, ADAM_TRAFFIC = 3.0, 5.0, 7.0
ACCUMULATE_TRAFFIC = 3.0  # a buffered arrival: read the gradient, read and write the sum
SERVER_OPTIMIZERS = ("sgd", "adam", "rmsprop")


def sgd(learning_rate, momentum: float = 0.0, nesterov: bool = False):
  """``optax.sgd`` (momentum 0: none) that counts and skips non-finite updates."""
  return reject_nonfinite(optax.sgd(learning_rate, momentum=momentum or None, nesterov=nesterov))


def sgd_traffic(momentum: float) -> float:
  """The memory traffic of an SGD step, with or without a momentum buffer."""
  return MOMENTUM_TRAFFIC if momentum else SGD_TRAFFIC


def server_optimizer(name: str, choice: str) -> tuple[Callable[[Any], Any], float]:
  """The optimizer a server applies per update (SGD, Adam or RMSProp) as a function of the rate; its traffic."""
  choice = validation.check_choice(name, "server_optimizer", choice, SERVER_OPTIMIZERS)
  if choice == "adam":
    return lambda learning_rate: reject_nonfinite(optax.adam(learning_rate)), ADAM_TRAFFIC
  if choice == "rmsprop":
    return lambda learning_rate: reject_nonfinite(optax.rmsprop(learning_rate)), MOMENTUM_TRAFFIC
  return sgd, SGD_TRAFFIC


def decayed(rule, weight_decay: float):
  """``rule`` after coupled L2, ``g + lambda w`` with the parameters the rule is given (no extra traffic:
  the update reads ``w`` anyway)."""
  if not weight_decay:
    return rule
  return optax.chain(optax.add_decayed_weights(weight_decay), rule)


def buffered_sgd(per_update: int, learning_rate, momentum: float):
  """The mean of ``per_update`` arrivals, then one SGD(-momentum) step on each release only (so a
  schedule counts releases)."""
  return on_release(scale_by_staleness("none", gradients_per_update=per_update), sgd(learning_rate, momentum))


def check_momentum(name: str, momentum: float) -> float:
  return validation.check_real(name, "momentum", momentum, low=0.0, high=1.0, high_open=True)


def check_decay(name: str, weight_decay: float) -> float:
  return validation.check_real(name, "weight_decay", weight_decay, low=0.0)


def check_divides(name: str, option: str, value: int, num_workers: int) -> int:
  value = validation.check_int(name, option, value)
  if num_workers % value:
    raise validation.invalid(name, option, value, f"a divisor of num_workers={num_workers}")
  return value


def asynchronous(name, num_workers, *, protocol=WorkerProtocol.GRADIENT, **fields) -> Blueprint:
  """The blueprint of an asynchronous strategy (a parameter server and its dispatch)."""
  return Blueprint(name=name, num_workers=num_workers, engine=Engine.ASYNC, protocol=protocol, **fields)
