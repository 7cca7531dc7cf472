"""Multi-host runs on one machine: every process in a network namespace of its own, a host with its own address.

The ``hosts`` fixture makes N namespaces, each a host with a loopback and one
veth at ``10.99.0.(I+1)/24``, joined by a Linux bridge in one more namespace;
nothing is added to the root namespace, and everything is deleted at the end,
failed test or not. Process I runs ``jaxsync train ... --coordinator
10.99.0.1:PORT --num-processes N --process-id I`` in host I. There 127.0.0.1
is the host's own loopback: a process that bound, announced or dialled it
instead of its host's address (the coordinator, the parameter server's
ZeroMQ socket, gloo's pairs) would not reach the others, and the run would
fail or run into the timeout.

Needs iproute2's ``ip netns`` and CAP_NET_ADMIN (root). Where they are
missing the tests skip, naming the command and its error;
``JAXSYNC_REQUIRE_NETNS=1`` makes that a failure instead.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import helpers

from jaxsync._src.app import config as config_lib
from jaxsync._src.app import experiment
from jaxsync._src.dist import cluster, sync_runtime
from jaxsync._src.train.checkpoints import RunCheckpoints

SUBNET = "10.99.0"  # private to the namespaces: their routing tables are their own
PORT = 4321  # the coordinator's port in host 0, where nothing else listens
PROBE_PORT = 4322  # the isolation check's listener in host 0
TIMEOUT = 180  # seconds a run may take (about 15-30 s here) before the test fails
BASE = ["model.name=mlp", "run.eval_every=50", "run.target_accuracy=0.9", "run.checkpoint_every=null"]
_count = itertools.count()


class Hosts:
  """N network namespaces on one bridge; ``names[i]`` has the address ``addresses[i]``."""

  def __init__(self, n: int):
    stem = f"jaxsync-{os.getpid()}-{next(_count)}"
    self.names = [f"{stem}-h{i}" for i in range(n)]
    self.addresses = [f"{SUBNET}.{i + 1}" for i in range(n)]
    self.bridge = f"{stem}-br"
    self.made: list[str] = []  # the namespaces made (or being made), to delete

  def create(self) -> None:
    """Makes the namespaces and links; skips (or fails) naming the command when ``ip`` cannot."""
    if shutil.which("ip") is None:
      _unavailable("`ip` (iproute2) is not on PATH")
    self.made.append(self.bridge)  # before the command: a half-made namespace is deleted too
    self._ip("netns", "add", self.bridge)
    self._ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
    self._ip("-n", self.bridge, "link", "set", "br0", "up")
    for i, (name, address) in enumerate(zip(self.names, self.addresses)):
      self.made.append(name)
      self._ip("netns", "add", name)
      # Both ends are made inside their namespaces: the root namespace never holds them.
      self._ip(
        "link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", f"h{i}", "netns", self.bridge
      )
      self._ip("-n", self.bridge, "link", "set", f"h{i}", "master", "br0")
      self._ip("-n", self.bridge, "link", "set", f"h{i}", "up")
      self._ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
      self._ip("-n", name, "link", "set", "eth0", "up")
      self._ip("-n", name, "link", "set", "lo", "up")

  def _ip(self, *args: str) -> None:
    cmd = ["ip", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
      _unavailable(f"`{' '.join(cmd)}` failed (exit code {done.returncode}): {done.stderr.strip()}")

  def exec(self, i: int, *argv: str) -> list[str]:
    """The command line that runs ``argv`` in host ``i``."""
    return ["ip", "netns", "exec", self.names[i], *argv]

  def destroy(self) -> list[str]:
    """Kills what still runs in the namespaces, deletes them (their veths go with them); returns what is left."""
    if not self.made:
      return []
    for name in self.made:
      pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
      for pid in pids:  # only processes this test started live in its namespaces
        try:
          os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
          pass
    for name in reversed(self.made):
      subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [name for name in self.made if re.search(rf"^{re.escape(name)}\b", listed, re.M)]


def _unavailable(reason: str):
  message = f"network namespaces are unavailable here: {reason}"
  if os.environ.get("JAXSYNC_REQUIRE_NETNS") == "1":
    pytest.fail(f"{message} (JAXSYNC_REQUIRE_NETNS=1)")
  pytest.skip(message)


@pytest.fixture
def hosts():
  """``hosts(n)``: n hosts that reach each other at their addresses and not at 127.0.0.1."""
  made: list[Hosts] = []

  def make(n: int) -> Hosts:
    h = Hosts(n)
    made.append(h)
    h.create()
    _check_isolation(h)
    return h

  try:
    yield make
  finally:
    left = [name for h in made for name in h.destroy()]
    assert not left, f"namespaces left behind: {left}"


_LISTEN = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(); print("listening", flush=True)
while True: s.accept()[0].close()
"""
_DIAL = """
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
try:
  socket.create_connection(("127.0.0.1", port), timeout=2).close(); print("loopback reached host 0")
except OSError:
  pass
deadline = time.monotonic() + 10
while True:
  try:
    socket.create_connection((host, port), timeout=2).close(); print("ok"); break
  except OSError as err:
    if time.monotonic() > deadline: print(f"{host}:{port} unreachable: {err}"); break
    time.sleep(0.1)
"""


