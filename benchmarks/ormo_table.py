"""OrMo's results table (Shi, Yang, Li, NeurIPS 2024): six asynchronous rules at 16 and 64 workers, hom. and het.

Reproduces the layout of the OrMo poster's table (Shi, Yang, Li, NeurIPS 2024;
docs/algorithms.md §16): ASGD, naive ASGDm, shifted momentum, SMEGA², OrMo and
OrMo-DA, each at 16 and 64 workers, homogeneous and heterogeneous (a quarter of
the workers 4x slower), mean ± sample std over seeds of the final training loss
(the mean batch loss of the last 10% of events) and test accuracy, plus the
updates and simulated seconds each needed to reach the target accuracy, and
accuracy against simulated time. Config: ``configs/ormo_table.yaml``.

Sizes:
  tiny     4 and 8 workers, an MLP, 2 rules, 1 seed: the suite's smoke test (seconds).
  default  digits + the small CNN, the paper's 16/64 workers, 3 seeds (about 20 min on 2 cores).
  full     5 seeds (the paper's run count); with --data-dir, CIFAR-10 (or --dataset cifar100)
           and ResNet-20, the paper's task: hours per run on 2 cores, meant for bigger machines.

    python benchmarks/ormo_table.py [--size tiny|default|full] [--seeds N] [--data-dir DIR]
"""

from __future__ import annotations

import sys

import _harness

CONFIG = "ormo_table"
RULES = ("asp", "naive_asgdm", "shifted_momentum", "smega2", "ormo", "ormo_da")
NAMES = {
  "asp": "ASGD",
  "naive_asgdm": "naive ASGDm",
  "shifted_momentum": "shifted momentum",
  "smega2": "SMEGA²",
  "ormo": "OrMo",
  "ormo_da": "OrMo-DA",
}
# The paper's ResNet-20 column values (training loss / test accuracy %), docs/algorithms.md §16.
PAPER_CIFAR100 = {
  "asp": (".51/66.16±.36", ".96/61.61±.59", ".51/65.94±.39", ".95/61.74±.30"),
  "naive_asgdm": (".54/65.46±.20", "1.03/59.96±.90", ".53/65.69±.42", ".97/61.13±1.02"),
  "shifted_momentum": (".47/66.37±.14", ".82/63.55±.32", ".47/66.28±.14", ".82/63.28±.66"),
  "smega2": (".41/67.32±.22", ".69/64.16±.12", ".40/67.29±.16", ".68/64.12±.53"),
  "ormo": (".41/67.56±.34", ".56/65.48±.17", ".40/67.71±.33", ".58/65.43±.35"),
  "ormo_da": (".40/67.72±.21", ".56/65.79±.12", ".40*/67.82±.20", ".57/65.82±.30"),
}
PAPER_CIFAR10 = {
  "asp": (".06/89.77±.11", ".40/83.14±.55", ".06/89.73±.19", ".38/83.94±.21"),
  "naive_asgdm": (".20/88.15±1.70", ".44/82.39±1.79", ".58/73.23±31.61", ".78/68.75±29.51"),
  "shifted_momentum": (".08/90.23±.27", ".38/83.72±.29", ".10/89.95±.32", ".37/83.99±.23"),
  "smega2": (".05/90.60±.42", ".23/86.82±.69", ".04/90.88±.25", ".22/86.89±1.42"),
  "ormo": (".04/90.95±.27", ".15/88.03±.28", ".04/91.01±.10", ".16/87.76±.57"),
  "ormo_da": (".03/91.17±.18", ".16/88.03±.33", ".03/91.28±.37", ".15/88.08±.38"),
}


def columns(size: str) -> dict[str, list[str]]:
  """The paper's four columns as config overrides (``--set``), smaller for ``tiny``."""
  if size == "tiny":
    small = [
      "model.name=mlp",
      "run.gradients=240",
      "run.eval_every=40",
      "run.chunk=120",
      "run.checkpoint_every=null",
      "run.target_accuracy=0.5",
    ]
    return {
      "4 hom.": [*small, "cluster.num_workers=4", "cluster.slow_fraction=0"],
      "8 het.": [*small, "cluster.num_workers=8", "data.batch_size=16"],
    }
  # 64 workers: each shard is 1438 // 64 = 22 images, so batch 16 and twice the gradients (the same
  # ~89 epochs), and eta scaled by 16/64 (OrMo's group step sums K gradients); see the config's header.
  wide = [
    "cluster.num_workers=64",
    "data.batch_size=16",
    "run.gradients=8000",
    "strategy.options.learning_rate=0.00125",
  ]
  return {
    "16 hom.": ["cluster.slow_fraction=0"],
    "64 hom.": [*wide, "cluster.slow_fraction=0"],
    "16 het.": [],
    "64 het.": wide,
  }


