"""OrMo's results table (Shi, Yang, Li, NeurIPS 2024): six asynchronous rules at 16 and 64 workers, hom. and het.

Reproduces the layout of the OrMo paper's table (docs/algorithms.md §16):
ASGD, naive ASGDm, shifted momentum, SMEGA², OrMo and OrMo-DA, each at 16 and
64 workers, homogeneous and heterogeneous (a quarter of the workers 4x
slower), mean ± sample std over seeds of the final training loss (the mean
batch loss of the last 10% of events) and test accuracy, the updates and
simulated seconds each needed to reach the target accuracy, and accuracy
against simulated time. Then a verdict on each of the paper's claims: the
accuracy order OrMo-DA ≳ OrMo > SMEGA² > shifted > ASGD > naive (each step
with its difference, the difference's standard error and a Welch t-test), naive
ASGDm's instability, and the gap to ASGD growing from 16 to 64 workers.

Every rule is tuned for each column on one log-spaced grid (``GRID``, extended past an edge pick) on a
held-out seed (100), on the final accuracy on its validation split (the last 10% of the training set, left out
of its training) (the claims are about accuracy). Every column gives each
worker the same number of gradients (``PER_WORKER``): 64 workers train four times the epochs of 16, so the
64-worker columns are not left undertrained. Every cell runs 3 seeds, 5 where two neighbours of the claimed
order (or OrMo and ASGD) lie within two standard deviations; the order's steps are tested with Welch's
t-test, Holm-corrected over every step of every column; every verdict is decided again at half the budget.
Config: ``configs/fashion_mnist/ormo_table.yaml`` (``--data digits``: ``configs/ormo_table.yaml``).

Every run is appended to ``benchmarks/results/ormo_table_runs.jsonl``; a rerun skips what it holds, so the
benchmark runs in sittings, and ``--report-only`` rewrites the results file from it.

Sizes:
  tiny     digits, 4 and 8 workers, an MLP, 2 rules, a 2-rate grid, 1 seed: the suite's smoke test.
  default  Fashion-MNIST with the MLP (so that every column can be tuned on 2 cores), the SMEGA² trainer's
           protocol (its step schedule scaled to the run), 586 gradients per worker: 5 epochs at 16
           workers, 20 at 64; 3-5 seeds.
  full     the same with the LeNet; with --data-dir, CIFAR-10 (or --dataset cifar100) and ResNet-20, the
           paper's task: hours per run on 2 cores.

    python -m benchmarks.claims.ormo_table [--size tiny|default|full] [--seeds N] [--data fashion_mnist|digits]
        [--report-only]
"""

from __future__ import annotations

import sys

import numpy as np
from scipy import stats

from benchmarks.common import harness

CONFIGS = {"fashion_mnist": "fashion_mnist/ormo_table", "digits": "ormo_table"}
# The learning-rate grid every rule is tuned on, per column (seed 100; extended past an edge pick); tiny:
# two rates of the MLP's on digits.
GRID = (0.003, 0.01, 0.03, 0.1)
TINY_GRID = (0.02, 0.05)
# Gradients per worker in every column: 16 x 586 = 9375 (5 epochs of 60,000 at batch 32), 64 x 586 = 20 epochs.
PER_WORKER = 586
EVALUATIONS = 20
PAPER_NAME = "OrMo (NeurIPS 2024)"
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
  """What every run of the size shares (the budget is the column's, :func:`columns`)."""
  if size == "tiny":
    return [
      "model.name=mlp",
      "run.gradients=240",
      "run.eval_every=40",
      "run.chunk=120",
      "run.checkpoint_every=null",
      "run.target_accuracy=0.5",
    ]
  model = ["model.name=mlp"] if size == "default" and data == "fashion_mnist" else []
  return [*model, "run.checkpoint_every=null", "run.target_accuracy=0.85"]


