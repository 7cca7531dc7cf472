"""A corrupt checkpoint: one clear error, with nothing of orbax's logging before it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# Saves a checkpoint at event 4, deletes the step's _CHECKPOINT_METADATA (its commit time) and zeroes the
# state's array files. A bare orbax manager opened on it first (the control: what orbax logs on its own),
# then a RunCheckpoints, which must report the corruption as its one-line CheckpointError and nothing else.
_SCRIPT = textwrap.dedent(
  """
  import pathlib, sys
  import numpy as np
  import orbax.checkpoint as ocp
  from jaxsync._src.steps.records import EventRecord
  from jaxsync._src.train.checkpoints import CheckpointError, RunCheckpoints

  directory = pathlib.Path(sys.argv[1])
  state = {"w": np.arange(64, dtype=np.float32), "b": np.ones([16, 16], np.float32)}
  records = EventRecord(
    **{f: np.zeros(4, np.float32) for f in EventRecord._fields if f != "metrics"},
    metrics={"accuracy": np.zeros(4, np.float32)},
  )
  saved = RunCheckpoints(directory)
  saved.save(4, state, records, {"stopped_by": None})
  saved.close()
  (directory / "4" / "_CHECKPOINT_METADATA").unlink()
  for path in (directory / "4" / "state").rglob("*"):
    if path.is_file() and path.parent.name == "d":
      path.write_bytes(bytes(path.stat().st_size))
  ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(read_only=True)).close()
  print("--- jaxsync ---", file=sys.stderr, flush=True)
  try:
    RunCheckpoints(directory).restore(state)
  except CheckpointError as err:
    print(f"error: {err}", file=sys.stderr)
  """
)


@pytest.mark.heavy
def test_a_corrupt_checkpoint_without_its_metadata_file_logs_nothing_before_its_error(tmp_path):
  proc = subprocess.run(
    [sys.executable, "-c", _SCRIPT, str(tmp_path / "checkpoints")],
    capture_output=True,
    text=True,
    timeout=240,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )
  assert proc.returncode == 0, proc.stderr
  orbax_alone, ours = proc.stderr.split("--- jaxsync ---\n")
  # The control: orbax itself logs the missing file (absl WARNING) ...
  assert "Metadata file does not exist" in orbax_alone, proc.stderr
  # ... RunCheckpoints keeps to its one line.
  assert ours.startswith("error: checkpoint ") and ours.count("\n") == 1, ours
  assert "/4' is corrupt: " in ours, ours
  assert "WARNING" not in ours and "absl" not in ours and "Metadata file" not in ours, ours


def test_the_metadata_note_filter_drops_only_this_directorys_notes(tmp_path):
  import logging

  from jaxsync._src.train import checkpoints

  mine = tmp_path / "run" / "checkpoints"
  note = checkpoints._StepMetadataNoteFilter(mine)

  def record(message, *args):
    return logging.LogRecord("absl", logging.WARNING, __file__, 1, message, args, None)

  assert not note.filter(record("Metadata file does not exist: %s", mine / "4" / "_CHECKPOINT_METADATA"))
  assert not note.filter(record("Failed to json parse Metadata file: %s, file content: ", mine / "4"))
  # Another directory's note, or another message about this directory, passes.
  assert note.filter(
    record("Metadata file does not exist: %s", tmp_path / "elsewhere" / "_CHECKPOINT_METADATA")
  )
  assert note.filter(record("Saving checkpoint at step %d in %s", 4, mine))
  # Installed only while a call is inside the context.
  absl = logging.getLogger("absl")
  before = list(absl.filters)
  with checkpoints._step_metadata_notes_dropped(mine):
    assert len(absl.filters) == len(before) + 1
  assert absl.filters == before


def test_asyncio_reports_of_abandoned_checkpoint_reads_are_dropped_and_nothing_else():
  import logging
  import sys

  from jaxsync._src.train import checkpoints

  def record(error):
    try:
      raise error
    except type(error):
      info = sys.exc_info()
    return logging.LogRecord(
      "asyncio", logging.ERROR, __file__, 1, "Future exception was never retrieved", (), info
    )

  failed = "/tmp/a-run/checkpoints/400"
  checkpoints._FAILED_RESTORES.add(failed)
  try:
    keep = checkpoints._LeftoverFutureFilter().filter
    assert not keep(record(ValueError(f'DATA_LOSS: Error reading "x" at local file "{failed}/state/"')))
    assert not keep(record(RuntimeError("cannot schedule new futures after shutdown")))
    assert keep(record(ValueError('DATA_LOSS: at local file "/tmp/another-run/checkpoints/400/state/"')))
    assert keep(record(RuntimeError("something else")))
    assert keep(
      logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "Executing a slow callback", (), None)
    )
  finally:
    checkpoints._FAILED_RESTORES.discard(failed)


def test_ctrl_c_during_a_save_reaches_the_handler_that_was_there_once_the_save_is_done():
  import signal

  from jaxsync._src.train.checkpoints import _interrupts_deferred

  presses = []
  previous = signal.signal(signal.SIGINT, lambda signum, frame: presses.append(signum))
  try:
    with _interrupts_deferred():
      os.kill(os.getpid(), signal.SIGINT)  # a press in the middle of a save
      assert presses == []  # held back while the save runs
    # Handed on once: the command line's handler notes a stop (it does not raise KeyboardInterrupt,
    # which would end the run at once, as a second press does).
    assert presses == [signal.SIGINT]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with pytest.raises(KeyboardInterrupt):
      with _interrupts_deferred():
        os.kill(os.getpid(), signal.SIGINT)
  finally:
    signal.signal(signal.SIGINT, previous)


def test_a_failed_restores_abandoned_reads_are_silent_even_when_reported_before_the_error(tmp_path, caplog):
  """A sibling read's "exception was never retrieved" can be logged from orbax's thread while the first
  failure is still unwinding (CI saw it before the one-line error); it must be dropped then too."""
  import logging

  import numpy as np

  from jaxsync._src.steps.records import EventRecord
  from jaxsync._src.train.checkpoints import CheckpointError, RunCheckpoints

  state = {"w": np.arange(8, dtype=np.float32)}
  records = EventRecord(
    **{f: np.zeros(4, np.float32) for f in EventRecord._fields if f != "metrics"},
    metrics={"accuracy": np.zeros(4, np.float32)},
  )
  saved = RunCheckpoints(tmp_path / "checkpoints")
  saved.save(4, state, records, {"stopped_by": None})
  restore = saved._manager.restore
  where = tmp_path / "checkpoints" / "4"

  def failing_restore(step, args):
    if "state" not in args:  # the progress record reads as before
      return restore(step, args=args)
    sibling = ValueError(f'DATA_LOSS: Error reading "b/.zarray" in OCDBT database at "{where}/state/"')
    logging.getLogger("asyncio").error(
      "Task exception was never retrieved", exc_info=(ValueError, sibling, None)
    )
    raise ValueError(f'DATA_LOSS: Error reading "w/.zarray" in OCDBT database at "{where}/state/"')

  saved._manager.restore = failing_restore
  with caplog.at_level(logging.ERROR, logger="asyncio"), pytest.raises(CheckpointError, match="is corrupt"):
    saved.restore(state)
  assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text
  # An unrelated future's error is still reported.
  logging.getLogger("asyncio").error(
    "Task exception was never retrieved", exc_info=(ValueError, ValueError("elsewhere"), None)
  )
  assert [r for r in caplog.records if r.name == "asyncio"]
  saved.close()
