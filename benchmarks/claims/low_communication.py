"""Low-communication training against the parameter-server family, on the harness: which model wins where.

DiLoCo (Douillard et al., 2023; H = 10, 50, 200 inner AdamW steps per outer Nesterov step), Streaming
DiLoCo (Douillard et al., 2025; two fragments, one step of overlap, mixing 0.5, int4 on the wire),
asynchronous local SGD (Liu et al., 2024; Delayed Nesterov, with and without Dynamic Local Updates) and
DC-ASGD (Zheng et al., ICML 2017) against synchronous all-reduce (SGD with momentum, and Adam: DiLoCo's
fully synchronous baseline), asynchronous SGD and OrMo (Shi, Yang, Li, NeurIPS 2024), on the simulated
cluster: 8 and 32 workers, links from 100 Mbit/s to 100 Gbit/s, with and without slow workers (a quarter
of them 4x slower).

Workload: an MLP (one hidden layer of 128) on Fashion-MNIST, its compute time from its FLOPs at 100
GFLOP/s, batch 32, 800 gradients per worker, a constant learning rate; the target 80% accuracy, held (the
first evaluation from which it stays there), 40 evaluations a run.

Protocol (the harness's, as the papers' benchmarks):

- **Tuning** per column: per worker count and link class (slow links: tuned at 100 Mbit/s, used at 100
  Mbit/s and 1 Gbit/s; fast links: tuned at 10 Gbit/s, used at 10 and 100 Gbit/s), equal workers, on the
  held-out seed's validation split (``harness.Benchmark.tune``), on the time to the target, one grid per
  optimizer family (``GRIDS``), extended past an edge pick. A local-update method's inner rate is picked at
  the papers' outer rate 0.7, then its outer rate on ``OUTER_GRID`` at that inner rate. DyLU, which differs
  from plain asynchronous local SGD only when workers differ in speed, runs at the plain method's picks.
- **Cells**: 3 seeds, 5 where a claim's two sides are within two standard deviations. A run whose updates
  cannot depend on the clock (all-reduce, DiLoCo, Streaming DiLoCo) is trained once and re-timed on every
  link (``Simulator.retime``, bit for bit; the store marks it ``retimed_from``).
- **Verdicts** per claim over its family of comparisons, Holm-corrected; two times within one evaluation
  interval are not told apart (``harness.time_test``). **At half the budget**: the same runs read at their
  half-way evaluation (a constant rate: the first half of a run is the run of half the budget).

The results store ``benchmarks/results/low_communication_runs.jsonl`` holds every run; a rerun skips what it
holds, so the benchmark runs in sittings, on several machines; ``--report-only`` rewrites the results file
from the store alone and names what it lacks. (The earlier, single-seed version of this benchmark and its
language-model part are archived under ``benchmarks/results/archive/``.)

Run: ``python -m benchmarks.claims.low_communication [--size tiny|default] [--workers 8,32] [--report-only]``.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np

from benchmarks.common import harness
from jaxsync._src.interface.history import crossing

NAME = "low_communication"
CONFIG = "fashion_mnist"
TARGET = 0.80
PER_WORKER = 800
EVALUATIONS = 40  # an even count: the half-way evaluation is the half budget's last
LINKS = ("100mbps", "1gbps", "10gbps", "100gbps")
# Each link class's tuning link: rates picked there serve the class's links.
LINK_CLASSES = {
  "slow links": ("100mbps", ("100mbps", "1gbps")),
  "fast links": ("10gbps", ("10gbps", "100gbps")),
}
SLOW = {"equal workers": (0.0, 1.0), "a quarter 4x slower": (0.25, 4.0)}  # (share of workers, slowdown)
GRIDS = {"sgd": (0.003, 0.01, 0.03, 0.1, 0.3), "adamw": (3e-4, 1e-3, 3e-3, 1e-2)}
OUTER_GRID = (0.1, 0.3, 0.7, 1.0, 1.5)
OUTER_DEFAULT = 0.7  # DiLoCo's and asynchronous local SGD's outer rate in their papers
NEAR_POINTS = 1.0  # "matches": within a point of final accuracy

# label: (strategy, options, optimizer family, family of synchronization models)
METHODS: dict[str, tuple[str, dict[str, Any], str, str]] = {
  "all-reduce SGD": ("allreduce", {"momentum": 0.9}, "sgd", "synchronous"),
  "all-reduce Adam": ("allreduce", {"server_optimizer": "adam"}, "adamw", "synchronous"),
  "ASP": ("asp", {}, "sgd", "parameter server"),
  "OrMo": ("ormo", {"momentum": 0.9}, "sgd", "parameter server"),
  "DC-ASGD-a": ("dc_asgd", {"adaptive": True, "variance_control": 2.0}, "sgd", "parameter server"),
  "DiLoCo H=10": ("diloco", {"period": 10}, "adamw", "local updates"),
  "DiLoCo H=50": ("diloco", {"period": 50}, "adamw", "local updates"),
  "DiLoCo H=200": ("diloco", {"period": 200}, "adamw", "local updates"),
  "Streaming DiLoCo H=50": ("streaming_diloco", {"period": 50}, "adamw", "local updates"),
  "async local SGD H=50": ("async_local_sgd", {"period": 50}, "adamw", "local updates"),
  "async local SGD H=50 DyLU": ("async_local_sgd", {"period": 50, "dylu": True}, "adamw", "local updates"),
}
TUNED_AS = {"async local SGD H=50 DyLU": "async local SGD H=50"}
PAPERS = {
  "diloco": "DiLoCo (Douillard et al., 2023)",
  "streaming": "Streaming DiLoCo (Douillard et al., 2025)",
  "async": "Asynchronous local SGD (Liu et al., 2024)",
  "dc_asgd": "DC-ASGD (Zheng et al., ICML 2017)",
}


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a sitting runs: the default benchmark, or the suite's tiny smoke size."""

  workers: tuple[int, ...] = (8, 32)
  per_worker: int = PER_WORKER
  links: tuple[str, ...] = LINKS
  classes: dict = dataclasses.field(default_factory=lambda: LINK_CLASSES)
  slow: tuple[str, ...] = tuple(SLOW)
  grids: dict = dataclasses.field(default_factory=lambda: GRIDS)
  outer_grid: tuple[float, ...] = OUTER_GRID
  methods: tuple[str, ...] = tuple(METHODS)
  extend: bool = True


