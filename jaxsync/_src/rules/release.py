"""Gating a stateful optimizer on the releases of a buffering rule (design.md, "Release signal"); which
rule of a chain owns the server version.

A server version is counted by exactly one rule of a chain, its *version owner*
(:data:`VERSION_OWNERS`); :func:`on_release` is where a new scope begins: its inner
optimizer sees each release as one fresh gradient and may hold an owner of its own,
which counts releases and is never the server's version.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxsync._src.rules.adaptive_k import AdaptiveKState
from jaxsync._src.rules.ordered_momentum import OrderedMomentumState
from jaxsync._src.rules.smega2 import Smega2State
from jaxsync._src.rules.staleness import ScaleByStalenessState

# The rules whose ``count`` is a server version (optax's own states have a ``count`` too), by state.
VERSION_OWNERS = {
  OrderedMomentumState: "ordered_momentum",
  Smega2State: "smega2",
  AdaptiveKState: "adaptive_k",
  ScaleByStalenessState: "scale_by_staleness",
}


class OnReleaseState(NamedTuple):
  """State of :func:`on_release`.

  Whether the last arrival released an aggregate is the buffer's ``released``
  field (one field of that name in the whole state, so the runtimes read
  every rule the same way, with ``contracts.released``).

  Attributes:
    buffer: the buffering rule's state (it holds ``released`` and the server version).
    inner: the inner optimizer's state; it only changes on releases.
  """

  buffer: Any
  inner: Any


def version_owners(state: Any) -> list[Any]:
  """The states in ``state`` that count its server version (:data:`VERSION_OWNERS`).

  Searched through chains and wrappers (any pytree: ``optax.chain`` tuples,
  ``optax.inject_hyperparams``, ``optax.MultiSteps``...) and into the buffer of
  :func:`on_release`, never into its inner optimizer, whose counters count releases.
  A structural search: it reads the state's types, never its values (safe under ``jit``).
  """
  owner_types = tuple(VERSION_OWNERS)
  found = []
  nodes = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, (OnReleaseState, *owner_types)))
  for node in nodes:
    if isinstance(node, OnReleaseState):
      found += version_owners(node.buffer)
    elif isinstance(node, owner_types):
      found.append(node)
  return found


def check_one_version_owner(where: str, state: Any) -> list[Any]:
  """``version_owners(state)``, refusing more than one with a one-line ``ValueError`` that says what to do."""
  owners = version_owners(state)
  if len(owners) > 1:
    names = ", ".join(VERSION_OWNERS[type(owner)] for owner in owners)
    raise ValueError(
      f"{where} holds {len(owners)} rules that count server versions ({names}); a chain may hold one, "
      "as it has one version (a second rule would count the first's outputs, idle zeros included, as "
      "arrivals of its own): keep one, follow a buffering rule with a stateless learning rate "
      "(optax.chain(jaxsync.adaptive_k(momentum=0.9), optax.scale_by_learning_rate(lr))), or wrap the "
      "second as jaxsync.on_release(buffer, inner), whose inner sees each release as one fresh gradient."
    )
  return owners


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
  r"""Runs an optimizer only on the updates that a buffering rule releases.

  A buffering rule (:func:`adaptive_k`, or :func:`scale_by_staleness` with
  ``gradients_per_update > 1``) collects several arriving gradients and releases
  one combined direction; on the other arrivals it emits zeros. Use
  ``on_release`` to put a stateful optimizer after it (Adam, SGD with momentum,
  a learning-rate schedule, or a jaxsync rule such as :func:`ordered_momentum`):
  the optimizer then steps once per release, as ``optax.MultiSteps`` steps once
  per accumulated batch. Chained directly after the buffer instead, it would
  also step on every idle arrival (Adam would decay its moments, a schedule
  would advance).

  .. math::

    (a, b') = \text{buffer}(g, b); \qquad
    (u, i') = \begin{cases} \text{inner}(a, i) & \text{released}(b') \\
                            (0, i) & \text{otherwise} \end{cases}

  The inner optimizer runs under ``lax.cond``: idle arrivals cost nothing of it.

  Versions: the buffer owns the server version. :func:`server_version` reads
  the buffer's, and the ``version`` extra arg goes to the buffer only; every
  other extra arg goes to both. The inner sees each release as one fresh
  gradient (staleness 0), computed on the version the buffer just completed; a
  version-aware inner counts releases with its own counter. So
  ``on_release(adaptive_k(momentum=0.0), ordered_momentum(lr, beta, num_workers=1))``
  is heavy-ball momentum on the released means, the same as
  ``on_release(adaptive_k(momentum=0.0), optax.sgd(lr, beta))``. Each of the
  buffer and the inner may hold at most one rule that counts versions
  (:func:`adaptive_k`, :func:`scale_by_staleness`, :func:`ordered_momentum`,
  :func:`smega2`); ``init`` refuses more, with a ``ValueError``.

  Args:
    buffer: a transform whose state has a ``released`` bool field.
    inner: any optax transform (e.g. ``optax.adam(1e-3)``); it sees the
      released aggregates only, as if they were ordinary fresh gradients.

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
    Zhang, Ji, Wang, "Momentum-driven adaptive synchronization model for distributed DNN
    training on HPC clusters", JPDC 2022, §4.2, which only steps on releases.
  """
  buffer = optax.with_extra_args_support(buffer)
  inner = optax.with_extra_args_support(inner)

  def init_fn(params: optax.Params) -> OnReleaseState:
    buffer_state = buffer.init(params)
    released_flag(buffer_state)  # fail early if buffer cannot release
    inner_state = inner.init(params)
    check_one_version_owner("on_release: buffer", buffer_state)
    check_one_version_owner("on_release: inner", inner_state)
    return OnReleaseState(buffer_state, inner_state)

  def update_fn(
    updates: optax.Updates,
    state: OnReleaseState,
    params: optax.Params | None = None,
    **extra_args: Any,
  ) -> tuple[optax.Updates, OnReleaseState]:
    aggregate, buffer_state = buffer.update(updates, state.buffer, params, **extra_args)
    released = released_flag(buffer_state)
    # A release is one fresh gradient to the inner: its version is its own count (staleness 0).
    inner_args = {name: value for name, value in extra_args.items() if name != "version"}

    def step():
      out, inner_state = inner.update(aggregate, state.inner, params, **inner_args)
      # The inner's state keeps the dtypes it was built with (optax's own take the gradients' where they
      # differ from the parameters'), so both branches agree and a jitted loop compiles once.
      return out, optax.tree.cast_like(inner_state, state.inner)

    # The inner's updates may be wider than the release (Adam's on float32 moments): idle zeros of that dtype.
    out_types = jax.eval_shape(step)[0]

    def idle():
      return jax.tree.map(lambda a, t: jnp.zeros_like(a, dtype=t.dtype), aggregate, out_types), state.inner

    out, inner_state = lax.cond(released, step, idle)
    return out, OnReleaseState(buffer_state, inner_state)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
