"""Compile time against the number of parameter arrays: every rule against optax, the simulator against a plain loop.

A model without scanned layers has hundreds of parameter arrays (a 1B-parameter
transformer written layer by layer: 300 or more). What a user waits for before
the first step is the first call of the jitted update: tracing, lowering and
XLA's compilation. This script measures that time, with JAX's caches cleared
before each measurement, for

* every public rule's update (``tx.update`` under ``jax.jit``, as each is used:
  direction rules chained with a learning rate), once with the rule's own
  non-finite check and once with ``grads_finite`` passed (what the runtimes
  do), against ``optax.sgd(momentum=0.9)`` and against
  ``optax.apply_if_finite(optax.sgd(momentum=0.9))``, optax's rule with the
  same guarantee on NaN and Inf gradients;
* the simulator's first ``advance`` (the engine compiled around the strategy's
  rules and the model's gradient) against a plain jitted ``lax.scan`` of the
  same number of SGD steps on the same model and data.

The model is a stack of layers of a small transformer block's shapes
(``(64, 192)``, ``(64, 64)``, ``(64, 256)``, ``(256, 64)`` and two ``(64,)``)
for the rules, and a deep tanh MLP of 16-wide layers (a weight and a bias per
layer) for the simulator. Each measurement is the fastest of ``--repeats``
first calls, each interleaved with its baseline's, and the ratio is paired.
Target (issue "the rules where real models train"): within 2x the baseline at
300 arrays.

    python -m benchmarks.speed.compile_time [--arrays 30,100,300,1000] [--repeats 2]
        [--simulator-arrays 30,100,300] [--rules NAME,...] [--strategies asp,ormo,bsp,diloco,easgd]

Writes ``benchmarks/results/compile_time.md`` and keeps every measurement in
``benchmarks/results/compile_time_runs.jsonl``; a second run reuses the
measurements stored for the same code version and measures only what is
missing (``--fresh`` measures everything again; ``--report-only`` rewrites the results file from the
store, e.g. after an interrupted run). A measurement that passes
``--give-up`` seconds stops the larger sizes of that row. This is a
benchmark, not a test: it prints what it measured and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxsync
from benchmarks.common import harness

REPO = pathlib.Path(__file__).resolve().parents[2]
NUM_WORKERS = 4
LR = 0.01
BLOCK = ((64, 192), (64, 64), (64, 256), (256, 64), (64,), (64,))
TARGET = 2.0


def _server(state, params):
  return {"version": jaxsync.server_version(state), "worker": jnp.int32(1), "num_live_workers": jnp.int32(4)}


def _none(state, params):
  return {}


def _elastic(state, params):
  return {"center": params, "center_read": params}


def rules() -> dict[str, tuple[Callable[[], optax.GradientTransformationExtraArgs], Callable]]:
  """Every public rule, built as it is used, with the extra args of one valid update."""
  k = NUM_WORKERS
  return {
    "ordered_momentum": (lambda: jaxsync.ordered_momentum(LR, 0.9, num_workers=k), _server),
    "ordered_momentum (DA)": (
      lambda: jaxsync.ordered_momentum(LR, 0.9, num_workers=k, delay_adaptive=True),
      _server,
    ),
    "adaptive_k + lr": (
      lambda: optax.chain(jaxsync.adaptive_k(max_k=k), optax.scale_by_learning_rate(LR)),
      _server,
    ),
    "on_release(adaptive_k, adam)": (
      lambda: jaxsync.on_release(jaxsync.adaptive_k(momentum=0.0, max_k=k), optax.adam(LR)),
      _server,
    ),
    "scale_by_staleness + lr": (
      lambda: optax.chain(jaxsync.scale_by_staleness(), optax.scale_by_learning_rate(LR)),
      _server,
    ),
    "scale_by_staleness (n-softsync) + lr": (
      lambda: optax.chain(
        jaxsync.scale_by_staleness("exponential", penalty=0.1, gradients_per_update=2),
        optax.scale_by_learning_rate(LR),
      ),
      _server,
    ),
    "smega2": (lambda: jaxsync.smega2(LR, 0.9, num_workers=k), _server),
    "dc_asgd": (lambda: jaxsync.dc_asgd(LR, 0.04, num_workers=k), _server),
    "dc_asgd (adaptive)": (lambda: jaxsync.dc_asgd(LR, 2.0, num_workers=k, adaptive=True), _server),
    "delayed_nesterov": (lambda: jaxsync.delayed_nesterov(LR, 0.9, momentum_period=k), _server),
    "diloco": (lambda: jaxsync.diloco(optax.adamw(LR), period=k), _none),
    "diloco (streaming, 4 fragments)": (
      lambda: jaxsync.diloco(optax.adamw(LR), period=k, fragments=4),
      _none,
    ),
    "bb_step_size": (lambda: optax.chain(jaxsync.bb_step_size(LR, smoothing=0.1), optax.scale(-1.0)), _none),
    "easgd_worker": (lambda: jaxsync.easgd_worker(LR, moving_rate=0.2), _elastic),
    "easgd_worker (EAMSGD)": (
      lambda: jaxsync.easgd_worker(LR, moving_rate=0.2, momentum=0.9, period=4),
      _elastic,
    ),
    "easgd_center": (lambda: jaxsync.easgd_center(0.2), _elastic),
    "ea_wild_center": (lambda: jaxsync.ea_wild_center(0.2), _elastic),
  }


# The optax rule of each family: SGD with momentum, or AdamW for the rules built around Adam.
FAMILIES = {
  "sgd": lambda: optax.sgd(LR, momentum=0.9),
  "adamw": lambda: optax.adamw(LR),
}
ADAM_RULES = ("on_release(adaptive_k, adam)", "diloco", "diloco (streaming, 4 fragments)")


def family(name: str) -> str:
  return "adamw" if name in ADAM_RULES else "sgd"


def baseline(name: str, guarded: bool):
  inner = FAMILIES[family(name)]
  return (lambda: optax.apply_if_finite(inner(), 10**9)) if guarded else inner, _none


def block_params(num_arrays: int) -> dict:
  return {f"a{i:04d}": jnp.full(BLOCK[i % len(BLOCK)], 0.01, jnp.float32) for i in range(num_arrays)}


def first_update_seconds(make, extra_args, num_arrays: int, grads_finite: bool = False) -> float:
  """Tracing, lowering and compiling one jitted update, JAX's caches cleared first."""
  jax.clear_caches()
  params = block_params(num_arrays)
  tx = make()
  state = tx.init(params)
  flag = {"grads_finite": jnp.asarray(True)} if grads_finite else {}

  def update(grads, state, params):
    return tx.update(grads, state, params, **extra_args(state, params), **flag)

  start = time.perf_counter()
  jax.jit(update).lower(params, state, params).compile()
  return time.perf_counter() - start


