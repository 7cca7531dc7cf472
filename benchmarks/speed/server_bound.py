"""A parameter server bound by its memory bandwidth: ASP against adaptive-k, server-side SGD against Adam.

Zhang, Ji, Wang (JPDC 2022, §3.6) argue that on a fast network the parameter
server's CPU, bound by memory bandwidth, becomes the bottleneck of asynchronous
training, that server-side Adam or RMSProp make it worse, and that buffering k
gradients per update relieves it. This benchmark puts that argument on the
simulator's clock, side by side in one run: the paper's ResNet-50 clock
(its 98 MB gradient and 0.86 s per step, Tables 2 and 4; 32 workers) over its
fastest network (100 Gbit/s, the HDGib cluster) against servers of 3, 10 and 30 GB/s effective memory
bandwidth, and a server that costs nothing.

The server's time per arrival is ``(a + r [released]) n / M``: ``a`` arrays
read and written to accumulate an arrival, ``r`` per update
(``Strategy.server_traffic``), ``n`` bytes per array, ``M`` the bandwidth.
The server receives a push and applies it in one loop (``TimeModel``), so a
server that never idles caps the gradient rate at ``1 / (n/B + (a + r/k) n/M)``
for ``k`` gradients per update over a link of ``B`` bytes/s, which the table
prints next to the measured rate. The model that learns is a small MLP on
Fashion-MNIST (only the clock is ResNet-50's), so the accuracy column says
that every run still trains, not what ResNet-50 would reach.

Sizes: tiny (the suite's: 3 GB/s only, ASP and adaptive-k with SGD, 300
gradients), default (2000 gradients per run, about 1.2 minutes on 2 CPU cores),
full (8000 gradients).

    python -m benchmarks.speed.server_bound [--size tiny|default|full]
"""

from __future__ import annotations

import sys

import matplotlib.pyplot as plt
import numpy as np

from benchmarks.common import harness
from jaxsync._src.sim.time_model import server_bandwidth

TITLE = "A server bound by memory bandwidth: ASP vs adaptive-k (JPDC 2022, §3.6), on the simulator's clock"
MESSAGE_BYTES = 98_000_000  # ResNet-50's gradient, float32 (JPDC 2022, Table 2)
COMPUTE_TIME = 0.86  # seconds per ResNet-50 worker-step (JPDC 2022, Table 4)
WORKERS = 32
LINK_BYTES_PER_S = 100e9 / 8  # 100 Gbit/s
RECEIVE = MESSAGE_BYTES / LINK_BYTES_PER_S  # seconds a push occupies the server's receive side
# (strategy, server optimizer, learning rate): each rule's rate from configs/adaptive_k_comparison.yaml;
# Adam at its usual 1e-3 for both. Rates are not tuned here: the benchmark measures the clock.
RUNS = {
  "tiny": [("asp", "sgd", 0.01), ("adaptive_k", "sgd", 0.001)],
  "default": [
    ("asp", "sgd", 0.01),
    ("asp", "adam", 0.001),
    ("adaptive_k", "sgd", 0.001),
    ("adaptive_k", "adam", 0.001),
  ],
}
BANDWIDTHS = {"tiny": ["3GB/s"], "default": [None, "3GB/s", "10GB/s", "30GB/s"]}
GRADIENTS = {"tiny": 300, "default": 2000, "full": 8000}


def overrides(
  bandwidth: str | None,
  gradients: int,
  workers: int = WORKERS,
  message_bytes: float = MESSAGE_BYTES,
  eval_every_time: float = 25.0,
) -> list[str]:
  """``configs/fashion_mnist.yaml`` with the paper's clock, an MLP, a constant rate and no decay."""
  return [
    "model.name=mlp",
    f"cluster.num_workers={workers}",
    f"cluster.compute_time={COMPUTE_TIME}",
    "cluster.slow_fraction=0",
    "cluster.link=100gbps",
    f"cluster.message_bytes={message_bytes:.0f}",
    f"cluster.server_bandwidth={'null' if bandwidth is None else bandwidth}",
    "strategy.schedule.kind=constant",
    "strategy.schedule.unit=updates",
    "strategy.schedule.warmup=0",
    f"run.gradients={gradients}",
    "run.eval_every=null",
    f"run.eval_every_time={eval_every_time:.4g}",
    f"run.chunk={min(gradients, 500)}",
    "run.checkpoint_every=null",
  ]


