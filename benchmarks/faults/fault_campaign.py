"""A fault campaign against every runtime: fuzzed frames, killed, stopped and preempted processes.

Nine parts, each counted, none of them trusted to the process under test:

1. **Fuzzing** (``fuzz``). A :class:`ParameterServer` (``asp``, two workers, one
   1,000-element float32 vector) served in this process, and a separate client
   process that sends it tens of thousands of messages over ZeroMQ: random bytes,
   empty and truncated frames, valid headers with one field mutated (magic,
   kind, dtype code, reason code, token, worker id out of range or not the
   connection's, a version in the future or in the past, the element count, the
   payload's length, extra or missing frames, control messages with payloads),
   NaN/Inf payloads that claim to be finite, and frames longer than ZeroMQ's
   ``MAXMSGSIZE``, each on a connection of its own. Legitimate pushes of
   worker 0 are interleaved: each of its gradients is ``2^-8 s`` with ``s`` in
   {1, 2, 3}, so with a learning rate of 1/2 the parameters it gets back are
   exactly ``-2^-9 sum(s)`` if and only if every one of its pushes was applied
   once and nothing else was. Counted: every invalid message against the
   server's ``rejected_messages`` by reason, the ERROR replies each connection
   got (in order), the non-finite arrivals the rule rejected, the oversized
   frames whose connections ZeroMQ closed, the server's version and parameters.
2. **Worker faults, no restarts** (``workers``: ``jaxsync launch``, one server
   and three worker processes, ``asp`` and ``ssp`` in turn): SIGKILL a random
   worker, or SIGSTOP one for 1-5 s and SIGCONT it (``JAXSYNC_HEARTBEAT_TIMEOUT=3``,
   so a stop may outlast the heartbeat timeout). One worker of each run is left
   alone. Checked: the run exits 0 within its timeout (else a hang), the
   summary's events, gradients and updates agree (every accepted arrival
   applied, none lost), what became of each stopped worker and of its stale push.
3. **A worker that rejoins** (``rejoin``): two workers killed; one started again
   with the launcher's own command line and environment, the other through the
   worker loop alone.
4. **Server kill, resumed by hand** (``server``): process 0 SIGKILLed after a
   checkpoint, then ``jaxsync resume RUN_DIR``; the updates lost are those
   applied after the last checkpoint.
5-8. **Supervised runs** (``jaxsync launch --max-restarts``), faults at random
   times (a random delay after the run recovered from the fault before):
   ``supervised`` (single server, asp/ssp: worker SIGKILL, SIGSTOP/SIGCONT,
   SIGTERM; a server SIGKILL per run, a server SIGTERM in every other run),
   ``sharded`` (asp on 2 server shards: worker faults and a shard SIGKILL),
   ``inhad`` (InHAD on 2 nodes: a worker stopped, a worker and an aggregator
   killed, the server killed), ``sync`` (allreduce and bsp on 3 processes: a
   peer and process 0 killed, a process stopped, a process sent SIGTERM, the
   launcher sent SIGTERM). Checked per run: it finishes (exit 0, its full
   count of events) within its timeout, every restart (``restarts.jsonl``) and
   every exit 75 has a fault that explains it, no Python traceback, the
   parameter server's totals agree; per fault: the work lost past the
   checkpoint the run restarted from (0 unless the fault was the death of the
   process that writes the checkpoints: process 0 or a shard), the launcher's
   ``down_seconds``, the time to the next progress row, a restarted worker's
   time to rejoin.
9. **Preemption** (``preempt``): SIGTERM to the launcher (asp with 1 worker, asp
   on 2 shards with 1 worker, allreduce, asp with 3 workers), then ``jaxsync
   resume``; the deterministic runs' final parameters are compared with an
   uninterrupted run of the same config, the others' totals checked.

The low-communication strategies (DiLoCo and the like) do not exist in jaxsync
yet: the results say so.

Sizes: tiny (``--quick``: 1,000 frames, one worker-fault run, one synchronous
run with one killed peer; about 3 minutes on 2 CPU cores), default (50,000
frames and over 100 process faults; about an hour), full (100,000 frames,
about 250 faults). The RNG seed (``--seed``) and each run's part and index
pick the fuzzed messages, which processes are faulted, how and when; it is
printed and written to the results.

Every finished run is appended at once to ``RESULTS_DIR/fault_campaign_runs.jsonl``
(keyed by part, run index, seed and size, with the run's parameters): a rerun
skips the runs the store holds, so an interrupted campaign loses at most the
run in progress, and ``--report-only`` writes the results from the store alone.

    python -m benchmarks.faults.fault_campaign [--size tiny|default|full] [--quick] [--seed N]
        [--parts fuzz,workers,rejoin,server,supervised,sharded,inhad,sync,preempt]
        [--frames N] [--runs N] [--server-kills N] [--report-only] [--fresh] [--store PATH]

It exits 1 when a check failed (the results file lists which), or when
``--report-only`` finds planned runs missing from the store.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np
import zmq
import zmq.utils.monitor

from benchmarks.common import harness
from jaxsync._src.distributed import wire

NAME = "fault_campaign"
TITLE = "Fault campaign: fuzzed frames; killed, stopped and preempted processes of every runtime"
REPO = pathlib.Path(__file__).resolve().parents[2]  # the fuzzing client imports this module from there
PARTS = ("fuzz", "workers", "rejoin", "server", "supervised", "sharded", "inhad", "sync", "preempt")
ALL_PREEMPT = ("asp, 1 worker", "asp, 2 shards, 1 worker", "allreduce, 3 processes", "asp, 3 workers")
SIZES = {
  "tiny": {
    "frames": 1000, "runs": 1, "server_kills": 0, "gradients": 2000,
    "supervised": 0, "sharded": 0, "inhad": 0, "sync": 1, "preempt": (),
    "gradients_supervised": 0, "gradients_sharded": 0, "gradients_inhad": 0, "gradients_sync": 800,
    "gradients_preempt": (0, 0), "parts": ("fuzz", "workers", "sync"),
  },
  "default": {
    "frames": 50000, "runs": 8, "server_kills": 2, "gradients": 4000,
    "supervised": 3, "sharded": 3, "inhad": 3, "sync": 3, "preempt": ALL_PREEMPT,
    "gradients_supervised": 24000, "gradients_sharded": 8000, "gradients_inhad": 10000, "gradients_sync": 4500,
    "gradients_preempt": (4000, 1500), "parts": PARTS,
  },
  "full": {
    "frames": 100000, "runs": 20, "server_kills": 5, "gradients": 6000,
    "supervised": 8, "sharded": 8, "inhad": 8, "sync": 8, "preempt": ALL_PREEMPT,
    "gradients_supervised": 24000, "gradients_sharded": 8000, "gradients_inhad": 10000, "gradients_sync": 4500,
    "gradients_preempt": (4000, 1500), "parts": PARTS,
  },
}  # fmt: skip
HEARTBEAT_TIMEOUT = 3  # seconds; a stop of 1-5 s falls on either side of it
RUN_TIMEOUT = 240.0  # seconds a launched run may take before it counts as a hang
COUNT = 1000  # elements of the fuzzed server's parameters
LEARNING_RATE = 0.5  # with gradients 2^-8 s: every update is exact in float32
REPLY_REASONS = ("worker", "future_version", "version", "dtype", "shape")  # answered with an ERROR

# -- the wire header, field by field (to mutate one field of a valid header) -----------------------------

_FIELDS = (
  ("magic", "4s"),
  ("kind", "B"),
  ("dtype", "B"),
  ("finite", "B"),
  ("reason", "B"),
  ("token", "16s"),
  ("worker", "i"),
  ("version", "q"),
  ("step", "q"),
  ("loss", "f"),
  ("step_size", "f"),
  ("noise_ratio", "f"),
  ("count", "Q"),
)
OFFSETS: dict[str, tuple[int, str]] = {}
_offset = 0
for _name, _code in _FIELDS:
  OFFSETS[_name] = (_offset, "<" + _code)
  _offset += struct.calcsize("<" + _code)
assert _offset == wire.HEADER_BYTES


def patch(header: bytes, **fields) -> bytes:
  """``header`` with some fields overwritten (raw values: codes, not names)."""
  out = bytearray(header)
  for name, value in fields.items():
    offset, code = OFFSETS[name]
    struct.pack_into(code, out, offset, value)
  return bytes(out)


def pick(rng: np.random.Generator, values: list) -> Any:
  """One of ``values``, uniformly (``rng.choice`` would cast Python ints beyond int64)."""
  return values[int(rng.integers(len(values)))]


# -- part 1: fuzzing ---------------------------------------------------------------------------------------


class _Client:
  """The fuzzing client's connections and what it expects of the server (runs in its own process)."""

  def __init__(self, address: str, token: bytes, count: int, seed: int):
    self.rng = np.random.default_rng(seed)
    self.address, self.token, self.count = address, token, count
    self.context = zmq.Context()
    self.sockets: list[zmq.Socket] = []
    self.legit, self.member, self.stranger = self._dealer(), self._dealer(), self._dealer()
    self.sent: collections.Counter[str] = collections.Counter()  # messages per case
    self.expected: collections.Counter[str] = collections.Counter()  # rejections per reason
    self.replies_expected: dict[str, list[str]] = {"member": [], "stranger": []}
    self.replies_got: dict[str, list[str]] = {"member": [], "stranger": []}
    self.non_finite = self.oversize = self.oversize_closed = 0
    self.legit_pushes, self.legit_mismatches = 0, 0
    self.legit_sum = np.zeros(count, np.int64)
    self.oversize_sockets: list[tuple[zmq.Socket, zmq.Socket]] = []

  def _dealer(self) -> zmq.Socket:
    s = self.context.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(self.address)
    self.sockets.append(s)
    return s

  def header(
    self, kind: wire.Kind, worker: int, version: int = 0, count: int | None = None, **fields
  ) -> bytes:
    """A valid header (for ``count`` float32 elements, the run's by default)."""
    h = wire.Header(kind=kind, token=self.token, worker=worker, version=version, **fields)
    return patch(wire.encode(h)[0], count=self.count if count is None else count)

  def gradient(self, value: float = 2.0**-8) -> np.ndarray:
    return np.full(self.count, value, np.float32)

  def receive(self, sock: zmq.Socket, name: str | None, timeout: float = 30.0):
    """The next reply on ``sock``; with a ``name``, ERRORs are recorded under it and the wait goes on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if not sock.poll(100):
        continue
      frames = sock.recv_multipart(copy=False)
      header = wire.decode_header(frames[0], token=self.token)
      if header.kind == wire.Kind.ERROR and name is not None:
        self.replies_got[name].append(header.reason)
        continue
      return header, frames[1:]
    raise TimeoutError("no reply from the server")

  def drain(self, sock: zmq.Socket, name: str) -> None:
    while sock.poll(0):
      frames = sock.recv_multipart(copy=False)
      header = wire.decode_header(frames[0], token=self.token)
      self.replies_got[name].append(header.reason if header.kind == wire.Kind.ERROR else header.kind.name)

  def hello(self) -> None:
    for sock, worker in ((self.legit, 0), (self.member, 1)):
      sock.send_multipart([self.header(wire.Kind.HELLO, worker, count=0)])
      header, _ = self.receive(sock, None)
      assert header.kind == wire.Kind.PARAMS and header.version == 0, header
    self.legit_version = self.member_version = 0

  def legit_push(self) -> None:
    """Worker 0's gradient; its reply must carry the next version and exactly the expected parameters."""
    s = self.rng.integers(1, 4, self.count)
    grad = (s * 2.0**-8).astype(np.float32)
    self.legit.send_multipart([self.header(wire.Kind.PUSH, 0, self.legit_version), grad])
    header, frames = self.receive(self.legit, None)
    self.legit_pushes += 1
    self.legit_sum += s
    if header.kind != wire.Kind.PARAMS:  # rejected: it must never be
      self.legit_mismatches += 1
      return
    params = wire.decode_payload(header, frames, dtype="float32", count=self.count)
    expected = (-(2.0**-9) * self.legit_sum).astype(np.float32)
    if header.version != self.legit_pushes or not np.array_equal(params, expected):
      self.legit_mismatches += 1
    self.legit_version = header.version

  def send(self, name: str, frames: list, outcome: str) -> None:
    """Sends one invalid message on connection ``name``; ``outcome`` is the reason it must be rejected for."""
    sock = {"member": self.member, "stranger": self.stranger}[name]
    sock.send_multipart(frames, copy=True)
    self.expected[outcome] += 1
    if outcome in REPLY_REASONS:
      self.replies_expected[name].append(outcome)
    self.drain(sock, name)

  # -- the cases: each sends one message and says how the server must take it ---------------------------

  def case(self, name: str) -> None:
    rng, good = self.rng, self.gradient()
    who = "member" if rng.random() < 0.5 else "stranger"
    worker = 1 if who == "member" else int(rng.integers(0, 2))
    push = self.header(wire.Kind.PUSH, worker, self.member_version if who == "member" else 0)
    if name == "random_bytes":
      first = rng.bytes(int(rng.integers(0, 200)))
      if first[:4] == wire.MAGIC:
        first = b"X" + first[1:]
      extra = [rng.bytes(int(rng.integers(0, 4000))) for _ in range(int(rng.integers(0, 3)))]
      self.send(who, [first, *extra], "malformed")
    elif name == "empty_frame":
      self.send(who, [b""] + ([good] if rng.random() < 0.5 else []), "malformed")
    elif name == "truncated_header":
      self.send(who, [push[: int(rng.integers(0, wire.HEADER_BYTES))], good], "malformed")
    elif name == "long_header":
      self.send(who, [push + rng.bytes(int(rng.integers(1, 65))), good], "malformed")
    elif name == "magic":
      i = int(rng.integers(0, 4))
      bad = bytearray(push)
      bad[i] = (bad[i] + int(rng.integers(1, 256))) % 256
      self.send(who, [bytes(bad), good], "malformed")
    elif name == "kind_code":
      code = pick(rng, [0, *range(max(wire.Kind) + 1, 256)])
      self.send(who, [patch(push, kind=code), good], "malformed")
    elif name == "dtype_code":
      self.send(who, [patch(push, dtype=int(rng.integers(len(wire._DTYPES), 256))), good], "malformed")
    elif name == "reason_code":
      self.send(who, [patch(push, reason=int(rng.integers(len(wire.REASONS) + 1, 256))), good], "malformed")
    elif name == "token":
      token = bytearray(self.token)
      for i in rng.choice(16, int(rng.integers(1, 17)), replace=False):
        token[i] ^= int(rng.integers(1, 256))
      kind = pick(rng, [wire.Kind.HELLO, wire.Kind.PUSH, wire.Kind.BYE])
      header = patch(self.header(kind, worker), token=bytes(token))
      self.send(who, [header, good] if kind == wire.Kind.PUSH else [header], "token")
    elif name == "dtype":
      code = int(rng.integers(1, len(wire._DTYPES)))  # float64, bfloat16, float16 (the run's is float32)
      itemsize = np.dtype(wire.numpy_dtype(wire._DTYPES[code])).itemsize
      n = min(self.count, 4 * self.count // itemsize)  # within MAXMSGSIZE
      self.send(who, [patch(push, dtype=code), rng.bytes(n * itemsize)], "dtype")
    elif name == "count":
      wrong = pick(rng, [0, self.count - 1, self.count + 1, 2**64 - 1, int(rng.integers(0, 2**63))])
      wrong = wrong if wrong != self.count else 0
      self.send(who, [patch(push, count=wrong), good], "shape")
    elif name == "payload_length":
      length = int(rng.integers(0, 4 * self.count))
      self.send(who, [push, good.tobytes()[:length]], "shape")
    elif name == "missing_payload":
      self.send(who, [push], "malformed")
    elif name == "extra_frames":
      # A payload may come in several frames laid end to end (the server sends its leaves so): frames
      # past the payload make it too long, a split payload short of one element too short.
      if rng.random() < 0.5:
        extra = [rng.bytes(int(rng.integers(1, 100))) for _ in range(int(rng.integers(1, 4)))]
        self.send(who, [push, good, *extra], "shape")
      else:
        half = self.count // 2
        self.send(who, [push, good[:half], good[half:-1]], "shape")
    elif name == "control_with_payload":
      kind = pick(rng, [wire.Kind.HELLO, wire.Kind.BYE, wire.Kind.STOP, wire.Kind.ERROR])
      payload = [good] * int(rng.integers(1, 3))
      self.send(who, [self.header(kind, worker), *payload], "malformed")
    elif name == "worker_range":
      bad = pick(rng, [-(2**31), -1, 2, 3, 2**31 - 1, int(rng.integers(2, 2**31))])
      if rng.random() < 0.5:
        self.send(who, [self.header(wire.Kind.HELLO, bad, count=0)], "worker")
      else:
        self.send(who, [self.header(wire.Kind.PUSH, bad, self.member_version), good], "worker")
    elif name == "server_kinds":  # messages only a server sends
      kind = pick(rng, [wire.Kind.PARAMS, wire.Kind.STOP, wire.Kind.ERROR])
      frames = [self.header(kind, worker)] + ([good] if kind == wire.Kind.PARAMS else [])
      # From the registered worker 1: not a message for a server; from a stranger: not its worker id.
      self.send(who, frames, "malformed" if who == "member" else "worker")
    elif name == "impostor":  # a worker id that is not the connection's
      kind = pick(rng, [wire.Kind.PUSH, wire.Kind.BYE])
      claim = 0 if who == "member" else worker
      header = self.header(kind, claim, self.legit_version if claim == 0 else self.member_version)
      self.send(who, [header, good] if kind == wire.Kind.PUSH else [header], "worker")
    elif name == "future_version":  # above any version this run can reach
      version = pick(rng, [2**62, 2**63 - 1, 2**40 + int(rng.integers(0, 2**20))])
      self.send("member", [self.header(wire.Kind.PUSH, 1, version), good], "future_version")
    elif name == "past_version":  # below the version the member was sent, or above it and reached already
      choices = [
        -(2**63),
        -1,
        *range(self.member_version),
        *range(self.member_version + 1, self.legit_pushes + 1),
      ]
      version = pick(rng, choices)
      self.send("member", [self.header(wire.Kind.PUSH, 1, version), good], "version")
    elif name == "non_finite":  # a valid push whose payload is not finite (or says so): the rule rejects it
      grad, finite = good.copy(), True
      if rng.random() < 0.25:
        finite = False
      else:
        grad[rng.choice(self.count, int(rng.integers(1, 6)), replace=False)] = rng.choice(
          [np.nan, np.inf, -np.inf]
        )
      odd = dict(zip(("loss", "step_size", "noise_ratio"), rng.choice([np.nan, np.inf, -1e30, 0.0, 1.0], 3)))
      header = self.header(
        wire.Kind.PUSH, 1, self.member_version, finite=finite, step=int(rng.integers(-9, 9))
      )
      self.member.send_multipart([patch(header, **odd), grad])
      reply, _ = self.receive(self.member, "member")
      assert reply.kind == wire.Kind.PARAMS, reply
      self.member_version = reply.version
      self.non_finite += 1
    elif name == "oversize":  # refused by ZeroMQ itself: the connection is closed, nothing is delivered
      sock = self.context.socket(zmq.DEALER)
      sock.setsockopt(zmq.LINGER, 0)
      monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
      sock.connect(self.address)
      size = 4 * self.count + int(rng.integers(1, 4 * self.count))
      if rng.random() < 0.5:
        sock.send_multipart([push, rng.bytes(size)])
      else:
        sock.send_multipart([rng.bytes(size), good])
      self.oversize += 1
      self.oversize_sockets.append((sock, monitor))
      if len(self.oversize_sockets) >= 50:  # a long campaign would run out of file descriptors
        self.close_oversized()
    else:
      raise ValueError(f"unknown case {name!r}")
    self.sent[name] += 1

  def finish(self) -> None:
    """Waits until the server has handled every message: each connection's last one is answered."""
    self.legit_push()
    self.case("non_finite")  # the member's messages are in order: its reply comes after its ERRORs
    self.send("stranger", [self.header(wire.Kind.PUSH, 0, 0), self.gradient()], "worker")
    self.sent["impostor"] += 1
    deadline = time.monotonic() + 30
    while len(self.replies_got["stranger"]) < len(self.replies_expected["stranger"]):
      if time.monotonic() > deadline:
        break
      if self.stranger.poll(100):
        self.drain(self.stranger, "stranger")
    self.drain(self.member, "member")
    self.close_oversized()

  def close_oversized(self) -> None:
    """Counts the oversized frames' connections ZeroMQ closed, and closes them (each holds descriptors)."""
    for sock, monitor in self.oversize_sockets:
      closed = monitor.poll(5000) and zmq.utils.monitor.recv_monitor_message(monitor)
      self.oversize_closed += bool(closed and closed["event"] == zmq.EVENT_DISCONNECTED)
      if sock.poll(0):
        self.replies_got.setdefault("oversize", []).append("reply")
      sock.disable_monitor()
      monitor.close()
      sock.close()
    self.oversize_sockets = []

  def report(self) -> dict[str, Any]:
    return {
      "sent": dict(self.sent),
      "expected": dict(self.expected),
      "replies_expected": self.replies_expected,
      "replies_got": self.replies_got,
      "non_finite": self.non_finite,
      "oversize": self.oversize,
      "oversize_closed": self.oversize_closed,
      "legit_pushes": self.legit_pushes,
      "legit_mismatches": self.legit_mismatches,
      "legit_sum": self.legit_sum.tolist(),
    }


CASES = {  # relative weights of the fuzzed messages
  "random_bytes": 3,
  "empty_frame": 1,
  "truncated_header": 2,
  "long_header": 1,
  "magic": 1,
  "kind_code": 1,
  "dtype_code": 1,
  "reason_code": 1,
  "token": 2,
  "dtype": 1,
  "count": 1,
  "payload_length": 1,
  "missing_payload": 1,
  "extra_frames": 1,
  "control_with_payload": 1,
  "worker_range": 1,
  "server_kinds": 1,
  "impostor": 1,
  "future_version": 1,
  "past_version": 1,
  "non_finite": 1,
  "oversize": 0.3,
}
LEGIT_EVERY = 10  # one legitimate push per this many fuzzed messages, on average


def fuzz_client(address: str, token: bytes, count: int, frames: int, seed: int) -> dict[str, Any]:
  """Sends ``frames`` fuzzed messages (and worker 0's legitimate pushes) to the server at ``address``."""
  client = _Client(address, token, count, seed)
  client.hello()
  names, weights = list(CASES), np.array(list(CASES.values()))
  plan = client.rng.choice(len(names), size=max(0, frames - 2), p=weights / weights.sum())
  for i in plan:
    if client.rng.random() < 1 / LEGIT_EVERY:
      client.legit_push()
    client.case(names[i])
  client.finish()
  out = client.report()
  for s in client.sockets:
    s.close()
  client.context.term()
  return out


@contextlib.contextmanager
def _quiet(logger: str):
  """The server's per-message warnings are the thing being counted, thousands of them: not printed."""
  log = logging.getLogger(logger)
  level = log.level
  log.setLevel(logging.ERROR)
  try:
    yield
  finally:
    log.setLevel(level)


@dataclasses.dataclass
class FuzzResult:
  """What the fuzzing part measured; ``problems`` lists every check that failed (empty: all passed)."""

  client: dict[str, Any]
  rejected: dict[str, int]
  rule_rejected: int
  version: int
  arrivals: int
  params_finite: bool
  params_exact: bool
  crashed: str | None
  seconds: float
  problems: list[str]

  @property
  def messages(self) -> int:
    return sum(self.client.get("sent", {}).values())


def fuzz(frames: int, seed: int, *, timeout: float = 600.0) -> FuzzResult:
  """Serves a fuzzing client process in this process; checks every count (see the module docstring)."""
  import jax
  import jax.numpy as jnp

  from jaxsync._src.distributed.server import param_server
  from jaxsync._src.strategies import registry as strategies

  started = time.perf_counter()
  server = param_server.ParameterServer(
    strategies.make("asp", 2, learning_rate=LEARNING_RATE), idle_timeout=60
  )
  state = server.init({"w": jnp.zeros([COUNT], jnp.float32)})
  code = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); from benchmarks.faults import fault_campaign as f; "
    "print(json.dumps(f.fuzz_client(sys.argv[2], bytes.fromhex(sys.argv[3]), *map(int, sys.argv[4:]))))"
  )
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  # Files, not pipes: the client writes its report at the end, and a full pipe would hold its exit.
  out_file, err_file = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
  client = subprocess.Popen(
    [
      sys.executable,
      "-c",
      code,
      str(REPO),
      server.address,
      server.token.hex(),
      str(COUNT),
      str(frames),
      str(seed),
    ],
    stdout=out_file,
    stderr=err_file,
    env=env,
    cwd=harness.REPO,
  )
  crashed, rows = None, []
  deadline = time.monotonic() + timeout
  clock = time.perf_counter()
  try:
    with _quiet("jaxsync.server"):
      while time.monotonic() < deadline:
        done = client.poll() is not None
        try:
          state, records = server.advance(state, 1 << 30, max_time=time.perf_counter() - clock + 0.2)
        except Exception as err:  # the server must never raise on a message
          crashed = f"{type(err).__name__}: {err}"
          break
        rows.append(jax.tree.map(np.asarray, records))
        if done:
          break
  finally:
    if client.poll() is None:
      client.kill()
    client.wait(timeout=60)
    server.stop(timeout=0.1)
    out_file.seek(0)
    err_file.seek(0)
    out, err = out_file.read(), err_file.read()
    out_file.close()
    err_file.close()
  problems = []
  try:
    report = json.loads(out.strip().splitlines()[-1])
  except (IndexError, json.JSONDecodeError):
    report = {}
    problems.append(f"the fuzzing client failed (exit {client.returncode}): {err.strip()[-2000:]}")
  rejected_rows = np.concatenate([r.rejected for r in rows]) if rows else np.zeros(0, bool)
  workers = np.concatenate([r.worker for r in rows]) if rows else np.zeros(0, int)
  params = np.asarray(state.params["w"])
  version = int(state.version)
  legit = report.get("legit_pushes", -1)
  expected_w = (-(2.0**-9) * np.asarray(report.get("legit_sum", np.zeros(COUNT)))).astype(np.float32)
  result = FuzzResult(
    client=report,
    rejected=dict(server.rejected_messages),
    rule_rejected=int(rejected_rows.sum()),
    version=version,
    arrivals=int(len(rejected_rows)),
    params_finite=bool(np.isfinite(params).all()),
    params_exact=bool(np.array_equal(params, expected_w)),
    crashed=crashed,
    seconds=time.perf_counter() - started,
    problems=problems,
  )
  if report:
    checks = {
      "the server raised": crashed is None,
      "rejections by reason differ from the invalid messages sent": result.rejected == report["expected"],
      "ERROR replies differ from the expected reasons, in order": report["replies_got"].get("member")
      == report["replies_expected"]["member"]
      and report["replies_got"].get("stranger") == report["replies_expected"]["stranger"],
      "an oversized frame was answered": "oversize" not in report["replies_got"],
      "a ZeroMQ connection with an oversized frame was not closed": report["oversize_closed"]
      == report["oversize"],
      "the version is not the count of legitimate pushes": version == legit,
      "worker 0 got a reply with another version or other parameters": report["legit_mismatches"] == 0,
      "the parameters are not exactly worker 0's updates": result.params_exact,
      "the parameters are not finite": result.params_finite,
      "arrivals other than worker 0's pushes and the non-finite ones": result.arrivals
      == legit + report["non_finite"],
      "the rule's rejections are not the non-finite pushes": result.rule_rejected == report["non_finite"]
      and bool(np.all(workers[rejected_rows] == 1))
      and bool(np.all(workers[~rejected_rows] == 0)),
    }
    problems += [what for what, ok in checks.items() if not ok]
  return result


