"""DC-ASGD: asynchronous SGD whose server compensates a stale gradient to first order (the Algorithms page, section 19)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxsync._src.core import validation
from jaxsync._src.rules import guard

_RULE = "dc_asgd"


# lambda_0 of the DC-ASGD paper's CIFAR-10 experiments (Zheng et al., ICML 2017): DC-ASGD-c and DC-ASGD-a.
CONSTANT_VARIANCE_CONTROL = 0.04
ADAPTIVE_VARIANCE_CONTROL = 2.0


class DelayCompensationState(NamedTuple):
  """State of :func:`dc_asgd`.

  Attributes:
    count: arrivals applied.
    backups: ``w_bak(m)`` for each worker ``m``, stacked ``[K, ...]``: the
      parameters the server last sent worker ``m`` (after its last arrival).
    mean_square: ``MeanSquare(m)``, each worker's running mean of
      ``g (.) g``, stacked ``[K, ...]`` (adaptive variant), or ``()``.
    nonfinite_count: arrivals rejected for a NaN or Inf gradient.
    invalid_worker_count: arrivals rejected because their ``worker`` was not in
      ``0 .. K-1``.
  """

  count: jax.Array
  backups: Any
  mean_square: Any
  nonfinite_count: jax.Array
  invalid_worker_count: jax.Array


def dc_asgd(
  learning_rate: optax.ScalarOrSchedule,
  variance_control: float | None = None,
  *,
  num_workers: int,
  adaptive: bool = False,
  mean_square_decay: float = 0.95,
  eps: float = 1e-7,
  accumulator_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  r"""DC-ASGD: the server corrects each stale gradient to first order in how far the parameters moved.

  A gradient that reaches an asynchronous server was computed on parameters
  ``w_bak`` that the server has since moved to ``w``. DC-ASGD estimates the
  gradient at ``w`` by a Taylor step, with the Hessian replaced by the cheap
  outer-product approximation ``lambda g (.) g`` (its diagonal). Use it as the
  server rule of asynchronous SGD when gradients are stale; with one worker
  (or any fresh gradient) it is plain SGD. The server keeps the parameters it
  last sent each worker, ``K`` parameter-sized backups: memory that grows with
  the workers.

  Arrival of worker ``m``'s gradient ``g``, the server at ``w``:

  .. math::

    &\text{DC-ASGD-c: } \lambda_t = \lambda_0, \qquad
      \text{DC-ASGD-a: } \mathrm{MS}(m) \leftarrow \mu\,\mathrm{MS}(m) + (1 - \mu)\, g \odot g,\quad
      \lambda_t = \lambda_0 / \sqrt{\mathrm{MS}(m) + \epsilon} \\
    &w \leftarrow w - \eta_t \big(g + \lambda_t\, g \odot g \odot (w - w_{bak}(m))\big), \qquad
      w_{bak}(m) \leftarrow w

  (``w_bak(m)`` takes the new parameters: the server sends them to ``m`` at
  once, the dispatch of asynchronous SGD). The adaptive variant's ``lambda_t``
  is element-wise, and its running mean square is kept per worker, updated
  with the arriving gradient before it is used, with ``eps`` inside the
  square root: the authors' code (their Multiverso updaters), whose paper
  writes one ``MeanSquare(t)``. The Algorithms page of the jaxsync
  documentation, section '19. DC-ASGD', gives the readings.

  This is a *final-update* rule (learning rate inside): add its output with
  ``optax.apply_updates``.

  Extra args of ``update``: ``worker`` (int32 scalar, the arriving worker;
  omitted, worker 0, the single worker of an ordinary loop). Unknown extra
  args are ignored. A NaN/Inf gradient is rejected (zeros out, counted in
  ``nonfinite_count``); a ``worker`` outside ``0 .. K-1`` is rejected and
  counted in ``invalid_worker_count``. A rejected arrival still records the
  current parameters as the worker's backup, because the server replies to it
  with them. ``grads_finite`` (bool scalar) replaces the NaN/Inf scan.

  Args:
    learning_rate: ``eta``, a positive number or a schedule of ``count``.
    variance_control: ``lambda_0 >= 0``; 0 is plain asynchronous SGD.
      ``None`` (the default) takes the paper's value for the variant: 0.04 for
      DC-ASGD-c, 2 for DC-ASGD-a (its CIFAR-10 experiments).
    num_workers: ``K``, the workers whose backups the server keeps.
    adaptive: ``True`` for DC-ASGD-a (``lambda_t`` scaled by the running
      mean square of the gradient).
    mean_square_decay: ``mu`` in ``[0, 1)``, DC-ASGD-a's running-mean decay
      (the paper: 0.95).
    eps: ``epsilon > 0`` inside DC-ASGD-a's square root.
    accumulator_dtype: the dtype of the state's parameter-sized buffers (optax's name for it); ``None``
      (default): at least float32, the parameters' dtype where wider, so bfloat16 parameters keep float32
      statistics. Updates keep the gradients' dtype either way.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is a
    :class:`DelayCompensationState`.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> tx = jaxsync.dc_asgd(0.5, 0.5, num_workers=2)
    >>> w = jnp.array([1.0]); state = tx.init(w)
    >>> u, state = tx.update(jnp.array([1.0]), state, w, worker=0)  # fresh: plain SGD
    >>> w = optax.apply_updates(w, u); w
    Array([0.5], dtype=float32)
    >>> # Worker 1 pulled w = 1 before that update: its gradient is compensated for the move since.
    >>> u, state = tx.update(jnp.array([2.0]), state, w, worker=1)
    >>> optax.apply_updates(w, u)  # 0.5 - 0.5 (2 + 0.5 * 2 * 2 * (0.5 - 1))
    Array([0.], dtype=float32)

  References:
    Zheng, Meng, Wang, Chen, Yu, Ma, Liu, "Asynchronous Stochastic Gradient
    Descent with Delay Compensation", ICML 2017, Algorithms 1-3.
  """
  learning_rate = validation.check_learning_rate(_RULE, learning_rate)
  num_workers = validation.check_static_int(_RULE, "num_workers", num_workers)
  adaptive = validation.check_bool(_RULE, "adaptive", adaptive)
  if variance_control is None:  # the paper's lambda_0 of each variant (ICML 2017, CIFAR-10)
    variance_control = ADAPTIVE_VARIANCE_CONTROL if adaptive else CONSTANT_VARIANCE_CONTROL
  lam = validation.check_real(_RULE, "variance_control", variance_control, low=0.0, array_ok=True)
  decay = validation.check_real(
    _RULE, "mean_square_decay", mean_square_decay, low=0.0, high=1.0, high_open=True, array_ok=True
  )
  eps = validation.check_real(_RULE, "eps", eps, low=0.0, low_open=True, array_ok=True)

  def per_worker(tree):
    return guard.stacked_like(tree, num_workers)

  acc_dtype = validation.check_state_dtype(_RULE, accumulator_dtype)

  def init_fn(params: optax.Params) -> DelayCompensationState:
    return DelayCompensationState(
      count=jnp.zeros([], jnp.int32),
      backups=per_worker(params),
      mean_square=per_worker(guard.state_zeros(params, acc_dtype)) if adaptive else (),
      nonfinite_count=jnp.zeros([], jnp.int32),
      invalid_worker_count=jnp.zeros([], jnp.int32),
    )

  def update_fn(
    updates: optax.Updates,
    state: DelayCompensationState,
    params: optax.Params | None = None,
    *,
    grads_finite: Any = None,
    worker: Any = None,
    **extra_args: Any,
  ) -> tuple[optax.Updates, DelayCompensationState]:
    del extra_args
    params = guard.require_extra_arg(_RULE, "params", params, "the server's current parameters w")
    m = jnp.zeros([], jnp.int32) if worker is None else jnp.asarray(worker, jnp.int32)
    worker_ok = (m >= 0) & (m < num_workers)
    row = jnp.clip(m, 0, num_workers - 1)

    def set_rows(stacked, rows):
      # One row written, its select on that row only. (XLA:CPU still copies the whole [K, ...] buffers
      # once per arrival when the update is zeroed for a rejected gradient after it: at 32 workers and
      # 85k parameters an arrival costs about 7x plain SGD's in the simulator.)
      return jax.tree.map(
        lambda b, r: b.at[row].set(jnp.where(worker_ok, r.astype(b.dtype), b[row])), stacked, rows
      )

    def apply(accept, rejected):
      rate = guard.learning_rate_at(learning_rate, state.count)
      if adaptive:
        # The sender's running mean square, updated with g before it is used (the authors' code).
        own = jax.tree.map(
          lambda ms, g: decay * ms[row] + (1.0 - decay) * jnp.square(g.astype(ms.dtype)),
          state.mean_square,
          updates,
        )
        lams = jax.tree.map(lambda o: lam / jnp.sqrt(o + eps), own)
        kept = jax.tree.map(lambda o, ms: jnp.where(accept, o, ms[row]), own, state.mean_square)
        mean_square = set_rows(state.mean_square, kept)
      else:
        mean_square = ()
        lams = jax.tree.map(lambda g: jnp.asarray(lam, guard.statistics_dtype(g.dtype)), updates)

      def step(g, w, b, lam_):
        g_ = g.astype(lam_.dtype)
        moved = w.astype(lam_.dtype) - b[row].astype(lam_.dtype)
        return (-rate * (g_ + lam_ * g_ * g_ * moved)).astype(g.dtype)

      out = jax.tree.map(step, updates, params, state.backups, lams)
      # The server replies with the new parameters, or its current ones to a rejected arrival.
      sent = jax.tree.map(lambda w, u: jnp.where(accept, w + u.astype(w.dtype), w), params, out)
      count = jnp.where(accept, optax.safe_increment(state.count), state.count)
      return out, rejected._replace(
        count=count, backups=set_rows(state.backups, sent), mean_square=mean_square
      )

    return guard.guarded_update(
      updates,
      state,
      apply,
      grads_finite=grads_finite,
      version_ok=worker_ok,
      version_field="invalid_worker_count",
    )

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