def budget(size: str, data: str, workers: int, fraction: float = 1.0) -> list[str]:
  """The column's run length: ``PER_WORKER`` gradients per worker (times ``fraction``), the SMEGA² trainer's
  schedule scaled to it (warm-up over 5/160 of the run, x0.1 at 1/2 and 3/4 of it) and ~20 evaluations."""
  if size == "tiny":
    return [f"run.gradients={int(240 * fraction)}"]
  if data == "digits":
    gradients = int((4000 if workers == 16 else 8000) * fraction)
    return [f"run.gradients={gradients}", f"run.chunk={gradients // 10}"]
  gradients = int(PER_WORKER * workers * fraction)
  epochs = gradients * 32 / 60_000
  every = max(1, gradients // EVALUATIONS)
  return [
    f"run.gradients={gradients}",
    f"run.eval_every={every}",
    f"run.chunk={every * 5}",
    *harness.smega2_schedule(epochs),
  ]


def columns(size: str, data: str) -> dict[str, tuple[list[str], int]]:
  """The paper's four columns: ``{column: (config overrides, workers)}``."""
  if size == "tiny":
    return {
      "4 hom.": (["cluster.num_workers=4", "cluster.slow_fraction=0"], 4),
      "8 het.": (["cluster.num_workers=8", "data.batch_size=16"], 8),
    }
  # On digits each shard of 64 is 1438 // 64 = 22 images: batch 16.
  wide = ["cluster.num_workers=64", *(["data.batch_size=16"] if data == "digits" else [])]
  return {
    "16 hom.": (["cluster.slow_fraction=0"], 16),
    "64 hom.": ([*wide, "cluster.slow_fraction=0"], 64),
    "16 het.": ([], 16),
    "64 het.": (wide, 64),
  }


def order_tests(cells: dict[str, harness.Cell], rules) -> list[dict]:
  """Each adjacent step of the claimed order in one column: difference (points), its standard error, Welch's p."""
  tests = []
  claimed = [r for r in CLAIMED_ORDER if r in rules]
  for better, worse in zip(claimed, claimed[1:]):
    a = np.asarray([v for v in cells[better].values("final_accuracy") if v is not None], float) * 100
    b = np.asarray([v for v in cells[worse].values("final_accuracy") if v is not None], float) * 100
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    enough = len(a) > 1 and len(b) > 1
    diff = a.mean() - b.mean() if len(a) and len(b) else float("nan")
    se = float(np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))) if enough else float("nan")
    p = float(stats.ttest_ind(a, b, equal_var=False).pvalue) if enough and se > 0 else float("nan")
    tests.append({"better": better, "worse": worse, "diff": diff, "se": se, "p": p})
  return tests


def order_steps(tests: list[dict], adjusted: list[float]) -> list[list[str]]:
  """The steps as table rows; significance is judged on the Holm-adjusted p-value (``adjusted``)."""
  rows = []
  for t, p in zip(tests, adjusted):
    at_least = t["better"] == "ormo_da" and t["worse"] == "ormo"  # ≳: holds unless significantly reversed
    if not np.isfinite(t["diff"]):
      verdict = "missing"
    elif t["se"] == 0:  # every seed of both the same: Welch's test has no spread to measure against
      verdict = ("holds" if t["diff"] > 0 else "reversed") + " (no spread across seeds: not tested)"
    elif t["diff"] > 0:
      verdict = "holds" + (" (significant)" if p < 0.05 else ", not significant")
    elif at_least and not p < 0.05:
      verdict = "holds (≳: not significantly below)"
    else:
      verdict = "reversed" + (" (significant)" if p < 0.05 else ", not significant")
    rows.append(
      [
        f"{NAMES[t['better']]} > {NAMES[t['worse']]}",
        f"{t['diff']:+.2f} ± {t['se']:.2f}",
        f"{t['p']:.3f}",
        f"{p:.3f}",
        verdict,
      ]
    )
  return rows


