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

A chain holds at most one rule that counts server versions (its *version owner*,
``release.VERSION_OWNERS``); :func:`server_version` refuses a state with two, and
:func:`jaxsync.on_release` refuses them at ``init``. The inner optimizer of
``on_release`` is a scope of its own: it sees each release as one fresh gradient.
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from jaxsync._src.rules import release
from jaxsync._src.rules.look_ahead import look_ahead


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
  r"""The server version of an optimizer state: what to send with the parameters, to get back as ``version``.

  A server rule measures staleness against a version it counts itself. A
  runtime (or your own asynchronous loop) sends the current version with the
  parameters and passes it back as the ``version`` extra arg of ``update`` when
  the gradient computed on them arrives. This function finds that counter in
  a single rule's state or in a chained or wrapped one: the ``count`` of the
  chain's one version-counting rule (:func:`ordered_momentum`, :func:`smega2`:
  arrivals applied; :func:`adaptive_k`, :func:`scale_by_staleness`: updates
  released), not Adam's ``count`` or the counters of the inner optimizer of
  :func:`on_release`. A single-process loop needs none of this: without
  ``version`` every gradient is fresh. The staleness of an arrival computed on
  version ``s``, with ``S`` the version now:

  .. math::

    \tau = S - s \ge 0

  Args:
    state: an optimizer state, possibly chained or wrapped.

  Returns:
    The version (int32 scalar), or None when no jaxsync server rule is in the state.

  Raises:
    ValueError: when the state holds two rules that count versions (e.g.
      ``optax.chain(jaxsync.adaptive_k(), jaxsync.ordered_momentum(...))``):
      a chain has one version; the message says what to use instead.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> tx = jaxsync.on_release(jaxsync.adaptive_k(momentum=0.0, max_k=2), optax.adam(0.1))
    >>> state = tx.init(jnp.zeros(2))
    >>> for g in ([1.0, -1.0], [3.0, -3.0]):
    ...   _, state = tx.update(jnp.array(g), state, jnp.zeros(2), version=jaxsync.server_version(state))
    >>> int(jaxsync.server_version(state))
    1

  References:
    The version convention of Shi, Yang, Li, "Ordered Momentum for Asynchronous SGD",
    NeurIPS 2024, Algorithm 1, Option II.
  """
  owners = release.check_one_version_owner("server_version: the state", state)
  return owners[0].count if owners else None


def init_server_rule(rule: Any, params: Any, worker_rule: Any = None) -> Any:
  """``rule.init(params)``, refused at once (``ValueError``) if the rule chains two version-counting rules,
  or if ``params`` carry a model's state and the rules do not keep it apart.

  What every runtime calls to start a server rule, so that a chain with two
  versions fails before the first arrival, not after a run (see
  :func:`server_version`). ``worker_rule`` is the strategy's (checked too).
  """
  state = rule.init(params)
  server_version(state)
  _check_model_state_kept(params, rule, state, worker_rule)
  return state


def _check_model_state_kept(params: Any, rule: Any, state: Any, worker_rule: Any) -> None:
  """A model carried with its state needs rules that keep it (else momentum and decay would act on it)."""
  from jaxsync._src.core import variables
  from jaxsync._src.rules.elastic import ElasticCenterState
  from jaxsync._src.rules.model_state import keeps_model_state

  if not variables.carries_state(params):
    return
  # The elastic centre rule takes workers' models, not gradients: it averages their states as it is.
  elastic = isinstance(state, ElasticCenterState)
  bare = [] if keeps_model_state(rule) or elastic else ["server rule"]
  if worker_rule is not None and not keeps_model_state(worker_rule):
    bare.append("worker rule")
  if bare:
    raise ValueError(
      f"init_server_rule: the parameters carry model state ({{'params', 'model_state'}}: BatchNorm "
      f"statistics) but the strategy's {' and '.join(bare)} do not keep it apart; expected the strategy "
      "of jaxsync.strategies.with_model_state(strategy), whose rules see the parameters alone."
    )
