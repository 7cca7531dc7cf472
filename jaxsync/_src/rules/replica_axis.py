"""Decisions every replica takes alike: a rule run per replica inside ``shard_map``, synchronized over a mesh axis."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxsync._src.core import validation


def axis_names(rule: str, axis_name: Any) -> tuple[str, ...]:
  """``axis_name`` as a tuple of names, checked to be mesh axes bound (manual) where the update runs.

  Returns:
    Every manual axis of the enclosing ``shard_map``: the decisions that could
    differ between its devices (a local non-finite check) are reduced over all
    of them, the replica axis and any other the caller made manual.

  Raises:
    ValueError: when an axis is not bound here (the update is not traced inside
      a ``shard_map`` over it).
  """
  names = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
  if not names or not all(isinstance(n, str) for n in names):
    raise validation.invalid(rule, "axis_name", axis_name, "a mesh axis name (a str) or a tuple of them")
  manual = tuple(jax.sharding.get_abstract_mesh().manual_axes)
  for name in names:
    try:
      lax.axis_size(name)
    except NameError:
      where = f"the manual axes here are {manual}" if manual else "no axis is bound here"
      raise validation.invalid(
        rule,
        "axis_name",
        axis_name,
        f"an axis bound where the update runs: call the update inside jax.shard_map over a mesh with that "
        f"axis (among its axis_names); {where}",
      ) from None
  return tuple(dict.fromkeys(manual + names))


def all_agree(flag: Any, axes: tuple[str, ...]) -> jax.Array:
  """True on every device when ``flag`` is true on every device of ``axes``: one decision, taken alike."""
  refusals = lax.psum(jnp.logical_not(jnp.asarray(flag)).astype(jnp.int32), axes)
  return refusals == 0


def varying(tree: Any, axes: tuple[str, ...]) -> Any:
  """Each leaf typed as varying over ``axes`` (what ``shard_map`` asks of both branches of a ``lax.cond``)."""

  def cast(x):
    missing = tuple(a for a in axes if a not in jax.typeof(x).manual_axis_type.varying)
    return lax.pcast(x, missing, to="varying") if missing else x

  return jax.tree.map(cast, tree)


def mean(tree: Any, axis_name: Any) -> Any:
  """The mean over the replica axis (``lax.pmean``): DiLoCo's average of the pseudo-gradients."""
  return lax.pmean(tree, axis_name)
