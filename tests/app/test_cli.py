"""The jaxsync command line: the README's main job, run directories, kill-and-resume, errors, compare."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
import yaml

from jaxsync import cli
from jaxsync._src.app import config as config_lib
from jaxsync._src.app import experiment
from jaxsync._src.train import run_directory
from jaxsync._src.train import summary as summary_lib
from jaxsync._src.train.checkpoints import RunCheckpoints

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
# The quickstart, shortened: 400 gradients, evaluations every 50 updates, chunks of 100 events.
SHORT = ["--set", "run.gradients=400", "--set", "run.eval_every=50", "--set", "run.chunk=100"]
SHORT += ["--set", "run.checkpoint_every=200", "--set", "run.target_accuracy=0.5"]
# A fast variant for the tests of the machinery: a small MLP.
FAST = SHORT + ["--set", "model.name=mlp", "--set", "model.hidden=[32]"]


def _jaxsync(*args, check=True, timeout=300):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(
    [sys.executable, "-m", "jaxsync.cli", *map(str, args)],
    capture_output=True,
    text=True,
    timeout=timeout,
    env=env,
    cwd=ROOT,
  )
  if check:
    assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def _final_state(run_dir):
  cfg = config_lib.load(run_dir / "config.yaml")
  exp = experiment.build(cfg)
  like = exp.simulator().init(exp.model.params, cfg.seed)
  ckpt = RunCheckpoints(run_dir / "checkpoints")
  state, records, progress = ckpt.restore(like)
  ckpt.close()
  return state, records, progress


@pytest.mark.heavy
def test_readme_main_command_on_a_shortened_quickstart_leaves_a_complete_run_directory(tmp_path):
  out = tmp_path / "quick"
  proc = _jaxsync("train", QUICKSTART, *SHORT, "--out", out, "--progress", "jsonl")
  stdout = [json.loads(line) for line in proc.stdout.splitlines()]
  assert [row["kind"] for row in stdout][0] == "start" and stdout[-1]["kind"] == "summary"
  assert [row["event"] for row in stdout if row["kind"] == "progress"] == [100, 200, 300, 400]

  cfg = config_lib.load(out / "config.yaml")
  assert cfg.strategy.name == "ormo" and cfg.run.gradients == 400 and cfg.model.name == "cnn"
  rows = run_directory.read_metrics(out / "metrics.jsonl")
  evals = [r for r in rows if r["kind"] == "eval"]
  assert [r["event"] for r in evals] == [0, 50, 100, 150, 200, 250, 300, 350, 400]
  assert [r["event"] for r in rows if r["kind"] == "train"] == [100, 200, 300, 400]
  assert rows[-1]["kind"] == "final" and rows[-1]["updates"] == 400

  summary = json.loads((out / "summary.json").read_text())
  assert summary["events"] == 400 and summary["updates"] == 400 and summary["gradients"] == 400
  assert summary["final_accuracy"] > 0.6  # 400 stale-momentum steps of a CNN on digits
  assert summary["final_accuracy"] == pytest.approx(rows[-1]["accuracy"])
  assert summary["best_accuracy"] == pytest.approx(max(r["accuracy"] for r in rows if "accuracy" in r))
  assert summary["mean_staleness"] > 3 and summary["bytes_moved"] > 0  # 8 workers, 151k parameters
  hit = next(r for r in evals if r["accuracy"] >= 0.5)  # the first evaluation at the target
  assert summary["time_to_target"] == pytest.approx(hit["simulated_time"])
  assert summary["updates_to_target"] == hit["updates"] and 0 < hit["updates"] < 400

  pngs = sorted(p.name for p in (out / "plots").glob("*.png"))
  assert {"accuracy_vs_time.png", "loss_vs_updates.png", "staleness_hist.png"} <= set(pngs)
  assert all((out / "plots" / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)
  events = list((out / "tensorboard").glob("events.out.tfevents.*"))
  assert events and events[0].stat().st_size > 500
  assert RunCheckpoints(out / "checkpoints").latest_step() == 400


_LONG = ["--set", "run.gradients=1600", "--set", "run.chunk=100", "--set", "run.checkpoint_every=200"]
_LONG += ["--set", "model.name=mlp", "--set", "model.hidden=[64]", "--progress", "quiet"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  whole = tmp_path_factory.mktemp("uninterrupted") / "whole"
  _jaxsync("train", QUICKSTART, *_LONG, "--out", whole)
  return whole


@pytest.mark.heavy
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_run_killed_or_preempted_and_resumed_ends_exactly_like_an_uninterrupted_one(
  tmp_path, uninterrupted, how
):
  """SIGKILL loses what came after the last checkpoint; SIGTERM (a preemption notice) checkpoints at the
  end of the chunk it arrives in and exits 75. Either way `jaxsync resume` ends in the same files."""
  whole, killed = uninterrupted, tmp_path / "killed"
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  cmd = [sys.executable, "-m", "jaxsync.cli", "train", str(QUICKSTART), *_LONG, "--out", str(killed)]
  proc = subprocess.Popen(
    cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
  )
  try:
    deadline = time.monotonic() + 240
    metrics = killed / "metrics.jsonl"
    ready = {
      "SIGKILL": lambda: (killed / "checkpoints" / "400" / "commit_success.txt").exists(),
      # Between two periodic checkpoints (every 200 events): the preemption's own may land off that grid.
      "SIGTERM": lambda: metrics.exists() and '"event": 300' in metrics.read_text(),
    }[how]
    while not ready():
      assert proc.poll() is None, proc.stderr.read()[-2000:]
      assert time.monotonic() < deadline, "the run did not get there within 240 s"
      time.sleep(0.01)
    proc.send_signal(getattr(signal, how))
    _, err = proc.communicate(timeout=60)
  finally:
    proc.kill()
    proc.communicate()
  assert not (killed / "summary.json").exists(), "the run finished before it was stopped"
  if how == "SIGTERM":
    assert proc.returncode == 75, err
    done = int(re.search(r"preempted \(SIGTERM\) after (\d+) events", err)[1])
    assert err.endswith(f"continue the run with `jaxsync resume {killed}`.\n") and err.count("\n") == 1, err
    assert done % 100 == 0 and 300 <= done < 1600, done  # the chunk boundary after the notice
    assert RunCheckpoints(killed / "checkpoints").latest_step() == done
  else:
    assert proc.returncode == -signal.SIGKILL

  resumed = _jaxsync("resume", killed, "--progress", "quiet")
  assert resumed.returncode == 0
  assert (whole / "metrics.jsonl").read_text() == (killed / "metrics.jsonl").read_text()
  a, b = (json.loads((d / "summary.json").read_text()) for d in (whole, killed))
  a.pop("wall_seconds"), b.pop("wall_seconds")
  assert a == b
  (state_a, rec_a, _), (state_b, rec_b, _) = _final_state(whole), _final_state(killed)
  for x, y in zip(jax.tree.leaves((state_a, rec_a)), jax.tree.leaves((state_b, rec_b))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _run(capsys, *argv):
  code = cli.main([str(a) for a in argv])
  captured = capsys.readouterr()
  return code, captured.out, captured.err


@pytest.mark.parametrize(
  ("overrides", "words"),
  [
    (["run.gradient=5"], ["unknown config key run.gradient", "gradients"]),
    (["cluster.num_workers=eight"], ["cluster.num_workers='eight'", "integer"]),
    (["cluster.slow_fraction=1.5"], ["cluster.slow_fraction=1.5", "[0, 1)"]),
    (["run.checkpoint_every=150"], ["run.checkpoint_every=150", "multiple of run.chunk=100"]),
    (
      ["data.name=cifar10", "data.data_dir=/nonexistent/cifar"],
      ["data:", "/nonexistent/cifar", "cifar.html"],
    ),
    (["strategy.name=warp"], ["strategy.name='warp'", "ormo"]),
    (["strategy.options.learning_rate=-1"], ["strategy 'ormo'", "learning_rate=-1", "expected"]),
    (["strategy.options.lr=0.1"], ["strategy.options.lr", "learning_rate"]),
    (["data.batch_size=1000"], ["data.batch_size", "batch_size=1000", "shard size"]),
    (["cluster.link=5gbps"], ["cluster.link='5gbps'", "10gbps"]),
    (["cluster.link={latency: 1e-4}"], ["cluster.link.bandwidth missing", "latency, bandwidth"]),
    (["cluster.link={latency: -1, bandwidth: 1e8}"], ["cluster.link.latency=-1.0", "seconds >= 0"]),
    (["cluster.link={latency: 0, bandwidth: 1e8, mtu: 9000}"], ["cluster.link.mtu", "latency, bandwidth"]),
    (["cluster.calibration={compute_time: 3}"], ["cluster.calibration.compute_time=3", "a string"]),
  ],
)
def test_config_errors_exit_2_with_one_line_naming_key_and_value(tmp_path, capsys, overrides, words):
  sets = [x for o in overrides for x in ("--set", o)]
  code, out, err = _run(capsys, "train", QUICKSTART, *SHORT, *sets, "--out", tmp_path / "r")
  assert code == 2
  assert err.startswith("jaxsync: error: ") and err.count("\n") == 1 and "Traceback" not in err
  for word in words:
    assert word in err
  assert not (tmp_path / "r").exists()  # rejected before anything was written


def test_missing_config_file_and_bad_command_lines(tmp_path, capsys):
  code, _, err = _run(capsys, "train", tmp_path / "nope.yaml")
  assert code == 2 and "nope.yaml" in err and "does not exist" in err
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["train"])  # argparse: missing CONFIG
  assert exit_info.value.code == 2
  for command in ([], ["train"], ["compare"], ["resume"], ["strategies"]):
    with pytest.raises(SystemExit) as exit_info:
      cli.main([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: jaxsync" in capsys.readouterr().out


@pytest.mark.heavy
def test_a_run_directory_is_never_overwritten_unless_asked(tmp_path, capsys):
  out = tmp_path / "r"
  assert _run(capsys, "train", QUICKSTART, *FAST, "--out", out, "--progress", "quiet")[0] == 0
  first = (out / "summary.json").read_text()
  code, _, err = _run(capsys, "train", QUICKSTART, *FAST, "--out", out, "--progress", "quiet")
  assert code == 2 and "already exists" in err and "--overwrite" in err
  assert (out / "summary.json").read_text() == first
  code, _, _ = _run(capsys, "train", QUICKSTART, *FAST, "--set", "seed=1", "--out", out, "--overwrite")
  assert code == 0 and (out / "summary.json").read_text() != first
  # --overwrite never deletes a folder that is not a run directory.
  other = tmp_path / "photos"
  other.mkdir()
  (other / "cat.jpg").write_bytes(b"x")
  code, _, err = _run(capsys, "train", QUICKSTART, *FAST, "--out", other, "--overwrite")
  assert code == 2 and "does not look like a jaxsync run directory" in err and (other / "cat.jpg").exists()
  # Without --out, names are never reused.
  from jaxsync._src.app import commands

  (tmp_path / "runs" / "q").mkdir(parents=True)
  assert commands.default_out("q", tmp_path / "runs") == tmp_path / "runs" / "q-1"


@pytest.mark.heavy
def test_corrupt_and_incompatible_checkpoints_get_a_clear_error(tmp_path, capsys):
  out = tmp_path / "r"
  assert _run(capsys, "train", QUICKSTART, *FAST, "--out", out, "--progress", "quiet")[0] == 0
  # Another worker count: the checkpoint's state does not fit this config.
  bad = tmp_path / "other"
  shutil.copytree(out, bad)
  raw = yaml.safe_load((bad / "config.yaml").read_text())
  raw["cluster"]["num_workers"] = 4
  (bad / "config.yaml").write_text(yaml.safe_dump(raw))
  code, _, err = _run(capsys, "resume", bad)
  assert code == 2 and "incompatible" in err and "fingerprint" in err
  # Garbage in the array files.
  for path in (out / "checkpoints" / "400" / "state").rglob("*"):
    if path.is_file() and path.stat().st_size > 100 and "d" in path.parent.name:
      path.write_bytes(b"\0" * path.stat().st_size)
  # From a shell: one line and exit 2, nothing after it (no asyncio leftovers of the failed restore).
  proc = _jaxsync("resume", out, check=False)
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.startswith("jaxsync: error: checkpoint") and proc.stderr.count("\n") == 1, proc.stderr
  assert "is corrupt" in proc.stderr and "Traceback" not in proc.stderr
  assert len(proc.stderr) < 600  # the cause in one readable line, not tensorstore's whole spec
  code, _, err = _run(capsys, "resume", tmp_path / "nowhere")
  assert code == 2 and "config.yaml" in err


@pytest.mark.heavy
def test_compare_writes_one_row_per_strategy_and_resumes(tmp_path, capsys):
  out = tmp_path / "cmp"
  code, stdout, err = _run(
    capsys,
    "compare",
    QUICKSTART,
    *FAST,
    "--strategies",
    "asp,bsp",
    "--seeds",
    "2",
    "--out",
    out,
    "--progress",
    "quiet",
  )
  assert code == 0
  table = (out / "results.md").read_text()
  assert table == stdout
  assert f"every run are in {out}" in err  # compare says where it wrote, as train and advise do
  rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
  assert [r.split("|")[1].strip() for r in rows] == ["asp", "bsp"]
  assert all(r.split("|")[2].strip() == "2" and "±" in r.split("|")[3] for r in rows)
  results = json.loads((out / "results.json").read_text())
  accuracies = [s["final_accuracy"] for s in results["asp"]]
  mean, std = (float(x) for x in rows[0].split("|")[3].split("±"))
  assert mean == pytest.approx(np.mean(accuracies), abs=5e-4) and std == pytest.approx(
    np.std(accuracies, ddof=1), abs=5e-4
  )
  assert results["bsp"][0]["updates"] == 400 // 8  # a synchronous round uses all 8 workers' gradients
  assert {p.name for p in (out / "plots").glob("*.png")} >= {"compare_accuracy_vs_time.png"}
  assert sorted(p.name for p in (out / "asp").iterdir()) == ["seed0", "seed1"]
  # A compare directory resumes like a run directory (here: everything is finished already).
  code, again, _ = _run(capsys, "resume", out, "--progress", "quiet")
  assert code == 0 and again == table


def test_a_diverged_run_says_so_in_its_summary_on_stderr_and_in_the_compare_table(tmp_path, capsys):
  """naive ASGDm at lr 50 blows the MLP up (its NaN gradients are rejected, the parameters stay huge and
  the predictions collapse to chance); asp at its own rate trains. Both exit 0: the run did what it was
  asked, and says so."""
  out = tmp_path / "cmp"
  code, stdout, err = _run(
    capsys,
    *("compare", QUICKSTART, *FAST, "--strategies", "asp,naive_asgdm", "--seeds", "1", "--out", out),
    *("--set", "compare.options.naive_asgdm={learning_rate: 50.0}", "--progress", "quiet"),
  )
  assert code == 0
  bad = json.loads((out / "naive_asgdm" / "seed0" / "summary.json").read_text())
  good = json.loads((out / "asp" / "seed0" / "summary.json").read_text())
  assert bad["diverged"] is True and good["diverged"] is False and "diverged_because" not in good
  assert "chance level" in bad["diverged_because"] or "non-finite" in bad["diverged_because"]
  warnings = [line for line in err.splitlines() if line.startswith("jaxsync: warning:")]
  assert warnings == [
    f"jaxsync: warning: {bad['label']} diverged: {bad['diverged_because']} "
    f"(run directory {out / 'naive_asgdm' / 'seed0'})."
  ]
  rows = {r.split("|")[1].strip(): r for r in stdout.splitlines() if r.startswith("| ") and "±" not in r[:3]}
  assert "naive_asgdm (diverged: 1/1)" in rows and "asp" in rows
  assert f"- {bad['label']} diverged: {bad['diverged_because']}." in stdout


def test_compare_rejects_unknown_strategies_before_running(tmp_path, capsys):
  code, _, err = _run(
    capsys, "compare", QUICKSTART, *FAST, "--strategies", "asp,warp", "--out", tmp_path / "c"
  )
  assert code == 2 and "compare.strategies='warp'" in err and not (tmp_path / "c").exists()
  code, _, err = _run(capsys, "compare", QUICKSTART, *FAST, "--seeds", "0", "--out", tmp_path / "c")
  assert code == 2 and "--seeds=0" in err


def test_strategies_lists_every_strategy_with_its_options(capsys):
  import jaxsync

  code, out, _ = _run(capsys, "strategies")
  assert code == 0
  for name in jaxsync.strategies.names():
    assert re.search(
      rf"^{name}( \((a?synchronous); real processes: (parameter server|all-reduce)\)|: another)", out, re.M
    )
  assert "ormo (asynchronous; real processes: parameter server)" in out
  assert "allreduce (synchronous; real processes: all-reduce)" in out
  assert "fastest_k (synchronous; real processes: parameter server)" in out  # a collective cannot drop
  assert "drop_worker: another name for fastest_k." in out
  # Every option with its default and what it means; where the default rates come from.
  assert re.search(r"^    theta=1\.0 +how much gradient noise a release tolerates", out, re.M)
  assert re.search(r"^    staleness_bound=3 +how many clocks the fastest worker may run ahead", out, re.M)
  assert "Default learning rates are the papers' starting points" in out


def test_max_time_stops_the_run_and_a_time_before_the_first_event_is_an_error(tmp_path, capsys):
  out = tmp_path / "t"
  code, _, _ = _run(
    capsys, "train", QUICKSTART, *FAST, "--set", "run.max_time=0.3", "--out", out, "--progress", "quiet"
  )
  assert code == 0
  summary = json.loads((out / "summary.json").read_text())
  assert summary["stopped_by"] == "max_time" and 0.25 < summary["simulated_time"] < 0.3
  assert 0 < summary["events"] < 400
  assert RunCheckpoints(out / "checkpoints").latest_step() == summary["events"]
  # Resuming a finished run changes nothing.
  before = (out / "metrics.jsonl").read_text()
  assert _run(capsys, "resume", out, "--progress", "quiet")[0] == 0
  assert (out / "metrics.jsonl").read_text() == before
  code, _, err = _run(
    capsys, "train", QUICKSTART, *FAST, "--set", "run.max_time=0.001", "--out", tmp_path / "e"
  )
  assert code == 2 and "max_time=0.001" in err and "first event" in err and "Traceback" not in err


def test_a_checkpoint_saved_again_at_the_same_step_replaces_the_first(tmp_path):
  import jax.numpy as jnp

  from jaxsync._src.steps.records import EventRecord

  ckpt = RunCheckpoints(tmp_path / "c")
  state = {"w": jnp.arange(3.0)}
  rec = EventRecord(*([np.zeros(2)] * 10), metrics={"accuracy": np.zeros(2)})
  ckpt.save(2, state, rec, {"finished": False})
  ckpt.save(2, {"w": jnp.ones(3)}, rec, {"finished": True})
  restored, _, progress = ckpt.restore(state)
  assert progress["finished"] is True and np.array_equal(restored["w"], np.ones(3))


def test_a_run_killed_before_its_first_checkpoint_restarts_from_scratch_on_resume(tmp_path, capsys):
  whole, killed = tmp_path / "whole", tmp_path / "killed"
  assert _run(capsys, "train", QUICKSTART, *FAST, "--out", whole, "--progress", "quiet")[0] == 0
  # What a kill before the first checkpoint leaves: the config, some metrics, TensorBoard events.
  killed.mkdir()
  shutil.copy(whole / "config.yaml", killed / "config.yaml")
  (killed / "metrics.jsonl").write_text('{"kind": "eval", "event": 0, "accuracy": 0.1}\n{"kind": "tra')
  (killed / "tensorboard").mkdir()
  (killed / "tensorboard" / "events.out.tfevents.stale").write_bytes(b"stale")
  assert _run(capsys, "resume", killed, "--progress", "quiet")[0] == 0
  assert (killed / "metrics.jsonl").read_text() == (whole / "metrics.jsonl").read_text()
  assert not (killed / "tensorboard" / "events.out.tfevents.stale").exists()


def test_the_final_line_names_the_runs_clock(capsys, tmp_path):
  summary = {
    "label": "bsp K=2 seed=0",
    "final_accuracy": 0.9,
    "updates": 60,
    "clock": "wall",
    "wall_time": 12.5,
  }
  summary.update(target={"metric": "accuracy", "value": 0.8}, time_to_target=7.25)
  line = summary_lib.final_line(summary, tmp_path)
  assert "60 updates, 12.5 wall s (accuracy 0.8 at 7.2 wall s)" in line and "simulated" not in line


def test_traceback_goes_anywhere_on_the_line_and_keeps_the_exit_code(capsys, tmp_path):
  for argv in (
    ["--traceback", "resume", tmp_path / "nowhere"],
    ["resume", tmp_path / "nowhere", "--traceback"],
  ):
    code, _, err = _run(capsys, *argv)
    assert code == 2 and "Traceback (most recent call last)" in err and "config.yaml" in err
  code, _, err = _run(capsys, "resume", tmp_path / "nowhere")
  assert code == 2 and "Traceback" not in err


def test_version(capsys):
  import jaxsync

  with pytest.raises(SystemExit) as exit_:
    cli.main(["--version"])
  assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"jaxsync {jaxsync.__version__}"


def test_an_existing_out_is_refused_before_anything_is_built(capsys, tmp_path, monkeypatch):
  taken = tmp_path / "taken"
  taken.mkdir()
  (taken / "notes.txt").write_text("mine")

  def no_build(config):
    raise AssertionError("the run was built before --out was checked")

  monkeypatch.setattr(experiment, "build", no_build)
  for command in ("train", "compare"):
    code, _, err = _run(capsys, command, QUICKSTART, "--out", taken, "--progress", "quiet")
    assert code == 2 and "already exists" in err
  assert (taken / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
  "when, started_by, presses",
  [
    ("training", "a terminal", 1),
    # A background job of a non-interactive shell (a script's `cmd &`, a CI job, a test harness) starts
    # with SIGINT ignored, which Python keeps ignored unless told otherwise: the run went on for 28
    # minutes. Interrupted while it compiles, before the first chunk: twice, to stop at once.
    ("compiling", "a background job", 2),
  ],
)
def test_ctrl_c_stops_at_the_chunks_end_with_a_checkpoint_or_at_once_when_pressed_twice(
  tmp_path, when, started_by, presses
):
  out = tmp_path / "r"
  command = [sys.executable, "-m", "jaxsync.cli", "train", QUICKSTART, *FAST]
  command += ["--set", "run.gradients=1000000", "--out", out]
  if started_by == "a background job":  # what `cmd &` in a script does: SIGINT ignored, then exec
    command = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *map(str, command)]
  proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
  try:
    deadline = time.monotonic() + 240
    metrics = out / "metrics.jsonl"
    if when == "training":
      ready = lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3
    else:
      ready = lambda: (out / "config.yaml").exists()
    while not ready():
      assert proc.poll() is None and time.monotonic() < deadline
      time.sleep(0.05)
    for press in range(presses):
      time.sleep(0.5 * press)  # the first press is noted before the second comes
      proc.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert time.monotonic() - interrupted < 60  # seconds, not the rest of a million gradients
  finally:
    proc.kill()
    proc.communicate()
  assert proc.returncode == 130
  assert "jaxsync: stopping at the end of this chunk, with a checkpoint (Ctrl-C again to stop now)." in err
  # Python drops an exception raised where it cannot propagate: a second Ctrl-C landing in XLA's
  # garbage-collector callback ("Exception ignored in ... _xla_gc_callback", seen under load) leaves the first
  # press's stop at the chunk's end, with its checkpoint, the graceful outcome.
  dropped = presses == 2 and "Exception ignored in" in err and "raise KeyboardInterrupt" in err
  if presses == 1 or dropped:
    done = int(re.search(r"interrupted \(Ctrl-C\) after (\d+) events", err)[1])
    assert RunCheckpoints(out / "checkpoints").latest_step() == done > 0
    last = f"all of them in the run's last checkpoint; continue the run with `jaxsync resume {out}`."
  else:
    last = f"jaxsync: interrupted; continue the run with `jaxsync resume {out}`."
  # The last line, on a line of its own (the bar's line ended before it).
  assert ("\n" + err).endswith(f"{last}\n") and err.splitlines()[-1].startswith("jaxsync: "), err[-500:]


def test_the_bar_says_it_is_compiling_until_the_first_chunk():
  import io

  from jaxsync._src.train import progress

  bar = progress.BarReporter(io.StringIO())
  bar.phase("quickstart: loading data, building the model and strategy")
  bar.start("ormo K=8", 100, 0)
  assert bar._progress.tasks[0].fields["status"] == "compiling "
  bar.update(
    {"event": 10, "updates": 10, "simulated_time": 1.0, "loss": 0.61, "train_loss": 0.5, "accuracy": 0.75}
  )
  fields = bar._progress.tasks[0].fields
  assert fields["status"] == "" and fields["clock"] == "sim" and fields["time"] == "1.0s"
  bar.close()
  assert bar._progress is None
  shown = bar.console.file.getvalue()  # a stream that is no terminal gets the bar's last line at its end
  # The loss on the bar is the training batches' (summary.json's final_loss is the test set's): labelled so,
  # and it is the summary's final_train_loss of the events so far, not the last chunk's mean (0.61).
  assert "train loss 0.5" in shown and "test acc 0.750" in shown and "0.61" not in shown


def test_advise_ranks_the_candidates_writes_its_report_and_refuses_bad_questions(tmp_path, capsys):
  out = tmp_path / "advice"
  sets = ["--set", "run.gradients=800", "--set", "cluster.slowdown=6"]
  code, stdout, err = _run(
    capsys, "advise", QUICKSTART, *FAST, *sets, "--strategies", "asp,bsp", "--seeds", "2", "--out", out
  )
  assert code == 0, err
  assert "| rank | strategy | simulated s to validation accuracy 0.5 (range) |" in stdout
  assert re.search(r"^Recommended: (asp|bsp)\. ", stdout, re.M)
  assert err.count("jaxsync advise: ") == 4 and "asp seed 1: 200 gradients" in err  # a quarter of 800
  report = json.loads((out / "advice.json").read_text())
  assert report["gradients_per_short_run"] == 200 and report["seeds"] == 2 and report["target"] == 0.5
  assert {e["strategy"] for e in report["ranking"]} == {"asp", "bsp"}
  assert report["recommended"] == report["ranking"][0]["strategy"]
  assert "**Recommended:" in (out / "advice.md").read_text() and (out / "plots").is_dir()
  assert "trained without the last 10% of the training examples" in (out / "advice.md").read_text()
  for argv, words in (
    (["--fraction", "0"], ["--fraction=0.0", "(0, 1]"]),
    (["--target", "1.5"], ["target=1.5", "(0, 1)"]),
    (["--seeds", "0"], ["--seeds=0", "positive"]),
    (["--strategies", "asp,warp"], ["name='warp'", "ormo"]),
  ):
    code, _, err = _run(capsys, "advise", QUICKSTART, *FAST, *argv, "--out", tmp_path / "bad")
    assert code == 2 and err.count("\n") == 1, err
    for word in words:
      assert word in err
    assert not (tmp_path / "bad").exists()


@pytest.mark.heavy
def test_advise_takes_the_low_communication_strategies_and_flags_a_round_too_long_for_its_short_run(
  tmp_path, capsys
):
  out = tmp_path / "advice"
  sets = ["--set", "run.gradients=1600", "--set", "cluster.slowdown=6"]
  names = ["diloco", "streaming_diloco", "async_local_sgd", "dc_asgd"]
  code, stdout, err = _run(
    capsys, "advise", QUICKSTART, *FAST, *sets, "--strategies", ",".join(names), "--seeds", "1", "--out", out
  )
  assert code == 0, err
  report = json.loads((out / "advice.json").read_text())
  ranking = {e["strategy"]: e for e in report["ranking"]}
  assert set(ranking) == set(names) and report["gradients_per_short_run"] == 400
  # 400 gradients of 8 workers: one DiLoCo round of 50 local steps; its time to the target is the
  # round's end (when the model changed), not a point inside it.
  assert ranking["diloco"]["run_updates"] == 1 and ranking["diloco"]["reached"] == 1
  assert "diloco seed 0: 400 gradients, 1 updates" in err
  assert ranking["diloco"]["seconds"] == pytest.approx(
    float(re.search(r"diloco seed 0: .*?, ([\d.]+) simulated s", err)[1]), rel=5e-3
  )
  assert ranking["dc_asgd"]["run_updates"] == 400  # one update per gradient, as ASGD
  assert re.search(r"diloco made fewer than 4 server updates in their short runs", stdout), stdout
  assert "dc_asgd made" not in stdout


@pytest.mark.parametrize(
  ("n", "overrides", "words", "not_words"),
  [
    ("0", [], ["-n/--num-processes=0 is invalid", ">= 1"], []),
    # One process is the server alone: no worker count fits, so none is suggested.
    ("1", ["cluster.num_workers=2"], ["for 1 processes", "launch 3 processes."], ["num_workers=0"]),
    ("3", ["cluster.num_workers=8"], ["launch 9 processes, or set cluster.num_workers=2."], []),
    # A synchronous strategy: one worker per device, and each launched process has this one's devices.
    ("3", ["strategy.name=allreduce", "cluster.num_workers=8"], ["for 3 devices", "num_workers=3."], []),
    ("2", ["cluster.slow_fraction=1.5"], ["cluster.slow_fraction=1.5"], []),
  ],
)
def test_launch_checks_the_config_and_the_process_count_before_any_process_starts(
  tmp_path, capsys, n, overrides, words, not_words
):
  sets = [a for o in overrides for a in ("--set", o)]
  code, out, err = _run(capsys, "launch", "-n", n, QUICKSTART, *FAST, *sets, "--out", tmp_path / "r")
  assert code == 2
  assert len(err.splitlines()) == 1 and err.startswith("jaxsync: error: "), err
  assert all(w in err for w in words) and not any(w in err for w in not_words), err
  assert "processes, coordinator" not in out and not (tmp_path / "r").exists()  # nothing started


def test_config_prints_the_reference_or_a_resolved_config(capsys):
  code, out, _ = _run(capsys, "config")
  assert code == 0 and "run.gradients" in out and "4000" in out and "worker gradients in the whole run" in out
  code, out, _ = _run(capsys, "config", "--markdown")
  assert code == 0 and out.startswith("| key | default | type | meaning |")
  code, out, _ = _run(capsys, "config", QUICKSTART, "--set", "cluster.num_workers=4")
  assert code == 0
  resolved = config_lib.from_dict(yaml.safe_load(out))
  assert (
    resolved == config_lib.load(QUICKSTART, ["cluster.num_workers=4"]) and resolved.cluster.num_workers == 4
  )
  code, _, err = _run(capsys, "config", QUICKSTART, "--set", "cluster.num_workers=0")
  assert (
    code == 2
    and err
    == "jaxsync: error: cluster.num_workers=0 is invalid; expected a positive number (or null where allowed).\n"
  )


def test_train_config_from_python_is_the_train_command(tmp_path, capsys):
  overrides = [o for o in FAST if o != "--set"]
  code, _, err = _run(capsys, "train", QUICKSTART, *FAST, "--out", tmp_path / "cli", "--progress", "quiet")
  assert code == 0, err
  from jaxsync import train_config

  from_path = train_config(QUICKSTART, overrides, out=tmp_path / "py")
  raw = yaml.safe_load(QUICKSTART.read_text())
  from_mapping = train_config(raw, overrides, out=tmp_path / "map")
  cli_summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
  for result in (from_path, from_mapping):
    assert result.summary["final_accuracy"] == cli_summary["final_accuracy"]
    assert result.summary["updates"] == cli_summary["updates"]
  assert from_mapping.run_dir == tmp_path / "map" and (tmp_path / "map" / "config.yaml").is_file()
  with pytest.raises(config_lib.ConfigError, match="run.gradients=0 is invalid"):
    train_config(raw, ["run.gradients=0"], out=tmp_path / "bad")
  assert not (tmp_path / "bad").exists()


def test_output_into_a_closed_pipe_ends_quietly():
  """`jaxsync strategies | head -1`: the reader leaves early; no traceback, no 'Exception ignored'."""
  proc = subprocess.Popen(
    [sys.executable, "-m", "jaxsync.cli", "strategies"],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    cwd=ROOT,
  )
  proc.stdout.close()  # before it writes a line
  err = proc.stderr.read().decode()
  proc.wait(timeout=60)
  assert proc.returncode == 0 and err == "", err


@pytest.mark.parametrize("command", ["launch", "resume"])
def test_a_negative_max_restarts_is_refused_before_anything_is_built(capsys, tmp_path, command):
  target = QUICKSTART if command == "launch" else tmp_path
  argv = [command, *(["-n", "3"] if command == "launch" else []), target, "--max-restarts", "-1"]
  code, _, err = _run(capsys, *argv)
  assert code == 2 and err == "jaxsync: error: --max-restarts=-1 is invalid; expected an integer >= 0.\n"


def test_a_negative_rejoin_delay_is_refused_before_anything_is_built(capsys):
  """churn: a replacement cannot arrive before its failure."""
  code, _, err = _run(capsys, "launch", "-n", "4", QUICKSTART, "--rejoin-delay", "-2")
  assert code == 2 and err == "jaxsync: error: --rejoin-delay=-2.0 is invalid; expected seconds >= 0.\n"


@pytest.mark.parametrize(
  ("argv", "hint"),
  [
    (["trian", "x"], "did you mean 'train'?"),
    (["train", "x", "--progress", "quite"], "did you mean 'quiet'?"),
    (["compare", "x", "--strategys", "asp"], "did you mean '--strategies'?"),
  ],
)
def test_the_parser_suggests_the_closest_command_choice_or_option(argv, hint, capsys):
  with pytest.raises(SystemExit):
    cli._parser().parse_args(argv)
  assert hint in capsys.readouterr().err


def test_a_rejoin_delay_without_restarts_is_refused_before_anything_is_built(capsys):
  """churn: --rejoin-delay delays a restart; without --max-restarts there is none to delay."""
  code, _, err = _run(capsys, "launch", "-n", "4", QUICKSTART, "--rejoin-delay", "5")
  assert code == 2 and "--rejoin-delay=5 is invalid without --max-restarts" in err, err
