"""The parameter server's messages on the wire: a fixed 64-byte header and a flat payload.

A message is a ZeroMQ multipart message: the header, then the payload's frames::

  [header (64 bytes)] [payload: count x dtype, the whole pytree raveled, in one or more frames]

The payload is the parameters' leaves end to end: a sender may send each leaf
as a frame of its own (the server sends its parameter buffers as they are,
without raveling them into a copy) or the whole as one; the receiver reads
them as one flat array.

The header carries the run token (only processes of the run know it: it is
handed out on the coordination service), the sender's worker id, the
parameter version a gradient was computed on, the worker's data step, its
batch loss and its own NaN/Inf verdict. The receiver checks every field
against what it expects before it looks at the payload (:func:`decode`), and
the payload is received without a copy (into an :class:`Inbox`, or
``numpy.frombuffer`` over a single ZeroMQ frame). A frame longer than the largest legal message is refused by ZeroMQ
itself (``MAXMSGSIZE``) before it is read whole.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from typing import Any

import numpy as np

MAGIC = b"JXS1"
_HEADER = struct.Struct("<4sBBBB16siqqfffQ")
HEADER_BYTES = _HEADER.size
_DTYPES = ("float32", "float64", "bfloat16", "float16")


class Kind(enum.IntEnum):
  """What a message is."""

  HELLO = 1  # worker -> server: I am worker k, send me parameters
  PUSH = 2  # worker -> server: a message (gradient) computed on `version`
  PARAMS = 3  # server -> worker: parameters of `version`, continue at data `step`
  STOP = 4  # server -> worker: the run is over
  ERROR = 5  # server -> worker: your message was rejected (for `reason`)
  BYE = 6  # worker -> server: leaving
  STEP = 7  # worker -> server: an elastic worker's local step (its loss; no payload, no reply)
  # InHAD's node aggregator (node_aggregator.py) between a node's workers and the server:
  NODE_HELLO = 8  # node -> server: I am node `worker`, send me the parameters
  REPORT = 9  # node -> server: worker `worker` pushed a gradient to its node (a PUSH's header, no payload)
  BROADCAST = 10  # server -> node: the parameters of `version` (payload), for the node's workers
  HOLD = 11  # server -> node: worker `worker`'s gradient counts; its answer comes later
  DROP = 12  # server -> node: worker `worker`'s gradient is dropped (it was declared lost)
  PULL = 13  # server -> node: send the sum of your `step` counted gradients (pull number `version`)
  SUM = 14  # node -> server: the sum of `step` gradients (payload) for pull number `version`


class MessageError(ValueError):
  """A message the receiver rejects; ``reason`` is one of :data:`REASONS`."""

  def __init__(self, reason: str, detail: str):
    super().__init__(f"{reason}: {detail}")
    self.reason = reason


PAYLOAD_KINDS = (Kind.PUSH, Kind.PARAMS, Kind.BROADCAST, Kind.SUM)
"""The kinds that carry a payload (a PARAMS directive from the server to a node carries none:
:func:`decode_payload` with ``directive=True``)."""

REASONS = ("malformed", "token", "worker", "future_version", "version", "dtype", "shape")
"""Why a message was rejected; an ERROR header carries one (encoded as its index + 1, 0 for none)."""


@dataclasses.dataclass(frozen=True)
class Header:
  """The fixed fields of a message (see the module docstring)."""

  kind: Kind
  token: bytes
  worker: int
  version: int = 0
  step: int = 0
  loss: float = float("nan")
  step_size: float = float("nan")
  noise_ratio: float = 0.0
  finite: bool = True
  dtype: str = "float32"
  count: int = 0
  reason: str | None = None


def encode(header: Header, payload: np.ndarray | list[np.ndarray] | None = None) -> list[Any]:
  """The frames of a message; ``payload`` (an array, or a list of arrays laid end to end) is sent without a copy.

  Each array of a list is a frame of its own (e.g. the leaves of a parameter
  tree, which would otherwise have to be raveled into a copy); they must share
  one dtype. A non-contiguous array is copied.
  """
  parts = [] if payload is None else list(payload) if isinstance(payload, (list, tuple)) else [payload]
  parts = [np.asarray(part) for part in parts]
  dtypes = {str(part.dtype) for part in parts}
  if len(dtypes) > 1:
    raise ValueError(f"payload dtypes={sorted(dtypes)}; a message's payload has one dtype")
  count = sum(int(part.size) for part in parts)
  dtype = header.dtype if payload is None else dtypes.pop() if dtypes else header.dtype
  packed = _HEADER.pack(
    MAGIC,
    int(header.kind),
    _DTYPES.index(dtype),
    int(bool(header.finite)),
    0 if header.reason is None else REASONS.index(header.reason) + 1,
    header.token,
    header.worker,
    header.version,
    header.step,
    header.loss,
    header.step_size,
    header.noise_ratio,
    count,
  )
  if payload is None:
    return [packed]
  # As bytes: the buffer protocol has no format for ml_dtypes' bfloat16.
  return [packed, *(memoryview(np.ascontiguousarray(part).reshape(-1).view(np.uint8)) for part in parts)]


def max_message_bytes(count: int, dtype: str) -> int:
  """The largest legal frame: a payload of ``count`` elements of ``dtype`` (or the header)."""
  return max(HEADER_BYTES, count * np.dtype(numpy_dtype(dtype)).itemsize)


def numpy_dtype(name: str):
  """The NumPy dtype of a wire dtype name (bfloat16 from ml_dtypes)."""
  if name == "bfloat16":
    import ml_dtypes  # jax's own dependency

    return ml_dtypes.bfloat16
  return np.dtype(name)


def decode_header(frame: Any, *, token: bytes) -> Header:
  """The header of a message, checked for its magic, its kind and the run token."""
  raw = bytes(frame.buffer if hasattr(frame, "buffer") else frame)
  if len(raw) != HEADER_BYTES or raw[:4] != MAGIC:
    raise MessageError("malformed", f"a {len(raw)}-byte header frame that is not a jaxsync header")
  magic, kind, dtype, finite, reason, got_token, worker, version, step, loss, step_size, noise, count = (
    _HEADER.unpack(raw)
  )
  del magic
  if kind not in Kind._value2member_map_ or dtype >= len(_DTYPES) or reason > len(REASONS):
    raise MessageError("malformed", f"kind={kind}, dtype code={dtype}, reason code={reason}")
  if got_token != token:
    raise MessageError("token", "the message carries another run's token (a stale or foreign process)")
  return Header(
    kind=Kind(kind),
    token=got_token,
    worker=worker,
    version=version,
    step=step,
    loss=loss,
    step_size=step_size,
    noise_ratio=noise,
    finite=bool(finite),
    dtype=_DTYPES[dtype],
    count=count,
    reason=REASONS[reason - 1] if reason else None,
  )


def decode_payload(
  header: Header, frames: list[Any], *, dtype: str, count: int, directive: bool = False
) -> np.ndarray | None:
  """The payload as a flat NumPy array, after checking its dtype and element count.

  One frame (what an :class:`Inbox` returns) is viewed without a copy; the
  frames of a payload sent in several are joined.

  Args:
    header: the message's decoded header.
    frames: the frames after the header (none for a message without a payload).
    dtype, count: what the receiver expects (the parameters' dtype and size).
    directive: the message is the server's to a node aggregator, whose PARAMS
      carry no payload (the node answers its worker with its own copy).
  """
  if header.kind not in PAYLOAD_KINDS or (directive and header.kind == Kind.PARAMS):
    if frames:
      raise MessageError("malformed", f"a {header.kind.name} message with {len(frames)} payload frame(s)")
    return None
  if not frames:
    raise MessageError("malformed", f"a {header.kind.name} message without its payload")
  if header.dtype != dtype:
    raise MessageError("dtype", f"payload dtype={header.dtype!r}; expected {dtype!r}")
  itemsize = np.dtype(numpy_dtype(dtype)).itemsize
  nbytes = sum(_nbytes(frame) for frame in frames)
  if header.count != count or nbytes != count * itemsize:
    raise MessageError(
      "shape", f"payload of {header.count} elements ({nbytes} bytes); expected {count} elements"
    )
  views = [np.frombuffer(_buffer(frame), dtype=numpy_dtype(dtype)) for frame in frames]
  return views[0] if len(views) == 1 else np.concatenate(views)


def _buffer(frame: Any) -> memoryview:
  return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def _nbytes(frame: Any) -> int:
  return frame.nbytes if isinstance(frame, OversizedPayload) else _buffer(frame).nbytes


class OversizedPayload:
  """What :meth:`Inbox.receive` returns for a payload longer than its buffer: the length only.

  :func:`decode_payload` refuses it (``shape``); its bytes were never written past the buffer.
  """

  def __init__(self, nbytes: int):
    self.nbytes = nbytes


ALIGNMENT = 64
"""Bytes: XLA's CPU client adopts a host buffer aligned to this without copying it (``jax.device_put``)."""


class Inbox:
  """Receives messages, the payload frame straight into one preallocated, aligned buffer.

  ``numpy.frombuffer`` over a ZeroMQ frame is not aligned for XLA, so moving
  it to the device copies it (20 ms for 40 MB on the 2-core machine); a
  payload received here with ``recv_into`` is adopted by ``jax.device_put``
  as it is (0.06 ms). The buffer is reused: a payload is valid until the next
  :meth:`receive`, and a device array made from it (:func:`to_device`) must
  not outlive that either (copy it to keep it).

  Args:
    max_bytes: the largest payload (the socket's ``MAXMSGSIZE`` refuses longer frames).
    capacity: the buffer's bytes, ``>= max_bytes`` (default ``max_bytes``): the bytes past
      ``max_bytes`` stay zero (a sharded server's padding, :meth:`view`).
  """

  def __init__(self, max_bytes: int, capacity: int | None = None):
    capacity = max_bytes if capacity is None else max(capacity, max_bytes)
    self._whole = aligned_zeros(capacity, np.uint8)
    self._buffer = memoryview(self._whole[:max_bytes])

  def view(self, dtype, count: int) -> np.ndarray:
    """The buffer's first ``count`` elements of ``dtype`` (the last payload, then zeros), without a copy."""
    return self._whole[: count * np.dtype(dtype).itemsize].view(dtype)

  def receive(self, socket, *, routed: bool = False, at: int = 0, size: int | None = None) -> list[Any]:
    """The frames of the next message (the sender's identity first when ``routed``: a ROUTER socket).

    The frames after the header (the payload, in one frame or several) are
    received end to end into the buffer's bytes ``[at, at + size)`` (default:
    all of it; a worker assembles a sharded server's slices side by side) and
    returned as one view of them. A payload longer than that region is
    returned as its length only, for :func:`decode_payload` to refuse.
    """
    import zmq

    region = self._buffer[at:] if size is None else self._buffer[at : at + size]
    frames = [socket.recv(copy=False)]
    while len(frames) < (2 if routed else 1) and socket.getsockopt(zmq.RCVMORE):
      frames.append(socket.recv(copy=False))  # the sender's identity, then the header
    received, parts = 0, 0
    while socket.getsockopt(zmq.RCVMORE):
      # recv_into copies what fits and returns the frame's whole length.
      received += socket.recv_into(region[min(received, len(region)) :])
      parts += 1
    if parts:
      frames.append(region[:received] if received <= len(region) else OversizedPayload(received))
    return frames


def aligned_zeros(count: int, dtype) -> np.ndarray:
  """``count`` zeros of ``dtype`` at an address XLA's CPU client adopts without a copy (:data:`ALIGNMENT`)."""
  nbytes = count * np.dtype(dtype).itemsize
  raw = np.zeros(nbytes + ALIGNMENT, np.uint8)
  offset = (-raw.ctypes.data) % ALIGNMENT
  return raw[offset : offset + nbytes].view(dtype)  # the view keeps `raw` alive


def to_device(payload: np.ndarray):
  """A payload on the default device, without a copy when it came from an :class:`Inbox`."""
  import jax

  return jax.device_put(payload)


def keep_freed_memory() -> bool:
  """Makes this process's ``malloc`` keep large freed blocks for reuse (glibc); returns whether it could.

  Every message allocates payload-sized buffers (ZeroMQ's message, XLA's
  reply), and glibc serves any block over 32 MB with a fresh ``mmap`` whose
  pages fault in one by one: at 40 MB the server's step took 27 ms with it and
  10 ms without, a push+pull 97 ms and 48 ms, on the 2-core machine
  (``benchmarks/speed/ps_throughput.py``). With
  ``mmap`` off and no trimming, a freed block is reused as it is. The cost is
  that memory a run freed is not returned to the system until it exits: the
  processes of a multi-process run call this (``cluster.initialize``), a
  library user's own process is left alone.
  """
  import ctypes
  import ctypes.util
  import sys

  if not sys.platform.startswith("linux"):
    return False
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):  # not glibc (musl has no mallopt)
    return False
  m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
  return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))
