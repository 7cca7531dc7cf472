"""The README's main-job command runs and prints the comparison it promises."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_quickstart_example_trains_on_digits():
  result = subprocess.run(
    [sys.executable, str(ROOT / "examples" / "quickstart.py"), "--arrivals", "1500"],
    capture_output=True,
    text=True,
    timeout=300,
    check=True,
  )
  rows = {}
  for line in result.stdout.splitlines():
    match = re.match(r"\| (.+?) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| (\d+) \|", line)
    if match:
      rows[match.group(1)] = (float(match.group(2)), float(match.group(4)))
  assert set(rows) == {
    "ASGD (optax.sgd)",
    "naive ASGDm (optax.sgd, m=0.9)",
    "SMEGA2",
    "OrMo",
    "OrMo-DA",
  }
  # 8 workers, every arrival is served at once: mean staleness is K - 1.
  assert all(abs(staleness - 7.0) < 0.1 for _, staleness in rows.values())
  assert rows["OrMo"][0] >= 0.9, rows
