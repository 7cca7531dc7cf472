"""A message to the server, checked: decoded field by field, then held against the server's counters.

Each check raises :class:`wire.MessageError` with one of :data:`wire.REASONS`:
``malformed``, ``token``, ``dtype`` and ``shape`` come from decoding
(:func:`decode`, :func:`wire.decode_header`, :func:`wire.decode_payload`);
``worker`` from who sent it (:func:`check_sender`); ``future_version`` and
``version`` from the counters (:func:`is_late`), which the host keeps
(:class:`counters.HostCounters`), so a check reads nothing off the device.
A NaN or Inf in a payload is not a rejection here: the compiled step checks
the payload itself and records a rejected arrival.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxsync._src.distributed import wire
from jaxsync._src.distributed.server.counters import HostCounters


def decode(frames, *, token: bytes, dtype: str, count: int, num_workers: int) -> tuple[wire.Header, Any]:
  """A routed message's header and payload (``count`` elements: this shard's slice), checked field by
  field."""
  if len(frames) < 2:
    raise wire.MessageError("malformed", "an empty message")
  header = wire.decode_header(frames[1], token=token)
  payload = wire.decode_payload(header, frames[2:], dtype=dtype, count=count)
  if not 0 <= header.worker < num_workers:
    raise wire.MessageError("worker", f"worker={header.worker}; expected 0..{num_workers - 1}")
  return header, payload


def check_sender(header: wire.Header, registered: int | None) -> None:
  """The header names the worker whose HELLO registered its connection (``registered``; None: no one's)."""
  if registered != header.worker:
    raise wire.MessageError(
      "worker", f"worker={header.worker} from a connection registered as {registered!r}"
    )


def check_kind(header: wire.Header, expected: wire.Kind, receiver: str) -> None:
  """The message is the kind the ``receiver`` (e.g. ``"a gradient server"``) takes from a worker."""
  if header.kind != expected:
    raise wire.MessageError("malformed", f"a {header.kind.name} message sent to {receiver}")


def is_late(header: wire.Header, worker: int, counters: HostCounters, *, rounds: bool) -> bool:
  """Holds a message's version against the counters; True for a gradient of a round that closed without it,
  or of the open round from a worker whose message of it is in already.

  A late gradient is no rejection: it is dropped and counted (:func:`server_step.late`),
  never applied to another round.
  """
  current = counters.current(rounds=rounds)
  if header.version > current:
    raise wire.MessageError("future_version", f"version={header.version} but the server is at {current}")
  if rounds and header.version < current:
    return True
  if rounds and counters.waiting[worker]:
    # Its message of the open round is in the sum already (it waits for the close): a second one from the
    # same worker (a restarted process's, or its predecessor's) would count twice: dropped, as a late one.
    return True
  pulled = int(counters.pulled_version[worker])
  if header.version != pulled:
    raise wire.MessageError("version", f"version={header.version} but worker {worker} was sent {pulled}")
  return False


def check_sum(
  header: wire.Header, frames, node: int | None, *, wanted: dict[int, int], pull: int, dtype: str, count: int
) -> np.ndarray:
  """A node's SUM for pull number ``pull``: from a node it asked (``wanted``: node -> gradients counted),
  of as many gradients as it counted; returns the payload."""
  if node not in wanted or header.version != pull:
    raise wire.MessageError("version", f"a sum for pull {header.version} from node {node} during pull {pull}")
  payload = wire.decode_payload(header, frames, dtype=dtype, count=count)
  if header.step != wanted[node]:
    raise wire.MessageError("shape", f"a sum of {header.step} gradient(s); the server counted {wanted[node]}")
  return payload
