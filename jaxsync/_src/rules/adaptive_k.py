"""Adaptive k-synchronization with distributed progressive momentum (Algorithms page, 11a and 11b)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from jaxsync._src.core import validation
from jaxsync._src.core.deprecation import renamed_field
from jaxsync._src.rules import guard

_RULE = "adaptive_k"
CI_ENDPOINTS = ("upper", "lower")
# Student-t quantiles are tabulated on the host for df = 1 .. this many when
# max_k does not bound k; beyond it the last (slightly larger, so more
# conservative) quantile is used. At df = 1024 it is within 0.2% of the normal.
_DEFAULT_T_TABLE = 1024


class AdaptiveKState(NamedTuple):
  """State of :func:`adaptive_k`.

  The runtimes read ``released`` (did the last arrival release an aggregate?),
  ``last_k`` (how many fresh gradients it averaged) and ``count`` (the server
  version ``S``: the parameters sent to workers carry it).

  Attributes:
    count: ``S``, the number of releases so far; the server version.
    fresh_count: ``k`` of the fresh gradients buffered for step ``S``.
    fresh_mean: running mean of the buffered fresh gradients (Welford); only
      meaningful while ``fresh_count > 0`` (buffers are reset lazily).
    fresh_m2: per-coordinate sum of squared deviations (Welford), kept only
      for ``ci_endpoint="lower"`` (``()`` otherwise).
    fresh_m2_total: the sum of ``fresh_m2`` over coordinates, ``(k - 1) V``.
    stale_sum: ``sum_r gamma^(S - j_r) g_r`` over the stale arrivals since the
      last release; only meaningful while ``stale_count > 0``.
    stale_count: the number of stale arrivals since the last release.
    momentum_buffer: ``mc``, the progressive momentum. (Formerly ``momentum``, still readable with a
      ``DeprecationWarning``.)
    released: whether the last arrival released an aggregate.
    last_k: ``k`` of the last release (0 before the first).
    noise_ratio: ``r = V / (k |g_bar|^2)`` of the last release, the
      noise-to-signal ratio that :func:`bb_step_size` takes from the server.
    nonfinite_count: arrivals rejected for a NaN or Inf gradient.
    invalid_version_count: arrivals rejected for a version newer than ``count``
      or negative.
  """

  count: jax.Array
  fresh_count: jax.Array
  fresh_mean: optax.Updates
  fresh_m2: Any
  fresh_m2_total: jax.Array
  stale_sum: optax.Updates
  stale_count: jax.Array
  momentum_buffer: optax.Updates
  released: jax.Array
  last_k: jax.Array
  noise_ratio: jax.Array
  nonfinite_count: jax.Array
  invalid_version_count: jax.Array

  momentum = renamed_field("momentum", "momentum_buffer")


def _t_quantiles(confidence: float, max_df: int) -> np.ndarray:
  """Two-sided Student-t quantiles ``t_{1 - a/2, df}`` for df = 1..max_df."""
  from scipy import stats  # a dependency of jax; used on the host only

  alpha = 1.0 - confidence
  dfs = np.arange(1, max_df + 1)
  return stats.t.ppf(1.0 - alpha / 2.0, dfs).astype(np.float32)


def adaptive_k(
  *,
  momentum: float = 0.9,
  theta: float = 1.0,
  confidence: float = 0.95,
  ci_endpoint: str = "upper",
  max_k: int | None = None,
  fresh_staleness: int | None = 0,
  accumulator_dtype: Any = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Adaptive k-synchronization: a momentum *direction* once enough fresh gradients agree; chain a learning rate after it.

  The server collects the gradients computed on its current parameters and
  releases their mean as soon as it is precise enough (its estimated error is
  small next to its norm): often after 2 to 5 arrivals rather than all ``K``
  workers. Gradients that arrive stale are not dropped: they join the next
  step with the momentum weight they would have carried. Use it as the server
  rule when a barrier on every worker (BSP) waits too long for stragglers and
  plain asynchronous SGD is too noisy. In a single process (no ``version``
  passed) every gradient is fresh and it is SGD with momentum on an adaptive
  batch: each step averages as many batches as the tests ask for, up to ``max_k``
  (with the default ``max_k=None``, as many as they ask for: De et al.'s big-batch
  SGD). Like ``optax.scale_by_adam`` it returns a direction, not a step: alone in an
  optimizer it would climb the loss.

  With ``F`` the fresh gradients buffered for the current server version ``S``
  (those computed on a version ``j`` with ``S - j <= fresh_staleness``; by
  default only on ``S`` itself), ``k = |F|``, ``g_bar`` their mean, ``V = 1/(k-1) sum_i |g_i - g_bar|^2`` and
  ``s_j^2`` the per-coordinate sample variance (``sum_j s_j^2 = V``), the two
  tests after each fresh arrival are

  .. math::

    &\text{Test 1 (norm test): } V/k \le \theta^2 \|\bar g\|^2 \\
    &\text{Test 2 (t-interval): } V/k \le \theta^2 \|\hat\mu\|^2, \quad
      \hat\mu_j = |\bar g_j| \pm t_{1-a/2,\,k-1}\, s_j / \sqrt{k}

  It releases when ``k >= 2`` and both pass, or when ``k`` reaches
  ``min(max_k, num_live_workers)``. A release emits the progressive momentum
  ``mc_S`` (``R``: the stale arrivals since the last release, ``j_r`` the
  version each was computed on) and sets ``S <- S + 1``:

  .. math::

    mc_S = \gamma\, mc_{S-1} + \frac1k \sum_{i \in F} g_i
           + \frac1k \sum_{r \in R} \gamma^{S - j_r} g_r

  It is a *direction* rule: chain a learning rate after it,
  ``optax.chain(jaxsync.adaptive_k(), optax.scale_by_learning_rate(0.05))``
  (stateless transforms such as ``optax.clip_by_global_norm`` may go either
  side). On arrivals that release nothing it emits exact zeros; to follow it
  with a *stateful* optimizer (Adam, a schedule, :func:`ordered_momentum`),
  wrap that optimizer with :func:`on_release`, or it would also step on the
  idle arrivals. Per-worker BB step sizes (:func:`bb_step_size`) send
  ``alpha_i g_i``; the server then applies rate 1.

  Reading chosen: the paper's equations (8)-(26) are missing from its text;
  the tests are rebuilt from De et al. (2017), which the paper follows. The
  paper takes "the maximum value of the confidence interval"
  (``ci_endpoint="upper"``, the default), under which Test 2 always passes when
  Test 1 does, so it is skipped; ``ci_endpoint="lower"`` takes the cautious
  end, ``max(|g_bar_j| - h_j, 0)``, so that Test 2 can fail. Stale gradients
  are divided by the current ``k``. Both are argued in the Algorithms page of
  the jaxsync documentation, sections '11a. Adaptive k: the two error-bound
  tests' and '11b. Distributed progressive momentum'. Which gradients are
  "fresh" the paper leaves open: ``fresh_staleness=0`` (computed on the
  current step; after a release only the ``k`` released workers hold it, so
  the server makes about one update per compute time), ``1`` (the current or
  the previous step) or ``None`` (the first arrivals after a release,
  whatever their version: no gradient goes to the stale path). Section '11e.
  Which gradients are fresh' weighs them against measurements.

  Extra args of ``update``: ``version`` (int32 scalar, optional: the server
  version the gradient was computed on; omitted, the gradient is fresh) and
  ``num_live_workers`` (int32 scalar: the forced-release bound; a runtime that
  passes ``version`` must pass it too when ``max_k`` is ``None``, and a
  ``ValueError`` says so if it does not). Unknown extra args are ignored. NaN/Inf gradients and
  versions newer than ``count`` are rejected and counted in the state;
  ``grads_finite`` (bool scalar) replaces the NaN/Inf scan when the caller
  already knows.

  Args:
    momentum: ``gamma``, the momentum decay in ``[0, 1)``.
    theta: ``theta`` in ``(0, 1]``, the bound on the relative gradient error
      (smaller waits for more gradients).
    confidence: ``1 - a`` in ``(0, 1)``, the level of the t-interval.
    ci_endpoint: ``"upper"`` (paper text) or ``"lower"`` (cautious).
    max_k: the largest ``k``; a release is forced when it is reached.
      ``None`` (the default): bounded by the ``num_live_workers`` extra arg in
      a runtime, by the tests alone in a single process.
    fresh_staleness: the largest staleness ``S - j`` at which a gradient
      counts as fresh (an integer >= 0, default 0); ``None``: every gradient.
    accumulator_dtype: the dtype of the state's parameter-sized buffers (optax's name for it); ``None``
      (default): at least float32, the parameters' dtype where wider, so bfloat16 parameters keep float32
      statistics. Updates keep the gradients' dtype either way.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is an
    :class:`AdaptiveKState`.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> tx = optax.chain(jaxsync.adaptive_k(), optax.scale_by_learning_rate(0.1))
    >>> params = jnp.zeros(3)
    >>> state = tx.init(params)
    >>> g = jnp.array([1.0, 2.0, 3.0])
    >>> u1, state = tx.update(g, state, params)  # k = 1: buffered
    >>> u2, state = tx.update(g, state, params)  # identical: V = 0, the tests pass
    >>> bool((u1 == 0).all()), u2
    (True, Array([-0.1, -0.2, -0.3], dtype=float32))
    >>> int(state[0].last_k), bool(state[0].released)
    (2, True)

  References:
    Zhang, Ji, Wang, "Momentum-driven adaptive synchronization model for
    distributed DNN training on HPC clusters", JPDC 2022
    (doi:10.1016/j.jpdc.2021.09.007), §4.1-4.2, Algorithm 1; De, Yadav, Jacobs,
    Goldstein, "Big Batch SGD: Automated Inference using Adaptive Batch Sizes",
    AISTATS 2017.
  """
  gamma = validation.check_real(_RULE, "momentum", momentum, low=0.0, high=1.0, high_open=True, array_ok=True)
  theta = validation.check_real(_RULE, "theta", theta, low=0.0, high=1.0, low_open=True, array_ok=True)
  ci_endpoint = validation.check_choice(_RULE, "ci_endpoint", ci_endpoint, CI_ENDPOINTS)
  # The lower endpoint's Student-t table is computed on the host, sized by max_k: both must be Python numbers.
  host_table = ci_endpoint == "lower"
  if host_table and isinstance(confidence, (jax.Array, np.ndarray)):
    raise validation.invalid(
      _RULE,
      "confidence",
      confidence,
      "a Python number with ci_endpoint='lower': its t quantiles are tabulated (with "
      "optax.inject_hyperparams, list 'confidence' in static_args)",
    )
  confidence = validation.check_real(
    _RULE, "confidence", confidence, low=0.0, high=1.0, low_open=True, high_open=True, array_ok=True
  )
  if max_k is not None and host_table:
    max_k = validation.check_static_int(_RULE, "max_k", max_k)
  elif max_k is not None:
    max_k = validation.check_int(_RULE, "max_k", max_k, array_ok=True)
  if fresh_staleness is not None:
    fresh_staleness = validation.check_int(_RULE, "fresh_staleness", fresh_staleness, low=0, array_ok=True)
  # Per-coordinate variances are needed by Test 2 with the lower endpoint only.
  per_coordinate_m2 = ci_endpoint == "lower"
  if per_coordinate_m2:  # only the lower endpoint evaluates the t-interval
    t_table = jnp.asarray(_t_quantiles(confidence, max(max_k - 1, 1) if max_k else _DEFAULT_T_TABLE))

  acc_dtype = validation.check_state_dtype(_RULE, accumulator_dtype)

  def init_fn(params: optax.Params) -> AdaptiveKState:
    return AdaptiveKState(
      count=jnp.zeros([], jnp.int32),
      fresh_count=jnp.zeros([], jnp.int32),
      fresh_mean=guard.state_zeros(params, acc_dtype),
      fresh_m2=guard.state_zeros(params, acc_dtype) if per_coordinate_m2 else (),
      fresh_m2_total=jnp.zeros([], jnp.float32),
      stale_sum=guard.state_zeros(params, acc_dtype),
      stale_count=jnp.zeros([], jnp.int32),
      momentum_buffer=guard.state_zeros(params, acc_dtype),
      released=jnp.asarray(False),
      last_k=jnp.zeros([], jnp.int32),
      noise_ratio=jnp.zeros([], jnp.float32),
      nonfinite_count=jnp.zeros([], jnp.int32),
      invalid_version_count=jnp.zeros([], jnp.int32),
    )

  def update_fn(
    updates: optax.Updates,
    state: AdaptiveKState,
    params: optax.Params | None = None,
    *,
    grads_finite: Any = None,
    version: Any = None,
    num_live_workers: Any = None,
    **extra_args: Any,
  ) -> tuple[optax.Updates, AdaptiveKState]:
    del params, extra_args
    # A runtime (it passes versions) must bound k by the workers alive, or a release could wait for
    # gradients no one will send; a single-process loop has no such bound: the tests alone decide.
    if max_k is None and num_live_workers is None and version is not None:
      raise ValueError(
        f"{_RULE}: with max_k=None and a version, the update needs the extra argument "
        "num_live_workers=... (the forced-release bound of a runtime); pass it, or set max_k."
      )
    count = state.count
    s, version_ok = guard.arrival_version(version, count)
    bound = jnp.asarray(max_k if max_k is not None else jnp.iinfo(jnp.int32).max, jnp.int32)
    if num_live_workers is not None:
      bound = jnp.minimum(bound, jnp.asarray(num_live_workers, jnp.int32))

    def apply(accept, rejected):
      gamma_ = jnp.asarray(gamma, jnp.float32)
      # §11e: fresh within ``fresh_staleness`` steps of the current one (None: every arrival).
      fresh = jnp.asarray(True) if fresh_staleness is None else count - s <= fresh_staleness
      add_fresh = accept & fresh
      add_stale = accept & jnp.logical_not(fresh)
      # Buffers are reset lazily: after a release the counts are zero and the
      # next arrival overwrites the buffer instead of adding to it. So the
      # buffers never depend on the release decision, which needs reductions.
      first_fresh = state.fresh_count == 0
      first_stale = state.stale_count == 0
      k = state.fresh_count + add_fresh.astype(jnp.int32)
      k_f = jnp.maximum(k, 1).astype(jnp.float32)
      # Welford, with M2 written from the new mean so that the old mean has
      # one reader: m2 += (k / (k - 1)) (g - mean_new)^2 equals the textbook
      # m2 += (g - mean_old)(g - mean_new).
      m2_scale = jnp.where(k >= 2, k_f / jnp.maximum(k_f - 1.0, 1.0), 0.0)
      stale_weight = gamma_ ** (count - s).astype(jnp.float32)  # §11b, below
      add_fresh, first_fresh, k_f, m2_scale, add_stale, first_stale, stale_weight = guard.computed_once(
        add_fresh, first_fresh, k_f, m2_scale, add_stale, first_stale, stale_weight
      )

      def new_mean(g, mean):
        g32 = g.astype(mean.dtype)
        running = (mean + (g32 - mean) / k_f).astype(mean.dtype)  # k_f is float32: keep the buffer's dtype
        return jnp.where(add_fresh, jnp.where(first_fresh, g32, running), mean)

      mean = jax.tree.map(new_mean, updates, state.fresh_mean)
      # §11b: a stale gradient of step j carries gamma^(S - j) in mc_S (stale_weight, above).

      def new_stale(g, acc):
        weighted = (stale_weight * g).astype(acc.dtype)
        return jnp.where(add_stale, jnp.where(first_stale, weighted, acc + weighted), acc)

      stale_sum = jax.tree.map(new_stale, updates, state.stale_sum)
      if per_coordinate_m2:

        def new_m2(g, mu, m2):
          dev = g.astype(mu.dtype) - mu
          grown = jnp.where(first_fresh, jnp.zeros_like(m2), (m2 + m2_scale * dev * dev).astype(m2.dtype))
          return jnp.where(add_fresh, grown, m2)

        m2 = jax.tree.map(new_m2, updates, mean, state.fresh_m2)
        mean, m2, stale_sum = lax.optimization_barrier((mean, m2, stale_sum))
        m2_total = guard.tree_sum(jnp.sum, m2)
      else:
        m2 = state.fresh_m2  # () : the t-interval is implied, see below
        mean, stale_sum = lax.optimization_barrier((mean, stale_sum))
        dev_sq = guard.tree_sq_norm(jax.tree.map(lambda g, mu: g.astype(mu.dtype) - mu, updates, mean))
        grown = jnp.where(first_fresh, 0.0, state.fresh_m2_total + m2_scale * dev_sq)
        m2_total = jnp.where(add_fresh, grown, state.fresh_m2_total)

      # §11a: the tests on the fresh set (only meaningful for k >= 2).
      dof = jnp.maximum(k - 1, 1).astype(jnp.float32)
      mean_sq = guard.tree_sq_norm(mean)
      error = m2_total / dof / k_f  # V / k, V of eq. (12)
      tests_pass = (k >= 2) & (error <= theta**2 * mean_sq)  # Test 1, eq. (13)
      if per_coordinate_m2:
        # Test 2 with the lower endpoint. With the upper endpoint
        # |mu_hat| >= |g_bar|, so Test 1 implies Test 2 and it is not evaluated.
        t_quantile = t_table[jnp.clip(k - 2, 0, t_table.shape[0] - 1)]
        half_width_scale = t_quantile / jnp.sqrt(k_f)

        def lower_sq(mu, m):
          h = half_width_scale * jnp.sqrt(jnp.maximum(m, 0.0) / dof)
          return jnp.sum(jnp.square(jnp.maximum(jnp.abs(mu) - h, 0.0)))

        ci_sq = guard.tree_sum(lower_sq, mean, m2)
        tests_pass = tests_pass & (error <= theta**2 * ci_sq)
      release = add_fresh & (tests_pass | (k >= bound))

      has_stale = state.stale_count + add_stale.astype(jnp.int32) > 0
      stale_scale = jnp.where(has_stale, 1.0 / k_f, 0.0)
      release, stale_scale, gamma_ = guard.computed_once(release, stale_scale, gamma_)

      def merge(mc, mu, acc):
        direction = gamma_ * mc.astype(mu.dtype) + mu + stale_scale * acc.astype(mu.dtype)
        return jnp.where(release, direction.astype(mc.dtype), mc)

      momentum_ = lax.optimization_barrier(jax.tree.map(merge, state.momentum_buffer, mean, stale_sum))
      out = jax.tree.map(
        lambda g, mc: jnp.where(release, mc, jnp.zeros_like(mc)).astype(g.dtype), updates, momentum_
      )
      noise_ratio = jnp.where(mean_sq > 0, error / jnp.where(mean_sq > 0, mean_sq, 1.0), jnp.inf)
      stale_count = state.stale_count + add_stale.astype(jnp.int32)
      selected = guard.replace_if(
        accept,
        rejected,
        count=jnp.where(release, optax.safe_increment(count), count),
        fresh_count=jnp.where(release, 0, k),
        fresh_m2_total=m2_total.astype(jnp.float32),
        stale_count=jnp.where(release, 0, stale_count),
        released=release,
        last_k=jnp.where(release, k, state.last_k),
        noise_ratio=jnp.where(release, jnp.where(k >= 2, noise_ratio, 0.0), state.noise_ratio).astype(
          jnp.float32
        ),
      )
      # The arrays are selected already (each exactly once; see guarded_update).
      return out, selected._replace(
        fresh_mean=mean, fresh_m2=m2, stale_sum=stale_sum, momentum_buffer=momentum_
      )

    # A rejected arrival releases nothing; the flag must say so.
    return guard.guarded_update(
      updates,
      state,
      apply,
      grads_finite=grads_finite,
      version_ok=version_ok,
      rejected_state=state._replace(released=jnp.asarray(False)),
    )

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
