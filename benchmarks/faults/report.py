"""The campaign's results file: its summary, the per-runtime table, and each part's section."""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np

from benchmarks.common import harness
from benchmarks.faults.report_parts import (
  _PART_INTRO,
  SIGNALS,
  _fuzz_text,
  _kills_text,
  _preempt_text,
  _rejoin_text,
  _supervised_text,
  _worker_runs_summary,
  _workers_text,
)
from benchmarks.faults.settings import HEARTBEAT_TIMEOUT, NAME, PARTS, RUN_TIMEOUT, TITLE
from benchmarks.faults.slurm_jobs import JOB_TIMEOUT, compared_with_uninterrupted
from benchmarks.faults.supervised import MAX_RESTARTS, Layout, SupervisedRun, _may_lose
from benchmarks.faults.unsupervised import RejoinRun, ServerKill, WorkerRun

RUNTIMES = {
  "single": "single parameter server",
  "sharded": "sharded parameter server (2 shards)",
  "inhad": "InHAD (2 nodes of 2 workers)",
  "sync": "synchronous loop (allreduce, bsp)",
  "elastic": "elastic DiLoCo and asynchronous local SGD (single server)",
  "slurm": "SLURM jobs (examples/slurm on 3 nodes, --requeue)",
}


_SLURM_INTRO = (
  "A three-node SLURM cluster on this machine (`scripts/slurm_cluster.sh`: munged, slurmctld, one slurmd per"
  " network namespace), started for each job; `examples/slurm`'s batch scripts (`--requeue`) submitted with"
  " `sbatch`, the quickstart MLP on digits. Once a job makes progress it is sent preemption notices a few"
  " seconds apart, in turn to the batch shell (`scancel --signal=TERM --batch`, what `--signal=B:TERM@60`"
  " sends before a time limit) and to the tasks (`scancel --signal=TERM`). Every process stops at its next"
  " chunk with a checkpoint and exits 75; the batch script requeues the job, whose next start resumes from"
  " the run directory. Checked: the job ends COMPLETED with its full count of events (a hang: not within"
  f" {JOB_TIMEOUT:.0f} s), SLURM's restart count equals the notices, no event done before a notice is done"
  " again ('lost past the checkpoint'), no Python traceback, and the synchronous jobs (all-reduce, DiLoCo)"
  " end with the final parameters of the same job uninterrupted."
)


def _fault_label(kind: str, role: str) -> str:
  if role in ("batch shell", "tasks"):  # a SLURM job's notice
    return f"{SIGNALS[kind]} to a job's {role}"
  return f"{SIGNALS[kind]} of the launcher" if kind == "launcher_term" else f"{SIGNALS[kind]} of a {role}"


def _runtime_of(part: str, result) -> str:
  if part == "churn":  # workers that leave and come back, on the server's elastic rounds or pushes
    return "elastic"
  return result.runtime if isinstance(result, SupervisedRun) else "single"


def _median_max(values: list[float]) -> str:
  values = [v for v in values if v is not None]
  if not values:
    return "-"
  return f"{float(np.median(values)):.1f} / {max(values):.1f}"


