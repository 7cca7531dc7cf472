"""InHAD's node aggregation on the wire against every gradient crossing the server's card, on hosts with their own cards.

InHAD (J. Supercomputing 2021) sums a node's gradients on the node and moves one sum per node when the server
pulls. Here each host is a network namespace (``netns.py``) whose card is shaped to ``--rate-mbit`` each way:
host 0 runs the parameter server, each other host is a node of ``W = 2`` worker processes sharing that host's
card, and the first worker process of each node runs the node's aggregator. Side by side, on the same hosts,
the same MLP (two hidden layers of ``--hidden`` units) on the quickstart's digits:

* ``k_async`` with ``k = K``: the server averages ``K`` gradients and every worker waits for the update; every
  push and every reply crosses the server's card;
* ``inhad`` with ``wait_for_pull`` and ``T = K``: the same mean of ``K`` gradients and the same waiting (both
  are ``bsp`` in their updates), but the gradients stay on their nodes: the server's card moves one sum per
  node and one broadcast per node per update;
* ``inhad`` as it is by default: workers go on with the last broadcast between pulls.

Measured: gradients per second over the second half of the run (from the run's own metrics) and the bytes the
server's card moved per gradient (the run summary's ``bytes_moved``, counted by the server). At the default
size each layout also runs on unshaped links: what this machine's cores and loopback allow.

Sizes: tiny (the suite's: one node of 2, a 0.34 MB MLP, 40 Mbit/s, 120 gradients, the first two runs), default (two nodes of 2,
1.1M parameters, 200 Mbit/s, 400 gradients; about 5 minutes on 2 CPU cores). Needs root (``ip netns``, ``tc``).

    python -m benchmarks.speed.node_aggregation [--size tiny|default] [--rate-mbit R] [--hidden H] [--gradients N]
"""

from __future__ import annotations

import json
import pathlib
import shlex
import sys

from benchmarks.common import harness, netns
from benchmarks.speed.sharded_server import parameters

NAME = "node_aggregation"
NODE_SIZE = 2
SETTINGS = {
  # tiny runs the first two layouts (the fair pair): the suite runs it.
  "tiny": {"nodes": 1, "hidden": 256, "rate": 40.0, "gradients": 120, "control": False, "layouts": 2},
  "default": {"nodes": 2, "hidden": 1024, "rate": 200.0, "gradients": 400, "control": True, "layouts": 3},
}
TIMEOUT = 900  # seconds one run may take


def layouts(workers: int) -> list[tuple[str, str, str]]:
  """(label, strategy, options) of each run, in the table's order (the first is the others' reference)."""
  return [
    ("k_async, k = K", "k_async", f"{{k: {workers}, learning_rate: 0.05}}"),
    (
      "inhad, wait_for_pull",
      "inhad",
      f"{{local_workers: {NODE_SIZE}, wait_for_pull: true, learning_rate: 0.05}}",
    ),
    ("inhad", "inhad", f"{{local_workers: {NODE_SIZE}, learning_rate: 0.05}}"),
  ]


def overrides(strategy: str, options: str, workers: int, hidden: int, gradients: int) -> list[str]:
  """The ``--set`` overrides of the quickstart config for one run."""
  return [
    "model.name=mlp",
    f"model.hidden=[{hidden}, {hidden}]",
    f"strategy.name={strategy}",
    f"strategy.options={options}",
    f"cluster.num_workers={workers}",
    f"run.gradients={gradients}",
    f"run.eval_every={max(workers, gradients // 10)}",
    "run.checkpoint_every=null",
  ]


