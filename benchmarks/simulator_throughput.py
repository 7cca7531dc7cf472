"""Simulator throughput: simulated worker-steps per second against a plain jitted SGD loop.

Every simulated worker-step computes exactly one gradient, so the floor of the
simulator's cost is the plain single-worker loop (``lax.scan`` over SGD steps
on the same model and batch size). This script measures, in one process and
interleaved round by round (these machines are noisy), the gradient throughput
of ``jaxsync.sim`` for ``asp``, ``bsp``, ``ormo`` and ``adaptive_k`` at
K = 4, 16, 64 against that loop, and prints per-round paired ratios as
median (IQR). It also prints how many parameter-sized arrays each simulation
state holds (memory should grow only by the K pulled copies).

Target (issue 3): every strategy at least 0.8x the plain loop.

    python benchmarks/simulator_throughput.py [--hidden 256] [--batch 32] [--steps 2048] [--rounds 5]
"""

from __future__ import annotations

import argparse
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxsync

STRATEGIES = ("asp", "bsp", "ormo", "adaptive_k")
WORKERS = (4, 16, 64)


def mlp(hidden: int, features: int = 64, classes: int = 10):
  """A two-hidden-layer MLP: (init params, loss_fn)."""
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  params = {
    "w1": jax.random.normal(k1, (features, hidden)) / np.sqrt(features),
    "b1": jnp.zeros(hidden),
    "w2": jax.random.normal(k2, (hidden, hidden)) / np.sqrt(hidden),
    "b2": jnp.zeros(hidden),
    "w3": jax.random.normal(k3, (hidden, classes)) / np.sqrt(hidden),
    "b3": jnp.zeros(classes),
  }

  def loss_fn(p, batch):
    h = jax.nn.relu(batch["x"] @ p["w1"] + p["b1"])
    h = jax.nn.relu(h @ p["w2"] + p["b2"])
    logits = h @ p["w3"] + p["b3"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

  return params, loss_fn


def synthetic(num_workers: int, batch: int, examples_per_worker: int):
  rng = np.random.default_rng(0)
  n = max(WORKERS) * examples_per_worker
  arrays = {"x": rng.normal(size=(n, 64)).astype(np.float32), "y": rng.integers(0, 10, n).astype(np.int32)}
  return jaxsync.sim.WorkerData(arrays, num_workers=num_workers, batch_size=batch)


def plain_loop(params, loss_fn, data, steps: int):
  """The floor: one worker, ``lax.scan`` over jitted SGD steps, same data lookup."""
  opt = optax.sgd(0.01)

  @jax.jit
  def run(p):
    def body(p, t):
      g = jax.grad(loss_fn)(p, data.batch(0, t))
      return optax.apply_updates(p, jax.tree.map(lambda x: -0.01 * x, g)), None

    return jax.lax.scan(body, p, jnp.arange(steps))[0]

  del opt
  return lambda: run(params)


def simulator(name: str, k: int, params, loss_fn, data, steps: int):
  sim = jaxsync.sim.Simulator(
    jaxsync.strategies.make(name, k, learning_rate=0.01), loss_fn, data, jaxsync.sim.TimeModel(num_workers=k)
  )
  events = steps // k if sim.strategy.engine == "sync" else steps
  worker_steps = events * k if sim.strategy.engine == "sync" else events

  def run():
    state = sim.init(params)
    return sim.advance(state, events)

  state = sim.init(params)
  copies = sum(x.size for x in jax.tree.leaves(state) if x.dtype == jnp.float32) / sum(
    x.size for x in jax.tree.leaves(params)
  )
  return run, worker_steps, copies


def timed(fn) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--hidden", type=int, default=256)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--steps", type=int, default=2048, help="worker-steps per timed call")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--workers", type=str, default=",".join(map(str, WORKERS)))
  parser.add_argument("--strategies", type=str, default=",".join(STRATEGIES))
  args = parser.parse_args()
  workers = [int(k) for k in args.workers.split(",")]
  names = args.strategies.split(",")

  params, loss_fn = mlp(args.hidden)
  num_params = sum(x.size for x in jax.tree.leaves(params))
  print(
    f"# simulator_throughput: MLP 64-{args.hidden}-{args.hidden}-10 ({num_params:,} float32 parameters), "
    f"batch {args.batch}, {args.steps} worker-steps per call, {args.rounds} interleaved rounds"
  )
  print(
    f"# machine: {platform.machine()}, {jax.device_count()} {jax.default_backend()} device(s), jax {jax.__version__}"
  )

  base = plain_loop(params, loss_fn, synthetic(1, args.batch, 512), args.steps)
  cases = {}
  for k in workers:
    data = synthetic(k, args.batch, 512)
    for name in names:
      cases[(name, k)] = simulator(name, k, params, loss_fn, data, args.steps)
  # Compile everything before timing.
  timed(base)
  for run, _, _ in cases.values():
    timed(run)

  ratios = {key: [] for key in cases}
  base_rates = []
  for _ in range(args.rounds):
    base_rate = args.steps / timed(base)
    base_rates.append(base_rate)
    for key, (run, worker_steps, _) in cases.items():
      ratios[key].append(worker_steps / timed(run) / base_rate)

  print(f"\nplain loop: {np.median(base_rates):,.0f} gradient steps/s (median of {args.rounds})\n")
  print(
    "| strategy | K | worker-steps/s | ratio to plain loop, median (IQR) | >= 0.8x | parameter-sized arrays in state |"
  )
  print("|---|---|---|---|---|---|")
  for (name, k), values in ratios.items():
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    rate = med * np.median(base_rates)
    copies = cases[(name, k)][2]
    ok = "yes" if med >= 0.8 else "no"
    print(f"| {name} | {k} | {rate:,.0f} | {med:.2f} ({q1:.2f}-{q3:.2f}) | {ok} | {copies:.1f} |")


if __name__ == "__main__":
  main()
