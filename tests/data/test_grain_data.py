"""grain per-worker pipelines: element t is exactly WorkerData.batch(worker, t); iterators resume exactly."""

from __future__ import annotations

import pickle

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsync
from jaxsync._src.data import grain_data


def _reference(data, workers, steps):
  """WorkerData.indices for each worker and step, ``[workers, steps, b]``, by the simulator's own code."""
  indices = jax.jit(jax.vmap(jax.vmap(data.indices, in_axes=(None, 0)), in_axes=(0, None)))
  return np.asarray(indices(jnp.asarray(workers, jnp.int32), jnp.asarray(steps, jnp.int32)))


def _steps(data, rng):
  """Steps over the first epochs (every boundary), around later boundaries, and at random up to the end."""
  b, s = data.batch_size, data.shard_size
  length = 2**31 // b
  first = np.arange(3 * s // b + 3)
  boundaries = np.asarray([e * s // b + d for e in (10, 63, 64, 65, 1000, 12_345) for d in (-1, 0, 1)])
  boundaries = boundaries[(boundaries >= 0) & (boundaries < length)]
  late = rng.integers(0, length, 40)
  return np.unique(np.concatenate([first, boundaries, late, [length - 2, length - 1]]))


@pytest.mark.parametrize(
  "n, k, b",
  [
    (96, 3, 4),  # S = 32, b divides S
    (103, 3, 7),  # S = 34: batches straddle epoch boundaries
    (50, 5, 10),  # S = b: every step is a new epoch
    (40, 4, 1),  # b = 1
    (7, 7, 1),  # S = 1
    (1001, 2, 33),  # S = 500, many units
    (200_000, 2, 999),  # S = 100,000: a is capped so that a p + c fits in int32
  ],
)
def test_elements_are_the_worker_data_batches(n, k, b):
  data = jaxsync.sim.WorkerData({"i": np.arange(n)}, num_workers=k, batch_size=b, seed=n)
  workers = sorted({0, k // 2, k - 1})
  steps = _steps(data, np.random.default_rng(n))
  expected = _reference(data, workers, steps)
  for worker, worker_expected in zip(workers, expected, strict=True):
    ds = jaxsync.datasets.worker_dataset(data, worker)
    assert len(ds) == 2**31 // b
    got = np.stack([ds[int(t)]["i"] for t in steps])
    np.testing.assert_array_equal(got, worker_expected)
    source = grain_data._WorkerBatches(data, worker)  # the NumPy port of WorkerData.indices
    np.testing.assert_array_equal(np.stack([source.indices(t) for t in steps[::5]]), worker_expected[::5])


def test_each_epoch_of_the_dataset_is_a_permutation_of_the_shard():
  data = jaxsync.sim.WorkerData({"i": np.arange(90)}, num_workers=3, batch_size=5, seed=2)
  ds = jaxsync.datasets.worker_dataset(data, 1)
  stream = np.concatenate([ds[t]["i"] for t in range(12)])  # two epochs of S = 30
  shard = sorted(np.asarray(data.shards[1]).tolist())
  assert sorted(stream[:30].tolist()) == shard == sorted(stream[30:].tolist())
  assert not np.array_equal(stream[:30], stream[30:])


def test_pytree_elements_match_batch_in_values_dtypes_and_structure():
  rng = np.random.default_rng(0)
  arrays = {
    "image": rng.normal(size=[60, 3, 2]).astype(np.float32),
    "label": rng.integers(0, 10, 60).astype(np.int32),
    "extra": (np.arange(60.0).astype(np.float16), np.arange(60, dtype=np.uint8)),
  }
  data = jaxsync.sim.WorkerData(arrays, num_workers=2, batch_size=8, seed=7)
  ds = jaxsync.datasets.worker_dataset(data, 1)
  for t in (0, 3, 4, 100):
    got, expected = ds[t], data.batch(1, t)
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
      assert isinstance(g, np.ndarray)
      assert g.dtype == e.dtype and g.shape == e.shape
      np.testing.assert_array_equal(g, np.asarray(e))


def test_dataset_composes_with_grain_transformations_and_pickles():
  data = jaxsync.sim.WorkerData({"i": np.arange(40)}, num_workers=2, batch_size=3, seed=1)
  ds = jaxsync.datasets.worker_dataset(data, 0)
  doubled = ds.map(lambda e: e["i"] * 2)
  np.testing.assert_array_equal(doubled[9], 2 * np.asarray(data.batch(0, 9)["i"]))
  copy = pickle.loads(pickle.dumps(ds))
  for t in (0, 6, 7, 500):
    np.testing.assert_array_equal(copy[t]["i"], ds[t]["i"])


def _next_steps(iterator, count):
  return [next(iterator)["i"] for _ in range(count)]


@pytest.mark.parametrize(
  "read_options", [None, grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)], ids=["sync", "threads"]
)
def test_iterator_starts_at_start_step_and_resumes_from_its_state(read_options):
  data = jaxsync.sim.WorkerData({"i": np.arange(60)}, num_workers=2, batch_size=4, seed=9)  # S = 30
  ds = jaxsync.datasets.worker_dataset(data, 1)
  it = jaxsync.datasets.worker_iterator(data, 1, start_step=5, read_options=read_options)
  assert isinstance(it, grain.DatasetIterator)
  assert it.get_state() == {"next_index": 5}
  for t, batch in enumerate(_next_steps(it, 6), start=5):  # crosses the epoch boundary at step 7
    np.testing.assert_array_equal(batch, ds[t]["i"])
  state = it.get_state()
  assert state == {"next_index": 11}
  ahead = _next_steps(it, 10)

  # A fresh iterator, another start_step, or the same iterator rewound: each continues identically.
  for restored in (
    jaxsync.datasets.worker_iterator(data, 1, read_options=read_options),
    jaxsync.datasets.worker_iterator(data, 1, start_step=40, read_options=read_options),
    it,
  ):
    restored.set_state(state)
    for a, b in zip(_next_steps(restored, 10), ahead, strict=True):
      np.testing.assert_array_equal(a, b)
    assert restored.get_state() == {"next_index": 21}


def test_iterator_state_survives_a_pickled_checkpoint():
  data = jaxsync.sim.WorkerData({"i": np.arange(30)}, num_workers=3, batch_size=2, seed=4)
  it = jaxsync.datasets.worker_iterator(data, 2)
  _next_steps(it, 13)
  state = pickle.loads(pickle.dumps(it.get_state()))
  expected = next(it)["i"]
  restored = jaxsync.datasets.worker_iterator(data, 2)
  restored.set_state(state)
  np.testing.assert_array_equal(next(restored)["i"], expected)
  np.testing.assert_array_equal(expected, np.asarray(data.batch(2, 13)["i"]))


@pytest.mark.parametrize("worker", [-1, 3, 1.0, True, "0", None])
@pytest.mark.parametrize("make", [jaxsync.datasets.worker_dataset, jaxsync.datasets.worker_iterator])
def test_invalid_worker_is_named(make, worker):
  data = jaxsync.sim.WorkerData({"i": np.arange(30)}, num_workers=3, batch_size=2)
  with pytest.raises(ValueError, match=rf"{make.__name__}: worker={worker!r} is invalid; .*\[0, 3\)"):
    make(data, worker)


def test_numpy_integer_worker_is_accepted():
  data = jaxsync.sim.WorkerData({"i": np.arange(30)}, num_workers=3, batch_size=2)
  ds = jaxsync.datasets.worker_dataset(data, np.int64(2))
  np.testing.assert_array_equal(ds[4]["i"], np.asarray(data.batch(2, 4)["i"]))


def test_invalid_data_and_start_step_are_named():
  data = jaxsync.sim.WorkerData({"i": np.arange(30)}, num_workers=3, batch_size=2)
  with pytest.raises(
    ValueError, match=r"worker_dataset: data=.* is invalid; expected a jaxsync.sim.WorkerData"
  ):
    jaxsync.datasets.worker_dataset({"i": np.arange(30)}, 0)
  with pytest.raises(ValueError, match=r"worker_iterator: start_step=-1 is invalid"):
    jaxsync.datasets.worker_iterator(data, 0, start_step=-1)
  with pytest.raises(ValueError, match=r"worker_iterator: start_step=1073741825 is invalid"):
    jaxsync.datasets.worker_iterator(data, 0, start_step=2**30 + 1)
  end = jaxsync.datasets.worker_iterator(data, 0, start_step=2**30)
  with pytest.raises(StopIteration):
    next(end)
