"""Plots of runs: the plotted data checked by hand, which files get written, and valid PNGs."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from jaxsync._src.train import plots

from helpers import made_up_history
from sim_cases import accuracy_fn, problem, simulate

RUN_METRIC_FILES = {"accuracy_vs_time", "accuracy_vs_updates", "loss_vs_time", "loss_vs_updates"}


def make_history(
  staleness=(0, 1, 2, 1, 0, 3),
  *,
  k=None,
  step_size=None,
  rejected=None,
  loss=None,
  eval_time=(0.0, 2.0, 4.0),
  eval_version=(0, 2, 5),
  metrics=None,
  num_workers=3,
):
  """A hand-made History of len(staleness) events, one per second, workers in turn, all released."""
  n = len(staleness)
  if metrics is None:
    metrics = {"accuracy": [0.3, 0.6, 0.8], "loss": [1.2, 0.8, 0.5]}
  return made_up_history(
    n,
    metrics,
    metrics_dtype=np.float64,
    worker=np.arange(n) % num_workers,
    staleness=np.asarray(staleness, np.int32),
    k=np.ones(n, np.int32) if k is None else np.asarray(k, np.int32),
    loss=np.linspace(2.0, 1.0, n).astype(np.float32) if loss is None else np.asarray(loss, np.float32),
    rejected=np.zeros(n, bool) if rejected is None else np.asarray(rejected, bool),
    step_size=np.full(n, np.nan, np.float32) if step_size is None else np.asarray(step_size, np.float32),
    eval_time=np.asarray(eval_time, np.float64),
    eval_version=np.asarray(eval_version),
    worker_steps=np.zeros(num_workers, np.int32),
    worker_used=np.zeros(num_workers, np.int32),
    worker_idle=np.zeros(num_workers, np.float32),
  )


def assert_pngs(paths, expected_stems, out_dir):
  assert {p.stem for p in paths} == set(expected_stems)
  assert sorted(p.name for p in out_dir.iterdir()) == sorted(p.name for p in paths)
  for path in paths:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    assert len(data) > 5000, (path, len(data))


def test_moving_average_is_a_trailing_mean():
  np.testing.assert_allclose(plots.moving_average(np.array([1.0, 2.0, 3.0, 4.0]), 2), [1.0, 1.5, 2.5, 3.5])
  np.testing.assert_allclose(plots.moving_average(np.array([2.0, 4.0, 9.0]), 3), [2.0, 3.0, 5.0])
  np.testing.assert_allclose(plots.moving_average(np.array([5.0, 1.0]), 1), [5.0, 1.0])


def test_mean_curve_of_two_lines_on_their_common_range():
  # y = x sampled on [0, 10], y = 3x sampled elsewhere on [0, 8]: mean 2x, std x, grid over [0, 8].
  xs = [np.array([0.0, 5.0, 10.0]), np.array([0.0, 1.0, 8.0])]
  ys = [xs[0], 3 * xs[1]]
  grid, mean, std = plots.mean_curve(xs, ys, num_points=5)
  np.testing.assert_allclose(grid, [0.0, 2.0, 4.0, 6.0, 8.0])
  np.testing.assert_allclose(mean, 2 * grid)
  np.testing.assert_allclose(std, grid)


def test_mean_curve_keeps_the_last_value_of_a_repeated_x_and_rejects_disjoint_curves():
  grid, mean, std = plots.mean_curve([np.array([0.0, 1.0, 1.0, 2.0])], [np.array([0.0, 5.0, 1.0, 2.0])], 5)
  np.testing.assert_allclose(grid, [0.0, 0.5, 1.0, 1.5, 2.0])
  np.testing.assert_allclose(mean, grid)
  np.testing.assert_allclose(std, 0.0)
  with pytest.raises(ValueError, match="no x range"):
    plots.mean_curve([np.array([0.0, 1.0]), np.array([2.0, 3.0])], [np.zeros(2), np.zeros(2)])


def test_staleness_counts_integer_bins_over_accepted_arrivals():
  history = make_history((0, 2, 2, 5, 1, 2), rejected=(0, 0, 0, 1, 0, 0))
  values, counts = plots.staleness_counts(history)
  np.testing.assert_array_equal(values, [0, 1, 2])
  np.testing.assert_array_equal(counts, [1, 1, 3])


def test_training_loss_drops_rejected_and_non_finite_events():
  history = make_history(loss=(4.0, np.nan, 3.0, 9.0, 2.0, 1.0), rejected=(0, 0, 0, 1, 0, 0))
  x, loss = plots.training_loss(history, "time")
  np.testing.assert_array_equal(x, [1, 3, 5, 6])
  np.testing.assert_array_equal(loss, [4.0, 3.0, 2.0, 1.0])
  x, _ = plots.training_loss(history, "updates")
  np.testing.assert_array_equal(x, [1, 3, 5, 6])


def test_plot_run_with_constant_k_and_no_step_sizes(tmp_path):
  history = make_history()
  assert not plots.k_varies(history) and not plots.step_sizes_vary(history)
  paths = plots.plot_run(history, tmp_path / "run", label="asp")
  assert_pngs(paths, RUN_METRIC_FILES | {"staleness_hist"}, tmp_path / "run")


def test_plot_run_draws_k_over_time_only_when_k_varies(tmp_path):
  history = make_history(k=(1, 2, 2, 3, 1, 2))
  history.released[2] = False  # its k is ignored
  history.k[2] = 0
  time, k = plots.k_series(history)
  np.testing.assert_array_equal(time, [1, 2, 4, 5, 6])
  np.testing.assert_array_equal(k, [1, 2, 3, 1, 2])
  paths = plots.plot_run(history, tmp_path, label="adaptive_k")
  assert_pngs(paths, RUN_METRIC_FILES | {"staleness_hist", "k_over_time"}, tmp_path)
  (line,) = plots.run_figures(history, label="adaptive_k")["k_over_time"].axes[0].get_lines()
  np.testing.assert_array_equal(line.get_ydata(), [1, 2, 3, 1, 2])
  # k = 0 on unreleased events alone does not make k vary.
  constant = make_history(k=(2, 0, 2, 2, 0, 2))
  constant.released[[1, 4]] = False
  assert not plots.k_varies(constant)


def test_step_sizes_plotted_per_worker_only_when_they_vary(tmp_path):
  sizes = (0.1, 0.2, np.nan, 0.15, 0.25, np.nan)
  history = make_history(step_size=sizes)
  series = plots.step_size_series(history)
  assert sorted(series) == [0, 1]  # worker 2 recorded no step size
  np.testing.assert_array_equal(series[0][0], [1, 4])
  np.testing.assert_allclose(series[0][1], [0.1, 0.15])
  np.testing.assert_allclose(series[1][1], [0.2, 0.25])
  figures = plots.run_figures(history, label="bb")
  assert len(figures["step_sizes"].axes[0].get_lines()) == 2
  assert_pngs(
    plots.plot_run(history, tmp_path, label="bb"),
    RUN_METRIC_FILES | {"staleness_hist", "step_sizes"},
    tmp_path,
  )
  assert "step_sizes" not in plots.run_figures(make_history(step_size=[0.1] * 6), label="constant")


def test_plot_run_skips_absent_metrics_and_overlays_training_loss():
  figures = plots.run_figures(make_history(metrics={"loss": [1.0, 0.7, 0.4]}), label="x")
  assert set(figures) == {"loss_vs_time", "loss_vs_updates", "staleness_hist"}
  ax = figures["loss_vs_updates"].axes[0]
  train, evaluation = ax.get_lines()
  np.testing.assert_array_equal(evaluation.get_xdata(), [0, 2, 5])
  np.testing.assert_allclose(evaluation.get_ydata(), [1.0, 0.7, 0.4])
  np.testing.assert_array_equal(train.get_xdata(), np.arange(1, 7))
  assert [t.get_text() for t in ax.get_legend().get_texts()] == ["training batch (smoothed)", "evaluation"]
  figures = plots.run_figures(make_history(eval_time=(), eval_version=(), metrics={}), label="no evals")
  assert set(figures) == {"staleness_hist"}


def test_plot_compare_one_mean_line_per_strategy(tmp_path):
  fast = [
    make_history(eval_time=(0.0, 2.0, 4.0), metrics={"accuracy": [0.0, 0.4, 0.8], "loss": [2.0, 1.0, 0.5]}),
    make_history(eval_time=(0.0, 3.0, 6.0), metrics={"accuracy": [0.0, 0.6, 0.9], "loss": [2.0, 0.8, 0.4]}),
  ]
  slow = [
    make_history(eval_time=(0.0, 5.0, 10.0), metrics={"accuracy": [0.0, 0.2, 0.4], "loss": [2.0, 1.5, 1.0]})
  ]
  no_evals = [make_history(eval_time=(), eval_version=(), metrics={})]
  runs = {"fast": fast, "slow": slow, "silent": no_evals}
  figures = plots.compare_figures(runs, num_points=5)
  stems = {f"compare_{m}_vs_{a}" for m in ("accuracy", "loss") for a in ("time", "updates")}
  assert set(figures) == stems
  ax = figures["compare_accuracy_vs_time"].axes[0]
  fast_line, slow_line = ax.get_lines()
  assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fast (2 seeds)", "slow (1 seed)"]
  # fast: both seeds on [0, 4]: accuracy 0.2 t and (0.2 t up to 3, then 0.6 + 0.1 (t - 3)), drawn at the
  # seeds' own evaluation times (few points: markers, no fine grid).
  np.testing.assert_allclose(fast_line.get_xdata(), [0.0, 2.0, 3.0, 4.0])
  np.testing.assert_allclose(fast_line.get_ydata(), [0.0, 0.4, 0.6, 0.75])
  np.testing.assert_allclose(slow_line.get_xdata(), [0.0, 5.0, 10.0])
  assert_pngs(plots.plot_compare(runs, tmp_path), stems, tmp_path)


def test_real_adaptive_k_run_with_bb_step_sizes(tmp_path):
  workers = 4
  _, _, data = problem(workers)
  _, history, _ = simulate(
    "adaptive_k",
    workers,
    events=120,
    options={"bb_step_size": True, "learning_rate": 0.05},
    eval_fn=accuracy_fn(data),
    eval_every=10,
  )
  paths = plots.plot_run(history, tmp_path / "run", label="adaptive_k")
  expected = RUN_METRIC_FILES | {"staleness_hist", "k_over_time", "step_sizes"}
  assert_pngs(paths, expected, tmp_path / "run")
  values, counts = plots.staleness_counts(history)
  assert counts.sum() == (~history.rejected).sum() and len(values) == history.staleness.max() + 1
  compare = plots.plot_compare({"adaptive_k": [history, history]}, tmp_path / "compare")
  assert len(compare) == 4


def test_loss_is_drawn_on_a_log_scale_and_accuracy_on_a_linear_one():
  figures = plots.run_figures(make_history(), label="r")
  assert figures["loss_vs_time"].axes[0].get_yscale() == "log"
  assert figures["loss_vs_updates"].axes[0].get_yscale() == "log"
  assert figures["accuracy_vs_time"].axes[0].get_yscale() == "linear"
  # A loss that reaches 0 (or is negative) stays linear: a log axis could not show it.
  zero = make_history(metrics={"accuracy": [0.3, 0.6, 0.8], "loss": [1.0, 0.5, 0.0]})
  assert plots.run_figures(zero, label="r")["loss_vs_time"].axes[0].get_yscale() == "linear"


def test_a_strategy_with_few_evaluations_is_drawn_at_its_points_with_markers():
  few = [make_history(), make_history()]  # 3 evaluations each
  many = make_history(
    eval_time=np.linspace(0, 5, 40),
    eval_version=np.arange(40),
    metrics={"accuracy": np.linspace(0.1, 0.9, 40), "loss": np.linspace(2.0, 0.2, 40)},
  )
  figures = plots.compare_figures({"bsp": few, "asp": [many]}, num_points=200)
  lines = {
    line.get_label().split(" (")[0]: line for line in figures["compare_accuracy_vs_time"].axes[0].get_lines()
  }
  np.testing.assert_allclose(lines["bsp"].get_xdata(), [0.0, 2.0, 4.0])  # its own evaluations, not 200 points
  assert lines["bsp"].get_marker() == "o"
  assert len(lines["asp"].get_xdata()) == 200 and lines["asp"].get_marker() in ("None", None, "")
  assert figures["compare_loss_vs_time"].axes[0].get_yscale() == "log"


def test_the_time_axis_names_the_runs_clock():
  wall = make_history()
  wall.clock = "wall"
  assert plots.run_figures(wall, label="r")["accuracy_vs_time"].axes[0].get_xlabel() == "wall seconds"
  assert (
    plots.run_figures(make_history(), label="r")["accuracy_vs_time"].axes[0].get_xlabel()
    == "simulated seconds"
  )
  assert wall.elapsed == 6.0 and wall.time_key == "wall_time"
  with pytest.raises(ValueError, match="wall-clock run has no simulated time"):
    _ = wall.simulated_time


def _target_lines(ax):
  return [line for line in ax.get_lines() if line.get_label().startswith("target ")]


def test_the_target_is_a_dashed_line_on_its_metrics_plots():
  history = make_history()
  figures = plots.run_figures(history, label="r", target=("accuracy", 0.7))
  for axis in ("time", "updates"):
    (line,) = _target_lines(figures[f"accuracy_vs_{axis}"].axes[0])
    np.testing.assert_allclose(line.get_ydata(), [0.7, 0.7])
    assert line.get_linestyle() == "--" and line.get_label() == "target accuracy 0.7"
    assert "target accuracy 0.7" in [
      t.get_text() for t in figures[f"accuracy_vs_{axis}"].axes[0].get_legend().get_texts()
    ]
    assert not _target_lines(figures[f"loss_vs_{axis}"].axes[0])  # the target is on accuracy only
  assert not _target_lines(plots.run_figures(history, label="r")["accuracy_vs_time"].axes[0])
  compare = plots.compare_figures({"a": [history], "b": [history]}, num_points=5, target=("accuracy", 0.7))
  (line,) = _target_lines(compare["compare_accuracy_vs_time"].axes[0])
  np.testing.assert_allclose(line.get_ydata(), [0.7, 0.7])
  assert len(compare["compare_accuracy_vs_time"].axes[0].get_lines()) == 3  # two strategies and the target
  assert not _target_lines(compare["compare_loss_vs_updates"].axes[0])


def _saturating(seed=0, points=60, end=0.99):
  """Accuracy from chance to ``end`` in the first 6 of ``points`` evaluations, then flat within 0.01."""
  rng = np.random.default_rng(seed)
  accuracy = np.concatenate([np.linspace(0.1, end - 0.01, 6), end - 0.01 * rng.random(points - 6)])
  return make_history(
    eval_time=np.linspace(0.0, 10.0, points),
    eval_version=np.arange(points) * 10,
    metrics={"accuracy": accuracy, "loss": np.linspace(2.0, 0.05, points)},
  )


def test_an_accuracy_that_saturates_early_gets_a_second_panel_zoomed_near_the_top():
  history = _saturating()
  accuracy = history.eval_metrics["accuracy"]
  figure = plots.run_figures(history, label="r", target=("accuracy", 0.95))["accuracy_vs_time"]
  full, near = figure.axes
  assert full.get_ylim()[0] < 0.1 and full.get_ylim()[1] > 0.99  # the whole curve, rise included
  bottom, top = near.get_ylim()
  # Everything after the rise, and the target, fit; the range is a few hundredths, not 0.1 to 1.
  assert bottom < min(accuracy[15:].min(), 0.95) and top > accuracy.max()
  assert top - bottom < 0.1 and 0.93 < bottom
  (line,) = _target_lines(near)
  np.testing.assert_allclose(line.get_ydata(), [0.95, 0.95])
  assert near.get_xlabel() == "simulated seconds" and near.get_ylabel() == "accuracy, zoomed"
  np.testing.assert_allclose(near.get_lines()[0].get_ydata(), accuracy)  # the same curve, zoomed
  # The loss (log scale) and a curve already spread over its range keep one panel.
  assert len(plots.run_figures(history, label="r")["loss_vs_time"].axes) == 1
  assert len(plots.run_figures(make_history(), label="r")["accuracy_vs_time"].axes) == 1
  # The compare plot too, where a diverged strategy (ending at chance) stays in the full panel only.
  diverged = make_history(
    eval_time=np.linspace(0.0, 10.0, 60),
    eval_version=np.arange(60) * 10,
    metrics={"accuracy": np.full(60, 0.1), "loss": np.full(60, 2.3)},
  )
  runs = {"ormo": [_saturating(0), _saturating(1)], "naive": [diverged]}
  figure = plots.compare_figures(runs, target=("accuracy", 0.95))["compare_accuracy_vs_updates"]
  full, near = figure.axes
  assert 0.93 < near.get_ylim()[0] < 0.95 and near.get_ylim()[1] < 1.0
  assert [t.get_text() for t in full.get_legend().get_texts()][:2] == ["ormo (2 seeds)", "naive (1 seed)"]


def test_zoom_range_is_none_when_nothing_is_squashed():
  assert plots.zoom_range([np.linspace(0.1, 0.9, 20)]) is None  # rises over the whole run
  assert plots.zoom_range([np.full(20, 0.1)], target=0.95) is None  # diverged: nothing near the top
  assert plots.zoom_range([np.array([0.5, 0.5])]) is None  # flat
  bottom, top = plots.zoom_range([np.r_[0.1, np.full(19, 0.98)]], target=0.95)
  assert 0.94 < bottom < 0.95 and 0.98 < top < 0.99
  # A target low in the range is drawn in the full panel only: the zoom keeps to the settled curve.
  bottom, top = plots.zoom_range([np.r_[0.1, np.full(19, 0.98)]], target=0.3)
  assert 0.97 < bottom < 0.98


def _two_speeds():
  """Workers 0-2 arrive four times as often as worker 3 (4x slower), whose staleness is 4x theirs."""
  cycle = [0, 1, 2] * 4 + [3]
  worker = np.asarray(cycle * 4)
  staleness = np.where(worker == 3, 12, 3) + np.tile(np.arange(13) % 2, 4)
  history = make_history(staleness, num_workers=4)
  history.worker = worker
  return history


def test_the_staleness_histogram_is_stacked_by_worker_speed_and_says_why():
  history = _two_speeds()
  classes = plots.speed_classes(history)
  assert [list(ids) for ids, _ in classes] == [[0, 1, 2], [3]]
  assert [s for _, s in classes] == [1.0, 4.0]
  ax = plots.run_figures(history, label="r")["staleness_hist"].axes[0]
  fast, slow = ax.containers
  _, counts = plots.staleness_counts(history)
  np.testing.assert_array_equal([b.get_height() for b in fast], plots.staleness_counts(history, [0, 1, 2])[1])
  np.testing.assert_array_equal([b.get_height() for b in slow], plots.staleness_counts(history, [3])[1])
  np.testing.assert_array_equal([b.get_height() + b.get_y() for b in slow], counts)  # stacked on the fast
  assert not plots.staleness_counts(history, [3])[1][:12].any()  # the slow peak lies apart
  legend = [t.get_text() for t in ax.get_legend().get_texts()]
  assert legend[0].startswith("3 workers (0-2), fastest: mean 3.")
  assert legend[1].startswith("1 worker (3), 4.0x slower: mean 12.")
  assert "slower workers compute longer" in ax.get_title()
  # Workers of one speed (or synchronous rounds, worker -1): one plain histogram.
  same = plots.run_figures(make_history(), label="r")["staleness_hist"].axes[0]
  assert len(same.containers) == 1 and same.get_legend() is None and "slower" not in same.get_title()
  sync = make_history()
  sync.worker = np.full(6, -1)
  assert plots.speed_classes(sync) == []


def test_advise_and_tuning_runs_get_plots_of_their_validation_metrics(tmp_path):
  """`jaxsync advise` scores its short runs on the validation split only: their curves are plotted."""
  validation = {"validation_accuracy": [0.1, 0.5, 0.7], "validation_loss": [2.0, 1.0, 0.8]}
  runs = {"asp": [make_history(metrics=validation)], "bsp": [make_history(metrics=validation)]}
  figures = plots.compare_figures(runs, num_points=5, target=("validation_accuracy", 0.6))
  stems = {f"compare_validation_{m}_vs_{a}" for m in ("accuracy", "loss") for a in ("time", "updates")}
  assert set(figures) == stems
  ax = figures["compare_validation_accuracy_vs_time"].axes[0]
  np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), [0.1, 0.5, 0.7])


def test_a_run_without_staleness_draws_no_staleness_histogram():
  figures = plots.run_figures(make_history(staleness=(0,) * 6), label="allreduce")
  assert "staleness_hist" not in figures and RUN_METRIC_FILES <= set(figures)
