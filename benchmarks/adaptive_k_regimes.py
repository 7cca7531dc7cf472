"""Where adaptive k wins: its speed-up over ASP across server bandwidth, message size and worker count.

Zhang, Ji, Wang (JPDC 2022) report adaptive k up to 2.25x faster than ASP on their GPU cluster and 1.58x on
their CPU one. This benchmark maps the regime instead of one point: on the simulator's clock (compute 0.86 s
per worker-step, ResNet-50's, the paper's Table 4; a 100 Gbit/s link), it sweeps the worker count, the message
size and the parameter server's memory bandwidth, and runs ASP and adaptive k at every point, side by side.

A speed-up in time to the target is the product of two ratios, both printed:

- *throughput*: gradients per simulated second through the server. ASP's server applies every arrival (``a + r``
  parameter-sized arrays of memory traffic, ``Strategy.server_traffic``); adaptive k accumulates each
  (``a``) and applies one update per ``k`` (``r / k``), and its fresh workers wait for the release.
- *gradient efficiency*: the gradients ASP needs to the target over the gradients adaptive k needs (ASP's
  gradients are up to ``K - 1`` updates stale; adaptive k's update averages ``k`` of them with momentum).

The learning model is the MLP on Fashion-MNIST (only the clock is ResNet-50's; ``server_bound.py``'s setup), so
the gradient-efficiency column is this workload's, and the tests' k is whatever its gradients' noise decides.
Both strategies' learning rates are tuned on the same grid (``GRID``) at 32 workers, 98 MB, 10 GB/s on the
held-out seed.

Sizes: tiny (the suite's: 4 workers, one message size, two servers, a one-rate grid, 300 gradients),
default (3 worker counts x 3 message sizes x 3 servers, 3000 gradients, about 15 min on 2 cores), full
(8000 gradients).

    python benchmarks/adaptive_k_regimes.py [--size tiny|default|full]
"""

from __future__ import annotations

import sys

import _harness
import matplotlib.pyplot as plt
import numpy as np
import server_bound

from jaxsync._src.sim.time_model import server_bandwidth

COMPUTE_TIME = server_bound.COMPUTE_TIME
LINK_BYTES_PER_S = server_bound.LINK_BYTES_PER_S
WORKERS = {"tiny": (4,), "default": (8, 32, 64)}
MESSAGES = {"tiny": (98e6,), "default": (25e6, 98e6, 250e6)}  # bytes; 98 MB: ResNet-50 (Table 2)
SERVERS = {"tiny": (None, "3GB/s"), "default": ("30GB/s", "10GB/s", "3GB/s")}
GRADIENTS = {"tiny": 300, "default": 3000, "full": 8000}
GRID = (0.001, 0.003, 0.01, 0.03)
TINY_GRID = (0.01,)
TARGET = {"tiny": 0.5, "default": 0.72, "full": 0.72}
STRATEGIES = {"asp": "ASP", "adaptive_k": "adaptive k"}


