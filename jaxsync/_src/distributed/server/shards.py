"""A parameter server in S processes, each owning a slice of the raveled parameters (ps-lite, BytePS style).

A model too large for one server process's network card and memory bandwidth
is served by ``S`` shard processes. Shard ``s`` owns the slice
:meth:`ShardLayout.bounds` of the raveled parameters (and of everything the
server keeps per parameter: the rule's momentum, EA-wild's reads, the open
round's sum); a worker pushes and pulls the ``S`` slices in parallel.

The server step stays the single server's (:mod:`server_step`), compiled once
over a mesh of one device per shard process, on the raveled parameters
(zero-padded to ``S`` equal slices: a zero gradient leaves a zero parameter
where it is under every rule). Every per-parameter operation runs on the
shard that owns the slice; the few global scalars of a rule (a gradient's
squared norm and NaN/Inf check, adaptive-k's variance tests, the norms of
Barzilai-Borwein's noise ratio) are sums XLA combines across the shards with
one all-reduce of a scalar. Everything else (counters, the waiting set,
versions, each decision) is replicated, so every shard decides what a single
server would: the same release, the same ``k``, the same workers sent a reply.

Shard 0 leads: it takes the workers' headers, checks them, orders the run's
events and sends each shard the event to apply next (:class:`Command`, on a
ZeroMQ PUSH socket per shard); every shard applies the same events in the same
order to its slice, and replies to the workers with its slice.

The server's state on the host (what ``advance`` returns and a checkpoint
holds) is the single server's except for the rule's state, which is that of
the raveled parameters (so a sharded run's checkpoint resumes with any
number of shards, but not on a single server).
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxsync._src.core import validation

AXIS = "shard"
_WHAT = "sharded parameter server"


class ShardLayout(NamedTuple):
  """How ``count`` raveled parameters are cut into ``num_shards`` slices of ``chunk`` (the last zero-padded)."""

  count: int
  num_shards: int

  @property
  def chunk(self) -> int:
    return -(-self.count // self.num_shards)

  @property
  def padded(self) -> int:
    return self.chunk * self.num_shards

  def bounds(self, shard: int) -> tuple[int, int]:
    """The slice ``[lo, hi)`` of the raveled parameters shard ``shard`` owns (its real, unpadded part)."""
    lo = min(shard * self.chunk, self.count)
    return lo, min(lo + self.chunk, self.count)


def layout(count: int, num_shards: int) -> ShardLayout:
  """The layout of ``count`` parameters over ``num_shards`` shards; each shard owns at least one parameter."""
  num_shards = validation.check_int(_WHAT, "num_shards", num_shards)
  if num_shards > count:
    raise validation.invalid(
      _WHAT, "num_shards", num_shards, f"at most the model's {count} parameters (one slice per shard)"
    )
  return ShardLayout(int(count), num_shards)


def shard_devices(num_shards: int, devices=None) -> list:
  """One device per shard: the first device of each of processes ``0 .. num_shards - 1``.

  With ``devices`` given (a test on one process with several host devices),
  its first ``num_shards``.
  """
  if devices is not None:
    devices = list(devices)[:num_shards]
    if len(devices) != num_shards:
      raise validation.invalid(_WHAT, "devices", len(devices), f"at least num_shards={num_shards} devices")
    return devices
  first = {}
  for device in jax.devices():
    if device.process_index < num_shards and device.process_index not in first:
      first[device.process_index] = device
  if len(first) != num_shards:
    raise validation.invalid(
      _WHAT, "num_shards", num_shards, f"at most the run's {jax.process_count()} processes (one per shard)"
    )
  return [first[p] for p in range(num_shards)]


class ShardedState:
  """Moves the server's state between the host (one array per field) and the shards' mesh (sliced).

  Which fields hold the parameters' axis is found from their shapes: a field
  whose shape follows the parameter count (the parameters, the rule's
  per-parameter state, EA-wild's reads, a round's sum) is sliced along that
  axis, every other field is replicated.

  Args:
    init_flat: ``flat parameters -> the server's state`` on raveled parameters.
    layout: the slices.
    devices: one device per shard (:func:`shard_devices`).
  """

  def __init__(self, init_flat, layout: ShardLayout, devices, dtype):
    self.layout = layout
    self.mesh = Mesh(np.asarray(devices), (AXIS,))
    self.replicated = NamedSharding(self.mesh, P())
    self.sliced = NamedSharding(self.mesh, P(AXIS))
    shape = lambda n: jax.eval_shape(init_flat, jax.ShapeDtypeStruct([n], dtype))  # noqa: E731
    self.axes = jax.tree.map(_param_axis, shape(layout.count), shape(layout.count + 1))
    self.shardings = jax.tree.map(self._sharding, self.axes)
    # What a server step returns (:class:`server_step.ServerStep`): the state as it came, the record
    # and the workers to reply to replicated, the reply sliced.
    self.step_shardings = (self.shardings, self.replicated, self.replicated, self.sliced)
    self._gather = jax.jit(lambda x: x, out_shardings=self.replicated)
    mine = [i for i, d in enumerate(devices) if d.process_index == jax.process_index()]
    self.local_shards = mine  # the shards this process serves (one, but for a one-process test)

  def _sharding(self, axis: int) -> NamedSharding:
    if axis < 0:
      return self.replicated
    return NamedSharding(self.mesh, P(*([None] * axis), AXIS))

  def to_mesh(self, flat_state: Any) -> Any:
    """A host state (raveled parameters, unpadded) -> the same state on the mesh, padded and sliced."""

    def put(x, axis, sharding):
      x = np.asarray(x)
      if axis >= 0:
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, self.layout.padded - x.shape[axis])
        x = np.pad(x, pad)
      return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(put, flat_state, self.axes, self.shardings)

  def to_host(self, state: Any) -> Any:
    """The state on the mesh -> NumPy arrays on this host, the padding cut off (an all-gather of the slices)."""

    def get(x, axis):
      if axis >= 0:
        x = self._gather(x)
      x = np.asarray(x.addressable_data(0))
      if axis >= 0:
        x = np.take(x, np.arange(self.layout.count), axis=axis)
      return x

    return jax.tree.map(get, state, self.axes)

  def scalar(self, value, dtype) -> jax.Array:
    """A scalar every shard passes alike, as a replicated array of the mesh."""
    value = np.asarray(value, dtype)
    return jax.make_array_from_callback((), self.replicated, lambda index: value)

  def slices(self, pieces: dict[int, np.ndarray]) -> jax.Array:
    """A ``[padded]`` array on the mesh from this process's slices (``shard -> chunk`` elements, padded)."""
    devices = self.mesh.devices.reshape(-1)
    arrays = [jax.device_put(pieces[s], devices[s]) for s in self.local_shards]
    return jax.make_array_from_single_device_arrays((self.layout.padded,), self.sliced, arrays)

  def local_slice(self, x: jax.Array, shard: int) -> np.ndarray:
    """Shard ``shard``'s real slice of a sliced ``[padded]`` array (a NumPy view, no copy)."""
    lo, hi = self.layout.bounds(shard)
    for piece in x.addressable_shards:
      start = piece.index[0].start or 0
      if start == shard * self.layout.chunk:
        return np.asarray(piece.data)[: hi - lo]
    raise ValueError(f"{_WHAT}: shard {shard} is not on this process")


