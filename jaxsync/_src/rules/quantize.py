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
  return fmt, validation.check_int(rule, "quantize_block", block_size)


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


def _integer_round_trip(x: jax.Array, levels: int, block_size: int) -> jax.Array:
  flat = x.reshape(-1).astype(jnp.float32)
  n = flat.shape[0]
  padded = jnp.pad(flat, (0, -n % block_size)).reshape(-1, block_size)
  # Absmax scale per block (a block of zeros keeps scale 1: nothing to divide).
  absmax = jnp.max(jnp.abs(padded), axis=1, keepdims=True)
  scale = jnp.where(absmax > 0, absmax / levels, 1.0)
  q = jnp.clip(jnp.round(padded / scale), -levels, levels)
  return (q * scale).reshape(-1)[:n].reshape(x.shape).astype(x.dtype)


def quantized(tree: Any, fmt: str | None, block_size: int = 64) -> Any:
  r"""``tree`` as the receiver sees it after a round trip through wire format ``fmt``.

  ``bfloat16`` rounds each value to bfloat16. ``int8`` and ``int4`` cut each
  leaf (flattened) into blocks of ``block_size`` values and send, per block,
  one float32 scale ``s = max|x| / L`` and the integers
  ``q = clip(round(x / s), -L, L)`` (``L`` = 127 or 7); the receiver reads
  ``q s``. ``None`` is the identity.

  Args:
    tree: a pytree of float arrays (a pseudo-gradient).
    fmt: ``None`` or one of :data:`FORMATS`.
    block_size: values per scale of the integer formats.

  Returns:
    The dequantized tree, same shapes and dtypes.
  """
  if fmt is None:
    return tree
  if fmt == "bfloat16":
    return jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(x.dtype), tree)
  levels = _LEVELS[fmt]
  return jax.tree.map(lambda x: _integer_round_trip(x, levels, block_size), tree)
