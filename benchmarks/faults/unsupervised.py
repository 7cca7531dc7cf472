"""Parts 2-4 of the fault campaign: real runs that nothing restarts.

Worker faults (SIGKILL, SIGSTOP/SIGCONT) on runs of one server and three workers, two killed workers started
again by hand, and the server killed and resumed by hand with ``jaxsync resume``.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

from benchmarks.common import harness
from benchmarks.faults.processes import (
  Launched,
  _rejections,
  _server_crashed,
  _signal,
  _summary,
  final_records,
  launch,
  metrics_rows,
  run_overrides,
  wait_for_event,
)
from benchmarks.faults.settings import RUN_TIMEOUT

_DROPPED = re.compile(
  r"worker (\d+) is back after it was declared lost: its message of version (\d+) is dropped "
  r"\(the server is at (\d+)\)"
)


def _dropped(log: str) -> dict[int, int]:
  """How stale each worker's first message dropped for coming back after it was declared lost was."""
  found: dict[int, int] = {}
  for worker, version, server in _DROPPED.findall(log):
    found.setdefault(int(worker), int(server) - int(version))
  return found


def _stale_push(records: dict[str, np.ndarray] | None, fault: Fault) -> tuple[int | None, int | None]:
  """(staleness, event) of a stopped worker's first push after its stop: the one after its longest pause."""
  if records is None:
    return None, None
  mine = np.nonzero(records["worker"] == fault.worker)[0]
  if len(mine) < 2:
    return None, None
  gaps = np.diff(records["time"][mine])
  i = int(np.argmax(gaps))
  if gaps[i] < 0.5 * fault.seconds:  # no push came back after the stop
    return None, None
  event = int(mine[i + 1])
  return int(records["staleness"][event]), event + 1


@dataclasses.dataclass
class Fault:
  """One injected fault: ``kind`` kill or stop, on ``worker``, when the run reached ``fraction`` of it."""

  kind: str
  worker: int
  fraction: float
  seconds: float = 0.0  # of a stop
  event: int | None = None  # the logged event when it was injected
  declared_lost: bool = False
  survived: bool = False
  aborted_by_jax: bool = False
  stale_push: int | None = None  # the staleness of the first push after a stop (computed before it)
  stale_event: int | None = None  # the event that push was
  dropped_staleness: int | None = None  # that push dropped, not applied: how stale it would have been


@dataclasses.dataclass
class WorkerRun:
  """One run with worker faults and what came of it."""

  strategy: str
  faults: list[Fault]
  code: int | None
  summary: dict[str, Any] | None
  rejections: dict[str, int]
  crashed: bool
  consistent: bool
  lost_updates: int | None
  seconds: float
  problems: list[str]
  other_staleness: int | None = None  # the largest staleness of the run's other pushes (not after a stop)

  @property
  def finished(self) -> bool:
    return self.code == 0 and self.summary is not None

  @property
  def hung(self) -> bool:
    return self.code is None


def random_faults(rng: np.random.Generator) -> list[Fault]:
  """One or two faults on distinct workers of three, one worker left alone: SIGKILL, or SIGSTOP for 1-5 s."""
  survivor = int(rng.integers(3))
  targets = [w for w in range(3) if w != survivor]
  rng.shuffle(targets)
  faults = []
  for worker in targets[: int(rng.integers(1, 3))]:
    kind = str(rng.choice(["kill", "stop"]))
    seconds = float(rng.uniform(1.0, 5.0)) if kind == "stop" else 0.0
    faults.append(Fault(kind, int(worker), float(rng.uniform(0.1, 0.6)), seconds))
  return sorted(faults, key=lambda f: f.fraction)


