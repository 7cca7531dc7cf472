"""A paper benchmark's results store: one JSON line per finished run, committed beside its results file.

The store ``<results-dir>/<benchmark>_runs.jsonl`` is what a benchmark's tables, plots and verdicts
are made from. A run is keyed by a hash of its whole config (model, data, cluster, strategy and its
options, seed, budget), so:

- a rerun skips every run the store holds (an interrupted sitting loses at most the run in progress);
- sittings on different machines add up: their lines are appended to the same file (merge by
  concatenating, as git does for two branches that each appended);
- ``--report-only`` rebuilds every table from the store alone, and names the runs it lacks.

A store grows in parts of about :data:`PART_BYTES` each (``<benchmark>_runs.jsonl``, then
``<benchmark>_runs.2.jsonl``, ``.3``...; a part closes with the run that takes it past that size), read as one
file in that order: every committed file stays small whatever the number of runs.

A line holds the run's summary, its evaluations (time, event, updates and every metric), per-worker
totals, the benchmark's own measures of the full history (``measures``: numbers a report needs from
every event, computed when the run ends), and optionally a thinned copy of the per-event records
(``event_rows``, for plots of k or step sizes over time). Floats keep 6 significant digits: a report
made right after a run reads the stored copy, never the in-memory one, so ``--report-only`` writes the
same numbers.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import pathlib
import sys
from typing import Any

import numpy as np

from jaxsync._src.app import config as config_lib
from jaxsync._src.app.config import Config
from jaxsync._src.interface.history import History
from jaxsync._src.train import training
from jaxsync._src.train.summary import target_crossings

_EVENT_FIELDS = ("time", "worker", "staleness", "version", "released", "k", "loss", "rejected", "step_size")


# Config keys added after the committed stores were written, with the value every run had before the key
# existed (its default): a config at that value hashes as it did then, so the stores' runs are still found;
# any other value makes a new run. A key added to the config must be added here with its default.
ADDED_KEYS: dict[tuple[str, str], Any] = {
  ("cluster", "collective_overhead"): 0.0,
  ("cluster", "absences"): [],
  ("cluster", "shrink_keeps"): "global_batch",
  ("cluster", "server_link"): None,
  ("data", "validation"): 0.0,
  ("data", "evaluate_on"): "test",
}


# The cluster keys that only time a run whose updates cannot follow the clock (Simulator.clock_dependence):
# runs that differ in nothing else are one training, re-timed per link (trajectory_key).
CLOCK_KEYS = ("link", "server_link", "collective_overhead", "server_bandwidth", "apply_time", "eval_time")
# The cluster keys of the workers' speeds: they only time a run whose rounds keep every worker's gradient
# (Simulator.clock_dependence(compute_times=True)): trajectory_key(config, any_speed=True) leaves them out too.
SPEED_KEYS = ("compute_time", "device_flops", "jitter_shape", "slow_fraction", "slowdown")


def trajectory_key(config: Config, *, any_speed: bool = False) -> str:
  """The key of ``config``'s sequence of updates when it cannot depend on the clock: its config less the
  cluster's :data:`CLOCK_KEYS` (and with ``any_speed``, less its :data:`SPEED_KEYS`: the same updates
  whatever the workers' speeds)."""
  data = config_lib.to_dict(config)
  for key in CLOCK_KEYS + (SPEED_KEYS if any_speed else ()):
    data["cluster"].pop(key, None)
  return hashlib.sha256(json.dumps(data, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def config_key(config: Config, tag: str = "") -> str:
  """A 16-hex-digit hash of every field of ``config`` (and ``tag``: what else decides the run, when the
  benchmark runs it outside ``training.train``): equal configs, and only they, share a key. A key of
  :data:`ADDED_KEYS` at its default is left out, as it was before it existed."""
  data = config_lib.to_dict(config)
  for (section, key), default in ADDED_KEYS.items():
    fields = data.get(section, {})
    if key in fields and json.dumps(fields[key], default=repr) == json.dumps(default):
      del fields[key]
  text = json.dumps(data, sort_keys=True, default=repr) + tag
  return hashlib.sha256(text.encode()).hexdigest()[:16]


# A part of a store is closed once it holds this many bytes; the next run starts the next part.
PART_BYTES = 1_000_000


def part_path(path: pathlib.Path, number: int) -> pathlib.Path:
  """The file of part ``number`` (from 1) of the store ``path``: ``path`` itself, then ``<stem>.<number><suffix>``."""
  return path if number == 1 else path.with_name(f"{path.stem}.{number}{path.suffix}")


def store_parts(path: pathlib.Path) -> list[pathlib.Path]:
  """The files of the store ``path`` that exist, in order: its first part, then each next part while there is one."""
  parts, number = [], 1
  while (part := part_path(path, number)).is_file():
    parts.append(part)
    number += 1
  return parts


class RunStore:
  """The runs of one benchmark, read from and appended to ``path`` (JSON lines; the last line of a key wins)."""

  def __init__(self, path: pathlib.Path):
    self.path = path
    self.entries: dict[str, dict[str, Any]] = read_entries(path)

  def __len__(self) -> int:
    return len(self.entries)

  def find(self, config: Config, tag: str = "") -> training.RunResult | None:
    """The stored run of exactly ``config``, rebuilt as a :class:`RunResult` (no parameters), or None."""
    entry = self.entries.get(config_key(config, tag))
    return None if entry is None else as_result(entry)

  def measures(self, config: Config, tag: str = "") -> dict[str, Any]:
    """The benchmark's own measures stored with ``config``'s run ({} without)."""
    return dict(self.entries.get(config_key(config, tag), {}).get("measures") or {})

  def add(
    self,
    config: Config,
    result: training.RunResult,
    *,
    setting: str,
    label: str,
    code: str,
    measures: dict[str, Any] | None = None,
    event_rows: int = 1,
    tag: str = "",
  ) -> training.RunResult:
    """Appends ``result`` (flushed to disk before returning) and returns it as the store will give it back."""
    entry = make_entry(config, result, setting=setting, label=label, code=code, measures=measures)
    entry["key"] = config_key(config, tag)
    if not tag:  # a run of training.train: a later run of the same updates on another clock may re-time it
      entry["trajectory"] = trajectory_key(config)
      entry["trajectory_any_speed"] = trajectory_key(config, any_speed=True)
    entry["events"] = thin_events(result.history, event_rows)
    append_entry(self.path, entry)
    self.entries[entry["key"]] = entry
    return as_result(entry)

  def trained_trajectory(self, config: Config, *, any_speed: bool = False) -> dict[str, Any] | None:
    """A stored run trained (not re-timed) with ``config``'s sequence of updates on another clock (with
    ``any_speed``: or at other speeds of the workers), or None."""
    field = "trajectory_any_speed" if any_speed else "trajectory"
    want = trajectory_key(config, any_speed=any_speed)
    for entry in self.entries.values():
      if entry.get(field) == want and not entry.get("retimed_from"):
        return entry
    return None

  def add_retimed(
    self, config: Config, source: dict[str, Any], history: History, *, setting: str, label: str, code: str
  ) -> training.RunResult:
    """Stores ``source``'s run re-timed on ``config``'s clock (``history``: its full times, evaluation times and
    idle seconds; ``Simulator.retime``): the source's updates and metrics, this clock's times and the
    crossings of its target on them; ``retimed_from`` names the run trained."""
    entry = json.loads(json.dumps(source))
    summary = entry["summary"]
    summary[history.time_key] = float(history.elapsed)
    summary["wall_seconds"] = 0.0
    if summary.get("target"):
      final = {name: summary.get(f"final_{name}") for name in history.eval_metrics}
      summary.update(
        target_crossings(history, final, (summary["target"]["metric"], summary["target"]["value"]))
      )
    index = entry["events"]["index"]
    entry.update(
      key=config_key(config),
      trajectory=trajectory_key(config),
      trajectory_any_speed=trajectory_key(config, any_speed=True),
      retimed_from=source["key"],
      setting=setting,
      label=label,
      code=code,
      date=f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}",
      summary=_jsonable(summary),
    )
    entry["evals"]["time"] = _round(history.eval_time)
    entry["workers"]["idle"] = _round(history.worker_idle)
    entry["events"]["time"] = _round(np.asarray(history.time)[index])
    append_entry(self.path, entry)
    self.entries[entry["key"]] = entry
    return as_result(entry)

  def keep_only(self, keys: set[str]) -> int:
    """Rewrites the store with the runs of ``keys`` and the runs they were re-timed from (a later run on a
    third clock re-times from those), in their stored order; returns how many runs it dropped. The new
    file replaces the old one in one rename: a sitting killed meanwhile leaves one or the other whole."""
    keep = set(keys) | {self.entries[k].get("retimed_from") for k in keys if k in self.entries}
    kept = {k: e for k, e in self.entries.items() if k in keep}
    old_parts = store_parts(self.path)
    texts: list[str] = [""]
    for entry in kept.values():
      line = json.dumps(entry, separators=(",", ":")) + "\n"
      if texts[-1] and len(texts[-1]) + len(line) > PART_BYTES:
        texts.append("")
      texts[-1] += line
    # Part by part in order: a run only moves to the same or an earlier part, so a sitting killed between two
    # renames leaves every kept run in some part (and at worst some dropped ones still there).
    for number, text in enumerate(texts, 1):
      part = part_path(self.path, number)
      partial = part.with_name(part.name + ".partial")
      partial.write_text(text)
      os.replace(partial, part)
    for part in old_parts[len(texts) :]:
      part.unlink()
    dropped, self.entries = len(self.entries) - len(kept), kept
    return dropped

  def code_versions(self, keys: set[str] | None = None) -> list[str]:
    """The code versions the (given) runs were measured with, oldest first as stored."""
    seen: dict[str, None] = {}
    for key, entry in self.entries.items():
      if keys is None or key in keys:
        seen.setdefault(entry.get("code", "?"))
    return list(seen)


def read_entries(path: pathlib.Path) -> dict[str, dict[str, Any]]:
  """The entries of the store ``path`` (JSON lines, in its parts' order) by their ``"key"`` (the last line of a
  key wins; {} when there is no file). A line cut short by a killed sitting is ignored with a message: only
  that run is lost, and rerun."""
  entries: dict[str, dict[str, Any]] = {}
  for part in store_parts(path):
    for number, line in enumerate(part.read_text().splitlines(), 1):
      if not line.strip():
        continue
      try:
        entry = json.loads(line)
        entries[entry["key"]] = entry
      except (json.JSONDecodeError, KeyError, TypeError):
        print(f"[store] {part}:{number}: not a whole run entry; ignored (it will be rerun)", file=sys.stderr)
  return entries


def append_entry(path: pathlib.Path, entry: dict[str, Any]) -> None:
  """Appends ``entry`` to the store ``path`` as one JSON line, on disk before returning: to its last part, or
  to a new part when the last one holds :data:`PART_BYTES` already."""
  path.parent.mkdir(parents=True, exist_ok=True)
  parts = store_parts(path) or [path]
  if parts[-1].is_file() and parts[-1].stat().st_size >= PART_BYTES:
    parts.append(part_path(path, len(parts) + 1))
  with parts[-1].open("a+") as f:
    f.seek(0, os.SEEK_END)
    if f.tell():  # a line cut short by a killed sitting must not swallow this one
      f.seek(f.tell() - 1)
      if f.read(1) != "\n":
        f.write("\n")
    f.write(json.dumps(entry, separators=(",", ":")) + "\n")
    f.flush()
    os.fsync(f.fileno())


def make_entry(
  config: Config,
  result: training.RunResult,
  *,
  setting: str,
  label: str,
  code: str,
  measures: dict[str, Any] | None,
) -> dict[str, Any]:
  """A run as one JSON-ready mapping (without its events)."""
  h = result.history
  return {
    "key": config_key(config),
    "setting": setting,
    "label": label,
    "strategy": config.strategy.name,
    "options": _jsonable(config.strategy.options),
    "seed": config.seed,
    "code": code,
    "date": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M}",
    "summary": _jsonable(result.summary),
    "measures": _jsonable(measures or {}),
    "evals": {
      "time": _round(h.eval_time),
      "event": [int(x) for x in h.eval_event],
      "version": [int(x) for x in h.eval_version],
      "metrics": {name: _round(values) for name, values in h.eval_metrics.items()},
    },
    "workers": {
      "steps": [int(x) for x in h.worker_steps],
      "used": [int(x) for x in h.worker_used],
      "idle": _round(h.worker_idle),
    },
    "bytes_moved": _round(h.bytes_moved),
    "bytes_moved_intra": _round(h.bytes_moved_intra),
    "rejected_count": int(h.rejected_count),
    "clock": h.clock,
  }


