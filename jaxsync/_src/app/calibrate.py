"""``jaxsync calibrate``: a config's cluster measured on this machine, written as a ``cluster:`` section.

The compute probe runs in ``processes`` processes at once when asked, as a
run's workers share a machine's cores; each process builds the config's model
and data, warms up, and times the same seconds (a common start time).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import numpy as np
import yaml

from jaxsync._src.app import config as config_lib
from jaxsync._src.app import experiment
from jaxsync._src.calibration import calibration

# Seconds the extra compute probes get to start, build and compile before the common start.
_START_SLACK = 30.0

_PROBE = "import sys; from jaxsync._src.app.calibrate import _probe_main; _probe_main(sys.argv[1:])"


def _step_seconds(config_path: pathlib.Path, overrides: list[str], steps: int, start_at: float | None):
  exp = experiment.build(config_lib.load(config_path, overrides))
  from jaxsync._src.calibration import probes

  return probes.step_times(
    exp.loss_fn, exp.model.params, lambda i: exp.data.batch(0, i), steps=steps, start_at=start_at
  )


def _probe_main(argv: list[str]) -> None:
  """One extra compute probe (a subprocess): prints its step times as JSON."""
  config_path, overrides, steps, start_at = argv[0], json.loads(argv[1]), int(argv[2]), float(argv[3])
  print(json.dumps(_step_seconds(pathlib.Path(config_path), overrides, steps, start_at).tolist()))


def calibrate(
  config_path: pathlib.Path,
  overrides: list[str],
  *,
  processes: int = 1,
  steps: int = 100,
  link_to: str | None = None,
  say=lambda line: None,
) -> tuple[calibration.Calibration, dict[str, Any]]:
  """Measures the config's model on this machine; returns the calibration and the whole config with its
  ``cluster:`` section replaced by the measured one (as plain data, validated).

  Raises:
    ConfigError: a bad config, or ``processes`` / ``steps`` out of range.
  """
  cfg = config_lib.load(config_path, overrides)
  if not isinstance(processes, int) or processes < 1:
    raise config_lib.ConfigError(f"--processes={processes!r} is invalid; expected an integer >= 1.")
  if not isinstance(steps, int) or steps < 10:
    raise config_lib.ConfigError(f"--steps={steps!r} is invalid; expected an integer >= 10.")
  exp = experiment.build(cfg)
  say(
    f"compute: {steps} steps of {cfg.model.name} on batches of {cfg.data.batch_size}, {processes} process(es)"
  )
  start_at = time.time() + _START_SLACK if processes > 1 else None
  extra = [
    subprocess.Popen(
      [
        sys.executable,
        "-c",
        _PROBE,
        str(config_path),
        json.dumps(list(overrides)),
        str(steps),
        str(start_at),
      ],
      stdout=subprocess.PIPE,
      text=True,
      env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")},
    )
    for _ in range(processes - 1)
  ]
  from jaxsync._src.calibration import probes

  mine = probes.step_times(
    exp.loss_fn, exp.model.params, lambda i: exp.data.batch(0, i), steps=steps, start_at=start_at
  )
  pooled = [mine]
  for p in extra:
    out, _ = p.communicate(timeout=600)
    if p.returncode != 0:
      raise RuntimeError(f"calibrate: a compute probe process failed (exit code {p.returncode})")
    pooled.append(np.asarray(json.loads(out)))
  say("link and server: ZeroMQ round trips and the parameter server's time per arrival")
  cal = calibration.calibrate(
    exp.loss_fn,
    exp.model.params,
    lambda i: exp.data.batch(0, i),
    batch_size=cfg.data.batch_size,
    step_seconds=np.concatenate(pooled),
    processes=processes,
    link_to=link_to,
  )
  raw = config_lib.apply_overrides(
    config_lib.load_yaml(pathlib.Path(config_path).read_text()) or {}, overrides
  )
  cluster = dict(raw.get("cluster") or {})
  for key in ("device_flops", "message_bytes"):  # the measured compute time and the model's own size rule
    cluster.pop(key, None)
  cluster.update(cal.cluster_section())
  raw["cluster"] = cluster
  config_lib.from_dict(raw)  # what it writes, a run reads
  return cal, raw


def dump(raw: dict[str, Any]) -> str:
  """A config as YAML, sections in their usual order."""
  return yaml.safe_dump(raw, sort_keys=False, width=110)