# -- parts 2-4: real runs through `jaxsync launch` ---------------------------------------------------------


class Launched:
  """A ``jaxsync`` command in its own process; its output collected, line by line, with times."""

  def __init__(self, args: list[str], env: dict[str, str] | None = None, cwd: pathlib.Path = harness.REPO):
    self.started = time.monotonic()
    self.lines: list[tuple[float, str]] = []
    self.process = subprocess.Popen(
      args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd
    )
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  @classmethod
  def jaxsync(cls, *args: str) -> Launched:
    env = {
      **os.environ,
      "PYTHONUNBUFFERED": "1",
      "JAX_PLATFORMS": "cpu",
      "JAXSYNC_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
    }
    return cls([sys.executable, "-m", "jaxsync.cli", *args, "--progress", "quiet"], env)

  def _read(self) -> None:
    for line in self.process.stdout:
      self.lines.append((time.time(), line))

  @property
  def log(self) -> str:
    return "".join(line for _, line in self.lines)

  def wait_for(self, pattern: str, timeout: float, count: int = 1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if len(re.findall(pattern, self.log)) >= count:
        return True
      if self.process.poll() is not None:
        time.sleep(0.2)
        return len(re.findall(pattern, self.log)) >= count
      time.sleep(0.05)
    return False

  def wait(self, timeout: float) -> int | None:
    """The exit code, or None after ``timeout`` seconds (every process it started is then killed)."""
    try:
      code = self.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.kill_tree()
      return None
    self._reader.join(timeout=10)
    return code

  def processes(self) -> dict[int, Any]:
    """The launched processes by their ``JAXSYNC_PROCESS_ID``."""
    import psutil

    found = {}
    try:
      children = psutil.Process(self.process.pid).children()
    except psutil.Error:
      return found
    for child in children:
      try:
        found[int(child.environ()["JAXSYNC_PROCESS_ID"])] = child
      except (psutil.Error, KeyError, ValueError):
        continue
    return found

  def kill_tree(self) -> None:
    import psutil

    try:
      children = psutil.Process(self.process.pid).children(recursive=True)
    except psutil.Error:
      children = []
    for child in children:
      with contextlib.suppress(psutil.Error):
        child.kill()
    with contextlib.suppress(OSError):
      self.process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
      self.process.wait(timeout=10)


def run_overrides(strategy: str, gradients: int, **run) -> list[str]:
  """A small run of the quickstart config: digits MLP, three workers."""
  options = {"asp": "{learning_rate: 0.05}", "ssp": "{learning_rate: 0.05, staleness_bound: 3}"}[strategy]
  sets = {
    "model.name": "mlp",
    "strategy.name": strategy,
    "strategy.options": options,
    "cluster.num_workers": 3,
    "run.gradients": gradients,
    "run.chunk": 100,
    "run.eval_every": 500,
    "run.target_accuracy": 0.9,
    "run.checkpoint_every": 1000,
    **{f"run.{k}": v for k, v in run.items()},
  }
  return [f"--set={k}={v}" for k, v in sets.items()]


def launch(out: pathlib.Path, overrides: list[str]) -> Launched:
  if out.exists():
    shutil.rmtree(out)
  return Launched.jaxsync("launch", "-n", "4", "configs/quickstart.yaml", *overrides, "--out", str(out))


def metrics_rows(run_dir: pathlib.Path, kind: str = "train") -> list[dict[str, Any]]:
  path = run_dir / "metrics.jsonl"
  if not path.exists():
    return []
  rows = []
  for line in path.read_text().splitlines():
    with contextlib.suppress(json.JSONDecodeError):
      row = json.loads(line)
      if row.get("kind") == kind:
        rows.append(row)
  return rows


def wait_for_event(run: Launched, run_dir: pathlib.Path, event: int, timeout: float) -> bool:
  """Waits until the run's metrics have a train row at ``event`` or later."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and run.process.poll() is None:
    rows = metrics_rows(run_dir)
    if rows and rows[-1]["event"] >= event:
      return True
    time.sleep(0.05)
  return False


def final_records(run_dir: pathlib.Path) -> dict[str, np.ndarray] | None:
  """The per-event records (worker, staleness, version, released, rejected, time) of the last checkpoint."""
  import orbax.checkpoint as ocp

  root = run_dir / "checkpoints"
  steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []
  if not steps:
    return None
  restored = ocp.StandardCheckpointer().restore(root / str(steps[-1]) / "records")
  return {k: np.asarray(v) for k, v in restored.items() if not isinstance(v, dict)}


_DROPPED = re.compile(
  r"worker (\d+) is back after it was declared lost: its message of version (\d+) is dropped "
  r"\(the server is at (\d+)\)"
)


def _dropped(log: str) -> dict[int, int]:
  """How stale each worker's first message dropped for coming back after it was declared lost was."""
  found: dict[int, int] = {}
  for worker, version, server in _DROPPED.findall(log):
    found.setdefault(int(worker), int(server) - int(version))
  return found


def _stale_push(records: dict[str, np.ndarray] | None, fault: Fault) -> tuple[int | None, int | None]:
  """(staleness, event) of a stopped worker's first push after its stop: the one after its longest pause."""
  if records is None:
    return None, None
  mine = np.nonzero(records["worker"] == fault.worker)[0]
  if len(mine) < 2:
    return None, None
  gaps = np.diff(records["time"][mine])
  i = int(np.argmax(gaps))
  if gaps[i] < 0.5 * fault.seconds:  # no push came back after the stop
    return None, None
  event = int(mine[i + 1])
  return int(records["staleness"][event]), event + 1


def _summary(run_dir: pathlib.Path) -> dict[str, Any] | None:
  path = run_dir / "summary.json"
  return json.loads(path.read_text()) if path.exists() else None


def _rejections(log: str) -> collections.Counter[str]:
  return collections.Counter(re.findall(r"rejected a message from [^:]+: (\w+) \(", log))


def _server_crashed(log: str) -> bool:
  """Process 0 printed a Python traceback or a JAX fatal error."""
  return bool(re.search(r"^\[p0\] (Traceback|F\d{4} )", log, re.M))


@dataclasses.dataclass
class Fault:
  """One injected fault: ``kind`` kill or stop, on ``worker``, when the run reached ``fraction`` of it."""

  kind: str
  worker: int
  fraction: float
  seconds: float = 0.0  # of a stop
  event: int | None = None  # the logged event when it was injected
  declared_lost: bool = False
  survived: bool = False
  aborted_by_jax: bool = False
  stale_push: int | None = None  # the staleness of the first push after a stop (computed before it)
  stale_event: int | None = None  # the event that push was
  dropped_staleness: int | None = None  # that push dropped, not applied: how stale it would have been


@dataclasses.dataclass
class WorkerRun:
  """One run with worker faults and what came of it."""

  strategy: str
  faults: list[Fault]
  code: int | None
  summary: dict[str, Any] | None
  rejections: dict[str, int]
  crashed: bool
  consistent: bool
  lost_updates: int | None
  seconds: float
  problems: list[str]
  other_staleness: int | None = None  # the largest staleness of the run's other pushes (not after a stop)

  @property
  def finished(self) -> bool:
    return self.code == 0 and self.summary is not None

  @property
  def hung(self) -> bool:
    return self.code is None


def _signal(process, signum: int) -> None:
  """Sends ``signum`` unless the process is gone."""
  import psutil

  with contextlib.suppress(psutil.Error):
    process.send_signal(signum)


def random_faults(rng: np.random.Generator) -> list[Fault]:
  """One or two faults on distinct workers of three, one worker left alone: SIGKILL, or SIGSTOP for 1-5 s."""
  survivor = int(rng.integers(3))
  targets = [w for w in range(3) if w != survivor]
  rng.shuffle(targets)
  faults = []
  for worker in targets[: int(rng.integers(1, 3))]:
    kind = str(rng.choice(["kill", "stop"]))
    seconds = float(rng.uniform(1.0, 5.0)) if kind == "stop" else 0.0
    faults.append(Fault(kind, int(worker), float(rng.uniform(0.1, 0.6)), seconds))
  return sorted(faults, key=lambda f: f.fraction)


def worker_fault_run(out: pathlib.Path, strategy: str, gradients: int, faults: list[Fault]) -> WorkerRun:
  """One run of 1 server + 3 workers with ``faults`` injected when the run reaches their fractions."""
  started = time.monotonic()
  run = launch(out, run_overrides(strategy, gradients))
  problems = []
  stops: list[Fault] = []
  timers: list[threading.Timer] = []
  try:
    if not run.wait_for(r"worker \d joined", 180, count=3):
      problems.append("the workers did not all join")
    processes = run.processes()
    for fault in faults:
      at = int(fault.fraction * gradients)  # 0: as soon as every worker has joined
      if at and not wait_for_event(run, out, at, 120):
        problems.append(f"the run ended before its {fault.kind} of worker {fault.worker}")
        break
      rows = metrics_rows(out)
      fault.event = rows[-1]["event"] if rows else 0
      victim = processes.get(fault.worker + 1)
      if victim is None:
        problems.append(f"process {fault.worker + 1} not found")
        continue
      if fault.kind == "kill":
        victim.send_signal(signal.SIGKILL)
      else:  # continued by a timer: the next fault does not wait for it
        victim.send_signal(signal.SIGSTOP)
        timer = threading.Timer(fault.seconds, _signal, (victim, signal.SIGCONT))
        timer.start()
        timers.append(timer)
        stops.append(fault)
    code = run.wait(RUN_TIMEOUT)
  finally:
    for timer in timers:  # a stopped process is never left stopped
      timer.join()
    if run.process.poll() is None:
      run.kill_tree()
  log, summary = run.log, _summary(out)
  rejections = dict(_rejections(log))
  lost_workers = {x["worker"] for x in (summary or {}).get("lost_workers", [])}
  for fault in faults:
    fault.declared_lost = fault.worker in lost_workers
    fault.survived = bool(re.search(rf"\[p{fault.worker + 1}\] worker {fault.worker}: \d+ pushes", log))
    fault.aborted_by_jax = f"process {fault.worker + 1} ended with signal 6" in log
  rows = metrics_rows(out)
  records = final_records(out)
  dropped = _dropped(log)
  for fault in stops:
    if fault.worker in dropped:  # the server dropped it: what came next was computed after rejoining
      fault.dropped_staleness = dropped[fault.worker]
    else:
      fault.stale_push, fault.stale_event = _stale_push(records, fault)
  other = None
  if records is not None:
    keep = np.ones(len(records["staleness"]), bool)
    keep[[f.stale_event - 1 for f in stops if f.stale_event is not None]] = False
    other = int(records["staleness"][keep & ~records["rejected"]].max(initial=0))
  for fault in faults:
    if fault.kind == "kill" and f"process {fault.worker + 1} ended with signal 9" not in log:
      problems.append(f"worker {fault.worker}'s process did not end with SIGKILL")
  consistent, lost, crashed_worker = False, None, False
  if summary is not None and records is not None:
    accepted = int((~records["rejected"]).sum())
    dropped_count = summary.get("dropped_gradients", 0)
    consistent = bool(
      summary["events"] == gradients == len(records["version"])
      and summary["gradients"] == gradients + dropped_count  # a dropped push is a gradient, not an event
      and dropped_count == len(_DROPPED.findall(log))
      and accepted == summary["events"] - summary["rejected"]
      and int(records["released"].sum()) == accepted  # asp, ssp: every accepted arrival is an update
      and int(records["version"][-1]) == summary["updates"]
      and bool(np.all(np.diff(records["version"]) == records["released"][1:]))
      and rows
      and rows[-1]["updates"] == summary["updates"]
    )
    lost = accepted - summary["updates"]  # applied updates the run does not hold at its end
    if not consistent:
      totals = {k: summary.get(k) for k in ("events", "gradients", "updates", "dropped_gradients")}
      problems.append(f"inconsistent totals: {totals}")
  elif summary is not None:
    problems.append("no final checkpoint")
  # A worker never faulted must finish: its death would be a crash of the runtime.
  for worker in set(range(3)) - {f.worker for f in faults}:
    if not re.search(rf"\[p{worker + 1}\] worker {worker}: \d+ pushes", log):
      problems.append(f"worker {worker}, never faulted, did not finish")
      crashed_worker = True
  crashed = _server_crashed(log) or bool(code not in (0, None)) or crashed_worker
  return WorkerRun(
    strategy,
    faults,
    code,
    summary,
    rejections,
    crashed,
    bool(consistent),
    lost,
    time.monotonic() - started,
    problems + ([] if code == 0 else [f"exit {code}: {log[-1500:]}"]),
    other,
  )


_REJOIN_WORKER = """
import sys
import jax
from jaxsync._src.app import config as config_lib
from jaxsync._src.app import experiment
from jaxsync._src.distributed import cluster, ps_worker
from jaxsync._src.distributed.server import param_server
group = cluster.initialize()
client = cluster.coordination_client()
heartbeat = cluster.Heartbeat(client, group.index).start()
exp = experiment.build(config_lib.load(sys.argv[1] + "/config.yaml"))
address = client.blocking_key_value_get(param_server.KEY_ADDRESS, 60_000)
token = client.blocking_key_value_get_bytes(param_server.KEY_TOKEN, 60_000)
done = ps_worker.run_worker(exp.strategy, exp.loss_fn, exp.data, exp.model.params, worker=group.index - 1,
                            address=address, token=token, reply_timeout=60)
heartbeat.stop()
print(f"worker {group.index - 1}: {done['pushes']} pushes after rejoining; the server said stop", flush=True)
jax.distributed.shutdown()
"""


@dataclasses.dataclass
class RejoinRun:
  """Two workers killed and started again: with the launcher's command line, and through the worker loop."""

  code: int | None
  summary: dict[str, Any] | None
  same_command: dict[str, Any]
  worker_loop: dict[str, Any]
  crashed: bool
  consistent: bool
  seconds: float
  problems: list[str]
  rejections: dict[str, int] = dataclasses.field(default_factory=dict)
  log: str = ""


def _dead(process, timeout: float = 10.0) -> None:
  """Waits until a process we do not parent is gone or a zombie (its parent reaps it later)."""
  import psutil

  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    try:
      if process.status() == psutil.STATUS_ZOMBIE:
        return
    except psutil.NoSuchProcess:
      return
    time.sleep(0.05)


def _where_waiting(text: str) -> str | None:
  """The innermost jaxsync line of the main thread in a process's faulthandler dump (with its source)."""
  for block in re.split(r"\n\s*\n", text.split("Fatal Python error", 1)[-1]):
    if "<module>" not in block:  # the main thread's stack ends in the script's module
      continue
    for path, line in re.findall(r'File "([^"]*jaxsync[^"]*\.py)", line (\d+)', block):
      source = pathlib.Path(path).read_text().splitlines()[int(line) - 1].strip()
      return f"{harness._relative(pathlib.Path(path))}:{line} `{source}`"
  return None


def rejoin_run(out: pathlib.Path, gradients: int, rng: np.random.Generator) -> RejoinRun:
  """Kills two workers; restarts one with the launcher's command line, one through the worker loop."""
  started = time.monotonic()
  run = launch(out, run_overrides("asp", gradients))
  problems, restarted = [], {}
  try:
    if not run.wait_for(r"worker \d joined", 180, count=3):
      problems.append("the workers did not all join")
    processes = run.processes()
    first, second = (int(w) for w in rng.permutation(3)[:2])
    for how, worker, fraction in (("same_command", first, 0.05), ("worker_loop", second, 0.1)):
      wait_for_event(run, out, int(fraction * gradients), 120)
      victim = processes[worker + 1]
      command, env, cwd = victim.cmdline(), victim.environ(), victim.cwd()
      victim.send_signal(signal.SIGKILL)
      _dead(victim)
      if how == "worker_loop":
        command = [sys.executable, "-c", _REJOIN_WORKER, str(out)]
      # A fatal signal (JAX aborts a process whose coordinator is gone) dumps its Python stack.
      restarted[how] = (
        worker,
        Launched(command, env={**env, "PYTHONFAULTHANDLER": "1"}, cwd=pathlib.Path(cwd)),
      )
    code = run.wait(RUN_TIMEOUT)
    outcomes = {}
    for how, (worker, process) in restarted.items():
      try:  # with process 0 gone its coordinator is gone: JAX ends a process left behind
        exited = process.process.wait(timeout=30)
      except subprocess.TimeoutExpired:
        process.process.send_signal(signal.SIGABRT)  # still there: its stack, then its end
        exited = process.wait(10)
      process._reader.join(timeout=10)
      text = process.log
      joined = [int(v) for v in re.findall(rf"worker {worker} joined at version (\d+)", run.log)]
      outcomes[how] = {
        "worker": worker,
        "joined_coordination": f"process {worker + 1} of 4" in text,
        "hello_at_server": len(joined) >= 2,
        "joined_at": joined[1:],
        "pushes": int(m.group(1))
        if (m := re.search(r"(\d+) pushes (?:after rejoining|in [\d.]+ s)", text))
        else 0,
        "exit": exited,
        "waiting_at": _where_waiting(text),
      }
  finally:
    if run.process.poll() is None:
      run.kill_tree()
    for _, process in restarted.values():
      if process.process.poll() is None:
        process.kill_tree()
  log, summary = run.log, _summary(out)
  consistent = bool(
    summary
    and summary["events"] == gradients
    and summary["updates"] == summary["events"] - summary["rejected"]
  )
  if outcomes["worker_loop"]["pushes"] == 0:
    problems.append("the worker started again through the worker loop made no push")
  if outcomes["same_command"]["pushes"] == 0:
    problems.append("the worker started again with the launcher's command line made no push")
  return RejoinRun(
    code,
    summary,
    outcomes["same_command"],
    outcomes["worker_loop"],
    _server_crashed(log) or code not in (0, None),
    consistent,
    time.monotonic() - started,
    problems + ([] if code == 0 else [f"exit {code}: {log[-1500:]}"]),
    dict(_rejections(log)),
    log,
  )


@dataclasses.dataclass
class ServerKill:
  """A server killed after a checkpoint, and its resume."""

  killed_at: int | None  # the last logged event before the kill
  updates_logged: int | None  # the server's updates at that event
  checkpoint: int | None  # the last checkpoint's event count
  checkpoint_updates: int | None
  resumed_at: list[int]  # the versions the workers were sent on joining the resumed server
  resumed_from: int | None  # the version before the resumed server's first event (the final records)
  code: int | None  # of the killed launch (process 0's: -9)
  resume_code: int | None
  summary: dict[str, Any] | None
  crashed: bool
  seconds: float
  problems: list[str]

  @property
  def lost_updates(self) -> int | None:
    """Updates applied after the last checkpoint (as far as the metrics logged them): redone on resume."""
    if self.updates_logged is None or self.checkpoint_updates is None:
      return None
    return self.updates_logged - self.checkpoint_updates

  @property
  def finished(self) -> bool:
    return self.resume_code == 0 and self.summary is not None


def server_kill_run(
  out: pathlib.Path, gradients: int, rng: np.random.Generator, chunk: int = 50
) -> ServerKill:
  started = time.monotonic()
  every = 500
  run = launch(out, run_overrides("asp", gradients, chunk=chunk, checkpoint_every=every))
  problems = []
  if not run.wait_for(r"worker \d joined", 180, count=3):
    problems.append("the workers did not all join")
  # Somewhere between the first checkpoint and 70% of the run, off the checkpoint boundaries.
  target = int(rng.uniform(every + chunk, 0.7 * gradients))
  wait_for_event(run, out, target, 120)
  try:
    server = run.processes().get(0)
    if server is not None:
      server.send_signal(signal.SIGKILL)
    code = run.wait(120)
  finally:
    if run.process.poll() is None:
      run.kill_tree()
  rows = metrics_rows(out)  # as the killed server left them (a resume cuts them back to its checkpoint)
  steps = sorted(int(p.name) for p in (out / "checkpoints").glob("*") if p.is_dir() and p.name.isdigit())
  checkpoint = steps[-1] if steps else None
  at = {r["event"]: r["updates"] for r in rows}
  if (out / "summary.json").exists():
    problems.append("the run finished before the server was killed")
  resumed = Launched.jaxsync("resume", str(out))
  try:
    resume_code = resumed.wait(RUN_TIMEOUT)
  finally:
    if resumed.process.poll() is None:
      resumed.kill_tree()
  log = resumed.log
  summary = _summary(out)
  joined = [int(v) for v in re.findall(r"worker \d joined at version (\d+)", log)]
  if summary is not None and summary["updates"] != summary["events"] - summary["rejected"]:
    problems.append("the resumed run's totals disagree")
  if summary is not None and summary["events"] != gradients:
    problems.append(f"the resumed run stopped at {summary['events']} events")
  records = final_records(out) if summary is not None else None
  resumed_from = None
  if records is not None and checkpoint is not None and checkpoint < len(records["version"]):
    resumed_from = int(records["version"][checkpoint]) - int(records["released"][checkpoint])
  result = ServerKill(
    resumed_from=resumed_from,
    killed_at=rows[-1]["event"] if rows else None,
    updates_logged=rows[-1]["updates"] if rows else None,
    checkpoint=checkpoint,
    checkpoint_updates=at.get(checkpoint),
    resumed_at=joined,
    code=code,
    resume_code=resume_code,
    summary=summary,
    crashed=_server_crashed(log) or resume_code not in (0, None),
    seconds=time.monotonic() - started,
    problems=problems + ([] if resume_code == 0 else [f"resume exit {resume_code}: {log[-1500:]}"]),
  )
  if resumed_from != result.checkpoint_updates or not joined or joined[0] != result.checkpoint_updates:
    result.problems.append(
      f"the resumed server started from version {resumed_from}, its workers joined at {joined}; "
      f"the checkpoint holds {result.checkpoint_updates}"
    )
  return result


# -- parts 5-8: supervised runs (`jaxsync launch --max-restarts`), every runtime -----------------------------

MAX_RESTARTS = 20  # per launch: more than any run's faults, so that no run ends for want of restarts
CAMPAIGN_RESUMES = 8  # `jaxsync resume` after an exit 75 (a preemption), at most, per run
RECOVERY_TIMEOUT = 150.0  # seconds a run may take to make progress again after a fault


class Progress:
  """Polls ``run_dir/metrics.jsonl``: every change of its last train row, with its time (unix seconds)."""

  def __init__(self, run_dir: pathlib.Path):
    self.path = run_dir / "metrics.jsonl"
    self.changes: list[tuple[float, int, int]] = []  # (time, event, updates) of each new last row
    self.finished_at: float | None = None  # when summary.json first appeared: the run's end
    self._seen = None
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._poll, daemon=True)
    self._thread.start()

  def _poll(self) -> None:
    stamp = None
    while not self._stop.wait(0.1):
      if self.finished_at is None and self.path.with_name("summary.json").exists():
        self.finished_at = time.time()
      try:
        st = self.path.stat()
      except FileNotFoundError:
        continue
      if (st.st_size, st.st_mtime_ns) == stamp:
        continue
      stamp = (st.st_size, st.st_mtime_ns)
      rows = metrics_rows(self.path.parent)
      if rows and (rows[-1]["event"], rows[-1]["updates"]) != self._seen:
        self._seen = (rows[-1]["event"], rows[-1]["updates"])
        self.changes.append((time.time(), *self._seen))

  def stop(self) -> None:
    self._stop.set()
    self._thread.join(timeout=5)

  @property
  def event(self) -> int | None:
    return self.changes[-1][1] if self.changes else None

  def progressed_after(self, t: float) -> float | None:
    """The time of the first new train row after ``t`` that moved the run forward (a later event)."""
    for (_, before, _), (when, event, _) in zip(self.changes, self.changes[1:]):
      if when > t and event > before:
        return when
    return None


