"""The planner's answers, its config and its command: numbers that follow from the clock's formulas."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

import jaxsync
from jaxsync._src.app import plan_config
from jaxsync._src.app.config import ConfigError
from jaxsync.cli import main
from jaxsync.planning import Failures, ModelSize, Topology, gbits, goodput, needed_bandwidths
from jaxsync.sim import Link

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "plan" / "four_datacenters.yaml"


def _plan(strategies, *, workers=2, gbps=10.0, latency=0.0, **kw):
  return jaxsync.plan(
    ModelSize(parameters=1e9, layers=24, step_time=0.1),
    Topology(workers=workers, outer=Link(latency, gbits(gbps))),
    strategies,
    **kw,
  )


def test_diloco_utilization_is_compute_over_compute_plus_the_exposed_exchange():
  """DiLoCo H=100 at 10 Gbit/s: 16 Gbit of bfloat16 pseudo-gradients between 2 workers take 1.6 s,
  of which the last step's backward hides all but the first layer's share after it."""
  result = _plan([("DiLoCo", "diloco", {"period": 100, "quantize": None})], bandwidths=(10.0,))
  row = result.strategies[0]
  backward = 0.1 * 2 / 3
  exposed = 1.6 - backward + backward / 24  # the exchanges queue from layer 24's backward on
  np.testing.assert_allclose(row.compute_utilization, 10.0 / (10.0 + exposed), rtol=1e-6)
  np.testing.assert_allclose(row.bytes_per_step, 2e9 / 100, rtol=1e-9)  # 2 GB per round, ring factor 1
  assert row.clock == "layers"


def test_utilization_grows_with_bandwidth_and_the_needed_bandwidths_are_read_off_the_sweep():
  result = _plan([("data-parallel", "allreduce", {})])
  sweep = np.asarray(result.strategies[0].sweep)
  assert np.all(np.diff(sweep) >= -1e-12) and sweep[0] < 0.05 and sweep[-1] > 0.99
  need = result.strategies[0].needed_bandwidth
  for level, gbps in need.items():
    i = result.bandwidths.index(gbps)
    assert sweep[i] >= level and (i == 0 or sweep[i - 1] < level)
  assert needed_bandwidths([1.0, 2.0], [0.4, 0.6], (0.5, 0.9)) == {0.5: 2.0, 0.9: None}


def test_streaming_diloco_needs_less_bandwidth_than_diloco_and_int4_less_again():
  result = _plan(
    [
      ("DiLoCo", "diloco", {"period": 96, "quantize": None}),
      ("streaming", "streaming_diloco", {"period": 96, "fragments": 8, "overlap": 1, "quantize": None}),
      ("int4", "streaming_diloco", {"period": 96, "fragments": 8, "overlap": 1, "quantize": "int4"}),
    ]
  )
  need = [s.needed_bandwidth[0.9] for s in result.strategies]
  assert need[0] > need[1] > need[2]
  largest = [s.largest_exchange for s in result.strategies]
  np.testing.assert_allclose(largest[0] / largest[1], 8.0, rtol=1e-6)  # a fragment is an eighth


def test_asynchronous_strategies_run_on_events_and_report_their_idle_time():
  result = _plan([("asp", "asp", {})], workers=4, gbps=1.0, events_per_worker=10)
  row = result.strategies[0]
  assert row.clock == "events" and row.sweep == ()
  # Each arrival's push and reply (2 GB each) through one server's interface at 1 Gbit/s: 16 s per
  # arrival each way, one arrival every 16 s in the steady state, so a worker steps every 4 x 16 s.
  assert row.step_time == pytest.approx(64.0, rel=0.01)
  assert row.compute_utilization == pytest.approx(0.1 / 64.0, rel=0.01)
  assert row.bytes_per_step == pytest.approx(2e9, rel=0.01)  # one push a step; the replies are the server's


def test_goodput_of_each_failure_behaviour():
  f = Failures(chip_mtbf_hours=1000.0, restart_time=600.0, checkpoint_interval=3600.0, checkpoint_time=60.0)
  rate = 8 / (1000 * 3600)  # a worker of 8 chips
  ckpt = 1 / (1 + 60 / 3600)
  np.testing.assert_allclose(
    goodput(f, "restart", chips=80, workers=10, lost_work=1.0), ckpt / (1 + 10 * rate * (600 + 3660 / 2))
  )
  np.testing.assert_allclose(
    goodput(f, "continue", chips=80, workers=10, lost_work=100.0), ckpt * (1 - rate * 650)
  )
  assert goodput(None, "restart", chips=80, workers=10, lost_work=1.0) == 1.0
  # A job-wide restart loses more than a worker that is replaced alone.
  assert goodput(f, "restart", chips=80, workers=10, lost_work=1.0) < goodput(
    f, "replace", chips=80, workers=10, lost_work=1.0
  )


def test_a_token_budget_becomes_wall_time_through_goodput():
  model = ModelSize(parameters=1e9, layers=24, tokens_per_step=1e5)
  failures = Failures(chip_mtbf_hours=100.0)
  result = jaxsync.plan(
    model,
    Topology(workers=2, chips_per_worker=8, outer=Link(0.0, gbits(1000.0))),
    [("DiLoCo", "diloco", {"period": 100})],
    budget_tokens=2e10,
    failures=failures,
    hardware="H100",
    mfu=0.5,
  )
  row = result.strategies[0]
  np.testing.assert_allclose(result.compute_time, 6 * 1e9 * 1e5 / (8 * 989e12 * 0.5))
  assert result.budget_steps == pytest.approx(1e5)
  np.testing.assert_allclose(row.wall_time, 1e5 * row.step_time / row.goodput)


def test_fastest_k_steps_at_its_kth_gradient_not_the_workers_mean():
  # Workers of 0.1 s, one of 0.2 s; fastest-k with k = 3 waits for the third: 0.1 s a round.
  result = _plan(
    [("fastest 3 of 4", "fastest_k", {"k": 3})], workers=4, gbps=1e5, slow_fraction=0.25, slowdown=2.0
  )
  row = result.strategies[0]
  assert row.step_time == pytest.approx(0.1, rel=1e-3) and row.compute_utilization == 1.0


def test_a_hierarchical_all_reduce_counts_the_leaders_and_the_groups_bytes():
  # 8 workers in 2 groups of 4 (2 GB gradients): the 2 leaders all-reduce over the outer link, each sending
  # 2 (2 - 1) / 2 = 1 message; inside a group, a reduce and a broadcast of (4 - 1) / 4 each per worker.
  result = _plan([("h", "hierarchical_allreduce", {"group_size": 4})], workers=8, bandwidths=(10.0,))
  row = result.strategies[0]
  assert row.largest_exchange == pytest.approx(2e9)
  assert row.bytes_per_step == pytest.approx(2e9 * 2 / 8)
  assert row.inner_bytes_per_step == pytest.approx(2e9 * 2 * 3 / 4)


def test_strided_fragments_take_every_pth_layer():
  from jaxsync._src.sim.layer_clock import LayerClock

  time_model = jaxsync.sim.TimeModel(num_workers=2, jitter_shape=None)
  strategy = jaxsync.strategies.blueprint("streaming_diloco", 2, period=6, fragments=3)
  assert LayerClock(time_model, strategy, (10,) * 6, strided=True).owners() == (0, 1, 2, 0, 1, 2)
  assert LayerClock(time_model, strategy, (10,) * 6).owners() == (0, 0, 1, 1, 2, 2)


def test_bad_planner_arguments_name_the_value():
  with pytest.raises(ValueError, match="mfu=1.5"):
    _plan([("dp", "allreduce", {})], mfu=1.5)
  with pytest.raises(ValueError, match="hardware"):
    _plan([("dp", "allreduce", {})], hardware="H900")
  with pytest.raises(ValueError, match=r"exactly one of the three"):
    ModelSize(parameters=1e9, layers=24)
  with pytest.raises(ValueError, match="layers=24"):
    ModelSize(parameters=10, layers=24, step_time=1.0)
  with pytest.raises(ValueError, match="workers"):
    Topology(workers=0, outer=Link(0.0, 1e9))


@pytest.mark.parametrize(
  "override, message",
  [
    ("topology.outer.gbps=-1", "topology.outer.gbps=-1"),
    ("topology.chips_per_worker=0", "topology.chips_per_worker=0"),
    ("hardware.mfu=1.5", "hardware.mfu=1.5"),
    ("strategies=[{name: streaming_diloco, options: {period: 10, fragments: 3}}]", "fragments"),
    ("strategies=[{name: adaptive_k}]", "k_async"),
    ("strategies=[{name: alreduce}]", "did you mean 'allreduce'"),
    ("strategies=[{name: streaming_diloco, options: {period: 128, fragments: 64}}]", "model.layers=48"),
    ("strategies=[{name: dc_asgd, options: {variance_control: -1}}]", "variance_control"),
    ("hardware.accelerator=H900", "hardware.accelerator='H900'"),
    ("topology.wrokers=4", "did you mean 'workers'"),
  ],
)
def test_a_bad_plan_config_is_one_line_naming_the_key_and_value(override, message):
  with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")) as err:
    plan_config.load_plan(EXAMPLE, [override])
  assert "\n" not in str(err.value)


def test_jaxsync_plan_prints_the_table_and_writes_the_plot(tmp_path, capsys):
  out = tmp_path / "plan"
  assert main(["plan", str(EXAMPLE), "--out", str(out), "--set", "stragglers.jitter_shape=null"]) == 0
  printed = capsys.readouterr().out
  assert "| data-parallel | layers |" in printed and "predicts no accuracy or loss" in printed
  assert (
    "Fastest on this link: Streaming DiLoCo + overlap, int4 (" in printed
  )  # int4 Streaming DiLoCo, at 1 Gbit/s
  assert (out / "utilization.png").stat().st_size > 10_000
  saved = json.loads((out / "plan.json").read_text())
  assert [s["name"] for s in saved["strategies"]][:2] == ["data-parallel", "DiLoCo H=100"]
  assert (out / "plan.md").read_text().count("\n| ") >= 7


def test_a_bad_plan_config_exits_2_with_one_line(tmp_path, capsys):
  assert main(["plan", str(EXAMPLE), "--set", "topology.outer.gbps=0", "--out", str(tmp_path)]) == 2
  assert "topology.outer.gbps=0" in capsys.readouterr().err


def test_advice_on_a_plan_refuses_a_candidate_the_plan_runs_twice_with_other_options():
  from jaxsync._src.app import commands

  result = _plan(
    [("H=10", "diloco", {"period": 10}), ("H=100", "diloco", {"period": 100})], bandwidths=(1.0,)
  )
  with pytest.raises(ConfigError, match="'diloco' is in the plan 2 times"):
    commands.planned_step_times(result, ["diloco"])


def test_advice_on_a_plan_keeps_each_candidates_steps_and_takes_the_planned_seconds_per_step():
  from jaxsync._src.app import commands

  from helpers import made_up_history

  history = made_up_history(10, {"accuracy": np.linspace(0.1, 0.9, 5)})
  steps = float(np.mean(history.worker_steps))
  planned = commands.on_planned_clock(history, 2.0)
  # A worker's simulated seconds per step, elapsed / steps, become the plan's 2 s.
  np.testing.assert_allclose(planned.elapsed, 2.0 * steps)
  np.testing.assert_allclose(planned.eval_time, history.eval_time * 2.0 * steps / history.elapsed, rtol=1e-6)
  assert planned.clock == "planned" and np.array_equal(planned.eval_version, history.eval_version)
  result = _plan([("dp", "allreduce", {})], bandwidths=(10.0,))
  assert commands.planned_step_times(result, ["allreduce"]) == {"allreduce": result.strategies[0].step_time}
  with pytest.raises(ConfigError, match="'ormo' is not in the plan; the plan's strategies: allreduce"):
    commands.planned_step_times(result, ["ormo"])


@pytest.mark.heavy
def test_jaxsync_advise_on_a_plan_says_what_comes_from_where(tmp_path, capsys):
  plan_file = tmp_path / "plan.yaml"
  plan_file.write_text(
    "model: {parameters: 1.0e9, layers: 24, step_time: 0.1}\n"
    "topology: {workers: 8, outer: {gbps: 1.0, latency: 0.01}}\n"
    "strategies: [{name: ormo}, {name: allreduce}]\n"
  )
  argv = ["advise", str(ROOT / "configs" / "quickstart.yaml"), "--plan", str(plan_file), "--strategies",
          "ormo,allreduce", "--seeds", "1", "--fraction", "0.05", "--out", str(tmp_path / "advice")]  # fmt: skip
  assert main(argv) == 0
  printed = capsys.readouterr().out
  assert "planned s to validation accuracy" in printed and "from the planner alone" in printed
  assert "from the planner alone" in (tmp_path / "advice" / "advice.md").read_text()


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "plan").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_plan_loads(path):
  config = plan_config.load_plan(path)
  assert config.strategies and config.topology.workers >= 1


def test_a_plan_file_that_is_not_yaml_is_one_line(tmp_path):
  bad = tmp_path / "bad.yaml"
  bad.write_text("model: [1\n")
  with pytest.raises(ConfigError, match="is not valid YAML") as err:
    plan_config.load_plan(bad)
  assert "\n" not in str(err.value)
