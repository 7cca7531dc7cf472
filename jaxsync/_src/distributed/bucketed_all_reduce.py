r"""A tree's sum over the workers as few, large buffers: its leaves end to end in buckets, one all-reduce each.

XLA's CPU backend runs one gloo all-reduce per operand of a ``psum``, one
after another, and each pays gloo's per-collective latency (on a 1 Gbit/s
card: 0.37 ms for a scalar, 3.8 ms for a 67 KB leaf; a 605 KB CNN's eight
leaves and its loss took 3.6x one ``psum`` of the same bytes as one buffer).
Data-parallel frameworks bucket their gradients for the same reason (PyTorch
DDP's ``bucket_cap_mb``, 25 MB by default). Here the leaves of each dtype are
laid end to end, in tree order, into buckets of at most ``bucket_bytes`` (a
leaf larger than that is a bucket of its own), each bucket is summed by one
collective, and the sums are cut back into the leaves:

.. math::

  \text{bucket}_b = [\,\text{vec}(x_i)\,]_{i \in b}, \qquad
  \textstyle\sum_k \text{bucket}_{b,k} \;\to\; \sum_k x_{i,k} \quad (i \in b)

Each element's sum is the same operation on the same values as a ``psum`` of
its leaf; only which of gloo's ring chunks it travels in changes, so the order
of the ``K`` addends (and the last bit of a sum of more than two) may differ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

# Measured in benchmarks/results/sync_overhead.md: on gloo fewer, larger buffers are faster (a 605 KB CNN's
# round in 64 KB buckets took 2.2x its round in one buffer at 1 Gbit/s; at 4.5 MB, 1 MB buckets and one
# buffer tied); the cap keeps a bucket's concatenated copy bounded for large models (PyTorch DDP: 25 MB).
DEFAULT_BUCKET_BYTES = 64 * 2**20


def buckets(leaves: Sequence[jax.ShapeDtypeStruct | jax.Array], bucket_bytes: int) -> list[list[int]]:
  """The leaf indices of each bucket: same-dtype leaves in tree order, at most ``bucket_bytes`` each.

  Args:
    leaves: arrays or shapes (their ``shape`` and ``dtype`` are read).
    bucket_bytes: a bucket's largest size; a leaf larger than it is a bucket of its own.

  Returns:
    Lists of indices into ``leaves``; every index appears once.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> leaves = [jax.ShapeDtypeStruct((10,), jnp.float32)] * 3
    >>> buckets(leaves, bucket_bytes=80)
    [[0, 1], [2]]
  """
  if bucket_bytes < 1:
    raise ValueError(f"bucket_bytes={bucket_bytes} is invalid; expected a positive number of bytes.")
  open_: dict[Any, list[int]] = {}  # the bucket being filled, per dtype
  filled: dict[Any, int] = {}
  out: list[list[int]] = []
  for i, leaf in enumerate(leaves):
    dtype = jnp.dtype(leaf.dtype)
    size = math.prod(leaf.shape) * dtype.itemsize
    if dtype not in open_ or filled[dtype] + size > bucket_bytes:
      open_[dtype], filled[dtype] = [], 0
      out.append(open_[dtype])
    open_[dtype].append(i)
    filled[dtype] += size
  return out


def bucketed_sum(
  tree: Any, reduce: Callable[[jax.Array], jax.Array], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Any:
  """``reduce`` (a sum over the workers, e.g. ``lambda x: jax.lax.psum(x, "workers")``) of ``tree``, one call per bucket.

  Called inside ``shard_map`` (or ``pmap``), per worker.

  Args:
    tree: a pytree of arrays (scalars too: a round's loss travels with its gradient).
    reduce: the collective, applied to one flat bucket at a time.
    bucket_bytes: a bucket's largest size (see :func:`buckets`).

  Returns:
    ``tree``'s sum over the workers, leaf by leaf, in the leaves' shapes and dtypes.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> tree = {"w": jnp.ones((2, 3)), "b": jnp.ones(3), "loss": jnp.float32(0.5)}
    >>> out = bucketed_sum(tree, lambda x: 2 * x)  # two identical workers, as a psum would give
    >>> float(out["loss"]), out["w"].shape
    (1.0, (2, 3))
  """
  leaves, treedef = jax.tree.flatten(tree)
  out: list[Any] = [None] * len(leaves)
  for bucket in buckets(leaves, bucket_bytes):
    flat = (
      jnp.concatenate([jnp.ravel(leaves[i]) for i in bucket])
      if len(bucket) > 1
      else jnp.ravel(leaves[bucket[0]])
    )
    summed = reduce(flat)
    offset = 0
    for i in bucket:
      n = math.prod(jnp.shape(leaves[i]))
      out[i] = summed[offset : offset + n].reshape(jnp.shape(leaves[i]))
      offset += n
  return treedef.unflatten(out)
