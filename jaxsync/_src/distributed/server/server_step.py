"""The parameter server's compiled steps, pure and apart from any transport.

The multi-process runtime's server (``dist.param_server``) receives a worker's
message on a socket and hands it to one of three steps, by the strategy's
:func:`mode`; everything it decides (the new parameters, who gets them, the
record of the event) is decided here, by the same :mod:`arrival` and
:mod:`sync_round` functions the simulator runs:

* ``"gradient"`` (asynchronous gradient strategies): :func:`arrive`, one
  push through the server rule and the dispatch policy;
* ``"elastic"`` (EASGD, EAMSGD, EA-wild): :func:`elastic_step`, a worker's
  local step (a record, no payload) or its elastic exchange (the centre takes
  the worker's model);
* ``"rounds"`` (synchronous strategies served by the server, e.g.
  ``fastest_k``): :func:`round_arrive`, the first ``k`` gradients of a round
  are summed and the round closes; later ones of that round are dropped.

The other state changes of a real server (a worker joins, leaves, or is lost;
waiting workers are released when no live worker can release them) are pure
functions too, so the whole server can be tested without a socket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from jaxsync._src.rules import contracts, guard
from jaxsync._src.steps import arrival, sync_round
from jaxsync._src.steps.records import EvalSchedule, EventRecord
from jaxsync._src.strategies.strategy import Communication, Engine, Strategy, WorkerProtocol

MODES = ("gradient", "elastic", "rounds")


def mode(strategy: Strategy) -> str | None:
  """Which of :data:`MODES` serves ``strategy`` on a parameter server (None: the server cannot).

  Asynchronous gradient strategies arrive one push at a time; elastic ones
  exchange models (an EA-wild group of ``G`` workers is one worker process,
  :attr:`Strategy.num_units`); synchronous gradient strategies whose workers
  talk to a parameter server run in rounds (``fastest_k`` drops the slowest), and so do local
  strategies with elastic membership (DiLoCo's rounds average whoever delivered).
  """
  if strategy.engine == Engine.ASYNC and strategy.protocol in (WorkerProtocol.GRADIENT, WorkerProtocol.LOCAL):
    return "gradient"  # a local worker's push is its pseudo-gradient, applied as a gradient
  if strategy.engine == Engine.ASYNC and strategy.protocol == WorkerProtocol.ELASTIC:
    return "elastic"
  if (
    strategy.engine == Engine.SYNC
    and strategy.protocol in (WorkerProtocol.GRADIENT, WorkerProtocol.LOCAL)
    and strategy.communication == Communication.PARAMETER_SERVER
  ):
    return "rounds"  # fastest-k's gradients, or elastic DiLoCo's pseudo-gradients
  return None


def _local(strategy: Strategy) -> bool:
  return strategy.protocol == WorkerProtocol.LOCAL


def data_steps(strategy: Strategy, worker: jax.Array) -> jax.Array:
  """Data steps one message of ``worker`` stands for: 1 gradient, or a local worker's local steps."""
  if not _local(strategy):
    return jnp.asarray(1, jnp.int32)
  return jnp.asarray(strategy.local_steps_per_unit, jnp.int32)[worker]


def round_complete(strategy: Strategy, count: jax.Array, live: jax.Array, waiting: jax.Array) -> jax.Array:
  """Whether the open round closes without a deadline: it has its ``k`` gradients (``min(k, live)``); with
  elastic membership, every live worker delivered and at least ``quorum`` did.

  Works on the device state and on the host's mirror alike (JAX or NumPy arrays).
  """
  if strategy.elastic_membership:
    delivered = (live & ~waiting).sum() == 0
    return (count >= strategy.quorum) & delivered
  return count >= jnp.minimum(strategy.gradients_per_round, live.sum())


class RoundSum(NamedTuple):
  """The open round of a ``"rounds"`` server (:func:`round_arrive`).

  Attributes:
    grads: the sum of the round's gradients so far, raveled.
    loss: the sum of their batch losses.
    count: gradients in the sum.
  """

  grads: jax.Array
  loss: jax.Array
  count: jax.Array


class ServerState(NamedTuple):
  """The server's whole state (what a checkpoint holds).

  Attributes:
    clock: wall seconds of the last event since the run started (summed over resumes).
    params: the server parameters.
    rule_state: the server rule's state.
    version: server updates so far.
    pending: accepted arrivals since the last update.
    steps: gradients each worker sent (its data step: a batch is a function of it).
    used: gradients of each worker the rule accepted.
    idle: wall seconds each worker waited in the server's waiting set.
    pulled_version: the version each worker was last sent.
    noise_ratio: the noise ratio each worker was last sent (BB).
    waiting: the server's waiting set ``C``.
    live: workers not lost.
    wait_since: when each worker entered the waiting set.
    inter_messages: full-size messages moved (pushes and replies).
    next_eval: the next evaluation point.
    event: arrivals so far (rounds, for a ``"rounds"`` server).
    exchange: what the mode keeps besides: EA-wild's ``[K/G, P]`` centre each
      worker (or group of ``G``) last read (its lock-free reference), a :class:`RoundSum` for
      ``"rounds"``, else ``()``.
    dropped: messages never applied for coming too late: after their round
      closed (``"rounds"``), or from a worker declared lost (the host's call).
  """

  clock: jax.Array
  params: Any
  rule_state: Any
  version: jax.Array
  pending: jax.Array
  steps: jax.Array
  used: jax.Array
  idle: jax.Array
  pulled_version: jax.Array
  noise_ratio: jax.Array
  waiting: jax.Array
  live: jax.Array
  wait_since: jax.Array
  inter_messages: jax.Array
  next_eval: jax.Array
  event: jax.Array
  exchange: Any = ()
  dropped: Any = 0


class ServerStep(NamedTuple):
  """What one arrival at the server produces.

  Attributes:
    state: the new server state.
    record: the event's record (``time`` in wall seconds).
    send: ``bool[K]``, the workers that get the reply now.
    reply: the reply's payload when it is not the new parameters themselves
      (SMEGA²'s look-ahead estimate; the centre before the exchange for
      locked EASGD), raveled; ``None`` when it is them: the host sends the
      parameters' own buffers, leaf by leaf, instead of a raveled copy (one
      more pass over the parameters per step). Empty when nobody is sent
      anything.
  """

  state: ServerState
  record: EventRecord
  send: jax.Array
  reply: jax.Array | None


def init(strategy: Strategy, params: Any, schedule: EvalSchedule) -> ServerState:
  """The state before the first arrival: every worker will get ``params`` (version 0)."""
  num_workers = strategy.num_units
  zeros = jnp.zeros([num_workers], jnp.int32)
  flat = ravel_pytree(params)[0]
  exchange = ()
  if mode(strategy) == "rounds":
    exchange = RoundSum(jnp.zeros_like(flat), jnp.zeros([], jnp.float32), jnp.zeros([], jnp.int32))
  elif mode(strategy) == "elastic" and strategy.lock_free:
    exchange = jnp.broadcast_to(flat, (num_workers, flat.size))
  return ServerState(
    clock=jnp.zeros([], jnp.float32),
    params=params,
    rule_state=contracts.init_server_rule(strategy.server_rule, params, strategy.worker_rule),
    version=jnp.zeros([], jnp.int32),
    pending=jnp.zeros([], jnp.int32),
    steps=zeros,
    used=zeros,
    idle=jnp.zeros([num_workers], jnp.float32),
    pulled_version=zeros,
    noise_ratio=jnp.zeros([num_workers], jnp.float32),
    waiting=jnp.zeros([num_workers], jnp.bool_),
    live=jnp.ones([num_workers], jnp.bool_),
    wait_since=jnp.zeros([num_workers], jnp.float32),
    inter_messages=jnp.zeros([], jnp.int32),
    next_eval=schedule.first_due(),
    event=jnp.zeros([], jnp.int32),
    exchange=exchange,
    dropped=jnp.zeros([], jnp.int32),
  )


def reply_payload(state: ServerState) -> jax.Array | None:
  """What a worker is sent when it is not ``state.params`` (SMEGA²'s look-ahead estimate), raveled.

  ``None`` when the reply is the parameters themselves (most rules): the host
  sends their leaves as they are, without raveling them into a copy.
  """
  return _raveled_unless(contracts.reply_params(state.params, state.rule_state), state.params)


def _raveled_unless(reply: Any, params: Any) -> jax.Array | None:
  return None if reply is params else ravel_pytree(reply)[0]


def arrive(
  strategy: Strategy,
  schedule: EvalSchedule,
  metric_names: tuple[str, ...],
  unravel: Callable[[jax.Array], Any],
  s: ServerState,
  worker: jax.Array,
  flat: jax.Array,
  worker_finite: jax.Array,
  loss: jax.Array,
  step_size: jax.Array,
  now: jax.Array,
) -> ServerStep:
  """One push from ``worker``: the server rule, the dispatch policy, the record, the reply.

  ``theta, s = server_rule(m, s, theta; version, live workers)`` on the
  unraveled message ``m`` (:func:`arrival.server_arrival`), then
  :func:`arrival.dispatch` over the live workers. The sender's NaN/Inf verdict
  is not trusted: the message is checked here again.

  Args:
    strategy: an asynchronous ``"gradient"``-protocol strategy.
    schedule, metric_names: the evaluation schedule and the metrics it returns.
    unravel: flat array -> parameter tree.
    s: the server state.
    worker: the sender's id (int32 scalar).
    flat: its message, raveled.
    worker_finite: the sender's own NaN/Inf verdict.
    loss, step_size: its batch loss and its (BB) learning rate, recorded.
    now: wall seconds since the run started.

  Returns:
    A :class:`ServerStep`.
  """
  message = unravel(flat)
  finite = worker_finite & guard.tree_all_finite(message)  # never trust the sender's verdict
  arrived = arrival.server_arrival(
    strategy,
    s.params,
    s.rule_state,
    message,
    worker=worker,
    version=s.pulled_version[worker],
    pending=s.pending,
    num_live_workers=jnp.sum(s.live),
    finite=finite,
  )
  released, rejected = arrived.released, ~finite
  version = s.version + released.astype(jnp.int32)
  taken = data_steps(strategy, worker)  # its next data step follows them
  steps = s.steps.at[worker].add(taken)
  fresh = arrival.counts_as_fresh(strategy, s.pulled_version[worker], s.version)
  # A lost worker holds no one back (SSP's slowest clock is among the live).
  clocks = jnp.where(s.live, steps, jnp.iinfo(jnp.int32).max)
  send, waiting = arrival.dispatch(strategy, s.waiting & s.live, worker, clocks, released, fresh, rejected)
  sender = jnp.arange(strategy.num_units) == worker
  noise = contracts.noise_ratio(arrived.rule_state)
  evaluated, metrics, next_eval = schedule.maybe_evaluate(
    s.next_eval, arrived.params, version, now, metric_names
  )
  new = s._replace(
    clock=now,
    params=arrived.params,
    rule_state=arrived.rule_state,
    version=version,
    pending=arrived.pending,
    steps=steps,
    used=s.used.at[worker].add(finite.astype(jnp.int32) * taken),
    idle=s.idle + jnp.where(send & ~sender, now - s.wait_since, 0.0),
    pulled_version=jnp.where(send, version, s.pulled_version),
    noise_ratio=s.noise_ratio if noise is None else jnp.where(send, noise, s.noise_ratio),
    waiting=waiting,
    wait_since=jnp.where(sender & waiting, now, s.wait_since),
    inter_messages=s.inter_messages + 1 + jnp.sum(send).astype(jnp.int32),
    next_eval=next_eval,
    event=s.event + 1,
  )
  record = EventRecord(
    time=now,
    worker=worker,
    staleness=s.version - s.pulled_version[worker],
    version=version,
    released=released,
    k=arrived.k_used,
    loss=loss,
    rejected=rejected,
    step_size=step_size,
    evaluated=evaluated,
    metrics=metrics,
  )
  return ServerStep(new, record, send, reply_payload(new))


def elastic_step(
  strategy: Strategy,
  schedule: EvalSchedule,
  metric_names: tuple[str, ...],
  unravel: Callable[[jax.Array], Any],
  s: ServerState,
  worker: jax.Array,
  flat: jax.Array,
  worker_finite: jax.Array,
  loss: jax.Array,
  now: jax.Array,
  *,
  exchange: bool,
) -> ServerStep:
  r"""An elastic worker's step, as the simulator's elastic event: a local step, or an exchange with the centre.

  A local step (``exchange=False``) changes only the counters and makes the
  event's record: the worker stepped its own model. On an exchange the worker
  sent its pre-step model ``x`` (``flat``) and the centre takes it
  (:func:`arrival.elastic_center_arrival`):

  .. math::

    \tilde w \leftarrow \tilde w + \alpha (x - w_{ref})

  with ``w_ref`` the current centre (EASGD, EAMSGD: locked) or the centre this
  worker last read (EA-wild: lock-free). The reply is what the worker steps
  against: the centre before this exchange (locked: the worker's own half
  ``x <- x - alpha (x - w_ref)`` needs the same ``w_ref``), or the new centre,
  its next lock-free read. A non-finite ``x`` changes nothing.

  Args:
    strategy: an elastic strategy (:func:`mode` ``"elastic"``).
    schedule, metric_names, unravel: as for :func:`arrive`.
    s: the server state.
    worker: the sender's id.
    flat: its pre-step model, raveled (ignored for a local step).
    worker_finite: the sender's own NaN/Inf verdict on its gradient.
    loss: its batch loss, recorded.
    now: wall seconds since the run started.
    exchange: whether this is an exchange (static: two compiled steps).

  Returns:
    A :class:`ServerStep`; ``send`` names the sender on an exchange only.
  """
  sender = jnp.arange(strategy.num_units) == worker
  if exchange:
    model = unravel(flat)
    finite = worker_finite & guard.tree_all_finite(model)
    read = unravel(s.exchange[worker]) if strategy.lock_free else s.params
    params, rule_state = arrival.elastic_center_arrival(
      strategy, s.params, s.rule_state, model, exchanged=finite, center_read=read
    )
    released = finite
    reply_tree = params if strategy.lock_free else s.params
    reads = s.exchange
    if strategy.lock_free:
      reads = reads.at[worker].set(ravel_pytree(params)[0])
  else:
    finite, params, rule_state, released = worker_finite, s.params, s.rule_state, jnp.asarray(False)
    reply_tree, reads = None, s.exchange
  version = s.version + released.astype(jnp.int32)
  evaluated, metrics, next_eval = schedule.maybe_evaluate(s.next_eval, params, version, now, metric_names)
  send = sender & exchange
  new = s._replace(
    clock=now,
    params=params,
    rule_state=rule_state,
    version=version,
    pending=jnp.where(released, 0, s.pending + finite.astype(jnp.int32)),
    steps=s.steps.at[worker].add(1),
    used=s.used.at[worker].add(finite.astype(jnp.int32)),
    pulled_version=jnp.where(send, version, s.pulled_version),
    inter_messages=s.inter_messages + (2 if exchange else 0),
    next_eval=next_eval,
    event=s.event + 1,
    exchange=reads,
  )
  record = EventRecord(
    time=now,
    worker=worker,
    staleness=s.version - s.pulled_version[worker],
    version=version,
    released=released,
    k=released.astype(jnp.int32),  # one worker model per exchange
    loss=loss,
    rejected=~finite,
    step_size=jnp.asarray(jnp.nan, jnp.float32),
    evaluated=evaluated,
    metrics=metrics,
  )
  reply = _raveled_unless(reply_tree, params) if exchange else jnp.zeros([0], s.steps.dtype)
  return ServerStep(new, record, send, reply)


def round_arrive(
  strategy: Strategy,
  schedule: EvalSchedule,
  metric_names: tuple[str, ...],
  unravel: Callable[[jax.Array], Any],
  s: ServerState,
  worker: jax.Array,
  flat: jax.Array,
  worker_finite: jax.Array,
  loss: jax.Array,
  now: jax.Array,
) -> ServerStep:
  r"""A gradient of the open round arrives; the ``k``-th closes the round (``"rounds"`` mode).

  The caller has checked that it was computed on this round's parameters (a
  later one is dropped, never applied to another round). With ``k =
  strategy.gradients_per_round`` (fewer when fewer workers are live):

  .. math::

    \bar g = \tfrac{1}{k} \sum_{\text{first } k} g_j, \qquad
    \theta, s \leftarrow \text{server\_rule}(\bar g, s, \theta)

  (:func:`sync_round.apply_aggregate`, as the simulator's round). A NaN/Inf
  gradient is summed too, so the round is rejected as a whole, as the
  simulator rejects it. A closed round is one event and one record (no worker,
  ``k`` gradients); every live worker gets the new parameters and the next
  round's number (the version on the wire) and data step.

  Returns:
    A :class:`ServerStep`; ``send`` is empty until the round closes.
  """
  g = unravel(flat)
  finite = worker_finite & guard.tree_all_finite(g)
  grads = jnp.where(finite, flat, jnp.nan)  # an untrusted verdict still rejects the round
  acc = s.exchange
  acc = RoundSum(acc.grads + grads, acc.loss + loss, acc.count + 1)
  taken = data_steps(strategy, worker)
  s = s._replace(
    steps=s.steps.at[worker].add(taken),
    used=s.used.at[worker].add(taken),
    inter_messages=s.inter_messages + 1,
    exchange=acc,
    clock=now,
    waiting=s.waiting.at[worker].set(True),  # until the round closes (STOP reaches it there)
    wait_since=s.wait_since.at[worker].set(now),
  )
  close = round_complete(strategy, acc.count, s.live, s.waiting)
  return jax.lax.cond(
    close,
    lambda s: close_round(strategy, schedule, metric_names, unravel, s, now),
    lambda s: ServerStep(s, _empty_round_record(s, now, metric_names), jnp.zeros_like(s.live), _no_reply(s)),
    s,
  )


def close_round(
  strategy: Strategy,
  schedule: EvalSchedule,
  metric_names: tuple[str, ...],
  unravel: Callable[[jax.Array], Any],
  s: ServerState,
  now: jax.Array,
) -> ServerStep:
  """Applies the open round's mean gradient (or pseudo-gradient) and starts the next round (every live
  worker is sent it).

  A local strategy's round takes the outer step of :func:`sync_round.outer_step` on the fragment the
  round synchronized (:func:`sync_round.round_fragment` of its number), as the simulator's round does.
  """
  acc = s.exchange
  count = jnp.maximum(acc.count, 1)
  mean = unravel(acc.grads / count.astype(acc.grads.dtype))
  if _local(strategy):
    fragment = sync_round.round_fragment(strategy, s.event)
    update = sync_round.outer_step(strategy, s.params, s.rule_state, mean, fragment)
  else:
    update = sync_round.apply_aggregate(
      strategy, s.params, s.rule_state, mean, version=s.version, num_workers=strategy.num_workers
    )
  version = s.version + update.finite.astype(jnp.int32)
  evaluated, metrics, next_eval = schedule.maybe_evaluate(
    s.next_eval, update.params, version, now, metric_names
  )
  event = s.event + 1
  send = s.live
  new = s._replace(
    params=update.params,
    rule_state=update.rule_state,
    version=version,
    pulled_version=jnp.where(send, event, s.pulled_version),
    waiting=jnp.zeros_like(s.waiting),
    idle=s.idle + jnp.where(s.waiting, now - s.wait_since, 0.0),
    inter_messages=s.inter_messages + jnp.sum(send).astype(jnp.int32),
    next_eval=next_eval,
    event=event,
    exchange=RoundSum(jnp.zeros_like(acc.grads), jnp.zeros_like(acc.loss), jnp.zeros_like(acc.count)),
  )
  record = sync_round.round_record(
    time=now,
    version=version,
    finite=update.finite,
    k=acc.count,
    loss=acc.loss / count.astype(jnp.float32),
    evaluated=evaluated,
    metrics=metrics,
  )
  return ServerStep(new, record, send, reply_payload(new))


def _no_reply(s: ServerState) -> jax.Array | None:
  """An open round's stand-in for :func:`close_round`'s reply: of its shape (or ``None`` like it)."""
  shape = jax.eval_shape(reply_payload, s)
  return None if shape is None else jnp.zeros(shape.shape, shape.dtype)


def _empty_round_record(s: ServerState, now, metric_names) -> EventRecord:
  """The shape of a round's record, for an arrival that closes nothing (the host keeps no row)."""
  return sync_round.round_record(
    time=now,
    version=s.version,
    finite=jnp.asarray(False),
    k=jnp.asarray(0, jnp.int32),
    loss=jnp.asarray(jnp.nan, jnp.float32),
    evaluated=jnp.asarray(False),
    metrics={name: jnp.asarray(jnp.nan, jnp.float32) for name in metric_names},
  )


def join(
  s: ServerState, worker: int, wait: jax.Array | bool = False, now: jax.Array | float = 0.0
) -> ServerState:
  """A worker (re)joins: it is live, not waiting, and is sent the current parameters (its old pull is void).

  A ``"rounds"`` server sends it the open round (its number is the version on
  the wire); an EA-wild server records the centre as its lock-free read. With
  ``wait`` (elastic membership, a round under way) it waits instead, as if it
  had delivered: the open round does not wait for it, and its close sends it
  the next one; its idle time counts from ``now``.
  """
  rounds = isinstance(s.exchange, RoundSum)
  exchange = s.exchange
  if not rounds and not (isinstance(exchange, tuple) and not exchange):
    exchange = exchange.at[worker].set(ravel_pytree(s.params)[0])
  return s._replace(
    live=s.live.at[worker].set(True),
    waiting=s.waiting.at[worker].set(wait),
    wait_since=s.wait_since.at[worker].set(jnp.where(wait & ~s.waiting[worker], now, s.wait_since[worker])),
    pulled_version=s.pulled_version.at[worker].set(s.event if rounds else s.version),
    exchange=exchange,
  )


def joins_next_round(strategy: Strategy, live, waiting, worker: int) -> bool:
  """Whether ``worker``, joining now, waits for the next round (elastic membership): when its pseudo-gradient
  of the open round is already in (a process restarted, before or after it was declared lost: computed
  again, it would count twice), or when it was not a member (it left or was declared lost) and the open round has its
  quorum in, which it would only hold up by a whole round of local steps. The workers a run starts with are
  members of its first round."""
  if not strategy.elastic_membership:
    return False
  if waiting[worker]:  # delivered to the open round (live, or dropped since), or already held back
    return True
  delivered = int(waiting.sum())
  return bool(not live[worker] and delivered and delivered >= strategy.quorum)


def late(strategy: Strategy, s: ServerState, worker: jax.Array) -> ServerState:
  """A message of ``worker`` that is never applied (its round closed, or it was declared lost): counted.

  Its data steps are spent (1, or a local worker's local steps), as the simulator spends a dropped gradient's.
  """
  return s._replace(dropped=s.dropped + 1, steps=s.steps.at[worker].add(data_steps(strategy, worker)))


def revive(s: ServerState, worker: jax.Array) -> ServerState:
  """An elastic worker declared lost is heard from again: it is live (it kept its own model)."""
  return s._replace(live=s.live.at[worker].set(True))


def drop(s: ServerState, gone: jax.Array) -> ServerState:
  """Workers ``gone`` (``bool[K]``) left or were lost: they neither wait nor count as live.

  In ``"rounds"`` mode ``waiting`` marks the workers whose message of the open round is in its sum: a
  worker dropped after it delivered keeps its mark until the round closes, so that if it comes back
  before then it waits for the next round (:func:`joins_next_round`) instead of counting twice.
  """
  rounds = isinstance(s.exchange, RoundSum)
  return s._replace(live=s.live & ~gone, waiting=s.waiting if rounds else s.waiting & ~gone)


def release_waiting(s: ServerState, now: jax.Array) -> tuple[ServerState, jax.Array]:
  """Sends the current parameters to every waiting worker, as a release would (the same fields).

  For a run where every live worker waits for a release only lost workers
  could have completed (a buffering rule that does not shrink its bound with
  the live workers): they recompute on the current parameters.

  Returns:
    ``(state, send)``: the new state and the ``bool[K]`` workers to reply to.
  """
  send = s.waiting
  noise = contracts.noise_ratio(s.rule_state)
  state = s._replace(
    waiting=jnp.zeros_like(s.waiting),
    pulled_version=jnp.where(send, s.version, s.pulled_version),
    noise_ratio=s.noise_ratio if noise is None else jnp.where(send, noise, s.noise_ratio),
    idle=s.idle + jnp.where(send, now - s.wait_since, 0.0),
    inter_messages=s.inter_messages + jnp.sum(send).astype(jnp.int32),
  )
  return state, send


def stuck_on_lost_workers(s: ServerState) -> jax.Array:
  """Every live worker waits, so no arrival can come to release them (:func:`release_waiting`)."""
  return jnp.any(s.waiting) & ~jnp.any(s.live & ~s.waiting)
