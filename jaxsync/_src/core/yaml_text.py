"""YAML read the way people write numbers (YAML 1.2's floats), for configs and the files beside them."""

from __future__ import annotations

import re
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
  """PyYAML's safe loader, reading numbers the way people write them.

  PyYAML follows YAML 1.1, where ``1e-3`` and ``1.0e3`` (an exponent without
  a dot, or without a sign) are strings; YAML 1.2 and every programming
  language read them as numbers, and so does this loader: ``1e-3``, ``1E-3``,
  ``1.5e3``, ``.5`` and ``1_000`` are numbers in configs and ``--set`` values.
  """


_Loader.add_implicit_resolver(
  "tag:yaml.org,2002:float",
  re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
  list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
  """YAML text as plain data, numbers read as in YAML 1.2 (see :class:`_Loader`)."""
  return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