def thin_events(history: History, rows: int) -> dict[str, Any]:
  """At most ``rows`` of the per-event records, evenly spaced, the last event always among them."""
  n = len(history.time)
  if n == 0:
    return {"index": [], **{f: [] for f in _EVENT_FIELDS}}
  index = np.unique(np.linspace(0, n - 1, max(1, min(rows, n))).round().astype(int))
  if index[-1] != n - 1:
    index = np.append(index[1:], n - 1)
  out: dict[str, Any] = {"index": index.tolist()}
  for field in _EVENT_FIELDS:
    values = np.asarray(getattr(history, field))[index]
    out[field] = values.tolist() if values.dtype.kind in "biu" else _round(values)
  return out


def as_result(entry: dict[str, Any]) -> training.RunResult:
  """A stored run as a :class:`RunResult`: its summary and a history of its evaluations, totals and
  thinned events (no parameters, no run directory)."""
  evals, workers, events = entry["evals"], entry["workers"], entry["events"]
  arrays = {
    f: np.asarray(events[f], bool if f in ("released", "rejected") else None)
    for f in _EVENT_FIELDS  # step_size may be a row of several numbers per event
  }
  history = History(
    **arrays,
    eval_time=np.asarray(evals["time"], float),
    eval_version=np.asarray(evals["version"], int),
    eval_event=np.asarray(evals["event"], int),
    eval_metrics={name: np.asarray(v, float) for name, v in evals["metrics"].items()},
    worker_steps=np.asarray(workers["steps"], int),
    worker_used=np.asarray(workers["used"], int),
    worker_idle=np.asarray(workers["idle"], float),
    bytes_moved=float(entry["bytes_moved"]),
    bytes_moved_intra=float(entry["bytes_moved_intra"]),
    rejected_count=int(entry["rejected_count"]),
    clock=entry["clock"],
  )
  summary = dict(entry["summary"])
  if summary.get("target"):
    # Runs stored before the crossings counted the final evaluation read as the ones stored after.
    final = {name: summary.get(f"final_{name}") for name in history.eval_metrics}
    summary.update(
      target_crossings(history, final, (summary["target"]["metric"], summary["target"]["value"]))
    )
  return training.RunResult(params=None, history=history, summary=summary, run_dir=None)


def _round(x):
  """Floats (or arrays of them) to 6 significant digits; NaN and infinities as JSON's NaN/Infinity."""
  a = np.asarray(x, float)
  if a.ndim == 0:
    v = float(a)
    return float(f"{v:.6g}") if np.isfinite(v) else v
  return [_round(v) for v in a]


def _jsonable(value):
  """Plain JSON types: NumPy scalars and arrays to numbers and lists, tuples to lists."""
  if isinstance(value, dict):
    return {str(k): _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  if isinstance(value, np.ndarray):
    return _jsonable(value.tolist())
  if isinstance(value, np.generic):
    return value.item()
  return value
