"""The parameter server's compiled step, pure and apart from any transport.

The multi-process runtime's server (``dist.param_server``) receives a worker's
message on a socket and hands it to :func:`arrive`; everything it decides (the
new parameters, who gets them, the record of the event) is decided here, by
the same :mod:`arrival` functions the simulator's event step runs. The other
state changes of a real server (a worker joins, leaves, or is lost; waiting
workers are released when no live worker can release them) are pure functions
too, so the whole server can be tested without a socket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from jaxsync._src.rules import contracts, guard
from jaxsync._src.steps import arrival
from jaxsync._src.steps.records import EvalSchedule, EventRecord
from jaxsync._src.strategies.strategy import Strategy


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
    event: arrivals so far.
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


class ServerStep(NamedTuple):
  """What one arrival at the server produces.

  Attributes:
    state: the new server state.
    record: the event's record (``time`` in wall seconds).
    send: ``bool[K]``, the workers that get the reply now.
    reply: the reply's payload: the parameters (SMEGA²'s look-ahead estimate), raveled.
  """

  state: ServerState
  record: EventRecord
  send: jax.Array
  reply: jax.Array


def init(strategy: Strategy, params: Any, schedule: EvalSchedule) -> ServerState:
  """The state before the first arrival: every worker will get ``params`` (version 0)."""
  num_workers = strategy.num_workers
  zeros = jnp.zeros([num_workers], jnp.int32)
  return ServerState(
    clock=jnp.zeros([], jnp.float32),
    params=params,
    rule_state=strategy.server_rule.init(params),
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
  )


def reply_payload(state: ServerState) -> jax.Array:
  """The parameters a worker is sent (SMEGA²'s look-ahead estimate), raveled into one flat array."""
  return ravel_pytree(contracts.reply_params(state.params, state.rule_state))[0]


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
    version=s.pulled_version[worker],
    pending=s.pending,
    num_live_workers=jnp.sum(s.live),
    finite=finite,
  )
  released, rejected = arrived.released, ~finite
  version = s.version + released.astype(jnp.int32)
  steps = s.steps.at[worker].add(1)
  fresh = s.pulled_version[worker] == s.version
  # A lost worker holds no one back (SSP's slowest clock is among the live).
  clocks = jnp.where(s.live, steps, jnp.iinfo(jnp.int32).max)
  send, waiting = arrival.dispatch(strategy, s.waiting & s.live, worker, clocks, released, fresh, rejected)
  sender = jnp.arange(strategy.num_workers) == worker
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
    used=s.used.at[worker].add(finite.astype(jnp.int32)),
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


def join(s: ServerState, worker: int) -> ServerState:
  """A worker (re)joins: it is live, not waiting, and is sent the current parameters (its old pull is void)."""
  return s._replace(
    live=s.live.at[worker].set(True),
    waiting=s.waiting.at[worker].set(False),
    pulled_version=s.pulled_version.at[worker].set(s.version),
  )


def drop(s: ServerState, gone: jax.Array) -> ServerState:
  """Workers ``gone`` (``bool[K]``) left or were lost: they neither wait nor count as live."""
  return s._replace(live=s.live & ~gone, waiting=s.waiting & ~gone)


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
