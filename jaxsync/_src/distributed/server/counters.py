"""The server's counters, mirrored on the host: what a worker's message is checked against and a reply says.

Checking a push reads the server's version (or round), the version its
sender was last sent and whether the sender is live; a reply names the
version, the data step and the noise ratio. Read off the device state, that
was three transfers per push and three per reply, each waiting for the
step before. The host keeps them instead, exactly:

* a step that decides something (an arrival, an elastic local step, a
  release, a round's close) returns its new counters packed into one small
  ``int32`` vector (:func:`pack`), read together with the workers it
  replies to: one transfer per step, where reading the reply's recipients
  alone was one already;
* a state change whose effect the host knows (a join, a drop, a late
  message) is applied to the mirror by the host itself, as
  :mod:`server_step` applies it to the state: no transfer at all.

The mirror is read off the state once per ``advance`` (:meth:`HostCounters.of`),
since a state handed in may be a restored one.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxsync._src.distributed.server.server_step import ServerState

_SCALARS = ("version", "event")
_PER_WORKER = {  # the per-worker counters, in their order in a packed vector, and their dtypes on the host
  "pulled_version": np.int32,
  "steps": np.int32,
  "noise_ratio": np.float32,
  "live": bool,
  "waiting": bool,
}


def host_value(x) -> np.ndarray:
  """A (replicated) array's value on this host, without a computation the other shards would have to join."""
  if isinstance(x, jax.Array):
    return np.asarray(x.addressable_data(0))
  return np.asarray(x)


def pack(state: ServerState, send: jax.Array) -> jax.Array:
  """The counters of ``state`` and the workers ``send`` names, as one ``int32`` vector (inside a step).

  The noise ratio's float32 bits travel as they are, so the host reads back exactly the state's value.
  """

  def as_int32(x):
    return jax.lax.bitcast_convert_type(x, jnp.int32) if x.dtype == jnp.float32 else x.astype(jnp.int32)

  scalars = jnp.stack([getattr(state, name) for name in _SCALARS]).astype(jnp.int32)
  per_worker = [as_int32(getattr(state, name)) for name in _PER_WORKER]
  return jnp.concatenate([scalars, *per_worker, send.astype(jnp.int32)])


@dataclasses.dataclass
class HostCounters:
  """The state's counters on the host (see the module docstring); arrays are ``[K]``, one entry per worker.

  Attributes:
    version: server updates so far.
    event: arrivals so far (rounds, for a ``"rounds"`` server).
    pulled_version: the version each worker was last sent.
    steps: gradients each worker sent (its data step).
    noise_ratio: the noise ratio each worker was last sent (BB).
    live: workers not lost.
    waiting: the server's waiting set.
  """

  version: int
  event: int
  pulled_version: np.ndarray
  steps: np.ndarray
  noise_ratio: np.ndarray
  live: np.ndarray
  waiting: np.ndarray

  @classmethod
  def of(cls, state: ServerState) -> HostCounters:
    """The counters of ``state`` (on the device, on the shards' mesh or on the host), read once."""
    scalars = {name: int(host_value(getattr(state, name))) for name in _SCALARS}
    per_worker = {name: host_value(getattr(state, name)).copy() for name in _PER_WORKER}
    return cls(**scalars, **per_worker)

  def take(self, packed) -> np.ndarray:
    """Takes a step's counters (:func:`pack`, read in one transfer); returns the workers it replies to."""
    packed = host_value(packed).copy()  # the mirror's arrays are written in place
    self.version, self.event = (int(x) for x in packed[: len(_SCALARS)])
    *per_worker, send = np.split(packed[len(_SCALARS) :], len(_PER_WORKER) + 1)
    for (name, dtype), value in zip(_PER_WORKER.items(), per_worker):
      setattr(self, name, value.view(dtype) if dtype == np.float32 else value.astype(dtype))
    return send.astype(bool)

  # The effects of :func:`server_step.join`, :func:`~server_step.drop` and :func:`~server_step.late`.

  def join(self, worker: int, *, rounds: bool, wait: bool = False) -> None:
    self.live[worker], self.waiting[worker] = True, wait
    self.pulled_version[worker] = self.event if rounds else self.version

  def drop(self, gone: np.ndarray, *, rounds: bool) -> None:
    self.live &= ~gone
    if not rounds:  # a round's delivered marks stay until it closes (server_step.drop)
      self.waiting &= ~gone

  def late(self, worker: int, data_steps: int) -> None:
    self.steps[worker] += data_steps

  def current(self, *, rounds: bool) -> int:
    """The newest version a worker's message may name: the open round's number, or the server's version."""
    return self.event if rounds else self.version