def decide(cells: dict[str, dict[str, harness.Cell]], rules) -> tuple[dict, dict]:
  """The paper's three claims on these cells: ``({claim: (verdict, evidence)}, {column: step rows})``. The
  order's steps are one family for Holm's correction: every step of every column."""
  cols = list(cells)
  tests = {c: order_tests(cells[c], rules) for c in cols}
  adjusted_all = iter(harness.holm([t["p"] for c in cols for t in tests[c]]))
  adjusted = {c: [next(adjusted_all) for _ in tests[c]] for c in cols}
  steps = {c: order_steps(tests[c], adjusted[c]) for c in cols}
  out = {}
  held = {c: sum(row[4].startswith("holds") for row in rows) for c, rows in steps.items()}
  # Significance is counted over the strict steps only: a significant ≳ step stands in for none of them.
  significant = {
    c: sum(row[4].startswith("holds (significant)") and row[0] != "OrMo-DA > OrMo" for row in rows)
    for c, rows in steps.items()
  }
  total = len(next(iter(steps.values())))
  # The ≳ step (OrMo-DA at least as good as OrMo) holds unless significantly reversed: it needs no significance.
  needed = total - sum(1 for r in steps[cols[0]] if r[0] == "OrMo-DA > OrMo")
  if all(held[c] == total and significant[c] >= needed for c in cols):
    word = "reproduced"
  elif all(held[c] == total for c in cols):
    word = "in the mean only (not significant after Holm)"
  else:
    word = "partly" if any(held.values()) else "not reproduced"
  surviving = [f"{c}: {row[0]}" for c, rows in steps.items() for row in rows if "(significant)" in row[4]]
  out["accuracy order OrMo-DA ≳ OrMo > SMEGA² > shifted > ASGD > naive"] = (
    f"**{word}**",
    "steps that hold (the strict ones in the mean, ≳ where not significantly below; of the strict ones,"
    " significant after Holm): "
    + ", ".join(f"{c} {held[c]}/{total} ({significant[c]})" for c in cols)
    + (f"; the orderings that survive Holm: {'; '.join(surviving)}" if surviving else "; none survives Holm"),
    harness.Comparisons(
      harness.Comparison(f"{c}: {row[0]}", t["diff"], p, t["se"])
      for c in cols
      for t, row, p in zip(tests[c], steps[c], adjusted[c])
      if row[4] != "missing"
    ),
    harness.Deciding(
      f"{sum(held.values())} of {total * len(cols)} steps hold (≳: not significantly below), "
      f"{sum(significant.values())} of {needed * len(cols)} strict ones significantly"
    ),
  )
  if "naive_asgdm" in rules:
    diverged = {c: sum(bool(s.get("diverged")) for s in cells[c]["naive_asgdm"].summaries) for c in cols}

    def std(c, r):
      values = [v for v in cells[c][r].values("final_accuracy") if v is not None]
      return float(np.std(values, ddof=1)) * 100 if len(values) > 1 else float("nan")

    spread = {c: std(c, "naive_asgdm") for c in cols}
    others = {c: float(np.nanmedian([std(c, r) for r in rules if r != "naive_asgdm"])) for c in cols}
    noisiest = {c: max(rules, key=lambda r, c=c: -1 if np.isnan(std(c, r)) else std(c, r)) for c in cols}
    unstable = [c for c in cols if diverged[c] or spread[c] > 3 * others[c]]
    word = "reproduced" if len(unstable) == len(cols) else "partly" if unstable else "not reproduced"
    out["naive ASGDm is unstable"] = (
      f"**{word}**",
      "diverged seeds per column "
      + ", ".join(f"{c} {diverged[c]}" for c in cols)
      + "; its accuracy std against the other rules' median (points): "
      + ", ".join(f"{c} {spread[c]:.2f} vs {others[c]:.2f}" for c in cols)
      + "; the noisiest rule: "
      + ", ".join(f"{c} {NAMES[noisiest[c]]}" for c in cols)
      + " (unstable: a diverged seed, or a std over 3x the others')",
      harness.Deciding(
        f"{sum(diverged.values())} diverged seeds; its spread at most "
        f"{max(spread[c] / others[c] for c in cols):.1f}x the others' (unstable above 3x)"
      ),
    )
  pairs = [(a, b) for a, b in (("16 hom.", "64 hom."), ("16 het.", "64 het.")) if a in cells and b in cells]
  if pairs and {"ormo", "asp"} <= set(rules):

    def gap(c):
      return harness.welch(
        cells[c]["ormo"].values("final_accuracy"), cells[c]["asp"].values("final_accuracy")
      )

    def growth(a, b):
      ormo, asp = cells[a]["ormo"], cells[a]["asp"]
      ormo_b, asp_b = cells[b]["ormo"], cells[b]["asp"]
      return harness.growth_test(
        ormo.values("final_accuracy"), asp.values("final_accuracy"),
        ormo_b.values("final_accuracy"), asp_b.values("final_accuracy"),
      )  # fmt: skip

    tested = {pair: growth(*pair) for pair in pairs}
    adjusted = dict(zip(tested, harness.holm([t["p"] for t in tested.values()])))
    # Grows: a larger gap at 64 workers that Holm's correction over the pairs keeps.
    grows = [pair for pair, t in tested.items() if t["diff"] > 0 and adjusted[pair] < 0.05]
    word = "reproduced" if len(grows) == len(pairs) else "partly" if grows else "not reproduced"
    out["the gain over ASGD grows from 16 to 64 workers"] = (
      f"**{word}**",
      "OrMo - ASGD final accuracy (points, ± its standard error): "
      + ", ".join(
        f"{a} {100 * gap(a)['diff']:+.2f} ± {100 * gap(a)['se']:.2f} -> {b} {100 * gap(b)['diff']:+.2f} ± "
        f"{100 * gap(b)['se']:.2f} (growth {100 * tested[(a, b)]['diff']:+.2f}, p = {adjusted[(a, b)]:.3f} "
        "after Holm)"
        for a, b in pairs
      )
      + " (the paper: +1.2 -> +4.9 hom., +1.3 -> +3.8 het. on CIFAR-10)",
      harness.Comparisons(
        harness.Comparison(
          f"{a} -> {b} growth (points)",
          100 * tested[(a, b)]["diff"],
          adjusted[(a, b)],
          100 * tested[(a, b)]["se"],
        )
        for a, b in pairs
      ),
      harness.Deciding(
        "; ".join(
          f"growth {100 * tested[(a, b)]['diff']:+.2f} points {a.split()[1]} (p = {adjusted[(a, b)]:.3f} after Holm)"
          for a, b in pairs
        )
      ),
    )
  return out, steps


