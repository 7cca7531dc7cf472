"""``jaxsync launch -n N``: N local processes of one run, their logs streamed with a process prefix.

The launcher picks a free port on the bind interface (loopback by default),
hands every process the coordinator address, the process count and its id
through the environment (:mod:`cluster` reads them), and prefixes every line
a process prints with ``[pI]``. It returns process 0's exit code: process 0
is the run (the parameter server, or the primary of a synchronous run). A
worker that dies is reported; once process 0 has exited, the others get
``grace`` seconds to finish before they are terminated, so a launch never
hangs on a process that lost its coordinator.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from jaxsync._src.distributed import cluster


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


def launch(
  num_processes: int,
  args: list[str],
  *,
  bind: str = "127.0.0.1",
  grace: float = 30.0,
  out=None,
  env: dict[str, str] | None = None,
) -> int:
  """Runs ``jaxsync ARGS`` in ``num_processes`` local processes of one run; returns process 0's exit code.

  Args:
    num_processes: processes to start (``>= 1``).
    args: the ``jaxsync`` command line each runs, e.g. ``["train", "configs/x.yaml"]``.
    bind: the interface of the coordinator and of every socket of the run.
    grace: seconds the other processes get after process 0 exits.
    out: where the prefixed logs go (default ``sys.stdout``).
    env: extra environment variables for every process.
  """
  if not isinstance(num_processes, int) or num_processes < 1:
    raise ValueError(f"launch: num_processes={num_processes!r} is invalid; expected an integer >= 1.")
  out = out or sys.stdout
  coordinator = f"{bind}:{free_port(bind)}"
  out.write(f"jaxsync launch: {num_processes} processes, coordinator {coordinator}\n")
  processes, streams = [], []
  for i in range(num_processes):
    process_env = {
      **os.environ,
      **(env or {}),
      cluster.ENV_COORDINATOR: coordinator,
      cluster.ENV_NUM_PROCESSES: str(num_processes),
      cluster.ENV_PROCESS_ID: str(i),
      cluster.ENV_BIND: bind,
      "PYTHONUNBUFFERED": "1",
    }
    p = subprocess.Popen(
      [sys.executable, "-m", "jaxsync.cli", *args],
      env=process_env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      start_new_session=True,  # a Ctrl-C reaches the launcher, which forwards it once
    )
    processes.append(p)
    t = threading.Thread(target=_stream, args=(p, f"[p{i}] ", out), daemon=True)
    t.start()
    streams.append(t)
  try:
    code = processes[0].wait()
    deadline = time.monotonic() + grace
    for i, p in enumerate(processes[1:], start=1):
      try:
        p.wait(timeout=max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        out.write(
          f"jaxsync launch: process {i} still running {grace:.0f} s after process 0 exited; terminating\n"
        )
        p.terminate()
        try:
          p.wait(timeout=5)
        except subprocess.TimeoutExpired:
          p.kill()
          p.wait()
  except KeyboardInterrupt:
    for p in processes:
      if p.poll() is None:
        p.send_signal(signal.SIGINT)
    for p in processes:
      try:
        p.wait(timeout=10)
      except subprocess.TimeoutExpired:
        p.kill()
    code = 130
  for t in streams:
    t.join(timeout=5)
  for i, p in enumerate(processes):
    if p.returncode not in (0, None) and i:
      how = f"signal {-p.returncode}" if p.returncode < 0 else f"exit code {p.returncode}"
      out.write(f"jaxsync launch: process {i} ended with {how}\n")
  out.flush()
  return code
