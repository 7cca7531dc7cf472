"""DiLoCo in a user's own step under ``shard_map``: replicas on one mesh axis, the model sharded over the other.

``jaxsync.diloco(..., axis_name="replica")`` averages the pseudo-gradients
over the replica axis on outer steps only, and takes every decision that could
differ between devices (the non-finite check, and with it the step counter and
the fragment schedule) alike on all of them. On eight CPU devices, a
``(replica=2, fsdp=4)`` mesh, in a subprocess for its own devices.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import optax
import pytest

import jaxsync

_RUN = textwrap.dedent(
  """
  import json, os, re
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  import jax, jax.numpy as jnp, numpy as np, optax, jaxsync
  from jax.sharding import NamedSharding, PartitionSpec as P

  mesh = jax.make_mesh((2, 4), ("replica", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  H, LR = 3, 0.1
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  params0 = {"w": jax.random.normal(keys[0], (8, 4)) * 0.3, "b": jnp.zeros(4)}
  xs = jax.random.normal(keys[1], (8, 2, 16, 8))
  ys = jax.random.normal(keys[2], (8, 2, 16, 4))

  def loss(p, x, y):
    return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

  def run(tx, steps, xs):
    def per_replica(params, state, x, y):
      params, state = jax.tree.map(lambda a: a[0], (params, state))
      updates, state = tx.update(jax.grad(loss)(params, x[0], y[0]), state, params)
      return jax.tree.map(lambda a: a[None], (optax.apply_updates(params, updates), state))

    stack = lambda tree: jax.tree.map(lambda a: jnp.stack([a, a]), tree)
    with jax.set_mesh(mesh):
      params = stack(params0)
      params["w"] = jax.device_put(params["w"], NamedSharding(mesh, P("replica", "fsdp", None)))
      state = stack(tx.init(params0))
      step = jax.jit(
        jax.shard_map(per_replica, in_specs=P("replica"), out_specs=P("replica"), axis_names={"replica"})
      )
      for t in range(steps):
        params, state = step(params, state, xs[t], ys[t])
      hlo = step.lower(params, state, xs[0], ys[0]).compile().as_text()
    return params, state, hlo

  def reference(steps, xs, skip=()):
    # DiLoCo by hand: two replicas of inner SGD, the mean pseudo-gradient every H accepted steps, Nesterov outside.
    outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
    theta, outer_state, x, taken = params0, outer.init(params0), [params0, params0], 0
    for t in range(steps):
      if t in skip:
        continue
      x = [jax.tree.map(lambda p, g: p - LR * g, x[r], jax.grad(loss)(x[r], xs[t, r], ys[t, r])) for r in (0, 1)]
      taken += 1
      if taken % H == 0:
        delta = jax.tree.map(lambda th, a, b: th - (a + b) / 2, theta, x[0], x[1])
        u, outer_state = outer.update(delta, outer_state, theta)
        theta = optax.apply_updates(theta, u)
        x = [theta, theta]
    return x

  def gap(a, b):
    return max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

  out = {}
  tx = jaxsync.diloco(optax.sgd(LR), period=H, axis_name="replica")
  params, state, hlo = run(tx, 7, xs)
  ref = reference(7, xs)
  out["reference_gap"] = max(gap(jax.tree.map(lambda a: a[r], params), ref[r]) for r in (0, 1))
  out["replicas_apart_after_an_inner_step"] = gap(*[jax.tree.map(lambda a: a[r], params) for r in (0, 1)])
  out["counts"] = np.asarray(state.count).tolist()
  out["w_sharding"] = str(params["w"].sharding.spec)
  # The collectives: the agreed non-finite flag (a scalar) every step; the pseudo-gradient only in the outer
  # step's branch of the conditional, never in the program's own (entry) computation.
  entry = hlo[hlo.index("ENTRY"):]
  entry = entry[: entry.index("\\n}")]
  shapes = r"= (\\([^)]*\\)|\\S+) all-reduce\\("
  out["entry_all_reduce_shapes"] = re.findall(shapes, entry)
  out["all_reduce_shapes"] = re.findall(shapes, hlo)
  out["conditionals"] = hlo.count(" conditional(")
  out["all_gathers"] = hlo.count("all-gather(")

  # A NaN in replica 1's batch at step 4: every device skips that step; the next outer step joins them again.
  poisoned = xs.at[4, 1, 0, 0].set(jnp.nan)
  params, state, _ = run(tx, 7, poisoned)
  ref = reference(7, poisoned, skip={4})
  out["nan_counts"] = np.asarray(state.count).tolist()
  out["nan_nonfinite"] = np.asarray(state.nonfinite_count).tolist()
  out["nan_replicas_gap"] = gap(*[jax.tree.map(lambda a: a[r], params) for r in (0, 1)])
  out["nan_reference_gap"] = max(gap(jax.tree.map(lambda a: a[r], params), ref[r]) for r in (0, 1))

  # Streaming DiLoCo: two fragments (w, then b), each synchronized on its own round.
  streaming = jaxsync.diloco(optax.sgd(LR), period=4, fragments=2, axis_name="replica")
  params, state, _ = run(streaming, 6, xs)  # step 6 ends round 3: fragment 0 (b comes first in leaf order)
  leaves = [jax.tree.map(lambda a: a[r], params) for r in (0, 1)]
  out["streaming_counts"] = np.asarray(state.count).tolist()
  out["streaming_gap_b"] = float(jnp.max(jnp.abs(leaves[0]["b"] - leaves[1]["b"])))
  out["streaming_gap_w"] = float(jnp.max(jnp.abs(leaves[0]["w"] - leaves[1]["w"])))
  print(json.dumps(out))
  """
)


@pytest.fixture(scope="module")
def measured():
  done = subprocess.run([sys.executable, "-c", _RUN], capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-4000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_replicas_on_a_mesh_axis_are_diloco_with_that_many_workers(measured):
  assert measured["reference_gap"] < 1e-6, measured["reference_gap"]
  assert measured["replicas_apart_after_an_inner_step"] > 1e-3  # each replica trains alone between syncs
  assert measured["counts"] == [7, 7]
  assert measured["w_sharding"].startswith("P('replica', 'fsdp'"), measured["w_sharding"]


def test_the_pseudo_gradient_crosses_the_replica_axis_only_in_the_outer_steps_branch(measured):
  """Each device's shard of the parameters (w: f32[2,4] of f32[8,4] over fsdp=4; b: f32[4]) is all-reduced with
  the same shard of the other replica inside the conditional's outer-step branch; the program's own computation
  reduces only scalars (the agreed non-finite flag, the loss) and the model's activations; nothing is gathered."""
  shard_shapes = ("f32[2,4]", "f32[4]")
  assert measured["conditionals"] >= 1
  assert not [s for s in measured["entry_all_reduce_shapes"] if any(x in s for x in shard_shapes)]
  assert any("s32[]" in s for s in measured["entry_all_reduce_shapes"])  # the agreed flag
  outside_entry = [s for s in measured["all_reduce_shapes"] if s not in measured["entry_all_reduce_shapes"]]
  assert any(all(x in s for x in shard_shapes) for s in outside_entry), measured["all_reduce_shapes"]
  assert measured["all_gathers"] == 0


def test_a_nan_on_one_device_skips_the_step_everywhere_and_the_replicas_rejoin(measured):
  assert measured["nan_counts"] == [6, 6]  # 7 steps, one skipped by both replicas
  assert measured["nan_nonfinite"] == [1, 1]
  # The sixth accepted step is the second outer step's: one model again (x + (x_new - x), to rounding).
  assert measured["nan_replicas_gap"] < 1e-6
  assert measured["nan_reference_gap"] < 1e-6


def test_streaming_diloco_synchronizes_one_fragment_per_round_across_replicas(measured):
  assert measured["streaming_counts"] == [6, 6]
  assert measured["streaming_gap_b"] < 1e-6
  assert measured["streaming_gap_w"] > 1e-4


def test_an_axis_name_not_bound_where_the_update_runs_is_refused_in_one_line():
  tx = jaxsync.diloco(optax.sgd(0.1), period=2, axis_name="replica")
  params = jnp.ones(3)
  with pytest.raises(
    ValueError, match=r"diloco: axis_name='replica' is invalid; expected an axis bound .*shard_map"
  ):
    tx.update(jnp.ones(3), tx.init(params), params)
  with pytest.raises(ValueError, match=r"diloco: axis_name=3 is invalid; expected None, a mesh axis name"):
    jaxsync.diloco(optax.sgd(0.1), period=2, axis_name=3)