@dataclasses.dataclass
class Injected:
  """One fault of a supervised run, and what came of it."""

  kind: str  # kill (SIGKILL), stop (SIGSTOP, SIGCONT after `seconds`), term (SIGTERM), launcher_term
  role: str  # worker, server, shard, aggregator, node worker, peer, primary, process, launcher
  process: int | None  # JAXSYNC_PROCESS_ID (None: the launcher)
  at: float  # unix seconds
  since_start: float  # seconds since the run's first launch
  event: int | None  # the last logged event (train row) at the fault
  updates: int | None  # the updates at that row
  seconds: float = 0.0  # of a stop
  restart: int | None = None  # the restarts.jsonl entry it caused
  scope: str | None = None  # process (restarted alone) | run (every process) | resume (by the campaign)
  ended: str | None = None  # how the process ended, as restarts.jsonl says
  checkpoint: int | None = None  # the checkpoint the restart or resume started from
  down_seconds: float | None = None  # restarts.jsonl: from the death noticed to the restart
  recovered_seconds: float | None = None  # from the fault to the next progress row after the restart
  rejoined_seconds: float | None = None  # from the fault to the restarted worker joining the server
  completed: int | None = None  # rounds the survivors of a synchronous run said were complete
  lost: int | None = None  # updates (rounds) done before the fault that the run restarted without
  note: str = ""


