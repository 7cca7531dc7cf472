"""How often `jaxsync advise` picks the winner of the full runs, from the beginning of them.

For each of 13 scenarios (the four Fashion-MNIST paper configs and the OrMo table's equal workers, each with
its compare strategies; the low-communication family against ASP and DC-ASGD at 8 and 32 workers, on slow and
fast links, with and without stragglers; the Jargon File's small transformer), every candidate is tuned for
the scenario on one log-spaced grid (``GRID``, or ``ADAMW_GRID`` for the AdamW-driven candidates; extended
past an edge pick) on the held-out seed's validation split, on the time to the target (what the advisor ranks
by); then it runs the whole run at that rate on each seed,
evaluated at equal event counts (``Experiment.short_run`` over all the gradients), trained without the 10%
validation slice of the training set that ``jaxsync advise`` scores on, and evaluated on both it and the test
set. The *winner* is what the full runs say on the test set: ``jaxsync.advisor.rank`` on them, by time to the
target (measured where reached). Where the
full runs cannot separate their winner from the runner-up over 3 seeds, the scenario runs 5. The *advisor*
sees only the validation accuracy of the first 10%, 25% or 50% of the same runs (``jaxsync.advisor.prefix``): the simulator is
deterministic and a prefix at a whole number of evaluation intervals equals a short run of that length
(tested in ``tests/advisor/test_advisor.py``), so this is exactly what ``jaxsync advise --fraction F``
would have run. Reported per scenario and fraction: the advisor's pick, whether it is decisive, and whether
it matches the full runs' winner; then the hit rate over scenarios with Wilson's 95% interval (over all of
them, and over those whose full runs separate a winner), at the budget and again at half of it (the same picks
and seeds; a different hit rate marks the verdict budget-sensitive).

The runs: the MLP (so that every candidate can be tuned on 2 cores) for ``EPOCHS`` epochs, the configs'
schedules scaled to that length, the target accuracy ``TARGET``, as in the paper benchmarks. Every run is
appended to ``benchmarks/results/advisor_check_runs.jsonl`` (the full runs with their evaluations and, for
the whole run and each fraction, what the advisor reads of that prefix: its events, simulated time, updates
and whether its last tenth of training losses is finite); a rerun skips what the store holds and
``--report-only`` rewrites the results file from it.

Sizes:
  tiny     digits, an MLP, 2 strategies, 1 scenario, 1 seed, a one-rate grid: the suite's smoke test.
  default  the 13 scenarios (the paper configs' 10 epochs of the MLP), 3-5 seeds.
  full     the same with the configs' own LeNet.

    python -m benchmarks.claims.advisor_check [--size tiny|default|full] [--seeds N] [--report-only]
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import sys
import time

import numpy as np

from benchmarks.common import harness
from benchmarks.common import store as results_store
from jaxsync._src.advisor import advisor
from jaxsync._src.app import experiment
from jaxsync._src.interface.history import History
from jaxsync._src.train import training

FRACTIONS = (0.1, 0.25, 0.5)
EVALUATIONS = 40  # of the full run: a whole number of them at each fraction (4, 10, 20)
EPOCHS = 10
TARGET = 0.84
GRID = (0.003, 0.01, 0.03, 0.1)
ADAMW_GRID = (3e-4, 1e-3, 3e-3, 1e-2)  # the local-update family's inner AdamW (and all-reduce Adam's) rates


@dataclasses.dataclass(frozen=True)
class Scenario:
  """A scenario: a config and its overrides, the candidates being its ``compare.strategies``.

  ``paper``: a paper config whose run is scaled to ``EPOCHS`` epochs of the size's model (``scaled``);
  otherwise the overrides give the whole run, and half the budget is half its gradients. ``grids``: a
  candidate's own grid (default ``GRID``)."""

  config: str
  overrides: tuple[str, ...] = ()
  paper: bool = True
  grids: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)


