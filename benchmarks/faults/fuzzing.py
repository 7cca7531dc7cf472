"""Part 1 of the fault campaign: fuzzed messages from a client process against a server in this process.

A :class:`ParameterServer` serves here; :func:`fuzz` starts a separate process that runs
:func:`fuzz_client` (random bytes, mutated headers, frames too long, NaN/Inf payloads, worker 0's
legitimate pushes in between) and checks every count the two sides kept.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import zmq
import zmq.utils.monitor

from benchmarks.common import harness
from jaxsync._src.distributed import wire

REPO = pathlib.Path(__file__).resolve().parents[2]  # the fuzzing client imports this module from there
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


# -- the fuzzing client (in its own process) ---------------------------------------------------------------


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
  """Serves a fuzzing client process in this process; checks every count (see ``fault_campaign``, part 1)."""
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
    "import json, sys; sys.path.insert(0, sys.argv[1]); from benchmarks.faults import fuzzing as f; "
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
