"""The strategy table: every registered factory by name, and what each option means.

A family module (:mod:`synchronous`, :mod:`hierarchical`, :mod:`parameter_server`,
:mod:`low_communication`, :mod:`elastic`) adds its strategies with
:func:`register`; :mod:`registry` loads the families and looks strategies up.
Adding a strategy touches its family's module only: its factory, its default
learning rate and the meaning of any option of its own go in one ``register``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import optax

from jaxsync._src.strategies.strategy import Blueprint

Rules = tuple[optax.GradientTransformationExtraArgs, optax.GradientTransformationExtraArgs | None]


class Recipe(NamedTuple):
  """What a factory returns: the strategy less its rules, and ``learning_rate -> (server rule, worker rule)``."""

  blueprint: Blueprint
  rules: Callable[[Any], Rules]


class Entry(NamedTuple):
  """A registered factory (its keyword-only arguments are the options) and its default learning rate."""

  factory: Callable[..., Recipe]
  learning_rate: float
  canonical: str  # the first name it was registered under; the others are other names for it
  renamed: Mapping[str, str]  # an option's old name -> its name now (still accepted, with a warning)


REGISTRY: dict[str, Entry] = {}

# What each option means, in a user's words (``jaxsync strategies``), by option name; a strategy that
# gives a name a meaning of its own registers it (``register(..., meanings=...)``).
OPTION_MEANINGS: dict[str, str] = {
  "learning_rate": "the step size (a number, or an optax schedule in Python)",
  "momentum": "the momentum coefficient, in [0, 1)",
  "weight_decay": "coupled L2: adds weight_decay * w to each gradient",
  "server_optimizer": "the server's optimizer: sgd, adam or rmsprop",
  "group_size": "workers per group of the two-level all-reduce (must divide K; default min(4, K))",
  "k": "gradients per round: the k fastest are kept (default (1 - drop_rate) K)",
  "period": "local steps between two exchanges",
  "outer_learning_rate": "the rate of the averaged models' step (1.0: plain model averaging)",
  "outer_momentum": "momentum of the averaged models' step (0: none)",
  "moving_rate": "alpha, how far a worker and the centre move toward each other (default 0.9 / K)",
}
_STRATEGY_MEANINGS: dict[tuple[str, str], str] = {}


def register(
  *names: str,
  learning_rate: float,
  meanings: Mapping[str, str] | None = None,
  renamed: Mapping[str, str] | None = None,
):
  """Registers a factory under ``names``; every strategy takes ``learning_rate``, this is its default.

  Args:
    *names: the strategy's name, then any other names for it.
    learning_rate: the default learning rate.
    meanings: what the strategy's own options mean, where :data:`OPTION_MEANINGS` has no meaning for the
      name or the strategy gives it another one.
    renamed: old option names, still accepted with a ``FutureWarning``, and the names they became.

  Returns:
    The decorator, which returns the factory unchanged.
  """
  for option, meaning in (meanings or {}).items():
    _STRATEGY_MEANINGS[names[0], option] = meaning

  def add(factory):
    for name in names:
      REGISTRY[name] = Entry(factory, learning_rate, names[0], dict(renamed or {}))
    return factory

  return add


def option_meaning(name: str, option: str) -> str:
  """What ``option`` of strategy ``name`` (its first registered name) means; a ``KeyError`` if undocumented."""
  return _STRATEGY_MEANINGS.get((name, option)) or OPTION_MEANINGS[option]
