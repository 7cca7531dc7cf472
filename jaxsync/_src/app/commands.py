"""What each ``jaxsync`` command does (the parsing lives in ``jaxsync/cli.py``).

``train`` and ``resume`` run one config into a run directory; ``compare`` runs
several strategies and seeds of one config, each into a run directory of its
own, and writes one table and one set of plots; ``advise`` runs the
beginning of each candidate's run and recommends one; ``strategies`` lists the
registry. A compare directory is resumed the same way as a run directory.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import yaml

from jaxsync._src.advisor import advisor
from jaxsync._src.app import config as config_lib
from jaxsync._src.app import experiment
from jaxsync._src.distributed.cluster import ProcessGroup
from jaxsync._src.strategies import registry as strategies
from jaxsync._src.strategies.strategy import Strategy
from jaxsync._src.train import plots, run_directory, training
from jaxsync._src.train.progress import Reporter

_COMPARE_MARKER = "compare.json"
_LAUNCH_RECORD = "launch.json"


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


def read_config(run_dir: pathlib.Path) -> config_lib.Config:
  path = run_dir / "config.yaml"
  if not path.is_file():
    raise run_directory.RunDirectoryError(
      f"{str(run_dir)!r} is not a jaxsync run directory: {str(path)!r} is missing."
    )
  return config_lib.load(path)


def _build(config: config_lib.Config, reporter: Reporter) -> experiment.Experiment:
  reporter.phase(f"{config.name}: loading data, building the model and strategy")
  try:
    return experiment.build(config)
  except BaseException:
    reporter.close()
    raise


def _simulate(exp: experiment.Experiment, run_dir: pathlib.Path, reporter: Reporter, stop_requested):
  return training.train(
    exp.simulator(), exp.model.params, run_dir, reporter=reporter, stop_requested=stop_requested,
    **exp.train_kwargs(),
  )  # fmt: skip


def _run_one(
  config: config_lib.Config,
  run_dir: pathlib.Path,
  reporter: Reporter,
  group: ProcessGroup | None = None,
  stop_requested: Callable[[], bool] | None = None,
  earlier: tuple = (),
) -> training.RunResult | None:
  exp = _build(config, reporter)
  if group is not None:
    return _run_distributed(exp, run_dir, group, reporter, stop_requested, earlier=earlier)
  return _simulate(exp, run_dir, reporter, stop_requested)


def train(
  config: config_lib.Config,
  out: pathlib.Path,
  *,
  overwrite: bool,
  reporter: Reporter,
  group: ProcessGroup | None = None,
  stop_requested: Callable[[], bool] | None = None,
) -> training.RunResult | None:
  """Validates and builds everything, creates ``out``, writes ``config.yaml`` and trains.

  With a process ``group`` every process of a multi-process run calls this;
  process 0 creates ``out`` and returns the result, a worker returns None.
  ``stop_requested``: asked between chunks (in a multi-process run, by every
  process: a synchronous run stops when any asks, a parameter server when
  process 0 does); True saves a checkpoint there and raises
  ``training.PreemptedError``.
  """
  exp = _build(config, reporter)  # every config error surfaces before anything is written
  if group is None:
    run_dir = run_directory.create(out, overwrite=overwrite)
    write_config(run_dir, config)
    return _simulate(exp, run_dir, reporter, stop_requested)
  check_processes(exp.strategy, group.count, config.cluster.servers)
  if group.is_primary:
    run_dir = run_directory.create(out, overwrite=overwrite)
    write_config(run_dir, config)
    run_directory.write_json(run_dir / _LAUNCH_RECORD, {"num_processes": group.count, "how": group.how})
  return _run_distributed(exp, pathlib.Path(out), group, reporter, stop_requested)


def train_config(
  config: str | pathlib.Path | dict[str, Any],
  overrides: list[str] | tuple[str, ...] = (),
  *,
  out: str | pathlib.Path | None = None,
  overwrite: bool = False,
  progress: str = "quiet",
) -> training.RunResult:
  """Trains a config from Python (a notebook, a script), as ``jaxsync train`` does; returns the result.

  Args:
    config: a YAML config's path, or the same content as a mapping
      (``{"strategy": {"name": "asp"}, ...}``; missing keys take their defaults,
      see ``jaxsync config``).
    overrides: ``"key.path=value"`` strings, as ``--set`` takes them.
    out: the run directory (default ``runs/NAME``, or ``runs/NAME-1``... if taken).
    overwrite: replace ``out`` if it is an existing run directory.
    progress: ``"bar"``, ``"jsonl"`` or ``"quiet"`` (the default: nothing printed).

  Returns:
    A ``RunResult``: ``params`` (the final model), ``history`` (every
    evaluation, over simulated time), ``summary`` (what ``summary.json`` holds)
    and ``run_dir``.

  Raises:
    ConfigError: an invalid config, key or value (the message names it).

  Example:
    >>> import jaxsync
    >>> result = jaxsync.train_config("configs/quickstart.yaml", ["run.gradients=800"])  # doctest: +SKIP
    >>> result.summary["final_accuracy"], result.run_dir  # doctest: +SKIP
  """
  from jaxsync._src.train import progress as progress_lib

  if isinstance(config, dict):
    cfg = config_lib.from_dict(config_lib.apply_overrides(config, list(overrides)))
  else:
    cfg = config_lib.load(config, list(overrides))
  out = pathlib.Path(out) if out is not None else default_out(cfg.name)
  run_directory.check_available(out, overwrite=overwrite)
  return train(cfg, out, overwrite=overwrite, reporter=progress_lib.make(progress))


def resume(
  run_dir: pathlib.Path,
  *,
  reporter: Reporter,
  group: ProcessGroup | None = None,
  stop_requested: Callable[[], bool] | None = None,
) -> training.RunResult | dict[str, Any] | None:
  """Continues a run (or every run of a compare directory) from its latest checkpoint.

  A synchronous multi-process run that ``jaxsync launch --min-workers`` shrank
  or grew goes on at its recorded size (:mod:`resize`), and says so in one line.
  """
  run_dir = pathlib.Path(run_dir)
  if (run_dir / _COMPARE_MARKER).is_file():
    return _compare_runs(run_dir, reporter, stop_requested)
  config, earlier = read_config(run_dir), ()
  if group is not None:
    from jaxsync._src.app import resize

    config, earlier, line = resize.for_run_directory(config, run_dir)
    if line and group.is_primary:
      print(f"jaxsync: {line}", file=sys.stderr, flush=True)
  return _run_one(config, run_dir, reporter, group, stop_requested, earlier=earlier)


def launched_processes(run_dir: pathlib.Path) -> int | None:
  """The process count of a run directory ``jaxsync launch`` made (None otherwise: simulated, or a cluster's)."""
  path = pathlib.Path(run_dir) / _LAUNCH_RECORD
  if not path.is_file():
    return None
  record = json.loads(path.read_text())
  return int(record["num_processes"]) if record.get("how") == "launch" else None


def check_processes(
  strategy: Strategy, num_processes: int, servers: int = 1, *, num_devices: int | None = None
) -> None:
  """Raises ConfigError unless ``num_processes`` fits the strategy's worker count (and ``servers`` shards).

  ``num_devices``: the run's devices across its processes, for a synchronous
  strategy (one worker per device); default ``jax.device_count()``, the
  running group's. The launcher passes its own count before any process starts.
  """
  from jaxsync._src.distributed import node_aggregator
  from jaxsync._src.distributed.server import param_server

  k = strategy.num_workers
  if param_server.serves(strategy):
    units, g = strategy.num_units, strategy.workers_per_unit
    if num_processes != units + servers:
      server = (
        "a parameter server (process 0)"
        if servers == 1
        else f"{servers} server shards (processes 0-{servers - 1})"
      )
      per = "one worker" if g == 1 else f"one group of {g} workers (group_size={g})"
      instead = f"launch {units + servers} processes"
      if num_processes > servers:  # else no worker count fits: every process would be a server
        instead += f", or set cluster.num_workers={(num_processes - servers) * g}"
      raise config_lib.ConfigError(
        f"cluster.num_workers={k} is invalid for {num_processes} processes: the {strategy.engine} strategy "
        f"{strategy.name!r} runs {server} and {per} per other process; {instead}."
      )
    if servers > 1 and node_aggregator.aggregates(strategy):
      raise config_lib.ConfigError(
        f"cluster.servers={servers} is invalid for {strategy.name!r}: its node aggregators pull from one "
        "server process; expected 1."
      )
  elif servers != 1:
    raise config_lib.ConfigError(
      f"cluster.servers={servers} is invalid for the {strategy.engine} strategy {strategy.name!r}: it has no "
      "parameter server (its workers all-reduce); expected 1."
    )
  else:
    if num_devices is None:
      import jax

      num_devices = jax.device_count()
    if num_devices != k:
      raise config_lib.ConfigError(
        f"cluster.num_workers={k} is invalid for {num_devices} devices: the synchronous strategy "
        f"{strategy.name!r} runs one worker per device across the processes; set "
        f"cluster.num_workers={num_devices}."
      )


def check_restarts(max_restarts: int, rejoin_delay: float) -> None:
  """The supervisor's options (``--max-restarts``, ``--rejoin-delay``), checked before anything is built."""
  if max_restarts < 0:
    raise config_lib.ConfigError(f"--max-restarts={max_restarts} is invalid; expected an integer >= 0.")
  if not 0 <= rejoin_delay < float("inf"):
    raise config_lib.ConfigError(f"--rejoin-delay={rejoin_delay} is invalid; expected seconds >= 0.")
  if rejoin_delay and not max_restarts:
    raise config_lib.ConfigError(
      f"--rejoin-delay={rejoin_delay:g} is invalid without --max-restarts: it delays a restart, and none is"
      " allowed; expected --max-restarts N as well."
    )


def check_launch(
  config: config_lib.Config,
  num_processes: int,
  *,
  min_workers: int | None = None,
  max_restarts: int = 0,
  rejoin_delay: float = 0.0,
):
  """Checks a ``jaxsync launch -n N`` of ``config`` before any process starts; raises ConfigError.

  The whole config is built (data, model, strategy), so what every process
  would find wrong is said once, here, in a second or two: not N times after
  the processes have joined, followed by the coordination service's abort.
  ``min_workers`` (``--min-workers``) is checked against the run, with the
  supervisor's ``max_restarts`` and ``rejoin_delay`` it needs.

  Returns:
    What a supervisor restarts when a process fails (``roles.RestartRoles``).
  """
  if not isinstance(num_processes, int) or num_processes < 1:
    raise config_lib.ConfigError(
      f"-n/--num-processes={num_processes!r} is invalid; expected the number of processes to start, >= 1."
    )
  import jax

  exp = _build(config, Reporter())
  # Every launched process has the devices this one has (same machine, same environment).
  check_processes(
    exp.strategy, num_processes, config.cluster.servers, num_devices=num_processes * jax.local_device_count()
  )
  from jaxsync._src.distributed import roles

  if min_workers is not None:
    from jaxsync._src.app import resize

    resize.check_min_workers(exp.strategy, min_workers, num_processes, max_restarts, rejoin_delay)
  return roles.restart_roles(exp.strategy, num_processes, config.cluster.servers)


def _run_distributed(
  exp: experiment.Experiment,
  run_dir: pathlib.Path,
  group: ProcessGroup,
  reporter: Reporter,
  stop_requested: Callable[[], bool] | None = None,
  *,
  earlier: tuple = (),
) -> training.RunResult | None:
  """One process's part of a multi-process run: its role (server, shard, worker) from ``roles``.

  ``earlier``: a resized synchronous run's earlier shapes (``resize.earlier_shapes``).
  """
  from jaxsync._src.distributed import roles

  kwargs = exp.train_kwargs()
  if not roles.serves(exp.strategy) and kwargs.pop("max_time") is not None:
    raise config_lib.ConfigError(
      f"run.max_time={exp.config.run.max_time!r} is invalid for a synchronous multi-process run; expected "
      "null (its processes stop together, after run.gradients)."
    )

  def drive(runtime, primary: bool) -> training.RunResult:
    return training.train(
      runtime,
      exp.model.params,
      run_dir,
      reporter=reporter if primary else Reporter(),
      primary=primary,
      stop_requested=stop_requested,
      **kwargs,
    )

  result = roles.run_process(
    exp.strategy, exp.loss_fn, exp.data, exp.model.params, group=group, servers=exp.config.cluster.servers,
    evaluation=exp.evaluation(), drive=drive, stop_requested=stop_requested, slowdowns=exp.slowdowns(),
    earlier=earlier,
  )  # fmt: skip
  if result is not None and roles.serves(exp.strategy):
    run_directory.write_json(run_dir / "summary.json", result.summary)  # with the server's fault counts
  return result


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
  stop_requested: Callable[[], bool] | None = None,
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
  return _compare_runs(run_dir, reporter, stop_requested)


def _plan(config: config_lib.Config) -> dict[str, config_lib.Config]:
  """``{"strategy/seedN": config}`` for every strategy and seed of ``config.compare``."""
  plan = {}
  for name in config.compare.strategies:
    for i in range(config.compare.seeds):
      plan[f"{name}/seed{config.seed + i}"] = experiment.for_strategy(config, name, config.seed + i)
  return plan


def _compare_runs(
  run_dir: pathlib.Path, reporter: Reporter, stop_requested: Callable[[], bool] | None = None
) -> dict[str, Any]:
  runs = json.loads((run_dir / _COMPARE_MARKER).read_text())["runs"]
  results: dict[str, list[training.RunResult]] = {}
  for sub in runs:
    result = _run_one(read_config(run_dir / sub), run_dir / sub, reporter, stop_requested=stop_requested)
    results.setdefault(sub.split("/")[0], []).append(result)
  table = results_table(results)
  (run_dir / "results.md").write_text(table)
  run_directory.write_json(
    run_dir / "results.json", {name: [r.summary for r in rs] for name, rs in results.items()}
  )
  targets = [r.summary["target"] for rs in results.values() for r in rs if r.summary.get("target")]
  target = (targets[0]["metric"], targets[0]["value"]) if targets else None  # one config: one target
  histories = {name: [r.history for r in rs] for name, rs in results.items()}
  plots.plot_compare(histories, run_dir / "plots", target=target)
  return {"table": table, "results": results, "run_dir": run_dir}


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
  says how many seeds it averages, e.g. ``12.1 ± 0.3 (2/3)``. A strategy with
  diverged seeds is marked ``(diverged: n/m)``, and the reasons follow the table.
  """
  first = next(iter(results.values()))[0].summary
  target = first.get("target")
  target_text = f"{target['metric']} {target['value']}" if target else "target"
  header = (
    f"| strategy | seeds | final accuracy | final loss | best accuracy | simulated s to {target_text} | "
    f"updates to {target_text} | simulated s | updates | mean staleness | GB moved |"
  )
  lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  notes = []
  for name, runs in results.items():
    s = [r.summary for r in runs]
    diverged = [r for r in runs if r.summary.get("diverged")]
    notes += [
      f"- {r.summary.get('label', name)} diverged: {r.summary['diverged_because']}." for r in diverged
    ]
    shown = f"{name} (diverged: {len(diverged)}/{len(runs)})" if diverged else name

    def col(key, digits, scale=1.0, s=s):
      return mean_std([None if x.get(key) is None else x[key] * scale for x in s], digits)

    lines.append(
      f"| {shown} | {len(s)} | {col('final_accuracy', 3)} | {col('final_loss', 3)} | {col('best_accuracy', 3)} | "
      f"{col('time_to_target', 1)} | {col('updates_to_target', 0)} | {col('simulated_time', 1)} | "
      f"{col('updates', 0)} | {col('mean_staleness', 2)} | {col('bytes_moved', 3, 1e-9)} |"
    )
  if notes:
    lines += ["", *notes]
  return "\n".join(lines) + "\n"


def strategies_table() -> str:
  """The registry for ``jaxsync strategies``: per strategy its kind, how it runs on real processes, its
  summary, and each option with its default and meaning; where the default learning rates come from."""
  from jaxsync._src.distributed.server import param_server

  lines = [
    "Synchronous strategies wait for every worker (or the k fastest) each round; asynchronous ones apply",
    "each worker's gradient (or model) as it arrives. On real processes (jaxsync launch) an asynchronous",
    "strategy runs a parameter server; a synchronous one all-reduces, except fastest-k (a server).",
    "",
  ]
  for name in strategies.names():
    info = strategies.describe(name)
    if info.alias_of:
      lines += [f"{name}: another name for {info.alias_of}.", ""]
      continue
    kind = "synchronous" if info.synchronous else "asynchronous"
    real = "parameter server" if param_server.serves(strategies.make(name, 4)) else "all-reduce"
    lines.append(f"{name} ({kind}; real processes: {real})")
    lines.append(f"  {info.summary.replace('``', '')}")
    width = max(len(f"{k}={v!r}") for k, v in info.options.items())
    for option, default in info.options.items():
      lines.append(f"    {f'{option}={default!r}':<{width}}  {info.meanings[option]}")
    lines.append("")
  lines.append(strategies.DEFAULT_RATES)
  return "\n".join(lines)


# ---------------------------------------------------------------------------
# advise: short runs of the candidates, ranked by their extrapolated time to the target.
# ---------------------------------------------------------------------------


def advise(
  config: config_lib.Config,
  out: pathlib.Path,
  *,
  strategy_names: list[str] | None,
  seeds: int,
  fraction: float,
  target: float | None,
  time_budget: float | None,
  overwrite: bool,
  progress: Any = None,
  plan: Any = None,
) -> advisor.Advice:
  """Runs the first ``fraction`` of ``config``'s run for each candidate and seed; ranks and recommends.

  Each seed is a whole setup (initialisation, data order and jitter), as in
  ``compare``. The short runs train without a validation slice of the
  training set (``data.validation``, else 10%) and are ranked on it: the
  test set is not read. Writes ``advice.md``, ``advice.json`` and the short runs'
  plots into ``out``.

  With ``plan`` (a ``jaxsync.planning.Plan`` of the same strategies at the
  scale you will run), the short runs say how many steps each candidate needs
  and the plan how long a step takes there: each run's clock is stretched by
  the planned step time over its simulated one (:func:`on_planned_clock`).
  """
  names = strategy_names or config.compare.strategies
  if not names:
    raise config_lib.ConfigError(
      "advise: no candidates; pass --strategies NAME,NAME or set compare.strategies in the config."
    )
  for name in names:
    if name not in strategies.names():
      raise config_lib.ConfigError(
        f"advise: strategy name={name!r} is unknown; expected one of: {', '.join(strategies.names())}."
      )
  if not 0.0 < fraction <= 1.0:
    raise config_lib.ConfigError(f"advise: --fraction={fraction} is invalid; expected a number in (0, 1].")
  if seeds < 1:
    raise config_lib.ConfigError(f"advise: --seeds={seeds} is invalid; expected a positive integer.")
  if time_budget is not None and not time_budget > 0:
    raise config_lib.ConfigError(f"advise: --time-budget={time_budget} is invalid; expected seconds > 0.")
  if time_budget is None:
    target = target if target is not None else config.run.target_accuracy
    if target is None:
      raise config_lib.ConfigError(
        "advise: no target; set run.target_accuracy, or pass --target ACCURACY or --time-budget SECONDS."
      )
    if not 0.0 < target < 1.0:
      raise config_lib.ConfigError(f"advise: target={target} is invalid; expected an accuracy in (0, 1).")
  else:
    target = None
  gradients = max(1, round(fraction * config.run.gradients))
  # The short runs choose among candidates: they hold out a validation slice of the training set and score
  # on it, never on the test set (experiment.for_tuning).
  tuning = experiment.for_tuning(config)
  built = {
    (name, i): experiment.build(experiment.for_strategy(tuning, name, config.seed + i))
    for name in names
    for i in range(seeds)
  }  # every candidate's config errors before any run
  metric = next(iter(built.values())).metric
  planned = planned_step_times(plan, names) if plan is not None else None
  run_directory.create(out, overwrite=overwrite)
  runs: dict[str, list] = {}
  for (name, _), exp in built.items():
    history = exp.short_run(gradients)
    runs.setdefault(name, []).append(history)
    if progress is not None:
      accuracy = history.eval_metrics[metric][-1]
      progress(
        f"{name} seed {exp.config.seed}: {gradients} gradients, {history.updates} updates, "
        f"{history.elapsed:.3g} simulated s, {metric.replace('_', ' ')} {accuracy:.3f}"
      )
  chance = 1.0 / next(iter(built.values())).dataset.num_classes
  if planned is not None:
    runs = {name: [on_planned_clock(h, planned[name]) for h in hs] for name, hs in runs.items()}
  advice = advisor.rank(runs, metric=metric, target=target, time_budget=time_budget, chance=chance)
  report = advice_report(advice, config, gradients, fraction, seeds)
  if planned is not None:
    report += "\n" + plan_note(plan)
  (out / "advice.md").write_text(report)
  run_directory.write_json(
    out / "advice.json",
    {
      "recommended": advice.recommended,
      "decisive": advice.decisive,
      "tied": list(advice.tied),
      "reason": advice.reason,
      "target": advice.target,
      "time_budget": advice.time_budget,
      "gradients_per_short_run": gradients,
      "seeds": seeds,
      "ranking": [dataclasses.asdict(e) for e in advice.ranking],
    },
  )
  plots.plot_compare(runs, out / "plots", target=None if advice.target is None else (metric, advice.target))
  return advice


def planned_step_times(plan: Any, names: list[str]) -> dict[str, float]:
  """Each candidate's planned seconds per worker step, from the plan's row that runs it."""
  times = {}
  for name in names:
    rows = [row for row in plan.strategies if row.strategy == name]
    if not rows:
      planned = sorted({row.strategy for row in plan.strategies})
      raise config_lib.ConfigError(
        f"advise: strategy name={name!r} is not in the plan; the plan's strategies: {', '.join(planned)}."
      )
    if len({row.step_time for row in rows}) > 1:
      labels = ", ".join(row.name for row in rows)
      raise config_lib.ConfigError(
        f"advise: strategy name={name!r} is in the plan {len(rows)} times with other options ({labels}); "
        "expected one row per candidate (the short runs use the config's options)."
      )
    times[name] = rows[0].step_time
  return times


def on_planned_clock(history: Any, step_time: float) -> Any:
  """``history`` with its seconds stretched to the planned cluster's: its steps at ``step_time`` each.

  A worker's simulated seconds per step in the short run are its elapsed
  seconds over its mean steps; every time of the history is multiplied by the
  planned step time over that, so the candidate keeps the steps it needed and
  takes the plan's time for each.
  """
  steps = float(np.mean(history.worker_steps))
  scale = step_time * steps / history.elapsed if steps > 0 and history.elapsed > 0 else 1.0
  return dataclasses.replace(
    history, time=history.time * scale, eval_time=history.eval_time * scale, clock="planned"
  )


def plan_note(plan: Any) -> str:
  """What comes from where when the advice runs on a plan's clock."""
  rows = "\n".join(
    f"- {row.name}: {row.step_time:.4g} s per step, {row.compute_utilization:.1%} compute"
    for row in plan.strategies
  )
  return (
    "**Two sources.** The steps (and updates) each candidate needs come from the trained short runs above, on "
    "this config's model and data; the seconds per step come from the planner alone (`jaxsync plan`), on the "
    "plan's model, hardware and cluster, where nothing was trained:\n\n"
    f"{rows}\n\nThat a candidate needs as many steps at the plan's scale as here is an assumption, not a "
    "measurement.\n"
  )


def advice_report(
  advice: advisor.Advice, config: config_lib.Config, gradients: int, fraction: float, seeds: int
) -> str:
  """``advice.md``: what ran, the ranked table, the pick and how far to trust it."""
  goal = (
    f"time to validation accuracy {advice.target:g}"
    if advice.target is not None
    else f"validation accuracy at {advice.time_budget:g} s"
  )
  held = config.data.validation or experiment.TUNING_VALIDATION
  return (
    f"# Which strategy for {config.name}?\n\n"
    f"Each candidate ran the first {gradients} of the config's {config.run.gradients} gradients "
    f"({fraction:g} of the run) on {seeds} seed(s), trained without the last {held:.0%} of the training "
    f"examples and evaluated on them (the test set is not read); ranked by {goal} (simulated seconds).\n\n"
    f"{advice.table()}\n\n"
    f"**Recommended: {advice.recommended}.** {advice.reason}\n\n"
    "How to read it: a time marked `measured` was reached within the short runs; otherwise it is a power "
    "law of the error (1 - accuracy) against time, fitted to the second half of each short run and "
    "extended `reach` times beyond it. A learning-rate decay after the short runs speeds the real run up "
    "in a way the fit cannot see; the range is the smallest and largest seed's estimate.\n\n"
    f"{clock_note(config.cluster)}\n"
  )


def clock_note(cluster: config_lib.ClusterConfig) -> str:
  """How far to trust the simulated seconds: where the cluster's numbers came from, and a measured
  check against a real run when ``jaxsync calibrate --check`` made one."""
  if not cluster.calibration:
    link = cluster.link if isinstance(cluster.link, str) else "a given link"
    compute = f"{cluster.compute_time:g} s per step" if cluster.compute_time else "the model's FLOPs"
    return (
      f"The clock is the config's presets ({compute}, {link}), not measured on your machines: the times "
      "are what such a cluster would take. `jaxsync calibrate CONFIG --out FILE` measures yours (the "
      "documentation's Calibration page gives the simulator's measured error against real runs)."
    )
  lines = ["The clock was measured (`jaxsync calibrate`):"]
  for key, source in cluster.calibration.items():
    if key != "check":
      lines.append(f"- {key}: {source}")
  check = cluster.calibration.get("check")
  if check:
    lines.append(f"- against a real run: {check}")
  else:
    lines.append("- not checked against a real run (`jaxsync calibrate --check STRATEGY` does)")
  return "\n".join(lines)