def worker_fault_run(out: pathlib.Path, strategy: str, gradients: int, faults: list[Fault]) -> WorkerRun:
  """One run of 1 server + 3 workers with ``faults`` injected when the run reaches their fractions."""
  started = time.monotonic()
  run = launch(out, run_overrides(strategy, gradients))
  problems = []
  stops: list[Fault] = []
  timers: list[threading.Timer] = []
  try:
    if not run.wait_for(r"worker \d joined", 180, count=3):
      problems.append("the workers did not all join")
    processes = run.processes()
    for fault in faults:
      at = int(fault.fraction * gradients)  # 0: as soon as every worker has joined
      if at and not wait_for_event(run, out, at, 120):
        problems.append(f"the run ended before its {fault.kind} of worker {fault.worker}")
        break
      rows = metrics_rows(out)
      fault.event = rows[-1]["event"] if rows else 0
      victim = processes.get(fault.worker + 1)
      if victim is None:
        problems.append(f"process {fault.worker + 1} not found")
        continue
      if fault.kind == "kill":
        victim.send_signal(signal.SIGKILL)
      else:  # continued by a timer: the next fault does not wait for it
        victim.send_signal(signal.SIGSTOP)
        timer = threading.Timer(fault.seconds, _signal, (victim, signal.SIGCONT))
        timer.start()
        timers.append(timer)
        stops.append(fault)
    code = run.wait(RUN_TIMEOUT)
  finally:
    for timer in timers:  # a stopped process is never left stopped
      timer.join()
    if run.process.poll() is None:
      run.kill_tree()
  log, summary = run.log, _summary(out)
  rejections = dict(_rejections(log))
  lost_workers = {x["worker"] for x in (summary or {}).get("lost_workers", [])}
  for fault in faults:
    fault.declared_lost = fault.worker in lost_workers
    fault.survived = bool(re.search(rf"\[p{fault.worker + 1}\] worker {fault.worker}: \d+ pushes", log))
    fault.aborted_by_jax = f"process {fault.worker + 1} ended with signal 6" in log
  rows = metrics_rows(out)
  records = final_records(out)
  dropped = _dropped(log)
  for fault in stops:
    if fault.worker in dropped:  # the server dropped it: what came next was computed after rejoining
      fault.dropped_staleness = dropped[fault.worker]
    else:
      fault.stale_push, fault.stale_event = _stale_push(records, fault)
  other = None
  if records is not None:
    keep = np.ones(len(records["staleness"]), bool)
    keep[[f.stale_event - 1 for f in stops if f.stale_event is not None]] = False
    other = int(records["staleness"][keep & ~records["rejected"]].max(initial=0))
  for fault in faults:
    if fault.kind == "kill" and f"process {fault.worker + 1} ended with signal 9" not in log:
      problems.append(f"worker {fault.worker}'s process did not end with SIGKILL")
  consistent, lost, crashed_worker = False, None, False
  if summary is not None and records is not None:
    accepted = int((~records["rejected"]).sum())
    dropped_count = summary.get("dropped_gradients", 0)
    consistent = bool(
      summary["events"] == gradients == len(records["version"])
      and summary["gradients"] == gradients + dropped_count  # a dropped push is a gradient, not an event
      and dropped_count == len(_DROPPED.findall(log))
      and accepted == summary["events"] - summary["rejected"]
      and int(records["released"].sum()) == accepted  # asp, ssp: every accepted arrival is an update
      and int(records["version"][-1]) == summary["updates"]
      and bool(np.all(np.diff(records["version"]) == records["released"][1:]))
      and rows
      and rows[-1]["updates"] == summary["updates"]
    )
    lost = accepted - summary["updates"]  # applied updates the run does not hold at its end
    if not consistent:
      totals = {k: summary.get(k) for k in ("events", "gradients", "updates", "dropped_gradients")}
      problems.append(f"inconsistent totals: {totals}")
  elif summary is not None:
    problems.append("no final checkpoint")
  # A worker never faulted must finish: its death would be a crash of the runtime.
  for worker in set(range(3)) - {f.worker for f in faults}:
    if not re.search(rf"\[p{worker + 1}\] worker {worker}: \d+ pushes", log):
      problems.append(f"worker {worker}, never faulted, did not finish")
      crashed_worker = True
  crashed = _server_crashed(log) or bool(code not in (0, None)) or crashed_worker
  return WorkerRun(
    strategy,
    faults,
    code,
    summary,
    rejections,
    crashed,
    bool(consistent),
    lost,
    time.monotonic() - started,
    problems + ([] if code == 0 else [f"exit {code}: {log[-1500:]}"]),
    other,
  )


_REJOIN_WORKER = """
import sys
import jax
from jaxsync._src.app import config as config_lib
from jaxsync._src.app import experiment
from jaxsync._src.distributed import cluster, ps_worker
from jaxsync._src.distributed.server import param_server
group = cluster.initialize()
client = cluster.coordination_client()
heartbeat = cluster.Heartbeat(client, group.index).start()
exp = experiment.build(config_lib.load(sys.argv[1] + "/config.yaml"))
address = client.blocking_key_value_get(param_server.KEY_ADDRESS, 60_000)
token = client.blocking_key_value_get_bytes(param_server.KEY_TOKEN, 60_000)
done = ps_worker.run_worker(exp.strategy, exp.loss_fn, exp.data, exp.model.params, worker=group.index - 1,
                            address=address, token=token, reply_timeout=60)
heartbeat.stop()
print(f"worker {group.index - 1}: {done['pushes']} pushes after rejoining; the server said stop", flush=True)
jax.distributed.shutdown()
"""


