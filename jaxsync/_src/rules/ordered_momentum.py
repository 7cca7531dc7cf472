"""OrMo and OrMo-DA: ordered momentum for asynchronous SGD (the Algorithms page, sections 6 and 7)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxsync._src.core import validation
from jaxsync._src.core.deprecation import renamed_field
from jaxsync._src.rules import guard

_RULE = "ordered_momentum"
DELAY_MEASURES = ("iterations", "groups")


class OrderedMomentumState(NamedTuple):
  """State of :func:`ordered_momentum`.

  Attributes:
    count: ``t``, the number of arrivals applied; the server's version. The
      parameters sent back after an arrival carry version ``count``.
    group: ``I``, the index of the latest gradient group.
    momentum_buffer: ``u``, the ordered momentum, learning rate inside (form A). (Formerly ``momentum``,
      still readable with a ``DeprecationWarning``.)
    last_delay: ``t - s`` of the last applied arrival (iterations).
    nonfinite_count: arrivals rejected for a NaN or Inf gradient.
    invalid_version_count: arrivals rejected because their version was
      negative, newer than ``count``, or in a group after the latest one.
  """

  count: jax.Array
  group: jax.Array
  momentum_buffer: optax.Updates
  last_delay: jax.Array
  nonfinite_count: jax.Array
  invalid_version_count: jax.Array

  momentum = renamed_field("momentum", "momentum_buffer")


def _ceil_div(a: jax.Array, b: int) -> jax.Array:
  return (a + (b - 1)) // b


def _geometric_sum(beta: jax.Array, terms: jax.Array) -> jax.Array:
  """``1 + beta + ... + beta**(terms-1)``, i.e. ``(1 - beta**terms) / (1 - beta)``."""
  return (1.0 - beta**terms) / (1.0 - beta)


def ordered_momentum(
  learning_rate: optax.ScalarOrSchedule,
  momentum: float = 0.9,
  *,
  num_workers: int,
  delay_adaptive: bool = False,
  delay_measure: str = "iterations",
  accumulator_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Ordered momentum (OrMo): SGD with momentum for an asynchronous server, stale gradients in order.

  In asynchronous SGD the gradients reach the server late, computed on older
  parameters; plain momentum then adds a stale gradient as if it were fresh.
  OrMo files each gradient by the server version it was computed on and gives
  it the weight it would have had in synchronous SGD with momentum. Use it as
  the server rule of asynchronous SGD when you want momentum. In an ordinary
  single-process loop every gradient is fresh: with ``num_workers=1`` it is
  then exactly heavy-ball momentum, ``optax.sgd(learning_rate, momentum)``, and
  drops into ``flax.nnx.Optimizer`` or ``optax.apply_updates`` unchanged.

  The gradients are grouped by version: group 0 holds the ``K`` gradients
  computed at version 0, group ``i >= 1`` those computed at versions
  ``(i-1)K+1 .. iK``, so a gradient of version ``s`` is in group
  ``j(s) = ceil(s / K)``. For arrival ``t`` carrying gradient ``g`` computed at
  version ``s`` (Algorithm 2 of the paper):

  .. math::

    &\text{(a) look-ahead, if } C = \emptyset \text{ and } \lceil t/K \rceil > I:
       \quad w \leftarrow w - \beta u,\; u \leftarrow \beta u,\; I \leftarrow I + 1 \\
    &\text{(b) } \delta = I - \lceil s/K \rceil \ge 0 \\
    &\text{(c) } u \leftarrow u + \beta^{\delta} \eta_t g, \qquad
       w \leftarrow w - \frac{1 - \beta^{\delta + 1}}{1 - \beta} \eta_t g

  In words: (a) when a new group begins, the momentum is applied to the
  parameters once; (b) ``delta`` is how many groups late the gradient is;
  (c) it enters the momentum discounted by ``beta**delta`` and the parameters
  with the momentum steps it missed. The look-ahead (a) is part of the update
  of the arrival that crosses the boundary, so the returned update is
  ``-(beta u [if a]) - coef * eta g``. Under the asynchronous scheduler the
  waiting set ``C`` is always empty and (a) fires iff ``t = 1 (mod K)``,
  ``t >= 1``. The state keeps ``u = sum_g beta^(I - j_g) eta g`` and
  ``w = w_0 - sum_g (1 - beta^(I - j_g + 1)) / (1 - beta) eta g``: synchronous
  SGD with momentum written in groups, so the state after a set of arrivals
  does not depend on their order.

  **OrMo-DA** (``delay_adaptive=True``) also shrinks the learning rate of very
  late gradients, ``eta g -> eta_t g`` in both updates. Reading chosen: the
  paper's delay-adaptive rule is not in the text we have; two readings are
  implemented and ``delay_measure`` picks one:

  * ``"iterations"`` (default, after Mishchenko et al. 2022):
    ``eta_t = eta`` if ``tau_t <= 2K`` else ``eta K / tau_t``, ``tau_t = t - s``;
  * ``"groups"``: ``eta_t = eta`` if ``delta <= 1`` else ``eta / delta``.

  The group index uses the ceiling of ``s / K`` (the paper's indices are
  garbled; the ceiling is the one that gives group 0 exactly ``K`` gradients).
  Both readings are argued in the Algorithms page of the jaxsync
  documentation, sections '6. OrMo' and '7. OrMo-DA'.

  This is a *final-update* rule (learning rate inside): add its output to the
  parameters with ``optax.apply_updates``; do not chain a learning rate after it.

  Extra args of ``update``, all optional: ``version`` (int32 scalar: the
  version ``s`` the gradient was computed on; omitted, the gradient is fresh,
  ``s = count``, as in any single-process loop) and ``waiting_set_empty`` (bool
  scalar, default ``True``: whether the scheduler's waiting set ``C`` is empty;
  pass ``False`` while a synchronous scheduler is collecting a round). Unknown
  extra args are ignored. A NaN/Inf gradient or an impossible version is
  rejected: zeros out, state unchanged, counted in ``nonfinite_count`` /
  ``invalid_version_count``; ``grads_finite`` (bool scalar) replaces the
  NaN/Inf scan when the caller already knows.

  Args:
    learning_rate: ``eta``, a positive number or a schedule of ``count``.
    momentum: ``beta`` in ``[0, 1)``.
    num_workers: ``K``, the number of workers (the gradient-group size); 1 in
      a single process.
    delay_adaptive: ``True`` for OrMo-DA.
    delay_measure: ``"iterations"`` or ``"groups"``, see above (OrMo-DA only).
    accumulator_dtype: the dtype of the state's parameter-sized buffers (optax's name for it); ``None``
      (default): at least float32, the parameters' dtype where wider, so bfloat16 parameters keep float32
      statistics. Updates keep the gradients' dtype either way.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is an
    :class:`OrderedMomentumState`.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> tx = jaxsync.ordered_momentum(0.1, 0.9, num_workers=1)
    >>> params = jnp.array([1.0, -2.0])
    >>> state = tx.init(params)
    >>> updates, state = tx.update(jnp.array([1.0, 1.0]), state, params)  # fresh: no version
    >>> params = optax.apply_updates(params, updates)
    >>> params
    Array([ 0.9, -2.1], dtype=float32)
    >>> # On a server: this gradient was computed on version 0, one update ago.
    >>> updates, state = tx.update(jnp.array([1.0, 1.0]), state, params, version=0)
    >>> -updates  # beta u = 0.09 applied once, and the gradient with the step it missed: 1.9 eta g
    Array([0.28, 0.28], dtype=float32)

  References:
    Shi, Yang, Li, "Ordered Momentum for Asynchronous SGD", NeurIPS 2024
    (arXiv:2407.19234), Algorithm 2; Mishchenko, Bach, Even, Woodworth,
    "Asynchronous SGD Beats Minibatch SGD Under Arbitrary Delays", NeurIPS 2022.
  """
  learning_rate = validation.check_learning_rate(_RULE, learning_rate)
  beta = validation.check_real(_RULE, "momentum", momentum, low=0.0, high=1.0, high_open=True, array_ok=True)
  num_workers = validation.check_int(_RULE, "num_workers", num_workers, array_ok=True)
  delay_adaptive = validation.check_bool(_RULE, "delay_adaptive", delay_adaptive)
  delay_measure = validation.check_choice(_RULE, "delay_measure", delay_measure, DELAY_MEASURES)

  acc_dtype = validation.check_state_dtype(_RULE, accumulator_dtype)

  def init_fn(params: optax.Params) -> OrderedMomentumState:
    return OrderedMomentumState(
      count=jnp.zeros([], jnp.int32),
      group=jnp.zeros([], jnp.int32),
      momentum_buffer=guard.state_zeros(params, acc_dtype),
      last_delay=jnp.zeros([], jnp.int32),
      nonfinite_count=jnp.zeros([], jnp.int32),
      invalid_version_count=jnp.zeros([], jnp.int32),
    )

  def update_fn(
    updates: optax.Updates,
    state: OrderedMomentumState,
    params: optax.Params | None = None,
    *,
    grads_finite: Any = None,
    version: Any = None,
    waiting_set_empty: Any = True,
    **extra_args: Any,
  ) -> tuple[optax.Updates, OrderedMomentumState]:
    del params, extra_args
    t = state.count
    s, version_ok = guard.arrival_version(version, t)
    # (a) The look-ahead fires when the waiting set is empty and t enters a new group.
    crosses = jnp.logical_and(
      jnp.asarray(waiting_set_empty, jnp.bool_), _ceil_div(t, num_workers) > state.group
    )
    group = state.group + crosses.astype(jnp.int32)
    # (b) Group distance; delta >= 0 is the paper's invariant, enforced by rejection.
    delta = group - _ceil_div(s, num_workers)
    version_ok = version_ok & (delta >= 0)

    def apply(accept, rejected):
      beta_ = jnp.asarray(beta, jnp.float32)
      rate = guard.learning_rate_at(learning_rate, t)
      delay = t - s
      if delay_adaptive and delay_measure == "iterations":
        threshold = 2 * num_workers
        rate = jnp.where(delay <= threshold, rate, rate * num_workers / jnp.maximum(delay, 1))
      elif delay_adaptive:
        rate = jnp.where(delta <= 1, rate, rate / jnp.maximum(delta, 1))
      delta_f = delta.astype(jnp.float32)
      momentum_coef = rate * beta_**delta_f
      param_coef = rate * _geometric_sum(beta_, delta_f + 1.0)
      decay = jnp.where(crosses, beta_, 1.0)
      # With the look-ahead, w <- w - beta u_old - param_coef g, and beta u_old =
      # u_new - momentum_coef g. Writing the step from u_new keeps one reader of
      # u_old, so XLA updates u in place instead of copying it first.
      from_momentum = crosses.astype(jnp.float32)
      from_gradient = from_momentum * momentum_coef - param_coef
      accept, decay, momentum_coef, from_momentum, from_gradient = guard.computed_once(
        accept, decay, momentum_coef, from_momentum, from_gradient
      )

      new_momentum = jax.tree.map(
        lambda g, u: jnp.where(
          accept, decay.astype(u.dtype) * u + momentum_coef.astype(u.dtype) * g.astype(u.dtype), u
        ),
        updates,
        state.momentum_buffer,
      )
      # The barrier stops XLA from recomputing u_new (from u_old) inside the loop
      # that computes the step: u is then read once and updated in place.
      new_momentum = lax.optimization_barrier(new_momentum)
      new_updates = jax.tree.map(
        lambda g, u: (
          -from_momentum.astype(u.dtype) * u + from_gradient.astype(u.dtype) * g.astype(u.dtype)
        ).astype(g.dtype),
        updates,
        new_momentum,
      )
      selected = guard.replace_if(
        accept, rejected, count=optax.safe_increment(t), group=group, last_delay=t - s
      )
      return new_updates, selected._replace(momentum_buffer=new_momentum)

    return guard.guarded_update(updates, state, apply, grads_finite=grads_finite, version_ok=version_ok)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