def _check_isolation(h: Hosts) -> None:
  """Every host reaches host 0 at its address, and not at 127.0.0.1: its loopback is its own."""
  server = subprocess.Popen(
    h.exec(0, sys.executable, "-c", _LISTEN, str(PROBE_PORT)), stdout=subprocess.PIPE, text=True
  )
  try:
    assert server.stdout.readline().strip() == "listening"
    for i in range(1, len(h.names)):
      said = subprocess.run(
        h.exec(i, sys.executable, "-c", _DIAL, h.addresses[0], str(PROBE_PORT)),
        capture_output=True,
        text=True,
        timeout=30,
      )
      assert said.stdout.strip() == "ok", (i, said.stdout, said.stderr)
  finally:
    server.kill()
    server.wait()


def _run(h: Hosts, overrides: list[str], out, logs) -> list[str]:
  """Runs process I of the run in host I; returns their logs (fails on a timeout or a non-zero exit)."""
  n = len(h.names)
  sets = [f"--set={o}" for o in [*BASE, *overrides]]
  membership = (cluster.ENV_COORDINATOR, cluster.ENV_NUM_PROCESSES, cluster.ENV_PROCESS_ID)
  env = {
    k: v for k, v in os.environ.items() if k not in (*membership, cluster.ENV_BIND, cluster.ENV_ADVERTISE)
  }
  env.update(PYTHONUNBUFFERED="1", JAXSYNC_HEARTBEAT_TIMEOUT="3", JAX_PLATFORMS="cpu")
  logs.mkdir()
  processes = []
  try:
    for i in range(n):
      argv = [sys.executable, "-m", "jaxsync.cli", "train", "configs/quickstart.yaml", *sets]
      argv += ["--out", str(out), "--progress", "quiet", "--coordinator", f"{h.addresses[0]}:{PORT}"]
      argv += ["--num-processes", str(n), "--process-id", str(i)]
      with open(logs / f"p{i}.log", "w") as log:
        processes.append(
          subprocess.Popen(
            h.exec(i, *argv), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
          )
        )
    deadline = time.monotonic() + TIMEOUT
    for p in processes:
      try:
        p.wait(timeout=max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        pytest.fail(f"the run did not finish within {TIMEOUT} s:\n{_tails(logs, n)}")
  finally:
    for p in processes:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)  # each process leads a session of its own
        p.wait()
  codes = [p.returncode for p in processes]
  assert codes == [0] * n, f"exit codes {codes}:\n{_tails(logs, n)}"
  return [(logs / f"p{i}.log").read_text() for i in range(n)]


