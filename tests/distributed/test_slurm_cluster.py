"""A real SLURM cluster on this machine (``scripts/slurm_cluster.sh``): a three-node job, and JAX finding its run.

The script starts munged, slurmctld and three slurmds from Debian's
packages, each slurmd in a network namespace of its own (``node0`` ..
``node2`` at ``10.99.0.1`` .. ``10.99.0.3``), and stops them all at the end,
failed test or not. Needs root, ``ip netns`` and the packages; where they are
missing the test skips, naming the command that installs them.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm_cluster.sh"
INSTALL = "apt-get install -y --no-install-recommends slurm-wlm munge"
NODES = 3

# Job (a): one task per node, each reporting where it runs.
JOB = """#!/bin/bash
srun bash -c 'echo "PROCID=$SLURM_PROCID NODEID=$SLURM_NODEID HOST=$(hostname)\
 ADDR=$(ip -4 -o addr show eth0 | awk "{print \\$4}") STEP_NODELIST=$SLURM_STEP_NODELIST"'
"""

# JAX's own SLURM detection (``jax.distributed.initialize()`` without arguments, through jaxsync's
# ``cluster.initialize``), then a psum of the process indices + 1 across the three processes.
PSUM = """
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxsync._src.distributed import cluster

group = cluster.initialize(log=lambda line: None)
mesh = jax.make_mesh((jax.process_count(),), ("p",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("p")), jnp.array([group.index + 1.0]))
total = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "p"), mesh=mesh, in_specs=P("p"), out_specs=P()))(x)
print(f"PROCESS={group.index} COUNT={group.count} HOW={group.how} COORDINATOR={group.coordinator}"
      f" ADVERTISE={group.advertise} PSUM={float(total.addressable_data(0)[0])}", flush=True)
cluster.coordination_client().wait_at_barrier("test/done", 60_000)
if group.is_primary:
  import time
  time.sleep(1.0)  # the coordinator's host leaves last
else:
  jax.distributed.shutdown()
