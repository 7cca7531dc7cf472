"""Per-worker shards: every epoch is a permutation of the shard, at any shard size."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jaxsync


def _epoch(data, worker, steps):
  indices = jax.jit(jax.vmap(data.indices, in_axes=(None, 0)))(jnp.int32(worker), jnp.arange(steps))
  return np.asarray(indices).reshape(-1)


def test_each_epoch_visits_every_example_of_the_shard_once():
  data = jaxsync.sim.WorkerData({"x": np.arange(96)}, num_workers=3, batch_size=4, seed=1)
  shard = set(np.asarray(data.shards[1]).tolist())
  first, second = _epoch(data, 1, 16)[:32], _epoch(data, 1, 16)[32:]
  assert sorted(first) == sorted(shard) == sorted(second)
  assert not np.array_equal(first, second)  # each epoch has its own order
  assert set(shard).isdisjoint(set(np.asarray(data.shards[0]).tolist()))


def test_large_shards_stay_permutations():
  # 100,000 examples per shard: a p + c must not overflow int32.
  data = jaxsync.sim.WorkerData({"x": np.zeros([200_000, 1], np.float32)}, num_workers=2, batch_size=1000)
  epoch = _epoch(data, 0, 100)
  assert len(np.unique(epoch)) == 100_000


def test_batches_are_a_pure_function_of_worker_and_step():
  data = jaxsync.sim.WorkerData({"x": np.arange(50.0)}, num_workers=2, batch_size=5, seed=3)
  again = jaxsync.sim.WorkerData({"x": np.arange(50.0)}, num_workers=2, batch_size=5, seed=3)
  np.testing.assert_array_equal(data.batch(1, 7)["x"], again.batch(1, 7)["x"])
  other = jaxsync.sim.WorkerData({"x": np.arange(50.0)}, num_workers=2, batch_size=5, seed=4)
  assert not np.array_equal(data.shards, other.shards)
