"""A run's outcome in a few numbers: what ``summary.json`` holds and ``compare`` tabulates."""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxsync._src.runtime.history import History


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
    history.time_key: history.elapsed,
    "clock": history.clock,
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
