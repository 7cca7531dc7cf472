"""examples/flax_nnx.py: a jaxsync server rule as ``flax.nnx.Optimizer``'s optimizer, without ``version``."""

import importlib.util
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import jaxsync

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "flax_nnx.py"


def _example():
  spec = importlib.util.spec_from_file_location("flax_nnx_example", EXAMPLE)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.heavy
def test_the_example_trains_ordered_momentum_in_nnx_optimizer():
  result = subprocess.run(
    [sys.executable, str(EXAMPLE), "--optimizer", "ormo", "--steps", "300"],
    capture_output=True,
    text=True,
    timeout=300,
    check=True,
  )
  accuracy = float(re.search(r"^test accuracy: ([\d.]+)$", result.stdout, re.M).group(1))
  assert accuracy > 0.9, result.stdout  # chance is 0.1
  # Every step is one update: the rule counted its own versions, no version= was passed.
  assert "server version after 300 steps: 300" in result.stdout, result.stdout


@pytest.mark.heavy
def test_ordered_momentum_with_fresh_gradients_is_optax_sgd_with_momentum_in_the_same_loop():
  """OrMo, K = 1, all gradients fresh (delta = 0, a look-ahead at every arrival after the first):
  u <- beta u + eta g; w <- w - u, heavy-ball momentum in form A. optax.sgd(eta, beta) is form B,
  v <- beta v + g; w <- w - eta v, the same trajectory with u = eta v. So the same nnx loop gives the
  same losses, parameters and accuracy, up to float rounding."""
  example = _example()
  steps, eta, beta = 200, 0.05, 0.9
  ormo_model, ormo_opt, ormo_losses, ormo_accuracy = example.train(
    jaxsync.ordered_momentum(eta, beta, num_workers=1), steps=steps
  )
  sgd_model, sgd_opt, sgd_losses, sgd_accuracy = example.train(optax.sgd(eta, momentum=beta), steps=steps)
  np.testing.assert_allclose(ormo_losses, sgd_losses, rtol=1e-4, atol=1e-6)
  ormo_params = nnx.as_pure(nnx.state(ormo_model, nnx.Param))
  sgd_params = nnx.as_pure(nnx.state(sgd_model, nnx.Param))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), ormo_params, sgd_params)
  # The momenta too: OrMo's u (rate inside) is eta times optax's trace v.
  ormo_state = nnx.as_pure(ormo_opt.opt_state)
  trace = nnx.as_pure(sgd_opt.opt_state)[0].trace
  jax.tree.map(
    lambda u, v: np.testing.assert_allclose(u, eta * v, rtol=1e-4, atol=1e-6), ormo_state.momentum_buffer, trace
  )
  assert int(ormo_state.count) == steps and int(ormo_state.last_delay) == 0
  assert int(ormo_state.invalid_version_count) == 0
  assert ormo_accuracy == pytest.approx(sgd_accuracy, abs=1e-3) and ormo_accuracy > 0.9
