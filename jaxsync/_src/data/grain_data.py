"""grain pipelines that read one worker's :class:`WorkerData` batches on the host, as NumPy arrays.

A multi-process runtime gives each worker process its own input pipeline. These
pipelines yield exactly the batches the in-process simulator fetches with
``WorkerData.batch(worker, step)``, so a run in either runtime sees the same data
in the same order, and a restored iterator continues with the batch it would have
read next.

The epoch orders are reproduced in NumPy: the multiplier ``a`` and offset ``c`` of
each epoch are drawn by the same ``jax.random`` calls as :meth:`WorkerData.indices`
(64 epochs per call, on the CPU, cached), and the affine positions are computed in
int64, which equals the int32 arithmetic of :meth:`WorkerData.indices` because
``a r + c < (a + 1) S < 2^31`` by the choice of ``a``.
"""

from __future__ import annotations

import collections
import numbers
import threading
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsync._src.core import validation
from jaxsync._src.data.worker_data import WorkerData

if TYPE_CHECKING:  # grain is imported on first use: it adds ~0.3 s to ``import jaxsync``.
  import grain

_EPOCH_BLOCK = 64  # epochs whose (a, c) one JAX call draws
_CACHED_BLOCKS = 16


@jax.jit
def _epoch_draws(key, worker, epochs, num_units, shard_size):
  """The draws of :meth:`WorkerData.indices` for each of ``epochs``: unit index ``j`` (``a = units[j]``), ``c``.

  Sizes are traced (``randint`` treats a Python bound and an array bound alike), so
  one compilation serves every shard size.
  """
  worker_key = jax.random.fold_in(key, worker)

  def draw(e):
    ka, kc = jax.random.split(jax.random.fold_in(worker_key, e))
    # int32 draws: under jax_enable_x64 the default int64 would draw another order for the same seed.
    return (
      jax.random.randint(ka, [], 0, num_units, dtype=jnp.int32),
      jax.random.randint(kc, [], 0, shard_size, dtype=jnp.int32),
    )

  return jax.vmap(draw)(epochs)


