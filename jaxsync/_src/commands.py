"""What each ``jaxsync`` command does (the parsing lives in ``jaxsync/cli.py``).

``train`` and ``resume`` run one config into a run directory; ``compare`` runs
several strategies and seeds of one config, each into a run directory of its
own, and writes one table and one set of plots; ``strategies`` lists the
registry. A compare directory is resumed the same way as a run directory.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from typing import Any

import numpy as np
import yaml

from jaxsync._src import config as config_lib
from jaxsync._src import experiment, plots, run_directory, strategies, training
from jaxsync._src.progress import Reporter

_COMPARE_MARKER = "compare.json"


def default_out(name: str, root: str | pathlib.Path = "runs") -> pathlib.Path:
  """``runs/NAME``, or ``runs/NAME-1``, ``-2``, ... if taken: a default never overwrites anything."""
  root = pathlib.Path(root)
  candidate, i = root / name, 0
  while candidate.exists():
    i += 1
    candidate = root / f"{name}-{i}"
  return candidate


def write_config(run_dir: pathlib.Path, config: config_lib.Config) -> None:
  """Writes ``run_dir/config.yaml``: the whole config, every default spelled out."""
  (run_dir / "config.yaml").write_text(yaml.safe_dump(config_lib.to_dict(config), sort_keys=False))


def _read_config(run_dir: pathlib.Path) -> config_lib.Config:
  path = run_dir / "config.yaml"
  if not path.is_file():
    raise run_directory.RunDirectoryError(
      f"{str(run_dir)!r} is not a jaxsync run directory: {str(path)!r} is missing."
    )
  return config_lib.load(path)


def _run_one(config: config_lib.Config, run_dir: pathlib.Path, reporter: Reporter) -> training.RunResult:
  exp = experiment.build(config)
  return training.train(exp.simulator, exp.model.params, run_dir, reporter=reporter, **exp.train_kwargs())


def train(
  config: config_lib.Config, out: pathlib.Path, *, overwrite: bool, reporter: Reporter
) -> training.RunResult:
  """Validates and builds everything, creates ``out``, writes ``config.yaml`` and trains."""
  exp = experiment.build(config)  # every config error surfaces before anything is written
  run_dir = run_directory.create(out, overwrite=overwrite)
  write_config(run_dir, config)
  return training.train(exp.simulator, exp.model.params, run_dir, reporter=reporter, **exp.train_kwargs())


def resume(run_dir: pathlib.Path, *, reporter: Reporter) -> training.RunResult | dict[str, Any]:
  """Continues a run (or every run of a compare directory) from its latest checkpoint."""
  run_dir = pathlib.Path(run_dir)
  if (run_dir / _COMPARE_MARKER).is_file():
    return _compare_runs(run_dir, reporter)
  return _run_one(_read_config(run_dir), run_dir, reporter)


# ---------------------------------------------------------------------------
# compare: strategies x seeds, one table, one set of plots.
# ---------------------------------------------------------------------------


def compare(
  config: config_lib.Config,
  out: pathlib.Path,
  *,
  strategy_names: list[str] | None,
  seeds: int | None,
  overwrite: bool,
  reporter: Reporter,
) -> dict[str, Any]:
  """Runs every strategy of ``strategy_names`` (default ``compare.strategies``) with ``seeds`` seeds."""
  names = strategy_names or config.compare.strategies or [config.strategy.name]
  compare_cfg = dataclasses.replace(
    config.compare, strategies=list(names), seeds=seeds or config.compare.seeds
  )
  config = dataclasses.replace(config, compare=compare_cfg)
  plan = _plan(config)
  # Every strategy's config errors surface before anything is written; its seeds differ only in the
  # seed, so one build per strategy checks them all (each run builds its own when it starts).
  for name in names:
    experiment.build(experiment.for_strategy(config, name, config.seed))
  for name in names:
    dropped = experiment.dropped_options(config, name)
    if dropped:
      print(
        f"jaxsync: note: {name} does not take strategy.options {', '.join(dropped)}; left out.",
        file=sys.stderr,
      )
  run_dir = run_directory.create(out, overwrite=overwrite)
  write_config(run_dir, config)
  for sub, run_config in plan.items():
    (run_dir / sub).mkdir(parents=True)
    write_config(run_dir / sub, run_config)
  run_directory.write_json(run_dir / _COMPARE_MARKER, {"runs": list(plan)})
  return _compare_runs(run_dir, reporter)


def _plan(config: config_lib.Config) -> dict[str, config_lib.Config]:
  """``{"strategy/seedN": config}`` for every strategy and seed of ``config.compare``."""
  plan = {}
  for name in config.compare.strategies:
    for i in range(config.compare.seeds):
      plan[f"{name}/seed{config.seed + i}"] = experiment.for_strategy(config, name, config.seed + i)
  return plan


def _compare_runs(run_dir: pathlib.Path, reporter: Reporter) -> dict[str, Any]:
  runs = json.loads((run_dir / _COMPARE_MARKER).read_text())["runs"]
  results: dict[str, list[training.RunResult]] = {}
  for sub in runs:
    result = _run_one(_read_config(run_dir / sub), run_dir / sub, reporter)
    results.setdefault(sub.split("/")[0], []).append(result)
  table = results_table(results)
  (run_dir / "results.md").write_text(table)
  run_directory.write_json(
    run_dir / "results.json", {name: [r.summary for r in rs] for name, rs in results.items()}
  )
  plots.plot_compare({name: [r.history for r in rs] for name, rs in results.items()}, run_dir / "plots")
  return {"table": table, "results": results}


def mean_std(values: list[float | None], digits: int) -> str:
  """``mean ± sample std`` of the finite values; ``(n/m)`` when only n of m are finite; ``-`` if none."""
  finite = [v for v in values if v is not None and np.isfinite(v)]
  if not finite:
    return "-"
  std = np.std(finite, ddof=1) if len(finite) > 1 else 0.0  # the sample std: few seeds
  text = f"{np.mean(finite):.{digits}f} ± {std:.{digits}f}"
  return text if len(finite) == len(values) else f"{text} ({len(finite)}/{len(values)})"


def results_table(results: dict[str, list[training.RunResult]]) -> str:
  """A markdown table, one row per strategy: mean ± sample standard deviation over its seeds.

  A cell whose value some seeds lack (a target not reached, a diverged run)
  says how many seeds it averages, e.g. ``12.1 ± 0.3 (2/3)``.
  """
  first = next(iter(results.values()))[0].summary
  target = first.get("target")
  target_text = f"{target['metric']} {target['value']}" if target else "target"
  header = (
    f"| strategy | seeds | final accuracy | final loss | best accuracy | simulated s to {target_text} | "
    f"updates to {target_text} | simulated s | updates | mean staleness | GB moved |"
  )
  lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for name, runs in results.items():
    s = [r.summary for r in runs]

    def col(key, digits, scale=1.0, s=s):
      return mean_std([None if x.get(key) is None else x[key] * scale for x in s], digits)

    lines.append(
      f"| {name} | {len(s)} | {col('final_accuracy', 3)} | {col('final_loss', 3)} | {col('best_accuracy', 3)} | "
      f"{col('time_to_target', 1)} | {col('updates_to_target', 0)} | {col('simulated_time', 1)} | "
      f"{col('updates', 0)} | {col('mean_staleness', 2)} | {col('bytes_moved', 3, 1e-9)} |"
    )
  return "\n".join(lines) + "\n"


def strategies_table() -> str:
  """The registry: each strategy's summary line and its options with defaults."""
  lines = []
  for name in strategies.names():
    info = strategies.describe(name)
    lines.append(f"{name}: {info.summary}")
    options = ", ".join(f"{k}={v!r}" for k, v in info.options.items())
    lines.append(f"    options: {options or '(none)'}")
  return "\n".join(lines)