def run(sets: list[str], nodes: int, rate: float | None, gradients: int, out: pathlib.Path) -> dict:
  """One run: the server in host 0, node ``j``'s workers in host ``j + 1``; its rate and server-card bytes."""
  host_of = [0] + [1 + w // NODE_SIZE for w in range(nodes * NODE_SIZE)]
  config = str(harness.REPO / "configs" / "quickstart.yaml")
  codes, logs = netns.train_on_hosts(1 + nodes, rate, config, sets, out, timeout=TIMEOUT, host_of=host_of)
  summary_file = out / "summary.json"
  if codes[0] != 0 or not summary_file.exists():
    raise RuntimeError(f"{NAME}: exit codes {codes}:\n{netns.tails(logs, len(codes))}")
  measured, accuracy = netns.steady_rate(out, "event")  # an event: one gradient; an update: K
  summary = json.loads(summary_file.read_text())
  if summary["gradients"] != gradients:
    raise RuntimeError(f"{NAME}: the run ended after {summary['gradients']} gradients")
  return {
    # The server's run is complete; a worker process that ended badly after it is reported, not hidden.
    "failed_processes": [i for i, code in enumerate(codes) if code != 0],
    "rate": measured,
    "accuracy": accuracy,
    "server_bytes": summary["bytes_moved"] / summary["gradients"],
    "gradients": summary["gradients"],
  }


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  args, setting = netns.card_settings(harness.parser(__doc__), SETTINGS, argv, NAME)
  bench = harness.Benchmark(
    NAME, "InHAD's node aggregation on hosts with their own network cards", args, argv, 0
  )
  nodes = setting["nodes"]
  workers = nodes * NODE_SIZE
  message = 4 * parameters(setting["hidden"])  # float32
  rows, commands, measured, failures = [], [], {}, []
  for label, strategy, options in layouts(workers)[: setting["layouts"]]:
    sets = overrides(strategy, options, workers, setting["hidden"], setting["gradients"])
    stem = label.replace(", ", "_").replace(" = ", "").replace(" ", "_")
    got = run(sets, nodes, setting["rate"], setting["gradients"], bench.runs_dir / stem)
    bench.run_count += 1
    free = None
    if setting["control"]:
      free = run(sets, nodes, None, setting["gradients"], bench.runs_dir / f"{stem}_unshaped")
      bench.run_count += 1
    measured[label] = got
    for kind, result in (("shaped", got), ("unshaped", free)):
      if result and result["failed_processes"]:
        failures.append(f"{label} ({kind}): process(es) {result['failed_processes']}")
    reference = measured[layouts(workers)[0][0]]
    rows.append(
      [
        label,
        f"{got['rate']:.2f}",
        harness.ratio(got["rate"], reference["rate"]) if label != layouts(workers)[0][0] else "1",
        f"{got['server_bytes'] / message:.2f}",
        f"{got['accuracy']:.3f}" if got["accuracy"] is not None else "-",
        f"{free['rate']:.1f}" if free else "-",
      ]
    )
    print(f"[{NAME}] {label}: {got['rate']:.2f} gradients/s", file=sys.stderr)
    commands.append(
      "jaxsync train configs/quickstart.yaml "
      + " ".join(f"--set {shlex.quote(o)}" for o in sets)
      + f" --coordinator 10.99.0.1:{netns.PORT} --num-processes {1 + workers} --process-id I"
    )
  bench.section(
    f"{nodes} node(s) of {NODE_SIZE} workers and a server, {message / 1e6:.2f} MB a message, cards of"
    f" {setting['rate']:g} Mbit/s each way, {setting['gradients']} gradients a run",
    "*against k_async*: gradients per second over `k_async`'s, same hosts; *server card per gradient*: the"
    " messages the server's card moved (pushes and replies, or pulled sums and broadcasts), in models, per"
    " gradient, as the server counted them; *unshaped*: the same run on links without a rate limit (this"
    " machine's cores and loopback; default size only).\n\n"
    + harness.table(
      [
        "layout",
        "gradients/s",
        "against k_async",
        "server card per gradient",
        "final accuracy",
        "unshaped gradients/s",
      ],
      rows,
    ),
  )
  shows = findings(setting, measured, workers, message)
  if failures:
    shows += (
      " After the server's complete run, these worker processes ended with an error (they were not told to"
      " stop before process 0 left; the measured run is not affected): " + "; ".join(failures) + "."
    )
  bench.section("What it shows", shows)
  bench.section(
    f"Commands (process 0 in host 0 at 10.99.0.1; worker w's process in host 1 + w // {NODE_SIZE}, each"
    f" host's card shaped to {setting['rate']:g} Mbit/s each way)",
    harness.code(commands),
  )
  bench.write()
  return 0


def findings(setting: dict, measured: dict, workers: int, message: int) -> str:
  """The gain of keeping gradients on the nodes, against what the server's card had to move, in words."""
  base, waiting, *rest = (measured[label] for label, _, _ in layouts(workers)[: setting["layouts"]])
  free = rest[0] if rest else None
  bound = 2 * setting["nodes"] / workers
  return (
    f"Every update averages K = {workers} gradients. With `k_async` every gradient and every reply crosses"
    f" the server's card ({base['server_bytes'] / message:.2f} models per gradient); with InHAD's nodes the"
    f" card moves at most one sum and one broadcast per node per update (at most {bound:.2f} models per"
    f" gradient; measured {waiting['server_bytes'] / message:.2f} waiting for each pull"
    + (f", {free['server_bytes'] / message:.2f} without" if free else "")
    + f"). The same updates and the same waiting: InHAD with `wait_for_pull` ran at"
    f" {waiting['rate'] / base['rate']:.2f}x `k_async`'s rate"
    + (f"; without waiting, at {free['rate'] / base['rate']:.2f}x." if free else ".")
  )


if __name__ == "__main__":
  raise SystemExit(main())
