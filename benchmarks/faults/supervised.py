"""Parts 5-9 of the fault campaign: runs under ``jaxsync launch --max-restarts``, faulted at random times.

A run is launched (and resumed after each exit 75), its faults injected one after another, each once the run
has recovered from the one before; then every restart is tied to the fault that caused it, and the work lost
and the time to recover are measured per fault.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
import signal
import threading
import time
from typing import Any

import numpy as np

from benchmarks.faults.fuzzing import pick
from benchmarks.faults.processes import (
  Launched,
  _signal,
  _summary,
  final_records,
  last_event,
  latest_checkpoint,
  metrics_rows,
  params_digest,
  read_restarts,
)
from benchmarks.faults.settings import HEARTBEAT_TIMEOUT, RUN_TIMEOUT

MAX_RESTARTS = 20  # per launch: more than any run's faults, so that no run ends for want of restarts
CAMPAIGN_RESUMES = 8  # `jaxsync resume` after an exit 75 (a preemption), at most, per run
RECOVERY_TIMEOUT = 150.0  # seconds a run may take to make progress again after a fault


class Progress:
  """Polls ``run_dir/metrics.jsonl``: every change of its last train row, with its time (unix seconds)."""

  def __init__(self, run_dir: pathlib.Path):
    self.path = run_dir / "metrics.jsonl"
    self.changes: list[tuple[float, int, int]] = []  # (time, event, updates) of each new last row
    self.finished_at: float | None = None  # when summary.json first appeared: the run's end
    self._seen = None
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._poll, daemon=True)
    self._thread.start()

  def _poll(self) -> None:
    stamp = None
    while not self._stop.wait(0.1):
      if self.finished_at is None and self.path.with_name("summary.json").exists():
        self.finished_at = time.time()
      try:
        st = self.path.stat()
      except FileNotFoundError:
        continue
      if (st.st_size, st.st_mtime_ns) == stamp:
        continue
      stamp = (st.st_size, st.st_mtime_ns)
      rows = metrics_rows(self.path.parent)
      if rows and (rows[-1]["event"], rows[-1]["updates"]) != self._seen:
        self._seen = (rows[-1]["event"], rows[-1]["updates"])
        self.changes.append((time.time(), *self._seen))

  def stop(self) -> None:
    self._stop.set()
    self._thread.join(timeout=5)

  @property
  def event(self) -> int | None:
    return self.changes[-1][1] if self.changes else None

  def progressed_after(self, t: float) -> float | None:
    """The time of the first new train row after ``t`` that moved the run forward (a later event)."""
    for (_, before, _), (when, event, _) in zip(self.changes, self.changes[1:]):
      if when > t and event > before:
        return when
    return None


@dataclasses.dataclass
class Injected:
  """One fault of a supervised run, and what came of it."""

  kind: str  # kill (SIGKILL), stop (SIGSTOP, SIGCONT after `seconds`), term (SIGTERM), launcher_term
  role: str  # worker, server, shard, aggregator, node worker, peer, primary, process, launcher
  process: int | None  # JAXSYNC_PROCESS_ID (None: the launcher)
  at: float  # unix seconds
  since_start: float  # seconds since the run's first launch
  event: int | None  # the last logged event (train row) at the fault
  updates: int | None  # the updates at that row
  seconds: float = 0.0  # of a stop
  restart: int | None = None  # the restarts.jsonl entry it caused
  scope: str | None = None  # process (restarted alone) | run (every process) | resume (by the campaign)
  ended: str | None = None  # how the process ended, as restarts.jsonl says
  checkpoint: int | None = None  # the checkpoint the restart or resume started from
  down_seconds: float | None = None  # restarts.jsonl: from the death noticed to the restart
  recovered_seconds: float | None = None  # from the fault to the next progress row after the restart
  rejoined_seconds: float | None = None  # from the fault to the restarted worker joining the server
  completed: int | None = None  # rounds the survivors of a synchronous run said were complete
  lost: int | None = None  # updates (rounds) done before the fault that the run restarted without
  note: str = ""


@dataclasses.dataclass
class SupervisedRun:
  """A run under `jaxsync launch --max-restarts` with faults at random times."""

  part: str
  runtime: str  # single, sharded, inhad, sync
  strategy: str
  processes: int
  gradients: int
  events: int  # the run's full count of events (a synchronous run's are rounds of all its workers)
  faults: list[Injected]
  planned: int
  restarts: list[dict[str, Any]]
  resumes: list[dict[str, Any]]  # the campaign's `jaxsync resume` after an exit 75
  code: int | None  # the last launch's exit code (None: a hang)
  summary: dict[str, Any] | None
  consistent: bool | None  # the run's totals agree (parameter-server runs)
  unexplained: list[str]  # restarts (process deaths) no injected fault explains
  after_end: list[str]  # restarts of a process after the run had ended (its summary written)
  tracebacks: int
  params: str | None  # sha256 of the final parameters
  seconds: float
  problems: list[str]
  label: str = ""  # the preemption part's name of its config

  @property
  def finished(self) -> bool:
    return self.code == 0 and self.summary is not None and self.summary.get("events") == self.events

  @property
  def hung(self) -> bool:
    return self.code is None

  @property
  def crashed(self) -> bool:
    return (self.code not in (0, None)) or bool(self.unexplained) or self.tracebacks > 0


class Session:
  """One run directory's launches: the first `jaxsync launch`, and `jaxsync resume` after each exit 75."""

  def __init__(self, out: pathlib.Path, launch_args: list[str], max_restarts: int = MAX_RESTARTS):
    self.out, self.max_restarts = out, max_restarts
    if out.exists():
      shutil.rmtree(out)
    self.started = time.time()
    self.launches = [
      Launched.jaxsync("launch", *launch_args, "--out", str(out), "--max-restarts", str(max_restarts))
    ]
    self.resumes: list[dict[str, Any]] = []

  @property
  def current(self) -> Launched:
    return self.launches[-1]

  def tick(self) -> bool:
    """Resumes a run that stopped on a preemption notice; True while a launch is running."""
    code = self.current.process.poll()
    if code is None:
      return True
    if code == 75 and not (self.out / "summary.json").exists() and len(self.resumes) < CAMPAIGN_RESUMES:
      self.current.wait(10)
      self.resumes.append(
        {"time": time.time(), "checkpoint": latest_checkpoint(self.out), "event": last_event(self.out)}
      )
      self.launches.append(
        Launched.jaxsync("resume", str(self.out), "--max-restarts", str(self.max_restarts))
      )
      return True
    return False

  def processes(self) -> dict[int, Any]:
    return self.current.processes() if self.current.process.poll() is None else {}

  def wait_end(self, timeout: float) -> int | None:
    """The exit code of the run's last launch, or None (every process then killed) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if not self.tick():
        return self.current.wait(10)
      time.sleep(0.2)
    self.kill()
    return None

  def kill(self) -> None:
    for launched in self.launches:
      if launched.process.poll() is None:
        launched.kill_tree()

  def lines(self) -> list[tuple[float, str]]:
    return [x for launched in self.launches for x in launched.lines]

  @property
  def log(self) -> str:
    return "".join(line for _, line in self.lines())


_COMPLETED = re.compile(r"after (\d+) completed rounds")


@dataclasses.dataclass
class Layout:
  """Which process plays which role in a launched run."""

  runtime: str
  processes: int
  servers: int = 1  # parameter-server runs: processes 0..servers-1
  nodes: int = 0  # InHAD: nodes of `local` workers; a node's first worker process runs its aggregator
  local: int = 0

  def workers(self) -> list[int]:
    return list(range(self.servers, self.processes)) if self.runtime != "sync" else []

  def worker_of(self, process: int) -> int:
    return process - self.servers

  def aggregators(self) -> list[int]:
    return [self.servers + n * self.local for n in range(self.nodes)]


def _choose(
  rng: np.random.Generator, layout: Layout, role: str, spared: int | None, out: set[int], *, draw: bool = True
) -> int:
  """A process for ``role``: never the spared worker, never one in ``out`` (gone for good, or rejoining);
  -1 if none is left. ``draw=False``: whether one is left, without drawing from ``rng``."""
  if role in ("primary", "server"):
    return 0
  if role == "shard":
    choices = list(range(layout.servers))
  elif role in ("peer", "process"):
    choices = list(range(1 if role == "peer" else 0, layout.processes))
  elif role == "aggregator":
    choices = [p for p in layout.aggregators() if p != spared and p not in out]
  elif role == "node worker":
    choices = [p for p in layout.workers() if p not in layout.aggregators() and p != spared and p not in out]
  else:  # any worker, as long as another stays up: the server stops once every worker is lost
    up = [p for p in layout.workers() if p not in out]
    choices = [p for p in up if p != spared] if len(up) >= 2 else []
  if not draw:
    return 0 if choices else -1
  return pick(rng, choices) if choices else -1


def supervised_run(
  part: str,
  out: pathlib.Path,
  layout: Layout,
  strategy: str,
  launch_args: list[str],
  gradients: int,
  plan: list[tuple[str, str]],
  rng: np.random.Generator,
  *,
  delay: tuple[float, float] = (2.0, 6.0),
  stop_seconds: tuple[float, float] = (1.0, 5.0),
  first_at: int = 0,
  last_fraction: float = 0.8,
  timeout: float = RUN_TIMEOUT,
  events: int | None = None,
) -> SupervisedRun:
  """Launches a run under supervision and injects ``plan``'s faults, ``(kind, role)``, one after another.

  Each fault comes a random delay (``delay`` seconds) after the run has recovered from the one before
  (every process up, a restarted worker rejoined, a new progress row), or after the run's ``first_at``-th
  event for the first. A planned fault the run ends before is not injected (``planned`` counts them all).
  """
  started = time.monotonic()
  if events is None:  # one gradient an event, or a synchronous round of every process's
    events = gradients // layout.processes if layout.runtime == "sync" else gradients
  session = Session(out, launch_args)
  progress = Progress(out)
  faults: list[Injected] = []
  problems: list[str] = []
  timers: list[threading.Timer] = []
  # One worker never faulted when there are three or more: its death would be the runtime's doing.
  spared = pick(rng, layout.workers()) if len(layout.workers()) >= 3 and layout.runtime != "inhad" else None
  gone: set[int] = set()  # InHAD workers that are not restarted

  def restarted_after(t: float) -> float | None:
    """The time of the first restart of every process (the launcher's, or the campaign's resume) after ``t``."""
    times = [r["time"] for r in read_restarts(out) if r["scope"] == "run"] + [
      r["time"] for r in session.resumes
    ]
    return min((x for x in times if x > t), default=None)

  def healthy(since: float, expect: str | None) -> bool:
    """Every process up (but those gone for good), the expected restart done, a progress row since."""
    if expect == "run":
      since = restarted_after(since)
      if since is None:
        return False
    # An InHAD worker a stop ended (JAX aborts a process the coordination service marked dead) is gone
    # for good too: only the server must be up.
    required = {0} if layout.runtime == "inhad" else set(range(layout.processes)) - gone
    if not required <= set(session.processes()):
      return False
    return progress.progressed_after(since) is not None and (progress.event or 0) >= first_at

  def rejoining() -> set[int]:
    """Processes restarted alone that have not rejoined the server yet (not faulted again till then)."""
    for process, at in list(pending.items()):
      pattern = re.compile(rf"worker {layout.worker_of(process)} joined")
      if any(when > at and pattern.search(line) for when, line in session.lines()):
        del pending[process]
    return set(pending)

  def wait(seconds: float, until=None) -> bool:
    """Waits ``seconds`` (or until ``until()``); False if the run ended."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
      if not session.tick() or (session.out / "summary.json").exists():
        return False
      if until is not None and until():
        return True
      time.sleep(0.1)
    return until is None

  try:
    since, expect = session.started, None
    pending: dict[int, float] = {}  # a worker process restarted alone: when it was faulted
    for kind, role in plan:
      if not wait(RECOVERY_TIMEOUT, lambda s=since, e=expect: healthy(s, e)):
        if session.current.process.poll() is None and not (out / "summary.json").exists():
          problems.append(f"no recovery within {RECOVERY_TIMEOUT:.0f} s of the fault before a planned {kind}")
        break
      if not wait(float(rng.uniform(*delay))):
        break
      if (progress.event or 0) > last_fraction * events:
        break  # a process restarted now would rejoin a run that has ended
      if role in ("worker", "node worker", "aggregator"):  # one that is up: wait for one to rejoin
        if not wait(
          RECOVERY_TIMEOUT,
          lambda r=role: _choose(rng, layout, r, spared, gone | rejoining(), draw=False) >= 0,
        ):
          break
      procs = session.processes()
      victim = None if role == "launcher" else _choose(rng, layout, role, spared, gone | rejoining())
      target = session.current.process if victim is None else procs.get(victim)
      if target is None:
        problems.append(f"no process {victim} ({role}) to fault")
        continue
      now = time.time()
      rows = metrics_rows(out)
      fault = Injected(
        kind, role, victim, now, now - session.started,
        rows[-1]["event"] if rows else None, rows[-1]["updates"] if rows else None,
      )  # fmt: skip
      if kind == "stop":
        fault.seconds = float(rng.uniform(*stop_seconds))
        _signal(target, signal.SIGSTOP)
        timer = threading.Timer(fault.seconds, _signal, (target, signal.SIGCONT))
        timer.start()
        timers.append(timer)
      else:
        _signal(
          target, {"kill": signal.SIGKILL, "term": signal.SIGTERM, "launcher_term": signal.SIGTERM}[kind]
        )
      faults.append(fault)
      since, expect = now, None
      if kind == "stop":  # a stop past the heartbeat timeout may end the process: let the launcher see it
        since = now + fault.seconds + HEARTBEAT_TIMEOUT + 1.0
      elif victim is not None and victim in layout.workers():
        if layout.runtime == "inhad":  # not restarted: the run goes on without it (and its node)
          gone.add(victim)
          if role == "aggregator":  # its node's other workers cannot reach the server without it
            gone.update(range(victim, victim + layout.local))
        else:  # restarted alone: it rejoins the server
          pending[victim] = now
      else:  # the launcher, a server or shard, or a process of a synchronous run: every process again
        expect = "run"
        gone.clear()
        pending.clear()
    code = session.wait_end(timeout)
  finally:
    for timer in timers:  # a stopped process is never left stopped
      timer.join()
    session.kill()
    progress.stop()
  log = session.log
  lines = session.lines()
  (out / "campaign.log").write_text(log)  # the launches' output, for a look at what happened
  restarts = read_restarts(out)
  summary = _summary(out)
  ended_at = progress.finished_at
  after_end = [
    f"restart {r['restart']}: process {r['process']} ({r['ended']}) {r['time'] - ended_at:.1f} s after the run's end"
    for r in restarts
    if ended_at is not None and r["time"] > ended_at
  ]
  unexplained = _attribute(
    faults, [r for r in restarts if ended_at is None or r["time"] <= ended_at], session.resumes, layout
  )
  for fault in faults:
    _recovery(fault, progress, lines, layout)
  consistent = None
  if layout.runtime != "sync" and summary is not None:
    consistent, why = _ps_totals(out, summary, events, strategy)
    problems += why
  tracebacks = len(re.findall(r"^\[p\d+\] Traceback", log, re.M))
  if tracebacks:
    problems.append(f"{tracebacks} Python traceback(s) in the log")
  if unexplained:
    problems.append(f"process deaths no fault explains: {'; '.join(unexplained)}")
  if after_end:
    problems.append(f"the launcher restarted a process after the run had ended: {'; '.join(after_end)}")
  if code is None:
    problems.append(f"a hang: the run did not end within {timeout:.0f} s")
  elif code != 0:
    problems.append(f"exit {code}: {log[-1500:]}")
  elif summary is None or summary.get("events") != events:
    problems.append(
      f"the run ended at {None if summary is None else summary.get('events')} of {events} events"
    )
  for fault in faults:
    if fault.lost and not _may_lose(fault, layout):
      problems.append(
        f"{fault.kind} of process {fault.process} ({fault.role}): {fault.lost} lost past the checkpoint"
      )
  return SupervisedRun(
    part=part,
    runtime=layout.runtime,
    strategy=strategy,
    processes=layout.processes,
    gradients=gradients,
    events=events,
    faults=faults,
    planned=len(plan),
    restarts=restarts,
    resumes=session.resumes,
    code=code,
    summary=_small(summary),
    consistent=consistent,
    unexplained=unexplained,
    after_end=after_end,
    tracebacks=tracebacks,
    params=params_digest(out) if summary is not None else None,
    seconds=time.monotonic() - started,
    problems=problems,
  )


