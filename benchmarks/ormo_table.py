"""OrMo's results table (Shi, Yang, Li, NeurIPS 2024): six asynchronous rules at 16 and 64 workers, hom. and het.

Reproduces the layout of the OrMo paper's table (docs/algorithms.md §16):
ASGD, naive ASGDm, shifted momentum, SMEGA², OrMo and OrMo-DA, each at 16 and
64 workers, homogeneous and heterogeneous (a quarter of the workers 4x
slower), mean ± sample std over seeds of the final training loss (the mean
batch loss of the last 10% of events) and test accuracy, the updates and
simulated seconds each needed to reach the target accuracy, and accuracy
against simulated time. Then a verdict on each of the paper's claims: the
accuracy order OrMo-DA ≳ OrMo > SMEGA² > shifted > ASGD > naive (each step
with its difference, the std of that difference and a Welch t-test), naive
ASGDm's instability, and the gap to ASGD growing from 16 to 64 workers.

Every rule's learning rate is tuned on the same grid (``GRID``) at 16 het.
on a held-out seed (100), and the rule's best rate is used in every column
(scaled by 16/64 at 64 workers for every rule alike, as OrMo's group step
sums K gradients). Config: ``configs/fashion_mnist/ormo_table.yaml``
(``--data digits``: ``configs/ormo_table.yaml``).

Sizes:
  tiny     digits, 4 and 8 workers, an MLP, 2 rules, a 2-rate grid, 1 seed: the suite's smoke test.
  default  Fashion-MNIST + LeNet, the SMEGA² trainer's protocol over 1.5 epochs (its schedule scaled
           to them), 3 seeds, the grid on 1 (90 runs, about 35 min on 2 cores).
  full     the config's 5 epochs, 5 seeds (the paper's run count); with --data-dir, CIFAR-10 (or
           --dataset cifar100) and ResNet-20, the paper's task: hours per run on 2 cores.

    python benchmarks/ormo_table.py [--size tiny|default|full] [--seeds N] [--data fashion_mnist|digits]
"""

from __future__ import annotations

import sys

import _harness
import numpy as np
from scipy import stats

CONFIGS = {"fashion_mnist": "fashion_mnist/ormo_table", "digits": "ormo_table"}
# The learning-rate grid every rule is tuned on (at 16 het., seed 100); tiny: two rates of the MLP's.
GRID = (0.0025, 0.005, 0.01)
TINY_GRID = (0.02, 0.05)
# The paper's claimed accuracy order, best first (OrMo-DA ≳ OrMo: "at least as good").
CLAIMED_ORDER = ("ormo_da", "ormo", "smega2", "shifted_momentum", "asp", "naive_asgdm")
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


def base_overrides(size: str, data: str) -> list[str]:
  """What every run of the size shares: the run's length and, on Fashion-MNIST, its schedule."""
  if size == "tiny":
    return [
      "model.name=mlp",
      "run.gradients=240",
      "run.eval_every=40",
      "run.chunk=120",
      "run.checkpoint_every=null",
      "run.target_accuracy=0.5",
    ]
  if data == "fashion_mnist" and size == "default":
    # 1.5 of the config's 5 epochs (2800 gradients of batch 32), the schedule scaled with them: warm-up
    # 5/160 of the run, x0.1 at 1/2 and 3/4 of it (the SMEGA² trainer's fractions, as in the config).
    return [
      "run.gradients=2800",
      "run.eval_every=200",
      "run.chunk=200",
      "run.checkpoint_every=null",
      *_harness.smega2_schedule(1.5),
    ]
  return ["run.checkpoint_every=null"]


def columns(size: str, data: str) -> dict[str, tuple[list[str], float]]:
  """The paper's four columns: ``{column: (config overrides, learning-rate scale)}``."""
  if size == "tiny":
    return {
      "4 hom.": (["cluster.num_workers=4", "cluster.slow_fraction=0"], 1.0),
      "8 het.": (["cluster.num_workers=8", "data.batch_size=16"], 1.0),
    }
  # 64 workers: eta scaled by 16/64 for every rule (OrMo's group step sums K gradients); on digits each
  # shard is 1438 // 64 = 22 images, so batch 16 and twice the gradients (the same ~89 epochs).
  wide = ["cluster.num_workers=64"]
  if data == "digits":
    wide += ["data.batch_size=16", "run.gradients=8000"]
  return {
    "16 hom.": (["cluster.slow_fraction=0"], 1.0),
    "64 hom.": ([*wide, "cluster.slow_fraction=0"], 0.25),
    "16 het.": ([], 1.0),
    "64 het.": (wide, 0.25),
  }


