"""Training into a run directory: compiled chunks, metrics, TensorBoard, checkpoints, resume, plots.

The host loop around any :class:`Runtime` (the simulator, the parameter
server, the synchronous multi-process loop): it advances the run in chunks of
``log_every`` events, and between chunks (outside ``jit``) writes the chunk's
metrics, reports progress and, every ``checkpoint_every`` events, saves the
whole state with orbax. A run directory that already holds a checkpoint is
continued from it: chunked advancing equals one long call bit for bit, so a
run killed at any moment and continued ends with exactly the parameters,
history and metrics of an uninterrupted run.

:func:`train` reads as its four steps: :func:`_restore_or_start`,
:func:`_run_chunks`, then :func:`_finish` (history, final evaluation, summary,
plots), with :class:`RunWriters` behind every row written.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsync._src.core import validation
from jaxsync._src.interface.history import History
from jaxsync._src.interface.runtime import FaultAfterProgress, PreemptedError, Runtime
from jaxsync._src.steps.records import EventRecord
from jaxsync._src.train import plots, run_directory
from jaxsync._src.train.checkpoints import RunCheckpoints, fingerprint, save_model
from jaxsync._src.train.progress import Reporter
from jaxsync._src.train.summary import summarize, train_loss
from jaxsync._src.train.writers import RunWriters, eval_rows, time_key, train_row

log = logging.getLogger("jaxsync.train")
_WHAT = "train"
_ROW_KEYS = ("kind", "event", "updates", "simulated_time", "wall_time")


class EmptyRunError(ValueError):
  """A run in which no event could run (``max_time`` before the first event)."""


@dataclasses.dataclass
class RunResult:
  """What :func:`train` returns: the final parameters, the history, the summary and where it all is."""

  params: optax.Params
  history: History
  summary: dict[str, Any]
  run_dir: pathlib.Path


class _Progress(NamedTuple):
  """Where a run stands: its state, the records so far, and what its checkpoints remember."""

  state: Any
  records: list[EventRecord]
  done: int
  initial_metrics: dict[str, float]
  wall_before: float
  stopped_by: str | None


def _first_row(initial_metrics: dict[str, float], clock: str) -> list[dict[str, Any]]:
  """The evaluation of the initial model (none without metrics)."""
  if not initial_metrics:
    return []
  return [{"kind": "eval", "event": 0, "updates": 0, time_key(clock): 0.0, **initial_metrics}]


def _restore_or_start(runtime: Runtime, params, seed: int, checkpoints: RunCheckpoints) -> _Progress:
  """The run's latest checkpoint, or its start from ``params``."""
  state = runtime.init(params, seed)
  if checkpoints.latest_step() is None:
    return _Progress(state, [], 0, runtime.initial_metrics, 0.0, None)
  like, convert = _restorable(runtime, state, checkpoints)
  saved_state, records, saved = checkpoints.restore(like)
  return _Progress(
    runtime.restored_state(convert(saved_state)),
    [records],
    saved["events"],
    saved["initial_metrics"],
    saved["wall_seconds"],
    saved.get("stopped_by") if saved["finished"] else None,
  )


def _restorable(runtime: Runtime, state, checkpoints: RunCheckpoints) -> tuple[Any, Callable[[Any], Any]]:
  """The state the latest checkpoint restores into, and what makes it this run's.

  A checkpoint of this run's own shape restores as it is. One written by an
  earlier shape of the run (a synchronous run that has since shrunk or grown,
  see ``runtime.earlier_states``) restores into that shape and is converted;
  anything else fails in ``restore`` with its fingerprint named.
  """
  own = runtime.saved_state(state)
  step = checkpoints.latest_step()
  earlier = runtime.earlier_states(own, step)
  if earlier:
    found = checkpoints.progress(step)
    found = found.get("fingerprint") if isinstance(found, dict) else None
    if found != fingerprint(own):
      for like, convert in earlier:
        if fingerprint(like) == found:
          return like, convert
  return own, lambda saved: saved


