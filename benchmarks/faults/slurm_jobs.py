"""Part 11 of the fault campaign: SLURM jobs preempted the way SLURM does it, requeued, and resumed.

Each run starts a three-node SLURM cluster on this machine (``scripts/slurm_cluster.sh``: munged,
slurmctld and a slurmd in a network namespace per node), submits one of ``examples/slurm``'s batch
scripts (``--requeue``, a short run of the quickstart config), and sends it preemption notices at random
times once it makes progress, alternating the two forms the examples take:

* ``scancel --signal=TERM --batch JOB``: the notice to the batch shell (what ``--signal=B:TERM@60`` sends
  before a time limit), which passes it on to the step's tasks;
* ``scancel --signal=TERM JOB``: the notice to the tasks themselves.

Every process then stops at its next chunk with a checkpoint and exits 75, and the batch script requeues
the job, whose next start resumes from the run directory. Checked per run: the job ends COMPLETED within
its timeout (else a hang), with the run's full count of events; SLURM's restart count equals the notices
(each requeued the job once, none was lost, nothing else requeued it); no event done before a notice was
done again (the checkpoint it resumed from is at or past the last event logged before it); no Python
traceback in the job's output; and the synchronous jobs' (all-reduce, DiLoCo) final parameters equal the
same job's uninterrupted, bit for bit.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.common import harness
from benchmarks.faults import processes
from benchmarks.faults.report_parts import against_uninterrupted
from benchmarks.faults.settings import HEARTBEAT_TIMEOUT
from benchmarks.faults.supervised import Injected, SupervisedRun

SCRIPT = harness.REPO / "scripts" / "slurm_cluster.sh"
EXAMPLES = harness.REPO / "examples" / "slurm"
NODES = 3
# strategy: (batch script, its processes, events of the run per gradient: a round of 3, or one arrival)
JOBS = {
  "allreduce": ("allreduce.sbatch", 3, 3),
  "asp": ("asp.sbatch", 3, 1),
  "diloco": ("diloco.sbatch", 3, 12),  # H = 4 local steps of 3 workers per round
}
NOTICES = ("batch shell", "tasks")  # who gets SIGTERM: scancel --batch, or the step's tasks
JOB_TIMEOUT = 900.0  # seconds a job may take, every requeue included, before it counts as a hang
SETS = ["model.name=mlp", "run.eval_every=100", "run.target_accuracy=0.9", "run.chunk=50"]


@contextlib.contextmanager
def cluster():
  """A running three-node cluster; yields the environment a job is submitted with (or an error line)."""
  missing = [t for t in ("slurmctld", "slurmd", "munged", "sbatch", "scancel") if shutil.which(t) is None]
  if missing or os.geteuid() != 0:
    yield None, f"SLURM unavailable here ({', '.join(missing) or 'not root'})"
    return
  folder = pathlib.Path(tempfile.mkdtemp(prefix="jaxsync-slurm-"))  # short: munge's socket lives here
  started = subprocess.run(
    [str(SCRIPT), "start", str(NODES), "--dir", str(folder)], capture_output=True, text=True, timeout=120
  )
  try:
    if started.returncode != 0 or "FALLBACK" in started.stdout:
      yield None, f"the SLURM cluster did not start: {(started.stderr or started.stdout).strip()[-500:]}"
      return
    env = dict(
      os.environ,
      SLURM_CONF=str(folder / "slurm.conf"),
      JAX_PLATFORMS="cpu",
      PYTHONUNBUFFERED="1",
      JAXSYNC_HEARTBEAT_TIMEOUT=str(HEARTBEAT_TIMEOUT),
      PYTHONPATH=os.pathsep.join(filter(None, [str(harness.REPO), os.environ.get("PYTHONPATH")])),
      PATH=os.pathsep.join([str(pathlib.Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )
    yield env, None
  finally:
    subprocess.run([str(SCRIPT), "stop", "--dir", str(folder)], capture_output=True, text=True, timeout=120)
    shutil.rmtree(folder, ignore_errors=True)


def job_state(env: dict[str, str], job: str) -> dict[str, str]:
  shown = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
  return dict(re.findall(r"(\w+)=(\S*)", shown))


def slurm_run(
  out: pathlib.Path, strategy: str, gradients: int, notices: int, rng: np.random.Generator, delay=(2.0, 5.0)
) -> SupervisedRun:
  """One job of ``strategy``'s example, sent ``notices`` preemption notices; what came of each."""
  script, n, per_event = JOBS[strategy]
  events = gradients // per_event
  if out.exists():
    shutil.rmtree(out)
  out.mkdir(parents=True)
  run_dir, log = out / "run", out / "job.out"
  faults: list[Injected] = []
  problems: list[str] = []
  started = time.monotonic()
  code, state = None, {}
  with cluster() as (env, unavailable):
    if unavailable:
      return _result(strategy, n, gradients, events, [], notices, None, [unavailable], started, run_dir, log)
    sets = [f"--set={s}" for s in [*SETS, f"run.gradients={gradients}"]]
    submitted = subprocess.run(
      ["sbatch", "--parsable", "-o", str(log), str(EXAMPLES / script), str(run_dir), *sets],
      cwd=harness.REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if submitted.returncode != 0:
      problems.append(f"sbatch failed: {(submitted.stderr or submitted.stdout).strip()[-300:]}")
      return _result(strategy, n, gradients, events, [], notices, None, problems, started, run_dir, log)
    job = submitted.stdout.strip().split(";")[0]
    restarts, rows_at_start, next_at = 0, 0, None
    deadline = started + JOB_TIMEOUT
    while time.monotonic() < deadline:
      state = job_state(env, job)
      if state.get("JobState") in (
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
      ):
        break
      rows = processes.metrics_rows(run_dir)
      now = time.monotonic()
      seen = int(state.get("Restarts", "0") or 0)
      if seen > restarts:  # the job requeued itself: the last notice's outcome
        restarts, rows_at_start = seen, len(rows)
        if faults and faults[-1].scope is None:
          f = faults[-1]
          f.scope, f.restart = "requeue", seen
          f.checkpoint = processes.latest_checkpoint(run_dir)
          f.down_seconds = round(now - started - f.since_start, 3)
          f.lost = None if f.checkpoint is None or f.event is None else max(0, f.event - f.checkpoint)
      if faults and faults[-1].scope == "requeue" and faults[-1].recovered_seconds is None:
        if len(rows) > rows_at_start:  # the requeued job's first progress row
          faults[-1].recovered_seconds = round(now - started - faults[-1].since_start, 3)
      # A notice once the job makes progress (and it is not in its last chunks, which it would finish).
      waiting = faults and faults[-1].scope is None
      progressing = len(rows) > rows_at_start and rows[-1]["event"] + 200 < events
      if len(faults) < notices and not waiting and progressing:
        if next_at is None:
          next_at = now + float(rng.uniform(*delay))
        elif now >= next_at:
          role = NOTICES[len(faults) % len(NOTICES)]
          command = ["scancel", "--signal=TERM", *(["--batch"] if role == "batch shell" else []), job]
          subprocess.run(command, env=env, capture_output=True, timeout=30)
          faults.append(
            Injected(
              kind="term", role=role, process=None, at=time.time(), since_start=round(now - started, 3),
              event=rows[-1]["event"], updates=rows[-1].get("updates"),
            )
          )  # fmt: skip
          next_at = None
      time.sleep(0.2)
    else:
      subprocess.run(["scancel", job], env=env, capture_output=True, timeout=30)
      problems.append(f"job {job} did not end within {JOB_TIMEOUT:.0f} s (a hang)")
    if state.get("JobState") == "COMPLETED":
      code = 0
    elif state:
      code = 1 if time.monotonic() < deadline else None
    restarts = int(state.get("Restarts", "0") or 0)
  if code == 1:
    problems.append(f"job ended {state.get('JobState')} (exit {state.get('ExitCode')})")
  if restarts != len(faults):
    problems.append(f"SLURM requeued the job {restarts} times for {len(faults)} preemption notices")
  for f in faults:
    if f.scope is None:
      problems.append(f"the notice at event {f.event} was not followed by a requeue")
    if f.lost:
      problems.append(f"{f.lost} events done before the notice at event {f.event} were done again")
  return _result(strategy, n, gradients, events, faults, notices, code, problems, started, run_dir, log)


def _result(strategy, n, gradients, events, faults, planned, code, problems, started, run_dir, log):
  summary = processes._summary(run_dir)
  text = log.read_text(errors="replace") if log.exists() else ""
  tracebacks = text.count("Traceback (most recent call last)")
  if tracebacks:
    problems.append(f"{tracebacks} Python tracebacks in the job's output")
  if code == 0 and (summary or {}).get("events") != events:
    problems.append(f"the run ended with {(summary or {}).get('events')} events, expected {events}")
  restarts = [
    {"restart": f.restart, "scope": "requeue", "checkpoint": f.checkpoint} for f in faults if f.restart
  ]
  return SupervisedRun(
    part="slurm", runtime="slurm", strategy=strategy, processes=n, gradients=gradients, events=events,
    faults=faults, planned=planned, restarts=restarts, resumes=[], code=code, summary=summary,
    consistent=None, unexplained=[], after_end=[], tracebacks=tracebacks,
    params=processes.params_digest(run_dir), seconds=round(time.monotonic() - started, 1), problems=problems,
  )  # fmt: skip


def compared_with_uninterrupted(runs: list[SupervisedRun]) -> tuple[list[list[str]], list[str]]:
  """The preempted jobs against their uninterrupted twins (label ``X (uninterrupted)``); rows, problems."""
  rows, problems = [], []
  for r, same in against_uninterrupted(runs, "slurm", problems):
    s: dict[str, Any] = r.summary or {}
    rows.append([
      r.label, str(len(r.faults)), str(len(r.restarts)), "hang" if r.hung else str(r.code),
      f"{s.get('events', '-')} / {r.events}", same or "not deterministic: totals checked instead", f"{r.seconds:.0f}",
    ])  # fmt: skip
  return rows, problems
