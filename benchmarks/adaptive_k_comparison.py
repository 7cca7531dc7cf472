"""Adaptive k (JPDC 2022): adaptive-k synchronization against its baselines on three networks, and a fixed-k sweep.

Reproduces the comparisons of Zhang, Ji, Wang (JPDC 2022; docs/algorithms.md §11, §16): ASP, BSP, SSP (s = 3),
EASGD ("EAO", the period of the paper's Table 3), DropWorker (50% dropped), ring all-reduce and the adaptive-k
model with and without per-worker Barzilai-Borwein step sizes, at 32 workers under the 1, 10 and 100 Gbit/s
presets. The learning happens on Fashion-MNIST with a LeNet (``--data digits``: the digits CNN); the *clock* is
the paper's: each worker-step takes the paper's measured compute time (Table 4, Cp), each message is the paper's
model (Table 2), and the server's memory bandwidth costs time (10 GB/s), so the communication-to-computation
balance is the paper's:

  1 Gbit/s    CPU cluster,  ResNet34   (83 MB, Cp 23 s),    EAO every 20 steps
  10 Gbit/s   GPU cluster,  ResNet101  (171 MB, Cp 0.89 s), EAO every 10 steps
  100 Gbit/s  HDGib,        ResNet101  (171 MB, Cp 0.89 s), EAO every 10 steps

Every strategy's learning rate is tuned on the same grid (``GRID``) at 10 Gbit/s on a held-out seed and used on
every network. Reported: updates and simulated time to the target accuracy, the speed-up over ASP (ASP's time /
the strategy's), the released k over time (the paper's Fig. 13) and fixed k (K-async with the adaptive model's
momentum and learning rate, k = 1 ... 32) against adaptive k at 10 Gbit/s (its Fig. 14), then verdicts.
Where adaptive k wins and loses across server bandwidth, message size and worker count:
``benchmarks/adaptive_k_regimes.py``. Config: ``configs/fashion_mnist/adaptive_k_comparison.yaml``
(``--data digits``: ``configs/adaptive_k_comparison.yaml``).

Sizes:
  tiny     digits, 4 workers, an MLP, 2 networks, 2 strategies, a one-rate grid, k in {2}: the suite's smoke test.
  default  32 workers, 1.5 epochs (2800 gradients), 1 seed (about 40 min on 2 cores).
  full     3 seeds and the config's 5 epochs.

    python benchmarks/adaptive_k_comparison.py [--size tiny|default|full] [--seeds N] [--data fashion_mnist|digits]
"""

from __future__ import annotations

import sys

import _harness
import matplotlib.pyplot as plt
import numpy as np

from jaxsync._src.sim.time_model import LINK_PRESETS, server_bandwidth
from jaxsync._src.train import plots

CONFIGS = {"fashion_mnist": "fashion_mnist/adaptive_k_comparison", "digits": "adaptive_k_comparison"}
# The learning-rate grid every strategy is tuned on (at 10 Gbit/s, the held-out seed); tiny: one rate.
GRID = (0.001, 0.003, 0.01, 0.03, 0.1)
TINY_GRID = (0.05,)
TUNING_NETWORK = "10 Gbit/s"
# Evaluations per run, whatever its events cost (a synchronous round is 32 gradients, an arrival one).
EVALUATIONS = 40
# The paper's rule diverged at every rate tried (the config's header): it runs at the bounded rule's rate.
UNBOUNDED_BB = "adaptive k + BB, unbounded (the paper's rule)"
# (link preset, paper model, message bytes (Table 2), seconds per worker-step (Table 4 Cp), EAO period)
NETWORKS = {
  "1 Gbit/s": ("1gbps", "ResNet34", 83_000_000, 23.0, 20),
  "10 Gbit/s": ("10gbps", "ResNet101", 171_000_000, 0.89, 10),
  "100 Gbit/s": ("100gbps", "ResNet101", 171_000_000, 0.89, 10),
}
# (label, registry name, extra options)
STRATEGIES = (
  ("ASP", "asp", {}),
  ("BSP", "bsp", {}),
  ("SSP (s=3)", "ssp", {}),
  ("EASGD (EAO)", "easgd", {}),
  ("DropWorker (50%)", "drop_worker", {"learning_rate": 0.01, "drop_rate": 0.5}),
  ("all-reduce", "allreduce", {}),
  ("adaptive k", "adaptive_k", {}),
  ("adaptive k + BB", "adaptive_k", {"bb_step_size": True}),  # jaxsync's bound, bb_max_scale=2
  (
    "adaptive k + BB, unbounded (the paper's rule)",
    "adaptive_k",
    {"bb_step_size": True, "bb_max_scale": None},
  ),
)
FIXED_K = (1, 2, 4, 8, 16, 32)
# The paper's headline claims (docs/algorithms.md §16), set beside ours.
PAPER = (
  "The paper reports (ResNet/MobileNet/VGG on CIFAR/TinyImageNet, TF parameter server): a speed-up of its model"
  " over ASP of up to 57.76% at 1 Gbit/s (CPU cluster) and 125.3% at 10 Gbit/s (GPU cluster); up to 86.7% faster"
  " than all-reduce over NCCL (VGG16); per-worker BB step sizes take 25% fewer steps and 27.06% less time;"
  " k stays small (Fig. 13) and fixed large k loses accuracy while fixed small k needs more steps (Fig. 14)."
)


