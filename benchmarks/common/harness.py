"""What the paper benchmarks share: sizes, runs, tables, plots and the results file.

A paper benchmark is a grid of *cells*: a setting (worker count, network,
layout...) times a strategy, each run over a few seeds. Every run goes through
the path ``jaxsync train`` takes (a shipped config under ``configs/`` plus
dotted overrides, ``experiment.build``, ``training.train``), so a cell of a
table can be rerun alone with the command the results file prints for it.

Each script takes ``--size tiny|default|full`` (tiny: the suite's smoke size,
seconds; default: under 30 minutes on 2 CPU cores; full: the paper's scale
where this repo can reach it), ``--seeds``, ``--results-dir`` (default
``benchmarks/results``), ``--runs-dir`` (default ``runs/bench/<name>``,
one run directory per seed of each cell, each with its metrics and summary)
and ``--report-only``.

Every finished run is appended to the benchmark's results store,
``<results-dir>/<name>_runs.jsonl`` (see ``store.py``): a rerun skips the
runs it holds, so a full-size benchmark runs in several sittings, on several
machines, and ``--report-only`` rewrites the results file from the store alone,
naming the runs it lacks.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import re
import shlex
import sys
import time
from typing import Any

import jax

# A benchmark compiles the same program for every seed of a cell (and for every cell of the same shapes): a
# persistent XLA compilation cache compiles each once. A cached program is the same executable, so results
# are unchanged; a JAX_COMPILATION_CACHE_DIR of the user's own (or the test suite's) is left alone. Set
# before anything compiles: JAX decides once per process whether it caches. Delete runs/xla_cache to free its
# disk (programs of a few hundred kB each).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  jax.config.update(
    "jax_compilation_cache_dir", str(pathlib.Path(__file__).resolve().parents[2] / "runs" / "xla_cache")
  )
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.05)

import matplotlib  # noqa: E402
import numpy as np
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.common import catalog
from benchmarks.common import store as results_store
from benchmarks.common.statistics import (  # noqa: F401 (the claims call them harness.welch, harness.holm, ...)
  growth_test,
  holm,
  log_ratio_se,
  rank_test,
  time_test,
  welch,
)
from benchmarks.common.verdicts import (  # noqa: F401 (the claims build harness.Verdict, harness.Comparison, ...)
  Comparison,
  Comparisons,
  Deciding,
  Verdict,
  evidence_changes,
  finite_record,
  match_word,
)
from jaxsync._src.app import commands, experiment
from jaxsync._src.app import config as config_lib  # noqa: E402
from jaxsync._src.app.config import Config  # noqa: E402
from jaxsync._src.interface.history import crossing
from jaxsync._src.train import (
  plots,
  run_directory,
  training,  # noqa: E402
)

REPO = pathlib.Path(__file__).resolve().parents[2]
SIZES = ("tiny", "default", "full")
# The seed learning rates are tuned on, held out from the seeds a results table reports (0, 1, 2, ...).
TUNING_SEED = 100


def code_version() -> str:
  """The commit the library code comes from (short hash), with ``+changes`` when ``jaxsync/`` or
  ``configs/`` differ from it: what a results entry was measured with."""
  import subprocess

  out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
  dirty = subprocess.run(
    ["git", "status", "--porcelain", "jaxsync", "configs"], cwd=REPO, capture_output=True, text=True
  )
  return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def parser(doc: str) -> argparse.ArgumentParser:
  """The arguments every paper benchmark takes (a script may add its own)."""
  p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--size", choices=SIZES, default="default", help="tiny (smoke test), default, full")
  p.add_argument("--seeds", type=int, default=None, help="seeds per cell (default: the size's)")
  p.add_argument(
    "--results-dir",
    type=pathlib.Path,
    default=None,
    help="default: benchmarks/results (tiny: runs/bench/tiny)",
  )
  p.add_argument("--runs-dir", type=pathlib.Path, default=None, help="default: runs/bench/[tiny/]<name>")
  p.add_argument(
    "--fresh",
    action="store_true",
    help="rerun every cell (default: reuse the runs of the same config the results store holds)",
  )
  p.add_argument(
    "--report-only",
    action="store_true",
    help="train nothing: rewrite the results file from the results store, naming the runs it lacks",
  )
  p.add_argument(
    "--picks-on-test-set",
    action="store_true",
    help="with --report-only: rebuild a report from the learning rates the store's earlier tuning runs picked"
    " on the test set (the protocol before validation splits, until 2026-11-28); the report says so. New"
    " tuning runs always score on a validation split",
  )
  p.add_argument(
    "--prune-store",
    action="store_true",
    help="with --report-only: rewrite the results store keeping only the runs this report is made of (and"
    " those they were re-timed from), dropping what a retune superseded; refused while runs are missing",
  )
  return p


@dataclasses.dataclass
class Cell:
  """One strategy in one setting: its runs over seeds, and the command that reproduces one of them.

  ``missing``: seeds the results store lacks (``--report-only``); ``results`` (and ``measures``, the
  benchmark's own numbers of each run) hold the others."""

  label: str
  results: list[training.RunResult]
  command: str
  missing: int = 0
  measures: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # each run's ``measure``
  config: Config | None = None  # the first seed's, as run (the store may lack its run)

  @property
  def summaries(self) -> list[dict[str, Any]]:
    return [r.summary for r in self.results]

  @property
  def histories(self) -> list:
    return [r.history for r in self.results]

  def values(self, key: str) -> list[float | None]:
    return [s.get(key) for s in self.summaries]

  def mean(self, key: str) -> float | None:
    """Mean over the seeds; None unless every seed has a finite value (a ratio of means must not
    compare one strategy's lucky seeds with another's all)."""
    values = self.values(key)
    if not values or any(v is None or not np.isfinite(v) for v in values):
      return None
    return float(np.mean(values))

  def text(self, key: str, digits: int, scale: float = 1.0) -> str:
    """``mean ± std`` over seeds, as in ``jaxsync compare``'s results.md; one seed: its value alone;
    ``missing`` when the store holds none of the cell's runs."""
    values = [None if v is None else v * scale for v in self.values(key)]
    if not values:
      return "missing"
    if len(values) == 1:
      return "-" if values[0] is None or not np.isfinite(values[0]) else f"{values[0]:.{digits}f}"
    return commands.mean_std(values, digits)


class Benchmark:
  """Runs cells and writes ``<results-dir>/<name>.md`` and ``<results-dir>/<name>/*.png``."""

  def __init__(
    self, name: str, title: str, args: argparse.Namespace, argv: list[str], seeds: int, full_seeds: int = 3
  ):
    if args.seeds is not None and args.seeds < 1:
      raise SystemExit(f"{name}: --seeds={args.seeds}; give a count >= 1")
    self.name, self.title, self.args = name, title, args
    # seeds=0: the benchmark has no seeds (a speed benchmark).
    by_size = {"tiny": 1, "default": seeds, "full": full_seeds}
    self.seeds = 0 if seeds == 0 else args.seeds or by_size[args.size]
    # The tiny size writes beside the runs, never over the committed results.
    tiny = ("tiny",) if args.size == "tiny" else ()
    self.runs_dir = args.runs_dir or REPO.joinpath("runs", "bench", *tiny, name)
    self.results_dir = args.results_dir or (
      REPO.joinpath("runs", "bench", "tiny") if tiny else REPO / "benchmarks" / "results"
    )
    self.plot_dir = self.results_dir / name
    # A benchmark of the catalog is run as a module; a test's made-up one is shown by its name.
    self.runs_it = catalog.command(name) if catalog.known(name) else name
    self.command = " ".join([self.runs_it, *map(shlex.quote, argv)])
    self.sections: list[str] = []
    self.plots: list[pathlib.Path] = []
    self.started = time.perf_counter()
    self.run_count = self.reused_count = 0
    self.train_seconds = 0.0  # the runs' own training wall time, reused runs included
    self.untimed_count = 0  # runs stored without their training time (counted in run_count, not in time)
    self.keeps_run_dirs = True  # False: the runs stay in memory (the results file says nothing of them)
    self.report_only = bool(getattr(args, "report_only", False))
    self.picks_on_test_set = bool(getattr(args, "picks_on_test_set", False))
    self.prune_store = bool(getattr(args, "prune_store", False))
    for flag, what in [
      ("picks-on-test-set", "rebuilds a report from the store"),
      ("prune-store", "prunes the store"),
    ]:
      if getattr(args, flag.replace("-", "_"), False) and not self.report_only:
        raise SystemExit(
          f"{name}: --{flag} only {what} (with --report-only, training nothing); a tuning run never scores on"
          " the test set"
        )
    self.tuned = False  # whether a learning-rate grid ran (the results file then says what it scored on)
    self.store = results_store.RunStore(self.results_dir / f"{name}_runs.jsonl") if self.seeds else None
    self.used_keys: set[str] = set()  # the store's runs this report is made of
    self.missing: list[str] = []  # "setting | label | seed" of each run the store lacks (--report-only)
    self.verdicts: list[Verdict] = []

  # -- running ---------------------------------------------------------------------------------------

  def count_run(self, key: str, summary: dict, *, reused: bool) -> None:
    """Counts a stored run into this report once (a cell rerun with more seeds reads its first seeds
    again: they are the same runs) and adds its training time."""
    if key in self.used_keys:
      return
    self.used_keys.add(key)
    self.run_count += 1
    self.reused_count += reused
    seconds = summary.get("wall_seconds")
    self.train_seconds += seconds or 0.0
    self.untimed_count += seconds is None

  def config(self, config_name: str, overrides: list[str]) -> Config:
    """A shipped config (``configs/<config_name>.yaml``) with dotted ``--set`` overrides."""
    return config_lib.load(REPO / "configs" / f"{config_name}.yaml", overrides)

  def run(
    self,
    config: Config,
    strategy: str,
    *,
    setting: str,
    label: str | None = None,
    options: dict[str, Any] | None = None,
    config_name: str = "",
    overrides: list[str] = (),
    seeds: int | None = None,
    evaluations: int | None = None,
    measure=None,
    event_rows: int = 1,
  ) -> Cell:
    """Runs ``strategy`` (the config's shared options, ``compare.options[strategy]``, then ``options``)
    over ``seeds`` seeds (default: the benchmark's), or reads the runs back from the results store.

    ``evaluations``: evaluate about this many times per run, whatever the strategy, in place of the
    config's schedule (see ``_evaluated``). ``measure(result, experiment) -> dict``: numbers the report needs from
    the run's full history, stored with it (``Cell.measures``). ``event_rows``: how many
    of the per-event records the store keeps (evenly spaced) for plots over time."""
    label = label or strategy
    results, configs, missing = [], [], 0
    schedule = None  # the evaluation schedule depends on the strategy and cluster, not on the seed
    for i in range(seeds or self.seeds):
      cfg = experiment.for_strategy(config, strategy, config.seed + i)
      if options:
        cfg = dataclasses.replace(
          cfg, strategy=dataclasses.replace(cfg.strategy, options={**cfg.strategy.options, **options})
        )
      if evaluations:
        schedule = schedule or _evaluated(cfg.run, experiment.build(cfg), evaluations)
        cfg = dataclasses.replace(cfg, run=schedule)
      configs.append(cfg)
      stored = None if self.args.fresh else self.store.find(cfg)
      if stored is not None or self.report_only:
        if stored is None:
          missing += 1
          self.missing.append(f"{setting} | {label} | seed {cfg.seed}")
          continue
        self.count_run(results_store.config_key(cfg), stored.summary, reused=True)
        results.append(stored)
        continue
      exp = experiment.build(cfg)  # only for a run to train: building loads the data and the model
      retimed = None if self.args.fresh else self._retimed(cfg, exp, setting, label)
      if retimed is not None:  # the same updates, trained on another link: timed on this one, not trained
        self.count_run(results_store.config_key(cfg), retimed.summary, reused=True)
        results.append(retimed)
        continue
      run_dir = self.runs_dir / _slug(setting) / _slug(label) / f"seed{cfg.seed}"
      # A finished run of this very config is read back from its final checkpoint, not rerun (runs
      # made before the results store existed join it this way).
      reuse = not self.args.fresh and _finished_with(run_dir, cfg)
      if not reuse:
        run_directory.create(run_dir, overwrite=True)
        commands.write_config(run_dir, cfg)
      kwargs = exp.train_kwargs()
      kwargs["checkpoint_every"] = None  # only the final one
      started = time.perf_counter()
      # A rate that drives the parameters to NaN stops there: the rest of its budget would be NaN too.
      result = training.train(
        exp.simulator(),
        exp.model.params,
        run_dir,
        tensorboard=False,
        make_plots=False,
        stop_when_diverged=True,
        **kwargs,
      )
      # The report reads the stored copy, so --report-only writes the same numbers.
      result = self.store.add(
        cfg,
        result,
        setting=setting,
        label=label,
        code=code_version(),
        measures=measure(result, exp) if measure else None,
        event_rows=event_rows,
      )
      s = result.summary
      self.count_run(results_store.config_key(cfg), s, reused=reuse)
      print(
        f"[{self.name} {self.elapsed()}] {setting} | {label} | seed {cfg.seed}: "
        + (
          f"accuracy {_fmt(s['final_accuracy'])}, loss {_fmt(s.get('final_loss'))}, "
          if "final_accuracy" in s
          else f"validation accuracy {_fmt(s.get('final_validation_accuracy'))}, "
        )
        + f"{s.get('updates')} updates in {_fmt(s.get('simulated_time'))} simulated s "
        f"({'reused' if reuse else f'{time.perf_counter() - started:.1f} s'})",
        file=sys.stderr,
        flush=True,
      )
      results.append(result)
    return Cell(
      label,
      results,
      train_command(config_name, overrides, configs[0]) if config_name else "",
      missing,
      [self.store.measures(c) for c in configs if results_store.config_key(c) in self.used_keys],
      configs[0] if configs else None,
    )

  def _retimed(self, cfg: Config, exp, setting: str, label: str):
    """``cfg``'s run from a stored run of the same updates on another clock (another link; other speeds of
    the workers too where its rounds keep every worker's gradient), re-timed on ``cfg``'s
    (``Simulator.retime``, equal to training it bit for bit), stored with ``retimed_from``; None when its
    updates could follow the clock or no such run is stored. The re-timed run costs no training and is
    not another sample of the updates: the report counts it as read back."""
    if cfg.run.max_time is not None:
      return None
    sim = exp.simulator()
    if sim.clock_dependence() is not None:
      return None
    any_speed = sim.clock_dependence(compute_times=True) is None
    source = self.store.trained_trajectory(cfg, any_speed=any_speed) or self.store.trained_trajectory(cfg)
    if source is None:
      return None
    stored = results_store.as_result(source).history
    # retime needs the run's events (its rounds) and evaluations; the store keeps the latter whole.
    rounds = dataclasses.replace(stored, time=np.zeros([int(source["summary"]["events"])], np.float32))
    # trained_on: retime checks its compute times against this run's for fastest-k alone, whose source (found
    # without any_speed) has this run's speeds.
    history = sim.retime(rounds, exp.model.params, seed=cfg.seed, trained_on=exp.time_model)
    result = self.store.add_retimed(cfg, source, history, setting=setting, label=label, code=code_version())
    print(
      f"[{self.name} {self.elapsed()}] {setting} | {label} | seed {cfg.seed}: re-timed from the run trained "
      f"on another clock ({source['setting']}): {_fmt(result.summary.get('simulated_time'))} simulated s",
      file=sys.stderr,
      flush=True,
    )
    return result

  def tune(
    self,
    config: Config,
    candidates: dict[str, tuple[str, dict[str, Any]]],
    grid: tuple[float, ...],
    *,
    seed: int = TUNING_SEED,
    evaluations: int | None = None,
    objective: str = "accuracy",
    extend: bool = False,
    max_extensions: int = 3,
    setting: str = "lr grid",
    option: str = "learning_rate",
  ) -> tuple[dict[str, float], str]:
    """Each candidate's learning rate picked on the same ``grid``: one run per rate on a held-out seed,
    trained without a validation slice of the training set and scored on it (``experiment.for_tuning``):
    no tuning run reads the test set.

    ``candidates`` is ``{label: (strategy, options)}``. ``objective="accuracy"``: the best final validation
    accuracy wins (a diverged run counts as -1); ``"time"``: the shortest time to the target on the
    validation split (a crossing that holds), then the best final validation accuracy among rates that
    never reach it. The smaller rate wins a
    tie. ``extend``: a pick at the grid's edge adds the next rate beyond it (the grid's own ratio), up to
    ``max_extensions`` per side, until the pick is interior or the rate beyond it diverges. ``setting``
    names the column tuned (one grid per column). Returns ``{label: rate}`` and the grid as a markdown
    table (the pick in bold) with a line on every extension, so every method is tuned the same way and
    the report shows how. ``option``: the option the grid sets (default the learning rate; e.g. a
    local-update method's ``outer_learning_rate``, the candidates' options holding their picked inner rate).
    """
    if objective not in ("accuracy", "time"):
      raise ValueError(f"tune: {objective=}; give 'accuracy' or 'time'")
    grid = tuple(sorted(grid))
    self.tuned = True
    config = dataclasses.replace(config, seed=seed)
    if not self.picks_on_test_set:
      config = experiment.for_tuning(config)
    scores: dict[str, dict[float, dict[str, Any] | None]] = {}
    best: dict[str, float] = {}
    notes: list[str] = []

    short = "lr" if option == "learning_rate" else option.removesuffix("_learning_rate") + " lr"

    def score(label: str, strategy: str, options: dict[str, Any], rate: float) -> dict[str, Any] | None:
      cell = self.run(
        config,
        strategy,
        setting=setting,
        label=f"{label} {short.replace(' ', '_')}={rate:g}"
        if option != "learning_rate"
        else f"{label} lr={rate:g}",
        options={**options, option: rate},
        seeds=1,
        evaluations=evaluations,
      )
      if not cell.results:  # --report-only, and the store lacks the run
        return None
      s = cell.summaries[0]
      # The earlier protocol's stored runs, read back (--picks-on-test-set), else a validation score.
      accuracy = s.get("final_accuracy") if self.picks_on_test_set else tuning_score(s)
      diverged = bool(s.get("diverged")) or accuracy is None or not np.isfinite(accuracy)
      return {
        "accuracy": -1.0 if diverged else accuracy,
        "time": s.get("time_to_target_held"),
        "diverged": diverged,
      }

    def key(rate: float, r: dict[str, Any]):
      if objective == "time":
        reached = r["time"] is not None and not r["diverged"]
        return (reached, -(r["time"] or 0.0) if reached else r["accuracy"], -rate)
      return (r["accuracy"], -rate)

    for label, (strategy, options) in candidates.items():
      tried = scores.setdefault(label, {})
      for rate in grid:
        tried[rate] = score(label, strategy, options, rate)
      extensions = {"up": 0, "down": 0}
      while True:
        ran = {r: v for r, v in tried.items() if v is not None}
        if not ran:  # nothing in the store yet (--report-only): the middle rate, whose cells are missing too
          best[label] = grid[len(grid) // 2]
          break
        best[label] = max(ran, key=lambda r: key(r, ran[r]))
        rates = sorted(tried)
        side = "up" if best[label] == rates[-1] else "down" if best[label] == rates[0] else None
        if not extend or side is None or len(rates) < 2:
          break
        if extensions[side] >= max_extensions:
          notes.append(
            f"{label}: {best[label]:g} is still the {'top' if side == 'up' else 'bottom'} after "
            f"{max_extensions} extensions"
          )
          break
        ratio = rates[-1] / rates[-2] if side == "up" else rates[1] / rates[0]
        beyond = float(f"{(rates[-1] * ratio if side == 'up' else rates[0] / ratio):.3g}")
        extensions[side] += 1
        tried[beyond] = score(label, strategy, options, beyond)
        if tried[beyond] is None:
          notes.append(f"{label}: the extension to {beyond:g} is not in the store yet")
          del tried[beyond]
          break
        if side == "up" and tried[beyond]["diverged"]:
          notes.append(f"{label}: {best[label]:g} is the top; the next rate, {beyond:g}, diverged")
          break
      if extensions["up"] or extensions["down"]:
        notes.append(f"{label}: grid extended to {min(tried):g}-{max(tried):g}, pick {best[label]:g}")

    columns = sorted({r for tried in scores.values() for r in tried})

    def shown(label: str, rate: float) -> str:
      if rate not in scores[label]:
        return ""
      r = scores[label][rate]
      if r is None:
        return "missing"
      if r["diverged"]:
        return "diverged"
      text = f"{100 * r['accuracy']:.2f}"
      if objective == "time":
        text = (f"{r['time']:.4g} s" if r["time"] is not None else "not reached") + f" ({text})"
      return f"**{text}**" if rate == best[label] else text

    rows = [[label] + [shown(label, rate) for rate in columns] for label in scores]
    text = table(["strategy", *[f"{short} {r:g}" for r in columns]], rows)
    split = "test set (the earlier protocol)" if self.picks_on_test_set else "validation split"
    if objective == "time":
      text += (
        f"\n\nEach cell: the time to the target on the {split} (a crossing that holds), final accuracy % on it"
        " in brackets."
      )
    else:
      text += f"\n\nEach cell: the final accuracy % on the {split}."
    if notes:
      text += "\n\nGrid extensions: " + "; ".join(notes) + "."
    return best, text

  def tuned_on(self) -> str:
    """What the learning-rate grids of this report scored on, in a sentence."""
    if self.picks_on_test_set:
      return (
        "picked on the **test set** by the store's earlier tuning runs (the protocol before validation splits,"
        " until 2026-11-28: `--picks-on-test-set`); retuning on a validation split is under way, and a verdict"
        " whose picks move will be decided again"
      )
    return (
      f"picked on a validation split: tuning runs train without the last {experiment.TUNING_VALIDATION:.0%} of"
      " the training examples and score on them; the test set is read only by the reported cells, which train"
      " on the whole training set"
    )

  def elapsed(self) -> str:
    seconds = int(time.perf_counter() - self.started)
    return f"{seconds // 60}:{seconds % 60:02d}"

  # -- writing ---------------------------------------------------------------------------------------

  def verdict(self, verdict: Verdict) -> None:
    """Records a claim's verdict: written as the results file's verdict table and as ``<name>_verdicts.json``,
    which the Results page's table is generated from."""
    self.verdicts.append(verdict)

  def decided(self, paper: str, full: dict, half: dict, *, budget: str, seeds, picks) -> None:
    """Records every claim of ``full`` (``{claim: (verdict, evidence, *what it rests on)}``) with its verdict
    at half the budget from ``half``; ``seeds`` and ``picks`` are text, or functions of ``(claim, rests)``.
    While the store lacks runs of the report, every verdict is "not decided yet"."""
    for claim, (verdict, evidence, *rests) in full.items():
      number = next((r for r in rests if isinstance(r, Deciding)), None)
      compared = next((r for r in rests if isinstance(r, Comparisons)), None)
      rests = [r for r in rests if not isinstance(r, (Deciding, Comparisons))]
      at_half, half_evidence = half[claim][:2] if claim in half else (None, None)
      half_compared = next((r for r in half.get(claim, ())[2:] if isinstance(r, Comparisons)), None)
      changes = [] if self.missing else evidence_changes(compared, half_compared)
      if self.missing:  # a partial store decides nothing: the runs it lacks could turn any verdict
        verdict = f"**not decided yet** ({len(self.missing)} runs missing; so far {verdict})"
        if at_half is not None:  # worded alike, so that only a different verdict reads as budget-sensitive
          at_half = f"**not decided yet** ({len(self.missing)} runs missing; so far {at_half})"
      self.verdict(
        Verdict(
          paper,
          claim,
          verdict,
          evidence,
          budget,
          seeds(claim, rests) if callable(seeds) else seeds,
          picks(claim, rests) if callable(picks) else picks,
          at_half,
          half_evidence,
          None if number is None else str(number),
          changes,
          [finite_record(c._asdict()) for c in compared or ()],
        )
      )

  def _budget_sensitive_text(self) -> str:
    """What each budget-sensitive verdict rests on at half the budget: its word there, the comparisons whose
    sign or significance changes, and its evidence ("" when no verdict is budget-sensitive)."""
    rows = [
      [v.claim, v.at_half, "; ".join(v.evidence_changes) or "none", v.half_evidence or "-"]
      for v in self.verdicts
      if v.budget_sensitive
    ]
    if not rows:
      return ""
    header = ["claim", "verdict", "comparisons that change", "evidence"]
    return "\nAt half the budget:\n\n" + table(header, rows, text=True) + "\n"

  def section(self, heading: str, text: str) -> None:
    """A ``## heading`` and its text (a table, notes) in the results file, in order."""
    self.sections.append(f"## {heading}\n\n{text.strip()}\n")

  def figure(self, stem: str, figure) -> pathlib.Path:
    """Saves a figure as ``<results-dir>/<name>/<stem>.png`` and links it in the results file."""
    self.plot_dir.mkdir(parents=True, exist_ok=True)
    path = self.plot_dir / f"{stem}.png"
    figure.savefig(path, dpi=90)
    plt.close(figure)
    self.plots.append(path)
    return path

  def compare_figure(
    self, stem: str, panels: dict[str, dict[str, list]], metric: str = "accuracy", axis: str = "time"
  ) -> pathlib.Path:
    """One panel per setting, one mean-over-seeds curve per strategy: ``{setting: {label: histories}}``."""
    n = len(panels)
    cols = min(n, 2)
    rows = -(-n // cols)
    figure, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.2 * rows), squeeze=False)
    for ax, (setting, runs) in zip(axes.flat, panels.items()):
      plots.draw_compare(ax, runs, metric, axis)
      ax.set_title(setting)
      ax.set_xlabel("simulated seconds" if axis == "time" else "server updates")
      ax.set_ylabel(metric)
      ax.grid(alpha=0.3)
      if metric == "accuracy":
        ax.set_ylim(max(0.0, ax.get_ylim()[0]), 1.0)
      if ax.get_legend_handles_labels()[0]:  # none while the store lacks the panel's runs
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[n:]:
      ax.set_visible(False)
    figure.tight_layout()
    return self.figure(stem, figure)

  def _prune(self) -> None:
    """``--prune-store``: the store keeps this finished report's runs (:meth:`RunStore.keep_only`)."""
    if self.missing:
      raise SystemExit(
        f"{self.name}: --prune-store refused: {len(self.missing)} runs of this report are missing"
      )
    dropped = self.store.keep_only(self.used_keys)
    print(
      f"[{self.name}] pruned the store: dropped {dropped} runs this report does not read", file=sys.stderr
    )

  def write(self) -> pathlib.Path:
    """Writes the results file: title, command, machine, date, wall time, sections, plots."""
    self.results_dir.mkdir(parents=True, exist_ok=True)
    path = self.results_dir / f"{self.name}.md"
    lines = [
      f"# {self.title}",
      "",
      f"- Command: `{self.command}` (size `{self.args.size}`"
      + (f", {self.seeds} seed(s) per cell)" if self.seeds else ")"),
      f"- Machine: {machine()}",
      f"- Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
      f"- Wall time: {self.elapsed()} (min:s) for {self.run_count} runs"
      + (
        f" ({self.reused_count} read back from earlier finished runs; the runs' own training took"
        f" {self.train_seconds / 60:.1f} min in all"
        + (f", {self.untimed_count} of them stored without their time" if self.untimed_count else "")
        + ")"
        if self.reused_count
        else ""
      ),
    ]
    if self.store is not None and self.prune_store:
      self._prune()
    if self.store is not None:
      versions = self.store.code_versions(self.used_keys)
      parts = len(results_store.store_parts(self.store.path))
      retimed = sum(1 for k in self.used_keys if self.store.entries.get(k, {}).get("retimed_from"))
      lines.append(
        f"- Results store: `{_relative(self.store.path)}`"
        + (
          f" in {parts} parts (then {', '.join(f'`.{n}.jsonl`' for n in range(2, parts + 1))})"
          if parts > 1
          else ""
        )
        + f" ({len(self.used_keys)} of its {len(self.store)} runs make this report"
        + (f", {retimed} of them re-timed from a run trained on another clock" if retimed else "")
        + (f"; code {', '.join(versions)}" if versions else "")
        + ")"
      )
    if self.tuned:
      lines.append(f"- Learning rates: {self.tuned_on()}")
    if self.seeds:
      lines.append(
        "- Time (updates, gradients) to a target: at the first evaluation from which the accuracy stays at or"
        " above it to the run's end, the final evaluation counted as the last one (a crossing that holds, not"
        " one lucky evaluation); the crossing lies after the evaluation before it, so two cells whose mean times"
        " differ by no more than that interval are not told apart (p = 1)"
      )
    if self.missing:
      shown = "; ".join(self.missing[:12]) + (
        f"; and {len(self.missing) - 12} more" if len(self.missing) > 12 else ""
      )
      lines.append(
        f"- **Partial**: {len(self.missing)} runs of this report are not in the store yet ({shown}). The"
        " tables say `missing` for them, and every verdict and finding below reads only the runs present."
        f" Run `{self.runs_it}` with the same arguments, without `--report-only`, to add them."
      )
    if self.verdicts:
      rows = [
        [
          v.claim,
          v.verdict + (" (**budget-sensitive**)" if v.budget_sensitive else ""),
          v.decides or "-",
          v.evidence,
          v.budget,
          v.seeds,
          v.picks,
          "-" if v.at_half is None else v.at_half,
        ]
        for v in self.verdicts
      ]
      self.sections.insert(
        0,
        "## Verdicts\n\n"
        + table(
          [
            "claim",
            "verdict",
            "the number it turns on",
            "evidence",
            "budget",
            "seeds",
            "learning rates",
            "at half the budget",
          ],
          rows,
          text=True,
        )
        + "\n\nA verdict is marked budget-sensitive where at half the budget (the same picks) its word differs,"
        " or a comparison it rests on changes sign or significance.\n" + self._budget_sensitive_text(),
      )
      tuned = {"tuned_on": "test set" if self.picks_on_test_set else "validation"} if self.tuned else {}
      records = [
        {**dataclasses.asdict(v), "budget_sensitive": v.budget_sensitive, **tuned} for v in self.verdicts
      ]
      (self.results_dir / f"{self.name}_verdicts.json").write_text(json.dumps(records, indent=1) + "\n")
    lines += ["", *self.sections]
    if self.plots:
      lines += ["## Plots", ""]
      lines += [f"![{p.stem}]({_relative(p, self.results_dir)})" for p in self.plots]
      lines.append("")
    path.write_text("\n".join(lines))
    print(f"[{self.name}] wrote {path}", file=sys.stderr)
    return path


def tuning_score(summary: dict[str, Any]) -> float | None:
  """A tuning run's score, its final validation accuracy; raises RuntimeError for a run that read the test
  set (evaluated on it, or a target on a test metric), so that no pick can come from the test set."""
  target = (summary.get("target") or {}).get("metric", "validation_accuracy")
  if (
    summary.get("evaluated_on") != "validation"
    or "final_accuracy" in summary
    or target != "validation_accuracy"
  ):
    raise RuntimeError(
      f"tuning: a run evaluated on {summary.get('evaluated_on')!r} with target {target!r} scores a test "
      "metric; a tuning run must train without the validation slice and score on it only "
      "(experiment.for_tuning)"
    )
  return summary.get("final_validation_accuracy")


def gradients_to(result, accuracy: float) -> int | None:
  """Gradients the server had received at the evaluation from which accuracy stays at or above
  ``accuracy`` to the run's end (the crossing that holds, the final evaluation counted as the last one),
  else None (an asynchronous run: one event per gradient)."""
  history, final = result.history, result.summary.get("final_accuracy")
  values = np.append(history.eval_metrics["accuracy"], np.nan if final is None else final)
  i = crossing(values, accuracy, holds=True)
  if i is None:
    return None
  return int(history.eval_event[i]) if i < len(history.eval_event) else int(result.summary["gradients"])


def seed_range(cells) -> str:
  """The seeds per cell over ``cells``: ``"3"``, or ``"3-5"`` when some got more."""
  counts = sorted({len(c.results) for c in cells})
  return "-".join(map(str, (counts[0], counts[-1]) if len(counts) > 1 else counts)) if counts else "0"


def picks_text(objective: str, picks: dict[tuple[str, str], float]) -> str:
  """``{(column, label): rate}`` in words, saying what the rates were tuned on."""
  what = "the time to the target" if objective == "time" else "final accuracy"
  return f"tuned on {what}: " + "; ".join(f"{column} {label} {r:g}" for (column, label), r in picks.items())


def crossing_width(*cells: Cell) -> float | None:
  """How far a crossing of the target may lie from the evaluation that saw it, for these cells: the largest
  of their seeds' mean gap between the crossing that holds and the evaluation before it (None when no
  seed reached the target). ``time_test``'s ``within``."""
  widths = []
  for cell in cells:
    gaps = [
      s["time_to_target_held"] - s["time_to_target_held_after"]
      for s in cell.summaries
      if s.get("time_to_target_held") is not None and s.get("time_to_target_held_after") is not None
    ]
    if gaps:
      widths.append(float(np.mean(gaps)))
  return max(widths, default=None)


def speed_extensions(time_text: str) -> str:
  """The grid-extension line of a tuning on the time to the target (``tune(objective="time")``), to show
  beside the accuracy tuning's table of the same runs; "" when that tuning extended nothing."""
  found = [part for part in time_text.split("\n\n") if part.startswith("Grid extensions: ")]
  return "".join(f"\n\nFor the speed claim (the fastest to the target): {p[0].lower()}{p[1:]}" for p in found)


def seeds_ran(cell: Cell) -> int:
  """The seeds ``cell`` was asked for: those the store holds and those it lacks."""
  return len(cell.results) + cell.missing


def seeds_for(seeds, key) -> int | None:
  """``seeds[key]`` when ``seeds`` maps cells to their seeds (a half-budget check runs each cell with the
  seeds its full-budget cell had), else ``seeds`` itself (one count for every cell, None: the default)."""
  return seeds.get(key) if isinstance(seeds, dict) else seeds


def too_close(a: Cell, b: Cell, key: str) -> bool:
  """Whether two cells' means of ``key`` lie within two standard deviations of each other (the larger
  of the two std's): such a pair gets 5 seeds instead of 3."""
  return values_too_close(a.values(key), b.values(key))


def values_too_close(a: list, b: list) -> bool:
  """Whether two samples' means lie within two standard deviations of each other (the larger of the two)."""
  x = [v for v in a if v is not None and np.isfinite(v)]
  y = [v for v in b if v is not None and np.isfinite(v)]
  if len(x) < 2 or len(y) < 2:
    return False
  spread = max(float(np.std(x, ddof=1)), float(np.std(y, ddof=1)))
  return abs(float(np.mean(x)) - float(np.mean(y))) <= 2 * spread


def smega2_schedule(epochs: float) -> list[str]:
  """The SMEGA² trainer's step schedule (warm-up over 5/160 of the run, x0.1 at 1/2 and 3/4 of it) scaled
  to a run of ``epochs``, as ``--set`` overrides of a Fashion-MNIST paper config's ``strategy.schedule``."""
  return [
    f"strategy.schedule.warmup={epochs * 5 / 160:g}",
    f"strategy.schedule.boundaries=[{epochs / 2:g}, {epochs * 3 / 4:g}]",
  ]


def table(header: list[str], rows: list[list[str]], *, text: bool = False) -> str:
  """A markdown table; the first column left-aligned, the others right-aligned (numbers), or every column
  left-aligned with ``text``."""
  for row in rows:
    if len(row) != len(header):
      raise ValueError(f"table: a row has {len(row)} cells, the header {len(header)}: {row}")
  lines = ["| " + " | ".join(header) + " |", "|---|" + ("---|" if text else "---:|") * (len(header) - 1)]
  lines += ["| " + " | ".join(row) + " |" for row in rows]
  return "\n".join(lines)


def code(lines: list[str]) -> str:
  """A fenced shell block (commands to copy)."""
  return "```sh\n" + "\n".join(lines) + "\n```"


def machine() -> str:
  """One line: OS, CPU count the process may use, Python, JAX and its backend."""
  cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  model = platform.processor() or "unknown CPU"
  cpuinfo = pathlib.Path("/proc/cpuinfo")
  if cpuinfo.is_file():
    names = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M)
    model = names[0].strip() if names else model
  return (
    f"{platform.system()} {platform.machine()}, {cpus} CPU cores ({model}), "
    f"Python {platform.python_version()}, JAX {jax.__version__} ({jax.default_backend()})"
  )


