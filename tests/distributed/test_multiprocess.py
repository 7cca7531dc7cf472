"""Real multi-process runs on 127.0.0.1 through ``jaxsync launch``: equivalence and faults.

Every run here is separate Python processes joined by ``jax.distributed``
(gloo collectives, a ZeroMQ parameter server); every wait has a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import psutil
import pytest

from jaxsync._src.app import config as config_lib
from jaxsync._src.app import experiment
from jaxsync._src.distributed.server import param_server
from jaxsync._src.train.checkpoints import RunCheckpoints

import helpers

# Seconds each: `-m 'not heavy'` leaves them out of a quick pass.
pytestmark = pytest.mark.heavy

BASE = ["model.name=mlp", "run.eval_every=50", "run.target_accuracy=0.9", "run.checkpoint_every=null"]


def _start(*args, out):
  return helpers.jaxsync_process(*args)


def _launch(n, out, overrides, *, timeout=240):
  sets = [f"--set={o}" for o in [*BASE, *overrides]]
  p = _start("launch", "-n", str(n), str(helpers.QUICKSTART), *sets, "--out", str(out), out=out)
  log, _ = p.communicate(timeout=timeout)
  return p.returncode, log


def _process(launcher: subprocess.Popen, index: int, timeout: float = 120) -> psutil.Process:
  """The launched process with JAXSYNC_PROCESS_ID=index."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    for child in psutil.Process(launcher.pid).children():
      try:
        if child.environ().get("JAXSYNC_PROCESS_ID") == str(index):
          return child
      except psutil.Error:
        continue
    time.sleep(0.1)
  raise TimeoutError(f"process {index} did not start")


def _read_until(p: subprocess.Popen, pattern: str, timeout: float) -> str:
  """Reads ``p``'s output until a line matches ``pattern``; returns what was read (fails after ``timeout``).

  It reads the pipe's descriptor itself: ``select`` says nothing of lines already in the text
  wrapper's buffer, so a ``readline`` loop could sit on the matching line until the process wrote
  again (with ``--progress quiet``, at the run's end: a kill meant for its start came at its end).
  """
  import select

  fd, data, deadline = p.stdout.fileno(), b"", time.monotonic() + timeout
  os.set_blocking(fd, True)
  while time.monotonic() < deadline:
    if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
      break  # nothing more within the timeout: never block past it
    chunk = os.read(fd, 1 << 16)
    if not chunk:
      break
    data += chunk
    text = data.decode(errors="replace")
    if any(re.search(pattern, line) for line in text.splitlines()):
      return text  # the rest of the output comes through communicate()
  raise AssertionError(
    f"no line matching {pattern!r} within {timeout} s; output:\n{data.decode(errors='replace')[-3000:]}"
  )


def _wait_for_rows(run_dir, kind: str, count: int, timeout: float) -> None:
  """Waits until ``run_dir/metrics.jsonl`` holds ``count`` rows of ``kind`` (the run is under way)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    path = run_dir / "metrics.jsonl"
    if path.exists() and sum(f'"kind": "{kind}"' in line for line in path.read_text().splitlines()) >= count:
      return
    time.sleep(0.1)
  raise AssertionError(f"no {count} {kind} rows in {run_dir}/metrics.jsonl within {timeout} s")


def _kill_tree(launcher: subprocess.Popen) -> None:
  """Kills the launcher and every process it started (they run in sessions of their own)."""
  try:
    children = psutil.Process(launcher.pid).children(recursive=True)
  except psutil.Error:
    children = []
  for child in children:
    try:
      child.kill()
    except psutil.Error:
      pass
  launcher.kill()


@contextlib.contextmanager
def _launched(n: int, overrides, out, log_path, *extra: str):
  """``jaxsync launch -n N`` of the quickstart config with ``overrides`` (and ``extra`` arguments), its log
  written to ``log_path`` while the test signals its processes; every process is killed at the end."""
  sets = [f"--set={o}" for o in [*BASE, *overrides]]
  command = ["launch", "-n", str(n), str(helpers.QUICKSTART), *sets, "--out", str(out), *extra]
  env = {**os.environ, "PYTHONUNBUFFERED": "1", "JAXSYNC_HEARTBEAT_TIMEOUT": "3"}
  with open(log_path, "w") as log_file:
    launcher = subprocess.Popen(
      [sys.executable, "-m", "jaxsync.cli", *command, "--progress", "quiet"],
      stdout=log_file, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
      yield launcher
    finally:
      if launcher.poll() is None:
        _kill_tree(launcher)


def _summary(run_dir):
  return json.loads((run_dir / "summary.json").read_text())


def _final_params(run_dir, state_like):
  """The final parameters in a run directory's last checkpoint."""
  ckpt = RunCheckpoints(run_dir / "checkpoints", read_only=True)
  state, _, _ = ckpt.restore(state_like)
  ckpt.close()
  return state.params


