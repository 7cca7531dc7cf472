"""PNG plots of simulated runs: one run's curves and histograms, and strategies compared over seeds."""

from __future__ import annotations

import math
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
# A run's target (``("accuracy", 0.95)``, as ``summary.json`` names it) is a dashed line on that metric's plots.
_TARGET_STYLE = dict(color="tab:red", linestyle="--", linewidth=1.2)
# An accuracy plot gets a second panel zoomed near the top when that range is at most this share of the
# full one: curves that rise from chance to 0.99 in a tenth of the run otherwise squash the rest into a line.
_ZOOM_SHARE = 0.4
# The evaluations of the rise from the initial model, left out of what the zoomed panel must show.
_RISE_FRACTION = 0.25
# Workers whose arrival counts differ by more than this factor are drawn as different speed classes.
_SPEED_GAP = 1.5


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


def staleness_counts(history: History, workers: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Histogram of staleness over accepted (not rejected) arrivals, one bin per integer.

  Args:
    history: a run's history.
    workers: count only these workers' arrivals (the bins still span every
      accepted arrival's staleness, so that several workers' histograms align).

  Returns:
    ``(values, counts)``: ``values = 0, 1, ..., max staleness``, and how many arrivals had each.
  """
  accepted = ~np.asarray(history.rejected, bool)
  staleness = np.asarray(history.staleness)[accepted].astype(np.int64)
  if not len(staleness):
    return np.zeros([0], np.int64), np.zeros([0], np.int64)
  length = int(staleness.max()) + 1
  if workers is not None:
    staleness = staleness[np.isin(np.asarray(history.worker)[accepted], np.asarray(workers))]
  return np.arange(length), np.bincount(staleness, minlength=length)


def speed_classes(history: History) -> list[tuple[np.ndarray, float]]:
  """The arriving workers grouped by speed, read off how often each arrived at the server.

  A worker ``s`` times slower computes each gradient ``s`` times longer, so it
  arrives about ``s`` times less often. Workers sorted by their arrivals start
  a new class where the count drops by more than a factor 1.5; a class's
  slowdown is the fastest class's mean count over its own. Synchronous rounds
  (worker ``-1``) name no worker.

  Returns:
    ``[(worker ids, slowdown)]``, fastest class first (slowdown 1); empty when
    no event names a worker.
  """
  worker = np.asarray(history.worker)
  worker = worker[worker >= 0].astype(np.int64)
  if not len(worker):
    return []
  counts = np.bincount(worker)
  present = np.flatnonzero(counts)
  order = present[np.argsort(-counts[present], kind="stable")]
  classes, current = [], [order[0]]
  for previous, w in zip(order[:-1], order[1:]):
    if counts[previous] > _SPEED_GAP * counts[w]:
      classes.append(current)
      current = []
    current.append(w)
  classes.append(current)
  fastest = counts[classes[0]].mean()
  return [(np.sort(np.asarray(c)), float(fastest / counts[c].mean())) for c in classes]


def _worker_list(ids: np.ndarray) -> str:
  """``0-5`` for consecutive ids, else ``1, 4, 6`` (at most 6 named)."""
  ids = [int(i) for i in ids]
  if len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1)):
    return f"{ids[0]}-{ids[-1]}"
  return ", ".join(map(str, ids[:6])) + (", ..." if len(ids) > 6 else "")


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


def _target_on(target: tuple[str, float] | None, metric: str) -> float | None:
  """The target's value when it is on ``metric``, else None."""
  if target is None:
    return None
  name, value = target
  return float(value) if name == metric else None


def _draw_target(ax, metric: str, value: float | None) -> None:
  if value is not None:
    ax.axhline(value, **_TARGET_STYLE, label=f"target {metric} {value:g}")


