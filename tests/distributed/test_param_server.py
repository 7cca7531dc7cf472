"""The parameter server in this process, on real ZeroMQ sockets over 127.0.0.1.

A worker thread runs the real worker loop; bad messages come from a separate
Python process (plain pyzmq, no JAX) so that nothing is shared with the
server but the socket.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
import threading
import time

import jax
import numpy as np
import pytest

from jaxsync._src.distributed import ps_worker, wire
from jaxsync._src.distributed.server import param_server
from jaxsync._src.distributed.server.counters import HostCounters
from jaxsync._src.distributed.server.server_step import ServerState

import helpers


def _experiment(*overrides):
  return helpers.quickstart_experiment(
    "cluster.num_workers=1",
    "model.name=mlp",
    "strategy.name=asp",
    "strategy.options={learning_rate: 0.05}",
    "run.gradients=40",
    "run.eval_every=20",
    *overrides,
  )


def _start_worker(exp, server, *, reply_timeout: float = 60, worker: int = 0):
  """A worker's real loop in a thread, talking to ``server`` over its socket; returns (thread, results)."""
  sim, done = exp.simulator(), {}

  def work():
    done.update(
      ps_worker.run_worker(
        exp.strategy,
        sim.loss_fn,
        sim.data,
        exp.model.params,
        worker=worker,
        address=server.address,
        token=server.token,
        reply_timeout=reply_timeout,
      )
    )

  thread = threading.Thread(target=work, daemon=True)
  thread.start()
  return thread, done


def _assert_the_counters_are_the_states(counters, state):
  """The counters the server checks messages against and writes into replies, kept on the host, equal
  those of its state on the device (read off it here, as the server itself never does while it serves)."""
  device = HostCounters.of(state)
  for field in dataclasses.fields(HostCounters):
    np.testing.assert_array_equal(
      getattr(counters, field.name), getattr(device, field.name), err_msg=field.name
    )


def _check_the_counters_after_every_change(server):
  """Compares the host's counters with the device state after each state change the server makes."""
  steps = server._steps

  def checking(change):
    def checked(state, *args, **kwargs):
      out = change(state, *args, **kwargs)
      _assert_the_counters_are_the_states(steps.counters, out if isinstance(out, ServerState) else out[0])
      return out

    return checked

  for name in ("arrive", "local_step", "join", "drop", "release", "close_round", "late"):
    setattr(steps, name, checking(getattr(steps, name)))


def _serve_with_worker(exp, server, num_events):
  state = server.init(exp.model.params)
  _check_the_counters_after_every_change(server)
  thread, done = _start_worker(exp, server)
  state, records = server.advance(state, num_events)
  server.stop(timeout=30)
  thread.join(timeout=30)
  return state, records, done


@pytest.mark.parametrize(
  "name, options",
  [
    ("asp", "{learning_rate: 0.05}"),
    ("ormo", "{learning_rate: 0.05}"),  # server momentum
    ("smega2", "{}"),  # look-ahead replies
    ("adaptive_k", "{}"),  # a worker rule (BB step sizes) and the noise ratio in the replies
    ("easgd", "{period: 4}"),  # elastic: local steps reported, a locked exchange every 4th step
    ("eamsgd", "{period: 3}"),  # the same with the look-ahead gradient point
    ("ea_wild", "{}"),  # lock-free: an exchange every step against the last read
    ("ea_wild", "{group_size: 2}"),  # a synchronous group of 2 workers, one worker process
    ("fastest_k", "{}"),  # a synchronous round served by the server
    ("dc_asgd", "{adaptive: true}"),  # per-worker backups and mean squares on the server
    ("async_local_sgd", "{period: 3, dylu: true}"),  # local AdamW steps, Delayed Nesterov on the server
  ],
)
def test_one_real_worker_equals_the_simulated_run_with_one_worker(name, options):
  """Bit for bit for asp; for rules with more arithmetic, to float rounding (XLA fuses the simulator's
  one compiled event differently from the server's and the worker's separate steps)."""
  # An EA-wild group of two is two workers (K = 2) and one worker process, its batch both members'.
  workers = 2 if "group_size" in options else 1
  exp = _experiment(f"strategy.name={name}", f"strategy.options={options}", f"cluster.num_workers={workers}")
  sim = exp.simulator()
  sim_state, sim_records = sim.advance(sim.init(exp.model.params, 0), 40)
  server = param_server.ParameterServer(exp.strategy, eval_fn=sim.schedule.eval_fn, eval_every=20)
  state, records, done = _serve_with_worker(exp, server, 40)
  assert done["pushes"] >= 40  # its last push is answered with STOP
  check = (
    np.testing.assert_array_equal
    if name in ("asp", "ea_wild")
    else lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  )
  for a, b in zip(jax.tree.leaves(sim_state.params), jax.tree.leaves(state.params)):
    check(np.asarray(b), np.asarray(a))
  check(records.loss, np.asarray(sim_records.loss))
  np.testing.assert_array_equal(records.version, np.asarray(sim_records.version))
  check(records.step_size, np.asarray(sim_records.step_size))
  assert records.staleness.max() == 0
  np.testing.assert_array_equal(records.evaluated, np.asarray(sim_records.evaluated))
  # Gradients computed: one per push, or a local worker's local steps per push.
  assert int(state.steps[0]) == 40 * (3 if name == "async_local_sgd" else 1)


