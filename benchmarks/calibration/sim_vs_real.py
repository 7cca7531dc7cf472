"""The simulator against real processes: does a calibrated simulated run predict the real runs of the same config?

Every time jaxsync's Results and `jaxsync advise` report is a simulated time. This benchmark runs
one config (``configs/sim_vs_real.yaml``: the digits CNN, 3 workers, one of them 3x slower) both
ways, for eleven strategies (asp, ormo, ssp, adaptive_k, allreduce, ea_wild, local_sgd, diloco,
streaming_diloco, async_local_sgd, dc_asgd) on two networks, plus one cell with the slow worker 4x slower
(allreduce at 1 Gbit/s, ``cluster.slowdown=4``); a cell is a strategy and such a variant (``CELLS``):

1. **Hosts.** Every process runs in a network namespace of its own, a host with its own address and
   network card, shaped by ``tc`` to the network's rate in each direction (``benchmarks/netns.py``).
2. **Calibration**, once per network, on 3 hosts. ``jaxsync calibrate`` runs in host 0 (where the server
   runs) with 3 compute probes at once (the workers share this machine's cores as in the real run),
   measures the link to an echo in host 1 (``jaxsync calibrate --serve-echo``) through the shaped cards,
   and times all-reduces across the 3 hosts (``--collective-processes 3``: its collective probe, with
   peers ``jaxsync calibrate --collective-peer`` in hosts 1 and 2), what each takes beyond the ring
   formula being ``cluster.collective_overhead``. Its config, the measured cluster section in place, is
   what both kinds of run use.
3. **Real runs**, 3 per cell (``--set seed=0``, 1, 2: each its own draw of data order and timing):
   ``jaxsync train`` as N processes on N hosts (a parameter server and 3 workers, or 3 all-reduce
   workers), the slow worker made slower by a real, measured delay (``cluster.emulate_slow_workers``:
   it sleeps ``slowdown - 1`` times each step's measured compute).
4. **Simulated runs** of the same config, seeds 0-4; all read back from their event records. The real
   runs' median is compared with the simulated runs' median, both with their range.

Per cell and network: gradients/s and updates/s (the second half of each run's events), the staleness
distribution (means and total variation distance), the time to the target accuracy (a crossing that
holds: the first evaluation after which accuracy stays above the target), the accuracy at equal time,
and the real runs' start-up (seconds until every worker has pushed once: processes starting and
compiling, which the simulated clock does not model). Both clocks start when every worker runs (the
event of the last worker's first arrival). The targets are the issue's: median |error| of time to
target <= 10%, every cell within 25%, the same ranking (Kendall tau >= 0.9, strategies whose real runs'
times overlap counting as tied); where a cell misses, the results file says why, from the measures.

The store (``benchmarks/results/sim_vs_real_runs.jsonl``) keeps one line per calibration, per real run
and per (network, cell) comparison, each with ``"protocol": 2`` (rows of older code, without it, are
ignored); a rerun skips what it holds, ``--report-only`` rewrites ``sim_vs_real.md`` from it alone.

    python -m benchmarks.calibration.sim_vs_real [--size tiny|default] [--rates 100,1000]
        [--strategies asp,ormo] [--phase real|simulated|both] [--report-only]

Needs root (``ip netns``, ``tc``); sizes: tiny (1 Gbit/s, asp, 1 real run, 300 gradients; the suite's),
default (100 Mbit/s and 1 Gbit/s, 11 strategies and the 4x cell, 3 real runs each, 1,200 gradients: 69
real runs, about 3 hours on 2 cores; resumable, a rerun goes on from the store).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import yaml

from benchmarks.calibration.sim_vs_real_errors import (
  _burst_line,
  _compute_line,
  _floor_line,
  _overlap_line,
  _time_errors,
  _why,
)
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
  _summary,
)
from benchmarks.common import harness, netns
from jaxsync._src.app import calibrate, experiment
from jaxsync._src.app import config as config_lib
from jaxsync._src.calibration import agreement
from jaxsync._src.sim import time_model

NAME = "sim_vs_real"
CONFIG = harness.REPO / "configs" / "sim_vs_real.yaml"
STRATEGIES = {
  "tiny": ["asp"],
  "default": [
    "asp",
    "ormo",
    "ssp",
    "adaptive_k",
    "allreduce",
    "ea_wild",
    "local_sgd",
    "diloco",
    "streaming_diloco",
    "async_local_sgd",
    "dc_asgd",
  ],
}
RATES = {"tiny": [1000.0], "default": [100.0, 1000.0]}  # Mbit/s of each host's card, each direction
OVERRIDES = {"tiny": ["run.gradients=300", "run.target_accuracy=0.6"], "default": []}
PLAIN_SEEDS = {"tiny": 1, "default": 3}  # ... and without the evaluations' cost
ECHO_PORT = 4399  # the link probe's echo in host 1
COLLECTIVE_PORT = 4398  # the collective probe's coordinator in host 0 (netns.PORT is a run's)
TIMEOUT = 900  # seconds a real run (or a calibration) may take


# The cells of a size beyond each of its strategies on each of its networks: (network Mbit/s, cell).
EXTRA_CELLS = {"tiny": [], "default": [(1000.0, Cell("allreduce", "slow worker 4x"))]}


def cells(size: str, rate: float, names: list[str]) -> list[Cell]:
  """The cells measured on cards of ``rate`` Mbit/s: each of the strategies ``names`` in the config, then the
  ``EXTRA_CELLS`` of that network whose strategy is among them (default size: 11 cells at 100 Mbit/s, 12 at
  1 Gbit/s, allreduce with the slow worker 4x slower the 12th)."""
  return [Cell(n) for n in names] + [c for r, c in EXTRA_CELLS[size] if r == rate and c.strategy in names]


def _python_cli(*args: str) -> list[str]:
  return [sys.executable, "-m", "jaxsync.cli", *args]


def _follow(stream, marker: str) -> tuple[list[str], threading.Event, threading.Thread]:
  """Reads ``stream``'s lines into a list on a thread; the event is set at the first line holding ``marker``."""
  said, seen = [], threading.Event()

  def read() -> None:
    for line in stream:
      said.append(line)
      if marker in line:
        seen.set()

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  return said, seen, reader