def _runtime_rows(results: dict[str, list]) -> list[list[str]]:
  """The per-runtime summary: faults by kind, runs, restarts, hangs, crashes, work lost, time to recover."""
  rows = []
  for runtime, title in RUNTIMES.items():
    faults: collections.Counter[str] = collections.Counter()
    runs = finished = hangs = crashes = 0
    restarts: collections.Counter[str] = collections.Counter()
    zero_lost: list[int] = []  # worker faults and preemptions: must be 0
    server_lost: list[str] = []  # the checkpoint writer's death: back to the last periodic checkpoint
    down, recovered, rejoined = [], [], []
    for part, items in results.items():
      for r in items:
        if part == "fuzz" or _runtime_of(part, r) != runtime:
          continue
        runs += 1
        if isinstance(r, WorkerRun):
          for f in r.faults:
            faults[_fault_label(f.kind, "worker")] += 1
          finished += r.finished
          hangs += r.hung
          crashes += r.crashed
          if r.lost_updates is not None:
            zero_lost.append(r.lost_updates)
        elif isinstance(r, RejoinRun):
          faults[_fault_label("kill", "worker")] += 2
          finished += r.code == 0
          hangs += r.code is None
          crashes += r.crashed
          restarts["by hand (alone)"] += 2
        elif isinstance(r, ServerKill):
          faults[_fault_label("kill", "server")] += 1
          finished += r.finished
          hangs += r.resume_code is None
          crashes += r.crashed
          restarts["by hand (`jaxsync resume`)"] += 1
          if r.lost_updates is not None:
            server_lost.append(f"{r.lost_updates} updates")
        else:
          for f in r.faults:
            faults[_fault_label(f.kind, f.role)] += 1
            if f.scope is not None:
              restarts[
                {
                  "process": "alone",
                  "run": "all processes",
                  "resume": "`jaxsync resume` after exit 75",
                  "requeue": "requeued by SLURM after exit 75",
                }[f.scope]
              ] += 1
            down.append(f.down_seconds)
            recovered.append(f.recovered_seconds)
            rejoined.append(f.rejoined_seconds)
            unit = "rounds" if runtime == "sync" else "updates"
            if f.lost is not None:
              if _may_lose(f, Layout(r.runtime, r.processes, servers=2 if runtime == "sharded" else 1)):
                server_lost.append(f"{f.lost} {unit}")
              else:
                zero_lost.append(f.lost)
          restarts["unexplained"] += len(r.unexplained)
          finished += r.finished
          hangs += r.hung
          crashes += r.crashed
          if runtime != "sync" and r.consistent is False:
            zero_lost.append(-1)
    total = sum(faults.values())
    rows.append(
      [
        title,
        f"{total}: " + ", ".join(f"{n} {k}" for k, n in sorted(faults.items())) if total else "0",
        str(runs),
        str(finished),
        ", ".join(f"{n} {k}" for k, n in restarts.items() if n) or "0",
        str(hangs),
        str(crashes),
        (str(sum(x for x in zero_lost if x > 0)) if -1 not in zero_lost else "totals disagree")
        if zero_lost
        else "-",
        ", ".join(server_lost) or "-",
        _median_max(down),
        _median_max(recovered),
        _median_max(rejoined),
      ]
    )
  return rows


RUNTIME_HEADER = [
  "runtime",
  "process faults injected",
  "runs",
  "runs finished",
  "restarts",
  "hangs",
  "crashes",
  "updates / rounds lost past the last checkpoint: worker faults, preemptions",
  "lost past the last periodic checkpoint: the checkpoint writer killed",
  "down s (restart), median / max",
  "fault to next progress row s, median / max",
  "fault to restarted worker rejoined s, median / max",
]


