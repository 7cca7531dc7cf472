"""Where the simulated clock's error comes from, in words, from the store of ``sim_vs_real``: the noise floor
of the comparison (what a clock without error would score with this many runs per cell), and the measured
accounts of the cells that miss (compute on shared cores, Streaming DiLoCo's round, the cards' burst)."""

from __future__ import annotations

import json
import statistics

import numpy as np

from benchmarks.calibration.sim_vs_real_store import (
  CALIBRATION,
  CARD_BURST,
  REAL_RUNS,
  SIM_SEEDS,
  Cell,
  Store,
  _measures,
  _num,
  _pct,
  _real_rows,
)
from jaxsync._src.calibration import agreement


def _compute_line(store: Store, rates: list[float], size: str) -> list[str]:
  """The report's line on compute on shared cores: one process alone against the calibration's probes."""
  alone = store.find("compute_alone", size=size)
  cals = {r: store.find("calibration", rate_mbit=r, size=size, calibration=CALIBRATION) for r in rates}
  probed = [
    f"{1e3 * c['config']['cluster']['compute_time']:.2f} ms at {r:g} Mbit/s" for r, c in cals.items() if c
  ]
  if alone is None or not probed:
    return []
  return [
    f"- Compute on shared cores: the config's step in one process alone, nothing else computing, took "
    f"{alone['mean_ms']:.2f} ms (mean of {alone['steps']}, coefficient of variation {alone['cv']:.2f}); the "
    f"calibration's 3 probes at once, which the clock charges, {', '.join(probed)}. A synchronous round's fast "
    "workers wait for the slow one without computing, so its steps run nearer the first (the real local SGD "
    "and DiLoCo rounds above are shorter than simulated); an asynchronous worker computes while the others' "
    "messages load the cores (the real fast workers' compute per step in the table, above the probes' at 100 "
    "Mbit/s). On machines of their own, as on a real cluster, workers would not share cores at all."
  ]


def _overlap_line(store: Store, rates: list[float], size: str) -> list[str]:
  """The report's line on Streaming DiLoCo's round: the overlap the real round does not have, and what its
  quantized exchange costs beyond a bare all-reduce (``sync_overhead_runs.jsonl``, beside this store)."""
  said = []
  for rate in rates:
    row = store.find("no_overlap", rate_mbit=rate, size=size, calibration=CALIBRATION)
    pair = (
      store.find("pair", rate_mbit=rate, cell=row["cell"], size=size, calibration=CALIBRATION)
      if row
      else None
    )
    if pair is None:
      continue
    updates = pair["comparison"]["updates_per_second"]
    said.append(
      f"{rate:g} Mbit/s: {1e3 / updates['real']:.0f} ms real, {1e3 / updates['simulated']:.0f} simulated, "
      f"{1e3 / statistics.median(row['updates_per_second']):.0f} simulated without the overlap"
    )
  if not said:
    return []
  added = []
  overhead = store.path.parent / "sync_overhead_runs.jsonl"
  if overhead.is_file():
    for line in overhead.read_text().splitlines():
      r = json.loads(line)
      if r.get("case") == "diloco_int8" and r.get("role") == "current":
        ms = statistics.median(r["jaxsync_ms"]) - statistics.median(r["bare_ms"])  # as sync_overhead reports
        added.append(f"{ms:+.1f} ms at {r['rate']:g} Mbit/s")
  return [
    "- Streaming DiLoCo's round: the clock overlaps a fragment's exchange with the last local step, as the "
    "method does; the real multi-controller round takes every local step and then the exchange (XLA on a CPU "
    "runs one operation of a program at a time). A round (medians): "
    + "; ".join(said)
    + ". The rest is its quantized exchange (an all-to-all and an all-gather of packed bytes, quantizing on "
    "either side), which the clock charges as three collectives' overhead"
    + (
      f"; measured beside a bare all-reduce of the same bytes (`sync_overhead.md`, DiLoCo's int8 exchange) it "
      f"adds {', '.join(added)} a round."
      if added
      else "."
    )
  ]


