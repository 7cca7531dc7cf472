"""Quantized exchange: what a pseudo-gradient becomes on the wire, and how many bytes it takes (the Algorithms page, section 21)."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxsync._src.core import validation

_WHAT = "quantize"
# Wire formats of an exchanged pseudo-gradient; None sends it at the parameters' own precision.
FORMATS = ("bfloat16", "int8", "int4")
_LEVELS = {"int8": 127, "int4": 7}  # symmetric integer levels: q in [-L, L]
_SCALE_BYTES = 4  # one float32 scale per block


def check_format(rule: str, fmt: Any, block_size: Any) -> tuple[str | None, int]:
  """Validates a wire format (``None`` or one of :data:`FORMATS`) and its block size; returns them."""
  if fmt is not None:
    fmt = validation.check_choice(rule, "quantize", fmt, FORMATS)
  return fmt, validation.check_static_int(rule, "quantize_block", block_size)


def bytes_per_value(fmt: str | None, block_size: int, itemsize: int = 4) -> float:
  """Wire bytes per value: the parameters' ``itemsize``, 2 for bfloat16, ``b/8 + 4 / block_size`` for ``b``-bit integers."""
  if fmt is None:
    return float(itemsize)
  if fmt == "bfloat16":
    return 2.0
  bits = 8 if fmt == "int8" else 4
  return bits / 8 + _SCALE_BYTES / block_size


def wire_bytes(tree: Any, fmt: str | None, block_size: int) -> int:
  """Bytes ``tree`` takes on the wire in ``fmt`` (each leaf's blocks padded to ``block_size``)."""
  total = 0.0
  for leaf in jax.tree.leaves(tree):
    n = math.prod(jnp.shape(leaf))
    itemsize = jnp.dtype(jnp.result_type(leaf)).itemsize
    if fmt in _LEVELS:
      blocks = -(-n // block_size)
      total += n * (8 if fmt == "int8" else 4) / 8 + blocks * _SCALE_BYTES
    else:
      total += n * bytes_per_value(fmt, block_size, itemsize)
  return int(math.ceil(total))


def encode(flat: jax.Array, fmt: str, block_size: int) -> tuple[jax.Array, jax.Array]:
  """A flat float vector in wire format ``fmt``: ``(values, scales)``.

  ``bfloat16``: the values in bfloat16 and no scales. ``int8``/``int4`` (the
  length a multiple of ``block_size``): the integers ``q = clip(round(x / s),
  -L, L)`` as int8 and one float32 scale ``s = max|x| / L`` per block (1 for
  a block of zeros: nothing to divide).
  """
  if fmt == "bfloat16":
    return flat.astype(jnp.bfloat16), jnp.zeros([0], jnp.float32)
  levels = _LEVELS[fmt]
  blocks = flat.astype(jnp.float32).reshape(-1, block_size)
  absmax = jnp.max(jnp.abs(blocks), axis=1, keepdims=True)
  scale = jnp.where(absmax > 0, absmax / levels, 1.0)
  q = jnp.clip(jnp.round(blocks / scale), -levels, levels)
  return q.astype(jnp.int8).reshape(-1), scale.reshape(-1)


def decode(values: jax.Array, scales: jax.Array, fmt: str, block_size: int) -> jax.Array:
  """The float32 vector :func:`encode` sent: ``q s`` per block, or the bfloat16 values widened."""
  if fmt == "bfloat16":
    return values.astype(jnp.float32)
  q = values.astype(jnp.float32).reshape(-1, block_size)
  return (q * scales.reshape(-1, 1)).reshape(-1)


def pack(values: jax.Array, fmt: str) -> jax.Array:
  """:func:`encode`'s values as bytes on the wire: int4 two to a byte (``q + 8`` in each nibble), else as they are.

  The last axis (of even length for int4) is the one packed.
  """
  if fmt != "int4":
    return values
  nibbles = (values.astype(jnp.int32) + 8).astype(jnp.uint8)
  return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)


def unpack(packed: jax.Array, fmt: str) -> jax.Array:
  """:func:`pack` undone: int4 bytes back to one int8 integer per value."""
  if fmt != "int4":
    return packed
  low = (packed & 0xF).astype(jnp.int8) - 8
  high = (packed >> 4).astype(jnp.int8) - 8
  return jnp.stack([low, high], axis=-1).reshape(*packed.shape[:-1], -1)


def _blocks_in_place(
  shape: tuple[int, ...], block_size: int
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
  """A view of a leaf's row-major blocks that keeps its last axis (or splits it), or None where none exists.

  The blocks are those of the flattened leaf; flattening a parameter split
  along its last axis (tensor parallel) would gather it whole onto each
  device, while this view keeps the split and reduces only the blocks' maxima.
  Returns ``(view shape, axes of one block)``.
  """
  if not shape or math.prod(shape) % block_size:
    return None
  last = shape[-1]
  if block_size % last == 0:  # a block is block_size / last whole rows
    return (math.prod(shape) // block_size, block_size // last, last), (1, 2)
  if last % block_size == 0:  # a row is last / block_size whole blocks
    return (*shape[:-1], last // block_size, block_size), (len(shape),)
  return None


def _integer_round_trip(x: jax.Array, fmt: str, block_size: int) -> jax.Array:
  in_place = _blocks_in_place(jnp.shape(x), block_size)
  if in_place is not None:  # the same blocks and arithmetic as encode / decode, without flattening
    view, axes = in_place
    blocks = x.astype(jnp.float32).reshape(view)
    levels = _LEVELS[fmt]
    absmax = jnp.max(jnp.abs(blocks), axis=axes, keepdims=True)
    scale = jnp.where(absmax > 0, absmax / levels, 1.0)
    q = jnp.clip(jnp.round(blocks / scale), -levels, levels).astype(jnp.int8).astype(jnp.float32)
    return (q * scale).reshape(jnp.shape(x)).astype(x.dtype)
  flat = x.reshape(-1).astype(jnp.float32)
  n = flat.shape[0]
  padded = jnp.pad(flat, (0, -n % block_size))
  values, scales = encode(padded, fmt, block_size)
  return decode(values, scales, fmt, block_size)[:n].reshape(x.shape).astype(x.dtype)


def quantized(tree: Any, fmt: str | None, block_size: int = 64) -> Any:
  r"""``tree`` as the receiver sees it after a round trip through wire format ``fmt``.

  ``bfloat16`` rounds each value to bfloat16. ``int8`` and ``int4`` cut each
  leaf (flattened) into blocks of ``block_size`` values and send, per block,
  one float32 scale ``s = max|x| / L`` and the integers
  ``q = clip(round(x / s), -L, L)`` (``L`` = 127 or 7); the receiver reads
  ``q s``. ``None`` is the identity.

  Args:
    tree: a pytree of float (or complex) arrays (a pseudo-gradient).
    fmt: ``None`` or one of :data:`FORMATS`.
    block_size: values per scale of the integer formats.

  Returns:
    The dequantized tree, same shapes and dtypes.
  """
  if fmt is None:
    return tree

  def real_round_trip(x):
    if fmt == "bfloat16":
      return x.astype(jnp.bfloat16).astype(x.dtype)
    return _integer_round_trip(x, fmt, block_size)

  def round_trip(x):
    if jnp.iscomplexobj(x):  # a complex value goes as two real ones: its real and imaginary parts
      return jax.lax.complex(real_round_trip(jnp.real(x)), real_round_trip(jnp.imag(x))).astype(x.dtype)
    return real_round_trip(x)

  return jax.tree.map(round_trip, tree)