def run_columns(bench, args, config_name, data_name, base, rules, best, fraction=1.0, seeds=None, only=None):
  """Every column's cells at its tuned rates (``fraction`` of the budget; ``only``: {column: rules})."""
  cells: dict[str, dict[str, harness.Cell]] = {}
  half = "" if fraction == 1.0 else f", {fraction:g} of the budget"
  for column, (overrides, workers) in columns(args.size, data_name).items():
    overrides = [*base, *overrides, *budget(args.size, data_name, workers, fraction)]
    config = bench.config(config_name, overrides)
    cells[column] = {
      rule: bench.run(
        config,
        rule,
        setting=column + half,
        label=NAMES[rule],
        config_name=config_name,
        overrides=overrides,
        options={"learning_rate": best[column][rule]},
        seeds=harness.seeds_for(seeds, (column, rule)),
      )
      for rule in rules
      if only is None or rule in only.get(column, ())
    }
  return cells


def main(argv: list[str]) -> int:
  p = harness.parser(__doc__)
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
  bench = harness.Benchmark(
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
  best: dict[str, dict[str, float]] = {}
  for column, (overrides, workers) in layout.items():
    config = bench.config(config_name, [*base, *overrides, *budget(args.size, data_name, workers)])
    by_label, grid_table = bench.tune(
      config,
      {NAMES[r]: (r, {}) for r in rules},
      grid,
      extend=args.size != "tiny",
      setting=f"lr grid, {column}",
    )
    best[column] = {r: by_label[NAMES[r]] for r in rules}
    bench.section(
      f"Learning rates at {column}: every rule on the same grid, seed {harness.TUNING_SEED}",
      grid_table + "\n\nOne run per rate; **bold**: the rate each rule runs at in this column (the best; the"
      " smaller on a tie).",
    )
  cells = run_columns(bench, args, config_name, data_name, base, rules, best)
  # Seeds that separate: 5 for neighbours of the claimed order (and OrMo against ASGD) within two std.
  if args.size != "tiny":
    close = {}
    order = [r for r in CLAIMED_ORDER if r in rules]
    for column, row in cells.items():
      pairs = [*zip(order, order[1:]), ("ormo", "asp")]
      close[column] = {
        r for a, b in pairs for r in (a, b) if harness.too_close(row[a], row[b], "final_accuracy")
      }
    more = run_columns(bench, args, config_name, data_name, base, rules, best, seeds=5, only=close)
    for column, row in more.items():
      cells[column].update(row)
  cols = list(cells)
  config = next(iter(cells[cols[0]].values())).config
  task = f"{config.data.name} + {config.model.name}"  # what ran (tiny swaps in the MLP)
  rows = [
    [NAMES[r]]
    + [
      f"{cells[c][r].text('final_train_loss', 3)} / {cells[c][r].text('final_accuracy', 2, 100)}"
      + ("" if len(cells[c][r].results) == bench.seeds else f" [{len(cells[c][r].results)} seeds]")
      for c in cols
    ]
    for r in rules
  ]
  target = config.run.target_accuracy
  gradients = {
    c: bench.config(
      config_name, [*base, *layout[c][0], *budget(args.size, data_name, layout[c][1])]
    ).run.gradients
    for c in cols
  }
  budget_words = ", ".join(f"{c} {g} gradients" for c, g in gradients.items())
  bench.section(
    f"Final training loss / test accuracy % ({task}), mean ± std over the seeds",
    harness.table(["rule", *cols], rows)
    + f"\n\nBudgets: {budget_words}. Training loss: the mean batch loss over the last 10% of events (the"
    ' paper\'s "training loss" is not defined further). Test accuracy: the final model on the held-out split.'
    f" `[5 seeds]`: a cell given 5 seeds, its neighbour in the claimed order being within two std.",
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
    harness.table(["rule", *cols], reach)
    + "\n\nA cell with `(n/m)` averages the n of m seeds that reached the target; `-`: none did.",
  )
  rank = []
  for c in cols:
    order = sorted(rules, key=lambda r: -(cells[c][r].mean("final_accuracy") or 0.0))
    rank.append([c, " > ".join(NAMES[r] for r in order)])
  bench.section(
    "Ranking by mean final accuracy (ours; the paper's CIFAR order is OrMo-DA ≳ OrMo > SMEGA² > shifted > ASGD > naive)",
    harness.table(["column", "best to worst"], rank),
  )
  full, steps = decide(cells, rules)
  tested = sum(1 for rows_ in steps.values() for row in rows_ if row[3] != "nan")
  bench.section(
    "The claimed order, step by step: accuracy difference (points, mean ± its standard error), Welch's t-test",
    f"*p*: Welch's two-sided t-test on the seeds' final accuracies; *p (Holm)*: adjusted over all {tested} "
    "tests of this section (Holm, 1979), the one the verdict reads: *significant* means below 0.05 after it.\n\n"
    + "\n\n".join(
      f"**{c}**\n\n" + harness.table(["step", "difference", "p", "p (Holm)", "verdict"], steps[c])
      for c in cols
    ),
  )
  # Every verdict again at half the budget: the same picks, each cell with its full-budget cell's seeds.
  ran = {(c, r): harness.seeds_ran(cell) for c, row in cells.items() for r, cell in row.items()}
  half_cells = run_columns(bench, args, config_name, data_name, base, rules, best, fraction=0.5, seeds=ran)
  half, _ = decide(half_cells, rules)
  picks = "; ".join(f"{c}: " + ", ".join(f"{NAMES[r]} {best[c][r]:g}" for r in rules) for c in cols)
  seeds = harness.seed_range([cells[c][r] for c in cols for r in rules])
  budget_text = "586 gradients per worker (16: 5 epochs, 64: 20)" if args.size != "tiny" else budget_words
  bench.decided(PAPER_NAME, full, half, budget=budget_text, seeds=seeds, picks=picks)
  if args.size != "tiny":
    paper_values = PAPER_CIFAR100 if args.data_dir and args.dataset == "cifar100" else PAPER_CIFAR10
    paper = [[NAMES[r], *paper_values[r]] for r in rules]
    which = "CIFAR-100" if paper_values is PAPER_CIFAR100 else "CIFAR-10"
    bench.section(
      f"The paper's {which} + ResNet-20 values (loss / accuracy %, docs/algorithms.md §16), for reading beside ours",
      harness.table(["rule", "16 hom.", "64 hom.", "16 het.", "64 het."], paper),
    )
  bench.compare_figure(
    "accuracy_vs_time", {c: {cells[c][r].label: cells[c][r].histories for r in rules} for c in cols}
  )
  bench.section(
    "Reproduce one cell",
    "Each cell is `jaxsync train` on the shipped config with overrides, e.g.:\n\n"
    + harness.code([cells[c][rules[-1]].command for c in cols]),
  )
  bench.write()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
