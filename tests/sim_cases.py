"""A small softmax-regression problem and reference loops for the simulator tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxsync

NUM_FEATURES = 6
NUM_CLASSES = 3


def problem(num_workers, *, per_worker=48, batch_size=8, seed=0):
  """(loss_fn, params, data): a linearly separable-ish 3-class problem, sharded over workers."""
  rng = np.random.default_rng(seed)
  n = num_workers * per_worker
  x = rng.normal(size=(n, NUM_FEATURES)).astype(np.float32)
  true_w = rng.normal(size=(NUM_FEATURES, NUM_CLASSES)).astype(np.float32)
  y = np.argmax(x @ true_w + 0.3 * rng.normal(size=(n, NUM_CLASSES)), axis=1).astype(np.int32)
  data = jaxsync.sim.WorkerData({"x": x, "y": y}, num_workers=num_workers, batch_size=batch_size, seed=seed)
  params = {
    "w": jnp.asarray(0.1 * rng.normal(size=(NUM_FEATURES, NUM_CLASSES)), jnp.float32),
    "b": jnp.zeros([NUM_CLASSES], jnp.float32),
  }
  return loss_fn, params, data


def loss_fn(params, batch):
  logits = batch["x"] @ params["w"] + params["b"]
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


def accuracy_fn(data):
  x, y = data.arrays["x"], data.arrays["y"]

  def evaluate(params):
    logits = x @ params["w"] + params["b"]
    return {"accuracy": jnp.mean(jnp.argmax(logits, -1) == y), "loss": loss_fn(params, {"x": x, "y": y})}

  return evaluate


def simulate(name, num_workers, *, events, options=None, time=None, seed=0, problem_kw=None, **sim_kw):
  """Runs strategy ``name`` on :func:`problem`; returns (params, history, data)."""
  loss, params, data = problem(num_workers, **(problem_kw or {}))
  strategy = jaxsync.strategies.make(name, num_workers, **(options or {}))
  time_model = time or jaxsync.sim.TimeModel(num_workers=num_workers)
  final, history = jaxsync.sim.run(
    strategy, loss, params, data, time_model, num_events=events, seed=seed, **sim_kw
  )
  return final, history, data


@jax.jit
def _grad(params, batch):
  return jax.grad(loss_fn)(params, batch)


def sgd_reference(params, batches, optimizer):
  """Plain single-process optax on a list of batches, each step jitted."""
  state = optimizer.init(params)
  update = jax.jit(optimizer.update)
  for batch in batches:
    updates, state = update(_grad(params, batch), state, params)
    params = optax.apply_updates(params, updates)
  return params


def concatenated(data, workers, step):
  """The batches of ``workers`` at ``step``, concatenated (BSP's global batch)."""
  parts = [data.batch(k, step) for k in workers]
  return jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)
