"""orbax checkpoints of a whole simulated run: the simulator state, its records so far and its progress.

The simulator state is one plain pytree: server and worker parameters, every
optimizer state, the clock, the event queue, each worker's data step (a batch
is a pure function of worker and step, so the step *is* the data iterator) and
the jitter seed. Saving it with the records of the events run so far and a
small JSON of progress is all a run needs to continue bit for bit.

Writes are synchronous and atomic (orbax writes into a temporary directory and
renames it when complete), so a process killed mid-save leaves the previous
checkpoint intact. Not safe for concurrent writers: one run owns its directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import pathlib
import signal
import sys
import threading
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxsync._src.steps.records import EventRecord

_ITEMS = ("state", "records", "progress")


class CheckpointError(ValueError):
  """A checkpoint that cannot be restored: corrupt, or written by an incompatible run."""


def fingerprint(state: Any) -> str:
  """A short hash of the state's tree structure, shapes and dtypes (what a restore must match)."""
  leaves, tree = jax.tree.flatten(state)
  text = str(tree) + "".join(f"{np.shape(x)}{getattr(x, 'dtype', type(x).__name__)}" for x in leaves)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _as_process_zero(writes: bool):
  """Inside, orbax takes this process for process 0 when it ``writes``.

  orbax writes a replicated NumPy array's data from process 0 only (its
  ``NumpyHandler`` asks ``process_index() == 0``), whatever process saves.
  In a multi-process run exactly one process saves, alone: process 0, or
  the process that writes the run when process 0 is lost (a synchronous
  run's successor, which holds the same state). For orbax it is process 0.
  """
  if not writes or jax.process_index() == 0:
    yield
    return
  from orbax.checkpoint._src.multihost import multihost

  real = multihost.process_index
  multihost.process_index = lambda: 0
  try:
    yield
  finally:
    multihost.process_index = real


MODEL_FILE = "model.npz"


def save_model(run_dir: str | pathlib.Path, params: Any) -> pathlib.Path:
  """Writes the trained model (the carried tree: parameters, and state beside them) to ``run_dir/model.npz``.

  One array per leaf, in the tree's order, with each leaf's path (``__paths__``), written to a
  temporary name and renamed, so the file is whole or absent. What ``jaxsync.load_model`` reads.
  """
  path = pathlib.Path(run_dir) / MODEL_FILE
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  arrays = {f"leaf_{i}": np.asarray(leaf) for i, (_, leaf) in enumerate(flat)}
  paths = np.array([jax.tree_util.keystr(p) for p, _ in flat])
  partial = path.with_name(path.name + ".partial")
  with open(partial, "wb") as f:
    np.savez(f, __paths__=paths, **arrays)
  partial.replace(path)
  return path


def restore_model(run_dir: str | pathlib.Path, like: Any) -> Any:
  """The tree :func:`save_model` wrote in ``run_dir``, restored into the structure of ``like``.

  Raises:
    CheckpointError: no such file (a run that has not finished), or one whose leaves' paths,
      shapes or dtypes differ from ``like``'s.
  """
  path = pathlib.Path(run_dir) / MODEL_FILE
  if not path.is_file():
    raise CheckpointError(
      f"{str(path)!r} does not exist: the run has not finished (a run writes its model when it ends); "
      f"expected a finished run directory (jaxsync resume {str(run_dir)!r} finishes it)."
    )
  flat = jax.tree_util.tree_flatten_with_path(like)[0]
  try:
    with np.load(path, allow_pickle=False) as saved:
      paths = [str(p) for p in saved["__paths__"]]
      leaves = [saved[f"leaf_{i}"] for i in range(len(paths))]
  except Exception as err:  # a truncated or foreign file
    raise CheckpointError(f"{str(path)!r} is corrupt: {_first_line(err)}") from None
  want = [jax.tree_util.keystr(p) for p, _ in flat]
  if paths != want:
    raise CheckpointError(
      f"{str(path)!r} holds a model of {len(paths)} arrays that differ from this config's {len(want)} "
      f"(first difference: {next((a, b) for a, b in zip([*paths, None], [*want, None]) if a != b)})."
    )
  for name, leaf, (_, ref) in zip(paths, leaves, flat):
    if leaf.shape != np.shape(ref) or leaf.dtype != np.asarray(ref).dtype:
      raise CheckpointError(
        f"{str(path)!r}: {name} is {leaf.dtype}{list(leaf.shape)}, this config's model has "
        f"{np.asarray(ref).dtype}{list(np.shape(ref))}."
      )
  return jax.tree_util.tree_unflatten(jax.tree.structure(like), leaves)


