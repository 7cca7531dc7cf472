"""The summary's judgements: divergence (each reason a run counts as diverged, and runs that do not) and
the time to a target (the first crossing and the one that holds)."""

from __future__ import annotations

import numpy as np

from jaxsync._src.interface.history import History
from jaxsync._src.train.summary import divergence, summarize

from helpers import made_up_history


def _history(losses, rejected=None, accuracy=(0.0,)) -> History:
  n = len(losses)
  evals = len(accuracy)
  return made_up_history(
    n,
    {"accuracy": accuracy},
    time=np.arange(n, dtype=np.float32),
    loss=np.asarray(losses, np.float32),
    rejected=np.zeros(n, bool) if rejected is None else np.asarray(rejected, bool),
    eval_version=np.arange(evals, dtype=np.int32) * 5,
    eval_event=np.arange(evals, dtype=np.int32) * 5,
  )


def test_each_reason_a_run_diverged_and_a_run_that_did_not():
  healthy = _history([2.3] * 90 + [0.4] * 10)
  assert divergence(healthy, {"loss": 0.4, "accuracy": 0.91}, chance_accuracy=0.1) is None
  assert divergence(healthy, {"loss": float("nan"), "accuracy": 0.91}) == "the final evaluation loss is nan"
  assert divergence(_history([0.4] * 95 + [np.inf] * 5), {"loss": 0.4}) == (
    "the training loss went non-finite (5 of the last 10 events)"
  )
  # A NaN gradient the server rejected is not a divergence: the guard kept the parameters.
  assert divergence(_history([0.4] * 99 + [np.nan], rejected=[False] * 99 + [True]), {"loss": 0.4}) is None
  # At most 1.5 x chance (0.15 of 10 classes) is chance level; just above it is not.
  assert divergence(healthy, {"accuracy": 0.15}, chance_accuracy=0.1) == (
    "the final accuracy 0.150 is at chance level (0.100)"
  )
  assert divergence(healthy, {"accuracy": 0.16}, chance_accuracy=0.1) is None


def test_time_to_target_first_crossing_and_the_crossing_that_holds():
  # Evaluations at 0, 10, 20, 30, 40 s (0, 5, ... updates): 0.76 at 10 s is a lucky one, 0.77 from 30 s holds.
  h = _history([1.0] * 20, accuracy=[0.1, 0.76, 0.74, 0.77, 0.8])
  assert h.time_to("accuracy", 0.75) == (10.0, 5)
  assert h.time_to("accuracy", 0.75, holds=True) == (30.0, 15)
  assert h.time_to("accuracy", 0.9) is None and h.time_to("accuracy", 0.9, holds=True) is None
  assert _history([1.0], accuracy=[0.8, 0.9]).time_to("accuracy", 0.75, holds=True) == (0.0, 0)
  dropped = _history([1.0], accuracy=[0.1, 0.8, 0.7])  # reached, then lost at the end: never held
  assert (
    dropped.time_to("accuracy", 0.75) == (10.0, 5) and dropped.time_to("accuracy", 0.75, holds=True) is None
  )
  summary = summarize(h, {"accuracy": 0.8}, target=("accuracy", 0.75), stopped_by="done")
  assert (summary["time_to_target"], summary["updates_to_target"]) == (10.0, 5)
  assert (summary["time_to_target_held"], summary["updates_to_target_held"]) == (30.0, 15)


def test_a_run_asked_to_stop_when_diverged_ends_at_the_first_chunk_with_nan_parameters(tmp_path):
  """A rate that blows the parameters up: with ``stop_when_diverged`` the run ends after the chunk where
  they turned NaN, marked diverged; without it the same run computes its whole budget on NaN."""
  import jax.numpy as jnp

  import jaxsync
  from jaxsync._src.train.training import train

  x = np.linspace(-1, 1, 64, dtype=np.float32)
  data = jaxsync.sim.WorkerData({"x": x, "y": 3 * x}, num_workers=2, batch_size=8)

  def loss(w, b):
    return jnp.mean((w * b["x"] - b["y"]) ** 2)

  def run(lr, stop, name):
    sim = jaxsync.sim.Simulator(
      jaxsync.strategies.make("asp", 2, learning_rate=lr),
      loss,
      data,
      jaxsync.sim.TimeModel(num_workers=2),
      eval_fn=lambda w: {"loss": loss(w, data.arrays)},
      eval_every=10,
    )
    return train(sim, jnp.zeros([]), tmp_path / name, num_events=400, log_every=20, target=("loss", 1e-3),
                 tensorboard=False, make_plots=False, stop_when_diverged=stop)  # fmt: skip

  stopped, whole = run(1e3, True, "stopped"), run(1e3, False, "whole")
  assert stopped.summary["stopped_by"] == "diverged" and stopped.summary["diverged"]
  assert stopped.summary["events"] < 400 and stopped.summary["events"] % 20 == 0
  assert (
    whole.summary["stopped_by"] == "events" and whole.summary["events"] == 400 and whole.summary["diverged"]
  )
  # The two runs are the same up to the stop.
  n = stopped.summary["events"]
  np.testing.assert_array_equal(stopped.history.loss, whole.history.loss[:n])
  # A rate that trains is never stopped.
  fine = run(0.5, True, "fine")
  assert fine.summary["stopped_by"] == "events" and not fine.summary["diverged"]


def test_rejected_gradients_are_said_in_the_summary_line():
  from jaxsync._src.train.summary import final_line

  rejected = np.zeros(400, bool)
  rejected[::40] = True
  history = _history([0.5] * 400, rejected=rejected, accuracy=(0.5, 0.9))
  summary = summarize(history, {"accuracy": 0.9, "loss": 0.3}, target=None, stopped_by="events")
  summary["gradients"] = summary["events"]  # an asynchronous run: one gradient an event
  summary["label"] = "asp"
  assert summary["rejected"] == 10
  assert "rejected 10 of 400 gradients: not finite; run directory runs/x" in final_line(summary, "runs/x")
  summary["rejected"] = 0
  assert "rejected" not in final_line(summary, "runs/x")


def test_the_bar_shows_the_summary_s_train_loss_and_fits_a_log_line():
  import io

  from jaxsync._src.train.progress import BarReporter
  from jaxsync._src.train.summary import train_loss

  losses = np.linspace(2.0, 0.1, 1000).astype(np.float32)
  history = _history(losses)
  summary = summarize(history, {}, target=None, stopped_by="events")
  assert train_loss(losses, np.zeros(1000, bool)) == summary["final_train_loss"]
  stream = io.StringIO()  # not a terminal: a log file
  bar = BarReporter(stream)
  bar.start("ormo K=8 seed=0", 1000, 0)
  snapshot = {"event": 1000, "updates": 1000, "simulated_time": 3.5, "loss": 0.612, "accuracy": 0.97}
  bar.update({**snapshot, "train_loss": summary["final_train_loss"], "rejected_so_far": 3})
  bar.finish(summary)
  line = stream.getvalue().strip().splitlines()[-1]
  assert f"train loss {summary['final_train_loss']:.3g}" in line and "0.612" not in line
  assert line.rstrip().endswith(("0:00:00", "-:--:--")) or "test acc 0.970 rejected 3" in line, line
  assert "test acc 0.970 rejected 3" in line  # the whole line, not cut at 80 columns
