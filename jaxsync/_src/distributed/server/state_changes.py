"""Each change of the server's state, made on every shard and answered: what a decided event turns into.

A single server applies a change straight to its state (:mod:`compiled_steps`).
A sharded server's leader first sends it to the other shards as a
:class:`shards.Command`, and each other shard applies the commands it
receives in the leader's order (:meth:`StateChanges.apply`). Every shard then
replies to the workers the change names, with its slice of the parameters;
InHAD's nodes get each version once (:mod:`node_pulls`), their workers a
PARAMS directive naming it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxsync._src.distributed import wire
from jaxsync._src.distributed.server import server_step, shards
from jaxsync._src.distributed.server.compiled_steps import CompiledSteps
from jaxsync._src.distributed.server.node_pulls import NodePulls
from jaxsync._src.distributed.server.server_step import ServerState
from jaxsync._src.distributed.server.transport import Transport
from jaxsync._src.steps.records import EventRecord


class StateChanges:
  """The server's state changes on one shard: ordered (leading a sharded server), applied, replied to.

  Args:
    steps: this process's compiled steps.
    transport: its data plane.
    mode: the strategy's :func:`server_step.mode`.
    num_workers, dtype: the worker processes, and the parameters' dtype.
    leader, follower: this shard's side of a sharded server's command stream (both None: a single server).
    nodes: InHAD's node aggregators (None: the workers are answered themselves).
  """

  def __init__(
    self,
    steps: CompiledSteps,
    transport: Transport,
    *,
    mode: str,
    num_workers: int,
    dtype: str,
    leader: shards.Leader | None,
    follower: shards.Follower | None,
    nodes: NodePulls | None,
  ):
    self._steps, self._transport, self._mode, self._num_workers, self._dtype = (
      steps,
      transport,
      mode,
      num_workers,
      dtype,
    )
    self._leader, self._follower, self._nodes = leader, follower, nodes

  def _order(self, op: shards.Op, **fields) -> None:
    """A sharded server's leader sends the other shards the change it is about to apply."""
    if self._leader is not None:
      self._leader.order(shards.Command(op, **fields))

  # -- the changes ----------------------------------------------------------------------------------

  def arrival(self, state, payload, *, worker, version, step, loss, step_size, finite, now):
    """A worker's message (``payload`` on the device) through the mode's step; replies to whom it names.

    Returns:
      ``(state, record or None, send)``: no record while a round stays open; ``send``, the workers answered.
    """
    self._order(
      shards.Op.ARRIVE, worker=worker, version=version, step=step, loss=loss, step_size=step_size,
      finite=finite, now=now,
    )  # fmt: skip
    state, row, send, reply = self._steps.arrive(
      state, worker, payload, finite=finite, loss=loss, step_size=step_size, now=now
    )
    if send.any():
      self._reply(state, np.nonzero(send)[0], reply)
    return state, row, send

  def local_step(self, state, *, worker, version, step, loss, finite, now) -> tuple[ServerState, EventRecord]:
    """An elastic worker's local step (no payload, no reply); returns (state, record)."""
    self._order(
      shards.Op.LOCAL_STEP, worker=worker, version=version, step=step, loss=loss, finite=finite, now=now
    )
    return self._steps.local_step(state, worker, finite=finite, loss=loss, now=now)

  def join(self, state: ServerState, worker: int, now: float = 0.0) -> ServerState:
    """Worker ``worker`` (re)joins: it is sent the current parameters, now or, with elastic membership and
    a round under way, when that round closes (:func:`server_step.joins_next_round`)."""
    self._order(shards.Op.JOIN, worker=worker, now=now)
    counters = self._steps.counters
    wait = server_step.joins_next_round(self._steps.strategy, counters.live, counters.waiting, worker)
    state = self._steps.join(state, worker, wait=wait, now=now)
    if not wait:
      self._reply(state, [worker], self._steps.reply_payload(state))
    return state

  def drop(self, state: ServerState, gone: np.ndarray) -> ServerState:
    """Workers ``gone`` (``bool[K]``) left or were lost."""
    self._order(shards.Op.DROP, mask=shards.Command.mask_of(gone))
    return self._steps.drop(state, gone)

  def release(self, state: ServerState, now: float) -> ServerState:
    """Every waiting worker is sent the current parameters (no live worker could release them)."""
    self._order(shards.Op.RELEASE, now=now)
    state, send = self._steps.release(state, now)
    self._reply(state, np.nonzero(send)[0], self._steps.reply_payload(state))
    return state

  def close_round(self, state: ServerState, now: float) -> tuple[ServerState, EventRecord]:
    """The open round closes with the gradients it has; every live worker is sent the next round."""
    self._order(shards.Op.CLOSE_ROUND, now=now)
    state, row, send, reply = self._steps.close_round(state, now)
    self._reply(state, np.nonzero(send)[0], reply)
    return state, row

  def late(self, state: ServerState, worker: int) -> ServerState:
    """A message of ``worker`` that is never applied (too late): counted."""
    self._order(shards.Op.LATE, worker=worker)
    return self._steps.late(state, worker)

  def apply(self, state: ServerState, command: shards.Command, payload) -> tuple[ServerState, Any]:
    """A follower's: the leader's ``command`` (``payload``: this shard's slice of an ARRIVE's message);
    returns (state, record or None)."""
    op, worker, now = command.op, command.worker, command.now
    fields = dict(worker=worker, version=command.version, step=command.step, loss=command.loss, now=now)
    if op == shards.Op.ARRIVE:
      message = self._steps.payload(payload)
      return self.arrival(state, message, step_size=command.step_size, finite=command.finite, **fields)[:2]
    if op == shards.Op.LOCAL_STEP:
      return self.local_step(state, finite=command.finite, **fields)
    if op == shards.Op.CLOSE_ROUND:
      return self.close_round(state, now)
    if op == shards.Op.JOIN:
      return self.join(state, worker, now), None
    if op == shards.Op.DROP:
      return self.drop(state, command.gone(self._num_workers)), None
    if op == shards.Op.RELEASE:
      return self.release(state, now), None
    return self.late(state, worker), None  # shards.Op.LATE

  # -- replies ------------------------------------------------------------------------------------

  def send(self, worker: int, header: wire.Header, payload=None) -> None:
    """Sends worker ``worker`` a message (through its node, for InHAD: a directive without the payload)."""
    if self._nodes is not None:
      payload = None  # a directive: the node answers with its copy of the version the header names
    if not self._transport.send(worker, header, payload) and self._follower is not None:
      self._follower.keep_unsent(worker, header, payload)  # its HELLO to this shard is on its way

  def _params_header(self, worker: int) -> wire.Header:
    counters = self._steps.counters
    # In rounds every worker computes the round's batches (the simulator's round), sent or not: the
    # round's number-th, or a local round's H from its number times H on.
    step = counters.event * self._steps.round_steps if self._mode == "rounds" else counters.steps[worker]
    return wire.Header(
      kind=wire.Kind.PARAMS,
      token=self._transport.token,
      worker=worker,
      version=int(counters.pulled_version[worker]),
      step=int(step),
      noise_ratio=float(counters.noise_ratio[worker]),
      dtype=self._dtype,
      count=self._steps.slice_count,
    )

  def _reply(self, state: ServerState, workers, reply) -> None:
    """Sends ``workers`` the step's ``reply`` (``None``: the parameters themselves)."""
    if self._nodes is not None:  # directives; the parameters cross only in a node's first copy of a version
      self._nodes.broadcast(self._steps.counters.version, lambda: self._steps.host_reply(state, reply))
      payload = None
    else:
      payload = self._steps.host_reply(state, reply)
    for w in workers:
      self.send(int(w), self._params_header(int(w)), payload)
