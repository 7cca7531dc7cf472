"""The arrival guard every jaxsync rule shares, and the small pieces of state the rules build on.

Every rule in jaxsync treats an arrival the same way (docs/design.md, "Errors"):

* Traced values are never checked with ``raise``. An arrival whose gradient holds
  a NaN or Inf, or whose ``version`` is impossible (negative, or newer than the
  server), is *rejected*: the rule emits exact zeros, leaves its state unchanged
  and counts the rejection in the state (``nonfinite_count``,
  ``invalid_version_count``) so the host can report it. Nothing is silently
  corrupted and a later valid arrival continues as if the bad one never came.
* Every rule's update takes the optional extra arg ``grads_finite`` (bool
  scalar): a caller that already checked the gradient passes the result and
  the rule skips its own scan (see :func:`guarded_update`).

Python hyperparameters are checked by :mod:`jaxsync._src.core.validation`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax


def learning_rate_at(learning_rate: optax.ScalarOrSchedule, count: jax.Array) -> jax.Array:
  """The learning rate for the update with index ``count``, as a float32 scalar."""
  rate = learning_rate(count) if callable(learning_rate) else learning_rate
  return jnp.asarray(rate, jnp.float32)


def require_extra_arg(rule: str, name: str, value: Any, meaning: str) -> jax.Array:
  """Extra args a rule cannot work without; a Python-level (trace-time) check."""
  if value is None:
    raise ValueError(
      f"{rule}: the update needs the extra argument {name}=... ({meaning}); "
      f"pass it as tx.update(grads, state, params, {name}=...)."
    )
  return value


def arrival_version(version: Any, current: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The arrival's ``version`` as int32 and whether it is possible (0 <= version <= current).

  An omitted ``version`` (``None``, a Python-level default, so static under ``jit``) is a fresh
  gradient: the rule's own ``current`` version, staleness 0. That is every gradient of a
  single-process loop (``tx.update(grads, state, params)``, ``flax.nnx.Optimizer``, a Linen
  ``TrainState``); the simulator and the parameter server pass the version the sender pulled.
  """
  if version is None:
    return current, jnp.asarray(True)
  s = jnp.asarray(version, jnp.int32)
  return s, (s >= 0) & (s <= current)


def count_if(counter: jax.Array, flag: jax.Array | bool) -> jax.Array:
  """``counter + 1`` where ``flag`` holds, saturating at the dtype's maximum (``optax.safe_increment``)."""
  return jnp.where(flag, optax.safe_increment(counter), counter)


def tree_all_finite(tree: Any) -> jax.Array:
  """True when no leaf of ``tree`` holds a NaN or an Inf (and no leaf's sum overflows its accumulator).

  ``isfinite(sum(x))``: a NaN survives any sum and an Inf makes it Inf or NaN,
  so the check is one reduction per leaf, one read of it, exact when the leaf
  is sliced over devices (an all-reduce of partial maxima loses a NaN on XLA's
  CPU collectives, one of partial sums keeps it: the sharded parameter server).
  Inside an update it costs one pass over the gradient: ``sum(x * 0)`` made XLA
  materialize a parameter-sized array of zeros and read it beside the leaf (the
  OrMo update went from 8 to 9.1 parameter-sized arrays of memory traffic,
  ``benchmarks/results/performance.md``). Leaves are summed in at least
  float32 (a float16 leaf of 70,000 ones is finite). The one finite input it
  rejects is a leaf whose sum overflows that accumulator (values near
  1e38 / n in float32), which no update survives either; the rules count it
  with the NaN and Inf arrivals (``nonfinite_count``). ``optax.tree_utils``
  has no such check.
  """
  sums = leaf_reductions(lambda leaf: jnp.sum(leaf, dtype=statistics_dtype(leaf.dtype)), tree)
  return computed_once(jnp.all(jnp.isfinite(sums)))[0]


