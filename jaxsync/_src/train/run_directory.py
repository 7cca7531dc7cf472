"""A run directory: created without clobbering, its JSON files, and the ``metrics.jsonl`` log.

Layout (``jaxsync train`` writes all of it)::

  RUN_DIR/
    config.yaml       the resolved config (what ``jaxsync resume`` rebuilds the run from)
    metrics.jsonl     one JSON object per line: kind "eval", "train" or "final"
    summary.json      the run's outcome
    checkpoints/      orbax checkpoints (jaxsync._src.checkpoints)
    tensorboard/      TensorBoard event files
    plots/            PNG plots
"""

from __future__ import annotations

import json
import math
import pathlib
import shutil
from typing import Any


class RunDirectoryError(ValueError):
  """A run directory that exists when it should not, or lacks what it should hold."""


def check_available(path: str | pathlib.Path, *, overwrite: bool = False) -> bool:
  """Raises :class:`RunDirectoryError` unless :func:`create` may use ``path``; True if it would replace it.

  Cheap, so a command checks it before minutes of set-up rather than after.
  """
  path = pathlib.Path(path)
  if path.exists() and (not path.is_dir() or any(path.iterdir())):
    if not overwrite:
      raise RunDirectoryError(
        f"run directory {str(path)!r} already exists and is not empty; choose another --out, "
        "continue it with `jaxsync resume`, or pass --overwrite to replace it."
      )
    if not (path / "config.yaml").is_file() or not any(
      (path / marker).exists() for marker in ("metrics.jsonl", "compare.json", "checkpoints")
    ):
      raise RunDirectoryError(
        f"--overwrite refused: {str(path)!r} does not look like a jaxsync run directory "
        "(config.yaml with metrics.jsonl, checkpoints/ or compare.json)."
      )
    return True
  return False


def create(path: str | pathlib.Path, *, overwrite: bool = False) -> pathlib.Path:
  """Creates the run directory ``path``; an existing non-empty one is an error unless ``overwrite``.

  With ``overwrite=True`` an existing directory is deleted first, and only if
  it looks like a run directory (holds ``config.yaml``), so a typo cannot wipe
  an unrelated folder.
  """
  path = pathlib.Path(path)
  if check_available(path, overwrite=overwrite):
    shutil.rmtree(path)
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as err:
    raise RunDirectoryError(
      f"run directory {str(path)!r} cannot be created: {err.strerror or err}."
    ) from None
  return path


def clean(value: Any) -> Any:
  """JSON-safe: NaN and Inf become None (JSON has no NaN), NumPy scalars become Python numbers."""
  if isinstance(value, dict):
    return {k: clean(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [clean(v) for v in value]
  if hasattr(value, "item") and not isinstance(value, (str, bytes)):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def write_json(path: pathlib.Path, data: dict[str, Any]) -> None:
  """Writes ``data`` as indented JSON, atomically (a temporary file renamed over ``path``)."""
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(json.dumps(clean(data), indent=2) + "\n")
  tmp.replace(path)


class MetricsLog:
  """``metrics.jsonl``: appended line by line, cut back to a checkpoint on resume.

  Every line carries ``event`` (events run so far), so the lines a resumed run
  keeps are exactly those written before its checkpoint, and the lines it
  writes next are those an uninterrupted run would have written.
  """

  def __init__(self, path: pathlib.Path):
    self.path = pathlib.Path(path)
    self._file = None

  def open(self, keep_until_event: int | None) -> None:
    """Opens for appending; keeps the lines with ``event <= keep_until_event`` (None: start empty)."""
    kept = []
    if keep_until_event is not None and self.path.exists():
      for line in self.path.read_text().splitlines():
        try:
          row = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill, after the checkpoint
          continue
        if row.get("kind") != "final" and row.get("event", math.inf) <= keep_until_event:
          kept.append(line)
    # Rewritten atomically: a kill mid-write must not lose the rows before the checkpoint.
    tmp = self.path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(self.path)
    self._file = self.path.open("a")

  def write(self, rows: list[dict[str, Any]]) -> None:
    """Appends ``rows`` and flushes them (before any checkpoint that covers them)."""
    for row in rows:
      self._file.write(json.dumps(clean(row)) + "\n")
    self._file.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None


class NullLog(MetricsLog):
  """A metrics log that writes nothing (the non-primary processes of a multi-process run)."""

  def __init__(self):
    pass

  def open(self, keep_until_event: int | None) -> None:
    pass

  def write(self, rows: list[dict[str, Any]]) -> None:
    pass

  def close(self) -> None:
    pass


def read_metrics(path: str | pathlib.Path) -> list[dict[str, Any]]:
  """The rows of a ``metrics.jsonl`` file."""
  return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]