def measure(
  result, traffic, bandwidth: float | None, message_bytes: float = MESSAGE_BYTES, receive: float = RECEIVE
) -> dict[str, float]:
  """Steady-state rates over the last three quarters of the events, and the server's bound there.

  ``traffic``: the strategy's ``server_traffic``; ``bandwidth``: the server's memory bandwidth (None: free);
  ``receive``: seconds one push occupies the server's interface."""
  h = result.history
  start = len(h.time) // 4
  seconds = float(h.time[-1] - h.time[start])
  arrivals = len(h.time) - 1 - start
  updates = int(h.released[start + 1 :].sum())
  k = arrivals / max(updates, 1)  # gradients per update (adaptive k: its fresh k plus the stale ones merged)
  released = h.released[start + 1 :]
  arrays_per_gradient = traffic.arrival + traffic.release / k
  busy = arrays_per_gradient * arrivals * message_bytes / bandwidth if bandwidth else 0.0
  return {
    "gradients_per_s": arrivals / seconds,
    "updates_per_s": updates / seconds,
    "k": k,
    "released_k": float(h.k[start + 1 :][released].mean()) if released.any() else float("nan"),
    "arrays_per_gradient": arrays_per_gradient,
    "busy": busy / seconds,
    "bound": 1.0 / (receive + arrays_per_gradient * message_bytes / bandwidth)
    if bandwidth
    else 1.0 / receive,
    "accuracy": result.summary.get("final_accuracy") or float("nan"),
  }


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  args = harness.parser(__doc__).parse_args(argv)
  bench = harness.Benchmark("server_bound", TITLE, args, argv, seeds=1, full_seeds=1)
  size = "tiny" if args.size == "tiny" else "default"
  offered = WORKERS / COMPUTE_TIME
  rows, commands, found = [], [], {}
  for bandwidth in BANDWIDTHS[size]:
    sets = overrides(bandwidth, GRADIENTS[args.size])
    config = bench.config("fashion_mnist", sets)
    setting = f"server {bandwidth or 'free'}"
    for strategy, optimizer, rate in RUNS[size]:
      options = {"learning_rate": rate, "server_optimizer": optimizer}
      label = f"{strategy} ({optimizer})"
      cell = bench.run(
        config,
        strategy,
        setting=setting,
        label=label,
        options=options,
        config_name="fashion_mnist",
        overrides=sets,
        measure=lambda result, exp, b=bandwidth: measure(
          result, exp.strategy.server_traffic, server_bandwidth(b)
        ),
      )
      if not cell.measures:
        rows.append([setting, label, *["missing"] * 10])
        continue
      m = cell.measures[0]
      found[(bandwidth, label)] = m
      base = found.get((bandwidth, "asp (sgd)"))
      same = found.get((bandwidth, f"asp ({optimizer})"))
      rows.append(
        [
          setting,
          label,
          f"{m['arrays_per_gradient']:.2f}",
          f"{m['k']:.2f}",
          f"{m['gradients_per_s']:.1f}",
          f"{m['gradients_per_s'] / offered:.2f}",
          f"{m['updates_per_s']:.1f}",
          "-" if bandwidth is None else f"{m['busy'] * 100:.0f}%",
          f"{m['bound']:.1f}",
          f"{m['gradients_per_s'] / base['gradients_per_s']:.2f}x" if base else "-",
          f"{m['gradients_per_s'] / same['gradients_per_s']:.2f}x" if same else "-",
          f"{m['accuracy']:.3f}",
        ]
      )
      commands.append(cell.command)
  bench.section(
    "Gradients per second through the server",
    f"{WORKERS} workers offer {offered:.1f} gradients/s ({COMPUTE_TIME} s per step); messages of "
    f"{MESSAGE_BYTES / 1e6:.0f} MB over 100 Gbit/s ({RECEIVE * 1e3:.2f} ms each way "
    "through the server's interface). *arrays/gradient*: the server's memory traffic per gradient, "
    "`a + r/k`; *bound*: `1 / (n/B + (a + r/k) n/M)`, the rate of a server that never idles (it receives "
    "and applies in one loop); *memory busy*: the share of the time its memory traffic takes; *vs ASP*: gradients/s against ASP with SGD, or with the same server optimizer, on the same server.\n\n"
    + harness.table(
      [
        "server",
        "strategy (server optimizer)",
        "arrays/gradient",
        "gradients per update",
        "gradients/s",
        "of offered",
        "updates/s",
        "memory busy",
        "bound",
        "vs ASP (SGD)",
        "vs ASP, same optimizer",
        "final accuracy",
      ],
      rows,
    ),
  )
  bench.section("Findings", findings(found, BANDWIDTHS[size]))
  bench.section("Commands (one run each)", harness.code(commands))
  bench.figure("gradients_per_second", figure(found, BANDWIDTHS[size], offered))
  bench.write()
  return 0


