"""``jaxsync launch -n N``: N local processes of one run, their logs streamed, restarted when they fail.

The launcher picks a free port on the bind interface (loopback by default),
hands every process the coordinator address, the process count and its id
through the environment (:mod:`cluster` reads them), and prefixes every line
a process prints with ``[pI]``. It returns process 0's exit code: process 0
is the run (the parameter server, or the primary of a synchronous run). Once
process 0 has exited, the others get ``grace`` seconds to finish before they
are terminated, so a launch never hangs on a process that lost its
coordinator.

It is also the run's supervisor. With ``max_restarts`` it restarts what
failed (a process killed by a signal, or ended by an error other than a bad
config or an interrupt), without a person:

* a worker process of a parameter-server run alone, with its own command
  line: it rejoins the running server, which went on without it;
* every process otherwise (a synchronous run, a server or shard), with
  ``jaxsync resume RUN_DIR`` on a fresh coordinator port, from the run's last
  checkpoint (an InHAD worker process is not restarted: the server goes on
  without its node). A synchronous run's process 0 writes one of every
  completed round when it loses a peer, so a worker fault costs no completed
  round (process 0's own loss costs what came after the last periodic one).

With ``min_workers`` (``--min-workers``), a synchronous run that loses a
process does not wait for its replacement: the survivors restart at once as a
smaller run from the checkpoint of every completed round, as long as at least
``min_workers`` are left (``RUN_DIR/membership.jsonl`` records the size and
the round; each process builds its config for that size, see
:mod:`jaxsync._src.app.resize`). The replacement arrives ``rejoin_delay``
seconds after the loss; the run then stops at its next chunk with a
checkpoint and restarts with it (a grow, not counted as a restart). Fewer
survivors than ``min_workers``: the run waits for the replacements and
restarts at full size.

Every restart is a line of ``RUN_DIR/restarts.jsonl``. SIGTERM to the launcher
(a preemption notice) and the first Ctrl-C are passed on to every process,
which stop at their next chunk with a checkpoint; a second one kills them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from jaxsync._src.distributed import cluster, coordination_service, membership


def free_port(host: str = "127.0.0.1") -> int:
  """A TCP port that is free on ``host`` right now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind((host, 0))
    return s.getsockname()[1]


