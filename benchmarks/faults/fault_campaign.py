"""A fault campaign against every runtime: fuzzed frames, killed, stopped and preempted processes.

Eleven parts, each counted, none of them trusted to the process under test:

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

10. **Churn** (``churn``): the same worker faults on DiLoCo with elastic
    membership and on asynchronous local SGD (H = 10), whose server goes on
    without a worker that is gone and takes back a restarted one; checked as
    the supervised runs are, with DiLoCo's rounds (or the pushes) as events.
11. **SLURM** (``slurm``): ``examples/slurm``'s all-reduce, asp and DiLoCo
    jobs on a three-node SLURM cluster of this machine, sent preemption
    notices the two ways SLURM gives them (``scancel --signal=TERM`` to the
    batch shell or to the tasks); each must requeue itself once per notice,
    lose no event and end COMPLETED, the all-reduce job with the final
    parameters of the same job uninterrupted (``benchmarks/faults/slurm_jobs.py``).

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
        [--parts fuzz,workers,rejoin,server,supervised,sharded,inhad,sync,preempt,churn,slurm]
        [--frames N] [--runs N] [--server-kills N] [--report-only] [--fresh] [--store PATH]

It exits 1 when a check failed (the results file lists which), or when
``--report-only`` finds planned runs missing from the store.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

from benchmarks.common import harness
from benchmarks.faults.fuzzing import FuzzResult
from benchmarks.faults.plan import plan_campaign
from benchmarks.faults.report import write_results
from benchmarks.faults.run_store import STORE_NAME, RunStore, decode, encode
from benchmarks.faults.settings import NAME, PARTS, SIZES
from benchmarks.faults.supervised import SupervisedRun


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
      if planned.part in (
        "preempt",
        "slurm",
      ):  # its index is its label (older preempt rows lacked the twin's)
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