def _may_lose(fault: Injected, layout: Layout) -> bool:
  """Whether a fault may cost work past the last periodic checkpoint: the death of the process that writes
  the checkpoints (process 0, a server shard), except in a synchronous run, whose process 1 writes them when
  process 0 is lost. A worker's fault, a preemption (SIGTERM) must cost none."""
  writer = fault.process is not None and fault.process < layout.servers and layout.runtime != "sync"
  return fault.kind in ("kill", "stop") and writer


def _attribute(
  faults: list[Injected], restarts: list[dict], resumes: list[dict], layout: Layout
) -> list[str]:
  """Ties each restart (and each campaign resume) to the fault that caused it; returns those no fault explains."""
  unexplained = []
  free = list(faults)
  for r in restarts:
    # A fault explains a restart that comes after it, within the time a run may take to recover.
    before = [
      f for f in free if r["time"] - RECOVERY_TIMEOUT <= f.at <= r["time"] + 0.5 and f.kind != "launcher_term"
    ]
    mine = [f for f in before if f.process == r["process"]]
    # A run restarted for a death its fault caused elsewhere (process 0 killed: the others abort).
    fault = (mine or (before if r["scope"] == "run" else []) or [None])[-1]
    if fault is None:
      # A worker restarted alone while the server stops (its own SIGTERM, or killed) cannot join a run that
      # is ending: JAX's coordination client aborts it. The server's fault explains it, and stays free for
      # the resume or the restart of every process it causes.
      server = [
        f for f in faults if f.process is not None and f.process < layout.servers and f.kind in ("term", "kill")
        and r["time"] - RECOVERY_TIMEOUT <= f.at <= r["time"]
      ]  # fmt: skip
      if r["scope"] == "process" and server:
        server[-1].note = (server[-1].note + "; " if server[-1].note else "") + (
          f"worker process {r['process']} ended with {r['ended']} while the server stopped (restart {r['restart']})"
        )
        continue
      unexplained.append(f"restart {r['restart']}: process {r['process']} ended with {r['ended']}")
      continue
    free.remove(fault)
    fault.restart, fault.scope, fault.ended = r["restart"], r["scope"], r["ended"]
    fault.checkpoint, fault.down_seconds = r["checkpoint"], r["down_seconds"]
    fault._restart_time = r["time"]  # noqa: SLF001 - for _recovery, not stored
  for r in resumes:
    before = [f for f in free if f.at <= r["time"] and f.kind in ("term", "launcher_term")]
    if not before:
      unexplained.append(f"an exit 75 (preempted) no SIGTERM explains at event {r['event']}")
      continue
    fault = before[-1]
    free.remove(fault)
    fault.scope, fault.checkpoint, fault.ended = "resume", r["checkpoint"], "exit code 75"
    fault._restart_time = r["time"]  # noqa: SLF001
    fault.lost = None if r["event"] is None or r["checkpoint"] is None else r["event"] - r["checkpoint"]
  return unexplained