def _run_chunks(
  runtime: Runtime,
  run: _Progress,
  *,
  num_events: int,
  log_every: int,
  checkpoint_every: int | None,
  max_time: float | None,
  write,
  save,
  reporter: Reporter,
  stop_requested: Callable[[], bool] | None = None,
  stop_when_diverged: bool = False,
  take_over: Callable[[int], Callable] | None = None,
) -> _Progress:
  """Advances ``run`` chunk by chunk until ``num_events`` or ``max_time``; writes rows, saves checkpoints.

  Between two chunks (a safe point: the rows written, nothing in flight) a true ``stop_requested()``
  saves a checkpoint there and raises :class:`PreemptedError`. ``stop_when_diverged``: stop after a chunk
  that leaves a non-finite parameter (nothing after it can recover: every later gradient is NaN).
  ``take_over(done)``: makes this process write the run directory from event ``done`` on (it is the
  successor of a lost process 0, :attr:`FaultAfterProgress.writes_run`); returns the new ``write``.
  """
  state, records, done, stopped_by = run.state, list(run.records), run.done, run.stopped_by
  last_eval = dict(run.initial_metrics)
  saved = done

  def absorb(rec) -> int:
    """Writes a chunk's rows and keeps its records; returns its number of events."""
    nonlocal done, last_eval
    rec = jax.tree.map(np.asarray, rec)
    ran = len(rec.time)
    if ran:
      rows = eval_rows(rec, done, runtime.clock) + [train_row(rec, done, runtime.clock)]
      write(rows)
      records.append(rec)
      done += ran
      evals = [r for r in rows if r["kind"] == "eval"]
      if evals:
        last_eval = {k: v for k, v in evals[-1].items() if k not in _ROW_KEYS}
      snapshot = {k: v for k, v in rows[-1].items() if k != "kind"}  # the train row: loss is the batch loss
      # What the run's summary will call final_train_loss and rejected, of the events so far.
      losses = np.concatenate([r.loss for r in records])
      rejected = np.concatenate([r.rejected for r in records])
      snapshot.update(train_loss=train_loss(losses, rejected), rejected_so_far=int(rejected.sum()))
      reporter.update({**snapshot, **{k: v for k, v in last_eval.items() if k != "loss"}})
    return ran

  if stopped_by is None and done >= num_events:
    # A checkpoint at or past this run's budget (e.g. saved when EA-wild's group steps counted one
    # gradient each, and a budget now counts G): nothing is left to run.
    stopped_by = "events"
  try:
    while stopped_by is None:
      before, n = done, min(log_every, num_events - done)
      state, rec = runtime.advance(state, n, max_time=max_time)
      ran = absorb(rec)
      if ran < n:
        stopped_by = "max_time"
      elif done >= num_events:
        stopped_by = "events"
      elif stop_when_diverged and not _finite(state.params):
        stopped_by = "diverged"
      if not records:
        raise EmptyRunError(
          f"train: max_time={max_time!r} is invalid; expected a time after the first event (no event ran)."
        )
      periodic = bool(checkpoint_every) and done // checkpoint_every > before // checkpoint_every
      # Every process of a synchronous run asks, stop or not: they must all stop at the same round.
      preempted = stopped_by is None and runtime.agree_to_stop(bool(stop_requested and stop_requested()))
      if stopped_by is not None or periodic or preempted:
        # A chunk that ran nothing (max_time hit on a chunk boundary) re-saves the same step as finished;
        # a preempted run saves an unfinished one, which resume continues exactly from here.
        save(done, state, records, stopped_by)
        saved = done
      if preempted:
        raise PreemptedError(done)
  except FaultAfterProgress as fault:
    # A peer lost mid-chunk: the events that completed before it are written and saved, so that the
    # restart (by hand or by `jaxsync launch --max-restarts`) redoes none of them. When the peer is
    # process 0, its successor, which holds the same state, writes them.
    if fault.writes_run and take_over is not None:
      write = take_over(done)
    if fault.completed is not None:
      state, rec = fault.completed
      absorb(rec)
    if done > saved and records:  # else the last chunk's end, which no checkpoint holds yet
      save(done, state, records, None)
    raise
  return run._replace(state=state, records=records, done=done, stopped_by=stopped_by)


def _finite(params) -> bool:
  """Whether every parameter is finite (one reduction on the device, one number read back)."""
  leaves = [jnp.isfinite(x).all() for x in jax.tree.leaves(params)]
  return bool(jnp.all(jnp.stack(leaves))) if leaves else True


def _finish(
  runtime: Runtime,
  run: _Progress,
  writers: RunWriters,
  *,
  run_dir: pathlib.Path,
  label: str,
  target: tuple[str, float] | None,
  chance_accuracy: float | None,
  wall_seconds: float,
  primary: bool,
  make_plots: bool,
) -> RunResult:
  """The history, the final evaluation and its row, ``summary.json`` and the plots."""
  history = runtime.history(run.records, run.state, initial_metrics=run.initial_metrics)
  final_params = run.state.params
  final_metrics = runtime.evaluate(final_params)
  summary = {
    "label": label,
    **summarize(
      history, final_metrics, target=target, stopped_by=run.stopped_by, chance_accuracy=chance_accuracy
    ),
  }
  summary["wall_seconds"] = wall_seconds
  final_row = {
    "kind": "final",
    "event": run.done,
    "updates": history.updates,
    history.time_key: history.elapsed,
    **final_metrics,
  }
  writers.reopen(keep_until_event=run.done)
  writers.write([final_row])
  writers.close()
  if primary:
    save_model(run_dir, final_params)
    run_directory.write_json(run_dir / "summary.json", summary)
    if make_plots:
      plots.plot_run(history, run_dir / "plots", label=label, target=target)
  return RunResult(params=final_params, history=history, summary=summary, run_dir=run_dir)


