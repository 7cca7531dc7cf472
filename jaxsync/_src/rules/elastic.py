"""Elastic averaging: the EASGD and EAMSGD workers, the locked and the lock-free centre (Algorithms page)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxsync._src.core import validation
from jaxsync._src.core.deprecation import renamed_field
from jaxsync._src.rules import guard


def elastic_difference(worker_params: optax.Params, center: optax.Params, moving_rate: Any) -> optax.Params:
  """``e = alpha (x - w_center)``: what one elastic exchange moves (worker -e, centre +e)."""
  return jax.tree.map(
    lambda x, c: (moving_rate * (x - c.astype(x.dtype))).astype(x.dtype), worker_params, center
  )


class EasgdWorkerState(NamedTuple):
  """State of :func:`easgd_worker`.

  Attributes:
    count: ``t^i``, the worker's local clock.
    velocity: ``v^i`` in parameter units (EAMSGD), or ``()`` when momentum is 0.
    look_ahead_scale: ``delta``, kept so that :meth:`look_ahead` needs no arguments. (Formerly
      ``momentum``, still readable with a ``DeprecationWarning``.)
    exchanged: whether the last update made an elastic exchange (then the
      runtime must apply the matching centre update).
    nonfinite_count: updates rejected for a NaN or Inf gradient.
  """

  count: jax.Array
  velocity: Any
  look_ahead_scale: jax.Array
  exchanged: jax.Array
  nonfinite_count: jax.Array

  momentum = renamed_field("momentum", "look_ahead_scale")

  def look_ahead(self, params: optax.Params) -> optax.Params:
    """``x + delta v``: where EAMSGD takes its gradient (``x`` itself for EASGD)."""
    if isinstance(self.velocity, tuple) and not self.velocity:
      return params
    return jax.tree.map(lambda x, v: x + (self.look_ahead_scale * v).astype(x.dtype), params, self.velocity)


def easgd_worker(
  learning_rate: optax.ScalarOrSchedule,
  *,
  moving_rate: float,
  period: int = 1,
  momentum: float = 0.0,
  weight_decay: float = 0.0,
  accumulator_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  r"""The EASGD / EAMSGD worker: local SGD (or Nesterov momentum) pulled towards a shared centre.

  In elastic averaging each worker trains its own copy ``x`` of the model and,
  every ``period`` steps, it and the centre (the model the server keeps) move
  towards each other by a fraction ``alpha`` of their difference. The workers
  may wander apart, which explores more, while the centre averages them. Use
  it when workers should communicate rarely (large ``period``) or when you
  want the exploration of many loosely coupled models; the centre is the
  model to evaluate. Pair it with :func:`easgd_center` (locked centre) or
  :func:`ea_wild_center` (lock-free centre) on the server.

  Worker ``i`` with local clock ``t^i`` (the asynchronous algorithm of Zhang
  et al. 2015), with ``alpha = eta rho`` the moving rate:

  .. math::

    &\text{if } \tau \mid t^i:\; e = \alpha (x - \tilde w), \quad x \leftarrow x - e
      \quad (\text{and the centre } \tilde w \leftarrow \tilde w + e) \\
    &\text{EASGD } (\delta = 0):\; x \leftarrow x - \eta\, g(x) \\
    &\text{EAMSGD } (\delta > 0):\; v \leftarrow \delta v - \eta\, g(x + \delta v),
      \quad x \leftarrow x + v

  with ``g`` taken at the pre-exchange ``x``. For EAMSGD the gradient point is
  ``x + delta v``: get it with ``state.look_ahead(x)`` or
  ``jaxsync.look_ahead(x, opt_state)``. The same worker rule serves EA-wild
  (``period=1``, ``center`` being the worker's possibly stale, lock-free read).
  The runtime applies the matching centre update with the same pre-exchange
  ``x`` when ``state.exchanged`` is set; the pair conserves ``x + w_center``.

  This is a *final-update* rule (learning rate inside). With ``moving_rate=0``
  it is plain SGD (``momentum=0``) or Nesterov SGD (Sutskever's form). The
  Algorithms page of the jaxsync documentation, section '12. EASGD and
  EAMSGD', gives the defaults and the checks.

  Extra args of ``update``: ``center`` (required: the centre parameters the
  worker read; there is no single-process default, the centre is another
  model). ``params`` (``x``) is required. Unknown extra args are ignored. A
  NaN/Inf gradient is rejected (zeros out, state unchanged, counted);
  ``grads_finite`` (bool scalar) replaces the scan when the caller knows.

  Args:
    learning_rate: ``eta``, a positive number or a schedule of the local clock.
    moving_rate: ``alpha = eta rho`` in ``[0, 1]``; the papers use
      ``beta / p`` with ``beta = 0.9`` for ``p`` workers.
    period: ``tau >= 1``, local steps between elastic exchanges.
    momentum: ``delta`` in ``[0, 1)``; 0 for EASGD, e.g. 0.99 for EAMSGD.
    weight_decay: ``lambda >= 0``, coupled L2 added to the gradient at the
      point it is taken, ``g + lambda (x + delta v)``: EAMSGD's look-ahead
      point, as the authors' code (``x`` itself for EASGD).
    accumulator_dtype: the dtype of the state's parameter-sized buffers (optax's name for it); ``None``
      (default): at least float32, the parameters' dtype where wider, so bfloat16 parameters keep float32
      statistics. Updates keep the gradients' dtype either way.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is an
    :class:`EasgdWorkerState`.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> tx = jaxsync.easgd_worker(0.1, moving_rate=0.5)
    >>> x = jnp.array([2.0]); state = tx.init(x)
    >>> u, state = tx.update(jnp.array([1.0]), state, x, center=jnp.array([0.0]))
    >>> optax.apply_updates(x, u)  # 2 - 0.5 * (2 - 0) - 0.1 * 1
    Array([0.9], dtype=float32)

  References:
    Zhang, Choromanska, LeCun, "Deep learning with Elastic Averaging SGD",
    NeurIPS 2015, Algorithms 1-2; code ``sixin-zh/mpiT``.
  """
  rule = "easgd_worker"
  learning_rate = validation.check_learning_rate(rule, learning_rate)
  alpha = validation.check_real(rule, "moving_rate", moving_rate, low=0.0, high=1.0, array_ok=True)
  period = validation.check_int(rule, "period", period, array_ok=True)
  delta = validation.check_real(rule, "momentum", momentum, low=0.0, high=1.0, high_open=True, array_ok=True)
  decay = validation.check_real(rule, "weight_decay", weight_decay, low=0.0, array_ok=True)
  # EASGD (momentum 0) keeps no velocity; an injected momentum (an array) may become non-zero: keep one.
  has_velocity = not isinstance(delta, float) or delta > 0

  acc_dtype = validation.check_state_dtype(rule, accumulator_dtype)

  def init_fn(params: optax.Params) -> EasgdWorkerState:
    return EasgdWorkerState(
      count=jnp.zeros([], jnp.int32),
      velocity=guard.state_zeros(params, acc_dtype) if has_velocity else (),
      look_ahead_scale=jnp.asarray(delta, jnp.float32),
      exchanged=jnp.asarray(False),
      nonfinite_count=jnp.zeros([], jnp.int32),
    )

  def update_fn(
    updates: optax.Updates,
    state: EasgdWorkerState,
    params: optax.Params | None = None,
    *,
    grads_finite: Any = None,
    center: optax.Params | None = None,
    **extra_args: Any,
  ) -> tuple[optax.Updates, EasgdWorkerState]:
    del extra_args
    params = guard.require_extra_arg(rule, "params", params, "the worker's parameters x")
    center = guard.require_extra_arg(rule, "center", center, "the centre parameters the worker read")
    center = guard.masked_like(center, updates)

    grads = updates
    if not (isinstance(decay, float) and decay == 0.0):
      # Coupled L2 at the point the gradient was taken: x + delta v for EAMSGD (the authors' mpiT code).
      point = state.look_ahead(params)
      grads = jax.tree.map(lambda g, p: g + (decay * p).astype(g.dtype), updates, point)

    def apply(accept, rejected):
      rate = guard.learning_rate_at(learning_rate, state.count)
      exchange = state.count % period == 0
      # A select, not alpha * 0: the centre is not read off exchange steps.
      pull = jax.tree.map(
        lambda d: jnp.where(exchange, d, jnp.zeros_like(d)), elastic_difference(params, center, alpha)
      )
      if has_velocity:
        velocity = jax.tree.map(
          lambda v, g: (delta * v - rate * g.astype(v.dtype)).astype(v.dtype),
          state.velocity,
          grads,
        )
        local = jax.tree.map(lambda g, v: v.astype(g.dtype), grads, velocity)
      else:
        velocity = ()
        local = jax.tree.map(lambda g: (-rate * g).astype(g.dtype), grads)
      out = jax.tree.map(lambda step, e: (step - e).astype(step.dtype), local, pull)
      proposed = state._replace(
        count=optax.safe_increment(state.count), velocity=velocity, exchanged=exchange
      )
      return out, guard.keep_if(accept, proposed, rejected)

    return guard.guarded_update(
      updates,
      state,
      apply,
      grads_finite=grads_finite,
      rejected_state=state._replace(exchanged=jnp.asarray(False)),
    )

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


class ElasticCenterState(NamedTuple):
  """State of :func:`easgd_center` and :func:`ea_wild_center`.

  Attributes:
    count: elastic exchanges applied to the centre.
    nonfinite_count: exchanges rejected for a NaN or Inf worker model.
  """

  count: jax.Array
  nonfinite_count: jax.Array


def _elastic_center(rule: str, moving_rate: float, lock_free: bool) -> optax.GradientTransformationExtraArgs:
  alpha = validation.check_real(rule, "moving_rate", moving_rate, low=0.0, high=1.0, array_ok=True)

  def init_fn(params: optax.Params) -> ElasticCenterState:
    del params
    return ElasticCenterState(count=jnp.zeros([], jnp.int32), nonfinite_count=jnp.zeros([], jnp.int32))

  def update_fn(
    updates: optax.Updates,
    state: ElasticCenterState,
    params: optax.Params | None = None,
    *,
    grads_finite: Any = None,
    center_read: optax.Params | None = None,
    **extra_args: Any,
  ) -> tuple[optax.Updates, ElasticCenterState]:
    del extra_args
    if lock_free and center_read is not None:
      reference = guard.masked_like(center_read, updates)
    else:  # the locked centre, or a fresh read (center_read omitted): the current centre
      meaning = "the current centre parameters" + (
        " (or center_read=..., the worker's read)" if lock_free else ""
      )
      reference = guard.require_extra_arg(rule, "params", params, meaning)

    def apply(accept, rejected):
      proposed = state._replace(count=optax.safe_increment(state.count))
      return elastic_difference(updates, reference, alpha), guard.keep_if(accept, proposed, rejected)

    return guard.guarded_update(updates, state, apply, grads_finite=grads_finite)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def easgd_center(moving_rate: float) -> optax.GradientTransformationExtraArgs:
  r"""The EASGD centre (server) update for one elastic exchange with a worker, under a lock.

  The centre is the averaged model of elastic averaging: at each exchange it
  moves a fraction ``alpha`` of the way towards the worker that reports, while
  that worker (:func:`easgd_worker`) moves the same amount towards it. Use it
  as the server side of EASGD or EAMSGD. Its input "updates" are the worker's
  parameters ``x`` (pre-exchange), not a gradient; ``params`` is the current
  centre ``w_center``. The exchange is atomic (EASGD locks the centre), so the
  difference uses the current centre:

  .. math::

    e = \alpha (x - \tilde w), \qquad \tilde w \leftarrow \tilde w + e

  Paired with the worker's ``x <- x - e``, one exchange conserves
  ``x + w_center``. Synchronous EASGD, ``w_center <- w_center + alpha sum_i
  (x_i - w_center)`` with all old values, is the sum of these updates over the
  workers against one centre, i.e. :func:`ea_wild_center` with every
  ``center_read`` equal to the old centre.

  This is a *final-update* rule: add its output to the centre with
  ``optax.apply_updates``. ``params`` is required; unknown extra args are
  ignored. A NaN/Inf worker model is rejected (zeros out, counted);
  ``grads_finite`` (bool scalar) replaces the scan when the caller knows.

  Args:
    moving_rate: ``alpha = eta rho`` in ``[0, 1]``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is an
    :class:`ElasticCenterState`.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> tx = jaxsync.easgd_center(0.5)
    >>> center = jnp.array([0.0]); state = tx.init(center)
    >>> u, state = tx.update(jnp.array([2.0]), state, center)  # worker x = 2
    >>> optax.apply_updates(center, u)
    Array([1.], dtype=float32)

  References:
    Zhang, Choromanska, LeCun, "Deep learning with Elastic Averaging SGD",
    NeurIPS 2015.
  """
  return _elastic_center("easgd_center", moving_rate, lock_free=False)


def ea_wild_center(moving_rate: float) -> optax.GradientTransformationExtraArgs:
  r"""The EA-wild centre update: an elastic increment added to the centre without a lock.

  EA-wild is elastic averaging in which workers exchange with the centre at
  every step and nobody locks it: a worker reads the centre (perhaps while
  another worker writes it), computes its pull against that read, and the
  server adds the increment to whatever the centre is by then (Hogwild style,
  modelled as an atomic add). Use it as the server side of EA-wild, with
  :func:`easgd_worker` (``period=1``, ``center=`` the read) on the workers;
  it trades the lock's waiting for slightly inconsistent reads.

  .. math::

    e_j = \alpha (x_j - \tilde w_{read,j}), \qquad \tilde w \leftarrow \tilde w + e_j

  With sequential, conflict-free arrivals (``w_read`` = the current centre) it
  equals :func:`easgd_center`; with ``alpha = 0`` the centre stays constant
  (the Algorithms page of the jaxsync documentation, section '13. EA-wild').

  The input "updates" are the worker's parameters ``x``; the extra arg
  ``center_read`` is the centre the worker read (omitted: a fresh read, the
  current centre ``params``, which is :func:`easgd_center`). This is a
  *final-update* rule. Unknown extra args are ignored. A NaN/Inf worker model
  is rejected (zeros out, counted); ``grads_finite`` (bool scalar) replaces
  the scan when the caller knows.

  Args:
    moving_rate: ``alpha = eta rho`` in ``[0, 1]`` (``rho`` is not reported by
      the paper).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is an
    :class:`ElasticCenterState`.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> tx = jaxsync.ea_wild_center(0.5)
    >>> center = jnp.array([1.0]); state = tx.init(center)  # moved since the read
    >>> u, state = tx.update(jnp.array([2.0]), state, center, center_read=jnp.array([0.0]))
    >>> optax.apply_updates(center, u)  # 1 + 0.5 * (2 - 0)
    Array([2.], dtype=float32)

  References:
    Wongpanich, You, Demmel, "Rethinking the Value of Asynchronous Solvers for
    Distributed Deep Learning", HPCAsia 2020, Algorithm 1; Niu, Recht, Ré,
    Wright, "Hogwild!: A Lock-Free Approach to Parallelizing Stochastic
    Gradient Descent", NeurIPS 2011.
  """
  return _elastic_center("ea_wild_center", moving_rate, lock_free=True)
