"""How long the planner takes: 40 bandwidths x 6 strategies x 3 model sizes, for 2 to 10,000 workers.

Each sweep plans data-parallel, hierarchical all-reduce, DiLoCo H=100 and
Streaming DiLoCo (16 fragments; with overlap; with overlap and int4) for 1B,
10B and 100B models (24, 48, 108 layers) over 40 bandwidths from 0.1 to 1,000
Gbit/s, with deterministic compute, then once more with jitter (Gamma shape
100). It prints and writes the seconds per sweep and the number of rounds the
clock stepped through: a pattern that repeats every ``P`` rounds is simulated
for ``4 P`` rounds however long the run is, at ``O(L)`` per round per
bandwidth, so with deterministic compute the cost does not grow with ``M``;
with jitter each round draws ``M H`` compute times.

Usage: python -m benchmarks.speed.plan_sweep [--out benchmarks/results] [--workers 2,10,100,1000,10000]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import time

import numpy as np

from jaxsync.planning import ModelSize, Topology, gbits, plan
from jaxsync.sim import Link

MODELS = {"1B": (1e9, 24, 0.1), "10B": (10e9, 48, 0.8), "100B": (100e9, 108, 4.9)}
STRATEGIES = [
  ("data-parallel", "allreduce", {}),
  ("hierarchical all-reduce", "hierarchical_allreduce", {"group_size": 2}),
  ("DiLoCo H=100", "diloco", {"period": 100, "quantize": None}),
  ("Streaming DiLoCo", "streaming_diloco", {"period": 96, "fragments": 16, "overlap": 0, "quantize": None}),
  ("+ overlap", "streaming_diloco", {"period": 96, "fragments": 16, "overlap": 1, "quantize": None}),
  ("+ overlap, int4", "streaming_diloco", {"period": 96, "fragments": 16, "overlap": 1, "quantize": "int4"}),
]
BANDWIDTHS = tuple(float(b) for b in np.logspace(-1, np.log10(1000), 40))


def sweep(workers: int, jitter_shape: float | None) -> float:
  """Seconds to plan every strategy and model over the 40 bandwidths."""
  start = time.perf_counter()
  for parameters, layers, step_time in MODELS.values():
    plan(
      ModelSize(parameters=parameters, layers=layers, step_time=step_time),
      Topology(workers=workers, outer=Link(0.0, gbits(10.0))),
      STRATEGIES,
      bandwidths=BANDWIDTHS,
      jitter_shape=jitter_shape,
    )
  return time.perf_counter() - start


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/results"))
  parser.add_argument("--workers", default="2,10,100,1000,10000", help="the worker counts, comma-separated")
  parser.add_argument(
    "--jitter-workers", default="2,100,1000,10000", help="worker counts for the sweep with jitter"
  )
  parser.add_argument("--tiny", action="store_true", help="2 and 10 workers only (the tests' size)")
  args = parser.parse_args(argv)
  workers = [2, 10] if args.tiny else [int(w) for w in args.workers.split(",")]
  jittered = [2] if args.tiny else [int(w) for w in args.jitter_workers.split(",")]
  sweep(2, None)  # compiles the compute draws once; every sweep below is timed warm
  rows = [(m, "none", sweep(m, None)) for m in workers]
  rows += [(m, "Gamma shape 100", sweep(m, 100.0)) for m in jittered]
  cases = len(BANDWIDTHS) * len(STRATEGIES) * len(MODELS)
  lines = [
    "# The planner's speed",
    "",
    f"Written by `python -m benchmarks.speed.plan_sweep{' --tiny' if args.tiny else ''}` on "
    f"{platform.machine()}, {os.cpu_count()} cores. One sweep: {len(BANDWIDTHS)} bandwidths x "
    f"{len(STRATEGIES)} strategies x {len(MODELS)} model sizes = {cases} plans.",
    "",
    "| workers M | jitter | seconds per sweep |",
    "|---:|---|---:|",
    *[f"| {m:,} | {jitter} | {seconds:.2f} |" for m, jitter, seconds in rows],
    "",
    "With deterministic compute a round's pattern repeats every P rounds (P fragments); the clock steps "
    "4 P rounds (2 P to fill the link's queue, 2 P measured) at O(L) per round, vectorized over the "
    "bandwidths, whatever M and the run's length. With jitter it draws the M workers' H step times of each "
    "of max(4 P, 2 P + 32) rounds: the cost grows with M H.",
  ]
  text = "\n".join(lines) + "\n"
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / ("plan_sweep_tiny.md" if args.tiny else "plan_sweep.md")).write_text(text)
  print(text)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