def _recovery(fault: Injected, progress: Progress, lines: list[tuple[float, str]], layout: Layout) -> None:
  """Time to recover, and what a restart of every process lost past its checkpoint."""
  restarted = getattr(fault, "_restart_time", None)
  after = restarted if fault.scope in ("run", "resume") and restarted else fault.at + fault.seconds
  when = progress.progressed_after(after)
  fault.recovered_seconds = None if when is None else round(when - fault.at, 2)
  if fault.scope == "process" and restarted:
    w = layout.worker_of(fault.process)
    joined = [t for t, line in lines if t > restarted and re.search(rf"worker {w} joined", line)]
    fault.rejoined_seconds = round(joined[0] - fault.at, 2) if joined else None
  if fault.scope != "run":
    return
  if layout.runtime == "sync":
    said = [
      int(m) for t, line in lines if fault.at <= t <= (restarted or t) for m in _COMPLETED.findall(line)
    ]
    fault.completed = max(said) if said else None
    done = fault.completed if fault.completed is not None else fault.event
    if fault.completed is None:
      fault.note = "no survivor said how many rounds were complete: the last logged row counts"
    fault.lost = None if done is None or fault.checkpoint is None else max(0, done - fault.checkpoint)
  else:  # the server's updates logged before the fault, against those at the checkpoint it resumed from
    at = {}
    for t, event, updates in progress.changes:
      if t <= fault.at:
        at[event] = updates
    base = at.get(fault.checkpoint, 0 if fault.checkpoint is None else None)
    fault.lost = None if base is None or fault.updates is None else fault.updates - base