@dataclasses.dataclass
class SupervisedRun:
  """A run under `jaxsync launch --max-restarts` with faults at random times."""

  part: str
  runtime: str  # single, sharded, inhad, sync
  strategy: str
  processes: int
  gradients: int
  events: int  # the run's full count of events (a synchronous run's are rounds of all its workers)
  faults: list[Injected]
  planned: int
  restarts: list[dict[str, Any]]
  resumes: list[dict[str, Any]]  # the campaign's `jaxsync resume` after an exit 75
  code: int | None  # the last launch's exit code (None: a hang)
  summary: dict[str, Any] | None
  consistent: bool | None  # the run's totals agree (parameter-server runs)
  unexplained: list[str]  # restarts (process deaths) no injected fault explains
  after_end: list[str]  # restarts of a process after the run had ended (its summary written)
  tracebacks: int
  params: str | None  # sha256 of the final parameters
  seconds: float
  problems: list[str]
  label: str = ""  # the preemption part's name of its config

  @property
  def finished(self) -> bool:
    return self.code == 0 and self.summary is not None and self.summary.get("events") == self.events

  @property
  def hung(self) -> bool:
    return self.code is None

  @property
  def crashed(self) -> bool:
    return (self.code not in (0, None)) or bool(self.unexplained) or self.tracebacks > 0