def zoom_range(curves: Sequence[np.ndarray], target: float | None = None) -> tuple[float, float] | None:
  """The y range near the top of accuracy curves that their full range squashes, or None.

  The curves that end in the upper half of the full range are read near the
  top (one that diverged to chance stays in the full panel only): the range
  spans their values after the first quarter of their points (the rise from
  the initial model) up to their highest, and the target when it lies in that
  upper half, with a margin; it is at least 2% of the full range tall, so
  that the difference of one test example does not fill the panel.

  Args:
    curves: each curve's y values, in x order.
    target: the target value drawn on the plot, if any.

  Returns:
    ``(bottom, top)``, or None when that range would be more than 40% of the
    full one (the full panel then shows it well enough).
  """
  curves = [np.asarray(c, np.float64) for c in curves]
  curves = [c[np.isfinite(c)] for c in curves]
  curves = [c for c in curves if len(c)]
  if not curves:
    return None
  everything = np.concatenate(curves + ([np.asarray([target], np.float64)] if target is not None else []))
  low, high = float(everything.min()), float(everything.max())
  if not high > low:
    return None
  middle = (low + high) / 2
  settled = [c for c in curves if c[-1] >= middle]
  if not settled:  # every curve ends low (diverged): nothing near the top to read
    return None
  shown = [c[int(np.ceil(_RISE_FRACTION * (len(c) - 1))) :] for c in settled]
  if target is not None and target >= middle:
    shown.append(np.asarray([target], np.float64))
  bottom = float(np.concatenate(shown).min())
  top = max(float(np.concatenate(settled).max()), bottom)
  margin = max(0.08 * (top - bottom), 0.01 * (high - low))
  bottom, top = bottom - margin, top + margin
  if high <= 1.0:  # an accuracy: no room above 1 but for the markers of a perfect score
    top = min(top, 1.0 + 0.25 * margin)
  if top - bottom > _ZOOM_SHARE * (high - low):
    return None
  return bottom, top


def _metric_figure(title: str, xlabel: str, metric: str, draw, target: float | None) -> Figure:
  """``draw(ax)``'s curves of ``metric`` with the target's dashed line, and for an accuracy whose full
  range squashes the top (:func:`zoom_range`), a second panel below zoomed near the top.

  The full panel is always ``figure.axes[0]``; the zoomed one, when drawn, ``figure.axes[1]``.
  """
  figure, ax = _new_axes(title, xlabel, metric)
  draw(ax)
  _draw_target(ax, metric, target)
  zoom = None
  if "accuracy" in metric:
    curves = [line.get_ydata() for line in ax.get_lines() if not line.get_label().startswith("target ")]
    zoom = zoom_range(curves, target)
  if zoom is None:
    ax.legend()
    return figure
  from matplotlib.figure import Figure

  figure = Figure(figsize=(_FIGSIZE[0], _FIGSIZE[1] * 1.5), layout="constrained")
  full, near = figure.subplots(2, 1, sharex=True, height_ratios=[3, 2])
  for ax in (full, near):
    draw(ax)
    _draw_target(ax, metric, target)
    ax.grid(alpha=0.3)
  full.axhspan(*zoom, color="0.5", alpha=0.1, linewidth=0, label="zoomed below")
  full.set(title=title, ylabel=metric)
  full.tick_params(labelbottom=True)
  near.set(xlabel=xlabel, ylabel=f"{metric}, zoomed", ylim=zoom)
  full.legend()
  return figure


