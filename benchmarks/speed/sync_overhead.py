"""What a synchronous round of the real runtime costs over its network: jaxsync's round against a bare psum.

Three processes, each a host of its own (a network namespace whose card ``tc`` shapes to the link's rate in
each direction, ``benchmarks/common/netns.py``), form one ``jax.distributed`` group over gloo. In the same
processes, blocks alternate between:

- **jaxsync's round**: :class:`SyncRuntime` ``advance`` over a chunk of rounds (no evaluations): the
  gradient, the exchange, the server rule, the clock and the round's record, as a training run runs it;
- **the bare round**: the same jitted gradient step (or the same ``H`` local steps of the same worker rule)
  followed by one bare ``psum`` of the same bytes as one buffer (for a quantized exchange: as many bytes as
  its packed slices and scales), blocking on its result each round.

Per case and link it reports the median over blocks of each side's milliseconds per round, their ratio
and the milliseconds jaxsync adds. ``--before REV`` runs the same workers a second time on the code of
git revision ``REV`` (a temporary worktree), in the same hosts and the same run: the ratio before and after
a change, side by side. The model is ``configs/sim_vs_real.yaml``'s digits CNN (151,306 parameters, a
605 KB message), 3 workers of equal speed.

Store: ``benchmarks/results/sync_overhead_runs.jsonl`` (one line per code, link and case; a rerun replaces
the lines it measures); ``--report-only`` rewrites ``sync_overhead.md`` from it.

    python -m benchmarks.speed.sync_overhead [--rates 100,1000] [--cases allreduce,local_sgd,diloco,diloco_int8]
                                         [--rounds 40] [--blocks 5] [--before REV] [--report-only]

Needs root (``ip netns``, ``tc``). Default: 2 links x 4 cases, about 6 minutes on 2 cores per code measured.
The worker side (``--worker``) runs as a plain script so that ``--before`` can run it on older code.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "sim_vs_real.yaml"
STORE = REPO / "benchmarks" / "results" / "sync_overhead_runs.jsonl"
RESULT = REPO / "benchmarks" / "results" / "sync_overhead.md"
PROCESSES = 3
TARGET = 1.10  # jaxsync's round over the bare psum's, at most
CASES: dict[str, list[str]] = {
  "allreduce": ["strategy.name=allreduce", "strategy.options={learning_rate: 0.05, momentum: 0.9}"],
  "local_sgd": ["strategy.name=local_sgd", "strategy.options={learning_rate: 0.05, period: 4}"],
  "diloco": ["strategy.name=diloco", "strategy.options={period: 4}"],
  "diloco_int8": ["strategy.name=diloco", "strategy.options={period: 4, quantize: int8}"],
}
MLP = ["model.name=mlp", "model.hidden=[1024, 1024]"]  # 1,127,434 parameters: a 4.5 MB gradient
CASES.update(
  {
    "allreduce_mlp": [*CASES["allreduce"], *MLP],
    # The bucket size, a measured choice: these run on the current code only (the bucket is its option).
    "allreduce_64k": CASES["allreduce"],
    "allreduce_256k": CASES["allreduce"],
    "allreduce_mlp_256k": [*CASES["allreduce"], *MLP],
    "allreduce_mlp_1m": [*CASES["allreduce"], *MLP],
  }
)
BUCKETS = {
  "allreduce_64k": 64 << 10,
  "allreduce_256k": 256 << 10,
  "allreduce_mlp_256k": 256 << 10,
  "allreduce_mlp_1m": 1 << 20,
}
DEFAULT_CASES = ["allreduce", "local_sgd", "diloco", "diloco_int8"]
COMMON = [
  f"cluster.num_workers={PROCESSES}",
  "cluster.slow_fraction=0.0",
  "cluster.emulate_slow_workers=false",
  "run.eval_every=1000000",  # never within the measured rounds
  "run.eval_every_time=null",
  "run.target_accuracy=null",
]
TIMEOUT = 1200  # seconds the workers of one code and link may take


# -- the worker side: one process of the group ------------------------------------------------------


def _bare_round(runtime, exp, payload_words: int):
  """The jitted bare round: the same gradient step (or local steps) and one ``psum`` of ``payload_words``
  float32 words as one buffer; ``(params, step) -> the summed buffer``."""
  import jax
  import jax.numpy as jnp
  import optax
  from jax.sharding import PartitionSpec as P

  strategy, loss_fn, mesh = exp.strategy, exp.loss_fn, runtime.mesh
  axes, num_workers = tuple(mesh.axis_names), strategy.num_workers
  local = strategy.protocol.value == "local"
  local_steps = strategy.local_steps if local else 1

  def per_worker(params, step, data):
    worker = jax.lax.axis_index(axes[0]) * mesh.shape[axes[1]] + jax.lax.axis_index(axes[1])
    if not local:
      loss, grads = jax.value_and_grad(lambda p: loss_fn(p, data.batch(worker, step)) / num_workers)(params)
      sent = [x.ravel() for x in jax.tree.leaves(grads)] + [loss[None]]
    else:
      rule = strategy.worker_rule

      def inner(i, carry):
        p, s = carry
        grads = jax.grad(loss_fn)(p, data.batch(worker, step + i))
        updates, s = rule.update(grads, s, p)
        return optax.apply_updates(p, updates), s

      end, _ = jax.lax.fori_loop(0, local_steps, inner, (params, rule.init(params)))
      sent = [(a - b).ravel() for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(end))]
    flat = jnp.concatenate([x.astype(jnp.float32) for x in sent])
    flat = jnp.pad(flat, (0, max(0, payload_words - flat.size)))[:payload_words]
    return jax.lax.psum(flat, axes)

  return jax.jit(
    jax.shard_map(per_worker, mesh=mesh, in_specs=(P(), P(), P()), out_specs=P(), check_vma=False)
  )


def _payload_words(runtime, exp, params) -> int:
  """float32 words of the bytes one round's exchange carries per worker before the ring: the gradient and
  the loss, the pseudo-gradient, or a quantized exchange's packed slices and scales."""
  import jax

  size = sum(x.size for x in jax.tree.leaves(params))
  exchange = exp.strategy.exchange
  if exp.strategy.protocol.value != "local":
    return size + 1
  if exchange is None or exchange.quantize is None:
    return size
  from jaxsync._src.distributed import quantized_all_reduce

  # Each worker's packed vector is K slices (values and scales); the exchange sends 2 (K - 1) of them, as a
  # ring all-reduce of the whole vector would.
  num_workers = exp.strategy.num_workers
  sizes = [x.size for x in jax.tree.leaves(params)]
  per_slice = quantized_all_reduce.slice_bytes(sizes, exchange.quantize, exchange.quantize_block, num_workers)
  return -(-num_workers * per_slice // 4)


def _measure_case(case: str, rounds: int, blocks: int) -> dict:
  import jax
  import numpy as np

  from jaxsync._src.app import config as config_lib
  from jaxsync._src.app import experiment
  from jaxsync._src.distributed import sync_runtime

  exp = experiment.build(config_lib.load(CONFIG, [*CASES[case], *COMMON]))
  buckets = {"bucket_bytes": BUCKETS[case]} if case in BUCKETS else {}
  runtime = sync_runtime.SyncRuntime(exp.strategy, exp.loss_fn, exp.data, **buckets)
  state = runtime.init(exp.model.params)
  words = _payload_words(runtime, exp, exp.model.params)
  bare = _bare_round(runtime, exp, words)
  params = runtime._on_mesh(exp.model.params)
  data = runtime._on_mesh(exp.data)
  local_steps = exp.strategy.local_steps if exp.strategy.protocol.value == "local" else 1

  def bare_block(first: int) -> float:
    began = time.perf_counter()
    for i in range(rounds):
      step = jax.make_array_from_process_local_data(
        runtime._replicated, np.int32((first + i) * local_steps), ()
      )
      jax.block_until_ready(bare(params, step, data))
    return (time.perf_counter() - began) / rounds

  def jaxsync_block(state):
    began = time.perf_counter()
    state, _ = runtime.advance(state, rounds)
    return (time.perf_counter() - began) / rounds, state

  # Compile both and warm the sockets before anything is timed.
  bare_block(0)
  _, state = jaxsync_block(state)
  ours, theirs = [], []
  for b in range(blocks):
    theirs.append(bare_block((b + 1) * rounds))
    took, state = jaxsync_block(state)
    ours.append(took)
  return {
    "case": case,
    "strategy": exp.strategy.name,
    "bytes": 4 * words,
    "rounds": rounds,
    "blocks": blocks,
    "jaxsync_ms": [1e3 * t for t in ours],
    "bare_ms": [1e3 * t for t in theirs],
  }


def worker(argv: list[str]) -> None:
  """One process of the group: joins it, measures every case, process 0 writes ``--out``."""
  parser = argparse.ArgumentParser()
  parser.add_argument("--coordinator", required=True)
  parser.add_argument("--process-id", type=int, required=True)
  parser.add_argument("--cases", required=True)
  parser.add_argument("--rounds", type=int, required=True)
  parser.add_argument("--blocks", type=int, required=True)
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  from jaxsync._src.distributed import cluster

  group = cluster.initialize(
    coordinator=args.coordinator, num_processes=PROCESSES, process_id=args.process_id, log=lambda _: None
  )
  rows = [_measure_case(case, args.rounds, args.blocks) for case in args.cases.split(",")]
  if group.index == 0:
    pathlib.Path(args.out).write_text(json.dumps(rows))
  # Every process finishes together; process 0, the coordinator's host, leaves last.
  cluster.coordination_client().wait_at_barrier("sync_overhead/finished", 600_000)
  if group.index == 0:
    time.sleep(1.0)
  else:
    import jax

    jax.distributed.shutdown()


# -- the orchestrator ---------------------------------------------------------------------------------


def _git(*args: str, cwd: pathlib.Path = REPO) -> str:
  return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _run_code(hosts, code_root: pathlib.Path, cases: list[str], rounds: int, blocks: int, logs: pathlib.Path):
  """Runs the workers of ``code_root``'s jaxsync in the hosts; returns process 0's rows."""
  from benchmarks.common import netns

  out = logs / "rows.json"
  env = netns.run_env()
  env["PYTHONPATH"] = str(code_root)
  argv = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker"]
  argv += ["--coordinator", f"{hosts.addresses[0]}:{netns.PORT}", "--cases", ",".join(cases)]
  argv += ["--rounds", str(rounds), "--blocks", str(blocks), "--out", str(out)]
  logs.mkdir(parents=True, exist_ok=True)
  processes = []
  try:
    for i in range(PROCESSES):
      with open(logs / f"p{i}.log", "w") as log:
        processes.append(
          subprocess.Popen(
            hosts.exec(i, *argv, "--process-id", str(i)),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=code_root,
            start_new_session=True,
          )
        )
    deadline = time.monotonic() + TIMEOUT
    for p in processes:
      p.wait(timeout=max(1.0, deadline - time.monotonic()))
  except subprocess.TimeoutExpired:
    raise SystemExit(
      f"sync_overhead: the workers did not finish in {TIMEOUT} s:\n{netns.tails(logs, PROCESSES)}"
    ) from None
  finally:
    for p in processes:
      if p.poll() is None:
        os.killpg(p.pid, 9)
        p.wait()
  if any(p.returncode for p in processes) or not out.exists():
    raise SystemExit(f"sync_overhead: a worker failed:\n{netns.tails(logs, PROCESSES)}")
  return json.loads(out.read_text())


def _load_store() -> list[dict]:
  if not STORE.exists():
    return []
  return [json.loads(line) for line in STORE.read_text().splitlines() if line.strip()]


def _save_store(rows: list[dict]) -> None:
  STORE.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def _summary(row: dict) -> tuple[float, float, float]:
  """(jaxsync's median ms per round, the bare round's, their ratio)."""
  ours, theirs = statistics.median(row["jaxsync_ms"]), statistics.median(row["bare_ms"])
  return ours, theirs, ours / theirs


def _link(rate: float) -> str:
  return f"{rate / 1000:g} Gbit/s" if rate >= 1000 else f"{rate:g} Mbit/s"


def _exchange(row: dict) -> str:
  """How the row's code sent a round's exchange."""
  quantized = row["case"].endswith("_int8")
  if row["role"] == "before":
    if quantized:
      return "values and scales apart (4 collectives), the loss, a clock broadcast"
    return "one all-reduce per leaf and for the loss, a clock broadcast"
  if quantized:
    return "one all-to-all and one all-gather of packed bytes, one all-reduce of the loss and clock"
  bucket = BUCKETS.get(row["case"])
  return f"buckets of {bucket >> 10:,} KB" if bucket else "one buffer per dtype (buckets up to 64 MiB)"


def report(rows: list[dict]) -> str:
  """The results file's text from the store's rows."""
  from benchmarks.common import harness

  current = [r for r in rows if r["role"] == "current"]
  lines = [
    "# A synchronous round of the real runtime against a bare psum of the same bytes",
    "",
    "- Command: `python -m benchmarks.speed.sync_overhead` (`--report-only` rewrites this file from "
    "`sync_overhead_runs.jsonl`)",
    f"- Machine: {harness.machine()}",
    f"- {PROCESSES} processes, each in a network namespace of its own with a card shaped by `tc` to the link's "
    "rate each way; the digits CNN of `configs/sim_vs_real.yaml` (151,306 parameters), 3 workers of equal "
    "speed, no evaluations.",
    "- Each block: jaxsync's `SyncRuntime.advance` over a chunk of rounds, then the same gradient step (or "
    "local steps of the same worker rule) followed by one bare `psum` of the same bytes as one buffer, each "
    "round waited for. Milliseconds per round: the median over blocks (each block's in brackets).",
    "",
  ]
  allreduce = {r["rate"]: _summary(r)[2] for r in current if r["case"] == "allreduce"}
  if 100.0 in allreduce and 1000.0 in allreduce:
    lines += [
      f"Round time over a bare psum: {allreduce[100.0]:.2f}x at 100 Mbit/s, {allreduce[1000.0]:.2f}x at 1 Gbit/s "
      f"(target: at most {TARGET:.2f}x).",
      "",
    ]
  for rate in sorted({r["rate"] for r in rows}):
    lines += [f"## Cards of {_link(rate)}", ""]
    header = [
      "case",
      "code",
      "jaxsync's exchange",
      "bytes per worker",
      "jaxsync ms/round",
      "bare psum ms/round",
      "ratio",
      "ms added (each block's ms, jaxsync/bare)",
    ]
    body = []
    for r in sorted(
      (r for r in rows if r["rate"] == rate),
      key=lambda r: (list(CASES).index(r["case"]), r["role"] != "before"),
    ):
      ours, theirs, ratio = _summary(r)
      blocks = ", ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(r["jaxsync_ms"], r["bare_ms"]))
      body.append(
        [
          r["case"],
          f"{r['role']} (`{r['revision']}`)",
          _exchange(r),
          f"{r['bytes']:,}",
          f"{ours:.1f}",
          f"{theirs:.1f}",
          f"{ratio:.2f}x",
          f"{ours - theirs:+.1f} ({blocks})",
        ]
      )
    lines += [harness.table(header, body), ""]
  lines += [
    "The ring formula's share of a round, 2 (K - 1) / K x bytes / rate, is 6.5 ms at 1 Gbit/s and 64.6 ms at "
    "100 Mbit/s for the gradient's 605 KB; gloo's ring adds its per-step latency to it.",
    "",
  ]
  return "\n".join(lines)


def main(argv: list[str]) -> int:
  if argv[:1] == ["--worker"]:
    worker(argv[1:])
    return 0
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rates", default="100,1000", help="Mbit/s of each host's card, comma-separated")
  parser.add_argument(
    "--cases", default=",".join(DEFAULT_CASES), help=f"comma-separated, of: {', '.join(CASES)}"
  )
  parser.add_argument("--rounds", type=int, default=40, help="rounds per block")
  parser.add_argument("--blocks", type=int, default=5, help="blocks of each side, alternating")
  parser.add_argument("--before", default=None, help="a git revision to measure side by side with this code")
  parser.add_argument("--report-only", action="store_true")
  args = parser.parse_args(argv)
  cases = args.cases.split(",")
  unknown = [c for c in cases if c not in CASES]
  if unknown:
    raise SystemExit(f"sync_overhead: --cases has {unknown}; expected some of: {', '.join(CASES)}")
  rates = [float(r) for r in args.rates.split(",")]
  if any(r <= 0 for r in rates) or args.rounds < 1 or args.blocks < 1:
    raise SystemExit(
      f"sync_overhead: --rates={args.rates} --rounds={args.rounds} --blocks={args.blocks}: give positive numbers"
    )
  rows = _load_store()
  if not args.report_only:
    from benchmarks.common import harness, netns

    codes = [("current", REPO, harness.code_version())]
    with tempfile.TemporaryDirectory(prefix="sync_overhead_") as tmp:
      if args.before:
        before = pathlib.Path(tmp) / "before"
        _git("worktree", "add", "--detach", str(before), args.before)
        codes.insert(0, ("before", before, _git("rev-parse", "--short", args.before)))
      try:
        for rate in rates:
          hosts = netns.Hosts(PROCESSES, rate_mbit=rate)
          try:
            hosts.create()
            for role, root, revision in codes:
              ran = [c for c in cases if role == "current" or c not in BUCKETS]
              if not ran:
                continue
              measured = _run_code(
                hosts, root, ran, args.rounds, args.blocks, pathlib.Path(tmp) / f"{role}-{rate:g}"
              )
              rows = [r for r in rows if not (r["role"] == role and r["rate"] == rate and r["case"] in ran)]
              rows += [dict(m, role=role, rate=rate, revision=revision) for m in measured]
              _save_store(rows)
              for m in measured:
                ours, theirs, ratio = _summary(m)
                print(
                  f"{_link(rate)} {role} {m['case']}: {ours:.1f} ms vs {theirs:.1f} ms bare ({ratio:.2f}x)",
                  flush=True,
                )
          finally:
            left = hosts.destroy()
            if left:
              raise SystemExit(f"sync_overhead: namespaces left behind: {left}")
      finally:
        if args.before:
          _git("worktree", "remove", "--force", str(before))
  RESULT.write_text(report(rows))
  print(f"wrote {RESULT}")
  return 0


if __name__ == "__main__":
  if "--worker" not in sys.argv[1:2]:
    sys.path.insert(0, str(REPO))
  sys.exit(main(sys.argv[1:]))