def _ps_totals(out: pathlib.Path, summary: dict, events: int, strategy: str) -> tuple[bool, list[str]]:
  """Whether a parameter-server run's totals agree: every accepted arrival's update is in its end state."""
  records = final_records(out)
  rows = metrics_rows(out)
  if records is None:
    return False, ["no final checkpoint"]
  accepted = int((~records["rejected"]).sum())
  checks = {
    "events": summary["events"] == events == len(records["version"]),
    "version": int(records["version"][-1]) == summary["updates"] == int(records["released"].sum()),
    "versions step by released": bool(np.all(np.diff(records["version"]) == records["released"][1:])),
    "last row": bool(rows) and rows[-1]["updates"] == summary["updates"],
  }
  if strategy in ("asp", "ssp"):  # every accepted arrival is an update
    checks["accepted = updates"] = accepted == summary["updates"]
  bad = [k for k, ok in checks.items() if not ok]
  if bad:
    totals = {k: summary.get(k) for k in ("events", "gradients", "updates", "rejected", "dropped_gradients")}
    return False, [f"totals disagree ({', '.join(bad)}): {totals}"]
  return True, []


_SUMMARY_KEYS = (
  "events", "gradients", "updates", "rejected", "dropped_gradients", "lost_workers", "rejected_messages",
  "max_staleness", "mean_staleness", "final_loss", "final_accuracy",
)  # fmt: skip


def _small(summary: dict[str, Any] | None) -> dict[str, Any] | None:
  """The summary's keys the results use (the store keeps these only)."""
  if summary is None:
    return None
  return {k: summary[k] for k in _SUMMARY_KEYS if k in summary}
