"""Checks of Python-level arguments, used by every layer: one message format naming the value.

Every factory, constructor and config check in jaxsync raises
``ValueError(f"{what}: {name}={value!r} is invalid; expected {expected}.")``
before anything is compiled or run. Traced values are never checked here: a
rule rejects a bad arrival in its state instead (:mod:`jaxsync._src.rules.guard`).

A rule's numeric hyperparameters (learning rates, momenta, ...) may also be
scalar arrays, as ``optax.inject_hyperparams`` passes them (concrete arrays at
``init``, tracers inside a jitted ``update``): the checks marked
``array_ok=True`` let those through unchecked and validate Python numbers only.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsync._src.core.suggestions import did_you_mean


def _is_real(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _passes_as_array(rule: str, name: str, value: Any, array_ok: bool) -> bool:
  """Whether ``value`` is a scalar array (or tracer) to accept unchecked; a non-scalar one is an error."""
  if not array_ok or not isinstance(value, (jax.Array, np.ndarray)):
    return False
  if np.ndim(value) != 0:
    raise invalid(rule, name, f"<array of shape {np.shape(value)}>", "a scalar")
  return True


def invalid(rule: str, name: str, value: Any, expected: str) -> ValueError:
  """Builds the one error message format used across jaxsync."""
  return ValueError(f"{rule}: {name}={value!r} is invalid; expected {expected}.")


def check_real(
  rule: str,
  name: str,
  value: Any,
  *,
  low: float | None = None,
  high: float | None = None,
  low_open: bool = False,
  high_open: bool = False,
  array_ok: bool = False,
) -> float:
  """Checks that ``value`` is a finite real number inside the given interval.

  With ``array_ok`` a scalar array (an injected hyperparameter) is returned unchecked.
  """
  if _passes_as_array(rule, name, value, array_ok):
    return value
  left = "(" if low_open else "["
  right = ")" if high_open else "]"
  lo = "-inf" if low is None else repr(low)
  hi = "inf" if high is None else repr(high)
  expected = f"a finite real number in {left}{lo}, {hi}{right}"
  if not _is_real(value) or not math.isfinite(float(value)):
    raise invalid(rule, name, value, expected)
  value = float(value)
  if low is not None and (value < low or (low_open and value == low)):
    raise invalid(rule, name, value, expected)
  if high is not None and (value > high or (high_open and value == high)):
    raise invalid(rule, name, value, expected)
  return value


def check_int(rule: str, name: str, value: Any, *, low: int = 1, array_ok: bool = False) -> int:
  """Checks that ``value`` is an integer (not a bool) of at least ``low``.

  With ``array_ok`` a scalar array (an injected hyperparameter) is returned unchecked.
  """
  if _passes_as_array(rule, name, value, array_ok):
    return value
  if not _is_int(value) or int(value) < low:
    raise invalid(rule, name, value, f"an integer >= {low}")
  return int(value)


def check_static_int(rule: str, name: str, value: Any, *, low: int = 1) -> int:
  """An integer that decides a rule's structure (a buffer's existence, a table's size): never an array."""
  if isinstance(value, (jax.Array, np.ndarray)):
    raise invalid(
      rule,
      name,
      value,
      f"a Python integer >= {low}: it decides the rule's structure (with optax.inject_hyperparams, list "
      f"{name!r} in static_args)",
    )
  return check_int(rule, name, value, low=low)


def renamed(rule: str, old: str, new: str, old_value: Any, new_value: Any) -> Any:
  """The value of an argument renamed from ``old`` to ``new``: ``new_value``, or ``old_value`` with a warning.

  jaxsync keeps one name per concept across its transforms, strategies and configs; a name it gave up is
  still accepted for a while, with a ``FutureWarning`` that names the new one (a warning Python shows by
  default, wherever the old name was written: a script, a config, a library).
  """
  if old_value is None:
    return new_value
  if new_value is not None:
    raise invalid(rule, old, old_value, f"unset: it is the old name of {new!r}, which is given too")
  warnings.warn(
    f"{rule}: {old}= is the old name of {new}=; pass {new}={old_value!r} (the old name will be removed)",
    FutureWarning,
    stacklevel=3,
  )
  return old_value


def check_choice(rule: str, name: str, value: Any, options: Sequence[str]) -> str:
  """Checks that ``value`` is one of the named ``options``; the message suggests the closest one."""
  if not isinstance(value, str) or value not in options:
    raise invalid(
      rule, name, value, "one of " + ", ".join(repr(o) for o in options) + did_you_mean(value, options)
    )
  return value


def check_state_dtype(rule: str, value: Any, name: str = "accumulator_dtype") -> Any:
  """Checks a state dtype: ``None`` (the rule's default) or a floating dtype; returns it as a ``jnp.dtype``."""
  if value is None:
    return None
  try:
    dtype = jnp.dtype(value)
  except TypeError:
    dtype = None
  if dtype is None or not jnp.issubdtype(dtype, jnp.inexact):
    raise invalid(
      rule,
      name,
      value,
      "None (at least float32, the parameters' dtype where wider) or a floating dtype such as jnp.float32, "
      "jnp.bfloat16 or 'float32'",
    )
  return dtype


def check_bool(rule: str, name: str, value: Any) -> bool:
  """Checks that ``value`` is True or False."""
  if not isinstance(value, bool):
    raise invalid(rule, name, value, "True or False")
  return value


def check_learning_rate(rule: str, value: Any, name: str = "learning_rate") -> optax.ScalarOrSchedule:
  """A learning rate is a positive finite number, a schedule ``count -> rate``, or a scalar array (injected)."""
  if callable(value) or _passes_as_array(rule, name, value, True):
    return value
  if not _is_real(value) or not math.isfinite(float(value)) or float(value) <= 0:
    raise invalid(
      rule,
      name,
      value,
      "a positive finite number or a schedule (a callable step -> rate)",
    )
  return float(value)
