"""SMEGA²: momentum estimation for asynchronous SGD with a look-ahead reply (Algorithms page, section 5)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxsync._src.core import validation
from jaxsync._src.core.deprecation import renamed_field
from jaxsync._src.rules import guard

_RULE = "smega2"
LOOK_AHEADS = ("advanced", "naive")


class Smega2State(NamedTuple):
  """State of :func:`smega2`.

  The parameters to send a worker are ``look_ahead(params)`` (also reachable as
  ``jaxsync.look_ahead(params, opt_state)``):
  ``w_hat = w - a v - b G``, with ``a`` and ``b`` kept here so that the reply
  needs no hyperparameters.

  Attributes:
    count: arrivals applied (indexes the learning-rate schedule).
    cycle_position: ``c`` in ``{0, .., N-1}``.
    momentum_buffer: ``v``, the single momentum buffer (gradient units, form B). (Formerly
      ``momentum``, still readable with a ``DeprecationWarning``.)
    accumulator: ``G``, the gradients of the current cycle (reset lazily: it
      holds stale values while ``cycle_position == 0``, where ``b = 0``).
    look_ahead_momentum_scale: ``a = eta beta (N - c + c beta)`` (advanced) or
      ``eta beta N`` (naive).
    look_ahead_accumulator_scale: ``b = eta beta c / N`` (advanced) or 0 (naive).
    nonfinite_count: arrivals rejected for a NaN or Inf gradient.
  """

  count: jax.Array
  cycle_position: jax.Array
  momentum_buffer: optax.Updates
  accumulator: optax.Updates
  look_ahead_momentum_scale: jax.Array
  look_ahead_accumulator_scale: jax.Array
  nonfinite_count: jax.Array

  momentum = renamed_field("momentum", "momentum_buffer")

  def look_ahead(self, params: optax.Params) -> optax.Params:
    """``w_hat = w - a v - b G``: where the replying worker computes its next gradient."""
    return jax.tree.map(
      lambda w, v, g: (
        w - (self.look_ahead_momentum_scale * v + self.look_ahead_accumulator_scale * g).astype(w.dtype)
      ),
      params,
      self.momentum_buffer,
      self.accumulator,
    )


def smega2(
  learning_rate: optax.ScalarOrSchedule,
  momentum: float = 0.9,
  *,
  num_workers: int,
  dampening: float = 0.0,
  look_ahead: str = "advanced",
  accumulator_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  r"""SMEGA²: asynchronous SGD with one shared momentum and a look-ahead reply to each worker.

  The server keeps a single momentum buffer, refreshed once per cycle of ``N``
  arrivals (``N`` workers) from the mean of the cycle's gradients, and every
  arrival steps along its gradient plus that momentum. Instead of the current
  parameters the sender gets back an estimate of where the parameters will be
  when its next gradient arrives, and computes that gradient there, which
  offsets the staleness. Use it as the server rule of asynchronous SGD with
  momentum when the workers can compute at a point the server chooses. With
  ``N = 1`` it is Nesterov SGD (Sutskever's form), so it also drops into an
  ordinary single-process loop; take the next gradient at
  ``jaxsync.look_ahead(params, state)`` to get Nesterov's look-ahead.

  For each arriving gradient ``g`` (from the authors' code):

  .. math::

    &c \leftarrow (c + 1) \bmod N, \qquad G \leftarrow G + g, \qquad
      d = g + \beta v \\
    &\text{if } c = 0:\; v \leftarrow \beta v + (1 - \text{dampening})\, G / N,
      \quad G \leftarrow 0 \\
    &w \leftarrow w - \eta\, d

  and the reply to the sender, where it computes its next gradient, is

  .. math::

    \hat w = w - \eta\beta\big[(N - c + c\beta)\, v + \tfrac{c}{N} G\big]
    \;\text{(advanced)}, \qquad \hat w = w - \eta\beta N v \;\text{(naive)}

  with ``eta`` the learning rate of the arrival just applied (under a
  schedule, as the authors' code, not the next arrival's). Get it with
  ``state.look_ahead(params)`` or ``jaxsync.look_ahead(params, opt_state)``.
  This is a *final-update* rule (learning rate inside). Weight decay as in the
  reference code (``g + lambda w`` with the server's ``w``) is plain optax:
  ``optax.chain(optax.add_decayed_weights(1e-4), jaxsync.smega2(...))``. The
  Algorithms page of the jaxsync documentation, section '5. SMEGA²', gives the
  checks it passes.

  No extra args are needed (it counts its own arrivals; a ``version`` is
  ignored); unknown ones are ignored. A NaN/Inf gradient is rejected (zeros
  out, state unchanged, counted); ``grads_finite`` (bool scalar) replaces the
  scan when the caller already knows.

  Args:
    learning_rate: ``eta``, a positive number or a schedule of ``count``.
    momentum: ``beta`` in ``[0, 1)``.
    num_workers: ``N``, the momentum cycle (the number of workers).
    dampening: in ``[0, 1)``, as in ``torch.optim.SGD``.
    look_ahead: ``"advanced"`` (default) or ``"naive"``.
    accumulator_dtype: the dtype of the state's parameter-sized buffers (optax's name for it); ``None``
      (default): at least float32, the parameters' dtype where wider, so bfloat16 parameters keep float32
      statistics. Updates keep the gradients' dtype either way.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is a
    :class:`Smega2State`.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> tx = jaxsync.smega2(0.1, 0.9, num_workers=1)
    >>> w = jnp.array([1.0]); state = tx.init(w)
    >>> u, state = tx.update(jnp.array([1.0]), state, w)
    >>> w = optax.apply_updates(w, u)
    >>> w, state.look_ahead(w)  # Nesterov: the next gradient is taken at w - eta beta v
    (Array([0.9], dtype=float32), Array([0.81], dtype=float32))

  References:
    Cohen, Hakimi, Schuster, "SMEGA2: Distributed Asynchronous Deep Neural
    Network Training With a Single Momentum Buffer", ICPP 2022; code
    ``rafi-cohen/SMEGA2``; Sutskever, Martens, Dahl, Hinton, "On the importance
    of initialization and momentum in deep learning", ICML 2013.
  """
  learning_rate = validation.check_learning_rate(_RULE, learning_rate)
  beta = validation.check_real(_RULE, "momentum", momentum, low=0.0, high=1.0, high_open=True, array_ok=True)
  n = validation.check_int(_RULE, "num_workers", num_workers, array_ok=True)
  dampening = validation.check_real(
    _RULE, "dampening", dampening, low=0.0, high=1.0, high_open=True, array_ok=True
  )
  look_ahead = validation.check_choice(_RULE, "look_ahead", look_ahead, LOOK_AHEADS)

  def scales(rate: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    if look_ahead == "naive":
      return rate * beta * n, jnp.zeros([], jnp.float32)
    c_f = c.astype(jnp.float32)
    return rate * beta * (n - c_f + c_f * beta), rate * beta * c_f / n

  acc_dtype = validation.check_state_dtype(_RULE, accumulator_dtype)

  def init_fn(params: optax.Params) -> Smega2State:
    a, b = scales(guard.learning_rate_at(learning_rate, jnp.zeros([], jnp.int32)), jnp.zeros([], jnp.int32))
    return Smega2State(
      count=jnp.zeros([], jnp.int32),
      cycle_position=jnp.zeros([], jnp.int32),
      momentum_buffer=guard.state_zeros(params, acc_dtype),
      accumulator=guard.state_zeros(params, acc_dtype),
      look_ahead_momentum_scale=a,
      look_ahead_accumulator_scale=b,
      nonfinite_count=jnp.zeros([], jnp.int32),
    )

  def update_fn(
    updates: optax.Updates,
    state: Smega2State,
    params: optax.Params | None = None,
    *,
    grads_finite: Any = None,
    **extra_args: Any,
  ) -> tuple[optax.Updates, Smega2State]:
    del params, extra_args

    def apply(accept, rejected):
      rate = guard.learning_rate_at(learning_rate, state.count)
      c = (state.cycle_position + 1) % n
      cycle_ends = c == 0
      cycle_starts = state.cycle_position == 0  # G is reset lazily: overwrite it

      def accumulate(g, acc):
        g_ = g.astype(acc.dtype)
        return jnp.where(accept, jnp.where(cycle_starts, g_, acc + g_), acc)

      accumulator = jax.tree.map(accumulate, updates, state.accumulator)

      def new_momentum(v, acc):
        renewed = beta * v + (1.0 - dampening) * acc.astype(v.dtype) / n
        return jnp.where(accept & cycle_ends, renewed.astype(v.dtype), v)

      momentum_ = jax.tree.map(new_momentum, state.momentum_buffer, accumulator)
      accumulator, momentum_ = lax.optimization_barrier((accumulator, momentum_))
      # d = g + beta v_old, written from the new v so that v_old has one reader
      # (then XLA updates v in place): at a cycle end beta v_old equals
      # v_new - (1 - dampening) G / N, otherwise v_new = v_old.
      from_v = jnp.where(cycle_ends, 1.0, beta)
      from_acc = jnp.where(cycle_ends, (1.0 - dampening) / n, 0.0)

      def step(g, v, acc):
        direction = g.astype(v.dtype) + from_v * v - from_acc * acc.astype(v.dtype)
        return (-rate * direction).astype(g.dtype)

      steps = jax.tree.map(step, updates, momentum_, accumulator)
      count = optax.safe_increment(state.count)
      # The reply's eta is this arrival's (the authors' code), not the next one's: under a schedule the
      # two differ by one step of it.
      a, b = scales(rate, c)
      selected = guard.replace_if(
        accept,
        rejected,
        count=count,
        cycle_position=c,
        look_ahead_momentum_scale=a,
        look_ahead_accumulator_scale=b,
      )
      return steps, selected._replace(momentum_buffer=momentum_, accumulator=accumulator)

    return guard.guarded_update(updates, state, apply, grads_finite=grads_finite)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
