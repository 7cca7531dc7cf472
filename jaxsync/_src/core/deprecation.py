"""Old names of renamed state fields, readable for one release with a warning."""

from __future__ import annotations

import warnings


def renamed_field(old: str, new: str) -> property:
  """A read-only property ``old`` of a state ``NamedTuple`` that warns and returns the field ``new``.

  State fields that shared a name with a hyperparameter (``momentum``) were
  renamed, because optax's ``tree.get`` / ``tree.set`` address a state's
  leaves by name: under ``optax.inject_hyperparams``, ``tree.set(state,
  momentum=0.5)`` would have written the scalar over the momentum buffer. The
  old attribute keeps working for reading; it is not a field, so optax's tree
  utilities never see it.

  Args:
    old: the former field name.
    new: the field that replaced it.

  Returns:
    A property for the state's class body.

  Example:
    >>> from typing import NamedTuple
    >>> class S(NamedTuple):
    ...   momentum_buffer: float
    ...   momentum = renamed_field("momentum", "momentum_buffer")
  """

  def read(self):
    warnings.warn(
      f"{type(self).__name__}.{old} was renamed {new} (a state field must not share a hyperparameter's "
      f"name, which optax.tree.get and optax.tree.set would confuse); read {new}.",
      DeprecationWarning,
      stacklevel=2,
    )
    return getattr(self, new)

  return property(read, doc=f"Deprecated: the field ``{new}``.")