def run_figures(
  history: History, *, label: str, target: tuple[str, float] | None = None
) -> dict[str, Figure]:
  """The figures of :func:`plot_run`, by file stem; see there for which are drawn.

  Args:
    history: a run's history.
    label: the run's name, used in the titles.
    target: the run's target, e.g. ``("accuracy", 0.95)``: a dashed line on that metric's plots.

  Returns:
    ``{stem: Figure}``.
  """
  figures = {}
  for metric in sorted(m for m in history.eval_metrics if _has_metric(history, m)):
    for axis in _AXES:

      def draw(ax, metric=metric, axis=axis):
        curve = _eval_curve(history, metric, axis)
        if metric == "loss":
          x, loss = training_loss(history, axis)
          smooth = moving_average(loss, max(1, len(loss) // 50)) if len(loss) else loss
          if len(loss):
            ax.plot(x, smooth, color="tab:gray", alpha=0.5, linewidth=1, label="training batch (smoothed)")
          _log_scale_if_positive(ax, smooth, curve[1])
        ax.plot(*curve, marker=".", color="tab:blue", label="evaluation")

      figures[f"{metric}_vs_{axis}"] = _metric_figure(
        f"{label}: {metric}", axis_label(axis, history.clock), metric, draw, _target_on(target, metric)
      )

  values, counts = staleness_counts(history)
  if counts.sum() > 0 and len(values) > 1:  # a run with no staleness (a synchronous one) draws no histogram
    figures["staleness_hist"] = _staleness_figure(history, label, values, counts)

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


def _staleness_figure(history: History, label: str, values: np.ndarray, counts: np.ndarray) -> Figure:
  """The staleness histogram, its bars stacked by worker speed class when the workers differ in speed.

  A worker ``s`` times slower computes ``s`` times longer, and the others
  update the server meanwhile: its gradients arrive about ``s`` times staler,
  a second peak that the title explains and the legend attributes.
  """
  title = f"{label}: staleness of accepted arrivals"
  classes = speed_classes(history)
  figure, ax = _new_axes(title, "staleness (server updates)", "arrivals")
  ax.xaxis.set_major_locator(_integer_ticks())
  if len(classes) < 2:
    ax.bar(values, counts, width=0.9, color="tab:blue")
    return figure
  accepted = ~np.asarray(history.rejected, bool)
  staleness, worker = np.asarray(history.staleness)[accepted], np.asarray(history.worker)[accepted]
  bottom = np.zeros(len(values), np.int64)
  for ids, slowdown in classes:
    _, these = staleness_counts(history, ids)
    mine = np.isin(worker, ids)
    mean = float(staleness[mine].mean()) if mine.any() else math.nan
    who = f"{len(ids)} worker{'s' if len(ids) > 1 else ''} ({_worker_list(ids)})"
    speed = "fastest" if slowdown == 1.0 else f"{slowdown:.1f}x slower"
    ax.bar(values, these, width=0.9, bottom=bottom, label=f"{who}, {speed}: mean {mean:.1f}")
    bottom += these
  ax.set_title(
    f"{title}\nslower workers compute longer while the others update: staler gradients",
    fontsize="medium",
  )
  ax.legend(title="by worker speed (from arrivals)", fontsize="small", title_fontsize="small")
  return figure


def compare_figures(
  runs: dict[str, list[History]], num_points: int = 200, *, target: tuple[str, float] | None = None
) -> dict[str, Figure]:
  """The figures of :func:`plot_compare`, by file stem.

  Args:
    runs: ``{strategy: [history per seed]}``.
    num_points: points of each strategy's mean curve.
    target: the runs' target, e.g. ``("accuracy", 0.95)``: a dashed line on that metric's plots.

  Returns:
    ``{stem: Figure}``, one per metric and x axis that at least one strategy recorded.
  """
  figures = {}
  clock = next((h.clock for hs in runs.values() for h in hs), "simulated")
  # The test split's metrics, and the validation split's (what a tuning run and `jaxsync advise` record).
  for metric in (*_COMPARED_METRICS, *(f"validation_{m}" for m in _COMPARED_METRICS)):
    if not any(_has_metric(h, metric) for hs in runs.values() for h in hs):
      continue
    for axis in _AXES:

      def draw(ax, metric=metric, axis=axis):
        draw_compare(ax, runs, metric, axis, num_points)
        if metric.endswith("loss"):
          _log_scale_if_positive(ax, *[line.get_ydata() for line in ax.get_lines()])

      figures[f"compare_{metric}_vs_{axis}"] = _metric_figure(
        f"{metric} (mean over seeds, ±1 std)",
        axis_label(axis, clock),
        metric,
        draw,
        _target_on(target, metric),
      )
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


def plot_run(
  history: History,
  out_dir: str | pathlib.Path,
  *,
  label: str,
  target: tuple[str, float] | None = None,
) -> list[pathlib.Path]:
  """Writes one run's PNGs into ``out_dir`` (created if missing).

  Writes ``{metric}_vs_time.png`` and ``{metric}_vs_updates.png`` per recorded metric (the loss plots
  add the smoothed training batch loss; the target's metric a dashed line at the target; an accuracy
  that rises to near 1 early a second panel zoomed near the top), ``staleness_hist.png`` (stacked by
  worker speed class when the workers differ in speed), ``k_over_time.png`` when k varies
  (adaptive-k) and ``step_sizes.png`` when the recorded step sizes vary (BB).

  Args:
    history: a run's history.
    out_dir: the folder to write into.
    label: the run's name, used in the titles.
    target: the run's target, e.g. ``("accuracy", 0.95)`` (``summary.json``'s ``target``), or None.

  Returns:
    The written paths.
  """
  return _save(run_figures(history, label=label, target=target), out_dir)


def plot_compare(
  runs: dict[str, list[History]],
  out_dir: str | pathlib.Path,
  *,
  target: tuple[str, float] | None = None,
) -> list[pathlib.Path]:
  """Writes ``compare_{accuracy,loss}_vs_{time,updates}.png``: one mean-over-seeds line per strategy.

  Each seed's evaluation curve is interpolated onto a grid over the x range all seeds cover; the
  band is ±1 standard deviation over seeds. Metrics no strategy recorded are skipped. The target's
  metric gets a dashed line at the target, and an accuracy squashed near the top a zoomed panel.

  Args:
    runs: ``{strategy: [history per seed]}``.
    out_dir: the folder to write into (created if missing).
    target: the runs' target, e.g. ``("accuracy", 0.95)``, or None.

  Returns:
    The written paths.
  """
  return _save(compare_figures(runs, target=target), out_dir)
