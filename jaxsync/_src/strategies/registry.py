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

The strategies themselves are in their families' modules (:mod:`synchronous`,
:mod:`hierarchical`, :mod:`parameter_server`, :mod:`low_communication`,
:mod:`elastic`); this module only looks them up.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from jaxsync._src.core import validation

# The families: importing each registers its strategies in the table.
from jaxsync._src.strategies import (  # noqa: F401
  elastic,
  hierarchical,
  low_communication,
  parameter_server,
  synchronous,
)
from jaxsync._src.strategies.strategy import Blueprint, Engine, Strategy
from jaxsync._src.strategies.table import REGISTRY, Entry, Rules, option_meaning

__all__ = ["DEFAULT_RATES", "StrategyInfo", "blueprint", "describe", "make", "names", "option_meaning"]


def names() -> tuple[str, ...]:
  """The registered strategy names, sorted."""
  return tuple(sorted(REGISTRY))


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
    renamed: old option names still accepted (with a ``FutureWarning``) and the names they became.
  """

  name: str
  summary: str
  options: Mapping[str, Any]
  meanings: Mapping[str, str] = dataclasses.field(default_factory=dict)
  synchronous: bool = False
  alias_of: str | None = None
  renamed: Mapping[str, str] = dataclasses.field(default_factory=dict)


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
    renamed=dict(entry.renamed),
  )


def _lookup(name: str) -> Entry:
  if name not in REGISTRY:
    raise ValueError(
      f"strategy name={name!r} is unknown{validation.did_you_mean(name, names())}; expected one of: "
      f"{', '.join(names())}."
    )
  return REGISTRY[name]


def _recipe(name: str, num_workers: int, options: Mapping[str, Any]) -> tuple[Blueprint, Callable[[], Rules]]:
  """Strategy ``name``'s options checked and through its factory: its blueprint, and its rules to build."""
  entry = _lookup(name)
  num_workers = validation.check_int(f"strategy {name!r}", "num_workers", num_workers)
  valid = describe(name).options
  options = dict(options)
  for old, new in entry.renamed.items():
    if old in options:
      options[new] = validation.renamed(f"strategy {name!r}", old, new, options.pop(old), options.get(new))
  unknown = sorted(set(options) - set(valid))
  if unknown:
    hints = "".join(validation.did_you_mean(option, tuple(valid)) for option in unknown)
    raise ValueError(
      f"strategy {name!r}: unknown option(s) {', '.join(unknown)}{hints}; valid options: "
      f"{', '.join(sorted(valid))}."
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