def network_overrides(network: str) -> list[str]:
  """The paper's clock for one network: Table 4 compute times, Table 2 message sizes, EAO period."""
  link, _, size, compute, period = NETWORKS[network]
  return [
    f"cluster.link={link}",
    f"cluster.compute_time={compute}",
    f"cluster.message_bytes={size}",
    f"compare.options.easgd.period={period}",
  ]


def base_overrides(size: str, data: str) -> tuple[list[str], int, int]:
  """(overrides every run of the size shares, its gradients, its workers)."""
  if size == "tiny":
    base = ["model.name=mlp", "run.chunk=60", "run.checkpoint_every=null", "run.target_accuracy=0.5"]
    return [*base, "run.gradients=240", "cluster.num_workers=4"], 240, 4
  if data == "digits":
    gradients = {"default": 4000, "full": 8000}[size]
    return [f"run.gradients={gradients}", "cluster.num_workers=32"], gradients, 32
  # Fashion-MNIST: 1.5 of the config's 5 epochs by default. At 1.5 epochs a synchronous strategy makes
  # 87 updates of 32 workers' batches, so the target is 0.75 (the config's 0.85 is for 5 epochs).
  gradients = {"default": 2800, "full": 9375}[size]
  base = [f"run.gradients={gradients}", "run.chunk=200", "run.checkpoint_every=null"]
  return [*base, *([] if size == "full" else ["run.target_accuracy=0.75"])], gradients, 32


