"""Performance: the speed benchmarks in one results file, ``benchmarks/results/performance.md``.

Runs, one after another in fresh processes (so none inherits another's
compilation caches or memory), the library's speed benchmarks and collects
their printed tables, each of which already compares side by side in one run
(ratios, because these machines are noisy):

- ``transform_overhead.py``: each rule's jitted update against ``optax.sgd``
  with momentum on the same parameters, and against the memory-bandwidth floor;
- ``simulator_throughput.py``: the asynchronous engine's worker-steps per
  second (gradients one at a time and in batches) against the synchronous
  engine at the same K and a plain jitted SGD loop on the same model, and
  what one gradient costs computed each way;
- ``conv_in_loop.py``: ``lax.conv`` against ``ShiftConv`` inside a compiled loop.

- ``ps_throughput.py``: the parameter server's push+pull against a raw loopback
  socket, its updates/s with 1, 2 and 4 worker processes, and the real
  staleness distribution against the simulator's prediction.

Sizes:
  tiny     small arrays, one round each: the suite's smoke test (under a minute).
  default  each script's own defaults (about 10 min on 2 cores).
  full     the same as default with more rounds.

    python -m benchmarks.speed.performance [--size tiny|default|full]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from benchmarks.common import harness

# script: (what it compares, {size: arguments})
SCRIPTS = {
  "transform_overhead": (
    "each rule's jitted update vs optax.sgd(momentum=0.9) on the same tree (target: OrMo <= 1.15x,"
    " adaptive-k <= 2x)",
    {
      "tiny": ["--params", "20000", "--rounds", "3"],
      "default": [],
      "full": ["--rounds", "61"],
    },
  ),
  "simulator_throughput": (
    "the asynchronous engine's worker-steps/s (gradients one at a time and in batches) vs the synchronous"
    " engine at the same K and a plain jitted SGD loop (target: >= 0.9x bsp at K >= 16, 0.8x at K = 4)",
    {
      "tiny": [
        "--steps",
        "64",
        "--rounds",
        "1",
        "--workers",
        "4",
        "--strategies",
        "asp,bsp",
        "--gradient-batches",
        "4",
      ],
      "default": [],
      "full": ["--rounds", "9"],
    },
  ),
  "conv_in_loop": (
    "lax.conv vs ShiftConv, as a plain call and inside a fori_loop",
    {"tiny": ["--rounds", "1", "--steps", "5"], "default": [], "full": ["--rounds", "15"]},
  ),
  "ps_throughput": (
    "parameter-server push+pull vs a raw loopback socket, same bytes (target >= 0.8x); updates/s with "
    "1/2/4 worker processes; real vs simulated asp staleness",
    {
      "tiny": [
        "--sizes-mb",
        "1",
        "--rounds",
        "3",
        "--blocks",
        "1",
        "--workers",
        "2",
        "--events",
        "40",
        "--model",
        "mlp",
        "--out",
        "",
      ],
      "default": ["--out", ""],
      "full": ["--rounds", "60", "--blocks", "3", "--events", "2000", "--out", ""],
    },
  ),
}
_VERDICT = re.compile(r"^target .*$", re.M)


def main(argv: list[str]) -> int:
  args = harness.parser(__doc__).parse_args(argv)
  bench = harness.Benchmark(
    "performance", "Performance: overheads and throughput, side by side", args, argv, seeds=0
  )
  summary = []
  for script, (what, sizes) in SCRIPTS.items():
    command = [sys.executable, "-m", harness.catalog.module(script), *sizes[args.size]]
    started = time.perf_counter()
    proc = subprocess.run(
      command,
      capture_output=True,
      text=True,
      cwd=harness.REPO,
      env={**os.environ, "PYTHONUNBUFFERED": "1"},
      timeout=3600,
    )
    seconds = time.perf_counter() - started
    bench.run_count += 1
    shown = " ".join([harness.catalog.command(script), *sizes[args.size]])
    if proc.returncode != 0:
      raise SystemExit(
        f"performance: {shown} failed with exit code {proc.returncode}:\n{proc.stderr[-3000:]}"
      )
    verdicts = _VERDICT.findall(proc.stdout)
    if script == "simulator_throughput":  # it gives a verdict per strategy and K (at its best B) instead
      met, missed = (
        len(re.findall(r"^best B: .*: met\)$", proc.stdout, re.M)),
        len(re.findall(r"^best B: .*: missed\)$", proc.stdout, re.M)),
      )
      verdicts.append(
        f"target met in {met} of {met + missed} asynchronous strategy x K cells (at the best B)"
      )
    # The scripts' "# ..." context lines (versions, bandwidth) would read as markdown headings.
    output = re.sub(r"^# ", "- ", proc.stdout.strip(), flags=re.M)
    summary.append([f"`{script}`", what, "<br>".join(verdicts) or "(no target line)", f"{seconds:.0f} s"])
    bench.section(
      f"`{script}`",
      f"{what}.\n\nCommand: `{shown}` ({seconds:.0f} s). Its output (context lines as a list):\n\n{output}",
    )
    print(f"[performance {bench.elapsed()}] {shown}: {seconds:.0f} s", file=sys.stderr, flush=True)
  bench.sections.insert(
    0,
    "## Summary\n\n"
    + harness.table(["benchmark", "compares", "targets (each script's own verdict)", "wall"], summary)
    + "\n",
  )
  bench.write()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
