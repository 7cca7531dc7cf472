"""Start-up cost: ``import jaxsync`` against ``import optax``, and ``jaxsync --help``, as whole processes.

Every round starts one fresh Python process per command, in turn, so that machine noise hits all of them
alike; a round's ratio divides a command's time by the ``import optax`` time of the same round. The table
gives the medians over ``--runs`` rounds (after one warm-up round, not counted) and, per command, the
modules it leaves loaded among the heavy dependencies. ``--baseline REF`` measures the same commands on
the package as of git revision ``REF`` (``git archive`` into a temporary folder) in the same rounds: the
before and after of a change, side by side.

Run: ``python -m benchmarks.speed.import_time [--runs 10] [--baseline HEAD]``; writes
``benchmarks/results/import_time.md`` (``--results-dir`` for elsewhere). This is a benchmark, not a test:
it prints what it measured and asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import io
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
HEAVY = "jax optax numpy scipy flax zmq rich yaml grain orbax matplotlib sklearn tensorboardX".split()
_HELP = (
  "from jaxsync.cli import main\n"
  "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
  "  main(['--help'])"
)
# What a command leaves in sys.modules: the same statement, then the top-level package names.
_PROBE = (
  "import contextlib, io, json, sys\n{statement}\n"
  "print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
)


def _console_script() -> list[str]:
  """``jaxsync`` as installed next to this interpreter, else ``python -m jaxsync.cli``."""
  script = pathlib.Path(sys.executable).with_name("jaxsync")
  return [str(script)] if script.is_file() else [sys.executable, "-m", "jaxsync.cli"]


def _commands(tree: pathlib.Path, label: str) -> list[tuple[str, list[str], str, pathlib.Path]]:
  """(row label, argv, probe statement, package root) of the commands that depend on the package."""
  return [
    (f"import jaxsync ({label})", [sys.executable, "-c", "import jaxsync"], "import jaxsync", tree),
    (f"jaxsync --help ({label})", [*_console_script(), "--help"], _HELP, tree),
  ]


def _env(tree: pathlib.Path | None) -> dict[str, str]:
  """The environment of a run: ``tree`` first on the path (ahead of an editable install's finder)."""
  env = dict(os.environ)
  if tree is not None:
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
  return env


def _time(argv: list[str], env: dict[str, str], cwd: pathlib.Path) -> float:
  start = time.perf_counter()
  subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
  return time.perf_counter() - start


def _heavy_loaded(statement: str, env: dict[str, str], cwd: pathlib.Path) -> list[str]:
  probe = _PROBE.format(statement=statement)
  out = subprocess.run(
    [sys.executable, "-c", probe], env=env, cwd=cwd, capture_output=True, text=True, check=True
  )
  loaded = set(json.loads(out.stdout.splitlines()[-1]))
  return [m for m in HEAVY if m in loaded]


def _extract(ref: str, into: pathlib.Path) -> pathlib.Path:
  """The ``jaxsync`` package as of git revision ``ref``, extracted under ``into``."""
  archive = subprocess.run(
    ["git", "-C", str(REPO), "archive", ref, "jaxsync"], capture_output=True, check=True
  )
  with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
    tar.extractall(into, filter="data")
  return into


def measure(runs: int, baseline: str | None, scratch: pathlib.Path) -> dict:
  """Times every command ``runs`` times, interleaved, after one warm-up round; returns rows and probes.

  Every process starts in an empty folder: ``python -c`` puts its working directory first on the path,
  and the package must come from its ``PYTHONPATH`` entry.
  """
  cwd = scratch / "cwd"
  cwd.mkdir()
  rows = [
    ("python -c pass", [sys.executable, "-c", "pass"], "pass", None),
    ("import optax", [sys.executable, "-c", "import optax"], "import optax", None),
    *_commands(REPO, "working tree"),
  ]
  if baseline:
    commit = subprocess.run(
      ["git", "-C", str(REPO), "rev-parse", "--short", baseline], capture_output=True, text=True, check=True
    ).stdout.strip()
    rows += _commands(_extract(baseline, scratch / "baseline"), f"{baseline}, {commit}")
  times: dict[str, list[float]] = {label: [] for label, *_ in rows}
  for round_ in range(runs + 1):
    for label, argv, _, tree in rows:
      seconds = _time(argv, _env(tree), cwd)
      if round_:  # round 0 warms the file cache
        times[label].append(seconds)
  optax_times = times["import optax"]
  table = []
  for label, _, statement, tree in rows:
    ratios = [t / o for t, o in zip(times[label], optax_times)]
    table.append(
      {
        "command": label,
        "median_s": statistics.median(times[label]),
        "min_s": min(times[label]),
        "max_s": max(times[label]),
        "x_optax": statistics.median(ratios),
        "heavy_modules": _heavy_loaded(statement, _env(tree), cwd),
      }
    )
  return {"runs": runs, "baseline": baseline, "rows": table}


def markdown(result: dict, command: str) -> str:
  """The results file: how it was run, on what, and the table."""
  jax_version = importlib.metadata.version("jax")
  lines = [
    "# Start-up cost: `import jaxsync` against `import optax`, and `jaxsync --help`",
    "",
    f"- Command: `{command}`",
    f"- Machine: {platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores, Python "
    f"{platform.python_version()}, JAX {jax_version}",
    f"- Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
    f"- {result['runs']} rounds after one warm-up round; each round starts every command once, in turn. "
    "Wall seconds of the whole process; `x import optax` is the median over rounds of the command's time "
    "over that round's `import optax` time.",
    "",
    "| command | median s | min s | max s | x import optax | heavy modules loaded |",
    "|---|---|---|---|---|---|",
  ]
  for row in result["rows"]:
    lines.append(
      f"| `{row['command']}` | {row['median_s']:.2f} | {row['min_s']:.2f} | {row['max_s']:.2f} | "
      f"{row['x_optax']:.2f} | {', '.join(row['heavy_modules']) or '-'} |"
    )
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--runs", type=int, default=10, help="counted rounds (default: 10)")
  p.add_argument("--baseline", metavar="REF", help="also measure the package as of this git revision")
  p.add_argument("--results-dir", type=pathlib.Path, default=REPO / "benchmarks" / "results")
  args = p.parse_args(argv)
  if args.runs < 1:
    p.error(f"--runs={args.runs} is invalid; expected a positive integer.")
  with tempfile.TemporaryDirectory(prefix="jaxsync-import-time-") as scratch:
    result = measure(args.runs, args.baseline, pathlib.Path(scratch))
  command = " ".join(
    ["python -m benchmarks.speed.import_time", *(argv if argv is not None else sys.argv[1:])]
  )
  text = markdown(result, command)
  args.results_dir.mkdir(parents=True, exist_ok=True)
  (args.results_dir / "import_time.md").write_text(text)
  print(text, end="")
  return 0


if __name__ == "__main__":
  sys.exit(main())