def _tails(logs, n: int) -> str:
  return "\n".join(f"--- process {i}:\n{(logs / f'p{i}.log').read_text()[-2000:]}" for i in range(n))


def _check_addresses(h: Hosts, texts: list[str]) -> None:
  """Each process joined through host 0's address, bound every interface and is reached at its own address."""
  n = len(h.names)
  for i, text in enumerate(texts):
    line = re.search(
      r"jaxsync: process (\d+) of (\d+) \((\w+); coordinator (\S+), sockets on (\S+), reached at (\S+),", text
    )
    assert line, text[-2000:]
    assert line.groups() == (
      str(i),
      str(n),
      "explicit",
      f"{h.addresses[0]}:{PORT}",
      "0.0.0.0",
      h.addresses[i],
    )


def _summary(run_dir) -> dict:
  return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.heavy
def test_bsp_across_two_hosts_equals_the_simulator(hosts, tmp_path):
  h = hosts(2)
  overrides = ["strategy.name=bsp", "cluster.num_workers=2", "run.gradients=120", "run.chunk=20"]
  texts = _run(h, overrides, tmp_path / "bsp", tmp_path / "logs")
  _check_addresses(h, texts)
  # gloo's pairs connected across the hosts: every round ran, and both hosts hold the same parameters.
  hashes = [re.findall(rf"process {i}: final parameters sha256 (\w+)", t) for i, t in enumerate(texts)]
  assert hashes[0] and hashes[0] == hashes[1], hashes
  summary = _summary(tmp_path / "bsp")
  assert (summary["events"], summary["updates"], summary["gradients"]) == (60, 60, 120)
  assert json.loads((tmp_path / "bsp" / "launch.json").read_text()) == {"num_processes": 2, "how": "explicit"}
  # The simulated bsp run: the same parameters up to float rounding (one all-reduce against one batch).
  cfg = config_lib.load("configs/quickstart.yaml", [*BASE, *overrides])
  exp = experiment.build(cfg)
  sim = exp.simulator()
  sim_state, _ = sim.advance(sim.init(exp.model.params, cfg.seed), 60)
  like = helpers.sync_state_like(exp, 2)
  ckpt = RunCheckpoints(tmp_path / "bsp" / "checkpoints", read_only=True)
  state, _, _ = ckpt.restore(like)
  ckpt.close()
  for a, b in zip(jax.tree.leaves(sim_state.params), jax.tree.leaves(state.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-4, atol=2e-5)


@pytest.mark.heavy
def test_asp_parameter_server_and_two_workers_on_three_hosts(hosts, tmp_path):
  h = hosts(3)
  overrides = [
    "strategy.name=asp",
    "strategy.options={learning_rate: 0.05}",
    "cluster.num_workers=2",
    "run.gradients=300",
    "run.chunk=100",
  ]
  texts = _run(h, overrides, tmp_path / "asp", tmp_path / "logs")
  _check_addresses(h, texts)
  # The workers fetched the server's published address (host 0's) and reached it from their hosts.
  for k in (0, 1):
    assert re.search(rf"worker {k} joined at version \d+, data step \d+", texts[0]), texts[0][-2000:]
    pushes = re.search(rf"worker {k}: (\d+) pushes in [\d.]+ s\b[^\n]*; the server said stop", texts[k + 1])
    assert pushes and int(pushes.group(1)) > 0, texts[k + 1][-2000:]
  summary = _summary(tmp_path / "asp")
  assert (summary["events"], summary["updates"], summary["gradients"]) == (300, 300, 300)
  assert summary["lost_workers"] == [] and not summary["rejected_messages"], summary
  assert json.loads((tmp_path / "asp" / "launch.json").read_text()) == {"num_processes": 3, "how": "explicit"}


def test_gloo_is_given_the_advertised_address_only_where_this_host_can_bind_it():
  assert cluster._is_local_address("127.0.0.1")
  assert not cluster._is_local_address("192.0.2.1")  # TEST-NET-1: no interface here has it