def main(argv: list[str]) -> int:
  p = _harness.parser(__doc__)
  p.add_argument(
    "--data-dir", default=None, help="a directory with cifar-10-batches-py/ (or cifar-100-python/)"
  )
  p.add_argument("--dataset", choices=("cifar10", "cifar100"), default=None, help="with --data-dir")
  args = p.parse_args(argv)
  if args.dataset and not args.data_dir:
    p.error(f"--dataset={args.dataset} needs --data-dir (the directory holding the CIFAR python pickles)")
  args.dataset = args.dataset or "cifar10"
  bench = _harness.Benchmark(
    "ormo_table",
    "OrMo's table (NeurIPS 2024): asynchronous momentum rules",
    args,
    argv,
    seeds=3,
    full_seeds=5,
  )
  data = []
  if args.data_dir:
    data = [f"data.name={args.dataset}", f"data.data_dir={args.data_dir}", "model.name=resnet20"]
  rules = ("asp", "ormo") if args.size == "tiny" else RULES
  cells: dict[str, dict[str, _harness.Cell]] = {}
  for column, overrides in columns(args.size).items():
    overrides = [*data, *overrides]
    config = bench.config(CONFIG, overrides)
    cells[column] = {
      rule: bench.run(
        config, rule, setting=column, label=NAMES[rule], config_name=CONFIG, overrides=overrides
      )
      for rule in rules
    }
  cols = list(cells)
  task = f"{config.data.name} + {config.model.name}"  # what ran (tiny swaps in the MLP)
  rows = [
    [NAMES[r]]
    + [
      f"{cells[c][r].text('final_train_loss', 3)} / {cells[c][r].text('final_accuracy', 2, 100)}"
      for c in cols
    ]
    for r in rules
  ]
  target = cells[cols[0]][rules[0]].summaries[0].get("target") or {}
  bench.section(
    f"Final training loss / test accuracy % ({task}), mean ± std over {bench.seeds} seed(s)",
    _harness.table(["rule", *cols], rows)
    + '\n\nTraining loss: the mean batch loss over the last 10% of events (the paper\'s "training loss"'
    " is not defined further). Test accuracy: the final model on the held-out split.",
  )
  reach = [
    [NAMES[r]]
    + [f"{cells[c][r].text('updates_to_target', 0)} / {cells[c][r].text('time_to_target', 2)}" for c in cols]
    for r in rules
  ]
  bench.section(
    f"Server updates / simulated seconds to {target.get('metric', 'accuracy')} {target.get('value', '')}",
    _harness.table(["rule", *cols], reach)
    + "\n\nA cell with `(n/m)` averages the n of m seeds that reached the target; `-`: none did.",
  )
  rank = []
  for c in cols:
    order = sorted(rules, key=lambda r: -(cells[c][r].mean("final_accuracy") or 0.0))
    rank.append([c, " > ".join(NAMES[r] for r in order)])
  bench.section(
    "Ranking by mean final accuracy (ours; the paper's CIFAR order is OrMo-DA ≳ OrMo > SMEGA² > shifted > ASGD > naive)",
    _harness.table(["column", "best to worst"], rank),
  )
  if args.size != "tiny":
    paper_values = PAPER_CIFAR100 if args.data_dir and args.dataset == "cifar100" else PAPER_CIFAR10
    paper = [[NAMES[r], *paper_values[r]] for r in rules]
    which = "CIFAR-100" if paper_values is PAPER_CIFAR100 else "CIFAR-10"
    bench.section(
      f"The paper's {which} + ResNet-20 values (loss / accuracy %, docs/algorithms.md §16), for reading beside ours",
      _harness.table(["rule", "16 hom.", "64 hom.", "16 het.", "64 het."], paper),
    )
  bench.compare_figure(
    "accuracy_vs_time", {c: {cells[c][r].label: cells[c][r].histories for r in rules} for c in cols}
  )
  bench.section(
    "Reproduce one cell",
    "Each cell is `jaxsync train` on the shipped config with overrides, e.g.:\n\n"
    + _harness.code([cells[c][rules[-1]].command for c in cols]),
  )
  bench.write()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