def order_tests(cells: dict[str, _harness.Cell], rules) -> list[dict]:
  """Each adjacent step of the claimed order in one column: difference (points), its std, Welch's p."""
  tests = []
  claimed = [r for r in CLAIMED_ORDER if r in rules]
  for better, worse in zip(claimed, claimed[1:]):
    a = np.asarray([v for v in cells[better].values("final_accuracy") if v is not None], float) * 100
    b = np.asarray([v for v in cells[worse].values("final_accuracy") if v is not None], float) * 100
    enough = len(a) > 1 and len(b) > 1
    diff = a.mean() - b.mean() if len(a) and len(b) else float("nan")
    std = float(np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))) if enough else float("nan")
    p = float(stats.ttest_ind(a, b, equal_var=False).pvalue) if enough and std > 0 else float("nan")
    tests.append({"better": better, "worse": worse, "diff": diff, "std": std, "p": p})
  return tests


def order_steps(tests: list[dict], adjusted: list[float]) -> list[list[str]]:
  """The steps as table rows; significance is judged on the Holm-adjusted p-value (``adjusted``)."""
  rows = []
  for t, p in zip(tests, adjusted):
    at_least = t["better"] == "ormo_da" and t["worse"] == "ormo"  # ≳: holds unless significantly reversed
    if not np.isfinite(t["diff"]):
      verdict = "missing"
    elif t["diff"] > 0:
      verdict = "holds" + (" (significant)" if p < 0.05 else ", not significant")
    elif at_least and not p < 0.05:
      verdict = "holds (≳: not significantly below)"
    else:
      verdict = "reversed" + (" (significant)" if p < 0.05 else ", not significant")
    rows.append(
      [
        f"{NAMES[t['better']]} > {NAMES[t['worse']]}",
        f"{t['diff']:+.2f} ± {t['std']:.2f}",
        f"{t['p']:.3f}",
        f"{p:.3f}",
        verdict,
      ]
    )
  return rows


def verdicts(cells: dict[str, dict[str, _harness.Cell]], rules, steps: dict[str, list[list[str]]]) -> str:
  """The paper's three claims, each reproduced / partly / not reproduced, with the numbers behind it."""
  lines = []
  held = {c: sum(row[4].startswith("holds") for row in rows) for c, rows in steps.items()}
  significant = {
    c: sum(row[4].startswith("holds (significant)") for row in rows) for c, rows in steps.items()
  }
  total = len(next(iter(steps.values())))
  all_hold = [c for c in steps if held[c] == total]
  word = "reproduced" if len(all_hold) == len(steps) else "partly" if any(held.values()) else "not reproduced"
  lines.append(
    f"- **Accuracy order OrMo-DA ≳ OrMo > SMEGA² > shifted > ASGD > naive: {word}.** Steps of the order that "
    "hold in the mean, per column (of which significant at 0.05 after Holm's correction over every step of"
    " every column): " + ", ".join(f"{c} {held[c]}/{total} ({significant[c]})" for c in steps) + "."
  )
  if "naive_asgdm" in rules:
    diverged = {c: sum(s.get("diverged", False) for s in cells[c]["naive_asgdm"].summaries) for c in cells}
    spread = {
      c: float(np.nanstd(np.asarray(cells[c]["naive_asgdm"].values("final_accuracy"), float), ddof=1)) * 100
      for c in cells
    }
    others = {
      c: float(
        np.nanmedian(
          [
            np.nanstd(np.asarray(cells[c][r].values("final_accuracy"), float), ddof=1) * 100
            for r in rules
            if r != "naive_asgdm"
          ]
        )
      )
      for c in cells
    }
    unstable = [c for c in cells if diverged[c] or spread[c] > 3 * others[c]]
    word = "reproduced" if len(unstable) == len(cells) else "partly" if unstable else "not reproduced"
    lines.append(
      f"- **Naive ASGDm is unstable: {word}.** Diverged seeds per column: "
      + ", ".join(f"{c} {diverged[c]}" for c in cells)
      + "; its accuracy std against the other rules' median std: "
      + ", ".join(f"{c} {spread[c]:.2f} vs {others[c]:.2f}" for c in cells)
      + " (unstable: a diverged seed, or a std over 3x the others')."
    )
  pairs = [(a, b) for a, b in (("16 hom.", "64 hom."), ("16 het.", "64 het.")) if a in cells and b in cells]
  if pairs and {"ormo", "asp"} <= set(rules):

    def gap(c):
      return (
        (cells[c]["ormo"].mean("final_accuracy") or np.nan)
        - (cells[c]["asp"].mean("final_accuracy") or np.nan)
      ) * 100

    grows = [(a, b) for a, b in pairs if gap(b) > gap(a)]
    word = "reproduced" if len(grows) == len(pairs) else "partly" if grows else "not reproduced"
    lines.append(
      f"- **OrMo's gain over ASGD grows from 16 to 64 workers: {word}.** OrMo - ASGD accuracy: "
      + ", ".join(f"{a} {gap(a):+.2f} -> {b} {gap(b):+.2f} points" for a, b in pairs)
      + " (the paper: +1.2 -> +4.9 hom., +1.3 -> +3.8 het. on CIFAR-10)."
    )
  return "\n".join(lines)