@pytest.mark.parametrize(
  "name, options",
  [
    ("k_async", "{k: 2}"),  # a waiting set and its releases
    ("ssp", "{staleness_bound: 0}"),  # workers held back by the slowest clock
    ("adaptive_k", "{}"),  # the noise ratio in the replies
    ("easgd", "{period: 2}"),  # elastic local steps and exchanges
    ("fastest_k", "{k: 2}"),  # rounds, and the late gradients of a closed one
  ],
)
def test_the_host_counters_are_the_device_states_after_every_state_change(name, options):
  """A push is checked against counters the host keeps, never read off the device: they must stay exact."""
  exp = _experiment(f"strategy.name={name}", f"strategy.options={options}", "cluster.num_workers=3")
  server = param_server.ParameterServer(exp.strategy, idle_timeout=60)
  state = server.init(exp.model.params)
  _check_the_counters_after_every_change(server)
  workers = [_start_worker(exp, server, worker=w) for w in range(3)]
  try:
    state, _ = server.advance(state, 12)
  finally:
    server.stop(timeout=30)
  for thread, _ in workers:
    thread.join(timeout=30)
  assert int(state.event) >= 12


_ATTACKER = textwrap.dedent(
  """
  import json, struct, sys, numpy as np, zmq
  address, token, count, oversize = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
  fmt = struct.Struct("<4sBBBx16siqqfffQ")
  def header(kind=2, token=token, worker=0, version=0, dtype=0, n=count, magic=b"JXS1"):
    return fmt.pack(magic, kind, dtype, 1, token, worker, version, 0, 0.0, float("nan"), 0.0, n)
  good = np.ones(count, np.float32)
  nan = good.copy(); nan[3] = np.nan
  cases = {
    "token": [header(token=b"x" * 16), good],
    "worker": [header(worker=7), good],
    "future_version": [header(version=99), good],
    "dtype": [header(dtype=1), good],  # float64 claimed; a float64 payload would be oversized
    "shape": [header(n=count - 1), good[:-1]],
    "malformed": [b"not a header", good],
  }
  out = {}
  sock = zmq.Context.instance().socket(zmq.DEALER)
  sock.setsockopt(zmq.LINGER, 0)
  sock.connect(address)
  sock.send_multipart([header(kind=1), ])  # HELLO as worker 0
  assert sock.poll(20000), "no reply to HELLO"
  sock.recv_multipart()
  for reason, frames in cases.items():
    sock.send_multipart(frames)
    out[reason] = fmt.unpack(sock.recv_multipart()[0])[1] if sock.poll(3000) else None
  sock.send_multipart([header(), nan])  # a NaN gradient: a valid message, rejected by the rule
  out["nan"] = fmt.unpack(sock.recv_multipart()[0])[1] if sock.poll(10000) else None
  big = zmq.Context.instance().socket(zmq.DEALER)
  big.setsockopt(zmq.LINGER, 0)
  big.connect(address)
  big.send_multipart([header(n=oversize), np.zeros(oversize, np.float32)])
  out["oversize_reply"] = bool(big.poll(2000))
  sock.send_multipart([header(version=0), good])  # still served after all that
  out["after"] = fmt.unpack(sock.recv_multipart()[0])[1] if sock.poll(10000) else None
  print(json.dumps(out))
  """
)