class RunCheckpoints:
  """The checkpoints of one run, in ``directory`` (one sub-directory per saved event count).

  Args:
    directory: where the checkpoints live (created on the first save).
    max_to_keep: how many of the latest checkpoints to keep.
    read_only: restore only (the non-primary processes of a multi-process run).

  Example:
    >>> import tempfile, jax.numpy as jnp
    >>> ckpt = RunCheckpoints(tempfile.mkdtemp())
    >>> ckpt.latest_step() is None
    True
  """

  def __init__(self, directory: str | pathlib.Path, *, max_to_keep: int = 2, read_only: bool = False):
    _ignore_operations_left_in_flight()
    self.directory = pathlib.Path(directory).absolute()
    # In a multi-process run one process saves (process 0: the server's state, or the replicated state of
    # a synchronous run; or process 0's successor); no manager waits for the others.
    self._writes = not read_only
    me = 0 if self._writes else jax.process_index()  # a writer is process 0 to orbax (_as_process_zero)
    if not read_only:  # orbax refuses create=True with active_processes
      self.directory.mkdir(parents=True, exist_ok=True)
    else:  # orbax warns that a read-only manager's directory "is read only": that is the point of it
      logging.getLogger("absl").addFilter(_ReadOnlyNoteFilter())
    # The manager reads every step's metadata here.
    with _step_metadata_notes_dropped(self.directory), _as_process_zero(self._writes):
      self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
          max_to_keep=None if read_only else max_to_keep,
          save_interval_steps=0 if read_only else 1,
          enable_async_checkpointing=False,
          cleanup_tmp_directories=not read_only,
          create=False,
          read_only=read_only,
          multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me}),
        ),
        item_names=_ITEMS,
      )

  def latest_step(self) -> int | None:
    """The event count of the newest complete checkpoint, or None."""
    with _step_metadata_notes_dropped(self.directory):
      return self._manager.latest_step()

  def save(self, events: int, state: Any, records: EventRecord, progress: dict[str, Any]) -> None:
    """Saves the state, the records of the first ``events`` events and ``progress`` (JSON).

    Synchronous and atomic; Ctrl-C meanwhile takes effect when the save is complete.
    """
    progress = {**progress, "events": int(events), "fingerprint": fingerprint(state)}
    if jax.process_count() > 1:  # orbax refuses host-local jax.Arrays in a multi-process run
      state = jax.tree.map(np.asarray, state)
    with _interrupts_deferred(), _as_process_zero(True):
      if int(events) in self._manager.all_steps():  # the same events again, now marked finished
        self._manager.delete(int(events))
      self._manager.save(
        int(events),
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          records=ocp.args.StandardSave(jax.tree.map(np.asarray, records._asdict())),
          progress=ocp.args.JsonSave(progress),
        ),
        force=True,
      )
      self._manager.wait_until_finished()

  def restore(self, like_state: Any, step: int | None = None) -> tuple[Any, EventRecord, dict[str, Any]]:
    """(state, records, progress) of checkpoint ``step`` (default: the latest).

    ``like_state`` is a state of the same run (e.g. a fresh ``Simulator.init``)
    that gives the structure, shapes and dtypes to restore into.

    Raises:
      CheckpointError: no checkpoint, an unreadable one, or one written by a
        run whose strategy, model or worker count differs.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no complete checkpoint in {str(self.directory)!r}; nothing to resume from.")
    where = self.directory / str(step)
    progress = self.progress(step)
    expected = fingerprint(like_state)
    if not isinstance(progress, dict) or progress.get("fingerprint") != expected:
      found = progress.get("fingerprint") if isinstance(progress, dict) else progress
      raise CheckpointError(
        f"checkpoint {str(where)!r} is incompatible with this config: its state fingerprint is {found!r}, "
        f"this run's is {expected!r} (a different strategy, model, data or number of workers)."
      )
    if jax.process_count() > 1:  # restored as this process's own NumPy arrays
      abstract = jax.tree.map(np.asarray, like_state)
    else:
      abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), like_state)
    # Marked before the attempt: a failed read's sibling futures can be collected (and asyncio report
    # them) while the first failure is still unwinding through orbax, before the except clause runs.
    _FAILED_RESTORES.add(str(where))
    try:
      with _step_metadata_notes_dropped(self.directory):
        out = self._manager.restore(
          step,
          args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), records=ocp.args.StandardRestore()
          ),
        )
      records = EventRecord(**jax.tree.map(np.asarray, out.records))
    except Exception as err:  # corrupt array files surface as several exception types
      raise CheckpointError(f"checkpoint {str(where)!r} is corrupt: {_first_line(err)}") from None
    _FAILED_RESTORES.discard(str(where))
    if len(records.time) != step:
      raise CheckpointError(
        f"checkpoint {str(where)!r} is corrupt: it holds {len(records.time)} event records, expected {step}."
      )
    return out.state, records, progress

  def progress(self, step: int | None = None) -> Any:
    """The progress record (JSON) of checkpoint ``step`` (default: the latest), its state's
    ``"fingerprint"`` included; raises CheckpointError if it cannot be read."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no complete checkpoint in {str(self.directory)!r}; nothing to resume from.")
    try:
      with _step_metadata_notes_dropped(self.directory):
        return self._manager.restore(step, args=ocp.args.Composite(progress=ocp.args.JsonRestore())).progress
    except Exception as err:  # orbax raises many types for unreadable files
      raise CheckpointError(
        f"checkpoint {str(self.directory / str(step))!r} is corrupt: its progress record cannot be read "
        f"({_first_line(err)})."
      ) from None

  def records(self, step: int | None = None) -> EventRecord:
    """The event records of checkpoint ``step`` (default: the latest) alone, without the run's state (whose
    structure only a runtime of the same run knows): what a finished run recorded, e.g. a real run's.

    Raises:
      CheckpointError: no checkpoint, or an unreadable one.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no complete checkpoint in {str(self.directory)!r}; no records to read.")
    where = self.directory / str(step)
    try:
      with _step_metadata_notes_dropped(self.directory):
        out = self._manager.restore(step, args=ocp.args.Composite(records=ocp.args.StandardRestore()))
      return EventRecord(**jax.tree.map(np.asarray, out.records))
    except Exception as err:  # orbax raises many types for unreadable files
      raise CheckpointError(f"checkpoint {str(where)!r} is corrupt: {_first_line(err)}") from None

  def close(self) -> None:
    """Releases orbax's resources."""
    with _as_process_zero(self._writes):
      self._manager.close()


