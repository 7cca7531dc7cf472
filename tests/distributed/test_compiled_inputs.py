"""The real runtimes' compiled steps take the training and held-out arrays as arguments.

Closed over, a dataset is folded into every compiled program as a constant: a
copy of it per program, and a compile time that grows with it (Fashion-MNIST's
test split is 31 MB, its training split 188 MB). The lowered programs are read
here: each array appears as an argument of ``main``, and the program's text is
far smaller than the arrays' bytes (a folded constant is written out in full).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxsync._src.distributed import sync_runtime
from jaxsync._src.distributed.server import param_server

import helpers


def _experiment(*overrides):
  return helpers.quickstart_experiment(
    "cluster.num_workers=1", "model.name=mlp", "run.gradients=20", "run.eval_every=1", *overrides
  )


_MLIR = {
  "float32": "f32",
  "float64": "f64",
  "int32": "i32",
  "int64": "i64",
  "bool": "i1",
  "uint8": "ui8",
  "uint32": "ui32",
}


def _tensor(x) -> str:
  """How a lowered program writes ``x``'s type (``tensor<360x8x8x1xf32>``)."""
  return f"tensor<{'x'.join(map(str, x.shape))}x{_MLIR[jnp.dtype(x.dtype).name]}>"


def _assert_arguments_not_constants(text: str, arrays) -> None:
  main = next(line for line in text.splitlines() if "func.func public @main(" in line)
  for x in arrays:
    assert _tensor(x) in main, (_tensor(x), main[:2000])
  folded = sum(np.asarray(x).nbytes for x in arrays)
  assert len(text) < folded / 2, (len(text), folded)


def test_the_parameter_servers_step_takes_the_held_out_set_as_an_argument():
  exp = _experiment("strategy.name=asp", "strategy.options={learning_rate: 0.05}")
  server = param_server.ParameterServer(exp.strategy, **exp.evaluation())
  try:
    state = server.init(exp.model.params)
    steps = server._steps
    state = steps.to_device(state)
    held_out = server.schedule.eval_arrays()
    assert held_out  # the experiment's eval_fn is a Partial over the test split
    _assert_arguments_not_constants(
      steps.arrival_step.lower(state, *steps.placeholder_args()).as_text(), held_out
    )
    # ... and evaluates on them: an arrival with eval_every=1 reports the held-out metrics of its parameters.
    (state, row, _, _), _ = steps.arrival_step(state, *steps.placeholder_args())
    assert bool(row.evaluated)
    expected = server.evaluate(state.params)
    for name, value in expected.items():
      np.testing.assert_allclose(float(row.metrics[name]), value, rtol=1e-6)
  finally:
    server.stop(timeout=1)


def test_the_all_reduce_round_takes_the_training_and_held_out_arrays_as_arguments():
  exp = _experiment("strategy.name=bsp", "strategy.options={learning_rate: 0.05}")
  runtime = sync_runtime.SyncRuntime(
    exp.strategy, exp.loss_fn, exp.data, devices=jax.devices()[:1], **exp.evaluation()
  )
  state = runtime.init(exp.model.params)
  after, records = runtime.advance(state, 2)
  assert records.evaluated.all() and int(after.version) == 2
  expected = runtime.evaluate(after.params)
  np.testing.assert_allclose(records.metrics["accuracy"][-1], expected["accuracy"], rtol=1e-6)
  data, held_out = runtime._inputs
  arrays = [*jax.tree.leaves(data), *held_out]
  now = jnp.zeros([exp.strategy.num_workers], jnp.float32)  # each worker's process's clock
  _assert_arguments_not_constants(
    runtime._round.lower(runtime._global(state), now, data, held_out).as_text(), arrays
  )
