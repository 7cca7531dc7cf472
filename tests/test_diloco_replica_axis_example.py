"""examples/diloco_replica_axis.py: DiLoCo on a (replica=2, fsdp=4) mesh in a user's own shard_map step."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

_RUN = """
import json, sys
sys.path.insert(0, "examples")
import diloco_replica_axis as example
gaps, nan = example.main()
print(json.dumps({"gaps": gaps, "nan": nan}))
"""


@pytest.mark.heavy
def test_the_example_is_jaxsyncs_diloco_strategy_and_survives_a_nan_on_one_replica():
  """SGD inside: equal to the strategy to 1e-6. AdamW inside: no further from it than the strategy from itself
  started 1e-7 away (Adam's sensitivity to rounding). A NaN on one replica: skipped by both, one model after the
  next outer step."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # XLA's default level, what a user runs
  done = subprocess.run(
    [sys.executable, "-c", _RUN], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
  )
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  sgd_gap, _ = out["gaps"]["sgd"]
  adamw_gap, adamw_sensitivity = out["gaps"]["adamw"]
  assert sgd_gap < 1e-6, sgd_gap
  assert adamw_gap <= 2 * adamw_sensitivity, (adamw_gap, adamw_sensitivity)
  counts, rejected, apart = out["nan"]
  assert counts == [12, 12] and rejected == [1, 1]
  assert apart < 1e-6
  # The Transforms guide shows what it prints, line for line.
  guide = (ROOT / "docs" / "guide" / "transforms.md").read_text()
  shown = re.search(r"It prints \(seed 0\):\n\n```text\n(.*?)```", guide, re.S).group(1).splitlines()
  assert shown == done.stdout.strip().splitlines()[:-1], done.stdout