class Session:
  """One run directory's launches: the first `jaxsync launch`, and `jaxsync resume` after each exit 75."""

  def __init__(self, out: pathlib.Path, launch_args: list[str], max_restarts: int = MAX_RESTARTS):
    self.out, self.max_restarts = out, max_restarts
    if out.exists():
      shutil.rmtree(out)
    self.started = time.time()
    self.launches = [
      Launched.jaxsync("launch", *launch_args, "--out", str(out), "--max-restarts", str(max_restarts))
    ]
    self.resumes: list[dict[str, Any]] = []

  @property
  def current(self) -> Launched:
    return self.launches[-1]

  def tick(self) -> bool:
    """Resumes a run that stopped on a preemption notice; True while a launch is running."""
    code = self.current.process.poll()
    if code is None:
      return True
    if code == 75 and not (self.out / "summary.json").exists() and len(self.resumes) < CAMPAIGN_RESUMES:
      self.current.wait(10)
      self.resumes.append(
        {"time": time.time(), "checkpoint": latest_checkpoint(self.out), "event": last_event(self.out)}
      )
      self.launches.append(
        Launched.jaxsync("resume", str(self.out), "--max-restarts", str(self.max_restarts))
      )
      return True
    return False

  def processes(self) -> dict[int, Any]:
    return self.current.processes() if self.current.process.poll() is None else {}

  def wait_end(self, timeout: float) -> int | None:
    """The exit code of the run's last launch, or None (every process then killed) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if not self.tick():
        return self.current.wait(10)
      time.sleep(0.2)
    self.kill()
    return None

  def kill(self) -> None:
    for launched in self.launches:
      if launched.process.poll() is None:
        launched.kill_tree()

  def lines(self) -> list[tuple[float, str]]:
    return [x for launched in self.launches for x in launched.lines]

  @property
  def log(self) -> str:
    return "".join(line for _, line in self.lines())


def latest_checkpoint(run_dir: pathlib.Path) -> int | None:
  steps = [int(p.name) for p in (run_dir / "checkpoints").glob("*") if p.name.isdigit()]
  return max(steps, default=None)


def last_event(run_dir: pathlib.Path) -> int | None:
  rows = metrics_rows(run_dir)
  return rows[-1]["event"] if rows else None


def read_restarts(run_dir: pathlib.Path) -> list[dict[str, Any]]:
  path = run_dir / "restarts.jsonl"
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def params_digest(run_dir: pathlib.Path) -> str | None:
  """sha256 of the final checkpoint's parameters (every leaf's bytes, in tree order)."""
  import hashlib

  import jax
  import orbax.checkpoint as ocp

  step = latest_checkpoint(run_dir)
  if step is None:
    return None
  try:
    state = ocp.StandardCheckpointer().restore(run_dir / "checkpoints" / str(step) / "state")
  except Exception as err:  # noqa: BLE001 - reported, not raised
    return f"unreadable: {type(err).__name__}"
  params = state["params"] if isinstance(state, dict) and "params" in state else state
  digest = hashlib.sha256()
  for leaf in jax.tree.leaves(params):
    digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  return digest.hexdigest()[:16]


_COMPLETED = re.compile(r"after (\d+) completed rounds")


@dataclasses.dataclass
class Layout:
  """Which process plays which role in a launched run."""

  runtime: str
  processes: int
  servers: int = 1  # parameter-server runs: processes 0..servers-1
  nodes: int = 0  # InHAD: nodes of `local` workers; a node's first worker process runs its aggregator
  local: int = 0

  def workers(self) -> list[int]:
    return list(range(self.servers, self.processes)) if self.runtime != "sync" else []

  def worker_of(self, process: int) -> int:
    return process - self.servers

  def aggregators(self) -> list[int]:
    return [self.servers + n * self.local for n in range(self.nodes)]


def _choose(
  rng: np.random.Generator, layout: Layout, role: str, spared: int | None, out: set[int], *, draw: bool = True
) -> int:
  """A process for ``role``: never the spared worker, never one in ``out`` (gone for good, or rejoining);
  -1 if none is left. ``draw=False``: whether one is left, without drawing from ``rng``."""
  if role in ("primary", "server"):
    return 0
  if role == "shard":
    choices = list(range(layout.servers))
  elif role in ("peer", "process"):
    choices = list(range(1 if role == "peer" else 0, layout.processes))
  elif role == "aggregator":
    choices = [p for p in layout.aggregators() if p != spared and p not in out]
  elif role == "node worker":
    choices = [p for p in layout.workers() if p not in layout.aggregators() and p != spared and p not in out]
  else:  # any worker, as long as another stays up: the server stops once every worker is lost
    up = [p for p in layout.workers() if p not in out]
    choices = [p for p in up if p != spared] if len(up) >= 2 else []
  if not draw:
    return 0 if choices else -1
  return pick(rng, choices) if choices else -1


def supervised_run(
  part: str,
  out: pathlib.Path,
  layout: Layout,
  strategy: str,
  launch_args: list[str],
  gradients: int,
  plan: list[tuple[str, str]],
  rng: np.random.Generator,
  *,
  delay: tuple[float, float] = (2.0, 6.0),
  stop_seconds: tuple[float, float] = (1.0, 5.0),
  first_at: int = 0,
  last_fraction: float = 0.8,
  timeout: float = RUN_TIMEOUT,
) -> SupervisedRun:
  """Launches a run under supervision and injects ``plan``'s faults, ``(kind, role)``, one after another.

  Each fault comes a random delay (``delay`` seconds) after the run has recovered from the one before
  (every process up, a restarted worker rejoined, a new progress row), or after the run's ``first_at``-th
  event for the first. A planned fault the run ends before is not injected (``planned`` counts them all).
  """
  started = time.monotonic()
  events = gradients // layout.processes if layout.runtime == "sync" else gradients
  session = Session(out, launch_args)
  progress = Progress(out)
  faults: list[Injected] = []
  problems: list[str] = []
  timers: list[threading.Timer] = []
  # One worker never faulted when there are three or more: its death would be the runtime's doing.
  spared = pick(rng, layout.workers()) if len(layout.workers()) >= 3 and layout.runtime != "inhad" else None
  gone: set[int] = set()  # InHAD workers that are not restarted

  def restarted_after(t: float) -> float | None:
    """The time of the first restart of every process (the launcher's, or the campaign's resume) after ``t``."""
    times = [r["time"] for r in read_restarts(out) if r["scope"] == "run"] + [
      r["time"] for r in session.resumes
    ]
    return min((x for x in times if x > t), default=None)

  def healthy(since: float, expect: str | None) -> bool:
    """Every process up (but those gone for good), the expected restart done, a progress row since."""
    if expect == "run":
      since = restarted_after(since)
      if since is None:
        return False
    # An InHAD worker a stop ended (JAX aborts a process the coordination service marked dead) is gone
    # for good too: only the server must be up.
    required = {0} if layout.runtime == "inhad" else set(range(layout.processes)) - gone
    if not required <= set(session.processes()):
      return False
    return progress.progressed_after(since) is not None and (progress.event or 0) >= first_at

  def rejoining() -> set[int]:
    """Processes restarted alone that have not rejoined the server yet (not faulted again till then)."""
    for process, at in list(pending.items()):
      pattern = re.compile(rf"worker {layout.worker_of(process)} joined")
      if any(when > at and pattern.search(line) for when, line in session.lines()):
        del pending[process]
    return set(pending)

  def wait(seconds: float, until=None) -> bool:
    """Waits ``seconds`` (or until ``until()``); False if the run ended."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
      if not session.tick() or (session.out / "summary.json").exists():
        return False
      if until is not None and until():
        return True
      time.sleep(0.1)
    return until is None

  try:
    since, expect = session.started, None
    pending: dict[int, float] = {}  # a worker process restarted alone: when it was faulted
    for kind, role in plan:
      if not wait(RECOVERY_TIMEOUT, lambda s=since, e=expect: healthy(s, e)):
        if session.current.process.poll() is None and not (out / "summary.json").exists():
          problems.append(f"no recovery within {RECOVERY_TIMEOUT:.0f} s of the fault before a planned {kind}")
        break
      if not wait(float(rng.uniform(*delay))):
        break
      if (progress.event or 0) > last_fraction * events:
        break  # a process restarted now would rejoin a run that has ended
      if role in ("worker", "node worker", "aggregator"):  # one that is up: wait for one to rejoin
        if not wait(
          RECOVERY_TIMEOUT,
          lambda r=role: _choose(rng, layout, r, spared, gone | rejoining(), draw=False) >= 0,
        ):
          break
      procs = session.processes()
      victim = None if role == "launcher" else _choose(rng, layout, role, spared, gone | rejoining())
      target = session.current.process if victim is None else procs.get(victim)
      if target is None:
        problems.append(f"no process {victim} ({role}) to fault")
        continue
      now = time.time()
      rows = metrics_rows(out)
      fault = Injected(
        kind, role, victim, now, now - session.started,
        rows[-1]["event"] if rows else None, rows[-1]["updates"] if rows else None,
      )  # fmt: skip
      if kind == "stop":
        fault.seconds = float(rng.uniform(*stop_seconds))
        _signal(target, signal.SIGSTOP)
        timer = threading.Timer(fault.seconds, _signal, (target, signal.SIGCONT))
        timer.start()
        timers.append(timer)
      else:
        _signal(
          target, {"kill": signal.SIGKILL, "term": signal.SIGTERM, "launcher_term": signal.SIGTERM}[kind]
        )
      faults.append(fault)
      since, expect = now, None
      if kind == "stop":  # a stop past the heartbeat timeout may end the process: let the launcher see it
        since = now + fault.seconds + HEARTBEAT_TIMEOUT + 1.0
      elif victim is not None and victim in layout.workers():
        if layout.runtime == "inhad":  # not restarted: the run goes on without it (and its node)
          gone.add(victim)
          if role == "aggregator":  # its node's other workers cannot reach the server without it
            gone.update(range(victim, victim + layout.local))
        else:  # restarted alone: it rejoins the server
          pending[victim] = now
      else:  # the launcher, a server or shard, or a process of a synchronous run: every process again
        expect = "run"
        gone.clear()
        pending.clear()
    code = session.wait_end(timeout)
  finally:
    for timer in timers:  # a stopped process is never left stopped
      timer.join()
    session.kill()
    progress.stop()
  log = session.log
  lines = session.lines()
  (out / "campaign.log").write_text(log)  # the launches' output, for a look at what happened
  restarts = read_restarts(out)
  summary = _summary(out)
  ended_at = progress.finished_at
  after_end = [
    f"restart {r['restart']}: process {r['process']} ({r['ended']}) {r['time'] - ended_at:.1f} s after the run's end"
    for r in restarts
    if ended_at is not None and r["time"] > ended_at
  ]
  unexplained = _attribute(
    faults, [r for r in restarts if ended_at is None or r["time"] <= ended_at], session.resumes, layout
  )
  for fault in faults:
    _recovery(fault, progress, lines, layout)
  consistent = None
  if layout.runtime != "sync" and summary is not None:
    consistent, why = _ps_totals(out, summary, gradients, strategy)
    problems += why
  tracebacks = len(re.findall(r"^\[p\d+\] Traceback", log, re.M))
  if tracebacks:
    problems.append(f"{tracebacks} Python traceback(s) in the log")
  if unexplained:
    problems.append(f"process deaths no fault explains: {'; '.join(unexplained)}")
  if after_end:
    problems.append(f"the launcher restarted a process after the run had ended: {'; '.join(after_end)}")
  if code is None:
    problems.append(f"a hang: the run did not end within {timeout:.0f} s")
  elif code != 0:
    problems.append(f"exit {code}: {log[-1500:]}")
  elif summary is None or summary.get("events") != events:
    problems.append(
      f"the run ended at {None if summary is None else summary.get('events')} of {events} events"
    )
  for fault in faults:
    if fault.lost and not _may_lose(fault, layout):
      problems.append(
        f"{fault.kind} of process {fault.process} ({fault.role}): {fault.lost} lost past the checkpoint"
      )
  return SupervisedRun(
    part=part,
    runtime=layout.runtime,
    strategy=strategy,
    processes=layout.processes,
    gradients=gradients,
    events=events,
    faults=faults,
    planned=len(plan),
    restarts=restarts,
    resumes=session.resumes,
    code=code,
    summary=_small(summary),
    consistent=consistent,
    unexplained=unexplained,
    after_end=after_end,
    tracebacks=tracebacks,
    params=params_digest(out) if summary is not None else None,
    seconds=time.monotonic() - started,
    problems=problems,
  )


def _may_lose(fault: Injected, layout: Layout) -> bool:
  """Whether a fault may cost work past the last periodic checkpoint: the death of the process that writes
  the checkpoints (process 0, a server shard). A worker's fault, a preemption (SIGTERM) must cost none."""
  return fault.kind in ("kill", "stop") and fault.process is not None and fault.process < layout.servers


def _attribute(
  faults: list[Injected], restarts: list[dict], resumes: list[dict], layout: Layout
) -> list[str]:
  """Ties each restart (and each campaign resume) to the fault that caused it; returns those no fault explains."""
  unexplained = []
  free = list(faults)
  for r in restarts:
    # A fault explains a restart that comes after it, within the time a run may take to recover.
    before = [
      f for f in free if r["time"] - RECOVERY_TIMEOUT <= f.at <= r["time"] + 0.5 and f.kind != "launcher_term"
    ]
    mine = [f for f in before if f.process == r["process"]]
    # A run restarted for a death its fault caused elsewhere (process 0 killed: the others abort).
    fault = (mine or (before if r["scope"] == "run" else []) or [None])[-1]
    if fault is None:
      # A worker restarted alone while the server stops (its own SIGTERM, or killed) cannot join a run that
      # is ending: JAX's coordination client aborts it. The server's fault explains it, and stays free for
      # the resume or the restart of every process it causes.
      server = [
        f for f in faults if f.process is not None and f.process < layout.servers and f.kind in ("term", "kill")
        and r["time"] - RECOVERY_TIMEOUT <= f.at <= r["time"]
      ]  # fmt: skip
      if r["scope"] == "process" and server:
        server[-1].note = (server[-1].note + "; " if server[-1].note else "") + (
          f"worker process {r['process']} ended with {r['ended']} while the server stopped (restart {r['restart']})"
        )
        continue
      unexplained.append(f"restart {r['restart']}: process {r['process']} ended with {r['ended']}")
      continue
    free.remove(fault)
    fault.restart, fault.scope, fault.ended = r["restart"], r["scope"], r["ended"]
    fault.checkpoint, fault.down_seconds = r["checkpoint"], r["down_seconds"]
    fault._restart_time = r["time"]  # noqa: SLF001 - for _recovery, not stored
  for r in resumes:
    before = [f for f in free if f.at <= r["time"] and f.kind in ("term", "launcher_term")]
    if not before:
      unexplained.append(f"an exit 75 (preempted) no SIGTERM explains at event {r['event']}")
      continue
    fault = before[-1]
    free.remove(fault)
    fault.scope, fault.checkpoint, fault.ended = "resume", r["checkpoint"], "exit code 75"
    fault._restart_time = r["time"]  # noqa: SLF001
    fault.lost = None if r["event"] is None or r["checkpoint"] is None else r["event"] - r["checkpoint"]
  return unexplained


def _recovery(fault: Injected, progress: Progress, lines: list[tuple[float, str]], layout: Layout) -> None:
  """Time to recover, and what a restart of every process lost past its checkpoint."""
  restarted = getattr(fault, "_restart_time", None)
  after = restarted if fault.scope in ("run", "resume") and restarted else fault.at + fault.seconds
  when = progress.progressed_after(after)
  fault.recovered_seconds = None if when is None else round(when - fault.at, 2)
  if fault.scope == "process" and restarted:
    w = layout.worker_of(fault.process)
    joined = [t for t, line in lines if t > restarted and re.search(rf"worker {w} joined", line)]
    fault.rejoined_seconds = round(joined[0] - fault.at, 2) if joined else None
  if fault.scope != "run":
    return
  if layout.runtime == "sync":
    said = [
      int(m) for t, line in lines if fault.at <= t <= (restarted or t) for m in _COMPLETED.findall(line)
    ]
    fault.completed = max(said) if said else None
    done = fault.completed if fault.completed is not None else fault.event
    if fault.completed is None:
      fault.note = "no survivor said how many rounds were complete: the last logged row counts"
    fault.lost = None if done is None or fault.checkpoint is None else max(0, done - fault.checkpoint)
  else:  # the server's updates logged before the fault, against those at the checkpoint it resumed from
    at = {}
    for t, event, updates in progress.changes:
      if t <= fault.at:
        at[event] = updates
    base = at.get(fault.checkpoint, 0 if fault.checkpoint is None else None)
    fault.lost = None if base is None or fault.updates is None else fault.updates - base


def _ps_totals(out: pathlib.Path, summary: dict, gradients: int, strategy: str) -> tuple[bool, list[str]]:
  """Whether a parameter-server run's totals agree: every accepted arrival's update is in its end state."""
  records = final_records(out)
  rows = metrics_rows(out)
  if records is None:
    return False, ["no final checkpoint"]
  accepted = int((~records["rejected"]).sum())
  checks = {
    "events": summary["events"] == gradients == len(records["version"]),
    "version": int(records["version"][-1]) == summary["updates"] == int(records["released"].sum()),
    "versions step by released": bool(np.all(np.diff(records["version"]) == records["released"][1:])),
    "last row": bool(rows) and rows[-1]["updates"] == summary["updates"],
  }
  if strategy in ("asp", "ssp"):  # every accepted arrival is an update
    checks["accepted = updates"] = accepted == summary["updates"]
  bad = [k for k, ok in checks.items() if not ok]
  if bad:
    totals = {k: summary.get(k) for k in ("events", "gradients", "updates", "rejected", "dropped_gradients")}
    return False, [f"totals disagree ({', '.join(bad)}): {totals}"]
  return True, []


_SUMMARY_KEYS = (
  "events", "gradients", "updates", "rejected", "dropped_gradients", "lost_workers", "rejected_messages",
  "max_staleness", "mean_staleness", "final_loss", "final_accuracy",
)  # fmt: skip


def _small(summary: dict[str, Any] | None) -> dict[str, Any] | None:
  """The summary's keys the results use (the store keeps these only)."""
  if summary is None:
    return None
  return {k: summary[k] for k in _SUMMARY_KEYS if k in summary}


# -- the store of finished runs: a campaign continues where it stopped ---------------------------------------

STORE_NAME = "fault_campaign_runs.jsonl"


class RunStore:
  """Finished runs' outcomes, one JSON line each, keyed by (part, run index, seed, size).

  A line is appended (and synced) as soon as a run ends, so an interrupted campaign loses at most the run
  in progress; a rerun skips the runs the store holds for the same key and the same ``spec`` (the run's
  parameters); ``--report-only`` writes the results from the store alone. A later line of the same key
  replaces an earlier one.
  """

  def __init__(self, path: pathlib.Path):
    self.path = path
    self.records: dict[str, dict[str, Any]] = {}
    if path.exists():
      for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
          record = json.loads(line)
          self.records[self.key(record["part"], record["index"], record["seed"], record["size"])] = record

  @staticmethod
  def key(part: str, index, seed: int, size: str) -> str:
    return json.dumps([part, index, seed, size])

  def get(self, part: str, index, seed: int, size: str, spec: dict[str, Any]) -> dict[str, Any] | None:
    record = self.records.get(self.key(part, index, seed, size))
    return record["outcome"] if record is not None and record.get("spec") == spec else None

  def put(
    self, part: str, index, seed: int, size: str, spec: dict[str, Any], outcome: dict[str, Any]
  ) -> None:
    record = {
      "part": part,
      "index": index,
      "seed": seed,
      "size": size,
      "spec": spec,
      "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
      "code": harness.code_version(),
      "outcome": outcome,
    }
    self.records[self.key(part, index, seed, size)] = record
    self.path.parent.mkdir(parents=True, exist_ok=True)
    with open(self.path, "a") as f:
      f.write(json.dumps(record, separators=(",", ":"), default=_json_default) + "\n")
      f.flush()
      os.fsync(f.fileno())


def _json_default(value):
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  raise TypeError(f"not JSON: {type(value).__name__}")


_CLASSES = {"fuzz": "FuzzResult", "workers": "WorkerRun", "rejoin": "RejoinRun", "server": "ServerKill"}


