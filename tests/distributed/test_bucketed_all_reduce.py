"""A round's exchange as few, large buffers: the bucket plan, the sums, and one collective per bucket in a round."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsync._src.distributed import bucketed_all_reduce


def _shapes(*specs):
  return [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in specs]


def test_buckets_keep_tree_order_per_dtype_and_a_large_leaf_alone():
  leaves = _shapes(
    ((10,), jnp.float32),  # 40 bytes
    ((), jnp.float32),  # 4
    ((8,), jnp.bfloat16),  # 16
    ((30,), jnp.float32),  # 120: larger than a bucket, alone
    ((4,), jnp.float32),  # 16
    ((2,), jnp.bfloat16),  # 4
  )
  assert bucketed_all_reduce.buckets(leaves, bucket_bytes=64) == [[0, 1], [2, 5], [3], [4]]
  assert bucketed_all_reduce.buckets(leaves, bucket_bytes=1 << 20) == [[0, 1, 3, 4], [2, 5]]
  every = sorted(i for b in bucketed_all_reduce.buckets(leaves, 8) for i in b)
  assert every == list(range(len(leaves)))


@pytest.mark.parametrize("bad", [0, -5])
def test_a_bucket_of_no_bytes_is_refused_with_its_value(bad):
  with pytest.raises(ValueError, match=f"bucket_bytes={bad}"):
    bucketed_all_reduce.buckets(_shapes(((3,), jnp.float32)), bad)


def test_bucketed_sum_gives_each_leaf_its_sum_in_its_shape_and_dtype():
  tree = {
    "w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3),
    "b": jnp.ones(3, jnp.bfloat16),
    "loss": jnp.float32(0.25),
  }
  calls = []

  def three_workers(flat):
    calls.append(flat.shape)
    return 3 * flat

  out = bucketed_all_reduce.bucketed_sum(tree, three_workers, bucket_bytes=1 << 20)
  assert calls == [(3,), (7,)]  # bfloat16 leaves in one buffer (b), float32 in another (loss, w)
  for name in tree:
    assert out[name].shape == tree[name].shape and out[name].dtype == tree[name].dtype
    np.testing.assert_array_equal(np.asarray(out[name], np.float32), 3 * np.asarray(tree[name], np.float32))


# On four CPU devices (one worker each): the compiled round's collectives, counted in its program, and the
# clock every worker receives; in a subprocess for its own devices.
_RUN = textwrap.dedent(
  """
  import json, os, re
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
  import jax, jax.numpy as jnp, numpy as np, optax
  import jaxsync
  from jaxsync._src.distributed import sync_runtime

  K = 4
  rng = np.random.default_rng(0)
  x = rng.normal(size=(K * 64, 40)).astype(np.float32)
  y = np.argmax(x @ rng.normal(size=(40, 10)), axis=1).astype(np.int32)
  data = jaxsync.sim.WorkerData({"x": x, "y": y}, num_workers=K, batch_size=8, seed=0)
  params = {"w": jnp.asarray(0.1 * rng.normal(size=(40, 10)), jnp.float32), "b": jnp.zeros([10], jnp.float32),
            "h": jnp.zeros([10, 10], jnp.float32)}
  def loss(p, b):
    logits = b["x"] @ p["w"] + p["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits + logits @ p["h"], b["y"]).mean()
  out = {}
  for name, options in [
    ("allreduce", {"learning_rate": 0.05, "momentum": 0.9}),
    ("hierarchical_allreduce", {"learning_rate": 0.05, "group_size": 2}),
    ("local_sgd", {"learning_rate": 0.05, "period": 2}),
    ("diloco", {"period": 2, "quantize": "int8", "quantize_block": 32}),
  ]:
    strategy = jaxsync.strategies.make(name, K, **options)
    runtime = sync_runtime.SyncRuntime(strategy, loss, data)
    state = runtime.init(params)
    state, records = runtime.advance(state, 2)
    s = runtime._global(state)
    now = jax.device_put(jnp.asarray([5.0, 7.0, 9.0, 11.0]), runtime._per_worker)
    text = runtime._round.lower(s, now, *runtime._inputs).as_text()
    _, row = runtime._round(s, now, *runtime._inputs)
    sim = jaxsync.sim.Simulator(strategy, loss, data, jaxsync.sim.TimeModel(num_workers=K))
    simulated, _ = sim.advance(sim.init(params, 0), 2)
    out[name] = {
      "collectives": {op: len(re.findall(rf"stablehlo\\.{op}\\b", text)) for op in ("all_reduce", "all_to_all", "all_gather")},
      "time": float(row.time),
      "difference": max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(simulated.params))),
      "times_increase": bool(np.all(np.diff(records.time) >= 0)),
    }
  print(json.dumps(out))
  """
)


def test_a_round_is_one_collective_per_bucket_and_carries_process_zeros_clock():
  done = subprocess.run(
    [sys.executable, "-c", _RUN], capture_output=True, text=True, timeout=300, check=False
  )
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.splitlines()[-1])
  # The gradient, the loss and the clock in one all-reduce (two levels for hierarchical all-reduce); a
  # quantized exchange: one all-to-all and one all-gather of packed bytes and scales, one small all-reduce.
  assert out["allreduce"]["collectives"] == {"all_reduce": 1, "all_to_all": 0, "all_gather": 0}
  assert out["hierarchical_allreduce"]["collectives"] == {"all_reduce": 2, "all_to_all": 0, "all_gather": 0}
  assert out["local_sgd"]["collectives"] == {"all_reduce": 1, "all_to_all": 0, "all_gather": 0}
  assert out["diloco"]["collectives"] == {"all_reduce": 1, "all_to_all": 1, "all_gather": 1}
  for name, measured in out.items():
    assert measured["time"] == 5.0, name  # worker 0's clock, exactly, on every worker
    assert measured["times_increase"], name
    assert measured["difference"] < 1e-5, (name, measured["difference"])  # the simulator's run
