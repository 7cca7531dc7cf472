"""Per-worker adaptive Barzilai-Borwein step sizes with Armijo backtracking (Algorithms page, 11c)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxsync._src.core import validation
from jaxsync._src.rules import guard

_RULE = "bb_step_size"
DEFAULT_MAX_SCALE = 2.0


def check_max_scale(rule: str, name: str, value: Any) -> float | None:
  """Validates a BB step-size bound: ``None`` (no bound) or a finite real number ``>= 1``."""
  if value is None:
    return None
  try:
    return validation.check_real(rule, name, value, low=1.0, array_ok=True)
  except ValueError:
    raise validation.invalid(
      rule, name, value, "None (no bound) or a finite real number in [1.0, inf)"
    ) from None


def armijo_backtracking(
  value_fn: Callable[[optax.Params], jax.Array],
  params: optax.Params,
  grads: optax.Updates,
  step_size: jax.Array | float,
  *,
  slope: float = 0.1,
  shrink: float = 0.5,
  max_backtracks: int = 20,
  value: jax.Array | None = None,
) -> jax.Array:
  r"""Shrinks a step size until the step decreases the loss enough (Armijo backtracking), inside ``jit``.

  Use it to make a proposed learning rate safe for one step: starting from
  ``step_size`` it halves the step (by ``shrink``) until the loss after the
  step is at least ``slope * alpha * |g|^2`` below the loss before it.
  :func:`bb_step_size` calls it when given a ``value_fn``. The condition is
  eq. 19 of Zhang, Ji, Wang (JPDC 2022):

  .. math::

    \text{while } L(\theta - \alpha g) > L(\theta) - c\,\alpha\,\|g\|^2:
    \quad \alpha \leftarrow \rho\,\alpha

  A non-finite trial loss counts as a failure. The loop is a
  ``lax.while_loop`` of at most ``max_backtracks`` shrinks; if the condition
  still fails then, the last (smallest) step is returned.

  Args:
    value_fn: ``params -> scalar loss`` on the worker's batch (``L_B``).
    params: ``theta``, the point of the step.
    grads: ``g``, the gradient at ``theta``.
    step_size: the first trial ``alpha`` (e.g. a BB step).
    slope: ``c`` in ``(0, 1)``; 0.1 as in SGDLibrary and ensmallen.
    shrink: ``rho`` in ``(0, 1)``; 0.5 as in SGDLibrary.
    max_backtracks: the most shrinks, an integer >= 0.
    value: ``L(theta)`` if already known (saves one evaluation).

  Returns:
    The accepted step size, a float32 scalar.

  Example:
    >>> import jax.numpy as jnp, jaxsync
    >>> loss = lambda x: 5.0 * jnp.sum(x**2)  # curvature 10
    >>> x = jnp.array([1.0])
    >>> float(jaxsync.armijo_backtracking(loss, x, 10.0 * x, 1.0))
    0.125

  References:
    Armijo, "Minimization of functions having Lipschitz continuous first partial
    derivatives", Pacific J. Math. 1966; Zhang, Ji, Wang, "Momentum-driven
    adaptive synchronization model for distributed DNN training on HPC
    clusters", JPDC 2022, eq. (19).
  """
  rule = "armijo_backtracking"
  slope = validation.check_real(
    rule, "slope", slope, low=0.0, high=1.0, low_open=True, high_open=True, array_ok=True
  )
  shrink = validation.check_real(
    rule, "shrink", shrink, low=0.0, high=1.0, low_open=True, high_open=True, array_ok=True
  )
  max_backtracks = validation.check_int(rule, "max_backtracks", max_backtracks, low=0, array_ok=True)

  base = jnp.asarray(value_fn(params) if value is None else value, jnp.float32)
  grad_sq = guard.tree_sq_norm(grads)

  def trial(alpha):
    moved = jax.tree.map(lambda p, g: p - (alpha * g).astype(p.dtype), params, grads)
    return jnp.asarray(value_fn(moved), jnp.float32)

  def fails(alpha, loss):
    return jnp.logical_not(loss <= base - slope * alpha * grad_sq)

  def cond(carry):
    alpha, loss, shrinks = carry
    return fails(alpha, loss) & (shrinks < max_backtracks)

  def body(carry):
    alpha, _, shrinks = carry
    alpha = alpha * shrink
    return alpha, trial(alpha), shrinks + 1

  alpha0 = jnp.asarray(step_size, jnp.float32)
  alpha, _, _ = lax.while_loop(cond, body, (alpha0, trial(alpha0), jnp.asarray(0)))
  return alpha


class BBStepSizeState(NamedTuple):
  """State of :func:`bb_step_size`, one per worker.

  Attributes:
    count: the number of accepted updates of this worker.
    step_size: ``alpha``, the step size of the last update (the per-worker
      learning rate the runtimes record).
    curvature: ``nu`` of the last update (NaN when no estimate was possible).
    accepted: whether the last BB proposal passed the safeguards.
    noise_ratio: ``r`` of the last update (``r_prev`` for the next).
    prev_params: ``theta_prev``.
    prev_grads: ``g_prev``.
    nonfinite_count: updates rejected for a NaN or Inf gradient.
    clipped_count: updates whose step was clipped to the ``max_scale`` bound
      (jaxsync's safeguard; always 0 with ``max_scale=None``).
  """

  count: jax.Array
  step_size: jax.Array
  curvature: jax.Array
  accepted: jax.Array
  noise_ratio: jax.Array
  prev_params: optax.Params
  prev_grads: optax.Updates
  nonfinite_count: jax.Array
  clipped_count: jax.Array


def bb_step_size(
  initial_step_size: float,
  *,
  smoothing: float,
  armijo_slope: float = 0.1,
  armijo_shrink: float = 0.5,
  max_backtracks: int = 10,
  max_scale: float | None = DEFAULT_MAX_SCALE,
  armijo: bool | None = None,
  server_momentum: float = 0.0,
  accumulator_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Per-worker adaptive learning rate (Barzilai-Borwein step size), worker side of adaptive-k.

  Each worker picks its own learning rate from the curvature it measures along
  its last move: a flat direction gets a larger step, a steep one a smaller
  step. The estimate is corrected for minibatch noise, smoothed over steps,
  kept within a factor of the starting rate, and optionally checked by Armijo
  backtracking. Use it on the workers of :func:`adaptive_k` (whose releases
  supply the noise ratio) to adapt each worker's rate instead of tuning one
  schedule; it returns ``alpha g``, the scaled gradient a worker sends. For a
  standalone optimizer chain ``optax.scale(-1.0)`` after it.

  With ``r`` the noise-to-signal ratio ``V_B / (|B| |g_B|^2)`` (from the
  server's adaptive-k statistics, :attr:`AdaptiveKState.noise_ratio`, or
  :func:`gradient_noise_ratio`), eqs. 21-26 of the JPDC 2022 paper after De et
  al. (2017):

  .. math::

    s &= \theta - \theta_{prev}, \qquad
    \hat g_{prev} = (1 - r_{prev})\, g_{prev} \\
    \nu &= \langle g - \hat g_{prev}, s\rangle / \langle s, s\rangle
       \qquad \text{(curvature, eqs. 22, 24, 25)} \\
    \hat\alpha &= (1 - \gamma)(1 - r) / \nu \qquad \text{(eq. 21; } \gamma = \texttt{server\_momentum}) \\
    \alpha &= (1 - \beta_s)\,\alpha_{prev} + \beta_s\,\hat\alpha \qquad \text{(smoothing, eq. 26)} \\
    \alpha &\leftarrow \operatorname{clip}(\alpha,\ \alpha_0 / c,\ c\,\alpha_0)
       \qquad \text{(jaxsync's bound; } c = \texttt{max\_scale})

  Safeguard: if ``nu <= 0``, ``nu`` or ``alpha_hat`` is not finite (e.g.
  ``s = 0``), or ``r >= 1``, the previous step is kept; the first update uses
  ``initial_step_size``. With ``smoothing = 1`` (the full batch) the noise
  ratio is ignored and the step is the deterministic ``1 / nu``: on
  ``f = (nu/2)|x|^2`` the second update lands on the minimum. With Armijo on
  (``armijo=True``, or by default whenever the update gets ``value_fn``), the
  step is then backtracked with :func:`armijo_backtracking` (eq. 19).

  jaxsync's additions, not the paper's. *The bound* ``[alpha_0 / c, c alpha_0]``
  (``max_scale=None`` removes it): with minibatch gradients ``g - g_hat_prev``
  is mostly noise, so ``nu`` is often tiny and ``alpha_hat`` huge, and in
  asynchronous training the move ``s`` grows with every worker's ``alpha``;
  unbounded, this feedback diverged in our runs (digits, 32 workers), and a
  bound of 2 trained while 10 collapsed. *Server momentum*: a gradient the
  server applies with heavy-ball momentum ``gamma`` moves the parameters
  ``alpha / (1 - gamma)`` in all, hence the factor ``1 - gamma`` in eq. 21,
  and the top of the bound is then ``alpha_0`` itself (BB may lower a worker's
  rate, not raise it). Reading chosen: the paper's equations are missing; they
  follow De et al. (2017) §4, and Armijo runs on the smoothed step. The
  Algorithms page of the jaxsync documentation, section '11c. Adaptive BB step
  size per worker', gives the measurements.

  Extra args of ``update``: ``noise_ratio`` (float scalar ``r``, default 0: no
  noise correction) and ``value_fn`` (callable, the batch loss Armijo
  evaluates). The update needs ``params`` (``theta``). Unknown extra args are
  ignored. A NaN/Inf gradient is rejected (zeros out, state unchanged,
  counted); ``grads_finite`` (bool scalar) replaces the scan when the caller
  knows.

  Args:
    initial_step_size: the first ``alpha`` (the LR column of the JPDC 2022 paper's
      Table 3) and the centre of the bound: a number or a schedule of this
      worker's steps (the bound then moves with it).
    smoothing: ``beta_s = |B| / N`` in ``(0, 1]``, the weight of a new estimate.
    armijo_slope: ``c`` of the Armijo condition (used with ``value_fn``).
    armijo_shrink: ``rho`` of the Armijo backtracking.
    max_backtracks: the most Armijo shrinks per update.
    max_scale: ``c >= 1``, bounds the BB step to ``[initial_step_size / c,
      c initial_step_size]`` (jaxsync's safeguard, see above); ``1`` keeps the
      step fixed (Armijo aside); ``None``: no bound, the paper's rule.
    armijo: backtrack each step with Armijo's condition on ``value_fn``;
      ``None`` (default) backtracks exactly when ``value_fn`` is given, so a
      runtime that always passes it must say ``False`` to turn it off.
    server_momentum: ``gamma`` of the heavy-ball momentum the server applies
      to what the workers send (adaptive-k's progressive momentum); the
      proposal of eq. (21) is scaled by ``1 - gamma`` and, when ``gamma > 0``,
      bounded above by ``initial_step_size`` (see above).
    accumulator_dtype: the dtype of the state's parameter-sized buffers (optax's name for it); ``None``
      (default): at least float32, the parameters' dtype where wider, so bfloat16 parameters keep float32
      statistics. Updates keep the gradients' dtype either way.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is a
    :class:`BBStepSizeState`.

  Example:
    >>> import jax, jax.numpy as jnp, optax, jaxsync
    >>> bb = jaxsync.bb_step_size(0.05, smoothing=1.0, max_scale=None)  # the paper's unbounded rule
    >>> tx = optax.chain(bb, optax.scale(-1.0))
    >>> grad = jax.grad(lambda x: 2.0 * jnp.sum(x**2))  # curvature 4
    >>> x = jnp.array([1.0, -2.0]); state = tx.init(x)
    >>> for _ in range(2):
    ...   u, state = tx.update(grad(x), state, x)
    ...   x = optax.apply_updates(x, u)
    >>> x, float(state[0].step_size)
    (Array([0., 0.], dtype=float32), 0.25)

  References:
    Barzilai, Borwein, "Two-point step size gradient methods", IMA J. Numer.
    Anal. 1988; De, Yadav, Jacobs, Goldstein, "Big Batch SGD: Automated
    Inference using Adaptive Batch Sizes", AISTATS 2017, §4; Zhang, Ji, Wang,
    "Momentum-driven adaptive synchronization model for distributed DNN
    training on HPC clusters", JPDC 2022, §4.3.
  """
  initial_step_size = validation.check_learning_rate(_RULE, initial_step_size, "initial_step_size")
  beta_s = validation.check_real(
    _RULE, "smoothing", smoothing, low=0.0, high=1.0, low_open=True, array_ok=True
  )
  # Validate the Armijo constants now, not at the first update.
  unit = dict(low=0.0, high=1.0, low_open=True, high_open=True, array_ok=True)
  validation.check_real(_RULE, "armijo_slope", armijo_slope, **unit)
  validation.check_real(_RULE, "armijo_shrink", armijo_shrink, **unit)
  validation.check_int(_RULE, "max_backtracks", max_backtracks, low=0, array_ok=True)
  server_momentum = validation.check_real(
    _RULE, "server_momentum", server_momentum, low=0.0, high=1.0, high_open=True, array_ok=True
  )
  max_scale = check_max_scale(_RULE, "max_scale", max_scale)
  if armijo is not None:
    armijo = validation.check_bool(_RULE, "armijo", armijo)

  acc_dtype = validation.check_state_dtype(_RULE, accumulator_dtype)

  def init_fn(params: optax.Params) -> BBStepSizeState:
    return BBStepSizeState(
      count=jnp.zeros([], jnp.int32),
      step_size=guard.learning_rate_at(initial_step_size, jnp.zeros([], jnp.int32)),
      curvature=jnp.asarray(jnp.nan, jnp.float32),
      accepted=jnp.asarray(False),
      noise_ratio=jnp.zeros([], jnp.float32),
      prev_params=jax.tree.map(jnp.array, params),  # a copy: params may be donated
      prev_grads=guard.state_zeros(params, acc_dtype),
      nonfinite_count=jnp.zeros([], jnp.int32),
      clipped_count=jnp.zeros([], jnp.int32),
    )

  def update_fn(
    updates: optax.Updates,
    state: BBStepSizeState,
    params: optax.Params | None = None,
    *,
    grads_finite: Any = None,
    noise_ratio: Any = 0.0,
    value_fn: Callable[[optax.Params], jax.Array] | None = None,
    **extra_args: Any,
  ) -> tuple[optax.Updates, BBStepSizeState]:
    del extra_args
    params = guard.require_extra_arg(_RULE, "params", params, "the worker's parameters theta")
    backtrack = value_fn is not None if armijo is None else armijo
    if backtrack:
      value_fn = guard.require_extra_arg(_RULE, "value_fn", value_fn, "the batch loss, for armijo=True")
    # |B| = N (smoothing 1) is the full batch: no noise, the deterministic 1/nu.
    r = jnp.where(jnp.asarray(beta_s) == 1.0, 0.0, jnp.asarray(noise_ratio, jnp.float32))

    def apply(accept, rejected):
      move = jax.tree.map(lambda p, q: p - q, params, state.prev_params)
      corrected_prev = guard.tree_scaled(state.prev_grads, 1.0 - state.noise_ratio)
      grad_change = jax.tree.map(lambda g, h: g.astype(h.dtype) - h, updates, corrected_prev)

      # <g - g_hat_prev, s>, accumulated in the statistics dtype of g - g_hat_prev (at least float32); for
      # complex parameters the real inner product Re(conj(dg) . s), so the curvature (and the step) is real.
      # An elementwise product and a sum, not jnp.vdot: vdot flattens each leaf, which all-gathers a
      # parameter split along a later axis (tensor parallel).
      def real_inner(dg, s):
        return jnp.sum(jnp.real(jnp.conj(dg) * s.astype(dg.dtype)))

      nu = guard.tree_sum(real_inner, grad_change, move) / guard.tree_sq_norm(move)
      # The BB step is a plain gradient step's; through the server's momentum a gradient sent with
      # rate a moves the parameters a / (1 - gamma) in all, so the rate sent is (1 - gamma) times it.
      proposal = (1.0 - server_momentum) * (1.0 - r) / nu
      accepted = (
        (state.count > 0) & jnp.isfinite(nu) & (nu > 0) & (r < 1) & jnp.isfinite(proposal) & (proposal > 0)
      )
      alpha = jnp.where(accepted, (1.0 - beta_s) * state.step_size + beta_s * proposal, state.step_size)
      clipped = jnp.asarray(False)
      if max_scale is not None:  # jaxsync's bound (not the paper's); None keeps the paper's rule exactly
        # Under server momentum the top of the bound is the tuned rate itself (see "Momentum").
        # The bound's centre follows initial_step_size's schedule, on this worker's own steps.
        initial = guard.learning_rate_at(initial_step_size, state.count)
        top = jnp.where(jnp.asarray(server_momentum) > 0, initial, initial * max_scale)
        bounded = jnp.clip(alpha, initial / max_scale, top)
        clipped = bounded != alpha
        alpha = bounded
      if backtrack:
        alpha = armijo_backtracking(
          value_fn,
          params,
          updates,
          alpha,
          slope=armijo_slope,
          shrink=armijo_shrink,
          max_backtracks=max_backtracks,
        )
      proposed = state._replace(
        count=optax.safe_increment(state.count),
        step_size=alpha.astype(state.step_size.dtype),  # float32, also for float64 parameters under x64
        curvature=jnp.where(state.count > 0, nu, jnp.nan).astype(jnp.float32),
        accepted=accepted,
        # A ratio outside [0, 1] (inf when the mean gradient is 0) would flip or
        # blow up the next correction (1 - r_prev) g_prev; 1 drops g_prev instead.
        noise_ratio=jnp.where(jnp.isfinite(r), jnp.clip(r, 0.0, 1.0), 1.0),
        prev_params=jax.tree.map(lambda p, q: p.astype(q.dtype), params, state.prev_params),
        prev_grads=jax.tree.map(lambda g, q: g.astype(q.dtype), updates, state.prev_grads),
        clipped_count=guard.count_if(state.clipped_count, clipped),
      )
      return guard.tree_scaled(updates, alpha), guard.keep_if(accept, proposed, rejected)

    return guard.guarded_update(updates, state, apply, grads_finite=grads_finite)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def gradient_noise_ratio(per_example_grads: optax.Updates) -> jax.Array:
  r"""How noisy a batch gradient is: the variance of the batch mean relative to its squared norm.

  A ratio near 0 means the batch mean is a precise gradient; near or above 1,
  the minibatch noise is as large as the signal. :func:`bb_step_size` uses it
  to correct its curvature estimate when the server does not supply one (the
  adaptive-k server does); compute it from per-example gradients:

  .. math::

    \bar g = \frac1B \sum_i g_i, \qquad
    V = \frac{1}{B-1} \sum_i \|g_i - \bar g\|^2, \qquad
    r = \frac{V}{B\, \|\bar g\|^2}

  ``V / B`` estimates the variance of the batch mean (the trace bound, eq. 10
  of the JPDC 2022 paper).

  Args:
    per_example_grads: a tree whose leaves have a leading batch axis of size
      ``B >= 2`` (e.g. from ``jax.vmap(jax.grad(loss), (None, 0))``).

  Returns:
    ``r`` as a float32 scalar (``inf`` when the mean gradient is zero).

  Example:
    >>> import jax.numpy as jnp, jaxsync
    >>> float(jaxsync.gradient_noise_ratio(jnp.array([[1.0], [3.0]])))
    0.25

  References:
    De, Yadav, Jacobs, Goldstein, "Big Batch SGD: Automated Inference using
    Adaptive Batch Sizes", AISTATS 2017; Zhang, Ji, Wang, JPDC 2022, eq. (10).
  """
  leaves = jax.tree.leaves(per_example_grads)
  if not leaves:
    raise ValueError("gradient_noise_ratio: per_example_grads is empty; expected a non-empty tree.")
  batch = leaves[0].shape[0] if leaves[0].ndim else 0
  if batch < 2 or any(leaf.ndim == 0 or leaf.shape[0] != batch for leaf in leaves):
    shapes = [tuple(leaf.shape) for leaf in leaves]
    raise ValueError(
      f"gradient_noise_ratio: per_example_grads has leaf shapes {shapes}; expected "
      "every leaf to have the same leading batch axis of size >= 2."
    )
  mean = jax.tree.map(lambda x: jnp.mean(x.astype(jnp.float32), axis=0), per_example_grads)
  spread = sum(jnp.sum(jnp.square(x.astype(jnp.float32) - m)) for x, m in zip(leaves, jax.tree.leaves(mean)))
  variance = spread / (batch - 1)
  mean_sq = guard.tree_sq_norm(mean)
  return jnp.where(mean_sq > 0, variance / (batch * jnp.where(mean_sq > 0, mean_sq, 1.0)), jnp.inf)