def encode(part: str, result) -> dict[str, Any]:
  """A part's result as the JSON the store keeps (the summary's used keys only; no logs)."""
  out = json.loads(json.dumps(dataclasses.asdict(result), default=_json_default))
  if part == "fuzz":
    out["client"].pop("legit_sum", None)
  if part == "rejoin":
    out.pop("log", None)
  if "summary" in out:
    out["summary"] = _small(out["summary"])
  return out


def decode(part: str, data: dict[str, Any]):
  """The result ``encode`` stored."""
  data = dict(data)
  if part == "fuzz":
    return FuzzResult(**data)
  if part == "workers":
    data["faults"] = [Fault(**f) for f in data["faults"]]
    return WorkerRun(**data)
  if part == "rejoin":
    return RejoinRun(**data)
  if part == "server":
    return ServerKill(**data)
  data["faults"] = [Injected(**f) for f in data["faults"]]
  return SupervisedRun(**data)


# -- the campaign's plan: which runs, with which faults -------------------------------------------------------

OPTIONS = {
  "asp": "{learning_rate: 0.05}",
  "ssp": "{learning_rate: 0.05, staleness_bound: 3}",
  "inhad": "{local_workers: 2, learning_rate: 0.1}",
  "allreduce": "{learning_rate: 0.05}",
  "bsp": "{learning_rate: 0.05}",
}


def launch_args(
  processes: int,
  strategy: str,
  workers: int,
  gradients: int,
  *,
  servers: int = 1,
  chunk: int = 100,
  checkpoint_every: int = 1000,
) -> list[str]:
  """``jaxsync launch``'s arguments for a small run of the quickstart config (digits MLP)."""
  sets = {
    "model.name": "mlp",
    "strategy.name": strategy,
    "strategy.options": OPTIONS[strategy],
    "cluster.num_workers": workers,
    "run.gradients": gradients,
    "run.chunk": chunk,
    "run.eval_every": 500,
    "run.target_accuracy": 0.9,
    "run.checkpoint_every": checkpoint_every,
  }
  if servers > 1:
    sets["cluster.servers"] = servers
  return ["-n", str(processes), "configs/quickstart.yaml", *(f"--set={k}={v}" for k, v in sets.items())]


def _worker_faults(rng: np.random.Generator, count: int) -> list[tuple[str, str]]:
  """``count`` faults of parameter-server workers: SIGKILL, SIGSTOP/SIGCONT or SIGTERM (a preemption)."""
  kinds = rng.choice(["kill", "stop", "term"], size=count, p=[0.45, 0.35, 0.2])
  return [(str(k), "worker") for k in kinds]


def _insert(rng: np.random.Generator, plan: list, fault: tuple[str, str]) -> list:
  """``fault`` at a random place of ``plan``, never first (the run is under way, its workers up)."""
  at = int(rng.integers(1, len(plan) + 1)) if plan else 0
  return [*plan[:at], fault, *plan[at:]]


# Per part: the runs' shape. `faults`: faults per run; gradients sized so that a run outlasts them.
PARTS_SPEC = {
  "supervised": {"processes": 4, "workers": 3, "faults": 9, "delay": (1.0, 3.0)},
  "sharded": {"processes": 4, "workers": 2, "servers": 2, "faults": 6, "delay": (1.0, 3.0)},
  "inhad": {"processes": 5, "workers": 4, "delay": (2.0, 5.0)},
  "sync": {"processes": 3, "workers": 3, "delay": (2.0, 5.0)},
}
PREEMPT = {  # name: (strategy, processes, workers, servers, deterministic)
  "asp, 1 worker": ("asp", 2, 1, 1, True),
  "asp, 2 shards, 1 worker": ("asp", 3, 1, 2, True),
  "allreduce, 3 processes": ("allreduce", 3, 3, 1, True),
  "asp, 3 workers": ("asp", 4, 3, 1, False),
}


@dataclasses.dataclass
class Planned:
  """One run of the campaign: its store key (part, index), the parameters it runs with, and how to run it."""

  part: str
  index: Any
  spec: dict[str, Any]
  run: Any  # (rng, runs_dir) -> result


def _supervised_planned(part: str, index: int, gradients: int, tiny: bool = False) -> Planned:
  shape = PARTS_SPEC[part]
  n, workers = shape["processes"], shape["workers"]
  if tiny:  # the test suite's: the lightest run that restarts every process
    n, workers = 2, 2
  if part == "supervised":
    strategy = ("asp", "ssp")[index % 2]
    layout = Layout("single", n)
  elif part == "sharded":
    strategy = "asp"
    layout = Layout("sharded", n, servers=shape["servers"])
  elif part == "inhad":
    strategy = "inhad"
    layout = Layout("inhad", n, nodes=2, local=2)
  else:
    strategy = ("allreduce", "bsp")[index % 2]
    layout = Layout("sync", n)
  spec = {"strategy": strategy, "processes": n, "gradients": gradients, "tiny": tiny, "version": 1}

  def plan(rng: np.random.Generator) -> list[tuple[str, str]]:
    if part == "supervised":
      faults = _insert(rng, _worker_faults(rng, shape["faults"]), ("kill", "server"))
      return _insert(rng, faults, ("term", "server")) if index % 2 else faults
    if part == "sharded":
      return _insert(rng, _worker_faults(rng, shape["faults"]), ("kill", "shard"))
    if part == "inhad":
      faults = [("stop", "worker"), ("kill", "node worker"), ("kill", "aggregator"), ("kill", "server")]
      return [faults[i] for i in rng.permutation(len(faults))] + [("stop", "worker")]
    if tiny:
      return [("kill", "peer")]
    faults = [("kill", "peer"), ("kill", "primary"), ("stop", "process"), ("term", "process")]
    return _insert(rng, [faults[i] for i in rng.permutation(len(faults))], ("launcher_term", "launcher"))

  def run(rng: np.random.Generator, runs_dir: pathlib.Path) -> SupervisedRun:
    args = launch_args(
      n, strategy, workers, gradients, servers=layout.servers,
      chunk=50 if part == "sync" else 100, checkpoint_every=200 if part == "sync" else 1000,
    )  # fmt: skip
    return supervised_run(
      part, runs_dir / f"{part}{index}_{strategy}", layout, strategy, args, gradients, plan(rng), rng,
      delay=shape["delay"],
    )  # fmt: skip

  return Planned(part, index, spec, run)


def _preempt_planned(name: str, reference: bool, gradients: int) -> list[Planned]:
  strategy, n, workers, servers, deterministic = PREEMPT[name]
  runtime = "sync" if strategy == "allreduce" else "sharded" if servers > 1 else "single"
  layout = Layout(runtime, n, servers=servers)
  chunk = 50 if runtime == "sync" else 100
  spec = {
    "strategy": strategy,
    "processes": n,
    "workers": workers,
    "servers": servers,
    "gradients": gradients,
  }
  slug = re.sub(r"[^a-z0-9]+", "_", name).strip("_")

  def make(ref: bool):
    def run(rng: np.random.Generator, runs_dir: pathlib.Path) -> SupervisedRun:
      args = launch_args(
        n, strategy, workers, gradients, servers=servers, chunk=chunk, checkpoint_every=10**6
      )
      plan = [] if ref else [("launcher_term", "launcher")]
      out = runs_dir / f"preempt_{slug}{'_reference' if ref else ''}"
      r = supervised_run("preempt", out, layout, strategy, args, gradients, plan, rng, delay=(1.0, 6.0))
      r.label = f"{name} (uninterrupted)" if ref else name
      return r

    return run

  planned = [Planned("preempt", name, {**spec, "preempted": True}, make(False))]
  if reference and deterministic:
    planned.append(Planned("preempt", f"{name} (uninterrupted)", {**spec, "preempted": False}, make(True)))
  return planned


def plan_campaign(size: dict[str, Any], parts: tuple[str, ...], tiny: bool) -> list[Planned]:
  """Every run of the campaign, in order."""
  planned: list[Planned] = []
  g = size["gradients"]
  if "fuzz" in parts:
    frames = size["frames"]
    planned.append(
      Planned("fuzz", 0, {"frames": frames}, lambda rng, _d, f=frames: fuzz(f, int(rng.integers(2**31))))
    )
  if "workers" in parts:
    for i in range(size["runs"]):
      strategy = ("asp", "ssp")[i % 2]
      planned.append(
        Planned(
          "workers",
          i,
          {"strategy": strategy, "gradients": g},
          lambda rng, d, i=i, s=strategy: worker_fault_run(d / f"workers{i}_{s}", s, g, random_faults(rng)),
        )  # fmt: skip
      )
  if "rejoin" in parts:
    planned.append(
      Planned("rejoin", 0, {"gradients": 3 * g}, lambda rng, d: rejoin_run(d / "rejoin", 3 * g, rng))
    )
  if "server" in parts:
    for i in range(size["server_kills"]):
      planned.append(
        Planned("server", i, {"gradients": g}, lambda rng, d, i=i: server_kill_run(d / f"server{i}", g, rng))
      )
  for part in ("supervised", "sharded", "inhad", "sync"):
    if part in parts:
      for i in range(size[part]):
        planned.append(_supervised_planned(part, i, size["gradients_" + part], tiny))
  if "preempt" in parts:
    for name in size["preempt"]:
      planned += _preempt_planned(name, True, size["gradients_preempt"][PREEMPT[name][0] == "allreduce"])
  return planned


# -- the results file ----------------------------------------------------------------------------------------


def _fmt_faults(faults: list[Fault]) -> str:
  parts = []
  for f in faults:
    at = f"event {f.event}" if f.event is not None else f"{f.fraction:.0%}"
    parts.append(
      f"kill w{f.worker} @ {at}" if f.kind == "kill" else f"stop w{f.worker} {f.seconds:.1f} s @ {at}"
    )
  return "; ".join(parts)


def _stop_outcome(f: Fault) -> str:
  lost = "declared lost" if f.declared_lost else "not declared lost"
  end = "aborted by JAX" if f.aborted_by_jax else "finished" if f.survived else "did not finish"
  if f.dropped_staleness is not None:
    stale = f"; its push dropped ({f.dropped_staleness} versions late), it rejoined"
  elif f.stale_push is not None:
    stale = f"; its next push (event {f.stale_event}) applied at staleness {f.stale_push}"
  else:
    stale = "; no push after the stop"
  return f"w{f.worker}: {lost}{stale}; {end}"


def _worker_runs_summary(worker_runs: list[WorkerRun]) -> str:
  """The stopped workers' first pushes and the version rejections, over the part's runs."""
  stops = [f for r in worker_runs for f in r.faults if f.kind == "stop"]
  lost = [f for f in stops if f.declared_lost]
  applied = [f.stale_push for f in lost if f.stale_push is not None]
  dropped = [f.dropped_staleness for f in lost if f.dropped_staleness is not None]
  version = sum(r.rejections.get("version", 0) for r in worker_runs)
  return "\n".join(
    [
      f"- The first push after SIGCONT of a stopped worker the server declared lost: {len(lost)} such stops; "
      f"dropped, coming after the declaration, {len(dropped)}"
      + (f" (up to {max(dropped)} versions late)" if dropped else "")
      + f"; applied, coming before it {len(applied)}"
      + (f" (at staleness up to {max(applied)})" if applied else "")
      + f"; none pushed {len(lost) - len(dropped) - len(applied)}.",
      f"- Applied updates lost: {sum(r.lost_updates or 0 for r in worker_runs)}; pushes rejected for their "
      f"version: {version}.",
    ]
  )


RUNTIMES = {
  "single": "single parameter server",
  "sharded": "sharded parameter server (2 shards)",
  "inhad": "InHAD (2 nodes of 2 workers)",
  "sync": "synchronous loop (allreduce, bsp)",
}
SIGNALS = {"kill": "SIGKILL", "stop": "SIGSTOP/SIGCONT", "term": "SIGTERM", "launcher_term": "SIGTERM"}


def _fault_label(kind: str, role: str) -> str:
  return f"{SIGNALS[kind]} of the launcher" if kind == "launcher_term" else f"{SIGNALS[kind]} of a {role}"


def _runtime_of(part: str, result) -> str:
  return result.runtime if isinstance(result, SupervisedRun) else "single"


def _median_max(values: list[float]) -> str:
  values = [v for v in values if v is not None]
  if not values:
    return "-"
  return f"{float(np.median(values)):.1f} / {max(values):.1f}"


def _runtime_rows(results: dict[str, list]) -> list[list[str]]:
  """The per-runtime summary: faults by kind, runs, restarts, hangs, crashes, work lost, time to recover."""
  rows = []
  for runtime, title in RUNTIMES.items():
    faults: collections.Counter[str] = collections.Counter()
    runs = finished = hangs = crashes = 0
    restarts: collections.Counter[str] = collections.Counter()
    zero_lost: list[int] = []  # worker faults and preemptions: must be 0
    server_lost: list[str] = []  # the checkpoint writer's death: back to the last periodic checkpoint
    down, recovered, rejoined = [], [], []
    for part, items in results.items():
      for r in items:
        if part == "fuzz" or _runtime_of(part, r) != runtime:
          continue
        runs += 1
        if isinstance(r, WorkerRun):
          for f in r.faults:
            faults[_fault_label(f.kind, "worker")] += 1
          finished += r.finished
          hangs += r.hung
          crashes += r.crashed
          if r.lost_updates is not None:
            zero_lost.append(r.lost_updates)
        elif isinstance(r, RejoinRun):
          faults[_fault_label("kill", "worker")] += 2
          finished += r.code == 0
          hangs += r.code is None
          crashes += r.crashed
          restarts["by hand (alone)"] += 2
        elif isinstance(r, ServerKill):
          faults[_fault_label("kill", "server")] += 1
          finished += r.finished
          hangs += r.resume_code is None
          crashes += r.crashed
          restarts["by hand (`jaxsync resume`)"] += 1
          if r.lost_updates is not None:
            server_lost.append(f"{r.lost_updates} updates")
        else:
          for f in r.faults:
            faults[_fault_label(f.kind, f.role)] += 1
            if f.scope is not None:
              restarts[
                {"process": "alone", "run": "all processes", "resume": "`jaxsync resume` after exit 75"}[
                  f.scope
                ]
              ] += 1
            down.append(f.down_seconds)
            recovered.append(f.recovered_seconds)
            rejoined.append(f.rejoined_seconds)
            unit = "rounds" if runtime == "sync" else "updates"
            if f.lost is not None:
              if _may_lose(f, Layout(r.runtime, r.processes, servers=2 if runtime == "sharded" else 1)):
                server_lost.append(f"{f.lost} {unit}")
              else:
                zero_lost.append(f.lost)
          restarts["unexplained"] += len(r.unexplained)
          finished += r.finished
          hangs += r.hung
          crashes += r.crashed
          if runtime != "sync" and r.consistent is False:
            zero_lost.append(-1)
    total = sum(faults.values())
    rows.append(
      [
        title,
        f"{total}: " + ", ".join(f"{n} {k}" for k, n in sorted(faults.items())) if total else "0",
        str(runs),
        str(finished),
        ", ".join(f"{n} {k}" for k, n in restarts.items() if n) or "0",
        str(hangs),
        str(crashes),
        (str(sum(x for x in zero_lost if x > 0)) if -1 not in zero_lost else "totals disagree")
        if zero_lost
        else "-",
        ", ".join(server_lost) or "-",
        _median_max(down),
        _median_max(recovered),
        _median_max(rejoined),
      ]
    )
  rows.append(
    ["low-communication strategies (DiLoCo, ...)", "not in jaxsync yet: no runtime to fault"] + ["-"] * 10
  )
  return rows


