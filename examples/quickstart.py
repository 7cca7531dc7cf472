"""Stragglers and stale gradients on real data: nine strategies on the simulated cluster.

Eight workers (two of them 4x slower, Gamma step-time jitter) train a small MLP
on scikit-learn's bundled digits (1,797 8x8 images, nothing is downloaded)
through ``jaxsync.sim``: each run is one compiled loop over events, each
worker-step computes one gradient on the parameters that worker pulled. Every
strategy gets the same data shards, the same time model and the same number of
gradients, so the table compares synchronization and nothing else.

Run: ``python examples/quickstart.py [--gradients 4000] [--workers 8]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import jaxsync

STRATEGIES = (
  "asp",
  "naive_asgdm",
  "shifted_momentum",
  "smega2",
  "ormo",
  "ormo_da",
  "ssp",
  "adaptive_k",
  "bsp",
)


def load_data(seed: int):
  digits = load_digits()
  x = (digits.data / 16.0).astype(np.float32)
  y = digits.target.astype(np.int32)
  order = np.random.default_rng(seed).permutation(len(x))
  x, y = x[order], y[order]
  split = int(0.8 * len(x))
  return {"x": x[:split], "y": y[:split]}, {"x": x[split:], "y": y[split:]}


def init_mlp(key, sizes=(64, 128, 10)):
  params = {}
  for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
    key, sub = jax.random.split(key)
    params[f"w{i}"] = jax.random.normal(sub, (n_in, n_out)) * jnp.sqrt(2.0 / n_in)
    params[f"b{i}"] = jnp.zeros(n_out)
  return params


def logits_fn(params, x):
  h = jax.nn.relu(x @ params["w0"] + params["b0"])
  return h @ params["w1"] + params["b1"]


def loss_fn(params, batch):
  return optax.softmax_cross_entropy_with_integer_labels(logits_fn(params, batch["x"]), batch["y"]).mean()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workers", type=int, default=8)
  parser.add_argument("--gradients", type=int, default=4000, help="worker-steps per strategy")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--lr", type=float, default=0.05)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--strategies", default=",".join(STRATEGIES))
  args = parser.parse_args()

  train, test = load_data(args.seed)
  k = args.workers
  data = jaxsync.sim.WorkerData(train, num_workers=k, batch_size=args.batch, seed=args.seed)
  # A 10 ms worker-step on a 10 Gbit/s network; two workers in eight are 4x slower.
  time_model = jaxsync.sim.TimeModel(num_workers=k, compute_time=0.01, slow_fraction=0.25, slowdown=4.0)

  def evaluate(params):
    return {"accuracy": jnp.mean(jnp.argmax(logits_fn(params, test["x"]), -1) == test["y"])}

  print(
    f"digits: {len(train['y'])} train / {len(test['y'])} test images; {k} workers "
    f"({len(time_model.slow_workers)} are 4x slower); {args.gradients} gradients of batch {args.batch}; "
    f"lr {args.lr}"
  )
  print()
  print(
    "| strategy | test accuracy | train loss | updates | simulated s | mean staleness | max staleness | wall s |"
  )
  print("|---|---:|---:|---:|---:|---:|---:|---:|")
  params = init_mlp(jax.random.key(args.seed))
  full_batch = jax.tree.map(jnp.asarray, train)
  for name in args.strategies.split(","):
    strategy = jaxsync.strategies.make(name, k, learning_rate=args.lr)
    events = args.gradients // k if strategy.engine == "sync" else args.gradients
    start = time.perf_counter()
    final, history = jaxsync.sim.run(
      strategy, loss_fn, params, data, time_model, num_events=events, seed=args.seed
    )
    accuracy = float(evaluate(final)["accuracy"])
    wall = time.perf_counter() - start
    print(
      f"| {name} | {accuracy:.3f} | {float(loss_fn(final, full_batch)):.3f} | {history.updates} | "
      f"{history.simulated_time:.1f} | {history.mean_staleness():.1f} | {int(history.staleness.max())} | {wall:.1f} |"
    )


if __name__ == "__main__":
  main()