def leaf_reductions(reduce: Callable[..., jax.Array], *trees: Any) -> jax.Array:
  """``[reduce(*leaves) for each leaf position]`` as one vector, each a scalar reduction of one leaf.

  The one way the rules reduce over a tree (norms, sums, the finite check).
  A scalar combined from these (a sum, a flag) must go through
  :func:`computed_once` before leaf loops read it (:func:`tree_sum` and
  :func:`tree_all_finite` do): otherwise XLA copies the combination of all
  ``n`` reductions into each of the ``n`` loops that read it, and compile
  time grows with ``n**2`` (a 300-array OrMo update compiled in 123 s
  against 1 s for ``optax.sgd``; ``benchmarks/results/compile_time.md``).
  The barrier keeps the reductions apart from each other. Leaves with no
  elements are skipped.
  """
  leaves = [jax.tree.leaves(t) for t in trees]
  picked = [group for group in zip(*leaves) if jnp.size(group[0])]
  if not picked:
    return jnp.zeros([0], jnp.float32)
  sums = lax.optimization_barrier([reduce(*group) for group in picked])
  return jnp.stack(sums)


def tree_sum(reduce: Callable[..., jax.Array], *trees: Any) -> jax.Array:
  """``sum(reduce(*leaves))`` over the leaf positions of ``trees`` (0 for a tree with no elements)."""
  return computed_once(jnp.sum(leaf_reductions(reduce, *trees)))[0]


def computed_once(*scalars: Any) -> tuple[jax.Array, ...]:
  """The given scalars, unchanged, computed once for every leaf loop that reads them.

  A rule's per-leaf loops read a few scalars derived from its counters and
  from reductions over the tree (``accept``, a coefficient, a norm). XLA fuses
  cheap scalar arithmetic into each consumer, so every leaf's loop recomputed
  the whole chain: at 300 arrays the OrMo update's fused code was 5x
  ``optax.sgd``'s, and a scalar combined from all 300 leaves' reductions was
  copied into all 300 loops (compile time growing with the square of the
  number of arrays). An ``optimization_barrier`` does not stop that (XLA's CPU
  pipeline expands barriers before fusion); a reduction does, so the scalars
  are packed into one vector per kind and taken through a ``reduce_window`` of
  ``max(x, lowest)``, which is ``x`` exactly (NaN and -0.0 included; a float32
  denormal reads as 0, as XLA's CPU arithmetic reads it anyway).
  Floating scalars of at most 32 bits travel as float32 (so gradients flow
  through them, as in meta-learning a learning rate), integers and bools of at
  most 32 bits as int32; wider scalars (under ``jax_enable_x64``), complex
  ones and non-scalars pass through as they are.

  Returns:
    A tuple of the scalars, each with its own dtype and value.
  """
  values = [jnp.asarray(x) for x in scalars]
  out = list(values)
  for kind, lowest in ((jnp.float32, -jnp.inf), (jnp.int32, jnp.iinfo(jnp.int32).min)):
    picked = [i for i, x in enumerate(values) if _packs_as(x) == kind]
    if not picked:
      continue
    packed = jnp.stack([_to_packed(values[i], kind) for i in picked])
    interleaved = jnp.stack([packed, jnp.full_like(packed, lowest)], axis=1).reshape(-1)
    kept = lax.reduce_window(interleaved, jnp.asarray(lowest, kind), lax.max, (2,), (2,), "VALID")
    for j, i in enumerate(picked):
      out[i] = _from_packed(kept[j], values[i].dtype)
  return tuple(out)


def _packs_as(x: jax.Array) -> Any:
  if x.ndim != 0 or x.dtype.itemsize > 4:
    return None
  if jnp.issubdtype(x.dtype, jnp.floating):
    return jnp.float32
  if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
    return jnp.int32
  return None


def _to_packed(x: jax.Array, kind: Any) -> jax.Array:
  if x.dtype == jnp.uint32:
    return lax.bitcast_convert_type(x, jnp.int32)
  return x.astype(kind)  # floats widen to float32 and bools and narrower integers to int32 exactly


def _from_packed(y: jax.Array, dtype: Any) -> jax.Array:
  if dtype == jnp.uint32:
    return lax.bitcast_convert_type(y, jnp.uint32)
  return y.astype(dtype)


