"""examples/quickstart.py (the library API without the CLI) runs and prints the comparison it promises."""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.heavy
def test_quickstart_example_trains_on_digits():
  result = subprocess.run(
    [
      sys.executable,
      str(ROOT / "examples" / "quickstart.py"),
      "--gradients",
      "1600",
      "--strategies",
      "asp,smega2,ormo,bsp",
    ],
    capture_output=True,
    text=True,
    timeout=600,
    check=True,
  )
  rows = {}
  for line in result.stdout.splitlines():
    match = re.match(r"\| (\w+) \| ([\d.]+) \| ([\d.]+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| (\d+) \|", line)
    if match:
      rows[match.group(1)] = {
        "accuracy": float(match.group(2)),
        "updates": int(match.group(4)),
        "seconds": float(match.group(5)),
        "staleness": float(match.group(6)),
      }
  expected = "asp smega2 ormo bsp".split()
  assert list(rows) == expected
  # 8 workers, every arrival served at once: mean staleness is K - 1.
  for name in ("asp", "ormo", "smega2"):
    assert abs(rows[name]["staleness"] - 7.0) < 0.2, rows[name]
  assert rows["ormo"]["accuracy"] >= 0.9, rows
  assert rows["bsp"]["updates"] == 1600 // 8 and rows["bsp"]["staleness"] == 0.0
  # The barrier waits for the two slow workers; ASP does not.
  assert rows["bsp"]["seconds"] > 2 * rows["asp"]["seconds"]