def _stop(p: subprocess.Popen) -> None:
  """Kills ``p``'s session (each process started here leads one) if it still runs."""
  if p.poll() is None:
    try:
      os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    p.wait()


def calibrate_on_hosts(rate: float, overrides: list[str], out: pathlib.Path) -> dict:
  """``jaxsync calibrate`` in host 0 of four hosts with cards of ``rate`` Mbit/s: its link to an echo in
  host 1, that echo's card shared by 3 senders (host 0 and ``--stream-peer``s in hosts 2 and 3, as a
  parameter server's 3 workers push at once: ``--link-senders 3``), its collective probe across hosts 0-2
  (peers in hosts 1 and 2, process ids 1 and 2, started when calibrate reaches the probe: a peer waits for
  the coordinator 120 s at most); returns the written config as plain data."""
  hosts = netns.Hosts(4, rate_mbit=rate, burst_seconds=CARD_BURST)
  env = netns.run_env()
  started: list[subprocess.Popen] = []
  peers: list[subprocess.Popen] = []
  logs = [out.with_name(f"{out.stem}_peer{i}.log") for i in (1, 2)]
  try:
    hosts.create()
    started.append(
      subprocess.Popen(
        hosts.exec(
          1, *_python_cli("calibrate", "--serve-echo", str(ECHO_PORT), "--bind", hosts.addresses[1])
        ),
        env=env,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
      )
    )
    echo = f"tcp://{hosts.addresses[1]}:{ECHO_PORT}"
    for i in (2, 3):  # idle until calibrate turns the shared-card probe on at the echo
      started.append(
        subprocess.Popen(
          hosts.exec(i, *_python_cli("calibrate", "--stream-peer", echo)),
          env=env,
          stderr=subprocess.DEVNULL,
          start_new_session=True,
        )
      )
    time.sleep(5.0)  # the echo imports jaxsync and binds
    coordinator = f"{hosts.addresses[0]}:{COLLECTIVE_PORT}"
    argv = _python_cli("calibrate", str(CONFIG), *[f"--set={o}" for o in overrides], "--processes", "3")
    argv += ["--link-to", echo, "--link-senders", "3", "--out", str(out)]
    argv += ["--collective-processes", "3", "--collective-coordinator", coordinator]
    main = subprocess.Popen(
      hosts.exec(0, *argv),
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
    )
    started.append(main)
    said, probing, reader = _follow(main.stderr, "collectives:")
    deadline = time.monotonic() + TIMEOUT
    while main.poll() is None:
      if probing.is_set() and not peers:
        for i, log in zip((1, 2), logs):
          peer = _python_cli("calibrate", "--collective-peer", coordinator, "--collective-processes", "3")
          with log.open("w") as f:
            peers.append(
              subprocess.Popen(
                hosts.exec(i, *peer, "--process-id", str(i)),
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
              )
            )
        started += peers
      if time.monotonic() > deadline:
        raise RuntimeError(f"calibrate did not finish within {TIMEOUT} s:\n{''.join(said)[-3000:]}")
      time.sleep(0.2)
    reader.join(timeout=10.0)
    for peer in peers:  # they leave after the probe's last barrier
      try:
        peer.wait(timeout=60.0)
      except subprocess.TimeoutExpired:
        _stop(peer)
    if main.returncode != 0:
      told = "".join(
        f"\n--- collective peer {i}:\n{log.read_text()[-1500:]}"
        for i, log in zip((1, 2), logs)
        if log.is_file()
      )
      raise RuntimeError(f"calibrate failed (exit code {main.returncode}):\n{''.join(said)[-3000:]}{told}")
  finally:
    for p in started:
      _stop(p)
    left = hosts.destroy()
  if left:
    raise RuntimeError(f"namespaces left behind: {left}")
  return config_lib.load_yaml(out.read_text())


