"""PNG plots of simulated runs: one run's curves and histograms, and strategies compared over seeds."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
  from matplotlib.figure import Figure

from jaxsync._src.interface.history import History

_AXES = ("time", "updates")
_COMPARED_METRICS = ("accuracy", "loss")
_FIGSIZE = (6.4, 4.0)
# A curve with at most this many evaluations is drawn point by point, with markers: interpolated onto
# a fine grid it would be a few straight segments that look like measured data.
_FEW_POINTS = 25


def axis_label(axis: str, clock: str = "simulated") -> str:
  """The x label of ``axis``: the run's clock in seconds, or server updates."""
  return f"{clock} seconds" if axis == "time" else "server updates"


def _log_scale_if_positive(ax, *series) -> None:
  """Losses span decades and flatten near zero on a linear scale: log scale when every value is positive."""
  values = np.concatenate([np.asarray(s, np.float64).ravel() for s in series if len(s)] or [np.zeros(0)])
  values = values[np.isfinite(values)]
  if len(values) and (values > 0).all():
    ax.set_yscale("log")


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
  """Trailing mean over the last ``window`` values (fewer at the start), same length as ``values``.

  Args:
    values: a 1-D array.
    window: how many values each mean covers, at least 1.

  Returns:
    ``out[i] = mean(values[max(0, i - window + 1) : i + 1])``.
  """
  values = np.asarray(values, np.float64)
  window = max(1, int(window))
  sums = np.cumsum(np.concatenate([[0.0], values]))
  ends = np.arange(1, len(values) + 1)
  starts = np.maximum(0, ends - window)
  return (sums[ends] - sums[starts]) / (ends - starts)


