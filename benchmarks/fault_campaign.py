"""A fault campaign against the parameter server: fuzzed frames, killed and stopped workers, a killed server.

Four parts, each counted, none of them trusted to the process under test:

1. **Fuzzing.** A :class:`ParameterServer` (``asp``, two workers, one
   1,000-element float32 vector) served in this process, and a separate client
   process that sends it thousands of messages over ZeroMQ: random bytes,
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
2. **Worker faults** on real runs (``jaxsync launch``: one server and three
   worker processes, ``asp`` and ``ssp`` in turn): at random points of the
   run, SIGKILL a random worker, or SIGSTOP one for 1-5 s and SIGCONT it
   (``JAXSYNC_HEARTBEAT_TIMEOUT=3``, so a stop may outlast the heartbeat
   timeout). One worker of each run is left alone. Checked: the run exits 0
   within its timeout (else a hang), the summary's events, gradients and
   updates agree (every accepted arrival applied, none lost), what became of
   each stopped worker and of its stale push.
3. **A worker that rejoins.** Two workers of one run are killed; one is
   started again with the launcher's own command line and environment, the
   other with the same environment through the worker loop alone (joining
   the coordination service, reading the server's address and the run token,
   saying HELLO), to tell what the coordination service accepts from what
   jaxsync's own start-up does.
4. **Server kill and resume.** Process 0 is killed with SIGKILL after a
   checkpoint, the run is resumed with ``jaxsync resume RUN_DIR``, and the
   version its workers are sent on joining is compared with the last
   checkpoint's: the updates lost are those applied after it.

Sizes: tiny (``--quick``: 1,000 frames and one worker-fault run, under a
minute), default (5,000 frames, six worker-fault runs, one rejoin run, two
server kills; about 5 minutes on 2 CPU cores), full (20,000 frames, 20 runs,
5 server kills). The RNG seed (``--seed``) picks the fuzzed messages, which
workers are faulted, how and when; it is printed and written to the results.

    python benchmarks/fault_campaign.py [--size tiny|default|full] [--quick] [--frames N] [--runs N]
                                        [--server-kills N] [--seed N] [--parts fuzz,workers,rejoin,server]

It exits 1 when a check failed (the results file lists which).
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

import _harness
import numpy as np
import zmq
import zmq.utils.monitor

from jaxsync._src.distributed import wire

NAME = "fault_campaign"
TITLE = "Fault campaign: fuzzed frames, killed and stopped workers, a killed server"
HERE = pathlib.Path(__file__).resolve().parent
PARTS = ("fuzz", "workers", "rejoin", "server")
SIZES = {
  "tiny": {"frames": 1000, "runs": 1, "server_kills": 0, "gradients": 2000, "parts": ("fuzz", "workers")},
  "default": {"frames": 5000, "runs": 6, "server_kills": 2, "gradients": 4000, "parts": PARTS},
  "full": {"frames": 20000, "runs": 20, "server_kills": 5, "gradients": 6000, "parts": PARTS},
}
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
    for sock, monitor in self.oversize_sockets:
      closed = monitor.poll(5000) and zmq.utils.monitor.recv_monitor_message(monitor)
      self.oversize_closed += bool(closed and closed["event"] == zmq.EVENT_DISCONNECTED)
      if sock.poll(0):
        self.replies_got.setdefault("oversize", []).append("reply")
      sock.disable_monitor()
      monitor.close()
      sock.close()

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
    "import json, sys; sys.path.insert(0, sys.argv[1]); import fault_campaign as f; "
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
      str(HERE),
      server.address,
      server.token.hex(),
      str(COUNT),
      str(frames),
      str(seed),
    ],
    stdout=out_file,
    stderr=err_file,
    env=env,
    cwd=_harness.REPO,
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

  def __init__(self, args: list[str], env: dict[str, str] | None = None, cwd: pathlib.Path = _harness.REPO):
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
      self.lines.append((time.monotonic(), line))

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
      return f"{_harness._relative(pathlib.Path(path))}:{line} `{source}`"
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


def write_results(args, argv, seed, fuzz_result, worker_runs, rejoin, kills, wall) -> tuple[str, int]:
  """Writes the results file; returns its text and the number of checks that failed."""
  namespace = argparse.Namespace(
    size=args.size, seeds=None, runs_dir=args.runs_dir, results_dir=args.results_dir
  )
  bench = _harness.Benchmark(NAME, TITLE, namespace, argv, seeds=0)
  bench.started = time.perf_counter() - wall
  bench.run_count = len(worker_runs) + (rejoin is not None) + 2 * len(kills)
  bench.keeps_run_dirs = False
  faults = collections.Counter(f.kind for r in worker_runs for f in r.faults)
  faults["kill"] += 2 if rejoin else 0
  runs = len(worker_runs) + (rejoin is not None) + len(kills)
  finished = (
    sum(r.finished for r in worker_runs)
    + (rejoin is not None and rejoin.code == 0)
    + sum(k.finished for k in kills)
  )
  hangs = sum(r.hung for r in worker_runs) + (rejoin is not None and rejoin.code is None)
  hangs += sum(k.resume_code is None for k in kills)
  crashes = (
    sum(r.crashed for r in worker_runs) + bool(rejoin and rejoin.crashed) + sum(k.crashed for k in kills)
  )
  worker_lost = [r.lost_updates for r in worker_runs if r.lost_updates is not None]
  kill_lost = [k.lost_updates for k in kills if k.lost_updates is not None]
  rows = [
    ["RNG seed", str(seed)],
    [
      "faults injected",
      f"{faults['kill']} SIGKILL of a worker, {faults['stop']} SIGSTOP/SIGCONT of a worker, "
      f"{len(kills)} SIGKILL of the server, {fuzz_result.messages if fuzz_result else 0} fuzzed messages",
    ],
    ["runs (real, through `jaxsync launch`)", str(runs)],
    ["finished (exit 0, full count of events)", str(finished)],
    [f"hangs (no exit within {RUN_TIMEOUT:.0f} s)", str(hangs)],
    [
      "crashes (the server raised or died unasked, a never-faulted worker died)",
      str(crashes + bool(fuzz_result and fuzz_result.crashed)),
    ],
    ["applied updates lost, worker faults", str(sum(worker_lost)) if worker_lost else "-"],
    [
      "applied updates lost past the last checkpoint, server kills",
      ", ".join(map(str, kill_lost)) + " (redone after the resume)" if kill_lost else "-",
    ],
  ]
  if worker_runs:
    stops = [f for r in worker_runs for f in r.faults if f.kind == "stop"]
    lost = [f for f in stops if f.declared_lost]
    applied = [f.stale_push for f in lost if f.stale_push is not None]
    dropped = [f.dropped_staleness for f in lost if f.dropped_staleness is not None]
    rows.append(
      [
        "the first push after SIGCONT of a stopped worker the server declared lost",
        f"{len(lost)} such stops: dropped, coming after the declaration, {len(dropped)}"
        + (f" (they were up to {max(dropped)} versions late)" if dropped else "")
        + f"; applied, coming before it (the worker declared lost later) {len(applied)}"
        + (f" (at staleness up to {max(applied)})" if applied else "")
        + f", none pushed {len(lost) - len(dropped) - len(applied)}",
      ]
    )
    rows.append(
      ["pushes rejected for their version", str(sum(r.rejections.get("version", 0) for r in worker_runs))]
    )
  if fuzz_result:
    rej = fuzz_result.rejected
    rows.append(
      [
        "frames rejected (fuzzing)",
        ", ".join(f"{k} {rej[k]}" for k in sorted(rej))
        + f"; non-finite arrivals rejected by the rule {fuzz_result.rule_rejected}"
        + f"; oversized, dropped by ZeroMQ {fuzz_result.client.get('oversize', 0)}",
      ]
    )
  problems = (fuzz_result.problems if fuzz_result else []) + [p for r in worker_runs for p in r.problems]
  problems += (rejoin.problems if rejoin else []) + [p for k in kills for p in k.problems]
  rows.append(["checks failed", str(len(problems))])
  bench.section("Summary", _harness.table(["", "count"], rows))
  if fuzz_result:
    bench.section("1. Fuzzed frames against an in-process server", _fuzz_text(fuzz_result))
  if worker_runs:
    bench.section("2. Worker faults on real runs", _workers_text(worker_runs))
  if rejoin:
    bench.section("3. A killed worker started again", _rejoin_text(rejoin))
  if kills:
    bench.section("4. The server killed and resumed", _kills_text(kills))
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
      _harness.table(["case", "messages", "must be"], rows),
      "",
      _harness.table(["reason", "invalid messages sent", "rejected by the server"], by_reason),
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
      _harness.table(header, rows),
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

  table = _harness.table(
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
      _harness.table(
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
  parser.add_argument("--gradients", type=int, default=None, help="gradients per real run")
  parser.add_argument("--seed", type=int, default=0, help="the campaign's RNG seed")
  parser.add_argument("--parts", default=None, help=f"a subset of {','.join(PARTS)}")
  parser.add_argument("--results-dir", type=pathlib.Path, default=None)
  parser.add_argument("--runs-dir", type=pathlib.Path, default=None)
  args = parser.parse_args(argv)
  if args.quick:
    args.size = "tiny"
  size = SIZES[args.size]
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
  frames = size["frames"] if args.frames is None else args.frames
  runs = size["runs"] if args.runs is None else args.runs
  kills = size["server_kills"] if args.server_kills is None else args.server_kills
  gradients = size["gradients"] if args.gradients is None else args.gradients
  tiny = ("tiny",) if args.size == "tiny" else ()
  runs_dir = args.runs_dir or _harness.REPO.joinpath("runs", "bench", *tiny, NAME)
  rng = np.random.default_rng(args.seed)
  print(f"[{NAME}] RNG seed {args.seed}", file=sys.stderr)
  started = time.monotonic()
  fuzz_result = None
  if "fuzz" in parts:
    fuzz_result = fuzz(frames, int(rng.integers(2**31)))
    print(
      f"[{NAME}] fuzzing: {fuzz_result.messages} messages, problems {fuzz_result.problems}", file=sys.stderr
    )
  worker_runs = []
  if "workers" in parts:
    for i in range(runs):
      strategy = ("asp", "ssp")[i % 2]
      r = worker_fault_run(runs_dir / f"workers{i}_{strategy}", strategy, gradients, random_faults(rng))
      worker_runs.append(r)
      print(
        f"[{NAME}] run {i} {strategy}: {_fmt_faults(r.faults)}; exit {r.code}; {r.problems}", file=sys.stderr
      )
  rejoin = None
  if "rejoin" in parts:
    rejoin = rejoin_run(runs_dir / "rejoin", 3 * gradients, rng)
    print(f"[{NAME}] rejoin: exit {rejoin.code}; {rejoin.problems}", file=sys.stderr)
  server_kills = []
  if "server" in parts:
    for i in range(kills):
      k = server_kill_run(runs_dir / f"server{i}", gradients, rng)
      server_kills.append(k)
      print(f"[{NAME}] server kill {i}: lost {k.lost_updates}; {k.problems}", file=sys.stderr)
  text, failed = write_results(
    args, argv, args.seed, fuzz_result, worker_runs, rejoin, server_kills, time.monotonic() - started
  )
  print(text)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
