"""Names of a user's own code, ``module:attribute``, found as Python finds modules and imported on demand.

A config's ``model.name: mymodels:ResNetBN`` (or ``data.name: mydata:load``)
names an attribute of an importable module: a file in the current directory,
a module on ``PYTHONPATH``, or an installed package. Every process jaxsync
starts builds its run from the config, so each imports the module itself;
nothing has to be registered first.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def is_import_path(name: Any) -> bool:
  """Whether ``name`` is ``module:attribute`` (a dotted module, a colon, a dotted attribute)."""
  if not isinstance(name, str) or name.count(":") != 1:
    return False
  module, attribute = name.split(":")
  parts = module.split(".") + attribute.split(".")
  return all(p.isidentifier() for p in parts)


def _ensure_current_directory_on_path() -> None:
  # `jaxsync` is a console script: its sys.path starts at the script's folder, not the current
  # directory that `python -m` and an interactive session put first. A user's module beside their
  # config must be found the same way from either.
  here = os.getcwd()
  if here not in sys.path and "" not in sys.path:
    sys.path.insert(0, here)


def resolve(what: str, key: str, name: str) -> Any:
  """The attribute ``name = "module:attribute"`` names, imported now; a one-line ``ValueError`` otherwise.

  Args:
    what: the prefix of the error message (``"models"``).
    key: the argument or config key that gave the name (``"name"``, ``"model.name"``).
    name: ``module:attribute``.

  Returns:
    The attribute.

  Raises:
    ValueError: the module cannot be found or raises on import, or it has no such attribute; the
      message names the module, the error and where Python looked.
  """
  module_name, attribute = name.split(":")
  _ensure_current_directory_on_path()
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as err:
    if err.name is not None and (err.name == module_name or module_name.startswith(err.name + ".")):
      raise ValueError(
        f"{what}: {key}={name!r} is invalid: no module named {err.name!r} in the current directory "
        f"({os.getcwd()}), on PYTHONPATH or among the installed packages; expected module:attribute of "
        "an importable module."
      ) from None
    raise ValueError(f"{what}: {key}={name!r}: importing {module_name!r} failed: {err}") from None
  except Exception as err:  # the user's module raised while it was imported
    raise ValueError(
      f"{what}: {key}={name!r}: importing {module_name!r} raised {type(err).__name__}: {err}"
    ) from None
  found: Any = module
  where = f"module {module_name!r} ({getattr(module, '__file__', '?')})"
  for part in attribute.split("."):
    if not hasattr(found, part):
      public = sorted(n for n in dir(found) if not n.startswith("_"))
      shown = ", ".join(public[:12]) + (", ..." if len(public) > 12 else "")
      raise ValueError(
        f"{what}: {key}={name!r} is invalid: {where} has no attribute {part!r}; it has "
        f"{shown or 'no public names'}."
      )
    found, where = getattr(found, part), f"{where}.{part}"
  return found