# The low-communication family against the parameter-server family (as benchmarks.claims.low_communication runs
# them: the MLP on Fashion-MNIST, 800 gradients per worker, a constant rate, the papers' outer rate 0.7).
LOW_COMMUNICATION = {
  "allreduce": {"server_optimizer": "adam"},
  "diloco": {"period": 50},
  "streaming_diloco": {"period": 50},
  "async_local_sgd": {"period": 50, "dylu": True},
  "dc_asgd": {"adaptive": True, "variance_control": 2.0},
}
LOCAL_GRIDS = {name: ADAMW_GRID for name in ("allreduce", "diloco", "streaming_diloco", "async_local_sgd")}


def low_communication(workers: int, link: str, slow: bool) -> Scenario:
  return Scenario(
    "fashion_mnist",
    (
      "model.name=mlp", "model.hidden=[128]", "strategy.options={}", "strategy.schedule.kind=constant",
      f"cluster.num_workers={workers}", "cluster.compute_time=null", f"cluster.link={link}",
      f"cluster.slow_fraction={0.25 if slow else 0.0}", f"cluster.slowdown={4.0 if slow else 1.0}",
      "cluster.server_bandwidth=10GB/s", f"run.gradients={800 * workers}", "run.checkpoint_every=null",
      "run.target_accuracy=0.8", f"compare.strategies=[{', '.join(['asp', *LOW_COMMUNICATION])}]",
      f"compare.options={json.dumps(LOW_COMMUNICATION)}",
    ),
    paper=False,
    grids=LOCAL_GRIDS,
  )  # fmt: skip


# The Jargon File's small transformer at 8 workers, 400 steps each, a quarter of them 4x slower (the cluster's
# default, written out): all-reduce Adam against DiLoCo (H = 10), Streaming DiLoCo and asynchronous local SGD,
# to 28% next-byte accuracy.
LANGUAGE_MODEL = Scenario(
  "jargon_transformer",
  (
    "strategy.options={}", "strategy.schedule.kind=constant", "cluster.num_workers=8", "cluster.link=100mbps",
    "cluster.slow_fraction=0.25", "cluster.slowdown=4.0",
    "run.gradients=3200", "run.checkpoint_every=null", "run.target_accuracy=0.28", "compare.strategies=[allreduce, diloco, streaming_diloco, async_local_sgd]",
    'compare.options={"allreduce": {"server_optimizer": "adam"}, "diloco": {"period": 10},'
    ' "streaming_diloco": {"period": 10}, "async_local_sgd": {"period": 10}}',
  ),
  paper=False,
  grids=LOCAL_GRIDS,
)  # fmt: skip
SCENARIOS = {
  "OrMo table, 16 het.": Scenario("fashion_mnist/ormo_table"),
  "adaptive k, 32 workers, 10 Gbit/s": Scenario("fashion_mnist/adaptive_k_comparison"),
  "EA-wild, 16 workers": Scenario("fashion_mnist/ea_wild_comparison"),
  "InHAD, 4 nodes x 4": Scenario("fashion_mnist/inhad_layouts"),
  "OrMo table, 16 hom.": Scenario("fashion_mnist/ormo_table", ("cluster.slow_fraction=0.0",)),
  "low communication, 8 workers, 100 Mbit/s": low_communication(8, "100mbps", slow=False),
  "low communication, 8 workers, 10 Gbit/s": low_communication(8, "10gbps", slow=False),
  "low communication, 32 workers, 100 Mbit/s": low_communication(32, "100mbps", slow=False),
  "low communication, 32 workers, 10 Gbit/s": low_communication(32, "10gbps", slow=False),
  "low communication, 8 workers, 100 Mbit/s, a quarter 4x slower": low_communication(8, "100mbps", slow=True),
  "low communication, 8 workers, 10 Gbit/s, a quarter 4x slower": low_communication(8, "10gbps", slow=True),
  "low communication, 32 workers, 1 Gbit/s, a quarter 4x slower": low_communication(32, "1gbps", slow=True),
  "language model, 8 workers, 100 Mbit/s, a quarter 4x slower": LANGUAGE_MODEL,
}
TINY = {
  "digits, 8 workers, 2 slow": Scenario(
    "quickstart", ("model.name=mlp", "model.hidden=[32]", "run.gradients=800", "run.target_accuracy=0.8")
  )
}
TINY_STRATEGIES = ["asp", "bsp"]
TINY_GRID = (0.02,)  # the quickstart config's rate
ADVISOR_METRIC = "validation_accuracy"  # what jaxsync advise ranks by; the full runs' winner: test accuracy
CLAIM = "`jaxsync advise` picks the full runs' winner from the first 10%, 25%, 50% of them"