def _first_line(err: BaseException, limit: int = 300) -> str:
  """The error's type and first line, without tensorstore's spec dump, at most ``limit`` characters."""
  lines = str(err).strip().splitlines()
  text = lines[0].split(" [tensorstore_spec=")[0] if lines else ""
  if len(text) > limit:
    text = text[: limit - 3] + "..."
  return f"{type(err).__name__}: {text}"


class _ReadOnlyNoteFilter(logging.Filter):
  """Drops orbax's "Given directory is read only" note, which a read-only manager always logs."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Given directory is read only")


# What orbax logs (absl WARNING or ERROR) when a step's own metadata file, _CHECKPOINT_METADATA (its
# commit time), is missing or unreadable. A checkpoint that restores does not need the file; one that
# does not gets restore()'s one-line CheckpointError. Either way the note only came first, and garbled
# the outcome: "WARNING:absl:Metadata file does not exist: .../400/_CHECKPOINT_METADATA" above the error.
_STEP_METADATA_NOTES = (
  "Metadata file does not exist: ",
  "Failed to json parse Metadata file: ",
  "Failed to read Metadata file: ",
)


class _StepMetadataNoteFilter(logging.Filter):
  """Drops orbax's notes about unreadable metadata files inside ``directory`` (no other directory's)."""

  def __init__(self, directory: pathlib.Path):
    super().__init__()
    self._directories = tuple({str(directory), str(directory.resolve())})

  def filter(self, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not (message.startswith(_STEP_METADATA_NOTES) and any(d in message for d in self._directories))


@contextlib.contextmanager
def _step_metadata_notes_dropped(directory: pathlib.Path):
  """While inside: :class:`_StepMetadataNoteFilter` on absl's logger (orbax logs from its own threads too,
  which the manager's calls wait for; a logger's filter sees every thread's records)."""
  logger = logging.getLogger("absl")
  note = _StepMetadataNoteFilter(directory)
  logger.addFilter(note)
  try:
    yield
  finally:
    logger.removeFilter(note)