def tree_scaled(tree: Any, scale: jax.Array) -> Any:
  """``scale * tree`` with every leaf keeping its own dtype (``optax.tree.scale``, cast back)."""
  return optax.tree.cast_like(optax.tree.scale(scale, tree), tree)


def tree_sq_norm(tree: Any) -> jax.Array:
  """Squared Euclidean norm of a tree (``|x|^2`` for complex leaves), accumulated in at least float32."""

  def leaf(x):
    x = jnp.abs(x) if jnp.iscomplexobj(x) else x
    return jnp.sum(jnp.square(x.astype(statistics_dtype(x.dtype))))

  return tree_sum(leaf, tree)


def statistics_dtype(dtype: Any) -> Any:
  """Running statistics are kept in at least float32, whatever the parameters are."""
  return jnp.promote_types(dtype, jnp.float32)


def state_dtype(param: Any, dtype: Any = None) -> Any:
  """The dtype of a state buffer for ``param``: ``dtype`` where given (a rule's ``accumulator_dtype``), else at
  least float32 (``statistics_dtype``)."""
  return statistics_dtype(jnp.result_type(param)) if dtype is None else dtype


def state_zeros(params: Any, dtype: Any = None) -> Any:
  """Zeros for a state buffer derived from gradients (momentum, sums): ``dtype``, or at least float32.

  A bfloat16 momentum or gradient sum loses ~0.4% per addition; summing a
  cycle of 64 arrivals in bfloat16 measured 2.6% error. Updates are cast back
  to the gradient's dtype, so only the state is wider.
  """
  # zeros_like keeps a sharded parameter's sharding under eager init (nnx.Optimizer's), as optax's own state does.
  return jax.tree.map(lambda p: jnp.zeros_like(p, dtype=state_dtype(p, dtype)), params)


def state_copy(params: Any, dtype: Any = None) -> Any:
  """A copy of the parameters kept in the state (DiLoCo's anchor): ``dtype``, or at least float32.

  A copy, never the parameters' own buffer, so a step may donate both. In at
  least float32 because what is read from it is a difference of nearby
  values (a pseudo-gradient, ``theta - x``), which bfloat16 rounds away.
  """
  return jax.tree.map(lambda p: jnp.array(p, dtype=state_dtype(p, dtype), copy=True), params)


def is_masked(x: Any) -> bool:
  """Whether ``x`` is the placeholder ``optax.masked`` puts on the leaves a rule does not train."""
  return isinstance(x, optax.MaskedNode)


def masked_like(tree: Any, like: Any) -> Any:
  """``tree`` with ``optax.MaskedNode`` wherever ``like`` has one (and as it is elsewhere).

  Inside ``optax.masked`` (and ``optax.multi_transform``, built on it) a rule
  sees the updates and parameters with ``MaskedNode`` on the leaves it does not
  train, but, by that wrapper's default (``mask_compatible_extra_args=False``),
  a parameter-shaped extra arg (an elastic centre) whole. Masking it the same
  way lets the rule work with that default; an extra arg that is already masked
  passes unchanged.
  """

  if tree is None or not any(is_masked(x) for x in jax.tree.leaves(like, is_leaf=is_masked)):
    return tree
  return jax.tree.map(lambda mask, x: mask if is_masked(mask) else x, like, tree, is_leaf=is_masked)


def stacked_like(tree: Any, copies: int) -> Any:
  """``copies`` copies of every leaf, stacked on a new leading axis, sharded as the leaf is on the others.

  Per-worker state (DC-ASGD's backups) under eager init: a leaf with a
  ``NamedSharding`` ``P(*spec)`` gives a stack sharded ``P(None, *spec)``, so
  the stack is split over the devices as the parameter is (not copied whole
  onto one device) and ``optax.tree_map_params`` sees the same layout.
  """

  def stack(p):
    out = jnp.broadcast_to(p, (copies, *jnp.shape(p))).copy()
    sharding = getattr(p, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding) and not isinstance(p, jax.core.Tracer):
      spec = jax.sharding.PartitionSpec(None, *sharding.spec)
      out = jax.device_put(out, jax.sharding.NamedSharding(sharding.mesh, spec))
    return out

  return jax.tree.map(stack, tree)


