"""A sharded parameter server against one server, when every process has a network card of its own.

On one machine every process shares the loopback and the cores, so a sharded server's gain (no server
process moves more than ``1/S`` of the model) cannot show. Here each process is a host of its own: a network
namespace (``netns.py``) whose link is shaped to ``--rate-mbit`` in each direction, like a network card.
An ``asp`` run of ``K`` worker hosts trains the quickstart's digits on an MLP of two hidden layers of
``--hidden`` units (1,024: 1.1M parameters, a 4.5 MB message), through one server host (``cluster.servers=1``)
and then through two shard hosts (``cluster.servers=2``), side by side. Measured: gradients per second
over the second half of the run (after start-up and compilation), from the run's own metrics. At the default
size each layout also runs once on unshaped links: what this machine's cores and loopback allow, so that a
shaped rate far below it is the cards' doing.

What the cards allow, per gradient of ``n`` bytes at a card's rate ``R`` (bytes/s): a server's card
carries ``n/S`` in and ``n/S`` out, so the servers take at most ``S R / n`` gradients/s; a worker waits for its
reply before it computes again, so each worker's push and pull cross its own card one after the other, at most
``R / (2n)`` gradients/s per worker (``K R / (2n)`` in all). Sharding pays while ``S R / n`` is the smaller.

Sizes: tiny (the suite's: K = 2, a 0.34 MB MLP, 40 Mbit/s, 120 gradients), default (K = 2 and 4,
1.1M parameters, 200 Mbit/s, 400 gradients; about 8 minutes on 2 CPU cores). Needs root (``ip netns``, ``tc``).

    python -m benchmarks.speed.sharded_server [--size tiny|default] [--rate-mbit R] [--hidden H] [--gradients N]
"""

from __future__ import annotations

import json
import pathlib
import shlex
import sys

from benchmarks.common import harness, netns

NAME = "sharded_server"
SETTINGS = {
  "tiny": {"workers": (2,), "hidden": 256, "rate": 40.0, "gradients": 120, "control": False},
  "default": {"workers": (2, 4), "hidden": 1024, "rate": 200.0, "gradients": 400, "control": True},
}
TIMEOUT = 900  # seconds one run may take


def parameters(hidden: int, inputs: int = 64, classes: int = 10) -> int:
  """Parameters of the quickstart's MLP with two hidden layers of ``hidden`` units (digits: 64 inputs)."""
  return inputs * hidden + hidden + hidden * hidden + hidden + hidden * classes + classes


def overrides(servers: int, workers: int, hidden: int, gradients: int) -> list[str]:
  """The ``--set`` overrides of the quickstart config for one run."""
  return [
    "model.name=mlp",
    f"model.hidden=[{hidden}, {hidden}]",
    "strategy.name=asp",
    "strategy.options={learning_rate: 0.01}",
    f"cluster.num_workers={workers}",
    f"cluster.servers={servers}",
    f"run.gradients={gradients}",
    f"run.eval_every={max(1, gradients // 10)}",
    "run.checkpoint_every=null",
  ]


