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
Adaptive k runs under two readings of which gradients are fresh (docs/algorithms.md §11e): computed on the
current step (jaxsync's default) and every arrival. Every strategy is tuned for each worker count on one
log-spaced grid (``GRID``, extended past an edge pick) at 98 MB and 10 GB/s on the held-out seed's
validation split (the last 10% of the training set, left out of its training), on the time to the target; the message sizes and server bandwidths of that worker count share its picks (tuning every
point would cost the map four times over). Every worker gets the same gradients (``PER_WORKER``) at every
worker count. Every point runs 3 seeds; a speed-up counts where Welch's test, Holm-corrected over the map's
points, says so; the verdict is decided again at half the budget. Every run is appended to
``benchmarks/results/adaptive_k_regimes_runs.jsonl``; ``--report-only`` rewrites the results file from it.

Sizes: tiny (the suite's: 4 workers, one message size, two servers, a one-rate grid, 75 gradients per
worker), default (3 worker counts x 3 message sizes x 3 servers, 300 gradients per worker, 3 seeds), full
(800 gradients per worker).

    python -m benchmarks.claims.adaptive_k_regimes [--size tiny|default|full] [--report-only]
"""

from __future__ import annotations

import sys

import matplotlib.pyplot as plt
import numpy as np

from benchmarks.common import harness
from benchmarks.speed import server_bound
from jaxsync._src.sim.time_model import server_bandwidth

COMPUTE_TIME = server_bound.COMPUTE_TIME
LINK_BYTES_PER_S = server_bound.LINK_BYTES_PER_S
WORKERS = {"tiny": (4,), "default": (8, 32, 64)}
MESSAGES = {"tiny": (98e6,), "default": (25e6, 98e6, 250e6)}  # bytes; 98 MB: ResNet-50 (Table 2)
SERVERS = {"tiny": (None, "3GB/s"), "default": ("30GB/s", "10GB/s", "3GB/s")}
PER_WORKER = {"tiny": 75, "default": 300, "full": 800}
GRID = (0.001, 0.003, 0.01, 0.03)
TINY_GRID = (0.01,)
TARGET = {"tiny": 0.5, "default": 0.75, "full": 0.75}
# label -> (registry name, options)
STRATEGIES = {
  "ASP": ("asp", {}),
  "adaptive k": ("adaptive_k", {}),
  "adaptive k, every arrival fresh": ("adaptive_k", {"fresh_staleness": None}),
}
KEYS = {"ASP": "asp", "adaptive k": "ak", "adaptive k, every arrival fresh": "ak_all"}
PAPER_NAME = "adaptive k (the regime map)"


def point_overrides(
  size: str, workers: int, message: float, server: str | None, fraction: float = 1.0
) -> list[str]:
  """One point of the map: ``server_bound.py``'s setup at these values, about 40 evaluations per run
  (``fraction``: of the budget, for the half-budget check)."""
  gradients = int(PER_WORKER[size] * workers * fraction)
  receive = message / LINK_BYTES_PER_S
  memory = server_bandwidth(server)
  per_gradient = max(COMPUTE_TIME / workers, receive + (3 * message / memory if memory else 0.0))
  return [
    *server_bound.overrides(server, gradients, workers, message, gradients * per_gradient / 40),
    f"run.target_accuracy={TARGET[size]}",
  ]


def map_points(bench, args, size, rates, fraction=1.0):
  """Every point of the map at the tuned rates: ``({point: {strategy key: mean measures}}, table rows,
  commands, {point: {label: Cell}})``."""
  found, rows, commands, cells = {}, [], [], {}
  half = "" if fraction == 1.0 else f", {fraction:g} of the budget"
  for workers in WORKERS[size]:
    for message in MESSAGES[size]:
      for server in SERVERS[size]:
        sets = point_overrides(args.size, workers, message, server, fraction)
        config = bench.config("fashion_mnist", sets)
        setting = f"{workers} workers, {message / 1e6:.0f} MB, server {server or 'free'}{half}"
        point, row = {}, {}
        for label, (name, options) in STRATEGIES.items():
          cell = bench.run(
            config,
            name,
            setting=setting,
            label=label,
            options={**options, "learning_rate": rates[workers][label]},
            config_name="fashion_mnist",
            overrides=sets,
            measure=lambda result, exp, s=server, m=message: server_bound.measure(
              result, exp.strategy.server_traffic, server_bandwidth(s), m, m / LINK_BYTES_PER_S
            ),
          )
          row[label] = cell
          if not cell.results:
            continue
          # The seeds' mean of every measure; the time and gradients to the target at the crossing that holds.
          m = {key: float(np.mean([x[key] for x in cell.measures])) for key in cell.measures[0]}
          m["time"] = cell.mean("time_to_target_held")
          hits = [harness.gradients_to(r, TARGET[args.size]) for r in cell.results]
          m["gradients"] = None if any(g is None for g in hits) else float(np.mean(hits))
          m["times"] = cell.values("time_to_target_held")
          m["width"] = harness.crossing_width(cell)
          point[KEYS[label]] = m
          commands.append(cell.command)
        cells[(workers, message, server)] = row
        if len(point) < len(STRATEGIES):  # --report-only, a run the store lacks
          rows.append([str(workers), f"{message / 1e6:.0f} MB", server or "free", *["missing"] * 12])
          continue
        asp, ak, ak_all = point["asp"], point["ak"], point["ak_all"]
        # The load: gradients/s the workers offer over what ASP's server can take (> 1: server-bound).
        load = (workers / COMPUTE_TIME) / asp["bound"]

        def speedup(other, asp=asp):
          return asp["time"] / other["time"] if asp["time"] and other["time"] else None

        found[(workers, message, server)] = {
          "asp": asp, "ak": ak, "ak_all": ak_all, "load": load, "speedup": speedup(ak), "speedup_all": speedup(ak_all),
        }  # fmt: skip
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
            harness.ratio(asp["gradients"], ak["gradients"]),
            f"{asp['accuracy']:.3f} / {ak['accuracy']:.3f} / {ak_all['accuracy']:.3f}",
            "-" if speedup(ak) is None else f"{speedup(ak):.2f}x",
            "-" if speedup(ak_all) is None else f"{speedup(ak_all):.2f}x",
          ]
        )
  return found, rows, commands, cells


def _width(*measured: dict) -> float | None:
  """The larger evaluation interval around the crossings of two cells (``harness.crossing_width``)."""
  return max((m["width"] for m in measured if m.get("width") is not None), default=None)


def decide(found: dict) -> dict[str, tuple[str, str]]:
  """Where each reading beats ASP: points faster in the mean, and significantly (``harness.time_test``:
  Welch, or a rank test where a seed missed the target; Holm over the points)."""
  out = {}
  for key, label in (("ak", "adaptive k"), ("ak_all", "adaptive k, every arrival fresh")):
    tests = {
      point: harness.time_test(v["asp"]["times"], v[key]["times"], within=_width(v["asp"], v[key]))
      for point, v in found.items()
    }
    adjusted = dict(zip(tests, harness.holm([t["p"] for t in tests.values()])))
    speed = "speedup" if key == "ak" else "speedup_all"
    tested = [p for p, v in found.items() if v[key]["time"] is not None or v["asp"]["time"] is not None]
    faster = [
      p
      for p, v in found.items()
      if v[key]["time"] is not None and (v["asp"]["time"] is None or (v[speed] or 0) > 1)
    ]
    sure = [p for p in faster if adjusted[p] < 0.05]

    def where(points):
      return ", ".join(f"{w} workers {m / 1e6:.0f} MB {s or 'free'}" for w, m, s in points) or "nowhere"

    ratios = [v[speed] for v in found.values() if v[speed] is not None]
    out[f"where {label} beats ASP: worker count x message size x server bandwidth"] = (
      f"**{'nowhere' if not sure else 'everywhere' if len(sure) == len(tested) else 'at some settings'}**",
      f"of {len(found)} settings, {len(tested)} testable (either reaches the target); faster than ASP in the mean"
      f" at {len(faster)} ({where(faster)}), significantly after Holm at {len(sure)} ({where(sure)})"
      + (f"; speed-ups {min(ratios):.2f}x to {max(ratios):.2f}x where both reach it" if ratios else ""),
      harness.Comparisons(
        harness.Comparison(
          f"{w} workers {m / 1e6:.0f} MB {sv or 'free'}: speed-up over ASP (log)",
          None if not v[speed] else float(np.log(v[speed])),
          adjusted[(w, m, sv)],
          harness.log_ratio_se(v[key]["times"], v["asp"]["times"]),
        )
        for (w, m, sv), v in found.items()
      ),
      harness.Deciding(
        f"significantly faster than ASP at {len(sure)} of {len(tested)} settings"
        + (f"; at best {max(ratios):.2f}x" if ratios else "")
      ),
    )
  return out


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  args = harness.parser(__doc__).parse_args(argv)
  bench = harness.Benchmark(
    "adaptive_k_regimes",
    "Where adaptive k wins: speed-up over ASP across server bandwidth, message size and worker count",
    args,
    argv,
    seeds=3,
    full_seeds=3,
  )
  size = "tiny" if args.size == "tiny" else "default"
  rates: dict[int, dict[str, float]] = {}
  for workers in WORKERS[size]:
    tuning_point = (workers, 98e6, "10GB/s" if size != "tiny" else "3GB/s")
    rates[workers], grid_table = bench.tune(
      bench.config("fashion_mnist", point_overrides(args.size, *tuning_point)),
      STRATEGIES,
      TINY_GRID if size == "tiny" else GRID,
      objective="time",
      extend=size != "tiny",
      setting=f"lr grid, {workers} workers",
    )
    bench.section(
      f"Learning rates at {workers} workers: every strategy on the same grid at {tuning_point[1] / 1e6:.0f} MB,"
      f" server {tuning_point[2]}, seed {harness.TUNING_SEED}",
      grid_table + f"\n\n**Bold**: the rate used at every point with {workers} workers.",
    )
  found, rows, commands, _ = map_points(bench, args, size, rates)
  target = TARGET[args.size]
  bench.section(
    f"The map: ASP against adaptive k, {PER_WORKER[args.size]} gradients per worker, to accuracy {target},"
    f" mean over {bench.seeds} seed(s)",
    "*load*: the gradients/s the workers offer over what ASP's server can take, "
    "`(K / c) (n/B + (a + r) n/M)` (above 1 ASP is server-bound); *throughput*: adaptive k's gradients/s"
    " over ASP's; *efficiency*: ASP's gradients to the target over adaptive k's; *speed-up*: ASP's simulated"
    " time to the target over adaptive k's (about throughput x efficiency; > 1: adaptive k wins); the last"
    " column: the same for adaptive k with every arrival fresh.\n\n"
    + harness.table(
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
        "final accuracy (ASP / adaptive k / every arrival fresh)",
        "speed-up",
        "speed-up, every arrival fresh",
      ],
      rows,
    ),
  )
  bench.section("Where it wins and where it loses", findings(found, rates))
  full = decide(found)
  half_found, *_ = map_points(bench, args, size, rates, fraction=0.5)
  half = decide(half_found)
  picks = "; ".join(
    f"{w} workers: " + ", ".join(f"{label} {r:g}" for label, r in rates[w].items()) for w in rates
  )
  budget = f"{PER_WORKER[args.size]} gradients per worker"
  bench.decided(PAPER_NAME, full, half, budget=budget, seeds=str(bench.seeds), picks=picks)
  bench.section("Commands (one run each)", harness.code(commands[:2]))
  bench.figure("speedup_map", figure(found, WORKERS[size], MESSAGES[size], SERVERS[size]))
  bench.write()
  return 0


def _count(value: float | None) -> str:
  """Gradients to the target (a mean over the seeds) as a whole number, "-" where a seed missed it."""
  return "-" if value is None else f"{value:.0f}"


def findings(found: dict, rates: dict[int, dict[str, float]]) -> str:
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
      " points over ASP)."
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
      " a momentum-weighted sum of ~K gradients that needs a small learning rate (tuned: "
      + "; ".join(f"{w} workers adaptive k {r['adaptive k']:g}, ASP {r['ASP']:g}" for w, r in rates.items())
      + "), while ASP makes G updates. That scheduling, not the tests, sets the update count: it is"
      " jaxsync's default reading of the paper's §4 (the fresh set is the gradients computed on the current"
      " step); with every arrival fresh (the last column) adaptive k makes about G/k updates."
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