def ratio(numerator: float | None, denominator: float | None, digits: int = 2) -> str:
  """``a/b`` as ``1.23x``, or ``-`` when either side is missing."""
  if numerator is None or denominator is None or denominator == 0:
    return "-"
  return f"{numerator / denominator:.{digits}f}x"


def _fmt(value: Any) -> str:
  return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _evaluated(run, exp, evaluations: int):
  """``run`` with a schedule of about ``evaluations`` evaluations for ``exp``'s strategy.

  A synchronous strategy makes one update per round of K gradients: every ``G / (n K)`` updates. An
  asynchronous one may combine a number of arrivals per update nobody knows beforehand (adaptive k's
  tests, EASGD's period), so it is evaluated in simulated time, over the time its workers or its server
  need for the gradients: ``G max(1 / sum_i (1 / c_i), message + 3 arrays of server memory traffic)``.
  One time schedule for every strategy would evaluate a slow synchronous run a hundred times."""
  gradients = run.gradients
  per_event = exp.strategy.gradients_per_event
  if per_event > 1:
    return dataclasses.replace(
      run, eval_every=max(1, gradients // (evaluations * per_event)), eval_every_time=None
    )
  clock = exp.time_model.with_message_bytes(exp.model.params)
  workers = 1.0 / float(np.sum(1.0 / clock.mean_compute_times()))
  server = clock.message_time() + clock.memory_time(3)
  return dataclasses.replace(
    run, eval_every=None, eval_every_time=float(f"{gradients * max(workers, server) / evaluations:.4g}")
  )


def train_command(config_name: str, overrides: list[str], ran: Config) -> str:
  """The ``jaxsync train`` line that reruns one cell's first seed (config ``ran``): its config file, the
  benchmark's overrides, and the strategy with its resolved options (shared, ``compare.options``, the
  cell's own) as one mapping, since ``jaxsync train`` reads ``strategy.options`` as they stand."""
  keep = [o for o in overrides if not o.startswith(("strategy.name", "strategy.options", "compare."))]
  options = yaml.safe_dump(ran.strategy.options, default_flow_style=True, width=10_000).strip()
  sets = [*keep, f"strategy.name={ran.strategy.name}", f"strategy.options={options}"]
  # The schedule as the run had it (Benchmark.run's evaluations may have set it), so the line rebuilds it.
  if ran.run.eval_every_time is None:
    sets += [f"run.eval_every={ran.run.eval_every}", "run.eval_every_time=null"]
  else:
    sets += ["run.eval_every=null", f"run.eval_every_time={ran.run.eval_every_time!r}"]
  if ran.seed:
    sets.append(f"seed={ran.seed}")
  return f"jaxsync train configs/{config_name}.yaml " + " ".join(f"--set {shlex.quote(x)}" for x in sets)


def _finished_with(run_dir: pathlib.Path, cfg: Config) -> bool:
  """Whether ``run_dir`` holds a finished run (its summary written) of exactly ``cfg``."""
  if not (run_dir / "summary.json").is_file() or not (run_dir / "config.yaml").is_file():
    return False
  try:
    return config_lib.load(run_dir / "config.yaml") == cfg
  except config_lib.ConfigError:
    return False


def _slug(text: str) -> str:
  return re.sub(r"[^A-Za-z0-9_.+-]+", "_", text).strip("_")


def _relative(path: pathlib.Path, to: pathlib.Path = REPO) -> str:
  try:
    return str(path.resolve().relative_to(to.resolve()))
  except ValueError:
    return str(path)
