"""Real runs of the ``jaxsync`` command line: launched, signalled, and read from their run directories."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

from benchmarks.common import harness
from benchmarks.faults.settings import HEARTBEAT_TIMEOUT


class Launched:
  """A ``jaxsync`` command in its own process; its output collected, line by line, with times."""

  def __init__(self, args: list[str], env: dict[str, str] | None = None, cwd: pathlib.Path = harness.REPO):
    self.started = time.monotonic()
    self.lines: list[tuple[float, str]] = []
    self.process = subprocess.Popen(
      args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd
    )
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  @classmethod
  def jaxsync(cls, *args: str) -> Launched:
    env = {
      **os.environ,
      "PYTHONUNBUFFERED": "1",
      "JAX_PLATFORMS": "cpu",
      "JAXSYNC_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
    }
    return cls([sys.executable, "-m", "jaxsync.cli", *args, "--progress", "quiet"], env)

  def _read(self) -> None:
    for line in self.process.stdout:
      self.lines.append((time.time(), line))

  @property
  def log(self) -> str:
    return "".join(line for _, line in self.lines)

  def wait_for(self, pattern: str, timeout: float, count: int = 1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if len(re.findall(pattern, self.log)) >= count:
        return True
      if self.process.poll() is not None:
        time.sleep(0.2)
        return len(re.findall(pattern, self.log)) >= count
      time.sleep(0.05)
    return False

  def wait(self, timeout: float) -> int | None:
    """The exit code, or None after ``timeout`` seconds (every process it started is then killed)."""
    try:
      code = self.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.kill_tree()
      return None
    self._reader.join(timeout=10)
    return code

  def processes(self) -> dict[int, Any]:
    """The launched processes by their ``JAXSYNC_PROCESS_ID``."""
    import psutil

    found = {}
    try:
      children = psutil.Process(self.process.pid).children()
    except psutil.Error:
      return found
    for child in children:
      try:
        found[int(child.environ()["JAXSYNC_PROCESS_ID"])] = child
      except (psutil.Error, KeyError, ValueError):
        continue
    return found

  def kill_tree(self) -> None:
    import psutil

    try:
      children = psutil.Process(self.process.pid).children(recursive=True)
    except psutil.Error:
      children = []
    for child in children:
      with contextlib.suppress(psutil.Error):
        child.kill()
    with contextlib.suppress(OSError):
      self.process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
      self.process.wait(timeout=10)


def run_overrides(strategy: str, gradients: int, **run) -> list[str]:
  """A small run of the quickstart config: digits MLP, three workers."""
  options = {"asp": "{learning_rate: 0.05}", "ssp": "{learning_rate: 0.05, staleness_bound: 3}"}[strategy]
  sets = {
    "model.name": "mlp",
    "strategy.name": strategy,
    "strategy.options": options,
    "cluster.num_workers": 3,
    "run.gradients": gradients,
    "run.chunk": 100,
    "run.eval_every": 500,
    "run.target_accuracy": 0.9,
    "run.checkpoint_every": 1000,
    **{f"run.{k}": v for k, v in run.items()},
  }
  return [f"--set={k}={v}" for k, v in sets.items()]


def launch(out: pathlib.Path, overrides: list[str]) -> Launched:
  if out.exists():
    shutil.rmtree(out)
  return Launched.jaxsync("launch", "-n", "4", "configs/quickstart.yaml", *overrides, "--out", str(out))


def metrics_rows(run_dir: pathlib.Path, kind: str = "train") -> list[dict[str, Any]]:
  path = run_dir / "metrics.jsonl"
  if not path.exists():
    return []
  rows = []
  for line in path.read_text().splitlines():
    with contextlib.suppress(json.JSONDecodeError):
      row = json.loads(line)
      if row.get("kind") == kind:
        rows.append(row)
  return rows


def wait_for_event(run: Launched, run_dir: pathlib.Path, event: int, timeout: float) -> bool:
  """Waits until the run's metrics have a train row at ``event`` or later."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and run.process.poll() is None:
    rows = metrics_rows(run_dir)
    if rows and rows[-1]["event"] >= event:
      return True
    time.sleep(0.05)
  return False


def final_records(run_dir: pathlib.Path) -> dict[str, np.ndarray] | None:
  """The per-event records (worker, staleness, version, released, rejected, time) of the last checkpoint."""
  import orbax.checkpoint as ocp

  root = run_dir / "checkpoints"
  steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []
  if not steps:
    return None
  restored = ocp.StandardCheckpointer().restore(root / str(steps[-1]) / "records")
  return {k: np.asarray(v) for k, v in restored.items() if not isinstance(v, dict)}


def _summary(run_dir: pathlib.Path) -> dict[str, Any] | None:
  path = run_dir / "summary.json"
  return json.loads(path.read_text()) if path.exists() else None


def _rejections(log: str) -> collections.Counter[str]:
  return collections.Counter(re.findall(r"rejected a message from [^:]+: (\w+) \(", log))


def _server_crashed(log: str) -> bool:
  """Process 0 printed a Python traceback or a JAX fatal error."""
  return bool(re.search(r"^\[p0\] (Traceback|F\d{4} )", log, re.M))


def _signal(process, signum: int) -> None:
  """Sends ``signum`` unless the process is gone."""
  import psutil

  with contextlib.suppress(psutil.Error):
    process.send_signal(signum)


def latest_checkpoint(run_dir: pathlib.Path) -> int | None:
  steps = [int(p.name) for p in (run_dir / "checkpoints").glob("*") if p.name.isdigit()]
  return max(steps, default=None)


def last_event(run_dir: pathlib.Path) -> int | None:
  rows = metrics_rows(run_dir)
  return rows[-1]["event"] if rows else None


def read_restarts(run_dir: pathlib.Path) -> list[dict[str, Any]]:
  path = run_dir / "restarts.jsonl"
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def params_digest(run_dir: pathlib.Path) -> str | None:
  """sha256 of the final checkpoint's parameters (every leaf's bytes, in tree order)."""
  import hashlib

  import jax
  import orbax.checkpoint as ocp

  step = latest_checkpoint(run_dir)
  if step is None:
    return None
  try:
    state = ocp.StandardCheckpointer().restore(run_dir / "checkpoints" / str(step) / "state")
  except Exception as err:  # noqa: BLE001 - reported, not raised
    return f"unreadable: {type(err).__name__}"
  params = state["params"] if isinstance(state, dict) and "params" in state else state
  digest = hashlib.sha256()
  for leaf in jax.tree.leaves(params):
    digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  return digest.hexdigest()[:16]
