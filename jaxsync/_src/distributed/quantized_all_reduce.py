r"""The workers' mean sent quantized, as real collectives: all-to-all, average, all-gather.

Streaming DiLoCo sends its pseudo-gradients in 4 bits (Douillard et al., 2025).
An all-reduce cannot sum 4-bit integers, so the exchange takes the form torchft
uses for its quantized all-reduce: the values (every leaf padded to whole
blocks of the wire format, then all of them end to end) are cut into ``K``
slices; worker ``j`` receives slice ``j`` of every worker's quantized vector
(all-to-all), averages them in float32, quantizes the average and sends it to
every worker (all-gather):

.. math::

  \bar\Delta = Q\Big(\tfrac{1}{K} \textstyle\sum_k Q(\Delta_k)\Big)

which is what the simulator computes and charges (:func:`jaxsync._src.steps.
sync_round.outer_step`). Every value crosses the wire quantized, twice: each
worker sends ``2 (K - 1)`` slices of its packed bytes and their scales (about
``2 (K - 1) / K`` of the vector's wire bytes, as a ring all-reduce of the same
bytes would).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from jaxsync._src.rules import quantize


def _padded_sizes(sizes: Sequence[int], fmt: str, block_size: int, num_workers: int) -> tuple[list[int], int]:
  """Each leaf's length padded to whole blocks, and the values per worker's slice (whole blocks, even for int4)."""
  unit = 1 if fmt == "bfloat16" else block_size
  padded = [-(-n // unit) * unit for n in sizes]
  align = unit * (2 if fmt == "int4" and unit % 2 else 1)
  per_slice = -(-sum(padded) // (num_workers * align)) * align
  return padded, per_slice


def slice_bytes(sizes: Sequence[int], fmt: str, block_size: int, num_workers: int) -> int:
  """Wire bytes of one worker's slice of leaves of ``sizes`` values: packed values and their scales."""
  _, per_slice = _padded_sizes(sizes, fmt, block_size, num_workers)
  # Whole blocks (and bytes, for int4): the format's bytes per value give a whole number.
  return round(per_slice * quantize.bytes_per_value(fmt, block_size))


def bytes_moved(sizes: Sequence[int], fmt: str, block_size: int, num_workers: int) -> int:
  """Bytes all workers send in one exchange: each sends ``K - 1`` slices in each of the two collectives."""
  return 2 * num_workers * (num_workers - 1) * slice_bytes(sizes, fmt, block_size, num_workers)


def quantized_mean(
  leaves: Sequence[jax.Array], fmt: str, block_size: int, axis_name: str, num_workers: int
) -> list[jax.Array]:
  """``Q(mean_k Q(leaves_k))`` over the workers of ``axis_name``, called inside ``shard_map`` per worker.

  Args:
    leaves: this worker's float arrays (a pseudo-gradient's leaves).
    fmt: a wire format of :data:`jaxsync._src.rules.quantize.FORMATS`.
    block_size: values per scale of the integer formats.
    axis_name: the mesh axis of the ``K`` workers.
    num_workers: ``K``.

  Returns:
    The mean, leaf by leaf, as every worker receives it (the same on all of them).
  """
  sizes = [math.prod(x.shape) for x in leaves]
  padded, per_slice = _padded_sizes(sizes, fmt, block_size, num_workers)
  flat = jnp.concatenate(
    [jnp.pad(x.reshape(-1).astype(jnp.float32), (0, p - n)) for x, n, p in zip(leaves, sizes, padded)]
  )
  rows = jnp.pad(flat, (0, num_workers * per_slice - flat.shape[0])).reshape(num_workers, per_slice)
  encode = jax.vmap(lambda row: quantize.encode(row, fmt, block_size))
  decode = jax.vmap(lambda v, s: quantize.decode(v, s, fmt, block_size))

  def exchange(collective, values, scales):
    """Packed ``[rows, n]`` values and their scales through ``collective`` as one byte buffer (one
    collective, not two: each pays gloo's latency); bfloat16 has no scales."""
    packed = quantize.pack(values, fmt)
    if fmt == "bfloat16":
      got = quantize.unpack(collective(packed), fmt)
      return got, jnp.zeros([got.shape[0], 0], jnp.float32)
    value_bytes = jax.lax.bitcast_convert_type(packed, jnp.uint8)
    scale_bytes = jax.lax.bitcast_convert_type(scales, jnp.uint8).reshape(scales.shape[0], -1)
    got = collective(jnp.concatenate([value_bytes, scale_bytes], axis=1))
    n = value_bytes.shape[1]
    values = quantize.unpack(jax.lax.bitcast_convert_type(got[:, :n], packed.dtype), fmt)
    return values, jax.lax.bitcast_convert_type(got[:, n:].reshape(got.shape[0], -1, 4), jnp.float32)

  # Row j of every worker reaches worker j: its slice, from each of the K workers.
  to_owner = lambda x: jax.lax.all_to_all(x, axis_name, 0, 0, tiled=True)
  values, scales = exchange(to_owner, *encode(rows))
  mine = jnp.sum(decode(values, scales), axis=0, keepdims=True) / num_workers
  # Every worker's averaged slice reaches every worker, quantized once more.
  to_all = lambda x: jax.lax.all_gather(x, axis_name, tiled=True)
  values, scales = exchange(to_all, *encode(mine))
  mean = decode(values, scales).reshape(-1)
  out, offset = [], 0
  for x, n, p in zip(leaves, sizes, padded):
    out.append(mean[offset : offset + n].reshape(x.shape).astype(x.dtype))
    offset += p
  return out