# Lines the libraries under a run print on every launch and that say nothing to its user: the
# coordination service announcing the recoverable tasks jaxsync asks for (so that a lost worker does not
# end an asynchronous run), and gloo's per-rank connection notes. Everything else is passed on.
NOISE = (
  re.compile(r"coordination_service\.cc.*Using experimental recoverable task feature"),
  re.compile(r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks"),
)


def is_noise(line: str) -> bool:
  """Whether a process's output line is one of the routine library notes in :data:`NOISE`."""
  return any(pattern.search(line) for pattern in NOISE)


def _stream(process: subprocess.Popen, prefix: str, out) -> None:
  for line in iter(process.stdout.readline, ""):
    if is_noise(line):
      continue
    out.write(f"{prefix}{line}")
    out.flush()


# Exit codes after which nothing is restarted: success, a bad config or command line (it would fail
# again), an interrupt by a person. The cli's codes.
_NOT_FAILURES = (0, 2, 130)
EXIT_PREEMPTED = 75  # cli.EXIT_PREEMPTED: stopped on a notice, checkpoint written
RESTARTS_FILE = "restarts.jsonl"
# Seconds a server that lost every worker waits for a restarted one (start-up and compilation: 8-66 s
# measured on 2 busy CPU cores by the fault campaign).
REJOIN_WAIT = 120.0


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
  """What the launcher restarts, and how.

  Attributes:
    max_restarts: restarts allowed in the whole launch (``0``: none).
    run_dir: the run directory (``restarts.jsonl`` goes there; ``jaxsync
      resume`` continues it).
    alone: processes restarted alone when they fail (the workers of a
      parameter-server run); a failure of any other restarts every process,
    kept_down: but these, which are not restarted (InHAD's worker processes:
      the run goes on without their node).
    settle: seconds a restart of every process waits for process 0 to save
      what it holds and leave.
    rejoin_delay: seconds between a process's failure and its restart alone
      (``0``: at once). Stands for a replacement machine that arrives later:
      an elastic run goes on without the failed worker meanwhile.
    host_service: the launcher runs the ``jax.distributed`` coordination
      service in a process of its own (:mod:`coordination_service`), not
      process 0: a synchronous run's process 0 may then die like any other,
      and its successor writes the run.
    min_workers: a synchronous run (no ``alone`` processes) that loses
      processes goes on with the survivors as a smaller run while at least
      this many are left, and grows back when the replacements arrive
      (``rejoin_delay`` seconds after the loss); None: every failure restarts
      the run at full size.

  Example (what ``jaxsync launch -n 4 --max-restarts 2`` builds for an
  asynchronous run: processes 1-3 are workers):

    >>> from jaxsync.dist import RestartPolicy
    >>> policy = RestartPolicy(max_restarts=2, run_dir="runs/asp", alone=frozenset({1, 2, 3}), settle=15.0)
    >>> 2 in policy.alone, policy.max_restarts
    (True, 2)
  """

  max_restarts: int = 0
  run_dir: pathlib.Path | None = None
  alone: frozenset[int] = frozenset()
  kept_down: frozenset[int] = frozenset()
  settle: float = 90.0
  rejoin_delay: float = 0.0
  min_workers: int | None = None
  host_service: bool = False

  def __post_init__(self):
    if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
      raise ValueError(f"launch: {self.max_restarts=} is invalid; expected an integer >= 0.")
    if not isinstance(self.settle, (int, float)) or not self.settle >= 0:
      raise ValueError(f"launch: {self.settle=} is invalid; expected seconds >= 0.")
    if not isinstance(self.rejoin_delay, (int, float)) or not 0 <= self.rejoin_delay < float("inf"):
      raise ValueError(f"launch: {self.rejoin_delay=} is invalid; expected seconds >= 0.")
    if self.max_restarts and self.run_dir is None:
      raise ValueError("launch: max_restarts needs run_dir (the run `jaxsync resume` continues).")
    if self.min_workers is not None:
      if not isinstance(self.min_workers, int) or self.min_workers < 1:
        raise ValueError(f"launch: {self.min_workers=} is invalid; expected an integer >= 1, or None.")
      if not self.max_restarts or self.alone:
        raise ValueError(
          f"launch: {self.min_workers=} is invalid here; expected it with max_restarts >= 1 and a synchronous"
          " run (no processes restarted alone)."
        )


def latest_checkpoint(run_dir: pathlib.Path | None) -> int | None:
  """The newest complete checkpoint step in ``run_dir/checkpoints`` (orbax names each by its step)."""
  if run_dir is None:
    return None
  steps = [int(d.name) for d in pathlib.Path(run_dir, "checkpoints").glob("*") if d.name.isdigit()]
  return max(steps, default=None)


def describe_exit(code: int) -> str:
  return f"signal {-code}" if code < 0 else f"exit code {code}"


class _Supervisor:
  """The processes of one launch, started, watched, restarted, stopped."""

  def __init__(self, num_processes, args, bind, out, env, policy: RestartPolicy):
    self.n, self.args, self.bind, self.out, self.env, self.policy = (
      num_processes,
      args,
      bind,
      out,
      env,
      policy,
    )
    self.processes: list[subprocess.Popen] = []
    self.commands: list[tuple[list[str], dict[str, str]]] = []
    self.streams: list[threading.Thread] = []
    self.restarts = 0
    self.reported: set[int] = set()  # ids of Popen objects whose end was reported
    self.pending: dict[int, float] = {}  # process -> when its delayed restart starts
    self.full = num_processes  # a synchronous run's size (it runs with self.n while shrunk)
    self.arriving: list[float] = []  # when each lost worker's replacement arrives (--min-workers)
    self.growing: float | None = None  # when it was told to stop at its next chunk, to grow
    self.notices: list[int] = []  # SIGTERM / SIGINT received
    self.service: subprocess.Popen | None = None  # the coordination service (host_service)

  def say(self, line: str) -> None:
    self.out.write(f"jaxsync launch: {line}\n")
    self.out.flush()

  def start_all(self, args: list[str]) -> None:
    coordinator = f"{self.bind}:{free_port(self.bind)}"
    self.say(f"{self.n} processes, coordinator {coordinator}")
    self.processes, self.commands = [], []
    self.started = time.time()
    if self.policy.host_service:
      self.start_service(coordinator)
    for i in range(self.n):
      process_env = {
        **os.environ,
        **(self.env or {}),
        cluster.ENV_COORDINATOR: coordinator,
        cluster.ENV_NUM_PROCESSES: str(self.n),
        cluster.ENV_PROCESS_ID: str(i),
        cluster.ENV_BIND: self.bind,
        "PYTHONUNBUFFERED": "1",
        **({coordination_service.ENV: "launcher"} if self.policy.host_service else {}),
      }
      if self.policy.max_restarts and self.policy.alone:  # the server waits for a restarted worker
        process_env.setdefault(cluster.ENV_REJOIN_WAIT, str(REJOIN_WAIT))
      self.commands.append(([sys.executable, "-m", "jaxsync.cli", *args], process_env))
      self.processes.append(self._start(i))

  def start_service(self, address: str) -> None:
    """Runs the coordination service of a start of the run at ``address`` (the one before it stops)."""
    self.stop_service()
    self.service = subprocess.Popen(
      [sys.executable, "-m", "jaxsync._src.distributed.coordination_service", address, str(self.n),
       str(cluster.heartbeat_timeout())],
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip  # its library notes (the recoverable tasks it serves) say nothing to the run's user
    ready = self.service.stdout.readline().strip()
    if ready != "ready":
      self.service.kill()
      raise RuntimeError(f"launch: the coordination service at {address} did not start: {ready!r}")

  def stop_service(self) -> None:
    if self.service is not None and self.service.poll() is None:
      self.service.terminate()
      try:
        self.service.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.service.kill()
        self.service.wait()
    self.service = None

  def _start(self, i: int) -> subprocess.Popen:
    command, env = self.commands[i]
    p = subprocess.Popen(
      command,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      start_new_session=True,  # a Ctrl-C reaches the launcher, which passes it on once
    )
    t = threading.Thread(target=_stream, args=(p, f"[p{i}] ", self.out), daemon=True)
    t.start()
    self.streams.append(t)
    return p

  def signal_all(self, signum: int) -> None:
    for p in self.processes:
      if p.poll() is None:
        with _no_such_process():
          p.send_signal(signum)

  def kill_all(self, *, after: float = 0.0) -> None:
    """Waits ``after`` seconds for every process to end by itself, then SIGKILLs the rest."""
    deadline = time.monotonic() + after
    for p in self.processes:
      try:
        p.wait(timeout=max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        with _no_such_process():
          p.kill()
        p.wait()

  def failed(self, i: int) -> int | None:
    """Process ``i``'s exit code if it ended in a failure that a restart may fix, else None."""
    code = self.processes[i].poll()
    if code is None or code in _NOT_FAILURES or i in self.policy.kept_down or i in self.pending:
      return None
    if code == EXIT_PREEMPTED and i not in self.policy.alone:  # the run stopped on its notice
      return None
    return code

  def can_restart(self) -> bool:
    """Restarts are left, and the run is not over (process 0 writes ``summary.json`` at its end: a process
    that fails after it, leaving, changes nothing)."""
    over = self.policy.run_dir is not None and pathlib.Path(self.policy.run_dir, "summary.json").exists()
    return self.restarts < self.policy.max_restarts and not over

  def record(self, i: int | None, code: int | None, scope: str, noticed: float) -> dict:
    """Writes a line of ``restarts.jsonl``: a restart (counted), or a grow (``i`` None: not a failure)."""
    self.restarts += i is not None
    entry = {
      "restart": self.restarts,
      "time": time.time(),
      "process": i,
      "ended": None if code is None else describe_exit(code),
      "scope": scope,
      "checkpoint": latest_checkpoint(self.policy.run_dir),
      "down_seconds": round(time.monotonic() - noticed, 3),
      **({"workers": self.n} if self.policy.min_workers else {}),
    }
    with open(pathlib.Path(self.policy.run_dir, RESTARTS_FILE), "a") as f:
      f.write(json.dumps(entry) + "\n")
    if i is None:
      return entry
    what = {
      "process": "it alone rejoins the run",
      "run": f"every process resumes from checkpoint {entry['checkpoint']}",
      "shrink": f"the {self.n} others go on as a run of {self.n} workers from checkpoint {entry['checkpoint']} "
      f"(--min-workers {self.policy.min_workers}); its replacement arrives in {self.policy.rejoin_delay:g} s",
    }[scope]
    self.say(
      f"process {i} ended with {describe_exit(code)}; restart {self.restarts} of "
      f"{self.policy.max_restarts}: {what}"
    )
    return entry

  def restart_alone(self, i: int, code: int) -> None:
    noticed = time.monotonic()
    self.record(i, code, "process", noticed)
    if self.policy.rejoin_delay:
      self.pending[i] = noticed + self.policy.rejoin_delay
      self.say(f"process {i} restarts in {self.policy.rejoin_delay:g} s (--rejoin-delay)")
    else:
      self.processes[i] = self._start(i)

  def start_due(self) -> None:
    """Starts the delayed restarts whose time has come (:attr:`RestartPolicy.rejoin_delay`)."""
    for i, at in list(self.pending.items()):
      if time.monotonic() >= at:
        del self.pending[i]
        self.processes[i] = self._start(i)

  def restart_all(self, i: int, code: int) -> None:
    """Lets process 0 save what it holds and leave, stops the rest, and resumes the run (with its
    survivors alone, under ``min_workers``)."""
    noticed = time.monotonic()
    self.say(f"process {i} ended with {describe_exit(code)}; stopping the others to restart the run")
    # A synchronous run's process 0 saves its completed rounds when it loses a peer, and its successor
    # (process 1) does when process 0 is the one lost: every process still running gets `settle` seconds
    # (together) to leave. A stopped one saves nothing and is not waited for.
    deadline = noticed + self.policy.settle
    if not self.wrote_since_start():  # still starting up: the processes may wait at a start-up barrier
      # for the lost one, and hold no more than the checkpoint (but the rounds of a first chunk, which a
      # survivor saves once the service names the lost process: a heartbeat timeout).
      deadline = noticed + min(self.policy.settle, 15.0 + cluster.heartbeat_timeout())
    for p in self.processes:
      if p.poll() is None and not _stopped(p):
        try:
          p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
          break
    # Lost: the process that failed, and any other a signal ended or stopped (the rest ended on the loss).
    lost = {i} | {j for j, p in enumerate(self.processes) if (p.poll() or 0) < 0 or _stopped(p)}
    self.signal_all(signal.SIGKILL)
    self.kill_all(after=10.0)
    self.pending.clear()  # a delayed restart of one process is part of the run's restart now
    survivors = [j for j in range(self.n) if j not in lost]
    minimum = self.policy.min_workers
    if minimum is not None and self.policy.rejoin_delay and len(survivors) >= minimum:
      self.arriving += [noticed + self.policy.rejoin_delay] * len(lost)
      self.resize(survivors, "shrink")
      self.record(i, code, "shrink", noticed)
    else:
      if minimum is not None and len(survivors) < minimum and self.policy.rejoin_delay:
        self.say(  # too few left: the run waits for its replacements, then runs whole
          f"{len(survivors)} processes left, fewer than --min-workers {minimum}: waiting "
          f"{self.policy.rejoin_delay:g} s for the replacements"
        )
        if not self.sleep(self.policy.rejoin_delay):
          return
      self.arriving.clear()
      if self.n != self.full:  # a shrunk run restarts whole: its lost workers' replacements join
        self.resize(survivors + [None] * (self.full - len(survivors)), "grow")
      self.record(i, code, "run", noticed)
    self.start_all(["resume", str(self.policy.run_dir), *_progress_args(self.args)])

  def resize(self, kept: list[int | None], why: str) -> None:
    """Records the run's next size in ``membership.jsonl`` (nothing when it does not change)."""
    if len(kept) == self.n and kept == list(range(self.n)):
      return
    segments = membership.read(self.policy.run_dir, self.full)
    segment = membership.Segment(latest_checkpoint(self.policy.run_dir) or 0, len(kept), tuple(kept))
    membership.append(self.policy.run_dir, membership.check(segments[-1], segment), why=why)
    self.n = len(kept)

  def sleep(self, seconds: float) -> bool:
    """Waits ``seconds`` unless a notice (SIGTERM, Ctrl-C) comes; returns False if one came."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not self.notices:
      time.sleep(0.1)
    return not self.notices

  def grow_when_due(self) -> None:
    """Tells a shrunk run to stop at its next chunk once a replacement has arrived (:meth:`grow`)."""
    due = [t for t in self.arriving if t <= time.monotonic()]
    if due and self.growing is None and self.n < self.full and self.progressed():
      self.growing = time.monotonic()
      self.say(
        f"{'a replacement' if len(due) == 1 else f'{len(due)} replacements'} arrived: every process stops at "
        f"its next chunk, with a checkpoint, and the run goes on with {min(self.full, self.n + len(due))} workers"
      )
      self.signal_all(signal.SIGTERM)

  def progressed(self) -> bool:
    """Whether process 0 is running and has written a metrics row since the run last started: every
    process is then past its start-up and stops at a notice with a checkpoint (a notice during start-up
    would end one before it can)."""
    return self.processes[0].poll() is None and self.wrote_since_start()

  def wrote_since_start(self) -> bool:
    """Whether a metrics row was written since the run last started (nothing is known without a run
    directory: True)."""
    if self.policy.run_dir is None:
      return True
    metrics = pathlib.Path(self.policy.run_dir, "metrics.jsonl")
    return (metrics.stat().st_mtime if metrics.exists() else 0.0) > self.started

  def grow(self) -> None:
    """Restarts a run that stopped for its replacements with them, from its checkpoint."""
    noticed, self.growing = self.growing, None
    self.kill_all(after=30.0)
    now = time.monotonic()
    joining = min(self.full - self.n, sum(t <= now for t in self.arriving))
    self.arriving = sorted(self.arriving)[joining:]
    self.resize([*range(self.n), *[None] * joining], "grow")
    entry = self.record(None, None, "grow", noticed)
    self.say(f"the run goes on with {self.n} workers from checkpoint {entry['checkpoint']}")
    self.start_all(["resume", str(self.policy.run_dir), *_progress_args(self.args)])

  def report_ends(self) -> None:
    stopped_to_grow = (0, None, EXIT_PREEMPTED) if self.growing is not None else (0, None)
    for i, p in enumerate(self.processes):
      if i and p.returncode not in stopped_to_grow and id(p) not in self.reported:
        self.reported.add(id(p))
        self.say(f"process {i} ended with {describe_exit(p.returncode)}")


def _stopped(process: subprocess.Popen) -> bool:
  """Whether ``process`` is stopped (SIGSTOP), from Linux's ``/proc``; False where that cannot be read."""
  try:
    stat = pathlib.Path(f"/proc/{process.pid}/stat").read_text()
  except OSError:
    return False
  return stat.rpartition(")")[2].split()[0] in ("T", "t")


def _progress_args(args: list[str]) -> list[str]:
  """The ``--progress MODE`` of the launched command line, for the restarted ``resume``."""
  for j, a in enumerate(args):
    if a == "--progress" and j + 1 < len(args):
      return ["--progress", args[j + 1]]
  return []


class _no_such_process:
  """Ignores signalling a process that has just ended."""

  def __enter__(self):
    return self

  def __exit__(self, kind, value, tb):
    return kind is ProcessLookupError


def launch(
  num_processes: int,
  args: list[str],
  *,
  bind: str = "127.0.0.1",
  grace: float = 30.0,
  out=None,
  env: dict[str, str] | None = None,
  restarts: RestartPolicy | None = None,
) -> int:
  """Runs ``jaxsync ARGS`` in ``num_processes`` local processes of one run; returns process 0's exit code.

  Args:
    num_processes: processes to start (``>= 1``).
    args: the ``jaxsync`` command line each runs, e.g. ``["train", "configs/x.yaml"]``.
    bind: the interface of the coordinator and of every socket of the run.
    grace: seconds the other processes get after process 0 exits.
    out: where the prefixed logs go (default ``sys.stdout``).
    env: extra environment variables for every process.
    restarts: what to restart when a process fails (default: nothing).

  Returns:
    Process 0's exit code (75 when the run stopped on a preemption notice).
  """
  if not isinstance(num_processes, int) or num_processes < 1:
    raise ValueError(f"launch: num_processes={num_processes!r} is invalid; expected an integer >= 1.")
  policy = restarts or RestartPolicy()
  if policy.min_workers is not None and policy.min_workers > num_processes:
    raise ValueError(
      f"launch: min_workers={policy.min_workers} is invalid for {num_processes} processes; expected at most "
      f"{num_processes}."
    )
  run = _Supervisor(num_processes, args, bind, out or sys.stdout, env, policy)
  notices = run.notices
  resumed = args[:1] == ["resume"]
  if (
    resumed
    and policy.run_dir is not None
    and (pathlib.Path(policy.run_dir) / membership.MEMBERSHIP_FILE).is_file()
  ):
    # A run that shrank, resumed whole (from a shell): its missing workers join.
    run.n = membership.read(policy.run_dir, num_processes)[-1].workers
    run.resize([*range(min(run.n, num_processes)), *[None] * max(0, num_processes - run.n)], "grow")

  def on_sigterm(signum, frame):  # a preemption notice: passed on; a second one kills
    notices.append(signum)
    if len(notices) > 1:
      run.signal_all(signal.SIGKILL)
    else:
      run.say("SIGTERM: every process stops at its next chunk, with a checkpoint")
      run.signal_all(signal.SIGTERM)

  previous = None
  if threading.current_thread() is threading.main_thread():
    previous = signal.signal(signal.SIGTERM, on_sigterm)
  run.start_all(args)
  try:
    while True:
      try:
        code = run.processes[0].wait(timeout=0.2)
      except subprocess.TimeoutExpired:
        code = None
      except KeyboardInterrupt:
        if notices:
          raise
        notices.append(signal.SIGINT)
        run.say(
          "interrupted: every process stops at its next chunk, with a checkpoint (Ctrl-C again to stop now)"
        )
        run.signal_all(signal.SIGINT)
        continue
      if not notices:
        run.start_due()
        run.grow_when_due()
      # Stopped for its replacements (exit 75; a process that had no handler yet ends by the signal).
      if code is not None and code != 0 and run.growing is not None and not notices:
        run.grow()
        continue
      if not notices and run.can_restart():
        failures = [(i, c) for i in range(run.n) if (c := run.failed(i)) is not None]
        # While the run goes on (after process 0's success, a worker's end changes nothing).
        if failures and (code is None or failures[0][0] == 0):
          i, c = min(failures, key=lambda f: (f[1] >= 0, f[0]))  # the one a signal ended, if any
          if all(j in policy.alone for j, _ in failures):
            run.restart_alone(i, c)
          else:
            run.restart_all(i, c)
          continue
      if code is not None:
        break
      run.report_ends()
    deadline = time.monotonic() + grace
    for i, p in enumerate(run.processes[1:], start=1):
      try:
        p.wait(timeout=max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        run.say(f"process {i} still running {grace:.0f} s after process 0 exited; terminating")
        p.terminate()
        try:
          p.wait(timeout=5)
        except subprocess.TimeoutExpired:
          p.kill()
          p.wait()
  except KeyboardInterrupt:  # the second Ctrl-C
    run.signal_all(signal.SIGKILL)
    run.kill_all()
    code = 130
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
  run.stop_service()
  for t in run.streams:
    t.join(timeout=5)
  run.report_ends()
  run.out.flush()
  return code
