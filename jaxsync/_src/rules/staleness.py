"""Staleness-aware learning rates and n-softsync aggregation (the Algorithms page, section 10)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxsync._src.core import validation
from jaxsync._src.rules import guard

_RULE = "scale_by_staleness"
MODES = ("linear", "exponential", "none")


class ScaleByStalenessState(NamedTuple):
  """State of :func:`scale_by_staleness`.

  Attributes:
    count: the number of updates released; the server version.
    accumulated: ``sum_l s(tau_l) g_l`` over the gradients since the last
      release, meaningful while ``accumulated_count > 0`` (reset lazily);
      ``()`` when every arrival releases (``gradients_per_update=1``).
    accumulated_count: how many gradients ``accumulated`` holds.
    released: whether the last arrival released an update.
    last_staleness: ``tau`` of the last accepted arrival.
    nonfinite_count: arrivals rejected for a NaN or Inf gradient.
    invalid_version_count: arrivals rejected for a version newer than ``count``
      or negative.
  """

  count: jax.Array
  accumulated: optax.Updates
  accumulated_count: jax.Array
  released: jax.Array
  last_staleness: jax.Array
  nonfinite_count: jax.Array
  invalid_version_count: jax.Array


def scale_by_staleness(
  mode: str = "linear",
  *,
  penalty: float | None = None,
  gradients_per_update: int | None = None,
  accumulator_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Staleness-aware SGD: scales each arriving gradient down by how stale it is; optionally averages several.

  A gradient computed ``tau`` server updates ago points where the parameters
  used to be; this rule trusts it less, dividing its step by ``tau`` (or by
  ``exp(kappa tau)``). With ``gradients_per_update = c > 1`` it also averages
  ``c`` arrivals per update (n-softsync). Use it as the server rule of
  asynchronous SGD when staleness is large or uneven and you want a simple,
  momentum-free remedy. It is a *direction* rule: chain a learning rate after
  it. In a single process (no ``version`` passed) every gradient is fresh,
  ``tau = 0``, and the factor is 1.

  With ``tau = count - version``, the factor is

  .. math::

    s(\tau) = \begin{cases} 1/\max(\tau, 1) & \text{linear (Zhang et al. 2016)} \\
                            e^{-\kappa \tau} & \text{exponential (Chan \& Lane 2014)} \\
                            1 & \text{none (plain aggregation: K-async, InHAD)}
              \end{cases}

  and the update, with ``c`` gradients per update, is

  .. math::

    w \leftarrow w - \alpha_0 \frac1c \sum_{l=1}^{c} s(\tau_l)\, g_l

  ``c = 1`` is staleness-aware ASGD (every arrival releases). On arrivals that
  release nothing it emits exact zeros: put a stateful optimizer after it with
  :func:`on_release`. The learning rate ``alpha_0`` is not applied here: chain
  ``optax.scale_by_learning_rate(alpha_0)``.

  Reading chosen: Chan & Lane (2014) do not give the exponential form's
  constant ``kappa``, so it has no default and must be given as ``penalty``
  (the Algorithms page of the jaxsync documentation, section '10.
  Staleness-aware learning rates').

  Extra args of ``update``: ``version`` (int32 scalar, optional: the number of
  updates the server had released when it sent the parameters; omitted, the
  gradient is fresh). Unknown extra args are ignored. NaN/Inf gradients and
  versions newer than ``count`` are rejected and counted in the state;
  ``grads_finite`` (bool scalar) replaces the NaN/Inf scan when the caller
  already knows.

  Args:
    mode: ``"linear"``, ``"exponential"`` or ``"none"`` (no scaling: the
      rule only averages ``c`` arrivals, as K-async SGD and InHAD's pull do).
    penalty: ``kappa > 0`` for ``mode="exponential"``; must be ``None`` for
      the other modes.
    gradients_per_update: ``c >= 1``, the gradients averaged per update (``None``: 1). It shapes the
      state, so under ``optax.inject_hyperparams`` a number given here goes in ``static_args``.
    accumulator_dtype: the dtype of the state's parameter-sized buffers (optax's name for it); ``None``
      (default): at least float32, the parameters' dtype where wider, so bfloat16 parameters keep float32
      statistics. Updates keep the gradients' dtype either way.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is a
    :class:`ScaleByStalenessState`.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> tx = optax.chain(jaxsync.scale_by_staleness("linear"), optax.scale_by_learning_rate(0.1))
    >>> params = jnp.zeros(2); state = tx.init(params)
    >>> for _ in range(4):  # four fresh arrivals: the server is at version 4
    ...   u, state = tx.update(jnp.ones(2), state, params)
    >>> u, state = tx.update(jnp.ones(2), state, params, version=0)  # tau = 4
    >>> u
    Array([-0.025, -0.025], dtype=float32)

  References:
    Zhang, Gupta, Lian, Liu, "Staleness-aware Async-SGD for Distributed Deep
    Learning", IJCAI 2016; Chan, Lane, "Distributed asynchronous optimization of
    convolutional neural networks", Interspeech 2014.
  """
  mode = validation.check_choice(_RULE, "mode", mode, MODES)
  if mode == "exponential":
    if penalty is None:
      raise validation.invalid(
        _RULE, "penalty", penalty, "a finite number > 0 (kappa) with mode='exponential'"
      )
    penalty = validation.check_real(_RULE, "penalty", penalty, low=0.0, low_open=True, array_ok=True)
  elif penalty is not None:
    raise validation.invalid(_RULE, "penalty", penalty, f"None with mode={mode!r}")
  # None (1) by default, not 1: optax.inject_hyperparams injects every numeric default as an array.
  per_update = 1 if gradients_per_update is None else gradients_per_update
  per_update = validation.check_static_int(_RULE, "gradients_per_update", per_update, low=1)

  def factor(tau: jax.Array) -> jax.Array:
    tau_f = tau.astype(jnp.float32)
    if mode == "linear":
      return 1.0 / jnp.maximum(tau_f, 1.0)
    if mode == "none":
      return jnp.ones_like(tau_f)
    return jnp.exp(-penalty * tau_f)

  acc_dtype = validation.check_state_dtype(_RULE, accumulator_dtype)

  def init_fn(params: optax.Params) -> ScaleByStalenessState:
    return ScaleByStalenessState(
      count=jnp.zeros([], jnp.int32),
      accumulated=guard.state_zeros(params, acc_dtype) if per_update > 1 else (),
      accumulated_count=jnp.zeros([], jnp.int32),
      released=jnp.asarray(False),
      last_staleness=jnp.zeros([], jnp.int32),
      nonfinite_count=jnp.zeros([], jnp.int32),
      invalid_version_count=jnp.zeros([], jnp.int32),
    )

  def update_fn(
    updates: optax.Updates,
    state: ScaleByStalenessState,
    params: optax.Params | None = None,
    *,
    grads_finite: Any = None,
    version: Any = None,
    **extra_args: Any,
  ) -> tuple[optax.Updates, ScaleByStalenessState]:
    del params, extra_args
    s, version_ok = guard.arrival_version(version, state.count)
    tau = state.count - s

    def apply(accept, rejected):
      scale = factor(tau)
      if per_update == 1:
        # Every arrival releases: no buffer, the update is the scaled gradient.
        out = guard.tree_scaled(updates, scale)
        return out, guard.replace_if(
          accept,
          rejected,
          count=optax.safe_increment(state.count),
          released=jnp.asarray(True),
          last_staleness=tau,
        )
      count = state.accumulated_count + 1
      release = count >= per_update
      first = state.accumulated_count == 0  # the buffer is reset lazily

      def accumulate(acc, g):
        weighted = (scale * g).astype(acc.dtype)
        return jnp.where(accept, jnp.where(first, weighted, acc + weighted), acc)

      summed = lax.optimization_barrier(jax.tree.map(accumulate, state.accumulated, updates))
      out = jax.tree.map(
        lambda g, acc: jnp.where(release, acc / per_update, jnp.zeros_like(acc)).astype(g.dtype),
        updates,
        summed,
      )
      selected = guard.replace_if(
        accept,
        rejected,
        count=jnp.where(release, optax.safe_increment(state.count), state.count),
        accumulated_count=jnp.where(release, 0, count),
        released=release,
        last_staleness=tau,
      )
      return out, selected._replace(accumulated=summed)

    return guard.guarded_update(
      updates,
      state,
      apply,
      grads_finite=grads_finite,
      version_ok=version_ok,
      rejected_state=state._replace(released=jnp.asarray(False)),
    )

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
