"""How a run reports while it trains: a live rich progress bar, JSON lines for scripts, or nothing."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from jaxsync._src.train.run_directory import clean

MODES = ("bar", "jsonl", "quiet")
# The columns of the bar's line when the stream is not a terminal (a log file, a CI log).
_LOG_WIDTH = 160
# The columns from which the bar's line has room for every word (label, bar, counts, fields, time left).
_WIDE = 140


class Reporter:
  """Silent reporter (``quiet``); the base of the others. Called on the host between compiled chunks."""

  def phase(self, text: str) -> None:
    """What the run is doing before (or between) its chunks: building, compiling."""

  def start(self, label: str, total_events: int, done_events: int) -> None:
    """A run (or its resumed remainder) begins; ``done_events`` of ``total_events`` are behind it."""

  def update(self, snapshot: dict[str, Any]) -> None:
    """After a chunk: ``event``, ``updates``, ``simulated_time`` (or ``wall_time``), ``loss`` (the chunk's
    mean batch loss), ``train_loss`` (the run's so far: the summary's ``final_train_loss`` at the end),
    ``rejected_so_far`` (non-finite arrivals), the last evaluation's metrics."""

  def finish(self, summary: dict[str, Any]) -> None:
    """The run ended with ``summary`` (what ``summary.json`` holds)."""

  def close(self) -> None:
    """The run stopped early (an error, Ctrl-C): leave the terminal clean."""


class JsonLinesReporter(Reporter):
  """One JSON object per line on ``stream``: ``{"kind": "start" | "progress" | "summary", ...}``."""

  def __init__(self, stream: TextIO | None = None):
    self.stream = stream or sys.stdout

  def _emit(self, kind: str, body: dict[str, Any]) -> None:
    # JSON has no NaN: a diverged loss is written as null.
    self.stream.write(json.dumps(clean({"kind": kind, **body})) + "\n")
    self.stream.flush()

  def start(self, label, total_events, done_events):
    self._emit("start", {"label": label, "total_events": total_events, "done_events": done_events})

  def update(self, snapshot):
    self._emit("progress", snapshot)

  def finish(self, summary):
    self._emit("summary", summary)


class BarReporter(Reporter):
  """A live rich progress bar (on stderr): strategy, events, time, updates, loss, accuracy, time left.

  Before the first chunk has run it says what is going on: a spinner while the
  run is built and its evaluation compiled, then ``compiling`` in the bar
  until the first chunk (whose compilation is most of its time) is done.
  """

  def __init__(self, stream: TextIO | None = None):
    from rich.console import Console  # imported here: only the bar needs rich

    stream = stream or sys.stderr
    # In a terminal the bar fits its width; in a log (not a terminal, where rich would assume 80 columns
    # and cut the line) it is one whole line.
    self.console = Console(file=stream, width=None if stream.isatty() else _LOG_WIDTH)
    self._progress = None
    self._spinner = None

  def phase(self, text):
    if self._progress is not None:
      self._progress.update(self._task, status=text)
      return
    if self._spinner is None:
      self._spinner = self.console.status(text)
      self._spinner.start()
    else:
      self._spinner.update(text)

  def _stop_spinner(self):
    if self._spinner is not None:
      self._spinner.stop()
      self._spinner = None

  def start(self, label, total_events, done_events):
    from rich import progress as rp

    self._stop_spinner()
    wide = self.console.width >= _WIDE
    self._progress = rp.Progress(
      rp.TextColumn("[bold]{task.description}"),
      rp.BarColumn(bar_width=40 if wide else 10),
      rp.MofNCompleteColumn(),
      rp.TextColumn(
        "{task.fields[status]}{task.fields[clock]} {task.fields[time]} upd {task.fields[updates]} "
        "train loss {task.fields[loss]} test acc {task.fields[acc]}{task.fields[rejected]}"
        if wide  # a narrow terminal: the numbers, fewer words
        else "{task.fields[status]}{task.fields[time]} loss {task.fields[loss]} acc {task.fields[acc]}"
        "{task.fields[rejected]}"
      ),
      rp.TimeRemainingColumn(),
      console=self.console,
      transient=False,
    )
    self._progress.start()
    self._task = self._progress.add_task(
      label,
      total=total_events,
      completed=done_events,
      status="compiling ",
      clock="",
      time="",
      updates=0,
      loss="-",
      acc="-",
      rejected="",
    )

  def update(self, snapshot):
    acc = snapshot.get("accuracy")
    self._progress.update(
      self._task,
      completed=snapshot["event"],
      status="",
      clock="sim" if "simulated_time" in snapshot else "wall",
      time=f"{snapshot.get('simulated_time', snapshot.get('wall_time', 0.0)):.1f}s",
      updates=snapshot["updates"],
      loss=_short(snapshot.get("train_loss"), "{:.3g}"),
      acc=_short(acc, "{:.3f}"),
      rejected=f" rejected {snapshot['rejected_so_far']}" if snapshot.get("rejected_so_far") else "",
    )

  def finish(self, summary):
    self.close()

  def close(self):
    self._stop_spinner()
    if self._progress is not None:
      self._progress.stop()  # ends the bar's line: what follows starts on a new one
      self._progress = None


def _short(value: Any, form: str) -> str:
  return "-" if value is None else form.format(value)


def make(mode: str) -> Reporter:
  """The reporter for ``mode`` in :data:`MODES`."""
  if mode == "bar":
    return BarReporter()
  if mode == "jsonl":
    return JsonLinesReporter()
  if mode == "quiet":
    return Reporter()
  raise ValueError(f"progress: mode={mode!r} is invalid; expected one of {', '.join(MODES)}.")
