"""How often `jaxsync advise` picks the winner of the full runs, from the beginning of them.

For each scenario (a shipped config and its compare strategies), every
candidate runs the whole run on each seed, evaluated at equal event counts
(``jaxsync.sim.short_run`` over all the gradients). The *winner* is what the
full runs say: ``jaxsync.sim.rank`` on them, by time to the config's target
accuracy (measured where reached). The *advisor* sees only the first 10%, 25%
or 50% of the same runs (``jaxsync.sim.prefix``): the simulator is
deterministic and a prefix at a whole number of evaluation intervals equals a
short run of that length (tested in ``tests/sim/test_advisor.py``), so this is
exactly what ``jaxsync advise --fraction F`` would have run. Reported per
scenario and fraction: the advisor's pick, whether it is decisive, and whether
it matches the full runs' winner; then the hit rate over scenarios.

Every run is appended to ``benchmarks/results/advisor_check_runs.jsonl`` with its evaluations and, for
the whole run and each fraction, what the advisor reads of that prefix (its events, simulated time, updates
and whether its last tenth of training losses is finite); a rerun skips what the store holds and
``--report-only`` rewrites the results file from it.

Sizes:
  tiny     digits, an MLP, 2 strategies, 1 scenario, 1 seed: the suite's smoke test.
  default  Fashion-MNIST with the paper configs' LeNet and protocols, their compare strategies,
           the first 2.5 of their 5 epochs, 3 seeds (about 2 hours on 2 cores).
  full     the configs' whole 5 epochs, 3 seeds.

    python benchmarks/advisor_check.py [--size tiny|default|full] [--seeds N] [--report-only]
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import _harness
import _store
import numpy as np

from jaxsync._src.advisor import advisor
from jaxsync._src.app import experiment
from jaxsync._src.interface.history import History
from jaxsync._src.train import training

FRACTIONS = (0.1, 0.25, 0.5)
EVALUATIONS = 40  # of the full run: a whole number of them at each fraction (4, 10, 20)
# scenario: (config, overrides), the candidates being the config's compare.strategies
SCENARIOS = {
  "OrMo table, 16 het.": ("fashion_mnist/ormo_table", []),
  "adaptive k, 32 workers, 10 Gbit/s": ("fashion_mnist/adaptive_k_comparison", []),
  "EA-wild, 16 workers": ("fashion_mnist/ea_wild_comparison", []),
  "InHAD, 4 nodes x 4": ("fashion_mnist/inhad_layouts", []),
}
TINY = {
  "digits, 8 workers, 2 slow": (
    "quickstart",
    ["model.name=mlp", "model.hidden=[32]", "run.gradients=800", "run.target_accuracy=0.8"],
  )
}


def views(history: History) -> dict[str, dict]:
  """What the advisor reads of the whole run and of each fraction's prefix, besides the evaluations."""
  out = {}
  for fraction in (*FRACTIONS, 1.0):
    p = advisor.prefix(history, round(fraction * len(history.time)))
    tail = max(1, len(p.loss) // 10)
    loss = np.asarray(p.loss[-tail:])[~np.asarray(p.rejected[-tail:], bool)]
    out[f"{fraction:g}"] = {
      "events": len(p.time),
      "time": p.elapsed,
      "updates": p.updates,
      "loss_tail_finite": bool(np.isfinite(loss).all()),
    }
  return out


def view(history: History, point: dict) -> History:
  """A stored run's prefix as ``advisor.rank`` reads it: the evaluations within it, its last event's time and
  updates, and one training loss standing for its last tenth (NaN when one of those was not finite)."""
  keep = np.asarray(history.eval_event) <= point["events"]

  def one(value, dtype):
    return np.asarray([value], dtype)

  return dataclasses.replace(
    history,
    time=one(point["time"], float),
    worker=one(0, int),
    staleness=one(0, int),
    version=one(point["updates"], int),
    released=one(True, bool),
    k=one(1, int),
    loss=one(0.0 if point["loss_tail_finite"] else math.nan, float),
    rejected=one(False, bool),
    step_size=one(math.nan, float),
    eval_time=history.eval_time[keep],
    eval_version=history.eval_version[keep],
    eval_event=history.eval_event[keep],
    eval_metrics={k: v[keep] for k, v in history.eval_metrics.items()},
  )


def main(argv: list[str]) -> int:
  args = _harness.parser(__doc__).parse_args(argv)
  bench = _harness.Benchmark(
    "advisor_check", "The advisor's pick from short runs against the full runs' winner", args, argv, seeds=3
  )
  bench.keeps_run_dirs = False
  scenarios = TINY if args.size == "tiny" else SCENARIOS
  scale = {"tiny": 1.0, "default": 0.5, "full": 1.0}[args.size]
  strategies_of = {"tiny": ["asp", "bsp"]}
  rows, picks, curves = [], {f: [] for f in FRACTIONS}, {}
  for scenario, (config_name, overrides) in scenarios.items():
    config = bench.config(config_name, overrides)
    gradients = max(EVALUATIONS, round(scale * config.run.gradients))
    names = strategies_of.get(args.size) or config.compare.strategies
    full: dict[str, list] = {}
    prefixes: dict[str, list] = {}
    tag = f"short_run(gradients={gradients}, evaluations={EVALUATIONS})"
    for name in names:
      for i in range(bench.seeds):
        cfg = experiment.for_strategy(config, name, config.seed + i)
        exp = experiment.build(cfg)
        stored = bench.store.find(cfg, tag)
        if stored is None and bench.report_only:
          bench.missing.append(f"{scenario} | {name} | seed {cfg.seed}")
          continue
        if stored is None:
          history = exp.short_run(gradients, evaluations=EVALUATIONS)
          stored = bench.store.add(
            cfg,
            training.RunResult(None, history, {}, None),
            setting=scenario,
            label=name,
            code=_harness.code_version(),
            measures=views(history),
            tag=tag,
          )
        bench.run_count += 1
        bench.used_keys.add(_store.config_key(cfg, tag))
        history, points = stored.history, bench.store.measures(cfg, tag)
        full.setdefault(name, []).append(view(history, points["1"]))
        prefixes.setdefault(name, []).append((history, points))
        curves.setdefault(scenario, {}).setdefault(name, []).append(
          {
            "seed": exp.config.seed,
            "eval_time": history.eval_time.tolist(),
            "eval_event": history.eval_event.tolist(),
            "accuracy": history.eval_metrics["accuracy"].tolist(),
          }
        )
        print(
          f"[advisor_check {bench.elapsed()}] {scenario} | {name} | seed {exp.config.seed}: "
          f"accuracy {history.eval_metrics['accuracy'][-1]:.3f} at {history.elapsed:.3g} s",
          file=sys.stderr,
          flush=True,
        )
    if sum(len(runs) for runs in full.values()) < len(names) * bench.seeds:  # the store lacks runs
      rows += [[scenario, f"{f:g}", *["missing"] * 6] for f in FRACTIONS]
      continue
    target = config.run.target_accuracy
    chance = 1.0 / exp.dataset.num_classes
    truth = advisor.rank(full, target=target, chance=chance)
    bench.section(
      f"{scenario}: the full runs ({gradients} gradients, {bench.seeds} seed(s))",
      f"Config `configs/{config_name}.yaml`"
      + (f" with `{' '.join(overrides)}`" if overrides else "")
      + f"; target accuracy {target:g}.\n\n{truth.table()}\n\nWinner: **{truth.recommended}**"
      + ("" if truth.decisive else f" (not separated from {', '.join(truth.tied)} over the seeds)")
      + ".",
    )
    for fraction in FRACTIONS:
      short = {
        name: [view(h, points[f"{fraction:g}"]) for h, points in runs] for name, runs in prefixes.items()
      }
      advice = advisor.rank(short, target=target, chance=chance)
      hit = advice.recommended == truth.recommended
      among = hit or truth.recommended in advice.tied
      picks[fraction].append((hit, among))
      runner = advice.ranking[1].strategy if len(advice.ranking) > 1 else "-"
      reach = advice.ranking[0].reach
      rows.append(
        [
          scenario,
          f"{fraction:g}",
          advice.recommended,
          "yes" if advice.decisive else f"no (tied: {', '.join(advice.tied)})",
          "measured" if reach <= 1 else f"{reach:.1f}x" if math.isfinite(reach) else "-",
          runner,
          truth.recommended,
          "hit" if hit else "among the tied" if among else "miss",
        ]
      )
  bench.section(
    "The advisor's pick against the full runs' winner",
    _harness.table(
      [
        "scenario",
        "fraction",
        "advisor's pick",
        "decisive",
        "reach",
        "advisor's runner-up",
        "full runs' winner",
        "verdict",
      ],
      rows,
    )
    + "\n\nReach: how far the pick's estimate lies beyond the short runs (measured: reached within them).",
  )
  summary = [
    [
      f"{f:g}",
      f"{sum(h for h, _ in picks[f])} of {len(picks[f])}",
      f"{sum(a for _, a in picks[f])} of {len(picks[f])}",
    ]
    for f in FRACTIONS
  ]
  bench.section(
    "Hit rate",
    _harness.table(["fraction of the run", "picks the winner", "winner among its pick and ties"], summary),
  )
  bench.results_dir.mkdir(parents=True, exist_ok=True)
  (bench.results_dir / "advisor_check.json").write_text(json.dumps(curves))
  bench.section(
    "Data",
    "Every run's evaluations (simulated time, events, accuracy) are in `advisor_check.json` beside this file.",
  )
  bench.write()
  print(
    "advisor hit rate: "
    + ", ".join(f"{f:g}: {sum(h for h, _ in picks[f])}/{len(picks[f])}" for f in FRACTIONS)
  )
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
