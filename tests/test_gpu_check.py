"""benchmarks/gpu_check.sh, the prepared check for a lent GPU, on its CPU path: every step runs and says where."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.heavy
def test_the_gpu_check_runs_each_step_and_writes_its_results_with_the_device(tmp_path):
  done = subprocess.run(
    ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), str(tmp_path), "--small"],
    capture_output=True,
    text=True,
    timeout=600,
    env={
      "PATH": f"{pathlib.Path(sys.executable).parent}:/usr/bin:/bin",
      "PYTHON": sys.executable,
      "JAX_PLATFORMS": "cpu",
    },
    check=False,
  )
  assert done.returncode == 0, done.stderr[-2000:]
  for name in ("transform_overhead", "simulator_throughput", "quickstart"):
    text = (tmp_path / f"gpu_{name}.md").read_text()
    assert "- Device: cpu: " in text, text[:400]
    assert re.search(r"exit code 0\b", text), text[:1500]  # the step itself passed
  assert "| ordered_momentum |" in (tmp_path / "gpu_transform_overhead.md").read_text()
  assert "plain loop:" in (tmp_path / "gpu_simulator_throughput.md").read_text()
  assert '"final_accuracy"' in (tmp_path / "gpu_quickstart.md").read_text()  # the run's summary.json


def test_the_gpu_check_refuses_an_unknown_option_in_one_line(tmp_path):
  done = subprocess.run(
    ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--fast"], capture_output=True, text=True, timeout=30
  )
  assert done.returncode == 2 and "unknown option --fast" in done.stderr
