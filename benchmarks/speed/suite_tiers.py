"""The test suite's two tiers, timed: the fast tier a developer runs after every change, and the heavy tier.

``scripts/test.sh`` runs the fast tier (every test not marked ``heavy``); ``scripts/test.sh --heavy`` the
heavy one (multi-process runs, the fault campaign, every benchmark at its tiny size, long training);
``.ci/run`` runs both. This runs each tier as the scripts do (``python -m pytest -q -n 2``, one tier after
the other, on the working tree), reads every test's time from pytest's JUnit report, and writes the wall
time of each tier and the slowest tests with their tier: the numbers the Getting-started page quotes. The
fast tier's aim is at most 7 minutes on 2 CPU cores; measure it on an otherwise idle machine.

Run: ``python -m benchmarks.speed.suite_tiers [--slowest 20] [--tier fast|heavy|both]``; writes
``benchmarks/results/suite_tiers.md`` (``--results-dir`` for elsewhere). A benchmark, not a test: it
prints what it measured and asserts nothing (a failing test is counted and named, not hidden).
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

REPO = pathlib.Path(__file__).resolve().parents[2]
TIERS = {"fast": ["-m", "not heavy"], "heavy": ["-m", "heavy"]}
AIM_SECONDS = 7 * 60  # the fast tier's aim on 2 CPU cores
# Why a slow test is where it is, by its file: what the heavy tier holds (the fast tier keeps the rest).
WHY = {
  "tests/test_benchmarks.py": "a benchmark at its tiny size (every run through `jaxsync train`'s path)",
  "tests/distributed/test_multiprocess.py": "real processes: `jaxsync launch`, kills, restarts, resumes",
  "tests/distributed/test_multihost_netns.py": "processes on network-namespace hosts with shaped cards",
  "tests/distributed/test_fault_campaign.py": "the fault campaign's checks on real processes",
  "tests/distributed/test_param_server.py": "a parameter server and workers in processes of their own",
  "tests/distributed/test_quantized_all_reduce.py": "a four-device all-reduce of the quantized exchange",
  "tests/app/test_calibrate.py": "a calibration measured and checked against a real run",
  "tests/app/test_cli.py": "the command line end to end, in processes (kill, resume, compare, advise)",
  "tests/rules/test_barzilai_borwein.py": "training the quickstart's CNN with per-worker BB step sizes",
  "tests/test_quickstart_example.py": "the quickstart example trained to its accuracy",
  "tests/sim/test_x64.py": "every engine under jax_enable_x64, in a process of its own",
}


def run_tier(name: str, report: pathlib.Path) -> tuple[float, int]:
  """Runs one tier as scripts/test.sh does; its wall seconds and pytest's exit code."""
  command = [sys.executable, "-m", "pytest", "-q", "-n", "2", *TIERS[name], f"--junitxml={report}"]
  print(f"[suite_tiers] {' '.join(command[1:])}", file=sys.stderr, flush=True)
  started = time.perf_counter()
  code = subprocess.run(command, cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}).returncode
  return time.perf_counter() - started, code


def case_times(report: pathlib.Path) -> list[tuple[str, float, str]]:
  """(test id, seconds with setup and teardown, outcome) of every test in a JUnit report."""
  out = []
  for case in ET.parse(report).getroot().iter("testcase"):
    path = case.get("classname", "").replace(".", "/")
    test_id = f"{path}.py::{case.get('name')}" if path else case.get("name", "")
    outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else "passed"
    if case.find("skipped") is not None:
      outcome = "skipped"
    out.append((test_id, float(case.get("time", 0.0)), outcome))
  return out


def _file_of(test_id: str) -> str:
  return test_id.split("::")[0]


def report_text(tiers: dict[str, tuple[float, int, list]], slowest: int, argv: list[str]) -> str:
  """The results file: each tier's wall time and counts, then the slowest tests and where they run."""
  cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  lines = [
    "# The test suite's tiers",
    "",
    f"- Command: `{' '.join(['python -m benchmarks.speed.suite_tiers', *argv])}`",
    f"- Machine: {platform.system()} {platform.machine()}, {cpus} CPU cores, Python {platform.python_version()}",
    f"- Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
    "",
    "| tier | command | tests | failed | wall |",
    "|---|---|---|---|---|",
  ]
  commands = {"fast": "`bash scripts/test.sh`", "heavy": "`bash scripts/test.sh --heavy`"}
  for name, (wall, _, cases) in tiers.items():
    failed = sum(outcome == "failed" for _, _, outcome in cases)
    lines.append(
      f"| {name} | {commands[name]} | {len(cases)} | {failed} | {wall / 60:.1f} min ({wall:.0f} s) |"
    )
  if "fast" in tiers:
    wall = tiers["fast"][0]
    met = "met" if wall <= AIM_SECONDS else "missed"
    lines += ["", f"The fast tier took {wall:.0f} s against an aim of {AIM_SECONDS} s ({met})."]
  if len(tiers) == 2:
    total = sum(wall for wall, _, _ in tiers.values())
    lines.append(f"Both tiers, one after the other (what `.ci/run` runs): {total / 60:.1f} min.")
  every = sorted(
    ((test_id, seconds, name) for name, (_, _, cases) in tiers.items() for test_id, seconds, _ in cases),
    key=lambda row: -row[1],
  )[:slowest]
  lines += [
    "",
    f"## The {len(every)} slowest tests",
    "",
    "Seconds of each test with its setup and teardown, two at a time (`-n 2`). A heavy test runs in the heavy",
    "tier only (`scripts/test.sh --heavy` or `--all`, and in `.ci/run`); the fast tier keeps the others.",
    "",
    "| test | seconds | tier | what it runs |",
    "|---|---|---|---|",
  ]
  for test_id, seconds, name in every:
    why = WHY.get(_file_of(test_id), "simulated training on a small problem")
    lines.append(f"| `{test_id}` | {seconds:.1f} | {name} | {why} |")
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--slowest", type=int, default=20, help="how many of the slowest tests to list")
  parser.add_argument("--tier", choices=("fast", "heavy", "both"), default="both")
  parser.add_argument("--results-dir", type=pathlib.Path, default=REPO / "benchmarks" / "results")
  args = parser.parse_args(argv)
  if args.slowest < 1:
    raise SystemExit(f"suite_tiers: --slowest={args.slowest}; give a count >= 1")
  names = ["fast", "heavy"] if args.tier == "both" else [args.tier]
  tiers = {}
  with tempfile.TemporaryDirectory() as tmp:
    for name in names:
      report = pathlib.Path(tmp) / f"{name}.xml"
      wall, code = run_tier(name, report)
      cases = case_times(report) if report.exists() else []
      tiers[name] = (wall, code, cases)
      print(f"[suite_tiers] {name}: {len(cases)} tests in {wall:.0f} s (exit code {code})", file=sys.stderr)
  args.results_dir.mkdir(parents=True, exist_ok=True)
  out = args.results_dir / "suite_tiers.md"
  out.write_text(report_text(tiers, args.slowest, argv))
  print(f"[suite_tiers] wrote {out}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
