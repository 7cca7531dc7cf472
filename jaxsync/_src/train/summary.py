"""A run's outcome in a few numbers: what ``summary.json`` holds and ``compare`` tabulates."""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxsync._src.interface.history import History


def divergence(
  history: History, final_metrics: dict[str, float], *, chance_accuracy: float | None = None
) -> str | None:
  """Why a run diverged, in words, or None: a loss that went non-finite, or accuracy back at chance.

  A run has diverged when its final evaluation loss or a training batch loss
  of its last tenth is NaN or infinite, or when its final accuracy is at most
  ``1.5 x chance_accuracy`` (``1 / classes``: a network that predicts one class,
  or noise, on balanced held-out data).
  """
  prefix = _prefix(final_metrics)
  loss = final_metrics.get(f"{prefix}loss")
  if loss is not None and not np.isfinite(loss):
    return f"the final evaluation loss is {loss}"
  tail = max(1, len(history.loss) // 10)
  recent = np.asarray(history.loss[-tail:])[~np.asarray(history.rejected[-tail:], bool)]
  if recent.size and not np.isfinite(recent).all():
    return f"the training loss went non-finite ({int((~np.isfinite(recent)).sum())} of the last {recent.size} events)"
  accuracy = final_metrics.get(f"{prefix}accuracy")
  if chance_accuracy is not None and accuracy is not None and accuracy <= 1.5 * chance_accuracy:
    return f"the final accuracy {accuracy:.3f} is at chance level ({chance_accuracy:.3f})"
  return None


def train_loss(losses, rejected) -> float | None:
  """The training loss the papers tabulate: the mean batch loss of the last 10% of the events (rejected ones
  left out); None when there is none or it is not finite. The progress bar's ``train loss`` and the
  summary's ``final_train_loss`` are this number, of the events so far and of the whole run."""
  tail = max(1, len(losses) // 10)
  kept = np.asarray(losses[-tail:])[~np.asarray(rejected[-tail:], bool)]
  return float(kept.mean()) if kept.size and np.isfinite(kept).all() else None


def rejected_words(rejected: int, events: int, unit: str = "gradients") -> str | None:
  """``"rejected 10 of 400 gradients: not finite"`` (``unit``: what an event is), or None when none was."""
  return f"rejected {rejected} of {events} {unit}: not finite" if rejected else None


def _prefix(final_metrics: dict[str, Any]) -> str:
  """``"validation_"`` for a run evaluated on its validation split only (no test metric), else ``""``."""
  if final_metrics and all(name.startswith("validation_") for name in final_metrics):
    return "validation_"
  return ""


def summarize(
  history: History,
  final_metrics: dict[str, float],
  *,
  target: tuple[str, float] | None,
  stopped_by: str,
  chance_accuracy: float | None = None,
) -> dict[str, Any]:
  """The run's outcome: final metrics, time and updates to ``target``, staleness, bytes moved, divergence."""
  summary: dict[str, Any] = {
    "events": len(history.time),
    "updates": history.updates,
    "gradients": int(history.worker_steps.sum()),
    history.time_key: history.elapsed,
    "clock": history.clock,
    "stopped_by": stopped_by,
  }
  summary.update({f"final_{name}": value for name, value in final_metrics.items()})
  summary["final_train_loss"] = train_loss(history.loss, history.rejected)
  prefix = _prefix(final_metrics)
  if final_metrics:
    summary["evaluated_on"] = "validation" if prefix else "test"
  name = f"{prefix}accuracy"
  accuracies = [*history.eval_metrics.get(name, []), final_metrics.get(name, np.nan)]
  if np.isfinite(accuracies).any():  # the final evaluation counts too
    summary[f"best_{name}"] = float(np.nanmax(accuracies))
  if target is not None:
    summary["target"] = {"metric": target[0], "value": target[1]}
    summary.update(target_crossings(history, final_metrics, target))
  accepted = history.staleness[~history.rejected]
  summary.update(
    mean_staleness=history.mean_staleness(),
    max_staleness=int(accepted.max()) if accepted.size else 0,
    bytes_moved=history.bytes_moved,
    bytes_moved_intra=history.bytes_moved_intra,
    rejected=history.rejected_count,
  )
  why = divergence(history, final_metrics, chance_accuracy=chance_accuracy)
  summary["diverged"] = why is not None
  if why is not None:
    summary["diverged_because"] = why
  return summary


def target_crossings(
  history: History, final_metrics: dict[str, float | None], target: tuple[str, float]
) -> dict[str, float | int | None]:
  """The time and updates to ``target``: at the first evaluation reaching it, and at the first from which
  the run stays there to its end ("held"), the final evaluation counted as the last one."""
  metric, value = target
  out: dict[str, float | int | None] = {}
  final = final_metrics.get(metric)
  held = _held_lower_bound(history, metric, value, final) if metric in history.eval_metrics else None
  for suffix, holds in (("", False), ("_held", True)):
    hit = (
      history.time_to(
        metric,
        value,
        higher_is_better=metric != "loss",
        holds=holds,
        final=np.nan if final is None else float(final),
      )
      if metric in history.eval_metrics
      else None
    )
    out[f"time_to_target{suffix}"] = hit[0] if hit else None
    out[f"updates_to_target{suffix}"] = hit[1] if hit else None
  # The crossing that holds lies after the evaluation before it: the time is known to within this interval.
  out["time_to_target_held_after"] = held
  return out


def _held_lower_bound(history: History, metric: str, value: float, final: float | None) -> float | None:
  """The time of the evaluation just before the first one from which ``metric`` holds at ``value`` (0 when
  that is the initial model), or None when it does not hold: the crossing lies between the two."""
  from jaxsync._src.interface.history import crossing

  values = np.append(history.eval_metrics[metric], np.nan if final is None else float(final))
  times = np.append(history.eval_time, history.elapsed)
  i = crossing(values, value, higher_is_better=metric != "loss", holds=True)
  if i is None:
    return None
  return float(times[i - 1]) if i > 0 else 0.0


def final_line(summary: dict, run_dir) -> str:
  """The line ``jaxsync train`` ends with: accuracy, updates, time on the run's clock, the target, where."""
  acc = summary.get("final_accuracy")
  validation = summary.get("final_validation_accuracy")
  if acc is not None:
    shown = f"test accuracy {acc:.3f}" + ("" if validation is None else f" (validation {validation:.3f})")
  elif validation is not None:
    shown = f"validation accuracy {validation:.3f} (test set not read)"
  else:
    shown = "no accuracy"
  tt = summary.get("time_to_target")
  target = summary.get("target") or {}
  clock = summary.get("clock", "simulated")  # simulated seconds, or wall seconds of a real run
  reached = (
    f"{target.get('metric')} {target.get('value')} at {tt:.1f} {clock} s"
    if tt is not None
    else "target not reached"
  )
  events = summary.get("events", 0)
  unit = "gradients" if summary.get("gradients") == events else "events"
  rejected = rejected_words(summary.get("rejected", 0), events, unit)
  return (
    f"{summary.get('label', '')}: {shown} after {summary['updates']} updates, "
    f"{summary[f'{clock}_time']:.1f} {clock} s ({reached}); "
    + (f"{rejected}; " if rejected else "")
    + f"run directory {run_dir}"
  )