def findings(found: dict, bandwidths: list) -> str:
  """What the table says, in numbers computed from it."""
  lines = []
  for bandwidth in bandwidths:
    if bandwidth is None:
      continue
    asp, ak = found.get((bandwidth, "asp (sgd)")), found.get((bandwidth, "adaptive_k (sgd)"))
    if asp and ak:
      lines.append(
        f"- Server {bandwidth}: ASP (SGD) runs at {asp['gradients_per_s']:.1f} gradients/s, "
        f"{asp['gradients_per_s'] / asp['bound']:.2f} of its bound, its memory busy {asp['busy'] * 100:.0f}% "
        f"of the time; adaptive-k (SGD) at {ak['gradients_per_s']:.1f} ({ak['k']:.2f} gradients per update, "
        f"{ak['gradients_per_s'] / asp['gradients_per_s']:.2f}x ASP)."
      )
    asp_adam, ak_adam = found.get((bandwidth, "asp (adam)")), found.get((bandwidth, "adaptive_k (adam)"))
    if asp_adam and ak_adam:
      lines.append(
        f"  With Adam on the server: ASP {asp_adam['gradients_per_s']:.1f} gradients/s, adaptive-k "
        f"{ak_adam['gradients_per_s']:.1f} ({ak_adam['gradients_per_s'] / asp_adam['gradients_per_s']:.2f}x)."
      )
  ks = [m["k"] for (_, label), m in found.items() if label.startswith("adaptive_k")]
  fresh = [m["released_k"] for (_, label), m in found.items() if label.startswith("adaptive_k")]
  if ks:
    lines.append(
      f"- adaptive-k's updates combined {min(ks):.1f} to {max(ks):.1f} gradients on average (of {WORKERS}"
      f" workers), though its tests released at k = {min(fresh):.1f} to {max(fresh):.1f} fresh ones: a"
      " gradient is fresh only if computed on the newest parameters, which after a release only the k"
      " released workers hold, so the next release comes about one compute time later, and meanwhile the"
      " other workers' stale gradients are merged into it (docs/algorithms.md §11b, §11d). One update per"
      " compute time is what buffers about K gradients per update, whatever the tests decide."
    )
  lines.append(
    "- Buffering is not free: accumulating a gradient reads it and reads and writes the sum (3 arrays), "
    "as many as plain SGD's whole update. So adaptive-k relieves a server mainly against an expensive "
    "update (momentum, Adam: 5-7 arrays plus its own statistics), and only when it buffers more than "
    "about 2 gradients per update; with SGD on the server it cannot beat ASP's 3 arrays per gradient."
  )
  return "\n".join(lines)


def figure(found: dict, bandwidths: list, offered: float):
  labels = sorted({label for (_, label) in found}, key=lambda s: (s.split()[0] != "asp", s))
  figure, ax = plt.subplots(figsize=(7.5, 4.2))
  width = 0.8 / max(len(labels), 1)
  x = np.arange(len(bandwidths))
  for i, label in enumerate(labels):
    ax.bar(
      x + i * width,
      [found.get((b, label), {}).get("gradients_per_s", np.nan) for b in bandwidths],
      width,
      label=label,
    )
  ax.axhline(offered, color="grey", linestyle="--", label=f"offered ({offered:.1f}/s)")
  ax.set_xticks(x + width * (len(labels) - 1) / 2, [b or "free" for b in bandwidths])
  ax.set_xlabel("server memory bandwidth")
  ax.set_ylabel("gradients / simulated s")
  ax.legend(fontsize="small")
  figure.tight_layout()
  return figure


if __name__ == "__main__":
  sys.exit(main())
