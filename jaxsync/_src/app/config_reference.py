"""The config reference: every key of a config with its type, default and meaning (``jaxsync config``).

Read from the config dataclasses themselves (:mod:`config`), so the reference cannot drift from what a
config accepts; the documentation's config page is :func:`reference_markdown`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import yaml

from jaxsync._src.app.config import Config, type_name


@dataclasses.dataclass(frozen=True)
class KeyReference:
  """One config key: its dotted name, type, default and meaning."""

  key: str
  type: str
  default: str
  meaning: str


def _type_words(hint: Any) -> str:
  origin = typing.get_origin(hint)
  if origin in (typing.Union, types.UnionType):
    options = [o for o in typing.get_args(hint) if o is not type(None)]
    words = " or ".join(_type_words(o) for o in options)
    return f"{words} or null" if type(None) in typing.get_args(hint) else words
  if origin is list:
    return f"list of {_type_words(typing.get_args(hint)[0])}s"
  if origin is dict:
    return "mapping"
  if dataclasses.is_dataclass(hint):
    return f"mapping {{{', '.join(f.name for f in dataclasses.fields(hint))}}}"
  return {int: "integer", float: "number", str: "string", bool: "true/false"}.get(hint, type_name(hint))


def _yaml_value(value: Any) -> str:
  if isinstance(value, float):
    return f"{value:g}"  # 1e+11, not 100000000000.0
  return yaml.safe_dump(value, default_flow_style=True, width=1_000).strip().removesuffix("...").strip()


def reference(cls: type = Config, prefix: str = "") -> list[KeyReference]:
  """Every key of a config (sections first, then their keys), with its type, default and meaning."""
  hints = typing.get_type_hints(cls)
  keys = []
  for field in dataclasses.fields(cls):
    key, hint = f"{prefix}{field.name}", hints[field.name]
    default = field.default_factory() if field.default is dataclasses.MISSING else field.default
    if dataclasses.is_dataclass(hint):
      keys.append(KeyReference(key, "section", "", field.metadata["meaning"]))
      keys += reference(hint, f"{key}.")
    else:
      keys.append(KeyReference(key, _type_words(hint), _yaml_value(default), field.metadata["meaning"]))
  return keys


def reference_text() -> str:
  """The reference as aligned text, one key per line under its section (``jaxsync config``)."""
  rows = reference()
  width = max(len(r.key) for r in rows) + 2
  lines = []
  for r in rows:
    if r.type == "section":
      lines += ["", f"{r.key}: {r.meaning}"]
    else:
      lines.append(f"  {r.key:<{width}}{r.default:<10} {r.type}: {r.meaning}")
  return "\n".join(lines).lstrip("\n") + "\n"


def reference_markdown() -> str:
  """The reference as a Markdown table per section (the documentation's config page)."""
  out = []
  for r in reference():
    if r.type == "section":
      out += ["", f"### `{r.key}`", "", f"{r.meaning[0].upper()}{r.meaning[1:]}.", ""]
      out += ["| key | default | type | meaning |", "|---|---|---|---|"]
    else:
      if not out:  # the top-level keys, before any section
        out += ["| key | default | type | meaning |", "|---|---|---|---|"]
      meaning = r.meaning.replace("|", "\\|")
      out.append(f"| `{r.key}` | `{r.default}` | {r.type} | {meaning} |")
  return "\n".join(out).strip() + "\n"