def _param_axis(a: jax.ShapeDtypeStruct, b: jax.ShapeDtypeStruct) -> int:
  """The axis along which a field grows with the parameter count (-1: it does not)."""
  for axis, (m, n) in enumerate(zip(a.shape, b.shape)):
    if m != n:
      return axis
  return -1


# -- the leader's commands ---------------------------------------------------------------------


class Op(enum.IntEnum):
  """An event the leading shard orders every shard to apply (each is one state change of the server)."""

  ARRIVE = 1  # a worker's message (its slice is on each shard): the mode's step
  LOCAL_STEP = 2  # an elastic worker's local step (no payload)
  JOIN = 3  # a worker (re)joins: it is sent the parameters
  DROP = 4  # workers left or were lost (``mask``)
  RELEASE = 5  # every live worker waits on lost ones: release them
  CLOSE_ROUND = 6  # the open round closes with the gradients it has (its workers are lost)
  LATE = 7  # a message that is never applied (too late), counted
  END = 8  # the leader's ``advance`` is over: return
  ABORT = 9  # the leader failed: stop with its message


_COMMAND = struct.Struct("<Biqqfff?Q")


@dataclasses.dataclass(frozen=True)
class Command:
  """One event, as the leader sends it to the other shards (a fixed struct; ABORT adds a message)."""

  op: Op
  worker: int = 0
  version: int = 0
  step: int = 0
  loss: float = 0.0
  step_size: float = 0.0
  now: float = 0.0
  finite: bool = True
  mask: int = 0  # DROP: bit k set for worker k
  message: str = ""

  def encode(self) -> list[bytes]:
    fields = _COMMAND.pack(
      int(self.op), self.worker, self.version, self.step, self.loss, self.step_size, self.now,
      self.finite, self.mask,
    )  # fmt: skip
    return [fields, self.message.encode()]

  @staticmethod
  def decode(frames: list[bytes]) -> Command:
    op, worker, version, step, loss, step_size, now, finite, mask = _COMMAND.unpack(bytes(frames[0]))
    message = bytes(frames[1]).decode() if len(frames) > 1 else ""
    return Command(Op(op), worker, version, step, loss, step_size, now, finite, mask, message)

  def gone(self, num_workers: int) -> np.ndarray:
    """DROP's workers as ``bool[K]``."""
    return np.asarray([(self.mask >> k) & 1 for k in range(num_workers)], bool)

  @staticmethod
  def mask_of(gone) -> int:
    return sum(1 << int(k) for k in np.nonzero(np.asarray(gone))[0])


def key_address(shard: int) -> str:
  """The coordination-service key under which shard ``shard`` publishes its data-plane address."""
  return "jaxsync/server/address" if shard == 0 else f"jaxsync/server/address/{shard}"


def key_commands(shard: int) -> str:
  """The key of shard ``shard``'s (``>= 1``) command address, which the leader connects to."""
  return f"jaxsync/server/commands/{shard}"