@pytest.mark.heavy
def test_bad_messages_from_another_process_are_rejected_counted_and_never_applied():
  exp = _experiment()
  server = param_server.ParameterServer(exp.strategy, idle_timeout=30)
  state = server.init(exp.model.params)
  _check_the_counters_after_every_change(server)
  before = jax.tree.map(np.asarray, state.params)
  peer = subprocess.Popen(
    [
      sys.executable,
      "-c",
      _ATTACKER,
      server.address,
      server.token.hex(),
      str(server.count),
      str(4 * server.count),
    ],
    stdout=subprocess.PIPE,
    text=True,
  )
  state, records = server.advance(state, 2)  # the NaN arrival, then the good one
  out, _ = peer.communicate(timeout=60)
  server.stop(timeout=1)
  import json

  replies = json.loads(out)
  error, params = int(wire.Kind.ERROR), int(wire.Kind.PARAMS)
  for reason in ("token", "worker", "future_version", "dtype", "shape", "malformed"):
    assert server.rejected_messages[reason] == 1, reason
    # The run's own processes learn why; a foreign or garbled peer gets no answer to flood with.
    assert replies[reason] == (None if reason in ("token", "malformed") else error), reason
  # NaN: counted as a rejected arrival, the parameters untouched, the worker gets parameters again.
  assert replies["nan"] == params
  np.testing.assert_array_equal(records.rejected, [True, False])
  np.testing.assert_array_equal(records.version, [0, 1])
  assert int(state.used[0]) == 1 and int(state.steps[0]) == 2
  # The oversized frame is dropped by ZeroMQ before it is read whole: no reply, no event.
  assert replies["oversize_reply"] is False
  assert replies["after"] == params
  after_nan_only = jax.tree.map(np.asarray, state.params)
  changed = [
    not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after_nan_only))
  ]
  assert any(changed)  # the good gradient (all ones) was applied once ...
  lr = 0.05
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after_nan_only)):
    np.testing.assert_allclose(b, a - lr, rtol=0, atol=1e-6)  # ... and only it (ASP: theta - lr * g)


def test_header_round_trip_and_refusals():
  token = b"t" * 16
  payload = np.arange(5, dtype=np.float32)
  header = wire.Header(kind=wire.Kind.PUSH, token=token, worker=2, version=7, step=3, loss=1.5, finite=False)
  frames = wire.encode(header, payload)
  got = wire.decode_header(frames[0], token=token)
  assert (got.kind, got.worker, got.version, got.step, got.loss, got.finite, got.count) == (
    wire.Kind.PUSH,
    2,
    7,
    3,
    1.5,
    False,
    5,
  )
  np.testing.assert_array_equal(wire.decode_payload(got, frames[1:], dtype="float32", count=5), payload)
  with pytest.raises(wire.MessageError, match="token"):
    wire.decode_header(frames[0], token=b"u" * 16)
  with pytest.raises(wire.MessageError, match="shape"):
    wire.decode_payload(got, frames[1:], dtype="float32", count=6)
  with pytest.raises(wire.MessageError, match="malformed"):
    wire.decode_header(b"JXS1" + b"\0" * 10, token=token)
  assert wire.max_message_bytes(1000, "float32") == 4000
  # An ERROR carries its reason in a field of its own (the data step is left alone).
  error = wire.Header(kind=wire.Kind.ERROR, token=token, worker=1, step=11, reason="future_version")
  got = wire.decode_header(wire.encode(error)[0], token=token)
  assert (got.reason, got.step) == ("future_version", 11)
  assert wire.decode_header(frames[0], token=token).reason is None
  bad_reason = bytearray(wire.encode(error)[0])
  bad_reason[7] = len(wire.REASONS) + 1  # the reason byte follows magic, kind, dtype and finite
  with pytest.raises(wire.MessageError, match="reason code"):
    wire.decode_header(bytes(bad_reason), token=token)


