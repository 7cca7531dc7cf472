"""Hosts on one machine: network namespaces, each with its own address and, optionally, its own network card's rate.

:class:`Hosts` makes N namespaces, each a host with a loopback and one veth
at ``10.99.0.(I+1)/24``, joined by a Linux bridge in one more namespace;
nothing is added to the root namespace, and everything is deleted by
:meth:`Hosts.destroy`. With ``rate_mbit`` each host's link is shaped in both
directions (``tc`` token bucket on the host's end, its egress, and on the
bridge's end, its ingress), as a network card of that rate would be: what
one process can move is then bounded by its host's card, not by loopback
memory copies.

Needs iproute2 (``ip netns``, ``tc``) and CAP_NET_ADMIN (root); where they are
missing, :class:`Unavailable` names the command and its error. Used by the
multi-host tests (``tests/distributed/test_multihost_netns.py``) and
``benchmarks.speed.sharded_server``.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

SUBNET = "10.99.0"  # private to the namespaces: their routing tables are their own
PORT = 4321  # the coordinator's port in host 0, where nothing else listens
# A shaped card's burst, in seconds at its rate: what a token bucket lets through at once after an idle
# spell. A real card has none; 10 ms keeps a busy machine's streams at the rate, 1 ms (125 KB at 1 Gbit/s)
# still does here (a stream of 605 KB messages echoed: 116 MB/s at 1 Gbit/s, 11.3 MB/s at 100 Mbit/s, against
# 118 and 11.1 with 10 ms; measured once, 2026-11-27, on a 2-core VM) while a message after an idle spell
# rides far less of it.
BURST_SECONDS = 0.01
_count = itertools.count()


class Unavailable(RuntimeError):
  """Network namespaces (or traffic shaping) cannot be made here; the message names the command."""


class Hosts:
  """N network namespaces on one bridge; ``names[i]`` has the address ``addresses[i]``.

  Args:
    n: hosts.
    rate_mbit: each host's link rate in Mbit/s, each direction (``None``: unshaped).
    burst_seconds: each card's burst (:data:`BURST_SECONDS`).
  """

  def __init__(self, n: int, rate_mbit: float | None = None, burst_seconds: float = BURST_SECONDS):
    stem = f"jaxsync-{os.getpid()}-{next(_count)}"
    self.names = [f"{stem}-h{i}" for i in range(n)]
    self.addresses = [f"{SUBNET}.{i + 1}" for i in range(n)]
    self.bridge = f"{stem}-br"
    self.rate_mbit = rate_mbit
    self.burst_seconds = burst_seconds
    self.made: list[str] = []  # the namespaces made (or being made), to delete

  def create(self) -> Hosts:
    """Makes the namespaces and links; raises :class:`Unavailable` naming the command that failed."""
    if shutil.which("ip") is None:
      raise Unavailable("`ip` (iproute2) is not on PATH")
    if self.rate_mbit is not None and shutil.which("tc") is None:
      raise Unavailable("`tc` (iproute2) is not on PATH")
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
      if self.rate_mbit is not None:
        for namespace, device in ((name, "eth0"), (self.bridge, f"h{i}")):
          self._run("tc", "-n", namespace, *_token_bucket(device, self.rate_mbit, self.burst_seconds))
    return self

  def _ip(self, *args: str) -> None:
    self._run("ip", *args)

  def _run(self, *cmd: str) -> None:
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
      raise Unavailable(f"`{' '.join(cmd)}` failed (exit code {done.returncode}): {done.stderr.strip()}")

  def exec(self, i: int, *argv: str) -> list[str]:
    """The command line that runs ``argv`` in host ``i``."""
    return ["ip", "netns", "exec", self.names[i], *argv]

  def destroy(self) -> list[str]:
    """Kills what still runs in the namespaces, deletes them (their veths go with them); returns what is left."""
    if not self.made:
      return []
    for name in self.made:
      pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
      for pid in pids:  # only processes started in these namespaces live there
        try:
          os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
          pass
    for name in reversed(self.made):
      subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [name for name in self.made if re.search(rf"^{re.escape(name)}\b", listed, re.M)]


def _token_bucket(device: str, rate_mbit: float, burst_seconds: float = BURST_SECONDS) -> list[str]:
  """``tc qdisc`` arguments shaping ``device``'s egress to ``rate_mbit``: a token bucket with a burst
  of ``burst_seconds`` at the rate (at least 32 KB: a 64 KB burst at 1 Gbit/s held a stream to 87 MB/s,
  125 KB let it reach the rate, measured once on a 2-core VM) and 100 ms of queue."""
  burst = max(32 * 1024, int(rate_mbit * 1e6 / 8 * burst_seconds))
  return [
    "qdisc",
    "add",
    "dev",
    device,
    "root",
    "tbf",
    "rate",
    f"{rate_mbit}mbit",
    "burst",
    str(burst),
    "latency",
    "100ms",
  ]


def train(
  h: Hosts,
  config: str,
  overrides: list[str],
  out: pathlib.Path,
  logs: pathlib.Path,
  *,
  env: dict[str, str],
  timeout: float,
  host_of: list[int] | None = None,
) -> tuple[list[int], list[str]]:
  """Runs process I of one ``jaxsync train`` run in host ``host_of[I]`` (default I), joined at host 0's
  address; returns exit codes and logs.

  Each process is ``jaxsync train CONFIG --set ... --out OUT --coordinator ADDR:PORT --num-processes N
  --process-id I``, its output in ``logs/pI.log``; processes that share a host share its card. Raises
  TimeoutError (the processes killed, the message holding their logs' tails) when the run outlasts
  ``timeout`` seconds.
  """
  host_of = list(range(len(h.names))) if host_of is None else list(host_of)
  n = len(host_of)
  logs.mkdir(parents=True)
  processes = []
  try:
    for i in range(n):
      argv = [sys.executable, "-m", "jaxsync.cli", "train", config, *[f"--set={o}" for o in overrides]]
      argv += ["--out", str(out), "--progress", "quiet", "--coordinator", f"{h.addresses[0]}:{PORT}"]
      argv += ["--num-processes", str(n), "--process-id", str(i)]
      with open(logs / f"p{i}.log", "w") as log:
        processes.append(
          subprocess.Popen(
            h.exec(host_of[i], *argv), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
          )
        )
    deadline = time.monotonic() + timeout
    for p in processes:
      try:
        p.wait(timeout=max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        raise TimeoutError(f"the run did not finish within {timeout} s:\n{tails(logs, n)}") from None
  finally:
    for p in processes:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)  # each process leads a session of its own
        p.wait()
  return [p.returncode for p in processes], [(logs / f"p{i}.log").read_text() for i in range(n)]


def tails(logs: pathlib.Path, n: int) -> str:
  """The last 2,000 characters of each process's log."""
  return "\n".join(f"--- process {i}:\n{(logs / f'p{i}.log').read_text()[-2000:]}" for i in range(n))


def run_env() -> dict[str, str]:
  """This process's environment without a run's membership (each process is given its own on the command line)."""
  from jaxsync._src.distributed import cluster

  membership = (cluster.ENV_COORDINATOR, cluster.ENV_NUM_PROCESSES, cluster.ENV_PROCESS_ID)
  env = {
    k: v for k, v in os.environ.items() if k not in (*membership, cluster.ENV_BIND, cluster.ENV_ADVERTISE)
  }
  env.update(PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
  return env


def train_on_hosts(
  num_hosts: int,
  rate_mbit: float | None,
  config: str,
  overrides: list[str],
  out: pathlib.Path,
  *,
  timeout: float,
  host_of: list[int] | None = None,
  burst_seconds: float = BURST_SECONDS,
) -> tuple[list[int], pathlib.Path]:
  """One run on ``num_hosts`` fresh hosts with cards of ``rate_mbit`` (and ``burst_seconds``, :class:`Hosts`)
  (:func:`train`); returns exit codes and the logs' folder (``OUT_logs``). The hosts are deleted afterwards;
  one left behind raises RuntimeError."""
  logs = out.with_name(out.name + "_logs")
  for folder in (out, logs):
    shutil.rmtree(folder, ignore_errors=True)
  hosts = Hosts(num_hosts, rate_mbit=rate_mbit, burst_seconds=burst_seconds)
  try:
    hosts.create()
    codes, _ = train(hosts, config, overrides, out, logs, env=run_env(), timeout=timeout, host_of=host_of)
  finally:
    left = hosts.destroy()
  if left:
    raise RuntimeError(f"namespaces left behind: {left}")
  return codes, logs


def steady_rate(run_dir: pathlib.Path, counter: str = "updates") -> tuple[float, float | None]:
  """(``counter`` per second over the second half of the run's evaluations, the final accuracy)."""
  rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
  evals = [r for r in rows if r["kind"] == "eval"]
  middle, last = evals[len(evals) // 2], evals[-1]
  rate = (last[counter] - middle[counter]) / (last["wall_time"] - middle["wall_time"])
  final = [r for r in rows if r["kind"] == "final"]
  return rate, final[-1].get("accuracy") if final else None


def card_settings(parser, settings: dict, argv: list[str], name: str):
  """Parses ``--size``, ``--rate-mbit``, ``--hidden``, ``--gradients``; returns (args, the size's settings
  with the given ones in place). Sizes past ``default`` run the default's (the results file says which)."""
  parser.add_argument("--rate-mbit", type=float, default=None, help="each host's card, Mbit/s each way")
  parser.add_argument("--hidden", type=int, default=None, help="units of each of the MLP's two hidden layers")
  parser.add_argument("--gradients", type=int, default=None, help="gradients per run")
  args = parser.parse_args(argv)
  args.size = "tiny" if args.size == "tiny" else "default"
  setting = dict(settings[args.size])
  for key, given in (("rate", args.rate_mbit), ("hidden", args.hidden), ("gradients", args.gradients)):
    if given is not None:
      if given <= 0:
        raise SystemExit(f"{name}: --{key.replace('rate', 'rate-mbit')}={given}; give a positive number")
      setting[key] = given
  return args, setting