"""


@pytest.fixture
def slurm():
  """A running three-node cluster: the environment its clients need (``SLURM_CONF``) and its folder."""
  missing = [t for t in ("slurmctld", "slurmd", "munged", "sbatch", "srun") if shutil.which(t) is None]
  if missing:
    pytest.skip(f"SLURM is not installed here ({', '.join(missing)} missing); run: {INSTALL}")
  if os.geteuid() != 0:
    pytest.skip("a SLURM cluster of network namespaces needs root")
  folder = pathlib.Path(tempfile.mkdtemp(prefix="jaxsync-slurm-"))  # short: munge's socket path lives here
  env = dict(os.environ, SLURM_CONF=str(folder / "slurm.conf"), JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
  started = None
  try:
    started = subprocess.run(
      [str(SCRIPT), "start", str(NODES), "--dir", str(folder)], capture_output=True, text=True, timeout=60
    )
    if started.returncode == 3:
      pytest.skip(started.stderr.strip())
    assert started.returncode == 0, f"start failed:\n{started.stdout}\n{started.stderr}"
    if "FALLBACK" in started.stdout:
      pytest.skip(f"network namespaces are unavailable here: {started.stderr.strip()}")
    yield env, folder
  finally:
    if started is not None and started.returncode != 3:
      stopped = subprocess.run(
        [str(SCRIPT), "stop", "--dir", str(folder)], capture_output=True, text=True, timeout=60
      )
      assert stopped.returncode == 0, f"stop failed:\n{stopped.stdout}\n{stopped.stderr}"
      listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
      assert "jaxsync-slurm-" not in listed, f"namespaces left behind:\n{listed}"
    shutil.rmtree(folder, ignore_errors=True)


def _logs(folder: pathlib.Path) -> str:
  return "\n".join(f"--- {f}:\n{f.read_text()[-1500:]}" for f in sorted((folder / "log").glob("*.log")))


def _records(text: str) -> list[dict[str, str]]:
  return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in text.splitlines() if "=" in line]


@pytest.mark.heavy
def test_slurm_cluster_runs_jobs_across_three_nodes(slurm):
  env, folder = slurm
  job = folder / "job.sh"
  job.write_text(JOB)
  out = folder / "job.out"
  # Job (a): sbatch -N 3 --ntasks-per-node=1, its srun step on every node.
  done = subprocess.run(
    ["sbatch", "--wait", "-N", str(NODES), "--ntasks-per-node=1", "-o", str(out), str(job)],
    capture_output=True,
    text=True,
    env=env,
    timeout=60,
  )
  assert done.returncode == 0, f"{done.stdout}{done.stderr}\n{out.read_text() if out.exists() else ''}"
  tasks = _records(out.read_text())
  assert sorted(t["PROCID"] for t in tasks) == ["0", "1", "2"], out.read_text()
  assert sorted(t["NODEID"] for t in tasks) == ["0", "1", "2"], out.read_text()
  assert {t["HOST"]: t["ADDR"] for t in tasks} == {f"node{i}": f"10.99.0.{i + 1}/24" for i in range(NODES)}
  assert {t["STEP_NODELIST"] for t in tasks} == {"node[0-2]"}

  # A step of three processes, one a node, finds its run through JAX's SLURM detection: process
  # 0's node by name (node0, resolved on every node) and the process index from SLURM_PROCID.
  step = subprocess.run(
    ["srun", "-N", str(NODES), "-n", str(NODES), sys.executable, "-c", PSUM],
    capture_output=True,
    text=True,
    env=env,
    timeout=120,
    cwd=folder,
  )
  assert step.returncode == 0, f"{step.stdout}\n{step.stderr[-4000:]}\n{_logs(folder)}"
  processes = [r for r in _records(step.stdout) if "PROCESS" in r]
  assert sorted(p["PROCESS"] for p in processes) == ["0", "1", "2"], step.stdout
  for p in processes:
    assert p["COUNT"] == "3" and p["HOW"] == "SlurmCluster" and p["PSUM"] == "6.0", p
    assert re.fullmatch(r"node0:\d+", p["COORDINATOR"]), p
  assert sorted(p["ADVERTISE"] for p in processes) == [f"10.99.0.{i + 1}" for i in range(NODES)]


EXAMPLES = ROOT / "examples" / "slurm"
# A short MLP run: 1000 rounds of 3 workers, checkpoints only at the chunk a SIGTERM stops.
SHORT = [
  "--set=model.name=mlp",
  "--set=run.eval_every=50",
  "--set=run.target_accuracy=0.9",
  "--set=run.checkpoint_every=null",
  "--set=run.chunk=50",
]


def _job_env(env: dict[str, str]) -> dict[str, str]:
  """The cluster's client environment with this Python's `jaxsync` first on PATH (a job inherits it)."""
  return dict(env, PATH=os.pathsep.join([str(pathlib.Path(sys.executable).parent), env.get("PATH", "")]))


def _submit(env, script: str, run: pathlib.Path, out: pathlib.Path, *sets: str, wait: bool = False) -> str:
  """``sbatch`` of an example from the repository's root (as its usage says); returns the job id."""
  argv = ["sbatch", "--parsable", *(["--wait"] if wait else []), "-o", str(out), str(EXAMPLES / script)]
  done = subprocess.run(
    [*argv, str(run), *sets], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600 if wait else 60
  )
  assert done.returncode == 0, f"{done.stdout}{done.stderr}\n{out.read_text() if out.exists() else ''}"
  return done.stdout.strip().split(";")[0]


def _fingerprints(text: str) -> dict[str, str]:
  return dict(re.findall(r"process (\d): final parameters sha256 (\w+)", text))


def _job(env, job: str) -> dict[str, str]:
  shown = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
  return dict(re.findall(r"(\w+)=(\S*)", shown))


@pytest.mark.heavy
@pytest.mark.parametrize("script", ["asp.sbatch", "diloco.sbatch"])
def test_the_slurm_examples_run_an_asynchronous_and_a_diloco_job_to_the_end(slurm, tmp_path, script):
  env, folder = slurm
  run, out = tmp_path / "run", tmp_path / "job.out"
  _submit(_job_env(env), script, run, out, *SHORT, "--set=run.gradients=300", wait=True)
  text = out.read_text()
  assert "jaxsync on SLURM: job" in text and "3 tasks" in text, text[-3000:]
  summary = json.loads((run / "summary.json").read_text())
  assert summary["gradients"] >= 300, summary


def _faulted_allreduce_job(env, tmp_path, name: str, fault):
  """The all-reduce example run to its end, then again with ``fault(job)`` once 3 rows are logged (no
  periodic checkpoint yet); returns the faulted run's directory, output file, final job state, and the
  uninterrupted job's final parameters' fingerprints."""
  sets = [*SHORT, "--set=run.gradients=3000"]
  _submit(env, "allreduce.sbatch", tmp_path / "whole", tmp_path / "whole.out", *sets, wait=True)
  reference = _fingerprints((tmp_path / "whole.out").read_text())
  assert set(reference) == {"0", "1", "2"} and len(set(reference.values())) == 1, reference
  run, out = tmp_path / name, tmp_path / f"{name}.out"
  job = _submit(env, "allreduce.sbatch", run, out, *sets)
  deadline = time.monotonic() + 240
  while not (run / "metrics.jsonl").exists() or (run / "metrics.jsonl").read_text().count('"train"') < 3:
    assert time.monotonic() < deadline, out.read_text()[-3000:] if out.exists() else "no output"
    time.sleep(0.5)
  fault(job)
  deadline = time.monotonic() + 420
  while (state := _job(env, job)).get("JobState") != "COMPLETED":
    assert state.get("JobState") not in ("FAILED", "CANCELLED", "TIMEOUT"), (state, out.read_text()[-3000:])
    assert time.monotonic() < deadline, (state, out.read_text()[-3000:])
    time.sleep(1.0)
  return run, out, state, reference