def test_a_payload_sent_in_several_frames_is_received_end_to_end_into_the_inbox_without_a_copy():
  import zmq

  token = b"t" * 16
  leaves = [np.arange(3, dtype=np.float32), np.arange(3, 7, dtype=np.float32).reshape(2, 2)]
  header = wire.Header(kind=wire.Kind.PARAMS, token=token, worker=0)
  frames = wire.encode(header, leaves)
  assert len(frames) == 3 and wire.decode_header(frames[0], token=token).count == 7
  got = wire.decode_payload(wire.decode_header(frames[0], token=token), frames[1:], dtype="float32", count=7)
  np.testing.assert_array_equal(got, np.arange(7, dtype=np.float32))
  with pytest.raises(ValueError, match="payload dtypes"):
    wire.encode(header, [leaves[0], leaves[1].astype(np.float64)])
  import ml_dtypes  # bfloat16 has no buffer-protocol format: it goes out as bytes

  half = np.arange(4, dtype=ml_dtypes.bfloat16)
  frames16 = wire.encode(wire.Header(kind=wire.Kind.PUSH, token=token, worker=0), [half[:1], half[1:]])
  got16 = wire.decode_payload(
    wire.decode_header(frames16[0], token=token), frames16[1:], dtype="bfloat16", count=4
  )
  np.testing.assert_array_equal(got16, half)
  context = zmq.Context.instance()
  sender, receiver = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
  try:
    receiver.connect(f"tcp://127.0.0.1:{sender.bind_to_random_port('tcp://127.0.0.1')}")
    inbox = wire.Inbox(wire.max_message_bytes(7, "float32"))
    sender.send_multipart(frames, copy=False)
    received = inbox.receive(receiver)
    assert len(received) == 2  # the header, then one view of the whole payload
    payload = wire.decode_payload(
      wire.decode_header(received[0], token=token), received[1:], dtype="float32", count=7
    )
    np.testing.assert_array_equal(payload, np.arange(7, dtype=np.float32))
    assert np.shares_memory(payload, inbox.view(np.float32, 7))  # laid end to end in the inbox itself
    # Frames past the inbox's 7 elements: refused for their length, never written past the buffer.
    sender.send_multipart([frames[0], *frames[1:], b"\0" * 8], copy=False)
    too_long = inbox.receive(receiver)
    with pytest.raises(wire.MessageError, match=r"shape: payload of 7 elements \(36 bytes\)"):
      wire.decode_payload(
        wire.decode_header(too_long[0], token=token), too_long[1:], dtype="float32", count=7
      )
  finally:
    sender.close(linger=0)
    receiver.close(linger=0)


@pytest.mark.parametrize("name, look_ahead", [("asp", False), ("smega2", True)])
def test_the_reply_is_the_parameters_own_buffers_and_the_next_step_does_not_overwrite_one_in_flight(
  name, look_ahead
):
  """The server sends its parameters' leaves as they are (no raveled copy): so the step must not update
  them in place while ZeroMQ may still be sending them. SMEGA²'s look-ahead reply is a raveled array of its own."""
  exp = _experiment("model.name=mlp", f"strategy.name={name}", "strategy.options={}")
  server = param_server.ParameterServer(exp.strategy)
  try:
    state = server.init(exp.model.params)
    steps = server._steps
    state = steps.to_device(state)
    gradient = wire.aligned_zeros(server.count, np.float32)
    gradient[:] = 0.5
    (state, _, _, reply), _ = steps.arrival_step(state, *steps.placeholder_args(gradient))
    sent = steps.host_reply(state, reply)
    if look_ahead:
      from jax.flatten_util import ravel_pytree

      from jaxsync._src.rules import contracts

      expected = ravel_pytree(contracts.reply_params(state.params, state.rule_state))[0]
      np.testing.assert_array_equal(sent, expected)
      assert not np.shares_memory(sent, np.asarray(jax.tree.leaves(state.params)[0]))
      return
    leaves = jax.tree.leaves(state.params)
    assert len(sent) == len(leaves) > 1
    assert all(np.shares_memory(frame, np.asarray(leaf)) for frame, leaf in zip(sent, leaves))
    kept = [frame.copy() for frame in sent]
    (state, _, _, _), _ = steps.arrival_step(state, *steps.placeholder_args(gradient))
    moved = jax.tree.leaves(state.params)
    for frame, copy, leaf in zip(sent, kept, moved):
      np.testing.assert_array_equal(frame, copy)  # the reply in flight is intact ...
      assert not np.array_equal(np.asarray(leaf), copy)  # ... while the parameters moved on
  finally:
    server.stop(timeout=1)