def _burst_line(store: Store, rates: list[float], size: str) -> list[str]:
  """The report's line on the cards' burst, from the stored probes and calibrations."""
  said = []
  for rate in rates:
    b = store.find("burst", rate_mbit=rate, size=size)
    cal = store.find("calibration", rate_mbit=rate, size=size, calibration=CALIBRATION)
    if b is None or cal is None:
      continue
    link = cal["config"]["cluster"]["link"]
    sustained = 2 * (link["latency"] + b["message_bytes"] / link["bandwidth"])
    trips = {float(p): 1e3 * statistics.median(t) for p, t in b["round_trips"].items()}
    said.append(
      f"{rate:g} Mbit/s: {trips[0.0]:.1f} ms back to back, {trips[b['pause']]:.1f} ms after {1e3 * b['pause']:.0f} "
      f"ms idle, against {1e3 * sustained:.1f} ms at the calibrated link's sustained rate"
    )
  if not said:
    return []
  return [
    f"- The cards' burst: each host's card is a token bucket (`tc tbf`) that lets {1e3 * CARD_BURST:g} ms at its "
    "rate (at least 32 KB) through at once after an idle spell; the calibration measures the sustained rate (a "
    "stream), which the clock charges for every message. A real run's worker is idle on the network while it "
    "computes, so the start of each message rides the burst. A round trip of one model-sized message to an echo "
    "on another host (median of 20): "
    + "; ".join(said)
    + ". A real card of that rate has no such allowance (the clock's sustained rate is the one to plan with); with "
    "a 10 ms burst (the archived measurement) a whole message passed at once at 1 Gbit/s.",
  ]


def _why(rate: float, name: str, c: dict) -> str:
  """Why a cell's time to target is outside 25%, from its measures: the clock's share (gradients/s) against
  the accuracy curve's (gradients to the target), and the real runs' own spread."""
  t, g = c["time_to_target"], c["gradients_per_second"]
  head = f"- {name} at {rate:g} Mbit/s"
  if t["error"] is None:
    return (
      f"{head}: no error to give: the real runs held {t['target']:g} in {t['real_reached']}, the simulated runs "
      f"in {t['reached']} (a median needs more than half)."
    )
  said = f"{head} ({_pct(t['error'])}): "
  if g["error"] is None or g["error"] <= -1:
    said += f"gradients/s not comparable ({_num(g['real'], 0)} real, {_num(g['simulated'], 0)} simulated)"
  else:
    clock = 1 / (1 + g["error"]) - 1  # the time error a clock off by g alone makes
    curve = (1 + t["error"]) * (1 + g["error"]) - 1  # gradients to the target (time x rate), sim against real
    if abs(g["error"]) <= 0.10:
      said += (
        f"the throughput matched (gradients/s {_pct(g['error'])}) but the time to target did not: its accuracy "
        f"curve, not its clock (the simulated runs reach the target after {_pct(curve)} of the real runs' "
        "gradients)"
      )
    else:
      said += (
        f"the clock was off by {_pct(g['error'])} (gradients/s), which alone makes {_pct(clock)} of time to "
        f"target; the gradients to the target (time x gradients/s) differ by {_pct(curve)}: mostly "
        + ("its clock" if abs(clock) >= abs(curve) else "its accuracy curve")
      )
  rr, sr = t.get("real_range"), t.get("range")
  if rr and t["real"]:
    said += (
      f". The real runs took {_num(rr[0])}-{_num(rr[1])} s (a spread of {100 * (rr[1] - rr[0]) / t['real']:.0f}% "
      "of their median)"
    )
  if sr:
    said += f", the simulated seeds {_num(sr[0])}-{_num(sr[1])} s"
    if rr and sr[0] <= rr[1] and rr[0] <= sr[1]:
      said += " (the ranges overlap)"
  return said + "."