TINY = Plan(
  workers=(8,),
  per_worker=20,
  links=("100mbps", "10gbps"),
  classes={"slow links": ("100mbps", ("100mbps",)), "fast links": ("10gbps", ("10gbps",))},
  grids={"sgd": (0.1,), "adamw": (3e-3,)},
  outer_grid=(0.7,),
  methods=("all-reduce Adam", "ASP", "DC-ASGD-a", "DiLoCo H=10"),
  extend=False,
)


def local_updates(method: str) -> bool:
  return METHODS[method][3] == "local updates"


def link_class(plan: Plan, link: str) -> str:
  return next(c for c, (_, links) in plan.classes.items() if link in links)


def overrides(plan: Plan, workers: int, link: str, slow: str) -> list[str]:
  """A cell's config: the workload, the cluster, the budget, 40 evaluations."""
  fraction, slowdown = SLOW[slow]
  gradients = plan.per_worker * workers
  return [
    "model.name=mlp",
    "model.hidden=[128]",
    "data.batch_size=32",
    "strategy.options={}",
    "strategy.schedule.kind=constant",
    f"cluster.num_workers={workers}",
    "cluster.compute_time=null",
    f"cluster.slow_fraction={fraction}",
    f"cluster.slowdown={slowdown}",
    f"cluster.link={link}",
    "cluster.server_bandwidth=10GB/s",
    f"run.gradients={gradients}",
    "run.checkpoint_every=null",
    f"run.target_accuracy={TARGET}",
  ]


