"""In-memory training data split into per-worker shards, with a pure batch lookup."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsync._src.core import validation

_WHAT = "WorkerData"


@jax.tree_util.register_pytree_node_class
class WorkerData:
  r"""Training arrays sharded over ``K`` workers; ``batch(worker, step)`` is pure and jittable.

  The ``N`` examples are permuted once (by ``seed``) and cut into ``K``
  contiguous shards of ``S = N // K`` examples (the remainder is dropped, as a
  distributed sampler does). Worker ``k`` walks its shard in epochs, each epoch
  in its own order, an affine bijection of the positions drawn from
  ``(seed, k, e)``:

  .. math::

    \text{batch}(k, t)_i = \text{shard}_k\big[(a_{k,e}\, p + c_{k,e}) \bmod S\big], \quad
    p = t b + i, \; e = \lfloor p / S \rfloor

  with ``a`` a random unit modulo ``S`` (coprime to it, so each epoch visits
  every example once; at most ``2^31 / S`` so that ``a p`` is exact in int32)
  and ``c`` a random offset. Over an already shuffled
  shard this reorders each epoch at ``O(b)`` cost, where a full permutation
  would sort ``S`` keys per batch. A batch is a function of the worker and its
  step count only: the simulator fetches it inside a compiled loop, and a
  resumed run sees the same batches.

  Args:
    arrays: a pytree of arrays with a common leading dimension ``N`` (e.g.
      ``{"image": x, "label": y}``).
    num_workers: ``K >= 1``.
    batch_size: ``b``, examples per worker-step, at most ``S``.
    seed: the shuffling seed.
    rng: each batch also holds ``"_rng"``: ``[b]`` uint32, one number per
      worker and step (the same in every example of the batch) drawn from
      ``(seed, worker, step)``, from which a model with dropout draws its
      random numbers (``jaxsync.models.classification_loss``). Each worker's
      streams are its own, and a resumed run draws the same ones.

  Example:
    >>> import numpy as np, jaxsync
    >>> data = jaxsync.sim.WorkerData({"x": np.arange(8.0)}, num_workers=2, batch_size=2)
    >>> data.batch(0, 0)["x"].shape
    (2,)
  """

  def __init__(self, arrays: Any, *, num_workers: int, batch_size: int, seed: int = 0, rng: bool = False):
    num_workers = validation.check_int(_WHAT, "num_workers", num_workers)
    batch_size = validation.check_int(_WHAT, "batch_size", batch_size)
    seed = validation.check_int(_WHAT, "seed", seed, low=0)
    leaves = jax.tree.leaves(arrays)
    if not leaves:
      raise validation.invalid(_WHAT, "arrays", arrays, "a non-empty pytree of arrays")
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in leaves}
    if len(sizes) != 1 or None in sizes:
      raise validation.invalid(
        _WHAT, "arrays", f"<leading sizes {sorted(map(str, sizes))}>", "one common leading size N"
      )
    (n,) = sizes
    shard = n // num_workers
    if shard < batch_size:
      raise validation.invalid(
        _WHAT,
        "batch_size",
        batch_size,
        f"at most the shard size N // K = {n} // {num_workers} = {shard}",
      )
    order = np.random.default_rng(seed).permutation(n)[: shard * num_workers]
    self.arrays = jax.tree.map(jnp.asarray, arrays)
    self.num_workers = num_workers
    self.batch_size = batch_size
    self.shard_size = shard
    self.num_examples = n
    self.seed = seed
    if not isinstance(rng, bool):
      raise validation.invalid(_WHAT, "rng", rng, "True or False")
    self.rng = rng
    self.shards = jnp.asarray(order.reshape(num_workers, shard), jnp.int32)
    self._key_data = jax.random.key_data(jax.random.key(seed))
    # a p + c < 2^31 for every position p < S: a <= (2^31 - 1) / S - 1 keeps int32 exact.
    largest = max(1, min(shard, (2**31 - 1) // shard - 1))
    self._units = jnp.asarray([a for a in range(1, largest + 1) if math.gcd(a, shard) == 1], jnp.int32)

  # A pytree (its arrays are leaves): a jitted function takes it as an argument, so the training set
  # reaches XLA as a buffer and not as a constant folded into the program (for Fashion-MNIST's 188 MB
  # that was 3 s more of every compilation). The shuffling key is a leaf too: as a constant it made
  # each seed's program differ, so a persistent compilation cache could not serve one seed's from another's.
  def tree_flatten(self):
    children = (self.arrays, self.shards, self._units, self._key_data)
    aux = (self.num_workers, self.batch_size, self.shard_size, self.num_examples, self.seed, self.rng)
    return children, aux

  @classmethod
  def tree_unflatten(cls, aux, children):
    data = object.__new__(cls)
    data.arrays, data.shards, data._units, data._key_data = children
    data.num_workers, data.batch_size, data.shard_size, data.num_examples, data.seed, data.rng = aux
    return data

  def indices(self, worker: jax.Array, step: jax.Array) -> jax.Array:
    """The example indices of ``worker``'s batch at its ``step``, shape ``[b]``."""
    s = self.shard_size
    position = step * self.batch_size + jnp.arange(self.batch_size, dtype=jnp.int32)
    epoch = position // s
    worker_key = jax.random.fold_in(jax.random.wrap_key_data(self._key_data), worker)

    def order(e):
      ka, kc = jax.random.split(jax.random.fold_in(worker_key, e))
      # int32 draws: the default integer is int64 under jax_enable_x64, which draws other numbers.
      a = self._units[jax.random.randint(ka, [], 0, self._units.shape[0], dtype=jnp.int32)]
      c = jax.random.randint(kc, [], 0, s, dtype=jnp.int32)
      return a, c

    # A batch spans at most two epochs (b <= S).
    a0, c0 = order(epoch[0])
    a1, c1 = order(epoch[0] + 1)
    r = position % s
    offset = jnp.where(epoch == epoch[0], (a0 * r + c0) % s, (a1 * r + c1) % s)
    return self.shards[worker, offset]

  def batch(self, worker: jax.Array, step: jax.Array) -> Any:
    """``worker``'s batch at its ``step``: the arrays indexed by :meth:`indices`."""
    worker, step = jnp.asarray(worker, jnp.int32), jnp.asarray(step, jnp.int32)
    idx = self.indices(worker, step)
    batch = jax.tree.map(lambda x: x[idx], self.arrays)
    if self.rng:
      # A stream apart from the shuffling's (which folds the seed's key with each worker id): a split of
      # the seed's key, then the worker, then its step.
      key = jax.random.split(jax.random.wrap_key_data(self._key_data))[1]
      key = jax.random.fold_in(jax.random.fold_in(key, worker), step)
      batch = {**batch, "_rng": jnp.broadcast_to(jax.random.bits(key, (), jnp.uint32), (self.batch_size,))}
    return batch
