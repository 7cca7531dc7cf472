"""Every rule's state follows the parameters' sharding, under eager init (nnx.Optimizer's) and under jit with explicit axes.

Buffers built with ``jnp.zeros(shape, dtype)`` landed on one device while the
parameters were split over eight; optax's own sgd and adam keep the
parameters' ``NamedSharding``. Per-worker stacks (DC-ASGD's backups) keep it
on their other axes. On eight CPU devices, in a subprocess for its own devices.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

_RUN = textwrap.dedent(
  """
  import json, os, sys
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  sys.path.insert(0, sys.argv[1])
  import jax, jax.numpy as jnp, optax
  from jax.sharding import NamedSharding, PartitionSpec as P
  from rule_cases import CASES, NUM_WORKERS

  def sharded(axis_type):
    mesh = jax.make_mesh((8,), ("x",), axis_types=(axis_type,))
    params = {
      "w": jax.device_put(jnp.ones((16, 4)), NamedSharding(mesh, P("x", None))),
      "b": jax.device_put(jnp.ones(4), NamedSharding(mesh, P())),
    }
    return mesh, params

  expected = {(16, 4): P("x", None), (NUM_WORKERS, 16, 4): P(None, "x", None)}
  out = {}
  cases = [("optax.sgd", lambda: optax.sgd(0.1, momentum=0.9)), ("optax.adam", lambda: optax.adam(0.1))]
  for name, make in cases + [(c.name, c.make) for c in CASES]:
    tx = make()
    # Eager init keeps a committed array's sharding; under jit, sharding travels in the types (explicit axes).
    for how, axis_type in (("eager", jax.sharding.AxisType.Auto), ("jit", jax.sharding.AxisType.Explicit)):
      mesh, params = sharded(axis_type)
      if how == "eager":
        state = tx.init(params)
      else:
        with jax.set_mesh(mesh):
          state = jax.jit(tx.init)(params)
      wrong = []
      for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        want = expected.get(leaf.shape)
        if want is not None and not leaf.sharding.is_equivalent_to(NamedSharding(mesh, want), leaf.ndim):
          wrong.append(f"{jax.tree_util.keystr(path)} {leaf.shape}: {leaf.sharding}")
      out[f"{name} {how}"] = wrong
  print(json.dumps(out))
  """
)


def test_every_rules_state_keeps_the_parameters_sharding_under_eager_and_jitted_init():
  tests = Path(__file__).resolve().parents[1]
  done = subprocess.run(
    [sys.executable, "-c", _RUN, str(tests)], capture_output=True, text=True, timeout=600, check=True
  )
  wrong = json.loads(done.stdout.strip().splitlines()[-1])
  assert len(wrong) == 2 * (2 + 16)  # the controls and every rule case, each both ways
  assert {name: leaves for name, leaves in wrong.items() if leaves} == {}


_HLO = textwrap.dedent(
  """
  import json, os, re, sys
  os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  sys.path.insert(0, sys.argv[1])
  import jax, jax.numpy as jnp, optax, jaxsync
  from jax.sharding import NamedSharding, PartitionSpec as P
  from rule_cases import CASES, RuleCase, extra_args_for

  mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
  worker = lambda name, make: RuleCase(name, make, "worker", 0.0, 0.0)
  cases = [
    worker("optax.sgd", lambda: optax.sgd(0.1, momentum=0.9)),
    worker("optax.adam", lambda: optax.adam(0.1)),
    worker("streaming_diloco", lambda: jaxsync.diloco(optax.sgd(0.1), period=4, fragments=2, overlap=1)),
    worker("streaming_int8", lambda: jaxsync.diloco(optax.sgd(0.1), period=4, fragments=2, quantize="int8")),
    *CASES,
  ]
  out = {}
  for case in cases:
    for layout, spec in (("fsdp", P("x", None)), ("tensor parallel", P(None, "x"))):
      tx = case.make()
      params = {
        "w": jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, spec)),
        "b": jax.device_put(jnp.ones(32), NamedSharding(mesh, P())),
      }
      state = tx.init(params)
      grads = jax.tree.map(lambda p: 0.5 * p, params)
      update = jax.jit(lambda g, s, p, e: tx.update(g, s, p, **e))
      hlo = update.lower(grads, state, params, extra_args_for(case, state, params)).compile().as_text()
      out[f"{case.name} {layout}"] = re.findall(r"= (\\S+) all-gather\\(", hlo)
  print(json.dumps(out))
  """
)


def test_no_rules_update_gathers_a_parameter_split_over_devices():
  """FSDP (``P('x', None)``) and tensor parallel (``P(None, 'x')``) over 8 devices: the compiled update of every
  rule, like optax's own, holds no all-gather (``bb_step_size``'s ``vdot`` and Streaming DiLoCo's int8 blocks
  flattened the leaf, which gathered a tensor-parallel parameter whole onto every device)."""
  tests = Path(__file__).resolve().parents[1]
  done = subprocess.run(
    [sys.executable, "-c", _HLO, str(tests)], capture_output=True, text=True, timeout=600, check=True
  )
  gathers = json.loads(done.stdout.strip().splitlines()[-1])
  assert len(gathers) == 2 * (4 + 16)
  assert {name: shapes for name, shapes in gathers.items() if shapes} == {}
