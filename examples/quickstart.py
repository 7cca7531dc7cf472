"""Asynchronous SGD with stragglers on real data: ASGD, naive ASGD momentum, SMEGA² and OrMo.

Eight workers with Gamma-distributed step times (two of them 4x slower) train
a small MLP on scikit-learn's bundled digits (1,797 8x8 images, nothing is
downloaded) through a parameter server. A short event loop in Python always
serves the earliest finisher, so slow workers push stale gradients; each
server rule is a jaxsync / optax transform applied per arrival. The same
arrival order (same seed) is used for every rule, so the table compares the
rules and nothing else.

Run: ``python examples/quickstart.py [--arrivals 4000] [--workers 8]``.
(The compiled simulator and the ``jaxsync train`` CLI come with later releases.)
"""

from __future__ import annotations

import argparse
import heapq
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import jaxsync


def load_data(seed: int):
  digits = load_digits()
  x = (digits.data / 16.0).astype(np.float32)
  y = digits.target.astype(np.int32)
  order = np.random.default_rng(seed).permutation(len(x))
  x, y = x[order], y[order]
  split = int(0.8 * len(x))
  return (x[:split], y[:split]), (x[split:], y[split:])


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


def loss_fn(params, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(logits_fn(params, x), y).mean()


@jax.jit
def accuracy(params, x, y):
  return jnp.mean(jnp.argmax(logits_fn(params, x), -1) == y)


def arrival_schedule(num_workers: int, arrivals: int, seed: int, slow_fraction=0.25, slowdown=4.0):
  """Who finishes next: Gamma(100, 1/100) step times, some workers slower (spec §0)."""
  rng = np.random.default_rng(seed)
  speed = np.ones(num_workers)
  speed[: int(round(slow_fraction * num_workers))] = slowdown
  clock = [(speed[k] * rng.gamma(100, 0.01), k) for k in range(num_workers)]
  heapq.heapify(clock)
  order = []
  for _ in range(arrivals):
    t, k = heapq.heappop(clock)
    order.append(k)
    heapq.heappush(clock, (t + speed[k] * rng.gamma(100, 0.01), k))
  return order


def run(name, tx, version_field, order, data, num_workers, batch, seed):
  (x_train, y_train), (x_test, y_test) = data
  params = init_mlp(jax.random.key(seed))
  state = tx.init(params)
  grad_fn = jax.jit(jax.grad(loss_fn))

  @jax.jit
  def server_step(params, state, grads, version):
    updates, state = tx.update(grads, state, params, version=version)
    return optax.apply_updates(params, updates), state

  rng = np.random.default_rng(seed + 1)
  held = [params] * num_workers  # what each worker computes its next gradient on
  versions = [0] * num_workers
  staleness = []
  start = time.perf_counter()
  for t, k in enumerate(order):
    idx = rng.integers(0, len(x_train), batch)
    g = grad_fn(held[k], x_train[idx], y_train[idx])
    params, state = server_step(params, state, g, jnp.int32(versions[k]))
    staleness.append(t - versions[k])
    held[k] = jaxsync.look_ahead(params, state)  # SMEGA² sends its look-ahead
    versions[k] = t + 1 if version_field is None else int(optax.tree.get(state, version_field))
  seconds = time.perf_counter() - start
  acc = float(accuracy(params, x_test, y_test))
  loss = float(loss_fn(params, x_train, y_train))
  return name, acc, loss, float(np.mean(staleness)), int(np.max(staleness)), seconds


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workers", type=int, default=8)
  parser.add_argument("--arrivals", type=int, default=4000)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--lr", type=float, default=0.05)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()

  data = load_data(args.seed)
  order = arrival_schedule(args.workers, args.arrivals, args.seed)
  k, lr = args.workers, args.lr
  rules = [
    ("ASGD (optax.sgd)", optax.sgd(lr), None),
    ("naive ASGDm (optax.sgd, m=0.9)", optax.sgd(lr, momentum=0.9), None),
    ("SMEGA2", jaxsync.smega2(lr, 0.9, num_workers=k), None),
    ("OrMo", jaxsync.ordered_momentum(lr, 0.9, num_workers=k), "count"),
    ("OrMo-DA", jaxsync.ordered_momentum(lr, 0.9, num_workers=k, delay_adaptive=True), "count"),
  ]
  print(
    f"digits: {len(data[0][0])} train / {len(data[1][0])} test images; {k} workers "
    f"({int(round(0.25 * k))} are 4x slower); {args.arrivals} arrivals of batch {args.batch}; lr {lr}"
  )
  print()
  print("| rule | test accuracy | train loss | mean staleness | max staleness | seconds |")
  print("|---|---:|---:|---:|---:|---:|")
  for name, tx, field in rules:
    row = run(name, tx, field, order, data, k, args.batch, args.seed)
    print("| {} | {:.3f} | {:.3f} | {:.1f} | {} | {:.1f} |".format(*row))


if __name__ == "__main__":
  main()
