"""The sharded parameter server: every decision a single server makes, on slices of the parameters.

The decision test runs in a process with three host devices (one per shard):
the same arrivals go through the single server's compiled step, on the
parameter tree, and through the sharded one, on the raveled parameters cut
into three slices (the last one padded), whose global scalars (norms,
variances, the NaN/Inf check) XLA sums across the slices.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxsync._src.distributed.server import shards

_DECISIONS = textwrap.dedent(
  """
  import json, os, sys
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=3"
  import functools
  import jax, jax.numpy as jnp, numpy as np
  from jax.flatten_util import ravel_pytree
  from jaxsync import strategies
  from jaxsync._src.distributed.server import shards
  from jaxsync._src.distributed.server import server_step
  from jaxsync._src.steps.records import EvalSchedule

  name, options, num_events = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
  K = 4
  strategy = strategies.make(name, K, **options)
  mode = server_step.mode(strategy)
  params = {"b": jnp.zeros([5]), "w": jnp.full([7, 5], 0.1)}  # 40 parameters: slices of 14, 14, 12 (+2)
  flat0, unravel = ravel_pytree(params)
  schedule = EvalSchedule.make(None, None, None)
  layout = shards.layout(flat0.size, 3)
  mesh = shards.ShardedState(
    lambda x: server_step.init(strategy, x, schedule), layout, shards.shard_devices(3, jax.devices()), flat0.dtype
  )
  step_fn = {"gradient": server_step.arrive, "rounds": server_step.round_arrive}.get(
    mode, functools.partial(server_step.elastic_step, exchange=True)
  )
  single = jax.jit(functools.partial(step_fn, strategy, schedule, ()), static_argnums=0)
  sharded = jax.jit(
    functools.partial(step_fn, strategy, schedule, (), lambda x: x),
    out_shardings=server_step.ServerStep(*mesh.step_shardings),
  )
  one = server_step.init(strategy, params, schedule)
  many = mesh.to_mesh(server_step.init(strategy, flat0, schedule))
  rng = np.random.default_rng(0)
  scales = [0.01, 0.1, 1.0, 3.0]
  rows = []
  for event in range(num_events):
    free = np.nonzero(~np.asarray(one.waiting))[0]
    worker = int(rng.choice(free))
    message = (rng.normal(size=flat0.size) * scales[event % 4] + 0.5).astype(np.float32)
    if mode == "elastic":
      message = np.asarray(flat0) + message * 0.1
    if event == 7:
      message[-1] = np.nan  # the last shard's slice: every shard must reject the whole message
    padded = np.zeros(layout.padded, np.float32)
    padded[: flat0.size] = message
    args = [jnp.int32(worker), None, jnp.bool_(True), jnp.float32(event)]
    if mode == "gradient":
      args.append(jnp.float32(0.0))
    args.append(jnp.float32(event))
    args[1] = jnp.asarray(message)
    a = single(unravel, one, *args)
    scalar = lambda v: jax.make_array_from_callback((), mesh.replicated, lambda i: np.asarray(v))
    args_many = [scalar(x) if i != 1 else None for i, x in enumerate(args)]
    args_many[1] = mesh.slices({s: padded[s * layout.chunk : (s + 1) * layout.chunk] for s in range(3)})
    b = sharded(many, *args_many)
    one, many = a.state, b.state
    fields = ("released", "k", "version", "rejected", "staleness")
    rows.append({
      "single": [int(np.asarray(getattr(a.record, f))) for f in fields] + np.asarray(a.send).astype(int).tolist(),
      "sharded": [int(np.asarray(getattr(b.record, f))) for f in fields] + np.asarray(b.send).astype(int).tolist(),
    })
  host = mesh.to_host(many)
  diff = float(np.max(np.abs(np.asarray(ravel_pytree(one.params)[0]) - host.params)))
  slice_ok = all(
    piece.data.shape == (layout.chunk,) for piece in many.params.addressable_shards
  )
  print(json.dumps({"rows": rows, "params_diff": diff, "sliced": slice_ok,
                    "ks": sorted({r["single"][1] for r in rows})}))
  """
)


@pytest.mark.parametrize(
  "name, options",
  [
    ("adaptive_k", {"learning_rate": 0.05, "theta": 0.5}),
    ("fastest_k", {"learning_rate": 0.05, "k": 2}),
    ("ea_wild", {"learning_rate": 0.05}),
  ],
)
def test_the_sharded_step_decides_what_the_single_server_decides(name, options):
  out = subprocess.run(
    [sys.executable, "-c", _DECISIONS, name, json.dumps(options), "40"],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  got = json.loads(out.stdout.strip().splitlines()[-1])
  for event, row in enumerate(got["rows"]):
    assert row["sharded"] == row["single"], f"event {event}: {row}"
  assert got["sliced"]  # each device holds one slice, not the whole
  assert got["params_diff"] < 1e-5
  rejected = [row["single"][3] for row in got["rows"]]
  if name != "fastest_k":
    assert rejected[7] == 1 and sum(rejected) == 1  # the NaN in the last slice, and only it
  if name == "adaptive_k":
    assert len(got["ks"]) >= 3, got["ks"]  # the tests chose several k: the decisions were exercised


def test_the_layout_cuts_the_parameters_into_equal_slices_the_last_padded():
  layout = shards.layout(40, 3)
  assert (layout.chunk, layout.padded) == (14, 42)
  assert [layout.bounds(s) for s in range(3)] == [(0, 14), (14, 28), (28, 40)]
  with pytest.raises(ValueError, match=r"num_shards=5.*at most the model's 4 parameters"):
    shards.layout(4, 5)
  with pytest.raises(ValueError, match="num_shards=0"):
    shards.layout(4, 0)


def test_a_command_survives_the_wire():
  command = shards.Command(shards.Op.ARRIVE, worker=3, version=7, step=9, loss=0.5, now=1.25, finite=False)
  assert shards.Command.decode(command.encode()) == command
  drop = shards.Command(shards.Op.DROP, mask=shards.Command.mask_of(np.array([True, False, True])))
  assert shards.Command.decode(drop.encode()).gone(3).tolist() == [True, False, True]