RUNTIME_HEADER = [
  "runtime",
  "process faults injected",
  "runs",
  "runs finished",
  "restarts",
  "hangs",
  "crashes",
  "updates / rounds lost past the last checkpoint: worker faults, preemptions",
  "lost past the last periodic checkpoint: the checkpoint writer killed",
  "down s (restart), median / max",
  "fault to next progress row s, median / max",
  "fault to restarted worker rejoined s, median / max",
]


def _fault_text(f: Injected) -> str:
  who = "the launcher" if f.process is None else f"p{f.process} ({f.role})"
  stop = f" {f.seconds:.1f} s" if f.kind == "stop" else ""
  return f"{SIGNALS[f.kind]}{stop} {who} @ event {f.event}"


def _outcome_text(f: Injected) -> str:
  if f.scope == "process":
    return f"{f.ended}; restarted alone (restart {f.restart})"
  if f.scope == "run":
    return f"{f.ended}; every process restarted from checkpoint {f.checkpoint} (restart {f.restart})"
  if f.scope == "resume":
    return f"exit 75; `jaxsync resume` from checkpoint {f.checkpoint}"
  return "no restart"


def _supervised_text(part: str, runs: list[SupervisedRun]) -> str:
  run_rows, fault_rows = [], []
  for i, r in enumerate(runs):
    s = r.summary or {}
    scopes = collections.Counter(f.scope for f in r.faults if f.scope)
    run_rows.append(
      [
        str(i) if not r.label else r.label,
        r.strategy,
        str(r.processes),
        f"{len(r.faults)} of {r.planned}",
        "hang" if r.hung else str(r.code),
        f"{s.get('events', '-')} / {s.get('updates', '-')}",
        ", ".join(f"{n} {k}" for k, n in scopes.items()) or "-",
        "-" if r.consistent is None else "yes" if r.consistent else "no",
        "; ".join(r.unexplained) or "-",
        f"{r.seconds:.0f}",
      ]
    )
    for f in r.faults:
      fault_rows.append(
        [
          str(i) if not r.label else r.label,
          _fault_text(f),
          _outcome_text(f),
          "-" if f.completed is None else str(f.completed),
          "-" if f.lost is None else str(f.lost),
          "-" if f.down_seconds is None else f"{f.down_seconds:.1f}",
          "-" if f.recovered_seconds is None else f"{f.recovered_seconds:.1f}",
          "-" if f.rejoined_seconds is None else f"{f.rejoined_seconds:.1f}",
          f.note or "-",
        ]
      )
  runs_table = harness.table(
    [
      "run",
      "strategy",
      "processes",
      "faults injected (of planned)",
      "exit",
      "events / updates",
      "restarts",
      "totals agree",
      "deaths no fault explains",
      "s",
    ],
    run_rows,
  )
  faults_table = harness.table(
    [
      "run",
      "fault (at the last logged event)",
      "what followed",
      "rounds complete (survivors)",
      "lost past the checkpoint",
      "down s",
      "to next progress row s",
      "to rejoined s",
      "note",
    ],
    fault_rows,
  )
  return f"{runs_table}\n\n{faults_table}"


_PART_INTRO = {
  "supervised": (
    "`jaxsync launch -n 4 --max-restarts {restarts}`, asp and ssp in turn (1 server, 3 workers), "
    "`JAXSYNC_HEARTBEAT_TIMEOUT={hb}`: workers SIGKILLed, stopped (SIGSTOP, SIGCONT 1-5 s later) or sent "
    "SIGTERM (a preemption notice: the worker leaves about 10 s later with exit 75), the server killed once "
    "per run and sent SIGTERM in every other run; one worker of each run is never faulted. Each fault comes "
    "a random 1-3 s after the run recovered from the one before (a worker restarted alone is not faulted again until it has rejoined, and the last worker up is never faulted: the server stops once every worker is lost). A dead worker is restarted alone and "
    "rejoins; a dead server restarts every process from the last checkpoint (one every 1,000 events)."
  ),
  "sharded": (
    "`jaxsync launch -n 4 --set cluster.servers=2 --max-restarts {restarts}`: asp on 2 server shards "
    "(processes 0, 1) and 2 workers; worker faults as above, and one shard (0 or 1) killed per run: every "
    "process restarts from the last checkpoint."
  ),
  "inhad": (
    "`jaxsync launch -n 5 --max-restarts {restarts}`: InHAD, 2 nodes of 2 workers, each node's aggregator "
    "in its first worker's process. Per run, in a random order: a worker stopped, a worker that is not an "
    "aggregator killed, an aggregator killed (its node is dropped whole), the server killed (every process "
    "restarts from the last checkpoint, the dropped nodes with it); then another stop. Dead InHAD workers "
    "are not restarted: the run goes on without them."
  ),
  "sync": (
    "`jaxsync launch -n 3 --max-restarts {restarts}`, allreduce and bsp in turn (3 workers, one per "
    "process), a checkpoint every 200 rounds, a metrics row every 50: per run, in a random order, a process "
    "other than 0 killed, process 0 killed, a process stopped 1-5 s, a process sent SIGTERM (the processes "
    "agree to stop at the chunk's end with a checkpoint: exit 75, then `jaxsync resume`), and SIGTERM to "
    "the launcher. A death restarts every process from the last checkpoint; when a process other than 0 "
    "dies, process 0 first saves every completed round ('rounds complete': what the survivors said), so "
    "nothing is lost; process 0's own death loses what came after the last periodic checkpoint."
  ),
}


def _preempt_text(runs: list[SupervisedRun]) -> tuple[str, list[str]]:
  """The preempted runs against their uninterrupted twins; returns the text and the failed checks."""
  by_label = {r.label: r for r in runs}
  rows, problems = [], []
  for r in runs:
    if r.label.endswith("(uninterrupted)"):
      continue
    ref = by_label.get(f"{r.label} (uninterrupted)")
    stop = next((f for f in r.faults if f.kind == "launcher_term"), None)
    same = "-"
    if ref is not None:
      same = "yes" if r.params is not None and r.params == ref.params else "no"
      if same == "no":
        problems.append(
          f"preempt {r.label}: final parameters {r.params} differ from the uninterrupted run's {ref.params}"
        )
    rows.append(
      [
        r.label,
        "-" if stop is None else str(stop.event),
        "-" if stop is None else str(stop.checkpoint),
        "-" if stop is None or stop.lost is None else str(stop.lost),
        "hang" if r.hung else str(r.code),
        f"{(r.summary or {}).get('events', '-')} / {(r.summary or {}).get('updates', '-')}",
        same if ref is not None else "not deterministic: totals checked instead",
        "-" if r.consistent is None else "yes" if r.consistent else "no",
        f"{r.seconds:.0f}",
      ]
    )
    if stop is None:
      problems.append(f"preempt {r.label}: the launcher was never sent SIGTERM")
    elif stop.scope != "resume":
      problems.append(f"preempt {r.label}: SIGTERM to the launcher did not end the run with exit 75")
  table = harness.table(
    [
      "run",
      "last logged event at SIGTERM",
      "checkpoint at the stop",
      "events lost",
      "exit after `jaxsync resume`",
      "final events / updates",
      "final parameters = the uninterrupted run's",
      "totals agree",
      "s",
    ],
    rows,
  )
  intro = (
    "SIGTERM to the launcher at a random point of the run: it passes the notice on, every process stops at "
    "its next chunk boundary with a checkpoint, the launcher exits 75; then `jaxsync resume RUN_DIR`. The "
    "runs whose runtime is deterministic (the synchronous loop, a parameter server with one worker) are "
    "compared with an uninterrupted run of the same config (sha256 of the final parameters); with 3 "
    "asynchronous workers the order of arrivals is the machine's, so the totals are checked instead: the "
    "resumed run's events are the checkpoint's plus the rest, every accepted arrival an update."
  )
  return f"{intro}\n\n{table}", problems


def write_results(
  args, argv, seed: int, results: dict[str, list], wall: float, *, missing: list[str] = (), reused: int = 0
) -> tuple[str, int]:
  """Writes the results file; returns its text and the number of checks that failed."""
  namespace = argparse.Namespace(
    size=args.size, seeds=None, runs_dir=args.runs_dir, results_dir=args.results_dir
  )
  bench = harness.Benchmark(NAME, TITLE, namespace, argv, seeds=0)
  bench.started = time.perf_counter() - wall
  fuzz_result = (results.get("fuzz") or [None])[0]
  worker_runs = results.get("workers", [])
  rejoin = (results.get("rejoin") or [None])[0]
  kills = results.get("server", [])
  supervised = {p: results.get(p, []) for p in ("supervised", "sharded", "inhad", "sync")}
  preempt = results.get("preempt", [])
  real = sum(len(v) for k, v in results.items() if k != "fuzz")
  bench.run_count = real + len(kills)  # a server kill is a run and its resume
  bench.keeps_run_dirs = False
  problems = list(fuzz_result.problems if fuzz_result else []) + [p for r in worker_runs for p in r.problems]
  problems += (rejoin.problems if rejoin else []) + [p for k in kills for p in k.problems]
  for part, runs in [*supervised.items(), ("preempt", preempt)]:
    problems += [f"{part} {r.label or i}: {p}" for i, r in enumerate(runs) for p in r.problems]
  preempt_text, preempt_problems = _preempt_text(preempt) if preempt else ("", [])
  problems += preempt_problems
  process_faults = (
    sum(len(r.faults) for r in worker_runs)
    + (2 if rejoin else 0)
    + len(kills)
    + sum(len(r.faults) for runs in [*supervised.values(), preempt] for r in runs)
  )
  complete = not missing
  if args.size != "tiny" and complete and set(results) >= set(PARTS) and process_faults < 100:
    problems.append(f"{process_faults} process faults injected; the campaign's size asks for at least 100")
  if missing:
    problems.append(f"the campaign is not complete: {len(missing)} planned runs are not in the store")
  rows = [
    ["RNG seed", str(seed)],
    ["process faults injected (SIGKILL, SIGSTOP/SIGCONT, SIGTERM)", str(process_faults)],
    ["fuzzed messages", str(fuzz_result.messages if fuzz_result else 0)],
    ["runs (real, through `jaxsync launch`)", str(real)],
    [
      "runs read back from the store (`fault_campaign_runs.jsonl`)",
      f"{reused} of {real + bool(fuzz_result)}",
    ],
    ["checks failed", str(len(problems))],
  ]
  bench.section("Summary", harness.table(["", "count"], rows))
  bench.section(
    "Per runtime",
    harness.table(RUNTIME_HEADER, _runtime_rows(results))
    + "\n\n'restarts': by `jaxsync launch --max-restarts` (its `restarts.jsonl`; a worker alone, or every "
    "process from the last checkpoint), by the campaign (`jaxsync resume` after an exit 75), or by hand "
    "(parts 3 and 4). 'down s': from the launcher noticing the death to the restart (for a restart of every "
    "process it includes process 0 saving its checkpoint and the others being stopped). A hang is a run "
    f"that did not end within {RUN_TIMEOUT:.0f} s; a crash, a run that did not end with exit 0, a process "
    "death no injected fault explains, or a Python traceback. The low-communication strategies (DiLoCo and "
    "the like) do not exist in jaxsync yet: there is nothing of theirs to fault.",
  )
  if fuzz_result:
    bench.section("1. Fuzzed frames against an in-process server", _fuzz_text(fuzz_result))
  if worker_runs:
    bench.section(
      "2. Worker faults on real runs, no restarts",
      _worker_runs_summary(worker_runs) + "\n\n" + _workers_text(worker_runs),
    )
  if rejoin:
    bench.section("3. A killed worker started again", _rejoin_text(rejoin))
  if kills:
    bench.section("4. The server killed and resumed by hand", _kills_text(kills))
  titles = {
    "supervised": "5. Supervised runs, single server: worker and server faults, restarts",
    "sharded": "6. Sharded server: worker faults, a shard killed",
    "inhad": "7. InHAD: worker, aggregator and server faults",
    "sync": "8. The synchronous loop: peer, process 0, stop, SIGTERM, launcher SIGTERM",
  }
  for part, runs in supervised.items():
    if runs:
      intro = _PART_INTRO[part].format(restarts=MAX_RESTARTS, hb=HEARTBEAT_TIMEOUT)
      bench.section(titles[part], intro + "\n\n" + _supervised_text(part, runs))
  if preempt:
    bench.section("9. Preemption: SIGTERM to the launcher, then `jaxsync resume`", preempt_text)
  if missing:
    bench.section("Runs not in the store yet", "\n".join(f"- {m}" for m in missing))
  if problems:
    bench.section("Checks that failed", "\n".join(f"- {p}" for p in problems))
  path = bench.write()
  return path.read_text(), len(problems)


_OUTCOME = {
  "random_bytes": "malformed",
  "empty_frame": "malformed",
  "truncated_header": "malformed",
  "long_header": "malformed",
  "magic": "malformed",
  "kind_code": "malformed",
  "dtype_code": "malformed",
  "reason_code": "malformed",
  "token": "token",
  "dtype": "dtype",
  "count": "shape",
  "payload_length": "shape",
  "missing_payload": "malformed",
  "extra_frames": "shape (the frames after the header are the payload, end to end)",
  "control_with_payload": "malformed",
  "worker_range": "worker",
  "server_kinds": "malformed (from worker 1) / worker (from a stranger)",
  "impostor": "worker",
  "future_version": "future_version",
  "past_version": "version",
  "non_finite": "an arrival the rule rejects (NaN/Inf check); parameters sent again",
  "oversize": "dropped by ZeroMQ (MAXMSGSIZE), connection closed",
}