def run(
  servers: int, workers: int, hidden: int, rate: float | None, gradients: int, runs_dir: pathlib.Path
) -> dict:
  """One ``asp`` run on ``servers + workers`` hosts with cards of ``rate`` Mbit/s (None: unshaped); its rate."""
  stem = f"s{servers}_k{workers}" + ("" if rate else "_unshaped")
  out = runs_dir / stem
  config = str(harness.REPO / "configs" / "quickstart.yaml")
  sets = overrides(servers, workers, hidden, gradients)
  codes, logs = netns.train_on_hosts(servers + workers, rate, config, sets, out, timeout=TIMEOUT)
  if codes != [0] * len(codes):
    raise RuntimeError(f"{NAME}: exit codes {codes}:\n{netns.tails(logs, len(codes))}")
  measured, accuracy = netns.steady_rate(out)
  summary = json.loads((out / "summary.json").read_text())
  if summary["updates"] != gradients:
    raise RuntimeError(f"{NAME}: the run applied {summary['updates']} of {gradients} gradients")
  return {"rate": measured, "accuracy": accuracy}


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  args, setting = netns.card_settings(harness.parser(__doc__), SETTINGS, argv, NAME)
  bench = harness.Benchmark(
    NAME, "A sharded parameter server on hosts with their own network cards", args, argv, 0
  )
  count = parameters(setting["hidden"])
  message = 4 * count  # float32
  card = setting["rate"] * 1e6 / 8  # bytes/s
  rows, measured, unshaped, commands = [], {}, {}, []
  for workers in setting["workers"]:
    for servers in (1, 2):
      got = run(servers, workers, setting["hidden"], setting["rate"], setting["gradients"], bench.runs_dir)
      bench.run_count += 1
      measured[(servers, workers)] = got["rate"]
      if setting["control"]:
        free = run(servers, workers, setting["hidden"], None, setting["gradients"], bench.runs_dir)
        bench.run_count += 1
        unshaped[(servers, workers)] = free["rate"]
      server_bound = servers * card / message
      worker_bound = workers * card / (2 * message)
      rows.append(
        [
          str(workers),
          str(servers),
          f"{got['rate']:.2f}",
          f"{server_bound:.2f}",
          f"{worker_bound:.2f}",
          f"{got['rate'] / min(server_bound, worker_bound):.2f}",
          harness.ratio(got["rate"], measured[(1, workers)]) if servers == 2 else "1",
          f"{got['accuracy']:.3f}" if got["accuracy"] is not None else "-",
          f"{unshaped[(servers, workers)]:.1f}" if unshaped else "-",
        ]
      )
      print(f"[{NAME}] K={workers} S={servers}: {got['rate']:.2f} gradients/s", file=sys.stderr)
      sets = overrides(servers, workers, setting["hidden"], setting["gradients"])
      commands.append(
        "jaxsync train configs/quickstart.yaml "
        + " ".join(f"--set {shlex.quote(o)}" for o in sets)
        + f" --coordinator 10.99.0.1:{netns.PORT} --num-processes {servers + workers} --process-id I"
      )
  bench.section(
    f"Gradients per second, {count:,} parameters ({message / 1e6:.2f} MB a message), cards of"
    f" {setting['rate']:g} Mbit/s each way, {setting['gradients']} gradients a run",
    "*server bound*: `S R / n`, what the server cards can carry; *worker bound*: `K R / (2n)`, what the"
    " workers' cards allow a push then a pull at a time; *of bound*: the measured rate over the smaller;"
    " *sharded / one*: two shard hosts against one server host, same workers; *unshaped*: the same run on"
    " links without a rate limit (this machine's cores and loopback; default size only).\n\n"
    + harness.table(
      [
        "workers K",
        "servers S",
        "gradients/s",
        "server bound",
        "worker bound",
        "of bound",
        "sharded / one",
        "final accuracy",
        "unshaped gradients/s",
      ],
      rows,
    ),
  )

  def bound(servers: int, workers: int) -> float:
    return min(servers * card / message, workers * card / (2 * message))

  bench.section("What it shows", findings(setting, measured, unshaped, bound))
  bench.section(
    f"Commands (process I in host I, at 10.99.0.(I+1), its card shaped to {setting['rate']:g} Mbit/s each way)",
    harness.code(commands),
  )
  bench.write()
  return 0


def findings(setting: dict, measured: dict, unshaped: dict, bound) -> str:
  """The gains against what the cards allow, and how close each layout came to its bound, in words."""
  parts = []
  for k in setting["workers"]:
    one, two = measured[(1, k)] / bound(1, k), measured[(2, k)] / bound(2, k)
    parts.append(
      f"K = {k}: {measured[(2, k)] / measured[(1, k)]:.2f}x (the bounds allow {bound(2, k) / bound(1, k):.2f}x;"
      f" one server host ran at {one:.2f} of its bound, two shard hosts at {two:.2f})"
    )
  text = "Two shard hosts against one server host: " + "; ".join(parts) + "."
  if unshaped:
    ceiling = min(unshaped.values())
    text += (
      f" Unshaped, every layout ran at {ceiling:.0f} gradients/s or more, {ceiling / max(measured.values()):.0f}x"
      " the fastest shaped run: the cards, not this machine's cores, set the shaped rates."
    )
  return text + (
    " Each host's card is a token bucket (`tc tbf`) on its veth; TCP over a shaped link, ZeroMQ's framing and"
    " the server's step keep every rate under its bound."
  )


if __name__ == "__main__":
  try:
    sys.exit(main())
  except netns.Unavailable as err:
    raise SystemExit(f"{NAME}: network namespaces are unavailable here: {err}") from None