@pytest.mark.heavy
def test_a_slurm_job_preempted_by_its_notice_requeues_itself_and_ends_as_an_uninterrupted_one(
  slurm, tmp_path
):
  """The all-reduce example twice: once to the end, once sent SLURM's notice (SIGTERM to the batch shell)
  mid-run. The notice reaches every process, which checkpoint and exit 75; the job requeues itself,
  resumes from its run directory, and ends with the same final parameters, bit for bit."""
  env = _job_env(slurm[0])

  def notice(job):
    subprocess.run(["scancel", "--signal=TERM", "--batch", job], env=env, check=True, timeout=30)

  run, out, state, reference = _faulted_allreduce_job(env, tmp_path, "preempted", notice)
  text = out.read_text()
  assert state["Restarts"] == "1", state
  assert "requeueing job" in text and "preempted (SIGTERM)" in text, text[-3000:]
  assert _fingerprints(text) == reference, text[-3000:]
  assert json.loads((run / "summary.json").read_text())["updates"] == 1000


def test_a_slurm_example_outside_a_slurm_job_stops_at_once_saying_how_to_submit_it(tmp_path):
  """The examples' step without SLURM's environment: one clear line, nothing started, no run directory."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
  run = tmp_path / "run"
  done = subprocess.run(
    ["bash", "-c", f"source {EXAMPLES / 'jaxsync_step.sh'}; run_jaxsync {run} configs/quickstart.yaml"],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=30,
  )  # fmt: skip
  assert done.returncode != 0
  assert "SLURM_JOB_ID: not a SLURM job: submit this script with sbatch" in done.stderr, done.stderr
  assert not run.exists()


def _task(env: dict[str, str], job: str, procid: int, timeout: float = 120):
  """The running `jaxsync` task ``procid`` of ``job`` (the nodes' processes share this machine's PIDs)."""
  import psutil

  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    for p in psutil.process_iter(["cmdline"]):
      try:
        e = p.environ()
      except psutil.Error:
        continue
      command = p.info["cmdline"] or []
      # A step's task runs `jaxsync train` (or resume); the batch shell and the service it runs are not tasks.
      task = any(c.endswith("jaxsync") for c in command[:2]) and ("train" in command or "resume" in command)
      if task and e.get("SLURM_JOB_ID") == job and e.get("SLURM_PROCID") == str(procid):
        return p
    time.sleep(0.2)
  raise TimeoutError(f"no task {procid} of job {job}")


@pytest.mark.heavy
def test_a_slurm_job_whose_process_0_is_killed_requeues_itself_and_loses_no_completed_round(slurm, tmp_path):
  """The all-reduce example, its process 0 SIGKILLed mid-run (no periodic checkpoint yet): the batch shell
  hosts the coordination service, so the others go on to the end of the failed round; process 1 writes the
  checkpoint of every completed round, the job requeues itself and ends with the final parameters of the
  same job uninterrupted, bit for bit."""
  env = _job_env(slurm[0])
  run, out, state, reference = _faulted_allreduce_job(
    env, tmp_path, "killed", lambda job: _task(env, job, 0).kill()
  )
  text = out.read_text()
  assert state["Restarts"] == "1", state
  assert "process 0 is lost: this process writes the run's checkpoint of" in text, text[-3000:]
  assert "a process failed" in text and "requeueing job" in text, text[-3000:]
  # The checkpoint the requeued job resumed from holds the rounds of the 3 rows or more logged before the kill
  # (the first periodic checkpoint would be at round 500, after 10 chunks).
  saved = int(re.search(r"writes the run's checkpoint of (\d+) completed events", text)[1])
  assert 150 <= saved < 1000, text[-3000:]
  rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
  events = [r["event"] for r in rows if r["kind"] == "train"]
  assert events == sorted(set(events)) and events[-1] == 1000, events
  assert _fingerprints(text) == reference, text[-3000:]
