"""The campaign's plan: which runs, with which faults, and how to run each."""

from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Any

import numpy as np

from benchmarks.faults.fuzzing import fuzz
from benchmarks.faults.settings import GRADIENTS_SLURM
from benchmarks.faults.slurm_jobs import slurm_run
from benchmarks.faults.supervised import Layout, SupervisedRun, supervised_run
from benchmarks.faults.unsupervised import random_faults, rejoin_run, server_kill_run, worker_fault_run

OPTIONS = {
  "asp": "{learning_rate: 0.05}",
  "ssp": "{learning_rate: 0.05, staleness_bound: 3}",
  "inhad": "{local_workers: 2, learning_rate: 0.1}",
  "allreduce": "{learning_rate: 0.05}",
  "bsp": "{learning_rate: 0.05}",
  "diloco": "{period: 10, membership: elastic}",  # the churn part: rounds through the server
  "async_local_sgd": "{period: 10}",
}
LOCAL_STEPS = 10  # the churn part's H: its budget counts worker steps, its events rounds or pushes


def launch_args(
  processes: int,
  strategy: str,
  workers: int,
  gradients: int,
  *,
  servers: int = 1,
  chunk: int = 100,
  checkpoint_every: int = 1000,
) -> list[str]:
  """``jaxsync launch``'s arguments for a small run of the quickstart config (digits MLP)."""
  sets = {
    "model.name": "mlp",
    "strategy.name": strategy,
    "strategy.options": OPTIONS[strategy],
    "cluster.num_workers": workers,
    "run.gradients": gradients,
    "run.chunk": chunk,
    "run.eval_every": 500,
    "run.target_accuracy": 0.9,
    "run.checkpoint_every": checkpoint_every,
  }
  if servers > 1:
    sets["cluster.servers"] = servers
  return ["-n", str(processes), "configs/quickstart.yaml", *(f"--set={k}={v}" for k, v in sets.items())]


def _worker_faults(rng: np.random.Generator, count: int) -> list[tuple[str, str]]:
  """``count`` faults of parameter-server workers: SIGKILL, SIGSTOP/SIGCONT or SIGTERM (a preemption)."""
  kinds = rng.choice(["kill", "stop", "term"], size=count, p=[0.45, 0.35, 0.2])
  return [(str(k), "worker") for k in kinds]


def _insert(rng: np.random.Generator, plan: list, fault: tuple[str, str]) -> list:
  """``fault`` at a random place of ``plan``, never first (the run is under way, its workers up)."""
  at = int(rng.integers(1, len(plan) + 1)) if plan else 0
  return [*plan[:at], fault, *plan[at:]]


# Per part: the runs' shape. `faults`: faults per run; gradients sized so that a run outlasts them.
PARTS_SPEC = {
  "supervised": {"processes": 4, "workers": 3, "faults": 9, "delay": (1.0, 3.0)},
  "sharded": {"processes": 4, "workers": 2, "servers": 2, "faults": 6, "delay": (1.0, 3.0)},
  "inhad": {"processes": 5, "workers": 4, "delay": (2.0, 5.0)},
  "sync": {"processes": 3, "workers": 3, "delay": (2.0, 5.0)},
  "churn": {"processes": 4, "workers": 3, "faults": 6, "delay": (1.0, 3.0)},
}
PREEMPT = {  # name: (strategy, processes, workers, servers, deterministic)
  "asp, 1 worker": ("asp", 2, 1, 1, True),
  "asp, 2 shards, 1 worker": ("asp", 3, 1, 2, True),
  "allreduce, 3 processes": ("allreduce", 3, 3, 1, True),
  "asp, 3 workers": ("asp", 4, 3, 1, False),
}


@dataclasses.dataclass
class Planned:
  """One run of the campaign: its store key (part, index), the parameters it runs with, and how to run it."""

  part: str
  index: Any
  spec: dict[str, Any]
  run: Any  # (rng, runs_dir) -> result


def _supervised_planned(part: str, index: int, gradients: int, tiny: bool = False) -> Planned:
  shape = PARTS_SPEC[part]
  n, workers = shape["processes"], shape["workers"]
  if tiny:  # the test suite's: the lightest run that restarts every process
    n, workers = 2, 2
  if part == "supervised":
    strategy = ("asp", "ssp")[index % 2]
    layout = Layout("single", n)
  elif part == "sharded":
    strategy = "asp"
    layout = Layout("sharded", n, servers=shape["servers"])
  elif part == "inhad":
    strategy = "inhad"
    layout = Layout("inhad", n, nodes=2, local=2)
  elif part == "churn":
    strategy = ("diloco", "async_local_sgd")[index % 2]
    layout = Layout("single", n)
  else:
    strategy = ("allreduce", "bsp")[index % 2]
    layout = Layout("sync", n)
  # version 2 of the synchronous part: process 0's successor writes the checkpoint when process 0 is lost.
  spec = {
    "strategy": strategy,
    "processes": n,
    "gradients": gradients,
    "tiny": tiny,
    "version": 2 if part == "sync" else 1,
  }

  def plan(rng: np.random.Generator) -> list[tuple[str, str]]:
    if part == "supervised":
      faults = _insert(rng, _worker_faults(rng, shape["faults"]), ("kill", "server"))
      return _insert(rng, faults, ("term", "server")) if index % 2 else faults
    if part == "sharded":
      return _insert(rng, _worker_faults(rng, shape["faults"]), ("kill", "shard"))
    if part == "churn":  # workers leave and come back; the server stays
      return _worker_faults(rng, shape["faults"])
    if part == "inhad":
      faults = [("stop", "worker"), ("kill", "node worker"), ("kill", "aggregator"), ("kill", "server")]
      return [faults[i] for i in rng.permutation(len(faults))] + [("stop", "worker")]
    if tiny:
      return [("kill", "peer")]
    faults = [("kill", "peer"), ("kill", "primary"), ("stop", "process"), ("term", "process")]
    return _insert(rng, [faults[i] for i in rng.permutation(len(faults))], ("launcher_term", "launcher"))

  def run(rng: np.random.Generator, runs_dir: pathlib.Path) -> SupervisedRun:
    args = launch_args(
      n, strategy, workers, gradients, servers=layout.servers,
      chunk=50 if part == "sync" else 100, checkpoint_every=200 if part == "sync" else 1000,
    )  # fmt: skip
    # A churn run's events are DiLoCo's rounds of every worker's H steps, or one worker's pushes of H.
    per_event = {"diloco": workers * LOCAL_STEPS, "async_local_sgd": LOCAL_STEPS}.get(strategy)
    return supervised_run(
      part, runs_dir / f"{part}{index}_{strategy}", layout, strategy, args, gradients, plan(rng), rng,
      delay=shape["delay"], events=None if per_event is None else gradients // per_event,
    )  # fmt: skip

  return Planned(part, index, spec, run)