@dataclasses.dataclass
class RejoinRun:
  """Two workers killed and started again: with the launcher's command line, and through the worker loop."""

  code: int | None
  summary: dict[str, Any] | None
  same_command: dict[str, Any]
  worker_loop: dict[str, Any]
  crashed: bool
  consistent: bool
  seconds: float
  problems: list[str]
  rejections: dict[str, int] = dataclasses.field(default_factory=dict)
  log: str = ""


def _dead(process, timeout: float = 10.0) -> None:
  """Waits until a process we do not parent is gone or a zombie (its parent reaps it later)."""
  import psutil

  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    try:
      if process.status() == psutil.STATUS_ZOMBIE:
        return
    except psutil.NoSuchProcess:
      return
    time.sleep(0.05)


def _where_waiting(text: str) -> str | None:
  """The innermost jaxsync line of the main thread in a process's faulthandler dump (with its source)."""
  for block in re.split(r"\n\s*\n", text.split("Fatal Python error", 1)[-1]):
    if "<module>" not in block:  # the main thread's stack ends in the script's module
      continue
    for path, line in re.findall(r'File "([^"]*jaxsync[^"]*\.py)", line (\d+)', block):
      source = pathlib.Path(path).read_text().splitlines()[int(line) - 1].strip()
      return f"{harness._relative(pathlib.Path(path))}:{line} `{source}`"
  return None


def rejoin_run(out: pathlib.Path, gradients: int, rng: np.random.Generator) -> RejoinRun:
  """Kills two workers; restarts one with the launcher's command line, one through the worker loop."""
  started = time.monotonic()
  run = launch(out, run_overrides("asp", gradients))
  problems, restarted = [], {}
  try:
    if not run.wait_for(r"worker \d joined", 180, count=3):
      problems.append("the workers did not all join")
    processes = run.processes()
    first, second = (int(w) for w in rng.permutation(3)[:2])
    for how, worker, fraction in (("same_command", first, 0.05), ("worker_loop", second, 0.1)):
      wait_for_event(run, out, int(fraction * gradients), 120)
      victim = processes[worker + 1]
      command, env, cwd = victim.cmdline(), victim.environ(), victim.cwd()
      victim.send_signal(signal.SIGKILL)
      _dead(victim)
      if how == "worker_loop":
        command = [sys.executable, "-c", _REJOIN_WORKER, str(out)]
      # A fatal signal (JAX aborts a process whose coordinator is gone) dumps its Python stack.
      restarted[how] = (
        worker,
        Launched(command, env={**env, "PYTHONFAULTHANDLER": "1"}, cwd=pathlib.Path(cwd)),
      )
    code = run.wait(RUN_TIMEOUT)
    outcomes = {}
    for how, (worker, process) in restarted.items():
      try:  # with process 0 gone its coordinator is gone: JAX ends a process left behind
        exited = process.process.wait(timeout=30)
      except subprocess.TimeoutExpired:
        process.process.send_signal(signal.SIGABRT)  # still there: its stack, then its end
        exited = process.wait(10)
      process._reader.join(timeout=10)
      text = process.log
      joined = [int(v) for v in re.findall(rf"worker {worker} joined at version (\d+)", run.log)]
      outcomes[how] = {
        "worker": worker,
        "joined_coordination": f"process {worker + 1} of 4" in text,
        "hello_at_server": len(joined) >= 2,
        "joined_at": joined[1:],
        "pushes": int(m.group(1))
        if (m := re.search(r"(\d+) pushes (?:after rejoining|in [\d.]+ s)", text))
        else 0,
        "exit": exited,
        "waiting_at": _where_waiting(text),
      }
  finally:
    if run.process.poll() is None:
      run.kill_tree()
    for _, process in restarted.values():
      if process.process.poll() is None:
        process.kill_tree()
  log, summary = run.log, _summary(out)
  consistent = bool(
    summary
    and summary["events"] == gradients
    and summary["updates"] == summary["events"] - summary["rejected"]
  )
  if outcomes["worker_loop"]["pushes"] == 0:
    problems.append("the worker started again through the worker loop made no push")
  if outcomes["same_command"]["pushes"] == 0:
    problems.append("the worker started again with the launcher's command line made no push")
  return RejoinRun(
    code,
    summary,
    outcomes["same_command"],
    outcomes["worker_loop"],
    _server_crashed(log) or code not in (0, None),
    consistent,
    time.monotonic() - started,
    problems + ([] if code == 0 else [f"exit {code}: {log[-1500:]}"]),
    dict(_rejections(log)),
    log,
  )


