"""Named builders of one kind (models, datasets), added with a decorator and looked up with a checked name."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from jaxsync._src.core import import_path, validation
from jaxsync._src.core.suggestions import did_you_mean

T = TypeVar("T", bound=Callable)


class Registry(Mapping[str, T]):
  """A read-only mapping from name to builder, in registration order; :meth:`register` adds one.

  Iterating it gives the names (``name in registry``, ``", ".join(registry)``),
  so a check of a config's name against it sees the builders a user registered.

  Args:
    what: the kind of builder, the prefix of every error message (``"models"``).

  Example:
    >>> from jaxsync._src.core.registry import Registry
    >>> shapes = Registry("shapes")
    >>> @shapes.register("square")
    ... def square(side):
    ...   return side * side
    >>> list(shapes), shapes.lookup("square")(3)
    (['square'], 9)
  """

  def __init__(self, what: str):
    self._what = what
    self._builders: dict[str, T] = {}

  def register(self, name: str) -> Callable[[T], T]:
    """A decorator that registers its function under ``name`` and returns it unchanged.

    Args:
      name: a non-empty name, not registered yet.

    Returns:
      The decorator.
    """
    if not isinstance(name, str) or not name:
      raise validation.invalid(self._what, "name", name, "a non-empty string")
    if name in self._builders:
      raise validation.invalid(
        self._what, "name", name, f"a name not registered yet (registered: {', '.join(self._builders)})"
      )

    def add(builder: T) -> T:
      self._builders[name] = builder
      return builder

    return add

  def lookup(self, name: str, key: str = "name") -> T:
    """The builder registered under ``name``, or the one ``name = "module:attribute"`` imports.

    A registered name wins; ``module:attribute`` imports the module (found as Python finds it:
    the current directory, ``PYTHONPATH``, installed packages). Anything else is a ``ValueError``
    listing the registered names.

    Args:
      name: a registered name, or ``module:attribute``.
      key: the argument or config key the name came from, for the error message.
    """
    if name in self._builders:
      return self._builders[name]
    if import_path.is_import_path(name):
      return import_path.resolve(self._what, key, name)
    options = ", ".join(repr(o) for o in self._builders)
    raise validation.invalid(
      self._what,
      key,
      name,
      f"one of {options}, or module:attribute naming your own (mymodule:build)"
      + did_you_mean(name, tuple(self._builders)),
    )

  def __getitem__(self, name: str) -> T:
    return self._builders[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._builders)

  def __len__(self) -> int:
    return len(self._builders)

  def __repr__(self) -> str:
    return f"<{self._what} registry: {', '.join(self._builders)}>"
