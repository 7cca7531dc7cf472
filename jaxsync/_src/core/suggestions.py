"""Suggestions for a mistyped name: the closest valid one, for every error that lists the valid names.

Free of JAX and numpy, so that the config layer can suggest without importing them (``jaxsync --help``
stays fast).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any


def did_you_mean(value: Any, options: Sequence[str]) -> str:
  """`` (did you mean 'ormo'?)`` when ``value`` is a string close to one of ``options``; else ``""``.

  Example:
    >>> did_you_mean("ormoo", ("asp", "ormo", "ormo_da"))
    " (did you mean 'ormo'?)"
  """
  if not isinstance(value, str):
    return ""
  close = difflib.get_close_matches(value, list(options), n=1, cutoff=0.6)
  if not close:  # a case slip (ORMO) or a hyphen for an underscore (ormo-da) is close too
    folded = {o.lower().replace("-", "_"): o for o in options}
    close = [folded[k] for k in difflib.get_close_matches(value.lower().replace("-", "_"), list(folded), n=1)]
  return f" (did you mean {close[0]!r}?)" if close else ""
