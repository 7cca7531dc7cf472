"""The quantized exchange as real collectives: all-to-all, average, all-gather of packed bytes on four devices."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from jaxsync._src.distributed import quantized_all_reduce

# Streaming DiLoCo on the all-reduce loop with four CPU devices (one worker each, as four processes
# would have), against the simulator's Q(mean_k Q(delta_k)); in a subprocess for its own devices.
_RUN = textwrap.dedent(
  """
  import json, os, sys
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
  import jax, jax.numpy as jnp, numpy as np, optax
  import jaxsync
  from jaxsync._src.distributed import sync_runtime

  fmt = None if sys.argv[1] == "none" else sys.argv[1]
  K = 4
  rng = np.random.default_rng(0)
  x = rng.normal(size=(K * 64, 40)).astype(np.float32)
  y = np.argmax(x @ rng.normal(size=(40, 10)), axis=1).astype(np.int32)
  data = jaxsync.sim.WorkerData({"x": x, "y": y}, num_workers=K, batch_size=8, seed=0)
  params = {"w": jnp.asarray(0.1 * rng.normal(size=(40, 10)), jnp.float32), "b": jnp.zeros([10], jnp.float32)}
  loss = lambda p, b: optax.softmax_cross_entropy_with_integer_labels(b["x"] @ p["w"] + p["b"], b["y"]).mean()
  strategy = jaxsync.strategies.make(
    "streaming_diloco", K, learning_rate=0.01, period=4, fragments=2, overlap=1, mixing=0.5, quantize=fmt,
    quantize_block=32,
  )
  runtime = sync_runtime.SyncRuntime(strategy, loss, data)
  state, _ = runtime.advance(runtime.init(params), 6)
  sim = jaxsync.sim.Simulator(strategy, loss, data, jaxsync.sim.TimeModel(num_workers=K))
  simulated, _ = sim.advance(sim.init(params, 0), 6)
  ours = jax.tree.leaves((state.params, state.worker_params))
  theirs = jax.tree.leaves((simulated.params, simulated.worker_params))
  print(json.dumps({
    "devices": len(runtime.mesh.devices.flat),
    "difference": max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(ours, theirs)),
    "moved": float(jnp.max(jnp.abs(state.params["w"] - params["w"]))),
    "bytes": runtime.totals(state).bytes_moved,
  }))
  """
)


def _run(fmt: str) -> dict:
  done = subprocess.run(
    [sys.executable, "-c", _RUN, fmt], capture_output=True, text=True, timeout=300, check=False
  )
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.heavy
@pytest.mark.parametrize(
  "fmt, tolerance",
  [
    ("int4", 1e-6),  # the same integers and scales: float rounding in the averages only
    ("bfloat16", 1e-4),  # a sum rounded to bfloat16 in another order can land one bfloat16 step away
    ("none", 1e-6),  # float32 through a psum
  ],
)
def test_streaming_diloco_on_four_devices_sends_its_wire_format_and_equals_the_simulator(fmt, tolerance):
  result = _run(fmt)
  assert result["devices"] == 4 and result["moved"] > 0.05  # four real workers, and training moved
  assert result["difference"] < tolerance, result
  # Six rounds, three per fragment: the bias (10 values, fragment 0) and the weights (400, fragment 1).
  # Each worker sends K - 1 = 3 slices in the all-to-all and 3 in the all-gather; all 4 workers: 24.
  if fmt == "int4":
    # Blocks of 32: the bias pads to 1 block, a slice of 32 values = 16 B + one 4-byte scale; the
    # weights to 13 blocks, slices of 4 blocks (128 values) = 64 B + 16 B of scales.
    assert result["bytes"] == 3 * 24 * (16 + 4) + 3 * 24 * (64 + 16) == 7200
  elif fmt == "bfloat16":
    # 2 bytes a value: slices of 3 (bias: ceil(10 / 4)) and 100 (weights) values.
    assert result["bytes"] == 3 * 24 * 2 * 3 + 3 * 24 * 2 * 100
  else:  # float32 counted as a ring all-reduce: 2 (K - 1) messages of the fragment per round
    assert result["bytes"] == 3 * 6 * 4 * 10 + 3 * 6 * 4 * 400


def test_the_bytes_of_a_quantized_exchange_are_its_padded_slices():
  # 1,000 values in blocks of 64 (16 blocks) over 3 workers: slices of 6 blocks (384 values).
  assert quantized_all_reduce.slice_bytes([1000], "int8", 64, 3) == 384 + 6 * 4
  assert quantized_all_reduce.slice_bytes([1000], "int4", 64, 3) == 192 + 6 * 4
  assert quantized_all_reduce.bytes_moved([1000], "int4", 64, 3) == 2 * 3 * 2 * (192 + 24)
  # Each leaf pads to whole blocks on its own: 10 + 10 values take two blocks, not one.
  assert quantized_all_reduce.slice_bytes([10, 10], "int8", 64, 1) == 128 + 2 * 4
  # int4 slices hold whole bytes: an odd block size pairs blocks up.
  assert quantized_all_reduce.slice_bytes([9], "int4", 3, 1) == 6 + 4 * 4  # 12 values: 6 B, 4 scales
  assert quantized_all_reduce.slice_bytes([9], "int4", 3, 2) == 3 + 2 * 4  # 6 values: 3 B, 2 scales


def test_a_quantized_exchange_over_hierarchical_groups_is_refused_naming_the_format():
  import dataclasses

  import jaxsync
  from jaxsync._src.distributed import sync_runtime
  from jaxsync._src.strategies.strategy import Communication

  strategy = jaxsync.strategies.make("streaming_diloco", 4)
  grouped = dataclasses.replace(strategy, communication=Communication.HIERARCHICAL)
  with pytest.raises(ValueError, match=r"quantize='int4' is invalid; expected None with hierarchical"):
    sync_runtime.check_strategy(grouped, 4)
  assert sync_runtime.check_strategy(strategy, 4) is strategy  # flat: accepted