def write_results(
  args, argv, seed: int, results: dict[str, list], wall: float, *, missing: list[str] = (), reused: int = 0
) -> tuple[str, int]:
  """Writes the results file; returns its text and the number of checks that failed."""
  namespace = argparse.Namespace(
    size=args.size, seeds=None, runs_dir=args.runs_dir, results_dir=args.results_dir
  )
  bench = harness.Benchmark(NAME, TITLE, namespace, argv, seeds=0)
  bench.started = time.perf_counter() - wall
  fuzz_result = (results.get("fuzz") or [None])[0]
  worker_runs = results.get("workers", [])
  rejoin = (results.get("rejoin") or [None])[0]
  kills = results.get("server", [])
  supervised = {p: results.get(p, []) for p in ("supervised", "sharded", "inhad", "sync", "churn")}
  preempt = results.get("preempt", [])
  slurm = results.get("slurm", [])
  real = sum(len(v) for k, v in results.items() if k != "fuzz")
  bench.run_count = real + len(kills)  # a server kill is a run and its resume
  bench.keeps_run_dirs = False
  problems = list(fuzz_result.problems if fuzz_result else []) + [p for r in worker_runs for p in r.problems]
  problems += (rejoin.problems if rejoin else []) + [p for k in kills for p in k.problems]
  for part, runs in [*supervised.items(), ("preempt", preempt)]:
    problems += [f"{part} {r.label or i}: {p}" for i, r in enumerate(runs) for p in r.problems]
  preempt_text, preempt_problems = _preempt_text(preempt) if preempt else ("", [])
  problems += preempt_problems
  problems += [f"slurm {r.label}: {p}" for r in slurm for p in r.problems]
  slurm_rows, slurm_problems = compared_with_uninterrupted(slurm)
  problems += slurm_problems
  process_faults = (
    sum(len(r.faults) for r in worker_runs)
    + (2 if rejoin else 0)
    + len(kills)
    + sum(len(r.faults) for runs in [*supervised.values(), preempt, slurm] for r in runs)
  )
  complete = not missing
  if args.size != "tiny" and complete and set(results) >= set(PARTS) and process_faults < 100:
    problems.append(f"{process_faults} process faults injected; the campaign's size asks for at least 100")
  if missing:
    problems.append(f"the campaign is not complete: {len(missing)} planned runs are not in the store")
  rows = [
    ["RNG seed", str(seed)],
    ["process faults injected (SIGKILL, SIGSTOP/SIGCONT, SIGTERM)", str(process_faults)],
    ["fuzzed messages", str(fuzz_result.messages if fuzz_result else 0)],
    ["runs (real, through `jaxsync launch`)", str(real)],
    [
      "runs read back from the store (`fault_campaign_runs.jsonl`)",
      f"{reused} of {real + bool(fuzz_result)}",
    ],
    ["checks failed", str(len(problems))],
  ]
  bench.section("Summary", harness.table(["", "count"], rows))
  bench.section(
    "Per runtime",
    harness.table(RUNTIME_HEADER, _runtime_rows(results))
    + "\n\n'restarts': by `jaxsync launch --max-restarts` (its `restarts.jsonl`; a worker alone, or every "
    "process from the last checkpoint), by the campaign (`jaxsync resume` after an exit 75), or by hand "
    "(parts 3 and 4). 'down s': from the launcher noticing the death to the restart (for a restart of every "
    "process it includes process 0 saving its checkpoint and the others being stopped). A hang is a run "
    f"that did not end within {RUN_TIMEOUT:.0f} s; a crash, a run that did not end with exit 0, a process "
    "death no injected fault explains, or a Python traceback.",
  )
  if fuzz_result:
    bench.section("1. Fuzzed frames against an in-process server", _fuzz_text(fuzz_result))
  if worker_runs:
    bench.section(
      "2. Worker faults on real runs, no restarts",
      _worker_runs_summary(worker_runs) + "\n\n" + _workers_text(worker_runs),
    )
  if rejoin:
    bench.section("3. A killed worker started again", _rejoin_text(rejoin))
  if kills:
    bench.section("4. The server killed and resumed by hand", _kills_text(kills))
  titles = {
    "supervised": "5. Supervised runs, single server: worker and server faults, restarts",
    "sharded": "6. Sharded server: worker faults, a shard killed",
    "inhad": "7. InHAD: worker, aggregator and server faults",
    "sync": "8. The synchronous loop: peer, process 0, stop, SIGTERM, launcher SIGTERM",
    "churn": "10. Churn: workers of elastic DiLoCo and asynchronous local SGD killed, stopped, preempted",
  }
  for part, runs in supervised.items():
    if runs and part != "churn":
      intro = _PART_INTRO[part].format(restarts=MAX_RESTARTS, hb=HEARTBEAT_TIMEOUT)
      bench.section(titles[part], intro + "\n\n" + _supervised_text(part, runs))
  if preempt:
    bench.section("9. Preemption: SIGTERM to the launcher, then `jaxsync resume`", preempt_text)
  if supervised["churn"]:
    intro = _PART_INTRO["churn"].format(restarts=MAX_RESTARTS, hb=HEARTBEAT_TIMEOUT)
    bench.section(titles["churn"], intro + "\n\n" + _supervised_text("churn", supervised["churn"]))
  if slurm:
    table = harness.table(
      ["job", "notices", "requeues", "exit", "events / planned", "final parameters as uninterrupted", "s"],
      slurm_rows,
    )
    bench.section(
      "11. SLURM: jobs preempted (`scancel --signal=TERM`) and requeued",
      _SLURM_INTRO + "\n\n" + table + "\n\n" + _supervised_text("slurm", slurm),
    )
  if missing:
    bench.section("Runs not in the store yet", "\n".join(f"- {m}" for m in missing))
  if problems:
    bench.section("Checks that failed", "\n".join(f"- {p}" for p in problems))
  path = bench.write()
  return path.read_text(), len(problems)
