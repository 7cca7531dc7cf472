"""A jaxsync rule as the optimizer of a flax nnx model, in an ordinary training loop.

A server rule such as ``jaxsync.ordered_momentum`` measures staleness against the
server version a gradient was computed on, which the simulator and the parameter
server pass as ``version=``. In a single process every gradient is fresh, and
``update`` without ``version`` treats it so; the rule then drops into
``nnx.Optimizer`` like any optax optimizer. Ordered momentum with all-fresh
gradients and ``num_workers=1`` is heavy-ball momentum, so ``--optimizer sgd``
(``optax.sgd(lr, momentum)``) prints the same numbers up to float rounding.

The model is a small MLP on scikit-learn's bundled digits (1,797 8x8 images,
nothing is downloaded).

Run: ``python examples/flax_nnx.py [--optimizer ormo|sgd|adaptive_k] [--steps 300]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from sklearn.datasets import load_digits

import jaxsync


def load_data(seed: int = 0):
  """Digits scaled to [0, 1], shuffled, split 80/20 into (x, y) train and test arrays."""
  digits = load_digits()
  order = np.random.default_rng(seed).permutation(len(digits.target))
  x = jnp.asarray(digits.data[order] / 16.0, jnp.float32)
  y = jnp.asarray(digits.target[order], jnp.int32)
  split = int(0.8 * len(y))
  return (x[:split], y[:split]), (x[split:], y[split:])


class MLP(nnx.Module):
  def __init__(self, rngs: nnx.Rngs, hidden: int = 64):
    self.hidden = nnx.Linear(64, hidden, rngs=rngs)
    self.out = nnx.Linear(hidden, 10, rngs=rngs)

  def __call__(self, x):
    return self.out(jax.nn.relu(self.hidden(x)))


def make_optimizer(name: str, learning_rate: float, momentum: float) -> optax.GradientTransformation:
  if name == "ormo":  # every gradient fresh, one worker: heavy-ball momentum
    return jaxsync.ordered_momentum(learning_rate, momentum, num_workers=1)
  if name == "sgd":
    return optax.sgd(learning_rate, momentum=momentum)
  if name == "adaptive_k":  # an adaptive batch: up to 4 batches averaged per step
    return optax.chain(
      jaxsync.adaptive_k(momentum=momentum, max_k=4), optax.scale_by_learning_rate(learning_rate)
    )
  raise ValueError(f"flax_nnx: optimizer={name!r} is invalid; expected 'ormo', 'sgd' or 'adaptive_k'.")


@nnx.jit
def train_step(model: MLP, optimizer: nnx.Optimizer, x, y):
  def loss_fn(model):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

  loss, grads = nnx.value_and_grad(loss_fn)(model)
  optimizer.update(model, grads)  # tx.update(grads, state, params): no version, a fresh gradient
  return loss


@nnx.jit
def accuracy(model: MLP, x, y):
  return jnp.mean(jnp.argmax(model(x), -1) == y)


def train(tx: optax.GradientTransformation, *, steps: int = 300, batch: int = 32, seed: int = 0):
  """Trains a fresh MLP with ``tx``; returns the model, its optimizer, the losses and the test accuracy."""
  (x_train, y_train), (x_test, y_test) = load_data(seed)
  model = MLP(nnx.Rngs(seed))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  losses = []
  for step in range(steps):
    start = (step * batch) % (len(y_train) - batch)
    losses.append(
      train_step(model, optimizer, x_train[start : start + batch], y_train[start : start + batch])
    )
  return model, optimizer, np.asarray(losses), float(accuracy(model, x_test, y_test))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--optimizer", default="ormo", choices=("ormo", "sgd", "adaptive_k"))
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--lr", type=float, default=0.05)
  parser.add_argument("--momentum", type=float, default=0.9)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()

  began = time.perf_counter()
  tx = make_optimizer(args.optimizer, args.lr, args.momentum)
  _, optimizer, losses, test_accuracy = train(tx, steps=args.steps, seed=args.seed)
  updates = jaxsync.server_version(optimizer.opt_state)
  print(f"optimizer: {args.optimizer} (learning rate {args.lr}, momentum {args.momentum})")
  if updates is not None:
    print(f"server version after {args.steps} steps: {int(updates[...])}")
  print(f"final training loss: {float(losses[-10:].mean()):.4f}")
  print(f"test accuracy: {test_accuracy:.4f}")
  print(f"seconds: {time.perf_counter() - began:.1f}")


if __name__ == "__main__":
  main()