def scaled(config, size: str, fraction: float = 1.0) -> list[str]:
  """The overrides that make a paper config's run ``EPOCHS`` epochs (times ``fraction``) of the size's
  model, its schedule's epochs scaled with the run, the target ``TARGET``; tiny: the run's gradients times
  ``fraction``."""
  if size == "tiny":
    return [] if fraction == 1.0 else [f"run.gradients={round(fraction * config.run.gradients)}"]
  epochs = EPOCHS * fraction
  gradients = round(epochs * 60_000 / config.data.batch_size)
  factor = gradients / config.run.gradients  # the config's schedule counts epochs of its own run
  schedule = config.strategy.schedule
  out = [
    *(["model.name=mlp"] if size == "default" else []),
    f"run.gradients={gradients}",
    "run.checkpoint_every=null",
    f"run.target_accuracy={TARGET}",
  ]
  if schedule.unit == "epochs":
    out.append(f"strategy.schedule.warmup={schedule.warmup * factor:g}")
    if schedule.boundaries:
      out.append(
        f"strategy.schedule.boundaries=[{', '.join(f'{b * factor:g}' for b in schedule.boundaries)}]"
      )
  return out


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


def full_runs(bench, scenario: str, config, names, rates: dict[str, float], seeds: int) -> dict[str, list]:
  """Each candidate's whole run on each seed at its tuned rate, from the store or run (and stored):
  ``{name: [(seed, history, what the advisor reads of each prefix)]}``, the seeds the store lacks left out
  (``--report-only``)."""
  gradients = config.run.gradients
  tag = f"short_run(gradients={gradients}, evaluations={EVALUATIONS})"
  if not bench.picks_on_test_set:  # (the earlier protocol's runs read the test set only)
    # The runs hold out the validation slice that jaxsync advise's short runs score on: the advisor reads it
    # in each prefix, the full runs' winner is decided on the test set.
    data = dataclasses.replace(config.data, validation=config.data.validation or experiment.TUNING_VALIDATION)
    config = dataclasses.replace(config, data=data)
  out: dict[str, list] = {}
  for name in names:
    for i in range(seeds):
      cfg = experiment.for_strategy(config, name, config.seed + i)
      options = {**cfg.strategy.options, "learning_rate": rates[name]}
      cfg = dataclasses.replace(cfg, strategy=dataclasses.replace(cfg.strategy, options=options))
      stored = bench.store.find(cfg, tag)
      if stored is None and bench.report_only:
        bench.missing.append(f"{scenario} | {name} | seed {cfg.seed}")
        continue
      reused = stored is not None
      if stored is None:
        exp = experiment.build(cfg)
        started = time.perf_counter()  # the run's own training, as the harness's runs record it
        history = exp.short_run(gradients, evaluations=EVALUATIONS)
        stored = bench.store.add(
          cfg,
          training.RunResult(None, history, {"wall_seconds": time.perf_counter() - started}, None),
          setting=scenario,
          label=name,
          code=harness.code_version(),
          measures=views(history),
          tag=tag,
        )
        print(
          f"[advisor_check {bench.elapsed()}] {scenario} | {name} | seed {cfg.seed}: accuracy"
          f" {history.eval_metrics['accuracy'][-1]:.3f} at {history.elapsed:.3g} s",
          file=sys.stderr,
          flush=True,
        )
      bench.count_run(results_store.config_key(cfg, tag), stored.summary, reused=reused)
      out.setdefault(name, []).append((cfg.seed, stored.history, bench.store.measures(cfg, tag)))
  return out


def complete(runs: dict[str, list], names, seeds: int) -> bool:
  """Whether every candidate has all its seeds' runs (the store may lack some: ``--report-only``)."""
  return all(len(runs.get(n, [])) == seeds for n in names)


