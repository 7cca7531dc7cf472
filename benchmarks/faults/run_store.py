"""The store of the campaign's finished runs, one JSON line each: a campaign continues where it stopped."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import time
from typing import Any

import numpy as np

from benchmarks.common import harness
from benchmarks.faults.fuzzing import FuzzResult
from benchmarks.faults.supervised import Injected, SupervisedRun, _small
from benchmarks.faults.unsupervised import Fault, RejoinRun, ServerKill, WorkerRun

STORE_NAME = "fault_campaign_runs.jsonl"


class RunStore:
  """Finished runs' outcomes, one JSON line each, keyed by (part, run index, seed, size).

  A line is appended (and synced) as soon as a run ends, so an interrupted campaign loses at most the run
  in progress; a rerun skips the runs the store holds for the same key and the same ``spec`` (the run's
  parameters); ``--report-only`` writes the results from the store alone. A later line of the same key
  replaces an earlier one.
  """

  def __init__(self, path: pathlib.Path):
    self.path = path
    self.records: dict[str, dict[str, Any]] = {}
    if path.exists():
      for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
          record = json.loads(line)
          self.records[self.key(record["part"], record["index"], record["seed"], record["size"])] = record

  @staticmethod
  def key(part: str, index, seed: int, size: str) -> str:
    return json.dumps([part, index, seed, size])

  def get(self, part: str, index, seed: int, size: str, spec: dict[str, Any]) -> dict[str, Any] | None:
    record = self.records.get(self.key(part, index, seed, size))
    return record["outcome"] if record is not None and record.get("spec") == spec else None

  def put(
    self, part: str, index, seed: int, size: str, spec: dict[str, Any], outcome: dict[str, Any]
  ) -> None:
    record = {
      "part": part,
      "index": index,
      "seed": seed,
      "size": size,
      "spec": spec,
      "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
      "code": harness.code_version(),
      "outcome": outcome,
    }
    self.records[self.key(part, index, seed, size)] = record
    self.path.parent.mkdir(parents=True, exist_ok=True)
    with open(self.path, "a") as f:
      f.write(json.dumps(record, separators=(",", ":"), default=_json_default) + "\n")
      f.flush()
      os.fsync(f.fileno())


def _json_default(value):
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  raise TypeError(f"not JSON: {type(value).__name__}")


def encode(part: str, result) -> dict[str, Any]:
  """A part's result as the JSON the store keeps (the summary's used keys only; no logs)."""
  out = json.loads(json.dumps(dataclasses.asdict(result), default=_json_default))
  if part == "fuzz":
    out["client"].pop("legit_sum", None)
  if part == "rejoin":
    out.pop("log", None)
  if "summary" in out:
    out["summary"] = _small(out["summary"])
  return out


def decode(part: str, data: dict[str, Any]):
  """The result ``encode`` stored."""
  data = dict(data)
  if part == "fuzz":
    return FuzzResult(**data)
  if part == "workers":
    data["faults"] = [Fault(**f) for f in data["faults"]]
    return WorkerRun(**data)
  if part == "rejoin":
    return RejoinRun(**data)
  if part == "server":
    return ServerKill(**data)
  data["faults"] = [Injected(**f) for f in data["faults"]]
  return SupervisedRun(**data)
