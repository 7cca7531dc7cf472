"""What the simulator records per event, and its evaluation schedule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsync._src.core import validation


def stack_workers(tree: Any, n: int) -> Any:
  """``n`` copies of ``tree`` along a new leading worker axis."""
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *jnp.shape(x))), tree)


class EventRecord(NamedTuple):
  """One row per event (an arrival at the server, or a synchronous round).

  Attributes:
    time: simulated seconds when the server finished the event.
    worker: the arriving worker (an EA-wild group's id, ``0 .. K/G - 1``), ``-1`` for a synchronous round.
    staleness: server updates between the sender's pull and this arrival.
    version: the server version after the event.
    released: whether the event changed the server parameters.
    k: gradients (or models) combined in the update; 0 when nothing released.
    loss: the training loss of the event's gradient(s) on its batch.
    rejected: the arrival was non-finite and was rejected.
    step_size: the sender's learning rate when it adapts (BB), else NaN.
    evaluated: whether an evaluation was taken after this event.
    metrics: evaluation metrics when ``evaluated`` (may be NaN for a diverged
      model), else NaN.
  """

  time: jax.Array
  worker: jax.Array
  staleness: jax.Array
  version: jax.Array
  released: jax.Array
  k: jax.Array
  loss: jax.Array
  rejected: jax.Array
  step_size: jax.Array
  evaluated: jax.Array
  metrics: dict[str, jax.Array]


class EvalSchedule(NamedTuple):
  """When to evaluate: every ``every_updates`` server updates or every ``every_time`` seconds."""

  eval_fn: Callable[[optax.Params], dict[str, Any]] | None
  every_updates: int | None
  every_time: float | None

  @staticmethod
  def make(eval_fn, every_updates, every_time) -> EvalSchedule:
    if eval_fn is None:
      return EvalSchedule(None, None, None)
    if (every_updates is None) == (every_time is None):
      raise ValueError(
        f"simulator: eval_every={every_updates!r} and eval_every_time={every_time!r} are invalid; "
        "expected exactly one of them with eval_fn."
      )
    if every_updates is not None:
      every_updates = validation.check_int("simulator", "eval_every", every_updates)
    else:
      every_time = validation.check_real("simulator", "eval_every_time", every_time, low=0.0, low_open=True)
    return EvalSchedule(eval_fn, every_updates, every_time)

  def metric_shapes(self, params: optax.Params) -> dict[str, jax.ShapeDtypeStruct]:
    if self.eval_fn is None:
      return {}
    out = jax.eval_shape(self.eval_fn, params)
    if not isinstance(out, dict) or any(jnp.shape(v) != () for v in out.values()):
      raise ValueError(f"simulator: eval_fn returned {out!r}; expected a dict of scalar metrics.")
    return dict(out)

  def first_due(self) -> jax.Array:
    if self.every_updates is not None:
      return jnp.asarray(float(self.every_updates), jnp.float32)
    return jnp.asarray(self.every_time if self.every_time is not None else jnp.inf, jnp.float32)

  def eval_arrays(self) -> list[jax.Array]:
    """The arrays of ``eval_fn`` when it is a pytree (e.g. a ``jax.tree_util.Partial``); none for a closure.

    A runtime's compiled programs take them as arguments (:meth:`with_eval_arrays`), so that held-out
    data reach XLA as buffers and not as constants folded into every program: Fashion-MNIST's 31 MB
    test set cost every compilation of the simulator's loop and of an evaluation about 0.4 s more.
    """
    return [x for x in jax.tree.leaves(self.eval_fn) if _is_array(x)]

  def with_eval_arrays(self, arrays: list[jax.Array]) -> EvalSchedule:
    """This schedule with :meth:`eval_arrays` replaced by ``arrays`` (tracers, inside a compiled program)."""
    leaves, treedef = jax.tree.flatten(self.eval_fn)
    given = iter(arrays)
    return self._replace(eval_fn=treedef.unflatten([next(given) if _is_array(x) else x for x in leaves]))

  def evaluate(self, params: optax.Params) -> dict[str, jax.Array]:
    return {k: jnp.asarray(v, jnp.float32) for k, v in self.eval_fn(params).items()}

  def evaluate_with(self, eval_arrays: list[jax.Array], params: optax.Params) -> dict[str, jax.Array]:
    """:meth:`evaluate` with :meth:`eval_arrays` given (to jit: ``jax.jit(schedule.evaluate_with)``)."""
    return self.with_eval_arrays(eval_arrays).evaluate(params)

  def maybe_evaluate(
    self,
    next_due: jax.Array,
    params: optax.Params,
    version: jax.Array,
    time: jax.Array,
    names: tuple[str, ...],
  ) -> tuple[jax.Array, dict[str, jax.Array], jax.Array]:
    """(due, metrics (NaN when not due), the next due point in updates or seconds)."""
    if self.eval_fn is None:
      return jnp.asarray(False), {}, next_due
    if self.every_updates is not None:
      now, every = version.astype(jnp.float32), float(self.every_updates)
    else:
      now, every = time, self.every_time
    due = now >= next_due
    nan = {name: jnp.asarray(jnp.nan, jnp.float32) for name in names}
    metrics = jax.lax.cond(due, lambda: self.evaluate(params), lambda: nan)
    # The next multiple of the interval after now: several intervals crossed at once give one row.
    after = (jnp.floor(now / every) + 1.0) * every
    return due, metrics, jnp.where(due, after, next_due)


def _is_array(x: Any) -> bool:
  return isinstance(x, (jax.Array, np.ndarray))