def tune(bench, plan: Plan, workers: int) -> dict[tuple[str, str], dict[str, float]]:
  """Each method's ``{"learning_rate", "outer_learning_rate"?}`` per link class at ``workers``."""
  picks: dict[tuple[str, str], dict[str, float]] = {}
  for column, (link, _) in plan.classes.items():
    config = bench.config(CONFIG, overrides(plan, workers, link, "equal workers"))
    setting = f"lr grid, K={workers}, {column}"
    tuned = [m for m in plan.methods if m not in TUNED_AS]
    for family, grid in plan.grids.items():
      members = {
        m: (
          METHODS[m][0],
          {**METHODS[m][1], **({"outer_learning_rate": OUTER_DEFAULT} if local_updates(m) else {})},
        )
        for m in tuned
        if METHODS[m][2] == family
      }
      if not members:
        continue
      rates, text = bench.tune(
        config, members, grid, objective="time", extend=plan.extend, evaluations=EVALUATIONS, setting=setting
      )
      bench.section(f"Learning rates, K = {workers}, {column} ({family})", text)
      for m, r in rates.items():
        picks[(m, column)] = {"learning_rate": r}
    outer = {
      m: (METHODS[m][0], {**METHODS[m][1], "learning_rate": picks[(m, column)]["learning_rate"]})
      for m in tuned
      if local_updates(m)
    }
    if outer and len(plan.outer_grid) > 1:
      rates, text = bench.tune(
        config, outer, plan.outer_grid, objective="time", extend=plan.extend, evaluations=EVALUATIONS,
        setting=f"outer lr grid, K={workers}, {column}", option="outer_learning_rate",
      )  # fmt: skip
      bench.section(f"Outer learning rates, K = {workers}, {column} (at each method's inner pick)", text)
    else:
      rates = {m: OUTER_DEFAULT for m in outer}
    for m, r in rates.items():
      picks[(m, column)]["outer_learning_rate"] = r
    for twin, source in TUNED_AS.items():
      if twin in plan.methods and source in tuned:
        picks[(twin, column)] = picks[(source, column)]
  return picks


def run_cells(bench, plan: Plan, picks: dict, seeds=None, only=None) -> dict[tuple, harness.Cell]:
  """``{(workers, link, slow, method): Cell}`` at the picks; ``seeds``: per cell (or one count)."""
  cells = {}
  for workers in plan.workers:
    for slow in plan.slow:
      for link in plan.links:
        config = bench.config(CONFIG, overrides(plan, workers, link, slow))
        for method in plan.methods:
          key = (workers, link, slow, method)
          if only is not None and key not in only:
            continue
          strategy, options, _, _ = METHODS[method]
          cells[key] = bench.run(
            config,
            strategy,
            setting=f"K={workers}, {link}, {slow}",
            label=method,
            options={**options, **picks[workers][(method, link_class(plan, link))]},
            config_name=CONFIG,
            overrides=overrides(plan, workers, link, slow),
            seeds=harness.seeds_for(seeds, key),
            evaluations=EVALUATIONS,
          )
  return cells


def at_half(cells: dict[tuple, harness.Cell], target: float = TARGET) -> dict[tuple, harness.Cell]:
  """The cells read at their half-way evaluation: final accuracy and simulated time there, the crossing that
  holds up to it, half the bytes (a constant rate: the first half of a run is the run of half the budget),
  and the evaluations up to it (a reading at a time, as the language model's, must not see beyond)."""
  out = {}
  for key, cell in cells.items():
    runs = []
    for result in cell.results:
      h, s = result.history, result.summary
      half = int(s["events"]) // 2
      keep = np.asarray(h.eval_event) <= half
      times, accuracy = np.asarray(h.eval_time)[keep], np.asarray(h.eval_metrics["accuracy"])[keep]
      i = crossing(accuracy, target, holds=True)
      summary = {
        "final_accuracy": float(accuracy[-1]),
        "time_to_target_held": None if i is None else float(times[i]),
        "time_to_target_held_after": None if i is None else float(times[i - 1]) if i > 0 else 0.0,
        "bytes_moved": s.get("bytes_moved", 0.0) / 2,
        "gradients": s.get("gradients", 0) // 2,
        "simulated_time": float(times[-1]),
      }
      evaluations = {
        "eval_time": times,
        "eval_version": np.asarray(h.eval_version)[keep],
        "eval_event": np.asarray(h.eval_event)[keep],
        "eval_metrics": {name: np.asarray(v)[keep] for name, v in h.eval_metrics.items()},
      }
      runs.append(dataclasses.replace(result, summary=summary, history=dataclasses.replace(h, **evaluations)))
    out[key] = harness.Cell(cell.label, runs, cell.command)
  return out


def _close(cells, pairs, key) -> set:
  return {
    k
    for a, b in pairs
    if a in cells and b in cells and harness.too_close(cells[a], cells[b], key)
    for k in (a, b)
  }