def mlp(num_arrays: int, width: int = 16):
  layers = max(1, num_arrays // 2)
  params = {f"l{i:04d}": {"w": jnp.eye(width) + 0.01, "b": jnp.zeros(width)} for i in range(layers)}

  def loss_fn(p, batch):
    h = batch["x"]
    for i in range(layers):
      h = jnp.tanh(h @ p[f"l{i:04d}"]["w"] + p[f"l{i:04d}"]["b"])
    return optax.softmax_cross_entropy_with_integer_labels(h[:, :10], batch["y"]).mean()

  return params, loss_fn


def worker_data(width: int = 16):
  rng = np.random.default_rng(0)
  n = NUM_WORKERS * 64
  arrays = {"x": rng.normal(size=(n, width)).astype(np.float32), "y": rng.integers(0, 10, n).astype(np.int32)}
  return jaxsync.sim.WorkerData(arrays, num_workers=NUM_WORKERS, batch_size=8)


def plain_loop_seconds(num_arrays: int, steps: int) -> float:
  """The first call of a jitted ``lax.scan`` of ``steps`` SGD steps (one gradient each)."""
  jax.clear_caches()
  params, loss_fn = mlp(num_arrays)
  data = worker_data()

  def run(p):
    def body(p, t):
      g = jax.grad(loss_fn)(p, data.batch(0, t))
      return jax.tree.map(lambda x, y: x - LR * y, p, g), None

    return jax.lax.scan(body, p, jnp.arange(steps))[0]

  start = time.perf_counter()
  jax.block_until_ready(jax.jit(run)(params))
  return time.perf_counter() - start


def first_advance_seconds(strategy: str, num_arrays: int, gradients: int) -> float:
  """The simulator's first ``advance`` over about ``gradients`` worker-steps (compiling included)."""
  jax.clear_caches()
  params, loss_fn = mlp(num_arrays)
  strat = jaxsync.strategies.make(strategy, NUM_WORKERS, learning_rate=LR)
  sim = jaxsync.sim.Simulator(strat, loss_fn, worker_data(), jaxsync.sim.TimeModel(num_workers=NUM_WORKERS))
  events = max(1, gradients // strat.gradients_per_event)
  state = sim.init(params)
  start = time.perf_counter()
  jax.block_until_ready(sim.advance(state, events))
  return time.perf_counter() - start


def load_store(path: pathlib.Path, version: str) -> dict:
  rows = {}
  if path.is_file():
    for line in path.read_text().splitlines():
      row = json.loads(line)
      if row.get("code_version") == version:
        rows[(row["kind"], row["name"], row["path"], row["arrays"])] = row
  return rows


def measure(
  store: dict,
  path: pathlib.Path,
  version: str,
  key: tuple,
  timers: dict[str, Callable[[], float]],
  repeats: int,
):
  """``repeats`` rounds of every timer in turn (the measured one and its baselines): a row of the store."""
  if key in store:
    return store[key]
  seconds = {name: [] for name in timers}
  for _ in range(repeats):
    for name, timer in timers.items():
      seconds[name].append(timer())
  row = dict(zip(("kind", "name", "path", "arrays"), key), code_version=version, seconds=seconds)
  store[key] = row
  with path.open("a") as out:
    out.write(json.dumps(row) + "\n")
  kind, name, how, arrays = key
  own = ", ".join(f"{t:.2f}" for t in seconds["measured"])
  print(f"{kind:9s} {name:38s} {how:13s} {arrays:5d} arrays: {own} s", flush=True)
  return row


def paired(row: dict, baseline: str) -> tuple[float, float, float]:
  """The fastest first call, the baseline's, and the median of the paired ratios (same round)."""
  own, base = row["seconds"]["measured"], row["seconds"][baseline]
  return min(own), min(base), float(np.median([a / b for a, b in zip(own, base)]))


def report(store: dict, args, version: str) -> str:
  lines = [
    "# Compile time against the number of parameter arrays",
    "",
    f"Written by `python -m benchmarks.speed.compile_time` (code version `{version}`) on {harness.machine()}.",
    "",
    "Each figure is the first call of the jitted update (tracing, lowering, compiling; JAX's caches cleared),",
    f"the fastest of {args.repeats}; a ratio is the median of the paired ratios to the baseline measured in the",
    "same round. The model: layers of a transformer block's shapes (64x192, 64x64, 64x256, 256x64, 64, 64).",
    f"Target: within {TARGET:g}x the baseline at 300 arrays.",
    "",
    "## Rules",
    "",
    "The baseline is optax's rule of the rule's family: `optax.sgd(momentum=0.9)`, or `optax.adamw` for the",
    "rules built around Adam (DiLoCo's inner AdamW, `on_release(..., optax.adam)`). With the rule's own NaN/Inf",
    "check, against the baseline and against `optax.apply_if_finite(baseline)` (the same guarantee on NaN and",
    "Inf gradients); with `grads_finite` passed (the runtimes check on the worker), against the baseline.",
    "",
  ]
  header = [
    "rule",
    "arrays",
    "baseline",
    "seconds",
    "baseline: seconds",
    "ratio",
    "vs apply_if_finite(baseline)",
    "grads_finite: seconds",
    "ratio",
  ]
  rows = []
  for name in rules():
    for n in args.arrays:
      own = store.get(("rule", name, "own check", n))
      if own is None:
        continue
      seconds, base, vs_base = paired(own, "baseline")
      vs_aif = paired(own, "apply_if_finite")[2]
      cells = [f"optax.{family(name)}", f"{seconds:.2f}", f"{base:.2f}", f"{vs_base:.2f}x", f"{vs_aif:.2f}x"]
      passed = store.get(("rule", name, "grads_finite", n))
      if passed is not None:
        p_seconds, _, p_vs = paired(passed, "baseline")
        cells += [f"{p_seconds:.2f}", f"{p_vs:.2f}x"]
      else:
        cells += ["-", "-"]
      rows.append([name, str(n), *cells])
  lines += [harness.table(header, rows), ""]
  lines += [
    "## The simulator's first advance",
    "",
    "Against the first call of a plain jitted `lax.scan` of the same number of SGD steps on the same model",
    f"(a deep 16-wide tanh MLP, two arrays per layer), {NUM_WORKERS} workers, {args.gradients} gradients.",
    "",
  ]
  rows = []
  for name in args.strategies:
    for n in args.simulator_arrays:
      own = store.get(("simulator", name, "first advance", n))
      if own is None:
        continue
      seconds, base, vs = paired(own, "plain loop")
      rows.append([name, str(n), f"{seconds:.2f}", f"{base:.2f}", f"{vs:.2f}x"])
  lines += [harness.table(["strategy", "arrays", "seconds", "plain loop: seconds", "ratio"], rows), ""]
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--arrays", default="30,100,300,1000")
  parser.add_argument("--simulator-arrays", default="30,100,300")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--rules", default="", help="comma-separated rule names (default: every rule)")
  parser.add_argument("--strategies", default="asp,ormo,easgd,bsp,diloco")
  parser.add_argument("--gradients", type=int, default=8)
  parser.add_argument(
    "--give-up", type=float, default=120.0, help="seconds after which larger sizes are skipped"
  )
  parser.add_argument("--fresh", action="store_true")
  parser.add_argument("--report-only", action="store_true", help="rewrite the results file from the store")
  parser.add_argument("--results-dir", type=pathlib.Path, default=REPO / "benchmarks" / "results")
  args = parser.parse_args()
  args.arrays = [int(n) for n in args.arrays.split(",")]
  args.simulator_arrays = [int(n) for n in args.simulator_arrays.split(",")]
  args.rules = [r for r in args.rules.split(",") if r]
  args.strategies = args.strategies.split(",")
  version = harness.code_version()
  args.results_dir.mkdir(parents=True, exist_ok=True)
  store_path = args.results_dir / "compile_time_runs.jsonl"
  store = {} if args.fresh else load_store(store_path, version)
  print(f"# compile_time on {harness.machine()}, code version {version}")

  if args.report_only:
    args.repeats = max((len(r["seconds"]["measured"]) for r in store.values()), default=args.repeats)
    text = report(store, args, version)
    (args.results_dir / "compile_time.md").write_text(text)
    print(text)
    return
  table = rules()
  first_update_seconds(*baseline("warm-up", False), 2)  # the process's first compile sets XLA up: not counted
  for name in args.rules or table:
    make, extra = table[name]
    for how in ("own check", "grads_finite"):
      for n in args.arrays:
        timers = {
          "measured": lambda make=make, extra=extra, n=n, how=how: first_update_seconds(
            make, extra, n, how == "grads_finite"
          ),
          "baseline": lambda n=n, name=name: first_update_seconds(*baseline(name, False), n),
        }
        if how == "own check":
          timers["apply_if_finite"] = lambda n=n, name=name: first_update_seconds(*baseline(name, True), n)
        row = measure(store, store_path, version, ("rule", name, how, n), timers, args.repeats)
        if min(row["seconds"]["measured"]) > args.give_up:
          break
  for name in args.strategies:
    for n in args.simulator_arrays:
      timers = {
        "measured": lambda name=name, n=n: first_advance_seconds(name, n, args.gradients),
        "plain loop": lambda n=n: plain_loop_seconds(n, args.gradients),
      }
      row = measure(store, store_path, version, ("simulator", name, "first advance", n), timers, args.repeats)
      if min(row["seconds"]["measured"]) > args.give_up:
        break
  text = report(store, args, version)
  (args.results_dir / "compile_time.md").write_text(text)
  print(text)


if __name__ == "__main__":
  main()
