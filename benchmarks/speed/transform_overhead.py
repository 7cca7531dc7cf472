"""Per-arrival cost of each jaxsync rule against optax SGD-momentum, on a 10M-parameter tree.

Every rule's jitted step (``tx.update`` + ``optax.apply_updates``, parameters
and state donated) runs interleaved with the others, round after round, so that
machine noise hits all of them alike. A sample is the mean of ``--steps``
consecutive steps. The ratio to ``optax.sgd(lr, momentum=0.9)`` is paired: each
round divides a rule's sample by the baseline's sample of the same round; the
table gives the median of those ratios and their interquartile range, the
median time, and the memory-bandwidth floor: the bytes the rule's equations
must read and write per arrival over the ``numpy.copyto`` bandwidth measured at
the start (single-threaded; XLA uses every core, so a rule can beat it).

Run: ``python -m benchmarks.speed.transform_overhead [--rounds 31] [--steps 4] [--params 10_000_000]``.
This is a benchmark, not a test: it prints what it measured and asserts nothing.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxsync

NUM_WORKERS = 16
LR = 0.01


def make_tree(num_params: int) -> dict:
  """A model-like tree: eight big matrices and four small ones, ``num_params`` floats."""
  big, small = int(num_params * 0.96) // 8, int(num_params * 0.04) // 4
  rows = 1000
  shapes = [(rows, big // rows)] * 8 + [(100, small // 100)] * 4
  keys = jax.random.split(jax.random.key(0), len(shapes))
  return {
    f"layer{i}": jax.random.normal(k, s, jnp.float32) * 0.01 for i, (k, s) in enumerate(zip(keys, shapes))
  }


def copy_bandwidth(nbytes: int, repeats: int = 20) -> float:
  """Bytes per second of ``numpy.copyto`` counting the read and the write."""
  src = np.ones(nbytes // 4, np.float32)
  dst = np.empty_like(src)
  np.copyto(dst, src)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    np.copyto(dst, src)
    times.append(time.perf_counter() - start)
  return 2 * nbytes / statistics.median(times)


# name, transform factory, extra args from state, arrays read+written per arrival
# (parameter-sized; the equations' minimum), and what it is.
def rules():
  fresh = lambda field: lambda state, params: {"version": optax.tree.get(state, field)}
  none = lambda state, params: {}
  return [
    ("optax.sgd(momentum=0.9)", lambda: optax.sgd(LR, momentum=0.9), none, 5, "baseline"),
    (
      "optax.apply_if_finite(sgd m)",
      lambda: optax.apply_if_finite(optax.sgd(LR, momentum=0.9), 10**9),
      none,
      5,
      "optax's own NaN guard",
    ),
    (
      "ordered_momentum",
      lambda: jaxsync.ordered_momentum(LR, 0.9, num_workers=NUM_WORKERS),
      fresh("count"),
      5,
      "server",
    ),
    (
      "ordered_momentum (DA)",
      lambda: jaxsync.ordered_momentum(LR, 0.9, num_workers=NUM_WORKERS, delay_adaptive=True),
      fresh("count"),
      5,
      "server",
    ),
    (
      "adaptive_k + lr",
      lambda: optax.chain(jaxsync.adaptive_k(max_k=NUM_WORKERS), optax.scale_by_learning_rate(LR)),
      fresh("count"),
      11,
      "server",
    ),
    ("smega2", lambda: jaxsync.smega2(LR, 0.9, num_workers=NUM_WORKERS), none, 7, "server"),
    (
      "scale_by_staleness + lr",
      lambda: optax.chain(jaxsync.scale_by_staleness(), optax.scale_by_learning_rate(LR)),
      fresh("count"),
      3,
      "server",
    ),
    ("easgd_center", lambda: jaxsync.easgd_center(0.9 / NUM_WORKERS), none, 3, "server"),
    (
      "ea_wild_center",
      lambda: jaxsync.ea_wild_center(0.9 / NUM_WORKERS),
      lambda state, params: {"center_read": params},
      4,
      "server",
    ),
    (
      "bb_step_size",
      lambda: optax.chain(jaxsync.bb_step_size(LR, smoothing=0.1), optax.scale(-1.0)),
      none,
      7,
      "worker",
    ),
    (
      "easgd_worker",
      lambda: jaxsync.easgd_worker(LR, moving_rate=0.9 / NUM_WORKERS),
      lambda state, params: {"center": params},
      4,
      "worker",
    ),
  ]


def bytes_accessed(step, *args) -> float | None:
  """The bytes XLA's cost analysis counts for one call of the compiled ``step`` (reads and writes of every
  fused loop): the passes over memory the compiler kept, measured in bytes, not inferred."""
  analysis = step.lower(*args).compile().cost_analysis()
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else {}
  value = (analysis or {}).get("bytes accessed")
  return None if value is None else float(value)


def make_step(tx, extra_fn):
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params, **extra_fn(state, params))
    return optax.apply_updates(params, updates), state

  return jax.jit(step, donate_argnums=(0, 1))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--params", type=int, default=10_000_000)
  parser.add_argument("--rounds", type=int, default=31)
  parser.add_argument("--steps", type=int, default=4, help="steps per timed sample")
  args = parser.parse_args()

  tree = make_tree(args.params)
  num_params = sum(x.size for x in jax.tree.leaves(tree))
  array_bytes = 4 * num_params
  bandwidth = copy_bandwidth(array_bytes)
  # Two different gradients, alternated, so adaptive-k's tests see real variance.
  grads = [jax.tree.map(lambda x, k=k: x * (1.0 + 0.5 * k) + 0.001 * k, tree) for k in range(2)]

  variants = []
  for name, factory, extra_fn, arrays, kind in rules():
    variants.append((name, factory, extra_fn, arrays, kind))
    if not name.startswith("optax"):
      # The same rule when the caller passes the finiteness flag (the runtimes
      # compute it on the worker): no scan of the gradient on the server.
      flagged = lambda state, params, f=extra_fn: {**f(state, params), "grads_finite": True}
      variants.append((name + " [grads_finite]", factory, flagged, arrays, kind))

  entries = []
  for name, factory, extra_fn, arrays, kind in variants:
    tx = factory()
    params = jax.tree.map(jnp.copy, tree)
    state = tx.init(params)
    step = make_step(tx, extra_fn)
    moved = bytes_accessed(step, params, state, grads[0])
    params, state = jax.block_until_ready(step(params, state, grads[0]))  # compile
    entries.append(
      {
        "name": name,
        "kind": kind,
        "arrays": arrays,
        "step": step,
        "carry": (params, state),
        "times": [],
        "bytes": moved,
      }
    )

  for r in range(args.rounds):
    for entry in entries:
      params, state = entry["carry"]
      start = time.perf_counter()
      for i in range(args.steps):
        params, state = entry["step"](params, state, grads[(r + i) % 2])
      params, state = jax.block_until_ready((params, state))
      entry["times"].append((time.perf_counter() - start) / args.steps)
      entry["carry"] = (params, state)

  print(
    f"# transform_overhead: {num_params:,} float32 parameters, {args.rounds} interleaved rounds of {args.steps} steps"
  )
  print(
    f"# jax {jax.__version__} ({jax.default_backend()}), optax {optax.__version__}, {platform.processor() or platform.machine()}"
  )
  print(
    f"# numpy.copyto bandwidth (read + write): {bandwidth / 1e9:.1f} GB/s; one array = {array_bytes / 1e6:.0f} MB"
  )
  base_times = entries[0]["times"]
  print()
  print(
    "| rule | side | median ms | vs optax sgd-m: median (IQR) | arrays r+w | floor ms | x floor "
    "| XLA bytes accessed, arrays | x optax's bytes |"
  )
  print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
  base_bytes = entries[0]["bytes"]
  for entry in entries:
    median = statistics.median(entry["times"])
    q1, ratio, q3 = statistics.quantiles([t / b for t, b in zip(entry["times"], base_times)], n=4)
    entry["ratio"] = ratio
    floor = entry["arrays"] * array_bytes / bandwidth
    moved = entry["bytes"]
    passes = "-" if moved is None else f"{moved / array_bytes:.2f}"
    vs_bytes = "-" if moved is None or not base_bytes else f"{moved / base_bytes:.2f}x"
    print(
      f"| {entry['name']} | {entry['kind']} | {median * 1e3:.1f} | {ratio:.2f}x ({q1:.2f}-{q3:.2f}) | "
      f"{entry['arrays']} | {floor * 1e3:.1f} | {median / floor:.1f}x | {passes} | {vs_bytes} |"
    )
  targets = {
    "ordered_momentum": 1.15,
    "ordered_momentum [grads_finite]": 1.15,
    "adaptive_k + lr": 2.0,
    "adaptive_k + lr [grads_finite]": 2.0,
  }
  print()
  for entry in entries:
    if entry["name"] in targets:
      ratio = entry["ratio"]
      verdict = "meets" if ratio <= targets[entry["name"]] else "MISSES"
      moved = (
        "" if entry["bytes"] is None or not base_bytes else f", {entry['bytes'] / base_bytes:.2f}x its bytes"
      )
      print(
        f"target {entry['name']}: <= {targets[entry['name']]}x optax; measured {ratio:.2f}x{moved} ({verdict})"
      )
  by_name = {e["name"]: e for e in entries}
  checked, flagged = by_name.get("ordered_momentum"), by_name.get("ordered_momentum [grads_finite]")
  if checked and flagged and checked["bytes"] and flagged["bytes"] and base_bytes:
    # The check must read every gradient value before anything is written in place (a rejected arrival
    # leaves the state unchanged): one more pass than the same update given the flag.
    print(
      f"OrMo's self-check in bytes: {checked['bytes'] / array_bytes:.2f} parameter-sized arrays per arrival "
      f"against {flagged['bytes'] / array_bytes:.2f} with grads_finite and {base_bytes / array_bytes:.2f} for "
      f"optax; its floor, the flagged update plus one read of the gradient, is "
      f"{(flagged['bytes'] + array_bytes) / base_bytes:.2f}x optax's bytes"
    )


if __name__ == "__main__":
  main()