@contextlib.contextmanager
def _interrupts_deferred():
  """Ctrl-C during a save is honoured once the save is complete, not in the middle of it.

  Interrupted mid-save, orbax's threads go on writing into an interpreter that
  is shutting down (the previous checkpoint stays intact, but they print
  tracebacks); a save takes a fraction of a second, so it is let finish. Each
  press is then handed to the handler that was there: the command line's
  (a first press asks the run to stop at its chunk's end, a second stops it),
  or Python's (``KeyboardInterrupt``).
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  caught = []
  previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)
  for signum, frame in caught:
    if callable(previous):
      previous(signum, frame)
    elif previous != signal.SIG_IGN:  # SIG_DFL, or a handler not installed from Python (None)
      raise KeyboardInterrupt


# What orbax's and tensorstore's threads raise when an operation they were serving outlived it: a
# restore that failed on one array while others were still being read, or a save interrupted by
# Ctrl-C. Their completions reach an asyncio loop or executor already shut down; nothing is lost.
_LEFTOVER_ERRORS = ("Event loop is closed", "cannot schedule new futures after shutdown")


# Checkpoint directories whose restore failed (and was reported in one line), or is under way: the reads
# of a failed restore's other arrays, abandoned, end as asyncio futures whose exception nobody retrieves.
_FAILED_RESTORES: set[str] = set()


def _is_leftover(error: BaseException | None) -> bool:
  if isinstance(error, RuntimeError) and str(error) in _LEFTOVER_ERRORS:
    return True
  return isinstance(error, ValueError) and any(directory in str(error) for directory in _FAILED_RESTORES)


class _LeftoverFutureFilter(logging.Filter):
  """Drops asyncio's "exception was never retrieved" reports of checkpoint operations left in flight."""

  def filter(self, record: logging.LogRecord) -> bool:
    if "exception was never retrieved" not in record.getMessage():
      return True
    return not (record.exc_info and _is_leftover(record.exc_info[1]))


def _ignore_operations_left_in_flight() -> None:
  """Silences the errors of checkpoint operations that outlived their call (see ``_LEFTOVER_ERRORS``).

  Python reports them through ``sys.unraisablehook`` (a callback in a
  tensorstore thread), ``threading.excepthook`` (an executor thread) or
  asyncio's logger (a future nobody awaited any more): a dozen tracebacks
  after a one-line error or an interruption. Those and only those are
  dropped; everything else is reported as before.
  """
  previous_unraisable = sys.unraisablehook
  if getattr(previous_unraisable, "_jaxsync_drops_leftovers", False):
    return

  def unraisable_hook(unraisable):
    if not _is_leftover(unraisable.exc_value):
      previous_unraisable(unraisable)

  previous_thread = threading.excepthook

  def thread_hook(args):
    if not _is_leftover(args.exc_value):
      previous_thread(args)

  unraisable_hook._jaxsync_drops_leftovers = True
  sys.unraisablehook = unraisable_hook
  threading.excepthook = thread_hook
  logging.getLogger("asyncio").addFilter(_LeftoverFutureFilter())