def mean_curve(
  xs_list: Sequence[np.ndarray],
  ys_list: Sequence[np.ndarray],
  num_points: int = 200,
  *,
  at_points: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Mean and standard deviation of several curves, each linearly interpolated onto a common grid.

  Args:
    xs_list: each curve's nondecreasing x values (repeated x keep their last y).
    ys_list: each curve's y values, as long as its x values.
    num_points: grid size; the grid spans the x range that every curve covers.
    at_points: use the curves' own x values in that range as the grid
      instead (for curves of a few evaluations each).

  Returns:
    ``(grid, mean, std)``, each ``[num_points]`` (or as long as the grid of ``at_points``).
  """
  if not xs_list or len(xs_list) != len(ys_list):
    raise ValueError(
      f"mean_curve: got {len(xs_list)} x arrays and {len(ys_list)} y arrays; expected >= 1 each."
    )
  curves = [
    _last_per_x(np.asarray(x, np.float64), np.asarray(y, np.float64)) for x, y in zip(xs_list, ys_list)
  ]
  low = max(x[0] for x, _ in curves)
  high = min(x[-1] for x, _ in curves)
  if high < low:
    raise ValueError(f"mean_curve: the curves share no x range (starts up to {low}, ends from {high}).")
  if at_points:
    grid = np.unique(np.concatenate([x[(x >= low) & (x <= high)] for x, _ in curves]))
  else:
    grid = np.linspace(low, high, num_points)
  stacked = np.stack([np.interp(grid, x, y) for x, y in curves])
  return grid, stacked.mean(axis=0), stacked.std(axis=0)


def _last_per_x(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  if xs.ndim != 1 or xs.shape != ys.shape or len(xs) == 0:
    raise ValueError(
      f"mean_curve: x shape {xs.shape} and y shape {ys.shape}; expected equal, 1-D, non-empty."
    )
  last = np.append(xs[1:] != xs[:-1], True)
  return xs[last], ys[last]


def staleness_counts(history: History) -> tuple[np.ndarray, np.ndarray]:
  """Histogram of staleness over accepted (not rejected) arrivals, one bin per integer.

  Returns:
    ``(values, counts)``: ``values = 0, 1, ..., max staleness``, and how many arrivals had each.
  """
  accepted = np.asarray(history.staleness)[~np.asarray(history.rejected, bool)].astype(np.int64)
  counts = np.bincount(accepted) if len(accepted) else np.zeros([0], np.int64)
  return np.arange(len(counts)), counts


def training_loss(history: History, axis: str) -> tuple[np.ndarray, np.ndarray]:
  """The batch loss of accepted events with a finite loss, against ``axis``.

  Args:
    history: a run's history.
    axis: ``"time"`` (seconds of the run's clock) or ``"updates"`` (server version after the event).

  Returns:
    ``(x, loss)``.
  """
  keep = ~np.asarray(history.rejected, bool) & np.isfinite(history.loss)
  x = history.time if axis == "time" else history.version
  return np.asarray(x)[keep], np.asarray(history.loss)[keep]


def k_series(history: History) -> tuple[np.ndarray, np.ndarray]:
  """Gradients combined per update over the events that changed the server.

  Returns:
    ``(time, k)`` of the released events.
  """
  released = np.asarray(history.released, bool)
  return np.asarray(history.time)[released], np.asarray(history.k)[released]


def k_varies(history: History) -> bool:
  """Whether the released updates combined different numbers of gradients (adaptive-k)."""
  return len(np.unique(k_series(history)[1])) > 1


def step_size_series(history: History) -> dict[int, tuple[np.ndarray, np.ndarray]]:
  """Each worker's recorded step size (Barzilai-Borwein) against time, finite values only.

  Returns:
    ``{worker: (time, step_size)}`` for the workers with at least one finite step size.
  """
  finite = np.isfinite(history.step_size)
  series = {}
  for worker in np.unique(np.asarray(history.worker)[finite]):
    rows = finite & (history.worker == worker)
    series[int(worker)] = (np.asarray(history.time)[rows], np.asarray(history.step_size)[rows])
  return series


def step_sizes_vary(history: History) -> bool:
  """Whether the finite recorded step sizes take more than one value (BB adapts them per worker)."""
  finite = np.asarray(history.step_size)[np.isfinite(history.step_size)]
  return len(finite) > 0 and bool(finite.max() > finite.min())


def _eval_curve(history: History, metric: str, axis: str) -> tuple[np.ndarray, np.ndarray]:
  x = history.eval_time if axis == "time" else history.eval_version
  return np.asarray(x, np.float64), np.asarray(history.eval_metrics[metric], np.float64)


def _has_metric(history: History, metric: str) -> bool:
  return metric in history.eval_metrics and len(history.eval_metrics[metric]) > 0


def _integer_ticks():
  from matplotlib.ticker import MaxNLocator

  return MaxNLocator(integer=True)


def _new_axes(title: str, xlabel: str, ylabel: str):
  # matplotlib is imported when a figure is drawn, not with the library: a worker process or a run
  # without plots never pays its import (about 0.3 s).
  from matplotlib.figure import Figure

  figure = Figure(figsize=_FIGSIZE, layout="constrained")
  ax = figure.add_subplot()
  ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
  ax.grid(alpha=0.3)
  return figure, ax


def run_figures(history: History, *, label: str) -> dict[str, Figure]:
  """The figures of :func:`plot_run`, by file stem; see there for which are drawn.

  Args:
    history: a run's history.
    label: the run's name, used in the titles.

  Returns:
    ``{stem: Figure}``.
  """
  figures = {}
  for metric in sorted(m for m in history.eval_metrics if _has_metric(history, m)):
    for axis in _AXES:
      figure, ax = _new_axes(f"{label}: {metric}", axis_label(axis, history.clock), metric)
      curve = _eval_curve(history, metric, axis)
      if metric == "loss":
        x, loss = training_loss(history, axis)
        smooth = moving_average(loss, max(1, len(loss) // 50)) if len(loss) else loss
        if len(loss):
          ax.plot(x, smooth, color="tab:gray", alpha=0.5, linewidth=1, label="training batch (smoothed)")
        _log_scale_if_positive(ax, smooth, curve[1])
      ax.plot(*curve, marker=".", color="tab:blue", label="evaluation")
      ax.legend()
      figures[f"{metric}_vs_{axis}"] = figure

  values, counts = staleness_counts(history)
  if counts.sum() > 0:
    figure, ax = _new_axes(
      f"{label}: staleness of accepted arrivals", "staleness (server updates)", "arrivals"
    )
    ax.bar(values, counts, width=0.9, color="tab:blue")
    ax.xaxis.set_major_locator(_integer_ticks())
    figures["staleness_hist"] = figure

  if k_varies(history):
    figure, ax = _new_axes(f"{label}: gradients per update", axis_label("time", history.clock), "k")
    ax.plot(*k_series(history), drawstyle="steps-post", color="tab:blue")
    ax.yaxis.set_major_locator(_integer_ticks())
    figures["k_over_time"] = figure

  if step_sizes_vary(history):
    figure, ax = _new_axes(f"{label}: per-worker step sizes", axis_label("time", history.clock), "step size")
    for worker, (time, size) in step_size_series(history).items():
      ax.plot(time, size, linewidth=1, label=f"worker {worker}")
    if all((size > 0).all() for _, size in step_size_series(history).values()):
      ax.set_yscale("log")
    if len(ax.get_lines()) <= 16:
      ax.legend(fontsize="small", ncols=2)
    figures["step_sizes"] = figure
  return figures


def compare_figures(runs: dict[str, list[History]], num_points: int = 200) -> dict[str, Figure]:
  """The figures of :func:`plot_compare`, by file stem.

  Args:
    runs: ``{strategy: [history per seed]}``.
    num_points: points of each strategy's mean curve.

  Returns:
    ``{stem: Figure}``, one per metric and x axis that at least one strategy recorded.
  """
  figures = {}
  clock = next((h.clock for hs in runs.values() for h in hs), "simulated")
  for metric in _COMPARED_METRICS:
    for axis in _AXES:
      figure, ax = _new_axes(f"{metric} (mean over seeds, ±1 std)", axis_label(axis, clock), metric)
      if draw_compare(ax, runs, metric, axis, num_points):
        if metric == "loss":
          _log_scale_if_positive(ax, *[line.get_ydata() for line in ax.get_lines()])
        ax.legend()
        figures[f"compare_{metric}_vs_{axis}"] = figure
  return figures


def draw_compare(ax, runs: dict[str, list[History]], metric: str, axis: str, num_points: int = 200) -> int:
  """Draws one mean-over-seeds evaluation curve (±1 std band) per strategy on ``ax``.

  Args:
    ax: a matplotlib Axes.
    runs: ``{strategy: [history per seed]}``.
    metric: an evaluation metric, e.g. ``"accuracy"``.
    axis: ``"time"`` (seconds of the runs' clock) or ``"updates"``.
    num_points: points of each mean curve; a strategy whose seeds have at
      most 25 evaluations is drawn at their own points instead, with markers.

  Returns:
    How many curves were drawn (strategies that recorded ``metric``).
  """
  drawn = 0
  for name, histories in runs.items():
    curves = [_eval_curve(h, metric, axis) for h in histories if _has_metric(h, metric)]
    if not curves:
      continue
    few = max(len(x) for x, _ in curves) <= _FEW_POINTS
    grid, mean, std = mean_curve([x for x, _ in curves], [y for _, y in curves], num_points, at_points=few)
    (line,) = ax.plot(
      grid,
      mean,
      marker="o" if few else None,
      markersize=4,
      label=f"{name} ({len(curves)} seed{'s' if len(curves) > 1 else ''})",
    )
    ax.fill_between(grid, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
    drawn += 1
  return drawn


def _save(figures: dict[str, Figure], out_dir: str | pathlib.Path) -> list[pathlib.Path]:
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = []
  for stem, figure in figures.items():
    path = out_dir / f"{stem}.png"
    figure.savefig(path, dpi=100)
    paths.append(path)
  return paths


def plot_run(history: History, out_dir: str | pathlib.Path, *, label: str) -> list[pathlib.Path]:
  """Writes one run's PNGs into ``out_dir`` (created if missing).

  Writes ``{metric}_vs_time.png`` and ``{metric}_vs_updates.png`` per recorded metric (the loss plots
  add the smoothed training batch loss), ``staleness_hist.png``, ``k_over_time.png`` when k varies
  (adaptive-k) and ``step_sizes.png`` when the recorded step sizes vary (BB).

  Args:
    history: a run's history.
    out_dir: the folder to write into.
    label: the run's name, used in the titles.

  Returns:
    The written paths.
  """
  return _save(run_figures(history, label=label), out_dir)


def plot_compare(runs: dict[str, list[History]], out_dir: str | pathlib.Path) -> list[pathlib.Path]:
  """Writes ``compare_{accuracy,loss}_vs_{time,updates}.png``: one mean-over-seeds line per strategy.

  Each seed's evaluation curve is interpolated onto a grid over the x range all seeds cover; the
  band is ±1 standard deviation over seeds. Metrics no strategy recorded are skipped.

  Args:
    runs: ``{strategy: [history per seed]}``.
    out_dir: the folder to write into (created if missing).

  Returns:
    The written paths.
  """
  return _save(compare_figures(runs), out_dir)
