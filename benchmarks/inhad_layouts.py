"""InHAD (J. Supercomputing 2021): InHAD against ASP and all-reduce across nodes x local-workers layouts.

InHAD (J. Supercomputing 2021; docs/algorithms.md §15, reconstructed from the abstract) sums
gradients inside each node and lets the server pull every node's sum when the
nodes' iteration numbers add up to a threshold. The abstract claims "much higher
acceleration than ASP, nearly the same accuracy as Horovod". This benchmark runs
ASP and a flat ring all-reduce (layout-free) and, for each layout of 16 workers
(16x1, 8x2, 4x4, 2x8 nodes x local workers), InHAD and a hierarchical all-reduce
grouped by node (Horovod's hierarchical mode), and reports accuracy, simulated
time to the target, the speed-up over ASP and the accuracy gap to all-reduce.
Config: ``configs/inhad_layouts.yaml``.

Sizes:
  tiny     4 workers (4x1, 2x2), an MLP: the suite's smoke test.
  default  16 workers, 2 seeds (about 6 min on 2 cores).
  full     3 seeds, 8000 gradients.

    python benchmarks/inhad_layouts.py [--size tiny|default|full] [--seeds N]
"""

from __future__ import annotations

import sys

import _harness

CONFIG = "inhad_layouts"


def main(argv: list[str]) -> int:
  args = _harness.parser(__doc__).parse_args(argv)
  bench = _harness.Benchmark(
    "inhad_layouts", "InHAD (J. Supercomputing 2021): InHAD across node layouts", args, argv, seeds=2
  )
  base = {
    "tiny": [
      "model.name=mlp",
      "cluster.num_workers=4",
      "run.gradients=240",
      "run.chunk=60",
      "run.checkpoint_every=null",
      "run.target_accuracy=0.5",
      "run.eval_every_time=0.01",
    ],
    "default": [],
    "full": ["run.gradients=8000"],
  }[args.size]
  config = bench.config(CONFIG, base)
  workers = config.cluster.num_workers
  layouts = [w for w in (1, 2, 4, 8) if workers % w == 0 and w < workers]
  flat = {
    label: bench.run(config, name, setting="any layout", label=label, config_name=CONFIG, overrides=base)
    for label, name in (("ASP", "asp"), ("all-reduce (flat ring)", "allreduce"))
  }
  per_layout = {}
  for local in layouts:
    layout = f"{workers // local} nodes x {local}"
    overrides = [*base, f"strategy.options.local_workers={local}"]
    cfg = bench.config(CONFIG, overrides)
    per_layout[layout] = {
      "InHAD": bench.run(
        cfg,
        "inhad",
        setting=layout,
        label="InHAD",
        options={"local_workers": local},
        config_name=CONFIG,
        overrides=overrides,
      )
    }
    if local > 1:
      per_layout[layout]["hierarchical all-reduce"] = bench.run(
        cfg,
        "hierarchical_allreduce",
        setting=layout,
        label="hierarchical all-reduce",
        options={"group_size": local},
        config_name=CONFIG,
        overrides=overrides,
      )
  asp, ring = flat["ASP"], flat["all-reduce (flat ring)"]
  target = asp.summaries[0]["target"]["value"]
  rows = []
  for layout, cells in [("any layout", flat), *per_layout.items()]:
    for label, cell in cells.items():
      gap = (
        None
        if cell.mean("final_accuracy") is None or ring.mean("final_accuracy") is None
        else 100 * (cell.mean("final_accuracy") - ring.mean("final_accuracy"))
      )
      rows.append(
        [
          label,
          layout,
          cell.text("final_accuracy", 3),
          "-" if gap is None else f"{gap:+.2f}",
          cell.text("time_to_target", 3),
          _harness.ratio(asp.mean("time_to_target"), cell.mean("time_to_target")),
          cell.text("updates", 0),
          cell.text("mean_staleness", 2),
          cell.text("bytes_moved", 2, 1e-9),
          cell.text("bytes_moved_intra", 2, 1e-9),
        ]
      )
  bench.section(
    f"{workers} workers: accuracy and time to {target}, mean ± std over {bench.seeds} seed(s)",
    _harness.table(
      [
        "strategy",
        "layout (nodes x local workers)",
        "final accuracy",
        "accuracy - all-reduce's (points)",
        f"simulated s to {target}",
        "speed-up over ASP (time)",
        "server updates",
        "mean staleness",
        "GB between nodes",
        "GB inside nodes",
      ],
      rows,
    )
    + f"\n\nThe clock: {config.cluster.compute_time} s per worker-step, {config.cluster.link} between nodes,"
    " 10x that bandwidth inside a node; one parameter server. InHAD: T_pull = K, the mean of the pulled sums"
    " with momentum 0.9. Speed-up over ASP: ASP's simulated time to the target divided by this one's.",
  )
  bench.section(
    "What the paper reports",
    'Only the abstract is public (docs/algorithms.md §15-§16): on Tianhe-2, InHAD achieves "much higher acceleration than'
    ' ASP, nearly the same accuracy as Horovod". No numbers are recoverable, so the columns above are the test:'
    " a speed-up over ASP above 1 and an accuracy gap to all-reduce near 0.",
  )
  panels = {
    layout: {label: c.histories for label, c in {**flat, **cells}.items()}
    for layout, cells in per_layout.items()
  }
  bench.compare_figure("accuracy_vs_time", panels)
  bench.section("Reproduce one cell", _harness.code([next(iter(per_layout.values()))["InHAD"].command]))
  bench.write()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