def point_overrides(size: str, workers: int, message: float, server: str | None) -> list[str]:
  """One point of the map: ``server_bound.py``'s setup at these values, about 40 evaluations per run."""
  gradients = GRADIENTS[size]
  receive = message / LINK_BYTES_PER_S
  memory = server_bandwidth(server)
  per_gradient = max(COMPUTE_TIME / workers, receive + (3 * message / memory if memory else 0.0))
  return [
    *server_bound.overrides(server, gradients, workers, message, gradients * per_gradient / 40),
    f"run.target_accuracy={TARGET[size]}",
  ]


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  args = _harness.parser(__doc__).parse_args(argv)
  bench = _harness.Benchmark(
    "adaptive_k_regimes",
    "Where adaptive k wins: speed-up over ASP across server bandwidth, message size and worker count",
    args,
    argv,
    seeds=1,
    full_seeds=1,
  )
  size = "tiny" if args.size == "tiny" else "default"
  tuning_point = (WORKERS[size][-1] if size == "tiny" else 32, 98e6, "10GB/s" if size != "tiny" else "3GB/s")
  rate, grid_table = bench.tune(
    bench.config("fashion_mnist", point_overrides(args.size, *tuning_point)),
    {label: (name, {}) for name, label in STRATEGIES.items()},
    TINY_GRID if size == "tiny" else GRID,
  )
  bench.section(
    f"Learning rates: both on the same grid at {tuning_point[0]} workers, {tuning_point[1] / 1e6:.0f} MB,"
    f" server {tuning_point[2]}, seed {_harness.TUNING_SEED}",
    grid_table + "\n\nFinal test accuracy %; **bold**: the rate used at every point.",
  )
  found = {}
  rows, commands = [], []
  for workers in WORKERS[size]:
    for message in MESSAGES[size]:
      for server in SERVERS[size]:
        sets = point_overrides(args.size, workers, message, server)
        config = bench.config("fashion_mnist", sets)
        setting = f"{workers} workers, {message / 1e6:.0f} MB, server {server or 'free'}"
        point = {}
        for name, label in STRATEGIES.items():
          cell = bench.run(
            config,
            name,
            setting=setting,
            label=label,
            options={"learning_rate": rate[label]},
            config_name="fashion_mnist",
            overrides=sets,
            measure=lambda result, exp, s=server, m=message: server_bound.measure(
              result, exp.strategy.server_traffic, server_bandwidth(s), m, m / LINK_BYTES_PER_S
            ),
          )
          if not cell.results:
            continue
          result = cell.results[0]
          m = dict(cell.measures[0])
          hit = result.history.time_to("accuracy", TARGET[args.size], holds=True)
          m["time"] = hit[0] if hit else None
          m["gradients"] = _harness.gradients_to(result.history, TARGET[args.size])
          point[name] = m
          commands.append(cell.command)
        if len(point) < len(STRATEGIES):  # --report-only, a run the store lacks
          rows.append([str(workers), f"{message / 1e6:.0f} MB", server or "free", *["missing"] * 11])
          continue
        asp, ak = point["asp"], point["adaptive_k"]
        # The load: gradients/s the workers offer over what ASP's server can take (> 1: server-bound).
        load = (workers / COMPUTE_TIME) / asp["bound"]
        speedup = asp["time"] / ak["time"] if asp["time"] and ak["time"] else None
        found[(workers, message, server)] = {"asp": asp, "ak": ak, "load": load, "speedup": speedup}
        rows.append(
          [
            str(workers),
            f"{message / 1e6:.0f} MB",
            server or "free",
            f"{load:.2f}",
            f"{asp['gradients_per_s']:.1f}",
            f"{ak['gradients_per_s']:.1f}",
            f"{ak['gradients_per_s'] / asp['gradients_per_s']:.2f}x",
            f"{ak['released_k']:.1f}",
            f"{ak['k']:.1f}",
            _count(asp["gradients"]),
            _count(ak["gradients"]),
            _harness.ratio(asp["gradients"], ak["gradients"]),
            f"{asp['accuracy']:.3f} / {ak['accuracy']:.3f}",
            "-" if speedup is None else f"{speedup:.2f}x",
          ]
        )
  target = TARGET[args.size]
  bench.section(
    f"The map: ASP against adaptive k, {GRADIENTS[args.size]} gradients, to accuracy {target}",
    "*load*: the gradients/s the workers offer over what ASP's server can take, "
    "`(K / c) (n/B + (a + r) n/M)` (above 1 ASP is server-bound); *throughput*: adaptive k's gradients/s"
    " over ASP's; *efficiency*: ASP's gradients to the target over adaptive k's; *speed-up*: ASP's simulated"
    " time to the target over adaptive k's (about throughput x efficiency; > 1: adaptive k wins).\n\n"
    + _harness.table(
      [
        "workers",
        "message",
        "server",
        "load",
        "ASP gradients/s",
        "adaptive k gradients/s",
        "throughput",
        "released k",
        "gradients per update",
        f"ASP gradients to {target}",
        f"adaptive k gradients to {target}",
        "efficiency",
        "final accuracy (ASP / adaptive k)",
        "speed-up",
      ],
      rows,
    ),
  )
  bench.section("Where it wins and where it loses", findings(found, rate))
  bench.section("Commands (one run each)", _harness.code(commands[:2]))
  bench.figure("speedup_map", figure(found, WORKERS[size], MESSAGES[size], SERVERS[size]))
  bench.write()
  return 0


def _count(value: int | None) -> str:
  return "-" if value is None else str(value)


