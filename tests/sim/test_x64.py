"""The simulator and the data under ``jax_enable_x64``, a common setting in numerical work.

x64 is a process-wide switch, so the runs under it go in a subprocess: every engine runs (the rounds' clock
once entered its loop as float32 and left as float64), the batches are the same as without it for the same
seed, the model keeps its dtype, and float64 parameters train in float64.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from sim_cases import simulate

# One per engine: asynchronous events, synchronous rounds, local rounds (DiLoCo, Streaming DiLoCo),
# elastic exchanges, node-local sums, adaptive release, asynchronous local steps.
STRATEGIES = ("asp", "bsp", "diloco", "streaming_diloco", "easgd", "inhad", "adaptive_k", "async_local_sgd")
HERE = pathlib.Path(__file__).resolve().parent

RUN = """
import json, sys
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp, numpy as np
sys.path.insert(0, sys.argv[1])
from sim_cases import problem, simulate

out = {}
_, _, data = problem(4)
out["indices"] = [np.asarray(data.indices(jnp.int32(w), jnp.int32(s))).tolist() for w in range(4) for s in (0, 7, 40)]
for name in sys.argv[2].split(","):
  final, history, _ = simulate(name, 4, events=12, options={"learning_rate": 0.05})
  out[name] = {"w": np.asarray(final["w"]).tolist(), "dtype": str(final["w"].dtype),
               "time": float(np.asarray(history.time)[-1])}
# Float64 parameters stay float64 and train.
from jaxsync import sim, strategies
loss, params, data = problem(4)
params64 = jax.tree.map(lambda p: p.astype(jnp.float64), params)
final, history = sim.run(strategies.make("asp", 4, learning_rate=0.05), loss, params64, data,
                         sim.TimeModel(num_workers=4), num_events=12, seed=0)
out["float64"] = {"w": np.asarray(final["w"]).tolist(), "dtype": str(final["w"].dtype)}
print(json.dumps(out))
"""


@pytest.mark.heavy
def test_every_engine_runs_under_x64_on_the_same_batches():
  done = subprocess.run(
    [sys.executable, "-c", RUN, str(HERE.parent), ",".join(STRATEGIES)],
    capture_output=True,
    text=True,
    timeout=600,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )
  assert done.returncode == 0, done.stderr[-3000:]
  x64 = json.loads(done.stdout.splitlines()[-1])
  from sim_cases import problem

  _, _, data = problem(4)
  assert x64["indices"] == [
    np.asarray(data.indices(jax.numpy.int32(w), jax.numpy.int32(s))).tolist()
    for w in range(4)
    for s in (0, 7, 40)
  ]
  for name in STRATEGIES:
    final, history, _ = simulate(name, 4, events=12, options={"learning_rate": 0.05})
    assert x64[name]["dtype"] == "float32", name
    # The same run: optax computes some scalars (Adam's bias correction) in float64 under x64, hence the
    # tolerance; a different batch order or clock would move these by far more.
    np.testing.assert_allclose(x64[name]["w"], np.asarray(final["w"]), rtol=1e-4, atol=1e-6, err_msg=name)
    assert x64[name]["time"] == pytest.approx(float(np.asarray(history.time)[-1]), rel=1e-6), name
  assert x64["float64"]["dtype"] == "float64"
  asp, _, _ = simulate("asp", 4, events=12, options={"learning_rate": 0.05})
  np.testing.assert_allclose(x64["float64"]["w"], np.asarray(asp["w"]), rtol=1e-5, atol=1e-6)