@dataclasses.dataclass
class ServerKill:
  """A server killed after a checkpoint, and its resume."""

  killed_at: int | None  # the last logged event before the kill
  updates_logged: int | None  # the server's updates at that event
  checkpoint: int | None  # the last checkpoint's event count
  checkpoint_updates: int | None
  resumed_at: list[int]  # the versions the workers were sent on joining the resumed server
  resumed_from: int | None  # the version before the resumed server's first event (the final records)
  code: int | None  # of the killed launch (process 0's: -9)
  resume_code: int | None
  summary: dict[str, Any] | None
  crashed: bool
  seconds: float
  problems: list[str]

  @property
  def lost_updates(self) -> int | None:
    """Updates applied after the last checkpoint (as far as the metrics logged them): redone on resume."""
    if self.updates_logged is None or self.checkpoint_updates is None:
      return None
    return self.updates_logged - self.checkpoint_updates

  @property
  def finished(self) -> bool:
    return self.resume_code == 0 and self.summary is not None


def server_kill_run(
  out: pathlib.Path, gradients: int, rng: np.random.Generator, chunk: int = 50
) -> ServerKill:
  started = time.monotonic()
  every = 500
  run = launch(out, run_overrides("asp", gradients, chunk=chunk, checkpoint_every=every))
  problems = []
  if not run.wait_for(r"worker \d joined", 180, count=3):
    problems.append("the workers did not all join")
  # Somewhere between the first checkpoint and 70% of the run, off the checkpoint boundaries.
  target = int(rng.uniform(every + chunk, 0.7 * gradients))
  wait_for_event(run, out, target, 120)
  try:
    server = run.processes().get(0)
    if server is not None:
      server.send_signal(signal.SIGKILL)
    code = run.wait(120)
  finally:
    if run.process.poll() is None:
      run.kill_tree()
  rows = metrics_rows(out)  # as the killed server left them (a resume cuts them back to its checkpoint)
  steps = sorted(int(p.name) for p in (out / "checkpoints").glob("*") if p.is_dir() and p.name.isdigit())
  checkpoint = steps[-1] if steps else None
  at = {r["event"]: r["updates"] for r in rows}
  if (out / "summary.json").exists():
    problems.append("the run finished before the server was killed")
  resumed = Launched.jaxsync("resume", str(out))
  try:
    resume_code = resumed.wait(RUN_TIMEOUT)
  finally:
    if resumed.process.poll() is None:
      resumed.kill_tree()
  log = resumed.log
  summary = _summary(out)
  joined = [int(v) for v in re.findall(r"worker \d joined at version (\d+)", log)]
  if summary is not None and summary["updates"] != summary["events"] - summary["rejected"]:
    problems.append("the resumed run's totals disagree")
  if summary is not None and summary["events"] != gradients:
    problems.append(f"the resumed run stopped at {summary['events']} events")
  records = final_records(out) if summary is not None else None
  resumed_from = None
  if records is not None and checkpoint is not None and checkpoint < len(records["version"]):
    resumed_from = int(records["version"][checkpoint]) - int(records["released"][checkpoint])
  result = ServerKill(
    resumed_from=resumed_from,
    killed_at=rows[-1]["event"] if rows else None,
    updates_logged=rows[-1]["updates"] if rows else None,
    checkpoint=checkpoint,
    checkpoint_updates=at.get(checkpoint),
    resumed_at=joined,
    code=code,
    resume_code=resume_code,
    summary=summary,
    crashed=_server_crashed(log) or resume_code not in (0, None),
    seconds=time.monotonic() - started,
    problems=problems + ([] if resume_code == 0 else [f"resume exit {resume_code}: {log[-1500:]}"]),
  )
  if resumed_from != result.checkpoint_updates or not joined or joined[0] != result.checkpoint_updates:
    result.problems.append(
      f"the resumed server started from version {resumed_from}, its workers joined at {joined}; "
      f"the checkpoint holds {result.checkpoint_updates}"
    )
  return result