def findings(found: dict, rate: dict[str, float]) -> str:
  """Where adaptive k wins, where it loses, and which of the two ratios decides, from the map's numbers."""
  points = list(found.items())
  if not points:
    return "- No point of the map is in the results store yet."
  wins = [(key, v) for key, v in points if v["speedup"] is not None and v["speedup"] > 1]
  missed = [key for key, v in points if v["ak"]["time"] is None]
  tested = [key for key, v in points if v["ak"]["time"] is not None or v["asp"]["time"] is not None]
  lines = [
    f"- Adaptive k reached the target sooner than ASP at {len(wins)} of {len(points)} points"
    + (f"; it never reached it at {len(missed)}" if missed else "")
    + f". The claim is tested at {len(tested)} of them (where either strategy reached the target)."
  ]
  if wins:
    best_key, best = max(wins, key=lambda kv: kv[1]["speedup"])
    lines.append(
      f"- Its best point: {best_key[0]} workers, {best_key[1] / 1e6:.0f} MB, server {best_key[2] or 'free'}"
      f" (load {best['load']:.2f}): {best['speedup']:.2f}x, throughput"
      f" {best['ak']['gradients_per_s'] / best['asp']['gradients_per_s']:.2f}x."
    )
  neither = [(key, v) for key, v in points if v["asp"]["time"] is None and v["ak"]["time"] is None]
  if neither:
    ahead = [key for key, v in neither if v["ak"]["accuracy"] > v["asp"]["accuracy"]]
    gaps = [100 * (v["ak"]["accuracy"] - v["asp"]["accuracy"]) for _, v in neither]
    lines.append(
      f"- Neither reached it at {len(neither)} points ({', '.join(sorted({f'{k[0]} workers' for k, _ in neither}))});"
      f" there adaptive k ended more accurate at {len(ahead)} of them ({min(gaps):+.1f} to {max(gaps):+.1f}"
      " points over ASP). Both rates were tuned at 32 workers: ASP's staleness grows with K, adaptive k's"
      " averaging does not, so this says more about ASP at a rate tuned for fewer workers than about speed."
    )
  throughputs = [v["ak"]["gradients_per_s"] / v["asp"]["gradients_per_s"] for _, v in points]
  efficiencies = [
    v["asp"]["gradients"] / v["ak"]["gradients"]
    for _, v in points
    if v["asp"]["gradients"] and v["ak"]["gradients"]
  ]
  lines.append(
    f"- Throughput (adaptive k's gradients/s over ASP's) ranges {min(throughputs):.2f}x to {max(throughputs):.2f}x:"
    " with SGD on the server, ASP's update costs as much memory traffic as accumulating one gradient (3 arrays),"
    " so buffering k gradients can save at most the update's share, and when the workers are the bottleneck"
    " adaptive k's fresh workers idle until the release."
  )
  if efficiencies:
    by_workers = sorted({key[0] for key, _ in points})
    per_update = ", ".join(
      f"{w} workers: {np.mean([v['ak']['k'] for key, v in points if key[0] == w]):.1f}" for w in by_workers
    )
    released = [v["ak"]["released_k"] for _, v in points]
    lines.append(
      f"- Gradient efficiency (ASP's gradients to the target over adaptive k's) ranges {min(efficiencies):.2f}x"
      f" to {max(efficiencies):.2f}x where both reached it. The tests release at k = {min(released):.1f} to"
      f' {max(released):.1f} fresh gradients (the paper\'s "usually less than 5"), yet an update combines'
      f" about K gradients ({per_update}): a gradient is fresh only if computed on the newest parameters,"
      " which after a release only the k released workers hold, so the next release comes about one compute"
      " time later and merges every stale gradient that arrived meanwhile, weighted gamma^(S-j)/k"
      " (docs/algorithms.md §11b, §11d). So adaptive k makes about G/K updates, as synchronous SGD does, each"
      " a momentum-weighted sum of ~K gradients that needs a small learning rate (tuned: adaptive k"
      f" {rate['adaptive k']:g}, ASP {rate['ASP']:g}), while ASP makes G updates. That scheduling, not the tests, sets the update count: it is"
      " jaxsync's reading of the paper's §4 (the fresh set is the gradients computed on the current step)."
    )
  return "\n".join(lines)


def figure(found: dict, workers: tuple, messages: tuple, servers: tuple):
  """A panel per worker count, a line per message size, against the server's memory bandwidth: the
  speed-up over ASP to the target (top) and adaptive k's final accuracy minus ASP's (bottom)."""
  fig, axes = plt.subplots(2, len(workers), figsize=(4.0 * len(workers), 6.4), sharey="row", squeeze=False)
  x = np.arange(len(servers))
  for column, w in enumerate(workers):
    top, bottom = axes[0][column], axes[1][column]
    for message in messages:
      points = [found.get((w, message, s)) for s in servers]  # None: not in the store yet
      speedups = [np.nan if p is None or p["speedup"] is None else p["speedup"] for p in points]
      (line,) = top.plot(x, speedups, "o-", label=f"{message / 1e6:.0f} MB")
      gaps = [np.nan if p is None else 100 * (p["ak"]["accuracy"] - p["asp"]["accuracy"]) for p in points]
      bottom.plot(x, gaps, "o-", color=line.get_color())
    top.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    bottom.axhline(0.0, color="grey", linestyle="--", linewidth=1)
    top.set_title(f"{w} workers")
    for ax in (top, bottom):
      ax.set_xticks(x, [s or "free" for s in servers])
      ax.grid(alpha=0.3)
    bottom.set_xlabel("server memory bandwidth")
  axes[0][0].set_ylabel("speed-up over ASP to the target")
  axes[1][0].set_ylabel("final accuracy - ASP's (points)")
  axes[0][-1].legend(fontsize="small")
  fig.tight_layout()
  return fig


if __name__ == "__main__":
  sys.exit(main())