def evaluations(runs: dict[str, list]) -> dict[str, list[dict]]:
  """Every run's evaluations, for ``advisor_check.json``."""
  return {
    name: [
      {
        "seed": seed,
        "eval_time": h.eval_time.tolist(),
        "eval_event": h.eval_event.tolist(),
        "accuracy": h.eval_metrics["accuracy"].tolist(),
      }
      for seed, h, _ in found
    ]
    for name, found in runs.items()
  }


@dataclasses.dataclass
class Check:
  """One scenario's full runs and the advisor's pick from each fraction of them."""

  scenario: str
  truth: advisor.Advice
  advice: dict[float, advisor.Advice]

  def hit(self, fraction: float) -> bool:
    return self.advice[fraction].recommended == self.truth.recommended

  def among(self, fraction: float) -> bool:
    """The full runs' winner is the advisor's pick or one it could not separate from its pick."""
    return self.hit(fraction) or self.truth.recommended in self.advice[fraction].tied

  def confident_miss(self, fraction: float) -> bool:
    return self.advice[fraction].decisive and not self.hit(fraction)


def check(scenario: str, runs: dict[str, list], target: float, chance: float) -> Check:
  """What the full runs say and what the advisor says from each fraction of them."""
  truth = advisor.rank(
    {n: [view(h, p["1"]) for _, h, p in r] for n, r in runs.items()}, target=target, chance=chance
  )
  # The advisor reads the validation split, as jaxsync advise does (runs stored before it read the test set).
  metric = (
    ADVISOR_METRIC
    if all(ADVISOR_METRIC in h.eval_metrics for r in runs.values() for _, h, _ in r)
    else "accuracy"
  )
  advice = {
    f: advisor.rank(
      {n: [view(h, p[f"{f:g}"]) for _, h, p in r] for n, r in runs.items()},
      metric=metric,
      target=target,
      chance=chance,
    )
    for f in FRACTIONS
  }
  return Check(scenario, truth, advice)


def decide(checks: list[Check], scenarios: int) -> dict[str, tuple[str, str]]:
  """The hit rate as a verdict: ``{claim: (hits per fraction, what they rest on)}``."""
  n = len(checks)
  counts = ", ".join(str(sum(c.hit(f) for c in checks)) for f in FRACTIONS)
  among = ", ".join(str(sum(c.among(f) for c in checks)) for f in FRACTIONS)
  misses = [
    f"{c.scenario} at {f:g} ({c.advice[f].recommended} for {c.truth.recommended})"
    for c in checks
    for f in FRACTIONS
    if c.confident_miss(f)
  ]
  separated = [c for c in checks if c.truth.decisive]
  evidence = (
    f"{among} of {n} counting the candidates it could not separate from its pick; confident misses (decisive"
    f" and wrong): {'; '.join(misses) or 'none'}; the full runs separate their winner in {len(separated)} of"
    f" {n} scenarios"
    + (f" ({', '.join(f'{c.truth.recommended} in {c.scenario}' for c in separated)})" if separated else "")
  )
  if n < scenarios:
    evidence += f"; {scenarios - n} of {scenarios} scenarios not in the store yet"
  hit = sum(c.hit(FRACTIONS[-1]) for c in checks)
  low, high = wilson(hit, n)
  decisive_hits = sum(c.hit(FRACTIONS[-1]) for c in separated)
  low_d, high_d = wilson(decisive_hits, len(separated))
  number = harness.Deciding(
    f"{hit} of {n} scenarios right from {100 * FRACTIONS[-1]:g}% of the runs (95% interval {low:.0%}-{high:.0%});"
    f" {decisive_hits} of {len(separated)} where the full runs separate a winner ({low_d:.0%}-{high_d:.0%})"
  )
  evidence += (
    "; hit rates with Wilson's 95% intervals, from 10%, 25%, 50% of the runs: "
    + ", ".join(f"{sum(c.hit(f) for c in checks)}/{n} ({_interval(sum(c.hit(f) for c in checks), n)})" for f in FRACTIONS)
  )  # fmt: skip
  return {CLAIM: (f"**{counts} of {n}** (scenarios, from 10%, 25%, 50% of the runs)", evidence, number)}


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
  """Wilson's score interval for a hit rate ``hits / n`` (95% at ``z = 1.96``); (0, 1) when ``n = 0``."""
  if n == 0:
    return 0.0, 1.0
  p = hits / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return max(0.0, centre - half), min(1.0, centre + half)