# The idle spell before each round trip of the burst probe: about a fast worker's step here.
BURST_PAUSE = 0.02
_BURST = (
  "import json, sys; from jaxsync._src.calibration import probes; a, n = sys.argv[1], int(sys.argv[2]); "
  "print(json.dumps({p: probes.round_trips(a, [n], rounds=20, pause=float(p))[n].tolist() "
  "for p in sys.argv[3:]}))"
)


def burst_on_hosts(rate: float, message_bytes: int) -> dict[str, list[float]]:
  """Round trips of one message between two hosts with cards of ``rate`` Mbit/s, back to back and after
  ``BURST_PAUSE`` s idle each: ``{pause: [seconds]}``. The cards' token bucket (``netns``: a burst of 10 ms at
  the rate) lets a message after an idle spell through faster than the sustained rate the calibration
  measures with a stream, as a real run's messages after each compute are."""
  hosts = netns.Hosts(2, rate_mbit=rate, burst_seconds=CARD_BURST)
  env = netns.run_env()
  echo = None
  try:
    hosts.create()
    echo = subprocess.Popen(
      hosts.exec(1, *_python_cli("calibrate", "--serve-echo", str(ECHO_PORT), "--bind", hosts.addresses[1])),
      env=env,
      stderr=subprocess.DEVNULL,
      start_new_session=True,
    )
    time.sleep(5.0)  # the echo imports jaxsync and binds
    argv = [sys.executable, "-c", _BURST, f"tcp://{hosts.addresses[1]}:{ECHO_PORT}", str(message_bytes)]
    out = subprocess.run(
      hosts.exec(0, *argv, "0", str(BURST_PAUSE)), env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    if out.returncode != 0:
      raise RuntimeError(f"the burst probe failed (exit code {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)
  finally:
    if echo is not None:
      _stop(echo)
    hosts.destroy()


def _burst(store: Store, rate: float, size: str, message_bytes: int) -> None:
  """The burst probe of cards of ``rate`` Mbit/s, measured once and stored."""
  if store.find("burst", rate_mbit=rate, size=size) is not None:
    return
  print(
    f"[{NAME}] {rate:g} Mbit/s: round trips after an idle spell (the cards' burst)",
    file=sys.stderr,
    flush=True,
  )
  store.add(
    {
      "kind": "burst",
      "rate_mbit": rate,
      "size": size,
      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
      "machine": harness.machine(),
      "message_bytes": message_bytes,
      "pause": BURST_PAUSE,
      "round_trips": burst_on_hosts(rate, message_bytes),
    }
  )


# Steps of the compute probe of one process alone.
ALONE_STEPS = 300


def _compute_alone(store: Store, size: str, calibrated: pathlib.Path) -> None:
  """The config's gradient step timed in this one process, nothing else computing (an idle machine), once
  and stored: what a worker computes at when the others wait, against the calibration's probes at once."""
  if store.find("compute_alone", size=size) is not None:
    return
  print(f"[{NAME}] compute: one process alone", file=sys.stderr, flush=True)
  exp = experiment.build(config_lib.load(calibrated))
  steps = calibrate._step_seconds(exp, ALONE_STEPS, None)
  store.add(
    {
      "kind": "compute_alone",
      "size": size,
      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
      "machine": harness.machine(),
      "code": harness.code_version(),
      "steps": ALONE_STEPS,
      "mean_ms": 1e3 * float(np.mean(steps)),
      "median_ms": 1e3 * float(np.median(steps)),
      "cv": float(np.std(steps, ddof=1) / np.mean(steps)),
    }
  )


def strategy_overrides(cfg: config_lib.Config, strategy: str) -> list[str]:
  """``--set`` values that make ``cfg``'s run the strategy with its ``compare.options``."""
  options = experiment.for_strategy(cfg, strategy, cfg.seed).strategy.options
  return [f"strategy.name={strategy}", f"strategy.options={json.dumps(options)}"]


def real_run(config: pathlib.Path, strategy_set: list[str], rate: float, out: pathlib.Path) -> dict:
  """The run on real processes, each on a host of its own; its measures and the workers' own compute."""
  cfg = config_lib.load(config, strategy_set)
  exp = experiment.build(cfg)
  from jaxsync._src.distributed import roles

  processes = cfg.cluster.num_workers // exp.strategy.workers_per_unit + (
    1 if roles.serves(exp.strategy) else 0
  )
  began = time.perf_counter()
  codes, logs = netns.train_on_hosts(
    processes, rate, str(config), strategy_set, out, timeout=TIMEOUT, burst_seconds=CARD_BURST
  )
  wall = time.perf_counter() - began
  if any(codes):
    raise RuntimeError(f"a real run's process failed (exit codes {codes}):\n{netns.tails(logs, processes)}")
  compute = []
  for i in range(processes):
    text = (logs / f"p{i}.log").read_text()
    compute += [float(x) for x in re.findall(r"([\d.]+) ms of compute per step \(slowdown 1\)", text)]
  return {
    "measures": calibrate.real_measures(out, cfg),
    "processes": processes,
    "wall": wall,
    "worker_compute_ms": compute,
  }


def _spread(median: float | None, span: list[float] | None, digits: int = 2) -> str:
  """``median (least-greatest)``; a range of one value is left out."""
  if median is None:
    return "-"
  if not span or span[0] == span[1]:
    return _num(median, digits)
  return f"{_num(median, digits)} ({_num(span[0], digits)}-{_num(span[1], digits)})"


HEADER = [
  "cell",
  "real runs",
  "gradients/s real median (range)",
  "gradients/s sim median (range)",
  "error",
  "updates/s real / sim",
  "mean staleness real / sim",
  "staleness TV",
  "s to {target} real median (range)",
  "s to {target} sim median (range)",
  "error",
  "errors without the evaluations' cost (gradients/s, time)",
  "accuracy at equal time real / sim",
  "real start-up s",
  "real fast workers' compute ms/step",
  "real run wall s",
]


def _row(cell: Cell, pair: dict) -> list[str]:
  c, plain = pair["comparison"], pair["without_evaluation_cost"]
  g, u, t, s = c["gradients_per_second"], c["updates_per_second"], c["time_to_target"], c["staleness"]
  runs = f"{c['runs']}" + (
    "" if t["real_reached"] == f"{c['runs']} of {c['runs']}" else f" ({t['real_reached']} reached)"
  )
  compute = pair.get("worker_compute_ms") or []
  return [
    cell.name,
    runs,
    _spread(g["real"], g["real_range"], 0),
    _spread(g["simulated"], g["simulated_range"], 0),
    _pct(g["error"]),
    f"{_num(u['real'], 0)} / {_num(u['simulated'], 0)}",
    f"{_num(s['real'])} / {_num(s['simulated'])}",
    _num(s["total_variation"]),
    _spread(t["real"], t["real_range"]),
    _spread(t["simulated"], t["simulated_range"]),
    _pct(t["error"]),
    f"{_pct(plain['gradients_per_second']['error'])}, {_pct(plain['time_to_target']['error'])}",
    f"{_num(c['accuracy_at_equal_time']['real'], 3)} / {_num(c['accuracy_at_equal_time']['simulated'], 3)}",
    _spread(c["start"], c["start_range"], 1),
    _num(float(np.mean(compute)), 2) if compute else "-",
    f"{statistics.median(pair['real_wall']):.0f}",
  ]


def kendall_with_ties(
  real: dict[str, float], real_range: dict[str, list[float]], simulated: dict[str, float]
) -> tuple[float | None, int, int, int]:
  """Kendall's tau of the simulated order against the real one, ties allowed: a pair whose real ranges
  (least-greatest of the real runs) overlap is tied, neither concordant nor discordant; an equal simulated
  time of an untied pair is discordant. Returns (tau = (C - D) / (C + D), None without an untied pair;
  C; D; the tied pairs)."""
  names = list(real)
  concordant = discordant = tied = 0
  for i, a in enumerate(names):
    for b in names[i + 1 :]:
      ra, rb = real_range[a], real_range[b]
      if ra[0] <= rb[1] and rb[0] <= ra[1]:
        tied += 1
      elif (real[a] - real[b]) * (simulated[a] - simulated[b]) > 0:
        concordant += 1
      else:
        discordant += 1
  untied = concordant + discordant
  return ((concordant - discordant) / untied if untied else None), concordant, discordant, tied


# Around the targets' section: the calibration guide includes what is between them.
SUMMARY = ("<!-- summary -->", "<!-- /summary -->")


def _summary_table(shown: list[tuple[float, Cell, dict]], rates: list[float]) -> str:
  """Time to target per cell (rows) and network (columns): real median / simulated median, and the error."""
  by = {(rate, cell.name): p["comparison"]["time_to_target"] for rate, cell, p in shown}
  names = list(dict.fromkeys(cell.name for _, cell, _ in shown))
  header = ["cell"] + [h for r in rates for h in (f"{r:g} Mbit/s: s to target real / sim", "error")]
  rows = []
  for name in names:
    row = [name]
    for rate in rates:
      t = by.get((rate, name))
      row += ["-", "-"] if t is None else [f"{_num(t['real'])} / {_num(t['simulated'])}", _pct(t["error"])]
    rows.append(row)
  return harness.table(header, rows)


def _ranked(cell: Cell, pair: dict) -> tuple[float, list[float], float] | None:
  """A cell's place in the ranking: (real median, real range, simulated median) of time to target; None for a
  variant or a side without a median. A real run that never held the target could have taken any time after
  the others: its cell's range reaches to the end (it ties with every slower strategy)."""
  t = pair["comparison"]["time_to_target"]
  if cell.variant is not None or t["real"] is None or t["simulated"] is None:
    return None
  low, high = t["real_range"]
  missed = t["real_reached"].split(" of ")[0] != t["real_reached"].split(" of ")[1]
  return t["real"], [low, float("inf") if missed else high], t["simulated"]


def report(store: Store, size: str, rates: list[float], names: list[str], command: str) -> str:
  runs, seeds = REAL_RUNS[size], SIM_SEEDS[size]
  lines = [
    "# The simulator against real processes: calibrated simulated runs and the real runs of the same config",
    "",
    f"- Command: `{command}` (resumes from the store; `--phase real` then `--phase simulated` keep the"
    " machine idle during the real runs; `--report-only` rewrites this file from the store)",
    f"- Machine: {harness.machine()}",
    f"- Hosts: network namespaces, each with a card shaped by `tc` (a token bucket at the rate, each direction, "
    f"with a burst of {1e3 * CARD_BURST:g} ms at the rate, at least 32 KB)",
    f"- Config: `configs/sim_vs_real.yaml` ({size} size{'; ' + ', '.join(OVERRIDES[size]) if OVERRIDES[size] else ''})",
    f"- {runs} real run{'s' if runs > 1 else ''} per cell (seed{'s' if runs > 1 else ''} 0"
    f"{f'-{runs - 1}' if runs > 1 else ''}){', their median (least-greatest in brackets),' if runs > 1 else ''} against the median",
    f"  (range) of {seeds} simulated runs (seeds 0-{seeds - 1}); an error is the simulated median's, relative to the",
    "  real median. Clocks from the moment every worker runs; time to target: the first evaluation after which",
    "  accuracy stays at or above the target; rates over each run's second half of events.",
    "",
  ]
  errors, shown, rankings, overheads, cards = [], [], {}, {}, {}
  for rate in rates:
    cal = store.find("calibration", rate_mbit=rate, size=size, calibration=CALIBRATION)
    if cal is None:
      lines += [f"## {rate:g} Mbit/s: not measured yet", ""]
      continue
    cluster = cal["config"]["cluster"]
    link = cluster["link"]
    overheads[rate] = cluster.get("collective_overhead", 0.0)
    if cluster.get("server_link"):
      cards[rate] = cluster
    lines += [
      f"## Cards of {rate:g} Mbit/s",
      "",
      f"Calibrated (`jaxsync calibrate`, {cal['date']}): compute {1e3 * cluster['compute_time']:.2f} ms per step "
      f"(jitter shape {cluster['jitter_shape']:.3g}), link {1e6 * link['latency']:.0f} us + "
      f"{8 * link['bandwidth'] / 1e6:.0f} Mbit/s, server {1e6 * cluster['apply_time']:.0f} us per arrival"
      + (
        f" + memory at {cluster['server_bandwidth'] / 1e9:.2f} GB/s"
        if cluster.get("server_bandwidth")
        else ""
      )
      + (
        f", the server's card shared by 3 senders {8 * cluster['server_link']['bandwidth'] / 1e6:.0f} Mbit/s"
        if cluster.get("server_link")
        else ""
      )
      + f", collective overhead {1e3 * overheads[rate]:.2f} ms per all-reduce (3 hosts)"
      + f", {1e3 * cluster.get('eval_time', 0.0):.1f} ms per evaluation.",
      "",
    ]
    header = [h.format(target=f"{cal['config']['run']['target_accuracy']:g}") for h in HEADER]
    rows, real, real_range, sim, rounds = [], {}, {}, {}, []
    for cell in cells(size, rate, names):
      pair = store.find(
        "pair", rate_mbit=rate, cell=cell.name, size=size, real_runs=runs, calibration=CALIBRATION
      )
      if pair is None:
        have = len(_real_rows(store, rate, cell, size))
        rows.append([cell.name, f"{have} of {runs}", "missing"] + ["-"] * (len(header) - 3))
        continue
      shown.append((rate, cell, pair))
      rows.append(_row(cell, pair))
      c = pair["comparison"]
      t, u = c["time_to_target"], c["updates_per_second"]
      if t["error"] is not None:
        errors.append((rate, cell.name, t["error"]))
      ranked = _ranked(cell, pair)
      if ranked is not None:
        real[cell.name], real_range[cell.name], sim[cell.name] = ranked
      if c["staleness"]["real"] is None and u["real"] and u["simulated"]:  # a synchronous run: no arrivals
        real_ms, sim_ms = 1e3 / u["real"], 1e3 / u["simulated"]
        unlapped = store.find("no_overlap", rate_mbit=rate, cell=cell.name, calibration=CALIBRATION)
        rounds.append(
          f"{cell.name} {real_ms:.0f} ms real, {sim_ms:.0f} ms simulated ({real_ms - sim_ms:+.0f} ms)"
          + (
            f", {1e3 / statistics.median(unlapped['updates_per_second']):.0f} ms simulated with the exchange "
            "after every local step, as the real round runs it"
            if unlapped
            else ""
          )
        )
    lines.append(harness.table(header, rows))
    if rounds:
      lines += ["", "A synchronous round (medians): " + "; ".join(rounds) + "."]
    if len(real) > 1:
      by_real = sorted(real, key=lambda n: real[n])
      by_sim = sorted(real, key=lambda n: sim[n])
      tau, concordant, discordant, tied = kendall_with_ties(real, real_range, sim)
      rankings[rate] = (tau, tied, len(real) * (len(real) - 1) // 2)
      lines += [
        "",
        f"Ranking by time to target, real (median): {' < '.join(by_real)}",
        f"Ranking by time to target, simulated (median): {' < '.join(by_sim)}"
        + (" (the same)" if by_real == by_sim else ""),
        "Kendall tau, ties allowed (the config's strategies; a pair whose real runs' times overlap is tied, an equal "
        "simulated time of an untied pair discordant): "
        + ("-" if tau is None else f"{tau:.2f}")
        + f" over {concordant + discordant} untied pairs ({concordant} concordant, {discordant} discordant); "
        f"{tied} of {rankings[rate][2]} pairs tied.",
      ]
    lines.append("")
  pairs = [p for _, _, p in shown]
  if pairs:
    with_cost = [abs(p["comparison"]["gradients_per_second"]["error"]) for p in pairs]
    without = [abs(p["without_evaluation_cost"]["gradients_per_second"]["error"]) for p in pairs]
    lines += [
      "## Where the error comes from",
      "",
      f"- Evaluations: a real server evaluates inside its step, a real all-reduce round inside the round. The "
      f"clock charges the measured `eval_time` for each; without it the median |error| of gradients/s over the "
      f"{len(pairs)} pairs is {100 * statistics.median(without):.0f}%, with it "
      f"{100 * statistics.median(with_cost):.0f}%; of time to target "
      f"{100 * statistics.median(_time_errors(pairs, 'without_evaluation_cost')):.0f}% without, "
      f"{100 * statistics.median(_time_errors(pairs, 'comparison')):.0f}% with.",
      "- Synchronous rounds (the durations above): a round of the multi-controller loop is one collective per "
      "bucket (the loop no longer broadcasts a clock nor reads a record back each round); what an all-reduce "
      "takes beyond the ring formula (gloo's own steps across hosts, dispatch), the calibration measures and the "
      "clock charges: `cluster.collective_overhead`, "
      + ", ".join(f"{1e3 * x:.2f} ms at {r:g} Mbit/s" for r, x in overheads.items())
      + ".",
    ]
    shared = [p for p in pairs if p.get("card_at_one_stream")]
    if shared:
      lines.append(
        "- The server's card shared by its 3 workers (`cluster.server_link`, measured with 3 senders at once: "
        + ", ".join(
          f"{8e-6 * c['server_link']['bandwidth']:.0f} Mbit/s against one stream's "
          f"{8e-6 * c['link']['bandwidth']:.0f} at {r:g} Mbit/s"
          for r, c in cards.items()
        )
        + f"): over the {len(shared)} pairs through a server, the median |error| of gradients/s is "
        f"{100 * statistics.median(abs(p['comparison']['gradients_per_second']['error']) for p in shared):.0f}% "
        f"with it and {100 * statistics.median(abs(p['card_at_one_stream']['gradients_per_second']['error']) for p in shared):.0f}% "
        f"at one stream's rate; of time to target {100 * statistics.median(_time_errors(shared, 'comparison')):.0f}% "
        f"and {100 * statistics.median(_time_errors(shared, 'card_at_one_stream')):.0f}%."
      )
    lines += [
      _why(rate, cell.name, p["comparison"])
      for rate, cell, p in shown
      if p["comparison"]["time_to_target"]["error"] is None
      or abs(p["comparison"]["time_to_target"]["error"]) > 0.25
    ]
    lines += _burst_line(store, rates, size)
    lines += _compute_line(store, rates, size)
    lines += _overlap_line(store, rates, size)
    lines += [
      "- Not modelled, reported apart: the real runs' start-up (processes starting, compiling), left out of both "
      "clocks.",
      "",
    ]
  if errors:
    absolute = [abs(e) for _, _, e in errors]
    worst = max(errors, key=lambda x: abs(x[2]))
    without_error = len(shown) - len(errors)
    lines += [
      "## Against the targets",
      "",
      SUMMARY[0],
      _summary_table(shown, rates),
      "",
      f"- Median |error| of time to target over {len(errors)} strategy-network pairs: "
      f"{100 * statistics.median(absolute):.0f}% (target <= 10%: "
      f"{'met' if statistics.median(absolute) <= 0.10 else 'missed'}).",
      f"- Within 25%: {sum(a <= 0.25 for a in absolute)} of {len(errors)} (the worst: {worst[1]} at "
      f"{worst[0]:g} Mbit/s, {_pct(worst[2])})"
      + (
        f"; {without_error} more cell{' has' if without_error == 1 else 's have'} no error (the target not held "
        "by most runs of a side; see above)."
        if without_error
        else "."
      ),
      "- Same ranking (Kendall tau with ties within the real runs' range, target >= 0.9): "
      + ", ".join(
        f"{r:g} Mbit/s: "
        + (
          f"{tau:.2f}, {tied} of {n} pairs tied ({'met' if tau >= 0.9 else 'missed'})"
          if tau is not None
          else f"no untied pair ({tied} of {n} tied)"
        )
        for r, (tau, tied, n) in rankings.items()
      )
      + ".",
      _floor_line(store, shown, size, len(errors)),
    ]
    lines += [SUMMARY[1], ""]
  return "\n".join(lines) + "\n"


def _calibrated(store: Store, runs: pathlib.Path, rate: float, size: str) -> pathlib.Path:
  """The calibrated config of cards of ``rate`` Mbit/s: the store's, else measured now and stored."""
  cal = store.find("calibration", rate_mbit=rate, size=size, calibration=CALIBRATION)
  path = runs / f"calibrated_{rate:g}mbit.yaml"
  runs.mkdir(parents=True, exist_ok=True)
  if cal is None:
    print(f"[{NAME}] calibrating on cards of {rate:g} Mbit/s", file=sys.stderr, flush=True)
    raw = calibrate_on_hosts(rate, OVERRIDES[size], path)
    cal = {
      "kind": "calibration",
      "calibration": CALIBRATION,
      "rate_mbit": rate,
      "size": size,
      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
      "code": harness.code_version(),
      "config": raw,
    }
    store.add(cal)
  path.write_text(yaml.safe_dump(cal["config"], sort_keys=False))
  return path


def _slug(name: str) -> str:
  return re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")


def run_real(store: Store, runs: pathlib.Path, size: str, rates: list[float], names: list[str]) -> None:
  """Calibrations and the real runs the store lacks: per network, each repeat of every cell in turn (a
  partial store holds a run of each cell before a second of any)."""
  for rate in rates:
    calibrated = _calibrated(store, runs, rate, size)
    cfg = config_lib.load(calibrated)
    _burst(store, rate, size, time_model.message_bytes(experiment.build(cfg).model.params))
    _compute_alone(store, size, calibrated)
    for repeat in range(REAL_RUNS[size]):
      for cell in cells(size, rate, names):
        if repeat in _real_rows(store, rate, cell, size):
          continue
        out = runs / f"{rate:g}mbit" / _slug(cell.name) / f"run{repeat}"
        chosen = [*strategy_overrides(cfg, cell.strategy), *cell.overrides, f"seed={repeat}"]
        what = f"[{NAME}] {rate:g} Mbit/s, {cell.name}, real run {repeat + 1} of {REAL_RUNS[size]}"
        print(what, file=sys.stderr, flush=True)
        try:
          real = real_run(calibrated, chosen, rate, out)
        except (RuntimeError, TimeoutError) as err:  # reported, and the next runs; a rerun retries it
          print(f"{what} failed: {err}", file=sys.stderr, flush=True)
          continue
        store.add(
          {
            "kind": "real",
            "rate_mbit": rate,
            "cell": cell.name,
            "strategy": cell.strategy,
            "variant": cell.variant,
            "repeat": repeat,
            "size": size,
            "code": harness.code_version(),
            "overrides": chosen,
            "real": _summary(real["measures"]),
            "real_wall": real["wall"],
            "worker_compute_ms": real["worker_compute_ms"],
          }
        )
        shutil.rmtree(out, ignore_errors=True)  # the store holds what the report needs


def _through_server(cfg: config_lib.Config, cell: Cell) -> bool:
  """Whether the cell's strategy exchanges through a parameter server (whose card ``server_link`` is)."""
  from jaxsync._src.distributed import roles

  exp = experiment.build(config_lib.load(CONFIG, [*strategy_overrides(cfg, cell.strategy), *cell.overrides]))
  return roles.serves(exp.strategy)


# Simulated seeds of a cell whose exchange overlaps local steps (Streaming DiLoCo), again without the overlap.
OVERLAP_SEEDS = 2


def _overlapping(cfg: config_lib.Config, cell: Cell) -> dict | None:
  """The cell's strategy options if its exchange overlaps local steps (``overlap > 0``), else None."""
  options = dict(experiment.for_strategy(cfg, cell.strategy, cfg.seed).strategy.options)
  exp = experiment.build(config_lib.load(CONFIG, [*strategy_overrides(cfg, cell.strategy), *cell.overrides]))
  return options if exp.strategy.exchange.overlap > 0 else None


def run_without_overlap(
  store: Store, runs: pathlib.Path, size: str, rates: list[float], names: list[str]
) -> None:
  """For a cell whose exchange overlaps its last local steps, the simulated round without the overlap (the
  exchange after every local step, as the real multi-controller round runs it): its updates per second."""
  for rate in rates:
    if store.find("calibration", rate_mbit=rate, size=size, calibration=CALIBRATION) is None:
      continue
    calibrated = _calibrated(store, runs, rate, size)
    cfg = config_lib.load(calibrated)
    for cell in cells(size, rate, names):
      options = _overlapping(cfg, cell)
      if options is None or store.find("no_overlap", rate_mbit=rate, cell=cell.name, calibration=CALIBRATION):
        continue
      print(
        f"[{NAME}] {rate:g} Mbit/s, {cell.name}: simulated without the overlap", file=sys.stderr, flush=True
      )
      chosen = [
        f"strategy.name={cell.strategy}",
        f"strategy.options={json.dumps({**options, 'overlap': 0})}",
        *cell.overrides,
      ]
      sims = calibrate.simulated_measures(config_lib.load(calibrated, chosen), OVERLAP_SEEDS)
      store.add(
        {
          "kind": "no_overlap",
          "calibration": CALIBRATION,
          "rate_mbit": rate,
          "cell": cell.name,
          "size": size,
          "code": harness.code_version(),
          "overlap": options.get("overlap"),
          "updates_per_second": [m.updates_per_second for m in sims],
        }
      )


def run_simulated(store: Store, runs: pathlib.Path, size: str, rates: list[float], names: list[str]) -> None:
  """The simulated runs of each cell whose real runs are all stored, and their comparison."""
  n = REAL_RUNS[size]
  for rate in rates:
    if store.find("calibration", rate_mbit=rate, size=size, calibration=CALIBRATION) is None:
      continue
    calibrated = _calibrated(store, runs, rate, size)
    cfg = config_lib.load(calibrated)
    target = cfg.run.target_accuracy
    for cell in cells(size, rate, names):
      reals = _real_rows(store, rate, cell, size)
      if any(i not in reals for i in range(n)):
        continue
      if store.find("pair", rate_mbit=rate, cell=cell.name, size=size, real_runs=n, calibration=CALIBRATION):
        continue
      print(f"[{NAME}] {rate:g} Mbit/s, {cell.name}: simulated runs", file=sys.stderr, flush=True)
      chosen = [*strategy_overrides(cfg, cell.strategy), *cell.overrides]
      sims = calibrate.simulated_measures(config_lib.load(calibrated, chosen), SIM_SEEDS[size])
      # The same calibration without the evaluations' cost: what the time model did before it had one.
      plain = calibrate.simulated_measures(
        config_lib.load(calibrated, [*chosen, "cluster.eval_time=0"]), PLAIN_SEEDS[size]
      )
      measured = [_measures(reals[i]["real"]) for i in range(n)]
      comparison = agreement.compare_runs(measured, sims, target=target)
      # Through a server, the same calibration with the server's card at one stream's rate: what the clock
      # charged before the shared card was measured.
      one_stream = None
      if cfg.cluster.server_link is not None and _through_server(cfg, cell):
        unshared = calibrate.simulated_measures(
          config_lib.load(calibrated, [*chosen, "cluster.server_link=null"]), PLAIN_SEEDS[size]
        )
        one_stream = agreement.compare_runs(measured, unshared, target=target)
      store.add(
        {
          "kind": "pair",
          "calibration": CALIBRATION,
          "rate_mbit": rate,
          "cell": cell.name,
          "strategy": cell.strategy,
          "variant": cell.variant,
          "size": size,
          "real_runs": n,
          "code": harness.code_version(),
          "simulated": [_summary(m) for m in sims],
          "comparison": comparison,
          "without_evaluation_cost": agreement.compare_runs(measured, plain, target=target),
          "card_at_one_stream": one_stream,
          "real_wall": [reals[i]["real_wall"] for i in range(n)],
          "worker_compute_ms": [x for i in range(n) for x in reals[i]["worker_compute_ms"]],
        }
      )
      t = comparison["time_to_target"]
      print(
        f"[{NAME}] {rate:g} Mbit/s, {cell.name}: time to target real {t['real']} (median of {n}), simulated "
        f"{t['simulated']} ({_pct(t['error'])})",
        file=sys.stderr,
        flush=True,
      )


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", choices=("tiny", "default"), default="default")
  parser.add_argument("--rates", help="comma-separated Mbit/s (default: the size's)")
  parser.add_argument(
    "--strategies", help="comma-separated (default: the size's; an extra cell comes with its strategy)"
  )
  parser.add_argument("--results-dir", type=pathlib.Path, default=None)
  parser.add_argument("--runs-dir", type=pathlib.Path, default=None)
  parser.add_argument("--report-only", action="store_true", help="rewrite the results file from the store")
  parser.add_argument(
    "--phase",
    choices=("real", "simulated", "both"),
    default="both",
    help="real: calibrations and real runs only (keep the machine otherwise idle); simulated: the simulated "
    "runs of stored real runs (default: both)",
  )
  args = parser.parse_args(argv)
  tiny = args.size == "tiny"
  results = args.results_dir or (
    harness.REPO / "runs" / "bench" / "tiny" if tiny else harness.REPO / "benchmarks" / "results"
  )
  runs = args.runs_dir or harness.REPO / "runs" / "bench" / ("tiny" if tiny else "") / NAME
  rates = [float(x) for x in args.rates.split(",")] if args.rates else RATES[args.size]
  names = args.strategies.split(",") if args.strategies else STRATEGIES[args.size]
  store = Store(results / f"{NAME}_runs.jsonl")
  # What measures the store (a report rewritten from it says the same).
  command = "python -m benchmarks.calibration.sim_vs_real" + (
    "" if args.size == "default" else f" --size {args.size}"
  )
  if not args.report_only and args.phase in ("real", "both"):
    run_real(store, runs, args.size, rates, names)
  if not args.report_only and args.phase in ("simulated", "both"):
    run_simulated(store, runs, args.size, rates, names)
    run_without_overlap(store, runs, args.size, rates, names)
  text = report(store, args.size, rates, names, command)
  results.mkdir(parents=True, exist_ok=True)
  (results / f"{NAME}.md").write_text(text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