def comparison_pairs(plan: Plan) -> dict[str, list[tuple[tuple, tuple]]]:
  """Each claim's pairs of cells ``(ours, theirs)``."""
  on = set(plan.methods)
  pairs: dict[str, list] = {"diloco": [], "dylu": [], "async": [], "streaming": [], "dc_asgd": []}
  sync_link = plan.links[len(plan.links) // 2]  # final accuracy does not depend on the link for these
  for k in plan.workers:
    for h in (10, 50, 200):
      if {f"DiLoCo H={h}", "all-reduce Adam"} <= on and "equal workers" in plan.slow:
        pairs["diloco"].append(
          (
            (k, sync_link, "equal workers", f"DiLoCo H={h}"),
            (k, sync_link, "equal workers", "all-reduce Adam"),
          )
        )
    if {"Streaming DiLoCo H=50", "DiLoCo H=50"} <= on and "equal workers" in plan.slow:
      pairs["streaming"].append(
        (
          (k, sync_link, "equal workers", "Streaming DiLoCo H=50"),
          (k, sync_link, "equal workers", "DiLoCo H=50"),
        )
      )
    for link in plan.links:
      slow = "a quarter 4x slower"
      if slow in plan.slow and {"async local SGD H=50 DyLU", "async local SGD H=50"} <= on:
        pairs["dylu"].append(
          ((k, link, slow, "async local SGD H=50 DyLU"), (k, link, slow, "async local SGD H=50"))
        )
      if slow in plan.slow and {"async local SGD H=50 DyLU", "DiLoCo H=50"} <= on:
        pairs["async"].append(((k, link, slow, "async local SGD H=50 DyLU"), (k, link, slow, "DiLoCo H=50")))
      for s in plan.slow:
        if {"DC-ASGD-a", "ASP"} <= on:
          pairs["dc_asgd"].append(((k, link, s, "DC-ASGD-a"), (k, link, s, "ASP")))
  return pairs  # fmt: skip


def _where(key: tuple) -> str:
  k, link, slow, _ = key
  return f"K={k}, {link}, {slow}"


def _speed(cells, pairs) -> tuple[dict, list[float]]:
  """Per pair: the speed-up of ours over theirs (None unless both reached the target on every seed) and the
  time test; the family's p after Holm."""
  tests = {}
  for a, b in pairs:
    ta, tb = cells[a].mean("time_to_target_held"), cells[b].mean("time_to_target_held")
    test = harness.time_test(
      cells[a].values("time_to_target_held"),
      cells[b].values("time_to_target_held"),
      within=harness.crossing_width(cells[a], cells[b]),
    )
    se = harness.log_ratio_se(cells[a].values("time_to_target_held"), cells[b].values("time_to_target_held"))
    tests[(a, b)] = (tb / ta if ta and tb else None, test["p"], se)
  return tests, harness.holm([p for _, p, _ in tests.values()])


def _speed_claim(cells, pairs, what: str):
  """A claim that ours reaches the target sooner: holds where every pair is significantly faster, partly
  where some are."""
  tests, adjusted = _speed(cells, pairs)
  faster = []
  comparisons = []
  for ((a, _theirs), (ratio, _, se)), p in zip(tests.items(), adjusted):
    # Sooner: a speed-up above 1, or ours reached the target on every seed where theirs did not (the rank
    # test's p), significantly.
    reached_only = ratio is None and cells[a].mean("time_to_target_held") is not None
    sooner = (reached_only or (ratio is not None and ratio > 1)) and p < 0.05
    faster.append(sooner)
    comparisons.append(
      harness.Comparison(f"{_where(a)}: {what} (log)", None if ratio is None else float(np.log(ratio)), p, se)
    )
  n, yes = len(faster), sum(faster)
  word = "**holds**" if n and yes == n else "**partly**" if yes else "**does not hold**"
  evidence = "; ".join(
    f"{_where(a)} {'-' if r is None else f'{r:.2f}x'} (p = {p:.3f} after Holm)"
    for ((a, _), (r, _, _)), p in zip(tests.items(), adjusted)
  )
  measured = [(r, (a, b), p) for ((a, b), (r, _, _)), p in zip(tests.items(), adjusted) if r is not None]
  best = max(measured, default=None, key=lambda x: x[0])
  number = harness.Deciding(
    f"significantly faster at {yes} of {n}"
    + (f"; at best {best[0]:.2f}x ({_where(best[1][0])}, p = {best[2]:.3f})" if best else "")
  )
  return (f"{word} ({yes} of {n} settings significantly faster)", evidence, harness.Comparisons(comparisons), number)  # fmt: skip


def _accuracy_claim(cells, pairs):
  """A claim that ours matches theirs within a point: holds where ours is significantly less than a point
  behind everywhere (a non-inferiority test: Welch, one-sided, against ours a point or more behind, after Holm;
  ahead counts), does not where every mean is more than a point behind, partly otherwise. Its number: the gap
  that keeps it from holding (the least sure of those not shown), else the worst gap."""
  gaps, comparisons, below, within = {}, [], [], []
  values = {(a, b): (cells[a].values("final_accuracy"), cells[b].values("final_accuracy")) for a, b in pairs}
  tests = {pair: harness.welch(x, y, margin=NEAR_POINTS / 100) for pair, (x, y) in values.items()}
  adjusted = harness.holm([t["p"] for t in tests.values()])
  for ((a, b), t), p in zip(tests.items(), adjusted):
    gap = 100 * t["diff"]
    gaps[(a, b)] = gap
    # Positive: within the point the claim allows; p: how sure (the non-inferiority test, after Holm).
    comparisons.append(
      harness.Comparison(
        f"{_where(a)}: {a[3]} - {b[3]} + {NEAR_POINTS:g} (points)", gap + NEAR_POINTS, p, 100 * t["se"]
      )
    )
    if not gap >= -NEAR_POINTS:  # a NaN gap (a side without a finite accuracy) is not within a point
      below.append(a)
    if p < 0.05:
      within.append(a)
  word = harness.match_word(len(within), len(below), len(pairs))
  evidence = "; ".join(
    f"{_where(a)} {a[3]} {gaps[(a, b)]:+.2f} points (less than {NEAR_POINTS:g} behind: p = {p:.3f} after Holm)"
    for (a, b), p in zip(tests, adjusted)
  )
  ps = dict(zip(tests, adjusted))
  unshown = [pair for pair in gaps if not ps[pair] < 0.05]
  # What keeps it from holding: the least sure gap not shown (a NaN p, untested, the least sure), then the worst.
  if unshown:
    pair = max(unshown, key=lambda q: (np.nan_to_num(ps[q], nan=2.0), -gaps[q]))
    lead = f"not shown: {gaps[pair]:+.2f} points"
  else:
    pair = min(gaps, key=gaps.get, default=None)
    lead = f"at worst {gaps[pair]:+.2f} points" if pair else ""
  number = harness.Deciding(
    f"{lead} ({pair[0][3]}, {_where(pair[0])}; less than {NEAR_POINTS:g} behind: p = {ps[pair]:.3f})"
    if pair
    else "not measured"
  )
  counts = (
    f"{len(within)} of {len(pairs)} significantly less than {NEAR_POINTS:g} point behind,"
    f" {len(below)} more than {NEAR_POINTS:g} behind in the mean"
  )
  return (f"{word} ({counts})", evidence, harness.Comparisons(comparisons), number)


def decide(cells, plan: Plan) -> dict[str, dict[str, tuple]]:
  """``{paper: {claim: (verdict, evidence, Comparisons, Deciding)}}`` on the cells the store holds."""
  pairs = comparison_pairs(plan)
  present = lambda ps: [
    p for p in ps if p[0] in cells and p[1] in cells and cells[p[0]].results and cells[p[1]].results
  ]  # noqa: E731
  out: dict[str, dict[str, tuple]] = {}
  if present(pairs["diloco"]):
    out.setdefault(PAPERS["diloco"], {})[
      "matches synchronous training (all-reduce Adam) within a point, H = 10, 50, 200"
    ] = _accuracy_claim(cells, present(pairs["diloco"]))
  if present(pairs["streaming"]):
    out.setdefault(PAPERS["streaming"], {})["as accurate as DiLoCo with a fragment of its exchange"] = (
      _accuracy_claim(cells, present(pairs["streaming"]))
    )
  if present(pairs["dylu"]):
    out.setdefault(PAPERS["async"], {})["Dynamic Local Updates speed it up against stragglers"] = (
      _speed_claim(cells, present(pairs["dylu"]), "DyLU's speed-up")
    )
  if present(pairs["async"]):
    out.setdefault(PAPERS["async"], {})["it beats synchronous DiLoCo (H = 50) with stragglers"] = (
      _speed_claim(cells, present(pairs["async"]), "speed-up over DiLoCo")
    )
  if present(pairs["dc_asgd"]):
    out.setdefault(PAPERS["dc_asgd"], {})["delay compensation reaches the target sooner than ASP"] = (
      _speed_claim(cells, present(pairs["dc_asgd"]), "speed-up over ASP")
    )
  return out  # fmt: skip


def regime_table(cells, plan: Plan) -> str:
  """The fastest method to the target per worker count, stragglers and link (mean over seeds that all reached it)."""
  rows = []
  for k in plan.workers:
    for slow in plan.slow:
      row = [f"{k}, {slow}"]
      for link in plan.links:
        timed = [
          (c.mean("time_to_target_held"), m)
          for (kk, ll, ss, m), c in cells.items()
          if (kk, ll, ss) == (k, link, slow)
        ]
        timed = [(t, m) for t, m in timed if t is not None]
        row.append(f"{min(timed)[1]} ({min(timed)[0]:.3g} s)" if timed else "-")
      rows.append(row)
  return harness.table(["workers, stragglers", *plan.links], rows)  # fmt: skip


def cells_table(cells, plan: Plan, k: int, slow: str) -> str:
  """Time to the target and final accuracy per method and link."""
  rows = []
  for method in plan.methods:
    row = [method]
    for link in plan.links:
      c = cells.get((k, link, slow, method))
      row.append(
        "missing"
        if c is None or not c.results
        else f"{c.text('time_to_target_held', 3)} s / {c.text('final_accuracy', 1, 100)}%"
      )
    rows.append(row)
  return harness.table(["method", *plan.links], rows)  # fmt: skip


def main(argv: list[str]) -> int:
  p = harness.parser(__doc__)
  p.add_argument("--workers", default=None, help="worker counts, comma-separated (default 8,32)")
  args = p.parse_args(argv)
  plan = TINY if args.size == "tiny" else Plan()
  if args.workers:
    workers = tuple(int(w) for w in args.workers.split(",") if w.strip())
    if not workers or any(w not in (8, 32) for w in workers):
      raise SystemExit(f"{NAME}: --workers={args.workers!r}; expected 8 and/or 32")
    plan = dataclasses.replace(plan, workers=workers)
  bench = harness.Benchmark(
    NAME,
    "Low-communication training against the parameter-server family: an MLP (128 hidden units) on Fashion-MNIST",
    args,
    argv,
    seeds=3,
  )
  picks = {k: tune(bench, plan, k) for k in plan.workers}
  cells = run_cells(bench, plan, picks)
  if args.size != "tiny" and args.seeds is None:  # 5 seeds where a claim's two sides are within two std
    pairs = comparison_pairs(plan)
    close = _close(cells, pairs["diloco"] + pairs["streaming"], "final_accuracy")
    close |= _close(cells, pairs["dylu"] + pairs["async"] + pairs["dc_asgd"], "time_to_target_held")
    if close:
      cells.update(run_cells(bench, plan, picks, seeds=5, only=close))
  full, half = decide(cells, plan), decide(at_half(cells), plan)
  seeds = harness.seed_range(list(cells.values()))
  picked = "; ".join(
    f"K={k} {column} {m} {r['learning_rate']:g}" + (f" (outer {r['outer_learning_rate']:g})" if "outer_learning_rate" in r else "")
    for k, by in picks.items() for (m, column), r in by.items()
  )  # fmt: skip
  for paper, claims in full.items():
    bench.decided(
      paper, claims, half.get(paper, {}), budget=f"{plan.per_worker} gradients per worker", seeds=seeds,
      picks=f"tuned on the time to the target on a validation split, per worker count and link class: {picked}",
    )  # fmt: skip
  bench.section("The regime map: the fastest to the target", regime_table(cells, plan))
  for k in plan.workers:
    for slow in plan.slow:
      bench.section(
        f"K = {k}, {slow}: time to {TARGET:.0%} (simulated s) / final accuracy",
        cells_table(cells, plan, k, slow),
      )
  bench.write()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