def _simulated(overrides, num_events):
  cfg = config_lib.load(helpers.QUICKSTART, [*BASE, *overrides])
  exp = experiment.build(cfg)
  sim = exp.simulator()
  state, records = sim.advance(sim.init(exp.model.params, cfg.seed), num_events)
  return exp, state, records


def test_bsp_on_two_processes_equals_simulated_bsp_and_stays_identical_across_processes(tmp_path):
  overrides = ["strategy.name=bsp", "cluster.num_workers=2", "run.gradients=120", "run.chunk=20"]
  code, log = _launch(2, tmp_path / "bsp", overrides)
  assert code == 0, log[-3000:]
  hashes = dict(re.findall(r"\[p\d\] process (\d): final parameters sha256 (\w+)", log))
  assert set(hashes) == {"0", "1"} and hashes["0"] == hashes["1"], log[-2000:]  # bit-identical
  # No routine library notes: the coordination service's, gloo's, orbax's read-only manager's.
  for note in ("recoverable task", "[Gloo]", "is read only"):
    assert note not in log, log[-3000:]
  exp, sim_state, _ = _simulated(overrides, 60)
  summary = _summary(tmp_path / "bsp")
  assert summary["updates"] == 60 and summary["gradients"] == 120
  # A real run's time is wall seconds, and says so everywhere: summary, metrics, the final line.
  assert summary["clock"] == "wall" and summary["wall_time"] > 0 and "simulated_time" not in summary
  rows = [json.loads(line) for line in (tmp_path / "bsp" / "metrics.jsonl").read_text().splitlines()]
  assert all("wall_time" in row and "simulated_time" not in row for row in rows)
  assert "simulated" not in log
  # One all-reduce of per-worker gradients against one batched gradient: equal up to float rounding.
  state_like = helpers.sync_state_like(exp, 2)
  params = _final_params(tmp_path / "bsp", state_like)
  for a, b in zip(jax.tree.leaves(sim_state.params), jax.tree.leaves(params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-4, atol=2e-5)
  assert abs(summary["final_accuracy"] - exp.simulator().evaluate(sim_state.params)["accuracy"]) < 0.01


def _launch_and_kill(n: int, overrides, out, *, after: str, victim: int):
  """``jaxsync launch -n N``; SIGKILLs process ``victim`` 0.5 s after the log says ``after``; (launcher, log, kill time)."""
  sets = [f"--set={o}" for o in [*BASE, *overrides]]
  launcher = _start("launch", "-n", str(n), str(helpers.QUICKSTART), *sets, "--out", str(out), out=out)
  try:
    head = _read_until(launcher, after, 120)
    time.sleep(0.5)  # let it push for a while
    _process(launcher, victim).send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    log, _ = launcher.communicate(timeout=180)
  finally:
    if launcher.poll() is None:
      _kill_tree(launcher)
  return launcher, head + log, killed_at


def test_async_worker_killed_with_sigkill_the_run_finishes_with_the_others(tmp_path):
  out = tmp_path / "asp"
  overrides = [
    "strategy.name=asp",
    "strategy.options={learning_rate: 0.05}",
    "cluster.num_workers=2",
    # Long enough that the loss is declared (3 s heartbeat timeout) before the run ends: worker 0
    # alone pushes 2,000 gradients in about 5 s.
    "run.gradients=5000",
    "run.chunk=100",
  ]
  launcher, log, killed_at = _launch_and_kill(3, overrides, out, after=r"worker 1 joined", victim=2)
  assert launcher.returncode == 0, log[-3000:]
  assert re.search(r"worker 1 \(process 2\) lost at [\d.]+ s, server version \d+", log), log[-3000:]
  assert "process 2 ended with signal 9" in log
  summary = _summary(out)
  lost = summary["lost_workers"]
  assert [x["worker"] for x in lost] == [1]
  # Every update already applied is kept: the run reaches its full count with worker 0 alone.
  assert summary["updates"] == 5000 and summary["events"] == 5000 and summary["gradients"] == 5000
  assert time.monotonic() - killed_at < 170


def test_inhad_node_whose_aggregator_is_killed_is_dropped_whole_and_the_run_finishes_with_the_other(tmp_path):
  """Node 1's aggregator runs in worker 2's process: killing it drops workers 2 and 3 (3 cannot reach the
  server without it); the gradients node 1 held count as zeros; node 0 carries the run to its end."""
  out = tmp_path / "inhad"
  overrides = [
    "strategy.name=inhad",
    "strategy.options={local_workers: 2, learning_rate: 0.1}",
    "cluster.num_workers=4",
    "run.gradients=8000",  # long enough that the loss is declared (3 s heartbeat timeout) before the end
    "run.chunk=200",
  ]
  launcher, log, _ = _launch_and_kill(5, overrides, out, after=r"worker 3 joined", victim=3)
  assert launcher.returncode == 0, log[-3000:]
  assert "node 1's aggregator (in worker 2's process) is lost: its workers are dropped with it" in log, log[
    -3000:
  ]
  # Worker 3 stops waiting for its node once the node's process stops beating, and says why.
  assert "node 1's aggregator (process 3) is lost" in log and "process 4 ended with exit code 3" in log, log[
    -3000:
  ]
  summary = _summary(out)
  assert sorted(x["worker"] for x in summary["lost_workers"]) == [2, 3]
  assert summary["events"] == 8000 and summary["updates"] == 2000, summary
  assert summary["final_accuracy"] > 0.85, summary


def test_sync_run_that_loses_a_process_stops_in_bounded_time_naming_it(tmp_path):
  out = tmp_path / "bsp"
  overrides = ["strategy.name=bsp", "cluster.num_workers=2", "run.gradients=200000", "run.chunk=50"]
  sets = [f"--set={o}" for o in [*BASE, *overrides]]
  launcher = _start("launch", "-n", "2", str(helpers.QUICKSTART), *sets, "--out", str(out), out=out)
  try:
    _wait_for_rows(out, "train", 2, 180)  # the processes' collectives are connected and rounds run
    _process(launcher, 1).send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    log, _ = launcher.communicate(timeout=120)
    elapsed = time.monotonic() - killed_at
  finally:
    if launcher.poll() is None:
      _kill_tree(launcher)
  assert launcher.returncode == 3, log[-3000:]
  assert re.search(r"\[p0\] jaxsync: error: process 1 is lost; a synchronous round cannot complete", log), (
    log[-3000:]
  )
  assert elapsed < 60  # the heartbeat timeout (10 s) plus shutdown, never a hang


@pytest.mark.parametrize("fault", ["SIGKILL the server", "SIGTERM the launcher"])
def test_killed_or_preempted_server_resumes_and_one_worker_still_equals_the_simulator(tmp_path, fault):
  """A killed server resumes from its last checkpoint; a preempted run (SIGTERM to the launcher, passed on to
  every process) checkpoints at the server's next chunk and exits 75. Either way, resumed, one worker's run
  ends in the simulator's parameters."""
  out = tmp_path / "asp1"
  overrides = [
    "strategy.name=asp",
    "strategy.options={learning_rate: 0.05}",
    "cluster.num_workers=1",
    "run.gradients=900",
    "run.chunk=50",
    "run.checkpoint_every=100",
  ]
  sets = [f"--set={o}" for o in [*BASE, *overrides]]
  launcher = _start("launch", "-n", "2", str(helpers.QUICKSTART), *sets, "--out", str(out), out=out)
  try:
    deadline = time.monotonic() + 150
    while not (out / "checkpoints" / "200").exists() and time.monotonic() < deadline:
      time.sleep(0.05)
    assert (out / "checkpoints" / "200").exists(), "no checkpoint"
    if fault == "SIGKILL the server":
      _process(launcher, 0).send_signal(signal.SIGKILL)
    else:
      launcher.send_signal(signal.SIGTERM)
    log, _ = launcher.communicate(timeout=120)
  finally:
    if launcher.poll() is None:
      _kill_tree(launcher)
  assert not (out / "summary.json").exists()  # it really stopped mid-run
  if fault == "SIGTERM the launcher":
    assert launcher.returncode == 75, log[-3000:]
    done = int(re.search(r"\[p0\] jaxsync: preempted \(SIGTERM\) after (\d+) events", log)[1])
    assert done % 50 == 0 and RunCheckpoints(out / "checkpoints").latest_step() == done, log[-3000:]
    assert re.search(r"\[p1\] worker 0: \d+ pushes .* the server said stop", log), log[-3000:]
  resumed = _start("resume", str(out), out=out)
  log, _ = resumed.communicate(timeout=240)
  assert resumed.returncode == 0, log[-3000:]
  assert re.search(r"worker 0 joined at version [1-9]\d*, data step [1-9]", log), log[-3000:]
  summary = _summary(out)
  assert summary["updates"] == 900
  # With one worker the real run, interrupted or not, is the simulated one: same parameters.
  exp, sim_state, _ = _simulated(overrides, 900)
  server = param_server.ParameterServer(exp.strategy)
  like = jax.tree.map(np.asarray, server.init(exp.model.params))
  server.stop(timeout=0.1)
  params = _final_params(out, like)
  for a, b in zip(jax.tree.leaves(sim_state.params), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


@pytest.mark.parametrize("strategy", ["ormo"])
def test_three_worker_ormo_reaches_the_simulated_accuracy_band(tmp_path, strategy):
  overrides = [f"strategy.name={strategy}", "cluster.num_workers=3", "run.gradients=900", "run.chunk=100"]
  code, log = _launch(4, tmp_path / "ormo", overrides)
  assert code == 0, log[-3000:]
  summary = _summary(tmp_path / "ormo")
  exp, sim_state, _ = _simulated(overrides, 900)
  simulated = exp.simulator().evaluate(sim_state.params)["accuracy"]
  assert summary["updates"] == 900
  assert summary["final_accuracy"] > simulated - 0.03, (summary["final_accuracy"], simulated)
  assert summary["mean_staleness"] > 0.5  # three real workers really overlap


@pytest.mark.parametrize(
  "strategy, options, workers, processes",
  [
    ("easgd", "{period: 4, learning_rate: 0.05}", 3, 4),  # elastic: local steps and a locked exchange
    # Synchronous rounds on the server, the slowest dropped.
    ("fastest_k", "{k: 2, learning_rate: 0.05}", 3, 4),
    # EA-wild in two synchronous groups of two: a server and one worker process per group.
    ("ea_wild", "{group_size: 2, learning_rate: 0.05}", 4, 3),
    # InHAD on two nodes of two workers: each node's first worker process runs its aggregator.
    ("inhad", "{local_workers: 2, learning_rate: 0.1}", 4, 5),
    # Asynchronous local SGD: local AdamW steps, pseudo-gradients applied by Delayed Nesterov. (Without
    # DyLU: its steps are sized for the simulated slow worker, and real processes are equally fast.) At
    # DiLoCo's outer rate and momentum (0.7, 0.9) three asynchronous workers oscillate between 0.6 and
    # 0.9 in the simulator as on real processes, a band no test can hold; at 0.5, 0.5 both settle at 0.97.
    (
      "async_local_sgd",
      "{period: 4, learning_rate: 0.003, outer_learning_rate: 0.5, outer_momentum: 0.5}",
      3,
      4,
    ),
    # Streaming DiLoCo on the all-reduce loop: a fragment per round, int4 on the wire, overlapped and mixed.
    ("streaming_diloco", "{period: 4, learning_rate: 0.003}", 2, 2),
  ],
)
def test_elastic_fastest_k_and_ea_wild_group_runs_reach_the_simulated_accuracy_band(
  tmp_path, strategy, options, workers, processes
):
  overrides = [
    f"strategy.name={strategy}",
    f"strategy.options={options}",
    f"cluster.num_workers={workers}",
    "run.gradients=900",
    "run.chunk=50",
  ]
  if strategy == "streaming_diloco":
    # Its second worker 2x slower for real: it measures its compute on its own copy of the parameters
    # (reading back the worker-sharded models would be a collective the other process is not in: a hang).
    overrides += ["cluster.slow_fraction=0.5", "cluster.slowdown=2", "cluster.emulate_slow_workers=true"]
  code, log = _launch(processes, tmp_path / strategy, overrides)
  assert code == 0, log[-3000:]
  summary = _summary(tmp_path / strategy)
  num_events = experiment.build(config_lib.load(helpers.QUICKSTART, [*BASE, *overrides])).num_events
  exp, sim_state, _ = _simulated(overrides, num_events)
  simulated = exp.simulator().evaluate(sim_state.params)["accuracy"]
  assert summary["events"] == num_events
  assert summary["final_accuracy"] > simulated - 0.03, (summary["final_accuracy"], simulated)
  if strategy == "easgd":
    # 900 local steps, an exchange on each worker's steps 0, 4, 8, ...: ceil(n_k / 4) summed over workers.
    assert 225 <= summary["updates"] <= 227, summary
  elif strategy == "ea_wild":
    # 450 group steps of two gradients each, every one an exchange with the centre.
    assert summary["events"] == summary["updates"] == 450 and summary["gradients"] == 900, summary
    assert "[p1] worker 0:" in log and "[p2] worker 1:" in log and "[p3]" not in log, log[-3000:]
  elif strategy == "inhad":
    # A pull every K = 4 gradients; the gradients stayed on the nodes: the server's card moved only
    # the pulled sums (one per node that held any) and the broadcasts (one per node per version).
    assert summary["updates"] == 225 and summary["gradients"] == 900, summary
    assert "node 0's aggregator joined" in log and "node 1's aggregator joined" in log, log[-3000:]
    message = exp.model.num_params * 4
    assert summary["bytes_moved_intra"] == 2 * 900 * message, summary
    assert 226 * 2 + 225 <= summary["bytes_moved"] / message <= 226 * 2 + 225 * 2, summary
  elif strategy == "async_local_sgd":
    # 225 pushes of 4 local steps each.
    assert summary["updates"] == num_events == 225 and summary["gradients"] == 900, summary
  elif strategy == "streaming_diloco":
    # 225 rounds of 2 local steps on 2 workers, one fragment of the MLP each (113 of the first, 112 of
    # the second), through the all-to-all and all-gather of their 4-bit integers and scales.
    assert summary["updates"] == 225 and summary["gradients"] == 900, summary
    from jaxsync._src.distributed import quantized_all_reduce
    from jaxsync._src.rules import diloco

    leaves = [x.size for x in jax.tree.leaves(exp.model.params)]
    owner = diloco.fragment_of_leaves(exp.model.params, 2)
    per_round = [
      quantized_all_reduce.bytes_moved([n for n, o in zip(leaves, owner) if o == p], "int4", 64, 2)
      for p in (0, 1)
    ]
    assert summary["bytes_moved"] == 113 * per_round[0] + 112 * per_round[1], summary
    # Against a float32 ring all-reduce of the whole model every round: 14x fewer bytes.
    assert summary["bytes_moved"] * 14 < 225 * 2 * exp.model.num_params * 4, summary
  else:
    # 300 rounds, the first 2 gradients of each applied; every later one dropped, never applied. (On a
    # loaded machine the third worker may join after the run's 1.5 s: then nothing was late.)
    assert summary["updates"] == 300
    assert summary["gradients"] - summary["dropped_gradients"] == 600, summary


def test_a_server_sharded_over_two_processes_equals_the_simulator_for_one_worker(tmp_path):
  # Adaptive-k with Barzilai-Borwein step sizes: global tests and a noise ratio each shard must agree on.
  overrides = [
    "strategy.name=adaptive_k",
    "strategy.options={learning_rate: 0.05, bb_step_size: true}",
    "cluster.num_workers=1",
    "cluster.servers=2",
    "run.gradients=60",
    "run.eval_every=20",
  ]
  out = tmp_path / "sharded"
  code, log = _launch(3, out, overrides)
  assert code == 0, log[-3000:]
  assert "[p1] server shard 1: done" in log and "[p2] worker 0: 61 pushes" in log, log[-3000:]
  exp, sim_state, sim_records = _simulated(overrides, 60)
  summary = _summary(out)
  assert summary["updates"] == 60 and summary["rejected_messages"] == {}
  # The checkpoint holds the rule's state of the raveled parameters (the shards' own form).
  from jax.flatten_util import ravel_pytree

  from jaxsync._src.distributed.server import server_step

  flat = ravel_pytree(exp.model.params)[0]
  like = server_step.init(exp.strategy, flat, exp.simulator().schedule)._replace(params=exp.model.params)
  params = _final_params(out, jax.tree.map(np.asarray, like))
  for a, b in zip(jax.tree.leaves(sim_state.params), jax.tree.leaves(params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
  # Each evaluation ran on the slices, gathered: the simulator's numbers.
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  evaluated = {r["updates"]: r["accuracy"] for r in rows if r["kind"] == "eval" and r["updates"]}
  simulated = {
    int(v): float(a)
    for v, a, e in zip(sim_records.version, sim_records.metrics["accuracy"], sim_records.evaluated)
    if e
  }
  assert sorted(evaluated) == sorted(simulated) == [20, 40, 60]
  for version, accuracy in simulated.items():
    assert abs(evaluated[version] - accuracy) < 0.01, (evaluated, simulated)


def _fingerprints(log: str) -> dict[str, str]:
  return dict(re.findall(r"\[p\d\] process (\d): final parameters sha256 (\w+)", log))


def test_a_sync_run_restarts_itself_after_a_killed_worker_and_resumes_exactly_after_a_preemption(tmp_path):
  """`jaxsync launch -n 3 --max-restarts 2`: a SIGKILLed worker restarts the run from process 0's checkpoint
  of every completed round (none is lost); SIGTERM to the launcher then stops every process at one chunk's
  end with a checkpoint (exit 75), and `jaxsync resume` finishes the run. The final parameters equal an
  uninterrupted run's, bit for bit."""
  overrides = ["strategy.name=allreduce", "cluster.num_workers=3", "run.gradients=3000", "run.chunk=50"]
  code, log = _launch(3, tmp_path / "whole", overrides)
  assert code == 0, log[-3000:]
  reference = _fingerprints(log)
  assert set(reference) == {"0", "1", "2"} and len(set(reference.values())) == 1, log[-2000:]

  out, log_path = tmp_path / "faulted", tmp_path / "faulted.log"
  with _launched(3, overrides, out, log_path, "--max-restarts", "2") as launcher:
    _wait_for_rows(out, "train", 3, 180)
    _process(launcher, 2).send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 120
    while not (out / "restarts.jsonl").exists():
      assert launcher.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
      time.sleep(0.1)
    restart = json.loads((out / "restarts.jsonl").read_text())
    _wait_for_rows(out, "train", restart["checkpoint"] // 50 + 2, 180)  # the restarted run goes on
    launcher.send_signal(signal.SIGTERM)
    launcher.wait(timeout=120)
  log = log_path.read_text()
  assert launcher.returncode == 75, log[-3000:]
  assert {k: restart[k] for k in ("restart", "process", "ended", "scope")} == {
    "restart": 1, "process": 2, "ended": "signal 9", "scope": "run",
  }, restart  # fmt: skip
  # Peer recovery: the checkpoint the run restarted from holds every round completed before the fault,
  # written then (the first periodic one, every 10 chunks, would be at round 500). Process 0 writes it; a
  # survivor whose part of the last round's ring had not arrived when the peer died counts one round fewer.
  completed = {p: int(n) for p, n in re.findall(r"\[p([01])\] .* after (\d+) completed rounds", log)}
  assert completed.get("0") == restart["checkpoint"], (completed, restart)
  assert 150 <= restart["checkpoint"] < 500, restart
  assert all(restart["checkpoint"] - 1 <= n <= restart["checkpoint"] for n in completed.values()), completed
  assert restart["down_seconds"] < 60, restart
  preempted = {int(n) for n in re.findall(r"\[p\d\] jaxsync: preempted \(SIGTERM\) after (\d+) events", log)}
  assert len(preempted) == 1 and restart["checkpoint"] < min(preempted) < 1000, log[-3000:]
  assert not (out / "summary.json").exists()

  resumed = _start("resume", str(out), out=out)
  log, _ = resumed.communicate(timeout=240)
  assert resumed.returncode == 0, log[-3000:]
  assert _fingerprints(log) == reference, log[-2000:]
  assert _summary(out)["updates"] == 1000
  events = [json.loads(r)["event"] for r in (out / "metrics.jsonl").read_text().splitlines()]
  events = [e for e, r in zip(events, (out / "metrics.jsonl").read_text().splitlines()) if '"train"' in r]
  assert events == sorted(set(events)) and events[-1] == 1000, events  # each chunk's row once


def test_churn_elastic_diloco_goes_on_without_a_killed_worker_and_counts_its_replacement(tmp_path):
  """`jaxsync launch -n 4 --max-restarts 1 --rejoin-delay 6`, DiLoCo with elastic membership: worker 2's
  process is SIGKILLed mid-run; once it is declared lost the rounds go on with the 2 others, and its
  replacement, started 6 s later, joins and is counted again. Nothing is lost."""
  out, log_path = tmp_path / "elastic", tmp_path / "elastic.log"
  overrides = [
    "strategy.name=diloco",
    "strategy.options={period: 10, membership: elastic}",
    "cluster.num_workers=3",
    "run.gradients=150000",  # 5,000 rounds: 25-40 s on 2 cores
    "run.chunk=100",
    "run.eval_every=500",
  ]
  with _launched(4, overrides, out, log_path, "--max-restarts", "1", "--rejoin-delay", "6") as launcher:
    _wait_for_rows(out, "train", 5, 180)
    _process(launcher, 3).send_signal(signal.SIGKILL)
    launcher.wait(timeout=240)
  log = log_path.read_text()
  assert launcher.returncode == 0, log[-3000:]
  lost = re.search(r"worker 2 \(process 3\) lost at [\d.]+ s, server version (\d+); going on with 2", log)
  # Its replacement joins the open round, or the next one if the open one already has pseudo-gradients.
  joined = re.search(r"worker 2 joined at round (\d+)", log[lost.end() :] if lost else "")
  assert lost and joined and int(joined[1]) > int(lost[1]), log[-3000:]
  rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
  mean_k = [r["mean_k"] for r in rows if r["kind"] == "train"]
  assert mean_k[:5] == [3.0] * 5, mean_k
  gone = [i for i, k in enumerate(mean_k) if k == 2.0]
  assert gone and mean_k[-1] == 3.0, mean_k  # whole chunks with 2 members, then 3 again
  summary = _summary(out)
  assert [x["worker"] for x in summary["lost_workers"]] == [2]
  # 5,000 rounds; the worker steps they averaged: 10 per member, fewer members while worker 2 was gone.
  assert summary["events"] == 5000 and summary["gradients"] < 150000 and summary["gradients"] % 10 == 0
  assert summary["dropped_gradients"] == 0
  assert summary["final_accuracy"] > 0.9, summary
  restart = json.loads((out / "restarts.jsonl").read_text())
  assert {k: restart[k] for k in ("process", "ended", "scope")} == {
    "process": 3,
    "ended": "signal 9",
    "scope": "process",
  }


def test_churn_sync_allreduce_shrinks_to_its_survivors_and_grows_back_when_the_replacement_arrives(tmp_path):
  """`jaxsync launch -n 3 --max-restarts 1 --min-workers 2 --rejoin-delay 8`, all-reduce: process 2 is
  SIGKILLed; the 2 others go on at once as a run of 2 workers from the checkpoint of every completed round
  (each with a batch of 48, 96 examples per round as before), and when the replacement arrives the run
  stops at a chunk's end and goes on with 3. No round is lost or run twice; the budget is the config's."""
  out, log_path = tmp_path / "shrinking", tmp_path / "shrinking.log"
  overrides = ["strategy.name=allreduce", "cluster.num_workers=3", "run.gradients=15000", "run.chunk=50"]
  extra = ("--max-restarts", "1", "--min-workers", "2", "--rejoin-delay", "8")
  with _launched(3, overrides, out, log_path, *extra) as launcher:
    _wait_for_rows(out, "train", 3, 180)
    _process(launcher, 2).send_signal(signal.SIGKILL)
    launcher.wait(timeout=300)
  log = log_path.read_text()
  assert launcher.returncode == 0, log[-3000:]
  shrink, grow = [json.loads(r) for r in (out / "restarts.jsonl").read_text().splitlines()]
  assert (shrink["scope"], shrink["process"], shrink["workers"]) == ("shrink", 2, 2), shrink
  assert (grow["scope"], grow["process"], grow["workers"], grow["restart"]) == ("grow", None, 3, 1), grow
  segments = [json.loads(r) for r in (out / "membership.jsonl").read_text().splitlines()]
  assert [(s["from_event"], s["workers"], s["kept"]) for s in segments] == [
    (shrink["checkpoint"], 2, [0, 1]),
    (grow["checkpoint"], 3, [0, 1, None]),
  ]
  assert f"2 of 3 workers from round {shrink['checkpoint']} (cluster.shrink_keeps=global_batch): batch per " \
    "worker 48 (config 32), 96 examples per round (config 96)" in log, log[-3000:]  # fmt: skip
  assert "a replacement arrived" in log and "exit code 75" not in log, log[-3000:]
  rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in rows if r["kind"] == "train"]
  events = [r["event"] for r in train]
  assert events == sorted(set(events)) and events[-1] == 5000, events  # every round once, to the budget's
  by_size = [(r["event"], r["mean_k"]) for r in train]
  assert {k for e, k in by_size if e <= shrink["checkpoint"]} == {3.0}, by_size
  assert {k for e, k in by_size if shrink["checkpoint"] < e <= grow["checkpoint"]} == {2.0}, by_size
  assert {k for e, k in by_size if e > grow["checkpoint"]} == {3.0}, by_size
  fingerprints = _fingerprints(log[log.rindex("the run goes on with 3 workers") :])
  assert set(fingerprints) == {"0", "1", "2"} and len(set(fingerprints.values())) == 1, log[-2000:]
  summary = _summary(out)
  assert summary["events"] == 5000 and summary["final_accuracy"] > 0.9, summary


def test_a_sync_run_that_loses_process_0_restarts_from_process_1s_checkpoint_of_every_completed_round(
  tmp_path,
):
  """Process 0 of an all-reduce run is SIGKILLed mid-run, with no periodic checkpoint: process 1, which holds
  the same state, writes the checkpoint of every completed round, and the restarted run (`--max-restarts`)
  continues from it to the final parameters of an uninterrupted run, bit for bit."""
  overrides = ["strategy.name=allreduce", "cluster.num_workers=3", "run.gradients=3000", "run.chunk=50"]
  code, log = _launch(3, tmp_path / "whole", overrides)
  assert code == 0, log[-3000:]
  reference = _fingerprints(log)

  out, log_path = tmp_path / "faulted", tmp_path / "faulted.log"
  with _launched(3, overrides, out, log_path, "--max-restarts", "1") as launcher:
    _wait_for_rows(out, "train", 3, 180)
    _process(launcher, 0).send_signal(signal.SIGKILL)
    launcher.wait(timeout=300)
  log = log_path.read_text()
  assert launcher.returncode == 0, log[-3000:]
  restart = json.loads((out / "restarts.jsonl").read_text())
  assert {k: restart[k] for k in ("process", "ended", "scope")} == {
    "process": 0,
    "ended": "signal 9",
    "scope": "run",
  }
  assert "process 0 is lost: this process writes the run's checkpoint" in log, log[-3000:]
  # Rows of at least 3 chunks were written before the kill: none of those rounds is redone.
  assert restart["checkpoint"] is not None and restart["checkpoint"] >= 150, restart
  assert _fingerprints(log) == reference, log[-2000:]
  assert _summary(out)["updates"] == 1000
  events = [
    json.loads(r)["event"] for r in (out / "metrics.jsonl").read_text().splitlines() if '"train"' in r
  ]
  assert events == sorted(set(events)) and events[-1] == 1000, events  # each chunk's row once