def train(
  runtime: Runtime,
  params: optax.Params,
  run_dir: str | pathlib.Path,
  *,
  num_events: int,
  seed: int = 0,
  log_every: int = 500,
  checkpoint_every: int | None = None,
  max_time: float | None = None,
  target: tuple[str, float] | None = ("accuracy", 0.9),
  chance_accuracy: float | None = None,
  label: str = "",
  reporter: Reporter | None = None,
  tensorboard: bool = True,
  make_plots: bool = True,
  primary: bool = True,
  stop_requested: Callable[[], bool] | None = None,
  stop_when_diverged: bool = False,
) -> RunResult:
  """Trains (or continues training) a run into ``run_dir``.

  If ``run_dir/checkpoints`` holds a checkpoint, the run continues from it
  (``params`` and ``seed`` then only give the structure to restore into and
  must be those of the original run); otherwise it starts from ``params``.
  ``metrics.jsonl`` is cut back to the checkpoint and continued.

  Args:
    runtime: a :class:`Runtime`: the simulator, or a multi-process runtime
      (with its ``eval_fn``).
    params: the initial parameters.
    run_dir: an existing directory (see :func:`run_directory.create`).
    num_events: events (arrivals, or synchronous rounds) in the whole run.
    seed: the jitter seed.
    log_every: events per compiled chunk and per ``"train"`` metrics line.
    checkpoint_every: save every this many events (a multiple of
      ``log_every``); a final checkpoint is always saved.
    max_time: stop at this time of the runtime's clock instead.
    target: ``(metric, value)`` for the time-to-target in the summary.
    chance_accuracy: the accuracy of a guess (``1 / classes``); a run that
      ends at it (or whose loss goes non-finite) is marked ``"diverged"``.
    label: the progress bar's label.
    reporter: progress reporting (default: silent).
    tensorboard, make_plots: write TensorBoard events / PNG plots.
    primary: this process writes the run directory. The other processes of
      a multi-process synchronous run pass False: they run the same chunks,
      restore from the same checkpoint and write nothing.
    stop_requested: asked between chunks; when it returns True (a preemption
      notice arrived) the run saves a checkpoint there and raises
      :class:`PreemptedError`, to be continued exactly by a later call.
    stop_when_diverged: end the run (``stopped_by="diverged"``) after the
      first chunk that leaves a parameter NaN or infinite, instead of
      computing the rest of its budget on NaN: a sweep's diverged rates
      then cost a fraction of a run. The summary marks it ``"diverged"``.

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
  reporter.phase(f"{label}: compiling the evaluation" if label else "compiling the evaluation")
  try:
    run = _restore_or_start(runtime, params, seed, checkpoints)
  except BaseException:
    checkpoints.close()
    reporter.close()
    raise
  writers = RunWriters(run_dir, resume_from=run.done or None, primary=primary, tensorboard=tensorboard)
  if not run.done:
    writers.write(_first_row(run.initial_metrics, runtime.clock))

  def wall_seconds() -> float:
    return run.wall_before + time.perf_counter() - start_wall

  writing = {"primary": primary, "checkpoints": checkpoints}

  def save(done, state, records, stopped_by):
    if not writing["primary"]:
      return
    progress = {
      "initial_metrics": run.initial_metrics,
      "wall_seconds": wall_seconds(),
      "finished": stopped_by is not None,
      "stopped_by": stopped_by,
    }
    records = jax.tree.map(lambda *xs: np.concatenate(xs), *records)
    writing["checkpoints"].save(done, runtime.saved_state(state), records, progress)

  def take_over(done: int):
    """Process 0 is lost and this process writes the run directory in its place: rows after ``done``
    (those process 0 wrote end at its last chunk) and the checkpoint of every completed round."""
    log.warning("process 0 is lost: this process writes the run's checkpoint of %d completed events", done)
    writing["primary"] = True
    writing["checkpoints"] = RunCheckpoints(run_dir / "checkpoints")
    successor_writers = RunWriters(run_dir, resume_from=done or None, primary=True, tensorboard=False)
    writing["writers"] = successor_writers
    return successor_writers.write

  reporter.start(label, num_events, run.done)
  try:
    run = _run_chunks(
      runtime,
      run,
      num_events=num_events,
      log_every=log_every,
      checkpoint_every=checkpoint_every,
      max_time=max_time,
      write=writers.write,
      save=save,
      reporter=reporter,
      stop_requested=stop_requested,
      stop_when_diverged=stop_when_diverged,
      take_over=None if primary else take_over,
    )
  except BaseException:
    writers.close()
    checkpoints.close()
    if "writers" in writing:  # a successor's, after process 0's loss
      writing["writers"].close()
      writing["checkpoints"].close()
    reporter.close()
    raise
  result = _finish(
    runtime,
    run,
    writers,
    run_dir=run_dir,
    label=label,
    target=target,
    chance_accuracy=chance_accuracy,
    wall_seconds=wall_seconds(),
    primary=primary,
    make_plots=make_plots,
  )
  checkpoints.close()
  reporter.finish(result.summary)
  return result
