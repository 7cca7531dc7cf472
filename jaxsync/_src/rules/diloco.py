"""DiLoCo in one process: inner steps of any optimizer, an outer step on the pseudo-gradient (the Algorithms page, section 18)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxsync._src.core import validation
from jaxsync._src.rules import guard, replica_axis
from jaxsync._src.rules.quantize import check_format, quantized

_RULE = "diloco"

# DiLoCo's outer optimizer (Douillard et al., 2023, §3): Nesterov SGD, lr 0.7, momentum 0.9.
OUTER_LEARNING_RATE = 0.7
OUTER_MOMENTUM = 0.9


def outer_nesterov(
  learning_rate: optax.ScalarOrSchedule = OUTER_LEARNING_RATE, momentum: float = OUTER_MOMENTUM
) -> optax.GradientTransformation:
  """DiLoCo's outer optimizer: ``optax.sgd(learning_rate, momentum, nesterov=True)`` on pseudo-gradients."""
  return optax.sgd(learning_rate, momentum, nesterov=True)


def pseudo_gradient(start: optax.Params, end: optax.Params) -> optax.Updates:
  """``Delta = theta_start - theta_end``: what the inner steps moved, as a gradient (DiLoCo's sign)."""
  return jax.tree.map(lambda s, e: (s - e.astype(s.dtype)).astype(s.dtype), start, end)


class DilocoState(NamedTuple):
  """State of :func:`diloco`.

  Attributes:
    count: inner steps taken (accepted gradients).
    anchor: ``theta``, the global parameters of each fragment's last outer
      step: where that fragment's pseudo-gradient is measured from.
    inner_state: the inner optimizer's state (kept across outer steps).
    outer_state: the outer optimizer's state (one per fragment with several).
    pending: the pseudo-gradient taken ``overlap`` steps before the round
      ends (Streaming DiLoCo), or ``()`` without an overlap.
    nonfinite_count: gradients rejected for a NaN or Inf.
  """

  count: jax.Array
  anchor: Any
  inner_state: Any
  outer_state: Any
  pending: Any
  nonfinite_count: jax.Array


def check_exchange(
  rule: str, period: Any, fragments: Any, overlap: Any, mixing: Any, quantize: Any, quantize_block: Any
) -> tuple[Any, int, int, Any, str | None, int]:
  """Checks DiLoCo's period and Streaming DiLoCo's fragments, overlap, mixing and wire format; returns them.

  The period and ``mixing`` may be scalar arrays (``optax.inject_hyperparams`` tunes them); ``fragments``,
  ``overlap`` and ``quantize_block`` decide the state's structure and must be Python integers.
  """
  period = validation.check_int(rule, "period", period, array_ok=rule == _RULE)
  fragments = validation.check_static_int(rule, "fragments", fragments)
  overlap = validation.check_static_int(rule, "overlap", overlap, low=0)
  if isinstance(period, int):  # an injected (array) period is checked by whoever injects it
    if period % fragments:
      raise validation.invalid(rule, "fragments", fragments, f"a divisor of the sync period {period}")
    round_steps = period // fragments
    if overlap >= round_steps:
      raise validation.invalid(
        rule, "overlap", overlap, f"an integer in [0, {round_steps}): the steps between two fragments' syncs"
      )
  mixing = validation.check_real(rule, "mixing", mixing, low=0.0, high=1.0, array_ok=True)
  quantize, quantize_block = check_format(rule, quantize, quantize_block)
  return period, fragments, overlap, mixing, quantize, quantize_block


def fragment_pseudo_gradient(anchor, x, fragment, num_fragments: int):
  """``theta - x`` on the leaves of ``fragment``, zeros elsewhere (all of it with one fragment)."""
  inside = _inside(anchor, fragment, num_fragments)
  leaves = [
    jnp.where(keep, (a - m.astype(a.dtype)).astype(a.dtype), jnp.zeros_like(a))
    for keep, a, m in zip(inside, jax.tree.leaves(anchor), jax.tree.leaves(x))
  ]
  return jax.tree.unflatten(jax.tree.structure(anchor), leaves)