def keep_if(accept: jax.Array, new: Any, old: Any) -> Any:
  """``new`` where the arrival is accepted, ``old`` (cast to ``new``'s dtypes) otherwise, leaf by leaf."""
  return optax.tree.where(accept, new, optax.tree.cast_like(old, new))


def replace_if(accept: jax.Array, state: Any, **fields: Any) -> Any:
  """``state`` with the named fields set to the given values where the arrival is accepted.

  The rules select their scalar state this way, by name; their array state is
  selected once, where it is computed (see :func:`guarded_update`).
  """
  return state._replace(**keep_if(accept, fields, {name: getattr(state, name) for name in fields}))


def guarded_update(
  grads: Any,
  state: Any,
  compute: Callable[[jax.Array], tuple[Any, Any]],
  *,
  grads_finite: Any = None,
  version_ok: jax.Array | None = None,
  rejected_state: Any = None,
  version_field: str = "invalid_version_count",
) -> tuple[Any, Any]:
  """Applies an arrival only if it is finite and has a valid version.

  A rejected arrival returns exact zeros and the unchanged state, with
  ``state.nonfinite_count`` or ``state.invalid_version_count`` incremented.

  Why selects and not ``lax.cond``: on CPU a conditional materializes the
  updates and copies the state buffers it passes through (measured: 3.6x the
  cost of ``optax.sgd`` with momentum on 10M parameters), while a ``where``
  fuses into the loops that compute the update. ``compute`` receives the
  ``accept`` flag and returns the state already selected (:func:`keep_if`
  against ``rejected_state``), each array selected once, and derives updates
  that depend on new state from the selected arrays: selecting a buffer twice,
  or reading the old one in a second loop, makes XLA copy the whole buffer
  before updating it in place (measured: 1.2x became 3.6x).

  Checking the gradient costs one read of it, a sizable part of a server step
  whose update reads and writes a few parameter-sized arrays. A caller that
  already knows (a runtime computes the flag on the worker, off the server's
  critical path) passes ``grads_finite`` and the scan is skipped; the flag is
  then trusted, and a NaN it hides propagates.

  Args:
    grads: the arriving gradient (or worker model) tree.
    state: the rule's state, a NamedTuple with a ``nonfinite_count`` field (and
      ``invalid_version_count`` when ``version_ok`` is given).
    compute: ``(accept, rejected_state) -> (updates, new_state)`` where
      ``new_state`` equals ``rejected_state`` when ``accept`` is false; the
      updates must have the structure and dtypes of ``grads`` (they are zeroed
      here when ``accept`` is false).
    grads_finite: bool scalar or ``None`` (then ``grads`` is checked here).
    version_ok: bool scalar, whether the arrival's version is possible.
    rejected_state: the state a rejected arrival leaves (before counting);
      default ``state``. Rules with per-arrival flags (``released``) clear them.
    version_field: the state's counter of arrivals ``version_ok`` rejects
      (a rule that checks a worker id rather than a version names its own).

  Returns:
    ``(updates, new_state)``.
  """
  if grads_finite is None:
    finite = tree_all_finite(grads)
  else:
    finite = jnp.asarray(grads_finite, jnp.bool_)
  accept = finite if version_ok is None else jnp.logical_and(finite, version_ok)
  (accept,) = computed_once(accept)
  if rejected_state is None:
    rejected_state = state

  updates, new_state = compute(accept, rejected_state)
  updates = optax.tree.where(accept, updates, optax.tree.zeros_like(updates))
  new_state = new_state._replace(nonfinite_count=count_if(state.nonfinite_count, jnp.logical_not(finite)))
  if version_ok is not None:
    # A non-finite arrival is counted once, as non-finite.
    bad_version = jnp.logical_and(finite, jnp.logical_not(version_ok))
    counted = count_if(getattr(state, version_field), bad_version)
    new_state = new_state._replace(**{version_field: counted})
  return updates, new_state