def _times_to_target(store: Store, rate: float, cell: Cell, pair: dict, size: str) -> tuple[list, list]:
  """(each real run's time to target, each simulated run's), the runs that did not hold it left out."""
  target = pair["comparison"]["time_to_target"]["target"]
  real = [_measures(row["real"]) for row in _real_rows(store, rate, cell, size).values()]
  times = [
    [agreement.time_to_hold(m.eval_time, m.accuracy, target) for m in side]
    for side in (real, [_measures(x) for x in pair["simulated"]])
  ]
  return [t for t in times[0] if t], [t for t in times[1] if t]


# Draws of the noise floor's Monte Carlo, and real runs per cell it is also given for.
FLOOR_DRAWS = 4000


FLOOR_RUNS = (3, 5, 10, 20)


def noise_floor(
  log_sd: float, pairs: int, real_runs: int, simulated_runs: int, *, draws: int = FLOOR_DRAWS, seed: int = 0
) -> tuple[float, float, float, float]:
  """What a perfect clock would score: the median over ``pairs`` cells of |error| of the median of
  ``simulated_runs`` draws against the median of ``real_runs`` draws, every draw of one cell from the same
  log-normal spread (``log_sd``, the runs' standard deviation of log time to target); its median and the
  5th and 95th percentiles over ``draws`` repetitions, and the median number of cells beyond 25%.

  Example:
    >>> noise_floor(0.0, 22, 3, 5)
    (0.0, 0.0, 0.0, 0.0)
  """
  rng = np.random.default_rng(seed)
  real = np.median(rng.normal(0.0, log_sd, (draws, pairs, real_runs)), axis=-1)
  simulated = np.median(rng.normal(0.0, log_sd, (draws, pairs, simulated_runs)), axis=-1)
  errors = np.abs(np.exp(simulated - real) - 1.0)
  scores = np.median(errors, axis=-1)
  beyond = float(np.median((errors > 0.25).sum(axis=-1)))
  return float(np.median(scores)), float(np.quantile(scores, 0.05)), float(np.quantile(scores, 0.95)), beyond


def _floor_line(store: Store, shown: list[tuple[float, Cell, dict]], size: str, pairs: int) -> str:
  """The targets' line on the noise floor: the runs' pooled spread, what a perfect clock would score with
  this many runs per cell, and with more."""
  deviations, freedom = 0.0, 0
  for rate, cell, pair in shown:
    for side in _times_to_target(store, rate, cell, pair, size):
      if len(side) >= 2:
        logs = np.log(side)
        deviations += float(((logs - logs.mean()) ** 2).sum())
        freedom += len(side) - 1
  if not freedom:
    return "- Noise floor: no cell has two runs that held the target."
  log_sd = (deviations / freedom) ** 0.5
  runs, sims = REAL_RUNS[size], SIM_SEEDS[size]
  here = noise_floor(log_sd, pairs, runs, sims)
  more = ", ".join(
    f"{n} real and {max(n, sims)} simulated: {100 * noise_floor(log_sd, pairs, n, max(n, sims))[0]:.0f}%"
    for n in FLOOR_RUNS
    if n > runs
  )
  return (
    f"- Noise floor: one cell's runs (real or simulated, seeds 0, 1, ...) spread by {log_sd:.2f} in log time to "
    f"target (pooled over the {pairs} pairs' runs, {freedom} degrees of freedom), so a clock that made no error "
    f"at all would score a median |error| of {100 * here[0]:.0f}% (90% of draws {100 * here[1]:.0f}-"
    f"{100 * here[2]:.0f}%) with {runs} real and {sims} simulated runs per cell, and leave {here[3]:.0f} of the "
    f"{pairs} beyond 25%: the medians' own sampling error. With more runs per cell: {more}."
  )


def _time_errors(pairs: list[dict], key: str) -> list[float]:
  """|error| of time to target of each pair's ``key`` comparison that has one."""
  errors = [p[key]["time_to_target"]["error"] for p in pairs]
  return [abs(e) for e in errors if e is not None] or [float("nan")]