def mix_fragment(theta, x, fragment, num_fragments: int, mixing: float):
  """A worker's model after ``fragment``'s outer step: ``(1 - alpha) theta + alpha x`` there, ``x`` elsewhere."""
  if num_fragments == 1 and isinstance(mixing, (int, float)) and mixing == 0.0:
    return theta  # a Python zero (an injected mixing is an array, mixed in below)
  inside = _inside(theta, fragment, num_fragments)
  leaves = [
    jnp.where(keep, ((1.0 - mixing) * t + mixing * m).astype(m.dtype), m)
    for keep, t, m in zip(inside, jax.tree.leaves(theta), jax.tree.leaves(x))
  ]
  return jax.tree.unflatten(jax.tree.structure(x), leaves)


def _inside(tree, fragment, num_fragments: int) -> list:
  if num_fragments == 1:
    return [True] * len(jax.tree.leaves(tree))
  return [fragment == owner for owner in fragment_of_leaves(tree, num_fragments)]


def diloco(
  inner: optax.GradientTransformation,
  outer: optax.GradientTransformation | None = None,
  *,
  period: int | None = None,
  fragments: int | None = None,
  overlap: int | None = None,
  mixing: float = 0.0,
  quantize: str | None = None,
  quantize_block: int | None = None,
  sync_every: int | None = None,
  accumulator_dtype: Any = None,
  axis_name: str | tuple[str, ...] | None = None,
) -> optax.GradientTransformationExtraArgs:
  r"""DiLoCo's two optimizers in one transform (and Streaming DiLoCo's fragments): inner steps, then an outer step.

  In DiLoCo each worker trains alone for ``H`` steps with its own (inner)
  optimizer, then the workers average how far they moved, the
  *pseudo-gradient*, and an outer optimizer applies it to the shared
  parameters. This wrapper is that loop for one worker, in the spirit of
  ``optax.MultiSteps``: use it in any optax or flax loop to see what the
  outer optimizer does to a model, or as the single-process reference of
  jaxsync's ``diloco`` and ``streaming_diloco`` strategies (with one worker
  they agree).

  With ``x`` the parameters passed to ``update`` and ``theta`` the anchor:

  .. math::

    &x \\leftarrow x + \\mathrm{inner}(g) \\qquad \\text{(every step)} \\\\
    &\\text{every } H \\text{ steps:}\\quad \\Delta = Q(\\theta - x), \\quad
      \\theta \\leftarrow \\theta + \\mathrm{outer}(\\Delta), \\quad x \\leftarrow \\theta

  Streaming DiLoCo (``fragments = P > 1``): the leaves are cut into ``P``
  contiguous fragments (:func:`fragment_of_leaves`); every ``h = H / P``
  steps one fragment ``p`` (round ``r``'s is ``r mod P``) is synchronized,
  with an outer optimizer of its own. Its pseudo-gradient is taken
  ``tau = overlap`` steps before the round ends (the exchange overlaps
  them), and at the end its parameters become ``(1 - alpha) theta_p + alpha x_p``
  (``alpha = mixing``; 0 keeps the global ones). ``Q`` is the wire format,
  ``quantize`` (``None``: none; ``"bfloat16"``, ``"int8"``, ``"int4"`` with
  per-block scales).

  The inner optimizer's state (AdamW's moments) carries over from one round
  to the next, as in torchft and MaxText. The update returned on an outer
  step is ``x_new - x``, so ``optax.apply_updates`` lands on the new model
  (to rounding). ``period=1`` with ``outer = optax.sgd(1.0)`` is the
  inner optimizer itself.

  Extra args are passed to the inner optimizer. A NaN/Inf gradient is
  rejected (zeros out, state unchanged, counted in ``nonfinite_count``);
  ``grads_finite`` (bool scalar) replaces the scan.

  Args:
    inner: the inner optimizer, any optax transform (DiLoCo: AdamW).
    outer: the outer optimizer on pseudo-gradients; default Nesterov SGD
      with lr 0.7 and momentum 0.9.
    period: ``H >= 1``, inner steps between two syncs of a fragment
      (required; DiLoCo: 500). The strategies and configs call it ``period`` too.
    fragments: ``P``, a divisor of ``H`` (``None``: 1, DiLoCo).
    overlap: ``tau`` in ``[0, H / P)`` (``None``: 0).
    mixing: ``alpha`` in ``[0, 1]``.
    quantize: the pseudo-gradient's wire format, or ``None``.
    quantize_block: values per scale of the integer formats (``None``: 64).

    ``fragments``, ``overlap`` and ``quantize_block`` shape the state: under
    ``optax.inject_hyperparams`` a number given for one goes in ``static_args``
    (their ``None`` defaults are left alone); ``period`` and ``mixing`` are tuned
    as arrays.
    sync_every: the old name of ``period``, accepted with a ``FutureWarning``.
    accumulator_dtype: the dtype of the anchor ``theta``, the outer optimizer's state and the overlap's
      buffer; ``None`` (default): at least float32, the parameters' dtype where wider. The pseudo-gradient
      ``theta - x`` is a small difference of nearby values, which bfloat16 rounds away; MaxText keeps its
      outer copy in the train state's parameter dtype and torchft in each parameter's own, so with
      float32 master weights all three agree.

    axis_name: the mesh axis (or axes) the replicas lie on, for a user's own step under ``jax.shard_map``
      (MaxText's layout: replicas on one axis, the model sharded over the others): every replica runs this
      rule on its own model, and on outer steps only the pseudo-gradients are averaged over that axis
      (``lax.pmean``, inside the branch of the outer step). The non-finite check is agreed over every
      manual axis, so one device's NaN skips the step on all of them and the step counters never diverge.
      ``None``: one replica (the reference, or a worker of jaxsync's own runtimes).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is a
    :class:`DilocoState`.

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> tx = jaxsync.diloco(optax.sgd(0.25), optax.sgd(0.5), period=2)
    >>> x = jnp.array([1.0]); state = tx.init(x)
    >>> for _ in range(2):
    ...   u, state = tx.update(jnp.array([1.0]), state, x); x = optax.apply_updates(x, u)
    >>> x  # two inner steps moved 0.5; the outer step of rate 0.5 keeps half of it
    Array([0.75], dtype=float32)

  References:
    Douillard, Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam, Shen,
    "DiLoCo: Distributed Low-Communication Training of Language Models",
    arXiv:2311.08105, 2023, Algorithm 1; Douillard et al., "Streaming
    DiLoCo with overlapping communication", arXiv:2501.18512, 2025.
  """
  if not isinstance(inner, optax.GradientTransformation):
    raise validation.invalid(_RULE, "inner", inner, "an optax GradientTransformation")
  if outer is None:
    outer = outer_nesterov()
  elif not isinstance(outer, optax.GradientTransformation):
    raise validation.invalid(_RULE, "outer", outer, "an optax GradientTransformation, or None for Nesterov")
  if axis_name is not None and not (
    isinstance(axis_name, str)
    or (isinstance(axis_name, tuple) and all(isinstance(n, str) for n in axis_name))
  ):
    raise validation.invalid(
      _RULE, "axis_name", axis_name, "None, a mesh axis name (a str) or a tuple of them"
    )
  period = validation.renamed(_RULE, "sync_every", "period", sync_every, period)
  if period is None:
    raise validation.invalid(
      _RULE, "period", None, "an integer >= 1: inner steps between two syncs (DiLoCo's H)"
    )
  # None defaults, not numbers: optax.inject_hyperparams injects every numeric default as an array.
  period, num_fragments, overlap, mixing, fmt, block = check_exchange(
    _RULE,
    period,
    1 if fragments is None else fragments,
    0 if overlap is None else overlap,
    mixing,
    quantize,
    64 if quantize_block is None else quantize_block,
  )
  round_steps = period // num_fragments
  inner = optax.with_extra_args_support(inner)
  if num_fragments > 1:
    outer = by_fragment(outer, num_fragments)

  acc_dtype = validation.check_state_dtype(_RULE, accumulator_dtype)

  def init_fn(params: optax.Params) -> DilocoState:
    anchor = guard.state_copy(params, acc_dtype)
    return DilocoState(
      count=jnp.zeros([], jnp.int32),
      anchor=anchor,
      inner_state=inner.init(params),
      outer_state=outer.init(anchor),  # on the anchor it steps: its dtype
      pending=guard.state_zeros(params, acc_dtype) if overlap else (),
      nonfinite_count=jnp.zeros([], jnp.int32),
    )

  def update_fn(
    updates: optax.Updates,
    state: DilocoState,
    params: optax.Params | None = None,
    *,
    grads_finite: Any = None,
    **extra_args: Any,
  ) -> tuple[optax.Updates, DilocoState]:
    params = guard.require_extra_arg(_RULE, "params", params, "the parameters x the inner steps move")
    if axis_name is not None:
      # One decision on every device of every replica: a NaN on one device skips the step everywhere, so the
      # step counters (and with them the outer steps' collectives and the fragment schedule) never diverge.
      axes = replica_axis.axis_names(_RULE, axis_name)
      local = guard.tree_all_finite(updates) if grads_finite is None else grads_finite
      grads_finite = replica_axis.all_agree(local, axes)

    def apply(accept, rejected):
      inner_updates, inner_state = inner.update(updates, state.inner_state, params, **extra_args)
      count = optax.safe_increment(state.count)
      moved = optax.apply_updates(params, inner_updates)
      fragment = ((count - 1) // round_steps) % num_fragments
      step_in_round = count - ((count - 1) // round_steps) * round_steps  # 1 .. h
      delta = quantized(fragment_pseudo_gradient(state.anchor, moved, fragment, num_fragments), fmt, block)
      pending = state.pending
      if overlap:  # taken tau steps before the round ends, applied at its end
        taken = step_in_round == round_steps - overlap
        pending = jax.tree.map(lambda d, p: jnp.where(taken, d.astype(p.dtype), p), delta, state.pending)
        delta = jax.tree.map(lambda p, d: p.astype(d.dtype), pending, delta)

      # Both branches return updates of the wider of the gradients' and the parameters' dtypes (an inner
      # step's are the gradients'; an outer step's are x_new - x), so mixed precision needs no cast by the user.
      def widened(tree):
        return jax.tree.map(lambda u, p: u.astype(jnp.promote_types(u.dtype, p.dtype)), tree, params)

      def outer_step(_):
        extra = {"fragment": fragment} if num_fragments > 1 else {}
        # Across replicas: the mean pseudo-gradient, only here, on outer steps (a real branch, not a select).
        # (Typed as varying again: the outer optimizer's branches, per fragment, must agree under shard_map.)
        mean_delta = (
          delta if axis_name is None else replica_axis.varying(replica_axis.mean(delta, axis_name), axes)
        )
        outer_updates, outer_state = outer.update(mean_delta, state.outer_state, state.anchor, **extra)
        anchor = optax.apply_updates(state.anchor, outer_updates)
        model = mix_fragment(anchor, moved, fragment, num_fragments, mixing)
        # x_new - x: apply_updates then lands the parameters on the new model.
        out = optax.tree.cast_like(pseudo_gradient(model, params), widened(inner_updates))
        return out, anchor, optax.tree.cast_like(outer_state, state.outer_state)

      def inner_only(_):
        return widened(inner_updates), state.anchor, state.outer_state

      branches = (outer_step, inner_only)
      if axis_name is not None:  # shard_map types both branches' outputs alike: varying over the replicas
        branches = tuple(lambda _, b=b: replica_axis.varying(b(None), axes) for b in branches)
      out, anchor, outer_state = jax.lax.cond(step_in_round == round_steps, *branches, None)
      inner_state = optax.tree.cast_like(inner_state, state.inner_state)  # its dtypes as built: one compile
      proposed = rejected._replace(
        count=count, anchor=anchor, inner_state=inner_state, outer_state=outer_state, pending=pending
      )
      return out, guard.keep_if(accept, proposed, rejected)

    return guard.guarded_update(updates, state, apply, grads_finite=grads_finite)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def fragment_of_leaves(params: optax.Params, num_fragments: int, *, strided: bool = False) -> tuple[int, ...]:
  """Streaming DiLoCo's fragments: each leaf's fragment, contiguous blocks of leaves of about equal size.

  The leaves (in ``jax.tree.leaves`` order, which for a model's nested dict
  follows its layers) are cut into ``num_fragments`` contiguous blocks, each
  leaf going to the block that holds the middle of its parameters, and every
  block getting at least one leaf. A function of the shapes only: the same
  under ``jit`` and in every process.

  With ``strided=True``, leaf ``i`` goes to fragment ``i mod P`` instead: the
  paper's default pattern (its Figure 7), which the planner takes to compare
  with the paper; the rules here synchronize contiguous blocks.

  Args:
    params: the parameters (or anything shaped like them).
    num_fragments: ``P >= 1``, at most the number of leaves.
    strided: every ``P``-th leaf in one fragment, instead of contiguous blocks.

  Returns:
    ``fragment[i]`` for leaf ``i``, non-decreasing (contiguous), covering ``0 .. P-1``.
  """
  sizes = [max(1, math.prod(jnp.shape(leaf))) for leaf in jax.tree.leaves(params)]
  n = len(sizes)
  if num_fragments > n:
    raise validation.invalid(
      "streaming_diloco",
      "fragments",
      num_fragments,
      f"an integer in [1, {n}]: the model has {n} parameter arrays",
    )
  if strided:
    return tuple(i % num_fragments for i in range(n))
  total, seen, owner = float(sum(sizes)), 0.0, []
  for i, size in enumerate(sizes):
    middle = int((seen + size / 2) * num_fragments / total)
    seen += size
    # At most one block further than the last leaf's, and leave a leaf for every later block.
    f = min(max(middle, num_fragments - (n - i)), i, num_fragments - 1)
    if owner:
      f = min(max(f, owner[-1]), owner[-1] + 1)
    owner.append(f)
  return tuple(owner)


class ByFragmentState(NamedTuple):
  """State of :func:`by_fragment`: one outer-optimizer state per fragment."""

  states: tuple


def by_fragment(
  outer: optax.GradientTransformation, num_fragments: int
) -> optax.GradientTransformationExtraArgs:
  r"""An outer optimizer per fragment: the update of the fragment named by the extra arg ``fragment`` only.

  Streaming DiLoCo synchronizes one fragment of the parameters at a time;
  each fragment's outer optimizer (its Nesterov momentum) moves only when that
  fragment is synchronized. This wraps any optax ``outer`` so that
  ``update(delta, state, theta, fragment=p)`` applies ``outer`` to the leaves
  of fragment ``p`` (:func:`fragment_of_leaves`) with fragment ``p``'s state,
  and returns zeros elsewhere. With one fragment it is ``outer`` itself.

  Args:
    outer: the outer optimizer (DiLoCo: Nesterov SGD, lr 0.7, momentum 0.9).
    num_fragments: ``P >= 1``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is a
    :class:`ByFragmentState`; ``update`` requires ``fragment`` (int32 scalar).

  Example:
    >>> import jax.numpy as jnp, optax, jaxsync
    >>> from jaxsync._src.rules.diloco import by_fragment
    >>> tx = by_fragment(optax.sgd(1.0), 2)
    >>> theta = {"a": jnp.ones(2), "b": jnp.ones(2)}; state = tx.init(theta)
    >>> u, state = tx.update({"a": jnp.ones(2), "b": jnp.ones(2)}, state, theta, fragment=1)
    >>> u["a"], u["b"]
    (Array([0., 0.], dtype=float32), Array([-1., -1.], dtype=float32))

  References:
    Douillard et al., "Streaming DiLoCo with overlapping communication",
    arXiv:2501.18512, 2025.
  """
  num_fragments = validation.check_static_int("streaming_diloco", "fragments", num_fragments)
  outer = optax.with_extra_args_support(outer)

  def split(tree, owner, p):
    return [leaf for leaf, o in zip(jax.tree.leaves(tree), owner) if o == p]

  def init_fn(params):
    owner = fragment_of_leaves(params, num_fragments)
    return ByFragmentState(tuple(outer.init(split(params, owner, p)) for p in range(num_fragments)))

  def update_fn(updates, state, params=None, *, fragment=None, **extra_args):
    fragment = guard.require_extra_arg(
      "by_fragment", "fragment", fragment, "the fragment this update synchronizes"
    )
    leaves, treedef = jax.tree.flatten(updates)
    owner = fragment_of_leaves(updates, num_fragments)

    def branch(p):
      def run(_):
        mine = [i for i, o in enumerate(owner) if o == p]
        sub, sub_state = outer.update(
          [leaves[i] for i in mine],
          state.states[p],
          None if params is None else split(params, owner, p),
          **extra_args,
        )
        out = [jnp.zeros_like(leaf) for leaf in leaves]
        for j, i in enumerate(mine):
          out[i] = sub[j]
        return out, tuple(sub_state if q == p else s for q, s in enumerate(state.states))

      return run

    if num_fragments == 1:
      out, states = branch(0)(None)
    else:
      index = jnp.clip(jnp.asarray(fragment, jnp.int32), 0, num_fragments - 1)
      out, states = jax.lax.switch(index, [branch(p) for p in range(num_fragments)], None)
    return jax.tree.unflatten(treedef, out), ByFragmentState(states)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
