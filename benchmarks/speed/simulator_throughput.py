"""Simulator throughput: the asynchronous engine against the synchronous one and a plain jitted SGD loop.

Every simulated worker-step computes exactly one gradient. A synchronous round
computes its K gradients as one batched computation on shared weights (one
large matrix product per layer); the asynchronous engine computes the
gradients of in-flight workers ``B`` at a time (``Simulator(gradient_batch=B)``,
``B = 1``: one per arrival), each on the weights its worker pulled. This script
measures, in one process and interleaved round by round (these machines are
noisy), worker-steps per second of ``bsp`` and of asynchronous strategies at
``B = 1``, ``4`` and ``K``, as paired ratios to the plain single-worker loop
(``lax.scan`` over SGD steps, same model, batch and data lookup) and to BSP at
the same K. It then measures where the time goes: the cost per gradient of the
three ways to compute a gradient (one at a time, ``B`` at a time on per-worker
weights, ``K`` at a time on shared weights) in a bare ``lax.scan``, with no
simulator around them.

Targets (issue "an asynchronous simulator as fast as the synchronous one"):
every asynchronous strategy >= 0.9x BSP at K = 16 and 64, >= 0.8x at K = 4,
with its best ``B``.

    python -m benchmarks.speed.simulator_throughput [--model mlp|lenet] [--hidden 256] [--batch 32]
        [--steps 2048] [--rounds 5] [--workers 4,16,64] [--strategies asp,bsp,ormo,adaptive_k]
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
  """A two-hidden-layer MLP on 64 features: (init params, loss_fn, input shape)."""
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

  return params, loss_fn, (features,)


def lenet():
  """jaxsync's LeNet for 28x28 grey images (Fashion-MNIST's shape): (init params, loss_fn, input shape)."""
  model = jaxsync.models.make("lenet", input_shape=(28, 28, 1), num_classes=10)

  def loss_fn(p, batch):
    logits = model.apply(p, batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

  return model.params, loss_fn, (28, 28, 1)


def synthetic(num_workers: int, batch: int, shape: tuple[int, ...], examples_per_worker: int = 512):
  rng = np.random.default_rng(0)
  n = num_workers * examples_per_worker
  arrays = {
    "x": rng.normal(size=(n, *shape)).astype(np.float32),
    "y": rng.integers(0, 10, n).astype(np.int32),
  }
  return jaxsync.sim.WorkerData(arrays, num_workers=num_workers, batch_size=batch)


def plain_loop(params, loss_fn, data, steps: int):
  """The single-worker floor: ``lax.scan`` over jitted SGD steps, same data lookup."""

  @jax.jit
  def run(p):
    def body(p, t):
      g = jax.grad(loss_fn)(p, data.batch(0, t))
      return jax.tree.map(lambda x, y: x - 0.01 * y, p, g), None

    return jax.lax.scan(body, p, jnp.arange(steps))[0]

  return lambda: run(params)


def simulator(name: str, k: int, gradient_batch: int, params, loss_fn, data, steps: int):
  sim = jaxsync.sim.Simulator(
    jaxsync.strategies.make(name, k, learning_rate=0.01),
    loss_fn,
    data,
    jaxsync.sim.TimeModel(num_workers=k),
    gradient_batch=gradient_batch,
  )
  sync = sim.strategy.engine == "sync"
  events = steps // k if sync else steps
  worker_steps = events * k if sync else events

  def run():
    return sim.advance(sim.init(params), events)

  state = sim.init(params)
  copies = sum(x.size for x in jax.tree.leaves(state) if x.dtype == jnp.float32) / sum(
    x.size for x in jax.tree.leaves(params)
  )
  return run, worker_steps, copies


def gradient_floors(params, loss_fn, data, k: int, batch_sizes: list[int], steps: int):
  """Seconds per gradient of bare gradient loops (no simulator): one at a time, B on own weights, K on shared."""

  def scan_of(body, carry, iters):
    fn = jax.jit(lambda c: jax.lax.scan(body, c, jnp.arange(iters))[0])
    return lambda: fn(carry)

  def single(p, t):
    g = jax.grad(loss_fn)(p, data.batch(t % k, t // k))
    return jax.tree.map(lambda x, y: x - 1e-3 * y, p, g), None

  loops = {"one at a time": (scan_of(single, params, steps), steps)}
  for b in batch_sizes:
    stack = jax.tree.map(lambda x, b=b: jnp.broadcast_to(x, (b, *x.shape)) + 0, params)

    def per_worker(c, t, b=b):
      batches = jax.vmap(data.batch)(jnp.arange(b) % k, jnp.full([b], t))
      g = jax.vmap(jax.grad(loss_fn))(c, batches)
      return jax.tree.map(lambda x, y: x - 1e-3 * y, c, g), None

    loops[f"B={b}, per-worker weights (vmap)"] = (scan_of(per_worker, stack, steps // b), (steps // b) * b)

  def shared(p, t):
    batches = jax.vmap(data.batch)(jnp.arange(k), jnp.full([k], t))
    g = jax.grad(lambda p: jnp.mean(jax.vmap(loss_fn, in_axes=(None, 0))(p, batches)))(p)
    return jax.tree.map(lambda x, y: x - 1e-3 * y, p, g), None

  loops[f"K={k}, shared weights (a BSP round)"] = (scan_of(shared, params, steps // k), (steps // k) * k)
  return loops


def timed(fn) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def target(k: int) -> float:
  return 0.9 if k >= 16 else 0.8


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", choices=("mlp", "lenet"), default="mlp")
  parser.add_argument("--hidden", type=int, default=256, help="the MLP's width")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--steps", type=int, default=2048, help="worker-steps per timed call")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--workers", type=str, default=",".join(map(str, WORKERS)))
  parser.add_argument("--strategies", type=str, default=",".join(STRATEGIES))
  parser.add_argument(
    "--gradient-batches",
    type=str,
    default="1,4,K",
    help="the asynchronous engine's B values (K: every worker)",
  )
  args = parser.parse_args()
  workers = [int(k) for k in args.workers.split(",")]
  names = args.strategies.split(",")

  params, loss_fn, shape = mlp(args.hidden) if args.model == "mlp" else lenet()
  num_params = sum(x.size for x in jax.tree.leaves(params))
  what = f"MLP 64-{args.hidden}-{args.hidden}-10" if args.model == "mlp" else "LeNet on 28x28x1"
  print(
    f"# simulator_throughput: {what} ({num_params:,} float32 parameters), batch {args.batch}, "
    f"{args.steps} worker-steps per call, {args.rounds} interleaved rounds"
  )
  print(
    f"# machine: {platform.machine()}, {jax.device_count()} {jax.default_backend()} device(s), jax {jax.__version__}"
  )

  base = plain_loop(params, loss_fn, synthetic(1, args.batch, shape), args.steps)
  cases = {}
  for k in workers:
    data = synthetic(k, args.batch, shape)
    batches = sorted({k if b == "K" else min(int(b), k) for b in args.gradient_batches.split(",")})
    for name in names:
      sync = jaxsync.strategies.make(name, k).engine == "sync"
      for b in [1] if sync else batches:
        cases[(name, k, b)] = simulator(name, k, b, params, loss_fn, data, args.steps)
  timed(base)
  for run, _, _ in cases.values():
    timed(run)

  rates = {key: [] for key in cases}
  base_rates = []
  for _ in range(args.rounds):
    base_rates.append(args.steps / timed(base))
    for key, (run, worker_steps, _) in cases.items():
      rates[key].append(worker_steps / timed(run))

  plain = np.median(base_rates)
  print(f"\nplain loop: {plain:,.0f} gradient steps/s (median of {args.rounds})\n")
  print(
    "| strategy | K | B | worker-steps/s | x plain loop, median (IQR) | x bsp at K, median (IQR) "
    "| target | meets | parameter-sized arrays in state |"
  )
  print("|---|---|---|---|---|---|---|---|---|")
  best: dict[tuple[str, int], tuple[float, int]] = {}
  for (name, k, b), values in rates.items():
    values = np.asarray(values)
    q1, med, q3 = np.percentile(values / np.asarray(base_rates), [25, 50, 75])
    copies = cases[(name, k, b)][2]
    if name == "bsp" or ("bsp", k, 1) not in rates:
      vs_bsp, verdict, goal = "", "", ""
    else:
      r1, rm, r3 = np.percentile(values / np.asarray(rates[("bsp", k, 1)]), [25, 50, 75])
      vs_bsp, goal = f"{rm:.2f} ({r1:.2f}-{r3:.2f})", f">= {target(k)}x bsp"
      verdict = "yes" if rm >= target(k) else "no"
      if rm > best.get((name, k), (-1.0, 0))[0]:
        best[(name, k)] = (rm, b)
    print(
      f"| {name} | {k} | {'-' if name == 'bsp' else b} | {np.median(values):,.0f} | {med:.2f} ({q1:.2f}-{q3:.2f}) "
      f"| {vs_bsp} | {goal} | {verdict} | {copies:.1f} |"
    )
  print()
  for (name, k), (ratio, b) in best.items():
    print(
      f"best B: {name} K={k}: B={b}, {ratio:.2f}x bsp (target {target(k)}x: {'met' if ratio >= target(k) else 'missed'})"
    )

  # Where the time goes: bare gradient loops, no simulator.
  k = max(workers)
  floor_batches = sorted({min(4, k), k})
  loops = gradient_floors(params, loss_fn, synthetic(k, args.batch, shape), k, floor_batches, args.steps)
  for fn, _ in loops.values():
    timed(fn)
  per_gradient = {name: [] for name in loops}
  for _ in range(args.rounds):
    for name, (fn, count) in loops.items():
      per_gradient[name].append(timed(fn) / count)
  print(f"\nwhere the time goes: one gradient and its SGD step in a bare lax.scan, K={k}, microseconds\n")
  print("| how the gradients are computed | us per gradient, median | x one at a time |")
  print("|---|---:|---:|")
  single = np.median(per_gradient["one at a time"])
  for name, values in per_gradient.items():
    print(f"| {name} | {np.median(values) * 1e6:,.0f} | {np.median(values) / single:.2f} |")


if __name__ == "__main__":
  main()
