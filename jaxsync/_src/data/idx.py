"""The IDX files of MNIST and Fashion-MNIST, read and checked: magic number, counts, shapes, length.

An IDX file is a 4-byte magic number (two zero bytes, a type code, the number
of dimensions), one big-endian 32-bit size per dimension, then the values in
row-major order. MNIST and Fashion-MNIST use unsigned bytes (type code 0x08):
images ``[N, 28, 28]`` (``idx3``) and labels ``[N]`` (``idx1``). Files may be
gzipped (``.gz``) or raw; either is read.
"""

from __future__ import annotations

import gzip
import pathlib

import numpy as np

_UBYTE = 0x08
_GZIP_MAGIC = b"\x1f\x8b"


class IdxError(ValueError):
  """An IDX file that is missing, truncated, or not what it should be; the message names the file."""


def read(path: str | pathlib.Path, *, ndim: int) -> np.ndarray:
  """The array an IDX file of unsigned bytes holds, shape from its header.

  Args:
    path: the file, gzipped or raw.
    ndim: the number of dimensions it must have (3 for images, 1 for labels).

  Returns:
    A ``uint8`` array.

  Raises:
    IdxError: the file is not an IDX file of ``ndim`` dimensions of unsigned
      bytes, or holds fewer or more bytes than its header says.
  """
  path = pathlib.Path(path)
  raw = path.read_bytes()
  if raw[:2] == _GZIP_MAGIC:
    try:
      raw = gzip.decompress(raw)
    except (OSError, EOFError) as err:
      raise IdxError(f"{path} is a damaged gzip file ({err}); expected a gzipped IDX file.") from None
  header = 4 + 4 * ndim
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
    raise IdxError(
      f"{path} is not an IDX file (its first bytes are {raw[:4].hex() or 'missing'}); expected the magic "
      f"number 0x0000{_UBYTE:02x}{ndim:02x}."
    )
  if raw[2] != _UBYTE or raw[3] != ndim:
    raise IdxError(
      f"{path} has magic number 0x{raw[:4].hex()}: type code 0x{raw[2]:02x} with {raw[3]} dimension(s); "
      f"expected 0x0000{_UBYTE:02x}{ndim:02x} (unsigned bytes, {ndim} dimension(s))."
    )
  if len(raw) < header:
    raise IdxError(f"{path} is truncated inside its header ({len(raw)} bytes, expected at least {header}).")
  shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
  expected = int(np.prod(shape))
  found = len(raw) - header
  if found != expected:
    what = "truncated" if found < expected else "longer than its header says"
    raise IdxError(
      f"{path} is {what}: its header gives shape {shape}, {expected:,} values, and it holds {found:,}."
    )
  return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)
