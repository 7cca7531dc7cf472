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

Shard 0 leads (:class:`Leader`): it takes the workers' headers, checks them,
orders the run's events and sends each shard the event to apply next
(:class:`Command`, on a ZeroMQ PUSH socket per shard) before it applies it;
every other shard follows (:class:`Follower`): it applies the same events in
the same order to its slice, and replies to the workers with its slice.

The server's state on the host (what ``advance`` returns and a checkpoint
holds) is the single server's except for the rule's state, which is that of
the raveled parameters (so a sharded run's checkpoint resumes with any
number of shards, but not on a single server).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import struct
import time
from typing import Any, NamedTuple

import jax
import numpy as np
import zmq
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxsync._src.core import validation
from jaxsync._src.distributed import wire
from jaxsync._src.distributed.cluster import heartbeat_timeout
from jaxsync._src.distributed.server import checks
from jaxsync._src.distributed.server.transport import Transport

log = logging.getLogger("jaxsync.server")

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
  STOP = 10  # the leader stopped on a preemption notice, its checkpoint written: stop too


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


# -- the leader and its followers --------------------------------------------------------------


class Leader:
  """The leading shard's side of the command stream: a PUSH socket to each other shard.

  Connects once every other shard has published its command address (:func:`key_commands`).
  """

  def __init__(self, client: Any, num_shards: int):
    self._sockets = []
    for shard in range(1, num_shards):
      push = zmq.Context.instance().socket(zmq.PUSH)
      push.setsockopt(zmq.LINGER, 1000)
      push.connect(client.blocking_key_value_get(key_commands(shard), 300_000))
      self._sockets.append(push)

  def order(self, command: Command) -> None:
    """Sends ``command`` to every other shard (before the leader applies it: they apply it in this order)."""
    for socket in self._sockets:
      socket.send_multipart(command.encode())

  def close(self) -> None:
    for socket in self._sockets:
      socket.close(linger=1000)


class Follower:
  """A shard that follows the leader: its commands in order, each worker's slice kept until its command comes.

  A worker pushes each shard its slice on a connection of its own, so a
  follower may see a push's command before its slice, a slice before its
  command, and a JOIN's reply before the worker's HELLO (kept until it comes).

  Args:
    shard: this process's shard (``>= 1``).
    transport: this shard's data plane (the workers' slices and HELLOs come on it).
    chunk: a slice's elements, padded (:attr:`ShardLayout.chunk`).
    num_workers, dtype: the workers, and the parameters' dtype.
    decode: ``frames -> (header, slice)``, checked (:func:`checks.decode`).
  """

  def __init__(self, shard: int, transport: Transport, chunk: int, num_workers: int, dtype, decode):
    self.shard, self._transport, self._decode = shard, transport, decode
    self._slots = {w: wire.aligned_zeros(chunk, dtype) for w in range(num_workers)}
    self._slot_headers: dict[int, tuple[int, int]] = {}
    self._unsent: dict[int, list] = {}  # replies to workers whose HELLO has not come yet
    self._commands = zmq.Context.instance().socket(zmq.PULL)
    self._commands.setsockopt(zmq.LINGER, 0)
    self._poller = zmq.Poller()
    self._poller.register(transport.socket, zmq.POLLIN)
    self._poller.register(self._commands, zmq.POLLIN)

  def open(self, client: Any) -> None:
    """Binds the command socket and publishes its address for the leader (:func:`key_commands`)."""
    client.key_value_set(key_commands(self.shard), self._transport.bind(self._commands), allow_overwrite=True)

  def close(self) -> None:
    self._commands.close(linger=1000)

  def next_command(self, idle_timeout: float) -> tuple[Command | None, np.ndarray | None]:
    """The leader's next command and, for an ARRIVE, this shard's slice of its message (padded).

    Keeps the workers' slices and HELLOs that come meanwhile. ``(None, None)``
    when no command came for ``idle_timeout`` seconds (the leader is lost).
    """
    quiet_since = time.perf_counter()
    while True:
      ready = dict(self._poller.poll(100))
      if self._transport.socket in ready:
        self._keep(self._transport.receive())
      if self._commands in ready:
        break
      if time.perf_counter() - quiet_since > idle_timeout:
        return None, None
    command = Command.decode(self._commands.recv_multipart())
    return command, self._slice_for(command) if command.op == Op.ARRIVE else None

  def keep_unsent(self, worker: int, header: wire.Header, payload) -> None:
    """A reply to a worker whose HELLO to this shard is on its way: sent when the HELLO comes."""
    self._unsent[worker] = [header, None if payload is None else np.array(payload)]

  def _keep(self, frames) -> None:
    """A worker's message: HELLO registers it; a push's slice waits for its command."""
    identity = frames[0].bytes
    worker = self._transport.worker_of(identity)
    try:
      header, payload = self._decode(frames)
      if header.kind == wire.Kind.HELLO:
        self._transport.register(identity, header.worker)
        waiting = self._unsent.pop(header.worker, None)
        if waiting is not None:
          self._transport.send(header.worker, *waiting)
        return
      checks.check_sender(header, worker)
      checks.check_kind(header, wire.Kind.PUSH, f"shard {self.shard}")
    except wire.MessageError as err:
      self._transport.reject(identity, err.reason, str(err), worker)
      return
    self._slots[worker][: payload.size] = payload
    self._slot_headers[worker] = (header.version, header.step)

  def _slice_for(self, command: Command) -> np.ndarray:
    """This shard's slice of the message the leader ordered applied: it came, or comes within the timeout.

    A slice that never comes (its worker died between its pushes to the
    shards) or was rejected here becomes NaN: the step's NaN/Inf check, global
    over the shards, rejects the whole message on every shard alike.
    """
    worker, wanted = command.worker, (command.version, command.step)
    deadline = time.perf_counter() + heartbeat_timeout()
    while self._slot_headers.get(worker) != wanted and time.perf_counter() < deadline:
      if self._transport.poll(100):
        self._keep(self._transport.receive())
    slot = self._slots[worker]
    if self._slot_headers.pop(worker, None) != wanted:
      log.warning(
        "shard %d: worker %d's slice of version %d never came: the message is rejected",
        self.shard,
        worker,
        command.version,
      )
      slot = np.full_like(slot, np.nan)
    return slot