def main(argv: list[str]) -> int:
  p = _harness.parser(__doc__)
  p.add_argument(
    "--data",
    choices=tuple(CONFIGS),
    default="fashion_mnist",
    help="the shipped config's data (default Fashion-MNIST)",
  )
  p.add_argument(
    "--data-dir", default=None, help="a directory with cifar-10-batches-py/ (or cifar-100-python/)"
  )
  p.add_argument("--dataset", choices=("cifar10", "cifar100"), default=None, help="with --data-dir")
  args = p.parse_args(argv)
  if args.dataset and not args.data_dir:
    p.error(f"--dataset={args.dataset} needs --data-dir (the directory holding the CIFAR python pickles)")
  args.dataset = args.dataset or "cifar10"
  data_name = "digits" if args.size == "tiny" else args.data
  config_name = CONFIGS[data_name]
  bench = _harness.Benchmark(
    "ormo_table" if data_name == "fashion_mnist" or args.size == "tiny" else "ormo_table_digits",
    f"OrMo's table (NeurIPS 2024): asynchronous momentum rules on {data_name}",
    args,
    argv,
    seeds=3,
    full_seeds=5,
  )
  data = []
  if args.data_dir:
    data = [f"data.name={args.dataset}", f"data.data_dir={args.data_dir}", "model.name=resnet20"]
  rules = ("asp", "ormo") if args.size == "tiny" else RULES
  base = [*data, *base_overrides(args.size, data_name)]
  layout = columns(args.size, data_name)
  grid = TINY_GRID if args.size == "tiny" else GRID
  tuning_column = "16 het." if "16 het." in layout else list(layout)[-1]
  config = bench.config(config_name, [*base, *layout[tuning_column][0]])
  by_label, grid_table = bench.tune(config, {NAMES[r]: (r, {}) for r in rules}, grid)
  best = {r: by_label[NAMES[r]] for r in rules}
  bench.section(
    f"Learning rates: every rule on the same grid, at {tuning_column}, seed {_harness.TUNING_SEED}",
    grid_table
    + f"\n\nFinal test accuracy % of one run per rate (seed {_harness.TUNING_SEED}, held out from the table's "
    "seeds); **bold**: the rate each rule uses below (the best; the smaller on a tie). At 64 workers every "
    "rule's rate is scaled by 16/64.",
  )
  cells: dict[str, dict[str, _harness.Cell]] = {}
  for column, (overrides, scale) in layout.items():
    overrides = [*base, *overrides]
    config = bench.config(config_name, overrides)
    cells[column] = {
      rule: bench.run(
        config,
        rule,
        setting=column,
        label=NAMES[rule],
        config_name=config_name,
        overrides=overrides,
        options={"learning_rate": best[rule] * scale},
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
  target = cells[cols[0]][rules[0]].config.run.target_accuracy
  bench.section(
    f"Final training loss / test accuracy % ({task}), mean ± std over {bench.seeds} seed(s)",
    _harness.table(["rule", *cols], rows)
    + '\n\nTraining loss: the mean batch loss over the last 10% of events (the paper\'s "training loss"'
    " is not defined further). Test accuracy: the final model on the held-out split.",
  )
  reach = [
    [NAMES[r]]
    + [
      f"{cells[c][r].text('updates_to_target_held', 0)} / {cells[c][r].text('time_to_target_held', 2)}"
      for c in cols
    ]
    for r in rules
  ]
  bench.section(
    f"Server updates / simulated seconds to accuracy {target}",
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
  tests = {c: order_tests(cells[c], rules) for c in cols}
  # One family: every step of every column (the table asks 5 x 4 questions of the same runs' kind).
  family = [t["p"] for c in cols for t in tests[c]]
  adjusted = iter(_harness.holm(family))
  steps = {c: order_steps(tests[c], [next(adjusted) for _ in tests[c]]) for c in cols}
  tested = sum(np.isfinite(family))
  bench.section(
    "The claimed order, step by step: accuracy difference (points, mean ± std of the difference), Welch's t-test",
    f"*p*: Welch's two-sided t-test on the seeds' final accuracies; *p (Holm)*: adjusted over all {tested} "
    "tests of this section (Holm, 1979), the one the verdict reads: *significant* means below 0.05 after it.\n\n"
    + "\n\n".join(
      f"**{c}**\n\n" + _harness.table(["step", "difference", "p", "p (Holm)", "verdict"], steps[c])
      for c in cols
    ),
  )
  bench.section("Verdicts", verdicts(cells, rules, steps))
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