def test_the_server_refuses_strategies_it_cannot_serve():
  for name in ("allreduce", "local_sgd"):
    exp = _experiment(f"strategy.name={name}", "strategy.options={}")
    with pytest.raises(ValueError, match="multi-controller loop"):
      param_server.ParameterServer(exp.strategy)
  # EA-wild's synchronous groups are served: one worker process (and one lock-free read) per group.
  ea = _experiment("cluster.num_workers=4", "strategy.name=ea_wild", "strategy.options={group_size: 2}")
  server = param_server.ParameterServer(ea.strategy)
  try:
    assert server.num_workers == 2
    assert server.init(ea.model.params).exchange.shape == (2, ea.model.num_params)
  finally:
    server.stop(timeout=0.1)


def test_a_lost_worker_is_dropped_and_a_stuck_run_ends_with_a_clear_error():
  exp = _experiment()
  live = {0}
  server = param_server.ParameterServer(exp.strategy, liveness=lambda: set(live), idle_timeout=1.0)
  state = server.init(exp.model.params)
  _check_the_counters_after_every_change(server)
  live.clear()  # worker 0 stops beating before it ever pushes
  with pytest.raises(param_server.WorkerLostError, match="every worker process is lost"):
    server.advance(state, 1)
  assert server.lost and server.lost[0]["worker"] == 0
  server.stop(timeout=0.1)
  # A live worker that never sends: the server gives up after idle_timeout, it does not hang.
  stuck = param_server.ParameterServer(exp.strategy, liveness=lambda: {0}, idle_timeout=1.0)
  with pytest.raises(param_server.WorkerLostError, match="idle_timeout=1.0 s"):
    stuck.advance(stuck.init(exp.model.params), 1)
  stuck.stop(timeout=0.1)


def test_under_a_supervisor_a_server_that_lost_every_worker_waits_for_one_to_rejoin_then_stops():
  """jaxsync launch --max-restarts sets rejoin_wait: the run does not end while a restarted worker starts."""
  exp = _experiment()
  live = {0}
  server = param_server.ParameterServer(
    exp.strategy, liveness=lambda: set(live), idle_timeout=30.0, rejoin_wait=1.5
  )
  state = server.init(exp.model.params)
  live.clear()
  began = time.monotonic()
  with pytest.raises(param_server.WorkerLostError, match=r"none rejoined within rejoin_wait=1\.5 s"):
    server.advance(state, 1)
  assert time.monotonic() - began >= 1.5  # it waited, and not idle_timeout's 30 s
  assert time.monotonic() - began < 20
  server.stop(timeout=0.1)
  with pytest.raises(ValueError, match="rejoin_wait=-1"):
    param_server.ParameterServer(exp.strategy, rejoin_wait=-1)


def test_a_worker_back_after_it_was_declared_lost_has_its_stale_gradient_dropped_and_rejoins():
  """A SIGSTOPped worker continued after the heartbeat timeout: its push must not land versions late."""
  import zmq

  exp = _experiment("cluster.num_workers=2")
  live = {0, 1}
  server = param_server.ParameterServer(exp.strategy, liveness=lambda: set(live), idle_timeout=30)
  state = server.init(exp.model.params)
  _check_the_counters_after_every_change(server)
  client = zmq.Context.instance().socket(zmq.DEALER)
  client.setsockopt(zmq.LINGER, 0)
  client.connect(server.address)

  def serve(state, seconds):
    return server.advance(state, 1, max_time=server._now() + seconds)

  def reply():
    assert client.poll(5000), "no reply"
    return wire.decode_header(client.recv_multipart()[0], token=server.token)

  def push(version):
    header = wire.Header(
      kind=wire.Kind.PUSH, token=server.token, worker=0, version=version, count=server.count
    )
    client.send_multipart(wire.encode(header, np.ones(server.count, np.float32)))

  client.send_multipart(wire.encode(wire.Header(kind=wire.Kind.HELLO, token=server.token, worker=0)))
  state, _ = serve(state, 0.5)
  assert reply().version == 0
  push(0)
  state, records = serve(state, 5)
  assert int(records.version[0]) == 1 and reply().version == 1
  live.discard(0)  # it stops beating: declared lost
  state, _ = serve(state, 1.0)
  assert not bool(state.live[0]) and [x["worker"] for x in server.lost] == [0]
  before = jax.tree.map(np.asarray, state.params)
  live.add(0)  # continued: it beats again, and pushes the gradient it computed on version 1 before it stopped
  push(1)
  state, records = serve(state, 1.0)
  back = reply()
  server.stop(timeout=0.1)
  client.close()
  assert len(records.version) == 0  # no event: nothing applied
  assert int(state.dropped) == 1 and server.dropped_gradients == 1
  assert int(state.version) == 1 and bool(state.live[0])
  assert back.kind == wire.Kind.PARAMS and back.version == 1 and back.step == 2  # rejoined, next batch
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(np.asarray(b), a)


