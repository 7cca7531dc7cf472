"""Gating a stateful optimizer on the releases of a buffering rule (design.md, "Release signal")."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax
from jax import lax


class OnReleaseState(NamedTuple):
  """State of :func:`on_release`.

  Whether the last arrival released an aggregate is the buffer's ``released``
  field (one field of that name in the whole state, so the runtimes read
  every rule the same way, with ``contracts.released``).

  Attributes:
    buffer: the buffering rule's state (it holds ``released``).
    inner: the inner optimizer's state; it only changes on releases.
  """

  buffer: Any
  inner: Any


def released_flag(buffer_state: Any) -> jax.Array:
  """The ``released`` field of a buffering rule's state (searched through chains).

  Raises:
    ValueError: when the state has no ``released`` field (the rule buffers nothing).
  """
  flag = optax.tree.get(buffer_state, "released")
  if flag is None:
    raise ValueError(
      "on_release: buffer has no 'released' field in its state; expected a "
      "buffering rule such as jaxsync.adaptive_k or jaxsync.scale_by_staleness "
      "(or a chain containing one)."
    )
  return flag


def on_release(
  buffer: optax.GradientTransformation, inner: optax.GradientTransformation
) -> optax.GradientTransformationExtraArgs:
  r"""Applies ``inner`` only to the aggregates that a buffering rule releases.

  A buffering rule (:func:`adaptive_k`, :func:`scale_by_staleness` with
  ``gradients_per_update > 1``) emits exact zeros on arrivals that release
  nothing. A stateful optimizer chained after it would still step on those idle
  arrivals (Adam would decay its moments, a schedule would advance). This
  wrapper runs the inner optimizer only on releases, as ``optax.MultiSteps``
  does for gradient accumulation:

  .. math::

    (a, b') = \text{buffer}(g, b); \qquad
    (u, i') = \begin{cases} \text{inner}(a, i) & \text{released}(b') \\
                            (0, i) & \text{otherwise} \end{cases}

  The inner optimizer runs under ``lax.cond``: idle arrivals cost nothing of
  it. Extra args are passed to both.

  Args:
    buffer: a transform whose state has a ``released`` bool field.
    inner: any optax transform (e.g. ``optax.adam(1e-3)``); it sees the
      released aggregates only, as if they were ordinary gradients.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is an
    :class:`OnReleaseState`.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> tx = jaxsync.on_release(jaxsync.adaptive_k(momentum=0.0, max_k=2), optax.adam(0.1))
    >>> params = jnp.zeros(2)
    >>> state = tx.init(params)
    >>> u, state = tx.update(jnp.array([1.0, -1.0]), state, params, version=0)
    >>> int(state.inner[0].count)  # idle arrival: Adam did not step
    0
    >>> u, state = tx.update(jnp.array([3.0, -3.0]), state, params, version=0)
    >>> int(state.inner[0].count), bool(optax.tree.get(state, "released"))
    (1, True)

  References:
    The design of optax's ``MultiSteps`` (gradient accumulation); the progressive momentum of
    Zhang, Ji, Wang, JPDC 2022, §4.2, which only steps on releases.
  """
  buffer = optax.with_extra_args_support(buffer)
  inner = optax.with_extra_args_support(inner)

  def init_fn(params: optax.Params) -> OnReleaseState:
    buffer_state = buffer.init(params)
    released_flag(buffer_state)  # fail early if buffer cannot release
    return OnReleaseState(buffer_state, inner.init(params))

  def update_fn(
    updates: optax.Updates,
    state: OnReleaseState,
    params: optax.Params | None = None,
    **extra_args: Any,
  ) -> tuple[optax.Updates, OnReleaseState]:
    aggregate, buffer_state = buffer.update(updates, state.buffer, params, **extra_args)
    released = released_flag(buffer_state)

    def step():
      return inner.update(aggregate, state.inner, params, **extra_args)

    def idle():
      return optax.tree.zeros_like(aggregate), state.inner

    out, inner_state = lax.cond(released, step, idle)
    return out, OnReleaseState(buffer_state, inner_state)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