def _preempt_planned(name: str, reference: bool, gradients: int) -> list[Planned]:
  strategy, n, workers, servers, deterministic = PREEMPT[name]
  runtime = "sync" if strategy == "allreduce" else "sharded" if servers > 1 else "single"
  layout = Layout(runtime, n, servers=servers)
  chunk = 50 if runtime == "sync" else 100
  spec = {
    "strategy": strategy,
    "processes": n,
    "workers": workers,
    "servers": servers,
    "gradients": gradients,
  }
  slug = re.sub(r"[^a-z0-9]+", "_", name).strip("_")

  def make(ref: bool):
    def run(rng: np.random.Generator, runs_dir: pathlib.Path) -> SupervisedRun:
      args = launch_args(
        n, strategy, workers, gradients, servers=servers, chunk=chunk, checkpoint_every=10**6
      )
      plan = [] if ref else [("launcher_term", "launcher")]
      out = runs_dir / f"preempt_{slug}{'_reference' if ref else ''}"
      r = supervised_run("preempt", out, layout, strategy, args, gradients, plan, rng, delay=(1.0, 6.0))
      r.label = f"{name} (uninterrupted)" if ref else name
      return r

    return run

  planned = [Planned("preempt", name, {**spec, "preempted": True}, make(False))]
  if reference and deterministic:
    planned.append(Planned("preempt", f"{name} (uninterrupted)", {**spec, "preempted": False}, make(True)))
  return planned


def _slurm_planned(strategy: str, notices: int) -> list[Planned]:
  """A SLURM job of ``strategy``'s example sent ``notices`` preemption notices (and, for a synchronous one,
  the same job uninterrupted: its final parameters must be the same)."""
  gradients = GRADIENTS_SLURM[strategy]
  spec = {"strategy": strategy, "gradients": gradients, "version": 1}

  def make(count: int, label: str):
    def run(rng: np.random.Generator, runs_dir: pathlib.Path) -> SupervisedRun:
      slug = re.sub(r"[^a-z0-9]+", "_", label).strip("_")
      r = slurm_run(runs_dir / f"slurm_{slug}", strategy, gradients, count, rng)
      r.label = label
      return r

    return run

  planned = [Planned("slurm", strategy, {**spec, "notices": notices}, make(notices, strategy))]
  if strategy in ("allreduce", "diloco"):  # synchronous: resumed, the same parameters as uninterrupted
    label = f"{strategy} (uninterrupted)"
    planned.append(Planned("slurm", label, {**spec, "notices": 0}, make(0, label)))
  return planned


def plan_campaign(size: dict[str, Any], parts: tuple[str, ...], tiny: bool) -> list[Planned]:
  """Every run of the campaign, in order."""
  planned: list[Planned] = []
  g = size["gradients"]
  if "fuzz" in parts:
    frames = size["frames"]
    planned.append(
      Planned("fuzz", 0, {"frames": frames}, lambda rng, _d, f=frames: fuzz(f, int(rng.integers(2**31))))
    )
  if "workers" in parts:
    for i in range(size["runs"]):
      strategy = ("asp", "ssp")[i % 2]
      planned.append(
        Planned(
          "workers",
          i,
          {"strategy": strategy, "gradients": g},
          lambda rng, d, i=i, s=strategy: worker_fault_run(d / f"workers{i}_{s}", s, g, random_faults(rng)),
        )  # fmt: skip
      )
  if "rejoin" in parts:
    planned.append(
      Planned("rejoin", 0, {"gradients": 3 * g}, lambda rng, d: rejoin_run(d / "rejoin", 3 * g, rng))
    )
  if "server" in parts:
    for i in range(size["server_kills"]):
      planned.append(
        Planned("server", i, {"gradients": g}, lambda rng, d, i=i: server_kill_run(d / f"server{i}", g, rng))
      )
  for part in ("supervised", "sharded", "inhad", "sync", "churn"):
    if part in parts:
      for i in range(size[part]):
        planned.append(_supervised_planned(part, i, size["gradients_" + part], tiny))
  if "preempt" in parts:
    for name in size["preempt"]:
      planned += _preempt_planned(name, True, size["gradients_preempt"][PREEMPT[name][0] == "allreduce"])
  if "slurm" in parts:
    for strategy in size["slurm"]:
      planned += _slurm_planned(strategy, size["notices_slurm"])
  return planned