def test_a_fastest_k_round_drops_a_late_gradient_and_closes_without_a_lost_worker():
  """Rounds on the server: a gradient of a closed round is never applied; losing a worker closes the round."""
  import zmq

  exp = _experiment("cluster.num_workers=3", "strategy.name=fastest_k", "strategy.options={k: 2}")
  live = {0, 1, 2}
  server = param_server.ParameterServer(exp.strategy, liveness=lambda: set(live), idle_timeout=30)
  state = server.init(exp.model.params)
  _check_the_counters_after_every_change(server)
  sockets = []
  for worker in range(3):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address)
    sock.send_multipart(wire.encode(wire.Header(kind=wire.Kind.HELLO, token=server.token, worker=worker)))
    sockets.append(sock)

  def serve(state, events, seconds=5.0):
    return server.advance(state, events, max_time=server._now() + seconds)

  def reply(worker):
    assert sockets[worker].poll(5000), f"no reply to worker {worker}"
    return wire.decode_header(sockets[worker].recv_multipart()[0], token=server.token)

  def push(worker, round_number, value=1.0):
    header = wire.Header(
      kind=wire.Kind.PUSH, token=server.token, worker=worker, version=round_number, count=server.count
    )
    sockets[worker].send_multipart(wire.encode(header, np.full(server.count, value, np.float32)))

  # The HELLOs arrive as the sockets connect, which a loaded machine can delay past one short window: serve
  # until every worker has its reply (or 10 s have passed; the assertion below then names the one left out).
  for _ in range(20):
    state, _ = serve(state, 1, 0.5)
    if all(sock.poll(0) for sock in sockets):
      break
  assert [reply(w).version for w in range(3)] == [0, 0, 0]  # round 0, data step 0 for everyone
  push(0, 0)
  push(1, 0)
  state, records = serve(state, 1)  # the second gradient closes round 0
  assert records.k.tolist() == [2] and int(state.event) == 1 and int(state.version) == 1
  assert [reply(w).version for w in range(3)] == [1, 1, 1] and not sockets[2].poll(0)
  after_round_0 = jax.tree.map(np.asarray, state.params)
  push(2, 0, value=1e6)  # the straggler's gradient of round 0, late: dropped, and it is owed nothing
  push(0, 1)
  state, records = serve(state, 1, 1.0)  # round 1 has one gradient: still open
  assert len(records.k) == 0 and int(state.dropped) == 1 and not sockets[2].poll(200)
  for a, b in zip(jax.tree.leaves(after_round_0), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(np.asarray(b), a)  # nothing applied in between
  live.difference_update({1, 2})  # the two others are lost: round 1 closes with the one gradient it has
  state, records = serve(state, 1)
  assert records.k.tolist() == [1] and int(state.event) == 2 and int(state.version) == 2
  back = reply(0)
  assert back.version == 2 and back.step == 2  # round 2, every worker's data step the round's number
  server.stop(timeout=0.1)
  for sock in sockets:
    sock.close()


def test_workers_waiting_on_a_release_only_a_lost_worker_could_complete_get_parameters_again():
  # k_async with k = K = 2: a release needs both workers; worker 1 is lost before it ever pushes.
  exp = _experiment("strategy.name=k_async", "strategy.options={k: 2}", "cluster.num_workers=2")
  live = {0, 1}
  server = param_server.ParameterServer(exp.strategy, liveness=lambda: set(live), idle_timeout=20)
  state = server.init(exp.model.params)
  _check_the_counters_after_every_change(server)
  thread, done = _start_worker(exp, server, reply_timeout=30)
  state, records = server.advance(state, 1)  # worker 0's first gradient: buffered, it waits
  assert not records.released[0] and bool(state.waiting[0])
  live.discard(1)
  state, records = server.advance(state, 2)  # it is sent the parameters again and keeps pushing
  server.stop(timeout=10)
  thread.join(timeout=30)
  assert [x["worker"] for x in server.lost] == [1]
  assert done["pushes"] >= 3 and int(state.steps[0]) == 3


_TWO_DEVICE_WORKER = textwrap.dedent(
  """
  import json, os, sys
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
  import jax
  from jaxsync._src.app import config as config_lib
  from jaxsync._src.app import experiment
  from jaxsync._src.distributed import local_devices, ps_worker
  overrides, address, token = json.loads(sys.argv[1]), sys.argv[2], bytes.fromhex(sys.argv[3])
  exp = experiment.build(config_lib.load(sys.argv[4], overrides))  # the config's path
  sim = exp.simulator()
  done = ps_worker.run_worker(exp.strategy, sim.loss_fn, sim.data, exp.model.params, worker=0,
                              address=address, token=token, reply_timeout=120)
  step = jax.jit(local_devices.gradient_fn(sim.loss_fn))
  hlo = step.lower(exp.model.params, sim.data.batch(0, 0)).compile().as_text()
  print(json.dumps({"pushes": done["pushes"], "devices": len(jax.local_devices()),
                    "all_reduce": "all-reduce" in hlo}))
  """
)


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["asp", "easgd"])
def test_a_worker_with_two_devices_computes_its_batch_across_both_and_equals_the_one_device_run(name):
  overrides = [
    "cluster.num_workers=1",
    "model.name=mlp",
    f"strategy.name={name}",
    "strategy.options={learning_rate: 0.05}",
    "run.gradients=40",
    "run.eval_every=20",
  ]
  exp = helpers.quickstart_experiment(*overrides)
  sim = exp.simulator()
  sim_state, sim_records = sim.advance(sim.init(exp.model.params, 0), 40)
  server = param_server.ParameterServer(exp.strategy, idle_timeout=120)
  state = server.init(exp.model.params)
  import json

  worker = subprocess.Popen(
    [
      sys.executable,
      "-c",
      _TWO_DEVICE_WORKER,
      json.dumps(overrides),
      server.address,
      server.token.hex(),
      str(helpers.QUICKSTART),
    ],
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    state, records = server.advance(state, 40)
    server.stop(timeout=30)
    out, _ = worker.communicate(timeout=120)
  finally:
    worker.kill()
  done = json.loads(out.strip().splitlines()[-1])
  assert done["devices"] == 2 and done["all_reduce"], done  # one jitted step, a psum across the two
  assert done["pushes"] >= 40
  # Half the batch on each device, the mean of the halves' gradients: the whole batch's, to float rounding.
  for a, b in zip(jax.tree.leaves(sim_state.params), jax.tree.leaves(state.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(records.loss, np.asarray(sim_records.loss), rtol=1e-4, atol=1e-6)


def test_a_batch_that_does_not_split_over_the_local_devices_is_refused():
  from jaxsync._src.distributed import local_devices

  assert local_devices.check_batch(32, 4) == 32
  with pytest.raises(
    ValueError, match=r"data.batch_size=30 .*splits over this worker process's 4 local devices"
  ):
    local_devices.check_batch(30, 4)
  # An EA-wild group's process computes its 2 members' batches: 2 x 30 splits over 4 devices, 2 x 31 does not.
  assert local_devices.check_batch(30, 4, group_size=2) == 30
  with pytest.raises(ValueError, match=r"data.batch_size=31 .*times the group's 2 workers.* 4 local devices"):
    local_devices.check_batch(31, 4, group_size=2)
