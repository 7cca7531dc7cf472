"""The store of ``benchmarks/calibration/sim_vs_real.py``: its rows (calibrations, real runs, comparisons) and
the cells they belong to, read and written in one place for the benchmark and its account of the errors."""

from __future__ import annotations

import json
import pathlib
from typing import NamedTuple

import numpy as np

from jaxsync._src.calibration import agreement

REAL_RUNS = {"tiny": 1, "default": 3}  # real runs per cell, run i with --set seed=i
SIM_SEEDS = {"tiny": 2, "default": 5}  # simulated runs per cell (seeds 0, 1, ...)

VARIANTS = {"slow worker 4x": ["cluster.slowdown=4"]}  # a cell's changes to the config (the config's is 3x)


# What this code's store rows carry; rows without it (older code's) are ignored. 3: cards with a burst of
# CARD_BURST (2: netns's 10 ms, kept in benchmarks/results/archive/sim_vs_real_runs_2026-11-27.jsonl).
PROTOCOL = 3


# The calibration the simulated side uses, and the pairs compared under it: 3, as 2 and the server's card
# shared by 3 senders at once (cluster.server_link: at 100 Mbit/s three flows into one card moved 0.77x what
# one stream did, calibrated 2026-11-28); 2, the compute probe's process standing for the run's slow worker sleeps between its steps as that worker does (the cores shared as in
# the runs); 1 (stored before 2 existed), every probe process computing without a pause. The real runs do not
# depend on it (a slow worker's factor is the config's), so a new calibration reuses them.
CALIBRATION = 3


class Cell(NamedTuple):
  """What one row of a table measures: a strategy of ``compare.options``, in the config or a variant of it."""

  strategy: str
  variant: str | None = None  # a key of VARIANTS

  @property
  def name(self) -> str:
    return self.strategy if self.variant is None else f"{self.strategy} ({self.variant})"

  @property
  def overrides(self) -> list[str]:
    return [] if self.variant is None else VARIANTS[self.variant]


def _summary(m: agreement.RunMeasures) -> dict:
  counts = np.bincount(m.staleness) if m.staleness.size else np.zeros(0, int)
  return {
    "start": round(m.start, 4),
    "gradients_per_second": m.gradients_per_second,
    "updates_per_second": m.updates_per_second,
    "duration": round(m.duration, 4),
    "staleness_counts": counts.tolist(),
    "eval_time": [round(float(t), 4) for t in m.eval_time],
    "accuracy": [round(float(a), 5) for a in m.accuracy],
  }


class Store:
  """``sim_vs_real_runs.jsonl``: a line per calibration (``kind: calibration``), per real run (``kind: real``)
  and per comparison of a cell's real runs with its simulated runs (``kind: pair``). Only rows of
  ``PROTOCOL`` count; older ones stay in the file, unread."""

  def __init__(self, path: pathlib.Path):
    self.path = path
    self.rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    for row in self.rows:
      if row["kind"] in ("calibration", "pair"):
        row.setdefault("calibration", 1)

  def all(self, kind: str, **keys) -> list[dict]:
    return [
      row
      for row in self.rows
      if row.get("protocol") == PROTOCOL
      and row["kind"] == kind
      and all(row.get(k) == v for k, v in keys.items())
    ]

  def find(self, kind: str, **keys) -> dict | None:
    found = self.all(kind, **keys)
    return found[0] if found else None

  def add(self, row: dict) -> None:
    row = {"kind": row["kind"], "protocol": PROTOCOL, **row}
    self.rows.append(row)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    with self.path.open("a") as f:
      f.write(json.dumps(row) + "\n")


def _real_rows(store: Store, rate: float, cell: Cell, size: str) -> dict[int, dict]:
  """A cell's stored real runs by repeat (the first of each)."""
  found: dict[int, dict] = {}
  for row in store.all("real", rate_mbit=rate, cell=cell.name, size=size):
    found.setdefault(row["repeat"], row)
  return found


def _measures(summary: dict) -> agreement.RunMeasures:
  """A stored run's measures back (``_summary``'s inverse)."""
  counts = np.asarray(summary["staleness_counts"], np.int64)
  return agreement.RunMeasures(
    start=summary["start"],
    gradients_per_second=summary["gradients_per_second"],
    updates_per_second=summary["updates_per_second"],
    staleness=np.repeat(np.arange(counts.size), counts),
    eval_time=np.asarray(summary["eval_time"]),
    accuracy=np.asarray(summary["accuracy"]),
    duration=summary["duration"],
  )


def _pct(x: float | None) -> str:
  return "-" if x is None else f"{100 * x:+.0f}%"


def _num(x: float | None, digits: int = 2) -> str:
  return "-" if x is None else f"{x:.{digits}f}"


# Each card's burst, in seconds at its rate (netns.Hosts): 1 ms, 125 KB at 1 Gbit/s and 32 KB (the least) at
# 100 Mbit/s, where 10 ms let a whole 605 KB message through at once after a worker's compute at 1 Gbit/s.
CARD_BURST = 0.001