def _interval(hits: int, n: int) -> str:
  low, high = wilson(hits, n)
  return f"{low:.0%}-{high:.0%}"


MODELS = {"mlp": "MLP", "transformer": "small transformer"}
DATASETS = {"fashion_mnist": "Fashion-MNIST", "jargon": "the Jargon File", "digits": "digits"}


def budget_text(config, *, paper: bool, size: str) -> str:
  """A scenario's run, e.g. ``10 epochs (18750 gradients) of the MLP on Fashion-MNIST``: the paper configs are
  scaled to ``EPOCHS`` epochs (of the MLP at the default size), the other scenarios run their own budget."""
  gradients = f"{config.run.gradients} gradients"
  model = "MLP" if paper and size == "default" else MODELS.get(config.model.name, config.model.name)
  run = f"{EPOCHS} epochs ({gradients})" if paper else gradients
  return f"{run} of the {model} on {DATASETS.get(config.data.name, config.data.name)}"


def main(argv: list[str]) -> int:
  args = harness.parser(__doc__).parse_args(argv)
  bench = harness.Benchmark(
    "advisor_check", "The advisor's pick from short runs against the full runs' winner", args, argv, seeds=3
  )
  bench.keeps_run_dirs = False
  tiny = args.size == "tiny"
  scenarios = TINY if tiny else SCENARIOS
  checks: dict[float, list[Check]] = {1.0: [], 0.5: []}
  rows: dict[float, list[list[str]]] = {1.0: [], 0.5: []}
  curves: dict = {}
  picks: dict[tuple[str, str], float] = {}
  seeds_used, budgets = [], []
  for scenario, spec in scenarios.items():
    config_name, overrides = spec.config, list(spec.overrides)
    shipped = bench.config(config_name, overrides)
    full_budget = scaled(shipped, args.size) if spec.paper else []
    config = bench.config(config_name, [*overrides, *full_budget])
    names = TINY_STRATEGIES if tiny else list(config.compare.strategies)
    grids: dict[tuple[float, ...], list[str]] = {}
    for n in names:  # one tuning per grid: the candidates of a grid tuned together, as one table
      grids.setdefault(TINY_GRID if tiny else spec.grids.get(n, GRID), []).append(n)
    texts = []
    for grid, members in grids.items():
      rates, text = bench.tune(
        config, {n: (n, {}) for n in members}, grid, evaluations=EVALUATIONS,
        objective="time", extend=not tiny, setting=f"lr grid, {scenario}",
      )  # fmt: skip
      picks.update({(scenario, n): r for n, r in rates.items()})
      texts.append(text)
    rates = {n: picks[(scenario, n)] for n in names}
    bench.section(
      f"{scenario}: learning rates, seed {harness.TUNING_SEED}",
      "\n\n".join(texts) + "\n\n**Bold**: the fastest to the target (the rate of every run below).",
    )
    target = config.run.target_accuracy
    chance = 1.0 / experiment.build(config).dataset.num_classes
    seeds = bench.seeds
    runs = full_runs(bench, scenario, config, names, rates, seeds)
    if (
      complete(runs, names, seeds)
      and not tiny
      and args.seeds is None
      and not check(scenario, runs, target, chance).truth.decisive
    ):
      seeds = 5  # the winner not separated over 3 seeds: 5
      runs = full_runs(bench, scenario, config, names, rates, seeds)
    curves[scenario] = evaluations(runs)
    seeds_used.append(seeds)
    budgets.append(budget_text(config, paper=spec.paper and not tiny, size=args.size))
    half_budget = (
      scaled(shipped, args.size, 0.5) if spec.paper else [f"run.gradients={round(config.run.gradients / 2)}"]
    )
    half_config = bench.config(config_name, [*overrides, *half_budget])
    half_runs = full_runs(bench, f"{scenario}, half the budget", half_config, names, rates, seeds)
    for budget, found, cfg in ((1.0, runs, config), (0.5, half_runs, half_config)):
      if not complete(found, names, seeds):  # the store lacks runs (--report-only)
        rows[budget] += [[scenario, f"{f:g}", *["missing"] * 6] for f in FRACTIONS]
        continue
      c = check(scenario, found, target, chance)
      checks[budget].append(c)
      rows[budget] += advice_rows(c)
      if budget == 1.0:
        bench.section(
          f"{scenario}: the full runs ({cfg.run.gradients} gradients, {seeds} seed(s))",
          f"Config `configs/{config_name}.yaml` with `{' '.join([*overrides, *full_budget])}`;"
          f" target accuracy {target:g}.\n\n{c.truth.table()}\n\nWinner: **{c.truth.recommended}**"
          + ("" if c.truth.decisive else f" (not separated from {', '.join(c.truth.tied)} over the seeds)")
          + ".",
        )
  header = [
    "scenario",
    "fraction",
    "advisor's pick",
    "decisive",
    "reach",
    "advisor's runner-up",
    "full runs' winner",
    "verdict",
  ]
  for budget, what in ((1.0, "the budget"), (0.5, "half the budget")):
    bench.section(
      f"The advisor's pick against the full runs' winner, at {what}",
      harness.table(header, rows[budget])
      + "\n\nReach: how far the pick's estimate lies beyond the short runs (measured: reached within them).",
    )
    bench.section(f"Hit rate, at {what}", hit_table(checks[budget]))
  budget = "; ".join(f"{b} ({n} scenario{'s' * (n > 1)})" for b, n in collections.Counter(budgets).items())
  bench.decided(
    "jaxsync's advisor",
    decide(checks[1.0], len(scenarios)),
    decide(checks[0.5], len(scenarios)),
    budget=budget,
    seeds="-".join(map(str, sorted({min(seeds_used), max(seeds_used)}))),
    picks=harness.picks_text("time", picks),
  )
  bench.results_dir.mkdir(parents=True, exist_ok=True)
  (bench.results_dir / "advisor_check.json").write_text(json.dumps(curves))
  bench.section(
    "Data",
    "Every full run's evaluations (simulated time, events, accuracy) are in `advisor_check.json` beside this"
    " file.",
  )
  bench.write()
  print(
    "advisor hit rate: "
    + ", ".join(f"{f:g}: {sum(c.hit(f) for c in checks[1.0])}/{len(checks[1.0])}" for f in FRACTIONS)
  )
  return 0


