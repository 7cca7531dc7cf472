"""Which workers a synchronous run had, and from which round: the record of a run that shrinks and grows.

``jaxsync launch --min-workers M`` restarts the survivors of a synchronous run
as a smaller run when a process is lost, and the full run again when a
replacement arrives (:mod:`launch`). Every such change is one line of
``RUN_DIR/membership.jsonl``, written by the launcher before the new processes
start, and read by each of them: the config they build (:mod:`jaxsync._src.app.resize`)
and the checkpoint they restore into their own number of workers
(:func:`row_sources`, ``SyncRuntime``) come from it.

A line is a :class:`Segment`: from round ``from_event`` on, ``workers``
workers, where worker ``j`` continues what worker ``kept[j]`` of the segment
before held (``None``: a joining worker, which starts from the global model
with a fresh optimizer state). The first segment, the config's, is not
written: a run directory without the file never changed size. What a size
means for the batch and the learning rate is the config's to say, not the
record's.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Sequence
from typing import NamedTuple

MEMBERSHIP_FILE = "membership.jsonl"


class Segment(NamedTuple):
  """A stretch of a synchronous run with one set of workers.

  Attributes:
    from_event: the round it starts at (the checkpoint it resumed from).
    workers: its number of workers.
    kept: for each of its workers, the index of the worker of the previous
      segment it continues, or None for a joining worker (``None`` for the
      first segment: nothing came before).
  """

  from_event: int
  workers: int
  kept: tuple[int | None, ...] | None = None


def read(run_dir: str | pathlib.Path, workers: int) -> list[Segment]:
  """The run's segments, the first (from its config's ``workers``) included."""
  path = pathlib.Path(run_dir) / MEMBERSHIP_FILE
  segments = [Segment(0, workers)]
  if not path.is_file():
    return segments
  for n, line in enumerate(path.read_text().splitlines(), start=1):
    try:
      raw = json.loads(line)
      segments.append(Segment(int(raw["from_event"]), int(raw["workers"]), tuple(raw["kept"])))
    except (ValueError, KeyError, TypeError) as err:
      raise ValueError(
        f"{path}:{n}: {line[:200]!r} is not a membership record ({err}); expected "
        '{"from_event": R, "workers": K, "kept": [...]}, as jaxsync launch writes it.'
      ) from None
    check(segments[-2], segments[-1], f"{path}:{n}")
  return segments


def check(before: Segment, after: Segment, where: str = "membership") -> Segment:
  """Raises ValueError unless ``after`` can follow ``before``; returns ``after``."""
  kept = after.kept or ()
  problem = None
  if after.workers < 1 or len(kept) != after.workers:
    problem = f"workers={after.workers} with {len(kept)} kept entries; expected workers >= 1, one entry each"
  elif after.from_event < before.from_event:
    problem = f"from_event={after.from_event} before the previous segment's {before.from_event}"
  elif any(k is not None and not 0 <= k < before.workers for k in kept):
    problem = f"kept={list(kept)}; expected indices of the {before.workers} workers before, or null"
  elif len({k for k in kept if k is not None}) != sum(k is not None for k in kept):
    problem = f"kept={list(kept)} names a worker twice"
  if problem:
    raise ValueError(f"{where}: {problem}.")
  return after


def append(run_dir: str | pathlib.Path, segment: Segment, **note) -> None:
  """Adds ``segment`` to the run's record (with ``note``'s keys, e.g. why, for people)."""
  entry = {**segment._asdict(), "kept": list(segment.kept or ()), "time": time.time(), **note}
  with open(pathlib.Path(run_dir) / MEMBERSHIP_FILE, "a") as f:
    f.write(json.dumps(entry) + "\n")


def row_sources(segments: Sequence[Segment], since: int) -> list[int | None]:
  """For each worker of the last segment, the worker of segment ``since`` whose state it continues.

  ``None`` marks a worker that joined after segment ``since`` (a fresh start
  from the global model). The mappings of the segments after ``since`` are
  followed one after another.

  Example:
    >>> full = Segment(0, 3)
    >>> shrunk = Segment(100, 2, kept=(0, 2))  # worker 1 lost
    >>> grown = Segment(250, 3, kept=(0, 1, None))  # a replacement joins
    >>> row_sources([full, shrunk, grown], since=0)
    [0, 2, None]
  """
  if not 0 <= since < len(segments):
    raise ValueError(
      f"row_sources: since={since} is invalid; expected a segment index in [0, {len(segments)})."
    )
  sources: list[int | None] = list(range(segments[since].workers))
  for segment in segments[since + 1 :]:
    sources = [None if k is None else sources[k] for k in segment.kept]
  return sources