def main(argv: list[str]) -> int:
  p = _harness.parser(__doc__)
  p.add_argument("--data", choices=tuple(CONFIGS), default="fashion_mnist", help="default Fashion-MNIST")
  args = p.parse_args(argv)
  data_name = "digits" if args.size == "tiny" else args.data
  config_name = CONFIGS[data_name]
  bench = _harness.Benchmark(
    "adaptive_k_comparison_digits"
    if data_name == "digits" and args.size != "tiny"
    else "adaptive_k_comparison",
    f"Adaptive k (JPDC 2022): adaptive k-synchronization on three networks, {data_name}",
    args,
    argv,
    seeds=1,
    full_seeds=3,
  )
  tiny = args.size == "tiny"
  base, gradients, workers = base_overrides(args.size, data_name)
  memory = server_bandwidth(bench.config(config_name, base).cluster.server_bandwidth)
  networks = ["10 Gbit/s", "100 Gbit/s"] if tiny else list(NETWORKS)
  strategies = [s for s in STRATEGIES if s[0] in ("ASP", "adaptive k")] if tiny else STRATEGIES

  # Every strategy's learning rate on the same grid, at 10 Gbit/s on the held-out seed.
  tuning = base + network_overrides(TUNING_NETWORK)
  rate, grid_table = bench.tune(
    bench.config(config_name, tuning),
    {label: (name, options) for label, name, options in strategies if label != UNBOUNDED_BB},
    TINY_GRID if tiny else GRID,
    evaluations=EVALUATIONS,
  )
  rate[UNBOUNDED_BB] = rate.get("adaptive k + BB")
  bench.section(
    f"Learning rates: every strategy on the same grid, at {TUNING_NETWORK}, seed {_harness.TUNING_SEED}",
    grid_table
    + f"\n\nFinal test accuracy % of one run per rate (seed {_harness.TUNING_SEED}, held out from the tables'"
    " seeds); **bold**: the rate each strategy uses on every network (the best; the smaller on a tie). The"
    " paper's unbounded BB rule runs at the bounded rule's rate (it diverged at every rate tried).",
  )

  cells: dict[str, dict[str, _harness.Cell]] = {}
  for network in networks:
    overrides = base + network_overrides(network)
    config = bench.config(config_name, overrides)
    cells[network] = {
      label: bench.run(
        config,
        name,
        setting=network,
        label=label,
        options={**options, "learning_rate": rate[label]},
        config_name=config_name,
        overrides=overrides,
        evaluations=EVALUATIONS,
        measure=k_measures,
        # The adaptive models' k and step sizes are plotted over the run: the store keeps 200 of the events.
        event_rows=200 if label.startswith("adaptive k") else 1,
      )
      for label, name, options in strategies
    }
  target = next(iter(cells[networks[0]].values())).config.run.target_accuracy

  clocks = [
    [
      network,
      NETWORKS[network][1],
      f"{NETWORKS[network][2] / 1e6:.0f} MB",
      f"{NETWORKS[network][3]} s",
      f"{NETWORKS[network][2] / LINK_PRESETS[NETWORKS[network][0]].bandwidth:.3f} s",
      f"{NETWORKS[network][4]}",
    ]
    for network in networks
  ]
  bench.section(
    "The clock: the paper's model sizes and compute times",
    _harness.table(
      [
        "network",
        "paper model",
        "message (Table 2)",
        "compute per step (Table 4 Cp)",
        "one message",
        "EAO period",
      ],
      clocks,
    )
    + f"\n\n{workers} workers, homogeneous (Gamma(100) jitter), one parameter server whose interface moves one"
    " message at a time each way"
    + (f" and whose memory applies updates at {memory / 1e9:g} GB/s" if memory else "")
    + f"; all-reduce is a ring. The gradients are {data_name} + {bench.config(config_name, base).model.name}'s;"
    " only the clock is the paper's model's.",
  )
  for network in networks:
    row = cells[network]
    asp = row["ASP"]
    lines = []
    for label, cell in row.items():
      lines.append(
        [
          label,
          cell.text("final_accuracy", 3),
          cell.text("updates_to_target_held", 0),
          cell.text("time_to_target_held", 0),
          _harness.ratio(asp.mean("time_to_target_held"), cell.mean("time_to_target_held")),
          _harness.ratio(asp.mean("updates_to_target_held"), cell.mean("updates_to_target_held")),
          cell.text("simulated_time", 0),
          cell.text("mean_staleness", 2),
        ]
      )
    bench.section(
      f"{network}: to accuracy {target}, mean ± std over {bench.seeds} seed(s)",
      _harness.table(
        [
          "strategy",
          "final accuracy",
          "updates to target",
          "simulated s to target",
          "speed-up over ASP (time)",
          "ASP's updates / these",
          "simulated s (whole run)",
          "mean staleness",
        ],
        lines,
      )
      + f"\n\nEvery run computes the same {gradients} gradients (a synchronous round costs {workers}). Speed-up"
      " over ASP: ASP's mean simulated time to the target divided by this strategy's (> 1: faster than ASP).",
    )

  # Fig. 13: the k the adaptive model released over time, per network.
  figure, ax = plt.subplots(figsize=(7.0, 4.2))
  k_means = []
  for network in networks:
    cell = cells[network]["adaptive k"]
    if not cell.results:
      k_means.append([network, "missing", "missing", "missing"])
      continue
    times, ks = plots.k_series(cell.histories[0])  # 200 of the run's events, for the plot
    m = cell.measures[0]  # every released update's k
    if len(ks):
      ax.plot(times / max(times[-1], 1e-9), ks, ".", markersize=3, alpha=0.6, label=network)
    if m["mean_k"] is not None:
      k_means.append([network, f"{m['mean_k']:.2f}", f"{m['median_k']:.0f}", f"{m['min_k']}-{m['max_k']}"])
  ax.set_xlabel("fraction of the run (simulated time)")
  ax.set_ylabel("k released")
  ax.set_title("adaptive k over time (seed 0; the paper's Fig. 13)")
  ax.grid(alpha=0.3)
  ax.legend()
  bench.figure("k_over_time", figure)
  bench.section(
    "The released k (the paper's Fig. 13: k stays in a small range)",
    _harness.table(["network", "mean k", "median k", "range"], k_means),
  )

  # Each worker's BB step size over time, bounded (jaxsync's default) and unbounded (the paper's rule).
  for label in ("adaptive k + BB", "adaptive k + BB, unbounded (the paper's rule)"):
    cell = cells[networks[0]].get(label)
    if cell is not None and cell.results:
      figures = plots.run_figures(cell.histories[0], label=f"{label}, {networks[0]}")
      if "step_sizes" in figures:
        bench.figure(
          f"bb_step_sizes_{'unbounded' if 'unbounded' in label else 'bounded'}", figures["step_sizes"]
        )
      for stem, other in figures.items():
        if stem != "step_sizes":
          plt.close(other)

  # Fig. 14: fixed k against adaptive k at 10 Gbit/s, same learning rate and momentum as the adaptive model.
  sweep_network = "10 Gbit/s"
  overrides = base + network_overrides(sweep_network)
  config = bench.config(config_name, overrides)
  adaptive = config.strategy.options
  sweep = {}
  for k in [2] if tiny else [k for k in FIXED_K if k <= workers]:
    options = {"k": k, "learning_rate": rate["adaptive k"], "momentum": adaptive["momentum"]}
    sweep[f"fixed k={k}"] = bench.run(
      config,
      "k_async",
      setting=f"{sweep_network} fixed k",
      label=f"fixed k={k}",
      options=options,
      config_name=config_name,
      overrides=overrides,
      evaluations=EVALUATIONS,
    )
  sweep["adaptive k"] = cells[sweep_network]["adaptive k"]
  bench.section(
    f"Fixed k against adaptive k at {sweep_network} (the paper's Fig. 14)",
    _harness.table(
      ["k", "final accuracy", "best accuracy", "updates to target", "simulated s to target"],
      [
        [
          label,
          c.text("final_accuracy", 3),
          c.text("best_accuracy", 3),
          c.text("updates_to_target_held", 0),
          c.text("time_to_target_held", 0),
        ]
        for label, c in sweep.items()
      ],
    )
    + "\n\nFixed k: K-async SGD (update on any k arrivals, reply to those k) with the adaptive model's"
    " learning rate and momentum, the nearest registry rule to the paper's fixed-k runs (its exact form is"
    " not given).",
  )
  bench.section("Verdicts", verdicts(cells, sweep, target, k_means))
  bench.section("What the paper reports", PAPER)
  bench.compare_figure(
    "accuracy_vs_time",
    {n: {label: c.histories for label, c in cells[n].items()} for n in networks},
  )
  bench.compare_figure(
    "fixed_k_accuracy_vs_time",
    {f"{sweep_network}: fixed k vs adaptive k": {k: c.histories for k, c in sweep.items()}},
  )
  bench.section(
    "Reproduce one cell",
    _harness.code([cells[n]["adaptive k"].command for n in networks]),
  )
  bench.write()
  return 0


