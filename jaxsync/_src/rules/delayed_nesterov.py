"""Delayed Nesterov: the outer optimizer of asynchronous local SGD (the Algorithms page, section 20)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxsync._src.core import validation
from jaxsync._src.core.deprecation import renamed_field
from jaxsync._src.rules import guard

_RULE = "delayed_nesterov"


class DelayedNesterovState(NamedTuple):
  """State of :func:`delayed_nesterov`.

  Attributes:
    count: arrivals applied.
    momentum_buffer: ``m``, updated once every ``N`` arrivals. (Formerly ``momentum``, still readable
      with a ``DeprecationWarning``.)
    buffer: ``D``, the sum of the arrivals since the last momentum update.
    nonfinite_count: arrivals rejected for a NaN or Inf.
  """

  count: jax.Array
  momentum_buffer: optax.Updates
  buffer: optax.Updates
  nonfinite_count: jax.Array

  momentum = renamed_field("momentum", "momentum_buffer")


def delayed_nesterov(
  learning_rate: optax.ScalarOrSchedule,
  momentum: float = 0.9,
  *,
  momentum_period: int | None = None,
  activation: float = 0.0,
  delay: int | None = None,
  accumulator_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Delayed Nesterov: Nesterov momentum for a server that receives pseudo-gradients one at a time.

  In asynchronous local SGD every worker sends its pseudo-gradient (how far
  its local steps moved) when it finishes, and the server applies each at
  once. Nesterov momentum updated on every arrival lets one worker's stale,
  large step dominate it; Delayed Nesterov applies each arrival plainly and
  updates the momentum only once every ``N = momentum_period`` arrivals, with their mean. Use it
  as the server (outer) rule of asynchronous local SGD; with ``momentum_period=1`` and
  ``activation=0`` it is Nesterov SGD, ``optax.sgd(lr, momentum, nesterov=True)``.

  Arrival ``t`` with pseudo-gradient ``g``:

  .. math::

    &D \leftarrow D + g \\
    &\text{if } (t + 1) \bmod N = 0:\quad m \leftarrow \beta m + D / N,\quad
      \theta \leftarrow \theta - \epsilon\big((1 - cN + c)\, \beta m + g / N\big),\quad D \leftarrow 0 \\
    &\text{else:}\quad \theta \leftarrow \theta - \epsilon\,(c\, \beta m + g / N)

  Over ``N`` arrivals (``c = 0``) the parameters take one Nesterov step on
  the arrivals' mean, applied a piece at a time; ``c`` (in ``[0, 1/N]``)
  spreads the momentum term over the arrivals in between. This is a
  *final-update* rule (learning rate inside): add its output with
  ``optax.apply_updates``. Unknown extra args are ignored; a NaN/Inf arrival
  is rejected (zeros out, state unchanged, counted in ``nonfinite_count``);
  ``grads_finite`` (bool scalar) replaces the scan.

  Args:
    learning_rate: ``epsilon``, a positive number or a schedule of ``count``.
    momentum: ``beta`` in ``[0, 1)``.
    momentum_period: ``N >= 1``, arrivals per momentum update (required; the
      number of workers is the natural choice). The paper calls it the delay,
      but it is no gradient's staleness: it is how often the momentum moves.
    activation: ``c`` in ``[0, 1/N]``, the momentum applied between updates.
    delay: the old name of ``momentum_period``, accepted with a ``FutureWarning``.
    accumulator_dtype: the dtype of the state's parameter-sized buffers (optax's name for it); ``None``
      (default): at least float32, the parameters' dtype where wider, so bfloat16 parameters keep float32
      statistics. Updates keep the gradients' dtype either way.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is a
    :class:`DelayedNesterovState`.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> tx = jaxsync.delayed_nesterov(1.0, 0.5, momentum_period=2)
    >>> w = jnp.array([0.0]); state = tx.init(w)
    >>> u, state = tx.update(jnp.array([2.0]), state, w); w = optax.apply_updates(w, u); w  # g / N
    Array([-1.], dtype=float32)
    >>> u, state = tx.update(jnp.array([2.0]), state, w)  # m = 0.5 * 0 + 4 / 2 = 2, then beta m + g / N
    >>> optax.apply_updates(w, u)
    Array([-3.], dtype=float32)

  References:
    Liu, Douillard, Kim, Freitag, Hsieh, Szlam, "Asynchronous Local-SGD
    Training for Language Modeling", arXiv:2401.09135, 2024 (Delayed
    Nesterov); Nesterov, "A method for solving the convex programming problem
    with convergence rate O(1/k^2)", 1983.
  """
  learning_rate = validation.check_learning_rate(_RULE, learning_rate)
  beta = validation.check_real(_RULE, "momentum", momentum, low=0.0, high=1.0, high_open=True, array_ok=True)
  period = validation.renamed(_RULE, "delay", "momentum_period", delay, momentum_period)
  if period is None:
    raise validation.invalid(_RULE, "momentum_period", None, "an integer >= 1 (arrivals per momentum update)")
  period = validation.check_int(_RULE, "momentum_period", period, array_ok=True)
  high = 1.0 / period if isinstance(period, int) else None
  c = validation.check_real(_RULE, "activation", activation, low=0.0, high=high, array_ok=True)

  acc_dtype = validation.check_state_dtype(_RULE, accumulator_dtype)

  def init_fn(params: optax.Params) -> DelayedNesterovState:
    return DelayedNesterovState(
      count=jnp.zeros([], jnp.int32),
      momentum_buffer=guard.state_zeros(params, acc_dtype),
      buffer=guard.state_zeros(params, acc_dtype),
      nonfinite_count=jnp.zeros([], jnp.int32),
    )

  def update_fn(
    updates: optax.Updates,
    state: DelayedNesterovState,
    params: optax.Params | None = None,
    *,
    grads_finite: Any = None,
    **extra_args: Any,
  ) -> tuple[optax.Updates, DelayedNesterovState]:
    del params, extra_args

    def apply(accept, rejected):
      rate = guard.learning_rate_at(learning_rate, state.count)
      n = jnp.asarray(period, jnp.float32)
      beta_ = jnp.asarray(beta, jnp.float32)
      c_ = jnp.asarray(c, jnp.float32)
      full = (state.count + 1) % period == 0
      summed = jax.tree.map(lambda d, g: d + g.astype(d.dtype), state.buffer, updates)
      momentum = jax.tree.map(
        lambda m, d: jnp.where(full, beta_ * m + d / n, m).astype(m.dtype), state.momentum_buffer, summed
      )
      # Momentum's weight in this arrival's step: 1 - cN + c on an update, c in between.
      weight = jnp.where(full, 1.0 - c_ * n + c_, c_) * beta_
      out = jax.tree.map(
        lambda g, m: (-rate * (weight * m + g.astype(m.dtype) / n)).astype(g.dtype), updates, momentum
      )
      buffer = jax.tree.map(lambda d: jnp.where(full, jnp.zeros_like(d), d), summed)
      proposed = rejected._replace(
        count=optax.safe_increment(state.count), momentum_buffer=momentum, buffer=buffer
      )
      return out, guard.keep_if(accept, proposed, rejected)

    return guard.guarded_update(updates, state, apply, grads_finite=grads_finite)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