def advice_rows(c: Check) -> list[list[str]]:
  """The advice table's rows of one scenario: one per fraction."""
  rows = []
  for fraction in FRACTIONS:
    advice = c.advice[fraction]
    runner = advice.ranking[1].strategy if len(advice.ranking) > 1 else "-"
    reach = advice.ranking[0].reach
    rows.append(
      [
        c.scenario,
        f"{fraction:g}",
        advice.recommended,
        "yes" if advice.decisive else f"no (tied: {', '.join(advice.tied)})",
        "measured"
        if reach <= 1
        else f"{reach:.1f}x"
        if reach < 1000
        else ">1000x"
        if math.isfinite(reach)
        else "-",
        runner,
        c.truth.recommended,
        "hit" if c.hit(fraction) else "among the tied" if c.among(fraction) else "miss",
      ]
    )
  return rows


def hit_table(checks: list[Check]) -> str:
  """Per fraction: how often the pick is the winner, the winner is among the pick and its ties, and the
  pick is decisive and wrong."""
  n = len(checks)
  return harness.table(
    [
      "fraction of the run",
      "picks the winner (95% interval)",
      "winner among its pick and ties",
      "confident misses",
    ],
    [
      [
        f"{f:g}",
        f"{sum(c.hit(f) for c in checks)} of {n} ({_interval(sum(c.hit(f) for c in checks), n)})",
        f"{sum(c.among(f) for c in checks)} of {n}",
        str(sum(c.confident_miss(f) for c in checks)),
      ]
      for f in FRACTIONS
    ],
  )


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