def k_measures(result, exp) -> dict:
  """The k of every released update (the store keeps only some of the events)."""
  _, ks = plots.k_series(result.history)
  if not len(ks):
    return {"mean_k": None, "median_k": None, "min_k": None, "max_k": None}
  return {
    "mean_k": float(np.mean(ks)),
    "median_k": float(np.median(ks)),
    "min_k": int(ks.min()),
    "max_k": int(ks.max()),
  }


def verdicts(cells, sweep, target: float, k_means: list[list[str]]) -> str:
  """The paper's claims (docs/algorithms.md §16), each with our numbers and a verdict."""
  lines = []
  speedups = {}
  for network, row in cells.items():
    asp, ak = row["ASP"], row["adaptive k"]
    speedups[network] = (
      asp.mean("time_to_target_held") / ak.mean("time_to_target_held")
      if ak.mean("time_to_target_held")
      else None
    )
    if not asp.results or not ak.results:
      lines.append(f"  - {network}: missing from the results store")
      continue
    h_asp, h_ak = asp.histories[0], ak.histories[0]
    rate_asp = asp.summaries[0]["events"] / h_asp.elapsed
    rate_ak = ak.summaries[0]["events"] / h_ak.elapsed
    g_asp, g_ak = _harness.gradients_to(h_asp, target), _harness.gradients_to(h_ak, target)
    lines.append(
      f"  - {network}: adaptive k {'did not reach ' + str(target) if speedups[network] is None else f'{speedups[network]:.2f}x ASP'}"
      f" (final accuracy {ak.text('final_accuracy', 3)} vs ASP {asp.text('final_accuracy', 3)}). Its server took"
      f" {rate_ak:.2f} gradients per simulated s against ASP's {rate_asp:.2f} ({rate_ak / rate_asp:.2f}x), and it"
      f" needed {'-' if g_ak is None else g_ak} gradients to {target} against ASP's {'-' if g_asp is None else g_asp}"
      f" (mean k {ak.measures[0]['mean_k']:.1f})."
    )
  wins = [n for n in ("1 Gbit/s", "10 Gbit/s") if n in speedups and (speedups[n] or 0) > 1]
  verdict = "**reproduced**" if len(wins) == 2 else "**partly**" if wins else "**not reproduced**"
  out = [
    f"- *Adaptive k is faster than ASP (up to 2.25x at 10 Gbit/s, 1.58x at 1 Gbit/s)*: {verdict}"
    + (f" (faster at {', '.join(wins)})" if wins else "")
    + ". Speed-up = throughput ratio x gradient-efficiency ratio:",
    *lines,
  ]
  k_median = [float(r[2]) for r in k_means if r[2] != "missing"]
  out.append(
    "- *k stays small, usually below 5 (Fig. 13)*: "
    + ("**reproduced**" if k_median and max(k_median) < 5 else "**not reproduced**")
    + f": median k {', '.join(f'{r[0]} {r[2]}' for r in k_means)}. What k the tests release is decided by the"
    " gradients' noise (docs/algorithms.md §11a): the noisier the minibatch gradient relative to its mean, the"
    " more gradients the norm test waits for."
  )
  fixed = {label: c.mean("time_to_target_held") for label, c in sweep.items() if label != "adaptive k"}
  reached = {label: t for label, t in fixed.items() if t is not None}
  adaptive_time = sweep["adaptive k"].mean("time_to_target_held")
  best = min(reached, key=reached.get) if reached else None
  if adaptive_time is None:
    claim = "**not reproduced**: adaptive k did not reach the target"
  elif best is None or adaptive_time <= reached[best]:
    claim = "**reproduced**: adaptive k reached the target no later than every fixed k"
  else:
    claim = f"**not reproduced**: {best} reached the target in {reached[best]:.0f} s, adaptive k in {adaptive_time:.0f} s"
  out.append(f"- *Fixed k is worse than adaptive k (Fig. 14)*: {claim}.")
  if any("adaptive k + BB" not in row for row in cells.values()):
    return "\n".join(out)  # the tiny size runs no BB
  bb_rows = []
  for network, row in cells.items():
    plain, bb = row["adaptive k"], row["adaptive k + BB"]
    bb_rows.append(
      f"{network}: updates {plain.text('updates_to_target_held', 0)} -> {bb.text('updates_to_target_held', 0)},"
      f" time {plain.text('time_to_target_held', 0)} -> {bb.text('time_to_target_held', 0)} s"
    )
  better = [
    n
    for n, row in cells.items()
    if row["adaptive k + BB"].mean("time_to_target_held") is not None
    and (row["adaptive k"].mean("time_to_target_held") or float("inf"))
    > row["adaptive k + BB"].mean("time_to_target_held")
  ]
  out.append(
    "- *Per-worker BB step sizes take 25% fewer steps and 27% less time*: "
    + ("**reproduced**" if len(better) == len(cells) else "**partly**" if better else "**not reproduced**")
    + f" with jaxsync's bounded rule ({'; '.join(bb_rows)}); the paper's unbounded rule: final accuracy "
    + ", ".join(f"{n} {row[UNBOUNDED_BB].text('final_accuracy', 3)}" for n, row in cells.items())
    + ". The rule is a reconstruction (docs/algorithms.md §11c)."
  )
  return "\n".join(out)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
