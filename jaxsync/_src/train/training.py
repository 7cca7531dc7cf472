"""Training into a run directory: compiled chunks, metrics, TensorBoard, checkpoints, resume, plots.

The host loop around :class:`jaxsync.sim.Simulator`: it advances the run in
chunks of ``log_every`` events, and between chunks (outside ``jit``) writes
the chunk's metrics, reports progress and, every ``checkpoint_every`` events,
saves the whole state with orbax. A run directory that already holds a
checkpoint is continued from it: chunked advancing equals one long call bit
for bit, so a run killed at any moment and continued ends with exactly the
parameters, history and metrics of an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import shutil
import time
from typing import Any

import jax
import numpy as np
import optax

from jaxsync._src.core import validation
from jaxsync._src.sim.simulator import History, Simulator
from jaxsync._src.steps.records import EventRecord
from jaxsync._src.train import plots, run_directory
from jaxsync._src.train.checkpoints import RunCheckpoints
from jaxsync._src.train.progress import Reporter

_WHAT = "train"


class EmptyRunError(ValueError):
  """A run in which no event could run (``max_time`` before the first event)."""


@dataclasses.dataclass
class RunResult:
  """What :func:`train` returns: the final parameters, the history, the summary and where it all is."""

  params: optax.Params
  history: History
  summary: dict[str, Any]
  run_dir: pathlib.Path


def _eval_rows(rec: EventRecord, offset: int) -> list[dict[str, Any]]:
  rows = []
  for i in np.nonzero(rec.evaluated)[0]:
    row = {"kind": "eval", "event": offset + int(i) + 1, "updates": int(rec.version[i])}
    row["simulated_time"] = float(rec.time[i])
    row.update({name: float(values[i]) for name, values in rec.metrics.items()})
    rows.append(row)
  return rows


def _train_row(rec: EventRecord, offset: int) -> dict[str, Any]:
  ok = ~rec.rejected
  losses = rec.loss[ok & np.isfinite(rec.loss)].astype(np.float64)  # float32 sums overflow on divergence
  return {
    "kind": "train",
    "event": offset + len(rec.time),
    "updates": int(rec.version[-1]),
    "simulated_time": float(rec.time[-1]),
    "loss": float(losses.mean()) if losses.size else math.nan,
    "mean_staleness": float(rec.staleness[ok].mean()) if ok.any() else math.nan,
    "max_staleness": int(rec.staleness[ok].max()) if ok.any() else 0,
    "rejected": int(rec.rejected.sum()),
    "mean_k": float(rec.k[rec.released].mean()) if rec.released.any() else 0.0,
  }


def summarize(
  history: History,
  final_metrics: dict[str, float],
  *,
  target: tuple[str, float] | None,
  stopped_by: str,
) -> dict[str, Any]:
  """The run's outcome: final metrics, time and updates to ``target``, staleness, bytes moved."""
  summary: dict[str, Any] = {
    "events": len(history.time),
    "updates": history.updates,
    "gradients": int(history.worker_steps.sum()),
    "simulated_time": history.simulated_time,
    "stopped_by": stopped_by,
  }
  summary.update({f"final_{name}": value for name, value in final_metrics.items()})
  # The training loss the papers tabulate: the mean batch loss of the last 10% of the events.
  tail = max(1, len(history.loss) // 10)
  losses = np.asarray(history.loss[-tail:])[~np.asarray(history.rejected[-tail:], bool)]
  summary["final_train_loss"] = float(losses.mean()) if losses.size and np.isfinite(losses).all() else None
  accuracies = [*history.eval_metrics.get("accuracy", []), final_metrics.get("accuracy", np.nan)]
  if np.isfinite(accuracies).any():  # the final evaluation counts too
    summary["best_accuracy"] = float(np.nanmax(accuracies))
  if target is not None:
    metric, value = target
    hit = (
      history.time_to(metric, value, higher_is_better=metric != "loss")
      if metric in history.eval_metrics
      else None
    )
    summary["target"] = {"metric": metric, "value": value}
    summary["time_to_target"] = hit[0] if hit else None
    summary["updates_to_target"] = hit[1] if hit else None
  accepted = history.staleness[~history.rejected]
  summary.update(
    mean_staleness=history.mean_staleness(),
    max_staleness=int(accepted.max()) if accepted.size else 0,
    bytes_moved=history.bytes_moved,
    bytes_moved_intra=history.bytes_moved_intra,
    rejected=history.rejected_count,
  )
  return summary


class _TensorBoard:
  """Scalars for TensorBoard (tensorboardX, no TensorFlow); step = events, wall time = simulated seconds.

  With the wall time set to simulated seconds, TensorBoard's "relative" axis
  reads simulated time. A resumed run purges what followed its checkpoint.
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
        self.writer.add_scalar(
          f"{prefix}/{name}", value, global_step=row["event"], walltime=row["simulated_time"]
        )
    self.writer.flush()

  def close(self) -> None:
    self.writer.close()


def train(
  simulator: Simulator,
  params: optax.Params,
  run_dir: str | pathlib.Path,
  *,
  num_events: int,
  seed: int = 0,
  log_every: int = 500,
  checkpoint_every: int | None = None,
  max_time: float | None = None,
  target: tuple[str, float] | None = ("accuracy", 0.9),
  label: str = "",
  reporter: Reporter | None = None,
  tensorboard: bool = True,
  make_plots: bool = True,
  primary: bool = True,
) -> RunResult:
  """Trains (or continues training) a simulated run into ``run_dir``.

  If ``run_dir/checkpoints`` holds a checkpoint, the run continues from it
  (``params`` and ``seed`` then only give the structure to restore into and
  must be those of the original run); otherwise it starts from ``params``.
  ``metrics.jsonl`` is cut back to the checkpoint and continued.

  Args:
    simulator: the strategy, model, data and time model (with its ``eval_fn``).
    params: the initial parameters.
    run_dir: an existing directory (see :func:`run_directory.create`).
    num_events: events (arrivals, or synchronous rounds) in the whole run.
    seed: the jitter seed.
    log_every: events per compiled chunk and per ``"train"`` metrics line.
    checkpoint_every: save every this many events (a multiple of
      ``log_every``); a final checkpoint is always saved.
    max_time: stop at this simulated time instead.
    target: ``(metric, value)`` for the time-to-target in the summary.
    label: the progress bar's label.
    reporter: progress reporting (default: silent).
    tensorboard, make_plots: write TensorBoard events / PNG plots.
    primary: this process writes the run directory. The other processes of
      a multi-process synchronous run pass False: they run the same chunks,
      restore from the same checkpoint and write nothing.

  Returns:
    A :class:`RunResult`.

  Example:
    >>> import tempfile, jax.numpy as jnp, numpy as np, jaxsync
    >>> from jaxsync._src.train.training import train
    >>> x = np.linspace(-1, 1, 64, dtype=np.float32)
    >>> data = jaxsync.sim.WorkerData({"x": x, "y": 3 * x}, num_workers=4, batch_size=8)
    >>> loss = lambda w, b: jnp.mean((w * b["x"] - b["y"]) ** 2)
    >>> sim = jaxsync.sim.Simulator(jaxsync.strategies.make("asp", 4, learning_rate=0.5), loss, data,
    ...   jaxsync.sim.TimeModel(num_workers=4), eval_fn=lambda w: {"loss": loss(w, data.arrays)}, eval_every=50)
    >>> result = train(sim, jnp.zeros([]), tempfile.mkdtemp(), num_events=200, log_every=100,
    ...   target=("loss", 1e-3), tensorboard=False, make_plots=False)
    >>> round(float(result.params), 3), result.summary["updates"]
    (3.0, 200)
  """
  num_events = validation.check_int(_WHAT, "num_events", num_events)
  log_every = validation.check_int(_WHAT, "log_every", log_every)
  if checkpoint_every is not None:
    checkpoint_every = validation.check_int(_WHAT, "checkpoint_every", checkpoint_every)
    if checkpoint_every % log_every:
      raise validation.invalid(
        _WHAT, "checkpoint_every", checkpoint_every, f"a multiple of log_every={log_every}"
      )
  run_dir = pathlib.Path(run_dir)
  reporter = reporter or Reporter()
  start_wall = time.perf_counter()

  checkpoints = RunCheckpoints(run_dir / "checkpoints", read_only=not primary)
  state = simulator.init(params, seed)
  metrics_log = run_directory.MetricsLog(run_dir / "metrics.jsonl") if primary else run_directory.NullLog()
  tensorboard = tensorboard and primary
  if checkpoints.latest_step() is not None:
    state, restored, progress = checkpoints.restore(state)
    done, records = progress["events"], [restored]
    initial_metrics, wall_before, finished = (
      progress["initial_metrics"],
      progress["wall_seconds"],
      progress["finished"],
    )
    metrics_log.open(keep_until_event=done)
  else:
    done, records, wall_before, finished = 0, [], 0.0, False
    initial_metrics = simulator.initial_metrics
    metrics_log.open(keep_until_event=None)
    first = {"kind": "eval", "event": 0, "updates": 0, "simulated_time": 0.0, **initial_metrics}
    metrics_log.write([first] if initial_metrics else [])
  if (
    primary and done == 0 and (run_dir / "tensorboard").exists()
  ):  # a restart from scratch: drop the old events
    shutil.rmtree(run_dir / "tensorboard")
  # purge_step: TensorBoard drops steps >= it; the rows at `done` were written before the checkpoint.
  board = (
    _TensorBoard(run_dir / "tensorboard", purge_step=done + 1 if done else None) if tensorboard else None
  )
  if board is not None and done == 0 and initial_metrics:
    board.write([{"kind": "eval", "event": 0, "updates": 0, "simulated_time": 0.0, **initial_metrics}])

  def progress_record(stopped_by):
    return {
      "initial_metrics": initial_metrics,
      "wall_seconds": wall_before + time.perf_counter() - start_wall,
      "finished": stopped_by is not None,
      "stopped_by": stopped_by,
    }

  def all_records():
    return jax.tree.map(lambda *xs: np.concatenate(xs), *records)

  reporter.start(label, num_events, done)
  stopped_by = progress.get("stopped_by") if finished else None
  last_eval: dict[str, float] = dict(initial_metrics)
  try:
    while stopped_by is None:
      before, n = done, min(log_every, num_events - done)
      state, rec = simulator.advance(state, n, max_time=max_time)
      rec = jax.tree.map(np.asarray, rec)
      ran = len(rec.time)
      if ran:
        rows = _eval_rows(rec, done) + [_train_row(rec, done)]
        metrics_log.write(rows)
        if board is not None:
          board.write(rows)
        records.append(rec)
        done += ran
        evals = [r for r in rows if r["kind"] == "eval"]
        if evals:
          last_eval = {
            k: v for k, v in evals[-1].items() if k not in ("kind", "event", "updates", "simulated_time")
          }
        snapshot = {k: v for k, v in rows[-1].items() if k != "kind"}  # the train row: loss is the batch loss
        reporter.update({**snapshot, **{k: v for k, v in last_eval.items() if k != "loss"}})
      if ran < n:
        stopped_by = "max_time"
      elif done >= num_events:
        stopped_by = "events"
      if not records:
        raise EmptyRunError(
          f"train: max_time={max_time!r} is invalid; expected a simulated time after the first event "
          "(no event ran)."
        )
      if primary and (
        stopped_by is not None or (checkpoint_every and done // checkpoint_every > before // checkpoint_every)
      ):
        # A chunk that ran nothing (max_time hit on a chunk boundary) re-saves the same step as finished.
        checkpoints.save(done, state, all_records(), progress_record(stopped_by))
  finally:
    metrics_log.close()

  history = simulator.history(records, state, initial_metrics=initial_metrics)
  final_params = state.params
  final_metrics = simulator.evaluate(final_params)
  summary = {"label": label, **summarize(history, final_metrics, target=target, stopped_by=stopped_by)}
  summary["wall_seconds"] = wall_before + time.perf_counter() - start_wall
  final_row = {
    "kind": "final",
    "event": done,
    "updates": history.updates,
    "simulated_time": history.simulated_time,
  }
  metrics_log.open(keep_until_event=done)
  metrics_log.write([{**final_row, **final_metrics}])
  metrics_log.close()
  if board is not None:
    board.write([{**final_row, **final_metrics}])
    board.close()
  if primary:
    run_directory.write_json(run_dir / "summary.json", summary)
  if make_plots and primary:
    plots.plot_run(history, run_dir / "plots", label=label)
  checkpoints.close()
  reporter.finish(summary)
  return RunResult(params=final_params, history=history, summary=summary, run_dir=run_dir)