def _fuzz_text(r: FuzzResult) -> str:
  c = r.client
  sent = c.get("sent", {})
  rows = [[f"`{name}`", str(sent.get(name, 0)), _OUTCOME[name]] for name in CASES]
  reasons = sorted(set(r.rejected) | set(c.get("expected", {})))
  by_reason = [
    [reason, str(c.get("expected", {}).get(reason, 0)), str(r.rejected.get(reason, 0))] for reason in reasons
  ]
  replies = c.get("replies_got", {})
  in_order = "ERROR replies" not in " ".join(r.problems)
  return "\n".join(
    [
      f"An `asp` server (2 workers, {COUNT} float32 parameters, learning rate {LEARNING_RATE}) in this "
      f"process; one client process sent {r.messages} fuzzed messages on two connections (worker 1's, "
      "which said HELLO, and a stranger's, which never did) and one connection per oversized frame, and "
      f"worker 0's {c.get('legit_pushes', 0)} legitimate pushes in between, in {r.seconds:.1f} s.",
      "",
      harness.table(["case", "messages", "must be"], rows),
      "",
      harness.table(["reason", "invalid messages sent", "rejected by the server"], by_reason),
      "",
      f"- ERROR replies: {len(replies.get('member', []))} to worker 1 and "
      f"{len(replies.get('stranger', []))} to the stranger, each with the expected reason in the expected "
      f"order: {'yes' if in_order else 'no'}; none to a malformed or foreign message, none to an "
      "oversized one.",
      f"- Oversized frames: {c.get('oversize', 0)} sent, {c.get('oversize_closed', 0)} connections closed "
      "by ZeroMQ before the frame was read whole; none reached `rejected_messages`.",
      "- Non-finite pushes (NaN/Inf with the finite flag set, or the flag cleared): "
      f"{c.get('non_finite', 0)}; arrivals the rule rejected: {r.rule_rejected}.",
      f"- Server version {r.version}, worker 0's pushes {c.get('legit_pushes', 0)}; the parameters are "
      f"{'exactly' if r.params_exact else 'NOT'} -2^-9 times the sum of its gradients' multipliers "
      f"(finite: {'yes' if r.params_finite else 'no'}); the server raised: "
      f"{'no' if r.crashed is None else 'yes'}.",
    ]
  )


def _workers_text(runs: list[WorkerRun]) -> str:
  rows = []
  for i, r in enumerate(runs):
    s = r.summary or {}
    stops = [_stop_outcome(f) for f in r.faults if f.kind == "stop"]
    lost = ", ".join(f"w{x['worker']}" for x in s.get("lost_workers", [])) or "-"
    rows.append(
      [
        str(i),
        r.strategy,
        _fmt_faults(r.faults),
        "hang" if r.hung else str(r.code),
        f"{s.get('events', '-')} / {s.get('updates', '-')} / {s.get('rejected', '-')}",
        "yes" if r.consistent else "no",
        "-" if r.lost_updates is None else str(r.lost_updates),
        lost,
        "; ".join(stops) or "-",
        str(r.rejections.get("version", 0)),
        str(s.get("max_staleness", "-")),
        f"{r.seconds:.0f}",
      ]
    )
  header = [
    "run",
    "strategy",
    "faults (when: the run's last logged event)",
    "exit",
    "events / updates / rule-rejected",
    "totals agree",
    "updates lost",
    "declared lost",
    "stopped worker",
    "'version' rejections",
    "max staleness",
    "s",
  ]
  stops = [f for r in runs for f in r.faults if f.kind == "stop"]
  short = [f for f in stops if not f.declared_lost]
  long = [f for f in stops if f.declared_lost]
  kills = [f for r in runs for f in r.faults if f.kind == "kill"]
  version = sum(r.rejections.get("version", 0) for r in runs)

  def staleness(faults):
    values = sorted(f.stale_push for f in faults if f.stale_push is not None)
    return ", ".join(map(str, values)) or "-"

  dropped = sorted(f.dropped_staleness for f in long if f.dropped_staleness is not None)
  applied = [f for f in long if f.stale_push is not None]

  events = next((r.summary["events"] for r in runs if r.summary), "?")
  ssp = [r for r in runs if r.strategy == "ssp"]
  ssp_back = sorted(
    f.stale_push for r in ssp for f in r.faults if f.declared_lost and f.stale_push is not None
  )
  ssp_other = max((r.other_staleness for r in ssp if r.other_staleness is not None), default=None)
  ssp_note = (
    f" In the ssp runs (a worker at most 3 clocks ahead of the slowest live one) these pushes were "
    f"{', '.join(map(str, ssp_back))} updates stale; every other push of those runs at most {ssp_other}."
    if ssp_back and ssp_other is not None
    else ""
  )
  return "\n".join(
    [
      f"Each run: 1 server + 3 worker processes on this machine, digits MLP, {events} gradients, "
      f"`JAXSYNC_HEARTBEAT_TIMEOUT={HEARTBEAT_TIMEOUT}`. 'totals agree': the summary's events, gradients "
      "and updates, the final checkpoint's per-event records (every accepted arrival released one update, "
      "the version counts them) and the last metrics row agree. 'updates lost': accepted arrivals minus "
      "the updates the run ends with. The seed fixes the faults and the points of the run they come at; "
      "whether a stop of about 3 s outlasts the heartbeat timeout depends on the machine's timing.",
      "",
      harness.table(header, rows),
      "",
      *(
        [
          f"- SIGKILL ({len(kills)}): the process ends with signal 9 and the run finishes with the others; "
          f"{sum(f.declared_lost for f in kills)} of {len(kills)} declared lost before their run ended "
          f"(after the {HEARTBEAT_TIMEOUT} s heartbeat timeout)."
        ]
        if kills
        else []
      ),
      *(
        [
          f"- SIGSTOP shorter than the heartbeat timeout ({len(short)}): the worker is not declared lost; on "
          "SIGCONT it pushes the gradient it computed before the stop, on the version the server sent it, so "
          "the server's version rule accepts it and the rule applies it as a stale gradient "
          f"(staleness {staleness(short)}); it finishes the run: {sum(f.survived for f in short)} of "
          f"{len(short)}."
        ]
        if short
        else []
      ),
      *(
        [
          f"- SIGSTOP longer than the heartbeat timeout ({len(long)}): the server declares the worker lost "
          "and goes on without it. On SIGCONT the worker pushes what it computed before the stop, on the "
          f"version it was sent: dropped {len(dropped)} (counted in the summary's `dropped_gradients`; "
          f"{', '.join(map(str, dropped)) or '-'} versions late), the worker rejoining with the current "
          f"parameters as after a HELLO; applied {len(applied)}, having arrived before the server declared the "
          f"worker lost (which it did later; staleness {staleness(long)}); no push, "
          f"the process ended first: {len(long) - len(dropped) - len(applied)}. The JAX coordination "
          f"client aborts {sum(f.aborted_by_jax for f in long)} of these {len(long)} processes soon after "
          "SIGCONT, the service having marked the task dead (one aborted after rejoining is declared lost "
          f"a second time, hence a worker listed twice); {sum(f.survived for f in long)} finished the run."
          + ssp_note
        ]
        if long
        else []
      ),
      f"- Pushes rejected for their version: {version}. A push is refused when its version is not the one "
      "the server last sent that worker; a stopped worker's push is stale but on its own version: from a "
      "worker still counted live it is applied whatever its staleness (asp has no bound; ssp bounds the "
      "workers' clocks, not a gradient's age), from one declared lost it is dropped.",
    ]
  )


def _same_command_text(o: dict[str, Any]) -> str:
  """What the restart with the launcher's own command line did, from what was measured."""
  if o["hello_at_server"] and o["pushes"] > 0:
    return (
      "- Started with the launcher's own command line and environment (`jaxsync train ...`), it rejoins: "
      f"the server sent it version {', '.join(map(str, o['joined_at']))} and applied its "
      f"{o['pushes']} pushes; the worker of an asynchronous run waits for nothing but the server's "
      "address (a start-up barrier of every process would be a new instance that no other process joins)."
    )
  return (
    "- Started with the launcher's own command line (`jaxsync train ...`), it did not reach the server "
    f"(exit {o['exit']}; its main thread was at {o['waiting_at'] or 'an unknown place'})."
  )


def _rejoin_text(r: RejoinRun) -> str:
  s = r.summary or {}

  def row(label, o):
    return [
      label,
      f"w{o['worker']}",
      "yes" if o["joined_coordination"] else "no",
      "yes" if o["hello_at_server"] else "no",
      ", ".join(map(str, o["joined_at"])) or "-",
      str(o["pushes"]),
      str(o["exit"]),
      o["waiting_at"] or "-",
    ]

  table = harness.table(
    [
      "started again",
      "worker",
      "joined the coordination service",
      "said HELLO to the server",
      "version sent on rejoining",
      "pushes after rejoining",
      "exit",
      "where its main thread was at the end (faulthandler)",
    ],
    [
      row("the launcher's command line and environment", r.same_command),
      row("the same environment, the worker loop alone", r.worker_loop),
    ],
  )
  return "\n".join(
    [
      f"An asp run ({s.get('events', '?')} gradients, exit {r.code}, totals agree: "
      f"{'yes' if r.consistent else 'no'}); two workers killed with SIGKILL early in the run, each started "
      "again at once.",
      "",
      table,
      "",
      "- `jax.distributed` takes back a process with the id of a dead one (the run's tasks are "
      "recoverable): the restarted process initializes and reads the key-value store.",
      _same_command_text(r.same_command),
      "- Started through the worker loop alone (coordination service, heartbeat, the server's address and "
      "token, HELLO), the server takes the worker back: it is sent the current version and its own data "
      "step, and its pushes are applied.",
    ]
  )


def _kills_text(kills: list[ServerKill]) -> str:
  rows = []
  for i, k in enumerate(kills):
    s = k.summary or {}
    rows.append(
      [
        str(i),
        f"{k.killed_at} / {k.updates_logged}",
        f"{k.checkpoint} / {k.checkpoint_updates}",
        ", ".join(map(str, k.resumed_at)) or "-",
        str(k.resumed_from),
        "-" if k.lost_updates is None else str(k.lost_updates),
        "hang" if k.resume_code is None else str(k.resume_code),
        f"{s.get('events', '-')} / {s.get('updates', '-')}",
        f"{k.seconds:.0f}",
      ]
    )
  return "\n".join(
    [
      "asp, 1 server + 3 workers, a checkpoint every 500 events, a metrics row every 50: process 0 killed "
      "with SIGKILL at a random point after the first checkpoint (its workers end when the coordinator "
      "goes), then `jaxsync resume RUN_DIR`.",
      "",
      harness.table(
        [
          "run",
          "last logged event / updates before the kill",
          "last checkpoint: event / updates",
          "versions sent on joining the resumed server",
          "version before its first event (records)",
          "updates lost past the checkpoint",
          "resume exit",
          "final events / updates",
          "s",
        ],
        rows,
      ),
      "",
      "The updates lost are those logged after the last checkpoint (a chunk in progress at the kill, at "
      "most 49 more, was never logged). The resumed server starts from the checkpoint's version, which its "
      "workers are sent on joining, and the run redoes the lost events, so it still ends at its full count.",
    ]
  )


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", choices=tuple(SIZES), default="default")
  parser.add_argument("--quick", action="store_true", help="the tiny size")
  parser.add_argument("--frames", type=int, default=None, help="fuzzed messages (default: the size's)")
  parser.add_argument("--runs", type=int, default=None, help="worker-fault runs (default: the size's)")
  parser.add_argument("--server-kills", type=int, default=None, help="server kills (default: the size's)")
  parser.add_argument("--gradients", type=int, default=None, help="gradients per real run of parts 2-4")
  parser.add_argument("--seed", type=int, default=0, help="the campaign's RNG seed")
  parser.add_argument("--parts", default=None, help=f"a subset of {','.join(PARTS)}")
  parser.add_argument("--results-dir", type=pathlib.Path, default=None)
  parser.add_argument("--runs-dir", type=pathlib.Path, default=None)
  parser.add_argument(
    "--store", type=pathlib.Path, default=None, help=f"the finished runs (default: RESULTS_DIR/{STORE_NAME})"
  )
  parser.add_argument("--report-only", action="store_true", help="write the results from the store alone")
  parser.add_argument("--fresh", action="store_true", help="run every run again (the store is appended to)")
  args = parser.parse_args(argv)
  if args.quick:
    args.size = "tiny"
  size = dict(SIZES[args.size])
  parts = tuple(args.parts.split(",")) if args.parts else size["parts"]
  if not set(parts) <= set(PARTS):
    parser.error(f"--parts={args.parts}: expected a subset of {','.join(PARTS)}")
  for flag, value, low in (
    ("frames", args.frames, 2),
    ("runs", args.runs, 0),
    ("server-kills", args.server_kills, 0),
  ):
    if value is not None and value < low:
      parser.error(f"--{flag}={value}: expected at least {low}")
  if args.gradients is not None and args.gradients < 1500:
    parser.error(
      f"--gradients={args.gradients}: expected at least 1500 (a server kill comes after a checkpoint)"
    )
  for key, value in (("frames", args.frames), ("runs", args.runs), ("server_kills", args.server_kills)):
    if value is not None:
      size[key] = value
  if args.gradients is not None:
    size["gradients"] = args.gradients
  tiny = args.size == "tiny"
  runs_dir = args.runs_dir or harness.REPO.joinpath("runs", "bench", *(("tiny",) if tiny else ()), NAME)
  results_dir = args.results_dir or (
    harness.REPO.joinpath("runs", "bench", "tiny") if tiny else harness.REPO / "benchmarks" / "results"
  )
  store = RunStore(args.store or results_dir / STORE_NAME)
  print(f"[{NAME}] RNG seed {args.seed}; store {harness._relative(store.path)}", file=sys.stderr)
  started = time.monotonic()
  results: dict[str, list] = {part: [] for part in PARTS if part in parts}
  missing, reused = [], 0
  for planned in plan_campaign(size, parts, tiny):
    name = f"{planned.part} {planned.index}"
    stored = (
      None if args.fresh else store.get(planned.part, planned.index, args.seed, args.size, planned.spec)
    )
    if stored is not None:
      result = decode(planned.part, stored)
      if planned.part == "preempt":  # its index is its label (stored ones before this fix lacked the twin's)
        result.label = planned.index
      reused += 1
    elif args.report_only:
      missing.append(name)
      continue
    else:
      rng = np.random.default_rng([args.seed, PARTS.index(planned.part), _index_code(planned.index)])
      result = planned.run(rng, runs_dir)
      store.put(planned.part, planned.index, args.seed, args.size, planned.spec, encode(planned.part, result))
    results[planned.part].append(result)
    print(
      f"[{NAME} {(time.monotonic() - started) / 60:.1f} min] {name}{' (stored)' if stored is not None else ''}: "
      f"{_one_line(result)}",
      file=sys.stderr,
      flush=True,
    )
  text, failed = write_results(
    args, argv, args.seed, results, time.monotonic() - started, missing=missing, reused=reused
  )
  print(text)
  return 1 if failed else 0


def _index_code(index) -> int:
  """A run index as an integer for the RNG (a preemption run's is its name)."""
  if isinstance(index, int):
    return index
  return int.from_bytes(index.encode()[:8].ljust(8, b"\0"), "little") ^ len(index)


def _one_line(result) -> str:
  if isinstance(result, FuzzResult):
    return f"{result.messages} messages, {result.seconds:.0f} s, problems {result.problems}"
  if isinstance(result, SupervisedRun):
    return (
      f"{len(result.faults)} of {result.planned} faults, {len(result.restarts)} restarts, "
      f"{len(result.resumes)} resumes, exit {result.code}, {result.seconds:.0f} s; problems {result.problems}"
    )
  return f"exit {getattr(result, 'code', None)}; problems {result.problems}"


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