class _WorkerBatches:
  """A grain random-access source: element ``t`` is ``data.batch(worker, t)`` as NumPy arrays.

  Holds only the worker's shard of the arrays. Picklable (grain's multiprocessing
  sends sources to child processes); safe to read from grain's prefetch threads.
  """

  def __init__(self, data: WorkerData, worker: int):
    shard = np.asarray(data.shards[worker])
    self.worker = worker
    self.batch_size = data.batch_size
    self.shard_size = data.shard_size
    self.shard = shard
    self.arrays = jax.tree.map(lambda x: np.asarray(x)[shard], data.arrays)
    self._seed = data.seed
    self._units = np.asarray(data._units, np.int64)
    self._reset_cache()

  def _reset_cache(self) -> None:
    self._lock = threading.Lock()
    self._cache: collections.OrderedDict[int, tuple[np.ndarray, np.ndarray]] = collections.OrderedDict()

  def __getstate__(self) -> dict[str, Any]:
    state = dict(self.__dict__)
    del state["_lock"], state["_cache"]
    return state

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__dict__.update(state)
    self._reset_cache()

  def __len__(self) -> int:
    # Every step whose positions t b + i fit in int32, the range WorkerData.batch is defined on.
    return 2**31 // self.batch_size

  def __getitem__(self, step: int) -> Any:
    offsets = self.offsets(step)
    return jax.tree.map(lambda x: x[offsets], self.arrays)

  def __repr__(self) -> str:
    return f"WorkerBatches(worker={self.worker}, batch_size={self.batch_size}, shard_size={self.shard_size})"

  def indices(self, step: int) -> np.ndarray:
    """The example indices of the batch at ``step``, as :meth:`WorkerData.indices` (int32, ``[b]``)."""
    return self.shard[self.offsets(step)]

  def offsets(self, step: int) -> np.ndarray:
    """Positions in the shard of the batch at ``step``: ``(a_e r + c_e) mod S``."""
    s = self.shard_size
    position = int(step) * self.batch_size + np.arange(self.batch_size, dtype=np.int64)
    epoch, r = np.divmod(position, s)
    a, c = self._orders(epoch)
    return (a * r + c) % s  # exact in int64 and, by the choice of a, in int32

  def _orders(self, epochs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-element ``(a, c)`` of the epochs ``epochs``, int64."""
    blocks, within = np.divmod(epochs, _EPOCH_BLOCK)
    a = np.empty_like(epochs)
    c = np.empty_like(epochs)
    for block in np.unique(blocks):  # a batch spans at most two epochs
      block_a, block_c = self._block(int(block))
      here = blocks == block
      a[here] = block_a[within[here]]
      c[here] = block_c[within[here]]
    return a, c

  def _block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
    with self._lock:
      orders = self._cache.get(block)
      if orders is None:
        epochs = (block * _EPOCH_BLOCK + np.arange(_EPOCH_BLOCK, dtype=np.int64)).astype(np.int32)
        with jax.default_device(jax.devices("cpu")[0]):
          j, c = _epoch_draws(
            jax.random.key(self._seed),
            np.int32(self.worker),
            epochs,
            np.int32(len(self._units)),
            np.int32(self.shard_size),
          )
        orders = (self._units[np.asarray(j)], np.asarray(c, np.int64))
        self._cache[block] = orders
        if len(self._cache) > _CACHED_BLOCKS:
          self._cache.popitem(last=False)
      else:
        self._cache.move_to_end(block)
      return orders


def _check_worker(what: str, data: Any, worker: Any) -> int:
  if not isinstance(data, WorkerData):
    raise validation.invalid(what, "data", f"<{type(data).__name__}>", "a jaxsync.sim.WorkerData")
  k = data.num_workers
  if not isinstance(worker, numbers.Integral) or isinstance(worker, bool) or not 0 <= int(worker) < k:
    raise validation.invalid(
      what, "worker", worker, f"an integer in [0, {k}) (0 <= worker < num_workers={k})"
    )
  return int(worker)


def worker_dataset(data: WorkerData, worker: int) -> grain.MapDataset:
  r"""One worker's batches as a grain ``MapDataset``: element ``t`` is ``data.batch(worker, t)``.

  .. math::

    \text{ds}[t] = \text{data.batch}(k, t)
    = \text{arrays}\big[\text{shard}_k[(a_{k,e}\, p + c_{k,e}) \bmod S]\big], \quad
    p = t b + i, \; e = \lfloor p / S \rfloor

  as NumPy arrays (the pytree of ``data.arrays``, each leaf with leading
  dimension ``b``), bit-identical to :meth:`WorkerData.batch`. The dataset
  holds only worker ``k``'s shard of the arrays and reads on the host.

  The stream is unbounded in epochs; its length is ``2**31 // b``, every step
  whose positions ``t b + i`` fit in int32 (the range on which
  :meth:`WorkerData.batch` is defined; over 16 million steps at ``b = 128``).
  As for any grain ``MapDataset``, an index past the length wraps modulo it.

  Args:
    data: the :class:`jaxsync.sim.WorkerData` the simulator uses.
    worker: ``k``, with ``0 <= k < K``.

  Returns:
    A ``grain.MapDataset``; chain grain transformations on it, or call
    ``.to_iter_dataset()`` (see :func:`worker_iterator`).

  Example:
    >>> import numpy as np, jaxsync
    >>> data = jaxsync.sim.WorkerData({"x": np.arange(8.0)}, num_workers=2, batch_size=2)
    >>> ds = jaxsync.datasets.worker_dataset(data, worker=1)
    >>> ds[5]["x"].shape
    (2,)
    >>> bool(np.array_equal(ds[5]["x"], data.batch(1, 5)["x"]))
    True
  """
  import grain

  worker = _check_worker("worker_dataset", data, worker)
  return grain.MapDataset.source(_WorkerBatches(data, worker))


def worker_iterator(
  data: WorkerData,
  worker: int,
  start_step: int = 0,
  *,
  read_options: grain.ReadOptions | None = None,
) -> grain.DatasetIterator:
  """A grain iterator over one worker's batches, positioned at ``start_step``.

  The ``n``-th ``next`` returns ``data.batch(worker, start_step + n)`` as NumPy
  arrays (see :func:`worker_dataset`). ``get_state()`` is
  ``{"next_index": step}``, the worker's next step (absolute, whatever
  ``start_step`` was); ``set_state`` of it on any iterator of the same worker
  continues with the identical next batch, so the state can be checkpointed with
  the model.

  Args:
    data: the :class:`jaxsync.sim.WorkerData` the simulator uses.
    worker: ``k``, with ``0 <= k < K``.
    start_step: the first step to read, ``0 <= start_step <= 2**31 // b``.
    read_options: grain's ``ReadOptions`` for the iterator. ``None`` reads
      synchronously (``num_threads=0``), grain's advice for data in memory;
      pass e.g. ``grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)`` to
      prefetch in threads.

  Returns:
    A ``grain.DatasetIterator``.

  Example:
    >>> import numpy as np, jaxsync
    >>> data = jaxsync.sim.WorkerData({"x": np.arange(8.0)}, num_workers=2, batch_size=2)
    >>> it = jaxsync.datasets.worker_iterator(data, worker=0, start_step=3)
    >>> bool(np.array_equal(next(it)["x"], data.batch(0, 3)["x"]))
    True
    >>> state = it.get_state()
    >>> state
    {'next_index': 4}
    >>> again = jaxsync.datasets.worker_iterator(data, worker=0)
    >>> again.set_state(state)
    >>> bool(np.array_equal(next(again)["x"], next(it)["x"]))
    True
  """
  import grain

  worker = _check_worker("worker_iterator", data, worker)
  ds = worker_dataset(data, worker)
  start_step = validation.check_int("worker_iterator", "start_step", start_step, low=0)
  if start_step > len(ds):
    raise validation.invalid(
      "worker_iterator", "start_step", start_step, f"an integer in [0, {len(ds)}] (2**31 // batch_size)"
    )
  if read_options is None:
    read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
  iterator = ds.to_iter_dataset(read_options).__iter__()
  iterator.set_state({"next_index": start_step})
  return iterator
