"""The README's figures, from the README's own commands: ``jaxsync train`` of the quickstart and of Fashion-MNIST.

Each command runs as a user runs it (a fresh ``jaxsync`` process, its default progress bar off), timed
from the process's start to its end; the run's ``summary.json`` gives the accuracy, the time to the
target and the staleness. The machine's load before each run is recorded beside its time: the README
quotes the times of an idle machine, and a loaded one is slower.

Run: ``python -m benchmarks.pages.readme_figures [--only quickstart]``; writes
``benchmarks/results/readme_figures.json`` (``--results-dir`` for elsewhere), keeping the entries of the
commands it did not run. ``tests/test_readme_figures.py`` checks that the README and the configs quote
this file. This is a benchmark, not a test: it prints what it measured and asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import textwrap
import time

from benchmarks.common import harness

REPO = pathlib.Path(__file__).resolve().parents[2]
# name -> the command line's arguments after ``jaxsync train``.
COMMANDS = {
  "quickstart": ["configs/quickstart.yaml"],
  "fashion_mnist": ["configs/fashion_mnist.yaml"],
  # The same CNN trained alone: one worker, 8 epochs of 60,000 images at batch 32.
  "fashion_mnist_one_worker": [
    "configs/fashion_mnist.yaml", "--set", "cluster.num_workers=1", "--set", "run.gradients=15000",
  ],
}  # fmt: skip
README = REPO / "README.md"
# The README's paragraphs written from the results file, between `<!-- figures: NAME -->` and
# `<!-- /figures: NAME -->`.
MARKED = re.compile(r"(<!-- figures: (\w+) -->\n)(.*?)(<!-- /figures: \2 -->)", re.S)


def _console_script() -> list[str]:
  """``jaxsync`` as installed next to this interpreter, else ``python -m jaxsync.cli``."""
  script = pathlib.Path(sys.executable).with_name("jaxsync")
  return [str(script)] if script.is_file() else [sys.executable, "-m", "jaxsync.cli"]


def _settle(idle: float = 0.5, longest: float = 240.0) -> float:
  """Waits (up to ``longest`` s) for the 1-minute load average to fall below ``idle``; returns it.

  The previous command's own load lingers in the average for a minute or two: without the wait,
  each run would be recorded as taken on a loaded machine.
  """
  deadline = time.monotonic() + longest
  while os.getloadavg()[0] >= idle and time.monotonic() < deadline:
    time.sleep(5)
  return os.getloadavg()[0]


def measure(name: str, arguments: list[str]) -> dict:
  """Runs ``jaxsync train ARGUMENTS`` in a fresh process; its wall time and its summary's figures."""
  with tempfile.TemporaryDirectory() as tmp:
    run_dir = pathlib.Path(tmp) / name
    load = _settle()
    start = time.perf_counter()
    proc = subprocess.run(
      [*_console_script(), "train", *arguments, "--out", str(run_dir), "--progress", "quiet"],
      cwd=REPO,
      capture_output=True,
      text=True,
      env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")},
    )
    wall = time.perf_counter() - start
    if proc.returncode:
      raise SystemExit(f"readme_figures: jaxsync train {' '.join(arguments)} failed:\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
  return {
    "command": "jaxsync train " + " ".join(arguments),
    "final_accuracy": summary["final_accuracy"],
    "gradients": summary["gradients"],
    "updates": summary["updates"],
    "target": summary["target"],
    "time_to_target": summary["time_to_target"],
    "updates_to_target": summary["updates_to_target"],
    "mean_staleness": summary["mean_staleness"],
    "simulated_time": summary["simulated_time"],
    "process_seconds": wall,
    "training_seconds": summary["wall_seconds"],
    "load_before": load,
    "cpu_cores": os.cpu_count(),
    "code": harness.code_version(),
    "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
  }


def _machine(entry: dict) -> str:
  """How the README says where a time was taken: an idle machine, or how loaded it was."""
  idle = (
    "an idle machine" if entry["load_before"] < 0.5 else f"a machine with load {entry['load_before']:.1f}"
  )
  return f"{entry['cpu_cores']} CPU cores ({idle})"


def paragraphs(results: dict) -> dict[str, str]:
  """The README's figure paragraphs, written from ``results`` (the results file's content)."""
  quick = results["quickstart"]
  fashion, alone = results["fashion_mnist"], results["fashion_mnist_one_worker"]
  texts = {
    "quickstart": (
      f"The CNN has 151,306 parameters. The run takes about {quick['process_seconds']:.0f} s on "
      f"{_machine(quick)}: {quick['training_seconds']:.0f} s from the first compilation to the last "
      f"checkpoint, the rest is start-up and plots. It reaches **{quick['final_accuracy']:.3f} test "
      f"accuracy** (359 held-out images) after {quick['gradients']:,} gradients, "
      f"{quick['target']['value']} after {quick['updates_to_target']} updates "
      f"({quick['time_to_target']:.2f} simulated seconds); mean staleness {quick['mean_staleness']:.1f}."
    ),
    "fashion_mnist": (
      "The job trains a LeNet-style CNN (105,866 parameters) with 16 simulated workers (4 of them 4x "
      "slower), OrMo with momentum 0.9, weight decay 5e-4, a linear warm-up from lr/16 over half an "
      "epoch and a cosine decay, on a server with 10 GB/s of memory bandwidth: "
      f"**{fashion['final_accuracy']:.3f} test accuracy** (10,000 held-out images) after 5 epochs "
      f"({fashion['gradients']:,} gradients), in about {fashion['process_seconds']:.0f} s on "
      f"{_machine(fashion)}. The same CNN trained alone (one worker, lr 0.02, momentum 0.9, cosine, "
      f"weight decay 5e-4, 8 epochs) reaches {alone['final_accuracy']:.3f} in "
      f"{alone['process_seconds']:.0f} s; small CNNs reach 91-93% in the literature."
    ),
  }
  source = (
    "(Measured by `python -m benchmarks.pages.readme_figures`, in `benchmarks/results/readme_figures.json`.)"
  )
  return {
    name: textwrap.fill(f"{text} {source}", width=80, break_on_hyphens=False) + "\n"
    for name, text in texts.items()
  }


def write_readme(results: dict, readme: pathlib.Path = README) -> None:
  """Rewrites the README's marked paragraphs from ``results``."""
  texts = paragraphs(results)
  readme.write_text(MARKED.sub(lambda m: m[1] + texts[m[2]] + m[4], readme.read_text()))


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", choices=sorted(COMMANDS), action="append", help="run only these commands")
  parser.add_argument("--results-dir", type=pathlib.Path, default=REPO / "benchmarks" / "results")
  parser.add_argument(
    "--readme-only",
    action="store_true",
    help="rewrite the README's figures from the results file; run nothing",
  )
  args = parser.parse_args(argv)
  path = args.results_dir / "readme_figures.json"
  results = json.loads(path.read_text()) if path.is_file() else {}
  for name in [] if args.readme_only else args.only or COMMANDS:
    entry = measure(name, COMMANDS[name])
    results[name] = entry
    print(
      f"{entry['command']}: accuracy {entry['final_accuracy']:.3f}, {entry['process_seconds']:.1f} s "
      f"(training {entry['training_seconds']:.1f} s; load {entry['load_before']:.2f} on {entry['cpu_cores']} cores)"
    )
  args.results_dir.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
  print(f"wrote {path}")
  if set(COMMANDS) <= set(results):
    write_readme(results)
    print(f"wrote the figures of {README}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
