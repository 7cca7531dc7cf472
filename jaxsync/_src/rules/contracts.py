"""What a runtime reads from a rule's state: the contract between the rules and the runtimes, in one place.

A runtime never reads a rule's state fields by name; it asks these functions,
as optax's own wrappers answer such questions (``MultiSteps.has_updated``).
Each works on a single rule's state or on a chained / wrapped one
(``optax.chain``, :func:`jaxsync.on_release`), and answers ``None`` where the
rule does not say (then the runtime's default applies: every accepted arrival
is an update, of one gradient, with no noise ratio or step size).

====================  =====================================================  ==========================================
question              rules that answer                                      default without one
====================  =====================================================  ==========================================
:func:`released`      ``adaptive_k``, ``scale_by_staleness``, ``on_release``  every accepted arrival releases
:func:`gradients_in`  ``adaptive_k`` (its ``k``)                              the arrivals since the last release
:func:`noise_ratio`   ``adaptive_k`` (for BB workers)                         none is sent
:func:`step_size`     ``bb_step_size`` (a worker's learning rate)             NaN is recorded
:func:`exchanged`     ``easgd_worker`` (an elastic exchange happened)         —
:func:`reply_params`  ``smega2`` (look-ahead reply), EAMSGD's worker          the parameters themselves
:func:`server_version` ``ordered_momentum``, ``smega2``, ``adaptive_k``,     None (the runtime counts updates)
                      ``scale_by_staleness`` (their ``count``)
====================  =====================================================  ==========================================
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from jaxsync._src.rules.adaptive_k import AdaptiveKState
from jaxsync._src.rules.look_ahead import look_ahead
from jaxsync._src.rules.ordered_momentum import OrderedMomentumState
from jaxsync._src.rules.smega2 import Smega2State
from jaxsync._src.rules.staleness import ScaleByStalenessState

# The server rules whose ``count`` is the server version (optax's own states have a ``count`` too).
_VERSIONED = tuple(
  cls.__name__ for cls in (OrderedMomentumState, Smega2State, AdaptiveKState, ScaleByStalenessState)
)


def released(state: Any) -> jax.Array | None:
  """Whether the last arrival released an update (bool scalar), for a rule that buffers; else None."""
  return optax.tree.get(state, "released", None)


def gradients_in(state: Any) -> jax.Array | None:
  """How many fresh gradients the last release averaged (adaptive-k's ``k``), or None."""
  return optax.tree.get(state, "last_k", None)


def noise_ratio(state: Any) -> jax.Array | None:
  """The noise-to-signal ratio of the last release, which the server sends to BB workers; or None."""
  return optax.tree.get(state, "noise_ratio", None)


def step_size(state: Any) -> jax.Array | None:
  """A worker rule's adaptive learning rate (BB), or None for a fixed one."""
  return optax.tree.get(state, "step_size", None)


def exchanged(state: Any) -> jax.Array | None:
  """Whether an elastic worker's last step made an exchange with the centre, or None."""
  return optax.tree.get(state, "exchanged", None)


def reply_params(params: optax.Params, state: Any) -> optax.Params:
  """Where the next gradient is taken: SMEGA²'s look-ahead reply, EAMSGD's ``x + delta v``, else ``params``."""
  return look_ahead(params, state)


def server_version(state: Any) -> jax.Array | None:
  r"""The server version a jaxsync server rule's state is at (its ``count``), searched through chains.

  The version is what the server sends with its parameters and what the
  rule's ``version`` extra arg expects back: arrivals applied for OrMo and
  SMEGA², updates released for adaptive-k and ``scale_by_staleness``. In a
  chain or wrapper (``optax.chain``, :func:`on_release`) other states have a
  ``count`` of their own (Adam's); this finds the server rule's.

  Args:
    state: a server rule's state, possibly chained or wrapped.

  Returns:
    The version (int32 scalar), or None when no jaxsync server rule is in the state.

  Raises:
    KeyError: when the state holds more than one jaxsync server rule.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> tx = jaxsync.on_release(jaxsync.adaptive_k(momentum=0.0, max_k=2), optax.adam(0.1))
    >>> state = tx.init(jnp.zeros(2))
    >>> for g in ([1.0, -1.0], [3.0, -3.0]):
    ...   _, state = tx.update(jnp.array(g), state, jnp.zeros(2), version=jaxsync.server_version(state))
    >>> int(jaxsync.server_version(state))
    1

  References:
    The version convention of the OrMo paper (Shi, Yang, Li, NeurIPS 2024, Alg. 1, Option II).
  """
  return optax.tree.get(state, "count", None, filtering=lambda path, _: path[-1].tuple_name in _VERSIONED)
