"""Churn: training that goes on while workers leave and join, against restarting from checkpoints.

Three methods, each on ``jaxsync launch`` (three workers, and a parameter
server where the run has one; 127.0.0.1), the quickstart MLP on digits:

* **DiLoCo** (H = 10 inner AdamW steps, outer Nesterov),
* **asynchronous local SGD** (H = 10, Delayed Nesterov on the server), and
* **all-reduce** (synchronous momentum SGD, one gradient per worker a round),

each run with the memberships it has, with and without churn, on the same
budget of outer steps (rounds for DiLoCo and all-reduce, applied
pseudo-gradients for asynchronous local SGD):

* **elastic**: every ``period`` seconds a worker process is SIGKILLed (the
  processes but process 0, in turn) and its replacement starts ``rejoin`` seconds later
  (``--max-restarts``, ``--rejoin-delay``). DiLoCo runs with
  ``membership: elastic`` (a round averages the pseudo-gradients of the
  workers it has; the replacement joins at a round); asynchronous local SGD
  runs as it is (its server applies each push as it comes);
* **fixed**: the same kills, but the run has a fixed membership: at each kill
  the whole job stops (DiLoCo's all-reduce run saves its completed rounds and
  exits when it loses a peer; the asynchronous run is stopped with SIGTERM,
  which checkpoints), waits for the replacement (``rejoin`` seconds after the
  kill), and resumes from its checkpoint with ``jaxsync resume``;
* **shrink** (DiLoCo's and all-reduce's synchronous runs): the same kills under
  ``jaxsync launch --min-workers 2``: at each kill the two survivors go on at
  once as a run of two workers from the checkpoint of every completed round
  (each with a batch of 48, so a round averages as many examples as before:
  ``cluster.shrink_keeps: global_batch``), and the run grows back to three
  when the replacement arrives (it stops at a chunk's end and restarts);
* each **without churn**: its applied worker steps per second are the capacity
  the run with churn is measured against (asynchronous local SGD's two are
  one run).

Measured per run: the wall seconds from the launch to the run's end (every
start-up and restart included), the worker steps the model received, the
**goodput** (those steps per wall second over the run's without churn: the share of the
cluster's steady capacity that reached the model; a shrunk run's steps are
counted in the config's batches of 32, so that 2 workers' batches of 48 count as
3 of 32), the mean number of members of a round (DiLoCo's, and a shrinking
run's from ``membership.jsonl``), the pseudo-gradients dropped, the final accuracy, and the
kills, losses and restarts. One machine and its loopback: the launcher, which
restarts a failed worker, starts local processes (the network-namespace hosts
of the other benchmarks have no supervisor that could restart one there).

Sizes: tiny (a kill every 8 s, 3 s to the replacement, about 5 minutes),
default (a kill every 60 s, 20 s to the replacement, 30,000 DiLoCo rounds and
110,000 asynchronous pushes, about 50 minutes). Each finished run is a line of ``benchmarks/results/churn_runs.jsonl``;
a rerun skips the runs the store has (``--fresh`` reruns them).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import pathlib
import re
import shutil
import signal
import sys
import time
from typing import Any

from benchmarks.common import harness
from benchmarks.faults import processes
from benchmarks.faults.settings import HEARTBEAT_TIMEOUT

NAME = "churn"
# method: (strategy, its options (None: the quickstart's), local steps per push or round)
METHODS = {
  "diloco": ("diloco", "{period: 10}", 10),
  "async_local_sgd": ("async_local_sgd", "{period: 10}", 10),
  "allreduce": ("allreduce", None, 1),
}
# (membership, churn) per method: the elastic run, the fixed-membership run that restarts from checkpoints,
# the synchronous run that shrinks to its survivors, and each without churn (the capacity its goodput is
# measured against; asynchronous local SGD's two are one run, and a shrinking run's is the fixed one's).
CASES = {
  "diloco": (
    ("elastic", "none"),
    ("elastic", "kills"),
    ("fixed", "none"),
    ("fixed", "kills"),
    ("shrink", "kills"),
  ),
  "async_local_sgd": (("elastic", "none"), ("elastic", "kills"), ("fixed", "none"), ("fixed", "kills")),
  "allreduce": (("fixed", "none"), ("fixed", "kills"), ("shrink", "kills")),
}
WORKERS = 3
SIZES = {
  # outer steps per method (DiLoCo's and all-reduce's rounds, asynchronous local SGD's pushes: about 4
  # minutes each at the default size without churn), seconds between kills, seconds to the replacement,
  # checkpoint every (events)
  "tiny": dict(
    steps={"diloco": 1500, "async_local_sgd": 4000, "allreduce": 3000},
    period=8.0,
    rejoin=3.0,
    checkpoint_every=200,
  ),
  "default": dict(
    steps={"diloco": 30000, "async_local_sgd": 110000, "allreduce": 24000},
    period=60.0,
    rejoin=20.0,
    checkpoint_every=1000,
  ),
  "full": dict(
    steps={"diloco": 60000, "async_local_sgd": 220000, "allreduce": 48000},
    period=60.0,
    rejoin=20.0,
    checkpoint_every=1000,
  ),
}


def _same_run(method: str, membership: str) -> str:
  """The membership whose runs this one's are without churn: asynchronous local SGD is one run either way,
  and a shrinking run without churn is the fixed one."""
  if method == "async_local_sgd":
    return "elastic"
  return "fixed" if membership == "shrink" else membership


def _processes(method: str, membership: str) -> int:
  """A server and the workers, or (an all-reduce run: DiLoCo's fixed or shrinking one) the workers alone."""
  return WORKERS if method == "allreduce" or (method == "diloco" and membership != "elastic") else WORKERS + 1


def _overrides(method: str, membership: str, size: dict[str, Any]) -> list[str]:
  strategy, options, local_steps = METHODS[method]
  if method == "diloco" and membership == "elastic":
    options = options[:-1] + ", membership: elastic}"
  # A round is every worker's H steps (DiLoCo; all-reduce's H is 1); an asynchronous push is one worker's H.
  per_step = local_steps * (1 if method == "async_local_sgd" else WORKERS)
  sets = {
    "model.name": "mlp",
    "strategy.name": strategy,
    **({} if options is None else {"strategy.options": options}),
    "cluster.num_workers": WORKERS,
    "run.gradients": size["steps"][method] * per_step,
    "run.chunk": 100,
    "run.eval_every": 500,
    "run.target_accuracy": 0.95,
    "run.checkpoint_every": size["checkpoint_every"],
  }
  return [f"--set={k}={v}" for k, v in sets.items()]


def _run(
  method: str, membership: str, churn: str, size: dict[str, Any], run_dir: pathlib.Path
) -> dict[str, Any]:
  """One run, its churn injected; what it measured (a row of the store)."""
  overrides = _overrides(method, membership, size)
  supervised = membership in ("elastic", "shrink") and churn == "kills"  # the launcher restarts the workers
  extra = ["--max-restarts", "100", "--rejoin-delay", f"{size['rejoin']:g}"] if supervised else []
  extra += ["--min-workers", str(WORKERS - 1)] if membership == "shrink" else []
  n = _processes(method, membership)
  if run_dir.exists():
    shutil.rmtree(run_dir)
  started = time.monotonic()
  run = processes.Launched.jaxsync(
    "launch", "-n", str(n), "configs/quickstart.yaml", *overrides, *extra, "--out", str(run_dir)
  )
  # Process 0 (the server, or all-reduce's checkpointing process) is not killed: its loss is another fault.
  kills, resumes, victims, rows_before = [], 0, list(range(1, n)), 0
  timeout = started + 60 * 60
  while time.monotonic() < timeout:
    if run.process.poll() is not None:
      if churn == "kills" and not (run_dir / "summary.json").exists():
        # Stopped at a kill: the replacement arrives `rejoin` s after it, then the job resumes.
        time.sleep(max(0.0, kills[-1]["at"] + size["rejoin"] - (time.monotonic() - started)))
        rows_before = len(processes.metrics_rows(run_dir))
        run = processes.Launched.jaxsync("resume", str(run_dir))
        resumes += 1
        continue
      break
    rows = processes.metrics_rows(run_dir)
    now = time.monotonic() - started
    since = kills[-1]["at"] if kills else (now if not rows else None)
    # Only a run that makes progress is killed (not one still starting or resuming), and not in its last
    # chunk: a synchronous run's processes wait for each other at its end (up to 10 minutes for a dead one).
    progressing = len(rows) > rows_before and rows[-1]["event"] + 100 < size["steps"][method]
    if churn == "kills" and progressing and (since is None or now - since >= size["period"]):
      if not kills and since is None:
        kills.append({"at": now, "process": None})  # the clock of the schedule starts at the first progress
        continue
      victim = victims[len([k for k in kills if k["process"]]) % len(victims)]
      pid = run.processes().get(victim)
      if pid is not None:
        pid.send_signal(signal.SIGKILL)
        kills.append({"at": now, "process": victim, "event": rows[-1]["event"]})
        # A run that restarts at a kill (fixed, shrink) is killed again only once it has progressed since:
        # a kill during its start-up would test the start-up, not the churn.
        rows_before = len(rows) if membership != "elastic" else rows_before
        if membership == "fixed" and method == "async_local_sgd":
          run.process.send_signal(signal.SIGTERM)  # the whole job stops, with a checkpoint
    time.sleep(0.05)
  else:
    run.kill_tree()
    raise RuntimeError(f"{method} {membership} {churn}: no end within an hour; log:\n{run.log[-3000:]}")
  wall = time.monotonic() - started
  summary = json.loads((run_dir / "summary.json").read_text())
  local_steps = METHODS[method][2]
  members = None
  if method == "diloco" and membership == "elastic":  # the worker steps a round averaged, over H
    members = (summary["gradients"] - 10 * summary.get("dropped_gradients", 0)) / (10 * summary["events"])
  elif method != "async_local_sgd":  # the workers of each stretch of rounds (membership.jsonl)
    members = _members_per_round(run_dir, summary["events"])
  return {
    "method": method,
    "membership": membership,
    "churn": churn,
    "wall_seconds": round(wall, 2),
    "events": summary["events"],
    # Applied: a pseudo-gradient dropped for coming late stood for H worker steps the model never got.
    "worker_steps": summary["gradients"] - local_steps * summary.get("dropped_gradients", 0),
    "final_accuracy": summary["final_accuracy"],
    "dropped": summary.get("dropped_gradients", 0),
    "lost_workers": len(summary.get("lost_workers", [])),
    "kills": len([k for k in kills if k["process"]]),
    "resumes": resumes,
    # A shrinking run's grows (its replacements joining) are lines of restarts.jsonl, not restarts.
    "restarts": len([r for r in processes.read_restarts(run_dir) if r["scope"] != "grow"]),
    "members_per_round": None if members is None else round(members, 3),
    "code": harness.code_version(),
  }


def _members_per_round(run_dir: pathlib.Path, rounds: int) -> float:
  """The mean workers of a synchronous run's rounds, from the sizes ``membership.jsonl`` records."""
  from jaxsync._src.distributed import membership

  segments = membership.read(run_dir, WORKERS)
  ends = [s.from_event for s in segments[1:]] + [rounds]
  return sum(s.workers * (end - s.from_event) for s, end in zip(segments, ends)) / rounds


def _store_rows(path: pathlib.Path) -> list[dict[str, Any]]:
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _report(rows: list[dict[str, Any]], size: str, args_text: str, elapsed: float) -> str:
  by = {(r["method"], r["membership"], r["churn"]): r for r in rows}
  table_rows = []
  for method in METHODS:
    for membership, churn in CASES[method]:
      r = by.get((method, _same_run(method, membership) if churn == "none" else membership, churn))
      if r is None:
        table_rows.append([method, membership, churn] + ["missing"] * 9)
        continue
      steady = by.get((method, _same_run(method, membership), "none"))
      rate = r["worker_steps"] / r["wall_seconds"]
      goodput = "-" if steady is None else f"{rate / (steady['worker_steps'] / steady['wall_seconds']):.2f}"
      table_rows.append([
        method, membership, churn, f"{r['wall_seconds']:.1f}", str(r["events"]), str(r["worker_steps"]),
        f"{rate:.0f}", goodput, "-" if r["members_per_round"] is None else f"{r['members_per_round']:.2f}",
        f"{r['kills']} / {r['restarts']} / {r['resumes']}", str(r["dropped"]), f"{r['final_accuracy']:.3f}",
      ])  # fmt: skip
  lines = [
    "# Churn: elastic training against restarting from checkpoints",
    "",
    f"- Command: `{args_text}`",
    f"- Machine: {harness.machine()}",
    f"- Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
    f"- Wall time: {sum(r['wall_seconds'] for r in rows) / 60:.1f} min, the runs' own (from"
    f" `{NAME}_runs.jsonl`; {elapsed / 60:.1f} min measured by this invocation)",
    f"- Schedule ({size}): a worker process SIGKILLed every {SIZES[size]['period']:g} s (the processes but"
    " process 0 in turn: 1, 2, 3 with a server; 1 and 2 of an all-reduce run's 3, whose process 0 writes the"
    f" checkpoints), its replacement {SIZES[size]['rejoin']:g} s later; 3 workers, H = 10 for DiLoCo and asynchronous local SGD, quickstart MLP on digits,"
    f" `jaxsync launch` on 127.0.0.1, a lost process noticed after {HEARTBEAT_TIMEOUT} s without a heartbeat"
    " (`JAXSYNC_HEARTBEAT_TIMEOUT`)",
    "",
    "## Goodput",
    "",
    "<!-- goodput -->",
    harness.table(
      [
        "method",
        "membership",
        "churn",
        "wall s",
        "outer steps",
        "worker steps applied",
        "steps/s",
        "goodput",
        "members/round",
        "kills / restarts / resumes",
        "dropped",
        "final accuracy",
      ],
      table_rows,
    ),  # fmt: skip
    "",
    "Goodput: worker steps applied per wall second, over those of the same membership's run without churn"
    " (the share of its steady capacity that reached the model). Wall seconds run from the launch to the"
    " run's end, every start-up, wait and resume included. Elastic: the launcher restarts the killed worker"
    " after the delay and the run goes on meanwhile (DiLoCo with `membership: elastic`, through the"
    " parameter server). Fixed: each kill stops the job (DiLoCo's all-reduce saves its completed rounds and"
    " exits; the asynchronous job is stopped with SIGTERM, which checkpoints), and it resumes from its"
    " checkpoint once the replacement is there. Shrink: each kill restarts the two survivors at once as a run"
    " of two (`jaxsync launch --min-workers 2`, each worker's batch 48 instead of 32), and the run stops at a"
    " chunk's end and restarts with three when the replacement arrives; its worker steps are counted in"
    " batches of 32. Members/round: elastic DiLoCo's worker steps per round over H; a synchronous run's"
    " workers per round from its `membership.jsonl`. The kills come every 60 s of a run's own wall time, so a"
    " run that recovers sooner also ends sooner and sees fewer of them (the kills column)."
    " On these 2 cores the server and the 3 workers share the CPU, so a round with fewer members computes"
    " faster; on machines of their own it would not, and the elastic goodput would be lower (about the"
    " members' share of the rounds).",
    "<!-- /goodput -->",
    "",
  ]
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  p = harness.parser(__doc__)
  args = p.parse_args(argv)
  size = SIZES[args.size]
  results = args.results_dir or (
    harness.REPO / ("runs/bench/tiny" if args.size == "tiny" else "benchmarks/results")
  )
  runs = args.runs_dir or harness.REPO / "runs" / "bench" / ("tiny" if args.size == "tiny" else "") / NAME
  results.mkdir(parents=True, exist_ok=True)
  store = results / f"{NAME}_runs.jsonl"
  rows = [r for r in _store_rows(store) if r.get("size") == args.size]
  began = time.monotonic()
  if not args.report_only:
    for method in METHODS:
      for membership, churn in CASES[method]:
        membership = _same_run(method, membership) if churn == "none" else membership
        key = (method, membership, churn)
        if any((r["method"], r["membership"], r["churn"]) == key for r in rows) and not args.fresh:
          continue
        print(f"[{NAME}] {method} {membership} {churn} ...", file=sys.stderr, flush=True)
        row = {
          "size": args.size,
          **_run(method, membership, churn, size, runs / f"{method}_{membership}_{churn}"),
        }
        rows = [r for r in rows if (r["method"], r["membership"], r["churn"]) != key] + [row]
        with open(store, "a") as f:
          f.write(json.dumps(row) + "\n")
        print(f"[{NAME}] {json.dumps(row)}", file=sys.stderr, flush=True)
  command = f"python -m benchmarks.faults.{NAME} --size {args.size}"
  (results / f"{NAME}.md").write_text(_report(rows, args.size, command, time.monotonic() - began))
  print(f"[{NAME}] wrote {results / f'{NAME}.md'}", file=sys.stderr)
  with contextlib.suppress(Exception):
    print(re.sub(r"\n{3,}", "\n\n", (results / f"{NAME}.md").read_text()))
  return 0


if __name__ == "__main__":
  sys.exit(main())
