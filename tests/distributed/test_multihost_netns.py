"""Multi-host runs on one machine: every process in a network namespace of its own, a host with its own address.

The ``hosts`` fixture makes N namespaces (``benchmarks.common.netns``), each a
host with a loopback and one veth at ``10.99.0.(I+1)/24``, joined by a Linux
bridge in one more namespace; nothing is added to the root namespace, and
everything is deleted at the end, failed test or not. Process I runs ``jaxsync train ... --coordinator
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

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from benchmarks.common import catalog
from benchmarks.common import netns as _netns
from benchmarks.common.netns import Hosts
from jaxsync._src.app import config as config_lib
from jaxsync._src.app import experiment
from jaxsync._src.distributed import cluster
from jaxsync._src.train.checkpoints import RunCheckpoints

import helpers

PORT = _netns.PORT  # the coordinator's port in host 0, where nothing else listens
PROBE_PORT = 4322  # the isolation check's listener in host 0
TIMEOUT = 180  # seconds a run may take (about 15-30 s here) before the test fails
BASE = ["model.name=mlp", "run.eval_every=50", "run.target_accuracy=0.9", "run.checkpoint_every=null"]


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
    try:
      h.create()
    except _netns.Unavailable as err:
      _unavailable(str(err))
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
  membership = (cluster.ENV_COORDINATOR, cluster.ENV_NUM_PROCESSES, cluster.ENV_PROCESS_ID)
  env = {
    k: v for k, v in os.environ.items() if k not in (*membership, cluster.ENV_BIND, cluster.ENV_ADVERTISE)
  }
  env.update(PYTHONUNBUFFERED="1", JAXSYNC_HEARTBEAT_TIMEOUT="3", JAX_PLATFORMS="cpu")
  try:
    codes, texts = _netns.train(
      h, str(helpers.QUICKSTART), [*BASE, *overrides], out, logs, env=env, timeout=TIMEOUT
    )
  except TimeoutError as err:
    pytest.fail(str(err))
  assert codes == [0] * len(codes), f"exit codes {codes}:\n{_netns.tails(logs, len(codes))}"
  return texts


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
  cfg = config_lib.load(helpers.QUICKSTART, [*BASE, *overrides])
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


def _tiny_benchmark(name: str, tmp_path) -> str:
  """Runs ``python -m benchmarks.GROUP.NAME --size tiny`` (skipping, or failing, where namespaces cannot be made); its results."""
  import importlib

  results = tmp_path / "results"
  argv = ["--size", "tiny", "--results-dir", str(results), "--runs-dir", str(tmp_path / "runs")]
  try:
    assert importlib.import_module(catalog.module(name)).main(argv) == 0
  except _netns.Unavailable as err:
    _unavailable(str(err))
  return (results / f"{name}.md").read_text()


@pytest.mark.heavy
def test_the_sharded_server_benchmark_runs_each_layout_on_hosts_with_shaped_cards(tmp_path):
  markdown = _tiny_benchmark("sharded_server", tmp_path)
  rows = [line.strip("|").split("|") for line in markdown.splitlines() if re.match(r"\| 2 \| [12] \|", line)]
  assert [int(r[1]) for r in rows] == [1, 2], markdown
  for row in rows:
    measured, server_bound, worker_bound, of_bound = (float(c) for c in row[2:6])
    assert of_bound == pytest.approx(measured / min(server_bound, worker_bound), abs=0.01)
    # The cards bind: unshaped, these runs take about 100 gradients/s, 7x the bound.
    assert 0.3 < of_bound < 1.1, row
  assert float(rows[0][3]) * 2 == pytest.approx(float(rows[1][3]), rel=1e-3)  # two server cards carry twice
  assert re.search(
    r"K = 2: [\d.]+x \(the bounds allow 1.00x; one server host ran at [\d.]+ of its bound", markdown
  )
  assert "--set cluster.servers=2 " in markdown and "--num-processes 4 --process-id I" in markdown


@pytest.mark.heavy
def test_the_node_aggregation_benchmark_runs_inhad_nodes_on_hosts_of_their_own(tmp_path):
  """A node's aggregator binds every interface of its host and is reached at its address by its workers;
  the server's card moves one sum and one broadcast per update instead of every push and reply."""
  markdown = _tiny_benchmark("node_aggregation", tmp_path)
  rows = {r[0].strip(): [c.strip() for c in r[1:]] for r in (line.strip("|").split("|") for line in markdown.splitlines()) if r[0].strip().startswith(("k_async", "inhad"))}  # fmt: skip
  assert list(rows) == ["k_async, k = K", "inhad, wait_for_pull"], markdown
  assert rows["k_async, k = K"][2] == "2.00"  # every push in, every reply out
  base = float(rows["k_async, k = K"][0])
  rate, against, models = (float(rows["inhad, wait_for_pull"][0]), *rows["inhad, wait_for_pull"][1:3])
  assert float(models) <= 1.05, markdown  # one sum and one broadcast per update of K = 2 (and version 0's)
  assert abs(float(against.rstrip("x")) - rate / base) <= 0.006, markdown  # from the unrounded rates
  assert re.search(r"measured 1\.0\d waiting for each pull\)\. .* at [\d.]+x `k_async`'s rate\.", markdown)
  logs = (tmp_path / "runs" / "inhad_wait_for_pull_logs" / "p1.log").read_text()
  assert "sockets on 0.0.0.0, reached at 10.99.0.2" in logs, logs[-2000:]
