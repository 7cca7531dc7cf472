"""What a run writes while it trains: ``metrics.jsonl`` and TensorBoard, behind one ``write(rows)``.

A row is a dict with ``kind`` (``"eval"``, ``"train"`` or ``"final"``) and
``event`` (events run so far); :func:`eval_rows` and :func:`train_row` make
them from a chunk's :class:`EventRecord`. A resumed run cuts both logs back
to its checkpoint, so what follows is what an uninterrupted run would write.
"""

from __future__ import annotations

import math
import pathlib
import shutil
from typing import Any

import numpy as np

from jaxsync._src.steps.records import EventRecord
from jaxsync._src.train import run_directory


def time_key(clock: str) -> str:
  """The key a row gives its time: ``simulated_time`` (the simulator) or ``wall_time`` (a real run)."""
  return f"{clock}_time"


def row_time(row: dict[str, Any]) -> float:
  """A row's time, whatever its clock."""
  return row["simulated_time"] if "simulated_time" in row else row["wall_time"]


def eval_rows(rec: EventRecord, offset: int, clock: str = "simulated") -> list[dict[str, Any]]:
  """One ``\"eval\"`` row per evaluation in a chunk whose first event is ``offset + 1``."""
  rows = []
  for i in np.nonzero(rec.evaluated)[0]:
    row = {"kind": "eval", "event": offset + int(i) + 1, "updates": int(rec.version[i])}
    row[time_key(clock)] = float(rec.time[i])
    row.update({name: float(values[i]) for name, values in rec.metrics.items()})
    rows.append(row)
  return rows


def train_row(rec: EventRecord, offset: int, clock: str = "simulated") -> dict[str, Any]:
  """The chunk's ``\"train\"`` row: mean batch loss, staleness, rejections and k over its events."""
  ok = ~rec.rejected
  losses = rec.loss[ok & np.isfinite(rec.loss)].astype(np.float64)  # float32 sums overflow on divergence
  return {
    "kind": "train",
    "event": offset + len(rec.time),
    "updates": int(rec.version[-1]),
    time_key(clock): float(rec.time[-1]),
    "loss": float(losses.mean()) if losses.size else math.nan,
    "mean_staleness": float(rec.staleness[ok].mean()) if ok.any() else math.nan,
    "max_staleness": int(rec.staleness[ok].max()) if ok.any() else 0,
    "rejected": int(rec.rejected.sum()),
    "mean_k": float(rec.k[rec.released].mean()) if rec.released.any() else 0.0,
  }


class TensorBoardWriter:
  """Scalars for TensorBoard (tensorboardX, no TensorFlow); step = events, wall time = the run's clock.

  With TensorBoard's wall time set to the run's own seconds (simulated, or
  wall seconds since the run started), its "relative" axis reads the run's
  time. A resumed run purges what followed its checkpoint.
  """

  def __init__(self, log_dir: pathlib.Path, purge_step: int | None):
    from tensorboardX import SummaryWriter  # imported here: only the run directory needs it

    self.writer = SummaryWriter(logdir=str(log_dir), purge_step=purge_step, flush_secs=30)

  def write(self, rows: list[dict[str, Any]]) -> None:
    for row in rows:
      prefix = {"eval": "eval", "train": "train", "final": "final"}[row["kind"]]
      for name, value in row.items():
        if name in ("kind", "event") or not isinstance(value, (int, float)) or not math.isfinite(value):
          continue  # a diverged value stays in metrics.jsonl (as null); TensorBoard gets the finite ones
        self.writer.add_scalar(f"{prefix}/{name}", value, global_step=row["event"], walltime=row_time(row))
    self.writer.flush()

  def close(self) -> None:
    self.writer.close()


class RunWriters:
  """``metrics.jsonl`` and TensorBoard of one run, written together; nothing when not ``primary``.

  Args:
    run_dir: the run directory.
    resume_from: the checkpoint's event count (rows after it are dropped), or
      None for a run that starts from scratch (both logs start empty).
    primary: this process writes the run directory.
    tensorboard: also write TensorBoard events.
  """

  def __init__(self, run_dir: pathlib.Path, *, resume_from: int | None, primary: bool, tensorboard: bool):
    self.run_dir = pathlib.Path(run_dir)
    self._metrics = (
      run_directory.MetricsLog(self.run_dir / "metrics.jsonl") if primary else run_directory.NullLog()
    )
    self._metrics.open(keep_until_event=resume_from)
    self._board = None
    if tensorboard and primary:
      if not resume_from and (self.run_dir / "tensorboard").exists():  # a restart from scratch
        shutil.rmtree(self.run_dir / "tensorboard")
      # purge_step: TensorBoard drops steps >= it; the rows at `resume_from` were written before it.
      self._board = TensorBoardWriter(
        self.run_dir / "tensorboard", purge_step=resume_from + 1 if resume_from else None
      )

  def write(self, rows: list[dict[str, Any]]) -> None:
    """Appends ``rows`` to both logs (flushed, so a checkpoint never covers an unwritten row)."""
    self._metrics.write(rows)
    if self._board is not None:
      self._board.write(rows)

  def reopen(self, keep_until_event: int) -> None:
    """Reopens ``metrics.jsonl`` cut back to ``keep_until_event`` (before the final row)."""
    self._metrics.close()
    self._metrics.open(keep_until_event=keep_until_event)

  def close(self) -> None:
    self._metrics.close()
    if self._board is not None:
      self._board.close()
      self._board = None
